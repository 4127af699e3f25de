/*
 * The step program: one optimizer step of a model (forward, loss and backward of
 * every micro-batch) as an ordered list of kernel calls over named tensors —
 * the seam between the model, the planner and the executor (DESIGN.md).
 *
 * Tensors carry an HF-style name ("mb0.model.layers.3.self_attn.q",
 * "model.layers.3.mlp.experts.17.down_proj.weight"), a kind, a dtype and a byte
 * size; ops name their operands by tensor id, in the operand order of
 * kernels/backend.h. A layer's routed-expert activations are one tensor of
 * T*K rows laid out by the dispatch permutation, so no size depends on routing.
 *
 * The program is built for a batch shape (B sequences of S tokens per
 * micro-batch, G micro-batches per step), in micro-batch-major order. Where
 * each tensor lives and when is the planner's business (planner/schedule.h).
 *
 * Loss. Micro-batch m's loss is CE_m (mean over its counted tokens) +
 * coef * aux_m (MODELS.md §11, pooled over its MoE layers); the step's loss
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

typedef enum mf_phase { MF_PHASE_SETUP = 0, MF_PHASE_FWD, MF_PHASE_LOSS, MF_PHASE_BWD } mf_phase;

#define MF_PROGRAM_LOSS_SCALE_RUNTIME (-1.0)

typedef struct mf_pop {
  mf_kernel kind;
  mf_phase phase;
  int32_t micro, layer;
  int32_t t[MF_KBUF_MAX]; /* operand tensor ids, -1 when absent */
  int32_t experts_at;     /* EXPERT_*: index into the program's id pool of E tensor ids, else -1 */
  int64_t i[8];
  double f[2];
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

typedef struct mf_program {
  const mf_param_table *params;
  mf_model_spec spec;
  int64_t B, S, G;
  double aux_coef;
  mf_ptensor *tensors;
  int32_t n_tensors;
  mf_pop *ops;
  int32_t n_ops;
  int32_t *id_pool;
  int64_t n_pool;
  mf_program_io *io;       /* [G] */
  int32_t *param_tensor;   /* [params->n] */
  int32_t *grad_tensor;    /* [params->n]; -1 in a forward-only program */
  double flops;            /* all ops of the step */
  int64_t ce_chunk;
  int forward_only;
} mf_program;

typedef struct mf_program_opts {
  int64_t micro_batch; /* B */
  int64_t seq_len;     /* S */
  int64_t grad_accum;  /* G */
  double aux_coef;     /* the load-balancing loss weight */
  int64_t ce_chunk;    /* vocabulary rows per cross-entropy chunk (0: a default) */
  int forward_only;    /* evaluation: forward and loss only, no gradients */
} mf_program_opts;

mf_status mf_program_build(const mf_param_table *params, const mf_program_opts *opts, mf_program **out);
void mf_program_free(mf_program *p); /* NULL is fine */

/* A one-line summary per op and tensor (for debugging). */
void mf_program_dump(const mf_program *p, FILE *f);

#ifdef __cplusplus
}
#endif

#endif /* MF_MODEL_PROGRAM_H */
