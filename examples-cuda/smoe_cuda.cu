/*
 * smoe-cuda: a CUDA host for smoe's ring. It registers the ring once
 * (`cudaHostRegister(..., cudaHostRegisterMapped)` over `smoe_ring_region`)
 * and works on claimed slots from the GPU.
 *
 *   smoe-cuda experts  VAULT                    the (layer, expert) pairs that have a blob layout
 *   smoe-cuda ffn      VAULT INPUT REFDIR       every expert's SwiGLU output on the GPU, two ways,
 *                                               against REFDIR/L-E.f32 (examples-c/expert_ffn)
 *   smoe-cuda register VAULT [options]          what registering the ring costs (time, RSS, pins)
 *   smoe-cuda input    VAULT PATH               write a test input x (n_embd f32 values) for ffn
 *   smoe-cuda dontneed [--mib N]                what MADV_DONTNEED does to a registered mapping
 *   smoe-cuda squeeze  VAULT [options]          the elastic ring under a cgroup's pressure, registered or not
 *   smoe-cuda stream   VAULT [options]          stream every expert through the ring into the GPU
 *   smoe-cuda h2d      [--mib N] [--chunk-mib C] host-to-device copy limit from pinned memory
 *   smoe-cuda read     FILE [options]           a file's read limit (threads, O_DIRECT, destination)
 *
 * The FFN: y = down . (silu(gate . x) * (up . x)), with the slices where the
 * vault's metadata ("layer_blob_layouts", docs/format.md) puts them, read
 * in place in F32, F16, BF16 or Q8_0, gate_up fused or not; the same
 * computation as examples-c/expert_ffn.c, its CPU reference. Way (a),
 * zero-copy: the kernels read the slot through its mapped device address,
 * over PCIe. Way (b): cudaMemcpyAsync of the slot into a small VRAM cache,
 * then the same kernels read VRAM.
 *
 * Every CUDA and smoe call is checked; a failure prints the call, where and
 * why, and exits 1. docs/c-api.md ("CUDA hosts") and examples-cuda/README.md
 * say what the figures mean.
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "smoe.h"

// ---------------------------------------------------------------------------
// Errors and small helpers.

[[noreturn]] static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("smoe-cuda: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  exit(1);
}

static void cuda_check(cudaError_t e, const char *call, const char *file, int line) {
  if (e != cudaSuccess) die("%s:%d: %s failed: %s (%s)", file, line, call, cudaGetErrorString(e), cudaGetErrorName(e));
}
#define CUDA(call) cuda_check((call), #call, __FILE__, __LINE__)
/* After a kernel launch: a bad launch configuration shows here. */
#define CUDA_LAUNCHED() cuda_check(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)

static void smoe_check(smoe_status st, const char *call) {
  if (st != SMOE_OK) die("%s: %s: %s", call, smoe_status_str(st), smoe_last_error());
}

static double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static const double MIB = 1048576.0;

/* A field of /proc/self/status in KiB (VmRSS, VmPin, VmLck), -1 if absent. */
static long long status_kib(const char *field) {
  FILE *f = fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  long long v = -1;
  size_t n = strlen(field);
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, field, n) && line[n] == ':') v = atoll(line + n + 1);
  fclose(f);
  return v;
}

/* /proc/meminfo MemAvailable in KiB. */
static long long mem_available_kib() {
  FILE *f = fopen("/proc/meminfo", "r");
  if (!f) return -1;
  char line[256];
  long long v = -1;
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, "MemAvailable:", 13)) v = atoll(line + 13);
  fclose(f);
  return v;
}

/* This process's cgroup v2 memory.current in bytes, -1 if there is none. */
static long long cgroup_current() {
  FILE *f = fopen("/proc/self/cgroup", "r");
  if (!f) return -1;
  char line[4096], path[4200] = "";
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, "0::", 3)) {
      line[strcspn(line, "\n")] = 0;
      snprintf(path, sizeof path, "/sys/fs/cgroup%s/memory.current", line + 3);
    }
  fclose(f);
  if (!*path) return -1;
  f = fopen(path, "r");
  if (!f) return -1;
  long long v = -1;
  if (fscanf(f, "%lld", &v) != 1) v = -1;
  fclose(f);
  return v;
}

/* The memory figures a line of `register` and `dontneed` prints. */
struct MemSnap {
  long long rss_kib, pin_kib, lck_kib, avail_kib, cgroup;
  static MemSnap take() {
    return {status_kib("VmRSS"), status_kib("VmPin"), status_kib("VmLck"), mem_available_kib(), cgroup_current()};
  }
};

static void print_mem(const char *what, const MemSnap &m, const MemSnap &base) {
  printf("%-34s RSS %+9.1f MiB, VmPin %+9.1f MiB, VmLck %+8.1f MiB, MemAvailable %+9.1f MiB", what,
         (m.rss_kib - base.rss_kib) / 1024.0, (m.pin_kib - base.pin_kib) / 1024.0,
         (m.lck_kib - base.lck_kib) / 1024.0, (m.avail_kib - base.avail_kib) / 1024.0);
  if (m.cgroup >= 0 && base.cgroup >= 0) printf(", cgroup memory.current %+9.1f MiB", (m.cgroup - base.cgroup) / MIB);
  printf("\n");
}

/* Arguments after the positional ones: --name VALUE or --flag. */
struct Args {
  std::vector<std::string> pos;
  std::map<std::string, std::string> opt;
  Args(int argc, char **argv, int from, const std::vector<std::string> &flags) {
    for (int i = from; i < argc; i++) {
      std::string a = argv[i];
      if (a.rfind("--", 0) == 0) {
        if (std::find(flags.begin(), flags.end(), a) != flags.end()) {
          opt[a] = "1";
        } else {
          if (i + 1 >= argc) die("%s needs a value", a.c_str());
          opt[a] = argv[++i];
        }
      } else {
        pos.push_back(a);
      }
    }
  }
  bool has(const char *name) const { return opt.count(name) != 0; }
  uint64_t num(const char *name, uint64_t dflt) const {
    auto it = opt.find(name);
    if (it == opt.end()) return dflt;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(it->second.c_str(), &end, 10);
    if (errno || *end || end == it->second.c_str()) die("%s: not a number: %s", name, it->second.c_str());
    return v;
  }
  std::string str(const char *name, const char *dflt) const {
    auto it = opt.find(name);
    return it == opt.end() ? dflt : it->second;
  }
};

// ---------------------------------------------------------------------------
// A small JSON reader: enough for the vault's metadata.

struct Json {
  enum Kind { Null, Bool, Number, String, Array, Object } kind = Null;
  double number = 0;
  std::string text;
  std::vector<Json> items;
  std::vector<std::pair<std::string, Json>> members;
  const Json *get(const char *key) const {
    for (auto &m : members)
      if (m.first == key) return &m.second;
    return nullptr;
  }
};

struct JsonParser {
  const char *p;
  void ws() {
    while (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t') p++;
  }
  [[noreturn]] void bad() { die("the vault's metadata is not JSON this reader understands (near \"%.20s\")", p); }
  std::string string() {
    std::string out;
    if (*p++ != '"') bad();
    while (*p != '"') {
      if (!*p) bad();
      if (*p == '\\') {
        p++;
        switch (*p) {
          case 'n': out += '\n'; break;
          case 't': out += '\t'; break;
          case 'r': out += '\r'; break;
          case 'b': out += '\b'; break;
          case 'f': out += '\f'; break;
          case 'u': /* keys and values read here are ASCII; keep a marker */
            for (int i = 0; i < 5; i++)
              if (!*p++) bad();
            out += '?';
            continue;
          default: out += *p; break;
        }
        p++;
        continue;
      }
      out += *p++;
    }
    p++;
    return out;
  }
  Json value(int depth) {
    if (depth > 64) bad();
    Json v;
    ws();
    if (*p == '{') {
      v.kind = Json::Object;
      p++;
      ws();
      if (*p == '}') {
        p++;
        return v;
      }
      for (;;) {
        ws();
        std::string k = string();
        ws();
        if (*p++ != ':') bad();
        v.members.emplace_back(k, value(depth + 1));
        ws();
        if (*p == ',') {
          p++;
          continue;
        }
        if (*p++ != '}') bad();
        return v;
      }
    }
    if (*p == '[') {
      v.kind = Json::Array;
      p++;
      ws();
      if (*p == ']') {
        p++;
        return v;
      }
      for (;;) {
        v.items.push_back(value(depth + 1));
        ws();
        if (*p == ',') {
          p++;
          continue;
        }
        if (*p++ != ']') bad();
        return v;
      }
    }
    if (*p == '"') {
      v.kind = Json::String;
      v.text = string();
      return v;
    }
    if (!strncmp(p, "true", 4) || !strncmp(p, "false", 5)) {
      v.kind = Json::Bool;
      v.number = *p == 't';
      p += *p == 't' ? 4 : 5;
      return v;
    }
    if (!strncmp(p, "null", 4)) {
      p += 4;
      return v;
    }
    char *end;
    v.number = strtod(p, &end);
    if (end == p) bad();
    v.kind = Json::Number;
    p = end;
    return v;
  }
};

// ---------------------------------------------------------------------------
// The vault: its ids (from the file's header) and each layer's blob layout.

enum DType : int { DT_F32 = 0, DT_F16 = 1, DT_BF16 = 2, DT_Q8_0 = 3 };
static const char *dtype_name[] = {"F32", "F16", "BF16", "Q8_0"};

/* One matrix of an expert: `rows` rows of `cols` values starting at row
 * `row0` of the slice at `offset` in the blob. */
struct Matrix {
  DType dtype;
  uint64_t offset, bytes;
  uint32_t rows, cols, row0;
};

struct ExpertLayout {
  Matrix gate, up, down;
  bool fused;
  uint32_t n_embd, n_ff;
  std::string dtypes() const {
    return std::string("gate ") + dtype_name[gate.dtype] + (fused ? " (gate_up)" : "") + ", up " +
           dtype_name[up.dtype] + ", down " + dtype_name[down.dtype];
  }
};

/* The vault's n_layers and n_experts, from the header of experts.smoe
 * (docs/format.md §2.2: magic at 0, n_layers at 16, n_experts at 20). */
static void vault_ids(const char *vault, uint32_t *n_layers, uint32_t *n_experts) {
  std::string path = vault;
  struct stat st;
  if (stat(vault, &st) == 0 && S_ISDIR(st.st_mode)) path += "/experts.smoe";
  FILE *f = fopen(path.c_str(), "rb");
  unsigned char h[24];
  if (!f || fread(h, 1, sizeof h, f) != sizeof h) die("cannot read the header of %s", path.c_str());
  fclose(f);
  if (memcmp(h, "SMOEVALT", 8)) die("%s is not a vault (no SMOEVALT magic)", path.c_str());
  *n_layers = h[16] | h[17] << 8 | h[18] << 16 | (uint32_t)h[19] << 24;
  *n_experts = h[20] | h[21] << 8 | h[22] << 16 | (uint32_t)h[23] << 24;
}

static DType parse_dtype(const std::string &s, const std::string &role) {
  for (int i = 0; i < 4; i++)
    if (s == dtype_name[i]) return (DType)i;
  die("dtype %s (role %s) is not one this host reads (F32, F16, BF16, Q8_0)", s.c_str(), role.c_str());
}

static uint64_t row_bytes(DType t, uint32_t cols) {
  switch (t) {
    case DT_F32: return 4ull * cols;
    case DT_F16:
    case DT_BF16: return 2ull * cols;
    case DT_Q8_0: return cols / 32 * 34ull;
  }
  return 0;
}

/* Every layer's layout, keyed by layer. */
static std::map<uint32_t, ExpertLayout> read_layouts(const char *metadata) {
  JsonParser jp{metadata};
  Json meta = jp.value(0);
  const Json *all = meta.get("layer_blob_layouts");
  if (!all || all->kind != Json::Object)
    die("the vault's metadata has no layer_blob_layouts (not written by smoe pack?)");
  std::map<uint32_t, ExpertLayout> out;
  for (auto &m : all->members) {
    uint32_t layer = (uint32_t)strtoul(m.first.c_str(), nullptr, 10);
    std::map<std::string, Matrix> by_role;
    std::map<std::string, std::vector<uint64_t>> shape;
    for (auto &it : m.second.items) {
      const Json *role = it.get("role"), *dtype = it.get("dtype"), *off = it.get("offset"), *bytes = it.get("bytes"),
                 *shp = it.get("shape");
      if (!role || !dtype || !off || !bytes || !shp) die("layer %u: a layout item lacks role/dtype/offset/bytes/shape", layer);
      Matrix mx{};
      mx.dtype = parse_dtype(dtype->text, role->text);
      mx.offset = (uint64_t)off->number;
      mx.bytes = (uint64_t)bytes->number;
      by_role[role->text] = mx;
      for (auto &d : shp->items) shape[role->text].push_back((uint64_t)d.number);
    }
    ExpertLayout L{};
    L.fused = by_role.count("gate_up") != 0;
    if (!by_role.count("down") || !(L.fused || (by_role.count("gate") && by_role.count("up"))))
      die("layer %u: the layout has no gate/up (or gate_up) and down items", layer);
    const std::string g = L.fused ? "gate_up" : "gate";
    if (shape["down"].size() != 2 || shape[g].size() != 2) die("layer %u: expected 2-D gate, up and down slices", layer);
    L.n_embd = (uint32_t)shape["down"][0];
    L.n_ff = (uint32_t)shape["down"][1];
    if (shape[g][1] != L.n_embd || shape[g][0] != (L.fused ? 2ull : 1ull) * L.n_ff)
      die("layer %u: gate/up and down shapes disagree", layer);
    L.down = by_role["down"];
    L.down.rows = L.n_embd;
    L.down.cols = L.n_ff;
    L.gate = by_role[g];
    L.gate.rows = L.n_ff;
    L.gate.cols = L.n_embd;
    L.up = L.fused ? L.gate : by_role["up"];
    L.up.rows = L.n_ff;
    L.up.cols = L.n_embd;
    if (L.fused) L.up.row0 = L.n_ff;
    for (Matrix *mx : {&L.gate, &L.up, &L.down}) {
      if (mx->dtype == DT_Q8_0 && mx->cols % 32) die("layer %u: a Q8_0 row is not whole blocks of 32", layer);
      uint64_t align = mx->dtype == DT_F32 ? 4 : 2;
      if (mx->offset % align) die("layer %u: a %s slice at blob offset %llu is not %llu-byte aligned", layer,
                                  dtype_name[mx->dtype], (unsigned long long)mx->offset, (unsigned long long)align);
      if ((mx->row0 + (uint64_t)mx->rows) * row_bytes(mx->dtype, mx->cols) > mx->bytes)
        die("layer %u: a slice's rows run past its bytes", layer);
    }
    out[layer] = L;
  }
  return out;
}

/* A streamer with the settings a CUDA host opens with (docs/c-api.md, "CUDA
 * hosts"): `pinned`, which makes the ring fixed and populated in the
 * background; no pre-warm thread and no histogram file for these runs. The
 * register and squeeze measurements turn `pinned` off to show why. */
struct Open {
  uint32_t slots = 0, slot_mb = 0, workers = 0, populate = 0, elastic = 1, direct_io = 0, pinned = 1;
};

static smoe_streamer *open_vault(const char *vault, const Open &o) {
  smoe_config cfg;
  smoe_check(smoe_config_init(&cfg), "smoe_config_init");
  cfg.ring_slots = o.slots;
  cfg.slot_mb = o.slot_mb;
  cfg.workers = o.workers;
  cfg.direct_io = o.direct_io;
  cfg.prewarm = 0;
  cfg.freq_path = "";
  cfg.populate = o.populate;
  cfg.elastic = o.elastic;
  cfg.pinned = o.pinned;
  smoe_streamer *s = nullptr;
  smoe_check(smoe_open(vault, &cfg, &s), "smoe_open");
  return s;
}

/* The ring, registered once, mapped for the GPU. */
struct Ring {
  uint8_t *base = nullptr, *dev = nullptr;
  uint64_t bytes = 0, slot_bytes = 0;
  double register_s = 0;
  void region(smoe_streamer *s) {
    void *b;
    smoe_check(smoe_ring_region(s, &b, &bytes, &slot_bytes), "smoe_ring_region");
    base = (uint8_t *)b;
  }
  void register_mapped() {
    double t = now_s();
    CUDA(cudaHostRegister(base, bytes, cudaHostRegisterMapped));
    register_s = now_s() - t;
    void *d;
    CUDA(cudaHostGetDevicePointer(&d, base, 0));
    dev = (uint8_t *)d;
  }
  void unregister() { CUDA(cudaHostUnregister(base)); }
  /* The device address of a claimed slot's data. */
  const uint8_t *device(const smoe_slot &slot) const { return dev + (slot.data - base); }
};

// ---------------------------------------------------------------------------
// Kernels.

/* One matrix as a kernel sees it: its first row's address (in VRAM or the
 * mapped ring) and its shape. */
struct DMatrix {
  const uint8_t *rows;
  int dtype;
  uint32_t n_rows, cols;
  uint64_t row_bytes;
};

__device__ __forceinline__ float f16_bits(uint16_t h) { return __half2float(__ushort_as_half(h)); }

/* The dot product of row r with v, by one warp (lane l takes columns l,
 * l + 32, ...; for Q8_0 that is one value of each block of 32, the block's
 * scale read by all lanes at once). */
__device__ float row_dot(const DMatrix &m, uint32_t r, const float *v) {
  const uint8_t *row = m.rows + r * m.row_bytes;
  const unsigned lane = threadIdx.x & 31;
  float acc = 0;
  switch (m.dtype) {
    case DT_F32:
      for (uint32_t c = lane; c < m.cols; c += 32) acc += ((const float *)row)[c] * v[c];
      break;
    case DT_F16:
      for (uint32_t c = lane; c < m.cols; c += 32) acc += f16_bits(((const uint16_t *)row)[c]) * v[c];
      break;
    case DT_BF16:
      for (uint32_t c = lane; c < m.cols; c += 32)
        acc += __uint_as_float((uint32_t)((const uint16_t *)row)[c] << 16) * v[c];
      break;
    case DT_Q8_0:
      for (uint32_t k = 0; k < m.cols / 32; k++) {
        const uint8_t *b = row + k * 34;
        float d = f16_bits((uint16_t)(b[0] | b[1] << 8));
        acc += d * (float)(int8_t)b[2 + lane] * v[k * 32 + lane];
      }
      break;
  }
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
  return acc;
}

constexpr int WARPS_PER_BLOCK = 8;

/* h[r] = silu(gate_r . x) * (up_r . x), one warp per row. */
__global__ void gate_up_kernel(DMatrix gate, DMatrix up, const float *x, float *h) {
  uint32_t r = blockIdx.x * WARPS_PER_BLOCK + threadIdx.x / 32;
  if (r >= gate.n_rows) return;
  float g = row_dot(gate, r, x), u = row_dot(up, r, x);
  if ((threadIdx.x & 31) == 0) h[r] = g / (1.0f + expf(-g)) * u;
}

/* y[r] = down_r . h, one warp per row. */
__global__ void down_kernel(DMatrix down, const float *h, float *y) {
  uint32_t r = blockIdx.x * WARPS_PER_BLOCK + threadIdx.x / 32;
  if (r >= down.n_rows) return;
  float acc = row_dot(down, r, h);
  if ((threadIdx.x & 31) == 0) y[r] = acc;
}

static DMatrix dmatrix(const uint8_t *blob, const Matrix &m) {
  uint64_t rb = row_bytes(m.dtype, m.cols);
  return {blob + m.offset + m.row0 * rb, m.dtype, m.rows, m.cols, rb};
}

/* Runs the expert whose blob is at `blob` (a device address) on x; y on the device. */
static void launch_ffn(const ExpertLayout &L, const uint8_t *blob, const float *x, float *h, float *y, cudaStream_t st) {
  const int threads = 32 * WARPS_PER_BLOCK;
  gate_up_kernel<<<(L.n_ff + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK, threads, 0, st>>>(dmatrix(blob, L.gate),
                                                                                      dmatrix(blob, L.up), x, h);
  CUDA_LAUNCHED();
  down_kernel<<<(L.n_embd + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK, threads, 0, st>>>(dmatrix(blob, L.down), h, y);
  CUDA_LAUNCHED();
}

/* Reads every 16-byte word of n bytes at p (a mapped slot) and folds them
 * into out[blockIdx.x]: the zero-copy stream's consumer. */
__global__ void touch_kernel(const uint4 *p, uint64_t words, unsigned long long *out) {
  unsigned long long acc = 0;
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < words; i += (uint64_t)gridDim.x * blockDim.x) {
    uint4 w = p[i];
    acc += (unsigned long long)w.x + w.y + w.z + w.w;
  }
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0) atomicAdd(&out[blockIdx.x], acc);
}

/* Byte sum of n bytes at p, by the GPU (p: a device address). */
__global__ void byte_sum_kernel(const uint8_t *p, uint64_t n, unsigned long long *out) {
  unsigned long long acc = 0;
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x)
    acc += p[i];
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0) atomicAdd(out, acc);
}

static unsigned long long gpu_byte_sum(const uint8_t *dev, uint64_t n) {
  unsigned long long *d, h = 0;
  CUDA(cudaMalloc(&d, sizeof *d));
  CUDA(cudaMemset(d, 0, sizeof *d));
  byte_sum_kernel<<<132, 256>>>(dev, n, d);
  CUDA_LAUNCHED();
  CUDA(cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost));
  CUDA(cudaFree(d));
  return h;
}

static unsigned long long cpu_byte_sum(const uint8_t *p, uint64_t n) {
  unsigned long long s = 0;
  for (uint64_t i = 0; i < n; i++) s += p[i];
  return s;
}

// ---------------------------------------------------------------------------
// experts, ffn

static std::vector<std::pair<uint32_t, uint32_t>> layout_experts(smoe_streamer *s, const char *vault,
                                                                  const std::map<uint32_t, ExpertLayout> &layouts) {
  uint32_t n_layers, n_experts;
  vault_ids(vault, &n_layers, &n_experts);
  std::vector<std::pair<uint32_t, uint32_t>> out;
  for (auto &l : layouts)
    for (uint32_t e = 0; e < n_experts; e++) {
      uint64_t size, padded, offset;
      if (smoe_expert_info(s, l.first, e, &size, &padded, &offset) == SMOE_OK) out.emplace_back(l.first, e);
    }
  return out;
}

static int cmd_experts(const Args &a) {
  if (a.pos.size() != 1) die("usage: smoe-cuda experts VAULT");
  Open o;
  o.slots = 1;
  o.workers = 1;
  o.pinned = 0;
  smoe_streamer *s = open_vault(a.pos[0].c_str(), o);
  auto layouts = read_layouts(smoe_vault_metadata(s));
  for (auto &p : layout_experts(s, a.pos[0].c_str(), layouts)) printf("%u %u\n", p.first, p.second);
  smoe_close(s);
  return 0;
}

static std::vector<float> read_f32(const std::string &path, size_t n) {
  std::vector<float> v(n);
  FILE *f = fopen(path.c_str(), "rb");
  if (!f || fread(v.data(), sizeof(float), n, f) != n) die("cannot read %zu f32 values from %s", n, path.c_str());
  fclose(f);
  return v;
}

/* ‖got − ref‖ / ‖ref‖, the measure pack/tests/models.rs applies to expert_ffn. */
static double rel_error(const std::vector<float> &got, const std::vector<float> &ref) {
  double e = 0, n = 0;
  for (size_t i = 0; i < ref.size(); i++) {
    e += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
    n += (double)ref[i] * ref[i];
  }
  return std::sqrt(e) / std::max(std::sqrt(n), 1e-30);
}

/* A few VRAM slots holding copies of claimed experts, least recently used
 * reused first: way (b)'s cache. */
struct VramCache {
  struct Entry {
    uint8_t *data;
    uint64_t key = UINT64_MAX, used = 0;
  };
  std::vector<Entry> entries;
  uint64_t clock = 0, copies = 0, hits = 0;
  VramCache(size_t n, uint64_t slot_bytes) : entries(n) {
    for (auto &e : entries) CUDA(cudaMalloc(&e.data, slot_bytes));
  }
  ~VramCache() {
    for (auto &e : entries) cudaFree(e.data);
  }
  /* The VRAM copy of the claimed slot, copied on `st` if it is not there. */
  const uint8_t *get(const smoe_slot &slot, cudaStream_t st) {
    uint64_t key = (uint64_t)slot.layer << 32 | slot.expert;
    Entry *victim = &entries[0];
    for (auto &e : entries) {
      if (e.key == key) {
        e.used = ++clock;
        hits++;
        return e.data;
      }
      if (e.used < victim->used) victim = &e;
    }
    CUDA(cudaMemcpyAsync(victim->data, slot.data, slot.size, cudaMemcpyHostToDevice, st));
    victim->key = key;
    victim->used = ++clock;
    copies++;
    return victim->data;
  }
};

static int cmd_ffn(const Args &a) {
  if (a.pos.size() != 3) die("usage: smoe-cuda ffn VAULT INPUT REFDIR [--tolerance T]");
  const char *vault = a.pos[0].c_str();
  double tolerance = std::stod(a.str("--tolerance", "1e-3"));
  Open o;
  o.slots = (uint32_t)a.num("--slots", 8);
  o.workers = 4;
  smoe_streamer *s = open_vault(vault, o);
  Ring ring;
  ring.region(s);
  ring.register_mapped();
  auto layouts = read_layouts(smoe_vault_metadata(s));
  auto experts = layout_experts(s, vault, layouts);
  if (experts.empty()) die("%s: no experts with a blob layout", vault);
  uint32_t n_embd = layouts.begin()->second.n_embd, n_ff_max = 0;
  for (auto &l : layouts) {
    if (l.second.n_embd != n_embd) die("layers of different n_embd; this host takes one INPUT");
    n_ff_max = std::max(n_ff_max, l.second.n_ff);
  }
  std::vector<float> x = read_f32(a.pos[1], n_embd);

  cudaStream_t st;
  CUDA(cudaStreamCreate(&st));
  float *dx, *dh, *dy;
  CUDA(cudaMalloc(&dx, n_embd * sizeof(float)));
  CUDA(cudaMalloc(&dh, n_ff_max * sizeof(float)));
  CUDA(cudaMalloc(&dy, n_embd * sizeof(float)));
  CUDA(cudaMemcpy(dx, x.data(), n_embd * sizeof(float), cudaMemcpyHostToDevice));
  VramCache cache(4, ring.slot_bytes);

  std::map<std::string, std::pair<double, double>> worst;  // by dtypes: (zero-copy, copy)
  std::map<std::string, int> count;
  std::vector<float> y(n_embd);
  bool ok = true;
  for (auto &le : experts) {
    const ExpertLayout &L = layouts.at(le.first);
    char ref_path[4200];
    snprintf(ref_path, sizeof ref_path, "%s/%u-%u.f32", a.pos[2].c_str(), le.first, le.second);
    std::vector<float> ref = read_f32(ref_path, n_embd);
    smoe_slot slot;
    smoe_check(smoe_claim_wait(s, le.first, le.second, 10000000000ull, &slot), "smoe_claim_wait");
    double err[2];
    for (int way = 0; way < 2; way++) {
      const uint8_t *blob = way == 0 ? ring.device(slot) : cache.get(slot, st);
      launch_ffn(L, blob, dx, dh, dy, st);
      CUDA(cudaMemcpyAsync(y.data(), dy, n_embd * sizeof(float), cudaMemcpyDeviceToHost, st));
      CUDA(cudaStreamSynchronize(st));
      err[way] = rel_error(y, ref);
    }
    smoe_check(smoe_release(s, &slot), "smoe_release");  // both ways have read the slot
    std::string key = L.dtypes();
    auto &w = worst[key];
    w.first = std::max(w.first, err[0]);
    w.second = std::max(w.second, err[1]);
    count[key]++;
    if (!(err[0] <= tolerance && err[1] <= tolerance)) {
      ok = false;
      fprintf(stderr, "smoe-cuda: layer %u expert %u: relative error %.3g (zero-copy), %.3g (copy) > %g\n", le.first,
              le.second, err[0], err[1], tolerance);
    }
  }
  for (auto &w : worst)
    printf("ffn: %s: %d experts, n_embd %u; max relative error vs expert_ffn: zero-copy %.3g, copy %.3g (bound %g)\n",
           w.first.c_str(), count[w.first], n_embd, w.second.first, w.second.second, tolerance);
  printf("ffn: VRAM cache: %llu copies, %llu hits\n", (unsigned long long)cache.copies, (unsigned long long)cache.hits);
  CUDA(cudaFree(dx));
  CUDA(cudaFree(dh));
  CUDA(cudaFree(dy));
  CUDA(cudaStreamDestroy(st));
  ring.unregister();
  smoe_close(s);
  return ok ? 0 : 1;
}

// ---------------------------------------------------------------------------
// register, dontneed

static int cmd_register(const Args &a) {
  if (a.pos.size() != 1)
    die("usage: smoe-cuda register VAULT [--slots N] [--slot-mb M] [--populate 0|1] [--elastic 0|1] [--pinned] "
        "[--wait-populate] [--hold-s S]");
  const char *vault = a.pos[0].c_str();
  CUDA(cudaFree(0));  // the context first, so that its memory is not counted as the ring's
  MemSnap base = MemSnap::take();
  Open o;
  o.slots = (uint32_t)a.num("--slots", 64);
  o.slot_mb = (uint32_t)a.num("--slot-mb", 128);
  o.workers = 4;
  o.populate = (uint32_t)a.num("--populate", 0);
  o.elastic = (uint32_t)a.num("--elastic", 0);
  o.pinned = a.has("--pinned");
  double t = now_s();
  smoe_streamer *s = open_vault(vault, o);
  double open_s = now_s() - t;
  Ring ring;
  ring.region(s);
  printf("register: ring %.2f GiB (%llu slots x %.0f MiB), populate %u, elastic %u, pinned %u; smoe_open %.2f ms\n",
         ring.bytes / (1024 * MIB), (unsigned long long)(ring.bytes / ring.slot_bytes), ring.slot_bytes / MIB,
         o.populate, o.elastic, o.pinned, open_s * 1e3);
  print_mem("after smoe_open", MemSnap::take(), base);
  if (a.has("--wait-populate")) {
    t = now_s();
    while (MemSnap::take().rss_kib - base.rss_kib < (long long)(ring.bytes / 1024) * 99 / 100 && now_s() - t < 120)
      usleep(20000);
    printf("register: populate committed the ring in %.2f s\n", now_s() - t);
    print_mem("after populate", MemSnap::take(), base);
  }
  ring.register_mapped();
  printf("register: cudaHostRegister(%.2f GiB, mapped) took %.3f s (%.2f GB/s)\n", ring.bytes / (1024 * MIB),
         ring.register_s, ring.bytes / ring.register_s / 1e9);
  print_mem("after cudaHostRegister", MemSnap::take(), base);

  /* The ring still works: claim a few experts, the GPU's byte sum through
   * the mapping equals the CPU's. */
  uint32_t n_layers, n_experts;
  vault_ids(vault, &n_layers, &n_experts);
  int checked = 0;
  for (uint32_t l = 0; l < n_layers && checked < 8; l++)
    for (uint32_t e = 0; e < n_experts && checked < 8; e++) {
      uint64_t size, padded, offset;
      if (smoe_expert_info(s, l, e, &size, &padded, &offset) != SMOE_OK) continue;
      smoe_slot slot;
      smoe_check(smoe_claim_wait(s, l, e, 10000000000ull, &slot), "smoe_claim_wait");
      if (gpu_byte_sum(ring.device(slot), slot.size) != cpu_byte_sum(slot.data, slot.size))
        die("layer %u expert %u: the GPU reads other bytes than the CPU through the mapped ring", l, e);
      smoe_check(smoe_release(s, &slot), "smoe_release");
      checked++;
    }
  printf("register: %d claims read through the mapping, GPU byte sums equal the CPU's\n", checked);
  uint64_t hold = a.num("--hold-s", 0);
  if (hold) {
    /* Let the elastic monitor (if on) see the committed ring. */
    sleep((unsigned)hold);
    smoe_stats stats;
    stats.struct_size = sizeof stats;
    smoe_check(smoe_get_stats(s, &stats), "smoe_get_stats");
    printf("register: after %llu s: slots_active %llu of %llu, shrinks %llu, grows %llu\n", (unsigned long long)hold,
           (unsigned long long)stats.slots_active, (unsigned long long)stats.ring_slots,
           (unsigned long long)stats.shrinks, (unsigned long long)stats.grows);
    print_mem("after the hold", MemSnap::take(), base);
  }
  t = now_s();
  ring.unregister();
  printf("register: cudaHostUnregister took %.3f s\n", now_s() - t);
  print_mem("after cudaHostUnregister", MemSnap::take(), base);
  t = now_s();
  smoe_close(s);
  printf("register: smoe_close took %.3f s\n", now_s() - t);
  print_mem("after smoe_close", MemSnap::take(), base);
  return 0;
}

/* What the elastic ring's release of an idle slot (MADV_DONTNEED) does to
 * memory a GPU has registered: an anonymous mapping like the ring's,
 * registered, released, written again. */
static int cmd_dontneed(const Args &a) {
  uint64_t bytes = a.num("--mib", 1024) << 20;
  CUDA(cudaFree(0));
  MemSnap base = MemSnap::take();
  uint8_t *p = (uint8_t *)mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) die("mmap of %llu bytes: %s", (unsigned long long)bytes, strerror(errno));
  memset(p, 0xA5, bytes);
  print_mem("dontneed: written 0xA5", MemSnap::take(), base);
  CUDA(cudaHostRegister(p, bytes, cudaHostRegisterMapped));
  void *dv;
  CUDA(cudaHostGetDevicePointer(&dv, p, 0));
  print_mem("dontneed: registered", MemSnap::take(), base);
  if (madvise(p, bytes, MADV_DONTNEED)) die("madvise(MADV_DONTNEED): %s", strerror(errno));
  print_mem("dontneed: after MADV_DONTNEED", MemSnap::take(), base);
  printf("dontneed: CPU reads 0x%02X after MADV_DONTNEED\n", p[0]);
  memset(p, 0x5A, bytes);  // what a worker's next load into the slot does
  print_mem("dontneed: written 0x5A again", MemSnap::take(), base);
  unsigned long long want = 0x5Aull * bytes, zero_copy = gpu_byte_sum((const uint8_t *)dv, bytes);
  std::vector<uint8_t> back(1 << 20);
  uint8_t *d;
  CUDA(cudaMalloc(&d, 1 << 20));
  CUDA(cudaMemcpy(d, p, 1 << 20, cudaMemcpyHostToDevice));
  CUDA(cudaMemcpy(back.data(), d, 1 << 20, cudaMemcpyDeviceToHost));
  CUDA(cudaFree(d));
  printf("dontneed: the GPU's zero-copy byte sum %s the CPU's (%s); cudaMemcpy from the registered pointer copied 0x%02X "
         "(CPU holds 0x5A)\n",
         zero_copy == want ? "equals" : "DIFFERS from", zero_copy == 0xA5ull * bytes ? "it reads the old 0xA5 pages" : "",
         back[0]);
  CUDA(cudaHostUnregister(p));
  print_mem("dontneed: unregistered", MemSnap::take(), base);
  munmap(p, bytes);
  print_mem("dontneed: unmapped", MemSnap::take(), base);
  return 0;
}


/* This process's cgroup v2 directory, "" if none. */
static std::string cgroup_dir() {
  FILE *f = fopen("/proc/self/cgroup", "r");
  if (!f) return "";
  char line[4096];
  std::string dir;
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, "0::", 3)) {
      line[strcspn(line, "\n")] = 0;
      dir = std::string("/sys/fs/cgroup") + (line + 3);
    }
  fclose(f);
  return dir;
}

static smoe_stats get_stats(smoe_streamer *s) {
  smoe_stats stats;
  stats.struct_size = sizeof stats;
  smoe_check(smoe_get_stats(s, &stats), "smoe_get_stats");
  return stats;
}

/* The elastic ring under pressure, with the ring registered (or, with
 * --no-register, not): fill the ring, set the cgroup's memory.max a little
 * above what the process uses, let a neighbour (this process, another
 * mapping) take memory step by step, and watch what the monitor takes offline
 * and what memory comes back. Then free the neighbour, let the ring grow,
 * load other experts into its slots and compare what the GPU reads through
 * the mapping with what the CPU reads. Run it alone in a cgroup of its own
 * (scripts/cuda.sh does): it lowers that cgroup's memory.max. */
static int cmd_squeeze(const Args &a) {
  if (a.pos.size() != 1)
    die("usage: smoe-cuda squeeze VAULT [--slots N] [--slot-mb M] [--headroom-mib H] [--step-mib S] [--no-register] "
        "[--pinned]");
  const char *vault = a.pos[0].c_str();
  bool reg = !a.has("--no-register"), pinned = a.has("--pinned");
  std::string cg = cgroup_dir();
  if (cg.empty() || access((cg + "/memory.max").c_str(), W_OK)) die("squeeze needs a cgroup v2 whose memory.max it may write (run it in a cgroup of its own, as root)");
  CUDA(cudaFree(0));
  Open o;
  o.slots = (uint32_t)a.num("--slots", 32);
  o.slot_mb = (uint32_t)a.num("--slot-mb", 32);
  o.workers = 4;
  o.populate = 0;
  o.elastic = 1;
  o.pinned = pinned;  // elastic is left on: pinned must turn it off
  smoe_streamer *s = open_vault(vault, o);
  Ring ring;
  ring.region(s);
  uint32_t slots = (uint32_t)(ring.bytes / ring.slot_bytes), n_layers, n_experts;
  if (reg) ring.register_mapped();
  vault_ids(vault, &n_layers, &n_experts);
  std::vector<std::pair<uint32_t, uint32_t>> order;
  for (uint32_t l = 0; l < n_layers; l++)
    for (uint32_t e = 0; e < n_experts; e++) {
      uint64_t size, padded, offset;
      if (smoe_expert_info(s, l, e, &size, &padded, &offset) == SMOE_OK) order.emplace_back(l, e);
    }
  if (order.size() < 2ull * slots) die("the vault needs at least twice the ring's %u slots of experts", slots);
  for (uint32_t i = 0; i < slots; i++) {  // fill the ring
    smoe_slot slot;
    smoe_check(smoe_claim_wait(s, order[i].first, order[i].second, 30000000000ull, &slot), "smoe_claim_wait");
    smoe_check(smoe_release(s, &slot), "smoe_release");
  }
  long long used = cgroup_current(), headroom = (long long)a.num("--headroom-mib", 768) << 20;
  long long limit = used + headroom;
  FILE *mf = fopen((cg + "/memory.max").c_str(), "w");
  if (!mf || fprintf(mf, "%lld\n", limit) < 0 || fclose(mf)) die("cannot write %s/memory.max", cg.c_str());
  printf("squeeze: ring %u x %.0f MiB, elastic 1, pinned %d, %s, filled; cgroup memory.current %.0f MiB, memory.max set to %.0f MiB\n", slots,
         ring.slot_bytes / MIB, (int)pinned, reg ? "registered (cudaHostRegister, mapped)" : "not registered", used / MIB, limit / MIB);
  uint64_t step = a.num("--step-mib", 32) << 20;
  std::vector<std::pair<uint8_t *, uint64_t>> neighbour;
  uint64_t taken = 0;
  int at_limit = 0;
  double t0 = now_s();
  for (int i = 0; i < 200; i++) {
    long long cur = cgroup_current();
    smoe_stats st = get_stats(s);
    printf("squeeze: t %5.2f s neighbour %5.0f MiB  memory.current %6.0f MiB  slots_active %3llu  shrinks %llu\n",
           now_s() - t0, taken / MIB, cur / MIB, (unsigned long long)st.slots_active, (unsigned long long)st.shrinks);
    /* Steps until the headroom is under the monitor's low watermark
     * (limit / 16, 32 MiB to 1 GiB; docs/c-api.md, "Elastic ring"), and
     * no further: 48 MiB short of the limit, clear of the OOM killer. A
     * ring that does not shrink (pinned) is given 2 s at the limit. */
    if (cur + (long long)step + (48ll << 20) > limit) {
      if (st.slots_active <= 8 || now_s() - t0 > 20) break;
      if (pinned && ++at_limit > 8) break;
      usleep(250000);
      continue;
    }
    uint8_t *p = (uint8_t *)mmap(nullptr, step, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) die("mmap: %s", strerror(errno));
    memset(p, 1, step);
    neighbour.emplace_back(p, step);
    taken += step;
    usleep(250000);
  }
  smoe_stats st = get_stats(s);
  printf("squeeze: the neighbour got %.0f MiB; the ring is down to %llu of %u slots (%llu shrinks), RSS %.0f MiB, memory.current %.0f MiB\n",
         taken / MIB, (unsigned long long)st.slots_active, slots, (unsigned long long)st.shrinks,
         status_kib("VmRSS") / 1024.0, cgroup_current() / MIB);
  for (auto &n : neighbour) munmap(n.first, n.second);
  /* No limit from here on: a registered ring's released pages are still
   * held, and the slots that come back commit new ones. */
  mf = fopen((cg + "/memory.max").c_str(), "w");
  if (!mf || fprintf(mf, "max\n") < 0 || fclose(mf)) die("cannot write %s/memory.max", cg.c_str());
  t0 = now_s();
  while (get_stats(s).slots_active < slots && now_s() - t0 < 10) usleep(50000);
  st = get_stats(s);
  printf("squeeze: neighbour freed; after %.2f s the ring has %llu of %u slots (%llu grows)\n", now_s() - t0,
         (unsigned long long)st.slots_active, slots, (unsigned long long)st.grows);
  /* Load other experts into the slots and compare the two views. */
  int mismatched = 0, checked = 0;
  for (uint32_t i = slots; i < 2 * slots; i++) {
    smoe_slot slot;
    smoe_check(smoe_claim_wait(s, order[i].first, order[i].second, 30000000000ull, &slot), "smoe_claim_wait");
    if (reg && gpu_byte_sum(ring.device(slot), slot.size) != cpu_byte_sum(slot.data, slot.size)) mismatched++;
    checked++;
    smoe_check(smoe_release(s, &slot), "smoe_release");
  }
  printf("squeeze: after %d loads into the grown ring: RSS %.0f MiB, memory.current %.0f MiB\n", checked,
         status_kib("VmRSS") / 1024.0, cgroup_current() / MIB);
  if (reg)
    printf("squeeze: %d of %d claims after the shrink: the GPU read other bytes through the mapping than the CPU reads in the slot\n",
           mismatched, checked);
  if (reg) ring.unregister();
  smoe_close(s);
  return 0;
}

/* A test input: n_embd f32 values, the same for every run. */
static int cmd_input(const Args &a) {
  if (a.pos.size() != 2) die("usage: smoe-cuda input VAULT PATH");
  Open o;
  o.slots = 1;
  o.workers = 1;
  o.pinned = 0;
  smoe_streamer *s = open_vault(a.pos[0].c_str(), o);
  auto layouts = read_layouts(smoe_vault_metadata(s));
  uint32_t n_embd = layouts.begin()->second.n_embd;
  smoe_close(s);
  std::vector<float> x(n_embd);
  for (uint32_t i = 0; i < n_embd; i++) x[i] = (float)std::sin(0.37 * i + 0.1) * (1.0f + 0.5f * (float)(i % 7) / 7.0f);
  FILE *f = fopen(a.pos[1].c_str(), "wb");
  if (!f || fwrite(x.data(), sizeof(float), n_embd, f) != n_embd || fclose(f)) die("cannot write %s", a.pos[1].c_str());
  return 0;
}

// ---------------------------------------------------------------------------
// stream, h2d, read

static int cmd_stream(const Args &a) {
  if (a.pos.size() != 1)
    die("usage: smoe-cuda stream VAULT [--mode copy|zero-copy|pageable] [--passes N] [--slots N] [--workers N] "
        "[--depth D] [--ahead A]");
  const char *vault = a.pos[0].c_str();
  std::string mode = a.str("--mode", "copy");
  if (mode != "copy" && mode != "zero-copy" && mode != "pageable") die("--mode: copy, zero-copy or pageable");
  CUDA(cudaFree(0));
  Open o;
  o.slots = (uint32_t)a.num("--slots", 256);
  o.workers = (uint32_t)a.num("--workers", 16);
  o.direct_io = (uint32_t)a.num("--direct-io", 0);
  smoe_streamer *s = open_vault(vault, o);
  Ring ring;
  ring.region(s);
  uint32_t slots = (uint32_t)(ring.bytes / ring.slot_bytes);
  if (mode != "pageable") ring.register_mapped();
  uint32_t n_layers, n_experts;
  vault_ids(vault, &n_layers, &n_experts);
  std::vector<std::pair<uint32_t, uint32_t>> order;
  for (uint32_t l = 0; l < n_layers; l++)
    for (uint32_t e = 0; e < n_experts; e++) {
      uint64_t size, padded, offset;
      if (smoe_expert_info(s, l, e, &size, &padded, &offset) == SMOE_OK) order.emplace_back(l, e);
    }
  if (order.size() < 2ull * slots)
    printf("stream: the vault has %zu experts, fewer than twice the ring's %u slots: later passes hit\n", order.size(), slots);
  uint32_t depth = (uint32_t)a.num("--depth", 16);  // copies in flight
  uint32_t ahead = (uint32_t)a.num("--ahead", 64);  // prefetches queued beyond the claim (measured best: docs/performance.md)
  if (depth + ahead + 1 > slots) die("--depth + --ahead must leave a slot: %u + %u >= %u", depth, ahead, slots);
  uint64_t passes = a.num("--passes", 2);
  const int n_streams = 2;
  cudaStream_t streams[n_streams];
  for (auto &st : streams) CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  std::vector<uint8_t *> dbuf(depth);
  for (auto &b : dbuf) CUDA(cudaMalloc(&b, ring.slot_bytes));
  unsigned long long *sums;
  CUDA(cudaMalloc(&sums, 132 * sizeof *sums));
  CUDA(cudaMemset(sums, 0, 132 * sizeof *sums));
  struct InFlight {
    smoe_slot slot;
    cudaEvent_t done;
  };
  std::vector<InFlight> ring_q(depth);
  for (auto &f : ring_q) CUDA(cudaEventCreateWithFlags(&f.done, cudaEventDisableTiming));

  smoe_prewarm_pause(s, true);
  const uint64_t total = order.size() * passes;
  uint64_t next_prefetch = 0, bytes = 0, head = 0, tail = 0;
  double wait_claim = 0, wait_copy = 0;
  double t0 = now_s(), pass_start = t0;
  std::vector<double> pass_s;
  for (uint64_t i = 0; i < total; i++) {
    if (i && i % order.size() == 0) {
      pass_s.push_back(now_s() - pass_start);
      pass_start = now_s();
    }
    while (next_prefetch < total && next_prefetch < i + ahead) {
      auto &p = order[next_prefetch % order.size()];
      smoe_status st = smoe_prefetch(s, p.first, p.second, false);
      if (st == SMOE_ERR_RING_FULL) break;
      smoe_check(st, "smoe_prefetch");
      next_prefetch++;
    }
    if (head - tail == depth) {  // the oldest copy must finish before its slot is released
      double w = now_s();
      InFlight &f = ring_q[tail % depth];
      CUDA(cudaEventSynchronize(f.done));
      smoe_check(smoe_release(s, &f.slot), "smoe_release");
      wait_copy += now_s() - w;
      tail++;
    }
    auto &p = order[i % order.size()];
    InFlight &f = ring_q[head % depth];
    double w = now_s();
    smoe_check(smoe_claim_wait(s, p.first, p.second, 30000000000ull, &f.slot), "smoe_claim_wait");
    wait_claim += now_s() - w;
    cudaStream_t st = streams[head % n_streams];
    if (mode == "zero-copy") {
      touch_kernel<<<132, 512, 0, st>>>((const uint4 *)ring.device(f.slot), f.slot.size / 16, sums);
      CUDA_LAUNCHED();
    } else {
      CUDA(cudaMemcpyAsync(dbuf[head % depth], f.slot.data, f.slot.size, cudaMemcpyHostToDevice, st));
    }
    CUDA(cudaEventRecord(f.done, st));
    bytes += f.slot.size;
    head++;
  }
  while (tail < head) {
    InFlight &f = ring_q[tail % depth];
    CUDA(cudaEventSynchronize(f.done));
    smoe_check(smoe_release(s, &f.slot), "smoe_release");
    tail++;
  }
  double secs = now_s() - t0;
  pass_s.push_back(now_s() - pass_start);
  smoe_stats stats;
  stats.struct_size = sizeof stats;
  smoe_check(smoe_get_stats(s, &stats), "smoe_get_stats");
  printf("stream: %s: %.2f GiB (%llu claims of %.2f MiB, %llu passes) in %.3f s = %.2f GB/s; ring %u slots, %u workers, "
         "direct_io %llu, %u copies and %u prefetches ahead; hits %llu, bytes read %.2f GiB; waited %.3f s for claims, "
         "%.3f s for copies\n",
         mode.c_str(), bytes / (1024 * MIB), (unsigned long long)total, bytes / (double)total / MIB,
         (unsigned long long)passes, secs, bytes / secs / 1e9, slots, (unsigned)stats.workers,
         (unsigned long long)stats.direct_io, depth, ahead, (unsigned long long)stats.hits,
         stats.bytes_read / (1024 * MIB), wait_claim, wait_copy);
  printf("stream: %s: GB/s by pass:", mode.c_str());
  for (double p : pass_s) printf(" %.2f", bytes / (double)passes / p / 1e9);
  printf("\n");
  for (auto &f : ring_q) CUDA(cudaEventDestroy(f.done));
  for (auto &b : dbuf) CUDA(cudaFree(b));
  CUDA(cudaFree(sums));
  for (auto &st : streams) CUDA(cudaStreamDestroy(st));
  if (mode != "pageable") ring.unregister();
  smoe_close(s);
  return 0;
}

static int cmd_h2d(const Args &a) {
  uint64_t bytes = a.num("--mib", 2048) << 20, chunk = a.num("--chunk-mib", 4) << 20;
  if (chunk == 0 || chunk > bytes) die("--chunk-mib must be between 1 and --mib");
  CUDA(cudaFree(0));
  uint8_t *pinned, *dev;
  CUDA(cudaMallocHost(&pinned, bytes));
  memset(pinned, 1, bytes);
  CUDA(cudaMalloc(&dev, bytes));
  cudaStream_t st[2];
  for (auto &x : st) CUDA(cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking));
  /* Also an anonymous mapping registered as the ring is: the same limit? */
  uint8_t *anon = (uint8_t *)mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (anon == MAP_FAILED) die("mmap: %s", strerror(errno));
  memset(anon, 1, bytes);
  CUDA(cudaHostRegister(anon, bytes, cudaHostRegisterMapped));
  const char *names[2] = {"cudaMallocHost", "registered mmap"};
  uint8_t *srcs[2] = {pinned, anon};
  for (int k = 0; k < 2; k++) {
    double best_whole = 0, best_chunked = 0;
    for (int rep = 0; rep < 4; rep++) {
      double t = now_s();
      CUDA(cudaMemcpy(dev, srcs[k], bytes, cudaMemcpyHostToDevice));
      double whole = bytes / (now_s() - t) / 1e9;
      t = now_s();
      for (uint64_t off = 0, i = 0; off < bytes; off += chunk, i++)
        CUDA(cudaMemcpyAsync(dev + off, srcs[k] + off, std::min(chunk, bytes - off), cudaMemcpyHostToDevice, st[i % 2]));
      for (auto &x : st) CUDA(cudaStreamSynchronize(x));
      double chunked = bytes / (now_s() - t) / 1e9;
      if (rep > 0) {  // the first is a warm-up
        best_whole = std::max(best_whole, whole);
        best_chunked = std::max(best_chunked, chunked);
      }
    }
    printf("h2d: %s, %llu MiB: cudaMemcpy %.2f GB/s; %llu MiB cudaMemcpyAsync pieces on 2 streams %.2f GB/s (best of 3)\n",
           names[k], (unsigned long long)(bytes >> 20), best_whole, (unsigned long long)(chunk >> 20), best_chunked);
  }
  CUDA(cudaHostUnregister(anon));
  munmap(anon, bytes);
  for (auto &x : st) CUDA(cudaStreamDestroy(x));
  CUDA(cudaFree(dev));
  CUDA(cudaFreeHost(pinned));
  return 0;
}

/* Reads FILE with T threads, each taking every T-th block of B bytes, with
 * O_DIRECT when --direct; the file's read limit, fio-style. */
static int cmd_read(const Args &a) {
  if (a.pos.size() != 1) die("usage: smoe-cuda read FILE [--threads T] [--block-kib B] [--direct] [--dest-mib N]");
  const char *path = a.pos[0].c_str();
  unsigned threads = (unsigned)a.num("--threads", 16);
  uint64_t block = a.num("--block-kib", 4096) << 10;
  bool direct = a.has("--direct");
  /* --dest-mib N: every thread reads into one shared N MiB buffer, block by
   * block in turn, as the workers read into the ring (writes that reach
   * memory); by default each thread rereads into its own block (writes
   * that may stay in the cache). */
  uint64_t dest_bytes = a.num("--dest-mib", 0) << 20;
  uint8_t *dest = nullptr;
  if (dest_bytes) {
    if (dest_bytes < block) die("--dest-mib must hold a block");
    void *d;
    if (posix_memalign(&d, 1 << 16, dest_bytes)) die("cannot allocate %llu bytes", (unsigned long long)dest_bytes);
    dest = (uint8_t *)d;
    memset(dest, 0, dest_bytes);
  }
  int probe = open(path, O_RDONLY | (direct ? O_DIRECT : 0));
  if (probe < 0) die("open %s%s: %s", path, direct ? " with O_DIRECT" : "", strerror(errno));
  struct stat stt;
  fstat(probe, &stt);
  close(probe);
  uint64_t size = (uint64_t)stt.st_size, blocks = size / block;
  if (blocks == 0) die("%s is smaller than one block", path);
  std::atomic<uint64_t> done{0};
  std::atomic<int> failed{0};
  double t = now_s();
  std::vector<std::thread> pool;
  for (unsigned k = 0; k < threads; k++)
    pool.emplace_back([&, k] {
      int fd = open(path, O_RDONLY | (direct ? O_DIRECT : 0));
      void *buf = nullptr;
      if (fd < 0 || posix_memalign(&buf, 1 << 16, block)) {
        failed = errno ? errno : ENOMEM;
        return;
      }
      for (uint64_t b = k; b < blocks; b += threads) {
        void *to = dest ? dest + b % (dest_bytes / block) * block : buf;
        ssize_t n = pread(fd, to, block, (off_t)(b * block));
        if (n != (ssize_t)block) {
          failed = n < 0 ? errno : EIO;
          break;
        }
        done += block;
      }
      free(buf);
      close(fd);
    });
  for (auto &th : pool) th.join();
  double secs = now_s() - t;
  if (failed) die("read %s: %s", path, strerror(failed));
  char into[64] = "a block per thread";
  if (dest) snprintf(into, sizeof into, "into %llu MiB", (unsigned long long)(dest_bytes >> 20));
  printf("read: %s: %.2f GiB, %u threads, %llu KiB blocks %s, %s: %.3f s = %.2f GB/s\n", path, done / (1024 * MIB),
         threads, (unsigned long long)(block >> 10), into, direct ? "O_DIRECT" : "buffered", secs, done / secs / 1e9);
  free(dest);
  return 0;
}

int main(int argc, char **argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc < 2) {
    fprintf(stderr, "usage: smoe-cuda experts|input|ffn|register|dontneed|squeeze|stream|h2d|read ... (see the source's header)\n");
    return 2;
  }
  std::string cmd = argv[1];
  Args a(argc, argv, 2, {"--wait-populate", "--direct", "--no-register", "--pinned"});
  if (cmd == "experts") return cmd_experts(a);
  if (cmd == "ffn") return cmd_ffn(a);
  if (cmd == "register") return cmd_register(a);
  if (cmd == "dontneed") return cmd_dontneed(a);
  if (cmd == "squeeze") return cmd_squeeze(a);
  if (cmd == "input") return cmd_input(a);
  if (cmd == "stream") return cmd_stream(a);
  if (cmd == "h2d") return cmd_h2d(a);
  if (cmd == "read") return cmd_read(a);
  die("unknown command %s", cmd.c_str());
}
