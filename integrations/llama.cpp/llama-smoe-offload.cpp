// llama-smoe-offload.cpp: op offload (see llama-smoe.h, llama_smoe_devices): a batch big
// enough computes its experts on the GPU, each claimed expert copied from its ring slot.
#include "llama-smoe.h"
#include "llama-smoe-impl.h"

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
        expert_name(t->name, &il, &role);
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
        expert_name(t->name, &il, &role);
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
    s->tier_on = false;
    if (gpu == nullptr) {
        return op_offload;  // nothing to offload to: the ring views never are (smoe_can_offload)
    }
    tier_make(s, gpu);  // SMOE_VRAM: the device tier, whether or not big batches offload
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
        if (backends[i] == s->tier_gpu) {
            tier_flush(s, true);  // its copies, while its backend lives
            s->tier_gpu = nullptr;
            s->tier_on = false;
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
