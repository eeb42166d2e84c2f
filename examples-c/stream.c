/*
 * stream.c: the smallest complete use of the C API, in plain C11.
 *
 * Usage: stream VAULT_DIR
 *
 * Opens the vault, prefetches the top-k experts of one layer, claims each
 * with smoe_claim_wait, checks its bytes against the vault file read
 * independently (fopen at the offset smoe_expert_info reports), releases it,
 * claims the same experts again (now hits: the ring retained them), and
 * prints the streamer's counters. Exit status 0 only if every byte matched.
 */

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "smoe.h"

enum { LAYER = 1, TOP_K = 8 };

/* Reports a failed call with the library's message and exits. */
static void fail(const char *call, smoe_status status) {
  fprintf(stderr, "stream: %s: %s: %s\n", call, smoe_status_str(status),
          smoe_last_error());
  exit(1);
}

/* Reads `size` bytes at `offset` of `path` into a new buffer (the expectation,
 * independent of the streamer). */
static unsigned char *read_file_range(const char *path, uint64_t offset, uint64_t size) {
  if (offset > (uint64_t)LONG_MAX || size > (uint64_t)SIZE_MAX) {
    fprintf(stderr, "stream: offset %llu too large for fseek\n",
            (unsigned long long)offset);
    exit(1);
  }
  FILE *file = fopen(path, "rb");
  if (file == NULL) {
    perror(path);
    exit(1);
  }
  unsigned char *bytes = malloc(size == 0 ? 1 : (size_t)size);
  if (bytes == NULL || fseek(file, (long)offset, SEEK_SET) != 0 ||
      fread(bytes, 1, (size_t)size, file) != (size_t)size) {
    fprintf(stderr, "stream: cannot read %llu bytes at %llu of %s\n",
            (unsigned long long)size, (unsigned long long)offset, path);
    exit(1);
  }
  fclose(file);
  return bytes;
}

/* Claims (LAYER, expert), compares its bytes with the file, releases it.
 * Returns 1 if the claim was a hit. */
static int claim_and_check(smoe_streamer *s, const char *file, uint32_t expert) {
  uint64_t size = 0, padded_size = 0, offset = 0;
  smoe_status status = smoe_expert_info(s, LAYER, expert, &size, &padded_size, &offset);
  if (status != SMOE_OK) {
    fail("smoe_expert_info", status);
  }
  smoe_slot slot;
  status = smoe_claim_wait(s, LAYER, expert, 10ull * 1000 * 1000 * 1000, &slot);
  if (status != SMOE_OK) {
    fail("smoe_claim_wait", status); /* PENDING here means a 10 s timeout */
  }
  unsigned char *want = read_file_range(file, offset, size);
  if (slot.size != size || slot.layer != LAYER || slot.expert != expert ||
      memcmp(slot.data, want, (size_t)size) != 0) {
    fprintf(stderr, "stream: layer %u expert %u: streamed bytes differ from the file\n",
            (unsigned)LAYER, (unsigned)expert);
    exit(1);
  }
  free(want);
  int hit = slot.hit;
  status = smoe_release(s, &slot); /* data must not be read after this */
  if (status != SMOE_OK) {
    fail("smoe_release", status);
  }
  return hit;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s VAULT_DIR\n", argv[0]);
    return 2;
  }
  if (smoe_abi_version() != SMOE_ABI_VERSION) {
    fprintf(stderr, "stream: header ABI %u, library ABI %u\n",
            (unsigned)SMOE_ABI_VERSION, (unsigned)smoe_abi_version());
    return 1;
  }
  char file[4096];
  if (snprintf(file, sizeof file, "%s/experts.smoe", argv[1]) >= (int)sizeof file) {
    fprintf(stderr, "stream: path too long\n");
    return 1;
  }

  smoe_config cfg;
  smoe_config_init(&cfg);
  cfg.ring_slots = 64;
  cfg.workers = 4;
  cfg.prewarm = 0;
  cfg.freq_path = ""; /* do not write a histogram next to the vault */
  smoe_streamer *s = NULL;
  smoe_status status = smoe_open(argv[1], &cfg, &s);
  if (status != SMOE_OK) {
    fail("smoe_open", status);
  }

  /* "Routing": TOP_K distinct experts, a fixed stride through the layer. */
  uint32_t experts[TOP_K];
  for (uint32_t k = 0; k < TOP_K; k++) {
    experts[k] = (k * 5u + 3u) % 32u;
  }
  for (uint32_t k = 0; k < TOP_K; k++) {
    status = smoe_prefetch(s, LAYER, experts[k], false);
    if (status != SMOE_OK) {
      fail("smoe_prefetch", status);
    }
  }
  int first_hits = 0, second_hits = 0;
  for (uint32_t k = 0; k < TOP_K; k++) {
    first_hits += claim_and_check(s, file, experts[k]);
  }
  for (uint32_t k = 0; k < TOP_K; k++) {
    second_hits += claim_and_check(s, file, experts[k]);
  }
  if (second_hits != TOP_K) {
    fprintf(stderr, "stream: second pass: %d of %d hits, want all\n", second_hits, TOP_K);
    return 1;
  }

  smoe_stats stats;
  memset(&stats, 0, sizeof stats);
  stats.struct_size = sizeof stats;
  status = smoe_get_stats(s, &stats);
  if (status != SMOE_OK) {
    fail("smoe_get_stats", status);
  }
  printf("stream: layer %u, %d experts checked byte for byte, twice\n",
         (unsigned)LAYER, TOP_K);
  printf("first pass: %d of %d hits (demand reads are not hits); "
         "second pass: %d of %d hits (retained)\n", first_hits, TOP_K, second_hits, TOP_K);
  printf("stats: claims %llu, hits %llu, pending %llu, bytes read %llu, "
         "demand reads %llu, ring %llu slots x %llu bytes, direct I/O %llu\n",
         (unsigned long long)stats.claims, (unsigned long long)stats.hits,
         (unsigned long long)stats.pending, (unsigned long long)stats.bytes_read,
         (unsigned long long)stats.reads_demand, (unsigned long long)stats.ring_slots,
         (unsigned long long)stats.slot_bytes, (unsigned long long)stats.direct_io);
  smoe_close(s);
  return 0;
}
