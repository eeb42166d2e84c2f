// engine.cpp: a llama-style decode loop over smoe, in C++17 with smoe.hpp.
//
// Usage: engine VAULT_DIR N_LAYERS N_EXPERTS [TOKENS]
//
// Per token and per MoE layer it
//   1. hands the routed top-k experts over as one demand working set
//      (smoe::streamer::prefetch_set; a deterministic pseudo-random router:
//      each of the previous token's experts is kept with probability 1/2,
//      the rest drawn uniformly),
//   2. hands the next SPECULATE ranks over as a speculative set,
//   3. claims the top-k whichever is ready first (smoe::streamer::claim_any,
//      resident ones first) and computes each as it comes:
//   4. "computes": a 64-bit checksum of every byte of each expert, compared
//      with the checksum of the same bytes read straight from experts.smoe
//      (std::ifstream at the expert's offset; computed once per expert and
//      cached), and
//   5. releases the claims (RAII: the smoe::claim destructors).
// While layer L computes, a std::thread issues the prefetches of layer L+1
// (of the next token's first layer at the last layer).
//
// Dense layers (no experts in the vault) are found with smoe_expert_info
// (SMOE_ERR_NOT_FOUND) and skipped. Prints tokens/s, coverage (hits/claims)
// and bytes read. Exit status 0 only if every checksum matched.

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "smoe.hpp"

namespace {

constexpr std::uint32_t TOP_K = 4;
constexpr std::uint32_t SPECULATE = 2;

// splitmix64: the router's deterministic random source.
std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// The "computation" over an expert's bytes: a 64-bit multiply-xor checksum of
// its 8-byte words (and tail), order-sensitive, so any wrong byte shows.
std::uint64_t checksum(const std::uint8_t *data, std::uint64_t size) {
  std::uint64_t h = 0x243f6a8885a308d3ULL ^ size;
  std::uint64_t i = 0;
  for (; i + 8 <= size; i += 8) {
    std::uint64_t word;
    std::memcpy(&word, data + i, sizeof word);
    h = (h ^ word) * 0x100000001b3ULL;
    h ^= h >> 29;
  }
  for (; i < size; i++) {
    h = (h ^ data[i]) * 0x100000001b3ULL;
  }
  return h;
}

// routes[token][layer]: TOP_K active experts, then SPECULATE deeper ranks;
// empty for a dense layer. Computed up front so the prefetch thread and the
// compute thread share it read-only.
using Routes = std::vector<std::vector<std::vector<std::uint32_t>>>;

Routes make_routes(std::uint32_t tokens, const std::vector<bool> &moe,
                   std::uint32_t n_experts) {
  const std::uint32_t per_layer = std::min(TOP_K + SPECULATE, n_experts);
  Routes routes(tokens, std::vector<std::vector<std::uint32_t>>(moe.size()));
  std::uint64_t state = 7;
  for (std::uint32_t t = 0; t < tokens; t++) {
    for (std::uint32_t layer = 0; layer < moe.size(); layer++) {
      if (!moe[layer]) {
        continue;
      }
      std::vector<std::uint32_t> &chosen = routes[t][layer];
      auto taken = [&](std::uint32_t e) {
        for (std::uint32_t c : chosen) {
          if (c == e) return true;
        }
        return false;
      };
      if (t > 0) {
        for (std::uint32_t e : routes[t - 1][layer]) {
          if (chosen.size() < per_layer && ((state = mix(state)) & 1) != 0 && !taken(e)) {
            chosen.push_back(e);
          }
        }
      }
      while (chosen.size() < per_layer) {
        const auto e = static_cast<std::uint32_t>((state = mix(state)) % n_experts);
        if (!taken(e)) chosen.push_back(e);
      }
    }
  }
  return routes;
}

// Joins a thread when leaving its scope, also when an exception unwinds it
// (destroying a joinable std::thread would call std::terminate).
class Joiner {
 public:
  explicit Joiner(std::thread &thread) : thread_(thread) {}
  Joiner(const Joiner &) = delete;
  Joiner &operator=(const Joiner &) = delete;
  ~Joiner() {
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::thread &thread_;
};

// The active ranks as a demand set, then the deeper ones as a speculative
// set (which never evicts a demand load not yet claimed).
void prefetch_layer(smoe::streamer &s, const std::vector<std::uint32_t> &route,
                    std::uint32_t layer) {
  const std::size_t active = std::min<std::size_t>(TOP_K, route.size());
  const std::vector<std::uint32_t> demand(route.begin(), route.begin() + active);
  const std::vector<std::uint32_t> deeper(route.begin() + active, route.end());
  s.prefetch_set(layer, demand);
  s.prefetch_set(layer, deeper, /*speculative=*/true);
}

// The expected checksums, from the vault file itself (not through smoe's
// ring): read once per expert, at the offset smoe_expert_info reports.
class Expectations {
 public:
  explicit Expectations(const std::string &file) : file_(file, std::ios::binary) {
    if (!file_) throw std::runtime_error("cannot open " + file);
  }
  std::uint64_t get(const smoe::streamer &s, std::uint32_t layer, std::uint32_t expert) {
    const std::uint64_t key = (std::uint64_t{layer} << 32) | expert;
    auto found = cache_.find(key);
    if (found != cache_.end()) return found->second;
    const smoe::expert_info info = s.info(layer, expert);
    std::vector<std::uint8_t> bytes(info.size);
    file_.seekg(static_cast<std::streamoff>(info.offset));
    file_.read(reinterpret_cast<char *>(bytes.data()),
               static_cast<std::streamsize>(bytes.size()));
    if (!file_) throw std::runtime_error("short read of the vault file");
    const std::uint64_t sum = checksum(bytes.data(), bytes.size());
    cache_.emplace(key, sum);
    return sum;
  }

 private:
  std::ifstream file_;
  std::unordered_map<std::uint64_t, std::uint64_t> cache_;
};

int run(const std::string &vault, std::uint32_t n_layers, std::uint32_t n_experts,
        std::uint32_t tokens) {
  smoe_config cfg = smoe::default_config();
  cfg.ring_slots = 64;  // smaller than the working set: evictions happen
  cfg.workers = 4;
  cfg.prewarm = 0;
  cfg.freq_path = "";
  smoe::streamer s(vault, cfg);

  std::vector<bool> moe(n_layers);
  std::vector<std::uint32_t> moe_layers;
  for (std::uint32_t layer = 0; layer < n_layers; layer++) {
    try {
      (void)s.info(layer, 0);
      moe[layer] = true;
      moe_layers.push_back(layer);
    } catch (const smoe::error &e) {
      if (e.status() != SMOE_ERR_NOT_FOUND) throw;
    }
  }
  if (moe_layers.empty()) throw std::runtime_error("the vault has no MoE layer");
  const Routes routes = make_routes(tokens, moe, n_experts);
  Expectations expected(vault + "/experts.smoe");

  std::uint64_t checked = 0;
  std::uint64_t mismatches = 0;
  const auto start = std::chrono::steady_clock::now();
  prefetch_layer(s, routes[0][moe_layers[0]], moe_layers[0]);
  for (std::uint32_t t = 0; t < tokens; t++) {
    for (std::size_t i = 0; i < moe_layers.size(); i++) {
      const std::uint32_t layer = moe_layers[i];
      const std::vector<std::uint32_t> &route = routes[t][layer];

      // Look ahead: the next layer's (or next token's first layer's)
      // prefetches go out from another thread while this layer computes.
      std::exception_ptr ahead_error;
      std::thread ahead;
      Joiner join_ahead(ahead);
      const bool last = i + 1 == moe_layers.size();
      if (!last || t + 1 < tokens) {
        const std::uint32_t next_layer = last ? moe_layers[0] : moe_layers[i + 1];
        const std::uint32_t next_token = last ? t + 1 : t;
        ahead = std::thread([&s, &routes, &ahead_error, next_layer, next_token] {
          try {
            prefetch_layer(s, routes[next_token][next_layer], next_layer);
          } catch (...) {
            ahead_error = std::current_exception();
          }
        });
      }

      // (1)-(2): no-ops for what the look-ahead already queued.
      prefetch_layer(s, route, layer);
      {
        // (3) claim the active experts, whichever is ready first; (4) compute
        // each as it comes; (5) its destructor releases it.
        std::vector<std::uint32_t> left(route.begin(),
                                        route.begin() + std::min<std::size_t>(TOP_K, route.size()));
        while (!left.empty()) {
          std::optional<smoe::claim> claimed = s.claim_any(layer, left);
          if (!claimed) throw std::runtime_error("no expert of the set arrived in 10 s");
          const smoe::claim &c = *claimed;
          left.erase(std::remove(left.begin(), left.end(), c.expert()), left.end());
          const std::uint64_t got = checksum(c.data(), c.size());
          const std::uint64_t want = expected.get(s, c.layer(), c.expert());
          checked++;
          if (got != want) {
            mismatches++;
            std::fprintf(stderr, "engine: token %u layer %u expert %u: checksum %016" PRIx64
                         ", file says %016" PRIx64 "\n", t, c.layer(), c.expert(), got, want);
          }
        }
      }
      if (ahead.joinable()) ahead.join();
      if (ahead_error) std::rethrow_exception(ahead_error);  // e.g. RING_FULL
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  const smoe_stats st = s.stats();
  std::printf("engine: %u tokens x %zu MoE layers x top-%u (+%u speculative) through "
              "%" PRIu64 " slots x %" PRIu64 " bytes\n",
              tokens, moe_layers.size(), TOP_K, SPECULATE, st.ring_slots, st.slot_bytes);
  std::printf("speed: %.1f tokens/s (%.3f s)\n", tokens / seconds, seconds);
  std::printf("coverage: %.1f%% of claims were hits (%" PRIu64 " of %" PRIu64 ")\n",
              st.claims ? 100.0 * static_cast<double>(st.hits) / static_cast<double>(st.claims) : 0.0,
              st.hits, st.claims);
  std::printf("read: %" PRIu64 " bytes (%" PRIu64 " demand, %" PRIu64
              " speculative reads; %" PRIu64 " evictions)\n",
              st.bytes_read, st.reads_demand, st.reads_speculative, st.evictions);
  std::printf("checked: %" PRIu64 " expert computations against the file, %" PRIu64
              " mismatches\n", checked, mismatches);
  return mismatches == 0 && checked > 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char **argv) {
  if (argc < 4 || argc > 5) {
    std::fprintf(stderr, "usage: %s VAULT_DIR N_LAYERS N_EXPERTS [TOKENS]\n", argv[0]);
    return 2;
  }
  const auto layers = static_cast<std::uint32_t>(std::strtoul(argv[2], nullptr, 10));
  const auto experts = static_cast<std::uint32_t>(std::strtoul(argv[3], nullptr, 10));
  const auto tokens =
      argc == 5 ? static_cast<std::uint32_t>(std::strtoul(argv[4], nullptr, 10)) : 32u;
  if (layers == 0 || experts == 0 || tokens == 0) {
    std::fprintf(stderr, "engine: N_LAYERS, N_EXPERTS and TOKENS must be positive\n");
    return 2;
  }
  try {
    return run(argv[1], layers, experts, tokens);
  } catch (const smoe::error &e) {
    std::fprintf(stderr, "engine: %s (status %d)\n", e.what(), static_cast<int>(e.status()));
  } catch (const std::exception &e) {
    std::fprintf(stderr, "engine: %s\n", e.what());
  }
  return 1;
}
