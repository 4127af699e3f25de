/*
 * Reading a plan file (plan_io.h). The text is parsed in one pass
 * (plan_io_json.h); the small head (format, version, model, batch, figures)
 * is checked as a jansson copy with the helpers the other readers share; the
 * entries are read from the parsed nodes, each name found through a hash of
 * the program's tensor names, so reading is linear in the file.
 *
 * Strict: a plan is data a person may edit, so every key is checked, unknown
 * keys included, and the decisions land in the caller's arrays only when the
 * whole file is good.
 */
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planner/plan_io_internal.h"
#include "planner/plan_io_json.h"
#include "src/io/json_util.h"
#include "src/model/hf_config.h"

#define PLAN_MAX_BYTES ((size_t)256 << 20)
/* A plan nests three deep (top, tensors, entry); anything far deeper is not a
 * plan, and is refused before the parser recurses into it (where it starts:
 * line and column). */
#define PLAN_MAX_DEPTH 16
#define PLAN_MISSING_LISTED 5

typedef struct reader {
  const char *path;
  const mf_program *p;
  const mf_pj_doc *doc;
  int64_t version;
  int32_t *slot; /* open-addressing table of tensor ids by name, -1 empty */
  uint32_t mask;
  uint8_t *opt; /* mf_plan_io_act_options */
} reader;

/* "<file>: <place>: <fault>" */
static mf_status vrerr(const reader *r, mf_status s, const char *place, const char *fmt, va_list ap) {
  char msg[1536];
  vsnprintf(msg, sizeof msg, fmt, ap);
  return MF_ERR(s, "%s: %s: %s", r->path, place, msg);
}

static mf_status rerr(const reader *r, mf_status s, const char *place, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static mf_status rerr(const reader *r, mf_status s, const char *place, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  mf_status st = vrerr(r, s, place, fmt, ap);
  va_end(ap);
  return st;
}

/* An entry's fault, at "tensors[i]" or, with a key, "tensors[i].key". */
static mf_status eerr(const reader *r, mf_status s, size_t i, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static mf_status eerr(const reader *r, mf_status s, size_t i, const char *key, const char *fmt, ...) {
  char place[96];
  if (key)
    snprintf(place, sizeof place, "tensors[%zu].%s", i, key);
  else
    snprintf(place, sizeof place, "tensors[%zu]", i);
  va_list ap;
  va_start(ap, fmt);
  mf_status st = vrerr(r, s, place, fmt, ap);
  va_end(ap);
  return st;
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

/* ------------------------------------------------------------ the head */

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

/* batch.<key>: one of two words; *which gets its index. */
static mf_status batch_word(const reader *r, const json_t *batch, const char *key, const char *const words[2],
                            int *which) {
  char place[64], q[128];
  json_t *o;
  snprintf(place, sizeof place, "batch.%s", key);
  MF_CHECK(get(r, batch, "batch", key, &o));
  if (!json_is_string(o))
    return rerr(r, MF_ERR_FORMAT, place, "expected \"%s\" or \"%s\", got %s", words[0], words[1],
                mf_io_json_kind(o, 0));
  for (*which = 0; *which < 2; (*which)++)
    if (strcmp(json_string_value(o), words[*which]) == 0) return MF_OK;
  return rerr(r, MF_ERR_FORMAT, place, "expected \"%s\" or \"%s\", got '%s'", words[0], words[1],
              mf_io_json_printable(json_string_value(o), q, sizeof q));
}

/* batch.order (version 2; a version-1 plan is micro-batch-major) and
 * batch.storage (version 4): the program's. */
static mf_status check_batch_words(const reader *r, const json_t *batch) {
  const mf_program *p = r->p;
  const char *const orders[2] = {mf_program_order_name(MF_ORDER_MICRO_MAJOR),
                                 mf_program_order_name(MF_ORDER_LAYER_MAJOR)};
  int w = 0;
  if (r->version >= 2) MF_CHECK(batch_word(r, batch, "order", orders, &w));
  const mf_program_order order = w ? MF_ORDER_LAYER_MAJOR : MF_ORDER_MICRO_MAJOR;
  if (order != p->order)
    return rerr(r, MF_ERR_CONFIG, "batch.order", "the plan was made for the %s order, the program is %s",
                mf_program_order_name(order), mf_program_order_name(p->order));
  if (r->version < 4) return MF_OK;
  const char *const storages[2] = {mf_plan_io_storage_name(MF_DTYPE_F32),
                                   mf_plan_io_storage_name(MF_DTYPE_BF16)};
  MF_CHECK(batch_word(r, batch, "storage", storages, &w));
  const char *ours = mf_plan_io_storage_name(p->storage);
  if (!ours || strcmp(ours, storages[w]) != 0)
    return rerr(r, MF_ERR_CONFIG, "batch.storage",
                "the plan was made for %s device storage, the program stores %s (plan again for this config)",
                storages[w], ours ? ours : mf_dtype_name(p->storage));
  return MF_OK;
}

/* model.* and batch.*: the plan's shape must be this program's. */
static mf_status check_shape(const reader *r, const json_t *root) {
  const mf_program *p = r->p;
  const mf_model_spec *s = &p->spec;
  static const char *const mkeys[] = {"family",  "layers", "hidden",     "heads", "kv_heads",
                                      "experts", "top_k",  "expert_ffn", "vocab"};
  static const char *const bkeys[] = {"micro_batch", "seq_len", "grad_accum", "order", "storage"};
  const int64_t mvals[] = {0,          s->layers, s->hidden,     s->heads, s->kv_heads,
                           s->experts, s->top_k,  s->expert_ffn, s->vocab};
  const int64_t bvals[] = {p->B, p->S, p->G};
  json_t *batch;
  MF_CHECK(mf_model_json_check(r->path, root, s, mkeys, mvals, 9, "the plan was made for",
                               "the plan was made for"));
  MF_CHECK(get(r, root, "(top level)", "batch", &batch));
  if (!json_is_object(batch))
    return rerr(r, MF_ERR_FORMAT, "batch", "expected an object, got %s", mf_io_json_kind(batch, 0));
  /* order came with version 2, storage with version 4 */
  MF_CHECK(only_keys(r, batch, "batch", bkeys, r->version >= 4 ? 5 : r->version >= 2 ? 4 : 3));
  MF_CHECK(check_batch_words(r, batch));
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

/* A figure that came with version `since`: required from then on, refused before. */
static mf_status later_figure(const reader *r, const json_t *root, int since, const char *key, int64_t *out) {
  if (r->version >= since) return get_int(r, root, "", key, out);
  if (json_object_get(root, key))
    return rerr(r, MF_ERR_FORMAT, key, "a version-%lld plan has no '%s' (it came with version %d)",
                (long long)r->version, key, since);
  return MF_OK;
}

/* "kernels" (version 5): {"expert_gemm": WORD, "attention": WORD}. */
static mf_status read_kernels(const reader *r, const json_t *root, mf_plan_figures *f) {
  json_t *k = json_object_get(root, "kernels");
  if (r->version < 5) {
    if (k) return rerr(r, MF_ERR_FORMAT, "kernels", "a version-%lld plan has no 'kernels' (it came with version 5)",
                       (long long)r->version);
    return MF_OK;
  }
  MF_CHECK(get(r, root, "(top level)", "kernels", &k));
  if (!json_is_object(k)) return rerr(r, MF_ERR_FORMAT, "kernels", "expected an object, got %s", mf_io_json_kind(k, 0));
  static const char *const keys[] = {"expert_gemm", "attention"};
  MF_CHECK(only_keys(r, k, "kernels", keys, 2));
  const char *words[] = {MF_PLAN_EXPERT_GEMM_WORDS, MF_PLAN_ATTENTION_WORDS};
  char *out[] = {f->expert_gemm, f->attention};
  for (int i = 0; i < 2; i++) {
    json_t *v;
    char where[48], q[64];
    snprintf(where, sizeof where, "kernels.%s", keys[i]);
    MF_CHECK(get(r, k, "kernels", keys[i], &v));
    if (!json_is_string(v)) return rerr(r, MF_ERR_FORMAT, where, "expected a string, got %s", mf_io_json_kind(v, 0));
    if (!mf_plan_io_kernel_ok(json_string_value(v), words[i]))
      return rerr(r, MF_ERR_FORMAT, where, "expected one of %s, got '%s'", words[i],
                  mf_io_json_printable(json_string_value(v), q, sizeof q));
    snprintf(out[i], sizeof f->expert_gemm, "%s", json_string_value(v));
  }
  return MF_OK;
}

static mf_status read_figures(const reader *r, const json_t *root, mf_plan_figures *f) {
  static const char *const v2_figures[] = {"staging_bytes", "staging_slab_limit_bytes", "staging_pool_bytes",
                                           "host_bytes"};
  int64_t v[10] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  MF_CHECK(get_int(r, root, "", "device_budget_bytes", &v[0]));
  MF_CHECK(get_int(r, root, "", "peak_device_bytes", &v[1]));
  MF_CHECK(get_int(r, root, "", "arena_bytes", &v[2]));
  for (int i = 0; i < 4; i++) MF_CHECK(later_figure(r, root, 2, v2_figures[i], &v[3 + i]));
  MF_CHECK(later_figure(r, root, 3, "persist_bytes", &v[7]));
  MF_CHECK(later_figure(r, root, 4, "device_backend_bytes", &v[8]));
  MF_CHECK(later_figure(r, root, 6, "pinned_home_bytes", &v[9]));
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
  f->device_backend_bytes = (uint64_t)v[8];
  f->pinned_home_bytes = (uint64_t)v[9];
  return read_kernels(r, root, f);
}

/* Everything but "tensors": format, version, the keys, shape and figures. Sets r->version. */
static mf_status read_head(reader *r, const json_t *root, mf_plan_figures *f) {
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
                                     "device_backend_bytes",
                                     "pinned_home_bytes",
                                     "kernels",
                                     "tensors"};
  char q[128];
  json_t *fmt = json_object_get(root, "format");
  if (!fmt) return rerr(r, MF_ERR_FORMAT, "(top level)", "missing 'format' (is this a moefit plan?)");
  if (!json_is_string(fmt))
    return rerr(r, MF_ERR_FORMAT, "format", "expected the string \"" MF_PLAN_FORMAT "\", got %s",
                mf_io_json_kind(fmt, 0));
  if (strcmp(json_string_value(fmt), MF_PLAN_FORMAT) != 0)
    return rerr(r, MF_ERR_FORMAT, "format", "expected \"" MF_PLAN_FORMAT "\", got '%s' (not a moefit plan)",
                mf_io_json_printable(json_string_value(fmt), q, sizeof q));
  json_t *ver;
  MF_CHECK(get(r, root, "(top level)", "version", &ver));
  if (!json_is_integer(ver))
    return rerr(r, MF_ERR_FORMAT, "version", "expected a positive integer, got %s", mf_io_json_kind(ver, 0));
  r->version = json_integer_value(ver);
  if (r->version < 1)
    return rerr(r, MF_ERR_FORMAT, "version", "expected a positive integer, got %lld", (long long)r->version);
  if (r->version > MF_PLAN_VERSION)
    return rerr(r, MF_ERR_UNSUPPORTED, "version",
                "plan format version %lld is newer than this moefit reads (versions 1 to %d); "
                "plan again or use a newer moefit",
                (long long)r->version, MF_PLAN_VERSION);
  MF_CHECK(only_keys(r, root, "(top level)", keys, (int)(sizeof keys / sizeof keys[0])));
  MF_CHECK(check_shape(r, root));
  return read_figures(r, root, f);
}

/* --------------------------------------------------------- the entries */

enum { E_NAME = 0, E_KIND, E_BYTES, E_DECISION, E_OPTIMIZER, E_COUNT_ };
static const char *const entry_keys[E_COUNT_] = {"name", "kind", "bytes", "decision", "optimizer"};

/* A "param" entry's "optimizer" o (version 3; absent before: host). The
 * placement's other needs — the weights resident (this entry's decision) and
 * the gradient on the device (its own entry, checked once all are read:
 * check_optim) — are checked here and there. q: the tensor's name, printable. */
static mf_status read_optim(const reader *r, const mf_pj *o, size_t i, int kind, int dec, const char *q,
                            int *optim) {
  *optim = MF_OPTIM_HOST;
  if (kind != MF_PLAN_K_PARAM) {
    if (o)
      return eerr(r, MF_ERR_FORMAT, i, "optimizer",
                  "only a param entry has an optimizer placement, this is a%s %s",
                  kind == MF_PLAN_K_ACT ? "n" : "", mf_plan_io_kind_names[kind]);
    return MF_OK;
  }
  if (r->version < 3) {
    if (o)
      return eerr(r, MF_ERR_FORMAT, i, "optimizer",
                  "a version-%lld plan has no 'optimizer' (it came with version 3)", (long long)r->version);
    return MF_OK;
  }
  if (!o) return eerr(r, MF_ERR_FORMAT, i, NULL, "missing 'optimizer' (" MF_PLAN_OPTIM_WORDS ")");
  if (o->type != JSON_STRING)
    return eerr(r, MF_ERR_FORMAT, i, "optimizer",
                "expected a string (" MF_PLAN_OPTIM_WORDS ") for '%s', got %s", q, mf_pj_kind(o));
  *optim = mf_plan_io_optim_from_word(o->v.s);
  char w[128];
  if (*optim < 0)
    return eerr(r, MF_ERR_FORMAT, i, "optimizer",
                "'%s' is not an optimizer placement (" MF_PLAN_OPTIM_WORDS ") for '%s'",
                mf_io_json_printable(o->v.s, w, sizeof w), q);
  if (*optim == MF_OPTIM_DEVICE && r->p->forward_only)
    return eerr(r, MF_ERR_CONFIG, i, "optimizer", "'%s': a forward-only program has no optimizer; host", q);
  if (*optim == MF_OPTIM_DEVICE && dec != MF_PARAM_RESIDENT)
    return eerr(r, MF_ERR_CONFIG, i, "optimizer",
                "'%s' has its optimizer on the device but its weights streamed; the optimizer on the device "
                "needs them resident (decision: resident, or optimizer: host)",
                q);
  return MF_OK;
}

/* Entry e's members by key into v[] (NULL where absent); an unknown key is an error. */
static mf_status entry_members(const reader *r, const mf_pj *e, size_t i, const mf_pj **v) {
  char q[128];
  for (int k = 0; k < E_COUNT_; k++) v[k] = NULL;
  for (int32_t m = e->v.first; m >= 0; m = r->doc->node[m].next) {
    const mf_pj *x = &r->doc->node[m];
    int k = 0;
    while (k < E_COUNT_ && strcmp(x->key, entry_keys[k]) != 0) k++;
    if (k == E_COUNT_)
      return eerr(r, MF_ERR_FORMAT, i, NULL, "unknown key '%s'", mf_io_json_printable(x->key, q, sizeof q));
    v[k] = x;
  }
  return MF_OK;
}

/* Entry e's kind and decision words: *kind and *dec. */
static mf_status entry_words(const reader *r, const mf_pj *const *v, size_t i, int *kind, int *dec) {
  char q[128];
  const char *kw = v[E_KIND]->v.s, *dw = v[E_DECISION]->v.s;
  *kind = -1;
  for (int k = 0; k < MF_PLAN_K_COUNT_; k++)
    if (strcmp(kw, mf_plan_io_kind_names[k]) == 0) *kind = k;
  if (*kind < 0)
    return eerr(r, MF_ERR_FORMAT, i, "kind", "'%s' is not a tensor kind (param, grad, act)",
                mf_io_json_printable(kw, q, sizeof q));
  *dec = mf_plan_io_decision_from_word(*kind, dw);
  if (*dec < 0)
    return eerr(r, MF_ERR_FORMAT, i, "decision", "'%s' is not a decision for a%s %s (%s)",
                mf_io_json_printable(dw, q, sizeof q), *kind == MF_PLAN_K_ACT ? "n" : "",
                mf_plan_io_kind_names[*kind], mf_plan_io_kind_words[*kind]);
  return MF_OK;
}

/* One entry of "tensors"; seen[t] holds the entry that named tensor t, or -1. */
static mf_status read_entry(const reader *r, const mf_pj *e, size_t i, int32_t *seen, mf_decisions *d) {
  const mf_program *p = r->p;
  char q[128];
  if (e->type != JSON_OBJECT)
    return eerr(r, MF_ERR_FORMAT, i, NULL, "expected an object, got %s", mf_pj_kind(e));
  const mf_pj *v[E_COUNT_];
  MF_CHECK(entry_members(r, e, i, v));
  for (int k = 0; k < E_OPTIMIZER; k++) {
    if (!v[k]) return eerr(r, MF_ERR_FORMAT, i, NULL, "missing '%s'", entry_keys[k]);
    const int bytes = k == E_BYTES, integer = v[k]->type == JSON_INTEGER;
    if (bytes ? !integer || v[k]->v.i < 0 : v[k]->type != JSON_STRING)
      return eerr(r, MF_ERR_FORMAT, i, entry_keys[k], "expected %s, got %s",
                  bytes ? "a non-negative integer" : "a string",
                  bytes && integer ? "a negative one" : mf_pj_kind(v[k]));
  }
  int kind = -1, dec = -1;
  MF_CHECK(entry_words(r, v, i, &kind, &dec));
  mf_io_json_printable(v[E_NAME]->v.s, q, sizeof q);
  const int32_t t = find_tensor(r, v[E_NAME]->v.s);
  if (t < 0) return eerr(r, MF_ERR_CONFIG, i, "name", "'%s' is not a tensor of this model's step program", q);
  const int has = mf_plan_io_kind_of(p, t);
  const mf_tensor_kind tk = p->tensors[t].kind;
  if (has < 0)
    return eerr(r, MF_ERR_CONFIG, i, "name", "'%s' is not a tensor a plan decides (kind %s%s)", q,
                mf_tensor_kind_name(tk),
                tk == MF_T_ACT || tk == MF_T_STAT ? ", neither offloadable nor recomputable" : "");
  if (has != kind)
    return eerr(r, MF_ERR_CONFIG, i, "kind", "'%s' is a%s %s in this program, not a%s %s", q,
                has == MF_PLAN_K_ACT ? "n" : "", mf_plan_io_kind_names[has], kind == MF_PLAN_K_ACT ? "n" : "",
                mf_plan_io_kind_names[kind]);
  if (seen[t] >= 0)
    return eerr(r, MF_ERR_FORMAT, i, NULL, "'%s' appears twice (first at tensors[%d])", q, seen[t]);
  seen[t] = (int32_t)i;
  if ((uint64_t)v[E_BYTES]->v.i != (uint64_t)p->tensors[t].bytes)
    return eerr(r, MF_ERR_CONFIG, i, "bytes", "the plan has %lld bytes for '%s', the program has %zu",
                (long long)v[E_BYTES]->v.i, q, p->tensors[t].bytes);
  if (kind == MF_PLAN_K_ACT && dec == MF_ACT_RECOMPUTE && !(r->opt[t] & MF_PLAN_ACT_CAN_RECOMPUTE))
    return eerr(r, MF_ERR_CONFIG, i, "decision",
                "'%s' cannot be recomputed (its forward ops cannot run again before "
                "the backward); keep or offload it",
                q);
  int optim;
  MF_CHECK(read_optim(r, v[E_OPTIMIZER], i, kind, dec, q, &optim));
  if (kind == MF_PLAN_K_PARAM) {
    d->param[p->tensors[t].param] = (uint8_t)dec;
    d->optim[p->tensors[t].param] = (uint8_t)optim;
  } else if (kind == MF_PLAN_K_GRAD) {
    d->grad[p->tensors[t].param] = (uint8_t)dec;
  } else {
    d->act[t] = (uint8_t)dec;
  }
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
    if (seen[t] >= 0 || mf_plan_io_kind_of(p, t) < 0) continue;
    if (missing++ < PLAN_MISSING_LISTED)
      used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", used ? ", " : "", p->tensors[t].name);
    if (used >= sizeof list) used = sizeof list - 1;
  }
  if (!missing) return MF_OK;
  return rerr(r, MF_ERR_CONFIG, "tensors", "%lld of the program's tensors have no decision: %s%s",
              (long long)missing, list, missing > PLAN_MISSING_LISTED ? ", ..." : "");
}

static mf_status read_entries(reader *r, const mf_pj *tensors, mf_decisions *d) {
  const mf_pj_doc *doc = r->doc;
  if (tensors->type != JSON_ARRAY)
    return rerr(r, MF_ERR_FORMAT, "tensors", "expected an array, got %s", mf_pj_kind(tensors));
  MF_CHECK(mf_plan_io_act_options(r->p, &r->opt));
  int32_t *seen = NULL;
  MF_CHECK(mf_malloc(((size_t)r->p->n_tensors + 1) * sizeof *seen, "plan reader", (void **)&seen));
  memset(seen, 0xff, ((size_t)r->p->n_tensors + 1) * sizeof *seen);
  mf_status st = MF_OK;
  size_t i = 0;
  for (int32_t e = tensors->v.first; e >= 0; e = doc->node[e].next, i++)
    MF_CHECK_GOTO(read_entry(r, &doc->node[e], i, seen, d), st, done);
  MF_CHECK_GOTO(check_covered(r, seen), st, done);
  MF_CHECK_GOTO(check_optim(r, seen, d), st, done);
done:
  free(seen);
  return st;
}

static mf_status read_root(reader *r, mf_decisions *d, mf_plan_figures *f) {
  const mf_pj *root = &r->doc->node[0];
  if (root->type != JSON_OBJECT)
    return MF_ERR(MF_ERR_FORMAT, "%s: the top level is %s, expected an object (a moefit plan)", r->path,
                  mf_pj_kind(root));
  json_t *head = mf_pj_to_jansson(r->doc, root, "tensors");
  if (!head) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "%s: out of memory reading the plan", r->path);
  mf_status st = read_head(r, head, f);
  json_decref(head);
  MF_CHECK(st);
  const mf_pj *tensors = mf_pj_get(r->doc, root, "tensors");
  if (!tensors) return rerr(r, MF_ERR_FORMAT, "(top level)", "missing 'tensors'");
  return read_entries(r, tensors, d);
}

mf_status mf_plan_read_json(const mf_program *p, const char *path, mf_decisions *d, mf_plan_figures *f) {
  if (!p || !path || !d) return MF_ERR(MF_ERR_INVALID_ARG, "mf_plan_read_json: NULL argument");
  if (d->n_params != (int32_t)p->params->n || d->n_tensors != p->n_tensors)
    return MF_ERR(MF_ERR_INVALID_ARG, "mf_plan_read_json: %s: decisions are for another program", path);
  char *text = NULL;
  size_t len = 0;
  MF_CHECK(mf_read_file(path, PLAN_MAX_BYTES, "a plan", &text, &len));
  mf_pj_doc doc;
  memset(&doc, 0, sizeof doc);
  reader r = {.path = path, .p = p, .doc = &doc, .version = 0, .slot = NULL, .mask = 0, .opt = NULL};
  mf_decisions *tmp = NULL;
  mf_plan_figures fig;
  memset(&fig, 0, sizeof fig);
  mf_status st = MF_OK;
  size_t lead = 0;
  while (lead < len && isspace((unsigned char)text[lead])) lead++;
  if (lead == len) {
    st = MF_ERR(MF_ERR_FORMAT, "%s: the file is empty, expected a moefit plan (JSON)", path);
    goto done;
  }
  MF_CHECK_GOTO(mf_pj_parse(path, text, len, PLAN_MAX_DEPTH, &doc), st, done);
  free(text); /* the nodes keep their own copies of the strings */
  text = NULL;
  MF_CHECK_GOTO(index_names(&r), st, done);
  MF_CHECK_GOTO(mf_decisions_create(p, &tmp), st, done);
  MF_CHECK_GOTO(read_root(&r, tmp, &fig), st, done);
  MF_CHECK_GOTO(mf_decisions_copy(tmp, d), st, done);
  if (f) *f = fig;
done:
  mf_pj_free(&doc);
  mf_decisions_free(tmp);
  free(r.slot);
  free(r.opt);
  free(text);
  return st;
}
