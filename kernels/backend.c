/* The operand table (kernels/backend.h): per kernel kind its name, its
 * operands b[] with their roles, what its sizes i[] and scalars f[] hold —
 * written here once. The roles the planner reads (mf_kernel_reads/writes), the
 * operand checks of both backends and the names in their messages, and the
 * tests' operand construction all come from it. The meaning of each operand is
 * the cpu twin's (kernels/cpu/cpu_ops.h, same names). */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "kernels/backend.h"
#include "src/core/qformat.h"

/* One entry per kind, its operands on as few lines as fit. */
/* clang-format off */
#define R MF_KOP_READ
#define W MF_KOP_WRITE
#define A MF_KOP_ADD
#define ACC MF_KOP_ACCUMULATE
#define OPT(name, role) {name, role, 1, MF_KT_FLOAT}
/* an operand of a fixed type: F32, F64, I32, I64, BYTES */
#define F32(name, role) {name, role, 0, MF_KT_F32}
#define F64(name, role) {name, role, 0, MF_KT_F64}
#define I32(name, role) {name, role, 0, MF_KT_I32}
#define I64(name, role) {name, role, 0, MF_KT_I64}
#define BYTES(name, role) {name, role, 0, MF_KT_BYTES}

/* Operands without a type are FLOAT (the call's storage dtype). Gradients of
 * weights (dtable, dw, dW, db, the experts' dW) are fp32 sums whatever the
 * storage; so are rstd, lse, the router's probabilities and top-k weights. */
static const mf_kernel_info k_info[MF_K_COUNT_] = {
    [MF_K_ZERO] = {"zero", {BYTES("x", W)}},
    [MF_K_EMBED_FWD] = {"embed_fwd", {I32("ids", R), {"table", R}, {"out", W}}, {"T", "V", "H"}},
    [MF_K_EMBED_BWD] = {"embed_bwd", {I32("ids", R), {"dout", R}, F32("dtable", A)}, {"T", "V", "H"}},
    [MF_K_RMSNORM_FWD] = {"rmsnorm_fwd", {{"x", R}, {"w", R}, {"y", W}, F32("rstd", W)}, {"R", "C"}, {"eps"}},
    [MF_K_RMSNORM_BWD] = {"rmsnorm_bwd",
                          {{"dy", R}, {"x", R}, {"w", R}, F32("rstd", R), {"dx", ACC}, {"dw", A, 1, MF_KT_F32}},
                          {"R", "C", "accumulate"}},
    [MF_K_LINEAR_FWD] = {"linear_fwd",
                         {{"x", R}, {"W", R}, OPT("bias", R), {"y", ACC}},
                         {"M", "N", "K", "accumulate"}},
    [MF_K_LINEAR_BWD_DATA] = {"linear_bwd_data",
                              {{"dy", R}, {"W", R}, {"dx", ACC}},
                              {"M", "N", "K", "accumulate"}},
    [MF_K_LINEAR_BWD_WEIGHT] = {"linear_bwd_weight",
                                {{"dy", R}, {"x", R}, F32("dW", A), {"db", A, 1, MF_KT_F32}},
                                {"M", "N", "K"}},
    /* in place: x (dx) is read and overwritten; dims [off, off + rot) of each head rotated (rot 0: D - off);
     * interleaved: adjacent pairs; YaRN when factor > 1; each new slot 0: as before them (kernels/rope.h) */
    [MF_K_ROPE_FWD] = {"rope_fwd", {{"x", A}, I32("pos", R)},
                       {"T", "nh", "D", "rot", "off", "interleaved", "truncate"},
                       {"theta", "factor", "original_max", "beta_fast", "beta_slow", "attention_factor"}},
    [MF_K_ROPE_BWD] = {"rope_bwd", {{"dx", A}, I32("pos", R)},
                       {"T", "nh", "D", "rot", "off", "interleaved", "truncate"},
                       {"theta", "factor", "original_max", "beta_fast", "beta_slow", "attention_factor"}},
    /* D: the head dim of q and k (the scores); Dv: that of v, o, dout and dv
     * (0: D) — DeepSeek-V3's latent attention has q/k heads of 192, v heads of 128.
     * window: a sliding window, key j seen from query i when i - window < j <= i
     * (0: none). sinks [Hq] (absent: none): gpt-oss's learned logit per query head,
     * one more column of every row's softmax, dropped after it (lse includes it);
     * dsinks [Hq] its gradient, fp32, added into (absent: frozen). */
    [MF_K_ATTN_FWD] = {"attn_fwd",
                       {{"q", R}, {"k", R}, {"v", R}, {"o", W}, F32("lse", W), OPT("sinks", R)},
                       {"B", "S", "Hq", "Hkv", "D", "Dv", "window"},
                       {"scale"}},
    [MF_K_ATTN_BWD] = {"attn_bwd",
                       {{"q", R}, {"k", R}, {"v", R}, {"o", R}, {"dout", R}, F32("lse", R), {"dq", W}, {"dk", W},
                        {"dv", W}, OPT("sinks", R), {"dsinks", A, 1, MF_KT_F32}},
                       {"B", "S", "Hq", "Hkv", "D", "Dv", "window"},
                       {"scale"}},
    [MF_K_SWIGLU_FWD] = {"swiglu_fwd", {{"g", R}, {"u", R}, {"act", W}}, {"n"}},
    [MF_K_SWIGLU_BWD] = {"swiglu_bwd", {{"g", R}, {"u", R}, {"dact", R}, {"dg", W}, {"du", W}}, {"n"}},
    [MF_K_SIGGATE_FWD] = {"sigmoid_gate_fwd", {{"gl", R}, {"x", R}, {"y", A}}, {"R", "C"}},
    [MF_K_SIGGATE_BWD] = {"sigmoid_gate_bwd",
                          {{"gl", R}, {"x", R}, {"dy", R}, {"dx", W}, {"dgl", W}},
                          {"R", "C"}},
    /* fp32 = 1 for gradient sums, which are never rounded to bf16 (their
     * operands are F32 in a BF16 program too) */
    [MF_K_ADD] = {"add", {{"x", R}, {"y", A}}, {"n", "fp32"}},
    [MF_K_SCALE] = {"scale", {{"x", A}}, {"n"}, {"s"}},
    /* stream and seed: the mask's (mf_dropout_bits; seed set per micro-batch at run time). With
     * segments (expert parallelism's received rows, of `row` elements): part k's rows are rows
     * starts[k] .. of its source's layout, source k % sources, whose seed is seeds[k % sources]; their
     * masks are the source's (mf_cpu_dropout_parts) */
    [MF_K_DROPOUT] = {"dropout",
                      {{"x", R}, {"y", W}, {"segments", R, 1, MF_KT_I64}, {"starts", R, 1, MF_KT_I64},
                       {"seeds", R, 1, MF_KT_I64}},
                      {"n", "stream", "seed", "row", "sources", "parts"},
                      {"p"}},
    /* mode 0: softmax over E, then the top-k of the probabilities; mode 1
     * (gpt-oss): the top-k of the logits, their softmax the weights, probs the
     * softmax over E of the weights scattered into a row of zeros; norm_topk
     * is mode 0's (kernels/cpu/router.c) */
    [MF_K_ROUTER_FWD] = {"router_fwd",
                         {{"logits", R}, F32("probs", W), I32("topk_idx", W), F32("topk_w", W)},
                         {"T", "E", "K", "norm_topk", "mode"}},
    [MF_K_ROUTER_BWD] = {"router_bwd",
                         {F32("probs", R), I32("topk_idx", R), F32("topk_w", R), {"dtopk_w", R},
                          {"dprobs_extra", R, 1, MF_KT_F32}, {"dlogits", W}},
                         {"T", "E", "K", "norm_topk", "mode"}},
    /* counts and offsets are int64, the row maps int32 */
    [MF_K_MOE_DISPATCH] = {"moe_dispatch",
                           {I32("topk_idx", R), I64("counts", W), I64("offsets", W), I32("row_of", W),
                            I32("token_of_row", W)},
                           {"T", "K", "E"}},
    [MF_K_MOE_GATHER] = {"moe_gather", {{"x", R}, I32("token_of_row", R), {"xe", W}}, {"R", "H"}},
    [MF_K_MOE_GATHER_BWD] = {"moe_gather_bwd",
                             {{"dxe", R}, I32("row_of", R), {"dx", ACC}},
                             {"T", "K", "H", "accumulate"}},
    [MF_K_MOE_COMBINE] = {"moe_combine", {{"ye", R}, F32("w", R), I32("row_of", R), {"y", A}}, {"T", "K", "H"}},
    [MF_K_MOE_COMBINE_BWD] = {"moe_combine_bwd",
                              {{"dy", R}, {"ye", R}, F32("w", R), I32("row_of", R), {"dye", W}, {"dw", W}},
                              {"T", "K", "H"}},
    /* The expert weights: E pointers of expert_bytes each, NULL for an expert
     * without rows; the rows R come from the first operand's bytes
     * (mf_kernel_expert_rows). */
    [MF_K_EXPERT_FWD] = {"expert_fwd",
                         {{"xe", R}, I64("offsets", R), {"ye", W}},
                         {"E", "N", "Kd"},
                         {0},
                         {"W", R}},
    [MF_K_EXPERT_BWD_DATA] = {"expert_bwd_data",
                              {{"dye", R}, I64("offsets", R), {"dxe", W}},
                              {"E", "N", "Kd"},
                              {0},
                              {"W", R}},
    /* segments (optional; sources parts an expert): expert e's rows in parts, each summed from 0 in row
     * order and then added into dW[e] in part order (EP_DISPATCH's, whose exactness it keeps) */
    [MF_K_EXPERT_BWD_WEIGHT] = {"expert_bwd_weight",
                                {{"dye", R}, {"xe", R}, I64("offsets", R), {"segments", R, 1, MF_KT_I64}},
                                {"E", "N", "Kd", "sources"},
                                {0},
                                F32("dW", A)},
    /* ws and lse are workspace; scalars: 2 doubles {loss_sum, n_valid}; dh
     * and dW present for the backward */
    [MF_K_CROSS_ENTROPY] = {"cross_entropy",
                            {{"h", R}, {"W", R}, I32("target", R), F32("ws", W), F32("lse", W),
                             F64("scalars", W), OPT("dh", W), {"dW", A, 1, MF_KT_F32}},
                            {"T", "V", "H", "chunk"},
                            {"loss_scale"}},
    /* counts int64, psum double; aux (AUX_VALUE) one double */
    [MF_K_AUX_ACCUMULATE] = {"aux_accumulate",
                             {F32("probs", R), I32("topk_idx", R), I64("counts", A), F64("psum", A)},
                             {"T", "E", "K"}},
    [MF_K_AUX_VALUE] = {"aux_value", {I64("counts", R), F64("psum", R), F64("aux", W)}, {"E", "n_rows"}},
    [MF_K_AUX_GRAD] = {"aux_grad", {I64("counts", R), F32("dprobs", W)}, {"E", "n_rows", "T"}, {"coef"}},
    /* g fp32, sums double: chunk sums written from sums[first] on */
    [MF_K_GRAD_SUMSQ] = {"grad_sumsq", {F32("g", R), F64("sums", W)}, {"n", "first"}},
    /* param in the storage dtype, grad fp32 (scaled in place), state: with
     * BF16 storage the fp32 master first, then m and v (fp32, or bf16 when
     * moment_bf16); the param is then the master's bf16 working copy */
    [MF_K_ADAMW] = {"adamw",
                    {{"param", A}, F32("grad", A), BYTES("state", A)},
                    {"n", "t", "moment_bf16"},
                    {"lr", "beta1", "beta2", "eps", "weight_decay", "coef"}},
    /* qw: the weight's blob, mf_qweight_blob_view's layout */
    [MF_K_DEQUANT] = {"dequant", {BYTES("qw", R), {"y", W}}, {"kind", "rows", "cols", "blocksize", "nested"}},
    /* bias: e_score_correction_bias (the choice only; absent: none); scaling: routed_scaling_factor */
    [MF_K_ROUTER_GROUP_FWD] = {"router_group_fwd",
                               {{"logits", R}, {"bias", R, 1}, F32("scores", W), I32("topk_idx", W),
                                F32("topk_w", W)},
                               {"T", "E", "K", "n_group", "topk_group", "norm_topk"},
                               {"scaling"}},
    /* y[r*ys + yo + j] (+)= x[(r / rep)*xs + xo + j], r < R, j < C; the bwd: x[q*xs + xo + j] (+)= the sum over
     * h < rep of y[(q*rep + h)*ys + yo + j], q < Q (its dy is y's gradient, dx x's) */
    [MF_K_SLICE] = {"slice", {{"x", R}, {"y", ACC}}, {"R", "C", "xs", "xo", "ys", "yo", "rep", "accumulate"}},
    [MF_K_SLICE_BWD] = {"slice_bwd", {{"dy", R}, {"dx", ACC}}, {"Q", "C", "xs", "xo", "ys", "yo", "rep", "accumulate"}},
    [MF_K_ROUTER_GROUP_BWD] = {"router_group_bwd",
                               {F32("scores", R), I32("topk_idx", R), {"dtopk_w", R}, {"dlogits", W}},
                               {"T", "E", "K", "n_group", "topk_group", "norm_topk"},
                               {"scaling"}},
    /* gpt-oss's clamped SwiGLU: limit (7) and alpha (1.702) */
    [MF_K_SWIGLU_CLAMP_FWD] = {"swiglu_clamp_fwd",
                               {{"g", R}, {"u", R}, {"act", W}},
                               {"n"},
                               {"limit", "alpha"}},
    [MF_K_SWIGLU_CLAMP_BWD] = {"swiglu_clamp_bwd",
                               {{"g", R}, {"u", R}, {"dact", R}, {"dg", W}, {"du", W}},
                               {"n"},
                               {"limit", "alpha"}},
    /* y [R, N] += bias[e] on the rows of expert e (offsets as EXPERT_FWD's; R from y's bytes,
     * mf_kernel_expert_rows); db [E, N] += the row-order sums of dy's rows, fp32 */
    [MF_K_EXPERT_BIAS_FWD] = {"expert_bias_fwd", {{"y", A}, I64("offsets", R), {"bias", R}}, {"E", "N"}},
    /* segments (optional; sources parts an expert): as EXPERT_BWD_WEIGHT's */
    [MF_K_EXPERT_BIAS_BWD] = {"expert_bias_bwd",
                              {{"dy", R}, I64("offsets", R), F32("db", A), {"segments", R, 1, MF_KT_I64}},
                              {"E", "N", "sources"}},
    /* starts and seeds (optional: adapter dropout on the experts): each part's first row in its
     * source's layout, and each source's dropout seed (seed: this rank's, set at run time) */
    [MF_K_EP_DISPATCH] = {"ep_dispatch",
                          {{"x", R}, I64("loffs", R), {"y", W}, I64("offsets", W), I64("segments", W),
                           {"counts", W, 1, MF_KT_I64}, {"starts", W, 1, MF_KT_I64},
                           {"seeds", W, 1, MF_KT_I64}},
                          {"E", "ep", "C", "rank", "seed"}},
    [MF_K_EP_COMBINE] = {"ep_combine",
                         {{"y", R}, I64("offsets", R), I64("segments", R), I64("loffs", R), {"x", W}},
                         {"E", "ep", "C", "rank"}},
};

/* clang-format on */
#undef R
#undef W
#undef A
#undef ACC
#undef OPT
#undef F32
#undef F64
#undef I32
#undef I64
#undef BYTES

const mf_kernel_info *mf_kernel_info_of(mf_kernel k) {
  return (int)k >= 0 && k < MF_K_COUNT_ ? &k_info[k] : NULL;
}

const char *mf_kernel_name(mf_kernel k) {
  const mf_kernel_info *t = mf_kernel_info_of(k);
  return t ? t->name : "unknown";
}

int mf_kernel_is_exchange(mf_kernel k) {
  return k == MF_K_EP_DISPATCH || k == MF_K_EP_COMBINE;
}

int mf_kernel_n_operands(mf_kernel k) {
  const mf_kernel_info *t = mf_kernel_info_of(k);
  int n = 0;
  while (t && n < MF_KBUF_MAX && t->b[n].name) n++;
  return n;
}

int mf_kernel_accumulates(const mf_kernel_call *k) {
  const mf_kernel_info *t = mf_kernel_info_of(k->kind);
  for (int j = 0; t && j < 8 && t->i[j]; j++)
    if (strcmp(t->i[j], "accumulate") == 0) return k->i[j] != 0;
  return 0;
}

/* The operands whose role has all of `bits`. */
static uint32_t with_role(mf_kernel kind, int bits) {
  const mf_kernel_info *t = mf_kernel_info_of(kind);
  uint32_t m = 0;
  for (int j = 0; t && j < MF_KBUF_MAX && t->b[j].name; j++)
    if (((int)t->b[j].role & bits) == bits) m |= 1u << j;
  return m;
}

uint32_t mf_kernel_writes(const mf_kernel_call *k) {
  return with_role(k->kind, MF_KOP_WRITE);
}

uint32_t mf_kernel_reads(const mf_kernel_call *k) {
  uint32_t m = with_role(k->kind, MF_KOP_READ);
  if (mf_kernel_accumulates(k)) m |= with_role(k->kind, MF_KOP_ACCUMULATE);
  return m;
}

int mf_kernel_writes_experts(mf_kernel k) {
  const mf_kernel_info *t = mf_kernel_info_of(k);
  return t && t->experts.name && ((int)t->experts.role & MF_KOP_WRITE);
}

const char *mf_kernel_operand_text(mf_kernel k, int slot, char *buf, size_t cap) {
  const mf_kernel_info *t = mf_kernel_info_of(k);
  if (slot >= 100)
    snprintf(buf, cap, "operand %s[%d]", t && t->experts.name ? t->experts.name : "experts", slot - 100);
  else if (slot >= 0 && slot < mf_kernel_n_operands(k))
    snprintf(buf, cap, "operand %d (%s)", slot, t->b[slot].name);
  else
    snprintf(buf, cap, "operand %d (not one of %s's)", slot, mf_kernel_name(k));
  return buf;
}

/* DEQUANT's sizes: a format it knows, and operands that hold the weight the
 * call describes (a short one would be read past its end on the device). */
static mf_status dequant_check(const mf_kernel_call *k, const char *label, mf_dtype storage) {
  const mf_qweight w = {.kind = (int32_t)k->i[0], .nested = (int32_t)k->i[4], .rows = k->i[1], .cols = k->i[2],
                        .blocksize = k->i[3]};
  const char *in = *label ? " in " : "";
  if (w.kind <= MF_QUANT_NONE || w.kind >= MF_QUANT_COUNT_ || w.rows < 0 || w.cols < 0)
    return MF_ERR(MF_ERR_INVALID_ARG, "kernel dequant%s%s: format %d, shape [%lld, %lld]", in, label, (int)w.kind,
                  (long long)w.rows, (long long)w.cols);
  if (w.kind == MF_QUANT_NF4 && !mf_nf4_blocksize_ok(w.blocksize))
    return MF_ERR(MF_ERR_INVALID_ARG, "kernel dequant%s%s: NF4 block size %lld", in, label, (long long)w.blocksize);
  if (w.kind == MF_QUANT_MXFP4 && w.cols % MF_MXFP4_GROUP)
    return MF_ERR(MF_ERR_INVALID_ARG, "kernel dequant%s%s: %lld MXFP4 columns (groups of 32)", in, label,
                  (long long)w.cols);
  const int64_t need[2] = {mf_qweight_blob_bytes(&w), w.rows * w.cols * (int64_t)mf_dtype_size(storage)};
  for (int j = 0; j < 2; j++)
    if ((int64_t)k->b[j].bytes < need[j] || (need[j] > 0 && !k->b[j].ptr)) {
      char what[64];
      return MF_ERR(MF_ERR_INVALID_ARG, "kernel dequant%s%s: %s has %zu bytes, the weight needs %lld", in, label,
                    mf_kernel_operand_text(k->kind, j, what, sizeof what), k->b[j].bytes, (long long)need[j]);
    }
  return MF_OK;
}

mf_status mf_kernel_call_check(const mf_kernel_call *k) {
  const mf_kernel_info *t = mf_kernel_info_of(k->kind);
  const char *label = k->label ? k->label : "";
  if (!t)
    return MF_ERR(MF_ERR_INVALID_ARG, "kernel kind %d%s%s is not one of the %d kinds of kernels/backend.h",
                  (int)k->kind, *label ? " in " : "", label, (int)MF_K_COUNT_);
  for (int j = 0; j < MF_KBUF_MAX; j++) {
    const int required = j < mf_kernel_n_operands(k->kind) && !t->b[j].optional;
    if (required && !k->b[j].ptr && k->b[j].bytes) {
      char what[64];
      return MF_ERR(MF_ERR_INVALID_ARG, "kernel %s%s%s: %s, %zu bytes, is NULL", t->name,
                    *label ? " in " : "", label, mf_kernel_operand_text(k->kind, j, what, sizeof what),
                    k->b[j].bytes);
    }
  }
  mf_dtype storage;
  MF_CHECK(mf_kernel_call_dtype(k, &storage));
  return k->kind == MF_K_DEQUANT ? dequant_check(k, label, storage) : MF_OK;
}

mf_dtype mf_kop_type_dtype(mf_kop_type t, mf_dtype storage) {
  switch (t) {
    case MF_KT_FLOAT:
      return storage;
    case MF_KT_F32:
      return MF_DTYPE_F32;
    case MF_KT_F64:
      return MF_DTYPE_F64;
    case MF_KT_I32:
      return MF_DTYPE_I32;
    case MF_KT_I64:
      return MF_DTYPE_I64;
    default:
      return MF_DTYPE_INVALID;
  }
}

/* An operand's dtype as given; 0 stands for its type's dtype with F32 storage. */
static mf_dtype given(const mf_kop *op, mf_dtype d) {
  return d != MF_DTYPE_INVALID ? d : mf_kop_type_dtype(op->type, MF_DTYPE_F32);
}

mf_status mf_kernel_call_dtype(const mf_kernel_call *k, mf_dtype *storage) {
  const mf_kernel_info *t = mf_kernel_info_of(k->kind);
  const char *label = k->label ? k->label : "";
  *storage = MF_DTYPE_F32;
  if (!t)
    return MF_ERR(MF_ERR_INVALID_ARG, "kernel kind %d%s%s is not one of the %d kinds of kernels/backend.h",
                  (int)k->kind, *label ? " in " : "", label, (int)MF_K_COUNT_);
  /* The storage: the first FLOAT operand present (an expert weight counts as
   * slot 100). */
  const int n = mf_kernel_n_operands(k->kind);
  int from = -1;
  mf_dtype st = MF_DTYPE_INVALID;
  for (int j = 0; j <= n && from < 0; j++) {
    const mf_kop *op = j < n ? &t->b[j] : &t->experts;
    const int present = j < n ? k->b[j].ptr != NULL : op->name && k->experts != NULL;
    if (!present || op->type != MF_KT_FLOAT) continue;
    st = given(op, j < n ? k->b[j].dtype : k->expert_dtype);
    from = j < n ? j : 100;
  }
  char what[64], what2[64];
  if (from >= 0 && st != MF_DTYPE_F32 && st != MF_DTYPE_BF16)
    return MF_ERR(MF_ERR_INVALID_ARG, "kernel %s%s%s: %s is %s; its storage must be F32 or BF16", t->name,
                  *label ? " in " : "", label, mf_kernel_operand_text(k->kind, from, what, sizeof what),
                  mf_dtype_name(st));
  if (from < 0) st = MF_DTYPE_F32;
  for (int j = 0; j <= n; j++) {
    const mf_kop *op = j < n ? &t->b[j] : &t->experts;
    const int present = j < n ? k->b[j].ptr != NULL : op->name && k->experts != NULL;
    if (!present || op->type == MF_KT_BYTES) continue;
    const mf_dtype want = mf_kop_type_dtype(op->type, st);
    const mf_dtype got = given(op, j < n ? k->b[j].dtype : k->expert_dtype);
    if (got == want) continue;
    mf_kernel_operand_text(k->kind, j < n ? j : 100, what, sizeof what);
    if (op->type == MF_KT_FLOAT)
      return MF_ERR(MF_ERR_INVALID_ARG, "kernel %s%s%s: %s is %s but %s is %s; a call computes in one storage dtype",
                    t->name, *label ? " in " : "", label, what, mf_dtype_name(got),
                    mf_kernel_operand_text(k->kind, from, what2, sizeof what2), mf_dtype_name(st));
    return MF_ERR(MF_ERR_INVALID_ARG, "kernel %s%s%s: %s is %s; it must be %s", t->name, *label ? " in " : "",
                  label, what, mf_dtype_name(got), mf_dtype_name(want));
  }
  *storage = st;
  return MF_OK;
}

int64_t mf_kernel_expert_rows(const mf_kernel_call *k) {
  int64_t width = 0; /* of the first operand's rows */
  if (k->kind == MF_K_EXPERT_FWD) width = k->i[2];
  if (k->kind == MF_K_EXPERT_BWD_DATA || k->kind == MF_K_EXPERT_BIAS_FWD) width = k->i[1];
  const size_t es = mf_dtype_size(k->b[0].dtype != MF_DTYPE_INVALID ? k->b[0].dtype : MF_DTYPE_F32);
  return width > 0 && es ? (int64_t)(k->b[0].bytes / es) / width : 0;
}

/* ----------------------------------------------------- arenas held */

static _Atomic uint64_t g_arena_bytes, g_arena_peak;

void mf_backend_arena_held(int64_t bytes) {
  const uint64_t now = atomic_fetch_add(&g_arena_bytes, (uint64_t)bytes) + (uint64_t)bytes;
  uint64_t peak = atomic_load(&g_arena_peak);
  while (now > peak && !atomic_compare_exchange_weak(&g_arena_peak, &peak, now)) {
  }
}

uint64_t mf_backend_arena_peak(void) { return atomic_load(&g_arena_peak); }
void mf_backend_arena_peak_reset(void) { atomic_store(&g_arena_peak, atomic_load(&g_arena_bytes)); }

mf_status mf_kernel_slice_check(const char *what, int64_t rows, int64_t C, int64_t xs, int64_t xo, int64_t ys,
                                int64_t yo, int64_t rep) {
  if (rows < 0 || C < 0 || rep < 1 || xo < 0 || yo < 0 || xo + C > xs || yo + C > ys)
    return MF_ERR(MF_ERR_INVALID_ARG,
                  "%s: %lld rows of %lld columns at x offset %lld (row stride %lld), y offset %lld (row stride "
                  "%lld), rep %lld: a block must lie inside its rows",
                  what, (long long)rows, (long long)C, (long long)xo, (long long)xs, (long long)yo, (long long)ys,
                  (long long)rep);
  return MF_OK;
}
