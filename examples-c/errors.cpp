// errors.cpp: bad input never crashes a host; every error status arrives as
// a smoe::error carrying the status and the library's message.
//
// Usage: errors VAULT_DIR N_EXPERTS
//
// Each case does something wrong on purpose, catches the exception, prints
// it and checks its status: a double release (SMOE_ERR_STALE), an
// out-of-range expert (SMOE_ERR_NOT_FOUND), a dense layer (NOT_FOUND), a
// missing vault (SMOE_ERR_IO), a bad config (SMOE_ERR_ARGUMENT), a
// moved-from streamer, i.e. a NULL handle (SMOE_ERR_ARGUMENT), and NULLs
// passed straight to the C API. Exit status 0 only if each case failed
// exactly as expected and nothing crashed.

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>

#include "smoe.hpp"

namespace {

int failures = 0;

// Runs `body`, which must throw smoe::error with status `want`.
void expect_error(const char *what, smoe_status want, const std::function<void()> &body) {
  try {
    body();
    std::printf("FAIL %-34s no error, want %s\n", what, smoe_status_str(want));
    failures++;
  } catch (const smoe::error &e) {
    const bool ok = e.status() == want && !e.message().empty();
    std::printf("%s %-34s %s\n", ok ? "ok  " : "FAIL", what, e.what());
    if (!ok) failures++;
  }
}

smoe_config small_config() {
  smoe_config cfg = smoe::default_config();
  cfg.ring_slots = 8;
  cfg.workers = 2;
  cfg.prewarm = 0;
  cfg.freq_path = "";
  return cfg;
}

}  // namespace

int main(int argc, char **argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s VAULT_DIR N_EXPERTS\n", argv[0]);
    return 2;
  }
  const std::string vault = argv[1];
  const auto n_experts = static_cast<std::uint32_t>(std::strtoul(argv[2], nullptr, 10));
  try {
    smoe::streamer s(vault, small_config());

    expect_error("release twice", SMOE_ERR_STALE, [&] {
      smoe::claim c = s.claim_wait(1, 0);
      const smoe_slot copy = c.raw();  // a host keeping the C struct around
      c.release();                     // the one correct release
      s.release(copy);                 // the second one: its ticket is not held
    });
    expect_error("out-of-range expert (claim)", SMOE_ERR_NOT_FOUND,
                 [&] { (void)s.claim_wait(1, n_experts); });
    expect_error("out-of-range expert (prefetch)", SMOE_ERR_NOT_FOUND,
                 [&] { s.prefetch(1, n_experts + 1000); });
    expect_error("out-of-range layer (info)", SMOE_ERR_NOT_FOUND,
                 [&] { (void)s.info(1u << 20, 0); });
    expect_error("dense layer 0 (try_claim)", SMOE_ERR_NOT_FOUND,
                 [&] { (void)s.try_claim(0, 0); });
    expect_error("missing vault", SMOE_ERR_IO,
                 [&] { smoe::streamer missing(vault + "/no-such-dir", small_config()); });
    expect_error("workers = 1000", SMOE_ERR_ARGUMENT, [&] {
      smoe_config cfg = small_config();
      cfg.workers = 1000;
      smoe::streamer bad(vault, cfg);
    });
    expect_error("struct_size = 4", SMOE_ERR_ARGUMENT, [&] {
      smoe_config cfg = small_config();
      cfg.struct_size = 4;
      smoe::streamer bad(vault, cfg);
    });
    expect_error("moved-from streamer (NULL)", SMOE_ERR_ARGUMENT, [&] {
      smoe::streamer other(vault, small_config());
      smoe::streamer taken = std::move(other);
      other.prefetch(1, 0);  // NOLINT(bugprone-use-after-move): on purpose
    });

    // The C API directly: NULLs are errors with a message, never a crash.
    smoe_slot slot{};
    const smoe_status null_claim = smoe_claim(nullptr, 1, 0, &slot);
    const std::string null_claim_message = smoe_last_error();
    const smoe_status null_release = smoe_release(s.get(), nullptr);
    const std::string null_release_message = smoe_last_error();
    const smoe_status null_stats = smoe_get_stats(s.get(), nullptr);
    smoe_close(nullptr);  // a no-op
    const bool c_ok = null_claim == SMOE_ERR_ARGUMENT && null_release == SMOE_ERR_ARGUMENT &&
                      null_stats == SMOE_ERR_ARGUMENT && !null_claim_message.empty() &&
                      !null_release_message.empty();
    std::printf("%s %-34s smoe_claim(NULL): %s \"%s\"; smoe_release(s, NULL): %s \"%s\"\n",
                c_ok ? "ok  " : "FAIL", "NULL through the C API", smoe_status_str(null_claim),
                null_claim_message.c_str(), smoe_status_str(null_release),
                null_release_message.c_str());
    if (!c_ok) failures++;

    // After all that, the streamer still works.
    smoe::claim c = s.claim_wait(1, 1);
    std::printf("ok   %-34s layer %u expert %u, %llu bytes\n", "still streaming", c.layer(),
                c.expert(), static_cast<unsigned long long>(c.size()));
  } catch (const smoe::error &e) {
    std::printf("FAIL unexpected error: %s\n", e.what());
    failures++;
  }
  std::printf("errors: %s\n", failures == 0 ? "every bad input was reported, none crashed"
                                            : "some cases did not fail as expected");
  return failures == 0 ? 0 : 1;
}
