/* Builds the step program (see program.h) and plans its device memory. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/model/program_build.h"

const char *mf_tensor_kind_name(mf_tensor_kind k) {
  static const char *const names[MF_T_KIND_COUNT_] = {"param",    "grad", "input", "act",
                                                      "act_grad", "stat", "work",  "opt"};
  return ((int)k >= 0 && k < MF_T_KIND_COUNT_) ? names[k] : "unknown";
}

/* The final norm, the aux loss's value and the cross-entropy. */
static void fwd_loss(mb *z) {
  pb *b = z->b;
  const ctx *c = z->c;
  mf_program *p = b->p;
  const mf_param_table *pt = c->pt;
  const int32_t m = z->m;
  const int64_t T = z->T, H = z->H, E = z->E, V = z->V, L = z->s->layers;
  mf_program_io *io = &p->io[m];
  int32_t hf = mf_pb_tensor(b, MF_T_ACT, MF_DTYPE_F32, T * H, m, -1, "mb%d.model.norm.out", m);
  int32_t rstdf = mf_pb_tensor(b, MF_T_STAT, MF_DTYPE_F32, T, m, -1, "mb%d.model.norm.rstd", m);
  mf_pb_rmsnorm_fwd(c, -1, "final norm", z->resid[L], mf_pb_P(c, MF_P_FINAL_NORM, -1), hf, rstdf, T, H);
  if (z->aux_counts >= 0) {
    mf_pop *o = mf_pb_op(b, MF_K_AUX_VALUE, MF_PHASE_LOSS, m, -1, "aux loss");
    SET(o, z->aux_counts, z->aux_psum, io->aux_scalars);
    INTS(o, E, z->aux_rows);
  } else {
    mf_pb_simple(c, MF_K_ZERO, MF_PHASE_LOSS, -1, "aux loss = 0", io->aux_scalars, -1, -1, -1, -1, 1);
  }
  const int64_t chunk = p->ce_chunk < V ? p->ce_chunk : V;
  int32_t ce_ws = mf_pb_tensor(b, MF_T_WORK, MF_DTYPE_F32, T * chunk, m, -1, "mb%d.loss.workspace", m);
  int32_t ce_lse = mf_pb_tensor(b, MF_T_STAT, MF_DTYPE_F32, T, m, -1, "mb%d.loss.lse", m);
  io->final_hidden = hf;
  int32_t dhf = p->forward_only ? -1
                                : mf_pb_tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, T * H, m, -1,
                                               "mb%d.model.norm.out.grad", m);
  {
    const int32_t lm = mf_param_lm_head(pt);
    io->ce_op = p->n_ops;
    mf_pop *o = mf_pb_op(b, MF_K_CROSS_ENTROPY, MF_PHASE_LOSS, m, -1, "cross-entropy");
    SET(o, hf, p->param_tensor[lm], io->targets, ce_ws, ce_lse, io->ce_scalars, p->forward_only ? -1 : dhf,
        p->forward_only ? -1 : p->grad_tensor[lm]);
    INTS(o, T, V, H, chunk);
    o->f[0] = MF_PROGRAM_LOSS_SCALE_RUNTIME;
    o->flops = 4.0 * 2.0 * (double)T * (double)V * (double)H; /* two logit passes + two gradient GEMMs */
  }
  z->hf = hf;
  z->rstdf = rstdf;
  z->dhf = dhf;
}

static void build_micro(pb *b, const mf_param_table *pt, int32_t m) {
  mf_program *p = b->p;
  const mf_model_spec *s = &pt->spec;
  const int64_t L = s->layers;
  const int32_t Li = (int32_t)L;
  ctx cx = {b, pt, s, m, p->B * p->S};
  const ctx *c = &cx;
  mb z = {b,
          c,
          s,
          m,
          -1,
          p->B,
          p->S,
          p->B * p->S,
          s->hidden,
          s->head_dim,
          s->heads,
          s->kv_heads,
          s->experts,
          s->top_k,
          s->expert_ffn,
          s->vocab,
          (float)mf_model_spec_attn_scale(s),
          mf_model_spec_rope_dim(s) == s->head_dim ? 0 : mf_model_spec_rope_dim(s),
          mf_model_spec_v_dim(s),
          -1,
          -1,
          0,
          NULL,
          NULL,
          -1,
          -1,
          -1};
  const int64_t T = z.T, H = z.H, E = z.E, V = z.V;
  int64_t n_moe = 0;
  for (int64_t l = 0; l < L; l++) n_moe += mf_model_spec_layer_is_moe(s, l);
  z.aux_rows = n_moe * T;

  mf_program_io *io = &p->io[m];
  io->ids = mf_pb_tensor(b, MF_T_INPUT, MF_DTYPE_I32, T, m, -1, "mb%d.input_ids", m);
  io->targets = mf_pb_tensor(b, MF_T_INPUT, MF_DTYPE_I32, T, m, -1, "mb%d.targets", m);
  io->positions = p->io[0].positions;
  io->ce_scalars = mf_pb_tensor(b, MF_T_WORK, MF_DTYPE_F64, 2, m, -1, "mb%d.loss.ce", m);
  io->aux_scalars = mf_pb_tensor(b, MF_T_WORK, MF_DTYPE_F64, 1, m, -1, "mb%d.loss.aux", m);
  z.pos = io->positions;
  b->stage = STAGE_EMBED;
  if (n_moe > 0 && s->router != MF_ROUTER_SIGMOID_GROUP) { /* the sigmoid router has no aux loss */
    z.aux_counts = mf_pb_tensor(b, MF_T_STAT, MF_DTYPE_I64, E, m, -1, "mb%d.aux.counts", m);
    z.aux_psum = mf_pb_tensor(b, MF_T_STAT, MF_DTYPE_F64, E, m, -1, "mb%d.aux.psum", m);
    mf_pb_simple(c, MF_K_ZERO, MF_PHASE_FWD, -1, "aux counts = 0", z.aux_counts, -1, -1, -1, -1, E);
    mf_pb_simple(c, MF_K_ZERO, MF_PHASE_FWD, -1, "aux psum = 0", z.aux_psum, -1, -1, -1, -1, E);
  }
  z.resid = (int32_t *)calloc((size_t)L + 1, sizeof(int32_t));
  z.A = (layer_acts *)calloc((size_t)L, sizeof(layer_acts));
  if (!z.resid || !z.A) {
    free(z.resid);
    free(z.A);
    b->st = MF_ERR(MF_ERR_OUT_OF_MEMORY, "step program: out of memory");
    return;
  }
  int32_t *resid = z.resid;
  resid[0] = mf_pb_tensor(b, MF_T_ACT, MF_DTYPE_F32, T * H, m, -1, "mb%d.model.embed_tokens.out", m);
  {
    mf_pop *o = mf_pb_op(b, MF_K_EMBED_FWD, MF_PHASE_FWD, m, -1, "embed");
    SET(o, io->ids, mf_pb_P(c, MF_P_EMBED, -1), resid[0]);
    INTS(o, T, V, H);
  }
  for (int32_t l = 0; l < Li; l++) {
    b->stage = STAGE_FWD(l);
    mf_pb_attention_fwd(&z, l);
    if (mf_model_spec_layer_is_moe(s, l))
      mf_pb_moe_fwd(&z, l);
    else
      mf_pb_dense_fwd(&z, l);
    mf_pb_simple(c, MF_K_ADD, MF_PHASE_FWD, l, "mlp residual", z.A[l].hmid, resid[l + 1], -1, -1, -1, T * H);
  }
  b->stage = STAGE_LOSS(Li);
  fwd_loss(&z);
  if (!p->forward_only) {
    /* Backward. gres is the gradient of the residual stream, updated layer by layer. */
    b->stage = STAGE_NORM_BWD(Li);
    int32_t gres = mf_pb_tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, T * H, m, -1, "mb%d.residual.grad", m);
    mf_pb_rmsnorm_bwd(c, -1, "final norm", z.dhf, resid[L], mf_pb_P(c, MF_P_FINAL_NORM, -1), z.rstdf, gres,
                      mf_pb_G(c, MF_P_FINAL_NORM, -1), T, H, 0);
    for (int32_t l = Li - 1; l >= 0; l--) {
      b->stage = STAGE_BWD(Li, l);
      int32_t dxn2 = mf_pb_tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, T * H, m, l,
                                  LNAME "post_attention_layernorm.out.grad", m, l);
      if (mf_model_spec_layer_is_moe(s, l))
        mf_pb_moe_bwd(&z, l, gres, dxn2);
      else
        mf_pb_dense_bwd(&z, l, gres, dxn2);
      mf_pb_attention_bwd(&z, l, gres, dxn2);
    }
    b->stage = STAGE_EMBED_BWD(Li);
    if (mf_pb_G(c, MF_P_EMBED, -1) >= 0) { /* else frozen */
      mf_pop *o = mf_pb_op(b, MF_K_EMBED_BWD, MF_PHASE_BWD, m, -1, "embed bwd");
      SET(o, io->ids, gres, mf_pb_G(c, MF_P_EMBED, -1));
      INTS(o, T, V, H);
    }
  }
  free(z.resid);
  free(z.A);
}

/* The optimizer on the device, after the backward (program.h MF_PHASE_NORM,
 * MF_PHASE_OPTIM): every parameter's norm chunk sums, then every parameter's
 * update, in parameter order. The planner runs them only for the parameters
 * whose optimizer it places on the device. */
static void build_optimizer(pb *b, const mf_param_table *pt) {
  mf_program *p = b->p;
  const size_t n = (size_t)(pt->n ? pt->n : 1);
  p->state_tensor = (int32_t *)malloc(n * sizeof(int32_t));
  p->sumsq_op = (int32_t *)malloc(n * sizeof(int32_t));
  p->adamw_op = (int32_t *)malloc(n * sizeof(int32_t));
  p->norm_first = (int64_t *)malloc(n * sizeof(int64_t));
  if (!p->state_tensor || !p->sumsq_op || !p->adamw_op || !p->norm_first) {
    b->st = MF_ERR(MF_ERR_OUT_OF_MEMORY, "step program: out of memory");
    return;
  }
  const int64_t chunk = 65536; /* MF_OPTIM_NORM_CHUNK (kernels/backend.h MF_K_GRAD_SUMSQ) */
  p->norm_chunks = 0;
  for (int64_t i = 0; i < pt->n; i++) { /* a frozen parameter has no chunk */
    p->norm_first[i] = p->norm_chunks;
    if (!pt->params[i].frozen) p->norm_chunks += (pt->params[i].numel + chunk - 1) / chunk;
  }
  b->stage = INT32_MAX;
  p->norm_sums = mf_pb_tensor(b, MF_T_WORK, MF_DTYPE_F64, p->norm_chunks > 0 ? p->norm_chunks : 1, -1, -1,
                              "optimizer.norm_chunk_sums");
  const size_t ms = mf_dtype_size(p->moments);
  for (int64_t i = 0; i < pt->n; i++) p->state_tensor[i] = p->sumsq_op[i] = p->adamw_op[i] = -1;
  for (int64_t i = 0; i < pt->n && b->st == MF_OK; i++) {
    const mf_param *q = &pt->params[i];
    if (p->grad_tensor[i] < 0) continue; /* frozen, or another expert-parallel rank's expert */
    int32_t t = mf_pb_tensor(b, MF_T_OPT, p->moments, 2 * q->numel, -1, q->layer, "adam.%s", q->name);
    if (t < 0) return;
    /* BF16 storage: the fp32 master beside the moments (cuda). */
    p->tensors[t].bytes = (size_t)q->numel * (2 * ms + (p->storage == MF_DTYPE_BF16 ? 4 : 0));
    p->tensors[t].param = (int32_t)i;
    p->state_tensor[i] = t;
  }
  for (int64_t i = 0; i < pt->n && b->st == MF_OK; i++) {
    const mf_param *q = &pt->params[i];
    if (p->grad_tensor[i] < 0) continue;
    mf_pop *o = mf_pb_op(b, MF_K_GRAD_SUMSQ, MF_PHASE_NORM, -1, q->layer, "norm %s", q->name);
    if (b->st != MF_OK) return;
    o->t[0] = p->grad_tensor[i];
    o->t[1] = p->norm_sums;
    o->i[0] = q->numel;
    o->i[1] = p->norm_first[i];
    p->sumsq_op[i] = p->n_ops - 1;
  }
  for (int64_t i = 0; i < pt->n && b->st == MF_OK; i++) {
    const mf_param *q = &pt->params[i];
    if (p->grad_tensor[i] < 0) continue;
    mf_pop *o = mf_pb_op(b, MF_K_ADAMW, MF_PHASE_OPTIM, -1, q->layer, "adamw %s", q->name);
    if (b->st != MF_OK) return;
    o->t[0] = p->param_tensor[i];
    o->t[1] = p->grad_tensor[i];
    o->t[2] = p->state_tensor[i];
    o->i[0] = q->numel;
    o->i[1] = 0; /* t: the executor's, at run time, as lr, coef and the rest of f[] */
    o->i[2] = p->moments == MF_DTYPE_BF16;
    p->adamw_op[i] = p->n_ops - 1;
  }
}

/* Each op's operand roles (mf_pop.reads, writes, writes_experts), derived
 * here once so that the planner and the executor never re-derive them. */
static void set_roles(mf_program *p) {
  for (int32_t k = 0; k < p->n_ops; k++) {
    mf_pop *o = &p->ops[k];
    mf_kernel_call c;
    memset(&c, 0, sizeof c);
    c.kind = o->kind;
    memcpy(c.i, o->i, sizeof c.i);
    o->reads = mf_kernel_reads(&c);
    o->writes = mf_kernel_writes(&c);
    o->writes_experts = (uint8_t)(mf_kernel_writes_experts(o->kind) != 0);
  }
}

static void compute_lifetimes(mf_program *p) {
  for (int32_t k = 0; k < p->n_ops; k++) {
    const mf_pop *o = &p->ops[k];
    int32_t ids[MF_KBUF_MAX];
    for (int i = 0; i < MF_KBUF_MAX; i++) ids[i] = o->t[i];
    for (int i = 0; i < MF_KBUF_MAX; i++) {
      if (ids[i] < 0) continue;
      mf_ptensor *t = &p->tensors[ids[i]];
      if (t->first_op < 0) t->first_op = k;
      t->last_op = k;
    }
    if (o->experts_at >= 0)
      for (int64_t e = 0; e < p->spec.experts; e++) {
        if (p->id_pool[o->experts_at + e] < 0) continue; /* a cold expert's adapter: none */
        mf_ptensor *t = &p->tensors[p->id_pool[o->experts_at + e]];
        if (t->first_op < 0) t->first_op = k;
        t->last_op = k;
      }
  }
  /* A micro-batch's inputs are uploaded before its first op, so they live from there. */
  for (int32_t i = 0; i < p->n_tensors; i++) {
    mf_ptensor *t = &p->tensors[i];
    if (t->kind != MF_T_INPUT || t->micro < 0) continue;
    for (int32_t k = 0; k < p->n_ops; k++)
      if (p->ops[k].micro == t->micro) {
        if (t->first_op < 0 || k < t->first_op) t->first_op = k;
        break;
      }
  }
  /* Parameters, gradients and positions live for the whole step. */
  for (int32_t i = 0; i < p->n_tensors; i++) {
    mf_ptensor *t = &p->tensors[i];
    if (t->kind == MF_T_PARAM || t->kind == MF_T_GRAD || t->micro < 0) {
      t->first_op = 0;
      t->last_op = p->n_ops - 1;
    }
  }
}

/* p->use_start and p->use_ops (see program.h): counted, then filled. */
static mf_status index_uses(mf_program *p) {
  const int32_t nt = p->n_tensors;
  int32_t *last = NULL;
  MF_CHECK(mf_calloc((size_t)nt + 1, sizeof(int32_t), "the program's tensor uses", (void **)&p->use_start));
  MF_CHECK(mf_malloc(((size_t)nt + 1) * sizeof(int32_t), "the program's tensor uses", (void **)&last));
  for (int pass = 0; pass < 2; pass++) {
    for (int32_t t = 0; t < nt; t++) last[t] = -1;
    for (int32_t k = 0; k < p->n_ops; k++) {
      const mf_pop *o = &p->ops[k];
      const int64_t E = o->experts_at >= 0 ? p->spec.experts : 0;
      for (int64_t j = 0; j < MF_KBUF_MAX + E; j++) {
        const int32_t t = j < MF_KBUF_MAX ? o->t[j] : p->id_pool[o->experts_at + (j - MF_KBUF_MAX)];
        if (t < 0 || last[t] == k) continue;
        last[t] = k;
        if (pass == 0)
          p->use_start[t + 1]++;
        else
          p->use_ops[p->use_start[t]++] = k;
      }
    }
    if (pass == 0) {
      for (int32_t t = 0; t < nt; t++) p->use_start[t + 1] += p->use_start[t];
      const mf_status st = mf_malloc(((size_t)p->use_start[nt] + 1) * sizeof(int32_t),
                                     "the program's tensor uses", (void **)&p->use_ops);
      if (st != MF_OK) {
        free(last);
        return st;
      }
    }
  }
  /* The fill advanced each start to the next tensor's: shift back. */
  for (int32_t t = nt; t > 0; t--) p->use_start[t] = p->use_start[t - 1];
  p->use_start[0] = 0;
  free(last);
  return MF_OK;
}

const char *mf_program_order_name(mf_program_order o) {
  return o == MF_ORDER_LAYER_MAJOR ? "layer-major" : "micro-batch-major";
}

typedef struct op_key {
  int32_t stage, micro, k;
} op_key;

static int cmp_op_key(const void *a, const void *b) {
  const op_key *x = (const op_key *)a, *y = (const op_key *)b;
  if (x->stage != y->stage) return x->stage < y->stage ? -1 : 1;
  if (x->micro != y->micro) return x->micro < y->micro ? -1 : 1;
  return x->k < y->k ? -1 : x->k > y->k;
}

/* Layer-major order: the ops sorted by (stage, micro-batch), keeping build
 * order inside each (the build order is micro-batch-major), then every op
 * index kept outside the op list moved with its op. Runs before lifetimes. */
static mf_status reorder_layer_major(mf_program *p, const int32_t *stage_of) {
  const int32_t n = p->n_ops;
  op_key *key = (op_key *)malloc((size_t)(n + 1) * sizeof *key);
  mf_pop *ops = (mf_pop *)malloc((size_t)(n + 1) * sizeof *ops);
  int32_t *moved_to = (int32_t *)malloc((size_t)(n + 1) * sizeof *moved_to);
  if (!key || !ops || !moved_to) {
    free(key);
    free(ops);
    free(moved_to);
    return MF_ERR(MF_ERR_OUT_OF_MEMORY, "step program: out of memory");
  }
  for (int32_t k = 0; k < n; k++) key[k] = (op_key){stage_of[k], p->ops[k].micro, k};
  qsort(key, (size_t)n, sizeof *key, cmp_op_key);
  for (int32_t j = 0; j < n; j++) {
    ops[j] = p->ops[key[j].k];
    moved_to[key[j].k] = j;
  }
  free(p->ops);
  p->ops = ops;
  for (int64_t m = 0; m < p->G; m++) p->io[m].ce_op = moved_to[p->io[m].ce_op];
  free(key);
  free(moved_to);
  return MF_OK;
}

int mf_program_owns_expert(const mf_program *p, int64_t e) {
  if (p->ep <= 1) return 1;
  const int64_t per = p->spec.experts / p->ep;
  return per > 0 && e / per == p->ep_rank;
}

int mf_program_holds_param(const mf_program *p, int64_t i) {
  const int32_t e = p->params->params[i].expert;
  return e < 0 || mf_program_owns_expert(p, e);
}

/* The gradients summed by source rank's parts (an op with segments): in an
 * expert-parallel group after the first they start from the groups before's
 * sum (mf_program.grad_seed). */
static mf_status mark_seeds(mf_program *p) {
  p->grad_seed = (uint8_t *)calloc((size_t)(p->params->n ? p->params->n : 1), 1);
  if (!p->grad_seed) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "step program: out of memory");
  for (int32_t k = 0; k < p->n_ops; k++) {
    const mf_pop *o = &p->ops[k];
    if (o->kind != MF_K_EXPERT_BWD_WEIGHT && o->kind != MF_K_EXPERT_BIAS_BWD) continue;
    if (o->t[3] < 0) continue; /* no parts */
    if (o->kind == MF_K_EXPERT_BIAS_BWD) {
      p->grad_seed[p->tensors[o->t[2]].param] = 1;
      continue;
    }
    for (int64_t e = 0; e < p->spec.experts; e++) {
      const int32_t g = p->id_pool[o->experts_at + e];
      if (g >= 0) p->grad_seed[p->tensors[g].param] = 1;
    }
  }
  return MF_OK;
}

/* What expert parallelism needs of the model and its table (mf_program_opts.ep). */
static mf_status ep_check(const mf_param_table *pt, const mf_program_opts *opts) {
  const mf_model_spec *s = &pt->spec;
  const int64_t ep = opts->ep > 1 ? opts->ep : 1;
  int64_t n_moe = 0;
  for (int64_t l = 0; l < s->layers; l++) n_moe += mf_model_spec_layer_is_moe(s, l);
  if (n_moe == 0 || s->experts < 1)
    return MF_ERR(MF_ERR_CONFIG, "parallel.expert %lld: the model has no routed experts to spread over ranks",
                  (long long)ep);
  if (s->experts % ep)
    return MF_ERR(MF_ERR_CONFIG,
                  "parallel.expert %lld does not divide the model's %lld routed experts: each rank owns an "
                  "equal share",
                  (long long)ep, (long long)s->experts);
  if (opts->ep_rank < 0 || opts->ep_rank >= ep)
    return MF_ERR(MF_ERR_INVALID_ARG, "step program: expert-parallel rank %lld of %lld",
                  (long long)opts->ep_rank, (long long)ep);
  const int64_t ranks = opts->ranks > 1 ? opts->ranks : 1;
  if (opts->ep_group < 0 || (ep > 1 && (ranks % ep || opts->ep_group >= ranks / ep)))
    return MF_ERR(MF_ERR_INVALID_ARG,
                  "step program: expert-parallel group %lld of %lld ranks in groups of %lld",
                  (long long)opts->ep_group, (long long)ranks, (long long)ep);
  return MF_OK;
}

mf_status mf_program_build(const mf_param_table *pt, const mf_program_opts *opts, mf_program **out) {
  *out = NULL;
  const mf_model_spec *s = &pt->spec;
  if (opts->micro_batch < 1 || opts->seq_len < 1 || opts->grad_accum < 1)
    return MF_ERR(MF_ERR_INVALID_ARG, "step program: batch sizes must be positive (B=%lld S=%lld G=%lld)",
                  (long long)opts->micro_batch, (long long)opts->seq_len, (long long)opts->grad_accum);
  if (opts->seq_len > s->max_seq)
    return MF_ERR(MF_ERR_CONFIG, "data.seq_len %lld exceeds the model's max_seq %lld",
                  (long long)opts->seq_len, (long long)s->max_seq);
  if (s->clip_qkv > 0)
    return MF_ERR(MF_ERR_UNSUPPORTED, "model: clip_qkv (OLMoE) is not implemented yet; set it to 0");
  if (s->router_jitter > 0)
    return MF_ERR(MF_ERR_UNSUPPORTED, "model: router jitter noise is not implemented yet; set it to 0");
  if (s->experts > 65536) return MF_ERR(MF_ERR_UNSUPPORTED, "model: more than 65536 experts");
  if (s->router == MF_ROUTER_SIGMOID_GROUP && opts->aux_coef != 0)
    return MF_ERR(
        MF_ERR_CONFIG,
        "train.aux_loss_coef %g: %s's router has no load-balancing loss (its e_score_correction_bias "
        "balances it); leave it null or 0",
        opts->aux_coef, mf_family_name(s->family));
  if (opts->order != MF_ORDER_MICRO_MAJOR && opts->order != MF_ORDER_LAYER_MAJOR)
    return MF_ERR(MF_ERR_INVALID_ARG, "step program: unknown micro-batch order %d", (int)opts->order);
  if (opts->ep > 1 || opts->ep_self) MF_CHECK(ep_check(pt, opts));
  if (opts->moments != MF_DTYPE_INVALID && opts->moments != MF_DTYPE_F32 && opts->moments != MF_DTYPE_BF16)
    return MF_ERR(MF_ERR_INVALID_ARG, "step program: AdamW moments must be F32 or BF16 (got %s)",
                  mf_dtype_name(opts->moments));
  if (opts->storage != MF_DTYPE_INVALID && opts->storage != MF_DTYPE_F32 && opts->storage != MF_DTYPE_BF16)
    return MF_ERR(MF_ERR_INVALID_ARG, "step program: device storage must be F32 or BF16 (got %s)",
                  mf_dtype_name(opts->storage));
  const double tokens = (double)opts->micro_batch * (double)opts->seq_len * (double)s->top_k;
  if (tokens > 2147483647.0)
    return MF_ERR(MF_ERR_UNSUPPORTED,
                  "step program: micro_batch x seq_len x top_k is too large for 32-bit rows");

  mf_program *p = (mf_program *)calloc(1, sizeof *p);
  if (!p) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "step program: out of memory");
  p->params = pt;
  p->spec = *s;
  p->B = opts->micro_batch;
  p->S = opts->seq_len;
  p->G = opts->grad_accum;
  p->ranks = opts->ranks > 1 ? opts->ranks : 1;
  p->node_ranks = opts->node_ranks > 0 && opts->node_ranks < p->ranks ? opts->node_ranks : p->ranks;
  p->ep = opts->ep > 1 ? opts->ep : 1;
  p->ep_rank = p->ep > 1 ? opts->ep_rank : 0;
  p->exchanges = p->ep > 1 || opts->ep_self;
  p->ep_group = p->ep > 1 ? opts->ep_group : 0;
  p->aux_coef = opts->aux_coef;
  p->ce_chunk = opts->ce_chunk > 0 ? opts->ce_chunk : 4096;
  p->forward_only = opts->forward_only;
  p->order = opts->order;
  p->storage = opts->storage == MF_DTYPE_BF16 ? MF_DTYPE_BF16 : MF_DTYPE_F32;
  p->moments = opts->moments == MF_DTYPE_BF16 ? MF_DTYPE_BF16 : MF_DTYPE_F32;
  p->norm_sums = -1;
  p->io = (mf_program_io *)calloc((size_t)p->G, sizeof(mf_program_io));
  p->param_tensor = (int32_t *)malloc((size_t)pt->n * sizeof(int32_t));
  p->grad_tensor = (int32_t *)malloc((size_t)pt->n * sizeof(int32_t));
  pb b;
  memset(&b, 0, sizeof b);
  b.p = p;
  b.stage = STAGE_SETUP;
  b.st = MF_OK;
  if (!p->io || !p->param_tensor || !p->grad_tensor)
    b.st = MF_ERR(MF_ERR_OUT_OF_MEMORY, "step program: out of memory");
  for (int64_t i = 0; i < pt->n && b.st == MF_OK; i++) {
    const mf_param *q = &pt->params[i];
    /* a weight stored quantized: its blob's bytes (src/core/qformat.h) */
    p->param_tensor[i] =
        q->quant ? mf_pb_tensor(&b, MF_T_PARAM, MF_DTYPE_U8, q->qbytes, -1, q->layer, "%s", q->name)
                 : mf_pb_tensor(&b, MF_T_PARAM, MF_DTYPE_F32, q->numel, -1, q->layer, "%s", q->name);
    /* not held: another expert-parallel rank's expert, whose gradient is that rank's */
    p->grad_tensor[i] =
        p->forward_only || q->frozen || !mf_program_holds_param(p, i)
            ? -1
            : mf_pb_tensor(&b, MF_T_GRAD, MF_DTYPE_F32, q->numel, -1, q->layer, "grad.%s", q->name);
    if (b.st == MF_OK) {
      p->tensors[p->param_tensor[i]].param = (int32_t)i;
      if (p->grad_tensor[i] >= 0) p->tensors[p->grad_tensor[i]].param = (int32_t)i;
    }
  }
  if (b.st == MF_OK)
    p->io[0].positions = mf_pb_tensor(&b, MF_T_INPUT, MF_DTYPE_I32, p->B * p->S, -1, -1, "positions");
  /* Gradients start at zero and accumulate over the micro-batches. */
  for (int64_t i = 0; i < pt->n && b.st == MF_OK && !p->forward_only; i++) {
    if (p->grad_tensor[i] < 0) continue; /* frozen */
    mf_pop *o = mf_pb_op(&b, MF_K_ZERO, MF_PHASE_SETUP, -1, pt->params[i].layer, "zero grad");
    o->t[0] = p->grad_tensor[i];
  }
  for (int32_t m = 0; m < (int32_t)p->G && b.st == MF_OK; m++) build_micro(&b, pt, m);
  if (b.st == MF_OK && p->order == MF_ORDER_LAYER_MAJOR) {
    b.st = reorder_layer_major(p, b.stage_of);
    b.cap_o = p->n_ops + 1; /* the reordered list's room */
  }
  if (b.st == MF_OK && !p->forward_only) build_optimizer(&b, pt);
  if (b.st == MF_OK && b.n_pending)
    b.st = MF_ERR(MF_ERR_INTERNAL, "step program: a dequantized weight that no op reads");
  free(b.stage_of);
  free(b.pending);
  if (b.st != MF_OK) {
    mf_program_free(p);
    return b.st;
  }
  for (int32_t k = 0; k < p->n_ops; k++) p->flops += p->ops[k].flops;
  if (p->ep_group > 0 && !p->forward_only && (b.st = mark_seeds(p)) != MF_OK) {
    mf_program_free(p);
    return b.st;
  }
  set_roles(p);
  compute_lifetimes(p);
  const mf_status st = index_uses(p);
  if (st != MF_OK) {
    mf_program_free(p);
    return st;
  }
  *out = p;
  return MF_OK;
}

void mf_program_free(mf_program *p) {
  if (!p) return;
  free(p->tensors);
  free(p->ops);
  free(p->id_pool);
  free(p->io);
  free(p->param_tensor);
  free(p->grad_tensor);
  free(p->grad_seed);
  free(p->state_tensor);
  free(p->sumsq_op);
  free(p->adamw_op);
  free(p->norm_first);
  free(p->use_start);
  free(p->use_ops);
  free(p);
}

void mf_program_dump(const mf_program *p, FILE *f) {
  fprintf(f, "program: %d tensors, %d ops, %.3g FLOPs, %s, %s storage\n", p->n_tensors, p->n_ops, p->flops,
          mf_program_order_name(p->order), mf_dtype_name(p->storage));
  for (int32_t i = 0; i < p->n_tensors; i++) {
    const mf_ptensor *t = &p->tensors[i];
    fprintf(f, "  t%-5d %-8s %-4s %10zu B  ops [%d, %d]  %s\n", i, mf_tensor_kind_name(t->kind),
            mf_dtype_name(t->dtype), t->bytes, t->first_op, t->last_op, t->name);
  }
  for (int32_t k = 0; k < p->n_ops; k++) {
    const mf_pop *o = &p->ops[k];
    fprintf(f, "  op%-5d %-18s mb%d  %s\n", k, mf_kernel_name(o->kind), o->micro, o->label);
  }
}
