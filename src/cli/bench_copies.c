/* `moefit bench kernels`' copies: host<->device copies measured on the
 * bench's backend in the same run as its kernels.
 *
 * Pinned. One copy of `bytes` (the copy roofline's: 1 GiB on cuda, 256 MiB
 * on cpu) each way between host_alloc memory (pinned on cuda) and the
 * bench's device arena, alone on the timed stream; then both at once: the
 * upload on the timed stream, the download on a second stream forked from it
 * (each between its own timed events: each direction's rate, and the
 * aggregate over the first start to the last end). On the cpu backend a
 * stream runs its work when submitted, so "at once" is one after the other.
 *
 * Staged. The same bytes of pageable (malloc'd) host memory through staging
 * slabs with the executor's own code (src/exec/exec.h mf_exec_stager: its
 * slab fills and copy-outs as host functions on their streams, one DMA per
 * slab), timed on the wall clock from the first submission to the last
 * stream synchronized. The slabs are the run's (mf_cli_copies_layout_of):
 *   slab bytes   the chosen plan's staging layout's cut (planner/staging.h
 *                opts.max_slab_bytes), or its largest slab if smaller;
 *   in flight    its most slabs busy at once (max_slabs_inflight, both
 *                directions counted), each way here;
 *   threads      what train gives the fills and copy-outs on this backend
 *                (src/train/train.h mf_train_staging_threads);
 * and when the plan stages nothing (memory.staging off, the default on cpu,
 * or nothing copied): slabs of the layout's default cut
 * (MF_STAGING_MAX_SLAB_DEFAULT, 64 MiB), two in flight, said so in the
 * output. At most 16384 slabs each way: with smaller slabs fewer bytes.
 *
 * Each figure is the best of `reps` after one warm-up (which also faults the
 * host pages in); GB/s is bytes moved per second (not read + write); a
 * staged rate's ratio is to the pinned rate of its direction alone.
 * Everything is allocated before the first timed copy and freed after the last.
 */
#include "src/cli/bench_copies.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planner/staging.h"
#include "src/exec/exec.h"
#include "src/train/train.h"

#define MAX_STAGED_SLABS 16384

void mf_cli_copies_layout_of(const mf_run_plan *rp, const mf_config *cfg, size_t bytes,
                             mf_cli_copies_layout *out) {
  const mf_staging *L = rp->staged ? rp->staging : NULL;
  memset(out, 0, sizeof *out);
  out->planned = L && L->n_slabs > 0 && L->largest_slab_bytes > 0;
  if (out->planned) {
    out->slab_bytes =
        L->opts.max_slab_bytes < L->largest_slab_bytes ? L->opts.max_slab_bytes : L->largest_slab_bytes;
    out->slabs = L->max_slabs_inflight > 0 ? L->max_slabs_inflight : 1;
  } else {
    out->slab_bytes = MF_STAGING_MAX_SLAB_DEFAULT;
    out->slabs = 2;
  }
  out->threads = mf_train_staging_threads(cfg, rp->dev.name);
  const size_t most = out->slab_bytes * (size_t)MAX_STAGED_SLABS;
  out->bytes = bytes < most ? bytes : most;
}

/* The buffers and events of one measurement. */
typedef struct cbench {
  const mf_cli_copies_in *in;
  mf_stream *s2;
  mf_event *e0, *e1, *f0, *f1; /* timed (NULL: wall time); e* on s, f* on s2 */
  mf_event *fork;
  uint8_t *pinned[2]; /* upload source, download destination */
  uint8_t *pageable;
  mf_exec_stager *stager;
} cbench;

static void cbench_free(cbench *c) {
  mf_backend *b = c->in->b;
  mf_exec_stager_free(c->stager);
  for (int k = 0; k < 2; k++)
    if (c->pinned[k]) b->host_free(b, c->pinned[k]);
  free(c->pageable);
  mf_event *ev[5] = {c->e0, c->e1, c->f0, c->f1, c->fork};
  for (int k = 0; k < 5; k++)
    if (ev[k]) b->event_free(b, ev[k]);
  if (c->s2) b->stream_free(b, c->s2);
}

static mf_status cbench_create(cbench *c, const mf_cli_copies_layout *lay) {
  mf_backend *b = c->in->b;
  const size_t n = c->in->bytes;
  MF_CHECK(b->stream_create(b, &c->s2));
  MF_CHECK(b->event_create(b, &c->fork));
  if (b->event_create_timed && b->event_elapsed) {
    mf_event **ev[4] = {&c->e0, &c->e1, &c->f0, &c->f1};
    for (int k = 0; k < 4; k++) MF_CHECK(b->event_create_timed(b, ev[k]));
  }
  for (int k = 0; k < 2; k++) {
    void *p = NULL;
    MF_CHECK(b->host_alloc(b, n, &p));
    c->pinned[k] = p;
    memset(p, 1 + k, n); /* fault the pages in before timing */
  }
  c->pageable = malloc(n);
  if (!c->pageable)
    return MF_ERR(MF_ERR_OUT_OF_MEMORY, "bench kernels: out of memory for %zu bytes of pageable host memory",
                  n);
  memset(c->pageable, 3, n);
  const mf_exec_staging_opts so = {lay->threads, 0, 0};
  return mf_exec_stager_create(b, lay->bytes, lay->slab_bytes, lay->slabs, &so, &c->stager);
}

static mf_status elapsed(const cbench *c, mf_event *from, mf_event *to, double *s) {
  return c->in->b->event_elapsed(c->in->b, from, to, s);
}

/* One copy alone on the timed stream: the best seconds of reps after a warm-up. */
static mf_status time_alone(cbench *c, mf_copy_kind kind, double *best) {
  mf_backend *b = c->in->b;
  mf_stream *s = c->in->s;
  const size_t n = c->in->bytes;
  void *dst = kind == MF_COPY_H2D ? (void *)c->in->dev : (void *)c->pinned[1];
  const void *src = kind == MF_COPY_H2D ? (const void *)c->pinned[0] : (const void *)(c->in->dev + n);
  *best = INFINITY;
  for (int r = -1; r < c->in->reps; r++) {
    const double t0 = mf_time_now();
    double t = 0;
    if (c->e0) MF_CHECK(b->event_record(b, c->e0, s));
    MF_CHECK(b->copy(b, dst, src, n, kind, s));
    if (c->e1) MF_CHECK(b->event_record(b, c->e1, s));
    MF_CHECK(b->stream_sync(b, s));
    if (c->e0)
      MF_CHECK(elapsed(c, c->e0, c->e1, &t));
    else
      t = mf_time_now() - t0;
    if (r >= 0 && t < *best) *best = t;
  }
  return MF_OK;
}

/* The upload on the timed stream and the download on the second at once;
 * the run with the best aggregate is kept with its directions' times. */
static mf_status time_both(cbench *c, mf_cli_copies *out) {
  mf_backend *b = c->in->b;
  mf_stream *s = c->in->s;
  const size_t n = c->in->bytes;
  out->both_s = INFINITY;
  for (int r = -1; r < c->in->reps; r++) {
    const double t0 = mf_time_now();
    if (c->e0) MF_CHECK(b->event_record(b, c->e0, s));
    MF_CHECK(b->event_record(b, c->fork, s));
    MF_CHECK(b->copy(b, c->in->dev, c->pinned[0], n, MF_COPY_H2D, s));
    if (c->e1) MF_CHECK(b->event_record(b, c->e1, s));
    /* s2 starts at the fork, beside the upload (on the cpu's immediate
     * streams only after it: f0 is stamped when recorded) */
    MF_CHECK(b->stream_wait(b, c->s2, c->fork));
    if (c->f0) MF_CHECK(b->event_record(b, c->f0, c->s2));
    MF_CHECK(b->copy(b, c->pinned[1], c->in->dev + n, n, MF_COPY_D2H, c->s2));
    if (c->f1) MF_CHECK(b->event_record(b, c->f1, c->s2));
    MF_CHECK(b->stream_sync(b, s));
    MF_CHECK(b->stream_sync(b, c->s2));
    double all = mf_time_now() - t0, up = all, down = all, last = 0;
    if (c->e0) {
      MF_CHECK(elapsed(c, c->e0, c->e1, &up));
      MF_CHECK(elapsed(c, c->f0, c->f1, &down));
      MF_CHECK(elapsed(c, c->e0, c->f1, &last));
      all = up > last ? up : last;
    }
    if (r >= 0 && all < out->both_s) {
      out->both_s = all;
      out->both_h2d_s = up;
      out->both_d2h_s = down;
    }
  }
  return MF_OK;
}

/* The pageable bytes through the stager, on the wall clock; *host: the best
 * run's host seconds (its fills or copy-outs). */
static mf_status time_staged(cbench *c, int up, size_t bytes, double *best, double *host) {
  *best = INFINITY;
  *host = NAN;
  for (int r = -1; r < c->in->reps; r++) {
    const double t0 = mf_time_now();
    if (up)
      MF_CHECK(mf_exec_stager_h2d(c->stager, c->in->dev, c->pageable, bytes));
    else
      MF_CHECK(mf_exec_stager_d2h(c->stager, c->pageable, c->in->dev + c->in->bytes, bytes));
    const double t = mf_time_now() - t0;
    if (r >= 0 && t < *best) {
      *best = t;
      MF_CHECK(mf_exec_stager_host_seconds(c->stager, up, host));
    }
  }
  return MF_OK;
}

mf_status mf_cli_copies_measure(const mf_cli_copies_in *in, const mf_cli_copies_layout *lay,
                                mf_cli_copies *out) {
  cbench c;
  memset(&c, 0, sizeof c);
  memset(out, 0, sizeof *out);
  c.in = in;
  out->lay = *lay;
  out->bytes = in->bytes;
  mf_status st = MF_OK;
  MF_CHECK_GOTO(cbench_create(&c, lay), st, done);
  out->pinned_staging_bytes = mf_exec_stager_pinned_bytes(c.stager);
  MF_CHECK_GOTO(time_alone(&c, MF_COPY_H2D, &out->h2d_s), st, done);
  MF_CHECK_GOTO(time_alone(&c, MF_COPY_D2H, &out->d2h_s), st, done);
  MF_CHECK_GOTO(time_both(&c, out), st, done);
  MF_CHECK_GOTO(time_staged(&c, 1, lay->bytes, &out->h2d_staged_s, &out->h2d_fill_s), st, done);
  MF_CHECK_GOTO(time_staged(&c, 0, lay->bytes, &out->d2h_staged_s, &out->d2h_drain_s), st, done);
  double *all[7] = {&out->h2d_s,      &out->d2h_s,        &out->both_s,      &out->both_h2d_s,
                    &out->both_d2h_s, &out->h2d_staged_s, &out->d2h_staged_s};
  for (int k = 0; k < 7; k++)
    if (!(*all[k] > 0)) *all[k] = 1e-9; /* below the clock: keep the rates finite */
done:
  cbench_free(&c);
  return st;
}

/* ------------------------------------------------------------ report */

typedef struct crow {
  const char *name;
  double bytes, seconds;
  double h2d_gbs, d2h_gbs; /* the pair's directions; 0: none */
  double ratio;            /* staged / pinned of its direction; 0: none */
} crow;

enum { N_ROWS = 5 };

static void rows_of(const mf_cli_copies *c, crow r[N_ROWS]) {
  const double n = (double)c->bytes, ns = (double)c->lay.bytes;
  r[0] = (crow){"h2d pinned", n, c->h2d_s, 0, 0, 0};
  r[1] = (crow){"d2h pinned", n, c->d2h_s, 0, 0, 0};
  r[2] = (crow){"h2d+d2h pinned", 2 * n, c->both_s, n / c->both_h2d_s / 1e9, n / c->both_d2h_s / 1e9, 0};
  r[3] = (crow){"h2d staged", ns, c->h2d_staged_s, 0, 0, (ns / c->h2d_staged_s) / (n / c->h2d_s)};
  r[4] = (crow){"d2h staged", ns, c->d2h_staged_s, 0, 0, (ns / c->d2h_staged_s) / (n / c->d2h_s)};
}

mf_status mf_cli_copies_print(const mf_cli_copies *c, const char *backend) {
  char b1[32], b2[32];
  printf(
      "\ncopies: pinned host memory (host_alloc) each way alone and both at once on two streams%s; "
      "pageable host memory through staging slabs of %s, %d in flight each way (%s), %d host thread%s "
      "per fill and per copy-out (train's on %s), with the executor's slab code (%s pinned)\n\n",
      strcmp(backend, "cpu") == 0 ? " (cpu: the streams run in turn)" : "",
      mf_format_bytes(c->lay.slab_bytes, b1, sizeof b1), c->lay.slabs,
      c->lay.planned ? "the plan's staging layout" : "the plan stages nothing: the layout's default slab",
      c->lay.threads, c->lay.threads == 1 ? "" : "s", backend,
      mf_format_bytes(c->pinned_staging_bytes, b2, sizeof b2));
  mf_table *tb = NULL;
  MF_CHECK(mf_table_create("lrrrlr", &tb));
  static const char *const head[] = {"copy", "bytes", "ms", "GB/s", "each way", "of pinned"};
  for (size_t i = 0; i < sizeof head / sizeof head[0]; i++) mf_table_cell(tb, "%s", head[i]);
  crow r[N_ROWS];
  rows_of(c, r);
  for (int i = 0; i < N_ROWS; i++) {
    mf_table_cell(tb, "%s", r[i].name);
    mf_table_cell(tb, "%s", mf_format_bytes((uint64_t)r[i].bytes, b1, sizeof b1));
    mf_table_cell(tb, "%.3f", r[i].seconds * 1e3);
    mf_table_cell(tb, "%.2f", r[i].bytes / r[i].seconds / 1e9);
    if (r[i].h2d_gbs > 0)
      mf_table_cell(tb, "h2d %.2f, d2h %.2f GB/s", r[i].h2d_gbs, r[i].d2h_gbs);
    else
      mf_table_cell(tb, "-");
    if (r[i].ratio > 0)
      mf_table_cell(tb, "%.3f", r[i].ratio);
    else
      mf_table_cell(tb, "-");
  }
  mf_status st = mf_table_print(tb, stdout, "  ");
  mf_table_free(tb);
  MF_CHECK(st);
  if (isfinite(c->h2d_fill_s) && isfinite(c->d2h_drain_s) && c->h2d_fill_s > 0 && c->d2h_drain_s > 0)
    printf(
        "\nstaged, the host's side (%d thread%s each): the fills %.2f GB/s, %.0f%% of the upload's time; "
        "the copy-outs %.2f GB/s, %.0f%% of the download's\n",
        c->lay.threads, c->lay.threads == 1 ? "" : "s", r[3].bytes / c->h2d_fill_s / 1e9,
        100.0 * c->h2d_fill_s / c->h2d_staged_s, r[4].bytes / c->d2h_drain_s / 1e9,
        100.0 * c->d2h_drain_s / c->d2h_staged_s);
  printf("\ncopies: h2d staged %.3f of pinned, d2h staged %.3f of pinned; h2d+d2h pinned %.2f GB/s\n",
         r[3].ratio, r[4].ratio, r[2].bytes / r[2].seconds / 1e9);
  return MF_OK;
}

json_t *mf_cli_copies_json(const mf_cli_copies *c) {
  json_t *o = json_object(), *rows = json_array();
  json_object_set_new(o, "slab_bytes", json_integer((json_int_t)c->lay.slab_bytes));
  json_object_set_new(o, "slabs_in_flight", json_integer(c->lay.slabs));
  json_object_set_new(o, "threads", json_integer(c->lay.threads));
  json_object_set_new(o, "layout", json_string(c->lay.planned ? "plan" : "default"));
  json_object_set_new(o, "staging_pinned_bytes", json_integer((json_int_t)c->pinned_staging_bytes));
  crow r[N_ROWS];
  rows_of(c, r);
  for (int i = 0; i < N_ROWS; i++) {
    json_t *row = json_object();
    json_object_set_new(row, "copy", json_string(r[i].name));
    json_object_set_new(row, "bytes", json_integer((json_int_t)r[i].bytes));
    json_object_set_new(row, "ms", json_real(r[i].seconds * 1e3));
    json_object_set_new(row, "gbs", json_real(r[i].bytes / r[i].seconds / 1e9));
    if (r[i].h2d_gbs > 0) {
      json_object_set_new(row, "h2d_gbs", json_real(r[i].h2d_gbs));
      json_object_set_new(row, "d2h_gbs", json_real(r[i].d2h_gbs));
    }
    if (r[i].ratio > 0) json_object_set_new(row, "ratio", json_real(r[i].ratio));
    json_array_append_new(rows, row);
  }
  json_object_set_new(o, "rows", rows);
  if (isfinite(c->h2d_fill_s)) json_object_set_new(o, "h2d_fill_s", json_real(c->h2d_fill_s));
  if (isfinite(c->d2h_drain_s)) json_object_set_new(o, "d2h_drain_s", json_real(c->d2h_drain_s));
  return o;
}
