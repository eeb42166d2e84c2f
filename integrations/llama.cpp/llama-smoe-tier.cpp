// llama-smoe-tier.cpp: the device tier (SMOE_VRAM; docs/llama.md "Device tier"): hot experts
// kept in VRAM slots of the GPU, computed there in decode, the rest computed from the ring as
// before. The rule (which expert takes which slot, when a slot may be overwritten) is the
// library's smoe_tier; this file holds the pool, the graph's device wave and the copies.
//
// A decoded token, layer by layer: the device wave's ids are the layer's row of the tier's
// map (expert -> device slot, the slot of zeros for an expert the tier does not hold), a
// tensor in VRAM that the GPU reads with the router's ids (get_rows), so that the device wave
// is computed in the GPU's split with the router, and the layer goes to the CPU and back
// once, as without the tier. The layer's first claim (on the CPU) reads the map's host copy:
// an expert it holds leaves the layer's set (no claim, no read), and each of the batch's
// experts is looked up in the rule (counted, for admission). A pair the host computes is the
// slot of zeros in the device wave and a pair the GPU computes is no slot (-1) in the host
// waves: each pair's result is added once. When the host waves release their claims, the
// experts the rule admits keep theirs (tier_admit); when the next ubatch begins, once the GPU
// is done with the last graph, the experts they evict leave the map, and their bytes are
// copied from their ring slots into their device slots on a stream of their own while the
// next graph computes; when the ubatch after begins, they join the map and their claims are
// released (tier_flush). The map (both copies) changes only between graphs: a graph reads one
// map from its first layer to its last. A budget of 0 (SMOE_VRAM unset) builds no tier:
// today's path.
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
    ggml_init_params params = {ggml_tensor_overhead() * (roles.size() + 2), nullptr, true};
    s->tier_ctx = ggml_init(params);
    if (s->tier_ctx == nullptr) {
        throw std::runtime_error("smoe: cannot make the device tier's context");
    }
    for (auto & [role, r] : roles) {
        r.pool = ggml_new_tensor_3d(s->tier_ctx, r.type, r.ne0, r.ne1, (int64_t) slots + 1);
        ggml_format_name(r.pool, "smoe tier %s", role.c_str());
    }
    // the map: [experts of the widest layer, layers], each expert's device slot, or the
    // slot of zeros (K) for one the tier does not hold
    const uint32_t width = std::max<uint32_t>(1, s->max_experts);
    s->tier_map = ggml_new_tensor_2d(s->tier_ctx, GGML_TYPE_I32, width, (int64_t) s->layers.size());
    ggml_set_name(s->tier_map, "smoe tier map");
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
    s->tier_width = width;
    s->tier_snap.assign((size_t) width * s->layers.size(), (int32_t) slots);
    ggml_backend_tensor_set(s->tier_map, s->tier_snap.data(), 0, s->tier_snap.size() * sizeof(int32_t));
    s->tier_expert_bytes = expert_bytes;
    // the copies' own backend on the device: its own stream (CUDA), so that they overlap the
    // next graph; without one, each copy waits for the device
    s->tier_copier = ggml_backend_dev_init(dev, nullptr);
    s->tier_dev = dev;
    s->tier_gpu = gpu;
    s->tier_on = true;
    s->tier_wave_ops.resize(s->layers.size());
    fprintf(stderr, "smoe: device tier on %s: %u slots of %.2f MiB (%.1f MiB of SMOE_VRAM=%s, %llu bytes), %.1f%% of the experts; "
                    "decode computes the experts it holds there\n",
            ggml_backend_dev_name(dev), (unsigned) slots, expert_bytes / 1048576.0, (double) (slots + 1) * expert_bytes / 1048576.0,
            std::getenv("SMOE_VRAM"), (unsigned long long) budget, 100.0 * (double) slots / (double) std::max<uint64_t>(1, s->entries));
}

bool tier_lookups(layer_claims * l) {
    llama_smoe * s = l->s;
    if (s->tier == nullptr || s->tier_snap.empty()) {
        return true;
    }
    const int32_t * snap = s->tier_snap.data() + (size_t) l->il * s->tier_width;
    size_t kept = 0;
    for (size_t i = 0; i < l->experts.size(); i++) {
        const uint32_t e = l->experts[i];
        // the map the GPU reads decides where the pair is computed; a lookup counts the use
        // for admission (the two differ only for an expert whose slot the rule gave to another
        // in this ubatch: its bytes stay until the copy, after the graph). Once the context
        // that uses the tier is gone, nothing more is counted or admitted.
        if (s->tier_gpu != nullptr) {
            int32_t slot = -1;
            const smoe_status r = smoe_tier_lookup(s->tier, (uint32_t) l->il, e, &slot);
            if (r != SMOE_OK) {
                s->fail(smoe_error("smoe_tier_lookup", r) + " (layer " + std::to_string(l->il) + ")");
                return false;
            }
        }
        if (e < s->tier_width && snap[e] != (int32_t) s->tier_slots) {
            s->tier_device_uses++;  // the device wave computes it
        } else {
            l->experts[kept++] = e;  // the host waves do
        }
    }
    l->experts.resize(kept);
    return true;
}

void tier_admit(layer_claims * l) {
    llama_smoe * s = l->s;
    if (s->tier == nullptr || s->tier_gpu == nullptr || s->stopped()) {
        return;
    }
    // the claims kept for copies hold ring slots until their copy is done (one ubatch after
    // the next begins): at most an eighth of the ring, so that the layers after this one keep
    // their room (the tier fills over tokens)
    const size_t most = std::max<size_t>(1, s->slots / 8);
    size_t kept = 0;
    for (size_t i = 0; i < l->held.size(); i++) {
        const smoe_slot & claim = l->held[i];
        if (s->tier_pending.size() + s->tier_inflight.size() >= most) {
            l->held[kept++] = claim;
            continue;
        }
        smoe_tier_promotion p = {-1, -1, -1};
        const smoe_status r = smoe_tier_admit(s->tier, (uint32_t) l->il, claim.expert, &p);
        if (r == SMOE_OK && p.slot >= 0) {
            s->tier_pending.push_back({(uint32_t) p.slot, l->il, claim, p.evicted_layer, p.evicted_expert});  // the claim kept for the copy
        } else {
            if (r != SMOE_OK) {
                fprintf(stderr, "%s\n", smoe_error("smoe_tier_admit", r).c_str());
            }
            l->held[kept++] = claim;
        }
    }
    l->held.resize(kept);
}

// The copies issued at the last flush, waited for (done by now, as a rule): their experts
// ready, in the map's host copy, their claims released. True if there were any.
static bool tier_complete(llama_smoe * s) {
    if (s->tier_inflight.empty()) {
        return false;
    }
    if (s->tier_copier != nullptr) {
        ggml_backend_synchronize(s->tier_copier);
    }
    for (const auto & c : s->tier_inflight) {
        smoe_status r = smoe_tier_loaded(s->tier, c.device_slot, c.bytes);
        if (r != SMOE_OK) {
            fprintf(stderr, "%s\n", smoe_error("smoe_tier_loaded", r).c_str());
        } else {
            s->tier_snap[(size_t) c.il * s->tier_width + c.claim.expert] = (int32_t) c.device_slot;
        }
        r = smoe_release(s->st, &c.claim);
        if (r != SMOE_OK) {
            fprintf(stderr, "%s\n", smoe_error("smoe_release", r).c_str());
        }
    }
    s->tier_inflight.clear();
    return true;
}

void tier_flush(llama_smoe * s, bool all) {
    if (s->tier == nullptr) {
        return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    // 0. the last graph done on the tier's GPU, before the map or a slot it read changes: with
    // one GPU the graph's host splits have waited for it already, but a layer on another GPU
    // reads the map and the pool here and hands its result over asynchronously (costs
    // nothing once the caller has its logits)
    if ((!s->tier_inflight.empty() || !s->tier_pending.empty()) && s->tier_gpu != nullptr) {
        ggml_backend_synchronize(s->tier_gpu);
    }
    // 1. the copies issued one ubatch ago (on the copier's stream, while the last graph
    // computed): their experts join the map
    bool changed = tier_complete(s);
    // 2. the last graph's admissions: the experts they evict leave the map now, before the
    // next graph, and their slots are overwritten on the copier's stream while that graph
    // computes (it reads the new map, which holds neither the evicted nor the loading)
    const int32_t zeros = (int32_t) s->tier_slots;
    for (auto & c : s->tier_pending) {
        if (c.evicted_layer >= 0 && (size_t) c.evicted_layer < s->layers.size() && c.evicted_expert >= 0 &&
            (uint32_t) c.evicted_expert < s->tier_width) {
            s->tier_snap[(size_t) c.evicted_layer * s->tier_width + (uint32_t) c.evicted_expert] = zeros;
            changed = true;
        }
        if (s->tier_gpu == nullptr) {
            smoe_tier_failed(s->tier, c.device_slot);  // its context is gone: no copy
            smoe_release(s->st, &c.claim);
            continue;
        }
        // from the ring slot (pinned and registered where the GPU allows: the copy is the
        // device's DMA, and the call returns at once), into the device slot no graph reads
        const uint8_t * slot = s->base + (uint64_t) c.claim.slot_index * s->slot_bytes;
        c.bytes = 0;
        for (const ggml_tensor * v : s->tier_views[c.il]) {
            ggml_tensor * pool = s->tier_pool_of.at(v);
            const uint64_t offset = (uint64_t) ((const uint8_t *) v->data - s->base);
            const size_t n = pool->nb[2];
            if (s->tier_copier != nullptr) {
                ggml_backend_tensor_set_async(s->tier_copier, pool, slot + offset, (size_t) c.device_slot * pool->nb[2], n);
            } else {
                ggml_backend_tensor_set(pool, slot + offset, (size_t) c.device_slot * pool->nb[2], n);
            }
            c.bytes += n;
        }
        s->tier_inflight.push_back(c);  // its claim held until the copy is done
    }
    s->tier_pending.clear();
    // 3. a graph built again, a context freed, the tier dropped: nothing left in flight
    if (all) {
        changed = tier_complete(s) || changed;
    }
    if (changed && s->tier_map != nullptr) {
        // the map the next graph reads
        ggml_backend_tensor_set(s->tier_map, s->tier_snap.data(), 0, s->tier_snap.size() * sizeof(int32_t));
    }
    s->tier_copy_ns += (uint64_t) std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
    smoe_tier_step_done(s->tier);
}

void tier_drop(llama_smoe * s) {
    if (s->tier_copier != nullptr) {
        ggml_backend_synchronize(s->tier_copier);  // nothing reads the ring slots after this
    }
    for (const auto & c : s->tier_inflight) {
        smoe_release(s->st, &c.claim);
    }
    s->tier_inflight.clear();
    for (const auto & c : s->tier_pending) {
        smoe_tier_failed(s->tier, c.device_slot);  // never copied
        smoe_release(s->st, &c.claim);
    }
    s->tier_pending.clear();
    s->tier_pool_of.clear();
    s->tier_map = nullptr;
    s->tier_snap.clear();
    if (s->tier_copier != nullptr) {
        ggml_backend_free(s->tier_copier);
        s->tier_copier = nullptr;
    }
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
            "smoe: device tier: %u slots on %s; %llu lookups, %llu hits (%.1f%%; %llu computed on the device), %llu promotions (%llu "
            "never used, %llu failed), %llu evictions, %.2f MiB copied %s (%.3f s between graphs)\n",
            s->tier_slots, s->tier_dev ? ggml_backend_dev_name(s->tier_dev) : "?", (unsigned long long) st.lookups,
            (unsigned long long) st.hits, st.lookups ? 100.0 * (double) st.hits / (double) st.lookups : 0.0,
            (unsigned long long) s->tier_device_uses, (unsigned long long) st.promotions, (unsigned long long) st.never_used, (unsigned long long) st.failed,
            (unsigned long long) st.evictions, st.bytes_copied / 1048576.0,
            s->tier_copier != nullptr ? "on a stream of their own" : "by the decode steps (no stream of their own)", s->tier_copy_ns / 1e9);
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

ggml_tensor * llama_smoe_tier_ids(llama_smoe * s, ggml_context * ctx, ggml_tensor * selected_experts, int il) {
    GGML_ASSERT(il >= 0 && il < (int) s->layers.size() && s->layers[il].tier_graph && s->tier_map != nullptr);
    const int64_t k = selected_experts->ne[0];
    const int64_t n_tokens = selected_experts->ne[1];
    // the layer's row of the map, as n_expert rows of one id, gathered by the router's ids (a
    // view into its argsort: made contiguous first)
    ggml_tensor * row = ggml_view_2d(ctx, s->tier_map, 1, s->layers[il].n_expert, sizeof(int32_t),
                                     (size_t) il * s->tier_map->nb[1]);
    ggml_tensor * ids = ggml_reshape_1d(ctx, ggml_cont(ctx, selected_experts), k * n_tokens);
    return ggml_reshape_2d(ctx, ggml_get_rows(ctx, row, ids), k, n_tokens);
}

ggml_tensor * llama_smoe_tier_weight(llama_smoe * s, ggml_tensor * w) {
    const auto it = s->tier_pool_of.find(w);
    GGML_ASSERT(it != s->tier_pool_of.end());
    return it->second;
}
