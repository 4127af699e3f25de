/* Data-parallel training over the ranks of an mpirun (train_internal.h).
 *
 * One step of N ranks is one step of one rank with N x grad_accum
 * micro-batches: rank r trains on the step's micro-batches r, r + N, ... (each
 * rank's loader draws them all and keeps its own), its loss scaled by the
 * step's G x N micro-batches (src/model/program.h mf_program_opts.ranks).
 *
 * The ranks of a node keep one copy of the host state in memory they share
 * (comm.h mf_comm_shared_alloc): master weights, gradient sums, moments, the
 * bf16 working copy, LoRA's base stored quantized. Their gradients meet in the one sum in rank order, as
 * each comes home: local rank 0's copy of parameter i's gradient writes the
 * sum, then rank 1's adds into it, and so on (the relay, comm.h), so the sum
 * is g0 + g1 + ... + g(N-1) — the bits one rank gets adding its micro-batches
 * in order, without a second copy of the gradients anywhere. Across nodes the
 * leaders add the nodes' sums in node order. Then every rank of a node
 * computes the norm's chunk sums of its shard (chunks of the norm, so the
 * global norm adds them in the single-rank order), clips and updates its shard
 * with AdamW, and the node's ranks meet at a barrier before the next step's
 * uploads read the weights. Every node updates the whole model (the same bits
 * everywhere): nothing is gathered after the update. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/train/train_internal.h"

static void ranks_pieces_free(mf_ranks *k) {
  free(k->own_lo);
  free(k->own_hi);
  free(k->tokens);
  free(k->skip_ids);
  free(k->skip_targets);
  free(k->norm_bufs);
  free(k->ext);
  free(k->own);
  free(k->foreign);
}

void mf_ranks_free(mf_ranks *k, int collective) {
  if (!k) return;
  if (collective) {
    mf_comm_relay_free(k->xrelay);
    mf_comm_relay_free(k->relay);
    mf_comm_shared_free(k->sums);
    mf_comm_shared_free(k->home);
    mf_comm_shared_free(k->qhome);
  } else { /* after a failure: the others may never come to free them with us */
    mf_comm_relay_forget(k->xrelay);
    mf_comm_relay_forget(k->relay);
    mf_comm_shared_forget(k->sums);
    mf_comm_shared_forget(k->home);
    mf_comm_shared_forget(k->qhome);
  }
  ranks_pieces_free(k);
  memset(k, 0, sizeof *k);
}

/* This rank's shard: the norm's chunks of every parameter, in parameter
 * order, cut into `lsize` runs of about equal elements; own_lo/own_hi are the
 * element range of parameter i that falls to this local rank. */
static void shard(mf_ranks *k, const mf_param_table *t) {
  const double total = (double)t->trainable_numel;
  int64_t at = 0;
  for (int64_t i = 0; i < t->n; i++) {
    const int64_t n = t->params[i].frozen ? 0 : t->params[i].numel; /* a frozen one has no chunk */
    k->own_lo[i] = k->own_hi[i] = 0;
    int have = 0;
    for (int64_t c = 0; c < n; c += (int64_t)MF_OPTIM_NORM_CHUNK) {
      const int owner = (int)((double)(at + c) * k->lsize / (total > 0 ? total : 1));
      if (owner != k->lrank) continue;
      if (!have) k->own_lo[i] = c;
      have = 1;
      k->own_hi[i] = c + (int64_t)MF_OPTIM_NORM_CHUNK < n ? c + (int64_t)MF_OPTIM_NORM_CHUNK : n;
    }
    at += n;
  }
}

/* An expert of this rank's: nobody else in its group adds to it; its owners in the groups before do
 * (the expert relay), or nobody without groups. */
static mf_status hook_grad_wait(void *ctx, int32_t i) {
  mf_ranks *k = (mf_ranks *)ctx;
  if (k->own && k->own[i]) return k->xrelay ? mf_comm_relay_wait(k->xrelay, i) : MF_OK;
  return mf_comm_relay_wait(k->relay, i);
}
static void hook_grad_home(void *ctx, int32_t i) {
  mf_ranks *k = (mf_ranks *)ctx;
  if (k->own && k->own[i]) {
    if (k->xrelay) mf_comm_relay_pass(k->xrelay, i);
    return;
  }
  mf_comm_relay_pass(k->relay, i);
}

void mf_ranks_begin(mf_ranks *k, int64_t step, float *grads) {
  mf_comm_relay_begin(k->relay, step);
  if (k->xrelay) mf_comm_relay_begin(k->xrelay, step);
  /* Experts of other nodes' ranks: nothing here writes their sums, the leaders' exchange adds them in.
   * The last step's update, which read them, is done on every rank of the node (mf_ranks_updated). */
  if (k->foreign && k->lrank == 0)
    for (int64_t i = 0; i < k->table->n; i++)
      if (k->foreign[i])
        memset(grads + k->table->params[i].toff, 0, (size_t)k->table->params[i].numel * sizeof(float));
}

void mf_ranks_fail(mf_ranks *k) {
  if (k->relay) mf_comm_relay_fail(k->relay);
  if (k->xrelay) mf_comm_relay_fail(k->xrelay);
}

void mf_ranks_world(mf_ranks *k, mf_comm *comm) {
  memset(k, 0, sizeof *k);
  k->comm = comm;
  k->rank = mf_comm_rank(comm);
  k->size = mf_comm_size(comm);
  k->lrank = mf_comm_local_rank(comm);
  k->lsize = mf_comm_local_size(comm);
}

mf_status mf_ranks_init(mf_ranks *k, const mf_param_table *t, int64_t B, int64_t S) {
  const size_t n = (size_t)(t->n ? t->n : 1);
  MF_CHECK(mf_calloc(n, sizeof(int64_t), "the shard", (void **)&k->own_lo));
  MF_CHECK(mf_calloc(n, sizeof(int64_t), "the shard", (void **)&k->own_hi));
  MF_CHECK(mf_calloc(n, sizeof(mf_optim_buf), "the shard", (void **)&k->norm_bufs));
  MF_CHECK(mf_calloc(n, sizeof(double *), "the shard", (void **)&k->ext));
  const size_t routed = (size_t)(t->spec.layers * (t->spec.experts > 0 ? t->spec.experts : 1));
  MF_CHECK(mf_calloc(routed, sizeof(int64_t), "routing counts", (void **)&k->tokens));
  MF_CHECK(mf_calloc((size_t)(B * S), sizeof(int32_t), "token ids", (void **)&k->skip_ids));
  MF_CHECK(mf_calloc((size_t)(B * S), sizeof(int32_t), "targets", (void **)&k->skip_targets));
  shard(k, t);
  return MF_OK;
}

mf_status mf_ranks_share(mf_ranks *k, const mf_param_table *t, size_t home_bytes, const int64_t *norm_first,
                         int64_t norm_chunks) {
  MF_CHECK(mf_comm_shared_alloc(k->comm, home_bytes, "the node's host state", &k->home));
  MF_CHECK(mf_comm_shared_alloc(k->comm, (size_t)(norm_chunks > 0 ? norm_chunks : 1) * sizeof(double),
                                "the gradient norm's chunk sums", &k->sums));
  if (t->qhome_bytes > 0)
    MF_CHECK(mf_comm_shared_alloc(k->comm, (size_t)t->qhome_bytes, "the node's quantized base", &k->qhome));
  MF_CHECK(mf_comm_relay_create(k->comm, t->n, &k->relay));
  k->norm_first = norm_first;
  return MF_OK;
}

/* Where expert parallelism's groups lie: each within a node (its ranks consecutive there, world rank
 * order, as the exchanges count them), or one group of every rank over several nodes, whose nodes'
 * homes then each hold their own ranks' experts' gradients (k->foreign marks the others'). */
static mf_status groups_where(mf_ranks *k, const mf_program *p) {
  const int ep = (int)p->ep, nodes = mf_comm_nodes(k->comm);
  if (ep <= 1 || nodes <= 1) return MF_OK;
  int64_t *node = NULL;
  MF_CHECK(mf_calloc((size_t)k->size, sizeof(int64_t), "the ranks' nodes", (void **)&node));
  node[k->rank] = mf_comm_node(k->comm);
  mf_status st = mf_comm_allreduce_sum_i64(k->comm, node, (size_t)k->size);
  for (int r = 0; r < k->size && st == MF_OK && ep < k->size; r++)
    if (node[r] != node[r - r % ep])
      st = MF_ERR(MF_ERR_CONFIG,
                  "parallel.expert %d: ranks %d and %d share a group but not a node (mpirun placed the ranks "
                  "of a node apart: place them in order, e.g. --map-by slot)",
                  ep, r - r % ep, r);
  if (st == MF_OK && ep == k->size) {
    const mf_param_table *t = p->params;
    const int64_t per = p->spec.experts / ep;
    st = mf_calloc((size_t)(t->n ? t->n : 1), 1, "the other nodes' experts", (void **)&k->foreign);
    for (int64_t i = 0; i < t->n && st == MF_OK; i++) {
      const mf_param *q = &t->params[i];
      k->foreign[i] = q->expert >= 0 && !q->frozen && per > 0 && node[q->expert / per] != node[k->rank];
    }
    k->table = t;
  }
  free(node);
  return st;
}

mf_status mf_ranks_hooks(mf_ranks *k, mf_exec *x, const mf_program *p) {
  const mf_exec_param_hooks h = {k, NULL, hook_grad_home, hook_grad_wait};
  mf_exec_set_param_hooks(x, &h);
  mf_exec_set_grads_add(x, k->lrank > 0);
  if (!p->exchanges) return MF_OK;
  const mf_param_table *t = p->params;
  MF_CHECK(mf_calloc((size_t)(t->n ? t->n : 1), 1, "the experts of this rank", (void **)&k->own));
  for (int64_t i = 0; i < t->n; i++) k->own[i] = t->params[i].expert >= 0 && p->grad_tensor[i] >= 0;
  mf_exec_set_grads_own(x, k->own);
  MF_CHECK(groups_where(k, p));
  /* Groups of expert-parallel ranks in a node (data parallel beside it): an expert's owners add into its
   * sum group after group, each starting from the sum before it (mf_program.grad_seed). */
  const int ep = (int)p->ep, groups = ep < k->size ? k->lsize / ep : 1;
  if (ep > 1 && groups > 1)
    MF_CHECK(mf_comm_relay_create_at(k->comm, t->n, k->lrank / ep, groups, k->lrank - ep, &k->xrelay));
  return MF_OK;
}

mf_status mf_ranks_next_batches(mf_ranks *k, mf_loader *l, int64_t G, int32_t **ids, int32_t **targets) {
  for (int64_t m = 0; m < G * k->size; m++) {
    const int mine = m % k->size == k->rank;
    MF_CHECK(mf_loader_next(l, mine ? ids[m / k->size] : k->skip_ids,
                            mine ? targets[m / k->size] : k->skip_targets, NULL, NULL));
  }
  return MF_OK;
}

mf_status mf_ranks_reduce(mf_ranks *k, float *grads, size_t n, mf_step_result *sr, const int64_t *tokens,
                          size_t n_tokens, double aux_coef) {
  /* Every rank of the node has added its gradients: the sum is whole. */
  MF_CHECK(mf_comm_node_barrier(k->comm));
  if (mf_comm_nodes(k->comm) > 1) {
    if (mf_comm_is_leader(k->comm)) MF_CHECK(mf_comm_leaders_allreduce_sum_f32(k->comm, grads, n));
    MF_CHECK(mf_comm_node_barrier(k->comm));
  }
  /* The losses: each rank's are its share (divided by G x ranks) — added in
   * rank order, the bits one rank gets adding its micro-batches in order. */
  double v[2] = {sr->ce_loss, sr->aux_loss};
  MF_CHECK(mf_comm_allreduce_sum_f64(k->comm, v, 2));
  sr->ce_loss = v[0];
  sr->aux_loss = v[1];
  sr->loss = sr->ce_loss + aux_coef * sr->aux_loss;
  MF_CHECK(mf_comm_allreduce_sum_i64(k->comm, &sr->tokens, 1));
  memcpy(k->tokens, tokens, n_tokens * sizeof(int64_t));
  MF_CHECK(mf_comm_allreduce_sum_i64(k->comm, k->tokens, n_tokens));
  return MF_OK;
}

mf_status mf_ranks_norm(mf_ranks *k, const mf_param_table *t, float *g, const int64_t *tokens,
                        mf_threadpool *pool, double *norm) {
  double *sums = (double *)mf_comm_shared_ptr(k->sums);
  for (int64_t i = 0; i < t->n; i++) {
    const mf_param *p = &t->params[i];
    const int has = mf_updates_has_gradient(t, tokens, i);
    k->norm_bufs[i] = (mf_optim_buf){NULL, has ? (size_t)p->numel : 0};
    k->ext[i] = has ? sums + k->norm_first[i] : NULL;
    const int64_t lo = k->own_lo[i], hi = k->own_hi[i];
    if (!has || hi <= lo) continue;
    MF_CHECK(mf_optim_grad_chunk_sumsq(g + p->toff + lo, (size_t)(hi - lo), pool,
                                       sums + k->norm_first[i] + lo / (int64_t)MF_OPTIM_NORM_CHUNK));
  }
  MF_CHECK(mf_comm_node_barrier(k->comm));
  return mf_optim_grad_norm_ext(k->norm_bufs, (size_t)t->n, k->ext, pool, norm);
}

mf_status mf_ranks_scale(mf_ranks *k, const mf_param_table *t, float *g, const int64_t *tokens, double coef,
                         mf_threadpool *pool) {
  for (int64_t i = 0; i < t->n; i++) {
    const int64_t lo = k->own_lo[i], hi = k->own_hi[i];
    const int has = mf_updates_has_gradient(t, tokens, i) && hi > lo;
    k->norm_bufs[i] = (mf_optim_buf){has ? g + t->params[i].toff + lo : NULL, has ? (size_t)(hi - lo) : 0};
  }
  return mf_optim_grad_scale(k->norm_bufs, (size_t)t->n, coef, pool);
}

mf_status mf_ranks_updated(mf_ranks *k) {
  return mf_comm_node_barrier(k->comm);
}

uint64_t mf_ranks_process_pss(void) {
  FILE *f = fopen("/proc/self/smaps_rollup", "r");
  if (!f) return 0;
  char line[256];
  unsigned long long kb = 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "Pss: %llu kB", &kb) == 1) break;
  fclose(f);
  return (uint64_t)kb * 1024;
}
