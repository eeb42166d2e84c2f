/*
 * expert_ffn: compute one expert's SwiGLU feed-forward output straight from
 * its claimed slot, using only the vault's metadata -- what a llama-style
 * engine does with a vault written by `smoe pack`.
 *
 *   expert_ffn VAULT_DIR LAYER EXPERT INPUT OUTPUT
 *
 * INPUT holds n_embd little-endian f32 values x; OUTPUT receives n_embd f32
 * values y = down . (silu(gate . x) * (up . x)). The layer's blob layout
 * (metadata key "layer_blob_layouts", see docs/format.md) says where each
 * slice sits in the blob, its dtype and its shape (outermost first): gate
 * and up are [n_ff, n_embd], down is [n_embd, n_ff], a fused gate_up is
 * [2 n_ff, n_embd] with the gate rows first. Slices are read in place, in
 * F32, F16, BF16 or Q8_0; any other dtype is an error.
 *
 * The JSON reading below is deliberately small: it finds the layer's array
 * and reads the flat items a packer writes. A real engine would use the
 * JSON parser it already has.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "smoe.h"

#define MAX_ITEMS 16

typedef struct {
  char role[32];
  char dtype[16];
  uint64_t shape[4];
  int n_dims;
  uint64_t offset;
  uint64_t bytes;
} item_t;

static int fail(const char *what) {
  fprintf(stderr, "expert_ffn: %s\n", what);
  return 1;
}

/* Skips white space. */
static const char *ws(const char *p) {
  while (*p && isspace((unsigned char)*p)) p++;
  return p;
}

/* Reads a JSON string (no escapes needed for the keys and values a packer
 * writes here) into out; returns the position after it, or NULL. */
static const char *str(const char *p, char *out, size_t cap) {
  size_t n = 0;
  p = ws(p);
  if (*p != '"') return NULL;
  p++;
  while (*p && *p != '"') {
    if (*p == '\\') return NULL;
    if (n + 1 < cap) out[n++] = *p;
    p++;
  }
  if (*p != '"') return NULL;
  out[n] = '\0';
  return p + 1;
}

static const char *num(const char *p, uint64_t *out) {
  char *end;
  p = ws(p);
  errno = 0;
  unsigned long long v = strtoull(p, &end, 10);
  if (end == p || errno) return NULL;
  *out = v;
  return end;
}

/* Skips one JSON value (string, number, array or object). */
static const char *skip(const char *p) {
  p = ws(p);
  if (*p == '"') {
    char tmp[256];
    return str(p, tmp, sizeof tmp);
  }
  if (*p == '[' || *p == '{') {
    int depth = 0;
    do {
      if (*p == '"') {
        char tmp[256];
        p = str(p, tmp, sizeof tmp);
        if (!p) return NULL;
        continue;
      }
      if (*p == '[' || *p == '{') depth++;
      if (*p == ']' || *p == '}') depth--;
      if (!*p) return NULL;
      p++;
    } while (depth > 0);
    return p;
  }
  while (*p && *p != ',' && *p != '}' && *p != ']') p++;
  return p;
}

/* Reads one item object. */
static const char *item(const char *p, item_t *it) {
  memset(it, 0, sizeof *it);
  p = ws(p);
  if (*p++ != '{') return NULL;
  for (;;) {
    char key[32];
    p = str(p, key, sizeof key);
    if (!p) return NULL;
    p = ws(p);
    if (*p++ != ':') return NULL;
    if (!strcmp(key, "role")) {
      p = str(p, it->role, sizeof it->role);
    } else if (!strcmp(key, "dtype")) {
      p = str(p, it->dtype, sizeof it->dtype);
    } else if (!strcmp(key, "offset")) {
      p = num(p, &it->offset);
    } else if (!strcmp(key, "bytes")) {
      p = num(p, &it->bytes);
    } else if (!strcmp(key, "shape")) {
      p = ws(p);
      if (*p++ != '[') return NULL;
      p = ws(p);
      while (p && *p != ']') {
        if (it->n_dims == 4) return NULL;
        p = num(p, &it->shape[it->n_dims++]);
        if (!p) return NULL;
        p = ws(p);
        if (*p == ',') p++;
      }
      if (p) p++;
    } else {
      p = skip(p);
    }
    if (!p) return NULL;
    p = ws(p);
    if (*p == ',') {
      p++;
      continue;
    }
    if (*p == '}') return p + 1;
    return NULL;
  }
}

/* Finds "layer_blob_layouts" -> "<layer>" and reads its items. */
static int layout(const char *meta, unsigned layer, item_t *items, int *n) {
  const char *p = strstr(meta, "\"layer_blob_layouts\"");
  char key[32];
  if (!p) return fail("the vault's metadata has no layer_blob_layouts (not packed by smoe pack?)");
  p = ws(p + strlen("\"layer_blob_layouts\""));
  if (*p++ != ':') return fail("malformed layer_blob_layouts");
  p = ws(p);
  if (*p++ != '{') return fail("malformed layer_blob_layouts");
  snprintf(key, sizeof key, "%u", layer);
  for (;;) {
    char k[32];
    p = str(p, k, sizeof k);
    if (!p) return fail("the layer has no blob layout (a dense layer?)");
    p = ws(p);
    if (*p++ != ':') return fail("malformed layer_blob_layouts");
    if (strcmp(k, key) != 0) {
      p = skip(p);
      if (!p) return fail("malformed layer_blob_layouts");
      p = ws(p);
      if (*p == ',') p++;
      continue;
    }
    p = ws(p);
    if (*p++ != '[') return fail("malformed layout");
    *n = 0;
    for (;;) {
      p = ws(p);
      if (*p == ']') return 0;
      if (*n == MAX_ITEMS) return fail("too many items in the layout");
      p = item(p, &items[(*n)++]);
      if (!p) return fail("malformed layout item");
      p = ws(p);
      if (*p == ',') p++;
    }
  }
}

static float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  uint32_t bits;
  float f;
  if (exp == 0) {
    /* zero or subnormal: mant * 2^-24 */
    f = ldexpf((float)mant, -24);
    return sign ? -f : f;
  }
  if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  }
  memcpy(&f, &bits, sizeof f);
  return f;
}

static float bf16_to_f32(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

static uint16_t le16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

/* Row `r` of a [rows, cols] slice, dequantized into out[cols]. */
static int row(const item_t *it, const uint8_t *base, uint64_t r, uint64_t cols, float *out) {
  const uint8_t *s = base + it->offset;
  if (!strcmp(it->dtype, "F32")) {
    memcpy(out, s + r * cols * 4, cols * 4); /* little-endian host */
  } else if (!strcmp(it->dtype, "F16")) {
    for (uint64_t c = 0; c < cols; c++) out[c] = f16_to_f32(le16(s + (r * cols + c) * 2));
  } else if (!strcmp(it->dtype, "BF16")) {
    for (uint64_t c = 0; c < cols; c++) out[c] = bf16_to_f32(le16(s + (r * cols + c) * 2));
  } else if (!strcmp(it->dtype, "Q8_0")) {
    /* Blocks of 32: an f16 scale d, then 32 int8 q; value = d * q. */
    if (cols % 32) return fail("a Q8_0 row is not whole blocks of 32");
    const uint8_t *b = s + r * (cols / 32) * 34;
    for (uint64_t k = 0; k < cols / 32; k++, b += 34) {
      float d = f16_to_f32(le16(b));
      for (int j = 0; j < 32; j++) out[k * 32 + j] = d * (float)(int8_t)b[2 + j];
    }
  } else {
    fprintf(stderr, "expert_ffn: dtype %s (role %s) is not one this example reads (F32, F16, BF16, Q8_0)\n",
            it->dtype, it->role);
    return 1;
  }
  return 0;
}

/* out[rows] = slice[rows0 .. rows0+rows, cols] . x[cols] */
static int matvec(const item_t *it, const uint8_t *base, uint64_t rows0, uint64_t rows, uint64_t cols,
                  const float *x, float *out, float *scratch) {
  for (uint64_t r = 0; r < rows; r++) {
    if (row(it, base, rows0 + r, cols, scratch)) return 1;
    double acc = 0;
    for (uint64_t c = 0; c < cols; c++) acc += (double)scratch[c] * x[c];
    out[r] = (float)acc;
  }
  return 0;
}

static const item_t *find(const item_t *items, int n, const char *role) {
  for (int i = 0; i < n; i++)
    if (!strcmp(items[i].role, role)) return &items[i];
  return NULL;
}

int main(int argc, char **argv) {
  if (argc != 6) {
    fprintf(stderr, "usage: expert_ffn VAULT_DIR LAYER EXPERT INPUT OUTPUT\n");
    return 2;
  }
  unsigned layer = (unsigned)strtoul(argv[2], NULL, 10), expert = (unsigned)strtoul(argv[3], NULL, 10);

  smoe_config cfg;
  smoe_config_init(&cfg);
  cfg.ring_slots = 1;
  cfg.workers = 1;
  cfg.prewarm = 0;
  cfg.freq_path = "";
  smoe_streamer *s = NULL;
  if (smoe_open(argv[1], &cfg, &s) != SMOE_OK) return fail(smoe_last_error());

  item_t items[MAX_ITEMS];
  int n = 0;
  int rc = layout(smoe_vault_metadata(s), layer, items, &n);
  const item_t *gate = find(items, n, "gate"), *up = find(items, n, "up"), *down = find(items, n, "down");
  const item_t *gate_up = find(items, n, "gate_up");
  if (!rc && (!down || !((gate && up) || gate_up)))
    rc = fail("the layout has no gate/up (or gate_up) and down items");
  if (!rc && (down->n_dims != 2 || (gate_up ? gate_up->n_dims : gate->n_dims) != 2))
    rc = fail("expected 2-D gate, up and down slices");
  if (rc) {
    smoe_close(s);
    return rc;
  }
  uint64_t n_embd = down->shape[0], n_ff = down->shape[1];
  const item_t *g = gate_up ? gate_up : gate;
  if (g->shape[1] != n_embd || g->shape[0] != (gate_up ? 2 * n_ff : n_ff)) {
    smoe_close(s);
    return fail("gate/up and down shapes disagree");
  }

  float *x = calloc(n_embd, sizeof *x), *y = calloc(n_embd, sizeof *y);
  float *hg = calloc(n_ff, sizeof *hg), *hu = calloc(n_ff, sizeof *hu);
  float *scratch = calloc(n_ff > n_embd ? n_ff : n_embd, sizeof *scratch);
  FILE *in = fopen(argv[4], "rb");
  if (!x || !y || !hg || !hu || !scratch || !in || fread(x, sizeof *x, n_embd, in) != n_embd) {
    if (in) fclose(in);
    smoe_close(s);
    return fail("cannot read n_embd f32 values from INPUT");
  }
  fclose(in);

  smoe_slot slot;
  smoe_status st = smoe_claim_wait(s, layer, expert, 10000000000ull, &slot);
  if (st != SMOE_OK) {
    fprintf(stderr, "expert_ffn: claim of layer %u expert %u: %s\n", layer, expert,
            st == SMOE_PENDING ? "timed out" : smoe_last_error());
    smoe_close(s);
    return 1;
  }
  const uint8_t *blob = slot.data;
  if (gate_up) {
    rc = matvec(gate_up, blob, 0, n_ff, n_embd, x, hg, scratch) ||
         matvec(gate_up, blob, n_ff, n_ff, n_embd, x, hu, scratch);
  } else {
    rc = matvec(gate, blob, 0, n_ff, n_embd, x, hg, scratch) || matvec(up, blob, 0, n_ff, n_embd, x, hu, scratch);
  }
  if (!rc) {
    for (uint64_t i = 0; i < n_ff; i++) hg[i] = hg[i] / (1.0f + expf(-hg[i])) * hu[i];
    rc = matvec(down, blob, 0, n_embd, n_ff, hg, y, scratch);
  }
  smoe_release(s, &slot);
  smoe_close(s);
  if (rc) return rc;

  FILE *out = fopen(argv[5], "wb");
  if (!out || fwrite(y, sizeof *y, n_embd, out) != n_embd || fclose(out) != 0)
    return fail("cannot write OUTPUT");
  free(x);
  free(y);
  free(hg);
  free(hu);
  free(scratch);
  return 0;
}
