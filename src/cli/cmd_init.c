/* `moefit init`: a randomly initialised model directory that transformers loads. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/cli/commands.h"
#include "src/model/hf_tokenizer.h"
#include "src/model/params.h"

static const char k_usage[] =
    "usage: moefit init --family F --preset tiny|small --out DIR [--seed N]\n\n"
    "Writes DIR/config.json and DIR/model.safetensors (fp32) for a random model that\n"
    "transformers loads (AutoModelForCausalLM.from_pretrained(DIR)) and `model.path: DIR`\n"
    "trains. Weights ~ N(0, 0.02), norms 1, as transformers initialises them.\n"
    "Beside them a byte-level tokenizer (tokenizer.json, tokenizer_config.json with a ChatML\n"
    "chat template, special_tokens_map.json) that AutoTokenizer.from_pretrained(DIR) and\n"
    "tools/prepare_data.py --tokenizer DIR read: byte b is token b (the ids `moefit data bytes`\n"
    "writes), then <|endoftext|> 256 (pad), <|im_start|> 257, <|im_end|> 258 (eos).\n\n"
    "families: mixtral, qwen2_moe, qwen3_moe, olmoe, glm4_moe, deepseek_v3, gpt_oss\n"
    "presets:  tiny   hidden 64, 2 layers, 4 heads / 2 kv, 8 experts top-2, expert ffn 128, vocab 272\n"
    "          small  hidden 512, 8 layers, 8 heads / 4 kv, 16 experts top-2, expert ffn 1024, vocab 32000\n"
    "Qwen2-MoE gets a shared expert and a dense first layer; Qwen3-MoE and OLMoE their q/k norms;\n"
    "GLM-4.5 (glm4_moe) a shared expert, a dense first layer, its sigmoid router and RoPE on half of each "
    "head;\n"
    "gpt-oss its sinks, biases, clamped SwiGLU, a sliding window of 64 on layer 0 and YaRN.\n";

static void preset(mf_family f, int small, mf_model_spec *s) {
  mf_model_spec_defaults(f, s);
  s->hidden = small ? 512 : 64;
  s->layers = small ? 8 : 2;
  s->heads = small ? 8 : 4;
  s->kv_heads = small ? 4 : 2;
  s->head_dim = s->hidden / s->heads;
  s->experts = small ? 16 : 8;
  s->top_k = 2;
  s->expert_ffn = small ? 1024 : 128;
  s->vocab = small ? 32000 : 272; /* the 256 bytes, the tokenizer's 3 special tokens, 13 spare */
  s->max_seq = 4096;
  s->rope_theta = f == MF_FAMILY_OLMOE ? 10000.0 : 1e6;
  if (f == MF_FAMILY_QWEN2_MOE) {
    s->shared_ffn = 2 * s->expert_ffn;
    s->dense_ffn = 2 * s->expert_ffn;
    s->n_mlp_only = 1;
    s->mlp_only_layers[0] = 0;
  }
  if (f == MF_FAMILY_QWEN3_MOE) {
    s->dense_ffn = 2 * s->expert_ffn;
    s->norm_topk_prob = 1;
  }
  if (f == MF_FAMILY_DEEPSEEK_V3) { /* Moonlight's choices at this size: one group, latent attention */
    s->kv_heads = s->heads;
    s->q_lora_rank = small ? 256 : 32, s->kv_lora_rank = small ? 128 : 32;
    s->qk_nope_dim = small ? 64 : 16, s->qk_rope_dim = small ? 32 : 8, s->v_head_dim = small ? 64 : 16;
    s->head_dim = s->qk_nope_dim + s->qk_rope_dim;
    s->n_group = 1, s->topk_group = 1;
  }
  if (f == MF_FAMILY_GPT_OSS) { /* the even layers slide (GptOssConfig's layer_types) */
    s->sliding_window = 64;
    for (int64_t l = 0; l < s->layers; l++) s->sliding_layers[l] = l % 2 == 0;
    s->yarn_factor = 8, s->yarn_original_max = 512; /* YaRN as gpt-oss's: 512 x 8 = max_seq */
  }
  if (f == MF_FAMILY_GLM4_MOE || f == MF_FAMILY_DEEPSEEK_V3) { /* one shared expert, layer 0 dense */
    s->shared_ffn = s->expert_ffn;
    s->dense_ffn = 2 * s->expert_ffn;
    s->first_dense = 1;
  }
}

int mf_cli_init(int argc, char **argv) {
  if (mf_cli_wants_help(argc, argv)) {
    printf("%s", k_usage);
    return MF_EXIT_OK;
  }
  const char *family = NULL, *pre = "tiny", *out = NULL;
  unsigned long long seed = 1;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (i + 1 >= argc) return mf_cli_usage_error("init", "'%s' needs a value", a);
    const char *v = argv[++i];
    if (strcmp(a, "--family") == 0) {
      family = v;
    } else if (strcmp(a, "--preset") == 0) {
      pre = v;
    } else if (strcmp(a, "--out") == 0) {
      out = v;
    } else if (strcmp(a, "--seed") == 0) {
      /* digits only: strtoull alone takes "-1" as 2^64 - 1 and " 7" as 7 */
      errno = 0;
      if (!*v || strspn(v, "0123456789") != strlen(v) || (seed = strtoull(v, NULL, 10), errno == ERANGE))
        return mf_cli_usage_error("init", "--seed must be an integer from 0 to %llu (got '%s')", ULLONG_MAX,
                                  v);
    } else {
      return mf_cli_usage_error("init", "unknown option '%s'", a);
    }
  }
  if (!family || !out) return mf_cli_usage_error("init", "--family and --out are required");
  mf_family f = mf_family_from_name(family);
  if (f == MF_FAMILY_INVALID)
    return mf_cli_usage_error(
        "init", "unknown family '%s' (mixtral, qwen2_moe, qwen3_moe, olmoe, glm4_moe, deepseek_v3, gpt_oss)",
        family);
  if (strcmp(pre, "tiny") != 0 && strcmp(pre, "small") != 0)
    return mf_cli_usage_error("init", "unknown preset '%s' (tiny, small)", pre);
  mf_model_spec s;
  preset(f, strcmp(pre, "small") == 0, &s);
  s.seed = seed;
  mf_param_table *t = NULL;
  mf_status st = mf_param_table_build(&s, &t);
  if (st != MF_OK) return mf_cli_fail("init", st);
  float *w = NULL;
  st = mf_malloc((size_t)t->total_numel * sizeof(float), "the model's weights", (void **)&w);
  if (st == MF_OK) {
    mf_params_init_random(t, seed, 0.02f, w);
    st = mf_params_save_model_dir(t, w, out);
  }
  if (st == MF_OK) st = mf_hf_byte_tokenizer_write(out, s.vocab, s.max_seq);
  if (st == MF_OK) {
    int64_t total = 0, active = 0;
    mf_model_spec_param_count(&s, &total, &active);
    char n[32];
    printf("moefit init: %s %s model, %s parameters (%lld tensors), seed %llu -> %s/\n", family, pre,
           mf_format_count((double)total, n, sizeof n), (long long)t->n, seed, out);
  }
  free(w);
  mf_param_table_free(t);
  return st == MF_OK ? MF_EXIT_OK : mf_cli_fail("init", st);
}
