/* `moefit train CONFIG [key=value ...]` and `moefit eval CONFIG [...]`. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "comm/comm.h"
#include "src/cli/commands.h"
#include "src/config/config.h"
#include "src/train/train.h"

static const char k_train_usage[] =
    "usage: moefit train CONFIG [key=value ...] [--resume [DIR]]\n"
    "       mpirun -np N moefit train CONFIG [key=value ...]\n\n"
    "Trains CONFIG's model on its token files. key=value pairs override the file\n"
    "(e.g. train.lr=1e-4 train.steps=50); `moefit config --help` lists the keys.\n"
    "Progress lines go to stderr; OUTPUT_DIR/metrics.jsonl gets one JSON object per logged\n"
    "step; the final weights go to OUTPUT_DIR/final as a Hugging Face model directory, and\n"
    "OUTPUT_DIR/plan.json gets the plan the run follows (written before the backend starts;\n"
    "`moefit plan CONFIG --json FILE` writes the same file for the same config and overrides).\n\n"
    "Resume checkpoints go to OUTPUT_DIR/checkpoints/step-NNNNNN every output.checkpoint_every\n"
    "steps and at the end: master weights, AdamW moments, the data position and the rest of\n"
    "what the next step needs, with a manifest of checksums (output.checkpoint_compression,\n"
    "output.keep_checkpoints).\n"
    "--resume [DIR] continues from checkpoint DIR, or without DIR from the newest complete one\n"
    "in OUTPUT_DIR/checkpoints (newer unfinished or damaged ones are passed over with a\n"
    "warning); the steps after it give the same losses and weights, bit for bit, as a run that\n"
    "never stopped. A checkpoint that fails its checksums, of another model, or written under\n"
    "settings that change the training (model, data, train.* but steps, threads, log_every,\n"
    "eval_every, overlap_optimizer, max_skipped_steps; grad_accum when ranks x grad_accum is\n"
    "the same) is refused. metrics.jsonl keeps its\n"
    "lines up to the checkpoint's step and gets a line marking the resume.\n\n"
    "Without --resume, an OUTPUT_DIR that holds an earlier run (metrics.jsonl, final/ or\n"
    "checkpoints/) is refused before anything is written: continue it with --resume, or give\n"
    "another output.dir. plan.json (from `moefit plan --json`), routing.json and data/ alone are\n"
    "not a run; an empty or missing OUTPUT_DIR is fine.\n\n"
    "SIGINT or SIGTERM finishes the current step, writes a checkpoint, says where and exits\n"
    "with status 0 (resume with --resume); a second one exits at once (130, 143), leaving the\n"
    "last complete checkpoint as it was. A checkpoint that cannot be written (a full disk)\n"
    "stops the run with status 1. More than train.max_skipped_steps steps skipped for\n"
    "non-finite gradients or loss stop the run with a checkpoint and status 1.\n\n"
    "Under mpirun, N ranks train one model data-parallel: a step is N x train.grad_accum\n"
    "micro-batches, rank r taking the step's micro-batches r, r + N, ...; gradients are summed\n"
    "in rank order (on the cpu backend N ranks with grad_accum 1 give the weights of one rank\n"
    "with grad_accum N, bit for bit). The ranks of a machine keep one copy of the host state\n"
    "(weights, gradients, AdamW moments) in memory they share, each updating its part; each\n"
    "runs on cores / ranks-on-the-machine threads unless train.threads says. Rank 0 writes the\n"
    "logs, metrics, checkpoints and final weights. A rank that fails ends the job with its\n"
    "message. --resume takes the checkpoint with the same ranks, or with another number of\n"
    "ranks whose ranks x train.grad_accum is the checkpoint's (the same steps, the same bits).\n";

static const char k_eval_usage[] =
    "usage: moefit eval CONFIG [key=value ...] [--tokens FILE] [--model DIR] [--dump-logits FILE]\n\n"
    "Prints the mean loss (nats per counted token) and perplexity of a model over every\n"
    "window of data.seq_len tokens in a token file (default data.valid, else data.train).\n"
    "The weights are --model DIR, else model.path, else OUTPUT_DIR/final when a training\n"
    "run left one, else the config's random init.\n"
    "--dump-logits FILE writes the first sequence's logits: float32, row-major [seq_len, vocab].\n"
    "SIGINT or SIGTERM stops the pass after the current batch (status 130 or 143, the partial\n"
    "loss on stderr); a second one exits at once.\n";

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

/* Takes `--resume [DIR]` out of argv (DIR: the next word unless it is an
 * option, a key=value or a *.yaml file that is not a directory); *resume 1
 * when it was there. Returns the new argc. */
static int take_resume(int argc, char **argv, int *resume, const char **dir) {
  int n = 0;
  for (int i = 0; i < argc; i++) {
    if (i > 0 && strcmp(argv[i], "--resume") == 0) {
      *resume = 1;
      struct stat sb;
      const char *next = i + 1 < argc ? argv[i + 1] : NULL;
      const size_t len = next ? strlen(next) : 0;
      const int yaml = len > 5 && (strcmp(next + len - 5, ".yaml") == 0 || strcmp(next + len - 4, ".yml") == 0);
      if (next && strncmp(next, "--", 2) != 0 && !strchr(next, '=') &&
          ((stat(next, &sb) == 0 && S_ISDIR(sb.st_mode)) || !yaml))
        *dir = argv[++i];
      continue;
    }
    argv[n++] = argv[i];
  }
  return n;
}

int mf_cli_train(int argc, char **argv) {
  if (mf_cli_wants_help(argc, argv)) {
    printf("%s", k_train_usage);
    return MF_EXIT_OK;
  }
  int resume = 0;
  const char *dir = NULL;
  argc = take_resume(argc, argv, &resume, &dir);
  /* Under mpirun: the world of ranks (one process: a world of one). */
  mf_comm *comm = NULL;
  mf_status cst = mf_comm_init(NULL, NULL, &comm);
  if (cst != MF_OK) return mf_cli_fail("train", cst);
  const int rank = mf_comm_rank(comm), size = mf_comm_size(comm);
  if (rank > 0 && !mf_log_enabled(MF_LOG_DEBUG, "train")) mf_log_set_level(MF_LOG_WARN); /* rank 0 speaks */
  mf_config *cfg = NULL;
  /* Every rank reads and checks the config: all fail the same way. */
  int rc = load_config("train", MF_CONFIG_FOR_TRAIN, argc, argv, NULL, NULL, 0, &cfg);
  if (rc != MF_EXIT_OK) {
    mf_comm_free(comm);
    return rc;
  }
  if (!resume) {
    mf_status used = rank == 0 ? mf_train_check_output_dir(cfg->output.dir) : MF_OK;
    int64_t refused = used != MF_OK;
    if (size > 1 && mf_comm_allreduce_max_i64(comm, &refused, 1) != MF_OK) used = MF_ERR_MPI;
    if (refused) {
      mf_config_free(cfg);
      mf_comm_free(comm);
      return used != MF_OK ? mf_cli_fail("train", used) : MF_EXIT_FAIL; /* rank 0 says why */
    }
  }
  mf_train_summary sum;
  mf_cli_catch_stop();
  mf_status st = mf_train_ranks(cfg, comm, resume, dir, 0, &sum);
  mf_config_free(cfg);
  if (st != MF_OK && size > 1) {
    /* The others may wait for this rank in a collective: its message, then
     * the whole job ends. */
    fprintf(stderr, "moefit train: rank %d of %d: error: %s\n", rank, size, mf_last_error());
    fflush(stderr);
    mf_comm_abort(comm, MF_EXIT_FAIL);
  }
  mf_comm_free(comm);
  /* Stopped by a signal with a checkpoint written: a clean stop (status 0). */
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
  mf_cli_catch_stop();
  mf_status st = mf_eval(cfg, &o, &r);
  mf_config_free(cfg);
  if (st != MF_OK) return mf_cli_fail("eval", st);
  if (r.stopped) { /* no full result to print: a script must not take a part for the whole */
    char name[32];
    const int sig = mf_stop_requested();
    fprintf(stderr, "moefit eval: stopped by %s after %lld sequences (loss %.6f over their %lld tokens, not the "
            "file's)\n", mf_stop_signal_name(sig, name, sizeof name), (long long)r.sequences, r.loss,
            (long long)r.tokens);
    return 128 + sig;
  }
  printf("loss %.6f  perplexity %.4f  (%lld tokens in %lld sequences)\n", r.loss, r.perplexity, (long long)r.tokens,
         (long long)r.sequences);
  return MF_EXIT_OK;
}
