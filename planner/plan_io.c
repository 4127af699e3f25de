/*
 * Plans as JSON, and memory.overrides applied to decisions (plan_io.h).
 *
 * A plan names tensors by their program names: a weight by its parameter name
 * ("model.layers.0.mlp.experts.3.up_proj.weight"), its gradient by the grad
 * tensor's ("grad.model.layers.0..."), an activation with its micro-batch
 * ("mb1.model.layers.0.mlp.experts.act"). Reading is strict: a plan is data a
 * person may edit, so every key is checked, unknown keys included, and the
 * decisions land in the caller's arrays only when the whole file is good.
 */
#include "planner/plan_io.h"
#include "src/io/json_util.h"

#include <ctype.h>
#include <fnmatch.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PLAN_FORMAT "moefit-plan"
#define PLAN_VERSION 3 /* 3: optimizer placement; 2: staging and host figures; 1, 2 still read */
#define PLAN_MAX_BYTES ((size_t)256 << 20)
/* A plan nests three deep (top, tensors, entry); anything far deeper is not a
 * plan, and is refused before jansson recurses into it. */
#define PLAN_MAX_DEPTH 16
#define PLAN_MISSING_LISTED 5

enum { K_PARAM = 0, K_GRAD, K_ACT, K_COUNT_ };
static const char *const kind_names[K_COUNT_] = {"param", "grad", "act"};
static const char *const kind_words[K_COUNT_] = {"resident, stream", "device, stream",
                                                 "keep, offload, recompute"};
static const int kind_n_decisions[K_COUNT_] = {2, 2, 3};
#define OPTIM_WORDS "host, device"

static const char *decision_name(int kind, int dec) {
  if (kind == K_PARAM) return mf_param_dec_name((mf_param_dec)dec);
  if (kind == K_GRAD) return mf_grad_dec_name((mf_grad_dec)dec);
  return mf_act_dec_name((mf_act_dec)dec);
}

static int decision_from_word(int kind, const char *w) {
  for (int i = 0; i < kind_n_decisions[kind]; i++)
    if (strcmp(w, decision_name(kind, i)) == 0) return i;
  return -1;
}

/* "host" / "device" -> mf_optim_dec, or -1. */
static int optim_from_word(const char *w) {
  for (int i = MF_OPTIM_HOST; i <= MF_OPTIM_DEVICE; i++)
    if (strcmp(w, mf_optim_dec_name((mf_optim_dec)i)) == 0) return i;
  return -1;
}

/* mf_schedule_act_options for every tensor, in one pass over the program
 * (mf_schedule_can_recompute indexes the whole program on each call: once per
 * activation, that made writing and reading a real-size plan take seconds).
 * out[t] & ACT_CAN_RECOMPUTE: t may be recomputed. Free with free(). */
#define ACT_CAN_RECOMPUTE 2
static mf_status act_options(const mf_program *p, uint8_t **out) {
  MF_CHECK(mf_malloc((size_t)p->n_tensors + 1, "plan activation options", (void **)out));
  mf_status st = mf_schedule_act_options(p, *out);
  if (st != MF_OK) {
    free(*out);
    *out = NULL;
    mf_error_trace(__FILE__, __LINE__, "mf_schedule_act_options(p, *out)");
  }
  return st;
}

/* What a plan calls program tensor t, or -1 when a plan says nothing about it. */
static int plan_kind(const mf_program *p, int32_t t) {
  mf_tensor_kind k = p->tensors[t].kind;
  if (k == MF_T_PARAM) return K_PARAM;
  if (k == MF_T_GRAD) return K_GRAD;
  if ((k == MF_T_ACT || k == MF_T_STAT) && mf_schedule_can_offload(p, t)) return K_ACT;
  return -1;
}

/* --------------------------------------------------------------- writing */

typedef struct builder {
  int ok; /* 0 once an allocation failed (jansson returns NULL / -1) */
} builder;

static void put(builder *b, json_t *o, const char *key, json_t *v) {
  if (!v || json_object_set_new(o, key, v) != 0) b->ok = 0;
}

/* optim: the parameter's optimizer placement on a "param" entry, -1 on the others. */
static void put_entry(builder *b, json_t *arr, const mf_ptensor *x, int kind, int dec, int optim) {
  json_t *e = json_object();
  if (!e) {
    b->ok = 0;
    return;
  }
  put(b, e, "name", json_string(x->name));
  put(b, e, "kind", json_string(kind_names[kind]));
  put(b, e, "bytes", json_integer((json_int_t)x->bytes));
  put(b, e, "decision", json_string(decision_name(kind, dec)));
  if (optim >= 0) put(b, e, "optimizer", json_string(mf_optim_dec_name((mf_optim_dec)optim)));
  if (json_array_append_new(arr, e) != 0) b->ok = 0;
}

/* Refuses decisions the program does not allow, so every written plan reads back. */
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
    if (a == MF_ACT_KEEP) continue;
    if (a > MF_ACT_RECOMPUTE || plan_kind(p, t) != K_ACT ||
        (a == MF_ACT_RECOMPUTE && !(opt[t] & ACT_CAN_RECOMPUTE)))
      return MF_ERR(MF_ERR_INVALID_ARG,
                    "plan: tensor %s has activation decision %d, which the program does not allow",
                    p->tensors[t].name, a);
  }
  return MF_OK;
}

mf_status mf_plan_write_json(const mf_program *p, const mf_decisions *d, const mf_plan_figures *f,
                             const char *path) {
  if (!p || !d || !f || !path) return MF_ERR(MF_ERR_INVALID_ARG, "mf_plan_write_json: NULL argument");
  if (d->n_params != (int32_t)p->params->n || d->n_tensors != p->n_tensors)
    return MF_ERR(MF_ERR_INVALID_ARG, "mf_plan_write_json: %s: decisions are for another program", path);
  const uint64_t big = (uint64_t)INT64_MAX;
  if (f->device_budget_bytes > big || f->peak_device_bytes > big || f->arena_bytes > big ||
      f->staging_bytes > big || f->staging_slab_limit_bytes > big || f->staging_pool_bytes > big ||
      f->host_bytes > big || f->persist_bytes > big || !isfinite(f->predicted_step_seconds) ||
      f->predicted_step_seconds < 0)
    return MF_ERR(MF_ERR_INVALID_ARG, "mf_plan_write_json: %s: figures out of range", path);
  uint8_t *opt = NULL;
  MF_CHECK(act_options(p, &opt));
  mf_status chk = check_decisions(p, d, opt);
  free(opt);
  MF_CHECK(chk);

  const mf_model_spec *s = &p->spec;
  builder b = {1};
  json_t *root = json_object(), *model = json_object(), *batch = json_object(), *tensors = json_array();
  if (!root || !model || !batch || !tensors) b.ok = 0;
  if (b.ok) {
    put(&b, root, "format", json_string(PLAN_FORMAT));
    put(&b, root, "version", json_integer(PLAN_VERSION));
    put(&b, model, "family", json_string(mf_family_name(s->family)));
    put(&b, model, "layers", json_integer(s->layers));
    put(&b, model, "hidden", json_integer(s->hidden));
    put(&b, model, "heads", json_integer(s->heads));
    put(&b, model, "kv_heads", json_integer(s->kv_heads));
    put(&b, model, "experts", json_integer(s->experts));
    put(&b, model, "top_k", json_integer(s->top_k));
    put(&b, model, "expert_ffn", json_integer(s->expert_ffn));
    put(&b, model, "vocab", json_integer(s->vocab));
    put(&b, root, "model", model);
    put(&b, batch, "micro_batch", json_integer(p->B));
    put(&b, batch, "seq_len", json_integer(p->S));
    put(&b, batch, "grad_accum", json_integer(p->G));
    put(&b, batch, "order", json_string(mf_program_order_name(p->order)));
    put(&b, root, "batch", batch);
    model = batch = NULL; /* owned by root now */
    put(&b, root, "device_budget_bytes", json_integer((json_int_t)f->device_budget_bytes));
    put(&b, root, "peak_device_bytes", json_integer((json_int_t)f->peak_device_bytes));
    put(&b, root, "arena_bytes", json_integer((json_int_t)f->arena_bytes));
    put(&b, root, "predicted_step_seconds", json_real(f->predicted_step_seconds));
    put(&b, root, "staging_bytes", json_integer((json_int_t)f->staging_bytes));
    put(&b, root, "staging_slab_limit_bytes", json_integer((json_int_t)f->staging_slab_limit_bytes));
    put(&b, root, "staging_pool_bytes", json_integer((json_int_t)f->staging_pool_bytes));
    put(&b, root, "host_bytes", json_integer((json_int_t)f->host_bytes));
    put(&b, root, "persist_bytes", json_integer((json_int_t)f->persist_bytes));
    for (int32_t i = 0; i < d->n_params; i++)
      put_entry(&b, tensors, &p->tensors[p->param_tensor[i]], K_PARAM, d->param[i], d->optim[i]);
    if (!p->forward_only)
      for (int32_t i = 0; i < d->n_params; i++)
        put_entry(&b, tensors, &p->tensors[p->grad_tensor[i]], K_GRAD, d->grad[i], -1);
    for (int32_t t = 0; t < p->n_tensors; t++)
      if (plan_kind(p, t) == K_ACT) put_entry(&b, tensors, &p->tensors[t], K_ACT, d->act[t], -1);
    put(&b, root, "tensors", tensors);
    tensors = NULL;
  }
  json_decref(model);
  json_decref(batch);
  json_decref(tensors);
  char *text = b.ok ? json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
  json_decref(root);
  if (!text) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "%s: out of memory building the plan's JSON", path);
  size_t len = strlen(text);
  text[len] = '\n'; /* json_dumps leaves no final newline; its NUL becomes one */
  mf_status st = mf_write_file_atomic(path, text, len + 1);
  free(text);
  if (st != MF_OK) mf_error_trace(__FILE__, __LINE__, "mf_write_file_atomic(path, text, len + 1)");
  return st;
}

/* --------------------------------------------------------------- reading */

typedef struct reader {
  const char *path;
  const mf_program *p;
  int32_t *slot; /* open-addressing table of tensor ids by name, -1 empty */
  uint32_t mask;
  uint8_t *opt; /* act_options */
} reader;

/* "<file>: <place>: <fault>" */
static mf_status rerr(const reader *r, mf_status s, const char *place, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static mf_status rerr(const reader *r, mf_status s, const char *place, const char *fmt, ...) {
  char msg[1536];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return MF_ERR(s, "%s: %s: %s", r->path, place, msg);
}

static uint32_t hash_name(const char *s) {
  uint32_t h = 2166136261u;
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 16777619u;
  return h;
}

static mf_status index_names(reader *r) {
  uint32_t cap = 16;
  while (cap < 2u * (uint32_t)r->p->n_tensors) cap *= 2;
  MF_CHECK(mf_malloc(cap * sizeof *r->slot, "plan name index", (void **)&r->slot));
  memset(r->slot, 0xff, cap * sizeof *r->slot);
  r->mask = cap - 1;
  for (int32_t t = 0; t < r->p->n_tensors; t++) {
    uint32_t h = hash_name(r->p->tensors[t].name) & r->mask;
    while (r->slot[h] >= 0) h = (h + 1) & r->mask;
    r->slot[h] = t;
  }
  return MF_OK;
}

static int32_t find_tensor(const reader *r, const char *name) {
  for (uint32_t h = hash_name(name) & r->mask; r->slot[h] >= 0; h = (h + 1) & r->mask)
    if (strcmp(r->p->tensors[r->slot[h]].name, name) == 0) return r->slot[h];
  return -1;
}

static mf_status only_keys(const reader *r, const json_t *o, const char *place, const char *const *names,
                           int n) {
  return mf_io_json_only_keys(r->path, o, place, names, n);
}

static mf_status get(const reader *r, const json_t *o, const char *place, const char *key, json_t **out) {
  return mf_io_json_get(r->path, o, place, key, out);
}

static mf_status get_int(const reader *r, const json_t *o, const char *sect, const char *key, int64_t *out) {
  char place[96];
  snprintf(place, sizeof place, "%s%s%s", sect, *sect ? "." : "", key);
  json_t *v;
  MF_CHECK(get(r, o, *sect ? sect : "(top level)", key, &v));
  return mf_io_json_nonneg(r->path, v, place, out);
}

/* model.* and batch.*: the plan's shape must be this program's. */
static mf_status check_shape(const reader *r, const json_t *root, int64_t version) {
  const mf_program *p = r->p;
  const mf_model_spec *s = &p->spec;
  static const char *const mkeys[] = {"family",  "layers", "hidden",     "heads", "kv_heads",
                                      "experts", "top_k",  "expert_ffn", "vocab"};
  static const char *const bkeys[] = {"micro_batch", "seq_len", "grad_accum"};
  const int64_t mvals[] = {0,          s->layers, s->hidden,     s->heads, s->kv_heads,
                           s->experts, s->top_k,  s->expert_ffn, s->vocab};
  const int64_t bvals[] = {p->B, p->S, p->G};
  char q[128];
  json_t *batch;
  MF_CHECK(mf_io_json_check_model(r->path, root, s, mkeys, mvals, 9, "the plan was made for",
                                  "the plan was made for"));
  MF_CHECK(get(r, root, "(top level)", "batch", &batch));
  if (!json_is_object(batch))
    return rerr(r, MF_ERR_FORMAT, "batch", "expected an object, got %s", mf_io_json_kind(batch, 0));
  static const char *const bkeys2[] = {"micro_batch", "seq_len", "grad_accum", "order"};
  MF_CHECK(only_keys(r, batch, "batch", version >= 2 ? bkeys2 : bkeys, version >= 2 ? 4 : 3));
  /* The micro-batch order (version 2; a version-1 plan is micro-batch-major). */
  mf_program_order order = MF_ORDER_MICRO_MAJOR;
  if (version >= 2) {
    json_t *o;
    MF_CHECK(get(r, batch, "batch", "order", &o));
    if (!json_is_string(o))
      return rerr(r, MF_ERR_FORMAT, "batch.order", "expected \"%s\" or \"%s\", got %s",
                  mf_program_order_name(MF_ORDER_MICRO_MAJOR), mf_program_order_name(MF_ORDER_LAYER_MAJOR),
                  mf_io_json_kind(o, 0));
    if (strcmp(json_string_value(o), mf_program_order_name(MF_ORDER_LAYER_MAJOR)) == 0)
      order = MF_ORDER_LAYER_MAJOR;
    else if (strcmp(json_string_value(o), mf_program_order_name(MF_ORDER_MICRO_MAJOR)) != 0)
      return rerr(r, MF_ERR_FORMAT, "batch.order", "expected \"%s\" or \"%s\", got '%s'",
                  mf_program_order_name(MF_ORDER_MICRO_MAJOR), mf_program_order_name(MF_ORDER_LAYER_MAJOR),
                  mf_io_json_printable(json_string_value(o), q, sizeof q));
  }
  if (order != p->order)
    return rerr(r, MF_ERR_CONFIG, "batch.order", "the plan was made for the %s order, the program is %s",
                mf_program_order_name(order), mf_program_order_name(p->order));
  for (int i = 0; i < 3; i++) {
    int64_t v;
    char place[64];
    snprintf(place, sizeof place, "batch.%s", bkeys[i]);
    MF_CHECK(get_int(r, batch, "batch", bkeys[i], &v));
    if (v != bvals[i])
      return rerr(r, MF_ERR_CONFIG, place, "the plan was made for %s %lld, the config has %lld", bkeys[i],
                  (long long)v, (long long)bvals[i]);
  }
  return MF_OK;
}

static const char *const v2_figures[] = {"staging_bytes", "staging_slab_limit_bytes", "staging_pool_bytes",
                                         "host_bytes"};

static mf_status read_figures(const reader *r, const json_t *root, int64_t version, mf_plan_figures *f) {
  int64_t v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  MF_CHECK(get_int(r, root, "", "device_budget_bytes", &v[0]));
  MF_CHECK(get_int(r, root, "", "peak_device_bytes", &v[1]));
  MF_CHECK(get_int(r, root, "", "arena_bytes", &v[2]));
  for (int i = 0; i < 4; i++) {
    if (version >= 2)
      MF_CHECK(get_int(r, root, "", v2_figures[i], &v[3 + i]));
    else if (json_object_get(root, v2_figures[i]))
      return rerr(r, MF_ERR_FORMAT, v2_figures[i], "a version-1 plan has no '%s' (it came with version 2)",
                  v2_figures[i]);
  }
  if (version >= 3)
    MF_CHECK(get_int(r, root, "", "persist_bytes", &v[7]));
  else if (json_object_get(root, "persist_bytes"))
    return rerr(r, MF_ERR_FORMAT, "persist_bytes",
                "a version-%lld plan has no 'persist_bytes' (it came with version 3)", (long long)version);
  json_t *sec;
  MF_CHECK(get(r, root, "(top level)", "predicted_step_seconds", &sec));
  if (!json_is_number(sec) || json_number_value(sec) < 0)
    return rerr(r, MF_ERR_FORMAT, "predicted_step_seconds", "expected a non-negative number, got %s",
                json_is_number(sec) ? "a negative one" : mf_io_json_kind(sec, 0));
  f->device_budget_bytes = (uint64_t)v[0];
  f->peak_device_bytes = (uint64_t)v[1];
  f->arena_bytes = (uint64_t)v[2];
  f->predicted_step_seconds = json_number_value(sec);
  f->staging_bytes = (uint64_t)v[3];
  f->staging_slab_limit_bytes = (uint64_t)v[4];
  f->staging_pool_bytes = (uint64_t)v[5];
  f->host_bytes = (uint64_t)v[6];
  f->persist_bytes = (uint64_t)v[7];
  return MF_OK;
}

/* A "param" entry's "optimizer" (version 3; absent before: host). The
 * placement's other needs — the weights resident (this entry's decision) and
 * the gradient on the device (its own entry, checked once all are read:
 * check_optim) — are checked here and there. */
static mf_status read_optim(const reader *r, const json_t *e, const char *place, int kind, int dec,
                            int64_t version, const char *name, int *optim) {
  char field[80], q[128];
  const json_t *o = json_object_get(e, "optimizer");
  snprintf(field, sizeof field, "%s.optimizer", place);
  *optim = MF_OPTIM_HOST;
  if (kind != K_PARAM) {
    if (o)
      return rerr(r, MF_ERR_FORMAT, field, "only a param entry has an optimizer placement, this is a%s %s",
                  kind == K_ACT ? "n" : "", kind_names[kind]);
    return MF_OK;
  }
  if (version < 3) {
    if (o)
      return rerr(r, MF_ERR_FORMAT, field, "a version-%lld plan has no 'optimizer' (it came with version 3)",
                  (long long)version);
    return MF_OK;
  }
  if (!o) return rerr(r, MF_ERR_FORMAT, place, "missing 'optimizer' (" OPTIM_WORDS ")");
  if (!json_is_string(o))
    return rerr(r, MF_ERR_FORMAT, field, "expected a string (" OPTIM_WORDS ") for '%s', got %s", name,
                mf_io_json_kind(o, 0));
  *optim = optim_from_word(json_string_value(o));
  if (*optim < 0)
    return rerr(r, MF_ERR_FORMAT, field, "'%s' is not an optimizer placement (" OPTIM_WORDS ") for '%s'",
                mf_io_json_printable(json_string_value(o), q, sizeof q), name);
  if (*optim == MF_OPTIM_DEVICE && r->p->forward_only)
    return rerr(r, MF_ERR_CONFIG, field, "'%s': a forward-only program has no optimizer; host", name);
  if (*optim == MF_OPTIM_DEVICE && dec != MF_PARAM_RESIDENT)
    return rerr(r, MF_ERR_CONFIG, field,
                "'%s' has its optimizer on the device but its weights streamed; the optimizer on the device "
                "needs them resident (decision: resident, or optimizer: host)",
                name);
  return MF_OK;
}

/* One entry of "tensors"; seen[t] holds the entry that named tensor t, or -1. */
static mf_status read_entry(const reader *r, const json_t *e, size_t i, int64_t version, int32_t *seen,
                            mf_decisions *d) {
  static const char *const keys[] = {"name", "kind", "bytes", "decision", "optimizer"};
  const mf_program *p = r->p;
  char place[64], field[80], q[128];
  snprintf(place, sizeof place, "tensors[%zu]", i);
  if (!json_is_object(e))
    return rerr(r, MF_ERR_FORMAT, place, "expected an object, got %s", mf_io_json_kind(e, 0));
  MF_CHECK(only_keys(r, e, place, keys, 5));
  json_t *v[4];
  for (int k = 0; k < 4; k++) {
    MF_CHECK(get(r, e, place, keys[k], &v[k]));
    snprintf(field, sizeof field, "%s.%s", place, keys[k]);
    int good = k == 2 ? json_is_integer(v[k]) && json_integer_value(v[k]) >= 0 : json_is_string(v[k]);
    if (!good)
      return rerr(r, MF_ERR_FORMAT, field, "expected %s, got %s",
                  k == 2 ? "a non-negative integer" : "a string",
                  k == 2 && json_is_integer(v[k]) ? "a negative one" : mf_io_json_kind(v[k], 0));
  }
  const char *name = json_string_value(v[0]), *kw = json_string_value(v[1]), *dw = json_string_value(v[3]);
  int kind = -1;
  for (int k = 0; k < K_COUNT_; k++)
    if (strcmp(kw, kind_names[k]) == 0) kind = k;
  snprintf(field, sizeof field, "%s.kind", place);
  if (kind < 0)
    return rerr(r, MF_ERR_FORMAT, field, "'%s' is not a tensor kind (param, grad, act)",
                mf_io_json_printable(kw, q, sizeof q));
  int dec = decision_from_word(kind, dw);
  snprintf(field, sizeof field, "%s.decision", place);
  if (dec < 0)
    return rerr(r, MF_ERR_FORMAT, field, "'%s' is not a decision for a%s %s (%s)",
                mf_io_json_printable(dw, q, sizeof q), kind == K_ACT ? "n" : "", kind_names[kind],
                kind_words[kind]);

  mf_io_json_printable(name, q, sizeof q);
  int32_t t = find_tensor(r, name);
  snprintf(field, sizeof field, "%s.name", place);
  if (t < 0) return rerr(r, MF_ERR_CONFIG, field, "'%s' is not a tensor of this model's step program", q);
  int has = plan_kind(p, t);
  mf_tensor_kind tk = p->tensors[t].kind;
  if (has < 0)
    return rerr(r, MF_ERR_CONFIG, field, "'%s' is not a tensor a plan decides (kind %s%s)", q,
                mf_tensor_kind_name(tk),
                tk == MF_T_ACT || tk == MF_T_STAT ? ", neither offloadable nor recomputable" : "");
  snprintf(field, sizeof field, "%s.kind", place);
  if (has != kind)
    return rerr(r, MF_ERR_CONFIG, field, "'%s' is a%s %s in this program, not a%s %s", q,
                has == K_ACT ? "n" : "", kind_names[has], kind == K_ACT ? "n" : "", kind_names[kind]);
  if (seen[t] >= 0)
    return rerr(r, MF_ERR_FORMAT, place, "'%s' appears twice (first at tensors[%d])", q, seen[t]);
  seen[t] = (int32_t)i;
  snprintf(field, sizeof field, "%s.bytes", place);
  if ((uint64_t)json_integer_value(v[2]) != (uint64_t)p->tensors[t].bytes)
    return rerr(r, MF_ERR_CONFIG, field, "the plan has %lld bytes for '%s', the program has %zu",
                (long long)json_integer_value(v[2]), q, p->tensors[t].bytes);
  snprintf(field, sizeof field, "%s.decision", place);
  if (kind == K_ACT && dec == MF_ACT_RECOMPUTE && !(r->opt[t] & ACT_CAN_RECOMPUTE))
    return rerr(r, MF_ERR_CONFIG, field,
                "'%s' cannot be recomputed (its forward ops cannot run again before "
                "the backward); keep or offload it",
                q);
  int optim;
  MF_CHECK(read_optim(r, e, place, kind, dec, version, q, &optim));
  if (kind == K_PARAM) {
    d->param[p->tensors[t].param] = (uint8_t)dec;
    d->optim[p->tensors[t].param] = (uint8_t)optim;
  } else if (kind == K_GRAD)
    d->grad[p->tensors[t].param] = (uint8_t)dec;
  else
    d->act[t] = (uint8_t)dec;
  return MF_OK;
}

/* The optimizer on the device needs the gradient on the device too; the
 * gradient's entry may come anywhere in the file, so this waits for all. */
static mf_status check_optim(const reader *r, const int32_t *seen, const mf_decisions *d) {
  const mf_program *p = r->p;
  char place[80], q[128];
  for (int32_t i = 0; i < d->n_params; i++) {
    if (d->optim[i] != MF_OPTIM_DEVICE || d->grad[i] == MF_GRAD_DEVICE) continue;
    snprintf(place, sizeof place, "tensors[%d].optimizer", (int)seen[p->param_tensor[i]]);
    mf_io_json_printable(p->params->params[i].name, q, sizeof q);
    return rerr(r, MF_ERR_CONFIG, place,
                "'%s' has its optimizer on the device but its gradient streamed (tensors[%d]: '%s' is "
                "stream); the optimizer on the device needs the gradient on the device (decision: device, or "
                "optimizer: host)",
                q, (int)seen[p->grad_tensor[i]], p->tensors[p->grad_tensor[i]].name);
  }
  return MF_OK;
}

/* Every tensor a plan decides must be there. */
static mf_status check_covered(const reader *r, const int32_t *seen) {
  const mf_program *p = r->p;
  char list[1024] = "";
  size_t used = 0;
  int64_t missing = 0;
  for (int32_t t = 0; t < p->n_tensors; t++) {
    if (seen[t] >= 0 || plan_kind(p, t) < 0) continue;
    if (missing++ < PLAN_MISSING_LISTED)
      used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", used ? ", " : "", p->tensors[t].name);
    if (used >= sizeof list) used = sizeof list - 1;
  }
  if (!missing) return MF_OK;
  return rerr(r, MF_ERR_CONFIG, "tensors", "%lld of the program's tensors have no decision: %s%s",
              (long long)missing, list, missing > PLAN_MISSING_LISTED ? ", ..." : "");
}

static mf_status read_root(const reader *r, const json_t *root, mf_decisions *d, mf_plan_figures *f) {
  static const char *const keys[] = {"format",
                                     "version",
                                     "model",
                                     "batch",
                                     "device_budget_bytes",
                                     "peak_device_bytes",
                                     "arena_bytes",
                                     "predicted_step_seconds",
                                     "staging_bytes",
                                     "staging_slab_limit_bytes",
                                     "staging_pool_bytes",
                                     "host_bytes",
                                     "persist_bytes",
                                     "tensors"};
  char q[128];
  if (!json_is_object(root))
    return MF_ERR(MF_ERR_FORMAT, "%s: the top level is %s, expected an object (a moefit plan)", r->path,
                  mf_io_json_kind(root, 0));
  json_t *fmt = json_object_get(root, "format");
  if (!fmt) return rerr(r, MF_ERR_FORMAT, "(top level)", "missing 'format' (is this a moefit plan?)");
  if (!json_is_string(fmt))
    return rerr(r, MF_ERR_FORMAT, "format", "expected the string \"" PLAN_FORMAT "\", got %s",
                mf_io_json_kind(fmt, 0));
  if (strcmp(json_string_value(fmt), PLAN_FORMAT) != 0)
    return rerr(r, MF_ERR_FORMAT, "format", "expected \"" PLAN_FORMAT "\", got '%s' (not a moefit plan)",
                mf_io_json_printable(json_string_value(fmt), q, sizeof q));
  json_t *ver;
  MF_CHECK(get(r, root, "(top level)", "version", &ver));
  if (!json_is_integer(ver))
    return rerr(r, MF_ERR_FORMAT, "version", "expected a positive integer, got %s", mf_io_json_kind(ver, 0));
  if (json_integer_value(ver) < 1)
    return rerr(r, MF_ERR_FORMAT, "version", "expected a positive integer, got %lld",
                (long long)json_integer_value(ver));
  if (json_integer_value(ver) > PLAN_VERSION)
    return rerr(r, MF_ERR_UNSUPPORTED, "version",
                "plan format version %lld is newer than this moefit reads (versions 1 to %d); "
                "plan again or use a newer moefit",
                (long long)json_integer_value(ver), PLAN_VERSION);
  MF_CHECK(only_keys(r, root, "(top level)", keys, (int)(sizeof keys / sizeof keys[0])));
  MF_CHECK(check_shape(r, root, json_integer_value(ver)));
  MF_CHECK(read_figures(r, root, json_integer_value(ver), f));
  json_t *tensors;
  MF_CHECK(get(r, root, "(top level)", "tensors", &tensors));
  if (!json_is_array(tensors))
    return rerr(r, MF_ERR_FORMAT, "tensors", "expected an array, got %s", mf_io_json_kind(tensors, 0));
  int32_t *seen = NULL;
  MF_CHECK(mf_malloc(((size_t)r->p->n_tensors + 1) * sizeof *seen, "plan reader", (void **)&seen));
  memset(seen, 0xff, ((size_t)r->p->n_tensors + 1) * sizeof *seen);
  mf_status st = MF_OK;
  size_t i;
  json_t *e;
  json_array_foreach(tensors, i, e) {
    MF_CHECK_GOTO(read_entry(r, e, i, json_integer_value(ver), seen, d), st, done);
  }
  MF_CHECK_GOTO(check_covered(r, seen), st, done);
  MF_CHECK_GOTO(check_optim(r, seen, d), st, done);
done:
  free(seen);
  return st;
}

mf_status mf_plan_read_json(const mf_program *p, const char *path, mf_decisions *d, mf_plan_figures *f) {
  if (!p || !path || !d) return MF_ERR(MF_ERR_INVALID_ARG, "mf_plan_read_json: NULL argument");
  if (d->n_params != (int32_t)p->params->n || d->n_tensors != p->n_tensors)
    return MF_ERR(MF_ERR_INVALID_ARG, "mf_plan_read_json: %s: decisions are for another program", path);
  char *text = NULL;
  size_t len = 0;
  MF_CHECK(mf_read_file(path, PLAN_MAX_BYTES, "a plan", &text, &len));
  reader r = {.path = path, .p = p, .slot = NULL, .mask = 0, .opt = NULL};
  mf_decisions *tmp = NULL;
  json_t *root = NULL;
  mf_plan_figures fig;
  memset(&fig, 0, sizeof fig);
  mf_status st = MF_OK;
  int line, col;
  size_t lead = 0;
  while (lead < len && isspace((unsigned char)text[lead])) lead++;
  if (lead == len) {
    st = MF_ERR(MF_ERR_FORMAT, "%s: the file is empty, expected a moefit plan (JSON)", path);
    goto done;
  }
  if (mf_io_json_too_deep(text, len, PLAN_MAX_DEPTH, NULL, &line, &col)) {
    st = MF_ERR(MF_ERR_FORMAT, "%s: line %d, column %d: nests deeper than %d levels; a plan needs 3", path,
                line, col, PLAN_MAX_DEPTH);
    goto done;
  }
  json_error_t jerr;
  root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
  if (!root) {
    char clean[JSON_ERROR_TEXT_LENGTH + 64];
    st = MF_ERR(MF_ERR_FORMAT, "%s: line %d, column %d: invalid JSON: %s", path, jerr.line, jerr.column,
                mf_io_json_printable(jerr.text, clean, sizeof clean));
    goto done;
  }
  MF_CHECK_GOTO(index_names(&r), st, done);
  MF_CHECK_GOTO(act_options(p, &r.opt), st, done);
  MF_CHECK_GOTO(mf_decisions_create(p, &tmp), st, done);
  MF_CHECK_GOTO(read_root(&r, root, tmp, &fig), st, done);
  MF_CHECK_GOTO(mf_decisions_copy(tmp, d), st, done);
  if (f) *f = fig;
done:
  json_decref(root);
  mf_decisions_free(tmp);
  free(r.slot);
  free(r.opt);
  free(text);
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
  uint8_t *opt;                            /* act_options, made when an override first recomputes */
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
  if (o->params && (pd = decision_from_word(K_PARAM, o->params)) < 0)
    return OV_ERR(MF_ERR_CONFIG, "params: '%s' is not a decision for params (resident, stream)%s",
                  mf_io_json_printable(o->params, q2, sizeof q2),
                  strcmp(o->params, "host") == 0 ? "; a weight kept at home is 'stream'" : "");
  if (o->grads && (gd = decision_from_word(K_GRAD, o->grads)) < 0)
    return OV_ERR(MF_ERR_CONFIG, "grads: '%s' is not a decision for grads (device, stream)%s",
                  mf_io_json_printable(o->grads, q2, sizeof q2),
                  strcmp(o->grads, "host") == 0 ? "; a gradient sent home is 'stream'" : "");
  if (o->activations && (ad = decision_from_word(K_ACT, o->activations)) < 0)
    return OV_ERR(MF_ERR_CONFIG,
                  "activations: '%s' is not a decision for activations (keep, offload, recompute)",
                  mf_io_json_printable(o->activations, q2, sizeof q2));
  if (o->optimizer && (od = optim_from_word(o->optimizer)) < 0)
    return OV_ERR(MF_ERR_CONFIG, "optimizer: '%s' is not an optimizer placement (" OPTIM_WORDS ")",
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
      if (!matches(pat, p->params->params[i].name)) continue;
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
    int64_t hit = 0;
    for (int64_t i = 0; i < p->params->n; i++) {
      if (!matches(pat, p->params->params[i].name)) continue;
      hit++;
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
  }
  if (ad == MF_ACT_RECOMPUTE && !x->opt) MF_CHECK(act_options(p, &x->opt));
  if (ad >= 0) {
    int64_t hit = 0;
    for (int32_t t = 0; t < p->n_tensors; t++) {
      if (plan_kind(p, t) != K_ACT) continue;
      const char *name = p->tensors[t].name;
      if (!matches(pat, without_micro(name)) && !matches(pat, name)) continue;
      if (ad == MF_ACT_RECOMPUTE && !(x->opt[t] & ACT_CAN_RECOMPUTE))
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
               buf + half, buf + half + np, buf + half + 2 * np, buf + half + 2 * np + nt, NULL};
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
