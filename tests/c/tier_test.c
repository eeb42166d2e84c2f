/*
 * The device tier's C API (docs/c-api.md, "A device tier") driven as a host
 * would drive it, with a fake device: device slots are host buffers, a copy
 * is a memcpy that completes one step late, every fifth one fails, and every
 * hit's bytes are checked against the expert's. Then every error path.
 * Prints "ok" and exits 0, or names the first failed check and exits 1.
 */
#include <smoe.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LAYERS 4
#define EXPERTS 16
#define SLOTS 12
#define BYTES 256
#define STEPS 400
#define TOP_K 4

#define CHECK(cond)                                                           \
  do {                                                                        \
    if (!(cond)) {                                                            \
      printf("line %d: %s (last error: %s)\n", __LINE__, #cond,              \
             smoe_last_error());                                              \
      exit(1);                                                                \
    }                                                                         \
  } while (0)

static unsigned char pattern(int layer, int expert, int i) {
  return (unsigned char)(layer * 131 + expert * 17 + i * 7);
}

static unsigned rng = 12345u;
static unsigned next(void) {
  rng = rng * 1103515245u + 12345u;
  return (rng >> 8) & 0xffffffu;
}

struct copy {
  int slot, layer, expert;
};

int main(void) {
  static unsigned char device[SLOTS][BYTES];
  struct copy pending[LAYERS * TOP_K];
  int n_pending = 0;
  int held[SLOTS];
  unsigned long long hits = 0, loaded = 0, failed = 0;
  smoe_tier *t = NULL;

  CHECK(smoe_tier_new(SLOTS, LAYERS, EXPERTS, &t) == SMOE_OK && t != NULL);
  for (int step = 0; step < STEPS; step++) {
    memset(held, 0, sizeof held);
    int missed[LAYERS * TOP_K][2];
    int n_missed = 0;
    for (int layer = 0; layer < LAYERS; layer++) {
      int used[TOP_K];
      for (int k = 0; k < TOP_K; k++) {
        /* skewed: a square of a uniform number favours low experts */
        unsigned u = next() % 1000;
        int e = (int)(u * u / (1000u * 1000u / EXPERTS));
        for (int j = 0; j < k; j++) {
          if (used[j] == e) {
            e = (e + 1) % EXPERTS;
            j = -1;
          }
        }
        used[k] = e;
        int slot = -2;
        CHECK(smoe_tier_lookup(t, (uint32_t)layer, (uint32_t)e, &slot) == SMOE_OK);
        if (slot >= 0) {
          CHECK(slot < SLOTS);
          for (int p = 0; p < n_pending; p++) {
            CHECK(pending[p].slot != slot); /* never a slot being written */
          }
          for (int i = 0; i < BYTES; i++) {
            CHECK(device[slot][i] == pattern(layer, e, i));
          }
          held[slot] = 1;
          hits++;
        } else {
          CHECK(slot == -1);
          missed[n_missed][0] = layer;
          missed[n_missed][1] = e;
          n_missed++;
        }
      }
    }
    /* the copies of the step before complete, one in five failing */
    for (int p = 0; p < n_pending; p++) {
      if (next() % 5 == 0) {
        CHECK(smoe_tier_failed(t, (uint32_t)pending[p].slot) == SMOE_OK);
        failed++;
      } else {
        for (int i = 0; i < BYTES; i++) {
          device[pending[p].slot][i] = pattern(pending[p].layer, pending[p].expert, i);
        }
        CHECK(smoe_tier_loaded(t, (uint32_t)pending[p].slot, BYTES) == SMOE_OK);
        loaded++;
      }
    }
    n_pending = 0;
    for (int m = 0; m < n_missed; m++) {
      smoe_tier_promotion p;
      CHECK(smoe_tier_admit(t, (uint32_t)missed[m][0], (uint32_t)missed[m][1], &p) == SMOE_OK);
      if (p.slot < 0) {
        CHECK(p.evicted_layer == -1 && p.evicted_expert == -1);
        continue;
      }
      CHECK(p.slot < SLOTS && !held[p.slot]); /* never a slot this step reads */
      CHECK((p.evicted_layer < 0) == (p.evicted_expert < 0));
      CHECK(p.evicted_layer < LAYERS && p.evicted_expert < EXPERTS);
      pending[n_pending].slot = p.slot;
      pending[n_pending].layer = missed[m][0];
      pending[n_pending].expert = missed[m][1];
      n_pending++;
    }
    CHECK(smoe_tier_step_done(t) == SMOE_OK);
  }

  smoe_tier_stats st;
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  CHECK(smoe_tier_get_stats(t, &st) == SMOE_OK);
  CHECK(st.struct_size == sizeof st);
  CHECK(st.lookups == (unsigned long long)STEPS * LAYERS * TOP_K);
  CHECK(st.hits == hits && hits > 0);
  CHECK(st.promotions == loaded + failed + (unsigned long long)n_pending);
  CHECK(st.failed == failed);
  CHECK(st.bytes_copied == loaded * BYTES);
  CHECK(st.never_used <= st.evictions);

  /* error paths: nothing changes, the message names what was wrong */
  int slot = 7;
  smoe_tier_promotion p = {5, 5, 5};
  CHECK(smoe_tier_lookup(t, LAYERS, 0, &slot) == SMOE_ERR_ARGUMENT && slot == 7);
  CHECK(strstr(smoe_last_error(), "outside the tier") != NULL);
  CHECK(smoe_tier_lookup(t, 0, EXPERTS, &slot) == SMOE_ERR_ARGUMENT);
  CHECK(smoe_tier_lookup(t, 0, 0, NULL) == SMOE_ERR_ARGUMENT);
  CHECK(smoe_tier_lookup(NULL, 0, 0, &slot) == SMOE_ERR_ARGUMENT);
  CHECK(smoe_tier_admit(t, 0, EXPERTS, &p) == SMOE_ERR_ARGUMENT && p.slot == 5);
  CHECK(smoe_tier_admit(t, 0, 0, NULL) == SMOE_ERR_ARGUMENT);
  CHECK(smoe_tier_loaded(t, SLOTS, 1) == SMOE_ERR_ARGUMENT);
  CHECK(strstr(smoe_last_error(), "does not exist") != NULL);
  CHECK(smoe_tier_failed(NULL, 0) == SMOE_ERR_ARGUMENT);
  CHECK(smoe_tier_step_done(NULL) == SMOE_ERR_ARGUMENT);
  smoe_tier_stats again;
  memset(&again, 0, sizeof again);
  again.struct_size = sizeof again - 8;
  CHECK(smoe_tier_get_stats(t, &again) == SMOE_ERR_ARGUMENT && again.lookups == 0);
  CHECK(smoe_tier_get_stats(t, NULL) == SMOE_ERR_ARGUMENT);
  smoe_tier_get_stats(t, &st);
  CHECK(st.lookups == (unsigned long long)STEPS * LAYERS * TOP_K); /* none counted */
  smoe_tier_free(t);

  /* a slot with no copy in flight is stale; a tier of 0 slots never promotes */
  CHECK(smoe_tier_new(1, 1, 2, &t) == SMOE_OK);
  CHECK(smoe_tier_loaded(t, 0, 1) == SMOE_ERR_STALE);
  CHECK(smoe_tier_admit(t, 0, 1, &p) == SMOE_OK && p.slot == 0 && p.evicted_layer == -1);
  CHECK(smoe_tier_loaded(t, 0, 1) == SMOE_OK);
  CHECK(smoe_tier_loaded(t, 0, 1) == SMOE_ERR_STALE);
  CHECK(smoe_tier_lookup(t, 0, 1, &slot) == SMOE_OK && slot == 0);
  smoe_tier_free(t);
  CHECK(smoe_tier_new(0, 1, 2, &t) == SMOE_OK);
  CHECK(smoe_tier_admit(t, 0, 1, &p) == SMOE_OK && p.slot == -1);
  smoe_tier_free(t);
  smoe_tier_free(NULL);

  /* refused shapes write nothing */
  smoe_tier *none = NULL;
  CHECK(smoe_tier_new(4, 0, 8, &none) == SMOE_ERR_ARGUMENT && none == NULL);
  CHECK(smoe_tier_new(4, 8, 0, &none) == SMOE_ERR_ARGUMENT && none == NULL);
  CHECK(smoe_tier_new(4, 1u << 20, 2, &none) == SMOE_ERR_ARGUMENT && none == NULL);
  CHECK(smoe_tier_new((1u << 20) + 1, 1, 2, &none) == SMOE_ERR_ARGUMENT && none == NULL);
  CHECK(smoe_tier_new(4, 1, 2, NULL) == SMOE_ERR_ARGUMENT);

  printf("ok\n");
  return 0;
}
