/*
 * The parameter table: every weight of a model spec with its Hugging Face name
 * (the on-disk, per-expert names of MODELS.md), shape and role, in one fixed
 * order; and the host copy of the weights: one fp32 array, each parameter at
 * its offset.
 */
#ifndef MF_MODEL_PARAMS_H
#define MF_MODEL_PARAMS_H

#include <stdint.h>

#include "src/core/core.h"
#include "src/model/spec.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mf_param_role {
  MF_P_EMBED = 0,       /* model.embed_tokens.weight [V,H] */
  MF_P_ATTN_NORM,       /* input_layernorm [H] */
  MF_P_Q,               /* q_proj [Hq*D, H] */
  MF_P_Q_BIAS,          /* q_proj.bias [Hq*D] (qwen2_moe) */
  MF_P_K,               /* k_proj [Hkv*D, H] */
  MF_P_K_BIAS,
  MF_P_V,               /* v_proj [Hkv*D, H] */
  MF_P_V_BIAS,
  MF_P_O,               /* o_proj [H, Hq*D] */
  MF_P_Q_NORM,          /* q_norm [D] (qwen3) or [Hq*D] (olmoe) */
  MF_P_K_NORM,          /* k_norm [D] or [Hkv*D] */
  MF_P_MLP_NORM,        /* post_attention_layernorm [H] */
  MF_P_ROUTER,          /* gate [E, H] */
  MF_P_EXPERT_GATE,     /* experts.e gate_proj / w1 [I, H] */
  MF_P_EXPERT_UP,       /* experts.e up_proj / w3 [I, H] */
  MF_P_EXPERT_DOWN,     /* experts.e down_proj / w2 [H, I] */
  MF_P_SHARED_GATE,     /* shared_expert.gate_proj [Is, H] (qwen2_moe) */
  MF_P_SHARED_UP,
  MF_P_SHARED_DOWN,     /* [H, Is] */
  MF_P_SHARED_EXPERT_GATE, /* shared_expert_gate [1, H] */
  MF_P_DENSE_GATE,      /* mlp.gate_proj [Id, H] (dense layers) */
  MF_P_DENSE_UP,
  MF_P_DENSE_DOWN,
  MF_P_FINAL_NORM,      /* model.norm [H] */
  MF_P_LM_HEAD,         /* lm_head [V, H] (absent when tied) */
  MF_P_ROLE_COUNT_
} mf_param_role;

typedef struct mf_param {
  char name[96];
  mf_param_role role;
  int32_t layer;  /* -1 for embed, final norm, lm_head */
  int32_t expert; /* routed expert index, else -1 */
  int ndim;
  int64_t shape[2];
  int64_t numel;
  int64_t offset; /* in floats, into the host weight array */
} mf_param;

typedef struct mf_param_table {
  mf_model_spec spec;
  mf_param *params;
  int64_t n;
  int64_t total_numel;
  int32_t *by_layer;  /* [layers][MF_P_ROLE_COUNT_] -> index or -1 (non-expert roles) */
  int32_t *experts;   /* [layers][E][3] -> index of gate, up, down, or -1 (dense layers) */
  int32_t embed, final_norm, lm_head; /* lm_head = -1 when tied */
} mf_param_table;

mf_status mf_param_table_build(const mf_model_spec *spec, mf_param_table **out);
void mf_param_table_free(mf_param_table *t); /* NULL is fine */
/* Index of a layer's parameter of `role` (expert: 0..E-1 for the expert roles,
 * else ignored), or -1 when the layer has none. */
int32_t mf_param_index(const mf_param_table *t, mf_param_role role, int64_t layer, int64_t expert);
int32_t mf_param_find(const mf_param_table *t, const char *name); /* -1 when absent */
/* The parameter whose weights the LM head uses (lm_head, or embed when tied). */
int32_t mf_param_lm_head(const mf_param_table *t);

/* Random init as transformers' _init_weights: linear and embedding weights
 * ~ N(0, std) (transformers' initializer_range 0.02), biases 0, norm weights 1.
 * Deterministic from the seed: each parameter draws from its own stream, so
 * the result does not depend on threads or order. w holds total_numel floats. */
void mf_params_init_random(const mf_param_table *t, uint64_t seed, float std, float *w);
/* Loads every parameter from a safetensors file / sharded set / model dir into
 * w (F32, BF16 or F16 on disk, converted to fp32). A missing tensor or a shape
 * mismatch is an error naming the file and the tensor; tensors the model does
 * not use are listed in a warning. */
mf_status mf_params_load(const mf_param_table *t, const char *path, float *w);
/* Writes DIR/config.json and DIR/model.safetensors (fp32). */
mf_status mf_params_save_model_dir(const mf_param_table *t, const float *w, const char *dir);

#ifdef __cplusplus
}
#endif

#endif /* MF_MODEL_PARAMS_H */
