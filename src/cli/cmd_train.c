/* `moefit train CONFIG [key=value ...]` and `moefit eval CONFIG [...]`. */
#include <stdio.h>
#include <string.h>

#include "src/cli/commands.h"
#include "src/config/config.h"
#include "src/train/train.h"

static const char k_train_usage[] =
    "usage: moefit train CONFIG [key=value ...]\n"
    "       mpirun -np N moefit train CONFIG [key=value ...]   (multi-rank runs come later)\n\n"
    "Trains CONFIG's model on its token files. key=value pairs override the file\n"
    "(e.g. train.lr=1e-4 train.steps=50); `moefit config --help` lists the keys.\n"
    "Progress lines go to stderr; OUTPUT_DIR/metrics.jsonl gets one JSON object per logged\n"
    "step; the final weights go to OUTPUT_DIR/final as a Hugging Face model directory, and\n"
    "OUTPUT_DIR/plan.json gets the plan the run follows (written before the backend starts;\n"
    "`moefit plan CONFIG --json FILE` writes the same file for the same config and overrides).\n";

static const char k_eval_usage[] =
    "usage: moefit eval CONFIG [key=value ...] [--tokens FILE] [--model DIR] [--dump-logits FILE]\n\n"
    "Prints the mean loss (nats per counted token) and perplexity of a model over every\n"
    "window of data.seq_len tokens in a token file (default data.valid, else data.train).\n"
    "The weights are --model DIR, else model.path, else OUTPUT_DIR/final when a training\n"
    "run left one, else the config's random init.\n"
    "--dump-logits FILE writes the first sequence's logits: float32, row-major [seq_len, vocab].\n";

/* Splits argv into the config, key=value overrides and --options (name, value). */
static int load_config(const char *cmd, mf_config_use use, int argc, char **argv, const char *const *opt_names, const char **opt_values,
                       int n_opts, mf_config **cfg) {
  const char *path = NULL;
  const char *overrides[256];
  size_t n_over = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strncmp(a, "--", 2) == 0) {
      int found = 0;
      for (int k = 0; k < n_opts; k++)
        if (strcmp(a, opt_names[k]) == 0) {
          if (i + 1 >= argc) return mf_cli_usage_error(cmd, "%s needs a value", a);
          opt_values[k] = argv[++i];
          found = 1;
        }
      if (!found) return mf_cli_usage_error(cmd, "unknown option '%s'", a);
    } else if (!path) {
      path = a;
    } else if (strchr(a, '=')) {
      if (n_over == sizeof overrides / sizeof overrides[0]) return mf_cli_usage_error(cmd, "too many overrides");
      overrides[n_over++] = a;
    } else {
      return mf_cli_usage_error(cmd, "'%s' is not a key=value override", a);
    }
  }
  if (!path) return mf_cli_usage_error(cmd, "expected a CONFIG file");
  mf_status st = mf_config_load_for(path, overrides, n_over, use, cfg);
  if (st != MF_OK) return mf_cli_fail(cmd, st);
  return MF_EXIT_OK;
}

int mf_cli_train(int argc, char **argv) {
  if (mf_cli_wants_help(argc, argv)) {
    printf("%s", k_train_usage);
    return MF_EXIT_OK;
  }
  mf_config *cfg = NULL;
  int rc = load_config("train", MF_CONFIG_FOR_TRAIN, argc, argv, NULL, NULL, 0, &cfg);
  if (rc != MF_EXIT_OK) return rc;
  mf_train_summary sum;
  mf_status st = mf_train(cfg, 0, &sum);
  mf_config_free(cfg);
  return st == MF_OK ? MF_EXIT_OK : mf_cli_fail("train", st);
}

int mf_cli_eval(int argc, char **argv) {
  if (mf_cli_wants_help(argc, argv)) {
    printf("%s", k_eval_usage);
    return MF_EXIT_OK;
  }
  const char *names[3] = {"--tokens", "--model", "--dump-logits"};
  const char *values[3] = {NULL, NULL, NULL};
  mf_config *cfg = NULL;
  int rc = load_config("eval", MF_CONFIG_FOR_EVAL, argc, argv, names, values, 3, &cfg);
  if (rc != MF_EXIT_OK) return rc;
  mf_eval_opts o = {values[0], values[1], values[2]};
  mf_eval_result r;
  mf_status st = mf_eval(cfg, &o, &r);
  mf_config_free(cfg);
  if (st != MF_OK) return mf_cli_fail("eval", st);
  printf("loss %.6f  perplexity %.4f  (%lld tokens in %lld sequences)\n", r.loss, r.perplexity, (long long)r.tokens,
         (long long)r.sequences);
  return MF_EXIT_OK;
}
