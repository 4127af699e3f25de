/* mf_render_svg: the timeline and memory curve of one planned step as SVG. */
#include "planner/render.h"

#include "src/core/svg.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --------------------------------------------------------------- layout */

enum { W = 1400, H = 700 };
static const double k_x0 = 90, k_x1 = 1380;          /* plot area, both charts */
static const double k_lane_y = 62, k_lane_h = 34, k_lane_gap = 8;
static const double k_mem_top = 330, k_mem_bot = 640; /* memory chart */
static const double k_min_px = 0.5;                  /* narrower rectangles are merged */

typedef enum cat {
  CAT_FWD = 0,
  CAT_BWD,
  CAT_RECOMPUTE,
  CAT_LOSS,
  CAT_OPTIM, /* the optimizer on the device: NORM (gradient chunk sums) and OPTIM (AdamW) ops */
  CAT_UPLOAD,
  CAT_DOWNLOAD,
  CAT_ZERO,
  CAT_N
} cat;

static const char *const k_cat_name[CAT_N] = {"forward",          "backward", "recompute", "loss",
                                              "device optimizer", "upload",   "download",  "zero/accumulate"};
static const char *const k_cat_color[CAT_N] = {"#4c78a8", "#e45756", "#f58518", "#b279a2",
                                               "#eeca3b", "#54a24b", "#72b7b2", "#9d9d9d"};
static const char *const k_lane_name[MF_SIM_STREAMS] = {"compute", "H2D", "D2H"};

static cat instr_cat(const mf_schedule *s, const mf_instr *in) {
  switch (in->kind) {
    case MF_I_RUN: {
      if (in->recompute) return CAT_RECOMPUTE;
      const mf_phase ph = s->prog->ops[in->op].phase;
      if (ph == MF_PHASE_NORM || ph == MF_PHASE_OPTIM) return CAT_OPTIM;
      return ph == MF_PHASE_BWD ? CAT_BWD : ph == MF_PHASE_LOSS ? CAT_LOSS : CAT_FWD;
    }
    case MF_I_H2D: return CAT_UPLOAD;
    case MF_I_D2H: return CAT_DOWNLOAD;
    default: return CAT_ZERO;
  }
}

static const char *slot_name(const mf_schedule *s, int32_t slot) {
  if (slot < 0 || slot >= s->n_slots) return "?";
  const int32_t t = s->slots[slot].tensor;
  return t >= 0 && t < s->prog->n_tensors ? s->prog->tensors[t].name : "?";
}

/* The instruction as people read it: an op label, or "upload <tensor>". */
static void sb_instr_name(mf_svg *b, const mf_schedule *s, const mf_instr *in) {
  switch (in->kind) {
    case MF_I_RUN:
      if (in->recompute) mf_svg_printf(b, "recompute ");
      mf_svg_escape(b, in->op >= 0 && in->op < s->prog->n_ops ? s->prog->ops[in->op].label : "?");
      break;
    case MF_I_H2D: mf_svg_printf(b, "upload "), mf_svg_escape(b, slot_name(s, in->slot)); break;
    case MF_I_D2H:
      mf_svg_printf(b, in->accumulate ? "download (add) " : "download ");
      mf_svg_escape(b, slot_name(s, in->slot));
      break;
    case MF_I_ZERO: mf_svg_printf(b, "zero "), mf_svg_escape(b, slot_name(s, in->slot)); break;
    case MF_I_ACCUM:
      mf_svg_printf(b, "accumulate "), mf_svg_escape(b, slot_name(s, in->slot));
      mf_svg_printf(b, " into "), mf_svg_escape(b, slot_name(s, in->slot2));
      break;
    default: mf_svg_printf(b, "instruction"); break;
  }
}

static void sb_time(mf_svg *b, double sec) {
  if (sec < 1e-3)
    mf_svg_printf(b, "%.2f us", sec * 1e6);
  else if (sec < 1)
    mf_svg_printf(b, "%.3f ms", sec * 1e3);
  else
    mf_svg_printf(b, "%.3f s", sec);
}


/* ----------------------------------------------------------- the lanes */

typedef struct pending {
  int n;             /* instructions merged (0: none pending) */
  int32_t first, last;
  double x0, x1;     /* pixels */
  double t0, t1;     /* seconds */
  double cat_s[CAT_N];
} pending;

typedef struct ctx {
  mf_svg *b;
  const mf_plan *pl;
  double t_max, sx; /* seconds shown, pixels per second */
} ctx;

static double xat(const ctx *c, double t) { return k_x0 + t * c->sx; }

static void flush(ctx *c, pending *g, double y) {
  if (g->n == 0) return;
  const mf_schedule *s = c->pl->s;
  mf_svg *b = c->b;
  int best = 0;
  for (int k = 1; k < CAT_N; k++)
    if (g->cat_s[k] > g->cat_s[best]) best = k;
  double w = g->x1 - g->x0;
  if (w < 0) w = 0;
  mf_svg_printf(b, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\"><title>", g->x0, y, w,
            k_lane_h, k_cat_color[best]);
  if (g->n == 1) {
    sb_instr_name(b, s, &s->instr[g->first]);
  } else {
    mf_svg_printf(b, "%d instructions: ", g->n);
    sb_instr_name(b, s, &s->instr[g->first]);
    mf_svg_printf(b, " ... ");
    sb_instr_name(b, s, &s->instr[g->last]);
  }
  mf_svg_printf(b, "\n");
  sb_time(b, g->t0), mf_svg_printf(b, " to "), sb_time(b, g->t1), mf_svg_printf(b, " (");
  sb_time(b, g->t1 - g->t0), mf_svg_printf(b, ")</title></rect>\n");
  g->n = 0;
}

/* One lane: each stream runs its instructions in order, so starts only grow
 * along the instruction list and runs of tiny rectangles are neighbours. */
static void lane(ctx *c, int stream, double y) {
  const mf_sim_result *r = &c->pl->sim;
  const mf_schedule *s = c->pl->s;
  pending g = {0};
  mf_svg_printf(c->b, "<g id=\"lane-%s\">\n", k_lane_name[stream]);
  for (int32_t i = 0; i < r->n_instr; i++) {
    if (r->stream[i] != stream) continue;
    double t0 = r->start[i], t1 = r->end[i];
    if (!(t1 >= t0)) t1 = t0;
    const double x0 = xat(c, t0), x1 = xat(c, t1);
    const cat k = instr_cat(s, &s->instr[i]);
    const int tiny = x1 - x0 < k_min_px;
    /* Join the pending run when this one is tiny, touches it, and either has
     * its colour or the run is itself still too narrow to see. */
    if (tiny && g.n > 0 && x0 - g.x1 < k_min_px && g.x1 - g.x0 < 4 * k_min_px) {
      int same = 1;
      for (int q = 0; q < CAT_N; q++)
        if (q != (int)k && g.cat_s[q] > 0) same = 0;
      if (same || g.x1 - g.x0 < k_min_px) {
        g.n++, g.last = i;
        if (x1 > g.x1) g.x1 = x1, g.t1 = t1;
        g.cat_s[k] += t1 - t0 + 1e-30;
        continue;
      }
    }
    flush(c, &g, y);
    g.n = 1, g.first = g.last = i, g.x0 = x0, g.x1 = x1, g.t0 = t0, g.t1 = t1;
    memset(g.cat_s, 0, sizeof g.cat_s);
    g.cat_s[k] = t1 - t0 + 1e-30;
    if (!tiny) flush(c, &g, y);
  }
  flush(c, &g, y);
  mf_svg_printf(c->b, "</g>\n");
}

/* ----------------------------------------------------------- the host lane */

/* What the host does in the step, beside the streams: the staging arena's
 * fills (an H2D slab, from its fill's start to its first DMA) and copy-outs
 * (a D2H slab, from its last DMA's end to the copy-out's end), and the host
 * AdamW (from optimizer_start for optimizer_seconds; NVMe-bound when the
 * optimizer's state streaming from NVMe sets its pace). */
enum { HOST_FILL = 0, HOST_DRAIN, HOST_ADAMW, HOST_NVME, HOST_N };
static const char *const k_host_name[HOST_N] = {"staging fill", "staging copy-out", "host AdamW",
                                                "host AdamW (NVMe-bound)"};
static const char *const k_host_color[HOST_N] = {"#8c6d31", "#bd9e39", "#843c39", "#d6616b"};

static void sb_bytes(mf_svg *b, double bytes);

/* Merges host rectangles narrower than k_min_px into runs (n of them). */
typedef struct host_run {
  int kind, n;
  double t0, t1, x0, x1, bytes;
} host_run;

static void host_flush(ctx *c, host_run *h, double y) {
  if (h->n == 0) return;
  mf_svg *b = c->b;
  mf_svg_printf(b, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\"><title>", h->x0, y,
            h->x1 - h->x0 > 0 ? h->x1 - h->x0 : 0, k_lane_h, k_host_color[h->kind]);
  if (h->kind == HOST_FILL || h->kind == HOST_DRAIN) {
    mf_svg_printf(b, "%s of %d slab%s, ", k_host_name[h->kind], h->n, h->n == 1 ? "" : "s");
    sb_bytes(b, h->bytes);
    mf_svg_printf(b, "\n");
  }
  sb_time(b, h->t0), mf_svg_printf(b, " to "), sb_time(b, h->t1), mf_svg_printf(b, " (");
  sb_time(b, h->t1 - h->t0), mf_svg_printf(b, ")</title></rect>\n");
  h->n = 0;
}

static void host_add(ctx *c, host_run *h, double y, int kind, double t0, double t1, double bytes) {
  if (t0 < 0) t0 = 0;
  if (!(t1 > t0)) t1 = t0;
  const double x0 = xat(c, t0), x1 = xat(c, t1);
  if (h->n > 0 && h->kind == kind && x0 - h->x1 < k_min_px && (x1 - x0 < k_min_px || h->x1 - h->x0 < k_min_px)) {
    h->n++, h->bytes += bytes;
    if (x1 > h->x1) h->x1 = x1, h->t1 = t1;
    return;
  }
  host_flush(c, h, y);
  *h = (host_run){kind, 1, t0, t1, x0, x1, bytes};
}

static void host_lane(ctx *c, const mf_staging *sg, double y) {
  const mf_plan *pl = c->pl;
  const mf_sim_result *r = &pl->sim;
  mf_svg *b = c->b;
  host_run h = {0, 0, 0, 0, 0, 0, 0};
  mf_svg_printf(b, "<g id=\"lane-host\">\n");
  for (int32_t k = 0; sg && k < sg->n_slabs; k++) {
    const mf_staging_slab *s = &sg->slabs[k];
    if (s->dir == MF_I_H2D)
      host_add(c, &h, y, HOST_FILL, s->busy_start, s->dma_start, (double)s->bytes);
    else
      host_add(c, &h, y, HOST_DRAIN, s->dma_end, s->busy_end, (double)s->bytes);
  }
  host_flush(c, &h, y);
  if (r->optimizer_seconds > 0) {
    const double adamw = mf_hw_adamw_seconds(pl->hw, (double)pl->prog->params->trainable_numel);
    const int nvme = pl->so.optimizer_floor_seconds > adamw;
    const double t0 = r->optimizer_start, t1 = t0 + r->optimizer_seconds;
    const double x0 = xat(c, t0), x1 = xat(c, t1);
    /* Drawn at half height below the copies, so fills under it stay visible. */
    mf_svg_printf(b, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\" fill-opacity=\"0.85\"><title>",
              x0, y + k_lane_h / 2, x1 - x0 > 0 ? x1 - x0 : 0, k_lane_h / 2, k_host_color[nvme ? HOST_NVME : HOST_ADAMW]);
    mf_svg_printf(b, "%s: ", k_host_name[nvme ? HOST_NVME : HOST_ADAMW]);
    sb_time(b, r->optimizer_seconds);
    mf_svg_printf(b, ", %s; waited for: ", pl->so.overlap_optimizer ? "behind the next step's device work" : "after the step");
    sb_time(b, r->exposed_optimizer_seconds);
    if (nvme) {
      mf_svg_printf(b, "; its state's NVMe traffic alone takes ");
      sb_time(b, pl->so.optimizer_floor_seconds);
    }
    mf_svg_printf(b, "</title></rect>\n");
  }
  mf_svg_printf(b, "</g>\n");
}

/* ------------------------------------------------------ the memory curve */

static int by_start(const void *a, const void *b, void *arg) {
  const double *st = (const double *)arg;
  const int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
  if (st[i] < st[j]) return -1;
  if (st[i] > st[j]) return 1;
  return (i > j) - (i < j);
}

static void sb_bytes(mf_svg *b, double bytes) {
  char buf[32];
  mf_svg_printf(b, "%s", mf_format_bytes((uint64_t)(bytes < 0 ? 0 : bytes), buf, sizeof buf));
}

static mf_status memory(ctx *c) {
  const mf_sim_result *r = &c->pl->sim;
  const mf_schedule *s = c->pl->s;
  mf_svg *b = c->b;
  const uint64_t budget = c->pl->budget;
  double top = (double)(s->arena_bytes > r->peak_live_bytes ? s->arena_bytes : r->peak_live_bytes);
  /* The budget sets the scale unless it dwarfs the plan (an unlimited budget). */
  const int budget_on_scale = (double)budget <= 2.0 * top || top == 0;
  if (budget_on_scale && (double)budget > top) top = (double)budget;
  if (!(top > 0)) top = 1;
  top *= 1.08;
  const double h = k_mem_bot - k_mem_top;
#define YAT(v) (k_mem_bot - (double)(v) / top * h)

  /* Axis: memory ticks in the largest binary unit below the top. */
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (u < 4 && top >= 1024.0 * pow(1024, u)) u++;
  const double unit = pow(1024, u), step = mf_svg_nice_step(top / unit, 6) * unit;
  mf_svg_printf(b, "<g id=\"memory-axis\" font-size=\"10\" fill=\"#333\">\n");
  for (int k = 0; k * step <= top * 1.0001 && k <= 100; k++) {
    const double v = k * step, y = YAT(v);
    mf_svg_printf(b, "<line x1=\"%.1f\" y1=\"%.2f\" x2=\"%.1f\" y2=\"%.2f\" stroke=\"#e4e4e4\"/>", k_x0, y, k_x1, y);
    mf_svg_printf(b, "<text x=\"%.1f\" y=\"%.2f\" text-anchor=\"end\">%g %s</text>\n", k_x0 - 6, y + 3, v / unit,
              units[u]);
  }
  mf_svg_printf(b, "<text x=\"16\" y=\"%.1f\" transform=\"rotate(-90 16 %.1f)\" text-anchor=\"middle\" "
               "font-size=\"11\">device memory</text>\n</g>\n",
            (k_mem_top + k_mem_bot) / 2, (k_mem_top + k_mem_bot) / 2);

  /* The curve: instructions by start time; per pixel column the highest value
   * seen (so the peak survives), then the value carried to the next column. */
  const int32_t n = r->n_instr;
  const int cols = (int)(k_x1 - k_x0) + 1;
  int32_t *order = NULL;
  double *colmax = NULL, *collast = NULL;
  mf_status st = MF_OK;
  MF_CHECK_GOTO(mf_malloc((size_t)(n > 0 ? n : 1) * sizeof *order, "render: instruction order", (void **)&order), st,
                done);
  MF_CHECK_GOTO(mf_malloc((size_t)cols * sizeof *colmax, "render: memory curve", (void **)&colmax), st, done);
  MF_CHECK_GOTO(mf_malloc((size_t)cols * sizeof *collast, "render: memory curve", (void **)&collast), st, done);
  for (int32_t i = 0; i < n; i++) order[i] = i;
  qsort_r(order, (size_t)n, sizeof *order, by_start, r->start);
  for (int k = 0; k < cols; k++) colmax[k] = -1, collast[k] = -1;
  for (int32_t j = 0; j < n; j++) {
    const int32_t i = order[j];
    int k = (int)floor(xat(c, r->start[i]) - k_x0);
    k = k < 0 ? 0 : k >= cols ? cols - 1 : k;
    const double v = (double)r->live_bytes[i];
    if (v > colmax[k]) colmax[k] = v;
    collast[k] = v;
  }
  mf_svg_printf(b, "<g id=\"memory\">\n<path fill=\"#4c78a8\" fill-opacity=\"0.18\" stroke=\"#4c78a8\" "
               "stroke-width=\"1\" d=\"M%.1f %.2f",
            k_x0, YAT(0));
  double cur = 0;
  const double x_end = xat(c, r->streams_seconds);
  for (int k = 0; k < cols; k++) {
    if (colmax[k] < 0) continue;
    const double x = k_x0 + k;
    mf_svg_printf(b, "H%.1f", x);
    if (colmax[k] != cur) mf_svg_printf(b, "V%.2f", YAT(colmax[k]));
    if (collast[k] != colmax[k]) mf_svg_printf(b, "H%.1fV%.2f", x + 1 > k_x1 ? k_x1 : x + 1, YAT(collast[k]));
    cur = collast[k];
  }
  mf_svg_printf(b, "H%.1fV%.2fZ\"><title>device memory alive (bytes of the slots live at each instruction)</title>"
               "</path>\n",
            x_end > k_x0 ? x_end : k_x0, YAT(0));

  /* Budget (dashed), arena (dotted), peak (marked). */
  const double yb = budget_on_scale ? YAT(budget) : k_mem_top;
  mf_svg_printf(b, "<line id=\"budget\" x1=\"%.1f\" y1=\"%.2f\" x2=\"%.1f\" y2=\"%.2f\" stroke=\"#d62728\" "
               "stroke-width=\"1.5\" stroke-dasharray=\"6 4\"/>\n",
            k_x0, yb, k_x1, yb);
  mf_svg_printf(b, "<text x=\"%.1f\" y=\"%.2f\" text-anchor=\"end\" fill=\"#d62728\" font-size=\"10\">budget ", k_x1 - 2,
            yb - 4);
  if (budget == UINT64_MAX)
    mf_svg_printf(b, "unlimited");
  else
    sb_bytes(b, (double)budget);
  mf_svg_printf(b, "%s</text>\n", budget_on_scale ? "" : " (above the scale)");
  const double ya = YAT(s->arena_bytes);
  mf_svg_printf(b, "<line id=\"arena\" x1=\"%.1f\" y1=\"%.2f\" x2=\"%.1f\" y2=\"%.2f\" stroke=\"#555\" "
               "stroke-dasharray=\"2 3\"/>\n<text x=\"%.1f\" y=\"%.2f\" fill=\"#555\" font-size=\"10\">arena ",
            k_x0, ya, k_x1, ya, k_x0 + 4, ya - 4);
  sb_bytes(b, (double)s->arena_bytes);
  mf_svg_printf(b, "</text>\n");
  if (r->peak_instr >= 0 && r->peak_instr < n) {
    const double xp = xat(c, r->start[r->peak_instr]), yp = YAT(r->peak_live_bytes);
    mf_svg_printf(b, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"3.5\" fill=\"#d62728\"/>", xp, yp);
    mf_svg_printf(b, "<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"%s\" font-size=\"11\" font-weight=\"bold\">peak ",
              xp + (xp > k_x1 - 240 ? -6 : 6), yp + 14, xp > k_x1 - 240 ? "end" : "start");
    sb_bytes(b, (double)r->peak_live_bytes);
    mf_svg_printf(b, " at "), sb_time(b, r->start[r->peak_instr]), mf_svg_printf(b, " (");
    sb_instr_name(b, s, &s->instr[r->peak_instr]);
    mf_svg_printf(b, ")</text>\n");
  }
  mf_svg_printf(b, "</g>\n");
#undef YAT
done:
  free(order);
  free(colmax);
  free(collast);
  return st;
}

/* ------------------------------------------------------------- the rest */

static void time_axis(ctx *c, double y_top, double y_bot, double y_labels) {
  mf_svg *b = c->b;
  const int ms = c->t_max < 1;
  const double scale = ms ? 1e3 : 1, step = mf_svg_nice_step(c->t_max * scale, 10) / scale;
  mf_svg_printf(b, "<g class=\"time-axis\" font-size=\"10\" fill=\"#333\">\n");
  for (int k = 0; k * step <= c->t_max * 1.0001 && k <= 100; k++) {
    const double x = xat(c, k * step);
    mf_svg_printf(b, "<line x1=\"%.2f\" y1=\"%.1f\" x2=\"%.2f\" y2=\"%.1f\" stroke=\"#e4e4e4\"/>", x, y_top, x, y_bot);
    mf_svg_printf(b, "<text x=\"%.2f\" y=\"%.1f\" text-anchor=\"middle\">%g %s</text>\n", x, y_labels,
              k * step * scale, ms ? "ms" : "s");
  }
  mf_svg_printf(b, "</g>\n");
}

static void legend_item(mf_svg *b, double *x, double y, const char *color, const char *name) {
  mf_svg_printf(b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"12\" height=\"12\" fill=\"%s\"/>", *x, y - 10, color);
  mf_svg_printf(b, "<text x=\"%.1f\" y=\"%.1f\">%s</text>\n", *x + 16, y, name);
  *x += 24 + 6.0 * (double)strlen(name) + 10;
}

static void legend(mf_svg *b, double y) {
  double x = k_x0;
  mf_svg_printf(b, "<g id=\"legend\" font-size=\"11\">\n");
  for (int k = 0; k < CAT_N; k++) legend_item(b, &x, y, k_cat_color[k], k_cat_name[k]);
  x = k_x0;
  for (int k = 0; k < HOST_N; k++) legend_item(b, &x, y + 16, k_host_color[k], k_host_name[k]);
  mf_svg_printf(b, "<text x=\"%.1f\" y=\"%.1f\" fill=\"#555\">(runs narrower than %.1f px merged; hover for "
               "names and times)</text>\n</g>\n",
            x + 10, y + 16, k_min_px);
}

mf_status mf_render_svg(const mf_plan *plan, const mf_staging *sg, const char *title, const char *path) {
  if (!plan || !plan->s || !plan->s->prog || !path)
    return MF_ERR(MF_ERR_INVALID_ARG, "render: no plan, schedule or path");
  const mf_sim_result *r = &plan->sim;
  const mf_schedule *s = plan->s;
  if (r->n_instr != s->n_instr || (r->n_instr > 0 && (!r->stream || !r->start || !r->end || !r->live_bytes)))
    return MF_ERR(MF_ERR_INVALID_ARG, "render %s: the simulation (%d instructions) does not match the schedule (%d)",
                  path, (int)r->n_instr, (int)s->n_instr);

  mf_svg b = {0};
  ctx c = {&b, plan, 0, 0};
  c.t_max = r->step_seconds > r->streams_seconds ? r->step_seconds : r->streams_seconds;
  for (int32_t i = 0; i < r->n_instr; i++)
    if (r->end[i] > c.t_max) c.t_max = r->end[i];
  if (!(c.t_max > 0) || !isfinite(c.t_max)) c.t_max = 1e-3;
  c.sx = (k_x1 - k_x0) / c.t_max;

  mf_svg_printf(&b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
                "font-family=\"sans-serif\" font-size=\"11\">\n",
            W, H, W, H);
  mf_svg_printf(&b, "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"#ffffff\"/>\n", W, H);
  mf_svg_printf(&b, "<text x=\"%.1f\" y=\"22\" font-size=\"15\" font-weight=\"bold\">", k_x0);
  mf_svg_escape(&b, title ? title : "moefit plan");
  mf_svg_printf(&b, " (%s plan)</text>\n<text x=\"%.1f\" y=\"42\" font-size=\"12\" fill=\"#333\">predicted step ",
            mf_plan_kind_name(plan->kind), k_x0);
  sb_time(&b, r->step_seconds);
  mf_svg_printf(&b, " (compute "), sb_time(&b, r->compute_seconds);
  mf_svg_printf(&b, ", exposed transfer "), sb_time(&b, r->exposed_transfer_seconds);
  mf_svg_printf(&b, ", exposed optimizer "), sb_time(&b, r->exposed_optimizer_seconds);
  mf_svg_printf(&b, ") · arena "), sb_bytes(&b, (double)s->arena_bytes);
  mf_svg_printf(&b, " · peak "), sb_bytes(&b, (double)r->peak_live_bytes);
  mf_svg_printf(&b, " · budget ");
  if (plan->budget == UINT64_MAX)
    mf_svg_printf(&b, "unlimited");
  else
    sb_bytes(&b, (double)plan->budget);
  mf_svg_printf(&b, "%s · %d instructions</text>\n", plan->fits ? "" : " (does not fit)", (int)r->n_instr);

  /* The streams' lanes, then the host's. */
  const double lanes_bot = k_lane_y + (MF_SIM_STREAMS + 1) * (k_lane_h + k_lane_gap) - k_lane_gap;
  time_axis(&c, k_lane_y - 4, lanes_bot + 4, lanes_bot + 18);
  for (int k = 0; k <= MF_SIM_STREAMS; k++) {
    const double y = k_lane_y + k * (k_lane_h + k_lane_gap);
    mf_svg_printf(&b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#f6f6f6\"/>", k_x0, y,
              k_x1 - k_x0, k_lane_h);
    mf_svg_printf(&b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" font-size=\"12\">%s</text>\n", k_x0 - 8,
              y + k_lane_h / 2 + 4, k < MF_SIM_STREAMS ? k_lane_name[k] : "host");
    if (k < MF_SIM_STREAMS)
      lane(&c, k, y);
    else
      host_lane(&c, sg, y);
  }
  /* The OPTIM part (planner/schedule.h optim_begin): the device's AdamW
   * updates, which wait for the host's global gradient norm. */
  if (s->optim_begin >= 0 && s->optim_begin < s->n_instr) {
    double t_opt = r->start[s->optim_begin];
    for (int32_t i = s->optim_begin; i < s->n_instr; i++)
      if (r->start[i] < t_opt) t_opt = r->start[i];
    const double xo = xat(&c, t_opt);
    mf_svg_printf(
        &b,
        "<line id=\"optim-begin\" x1=\"%.2f\" y1=\"%.1f\" x2=\"%.2f\" y2=\"%.1f\" stroke=\"%s\" "
        "stroke-width=\"1.5\" stroke-dasharray=\"3 2\"><title>device optimizer (AdamW of %d parameters) "
        "from ",
        xo, k_lane_y - 6, xo, lanes_bot + 6, k_cat_color[CAT_OPTIM], (int)s->n_optim_device);
    sb_time(&b, t_opt);
    mf_svg_printf(&b, ", once the host has the global gradient norm</title></line>\n");
  }
  if (r->step_seconds > r->streams_seconds) {
    const double xs = xat(&c, r->streams_seconds), xe = xat(&c, r->step_seconds);
    mf_svg_printf(&b, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"#cccccc\" fill-opacity=\"0.5\">"
                  "<title>host optimizer after the streams: ",
              xs, k_lane_y, xe - xs, lanes_bot - k_lane_y);
    sb_time(&b, r->step_seconds - r->streams_seconds);
    mf_svg_printf(&b, "</title></rect>\n");
  }
  legend(&b, lanes_bot + 44);

  mf_svg_printf(&b, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" font-weight=\"bold\">device memory over the step</text>\n",
            k_x0, k_mem_top - 12);
  time_axis(&c, k_mem_top, k_mem_bot, k_mem_bot + 16);
  mf_status st = memory(&c);
  if (st != MF_OK) {
    mf_svg_free(&b);
    return st;
  }
  mf_svg_printf(&b, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" font-size=\"11\">time (simulated)</text>\n",
            (k_x0 + k_x1) / 2, H - 22);
  mf_svg_printf(&b, "</svg>\n");
  st = mf_svg_write(&b, path);
  if (st != MF_OK) mf_error_trace(__FILE__, __LINE__, "mf_svg_write(&b, path)");
  return st;
}

/* ------------------------------------------------------ the text tables */

static mf_status check_text_args(const mf_program *p, const mf_decisions *d, FILE *out, const char *fn) {
  if (!p || !d || !out) return MF_ERR(MF_ERR_INVALID_ARG, "%s: NULL argument", fn);
  if (d->n_params != (int32_t)p->params->n || d->n_tensors != p->n_tensors || !d->optim)
    return MF_ERR(MF_ERR_INVALID_ARG, "%s: decisions are for another program", fn);
  return MF_OK;
}

static mf_status text_done(FILE *out, const char *fn) {
  if (ferror(out)) return MF_ERR(MF_ERR_IO, "%s: writing the table failed", fn);
  return MF_OK;
}

/* "host", "device", "mixed D/N" (D of the N on the device) or "-" (none, or no optimizer). */
static void optim_word(const mf_program *p, int n, int dev, char *buf, size_t cap) {
  if (p->forward_only || n == 0)
    snprintf(buf, cap, "-");
  else if (dev == 0)
    snprintf(buf, cap, "host");
  else if (dev == n)
    snprintf(buf, cap, "device");
  else
    snprintf(buf, cap, "mixed %d/%d", dev, n);
}

/* The layer table's columns: the row's name, weights resident/streamed,
 * gradients on the device/streamed, the optimizer, activations
 * kept/offloaded/recomputed. */
static const char k_layer_align[] = "lrrrrlrrr";

static void layer_table_header(mf_table *tb) {
  mf_table_group(tb, 1, 2, "weights");
  mf_table_group(tb, 3, 2, "gradients");
  mf_table_group(tb, 6, 3, "activations");
  static const char *const head[] = {"", "resident", "streamed", "device", "streamed", "optimizer",
                                     "kept", "offloaded", "recomputed"};
  for (size_t i = 0; i < sizeof head / sizeof head[0]; i++) mf_table_cell(tb, "%s", head[i]);
}

/* Layer l's row (-1: the parameters outside the layers, no activations). */
/* One row's counts (layer_counts). */
typedef struct layer_count {
  int wr, ws, gd, gs, od, n, ak, ao, ar;
} layer_count;

/* Every layer's counts in one pass over the parameters and the tensors: c[l + 1]
 * for layer l, c[0] for the parameters of no layer. */
static void layer_counts(const mf_program *p, const mf_decisions *d, layer_count *c) {
  const int32_t L = (int32_t)p->spec.layers;
  for (int32_t i = 0; i < d->n_params; i++) {
    const mf_param *q = &p->params->params[i];
    if (q->layer < -1 || q->layer >= L || !mf_program_holds_param(p, i)) continue; /* another rank's expert */
    layer_count *x = &c[q->layer + 1];
    d->param[i] == MF_PARAM_RESIDENT ? x->wr++ : x->ws++;
    if (q->frozen) continue; /* no gradient, no optimizer */
    x->n++;
    d->grad[i] == MF_GRAD_DEVICE ? x->gd++ : x->gs++;
    x->od += d->optim[i] == MF_OPTIM_DEVICE;
  }
  for (int32_t t = 0; t < p->n_tensors; t++) {
    const int32_t l = p->tensors[t].layer;
    if (l < 0 || l >= L || !mf_schedule_can_offload(p, t)) continue;
    layer_count *x = &c[l + 1];
    d->act[t] == MF_ACT_KEEP ? x->ak++ : d->act[t] == MF_ACT_OFFLOAD ? x->ao++ : x->ar++;
  }
}

static void layer_row(mf_table *tb, const mf_program *p, const layer_count *c, int32_t l) {
  const int wr = c->wr, ws = c->ws, gd = c->gd, gs = c->gs, ak = c->ak, ao = c->ao, ar = c->ar;
  char ow[32];
  optim_word(p, c->n, c->od, ow, sizeof ow);
  if (l < 0)
    mf_table_cell(tb, "embed/head");
  else
    mf_table_cell(tb, "layer %d", (int)l);
  mf_table_cell(tb, "%d", wr), mf_table_cell(tb, "%d", ws);
  mf_table_cell(tb, "%d", gd), mf_table_cell(tb, "%d", gs);
  mf_table_cell(tb, "%s", ow);
  if (l < 0)
    for (int k = 0; k < 3; k++) mf_table_cell(tb, "%s", "");
  else
    mf_table_cell(tb, "%d", ak), mf_table_cell(tb, "%d", ao), mf_table_cell(tb, "%d", ar);
}

mf_status mf_render_layer_table(const mf_program *p, const mf_decisions *d, FILE *out) {
  MF_CHECK(check_text_args(p, d, out, "mf_render_layer_table"));
  mf_table *tb = NULL;
  layer_count *c = NULL;
  MF_CHECK(mf_calloc((size_t)p->spec.layers + 1, sizeof *c, "the layer table", (void **)&c));
  const mf_status cs = mf_table_create(k_layer_align, &tb);
  if (cs != MF_OK) {
    free(c);
    return cs;
  }
  layer_counts(p, d, c);
  layer_table_header(tb);
  for (int32_t l = -1; l < (int32_t)p->spec.layers; l++) layer_row(tb, p, &c[l + 1], l);
  free(c);
  fprintf(out, "\nper layer: tensors by decision\n");
  const mf_status st = mf_table_print(tb, out, "  ");
  mf_table_free(tb);
  MF_CHECK(st);
  return text_done(out, "mf_render_layer_table");
}

mf_status mf_render_optimizer_summary(const mf_program *p, const mf_decisions *d, FILE *out) {
  MF_CHECK(check_text_args(p, d, out, "mf_render_optimizer_summary"));
  if (p->forward_only) {
    fprintf(out, "optimizer: none (a forward-only step)\n");
    return text_done(out, "mf_render_optimizer_summary");
  }
  int n_dev = 0, n = 0;
  int64_t numel = 0, numel_dev = 0;
  uint64_t weight_bytes = 0, state_bytes = 0;
  for (int32_t i = 0; i < d->n_params; i++) {
    if (p->params->params[i].frozen) continue; /* LoRA's base: no optimizer */
    n++;
    numel += p->params->params[i].numel;
    if (d->optim[i] != MF_OPTIM_DEVICE) continue;
    n_dev++;
    numel_dev += p->params->params[i].numel;
    weight_bytes += p->tensors[p->param_tensor[i]].bytes;
    if (p->state_tensor && p->state_tensor[i] >= 0) state_bytes += p->tensors[p->state_tensor[i]].bytes;
  }
  if (n_dev == 0) {
    fprintf(out, "optimizer: all %d %sparameters updated on the host (AdamW at home)\n", n,
            n < d->n_params ? "trained " : "");
    return text_done(out, "mf_render_optimizer_summary");
  }
  char a[32], b[32], c[32], e[32];
  fprintf(out,
          "optimizer: %d of %d %sparameters (%s of %s elements) updated on the device: %s of weights and %s "
          "of AdamW state (%s moments) stay there across steps; %d on the host\n",
          n_dev, n, n < d->n_params ? "trained " : "", mf_format_count((double)numel_dev, c, sizeof c),
          mf_format_count((double)numel, e, sizeof e), mf_format_bytes(weight_bytes, a, sizeof a),
          mf_format_bytes(state_bytes, b, sizeof b), p->moments == MF_DTYPE_BF16 ? "bf16" : "fp32",
          n - n_dev);
  return text_done(out, "mf_render_optimizer_summary");
}
