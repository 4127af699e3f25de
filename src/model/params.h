/*
 * The parameter table: every weight of a model spec with its Hugging Face name
 * (the on-disk, per-expert names of HF checkpoints), shape and role, in one fixed
 * order; and the host copy of the weights: one fp32 array, each parameter at
 * its offset.
 */
#ifndef MF_MODEL_PARAMS_H
#define MF_MODEL_PARAMS_H

#include <stdint.h>

#include "src/core/core.h"
#include "src/core/qformat.h"
#include "src/model/spec.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mf_param_role {
  MF_P_EMBED = 0, /* model.embed_tokens.weight [V,H] */
  MF_P_ATTN_NORM, /* input_layernorm [H] */
  MF_P_Q,         /* q_proj [Hq*D, H] */
  MF_P_Q_BIAS,    /* q_proj.bias [Hq*D] (qwen2_moe) */
  MF_P_K,         /* k_proj [Hkv*D, H] */
  MF_P_K_BIAS,
  MF_P_V, /* v_proj [Hkv*D, H] */
  MF_P_V_BIAS,
  MF_P_O,           /* o_proj [H, Hq*D] */
  MF_P_Q_NORM,      /* q_norm [D] (qwen3) or [Hq*D] (olmoe) */
  MF_P_K_NORM,      /* k_norm [D] or [Hkv*D] */
  MF_P_Q_A,         /* deepseek_v3 q_a_proj [q_lora_rank, H] */
  MF_P_Q_A_NORM,    /* q_a_layernorm [q_lora_rank] */
  MF_P_Q_B,         /* q_b_proj [Hq*D, q_lora_rank] */
  MF_P_KV_A,        /* kv_a_proj_with_mqa [kv_lora_rank + qk_rope_dim, H] */
  MF_P_KV_A_NORM,   /* kv_a_layernorm [kv_lora_rank] */
  MF_P_KV_B,        /* kv_b_proj [Hq*(qk_nope_dim + v_head_dim), kv_lora_rank] */
  MF_P_MLP_NORM,    /* post_attention_layernorm [H] */
  MF_P_ROUTER,      /* gate [E, H] */
  MF_P_ROUTER_BIAS, /* gate.e_score_correction_bias [E] (glm4_moe): a buffer of the checkpoint, always frozen
                     */
  MF_P_EXPERT_GATE, /* experts.e gate_proj / w1 [I, H] */
  MF_P_EXPERT_UP,   /* experts.e up_proj / w3 [I, H] */
  MF_P_EXPERT_DOWN, /* experts.e down_proj / w2 [H, I] */
  MF_P_SHARED_GATE, /* shared_expert.gate_proj [Is, H] (qwen2_moe; glm4_moe: shared_experts.gate_proj) */
  MF_P_SHARED_UP,
  MF_P_SHARED_DOWN,        /* [H, Is] */
  MF_P_SHARED_EXPERT_GATE, /* shared_expert_gate [1, H] (qwen2_moe) */
  MF_P_DENSE_GATE,         /* mlp.gate_proj [Id, H] (dense layers) */
  MF_P_DENSE_UP,
  MF_P_DENSE_DOWN,
  MF_P_FINAL_NORM, /* model.norm [H] */
  MF_P_LM_HEAD,    /* lm_head [V, H] (absent when tied) */
  /* gpt-oss */
  MF_P_O_BIAS,             /* o_proj.bias [H] */
  MF_P_SINKS,              /* self_attn.sinks [Hq]: each head's sink logit */
  MF_P_ROUTER_LINEAR_BIAS, /* mlp.router.bias [E] (trained, unlike MF_P_ROUTER_BIAS) */
  MF_P_EXPERT_GATE_BIAS,   /* the experts' gate biases [E, I] (gate_up_proj_bias's even columns) */
  MF_P_EXPERT_UP_BIAS,     /* their up biases [E, I] (its odd columns) */
  MF_P_EXPERT_DOWN_BIAS,   /* mlp.experts.down_proj_bias [E, H] */
  MF_P_LORA_A,             /* a LoRA adapter's down projection [r, in] of the weight it adapts */
  MF_P_LORA_B,             /* its up projection [out, r] */
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
  int64_t toff;   /* in floats, into the trained parameters' arrays (gradient sums, AdamW moments): the
                     trained parameters in order, so = offset without LoRA; -1 when frozen */
  int32_t base;   /* a LoRA adapter (MF_P_LORA_A/B): the weight it adapts; else -1 */
  uint8_t frozen; /* not trained: no gradient, no optimizer state (the base under LoRA) */
  /* A frozen weight stored quantized (mf_param_table_quantize_base): its
   * mf_quant_kind (0: none), and its blob (src/core/qformat.h) at qoff bytes
   * into the table's quantized home, qbytes long. */
  uint8_t quant;
  int64_t qoff, qbytes;
} mf_param;

/* LoRA (train.lora): low-rank adapters over a frozen base. For each adapted
 * weight W [out, in] two trainable parameters, A [rank, in] and B [out, rank],
 * named as PEFT names the modules' (W's name with ".weight" replaced by
 * ".lora_A.weight" and ".lora_B.weight"); the layer computes
 * y = x W^T + scale * (x A^T) B^T, scale = alpha / rank (PEFT's lora_alpha /
 * r). Every base weight is frozen except the routers with train_router. */
typedef struct mf_lora {
  int64_t rank;     /* 0: no adapters, every weight trained */
  double scale;     /* alpha / rank */
  uint64_t roles;   /* MF_ROLE_BIT(role) for each adapted role */
  int train_router; /* the routers (MF_P_ROUTER) trained fully */
  double dropout;   /* on each adapter's input in training, in [0, 1) (PEFT's lora_dropout) */
  /* [layers * experts]: 1 for a routed expert whose adapted projections get
   * adapters (train.lora.experts: hot), 0 for the others, whose rows pass
   * through the base alone; NULL: every routed expert (experts: all). The
   * table keeps its own copy (mf_param_table_add_lora). */
  uint8_t *hot;
} mf_lora;

typedef struct mf_param_table {
  mf_model_spec spec;
  mf_param *params;
  int64_t n;
  int64_t total_numel;
  int32_t *by_layer;                  /* [layers][MF_P_ROLE_COUNT_] -> index or -1 (non-expert roles) */
  int32_t *experts;                   /* [layers][E][3] -> index of gate, up, down, or -1 (dense layers) */
  int32_t embed, final_norm, lm_head; /* lm_head = -1 when tied */
  /* LoRA (mf_param_table_add_lora): the adapters follow the model's n_base
   * parameters, A then B of each adapted weight in the weights' order. */
  mf_lora lora;
  int64_t n_base;          /* the model's own parameters (= n without adapters) */
  int32_t *lora_a;         /* [n_base] the index of weight i's A adapter (B is the next), or -1; NULL: none */
  int64_t trainable_numel; /* elements of the parameters not frozen: the length of the gradient and moment
                              arrays */
  /* LoRA's frozen base stored quantized (mf_param_table_quantize_base): the
   * format, NF4's block size and double quantization, and the quantized home
   * that holds every quantized weight's blob (the table owns it; its pages are
   * written at load). NONE: the base is kept in its float dtype. */
  mf_quant_kind base_quant;
  int64_t base_blocksize;
  int base_nested;
  int base_shipped; /* the quantized weights read as the checkpoint ships them (mf_run_quantize_base) */
  uint8_t *qhome;
  int qhome_borrowed; /* qhome is memory of the caller's (mf_param_table_borrow_qhome), not freed */
  int64_t qhome_bytes;
} mf_param_table;

mf_status mf_param_table_build(const mf_model_spec *spec, mf_param_table **out);

/* Where a parameter sits in an HF checkpoint that stores it as a part of a
 * larger tensor: gpt-oss keeps all of a layer's experts in one tensor each,
 * as x @ W ([in, out]), gate and up interleaved in gate_up_proj [E, H, 2I]
 * (gate the even columns), down_proj [E, I, H], gate_up_proj_bias [E, 2I].
 * moefit holds each expert's gate, up and down as nn.Linear weights ([out,
 * in]) and the biases per projection: element (r, c) of the parameter is
 * element base + r * rs + c * cs of the tensor `name` (shape[ndim]). */
typedef struct mf_param_src {
  char name[96];
  int ndim;
  int64_t shape[3];
  int64_t base, rs, cs;
} mf_param_src;
/* 1 and *src when parameter i is such a part; 0 when it is stored under its own name. */
int mf_param_packed(const mf_param_table *t, int64_t i, mf_param_src *src);
/* 1 when `name` is a tensor the parameters of t are parts of (mf_param_packed). */
int mf_param_pack_name(const mf_param_table *t, const char *name);
void mf_param_table_free(mf_param_table *t); /* NULL is fine */
/* The roles a LoRA target names for `family` (an HF module name: q_proj, k_proj,
 * v_proj, o_proj; gate_proj, up_proj, down_proj: the routed experts', the
 * shared expert's and the dense MLPs' projections; Mixtral's experts w1 (gate),
 * w3 (up), w2 (down)), as role bits; 0 for a name the family does not have. */
uint64_t mf_lora_target_roles(mf_family family, const char *name);
/* Every target name `family` has (q_proj, k_proj, v_proj, o_proj, then its
 * MLP projections), at most cap of them, in a fixed order; returns how many. */
int mf_lora_target_names(mf_family family, const char **names, int cap);
/* The roles of every target name `family` has (the union of mf_lora_target_roles). */
uint64_t mf_lora_adaptable_roles(mf_family family);
/* Adds the adapters `l` asks for to t (built by mf_param_table_build, no
 * adapters yet) and freezes the base: rank in [1, 4096], at least one
 * adapted weight (else MF_ERR_CONFIG naming what the model lacks). rank 0
 * leaves t as it is. */
mf_status mf_param_table_add_lora(mf_param_table *t, const mf_lora *l);
/* Whether routed expert e of layer l gets adapters (its projections that
 * lora.roles names): always without a hot set. */
static inline int mf_lora_expert_hot(const mf_param_table *t, int64_t layer, int64_t e) {
  return !t->lora.hot || t->lora.hot[layer * t->spec.experts + e];
}
/* The routed-expert roles' bits (MF_P_EXPERT_GATE, _UP, _DOWN). */
/* A role's bit in a set of roles (mf_lora.roles): there are more than 32 roles. */
#define MF_ROLE_BIT(r) ((uint64_t)1 << (r))
#define MF_LORA_EXPERT_ROLES \
  (MF_ROLE_BIT(MF_P_EXPERT_GATE) | MF_ROLE_BIT(MF_P_EXPERT_UP) | MF_ROLE_BIT(MF_P_EXPERT_DOWN))
/* Stores LoRA's frozen base quantized (t has its adapters: mf_param_table_add_lora):
 * every frozen 2-D weight but the embedding and the LM head (what transformers
 * replaces with bitsandbytes' Linear4bit: attention projections, routers,
 * experts, shared experts and their gate, dense MLPs) gets `kind` (NF4 in
 * blocks of `blocksize`, double quantized when `nested`; FP8 in 128 x 128
 * blocks), and their blobs are laid out in the quantized home (qhome_bytes;
 * nothing is allocated: `moefit plan` sizes a base it never holds). MF_ERR_CONFIG
 * for a table without adapters (a full fine-tune trains every weight) or a
 * format that is not made at load (MXFP4). NONE leaves t as it is. */
mf_status mf_param_table_quantize_base(mf_param_table *t, mf_quant_kind kind, int64_t blocksize, int nested);
/* The same for the weights which[i] != 0 marks among those (NULL: all of them). */
mf_status mf_param_table_quantize_set(mf_param_table *t, mf_quant_kind kind, int64_t blocksize, int nested,
                                      const uint8_t *which);
/* A checkpoint shipped quantized (`path` as mf_safetensors_open takes it):
 * which[i] (t->n_base of them) = weight i is one mf_param_table_quantize_base
 * quantizes and the file stores it as `kind` (mf_shipped_kind: NF4 from
 * bitsandbytes, FP8), and *blocksize the first such weight's NF4 block size
 * (*found = 1; 0: none is). */
mf_status mf_params_shipped_layout(const mf_param_table *t, const char *path, mf_quant_kind kind,
                                   uint8_t *which, int64_t *blocksize, int *found);
/* Allocates the quantized home mf_param_table_quantize_base laid out (its
 * pages written at load); nothing without a quantized base, or when it is there. */
mf_status mf_param_table_alloc_qhome(mf_param_table *t);
/* The quantized home in mem[qhome_bytes] of the caller's (the node's shared
 * memory, where several ranks hold one copy), outliving t; one the table
 * allocated is freed. */
void mf_param_table_borrow_qhome(mf_param_table *t, uint8_t *mem);
/* Weight i's stored form (its blob in the quantized home); i must be quantized. */
mf_qweight mf_param_qweight(const mf_param_table *t, int64_t i);
/* Quantizes every quantized weight from its fp32 values in w (the table's
 * layout) into the quantized home (after mf_params_init_random: a random base). */
mf_status mf_params_quantize_from(const mf_param_table *t, const float *w);
/* Whether a run keeps LoRA's frozen base at home in bf16 alone, with no fp32
 * copy (2 bytes a parameter): with bf16 device storage (the device reads
 * the bf16 working copy) and one rank (several share one fp32 home). */
static inline int mf_lora_base_bf16(const mf_param_table *t, mf_dtype storage, int64_t ranks) {
  return t->lora_a && storage == MF_DTYPE_BF16 && ranks <= 1;
}
/* Whether parameter i is trained (has a gradient and optimizer state). */
static inline int mf_param_trained(const mf_param_table *t, int64_t i) {
  return !t->params[i].frozen;
}

/* Index of a layer's parameter of `role` (expert: 0..E-1 for the expert roles,
 * else ignored), or -1 when the layer has none. */
int32_t mf_param_index(const mf_param_table *t, mf_param_role role, int64_t layer, int64_t expert);
int32_t mf_param_find(const mf_param_table *t, const char *name); /* -1 when absent */
/* The parameter whose weights the LM head uses (lm_head, or embed when tied). */
int32_t mf_param_lm_head(const mf_param_table *t);

/* Random init as transformers' _init_weights: linear and embedding weights
 * ~ N(0, std) (transformers' initializer_range 0.02), biases 0, norm weights 1.
 * Deterministic from the seed: each parameter draws from its own stream, so
 * the result does not depend on threads or order. w holds total_numel floats.
 * LoRA adapters are left alone (mf_params_init_adapters). */
void mf_params_init_random(const mf_param_table *t, uint64_t seed, float std, float *w);
/* The same, a frozen parameter (LoRA's base) put into frozen_bf16 instead (the
 * table's layout, rounded to nearest even) when that is not NULL, its part of
 * w left untouched: a bf16 base at home with no fp32 copy ever whole; the
 * parameters shared out over the pool's threads (NULL: this one), the same
 * bits for any count. */
void mf_params_init_random_home(const mf_param_table *t, uint64_t seed, float std, float *w,
                                uint16_t *frozen_bf16, mf_threadpool *pool);
/* The LoRA adapters' initial values, as PEFT's default: A ~ U(-1/sqrt(in),
 * 1/sqrt(in)) (kaiming_uniform with a = sqrt(5)), B = 0, so the adapted model
 * starts equal to the base. Deterministic from the seed, per adapter. */
void mf_params_init_adapters(const mf_param_table *t, uint64_t seed, float *w);
/* Loads every parameter from a safetensors file / sharded set / model dir into
 * w (F32, BF16 or F16 on disk, converted to fp32). A missing tensor or a shape
 * mismatch is an error naming the file and the tensor; tensors the model does
 * not use are listed in a warning. LoRA adapters are not read (the base's
 * file has none). */
mf_status mf_params_load(const mf_param_table *t, const char *path, float *w);
/* The same with a bf16 home for the frozen parameters (mf_params_init_random_home). */
mf_status mf_params_load_home(const mf_param_table *t, const char *path, float *w, uint16_t *frozen_bf16);
/* Writes DIR/config.json and DIR/model.safetensors (fp32): the model's own
 * parameters, LoRA's adapted weights merged (mf_params_merged). */
mf_status mf_params_save_model_dir(const mf_param_table *t, const float *w, const char *dir);

/* LoRA. Weight i (of the model's own) with its adapter merged in: W + scale B A
 * (fp32, the sum over the rank in order), into out (numel floats); a weight
 * without an adapter is copied as it is. A frozen W is read from its bf16
 * home when frozen_bf16 is not NULL, else from w; a quantized one is its blob
 * dequantized to fp32 (as PEFT's merge over a 4-bit base dequantizes). */
void mf_params_merged(const mf_param_table *t, const float *w, const uint16_t *frozen_bf16, int64_t i,
                      float *out);
/* An HF model dir of the model's own parameters: DIR/config.json (torch_dtype
 * `dtype`: F32 or BF16) and model.safetensors, or over max_shard_bytes (0: no
 * limit) shards and model.safetensors.index.json (as save_pretrained; *shards
 * their count, *bytes the tensor bytes; either may be NULL). LoRA's adapted
 * weights merged, frozen ones from frozen_bf16 when not NULL: each tensor made
 * when the file reaches it (mf_st_tensor.fill), so no second copy of the
 * model is ever in memory. */
mf_status mf_params_write_model(const mf_param_table *t, const float *w, const uint16_t *frozen_bf16,
                                mf_dtype dtype, const char *dir, uint64_t max_shard_bytes, size_t *shards,
                                uint64_t *bytes);
/* A PEFT adapter directory: DIR/adapter_model.safetensors (fp32, PEFT's
 * names: "base_model.model." and the adapter's) and DIR/adapter_config.json
 * (peft_type LORA, r, lora_alpha, target_modules, ...; base_model_name_or_path
 * `base_model`, "" when NULL), which PeftModel.from_pretrained loads onto the
 * base (tools/check_peft_adapter.py). With train_router the routers are in
 * it too, as PEFT saves modules_to_save ("mlp.gate", Mixtral's
 * "block_sparse_moe.gate": a suffix no other module has). */
mf_status mf_params_save_adapter_dir(const mf_param_table *t, const float *w, const char *base_model,
                                     const char *dir);
/* DIR/adapter_config.json (PEFT's, as save_pretrained and
 * mf_params_save_adapter_dir write it) as the mf_lora of the model of t (a
 * table without adapters): peft_type LORA, r, lora_alpha, target_modules
 * (each a name of mf_lora_target_roles, or a full module name such as
 * "model.layers.3.mlp.experts.5.gate_proj": the routed experts named so are
 * the hot set, out->hot, malloc'd, which the caller frees; other roles named
 * so must be named in every layer), modules_to_save null or the routers
 * (train_router). What changes PEFT's maths in ways moefit does not compute
 * (use_rslora, use_dora, bias, lora_bias, fan_in_fan_out, layers_to_transform,
 * layer_replication, rank or alpha patterns, use_qalora,
 * alora_invocation_tokens, ...) is refused, naming the file, the key and
 * what it would change. */
mf_status mf_lora_read_adapter_config(const char *dir, const mf_param_table *t, mf_lora *out);
/* DIR/adapter_config.json's base_model_name_or_path into buf ("" when absent or not a string). */
mf_status mf_lora_read_adapter_base(const char *dir, char *buf, size_t cap);
/* The adapters (and trained routers) from DIR/adapter_model.safetensors (PEFT's names, F32/BF16/F16):
 * exactly those. A missing tensor or another shape is MF_ERR_FORMAT naming the file and tensor (and
 * how many more are missing); a tensor more (a bias on lora_B, DoRA's magnitude, an adapter on a module
 * target_modules does not adapt, a base weight) MF_ERR_UNSUPPORTED naming it and why. */
mf_status mf_params_load_adapters(const mf_param_table *t, const char *dir, float *w);
/* One line for people: "LoRA rank 8, alpha 16 (scale 2) on q_proj, ...: 36
 * adapters on 18 weights; 53.2K trained parameters (10.5% of 505K), the
 * base's 452K frozen"; "" without adapters. */
void mf_lora_describe(const mf_param_table *t, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif

#endif /* MF_MODEL_PARAMS_H */
