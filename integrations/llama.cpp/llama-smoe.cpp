// llama-smoe.cpp: see llama-smoe.h. Every smoe call's status is checked; a failure
// carries smoe_status_str() and smoe_last_error() in its message.
#include "llama-smoe.h"
#include "llama-smoe-impl.h"

#include "ggml.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <nlohmann/json.hpp>
#include "smoe.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>

#include <sys/mman.h>
#include <sys/stat.h>
#include <unordered_map>
#include <vector>

// SMOE (0 or 1) and SMOE_VAULT: what to open, and how to name it in messages. Returns
// false for stock llama.cpp.
static bool smoe_source(const char * model_path, std::string * path, std::string * named) {
    const char * on = std::getenv("SMOE");
    const char * vault = std::getenv("SMOE_VAULT");
    const bool has_vault = vault != nullptr && *vault != '\0';
    if (on != nullptr && *on != '\0' && strcmp(on, "0") != 0 && strcmp(on, "1") != 0) {
        throw std::runtime_error(std::string("smoe: SMOE=") + on + " is neither 0 (stock llama.cpp) nor 1 (stream the routed experts)");
    }
    if (on != nullptr && strcmp(on, "0") == 0) {
        if (has_vault) {
            fprintf(stderr, "smoe: SMOE=0: off, SMOE_VAULT=%s is not used\n", vault);
        }
        return false;
    }
    if (has_vault) {
        *path = vault;
        *named = std::string("SMOE_VAULT=") + vault;
        return true;
    }
    if (on == nullptr || strcmp(on, "1") != 0) {
        return false;  // neither: stock llama.cpp
    }
    if (model_path == nullptr || *model_path == '\0') {
        throw std::runtime_error("smoe: SMOE=1 streams the routed experts from the model file, but this model was not "
                                 "loaded from a file path: set SMOE_VAULT to its GGUF file or to a vault packed from it");
    }
    *path = model_path;
    *named = std::string("SMOE=1: the model file ") + model_path;
    return true;
}

llama_smoe * llama_smoe_from_env(uint32_t n_layer, uint32_t n_expert, const char * model_path) {
    std::string vault;
    std::string named;
    if (!smoe_source(model_path, &vault, &named)) {
        return nullptr;
    }
    if (n_expert == 0) {
        // nothing to stream: a dense model (a draft model beside the streamed one, say) loads
        // as stock llama.cpp, whatever else the process streams
        fprintf(stderr, "smoe: %s has no routed experts (a dense model): loaded as stock llama.cpp, not streamed (%s)\n",
                model_path != nullptr && *model_path != '\0' ? model_path : "the model", named.c_str());
        return nullptr;
    }
    smoe_config cfg;
    smoe_status r = smoe_config_init(&cfg);
    if (r != SMOE_OK) {
        throw std::runtime_error(smoe_error("smoe_config_init", r));
    }
    cfg.ring_slots = env_u32("SMOE_RING_SLOTS", 0, UINT32_MAX);
    cfg.workers    = env_u32("SMOE_WORKERS", 0, 64);
    cfg.verify     = env_u32("SMOE_VERIFY", 0, 1);
    cfg.direct_io  = env_u32("SMOE_DIRECT_IO", 0, 2);
    cfg.prewarm    = env_u32("SMOE_PREWARM", 1, 1);
    cfg.policy     = env_u32("SMOE_POLICY", SMOE_POLICY_LRU, SMOE_POLICY_ADAPTIVE);
    cfg.elastic    = env_u32("SMOE_ELASTIC", 1, 1);
    // committed at open by default: a prompt's first loads then pay no first touches,
    // which cost most beside the compute where memory is virtualised
    cfg.populate   = env_u32("SMOE_POPULATE", SMOE_POPULATE_OPEN, SMOE_POPULATE_OPEN);
    // pinned (a fixed ring, its pages committed, registered with the GPU's driver when a
    // context offloads a big batch's experts to it: llama_smoe_devices) by default when a GPU
    // whose backend registers host memory is there (the patch's CUDA backend), so that those
    // copies are the device's DMA from the ring; else (no GPU, or Metal, Vulkan: nothing to
    // register with) an elastic ring
    bool can_register = false;
    for (size_t i = 0; i < ggml_backend_dev_count(); i++) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        const auto type = ggml_backend_dev_type(dev);
        ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
        can_register = can_register ||
                       ((type == GGML_BACKEND_DEVICE_TYPE_GPU || type == GGML_BACKEND_DEVICE_TYPE_IGPU) && reg != nullptr &&
                        ggml_backend_reg_get_proc_address(reg, "ggml_backend_register_fixed_host_buffer") != nullptr);
    }
    cfg.pinned     = env_u32("SMOE_PIN", can_register ? 1 : 0, 1);
    // the routing of every claim, written as a trace (docs/format.md §5.3) when the model is
    // freed: for `smoe bench --trace`'s replays and sweeps of a real run's routing. The
    // library refuses a path it may not replace, with a warning, and reads it at open only
    const char * trace = std::getenv("SMOE_TRACE");
    cfg.trace_path = trace != nullptr && *trace != '\0' ? trace : nullptr;
    const uint32_t layer_ahead = env_u32("SMOE_LAYER_AHEAD", UINT32_MAX, UINT32_MAX);
    // off by default: measured on decode that the drive bounds (scripts/llama-bench.sh decode,
    // docs/llama.md "Lookahead"), guesses never paid for their wrong reads
    const uint32_t lookahead = env_u32("SMOE_LOOKAHEAD", 0, 8);
    const uint32_t lookahead_width = env_u32("SMOE_LOOKAHEAD_WIDTH", 0, 1u << 20);
    const bool lookahead_adapt = env_u32("SMOE_LOOKAHEAD_ADAPT", 1, 1) == 1;
    // op offload: a layer's next expert weight (up, gate, down: the same ids) copied to the
    // GPU on a stream of its own while the weight before it computes; 0 copies in order
    const bool copy_ahead = env_u32("SMOE_COPY_AHEAD", 1, 1) == 1;
    const uint32_t squeeze = env_u32("SMOE_TEST_SQUEEZE", 0, UINT32_MAX);
    const uint32_t fail_claims = env_u32("SMOE_TEST_FAIL_CLAIMS", 0, UINT32_MAX);
    const bool profile = env_u32("SMOE_PROFILE", 0, 1) == 1;
    // read again when a context is made, where a bad value would be never seen
    // (SMOE_OP_OFFLOAD without a GPU): checked here, so that any bad value stops the load
    (void) env_u32("SMOE_UBATCH", 0, UINT32_MAX);
    (void) env_u32("SMOE_OP_OFFLOAD", 1, 1);
    (void) tier_budget(nullptr);  // SMOE_VRAM, used when a GPU context is made
    if (std::getenv("SMOE_SPECULATE") != nullptr && *std::getenv("SMOE_SPECULATE") != '\0') {
        throw std::runtime_error("smoe: SMOE_SPECULATE is gone (its guess, the same expert ids one layer on, "
                                 "held for no real model); SMOE_LAYER_AHEAD=N sets how many layers prefill reads ahead");
    }

    std::unique_ptr<llama_smoe> s(new llama_smoe);
    s->vault = vault;
    s->layer_ahead = layer_ahead;
    s->lookahead = lookahead;
    s->lookahead_width = lookahead_width;
    s->adapt = lookahead_adapt;
    s->guessing = !lookahead_adapt;  // adapting: the first probe's first token without
    s->copy_ahead = copy_ahead;
    s->squeeze = squeeze;
    s->fail_claims = fail_claims;
    s->profile = profile;
    if (cfg.policy == SMOE_POLICY_ADAPTIVE) {
        s->layer_ahead = std::min<uint32_t>(s->layer_ahead, 1);
    }
    const auto t_open = std::chrono::steady_clock::now();
    r = smoe_open(vault.c_str(), &cfg, &s->st);
    s->open_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_open).count();
    s->populated = cfg.populate == SMOE_POPULATE_OPEN;
    s->pinned = cfg.pinned == 1;
    if (r != SMOE_OK) {
        throw std::runtime_error(smoe_error("smoe_open", r) + " (" + named + ")");
    }
    const char * warnings = smoe_warnings(s->st);
    if (*warnings) {
        fprintf(stderr, "smoe: %s%s", warnings, warnings[strlen(warnings) - 1] == '\n' ? "" : "\n");
    }
    void * base = nullptr;
    r = smoe_ring_region(s->st, &base, &s->ring_bytes, &s->slot_bytes);
    if (r != SMOE_OK) {
        throw std::runtime_error(smoe_error("smoe_ring_region", r));
    }
    s->base = (uint8_t *) base;
    s->slots = (uint32_t) (s->ring_bytes / s->slot_bytes);

    try {
        const nlohmann::json meta = nlohmann::json::parse(smoe_vault_metadata(s->st));
        if (!meta.is_object() || !meta.contains("layer_blob_layouts") || !meta["layer_blob_layouts"].is_object()) {
            throw std::runtime_error("its metadata has no layer_blob_layouts (was it made by `smoe pack` from a GGUF?)");
        }
        s->layouts = meta["layer_blob_layouts"];
        // a model opened in place: its items sit at their slot positions, which need not
        // be multiples of 256 (SPEC 6); the checks in llama_smoe_bind hold for both
        s->in_place = meta.value("format", "") == "smoe-model";
    } catch (const std::exception & e) {
        throw std::runtime_error("smoe: " + named + ": " + e.what());
    }
    if (s->in_place) {
        // a model read in place must be the file llama.cpp loads: another GGUF with the
        // same tensor table (a fine-tune, another quantizer's file) would pass every
        // check of llama_smoe_bind and stream other weights
        struct stat a = {}, b = {};
        if (model_path == nullptr || stat(vault.c_str(), &a) != 0 || stat(model_path, &b) != 0 ||
            a.st_dev != b.st_dev || a.st_ino != b.st_ino) {
            throw std::runtime_error("smoe: " + named + " is not the file llama.cpp loads (" +
                                     (model_path ? model_path : "no path") +
                                     "): a model read in place must be that file; unset SMOE_VAULT and set SMOE=1, "
                                     "or name a vault packed from it");
        }
        s->where = "smoe: model " + vault + ": ";
        s->refit = named.rfind("SMOE_VAULT=", 0) == 0
                       ? "SMOE_VAULT names another model's file: name this model's, or unset it and set SMOE=1"
                       : "smoe read this file's expert layout otherwise than llama.cpp (a bug: please report it)";
    } else {
        s->where = "smoe: vault " + vault + ": ";
        s->refit = "pack the vault from this GGUF";
    }

    // room for every routed-expert tensor the model can have (gate, up, down, gate_up per
    // layer), whatever the vault holds: a vault of fewer layers is refused by name, not by
    // running out of context
    ggml_init_params params = {
        /*.mem_size   =*/ ggml_tensor_overhead() * 4 * ((size_t) std::max<uint64_t>(n_layer, s->layouts.size()) + 1),
        /*.mem_buffer =*/ nullptr,
        /*.no_alloc   =*/ true,
    };
    s->ctx = ggml_init(params);
    if (s->ctx == nullptr) {
        throw std::runtime_error("smoe: failed to create a ggml context");
    }
    return s.release();
}

void llama_smoe_free(llama_smoe * s) {
    if (s == nullptr) {
        return;
    }
    smoe_stats stats = {};
    stats.struct_size = sizeof(stats);
    const smoe_status r = smoe_get_stats(s->st, &stats);
    if (r == SMOE_OK) {
        fprintf(stderr,
            "smoe: claims %llu, hits %llu (%.1f%%), bytes read %llu (%.2f MiB; %llu demand, %llu speculative, %llu pre-warm reads), "
            "evictions %llu (%llu of loads never claimed: wasted reads), waited %.3f s for experts in %llu claim ops, "
            "%.2f waves per layer, %llu layer-ahead sets, %u layers ahead at most, ring %llu slots x %llu bytes, shrank %llu times, "
            "%llu graphs built again\n",
            (unsigned long long) stats.claims, (unsigned long long) stats.hits,
            stats.claims ? 100.0 * (double) stats.hits / (double) stats.claims : 0.0,
            (unsigned long long) stats.bytes_read, stats.bytes_read / 1048576.0,
            (unsigned long long) stats.reads_demand, (unsigned long long) stats.reads_speculative,
            (unsigned long long) stats.reads_prewarm, (unsigned long long) stats.evictions,
            (unsigned long long) stats.evicted_unclaimed, s->wait_ns / 1e9, (unsigned long long) s->claim_ops,
            s->layer_batches ? (double) s->waves_run / (double) s->layer_batches : 0.0,
            (unsigned long long) s->layer_ahead_sets, s->layer_ahead_deepest, (unsigned long long) stats.ring_slots,
            (unsigned long long) stats.slot_bytes, (unsigned long long) stats.shrinks, (unsigned long long) s->rebuilds);
    } else {
        fprintf(stderr, "%s\n", smoe_error("smoe_get_stats", r).c_str());
    }
    if (s->decode_tokens > 0) {
        // net speculative bytes never claimed over decode: what it read as bets, less the bets
        // (of any time) that decode's claims took
        const double mib = 1048576.0;
        const uint64_t unclaimed = s->d_unclaimed_net > 0 ? (uint64_t) s->d_unclaimed_net : 0;
        fprintf(stderr,
            "smoe: decode: %llu tokens in %.3f s (%.2f tokens/s); lookahead %u layers x %s experts: recall %.1f%% (%llu of %llu routed "
            "experts guessed), %llu guesses, %llu stale reads dropped; read %.2f MiB (%llu demand reads), %.2f MiB of it speculative, "
            "%.2f MiB never claimed (%.1f%% of the bytes read); the drive idle %.3f s of %.3f s busy; guesses queued in %llu "
            "of the tokens (%s)\n",
            (unsigned long long) s->decode_tokens, s->decode_s, s->decode_s > 0 ? (double) s->decode_tokens / s->decode_s : 0.0,
            s->lookahead, s->lookahead_width ? std::to_string(s->lookahead_width).c_str() : "top-k",
            s->d_routed ? 100.0 * (double) s->d_hits / (double) s->d_routed : 0.0, (unsigned long long) s->d_hits,
            (unsigned long long) s->d_routed, (unsigned long long) s->guess_sets, (unsigned long long) s->d_dropped,
            s->d_bytes_read / mib, (unsigned long long) s->d_demand, s->d_bytes_spec / mib, unclaimed / mib,
            s->d_bytes_read ? 100.0 * (double) unclaimed / (double) s->d_bytes_read : 0.0, s->d_idle_ns / 1e9, s->d_busy_ns / 1e9,
            (unsigned long long) s->tokens_guessed,
            s->lookahead == 0 ? "off"
            : s->adapt        ? (std::to_string(s->probes_won) + " of " + std::to_string(s->probes) +
                                 " probes found them faster; SMOE_LOOKAHEAD_ADAPT=0: every token").c_str()
                              : "every token: SMOE_LOOKAHEAD_ADAPT=0");
    }
    if (s->profile && s->pf_layers > 0) {
        fprintf(stderr,
                "smoe: profile (SMOE_PROFILE=1), a layer of a one-token ubatch on average, host clock: %.1f us from a layer's "
                "last host op to the next layer's first (the GPU's part and the copies across, %llu gaps), %.1f us from its "
                "first host op to its last (claims, matmuls, release; %llu layers)\n",
                s->pf_gaps ? s->pf_gpu_ns / 1e3 / (double) s->pf_gaps : 0.0, (unsigned long long) s->pf_gaps,
                s->pf_host_ns / 1e3 / (double) s->pf_layers, (unsigned long long) s->pf_layers);
    }
    tier_flush(s, true);  // copies in flight counted (and their claims released) before the line
    tier_report(s);
    if (s->gpu_dev != nullptr) {
        fprintf(stderr, "smoe: op offload: %llu layer batches of %llu tokens computed on %s, %.2f MiB of experts copied there "
                        "(%.3f MiB a token), %.2f MiB of them ahead (while the weight before computed)\n",
                (unsigned long long) s->dev_batches, (unsigned long long) s->dev_tokens,
                ggml_backend_dev_name(s->gpu_dev), s->dev_bytes / 1048576.0,
                s->dev_tokens ? s->dev_bytes / 1048576.0 / (double) s->dev_tokens : 0.0, s->dev_bytes_ahead / 1048576.0);
    }
    delete s;
}

// The error for a model tensor of a layer the vault does not hold.
static std::string missing_layer(const llama_smoe * s, int layer, const char * tensor) {
    return s->where + "has no layer " + std::to_string(layer) + ", which the model's " + tensor + " needs: " + s->refit;
}

// "blk.N.ffn_{gate,up,down,gate_up}_exps.weight" -> (N, role)
ggml_context * llama_smoe_tensor_ctx(llama_smoe * s, const char * name, bool skipped) {
    int layer;
    std::string role;
    if (s == nullptr || !parse_expert_name(name, &layer, &role)) {
        return nullptr;
    }
    if (skipped) {
        s->skipped_layers.insert(layer);
        return nullptr;
    }
    if (!s->layouts.contains(std::to_string(layer))) {
        throw std::runtime_error(missing_layer(s, layer, name));
    }
    return s->ctx;
}

void llama_smoe_router(llama_smoe * s, int il, ggml_tensor * norm, ggml_tensor * router, ggml_tensor * probs_b) {
    if (s == nullptr || il < 0) {
        return;
    }
    if ((size_t) il >= s->routers.size()) {
        s->routers.resize((size_t) il + 1);
    }
    s->routers[(size_t) il] = {norm, router, probs_b};
}

void llama_smoe_bind(llama_smoe * s) {
    const std::string & where = s->where;
    std::map<int, std::vector<std::string>> bound;  // layer -> roles
    std::map<int, uint32_t> layer_experts;          // layer -> its experts
    int n_layer = 0;
    std::vector<ggml_tensor *> tensors;
    for (ggml_tensor * t = ggml_get_first_tensor(s->ctx); t != nullptr; t = ggml_get_next_tensor(s->ctx, t)) {
        tensors.push_back(t);
    }
    if (tensors.empty()) {
        throw std::runtime_error(where + "the model has no routed-expert tensors (blk.N.ffn_*_exps.weight)");
    }
    if (s->slot_bytes == 0 || s->slots == 0) {
        throw std::runtime_error(where + "empty ring");
    }
    for (ggml_tensor * t : tensors) {
        int il;
        std::string role;
        expert_name(t->name, &il, &role);
        const std::string key = std::to_string(il);
        if (!s->layouts.contains(key)) {
            throw std::runtime_error(missing_layer(s, il, t->name));
        }
        const nlohmann::json * item = nullptr;
        for (const auto & it : s->layouts[key]) {
            if (it.is_object() && it.value("role", "") == role) {
                item = &it;
            }
        }
        if (item == nullptr) {
            throw std::runtime_error(where + "layer " + key + " has no '" + role + "' slice for " + t->name);
        }
        std::string type = ggml_type_name(t->type);
        for (char & c : type) {
            c = (char) toupper((unsigned char) c);
        }
        const uint64_t expert_bytes = t->nb[2];
        const uint64_t n_expert = (uint64_t) t->ne[2];
        uint64_t offset = 0;
        uint64_t bytes = 0;
        try {
            if (item->at("tensor").get<std::string>() != t->name) {
                throw std::runtime_error("its slice comes from " + item->at("tensor").get<std::string>());
            }
            if (item->at("dtype").get<std::string>() != type) {
                throw std::runtime_error("its slice is " + item->at("dtype").get<std::string>() + ", the model's is " + type);
            }
            const auto shape = item->at("shape").get<std::vector<int64_t>>();
            if (shape.size() != 2 || shape[0] != t->ne[1] || shape[1] != t->ne[0]) {
                throw std::runtime_error("its slice shape " + item->at("shape").dump() + " differs from the model's [" +
                                         std::to_string(t->ne[1]) + ", " + std::to_string(t->ne[0]) + "]");
            }
            offset = item->at("offset").get<uint64_t>();
            bytes = item->at("bytes").get<uint64_t>();
        } catch (const nlohmann::json::exception & e) {
            throw std::runtime_error(where + "layer " + key + " '" + role + "': bad layout item: " + e.what());
        } catch (const std::runtime_error & e) {
            throw std::runtime_error(where + t->name + ": " + e.what() + ": " + s->refit);
        }
        if (bytes != expert_bytes || ggml_nbytes(t) != expert_bytes * n_expert) {
            throw std::runtime_error(where + t->name + ": its slice is " + std::to_string(bytes) + " bytes, the model's " + std::to_string(expert_bytes));
        }
        if (offset > s->slot_bytes || bytes > s->slot_bytes - offset) {
            throw std::runtime_error(where + t->name + ": its slice ends past a ring slot (" + std::to_string(s->slot_bytes) + " bytes)");
        }
        for (uint64_t e = 0; e <= n_expert; e++) {
            uint64_t size = 0, padded = 0, off = 0;
            const smoe_status r = smoe_expert_info(s->st, (uint32_t) il, (uint32_t) e, &size, &padded, &off);
            if (e == n_expert) {
                if (r == SMOE_OK) {
                    throw std::runtime_error(where + "layer " + key + " has more experts than the model's " + std::to_string(n_expert));
                }
                if (r != SMOE_ERR_NOT_FOUND) {
                    throw std::runtime_error(smoe_error("smoe_expert_info", r));
                }
            } else if (r != SMOE_OK) {
                throw std::runtime_error(smoe_error("smoe_expert_info", r) + " (the model has " + std::to_string(n_expert) + " experts in layer " + key + ")");
            } else if (size < offset + bytes) {
                throw std::runtime_error(where + "layer " + key + " expert " + std::to_string(e) + " is " + std::to_string(size) + " bytes, too short for its '" + role + "' slice");
            }
        }
        if (n_expert > s->max_experts) {
            s->max_experts = (uint32_t) n_expert;
        }
        bound[il].push_back(role);
        layer_experts[il] = (uint32_t) n_expert;
        s->first_layer = s->first_layer < 0 ? il : std::min(s->first_layer, il);
        s->last_layer = std::max(s->last_layer, il);
        n_layer = std::max(n_layer, il + 1);
        // the view over the ring: expert slot i of this role at base + i*slot_bytes + offset
        t->data  = s->base + offset;
        t->ne[2] = s->slots;
        t->nb[2] = s->slot_bytes;
        t->nb[3] = s->slot_bytes * s->slots;
    }
    // every weight the vault holds for a layer must be used by the model, but in a layer
    // the model skips (a next-token prediction layer it does not load)
    for (const auto & [key, items] : s->layouts.items()) {
        const int il = std::atoi(key.c_str());
        if (s->skipped_layers.count(il) != 0) {
            continue;
        }
        for (const auto & it : items) {
            const std::string role = it.is_object() ? it.value("role", "") : "";
            if (role != "gate" && role != "up" && role != "down" && role != "gate_up") {
                continue;
            }
            const auto & roles = bound[il];
            if (std::find(roles.begin(), roles.end(), role) == roles.end()) {
                throw std::runtime_error(where + "layer " + key + " holds a '" + role + "' weight the model does not have: " + s->refit);
            }
        }
    }
    s->ring = ggml_backend_cpu_buffer_from_ptr(s->base, s->ring_bytes);
    if (s->ring == nullptr) {
        throw std::runtime_error("smoe: cannot wrap the ring in a ggml buffer");
    }
    ggml_backend_buffer_set_usage(s->ring, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    for (ggml_tensor * t : tensors) {
        t->buffer = s->ring;
    }
    s->layers.resize(n_layer);
    s->wave_ops.resize(n_layer);
    for (int il = 0; il < n_layer; il++) {
        layer_claims & l = s->layers[il];
        l.s = s;
        l.il = il;
        const auto found = layer_experts.find(il);
        l.n_expert = found == layer_experts.end() ? 0 : found->second;
        l.held.reserve(l.n_expert);
        l.experts.reserve(l.n_expert);
        l.left.reserve(l.n_expert);
        l.slot_of.assign(l.n_expert, UINT32_MAX);
        l.seen.assign(l.n_expert, 0);
        l.wave_of.assign(l.n_expert, 0);
        if ((size_t) il < s->routers.size() && l.n_expert > 0) {
            const auto & r = s->routers[(size_t) il];
            // a router that scores this layer's experts (else the layer is never guessed)
            if (r.router != nullptr && r.router->ne[1] == (int64_t) l.n_expert) {
                l.norm = r.norm;
                l.router = r.router;
                l.probs_b = r.probs_b != nullptr && r.probs_b->ne[0] == (int64_t) l.n_expert ? r.probs_b : nullptr;
            }
        }
        s->entries += l.n_expert;
    }
    s->guess_seen.assign(s->max_experts, 0);
    s->guess.reserve(s->max_experts);
    for (uint32_t e = 0; e < s->max_experts; e++) {
        s->all_experts.push_back(e);
    }
    fprintf(stderr, "smoe: %s %s: %zu expert tensors in %zu layers streamed through a ring of %u slots x %llu bytes%s\n",
            s->in_place ? "model" : "vault", s->vault.c_str(), tensors.size(), bound.size(), s->slots, (unsigned long long) s->slot_bytes,
            s->layer_ahead == 0          ? ""
            : s->layer_ahead == UINT32_MAX ? ", prefill reads as many layers ahead as the ring holds"
                                           : (", prefill reads up to " + std::to_string(s->layer_ahead) + " layers ahead").c_str());
    if (s->lookahead > 0 && s->slots < s->entries) {
        fprintf(stderr, "smoe: lookahead: in decode, each layer guesses the experts of the next %u layers with experts (%s a token) "
                        "from its state and queues them as speculation (SMOE_LOOKAHEAD=0: off)\n",
                s->lookahead, s->lookahead_width ? (std::to_string(s->lookahead_width) + " experts").c_str() : "the model's top-k");
    }
    fprintf(stderr, "smoe: opened in %.2f s%s\n", s->open_s,
            s->populated ? ", the ring's pages committed (SMOE_POPULATE=0: as slots are first loaded)" : "");
}

// The first wave's setup of a batch: the working set (distinct experts in order of first
// use, marked with a new generation so nothing is cleared or allocated), handed to smoe,
// and layer-ahead reads of the next layer for big batches.
static bool start_batch(layer_claims * l, const ggml_tensor * a, bool tier) {
    llama_smoe * s = l->s;
    const int64_t k = a->ne[0];
    const int64_t n_tokens = a->ne[1];
    if (++l->generation == 0) {
        std::fill(l->seen.begin(), l->seen.end(), 0);
        l->generation = 1;
    }
    std::fill(l->wave_of.begin(), l->wave_of.end(), 0);
    l->experts.clear();
    for (int64_t t = 0; t < n_tokens; t++) {
        for (int64_t i = 0; i < k; i++) {
            const int32_t e = *(const int32_t *) ((const char *) a->data + i * a->nb[0] + t * a->nb[1]);
            if (e < 0 || (uint32_t) e >= l->n_expert) {
                s->fail("smoe: layer " + std::to_string(l->il) + ": expert id " + std::to_string(e) + " is out of range (the layer has " +
                        std::to_string(l->n_expert) + ")");
                return false;
            }
            if (l->seen[e] != l->generation) {
                l->seen[e] = l->generation;
                l->experts.push_back((uint32_t) e);
            }
        }
    }
    // the device tier's experts leave the set: the GPU computes them from VRAM (the device
    // wave's ids, from the same map, were gathered on the GPU before this first claim)
    if (tier) {
        if (!tier_lookups(l)) {
            return false;
        }
    }
    l->left.assign(l->experts.begin(), l->experts.end());
    s->layer_batches++;
    // hand the set over: resident members cost nothing, the rest are read in this order
    smoe_status r = l->experts.empty() ? SMOE_OK
                                       : smoe_prefetch_set(s->st, (uint32_t) l->il, l->experts.data(), (uint32_t) l->experts.size(), false, nullptr);
    if (r != SMOE_OK && r != SMOE_ERR_RING_FULL) {
        s->fail(smoe_error("smoe_prefetch_set", r) + " (layer " + std::to_string(l->il) + ")");
        return false;
    }
    // layer-ahead: a batch that routes to most of this layer's experts will likely route to
    // most of the next ones', so while this layer computes, read the next layers' experts,
    // layer by layer, as far as the active ring holds them beside this layer's set (the last
    // layer's set in part), so that the drive never waits for compute. Speculation never
    // evicts a demand read nor anything held, and an unclaimed read-ahead only after every
    // idle claimed slot, so within that bound (the slack: this layer's experts the batch does
    // not route to, read ahead by an earlier layer, the oldest unclaimed) no read-ahead is
    // evicted before its layer claims it. Layers already queued in this pass are not asked
    // again
    if (l->il <= s->ahead_batch_layer) {
        s->ahead_until = l->il;  // a new pass over the layers
    }
    s->ahead_batch_layer = l->il;
    s->ahead_until = std::max(s->ahead_until, l->il);
    if (s->layer_ahead == 0 || 2 * l->experts.size() <= l->n_expert) {
        return true;  // a narrow batch (a decoded token) reads nothing ahead
    }
    // the last layer within SMOE_LAYER_AHEAD layers with experts of this one (layers without
    // experts, a model's dense ones, neither count nor are read)
    size_t last = (size_t) l->il;
    uint64_t counted = 0;
    for (size_t j = (size_t) l->il + 1; j < s->layers.size() && counted < s->layer_ahead; j++) {
        if (s->layers[j].n_expert > 0) {
            counted++;
            last = j;
        }
    }
    if ((size_t) s->ahead_until < last) {
        const uint64_t active = s->active_slots();
        uint64_t room = active > l->experts.size() ? active - l->experts.size() : 0;
        for (int j = l->il + 1; j <= s->ahead_until && room > 0; j++) {
            room -= std::min<uint64_t>(room, s->layers[j].n_expert);  // queued by an earlier layer
        }
        size_t furthest = (size_t) s->ahead_until;
        for (size_t next = (size_t) s->ahead_until + 1; next <= last && room > 0; next++) {
            const layer_claims & n = s->layers[next];
            const uint32_t take = (uint32_t) std::min<uint64_t>(room, n.n_expert);
            if (take > 0) {
                r = smoe_prefetch_set(s->st, (uint32_t) next, s->all_experts.data(), take, true, nullptr);
                if (r == SMOE_ERR_RING_FULL) {
                    break;  // every slot held or loading: nothing deeper either
                }
                if (r != SMOE_OK) {
                    s->fail(smoe_error("smoe_prefetch_set", r) + " (layer-ahead, layer " + std::to_string(next) + ")");
                    return false;
                }
                s->layer_ahead_sets++;
                furthest = next;
            }
            if (take < n.n_expert) {
                break;  // in part: the next layer asks for the rest
            }
            room -= take;
            s->ahead_until = (int) next;
        }
        // the layers with experts in (il, furthest]
        uint32_t depth = 0;
        for (size_t j = (size_t) l->il + 1; j <= furthest; j++) {
            depth += s->layers[j].n_expert > 0 ? 1 : 0;
        }
        s->layer_ahead_deepest = std::max(s->layer_ahead_deepest, depth);
    }
    return true;
}

// Claims one member of the layer's left set for wave `wave` (waiting up to timeout_ns):
// SMOE_OK (claimed), SMOE_PENDING, or an error (reported: the op stops).
static smoe_status claim_one(layer_claims * l, int wave, uint64_t timeout_ns) {
    llama_smoe * s = l->s;
    smoe_slot slot;
    const smoe_status r = smoe_claim_any(s->st, (uint32_t) l->il, l->left.data(), (uint32_t) l->left.size(), timeout_ns, &slot);
    if (r == SMOE_OK) {
        l->held.push_back(slot);
        l->slot_of[slot.expert] = slot.slot_index;
        l->wave_of[slot.expert] = (uint32_t) wave + 1;
        l->left.erase(std::find(l->left.begin(), l->left.end(), slot.expert));
    } else if (r != SMOE_PENDING && r != SMOE_ERR_RING_FULL) {
        s->fail(smoe_error("smoe_claim_any", r) + " (layer " + std::to_string(l->il) + ", wave " + std::to_string(wave) + ")");
    }
    return r;
}

// A wave's claim (the graph's op, run by one thread): `guess`, for the first wave, the
// lookahead's guess of the next layers' experts (nullptr: none).
static void claim_wave(ggml_tensor * dst, const ggml_tensor * a, const ggml_tensor * guess, const void * userdata) {
    const auto * op = (const wave_op *) userdata;
    layer_claims * l = op->l;
    const int wave = op->wave;
    llama_smoe * s = l->s;
    if (s->profile && wave == 0 && a->ne[1] == 1) {
        s->pf_begin(l->il);
    }
    s->release_devices();  // the claims of layers the GPU has computed since
    s->release_all(*l);    // left over by a graph that was aborted
    const int64_t k = a->ne[0];
    const int64_t n_tokens = a->ne[1];
    int32_t * out = (int32_t *) dst->data;
    if (op->dev) {
        // the GPU's matmuls index experts, and the scheduler copies each one's bytes from its
        // slot: ids out of range are refused (start_batch), and an expert not claimed (a
        // failure, reported after the graph) is copied as zeros
        for (int64_t t = 0; t < n_tokens; t++) {
            for (int64_t i = 0; i < k; i++) {
                const int32_t e = *(const int32_t *) ((const char *) a->data + i * a->nb[0] + t * a->nb[1]);
                out[t * k + i] = e >= 0 && (uint32_t) e < l->n_expert ? e : 0;
            }
        }
    } else {
        std::fill(out, out + k * n_tokens, -1);
    }
    if (s->stopped()) {
        return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    if (wave == 0) {
        if (l->il == s->first_layer) {
            smoe_prewarm_pause(s->st, true);  // busy until the last layer's release
            s->ub_start = s->stats_now();
            s->ub_t0 = std::chrono::steady_clock::now();
            s->ub_tokens = n_tokens;
            if (s->fail_claims > 0) {
                s->fail_claims--;
                s->fail("smoe: SMOE_TEST_FAIL_CLAIMS: layer " + std::to_string(l->il) + "'s claim failed (test aid)");
                return;
            }
        }
        if (!start_batch(l, a, op->tier)) {
            return;
        }
        if (l->il == s->first_layer) {
            s->ub_narrow = 2 * l->experts.size() <= l->n_expert;  // decode: its figures are counted
        }
        if (s->squeeze != 0 && !s->squeezed && n_tokens >= 2 && l->il > s->first_layer) {
            s->squeezed = true;  // from here on: at most `squeeze` active slots (tests)
        }
    }
    // this wave's capacity: the active slots no claim holds (the earlier waves released
    // theirs); it must take enough that the waves after it can hold the rest. A layer of
    // one wave on a ring that holds the model takes its whole set without asking
    // (smoe_get_stats sums the claim histogram: tens of microseconds on one thread while
    // the others wait), and asks only when the ring refuses (below)
    const bool whole = op->dev || (l->waves == 1 && s->slots >= s->entries && !s->squeezed);
    const uint64_t left = l->left.size();
    const uint64_t cap = whole ? std::max<uint64_t>(1, left) : s->free_slots();
    // (a device batch is one wave, whatever a graph built since left in l->waves)
    const uint64_t waves_after = op->dev ? 0 : (uint64_t) (l->waves - wave - 1);
    const uint64_t need = left > waves_after * cap ? left - waves_after * cap : 0;
    if (need > cap) {
        // the ring shrank since the graph was built: its waves left cannot hold the rest
        s->short_of_waves(*l, left, l->waves - wave);
        return;
    }
    // first what is resident now (hits first), then wait for what must come, then take
    // whatever else has landed meanwhile; RING_FULL while slots are loading for other
    // experts (speculation) is waited out with sleeps, never a busy retry
    uint64_t got = 0;
    while (got < cap && !l->left.empty() && claim_one(l, wave, 0) == SMOE_OK) {
        got++;
    }
    // the next layers' guessed experts, read behind this layer's demand reads (after its
    // resident experts are claimed: a bet never evicts them) while this layer computes
    if (guess != nullptr && wave == 0 && s->guessing && 2 * l->experts.size() <= l->n_expert && !s->stopped()) {
        smoe_queue_guess(l, guess);
    }
    const uint64_t must = std::max<uint64_t>(need, got == 0 && !l->left.empty() ? 1 : 0);
    // the wave fails when nothing arrives for 600 s (a slow source that delivers keeps it going)
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(600);
    auto backoff = std::chrono::microseconds(50);
    while (got < must && !s->stopped()) {
        const smoe_status r = claim_one(l, wave, 1000000000ull);
        if (r == SMOE_OK) {
            got++;
            deadline = std::chrono::steady_clock::now() + std::chrono::seconds(600);
            continue;
        }
        if (std::chrono::steady_clock::now() > deadline) {
            s->fail(smoe_error("smoe_claim_any", r) + " (layer " + std::to_string(l->il) + ", wave " + std::to_string(wave) +
                    ": nothing arrived in 600 s)");
            break;
        }
        if (r == SMOE_ERR_RING_FULL) {
            // slots loading for other experts free up when they land (waited out below);
            // slots held by this wave's claims do not: once every active slot is held, the
            // wave stops with what it has if the waves after it can take the rest, and
            // otherwise the graph is built again (the elastic ring shrank during the wave)
            const uint64_t free_now = s->free_slots_now();
            if ((whole && l->left.size() > free_now) || free_now == 0) {
                if (!whole && got > 0 && l->left.size() <= waves_after * (s->active_slots())) {
                    break;
                }
                s->short_of_waves(*l, l->left.size(), l->waves - wave);
                break;
            }
            std::this_thread::sleep_for(backoff);
            backoff = std::min(backoff * 2, std::chrono::microseconds(10000));
        }
    }
    while (!s->stopped() && got < cap && !l->left.empty() && claim_one(l, wave, 0) == SMOE_OK) {
        got++;
    }
    if (s->stopped()) {
        s->release_all(*l);
        return;
    }
    if (got > 0) {
        s->waves_run++;
    }
    if (op->dev) {
        // held until the next claim op, which finds the GPU past this layer's matmuls
        l->dev_held = true;
        s->dev_held = true;
        s->dev_batches++;
        if (l->il == s->first_layer) {
            s->dev_tokens += (uint64_t) n_tokens;
        }
        s->claim_ops++;
        s->wait_ns += (uint64_t) std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
        return;
    }
    if (s->squeezed && !s->squeeze_told) {
        s->squeeze_told = true;  // (the test aid says what its first squeezed wave took)
        fprintf(stderr, "smoe: SMOE_TEST_SQUEEZE=%llu: layer %d wave %d of %d claimed %llu experts, %zu left\n",
                (unsigned long long) s->squeeze, l->il, wave, l->waves, (unsigned long long) got, l->left.size());
    }
    for (int64_t t = 0; t < n_tokens; t++) {
        for (int64_t i = 0; i < k; i++) {
            const int32_t e = *(const int32_t *) ((const char *) a->data + i * a->nb[0] + t * a->nb[1]);
            if (l->wave_of[e] == (uint32_t) wave + 1) {
                out[t * k + i] = (int32_t) l->slot_of[e];
            }
        }
    }
    s->wait_ns += (uint64_t) std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
    s->claim_ops++;
}

static void smoe_claim_op(ggml_tensor * dst, const ggml_tensor * a, int ith, int nth, void * userdata) {
    (void) nth;
    if (ith == 0) {
        claim_wave(dst, a, nullptr, userdata);
    }
}

// A wave op with two sources: the ids and what it must follow: the previous waves' sum (a
// later wave).
static void smoe_claim_after_op(ggml_tensor * dst, const ggml_tensor * a, const ggml_tensor * after, int ith, int nth, void * userdata) {
    (void) after;
    (void) nth;
    if (ith == 0) {
        claim_wave(dst, a, nullptr, userdata);
    }
}

static void smoe_claim_guess_op(ggml_tensor * dst, const ggml_tensor * a, const ggml_tensor * guess, int ith, int nth, void * userdata) {
    (void) nth;
    if (ith == 0) {
        claim_wave(dst, a, guess, userdata);
    }
}

static void smoe_release_op(ggml_tensor * dst, const ggml_tensor * a, int ith, int nth, void * userdata) {
    (void) dst;
    (void) a;
    (void) nth;
    if (ith == 0) {
        const auto * op = (const wave_op *) userdata;
        layer_claims * l = op->l;
        if (op->tier) {
            tier_admit(l);  // the experts the device tier admits keep their claims for the copy
        }
        l->s->release_all(*l);
        if (l->s->pf_open && op->wave == l->waves - 1) {
            l->s->pf_end(l->il);
        }
        if (l->il == l->s->last_layer && op->wave == l->waves - 1) {
            smoe_prewarm_pause(l->s->st, false);  // idle between graphs: pre-warm may read
            l->s->rebuilds_in_row = 0;            // a graph completed
            l->s->ubatch_end();
        }
    }
}

int llama_smoe_waves(llama_smoe * s, int il, int64_t n_tokens, int64_t n_expert_used) {
    GGML_ASSERT(il >= 0 && il < (int) s->layers.size());
    layer_claims & l = s->layers[il];
    const uint64_t set = std::min<uint64_t>((uint64_t) std::max<int64_t>(1, n_expert_used * n_tokens), std::max<uint32_t>(1, l.n_expert));
    const uint64_t cap = s->free_slots();
    // a ring that holds the whole model has no misses past the first pass: one wave
    const bool spare = s->slots < s->entries;
    l.waves = (int) std::min<uint64_t>((set + cap - 1) / cap + (spare ? 1 : 0), MAX_WAVES);
    // every wave's op data, made once per layer (the graph keeps pointers to it)
    while (s->wave_ops[il].size() < (size_t) l.waves) {
        s->wave_ops[il].push_back(std::make_unique<wave_op>(wave_op{&l, (int) s->wave_ops[il].size()}));
    }
    return l.waves;
}

uint32_t llama_smoe_ubatch(llama_smoe * s, uint32_t n_batch, uint32_t n_ubatch, bool memory_grows, bool * raised) {
    *raised = false;
    if (s == nullptr) {
        return n_ubatch;
    }
    const char * v = std::getenv("SMOE_UBATCH");
    if (v != nullptr && *v != '\0') {
        const uint32_t asked = env_u32("SMOE_UBATCH", 0, UINT32_MAX);
        if (asked == 0) {
            return n_ubatch;
        }
        const uint32_t n = std::min(asked, n_batch);
        fprintf(stderr, "smoe: n_ubatch %u (SMOE_UBATCH=%u, n_batch %u)\n", n, asked, n_batch);
        return n;
    }
    if (s->slots >= s->entries || n_ubatch >= n_batch) {
        return n_ubatch;
    }
    if (memory_grows) {
        fprintf(stderr, "smoe: n_ubatch %u kept (the model's sliding-window KV cache grows with it; SMOE_UBATCH=N raises it)\n",
                n_ubatch);
        return n_ubatch;
    }
    *raised = true;
    return n_batch;
}

bool llama_smoe_ubatch_fits(llama_smoe * s, uint32_t n_ubatch, uint32_t asked, size_t compute_bytes, size_t base_bytes) {
    if (s == nullptr) {
        return true;
    }
    const size_t extra = compute_bytes > base_bytes ? compute_bytes - base_bytes : 0;
    const bool fits = extra <= s->ring_bytes / 4;
    fprintf(stderr,
            "smoe: n_ubatch %u%s (llama.cpp's: %u): host compute buffers of %.1f MiB, %.1f MiB more than llama.cpp's, "
            "%s a quarter of the ring's %.1f MiB%s\n",
            n_ubatch, fits ? "" : " too big", asked, compute_bytes / 1048576.0, extra / 1048576.0,
            fits ? "within" : "above", s->ring_bytes / 1048576.0,
            fits ? ": a prompt of up to n_ubatch tokens reads each expert once (SMOE_UBATCH=0: llama.cpp's)" : "");
    return fits;
}

uint32_t llama_smoe_graph_nodes(const llama_smoe * s) {
    if (s == nullptr) {
        return 0;
    }
    uint32_t nodes = 0;
    for (const layer_claims & l : s->layers) {
        if (l.n_expert > 0) {
            nodes += (uint32_t) std::min<uint64_t>(MAX_WAVES, (uint64_t) l.n_expert + 1) * NODES_PER_WAVE;
            nodes += NODES_PER_GUESS * (s->lookahead + 1);  // the norm, a router per layer ahead, the top-k
            nodes += s->tier != nullptr || std::getenv("SMOE_VRAM") != nullptr ? NODES_PER_WAVE : 0;  // the device wave
        }
    }
    return nodes;
}

ggml_tensor * llama_smoe_claim(llama_smoe * s, ggml_context * ctx, ggml_tensor * selected_experts, ggml_tensor * second, int il,
                               int wave, int waves) {
    GGML_ASSERT(il >= 0 && il < (int) s->layers.size() && wave >= 0 && wave < waves && waves == s->layers[il].waves);
    layer_claims & l = s->layers[il];
    void * op = l.dev_next     ? (void *) s->dev_ops[il].get()
              : l.tier_graph ? (void *) s->tier_wave_ops[il][wave].get()
                             : (void *) s->wave_ops[il][wave].get();
    l.dev_next = false;
    if (second == nullptr) {
        return ggml_map_custom1(ctx, selected_experts, smoe_claim_op, 1, op);
    }
    if (wave == 0) {
        return ggml_map_custom2(ctx, selected_experts, second, smoe_claim_guess_op, 1, op);
    }
    return ggml_map_custom2(ctx, selected_experts, second, smoe_claim_after_op, 1, op);
}


ggml_tensor * llama_smoe_release(llama_smoe * s, ggml_context * ctx, ggml_tensor * experts, int il, int wave) {
    GGML_ASSERT(il >= 0 && il < (int) s->layers.size() && wave >= 0 && wave < s->layers[il].waves);
    layer_claims & l = s->layers[il];
    wave_op * op = l.tier_graph ? s->tier_wave_ops[il][wave].get() : s->wave_ops[il][wave].get();
    return ggml_map_custom1_inplace(ctx, experts, smoe_release_op, 1, op);
}

bool llama_smoe_failed(const llama_smoe * s) {
    return s != nullptr && s->stopped();
}

void llama_smoe_ubatch_begin(llama_smoe * s) {
    if (s == nullptr) {
        return;
    }
    tier_flush(s, false);  // the device tier's copies, between graphs
    if (!s->failed) {
        return;
    }
    s->release_devices();  // once the GPU is done copying from their slots
    for (auto & l : s->layers) {
        s->release_all(l);
    }
    smoe_prewarm_pause(s->st, false);  // the failed graph's last layer never said idle
    s->rebuild_pending = false;
    s->failed = false;
}

bool llama_smoe_rebuild_pending(const llama_smoe * s) {
    return s != nullptr && !s->failed && s->rebuild_pending;
}

bool llama_smoe_rebuild(llama_smoe * s, bool can_recompute) {
    if (s == nullptr || s->failed || !s->rebuild_pending) {
        return false;
    }
    s->release_devices();  // once the GPU is done copying from their slots
    for (auto & l : s->layers) {
        s->release_all(l);
    }
    tier_flush(s, true);  // the claims kept for the tier's copies, whose ring slots the graph built again needs
    s->rebuild_pending = false;
    if (!can_recompute) {
        s->fail("smoe: the elastic ring shrank under this batch's waves, and a model with recurrent state cannot "
                "compute a batch again (its layers before this one have already updated that state): "
                "set SMOE_ELASTIC=0 for a fixed ring, or raise SMOE_RING_SLOTS");
        return false;
    }
    s->rebuilds++;
    s->rebuilds_in_row++;
    return true;
}

int llama_smoe_last_layer(const llama_smoe * s) {
    return s->last_layer;
}
