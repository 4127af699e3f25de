/* Writing a resume checkpoint (ckpt.h): the tensors streamed through the
 * byte-plane filter and zstd (or neither) into files inside a temporary
 * directory, each hashed as written (and as handed over: raw_hash), the
 * sealed manifest, then the rename and the COMPLETE marker. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <jansson.h>
#include <zstd.h>

#include "src/ckpt/ckpt_internal.h"
#include "src/core/env.h"
#include "src/io/safetensors.h"

struct mf_ckpt_writer {
  char root[4200];      /* <output.dir>/checkpoints */
  char plan_path[4200]; /* <output.dir>/plan.json */
  char *config_text;    /* the resolved config */
  size_t config_len;
  int level;            /* zstd level; 0: none */
  int64_t keep;         /* output.keep_checkpoints */
  ZSTD_CCtx *cctx;
  uint8_t *obuf; /* the compressor's output, one chunk at a time */
  size_t ocap;
  int filter;       /* 1: tensor data split into byte planes before zstd */
  uint8_t *sbuf;    /* [2 MF_CKPT_PLANE_BLOCK]: a block of tensor data, then its planes */
  mf_st_tensor *ts; /* [2 n] tensor lists, sized on the first write */
  char (*names)[112];
  int64_t cap;
  mf_ckpt_file files[MF_CKPT_MAX_FILES];
  int n_files;
  /* Test-only hooks (docs/cli.md's MF_TEST_ variables), read once in create:
   * MF_TEST_CKPT_PAUSE_MS sleeps after each file of a checkpoint (a window
   * for the kill tests to strike inside a write); MF_TEST_CKPT_ENOSPC=N makes
   * the Nth checkpoint file of the process fail as a full disk would;
   * MF_TEST_CKPT_NO_FILTER=1 writes zstd files without the byte-plane
   * filter, as moefit did before it had one (a test reads such a
   * checkpoint back; docs/checkpoints.md's figures compare the two). */
  long pause_ms;
  long enospc_file;
  long files_started;
};

/* One file being written: raw bytes in, (compressed) bytes out, hashed. */
typedef struct out_file {
  mf_ckpt_writer *w;
  mf_atomic_file *f;
  const char *path;
  int zstd;
  mf_ckpt_hash hash, raw_hash; /* of the bytes written; of the bytes handed over */
  uint64_t bytes, raw;
  int full;      /* MF_TEST_CKPT_ENOSPC: this file's writes fail */
  size_t planes; /* the element size its tensor data is split by; 0: not filtered */
  long calls;    /* sink calls so far: the first is the safetensors header, the later ones tensor data */
  size_t held;   /* tensor bytes in w->sbuf waiting for their block to fill */
} out_file;

mf_status mf_ckpt_remove_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return errno == ENOENT ? MF_OK : MF_ERR(MF_ERR_IO, "%s: opendir: %s", dir, strerror(errno));
  mf_status st = MF_OK;
  char path[4400];
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    if (unlink(path) != 0 && st == MF_OK) st = MF_ERR(MF_ERR_IO, "%s: unlink: %s", path, strerror(errno));
  }
  closedir(d);
  if (st == MF_OK && rmdir(dir) != 0) st = MF_ERR(MF_ERR_IO, "%s: rmdir: %s", dir, strerror(errno));
  return st;
}

int64_t mf_ckpt_parse_step_name(const char *name) {
  if (strncmp(name, "step-", 5) != 0 || !name[5]) return -1;
  int64_t v = 0;
  for (const char *p = name + 5; *p; p++) {
    if (*p < '0' || *p > '9' || v > (INT64_MAX - 9) / 10) return -1;
    v = v * 10 + (*p - '0');
  }
  return v;
}

int mf_ckpt_list_steps(const char *root, int complete_only, int64_t *steps, size_t cap, size_t *n) {
  *n = 0;
  DIR *d = opendir(root);
  if (!d) return errno;
  for (struct dirent *e; (e = readdir(d)) != NULL && *n < cap;) {
    const int64_t s = mf_ckpt_parse_step_name(e->d_name);
    if (s < 0) continue;
    if (complete_only) {
      char marker[4400];
      snprintf(marker, sizeof marker, "%s/%s/COMPLETE", root, e->d_name);
      if (access(marker, F_OK) != 0) continue;
    }
    steps[(*n)++] = s;
  }
  closedir(d);
  return 0;
}

static mf_status fsync_dir(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY);
  if (fd < 0) return MF_ERR(MF_ERR_IO, "%s: open: %s", dir, strerror(errno));
  int rc = fsync(fd);
  int err = errno;
  close(fd);
  return rc == 0 ? MF_OK : MF_ERR(MF_ERR_IO, "%s: fsync: %s", dir, strerror(err));
}

/* ------------------------------------------------------------ the writer */

void mf_ckpt_writer_free(mf_ckpt_writer *w) {
  if (!w) return;
  ZSTD_freeCCtx(w->cctx);
  free(w->obuf);
  free(w->sbuf);
  free(w->ts);
  free(w->names);
  free(w->config_text);
  free(w);
}

static mf_status zstd_setup(mf_ckpt_writer *w, int threads) {
  w->cctx = ZSTD_createCCtx();
  if (!w->cctx) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "checkpoint: cannot create a zstd compressor");
  if (ZSTD_isError(ZSTD_CCtx_setParameter(w->cctx, ZSTD_c_compressionLevel, w->level)))
    return MF_ERR(MF_ERR_CONFIG, "output.checkpoint_compression: zstd refuses level %d", w->level);
  (void)ZSTD_CCtx_setParameter(w->cctx, ZSTD_c_checksumFlag, 0); /* the manifest has one */
  /* Workers where the library has them (a single-threaded libzstd refuses
   * the parameter: then one thread compresses). */
  if (threads > 1) (void)ZSTD_CCtx_setParameter(w->cctx, ZSTD_c_nbWorkers, threads);
  w->ocap = ZSTD_CStreamOutSize() * 4;
  return mf_malloc(w->ocap, "checkpoint compression buffer", (void **)&w->obuf);
}

/* A test-only hook's value (src/core/env.h: a test build's, from 1 to 1000000), else 0. */
static long test_hook(mf_env_id id) {
  double v = 0;
  return mf_env_number(id, &v) ? (long)v : 0;
}

static void pause_ms(long ms) {
  struct timespec left = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&left, &left) != 0) {
  }
}

mf_status mf_ckpt_writer_create(const mf_config *cfg, mf_ckpt_writer **out) {
  *out = NULL;
  mf_ckpt_writer *w = NULL;
  MF_CHECK(mf_calloc(1, sizeof *w, "checkpoint writer", (void **)&w));
  mf_status st = MF_OK;
  snprintf(w->root, sizeof w->root, "%s/checkpoints", cfg->output.dir);
  snprintf(w->plan_path, sizeof w->plan_path, "%s/plan.json", cfg->output.dir);
  w->level = cfg->output.checkpoint_zstd;
  w->keep = cfg->output.keep_checkpoints;
  w->pause_ms = test_hook(MF_ENV_TEST_CKPT_PAUSE_MS);
  w->enospc_file = test_hook(MF_ENV_TEST_CKPT_ENOSPC);
  w->filter = w->level > 0 && !test_hook(MF_ENV_TEST_CKPT_NO_FILTER);
  FILE *f = open_memstream(&w->config_text, &w->config_len);
  if (!f) {
    st = MF_ERR(MF_ERR_OUT_OF_MEMORY, "checkpoint: cannot print the config");
    goto fail;
  }
  st = mf_config_print(cfg, f);
  fclose(f);
  if (st != MF_OK) goto fail;
  if (w->level > 0) {
    int threads = (int)cfg->train.threads;
    if (threads <= 0) threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    MF_CHECK_GOTO(zstd_setup(w, threads), st, fail);
    if (w->filter)
      MF_CHECK_GOTO(mf_malloc(2 * MF_CKPT_PLANE_BLOCK, "checkpoint byte-plane buffer", (void **)&w->sbuf), st,
                    fail);
  }
  *out = w;
  return MF_OK;
fail:
  mf_ckpt_writer_free(w);
  return st;
}

/* ----------------------------------------------------------- one file */

static mf_status out_write(out_file *o, const void *p, size_t n) {
  if (o->full)
    return MF_ERR(MF_ERR_IO, "%s: write failed: %s (MF_TEST_CKPT_ENOSPC)", mf_atomic_file_tmp_path(o->f),
                  strerror(ENOSPC));
  mf_ckpt_hash_update(&o->hash, p, n);
  o->bytes += n;
  return mf_atomic_file_write(o->f, p, n);
}

/* Feeds n raw bytes (NULL, 0 with `end`: finishes the frame). */
static mf_status out_feed(out_file *o, const void *p, size_t n, int end) {
  if (!o->zstd) return n ? out_write(o, p, n) : MF_OK;
  mf_ckpt_writer *w = o->w;
  ZSTD_inBuffer in = {p, n, 0};
  for (;;) {
    ZSTD_outBuffer ob = {w->obuf, w->ocap, 0};
    const size_t left = ZSTD_compressStream2(w->cctx, &ob, &in, end ? ZSTD_e_end : ZSTD_e_continue);
    if (ZSTD_isError(left))
      return MF_ERR(MF_ERR_INTERNAL, "%s: zstd: %s", o->path, ZSTD_getErrorName(left));
    if (ob.pos) MF_CHECK(out_write(o, w->obuf, ob.pos));
    if (end ? left == 0 : in.pos == in.size) return MF_OK;
  }
}

/* Splits the held block into planes and feeds them. */
static mf_status out_flush_block(out_file *o) {
  if (!o->held) return MF_OK;
  if (o->held % o->planes)
    return MF_ERR(MF_ERR_INTERNAL, "%s: %zu tensor bytes are not whole elements of %zu bytes", o->path,
                  o->held, o->planes);
  uint8_t *block = o->w->sbuf, *planes = o->w->sbuf + MF_CKPT_PLANE_BLOCK;
  mf_ckpt_planes_split(planes, block, o->held, o->planes);
  const size_t n = o->held;
  o->held = 0;
  return out_feed(o, planes, n, 0);
}

/* mf_safetensors_write_stream hands over the header, then the tensors' data:
 * the header passes as it is, the data goes as byte planes block by block. */
static mf_status out_sink(void *ctx, const void *bytes, size_t n) {
  out_file *o = ctx;
  o->raw += n;
  mf_ckpt_hash_update(&o->raw_hash, bytes, n);
  if (!o->planes || o->calls++ == 0) return out_feed(o, bytes, n, 0);
  const uint8_t *p = bytes;
  while (n) {
    const size_t take = n < MF_CKPT_PLANE_BLOCK - o->held ? n : MF_CKPT_PLANE_BLOCK - o->held;
    memcpy(o->w->sbuf + o->held, p, take);
    o->held += take;
    p += take;
    n -= take;
    if (o->held == MF_CKPT_PLANE_BLOCK) MF_CHECK(out_flush_block(o));
  }
  return MF_OK;
}

/* Writes dir/name from a safetensors stream (tensors, all of one dtype of
 * `planes` bytes: their data through the byte-plane filter when planes > 0) or from bytes
 * (text, n_text), compressed when zstd, and lists it. */
static mf_status write_file(mf_ckpt_writer *w, const char *dir, const char *name, int zstd, size_t planes,
                            const mf_st_tensor *ts, size_t n, const void *text, size_t n_text) {
  if (w->n_files == MF_CKPT_MAX_FILES) return MF_ERR(MF_ERR_INTERNAL, "checkpoint: too many files");
  char path[4400];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  out_file o;
  memset(&o, 0, sizeof o);
  o.w = w;
  o.path = path;
  o.zstd = zstd;
  o.full = ++w->files_started == w->enospc_file;
  o.planes = planes;
  mf_ckpt_hash_init(&o.hash);
  mf_ckpt_hash_init(&o.raw_hash);
  if (zstd) ZSTD_CCtx_reset(w->cctx, ZSTD_reset_session_only);
  MF_CHECK(mf_atomic_file_open(path, &o.f));
  mf_status st;
  if (ts)
    MF_CHECK_GOTO(mf_safetensors_write_stream(path, ts, n, NULL, 0, out_sink, &o), st, fail);
  else
    MF_CHECK_GOTO(out_sink(&o, text, n_text), st, fail);
  if (planes) MF_CHECK_GOTO(out_flush_block(&o), st, fail);
  if (zstd) MF_CHECK_GOTO(out_feed(&o, NULL, 0, 1), st, fail);
  st = mf_atomic_file_commit(o.f); /* fsync, rename, fsync of the directory */
  o.f = NULL;
  if (st != MF_OK) return st;
  mf_ckpt_file *e = &w->files[w->n_files++];
  snprintf(e->name, sizeof e->name, "%s", name);
  e->bytes = o.bytes;
  e->hash = mf_ckpt_hash_final(&o.hash);
  e->raw_bytes = o.raw;
  e->raw_hash = mf_ckpt_hash_final(&o.raw_hash);
  e->zstd = zstd;
  e->byteplane = planes > 0;
  if (w->pause_ms) {
    MF_LOGI("ckpt", "MF_TEST_CKPT_PAUSE_MS: pausing %ld ms after %s", w->pause_ms, path);
    pause_ms(w->pause_ms);
  }
  return MF_OK;
fail:
  mf_atomic_file_abort(o.f);
  return st;
}

/* --------------------------------------------------------- the contents */

static mf_status size_lists(mf_ckpt_writer *w, int64_t n) {
  if (w->cap >= 2 * n + 2) return MF_OK;
  free(w->ts);
  free(w->names);
  w->ts = NULL;
  w->names = NULL;
  w->cap = 0;
  MF_CHECK(mf_calloc((size_t)(2 * n + 2), sizeof *w->ts, "checkpoint tensor list", (void **)&w->ts));
  MF_CHECK(mf_calloc((size_t)(2 * n + 2), sizeof *w->names, "checkpoint tensor names", (void **)&w->names));
  w->cap = 2 * n + 2;
  return MF_OK;
}

/* Parameter p's tensor in an array of `dt` values at element `at` of base. */
static mf_st_tensor param_tensor(const mf_param *p, const char *name, mf_dtype dt, const void *base,
                                 int64_t at) {
  mf_st_tensor x;
  memset(&x, 0, sizeof x);
  x.name = name;
  x.dtype = dt;
  x.ndim = p->ndim;
  for (int d = 0; d < p->ndim; d++) x.shape[d] = p->shape[d];
  x.data = (const char *)base + (size_t)at * mf_dtype_size(dt);
  return x;
}

static mf_status write_tensors(mf_ckpt_writer *w, const char *dir, const mf_ckpt_data *d) {
  const mf_param_table *t = d->t;
  const int z = w->level > 0;
  MF_CHECK(size_lists(w, t->n));
  /* The trained parameters only: LoRA's frozen base is the run's base model
   * (mf_ckpt_data.base_sum says which), not part of its state. */
  size_t k = 0;
  for (int64_t i = 0; i < t->n; i++)
    if (!t->params[i].frozen)
      w->ts[k++] = param_tensor(&t->params[i], t->params[i].name, MF_DTYPE_F32, d->master,
                                d->master_at_toff ? t->params[i].toff : t->params[i].offset);
  MF_CHECK(write_file(w, dir, z ? "master.safetensors.zst" : "master.safetensors", z, w->filter ? 4 : 0,
                      w->ts, k, NULL, 0));
  k = 0;
  for (int64_t i = 0; i < t->n; i++) {
    const mf_param *p = &t->params[i];
    if (p->frozen) continue;
    snprintf(w->names[2 * k], sizeof w->names[0], "exp_avg.%s", p->name);
    snprintf(w->names[2 * k + 1], sizeof w->names[0], "exp_avg_sq.%s", p->name);
    w->ts[2 * k] = param_tensor(p, w->names[2 * k], d->moments, d->m, p->toff);
    w->ts[2 * k + 1] = param_tensor(p, w->names[2 * k + 1], d->moments, d->v, p->toff);
    k++;
  }
  MF_CHECK(write_file(w, dir, z ? "optimizer.safetensors.zst" : "optimizer.safetensors", z,
                      w->filter ? mf_dtype_size(d->moments) : 0, w->ts, 2 * k, NULL, 0));
  mf_st_tensor s[2];
  memset(s, 0, sizeof s);
  s[0].name = "adam_step";
  s[0].dtype = MF_DTYPE_I64;
  s[0].ndim = 1;
  s[0].shape[0] = t->n;
  s[0].data = d->adam_steps;
  s[1].name = "routed_tokens";
  s[1].dtype = MF_DTYPE_I64;
  s[1].ndim = 1;
  s[1].shape[0] = (int64_t)d->n_routed;
  s[1].data = d->routed;
  return write_file(w, dir, "state.safetensors", 0, 0, s, 2, NULL, 0);
}

static const char *json_num(double x, char *buf, size_t cap) {
  if (isfinite(x))
    snprintf(buf, cap, "%.17g", x);
  else
    snprintf(buf, cap, "null");
  return buf;
}

/* state.json's lora_hot: ",\n  \"lora_hot\": [[e, ...], ...]" (one list a layer) for a
 * table with a hot set (mf_ckpt_read_lora_hot reads it), "" otherwise; malloc'd. */
static mf_status lora_hot_json(const mf_param_table *t, char **out) {
  const int64_t L = t->spec.layers, E = t->spec.experts;
  const size_t cap = 64 + (t->lora.hot ? (size_t)(L * (E * 7 + 8)) : 0);
  char *j = NULL;
  MF_CHECK(mf_malloc(cap, "state.json", (void **)&j));
  size_t at = 0;
  j[0] = 0;
  if (t->lora.hot) {
    at += (size_t)snprintf(j + at, cap - at, ",\n  \"lora_hot\": [");
    for (int64_t l = 0; l < L; l++) {
      at += (size_t)snprintf(j + at, cap - at, "%s[", l ? ", " : "");
      for (int64_t e = 0, n = 0; e < E; e++)
        if (t->lora.hot[l * E + e])
          at += (size_t)snprintf(j + at, cap - at, "%s%lld", n++ ? ", " : "", (long long)e);
      at += (size_t)snprintf(j + at, cap - at, "]");
    }
    snprintf(j + at, cap - at, "]");
  }
  *out = j;
  return MF_OK;
}

static mf_status write_state_json(mf_ckpt_writer *w, const char *dir, const mf_ckpt_data *d,
                                  const mf_ckpt_state *s) {
  char a[40], b[40], comp[16] = "none", ranks[128] = "", *hot = NULL, *text = NULL;
  const int r = snprintf(ranks, sizeof ranks, ",\n  \"ranks\": %lld", (long long)(s->ranks > 1 ? s->ranks : 1));
  if (d->t->lora_a) /* the frozen base's identity (its weights are not in the checkpoint) */
    snprintf(ranks + r, sizeof ranks - (size_t)r,
             ",\n  \"base_sum\": \"%016llx\",\n  \"base_sum_of\": \"%s\"", (unsigned long long)d->base_sum,
             d->base_bf16 ? "bf16" : "fp32");
  if (w->level) snprintf(comp, sizeof comp, "zstd-%d", w->level);
  MF_CHECK(lora_hot_json(d->t, &hot));
  const size_t text_cap = 2048 + strlen(hot);
  text = (char *)malloc(text_cap);
  if (!text) {
    free(hot);
    return MF_ERR(MF_ERR_OUT_OF_MEMORY, "checkpoint: out of memory for state.json");
  }
  const int n =
      snprintf(text, text_cap,
               "{\n  \"format\": \"%s\",\n  \"version\": %d,\n  \"step\": %lld,\n  \"train_steps\": %lld,\n"
               "  \"skipped\": %lld,\n  \"first_loss\": %s,\n  \"lr\": %s,\n"
               "  \"data\": {\"epoch\": %llu, \"index\": %llu, \"seed\": %llu, \"windows\": %llu},\n"
               "  \"model\": {\"params\": %lld, \"numel\": %lld, \"experts_routed\": %llu},\n"
               "  \"moments\": \"%s\",\n  \"compression\": \"%s\",\n  \"filter\": \"%s\"%s%s\n}\n",
               MF_CKPT_FORMAT, MF_CKPT_VERSION, (long long)s->step, (long long)s->train_steps,
               (long long)s->skipped, json_num(s->first_loss, a, sizeof a), json_num(s->lr, b, sizeof b),
               (unsigned long long)s->data_epoch, (unsigned long long)s->data_index,
               (unsigned long long)s->data_seed, (unsigned long long)s->data_windows, (long long)d->t->n,
               (long long)d->t->total_numel, (unsigned long long)d->n_routed, mf_dtype_name(d->moments), comp,
               w->filter ? "byteplane" : "none", ranks, hot);
  free(hot);
  mf_status st = n < 0 || (size_t)n >= text_cap
                     ? MF_ERR(MF_ERR_INTERNAL, "%s: state.json too long", dir)
                     : write_file(w, dir, "state.json", 0, 0, NULL, 0, text, (size_t)n);
  free(text);
  return st;
}

static mf_status write_manifest(mf_ckpt_writer *w, const char *dir) {
  char text[8192];
  int n = snprintf(text, sizeof text, "{\n  \"format\": \"%s-manifest\",\n  \"version\": %d,\n  \"hash\": \"%s\",\n  \"files\": [\n",
                   MF_CKPT_FORMAT, MF_CKPT_VERSION, MF_CKPT_HASH_NAME);
  for (int i = 0; i < w->n_files && n < (int)sizeof text; i++) {
    const mf_ckpt_file *e = &w->files[i];
    n += snprintf(text + n, sizeof text - (size_t)n,
                  "    {\"name\": \"%s\", \"bytes\": %llu, \"hash\": \"%016llx\", \"raw_bytes\": %llu, "
                  "\"raw_hash\": \"%016llx\", \"compression\": \"%s\", \"filter\": \"%s\"}%s\n",
                  e->name, (unsigned long long)e->bytes, (unsigned long long)e->hash,
                  (unsigned long long)e->raw_bytes, (unsigned long long)e->raw_hash, e->zstd ? "zstd" : "none",
                  e->byteplane ? "byteplane" : "none", i + 1 < w->n_files ? "," : "");
  }
  if (n < (int)sizeof text) n += snprintf(text + n, sizeof text - (size_t)n, "  ],\n");
  /* The seal: the checksum of everything above, so that no field of an
   * entry (how its file is read included) changes unnoticed. */
  const size_t len = n < (int)sizeof text ? mf_ckpt_manifest_seal(text, (size_t)n, sizeof text) : 0;
  if (!len) return MF_ERR(MF_ERR_INTERNAL, "%s: manifest too long", dir);
  char path[4400];
  snprintf(path, sizeof path, "%s/manifest.json", dir);
  return mf_write_file_atomic(path, text, len);
}

/* ------------------------------------------------------- the checkpoint */

/* Removes complete checkpoints older than the newest `keep`; one that cannot
 * be removed is a warning (the new checkpoint is complete either way). */
static mf_status prune(const mf_ckpt_writer *w, int64_t newest) {
  if (w->keep <= 0) return MF_OK;
  int64_t steps[4096];
  size_t n = 0;
  const int err = mf_ckpt_list_steps(w->root, 1, steps, sizeof steps / sizeof steps[0], &n);
  if (err) return MF_ERR(MF_ERR_IO, "%s: opendir: %s", w->root, strerror(err));
  size_t kept = 0; /* those after the new one are neither counted nor removed */
  for (size_t i = 0; i < n; i++)
    if (steps[i] <= newest) steps[kept++] = steps[i];
  n = kept;
  for (size_t i = 0; i < n; i++) {
    int64_t newer = 0; /* complete checkpoints newer than this one */
    for (size_t j = 0; j < n; j++) newer += steps[j] > steps[i];
    if (newer < w->keep) continue;
    char dir[4400];
    snprintf(dir, sizeof dir, "%s/step-%06lld", w->root, (long long)steps[i]);
    /* The marker first: a prune cut short leaves an incomplete checkpoint, never a damaged "complete" one. */
    char marker[4500];
    snprintf(marker, sizeof marker, "%s/COMPLETE", dir);
    if (unlink(marker) != 0 || mf_ckpt_remove_dir(dir) != MF_OK)
      MF_LOGW("ckpt", "could not remove the old checkpoint %s (output.keep_checkpoints %lld)", dir,
              (long long)w->keep);
  }
  return MF_OK;
}

static mf_status write_all(mf_ckpt_writer *w, const char *tmp, const mf_ckpt_data *d, const mf_ckpt_state *s) {
  w->n_files = 0;
  MF_CHECK(write_tensors(w, tmp, d));
  MF_CHECK(write_state_json(w, tmp, d, s));
  MF_CHECK(write_file(w, tmp, "config.yaml", 0, 0, NULL, 0, w->config_text, w->config_len));
  char *plan = NULL;
  size_t plan_len = 0;
  if (access(w->plan_path, F_OK) == 0) {
    MF_CHECK(mf_read_file(w->plan_path, (size_t)1 << 30, "a plan", &plan, &plan_len));
    mf_status st = write_file(w, tmp, "plan.json", 0, 0, NULL, 0, plan, plan_len);
    free(plan);
    MF_CHECK(st);
  }
  if (d->base_json) {
    json_error_t e;
    json_t *base = json_loads(d->base_json, JSON_DECODE_ANY, &e);
    if (!base)
      return MF_ERR(MF_ERR_INTERNAL, "%s/base.json: the base identity is not JSON (line %d: %s)", tmp, e.line,
                    e.text);
    json_decref(base);
    MF_CHECK(write_file(w, tmp, "base.json", 0, 0, NULL, 0, d->base_json, strlen(d->base_json)));
  }
  MF_CHECK(write_manifest(w, tmp));
  return fsync_dir(tmp);
}

mf_status mf_ckpt_write_files(mf_ckpt_writer *w, const mf_ckpt_data *d, const mf_ckpt_state *s,
                              mf_ckpt_stats *out) {
  const double t0 = mf_time_now();
  memset(out, 0, sizeof *out);
  char tmp[4400], dir[4400], marker[4500];
  snprintf(tmp, sizeof tmp, "%s/.tmp-step-%06lld", w->root, (long long)s->step);
  snprintf(dir, sizeof dir, "%s/step-%06lld", w->root, (long long)s->step);
  MF_CHECK(mf_mkdir_p(w->root));
  MF_CHECK(mf_ckpt_remove_dir(tmp)); /* a crashed writer's */
  if (mkdir(tmp, 0777) != 0) return MF_ERR(MF_ERR_IO, "%s: mkdir: %s", tmp, strerror(errno));
  mf_status st = write_all(w, tmp, d, s);
  if (st != MF_OK) {
    (void)mf_ckpt_remove_dir(tmp);
    return st;
  }
  /* The same step again (a resumed run repeating it): the old one goes first,
   * its marker before its files. */
  snprintf(marker, sizeof marker, "%s/COMPLETE", dir);
  (void)unlink(marker);
  MF_CHECK(mf_ckpt_remove_dir(dir));
  if (rename(tmp, dir) != 0) return MF_ERR(MF_ERR_IO, "%s: rename to %s: %s", tmp, dir, strerror(errno));
  MF_CHECK(fsync_dir(w->root));
  for (int i = 0; i < w->n_files; i++) {
    out->bytes += w->files[i].bytes;
    out->raw_bytes += w->files[i].raw_bytes;
  }
  snprintf(out->dir, sizeof out->dir, "%s", dir);
  out->seconds = mf_time_now() - t0;
  return MF_OK;
}

mf_status mf_ckpt_commit(mf_ckpt_writer *w, int64_t step) {
  char marker[4500], text[64];
  snprintf(marker, sizeof marker, "%s/step-%06lld/COMPLETE", w->root, (long long)step);
  const int n = snprintf(text, sizeof text, "step %lld\n", (long long)step);
  MF_CHECK(mf_write_file_atomic(marker, text, (size_t)n));
  return prune(w, step);
}

mf_status mf_ckpt_write(mf_ckpt_writer *w, const mf_ckpt_data *d, const mf_ckpt_state *s, mf_ckpt_stats *out) {
  const double t0 = mf_time_now();
  MF_CHECK(mf_ckpt_write_files(w, d, s, out));
  MF_CHECK(mf_ckpt_commit(w, s->step));
  out->seconds = mf_time_now() - t0;
  return MF_OK;
}
