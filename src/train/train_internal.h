/*
 * Private to src/train: the parts of a training run, each in its own file.
 *
 *   run.c      a run opened up to the stage a command needs (run.h): the
 *              table, the profile and plan, the backend, the executor with
 *              its staging arena and batch buffers; an eval pass
 *   host.c     the host state: fp32 master weights, gradient sums and AdamW
 *              moments in memory or spilled to NVMe as the plan's host
 *              accounting says
 *   updates.c  the step's one list of parameter updates and the three ways it
 *              runs: the host AdamW after the step, the overlapped host worker
 *              behind the next step, the optimizer on the device
 *   window.c   the logging window: per-step figures summed between progress
 *              lines, written to metrics.jsonl and the progress line
 *   checkpoint.c  the resume checkpoints: the loop's state to src/ckpt and back
 *   train.c    mf_train: setup, the step loop, finish; eval.c mf_eval
 */
#ifndef MF_TRAIN_INTERNAL_H
#define MF_TRAIN_INTERNAL_H

#include <stdint.h>

#include "comm/comm.h"
#include "comm/comm_nccl.h"
#include "kernels/backend.h"
#include "planner/run_plan.h"
#include "src/ckpt/ckpt.h"
#include "src/config/config.h"
#include "src/core/core.h"
#include "src/core/hostbuf.h"
#include "src/exec/exec.h"
#include "src/model/params.h"
#include "src/optim/optim.h"
#include "src/optim/worker.h"
#include "src/train/loader.h"
#include "src/train/metrics.h"
#include "src/train/run.h"
#include "src/train/train.h"

#ifdef __cplusplus
extern "C" {
#endif

/* --------------------------------------------------------------- run.c */

/* One full pass over an eval loader with weights w: mean cross-entropy per
 * counted token and the pass's seconds; capture (may be NULL) receives the
 * first batch's final hidden states. With `progress`, a pass that runs longer
 * than two seconds (MF_PROGRESS_EVERY=SECONDS: that many) says on stderr how
 * many windows are done and its ETA, at most that often, and ends with a line
 * saying it finished; a shorter one prints nothing. */
mf_status mf_run_eval_pass(mf_run *r, mf_loader *l, const float *w, int progress, mf_eval_result *out,
                           float *capture);

/* BF16 storage (the plan's): the executor uploads weights from a bf16 working
 * copy. mf_run_round_working fills `buf` (n bf16 values; NULL: a buffer of
 * the run's own, allocated once) with the n weights w rounded to nearest
 * even, converted by the pool's threads, and hands it to the executor;
 * mf_run_share_working hands another run's to this one (train's
 * evaluation reads the copy training keeps current). With fp32 storage both
 * do nothing. */
mf_status mf_run_round_working(mf_run *r, const float *w, size_t n, uint16_t *buf, mf_threadpool *pool);
void mf_run_share_working(mf_run *r, const mf_run *from);
/* LoRA's base at home in bf16 (mf_host_state.base_bf16): buf, the working
 * copy the frozen parameters were loaded into, handed to the executor with
 * the trained parameters' weights w rounded into it (the frozen part of w is
 * never read). */
mf_status mf_run_round_trained(mf_run *r, const mf_param_table *t, const float *w, uint16_t *buf);

/* MF_ERR_CONFIG when the token file's vocabulary is larger than the model's. */
mf_status mf_train_check_vocab(const mf_loader *l, const mf_param_table *t);

/* -------------------------------------------------------------- host.c */

typedef struct mf_host_state {
  mf_hostbuf master, grads, m, v; /* master: only when it spills (else the loaded w) */
  mf_hostbuf working;             /* BF16 storage: the weights' bf16 working copy (empty with fp32) */
  mf_host_usage u;
  mf_dtype moments;               /* train.adam_moments */
  int spill_master, spill_grads, spill_moments, spill_working;
  int release_master; /* drop the master's pages after each update (not only the cold part spills) */
  int node;           /* the buffers are views into the node's shared memory (mf_host_state_init_node) */
  /* LoRA's frozen base at home in the bf16 working copy alone (params.h
   * mf_lora_base_bf16): the master weights' frozen part is never written */
  int base_bf16;
} mf_host_state;

/* Places the state as the run plan's host accounting says; *w moves into a
 * file when the master weights spill (*w_owned then 0: the buffer is
 * h->master's). */
mf_status mf_host_state_init(mf_host_state *h, const mf_config *cfg, const mf_param_table *t,
                             const mf_run_plan *rp, float **w, int *w_owned, int quiet);
void mf_host_state_free(mf_host_state *h);
/* Several ranks on a node: their one copy of the host state — master weights,
 * gradient sums, moments, the bf16 working copy — in one block of memory the
 * node's ranks share. mf_host_state_node_bytes gives its size (a plan that
 * spills host state to NVMe is refused: not built for ranks); then
 * mf_host_state_init_node lays the state out in `block` of that size, *w
 * the master weights' part. */
mf_status mf_host_state_node_bytes(const mf_config *cfg, const mf_param_table *t, const mf_run_plan *rp,
                                   size_t *bytes);
void mf_host_state_init_node(mf_host_state *h, const mf_config *cfg, const mf_param_table *t,
                             const mf_run_plan *rp, void *block, float **w);
/* Parameter i's host state is done with for this step: spilled pages may go. */
void mf_host_state_release(mf_host_state *h, const mf_param_table *t, int64_t i);

/* ----------------------------------------------------------- updates.c */

/* The step's parameter updates, decided once: which parameters AdamW updates
 * (every one that got a gradient: a routed expert that saw no token has none
 * in Mixtral and Qwen, as PyTorch leaves .grad None; OLMoE's experts always
 * get one), their step counts (advanced only when updated), the weight decay
 * rule (matrices only), and where each runs (the plan's optimizer placement). */
typedef struct mf_updates {
  const mf_param_table *t;
  const uint8_t *on_device; /* [n] the plan's optimizer placement, or NULL: all on the host */
  const int32_t *order;     /* [n] the order the step first uploads the parameters */
  int64_t *steps;           /* [n] each parameter's AdamW step count */
  uint8_t *decays;          /* [n] weight decay applies */
  mf_optim_update *host;    /* this step's host updates, in upload order */
  int32_t n_host;
  uint8_t *device;          /* [n] 1: updated on the device this step */
  mf_adamw_hparams h;       /* this step's hyper-parameters (weight decay for matrices) */
} mf_updates;

mf_status mf_updates_init(mf_updates *u, const mf_param_table *t, const uint8_t *on_device, const int32_t *order);
void mf_updates_free(mf_updates *u);
/* Parameter i got a gradient this step (expert_tokens: the executor's counts). */
int mf_updates_has_gradient(const mf_param_table *t, const int64_t *expert_tokens, int64_t i);
/* Decides the step's updates and advances the step counts of those updated. */
void mf_updates_plan(mf_updates *u, const int64_t *expert_tokens, const mf_config_train *tc, double lr);
/* The host's part after the step: AdamW on each (gradients already clipped);
 * working (BF16 storage; else NULL): the weights' bf16 working copy, rewritten
 * with each update. */
mf_status mf_updates_run_host(const mf_updates *u, float *w, uint16_t *working, float *g, mf_host_state *hs,
                              mf_threadpool *pool);
/* The same over elements [lo[i], hi[i]) of each parameter i only (a rank's
 * shard; AdamW is elementwise, so the same bits as the whole). */
mf_status mf_updates_run_host_shard(const mf_updates *u, float *w, uint16_t *working, float *g,
                                    mf_host_state *hs, mf_threadpool *pool, const int64_t *lo,
                                    const int64_t *hi);
/* The device's part (gradients scaled by coef there). */
mf_status mf_updates_run_device(const mf_updates *u, mf_exec *x, double coef);

/* ------------------------------------------------------------- ranks.c */

/* This process's part in a run of several data-parallel ranks (ranks.c says
 * how the step is shared). */
/* Expert parallelism's exchanges between the ranks (ep.c): the executor's
 * mf_exec_exchange, for a program with expert parallelism over every rank of
 * the world (rank r its ep_rank r; one rank exchanging with itself under
 * MF_TEST_EP_SELF). Rows move over MPI between host buffers on the cpu
 * backend, over NCCL between GPUs on a backend with native streams. Its
 * buffers are made at init; a call allocates nothing. */
typedef struct mf_ep {
  mf_comm *comm;
  mf_nccl *nccl; /* NULL: MPI */
  mf_backend *b;
  int64_t ep, rank, E;
  int64_t base; /* the world rank of the group's rank 0 (with more ranks than ep, groups of ep) */
  int64_t *host[6];                    /* the backend's host memory (pinned on cuda): */
  int64_t *loffs, *offs, *seg, *counts; /* the layout: [E + 1], [E + 1], [E ep + 1], [E] */
  int64_t *starts, *seeds;             /* [E ep] each part's first row in its source, [ep] their seeds */
  int64_t *cnt_send;                   /* [E] rows per (rank, expert) this rank sends */
  int64_t *msg;                        /* [2 (2 E + ep)] the counts' exchange, out then in */
  mf_comm_part *sends, *recvs;         /* [E] an exchange's parts */
} mf_ep;

/* device: the CUDA device of this rank's backend (its NCCL communicator's).
 * Then x's exchange is this one. */
mf_status mf_ep_attach(mf_ep *e, mf_comm *comm, const mf_program *p, mf_exec *x, mf_backend *b, int device);
void mf_ep_free(mf_ep *e); /* a zeroed one is fine */

typedef struct mf_ranks {
  mf_comm *comm;
  int rank, size, lrank, lsize;
  mf_comm_shared *home;             /* the node's host state (mf_host_state_init_node) */
  mf_comm_shared *sums;             /* the norm's chunk sums, [norm_chunks] doubles, shared by the node */
  mf_comm_shared *qhome;            /* LoRA's base stored quantized: the node's one copy (the table borrows it) */
  mf_comm_relay *relay;             /* the gradients into the node's sum, rank after rank */
  mf_comm_relay *xrelay;            /* expert parallelism in groups: an expert's owners, group after group */
  const int64_t *norm_first;        /* [n] parameter i's first chunk sum (the program's) */
  int64_t *own_lo, *own_hi;         /* [n] the elements of parameter i this rank clips and updates */
  int64_t *tokens;                  /* [layers * experts] the step's tokens per expert over every rank */
  int32_t *skip_ids, *skip_targets; /* another rank's micro-batch, drawn and passed over */
  mf_optim_buf *norm_bufs;          /* [n] */
  const double **ext;               /* [n] */
  /* Expert parallelism (parallel.expert): own[i] set for the experts whose
   * gradients this rank alone writes into the node's sum (no relay: no other
   * rank adds to them); NULL without */
  uint8_t *own;
  /* ... over several nodes as one group: foreign[i] set for the experts of other nodes' ranks, whose
   * sums the node's leader zeroes each step for the leaders' exchange to fill; NULL without */
  uint8_t *foreign;
  const mf_param_table *table; /* where their sums are (borrowed) */
} mf_ranks;

/* The world as comm sees it (nothing allocated), then the shard of table t
 * and the buffers for micro-batches of B x S tokens. */
void mf_ranks_world(mf_ranks *k, mf_comm *comm);
mf_status mf_ranks_init(mf_ranks *k, const mf_param_table *t, int64_t B, int64_t S);
/* The node's shared memory: the host state's home_bytes, the norm's chunk
 * sums, the relay, and the quantized base's home where t has one
 * (t->qhome_bytes; the caller has the table borrow it) (collective over the
 * node). */
mf_status mf_ranks_share(mf_ranks *k, const mf_param_table *t, size_t home_bytes, const int64_t *norm_first,
                         int64_t norm_chunks);
/* collective: also the node's shared memory (0 after a failure, when other
 * ranks may never come: the process ends soon). */
void mf_ranks_free(mf_ranks *k, int collective);
/* The executor's gradients add into the node's sum in rank order; with
 * expert parallelism (p->exchanges) each rank writes its own experts'
 * gradients alone (the exchanges are the run's mf_ep) — after their owners
 * in the groups before, with more ranks than p->ep (collective over the
 * node). */
mf_status mf_ranks_hooks(mf_ranks *k, mf_exec *x, const mf_program *p);
/* Step `step`'s round of the relays (comm.h mf_comm_relay_begin); with one
 * group of expert-parallel ranks over several nodes, the node's sums
 * `grads` of the other nodes' experts zeroed (by the node's leader). */
void mf_ranks_begin(mf_ranks *k, int64_t step, float *grads);
/* This rank failed: the node's ranks waiting on it in a relay learn so at once. */
void mf_ranks_fail(mf_ranks *k);
/* The step's G x ranks micro-batches drawn; this rank's into ids/targets. */
mf_status mf_ranks_next_batches(mf_ranks *k, mf_loader *l, int64_t G, int32_t **ids, int32_t **targets);
/* After mf_exec_step: the gradient sums whole on every node, sr's losses and
 * tokens and the experts' tokens (k->tokens) over all ranks. */
mf_status mf_ranks_reduce(mf_ranks *k, float *grads, size_t n, mf_step_result *sr, const int64_t *tokens,
                          size_t n_tokens, double aux_coef);
/* The global norm: this rank's chunk sums into the node's, then all added in
 * the single-rank order. */
mf_status mf_ranks_norm(mf_ranks *k, const mf_param_table *t, float *g, const int64_t *tokens,
                        mf_threadpool *pool, double *norm);
/* This rank's shard of the gradients scaled by coef (clipping). */
mf_status mf_ranks_scale(mf_ranks *k, const mf_param_table *t, float *g, const int64_t *tokens, double coef,
                         mf_threadpool *pool);
/* Every rank of the node updated its shard (a barrier). */
mf_status mf_ranks_updated(mf_ranks *k);
/* This process's proportional set size (/proc/self/smaps_rollup), 0 unknown. */
uint64_t mf_ranks_process_pss(void);

/* ------------------------------------------------------------ window.c */

/* Figures of the steps since the last progress line. */
typedef struct mf_window {
  double t0;       /* when it began */
  double excluded; /* seconds in it that were not training (evaluations) */
  double loss, aux; /* summed step losses (loss, aux_loss) */
  int64_t n;
  double busy[MF_EXEC_STREAMS];
  double submit;      /* the host's seconds submitting the steps' work */
  double fill, drain; /* staged copies: the host's seconds (NaN unstaged) */
  size_t peak;
  double opt_hidden, opt_exposed; /* the host optimizer: hidden behind the device work / exposed */
  double opt_busy_seen, opt_waited_seen; /* the worker's totals at the last step */
} mf_window;

void mf_window_start(mf_window *w, double now);
/* Adds one step: its result and the executor's statistics. */
void mf_window_add(mf_window *w, const mf_step_result *sr, const mf_exec_stats *xs);
/* The overlapped optimizer's totals (busy, waited) after a step. */
void mf_window_add_worker(mf_window *w, double busy, double waited);
/* `seconds` of the window went to something other than training (an
 * evaluation): they are not in its step_s, tokens_per_s or ETA. */
void mf_window_exclude(mf_window *w, double seconds);
/* Writes the window's metrics line (and the progress line: `progress` 0
 * none, 1 the compact one, 2 the verbose one with the stream figures,
 * metrics.h mf_progress_format) and starts a new window. `base` holds the
 * step's own fields; *line gets the line as written (its window_loss,
 * window_steps). */
mf_status mf_window_flush(mf_window *w, mf_metrics *m, const mf_step_metrics *base, const mf_exec_stats *xs,
                          int64_t tokens_per_step, int64_t total_steps, int progress, mf_step_metrics *line);

/* -------------------------------------------------------- checkpoint.c */

/* The run's tensors as src/ckpt reads and fills them. */
mf_ckpt_data mf_train_ckpt_data(const mf_param_table *t, float *w, const mf_host_state *hs,
                                int64_t *adam_steps, int64_t *routed, size_t n_routed, uint64_t base_sum);
/* Writes the checkpoint of `step` but its COMPLETE marker (mf_ckpt_commit,
 * the caller's, after the step's metrics line) (every update done and the
 * device's state home first: the caller's), says so on stderr unless quiet, and puts its
 * seconds and bytes in sm and its directory in dir (cap bytes). */
mf_status mf_train_ckpt_save(mf_ckpt_writer *ckw, const mf_ckpt_data *d, const mf_loader *l, const mf_config *cfg,
                             int64_t step, const mf_train_summary *sum, int quiet, mf_step_metrics *sm, char *dir,
                             size_t cap);
/* Reads checkpoint `want` (NULL: the newest complete one under output.dir)
 * into d and the loader after checking its config; *step gets its step, dir
 * its path; sum gets the steps, skipped count and first loss so far. */
mf_status mf_train_ckpt_load(const mf_config *cfg, const char *want, const mf_ckpt_data *d, mf_loader *l,
                             mf_train_summary *sum, char *dir, size_t cap, int64_t *step);
/* The state a checkpoint of `step` records besides the tensors. */
mf_ckpt_state mf_train_ckpt_state(const mf_loader *l, const mf_config *cfg, int64_t step,
                                  const mf_train_summary *sum);
/* The line a written checkpoint gets on stderr: its dir, bytes, write seconds
 * and rate; `paused` >= 0 for one written beside training (the seconds
 * training paused to snapshot it). */
void mf_train_ckpt_log(const mf_ckpt_stats *cs, double paused);

/* -------------------------------------------------------- ckpt_async.c */

/* Checkpoints written on a thread of their own from a snapshot while the
 * loop trains on (output.checkpoint_async). */
typedef struct mf_ckpt_async mf_ckpt_async;
typedef struct mf_ckpt_async_result {
  mf_status st;
  char err[2048];      /* the writer's error message (st != MF_OK) */
  mf_ckpt_stats stats; /* the files' figures (mf_ckpt_write_files) */
  int64_t step;        /* the checkpoint's step */
} mf_ckpt_async_result;
/* Bytes of the snapshot for table t (master, moments as stored, AdamW steps,
 * routing counts). */
size_t mf_ckpt_async_bytes(const mf_param_table *t, mf_dtype moments, size_t n_routed);
/* The writer for ckw with its snapshot allocated (MF_ERR_OUT_OF_MEMORY naming
 * it when the host has not the room) and its thread started. */
mf_status mf_ckpt_async_create(mf_ckpt_writer *ckw, const mf_param_table *t, mf_dtype moments,
                               size_t n_routed, mf_ckpt_async **out);
void mf_ckpt_async_free(mf_ckpt_async *a); /* waits for a write in flight; NULL is fine */
/* Copies d into the snapshot (on pool's threads; NULL: this one) and hands
 * the write of checkpoint s to the thread: everything but COMPLETE. A write
 * still in flight is an error: wait for it first. */
mf_status mf_ckpt_async_start(mf_ckpt_async *a, const mf_ckpt_data *d, const mf_ckpt_state *s,
                              mf_threadpool *pool);
/* The write in flight, taken back: 1 and *r when there was one and it ended
 * (block: waits for it to end), else 0. */
int mf_ckpt_async_wait(mf_ckpt_async *a, int block, mf_ckpt_async_result *r);

#ifdef __cplusplus
}
#endif

#endif /* MF_TRAIN_INTERNAL_H */
