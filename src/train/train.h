/*
 * The training loop and evaluation on the executor: `moefit train` and
 * `moefit eval`. Everything a run does is decided by its mf_config.
 */
#ifndef MF_TRAIN_TRAIN_H
#define MF_TRAIN_TRAIN_H

#include "comm/comm.h"
#include "src/config/config.h"
#include "src/core/core.h"
#include "src/model/params.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The model a config names: model.init (random, from its seed) or model.path
 * (an HF checkpoint dir), or `model_dir` when given (e.g. a trained run's
 * output). *w gets the fp32 weights in the table's layout (free() it). `desc`
 * receives a short description of where the weights came from. */
mf_status mf_run_load_model(const mf_config *cfg, const char *model_dir, mf_param_table **table, float **w,
                            char *desc, size_t desc_cap);
/* Its two halves: the parameter table (from the spec alone: what planning
 * needs), then the weights (loaded or initialised, a random init over the
 * pool's threads (NULL: this one); the slow part). */
mf_status mf_run_model_table(const mf_config *cfg, const char *model_dir, const char *ckpt,
                             mf_param_table **table);
/* train.lora on table t (mf_run_model_table calls it): with a rank, its
 * adapters added and the base frozen (src/model/params.h mf_lora); an error
 * names the config's place for what the model lacks (dir: the checkpoint's, or
 * NULL for model.init). With experts: hot, the
 * hot experts are checkpoint ckpt's (state.json lora_hot: resume and export
 * rebuild the table the run trained), or with ckpt NULL each MoE layer's
 * hot_fraction most-routed by the routing memory.routing names
 * (experts/experts.h mf_experts_lora_hot), refused without measured routing. */
mf_status mf_run_lora(const mf_config *cfg, mf_param_table *t, const char *dir, const char *ckpt);
/* LoRA's frozen base stored as train.lora.base_dtype says (mf_run_lora calls
 * it), against how the checkpoint at dir (NULL: model.init) ships it: auto
 * keeps a bitsandbytes 4-bit checkpoint nf4 and an fp8 one fp8 as shipped
 * (the weights the file stores quantized, NF4 in its blocks; where only
 * config.json is there, every weight mf_param_table_quantize_base takes, NF4
 * in blocks of 64), and a float one in its dtype; nf4 / fp8 over a float
 * checkpoint quantize at load; bf16 (or no adapters) over a quantized one
 * leaves the table float (the loader dequantizes). Another format than the
 * checkpoint's, or a block size or double quantization set against it, is
 * MF_ERR_CONFIG naming the key. Several ranks keep the node's one copy
 * (train's node state). */
mf_status mf_run_quantize_base(const mf_config *cfg, const char *dir, mf_param_table *t);
mf_status mf_run_load_weights(const mf_config *cfg, const char *model_dir, const mf_param_table *t,
                              mf_threadpool *pool, float **w, char *desc, size_t desc_cap);
/* The same into w (the caller's, t->total_numel floats), a frozen parameter
 * put into frozen_bf16 instead when that is not NULL (LoRA's base at home in
 * bf16: src/model/params.h mf_params_load_home), its part of w untouched; a
 * random init over the pool's threads (may be NULL). */
mf_status mf_run_load_weights_home(const mf_config *cfg, const char *model_dir, const mf_param_table *t,
                                   float *w, uint16_t *frozen_bf16, mf_threadpool *pool, char *desc,
                                   size_t desc_cap);

typedef struct mf_train_summary {
  int64_t steps;          /* optimizer steps taken (skipped ones included) */
  int64_t skipped;        /* steps skipped for non-finite gradients */
  double first_loss;      /* the first step's loss */
  double final_loss;      /* mean loss of the last log window (final_loss_steps steps) */
  int64_t final_loss_steps;
  double valid_loss;      /* the final validation loss (NaN without data.valid) */
  double entropy_nats;    /* unigram entropy of the training tokens, nats/token */
  double tokens_per_s; /* tokens trained / training seconds (seconds - eval_seconds - checkpoint_seconds) */
  double seconds;      /* wall time of the step loop, evaluations and checkpoints included */
  double eval_seconds;    /* the part of it spent evaluating */
  /* The part of it training paused for checkpoints: device state brought home
   * for them and their writing. */
  double checkpoint_seconds;
  /* With a plan (memory.device_budget set): the simulator's step time on the
   * config's hardware profile, and the median wall time of the steps after the
   * first (loader, executor, clipping and optimizer; no eval). NaN otherwise. */
  double predicted_step_s;
  double executed_step_s;
  /* A stop request (SIGINT, SIGTERM: core.h mf_stop_request) ended the run
   * after `steps` < train.steps, with a checkpoint of that step in
   * checkpoint_dir; no final weights. 0 when the run went to the end. */
  int stop_signal;
  /* The host memory of the run's processes on one node at the end
   * (/proc/self/smaps_rollup Pss summed over the node's ranks; 0 unknown). */
  uint64_t host_pss_bytes;
  char checkpoint_dir[4400]; /* the newest checkpoint this run wrote or resumed from ("" none) */
} mf_train_summary;

/* The `quiet` argument of mf_train, mf_train_resume and mf_train_ranks: 0
 * the progress lines (metrics.h mf_progress_format), MF_TRAIN_QUIET none
 * (tests), MF_TRAIN_VERBOSE the progress lines with the stream figures
 * (`moefit train --verbose`). */
enum { MF_TRAIN_QUIET = 1, MF_TRAIN_VERBOSE = 2 };

/* Trains as the config says: progress lines on stderr, OUTPUT/metrics.jsonl,
 * the final weights in OUTPUT/final (an HF model dir), resume checkpoints in
 * OUTPUT/checkpoints (output.checkpoint_every, and at the end). `quiet` suppresses
 * the progress lines (tests).
 * Between steps it reads the stop flag (core.h mf_stop_requested): when set it
 * finishes the step (an evaluation under way stops early), writes a
 * checkpoint of it and returns MF_OK with out->stop_signal set. More than
 * train.max_skipped_steps steps skipped for non-finite values: a checkpoint,
 * then MF_ERR_CONFIG naming the key. A checkpoint that cannot be written
 * stops the run (its error, naming the file, and the last complete
 * checkpoint, which is kept). */
mf_status mf_train(const mf_config *cfg, int quiet, mf_train_summary *out);
/* MF_OK when `dir` (output.dir) is missing, empty or holds no earlier run;
 * else MF_ERR_CONFIG naming the dir, what it holds (metrics.jsonl, final/,
 * checkpoints/) and what to do instead: --resume when it has a complete
 * checkpoint (the command `resume_cmd` when given, else "moefit train CONFIG
 * --resume"), another output.dir. Changes nothing. plan.json, routing.json,
 * hw-cuda.yaml and data/ alone do not make a run (outdir.c says why).
 * `moefit train` without --resume calls it before anything is written. */
mf_status mf_train_check_output_dir(const char *dir, const char *resume_cmd);
/* mf_train continued from a resume checkpoint (src/ckpt/ckpt.h): `dir`, or
 * (NULL) the newest complete one under OUTPUT/checkpoints, newer incomplete
 * or damaged ones passed over with a warning. A checkpoint that does not
 * verify, of another model, or written under a config whose maths differ is
 * refused naming the file and the fault. The steps after it give the same
 * losses and final weights, bit for bit, as a run that never stopped (the
 * learning rate follows this config's train.steps). metrics.jsonl keeps the
 * lines up to the checkpoint's step and gets a line marking the resume;
 * out->steps and first_loss count from the run's start. */
mf_status mf_train_resume(const mf_config *cfg, const char *dir, int quiet, mf_train_summary *out);

/* mf_train (resume 0) or mf_train_resume (1) as one of the data-parallel
 * ranks of comm (NULL or a world of one: exactly mf_train). With several,
 * every rank calls it with the same config: the step's micro-batches are
 * ranks x train.grad_accum, rank r training on the step's micro-batches r,
 * r + ranks, ...; gradients are summed in rank order (on the cpu backend, N
 * ranks with grad_accum 1 give the bits of one rank with grad_accum N); the
 * ranks of a node keep one copy of the host state in shared memory and each
 * updates its shard of it. Rank 0 alone evaluates and writes the run's files
 * and lines (the others are quiet). A failing rank returns its error after
 * telling the node's other ranks, which may wait for it in a collective: the
 * caller ends the job (comm.h mf_comm_abort). Resuming with several ranks is
 * not built yet (MF_ERR_UNSUPPORTED). */
mf_status mf_train_ranks(const mf_config *cfg, mf_comm *comm, int resume, const char *dir, int quiet,
                         mf_train_summary *out);

/* Host threads each of the staging arena's fills and copy-outs get in a run
 * of cfg on `backend` ("cpu" or "cuda", resolved): what train passes the
 * executor (src/exec/exec.h mf_exec_staging_opts.threads) and what `moefit
 * bench kernels` stages with. */
int mf_train_staging_threads(const mf_config *cfg, const char *backend);

typedef struct mf_eval_opts {
  const char *tokens;      /* token file (default data.valid, else data.train) */
  const char *model_dir;   /* weights to evaluate (default: see mf_eval) */
  const char *dump_logits; /* write the first sequence's logits, float32 [S, V] */
} mf_eval_opts;

typedef struct mf_eval_result {
  double loss;       /* mean cross-entropy per counted token, nats */
  double perplexity; /* exp(loss) */
  int64_t tokens;    /* counted tokens */
  int64_t sequences;
  double seconds;    /* wall time of the pass */
  int stopped;       /* a stop request (core.h) cut the pass short: the loss is over the sequences done */
} mf_eval_result;

/* Mean loss over every window of a token file. The weights are model_dir when
 * given, else model.path, else OUTPUT/final when a training run left one, else
 * the random init. A stop request (core.h) ends the pass after the current
 * batch: MF_OK with out->stopped. */
mf_status mf_eval(const mf_config *cfg, const mf_eval_opts *opts, mf_eval_result *out);

#ifdef __cplusplus
}
#endif

#endif /* MF_TRAIN_TRAIN_H */
