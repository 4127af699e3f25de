// Throughput of the cpu kernels: printed, not asserted (machines vary), so not
// part of the test run (tagged bench). Run with
//   bazel test //tests/kernels:kernels_bench --test_output=all
// "wall" is GFLOP per elapsed second; "per core" is GFLOP per CPU-second of the
// process, which stays meaningful on a shared machine.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "src/core/core.h"
#include "tests/kernels/fd.h"
#include "tests/kernels/kernel_test_util.h"

namespace {

using mf_fd::random_vec;
using mf_kt::Pool;
using std::vector;

double cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

// The linear kernels at the shapes the brief names, on the calling thread and
// on a pool of all cores.
TEST(Linear, Throughput) {
  struct Shape {
    int64_t M, N, K;
  };
  const Shape shapes[] = {{1024, 64, 64}, {1024, 256, 256}, {1024, 512, 512}, {1024, 256, 64}};
  const char *names[3] = {"fwd", "bwd_data", "bwd_weight"};
  Pool all(0);
  for (mf_threadpool *p : {(mf_threadpool *)nullptr, all.p}) {
    mf_kctx ctx = {p, 0};
    for (const Shape &s : shapes) {
      auto x = random_vec(s.M * s.K, 61), W = random_vec(s.N * s.K, 62), dy = random_vec(s.M * s.N, 63);
      vector<float> y(s.M * s.N), dx(s.M * s.K), dW(s.N * s.K, 0.0f);
      double flops = 2.0 * s.M * s.N * s.K;
      printf("linear M=%lld N=%lld K=%lld threads=%d:", (long long)s.M, (long long)s.N, (long long)s.K,
             mf_threadpool_size(p));
      for (int op = 0; op < 3; op++) {
        int reps = 0;
        double t0 = mf_time_now(), c0 = cpu_seconds(), t;
        do {
          if (op == 0) mf_cpu_linear_fwd(x.data(), W.data(), nullptr, s.M, s.N, s.K, y.data(), 0, &ctx);
          if (op == 1) mf_cpu_linear_bwd_data(dy.data(), W.data(), s.M, s.N, s.K, dx.data(), 0, &ctx);
          if (op == 2) mf_cpu_linear_bwd_weight(dy.data(), x.data(), s.M, s.N, s.K, dW.data(), nullptr, &ctx);
          reps++;
          t = mf_time_now() - t0;
        } while (t < 0.2);
        double c = cpu_seconds() - c0;
        printf("  %s %.1f wall, %.1f per core", names[op], flops * reps / t / 1e9, flops * reps / c / 1e9);
      }
      printf(" GFLOP/s\n");
    }
  }
}

// Causal GQA attention, forward and backward, on 1 and 2 threads: the best of 5.
TEST(Attention, Throughput) {
  struct Shape {
    int64_t B, S, Hq, Hkv, D;
  };
  const Shape shapes[] = {{8, 128, 4, 2, 16}, {1, 1024, 16, 4, 64}};
  for (const Shape &sh : shapes) {
    const int64_t nq = sh.B * sh.S * sh.Hq * sh.D, nkv = sh.B * sh.S * sh.Hkv * sh.D;
    const float scale = 1.0f / std::sqrt((float)sh.D);
    vector<float> q = random_vec(nq, 1), k = random_vec(nkv, 2), v = random_vec(nkv, 3), dout = random_vec(nq, 4);
    vector<float> o(nq), lse(sh.B * sh.Hq * sh.S), dq(nq), dk(nkv), dv(nkv);
    const double fwd_flops = 4.0 * sh.B * sh.Hq * (double)sh.S * sh.S * sh.D / 2;
    for (int n : {1, 2}) {
      Pool pool(n);
      mf_kctx ctx = {pool.p, 0};
      double tf = 1e30, tb = 1e30;
      for (int rep = 0; rep < 5; rep++) {
        double t0 = mf_time_now();
        mf_cpu_attn_fwd(q.data(), k.data(), v.data(), sh.B, sh.S, sh.Hq, sh.Hkv, sh.D, sh.D, 0, nullptr, scale,
                        o.data(), lse.data(), &ctx);
        double t1 = mf_time_now();
        mf_cpu_attn_bwd(q.data(), k.data(), v.data(), o.data(), dout.data(), lse.data(), sh.B, sh.S, sh.Hq,
                        sh.Hkv, sh.D, sh.D, 0, nullptr, scale, dq.data(), dk.data(), dv.data(), nullptr, &ctx);
        double t2 = mf_time_now();
        tf = std::min(tf, t1 - t0);
        tb = std::min(tb, t2 - t1);
      }
      // Backward FLOPs: 2.5x the forward (5 matmuls to the forward's 2).
      printf("attention B=%lld S=%lld Hq=%lld Hkv=%lld D=%lld threads=%d  fwd %.3f ms %.2f GFLOP/s  bwd %.3f ms "
             "%.2f GFLOP/s  fwd+bwd %.2f GFLOP/s\n",
             (long long)sh.B, (long long)sh.S, (long long)sh.Hq, (long long)sh.Hkv, (long long)sh.D, n, tf * 1e3,
             fwd_flops / tf * 1e-9, tb * 1e3, 2.5 * fwd_flops / tb * 1e-9, 3.5 * fwd_flops / (tf + tb) * 1e-9);
    }
  }
}

}  // namespace
