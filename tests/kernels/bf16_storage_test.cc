// BF16 storage on the cpu backend (kernels/cpu/backend_cpu.c): a call whose
// FLOAT operands (kernels/backend.c's operand table) are bf16 gives, bit for
// bit, the fp32 call with round_bf16 on the same (widened) values, its FLOAT
// operands then narrowed to bf16 (round to nearest even) — for every kernel
// kind with FLOAT operands, with the operands in the arena (checking mode on,
// and deferred streams) and on the host (checking off, a thread pool). Bytes
// a kernel does not write (rows of ye past offsets[E]) come back unchanged;
// in-place calls (y == x) stay in place. MF_K_ADAMW with a BF16 param runs on
// the fp32 master at the start of its state and writes the param as the
// master's bf16 working copy (mf_adamw_update_bufs with bf16_out). Calls
// whose dtypes disagree are refused naming the kernel and the operands.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "src/core/core.h"
#include "src/core/qformat.h"
#include "src/optim/optim.h"

namespace {

using Bytes = std::vector<uint8_t>;

bool has(const std::string &s, const std::string &part) {
  return s.find(part) != std::string::npos;
}

template <typename V>
Bytes bytes_of(const std::vector<V> &v) {
  Bytes b(v.size() * sizeof(V));
  if (!b.empty()) memcpy(b.data(), v.data(), b.size());
  return b;
}

Bytes narrow(const Bytes &f32) {
  Bytes b(f32.size() / 2);
  mf_fp32_to_bf16_n(reinterpret_cast<const float *>(f32.data()), reinterpret_cast<uint16_t *>(b.data()),
                    f32.size() / 4);
  return b;
}

// One call described as the fp32 twin takes it: FLOAT operands hold
// bf16-representable fp32 values (outputs too: bytes a kernel leaves alone
// must come back as they were).
struct Case {
  std::string name;
  mf_kernel_call call = {};
  Bytes ops[MF_KBUF_MAX];
  std::vector<std::vector<float>> experts;  // E arrays; empty: NULL (an expert without rows)
};

class Build {
 public:
  Build(mf_kernel kind, const std::string &name, std::vector<int64_t> i, std::vector<double> f = {})
      : g_(std::hash<std::string>()(name)) {
    c_.name = name;
    c_.call.kind = kind;
    for (size_t j = 0; j < i.size(); j++) c_.call.i[j] = i[j];
    for (size_t j = 0; j < f.size(); j++) c_.call.f[j] = f[j];
  }
  // n values in [-scale, scale]: bf16 values for a FLOAT operand, any fp32 for an F32 one.
  Build &val(int slot, size_t n, float scale = 1.0f) { return put(slot, n, -scale, scale); }
  // n values in [lo, hi] (statistics that must be positive: rstd, lse, probs).
  Build &put(int slot, size_t n, float lo, float hi) {
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(n);
    const bool flt = mf_kernel_info_of(c_.call.kind)->b[slot].type == MF_KT_FLOAT;
    for (auto &x : v) x = flt ? mf_bf16_to_fp32(mf_fp32_to_bf16(d(g_))) : d(g_);
    c_.ops[slot] = bytes_of(v);
    return *this;
  }
  Build &i32(int slot, std::vector<int32_t> v) { return raw(slot, bytes_of(v)); }
  Build &i64(int slot, std::vector<int64_t> v) { return raw(slot, bytes_of(v)); }
  Build &f64(int slot, size_t n) { return raw(slot, bytes_of(std::vector<double>(n, 0.5))); }
  // Raw bytes (a quantized weight's blob).
  Build &bytes(int slot, Bytes b) { return raw(slot, b); }
  // E expert weights of n elements (bf16 values); those listed in `empty` NULL.
  Build &experts(int E, size_t n, std::vector<int> empty) {
    std::uniform_real_distribution<float> d(-1, 1);
    for (int e = 0; e < E; e++) {
      std::vector<float> w;
      bool none = false;
      for (int x : empty) none |= x == e;
      if (!none)
        for (size_t k = 0; k < n; k++) w.push_back(mf_bf16_to_fp32(mf_fp32_to_bf16(d(g_))));
      c_.experts.push_back(w);
    }
    return *this;
  }
  operator Case() const { return c_; }

 private:
  Build &raw(int slot, Bytes b) {
    c_.ops[slot] = b;
    return *this;
  }
  Case c_;
  std::mt19937_64 g_;
};

// Small calls of every kind with FLOAT operands (their optional operands with
// and without, accumulating and not).
std::vector<Case> cases_of(mf_kernel kind) {
  const std::vector<int32_t> ids = {3, 0, 6, 3, 1};
  const std::vector<int32_t> row_of = {3, 0, 5, 1, 4, 2};        // T = 3, K = 2
  const std::vector<int32_t> token_of_row = {0, 0, 1, 2, 1, 2};  // R = 6 rows of T = 3 tokens
  const std::vector<int64_t> offsets = {0, 2, 2, 4};             // E = 3, expert 1 without rows, R = 5
  const int64_t T = 3, K = 2, H = 8, E = 3, N = 5, Kd = 8, R = 5;
  switch (kind) {
    case MF_K_EMBED_FWD:
      return {Build(kind, "embed_fwd", {5, 7, H}).i32(0, ids).val(1, 7 * H).val(2, 5 * H)};
    case MF_K_EMBED_BWD:
      return {Build(kind, "embed_bwd", {5, 7, H}).i32(0, ids).val(1, 5 * H).val(2, 7 * H)};
    case MF_K_RMSNORM_FWD:
      return {Build(kind, "rmsnorm_fwd", {4, 16}, {1e-5}).val(0, 64).val(1, 16).val(2, 64).val(3, 4)};
    case MF_K_RMSNORM_BWD: {
      std::vector<Case> v;
      for (int acc : {0, 1})
        v.push_back(Build(kind, "rmsnorm_bwd acc " + std::to_string(acc), {4, 16, acc})
                        .val(0, 64)
                        .val(1, 64)
                        .val(2, 16)
                        .put(3, 4, 0.5f, 2.0f)
                        .val(4, 64)
                        .val(5, 16));
      return v;
    }
    case MF_K_LINEAR_FWD: {
      std::vector<Case> v;
      for (int acc : {0, 1}) {
        Build b(kind, "linear_fwd acc " + std::to_string(acc), {3, N, 8, acc});
        b.val(0, 24).val(1, N * 8).val(3, 3 * N);
        if (acc) b.val(2, N);  // the bias
        v.push_back(b);
      }
      return v;
    }
    case MF_K_LINEAR_BWD_DATA: {
      std::vector<Case> v;
      for (int acc : {0, 1})
        v.push_back(Build(kind, "linear_bwd_data acc " + std::to_string(acc), {3, N, 8, acc})
                        .val(0, 3 * N)
                        .val(1, N * 8)
                        .val(2, 24));
      return v;
    }
    case MF_K_LINEAR_BWD_WEIGHT:
      return {Build(kind, "linear_bwd_weight", {3, N, 8}).val(0, 3 * N).val(1, 24).val(2, N * 8).val(3, N),
              Build(kind, "linear_bwd_weight no db", {3, N, 8}).val(0, 3 * N).val(1, 24).val(2, N * 8)};
    case MF_K_ROPE_FWD:
    case MF_K_ROPE_BWD:
      return {
          Build(kind, mf_kernel_name(kind), {T, 2, 8}, {10000.0}).val(0, T * 2 * 8, 2.0f).i32(1, {0, 5, 17}),
          Build(kind, "rope partial", {T, 2, 8, 4}, {10000.0}).val(0, T * 2 * 8, 2.0f).i32(1, {0, 5, 17}),
          // DeepSeek-V3's: the tail 16 of heads of 24, interleaved, YaRN (factor 40 over 4096, betas 32 / 1),
          // attention factor 1.25
          Build(kind, "rope deepseek", {T, 2, 24, 16, 8, 1, 0}, {10000.0, 40.0, 4096.0, 32.0, 1.0, 1.25})
              .val(0, T * 2 * 24, 2.0f)
              .i32(1, {0, 4097, 163839})};
    case MF_K_ATTN_FWD:  // B 2, S 3, Hq 4, Hkv 2, D 8; and value heads Dv 12 (v, o)
      return {Build(kind, "attn_fwd", {2, 3, 4, 2, 8}, {0.35355339})
                  .val(0, 6 * 4 * 8)
                  .val(1, 6 * 2 * 8)
                  .val(2, 6 * 2 * 8)
                  .val(3, 6 * 4 * 8)
                  .val(4, 2 * 4 * 3),
              Build(kind, "attn_fwd Dv 12", {2, 3, 4, 2, 8, 12}, {0.35355339})
                  .val(0, 6 * 4 * 8)
                  .val(1, 6 * 2 * 8)
                  .val(2, 6 * 2 * 12)
                  .val(3, 6 * 4 * 12)
                  .val(4, 2 * 4 * 3),
              // gpt-oss: a sliding window of 2 and sink logits (bf16, widened like the others)
              Build(kind, "attn_fwd window sinks", {2, 3, 4, 2, 8, 0, 2}, {0.35355339})
                  .val(0, 6 * 4 * 8)
                  .val(1, 6 * 2 * 8)
                  .val(2, 6 * 2 * 8)
                  .val(3, 6 * 4 * 8)
                  .val(4, 2 * 4 * 3)
                  .val(5, 4, 4.0f)};
    case MF_K_ATTN_BWD:  // and Dv 4 (v, o, dout, dv)
      return {Build(kind, "attn_bwd", {2, 3, 4, 2, 8}, {0.35355339})
                  .val(0, 6 * 4 * 8)
                  .val(1, 6 * 2 * 8)
                  .val(2, 6 * 2 * 8)
                  .val(3, 6 * 4 * 8)
                  .val(4, 6 * 4 * 8)
                  .put(5, 2 * 4 * 3, 1.0f, 2.0f)
                  .val(6, 6 * 4 * 8)
                  .val(7, 6 * 2 * 8)
                  .val(8, 6 * 2 * 8),
              Build(kind, "attn_bwd Dv 4", {2, 3, 4, 2, 8, 4}, {0.35355339})
                  .val(0, 6 * 4 * 8)
                  .val(1, 6 * 2 * 8)
                  .val(2, 6 * 2 * 4)
                  .val(3, 6 * 4 * 4)
                  .val(4, 6 * 4 * 4)
                  .put(5, 2 * 4 * 3, 1.0f, 2.0f)
                  .val(6, 6 * 4 * 8)
                  .val(7, 6 * 2 * 8)
                  .val(8, 6 * 2 * 4),
              // and the sinks' fp32 gradient, added into
              Build(kind, "attn_bwd window sinks", {2, 3, 4, 2, 8, 0, 2}, {0.35355339})
                  .val(0, 6 * 4 * 8)
                  .val(1, 6 * 2 * 8)
                  .val(2, 6 * 2 * 8)
                  .val(3, 6 * 4 * 8)
                  .val(4, 6 * 4 * 8)
                  .put(5, 2 * 4 * 3, 1.0f, 2.0f)
                  .val(6, 6 * 4 * 8)
                  .val(7, 6 * 2 * 8)
                  .val(8, 6 * 2 * 8)
                  .val(9, 4, 4.0f)
                  .val(10, 4)};
    case MF_K_SWIGLU_FWD:
      return {Build(kind, "swiglu_fwd", {37}).val(0, 37, 4.0f).val(1, 37).val(2, 37)};
    case MF_K_SWIGLU_BWD:
      return {Build(kind, "swiglu_bwd", {37}).val(0, 37, 4.0f).val(1, 37).val(2, 37).val(3, 37).val(4, 37)};
    case MF_K_SWIGLU_CLAMP_FWD:  // gpt-oss's limit 7, alpha 1.702: g and u past both clamps
      return {
          Build(kind, "swiglu_clamp_fwd", {37}, {7.0, 1.702}).val(0, 37, 10.0f).val(1, 37, 10.0f).val(2, 37)};
    case MF_K_SWIGLU_CLAMP_BWD:
      return {Build(kind, "swiglu_clamp_bwd", {37}, {7.0, 1.702})
                  .val(0, 37, 10.0f)
                  .val(1, 37, 10.0f)
                  .val(2, 37)
                  .val(3, 37)
                  .val(4, 37)};
    case MF_K_EXPERT_BIAS_FWD:  // y's last row (past offsets[E]) is not written
      return {Build(kind, "expert_bias_fwd", {E, N}).val(0, R * N).i64(1, offsets).val(2, E * N)};
    case MF_K_EXPERT_BIAS_BWD:  // db is F32: passed as it is
      return {Build(kind, "expert_bias_bwd", {E, N}).val(0, R * N).i64(1, offsets).val(2, E * N)};
    case MF_K_SIGGATE_FWD:
      return {Build(kind, "sigmoid_gate_fwd", {T, H}).val(0, T).val(1, T * H).val(2, T * H)};
    case MF_K_SIGGATE_BWD:
      return {Build(kind, "sigmoid_gate_bwd", {T, H})
                  .val(0, T)
                  .val(1, T * H)
                  .val(2, T * H)
                  .val(3, T * H)
                  .val(4, T)};
    case MF_K_ADD:  // the fp32 flag too: the narrowing rounds the sum once either way
      return {Build(kind, "add", {33, 0}).val(0, 33).val(1, 33),
              Build(kind, "add fp32 flag", {33, 1}).val(0, 33).val(1, 33)};
    case MF_K_SCALE:
      return {Build(kind, "scale", {33}, {1.7}).val(0, 33)};
    case MF_K_SLICE:  // 3 rows of x, each broadcast to 2 rows of y at column 5 of 9; added
      return {Build(kind, "slice broadcast acc", {6, 4, 7, 2, 9, 5, 2, 1}).val(0, 21).val(1, 54),
              Build(kind, "slice copy", {3, 4, 7, 2, 9, 5, 1, 0}).val(0, 21).val(1, 27)};
    case MF_K_SLICE_BWD:  // the 2 rows of each of 3 summed into x's column 2 of 7; added
      return {Build(kind, "slice_bwd sum acc", {3, 4, 7, 2, 9, 5, 2, 1}).val(0, 54).val(1, 21),
              Build(kind, "slice_bwd copy", {3, 4, 7, 2, 9, 5, 1, 0}).val(0, 27).val(1, 21)};
    case MF_K_DROPOUT:
      return {Build(kind, "dropout", {33, 5, 99}, {0.25}).val(0, 33).val(1, 33)};
    case MF_K_ROUTER_FWD:  // and gpt-oss's mode 1
      return {Build(kind, "router_fwd", {4, 6, K, 1})
                  .val(0, 24, 3.0f)
                  .val(1, 24)
                  .i32(2, std::vector<int32_t>(8))
                  .val(3, 8),
              Build(kind, "router_fwd mode 1", {4, 6, K, 0, 1})
                  .val(0, 24, 3.0f)
                  .val(1, 24)
                  .i32(2, std::vector<int32_t>(8))
                  .val(3, 8)};
    case MF_K_ROUTER_GROUP_FWD:  // 4 groups of 2, 2 kept, top-2; and no group limit, no bias
      return {Build(kind, "router_group_fwd", {4, 8, 2, 4, 2, 1}, {2.5})
                  .val(0, 32, 3.0f)
                  .val(1, 8, 0.05f)
                  .val(2, 32)
                  .i32(3, std::vector<int32_t>(8))
                  .val(4, 8),
              Build(kind, "router_group_fwd flat", {4, 8, 2, 1, 1, 0}, {1.0})
                  .val(0, 32, 3.0f)
                  .val(2, 32)
                  .i32(3, std::vector<int32_t>(8))
                  .val(4, 8)};
    case MF_K_ROUTER_GROUP_BWD:
      return {Build(kind, "router_group_bwd", {4, 8, 2, 4, 2, 1}, {2.5})
                  .put(0, 32, 0.05f, 0.95f)
                  .i32(1, {0, 3, 1, 2, 5, 0, 4, 1})
                  .val(2, 8)
                  .val(3, 32)};
    case MF_K_ROUTER_BWD: {
      std::vector<Case> v;
      for (int mode : {0, 1})  // mode 1: gpt-oss's (norm_topk ignored)
        for (int extra : {0, 1}) {
          Build b(kind, "router_bwd extra " + std::to_string(extra) + (mode ? " mode 1" : ""),
                  {4, 6, K, extra, mode});
          b.put(0, 24, 0.01f, 0.5f).i32(1, {0, 3, 1, 2, 5, 0, 4, 1}).put(2, 8, 0.1f, 0.9f);
          b.val(3, 8).val(5, 24);
          if (extra) b.val(4, 24);
          v.push_back(b);
        }
      return v;
    }
    case MF_K_MOE_GATHER:
      return {Build(kind, "moe_gather", {6, H}).val(0, T * H).i32(1, token_of_row).val(2, 6 * H)};
    case MF_K_MOE_GATHER_BWD: {
      std::vector<Case> v;
      for (int acc : {0, 1})
        v.push_back(Build(kind, "moe_gather_bwd acc " + std::to_string(acc), {T, K, H, acc})
                        .val(0, 6 * H)
                        .i32(1, row_of)
                        .val(2, T * H));
      return v;
    }
    case MF_K_MOE_COMBINE:
      return {Build(kind, "moe_combine", {T, K, H}).val(0, 6 * H).val(1, 6).i32(2, row_of).val(3, T * H)};
    case MF_K_MOE_COMBINE_BWD:
      return {Build(kind, "moe_combine_bwd", {T, K, H})
                  .val(0, T * H)
                  .val(1, 6 * H)
                  .val(2, 6)
                  .i32(3, row_of)
                  .val(4, 6 * H)
                  .val(5, 6)};
    case MF_K_EXPERT_FWD:  // R = 5 rows, 4 of them routed: ye's last row is not written
      return {Build(kind, "expert_fwd", {E, N, Kd})
                  .val(0, R * Kd)
                  .i64(1, offsets)
                  .val(2, R * N)
                  .experts(E, N * Kd, {1})};
    case MF_K_EXPERT_BWD_DATA:
      return {Build(kind, "expert_bwd_data", {E, N, Kd})
                  .val(0, R * N)
                  .i64(1, offsets)
                  .val(2, R * Kd)
                  .experts(E, N * Kd, {1})};
    case MF_K_EXPERT_BWD_WEIGHT:  // the experts' dW are F32: passed as they are
      return {Build(kind, "expert_bwd_weight", {E, N, Kd})
                  .val(0, R * N)
                  .val(1, R * Kd)
                  .i64(2, offsets)
                  .experts(E, N * Kd, {1})};
    case MF_K_CROSS_ENTROPY: {  // T 4, V 11, H 8, chunk 4
      std::vector<Case> v;
      for (int bwd : {0, 1}) {
        Build b(kind, bwd ? "cross_entropy bwd" : "cross_entropy", {4, 11, H, 4}, {0.25});
        b.val(0, 4 * H).val(1, 11 * H).i32(2, {3, -1, 10, 0}).val(3, 16).val(4, 4).f64(5, 2);
        if (bwd) b.val(6, 4 * H).val(7, 11 * H);
        v.push_back(b);
      }
      return v;
    }
    case MF_K_DEQUANT: {  // blobs of src/core/qformat.h: NF4 (plain, nested), FP8, MXFP4
      std::vector<Case> v;
      const struct {
        const char *name;
        int kind;
        int64_t rows, cols, bs, nested;
      } w[] = {{"dequant nf4", MF_QUANT_NF4, 3, 64, 64, 0},
               {"dequant nf4 nested", MF_QUANT_NF4, 3, 64, 32, 1},
               {"dequant fp8", MF_QUANT_FP8, 4, 8, 0, 0},
               {"dequant mxfp4", MF_QUANT_MXFP4, 2, 32, 0, 0}};
      for (const auto &x : w) {
        mf_qweight q = {};
        q.kind = x.kind, q.rows = x.rows, q.cols = x.cols, q.blocksize = x.bs, q.nested = (int32_t)x.nested;
        // Random bytes make valid blobs but for the float pieces: positive
        // scales, a finite map and offset, no FP8 NaN code, e8m0 near 2^0.
        Bytes blob = Bytes((size_t)mf_qweight_blob_bytes(&q));
        std::mt19937_64 g(std::hash<std::string>()(x.name));
        for (auto &c : blob) c = (uint8_t)(g() % (x.kind == MF_QUANT_FP8 ? 0x7f : 256));
        auto put_floats = [&](int64_t at, int64_t n, float lo, float hi) {
          std::uniform_real_distribution<float> d(lo, hi);
          for (int64_t k = 0; k < n; k++) {
            const float f = d(g);
            std::memcpy(&blob[(size_t)(at + 4 * k)], &f, 4);
          }
        };
        if (x.kind == MF_QUANT_MXFP4)
          for (int64_t k = 0; k < mf_qweight_scale_bytes(&q); k++)
            blob[(size_t)(mf_qweight_blob_scales_at(&q) + k)] = (uint8_t)(120 + g() % 10);
        else if (!x.nested)
          put_floats(mf_qweight_blob_scales_at(&q), mf_qweight_scale_bytes(&q) / 4, 0.01f, 2.0f);
        if (x.nested) {
          put_floats(mf_qweight_blob_absmax2_at(&q), mf_qweight_absmax2_count(&q), 0.5f, 1.0f);
          put_floats(mf_qweight_blob_code2_at(&q), 256, -1.0f, 1.0f);
          put_floats(mf_qweight_blob_offset_at(&q), 1, 0.1f, 0.3f);
        }
        v.push_back(Build(kind, x.name, {x.kind, x.rows, x.cols, x.bs, x.nested})
                        .bytes(0, blob)
                        .val(1, (size_t)(x.rows * x.cols)));
      }
      return v;
    }
    default:
      return {};
  }
}

bool has_float_operands(mf_kernel kind) {
  const mf_kernel_info *t = mf_kernel_info_of(kind);
  bool f = t->experts.name && t->experts.type == MF_KT_FLOAT;
  for (int j = 0; j < mf_kernel_n_operands(kind); j++) f |= t->b[j].type == MF_KT_FLOAT;
  return f;
}

// Where the BF16 call's operands live and how its backend runs.
struct Mode {
  const char *name;
  bool arena;  // operands in the arena (else host vectors)
  int checking;
  mf_cpu_streams streams;
  int threads;  // 0: no pool
};
const Mode kModes[] = {
    {"arena, checking", true, 1, MF_CPU_STREAMS_IMMEDIATE, 0},
    {"host, no checking, 3 threads", false, 0, MF_CPU_STREAMS_IMMEDIATE, 3},
    {"arena, lazy streams", true, 0, MF_CPU_STREAMS_LAZY, 0},
    {"host, copies-first streams", false, 0, MF_CPU_STREAMS_COPIES_FIRST, 2},
};

constexpr size_t kArena = size_t(4) << 20;

// One cpu backend with a stream and (when `arena`) its arena.
struct Cpu {
  mf_backend *b = nullptr;
  mf_stream *s = nullptr;
  mf_threadpool *pool = nullptr;
  uint8_t *arena = nullptr;
  size_t used = 0;
  Cpu(int round_bf16, int checking, mf_cpu_streams streams, int threads) {
    if (threads) {
      EXPECT_EQ(mf_threadpool_create(threads, &pool), MF_OK) << mf_last_error();
    }
    mf_cpu_backend_opts o = {};
    o.pool = pool;
    o.round_bf16 = round_bf16;
    o.checking = checking;
    o.optim = mf_optim_run_kernel;
    o.streams = streams;
    EXPECT_EQ(mf_backend_cpu_create(&o, &b), MF_OK) << mf_last_error();
    if (!b) return;
    EXPECT_EQ(b->stream_create(b, &s), MF_OK) << mf_last_error();
    void *base = nullptr;
    EXPECT_EQ(b->arena_create(b, kArena, &base), MF_OK) << mf_last_error();
    arena = static_cast<uint8_t *>(base);
  }
  ~Cpu() {
    if (b && s) b->stream_free(b, s);
    mf_backend_free(b);
    mf_threadpool_free(pool);
  }
  // A live arena range holding `v` (64-byte aligned); NULL when the arena is full.
  void *place(const Bytes &v) {
    uint8_t *p = arena + used;
    used += (v.size() + 63) / 64 * 64;
    EXPECT_LE(used, kArena);
    if (used > kArena) return nullptr;
    EXPECT_EQ(b->mark(b, p, v.size(), 1), MF_OK) << mf_last_error();
    if (!v.empty()) memcpy(p, v.data(), v.size());
    return p;
  }
  mf_status run(const mf_kernel_call &k) {
    mf_status st = b->run(b, &k, s);
    return st != MF_OK ? st : b->stream_sync(b, s);
  }
};

// Every operand's bytes after a call: per slot, then per expert.
struct After {
  Bytes ops[MF_KBUF_MAX];
  std::vector<Bytes> experts;
};

// The reference: the fp32 call with round_bf16, host operands.
After run_fp32(const Case &c) {
  After a;
  Cpu cpu(1, 0, MF_CPU_STREAMS_IMMEDIATE, 0);
  mf_kernel_call k = c.call;
  for (int j = 0; j < MF_KBUF_MAX; j++) {
    a.ops[j] = c.ops[j];
    k.b[j] = {a.ops[j].empty() ? nullptr : a.ops[j].data(), a.ops[j].size(), 0, MF_DTYPE_INVALID};
  }
  std::vector<void *> eptr;
  for (const auto &w : c.experts) a.experts.push_back(bytes_of(w));
  for (auto &w : a.experts) eptr.push_back(w.empty() ? nullptr : w.data());
  if (!c.experts.empty()) {
    k.experts = eptr.data();
    k.expert_bytes = c.experts[0].size() * sizeof(float);
  }
  EXPECT_EQ(cpu.run(k), MF_OK) << mf_last_error();
  return a;
}

// The BF16 call: FLOAT operands (and FLOAT experts) narrowed, in `m`'s place,
// on a backend with round_bf16 off (the BF16 path turns it on itself).
After run_bf16(const Case &c, const Mode &m, mf_status want = MF_OK) {
  const mf_kernel_info *t = mf_kernel_info_of(c.call.kind);
  const bool fexp = t->experts.name && t->experts.type == MF_KT_FLOAT;
  Cpu cpu(0, m.checking, m.streams, m.threads);
  After a;
  mf_kernel_call k = c.call;
  for (int j = 0; j < MF_KBUF_MAX; j++) {
    if (c.ops[j].empty()) continue;
    const bool flt = t->b[j].type == MF_KT_FLOAT;
    a.ops[j] = flt ? narrow(c.ops[j]) : c.ops[j];
    void *p = m.arena ? cpu.place(a.ops[j]) : a.ops[j].data();
    k.b[j] = {p, a.ops[j].size(), (t->b[j].role & MF_KOP_WRITE) != 0,
              mf_kop_type_dtype(t->b[j].type, MF_DTYPE_BF16)};
  }
  std::vector<void *> eptr;
  for (const auto &w : c.experts) {
    a.experts.push_back(fexp ? narrow(bytes_of(w)) : bytes_of(w));
    eptr.push_back(a.experts.back().empty() ? nullptr
                   : m.arena                ? cpu.place(a.experts.back())
                                            : a.experts.back().data());
  }
  if (!c.experts.empty()) {
    k.experts = eptr.data();
    k.expert_bytes = c.experts[0].size() * (fexp ? 2 : 4);
    k.expert_dtype = fexp ? MF_DTYPE_BF16 : MF_DTYPE_F32;
  }
  k.label = "layers.0.test";
  EXPECT_EQ(cpu.run(k), want) << mf_last_error();
  if (m.arena) {  // read back from the arena
    for (int j = 0; j < MF_KBUF_MAX; j++)
      if (k.b[j].ptr) memcpy(a.ops[j].data(), k.b[j].ptr, a.ops[j].size());
    for (size_t e = 0; e < eptr.size(); e++)
      if (eptr[e]) memcpy(a.experts[e].data(), eptr[e], a.experts[e].size());
  }
  return a;
}

// bf16 bytes equal to the narrowed fp32 ones; "first differing element" else.
testing::AssertionResult same(const Bytes &got, const Bytes &want, size_t elem) {
  if (got == want) return testing::AssertionSuccess();
  if (got.size() != want.size())
    return testing::AssertionFailure() << got.size() << " vs " << want.size() << " bytes";
  size_t i = 0;
  while (memcmp(&got[i * elem], &want[i * elem], elem) == 0) i++;
  uint32_t g = 0, w = 0;
  memcpy(&g, &got[i * elem], elem);
  memcpy(&w, &want[i * elem], elem);
  return testing::AssertionFailure() << "element " << i << ": bits 0x" << std::hex << g << " vs 0x" << w;
}

void expect_twin(const Case &c, const Mode &m) {
  SCOPED_TRACE(c.name + " (" + m.name + ")");
  const mf_kernel_info *t = mf_kernel_info_of(c.call.kind);
  const After ref = run_fp32(c), got = run_bf16(c, m);
  bool wrote = false;
  for (int j = 0; j < MF_KBUF_MAX; j++) {
    if (c.ops[j].empty()) continue;
    const bool flt = t->b[j].type == MF_KT_FLOAT;
    EXPECT_TRUE(same(got.ops[j], flt ? narrow(ref.ops[j]) : ref.ops[j], flt ? 2 : 1))
        << "operand " << j << " (" << t->b[j].name << ")";
    wrote |= ref.ops[j] != c.ops[j];
  }
  const bool fexp = t->experts.name && t->experts.type == MF_KT_FLOAT;
  for (size_t e = 0; e < c.experts.size(); e++) {
    EXPECT_TRUE(same(got.experts[e], fexp ? narrow(ref.experts[e]) : ref.experts[e], fexp ? 2 : 4))
        << "expert " << e;
    wrote |= ref.experts[e] != bytes_of(c.experts[e]);
  }
  EXPECT_TRUE(wrote) << "the call changed nothing: the comparison would prove nothing";
}

TEST(Bf16Storage, EveryKindIsTheRoundBf16CallNarrowed) {
  for (int kind = 0; kind < MF_K_COUNT_; kind++) {
    const mf_kernel k = (mf_kernel)kind;
    if (!has_float_operands(k) || k == MF_K_ADAMW) continue;  // ADAMW: its own test below
    if (mf_kernel_is_exchange(k)) continue;  // between ranks (tests/cli:expert_parallel_test)
    const std::vector<Case> cases = cases_of(k);
    EXPECT_FALSE(cases.empty()) << mf_kernel_name(k) << " has FLOAT operands and no case here";
    for (const Case &c : cases)
      for (const Mode &m : kModes) expect_twin(c, m);
  }
}

// The partial write: the row of ye past offsets[E] keeps its bits.
TEST(Bf16Storage, BytesAKernelDoesNotWriteComeBackUnchanged) {
  const Case c = cases_of(MF_K_EXPERT_FWD)[0];
  for (const Mode &m : kModes) {
    SCOPED_TRACE(m.name);
    const After got = run_bf16(c, m);
    const Bytes before = narrow(c.ops[2]);
    const size_t row = 5 * 2;  // N bf16 elements
    ASSERT_EQ(got.ops[2].size(), 5 * row);
    EXPECT_EQ(Bytes(got.ops[2].begin() + 4 * row, got.ops[2].end()),
              Bytes(before.begin() + 4 * row, before.end()));
    EXPECT_NE(Bytes(got.ops[2].begin(), got.ops[2].begin() + row),
              Bytes(before.begin(), before.begin() + row));
  }
}

// Large enough for the conversions' parallel split (4 x 16384 elements).
TEST(Bf16Storage, LargeCallsSplitOverThreadsGiveTheSameBits) {
  const int64_t n = 70001;
  const Case c = Build(MF_K_SWIGLU_FWD, "swiglu_fwd large", {n}).val(0, n, 4.0f).val(1, n).val(2, n);
  expect_twin(c, kModes[1]);
  expect_twin(Build(MF_K_ADD, "add large", {n, 0}).val(0, n).val(1, n),
              {"arena, 3 threads", true, 1, MF_CPU_STREAMS_IMMEDIATE, 3});
}

// RMSNorm in place (y == x): in the arena (one shadow image) and on the host
// (y shares x's copy).
TEST(Bf16Storage, InPlaceCallsStayInPlace) {
  const Case c =
      Build(MF_K_RMSNORM_FWD, "rmsnorm_fwd in place", {4, 16}, {1e-5}).val(0, 64).val(1, 16).val(3, 4);
  // fp32 reference, in place.
  Bytes x = c.ops[0], w = c.ops[1], rstd = c.ops[3];
  {
    Cpu ref(1, 0, MF_CPU_STREAMS_IMMEDIATE, 0);
    mf_kernel_call k = c.call;
    k.b[0] = {x.data(), x.size(), 0, MF_DTYPE_INVALID};
    k.b[1] = {w.data(), w.size(), 0, MF_DTYPE_INVALID};
    k.b[2] = {x.data(), x.size(), 1, MF_DTYPE_INVALID};
    k.b[3] = {rstd.data(), rstd.size(), 1, MF_DTYPE_INVALID};
    ASSERT_EQ(ref.run(k), MF_OK) << mf_last_error();
  }
  ASSERT_NE(x, c.ops[0]);
  for (const Mode &m : kModes) {
    SCOPED_TRACE(m.name);
    Cpu cpu(0, m.checking, m.streams, m.threads);
    Bytes xb = narrow(c.ops[0]), wb = narrow(c.ops[1]), r = c.ops[3];
    void *px = m.arena ? cpu.place(xb) : xb.data();
    void *pw = m.arena ? cpu.place(wb) : wb.data();
    void *pr = m.arena ? cpu.place(r) : r.data();
    mf_kernel_call k = c.call;
    k.b[0] = {px, xb.size(), 0, MF_DTYPE_BF16};
    k.b[1] = {pw, wb.size(), 0, MF_DTYPE_BF16};
    k.b[2] = {px, xb.size(), 1, MF_DTYPE_BF16};
    k.b[3] = {pr, r.size(), 1, MF_DTYPE_F32};
    ASSERT_EQ(cpu.run(k), MF_OK) << mf_last_error();
    if (m.arena) memcpy(xb.data(), px, xb.size()), memcpy(r.data(), pr, r.size());
    EXPECT_TRUE(same(xb, narrow(x), 2));
    EXPECT_TRUE(same(r, rstd, 4));
  }
}

// ADAMW with a BF16 param: state = fp32 master, then m and v (fp32 or bf16);
// the update is mf_adamw_update_bufs on the master with the param as bf16_out.
TEST(Bf16Storage, AdamwUpdatesTheMasterAndWritesTheWorkingCopy) {
  const size_t n = 70001;  // beyond one AdamW tile, not a multiple of the vector widths
  std::mt19937_64 g(7);
  std::uniform_real_distribution<float> d(-1, 1);
  auto vals = [&](size_t k, float lo, float hi) {
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v(k);
    for (auto &x : v) x = u(g);
    return v;
  };
  for (int mbf : {0, 1})
    for (double coef : {1.0, 0.5})
      for (const Mode &m : kModes) {
        SCOPED_TRACE(std::string(m.name) + (mbf ? ", bf16 moments" : ", fp32 moments") + ", coef " +
                     std::to_string(coef));
        const mf_dtype md = mbf ? MF_DTYPE_BF16 : MF_DTYPE_F32;
        const size_t ms = mf_dtype_size(md);
        const std::vector<float> master = vals(n, -1, 1), grad = vals(n, -0.1f, 0.1f),
                                 m1 = vals(n, -0.01f, 0.01f), v1 = vals(n, 0, 1e-4f);
        Bytes mom(2 * n * ms);
        if (mbf) {
          mf_fp32_to_bf16_n(m1.data(), reinterpret_cast<uint16_t *>(mom.data()), n);
          mf_fp32_to_bf16_n(v1.data(), reinterpret_cast<uint16_t *>(mom.data()) + n, n);
        } else {
          memcpy(mom.data(), m1.data(), 4 * n);
          memcpy(mom.data() + 4 * n, v1.data(), 4 * n);
        }
        Bytes state = bytes_of(master);
        state.insert(state.end(), mom.begin(), mom.end());
        const Bytes param = narrow(bytes_of(master));
        const mf_adamw_hparams h = {1e-3, 0.9, 0.95, 1e-8, 0.1};
        const int64_t step = 3;

        // The reference on host buffers.
        std::vector<float> rmaster = master, rgrad = grad;
        Bytes rmom = mom;
        std::vector<uint16_t> rparam(n);
        if (coef < 1) {
          const mf_optim_buf gb = {rgrad.data(), n};
          ASSERT_EQ(mf_optim_grad_scale(&gb, 1, coef, nullptr), MF_OK);
        }
        const mf_adamw_bufs b = {rmaster.data(), rgrad.data(),
                                 rmom.data(),    rmom.data() + n * ms,
                                 rparam.data(),  n,
                                 MF_DTYPE_F32,   md};
        ASSERT_EQ(mf_adamw_update_bufs(&h, step, &b, nullptr), MF_OK) << mf_last_error();

        Cpu cpu(0, m.checking, m.streams, m.threads);
        Bytes p = param, gr = bytes_of(grad), st = state;
        mf_kernel_call k = {};
        k.kind = MF_K_ADAMW;
        k.b[0] = {m.arena ? cpu.place(p) : p.data(), p.size(), 1, MF_DTYPE_BF16};
        k.b[1] = {m.arena ? cpu.place(gr) : gr.data(), gr.size(), 1, MF_DTYPE_F32};
        k.b[2] = {m.arena ? cpu.place(st) : st.data(), st.size(), 1, MF_DTYPE_INVALID};
        k.i[0] = (int64_t)n, k.i[1] = step, k.i[2] = mbf;
        k.f[0] = h.lr, k.f[1] = h.beta1, k.f[2] = h.beta2, k.f[3] = h.eps, k.f[4] = h.weight_decay,
        k.f[5] = coef;
        ASSERT_EQ(cpu.run(k), MF_OK) << mf_last_error();
        if (m.arena) {
          memcpy(p.data(), k.b[0].ptr, p.size());
          memcpy(gr.data(), k.b[1].ptr, gr.size());
          memcpy(st.data(), k.b[2].ptr, st.size());
        }
        EXPECT_TRUE(same(p, bytes_of(rparam), 2)) << "the param: the master's bf16 working copy";
        EXPECT_TRUE(same(Bytes(st.begin(), st.begin() + 4 * n), bytes_of(rmaster), 4)) << "the master";
        EXPECT_TRUE(same(Bytes(st.begin() + 4 * n, st.end()), rmom, mbf ? 2 : 4)) << "m and v";
        EXPECT_TRUE(same(gr, bytes_of(rgrad), 4)) << "the gradient (scaled when coef < 1)";
        EXPECT_NE(bytes_of(rmaster), bytes_of(master));
        // Too small a state for the master: refused with the sizes.
        k.b[2].bytes = 2 * n * ms + 4 * n - 4;
        EXPECT_EQ(cpu.run(k), MF_ERR_INVALID_ARG);
        EXPECT_TRUE(has(mf_last_error(), "adamw: 70001 elements (BF16 param")) << mf_last_error();
      }
}

// Calls whose dtypes disagree never compute: refused naming kernel and operands.
TEST(Bf16Storage, MixedAndUnsupportedDtypesAreRefused) {
  Cpu cpu(0, 0, MF_CPU_STREAMS_IMMEDIATE, 0);
  std::vector<uint16_t> x(24, 0x3f80), W(40, 0x3f80), y(15, 0);
  std::vector<float> Wf(40, 1.0f);
  mf_kernel_call k = {};
  k.kind = MF_K_LINEAR_FWD;
  k.label = "layers.3.q_proj";
  k.i[0] = 3, k.i[1] = 5, k.i[2] = 8;
  k.b[0] = {x.data(), 48, 0, MF_DTYPE_BF16};
  k.b[1] = {Wf.data(), 160, 0, MF_DTYPE_F32};
  k.b[3] = {y.data(), 30, 1, MF_DTYPE_BF16};
  EXPECT_EQ(cpu.b->run(cpu.b, &k, cpu.s), MF_ERR_INVALID_ARG);
  std::string msg = mf_last_error();
  EXPECT_TRUE(
      has(msg, "kernel linear_fwd in layers.3.q_proj: operand 1 (W) is F32 but operand 0 (x) is BF16"))
      << msg;
  EXPECT_EQ(mf_kernel_call_check(&k), MF_ERR_INVALID_ARG);
  // A fixed-type operand in the storage dtype.
  k = {};
  k.kind = MF_K_RMSNORM_FWD;
  k.i[0] = 3, k.i[1] = 8;
  std::vector<uint16_t> rstd(3);
  k.b[0] = {x.data(), 48, 0, MF_DTYPE_BF16};
  k.b[1] = {W.data(), 16, 0, MF_DTYPE_BF16};
  k.b[2] = {y.data(), 30, 1, MF_DTYPE_BF16};
  k.b[3] = {rstd.data(), 6, 1, MF_DTYPE_BF16};
  EXPECT_EQ(cpu.b->run(cpu.b, &k, cpu.s), MF_ERR_INVALID_ARG);
  msg = mf_last_error();
  EXPECT_TRUE(has(msg, "kernel rmsnorm_fwd: operand 3 (rstd) is BF16; it must be F32")) << msg;
  // A storage dtype no backend computes.
  k.b[0].dtype = k.b[1].dtype = k.b[2].dtype = MF_DTYPE_F16;
  k.b[3].dtype = MF_DTYPE_F32;
  EXPECT_EQ(cpu.b->run(cpu.b, &k, cpu.s), MF_ERR_INVALID_ARG);
  msg = mf_last_error();
  EXPECT_TRUE(has(msg, "kernel rmsnorm_fwd: operand 0 (x) is F16; its storage must be F32 or BF16")) << msg;
  // BF16 elements that are not whole.
  k = {};
  k.kind = MF_K_ADD;
  k.i[0] = 5;
  k.b[0] = {x.data(), 10, 0, MF_DTYPE_BF16};
  k.b[1] = {reinterpret_cast<uint8_t *>(y.data()) + 1, 10, 1, MF_DTYPE_BF16};
  k.label = "layers.0.residual";
  EXPECT_EQ(cpu.b->run(cpu.b, &k, cpu.s), MF_ERR_INVALID_ARG);
  msg = mf_last_error();
  EXPECT_TRUE(has(msg, "kernel add in layers.0.residual: operand 1 (y) is BF16 but at an odd address"))
      << msg;
  mf_backend_stats st;
  cpu.b->get_stats(cpu.b, &st);
  EXPECT_EQ(st.kernels, 0u);
}

// ZERO is bytes, whatever the tensor's dtype; a BF16 ADD adds in fp32 and rounds once.
TEST(Bf16Storage, ZeroAndAddOnBf16Tensors) {
  Cpu cpu(0, 1, MF_CPU_STREAMS_IMMEDIATE, 0);
  Bytes z(14, 0xab);
  mf_kernel_call k = {};
  k.kind = MF_K_ZERO;
  k.b[0] = {cpu.place(z), z.size(), 1, MF_DTYPE_BF16};
  ASSERT_EQ(cpu.run(k), MF_OK) << mf_last_error();
  EXPECT_EQ(Bytes(static_cast<uint8_t *>(k.b[0].ptr), static_cast<uint8_t *>(k.b[0].ptr) + 14), Bytes(14, 0));
  // 1 + 2^-8 is a tie between 1 and 1 + 2^-7: to even, 1. 1 + 3 * 2^-9 rounds up.
  const std::vector<uint16_t> x = {mf_fp32_to_bf16(1.0f), mf_fp32_to_bf16(std::ldexp(3.0f, -9))};
  const std::vector<uint16_t> y = {mf_fp32_to_bf16(std::ldexp(1.0f, -8)), mf_fp32_to_bf16(1.0f)};
  k = {};
  k.kind = MF_K_ADD;
  k.i[0] = 2;
  k.b[0] = {cpu.place(bytes_of(x)), 4, 0, MF_DTYPE_BF16};
  k.b[1] = {cpu.place(bytes_of(y)), 4, 1, MF_DTYPE_BF16};
  ASSERT_EQ(cpu.run(k), MF_OK) << mf_last_error();
  const uint16_t *out = static_cast<const uint16_t *>(k.b[1].ptr);
  EXPECT_EQ(mf_bf16_to_fp32(out[0]), 1.0f);
  EXPECT_EQ(mf_bf16_to_fp32(out[1]), 1.0f + std::ldexp(1.0f, -7));
}

}  // namespace
