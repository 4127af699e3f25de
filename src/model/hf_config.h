/*
 * Hugging Face `config.json` <-> mf_model_spec, for the MoE families of
 * src/model/spec.h. The reference is transformers
 * MF_HF_TRANSFORMERS_VERSION: a config loads to the model that version builds
 * from it, and a written config builds, in that version, the model the spec
 * describes.
 *
 * Reading rules:
 * - The family comes from `architectures[0]`, or `model_type` when there is no
 *   architecture; both, when present, must agree.
 * - A key is read only if transformers reads it for that family; other keys are
 *   ignored (HF configs carry many).
 * - The dims that shape the checkpoint's tensors are required (hidden_size,
 *   num_hidden_layers, num_attention_heads, vocab_size, intermediate_size, the
 *   expert count and, for Qwen, moe_intermediate_size and the shared-expert
 *   size): a transformers default for them would silently describe a different
 *   model. Every other key, when absent, takes the family's transformers
 *   default (mf_model_spec_defaults).
 * - num_key_value_heads null means num_attention_heads for Mixtral and OLMoE
 *   (their backward-compatibility rule); an absent one takes the family
 *   default (OLMoE: num_attention_heads; Mixtral 8, Qwen2-MoE 16, Qwen3-MoE 4).
 * - head_dim: Mixtral and Qwen3-MoE read it (Mixtral: null or 0 means
 *   hidden_size / num_attention_heads); Qwen2-MoE and OLMoE require it to equal
 *   hidden_size / num_attention_heads if present.
 * - Settings that change the maths and that moefit does not implement are
 *   MF_ERR_UNSUPPORTED, never ignored: rope_scaling (other than rope_type
 *   "default"), partial_rotary_factor != 1 (but for GLM-4.5, which reads it:
 *   RoPE on int(head_dim * factor) dims), sliding-window attention (Mixtral
 *   `sliding_window`, Qwen `use_sliding_window`), `attention_bias` where the
 *   family reads it (Qwen3-MoE, OLMoE), hidden_act other than silu,
 *   attention_dropout > 0.
 * - quantization_config: bitsandbytes 4-bit NF4 (load_in_4bit,
 *   bnb_4bit_quant_type nf4, uint8 storage; double quantization or not) is
 *   and fp8 (quant_method "fp8": fmt e4m3, weight_block_size [128, 128],
 *   activation_scheme dynamic; each absent is FineGrainedFP8Config's default)
 *   are read as shipped (mf_hf_config_load_quant says so); any other method,
 *   8-bit, fp4 (bnb_4bit_quant_type's default when absent), another packed
 *   storage, fp8 block size or format, or static activation scales is
 *   MF_ERR_UNSUPPORTED naming the key.
 * - A wrong JSON type, a value out of range or an inconsistent pair of keys is
 *   MF_ERR_FORMAT with the message "FILE: KEY: fault" (invalid JSON:
 *   "FILE: line L, column C: fault"). The relations the model spec checks
 *   (mf_model_spec_validate: e.g. GLM-4.5's rotary dims must be even, its
 *   expert groups hold 2 or more and top_k) are MF_ERR_CONFIG "FILE: fault",
 *   naming the keys.
 * - GLM-4.5 (glm4_moe) requires intermediate_size, moe_intermediate_size and
 *   n_routed_experts; reads n_shared_experts (the shared MLP is
 *   moe_intermediate_size times it), n_group, topk_group,
 *   routed_scaling_factor, first_k_dense_replace, norm_topk_prob,
 *   attention_bias, use_qk_norm, head_dim (absent: hidden_size /
 *   num_attention_heads; null refused) and partial_rotary_factor; not
 *   router_aux_loss_coef (its loss has none); num_nextn_predict_layers (the
 *   multi-token-prediction layer) is no part of the model.
 * - gpt-oss (gpt_oss) requires intermediate_size (the experts') and
 *   num_local_experts; reads attention_bias (the q/k/v and the o biases
 *   together; absent: true), head_dim (absent: GptOssConfig's 64; null:
 *   hidden_size / num_attention_heads), sliding_window (at least 1; null is
 *   refused: transformers builds its mask for every model), layer_types (one
 *   "sliding_attention" or "full_attention" a layer; absent or null: the even
 *   layers slide) and rope_scaling (null or yarn; absent: GptOssConfig's yarn,
 *   factor 32 over 4096, truncate false). swiglu_limit other than 7 is
 *   MF_ERR_UNSUPPORTED (transformers ignores the key and clamps at 7).
 * - quantization_config "mxfp4" (the published gpt-oss experts) is read as
 *   shipped for gpt_oss (mf_hf_quant kind MF_QUANT_MXFP4), refused for the
 *   other families.
 */
#ifndef MF_MODEL_HF_CONFIG_H
#define MF_MODEL_HF_CONFIG_H

#include <stddef.h>

#include <jansson.h>

#include "src/core/core.h"
#include "src/core/qformat.h"
#include "src/model/spec.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The transformers release the mapping was checked against (tools/make_hf_configs.py)
 * and that written configs name in `transformers_version`. */
#define MF_HF_TRANSFORMERS_VERSION "4.57.6"

/* Largest config.json read (real ones are a few KiB). */
#define MF_HF_CONFIG_MAX_BYTES ((size_t)16 << 20)

/* `path` is a config.json file or a directory holding one. On success *out is
 * a validated spec (mf_model_spec_validate); on failure *out is unchanged. */
mf_status mf_hf_config_load(const char *path, mf_model_spec *out);

/* How a checkpoint stores its weights (config.json quantization_config). */
typedef struct mf_hf_quant {
  mf_quant_kind kind; /* MF_QUANT_NONE: its float dtype */
  int nested;         /* NF4: bnb_4bit_use_double_quant */
  char method[32];    /* "bitsandbytes", "fp8", "mxfp4", or "" */
} mf_hf_quant;

/* mf_hf_config_load, and (quant not NULL) how the weights are stored. */
mf_status mf_hf_config_load_quant(const char *path, mf_model_spec *out, mf_hf_quant *quant);

/* The same from text in memory; `where` names the source in messages. */
mf_status mf_hf_config_parse(const char *text, size_t len, const char *where, mf_model_spec *out);

/* Writes `s` as a config.json with torch_dtype "float32". `path` is the file to
 * write, or an existing directory to write config.json into. The write is
 * atomic (temporary file, fsync, rename): a failure leaves an older file as it
 * was. A spec that transformers cannot express (a field the family does not
 * have set to a non-neutral value, e.g. clip_qkv on Mixtral) is
 * MF_ERR_UNSUPPORTED naming the field. */
mf_status mf_hf_config_write(const mf_model_spec *s, const char *path);

/* The same with torch_dtype from `dtype`: MF_DTYPE_F32 "float32",
 * MF_DTYPE_BF16 "bfloat16", MF_DTYPE_F16 "float16". */
mf_status mf_hf_config_write_dtype(const mf_model_spec *s, mf_dtype dtype, const char *path);

/* The text mf_hf_config_write_dtype writes, in a malloc'ed NUL-terminated
 * buffer the caller frees. */
mf_status mf_hf_config_format(const mf_model_spec *s, mf_dtype dtype, char **out_text);

/* The generation_config.json transformers' save_pretrained writes beside
 * config.json for s's family (GenerationConfig.from_model_config: the token
 * ids the family's config defaults to), in a malloc'ed NUL-terminated buffer
 * the caller frees. */
mf_status mf_hf_generation_config_format(const mf_model_spec *s, char **out_text);

/* Files moefit writes about a model (plans, routing statistics) record its
 * shape as a "model" section; checking one against spec s: an object with exactly keys[0..n),
 * keys[0] "family" naming s's family, keys[1..n) non-negative integers equal to
 * want[1..n). A mismatch is MF_ERR_CONFIG: "<made> family F, the model is G"
 * and "<made_with> KEY V, the model has W" ("the plan was made for"). */
mf_status mf_model_json_check(const char *path, const json_t *root, const mf_model_spec *s,
                              const char *const *keys, const int64_t *want, int n, const char *made,
                              const char *made_with);

#ifdef __cplusplus
}
#endif

#endif /* MF_MODEL_HF_CONFIG_H */
