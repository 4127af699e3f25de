/* `moefit plan CONFIG`: what the planner decides for a config, beside the baselines. */
#include <fnmatch.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "planner/plan.h"
#include "planner/plan_io.h"
#include "planner/render.h"
#include "src/cli/commands.h"
#include "src/config/config.h"
#include "src/io/hf_config.h"
#include "src/model/params.h"
#include "src/model/program.h"

static const char k_usage[] =
    "usage: moefit plan CONFIG [key=value ...] [--tensor PATTERN] [--json FILE] [--svg FILE]\n\n"
    "Plans one training step of CONFIG's model and batch within memory.device_budget: for every\n"
    "weight resident or streamed, every gradient kept on the device or streamed home, every\n"
    "activation kept, offloaded or recomputed; the device arena; and the predicted step time from\n"
    "the hardware profile (hardware.profile), beside the baselines: everything resident,\n"
    "ZeRO-Offload-like, MegaTrain-like, checkpoint every layer, and the least-memory plan.\n\n"
    "  --tensor PATTERN   each matching tensor's decision and the predicted cost of the alternatives\n"
    "                     (shell glob over names; activations without their mbN. prefix)\n"
    "  --json FILE        write the chosen plan (versioned JSON, readable by the executor)\n"
    "  --svg FILE         draw the chosen plan's step: the compute, H2D and D2H streams over time\n"
    "                     and the device memory curve against the budget (hover for names)\n\n"
    "hardware.profile: a profile file (configs/hw/*.yaml, or `moefit profile` output); auto uses\n"
    "runs/hw/cpu.yaml when `moefit profile` wrote one, else configs/hw/cpu-2core.yaml.\n";

static void row(const char *name, const mf_plan *pl) {
  char arena[32], peak[32], h2d[32], d2h[32];
  const mf_sim_result *r = &pl->sim;
  printf("  %-24s %10s %10s %10s %10s %9.4f %9.4f %9.4f %9.4f  %s\n", name,
         mf_format_bytes(pl->s->arena_bytes, arena, sizeof arena), mf_format_bytes(pl->s->peak_live_bytes, peak, sizeof peak),
         mf_format_bytes(r->h2d_bytes, h2d, sizeof h2d), mf_format_bytes(r->d2h_bytes, d2h, sizeof d2h), r->step_seconds,
         r->compute_seconds, r->exposed_transfer_seconds, r->exposed_optimizer_seconds,
         pl->fits ? "fits" : "does not fit");
}

/* Per layer: how many weights are resident / streamed, and what the activations do. */
static void layer_table(const mf_program *p, const mf_decisions *d) {
  const int32_t L = (int32_t)p->spec.layers;
  printf("\nper layer:  weights res/stream   grads dev/stream   activations keep/offload/recompute\n");
  for (int32_t l = -1; l < L; l++) {
    int wr = 0, ws = 0, gd = 0, gs = 0, ak = 0, ao = 0, ar = 0;
    for (int32_t i = 0; i < d->n_params; i++) {
      if (p->params->params[i].layer != l) continue;
      d->param[i] == MF_PARAM_RESIDENT ? wr++ : ws++;
      d->grad[i] == MF_GRAD_DEVICE ? gd++ : gs++;
    }
    for (int32_t t = 0; t < p->n_tensors; t++) {
      if (p->tensors[t].layer != l || !mf_schedule_can_offload(p, t)) continue;
      d->act[t] == MF_ACT_KEEP ? ak++ : d->act[t] == MF_ACT_OFFLOAD ? ao++ : ar++;
    }
    if (l < 0)
      printf("  embed/head   %5d/%-5d          %5d/%-5d\n", wr, ws, gd, gs);
    else
      printf("  layer %-5d  %5d/%-5d          %5d/%-5d          %5d/%-5d/%-5d\n", l, wr, ws, gd, gs, ak, ao, ar);
  }
}

static const char *strip_micro(const char *name) {
  if (name[0] == 'm' && name[1] == 'b') {
    const char *dot = strchr(name, '.');
    if (dot) return dot + 1;
  }
  return name;
}

/* --tensor: each matching tensor's decision and what the alternatives would cost. */
static mf_status explain(const mf_program *p, const mf_hwprofile *hw, const mf_plan *chosen, const char *pattern) {
  mf_decisions *d = NULL;
  MF_CHECK(mf_decisions_create(p, &d));
  int shown = 0;
  mf_status st = MF_OK;
  printf("\ntensors matching %s (alternatives: predicted step seconds, arena):\n", pattern);
  for (int32_t t = 0; t < p->n_tensors && shown < 50 && st == MF_OK; t++) {
    const mf_ptensor *x = &p->tensors[t];
    int is_param = x->kind == MF_T_PARAM, is_grad = x->kind == MF_T_GRAD;
    int is_act = mf_schedule_can_offload(p, t);
    if (!is_param && !is_grad && !is_act) continue;
    if (is_act && x->micro != 0) continue; /* one micro-batch speaks for all */
    if (fnmatch(pattern, strip_micro(x->name), 0) != 0) continue;
    shown++;
    int n_alt = is_act ? 3 : 2;
    int cur = is_param ? chosen->d->param[x->param] : is_grad ? chosen->d->grad[x->param] : chosen->d->act[t];
    const char *cur_name = is_param ? mf_param_dec_name((mf_param_dec)cur)
                           : is_grad ? mf_grad_dec_name((mf_grad_dec)cur)
                                     : mf_act_dec_name((mf_act_dec)cur);
    printf("  %-64s %-9s", strip_micro(x->name), cur_name);
    for (int a = 0; a < n_alt; a++) {
      MF_CHECK_GOTO(mf_decisions_copy(chosen->d, d), st, done);
      if (is_param) d->param[x->param] = (uint8_t)a;
      if (is_grad) d->grad[x->param] = (uint8_t)a;
      if (is_act) {
        if (a == MF_ACT_RECOMPUTE && !mf_schedule_can_recompute(p, t)) continue;
        for (int32_t u = 0; u < p->n_tensors; u++) /* every micro-batch's copy */
          if (p->tensors[u].micro >= 0 && strcmp(strip_micro(p->tensors[u].name), strip_micro(x->name)) == 0)
            d->act[u] = (uint8_t)a;
      }
      mf_plan *alt = NULL;
      MF_CHECK_GOTO(mf_plan_evaluate(p, hw, d, chosen->budget, MF_PLAN_CHOSEN, &alt), st, done);
      char arena[32];
      const char *an = is_param ? mf_param_dec_name((mf_param_dec)a)
                       : is_grad ? mf_grad_dec_name((mf_grad_dec)a)
                                 : mf_act_dec_name((mf_act_dec)a);
      printf("  %s %.4fs %s%s", an, alt->sim.step_seconds, mf_format_bytes(alt->s->arena_bytes, arena, sizeof arena),
             alt->fits ? "" : " (over budget)");
      mf_plan_free(alt);
    }
    printf("\n");
  }
  if (shown == 0) printf("  (no weight, gradient or activation matches)\n");
done:
  mf_decisions_free(d);
  return st;
}

int mf_cli_plan(int argc, char **argv) {
  if (mf_cli_wants_help(argc, argv)) {
    printf("%s", k_usage);
    return MF_EXIT_OK;
  }
  const char *path = NULL, *pattern = NULL, *json = NULL, *svg = NULL;
  const char *overrides[256];
  size_t n_over = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--tensor") == 0 || strcmp(a, "--json") == 0 || strcmp(a, "--svg") == 0) {
      if (i + 1 >= argc) return mf_cli_usage_error("plan", "%s needs a value", a);
      if (strcmp(a, "--tensor") == 0)
        pattern = argv[++i];
      else if (strcmp(a, "--json") == 0)
        json = argv[++i];
      else
        svg = argv[++i];
    } else if (strncmp(a, "--", 2) == 0) {
      return mf_cli_usage_error("plan", "unknown option '%s'", a);
    } else if (!path) {
      path = a;
    } else if (strchr(a, '=') && n_over < 256) {
      overrides[n_over++] = a;
    } else {
      return mf_cli_usage_error("plan", "'%s' is not a key=value override", a);
    }
  }
  if (!path) return mf_cli_usage_error("plan", "expected a CONFIG file");

  const double t0 = mf_time_now();
  mf_config *cfg = NULL;
  mf_param_table *t = NULL;
  mf_program *p = NULL;
  mf_decisions *fixed = NULL;
  mf_plan_pins pins = {NULL, NULL, NULL};
  mf_plan *chosen = NULL;
  mf_hwprofile hw;
  mf_status st = MF_OK;
  MF_CHECK_GOTO(mf_config_load(path, overrides, n_over, &cfg), st, done);
  mf_model_spec spec;
  if (cfg->model.has_init)
    spec = cfg->model.init;
  else
    MF_CHECK_GOTO(mf_hf_config_load(cfg->model.path, &spec), st, done);
  const char *profile = mf_plan_profile_path(cfg->hardware.profile);
  MF_CHECK_GOTO(mf_hwprofile_load(profile, &hw), st, done);
  MF_CHECK_GOTO(mf_param_table_build(&spec, &t), st, done);
  double aux = isnan(cfg->train.aux_loss_coef) ? spec.router_aux_loss_coef : cfg->train.aux_loss_coef;
  mf_program_opts po = {cfg->train.micro_batch, cfg->data.seq_len, cfg->train.grad_accum, aux, 0, 0};
  MF_CHECK_GOTO(mf_program_build(t, &po, &p), st, done);
  uint64_t budget = cfg->memory.device_budget;
  if (budget == MF_CONFIG_SIZE_AUTO)
    budget = hw.device_memory > hw.device_reserve ? hw.device_memory - hw.device_reserve : 0;
  MF_CHECK_GOTO(mf_decisions_create(p, &fixed), st, done);
  MF_CHECK_GOTO(mf_plan_pins_create(p, &pins), st, done);
  MF_CHECK_GOTO(mf_plan_apply_overrides(p, &cfg->memory, fixed, &pins), st, done);
  MF_CHECK_GOTO(mf_plan_choose(p, &hw, budget, fixed, cfg->memory.n_overrides ? &pins : NULL, &chosen), st, done);
  const double plan_s = mf_time_now() - t0;

  int64_t total = 0, active = 0;
  mf_model_spec_param_count(&spec, &total, &active);
  char b1[32], b2[32], b3[32], b4[32];
  const int64_t tokens = cfg->train.micro_batch * cfg->data.seq_len * cfg->train.grad_accum;
  printf("plan for %s: %s, %.4gM parameters (%.4gM active), %lld layers, %lld experts top-%lld\n", path,
         mf_family_name(spec.family), (double)total / 1e6, (double)active / 1e6, (long long)spec.layers,
         (long long)spec.experts, (long long)spec.top_k);
  printf("batch: %lld micro-batches x %lld sequences x %lld tokens = %lld tokens per step\n",
         (long long)cfg->train.grad_accum, (long long)cfg->train.micro_batch, (long long)cfg->data.seq_len,
         (long long)tokens);
  printf("device budget %s; hardware profile %s (%s)\n", mf_format_bytes(budget, b1, sizeof b1), profile, hw.name);
  printf("\n  %-24s %10s %10s %10s %10s %9s %9s %9s %9s\n", "plan", "arena", "peak", "H2D/step", "D2H/step",
         "step s", "compute", "exp.xfer", "exp.opt");
  row("chosen", chosen);
  for (int k = MF_PLAN_RESIDENT; k < MF_PLAN_KIND_COUNT_; k++) {
    mf_plan *b = NULL;
    MF_CHECK_GOTO(mf_plan_baseline(p, &hw, (mf_plan_kind)k, budget, &b), st, done);
    row(mf_plan_kind_name((mf_plan_kind)k), b);
    mf_plan_free(b);
  }
  const double w = (double)t->total_numel * 4.0;
  printf("\nchosen: %.4f s/step predicted = %.0f tokens/s; host memory: fp32 weights %s, gradients %s, Adam moments "
         "%s, offloaded activations %s\n",
         chosen->sim.step_seconds, (double)tokens / chosen->sim.step_seconds, mf_format_bytes((uint64_t)w, b1, sizeof b1),
         mf_format_bytes((uint64_t)w, b2, sizeof b2), mf_format_bytes((uint64_t)(2 * w), b3, sizeof b3),
         mf_format_bytes(chosen->s->host_act_bytes, b4, sizeof b4));
  layer_table(p, chosen->d);
  if (pattern) MF_CHECK_GOTO(explain(p, &hw, chosen, pattern), st, done);
  if (json) {
    mf_plan_figures fig = {budget, chosen->s->peak_live_bytes, chosen->s->arena_bytes, chosen->sim.step_seconds};
    MF_CHECK_GOTO(mf_plan_write_json(p, chosen->d, &fig, json), st, done);
    printf("\nplan written to %s\n", json);
  }
  if (svg) {
    MF_CHECK_GOTO(mf_render_svg(chosen, path, svg), st, done);
    printf("\ntimeline written to %s\n", svg);
  }
  printf("\nplanned in %.2f s\n", plan_s);
done:
  mf_plan_free(chosen);
  mf_plan_pins_free(&pins);
  mf_decisions_free(fixed);
  mf_program_free(p);
  mf_param_table_free(t);
  mf_config_free(cfg);
  return st == MF_OK ? MF_EXIT_OK : mf_cli_fail("plan", st);
}
