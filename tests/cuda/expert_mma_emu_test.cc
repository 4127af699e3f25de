// Host emulation of kernels/cuda/expert_mma.cu, a CPU test of CI: runs
// the kernels' device code on the CPU (tests/cuda/mma_emu.h: 256 threads a
// CTA as coroutines, emulated ldmatrix / mma / cp.async) and checks:
//   - shared memory hazards, ldmatrix bank conflicts, cp.async bounds and
//     alignment, warp collectives (mma_emu.h);
//   - every output element written once (FWD / DATA), guard bands untouched;
//   - the results against a double-precision reference.
// The kernel file comes in as kernels/cuda/expert_mma_cu.inc (a copy made by
// the genrule in kernels/cuda/BUILD: Bazel takes no .cu as a header). Under
// AddressSanitizer the test is skipped (mma_emu.h).
#include <gtest/gtest.h>

#include "tests/cuda/mma_emu.h"

#define MF_CUDA_MAX_EXPERTS 1024
#include "kernels/cuda/expert_mma_cu.inc"

// ------------------------------------------------------------- tests
static std::vector<int64_t> make_offsets(const std::vector<int64_t> &counts) {
  std::vector<int64_t> off(counts.size() + 1, 0);
  for (size_t e = 0; e < counts.size(); e++) off[e + 1] = off[e] + counts[e];
  return off;
}

// FWD (kind 0) or DATA (kind 1).
static void test_rows(int kind, std::vector<int64_t> counts, int64_t R, int64_t N, int64_t Kd,
                      int null_expert) {
  const int64_t E = counts.size();
  const std::vector<int64_t> off = make_offsets(counts);
  const int64_t Kin = kind == 0 ? Kd : N, Nout = kind == 0 ? N : Kd;
  g_regions.clear();
  EmuBuf in(R * Kin * 2), out(R * Nout * 2), offb((E + 1) * 8);
  auto inv = emu_bf16_rand(R * Kin);
  memcpy(in.p, inv.data(), R * Kin * 2);
  memcpy(offb.p, off.data(), (E + 1) * 8);
  memset(out.p, 0xee, R * Nout * 2);
  std::vector<EmuBuf *> wb;
  std::vector<std::vector<mf_bf16>> wv(E);
  expert_list list{};
  for (int64_t e = 0; e < E; e++) {
    wv[e] = emu_bf16_rand(N * Kd);
    if (counts[e] == 0 || e == null_expert) continue;  // idle: NULL
    wb.push_back(new EmuBuf(N * Kd * 2));
    memcpy(wb.back()->p, wv[e].data(), N * Kd * 2);
    list.p[e] = wb.back()->p;
  }
  const int bm = rows_bm(R, E);
  unsigned gx, gy;
  if (!rows_grid(R, E, Nout, bm, &gx, &gy)) emu_die("grid");
  g_tracked.clear();
  emu_track(out.p, R * Nout);
  const mf_bf16 *ip = (const mf_bf16 *)in.p;
  const int64_t *op = (const int64_t *)offb.p;
  mf_bf16 *outp = (mf_bf16 *)out.p;
  size_t smem;
  if (kind == 0)
    smem = bm == 64 ? stage_bytes<MMA_FWD, 64>() : stage_bytes<MMA_FWD, 128>();
  else
    smem = bm == 64 ? stage_bytes<MMA_DATA, 64>() : stage_bytes<MMA_DATA, 128>();
  emu_run_grid(gx, gy, 1, NT, smem, [&] {
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
        if (emu_writes(0, i) != 1)
          emu_die("output element written " + std::to_string(emu_writes(0, i)) + " times");
        const float got = emu_bf(o[i].x);
        if (e == null_expert) {
          if (o[i].x != 0) emu_die("expert without weights (a cold expert's adapter): not +0");
          continue;
        }
        double ref = 0, mag = 0;
        for (int64_t k = 0; k < Kin; k++) {
          const double x = emu_bf(inv[r * Kin + k].x);
          const double w = kind == 0 ? emu_bf(wv[e][c * Kd + k].x) : emu_bf(wv[e][k * Kd + c].x);
          ref += x * w, mag += std::fabs(x * w);
        }
        emu_check_close(kind == 0 ? "fwd" : "data", got, ref, std::fabs(ref) / 256 + 1e-6 * mag + 1e-30, i);
      }
  for (int64_t r = off[E]; r < R; r++)
    for (int64_t c = 0; c < Nout; c++)
      if (emu_writes(0, r * Nout + c) || o[r * Nout + c].x != 0xeeee) emu_die("row past offsets[E] touched");
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
  EmuBuf dye(R * N * 2), xe(R * Kd * 2), offb((E + 1) * 8);
  auto dv = emu_bf16_rand(R * N), xv = emu_bf16_rand(R * Kd);
  memcpy(dye.p, dv.data(), R * N * 2);
  memcpy(xe.p, xv.data(), R * Kd * 2);
  memcpy(offb.p, off.data(), (E + 1) * 8);
  std::vector<EmuBuf *> wb(E, nullptr);
  std::vector<std::vector<float>> w0(E);
  expert_list list{};
  std::uniform_real_distribution<float> d(-1, 1);
  for (int64_t e = 0; e < E; e++) {
    if (counts[e] == 0) continue;
    w0[e].resize(N * Kd);
    for (auto &x : w0[e]) x = d(g_emu_rng);
    wb[e] = new EmuBuf(N * Kd * 4);
    memcpy(wb[e]->p, w0[e].data(), N * Kd * 4);
    list.p[e] = wb[e]->p;
  }
  const int64_t n_tiles = (N + BM_WGT - 1) / BM_WGT, k_tiles = (Kd + BN - 1) / BN;
  const mf_bf16 *dp = (const mf_bf16 *)dye.p, *xp = (const mf_bf16 *)xe.p;
  const int64_t *op = (const int64_t *)offb.p;
  g_tracked.clear();
  emu_run_grid((unsigned)(E * n_tiles * k_tiles), 1, 1, NT, stage_bytes<MMA_WGT, BM_WGT>(),
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
          const double p = (double)emu_bf(dv[r * N + n].x) * emu_bf(xv[r * Kd + k].x);
          ref += p, mag += std::fabs(p);
        }
        emu_check_close("wgt", w[n * Kd + k], ref, 1e-6 * mag, n * Kd + k);
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
  // BM = 64 (R < 128 E), an expert with rows but no weights (a cold expert's
  // LoRA adapter: zero rows).
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

// A failure ends the process (emu_die: _exit(1)) naming what the emulator caught.
TEST(ExpertMmaEmulated, IndexArithmeticHazardsAndResults) {
  MF_EMU_SKIP_UNDER_ASAN();
  EXPECT_EQ(run_all(), 0);
}
