/* The parameter table (HF names, shapes, roles), random init, load and save. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "src/io/quant.h"
#include "src/io/safetensors.h"
#include "src/model/hf_config.h"
#include "src/model/params.h"

typedef struct builder {
  mf_param_table *t;
  int64_t cap;
} builder;

static mf_status add(builder *b, mf_param_role role, int64_t layer, int64_t expert, int64_t d0, int64_t d1,
                     const char *fmt, ...) __attribute__((format(printf, 7, 8)));

static mf_status add(builder *b, mf_param_role role, int64_t layer, int64_t expert, int64_t d0, int64_t d1,
                     const char *fmt, ...) {
  mf_param_table *t = b->t;
  if (t->n == b->cap) {
    int64_t cap = b->cap ? 2 * b->cap : 256;
    mf_param *p = (mf_param *)realloc(t->params, (size_t)cap * sizeof *p);
    if (!p) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "parameter table: out of memory");
    t->params = p;
    b->cap = cap;
  }
  mf_param *p = &t->params[t->n];
  memset(p, 0, sizeof *p);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(p->name, sizeof p->name, fmt, ap);
  va_end(ap);
  p->role = role;
  p->layer = (int32_t)layer;
  p->expert = (int32_t)expert;
  p->ndim = d1 > 0 ? 2 : 1;
  p->shape[0] = d0;
  p->shape[1] = d1 > 0 ? d1 : 0;
  p->numel = d0 * (d1 > 0 ? d1 : 1);
  p->offset = t->total_numel;
  p->base = -1;
  /* a buffer of the checkpoint (the router's correction bias): never trained */
  p->frozen = role == MF_P_ROUTER_BIAS;
  p->toff = p->frozen ? -1 : t->trainable_numel;
  t->total_numel += p->numel;
  if (!p->frozen) t->trainable_numel += p->numel;
  int32_t idx = (int32_t)t->n++;
  t->n_base = t->lora_a ? t->n_base : t->n;
  const mf_model_spec *s = &t->spec;
  if (role == MF_P_LORA_A || role == MF_P_LORA_B) {
    /* found through lora_a */
  } else if (layer < 0) {
    if (role == MF_P_EMBED) t->embed = idx;
    if (role == MF_P_FINAL_NORM) t->final_norm = idx;
    if (role == MF_P_LM_HEAD) t->lm_head = idx;
  } else if (expert >= 0) {
    int k = role == MF_P_EXPERT_GATE ? 0 : role == MF_P_EXPERT_UP ? 1 : 2;
    t->experts[(layer * s->experts + expert) * 3 + k] = idx;
  } else {
    t->by_layer[layer * MF_P_ROLE_COUNT_ + role] = idx;
  }
  return MF_OK;
}

mf_status mf_param_table_build(const mf_model_spec *s, mf_param_table **out) {
  *out = NULL;
  MF_CHECK(mf_model_spec_validate(s, "model"));
  mf_param_table *t = (mf_param_table *)calloc(1, sizeof *t);
  if (!t) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "parameter table: out of memory");
  t->spec = *s;
  t->lm_head = -1;
  t->by_layer = (int32_t *)malloc((size_t)s->layers * MF_P_ROLE_COUNT_ * sizeof(int32_t));
  t->experts = (int32_t *)malloc((size_t)(s->layers * s->experts * 3) * sizeof(int32_t));
  if (!t->by_layer || !t->experts) {
    mf_param_table_free(t);
    return MF_ERR(MF_ERR_OUT_OF_MEMORY, "parameter table: out of memory");
  }
  for (int64_t i = 0; i < s->layers * MF_P_ROLE_COUNT_; i++) t->by_layer[i] = -1;
  for (int64_t i = 0; i < s->layers * s->experts * 3; i++) t->experts[i] = -1;

  builder b = {t, 0};
  mf_status st = MF_OK;
  const int64_t H = s->hidden, D = s->head_dim, Hq = s->heads, Hkv = s->kv_heads;
  const int mixtral = s->family == MF_FAMILY_MIXTRAL;
  const char *moe = mixtral ? "block_sparse_moe" : "mlp";
#define ADD(...) MF_CHECK_GOTO(add(&b, __VA_ARGS__), st, fail)
  ADD(MF_P_EMBED, -1, -1, s->vocab, H, "model.embed_tokens.weight");
  for (int64_t l = 0; l < s->layers; l++) {
    char pre[64];
    snprintf(pre, sizeof pre, "model.layers.%lld", (long long)l);
    ADD(MF_P_ATTN_NORM, l, -1, H, 0, "%s.input_layernorm.weight", pre);
    if (mf_model_spec_is_mla(s)) { /* DeepSeek-V3's latent attention, in transformers' order */
      const int64_t rq = s->q_lora_rank, rkv = s->kv_lora_rank, Dv = s->v_head_dim;
      if (rq > 0) {
        ADD(MF_P_Q_A, l, -1, rq, H, "%s.self_attn.q_a_proj.weight", pre);
        ADD(MF_P_Q_A_NORM, l, -1, rq, 0, "%s.self_attn.q_a_layernorm.weight", pre);
        ADD(MF_P_Q_B, l, -1, Hq * D, rq, "%s.self_attn.q_b_proj.weight", pre);
      } else {
        ADD(MF_P_Q, l, -1, Hq * D, H, "%s.self_attn.q_proj.weight", pre);
      }
      ADD(MF_P_KV_A, l, -1, rkv + s->qk_rope_dim, H, "%s.self_attn.kv_a_proj_with_mqa.weight", pre);
      ADD(MF_P_KV_A_NORM, l, -1, rkv, 0, "%s.self_attn.kv_a_layernorm.weight", pre);
      ADD(MF_P_KV_B, l, -1, Hq * (s->qk_nope_dim + Dv), rkv, "%s.self_attn.kv_b_proj.weight", pre);
      ADD(MF_P_O, l, -1, H, Hq * Dv, "%s.self_attn.o_proj.weight", pre);
    } else {
      ADD(MF_P_Q, l, -1, Hq * D, H, "%s.self_attn.q_proj.weight", pre);
      if (s->qkv_bias) ADD(MF_P_Q_BIAS, l, -1, Hq * D, 0, "%s.self_attn.q_proj.bias", pre);
      ADD(MF_P_K, l, -1, Hkv * D, H, "%s.self_attn.k_proj.weight", pre);
      if (s->qkv_bias) ADD(MF_P_K_BIAS, l, -1, Hkv * D, 0, "%s.self_attn.k_proj.bias", pre);
      ADD(MF_P_V, l, -1, Hkv * D, H, "%s.self_attn.v_proj.weight", pre);
      if (s->qkv_bias) ADD(MF_P_V_BIAS, l, -1, Hkv * D, 0, "%s.self_attn.v_proj.bias", pre);
      ADD(MF_P_O, l, -1, H, Hq * D, "%s.self_attn.o_proj.weight", pre);
      if (s->o_bias) ADD(MF_P_O_BIAS, l, -1, H, 0, "%s.self_attn.o_proj.bias", pre);
      if (mf_model_spec_has_sinks(s)) ADD(MF_P_SINKS, l, -1, Hq, 0, "%s.self_attn.sinks", pre);
      if (s->qk_norm == MF_QK_NORM_PER_HEAD) {
        ADD(MF_P_Q_NORM, l, -1, D, 0, "%s.self_attn.q_norm.weight", pre);
        ADD(MF_P_K_NORM, l, -1, D, 0, "%s.self_attn.k_norm.weight", pre);
      } else if (s->qk_norm == MF_QK_NORM_FULL) {
        ADD(MF_P_Q_NORM, l, -1, Hq * D, 0, "%s.self_attn.q_norm.weight", pre);
        ADD(MF_P_K_NORM, l, -1, Hkv * D, 0, "%s.self_attn.k_norm.weight", pre);
      }
    }
    ADD(MF_P_MLP_NORM, l, -1, H, 0, "%s.post_attention_layernorm.weight", pre);
    if (mf_model_spec_layer_is_moe(s, l)) {
      const int64_t I = s->expert_ffn;
      if (s->router == MF_ROUTER_TOPK_SOFTMAX) { /* gpt-oss: mlp.router, with a bias */
        ADD(MF_P_ROUTER, l, -1, s->experts, H, "%s.mlp.router.weight", pre);
        ADD(MF_P_ROUTER_LINEAR_BIAS, l, -1, s->experts, 0, "%s.mlp.router.bias", pre);
      } else {
        ADD(MF_P_ROUTER, l, -1, s->experts, H, "%s.%s.gate.weight", pre, moe);
      }
      if (s->router == MF_ROUTER_SIGMOID_GROUP)
        ADD(MF_P_ROUTER_BIAS, l, -1, s->experts, 0, "%s.mlp.gate.e_score_correction_bias", pre);
      if (mf_model_spec_swiglu_clamped(s)) { /* gpt-oss's biases (mf_param_packed: the checkpoint's names) */
        ADD(MF_P_EXPERT_GATE_BIAS, l, -1, s->experts, I, "%s.mlp.experts.gate_proj_bias", pre);
        ADD(MF_P_EXPERT_UP_BIAS, l, -1, s->experts, I, "%s.mlp.experts.up_proj_bias", pre);
        ADD(MF_P_EXPERT_DOWN_BIAS, l, -1, s->experts, H, "%s.mlp.experts.down_proj_bias", pre);
      }
      for (int64_t e = 0; e < s->experts; e++) {
        if (mixtral) {
          ADD(MF_P_EXPERT_GATE, l, e, I, H, "%s.%s.experts.%lld.w1.weight", pre, moe, (long long)e);
          ADD(MF_P_EXPERT_UP, l, e, I, H, "%s.%s.experts.%lld.w3.weight", pre, moe, (long long)e);
          ADD(MF_P_EXPERT_DOWN, l, e, H, I, "%s.%s.experts.%lld.w2.weight", pre, moe, (long long)e);
        } else {
          ADD(MF_P_EXPERT_GATE, l, e, I, H, "%s.mlp.experts.%lld.gate_proj.weight", pre, (long long)e);
          ADD(MF_P_EXPERT_UP, l, e, I, H, "%s.mlp.experts.%lld.up_proj.weight", pre, (long long)e);
          ADD(MF_P_EXPERT_DOWN, l, e, H, I, "%s.mlp.experts.%lld.down_proj.weight", pre, (long long)e);
        }
      }
      if (s->shared_ffn > 0) {
        const int64_t Is = s->shared_ffn;
        const char *sh = mf_model_spec_shared_gated(s) ? "shared_expert" : "shared_experts"; /* glm4_moe's */
        ADD(MF_P_SHARED_GATE, l, -1, Is, H, "%s.mlp.%s.gate_proj.weight", pre, sh);
        ADD(MF_P_SHARED_UP, l, -1, Is, H, "%s.mlp.%s.up_proj.weight", pre, sh);
        ADD(MF_P_SHARED_DOWN, l, -1, H, Is, "%s.mlp.%s.down_proj.weight", pre, sh);
        if (mf_model_spec_shared_gated(s))
          ADD(MF_P_SHARED_EXPERT_GATE, l, -1, 1, H, "%s.mlp.shared_expert_gate.weight", pre);
      }
    } else {
      const int64_t Id = s->dense_ffn;
      ADD(MF_P_DENSE_GATE, l, -1, Id, H, "%s.mlp.gate_proj.weight", pre);
      ADD(MF_P_DENSE_UP, l, -1, Id, H, "%s.mlp.up_proj.weight", pre);
      ADD(MF_P_DENSE_DOWN, l, -1, H, Id, "%s.mlp.down_proj.weight", pre);
    }
  }
  ADD(MF_P_FINAL_NORM, -1, -1, H, 0, "model.norm.weight");
  if (!s->tie_embeddings) ADD(MF_P_LM_HEAD, -1, -1, s->vocab, H, "lm_head.weight");
#undef ADD
  *out = t;
  return MF_OK;
fail:
  mf_param_table_free(t);
  return st;
}

/* ------------------------------------------------ gpt-oss's fused experts */

enum { PACK_NONE = 0, PACK_GATE_UP, PACK_DOWN, PACK_GATE_UP_BIAS };

/* Parameter p's fused tensor in an HF checkpoint, and its place there. */
static int pack_of(const mf_param_table *t, const mf_param *p, mf_param_src *src) {
  const mf_model_spec *s = &t->spec;
  if (s->family != MF_FAMILY_GPT_OSS || p->layer < 0) return PACK_NONE;
  const int64_t E = s->experts, H = s->hidden, I = s->expert_ffn, e = p->expert;
  int kind = PACK_NONE;
  const int half = p->role == MF_P_EXPERT_UP || p->role == MF_P_EXPERT_UP_BIAS;
  mf_param_src x = {{0}, 3, {E, H, 2 * I}, 0, 0, 0};
  switch (p->role) {
    case MF_P_EXPERT_GATE:
    case MF_P_EXPERT_UP: /* [I, H]: (i, h) at [e, h, 2i + half] */
      kind = PACK_GATE_UP;
      x.base = e * H * 2 * I + half, x.rs = 2, x.cs = 2 * I;
      break;
    case MF_P_EXPERT_DOWN: /* [H, I]: (h, i) at [e, i, h] */
      kind = PACK_DOWN;
      x.shape[1] = I, x.shape[2] = H;
      x.base = e * I * H, x.rs = 1, x.cs = H;
      break;
    case MF_P_EXPERT_GATE_BIAS:
    case MF_P_EXPERT_UP_BIAS: /* [E, I]: (e, i) at [e, 2i + half] */
      kind = PACK_GATE_UP_BIAS;
      x.ndim = 2, x.shape[1] = 2 * I, x.shape[2] = 0;
      x.base = half, x.rs = 2 * I, x.cs = 2;
      break;
    default:
      return PACK_NONE;
  }
  static const char *const names[] = {"", "gate_up_proj", "down_proj", "gate_up_proj_bias"};
  snprintf(x.name, sizeof x.name, "model.layers.%d.mlp.experts.%s", p->layer, names[kind]);
  if (src) *src = x;
  return kind;
}

int mf_param_packed(const mf_param_table *t, int64_t i, mf_param_src *src) {
  return i >= 0 && i < t->n_base && pack_of(t, &t->params[i], src) != PACK_NONE;
}

int mf_param_pack_name(const mf_param_table *t, const char *name) {
  if (t->spec.family != MF_FAMILY_GPT_OSS) return 0;
  int layer = -1, used = 0;
  char what[32];
  if (sscanf(name, "model.layers.%d.mlp.experts.%31[a-z_]%n", &layer, what, &used) != 2 || name[used] != 0 ||
      layer < 0 || layer >= t->spec.layers || !mf_model_spec_layer_is_moe(&t->spec, layer))
    return 0;
  /* as OpenAI ships the weights: MXFP4 codes and scales (read_mxfp4) */
  return strcmp(what, "gate_up_proj") == 0 || strcmp(what, "down_proj") == 0 ||
         strcmp(what, "gate_up_proj_bias") == 0 || strcmp(what, "gate_up_proj_blocks") == 0 ||
         strcmp(what, "gate_up_proj_scales") == 0 || strcmp(what, "down_proj_blocks") == 0 ||
         strcmp(what, "down_proj_scales") == 0;
}

void mf_param_table_free(mf_param_table *t) {
  if (!t) return;
  free(t->params);
  free(t->by_layer);
  free(t->experts);
  free(t->lora_a);
  free(t->lora.hot);
  if (!t->qhome_borrowed) free(t->qhome);
  free(t);
}

/* ------------------------------------------------------ quantized base */

static int quantizable(const mf_param_table *t, int64_t i) {
  const mf_param *p = &t->params[i];
  return i < t->n_base && p->frozen && p->ndim == 2 && p->role != MF_P_EMBED && p->role != MF_P_LM_HEAD &&
         i != mf_param_lm_head(t) && p->role != MF_P_EXPERT_GATE_BIAS && p->role != MF_P_EXPERT_UP_BIAS &&
         p->role != MF_P_EXPERT_DOWN_BIAS; /* gpt-oss's expert biases: [E, N], not linear weights */
}

mf_qweight mf_param_qweight(const mf_param_table *t, int64_t i) {
  const mf_param *p = &t->params[i];
  mf_qweight w = {.kind = p->quant,
                  .nested = t->base_nested,
                  .rows = p->shape[0],
                  .cols = p->shape[1],
                  .blocksize = t->base_blocksize};
  if (t->qhome && p->quant) mf_qweight_blob_view(&w, t->qhome + p->qoff);
  return w;
}

mf_status mf_param_table_quantize_base(mf_param_table *t, mf_quant_kind kind, int64_t blocksize, int nested) {
  return mf_param_table_quantize_set(t, kind, blocksize, nested, NULL);
}

mf_status mf_param_table_quantize_set(mf_param_table *t, mf_quant_kind kind, int64_t blocksize, int nested,
                                      const uint8_t *which) {
  if (kind == MF_QUANT_NONE) return MF_OK;
  if (!t->lora_a)
    return MF_ERR(
        MF_ERR_CONFIG,
        "train.lora.base_dtype %s: a quantized base is LoRA's frozen base; with train.lora.rank 0 every "
        "weight is trained (set train.lora.rank, or base_dtype bf16)",
        mf_quant_name(kind));
  /* MXFP4 is never made, only read as shipped: gpt-oss's expert weights (which: the file's; NULL: where only
   * the config.json is there, the experts' as OpenAI ships them) */
  const int mxfp4 = kind == MF_QUANT_MXFP4 && t->spec.family == MF_FAMILY_GPT_OSS;
  if (kind != MF_QUANT_NF4 && kind != MF_QUANT_FP8 && !mxfp4)
    return MF_ERR(MF_ERR_CONFIG, "train.lora.base_dtype %s: only nf4 and fp8 are made at load",
                  mf_quant_name(kind));
  if (kind == MF_QUANT_NF4 && !mf_nf4_blocksize_ok(blocksize))
    return MF_ERR(MF_ERR_CONFIG, "train.lora.base_blocksize %lld: a power of two in 32..4096 (64 is QLoRA's)",
                  (long long)blocksize);
  if (t->qhome) return MF_ERR(MF_ERR_INTERNAL, "parameter table: the base is quantized already");
  t->base_quant = kind;
  t->base_blocksize = kind == MF_QUANT_NF4 ? blocksize : 0;
  t->base_nested = kind == MF_QUANT_NF4 && nested;
  int64_t at = 0;
  for (int64_t i = 0; i < t->n; i++) {
    mf_param *p = &t->params[i];
    p->quant = 0, p->qoff = -1, p->qbytes = 0;
    if (!quantizable(t, i) || (which && !which[i])) continue;
    if (mxfp4 && !which && !(p->expert >= 0 && mf_param_packed(t, i, NULL))) continue;
    p->quant = (uint8_t)kind;
    const mf_qweight w = mf_param_qweight(t, i);
    p->qoff = at;
    p->qbytes = mf_qweight_blob_bytes(&w);
    at += (p->qbytes + 63) & ~(int64_t)63;
  }
  t->qhome_bytes = at;
  return MF_OK;
}

mf_status mf_param_table_alloc_qhome(mf_param_table *t) {
  if (t->qhome || t->qhome_bytes == 0) return MF_OK;
  return mf_malloc((size_t)t->qhome_bytes, "the quantized base", (void **)&t->qhome);
}

void mf_param_table_borrow_qhome(mf_param_table *t, uint8_t *mem) {
  if (!t->qhome_borrowed) free(t->qhome);
  t->qhome = mem;
  t->qhome_borrowed = 1;
}

/* A weight quantized into the home: the home must be there (mf_param_table_alloc_qhome). */
static mf_status qhome_ready(const mf_param_table *t) {
  if (t->qhome_bytes > 0 && !t->qhome)
    return MF_ERR(MF_ERR_INTERNAL, "parameter table: the quantized base's home is not allocated");
  return MF_OK;
}

mf_status mf_params_quantize_from(const mf_param_table *t, const float *w) {
  MF_CHECK(qhome_ready(t));
  for (int64_t i = 0; i < t->n; i++) {
    const mf_param *p = &t->params[i];
    if (p->quant)
      MF_CHECK(mf_quant_blob((mf_quant_kind)p->quant, w + p->offset, p->shape[0], p->shape[1],
                             t->base_blocksize, t->base_nested, t->qhome + p->qoff, p->name));
  }
  return MF_OK;
}

static int mxfp4_rows(const mf_param_table *t, const mf_safetensors *st, const mf_param *p, const char *name,
                      int64_t *out, int64_t *in, int64_t *out0, int64_t *step);

mf_status mf_params_shipped_layout(const mf_param_table *t, const char *path, mf_quant_kind kind,
                                   uint8_t *which, int64_t *blocksize, int *found) {
  *found = 0;
  mf_safetensors *st = NULL;
  MF_CHECK(mf_safetensors_open(path, &st));
  mf_status rc = MF_OK;
  for (int64_t i = 0; i < t->n_base && rc == MF_OK; i++) {
    const mf_param *p = &t->params[i];
    mf_param_src src;
    int64_t out, in, out0, step;
    if (mf_param_packed(t, i, &src)) { /* gpt-oss's experts: MXFP4 as OpenAI ships them */
      which[i] = (uint8_t)(quantizable(t, i) && kind == MF_QUANT_MXFP4 &&
                           mxfp4_rows(t, st, p, src.name, &out, &in, &out0, &step));
      *found = *found || which[i];
      continue;
    }
    which[i] = (uint8_t)(quantizable(t, i) && mf_shipped_kind(st, p->name) == kind);
    if (!which[i] || *found) continue;
    mf_qweight w;
    rc = mf_shipped_describe(st, path, p->name, p->shape[0], p->shape[1], &w);
    if (rc == MF_OK) *blocksize = w.blocksize, *found = 1;
  }
  mf_safetensors_close(st);
  return rc;
}

/* ------------------------------------------------------------------- LoRA */

/* A router's weights, which train.lora.train_router trains fully: its weight, and gpt-oss's bias. */
static int trained_router(mf_param_role role) {
  return role == MF_P_ROUTER || role == MF_P_ROUTER_LINEAR_BIAS;
}

uint64_t mf_lora_target_roles(mf_family family, const char *name) {
  const int mixtral = family == MF_FAMILY_MIXTRAL;
#define BIT(r) MF_ROLE_BIT(r)
  if (strcmp(name, "q_proj") == 0) return BIT(MF_P_Q);
  if (strcmp(name, "k_proj") == 0) return BIT(MF_P_K);
  if (strcmp(name, "v_proj") == 0) return BIT(MF_P_V);
  if (strcmp(name, "o_proj") == 0) return BIT(MF_P_O);
  if (family == MF_FAMILY_DEEPSEEK_V3) { /* the latent attention's projections */
    if (strcmp(name, "q_a_proj") == 0) return BIT(MF_P_Q_A);
    if (strcmp(name, "q_b_proj") == 0) return BIT(MF_P_Q_B);
    if (strcmp(name, "kv_a_proj_with_mqa") == 0) return BIT(MF_P_KV_A);
    if (strcmp(name, "kv_b_proj") == 0) return BIT(MF_P_KV_B);
  }
  /* gpt-oss's experts are fused Parameters, not nn.Linear modules: PEFT's target_modules cannot name them
   * (nor its router, a plain module) */
  if (family == MF_FAMILY_GPT_OSS) return 0;
  if (mixtral) {
    if (strcmp(name, "w1") == 0) return BIT(MF_P_EXPERT_GATE);
    if (strcmp(name, "w3") == 0) return BIT(MF_P_EXPERT_UP);
    if (strcmp(name, "w2") == 0) return BIT(MF_P_EXPERT_DOWN);
    return 0;
  }
  if (strcmp(name, "gate_proj") == 0)
    return BIT(MF_P_EXPERT_GATE) | BIT(MF_P_SHARED_GATE) | BIT(MF_P_DENSE_GATE);
  if (strcmp(name, "up_proj") == 0) return BIT(MF_P_EXPERT_UP) | BIT(MF_P_SHARED_UP) | BIT(MF_P_DENSE_UP);
  if (strcmp(name, "down_proj") == 0)
    return BIT(MF_P_EXPERT_DOWN) | BIT(MF_P_SHARED_DOWN) | BIT(MF_P_DENSE_DOWN);
#undef BIT
  return 0;
}

/* "...q_proj.weight" -> "...q_proj.lora_A.weight" */
static mf_status adapter_name(const char *base, const char *which, char *out, size_t cap) {
  const size_t n = strlen(base), w = strlen(".weight");
  if (n <= w || strcmp(base + n - w, ".weight") != 0)
    return MF_ERR(MF_ERR_INTERNAL, "LoRA: %s is not a weight", base);
  if ((size_t)snprintf(out, cap, "%.*s.%s.weight", (int)(n - w), base, which) >= cap)
    return MF_ERR(MF_ERR_INTERNAL, "LoRA: the adapter name of %s is too long", base);
  return MF_OK;
}

mf_status mf_param_table_add_lora(mf_param_table *t, const mf_lora *l) {
  if (l->rank == 0) return MF_OK;
  if (t->lora_a || t->n != t->n_base) return MF_ERR(MF_ERR_INTERNAL, "LoRA: the table has adapters already");
  if (l->rank < 0 || l->rank > 4096)
    return MF_ERR(MF_ERR_CONFIG, "train.lora.rank %lld is outside [1, 4096]", (long long)l->rank);
  if (!(l->dropout >= 0 && l->dropout < 1))
    return MF_ERR(MF_ERR_CONFIG, "train.lora.dropout %g is outside [0, 1)", l->dropout);
  const int64_t nb = t->n, LE = t->spec.layers * t->spec.experts;
  t->lora_a = (int32_t *)malloc((size_t)nb * sizeof *t->lora_a);
  if (!t->lora_a) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "parameter table: out of memory");
  t->lora = *l;
  t->lora.hot = NULL;
  if (l->hot && LE > 0) {
    MF_CHECK(mf_malloc((size_t)LE, "the hot experts", (void **)&t->lora.hot));
    memcpy(t->lora.hot, l->hot, (size_t)LE);
  }
  t->n_base = nb;
  builder b = {t, t->n};
  int64_t adapted = 0;
  for (int64_t i = 0; i < nb; i++) {
    t->lora_a[i] = -1;
    mf_param *p = &t->params[i];
    const int was = p->frozen; /* the router's correction bias, frozen always */
    p->frozen = was || !(l->train_router && trained_router(p->role));
    if (p->frozen && !was) t->trainable_numel -= p->numel;
    if (p->ndim != 2 || !(l->roles & (MF_ROLE_BIT(p->role)))) continue;
    if (p->expert >= 0 && !mf_lora_expert_hot(t, p->layer, p->expert)) continue; /* a cold expert */
    /* copies: add() may move t->params */
    const mf_param w = *p;
    char a[sizeof w.name], bn[sizeof w.name];
    MF_CHECK(adapter_name(w.name, "lora_A", a, sizeof a));
    MF_CHECK(adapter_name(w.name, "lora_B", bn, sizeof bn));
    t->lora_a[i] = (int32_t)t->n;
    MF_CHECK(add(&b, MF_P_LORA_A, w.layer, w.expert, l->rank, w.shape[1], "%s", a));
    MF_CHECK(add(&b, MF_P_LORA_B, w.layer, w.expert, w.shape[0], l->rank, "%s", bn));
    t->params[t->n - 2].base = t->params[t->n - 1].base = (int32_t)i;
    adapted++;
  }
  if (adapted == 0)
    return MF_ERR(MF_ERR_CONFIG, "train.lora.targets: the %s model has none of the weights named",
                  mf_family_name(t->spec.family));
  int64_t at = 0; /* the trained parameters' arrays: the trained ones in order */
  for (int64_t i = 0; i < t->n; i++) {
    mf_param *p = &t->params[i];
    p->toff = p->frozen ? -1 : at;
    at += p->frozen ? 0 : p->numel;
  }
  if (at != t->trainable_numel) return MF_ERR(MF_ERR_INTERNAL, "LoRA: trained elements counted twice");
  return MF_OK;
}

int32_t mf_param_index(const mf_param_table *t, mf_param_role role, int64_t layer, int64_t expert) {
  if (layer < 0) {
    if (role == MF_P_EMBED) return t->embed;
    if (role == MF_P_FINAL_NORM) return t->final_norm;
    if (role == MF_P_LM_HEAD) return t->lm_head;
    return -1;
  }
  if (layer >= t->spec.layers) return -1;
  if (role == MF_P_EXPERT_GATE || role == MF_P_EXPERT_UP || role == MF_P_EXPERT_DOWN) {
    if (expert < 0 || expert >= t->spec.experts) return -1;
    int k = role == MF_P_EXPERT_GATE ? 0 : role == MF_P_EXPERT_UP ? 1 : 2;
    return t->experts[(layer * t->spec.experts + expert) * 3 + k];
  }
  return t->by_layer[layer * MF_P_ROLE_COUNT_ + role];
}

int32_t mf_param_find(const mf_param_table *t, const char *name) {
  for (int64_t i = 0; i < t->n; i++)
    if (strcmp(t->params[i].name, name) == 0) return (int32_t)i;
  return -1;
}

int32_t mf_param_lm_head(const mf_param_table *t) {
  return t->lm_head >= 0 ? t->lm_head : t->embed;
}

/* ------------------------------------------------------------ random init */

static double uniform01(uint64_t *state) {
  return ((double)(mf_splitmix64(state) >> 11) + 0.5) * 0x1.0p-53;
}

/* One stream per parameter: the seed and the parameter's index. */
static uint64_t stream_of(uint64_t seed, int64_t i) {
  return seed * 0x2545f4914f6cdd1dull ^ ((uint64_t)i + 1) * 0x9e3779b97f4a7c15ull;
}

void mf_params_init_adapters(const mf_param_table *t, uint64_t seed, float *w) {
  for (int64_t i = t->n_base; i < t->n; i++) {
    const mf_param *p = &t->params[i];
    float *dst = w + p->offset;
    if (p->role == MF_P_LORA_B) {
      memset(dst, 0, (size_t)p->numel * sizeof *dst);
      continue;
    }
    const double bound = 1.0 / sqrt((double)p->shape[1]);
    uint64_t state = stream_of(seed, i);
    for (int64_t j = 0; j < p->numel; j++) dst[j] = (float)(bound * (2.0 * uniform01(&state) - 1.0));
  }
}

/* The frozen-home scratch: the largest frozen parameter's fp32 values (NULL
 * without frozen_bf16 or a frozen parameter). */
static mf_status frozen_scratch(const mf_param_table *t, const uint16_t *frozen_bf16, float **out) {
  *out = NULL;
  int64_t most = 0;
  for (int64_t i = 0; i < t->n; i++)
    if (((frozen_bf16 && t->params[i].frozen) || t->params[i].quant) && t->params[i].numel > most)
      most = t->params[i].numel;
  if (most == 0) return MF_OK;
  *out = (float *)malloc((size_t)most * sizeof(float));
  return *out ? MF_OK : MF_ERR(MF_ERR_OUT_OF_MEMORY, "the base's load buffer (%lld values)", (long long)most);
}

/* Where parameter p's fp32 values go: w, or for a frozen one with a bf16
 * home or a quantized one the scratch (then home_put rounds them into the
 * bf16 home, or quantizes them into the quantized home). */
static float *dst_of(const mf_param *p, float *w, const uint16_t *frozen_bf16, float *scratch) {
  return (p->frozen && frozen_bf16) || p->quant ? scratch : w + p->offset;
}
static mf_status home_put(const mf_param_table *t, const mf_param *p, uint16_t *frozen_bf16,
                          const float *scratch) {
  if (p->quant)
    return mf_quant_blob((mf_quant_kind)p->quant, scratch, p->shape[0], p->shape[1], t->base_blocksize,
                         t->base_nested, t->qhome + p->qoff, p->name);
  if (p->frozen && frozen_bf16) mf_fp32_to_bf16_n(scratch, frozen_bf16 + p->offset, (size_t)p->numel);
  return MF_OK;
}

/* Parameter i's initial values into w (the table's layout) or, frozen with a
 * bf16 home, rounded into that in chunks (no fp32 copy of it anywhere). */
#define INIT_CHUNK 2048 /* even: a Box-Muller pair never straddles two chunks */
static void init_param(const mf_param_table *t, int64_t i, uint64_t seed, float std, float *w,
                       uint16_t *home) {
  const mf_param *p = &t->params[i];
  const int to_home = p->frozen && home && !p->quant; /* a quantized one: into w (mf_params_quantize_from) */
  float chunk[INIT_CHUNK];
  const int is_norm = p->role == MF_P_ATTN_NORM || p->role == MF_P_MLP_NORM || p->role == MF_P_FINAL_NORM ||
                      p->role == MF_P_Q_NORM || p->role == MF_P_K_NORM || p->role == MF_P_Q_A_NORM ||
                      p->role == MF_P_KV_A_NORM;
  /* the router's correction bias: zeros, as transformers registers it */
  const int is_bias = p->role == MF_P_Q_BIAS || p->role == MF_P_K_BIAS || p->role == MF_P_V_BIAS ||
                      p->role == MF_P_ROUTER_BIAS || p->role == MF_P_O_BIAS ||
                      p->role == MF_P_ROUTER_LINEAR_BIAS || p->role == MF_P_EXPERT_GATE_BIAS ||
                      p->role == MF_P_EXPERT_UP_BIAS || p->role == MF_P_EXPERT_DOWN_BIAS;
  uint64_t state = stream_of(seed, i);
  for (int64_t j0 = 0; j0 < p->numel; j0 += INIT_CHUNK) {
    const int64_t m = p->numel - j0 < INIT_CHUNK ? p->numel - j0 : INIT_CHUNK;
    float *dst = to_home ? chunk : w + p->offset + j0;
    if (is_norm || is_bias) {
      for (int64_t j = 0; j < m; j++) dst[j] = is_norm ? 1.0f : 0.0f;
    } else {
      for (int64_t j = 0; j < m; j += 2) { /* Box-Muller: two normals per draw */
        double u1 = uniform01(&state), u2 = uniform01(&state);
        double r = sqrt(-2.0 * log(u1));
        dst[j] = (float)(std * r * cos(2.0 * M_PI * u2));
        if (j + 1 < m) dst[j + 1] = (float)(std * r * sin(2.0 * M_PI * u2));
      }
    }
    if (to_home) mf_fp32_to_bf16_n(chunk, home + p->offset + j0, (size_t)m);
  }
}

typedef struct init_job {
  const mf_param_table *t;
  uint64_t seed;
  float std;
  float *w;
  uint16_t *home;
} init_job;

/* Thread i of n: the parameters whose first element falls in its equal share
 * of the model's elements (each parameter has its own stream: the same bits
 * for any thread count). */
static void init_task(void *ctx, int i, int n) {
  const init_job *j = (const init_job *)ctx;
  const mf_param_table *t = j->t;
  const int64_t base = t->n_base > 0 ? t->params[t->n_base - 1].offset + t->params[t->n_base - 1].numel : 0;
  size_t b, e;
  mf_partition((size_t)base, 1, i, n, &b, &e);
  for (int64_t k = 0; k < t->n_base; k++)
    if ((size_t)t->params[k].offset >= b && (size_t)t->params[k].offset < e)
      init_param(t, k, j->seed, j->std, j->w, j->home);
}

void mf_params_init_random(const mf_param_table *t, uint64_t seed, float std, float *w) {
  mf_params_init_random_home(t, seed, std, w, NULL, NULL);
}

void mf_params_init_random_home(const mf_param_table *t, uint64_t seed, float std, float *w,
                                uint16_t *frozen_bf16, mf_threadpool *pool) {
  init_job j = {t, seed, std, w, frozen_bf16};
  if (pool)
    mf_threadpool_run(pool, init_task, &j);
  else
    init_task(&j, 0, 1);
}

/* ------------------------------------------------------------ load / save */

static void shape_str(const int64_t *shape, int ndim, char *buf, size_t cap) {
  size_t n = (size_t)snprintf(buf, cap, "[");
  for (int i = 0; i < ndim && n < cap; i++)
    n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "", (long long)shape[i]);
  if (n < cap) snprintf(buf + n, cap - n, "]");
}

/* Whether tensor x of file `path` (named `name` there) has the shape the config says. */
static mf_status shape_is(const char *path, const char *name, const mf_st_tensor *x, const int64_t *shape,
                          int ndim) {
  int same = x->ndim == ndim;
  for (int d = 0; same && d < ndim; d++) same = x->shape[d] == shape[d];
  if (same) return MF_OK;
  char want[64], got[64];
  shape_str(shape, ndim, want, sizeof want);
  shape_str(x->shape, x->ndim, got, sizeof got);
  return MF_ERR(MF_ERR_FORMAT, "%s: tensor %s has shape %s but the config says %s", path, name, got, want);
}

/* Whether x is a float weight moefit converts (F32, BF16, F16); an fp8 one is read with its block scales
 * elsewhere (load_shipped), so it is not refused here when `fp8_elsewhere`. */
static mf_status float_dtype(const char *path, const char *name, const mf_st_tensor *x, int fp8_elsewhere) {
  if (x->dtype == MF_DTYPE_F32 || x->dtype == MF_DTYPE_BF16 || x->dtype == MF_DTYPE_F16) return MF_OK;
  if (x->dtype == MF_DTYPE_F8_E4M3 && fp8_elsewhere)
    return MF_ERR(MF_ERR_FORMAT, "%s: tensor %s is F8_E4M3 but its block scales %s_scale_inv are missing",
                  path, name, name);
  return MF_ERR(MF_ERR_UNSUPPORTED, "%s: tensor %s is %s; moefit loads F32, BF16 and F16 weights", path, name,
                mf_dtype_name(x->dtype));
}

/* Element j of a float tensor (float_dtype) as fp32. */
static float float_at(const mf_st_tensor *x, int64_t j) {
  const uint8_t *b = (const uint8_t *)x->data;
  if (x->dtype == MF_DTYPE_F32) {
    float v;
    memcpy(&v, b + 4 * j, 4);
    return v;
  }
  uint16_t h;
  memcpy(&h, b + 2 * j, 2);
  return x->dtype == MF_DTYPE_BF16 ? mf_bf16_to_fp32(h) : mf_fp16_to_fp32(h);
}

/* Tensor x of file `path` (named `name` there) into dst as parameter p's fp32
 * values: its shape must be p's; F32, BF16 and F16 are converted. */
static mf_status read_tensor(const char *path, const mf_param *p, const char *name, const mf_st_tensor *x,
                             float *dst) {
  MF_CHECK(shape_is(path, name, x, p->shape, p->ndim));
  MF_CHECK(float_dtype(path, name, x, 1));
  if (x->dtype == MF_DTYPE_F32)
    memcpy(dst, x->data, (size_t)p->numel * sizeof(float));
  else
    for (int64_t j = 0; j < p->numel; j++) dst[j] = float_at(x, j);
  return MF_OK;
}

/* How a stored format reads in messages: "nf4 in blocks of 64, double quantized", "fp8". */
static void format_text(mf_quant_kind kind, int64_t blocksize, int nested, char *buf, size_t cap) {
  if (kind == MF_QUANT_NF4)
    snprintf(buf, cap, "nf4 in blocks of %lld%s", (long long)blocksize, nested ? ", double quantized" : "");
  else
    snprintf(buf, cap, "%s", mf_quant_name(kind));
}

/* Weight p stored quantized in `st` (mf_shipped_kind): as shipped into the
 * quantized home when the table quantizes it (the same format, or an error
 * saying what differs), else dequantized at load into dst (its fp32 values). */
static mf_status load_shipped(const mf_param_table *t, const char *path, const mf_safetensors *st,
                              const mf_param *p, float *dst, uint8_t **buf, size_t *cap) {
  if (p->ndim != 2)
    return MF_ERR(MF_ERR_FORMAT, "%s: tensor %s is stored %s, but the model's %s is %d-D", path, p->name,
                  mf_quant_name(mf_shipped_kind(st, p->name)), p->name, p->ndim);
  mf_qweight w;
  MF_CHECK(mf_shipped_describe(st, path, p->name, p->shape[0], p->shape[1], &w));
  if (p->quant) {
    const int nf4 = w.kind == MF_QUANT_NF4;
    if (p->quant != w.kind || (nf4 && (w.blocksize != t->base_blocksize || w.nested != t->base_nested))) {
      char stored[96], laid[96];
      format_text((mf_quant_kind)w.kind, w.blocksize, w.nested, stored, sizeof stored);
      format_text((mf_quant_kind)p->quant, t->base_blocksize, t->base_nested, laid, sizeof laid);
      return MF_ERR(
          MF_ERR_CONFIG,
          "%s: %s is stored %s, but the base is laid out %s (train.lora.base_dtype, base_blocksize, "
          "base_double_quant: leave them unset to take the checkpoint's)",
          path, p->name, stored, laid);
    }
    return mf_shipped_read(st, path, p->name, &w, t->qhome + p->qoff);
  }
  const size_t need = (size_t)mf_qweight_blob_bytes(&w);
  if (need > *cap) {
    uint8_t *b = (uint8_t *)realloc(*buf, need);
    if (!b) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "%s: %s: out of memory dequantizing it", path, p->name);
    *buf = b, *cap = need;
  }
  MF_CHECK(mf_shipped_read(st, path, p->name, &w, *buf));
  mf_qweight_blob_view(&w, *buf);
  mf_qweight_dequantize_f32(&w, 0, w.rows, dst);
  return MF_OK;
}

/* gpt-oss's experts as OpenAI ships them (transformers' Mxfp4GptOssExperts):
 * <name>_blocks [E, out, in/32, 16] U8, two E2M1 codes a byte (the low nibble
 * first), and <name>_scales [E, out, in/32] U8 (e8m0), in nn.Linear's [out,
 * in] layout (transformers transposes after dequantizing): the MXFP4 blob
 * layout of src/core/qformat.h row by row. Parameter p's rows are out rows
 * out0, out0 + step, ... of expert e, gathered into `blob` (a blob of
 * mf_qweight_blob_bytes, rows x in). */
static mf_status gather_mxfp4(const char *path, const mf_safetensors *st, const mf_param *p, const char *name,
                              int64_t E, int64_t out, int64_t in, int64_t out0, int64_t step, uint8_t *blob) {
  char bn[128], sn[128];
  snprintf(bn, sizeof bn, "%s_blocks", name);
  snprintf(sn, sizeof sn, "%s_scales", name);
  const mf_st_tensor *b = mf_safetensors_find(st, bn), *sc = mf_safetensors_find(st, sn);
  const int64_t G = in / MF_MXFP4_GROUP;
  if (in % MF_MXFP4_GROUP != 0)
    return MF_ERR(MF_ERR_FORMAT, "%s: %s: MXFP4 groups of 32 do not divide the %lld inputs", path, bn,
                  (long long)in);
  if (!sc) return MF_ERR(MF_ERR_FORMAT, "%s: %s is there but its scales %s are missing", path, bn, sn);
  const int64_t want_b[4] = {E, out, G, MF_MXFP4_GROUP / 2}, want_s[3] = {E, out, G};
  int ok = b->dtype == MF_DTYPE_U8 && b->ndim == 4 && sc->dtype == MF_DTYPE_U8 && sc->ndim == 3;
  for (int d = 0; ok && d < 4; d++) ok = b->shape[d] == want_b[d] && (d == 3 || sc->shape[d] == want_s[d]);
  if (!ok) {
    char wb[64], ws[64], gb[64], gs[64];
    shape_str(want_b, 4, wb, sizeof wb), shape_str(want_s, 3, ws, sizeof ws);
    shape_str(b->shape, b->ndim, gb, sizeof gb), shape_str(sc->shape, sc->ndim, gs, sizeof gs);
    return MF_ERR(MF_ERR_FORMAT, "%s: %s %s %s and %s %s %s; the config says U8 %s and U8 %s", path, bn,
                  mf_dtype_name(b->dtype), gb, sn, mf_dtype_name(sc->dtype), gs, wb, ws);
  }
  mf_qweight w = {.kind = MF_QUANT_MXFP4, .rows = p->shape[0], .cols = in};
  mf_qweight_blob_view(&w, blob);
  uint8_t *q = (uint8_t *)w.q, *qs = (uint8_t *)w.scales; /* the blob's own pieces */
  const int64_t row_q = G * (MF_MXFP4_GROUP / 2);
  for (int64_t r = 0; r < w.rows; r++) {
    const int64_t row = p->expert * out + out0 + r * step; /* of [E * out] */
    memcpy(q + r * row_q, (const uint8_t *)b->data + row * row_q, (size_t)row_q);
    memcpy(qs + r * G, (const uint8_t *)sc->data + row * G, (size_t)G);
  }
  char what[160];
  snprintf(what, sizeof what, "%s: %s (expert %d)", path, bn, p->expert);
  return mf_qweight_check(&w, what);
}

/* The MXFP4 rows of gpt-oss expert weight p (gather_mxfp4), or 0 when the file has not them. */
static int mxfp4_rows(const mf_param_table *t, const mf_safetensors *st, const mf_param *p, const char *name,
                      int64_t *out, int64_t *in, int64_t *out0, int64_t *step) {
  char bn[128];
  snprintf(bn, sizeof bn, "%s_blocks", name);
  if (p->expert < 0 || !mf_safetensors_find(st, bn)) return 0;
  const int64_t H = t->spec.hidden, I = t->spec.expert_ffn;
  const int down = p->role == MF_P_EXPERT_DOWN;
  *out = down ? H : 2 * I, *in = down ? I : H;
  *out0 = p->role == MF_P_EXPERT_UP, *step = down ? 1 : 2;
  return 1;
}

/* Parameter p, a part of the fused tensor src (mf_param_packed), gathered
 * from file `path` into dst as fp32: the tensor as transformers names it
 * (BF16, F16, F32), or an expert weight as OpenAI ships it (read_mxfp4). */
static mf_status read_packed(const mf_param_table *t, const char *path, const mf_safetensors *st,
                             const mf_param *p, const mf_param_src *src, float *dst) {
  const mf_st_tensor *x = mf_safetensors_find(st, src->name);
  int64_t out, in, out0, step;
  if (!x && mxfp4_rows(t, st, p, src->name, &out, &in, &out0, &step)) {
    mf_qweight w = {.kind = MF_QUANT_MXFP4, .rows = p->shape[0], .cols = in};
    uint8_t *blob = p->quant == MF_QUANT_MXFP4 ? t->qhome + p->qoff : NULL; /* as shipped */
    const int own = !blob;
    if (own) MF_CHECK(mf_malloc((size_t)mf_qweight_blob_bytes(&w), "an MXFP4 expert weight", (void **)&blob));
    mf_status rc = gather_mxfp4(path, st, p, src->name, t->spec.experts, out, in, out0, step, blob);
    if (rc == MF_OK && own) { /* dequantized at load: the codes times powers of two, exact */
      mf_qweight_blob_view(&w, blob);
      mf_qweight_dequantize_f32(&w, 0, w.rows, dst);
    }
    if (own) free(blob);
    return rc;
  }
  if (!x)
    return MF_ERR(MF_ERR_FORMAT, "%s: tensor %s is missing (the model's gpt_oss config needs it)", path,
                  src->name);
  MF_CHECK(shape_is(path, src->name, x, src->shape, src->ndim));
  MF_CHECK(float_dtype(path, src->name, x, 0));
  const int64_t rows = p->shape[0], cols = p->ndim == 2 ? p->shape[1] : 1;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++) dst[r * cols + c] = float_at(x, src->base + r * src->rs + c * src->cs);
  return MF_OK;
}

mf_status mf_params_load(const mf_param_table *t, const char *path, float *w) {
  return mf_params_load_home(t, path, w, NULL);
}

mf_status mf_params_load_home(const mf_param_table *t, const char *path, float *w, uint16_t *frozen_bf16) {
  MF_CHECK(qhome_ready(t));
  float *scratch = NULL;
  MF_CHECK(frozen_scratch(t, frozen_bf16, &scratch));
  mf_safetensors *st = NULL;
  mf_status rc = mf_safetensors_open(path, &st);
  if (rc != MF_OK) {
    free(scratch);
    return rc;
  }
  uint8_t *blob = NULL; /* a weight shipped quantized, kept in float: its blob, dequantized */
  size_t blob_cap = 0;
  int64_t dequantized = 0;
  mf_quant_kind deq_kind = MF_QUANT_NONE;
  for (int64_t i = 0; i < t->n_base && rc == MF_OK; i++) {
    const mf_param *p = &t->params[i];
    mf_param_src src;
    if (mf_param_packed(t, i, &src)) {
      rc = read_packed(t, path, st, p, &src, dst_of(p, w, frozen_bf16, scratch));
      if (rc == MF_OK && p->quant != MF_QUANT_MXFP4) rc = home_put(t, p, frozen_bf16, scratch);
      continue;
    }
    const mf_quant_kind shipped = mf_shipped_kind(st, p->name);
    if (shipped != MF_QUANT_NONE) {
      rc = load_shipped(t, path, st, p, dst_of(p, w, frozen_bf16, scratch), &blob, &blob_cap);
      if (rc == MF_OK && !p->quant)
        rc = home_put(t, p, frozen_bf16, scratch), dequantized++, deq_kind = shipped;
      continue;
    }
    const mf_st_tensor *x = mf_safetensors_find(st, p->name);
    if (!x) {
      rc = MF_ERR(MF_ERR_FORMAT, "%s: tensor %s is missing (the model's %s config needs it)", path, p->name,
                  mf_family_name(t->spec.family));
      break;
    }
    rc = read_tensor(path, p, p->name, x, dst_of(p, w, frozen_bf16, scratch));
    if (rc == MF_OK) rc = home_put(t, p, frozen_bf16, scratch);
  }
  free(scratch);
  free(blob);
  if (rc == MF_OK && dequantized > 0)
    MF_LOGI("model",
            "%s: %lld weights stored %s, dequantized at load (the base is kept in float: "
            "train.lora.base_dtype bf16, or no adapters)",
            path, (long long)dequantized, mf_quant_name(deq_kind));
  if (rc == MF_OK) {
    int64_t unused = 0;
    char weight[1024];
    for (size_t i = 0; i < mf_safetensors_count(st); i++) {
      const mf_st_tensor *x = mf_safetensors_get(st, i);
      const int part_of =
          mf_shipped_companion(x->name, weight, sizeof weight) && mf_param_find(t, weight) >= 0;
      if (!part_of && mf_param_find(t, x->name) < 0 && !mf_param_pack_name(t, x->name)) {
        if (unused < 3) MF_LOGW("model", "%s: tensor %s is not used by the model", path, x->name);
        unused++;
      }
    }
    if (unused > 3) MF_LOGW("model", "%s: %lld more unused tensors", path, (long long)(unused - 3));
  }
  mf_safetensors_close(st);
  return rc;
}

mf_status mf_params_save_model_dir(const mf_param_table *t, const float *w, const char *dir) {
  return mf_params_write_model(t, w, NULL, MF_DTYPE_F32, dir, 0, NULL, NULL);
}

/* mf_params_write_model's tensors: each made when the file reaches it. */
typedef struct model_fill {
  const mf_param_table *t;
  const float *w;
  const uint16_t *frozen_bf16;
  float *scratch; /* fp32 values of one tensor, for a bf16 file */
} model_fill;

typedef struct tensor_fill {
  model_fill *m;
  int64_t i;
} tensor_fill;

static mf_status fill_tensor(void *ctx, const mf_st_tensor *x, void *dst) {
  const tensor_fill *f = (const tensor_fill *)ctx;
  const model_fill *m = f->m;
  const mf_param_table *t = m->t;
  mf_param_src src;
  if (!mf_param_packed(t, f->i, &src)) {
    const int64_t n = t->params[f->i].numel;
    float *v = x->dtype == MF_DTYPE_F32 ? (float *)dst : m->scratch;
    mf_params_merged(t, m->w, m->frozen_bf16, f->i, v);
    if (x->dtype == MF_DTYPE_BF16) mf_fp32_to_bf16_n(v, (uint16_t *)dst, (size_t)n);
    return MF_OK;
  }
  /* a fused tensor of gpt-oss (f->i its first part): every parameter of the layer that is a part of it */
  const mf_param *first = &t->params[f->i];
  for (int64_t i = f->i; i < t->n_base && t->params[i].layer == first->layer; i++) {
    mf_param_src part;
    if (!mf_param_packed(t, i, &part) || strcmp(part.name, src.name) != 0) continue;
    const mf_param *p = &t->params[i];
    mf_params_merged(t, m->w, m->frozen_bf16, i, m->scratch);
    const int64_t rows = p->shape[0], cols = p->ndim == 2 ? p->shape[1] : 1;
    for (int64_t r = 0; r < rows; r++)
      for (int64_t c = 0; c < cols; c++) {
        const int64_t j = part.base + r * part.rs + c * part.cs;
        const float v = m->scratch[r * cols + c];
        if (x->dtype == MF_DTYPE_F32)
          ((float *)dst)[j] = v;
        else
          mf_fp32_to_bf16_n(&v, (uint16_t *)dst + j, 1);
      }
  }
  return MF_OK;
}

mf_status mf_params_write_model(const mf_param_table *t, const float *w, const uint16_t *frozen_bf16,
                                mf_dtype dtype, const char *dir, uint64_t max_shard_bytes, size_t *shards,
                                uint64_t *bytes) {
  if (dtype != MF_DTYPE_F32 && dtype != MF_DTYPE_BF16)
    return MF_ERR(MF_ERR_INVALID_ARG, "saving %s: dtype %s (F32 or BF16)", dir, mf_dtype_name(dtype));
  MF_CHECK(mf_mkdir_p(dir));
  const int64_t n = t->n_base;
  int64_t most = 1;
  for (int64_t i = 0; i < n; i++)
    if (t->params[i].numel > most) most = t->params[i].numel;
  model_fill m = {t, w, frozen_bf16, NULL};
  const size_t cap = n > 0 ? (size_t)n : 1;
  mf_st_tensor *ts = (mf_st_tensor *)calloc(cap, sizeof *ts);
  tensor_fill *fs = (tensor_fill *)calloc(cap, sizeof *fs);
  int packed = 0;
  for (int64_t i = 0; i < n && !packed; i++) packed = mf_param_packed(t, i, NULL);
  if (dtype == MF_DTYPE_BF16 || packed) m.scratch = (float *)malloc((size_t)most * sizeof(float));
  mf_status st = ts && fs && (m.scratch || (dtype != MF_DTYPE_BF16 && !packed))
                     ? MF_OK
                     : MF_ERR(MF_ERR_OUT_OF_MEMORY, "saving %s: out of memory", dir);
  uint64_t total = 0;
  size_t nt = 0; /* the file's tensors: a parameter each, or a fused tensor for its parts (gpt-oss) */
  char(*pack_names)[96] = packed ? (char(*)[96])calloc(cap, 96) : NULL;
  if (packed && !pack_names && st == MF_OK)
    st = MF_ERR(MF_ERR_OUT_OF_MEMORY, "saving %s: out of memory", dir);
  for (int64_t i = 0; i < n && st == MF_OK; i++) {
    const mf_param *p = &t->params[i];
    mf_st_tensor *x = &ts[nt];
    mf_param_src src;
    if (mf_param_packed(t, i, &src)) {
      int seen = 0; /* made at its first part */
      for (size_t k = 0; k < nt && !seen; k++)
        seen = ts[k].name == pack_names[k] && !strcmp(ts[k].name, src.name);
      if (seen) continue;
      snprintf(pack_names[nt], 96, "%s", src.name);
      x->name = pack_names[nt];
      x->dtype = dtype;
      x->ndim = src.ndim;
      uint64_t numel = 1;
      for (int d = 0; d < src.ndim; d++) x->shape[d] = src.shape[d], numel *= (uint64_t)src.shape[d];
      total += numel * mf_dtype_size(dtype);
      fs[nt] = (tensor_fill){&m, i};
      x->fill = fill_tensor;
      x->fill_ctx = &fs[nt++];
      continue;
    }
    x->name = p->name;
    x->dtype = dtype;
    x->ndim = p->ndim;
    x->shape[0] = p->shape[0];
    x->shape[1] = p->shape[1];
    total += (uint64_t)p->numel * mf_dtype_size(dtype);
    /* an fp32 weight as it is at home; the others (merged, from a bf16 home, narrowed) made one at a time */
    const int as_is =
        dtype == MF_DTYPE_F32 && !(t->lora_a && t->lora_a[i] >= 0) && !(p->frozen && frozen_bf16);
    if (as_is) {
      x->data = w + p->offset;
      nt++;
      continue;
    }
    fs[nt] = (tensor_fill){&m, i};
    x->fill = fill_tensor;
    x->fill_ctx = &fs[nt++];
  }
  size_t ns = 1;
  if (st == MF_OK)
    st = mf_safetensors_write_sharded(dir, ts, nt, NULL, 0, max_shard_bytes ? max_shard_bytes : UINT64_MAX,
                                      &ns);
  free(pack_names);
  free(m.scratch);
  free(fs);
  free(ts);
  MF_CHECK(st);
  if (shards) *shards = ns;
  if (bytes) *bytes = total;
  char path[4096];
  snprintf(path, sizeof path, "%s/config.json", dir);
  return mf_hf_config_write_dtype(&t->spec, dtype, path);
}

/* ------------------------------------------------------- LoRA: merge, save */

void mf_params_merged(const mf_param_table *t, const float *w, const uint16_t *frozen_bf16, int64_t i,
                      float *out) {
  const mf_param *p = &t->params[i];
  if (p->quant) {
    const mf_qweight q = mf_param_qweight(t, i);
    mf_qweight_dequantize_f32(&q, 0, q.rows, out);
  } else if (p->frozen && frozen_bf16)
    for (int64_t j = 0; j < p->numel; j++) out[j] = mf_bf16_to_fp32(frozen_bf16[p->offset + j]);
  else
    memcpy(out, w + p->offset, (size_t)p->numel * sizeof *out);
  const int32_t ia = t->lora_a && i < t->n_base ? t->lora_a[i] : -1;
  if (ia < 0) return;
  const int64_t N = p->shape[0], K = p->shape[1], r = t->lora.rank;
  const float *A = w + t->params[ia].offset, *B = w + t->params[ia + 1].offset;
  const float s = (float)t->lora.scale;
  for (int64_t n = 0; n < N; n++)
    for (int64_t k = 0; k < K; k++) {
      float acc = 0.0f;
      for (int64_t j = 0; j < r; j++) acc += B[n * r + j] * A[j * K + k];
      out[n * K + k] += s * acc;
    }
}

/* Every LoRA target name mf_lora_target_roles knows, in a fixed order. */
static const char *const k_target_names[] = {
    "q_proj", "k_proj", "v_proj",   "o_proj",   "gate_proj",          "up_proj",  "down_proj", "w1",
    "w3",     "w2",     "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj"};
enum { N_TARGET_NAMES = sizeof k_target_names / sizeof k_target_names[0] };

int mf_lora_target_names(mf_family family, const char **names, int cap) {
  int n = 0;
  for (int j = 0; j < N_TARGET_NAMES && n < cap; j++)
    if (mf_lora_target_roles(family, k_target_names[j])) names[n++] = k_target_names[j];
  return n;
}

uint64_t mf_lora_adaptable_roles(mf_family family) {
  uint64_t r = 0;
  for (int j = 0; j < N_TARGET_NAMES; j++) r |= mf_lora_target_roles(family, k_target_names[j]);
  return r;
}

/* The HF module names of the adapted roles, each once, in a fixed order. */
static int64_t adapted_modules(const mf_param_table *t, const char **names, int64_t cap) {
  int64_t n = 0;
  for (int j = 0; j < N_TARGET_NAMES && n < cap; j++) {
    const uint64_t roles = mf_lora_target_roles(t->spec.family, k_target_names[j]);
    if (roles && (roles & t->lora.roles)) names[n++] = k_target_names[j];
  }
  return n;
}

/* The adapted modules as PEFT's target_modules, a JSON list's items ("a", "b")
 * in *out (malloc'd): the short names of adapted_modules, except that with a
 * hot set a name that also names routed experts (gate_proj, up_proj,
 * down_proj; Mixtral's w1, w3, w2) would adapt every expert, so its modules
 * are listed by their full names instead, each adapted one (the shared
 * expert's, the dense MLPs' and the hot experts'): PEFT adapts a module whose
 * name equals an entry or ends with "." and the entry. */
static mf_status target_modules_json(const mf_param_table *t, char **out) {
  const char *mods[16];
  const int64_t nm = adapted_modules(t, mods, 16);
  size_t cap = 64, at = 0;
  for (int64_t j = 0; j < nm; j++) cap += strlen(mods[j]) + 4;
  if (t->lora.hot)
    for (int64_t i = 0; i < t->n_base; i++) cap += t->lora_a[i] >= 0 ? strlen(t->params[i].name) + 4 : 0;
  char *list = NULL;
  MF_CHECK(mf_malloc(cap, "target_modules", (void **)&list));
  list[0] = 0;
  for (int64_t j = 0; j < nm; j++) {
    const uint64_t roles = mf_lora_target_roles(t->spec.family, mods[j]);
    if (!t->lora.hot || !(roles & MF_LORA_EXPERT_ROLES)) {
      at += (size_t)snprintf(list + at, cap - at, "%s\"%s\"", at ? ", " : "", mods[j]);
      continue;
    }
    for (int64_t i = 0; i < t->n_base; i++) {
      const mf_param *p = &t->params[i];
      if (t->lora_a[i] < 0 || !(roles & (MF_ROLE_BIT(p->role)))) continue;
      const int n = (int)(strlen(p->name) - strlen(".weight")); /* adapted weights end so (adapter_name) */
      at += (size_t)snprintf(list + at, cap - at, "%s\"%.*s\"", at ? ", " : "", n, p->name);
    }
  }
  *out = list;
  return MF_OK;
}

mf_status mf_params_save_adapter_dir(const mf_param_table *t, const float *w, const char *base_model,
                                     const char *dir) {
  if (!t->lora_a) return MF_ERR(MF_ERR_INVALID_ARG, "saving %s: the model has no LoRA adapters", dir);
  MF_CHECK(mf_mkdir_p(dir));
  /* the trained routers (train_router: PEFT's modules_to_save) and the adapters, in parameter order */
  mf_st_tensor *ts = (mf_st_tensor *)calloc((size_t)t->n, sizeof *ts);
  char(*names)[128] = (char(*)[128])calloc((size_t)t->n, sizeof *names);
  if (!ts || !names) {
    free(ts);
    free(names);
    return MF_ERR(MF_ERR_OUT_OF_MEMORY, "saving %s: out of memory", dir);
  }
  int64_t na = 0;
  for (int64_t i = 0; i < t->n; i++) {
    const mf_param *p = &t->params[i];
    if (p->frozen || (i < t->n_base && !trained_router(p->role))) continue;
    snprintf(names[na], sizeof names[na], "base_model.model.%s", p->name);
    ts[na].name = names[na];
    ts[na].dtype = MF_DTYPE_F32;
    ts[na].ndim = 2;
    ts[na].shape[0] = p->shape[0];
    ts[na].shape[1] = p->shape[1];
    ts[na].data = w + p->offset;
    na++;
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
  mf_status st = mf_safetensors_write(path, ts, (size_t)na, NULL, 0);
  free(ts);
  free(names);
  MF_CHECK(st);
  char *list = NULL, b[4200];
  MF_CHECK(target_modules_json(t, &list));
  /* the base's path as a JSON string ("" as PEFT writes for a model built from a config) */
  size_t at = 0;
  b[at++] = '"';
  for (const char *c = base_model ? base_model : ""; *c && at + 8 < sizeof b; c++) {
    if (*c == '"' || *c == '\\') b[at++] = '\\';
    if ((unsigned char)*c < 0x20) {
      at += (size_t)snprintf(b + at, sizeof b - at, "\\u%04x", (unsigned)(unsigned char)*c);
      continue;
    }
    b[at++] = *c;
  }
  b[at++] = '"';
  b[at] = 0;
  const size_t text_cap = strlen(list) + 8192;
  char *text = (char *)malloc(text_cap);
  if (!text) {
    free(list);
    return MF_ERR(MF_ERR_OUT_OF_MEMORY, "saving %s: out of memory", dir);
  }
  const int len = snprintf(text, text_cap,
                           "{\n"
                           "  \"alpha_pattern\": {},\n"
                           "  \"base_model_name_or_path\": %s,\n"
                           "  \"bias\": \"none\",\n"
                           "  \"fan_in_fan_out\": false,\n"
                           "  \"inference_mode\": true,\n"
                           "  \"init_lora_weights\": true,\n"
                           "  \"layers_pattern\": null,\n"
                           "  \"layers_to_transform\": null,\n"
                           "  \"lora_alpha\": %.17g,\n"
                           "  \"lora_dropout\": %.10g,\n"
                           "  \"modules_to_save\": %s,\n"
                           "  \"peft_type\": \"LORA\",\n"
                           "  \"r\": %lld,\n"
                           "  \"rank_pattern\": {},\n"
                           "  \"revision\": null,\n"
                           "  \"target_modules\": [%s],\n"
                           "  \"task_type\": \"CAUSAL_LM\",\n"
                           "  \"use_dora\": false,\n"
                           "  \"use_rslora\": false\n"
                           "}\n",
                           b, t->lora.scale * (double)t->lora.rank, t->lora.dropout,
                           !t->lora.train_router                 ? "null"
                           : t->spec.family == MF_FAMILY_MIXTRAL ? "[\"block_sparse_moe.gate\"]"
                                                                 : "[\"mlp.gate\"]",
                           (long long)t->lora.rank, list);
  snprintf(path, sizeof path, "%s/adapter_config.json", dir);
  st = mf_write_file_atomic(path, text, (size_t)len);
  free(text);
  free(list);
  return st;
}

/* Why adapter file tensor `name` (PEFT's, "base_model.model." and the
 * module's) is none of the adapters t's adapter_config.json describes. */
static const char *extra_reason(const mf_param_table *t, const char *name) {
  static const struct {
    const char *part, *why;
  } known[] = {
      {".lora_B.bias", "a bias on lora_B (PEFT's lora_bias), which moefit does not compute"},
      {".lora_magnitude_vector", "DoRA's magnitude vector (use_dora), which moefit does not compute"},
      {".lora_embedding_", "an adapter on an embedding, which moefit does not adapt"},
      {".lora_A.", NULL},
      {".lora_B.", NULL},
  };
  for (size_t k = 0; k < sizeof known / sizeof known[0]; k++)
    if (strstr(name, known[k].part))
      return known[k].why ? known[k].why
                          : "an adapter on a module adapter_config.json's target_modules does not adapt";
  const char *pre = "base_model.model.";
  const size_t np = strlen(pre);
  if (strncmp(name, pre, np) == 0 && mf_param_find(t, name + np) >= 0)
    return "a weight of the base, which the adapters leave frozen (only the routers are saved whole, with "
           "modules_to_save)";
  return "not a LoRA adapter of this model (PEFT names them base_model.model.MODULE.lora_A.weight and "
         ".lora_B.weight)";
}

mf_status mf_params_load_adapters(const mf_param_table *t, const char *dir, float *w) {
  if (!t->lora_a) return MF_ERR(MF_ERR_INVALID_ARG, "loading %s: the model has no LoRA adapters", dir);
  char path[4096];
  snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
  mf_safetensors *st = NULL;
  MF_CHECK(mf_safetensors_open(path, &st));
  mf_status rc = MF_OK;
  int64_t missing = 0, want = 0;
  char first[160] = "";
  for (int64_t i = 0; i < t->n && rc == MF_OK; i++) {
    const mf_param *p = &t->params[i];
    if (p->frozen || (i < t->n_base && !trained_router(p->role)))
      continue; /* the adapters and trained routers */
    char name[160];
    snprintf(name, sizeof name, "base_model.model.%s", p->name);
    want++;
    const mf_st_tensor *x = mf_safetensors_find(st, name);
    if (!x) {
      if (!missing++) snprintf(first, sizeof first, "%s", name);
      continue;
    }
    rc = read_tensor(path, p, name, x, w + p->offset);
  }
  if (rc == MF_OK && missing) {
    char more[64] = "";
    if (missing > 1) snprintf(more, sizeof more, " (and %lld more)", (long long)(missing - 1));
    rc = MF_ERR(MF_ERR_FORMAT,
                "%s: tensor %s is missing%s: adapter_config.json's r %lld and target_modules%s need it", path,
                first, more, (long long)t->lora.rank, t->lora.train_router ? " and modules_to_save" : "");
  }
  /* Every tensor of the file is one of those (then the counts agree): anything
   * else changes what the adapters compute. */
  const size_t n = mf_safetensors_count(st);
  for (size_t k = 0; k < n && rc == MF_OK && (int64_t)n != want; k++) {
    const char *name = mf_safetensors_get(st, k)->name;
    const char *pre = "base_model.model.";
    const size_t np = strlen(pre);
    const int32_t i = strncmp(name, pre, np) == 0 ? mf_param_find(t, name + np) : -1;
    if (i >= 0 && !t->params[i].frozen) continue;
    rc = MF_ERR(MF_ERR_UNSUPPORTED, "%s: tensor %s: %s; moefit refuses an adapter it would not compute whole",
                path, name, extra_reason(t, name));
  }
  mf_safetensors_close(st);
  return rc;
}

void mf_lora_describe(const mf_param_table *t, char *buf, size_t cap) {
  if (cap) buf[0] = 0;
  if (!t->lora_a) return;
  const char *mods[16];
  const int64_t nm = adapted_modules(t, mods, 16);
  char list[256] = "", a[32], b[32], c[32];
  size_t at = 0;
  for (int64_t j = 0; j < nm; j++)
    at += (size_t)snprintf(list + at, sizeof list - at, "%s%s", j ? ", " : "", mods[j]);
  int64_t weights = 0, frozen = 0;
  for (int64_t i = 0; i < t->n_base; i++) {
    weights += t->lora_a[i] >= 0;
    if (t->params[i].frozen) frozen += t->params[i].numel;
  }
  snprintf(
      buf, cap,
      "LoRA rank %lld, alpha %.6g (scale %.6g) on %s: %lld adapters on %lld weights; %s trained parameters "
      "(%.3g%% of %s), the base's %s frozen%s",
      (long long)t->lora.rank, t->lora.scale * (double)t->lora.rank, t->lora.scale, list,
      (long long)(t->n - t->n_base), (long long)weights,
      mf_format_count((double)t->trainable_numel, a, sizeof a),
      100.0 * (double)t->trainable_numel / (double)(t->total_numel > 0 ? t->total_numel : 1),
      mf_format_count((double)t->total_numel, b, sizeof b), mf_format_count((double)frozen, c, sizeof c),
      t->lora.train_router ? "; the routers trained whole" : "");
  if (t->base_quant != MF_QUANT_NONE) {
    int64_t nq = 0, qn = 0;
    for (int64_t i = 0; i < t->n_base; i++)
      if (t->params[i].quant) nq++, qn += t->params[i].numel;
    char fmt[96];
    format_text(t->base_quant, t->base_blocksize, t->base_nested, fmt, sizeof fmt);
    const size_t n = strlen(buf);
    snprintf(buf + n, cap - n, "; the base's %lld linear weights stored %s%s: %s at home (%s in bf16)",
             (long long)nq, fmt, t->base_shipped ? " as the checkpoint ships them" : "",
             mf_format_bytes((uint64_t)t->qhome_bytes, a, sizeof a),
             mf_format_bytes((uint64_t)qn * 2, b, sizeof b));
  }
  if (!t->lora.hot || !(t->lora.roles & MF_LORA_EXPERT_ROLES)) return;
  int64_t hot = 0, moe = 0, lo = -1, hi = 0;
  for (int64_t l = 0; l < t->spec.layers; l++) {
    if (mf_param_index(t, MF_P_EXPERT_GATE, l, 0) < 0) continue; /* a dense layer */
    int64_t h = 0;
    for (int64_t e = 0; e < t->spec.experts; e++) h += mf_lora_expert_hot(t, l, e);
    hot += h, moe++;
    lo = lo < 0 || h < lo ? h : lo;
    hi = h > hi ? h : hi;
  }
  const size_t n = strlen(buf);
  if (lo == hi)
    snprintf(buf + n, cap - n, "; routed experts: the %lld hot of %lld in each of %lld layers", (long long)hi,
             (long long)t->spec.experts, (long long)moe);
  else
    snprintf(buf + n, cap - n, "; routed experts: %lld hot of %lld in %lld layers (%lld to %lld a layer)",
             (long long)hot, (long long)(moe * t->spec.experts), (long long)moe, (long long)lo,
             (long long)hi);
}
