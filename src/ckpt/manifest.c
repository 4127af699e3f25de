/* A checkpoint's manifest.json (ckpt.h), the one source of truth about its
 * files: sealed by its own checksum (the last line), parsed strictly (every
 * key known, every field that changes how a file is read present and
 * valid), listing each file a checkpoint has exactly once and no other; and
 * the files' bytes checked against it before anything reads them. */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "src/ckpt/ckpt_internal.h"
#include "src/io/json_util.h"

/* The files a checkpoint may hold besides manifest.json and COMPLETE: the
 * tensors plain or as one zstd frame (`zst`), the byte-plane filter only on
 * the master weights and the moments (`planes`). */
static const struct known_file {
  const char *name, *zst;
  int required, planes;
} k_files[] = {
    {"master.safetensors", "master.safetensors.zst", 1, 1},
    {"optimizer.safetensors", "optimizer.safetensors.zst", 1, 1},
    {"state.safetensors", NULL, 1, 0},
    {"state.json", NULL, 1, 0},
    {"config.yaml", NULL, 1, 0},
    {"plan.json", NULL, 0, 0},
    {"base.json", NULL, 0, 0},
};
#define N_KNOWN ((int)(sizeof k_files / sizeof k_files[0]))

/* The known file `name` is (its index; *zst: the .zst name), else -1. */
static int known_index(const char *name, int *zst) {
  for (int k = 0; k < N_KNOWN; k++) {
    if (strcmp(name, k_files[k].name) == 0) {
      *zst = 0;
      return k;
    }
    if (k_files[k].zst && strcmp(name, k_files[k].zst) == 0) {
      *zst = 1;
      return k;
    }
  }
  return -1;
}

/* ------------------------------------------------------------- the seal */

#define SEAL_TAIL "\"\n}\n"

/* '  "KEY": "' */
static size_t seal_head(const char *key, char *head, size_t cap) {
  const int n = snprintf(head, cap, "  \"%s\": \"", key);
  return n > 0 && (size_t)n < cap ? (size_t)n : 0;
}

size_t mf_ckpt_json_seal(char *text, size_t n, size_t cap, const char *key) {
  char head[96];
  const size_t hn = seal_head(key, head, sizeof head);
  if (!hn || n + hn + 16 + sizeof SEAL_TAIL > cap) return 0;
  const uint64_t h = mf_ckpt_hash64(text, n);
  return n + (size_t)snprintf(text + n, cap - n, "%s%016llx" SEAL_TAIL, head, (unsigned long long)h);
}

static int parse_hex16(const char *s, uint64_t *out) {
  uint64_t x = 0;
  for (int i = 0; i < 16; i++) {
    const char c = s[i];
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return 0;
    x = x << 4 | (uint64_t)d;
  }
  *out = x;
  return 1;
}

int mf_ckpt_json_sealed(const char *text, size_t len, const char *key, uint64_t *want, size_t *body) {
  char head[96];
  const size_t hn = seal_head(key, head, sizeof head);
  const size_t seal = hn + 16 + sizeof SEAL_TAIL - 1;
  if (!hn || len < seal || memcmp(text + len - seal, head, hn) != 0 ||
      !parse_hex16(text + len - seal + hn, want) ||
      memcmp(text + len - sizeof SEAL_TAIL + 1, SEAL_TAIL, sizeof SEAL_TAIL - 1) != 0)
    return 0;
  *body = len - seal;
  return 1;
}

size_t mf_ckpt_manifest_seal(char *text, size_t n, size_t cap) {
  return mf_ckpt_json_seal(text, n, cap, "manifest_hash");
}

/* The seal of text[len] against its body; a manifest without one is either
 * damaged or written before manifests were sealed (version 1): both refused. */
static mf_status check_seal(const char *path, const char *text, size_t len) {
  uint64_t want = 0;
  size_t body = 0;
  if (mf_ckpt_json_sealed(text, len, "manifest_hash", &want, &body)) {
    const uint64_t h = mf_ckpt_hash64(text, body);
    if (h == want) return MF_OK;
    return MF_ERR(MF_ERR_FORMAT,
                  "%s: checksum %016llx, its manifest_hash says %016llx (the manifest is damaged)", path,
                  (unsigned long long)h, (unsigned long long)want);
  }
  json_error_t e;
  json_t *root = json_loadb(text, len, 0, &e);
  const json_t *version = json_object_get(root, "version");
  const int old = json_is_object(root) && !json_object_get(root, "manifest_hash") && json_is_integer(version) &&
                  json_integer_value(version) == 1;
  json_decref(root);
  if (old)
    return MF_ERR(MF_ERR_FORMAT,
                  "%s: no manifest_hash: the checkpoint predates verified manifests (version 1), whose compression "
                  "and filter no checksum covers: refused rather than trusted (train again, or resume and "
                  "export it with the moefit that wrote it)",
                  path);
  return MF_ERR(MF_ERR_FORMAT,
                "%s: its last line is not the manifest_hash line (\"manifest_hash\": \"<16 hex digits>\" then "
                "\"}\"): the manifest is damaged or cut short",
                path);
}

/* ------------------------------------------------------------- parsing */

mf_status mf_ckpt_json_u64(const char *path, const json_t *o, const char *place, const char *key, uint64_t *out) {
  json_t *v = NULL;
  MF_CHECK(mf_io_json_get(path, o, place, key, &v));
  char where[160];
  snprintf(where, sizeof where, "%s.%s", place, key);
  int64_t x = 0;
  MF_CHECK(mf_io_json_nonneg(path, v, where, &x));
  *out = (uint64_t)x;
  return MF_OK;
}

mf_status mf_ckpt_json_str(const char *path, const json_t *o, const char *place, const char *key,
                           const char **out) {
  json_t *v = NULL;
  MF_CHECK(mf_io_json_get(path, o, place, key, &v));
  if (!json_is_string(v))
    return MF_ERR(MF_ERR_FORMAT, "%s: %s.%s: expected a string, got %s", path, place, key, mf_io_json_kind(v, 0));
  *out = json_string_value(v);
  return MF_OK;
}

mf_status mf_ckpt_json_hex(const char *path, const json_t *o, const char *place, const char *key,
                           uint64_t *out) {
  const char *s = NULL;
  MF_CHECK(mf_ckpt_json_str(path, o, place, key, &s));
  if (strlen(s) != 16 || !parse_hex16(s, out))
    return MF_ERR(MF_ERR_FORMAT, "%s: %s.%s: expected 16 lowercase hex digits, got '%.40s'", path, place, key, s);
  return MF_OK;
}

static mf_status parse_entry(const char *path, const json_t *e, int i, mf_ckpt_file *f) {
  static const char *const keys[] = {"name", "bytes", "hash", "raw_bytes", "raw_hash", "compression", "filter"};
  char place[32];
  snprintf(place, sizeof place, "files[%d]", i);
  if (!json_is_object(e)) return MF_ERR(MF_ERR_FORMAT, "%s: %s: expected an object", path, place);
  MF_CHECK(mf_io_json_only_keys(path, e, place, keys, (int)(sizeof keys / sizeof keys[0])));
  const char *name = NULL, *comp = NULL, *filter = NULL;
  MF_CHECK(mf_ckpt_json_str(path, e, place, "name", &name));
  MF_CHECK(mf_ckpt_json_u64(path, e, place, "bytes", &f->bytes));
  MF_CHECK(mf_ckpt_json_hex(path, e, place, "hash", &f->hash));
  MF_CHECK(mf_ckpt_json_u64(path, e, place, "raw_bytes", &f->raw_bytes));
  MF_CHECK(mf_ckpt_json_hex(path, e, place, "raw_hash", &f->raw_hash));
  MF_CHECK(mf_ckpt_json_str(path, e, place, "compression", &comp));
  MF_CHECK(mf_ckpt_json_str(path, e, place, "filter", &filter));
  int zst = 0;
  const int k = known_index(name, &zst);
  if (k < 0)
    return MF_ERR(MF_ERR_FORMAT, "%s: %s.name: '%.80s' is not a file of a moefit checkpoint", path, place, name);
  snprintf(f->name, sizeof f->name, "%s", name);
  if (strcmp(comp, "zstd") != 0 && strcmp(comp, "none") != 0)
    return MF_ERR(MF_ERR_FORMAT, "%s: %s.compression: expected zstd or none, got '%.40s'", path, place, comp);
  f->zstd = strcmp(comp, "zstd") == 0;
  if (f->zstd != zst)
    return MF_ERR(MF_ERR_FORMAT, "%s: %s: %s with compression %s (a .zst name is zstd, any other none)", path,
                  place, name, comp);
  if (strcmp(filter, "byteplane") != 0 && strcmp(filter, "none") != 0)
    return MF_ERR(MF_ERR_FORMAT, "%s: %s.filter: expected \"byteplane\" or \"none\", got '%.40s'", path, place,
                  filter);
  f->byteplane = strcmp(filter, "byteplane") == 0;
  if (f->byteplane && !(f->zstd && k_files[k].planes))
    return MF_ERR(MF_ERR_FORMAT, "%s: %s: the byteplane filter on %s (only the zstd master and optimizer files have it)",
                  path, place, name);
  if (!f->zstd && (f->raw_bytes != f->bytes || f->raw_hash != f->hash))
    return MF_ERR(MF_ERR_FORMAT, "%s: %s: raw_bytes and raw_hash differ from bytes and hash without compression",
                  path, place);
  return MF_OK;
}

/* Each known file listed at most once, the required ones listed, the master
 * and optimizer files stored alike (state.json has one compression for both). */
static mf_status check_listing(const char *path, const mf_ckpt_manifest *m) {
  int at[N_KNOWN];
  for (int k = 0; k < N_KNOWN; k++) at[k] = -1;
  for (int i = 0; i < m->n; i++) {
    int zst = 0;
    const int k = known_index(m->files[i].name, &zst);
    if (at[k] >= 0)
      return MF_ERR(MF_ERR_FORMAT, "%s: files[%d] and files[%d] both list %s%s", path, at[k], i, k_files[k].name,
                    k_files[k].zst ? "[.zst]" : "");
    at[k] = i;
  }
  for (int k = 0; k < N_KNOWN; k++)
    if (k_files[k].required && at[k] < 0)
      return MF_ERR(MF_ERR_FORMAT, "%s: lists no %s%s (every checkpoint has one)", path, k_files[k].name,
                    k_files[k].zst ? "[.zst]" : "");
  const mf_ckpt_file *a = &m->files[at[0]], *b = &m->files[at[1]];
  if (a->zstd != b->zstd || a->byteplane != b->byteplane)
    return MF_ERR(MF_ERR_FORMAT, "%s: %s and %s are stored differently (compression or filter)", path, a->name,
                  b->name);
  return MF_OK;
}

/* A known file in dir that the manifest does not list (an entry taken out)
 * is refused: what is on disk is what the manifest says. */
static mf_status check_disk(const char *dir, const mf_ckpt_manifest *m) {
  DIR *d = opendir(dir);
  if (!d) return MF_ERR(MF_ERR_IO, "%s: opendir: %s", dir, strerror(errno));
  mf_status st = MF_OK;
  for (struct dirent *e; st == MF_OK && (e = readdir(d)) != NULL;) {
    int zst = 0;
    if (known_index(e->d_name, &zst) < 0 || mf_ckpt_manifest_find(m, e->d_name)) continue;
    st = MF_ERR(MF_ERR_FORMAT, "%s/%s: a checkpoint file that manifest.json does not list (the manifest is not "
                "the one written with it)", dir, e->d_name);
  }
  closedir(d);
  return st;
}

mf_status mf_ckpt_manifest_load(const char *dir, mf_ckpt_manifest *m) {
  memset(m, 0, sizeof *m);
  snprintf(m->dir, sizeof m->dir, "%s", dir);
  char path[4400];
  snprintf(path, sizeof path, "%s/manifest.json", dir);
  char *text = NULL;
  size_t len = 0;
  MF_CHECK(mf_read_file(path, MF_CKPT_MAX_JSON, "a checkpoint manifest", &text, &len));
  mf_status st = check_seal(path, text, len);
  json_t *root = NULL;
  json_error_t e;
  if (st == MF_OK) {
    root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &e);
    if (!json_is_object(root))
      st = MF_ERR(MF_ERR_FORMAT, "%s: line %d column %d: %s", path, e.line, e.column,
                  root ? "expected a JSON object" : e.text);
  }
  free(text);
  static const char *const keys[] = {"format", "version", "hash", "files", "manifest_hash"};
  const char *format = NULL, *hash = NULL;
  json_t *version = NULL, *arr = NULL;
  if (st == MF_OK) st = mf_io_json_only_keys(path, root, "manifest", keys, (int)(sizeof keys / sizeof keys[0]));
  if (st == MF_OK) st = mf_ckpt_json_str(path, root, "manifest", "format", &format);
  if (st == MF_OK) st = mf_ckpt_json_str(path, root, "manifest", "hash", &hash);
  if (st == MF_OK) st = mf_io_json_get(path, root, "manifest", "version", &version);
  if (st == MF_OK && (strcmp(format, MF_CKPT_FORMAT "-manifest") != 0 || strcmp(hash, MF_CKPT_HASH_NAME) != 0 ||
                      !json_is_integer(version) || json_integer_value(version) != MF_CKPT_VERSION))
    st = MF_ERR(MF_ERR_FORMAT,
                "%s: format '%.60s' version %lld with hash '%.40s' is not a moefit checkpoint manifest (%s version "
                "%d, %s)",
                path, format, json_is_integer(version) ? (long long)json_integer_value(version) : -1LL, hash,
                MF_CKPT_FORMAT "-manifest", MF_CKPT_VERSION, MF_CKPT_HASH_NAME);
  if (st == MF_OK) st = mf_io_json_get(path, root, "manifest", "files", &arr);
  if (st == MF_OK && (!json_is_array(arr) || json_array_size(arr) > MF_CKPT_MAX_FILES))
    st = MF_ERR(MF_ERR_FORMAT, "%s: files: expected an array of at most %d entries", path, MF_CKPT_MAX_FILES);
  if (st == MF_OK) m->n = (int)json_array_size(arr);
  for (int i = 0; st == MF_OK && i < m->n; i++) st = parse_entry(path, json_array_get(arr, (size_t)i), i, &m->files[i]);
  json_decref(root);
  if (st == MF_OK) st = check_listing(path, m);
  if (st == MF_OK) st = check_disk(dir, m);
  if (st != MF_OK) m->n = 0;
  return st;
}

const mf_ckpt_file *mf_ckpt_manifest_find(const mf_ckpt_manifest *m, const char *name) {
  for (int i = 0; i < m->n; i++)
    if (strcmp(m->files[i].name, name) == 0) return &m->files[i];
  return NULL;
}

const mf_ckpt_file *mf_ckpt_manifest_tensors(const mf_ckpt_manifest *m, const char *stem) {
  const size_t n = strlen(stem);
  for (int k = 0; k < N_KNOWN; k++) {
    if (strncmp(k_files[k].name, stem, n) != 0 || strcmp(k_files[k].name + n, ".safetensors") != 0) continue;
    const mf_ckpt_file *f = mf_ckpt_manifest_find(m, k_files[k].name);
    return f || !k_files[k].zst ? f : mf_ckpt_manifest_find(m, k_files[k].zst);
  }
  return NULL;
}

/* ------------------------------------------------------ the files' bytes */

/* bytes[size] of dir/f->name against its entry. */
static mf_status check_bytes(const char *path, const mf_ckpt_file *f, const void *bytes, size_t size) {
  if (size != f->bytes)
    return MF_ERR(MF_ERR_FORMAT, "%s: %zu bytes on disk, manifest.json says %llu (%s)", path, size,
                  (unsigned long long)f->bytes, size < f->bytes ? "truncated" : "grown");
  const uint64_t h = mf_ckpt_hash64(bytes, size);
  if (h != f->hash)
    return MF_ERR(MF_ERR_FORMAT, "%s: checksum %016llx, manifest.json says %016llx (the file is damaged)", path,
                  (unsigned long long)h, (unsigned long long)f->hash);
  return MF_OK;
}

mf_status mf_ckpt_map_checked(const char *dir, const mf_ckpt_file *f, const uint8_t **base, size_t *size) {
  char path[4400];
  snprintf(path, sizeof path, "%s/%s", dir, f->name);
  int err = 0;
  mf_status st = mf_map_file(path, base, size, &err);
  if (st != MF_OK)
    return err == ENOENT ? MF_ERR(MF_ERR_FORMAT, "%s: missing (manifest.json lists it)", path) : st;
  st = check_bytes(path, f, *base, *size);
  if (st != MF_OK) {
    mf_unmap_file(*base, *size);
    *base = NULL;
    *size = 0;
  }
  return st;
}

mf_status mf_ckpt_read_checked(const mf_ckpt_manifest *m, const char *name, char **text, size_t *len) {
  *text = NULL;
  *len = 0;
  char path[4400];
  snprintf(path, sizeof path, "%s/%s", m->dir, name);
  const mf_ckpt_file *f = mf_ckpt_manifest_find(m, name);
  if (!f) return MF_ERR(MF_ERR_FORMAT, "%s: manifest.json does not list it", path);
  struct stat sb;
  if (stat(path, &sb) != 0 && errno == ENOENT)
    return MF_ERR(MF_ERR_FORMAT, "%s: missing (manifest.json lists it)", path);
  char *t = NULL;
  size_t n = 0;
  MF_CHECK(mf_read_file(path, MF_CKPT_MAX_JSON, name, &t, &n));
  const mf_status st = check_bytes(path, f, t, n);
  if (st != MF_OK) {
    free(t);
    return st;
  }
  *text = t;
  *len = n;
  return MF_OK;
}

mf_status mf_ckpt_read_manifest(const char *dir, mf_ckpt_file *files, int cap, int *n) {
  mf_ckpt_manifest m;
  *n = 0;
  MF_CHECK(mf_ckpt_manifest_load(dir, &m));
  for (int i = 0; i < m.n && i < cap; i++) files[i] = m.files[i];
  *n = m.n;
  return MF_OK;
}

mf_status mf_ckpt_verify(const char *dir) {
  char marker[4400];
  snprintf(marker, sizeof marker, "%s/COMPLETE", dir);
  struct stat sb;
  if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
    return MF_ERR(MF_ERR_FORMAT, "%s: not a checkpoint directory", dir);
  if (stat(marker, &sb) != 0)
    return MF_ERR(MF_ERR_FORMAT, "%s: missing: the checkpoint was not finished (its run stopped while writing it)",
                  marker);
  mf_ckpt_manifest m;
  MF_CHECK(mf_ckpt_manifest_load(dir, &m));
  for (int i = 0; i < m.n; i++) {
    const uint8_t *base = NULL;
    size_t size = 0;
    MF_CHECK(mf_ckpt_map_checked(dir, &m.files[i], &base, &size));
    mf_unmap_file(base, size);
  }
  mf_ckpt_state_file sf;
  MF_CHECK(mf_ckpt_state_open(&m, &sf)); /* state.json against the manifest */
  mf_ckpt_state_close(&sf);
  return MF_OK;
}
