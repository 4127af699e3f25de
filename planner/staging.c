/* The compact pinned staging arena: slabs from a schedule's copies, their busy
 * intervals on the simulated timeline, and their packing (see staging.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "planner/staging.h"

#include "experts/experts.h"
#include "src/core/interval.h"

static size_t align_up(size_t x, size_t a) {
  return (x + a - 1) & ~(a - 1);
}

int64_t mf_staging_group_of(const mf_schedule *s, int32_t i) {
  if (!s || i < 0 || i >= s->n_instr) return -1;
  const mf_instr_kind k = s->instr[i].kind;
  if (k == MF_I_H2D) {
    for (int32_t j = i + 1; j < s->n_instr; j++)
      if (s->instr[j].kind == MF_I_RUN)
        return mf_experts_group_key(s->prog, s->instr[j].op, s->instr[j].recompute);
  } else if (k == MF_I_D2H) {
    for (int32_t j = i - 1; j >= 0; j--)
      if (s->instr[j].kind == MF_I_RUN)
        return mf_experts_group_key(s->prog, s->instr[j].op, s->instr[j].recompute);
  }
  return -1;
}

/* ------------------------------------------------------------ host model */

/* A unit of staging (a slab, or one copy for the pool): what the host does
 * with it and when its DMAs run. */
typedef struct unit {
  double traffic;            /* host-memory bytes moved filling or draining it */
  double dma_start, dma_end; /* first copy's start, last copy's end */
  double start, end;         /* busy interval (out) */
} unit;

/* Busy intervals of units of one direction, in stream order (staging.h): H2D
 * by a serial filler working as late as it can, D2H by a serial drainer
 * working as soon as it can. */
static double time_units(unit *u, int32_t n, int h2d, double host_bw) {
  double lag = 0.0; /* D2H: how long the latest slab waited for the drainer */
  if (h2d) {
    double next_fill = INFINITY;
    for (int32_t i = n - 1; i >= 0; i--) {
      double fill_end = u[i].dma_start < next_fill ? u[i].dma_start : next_fill;
      u[i].start = fill_end - u[i].traffic / host_bw;
      u[i].end = u[i].dma_end;
      next_fill = u[i].start;
    }
  } else {
    double drained = -INFINITY;
    for (int32_t i = 0; i < n; i++) {
      double t = u[i].dma_end > drained ? u[i].dma_end : drained;
      if (t - u[i].dma_end > lag) lag = t - u[i].dma_end;
      drained = t + u[i].traffic / host_bw;
      u[i].start = u[i].dma_start;
      u[i].end = drained;
    }
  }
  return lag;
}

/* Interval events, ends before starts at equal times (half-open intervals). */
typedef struct event {
  double t;
  int32_t idx;
  int8_t is_start;
} event;

static int cmp_event(const void *a, const void *b) {
  const event *x = (const event *)a, *y = (const event *)b;
  if (x->t != y->t) return x->t < y->t ? -1 : 1;
  if (x->is_start != y->is_start) return x->is_start - y->is_start;
  return x->idx - y->idx;
}

static event *make_events(const unit *u, int32_t n) {
  event *ev = (event *)malloc((size_t)(2 * n + 1) * sizeof *ev);
  if (!ev) return NULL;
  for (int32_t i = 0; i < n; i++) {
    ev[2 * i] = (event){u[i].start, i, 1};
    ev[2 * i + 1] = (event){u[i].end, i, 0};
  }
  qsort(ev, (size_t)(2 * n), sizeof *ev, cmp_event);
  return ev;
}

/* Max number of units busy at one instant. */
static mf_status max_overlap(const unit *u, int32_t n, int32_t *out) {
  *out = 0;
  event *ev = make_events(u, n);
  if (!ev) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "staging: out of memory");
  int32_t live = 0;
  for (int32_t i = 0; i < 2 * n; i++) {
    live += ev[i].is_start ? 1 : -1;
    if (live > *out) *out = live;
  }
  free(ev);
  return MF_OK;
}

/* Max bytes of units [from, to) busy at one instant. */
static mf_status peak_bytes(const unit *u, const mf_staging_slab *x, int32_t from, int32_t to,
                            uint64_t *out) {
  *out = 0;
  event *ev = make_events(u + from, to - from);
  if (!ev) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "staging: out of memory");
  uint64_t live = 0;
  for (int32_t i = 0; i < 2 * (to - from); i++) {
    const uint64_t b = x[from + ev[i].idx].bytes;
    live = ev[i].is_start ? live + b : live - b;
    if (live > *out) *out = live;
  }
  free(ev);
  return MF_OK;
}

/* Busy intervals of one direction's slabs [from, to) (stream order) when no
 * more than `cap` bytes of them may be busy at once: a slab waits for the
 * oldest busy ones to be freed, and its DMA, with every later one on the
 * stream, slips. Forward in stream order: one host thread fills (as late as
 * the simulated DMA start allows, but after the previous fill) or drains (as
 * soon as it can). The busy intervals end in stream order, so the busy slabs
 * are a queue. Writes the slabs' DMA times and returns the largest slip. */
static double throttle(mf_staging_slab *x, unit *u, int32_t from, int32_t to, int h2d, uint64_t cap,
                       double bw, int32_t *queue) {
  double stream = -INFINITY, host = -INFINITY, slip = 0.0;
  uint64_t live = 0;
  int32_t head = 0, tail = 0;
  for (int32_t k = from; k < to; k++) {
    const double host_s = u[k].traffic / bw, dur = u[k].dma_end - u[k].dma_start;
    double t0 = h2d ? fmax(u[k].dma_start - host_s, host) : fmax(u[k].dma_start, stream);
    while (head < tail && u[queue[head]].end <= t0) live -= x[queue[head++]].bytes;
    while (head < tail && live + x[k].bytes > cap) {
      t0 = fmax(t0, u[queue[head]].end);
      live -= x[queue[head++]].bytes;
    }
    double ds;
    if (h2d) {
      host = t0 + host_s;
      ds = fmax(fmax(u[k].dma_start, host), stream);
      u[k].start = t0;
      u[k].end = ds + dur;
    } else {
      ds = t0;
      host = fmax(ds + dur, host) + host_s;
      u[k].start = ds;
      u[k].end = host;
    }
    stream = ds + dur;
    if (ds - u[k].dma_start > slip) slip = ds - u[k].dma_start;
    x[k].dma_start = ds;
    x[k].dma_end = ds + dur;
    queue[tail++] = k;
    live += x[k].bytes;
  }
  return slip;
}

/* ----------------------------------------------------------------- packing */

/* Best fit in time order, each direction in a region of its own: a slab
 * takes the smallest free block of its region that holds it when it becomes
 * busy (or extends the block at the top, or grows the region) and gives its
 * bytes back when it is free. Slabs busy at the same instant never share
 * bytes. Two slabs of one direction that share bytes are also in stream
 * order, so the executor orders them by an event of the earlier one (its
 * last DMA, or its copy-out); a D2H and an H2D slab would have no such
 * order (the later in time may be submitted first), so the directions do
 * not share. The H2D region comes first, then the D2H region. */
static mf_status pack_region(mf_staging *st, const unit *u, int32_t from, int32_t to, size_t base,
                             size_t *top) {
  const int32_t n = to - from;
  *top = 0;
  if (n == 0) return MF_OK;
  event *ev = make_events(u + from, n);
  if (!ev) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "staging: out of memory");
  mf_packer pk;
  memset(&pk, 0, sizeof pk);
  mf_status rc = MF_OK;
  for (int32_t e = 0; e < 2 * n && rc == MF_OK; e++) {
    mf_staging_slab *x = &st->slabs[from + ev[e].idx];
    if (!ev[e].is_start)
      rc = mf_packer_give(&pk, x->offset - base, x->bytes, "staging");
    else
      x->offset = base + mf_packer_take(&pk, x->bytes);
  }
  *top = pk.top;
  free(ev);
  mf_packer_free(&pk);
  return rc;
}

/* The packing, and the bytes and slabs in flight at once (both directions). */
static mf_status pack(mf_staging *st, const unit *u) {
  uint64_t peak = 0;
  MF_CHECK(peak_bytes(u, st->slabs, 0, st->n_slabs, &peak));
  MF_CHECK(max_overlap(u, st->n_slabs, &st->max_slabs_inflight));
  st->peak_inflight_bytes = (size_t)peak;
  size_t h2d_top = 0, d2h_top = 0;
  MF_CHECK(pack_region(st, u, 0, st->n_h2d_slabs, 0, &h2d_top));
  MF_CHECK(pack_region(st, u, st->n_h2d_slabs, st->n_slabs, h2d_top, &d2h_top));
  st->h2d_region_bytes = h2d_top;
  st->arena_bytes = h2d_top + d2h_top;
  return MF_OK;
}

/* ------------------------------------------------------- order of slabs */

/* wait_slab: per direction, in stream order, the latest earlier slab holding
 * any of its bytes (a segment tree over the region's elementary intervals). */
static mf_status reuse_order(mf_staging *st) {
  const int32_t n = st->n_slabs;
  size_t *ranges = NULL;
  int32_t *lo = NULL, *hi = NULL;
  mf_segtree *tree = NULL;
  mf_status rc = MF_OK;
  MF_CHECK_GOTO(mf_malloc(2 * (size_t)(n ? n : 1) * sizeof(size_t), "staging order", (void **)&ranges), rc,
                done);
  MF_CHECK_GOTO(mf_malloc(2 * (size_t)(n ? n : 1) * sizeof(int32_t), "staging order", (void **)&lo), rc,
                done);
  hi = lo + n;
  for (int dir = 0; dir < 2; dir++) {
    const int32_t from = dir ? st->n_h2d_slabs : 0, m = (dir ? n : st->n_h2d_slabs) - from;
    for (int32_t k = 0; k < m; k++) {
      ranges[k] = st->slabs[from + k].offset;
      ranges[m + k] = st->slabs[from + k].bytes;
    }
    int32_t leaves = 0;
    MF_CHECK_GOTO(mf_interval_leaves(m, ranges, ranges + m, lo, hi, &leaves), rc, done);
    mf_segtree_free(tree);
    tree = NULL;
    MF_CHECK_GOTO(mf_segtree_create(leaves, 1, &tree), rc, done);
    for (int32_t k = 0; k < m; k++) {
      const int32_t slab = from + k;
      mf_segtree_max(tree, lo[k], hi[k], &st->wait_slab[slab]);
      mf_segtree_chmax(tree, lo[k], hi[k], &slab);
    }
  }
done:
  free(ranges);
  free(lo);
  mf_segtree_free(tree);
  return rc;
}

/* wait_host: the D2H slab whose copy-out wrote the host copy of each
 * offloaded activation an H2D slab uploads (the last D2H of it before the
 * upload), the latest of them. */
static mf_status host_order(const mf_schedule *s, mf_staging *st) {
  int32_t *writer = NULL;
  MF_CHECK(mf_malloc((size_t)(s->prog->n_tensors + 1) * sizeof(int32_t), "staging order", (void **)&writer));
  for (int32_t t = 0; t < s->prog->n_tensors; t++) writer[t] = -1;
  for (int32_t k = 0; k < st->n_slabs; k++) st->wait_host[k] = -1;
  for (int32_t i = 0; i < s->n_instr; i++) {
    const mf_instr *in = &s->instr[i];
    if ((in->kind != MF_I_H2D && in->kind != MF_I_D2H) || st->copy_of_instr[i] < 0) continue;
    const int32_t t = s->slots[in->slot].tensor, k = st->copies[st->copy_of_instr[i]].slab;
    if (in->kind == MF_I_D2H)
      writer[t] = k;
    else if (s->host_offset[t] != SIZE_MAX && writer[t] > st->wait_host[k])
      st->wait_host[k] = writer[t];
  }
  free(writer);
  return MF_OK;
}

/* ------------------------------------------------------------------ build */

void mf_staging_free(mf_staging *st) {
  if (!st) return;
  free(st->slabs);
  free(st->copies);
  free(st->copy_of_instr);
  free(st->wait_slab);
  free(st->wait_host);
  free(st);
}

double mf_staging_copy_traffic(const mf_schedule *s, int32_t i) {
  const mf_instr *in = &s->instr[i];
  const mf_ptensor *x = &s->prog->tensors[s->slots[in->slot].tensor];
  const double per_byte = (in->kind == MF_I_D2H && x->kind == MF_T_GRAD && in->accumulate) ? 3.0 : 2.0;
  return per_byte * (double)x->bytes;
}

/* The options as used: defaults filled in, checked; max_slab_bytes by default
 * no bigger than the pool's buffers (the largest copy, aligned), so a slab
 * never holds more than the pool per buffer. */
static mf_status resolve_opts(const mf_schedule *s, const mf_staging_opts *o, mf_staging_opts *opts) {
  *opts = (mf_staging_opts){MF_STAGING_ALIGN_DEFAULT, MF_STAGING_MAX_SLAB_DEFAULT, 0, NULL};
  if (o && o->align) opts->align = o->align;
  if (o) opts->inflight_limit = o->inflight_limit;
  if (opts->align > 4096 || (opts->align & (opts->align - 1)) != 0)
    return MF_ERR(MF_ERR_INVALID_ARG, "staging: align %zu is not a power of two up to 4096", opts->align);
  if (o && o->max_slab_bytes) {
    opts->max_slab_bytes = o->max_slab_bytes;
    return MF_OK;
  }
  size_t biggest = 0;
  for (int32_t i = 0; i < s->n_instr; i++) {
    const mf_instr *in = &s->instr[i];
    if ((in->kind == MF_I_H2D || in->kind == MF_I_D2H) && !(o && o->direct && o->direct[i]) &&
        in->slot >= 0 && in->slot < s->n_slots && s->prog->tensors[s->slots[in->slot].tensor].bytes > biggest)
      biggest = s->prog->tensors[s->slots[in->slot].tensor].bytes;
  }
  biggest = align_up(biggest ? biggest : 1, opts->align);
  if (biggest < opts->max_slab_bytes) opts->max_slab_bytes = biggest;
  return MF_OK;
}

/* Each instruction's staging group (experts/experts.h): an H2D serves the
 * next RUN, a D2H follows the previous one. */
static void group_keys(const mf_schedule *s, int64_t *key) {
  int64_t g = -1;
  for (int32_t i = 0; i < s->n_instr; i++) {
    if (s->instr[i].kind == MF_I_RUN)
      g = mf_experts_group_key(s->prog, s->instr[i].op, s->instr[i].recompute);
    key[i] = g;
  }
  g = -1;
  for (int32_t i = s->n_instr - 1; i >= 0; i--) {
    if (s->instr[i].kind == MF_I_RUN)
      g = mf_experts_group_key(s->prog, s->instr[i].op, s->instr[i].recompute);
    if (s->instr[i].kind == MF_I_H2D) key[i] = g;
  }
}

/* Slabs: runs of same-group copies on each stream, cut at max_slab_bytes and
 * where the optimizer part begins; each direction's busy intervals timed. */
static mf_status cut_slabs(const mf_schedule *s, const mf_sim_result *r, const mf_hwprofile *hw,
                           const int64_t *key, const uint8_t *direct, mf_staging *st, unit *u) {
  const mf_program *p = s->prog;
  const mf_staging_opts *opts = &st->opts;
  for (int dir = 0; dir < 2; dir++) {
    const mf_instr_kind kind = dir == 0 ? MF_I_H2D : MF_I_D2H;
    const int32_t first_slab = st->n_slabs;
    mf_staging_slab *cur = NULL;
    int cur_part = 0; /* the step's instructions, or the optimizer part's (run apart: exec.h) */
    for (int32_t i = 0; i < s->n_instr; i++) {
      const mf_instr *in = &s->instr[i];
      if (in->kind != kind || (direct && direct[i])) continue;
      /* A persistent slot's upload (a weight that stays on the device: the first step, or after the
       * host changed it) goes straight from its home: staged, every resident weight would hold a slab
       * at once and the arena would pin a second copy of them all. It ends the slab before it: a slab
       * is one run of its stream's copies. */
      if (kind == MF_I_H2D && in->persist) {
        cur = NULL;
        continue;
      }
      const int part = i >= s->optim_begin;
      if (in->slot < 0 || in->slot >= s->n_slots)
        return MF_ERR(MF_ERR_INVALID_ARG, "staging: instruction %d copies slot %d of %d", i, in->slot,
                      s->n_slots);
      const int32_t t = s->slots[in->slot].tensor;
      const size_t bytes = p->tensors[t].bytes, need = align_up(bytes, opts->align);
      if (!cur || cur->group != key[i] || part != cur_part ||
          (cur->bytes > 0 && cur->bytes + need > opts->max_slab_bytes)) {
        cur_part = part;
        cur = &st->slabs[st->n_slabs++];
        cur->dir = (uint8_t)kind;
        cur->group = key[i];
        cur->first_copy = st->n_copies;
        cur->dma_start = r->start[i];
      }
      mf_staging_copy *c = &st->copies[st->n_copies];
      c->instr = i;
      c->tensor = t;
      c->slab = (int32_t)(cur - st->slabs);
      c->offset = cur->bytes; /* in the slab until packed */
      c->bytes = bytes;
      st->copy_of_instr[i] = st->n_copies++;
      cur->n_copies++;
      cur->bytes += need;
      cur->dma_end = r->end[i];
      u[c->slab].traffic += mf_staging_copy_traffic(s, i);
    }
    for (int32_t k = first_slab; k < st->n_slabs; k++) {
      u[k].dma_start = st->slabs[k].dma_start;
      u[k].dma_end = st->slabs[k].dma_end;
    }
    const double lag =
        time_units(u + first_slab, st->n_slabs - first_slab, kind == MF_I_H2D, hw->host_memory_bandwidth);
    if (kind == MF_I_D2H) st->max_drain_lag_seconds = lag;
    for (int32_t k = first_slab; k < st->n_slabs; k++)
      st->host_copy_seconds += u[k].traffic / hw->host_memory_bandwidth;
    if (dir == 0) st->n_h2d_slabs = st->n_slabs;
  }
  return MF_OK;
}

/* opts.inflight_limit: each direction gets its share of the bound (a
 * direction's slabs are busy in stream order, which keeps the throttle
 * exact): H2D, whose slips stall the compute stream, what it needs up to
 * half (more when D2H needs less), D2H the rest. */
static mf_status limit_inflight(const mf_hwprofile *hw, mf_staging *st, unit *u, int32_t *queue) {
  uint64_t ph = 0, pd = 0;
  MF_CHECK(peak_bytes(u, st->slabs, 0, st->n_h2d_slabs, &ph));
  MF_CHECK(peak_bytes(u, st->slabs, st->n_h2d_slabs, st->n_slabs, &pd));
  const uint64_t lim = st->opts.inflight_limit;
  if (ph + pd <= lim) return MF_OK;
  uint64_t cap_h = lim / 2;
  if (pd < lim - cap_h) cap_h = lim - pd;
  if (cap_h > ph) cap_h = ph;
  const uint64_t cap_d = lim - cap_h;
  st->h2d_slip_seconds =
      throttle(st->slabs, u, 0, st->n_h2d_slabs, 1, cap_h, hw->host_memory_bandwidth, queue);
  st->d2h_slip_seconds =
      throttle(st->slabs, u, st->n_h2d_slabs, st->n_slabs, 0, cap_d, hw->host_memory_bandwidth, queue);
  st->throttled = 1;
  return MF_OK;
}

/* The ZeRO-Infinity-style pool: the same copies, one buffer each (u reused). */
static mf_status count_pool(const mf_schedule *s, const mf_sim_result *r, const mf_hwprofile *hw,
                            mf_staging *st, unit *u) {
  int32_t n = 0;
  for (int dir = 0; dir < 2; dir++) {
    const int32_t from = n;
    for (int32_t k = dir == 0 ? 0 : st->n_h2d_slabs; k < (dir == 0 ? st->n_h2d_slabs : st->n_slabs); k++) {
      const mf_staging_slab *x = &st->slabs[k];
      const double shift = x->dma_start - r->start[st->copies[x->first_copy].instr]; /* 0 unless throttled */
      for (int32_t c = x->first_copy; c < x->first_copy + x->n_copies; c++) {
        const mf_staging_copy *cp = &st->copies[c];
        u[n].traffic = mf_staging_copy_traffic(s, cp->instr);
        u[n].dma_start = r->start[cp->instr] + shift;
        u[n].dma_end = r->end[cp->instr] + shift;
        if (cp->bytes > st->pool_buffer_bytes) st->pool_buffer_bytes = cp->bytes;
        n++;
      }
    }
    time_units(u + from, n - from, dir == 0, hw->host_memory_bandwidth);
  }
  MF_CHECK(max_overlap(u, n, &st->pool_buffers));
  st->pool_bytes = (uint64_t)st->pool_buffers * st->pool_buffer_bytes;
  return MF_OK;
}

mf_status mf_staging_build(const mf_schedule *s, const mf_sim_result *r, const mf_hwprofile *hw,
                           const mf_staging_opts *o, mf_staging **out) {
  if (!s || !r || !hw || !out) return MF_ERR(MF_ERR_INVALID_ARG, "staging: NULL argument");
  *out = NULL;
  if (r->n_instr != s->n_instr || (s->n_instr > 0 && (!r->start || !r->end)))
    return MF_ERR(MF_ERR_INVALID_ARG, "staging: the timeline has %d instructions, the schedule %d",
                  r->n_instr, s->n_instr);
  if (!(hw->host_memory_bandwidth > 0) || !isfinite(hw->host_memory_bandwidth))
    return MF_ERR(MF_ERR_INVALID_ARG, "staging: the hardware profile '%s' has no host memory bandwidth",
                  hw->name);
  mf_staging_opts opts;
  MF_CHECK(resolve_opts(s, o, &opts));
  mf_staging *st = (mf_staging *)calloc(1, sizeof *st);
  mf_status rc = MF_OK;
  int64_t *key = NULL;
  unit *u = NULL;
  int32_t *queue = NULL;
  if (!st) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "staging: out of memory");
  st->opts = opts;
  st->n_instr = s->n_instr;
  int32_t n_copy = 0;
  for (int32_t i = 0; i < s->n_instr; i++)
    if (s->instr[i].kind == MF_I_H2D || s->instr[i].kind == MF_I_D2H) n_copy++;
  st->copy_of_instr = (int32_t *)malloc((size_t)(s->n_instr + 1) * sizeof(int32_t));
  st->copies = (mf_staging_copy *)calloc((size_t)n_copy + 1, sizeof *st->copies);
  st->slabs = (mf_staging_slab *)calloc((size_t)n_copy + 1, sizeof *st->slabs); /* at most a slab per copy */
  st->wait_slab = (int32_t *)malloc((size_t)(n_copy + 1) * sizeof(int32_t));
  st->wait_host = (int32_t *)malloc((size_t)(n_copy + 1) * sizeof(int32_t));
  key = (int64_t *)malloc((size_t)(s->n_instr + 1) * sizeof(int64_t));
  u = (unit *)calloc((size_t)n_copy + 1, sizeof *u);
  queue = (int32_t *)malloc((size_t)(n_copy + 1) * sizeof(int32_t));
  if (!st->copy_of_instr || !st->copies || !st->slabs || !st->wait_slab || !st->wait_host || !key || !u ||
      !queue) {
    rc = MF_ERR(MF_ERR_OUT_OF_MEMORY, "staging: out of memory");
    goto done;
  }
  group_keys(s, key);
  for (int32_t i = 0; i < s->n_instr; i++) st->copy_of_instr[i] = -1;
  MF_CHECK_GOTO(cut_slabs(s, r, hw, key, o ? o->direct : NULL, st, u), rc, done);
  if (opts.inflight_limit) MF_CHECK_GOTO(limit_inflight(hw, st, u, queue), rc, done);
  for (int32_t k = 0; k < st->n_slabs; k++) {
    mf_staging_slab *x = &st->slabs[k];
    x->busy_start = u[k].start;
    x->busy_end = u[k].end;
    st->sum_slab_bytes += x->bytes;
    if (x->bytes > st->largest_slab_bytes) st->largest_slab_bytes = x->bytes;
  }
  MF_CHECK_GOTO(pack(st, u), rc, done);
  for (int32_t c = 0; c < st->n_copies; c++) st->copies[c].offset += st->slabs[st->copies[c].slab].offset;
  MF_CHECK_GOTO(reuse_order(st), rc, done);
  MF_CHECK_GOTO(host_order(s, st), rc, done);
  MF_CHECK_GOTO(count_pool(s, r, hw, st, u), rc, done);
done:
  free(key);
  free(u);
  free(queue);
  if (rc != MF_OK) {
    mf_staging_free(st);
    return rc;
  }
  *out = st;
  return MF_OK;
}

mf_status mf_staging_build_within(const mf_schedule *s, const mf_sim_result *r, const mf_hwprofile *hw,
                                  const mf_staging_opts *o, uint64_t limit, mf_staging **out, int *fits) {
  if (!out || !fits) return MF_ERR(MF_ERR_INVALID_ARG, "staging: NULL argument");
  *out = NULL;
  *fits = 0;
  mf_staging_opts opts = {0, 0, 0, NULL};
  if (o) opts = *o;
  opts.inflight_limit = 0;
  mf_staging *best = NULL;
  MF_CHECK(mf_staging_build(s, r, hw, &opts, &best));
  opts.max_slab_bytes = best->opts.max_slab_bytes;
  while (limit && best->arena_bytes > limit && opts.max_slab_bytes > ((size_t)1 << 20)) {
    opts.max_slab_bytes = opts.max_slab_bytes == SIZE_MAX ? ((size_t)1 << 30) : opts.max_slab_bytes / 2;
    if (opts.max_slab_bytes < ((size_t)1 << 20)) opts.max_slab_bytes = (size_t)1 << 20;
    mf_staging *next = NULL;
    mf_status rc = mf_staging_build(s, r, hw, &opts, &next);
    if (rc != MF_OK) {
      mf_staging_free(best);
      return rc;
    }
    /* Smaller slabs pay when slabs wait for their host copies, not when the
     * host falls behind the links: stop once halving saves less than 10%. */
    const int worth = next->arena_bytes < best->arena_bytes - best->arena_bytes / 10;
    if (next->arena_bytes < best->arena_bytes) {
      mf_staging_free(best);
      best = next;
    } else {
      mf_staging_free(next);
    }
    if (!worth) break;
  }
  /* Smaller slabs were not enough: hold the copy streams back. Packing may
   * leave holes, so the bound on bytes in flight tightens by the overshoot. */
  if (limit && best->arena_bytes > limit && best->largest_slab_bytes <= limit) {
    opts.max_slab_bytes = best->opts.max_slab_bytes;
    uint64_t bound = limit;
    for (int tries = 0; tries < 8 && best->arena_bytes > limit && bound >= best->largest_slab_bytes;
         tries++) {
      opts.inflight_limit = bound;
      mf_staging *next = NULL;
      mf_status rc = mf_staging_build(s, r, hw, &opts, &next);
      if (rc != MF_OK) {
        mf_staging_free(best);
        return rc;
      }
      const uint64_t over = next->arena_bytes > limit ? next->arena_bytes - limit : 0;
      if (next->arena_bytes < best->arena_bytes || next->arena_bytes <= limit) {
        mf_staging_free(best);
        best = next;
      } else {
        mf_staging_free(next);
      }
      if (!over) break;
      /* Tighten by the overshoot and a little more, so the tries converge. */
      const uint64_t step = over + limit / 64;
      bound = bound > step ? bound - step : 0;
    }
  }
  *fits = !limit || best->arena_bytes <= limit;
  *out = best;
  return MF_OK;
}
