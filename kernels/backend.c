/* Kernel names and operand roles, shared by every backend and the planner. */
#include "kernels/backend.h"

static const char *const k_kernel_names[MF_K_COUNT_] = {
    [MF_K_ZERO] = "zero",
    [MF_K_EMBED_FWD] = "embed_fwd",
    [MF_K_EMBED_BWD] = "embed_bwd",
    [MF_K_RMSNORM_FWD] = "rmsnorm_fwd",
    [MF_K_RMSNORM_BWD] = "rmsnorm_bwd",
    [MF_K_LINEAR_FWD] = "linear_fwd",
    [MF_K_LINEAR_BWD_DATA] = "linear_bwd_data",
    [MF_K_LINEAR_BWD_WEIGHT] = "linear_bwd_weight",
    [MF_K_ROPE_FWD] = "rope_fwd",
    [MF_K_ROPE_BWD] = "rope_bwd",
    [MF_K_ATTN_FWD] = "attn_fwd",
    [MF_K_ATTN_BWD] = "attn_bwd",
    [MF_K_SWIGLU_FWD] = "swiglu_fwd",
    [MF_K_SWIGLU_BWD] = "swiglu_bwd",
    [MF_K_SIGGATE_FWD] = "sigmoid_gate_fwd",
    [MF_K_SIGGATE_BWD] = "sigmoid_gate_bwd",
    [MF_K_ADD] = "add",
    [MF_K_ROUTER_FWD] = "router_fwd",
    [MF_K_ROUTER_BWD] = "router_bwd",
    [MF_K_MOE_DISPATCH] = "moe_dispatch",
    [MF_K_MOE_GATHER] = "moe_gather",
    [MF_K_MOE_GATHER_BWD] = "moe_gather_bwd",
    [MF_K_MOE_COMBINE] = "moe_combine",
    [MF_K_MOE_COMBINE_BWD] = "moe_combine_bwd",
    [MF_K_EXPERT_FWD] = "expert_fwd",
    [MF_K_EXPERT_BWD_DATA] = "expert_bwd_data",
    [MF_K_EXPERT_BWD_WEIGHT] = "expert_bwd_weight",
    [MF_K_CROSS_ENTROPY] = "cross_entropy",
    [MF_K_AUX_ACCUMULATE] = "aux_accumulate",
    [MF_K_AUX_VALUE] = "aux_value",
    [MF_K_AUX_GRAD] = "aux_grad",
    [MF_K_GRAD_SUMSQ] = "grad_sumsq",
    [MF_K_ADAMW] = "adamw",
};

const char *mf_kernel_name(mf_kernel k) {
  return ((int)k >= 0 && k < MF_K_COUNT_ && k_kernel_names[k]) ? k_kernel_names[k] : "unknown";
}

/* Operand roles per kernel: W = written, A = added (read and written), R = read.
 * Indexed by operand slot; '.' marks an unused slot. Conditional operands
 * (accumulate flags) are decided in mf_kernel_writes/reads. */
static const char *const k_roles[MF_K_COUNT_] = {
    [MF_K_ZERO] = "W",
    [MF_K_EMBED_FWD] = "RRW",
    [MF_K_EMBED_BWD] = "RRA",
    [MF_K_RMSNORM_FWD] = "RRWW",
    [MF_K_RMSNORM_BWD] = "RRRRwA",   /* dx: added when accumulate */
    [MF_K_LINEAR_FWD] = "RRRw",      /* y: added when accumulate */
    [MF_K_LINEAR_BWD_DATA] = "RRw",
    [MF_K_LINEAR_BWD_WEIGHT] = "RRAA",
    [MF_K_ROPE_FWD] = "AR",
    [MF_K_ROPE_BWD] = "AR",
    [MF_K_ATTN_FWD] = "RRRWW",
    [MF_K_ATTN_BWD] = "RRRRRRWWW",
    [MF_K_SWIGLU_FWD] = "RRW",
    [MF_K_SWIGLU_BWD] = "RRRWW",
    [MF_K_SIGGATE_FWD] = "RRA",
    [MF_K_SIGGATE_BWD] = "RRRWW",
    [MF_K_ADD] = "RA",
    [MF_K_ROUTER_FWD] = "RWWW",
    [MF_K_ROUTER_BWD] = "RRRRRW",
    [MF_K_MOE_DISPATCH] = "RWWWW",
    [MF_K_MOE_GATHER] = "RRW",
    [MF_K_MOE_GATHER_BWD] = "RRw",   /* dx: added when accumulate */
    [MF_K_MOE_COMBINE] = "RRRA",
    [MF_K_MOE_COMBINE_BWD] = "RRRRWW",
    [MF_K_EXPERT_FWD] = "RRW",
    [MF_K_EXPERT_BWD_DATA] = "RRW",
    [MF_K_EXPERT_BWD_WEIGHT] = "RRR",
    [MF_K_CROSS_ENTROPY] = "RRRWWWWA",
    [MF_K_AUX_ACCUMULATE] = "RRAA",
    [MF_K_AUX_VALUE] = "RRW",
    [MF_K_AUX_GRAD] = "RW",
    [MF_K_GRAD_SUMSQ] = "RW",
    [MF_K_ADAMW] = "AAA",
};

/* The accumulate flag of kinds with a conditional ('w') operand. */
static int accumulates(const mf_kernel_call *k) {
  switch (k->kind) {
    case MF_K_RMSNORM_BWD:
      return k->i[2] != 0;
    case MF_K_LINEAR_FWD:
    case MF_K_LINEAR_BWD_DATA:
      return k->i[3] != 0;
    case MF_K_MOE_GATHER_BWD:
      return k->i[3] != 0;
    default:
      return 0;
  }
}

uint32_t mf_kernel_writes(const mf_kernel_call *k) {
  if ((int)k->kind < 0 || k->kind >= MF_K_COUNT_) return 0;
  uint32_t m = 0;
  for (int i = 0; k_roles[k->kind][i]; i++) {
    char c = k_roles[k->kind][i];
    if (c == 'W' || c == 'A' || c == 'w') m |= 1u << i;
  }
  return m;
}

uint32_t mf_kernel_reads(const mf_kernel_call *k) {
  if ((int)k->kind < 0 || k->kind >= MF_K_COUNT_) return 0;
  uint32_t m = 0;
  for (int i = 0; k_roles[k->kind][i]; i++) {
    char c = k_roles[k->kind][i];
    if (c == 'R' || c == 'A' || (c == 'w' && accumulates(k))) m |= 1u << i;
  }
  return m;
}

int mf_kernel_writes_experts(mf_kernel k) { return k == MF_K_EXPERT_BWD_WEIGHT; }

int64_t mf_kernel_expert_rows(const mf_kernel_call *k) {
  const int64_t width = k->kind == MF_K_EXPERT_FWD ? k->i[2] : k->kind == MF_K_EXPERT_BWD_DATA ? k->i[1] : 0;
  return width > 0 ? (int64_t)(k->b[0].bytes / sizeof(float)) / width : 0;
}
