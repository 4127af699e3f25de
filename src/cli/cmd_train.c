/* `moefit train CONFIG [key=value ...]` and `moefit eval CONFIG [...]`. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm.h"
#include "src/cli/commands.h"
#include "src/config/config.h"
#include "src/train/train.h"

static const char k_train_usage[] =
    "usage: moefit train CONFIG [key=value ...] [--resume [DIR]] [--verbose]\n"
    "       mpirun -np N moefit train CONFIG [key=value ...]\n\n"
    "Trains CONFIG's model on its token files. key=value pairs override the file\n"
    "(e.g. train.lr=1e-4 train.steps=50); `moefit config --help` lists the keys.\n"
    "Progress lines go to stderr, one every train.log_every steps:\n"
    "  step   40/300  loss 2.3412 (mean of 10 steps)  eval 2.1003  lr 2.67e-03  12.3K tok/s  eta 1m32s\n"
    "(loss: the mean over the steps since the previous line; eval: the validation loss on\n"
    "steps that evaluated; tok/s: training throughput, evaluation excluded; eta: the training\n"
    "steps left). --verbose adds the router's aux loss, the gradient norm |g| and the\n"
    "executor's stream figures: each stream's busy share of the step (c compute, up\n"
    "host-to-device, dn device-to-host) and the host's submitting it, the bytes copied up/down\n"
    "a step, the peak device memory, the host optimizer's hidden/exposed time and staging.\n"
    "OUTPUT_DIR/metrics.jsonl gets one JSON object per logged step with all of them (`moefit\n"
    "inspect OUTPUT_DIR` summarises a run, `moefit plot OUTPUT_DIR` draws its curves); the\n"
    "final weights go to OUTPUT_DIR/final as a Hugging Face model directory, and\n"
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
    "lines up to the checkpoint's step and gets a line marking the resume. The closing line\n"
    "counts the steps this command trained: \"done: 40 steps (61-100) in 12.3 s ...\".\n\n"
    "Without --resume, an OUTPUT_DIR that holds an earlier run (metrics.jsonl, final/ or\n"
    "checkpoints/) is refused before anything is written: continue it with --resume (the\n"
    "message gives the command: this one with --resume), or give another output.dir.\n"
    "plan.json (from `moefit plan --json`), routing.json and data/ alone are not a run; an\n"
    "empty or missing OUTPUT_DIR is fine.\n\n"
    "SIGINT, SIGTERM or SIGUSR1 finishes the current step, writes a checkpoint, says where and exits\n"
    "with status 0, printing the command that continues the run (this command line, its\n"
    "overrides included, with --resume); a second one exits at once (130, 143), leaving the\n"
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
    "message; an error every rank meets alike (a bad config or data file, a used output dir)\n"
    "is printed once, by rank 0, and every rank exits with status 1. --resume takes the\n"
    "checkpoint with the same ranks, or with another number of ranks whose ranks x\n"
    "train.grad_accum is the checkpoint's (the same steps, the same bits).\n"
    "To stop the ranks with a checkpoint, send mpirun SIGUSR1 (`kill -USR1 PID`): Open MPI\n"
    "forwards it to every rank and exits 0. SIGINT or SIGTERM to mpirun (Ctrl-C) stops them\n"
    "the same way if the step and the checkpoint take under 1 s: Open MPI sends the ranks\n"
    "SIGTERM 1 s after it got the signal, SIGKILL 1 s after that, and exits with status 1.\n";

static const char k_eval_usage[] =
    "usage: moefit eval CONFIG [key=value ...] [--tokens FILE] [--model DIR] [--dump-logits FILE]\n\n"
    "Prints the mean loss (nats per counted token) and perplexity of a model over every\n"
    "window of data.seq_len tokens in a token file (default data.valid, else data.train).\n"
    "The weights are --model DIR, else model.path, else OUTPUT_DIR/final when a training\n"
    "run left one, else the config's random init.\n"
    "A PEFT adapter dir (--model DIR, or a LoRA run's final/) is evaluated with its own rank,\n"
    "alpha and targets (adapter_config.json) over the config's base, which must be the base it\n"
    "records (moefit_base.json: that base's config and its weights' checksums): another base,\n"
    "model.init's random one included, is refused naming what differs.\n"
    "A loss that is not finite (NaN or Inf weights) is an error (status 1) naming the sequence\n"
    "and token of the first logit that is not.\n"
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

/* Takes `--resume [DIR]` and `--verbose` out of argv (DIR: the next word
 * unless it is an option, a key=value or a *.yaml file that is not a
 * directory, mf_cli_resume_takes_dir); *resume, *verbose 1 when they were
 * there. Returns the new argc. */
static int take_flags(int argc, char **argv, int *resume, const char **dir, int *verbose) {
  int n = 0;
  for (int i = 0; i < argc; i++) {
    if (i > 0 && strcmp(argv[i], "--resume") == 0) {
      *resume = 1;
      if (i + 1 < argc && mf_cli_resume_takes_dir(argv[i + 1])) *dir = argv[++i];
      continue;
    }
    if (i > 0 && strcmp(argv[i], "--verbose") == 0) {
      *verbose = 1;
      continue;
    }
    argv[n++] = argv[i];
  }
  return n;
}

/* How to continue the run (rank 0's): the command line with --resume. */
static void log_resume_hint(const char *lead, int ranks) {
  char cmd[8192];
  int exact = 1;
  if (mf_cli_resume_command(ranks, cmd, sizeof cmd, &exact) == 0) return;
  MF_LOGI("train", "%s%s%s", lead, cmd,
          exact ? "" : " (with this run's other mpirun options, if it had any)");
}

/* Under mpirun, rank 0 reads and checks the config first and says what is
 * wrong with it; the others, which would say the same, read it only when
 * rank 0 could (one that fails then, its config differing from rank 0's,
 * says so too), and every rank ends with the worst status. */
static int read_config(mf_comm *comm, int argc, char **argv, mf_config **cfg) {
  const int rank = mf_comm_rank(comm), size = mf_comm_size(comm);
  int rc = MF_EXIT_OK;
  if (rank == 0) rc = load_config("train", MF_CONFIG_FOR_TRAIN, argc, argv, NULL, NULL, 0, cfg);
  if (size == 1) return rc;
  int64_t first = rc, worst = 0;
  if (mf_comm_broadcast(comm, &first, sizeof first, 0) != MF_OK) first = MF_EXIT_FAIL;
  if (rank > 0 && first == MF_EXIT_OK) {
    rc = load_config("train", MF_CONFIG_FOR_TRAIN, argc, argv, NULL, NULL, 0, cfg);
    if (rc != MF_EXIT_OK)
      fprintf(stderr,
              "moefit train: rank %d of %d: the error above is this rank's alone (rank 0 read the config)\n",
              rank, size);
  }
  worst = rc != MF_EXIT_OK ? rc : first;
  if (mf_comm_allreduce_max_i64(comm, &worst, 1) != MF_OK) worst = MF_EXIT_FAIL;
  if (rank > 0 && rc == MF_EXIT_OK && worst != MF_EXIT_OK && mf_log_enabled(MF_LOG_DEBUG, "train"))
    fprintf(stderr, "moefit train: rank %d of %d: stopping on another rank's config error\n", rank, size);
  return (int)worst;
}

/* How long a rank that failed waits for the others to fail too before it
 * ends the job alone (mf_comm_fail_agree): ranks failing alike (a data file
 * every rank opens, too little shared memory) get there within milliseconds
 * of each other; a rank failing alone pays this before the job ends. */
static const double k_fail_agree_s = 2.0;

/* Several ranks, this one failed with st: when every rank failed (within
 * k_fail_agree_s), reports it — once, by rank 0, when all failed alike; else
 * each rank whose fault it was, not those that only heard of another's
 * (mf_comm_fail_agree) — and returns 1 (every rank then ends normally, no
 * MPI_Abort); 0 when some rank did not fail (the caller ends the job). */
static int failed_together(mf_comm *comm, mf_status st) {
  const int rank = mf_comm_rank(comm), size = mf_comm_size(comm);
  int all = 0, alike = 0, say = 0;
  mf_comm_fail_agree(comm, mf_last_error(), k_fail_agree_s, &all, &alike, &say);
  if (!all) return 0;
  if (say && alike)
    mf_cli_fail("train", st);
  else if (say)
    fprintf(stderr, "moefit train: rank %d of %d: error: %s\n", rank, size, mf_last_error());
  else if (mf_log_enabled(MF_LOG_DEBUG, "train"))
    fprintf(stderr, "moefit train: rank %d of %d: stopping: %s\n", rank, size,
            alike ? "the same error as rank 0" : mf_last_error());
  fflush(stderr);
  return 1;
}

/* After a clean stop under mpirun (rank 0, its last line). Open MPI's mpirun
 * stopped by SIGINT or SIGTERM (Ctrl-C, kill) ends the job itself: SIGCONT
 * to the ranks, SIGTERM 1 s later, SIGKILL 1 s after that
 * (odls_base_sigkill_timeout), and it exits with status 1 whatever they
 * return. SIGUSR1 it forwards at once, and exits with the ranks' status. */
static void say_mpirun_status(void) {
  const int by = mf_cli_stop_by_parent();
  if (by != SIGINT && by != SIGTERM) return; /* SIGUSR1, or a signal sent to the ranks: mpirun exits 0 */
  char name[32];
  MF_LOGI(
      "train",
      "mpirun will exit with status 1, not 0: the %s came from mpirun, which sends it when it is stopped "
      "itself by SIGINT or SIGTERM (Ctrl-C, kill), then ends the job (SIGKILL 1 s later) and reports it "
      "failed whatever the ranks return; every rank stopped cleanly with the checkpoint above. `kill -USR1 "
      "<mpirun's pid>` stops the ranks the same way with status 0",
      mf_stop_signal_name(by, name, sizeof name));
}

int mf_cli_train(int argc, char **argv) {
  if (mf_cli_wants_help(argc, argv)) {
    printf("%s", k_train_usage);
    return MF_EXIT_OK;
  }
  int resume = 0, verbose = 0;
  const char *dir = NULL;
  argc = take_flags(argc, argv, &resume, &dir, &verbose);
  /* Under mpirun: the world of ranks (one process: a world of one). */
  mf_comm *comm = NULL;
  mf_status cst = mf_comm_init(NULL, NULL, &comm);
  if (cst != MF_OK) return mf_cli_fail("train", cst);
  const int rank = mf_comm_rank(comm), size = mf_comm_size(comm);
  if (rank > 0 && !mf_log_enabled(MF_LOG_DEBUG, "train")) mf_log_set_level(MF_LOG_WARN); /* rank 0 speaks */
  mf_config *cfg = NULL;
  int rc = read_config(comm, argc, argv, &cfg);
  if (rc != MF_EXIT_OK) {
    mf_config_free(cfg);
    mf_comm_free(comm);
    return rc;
  }
  if (!resume) {
    char cmd[8192];
    int exact = 1;
    const size_t len = rank == 0 ? mf_cli_resume_command(size, cmd, sizeof cmd, &exact) : 0;
    mf_status used = rank == 0 ? mf_train_check_output_dir(cfg->output.dir, len ? cmd : NULL) : MF_OK;
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
  mf_status st = mf_train_ranks(cfg, comm, resume, dir, verbose ? MF_TRAIN_VERBOSE : 0, &sum);
  mf_config_free(cfg);
  /* Stopped by a signal, or failed after a checkpoint: the command that
   * continues this run, overrides and all (rank 0 speaks) */
  const int hint = rank == 0 && sum.checkpoint_dir[0] && (st != MF_OK || sum.stop_signal);
  if (st != MF_OK && size > 1 && failed_together(comm, st)) {
    if (hint) log_resume_hint("resume with: ", size);
    mf_comm_free(comm);
    return MF_EXIT_FAIL;
  }
  if (st != MF_OK && size > 1) {
    /* The others wait for this rank in a collective (or failed otherwise):
     * its message, then the whole job ends. */
    fprintf(stderr, "moefit train: rank %d of %d: error: %s\n", rank, size, mf_last_error());
    if (hint) log_resume_hint("resume with: ", size);
    fflush(stderr);
    mf_comm_abort(comm, MF_EXIT_FAIL);
  }
  /* Stopped by a signal with a checkpoint written: a clean stop (status 0).
   * Its lines before MPI_Finalize: mpirun sent SIGINT or SIGTERM kills the
   * ranks 1 s after its own SIGTERM reached them, finalizing or not. */
  if (st == MF_OK) {
    if (hint) log_resume_hint("continue with: ", size);
    if (rank == 0 && size > 1 && sum.stop_signal) say_mpirun_status();
    fflush(stderr);
    mf_comm_free(comm);
    return MF_EXIT_OK;
  }
  mf_comm_free(comm);
  const int failed = mf_cli_fail("train", st);
  if (hint) log_resume_hint("resume with: ", size);
  return failed;
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
