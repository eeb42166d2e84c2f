/*
 * smoe.hpp: a small C++17 RAII layer over the C API in smoe.h.
 *
 * Hand-written (smoe.h is generated); header-only, no exceptions swallowed.
 *
 * - smoe::streamer owns one smoe_streamer: move-only, smoe_close in its
 *   destructor.
 * - smoe::claim owns one claimed slot: move-only, smoe_release in its
 *   destructor (or earlier with release()).
 * - Every error status becomes a smoe::error (a std::runtime_error) carrying
 *   the status and smoe_last_error()'s message, copied at once because that
 *   message is only valid until the next smoe_ call on the thread. The one
 *   status that is not an error, SMOE_PENDING, is answered by try_claim as an
 *   empty std::optional; claim_wait throws it (status SMOE_PENDING) when the
 *   timeout passes first.
 *
 * Lifetimes follow the C API: a claim must be destroyed or released before
 * its streamer; every method of one streamer may be called from any thread,
 * except destruction and move-assignment, which must happen after all other
 * calls on it have returned (smoe_close's rule).
 */

#ifndef SMOE_HPP
#define SMOE_HPP

#include <chrono>
#include <cstdint>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "smoe.h"

namespace smoe {

/** An error status from the library, with its message. */
class error : public std::runtime_error {
 public:
  /** `what()` is "<call>: <STATUS_NAME>: <message>". */
  error(smoe_status status, const std::string &call, const std::string &message)
      : std::runtime_error(call + ": " + smoe_status_str(status) +
                           (message.empty() ? std::string() : ": " + message)),
        status_(status),
        message_(message) {}

  /** The status the call returned (never SMOE_OK). */
  smoe_status status() const noexcept { return status_; }
  /** The library's message for it (smoe_last_error() right after the call). */
  const std::string &message() const noexcept { return message_; }

 private:
  smoe_status status_;
  std::string message_;
};

namespace detail {

/** Throws smoe::error for `status` unless it is SMOE_OK. */
inline void check(smoe_status status, const char *call) {
  if (status != SMOE_OK) {
    // Copy the message before any other smoe_ call (smoe_status_str is one).
    std::string message = smoe_last_error();
    throw error(status, call, message);
  }
}

}  // namespace detail

/** Where an expert lives in experts.smoe (smoe_expert_info). */
struct expert_info {
  std::uint64_t size;         ///< payload bytes
  std::uint64_t padded_size;  ///< bytes a read covers
  std::uint64_t offset;       ///< byte offset in experts.smoe
};

/** The ring (smoe_ring_region): slot i starts at base + i * slot_bytes. */
struct ring_region {
  void *base;
  std::uint64_t bytes;
  std::uint64_t slot_bytes;
};

/** smoe_config with every default (smoe_config_init). */
inline smoe_config default_config() noexcept {
  smoe_config cfg;
  smoe_config_init(&cfg);
  return cfg;
}

class streamer;

/**
 * One claimed expert: its bytes stay valid and unchanged until the claim is
 * released (by release() or the destructor). Move-only.
 */
class claim {
 public:
  claim() noexcept = default;
  claim(const claim &) = delete;
  claim &operator=(const claim &) = delete;
  claim(claim &&other) noexcept
      : owner_(std::exchange(other.owner_, nullptr)), slot_(other.slot_) {}
  claim &operator=(claim &&other) noexcept {
    if (this != &other) {
      reset();
      owner_ = std::exchange(other.owner_, nullptr);
      slot_ = other.slot_;
    }
    return *this;
  }
  /** Releases the claim if still held; an error here is ignored (a
   *  destructor cannot throw): call release() to see it. */
  ~claim() { reset(); }

  /** True while the claim is held. */
  explicit operator bool() const noexcept { return owner_ != nullptr; }

  const std::uint8_t *data() const noexcept { return slot_.data; }
  std::uint64_t size() const noexcept { return slot_.size; }
  const std::uint8_t *begin() const noexcept { return slot_.data; }
  const std::uint8_t *end() const noexcept { return slot_.data + slot_.size; }
  std::uint32_t layer() const noexcept { return slot_.layer; }
  std::uint32_t expert() const noexcept { return slot_.expert; }
  std::uint32_t slot_index() const noexcept { return slot_.slot_index; }
  /** No demand read was needed (retained, speculated or pre-warmed). */
  bool hit() const noexcept { return slot_.hit; }
  /** The C description, e.g. for a GPU host or for smoe_release itself. */
  const smoe_slot &raw() const noexcept { return slot_; }

  /** Releases now; throws smoe::error on failure. No-op when not held. */
  inline void release();

 private:
  friend class streamer;
  claim(smoe_streamer *owner, const smoe_slot &slot) noexcept
      : owner_(owner), slot_(slot) {}

  void reset() noexcept {
    if (owner_ != nullptr) {
      (void)smoe_release(std::exchange(owner_, nullptr), &slot_);
    }
  }

  smoe_streamer *owner_ = nullptr;
  smoe_slot slot_{};
};

inline void claim::release() {
  if (owner_ != nullptr) {
    detail::check(smoe_release(std::exchange(owner_, nullptr), &slot_),
                  "smoe_release");
  }
}

/** An open vault and its ring. Move-only; closes in the destructor. */
class streamer {
 public:
  /** smoe_open(path, &cfg): throws smoe::error on failure. */
  explicit streamer(const std::string &vault_path,
                    const smoe_config &cfg = default_config()) {
    smoe_streamer *handle = nullptr;
    detail::check(smoe_open(vault_path.c_str(), &cfg, &handle), "smoe_open");
    handle_ = handle;
  }
  streamer(const streamer &) = delete;
  streamer &operator=(const streamer &) = delete;
  streamer(streamer &&other) noexcept
      : handle_(std::exchange(other.handle_, nullptr)) {}
  streamer &operator=(streamer &&other) noexcept {
    if (this != &other) {
      smoe_close(handle_);
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  ~streamer() { smoe_close(handle_); }

  /** The C handle (NULL after a move), e.g. to call smoe.h directly. */
  smoe_streamer *get() const noexcept { return handle_; }

  /** smoe_prefetch: demand, or speculative when `speculative`. */
  void prefetch(std::uint32_t layer, std::uint32_t expert,
                bool speculative = false) {
    detail::check(smoe_prefetch(handle_, layer, expert, speculative),
                  "smoe_prefetch");
  }

  /** smoe_claim: the claim, or an empty optional for SMOE_PENDING (its read
   *  is queued); throws smoe::error on any error. */
  std::optional<claim> try_claim(std::uint32_t layer, std::uint32_t expert) {
    smoe_slot slot{};
    smoe_status status = smoe_claim(handle_, layer, expert, &slot);
    if (status == SMOE_PENDING) {
      return std::nullopt;
    }
    detail::check(status, "smoe_claim");
    return claim(handle_, slot);
  }

  /** smoe_claim_wait: throws smoe::error on any error, and with status
   *  SMOE_PENDING when `timeout` passes first. */
  claim claim_wait(std::uint32_t layer, std::uint32_t expert,
                   std::chrono::nanoseconds timeout = std::chrono::seconds(10)) {
    smoe_slot slot{};
    const std::uint64_t timeout_ns =
        timeout.count() < 0 ? 0 : static_cast<std::uint64_t>(timeout.count());
    smoe_status status = smoe_claim_wait(handle_, layer, expert, timeout_ns, &slot);
    if (status == SMOE_PENDING) {
      throw error(status, "smoe_claim_wait",
                  "layer " + std::to_string(layer) + " expert " +
                      std::to_string(expert) + ": not resident after " +
                      std::to_string(timeout_ns) + " ns");
    }
    detail::check(status, "smoe_claim_wait");
    return claim(handle_, slot);
  }

  /** smoe_prefetch_set: queues a layer's working set, in order; returns how
   *  many members are now resident or in flight (fewer than the set when
   *  the ring could not take the rest: SMOE_ERR_RING_FULL is not thrown,
   *  since claim_any queues the rest as slots free up); throws smoe::error
   *  on any other error. Any contiguous container of std::uint32_t. */
  template <class Set>
  std::uint32_t prefetch_set(std::uint32_t layer, const Set &experts,
                             bool speculative = false) {
    std::uint32_t queued = 0;
    const smoe_status status =
        smoe_prefetch_set(handle_, layer, std::data(experts), set_size(experts),
                          speculative, &queued);
    if (status != SMOE_ERR_RING_FULL) {
      detail::check(status, "smoe_prefetch_set");
    }
    return queued;
  }

  /** smoe_claim_any: a resident member first, in the set's order, else the
   *  first whose read lands within `timeout`; an empty optional for
   *  SMOE_PENDING (the timeout passed); throws smoe::error on any error,
   *  SMOE_ERR_RING_FULL included (every slot is held: release first). A
   *  member's failed read throws with that member named in the message.
   *  claim.expert() says which member it is. */
  template <class Set>
  std::optional<claim> claim_any(std::uint32_t layer, const Set &experts,
                                 std::chrono::nanoseconds timeout = std::chrono::seconds(10)) {
    smoe_slot slot{};
    const std::uint64_t timeout_ns =
        timeout.count() < 0 ? 0 : static_cast<std::uint64_t>(timeout.count());
    const smoe_status status = smoe_claim_any(handle_, layer, std::data(experts),
                                              set_size(experts), timeout_ns, &slot);
    if (status == SMOE_PENDING) {
      return std::nullopt;
    }
    detail::check(status, "smoe_claim_any");
    return claim(handle_, slot);
  }

  /** smoe_release of a raw smoe_slot (for hosts that keep C structs);
   *  throws smoe::error, e.g. SMOE_ERR_STALE for a ticket not held. */
  void release(const smoe_slot &slot) {
    detail::check(smoe_release(handle_, &slot), "smoe_release");
  }

  /** smoe_get_stats with struct_size set. */
  smoe_stats stats() const {
    smoe_stats out{};
    out.struct_size = sizeof out;
    detail::check(smoe_get_stats(handle_, &out), "smoe_get_stats");
    return out;
  }

  expert_info info(std::uint32_t layer, std::uint32_t expert) const {
    expert_info out{};
    detail::check(smoe_expert_info(handle_, layer, expert, &out.size,
                                   &out.padded_size, &out.offset),
                  "smoe_expert_info");
    return out;
  }

  ring_region region() const {
    ring_region out{};
    detail::check(smoe_ring_region(handle_, &out.base, &out.bytes, &out.slot_bytes),
                  "smoe_ring_region");
    return out;
  }

  void prewarm_pause(bool busy) noexcept { smoe_prewarm_pause(handle_, busy); }

  void flush_stats() { detail::check(smoe_flush_stats(handle_), "smoe_flush_stats"); }

  /** The vault's metadata (JSON; "" if none). */
  std::string metadata() const { return smoe_vault_metadata(handle_); }

  /** Warnings recorded at open, one per line ("" if none). */
  std::string warnings() const { return smoe_warnings(handle_); }

 private:
  template <class Set>
  static std::uint32_t set_size(const Set &experts) {
    if (std::size(experts) > UINT32_MAX) {
      throw error(SMOE_ERR_ARGUMENT, "smoe_claim_any", "the set holds more than 2^32 - 1 experts");
    }
    return static_cast<std::uint32_t>(std::size(experts));
  }

  smoe_streamer *handle_ = nullptr;
};

}  // namespace smoe

#endif /* SMOE_HPP */
