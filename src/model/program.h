/*
 * The step program: one optimizer step of a model (forward, loss and backward of
 * every micro-batch) as an ordered list of kernel calls over named tensors —
 * the seam between the model, the planner and the executor.
 *
 * Tensors carry an HF-style name ("mb0.model.layers.3.self_attn.q",
 * "model.layers.3.mlp.experts.17.down_proj.weight"), a kind, a dtype and a byte
 * size; ops name their operands by tensor id, in the operand order of
 * kernels/backend.h. A layer's routed-expert activations are one tensor of
 * T*K rows laid out by the dispatch permutation, so no size depends on routing.
 *
 * The program is built for a batch shape (B sequences of S tokens per
 * micro-batch, G micro-batches per step). Where each tensor lives and when is
 * the planner's business (planner/schedule.h).
 *
 * Order. Micro-batch-major (the default): micro-batch 0's forward, loss and
 * backward, then micro-batch 1's, ... Layer-major: the embedding's forward for
 * micro-batches 0..G-1, then layer 0's forward for 0..G-1, layer 1's, ...;
 * then the loss part (final norm, aux loss, cross-entropy) of each micro-batch;
 * then the final norm's backward for 0..G-1; then each layer's backward, last
 * layer first, for 0..G-1; then the embedding's backward for 0..G-1. A layer's
 * weights are used by one stretch of ops per direction (loaded once per step
 * when streamed), and every micro-batch's activations are held at once. Inside
 * one micro-batch's stage the ops keep their micro-batch-major order, and each
 * parameter's gradient is still summed over micro-batches in ascending order,
 * so both orders give the same bits — except with tied embeddings, where the
 * shared matrix's gradient of micro-batch m arrives in two parts (the head's
 * in the loss part, the embedding's at the end) and is added up in another
 * grouping.
 *
 * Storage. The device dtype of weights, activations and activation gradients:
 * F32 (what the cpu backend runs) or BF16 (the cuda backend's; such a program
 * is for planning and for that backend). Gradient sums stay fp32; statistics,
 * workspaces and inputs keep their own dtypes.
 *
 * Loss. Micro-batch m's loss is CE_m (mean over its counted tokens) +
 * coef * aux_m (transformers' load-balancing loss, pooled over its MoE layers); the step's loss
 * and gradient are the mean over the G micro-batches. The cross-entropy op's
 * loss scale depends on the batch (1 / (G * counted tokens)): the executor sets
 * it (MF_PROGRAM_LOSS_SCALE_RUNTIME).
 */
#ifndef MF_MODEL_PROGRAM_H
#define MF_MODEL_PROGRAM_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/backend.h"
#include "src/core/core.h"
#include "src/model/params.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mf_tensor_kind {
  MF_T_PARAM = 0, /* a parameter's device copy (working dtype) */
  MF_T_GRAD,      /* a parameter's gradient (fp32, accumulated over micro-batches) */
  MF_T_INPUT,     /* token ids, targets, positions of a micro-batch (int32) */
  MF_T_ACT,       /* an activation */
  MF_T_ACT_GRAD,  /* the gradient of an activation */
  MF_T_STAT,      /* per-row statistics and routing state (rstd, lse, probs, indices) */
  MF_T_WORK,      /* workspace and scalar outputs */
  MF_T_OPT,       /* a parameter's AdamW state on the device: m then v (the moments' dtype); with BF16
                     storage an fp32 master copy first (counted for planning; the cuda backend's) */
  MF_T_KIND_COUNT_
} mf_tensor_kind;

const char *mf_tensor_kind_name(mf_tensor_kind k);

typedef struct mf_ptensor {
  char name[112];
  mf_tensor_kind kind;
  mf_dtype dtype;
  int64_t numel;
  size_t bytes;
  int32_t param; /* parameter index for PARAM and GRAD, else -1 */
  int32_t micro; /* micro-batch, -1 for tensors of the whole step */
  int32_t layer; /* -1 when none */
  int32_t first_op, last_op; /* lifetime: the ops that first and last touch it */
} mf_ptensor;

/* NORM and OPTIM end a training step: per parameter, its gradient's norm
 * chunk sums (GRAD_SUMSQ into the program's norm_sums) and its AdamW update
 * (ADAMW over the weight, the gradient and the state tensor). They are the
 * optimizer *on the device*: the planner runs them for the parameters whose
 * optimizer it places there and skips them for the others, which the host
 * updates. The executor runs the NORM ops with the step and the OPTIM ops
 * once the host has combined the global norm (src/exec/exec.h). */
typedef enum mf_phase {
  MF_PHASE_SETUP = 0,
  MF_PHASE_FWD,
  MF_PHASE_LOSS,
  MF_PHASE_BWD,
  MF_PHASE_NORM,
  MF_PHASE_OPTIM
} mf_phase;

#define MF_PROGRAM_LOSS_SCALE_RUNTIME (-1.0)
/* MF_K_DROPOUT's seed (i[2]): the executor's, per micro-batch (mf_exec_set_dropout_seeds). */
#define MF_PROGRAM_SEED_RUNTIME (-1)

typedef struct mf_pop {
  mf_kernel kind;
  mf_phase phase;
  int32_t micro, layer;
  int32_t t[MF_KBUF_MAX]; /* operand tensor ids, -1 when absent */
  /* Operand roles, set once when the program is built from the kernel's kind
   * and sizes (kernels/backend.h mf_kernel_reads, mf_kernel_writes): bit k of
   * reads / writes says the op reads / writes t[k] (an operand added into is
   * both); writes_experts, that an EXPERT_* op adds into its E expert operands
   * (mf_kernel_writes_experts) rather than only reading them. The planner's
   * slots and recompute chains and the order between streams follow these. */
  uint32_t reads, writes;
  uint8_t writes_experts;
  int32_t experts_at; /* EXPERT_*: index into the program's id pool of E tensor ids (an id -1: a cold
                         expert's LoRA adapter, train.lora.experts hot: none, its rows get zeros), else -1 */
  int64_t i[8];
  double f[6];
  double flops;
  char label[64];
} mf_pop;

/* The tensors the executor fills or reads for each micro-batch. */
typedef struct mf_program_io {
  int32_t ids, targets, positions; /* INPUT tensors: [B*S] int32 */
  int32_t ce_scalars;              /* 2 doubles: loss sum, counted tokens */
  int32_t aux_scalars;             /* 1 double: the aux loss (0 without MoE layers) */
  int32_t ce_op;                   /* the CROSS_ENTROPY op */
  int32_t final_hidden;            /* the final norm's output [B*S, H] (for logits) */
} mf_program_io;

typedef enum mf_program_order { MF_ORDER_MICRO_MAJOR = 0, MF_ORDER_LAYER_MAJOR } mf_program_order;

/* "micro-batch-major", "layer-major". */
const char *mf_program_order_name(mf_program_order o);

typedef struct mf_program {
  const mf_param_table *params;
  mf_model_spec spec;
  int64_t B, S, G;
  double aux_coef;
  int64_t ranks;      /* data-parallel ranks (mf_program_opts.ranks; >= 1) */
  int64_t node_ranks; /* of them on one node (>= 1) */
  int64_t ep, ep_rank; /* expert parallelism (mf_program_opts.ep; 1: none) and this rank's place in it */
  int exchanges;       /* the MoE layers exchange rows between ranks: ep > 1, or ep_self */
  int64_t ep_group;    /* mf_program_opts.ep_group (0 without expert parallelism) */
  /* [params->n] 1 for a gradient that starts from the host's sum instead of
   * zero (the schedule fills its first slot from home: mf_program_opts.ep_group
   * > 0), its copies home overwriting that sum; NULL: none */
  uint8_t *grad_seed;
  mf_ptensor *tensors;
  int32_t n_tensors;
  mf_pop *ops;
  int32_t n_ops;
  int32_t *id_pool;
  int64_t n_pool;
  mf_program_io *io;       /* [G] */
  int32_t *param_tensor;   /* [params->n] */
  int32_t *grad_tensor;    /* [params->n]; -1 in a forward-only program and for a frozen parameter */
  double flops;            /* all ops of the step */
  int64_t ce_chunk;
  int forward_only;
  mf_program_order order;
  mf_dtype storage;        /* F32 or BF16: PARAM, ACT and ACT_GRAD tensors are stored in it */
  /* The optimizer on the device (training programs; -1 / NULL forward-only). */
  mf_dtype moments;        /* F32 or BF16: the dtype of m and v in the OPT tensors */
  int32_t *state_tensor;   /* [params->n] the OPT tensor of each parameter (-1: frozen) */
  int32_t *sumsq_op;       /* [params->n] its GRAD_SUMSQ op (-1: frozen) */
  int32_t *adamw_op;       /* [params->n] its ADAMW op (-1: frozen) */
  int64_t *norm_first;     /* [params->n] its first chunk in norm_sums (a frozen one has none) */
  int32_t norm_sums;       /* WORK tensor: every parameter's norm chunk sums (f64), in parameter order */
  int64_t norm_chunks;     /* its length */
  /* Each tensor's uses, in op order, one entry per op that has it as an
   * operand (t[] or its expert ids): ops use_ops[use_start[t] ..
   * use_start[t + 1]) (the planner walks them for every plan it weighs). */
  int32_t *use_start; /* [n_tensors + 1] */
  int32_t *use_ops;
} mf_program;

typedef struct mf_program_opts {
  int64_t micro_batch; /* B */
  int64_t seq_len;     /* S */
  int64_t grad_accum;  /* G */
  double aux_coef;     /* the load-balancing loss weight */
  int64_t ce_chunk;    /* vocabulary rows per cross-entropy chunk (0: a default) */
  int forward_only;    /* evaluation: forward and loss only, no gradients */
  mf_program_order order; /* default (0): micro-batch-major */
  mf_dtype storage;    /* device storage: F32 or BF16; MF_DTYPE_INVALID (0, left out): F32 */
  mf_dtype moments;    /* AdamW moments (train.adam_moments): F32 or BF16; 0: F32 */
  /* Data-parallel ranks whose micro-batches make one step (0 or 1: one): the
   * loss is the mean over grad_accum x ranks micro-batches, so each rank's
   * gradients and losses are its share of the step's, summed over the ranks.
   * With more than one, the optimizer runs on the host (the ranks' gradients
   * are reduced at home): the planner puts none on the device. */
  int64_t ranks;
  /* Of them, the ranks on one machine, which share one host home (0: all). */
  int64_t node_ranks;
  /* Expert parallelism (0 or 1: none): `ep` ranks, this one ep_rank of them
   * (0 .. ep - 1), each owning E / ep routed experts of every MoE layer:
   * experts [ep_rank E / ep, (ep_rank + 1) E / ep) (mf_program_owns_expert).
   * The program holds only this rank's experts' weights and gradients; its
   * micro-batches' expert rows travel to their owners and back through
   * EP_DISPATCH and EP_COMBINE (kernels/backend.h) after the gather and
   * before the combine (the backward likewise), and this rank's experts run
   * over the rows every rank sent them: ep x T x K rows at most, the size of
   * their activations. Each ep rank trains its own micro-batches (ranks counts
   * them all). An expert's weight gradient adds the rows of each source rank
   * as one micro-batch's (kernels/cpu/cpu_ops.h mf_cpu_expert_bwd_weight_parts),
   * so ep ranks of one micro-batch each give one rank's bits over ep
   * micro-batches (gpt-oss's expert biases likewise; the experts' LoRA
   * adapters too, their dropout masking each received row as its source
   * does: DROPOUT's parts). Needs E divisible by ep. */
  int64_t ep, ep_rank;
  /* Tests (MF_TEST_EP_SELF): with ep 1, the exchanges all the same, one rank
   * with itself — expert parallelism's code path on one rank (one GPU), which
   * gives the bits of the program without it. */
  int ep_self;
  /* Expert parallelism beside data parallelism (ranks = groups x ep): this
   * rank's group, 0 .. ranks / ep - 1, each group ep ranks exchanging rows
   * among themselves over its own micro-batches. The gradients summed by
   * source rank's parts (the experts' weights and adapters, gpt-oss's expert
   * biases) must add group after group, as one rank adds its micro-batches:
   * in a group after the first, each starts from the host's sum of the
   * groups before (grad_seed) instead of zero. 0: the first group, or none. */
  int64_t ep_group;
} mf_program_opts;

/* Whether this program's rank owns routed expert e (always without expert
 * parallelism). */
int mf_program_owns_expert(const mf_program *p, int64_t e);
/* Whether the program holds parameter i (its weights and, when trained, its
 * gradient): all of them but another expert-parallel rank's experts. */
int mf_program_holds_param(const mf_program *p, int64_t i);

mf_status mf_program_build(const mf_param_table *params, const mf_program_opts *opts, mf_program **out);
/* The micro-batches the step's mean loss is over: G x ranks (a double, as the
 * loss scales divide by it). */
double mf_program_loss_divisor(const mf_program *p);
void mf_program_free(mf_program *p); /* NULL is fine */

/* A one-line summary per op and tensor (for debugging). */
void mf_program_dump(const mf_program *p, FILE *f);

#ifdef __cplusplus
}
#endif

#endif /* MF_MODEL_PROGRAM_H */
