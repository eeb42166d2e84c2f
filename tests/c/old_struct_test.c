/*
 * A program built against an older header (tests/c/smoe_v1.h) meets this
 * library: with canary bytes after each of its structs, it checks that
 * smoe_config_init, smoe_open and smoe_get_stats never write past the size
 * that header declared, and that a struct smaller than v1 is refused with
 * nothing written.
 *
 * Usage: old_struct_test <experts.smoe>
 *
 * tests/library/c_api.rs builds it once per variant of smoe_v1.h (see its
 * knobs), with -Wall -Wextra -Wpedantic -Werror, and links it against
 * libsmoe.a.
 * Prints "ok" and exits 0 when every check passes.
 */

#include <stdio.h>
#include <string.h>

#include "smoe_v1.h"

/* The v1 sizes (docs/c-api.md) on this target: up to and including freq_path,
 * and up to and including direct_io. */
#define V1_CONFIG_SIZE ((sizeof(uint32_t) * 8 + sizeof(uint64_t) * 2 + sizeof(const char *) + 7) / 8 * 8)
#define V1_STATS_SIZE (8 + 15 * sizeof(uint64_t))

#define CANARY 0x5a

static int failures = 0;

#define CHECK(cond, ...)                                                          \
  do {                                                                            \
    if (!(cond)) {                                                                \
      fprintf(stderr, "old_struct_test.c:%d: check failed: %s: ", __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                               \
      fprintf(stderr, " (last error: \"%s\")\n", smoe_last_error());              \
      failures++;                                                                 \
    }                                                                             \
  } while (0)

/* Each struct of the old header, then bytes the library must never touch. */
struct guarded_config {
  smoe_config cfg;
  unsigned char canary[64];
};

struct guarded_stats {
  smoe_stats st;
  unsigned char canary[64];
};

/* How many of `n` bytes at `p` are not `value`, 0 when all are. */
static size_t changed(const void *p, size_t n, unsigned char value) {
  const unsigned char *bytes = p;
  size_t count = 0;
  for (size_t i = 0; i < n; i++) {
    count += bytes[i] != value;
  }
  return count;
}

static smoe_streamer *check_config(const char *vault) {
  struct guarded_config g;
  memset(&g, CANARY, sizeof g);
  smoe_streamer *s = NULL;

#if defined(OLD_UNSIZED_INIT)
  smoe_config_init(&g.cfg);
#else
  smoe_status init = smoe_config_init(&g.cfg);
#endif
  CHECK(changed(g.canary, sizeof g.canary, CANARY) == 0,
        "smoe_config_init wrote %zu byte(s) past the %zu-byte smoe_config",
        changed(g.canary, sizeof g.canary, CANARY), sizeof g.cfg);

  if (sizeof(smoe_config) < V1_CONFIG_SIZE) {
    /* Smaller than v1: refused, and nothing written at all. */
#if !defined(OLD_UNSIZED_INIT)
    CHECK(init == SMOE_ERR_ARGUMENT, "init of a %zu-byte config returned %s", sizeof g.cfg,
          smoe_status_str(init));
#endif
    CHECK(changed(&g.cfg, sizeof g.cfg, CANARY) == 0, "the refused config was written");
    g.cfg.struct_size = (uint32_t)sizeof(smoe_config);
    smoe_status open = smoe_open(vault, &g.cfg, &s);
    CHECK(open == SMOE_ERR_ARGUMENT && s == NULL, "smoe_open of a %zu-byte config returned %s",
          sizeof g.cfg, smoe_status_str(open));
    CHECK(changed(g.canary, sizeof g.canary, CANARY) == 0, "smoe_open wrote past smoe_config");
    /* Stats are checked on a streamer with the default config. */
    open = smoe_open(vault, NULL, &s);
    CHECK(open == SMOE_OK, "smoe_open(NULL config) returned %s", smoe_status_str(open));
    return s;
  }

#if !defined(OLD_UNSIZED_INIT)
  CHECK(init == SMOE_OK, "init returned %s", smoe_status_str(init));
#endif
  CHECK(g.cfg.struct_size == sizeof(smoe_config), "struct_size %u, sizeof %zu",
        (unsigned)g.cfg.struct_size, sizeof g.cfg);
  CHECK(g.cfg.prewarm == 1 && g.cfg.scout_bytes == UINT64_MAX && g.cfg.workers == 0,
        "not the defaults");
  g.cfg.ring_slots = 4;
  g.cfg.workers = 2;
  g.cfg.prewarm = 0;
#if !defined(OLD_CONFIG_WITHOUT_FREQ_PATH)
  g.cfg.freq_path = "";
#endif
  smoe_status open = smoe_open(vault, &g.cfg, &s);
  CHECK(open == SMOE_OK, "smoe_open returned %s", smoe_status_str(open));
  CHECK(changed(g.canary, sizeof g.canary, CANARY) == 0, "smoe_open wrote past smoe_config");
  return s;
}

static void check_stats(smoe_streamer *s) {
  struct guarded_stats g;
  memset(&g, CANARY, sizeof g);
  g.st.struct_size = (uint32_t)sizeof(smoe_stats);
  smoe_status got = smoe_get_stats(s, &g.st);
  CHECK(changed(g.canary, sizeof g.canary, CANARY) == 0,
        "smoe_get_stats wrote %zu byte(s) past the %zu-byte smoe_stats",
        changed(g.canary, sizeof g.canary, CANARY), sizeof g.st);
  if (sizeof(smoe_stats) < V1_STATS_SIZE) {
    CHECK(got == SMOE_ERR_ARGUMENT, "get_stats of a %zu-byte struct returned %s", sizeof g.st,
          smoe_status_str(got));
    CHECK(g.st.struct_size == sizeof(smoe_stats), "struct_size changed on error");
    CHECK(changed((const unsigned char *)&g.st + 8, sizeof g.st - 8, CANARY) == 0,
          "the refused stats were written");
    return;
  }
  CHECK(got == SMOE_OK, "smoe_get_stats returned %s", smoe_status_str(got));
  CHECK(g.st.struct_size == sizeof(smoe_stats), "struct_size %u, sizeof %zu",
        (unsigned)g.st.struct_size, sizeof g.st);
  CHECK(g.st.ring_slots > 0 && g.st.workers > 0 && g.st.slot_bytes % 16384 == 0,
        "ring_slots %llu workers %llu", (unsigned long long)g.st.ring_slots,
        (unsigned long long)g.st.workers);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s <experts.smoe>\n", argv[0]);
    return 2;
  }
  smoe_streamer *s = check_config(argv[1]);
  if (s != NULL) {
    check_stats(s);
    smoe_close(s);
  }
  if (failures != 0) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  puts("ok");
  return 0;
}
