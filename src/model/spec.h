/*
 * Model specs: the family and dimensions of an MoE transformer, filled from an
 * HF config.json (src/io) or from a config's `model.init` section (src/config).
 * The maths of each family is transformers' (tests/fixtures/NOTES.md lists the
 * facts the code follows).
 */
#ifndef MF_MODEL_SPEC_H
#define MF_MODEL_SPEC_H

#include <stdint.h>

#include "src/core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MF_MAX_LAYERS 1024

typedef enum mf_family {
  MF_FAMILY_INVALID = 0,
  MF_FAMILY_MIXTRAL,     /* MixtralForCausalLM */
  MF_FAMILY_QWEN2_MOE,   /* Qwen2MoeForCausalLM */
  MF_FAMILY_QWEN3_MOE,   /* Qwen3MoeForCausalLM */
  MF_FAMILY_OLMOE,       /* OlmoeForCausalLM */
  MF_FAMILY_GLM4_MOE,    /* Glm4MoeForCausalLM (GLM-4.5, GLM-4.5-Air) */
  MF_FAMILY_DEEPSEEK_V3, /* DeepseekV3ForCausalLM (DeepSeek-V3/R1, Moonlight, Kimi-K2) */
  MF_FAMILY_GPT_OSS,     /* GptOssForCausalLM (gpt-oss-20b, gpt-oss-120b) */
  MF_FAMILY_COUNT_
} mf_family;

/* How q and k are normalised before RoPE (Qwen3-MoE, OLMoE). */
typedef enum mf_qk_norm {
  MF_QK_NORM_NONE = 0,
  MF_QK_NORM_PER_HEAD, /* Qwen3-MoE: RMSNorm(head_dim) on each head */
  MF_QK_NORM_FULL,     /* OLMoE: RMSNorm over the whole q / k projection */
} mf_qk_norm;

/* How the router turns its logits into the chosen experts and their weights. */
typedef enum mf_router_kind {
  MF_ROUTER_SOFTMAX = 0, /* softmax over the experts, top-k (Mixtral, Qwen, OLMoE); an aux loss */
  /* sigmoid scores; the choice on scores + e_score_correction_bias (a frozen
   * buffer), top-k among the topk_group best of n_group groups; the weights
   * are the chosen scores, renormalised (norm_topk_prob) and scaled by
   * routed_scaling_factor; no aux loss (GLM-4.5, DeepSeek-V3) */
  MF_ROUTER_SIGMOID_GROUP,
  /* a router with a bias (trained); the top-k logits chosen, their softmax the
   * weights; the aux loss reads the softmax over all experts of those weights
   * scattered into zeros (gpt-oss's router_scores) */
  MF_ROUTER_TOPK_SOFTMAX,
} mf_router_kind;

typedef struct mf_model_spec {
  mf_family family;
  int64_t hidden;     /* H */
  int64_t layers;     /* L */
  int64_t heads;      /* query heads */
  int64_t kv_heads;   /* key/value heads (GQA) */
  int64_t head_dim;   /* usually hidden / heads; Qwen3 sets it explicitly */
  int64_t experts;    /* E routed experts per MoE layer */
  int64_t top_k;      /* k */
  int64_t expert_ffn; /* I: routed expert intermediate size */
  int64_t dense_ffn;  /* intermediate size of dense-MLP layers (0: none) */
  int64_t shared_ffn; /* shared expert intermediate size (0: none); Qwen2-MoE's has a sigmoid gate,
                         GLM-4.5's (moe_intermediate_size * n_shared_experts) none */
  int64_t vocab;
  int64_t max_seq; /* max_position_embeddings */
  double rope_theta;
  double norm_eps;
  double router_aux_loss_coef;
  double router_jitter; /* Mixtral router_jitter_noise (training only) */
  double clip_qkv;      /* OLMoE clip_qkv; 0 = off */
  int norm_topk_prob;   /* renormalise the top-k weights (Mixtral: always) */
  int tie_embeddings;   /* lm_head shares the embedding matrix */
  int qkv_bias;         /* Qwen2-MoE: q/k/v projections have bias */
  mf_qk_norm qk_norm;
  double partial_rotary; /* the fraction of each head RoPE rotates (GLM-4.5: 0.5); 1: all of it */
  /* The router (set by the family): MF_ROUTER_SIGMOID_GROUP's groups and weight scale. */
  mf_router_kind router;
  int64_t n_group, topk_group;
  double routed_scaling;
  int64_t first_dense; /* GLM-4.5 first_k_dense_replace: layers below it have a dense MLP */
  /* DeepSeek-V3's multi-head latent attention (mf_model_spec_is_mla): q through
   * q_a_proj [q_lora_rank] -> RMSNorm -> q_b_proj (q_lora_rank 0: q_proj), k and v
   * through kv_a_proj_with_mqa [kv_lora_rank + qk_rope_dim] -> RMSNorm on the
   * first kv_lora_rank -> kv_b_proj [heads * (qk_nope_dim + v_head_dim)]; the
   * last qk_rope_dim columns of kv_a's output are one rope key shared by every
   * head. head_dim is the q/k head (qk_nope_dim + qk_rope_dim); RoPE rotates its
   * last qk_rope_dim dims, in adjacent pairs with rope_interleave. */
  int64_t q_lora_rank, kv_lora_rank, qk_nope_dim, qk_rope_dim, v_head_dim;
  int rope_interleave;
  /* rope_scaling "yarn" (factor > 1; 0: none): the frequencies and, with
   * mscale_all_dim, the softmax scale (transformers' _compute_yarn_parameters) */
  double yarn_factor, yarn_beta_fast, yarn_beta_slow, yarn_mscale, yarn_mscale_all_dim;
  int64_t yarn_original_max;
  int yarn_truncate; /* rope_scaling.truncate (absent: true) */
  /* gpt-oss: a learned sink logit per query head (self_attn.sinks), an o_proj
   * bias, biases on the experts' projections, the clamped SwiGLU
   * (mf_model_spec_swiglu_clamped), and sliding-window layers */
  int o_bias;             /* o_proj has a bias */
  int64_t sliding_window; /* keys visible from a sliding layer's query i: i - window < j <= i */
  uint8_t sliding_layers[MF_MAX_LAYERS]; /* 1: layer l is a sliding_attention layer */
  int64_t decoder_sparse_step;           /* Qwen: layer i is MoE iff (i+1) % step == 0 */
  int64_t n_mlp_only;                    /* Qwen: layers forced to a dense MLP */
  int32_t mlp_only_layers[MF_MAX_LAYERS];
  uint64_t seed; /* random init (model.init) */
} mf_model_spec;

/* "mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "glm4_moe", "deepseek_v3", "gpt_oss" */
const char *mf_family_name(mf_family f);
mf_family mf_family_from_name(const char *name);         /* the short names above; INVALID if unknown */
mf_family mf_family_from_architecture(const char *arch); /* "MixtralForCausalLM" ... */
const char *mf_family_architecture(mf_family f);         /* the HF class name */
const char *mf_family_model_type(mf_family f);           /* HF config "model_type": "mixtral" ... */

/* 1 when transformers gives a routed expert that received no token an all-zero
 * gradient (OLMoE loops over every expert), so AdamW still decays it and counts
 * the step; 0 when the expert's .grad stays None and AdamW skips it (Mixtral,
 * Qwen2-MoE, Qwen3-MoE loop over the experts hit). moefit follows the family. */
int mf_family_idle_expert_has_grad(mf_family f);

/* The transformers defaults of a family (the fields config.json may leave out). */
void mf_model_spec_defaults(mf_family f, mf_model_spec *s);
/* Checks dimensions and their relations; the message names the field (prefixed
 * by `where`, e.g. a file name) and the fault. */
mf_status mf_model_spec_validate(const mf_model_spec *s, const char *where);
int mf_model_spec_layer_is_moe(const mf_model_spec *s, int64_t layer);
/* The dims of each head RoPE rotates: int(head_dim * partial_rotary), as
 * transformers computes the rotary dim (its truncation); head_dim when all. */
int64_t mf_model_spec_rope_dim(const mf_model_spec *s);
/* DeepSeek-V3's multi-head latent attention. */
int mf_model_spec_is_mla(const mf_model_spec *s);
/* The dims of a value head (v_head_dim with MLA, else head_dim). */
int64_t mf_model_spec_v_dim(const mf_model_spec *s);
/* The attention's softmax scale: head_dim^-0.5, times YaRN's mscale(factor, mscale_all_dim)^2 (DeepSeek-V3).
 */
double mf_model_spec_attn_scale(const mf_model_spec *s);
/* YaRN's cos/sin factor (attention_factor): mscale(factor, mscale) / mscale(factor, mscale_all_dim) when both
 * are set, else mscale(factor, 1); 1 without YaRN. */
double mf_model_spec_yarn_attention_factor(const mf_model_spec *s);
/* The shared expert's output passes through a sigmoid gate (Qwen2-MoE's shared_expert_gate). */
int mf_model_spec_shared_gated(const mf_model_spec *s);
/* gpt-oss: a sink logit per head in the attention's softmax (self_attn.sinks). */
int mf_model_spec_has_sinks(const mf_model_spec *s);
/* gpt-oss's experts: biases on gate, up and down, and the clamped SwiGLU
 * (up + 1) * g * sigmoid(alpha * g), g = min(gate, limit), up clamped to
 * [-limit, limit]; limit and alpha constants of transformers' GptOssExperts. */
int mf_model_spec_swiglu_clamped(const mf_model_spec *s);
#define MF_GPT_OSS_SWIGLU_LIMIT 7.0
#define MF_GPT_OSS_SWIGLU_ALPHA 1.702
/* The attention window of layer l: sliding_window on a sliding layer, else 0 (none). */
int64_t mf_model_spec_window(const mf_model_spec *s, int64_t layer);
/* Parameter counts: total, and active per token (unembedding counted, embedding not). */
void mf_model_spec_param_count(const mf_model_spec *s, int64_t *total, int64_t *active);

#ifdef __cplusplus
}
#endif

#endif /* MF_MODEL_SPEC_H */
