// The twin harness's case table (tests/cuda/twin_cases.h): per kind its
// shapes, the function that builds a call of each, and the tolerances, per
// written operand and storage (why):
//
//   F32 storage: the NMSE bounds of the hand-written twin tests, which hold the
//   same kernels to them on the same kinds of data (ops_test.cc,
//   gemm_loss_test.cc, attention_test.cc): 0 (the same bits) where both sides
//   do the same IEEE operations in the same order (copies, one add or multiply
//   per element, sums of plain adds in a fixed order, the optimizer and
//   DEQUANT, which optim.h and qformat.h define bit for bit); 1e-10 for one
//   value computed with the device's expf / fma contraction or a reduction in
//   another fixed order (rmsnorm_fwd, swiglu, the gates, the GEMMs, attention's
//   o and lse); 1e-9 where a row reduction of such values follows (rmsnorm_bwd,
//   the routers' backward, combine_bwd's dw, cross-entropy's dh and dW);
//   1e-8 for attention's gradients (the cancellation in ds = p (dp - Di)), with
//   the reference's RMS floored at 1e-2 (where the exact gradient is 0, S = 1,
//   both sides are rounding noise), and for its sinks' fp32 gradient (a double
//   sum of fp32 Di, in BF16 storage too: both sides read the same bf16 o and
//   dout); 1e-6 for RoPE (device cosf/sinf/powf at
//   angles up to 511 rad); cross-entropy's lse 1e-11; the aux loss's doubles
//   1e-24 (sums in another order), its fp32 gradient 1e-20.
//   BF16 storage: both sides read the same bf16 inputs and compute in fp32;
//   each stored FLOAT output is rounded to bf16 once, and the device may round
//   an intermediate to bf16 where the twin does not (attention's p and dS as
//   tensor-core operands, cuBLASLt's product before a bias or C, the loss's g
//   and its chunked dh). One bf16 rounding moves a value by at most 2^-8 of it
//   (2^-7 from one side's ulp to the other's): even if every element landed
//   one ulp apart the NMSE would be (2^-7)^2 = 6e-5, so 1e-4 for the FLOAT
//   outputs — a wrong index, mask or missing term moves whole rows by O(1).
//   Cross-entropy's dh and dW 1e-3 (g rounded to bf16 and dh rounded once per
//   vocabulary chunk: a few roundings of partial sums of up to 3x |dh|).
//   Outputs both sides keep in fp32 from the same bf16 inputs (router probs
//   and weights, the group router's scores, cross-entropy's lse and loss) 1e-8
//   or 1e-9 (fp32 order and device expf only); the experts' fp32 dW 1e-8.
//   Copies, one fp32 add or multiply rounded once (add, scale, dropout, slice,
//   expert_bias_fwd), the token-order sums of the embedding, the rep-order sums
//   of slice_bwd and the row-order sums of expert_bias_bwd, gather and
//   combine_bwd's dye keep the same bits, as in F32. The clamped SwiGLU is
//   swiglu's (expf, contraction).
//   Integers (indices, routing maps, counts) are always compared bit for bit;
//   cross-entropy's ws is its workspace (not compared).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "kernels/backend.h"
#include "src/core/qformat.h"
#include "src/optim/optim.h"
#include "tests/cuda/twin_cases.h"

namespace {

using Bytes = std::vector<uint8_t>;
using Shape = std::vector<int64_t>;

template <typename V>
Bytes bytes_of(const std::vector<V> &v) {
  Bytes b(v.size() * sizeof(V));
  if (!b.empty()) memcpy(b.data(), v.data(), b.size());
  return b;
}
std::vector<int32_t> ints(std::mt19937_64 &g, size_t n, int32_t lo, int32_t hi) {
  std::uniform_int_distribution<int32_t> d(lo, hi);
  std::vector<int32_t> v(n);
  for (auto &x : v) x = d(g);
  return v;
}
// K distinct experts of E per token, in random order.
std::vector<int32_t> topk_ids(std::mt19937_64 &g, int64_t T, int64_t E, int64_t K) {
  std::vector<int32_t> v((size_t)(T * K)), perm((size_t)E);
  for (int64_t t = 0; t < T; t++) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), g);
    std::copy(perm.begin(), perm.begin() + K, v.begin() + t * K);
  }
  return v;
}
// Router logits: rows of distinct values 1/16 apart (far beyond the rounding
// of either side, bf16-representable spacing for E <= 64), every third row all
// tied and every third one in tied pairs, so the tie rule is compared too.
std::vector<float> router_logits(std::mt19937_64 &g, int64_t T, int64_t E) {
  std::vector<float> l((size_t)(T * E));
  std::vector<int> perm((size_t)E);
  std::uniform_int_distribution<int> shift(-32, 32);  // in 1/16
  for (int64_t t = 0; t < T; t++) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), g);
    const float s = (float)shift(g) / 16;
    for (int64_t e = 0; e < E; e++) {
      float v = s + (float)(perm[(size_t)e] - E / 2) / 16;
      if (t % 3 == 1) v = 0.5f;
      if (t % 3 == 2) v = s + (float)(perm[(size_t)e] / 2) / 4;
      l[(size_t)(t * E + e)] = v;
    }
  }
  return l;
}

// Inputs that follow from others (a routing's maps, attention's o and lse,
// a router's choice) are the cpu backend's outputs of the call that makes
// them, built like a case: the backend interface, not the twins' signatures.
MfKernelCase scratch(mf_kernel kind, mf_dtype storage) {
  MfKernelCase d;
  d.call.kind = kind;
  d.storage = storage;
  d.name = std::string("deriving inputs with ") + mf_kernel_name(kind);
  return d;
}
// d run on a cpu backend; what goes wrong is b's case's error.
MfCaseOut on_cpu(MfCaseBuild &b, MfKernelCase &d) {
  MfCaseOut o;
  for (const std::string &e : d.errors) b.fail(d.name + ": " + e);
  const uint32_t writes = mf_kernel_writes(&d.call);
  for (int j = 0; j < MF_KBUF_MAX; j++) d.call.b[j].write = (int)((writes >> j) & 1u);
  mf_backend *be = nullptr;
  mf_stream *s = nullptr;
  mf_cpu_backend_opts opts = {};
  if (mf_backend_cpu_create(&opts, &be) == MF_OK && be->stream_create(be, &s) == MF_OK) {
    MfCaseHostMemory m;
    o = mf_case_run(be, s, d, &m);
  } else {
    o.status = MF_ERR_INTERNAL;
    o.error = mf_last_error();
  }
  if (o.status != MF_OK) b.fail(d.name + ": " + o.error);
  if (s) be->stream_free(be, s);
  mf_backend_free(be);
  return o;
}
// Operand `name` of d after the run o: n elements (zeros when the run failed).
template <typename V>
std::vector<V> result(const MfKernelCase &d, const MfCaseOut &o, const char *name, size_t n) {
  const mf_kernel_info *t = mf_kernel_info_of(d.call.kind);
  std::vector<V> v(n);
  for (int j = 0; j < mf_kernel_n_operands(d.call.kind); j++)
    if (strcmp(t->b[j].name, name) == 0 && n && o.ops[j].size() == n * sizeof(V))
      memcpy(v.data(), o.ops[j].data(), o.ops[j].size());
  return v;
}
// Operand `name` of b's case: operand `from` of d after the run o (its bytes and dtype).
void take(MfCaseBuild &b, const char *name, const MfKernelCase &d, const MfCaseOut &o, const char *from) {
  const mf_kernel_info *t = mf_kernel_info_of(d.call.kind);
  for (int j = 0; j < mf_kernel_n_operands(d.call.kind); j++)
    if (strcmp(t->b[j].name, from) == 0 && !o.ops[j].empty()) {
      b.raw(name, o.ops[j], mf_case_dtype(d.call, j));
      return;
    }
  b.fail(std::string("no operand ") + from + " to take as " + name);
}

// A consistent routing of T tokens to K of E experts: the cpu dispatch's maps.
struct Routing {
  std::vector<int32_t> topk, row_of, token_of_row;
  std::vector<int64_t> counts, offsets;
};
Routing routing(MfCaseBuild &b, int64_t T, int64_t E, int64_t K) {
  Routing r;
  r.topk = topk_ids(b.rng(), T, E, K);
  MfKernelCase d = scratch(MF_K_MOE_DISPATCH, MF_DTYPE_F32);
  MfCaseBuild db(&d, 0);
  db.size("T", T).size("K", K).size("E", E).i32("topk_idx", r.topk).out("counts", (size_t)E);
  db.out("offsets", (size_t)E + 1).out("row_of", (size_t)(T * K)).out("token_of_row", (size_t)(T * K));
  const MfCaseOut o = on_cpu(b, d);
  r.counts = result<int64_t>(d, o, "counts", (size_t)E);
  r.offsets = result<int64_t>(d, o, "offsets", (size_t)E + 1);
  r.row_of = result<int32_t>(d, o, "row_of", (size_t)(T * K));
  r.token_of_row = result<int32_t>(d, o, "token_of_row", (size_t)(T * K));
  return r;
}

// The cpu router of router logits (F32 storage: probs and topk_w are F32 in any).
struct Router {
  MfKernelCase d;
  MfCaseOut o;
};
Router router(MfCaseBuild &b, int64_t T, int64_t E, int64_t K, int norm_topk, int mode = 0) {
  Router r{scratch(MF_K_ROUTER_FWD, MF_DTYPE_F32), {}};
  MfCaseBuild rb(&r.d, 0);
  rb.size("T", T).size("E", E).size("K", K).size("norm_topk", norm_topk).size("mode", mode);
  rb.values("logits", router_logits(b.rng(), T, E)).out("probs", (size_t)(T * E));
  rb.out("topk_idx", (size_t)(T * K)).out("topk_w", (size_t)(T * K));
  r.o = on_cpu(b, r.d);
  return r;
}

// -------------------------------------------------------- the case builders
// Each takes the shape its entry's shape_names describe.

void b_zero(MfCaseBuild &b, const Shape &s) {  // n bytes
  b.out("x", (size_t)s[0]);
}

void b_embed(MfCaseBuild &b, const Shape &s, bool bwd) {  // T V H
  const int64_t T = s[0], V = s[1], H = s[2];
  b.size("T", T).size("V", V).size("H", H).i32("ids", ints(b.rng(), (size_t)T, 0, (int32_t)V - 1));
  if (bwd)
    b.uniform("dout", (size_t)(T * H)).out("dtable", (size_t)(V * H));
  else
    b.uniform("table", (size_t)(V * H)).out("out", (size_t)(T * H));
}
void b_embed_fwd(MfCaseBuild &b, const Shape &s) {
  b_embed(b, s, false);
}
void b_embed_bwd(MfCaseBuild &b, const Shape &s) {
  b_embed(b, s, true);
}

void b_rmsnorm_fwd(MfCaseBuild &b, const Shape &s) {  // R C in_place
  const int64_t R = s[0], C = s[1];
  b.size("R", R).size("C", C).scalar("eps", 1e-6);
  b.uniform("x", (size_t)(R * C), -2, 2).uniform("w", (size_t)C, 0.5f, 1.5f).out("rstd", (size_t)R);
  if (s[2])
    b.alias("y", "x");
  else
    b.out("y", (size_t)(R * C));
}

void b_rmsnorm_bwd(MfCaseBuild &b, const Shape &s) {  // R C accumulate dw
  const int64_t R = s[0], C = s[1];
  b.size("R", R).size("C", C).size("accumulate", s[2]);
  b.uniform("dy", (size_t)(R * C)).uniform("x", (size_t)(R * C), -2, 2).uniform("w", (size_t)C, 0.5f, 1.5f);
  b.uniform("rstd", (size_t)R, 0.5f, 2.0f).out("dx", (size_t)(R * C));
  if (s[3]) b.out("dw", (size_t)C);
}

void b_linear_fwd(MfCaseBuild &b, const Shape &s) {  // M N K accumulate bias
  const int64_t M = s[0], N = s[1], K = s[2];
  b.size("M", M).size("N", N).size("K", K).size("accumulate", s[3]);
  b.uniform("x", (size_t)(M * K)).uniform("W", (size_t)(N * K)).out("y", (size_t)(M * N));
  if (s[4]) b.uniform("bias", (size_t)N);
}

void b_linear_bwd_data(MfCaseBuild &b, const Shape &s) {  // M N K accumulate
  const int64_t M = s[0], N = s[1], K = s[2];
  b.size("M", M).size("N", N).size("K", K).size("accumulate", s[3]);
  b.uniform("dy", (size_t)(M * N)).uniform("W", (size_t)(N * K)).out("dx", (size_t)(M * K));
}

void b_linear_bwd_weight(MfCaseBuild &b, const Shape &s) {  // M N K db
  const int64_t M = s[0], N = s[1], K = s[2];
  b.size("M", M).size("N", N).size("K", K);
  b.uniform("dy", (size_t)(M * N)).uniform("x", (size_t)(M * K)).out("dW", (size_t)(N * K));
  if (s[3]) b.out("db", (size_t)N);
}

void b_rope(MfCaseBuild &b, const Shape &s, const char *x) {  // T nh D rot
  const int64_t T = s[0], nh = s[1], D = s[2];
  b.size("T", T).size("nh", nh).size("D", D).size("rot", s[3]).scalar("theta", 10000.0);
  b.uniform(x, (size_t)(T * nh * D), -2, 2).i32("pos", ints(b.rng(), (size_t)T, 0, 511));
}
void b_rope_fwd(MfCaseBuild &b, const Shape &s) {
  b_rope(b, s, "x");
}
void b_rope_bwd(MfCaseBuild &b, const Shape &s) {
  b_rope(b, s, "dx");
}

// B S Hq Hkv D, then optionally gpt-oss's sliding window (0: none) and
// whether the call has sinks (the backward then dsinks too).
void attn_sizes(MfCaseBuild &b, const Shape &s) {
  b.size("B", s[0]).size("S", s[1]).size("Hq", s[2]).size("Hkv", s[3]).size("D", s[4]);
  if (s.size() > 5) b.size("window", s[5]);
  b.scalar("scale", 1.0 / std::sqrt((double)s[4]));
}
bool attn_sinks(const Shape &s) {
  return s.size() > 6 && s[6];
}
void b_attn_fwd(MfCaseBuild &b, const Shape &s) {
  const int64_t BS = s[0] * s[1], Hq = s[2], Hkv = s[3], D = s[4];
  attn_sizes(b, s);
  b.uniform("q", (size_t)(BS * Hq * D))
      .uniform("k", (size_t)(BS * Hkv * D))
      .uniform("v", (size_t)(BS * Hkv * D));
  if (attn_sinks(s)) {  // learned logits of a few magnitudes: one large (most of a row's mass)
    std::vector<float> sinks = mf_case_uniform(b.rng(), (size_t)Hq, -3, 3);
    sinks[0] = 5.0f;
    b.values("sinks", sinks);
  }
  b.out("o", (size_t)(BS * Hq * D)).out("lse", (size_t)(BS * Hq));
}
// q, k, v (sinks) and the backward's o and lse: a forward case of the same
// shape and storage run on the cpu (o bf16 in BF16 storage, lse fp32).
void b_attn_bwd(MfCaseBuild &b, const Shape &s) {
  const int64_t BS = s[0] * s[1], Hq = s[2], Hkv = s[3], D = s[4];
  MfKernelCase f = scratch(MF_K_ATTN_FWD, b.storage());
  MfCaseBuild fb(&f, b.rng()());
  b_attn_fwd(fb, s);
  const MfCaseOut o = on_cpu(b, f);
  attn_sizes(b, s);
  for (const char *n : {"q", "k", "v", "o", "lse"}) take(b, n, f, o, n);
  b.uniform("dout", (size_t)(BS * Hq * D)).out("dq", (size_t)(BS * Hq * D));
  b.out("dk", (size_t)(BS * Hkv * D)).out("dv", (size_t)(BS * Hkv * D));
  if (attn_sinks(s)) {
    take(b, "sinks", f, o, "sinks");
    b.out("dsinks", (size_t)Hq);
  }
}

std::vector<float> swiglu_gate(std::mt19937_64 &g, size_t n) {
  std::vector<float> v = mf_case_uniform(g, n, -8, 8);
  if (n >= 3) v[0] = -100.0f, v[1] = 100.0f, v[2] = 0.0f;  // e^-g overflows, underflows
  return v;
}
void b_swiglu_fwd(MfCaseBuild &b, const Shape &s) {  // n
  const size_t n = (size_t)s[0];
  b.size("n", s[0]).values("g", swiglu_gate(b.rng(), n)).uniform("u", n, -2, 2).out("act", n);
}
void b_swiglu_bwd(MfCaseBuild &b, const Shape &s) {
  const size_t n = (size_t)s[0];
  b.size("n", s[0]).values("g", swiglu_gate(b.rng(), n)).uniform("u", n, -2, 2).uniform("dact", n);
  b.out("dg", n).out("du", n);
}

// gpt-oss's clamped SwiGLU (limit 7, alpha 1.702): g and u past both clamps,
// at them exactly, and where e^(-alpha g) overflows.
void swiglu_clamp_inputs(MfCaseBuild &b, size_t n) {
  std::vector<float> g = mf_case_uniform(b.rng(), n, -12, 12), u = mf_case_uniform(b.rng(), n, -12, 12);
  const float gs[] = {7.0f, -7.0f, 100.0f, -100.0f, 0.0f}, us[] = {7.0f, -7.0f, 9.0f, -9.0f, -1.0f};
  for (size_t k = 0; k < 5 && k < n; k++) g[k] = gs[k], u[k] = us[k];
  b.size("n", (int64_t)n).scalar("limit", 7.0).scalar("alpha", 1.702).values("g", g).values("u", u);
}
void b_swiglu_clamp_fwd(MfCaseBuild &b, const Shape &s) {  // n
  swiglu_clamp_inputs(b, (size_t)s[0]);
  b.out("act", (size_t)s[0]);
}
void b_swiglu_clamp_bwd(MfCaseBuild &b, const Shape &s) {
  const size_t n = (size_t)s[0];
  swiglu_clamp_inputs(b, n);
  b.uniform("dact", n).out("dg", n).out("du", n);
}

void b_siggate_fwd(MfCaseBuild &b, const Shape &s) {  // R C
  const int64_t R = s[0], C = s[1];
  b.size("R", R).size("C", C).uniform("gl", (size_t)R, -4, 4).uniform("x", (size_t)(R * C));
  b.out("y", (size_t)(R * C));
}
void b_siggate_bwd(MfCaseBuild &b, const Shape &s) {
  const int64_t R = s[0], C = s[1];
  b.size("R", R).size("C", C).uniform("gl", (size_t)R, -4, 4).uniform("x", (size_t)(R * C));
  b.uniform("dy", (size_t)(R * C)).out("dx", (size_t)(R * C)).out("dgl", (size_t)R);
}

void b_add(MfCaseBuild &b, const Shape &s) {  // n fp32
  b.size("n", s[0]).size("fp32", s[1]).uniform("x", (size_t)s[0]).out("y", (size_t)s[0]);
}
void b_scale(MfCaseBuild &b, const Shape &s) {  // n
  b.size("n", s[0]).scalar("s", 2.5).out("x", (size_t)s[0]);
}
// With a row width (s[1] > 0): expert parallelism's received rows, n = rows x row, in E x sources
// parts of random sizes (some empty, some rows past the last part), each from a random first row of its
// source, with a seed per source.
void b_dropout(MfCaseBuild &b, const Shape &s) {  // n [row sources E]
  b.size("n", s[0]).size("stream", 3).size("seed", 987654321).scalar("p", 0.3);
  b.uniform("x", (size_t)s[0]).out("y", (size_t)s[0]);
  if (s.size() < 4 || s[1] <= 0) return;
  const int64_t row = s[1], P = s[2], parts = s[3] * P, rows = s[0] / row;
  std::vector<int64_t> seg(1, 0), starts, seeds;
  std::uniform_int_distribution<int64_t> any(0, 1 << 20);
  for (int64_t k = 0; k < parts; k++) {
    const int64_t left = rows - seg.back();
    seg.push_back(seg.back() + (left > 0 ? any(b.rng()) % (1 + 2 * left / (parts - k + 1)) : 0));
    starts.push_back(any(b.rng()));
  }
  for (int64_t q = 0; q < P; q++) seeds.push_back(any(b.rng()) * 4099 + q);
  b.size("row", row).size("sources", P).size("parts", parts);
  b.i64("segments", seg).i64("starts", starts).i64("seeds", seeds);
}

void b_router_fwd(MfCaseBuild &b, const Shape &s) {  // T E K norm_topk [mode: 0 when left out]
  const int64_t T = s[0], E = s[1], K = s[2];
  b.size("T", T).size("E", E).size("K", K).size("norm_topk", s[3]).size("mode", s.size() > 4 ? s[4] : 0);
  b.values("logits", router_logits(b.rng(), T, E)).out("probs", (size_t)(T * E));
  b.out("topk_idx", (size_t)(T * K)).out("topk_w", (size_t)(T * K));
}
// probs, topk_idx and topk_w: the cpu router of router logits.
void b_router_bwd(MfCaseBuild &b, const Shape &s) {  // T E K norm_topk extra [mode: 0 when left out]
  const int64_t T = s[0], E = s[1], K = s[2], mode = s.size() > 5 ? s[5] : 0;
  b.size("T", T).size("E", E).size("K", K).size("norm_topk", s[3]).size("mode", mode);
  const Router f = router(b, T, E, K, (int)s[3], (int)mode);
  for (const char *n : {"probs", "topk_idx", "topk_w"}) take(b, n, f.d, f.o, n);
  b.uniform("dtopk_w", (size_t)(T * K));
  if (s[4]) b.uniform("dprobs_extra", (size_t)(T * E), -0.1f, 0.1f);
  b.out("dlogits", (size_t)(T * E));
}

// DeepSeek-V3's router: with normalisation also a bias and a scaling.
void group_sizes(MfCaseBuild &b, const Shape &s) {  // T E K n_group topk_group norm_topk
  b.size("T", s[0]).size("E", s[1]).size("K", s[2]).size("n_group", s[3]).size("topk_group", s[4]);
  b.size("norm_topk", s[5]).scalar("scaling", s[5] ? 2.5 : 1.0);
}
void b_router_group_fwd(MfCaseBuild &b, const Shape &s) {
  const int64_t T = s[0], E = s[1], K = s[2];
  group_sizes(b, s);
  b.values("logits", router_logits(b.rng(), T, E));
  if (s[5]) b.uniform("bias", (size_t)E, -0.05f, 0.05f);
  b.out("scores", (size_t)(T * E)).out("topk_idx", (size_t)(T * K)).out("topk_w", (size_t)(T * K));
}
// scores and topk_idx: the cpu router (F32 storage) of a forward case of the shape.
void b_router_group_bwd(MfCaseBuild &b, const Shape &s) {
  const int64_t T = s[0], E = s[1], K = s[2];
  MfKernelCase f = scratch(MF_K_ROUTER_GROUP_FWD, MF_DTYPE_F32);
  MfCaseBuild fb(&f, b.rng()());
  b_router_group_fwd(fb, s);
  const MfCaseOut o = on_cpu(b, f);
  group_sizes(b, s);
  take(b, "scores", f, o, "scores");
  take(b, "topk_idx", f, o, "topk_idx");
  b.uniform("dtopk_w", (size_t)(T * K)).out("dlogits", (size_t)(T * E));
}

void b_moe_dispatch(MfCaseBuild &b, const Shape &s) {  // T E K to_one
  const int64_t T = s[0], E = s[1], K = s[2];
  b.size("T", T).size("K", K).size("E", E);
  // to_one: every token's choices are the last K experts (one expert owns a run of rows).
  std::vector<int32_t> idx = topk_ids(b.rng(), T, E, K);
  if (s[3])
    for (int64_t t = 0; t < T; t++)
      for (int64_t j = 0; j < K; j++) idx[(size_t)(t * K + j)] = (int32_t)(E - 1 - j);
  b.i32("topk_idx", idx).out("counts", (size_t)E).out("offsets", (size_t)E + 1);
  b.out("row_of", (size_t)(T * K)).out("token_of_row", (size_t)(T * K));
}

void b_moe_gather(MfCaseBuild &b, const Shape &s) {  // T E K H
  const int64_t T = s[0], K = s[2], H = s[3];
  const Routing r = routing(b, T, s[1], K);
  b.size("R", T * K).size("H", H).uniform("x", (size_t)(T * H)).i32("token_of_row", r.token_of_row);
  b.out("xe", (size_t)(T * K * H));
}
void b_moe_gather_bwd(MfCaseBuild &b, const Shape &s) {  // T E K H accumulate
  const int64_t T = s[0], K = s[2], H = s[3];
  const Routing r = routing(b, T, s[1], K);
  b.size("T", T).size("K", K).size("H", H).size("accumulate", s[4]);
  b.uniform("dxe", (size_t)(T * K * H)).i32("row_of", r.row_of).out("dx", (size_t)(T * H));
}
void b_moe_combine(MfCaseBuild &b, const Shape &s) {  // T E K H
  const int64_t T = s[0], K = s[2], H = s[3];
  const Routing r = routing(b, T, s[1], K);
  b.size("T", T).size("K", K).size("H", H).uniform("ye", (size_t)(T * K * H));
  b.uniform("w", (size_t)(T * K), 0, 1).i32("row_of", r.row_of).out("y", (size_t)(T * H));
}
void b_moe_combine_bwd(MfCaseBuild &b, const Shape &s) {  // T E K H
  const int64_t T = s[0], K = s[2], H = s[3];
  const Routing r = routing(b, T, s[1], K);
  b.size("T", T).size("K", K).size("H", H).uniform("dy", (size_t)(T * H)).uniform("ye", (size_t)(T * K * H));
  b.uniform("w", (size_t)(T * K), 0, 1).i32("row_of", r.row_of);
  b.out("dye", (size_t)(T * K * H)).out("dw", (size_t)(T * K));
}

// The grouped expert GEMMs over a routing's offsets: R = T K + spare rows
// (past offsets[E]: not the kernel's), experts without rows NULL, and with
// `cold` the first expert with rows NULL too (a cold LoRA adapter: its rows
// are written as zeros by the forward kinds, skipped by bwd_weight).
struct ExpertShape {
  int64_t T, E, K, N, Kd, R;
  Routing r;
  std::vector<bool> null;
};
ExpertShape expert_shape(MfCaseBuild &b, const Shape &s) {  // T E K N Kd spare cold
  ExpertShape x{s[0], s[1], s[2], s[3], s[4], s[0] * s[2] + s[5], {}, {}};
  x.r = routing(b, x.T, x.E, x.K);
  x.null.resize((size_t)x.E);
  bool cold = s[6] != 0;
  for (int64_t e = 0; e < x.E; e++) {
    x.null[(size_t)e] = x.r.counts[(size_t)e] == 0 || cold;
    if (x.r.counts[(size_t)e] > 0) cold = false;
  }
  b.size("E", x.E).size("N", x.N).size("Kd", x.Kd);
  return x;
}
void b_expert_fwd(MfCaseBuild &b, const Shape &s) {
  const ExpertShape x = expert_shape(b, s);
  b.uniform("xe", (size_t)(x.R * x.Kd)).i64("offsets", x.r.offsets).out("ye", (size_t)(x.R * x.N));
  b.experts(x.E, (size_t)(x.N * x.Kd), x.null);
}
void b_expert_bwd_data(MfCaseBuild &b, const Shape &s) {
  const ExpertShape x = expert_shape(b, s);
  b.uniform("dye", (size_t)(x.R * x.N)).i64("offsets", x.r.offsets).out("dxe", (size_t)(x.R * x.Kd));
  b.experts(x.E, (size_t)(x.N * x.Kd), x.null);
}
void b_expert_bwd_weight(MfCaseBuild &b, const Shape &s) {
  const ExpertShape x = expert_shape(b, s);
  b.uniform("dye", (size_t)(x.R * x.N)).uniform("xe", (size_t)(x.R * x.Kd)).i64("offsets", x.r.offsets);
  b.experts(x.E, (size_t)(x.N * x.Kd), x.null);
}

// A per-expert bias over a routing's rows: R = T K + spare rows (past
// offsets[E]: not the kernel's); experts without rows where E is large.
void b_expert_bias_fwd(MfCaseBuild &b, const Shape &s) {  // T E K N spare
  const int64_t E = s[1], N = s[3], R = s[0] * s[2] + s[4];
  const Routing r = routing(b, s[0], E, s[2]);
  b.size("E", E).size("N", N).out("y", (size_t)(R * N)).i64("offsets", r.offsets);
  b.uniform("bias", (size_t)(E * N));
}
void b_expert_bias_bwd(MfCaseBuild &b, const Shape &s) {
  const int64_t E = s[1], N = s[3], R = s[0] * s[2] + s[4];
  const Routing r = routing(b, s[0], E, s[2]);
  b.size("E", E).size("N", N).uniform("dy", (size_t)(R * N)).i64("offsets", r.offsets);
  b.out("db", (size_t)(E * N));
}

void b_cross_entropy(MfCaseBuild &b, const Shape &s) {  // T V H chunk grads (0 none, 1 dh, 2 dh and dW)
  const int64_t T = s[0], V = s[1], H = s[2], chunk = s[3];
  b.size("T", T)
      .size("V", V)
      .size("H", H)
      .size("chunk", chunk)
      .scalar("loss_scale", s[4] == 2 ? 1.0 / 1024 : 1.0);
  std::vector<int32_t> target = ints(b.rng(), (size_t)T, -1, (int32_t)V - 1);  // -1: ignored
  if (T > 1) target[0] = -1;
  b.uniform("h", (size_t)(T * H), -2, 2).uniform("W", (size_t)(V * H), -0.5f, 0.5f).i32("target", target);
  b.out("ws", (size_t)(T * chunk)).out("lse", (size_t)T).out("scalars", 2);
  if (s[4] >= 1) b.out("dh", (size_t)(T * H));
  if (s[4] >= 2) b.out("dW", (size_t)(V * H));
}

// probs and topk_idx: the cpu router of router logits.
void b_aux_accumulate(MfCaseBuild &b, const Shape &s) {  // T E K
  const int64_t T = s[0], E = s[1], K = s[2];
  b.size("T", T).size("E", E).size("K", K);
  const Router f = router(b, T, E, K, 1);
  take(b, "probs", f.d, f.o, "probs");
  take(b, "topk_idx", f.d, f.o, "topk_idx");
  b.out("counts", (size_t)E).out("psum", (size_t)E);
}
std::vector<int64_t> some_counts(std::mt19937_64 &g, int64_t E) {
  std::uniform_int_distribution<int64_t> d(0, 1000);
  std::vector<int64_t> v((size_t)E);
  for (auto &x : v) x = d(g);
  return v;
}
void b_aux_value(MfCaseBuild &b, const Shape &s) {  // E n_rows
  std::uniform_real_distribution<double> d(0, 100);
  std::vector<double> psum((size_t)s[0]);
  for (auto &x : psum) x = d(b.rng());
  b.size("E", s[0]).size("n_rows", s[1]).i64("counts", some_counts(b.rng(), s[0])).f64("psum", psum);
  b.out("aux", 1);
}
void b_aux_grad(MfCaseBuild &b, const Shape &s) {  // E n_rows T
  b.size("E", s[0]).size("n_rows", s[1]).size("T", s[2]).scalar("coef", 0.01);
  b.i64("counts", some_counts(b.rng(), s[0])).out("dprobs", (size_t)(s[2] * s[0]));
}

// sums has a slot before `first` and one past the chunks: neither is written.
void b_grad_sumsq(MfCaseBuild &b, const Shape &s) {  // n first
  const size_t n = (size_t)s[0];
  b.size("n", s[0])
      .size("first", s[1])
      .uniform("g", n)
      .out("sums", (size_t)s[1] + mf_optim_norm_chunks(n) + 1);
}

// One AdamW step t = 3: with F32 storage the param is the master and state
// holds m, v; with BF16 the param is the master's bf16 working copy and state
// holds the fp32 master, then m, v (fp32, or bf16 with moment_bf16).
void b_adamw(MfCaseBuild &b, const Shape &s) {  // n moment_bf16 clip
  const size_t n = (size_t)s[0];
  b.size("n", s[0]).size("t", 3).size("moment_bf16", s[1]);
  b.scalar("lr", 1e-3)
      .scalar("beta1", 0.9)
      .scalar("beta2", 0.95)
      .scalar("eps", 1e-8)
      .scalar("weight_decay", 0.1);
  b.scalar("coef", s[2] ? 0.5 : 1.0);
  const std::vector<float> master = mf_case_uniform(b.rng(), n, -1, 1),
                           m = mf_case_uniform(b.rng(), n, -0.01f, 0.01f),
                           v = mf_case_uniform(b.rng(), n, 0, 1e-4f);
  b.values("param", master).uniform("grad", n, -0.1f, 0.1f);
  Bytes state = b.storage() == MF_DTYPE_BF16 ? bytes_of(master) : Bytes();
  for (const std::vector<float> *mom : {&m, &v}) {
    Bytes part;
    if (s[1]) {
      std::vector<uint16_t> h(n);
      mf_fp32_to_bf16_n(mom->data(), h.data(), n);
      part = bytes_of(h);
    } else {
      part = bytes_of(*mom);
    }
    state.insert(state.end(), part.begin(), part.end());
  }
  b.bytes("state", state);
}

// A quantized weight's blob (src/core/qformat.h): random codes but for the
// float pieces (positive scales, a finite code book and offset), no FP8 NaN
// code, e8m0 scales near 2^0.
void b_dequant(MfCaseBuild &b, const Shape &s) {  // kind rows cols blocksize nested
  mf_qweight w = {};
  w.kind = (int32_t)s[0], w.rows = s[1], w.cols = s[2], w.blocksize = s[3], w.nested = (int32_t)s[4];
  b.size("kind", s[0]).size("rows", s[1]).size("cols", s[2]).size("blocksize", s[3]).size("nested", s[4]);
  std::mt19937_64 &g = b.rng();
  Bytes blob((size_t)mf_qweight_blob_bytes(&w));
  for (auto &c : blob) c = (uint8_t)g();
  if (w.kind == MF_QUANT_FP8)
    for (int64_t k = 0; k < mf_qweight_q_bytes(&w); k++)
      blob[(size_t)k] = (uint8_t)((g() & 0x80) | (g() % 0x7f));
  auto floats_at = [&](int64_t at, int64_t n, float lo, float hi) {
    const std::vector<float> v = mf_case_uniform(g, (size_t)n, lo, hi);
    if (n) memcpy(&blob[(size_t)at], v.data(), (size_t)n * 4);
  };
  if (w.kind == MF_QUANT_MXFP4)
    for (int64_t k = 0; k < mf_qweight_scale_bytes(&w); k++)
      blob[(size_t)(mf_qweight_blob_scales_at(&w) + k)] = (uint8_t)(120 + g() % 10);
  else if (!w.nested)
    floats_at(mf_qweight_blob_scales_at(&w), mf_qweight_scale_bytes(&w) / 4, 0.01f, 2.0f);
  if (w.nested) {
    floats_at(mf_qweight_blob_absmax2_at(&w), mf_qweight_absmax2_count(&w), 0.5f, 1.0f);
    floats_at(mf_qweight_blob_code2_at(&w), 256, -1.0f, 1.0f);
    floats_at(mf_qweight_blob_offset_at(&w), 1, 0.1f, 0.3f);
  }
  b.bytes("qw", blob).out("y", (size_t)(w.rows * w.cols));
}

// Strided column blocks: C columns at xo of rows of xs, rep rows of y
// (stride ys, at yo) per row of x (DeepSeek-V3's latent attention).
void b_slice(MfCaseBuild &b, const Shape &s) {  // R C xs xo ys yo rep accumulate
  const int64_t R = s[0], rep = s[6];
  b.size("R", R).size("C", s[1]).size("xs", s[2]).size("xo", s[3]).size("ys", s[4]).size("yo", s[5]);
  b.size("rep", rep).size("accumulate", s[7]);
  b.uniform("x", (size_t)((R + rep - 1) / rep * s[2])).out("y", (size_t)(R * s[4]));
}
void b_slice_bwd(MfCaseBuild &b, const Shape &s) {  // Q C xs xo ys yo rep accumulate
  const int64_t Q = s[0], rep = s[6];
  b.size("Q", Q).size("C", s[1]).size("xs", s[2]).size("xo", s[3]).size("ys", s[4]).size("yo", s[5]);
  b.size("rep", rep).size("accumulate", s[7]);
  b.uniform("dy", (size_t)(Q * rep * s[4])).out("dx", (size_t)(Q * s[2]));
}

// ---------------------------------------------------------------- the table

const MfCaseTol kSame = mf_tol_exact();
MfCaseTol nmse(double bound, double rms_floor = 0) {
  return mf_tol_nmse(bound, rms_floor);
}
const char *const kBytesOnly = "its one operand is bytes, whatever the tensor's dtype";
const char *const kRouting = "integer routing maps: no FLOAT operand";
const char *const kAux = "fp32 probabilities, integer counts and double sums: no FLOAT operand";

}  // namespace

const std::vector<MfCaseEntry> &mf_case_table() {
  static const std::vector<MfCaseEntry> table = {
      {MF_K_ZERO, kBytesOnly, "n", {{1}, {7}, {4099}}, b_zero, {{"*", kSame, kSame}}},
      {MF_K_EMBED_FWD,
       nullptr,
       "T V H",
       {{1, 1, 1}, {37, 5, 129}, {64, 1000, 64}},
       b_embed_fwd,
       {{"*", kSame, kSame}}},
      {MF_K_EMBED_BWD,
       nullptr,
       "T V H",
       {{1, 1, 1}, {37, 5, 129}, {64, 1000, 64}},
       b_embed_bwd,
       {{"*", kSame, kSame}}},
      {MF_K_RMSNORM_FWD,
       nullptr,
       "R C in_place",
       {{1, 1, 0}, {37, 129, 0}, {64, 1024, 1}, {5, 3001, 0}},
       b_rmsnorm_fwd,
       {{"*", nmse(1e-10), nmse(1e-4)}}},
      {MF_K_RMSNORM_BWD,
       nullptr,
       "R C accumulate dw",
       {{1, 1, 0, 1}, {37, 129, 1, 1}, {64, 1024, 0, 1}, {5, 3001, 0, 0}},
       b_rmsnorm_bwd,
       {{"*", nmse(1e-9), nmse(1e-4)}}},
      {MF_K_LINEAR_FWD,
       nullptr,
       "M N K accumulate bias",
       {{1, 1, 1, 0, 0}, {37, 129, 65, 0, 1}, {64, 128, 128, 1, 1}, {33, 16, 96, 1, 0}},
       b_linear_fwd,
       {{"*", nmse(1e-10), nmse(1e-4)}}},
      {MF_K_LINEAR_BWD_DATA,
       nullptr,
       "M N K accumulate",
       {{1, 1, 1, 0}, {37, 129, 65, 1}, {64, 128, 128, 0}},
       b_linear_bwd_data,
       {{"*", nmse(1e-10), nmse(1e-4)}}},
      {MF_K_LINEAR_BWD_WEIGHT,
       nullptr,
       "M N K db",
       {{1, 1, 1, 1}, {37, 129, 65, 1}, {130, 16, 512, 0}},
       b_linear_bwd_weight,
       {{"*", nmse(1e-10), nmse(1e-4)}}},
      {MF_K_ROPE_FWD,
       nullptr,
       "T nh D rot",
       {{1, 1, 2, 0}, {7, 3, 5, 0}, {37, 4, 64, 32}, {9, 2, 128, 0}},
       b_rope_fwd,
       {{"*", nmse(1e-6), nmse(1e-4)}}},
      {MF_K_ROPE_BWD,
       nullptr,
       "T nh D rot",
       {{1, 1, 2, 0}, {7, 3, 5, 0}, {37, 4, 64, 32}, {9, 2, 128, 0}},
       b_rope_bwd,
       {{"*", nmse(1e-6), nmse(1e-4)}}},
      {MF_K_ATTN_FWD,
       nullptr,
       "B S Hq Hkv D window sinks",
       {{1, 1, 2, 1, 16},
        {2, 37, 4, 2, 40},
        {1, 70, 4, 1, 64},
        {1, 65, 2, 2, 128},
        {1, 70, 4, 2, 64, 3, 1},
        {2, 37, 4, 2, 40, 16, 1},
        {1, 130, 4, 1, 64, 40, 0},
        {1, 65, 2, 2, 128, 0, 1},
        {1, 9, 2, 1, 16, 1, 1}},
       b_attn_fwd,
       {{"*", nmse(1e-10), nmse(1e-4)}}},
      {MF_K_ATTN_BWD,
       nullptr,
       "B S Hq Hkv D window sinks",
       {{1, 1, 2, 1, 16},
        {2, 37, 4, 2, 40},
        {1, 70, 4, 1, 64},
        {1, 65, 2, 2, 128},
        {1, 70, 4, 2, 64, 3, 1},
        {2, 37, 4, 2, 40, 16, 1},
        {1, 130, 4, 1, 64, 40, 0},
        {1, 65, 2, 2, 128, 0, 1},
        {1, 9, 2, 1, 16, 1, 1}},
       b_attn_bwd,
       {{"*", nmse(1e-8, 1e-2), nmse(1e-4, 1e-2)}, {"dsinks", nmse(1e-8, 1e-2), nmse(1e-8, 1e-2)}}},
      {MF_K_SWIGLU_FWD, nullptr, "n", {{1}, {1001}, {4096}}, b_swiglu_fwd, {{"*", nmse(1e-10), nmse(1e-4)}}},
      {MF_K_SWIGLU_BWD, nullptr, "n", {{1}, {1001}, {4096}}, b_swiglu_bwd, {{"*", nmse(1e-10), nmse(1e-4)}}},
      {MF_K_SIGGATE_FWD,
       nullptr,
       "R C",
       {{1, 1}, {37, 129}, {5, 3001}},
       b_siggate_fwd,
       {{"*", nmse(1e-10), nmse(1e-4)}}},
      {MF_K_SIGGATE_BWD,
       nullptr,
       "R C",
       {{1, 1}, {37, 129}, {5, 3001}},
       b_siggate_bwd,
       {{"*", nmse(1e-10), nmse(1e-4)}, {"dgl", nmse(1e-9), nmse(1e-4)}}},
      {MF_K_ADD, nullptr, "n fp32", {{1, 0}, {5, 1}, {4099, 0}, {4099, 1}}, b_add, {{"*", kSame, kSame}}},
      {MF_K_SCALE, nullptr, "n", {{1}, {5}, {4099}}, b_scale, {{"*", kSame, kSame}}},
      {MF_K_DROPOUT,
       nullptr,
       "n row sources E",
       {{1}, {5}, {4099}, {12, 4, 1, 1}, {4096, 64, 2, 4}, {40 * 33, 33, 4, 3}},
       b_dropout,
       {{"*", kSame, kSame}}},
      // mode 1: gpt-oss's top-k then softmax (left out: 0)
      {MF_K_ROUTER_FWD,
       nullptr,
       "T E K norm_topk mode",
       {{1, 1, 1, 0}, {1, 4, 4, 1}, {37, 8, 2, 1}, {129, 60, 4, 0}, {1, 4, 4, 0, 1}, {37, 8, 2, 1, 1},
        {129, 32, 4, 0, 1}},
       b_router_fwd,
       {{"*", nmse(1e-10), nmse(1e-9)}}},
      {MF_K_ROUTER_BWD,
       nullptr,
       "T E K norm_topk extra mode",
       {{1, 1, 1, 0, 0},
        {37, 8, 2, 1, 1},
        {129, 60, 4, 0, 1},
        {64, 64, 8, 1, 0},
        {1, 1, 1, 0, 1, 1},
        {37, 8, 2, 0, 1, 1},
        {129, 32, 4, 1, 0, 1},
        {64, 64, 8, 0, 1, 1}},
       b_router_bwd,
       {{"*", nmse(1e-9), nmse(1e-4)}}},
      {MF_K_MOE_DISPATCH,
       kRouting,
       "T E K to_one",
       {{1, 1, 1, 0}, {1, 16, 2, 0}, {37, 8, 2, 0}, {300, 60, 4, 0}, {700, 4, 1, 1}},
       b_moe_dispatch,
       {{"*", kSame, kSame}}},
      {MF_K_MOE_GATHER,
       nullptr,
       "T E K H",
       {{1, 1, 1, 1}, {3, 64, 4, 129}, {37, 8, 2, 64}},
       b_moe_gather,
       {{"*", kSame, kSame}}},
      {MF_K_MOE_GATHER_BWD,
       nullptr,
       "T E K H accumulate",
       {{1, 1, 1, 1, 0}, {3, 64, 4, 129, 1}, {37, 8, 2, 64, 0}},
       b_moe_gather_bwd,
       {{"*", kSame, kSame}}},
      {MF_K_MOE_COMBINE,
       nullptr,
       "T E K H",
       {{1, 1, 1, 1}, {3, 64, 4, 129}, {37, 8, 2, 64}},
       b_moe_combine,
       {{"*", nmse(1e-10), nmse(1e-4)}}},
      {MF_K_MOE_COMBINE_BWD,
       nullptr,
       "T E K H",
       {{1, 1, 1, 1}, {3, 64, 4, 129}, {37, 8, 2, 64}},
       b_moe_combine_bwd,
       {{"*", nmse(1e-9), nmse(1e-4)}, {"dye", kSame, kSame}}},
      {MF_K_EXPERT_FWD,
       nullptr,
       "T E K N Kd spare cold",
       {{1, 1, 1, 1, 1, 0, 0},
        {37, 5, 2, 129, 65, 3, 0},
        {64, 16, 2, 96, 128, 0, 1},
        {3, 64, 4, 16, 32, 0, 0}},
       b_expert_fwd,
       {{"*", nmse(1e-10), nmse(1e-4)}}},
      {MF_K_EXPERT_BWD_DATA,
       nullptr,
       "T E K N Kd spare cold",
       {{1, 1, 1, 1, 1, 0, 0},
        {37, 5, 2, 129, 65, 3, 0},
        {64, 16, 2, 96, 128, 0, 1},
        {3, 64, 4, 16, 32, 0, 0}},
       b_expert_bwd_data,
       {{"*", nmse(1e-10), nmse(1e-4)}}},
      {MF_K_EXPERT_BWD_WEIGHT,
       nullptr,
       "T E K N Kd spare cold",
       {{1, 1, 1, 1, 1, 0, 0},
        {37, 5, 2, 129, 65, 3, 0},
        {64, 16, 2, 96, 128, 0, 1},
        {3, 64, 4, 16, 32, 0, 0}},
       b_expert_bwd_weight,
       {{"*", nmse(1e-10), nmse(1e-8)}}},
      {MF_K_CROSS_ENTROPY,
       nullptr,
       "T V H chunk grads",
       {{1, 1, 1, 1, 2}, {37, 1001, 65, 256, 0}, {37, 1001, 65, 256, 2}, {64, 300, 96, 300, 1}},
       b_cross_entropy,
       {{"*", nmse(1e-9), nmse(1e-3)},
        {"ws", mf_tol_skip(), mf_tol_skip()},
        {"lse", nmse(1e-11), nmse(1e-8)},
        {"scalars", nmse(1e-10), nmse(1e-8)}}},
      {MF_K_AUX_ACCUMULATE,
       kAux,
       "T E K",
       {{1, 1, 1}, {37, 8, 2}, {300, 60, 4}},
       b_aux_accumulate,
       {{"*", nmse(1e-24), nmse(1e-24)}}},
      {MF_K_AUX_VALUE,
       kAux,
       "E n_rows",
       {{1, 3}, {8, 112}, {60, 901}},
       b_aux_value,
       {{"*", nmse(1e-24), nmse(1e-24)}}},
      {MF_K_AUX_GRAD,
       kAux,
       "E n_rows T",
       {{1, 3, 1}, {8, 112, 37}, {60, 901, 300}},
       b_aux_grad,
       {{"*", nmse(1e-20), nmse(1e-20)}}},
      {MF_K_GRAD_SUMSQ,
       "an fp32 gradient's chunk sums in doubles, whatever the storage",
       "n first",
       {{1, 0}, {1000, 2}, {3 * 65536 + 4321, 1}},
       b_grad_sumsq,
       {{"*", kSame, kSame}}},
      {MF_K_ADAMW,
       nullptr,
       "n moment_bf16 clip",
       {{1, 0, 0}, {1001, 1, 1}, {70001, 0, 1}, {70001, 1, 0}},
       b_adamw,
       {{"*", kSame, kSame}}},
      {MF_K_DEQUANT,
       nullptr,
       "kind rows cols blocksize nested",
       {{MF_QUANT_NF4, 3, 64, 64, 0},
        {MF_QUANT_NF4, 5, 96, 32, 1},
        {MF_QUANT_FP8, 130, 136, 0, 0},
        {MF_QUANT_MXFP4, 4, 64, 0, 0}},
       b_dequant,
       {{"*", kSame, kSame}}},
      {MF_K_ROUTER_GROUP_FWD,
       nullptr,
       "T E K n_group topk_group norm_topk",
       {{1, 4, 1, 1, 1, 0}, {37, 16, 4, 4, 2, 1}, {129, 64, 8, 8, 4, 1}, {64, 32, 2, 16, 1, 0}},
       b_router_group_fwd,
       {{"*", nmse(1e-10), nmse(1e-9)}}},
      {MF_K_ROUTER_GROUP_BWD,
       nullptr,
       "T E K n_group topk_group norm_topk",
       {{1, 4, 1, 1, 1, 0}, {37, 16, 4, 4, 2, 1}, {129, 64, 8, 8, 4, 1}, {64, 32, 2, 16, 1, 0}},
       b_router_group_bwd,
       {{"*", nmse(1e-9), nmse(1e-4)}}},
      // A head's block of a projection row (xo 128 of 192), a block broadcast
      // to rep = 8 rows, blocks added in (accumulate), rows of one column.
      {MF_K_SLICE,
       nullptr,
       "R C xs xo ys yo rep accumulate",
       {{1, 1, 1, 0, 1, 0, 1, 0},
        {37, 64, 192, 128, 64, 0, 1, 0},
        {40, 64, 576, 512, 192, 128, 8, 1},
        {37, 16, 16, 0, 48, 32, 1, 1}},
       b_slice,
       {{"*", kSame, kSame}}},
      {MF_K_SLICE_BWD,
       nullptr,
       "Q C xs xo ys yo rep accumulate",
       {{1, 1, 1, 0, 1, 0, 1, 0},
        {37, 64, 192, 128, 64, 0, 1, 1},
        {5, 64, 576, 512, 192, 128, 8, 0},
        {37, 16, 16, 0, 48, 32, 1, 0}},
       b_slice_bwd,
       {{"*", kSame, kSame}}},
      {MF_K_SWIGLU_CLAMP_FWD,
       nullptr,
       "n",
       {{1}, {1001}, {4096}},
       b_swiglu_clamp_fwd,
       {{"*", nmse(1e-10), nmse(1e-4)}}},
      {MF_K_SWIGLU_CLAMP_BWD,
       nullptr,
       "n",
       {{1}, {1001}, {4096}},
       b_swiglu_clamp_bwd,
       {{"*", nmse(1e-10), nmse(1e-4)}}},
      // many experts without rows (E 64 over 12 rows), spare rows past offsets[E]
      {MF_K_EXPERT_BIAS_FWD,
       nullptr,
       "T E K N spare",
       {{1, 1, 1, 1, 0}, {37, 5, 2, 129, 3}, {3, 64, 4, 360, 0}, {64, 32, 4, 180, 1}},
       b_expert_bias_fwd,
       {{"*", kSame, kSame}}},
      {MF_K_EXPERT_BIAS_BWD,
       nullptr,
       "T E K N spare",
       {{1, 1, 1, 1, 0}, {37, 5, 2, 129, 3}, {3, 64, 4, 360, 0}, {64, 32, 4, 180, 1}},
       b_expert_bias_bwd,
       {{"*", kSame, kSame}}},
  };
  return table;
}
