// The twin harness's case table on the CPU (runs in CI; the GPU part is
// twin_harness_test.cc): every kernel kind of kernels/backend.h has cases in
// each storage it computes in (a kind added without one fails here), a kind
// that runs in one storage only says why and has no FLOAT operand; every case
// is a valid call (mf_kernel_call_check, operand bytes against the sizes,
// integer operands in range: twin_case_check.cc) that fits the GPU test's
// arena; the cpu backend runs every case in each storage, gives the same bits
// on host operands and on arena operands (checking mode, a thread pool),
// changes something, writes finite values, and touches no byte outside the
// operands the table says it writes; and the comparison names the case, the
// operand and its worst element.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "src/core/core.h"
#include "src/optim/optim.h"
#include "tests/cuda/twin_cases.h"

namespace {

constexpr size_t kGpuArena = size_t(256) << 20;  // twin_harness_test.cc's

bool has(const std::string &s, const std::string &part) {
  return s.find(part) != std::string::npos;
}

std::string joined(const std::vector<std::string> &v) {
  std::string s;
  for (const std::string &x : v) s += "\n  " + x;
  return s;
}

// Every case of every kind, in every storage its entry lists.
std::vector<MfKernelCase> every_case() {
  std::vector<MfKernelCase> all;
  for (const MfCaseEntry &e : mf_case_table())
    for (mf_dtype st : mf_case_storages(e))
      for (size_t s = 0; s < e.shapes.size(); s++) all.push_back(mf_case_make(e, s, st));
  return all;
}

TEST(TwinCases, EveryKindHasCasesInEachStorageItComputes) {
  size_t kernels = 0;
  for (int k = 0; k < MF_K_COUNT_; k++) {
    const mf_kernel kind = (mf_kernel)k;
    const MfCaseEntry *e = mf_case_entry(kind);
    if (mf_kernel_is_exchange(kind)) {  // between ranks, not a kernel: no twin
      EXPECT_EQ(e, nullptr) << mf_kernel_name(kind) << " is an exchange between ranks, not a kernel";
      continue;
    }
    kernels++;
    if (!e) {
      ADD_FAILURE() << mf_kernel_name(kind) << " (kind " << k
                    << ") has no entry in tests/cuda/twin_case_table.cc: give it shapes, a builder and "
                       "tolerances, so the twin harness runs it on the GPU";
      continue;
    }
    SCOPED_TRACE(mf_kernel_name(kind));
    // One storage exactly where no operand is FLOAT; both where some is.
    if (mf_case_has_float(kind))
      EXPECT_EQ(e->one_storage, nullptr) << "has FLOAT operands: it computes in F32 and BF16 storage";
    else
      EXPECT_NE(e->one_storage, nullptr) << "has no FLOAT operand: its entry says why one run covers it";
    EXPECT_FALSE(e->shapes.empty());
    for (mf_dtype st : mf_case_storages(*e)) EXPECT_FALSE(mf_case_all(kind, st).empty()) << mf_dtype_name(st);
    // Tolerances: a "*" rule; the others name written operands of the kind.
    const mf_kernel_info *t = mf_kernel_info_of(kind);
    bool any = false;
    for (const MfCaseTolRule &r : e->tol) {
      any |= std::string(r.operand) == "*";
      bool named = std::string(r.operand) == "*" || (std::string(r.operand) == "experts" && t->experts.name);
      for (int j = 0; j < mf_kernel_n_operands(kind); j++)
        named |= std::string(r.operand) == t->b[j].name && (t->b[j].role & MF_KOP_WRITE);
      EXPECT_TRUE(named) << "the tolerance of \"" << r.operand << "\": not an operand the kind writes";
    }
    EXPECT_TRUE(any) << "no \"*\" tolerance";
  }
  // One entry per kind, in kind order.
  const std::vector<MfCaseEntry> &table = mf_case_table();
  for (size_t i = 1; i < table.size(); i++)
    EXPECT_LT((int)table[i - 1].kind, (int)table[i].kind)
        << "entry " << i << ": " << mf_kernel_name(table[i].kind);
  EXPECT_EQ(table.size(), kernels);
}

TEST(TwinCases, EveryCaseIsAValidCall) {
  size_t n = 0;
  for (const MfKernelCase &c : every_case()) {
    const std::vector<std::string> bad = mf_case_problems(c);
    EXPECT_TRUE(bad.empty()) << joined(bad);
    EXPECT_LE(mf_case_arena_bytes(c), kGpuArena) << c.name << ": does not fit the GPU test's arena";
    EXPECT_EQ(c.storage == MF_DTYPE_BF16 ? " BF16"
              : c.entry->one_storage     ? ""
                                         : " F32",
              c.name.substr(c.data_name.size()))
        << c.name;
    n++;
  }
  EXPECT_GT(n, 2u * MF_K_COUNT_);
}

// The problems of a case that is not a valid call are found.
TEST(TwinCases, InvalidCallsAreFound) {
  MfKernelCase c = mf_case_make(*mf_case_entry(MF_K_EMBED_FWD), 1, MF_DTYPE_F32);
  ASSERT_TRUE(mf_case_problems(c).empty());
  int32_t *ids = reinterpret_cast<int32_t *>(c.ops[0].data());
  ids[3] = 5;  // V = 5
  std::vector<std::string> bad = mf_case_problems(c);
  ASSERT_EQ(bad.size(), 1u) << joined(bad);
  EXPECT_TRUE(has(bad[0], "operand ids: element 3 is 5, outside [0, 4]")) << bad[0];
  c = mf_case_make(*mf_case_entry(MF_K_LINEAR_FWD), 1, MF_DTYPE_BF16);
  c.ops[1].resize(c.ops[1].size() - 2);
  c.call.b[1].bytes -= 2;
  bad = mf_case_problems(c);
  ASSERT_EQ(bad.size(), 1u) << joined(bad);
  EXPECT_TRUE(has(bad[0], "linear_fwd M=37 N=129 K=65 accumulate=0 bias=1 BF16: operand W: 16768 bytes"))
      << bad[0];
  c.call.b[1].dtype = MF_DTYPE_F32;
  bad = mf_case_problems(c);
  EXPECT_TRUE(!bad.empty() && has(bad[0], "mf_kernel_call_check")) << joined(bad);
  c = mf_case_make(*mf_case_entry(MF_K_MOE_COMBINE), 2, MF_DTYPE_F32);
  reinterpret_cast<int32_t *>(c.ops[2].data())[0] = reinterpret_cast<int32_t *>(c.ops[2].data())[1];
  bad = mf_case_problems(c);
  ASSERT_EQ(bad.size(), 1u) << joined(bad);
  EXPECT_TRUE(has(bad[0], "operand row_of: is not a permutation")) << bad[0];
}

// A cpu backend with an arena of `bytes` and its stream.
struct Cpu {
  mf_backend *b = nullptr;
  mf_stream *s = nullptr;
  mf_threadpool *pool = nullptr;
  uint8_t *arena = nullptr;
  Cpu(size_t arena_bytes, int checking, int threads) {
    if (threads) {
      EXPECT_EQ(mf_threadpool_create(threads, &pool), MF_OK) << mf_last_error();
    }
    mf_cpu_backend_opts o = {};
    o.pool = pool;
    o.checking = checking;
    o.optim = mf_optim_run_kernel;  // GRAD_SUMSQ, ADAMW
    EXPECT_EQ(mf_backend_cpu_create(&o, &b), MF_OK) << mf_last_error();
    if (!b) return;
    EXPECT_EQ(b->stream_create(b, &s), MF_OK) << mf_last_error();
    void *base = nullptr;
    if (arena_bytes) {
      EXPECT_EQ(b->arena_create(b, arena_bytes, &base), MF_OK) << mf_last_error();
    }
    arena = static_cast<uint8_t *>(base);
  }
  ~Cpu() {
    if (b && s) b->stream_free(b, s);
    mf_backend_free(b);
    mf_threadpool_free(pool);
  }
};

// Operands in a cpu arena, each marked live with a 256-byte gap after it; the
// arena's bytes are kept when the last operand is placed.
class ArenaMemory : public MfCaseMemory {
 public:
  ArenaMemory(Cpu *cpu, size_t cap) : cpu_(cpu), cap_(cap) {}
  void *put(const std::vector<uint8_t> &bytes, std::string *why) override {
    const size_t at = off_;
    off_ += (bytes.size() + 255) / 256 * 256 + 256;
    if (off_ > cap_) {
      *why = "the arena is full";
      return nullptr;
    }
    uint8_t *p = cpu_->arena + at;
    EXPECT_EQ(cpu_->b->mark(cpu_->b, p, bytes.size(), 1), MF_OK) << mf_last_error();
    memcpy(p, bytes.data(), bytes.size());
    return p;
  }
  bool get(const void *p, std::vector<uint8_t> *out, std::string *why) override {
    memcpy(out->data(), p, out->size());
    return true;
  }
  void placed() override { before_.assign(cpu_->arena, cpu_->arena + cap_); }
  const std::vector<uint8_t> &before() const { return before_; }

 private:
  Cpu *cpu_;
  size_t cap_, off_ = 0;
  std::vector<uint8_t> before_;
};

// Every case on the cpu backend: host operands (no pool) and arena operands
// (checking mode, 2 threads) give the same bits; bytes outside the operands
// the call writes keep theirs; something changes; what changes is finite.
TEST(TwinCases, EveryCaseRunsOnTheCpuBackend) {
  for (const MfKernelCase &c : every_case()) {
    SCOPED_TRACE(c.name);
    Cpu host(0, 0, 0);
    MfCaseHostMemory hm;
    const MfCaseOut ref = mf_case_run(host.b, host.s, c, &hm);
    ASSERT_EQ(ref.status, MF_OK) << ref.error;

    const size_t cap = mf_case_arena_bytes(c) + 256 * (MF_KBUF_MAX + c.experts.size()) + 4096;
    Cpu dev(cap, 1, 2);
    ArenaMemory am(&dev, cap);
    const MfCaseOut got = mf_case_run(dev.b, dev.s, c, &am);
    ASSERT_EQ(got.status, MF_OK) << got.error;
    const std::vector<std::string> diff = mf_case_compare(c, ref, got, true, "host", "arena");
    EXPECT_TRUE(diff.empty()) << joined(diff);

    // The arena outside what the table says the call writes: unchanged.
    std::vector<bool> written(cap, false);
    const uint32_t writes = mf_kernel_writes(&c.call);
    for (int j = 0; j < MF_KBUF_MAX; j++)
      if (c.present[j] && ((writes >> j) & 1u)) {
        const size_t at = (size_t)(static_cast<uint8_t *>(got.ptr[j]) - dev.arena);
        for (size_t i = 0; i < c.call.b[j].bytes; i++) written[at + i] = true;
      }
    for (size_t e = 0; mf_kernel_writes_experts(c.call.kind) && e < got.expert_ptr.size(); e++)
      if (got.expert_ptr[e]) {
        const size_t at = (size_t)(static_cast<uint8_t *>(got.expert_ptr[e]) - dev.arena);
        for (size_t i = 0; i < c.experts[e].size(); i++) written[at + i] = true;
      }
    size_t stray = 0, first = 0;
    for (size_t i = 0; i < cap; i++)
      if (!written[i] && dev.arena[i] != am.before()[i] && stray++ == 0) first = i;
    EXPECT_EQ(stray, 0u) << "the call changed " << stray
                         << " arena bytes outside the operands it writes, the "
                         << "first at " << first;

    // Something changed, and every changed float element is finite.
    bool changed = false;
    for (int j = 0; j < mf_kernel_n_operands(c.call.kind); j++) {
      if (!c.present[j] || !((writes >> j) & 1u)) continue;
      const int home = c.alias[j] >= 0 ? c.alias[j] : j;
      const mf_dtype d = mf_case_dtype(c.call, j);
      const size_t es = mf_case_elem_size(d), n = ref.ops[home].size() / es;
      for (size_t i = 0; i < n; i++) {
        if (memcmp(&ref.ops[home][i * es], &c.ops[home][i * es], es) == 0) continue;
        changed = true;
        if ((d == MF_DTYPE_F32 || d == MF_DTYPE_BF16 || d == MF_DTYPE_F64) &&
            !std::isfinite(mf_case_value(ref.ops[home], d, i))) {
          ADD_FAILURE() << "operand " << mf_kernel_info_of(c.call.kind)->b[j].name << " element " << i
                        << " is " << mf_case_value(ref.ops[home], d, i)
                        << ": a comparison with it would prove little";
          break;
        }
      }
    }
    for (size_t e = 0; e < ref.experts.size(); e++) changed |= ref.experts[e] != c.experts[e];
    EXPECT_TRUE(changed) << "the call changed nothing: comparing it would prove nothing";
    if (HasFailure()) return;
  }
}

// The comparison: within a tolerance passes; out of it names the case, the
// operand and the worst element; integers and exact kinds bit for bit; a
// workspace is not compared.
TEST(TwinCases, TheComparisonNamesTheCaseOperandAndWorstElement) {
  Cpu cpu(0, 0, 0);
  auto run = [&](const MfKernelCase &c) {
    MfCaseHostMemory m;
    MfCaseOut o = mf_case_run(cpu.b, cpu.s, c, &m);
    EXPECT_EQ(o.status, MF_OK) << o.error;
    return o;
  };
  // rmsnorm_fwd, F32: y off by 0.25 at element 17.
  MfKernelCase c = mf_case_make(*mf_case_entry(MF_K_RMSNORM_FWD), 1, MF_DTYPE_F32);
  const MfCaseOut ref = run(c);
  MfCaseOut got = ref;
  EXPECT_TRUE(mf_case_compare(c, ref, got).empty());
  float *y = reinterpret_cast<float *>(got.ops[2].data());
  y[17] += 0.25f;
  std::vector<std::string> m = mf_case_compare(c, ref, got);
  ASSERT_EQ(m.size(), 1u) << joined(m);
  EXPECT_TRUE(has(m[0], "rmsnorm_fwd R=37 C=129 in_place=0 F32: operand 2 (y) F32: NMSE")) << m[0];
  EXPECT_TRUE(
      has(m[0], "> 1e-10 over 4773 elements (1 differ, 0 NaN on one side only); worst, element 17: cpu"))
      << m[0];

  // BF16: one element a bf16 ulp apart is within 1e-4; a NaN is not.
  c = mf_case_make(*mf_case_entry(MF_K_RMSNORM_FWD), 1, MF_DTYPE_BF16);
  const MfCaseOut ref16 = run(c);
  got = ref16;
  uint16_t *h = reinterpret_cast<uint16_t *>(got.ops[2].data());
  h[5] ^= 1;
  EXPECT_TRUE(mf_case_compare(c, ref16, got).empty());
  h[6] = 0x7fc0;
  m = mf_case_compare(c, ref16, got);
  ASSERT_EQ(m.size(), 1u) << joined(m);
  EXPECT_TRUE(
      has(m[0],
          "operand 2 (y) BF16: NMSE inf > 0.0001 over 4773 elements (2 differ, 1 NaN on one side only); "
          "worst, element 6"))
      << m[0];

  // Integers: bit for bit, named by the first differing element.
  c = mf_case_make(*mf_case_entry(MF_K_MOE_DISPATCH), 2, MF_DTYPE_F32);
  const MfCaseOut rd = run(c);
  got = rd;
  reinterpret_cast<int32_t *>(got.ops[3].data())[9] += 1;
  m = mf_case_compare(c, rd, got);
  ASSERT_EQ(m.size(), 1u) << joined(m);
  EXPECT_TRUE(has(m[0],
                  "moe_dispatch T=37 E=8 K=2 to_one=0: operand 3 (row_of) I32: 1 of 74 elements differ (the "
                  "same bits expected); the first, element 9"))
      << m[0];

  // An exact float kind: one bit.
  c = mf_case_make(*mf_case_entry(MF_K_ADD), 2, MF_DTYPE_F32);
  const MfCaseOut ra = run(c);
  got = ra;
  got.ops[1][40] ^= 1;
  m = mf_case_compare(c, ra, got);
  ASSERT_EQ(m.size(), 1u) << joined(m);
  EXPECT_TRUE(has(
      m[0], "operand 1 (y) F32: 1 of 4099 elements differ (the same bits expected); the first, element 10"))
      << m[0];

  // The loss's workspace is not compared; its lse is.
  c = mf_case_make(*mf_case_entry(MF_K_CROSS_ENTROPY), 1, MF_DTYPE_F32);
  const MfCaseOut rc = run(c);
  got = rc;
  reinterpret_cast<float *>(got.ops[3].data())[0] += 1.0f;
  EXPECT_TRUE(mf_case_compare(c, rc, got).empty());
  reinterpret_cast<float *>(got.ops[4].data())[0] += 1.0f;
  m = mf_case_compare(c, rc, got);
  ASSERT_EQ(m.size(), 1u) << joined(m);
  EXPECT_TRUE(has(m[0], "operand 4 (lse)")) << m[0];

  // A failed run is reported as such.
  got.status = MF_ERR_UNSUPPORTED;
  got.error = "no such kernel";
  m = mf_case_compare(c, rc, got);
  ASSERT_EQ(m.size(), 1u);
  EXPECT_TRUE(has(m[0], "the cuda run failed: no such kernel")) << m[0];
}

}  // namespace
