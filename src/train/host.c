/* The host state of a run (train_internal.h): fp32 master weights, gradient
 * sums and AdamW moments, each in host memory or — the parts the plan's host
 * accounting spills past memory.host_limit (planner/host.h: moments first,
 * then the master weights, then gradient sums that land once a step) — in a
 * file in memory.nvme_dir, mapped (src/core/hostbuf.h): the page cache moves
 * the pages, the bits are the same. A part spills whole when any of it does.
 * Gradient sums and moments are the trained parameters' only (at mf_param.toff;
 * LoRA's frozen base has neither). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/train/train_internal.h"

void mf_host_state_free(mf_host_state *h) {
  if (h->node) { /* views into the node's shared memory: its owner frees it */
    memset(h, 0, sizeof *h);
    return;
  }
  mf_hostbuf_free(&h->master);
  mf_hostbuf_free(&h->grads);
  mf_hostbuf_free(&h->m);
  mf_hostbuf_free(&h->v);
  mf_hostbuf_free(&h->working);
}

static void log_spill(const mf_host_state *h, const char *dir, size_t n, size_t nt) {
  const size_t ms = mf_dtype_size(h->moments);
  char a[32], b[32], c[32], d[32], e[32], f[32];
  MF_LOGI("train",
          "host state on NVMe (%s, files unlinked): %s%s%s%s%s%s%s%s (the plan spills %s past "
          "memory.host_limit %s)",
          dir, h->spill_moments ? "AdamW moments " : "",
          h->spill_moments ? mf_format_bytes(2 * nt * ms, a, sizeof a) : "",
          h->spill_master ? (h->spill_moments ? ", master weights " : "master weights ") : "",
          h->spill_master ? mf_format_bytes(n * sizeof(float), b, sizeof b) : "",
          h->spill_grads ? (h->spill_moments || h->spill_master ? ", gradient sums " : "gradient sums ") : "",
          h->spill_grads ? mf_format_bytes(nt * sizeof(float), c, sizeof c) : "",
          h->spill_working ? (h->spill_moments || h->spill_master || h->spill_grads ? ", bf16 working copy "
                                                                                    : "bf16 working copy ")
                           : "",
          h->spill_working ? mf_format_bytes(n * sizeof(uint16_t), f, sizeof f) : "",
          mf_format_bytes(mf_host_spill_bytes(&h->u), d, sizeof d),
          mf_format_bytes(h->u.host_limit, e, sizeof e));
}

/* train.adam_moments as a dtype. */
static mf_dtype moments_of(const mf_config *cfg) {
  return cfg->train.adam_moments == MF_CONFIG_MOMENTS_BF16 ? MF_DTYPE_BF16 : MF_DTYPE_F32;
}

mf_status mf_host_state_init(mf_host_state *h, const mf_config *cfg, const mf_param_table *t,
                             const mf_run_plan *rp, float **w, int *w_owned, int quiet) {
  memset(h, 0, sizeof *h);
  const char *dir = cfg->memory.nvme_dir;
  h->u = rp->host;
  h->moments = moments_of(cfg);
  h->spill_moments = h->u.spill_moment_bytes > 0;
  h->spill_master = h->u.spill_master_bytes + h->u.spill_cold_master_bytes > 0;
  h->release_master = h->u.spill_master_bytes > 0; /* host-updated master pages spill too */
  h->spill_grads = h->u.spill_grad_bytes > 0;
  h->spill_working = h->u.spill_working_bytes > 0;
  if (h->u.unplaced_bytes > 0) {
    char need[32], lim[32], un[32];
    MF_LOGW("train",
            "host memory: the plan needs %s against memory.host_limit %s and %s fits nowhere (%s); the run may "
            "fail to allocate or swap",
            mf_format_bytes(h->u.total_bytes, need, sizeof need), mf_format_bytes(h->u.host_limit, lim, sizeof lim),
            mf_format_bytes(h->u.unplaced_bytes, un, sizeof un),
            h->u.nvme ? "NVMe spill cannot take it" : "no memory.nvme_dir or the profile has no NVMe bandwidth");
  }
  /* gradient sums and moments: the trained parameters' (all but LoRA's frozen base) */
  const size_t n = (size_t)t->total_numel, nt = (size_t)t->trainable_numel, ms = mf_dtype_size(h->moments);
  MF_CHECK(mf_hostbuf_alloc(h->spill_grads ? dir : NULL, "gradients", nt * sizeof(float), &h->grads));
  MF_CHECK(mf_hostbuf_alloc(h->spill_moments ? dir : NULL, "adam-m", nt * ms, &h->m));
  MF_CHECK(mf_hostbuf_alloc(h->spill_moments ? dir : NULL, "adam-v", nt * ms, &h->v));
  if (rp->storage == MF_DTYPE_BF16) /* filled by the run (mf_run_round_working) */
    MF_CHECK(mf_hostbuf_alloc(h->spill_working ? dir : NULL, "bf16-working-copy", n * sizeof(uint16_t),
                              &h->working));
  h->base_bf16 = mf_lora_base_bf16(t, rp->storage, rp->prog->ranks);
  if (h->base_bf16) {
    /* The master weights' array in the table's layout, of which only the
     * trained parameters' pages are ever written (anonymous memory commits
     * a page at its first store): the frozen base is loaded into the bf16
     * working copy alone (mf_run_load_weights_home). */
    if (*w) return MF_ERR(MF_ERR_INTERNAL, "host state: a bf16 base at home takes no loaded weights");
    if (h->spill_master)
      return MF_ERR(
          MF_ERR_UNSUPPORTED,
          "memory.host_limit: the plan spills the adapters' master weights to NVMe beside a bf16 base, "
          "which is not built; raise memory.host_limit");
    MF_CHECK(mf_hostbuf_alloc(NULL, "master-weights", n * sizeof(float), &h->master));
    *w = (float *)h->master.ptr;
    *w_owned = 0;
  } else if (h->spill_master) {
    MF_CHECK(mf_hostbuf_alloc(dir, "master-weights", n * sizeof(float), &h->master));
    if (n) memcpy(h->master.ptr, *w, n * sizeof(float));
    free(*w);
    *w = (float *)h->master.ptr;
    *w_owned = 0;
  }
  if (!quiet && (h->spill_master || h->spill_grads || h->spill_moments || h->spill_working))
    log_spill(h, dir, n, nt);
  return MF_OK;
}

void mf_host_state_release(mf_host_state *h, const mf_param_table *t, int64_t i) {
  const mf_param *p = &t->params[i];
  if (p->frozen) return;
  const size_t o = (size_t)p->offset, ot = (size_t)p->toff, n = (size_t)p->numel,
               ms = mf_dtype_size(h->moments);
  if (h->spill_moments) {
    (void)mf_hostbuf_advise(&h->m, ot * ms, n * ms, 0);
    (void)mf_hostbuf_advise(&h->v, ot * ms, n * ms, 0);
  }
  if (h->release_master) (void)mf_hostbuf_advise(&h->master, o * sizeof(float), n * sizeof(float), 0);
  if (h->spill_grads) (void)mf_hostbuf_advise(&h->grads, ot * sizeof(float), n * sizeof(float), 0);
  if (h->spill_working) (void)mf_hostbuf_advise(&h->working, o * sizeof(uint16_t), n * sizeof(uint16_t), 0);
}

/* A view of `bytes` at *at in the node's block (64-byte aligned parts; a
 * NULL base: only the size). */
static void carve(char *base, size_t *at, size_t bytes, mf_hostbuf *b) {
  memset(b, 0, sizeof *b);
  b->ptr = base && bytes ? base + *at : NULL;
  b->bytes = bytes;
  *at += (bytes + 63) & ~(size_t)63;
}

/* The node's block: master weights, gradient sums, m, v, the bf16 working
 * copy, as views into base (NULL: none); returns its bytes. */
static size_t lay_out(mf_host_state *h, const mf_param_table *t, const mf_run_plan *rp, char *base) {
  const size_t n = (size_t)t->total_numel, nt = (size_t)t->trainable_numel, ms = mf_dtype_size(h->moments);
  size_t at = 0;
  carve(base, &at, n * sizeof(float), &h->master);
  carve(base, &at, nt * sizeof(float), &h->grads);
  carve(base, &at, nt * ms, &h->m);
  carve(base, &at, nt * ms, &h->v);
  carve(base, &at, rp->storage == MF_DTYPE_BF16 ? n * sizeof(uint16_t) : 0, &h->working);
  return at;
}

mf_status mf_host_state_node_bytes(const mf_config *cfg, const mf_param_table *t, const mf_run_plan *rp,
                                   size_t *bytes) {
  const uint64_t spill = mf_host_spill_bytes(&rp->host);
  if (spill > 0) {
    char b[32];
    return MF_ERR(MF_ERR_UNSUPPORTED,
                  "memory.host_limit: the plan spills %s of host state to NVMe, which a run of several ranks "
                  "cannot do yet (their one copy of the state is in the node's shared memory): raise "
                  "memory.host_limit or train with one rank",
                  mf_format_bytes(spill, b, sizeof b));
  }
  mf_host_state h;
  memset(&h, 0, sizeof h);
  h.moments = moments_of(cfg);
  *bytes = lay_out(&h, t, rp, NULL);
  return MF_OK;
}

void mf_host_state_init_node(mf_host_state *h, const mf_config *cfg, const mf_param_table *t,
                             const mf_run_plan *rp, void *block, float **w) {
  memset(h, 0, sizeof *h);
  h->u = rp->host;
  h->node = 1;
  h->moments = moments_of(cfg);
  lay_out(h, t, rp, (char *)block);
  *w = (float *)h->master.ptr;
}
