/*
 * The C API (docs/c-api.md) exercised from C, the way a host uses it.
 *
 * Usage: api_test <experts.smoe> <n_layers> <n_experts> <dense_layer>
 *
 * tests/library/c_api.rs writes a synthetic vault, compiles this file as
 * C11 with -Wall -Wextra -Wpedantic -Werror, links it against libsmoe.a and
 * runs it.
 * Expected payload bytes are read straight from the vault file at the offset
 * smoe_expert_info reports, so this program needs no knowledge of the
 * synthetic generator. Every failed check prints its line and the library's
 * last error; the exit status is the number of failures (capped), 0 = pass.
 */

#define _POSIX_C_SOURCE 200809L /* nanosleep */

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "smoe.h"

static int failures = 0;

/* The v1 size of smoe_config (docs/c-api.md): up to and including freq_path,
 * padded to the struct's alignment. This header's struct is larger. */
#define V1_CONFIG_SIZE ((offsetof(smoe_config, freq_path) + sizeof(const char *) + 7) / 8 * 8)

#define CHECK(cond, ...)                                                   \
  do {                                                                     \
    if (!(cond)) {                                                         \
      fprintf(stderr, "api_test.c:%d: check failed: %s: ", __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                        \
      fprintf(stderr, " (last error: \"%s\")\n", smoe_last_error());       \
      failures++;                                                          \
    }                                                                      \
  } while (0)

/* A status check: `call` must return `want`. */
#define EXPECT(call, want)                                                 \
  do {                                                                     \
    smoe_status got_ = (call);                                             \
    CHECK(got_ == (want), "%s returned %s, want %s", #call,                \
          smoe_status_str(got_), smoe_status_str(want));                   \
  } while (0)

/* `call` must fail with SMOE_ERR_ARGUMENT naming `param` ("<param> is NULL"). */
#define EXPECT_NULL_ARG(call, param)                                       \
  do {                                                                     \
    EXPECT(call, SMOE_ERR_ARGUMENT);                                       \
    CHECK(strcmp(smoe_last_error(), param " is NULL") == 0,                \
          "%s: last error does not name %s", #call, param);                \
  } while (0)

#define FATAL(...)                                                         \
  do {                                                                     \
    fprintf(stderr, "api_test.c:%d: fatal: ", __LINE__);                   \
    fprintf(stderr, __VA_ARGS__);                                          \
    fprintf(stderr, " (last error: \"%s\")\n", smoe_last_error());         \
    exit(100);                                                             \
  } while (0)

static const char *vault_file;
static uint32_t n_layers, n_experts, dense_layer;

/* An expert layer (not the dense one). */
static uint32_t expert_layer(uint32_t i) {
  uint32_t layer = i % n_layers;
  return layer == dense_layer ? (layer + 1) % n_layers : layer;
}

/* Whether `slot` holds exactly the bytes the vault file has for its expert. */
static int payload_matches(smoe_streamer *s, const smoe_slot *slot) {
  uint64_t size = 0, padded = 0, offset = 0;
  if (smoe_expert_info(s, slot->layer, slot->expert, &size, &padded, &offset) != SMOE_OK) {
    return 0;
  }
  if (size != slot->size || padded < size) {
    fprintf(stderr, "size %llu, slot says %llu, padded %llu\n", (unsigned long long)size,
            (unsigned long long)slot->size, (unsigned long long)padded);
    return 0;
  }
  FILE *f = fopen(vault_file, "rb");
  if (f == NULL) {
    return 0;
  }
  unsigned char *expected = malloc((size_t)size);
  int ok = expected != NULL && fseek(f, (long)offset, SEEK_SET) == 0 &&
           fread(expected, 1, (size_t)size, f) == (size_t)size &&
           memcmp(expected, slot->data, (size_t)size) == 0;
  free(expected);
  fclose(f);
  return ok;
}

static smoe_stats get_stats(smoe_streamer *s) {
  smoe_stats st;
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  EXPECT(smoe_get_stats(s, &st), SMOE_OK);
  return st;
}

static void test_config_init(void) {
  smoe_config cfg;
  memset(&cfg, 0xa5, sizeof cfg);
  EXPECT(smoe_config_init(&cfg), SMOE_OK);
  CHECK(cfg.struct_size == sizeof(smoe_config), "struct_size %u", cfg.struct_size);
  CHECK(cfg.ring_slots == 0 && cfg.slot_mb == 0 && cfg.workers == 0, "sizes");
  CHECK(cfg.direct_io == 0, "direct_io %u", cfg.direct_io);
  CHECK(cfg.prewarm == 1 && cfg.prewarm_slots == 0, "prewarm %u/%u", cfg.prewarm,
        cfg.prewarm_slots);
  CHECK(cfg.verify == 0, "verify %u", cfg.verify);
  CHECK(cfg.scout_bytes == UINT64_MAX, "scout_bytes");
  CHECK(cfg.engine_overhead_bytes == 0, "engine_overhead_bytes");
  CHECK(cfg.freq_path == NULL, "freq_path");
  CHECK(cfg.trace_path == NULL, "trace_path");
  CHECK(cfg.policy == SMOE_POLICY_LRU && SMOE_POLICY_LRU == 0 && SMOE_POLICY_ADAPTIVE == 1,
        "policy %u", cfg.policy);
  CHECK(cfg.populate == 0 && cfg.lock == 0 && cfg.elastic == 1 && cfg.pinned == 0,
        "populate %u lock %u elastic %u pinned %u", cfg.populate, cfg.lock, cfg.elastic, cfg.pinned);
  EXPECT(smoe_config_init(NULL), SMOE_ERR_ARGUMENT);
  CHECK(strcmp(smoe_last_error(), "cfg is NULL") == 0, "config_init(NULL) message");

  /* The v1 function behind the macro, as programs built before the macro
   * call it: it writes the v1 struct (the same defaults), never the fields
   * appended since. */
  smoe_config v1;
  memset(&v1, 0xa5, sizeof v1);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  (smoe_config_init)(&v1);
  (smoe_config_init)(NULL); /* a no-op */
#pragma GCC diagnostic pop
  CHECK(strcmp(smoe_last_error(), "cfg is NULL") == 0, "(smoe_config_init)(NULL) message");
  EXPECT(smoe_config_init(&cfg), SMOE_OK);
  CHECK(v1.struct_size == V1_CONFIG_SIZE, "the v1 function set struct_size %u",
        (unsigned)v1.struct_size);
  CHECK(memcmp((const unsigned char *)&v1 + 4, (const unsigned char *)&cfg + 4,
               V1_CONFIG_SIZE - 4) == 0,
        "the v1 function wrote other defaults");
  size_t past_v1 = 0;
  for (size_t b = V1_CONFIG_SIZE; b < sizeof v1; b++) {
    past_v1 += ((const unsigned char *)&v1)[b] != 0xa5;
  }
  CHECK(past_v1 == 0, "the v1 function wrote %zu byte(s) past the v1 struct", past_v1);
}

/* smoe_config_init_sized writes exactly the caller's struct_size bytes. */
static void test_config_init_sizes(void) {
  struct {
    smoe_config cfg;
    unsigned char tail[64];
  } larger;
  const unsigned char *bytes = (const unsigned char *)&larger;
  const size_t size = sizeof(smoe_config);

  /* Smaller than v1, or larger than any config: refused, nothing written. */
  const uint32_t refused[] = {0, 4, (uint32_t)V1_CONFIG_SIZE - 8, 4097, UINT32_MAX};
  for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
    memset(&larger, 0xa5, sizeof larger);
    EXPECT(smoe_config_init_sized(&larger.cfg, refused[i]), SMOE_ERR_ARGUMENT);
    CHECK(strstr(smoe_last_error(), "struct_size") != NULL, "message names struct_size");
    size_t written = 0;
    for (size_t b = 0; b < sizeof larger; b++) {
      written += bytes[b] != 0xa5;
    }
    CHECK(written == 0, "struct_size %u refused but %zu byte(s) written", (unsigned)refused[i],
          written);
  }

  /* A newer header's larger struct: this library's fields take their
   * defaults, the tail it does not know is zeroed (so smoe_open accepts it),
   * and nothing past the caller's struct_size is written. */
  const size_t extra[] = {0, 8, 24, 64};
  for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) {
    memset(&larger, 0xa5, sizeof larger);
    const size_t caller = size + extra[i];
    EXPECT(smoe_config_init_sized(&larger.cfg, (uint32_t)caller), SMOE_OK);
    CHECK(larger.cfg.struct_size == caller, "struct_size %u, want %zu",
          (unsigned)larger.cfg.struct_size, caller);
    CHECK(larger.cfg.prewarm == 1 && larger.cfg.scout_bytes == UINT64_MAX, "defaults");
    size_t nonzero = 0, overrun = 0;
    for (size_t b = size; b < caller; b++) {
      nonzero += bytes[b] != 0;
    }
    for (size_t b = caller; b < sizeof larger; b++) {
      overrun += bytes[b] != 0xa5;
    }
    CHECK(nonzero == 0, "%zu byte(s) of the unknown tail not zeroed", nonzero);
    CHECK(overrun == 0, "%zu byte(s) written past struct_size %zu", overrun, caller);
    larger.cfg.ring_slots = 2;
    larger.cfg.workers = 1;
    larger.cfg.freq_path = "";
    smoe_streamer *s = NULL;
    EXPECT(smoe_open(vault_file, &larger.cfg, &s), SMOE_OK);
    smoe_close(s);
  }
}

/* A field of a versioned struct, as this header lays it out. */
typedef struct {
  const char *name;
  size_t offset, bytes;
} field_extent;

#define FIELD(type, name) {#name, offsetof(type, name), sizeof(((type *)0)->name)}

static const field_extent config_fields[] = {
    FIELD(smoe_config, ring_slots),   FIELD(smoe_config, slot_mb),
    FIELD(smoe_config, workers),      FIELD(smoe_config, direct_io),
    FIELD(smoe_config, prewarm),      FIELD(smoe_config, prewarm_slots),
    FIELD(smoe_config, verify),       FIELD(smoe_config, scout_bytes),
    FIELD(smoe_config, engine_overhead_bytes), FIELD(smoe_config, freq_path),
    FIELD(smoe_config, trace_path),   FIELD(smoe_config, policy),
    FIELD(smoe_config, populate),     FIELD(smoe_config, lock),
    FIELD(smoe_config, elastic),      FIELD(smoe_config, pinned),
};

/* The field that a struct of `size` bytes ends inside, or NULL. */
static const char *ends_inside(const field_extent *fields, size_t n, size_t size) {
  for (size_t i = 0; i < n; i++) {
    if (fields[i].offset < size && size < fields[i].offset + fields[i].bytes) {
      return fields[i].name;
    }
  }
  return NULL;
}

/* Every struct_size from 0 to sizeof(smoe_config) + 16: smoe_config_init_sized
 * and smoe_open accept exactly the sizes of at least v1 that end on a field
 * boundary, refuse the others naming the size and the field, and never read a
 * field the caller's size cuts in two. The bytes past the caller's size are
 * garbage ('A'), as a caller's neighbouring variables would be: they must be
 * ignored (a smaller size) or refused (a larger one). */
static void test_every_config_size(void) {
  struct {
    smoe_config cfg;
    unsigned char tail[32];
  } buf;
  unsigned char *bytes = (unsigned char *)&buf;
  const size_t n = sizeof config_fields / sizeof config_fields[0];
  for (size_t size = 0; size <= sizeof(smoe_config) + 16; size++) {
    const char *cut = ends_inside(config_fields, n, size);
    const int valid = size >= V1_CONFIG_SIZE && cut == NULL;
    char want_size[32];
    snprintf(want_size, sizeof want_size, "struct_size is %zu", size);

    memset(&buf, 0xa5, sizeof buf);
    smoe_status st = smoe_config_init_sized(&buf.cfg, (uint32_t)size);
    CHECK(st == (valid ? SMOE_OK : SMOE_ERR_ARGUMENT), "init_sized(%zu) returned %s", size,
          smoe_status_str(st));
    if (cut != NULL && size >= V1_CONFIG_SIZE) {
      CHECK(strstr(smoe_last_error(), want_size) != NULL && strstr(smoe_last_error(), cut) != NULL,
            "init_sized(%zu): message names neither the size nor %s", size, cut);
    }
    size_t overrun = 0;
    for (size_t b = (st == SMOE_OK ? size : 0); b < sizeof buf; b++) {
      overrun += bytes[b] != 0xa5;
    }
    CHECK(overrun == 0, "init_sized(%zu) wrote %zu byte(s) it must not", size, overrun);

    /* smoe_open with the caller's bytes past `size` set to garbage. */
    memset(&buf, 0, sizeof buf);
    smoe_config_init(&buf.cfg);
    buf.cfg.ring_slots = 2;
    buf.cfg.workers = 1;
    buf.cfg.freq_path = "";
    buf.cfg.struct_size = (uint32_t)size;
    if (size < sizeof(smoe_config)) {
      memset(bytes + (size < 4 ? 4 : size), 'A', sizeof(smoe_config) - (size < 4 ? 4 : size));
    }
    /* A larger size than this header's struct has a zeroed tail (buf.tail). */
    smoe_streamer *s = NULL;
    st = smoe_open(vault_file, &buf.cfg, &s);
    CHECK(st == (valid ? SMOE_OK : SMOE_ERR_ARGUMENT), "open with struct_size %zu returned %s",
          size, smoe_status_str(st));
    if (cut != NULL && size >= V1_CONFIG_SIZE) {
      CHECK(strstr(smoe_last_error(), want_size) != NULL && strstr(smoe_last_error(), cut) != NULL,
            "open(%zu): message names neither the size nor %s", size, cut);
    }
    if (st == SMOE_OK) {
      smoe_close(s);
    }
  }
}

/* Every out->struct_size from 0 to sizeof(smoe_stats) + 16: accepted exactly
 * when it is at least v1 and ends on a field boundary; min(size, sizeof)
 * bytes written, never more, nothing written when refused. */
static void test_every_stats_size(smoe_streamer *s) {
  struct {
    smoe_stats st;
    unsigned char tail[32];
  } buf;
  const unsigned char *bytes = (const unsigned char *)&buf;
  const size_t v1 = offsetof(smoe_stats, direct_io) + 8;
  for (size_t size = 0; size <= sizeof(smoe_stats) + 16; size++) {
    const int inside = size > offsetof(smoe_stats, claims) && size < sizeof(smoe_stats) &&
                       (size - offsetof(smoe_stats, claims)) % 8 != 0;
    const int valid = size >= v1 && !inside;
    memset(&buf, 0xa5, sizeof buf);
    buf.st.struct_size = (uint32_t)size;
    smoe_status st = smoe_get_stats(s, &buf.st);
    CHECK(st == (valid ? SMOE_OK : SMOE_ERR_ARGUMENT), "get_stats(%zu) returned %s", size,
          smoe_status_str(st));
    const size_t written = st == SMOE_OK ? (size < sizeof(smoe_stats) ? size : sizeof(smoe_stats))
                                         : sizeof buf.st.struct_size;
    if (st == SMOE_OK) {
      CHECK(buf.st.struct_size == written, "get_stats(%zu) set struct_size %u", size,
            (unsigned)buf.st.struct_size);
    } else {
      CHECK(buf.st.struct_size == size, "get_stats(%zu) changed struct_size on error", size);
    }
    size_t overrun = 0;
    for (size_t b = written; b < sizeof buf; b++) {
      overrun += bytes[b] != 0xa5;
    }
    CHECK(overrun == 0, "get_stats(%zu) wrote %zu byte(s) past %zu", size, overrun, written);
  }
}

static void test_open_defaults(void) {
  smoe_streamer *s = NULL;
  EXPECT(smoe_open(vault_file, NULL, &s), SMOE_OK);
  if (s == NULL) {
    FATAL("smoe_open with a NULL config failed");
  }
  smoe_stats st = get_stats(s);
  CHECK(st.workers == 16, "default workers %llu", (unsigned long long)st.workers);
  CHECK(st.ring_slots > 0, "ring_slots 0");
  smoe_close(s);
}

/* Config struct_size rules (copy_struct_from_user). */
static void test_config_sizes(void) {
  struct {
    smoe_config cfg;
    uint64_t extra[2];
  } larger;
  smoe_streamer *s = NULL;
  smoe_streamer *const sentinel = (smoe_streamer *)(uintptr_t)0x1234;

  memset(&larger, 0, sizeof larger);
  smoe_config_init(&larger.cfg);
  larger.cfg.struct_size = 4;
  s = sentinel;
  EXPECT(smoe_open(vault_file, &larger.cfg, &s), SMOE_ERR_ARGUMENT);
  CHECK(strstr(smoe_last_error(), "struct_size") != NULL, "message names struct_size");
  CHECK(s == sentinel, "out written on error");
  larger.cfg.struct_size = V1_CONFIG_SIZE - 8;
  EXPECT(smoe_open(vault_file, &larger.cfg, &s), SMOE_ERR_ARGUMENT);
  larger.cfg.struct_size = 1u << 20;
  EXPECT(smoe_open(vault_file, &larger.cfg, &s), SMOE_ERR_ARGUMENT);

  /* A newer caller's struct: accepted only while the unknown tail is zero. */
  larger.cfg.struct_size = sizeof larger;
  larger.cfg.workers = 1;
  larger.cfg.ring_slots = 2;
  larger.extra[1] = 1;
  EXPECT(smoe_open(vault_file, &larger.cfg, &s), SMOE_ERR_ARGUMENT);
  CHECK(strstr(smoe_last_error(), "not zero") != NULL, "message says the tail is not zero");
  CHECK(s == sentinel, "out written on error");
  larger.extra[1] = 0;
  EXPECT(smoe_open(vault_file, &larger.cfg, &s), SMOE_OK);
  if (s != sentinel && s != NULL) {
    smoe_stats st = get_stats(s);
    CHECK(st.workers == 1 && st.ring_slots == 2, "larger config not applied: %llu workers",
          (unsigned long long)st.workers);
    smoe_close(s);
  }
}

/* Every value C can set that Rust cannot hold is refused, naming the field. */
static void test_config_values(void) {
  smoe_config cfg;
  smoe_streamer *s = NULL;

  smoe_config_init(&cfg);
  cfg.direct_io = 3;
  EXPECT(smoe_open(vault_file, &cfg, &s), SMOE_ERR_ARGUMENT);
  CHECK(strstr(smoe_last_error(), "direct_io is 3") != NULL, "message names direct_io");

  smoe_config_init(&cfg);
  cfg.prewarm = 2;
  EXPECT(smoe_open(vault_file, &cfg, &s), SMOE_ERR_ARGUMENT);
  CHECK(strstr(smoe_last_error(), "prewarm is 2") != NULL, "message names prewarm");

  smoe_config_init(&cfg);
  cfg.policy = 2;
  EXPECT(smoe_open(vault_file, &cfg, &s), SMOE_ERR_ARGUMENT);
  CHECK(strstr(smoe_last_error(), "policy is 2") != NULL, "message names policy");

  /* The adaptive policy is reported back in the stats. */
  smoe_config_init(&cfg);
  cfg.policy = SMOE_POLICY_ADAPTIVE;
  cfg.prewarm = 0;
  EXPECT(smoe_open(vault_file, &cfg, &s), SMOE_OK);
  {
    smoe_stats st = get_stats(s);
    CHECK(st.policy == SMOE_POLICY_ADAPTIVE, "policy %llu", (unsigned long long)st.policy);
  }
  smoe_close(s);
  s = NULL;

  smoe_config_init(&cfg);
  cfg.verify = 7;
  EXPECT(smoe_open(vault_file, &cfg, &s), SMOE_ERR_ARGUMENT);
  CHECK(strstr(smoe_last_error(), "verify is 7") != NULL, "message names verify");

  smoe_config_init(&cfg);
  cfg.workers = 1000;
  EXPECT(smoe_open(vault_file, &cfg, &s), SMOE_ERR_ARGUMENT);
  CHECK(strstr(smoe_last_error(), "workers") != NULL, "message names workers");

  EXPECT(smoe_open("/nonexistent/smoe-vault", NULL, &s), SMOE_ERR_IO);
  CHECK(s == NULL, "out written on error");
}

/* NULL for every pointer parameter: SMOE_ERR_ARGUMENT naming it. */
static void test_null_arguments(smoe_streamer *s, uint32_t layer) {
  smoe_config cfg;
  smoe_slot slot;
  smoe_stats st;
  void *base;
  uint64_t a, b, c;
  smoe_streamer *out;

  smoe_config_init(&cfg);
  memset(&slot, 0, sizeof slot);
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;

  EXPECT_NULL_ARG(smoe_open(NULL, &cfg, &out), "vault_path");
  EXPECT_NULL_ARG(smoe_open(vault_file, &cfg, NULL), "out");
  EXPECT_NULL_ARG(smoe_prefetch(NULL, layer, 0, false), "s");
  EXPECT_NULL_ARG(smoe_claim(NULL, layer, 0, &slot), "s");
  EXPECT_NULL_ARG(smoe_claim(s, layer, 0, NULL), "out");
  EXPECT_NULL_ARG(smoe_claim_wait(NULL, layer, 0, 1000, &slot), "s");
  EXPECT_NULL_ARG(smoe_claim_wait(s, layer, 0, 1000, NULL), "out");
  EXPECT_NULL_ARG(smoe_release(NULL, &slot), "s");
  EXPECT_NULL_ARG(smoe_release(s, NULL), "slot");
  EXPECT_NULL_ARG(smoe_flush_stats(NULL), "s");
  EXPECT_NULL_ARG(smoe_get_stats(NULL, &st), "s");
  EXPECT_NULL_ARG(smoe_get_stats(s, NULL), "out");
  EXPECT_NULL_ARG(smoe_ring_region(NULL, &base, &a, &b), "s");
  EXPECT_NULL_ARG(smoe_ring_region(s, NULL, &a, &b), "base");
  EXPECT_NULL_ARG(smoe_ring_region(s, &base, NULL, &b), "bytes");
  EXPECT_NULL_ARG(smoe_ring_region(s, &base, &a, NULL), "slot_bytes");
  EXPECT_NULL_ARG(smoe_expert_info(NULL, layer, 0, &a, &b, &c), "s");
  EXPECT_NULL_ARG(smoe_expert_info(s, layer, 0, NULL, &b, &c), "size");
  EXPECT_NULL_ARG(smoe_expert_info(s, layer, 0, &a, NULL, &c), "padded_size");
  EXPECT_NULL_ARG(smoe_expert_info(s, layer, 0, &a, &b, NULL), "offset");

  const char *meta = smoe_vault_metadata(NULL);
  CHECK(meta != NULL && meta[0] == '\0', "vault_metadata(NULL) is not \"\"");
  CHECK(strcmp(smoe_last_error(), "s is NULL") == 0, "vault_metadata(NULL) message");
  smoe_prewarm_pause(NULL, true);
  CHECK(strcmp(smoe_last_error(), "s is NULL") == 0, "prewarm_pause(NULL) message");
  smoe_close(NULL);
}

static void test_stats_sizes(smoe_streamer *s) {
  struct {
    smoe_stats st;
    uint64_t extra[2];
  } larger;
  smoe_stats small;

  memset(&small, 0x5a, sizeof small);
  small.struct_size = 8;
  EXPECT(smoe_get_stats(s, &small), SMOE_ERR_ARGUMENT);
  CHECK(small.struct_size == 8 && small.claims == 0x5a5a5a5a5a5a5a5aull,
        "written on error");

  memset(&larger, 0xff, sizeof larger);
  larger.st.struct_size = sizeof larger;
  EXPECT(smoe_get_stats(s, &larger.st), SMOE_OK);
  CHECK(larger.st.struct_size == sizeof(smoe_stats), "struct_size written back: %u",
        larger.st.struct_size);
  CHECK(larger.extra[0] == UINT64_MAX && larger.extra[1] == UINT64_MAX,
        "wrote past sizeof(smoe_stats)");
  CHECK(larger.st.ring_slots == 4, "ring_slots %llu", (unsigned long long)larger.st.ring_slots);
}

/* Working sets (smoe_prefetch_set, smoe_claim_any) on the 4-slot streamer:
 * a 6-member set through 4 slots, each member claimed once with the file's
 * bytes; the argument checks; RING_FULL at once when every slot is held. */
static void test_working_set(smoe_streamer *s) {
  const uint32_t layer = expert_layer(2);
  uint32_t set[6] = {5, 0, 3, 1, 4, 2};
  uint32_t n = 6, queued = 99;
  EXPECT(smoe_prefetch_set(s, layer, set, n, false, &queued), SMOE_ERR_RING_FULL);
  CHECK(queued >= 4 && queued < 6, "queued %u of 6 through 4 slots", (unsigned)queued);
  unsigned seen = 0;
  while (n > 0) {
    smoe_slot slot;
    smoe_status st = smoe_claim_any(s, layer, set, n, 10000000000ull, &slot);
    EXPECT(st, SMOE_OK);
    if (st != SMOE_OK) {
      break;
    }
    CHECK(payload_matches(s, &slot), "expert %u: bytes differ from the file", slot.expert);
    uint32_t k = 0;
    while (k < n && set[k] != slot.expert) {
      k++;
    }
    CHECK(k < n, "claimed expert %u is not in the set", slot.expert);
    CHECK((seen & (1u << slot.expert)) == 0, "expert %u claimed twice", slot.expert);
    seen |= 1u << slot.expert;
    if (k < n) {
      set[k] = set[--n];
    }
    EXPECT(smoe_release(s, &slot), SMOE_OK);
  }
  CHECK(seen == 0x3f, "claimed set 0x%x, want 0x3f", seen);

  /* Arguments: NULL with n > 0, n == 0. */
  EXPECT(smoe_prefetch_set(s, layer, NULL, 2, false, NULL), SMOE_ERR_ARGUMENT);
  queued = 99;
  EXPECT(smoe_prefetch_set(s, layer, NULL, 0, false, &queued), SMOE_OK);
  CHECK(queued == 0, "empty set: queued %u", (unsigned)queued);
  smoe_slot slot, sentinel;
  memset(&sentinel, 0xa5, sizeof sentinel);
  memcpy(&slot, &sentinel, sizeof slot);
  EXPECT(smoe_claim_any(s, layer, set, 0, 0, &slot), SMOE_ERR_ARGUMENT);
  EXPECT(smoe_claim_any(s, layer, NULL, 1, 0, &slot), SMOE_ERR_ARGUMENT);
  CHECK(memcmp(&slot, &sentinel, sizeof slot) == 0, "out written on an argument error");
  const uint32_t missing[2] = {0, n_experts};
  EXPECT(smoe_prefetch_set(s, layer, missing, 2, false, NULL), SMOE_ERR_NOT_FOUND);
  /* A layer beyond the vault, empty set: layer × n_experts once wrapped
   * (a release build answered OK). */
  queued = 99;
  EXPECT(smoe_prefetch_set(s, UINT32_MAX, NULL, 0, false, &queued), SMOE_ERR_NOT_FOUND);
  EXPECT(smoe_prefetch_set(s, n_layers, NULL, 0, true, &queued), SMOE_ERR_NOT_FOUND);
  CHECK(queued == 99, "queued written on NOT_FOUND: %u", (unsigned)queued);

  /* Hold every slot: a set of other experts is RING_FULL at once. */
  smoe_slot held[4];
  for (uint32_t e = 0; e < 4; e++) {
    EXPECT(smoe_claim_wait(s, layer, e, 10000000000ull, &held[e]), SMOE_OK);
  }
  smoe_stats st = get_stats(s);
  CHECK(st.slots_held == 4, "slots_held %llu", (unsigned long long)st.slots_held);
  const uint32_t others[2] = {4, 5};
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  EXPECT(smoe_claim_any(s, layer, others, 2, 10000000000ull, &slot), SMOE_ERR_RING_FULL);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  const double waited = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  CHECK(waited < 1.0, "RING_FULL after %.3f s, not at once", waited);
  for (uint32_t e = 0; e < 4; e++) {
    EXPECT(smoe_release(s, &held[e]), SMOE_OK);
  }
  CHECK(get_stats(s).slots_held == 0, "slots_held after the releases");
}

/* The main scenario on a 4-slot, 2-worker streamer. */
static void test_streaming(smoe_streamer *s) {
  void *base = NULL;
  uint64_t ring_bytes = 0, slot_bytes = 0;
  uint32_t layer = expert_layer(1);
  smoe_slot slot, again, sentinel;

  EXPECT(smoe_ring_region(s, &base, &ring_bytes, &slot_bytes), SMOE_OK);
  CHECK(base != NULL && (uintptr_t)base % 16384 == 0, "ring base %p not 16 KiB aligned", base);
  CHECK(slot_bytes > 0 && slot_bytes % 16384 == 0, "slot_bytes %llu",
        (unsigned long long)slot_bytes);
  CHECK(ring_bytes == 4 * slot_bytes, "ring bytes %llu", (unsigned long long)ring_bytes);

  smoe_stats st = get_stats(s);
  CHECK(st.struct_size == sizeof(smoe_stats), "struct_size %u", st.struct_size);
  CHECK(st.ring_slots == 4 && st.workers == 2, "ring_slots %llu workers %llu",
        (unsigned long long)st.ring_slots, (unsigned long long)st.workers);
  CHECK(st.slot_bytes == slot_bytes, "slot_bytes");
  CHECK(st.claims == 0 && st.hits == 0 && st.bytes_read == 0 && st.resident == 0,
        "fresh streamer has counts");
  CHECK(st.direct_io <= 1, "direct_io %llu", (unsigned long long)st.direct_io);
  CHECK(st.policy == SMOE_POLICY_LRU, "policy %llu", (unsigned long long)st.policy);
  /* Elastic by default; a fresh ring under no pressure has every slot. */
  CHECK(st.slots_active == 4 && st.shrinks == 0 && st.grows == 0,
        "slots_active %llu shrinks %llu grows %llu", (unsigned long long)st.slots_active,
        (unsigned long long)st.shrinks, (unsigned long long)st.grows);

  /* PENDING does not write `out`: a claim of a non-resident expert. */
  memset(&sentinel, 0xa5, sizeof sentinel);
  memcpy(&slot, &sentinel, sizeof slot);
  EXPECT(smoe_claim(s, layer, 0, &slot), SMOE_PENDING);
  CHECK(memcmp(&slot, &sentinel, sizeof slot) == 0, "out written on PENDING");

  /* That claim queued a demand read: wait for it. */
  EXPECT(smoe_claim_wait(s, layer, 0, 5000000000ull, &slot), SMOE_OK);
  CHECK(slot.layer == layer && slot.expert == 0, "slot is %u/%u", slot.layer, slot.expert);
  CHECK(!slot.hit, "a demand read was needed, yet hit");
  CHECK(slot.slot_index < 4, "slot_index %u", slot.slot_index);
  CHECK(slot.data == (const uint8_t *)base + (uint64_t)slot.slot_index * slot_bytes,
        "data is not base + slot_index * slot_bytes");
  CHECK((uintptr_t)slot.data % 16384 == 0, "data not aligned");
  CHECK(payload_matches(s, &slot), "payload of %u/0 differs from the vault file", layer);
  EXPECT(smoe_release(s, &slot), SMOE_OK);
  EXPECT(smoe_release(s, &slot), SMOE_ERR_STALE);
  CHECK(smoe_last_error()[0] != '\0', "STALE without a message");

  st = get_stats(s);
  uint64_t bytes_read = st.bytes_read;
  CHECK(st.claims == 1 && st.hits == 0 && st.pending == 1, "claims %llu hits %llu pending %llu",
        (unsigned long long)st.claims, (unsigned long long)st.hits,
        (unsigned long long)st.pending);
  CHECK(bytes_read > 0 && st.reads_demand == 1 && st.resident == 1, "bytes_read %llu",
        (unsigned long long)bytes_read);

  /* Retained: a re-claim is a hit and reads nothing. */
  EXPECT(smoe_claim(s, layer, 0, &again), SMOE_OK);
  CHECK(again.hit, "re-claim is not a hit");
  CHECK(again.data == slot.data && again.slot_index == slot.slot_index, "moved");
  CHECK(payload_matches(s, &again), "retained payload differs");
  st = get_stats(s);
  CHECK(st.claims == 2 && st.hits == 1, "claims %llu hits %llu", (unsigned long long)st.claims,
        (unsigned long long)st.hits);
  CHECK(st.bytes_read == bytes_read, "bytes_read changed on a hit");
  EXPECT(smoe_release(s, &again), SMOE_OK);

  /* Speculation: prefetched data is a hit when claimed once it is loaded
   * (claiming it while loading would promote the read to demand). */
  EXPECT(smoe_prefetch(s, layer, 1, true), SMOE_OK);
  for (int i = 0; i < 5000 && get_stats(s).resident < 2; i++) {
    const struct timespec millisecond = {0, 1000000};
    nanosleep(&millisecond, NULL);
  }
  EXPECT(smoe_claim_wait(s, layer, 1, 5000000000ull, &slot), SMOE_OK);
  CHECK(slot.hit, "speculatively loaded expert is not a hit");
  CHECK(payload_matches(s, &slot), "payload of %u/1 differs", layer);
  EXPECT(smoe_release(s, &slot), SMOE_OK);
  st = get_stats(s);
  CHECK(st.reads_speculative == 1, "reads_speculative %llu",
        (unsigned long long)st.reads_speculative);

  /* Not in the vault. */
  uint64_t a = 11, b = 22, c = 33;
  EXPECT(smoe_prefetch(s, layer, n_experts, false), SMOE_ERR_NOT_FOUND);
  EXPECT(smoe_claim(s, layer, n_experts, &slot), SMOE_ERR_NOT_FOUND);
  EXPECT(smoe_claim(s, n_layers, 0, &slot), SMOE_ERR_NOT_FOUND);
  EXPECT(smoe_claim(s, dense_layer, 0, &slot), SMOE_ERR_NOT_FOUND);
  EXPECT(smoe_expert_info(s, layer, n_experts, &a, &b, &c), SMOE_ERR_NOT_FOUND);
  CHECK(a == 11 && b == 22 && c == 33, "expert_info wrote on error");
  CHECK(strstr(smoe_last_error(), "not in the vault") != NULL, "NOT_FOUND message");

  /* Ring full: hold all four slots, then a fifth expert cannot load. */
  smoe_slot held[4];
  for (uint32_t i = 0; i < 4; i++) {
    EXPECT(smoe_claim_wait(s, layer, i, 5000000000ull, &held[i]), SMOE_OK);
  }
  memcpy(&slot, &sentinel, sizeof slot);
  EXPECT(smoe_claim(s, layer, 4, &slot), SMOE_ERR_RING_FULL);
  EXPECT(smoe_prefetch(s, layer, 4, false), SMOE_ERR_RING_FULL);
  CHECK(memcmp(&slot, &sentinel, sizeof slot) == 0, "out written on RING_FULL");
  EXPECT(smoe_release(s, &held[2]), SMOE_OK);
  EXPECT(smoe_claim_wait(s, layer, 4, 5000000000ull, &slot), SMOE_OK);
  CHECK(slot.slot_index == held[2].slot_index, "did not take the released slot");
  CHECK(payload_matches(s, &slot), "payload of %u/4 differs", layer);
  st = get_stats(s);
  CHECK(st.evictions >= 1, "no eviction counted");
  /* held[2]'s slot was reloaded: its ticket is stale now. */
  EXPECT(smoe_release(s, &held[2]), SMOE_ERR_STALE);
  EXPECT(smoe_release(s, &slot), SMOE_OK);
  for (uint32_t i = 0; i < 4; i++) {
    if (i != 2) {
      CHECK(payload_matches(s, &held[i]), "held payload %u changed", i);
      EXPECT(smoe_release(s, &held[i]), SMOE_OK);
    }
  }

  /* A timeout of 0 on a non-resident expert: PENDING, `out` untouched. */
  uint32_t other = expert_layer(2);
  memcpy(&slot, &sentinel, sizeof slot);
  EXPECT(smoe_claim_wait(s, other, 5, 0, &slot), SMOE_PENDING);
  CHECK(memcmp(&slot, &sentinel, sizeof slot) == 0, "out written on claim_wait PENDING");
  EXPECT(smoe_claim_wait(s, other, 5, 5000000000ull, &slot), SMOE_OK);
  CHECK(payload_matches(s, &slot), "payload of %u/5 differs", other);
  EXPECT(smoe_release(s, &slot), SMOE_OK);

  /* Not implemented yet, but callable. */
  smoe_prewarm_pause(s, true);
  smoe_prewarm_pause(s, false);
  EXPECT(smoe_flush_stats(s), SMOE_OK);

  const char *meta = smoe_vault_metadata(s);
  CHECK(meta != NULL && meta[0] == '{', "metadata \"%s\" is not a JSON object",
        meta ? meta : "(null)");
  CHECK(meta == smoe_vault_metadata(s), "metadata pointer is not stable");
}

/* smoe_last_error is per thread. */
static void *other_thread(void *arg) {
  smoe_streamer *s = arg;
  const char *start = smoe_last_error();
  int ok = start[0] == '\0';
  smoe_slot slot;
  ok = ok && smoe_claim(s, n_layers, 0, &slot) == SMOE_ERR_NOT_FOUND;
  ok = ok && strstr(smoe_last_error(), "not in the vault") != NULL;
  return ok ? arg : NULL;
}

static void test_last_error_per_thread(smoe_streamer *s) {
  EXPECT(smoe_release(s, NULL), SMOE_ERR_ARGUMENT);
  pthread_t thread;
  void *result = NULL;
  CHECK(pthread_create(&thread, NULL, other_thread, s) == 0, "pthread_create");
  CHECK(pthread_join(thread, &result) == 0, "pthread_join");
  CHECK(result == s, "the other thread saw another thread's error or none of its own");
  CHECK(strcmp(smoe_last_error(), "slot is NULL") == 0, "this thread's error was replaced");
}

int main(int argc, char **argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: %s <experts.smoe> <n_layers> <n_experts> <dense_layer>\n", argv[0]);
    return 2;
  }
  vault_file = argv[1];
  n_layers = (uint32_t)strtoul(argv[2], NULL, 10);
  n_experts = (uint32_t)strtoul(argv[3], NULL, 10);
  dense_layer = (uint32_t)strtoul(argv[4], NULL, 10);
  if (n_experts < 6 || n_layers < 3) {
    FATAL("the vault needs at least 3 layers and 6 experts");
  }

  CHECK(smoe_abi_version() == SMOE_ABI_VERSION, "abi version %u", smoe_abi_version());
  CHECK(smoe_last_error()[0] == '\0', "last error starts non-empty");
  {
    /* The library's version is the header's, and the three numbers spell it. */
    char numbers[64];
    snprintf(numbers, sizeof numbers, "%d.%d.%d", SMOE_VERSION_MAJOR, SMOE_VERSION_MINOR,
             SMOE_VERSION_PATCH);
    CHECK(strcmp(smoe_version(), SMOE_VERSION_STRING) == 0, "smoe_version() %s, header %s",
          smoe_version(), SMOE_VERSION_STRING);
    CHECK(strncmp(SMOE_VERSION_STRING, numbers, strlen(numbers)) == 0, "%s is not %s",
          SMOE_VERSION_STRING, numbers);
  }

  test_config_init();
  test_config_init_sizes();
  test_open_defaults();
  test_config_sizes();
  test_every_config_size();
  test_config_values();

  smoe_config cfg;
  smoe_config_init(&cfg);
  cfg.ring_slots = 4;
  cfg.workers = 2;
  cfg.freq_path = "";
  smoe_streamer *s = NULL;
  EXPECT(smoe_open(vault_file, &cfg, &s), SMOE_OK);
  if (s == NULL) {
    FATAL("smoe_open with ring_slots 4, workers 2 failed");
  }
  test_null_arguments(s, expert_layer(1));
  test_stats_sizes(s);
  test_every_stats_size(s);
  test_streaming(s);
  test_working_set(s);
  test_last_error_per_thread(s);
  smoe_close(s);
  smoe_close(NULL);

  if (failures != 0) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return failures < 99 ? failures : 99;
  }
  puts("ok");
  return 0;
}
