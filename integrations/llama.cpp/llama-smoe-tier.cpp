// llama-smoe-tier.cpp: the device tier (SMOE_VRAM; docs/llama.md "Device tier"): hot experts
// kept in VRAM slots of the GPU, computed there in decode, the rest computed from the ring as
// before. The rule (which expert takes which slot, when a slot may be overwritten) is the
// library's smoe_tier; this file holds the pool, the graph's device wave and the copies.
//
// A decoded token, layer by layer: the device wave's ids op, the layer's first host op, looks
// each of the batch's experts up (tier_lookups): one the tier holds is computed by the device
// wave (its matmuls over the pool, on the GPU, while the CPU computes the host waves) and
// leaves the layer's set (no claim, no read); the others are claimed and computed from the
// ring in the host waves, and a pair of the other kind is a slot of zeros in the device
// wave, and no slot (-1) in the host waves: each pair's result is added once. When the host waves release their claims, the experts the tier admits keep
// theirs (tier_admit); when the next ubatch begins, once the GPU is done with the last graph,
// their bytes are copied from their ring slots into their device slots and the claims
// released (tier_flush). A budget of 0 (SMOE_VRAM unset) builds no tier: today's path.
#include "llama-smoe.h"
#include "llama-smoe-impl.h"

// SMOE_VRAM: bytes, with an optional K, M or G (powers of 1024), or N% (1 to 90) of the
// device's free memory when the context is made (the model's GPU weights and the KV cache
// placed, the compute buffers not yet: the rest leaves them room); 0 or unset: no tier. Without a
// device (dev: nullptr, the check at load) a share counts as 0 bytes.
uint64_t tier_budget(ggml_backend_dev_t dev) {
    const char * v = std::getenv("SMOE_VRAM");
    if (v == nullptr || *v == '\0') {
        return 0;
    }
    char * end = nullptr;
    errno = 0;
    const unsigned long long x = std::strtoull(v, &end, 10);
    const bool digits = std::isdigit((unsigned char) v[0]) && errno == 0;
    if (digits && end[0] == '%' && end[1] == '\0') {
        if (x < 1 || x > 90) {
            throw std::runtime_error(std::string("smoe: SMOE_VRAM=") + v +
                                     " is not a share from 1% to 90% of the GPU's free memory (the rest is for llama.cpp's "
                                     "compute buffers and the CUDA runtime's, made after the tier)");
        }
        if (dev == nullptr) {
            return 0;
        }
        size_t free = 0;
        size_t total = 0;
        ggml_backend_dev_memory(dev, &free, &total);
        return (uint64_t) free / 100 * x;
    }
    uint64_t unit = 1;
    if (*end == 'K' || *end == 'k') {
        unit = 1ull << 10;
    } else if (*end == 'M' || *end == 'm') {
        unit = 1ull << 20;
    } else if (*end == 'G' || *end == 'g') {
        unit = 1ull << 30;
    }
    if (unit != 1) {
        end++;
    }
    if (!digits || *end != '\0' || x > (UINT64_MAX >> 30)) {
        throw std::runtime_error(std::string("smoe: SMOE_VRAM=") + v +
                                 " is not a size in bytes (a number, optionally K, M or G) nor a share of the GPU's free memory (N%)");
    }
    return (uint64_t) x * unit;
}

void tier_make(llama_smoe * s, ggml_backend_t gpu) {
    ggml_backend_dev_t dev = ggml_backend_get_device(gpu);
    if (s->tier != nullptr) {
        // one context at a time uses the tier (its backend's stream is the one the copies
        // wait for): the one that made it, or, once that one is freed (its copies flushed
        // then), the next context on the same device (llama-bench makes one a test)
        if (s->tier_gpu == nullptr && dev == s->tier_dev) {
            s->tier_gpu = gpu;
        }
        s->tier_on = s->tier_gpu != nullptr && gpu == s->tier_gpu;
        return;
    }
    const uint64_t budget = tier_budget(dev);
    if (budget == 0) {
        return;
    }
    // one pool tensor per role, [ne0, ne1, K + 1]: every layer's weights of a role must share
    // a type and a shape (the model's are the same from layer to layer)
    struct role_shape {
        ggml_type type;
        int64_t ne0, ne1;
        ggml_tensor * pool = nullptr;
    };
    std::map<std::string, role_shape> roles;
    s->tier_views.assign(s->layers.size(), {});
    for (ggml_tensor * t = ggml_get_first_tensor(s->ctx); t != nullptr; t = ggml_get_next_tensor(s->ctx, t)) {
        int il;
        std::string role;
        expert_name(t->name, &il, &role);
        if (role == "gate_up") {
            fprintf(stderr, "smoe: no device tier: the model's gate and up weights are one tensor (%s)\n", t->name);
            return;
        }
        const auto it = roles.find(role);
        if (it == roles.end()) {
            roles[role] = role_shape{t->type, t->ne[0], t->ne[1]};
        } else if (it->second.type != t->type || it->second.ne0 != t->ne[0] || it->second.ne1 != t->ne[1]) {
            fprintf(stderr, "smoe: no device tier: %s differs in type or shape from layer to layer\n", t->name);
            return;
        }
        s->tier_views[il].push_back(t);
    }
    if (roles.empty()) {
        return;
    }
    uint64_t expert_bytes = 0;
    for (const auto & [role, r] : roles) {
        expert_bytes += ggml_row_size(r.type, r.ne0) * (uint64_t) r.ne1;
    }
    const uint64_t fit = budget / expert_bytes;  // slots, the one of zeros among them
    const uint64_t slots = std::min<uint64_t>(fit > 0 ? fit - 1 : 0, s->entries);
    if (slots == 0) {
        fprintf(stderr, "smoe: no device tier: SMOE_VRAM=%s (%llu bytes) holds no expert beside the slot of zeros (%llu bytes each)\n",
                std::getenv("SMOE_VRAM"), (unsigned long long) budget, (unsigned long long) expert_bytes);
        return;
    }
    ggml_init_params params = {ggml_tensor_overhead() * (roles.size() + 1), nullptr, true};
    s->tier_ctx = ggml_init(params);
    if (s->tier_ctx == nullptr) {
        throw std::runtime_error("smoe: cannot make the device tier's context");
    }
    for (auto & [role, r] : roles) {
        r.pool = ggml_new_tensor_3d(s->tier_ctx, r.type, r.ne0, r.ne1, (int64_t) slots + 1);
        ggml_format_name(r.pool, "smoe tier %s", role.c_str());
    }
    s->tier_buf = ggml_backend_alloc_ctx_tensors_from_buft(s->tier_ctx, ggml_backend_dev_buffer_type(dev));
    if (s->tier_buf == nullptr) {
        fprintf(stderr, "smoe: no device tier: %s could not allocate %.1f MiB (SMOE_VRAM)\n", ggml_backend_dev_name(dev),
                (double) (slots + 1) * (double) expert_bytes / 1048576.0);
        tier_drop(s);
        return;
    }
    // zeros: the last slot is the device wave's "computed elsewhere" (zero weights give zero)
    ggml_backend_buffer_clear(s->tier_buf, 0);
    ggml_backend_buffer_set_usage(s->tier_buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    for (size_t il = 0; il < s->tier_views.size(); il++) {
        for (const ggml_tensor * v : s->tier_views[il]) {
            int layer;
            std::string role;
            expert_name(v->name, &layer, &role);
            s->tier_pool_of[v] = roles[role].pool;
        }
    }
    const smoe_status r = smoe_tier_new((uint32_t) slots, (uint32_t) s->layers.size(), std::max<uint32_t>(1, s->max_experts), &s->tier);
    if (r != SMOE_OK) {
        fprintf(stderr, "%s: no device tier\n", smoe_error("smoe_tier_new", r).c_str());
        tier_drop(s);
        return;
    }
    s->tier_slots = (uint32_t) slots;
    s->tier_expert_bytes = expert_bytes;
    s->tier_dev = dev;
    s->tier_gpu = gpu;
    s->tier_on = true;
    for (auto & l : s->layers) {
        l.tier_slot_of.assign(l.n_expert, -1);
    }
    s->tier_ops.clear();
    for (auto & l : s->layers) {
        s->tier_ops.push_back(std::make_unique<wave_op>(wave_op{&l, 0, false, true}));
    }
    s->tier_wave_ops.resize(s->layers.size());
    fprintf(stderr, "smoe: device tier on %s: %u slots of %.2f MiB (%.1f MiB of SMOE_VRAM=%s, %llu bytes), %.1f%% of the experts; "
                    "decode computes the experts it holds there\n",
            ggml_backend_dev_name(dev), (unsigned) slots, expert_bytes / 1048576.0, (double) (slots + 1) * expert_bytes / 1048576.0,
            std::getenv("SMOE_VRAM"), (unsigned long long) budget, 100.0 * (double) slots / (double) std::max<uint64_t>(1, s->entries));
}

bool tier_lookups(layer_claims * l, const ggml_tensor * ids) {
    llama_smoe * s = l->s;
    std::fill(l->tier_slot_of.begin(), l->tier_slot_of.end(), -1);
    if (s->tier == nullptr || s->tier_gpu == nullptr || s->stopped()) {
        return true;  // (a graph with a device wave whose context is gone: its wave adds zeros)
    }
    // each of the batch's experts once (a lookup counts a use); ids out of range are left to
    // the first claim, which refuses them
    for (int64_t t = 0; t < ids->ne[1]; t++) {
        for (int64_t i = 0; i < ids->ne[0]; i++) {
            const int32_t e = *(const int32_t *) ((const char *) ids->data + i * ids->nb[0] + t * ids->nb[1]);
            if (e < 0 || (uint32_t) e >= l->n_expert || l->tier_slot_of[e] != -1) {
                continue;
            }
            int32_t slot = -1;
            const smoe_status r = smoe_tier_lookup(s->tier, (uint32_t) l->il, (uint32_t) e, &slot);
            if (r != SMOE_OK) {
                s->fail(smoe_error("smoe_tier_lookup", r) + " (layer " + std::to_string(l->il) + ")");
                return false;
            }
            l->tier_slot_of[e] = slot >= 0 ? slot : -2;  // held: computed on the GPU
        }
    }
    return true;
}

void tier_keep_host(layer_claims * l) {
    size_t kept = 0;
    for (size_t i = 0; i < l->experts.size(); i++) {
        const uint32_t e = l->experts[i];
        if (l->tier_slot_of[e] < 0) {
            l->experts[kept++] = e;
        }
    }
    l->experts.resize(kept);
}

void tier_admit(layer_claims * l) {
    llama_smoe * s = l->s;
    if (s->tier == nullptr || s->tier_gpu == nullptr || s->stopped()) {
        return;
    }
    // the claims kept for copies hold ring slots until the next ubatch: at most an eighth of
    // the ring, so that the layers after this one keep their room (the tier fills over tokens)
    const size_t most = std::max<size_t>(1, s->slots / 8);
    size_t kept = 0;
    for (size_t i = 0; i < l->held.size(); i++) {
        const smoe_slot & claim = l->held[i];
        if (s->tier_pending.size() >= most) {
            l->held[kept++] = claim;
            continue;
        }
        smoe_tier_promotion p = {-1, -1, -1};
        const smoe_status r = smoe_tier_admit(s->tier, (uint32_t) l->il, claim.expert, &p);
        if (r == SMOE_OK && p.slot >= 0) {
            s->tier_pending.push_back({(uint32_t) p.slot, l->il, claim});  // the claim kept for the copy
        } else {
            if (r != SMOE_OK) {
                fprintf(stderr, "%s\n", smoe_error("smoe_tier_admit", r).c_str());
            }
            l->held[kept++] = claim;
        }
    }
    l->held.resize(kept);
}

void tier_flush(llama_smoe * s) {
    if (s->tier == nullptr) {
        return;
    }
    if (!s->tier_pending.empty() && s->tier_gpu != nullptr) {
        // the last graph is done with its device slots (a victim may be one an earlier graph
        // read: holds end at step_done, whether or not the GPU is past that graph) and with
        // the ring slots the copies read
        ggml_backend_synchronize(s->tier_gpu);
    }
    const auto t0 = std::chrono::steady_clock::now();
    for (const auto & c : s->tier_pending) {
        if (s->tier_gpu == nullptr) {
            smoe_tier_failed(s->tier, c.device_slot);  // its context is gone: no copy
            smoe_release(s->st, &c.claim);
            continue;
        }
        uint64_t bytes = 0;
        const uint8_t * slot = s->base + (uint64_t) c.claim.slot_index * s->slot_bytes;
        for (const ggml_tensor * v : s->tier_views[c.il]) {
            ggml_tensor * pool = s->tier_pool_of.at(v);
            const uint64_t offset = (uint64_t) ((const uint8_t *) v->data - s->base);
            const size_t n = pool->nb[2];
            ggml_backend_tensor_set(pool, slot + offset, (size_t) c.device_slot * pool->nb[2], n);
            bytes += n;
        }
        smoe_status r = smoe_tier_loaded(s->tier, c.device_slot, bytes);
        if (r != SMOE_OK) {
            fprintf(stderr, "%s\n", smoe_error("smoe_tier_loaded", r).c_str());
        }
        r = smoe_release(s->st, &c.claim);
        if (r != SMOE_OK) {
            fprintf(stderr, "%s\n", smoe_error("smoe_release", r).c_str());
        }
    }
    s->tier_pending.clear();
    s->tier_copy_ns += (uint64_t) std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
    smoe_tier_step_done(s->tier);
}

void tier_drop(llama_smoe * s) {
    for (const auto & c : s->tier_pending) {
        smoe_tier_failed(s->tier, c.device_slot);  // never copied
        smoe_release(s->st, &c.claim);
    }
    s->tier_pending.clear();
    s->tier_pool_of.clear();
    if (s->tier_buf != nullptr) {
        ggml_backend_buffer_free(s->tier_buf);
        s->tier_buf = nullptr;
    }
    if (s->tier_ctx != nullptr) {
        ggml_free(s->tier_ctx);
        s->tier_ctx = nullptr;
    }
    smoe_tier_free(s->tier);
    s->tier = nullptr;
    s->tier_on = false;
}

void tier_report(const llama_smoe * s) {
    if (s->tier == nullptr) {
        return;
    }
    smoe_tier_stats st = {};
    st.struct_size = sizeof(st);
    if (smoe_tier_get_stats(s->tier, &st) != SMOE_OK) {
        return;
    }
    fprintf(stderr,
            "smoe: device tier: %u slots on %s; %llu lookups, %llu hits (%.1f%%), %llu promotions (%llu never used, %llu failed), "
            "%llu evictions, %.2f MiB copied in %.3f s between graphs\n",
            s->tier_slots, s->tier_dev ? ggml_backend_dev_name(s->tier_dev) : "?", (unsigned long long) st.lookups,
            (unsigned long long) st.hits, st.lookups ? 100.0 * (double) st.hits / (double) st.lookups : 0.0,
            (unsigned long long) st.promotions, (unsigned long long) st.never_used, (unsigned long long) st.failed,
            (unsigned long long) st.evictions, st.bytes_copied / 1048576.0, s->tier_copy_ns / 1e9);
}

// The device wave's ids (one thread): the batch's experts looked up, then each pair's device
// slot where the tier holds its expert, else the slot of zeros.
static void smoe_tier_ids_op(ggml_tensor * dst, const ggml_tensor * a, int ith, int nth, void * userdata) {
    (void) nth;
    if (ith != 0) {
        return;
    }
    const auto * op = (const wave_op *) userdata;
    layer_claims * l = op->l;
    const llama_smoe * s = l->s;
    const int64_t k = a->ne[0];
    const int64_t n_tokens = a->ne[1];
    int32_t * out = (int32_t *) dst->data;
    const int32_t zeros = (int32_t) s->tier_slots;
    const bool looked = tier_lookups(l, a);
    for (int64_t t = 0; t < n_tokens; t++) {
        for (int64_t i = 0; i < k; i++) {
            const int32_t e = *(const int32_t *) ((const char *) a->data + i * a->nb[0] + t * a->nb[1]);
            int32_t slot = zeros;
            if (looked && !s->stopped() && e >= 0 && (uint32_t) e < l->n_expert && l->tier_slot_of[e] >= 0) {
                slot = l->tier_slot_of[e];
            }
            out[t * k + i] = slot;
        }
    }
}

static void smoe_tier_ids_in_op(ggml_tensor * dst, const ggml_tensor * a, const ggml_tensor * in, int ith, int nth, void * userdata) {
    (void) in;  // (taken from the GPU here, for the host waves after this op)
    smoe_tier_ids_op(dst, a, ith, nth, userdata);
}

static void smoe_tier_ids_in_guess_op(ggml_tensor * dst, const ggml_tensor * a, const ggml_tensor * in, const ggml_tensor * guess,
                                      int ith, int nth, void * userdata) {
    (void) in;
    (void) guess;
    smoe_tier_ids_op(dst, a, ith, nth, userdata);
}

bool llama_smoe_tier_wave(llama_smoe * s, int il, int64_t n_tokens, int64_t n_expert_used, bool plain) {
    GGML_ASSERT(il >= 0 && il < (int) s->layers.size());
    layer_claims & l = s->layers[il];
    l.tier_graph = s->tier != nullptr && s->tier_on && plain && l.n_expert > 0 &&
                   2 * (uint64_t) std::max<int64_t>(1, n_tokens * n_expert_used) <= l.n_expert && !s->tier_views[il].empty();
    // the graph's claim and release ops: twins that carry the tier into the run (llama.cpp
    // reuses a graph, and another context's graph may be built in between)
    if (l.tier_graph) {
        auto & ops = s->tier_wave_ops[il];
        while (ops.size() < (size_t) l.waves) {
            ops.push_back(std::make_unique<wave_op>(wave_op{&l, (int) ops.size(), false, true}));
        }
    }
    return l.tier_graph;
}

ggml_tensor * llama_smoe_tier_ids(llama_smoe * s, ggml_context * ctx, ggml_tensor * selected_experts, ggml_tensor * in,
                                  ggml_tensor * guess, int il) {
    GGML_ASSERT(il >= 0 && il < (int) s->layers.size() && s->layers[il].tier_graph && in != nullptr);
    void * op = s->tier_ops[il].get();
    return guess != nullptr ? ggml_map_custom3(ctx, selected_experts, in, guess, smoe_tier_ids_in_guess_op, 1, op)
                            : ggml_map_custom2(ctx, selected_experts, in, smoe_tier_ids_in_op, 1, op);
}

ggml_tensor * llama_smoe_tier_weight(llama_smoe * s, ggml_tensor * w) {
    const auto it = s->tier_pool_of.find(w);
    GGML_ASSERT(it != s->tier_pool_of.end());
    return it->second;
}
