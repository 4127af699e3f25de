/* Family names, transformers defaults, validation and parameter counts. */
#include <math.h>
#include <string.h>

#include "src/model/spec.h"

#include "kernels/backend.h" /* YaRN's mscale (mf_rope_yarn_*) */

static const struct {
  const char *name, *arch, *model_type;
} k_families[MF_FAMILY_COUNT_] = {
    [MF_FAMILY_INVALID] = {"invalid", "", ""},
    [MF_FAMILY_MIXTRAL] = {"mixtral", "MixtralForCausalLM", "mixtral"},
    [MF_FAMILY_QWEN2_MOE] = {"qwen2_moe", "Qwen2MoeForCausalLM", "qwen2_moe"},
    [MF_FAMILY_QWEN3_MOE] = {"qwen3_moe", "Qwen3MoeForCausalLM", "qwen3_moe"},
    [MF_FAMILY_OLMOE] = {"olmoe", "OlmoeForCausalLM", "olmoe"},
    [MF_FAMILY_GLM4_MOE] = {"glm4_moe", "Glm4MoeForCausalLM", "glm4_moe"},
    [MF_FAMILY_DEEPSEEK_V3] = {"deepseek_v3", "DeepseekV3ForCausalLM", "deepseek_v3"},
    [MF_FAMILY_GPT_OSS] = {"gpt_oss", "GptOssForCausalLM", "gpt_oss"},
};

const char *mf_family_name(mf_family f) {
  return (f > 0 && f < MF_FAMILY_COUNT_) ? k_families[f].name : "invalid";
}

const char *mf_family_architecture(mf_family f) {
  return (f > 0 && f < MF_FAMILY_COUNT_) ? k_families[f].arch : "";
}

const char *mf_family_model_type(mf_family f) {
  return (f > 0 && f < MF_FAMILY_COUNT_) ? k_families[f].model_type : "";
}

int mf_family_idle_expert_has_grad(mf_family f) {
  return f == MF_FAMILY_OLMOE || f == MF_FAMILY_GPT_OSS; /* gpt-oss: one fused tensor for all experts */
}

mf_family mf_family_from_name(const char *name) {
  if (!name) return MF_FAMILY_INVALID;
  for (int f = 1; f < MF_FAMILY_COUNT_; f++)
    if (strcmp(name, k_families[f].name) == 0) return (mf_family)f;
  return MF_FAMILY_INVALID;
}

mf_family mf_family_from_architecture(const char *arch) {
  if (!arch) return MF_FAMILY_INVALID;
  for (int f = 1; f < MF_FAMILY_COUNT_; f++)
    if (strcmp(arch, k_families[f].arch) == 0) return (mf_family)f;
  return MF_FAMILY_INVALID;
}

void mf_model_spec_defaults(mf_family f, mf_model_spec *s) {
  memset(s, 0, sizeof *s);
  s->family = f;
  s->decoder_sparse_step = 1;
  s->seed = 1;
  s->partial_rotary = 1.0;
  s->n_group = 1, s->topk_group = 1, s->routed_scaling = 1.0;
  switch (f) {
    case MF_FAMILY_MIXTRAL:
      s->vocab = 32000, s->hidden = 4096, s->expert_ffn = 14336, s->layers = 32;
      s->heads = 32, s->kv_heads = 8, s->max_seq = 4096 * 32, s->norm_eps = 1e-5;
      s->rope_theta = 1e6, s->experts = 8, s->top_k = 2, s->router_aux_loss_coef = 0.001;
      s->norm_topk_prob = 1; /* Mixtral always renormalises (transformers has no flag) */
      break;
    case MF_FAMILY_QWEN2_MOE:
      s->vocab = 151936, s->hidden = 2048, s->dense_ffn = 5632, s->layers = 24;
      s->heads = 16, s->kv_heads = 16, s->max_seq = 32768, s->norm_eps = 1e-6;
      s->rope_theta = 10000.0, s->expert_ffn = 1408, s->shared_ffn = 5632;
      s->top_k = 4, s->experts = 60, s->router_aux_loss_coef = 0.001, s->qkv_bias = 1;
      break;
    case MF_FAMILY_QWEN3_MOE:
      s->vocab = 151936, s->hidden = 2048, s->dense_ffn = 6144, s->layers = 24;
      s->heads = 32, s->kv_heads = 4, s->max_seq = 32768, s->norm_eps = 1e-6;
      s->rope_theta = 10000.0, s->expert_ffn = 768, s->top_k = 8, s->experts = 128;
      s->router_aux_loss_coef = 0.001, s->qk_norm = MF_QK_NORM_PER_HEAD;
      break;
    case MF_FAMILY_OLMOE:
      /* OlmoeConfig's intermediate_size default is 2048; OLMoE-1B-7B's config.json sets 1024. */
      s->vocab = 50304, s->hidden = 2048, s->expert_ffn = 2048, s->layers = 16;
      s->heads = 16, s->kv_heads = 16, s->max_seq = 4096, s->norm_eps = 1e-5;
      s->rope_theta = 10000.0, s->top_k = 8, s->experts = 64, s->router_aux_loss_coef = 0.01;
      s->qk_norm = MF_QK_NORM_FULL;
      break;
    case MF_FAMILY_GLM4_MOE:
      /* Glm4MoeConfig's defaults (GLM-4.5-Air's shape); its loss has no aux term */
      s->vocab = 151552, s->hidden = 4096, s->dense_ffn = 10944, s->layers = 46;
      s->heads = 96, s->kv_heads = 8, s->max_seq = 131072, s->norm_eps = 1e-5;
      s->rope_theta = 10000.0, s->partial_rotary = 0.5, s->expert_ffn = 1408, s->top_k = 8;
      s->experts = 128, s->shared_ffn = 1408, s->first_dense = 1, s->norm_topk_prob = 1;
      s->router = MF_ROUTER_SIGMOID_GROUP;
      s->head_dim = 128; /* GLM-4.5's config.json sets it (hidden / heads would be 42) */
      break;
    case MF_FAMILY_DEEPSEEK_V3:
      /* DeepseekV3Config's defaults (DeepSeek-V3's shape); the same router and MoE block as GLM-4.5 */
      s->vocab = 129280, s->hidden = 7168, s->dense_ffn = 18432, s->expert_ffn = 2048, s->layers = 61;
      s->heads = 128, s->kv_heads = 128, s->max_seq = 4096, s->norm_eps = 1e-6, s->rope_theta = 10000.0;
      s->shared_ffn = 2048, s->experts = 256, s->routed_scaling = 2.5, s->n_group = 8, s->topk_group = 4;
      s->top_k = 8, s->first_dense = 3, s->norm_topk_prob = 1, s->router = MF_ROUTER_SIGMOID_GROUP;
      s->q_lora_rank = 1536, s->kv_lora_rank = 512, s->qk_nope_dim = 128, s->qk_rope_dim = 64;
      s->v_head_dim = 128, s->rope_interleave = 1, s->head_dim = 128 + 64;
      break;
    case MF_FAMILY_GPT_OSS:
      /* GptOssConfig's defaults (gpt-oss-120b's shape): layers alternate sliding (even) and full */
      s->vocab = 201088, s->hidden = 2880, s->expert_ffn = 2880, s->layers = 36, s->heads = 64;
      s->kv_heads = 8, s->head_dim = 64, s->max_seq = 131072, s->norm_eps = 1e-5, s->rope_theta = 150000.0;
      s->experts = 128, s->top_k = 4, s->router_aux_loss_coef = 0.9, s->router = MF_ROUTER_TOPK_SOFTMAX;
      s->qkv_bias = 1, s->o_bias = 1, s->sliding_window = 128;
      s->norm_topk_prob = 1; /* the weights are a softmax over the chosen k: they sum to 1 */
      s->yarn_factor = 32, s->yarn_original_max = 4096, s->yarn_beta_fast = 32, s->yarn_beta_slow = 1;
      s->yarn_truncate = 0;
      for (int64_t l = 0; l < s->layers; l++) s->sliding_layers[l] = l % 2 == 0;
      break;
    default:
      break;
  }
  if (s->heads > 0 && s->head_dim == 0) s->head_dim = s->hidden / s->heads;
}

int mf_model_spec_layer_is_moe(const mf_model_spec *s, int64_t layer) {
  if (s->experts <= 0) return 0;
  if (s->family == MF_FAMILY_QWEN2_MOE || s->family == MF_FAMILY_QWEN3_MOE) {
    for (int64_t i = 0; i < s->n_mlp_only; i++)
      if (s->mlp_only_layers[i] == layer) return 0;
    return s->decoder_sparse_step > 0 && (layer + 1) % s->decoder_sparse_step == 0;
  }
  return layer >= s->first_dense;
}

int mf_model_spec_is_mla(const mf_model_spec *s) {
  return s->family == MF_FAMILY_DEEPSEEK_V3;
}

int64_t mf_model_spec_v_dim(const mf_model_spec *s) {
  return mf_model_spec_is_mla(s) ? s->v_head_dim : s->head_dim;
}

double mf_model_spec_attn_scale(const mf_model_spec *s) {
  double scale = 1.0 / sqrt((double)s->head_dim);
  if (mf_model_spec_is_mla(s) && s->yarn_factor > 0 && s->yarn_mscale_all_dim != 0) {
    const double m = mf_rope_yarn_mscale(s->yarn_factor, s->yarn_mscale_all_dim);
    scale = scale * m * m;
  }
  return scale;
}

double mf_model_spec_yarn_attention_factor(const mf_model_spec *s) {
  if (!(s->yarn_factor > 0)) return 1.0;
  return mf_rope_yarn_attention_factor(s->yarn_factor, s->yarn_mscale, s->yarn_mscale_all_dim);
}

int64_t mf_model_spec_rope_dim(const mf_model_spec *s) {
  if (mf_model_spec_is_mla(s)) return s->qk_rope_dim; /* the last qk_rope_dim of each q/k head */
  if (!(s->partial_rotary > 0 && s->partial_rotary < 1)) return s->head_dim; /* 0: not set */
  return (int64_t)((double)s->head_dim * s->partial_rotary);
}

int mf_model_spec_has_sinks(const mf_model_spec *s) {
  return s->family == MF_FAMILY_GPT_OSS;
}

int mf_model_spec_swiglu_clamped(const mf_model_spec *s) {
  return s->family == MF_FAMILY_GPT_OSS;
}

int64_t mf_model_spec_window(const mf_model_spec *s, int64_t layer) {
  return layer >= 0 && layer < s->layers && layer < MF_MAX_LAYERS && s->sliding_layers[layer]
             ? s->sliding_window
             : 0;
}

int mf_model_spec_shared_gated(const mf_model_spec *s) {
  return s->family == MF_FAMILY_QWEN2_MOE;
}

#define POSITIVE(field)                                                                     \
  if (s->field <= 0)                                                                        \
    return MF_ERR(MF_ERR_CONFIG, "%s: model %s must be positive (got %lld)", where, #field, \
                  (long long)s->field);

mf_status mf_model_spec_validate(const mf_model_spec *s, const char *where) {
  if (!where) where = "model";
  if (s->family <= MF_FAMILY_INVALID || s->family >= MF_FAMILY_COUNT_)
    return MF_ERR(MF_ERR_CONFIG, "%s: unknown model family", where);
  POSITIVE(hidden)
  POSITIVE(layers)
  POSITIVE(heads)
  POSITIVE(kv_heads) POSITIVE(head_dim) POSITIVE(experts) POSITIVE(top_k) POSITIVE(expert_ffn) POSITIVE(vocab)
      POSITIVE(max_seq) if (s->layers > MF_MAX_LAYERS) return MF_ERR(
          MF_ERR_CONFIG, "%s: %lld layers is more than moefit supports (%d)", where, (long long)s->layers,
          MF_MAX_LAYERS);
  if (s->heads % s->kv_heads != 0)
    return MF_ERR(MF_ERR_CONFIG, "%s: heads (%lld) must be a multiple of kv_heads (%lld)", where,
                  (long long)s->heads, (long long)s->kv_heads);
  if (s->head_dim % 2 != 0)
    return MF_ERR(MF_ERR_CONFIG, "%s: head_dim (%lld) must be even for RoPE", where, (long long)s->head_dim);
  if (s->top_k > s->experts)
    return MF_ERR(MF_ERR_CONFIG, "%s: top_k (%lld) exceeds the number of experts (%lld)", where,
                  (long long)s->top_k, (long long)s->experts);
  const int64_t big = (int64_t)1 << 24;
  if (s->hidden > big || s->expert_ffn > big || s->dense_ffn > big || s->shared_ffn > big ||
      s->vocab > ((int64_t)1 << 31) || s->heads > 4096 || s->experts > 65536 || s->head_dim > 65536)
    return MF_ERR(MF_ERR_CONFIG, "%s: a model dimension is implausibly large", where);
  if (s->dense_ffn < 0 || s->shared_ffn < 0)
    return MF_ERR(MF_ERR_CONFIG, "%s: intermediate sizes must not be negative", where);
  if (!(s->rope_theta > 0)) return MF_ERR(MF_ERR_CONFIG, "%s: rope_theta must be positive", where);
  if (!(s->norm_eps > 0) || s->norm_eps >= 1)
    return MF_ERR(MF_ERR_CONFIG, "%s: norm eps must be in (0, 1) (got %g)", where, s->norm_eps);
  if (!(s->router_aux_loss_coef >= 0))
    return MF_ERR(MF_ERR_CONFIG, "%s: router_aux_loss_coef must be >= 0", where);
  if (!(s->router_jitter >= 0) || s->router_jitter >= 1)
    return MF_ERR(MF_ERR_CONFIG, "%s: router jitter must be in [0, 1)", where);
  if (!(s->clip_qkv >= 0)) return MF_ERR(MF_ERR_CONFIG, "%s: clip_qkv must be >= 0", where);
  if (s->decoder_sparse_step < 1) return MF_ERR(MF_ERR_CONFIG, "%s: decoder_sparse_step must be >= 1", where);
  if (s->n_mlp_only < 0 || s->n_mlp_only > MF_MAX_LAYERS)
    return MF_ERR(MF_ERR_CONFIG, "%s: too many mlp_only_layers", where);
  for (int64_t i = 0; i < s->n_mlp_only; i++)
    if (s->mlp_only_layers[i] < 0 || s->mlp_only_layers[i] >= s->layers)
      return MF_ERR(MF_ERR_CONFIG, "%s: mlp_only_layers[%lld] = %d is not a layer (0..%lld)", where,
                    (long long)i, s->mlp_only_layers[i], (long long)s->layers - 1);
  for (int64_t l = 0; l < s->layers; l++)
    if (!mf_model_spec_layer_is_moe(s, l) && s->dense_ffn <= 0)
      return MF_ERR(MF_ERR_CONFIG, "%s: layer %lld is a dense MLP but intermediate_size is not set", where,
                    (long long)l);
  if (s->shared_ffn > 0 && s->family != MF_FAMILY_QWEN2_MOE && s->family != MF_FAMILY_GLM4_MOE &&
      s->family != MF_FAMILY_DEEPSEEK_V3)
    return MF_ERR(MF_ERR_CONFIG,
                  "%s: a shared expert is only defined for qwen2_moe, glm4_moe and deepseek_v3", where);
  if (mf_model_spec_is_mla(s)) {
    if (s->q_lora_rank < 0 || s->kv_lora_rank < 1 || s->qk_nope_dim < 0 || s->qk_rope_dim < 2 ||
        s->qk_rope_dim % 2 != 0 || s->v_head_dim < 1 || s->q_lora_rank > big || s->kv_lora_rank > big ||
        s->qk_nope_dim > 65536 || s->qk_rope_dim > 65536 || s->v_head_dim > 65536)
      return MF_ERR(MF_ERR_CONFIG,
                    "%s: latent attention sizes q_lora_rank %lld, kv_lora_rank %lld, qk_nope_head_dim %lld, "
                    "qk_rope_head_dim %lld (even), v_head_dim %lld are not valid",
                    where, (long long)s->q_lora_rank, (long long)s->kv_lora_rank, (long long)s->qk_nope_dim,
                    (long long)s->qk_rope_dim, (long long)s->v_head_dim);
    if (s->head_dim != s->qk_nope_dim + s->qk_rope_dim)
      return MF_ERR(MF_ERR_CONFIG, "%s: head_dim %lld must be qk_nope_head_dim + qk_rope_head_dim (%lld)",
                    where, (long long)s->head_dim, (long long)(s->qk_nope_dim + s->qk_rope_dim));
    if (s->kv_heads != s->heads)
      return MF_ERR(
          MF_ERR_CONFIG,
          "%s: num_key_value_heads %lld: latent attention makes a key and a value for each of the %lld "
          "heads",
          where, (long long)s->kv_heads, (long long)s->heads);
    if (s->qkv_bias || s->qk_norm != MF_QK_NORM_NONE)
      return MF_ERR(MF_ERR_CONFIG, "%s: latent attention has no q/k/v bias or q/k norm here", where);
  }
  if (s->yarn_factor != 0 && !(s->yarn_factor > 1 && s->yarn_original_max > 0 && s->yarn_beta_fast > 0 &&
                               s->yarn_beta_slow > 0 && s->yarn_mscale >= 0 && s->yarn_mscale_all_dim >= 0))
    return MF_ERR(
        MF_ERR_CONFIG,
        "%s: rope_scaling yarn: factor %g (> 1), original_max_position_embeddings %lld, beta_fast %g, "
        "beta_slow %g (> 0), mscale %g, mscale_all_dim %g (>= 0) are not valid",
        where, s->yarn_factor, (long long)s->yarn_original_max, s->yarn_beta_fast, s->yarn_beta_slow,
        s->yarn_mscale, s->yarn_mscale_all_dim);
  if (!(s->partial_rotary >= 0 && s->partial_rotary <= 1))
    return MF_ERR(MF_ERR_CONFIG, "%s: partial_rotary_factor %g is not in (0, 1]", where, s->partial_rotary);
  const int64_t rot = mf_model_spec_rope_dim(s);
  if (rot < 2 || rot % 2 != 0)
    return MF_ERR(
        MF_ERR_CONFIG,
        "%s: RoPE rotates int(head_dim %lld * partial_rotary_factor %g) = %lld dims of each head; it "
        "must be even and at least 2",
        where, (long long)s->head_dim, s->partial_rotary, (long long)rot);
  if (s->first_dense < 0 || s->first_dense > s->layers)
    return MF_ERR(MF_ERR_CONFIG, "%s: first_k_dense_replace %lld is not in 0..%lld", where,
                  (long long)s->first_dense, (long long)s->layers);
  const mf_router_kind want = s->family == MF_FAMILY_GLM4_MOE || s->family == MF_FAMILY_DEEPSEEK_V3
                                  ? MF_ROUTER_SIGMOID_GROUP
                              : s->family == MF_FAMILY_GPT_OSS ? MF_ROUTER_TOPK_SOFTMAX
                                                               : MF_ROUTER_SOFTMAX;
  if (s->router != want)
    return MF_ERR(MF_ERR_CONFIG, "%s: the %s router is not this family's", where,
                  s->router == MF_ROUTER_SIGMOID_GROUP  ? "sigmoid group-limited"
                  : s->router == MF_ROUTER_TOPK_SOFTMAX ? "top-k softmax with a bias"
                                                        : "softmax");
  const int oss = s->family == MF_FAMILY_GPT_OSS;
  if (!oss && s->o_bias)
    return MF_ERR(MF_ERR_CONFIG, "%s: an o_proj bias is only defined for gpt_oss", where);
  int64_t sliding = 0;
  for (int64_t l = 0; l < s->layers; l++) sliding += s->sliding_layers[l] != 0;
  if (!oss && (sliding > 0 || s->sliding_window != 0))
    return MF_ERR(MF_ERR_CONFIG, "%s: sliding-window attention is only defined for gpt_oss here", where);
  if (oss && (s->sliding_window < 0 || (sliding > 0 && s->sliding_window < 1)))
    return MF_ERR(MF_ERR_CONFIG, "%s: sliding_window %lld must be at least 1 with sliding_attention layers",
                  where, (long long)s->sliding_window);
  if (oss && (s->qkv_bias != s->o_bias))
    return MF_ERR(MF_ERR_CONFIG, "%s: gpt_oss's attention_bias sets the q, k, v and o biases together",
                  where);
  if (oss && (s->shared_ffn > 0 || s->qk_norm != MF_QK_NORM_NONE || s->partial_rotary != 1.0 ||
              s->first_dense != 0 || s->rope_interleave))
    return MF_ERR(MF_ERR_CONFIG,
                  "%s: gpt_oss has no shared expert, q/k norm, partial or interleaved RoPE, or dense layer",
                  where);
  if (s->router == MF_ROUTER_SIGMOID_GROUP) {
    const int64_t G = s->n_group, TG = s->topk_group;
    /* groups of 2 or more even when there is one: transformers sums each group's top 2 */
    if (G < 1 || s->experts % G != 0 || s->experts / G < 2)
      return MF_ERR(MF_ERR_CONFIG, "%s: n_group %lld must divide the %lld experts into groups of 2 or more",
                    where, (long long)G, (long long)s->experts);
    if (TG < 1 || TG > G)
      return MF_ERR(MF_ERR_CONFIG, "%s: topk_group %lld is not in 1..n_group (%lld)", where, (long long)TG,
                    (long long)G);
    if (TG * (s->experts / G) < s->top_k)
      return MF_ERR(MF_ERR_CONFIG, "%s: topk_group %lld groups of %lld experts cannot hold top_k %lld", where,
                    (long long)TG, (long long)(s->experts / G), (long long)s->top_k);
    if (!(s->routed_scaling > 0) || s->routed_scaling > 1e6)
      return MF_ERR(MF_ERR_CONFIG, "%s: routed_scaling_factor %g must be positive", where, s->routed_scaling);
    if (s->router_aux_loss_coef != 0)
      return MF_ERR(
          MF_ERR_CONFIG,
          "%s: router_aux_loss_coef %g: the %s loss has no load-balancing term (its router is balanced "
          "by e_score_correction_bias); set it to 0",
          where, s->router_aux_loss_coef, mf_family_name(s->family));
  }
  return MF_OK;
}

/* Saturating arithmetic: a spec that has not been validated must not overflow. */
static int64_t sat_add(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_add_overflow(a, b, &r) ? INT64_MAX : r;
}
static int64_t sat_mul(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
}
static int64_t sat_mul3(int64_t a, int64_t b, int64_t c) {
  return sat_mul(sat_mul(a, b), c);
}

/* The HF parameter tensors of each family. "Active" is what one token
 * touches with the embedding left out (the lookup reads one row): the vendors'
 * published active figures for Mixtral, Qwen and OLMoE include the
 * embedding too, i.e. active + vocab * hidden (see tests/hf_config). */
void mf_model_spec_param_count(const mf_model_spec *s, int64_t *total, int64_t *active) {
  const int64_t H = s->hidden, hd = s->head_dim;
  const int64_t q = sat_mul(s->heads, hd), kv = sat_mul(s->kv_heads, hd);
  int64_t attn = sat_add(sat_add(sat_mul(H, q), sat_mul3(2, H, kv)), sat_mul(q, H));
  if (mf_model_spec_is_mla(s)) { /* q (low-rank + its norm, or q_proj), kv_a + its norm, kv_b, o */
    const int64_t rq = s->q_lora_rank, rkv = s->kv_lora_rank;
    attn = rq > 0 ? sat_add(sat_add(sat_mul(H, rq), rq), sat_mul(rq, q)) : sat_mul(H, q);
    attn = sat_add(attn, sat_add(sat_mul(H, sat_add(rkv, s->qk_rope_dim)), rkv));
    attn = sat_add(attn, sat_mul3(rkv, s->heads, sat_add(s->qk_nope_dim, s->v_head_dim)));
    attn = sat_add(attn, sat_mul3(s->heads, s->v_head_dim, H));
  }
  if (s->qkv_bias) attn = sat_add(attn, sat_add(q, sat_mul(2, kv)));
  if (s->o_bias) attn = sat_add(attn, H);
  if (mf_model_spec_has_sinks(s)) attn = sat_add(attn, s->heads);
  if (s->qk_norm == MF_QK_NORM_PER_HEAD) attn = sat_add(attn, sat_mul(2, hd));
  if (s->qk_norm == MF_QK_NORM_FULL) attn = sat_add(attn, sat_add(q, kv));
  const int64_t base = sat_add(attn, sat_mul(2, H)); /* + the two RMSNorm weights */
  /* gpt-oss: + the gate, up and down biases */
  const int64_t expert = sat_add(sat_mul3(3, H, s->expert_ffn),
                                 mf_model_spec_swiglu_clamped(s) ? sat_add(sat_mul(2, s->expert_ffn), H) : 0);
  /* + e_score_correction_bias, a buffer of the checkpoint (never trained); gpt-oss: the router's bias */
  const int64_t router = sat_add(sat_mul(H, s->experts), s->router != MF_ROUTER_SOFTMAX ? s->experts : 0);
  const int64_t shared = s->shared_ffn > 0
                             ? sat_add(sat_mul3(3, H, s->shared_ffn), mf_model_spec_shared_gated(s) ? H : 0)
                             : 0; /* + its sigmoid gate */
  const int64_t moe_tot = sat_add(sat_add(router, sat_mul(s->experts, expert)), shared);
  const int64_t moe_act = sat_add(sat_add(router, sat_mul(s->top_k, expert)), shared);
  const int64_t dense = sat_mul3(3, H, s->dense_ffn);
  int64_t tot = 0, act = 0;
  for (int64_t l = 0; l < s->layers; l++) {
    const int moe = mf_model_spec_layer_is_moe(s, l);
    tot = sat_add(tot, sat_add(base, moe ? moe_tot : dense));
    act = sat_add(act, sat_add(base, moe ? moe_act : dense));
  }
  const int64_t embed = sat_mul(s->vocab, H);
  tot = sat_add(tot, sat_add(sat_add(H, embed), s->tie_embeddings ? 0 : embed));
  act = sat_add(act, sat_add(H, embed)); /* the final norm and the unembedding */
  if (total) *total = tot;
  if (active) *active = act;
}
