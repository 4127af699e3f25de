/* Copies through the pinned staging arena (exec.h, "the pinned staging arena").
 *
 * Per slab k of the layout (planner/staging.h), in the order the executor
 * submits its instructions:
 *
 * The waits between slabs are the layout's (planner/staging.h wait_slab,
 * wait_host), checked when it is taken.
 *
 *   H2D slab (first copy at instruction f, last at l)
 *     at f, fill stream:  wait ev_free[wait_slab[k]]   the previous occupant's DMAs
 *                         wait ev_free[wait_host[k]]   the copy-out of offloaded activations it reads
 *                         [tf0] host: fill k [tf1], record ev_fill[k]
 *     at f, h2d stream:   wait ev_fill[k]; then each copy's DMA at its instruction
 *     at l, h2d stream:   (poison k), record ev_free[k]
 *   D2H slab
 *     at f, d2h stream:   wait ev_free[wait_slab[k]]   the previous occupant's copy-out
 *     each copy's DMA at its instruction
 *     at l, d2h stream:   record ev_dma[k]
 *           drain stream: wait ev_dma[k]; [tf0] host: copy-out k [tf1]; record ev_free[k]
 *
 * Every wait names an event recorded earlier in submission order (checked
 * when the layout is taken), so no stream waits for work not yet submitted.
 * A slab with nothing to fill or copy out this step (idle experts, current
 * persistent copies) skips its host function but still records ev_free, so
 * a later slab that waits for it also waits, through it, for what it waited
 * for. Nothing is allocated after mf_exec_use_staging.
 *
 * What one slab submits (its fill, DMA, release, copy-out: mf_exec_slab_*,
 * exec_internal.h) is apart from the step's decisions, so that the stager
 * (exec_stager.c: bytes streamed through slabs, what `moefit bench kernels`
 * times) runs the same code.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/exec/exec_internal.h"

/* ------------------------------------------------------- host copies */

static void poison(uint8_t *p, size_t bytes) {
  const uint32_t nan_bits = 0x7fc07fc0u; /* NaN as one fp32 and as each of two bf16 */
  size_t i = 0;
  for (; i + 4 <= bytes; i += 4) memcpy(p + i, &nan_bits, 4);
  memset(p + i, 0xff, bytes - i);
}

/* The part [lo, hi) of slab k's host copies, counted in bytes along its
 * copies one after the other (an AdamW state copy is its parts in order). A
 * bf16 tensor may have a byte count that is not a multiple of 4, so a part's
 * edges may fall inside a float of a later copy: an ADD (fp32 gradients, a
 * multiple of 4 bytes) takes the floats that start in [a, e) after rounding
 * both down to a float, so the parts that meet at an edge take each float
 * once. */
static void host_copies(exec_staging *g, int32_t k, size_t lo, size_t hi) {
  const mf_staging *L = g->L;
  const mf_staging_slab *sl = &L->slabs[k];
  const int h2d = sl->dir == MF_I_H2D;
  size_t at = 0; /* where the current copy starts in that count */
  for (int32_t c = sl->first_copy; c < sl->first_copy + sl->n_copies && at < hi; c++) {
    const mf_staging_copy *cp = &L->copies[c];
    const sg_copy_rt *r = &g->rt[c];
    const size_t n = cp->bytes, a = lo > at ? lo - at : 0, e = hi - at < n ? hi - at : n;
    at += n;
    if (a >= e || r->mode == MF_SG_SKIP) continue;
    uint8_t *slab = g->mem + cp->offset;
    uint8_t *host = (uint8_t *)r->host;
    switch (r->mode) {
      case MF_SG_COPY:
        if (h2d)
          memcpy(slab + a, host + a, e - a);
        else
          memcpy(host + a, slab + a, e - a);
        break;
      case MF_SG_PARTS: /* H2D: a tensor, or AdamW state's parts one after another */
        mf_exec_src_copy(&r->src, slab, a, e);
        break;
      case MF_SG_ADD: { /* a gradient added into the host's sum, float by float */
        float *dst = (float *)host;
        const float *src = (const float *)slab;
        for (size_t i = a / sizeof(float); i < e / sizeof(float); i++) dst[i] += src[i];
        break;
      }
      case MF_SG_ZERO:
        memset(host + a, 0, e - a);
        break;
      default:
        break;
    }
  }
}

static size_t slab_copy_bytes(const exec_staging *g, int32_t k) {
  const mf_staging_slab *sl = &g->L->slabs[k];
  size_t n = 0;
  for (int32_t c = sl->first_copy; c < sl->first_copy + sl->n_copies; c++) n += g->L->copies[c].bytes;
  return n;
}

static void host_copies_task(void *ctx, int i, int n) {
  const sg_slab_ctx *c = (const sg_slab_ctx *)ctx;
  size_t lo = 0, hi = 0;
  mf_partition(slab_copy_bytes(c->g, c->slab), 256, i, n, &lo, &hi);
  host_copies(c->g, c->slab, lo, hi);
}

static void run_host_copies(exec_staging *g, int32_t k, mf_threadpool *pool) {
  if (pool)
    mf_threadpool_run(pool, host_copies_task, &g->ctx[k]);
  else
    host_copies(g, k, 0, SIZE_MAX);
}

/* The fill stream's host function: slab k from host memory. */
static void fill_fn(void *ctx) {
  const sg_slab_ctx *c = (const sg_slab_ctx *)ctx;
  run_host_copies(c->g, c->slab, c->g->pool[0]);
}

/* The h2d stream's, after a slab's last DMA (poison mode). */
static void poison_fn(void *ctx) {
  const sg_slab_ctx *c = (const sg_slab_ctx *)ctx;
  const mf_staging_slab *sl = &c->g->L->slabs[c->slab];
  poison(c->g->mem + sl->offset, sl->bytes);
}

/* The drain stream's: slab k home — each gradient's turn awaited first
 * (mf_exec_param_hooks.grad_wait: here, not where the copy is submitted, so
 * that the wait holds up only the copies home) — then the finished
 * gradients handed over. */
static void drain_fn(void *ctx) {
  const sg_slab_ctx *c = (const sg_slab_ctx *)ctx;
  exec_staging *g = c->g;
  const mf_staging_slab *sl = &g->L->slabs[c->slab];
  const mf_exec_param_hooks *h = g->x ? &g->x->hooks : NULL;
  for (int32_t k = sl->first_copy; h && h->grad_wait && k < sl->first_copy + sl->n_copies; k++) {
    if (g->rt[k].turn < 0 || g->turn_st != MF_OK) continue;
    const mf_status st = h->grad_wait(h->ctx, g->rt[k].turn);
    if (st != MF_OK) {
      snprintf(g->turn_err, sizeof g->turn_err, "%s", mf_last_error());
      g->turn_st = st;
    }
  }
  if (g->turn_st != MF_OK) return; /* out of turn: nothing added, nothing handed over (the step fails) */
  run_host_copies(g, c->slab, g->pool[1]);
  for (int32_t k = sl->first_copy; h && k < sl->first_copy + sl->n_copies; k++)
    if (g->rt[k].home >= 0 && h->grad_home) h->grad_home(h->ctx, g->rt[k].home);
  if (g->o.poison) poison(g->mem + sl->offset, sl->bytes);
}

/* ------------------------------------------------------------- the slabs
 *
 * What one slab's fill, DMAs and copy-out submit (the top of the file): the
 * executor's step below and the stager (exec_stager.c) both call these. */

static mf_status wait_for(exec_staging *g, mf_stream *s, int32_t slab) {
  if (slab < 0) return MF_OK;
  return g->b->stream_wait(g->b, s, g->ev_free[slab]);
}

mf_status mf_exec_slab_fill(exec_staging *g, int32_t k) {
  mf_backend *b = g->b;
  if (!g->o.drop_waits) MF_CHECK(wait_for(g, g->fill, g->L->wait_slab[k]));
  MF_CHECK(wait_for(g, g->fill, g->L->wait_host[k]));
  if (g->tf0) MF_CHECK(b->event_record(b, g->tf0[k], g->fill));
  MF_CHECK(b->host_fn(b, g->fill, fill_fn, &g->ctx[k]));
  if (g->tf1) MF_CHECK(b->event_record(b, g->tf1[k], g->fill));
  MF_CHECK(b->event_record(b, g->ev_fill[k], g->fill));
  return b->stream_wait(b, g->h2d, g->ev_fill[k]);
}

mf_status mf_exec_slab_dma(exec_staging *g, int32_t c, void *dev) {
  const mf_staging_copy *cp = &g->L->copies[c];
  if (g->L->slabs[cp->slab].dir == MF_I_H2D)
    return g->b->copy(g->b, dev, g->mem + cp->offset, cp->bytes, MF_COPY_H2D, g->h2d);
  return g->b->copy(g->b, g->mem + cp->offset, dev, cp->bytes, MF_COPY_D2H, g->d2h);
}

mf_status mf_exec_slab_uploaded(exec_staging *g, int32_t k) {
  mf_backend *b = g->b;
  if (g->o.poison && g->work[k]) MF_CHECK(b->host_fn(b, g->h2d, poison_fn, &g->ctx[k]));
  return b->event_record(b, g->ev_free[k], g->h2d);
}

mf_status mf_exec_slab_wait(exec_staging *g, int32_t k) {
  return g->o.drop_waits ? MF_OK : wait_for(g, g->d2h, g->L->wait_slab[k]);
}

mf_status mf_exec_slab_drain(exec_staging *g, int32_t k, int work) {
  mf_backend *b = g->b;
  g->work[k] = (uint8_t)work;
  MF_CHECK(b->event_record(b, g->ev_dma[k], g->d2h));
  MF_CHECK(b->stream_wait(b, g->drain, g->ev_dma[k]));
  if (work) {
    if (g->tf0) MF_CHECK(b->event_record(b, g->tf0[k], g->drain));
    MF_CHECK(b->host_fn(b, g->drain, drain_fn, &g->ctx[k]));
    if (g->tf1) MF_CHECK(b->event_record(b, g->tf1[k], g->drain));
  }
  return b->event_record(b, g->ev_free[k], g->drain);
}

mf_status mf_exec_slabs_sync(exec_staging *g) {
  MF_CHECK(g->b->stream_sync(g->b, g->fill));
  MF_CHECK(g->b->stream_sync(g->b, g->drain));
  if (g->turn_st != MF_OK) return MF_ERR(g->turn_st, "%s", g->turn_err);
  return MF_OK;
}

/* ------------------------------------------------------------- the step */

static int first_of(const exec_staging *g, int32_t c) {
  return c == g->L->slabs[g->L->copies[c].slab].first_copy;
}
static int last_of(const exec_staging *g, int32_t c) {
  const mf_staging_slab *sl = &g->L->slabs[g->L->copies[c].slab];
  return c == sl->first_copy + sl->n_copies - 1;
}

/* Slab k's fill: every copy decided now, the gate passed for its weights, then
 * the host function once what it overwrites and what it reads are ready. */
static mf_status fill_begin(mf_exec *x, int32_t k, const step_io *io) {
  exec_staging *g = x->sg;
  const mf_staging_slab *sl = &g->L->slabs[k];
  int work = 0;
  for (int32_t c = sl->first_copy; c < sl->first_copy + sl->n_copies; c++) {
    const mf_instr *in = &x->s->instr[g->L->copies[c].instr];
    if (x->hooks.wait || x->hooks.grad_wait) MF_CHECK(mf_exec_param_gate(x, in, 0));
    sg_copy_rt *r = &g->rt[c];
    MF_CHECK(mf_exec_h2d_source(x, in->slot, io, &r->src));
    r->host = NULL;
    r->turn = -1;
    r->mode = r->src.n ? MF_SG_PARTS : MF_SG_SKIP;
    work |= r->mode != MF_SG_SKIP;
  }
  g->work[k] = (uint8_t)work;
  return work ? mf_exec_slab_fill(g, k) : MF_OK;
}

mf_status mf_exec_sg_before(mf_exec *x, int32_t i, const step_io *io) {
  exec_staging *g = x->sg;
  const int32_t c = g->L->copy_of_instr[i];
  const int32_t k = g->L->copies[c].slab;
  const mf_instr *in = &x->s->instr[i];
  if (in->kind == MF_I_H2D) return first_of(g, c) ? fill_begin(x, k, io) : MF_OK;
  void *dst = NULL;
  d2h_mode mode = D2H_NONE;
  MF_CHECK(mf_exec_d2h_target(x, in, io, &dst, &mode));
  sg_copy_rt *r = &g->rt[c];
  r->host = dst;
  r->src.n = 0;
  r->mode = mode == D2H_COPY   ? MF_SG_COPY
            : mode == D2H_ADD  ? MF_SG_ADD
            : mode == D2H_ZERO ? MF_SG_ZERO
                               : MF_SG_SKIP;
  r->home = x->hooks.grad_home && x->grad_final[i] >= 0 && io->grads ? x->grad_final[i] : -1;
  const mf_ptensor *pt = &x->p->tensors[x->s->slots[in->slot].tensor];
  r->turn = x->hooks.grad_wait && pt->kind == MF_T_GRAD && io->grads ? pt->param : -1;
  return first_of(g, c) ? mf_exec_slab_wait(g, k) : MF_OK;
}

mf_status mf_exec_sg_copy(mf_exec *x, int32_t i) {
  exec_staging *g = x->sg;
  const int32_t c = g->L->copy_of_instr[i];
  const uint8_t mode = g->rt[c].mode;
  uint8_t *dev = mf_exec_slot_ptr(x, x->s->instr[i].slot);
  if (x->s->instr[i].kind == MF_I_H2D) return mode == MF_SG_SKIP ? MF_OK : mf_exec_slab_dma(g, c, dev);
  if (mode != MF_SG_COPY && mode != MF_SG_ADD)
    return MF_OK; /* nothing to bring home: zeros, or no destination */
  return mf_exec_slab_dma(g, c, dev);
}

mf_status mf_exec_sg_after(mf_exec *x, int32_t i) {
  exec_staging *g = x->sg;
  const int32_t c = g->L->copy_of_instr[i];
  if (!last_of(g, c)) return MF_OK;
  const int32_t k = g->L->copies[c].slab;
  const mf_staging_slab *sl = &g->L->slabs[k];
  if (x->s->instr[i].kind == MF_I_H2D) return mf_exec_slab_uploaded(g, k);
  int work = g->o.poison;
  for (int32_t j = sl->first_copy; j < sl->first_copy + sl->n_copies; j++)
    work |= g->rt[j].mode != MF_SG_SKIP || g->rt[j].home >= 0;
  return mf_exec_slab_drain(g, k, work);
}

mf_status mf_exec_sg_sync(mf_exec *x) {
  return mf_exec_slabs_sync(x->sg);
}

mf_status mf_exec_sg_busy(mf_exec *x, double *fill_s, double *drain_s) {
  exec_staging *g = x->sg;
  *fill_s = *drain_s = 0;
  if (!g->tf0) return MF_OK;
  for (int32_t k = 0; k < g->L->n_slabs; k++) {
    const mf_staging_slab *sl = &g->L->slabs[k];
    if (!g->work[k] || g->L->copies[sl->first_copy].instr >= x->s->optim_begin) continue;
    double dt = 0;
    MF_CHECK(x->b->event_elapsed(x->b, g->tf0[k], g->tf1[k], &dt));
    *(sl->dir == MF_I_H2D ? fill_s : drain_s) += dt;
  }
  return MF_OK;
}

/* ------------------------------------------------------- taking a layout */

void mf_exec_slabs_free(exec_staging *g) {
  if (!g) return;
  mf_backend *b = g->b;
  const size_t n = (size_t)g->L->n_slabs;
  if (g->fill) b->stream_free(b, g->fill);
  if (g->drain) b->stream_free(b, g->drain);
  mf_exec_free_events(b, g->ev_fill, n);
  mf_exec_free_events(b, g->ev_free, n);
  mf_exec_free_events(b, g->ev_dma, n);
  mf_exec_free_events(b, g->tf0, n);
  mf_exec_free_events(b, g->tf1, n);
  if (g->mem) b->host_free(b, g->mem);
  for (int k = 0; k < 2; k++) mf_threadpool_free(g->pool[k]);
  free(g->work);
  free(g->rt);
  free(g->ctx);
  free(g);
}

void mf_exec_sg_free(mf_exec *x) {
  mf_exec_slabs_free(x->sg);
  x->sg = NULL;
}

mf_status mf_exec_slabs_create(mf_backend *b, const mf_staging *L, const mf_exec_staging_opts *o, int timed,
                               exec_staging **out) {
  if (!b->host_fn)
    return MF_ERR(MF_ERR_UNSUPPORTED,
                  "executor: the %s backend cannot run host functions, which staging needs",
                  b->name ? b->name : "?");
  exec_staging *g = (exec_staging *)calloc(1, sizeof *g);
  if (!g) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "executor: out of memory for staging");
  g->b = b;
  g->L = L;
  if (o) g->o = *o;
  const size_t n = (size_t)(L->n_slabs ? L->n_slabs : 1);
  mf_status st = MF_OK;
  MF_CHECK_GOTO(mf_calloc(n, sizeof(mf_event *), "staging events", (void **)&g->ev_fill), st, fail);
  MF_CHECK_GOTO(mf_calloc(n, sizeof(mf_event *), "staging events", (void **)&g->ev_free), st, fail);
  MF_CHECK_GOTO(mf_calloc(n, sizeof(mf_event *), "staging events", (void **)&g->ev_dma), st, fail);
  MF_CHECK_GOTO(mf_calloc(n, 1, "staging", (void **)&g->work), st, fail);
  MF_CHECK_GOTO(mf_calloc(n, sizeof(sg_slab_ctx), "staging", (void **)&g->ctx), st, fail);
  MF_CHECK_GOTO(
      mf_calloc((size_t)(L->n_copies ? L->n_copies : 1), sizeof(sg_copy_rt), "staging", (void **)&g->rt), st,
      fail);
  for (int32_t c = 0; c < L->n_copies; c++) g->rt[c].home = -1;
  for (int32_t k = 0; k < L->n_slabs; k++) {
    g->ctx[k] = (sg_slab_ctx){g, k};
    MF_CHECK_GOTO(b->event_create(b, &g->ev_free[k]), st, fail);
    MF_CHECK_GOTO(b->event_create(b, L->slabs[k].dir == MF_I_H2D ? &g->ev_fill[k] : &g->ev_dma[k]), st, fail);
  }
  if (timed) {
    MF_CHECK_GOTO(mf_calloc(n, sizeof(mf_event *), "staging events", (void **)&g->tf0), st, fail);
    MF_CHECK_GOTO(mf_calloc(n, sizeof(mf_event *), "staging events", (void **)&g->tf1), st, fail);
    for (int32_t k = 0; k < L->n_slabs; k++) {
      MF_CHECK_GOTO(b->event_create_timed(b, &g->tf0[k]), st, fail);
      MF_CHECK_GOTO(b->event_create_timed(b, &g->tf1[k]), st, fail);
    }
  }
  MF_CHECK_GOTO(b->stream_create(b, &g->fill), st, fail);
  MF_CHECK_GOTO(b->stream_create(b, &g->drain), st, fail);
  if (g->o.threads > 1)
    for (int k = 0; k < 2; k++) MF_CHECK_GOTO(mf_threadpool_create(g->o.threads, &g->pool[k]), st, fail);
  {
    void *mem = NULL;
    MF_CHECK_GOTO(b->host_alloc(b, L->arena_bytes, &mem), st, fail);
    g->mem = (uint8_t *)mem;
  }
  if (g->o.poison) poison(g->mem, L->arena_bytes);
  *out = g;
  return MF_OK;
fail:
  mf_exec_slabs_free(g);
  return st;
}

/* The layout must be this schedule's: a copy for every H2D and D2H
 * instruction, each slab a run of them on one stream in order, inside the
 * arena, within one part of the schedule. */
static mf_status check_layout(const mf_exec *x, const mf_staging *L) {
  const mf_schedule *s = x->s;
  if (L->n_instr != s->n_instr || !L->copy_of_instr || (L->n_copies > 0 && (!L->copies || !L->slabs)))
    return MF_ERR(MF_ERR_INVALID_ARG,
                  "executor: the staging layout is of a schedule of %d instructions, not %d", L->n_instr,
                  s->n_instr);
  int32_t n_copy = 0;
  for (int32_t i = 0; i < s->n_instr; i++) {
    const mf_instr *in = &s->instr[i];
    const int copies = in->kind == MF_I_H2D || in->kind == MF_I_D2H;
    const int32_t c = L->copy_of_instr[i];
    if (!copies) {
      if (c != -1)
        return MF_ERR(MF_ERR_INVALID_ARG, "executor: staging layout: instruction %d copies nothing", i);
      continue;
    }
    if (c == -1) continue; /* straight from or into its home (a pinned one: planner/run_plan.h) */
    n_copy++;
    if (c < 0 || c >= L->n_copies || L->copies[c].instr != i ||
        L->copies[c].tensor != s->slots[in->slot].tensor ||
        L->copies[c].bytes != mf_exec_slot_bytes(x, in->slot))
      return MF_ERR(MF_ERR_INVALID_ARG, "executor: staging layout: instruction %d has no copy of its tensor",
                    i);
  }
  if (n_copy != L->n_copies)
    return MF_ERR(MF_ERR_INVALID_ARG, "executor: staging layout: %d copies for %d staged copy instructions",
                  L->n_copies, n_copy);
  int32_t next = 0, prev_instr[2] = {-1, -1};
  for (int32_t k = 0; k < L->n_slabs; k++) {
    const mf_staging_slab *sl = &L->slabs[k];
    const int dir = sl->dir == MF_I_D2H;
    if ((sl->dir != MF_I_H2D && sl->dir != MF_I_D2H) || (k < L->n_h2d_slabs) != (sl->dir == MF_I_H2D) ||
        sl->first_copy != next || sl->n_copies <= 0 || sl->offset > L->arena_bytes ||
        sl->bytes > L->arena_bytes - sl->offset ||
        (dir ? sl->offset < L->h2d_region_bytes : sl->offset + sl->bytes > L->h2d_region_bytes))
      return MF_ERR(MF_ERR_INVALID_ARG, "executor: staging layout: slab %d is malformed", k);
    next += sl->n_copies;
    if (next > L->n_copies)
      return MF_ERR(MF_ERR_INVALID_ARG, "executor: staging layout: slab %d overruns", k);
    const int part = L->copies[sl->first_copy].instr >= s->optim_begin;
    for (int32_t c = sl->first_copy; c < next; c++) {
      const mf_staging_copy *cp = &L->copies[c];
      if (cp->slab != k || s->instr[cp->instr].kind != sl->dir || cp->instr <= prev_instr[dir] ||
          (cp->instr >= s->optim_begin) != part || cp->offset < sl->offset || cp->bytes > sl->bytes ||
          cp->offset - sl->offset > sl->bytes - cp->bytes)
        return MF_ERR(MF_ERR_INVALID_ARG, "executor: staging layout: copy %d of slab %d is out of place", c,
                      k);
      prev_instr[dir] = cp->instr;
    }
  }
  if (next != L->n_copies)
    return MF_ERR(MF_ERR_INVALID_ARG, "executor: staging layout: copies outside slabs");
  return MF_OK;
}

/* The layout's order between slabs (planner/staging.h wait_slab, wait_host):
 * every wait names a slab whose event is recorded earlier in submission
 * order — for wait_slab an earlier slab of the same direction (its last DMA
 * or its copy-out is submitted at its last copy, before this slab's first),
 * for wait_host a D2H slab whose copy-out is submitted before this H2D slab's
 * fill — so no stream waits for work not yet submitted; and an H2D slab that
 * uploads an offloaded activation waits for some copy-out. */
static int32_t last_instr(const mf_staging *L, int32_t slab) {
  return L->copies[L->slabs[slab].first_copy + L->slabs[slab].n_copies - 1].instr;
}

static mf_status check_waits(const mf_exec *x, const mf_staging *L) {
  if (L->n_slabs > 0 && (!L->wait_slab || !L->wait_host))
    return MF_ERR(MF_ERR_INVALID_ARG, "executor: staging layout: no order between its slabs");
  for (int32_t k = 0; k < L->n_slabs; k++) {
    const mf_staging_slab *sl = &L->slabs[k];
    const int32_t first = L->copies[sl->first_copy].instr, ws = L->wait_slab[k], wh = L->wait_host[k];
    if (ws < -1 || ws >= k || (ws >= 0 && (L->slabs[ws].dir != sl->dir || last_instr(L, ws) >= first)))
      return MF_ERR(MF_ERR_INVALID_ARG,
                    "executor: staging layout: slab %d waits for slab %d, not an earlier one of its stream",
                    k, ws);
    if (wh < -1 || wh >= L->n_slabs || (wh >= 0 && (sl->dir != MF_I_H2D || L->slabs[wh].dir != MF_I_D2H)))
      return MF_ERR(MF_ERR_INVALID_ARG, "executor: staging layout: slab %d waits for the copy-out of slab %d",
                    k, wh);
    if (wh >= 0 && last_instr(L, wh) >= first)
      return MF_ERR(
          MF_ERR_INVALID_ARG,
          "executor: staging layout: slab %d reads activations home before slab %d, which copies them "
          "out, is done",
          k, wh);
    if (sl->dir != MF_I_H2D || wh >= 0) continue;
    for (int32_t c = sl->first_copy; c < sl->first_copy + sl->n_copies; c++)
      if (x->s->host_offset[L->copies[c].tensor] != SIZE_MAX)
        return MF_ERR(MF_ERR_INVALID_ARG,
                      "executor: staging layout: slab %d reads %s home but waits for no copy-out", k,
                      x->p->tensors[L->copies[c].tensor].name);
  }
  return MF_OK;
}

mf_status mf_exec_use_staging(mf_exec *x, const mf_staging *L, const mf_exec_staging_opts *o) {
  if (!L) return MF_ERR(MF_ERR_INVALID_ARG, "executor: no staging layout");
  if (x->sg) return MF_ERR(MF_ERR_INVALID_ARG, "executor: a staging layout is set already");
  if (!x->b->host_fn) /* before the checks: the reason a backend cannot stage at all */
    return MF_ERR(MF_ERR_UNSUPPORTED,
                  "executor: the %s backend cannot run host functions, which staging needs",
                  x->b->name ? x->b->name : "?");
  MF_CHECK(check_layout(x, L));
  MF_CHECK(check_waits(x, L));
  exec_staging *g = NULL;
  MF_CHECK(mf_exec_slabs_create(x->b, L, o, x->timed, &g));
  g->x = x;
  g->h2d = x->st[MF_EXEC_H2D];
  g->d2h = x->st[MF_EXEC_D2H];
  x->sg = g;
  return MF_OK;
}
