/* `moefit export` (ckpt.h mf_ckpt_export): a checkpoint's master weights, or a
 * run's final/, as a Hugging Face model dir. The weights go through fp32 (the
 * checkpoint's master copy) and are narrowed to bf16 only when asked; the dir
 * is built beside its destination and renamed into place. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "src/ckpt/ckpt_internal.h"
#include "src/io/safetensors.h"
#include "src/model/base_id.h"
#include "src/model/hf_config.h"

#define MF_EXPORT_DEFAULT_SHARD 5000000000ull /* transformers' max_shard_size "5GB" */

static int is_dir(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int has_file(const char *dir, const char *name) {
  char p[4400];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  return access(p, F_OK) == 0;
}

/* ------------------------------------------------------------- tokenizer */

/* The files of a Hugging Face model dir that make its tokenizer and chat
 * template: what AutoTokenizer.from_pretrained reads beside the weights (the
 * fast tokenizer's tokenizer.json, a sentencepiece tokenizer.model, BPE's
 * vocab.json and merges.txt, the config and special tokens, and the chat
 * template when it is kept apart from tokenizer_config.json). */
static const char *const k_tokenizer_files[] = {
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",    "vocab.json",
    "merges.txt",     "added_tokens.json",     "chat_template.jinja",     "chat_template.json",
};
enum { N_TOKENIZER_FILES = (int)(sizeof k_tokenizer_files / sizeof k_tokenizer_files[0]) };
#define MF_TOKENIZER_FILE_MAX (2ull << 30) /* far above any real one (tens of MB) */

static const char k_no_tokenizer_init[] =
    "the run's model came from model.init (random weights, no tokenizer files to copy)";

void mf_ckpt_export_tokenizer_of(const mf_config *cfg, mf_ckpt_export_opts *o) {
  o->tokenizer_dir = NULL;
  o->tokenizer_none = NULL;
  if (cfg->model.has_init)
    o->tokenizer_none = k_no_tokenizer_init;
  else
    o->tokenizer_dir = cfg->model.path;
}

/* Copies into tmp those of k_tokenizer_files that `from` holds, byte for byte
 * (a link is followed: a hub cache's snapshot dir holds links), and says what
 * it did in info->tokenizer_*. from NULL: nothing, for the reason `none`. */
static mf_status copy_tokenizer(const char *from, const char *none, const char *tmp,
                                mf_ckpt_export_info *info) {
  info->tokenizer_files = 0;
  if (!from) {
    snprintf(info->tokenizer_note, sizeof info->tokenizer_note, "no tokenizer: %s",
             none ? none : "no base model dir is known for this export");
    return MF_OK;
  }
  char names[512] = "";
  size_t used = 0;
  for (int i = 0; i < N_TOKENIZER_FILES; i++) {
    char src[4400], dst[4400];
    snprintf(src, sizeof src, "%s/%s", from, k_tokenizer_files[i]);
    snprintf(dst, sizeof dst, "%s/%s", tmp, k_tokenizer_files[i]);
    struct stat sb;
    if (stat(src, &sb) != 0) {
      if (errno == ENOENT) continue;
      return MF_ERR(MF_ERR_IO, "%s: stat: %s (the base model's tokenizer, copied into the export)", src,
                    strerror(errno));
    }
    char *data = NULL;
    size_t n = 0;
    MF_CHECK(mf_read_file(src, MF_TOKENIZER_FILE_MAX, "a tokenizer file", &data, &n));
    const mf_status st = mf_write_file_atomic(dst, data, n);
    free(data);
    MF_CHECK(st);
    used += (size_t)snprintf(names + used, sizeof names - used, "%s%s", info->tokenizer_files ? ", " : "",
                             k_tokenizer_files[i]);
    info->tokenizer_files++;
  }
  if (info->tokenizer_files)
    snprintf(info->tokenizer_note, sizeof info->tokenizer_note, "tokenizer: %s (copied from %s)", names,
             from);
  else
    snprintf(info->tokenizer_note, sizeof info->tokenizer_note,
             "no tokenizer: %s holds no tokenizer files (tokenizer.json, tokenizer_config.json, ...)", from);
  return MF_OK;
}

/* ------------------------------------------------------------- weights */

/* The model a checkpoint was written for: its config.yaml's model; and where
 * its tokenizer is (o's tokenizer_*: the strings live in *cfg_out, which the
 * caller frees after the export). */
static mf_status checkpoint_table(const char *ckpt, mf_param_table **t, mf_ckpt_export_opts *o,
                                  mf_config **cfg_out) {
  char path[4400];
  snprintf(path, sizeof path, "%s/config.yaml", ckpt);
  mf_config *cfg = NULL;
  MF_CHECK(mf_ckpt_load_config(ckpt, MF_CONFIG_FOR_EVAL, &cfg)); /* verified first */
  mf_model_spec spec;
  mf_status st = MF_OK;
  if (cfg->train.lora.rank > 0)
    st =
        MF_ERR(MF_ERR_UNSUPPORTED,
               "%s: a LoRA run's checkpoint holds the adapters, not the base: `moefit export` loads the base "
               "and merges them (or writes them with --adapter)",
               path);
  else if (cfg->model.has_init)
    spec = cfg->model.init;
  else
    st = mf_hf_config_load(cfg->model.path, &spec);
  if (st != MF_OK) {
    mf_config_free(cfg);
    mf_error_prefix("%s: model.path", path);
    return st;
  }
  mf_ckpt_export_tokenizer_of(cfg, o);
  *cfg_out = cfg;
  return mf_param_table_build(&spec, t);
}

/* Which weights `src` names (info->source) and *is_ckpt: a checkpoint dir,
 * a run dir's newest complete checkpoint, else the run's final/. */
static mf_status resolve_source(const char *src, mf_ckpt_export_info *info, int *is_ckpt) {
  if (!is_dir(src))
    return MF_ERR(MF_ERR_INVALID_ARG, "%s: not a directory (give a run dir or a checkpoint dir)", src);
  if (has_file(src, "manifest.json") || has_file(src, "COMPLETE")) {
    snprintf(info->source, sizeof info->source, "%s", src);
    *is_ckpt = 1;
    return MF_OK;
  }
  char sub[4400];
  snprintf(sub, sizeof sub, "%s/checkpoints", src);
  const int has_ckpts = is_dir(sub);
  if (has_ckpts) {
    mf_status st = mf_ckpt_find_latest(src, info->source, sizeof info->source);
    if (st == MF_OK) {
      *is_ckpt = 1;
      return MF_OK;
    }
    if (!has_file(src, "final/config.json")) return st;
    MF_LOGW("ckpt", "%s: no complete checkpoint (%s); exporting %s/final", src, mf_last_error(), src);
    mf_error_clear();
  }
  if (has_file(src, "final/config.json")) {
    snprintf(info->source, sizeof info->source, "%s/final", src);
    *is_ckpt = 0;
    return MF_OK;
  }
  return MF_ERR(
      MF_ERR_INVALID_ARG,
      "%s: neither a checkpoint (no manifest.json) nor a run dir (no checkpoints/ or final/config.json)",
      src);
}

/* The weights of info->source in fp32: *t its model, *w [t->total_numel];
 * o's tokenizer_* say where the tokenizer is (*cfg: the checkpoint's config
 * they point into, or NULL; the caller frees it). A run's final/ records no
 * base model: its own tokenizer files, if it has any. */
static mf_status load_weights(int is_ckpt, const char *source, mf_param_table **t, float **w,
                              mf_ckpt_export_opts *o, mf_config **cfg) {
  if (is_ckpt) {
    MF_CHECK(checkpoint_table(source, t, o, cfg));
  } else {
    mf_model_spec spec;
    MF_CHECK(mf_hf_config_load(source, &spec));
    MF_CHECK(mf_param_table_build(&spec, t));
    o->tokenizer_dir = NULL;
    o->tokenizer_none =
        "a run's final/ does not record its base model (no checkpoint): copy the base's "
        "tokenizer files beside the weights yourself";
    for (int i = 0; i < N_TOKENIZER_FILES && !o->tokenizer_dir; i++)
      if (has_file(source, k_tokenizer_files[i])) o->tokenizer_dir = source;
  }
  MF_CHECK(mf_malloc((size_t)(*t)->total_numel * sizeof(float) + 1, "the exported weights", (void **)w));
  return is_ckpt ? mf_ckpt_read_master(source, *t, *w) : mf_params_load(*t, source, *w);
}

/* An existing non-empty dir is refused; a missing or empty one is fine. */
static mf_status check_out(const char *out) {
  struct stat sb;
  if (stat(out, &sb) != 0)
    return errno == ENOENT ? MF_OK : MF_ERR(MF_ERR_IO, "%s: stat: %s", out, strerror(errno));
  if (!S_ISDIR(sb.st_mode)) return MF_ERR(MF_ERR_INVALID_ARG, "--out %s: exists and is not a directory", out);
  DIR *d = opendir(out);
  if (!d) return MF_ERR(MF_ERR_IO, "%s: opendir: %s", out, strerror(errno));
  int n = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;)
    if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) n++;
  closedir(d);
  if (n)
    return MF_ERR(MF_ERR_INVALID_ARG,
                  "--out %s: not empty (%d entries): export writes a new dir, never over one", out, n);
  return MF_OK;
}

/* The model dir's files inside tmp (LoRA: the adapters merged, one tensor at a time). */
static mf_status write_files(const char *tmp, const mf_param_table *t, const float *w,
                             const mf_ckpt_export_opts *o, mf_ckpt_export_info *info) {
  const uint64_t max = o->max_shard_bytes ? o->max_shard_bytes : MF_EXPORT_DEFAULT_SHARD;
  MF_CHECK(mf_params_write_model(t, w, o->frozen_bf16, o->dtype, tmp, max, &info->shards, &info->bytes));
  info->tensors = t->n_base;
  char *gen = NULL;
  MF_CHECK(mf_hf_generation_config_format(&t->spec, &gen));
  char path[4400];
  snprintf(path, sizeof path, "%s/generation_config.json", tmp);
  const mf_status st = mf_write_file_atomic(path, gen, strlen(gen));
  free(gen);
  MF_CHECK(st);
  /* Before the rename, so the dir appears with its tokenizer or not at all. */
  return copy_tokenizer(o->tokenizer_dir, o->tokenizer_none, tmp, info);
}

/* The dir that holds path ("/" for "/x", "." for "x"). */
static void parent_of(const char *path, char *parent, size_t cap) {
  snprintf(parent, cap, "%s", path);
  char *slash = strrchr(parent, '/');
  if (slash == parent)
    slash[1] = '\0';
  else if (slash)
    *slash = '\0';
  else
    snprintf(parent, cap, ".");
}

static void fsync_parent(const char *path) {
  char parent[4400];
  parent_of(path, parent, sizeof parent);
  const int fd = open(parent, O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;
  if (fsync(fd) != 0) MF_LOGW("ckpt", "%s: fsync: %s", parent, strerror(errno));
  close(fd);
}

mf_status mf_ckpt_export_source(const char *src, mf_ckpt_export_info *info, int *is_ckpt) {
  memset(info, 0, sizeof *info);
  return resolve_source(src, info, is_ckpt);
}

/* out_dir without trailing slashes into out; checked (check_out). */
static mf_status out_path(const char *out_dir, char *out, size_t cap) {
  snprintf(out, cap, "%s", out_dir);
  for (size_t n = strlen(out); n > 1 && out[n - 1] == '/'; n--) out[n - 1] = '\0';
  return check_out(out);
}

/* ------------------------------------------------- temporary dirs */

/* An export writes OUT.tmp-export-PID and holds an exclusive flock on it until
 * the rename: a killed export leaves the dir behind with its lock released.
 * The next export into the same parent removes such a dir when both say its
 * writer is gone — its PID runs no process here and no one holds its lock —
 * so neither a reused PID nor an export in another PID namespace (a container
 * sharing the volume, whose PIDs mean nothing here) loses a dir in progress. */
#define TMP_EXPORT ".tmp-export-"

/* The PID of a name "X.tmp-export-PID"; 0 when it is not such a name. */
static long tmp_export_pid(const char *name) {
  const char *tag = NULL;
  for (const char *p = strstr(name, TMP_EXPORT); p; p = strstr(p + 1, TMP_EXPORT)) tag = p;
  if (!tag || tag == name) return 0;
  long pid = 0;
  const char *d = tag + sizeof TMP_EXPORT - 1;
  if (!*d) return 0;
  for (; *d; d++) {
    if (*d < '0' || *d > '9' || pid > 99999999) return 0;
    pid = pid * 10 + (*d - '0');
  }
  return pid;
}

/* An exclusive lock on the dir, without waiting: its descriptor (close it to
 * let go), -1 when another holds it (*held 1) or it cannot be locked here
 * (*held 0: a filesystem without flock on directories). */
static int lock_dir(const char *dir, int *held) {
  *held = 0;
  const int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return -1;
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    *held = errno == EWOULDBLOCK;
    close(fd);
    return -1;
  }
  return fd;
}

/* Removes the temporary dirs of exports that were killed in the parent of
 * `out` (one line naming them) and names those whose writer may still be at
 * work. Nothing here fails the export: what cannot be removed is said. */
static void clean_stale_tmps(const char *out) {
  char parent[4400];
  parent_of(out, parent, sizeof parent);
  const char *sep = parent[strlen(parent) - 1] == '/' ? "" : "/";
  DIR *d = opendir(parent);
  if (!d) return;
  char removed[2048] = "", path[4700];
  size_t used = 0;
  int n_removed = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    const long pid = tmp_export_pid(e->d_name);
    struct stat sb;
    snprintf(path, sizeof path, "%s%s%s", parent, sep, e->d_name);
    if (pid <= 0 || lstat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)) continue;
    const int running = pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno == EPERM;
    int held = 0;
    const int lock = running ? -1 : lock_dir(path, &held);
    if (running || held) {
      MF_LOGI("ckpt", "%s: left alone: %s%ld %s (an export in progress?)", path,
              running ? "process " : "the lock of process ", pid,
              running ? "is running" : "is held (by a process on another machine or in another container?)");
      continue;
    }
    const mf_status st = mf_ckpt_remove_dir(path);
    if (lock >= 0) close(lock);
    if (st != MF_OK) {
      MF_LOGW("ckpt", "%s, the temporary dir of a killed export, could not be removed: %s", path,
              mf_last_error());
      continue;
    }
    if (used < sizeof removed)
      used += (size_t)snprintf(removed + used, sizeof removed - used, "%s%s", n_removed ? ", " : "", path);
    n_removed++;
  }
  closedir(d);
  if (n_removed)
    MF_LOGI("ckpt", "removed the temporary dir%s of %d killed export%s (no such process, no lock held): %s%s",
            n_removed > 1 ? "s" : "", n_removed, n_removed > 1 ? "s" : "", removed,
            used >= sizeof removed ? "..." : "");
}

/* The dir `out` made by write(ctx, tmp) in a temporary sibling renamed into
 * place; the sibling is locked (see above) while it is written. */
static mf_status publish(const char *out, mf_status (*write)(void *ctx, const char *tmp), void *ctx) {
  char tmp[4400];
  snprintf(tmp, sizeof tmp, "%s" TMP_EXPORT "%ld", out, (long)getpid());
  mf_status st = mf_mkdir_parents(tmp);
  if (st == MF_OK) clean_stale_tmps(out);
  if (st == MF_OK && mkdir(tmp, 0777) != 0) st = MF_ERR(MF_ERR_IO, "%s: mkdir: %s", tmp, strerror(errno));
  int made = st == MF_OK, held;
  const int lock = made ? lock_dir(tmp, &held) : -1; /* -1: not lockable here; the PID still tells */
  if (st == MF_OK) st = write(ctx, tmp);
  /* rename replaces a missing or empty out; check_out ran first, but another
   * writer may have filled it since: then rename fails and out is untouched. */
  if (st == MF_OK && rename(tmp, out) != 0)
    st = MF_ERR(MF_ERR_IO, "rename %s -> %s: %s", tmp, out, strerror(errno));
  if (st == MF_OK) {
    made = 0;
    fsync_parent(out);
  }
  if (made) (void)mf_ckpt_remove_dir(tmp);
  if (lock >= 0) close(lock);
  return st;
}

typedef struct model_job {
  const mf_param_table *t;
  const float *w;
  const mf_ckpt_export_opts *o;
  mf_ckpt_export_info *info;
} model_job;

static mf_status write_model(void *ctx, const char *tmp) {
  model_job *j = (model_job *)ctx;
  return write_files(tmp, j->t, j->w, j->o, j->info);
}

mf_status mf_ckpt_export_model(const mf_param_table *t, const float *w, const char *source,
                               const char *out_dir, const mf_ckpt_export_opts *o, mf_ckpt_export_info *info) {
  if (o->dtype != MF_DTYPE_F32 && o->dtype != MF_DTYPE_BF16)
    return MF_ERR(MF_ERR_INVALID_ARG, "mf_ckpt_export: dtype %s (F32 or BF16)", mf_dtype_name(o->dtype));
  char out[4200];
  MF_CHECK(out_path(out_dir, out, sizeof out));
  if (source != info->source) snprintf(info->source, sizeof info->source, "%s", source);
  model_job j = {t, w, o, info};
  return publish(out, write_model, &j);
}

typedef struct adapter_job {
  const mf_param_table *t;
  const float *w;
  const char *base_model;
  const char *base_json; /* the base's record (moefit_base.json), or NULL */
  mf_ckpt_export_info *info;
} adapter_job;

/* The base's tokenizer goes beside the adapters too. PEFT's save_pretrained
 * writes none and PeftModel.from_pretrained reads none, so they change nothing
 * for it; but transformers' Trainer saves the tokenizer into the adapter dir,
 * so users and servers (vLLM's LoRA tokenizer, AutoTokenizer on the adapter
 * dir) expect it there, and a chat fine-tune's adapter then carries the chat
 * template it was trained with. */
static mf_status write_adapter(void *ctx, const char *tmp) {
  adapter_job *j = (adapter_job *)ctx;
  MF_CHECK(mf_params_save_adapter_dir(j->t, j->w, j->base_model, tmp));
  MF_CHECK(copy_tokenizer(j->base_model, k_no_tokenizer_init, tmp, j->info)); /* NULL base: model.init */
  /* What `moefit eval --model` checks the base and the files against (the dir appears whole or not at all) */
  return j->base_json ? mf_ckpt_adapter_record_write(tmp, j->base_json, 1) : MF_OK;
}

mf_status mf_ckpt_export_adapter(const mf_param_table *t, const float *w, const char *base_model,
                                 const char *base_json, const char *out_dir, mf_ckpt_export_info *info) {
  if (!t->lora_a) return MF_ERR(MF_ERR_INVALID_ARG, "export --adapter: the run trained no LoRA adapters");
  char out[4200];
  MF_CHECK(out_path(out_dir, out, sizeof out));
  adapter_job j = {t, w, base_model, base_json, info};
  return publish(out, write_adapter, &j);
}

mf_status mf_ckpt_export(const char *src, const char *out_dir, const mf_ckpt_export_opts *o,
                         mf_ckpt_export_info *info) {
  if (!src || !out_dir || !o || !info) return MF_ERR(MF_ERR_INVALID_ARG, "mf_ckpt_export: NULL argument");
  if (o->dtype != MF_DTYPE_F32 && o->dtype != MF_DTYPE_BF16)
    return MF_ERR(MF_ERR_INVALID_ARG, "mf_ckpt_export: dtype %s (F32 or BF16)", mf_dtype_name(o->dtype));
  memset(info, 0, sizeof *info);
  char out[4200];
  MF_CHECK(out_path(out_dir, out, sizeof out));
  int is_ckpt = 0;
  MF_CHECK(resolve_source(src, info, &is_ckpt));
  mf_param_table *t = NULL;
  float *w = NULL;
  mf_config *cfg = NULL;
  mf_ckpt_export_opts oc = *o; /* the tokenizer is the source's: a checkpoint's model.path */
  mf_status st = load_weights(is_ckpt, info->source, &t, &w, &oc, &cfg);
  if (st == MF_OK) st = mf_ckpt_export_model(t, w, info->source, out, &oc, info);
  free(w);
  mf_param_table_free(t);
  mf_config_free(cfg);
  return st;
}
