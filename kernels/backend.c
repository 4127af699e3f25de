/* The operand table (kernels/backend.h): per kernel kind its name, its
 * operands b[] with their roles, what its sizes i[] and scalars f[] hold —
 * written here once. The roles the planner reads (mf_kernel_reads/writes), the
 * operand checks of both backends and the names in their messages, and the
 * tests' operand construction all come from it. The meaning of each operand is
 * the cpu twin's (kernels/cpu/cpu_ops.h, same names). */
#include <stdio.h>
#include <string.h>

#include "kernels/backend.h"

/* One entry per kind, its operands on as few lines as fit. */
/* clang-format off */
#define R MF_KOP_READ
#define W MF_KOP_WRITE
#define A MF_KOP_ADD
#define ACC MF_KOP_ACCUMULATE
#define OPT(name, role) {name, role, 1}

static const mf_kernel_info k_info[MF_K_COUNT_] = {
    [MF_K_ZERO] = {"zero", {{"x", W}}},
    [MF_K_EMBED_FWD] = {"embed_fwd", {{"ids", R}, {"table", R}, {"out", W}}, {"T", "V", "H"}},
    [MF_K_EMBED_BWD] = {"embed_bwd", {{"ids", R}, {"dout", R}, {"dtable", A}}, {"T", "V", "H"}},
    [MF_K_RMSNORM_FWD] = {"rmsnorm_fwd", {{"x", R}, {"w", R}, {"y", W}, {"rstd", W}}, {"R", "C"}, {"eps"}},
    [MF_K_RMSNORM_BWD] = {"rmsnorm_bwd",
                          {{"dy", R}, {"x", R}, {"w", R}, {"rstd", R}, {"dx", ACC}, {"dw", A}},
                          {"R", "C", "accumulate"}},
    [MF_K_LINEAR_FWD] = {"linear_fwd",
                         {{"x", R}, {"W", R}, OPT("bias", R), {"y", ACC}},
                         {"M", "N", "K", "accumulate"}},
    [MF_K_LINEAR_BWD_DATA] = {"linear_bwd_data",
                              {{"dy", R}, {"W", R}, {"dx", ACC}},
                              {"M", "N", "K", "accumulate"}},
    [MF_K_LINEAR_BWD_WEIGHT] = {"linear_bwd_weight",
                                {{"dy", R}, {"x", R}, {"dW", A}, OPT("db", A)},
                                {"M", "N", "K"}},
    /* in place: x (dx) is read and overwritten */
    [MF_K_ROPE_FWD] = {"rope_fwd", {{"x", A}, {"pos", R}}, {"T", "nh", "D"}, {"theta"}},
    [MF_K_ROPE_BWD] = {"rope_bwd", {{"dx", A}, {"pos", R}}, {"T", "nh", "D"}, {"theta"}},
    [MF_K_ATTN_FWD] = {"attn_fwd",
                       {{"q", R}, {"k", R}, {"v", R}, {"o", W}, {"lse", W}},
                       {"B", "S", "Hq", "Hkv", "D"},
                       {"scale"}},
    [MF_K_ATTN_BWD] = {"attn_bwd",
                       {{"q", R}, {"k", R}, {"v", R}, {"o", R}, {"dout", R}, {"lse", R}, {"dq", W}, {"dk", W},
                        {"dv", W}},
                       {"B", "S", "Hq", "Hkv", "D"},
                       {"scale"}},
    [MF_K_SWIGLU_FWD] = {"swiglu_fwd", {{"g", R}, {"u", R}, {"act", W}}, {"n"}},
    [MF_K_SWIGLU_BWD] = {"swiglu_bwd", {{"g", R}, {"u", R}, {"dact", R}, {"dg", W}, {"du", W}}, {"n"}},
    [MF_K_SIGGATE_FWD] = {"sigmoid_gate_fwd", {{"gl", R}, {"x", R}, {"y", A}}, {"R", "C"}},
    [MF_K_SIGGATE_BWD] = {"sigmoid_gate_bwd",
                          {{"gl", R}, {"x", R}, {"dy", R}, {"dx", W}, {"dgl", W}},
                          {"R", "C"}},
    /* fp32 = 1 for gradient sums, which are never rounded to bf16 */
    [MF_K_ADD] = {"add", {{"x", R}, {"y", A}}, {"n", "fp32"}},
    [MF_K_ROUTER_FWD] = {"router_fwd",
                         {{"logits", R}, {"probs", W}, {"topk_idx", W}, {"topk_w", W}},
                         {"T", "E", "K", "norm_topk"}},
    [MF_K_ROUTER_BWD] = {"router_bwd",
                         {{"probs", R}, {"topk_idx", R}, {"topk_w", R}, {"dtopk_w", R},
                          OPT("dprobs_extra", R), {"dlogits", W}},
                         {"T", "E", "K", "norm_topk"}},
    /* counts and offsets are int64, the row maps int32 */
    [MF_K_MOE_DISPATCH] = {"moe_dispatch",
                           {{"topk_idx", R}, {"counts", W}, {"offsets", W}, {"row_of", W},
                            {"token_of_row", W}},
                           {"T", "K", "E"}},
    [MF_K_MOE_GATHER] = {"moe_gather", {{"x", R}, {"token_of_row", R}, {"xe", W}}, {"R", "H"}},
    [MF_K_MOE_GATHER_BWD] = {"moe_gather_bwd",
                             {{"dxe", R}, {"row_of", R}, {"dx", ACC}},
                             {"T", "K", "H", "accumulate"}},
    [MF_K_MOE_COMBINE] = {"moe_combine", {{"ye", R}, {"w", R}, {"row_of", R}, {"y", A}}, {"T", "K", "H"}},
    [MF_K_MOE_COMBINE_BWD] = {"moe_combine_bwd",
                              {{"dy", R}, {"ye", R}, {"w", R}, {"row_of", R}, {"dye", W}, {"dw", W}},
                              {"T", "K", "H"}},
    /* The expert weights: E pointers of expert_bytes each, NULL for an expert
     * without rows; the rows R come from the first operand's bytes
     * (mf_kernel_expert_rows). */
    [MF_K_EXPERT_FWD] = {"expert_fwd",
                         {{"xe", R}, {"offsets", R}, {"ye", W}},
                         {"E", "N", "Kd"},
                         {0},
                         {"W", R}},
    [MF_K_EXPERT_BWD_DATA] = {"expert_bwd_data",
                              {{"dye", R}, {"offsets", R}, {"dxe", W}},
                              {"E", "N", "Kd"},
                              {0},
                              {"W", R}},
    [MF_K_EXPERT_BWD_WEIGHT] = {"expert_bwd_weight",
                                {{"dye", R}, {"xe", R}, {"offsets", R}},
                                {"E", "N", "Kd"},
                                {0},
                                {"dW", A}},
    /* ws and lse are workspace; scalars: 2 doubles {loss_sum, n_valid}; dh
     * and dW present for the backward */
    [MF_K_CROSS_ENTROPY] = {"cross_entropy",
                            {{"h", R}, {"W", R}, {"target", R}, {"ws", W}, {"lse", W}, {"scalars", W},
                             OPT("dh", W), OPT("dW", A)},
                            {"T", "V", "H", "chunk"},
                            {"loss_scale"}},
    /* counts int64, psum double; aux (AUX_VALUE) one double */
    [MF_K_AUX_ACCUMULATE] = {"aux_accumulate",
                             {{"probs", R}, {"topk_idx", R}, {"counts", A}, {"psum", A}},
                             {"T", "E", "K"}},
    [MF_K_AUX_VALUE] = {"aux_value", {{"counts", R}, {"psum", R}, {"aux", W}}, {"E", "n_rows"}},
    [MF_K_AUX_GRAD] = {"aux_grad", {{"counts", R}, {"dprobs", W}}, {"E", "n_rows", "T"}, {"coef"}},
    /* g fp32, sums double: chunk sums written from sums[first] on */
    [MF_K_GRAD_SUMSQ] = {"grad_sumsq", {{"g", R}, {"sums", W}}, {"n", "first"}},
    /* param and grad fp32 (grad scaled in place), state m then v */
    [MF_K_ADAMW] = {"adamw",
                    {{"param", A}, {"grad", A}, {"state", A}},
                    {"n", "t", "moment_bf16"},
                    {"lr", "beta1", "beta2", "eps", "weight_decay", "coef"}},
};

/* clang-format on */
#undef R
#undef W
#undef A
#undef ACC
#undef OPT

const mf_kernel_info *mf_kernel_info_of(mf_kernel k) {
  return (int)k >= 0 && k < MF_K_COUNT_ ? &k_info[k] : NULL;
}

const char *mf_kernel_name(mf_kernel k) {
  const mf_kernel_info *t = mf_kernel_info_of(k);
  return t ? t->name : "unknown";
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
  return MF_OK;
}

int64_t mf_kernel_expert_rows(const mf_kernel_call *k) {
  const int64_t width = k->kind == MF_K_EXPERT_FWD ? k->i[2] : k->kind == MF_K_EXPERT_BWD_DATA ? k->i[1] : 0;
  return width > 0 ? (int64_t)(k->b[0].bytes / sizeof(float)) / width : 0;
}
