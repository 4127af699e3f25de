/* The training data loader: windows of a .tokens file, shuffled per epoch (see loader.h). */
#include "src/train/loader.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/io/tokens.h"

typedef unsigned long long ull;
typedef long long ll;

/* ------------------------------------------------------------------ PRNG */

/* splitmix64 expands a seed into xoshiro256**'s state (the seeding its authors
 * recommend); xoshiro256** draws the shuffle. Both are fixed algorithms, so an
 * epoch's order is the same on every platform and libc. */

typedef struct xoshiro256 {
  uint64_t s[4];
} xoshiro256;

static uint64_t rotl64(uint64_t x, int k) {
  return (x << k) | (x >> (64 - k));
}

static uint64_t xoshiro_next(xoshiro256 *r) {
  uint64_t *s = r->s;
  const uint64_t result = rotl64(s[1] * 5, 7) * 9;
  const uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl64(s[3], 45);
  return result;
}

/* The generator of one epoch: a function of (seed, epoch) only, so an epoch's
 * order does not depend on how the run got there (resume). */
static void xoshiro_seed(xoshiro256 *r, uint64_t seed, uint64_t epoch) {
  uint64_t x = seed;
  uint64_t h = mf_splitmix64(&x);
  x = h ^ (epoch * 0xD1B54A32D192ED03ull);
  for (int i = 0; i < 4; i++) r->s[i] = mf_splitmix64(&x);
}

/* Uniform in [0, n), n >= 1, without modulo bias: draws below 2^64 mod n are
 * rejected so the rest fall evenly on the n residues. */
static uint64_t xoshiro_below(xoshiro256 *r, uint64_t n) {
  uint64_t threshold = (0 - n) % n;
  for (;;) {
    uint64_t v = xoshiro_next(r);
    if (v >= threshold) return v % n;
  }
}

/* ---------------------------------------------------------------- loader */

struct mf_loader {
  mf_tokens *tokens;
  int64_t seq_len, micro_batch;
  uint64_t seed;
  mf_loader_mode mode;
  uint64_t windows;
  uint64_t epoch, index; /* the next window handed out is the index-th of this epoch */
  uint64_t *perm;        /* TRAIN: the order of perm_epoch */
  uint64_t perm_epoch;
  uint32_t *win_ids; /* scratch: one window, seq_len + 1 tokens */
  uint8_t *win_mask; /* and its mask bits; NULL for a file without a mask */
  double target_fraction;
};

/* Fisher-Yates over the identity, so the order depends on (seed, epoch) only. */
static void build_permutation(mf_loader *l, uint64_t epoch) {
  xoshiro256 r;
  xoshiro_seed(&r, l->seed, epoch);
  for (uint64_t i = 0; i < l->windows; i++) l->perm[i] = i;
  for (uint64_t i = l->windows - 1; i > 0; i--) {
    uint64_t j = xoshiro_below(&r, i + 1);
    uint64_t t = l->perm[i];
    l->perm[i] = l->perm[j];
    l->perm[j] = t;
  }
  l->perm_epoch = epoch;
}

static mf_status count_targets(mf_loader *l) {
  if (!l->win_mask) {
    l->target_fraction = 1.0;
    return MF_OK;
  }
  size_t S = (size_t)l->seq_len;
  uint64_t counted = 0;
  for (uint64_t w = 0; w < l->windows; w++) {
    MF_CHECK(mf_tokens_read(l->tokens, w * S + 1, S, NULL, l->win_mask));
    for (size_t s = 0; s < S; s++) counted += l->win_mask[s];
  }
  l->target_fraction = (double)counted / ((double)l->windows * (double)S);
  return MF_OK;
}

mf_status mf_loader_create(const char *path, int64_t seq_len, int64_t micro_batch, uint64_t seed,
                           mf_loader_mode mode, mf_loader **out) {
  if (!out) return MF_ERR(MF_ERR_INVALID_ARG, "mf_loader_create: out is NULL");
  *out = NULL;
  if (!path) return MF_ERR(MF_ERR_INVALID_ARG, "mf_loader_create: path is NULL");
  if (mode != MF_LOADER_TRAIN && mode != MF_LOADER_EVAL)
    return MF_ERR(MF_ERR_INVALID_ARG, "%s: unknown loader mode %d", path, (int)mode);
  if (seq_len < 1 || seq_len >= INT32_MAX)
    return MF_ERR(MF_ERR_CONFIG, "%s: seq_len %lld is out of range (1 .. %d)", path, (ll)seq_len,
                  INT32_MAX - 1);
  int64_t tokens_per_batch;
  size_t bytes;
  if (micro_batch < 1 || __builtin_mul_overflow(micro_batch, seq_len, &tokens_per_batch) ||
      !mf_mul_size((size_t)tokens_per_batch, sizeof(int32_t), &bytes))
    return MF_ERR(MF_ERR_CONFIG,
                  "%s: micro_batch %lld is out of range (>= 1, micro_batch x seq_len %lld "
                  "int32 must fit in memory)",
                  path, (ll)micro_batch, (ll)seq_len);

  mf_status st = MF_OK;
  void *mem = NULL;
  MF_CHECK(mf_calloc(1, sizeof(mf_loader), "data loader", &mem));
  mf_loader *l = mem;
  l->seq_len = seq_len;
  l->micro_batch = micro_batch;
  l->seed = seed;
  l->mode = mode;
  MF_CHECK_GOTO(mf_tokens_open(path, &l->tokens), st, fail);

  uint64_t count = mf_tokens_count(l->tokens);
  if (count < (uint64_t)seq_len + 1) {
    st = MF_ERR(
        MF_ERR_CONFIG,
        "%s: %llu tokens are too few for one sequence: data.seq_len %lld needs seq_len + 1 = %lld tokens",
        path, (ull)count, (ll)seq_len, (ll)seq_len + 1);
    goto fail;
  }
  if (mf_tokens_vocab(l->tokens) > (uint32_t)INT32_MAX + 1u) {
    st = MF_ERR(MF_ERR_UNSUPPORTED, "%s: vocab %u does not fit int32 token ids", path,
                mf_tokens_vocab(l->tokens));
    goto fail;
  }
  l->windows = (count - 1) / (uint64_t)seq_len;

  size_t win = (size_t)seq_len + 1;
  MF_CHECK_GOTO(mf_malloc(win * sizeof *l->win_ids, "data loader window", &mem), st, fail);
  l->win_ids = mem;
  if (mf_tokens_has_mask(l->tokens)) {
    MF_CHECK_GOTO(mf_malloc(win, "data loader window mask", &mem), st, fail);
    l->win_mask = mem;
  }
  if (mode == MF_LOADER_TRAIN) {
    size_t perm_bytes;
    if (l->windows > SIZE_MAX || !mf_mul_size((size_t)l->windows, sizeof *l->perm, &perm_bytes)) {
      st = MF_ERR(MF_ERR_OUT_OF_MEMORY, "%s: %llu windows do not fit a permutation in memory", path,
                  (ull)l->windows);
      goto fail;
    }
    MF_CHECK_GOTO(mf_malloc(perm_bytes, "data loader epoch permutation", &mem), st, fail);
    l->perm = mem;
    build_permutation(l, 0);
  }
  MF_CHECK_GOTO(count_targets(l), st, fail);

  MF_LOGD("exec", "%s: %llu tokens, %llu windows of %lld + 1, %.1f%% of targets count, %s", path, (ull)count,
          (ull)l->windows, (ll)seq_len, 100.0 * l->target_fraction,
          mode == MF_LOADER_TRAIN ? "shuffled" : "in file order");
  *out = l;
  return MF_OK;

fail:
  mf_loader_free(l);
  return st;
}

void mf_loader_free(mf_loader *l) {
  if (!l) return;
  mf_tokens_close(l->tokens);
  free(l->perm);
  free(l->win_ids);
  free(l->win_mask);
  free(l);
}

/* One row of the batch from window w; returns the targets that count. */
static mf_status fill_row(mf_loader *l, uint64_t w, int32_t *ids, int32_t *targets, int64_t *n_targets) {
  size_t S = (size_t)l->seq_len;
  MF_CHECK(mf_tokens_read(l->tokens, w * S, S + 1, l->win_ids, l->win_mask));
  int64_t counted = 0;
  for (size_t s = 0; s < S; s++) {
    ids[s] = (int32_t)l->win_ids[s];
    int keep = !l->win_mask || l->win_mask[s + 1];
    targets[s] = keep ? (int32_t)l->win_ids[s + 1] : -1;
    counted += keep;
  }
  *n_targets += counted;
  return MF_OK;
}

mf_status mf_loader_next(mf_loader *l, int32_t *ids, int32_t *targets, int32_t *positions,
                         mf_loader_batch *batch) {
  if (!l || !ids || !targets) return MF_ERR(MF_ERR_INVALID_ARG, "mf_loader_next: NULL loader or buffer");
  size_t S = (size_t)l->seq_len;
  mf_loader_batch info = {0, 0, 0, l->epoch};
  for (int64_t b = 0; b < l->micro_batch; b++) {
    int32_t *row_ids = ids + (size_t)b * S, *row_targets = targets + (size_t)b * S;
    if (positions)
      for (size_t s = 0; s < S; s++) positions[(size_t)b * S + s] = (int32_t)s;
    if (info.end_of_pass && l->mode == MF_LOADER_EVAL) { /* padding after the pass's last window */
      memset(row_ids, 0, S * sizeof *row_ids);
      for (size_t s = 0; s < S; s++) row_targets[s] = -1;
      continue;
    }
    uint64_t w = l->mode == MF_LOADER_TRAIN ? l->perm[l->index] : l->index;
    MF_CHECK(fill_row(l, w, row_ids, row_targets, &info.n_targets));
    info.n_seq++;
    if (++l->index == l->windows) {
      info.end_of_pass = 1;
      l->epoch++;
      l->index = 0;
      if (l->mode == MF_LOADER_TRAIN) build_permutation(l, l->epoch);
    }
  }
  if (batch) *batch = info;
  return MF_OK;
}

void mf_loader_get_state(const mf_loader *l, mf_loader_state *out) {
  out->epoch = l->epoch;
  out->index = l->index;
  out->seed = l->seed;
  out->windows = l->windows;
}

mf_status mf_loader_set_state(mf_loader *l, const mf_loader_state *st) {
  const char *path = mf_tokens_path(l->tokens);
  if (st->windows != l->windows)
    return MF_ERR(MF_ERR_CONFIG,
                  "%s: the saved data position is for %llu windows but this file has %llu at seq_len %lld "
                  "(a different dataset or seq_len)",
                  path, (ull)st->windows, (ull)l->windows, (ll)l->seq_len);
  if (l->mode == MF_LOADER_TRAIN && st->seed != l->seed)
    return MF_ERR(MF_ERR_CONFIG, "%s: the saved data position was shuffled with seed %llu, not %llu", path,
                  (ull)st->seed, (ull)l->seed);
  if (st->index >= l->windows)
    return MF_ERR(MF_ERR_CONFIG, "%s: the saved data position %llu is past the %llu windows", path,
                  (ull)st->index, (ull)l->windows);
  l->epoch = st->epoch;
  l->index = st->index;
  if (l->mode == MF_LOADER_TRAIN && l->perm_epoch != l->epoch) build_permutation(l, l->epoch);
  return MF_OK;
}

uint64_t mf_loader_windows(const mf_loader *l) {
  return l->windows;
}
int64_t mf_loader_tokens_per_batch(const mf_loader *l) {
  return l->micro_batch * l->seq_len;
}
int64_t mf_loader_seq_len(const mf_loader *l) {
  return l->seq_len;
}
int64_t mf_loader_micro_batch(const mf_loader *l) {
  return l->micro_batch;
}
uint32_t mf_loader_vocab(const mf_loader *l) {
  return mf_tokens_vocab(l->tokens);
}
double mf_loader_target_fraction(const mf_loader *l) {
  return l->target_fraction;
}
const char *mf_loader_path(const mf_loader *l) {
  return mf_tokens_path(l->tokens);
}

/* ------------------------------------------------------------ opening */

/* Where a .tokens file made from `path` could go: its name with the
 * extension changed to .tokens (never path itself). */
static void tokens_name(const char *path, char *out, size_t cap) {
  const char *slash = strrchr(path, '/'), *dot = strrchr(path, '.');
  const size_t stem = dot && dot > (slash ? slash + 1 : path) ? (size_t)(dot - path) : strlen(path);
  snprintf(out, cap, "%.*s.tokens", (int)stem, path);
  if (strcmp(out, path) == 0) snprintf(out, cap, "%.*s-tokenized.tokens", (int)stem, path);
}

/* "PLACE: KEY: " ("command line" for an override: its value is the path
 * the message names next). */
static void place_of(const mf_loader_origin *o, char *out, size_t cap) {
  const char *w = o->where;
  if (w && strncmp(w, "command line:", 13) == 0)
    snprintf(out, cap, "command line: %s: ", o->key);
  else if (w)
    snprintf(out, cap, "%s: %s: ", w, o->key);
  else
    snprintf(out, cap, "%s: ", o->key);
}

/* A data file that is not a .tokens file: what it is and how to make one. */
static mf_status not_tokens(const mf_loader_origin *o, const char *path, mf_tokens_kind kind,
                            const char *what) {
  char place[1200], out[1200], make[3000], bytes[1400];
  place_of(o, place, sizeof place);
  tokens_name(path, out, sizeof out);
  const char *tok = o->model_dir ? o->model_dir : "MODEL_DIR";
  snprintf(bytes, sizeof bytes, "`moefit data bytes %s %s`", path, out);
  switch (kind) {
    case MF_TOKENS_KIND_JSONL:
    case MF_TOKENS_KIND_TEXT:
      snprintf(make, sizeof make,
               "make one with `tools/prepare_data.py --tokenizer %s %s --out %s` (%s's tokenizer; chat JSONL "
               "gets a loss mask on the assistant turns), or byte-level tokens (vocab 256) with %s",
               tok, path, out, o->model_dir ? "the model" : "a Hugging Face model dir", bytes);
      break;
    case MF_TOKENS_KIND_JSON:
      snprintf(make, sizeof make,
               "tools/prepare_data.py reads JSONL (one JSON object a line, its text in \"text\" or a chat in "
               "\"messages\") or plain text: write the documents that way, then `tools/prepare_data.py "
               "--tokenizer %s FILE.jsonl --out %s`",
               tok, out);
      break;
    case MF_TOKENS_KIND_YAML:
      snprintf(make, sizeof make,
               "%s takes a .tokens file, not a config: make one from your text with `tools/prepare_data.py "
               "--tokenizer %s TEXT_OR_JSONL --out X.tokens` or `moefit data bytes TEXT X.tokens`",
               o->key, tok);
      break;
    case MF_TOKENS_KIND_SAFETENSORS:
      snprintf(make, sizeof make,
               "%s takes a .tokens file, not weights: make one from your text with `tools/prepare_data.py "
               "--tokenizer %s TEXT_OR_JSONL --out X.tokens`",
               o->key, tok);
      break;
    case MF_TOKENS_KIND_COMPRESSED:
      snprintf(make, sizeof make,
               "decompress it, then make a .tokens file with `tools/prepare_data.py "
               "--tokenizer %s FILE --out %s` (or `moefit data bytes FILE %s`)",
               tok, out, out);
      break;
    default:
      snprintf(make, sizeof make,
               ".tokens files are made by `tools/prepare_data.py --tokenizer %s "
               "TEXT_OR_JSONL --out X.tokens` or `moefit data bytes TEXT X.tokens` (src/io/tokens.h "
               "describes the format)",
               tok);
  }
  return MF_ERR(MF_ERR_CONFIG, "%s%s: not a .tokens file: it is %s; %s", place, path, what, make);
}

mf_status mf_loader_open(const mf_loader_origin *o, const char *path, int64_t seq_len, int64_t micro_batch,
                         uint64_t seed, mf_loader_mode mode, mf_loader **out) {
  *out = NULL;
  char place[1200], what[512];
  place_of(o, place, sizeof place);
  mf_tokens_kind kind = MF_TOKENS_KIND_TOKENS;
  mf_status st = mf_tokens_sniff(path, &kind, what, sizeof what); /* missing, unreadable: "PATH: strerror" */
  if (st == MF_OK && kind != MF_TOKENS_KIND_TOKENS) return not_tokens(o, path, kind, what);
  if (st == MF_OK) st = mf_loader_create(path, seq_len, micro_batch, seed, mode, out);
  if (st != MF_OK) mf_error_prefix("%.*s", (int)(strlen(place) > 2 ? strlen(place) - 2 : 0), place);
  return st;
}
