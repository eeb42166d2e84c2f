// llama-smoe.h: routed experts streamed through smoe (the smoe library, include/smoe.h),
// from the model's own GGUF (SMOE=1) or from a vault packed from it (SMOE_VAULT=DIR).
//
// Then the model loader creates every `blk.N.ffn_*_exps.weight` tensor in a context of
// its own that is never allocated nor read; once the model is loaded, each of those
// tensors becomes a view over smoe's ring (ne[2] = ring slots, nb[2] = slot bytes).
// build_moe_ffn() then claims the experts a layer's top-k chose and hands
// ggml_mul_mat_id their slot indices instead of their expert ids.
// With neither set (or SMOE=0) nothing here runs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

struct ggml_backend;
struct ggml_backend_sched;
struct ggml_context;
struct ggml_tensor;
struct llama_smoe;

// Opens what the environment names for a model of n_layer layers and n_expert routed
// experts a layer loaded from model_path (the file llama.cpp opened: the first part of a
// split GGUF; nullptr or "" when it was not loaded from a path): SMOE_VAULT when set (a
// vault directory, its experts.smoe, or a model file smoe_open reads in place), else with
// SMOE=1 model_path itself. nullptr (stock llama.cpp) when SMOE is unset, empty or 0 and
// SMOE_VAULT unset or empty, whenever SMOE=0, and for a model without routed experts
// (n_expert 0: a dense draft model beside a streamed one), which says so on stderr.
// Throws std::runtime_error with smoe's message, naming the variable and the file, on
// any failure.
llama_smoe * llama_smoe_from_env(uint32_t n_layer, uint32_t n_expert, const char * model_path);

// Prints one "smoe: ..." line of statistics on stderr and closes the vault.
void llama_smoe_free(llama_smoe * s);

struct llama_smoe_deleter {
    void operator()(llama_smoe * s) const { llama_smoe_free(s); }
};
using llama_smoe_ptr = std::unique_ptr<llama_smoe, llama_smoe_deleter>;

// The context the loader must create tensor `name` in: smoe's (never allocated,
// never read from the model file) for a routed-expert weight, nullptr otherwise.
// `skipped`: the model does not use the tensor (TENSOR_SKIP: a next-token prediction
// layer it does not load): nullptr, and its layer's experts are not streamed.
// Throws std::runtime_error, naming the tensor, when the vault lacks its layer.
ggml_context * llama_smoe_tensor_ctx(llama_smoe * s, const char * name, bool skipped);

// Before llama_smoe_bind, for each layer: its FFN norm's weight, its router ([n_embd,
// n_expert]) and the router's selection bias (DeepSeek-V3's exp_probs_b), any of them
// nullptr: what lookahead applies to guess the layer's experts.
void llama_smoe_router(llama_smoe * s, int il, ggml_tensor * norm, ggml_tensor * router, ggml_tensor * probs_b);

// After the model's tensors are created: checks each expert tensor against the
// vault's layout and turns it into a view over the ring. Throws std::runtime_error.
void llama_smoe_bind(llama_smoe * s);

// The waves layer il's expert FFN runs in for a batch of n_tokens: enough that the
// batch's distinct experts fit the ring's free slots a wave at a time, plus one, so
// that the first wave computes what is resident while the rest is read (and a ring
// that shrinks mid-layer has a wave to spare: its next wave is smaller; a shrink the
// spare cannot take has the graph built again, see llama_smoe_rebuild). One when the
// ring holds the model; at most 16.
int llama_smoe_waves(llama_smoe * s, int il, int64_t n_tokens, int64_t n_expert_used);

// The n_ubatch a context of the model runs (llama.cpp's is n_ubatch, of n_batch): with a
// ring smaller than the model, n_batch, so that a prompt in one ubatch reads each
// streamed expert once instead of once per ubatch, and *raised is set: the context weighs
// its compute buffers (llama_smoe_ubatch_fits) and gives the raise up when they cannot be
// allocated. A ring that holds the model keeps n_ubatch, and so does a model whose memory
// grows with n_ubatch (memory_grows: a sliding-window KV cache, sized before the buffers
// can be weighed). SMOE_UBATCH=N asks for N (at most n_batch; *raised stays false: it is
// taken as llama.cpp takes -ub), SMOE_UBATCH=0 for llama.cpp's.
uint32_t llama_smoe_ubatch(llama_smoe * s, uint32_t n_batch, uint32_t n_ubatch, bool memory_grows, bool * raised);

// Whether a raised n_ubatch whose compute buffers take compute_bytes, against base_bytes at
// the n_ubatch asked for (llama.cpp's), may be kept: the difference at most a quarter of the
// ring's bytes (under memory pressure the elastic ring gives the activations that much, for
// the context's life). When false the context halves its n_ubatch and reserves again, down
// to the n_ubatch asked for, as it does when a size's buffers cannot be allocated.
bool llama_smoe_ubatch_fits(llama_smoe * s, uint32_t n_ubatch, uint32_t asked, size_t compute_bytes, size_t base_bytes);

// The graph nodes the waves may add to a graph of the model (0 for nullptr): what
// llama_context::graph_max_nodes adds to its budget.
uint32_t llama_smoe_graph_nodes(const llama_smoe * s);

// Lookahead (SMOE_LOOKAHEAD, decode only): a tensor guessing the experts of the next layers
// with experts after il ([width, n_tokens x layers] ids, each token's best first), from
// layer il's residual `ffn_inp` (the tensor the model's graph names "ffn_inp" for il, or
// nullptr) normalized as each of those layers' FFN norm does, or from `cur` (il's normalized
// FFN input) when there is none; for llama_smoe_claim's first wave. nullptr when lookahead
// is off, the ring holds the model, the batch is wide (a prompt: layer-ahead reads the next
// layers whole) or no later layer has a router.
ggml_tensor * llama_smoe_predict(llama_smoe * s, ggml_context * ctx, ggml_tensor * ffn_inp, ggml_tensor * cur, int il,
                                 int64_t n_expert_used, float rms_eps);

// Graph ops, run by one thread. claim: wave `wave` of `waves` of layer il; `second` is, for
// the first wave, llama_smoe_predict's guess (queued as speculation once the layer's resident
// experts are claimed; nullptr: none), and for a later wave the previous waves' sum (so it
// runs once they are computed and released). The first wave hands the batch's working set
// (`selected_experts`, [n_expert_used, n_tokens], I32) to smoe, less the experts a layer's
// device wave computes (the device tier's map, read on the host); each wave claims
// what it can hold (resident experts first) and returns their slot indices (same
// shape), -1 for pairs of the other waves, for ggml_mul_mat_id. release: returns
// `experts` unchanged (in place) and releases the wave's claims once it is computed.
ggml_tensor * llama_smoe_claim(llama_smoe * s, ggml_context * ctx, ggml_tensor * selected_experts, ggml_tensor * second, int il,
                               int wave, int waves);
ggml_tensor * llama_smoe_release(llama_smoe * s, ggml_context * ctx, ggml_tensor * experts, int il, int wave);

// True once a claim failed, or asked for the graph to be built again: graph
// computation must stop (the abort callback).
bool llama_smoe_failed(const llama_smoe * s);
// Before a ubatch's graph is built: a failure of the ubatch before (reported, and its
// decode refused) is over; its claims are released (once the GPU is past them) and
// this ubatch starts clean, so that a caller may try again (llama-server halves its
// batch). No-op when s is nullptr or nothing failed.
void llama_smoe_ubatch_begin(llama_smoe * s);
// True while a claim has asked for the graph to be built again (and nothing failed):
// the elastic ring shrank under the waves the graph was built with, so stopping it
// is not an error.
bool llama_smoe_rebuild_pending(const llama_smoe * s);
// After a graph computed or stopped: true when a claim asked for it to be built
// again (the ask is taken and every claim released): llama_context::process_ubatch
// then builds the ubatch's graph again, its waves sized from the ring now, and
// computes it again. False otherwise (nothing asked, or something failed). With
// can_recompute false (a model with recurrent state, which the stopped graph has
// already advanced for its first layers), an ask is a failure, with a message.
bool llama_smoe_rebuild(llama_smoe * s, bool can_recompute);

// Op offload (a CUDA build's big batches): of a context's backends, the first GPU is where
// a batch big enough for op offload computes its routed experts, each claimed expert copied
// from its ring slot (the ring registered with the GPU's driver when pinned: SMOE_PIN, the
// default with a GPU). Returns whether the context keeps op offload: as asked (op_offload),
// unless SMOE_OP_OFFLOAD=0. Says what it chose on stderr. Throws on failure.
bool llama_smoe_devices(llama_smoe * s, struct ggml_backend ** backends, size_t n, bool op_offload);

// A context is being freed (its backends still alive): claims held for its GPU are
// released once the GPU is done with them, and the glue forgets its backend.
void llama_smoe_context_free(llama_smoe * s, struct ggml_backend ** backends, size_t n);

// Tells a context's scheduler which weights are the ring's (never offloaded: their ops run
// where the ring is) and where a staged weight's experts are. No-op when s is nullptr.
void llama_smoe_sched(llama_smoe * s, struct ggml_backend_sched * sched);

// Whether layer il's expert matmuls in the graph being built run on the GPU: op offload
// kept (llama_smoe_devices), the batch's experts fit the ring's free slots at once, and
// the GPU takes a MUL_MAT_ID of weight w (a ring view) for this batch. Then the layer is
// one wave, its claim hands the matmuls expert ids, and its weights are the staged ones.
bool llama_smoe_on_device(llama_smoe * s, ggml_context * ctx, int il, ggml_tensor * cur, ggml_tensor * selected_experts,
                          ggml_tensor * w);

// The staged weight of ring view w: the model's layout, its experts copied from their slots.
ggml_tensor * llama_smoe_staged(llama_smoe * s, ggml_tensor * w);

// The last layer with routed experts.
int llama_smoe_last_layer(const llama_smoe * s);

// The device tier (SMOE_VRAM, llama-smoe-tier.cpp): whether layer il's graph being built
// gets a device wave, computed on the GPU from the experts the tier holds in VRAM: a tier
// on this context's GPU, a decode-sized batch (at most half the layer's experts), and
// `plain` experts (separate gate, up and down weights, no biases or scales).
bool llama_smoe_tier_wave(llama_smoe * s, int il, int64_t n_tokens, int64_t n_expert_used, bool plain);
// The device wave's ids, computed on the GPU: each pair's device slot from the layer's row
// of the tier's map, the slot of zeros for an expert the tier does not hold (a pair the
// host waves compute adds nothing there), so that the device wave computes in the GPU's
// split with the router.
ggml_tensor * llama_smoe_tier_ids(llama_smoe * s, ggml_context * ctx, ggml_tensor * selected_experts, int il);
// The device tier's weight for ring view w: [ne0, ne1, slots + 1] in VRAM.
ggml_tensor * llama_smoe_tier_weight(llama_smoe * s, ggml_tensor * w);

#if !defined(LLAMA_SMOE)
// Built without smoe (cmake -DLLAMA_SMOE=OFF, the default; src/CMakeLists.txt
// defines LLAMA_SMOE when it is on): llama-smoe.cpp and smoe.h are not part of
// the build, no vault is ever opened, and llama.cpp's calls into the glue are
// these no-ops, so the patched tree builds and runs as stock llama.cpp.
inline llama_smoe * llama_smoe_from_env(uint32_t, uint32_t, const char *) { return nullptr; }
inline void llama_smoe_free(llama_smoe *) {}
inline ggml_context * llama_smoe_tensor_ctx(llama_smoe *, const char *, bool) { return nullptr; }
inline void llama_smoe_router(llama_smoe *, int, ggml_tensor *, ggml_tensor *, ggml_tensor *) {}
inline void llama_smoe_bind(llama_smoe *) {}
inline ggml_tensor * llama_smoe_predict(llama_smoe *, ggml_context *, ggml_tensor *, ggml_tensor *, int, int64_t, float) {
    return nullptr;
}
inline int llama_smoe_waves(llama_smoe *, int, int64_t, int64_t) { return 1; }
inline uint32_t llama_smoe_graph_nodes(const llama_smoe *) { return 0; }
inline uint32_t llama_smoe_ubatch(llama_smoe *, uint32_t, uint32_t n_ubatch, bool, bool * raised) { *raised = false; return n_ubatch; }
inline bool llama_smoe_ubatch_fits(llama_smoe *, uint32_t, uint32_t, size_t, size_t) { return true; }
inline ggml_tensor * llama_smoe_claim(llama_smoe *, ggml_context *, ggml_tensor * selected_experts, ggml_tensor *, int, int, int) {
    return selected_experts;
}
inline ggml_tensor * llama_smoe_release(llama_smoe *, ggml_context *, ggml_tensor * experts, int, int) { return experts; }
inline bool llama_smoe_failed(const llama_smoe *) { return false; }
inline void llama_smoe_ubatch_begin(llama_smoe *) {}
inline bool llama_smoe_rebuild_pending(const llama_smoe *) { return false; }
inline bool llama_smoe_rebuild(llama_smoe *, bool) { return false; }
inline bool llama_smoe_devices(llama_smoe *, struct ggml_backend **, size_t, bool op_offload) { return op_offload; }
inline void llama_smoe_sched(llama_smoe *, struct ggml_backend_sched *) {}
inline void llama_smoe_context_free(llama_smoe *, struct ggml_backend **, size_t) {}
inline bool llama_smoe_on_device(llama_smoe *, ggml_context *, int, ggml_tensor *, ggml_tensor *, ggml_tensor *) { return false; }
inline ggml_tensor * llama_smoe_staged(llama_smoe *, ggml_tensor * w) { return w; }
inline int llama_smoe_last_layer(const llama_smoe *) { return -1; }
inline bool llama_smoe_tier_wave(llama_smoe *, int, int64_t, int64_t, bool) { return false; }
inline ggml_tensor * llama_smoe_tier_ids(llama_smoe *, ggml_context *, ggml_tensor * selected_experts, int) {
    return selected_experts;
}
inline ggml_tensor * llama_smoe_tier_weight(llama_smoe *, ggml_tensor * w) { return w; }
#endif
