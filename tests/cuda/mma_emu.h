// A CPU emulator for the tensor-core kernels (kernels/cuda/mma.cuh's users),
// shared by tests/cuda/expert_mma_emu_test.cc and attention_mma_emu_test.cc.
// A test defines whatever its kernel file needs beyond this, includes this
// header, then the kernel file (a .inc copy, MF_MMA_EMULATE set here) and runs
// its kernels with emu_run_grid: one CTA at a time, its threads as cooperative
// coroutines (deterministic), with the PTX semantics of ldmatrix (.trans),
// mma.m16n8k16 bf16 and cp.async (groups, zero-fill), and checks:
//   - shared memory hazards: a read of a chunk whose cp.async is in flight or
//     completed without a barrier since (RAW), a cp.async into a chunk read in
//     the same barrier phase (WAR), two copies in flight to one chunk (WAW);
//   - ldmatrix bank conflicts (the 8 rows of one matrix in 8 bank groups);
//   - cp.async sources inside a registered global buffer (EmuBuf), 16-byte
//     aligned; shared addresses inside the launch's dynamic shared memory,
//     16-byte aligned;
//   - warp collectives executed by all 32 lanes with the same op;
//   - bf16x2 stores inside a buffer, and each element of a tracked output
//     (emu_track) written exactly once (emu_check_written_once);
//   - deadlock (a barrier some thread never reaches), copies in flight at exit.
// A failure ends the process (emu_die: _exit(1)) naming what was caught. The
// coroutines switch stacks with swapcontext, which AddressSanitizer does not
// follow: the tests skip under ASan (MF_EMU_UNDER_ASAN).
#ifndef MF_TESTS_CUDA_MMA_EMU_H
#define MF_TESTS_CUDA_MMA_EMU_H

#include <ucontext.h>
#include <unistd.h>

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

#if defined(__SANITIZE_ADDRESS__)
#define MF_EMU_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MF_EMU_UNDER_ASAN 1
#endif
#endif
// In a TEST body: skips the test under AddressSanitizer.
#ifdef MF_EMU_UNDER_ASAN
#define MF_EMU_SKIP_UNDER_ASAN() \
  GTEST_SKIP()                   \
      << "the emulator's coroutines switch stacks (swapcontext), which AddressSanitizer does not follow"
#else
#define MF_EMU_SKIP_UNDER_ASAN() (void)0
#endif

// ------------------------------------------------------------- CUDA shims
#define MF_MMA_EMULATE 1
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
struct mf_bf16 {
  uint16_t x;
};
struct float2 {
  float x, y;
};
struct uint3e {
  unsigned x, y, z;
};

template <typename To, typename From>
static To emu_bit_cast(From x) {
  static_assert(sizeof(To) == sizeof(From), "same size");
  To y;
  memcpy(&y, &x, sizeof y);
  return y;
}

static void emu_die(const std::string &m) {
  fprintf(stderr, "EMU FAILURE: %s\n", m.c_str());
  fflush(stdout);
  _exit(1);  // not exit(): static destructors would free the coroutine stack in use
}

// ------------------------------------------------------------- threads
enum { EMU_MAX_THREADS = 256, EMU_STACK = 256 << 10 };
struct EmuCopy {
  void *dst;
  const void *src;
  bool valid;
};
struct EmuThread {
  ucontext_t ctx;
  uint3e tid;
  bool done;
  std::vector<char> stack;
  std::vector<std::vector<EmuCopy>> groups;  // committed, oldest first
  std::vector<EmuCopy> open;
};
static EmuThread g_th[EMU_MAX_THREADS];
static EmuThread *g_cur;
static int g_nth;  // the launch's threads per block
static uint3e g_block, g_grid;
static ucontext_t g_main;
static uint64_t g_progress;
#define threadIdx (g_cur->tid)
#define blockIdx g_block
#define gridDim g_grid

static void emu_yield() {
  swapcontext(&g_cur->ctx, &g_main);
}

// CTA barrier
static int g_cta_arrived;
static uint64_t g_cta_gen, g_phase;
static void __syncthreads() {
  g_progress++;
  const uint64_t gen = g_cta_gen;
  if (++g_cta_arrived == g_nth) {
    g_cta_arrived = 0;
    g_cta_gen++;
    g_phase++;
    return;
  }
  while (g_cta_gen == gen) emu_yield();
}

// warp barrier + exchange
struct EmuWarp {
  int arrived;
  uint64_t gen;
  int op[32];
  uint64_t slot[32][8];
};
static EmuWarp g_w[EMU_MAX_THREADS / 32];
static void emu_warp_sync() {
  EmuWarp &w = g_w[g_cur->tid.x / 32];
  g_progress++;
  const uint64_t gen = w.gen;
  if (++w.arrived == 32) {
    w.arrived = 0;
    w.gen++;
    return;
  }
  while (w.gen == gen) emu_yield();
}
// Posts this lane's values with an op tag; returns the warp's slots once all posted.
static EmuWarp &emu_post(int op, const uint64_t *v, int n) {
  const int lane = g_cur->tid.x & 31;
  EmuWarp &w = g_w[g_cur->tid.x / 32];
  w.op[lane] = op;
  for (int i = 0; i < n; i++) w.slot[lane][i] = v[i];
  emu_warp_sync();
  for (int l = 0; l < 32; l++)
    if (w.op[l] != op) emu_die("divergent warp collective");
  return w;
}
static void emu_done(EmuWarp &) {
  emu_warp_sync();
}

static void __syncwarp(unsigned = 0xffffffffu) {
  uint64_t x = 0;
  emu_done(emu_post(4, &x, 1));
}
static unsigned __shfl_sync(unsigned, int v, int src) {
  uint64_t x = (uint32_t)v;
  EmuWarp &w = emu_post(1, &x, 1);
  const int r = (int)(uint32_t)w.slot[src][0];
  emu_done(w);
  return (unsigned)r;
}
static int __shfl_up_sync(unsigned, int v, int d) {
  uint64_t x = (uint32_t)v;
  EmuWarp &w = emu_post(2, &x, 1);
  const int lane = g_cur->tid.x & 31;
  const int r = lane >= d ? (int)(uint32_t)w.slot[lane - d][0] : v;
  emu_done(w);
  return r;
}
static float __shfl_xor_sync(unsigned, float v, int m) {
  uint64_t x = emu_bit_cast<uint32_t>(v);
  EmuWarp &w = emu_post(5, &x, 1);
  const uint32_t r = (uint32_t)w.slot[(g_cur->tid.x & 31) ^ m][0];
  emu_done(w);
  return emu_bit_cast<float>(r);
}
static unsigned __ballot_sync(unsigned, bool p) {
  uint64_t x = p;
  EmuWarp &w = emu_post(3, &x, 1);
  unsigned m = 0;
  for (int l = 0; l < 32; l++)
    if (w.slot[l][0]) m |= 1u << l;
  emu_done(w);
  return m;
}
static int __ffs(unsigned x) {
  return __builtin_ffs((int)x);
}
static float __int_as_float(int i) {
  return emu_bit_cast<float>(i);
}
static float __uint_as_float(unsigned i) {
  return emu_bit_cast<float>(i);
}
static unsigned __float_as_uint(float f) {
  return emu_bit_cast<unsigned>(f);
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
enum { EMU_SMEM_BYTES = 228 << 10 };
alignas(16) static unsigned char g_smem[EMU_SMEM_BYTES];
struct EmuChunk {
  bool written, pending;
  uint64_t done_phase, read_phase;
};
static EmuChunk g_sh[EMU_SMEM_BYTES / 16];
static size_t g_smem_limit;  // the launch's dynamic smem bytes

struct EmuRegion {
  const unsigned char *p;
  size_t n;
};
static std::vector<EmuRegion> g_regions;
static bool emu_in_region(const void *p, size_t n) {
  const unsigned char *c = (const unsigned char *)p;
  for (auto &r : g_regions)
    if (c >= r.p && c + n <= r.p + r.n) return true;
  return false;
}
static size_t emu_chunk_of(const void *p) {
  const unsigned char *c = (const unsigned char *)p;
  if (c < g_smem || c + 16 > g_smem + g_smem_limit)
    emu_die("shared address outside the dynamic shared memory");
  if ((uintptr_t)c & 15) emu_die("shared address not 16-byte aligned");
  return (size_t)(c - g_smem) / 16;
}

static unsigned char *mma_smem() {
  return g_smem;
}

static void cp_async16(void *dst, const void *src, bool valid) {
  const size_t c = emu_chunk_of(dst);
  if ((uintptr_t)src & 15) emu_die("cp.async source not 16-byte aligned");
  if (valid && !emu_in_region(src, 16)) emu_die("cp.async reads outside every global buffer");
  EmuChunk &s = g_sh[c];
  if (s.pending) emu_die("WAW: two cp.async in flight to one chunk");
  if (s.read_phase == g_phase + 1) emu_die("WAR: cp.async into a chunk read in this barrier phase");
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
    for (const EmuCopy &cp : gs.front()) {
      if (cp.valid)
        memcpy(cp.dst, cp.src, 16);
      else
        memset(cp.dst, 0, 16);
      EmuChunk &s = g_sh[emu_chunk_of(cp.dst)];
      s.pending = false;
      s.written = true;
      s.done_phase = g_phase;
    }
    gs.erase(gs.begin());
  }
}
static void emu_read_chunk(const void *p) {
  EmuChunk &s = g_sh[emu_chunk_of(p)];
  if (s.pending) emu_die("RAW: ldmatrix of a chunk whose cp.async is in flight");
  if (!s.written) emu_die("ldmatrix of a chunk never written");
  if (s.done_phase >= g_phase) emu_die("RAW: ldmatrix of a chunk completed without a barrier since");
  s.read_phase = g_phase + 1;  // +1: 0 means never
}

static float emu_bf(uint16_t b) {
  return emu_bit_cast<float>((uint32_t)b << 16);
}
// fp32 -> bf16, round to nearest even, NaN kept.
static uint16_t emu_to_bf(float f) {
  const uint32_t u = emu_bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

template <bool TRANS>
static void ldsm_x4(uint32_t r[4], const mf_bf16 *p) {
  emu_read_chunk(p);
  uint64_t a = (uint64_t)(uintptr_t)p;
  EmuWarp &w = emu_post(TRANS ? 10 : 11, &a, 1);
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  if (lane == 0)  // bank conflicts: one matrix (8 rows of 16 bytes) is one phase
    for (int j = 0; j < 4; j++) {
      unsigned seen = 0;
      for (int i = 0; i < 8; i++) seen |= 1u << ((w.slot[8 * j + i][0] / 16) % 8);
      if (seen != 0xffu) emu_die("ldmatrix bank conflict");
    }
  for (int j = 0; j < 4; j++) {
    auto M = [&](int row, int col) { return ((const uint16_t *)(uintptr_t)w.slot[8 * j + row][0])[col]; };
    const uint16_t lo = TRANS ? M(2 * t, g) : M(g, 2 * t), hi = TRANS ? M(2 * t + 1, g) : M(g, 2 * t + 1);
    r[j] = (uint32_t)lo | ((uint32_t)hi << 16);
  }
  emu_done(w);
}

static void mma_bf16(float d[4], const uint32_t a[4], const uint32_t b[2]) {
  uint64_t v[6] = {a[0], a[1], a[2], a[3], b[0], b[1]};
  EmuWarp &w = emu_post(20, v, 6);
  auto half = [](uint32_t x, int h) { return (uint16_t)(h ? x >> 16 : x & 0xffff); };
  auto A = [&](int row, int k) {
    const int lane = (row % 8) * 4 + (k % 8) / 2, reg = row / 8 + 2 * (k / 8);
    return emu_bf(half((uint32_t)w.slot[lane][reg], k % 2));
  };
  auto B = [&](int k, int n) {
    const int lane = n * 4 + (k % 8) / 2, reg = k / 8;
    return emu_bf(half((uint32_t)w.slot[lane][4 + reg], k % 2));
  };
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  for (int h = 0; h < 4; h++) {
    const int row = g + 8 * (h >> 1), col = 2 * t + (h & 1);
    double s = 0;
    for (int k = 0; k < 16; k++) s += (double)A(row, k) * B(k, col);
    d[h] = (float)((double)d[h] + s);
  }
  emu_done(w);
}

static uint32_t pack_bf16x2(float lo, float hi) {
  return (uint32_t)emu_to_bf(lo) | ((uint32_t)emu_to_bf(hi) << 16);
}

// Outputs whose every element must be written exactly once by a launch.
struct EmuTracked {
  const mf_bf16 *base;
  size_t n;
  std::vector<int> count;
};
static std::vector<EmuTracked> g_tracked;
static void emu_track(const void *base, size_t n) {
  g_tracked.push_back({(const mf_bf16 *)base, n, std::vector<int>(n, 0)});
}
static void st_bf16x2(mf_bf16 *p, float lo, float hi) {
  if (!emu_in_region(p, 4) || ((uintptr_t)p & 3)) emu_die("bf16x2 store outside a buffer or misaligned");
  p[0].x = emu_to_bf(lo);
  p[1].x = emu_to_bf(hi);
  for (auto &t : g_tracked) {
    const ptrdiff_t i = p - t.base;
    if (i >= 0 && (size_t)i < t.n) {
      if ((size_t)i + 2 > t.n) emu_die("bf16x2 store across a tracked output's end");
      t.count[i]++, t.count[i + 1]++;
      return;
    }
  }
  if (!g_tracked.empty()) emu_die("bf16x2 store outside every tracked output");
}
// The write count of element i of tracked output `which`.
static int emu_writes(size_t which, size_t i) {
  return g_tracked.at(which).count.at(i);
}

// ------------------------------------------------------------- launch
static std::function<void()> g_kernel;
static void emu_entry() {
  g_kernel();
  g_cur->done = true;
  for (auto &gr : g_cur->groups)
    if (!gr.empty()) emu_die("a CTA exits with cp.async copies in flight");
  if (!g_cur->open.empty()) emu_die("a CTA exits with uncommitted copies");
  swapcontext(&g_cur->ctx, &g_main);
}

static void emu_start_threads() {
  for (int t = 0; t < g_nth; t++) {
    EmuThread &th = g_th[t];
    th.stack.resize(EMU_STACK);
    th.done = false;
    th.groups.clear();
    th.open.clear();
    th.tid = {(unsigned)t, 0, 0};
    getcontext(&th.ctx);
    th.ctx.uc_stack.ss_sp = th.stack.data();
    th.ctx.uc_stack.ss_size = EMU_STACK;
    th.ctx.uc_link = &g_main;
    makecontext(&th.ctx, emu_entry, 0);
  }
}

// Runs the CTA g_block to its end, round robin over its threads.
static void emu_run_block() {
  for (;;) {
    bool all = true;
    const uint64_t before = g_progress;
    for (int t = 0; t < g_nth; t++) {
      if (g_th[t].done) continue;
      all = false;
      g_cur = &g_th[t];
      swapcontext(&g_main, &g_th[t].ctx);
    }
    if (all) return;
    bool any_done = false;  // a thread that finished this round counts as progress
    for (int t = 0; t < g_nth; t++) any_done |= g_th[t].done;
    if (g_progress == before && !any_done) emu_die("deadlock: no thread can proceed");
  }
}

// Runs kernel k on a grid of gx x gy x gz CTAs of nth threads with smem bytes
// of dynamic shared memory, one CTA after another.
static void emu_run_grid(unsigned gx, unsigned gy, unsigned gz, int nth, size_t smem,
                         std::function<void()> k) {
  if (smem > EMU_SMEM_BYTES) emu_die("smem too large for the emulator");
  if (nth <= 0 || nth > EMU_MAX_THREADS || nth % 32) emu_die("threads per block not a multiple of 32 <= 256");
  g_nth = nth;
  g_smem_limit = smem;
  g_kernel = k;
  g_grid = {gx, gy, gz};
  for (unsigned bz = 0; bz < gz; bz++)
    for (unsigned by = 0; by < gy; by++)
      for (unsigned bx = 0; bx < gx; bx++) {
        g_block = {bx, by, bz};
        memset(g_smem, 0xcd, sizeof g_smem);
        memset(g_sh, 0, sizeof g_sh);
        memset(g_w, 0, sizeof g_w);
        g_cta_arrived = 0;
        g_phase = 1;
        emu_start_threads();
        emu_run_block();
      }
}

// ------------------------------------------------------------- test helpers
static std::mt19937_64 g_emu_rng(7);
static std::vector<mf_bf16> emu_bf16_rand(size_t n, float lo = -1, float hi = 1) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<mf_bf16> v(n);
  for (auto &x : v) x.x = emu_to_bf(d(g_emu_rng));
  return v;
}

struct EmuBuf {  // a registered global buffer with guard bands of 64 bytes each side
  std::vector<unsigned char> mem;
  size_t n;
  unsigned char *p;
  explicit EmuBuf(size_t bytes) : mem(bytes + 128 + 16), n(bytes) {
    p = (unsigned char *)(((uintptr_t)mem.data() + 64 + 15) & ~(uintptr_t)15);
    memset(mem.data(), 0xab, mem.size());
    g_regions.push_back({p, n});
  }
  void check_guards(const char *what) {
    for (unsigned char *q = mem.data(); q < p; q++)
      if (*q != 0xab) emu_die(std::string("guard before ") + what + " overwritten");
    for (unsigned char *q = p + n; q < mem.data() + mem.size(); q++)
      if (*q != 0xab) emu_die(std::string("guard after ") + what + " overwritten");
  }
};

static int g_fail;
static void emu_check_close(const char *what, double got, double ref, double tol, size_t idx) {
  if (!(std::fabs(got - ref) <= tol)) {
    if (g_fail < 10) fprintf(stderr, "%s: element %zu: got %g ref %g tol %g\n", what, idx, got, ref, tol);
    g_fail++;
  }
}

#endif  // MF_TESTS_CUDA_MMA_EMU_H
