/*
 * Plans as JSON — writing (reading: plan_io_read.c) — and memory.overrides
 * applied to decisions (plan_io.h).
 *
 * A plan names tensors by their program names: a weight by its parameter name
 * ("model.layers.0.mlp.experts.3.up_proj.weight"), its gradient by the grad
 * tensor's ("grad.model.layers.0..."), an activation with its micro-batch
 * ("mb1.model.layers.0.mlp.experts.act"). The writer streams the text into
 * one buffer (plan_io_json.h) and writes it atomically: a real-size plan has
 * some hundred thousand entries.
 */
#include <ctype.h>
#include <fnmatch.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planner/plan_io_internal.h"
#include "planner/plan_io_json.h"
#include "src/io/json_util.h"

const char *const mf_plan_io_kind_names[MF_PLAN_K_COUNT_] = {"param", "grad", "act"};
const char *const mf_plan_io_kind_words[MF_PLAN_K_COUNT_] = {"resident, stream", "device, stream",
                                                             "keep, offload, recompute"};
static const int kind_n_decisions[MF_PLAN_K_COUNT_] = {2, 2, 3};

const char *mf_plan_io_decision_name(int kind, int dec) {
  if (kind == MF_PLAN_K_PARAM) return mf_param_dec_name((mf_param_dec)dec);
  if (kind == MF_PLAN_K_GRAD) return mf_grad_dec_name((mf_grad_dec)dec);
  return mf_act_dec_name((mf_act_dec)dec);
}

int mf_plan_io_decision_from_word(int kind, const char *w) {
  for (int i = 0; i < kind_n_decisions[kind]; i++)
    if (strcmp(w, mf_plan_io_decision_name(kind, i)) == 0) return i;
  return -1;
}

int mf_plan_io_optim_from_word(const char *w) {
  for (int i = MF_OPTIM_HOST; i <= MF_OPTIM_DEVICE; i++)
    if (strcmp(w, mf_optim_dec_name((mf_optim_dec)i)) == 0) return i;
  return -1;
}

mf_status mf_plan_io_act_options(const mf_program *p, uint8_t **out) {
  MF_CHECK(mf_malloc((size_t)p->n_tensors + 1, "plan activation options", (void **)out));
  mf_status st = mf_schedule_act_options(p, *out);
  if (st != MF_OK) {
    free(*out);
    *out = NULL;
    mf_error_trace(__FILE__, __LINE__, "mf_schedule_act_options(p, *out)");
  }
  return st;
}

int mf_plan_io_kind_of(const mf_program *p, int32_t t) {
  mf_tensor_kind k = p->tensors[t].kind;
  if (k == MF_T_PARAM) return MF_PLAN_K_PARAM;
  if (k == MF_T_GRAD) return MF_PLAN_K_GRAD;
  if ((k == MF_T_ACT || k == MF_T_STAT) && mf_schedule_can_offload(p, t)) return MF_PLAN_K_ACT;
  return -1;
}

const char *mf_plan_io_storage_name(mf_dtype storage) {
  return storage == MF_DTYPE_F32 ? "fp32" : storage == MF_DTYPE_BF16 ? "bf16" : NULL;
}

int mf_plan_io_kernel_ok(const char *w, const char *words) {
  const size_t n = strlen(w);
  for (const char *c = words; n > 0 && *c;) {
    const char *comma = strchr(c, ',');
    const size_t len = comma ? (size_t)(comma - c) : strlen(c);
    if (len == n && strncmp(c, w, n) == 0) return 1;
    c += len;
    while (*c == ',' || *c == ' ') c++;
  }
  return 0;
}

/* --------------------------------------------------------------- writing */

/* Refuses decisions the program does not allow, so every written plan reads
 * back (opt: mf_plan_io_act_options), and names that are not UTF-8. */
static mf_status check_decisions(const mf_program *p, const mf_decisions *d, const uint8_t *opt) {
  for (int32_t i = 0; i < d->n_params; i++) {
    if (d->param[i] > MF_PARAM_STREAM || d->grad[i] > MF_GRAD_STREAM || d->optim[i] > MF_OPTIM_DEVICE)
      return MF_ERR(MF_ERR_INVALID_ARG, "plan: parameter %s has decision %d/%d/%d, out of range",
                    p->params->params[i].name, d->param[i], d->grad[i], d->optim[i]);
    if (d->optim[i] == MF_OPTIM_DEVICE && p->forward_only)
      return MF_ERR(MF_ERR_INVALID_ARG,
                    "plan: parameter %s has its optimizer on the device in a forward-only program",
                    p->params->params[i].name);
    if (d->optim[i] == MF_OPTIM_DEVICE && (d->param[i] != MF_PARAM_RESIDENT || d->grad[i] != MF_GRAD_DEVICE))
      return MF_ERR(
          MF_ERR_INVALID_ARG,
          "plan: parameter %s has its optimizer on the device but its %s streamed (the optimizer on "
          "the device needs params: resident, grads: device)",
          p->params->params[i].name, d->param[i] != MF_PARAM_RESIDENT ? "weights" : "gradient");
  }
  for (int32_t t = 0; t < d->n_tensors; t++) {
    uint8_t a = d->act[t];
    if (mf_plan_io_kind_of(p, t) >= 0 && !mf_pj_utf8_valid(p->tensors[t].name)) {
      char q[128];
      return MF_ERR(MF_ERR_INVALID_ARG, "plan: tensor name '%s' is not UTF-8",
                    mf_io_json_printable(p->tensors[t].name, q, sizeof q));
    }
    if (a == MF_ACT_KEEP) continue;
    if (a > MF_ACT_RECOMPUTE || mf_plan_io_kind_of(p, t) != MF_PLAN_K_ACT ||
        (a == MF_ACT_RECOMPUTE && !(opt[t] & MF_PLAN_ACT_CAN_RECOMPUTE)))
      return MF_ERR(MF_ERR_INVALID_ARG,
                    "plan: tensor %s has activation decision %d, which the program does not allow",
                    p->tensors[t].name, a);
  }
  return MF_OK;
}

static void put_str(mf_pj_writer *w, const char *key, const char *s) {
  mf_pj_key(w, key);
  mf_pj_put_string(&w->out, s);
}

static void put_int(mf_pj_writer *w, const char *key, int64_t v) {
  mf_pj_key(w, key);
  mf_pj_put_i64(&w->out, v);
}

/* Everything before "tensors", in the documented order. */
static void put_head(mf_pj_writer *w, const mf_program *p, const mf_plan_figures *f) {
  const mf_model_spec *s = &p->spec;
  put_str(w, "format", MF_PLAN_FORMAT);
  put_int(w, "version", MF_PLAN_VERSION);
  mf_pj_key(w, "model");
  mf_pj_open(w, '{');
  put_str(w, "family", mf_family_name(s->family));
  put_int(w, "layers", s->layers);
  put_int(w, "hidden", s->hidden);
  put_int(w, "heads", s->heads);
  put_int(w, "kv_heads", s->kv_heads);
  put_int(w, "experts", s->experts);
  put_int(w, "top_k", s->top_k);
  put_int(w, "expert_ffn", s->expert_ffn);
  put_int(w, "vocab", s->vocab);
  mf_pj_close(w, '}');
  mf_pj_key(w, "batch");
  mf_pj_open(w, '{');
  put_int(w, "micro_batch", p->B);
  put_int(w, "seq_len", p->S);
  put_int(w, "grad_accum", p->G);
  put_str(w, "order", mf_program_order_name(p->order));
  put_str(w, "storage", mf_plan_io_storage_name(p->storage));
  mf_pj_close(w, '}');
  put_int(w, "device_budget_bytes", (int64_t)f->device_budget_bytes);
  put_int(w, "peak_device_bytes", (int64_t)f->peak_device_bytes);
  put_int(w, "arena_bytes", (int64_t)f->arena_bytes);
  mf_pj_key(w, "predicted_step_seconds");
  mf_pj_put_real(&w->out, f->predicted_step_seconds);
  put_int(w, "staging_bytes", (int64_t)f->staging_bytes);
  put_int(w, "staging_slab_limit_bytes", (int64_t)f->staging_slab_limit_bytes);
  put_int(w, "staging_pool_bytes", (int64_t)f->staging_pool_bytes);
  put_int(w, "host_bytes", (int64_t)f->host_bytes);
  put_int(w, "persist_bytes", (int64_t)f->persist_bytes);
  put_int(w, "device_backend_bytes", (int64_t)f->device_backend_bytes);
  put_int(w, "pinned_home_bytes", (int64_t)f->pinned_home_bytes);
  mf_pj_key(w, "kernels");
  mf_pj_open(w, '{');
  put_str(w, "expert_gemm", f->expert_gemm);
  put_str(w, "attention", f->attention);
  mf_pj_close(w, '}');
}

/* optim: the parameter's optimizer placement on a "param" entry, -1 on the others. */
static void put_entry(mf_pj_writer *w, const mf_ptensor *x, int kind, int dec, int optim) {
  mf_pj_elem(w);
  mf_pj_open(w, '{');
  put_str(w, "name", x->name);
  put_str(w, "kind", mf_plan_io_kind_names[kind]);
  put_int(w, "bytes", (int64_t)x->bytes);
  put_str(w, "decision", mf_plan_io_decision_name(kind, dec));
  if (optim >= 0) put_str(w, "optimizer", mf_optim_dec_name((mf_optim_dec)optim));
  mf_pj_close(w, '}');
}

mf_status mf_plan_write_json(const mf_program *p, const mf_decisions *d, const mf_plan_figures *f,
                             const char *path) {
  if (!p || !d || !f || !path) return MF_ERR(MF_ERR_INVALID_ARG, "mf_plan_write_json: NULL argument");
  if (d->n_params != (int32_t)p->params->n || d->n_tensors != p->n_tensors)
    return MF_ERR(MF_ERR_INVALID_ARG, "mf_plan_write_json: %s: decisions are for another program", path);
  const uint64_t big = (uint64_t)INT64_MAX;
  if (f->device_budget_bytes > big || f->peak_device_bytes > big || f->arena_bytes > big ||
      f->staging_bytes > big || f->staging_slab_limit_bytes > big || f->staging_pool_bytes > big ||
      f->host_bytes > big || f->persist_bytes > big || f->device_backend_bytes > big ||
      f->pinned_home_bytes > big || !isfinite(f->predicted_step_seconds) || f->predicted_step_seconds < 0)
    return MF_ERR(MF_ERR_INVALID_ARG, "mf_plan_write_json: %s: figures out of range", path);
  if (!mf_plan_io_kernel_ok(f->expert_gemm, MF_PLAN_EXPERT_GEMM_WORDS) ||
      !mf_plan_io_kernel_ok(f->attention, MF_PLAN_ATTENTION_WORDS))
    return MF_ERR(MF_ERR_INVALID_ARG, "mf_plan_write_json: %s: kernels '%s' and '%s' are not %s and %s", path,
                  f->expert_gemm, f->attention, MF_PLAN_EXPERT_GEMM_WORDS, MF_PLAN_ATTENTION_WORDS);
  if (!mf_plan_io_storage_name(p->storage))
    return MF_ERR(MF_ERR_INVALID_ARG, "mf_plan_write_json: %s: device storage %s is neither fp32 nor bf16",
                  path, mf_dtype_name(p->storage));
  uint8_t *opt = NULL;
  MF_CHECK(mf_plan_io_act_options(p, &opt));
  mf_status chk = check_decisions(p, d, opt);
  free(opt);
  MF_CHECK(chk);

  mf_pj_writer w;
  memset(&w, 0, sizeof w);
  mf_pj_open(&w, '{');
  put_head(&w, p, f);
  mf_pj_key(&w, "tensors");
  mf_pj_open(&w, '[');
  for (int32_t i = 0; i < d->n_params; i++)
    put_entry(&w, &p->tensors[p->param_tensor[i]], MF_PLAN_K_PARAM, d->param[i], d->optim[i]);
  if (!p->forward_only)
    for (int32_t i = 0; i < d->n_params; i++)
      if (p->grad_tensor[i] >= 0) /* else frozen */
        put_entry(&w, &p->tensors[p->grad_tensor[i]], MF_PLAN_K_GRAD, d->grad[i], -1);
  for (int32_t t = 0; t < p->n_tensors; t++)
    if (mf_plan_io_kind_of(p, t) == MF_PLAN_K_ACT)
      put_entry(&w, &p->tensors[t], MF_PLAN_K_ACT, d->act[t], -1);
  mf_pj_close(&w, ']');
  mf_pj_close(&w, '}');
  mf_pj_put(&w.out, "\n", 1);
  if (w.out.oom) {
    free(w.out.buf);
    return MF_ERR(MF_ERR_OUT_OF_MEMORY, "%s: out of memory building the plan's JSON", path);
  }
  mf_status st = mf_write_file_atomic(path, w.out.buf, w.out.n);
  free(w.out.buf);
  if (st != MF_OK) mf_error_trace(__FILE__, __LINE__, "mf_write_file_atomic(path, w.out.buf, w.out.n)");
  return st;
}

/* ---------------------------------------------------------------- pins */

mf_status mf_plan_pins_create(const mf_program *p, mf_plan_pins *pins) {
  if (!p || !pins) return MF_ERR(MF_ERR_INVALID_ARG, "mf_plan_pins_create: NULL argument");
  memset(pins, 0, sizeof *pins);
  size_t np = (size_t)p->params->n + 1, nt = (size_t)p->n_tensors + 1;
  pins->param = (uint8_t *)calloc(np, 1);
  pins->grad = (uint8_t *)calloc(np, 1);
  pins->act = (uint8_t *)calloc(nt, 1);
  pins->optim = (uint8_t *)calloc(np, 1);
  if (!pins->param || !pins->grad || !pins->act || !pins->optim) {
    mf_plan_pins_free(pins);
    return MF_ERR(MF_ERR_OUT_OF_MEMORY, "plan pins: out of memory");
  }
  return MF_OK;
}

void mf_plan_pins_free(mf_plan_pins *pins) {
  if (!pins) return;
  free(pins->param);
  free(pins->grad);
  free(pins->act);
  free(pins->optim);
  memset(pins, 0, sizeof *pins);
}

/* -------------------------------------------------------------- overrides */

/* "mb12.model.layers..." -> "model.layers..." */
static const char *without_micro(const char *name) {
  if (name[0] != 'm' || name[1] != 'b' || !isdigit((unsigned char)name[2])) return name;
  const char *s = name + 2;
  while (isdigit((unsigned char)*s)) s++;
  return *s == '.' ? s + 1 : name;
}

static int matches(const char *pattern, const char *name) {
  return fnmatch(pattern, name, 0) == 0;
}

typedef struct scratch {
  uint8_t *param, *grad, *act, *optim;     /* decisions being built */
  uint8_t *pparam, *pgrad, *pact, *poptim; /* pins being built */
  uint8_t *opt; /* mf_plan_io_act_options, made when an override first recomputes */
} scratch;

#define OV_ERR(st, ...) ov_err((st), where, k, __VA_ARGS__)
static mf_status ov_err(mf_status s, const char *where, size_t k, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static mf_status ov_err(mf_status s, const char *where, size_t k, const char *fmt, ...) {
  char msg[1536];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return MF_ERR(s, "%s: memory.overrides[%zu]: %s", where, k, msg);
}

/* Where the pin on parameter i's weights (grads 0) or gradient (grads 1)
 * came from, for a message: the last override before k that decided it (every
 * one before k applied cleanly, so that one set the pinned value), or the
 * caller's pins. */
static void pin_origin(const mf_program *p, const mf_config_memory *mem, size_t k, int64_t i, int grads,
                       char *out, size_t n) {
  for (size_t j = k; j-- > 0;) {
    const mf_config_mem_override *o = &mem->overrides[j];
    if (!(grads ? o->grads : o->params) || !o->match || !matches(o->match, p->params->params[i].name))
      continue;
    const char *w = o->where ? o->where : "config", *here = mem->overrides[k].where;
    if (here && strcmp(w, here) == 0) /* the same place (a command-line list): the index says it */
      snprintf(out, n, "memory.overrides[%zu]", j);
    else
      snprintf(out, n, "memory.overrides[%zu] (%s)", j, w);
    return;
  }
  snprintf(out, n, "a pin made before memory.overrides");
}

static mf_status apply_one(const mf_program *p, const mf_config_memory *mem, size_t k, scratch *x) {
  const mf_config_mem_override *o = &mem->overrides[k];
  const char *where = o->where ? o->where : "config";
  char q[128], q2[128];
  if (!o->match || !*o->match) return OV_ERR(MF_ERR_CONFIG, "missing 'match' (the tensor-name pattern)");
  const char *pat = o->match;
  mf_io_json_printable(pat, q, sizeof q);
  int pd = -1, gd = -1, ad = -1, od = -1;
  if (o->params && (pd = mf_plan_io_decision_from_word(MF_PLAN_K_PARAM, o->params)) < 0)
    return OV_ERR(MF_ERR_CONFIG, "params: '%s' is not a decision for params (resident, stream)%s",
                  mf_io_json_printable(o->params, q2, sizeof q2),
                  strcmp(o->params, "host") == 0 ? "; a weight kept at home is 'stream'" : "");
  if (o->grads && (gd = mf_plan_io_decision_from_word(MF_PLAN_K_GRAD, o->grads)) < 0)
    return OV_ERR(MF_ERR_CONFIG, "grads: '%s' is not a decision for grads (device, stream)%s",
                  mf_io_json_printable(o->grads, q2, sizeof q2),
                  strcmp(o->grads, "host") == 0 ? "; a gradient sent home is 'stream'" : "");
  if (o->activations && (ad = mf_plan_io_decision_from_word(MF_PLAN_K_ACT, o->activations)) < 0)
    return OV_ERR(MF_ERR_CONFIG,
                  "activations: '%s' is not a decision for activations (keep, offload, recompute)",
                  mf_io_json_printable(o->activations, q2, sizeof q2));
  if (o->optimizer && (od = mf_plan_io_optim_from_word(o->optimizer)) < 0)
    return OV_ERR(MF_ERR_CONFIG, "optimizer: '%s' is not an optimizer placement (" MF_PLAN_OPTIM_WORDS ")",
                  mf_io_json_printable(o->optimizer, q2, sizeof q2));
  /* A forward-only program has no optimizer: the placement is the training
   * step's, so it changes nothing here (its words are still checked). */
  const int optim = od >= 0 && !p->forward_only;
  if (optim && od == MF_OPTIM_DEVICE) {
    if (pd == MF_PARAM_STREAM)
      return OV_ERR(MF_ERR_CONFIG,
                    "optimizer: device needs the weights resident, but this override says params: stream "
                    "(the optimizer on the device updates weights that stay on the device)");
    if (gd == MF_GRAD_STREAM)
      return OV_ERR(MF_ERR_CONFIG,
                    "optimizer: device needs the gradients on the device, but this override says grads: "
                    "stream");
    for (int64_t i = 0; i < p->params->n; i++) {
      if (!matches(pat, p->params->params[i].name) || p->params->params[i].frozen) continue;
      const int weights = x->pparam[i] && x->param[i] == MF_PARAM_STREAM;
      if (!weights && !(x->pgrad[i] && x->grad[i] == MF_GRAD_STREAM)) continue;
      char from[600];
      pin_origin(p, mem, k, i, !weights, from, sizeof from);
      return OV_ERR(MF_ERR_CONFIG,
                    "optimizer: device for %s, which '%s' matches: %s pins its %s to stream, and the "
                    "optimizer on the device needs %s on the device (drop that pin, or optimizer: host)",
                    p->params->params[i].name, q, from, weights ? "weights" : "gradient",
                    weights ? "them" : "it");
    }
  }
  if (pd >= 0 || gd >= 0 || od >= 0) {
    int64_t hit = 0, hit_frozen = 0;
    for (int64_t i = 0; i < p->params->n; i++) {
      if (!matches(pat, p->params->params[i].name)) continue;
      hit++;
      if (p->params->params[i]
              .frozen) { /* LoRA's base, a router's bias: its weights only (no gradient, no optimizer) */
        hit_frozen++;
        if (pd >= 0) x->param[i] = (uint8_t)pd, x->pparam[i] = 1;
        continue;
      }
      if (pd >= 0) x->param[i] = (uint8_t)pd, x->pparam[i] = 1;
      if (gd >= 0) x->grad[i] = (uint8_t)gd, x->pgrad[i] = 1;
      if (optim) x->optim[i] = (uint8_t)od, x->poptim[i] = 1;
      if (optim && od == MF_OPTIM_DEVICE) { /* what the optimizer on the device needs, pinned with it */
        x->param[i] = MF_PARAM_RESIDENT, x->pparam[i] = 1;
        x->grad[i] = MF_GRAD_DEVICE, x->pgrad[i] = 1;
      }
      /* Weights or gradient streamed (this entry winning over an earlier
       * optimizer: device, or over the base decisions): the host updates. */
      if (x->param[i] != MF_PARAM_RESIDENT || x->grad[i] != MF_GRAD_DEVICE) x->optim[i] = MF_OPTIM_HOST;
    }
    if (!hit) {
      int64_t ex = p->params->n > 1 ? 1 : 0;
      for (int64_t i = p->params->n - 1; i >= 0; i--)
        if (p->params->params[i].expert >= 0) ex = i;
      return OV_ERR(MF_ERR_CONFIG, "match '%s' matches no parameter (parameter names look like '%s')", q,
                    p->params->params[ex].name);
    }
    if (pd < 0 && hit == hit_frozen && !p->forward_only)
      return OV_ERR(
          MF_ERR_CONFIG,
          "'%s' matches only frozen weights (train.lora's base, or a buffer of the checkpoint such as "
          "a router's e_score_correction_bias: not trained), which have no gradient and no optimizer; "
          "give them params: resident or stream",
          q);
  }
  if (ad == MF_ACT_RECOMPUTE && !x->opt) MF_CHECK(mf_plan_io_act_options(p, &x->opt));
  if (ad >= 0) {
    int64_t hit = 0;
    for (int32_t t = 0; t < p->n_tensors; t++) {
      if (mf_plan_io_kind_of(p, t) != MF_PLAN_K_ACT) continue;
      const char *name = p->tensors[t].name;
      if (!matches(pat, without_micro(name)) && !matches(pat, name)) continue;
      if (ad == MF_ACT_RECOMPUTE && !(x->opt[t] & MF_PLAN_ACT_CAN_RECOMPUTE))
        return OV_ERR(MF_ERR_CONFIG,
                      "activations: recompute is impossible for %s, which '%s' matches (its forward "
                      "ops cannot run again before the backward); keep or offload it",
                      name, q);
      hit++;
      x->act[t] = (uint8_t)ad, x->pact[t] = 1;
    }
    if (!hit)
      return OV_ERR(MF_ERR_CONFIG,
                    "match '%s' matches no activation that can be offloaded or recomputed "
                    "(names look like 'model.layers.0.mlp.experts.act', micro-batch prefix 'mb0.' optional)",
                    q);
  }
  return MF_OK;
}

mf_status mf_plan_apply_overrides(const mf_program *p, const mf_config_memory *mem, mf_decisions *d,
                                  mf_plan_pins *pins) {
  if (!p || !d) return MF_ERR(MF_ERR_INVALID_ARG, "mf_plan_apply_overrides: NULL argument");
  if (d->n_params != (int32_t)p->params->n || d->n_tensors != p->n_tensors)
    return MF_ERR(MF_ERR_INVALID_ARG, "mf_plan_apply_overrides: decisions are for another program");
  if (pins && (!pins->param || !pins->grad || !pins->act || !pins->optim))
    return MF_ERR(MF_ERR_INVALID_ARG, "mf_plan_apply_overrides: pins not created");
  if (!mem || mem->n_overrides == 0) return MF_OK;
  /* Built on copies, so a failing override leaves decisions and pins as they were. */
  const size_t np = (size_t)d->n_params, nt = (size_t)d->n_tensors, half = 3 * np + nt;
  uint8_t *buf = NULL;
  MF_CHECK(mf_calloc(2 * half + 1, 1, "memory.overrides", (void **)&buf));
  scratch x = {buf,        buf + np,        buf + 2 * np,        buf + 2 * np + nt,
               buf + half, buf + half + np, buf + half + 2 * np, buf + half + 2 * np + nt,
               NULL};
  memcpy(x.param, d->param, np), memcpy(x.grad, d->grad, np), memcpy(x.act, d->act, nt);
  memcpy(x.optim, d->optim, np);
  if (pins) {
    memcpy(x.pparam, pins->param, np), memcpy(x.pgrad, pins->grad, np), memcpy(x.pact, pins->act, nt);
    memcpy(x.poptim, pins->optim, np);
  }
  mf_status st = MF_OK;
  for (size_t k = 0; k < mem->n_overrides && st == MF_OK; k++) st = apply_one(p, mem, k, &x);
  if (st == MF_OK) {
    memcpy(d->param, x.param, np), memcpy(d->grad, x.grad, np), memcpy(d->act, x.act, nt);
    memcpy(d->optim, x.optim, np);
    if (pins) {
      memcpy(pins->param, x.pparam, np), memcpy(pins->grad, x.pgrad, np), memcpy(pins->act, x.pact, nt);
      memcpy(pins->optim, x.poptim, np);
    }
  } else {
    mf_error_trace(__FILE__, __LINE__, "apply_one(p, mem, k, &x)");
  }
  free(x.opt);
  free(buf);
  return st;
}
