// llama-smoe-impl.h: the glue's own types, shared by its sources (llama-smoe.cpp: opening,
// binding, claims in waves, the ubatch; llama-smoe-lookahead.cpp: guessing the next layers'
// experts in decode; llama-smoe-offload.cpp: a big batch's experts on the GPU). Not part of
// llama.cpp's interface: llama.cpp includes llama-smoe.h only.
#pragma once

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

namespace smoe_glue {

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

inline std::string smoe_error(const char * call, smoe_status st) {
    return std::string("smoe: ") + call + ": " + smoe_status_str(st) + ": " + smoe_last_error();
}

// An unsigned integer environment variable; `def` when unset or empty.
inline uint32_t env_u32(const char * name, uint32_t def, uint32_t max) {
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
    // device tier (llama-smoe-tier.cpp): the graph being built has a device wave for this
    // layer (its ops carry that into the run: wave_op::tier)
    bool tier_graph = false;
};

// What a wave op works on: its layer and which wave it is, and whether the batch's
// matmuls run on the GPU (one wave, the experts copied from their slots by the scheduler).
struct wave_op {
    layer_claims * l;
    int wave;
    bool dev = false;
    bool tier = false;  // a graph with the device tier's wave: look up, admit (llama-smoe-tier.cpp)
};

// An expert weight as the GPU's matmuls see it: the model's own layout ([ne0, ne1,
// n_expert], contiguous) over a mapping of zeros that holds nothing; the scheduler copies
// each expert a batch claimed from its ring slot (ggml_backend_sched_weights).
struct staged_weight {
    ggml_tensor * tensor = nullptr;
    int il = 0;
    uint64_t offset = 0;             // of the weight's slice in a slot
};

} // namespace smoe_glue

using namespace smoe_glue;

void tier_drop(llama_smoe * s);

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
    uint32_t lookahead = 0;
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
    // The device tier (SMOE_VRAM bytes of the GPU's memory; llama-smoe-tier.cpp): hot experts
    // kept in VRAM slots, computed there in decode. The rule (which expert, which slot, when
    // a slot may be overwritten) is the library's (smoe_tier); the pool and the copies are
    // here. An expert computed from the ring that the tier admits keeps its ring claim until
    // its copy into its device slot, issued when the next ubatch begins, is done (one ubatch
    // later).
    smoe_tier * tier = nullptr;
    uint32_t tier_slots = 0;          // K: device slots; the pool holds K + 1 (the last is zeros)
    uint64_t tier_expert_bytes = 0;   // one expert's bytes over its roles
    ggml_backend_dev_t tier_dev = nullptr;
    ggml_backend_t tier_gpu = nullptr;  // the backend of the context that uses the tier, one at a time
                                        // (nullptr once it is freed, until the next context on the device)
    bool tier_on = false;             // the newest context is that one
    ggml_context * tier_ctx = nullptr;
    ggml_backend_buffer_t tier_buf = nullptr;
    std::unordered_map<const ggml_tensor *, ggml_tensor *> tier_pool_of;  // ring view -> pool
    // per layer: its ring views, for the copies (each view's data is slot 0's slice)
    std::vector<std::vector<const ggml_tensor *>> tier_views;
    struct tier_copy {
        uint32_t device_slot;
        int il;
        smoe_slot claim;              // the ring slot copied from, held until the copy
        int32_t evicted_layer, evicted_expert;  // what the slot held (-1: nothing)
        uint64_t bytes = 0;           // copied (once issued)
    };
    std::vector<tier_copy> tier_pending;   // admitted by the graph in progress or the last one
    std::vector<tier_copy> tier_inflight;  // copies issued, on tier_copier's stream
    ggml_backend_t tier_copier = nullptr;  // the device's second backend: the copies' stream
    // the map: each layer's experts' device slots (K, the slot of zeros: not held), in VRAM
    // for the device wave's ids, and its host copy for the host's share; both change between
    // graphs only (tier_flush), so a graph reads one map
    ggml_tensor * tier_map = nullptr;
    std::vector<int32_t> tier_snap;
    uint32_t tier_width = 0;          // the map's row: the widest layer's experts
    uint64_t tier_device_uses = 0;    // uses the device wave computed (the map said held)
    std::vector<std::vector<std::unique_ptr<wave_op>>> tier_wave_ops;  // per layer, per wave: wave_ops' tier twins
    uint64_t tier_copy_ns = 0;        // time the copies took, between graphs
    // SMOE_PROFILE=1: where a one-token ubatch's time goes, layer by layer, on the host's
    // clock: from a layer's last host op to the next layer's first (the GPU's part: the
    // layer's rest, the next one's attention, router and device wave, the copies across),
    // and the host waves (claims, matmuls, release)
    bool profile = false;
    uint64_t pf_layers = 0, pf_gpu_ns = 0, pf_host_ns = 0, pf_gaps = 0;
    bool pf_open = false;  // a layer's host waves began and have not ended
    std::chrono::steady_clock::time_point pf_host_t0, pf_release_t1;
    int pf_last_il = -1;   // the layer whose host waves ended last (-1: none in this ubatch)
    // a one-token ubatch's layer il begins its host part (its first host op), and ends it
    void pf_begin(int il) {
        const auto t = std::chrono::steady_clock::now();
        if (il <= pf_last_il) {
            pf_last_il = -1;  // a new ubatch
        }
        if (pf_last_il >= 0 && il == pf_last_il + 1) {
            pf_gpu_ns += (uint64_t) std::chrono::duration_cast<std::chrono::nanoseconds>(t - pf_release_t1).count();
            pf_gaps++;
        }
        pf_host_t0 = t;
        pf_open = true;
    }
    void pf_end(int il) {
        pf_release_t1 = std::chrono::steady_clock::now();
        pf_host_ns += (uint64_t) std::chrono::duration_cast<std::chrono::nanoseconds>(pf_release_t1 - pf_host_t0).count();
        pf_last_il = il;
        pf_layers++;
        pf_open = false;
    }

    bool stopped() const { return failed || rebuild_pending; }

    ~llama_smoe() {
        tier_drop(this);
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

// The device tier (llama-smoe-tier.cpp). tier_make: the pool on `gpu` and the library's
// tier, from SMOE_VRAM (a message and no tier when it cannot be made); tier_lookups: a
// decode batch's experts looked up (counted for admission; the first claim, start_batch),
// and the layer's set left with those the map's host copy does not hold (false: a lookup
// failed, the graph stops);
// tier_admit: the experts a layer computed from the ring that earn a device slot, their
// claims kept for the copy (the release op of a tier graph), at most an eighth of the ring's
// slots at a time; tier_flush: between graphs, the copies issued one flush ago completed
// (their experts join the map) and the last graph's admissions copied on the copier's
// stream, which the next graph does not wait for (`all`: a graph built again, a context
// freed: those completed too); tier_budget: SMOE_VRAM in bytes (a share of dev's free memory), checked (0: no tier);
// tier_drop: everything, the claims released; tier_report: the statistics line.
uint64_t tier_budget(ggml_backend_dev_t dev);
void tier_make(llama_smoe * s, ggml_backend_t gpu);
bool tier_lookups(layer_claims * l);
void tier_admit(layer_claims * l);
void tier_flush(llama_smoe * s, bool all);
void tier_drop(llama_smoe * s);
void tier_report(const llama_smoe * s);

// "blk.N.ffn_{gate,up,down,gate_up}_exps.weight" -> (N, role); false for any other name.
// (Here, below every source of the glue that reads a name: one home, and no source calling
// back into another that calls it.)
inline bool parse_expert_name(const char * name, int * layer, std::string * role) {
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

// parse_expert_name of a tensor the glue holds (every one passed it to get there): a
// failure is a bug, thrown as an error naming the tensor.
inline void expert_name(const char * name, int * layer, std::string * role) {
    if (!parse_expert_name(name, layer, role)) {
        throw std::runtime_error(std::string("smoe: ") + name + " is not an expert weight (blk.N.ffn_ROLE_exps.weight)");
    }
}


// Lookahead (llama-smoe-lookahead.cpp): queues the experts `guess` names for the layers
// after l as speculation.
void smoe_queue_guess(layer_claims * l, const ggml_tensor * guess);

