/*
 * The executor's state and the helpers its two files share: exec.c (create,
 * the cross-stream order, the step) and exec_staging.c (copies through the
 * pinned staging arena). Private to src/exec.
 */
#ifndef MF_EXEC_EXEC_INTERNAL_H
#define MF_EXEC_EXEC_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "src/exec/exec.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct exec_staging exec_staging; /* exec_staging.c */

/* A gradient's hand-over to the hooks from a host function (exec.c). */
typedef struct home_ctx {
  struct mf_exec *x;
  int32_t param;
} home_ctx;

/* A small result the host reads once the step is done (no sync inside it). */
enum { READ_AUX = 0, READ_CE = 1 };

struct mf_exec {
  const mf_program *p;
  const mf_schedule *s;
  mf_schedule *owned; /* the default schedule, when we built it */
  mf_decisions *owned_dec;
  mf_backend *b;
  mf_stream *st[MF_EXEC_STREAMS]; /* compute, h2d, d2h (exec.h "timing") */
  /* Cross-stream order, the schedule's (mf_schedule_waits, kept by it):
   * instruction i waits, on its stream, for instruction wait_on[3 i + k] of
   * stream k (-1: none); ev[i] is recorded after instruction i when some
   * instruction waits for it (else NULL). */
  const int32_t *wait_on;
  mf_event **ev;
  /* Busy time (backends with timed events): t0[i] and t1[i] are recorded on
   * instruction i's stream around its work. NULL: not timed. */
  mf_event **t0, **t1;
  uint8_t *arena;
  uint8_t *host_act; /* host copies of offloaded activations */
  int host_act_pinned; /* host_act from the backend's host_alloc (else malloc) */
  float *grad_scratch;
  void **expert_ptrs;
  int32_t *starts; /* slots ordered by first instruction */
  int32_t *ends;   /* slots ordered by last instruction */
  size_t peak_live;
  uint64_t h2d, d2h;
  float *capture;
  int64_t captured; /* bf16 values the step copied into capture's first half, to widen (0: none) */
  int64_t *expert_tokens; /* [L * E] */
  int64_t *n_valid;       /* [G] counted target tokens of each micro-batch, this step */
  /* Routing-aware transfers: the micro-batches whose expert ops use each slot
   * (an expert weight's or gradient's; -1 for others). Each micro-batch's
   * tokens per expert of each layer are copied home (host_alloc'd route_host)
   * after its dispatch, without a wait; route_ev[m L + l] is recorded after
   * that copy and route_state says where it stands this step (0: not copied,
   * 1: copied, maybe not landed, 2: landed: the host may read it). */
  int32_t *slot_mlo, *slot_mhi; /* [n_slots] */
  int64_t *route_host;          /* [G * L * E] */
  mf_event **route_ev;          /* [G * L] */
  uint8_t *route_state;         /* [G * L] */
  uint64_t h2d_skipped, d2h_skipped;
  /* Loss scalars copied home (host_alloc'd, 2 doubles each) in submission
   * order, read after the step's last sync. */
  double *scalars;
  uint8_t *read_kind; /* [max_reads] READ_AUX or READ_CE */
  int32_t n_reads, max_reads;
  int32_t *pos;              /* [B*S] token positions (set at create) */
  int timed;                 /* busy time from the backend's timed events */
  mf_exec_stats stats;       /* the last step's */
  double *instr_s;           /* [n_instr] per-instruction seconds, when turned on */
  /* MF_LOG=debug: the host's seconds submitting each kernel kind (RUN, ZERO,
   * ACCUM) and the copies (at MF_K_COUNT_), logged after each step. */
  int host_prof;
  double host_kind_s[MF_K_COUNT_ + 1];
  int64_t host_kind_n[MF_K_COUNT_ + 1];
  mf_exec_param_hooks hooks; /* host optimizer hand-off (zero: none) */
  int grads_add;             /* mf_exec_set_grads_add */
  const uint8_t *grads_own;  /* mf_exec_set_grads_own (NULL: none) */
  mf_exec_exchange exchange; /* expert parallelism's exchanges (zero: none) */
  int32_t *grad_final;       /* [n_instr] the parameter whose gradient is complete after it, or -1 */
  int32_t *upload_order;     /* [n_params] */
  home_ctx *homes;           /* [n_params] the hand-over's host function argument */
  /* The optimizer on the device. */
  double *norm_host;                  /* [norm_chunks] the norm chunk sums' landing place (host_alloc) */
  void *m_host, *v_host;              /* the host moments (mf_exec_set_optim_state) */
  uint16_t *working;                  /* BF16 storage: the host's bf16 working copy (mf_exec_set_working_copy) */
  const uint64_t *dropout_seeds;      /* [G] each micro-batch's dropout seed (mf_exec_set_dropout_seeds) */
  const float *params_host;           /* the fp32 master weights of the last mf_exec_step (BF16 storage: the
                                         device optimizer's state fill takes its master from them) */
  int weights_current, state_current; /* the persistent slots hold the truth */
  int step_done;                      /* mf_exec_step ran [0, optim_begin) and mf_exec_optimize may follow */
  /* Progress through the instructions, kept between the step and its optimizer part. */
  int32_t ns, ne;
  size_t live;
  exec_staging *sg; /* NULL: copies straight between host memory and the arena */
};

/* The host side of one step. */
typedef struct step_io {
  const float *params;
  const int32_t *const *ids;
  const int32_t *const *targets;
  const int32_t *positions;
  float *grads;
  const int64_t *n_valid;
} step_io;

static inline uint8_t *mf_exec_slot_ptr(const mf_exec *x, int32_t slot) {
  return x->arena + x->s->slots[slot].offset;
}
static inline size_t mf_exec_slot_bytes(const mf_exec *x, int32_t slot) {
  return x->p->tensors[x->s->slots[slot].tensor].bytes;
}

/* What an H2D of a slot reads this step: n parts laid end to end in the
 * slot — one for a tensor; AdamW state: m and v, with BF16 storage after the
 * fp32 master. n = 0: nothing (a persistent copy that is current, an idle
 * expert). */
typedef struct mf_exec_src {
  const void *part[3];
  size_t bytes[3];
  int n;
} mf_exec_src;

/* Fills *src for `slot` and counts the traffic. */
mf_status mf_exec_h2d_source(mf_exec *x, int32_t slot, const step_io *io, mf_exec_src *src);

/* Bytes [a, e) of what src lays end to end, copied to dst + a. */
void mf_exec_src_copy(const mf_exec_src *src, uint8_t *dst, size_t a, size_t e);

/* Where a D2H instruction's bytes go this step (*dst) and how. Counts the traffic. */
typedef enum d2h_mode { D2H_NONE = 0, D2H_COPY, D2H_ADD, D2H_ZERO } d2h_mode;
mf_status mf_exec_d2h_target(mf_exec *x, const mf_instr *in, const step_io *io, void **dst, d2h_mode *mode);

/* The wait hook for an instruction that touches a parameter's host copies. */
/* grad_wait: also the hooks' grad_wait before a gradient's copy home (0: a
 * staged copy, whose copy-out waits instead). */
mf_status mf_exec_param_gate(mf_exec *x, const mf_instr *in, int grad_wait);

/* Frees the non-NULL events of ev[n], then ev. */
void mf_exec_free_events(mf_backend *b, mf_event **ev, size_t n);

/* ------------------------------------------- the staging slabs (exec_staging.c)
 *
 * What a slab's copies do this step (exec_staging.c decides it per step for
 * the executor; the stager, exec_stager.c, per call). */
enum { MF_SG_SKIP = 0, MF_SG_COPY, MF_SG_PARTS, MF_SG_ADD, MF_SG_ZERO };

typedef struct sg_copy_rt {
  void *host;      /* D2H: the destination */
  mf_exec_src src; /* H2D (MF_SG_PARTS): the host parts laid end to end in the slab */
  uint8_t mode;
  int32_t home; /* D2H: the parameter whose gradient is final once this copy is out (grad_home), or -1 */
  int32_t turn; /* D2H of a gradient: its parameter (the copy-out calls grad_wait first), or -1 */
} sg_copy_rt;

typedef struct sg_slab_ctx {
  exec_staging *g;
  int32_t slab;
} sg_slab_ctx;

/* The slabs of a layout in pinned memory, with the streams, events and host
 * threads that fill them and copy them out: the executor's (x set, its h2d
 * and d2h streams borrowed) or the stager's (x NULL, streams its own). */
struct exec_staging {
  mf_exec *x; /* NULL: no executor (no hooks to call) */
  mf_backend *b;
  const mf_staging *L;
  mf_exec_staging_opts o;
  uint8_t *mem;
  mf_stream *fill, *drain;
  mf_stream *h2d, *d2h;                    /* the DMAs' streams (not owned) */
  mf_event **ev_fill, **ev_free, **ev_dma; /* [n_slabs] */
  mf_event **tf0, **tf1;                   /* [n_slabs] timed, around a fill or a copy-out (when timed) */
  uint8_t *work;                           /* [n_slabs] its host function ran in its part of the step */
  sg_copy_rt *rt;                          /* [n_copies] this step's decisions */
  sg_slab_ctx *ctx;                        /* [n_slabs] */
  mf_threadpool *pool[2];                  /* fills, copy-outs (threads > 1) */
  /* A copy-out's grad_wait that failed (it runs where no status returns):
   * its status and message, reported by mf_exec_slabs_sync. */
  mf_status turn_st;
  char turn_err[1024];
};

/* The slabs of L (kept by the caller) on b: the pinned arena, two streams,
 * the events (timed ones too with `timed`), the host threads of o. */
mf_status mf_exec_slabs_create(mf_backend *b, const mf_staging *L, const mf_exec_staging_opts *o, int timed,
                               exec_staging **out);
void mf_exec_slabs_free(exec_staging *g); /* NULL is fine */
/* An H2D slab k whose copies are decided (g->rt): on the fill stream, after
 * its previous occupant's DMAs and the copy-out it reads, the host function
 * fills it; the h2d stream waits for the fill. */
mf_status mf_exec_slab_fill(exec_staging *g, int32_t k);
/* Copy c's DMA between its place in the arena and `dev`, on its direction's stream. */
mf_status mf_exec_slab_dma(exec_staging *g, int32_t c, void *dev);
/* After H2D slab k's last DMA: its bytes are free (poisoned first in poison mode). */
mf_status mf_exec_slab_uploaded(exec_staging *g, int32_t k);
/* Before D2H slab k's first DMA: the d2h stream waits for its previous occupant's copy-out. */
mf_status mf_exec_slab_wait(exec_staging *g, int32_t k);
/* After D2H slab k's last DMA: the drain stream copies it out (when `work`),
 * then its bytes are free. */
mf_status mf_exec_slab_drain(exec_staging *g, int32_t k, int work);
mf_status mf_exec_slabs_sync(exec_staging *g); /* the fill and drain streams */

/* exec_staging.c: the staged copies of instruction i (an H2D or a D2H), in
 * three parts around the instruction's own waits and timing events — before
 * (the slab's fill, the waits between slabs), the copy itself, after (the
 * slab's release: an event, the copy-out). */
mf_status mf_exec_sg_before(mf_exec *x, int32_t i, const step_io *io);
mf_status mf_exec_sg_copy(mf_exec *x, int32_t i);
mf_status mf_exec_sg_after(mf_exec *x, int32_t i);
mf_status mf_exec_sg_sync(mf_exec *x);
/* The last step's host seconds filling and draining slabs. */
mf_status mf_exec_sg_busy(mf_exec *x, double *fill_s, double *drain_s);
void mf_exec_sg_free(mf_exec *x);

#ifdef __cplusplus
}
#endif

#endif /* MF_EXEC_EXEC_INTERNAL_H */
