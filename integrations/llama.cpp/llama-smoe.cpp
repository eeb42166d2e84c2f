// llama-smoe.cpp: see llama-smoe.h. Every smoe call's status is checked; a failure
// carries smoe_status_str() and smoe_last_error() in its message.
#include "llama-smoe.h"

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

namespace {

// At most this many waves per layer: each wave repeats the expert FFN's graph nodes, and
// the graph's node budget (llama_context::graph_max_nodes) is fixed when the context is
// made. A ring with fewer free slots than a layer's batch needs in this many waves stops
// generation with a message instead.
constexpr int MAX_WAVES = 16;
// Graph nodes one wave can add: the claim, the three matmuls (or the merged gate_up and
// its two views), biases, scales, the activation's ops, the release and the sum.
constexpr uint32_t NODES_PER_WAVE = 24;
// Graph nodes a guessed layer adds to the layer before it (llama_smoe_predict): its norm's
// multiply, its router, a bias's two ops, the concatenation; and the norm, the sort and its view.
constexpr uint32_t NODES_PER_GUESS = 6;
// Lookahead's probes (llama_smoe::adapt): decoded tokens timed with guesses and without, and
// the tokens that follow with the choice; guessing wins when its tokens take under GAIN of
// the others' time (a win within the noise of two samples of 8 tokens is no win).
constexpr uint32_t PROBE_TOKENS = 8;
constexpr uint32_t RUN_TOKENS = 112;
constexpr double GAIN = 0.97;
// Graphs built again in a row (each after the ring shrank under the last one's waves)
// before the claim gives up with a message: a ring that keeps shrinking faster than a
// graph computes.
constexpr int MAX_REBUILDS = 8;

std::string smoe_error(const char * call, smoe_status st) {
    return std::string("smoe: ") + call + ": " + smoe_status_str(st) + ": " + smoe_last_error();
}

// An unsigned integer environment variable; `def` when unset or empty.
uint32_t env_u32(const char * name, uint32_t def, uint32_t max) {
    const char * v = std::getenv(name);
    if (v == nullptr || *v == '\0') {
        return def;
    }
    char * end = nullptr;
    errno = 0;
    const unsigned long long x = std::strtoull(v, &end, 10);
    if (!std::isdigit((unsigned char) v[0]) || *end != '\0' || errno != 0 || x > max) {
        throw std::runtime_error(std::string("smoe: ") + name + "=" + v + " is not an integer from 0 to " + std::to_string(max));
    }
    return (uint32_t) x;
}

struct layer_claims {
    llama_smoe * s = nullptr;
    int il = 0;
    uint32_t n_expert = 0;           // this layer's experts (0: no routed experts)
    std::vector<smoe_slot> held;     // this layer's claims until its expert compute is done
    // Scratch of the claim op, sized once at bind (no allocation per op):
    std::vector<uint32_t> experts;   // the batch's distinct experts, in order of first use
    std::vector<uint32_t> left;      // those not claimed yet
    std::vector<uint32_t> slot_of;   // expert -> ring slot, while its wave holds it
    std::vector<uint32_t> seen;      // expert -> the batch generation that last saw it
    std::vector<uint32_t> wave_of;   // expert -> 1 + the wave that claimed it, this batch
    uint32_t generation = 0;
    int waves = 1;                   // this batch's waves (the graph's)
    // lookahead: what guesses this layer's experts (llama_smoe_router), and the layers the
    // guess built in this layer's graph is for (llama_smoe_predict)
    ggml_tensor * norm = nullptr;    // its FFN norm's weight
    ggml_tensor * router = nullptr;  // its router, [n_embd, n_expert]
    ggml_tensor * probs_b = nullptr; // the router's selection bias (DeepSeek-V3's), if any
    std::vector<int> guess_for;      // the layers the guess tensor's rows are for, in order
    bool dev_next = false;           // the graph being built computes this layer on the GPU
    bool dev_held = false;           // `held` are claims of a batch computed on the GPU
};

// What a wave op works on: its layer and which wave it is, and whether the batch's
// matmuls run on the GPU (one wave, the experts copied from their slots by the scheduler).
struct wave_op {
    layer_claims * l;
    int wave;
    bool dev = false;
};

// An expert weight as the GPU's matmuls see it: the model's own layout ([ne0, ne1,
// n_expert], contiguous) over a mapping of zeros that holds nothing; the scheduler copies
// each expert a batch claimed from its ring slot (ggml_backend_sched_weights).
struct staged_weight {
    ggml_tensor * tensor = nullptr;
    int il = 0;
    uint64_t offset = 0;             // of the weight's slice in a slot
};

} // namespace

struct llama_smoe {
    smoe_streamer * st = nullptr;
    std::string vault;               // what smoe_open opened: a vault, or a model file in place
    std::string where;               // "smoe: vault DIR: " or "smoe: model FILE: ", for messages
    std::string refit;               // what to do when it does not fit the model, for messages
    bool in_place = false;           // a model file opened in place ("format": "smoe-model")
    nlohmann::json layouts;          // the vault's layer_blob_layouts
    ggml_context * ctx = nullptr;    // the expert weights (metadata only)
    ggml_backend_buffer_t ring = nullptr;
    uint8_t * base = nullptr;
    uint64_t ring_bytes = 0;
    uint64_t slot_bytes = 0;
    uint32_t slots = 0;
    uint32_t max_experts = 0;        // most experts of any layer
    double open_s = 0;               // smoe_open's time, which commits the ring when populated
    bool populated = false;          // SMOE_POPULATE=2 (the default): committed at open
    // SMOE_LAYER_AHEAD: while a batch that routes to most of layer L's experts (more than
    // half) computes layer L, queue the next layers' experts as speculation, as many layers
    // as the ring holds beside L's set (the last in part), at most this many layers with
    // experts (0: none; 1 under the adaptive policy, which ranks a deeper layer's unclaimed
    // read-ahead above a nearer one's for eviction)
    uint32_t layer_ahead = UINT32_MAX;
    bool copy_ahead = true;             // SMOE_COPY_AHEAD: ggml_backend_sched_weights.copy_ahead
    std::vector<uint32_t> all_experts;  // 0, 1, ... max_experts - 1
    // SMOE_LOOKAHEAD: in decode (a batch that routes to at most half a layer's experts), while
    // layer L computes, guess the experts of the next `lookahead` layers with experts by
    // applying their routers (and FFN norms) to L's state, and queue them as speculation;
    // each layer's real set settles its guess (smoe drops the stale reads). 0: off. Width:
    // SMOE_LOOKAHEAD_WIDTH experts a token (0: the model's top-k)
    uint32_t lookahead = 1;
    uint32_t lookahead_width = 0;
    // SMOE_LOOKAHEAD_ADAPT (default 1): guesses are queued only while they pay. A drive that
    // decode keeps busy already gains nothing from bets and loses what the wrong ones read, so
    // decoded tokens are timed in probes that alternate guessing and not, token by token
    // (PROBE_TOKENS of each); guessing goes on for the next RUN_TOKENS only if its tokens
    // took under GAIN of the others'. 0: guess in every decoded token
    bool adapt = true;
    bool guessing = true;               // the current ubatch queues its guesses
    uint32_t probe_left = 2 * PROBE_TOKENS;  // tokens of the probe to come (alternating)
    uint32_t run_left = 0;              // tokens of the run after a probe
    double probe_on_s = 0, probe_off_s = 0;
    uint32_t probe_on_n = 0, probe_off_n = 0;
    uint64_t probes = 0, probes_won = 0;  // probes, and those after which it guessed
    uint64_t tokens_guessed = 0;        // decoded tokens that queued guesses
    bool ub_guessed = false;            // this ubatch queued a guess
    std::vector<uint32_t> guess;        // scratch: a layer's guessed experts, ranks first
    std::vector<uint32_t> guess_seen;   // expert -> guess_generation that last took it
    uint32_t guess_generation = 0;
    uint64_t guess_sets = 0;            // guesses queued
    // decode: the counters over the ubatches whose first layer's batch was narrow
    bool ub_narrow = false;             // this ubatch's first layer routed to at most half
    smoe_stats ub_start = {};           // the counters when this ubatch's first layer began
    uint64_t decode_tokens = 0;
    double decode_s = 0;
    std::chrono::steady_clock::time_point ub_t0;
    uint64_t d_bytes_read = 0, d_bytes_spec = 0;
    uint64_t d_routed = 0, d_hits = 0, d_dropped = 0, d_busy_ns = 0, d_idle_ns = 0, d_demand = 0;
    int64_t d_unclaimed_net = 0;        // speculative bytes never claimed: their growth over decode
    int64_t ub_tokens = 0;              // this ubatch's tokens
    uint64_t layer_ahead_sets = 0;
    uint32_t layer_ahead_deepest = 0;   // the most layers with experts read ahead of one layer
    int ahead_batch_layer = INT32_MAX;  // the layer whose batch last started: a new pass when not below
    int ahead_until = -1;               // the pass's last layer whose whole set was queued ahead
    uint64_t entries = 0;            // experts of the layers bound: a ring of as many holds the model
    std::set<int> skipped_layers;    // layers whose experts the model does not use (TENSOR_SKIP)
    uint64_t waves_run = 0;          // waves that claimed at least one expert
    uint64_t layer_batches = 0;      // (layer, batch) pairs: waves_run / this = waves per layer
    std::vector<layer_claims> layers;
    // per layer, what llama_smoe_router gave (before bind sizes `layers`)
    struct router_tensors {
        ggml_tensor * norm = nullptr;
        ggml_tensor * router = nullptr;
        ggml_tensor * probs_b = nullptr;
    };
    std::vector<router_tensors> routers;
    std::vector<std::vector<std::unique_ptr<wave_op>>> wave_ops;  // per layer, per wave
    std::vector<std::unique_ptr<wave_op>> dev_ops;                 // per layer: its GPU batch's claim
    // Op offload (llama_smoe_devices): the GPU a big batch's experts are computed on, the
    // ring registered with it (pinned: cudaHostRegister) or not, and the staged weights
    ggml_backend_t gpu = nullptr;    // the offloading context's (cleared when it is freed)
    // every live context's GPU backend that offloads: a device batch's copies ran on the
    // stream of the context that computed it, which need not be the newest one's
    std::vector<ggml_backend_t> gpus;
    ggml_backend_dev_t gpu_dev = nullptr;  // its device, for names (lives as long as the process)
    bool pinned = false;             // smoe_config.pinned: a fixed ring, its pages committed
    bool registered = false;         // the ring registered with the GPU's driver
    void (*unregister)(void *) = nullptr;
    std::unordered_map<const ggml_tensor *, staged_weight> staged;  // ring view -> staged
    std::unordered_map<const ggml_tensor *, const staged_weight *> staged_of;  // staged -> it
    ggml_context * staged_ctx = nullptr;
    ggml_backend_buffer_t zero_buf = nullptr;  // the staged weights' bytes: zeros, never committed
    void * zeros = nullptr;
    size_t zeros_bytes = 0;
    bool dev_held = false;           // some layer holds claims of a batch on the GPU
    uint64_t dev_batches = 0;        // (layer, batch) pairs computed on the GPU
    uint64_t dev_bytes = 0;          // expert bytes copied to it
    uint64_t dev_bytes_ahead = 0;    // of which copied ahead, while the weight before computed
    uint64_t dev_tokens = 0;         // tokens of the batches computed on it (the first layer's)
    int first_layer = -1;            // the first and last layers with experts: the pre-warm
    int last_layer = -1;             // thread pauses from the one's claims to the other's release
    std::atomic<bool> failed{false};
    // A wave found the ring short of the slots its graph's waves were sized for (the
    // elastic ring shrank mid-graph): the graph stops (the abort callback) and
    // llama_context::process_ubatch builds it again, sized from the ring now
    std::atomic<bool> rebuild_pending{false};
    uint64_t rebuilds = 0;           // graphs built again for it
    int rebuilds_in_row = 0;         // since the last graph that completed
    // SMOE_TEST_SQUEEZE=N (tests): from the first batch's second layer on, the glue sees
    // at most N active slots, as after the elastic ring shrank to N in the middle of it
    uint64_t squeeze = 0;            // 0: off
    bool squeezed = false;
    bool squeeze_told = false;       // the first squeezed wave that ran has been reported
    // SMOE_TEST_FAIL_CLAIMS=N (tests): the first N batches' first claim ops fail, as a read
    // error would, so that what comes after a failure can be tested
    uint64_t fail_claims = 0;
    uint64_t wait_ns = 0;
    uint64_t claim_ops = 0;

    bool stopped() const { return failed || rebuild_pending; }

    ~llama_smoe() {
        release_devices(false);
        for (auto & l : layers) {
            release_all(l);
        }
        if (registered && unregister) {
            unregister(base);
        }
        if (ring) {
            ggml_backend_buffer_free(ring);
        }
        drop_staged();
        if (ctx) {
            ggml_free(ctx);
        }
        smoe_close(st);
    }

    // The staged weights (make_staged), or what a failed make_staged made of them.
    void drop_staged() {
        staged_of.clear();
        staged.clear();
        if (zero_buf) {
            ggml_backend_buffer_free(zero_buf);
            zero_buf = nullptr;
        }
        if (zeros) {
            munmap(zeros, zeros_bytes);
            zeros = nullptr;
        }
        if (staged_ctx) {
            ggml_free(staged_ctx);
            staged_ctx = nullptr;
        }
    }

    void release_all(layer_claims & l) {
        for (const auto & slot : l.held) {
            const smoe_status r = smoe_release(st, &slot);
            if (r != SMOE_OK) {
                fprintf(stderr, "%s\n", smoe_error("smoe_release", r).c_str());
            }
        }
        l.held.clear();
        l.dev_held = false;
    }

    // Releases the claims of batches computed on the GPU, once the GPU is past them (its
    // copies from their slots done): a claim op calls it first (sync), so that a layer's
    // claims are held from its claim op until the next one. Without sync when the model is
    // freed: its contexts, and their GPU work, are gone by then.
    void release_devices(bool sync = true) {
        if (!dev_held) {
            return;
        }
        dev_held = false;
        bool any = false;
        for (const auto & l : layers) {
            any = any || l.dev_held;
        }
        if (!any) {
            return;
        }
        if (sync) {
            for (ggml_backend_t g : gpus) {
                ggml_backend_synchronize(g);
            }
        }
        for (auto & l : layers) {
            if (l.dev_held) {
                release_all(l);
            }
        }
    }

    // Slots that may hold data now: the elastic ring takes idle ones offline under memory
    // pressure (smoe_stats.slots_active).
    uint64_t active_slots() const {
        smoe_stats stats = {};
        stats.struct_size = sizeof(stats);
        return seen(smoe_get_stats(st, &stats) == SMOE_OK ? stats.slots_active : slots);
    }

    // The library's counters now (zeros when it cannot say, which it always can once open).
    smoe_stats stats_now() const {
        smoe_stats stats = {};
        stats.struct_size = sizeof(stats);
        if (smoe_get_stats(st, &stats) != SMOE_OK) {
            stats = {};
        }
        return stats;
    }

    // A ubatch ended: when its first layer's batch was narrow (decode), its share of the
    // counters goes into the decode figures of the statistics line.
    void ubatch_end() {
        if (!ub_narrow) {
            return;
        }
        ub_narrow = false;
        const smoe_stats now = stats_now();
        const smoe_stats & was = ub_start;
        const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - ub_t0).count();
        decode_tokens += (uint64_t) ub_tokens;
        decode_s += took;
        tokens_guessed += ub_guessed ? (uint64_t) ub_tokens : 0;
        ub_guessed = false;
        adapt_after(took / (double) std::max<int64_t>(1, ub_tokens));
        d_bytes_read += now.bytes_read - was.bytes_read;
        d_bytes_spec += now.bytes_speculative - was.bytes_speculative;
        d_unclaimed_net += (int64_t) now.bytes_speculative_unclaimed - (int64_t) was.bytes_speculative_unclaimed;
        d_routed += now.prediction_routed - was.prediction_routed;
        d_hits += now.prediction_hits - was.prediction_hits;
        d_dropped += now.speculative_dropped - was.speculative_dropped;
        d_busy_ns += now.busy_ns - was.busy_ns;
        d_idle_ns += now.drive_idle_ns - was.drive_idle_ns;
        d_demand += now.reads_demand - was.reads_demand;
    }

    // Lookahead's choice for the next decoded ubatch, from how long this one took a token:
    // in a probe, alternately with and without guesses; after it, what the probe found
    // faster, for RUN_TOKENS ubatches; then another probe.
    void adapt_after(double token_s) {
        if (!adapt) {
            guessing = true;
            return;
        }
        if (probe_left > 0) {
            (guessing ? probe_on_s : probe_off_s) += token_s;
            (guessing ? probe_on_n : probe_off_n) += 1;
            probe_left--;
            if (probe_left > 0) {
                guessing = !guessing;
                return;
            }
            probes++;
            const double on = probe_on_s / std::max<uint32_t>(1, probe_on_n);
            const double off = probe_off_s / std::max<uint32_t>(1, probe_off_n);
            guessing = on < GAIN * off;
            probes_won += guessing ? 1 : 0;
            run_left = RUN_TOKENS;
            return;
        }
        if (run_left > 0 && --run_left > 0) {
            return;
        }
        // a new probe, its first token without guesses
        probe_left = 2 * PROBE_TOKENS;
        probe_on_s = probe_off_s = 0;
        probe_on_n = probe_off_n = 0;
        guessing = false;
    }

    // Active slots as the glue sees them: SMOE_TEST_SQUEEZE's cap once it has begun.
    uint64_t seen(uint64_t active) const { return squeezed ? std::min(active, squeeze) : active; }

    // Slots a wave may claim now: the active ones no claim holds (0 when every active
    // slot is held).
    uint64_t free_slots_now() const {
        smoe_stats stats = {};
        stats.struct_size = sizeof(stats);
        if (smoe_get_stats(st, &stats) != SMOE_OK) {
            return 0;
        }
        const uint64_t active = seen(stats.slots_active);
        return active > stats.slots_held ? active - stats.slots_held : 0;
    }

    // The same, at least 1 (what waves are sized from).
    uint64_t free_slots() const { return std::max<uint64_t>(1, free_slots_now()); }

    // Why the `waves_left` waves left of layer il cannot hold the `n` experts left for them.
    std::string too_many_experts(int il, size_t n, int waves_left) const {
        const uint64_t active = active_slots();
        std::string why = "smoe: layer " + std::to_string(il) + ": " + std::to_string(n) + " experts left for " +
                          std::to_string(waves_left) + (waves_left == 1 ? " wave" : " waves") + " but the ring has " +
                          std::to_string(free_slots()) + " free slots of " + std::to_string(active) + " active";
        if (active < slots) {
            why += " (" + std::to_string(slots) + " reserved; the elastic ring took " + std::to_string(slots - active) +
                   " offline under memory pressure during the layer: free memory, or set SMOE_ELASTIC=0 for a fixed ring)";
        }
        return why + (rebuilds_in_row >= MAX_REBUILDS ? " after " + std::to_string(MAX_REBUILDS) + " graphs built again in a row for a shrinking ring" : "") +
               "; raise SMOE_RING_SLOTS or lower n_ubatch";
    }

    void fail(const std::string & msg) {
        fprintf(stderr, "%s\n", msg.c_str());
        failed = true;
    }

    // Layer l's waves left (`waves_left`, of which this is the first) cannot hold the `n`
    // experts left for them in the slots free now: stop the graph so that it is built
    // again with more waves, unless even MAX_WAVES waves of the free slots could not hold
    // the layer's set, or the ring keeps shrinking (then it is a failure, with why).
    void short_of_waves(const layer_claims & l, size_t n, int waves_left) {
        // what a wave of the graph built again could hold: the free slots once this
        // layer's claims are released (they are, before the graph is built again)
        const uint64_t free = std::max<uint64_t>(1, free_slots_now() + l.held.size());
        if ((l.experts.size() + free - 1) / free > (uint64_t) MAX_WAVES || rebuilds_in_row >= MAX_REBUILDS) {
            fail(too_many_experts(l.il, n, waves_left));
            return;
        }
        rebuild_pending = true;
    }
};

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
    const uint32_t layer_ahead = env_u32("SMOE_LAYER_AHEAD", UINT32_MAX, UINT32_MAX);
    const uint32_t lookahead = env_u32("SMOE_LOOKAHEAD", 1, 8);
    const uint32_t lookahead_width = env_u32("SMOE_LOOKAHEAD_WIDTH", 0, 1u << 20);
    const bool lookahead_adapt = env_u32("SMOE_LOOKAHEAD_ADAPT", 1, 1) == 1;
    // op offload: a layer's next expert weight (up, gate, down: the same ids) copied to the
    // GPU on a stream of its own while the weight before it computes; 0 copies in order
    const bool copy_ahead = env_u32("SMOE_COPY_AHEAD", 1, 1) == 1;
    const uint32_t squeeze = env_u32("SMOE_TEST_SQUEEZE", 0, UINT32_MAX);
    const uint32_t fail_claims = env_u32("SMOE_TEST_FAIL_CLAIMS", 0, UINT32_MAX);
    // read again when a context is made, where a bad value would be never seen
    // (SMOE_OP_OFFLOAD without a GPU): checked here, so that any bad value stops the load
    (void) env_u32("SMOE_UBATCH", 0, UINT32_MAX);
    (void) env_u32("SMOE_OP_OFFLOAD", 1, 1);
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
static bool parse_expert_name(const char * name, int * layer, std::string * role) {
    int n = 0;
    char buf[16];
    int used = 0;
    if (sscanf(name, "blk.%d.ffn_%15[a-z_]%n", &n, buf, &used) != 2 || n < 0) {
        return false;
    }
    std::string r(buf);
    const std::string suffix = "_exps";
    if (r.size() <= suffix.size() || r.compare(r.size() - suffix.size(), suffix.size(), suffix) != 0 ||
        strcmp(name + used, ".weight") != 0) {
        return false;
    }
    r.resize(r.size() - suffix.size());
    if (r != "gate" && r != "up" && r != "down" && r != "gate_up") {
        return false;
    }
    *layer = n;
    *role = r;
    return true;
}

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
        parse_expert_name(t->name, &il, &role);
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
static bool start_batch(layer_claims * l, const ggml_tensor * a) {
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
    l->left.assign(l->experts.begin(), l->experts.end());
    s->layer_batches++;
    // hand the set over: resident members cost nothing, the rest are read in this order
    smoe_status r = smoe_prefetch_set(s->st, (uint32_t) l->il, l->experts.data(), (uint32_t) l->experts.size(), false, nullptr);
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

// Lookahead: queues as speculation the experts that `guess` (llama_smoe_predict's tensor:
// [width, n_tokens x layers] expert ids, each token's best first) names for the layers after
// l, one set a layer, each in rank order (every token's first choice, then its second...).
static void queue_guess(layer_claims * l, const ggml_tensor * guess) {
    llama_smoe * s = l->s;
    const size_t d = l->guess_for.size();
    const int64_t width = guess->ne[0];
    const int64_t rows = guess->ne[1];
    if (d == 0 || rows % (int64_t) d != 0) {
        return;
    }
    const int64_t n_tokens = rows / (int64_t) d;
    for (size_t j = 0; j < d; j++) {
        const int m = l->guess_for[j];
        const uint32_t n_expert = s->layers[(size_t) m].n_expert;
        if (++s->guess_generation == 0) {
            std::fill(s->guess_seen.begin(), s->guess_seen.end(), 0);
            s->guess_generation = 1;
        }
        s->guess.clear();
        for (int64_t r = 0; r < width; r++) {
            for (int64_t t = 0; t < n_tokens; t++) {
                const int32_t e =
                    *(const int32_t *) ((const char *) guess->data + r * guess->nb[0] + (t + (int64_t) j * n_tokens) * guess->nb[1]);
                if (e >= 0 && (uint32_t) e < n_expert && s->guess_seen[e] != s->guess_generation) {
                    s->guess_seen[e] = s->guess_generation;
                    s->guess.push_back((uint32_t) e);
                }
            }
        }
        if (s->guess.empty()) {
            continue;
        }
        const smoe_status r = smoe_prefetch_set(s->st, (uint32_t) m, s->guess.data(), (uint32_t) s->guess.size(), true, nullptr);
        if (r == SMOE_ERR_RING_FULL) {
            break;  // every slot held or loading: no room for bets now
        }
        if (r != SMOE_OK) {
            s->fail(smoe_error("smoe_prefetch_set", r) + " (lookahead, layer " + std::to_string(m) + ")");
            return;
        }
        s->guess_sets++;
        s->ub_guessed = true;
    }
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
        if (!start_batch(l, a)) {
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
        queue_guess(l, guess);
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

// A wave op with two sources: the ids and the previous waves' sum it must follow (a later
// wave), or the ids and the lookahead's guess (a first wave).
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
        l->s->release_all(*l);
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
        }
    }
    return nodes;
}

ggml_tensor * llama_smoe_claim(llama_smoe * s, ggml_context * ctx, ggml_tensor * selected_experts, ggml_tensor * second, int il,
                               int wave, int waves) {
    GGML_ASSERT(il >= 0 && il < (int) s->layers.size() && wave >= 0 && wave < waves && waves == s->layers[il].waves);
    layer_claims & l = s->layers[il];
    void * op = l.dev_next ? (void *) s->dev_ops[il].get() : (void *) s->wave_ops[il][wave].get();
    l.dev_next = false;
    if (second == nullptr) {
        return ggml_map_custom1(ctx, selected_experts, smoe_claim_op, 1, op);
    }
    if (wave == 0) {
        return ggml_map_custom2(ctx, selected_experts, second, smoe_claim_guess_op, 1, op);
    }
    return ggml_map_custom2(ctx, selected_experts, second, smoe_claim_after_op, 1, op);
}

ggml_tensor * llama_smoe_predict(llama_smoe * s, ggml_context * ctx, ggml_tensor * ffn_inp, ggml_tensor * cur, int il,
                                 int64_t n_expert_used, float rms_eps) {
    GGML_ASSERT(il >= 0 && il < (int) s->layers.size());
    layer_claims & l = s->layers[il];
    l.guess_for.clear();
    // nothing to read ahead through a ring that holds the model; a batch that routes to more
    // than half the layer's experts (a prompt) reads the next layers whole (layer-ahead)
    const int64_t n_tokens = cur->ne[1];
    if (s->lookahead == 0 || s->slots >= s->entries || l.n_expert == 0 ||
        2 * (uint64_t) n_tokens * (uint64_t) std::max<int64_t>(1, n_expert_used) > l.n_expert) {
        return nullptr;
    }
    // the next `lookahead` layers with experts and a router, of one width (their logits are
    // concatenated)
    uint32_t n_expert = 0;
    for (size_t m = (size_t) il + 1; m < s->layers.size() && l.guess_for.size() < s->lookahead; m++) {
        const layer_claims & ml = s->layers[m];
        if (ml.n_expert == 0) {
            continue;  // a dense layer
        }
        if (ml.router == nullptr || ml.router->ne[0] != cur->ne[0] || (n_expert != 0 && ml.n_expert != n_expert)) {
            break;
        }
        n_expert = ml.n_expert;
        l.guess_for.push_back((int) m);
    }
    if (l.guess_for.empty()) {
        return nullptr;
    }
    const int64_t width = std::min<int64_t>(s->lookahead_width ? (int64_t) s->lookahead_width : n_expert_used, n_expert);
    // the layer's residual (pre-norm) when the model's graph named it, normalized as each
    // layer's FFN norm does; else the layer's own normalized input
    const bool raw = ffn_inp != nullptr && ffn_inp->ne[0] == cur->ne[0] && ffn_inp->ne[1] == cur->ne[1] &&
                     ffn_inp->type == GGML_TYPE_F32;
    ggml_tensor * x = raw ? ggml_rms_norm(ctx, ffn_inp, rms_eps) : cur;
    ggml_tensor * logits = nullptr;
    for (int m : l.guess_for) {
        const layer_claims & ml = s->layers[(size_t) m];
        ggml_tensor * xm = raw && ml.norm != nullptr && ml.norm->ne[0] == x->ne[0] ? ggml_mul(ctx, x, ml.norm) : x;
        ggml_tensor * lg = ggml_mul_mat(ctx, ml.router, xm);  // [n_expert, n_tokens]
        if (ml.probs_b != nullptr) {
            lg = ggml_add(ctx, ggml_sigmoid(ctx, lg), ml.probs_b);  // what DeepSeek-V3 selects by
        }
        logits = logits == nullptr ? lg : ggml_concat(ctx, logits, lg, 1);
    }
    ggml_tensor * guess = ggml_argsort_top_k(ctx, logits, (int) width);  // [width, n_tokens x layers]
    ggml_format_name(guess, "smoe_guess-%d", il);
    return guess;
}

ggml_tensor * llama_smoe_release(llama_smoe * s, ggml_context * ctx, ggml_tensor * experts, int il, int wave) {
    GGML_ASSERT(il >= 0 && il < (int) s->layers.size() && wave >= 0 && wave < s->layers[il].waves);
    return ggml_map_custom1_inplace(ctx, experts, smoe_release_op, 1, s->wave_ops[il][wave].get());
}

bool llama_smoe_failed(const llama_smoe * s) {
    return s != nullptr && s->stopped();
}

void llama_smoe_ubatch_begin(llama_smoe * s) {
    if (s == nullptr || !s->failed) {
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

// --- Op offload: a big batch's experts on the GPU, copied from the ring ---------------

// The scheduler's questions about weights (ggml_backend_sched_weights): a ring view's ops
// run where the ring is; a staged weight's experts are in their slots.
static bool smoe_can_offload(const ggml_tensor * w, void * user_data) {
    const auto * s = (const llama_smoe *) user_data;
    return w->buffer == nullptr || w->buffer != s->ring;
}

static const void * smoe_expert_data(const ggml_tensor * w, int32_t id, bool ahead, void * user_data) {
    auto * s = (llama_smoe *) user_data;
    const auto it = s->staged_of.find(w);
    if (it == s->staged_of.end()) {
        return nullptr;
    }
    const staged_weight & sw = *it->second;
    const layer_claims & l = s->layers[sw.il];
    s->dev_bytes += w->nb[2];
    s->dev_bytes_ahead += ahead ? w->nb[2] : 0;
    if (id >= 0 && (uint32_t) id < l.n_expert && l.dev_held && l.wave_of[id] == 1 && l.slot_of[id] < s->slots) {
        return s->base + (uint64_t) l.slot_of[id] * s->slot_bytes + sw.offset;
    }
    return s->zeros;  // not claimed: the claim op failed, and the graph's result is discarded
}

// The staged weight of every ring view, over one read-only mapping of zeros (nothing
// committed: no page of it is ever written), in a host buffer the scheduler offloads from.
static void make_staged_or_throw(llama_smoe * s);

// The staged weights: make_staged_or_throw, leaving nothing behind when it throws (a later
// context tries again).
static void make_staged(llama_smoe * s) {
    try {
        make_staged_or_throw(s);
    } catch (...) {
        s->drop_staged();
        throw;
    }
}

static void make_staged_or_throw(llama_smoe * s) {
    std::vector<ggml_tensor *> views;
    size_t most = 0;
    for (ggml_tensor * t = ggml_get_first_tensor(s->ctx); t != nullptr; t = ggml_get_next_tensor(s->ctx, t)) {
        int il;
        std::string role;
        parse_expert_name(t->name, &il, &role);
        views.push_back(t);
        most = std::max(most, (size_t) t->nb[1] * (size_t) t->ne[1] * s->layers[il].n_expert);
    }
    s->zeros_bytes = most + 4096;
    s->zeros = mmap(nullptr, s->zeros_bytes, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (s->zeros == MAP_FAILED) {
        s->zeros = nullptr;
        throw std::runtime_error(std::string("smoe: cannot map ") + std::to_string(s->zeros_bytes) + " bytes of zeros: " + strerror(errno));
    }
    s->zero_buf = ggml_backend_cpu_buffer_from_ptr(s->zeros, s->zeros_bytes);
    if (s->zero_buf == nullptr) {
        throw std::runtime_error("smoe: cannot wrap the staged weights in a ggml buffer");
    }
    ggml_backend_buffer_set_usage(s->zero_buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    ggml_init_params params = {ggml_tensor_overhead() * (views.size() + 1), nullptr, true};
    s->staged_ctx = ggml_init(params);
    if (s->staged_ctx == nullptr) {
        throw std::runtime_error("smoe: cannot make the staged weights' context");
    }
    s->staged.reserve(views.size());
    for (ggml_tensor * t : views) {
        int il;
        std::string role;
        parse_expert_name(t->name, &il, &role);
        staged_weight sw;
        sw.il = il;
        sw.offset = (uint64_t) ((const uint8_t *) t->data - s->base);
        sw.tensor = ggml_new_tensor_3d(s->staged_ctx, t->type, t->ne[0], t->ne[1], s->layers[il].n_expert);
        ggml_format_name(sw.tensor, "%s (staged)", t->name);
        GGML_ASSERT(sw.tensor->nb[1] == t->nb[1] && ggml_nbytes(sw.tensor) <= s->zeros_bytes);
        sw.tensor->data = s->zeros;
        sw.tensor->buffer = s->zero_buf;
        s->staged[t] = sw;
    }
    for (const auto & [view, sw] : s->staged) {
        s->staged_of[sw.tensor] = &sw;
    }
    s->dev_ops.resize(s->layers.size());
    for (size_t il = 0; il < s->layers.size(); il++) {
        s->dev_ops[il] = std::make_unique<wave_op>(wave_op{&s->layers[il], 0, true});
    }
}

bool llama_smoe_devices(llama_smoe * s, ggml_backend_t * backends, size_t n, bool op_offload) {
    ggml_backend_t gpu = nullptr;
    for (size_t i = 0; i < n && gpu == nullptr; i++) {
        const auto type = ggml_backend_dev_type(ggml_backend_get_device(backends[i]));
        if (type == GGML_BACKEND_DEVICE_TYPE_GPU || type == GGML_BACKEND_DEVICE_TYPE_IGPU) {
            gpu = backends[i];
        }
    }
    // the newest context decides (a model's contexts compute one at a time): one that does
    // not offload builds no device layer, whatever an earlier context did
    s->gpu = nullptr;
    if (gpu == nullptr) {
        return op_offload;  // nothing to offload to: the ring views never are (smoe_can_offload)
    }
    if (!op_offload || env_u32("SMOE_OP_OFFLOAD", 1, 1) == 0) {
        fprintf(stderr, "smoe: op offload is off (%s): the routed experts are computed in host memory\n",
                op_offload ? "SMOE_OP_OFFLOAD=0" : "asked");
        return false;
    }
    ggml_backend_dev_t dev = ggml_backend_get_device(gpu);
    if (s->gpu_dev != nullptr && s->gpu_dev != dev) {
        throw std::runtime_error(std::string("smoe: op offload to ") + ggml_backend_dev_name(dev) + " after " +
                                 ggml_backend_dev_name(s->gpu_dev) + ": one GPU per model (the ring is registered with it)");
    }
    if (s->staged.empty()) {
        make_staged(s);
    }
    s->gpu = gpu;
    s->gpu_dev = dev;
    if (std::find(s->gpus.begin(), s->gpus.end(), gpu) == s->gpus.end()) {
        s->gpus.push_back(gpu);
    }
    if (s->pinned && !s->registered) {
        // a pinned ring (fixed, its pages committed at open) registered once: copies from it
        // are the device's DMA, not staged through the driver's own pinned buffers. The
        // patch's CUDA backend registers a buffer its owner keeps fixed whatever
        // GGML_CUDA_REGISTER_HOST says; another backend's register call may ask for it
        ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
        const auto proc = [reg](const char * name) { return reg ? ggml_backend_reg_get_proc_address(reg, name) : nullptr; };
        using register_fn = bool (*)(void *, size_t);
        using unregister_fn = void (*)(void *);
        auto reg_fn = (register_fn) proc("ggml_backend_register_fixed_host_buffer");
        s->unregister = (unregister_fn) proc("ggml_backend_unregister_fixed_host_buffer");
        if (reg_fn == nullptr || s->unregister == nullptr) {
            reg_fn = (register_fn) proc("ggml_backend_register_host_buffer");
            s->unregister = (unregister_fn) proc("ggml_backend_unregister_host_buffer");
        }
        // (registered only with its unregister call, which runs before the ring goes)
        s->registered = reg_fn != nullptr && s->unregister != nullptr && reg_fn(s->base, s->ring_bytes);
        if (!s->registered) {
            fprintf(stderr, "smoe: the ring could not be registered with %s: copies from it are staged by the driver\n",
                    ggml_backend_dev_name(dev));
        }
    }
    fprintf(stderr, "smoe: op offload on %s: a batch big enough computes its experts there, each claimed expert copied from its ring slot (%s)\n",
            ggml_backend_dev_name(dev),
            s->registered ? "the ring pinned and registered"
            : s->pinned   ? "the ring pinned but not registered"
                          : "the ring not registered: SMOE_PIN=0");
    return true;
}

void llama_smoe_context_free(llama_smoe * s, ggml_backend_t * backends, size_t n) {
    if (s == nullptr) {
        return;
    }
    s->release_devices();  // the GPUs done with their slots (this context's backends still alive)
    for (size_t i = 0; i < n; i++) {
        if (backends[i] == s->gpu) {
            s->gpu = nullptr;
        }
        s->gpus.erase(std::remove(s->gpus.begin(), s->gpus.end(), backends[i]), s->gpus.end());
    }
}

void llama_smoe_sched(llama_smoe * s, ggml_backend_sched_t sched) {
    if (s == nullptr) {
        return;
    }
    // copies ahead where they were measured: CUDA's second stream, and ggml's RPC device (the
    // tests' stand-in for a GPU, whose backends' commands run in order on one server)
    bool copy_ahead = false;
    if (s->copy_ahead && s->gpu_dev != nullptr) {
        ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(s->gpu_dev);
        const char * name = reg != nullptr ? ggml_backend_reg_name(reg) : "";
        copy_ahead = std::strcmp(name, "CUDA") == 0 || std::strncmp(name, "RPC", 3) == 0;  // (RPC[endpoint])
    }
    const ggml_backend_sched_weights weights = {smoe_can_offload, smoe_expert_data, s, copy_ahead};
    ggml_backend_sched_set_weights(sched, &weights);
}

bool llama_smoe_on_device(llama_smoe * s, ggml_context * ctx, int il, ggml_tensor * cur, ggml_tensor * selected_experts, ggml_tensor * w) {
    GGML_ASSERT(il >= 0 && il < (int) s->layers.size());
    layer_claims & l = s->layers[il];
    l.dev_next = false;
    if (s->gpu == nullptr || w == nullptr) {
        return false;
    }
    const auto it = s->staged.find(w);
    if (it == s->staged.end()) {
        return false;
    }
    // the batch's experts must fit the ring at once (one wave): else the CPU, in waves
    const uint64_t set = std::min<uint64_t>((uint64_t) (selected_experts->ne[0] * selected_experts->ne[1]), l.n_expert);
    if (set > s->free_slots_now()) {
        return false;
    }
    // what the scheduler asks to offload an op (ggml_backend_sched_backend_id_from_cur)
    ggml_tensor * probe = ggml_mul_mat_id(ctx, it->second.tensor, cur, selected_experts);
    if (!ggml_backend_supports_op(s->gpu, probe) || !ggml_backend_offload_op(s->gpu, probe)) {
        return false;
    }
    l.dev_next = true;
    l.waves = 1;
    if (s->wave_ops[il].empty()) {  // the last layer's release op takes wave 0's
        s->wave_ops[il].push_back(std::make_unique<wave_op>(wave_op{&l, 0}));
    }
    return true;
}

ggml_tensor * llama_smoe_staged(llama_smoe * s, ggml_tensor * w) {
    const auto it = s->staged.find(w);
    GGML_ASSERT(it != s->staged.end());
    return it->second.tensor;
}

int llama_smoe_last_layer(const llama_smoe * s) {
    return s->last_layer;
}
