// Host emulation of kernels/cuda/expert_mma.cu, a CPU test of CI: runs
// the kernels' device code on the CPU, one CTA at a time, its 256 threads as
// cooperative coroutines (deterministic), with the PTX semantics of ldmatrix
// (.trans), mma.m16n8k16 bf16 and cp.async (groups, zero-fill), and checks:
//   - shared memory hazards: a read of a chunk whose cp.async is in flight or
//     completed without a barrier since (RAW), a cp.async into a chunk read in
//     the same barrier phase (WAR), two copies in flight to one chunk (WAW);
//   - cp.async sources inside a registered global buffer, 16-byte aligned;
//     shared addresses inside the stage memory, 16-byte aligned;
//   - warp collectives executed by all 32 lanes with the same op;
//   - every output element written once (FWD / DATA), guard bands untouched;
//   - the results against a double-precision reference.
// The kernel file comes in as kernels/cuda/expert_mma_cu.inc (a copy made by
// the genrule in kernels/cuda/BUILD: Bazel takes no .cu as a header). Under
// AddressSanitizer the test is skipped: its coroutines switch stacks with
// swapcontext, which ASan does not follow.
#include <gtest/gtest.h>
#include <ucontext.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

// ------------------------------------------------------------- CUDA shims
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define MF_CUDA_MAX_EXPERTS 1024
struct mf_bf16 {
  uint16_t x;
};
struct float2 {
  float x, y;
};
struct uint3e {
  unsigned x, y, z;
};

#include <unistd.h>
static void die(const std::string &m) {
  fprintf(stderr, "EMU FAILURE: %s\n", m.c_str());
  fflush(stdout);
  _exit(1);  // not exit(): static destructors would free the coroutine stack in use
}

// ------------------------------------------------------------- threads
enum { NTH = 256, STACK = 256 << 10 };
struct Copy {
  void *dst;
  const void *src;
  bool valid;
};
struct EmuThread {
  ucontext_t ctx;
  uint3e tid;
  bool done;
  std::vector<char> stack;
  std::vector<std::vector<Copy>> groups;  // committed, oldest first
  std::vector<Copy> open;
};
static EmuThread g_th[NTH];
static EmuThread *g_cur;
static uint3e g_block, g_grid;
static ucontext_t g_main;
static uint64_t g_progress;
#define threadIdx (g_cur->tid)
#define blockIdx g_block

static void yield_() {
  swapcontext(&g_cur->ctx, &g_main);
}

// CTA barrier
static int g_cta_arrived;
static uint64_t g_cta_gen, g_phase;
static void __syncthreads() {
  g_progress++;
  const uint64_t gen = g_cta_gen;
  if (++g_cta_arrived == NTH) {
    g_cta_arrived = 0;
    g_cta_gen++;
    g_phase++;
    return;
  }
  while (g_cta_gen == gen) yield_();
}

// warp barrier + exchange
struct WarpX {
  int arrived;
  uint64_t gen;
  int op[32];
  uint64_t slot[32][8];
};
static WarpX g_w[NTH / 32];
static void warp_sync_() {
  WarpX &w = g_w[g_cur->tid.x / 32];
  g_progress++;
  const uint64_t gen = w.gen;
  if (++w.arrived == 32) {
    w.arrived = 0;
    w.gen++;
    return;
  }
  while (w.gen == gen) yield_();
}
// Posts this lane's values with an op tag; returns the warp's slots once all posted.
static WarpX &post(int op, const uint64_t *v, int n) {
  const int lane = g_cur->tid.x & 31;
  WarpX &w = g_w[g_cur->tid.x / 32];
  w.op[lane] = op;
  for (int i = 0; i < n; i++) w.slot[lane][i] = v[i];
  warp_sync_();
  for (int l = 0; l < 32; l++)
    if (w.op[l] != op) die("divergent warp collective");
  return w;
}
static void done_(WarpX &) {
  warp_sync_();
}

static unsigned __shfl_sync(unsigned, int v, int src) {
  uint64_t x = (uint32_t)v;
  WarpX &w = post(1, &x, 1);
  const int r = (int)(uint32_t)w.slot[src][0];
  done_(w);
  return (unsigned)r;
}
static int __shfl_up_sync(unsigned, int v, int d) {
  uint64_t x = (uint32_t)v;
  WarpX &w = post(2, &x, 1);
  const int lane = g_cur->tid.x & 31;
  const int r = lane >= d ? (int)(uint32_t)w.slot[lane - d][0] : v;
  done_(w);
  return r;
}
static unsigned __ballot_sync(unsigned, bool p) {
  uint64_t x = p;
  WarpX &w = post(3, &x, 1);
  unsigned m = 0;
  for (int l = 0; l < 32; l++)
    if (w.slot[l][0]) m |= 1u << l;
  done_(w);
  return m;
}
static int __ffs(unsigned x) {
  return __builtin_ffs((int)x);
}
static float __int_as_float(int i) {
  float f;
  memcpy(&f, &i, 4);
  return f;
}
static int32_t mf_warp_inclusive_scan(int32_t v) {
  const int lane = threadIdx.x & 31;
  for (int d = 1; d < 32; d <<= 1) {
    const int32_t o = __shfl_up_sync(0xffffffffu, v, d);
    if (lane >= d) v += o;
  }
  return v;
}

// ------------------------------------------------------------- memory
enum { SMEM_BYTES = 228 << 10 };
alignas(16) static unsigned char g_smem[SMEM_BYTES];
struct Chunk {
  bool written, pending;
  uint64_t done_phase, read_phase;
};
static Chunk g_sh[SMEM_BYTES / 16];
static size_t g_smem_limit;  // the launch's dynamic smem bytes

struct Region {
  const unsigned char *p;
  size_t n;
};
static std::vector<Region> g_regions;
static bool in_region(const void *p, size_t n) {
  const unsigned char *c = (const unsigned char *)p;
  for (auto &r : g_regions)
    if (c >= r.p && c + n <= r.p + r.n) return true;
  return false;
}
static size_t chunk_of(const void *p) {
  const unsigned char *c = (const unsigned char *)p;
  if (c < g_smem || c + 16 > g_smem + g_smem_limit) die("shared address outside the stage memory");
  if ((uintptr_t)c & 15) die("shared address not 16-byte aligned");
  return (size_t)(c - g_smem) / 16;
}

static mf_bf16 *stage_memory() {
  return (mf_bf16 *)g_smem;
}

static void cp_async16(void *dst, const void *src, bool valid) {
  const size_t c = chunk_of(dst);
  if ((uintptr_t)src & 15) die("cp.async source not 16-byte aligned");
  if (valid && !in_region(src, 16)) die("cp.async reads outside every global buffer");
  Chunk &s = g_sh[c];
  if (s.pending) die("WAW: two cp.async in flight to one chunk");
  if (s.read_phase == g_phase + 1) die("WAR: cp.async into a chunk read in this barrier phase");
  s.pending = true;
  g_cur->open.push_back({dst, src, valid});
}
static void cp_async_commit() {
  g_cur->groups.push_back(g_cur->open);
  g_cur->open.clear();
}
template <int N>
static void cp_async_wait() {
  auto &gs = g_cur->groups;
  while ((int)gs.size() > N) {
    for (const Copy &cp : gs.front()) {
      if (cp.valid)
        memcpy(cp.dst, cp.src, 16);
      else
        memset(cp.dst, 0, 16);
      Chunk &s = g_sh[chunk_of(cp.dst)];
      s.pending = false;
      s.written = true;
      s.done_phase = g_phase;
    }
    gs.erase(gs.begin());
  }
}
static void read_chunk(const void *p) {
  Chunk &s = g_sh[chunk_of(p)];
  if (s.pending) die("RAW: ldmatrix of a chunk whose cp.async is in flight");
  if (!s.written) die("ldmatrix of a chunk never written");
  if (s.done_phase >= g_phase) die("RAW: ldmatrix of a chunk completed without a barrier since");
  s.read_phase = g_phase + 1;  // +1: 0 means never
}

static float bf(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static uint16_t to_bf(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

template <bool TRANS>
static void ldsm_x4(uint32_t r[4], const mf_bf16 *p) {
  read_chunk(p);
  uint64_t a = (uint64_t)(uintptr_t)p;
  WarpX &w = post(TRANS ? 10 : 11, &a, 1);
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  if (lane == 0)  // bank conflicts: one matrix (8 rows of 16 bytes) is one phase
    for (int j = 0; j < 4; j++) {
      unsigned seen = 0;
      for (int i = 0; i < 8; i++) seen |= 1u << ((w.slot[8 * j + i][0] / 16) % 8);
      if (seen != 0xffu) die("ldmatrix bank conflict");
    }
  for (int j = 0; j < 4; j++) {
    auto M = [&](int row, int col) { return ((const uint16_t *)(uintptr_t)w.slot[8 * j + row][0])[col]; };
    const uint16_t lo = TRANS ? M(2 * t, g) : M(g, 2 * t), hi = TRANS ? M(2 * t + 1, g) : M(g, 2 * t + 1);
    r[j] = (uint32_t)lo | ((uint32_t)hi << 16);
  }
  done_(w);
}

static void mma_bf16(float d[4], const uint32_t a[4], const uint32_t b[2]) {
  uint64_t v[6] = {a[0], a[1], a[2], a[3], b[0], b[1]};
  WarpX &w = post(20, v, 6);
  auto half = [](uint32_t x, int h) { return (uint16_t)(h ? x >> 16 : x & 0xffff); };
  auto A = [&](int row, int k) {
    const int lane = (row % 8) * 4 + (k % 8) / 2, reg = row / 8 + 2 * (k / 8);
    return bf(half((uint32_t)w.slot[lane][reg], k % 2));
  };
  auto B = [&](int k, int n) {
    const int lane = n * 4 + (k % 8) / 2, reg = k / 8;
    return bf(half((uint32_t)w.slot[lane][4 + reg], k % 2));
  };
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  for (int h = 0; h < 4; h++) {
    const int row = g + 8 * (h >> 1), col = 2 * t + (h & 1);
    double s = 0;
    for (int k = 0; k < 16; k++) s += (double)A(row, k) * B(k, col);
    d[h] = (float)((double)d[h] + s);
  }
  done_(w);
}

static std::vector<int> g_write_count;  // per output element
static const mf_bf16 *g_out_base;
static size_t g_out_n;
static void st_bf16x2(mf_bf16 *p, float lo, float hi) {
  if (!in_region(p, 4) || ((uintptr_t)p & 3)) die("bf16x2 store outside a buffer or misaligned");
  p[0].x = to_bf(lo);
  p[1].x = to_bf(hi);
  const ptrdiff_t i = p - g_out_base;
  if (i < 0 || (size_t)i + 2 > g_out_n) die("bf16x2 store outside the output");
  g_write_count[i]++, g_write_count[i + 1]++;
}

#define MF_EXPERT_MMA_EMULATE 1
#include "kernels/cuda/expert_mma_cu.inc"

// ------------------------------------------------------------- launch
static std::function<void()> g_kernel;
static void entry() {
  g_kernel();
  g_cur->done = true;
  // leftover groups: the kernel waits for all; none should remain
  if (!g_cur->groups.empty() || !g_cur->open.empty()) {
    for (auto &gr : g_cur->groups)
      if (!gr.empty()) die("a CTA exits with cp.async copies in flight");
    for (auto &c : g_cur->open) (void)c, die("a CTA exits with uncommitted copies");
  }
  swapcontext(&g_cur->ctx, &g_main);
}

static void run_grid(unsigned gx, unsigned gy, size_t smem, std::function<void()> k) {
  if (smem > SMEM_BYTES) die("smem too large for the emulator");
  g_smem_limit = smem;
  g_kernel = k;
  g_grid = {gx, gy, 1};
  for (unsigned by = 0; by < gy; by++)
    for (unsigned bx = 0; bx < gx; bx++) {
      g_block = {bx, by, 0};
      memset(g_smem, 0xcd, sizeof g_smem);
      memset(g_sh, 0, sizeof g_sh);
      memset(g_w, 0, sizeof g_w);
      g_cta_arrived = 0;
      g_phase = 1;
      for (int t = 0; t < NTH; t++) {
        EmuThread &th = g_th[t];
        th.stack.resize(STACK);
        th.done = false;
        th.groups.clear();
        th.open.clear();
        th.tid = {(unsigned)t, 0, 0};
        getcontext(&th.ctx);
        th.ctx.uc_stack.ss_sp = th.stack.data();
        th.ctx.uc_stack.ss_size = STACK;
        th.ctx.uc_link = &g_main;
        makecontext(&th.ctx, entry, 0);
      }
      for (;;) {
        bool all = true;
        const uint64_t before = g_progress;
        int ran = 0;
        for (int t = 0; t < NTH; t++) {
          if (g_th[t].done) continue;
          all = false;
          g_cur = &g_th[t];
          swapcontext(&g_main, &g_th[t].ctx);
          ran++;
        }
        if (all) break;
        // a thread that finished this round counts as progress
        bool any_done_now = false;
        for (int t = 0; t < NTH; t++) any_done_now |= g_th[t].done;
        if (g_progress == before && !any_done_now) die("deadlock: no thread can proceed");
        (void)ran;
      }
      // all threads of the CTA must finish together at barriers: checked by deadlock detection
    }
}

// ------------------------------------------------------------- tests
static std::mt19937_64 rng(7);
static std::vector<mf_bf16> bf16_rand(size_t n) {
  std::uniform_real_distribution<float> d(-1, 1);
  std::vector<mf_bf16> v(n);
  for (auto &x : v) x.x = to_bf(d(rng));
  return v;
}

struct Buf {  // a global buffer with guard bands of 64 bytes each side
  std::vector<unsigned char> mem;
  size_t n;
  unsigned char *p;
  Buf(size_t bytes) : mem(bytes + 128 + 16), n(bytes) {
    p = (unsigned char *)(((uintptr_t)mem.data() + 64 + 15) & ~(uintptr_t)15);
    memset(mem.data(), 0xab, mem.size());
    g_regions.push_back({p, n});
  }
  void check_guards(const char *what) {
    for (unsigned char *q = mem.data(); q < p; q++)
      if (*q != 0xab) die(std::string("guard before ") + what + " overwritten");
    for (unsigned char *q = p + n; q < mem.data() + mem.size(); q++)
      if (*q != 0xab) die(std::string("guard after ") + what + " overwritten");
  }
};

static std::vector<int64_t> make_offsets(const std::vector<int64_t> &counts) {
  std::vector<int64_t> off(counts.size() + 1, 0);
  for (size_t e = 0; e < counts.size(); e++) off[e + 1] = off[e] + counts[e];
  return off;
}

static int g_fail;
static void check_close(const char *what, double got, double ref, double tol, size_t idx) {
  if (!(std::fabs(got - ref) <= tol)) {
    if (g_fail < 10) fprintf(stderr, "%s: element %zu: got %g ref %g\n", what, idx, got, ref);
    g_fail++;
  }
}

// FWD (kind 0) or DATA (kind 1).
static void test_rows(int kind, std::vector<int64_t> counts, int64_t R, int64_t N, int64_t Kd, int null_expert) {
  const int64_t E = counts.size();
  const std::vector<int64_t> off = make_offsets(counts);
  const int64_t Kin = kind == 0 ? Kd : N, Nout = kind == 0 ? N : Kd;
  g_regions.clear();
  Buf in(R * Kin * 2), out(R * Nout * 2), offb((E + 1) * 8);
  auto inv = bf16_rand(R * Kin);
  memcpy(in.p, inv.data(), R * Kin * 2);
  memcpy(offb.p, off.data(), (E + 1) * 8);
  memset(out.p, 0xee, R * Nout * 2);
  std::vector<Buf *> wb;
  std::vector<std::vector<mf_bf16>> wv(E);
  expert_list list{};
  for (int64_t e = 0; e < E; e++) {
    wv[e] = bf16_rand(N * Kd);
    if (counts[e] == 0 || e == null_expert) continue;  // idle: NULL
    wb.push_back(new Buf(N * Kd * 2));
    memcpy(wb.back()->p, wv[e].data(), N * Kd * 2);
    list.p[e] = wb.back()->p;
  }
  const int bm = rows_bm(R, E);
  unsigned gx, gy;
  if (!rows_grid(R, E, Nout, bm, &gx, &gy)) die("grid");
  g_out_base = (const mf_bf16 *)out.p, g_out_n = R * Nout;
  g_write_count.assign(R * Nout, 0);
  const mf_bf16 *ip = (const mf_bf16 *)in.p;
  const int64_t *op = (const int64_t *)offb.p;
  mf_bf16 *outp = (mf_bf16 *)out.p;
  size_t smem;
  if (kind == 0)
    smem = bm == 64 ? stage_bytes<MMA_FWD, 64>() : stage_bytes<MMA_FWD, 128>();
  else
    smem = bm == 64 ? stage_bytes<MMA_DATA, 64>() : stage_bytes<MMA_DATA, 128>();
  run_grid(gx, gy, smem, [&] {
    if (kind == 0 && bm == 64) expert_rows_mma<MMA_FWD, 64>(ip, op, (int)E, Kin, Nout, list, outp);
    if (kind == 0 && bm == 128) expert_rows_mma<MMA_FWD, 128>(ip, op, (int)E, Kin, Nout, list, outp);
    if (kind == 1 && bm == 64) expert_rows_mma<MMA_DATA, 64>(ip, op, (int)E, Kin, Nout, list, outp);
    if (kind == 1 && bm == 128) expert_rows_mma<MMA_DATA, 128>(ip, op, (int)E, Kin, Nout, list, outp);
  });
  out.check_guards("out");
  g_fail = 0;
  const mf_bf16 *o = (const mf_bf16 *)out.p;
  for (int64_t e = 0; e < E; e++)
    for (int64_t r = off[e]; r < off[e + 1]; r++)
      for (int64_t c = 0; c < Nout; c++) {
        const size_t i = r * Nout + c;
        if (g_write_count[i] != 1) die("output element written " + std::to_string(g_write_count[i]) + " times");
        const float got = bf(o[i].x);
        if (e == null_expert) {
          if (!std::isnan(got)) die("expert without weights: not NaN");
          continue;
        }
        double ref = 0, mag = 0;
        for (int64_t k = 0; k < Kin; k++) {
          const double x = bf(inv[r * Kin + k].x);
          const double w = kind == 0 ? bf(wv[e][c * Kd + k].x) : bf(wv[e][k * Kd + c].x);
          ref += x * w, mag += std::fabs(x * w);
        }
        check_close(kind == 0 ? "fwd" : "data", got, ref, std::fabs(ref) / 256 + 1e-6 * mag + 1e-30, i);
      }
  for (int64_t r = off[E]; r < R; r++)
    for (int64_t c = 0; c < Nout; c++)
      if (g_write_count[r * Nout + c] || o[r * Nout + c].x != 0xeeee) die("row past offsets[E] touched");
  for (auto *b : wb) b->check_guards("W"), delete b;
  printf("%s E=%lld R=%lld N=%lld Kd=%lld bm=%d grid %ux%u: %s (%d bad)\n", kind == 0 ? "FWD " : "DATA",
         (long long)E, (long long)R, (long long)N, (long long)Kd, bm, gx, gy, g_fail ? "FAIL" : "ok", g_fail);
  if (g_fail) exit(1);
}

static void test_wgt(std::vector<int64_t> counts, int64_t N, int64_t Kd) {
  const int64_t E = counts.size();
  const std::vector<int64_t> off = make_offsets(counts);
  const int64_t R = off[E] + 3;
  g_regions.clear();
  Buf dye(R * N * 2), xe(R * Kd * 2), offb((E + 1) * 8);
  auto dv = bf16_rand(R * N), xv = bf16_rand(R * Kd);
  memcpy(dye.p, dv.data(), R * N * 2);
  memcpy(xe.p, xv.data(), R * Kd * 2);
  memcpy(offb.p, off.data(), (E + 1) * 8);
  std::vector<Buf *> wb(E, nullptr);
  std::vector<std::vector<float>> w0(E);
  expert_list list{};
  std::uniform_real_distribution<float> d(-1, 1);
  for (int64_t e = 0; e < E; e++) {
    if (counts[e] == 0) continue;
    w0[e].resize(N * Kd);
    for (auto &x : w0[e]) x = d(rng);
    wb[e] = new Buf(N * Kd * 4);
    memcpy(wb[e]->p, w0[e].data(), N * Kd * 4);
    list.p[e] = wb[e]->p;
  }
  const int64_t n_tiles = (N + BM_WGT - 1) / BM_WGT, k_tiles = (Kd + BN - 1) / BN;
  const mf_bf16 *dp = (const mf_bf16 *)dye.p, *xp = (const mf_bf16 *)xe.p;
  const int64_t *op = (const int64_t *)offb.p;
  g_out_base = nullptr, g_out_n = 0;
  run_grid((unsigned)(E * n_tiles * k_tiles), 1, stage_bytes<MMA_WGT, BM_WGT>(),
           [&] { expert_wgt_mma(dp, xp, op, N, Kd, (int)n_tiles, (int)k_tiles, list); });
  g_fail = 0;
  for (int64_t e = 0; e < E; e++) {
    if (!wb[e]) continue;
    wb[e]->check_guards("dW");
    const float *w = (const float *)wb[e]->p;
    for (int64_t n = 0; n < N; n++)
      for (int64_t k = 0; k < Kd; k++) {
        double ref = w0[e][n * Kd + k], mag = std::fabs(ref);
        for (int64_t r = off[e]; r < off[e + 1]; r++) {
          const double p = (double)bf(dv[r * N + n].x) * bf(xv[r * Kd + k].x);
          ref += p, mag += std::fabs(p);
        }
        check_close("wgt", w[n * Kd + k], ref, 1e-6 * mag, n * Kd + k);
      }
    delete wb[e];
  }
  printf("WGT  E=%lld N=%lld Kd=%lld grid %lld: %s (%d bad)\n", (long long)E, (long long)N, (long long)Kd,
         (long long)(E * n_tiles * k_tiles), g_fail ? "FAIL" : "ok", g_fail);
  if (g_fail) exit(1);
}

static int run_all() {
  // FWD / DATA at BM = 128 (R >= 128 E): an idle expert, a 1-row one, a
  // 2-tile one with a ragged last tile, rows past offsets[E]; N = 136 (a
  // ragged column tile), Kd = 168 (6 steps: the ring wraps, the last step 8 deep).
  test_rows(0, {0, 1, 200, 129}, 600, 136, 168, -1);
  test_rows(1, {0, 1, 200, 129}, 600, 136, 168, -1);
  // BM = 64 (R < 128 E), an expert with rows but no weights (NaN rows).
  test_rows(0, {3, 0, 70, 64, 1, 0}, 150, 40, 232, 3);
  test_rows(1, {3, 0, 70, 64, 1, 0}, 150, 40, 232, 3);
  // 33 experts: the tile search crosses a window of 32.
  {
    std::vector<int64_t> c(33, 0);
    c[0] = 5, c[31] = 2, c[32] = 130;
    test_rows(0, c, 140, 8, 32, -1);
    test_rows(1, c, 140, 8, 32, -1);
  }
  // WGT: dW 136 x 264 (ragged n and k tiles), rows 1, 0, 37, 130 (5 steps).
  test_wgt({1, 0, 37, 130}, 136, 264);
  test_wgt({0, 33}, 8, 8);
  printf("all ok\n");
  return 0;
}

#if defined(__SANITIZE_ADDRESS__)
#define MF_EMU_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MF_EMU_UNDER_ASAN 1
#endif
#endif

// A failure ends the process (die: _exit(1)) naming what the emulator caught.
TEST(ExpertMmaEmulated, IndexArithmeticHazardsAndResults) {
#ifdef MF_EMU_UNDER_ASAN
  GTEST_SKIP() << "the emulator's coroutines switch stacks (swapcontext), which AddressSanitizer does not follow";
#else
  EXPECT_EQ(run_all(), 0);
#endif
}
