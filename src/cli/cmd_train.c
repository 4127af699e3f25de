/* `moefit train CONFIG [key=value ...]`: today it loads and checks everything a
 * run needs (config, model, token files) and reports it; the training loop
 * itself comes with the model work, and until then this says so and fails. */
#include <stdio.h>
#include <string.h>

#include "src/cli/commands.h"
#include "src/config/config.h"
#include "src/io/hf_config.h"
#include "src/io/safetensors.h"
#include "src/io/tokens.h"
#include "src/model/spec.h"

static const char k_usage[] =
    "usage: moefit train CONFIG [key=value ...]\n"
    "       mpirun -np N moefit train CONFIG [key=value ...]\n\n"
    "Fine-tunes CONFIG's model on its token files. key=value pairs override the file\n"
    "(e.g. train.lr=1e-4 memory.device_budget=24GiB); `moefit config --help` lists the keys.\n"
    "Progress goes to stderr, metrics to OUTPUT_DIR/metrics.jsonl.\n";

static void print_model(const mf_model_spec *s, const char *origin) {
  int64_t total = 0, active = 0;
  mf_model_spec_param_count(s, &total, &active);
  int64_t moe = 0;
  for (int64_t l = 0; l < s->layers; l++) moe += mf_model_spec_layer_is_moe(s, l);
  fprintf(stderr,
          "model: %s (%s): %lld layers (%lld MoE), hidden %lld, %lld heads / %lld kv, %lld experts top-%lld, "
          "expert ffn %lld, vocab %lld; %.3fM parameters, %.3fM active per token\n",
          mf_family_name(s->family), origin, (long long)s->layers, (long long)moe, (long long)s->hidden,
          (long long)s->heads, (long long)s->kv_heads, (long long)s->experts, (long long)s->top_k,
          (long long)s->expert_ffn, (long long)s->vocab, (double)total / 1e6, (double)active / 1e6);
}

/* Opens and validates a token file against the model's vocabulary. */
static mf_status check_tokens(const char *role, const char *path, const mf_model_spec *s, int64_t seq_len) {
  mf_tokens *t = NULL;
  MF_CHECK(mf_tokens_open(path, &t));
  mf_tokens_stats st;
  mf_status rc = mf_tokens_compute_stats(t, &st);
  if (rc == MF_OK && (int64_t)mf_tokens_vocab(t) > s->vocab)
    rc = MF_ERR(MF_ERR_CONFIG, "%s: vocabulary %u is larger than the model's (%lld)", path, mf_tokens_vocab(t),
                (long long)s->vocab);
  if (rc == MF_OK && (int64_t)mf_tokens_count(t) < seq_len + 1)
    rc = MF_ERR(MF_ERR_CONFIG, "%s: %llu tokens is fewer than one sequence of data.seq_len + 1 = %lld", path,
                (unsigned long long)mf_tokens_count(t), (long long)seq_len + 1);
  if (rc == MF_OK)
    fprintf(stderr, "data.%s: %s: %llu tokens in %llu documents, unigram entropy %.3f bits/token (%.3f nats)\n",
            role, path, (unsigned long long)mf_tokens_count(t), (unsigned long long)mf_tokens_doc_count(t),
            st.entropy_bits, st.entropy_bits * 0.6931471805599453);
  mf_tokens_close(t);
  return rc;
}

static mf_status check_run(const mf_config *cfg) {
  mf_model_spec spec;
  if (cfg->model.has_init) {
    spec = cfg->model.init;
    print_model(&spec, "random init");
  } else {
    MF_CHECK(mf_hf_config_load(cfg->model.path, &spec));
    mf_safetensors *st = NULL;
    MF_CHECK(mf_safetensors_open(cfg->model.path, &st));
    fprintf(stderr, "checkpoint: %s: %zu tensors in %zu file(s)\n", cfg->model.path, mf_safetensors_count(st),
            mf_safetensors_shard_count(st));
    mf_safetensors_close(st);
    print_model(&spec, cfg->model.path);
  }
  MF_CHECK(check_tokens("train", cfg->data.train, &spec, cfg->data.seq_len));
  if (cfg->data.valid) MF_CHECK(check_tokens("valid", cfg->data.valid, &spec, cfg->data.seq_len));
  return MF_OK;
}

int mf_cli_train(int argc, char **argv) {
  if (mf_cli_wants_help(argc, argv)) {
    printf("%s", k_usage);
    return MF_EXIT_OK;
  }
  if (argc < 2) return mf_cli_usage_error("train", "expected a CONFIG file");
  for (int i = 2; i < argc; i++)
    if (!strchr(argv[i], '=')) return mf_cli_usage_error("train", "'%s' is not a key=value override", argv[i]);
  mf_config *cfg = NULL;
  mf_status st = mf_config_load(argv[1], (const char *const *)(argv + 2), (size_t)(argc - 2), &cfg);
  if (st != MF_OK) return mf_cli_fail("train", st);
  st = check_run(cfg);
  mf_config_free(cfg);
  if (st != MF_OK) return mf_cli_fail("train", st);
  fprintf(stderr,
          "moefit train: not built yet: the config, model and data above are valid, but the training loop "
          "(model maths, optimizer, executor) comes with the model work. Nothing was trained.\n");
  return MF_EXIT_FAIL;
}
