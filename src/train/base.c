/* A run's base identity and its checks (base.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/ckpt/ckpt.h"
#include "src/train/base.h"

/* ------------------------------------------------------------ checksums */

typedef struct sum_job {
  const mf_param_table *t;
  const float *w;
  const uint16_t *home;
  int bf16;
  const int32_t *idx; /* [b->n] the parameter of each record tensor */
  mf_base_id *b;
} sum_job;

#define SUM_CHUNK 4096

/* Parameter p's checksum: its bytes as held (fp32 in w, bf16 in home, or a
 * quantized weight's blob), or with bf16 and no home its fp32 values rounded,
 * chunk by chunk. */
static uint64_t param_sum(const sum_job *j, const mf_param *p) {
  if (p->quant) return mf_ckpt_hash64(j->t->qhome + p->qoff, (size_t)p->qbytes); /* its blob, as held */
  if (j->home && p->frozen) return mf_ckpt_hash64(j->home + p->offset, (size_t)p->numel * sizeof(uint16_t));
  const float *v = j->w + p->offset;
  if (!j->bf16) return mf_ckpt_hash64(v, (size_t)p->numel * sizeof(float));
  mf_ckpt_hash h;
  mf_ckpt_hash_init(&h);
  uint16_t chunk[SUM_CHUNK];
  for (int64_t k = 0; k < p->numel; k += SUM_CHUNK) {
    const int64_t m = p->numel - k < SUM_CHUNK ? p->numel - k : SUM_CHUNK;
    mf_fp32_to_bf16_n(v + k, chunk, (size_t)m);
    mf_ckpt_hash_update(&h, chunk, (size_t)m * sizeof(uint16_t));
  }
  return mf_ckpt_hash_final(&h);
}

/* Thread i of n: the tensors whose first element falls in its equal share of
 * the model's elements. */
static void sum_task(void *ctx, int i, int n) {
  const sum_job *j = (const sum_job *)ctx;
  const mf_param_table *t = j->t;
  const mf_param *last = &t->params[t->n_base - 1];
  size_t b, e;
  mf_partition((size_t)(last->offset + last->numel), 1, i, n, &b, &e);
  for (int64_t k = 0; k < j->b->n; k++) {
    const mf_param *p = &t->params[j->idx[k]];
    if ((size_t)p->offset >= b && (size_t)p->offset < e) j->b->tensors[k].sum = param_sum(j, p);
  }
}

mf_status mf_run_base_id(const mf_config *cfg, const mf_param_table *t, const float *w, const uint16_t *home,
                         int bf16, mf_threadpool *pool, mf_base_id *out) {
  const int frozen_only = t->lora_a != NULL;
  MF_CHECK(mf_base_id_init(out, t, cfg->model.has_init ? NULL : cfg->model.path, frozen_only, bf16));
  if (home && !bf16) {
    mf_base_id_free(out);
    return MF_ERR(
        MF_ERR_CONFIG,
        "the base's weights are held in bf16 alone (LoRA's frozen base with bf16 storage on one rank): "
        "their fp32 checksums, which the run recorded, cannot be computed; run as the run did "
        "(train.precision and the number of ranks)");
  }
  int32_t *idx = NULL;
  mf_status st =
      mf_malloc((size_t)(out->n ? out->n : 1) * sizeof *idx, "the base's checksums", (void **)&idx);
  if (st != MF_OK) {
    mf_base_id_free(out);
    return st;
  }
  for (int64_t i = 0, k = 0; i < t->n_base; i++)
    if (!frozen_only || t->params[i].frozen) idx[k++] = (int32_t)i;
  sum_job j = {t, w, home, bf16, idx, out};
  if (out->n == 0) {
    /* nothing to sum */
  } else if (pool) {
    mf_threadpool_run(pool, sum_task, &j);
  } else {
    sum_task(&j, 0, 1);
  }
  free(idx);
  return MF_OK;
}

/* -------------------------------------------------------------- checks */

mf_status mf_run_base_check_spec(const mf_base_id *rec, const char *where, const mf_config *cfg,
                                 const mf_model_spec *spec, const char *who, const char *way_out) {
  mf_base_id have;
  mf_base_id_init_spec(&have, spec, cfg->model.has_init ? NULL : cfg->model.path);
  return mf_base_id_compare(rec, where, &have, who, way_out);
}

mf_status mf_run_base_check_weights(const mf_base_id *rec, const char *where, const mf_config *cfg,
                                    const mf_param_table *t, const float *w, const uint16_t *home,
                                    mf_threadpool *pool, const char *who, const char *way_out) {
  mf_base_id have;
  MF_CHECK(mf_run_base_id(cfg, t, w, home, rec->bf16, pool, &have));
  const mf_status st = mf_base_id_compare(rec, where, &have, who, way_out);
  mf_base_id_free(&have);
  return st;
}

mf_status mf_run_base_read_ckpt(const char *dir, int lora, const char *then, mf_base_id *rec, int *found,
                                char *where, size_t where_cap) {
  memset(rec, 0, sizeof *rec);
  *found = 0;
  snprintf(where, where_cap, "%s/base.json", dir);
  char *json = NULL;
  MF_CHECK(mf_ckpt_read_base_json(dir, &json));
  if (!json) {
    MF_LOGW("ckpt",
            "%s has no base.json (written before moefit recorded a run's base): the base's config.json "
            "(rope_theta, rms_norm_eps, the router's settings) cannot be checked against the one the run "
            "trained on%s; %s",
            dir,
            lora ? "; its weights still are, by state.json's base_sum"
                 : " (its weights are all in the checkpoint)",
            then);
    return MF_OK;
  }
  const mf_status st = mf_base_id_parse(json, strlen(json), where, rec);
  free(json);
  *found = st == MF_OK;
  return st;
}

mf_status mf_run_base_check_ckpt(const char *dir, const char *have_json, int lora) {
  if (!have_json) return MF_OK;
  mf_base_id rec, have;
  int found = 0;
  char where[4400];
  MF_CHECK(mf_run_base_read_ckpt(dir, lora, "the checkpoints written from here on record the base loaded now",
                                 &rec, &found, where, sizeof where));
  if (!found) return MF_OK;
  mf_status st = mf_base_id_parse(have_json, strlen(have_json), "the base loaded now", &have);
  if (st == MF_OK && lora) /* its weights: state.json's base_sum, which mf_ckpt_read checks */
    mf_base_id_free(&have);
  if (st == MF_OK) {
    st = mf_base_id_compare(&rec, where, &have, "the run", MF_BASE_WAY_OUT_RUN);
    mf_base_id_free(&have);
  }
  mf_base_id_free(&rec);
  return st;
}
