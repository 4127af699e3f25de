// The operand table (kernels/backend.h mf_kernel_info_of): one entry per kind,
// consistent with itself; the roles the planner reads come from it; and the
// checks both backends make of a call (mf_kernel_call_check) and the cpu
// backend's checking mode name the kernel and the operand by it. The cuda
// backend runs the same check (tests/cuda/backend_test.cc, on a GPU).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/registry.h"
#include "src/core/core.h"

namespace {

bool has(const std::string &s, const std::string &part) {
  return s.find(part) != std::string::npos;
}

TEST(KernelTable, EveryKindHasOneConsistentEntry) {
  std::set<std::string> names;
  for (int kind = 0; kind < MF_K_COUNT_; kind++) {
    const mf_kernel k = (mf_kernel)kind;
    const mf_kernel_info *t = mf_kernel_info_of(k);
    ASSERT_NE(t, nullptr) << kind;
    ASSERT_NE(t->name, nullptr) << kind;
    SCOPED_TRACE(t->name);
    EXPECT_STREQ(mf_kernel_name(k), t->name);
    EXPECT_TRUE(names.insert(t->name).second) << "two kinds named " << t->name;
    const int n = mf_kernel_n_operands(k);
    EXPECT_GE(n, 1);
    std::set<std::string> ops;
    int acc_operands = 0;
    for (int j = 0; j < MF_KBUF_MAX; j++) {
      if (j >= n) {
        EXPECT_EQ(t->b[j].name, nullptr) << "operand " << j << " after the last";
        continue;
      }
      EXPECT_TRUE(ops.insert(t->b[j].name).second) << "two operands named " << t->b[j].name;
      const mf_kop_role r = t->b[j].role;
      EXPECT_TRUE(r == MF_KOP_READ || r == MF_KOP_WRITE || r == MF_KOP_ADD || r == MF_KOP_ACCUMULATE)
          << t->b[j].name << ": role " << (int)r;
      acc_operands += r == MF_KOP_ACCUMULATE;
    }
    int acc_sizes = 0;
    for (int j = 0; j < 8 && t->i[j]; j++) acc_sizes += std::string(t->i[j]) == "accumulate";
    EXPECT_EQ(acc_sizes, acc_operands > 0 ? 1 : 0) << "an accumulate size goes with ACCUMULATE operands";
    const bool expert_kind = k == MF_K_EXPERT_FWD || k == MF_K_EXPERT_BWD_DATA || k == MF_K_EXPERT_BWD_WEIGHT;
    EXPECT_EQ(t->experts.name != nullptr, expert_kind);
  }
  EXPECT_EQ(mf_kernel_info_of(MF_K_COUNT_), nullptr);
  EXPECT_STREQ(mf_kernel_name(MF_K_COUNT_), "unknown");
  EXPECT_EQ(mf_kernel_n_operands(MF_K_COUNT_), 0);
}

// A few kinds' roles as their cpu twins document them (kernels/cpu/cpu_ops.h).
TEST(KernelTable, RolesAreTheTwinsContract) {
  mf_kernel_call k = {};
  k.kind = MF_K_LINEAR_FWD;  // {x, W, bias?, y}; y written, or added when accumulate
  EXPECT_EQ(mf_kernel_writes(&k), 0x8u);
  EXPECT_EQ(mf_kernel_reads(&k), 0x7u);
  k.i[3] = 1;
  EXPECT_EQ(mf_kernel_reads(&k), 0xfu);
  EXPECT_TRUE(mf_kernel_accumulates(&k));
  k = {};
  k.kind = MF_K_MOE_GATHER_BWD;  // {dxe, row_of, dx}; i = {T, K, H, accumulate}
  k.i[3] = 1;
  EXPECT_EQ(mf_kernel_reads(&k), 0x7u);
  k.i[3] = 0;
  EXPECT_EQ(mf_kernel_reads(&k), 0x3u);
  EXPECT_EQ(mf_kernel_writes(&k), 0x4u);
  k = {};
  k.kind = MF_K_CROSS_ENTROPY;  // {h, W, target, ws, lse, scalars, dh?, dW? (added)}
  EXPECT_EQ(mf_kernel_writes(&k), 0xf8u);
  EXPECT_EQ(mf_kernel_reads(&k), 0x87u);
  const mf_kernel_info *ce = mf_kernel_info_of(MF_K_CROSS_ENTROPY);
  EXPECT_TRUE(ce->b[6].optional && ce->b[7].optional && !ce->b[5].optional);
  // attention: gpt-oss's sinks optional (read), their gradient optional and added into; the window a size
  const mf_kernel_info *af = mf_kernel_info_of(MF_K_ATTN_FWD), *ab = mf_kernel_info_of(MF_K_ATTN_BWD);
  EXPECT_EQ(mf_kernel_n_operands(MF_K_ATTN_FWD), 6);
  EXPECT_EQ(mf_kernel_n_operands(MF_K_ATTN_BWD), 11);
  EXPECT_LE(mf_kernel_n_operands(MF_K_ATTN_BWD), MF_KBUF_MAX);
  EXPECT_STREQ(af->b[5].name, "sinks");
  EXPECT_TRUE(af->b[5].optional && af->b[5].role == MF_KOP_READ && af->b[5].type == MF_KT_FLOAT);
  EXPECT_STREQ(ab->b[9].name, "sinks");
  EXPECT_STREQ(ab->b[10].name, "dsinks");
  EXPECT_TRUE(ab->b[9].optional && ab->b[10].optional && ab->b[10].role == MF_KOP_ADD);
  EXPECT_EQ(ab->b[10].type, MF_KT_F32);
  EXPECT_STREQ(af->i[6], "window");
  EXPECT_STREQ(ab->i[6], "window");
  k.kind = MF_K_ATTN_BWD;  // {q, k, v, o, dout, lse, dq, dk, dv, sinks?, dsinks? (added)}
  EXPECT_EQ(mf_kernel_writes(&k), 0x5c0u);
  EXPECT_EQ(mf_kernel_reads(&k), 0x63fu);
  k.kind = MF_K_ROPE_BWD;  // in place on dx
  EXPECT_EQ(mf_kernel_writes(&k), 0x1u);
  EXPECT_EQ(mf_kernel_reads(&k), 0x3u);
  // expert parallelism's exchanges: rows and their layout written, the local layout read
  k.kind = MF_K_EP_DISPATCH;  // {x, loffs, y, offsets, segments, counts?, starts?, seeds?}
  EXPECT_EQ(mf_kernel_writes(&k), 0xfcu);
  EXPECT_EQ(mf_kernel_reads(&k), 0x3u);
  k.kind = MF_K_DROPOUT;  // {x, y, segments?, starts?, seeds?}: the parts of received rows read
  EXPECT_EQ(mf_kernel_writes(&k), 0x2u);
  EXPECT_EQ(mf_kernel_reads(&k), 0x1du);
  k.kind = MF_K_EP_COMBINE;  // {y, offsets, segments, loffs, x}
  EXPECT_EQ(mf_kernel_writes(&k), 0x10u);
  EXPECT_EQ(mf_kernel_reads(&k), 0xfu);
  for (int kind = 0; kind < MF_K_COUNT_; kind++)
    EXPECT_EQ(mf_kernel_is_exchange((mf_kernel)kind), kind == MF_K_EP_DISPATCH || kind == MF_K_EP_COMBINE);
  // the weight gradient's optional parts (expert parallelism's sources)
  const mf_kernel_info *bw = mf_kernel_info_of(MF_K_EXPERT_BWD_WEIGHT);
  EXPECT_STREQ(bw->b[3].name, "segments");
  EXPECT_TRUE(bw->b[3].optional && bw->b[3].role == MF_KOP_READ && bw->b[3].type == MF_KT_I64);
  EXPECT_STREQ(bw->i[3], "sources");
  k = {};
  EXPECT_TRUE(mf_kernel_writes_experts(MF_K_EXPERT_BWD_WEIGHT));
  EXPECT_FALSE(mf_kernel_writes_experts(MF_K_EXPERT_FWD));
  EXPECT_FALSE(mf_kernel_writes_experts(MF_K_COUNT_));
  k.kind = MF_K_COUNT_;
  EXPECT_EQ(mf_kernel_writes(&k), 0u);
  EXPECT_EQ(mf_kernel_reads(&k), 0u);
  char buf[64];
  EXPECT_STREQ(mf_kernel_operand_text(MF_K_LINEAR_FWD, 2, buf, sizeof buf), "operand 2 (bias)");
  EXPECT_STREQ(mf_kernel_operand_text(MF_K_EXPERT_FWD, 103, buf, sizeof buf), "operand W[3]");
}

class CpuBackendChecks : public ::testing::Test {
 protected:
  void make(int checking, mf_cpu_streams streams = MF_CPU_STREAMS_IMMEDIATE) {
    mf_cpu_backend_opts o = {};
    o.checking = checking;
    o.streams = streams;
    ASSERT_EQ(mf_backend_cpu_create(&o, &b_), MF_OK) << mf_last_error();
    ASSERT_EQ(b_->stream_create(b_, &s_), MF_OK) << mf_last_error();
    void *base = nullptr;
    ASSERT_EQ(b_->arena_create(b_, kArena, &base), MF_OK) << mf_last_error();
    arena_ = static_cast<float *>(base);
  }
  void TearDown() override {
    if (b_ && s_) b_->stream_free(b_, s_);
    mf_backend_free(b_);
  }
  uint64_t kernels() {
    mf_backend_stats st;
    b_->get_stats(b_, &st);
    return st.kernels;
  }
  static constexpr size_t kArena = 4096;
  mf_backend *b_ = nullptr;
  mf_stream *s_ = nullptr;
  float *arena_ = nullptr;
};

// The cuda backend's KindsOutsideTheTableFailNamingThem, on the cpu backend.
TEST_F(CpuBackendChecks, KindsOutsideTheTableFailNamingThem) {
  for (mf_cpu_streams mode : {MF_CPU_STREAMS_IMMEDIATE, MF_CPU_STREAMS_LAZY}) {
    make(0, mode);
    for (int kind : {(int)MF_K_COUNT_, (int)MF_K_COUNT_ + 1, -1}) {
      mf_kernel_call k = {};
      static_assert(sizeof k.kind == sizeof kind, "an enum is an int here");
      memcpy(&k.kind, &kind, sizeof kind);
      k.label = "layers.0.test";
      EXPECT_EQ(b_->run(b_, &k, s_), MF_ERR_INVALID_ARG) << kind;
      const std::string msg = mf_last_error();
      EXPECT_TRUE(has(msg, "cpu backend")) << msg;
      EXPECT_TRUE(has(msg, "kernel kind " + std::to_string(kind))) << msg;
      EXPECT_TRUE(has(msg, "layers.0.test")) << msg;
    }
    EXPECT_EQ(b_->stream_sync(b_, s_), MF_OK) << mf_last_error();
    EXPECT_EQ(kernels(), 0u);
    TearDown();
    b_ = nullptr, s_ = nullptr;
  }
}

TEST_F(CpuBackendChecks, RequiredOperandsMustBePresentOptionalOnesMayNot) {
  make(0);
  mf_kernel_call k = {};
  k.kind = MF_K_ADD;
  k.b[0] = {arena_, 64, 0};
  k.b[1] = {nullptr, 64, 1};
  k.i[0] = 16;
  k.label = "layers.2.add";
  EXPECT_EQ(b_->run(b_, &k, s_), MF_ERR_INVALID_ARG);
  EXPECT_TRUE(has(mf_last_error(), "kernel add in layers.2.add: operand 1 (y), 64 bytes, is NULL"))
      << mf_last_error();
  EXPECT_EQ(kernels(), 0u);
  // LINEAR_FWD without its optional bias: y = x . W^T, 1 x 2 x 2.
  float *x = arena_, *W = arena_ + 2, *y = arena_ + 6;
  const float xv[2] = {1, 2}, Wv[4] = {1, 0, 3, 4};
  memcpy(x, xv, sizeof xv);
  memcpy(W, Wv, sizeof Wv);
  k = {};
  k.kind = MF_K_LINEAR_FWD;
  k.b[0] = {x, 8, 0};
  k.b[1] = {W, 16, 0};
  k.b[3] = {y, 8, 1};
  k.i[0] = 1, k.i[1] = 2, k.i[2] = 2;
  ASSERT_EQ(b_->run(b_, &k, s_), MF_OK) << mf_last_error();
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], 11.0f);
  EXPECT_EQ(kernels(), 1u);
}

// The checking mode names the operand that is not resident by the table.
TEST_F(CpuBackendChecks, CheckingModeNamesTheOperand) {
  make(1);
  ASSERT_EQ(b_->mark(b_, arena_, 1024, 1), MF_OK) << mf_last_error();
  mf_kernel_call k = {};
  k.kind = MF_K_ADD;
  k.b[0] = {arena_, 64, 0};
  k.b[1] = {arena_ + 512, 64, 1};  // bytes [2048, 2112): not live
  k.i[0] = 16, k.i[1] = 1;
  k.label = "layers.1.residual";
  EXPECT_EQ(b_->run(b_, &k, s_), MF_ERR_INTERNAL);
  std::string msg = mf_last_error();
  EXPECT_TRUE(has(msg,
                  "residency check: add in layers.1.residual operand 1 (y) reads or writes arena bytes "
                  "[2048, 2112)"))
      << msg;
  // An expert weight outside the arena.
  std::vector<float> outside(16, 0.0f);
  int64_t offsets[3] = {0, 1, 1};
  memcpy(arena_ + 16, offsets, sizeof offsets);
  void *w[2] = {arena_ + 64, outside.data()};
  k = {};
  k.kind = MF_K_EXPERT_FWD;
  k.b[0] = {arena_ + 32, 16, 0};
  k.b[1] = {arena_ + 16, sizeof offsets, 0};
  k.b[2] = {arena_ + 48, 16, 1};
  k.i[0] = 2, k.i[1] = 4, k.i[2] = 4;
  k.experts = w;
  k.expert_bytes = 64;
  EXPECT_EQ(b_->run(b_, &k, s_), MF_ERR_INTERNAL);
  msg = mf_last_error();
  EXPECT_TRUE(has(msg, "expert_fwd operand W[1] (64 bytes) is not in the device arena")) << msg;
  EXPECT_EQ(kernels(), 0u);
}

}  // namespace

// The expert GEMM kernel choice (kernels/registry.h): the cpu backend has one
// kernel, so it names none and refuses a switch saying so; an unknown kernel
// name is an argument error naming it, on any backend.
TEST_F(CpuBackendChecks, ExpertGemmChoiceIsCudaOnly) {
  make(0);
  EXPECT_EQ(mf_backend_expert_gemm(b_), nullptr);
  EXPECT_EQ(mf_backend_set_expert_gemm(b_, "cutlass"), MF_ERR_UNSUPPORTED);
  EXPECT_NE(std::string(mf_last_error()).find("the cpu backend has one expert GEMM kernel"),
            std::string::npos)
      << mf_last_error();
  EXPECT_EQ(mf_backend_set_expert_gemm(b_, "wgmma"), MF_ERR_INVALID_ARG);
  EXPECT_NE(std::string(mf_last_error()).find("'wgmma': expected mma or cutlass"), std::string::npos)
      << mf_last_error();
}

// The same for the attention kernels (mma.sync or cuDNN on cuda).
TEST_F(CpuBackendChecks, AttentionChoiceIsCudaOnly) {
  make(0);
  EXPECT_EQ(mf_backend_attention(b_), nullptr);
  EXPECT_EQ(mf_backend_set_attention(b_, "cudnn"), MF_ERR_UNSUPPORTED);
  EXPECT_NE(std::string(mf_last_error()).find("the cpu backend has one attention kernel"), std::string::npos)
      << mf_last_error();
  EXPECT_EQ(mf_backend_set_attention(b_, "flash"), MF_ERR_INVALID_ARG);
  EXPECT_NE(std::string(mf_last_error()).find("'flash': expected mma or cudnn"), std::string::npos)
      << mf_last_error();
}
