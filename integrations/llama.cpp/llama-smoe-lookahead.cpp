// llama-smoe-lookahead.cpp: lookahead (see llama-smoe.h, llama_smoe_predict): in decode,
// while layer L computes, the next layers' experts guessed from L's state, queued as
// speculation; smoe settles each guess against the layer's real set.
#include "llama-smoe.h"
#include "llama-smoe-impl.h"

// Lookahead: queues as speculation the experts that `guess` (llama_smoe_predict's tensor:
// [width, n_tokens x layers] expert ids, each token's best first) names for the layers after
// l, one set a layer, each in rank order (every token's first choice, then its second...).
void smoe_queue_guess(layer_claims * l, const ggml_tensor * guess) {
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
