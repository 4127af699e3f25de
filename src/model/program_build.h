/*
 * The step program's builder, shared by its files (not part of the API):
 * program.c builds a micro-batch's ops from the blocks and finishes the
 * program (lifetimes, uses, order); program_ops.c makes tensors and ops and
 * the ops every block uses; the blocks are program_attention.c,
 * program_moe.c (routed and shared experts) and program_dense.c (the dense
 * MLP); program_lora.c adds the LoRA adapters' ops beside a weight's.
 */
#ifndef MF_MODEL_PROGRAM_BUILD_H
#define MF_MODEL_PROGRAM_BUILD_H

#include "src/model/program.h"

/* ------------------------------------------------------------- building */

typedef struct pb {
  mf_program *p;
  int32_t cap_t, cap_o;
  int64_t cap_pool;
  int32_t stage;     /* the stage of the ops being built (see STAGE_*) */
  int32_t *stage_of; /* [cap_o] each op's stage, for the layer-major reorder */
  /* DEQUANT ops made for the op being built (dequant()): they take its phase
   * when it is made (op()). */
  int32_t *pending;
  int32_t n_pending, cap_pending;
  mf_status st;
} pb;

/* A micro-batch's ops fall into stages, in build order: the embedding's
 * forward, each layer's forward, the loss part, the final norm's backward, each
 * layer's backward (last layer first), the embedding's backward. Layer-major
 * order runs each stage for every micro-batch before the next stage. The
 * final norm's backward is a stage of its own so that the loss part (the
 * lm_head's one use) runs for all micro-batches in one stretch. */
#define STAGE_SETUP (-1)
#define STAGE_EMBED 0
#define STAGE_FWD(l) (1 + (l))
#define STAGE_LOSS(L) ((L) + 1)
#define STAGE_NORM_BWD(L) ((L) + 2)
#define STAGE_BWD(L, l) ((L) + 3 + ((L)-1 - (l)))
#define STAGE_EMBED_BWD(L) (2 * (L) + 3)
/* Operand shorthands. */
#define SET(o, ...)                                                                     \
  do {                                                                                  \
    const int32_t ids_[] = {__VA_ARGS__};                                               \
    for (size_t j_ = 0; j_ < sizeof ids_ / sizeof ids_[0]; j_++) (o)->t[j_] = ids_[j_]; \
  } while (0)
#define INTS(o, ...)                                                              \
  do {                                                                            \
    const int64_t v_[] = {__VA_ARGS__};                                           \
    for (size_t j_ = 0; j_ < sizeof v_ / sizeof v_[0]; j_++) (o)->i[j_] = v_[j_]; \
  } while (0)

typedef struct ctx {
  pb *b;
  const mf_param_table *pt;
  const mf_model_spec *s;
  int32_t m;
  int64_t T;
} ctx;

/* Names of per-micro-batch tensors: "mb0.model.layers.3.self_attn.q". */
#define LNAME "mb%d.model.layers.%d."

/* A layer's forward activations, kept for its backward. */
typedef struct layer_acts {
  int32_t xn1, rstd1, q, k, v, qn, kn, qr, kr, qa, ka, att, lse, hmid, xn2, rstd2;
  int32_t rl, probs, tki, tkw, counts, offsets, row_of, tor, xe, eg, eu, ea, ey;
  /* Expert parallelism (mf_program_opts.ep): the micro-batch's own expert-sorted offsets (loffs; the
   * expert ops' offsets and xe are the received rows'), the received rows' parts by source (segs; -1
   * without) */
  int32_t loffs, segs;
  /* ... and with adapter dropout on the experts, each part's first row in its source's layout and each
   * source's dropout seed (the masks follow the source's rows; -1 without) */
  int32_t starts, seeds;
  int32_t sg, su, sa, sy, sgl, dg, du, da;
  /* DeepSeek-V3's latent attention (program_mla.c): q_a_proj's output, its norm's rstd and output; kv_a's
   * output, the compressed kv, its norm's rstd and output, the rope key, kv_b's output */
  int32_t mqa, mqr, mqn, mkva, mc, mcr, mcn, mkr, mkvb;
  int32_t lora[MF_P_ROLE_COUNT_];    /* the LoRA adapter's scaled x A^T of each adapted weight of the layer */
  int32_t lora_in[MF_P_ROLE_COUNT_]; /* with dropout: the adapter's input after it */
} layer_acts;

/* One micro-batch's build: its sizes, the residual stream and each layer's
 * activations, the aux-loss statistics. */
typedef struct mb {
  pb *b;
  const ctx *c;
  const mf_model_spec *s;
  int32_t m, pos;
  int64_t B, S, T, H, D, Hq, Hkv, E, TK, I, V;
  float scale;
  int64_t rot; /* the dims of each head RoPE rotates; 0: all (partial RoPE: GLM-4.5) */
  int64_t Dv;  /* the dims of a value head (DeepSeek-V3's v_head_dim; else D) */
  int32_t aux_counts, aux_psum;
  int64_t aux_rows;
  int32_t *resid;         /* [L + 1] the residual stream into each layer, and out of the last */
  layer_acts *A;          /* [L] */
  int32_t hf, rstdf, dhf; /* the final norm's output, its rstd, the output's gradient */
} mb;

/* ---------------------------------------------- tensors, ops (program_ops.c) */

int32_t mf_pb_tensor(pb *b, mf_tensor_kind kind, mf_dtype dtype, int64_t numel, int32_t micro, int32_t layer,
                     const char *fmt, ...) __attribute__((format(printf, 7, 8)));
/* Tensor t stays fp32 whatever the storage: the gradient of an fp32
 * statistic (the router's probabilities). */
int32_t mf_pb_keep_fp32(pb *b, int32_t t);
mf_pop *mf_pb_op(pb *b, mf_kernel kind, mf_phase phase, int32_t micro, int32_t layer, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
int32_t mf_pb_pool_put(pb *b, const int32_t *ids, int64_t n);
/* Parameter i's weights as an op reads them: its tensor, or for a weight
 * stored quantized (LoRA's base, mf_param_table_quantize_base) a DEQUANT of
 * its blob made just before the op being built, into an activation of the
 * storage dtype that lives until that op has read it (each use its own, so
 * no bf16 copy of the weight outlives an op; a recomputed op recomputes its
 * DEQUANT from the blob). */
int32_t mf_pb_weight_of(const ctx *c, int32_t i);
int32_t mf_pb_P(const ctx *c, mf_param_role role, int64_t layer);
int32_t mf_pb_G(const ctx *c, mf_param_role role, int64_t layer);
/* The id pool entry of layer `layer`'s routed experts' weights of `role`
 * (lora -1), or of their LoRA adapters' A (lora 0) or B (lora 1): their
 * parameter tensors, or with grads their gradients. */
int32_t mf_pb_experts_of(const ctx *c, mf_param_role role, int64_t layer, int grads, int lora);
/* Layer l's routed experts' weights of `role` are frozen (LoRA's base). */
int mf_pb_experts_frozen(const ctx *c, mf_param_role role, int64_t layer);
void mf_pb_linear_fwd(const ctx *c, int32_t l, const char *what, int32_t x, int32_t W, int32_t bias,
                      int32_t y, int64_t N, int64_t K, int acc);
/* dW (+ db) and dx for y = x W^T (+ b): weight gradient first, then data. */
void mf_pb_linear_bwd(const ctx *c, int32_t l, const char *what, int32_t dy, int32_t x, int32_t W, int32_t dW,
                      int32_t db, int32_t dx, int64_t N, int64_t K, int acc);
void mf_pb_rmsnorm_fwd(const ctx *c, int32_t l, const char *what, int32_t x, int32_t w, int32_t y,
                       int32_t rstd, int64_t R, int64_t C);
/* The same with its own epsilon (DeepSeek-V3's latent norms: 1e-6 whatever rms_norm_eps). */
void mf_pb_rmsnorm_fwd_eps(const ctx *c, int32_t l, const char *what, int32_t x, int32_t w, int32_t y,
                           int32_t rstd, int64_t R, int64_t C, double eps);
void mf_pb_rmsnorm_bwd(const ctx *c, int32_t l, const char *what, int32_t dy, int32_t x, int32_t w,
                       int32_t rstd, int32_t dx, int32_t dw, int64_t R, int64_t C, int acc);
void mf_pb_simple(const ctx *c, mf_kernel k, mf_phase ph, int32_t l, const char *what, int32_t a, int32_t bb,
                  int32_t cc, int32_t d, int32_t e, int64_t n);
/* RoPE (fwd or bwd kind) in place on x [T, nh, D]: dims [off, off + rot) of each head (rot 0: the rest of
 * the head), in adjacent pairs with the spec's rope_interleave, YaRN's frequencies with its rope_scaling. */
void mf_pb_rope(const mb *z, int32_t l, mf_kernel kind, const char *what, int32_t x, int64_t nh, int64_t D,
                int64_t rot, int64_t off);
/* An EXPERT_* op of layer l over its expert rows (operands a0, a1, a2; N, K; the id pool entry of its
 * experts); a weight gradient, when the program exchanges rows between ranks, adds each source rank's
 * part on its own (the layer's parts, EXPERT_BWD_WEIGHT's segments). */
void mf_pb_expert_op(const mb *z, mf_kernel k, mf_phase ph, int32_t l, const char *what, int32_t a0,
                     int32_t a1, int32_t a2, int64_t N, int64_t K, int32_t experts_at);

/* ----------------------------------------------------- LoRA (program_lora.c) */

/* Weight `role` of layer l, y (+)= x W^T [T, N] done: its adapter's part added. */
void mf_pb_lora_fwd(const mb *z, int32_t l, mf_param_role role, const char *what, int32_t x, int32_t y,
                    int64_t N, int64_t K);
/* Its backward, after the base's (which wrote or added dx [T, K]). */
void mf_pb_lora_bwd(const mb *z, int32_t l, mf_param_role role, const char *what, int32_t dy, int32_t x,
                    int32_t dx, int64_t N, int64_t K);
/* The routed experts' projection `role` (xe [R, K] -> y [R, N]) done: the
 * adapters' part added, over the same permutation. */
void mf_pb_lora_experts_fwd(const mb *z, int32_t l, mf_param_role role, const char *what, int32_t x,
                            int32_t y, int64_t N, int64_t K);
/* Whether layer l's experts have adapters with dropout (in a training program). */
int mf_pb_lora_experts_drop(const mb *z, int32_t l);
/* Its backward, after the base's data gradient (dx [R, K] written). */
void mf_pb_lora_experts_bwd(const mb *z, int32_t l, mf_param_role role, const char *what, int32_t dy,
                            int32_t x, int32_t dx, int64_t N, int64_t K);

/* --------------------------------------------------------------- the blocks */

/* Layer l's attention block and its norms; the layer's output zeroed for the MLP to add into. */
void mf_pb_attention_fwd(const mb *z, int32_t l);
/* Layer l's attention block backward, from the post-attention norm down to the
 * input norm: the residual gradient gres updated. */
void mf_pb_attention_bwd(const mb *z, int32_t l, int32_t gres, int32_t dxn2);
/* DeepSeek-V3's multi-head latent attention (program_mla.c): from the input
 * norm's output a->xn1 to the attention's output a->att [T, Hq * Dv]; and
 * back from its gradient datt into dxn1. */
void mf_pb_mla_fwd(const mb *z, int32_t l);
void mf_pb_mla_bwd(const mb *z, int32_t l, int32_t datt, int32_t dxn1);
/* Layer l's routed experts (and shared expert), added into the layer's output. */
void mf_pb_moe_fwd(const mb *z, int32_t l);
/* Layer l's routed experts (and shared expert) backward: into dxn2, the
 * gradient of the post-attention norm's output. */
void mf_pb_moe_bwd(const mb *z, int32_t l, int32_t gres, int32_t dxn2);
/* Layer l's dense MLP, written into the layer's output. */
void mf_pb_dense_fwd(const mb *z, int32_t l);
void mf_pb_dense_bwd(const mb *z, int32_t l, int32_t gres, int32_t dxn2);

#endif /* MF_MODEL_PROGRAM_BUILD_H */
