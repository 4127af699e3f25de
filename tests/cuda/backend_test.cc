// The cuda backend's infrastructure (kernels/cuda/backend_cuda.h): creation with
// and without a GPU, the one arena, pinned host memory, copies of each kind,
// event ordering across two streams, stats, and the errors for kinds outside
// the operand table, missing operands and too little kernel scratch. GPU cases
// skip (counted as skipped) without a GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/cuda.h"
#include "src/core/core.h"
#include "tests/cuda/gpu_test_util.h"

namespace {

// mf_backend_free lives with the cpu backend; this test links only cuda.
void free_backend(mf_backend *b) {
  if (b) b->free(b);
}

// Runs everywhere: no GPU (or no CUDA in the build) is a clean error, never a crash.
TEST(CudaBackendCreate, WithoutGpuIsACleanError) {
  std::string why;
  bool have = mf_test_have_gpu(&why);
  mf_backend *b = reinterpret_cast<mf_backend *>(0x1);
  mf_status st = mf_backend_cuda_create(nullptr, &b);
  if (have) {
    ASSERT_EQ(st, MF_OK) << mf_last_error();
    ASSERT_NE(b, nullptr);
    EXPECT_STREQ(b->name, "cuda");
    free_backend(b);
    return;
  }
  EXPECT_EQ(b, nullptr);
  if (mf_cuda_compiled()) {
    EXPECT_EQ(st, MF_ERR_NO_DEVICE) << mf_last_error();
    EXPECT_NE(std::string(mf_last_error()).find("no usable GPU"), std::string::npos) << mf_last_error();
  } else {
    EXPECT_EQ(st, MF_ERR_UNSUPPORTED) << mf_last_error();
    EXPECT_NE(std::string(mf_last_error()).find("built without CUDA"), std::string::npos) << mf_last_error();
  }
}

TEST(CudaBackendCreate, BadDeviceOrdinalIsAnError) {
  MF_SKIP_WITHOUT_GPU();
  mf_cuda_backend_opts o = {};
  o.device = 1 << 20;
  mf_backend *b = nullptr;
  EXPECT_EQ(mf_backend_cuda_create(&o, &b), MF_ERR_NO_DEVICE);
  EXPECT_EQ(b, nullptr);
}

class CudaBackend : public ::testing::Test {
 protected:
  void SetUp() override {
    MF_SKIP_WITHOUT_GPU();
    ASSERT_EQ(mf_backend_cuda_create(nullptr, &b_), MF_OK) << mf_last_error();
    ASSERT_EQ(b_->stream_create(b_, &s_), MF_OK) << mf_last_error();
  }
  void TearDown() override {
    if (b_) {
      if (s_) b_->stream_free(b_, s_);
      free_backend(b_);
    }
  }
  mf_status run(mf_kernel_call *k) { return b_->run(b_, k, s_); }
  mf_backend *b_ = nullptr;
  mf_stream *s_ = nullptr;
};

TEST_F(CudaBackend, ArenaIsCreatedOnceAndUsableToItsLastByte) {
  const size_t bytes = (1u << 20) + 3;
  void *base = nullptr;
  ASSERT_EQ(b_->arena_create(b_, bytes, &base), MF_OK) << mf_last_error();
  ASSERT_NE(base, nullptr);
  void *again = reinterpret_cast<void *>(0x1);
  EXPECT_EQ(b_->arena_create(b_, 64, &again), MF_ERR_INTERNAL);
  EXPECT_EQ(again, nullptr);
  // The last 3 bytes: written and read back through the arena's end.
  uint8_t in[3] = {0xa5, 0x5a, 0x7e}, out[3] = {0, 0, 0};
  uint8_t *end = static_cast<uint8_t *>(base) + bytes - 3;
  ASSERT_EQ(b_->copy(b_, end, in, 3, MF_COPY_H2D, s_), MF_OK) << mf_last_error();
  ASSERT_EQ(b_->copy(b_, out, end, 3, MF_COPY_D2H, s_), MF_OK) << mf_last_error();
  ASSERT_EQ(b_->stream_sync(b_, s_), MF_OK) << mf_last_error();
  EXPECT_EQ(memcmp(in, out, 3), 0);
}

TEST_F(CudaBackend, CopiesOfEachKindRoundTripAndAreCounted) {
  const size_t n = (3u << 20) + 5;  // bytes, odd
  void *base = nullptr;
  ASSERT_EQ(b_->arena_create(b_, 2 * n, &base), MF_OK) << mf_last_error();
  uint8_t *d = static_cast<uint8_t *>(base);
  void *pin_in = nullptr, *pin_out = nullptr;
  ASSERT_EQ(b_->host_alloc(b_, n, &pin_in), MF_OK) << mf_last_error();
  ASSERT_EQ(b_->host_alloc(b_, n, &pin_out), MF_OK) << mf_last_error();
  std::mt19937 rng(11);
  for (size_t i = 0; i < n; i++) static_cast<uint8_t *>(pin_in)[i] = (uint8_t)rng();
  memset(pin_out, 0, n);
  ASSERT_EQ(b_->copy(b_, d, pin_in, n, MF_COPY_H2D, s_), MF_OK) << mf_last_error();
  ASSERT_EQ(b_->copy(b_, d + n, d, n, MF_COPY_D2D, s_), MF_OK) << mf_last_error();
  ASSERT_EQ(b_->copy(b_, pin_out, d + n, n, MF_COPY_D2H, s_), MF_OK) << mf_last_error();
  ASSERT_EQ(b_->stream_sync(b_, s_), MF_OK) << mf_last_error();
  EXPECT_EQ(memcmp(pin_in, pin_out, n), 0);
  // Pageable host memory works too.
  std::vector<uint8_t> page(n, 0);
  ASSERT_EQ(b_->copy(b_, page.data(), d, n, MF_COPY_D2H, s_), MF_OK) << mf_last_error();
  ASSERT_EQ(b_->stream_sync(b_, s_), MF_OK) << mf_last_error();
  EXPECT_EQ(memcmp(pin_in, page.data(), n), 0);
  mf_backend_stats st;
  b_->get_stats(b_, &st);
  EXPECT_EQ(st.bytes_h2d, (uint64_t)n);
  EXPECT_EQ(st.bytes_d2d, (uint64_t)n);
  EXPECT_EQ(st.bytes_d2h, (uint64_t)(2 * n));
  EXPECT_EQ(st.kernels, 0u);
  // Zero bytes is a no-op, and not counted.
  EXPECT_EQ(b_->copy(b_, d, pin_in, 0, MF_COPY_H2D, s_), MF_OK);
  b_->get_stats(b_, &st);
  EXPECT_EQ(st.bytes_h2d, (uint64_t)n);
  b_->host_free(b_, pin_in);
  b_->host_free(b_, pin_out);
}

// Stream 1 uploads x and adds 1 to it 16 times; stream 2 waits on an event
// recorded after that, then copies x out. Without the wait stream 2 would race
// ahead (it has no other reason to wait); with it, it sees all 16 additions.
TEST_F(CudaBackend, EventOrdersWorkAcrossTwoStreams) {
  const int64_t n = 1 << 22;
  const size_t bytes = (size_t)n * sizeof(float);
  void *base = nullptr;
  ASSERT_EQ(b_->arena_create(b_, 3 * bytes, &base), MF_OK) << mf_last_error();
  float *x = static_cast<float *>(base), *ones = x + n, *y = x + 2 * n;
  mf_stream *s1 = s_, *s2 = nullptr;
  ASSERT_EQ(b_->stream_create(b_, &s2), MF_OK) << mf_last_error();
  mf_event *ev = nullptr;
  ASSERT_EQ(b_->event_create(b_, &ev), MF_OK) << mf_last_error();
  void *host = nullptr;
  ASSERT_EQ(b_->host_alloc(b_, bytes, &host), MF_OK) << mf_last_error();
  float *h = static_cast<float *>(host);
  for (int64_t i = 0; i < n; i++) h[i] = (float)(i % 1000);
  ASSERT_EQ(b_->copy(b_, x, h, bytes, MF_COPY_H2D, s1), MF_OK);
  ASSERT_EQ(b_->stream_sync(b_, s1), MF_OK);  // h is reused below
  for (int64_t i = 0; i < n; i++) h[i] = 1.0f;
  ASSERT_EQ(b_->copy(b_, ones, h, bytes, MF_COPY_H2D, s1), MF_OK);
  ASSERT_EQ(b_->stream_sync(b_, s1), MF_OK);
  for (int r = 0; r < 16; r++) {
    mf_kernel_call k = {};
    k.kind = MF_K_ADD;
    k.b[0] = {ones, bytes, 0};
    k.b[1] = {x, bytes, 1};
    k.i[0] = n;
    ASSERT_EQ(b_->run(b_, &k, s1), MF_OK) << mf_last_error();
  }
  ASSERT_EQ(b_->event_record(b_, ev, s1), MF_OK) << mf_last_error();
  ASSERT_EQ(b_->stream_wait(b_, s2, ev), MF_OK) << mf_last_error();
  ASSERT_EQ(b_->copy(b_, y, x, bytes, MF_COPY_D2D, s2), MF_OK);
  memset(h, 0, bytes);
  ASSERT_EQ(b_->copy(b_, h, y, bytes, MF_COPY_D2H, s2), MF_OK);
  ASSERT_EQ(b_->stream_sync(b_, s2), MF_OK) << mf_last_error();
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++) bad += h[i] != (float)(i % 1000) + 16.0f;
  EXPECT_EQ(bad, 0);
  mf_backend_stats st;
  b_->get_stats(b_, &st);
  EXPECT_EQ(st.kernels, 16u);
  b_->host_free(b_, host);
  b_->event_free(b_, ev);
  b_->stream_free(b_, s2);
}

// A kind outside the operand table (kernels/backend.h: a corrupt call) fails
// before anything is launched, naming the kind's number and the call's label,
// and no kernel is counted. (Every kind of the table is one this backend has:
// ops_test, gemm_loss_test, attention_test and optim_backend_test run each.)
TEST_F(CudaBackend, KindsOutsideTheTableFailNamingThem) {
  const int kinds[] = {(int)MF_K_COUNT_, (int)MF_K_COUNT_ + 1, -1};
  for (int kind : kinds) {
    mf_kernel_call k = {};
    static_assert(sizeof k.kind == sizeof kind, "an enum is an int here");
    memcpy(&k.kind, &kind, sizeof kind);  // any bits, as a corrupt call would carry
    k.label = "layers.0.test";
    EXPECT_EQ(run(&k), MF_ERR_INVALID_ARG) << kind;
    std::string msg = mf_last_error();
    EXPECT_NE(msg.find("cuda backend"), std::string::npos) << msg;
    EXPECT_NE(msg.find("kernel kind " + std::to_string(kind)), std::string::npos) << msg;
    EXPECT_NE(msg.find("layers.0.test"), std::string::npos) << msg;
  }
  mf_backend_stats st;
  b_->get_stats(b_, &st);
  EXPECT_EQ(st.kernels, 0u);
}

TEST_F(CudaBackend, MissingOperandIsAnError) {
  void *base = nullptr;
  ASSERT_EQ(b_->arena_create(b_, 64, &base), MF_OK);
  mf_kernel_call k = {};
  k.kind = MF_K_ADD;
  k.b[0] = {base, 64, 0};
  k.b[1] = {nullptr, 64, 1};
  k.i[0] = 16;
  EXPECT_EQ(run(&k), MF_ERR_INVALID_ARG);
  EXPECT_NE(std::string(mf_last_error()).find("operand 1"), std::string::npos) << mf_last_error();
}

TEST_F(CudaBackend, ZeroClearsExactlyItsBytes) {
  void *base = nullptr;
  const size_t bytes = 4099;
  ASSERT_EQ(b_->arena_create(b_, bytes, &base), MF_OK);
  std::vector<uint8_t> h(bytes, 0xcd), out(bytes, 0);
  ASSERT_EQ(b_->copy(b_, base, h.data(), bytes, MF_COPY_H2D, s_), MF_OK);
  mf_kernel_call k = {};
  k.kind = MF_K_ZERO;
  k.b[0] = {static_cast<uint8_t *>(base) + 1, bytes - 2, 1};
  ASSERT_EQ(run(&k), MF_OK) << mf_last_error();
  ASSERT_EQ(b_->copy(b_, out.data(), base, bytes, MF_COPY_D2H, s_), MF_OK);
  ASSERT_EQ(b_->stream_sync(b_, s_), MF_OK) << mf_last_error();
  EXPECT_EQ(out[0], 0xcd);
  EXPECT_EQ(out[bytes - 1], 0xcd);
  size_t nonzero = 0;
  for (size_t i = 1; i + 1 < bytes; i++) nonzero += out[i] != 0;
  EXPECT_EQ(nonzero, 0u);
}

// Kernel scratch is fixed at create: a call that needs more fails cleanly.
TEST(CudaBackendScratch, TooLittleScratchIsAnErrorNotAnAllocation) {
  MF_SKIP_WITHOUT_GPU();
  mf_cuda_backend_opts o = {};
  o.scratch_bytes = 256;
  mf_backend *b = nullptr;
  ASSERT_EQ(mf_backend_cuda_create(&o, &b), MF_OK) << mf_last_error();
  const int64_t R = 1000, C = 1000;
  void *base = nullptr;
  ASSERT_EQ(b->arena_create(b, (size_t)(3 * R * C + 2 * C + R) * 4, &base), MF_OK) << mf_last_error();
  float *p = static_cast<float *>(base);
  mf_kernel_call k = {};
  k.kind = MF_K_RMSNORM_BWD;
  k.b[0] = {p, (size_t)(R * C) * 4, 0};
  k.b[1] = {p + R * C, (size_t)(R * C) * 4, 0};
  k.b[2] = {p + 2 * R * C, (size_t)C * 4, 0};
  k.b[3] = {p + 2 * R * C + C, (size_t)R * 4, 0};
  k.b[4] = {p + 2 * R * C + C + R, (size_t)(R * C) * 4, 1};
  k.b[5] = {p + 3 * R * C + C + R, (size_t)C * 4, 1};
  k.i[0] = R;
  k.i[1] = C;
  EXPECT_EQ(b->run(b, &k, nullptr), MF_ERR_OUT_OF_MEMORY);
  EXPECT_NE(std::string(mf_last_error()).find("scratch"), std::string::npos) << mf_last_error();
  free_backend(b);
}

// Host functions run in their stream's order: a host copy into a pinned buffer,
// then the upload of that buffer and a copy home see the host copy's bytes. The
// staging arena's fill and copy-out rely on this order (src/exec/exec_staging.c).
struct HostCopy {
  const uint8_t *from;
  uint8_t *to;
  size_t n;
  static void Run(void *ctx) {
    HostCopy *h = (HostCopy *)ctx;
    memcpy(h->to, h->from, h->n);
  }
};

TEST_F(CudaBackend, HostFunctionsRunInStreamOrder) {
  const size_t n = 8u << 20;
  void *base = nullptr;
  ASSERT_EQ(b_->arena_create(b_, n, &base), MF_OK) << mf_last_error();
  void *a = nullptr, *c = nullptr;
  ASSERT_EQ(b_->host_alloc(b_, n, &a), MF_OK) << mf_last_error();
  ASSERT_EQ(b_->host_alloc(b_, n, &c), MF_OK) << mf_last_error();
  std::vector<uint8_t> src(n);
  std::mt19937 rng(5);
  for (auto &v : src) v = (uint8_t)rng();
  memset(a, 0, n);
  memset(c, 0, n);
  // fill a (host function), upload a, copy it home into c: c == src.
  HostCopy fill{src.data(), static_cast<uint8_t *>(a), n};
  ASSERT_EQ(b_->host_fn(b_, s_, HostCopy::Run, &fill), MF_OK) << mf_last_error();
  ASSERT_EQ(b_->copy(b_, base, a, n, MF_COPY_H2D, s_), MF_OK) << mf_last_error();
  ASSERT_EQ(b_->copy(b_, c, base, n, MF_COPY_D2H, s_), MF_OK) << mf_last_error();
  ASSERT_EQ(b_->stream_sync(b_, s_), MF_OK) << mf_last_error();
  EXPECT_EQ(memcmp(c, src.data(), n), 0);
  b_->host_free(b_, a);
  b_->host_free(b_, c);
}

TEST_F(CudaBackend, EventQueryAndTimedEvents) {
  const size_t n = 64u << 20;
  void *base = nullptr;
  ASSERT_EQ(b_->arena_create(b_, n, &base), MF_OK) << mf_last_error();
  mf_event *t0 = nullptr, *t1 = nullptr, *e = nullptr;
  ASSERT_EQ(b_->event_create_timed(b_, &t0), MF_OK) << mf_last_error();
  ASSERT_EQ(b_->event_create_timed(b_, &t1), MF_OK) << mf_last_error();
  ASSERT_EQ(b_->event_create(b_, &e), MF_OK) << mf_last_error();
  int done = -1;
  ASSERT_EQ(b_->event_query(b_, e, &done), MF_OK) << mf_last_error();
  EXPECT_EQ(done, 1) << "never recorded";
  ASSERT_EQ(b_->event_record(b_, t0, s_), MF_OK);
  mf_kernel_call k;
  memset(&k, 0, sizeof k);
  k.kind = MF_K_ZERO;
  k.b[0] = {base, n, 1};
  for (int r = 0; r < 20; r++) ASSERT_EQ(run(&k), MF_OK) << mf_last_error();
  ASSERT_EQ(b_->event_record(b_, t1, s_), MF_OK);
  ASSERT_EQ(b_->event_record(b_, e, s_), MF_OK);
  ASSERT_EQ(b_->stream_sync(b_, s_), MF_OK) << mf_last_error();
  ASSERT_EQ(b_->event_query(b_, e, &done), MF_OK) << mf_last_error();
  EXPECT_EQ(done, 1);
  double sec = 0;
  ASSERT_EQ(b_->event_elapsed(b_, t0, t1, &sec), MF_OK) << mf_last_error();
  // 20 x 64 MiB of writes: more than nothing, less than a second on any GPU.
  EXPECT_GT(sec, 0.0);
  EXPECT_LT(sec, 1.0);
  EXPECT_NE(b_->event_elapsed(b_, t0, e, &sec), MF_OK) << "an event without timing";
  b_->event_free(b_, t0);
  b_->event_free(b_, t1);
  b_->event_free(b_, e);
}

}  // namespace
