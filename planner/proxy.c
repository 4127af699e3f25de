/* The proxy program the planner scores candidates on (see proxy.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planner/proxy.h"

void mf_plan_proxy_free(mf_plan_proxy *x) {
  if (!x) return;
  mf_program_free(x->prog);
  mf_param_table_free(x->params);
  free(x->full_layer);
  free(x->rep);
  free(x->param_full);
  free(x->tensor_full);
  free(x);
}

int mf_plan_proxy_rename(const char *name, int32_t from, int32_t to, char *out, size_t cap) {
  char key[40];
  snprintf(key, sizeof key, "model.layers.%d.", (int)from);
  const char *at = strstr(name, key);
  int n;
  if (!at || from < 0)
    n = snprintf(out, cap, "%s", name);
  else
    n = snprintf(out, cap, "%.*smodel.layers.%d.%s", (int)(at - name), name, (int)to, at + strlen(key));
  return n >= 0 && (size_t)n < cap;
}

/* Full tensor ids sorted by name, for lookups. */
static int cmp_name(const void *a, const void *b, void *arg) {
  const mf_program *p = (const mf_program *)arg;
  return strcmp(p->tensors[*(const int32_t *)a].name, p->tensors[*(const int32_t *)b].name);
}

static int32_t find_tensor(const mf_program *p, const int32_t *sorted, const char *name) {
  int32_t lo = 0, hi = p->n_tensors - 1;
  while (lo <= hi) {
    int32_t mid = lo + (hi - lo) / 2;
    int c = strcmp(p->tensors[sorted[mid]].name, name);
    if (c == 0) return sorted[mid];
    if (c < 0)
      lo = mid + 1;
    else
      hi = mid - 1;
  }
  return -1;
}

/* The parameters of one layer (or of no layer, -1), in table order. */
static int32_t layer_params(const mf_param_table *t, int32_t layer, int32_t *out) {
  int32_t n = 0;
  for (int64_t i = 0; i < t->n; i++)
    if (t->params[i].layer == layer) out[n++] = (int32_t)i;
  return n;
}

/* The full table's LoRA adapters on the proxy's table (a run with train.lora):
 * the same rank, targets and router training, and with a hot set (train.lora.
 * experts: hot) each proxy layer's the one of the full layer it stands for. */
static mf_status proxy_lora(const mf_param_table *full, mf_plan_proxy *x) {
  if (!full->lora_a) return MF_OK;
  mf_lora l = full->lora;
  const int64_t E = full->spec.experts;
  uint8_t *hot = NULL;
  if (l.hot && E > 0) {
    MF_CHECK(mf_malloc((size_t)(x->n_layers * E), "the proxy's hot experts", (void **)&hot));
    for (int32_t r = 0; r < x->n_layers; r++)
      memcpy(hot + r * E, full->lora.hot + (int64_t)x->full_layer[r] * E, (size_t)E);
  }
  l.hot = hot;
  const mf_status st = mf_param_table_add_lora(x->params, &l);
  free(hot);
  return st;
}

mf_status mf_plan_proxy_build(const mf_program *full, mf_plan_proxy **out) {
  *out = NULL;
  const mf_model_spec *fs = &full->spec;
  const int32_t L = (int32_t)fs->layers;
  /* Kinds of layer: 0 dense, 1 MoE; the middle full layer of each. */
  int32_t count[2] = {0, 0}, first_kind = -1, second_kind = -1;
  for (int32_t l = 0; l < L; l++) {
    int k = mf_model_spec_layer_is_moe(fs, l);
    count[k]++;
    if (first_kind < 0)
      first_kind = k;
    else if (k != first_kind && second_kind < 0)
      second_kind = k;
  }
  if (L == 0) return MF_OK;
  int32_t middle[2] = {-1, -1};
  for (int k = 0; k < 2; k++) {
    int32_t seen = 0;
    for (int32_t l = 0; l < L && middle[k] < 0; l++)
      if (mf_model_spec_layer_is_moe(fs, l) == k && seen++ == count[k] / 2) middle[k] = l;
  }
  const int maj = count[1] >= count[0] ? 1 : 0;
  int kinds[5], n = 0;
  int32_t scored[2] = {-1, -1};
  kinds[n++] = maj;
  kinds[n] = first_kind, scored[first_kind] = n++;
  kinds[n++] = maj;
  if (second_kind >= 0) {
    kinds[n] = second_kind, scored[second_kind] = n++;
    kinds[n++] = maj;
  }
  if (n >= L) return MF_OK; /* not smaller */
  /* The Qwen families mix dense and MoE layers anywhere (mlp_only_layers);
   * GLM-4.5's dense layers are the first ones (first_k_dense_replace), so its
   * proxy has its dense layers first too. */
  mf_model_spec ps = *fs;
  ps.layers = n;
  /* gpt-oss's sliding and full layers alternate: the proxy's layers attend as the full ones (the dearer:
   * a conservative step time), or slide when every layer of the model does */
  int all_slide = 1;
  for (int32_t l = 0; l < L; l++) all_slide = all_slide && fs->sliding_layers[l];
  for (int i = 0; i < n; i++) ps.sliding_layers[i] = (uint8_t)all_slide;
  if (ps.first_dense > n) ps.first_dense = n; /* every layer dense */
  if (second_kind >= 0 && fs->first_dense > 0) {
    int32_t dense = 0;
    for (int i = 0; i < n; i++) dense += kinds[i] == 0;
    for (int i = 0; i < n; i++) kinds[i] = i >= dense;
    ps.first_dense = dense;
    scored[0] = dense / 2, scored[1] = dense + (n - dense) / 2; /* where the full model's sit */
  } else if (second_kind >= 0) {
    if (fs->family != MF_FAMILY_QWEN2_MOE && fs->family != MF_FAMILY_QWEN3_MOE) return MF_OK;
    ps.decoder_sparse_step = 1;
    ps.n_mlp_only = 0;
    for (int i = 0; i < n; i++)
      if (!kinds[i]) ps.mlp_only_layers[ps.n_mlp_only++] = i;
  }

  mf_plan_proxy *x = (mf_plan_proxy *)calloc(1, sizeof *x);
  if (!x) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "plan: out of memory");
  mf_status st = MF_OK;
  int32_t *fl = NULL, *pl = NULL, *sorted = NULL;
  int ok = 1;
  x->n_layers = n;
  MF_CHECK_GOTO(mf_calloc((size_t)n, sizeof(int32_t), "plan", (void **)&x->full_layer), st, fail);
  for (int i = 0; i < n; i++) x->full_layer[i] = middle[kinds[i]];
  MF_CHECK_GOTO(mf_param_table_build(&ps, &x->params), st, fail);
  MF_CHECK_GOTO(proxy_lora(full->params, x), st, fail);
  {
    mf_program_opts po;
    memset(&po, 0, sizeof po);
    po.micro_batch = full->B;
    po.seq_len = full->S;
    po.grad_accum = full->G;
    po.aux_coef = full->aux_coef;
    po.ce_chunk = full->ce_chunk;
    po.forward_only = full->forward_only;
    po.order = full->order;
    po.storage = full->storage;
    po.moments = full->moments;
    po.ranks = full->ranks;
    po.node_ranks = full->node_ranks;
    MF_CHECK_GOTO(mf_program_build(x->params, &po, &x->prog), st, fail);
  }
  MF_CHECK_GOTO(mf_calloc((size_t)L, sizeof(int32_t), "plan", (void **)&x->rep), st, fail);
  MF_CHECK_GOTO(mf_calloc((size_t)x->params->n, sizeof(int32_t), "plan", (void **)&x->param_full), st, fail);
  MF_CHECK_GOTO(mf_calloc((size_t)x->prog->n_tensors + 1, sizeof(int32_t), "plan", (void **)&x->tensor_full),
                st, fail);
  for (int32_t l = 0; l < L; l++) x->rep[l] = scored[mf_model_spec_layer_is_moe(fs, l)];

  /* Parameters: the same list, role by role and size by size, in each pair of layers. */
  MF_CHECK_GOTO(mf_calloc((size_t)full->params->n + 1, sizeof(int32_t), "plan", (void **)&fl), st, fail);
  MF_CHECK_GOTO(mf_calloc((size_t)x->params->n + 1, sizeof(int32_t), "plan", (void **)&pl), st, fail);
  for (int32_t r = -1; r < n && ok; r++) {
    int32_t nf = layer_params(full->params, r < 0 ? -1 : x->full_layer[r], fl);
    int32_t np = layer_params(x->params, r, pl);
    if (nf != np) ok = 0;
    for (int32_t i = 0; i < np && ok; i++) {
      const mf_param *a = &x->params->params[pl[i]], *b = &full->params->params[fl[i]];
      if (a->role != b->role || a->expert != b->expert || a->numel != b->numel) ok = 0;
      x->param_full[pl[i]] = fl[i];
    }
  }
  /* Tensors: by name, each proxy layer renamed to the full layer it stands for. */
  MF_CHECK_GOTO(mf_calloc((size_t)full->n_tensors + 1, sizeof(int32_t), "plan", (void **)&sorted), st, fail);
  for (int32_t t = 0; t < full->n_tensors; t++) sorted[t] = t;
  qsort_r(sorted, (size_t)full->n_tensors, sizeof(int32_t), cmp_name, (void *)full);
  for (int32_t t = 0; t < x->prog->n_tensors && ok; t++) {
    const mf_ptensor *pt = &x->prog->tensors[t];
    char name[sizeof pt->name];
    int32_t r = pt->layer;
    x->tensor_full[t] = -1;
    if (pt->kind == MF_T_PARAM || pt->kind == MF_T_GRAD || pt->kind == MF_T_OPT) continue; /* by parameter */
    if (t == x->prog->norm_sums) continue; /* every parameter's: no one tensor of the full program's */
    if (!mf_plan_proxy_rename(pt->name, r, r >= 0 ? x->full_layer[r] : r, name, sizeof name)) {
      ok = 0;
      break;
    }
    int32_t f = find_tensor(full, sorted, name);
    if (f >= 0 && (full->tensors[f].bytes != pt->bytes || full->tensors[f].kind != pt->kind)) ok = 0;
    x->tensor_full[t] = f;
  }
  free(fl);
  free(pl);
  free(sorted);
  if (!ok) {
    mf_plan_proxy_free(x);
    return MF_OK;
  }
  *out = x;
  return MF_OK;
fail:
  free(fl);
  free(pl);
  free(sorted);
  mf_plan_proxy_free(x);
  return st;
}
