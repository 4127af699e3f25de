/* `moefit plot RUN [--out FILE.svg]`: a run's train and eval loss and its
 * tokens/s against the step, from RUN/metrics.jsonl, as one SVG file. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "src/cli/commands.h"
#include "src/core/svg.h"
#include "src/train/metrics.h"

static const char k_usage[] =
    "usage: moefit plot RUN [--out FILE.svg]\n\n"
    "Draws a training run's curves from RUN/metrics.jsonl (RUN: the output.dir `moefit train`\n"
    "wrote, or that metrics.jsonl itself) as one self-contained SVG file, default\n"
    "RUN/curves.svg; open it in a browser (hover a point for its values):\n"
    "  loss      the train loss of each logged step (the mean over the steps since the\n"
    "            previous line, as the progress lines print it) and the validation loss of the\n"
    "            steps that evaluated (points), nats per token, against the step\n"
    "  tokens/s  the training throughput of each logged window (evaluation excluded)\n"
    "A resumed run is drawn as it went on: the lines of the steps it repeated after its\n"
    "checkpoint are replaced, and each resume is marked with a dashed line.\n"
    "  --out FILE.svg   where to write (replaced if it exists)\n";

enum { W = 1000, H = 720 };
static const double k_x0 = 90, k_x1 = 960;
static const double k_loss_top = 100, k_loss_bot = 430;
static const double k_rate_top = 490, k_rate_bot = 650;
#define C_TRAIN "#4c78a8"
#define C_EVAL "#e45756"
#define C_RATE "#54a24b"
#define C_RESUME "#777777"

typedef struct plot {
  mf_svg *b;
  const mf_metrics_log *log;
  double x_hi;    /* the last step drawn */
  double lo, hi;  /* the loss chart's range */
  double rate_hi; /* the tokens/s chart's top */
} plot;

static double xat(const plot *p, double step) {
  return k_x0 + step / p->x_hi * (k_x1 - k_x0);
}
static double yat(double v, double lo, double hi, double top, double bot) {
  return bot - (v - lo) / (hi - lo) * (bot - top);
}

/* The train loss a line shows: its window's mean (the step's own without a window). */
static double train_loss(const mf_step_metrics *s) {
  return s->window_steps > 0 ? s->window_loss : s->loss;
}

/* The step axis under a chart: grid lines over [top, bot], labels below. */
static void step_axis(const plot *p, double top, double bot) {
  const double step = mf_svg_nice_step(p->x_hi, 10);
  mf_svg_printf(p->b, "<g class=\"step-axis\" font-size=\"10\" fill=\"#333\">\n");
  for (int k = 0; k * step <= p->x_hi * 1.0001 && k <= 100; k++) {
    const double x = xat(p, k * step);
    mf_svg_printf(p->b, "<line x1=\"%.2f\" y1=\"%.1f\" x2=\"%.2f\" y2=\"%.1f\" stroke=\"#e4e4e4\"/>", x, top,
                  x, bot);
    mf_svg_printf(p->b, "<text x=\"%.2f\" y=\"%.1f\" text-anchor=\"middle\">%g</text>\n", x, bot + 14,
                  k * step);
  }
  mf_svg_printf(p->b, "</g>\n");
}

/* A value axis at the left of a chart; rate: labels as counts (12.3K). */
static void value_axis(const plot *p, double lo, double hi, double top, double bot, int rate,
                       const char *name) {
  const double step = mf_svg_nice_step(hi - lo, 8);
  mf_svg_printf(p->b, "<g class=\"value-axis\" font-size=\"10\" fill=\"#333\">\n");
  for (int k = (int)ceil(lo / step - 1e-9);
       k * step <= hi * (1 + 1e-9) + 1e-12 && k <= (int)ceil(lo / step) + 100; k++) {
    const double v = k * step, y = yat(v, lo, hi, top, bot);
    char label[32];
    if (rate)
      mf_format_count(v, label, sizeof label);
    else
      snprintf(label, sizeof label, "%g", v);
    mf_svg_printf(p->b, "<line x1=\"%.1f\" y1=\"%.2f\" x2=\"%.1f\" y2=\"%.2f\" stroke=\"#e4e4e4\"/>", k_x0, y,
                  k_x1, y);
    mf_svg_printf(p->b, "<text x=\"%.1f\" y=\"%.2f\" text-anchor=\"end\">%s</text>\n", k_x0 - 6, y + 3,
                  label);
  }
  mf_svg_printf(p->b,
                "<text x=\"18\" y=\"%.1f\" transform=\"rotate(-90 18 %.1f)\" text-anchor=\"middle\" "
                "font-size=\"11\">%s</text>\n</g>\n",
                (top + bot) / 2, (top + bot) / 2, name);
}

/* A series as one path, broken where a value is not finite. */
static void series(const plot *p, double (*get)(const mf_step_metrics *), double lo, double hi, double top,
                   double bot, const char *color, const char *id) {
  mf_svg_printf(p->b, "<path id=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" d=\"", id, color);
  int pen = 0;
  for (size_t i = 0; i < p->log->n; i++) {
    const mf_step_metrics *s = &p->log->lines[i];
    const double v = get(s);
    if (!isfinite(v)) {
      pen = 0;
      continue;
    }
    mf_svg_printf(p->b, "%s%.2f %.2f", pen ? " L" : " M", xat(p, (double)s->step), yat(v, lo, hi, top, bot));
    pen = 1;
  }
  mf_svg_printf(p->b, "\"/>\n");
}

static double rate_of(const mf_step_metrics *s) {
  return s->tokens_per_s;
}

/* Small points with their values on hover, every logged step's (a few
 * thousand at most: more lines than that are shown by the path alone). */
static void hover_points(const plot *p) {
  if (p->log->n > 4000) return;
  mf_svg_printf(p->b, "<g id=\"train-points\" fill=\"" C_TRAIN "\">\n");
  for (size_t i = 0; i < p->log->n; i++) {
    const mf_step_metrics *s = &p->log->lines[i];
    const double v = train_loss(s);
    if (!isfinite(v)) continue;
    mf_svg_printf(p->b, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"2\"><title>step %lld: train loss %.4f",
                  xat(p, (double)s->step), yat(v, p->lo, p->hi, k_loss_top, k_loss_bot), (long long)s->step,
                  v);
    if (s->window_steps > 1) mf_svg_printf(p->b, " (mean of %lld steps)", (long long)s->window_steps);
    char r[32];
    mf_svg_printf(p->b, ", %s tokens/s, lr %.3g%s</title></circle>\n",
                  mf_format_count(s->tokens_per_s, r, sizeof r), s->lr,
                  s->skipped ? ", SKIPPED (non-finite gradients)" : "");
  }
  mf_svg_printf(p->b, "</g>\n");
}

static void eval_points(const plot *p) {
  mf_svg_printf(p->b, "<g id=\"eval\" fill=\"" C_EVAL "\">\n");
  for (size_t i = 0; i < p->log->n; i++) {
    const mf_step_metrics *s = &p->log->lines[i];
    if (!isfinite(s->eval_loss)) continue;
    mf_svg_printf(
        p->b, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"4\"><title>step %lld: eval loss %.4f</title></circle>\n",
        xat(p, (double)s->step), yat(s->eval_loss, p->lo, p->hi, k_loss_top, k_loss_bot), (long long)s->step,
        s->eval_loss);
  }
  mf_svg_printf(p->b, "</g>\n");
}

static void resumes(const plot *p) {
  for (size_t i = 0; i < p->log->n_resumes; i++) {
    const double x = xat(p, (double)p->log->resumes[i].step);
    mf_svg_printf(
        p->b,
        "<g class=\"resume\"><line x1=\"%.2f\" y1=\"%.1f\" x2=\"%.2f\" y2=\"%.1f\" stroke=\"" C_RESUME
        "\" "
        "stroke-dasharray=\"5 4\"/><text x=\"%.2f\" y=\"%.1f\" font-size=\"10\" fill=\"" C_RESUME
        "\">"
        "resumed at step %lld<title>",
        x, k_loss_top, x, k_rate_bot, x + 4, k_loss_top + 12, (long long)p->log->resumes[i].step);
    mf_svg_escape(p->b, p->log->resumes[i].from);
    mf_svg_printf(p->b, "</title></text></g>\n");
  }
}

static void legend(mf_svg *b, double y) {
  double x = k_x0;
  static const struct {
    const char *name, *color;
    int dot;
  } items[] = {{"train loss (mean since the previous logged step)", C_TRAIN, 0},
               {"eval loss", C_EVAL, 1},
               {"tokens/s", C_RATE, 0},
               {"resumed", C_RESUME, 0}};
  mf_svg_printf(b, "<g id=\"legend\" font-size=\"11\">\n");
  for (size_t k = 0; k < sizeof items / sizeof items[0]; k++) {
    if (items[k].dot)
      mf_svg_printf(b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"%s\"/>", x + 6, y - 4, items[k].color);
    else
      mf_svg_printf(
          b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\"%s/>", x,
          y - 4, x + 14, y - 4, items[k].color, k == 3 ? " stroke-dasharray=\"5 4\"" : "");
    mf_svg_printf(b, "<text x=\"%.1f\" y=\"%.1f\">%s</text>\n", x + 18, y, items[k].name);
    x += 30 + 6.2 * (double)strlen(items[k].name);
  }
  mf_svg_printf(b, "</g>\n");
}

/* The drawing of log (title: the run) into b. */
static void draw(mf_svg *b, const mf_metrics_log *log, const char *title) {
  plot p = {b, log, 1, INFINITY, -INFINITY, 0};
  const mf_step_metrics *first = &log->lines[0], *last = &log->lines[log->n - 1];
  p.x_hi = last->step > 0 ? (double)last->step : 1;
  for (size_t i = 0; i < log->n; i++) {
    const mf_step_metrics *s = &log->lines[i];
    const double v[2] = {train_loss(s), s->eval_loss};
    for (int k = 0; k < 2; k++)
      if (isfinite(v[k])) p.lo = fmin(p.lo, v[k]), p.hi = fmax(p.hi, v[k]);
    if (isfinite(s->tokens_per_s)) p.rate_hi = fmax(p.rate_hi, s->tokens_per_s);
  }
  if (!isfinite(p.lo)) p.lo = 0, p.hi = 1;
  const double pad = p.hi > p.lo ? 0.05 * (p.hi - p.lo) : 0.5;
  p.lo -= pad, p.hi += pad;
  p.rate_hi = p.rate_hi > 0 ? p.rate_hi * 1.1 : 1;

  mf_svg_printf(b,
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
                "font-family=\"sans-serif\" font-size=\"11\">\n",
                W, H, W, H);
  mf_svg_printf(b, "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"#ffffff\"/>\n", W, H);
  mf_svg_printf(b, "<text x=\"%.1f\" y=\"24\" font-size=\"15\" font-weight=\"bold\">", k_x0);
  mf_svg_escape(b, title);
  mf_svg_printf(b, "</text>\n<text x=\"%.1f\" y=\"44\" font-size=\"12\" fill=\"#333\">", k_x0);
  mf_svg_printf(b, "%zu logged steps to step %lld; train loss %.4f (step %lld) -> %.4f", log->n,
                (long long)last->step, train_loss(first), (long long)first->step, train_loss(last));
  for (size_t i = log->n; i-- > 0;)
    if (isfinite(log->lines[i].eval_loss)) {
      mf_svg_printf(b, "; eval loss %.4f at step %lld", log->lines[i].eval_loss,
                    (long long)log->lines[i].step);
      break;
    }
  if (log->n_resumes)
    mf_svg_printf(b, "; resumed %zu time%s", log->n_resumes, log->n_resumes == 1 ? "" : "s");
  mf_svg_printf(b, "</text>\n");
  legend(b, 68);

  mf_svg_printf(
      b, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" font-weight=\"bold\">loss (nats/token)</text>\n", k_x0,
      k_loss_top - 10);
  value_axis(&p, p.lo, p.hi, k_loss_top, k_loss_bot, 0, "loss");
  step_axis(&p, k_loss_top, k_loss_bot);
  series(&p, train_loss, p.lo, p.hi, k_loss_top, k_loss_bot, C_TRAIN, "train-loss");
  hover_points(&p);
  eval_points(&p);

  mf_svg_printf(
      b, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" font-weight=\"bold\">tokens/s (training)</text>\n",
      k_x0, k_rate_top - 8);
  value_axis(&p, 0, p.rate_hi, k_rate_top, k_rate_bot, 1, "tokens/s");
  step_axis(&p, k_rate_top, k_rate_bot);
  series(&p, rate_of, 0, p.rate_hi, k_rate_top, k_rate_bot, C_RATE, "tokens-per-s");
  resumes(&p);
  mf_svg_printf(b, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" font-size=\"11\">step</text>\n",
                (k_x0 + k_x1) / 2, H - 24);
  mf_svg_printf(b, "</svg>\n");
}

int mf_cli_plot(int argc, char **argv) {
  if (mf_cli_wants_help(argc, argv)) {
    printf("%s", k_usage);
    return MF_EXIT_OK;
  }
  const char *run = NULL, *out = NULL;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--out") == 0) {
      if (i + 1 >= argc) return mf_cli_usage_error("plot", "--out needs a FILE");
      out = argv[++i];
    } else if (strncmp(argv[i], "--", 2) == 0) {
      return mf_cli_usage_error("plot", "unknown option '%s'", argv[i]);
    } else if (!run) {
      run = argv[i];
    } else {
      return mf_cli_usage_error("plot", "expected one RUN, got '%s' too", argv[i]);
    }
  }
  if (!run) return mf_cli_usage_error("plot", "expected a RUN directory (a training run's output.dir)");
  /* RUN, or RUN/metrics.jsonl itself */
  char metrics[4400], dflt[4400], title[4600], dir[4400];
  struct stat sb;
  const int is_file = stat(run, &sb) == 0 && S_ISREG(sb.st_mode);
  if (is_file) {
    snprintf(metrics, sizeof metrics, "%s", run);
    const char *slash = strrchr(run, '/');
    snprintf(dflt, sizeof dflt, "%.*scurves.svg", slash ? (int)(slash - run + 1) : 0, run);
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - run) : 1, slash ? run : ".");
  } else {
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", run);
    snprintf(dflt, sizeof dflt, "%s/curves.svg", run);
    snprintf(dir, sizeof dir, "%s", run);
    if (stat(metrics, &sb) != 0) {
      fprintf(stderr, "moefit plot: error: %s: %s\n", run,
              stat(run, &sb) != 0
                  ? "no such file or directory"
                  : "no metrics.jsonl here: not a training run's output.dir (`moefit train` writes "
                    "OUTPUT_DIR/metrics.jsonl from its first step)");
      return MF_EXIT_FAIL;
    }
  }
  if (!out) out = dflt;
  mf_metrics_log log;
  mf_status st = mf_metrics_read(metrics, &log);
  if (st != MF_OK) {
    mf_metrics_log_free(&log);
    return mf_cli_fail("plot", st);
  }
  if (log.n == 0) {
    fprintf(stderr, "moefit plot: error: %s: no step lines yet (train writes one after step 1)\n", metrics);
    mf_metrics_log_free(&log);
    return MF_EXIT_FAIL;
  }
  snprintf(title, sizeof title, "moefit run %s", dir); /* the run, however it was named */
  mf_svg b = {0};
  draw(&b, &log, title);
  st = mf_svg_write(&b, out);
  if (st != MF_OK) {
    mf_metrics_log_free(&log);
    return mf_cli_fail("plot", st);
  }
  printf("wrote %s: %zu logged steps (to step %lld)%s%s\n", out, log.n, (long long)log.lines[log.n - 1].step,
         log.n_resumes ? ", resumed" : "", log.unread ? ", some lines of metrics.jsonl not read" : "");
  mf_metrics_log_free(&log);
  return MF_EXIT_OK;
}
