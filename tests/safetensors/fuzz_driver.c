/*
 * A standalone driver for fuzz_safetensors.c where libFuzzer is not used (gcc,
 * the normal and ASan test runs): it replays built-in seeds, then a bounded
 * number of deterministic mutations of them, through LLVMFuzzerTestOneInput.
 *
 *   fuzz_safetensors                      seeds + FUZZ_ITERS (default 20000) mutations
 *   fuzz_safetensors FILE|DIR...          also replays those inputs (e.g. a crash file)
 *   fuzz_safetensors --write-seeds DIR    writes the seeds as a libFuzzer corpus
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "src/io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_SEEDS 64
#define FUZZ_MAX_INPUT (1u << 20)

typedef struct {
  uint8_t *bytes;
  size_t size;
} buf_t;

static buf_t g_seeds[MAX_SEEDS];
static size_t g_n_seeds;
static size_t g_accepted, g_rejected;

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) { /* xorshift64*: deterministic across runs */
  g_rng ^= g_rng >> 12;
  g_rng ^= g_rng << 25;
  g_rng ^= g_rng >> 27;
  return g_rng * 0x2545F4914F6CDD1Dull;
}
static size_t rnd_below(size_t n) {
  return n ? (size_t)(rnd() % n) : 0;
}

static void add_seed_bytes(const uint8_t *p, size_t n) {
  if (g_n_seeds == MAX_SEEDS) return;
  uint8_t *b = (uint8_t *)malloc(n ? n : 1);
  if (!b) abort();
  memcpy(b, p, n);
  g_seeds[g_n_seeds++] = (buf_t){b, n};
}

/* u64 LE length | json | data_len bytes of a pattern. */
static void add_seed(const char *json, size_t data_len) {
  size_t jl = strlen(json), n = 8 + jl + data_len;
  uint8_t *b = (uint8_t *)malloc(n);
  if (!b) abort();
  for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)jl >> (8 * i));
  memcpy(b + 8, json, jl);
  for (size_t i = 0; i < data_len; i++) b[8 + jl + i] = (uint8_t)(i * 7 + 1);
  add_seed_bytes(b, n);
  free(b);
}

/* A seed from the real writer, so the corpus has the reference layout. */
static void add_written_seed(void) {
  const char *tmp = getenv("TEST_TMPDIR");
  char path[4096];
  snprintf(path, sizeof path, "%s/fuzz_seed.safetensors", tmp ? tmp : "/tmp");
  static const float w[6] = {1, 2, 3, 4, 5, 6};
  static const uint16_t h[3] = {0x3f80, 0x4000, 0x4040};
  static const int64_t step = 7;
  mf_st_tensor ts[4];
  memset(ts, 0, sizeof ts);
  ts[0] = (mf_st_tensor){
      .name = "model.layers.0.w", .dtype = MF_DTYPE_F32, .ndim = 2, .shape = {2, 3}, .data = w};
  ts[1] =
      (mf_st_tensor){.name = "model.norm.weight", .dtype = MF_DTYPE_BF16, .ndim = 1, .shape = {3}, .data = h};
  ts[2] = (mf_st_tensor){.name = "step", .dtype = MF_DTYPE_I64, .ndim = 0, .data = &step};
  ts[3] = (mf_st_tensor){.name = "empty", .dtype = MF_DTYPE_U8, .ndim = 1, .shape = {0}};
  mf_st_meta meta[] = {{"producer", "moefit"}};
  if (mf_safetensors_write(path, ts, 4, meta, 1) != MF_OK) {
    fprintf(stderr, "fuzz driver: cannot write a seed: %s\n", mf_last_error());
    return;
  }
  FILE *f = fopen(path, "rb");
  if (!f) return;
  uint8_t b[4096];
  size_t n = fread(b, 1, sizeof b, f);
  fclose(f);
  remove(path);
  add_seed_bytes(b, n);
}

static void build_seeds(void) {
  add_seed("{}", 0);
  add_seed("{}      ", 0);
  add_seed("{\"__metadata__\":{\"format\":\"pt\"}}", 0);
  add_seed(
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
      "\"b\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[16,22]}}",
      22);
  add_seed(
      "{\"s\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[0,8]},"
      "\"e\":{\"dtype\":\"I8\",\"shape\":[0,4],\"data_offsets\":[8,8]},"
      "\"f\":{\"dtype\":\"F8_E5M2\",\"shape\":[1,1,1,1,1,1,1,2],\"data_offsets\":[8,10]}}",
      10);
  add_seed(
      "{\"__metadata__\":{\"k\":\"v\",\"format\":\"pt\"},"
      "\"x\":{\"dtype\":\"U16\",\"shape\":[2],\"data_offsets\":[0,4]},"
      "\"y\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[4,12]},"
      "\"z\":{\"dtype\":\"BOOL\",\"shape\":[1],\"data_offsets\":[12,13]}}",
      13);
  add_seed(
      "{\"t\":{\"dtype\":\"F8_E4M3\",\"shape\":[4],\"data_offsets\":[0,4]},"
      "\"u\":{\"dtype\":\"U32\",\"shape\":[1],\"data_offsets\":[4,8]},"
      "\"v\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[8,12]},"
      "\"w\":{\"dtype\":\"I16\",\"shape\":[1],\"data_offsets\":[12,14]},"
      "\"q\":{\"dtype\":\"U64\",\"shape\":[1],\"data_offsets\":[14,22]},"
      "\"r\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[22,26]},"
      "\"p\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[26,27]}}",
      27);
  /* near misses */
  add_seed(
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
      "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
      12);
  add_seed(
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
      "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
      12);
  add_seed("{\"a\":{\"dtype\":\"F8_E8M0\",\"shape\":[4611686018427387904,4],\"data_offsets\":[0,4]}}", 4);
  add_seed("{\"a\":{\"dtype\":\"F32\",\"shape\":[[[2]]],\"data_offsets\":[0.5,-8],\"x\":null}}", 8);
  add_seed("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"a\":{}}", 8);
  add_seed("{\"__metadata__\":{\"n\":1,\"\\u00e9\\ud83d\\ude00\":\"\\\"\"}}", 0);
  add_written_seed();
}

static void run_one(const uint8_t *p, size_t n) {
  /* An exactly-sized copy, so ASan sees any read past the end. */
  uint8_t *copy = (uint8_t *)malloc(n ? n : 1);
  if (!copy) abort();
  memcpy(copy, p, n);
  LLVMFuzzerTestOneInput(copy, n);
  mf_safetensors *st = NULL;
  if (mf_safetensors_open_buffer("count", copy, n, &st) == MF_OK)
    g_accepted++;
  else
    g_rejected++;
  mf_safetensors_close(st);
  free(copy);
}

static const char k_chars[] = "{}[]\",:0123456789-.eE \\u\x00\xff\x80";
static const char *const k_numbers[] = {"0",
                                        "1",
                                        "-1",
                                        "8",
                                        "4294967296",
                                        "4611686018427387904",
                                        "9223372036854775807",
                                        "18446744073709551615",
                                        "1.5",
                                        "1e3",
                                        "-0"};
static const char *const k_tokens[] = {"\"dtype\"",
                                       "\"shape\"",
                                       "\"data_offsets\"",
                                       "\"__metadata__\"",
                                       "\"BF16\"",
                                       "\"F64\"",
                                       "[]",
                                       "{}",
                                       "null",
                                       "true",
                                       "[0,0]",
                                       "\"\\ud800\""};

/* Applies one mutation to b (capacity FUZZ_MAX_INPUT); returns the new size. When it
 * edits inside the header it often fixes the length field to match, so the
 * mutation reaches the JSON parser instead of the length check. */
static size_t mutate(uint8_t *b, size_t n) {
  uint64_t hlen = 0;
  if (n >= 8)
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | b[i];
  int fix_len = n >= 8 && hlen <= n - 8 && rnd_below(4) != 0;
  size_t at = rnd_below(n + 1);
  long delta = 0;
  switch (rnd_below(10)) {
    case 0:
      if (n) b[rnd_below(n)] ^= (uint8_t)(1u << rnd_below(8));
      break;
    case 1:
      if (n) b[rnd_below(n)] = (uint8_t)rnd();
      break;
    case 2:
      if (n) b[rnd_below(n)] = (uint8_t)k_chars[rnd_below(sizeof k_chars - 1)];
      break;
    case 3: { /* insert a token or a number */
      const char *tok = rnd_below(2) ? k_tokens[rnd_below(sizeof k_tokens / sizeof *k_tokens)]
                                     : k_numbers[rnd_below(sizeof k_numbers / sizeof *k_numbers)];
      size_t tl = strlen(tok);
      if (n + tl > FUZZ_MAX_INPUT) break;
      memmove(b + at + tl, b + at, n - at);
      memcpy(b + at, tok, tl);
      n += tl;
      delta = (long)tl;
      break;
    }
    case 4: { /* delete a range */
      if (at == n) break;
      size_t len = 1 + rnd_below(n - at < 16 ? n - at : 16);
      memmove(b + at, b + at + len, n - at - len);
      n -= len;
      delta = -(long)len;
      break;
    }
    case 5: { /* replace a run of digits with another number */
      size_t i = at;
      while (i < n && !(b[i] >= '0' && b[i] <= '9')) i++;
      size_t j = i;
      while (j < n && ((b[j] >= '0' && b[j] <= '9') || b[j] == '-')) j++;
      if (i == n) break;
      const char *num = k_numbers[rnd_below(sizeof k_numbers / sizeof *k_numbers)];
      size_t nl = strlen(num);
      if (n - (j - i) + nl > FUZZ_MAX_INPUT) break;
      memmove(b + i + nl, b + j, n - j);
      memcpy(b + i, num, nl);
      n = n - (j - i) + nl;
      delta = (long)nl - (long)(j - i);
      at = i;
      break;
    }
    case 6: { /* a hostile or off-by-a-little header length */
      static const uint64_t edge[] = {0, 1, 7, 100000000, 100000001, 1ull << 63, ~0ull};
      uint64_t v = rnd_below(2) ? edge[rnd_below(7)] : hlen + (uint64_t)(long)(rnd_below(17) - 8);
      if (n >= 8)
        for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
      fix_len = 0;
      break;
    }
    case 7: /* truncate */
      n = at;
      fix_len = 0;
      break;
    case 8: { /* duplicate a range */
      if (at == n) break;
      size_t len = 1 + rnd_below(n - at < 64 ? n - at : 64);
      if (n + len > FUZZ_MAX_INPUT) break;
      size_t to = rnd_below(n + 1);
      uint8_t tmp[64];
      memcpy(tmp, b + at, len);
      memmove(b + to + len, b + to, n - to);
      memcpy(b + to, tmp, len);
      n += len;
      delta = (long)len;
      at = to;
      break;
    }
    default: /* append data bytes */
      if (n + 8 <= FUZZ_MAX_INPUT) {
        memset(b + n, 0xab, 8);
        n += 8;
      }
      fix_len = 0;
      break;
  }
  if (fix_len && delta && at >= 8 && at <= 8 + hlen) {
    uint64_t v = hlen + (uint64_t)delta;
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
  }
  return n;
}

static int replay_path(const char *path) {
  struct stat sb;
  if (stat(path, &sb) != 0) {
    fprintf(stderr, "fuzz driver: %s: no such file\n", path);
    return 1;
  }
  if (S_ISDIR(sb.st_mode)) {
    DIR *d = opendir(path);
    struct dirent *e;
    int rc = 0;
    while (d && (e = readdir(d)) != NULL) {
      if (e->d_name[0] == '.') continue;
      char p[4096];
      snprintf(p, sizeof p, "%s/%s", path, e->d_name);
      rc |= replay_path(p);
    }
    if (d) closedir(d);
    return rc;
  }
  FILE *f = fopen(path, "rb");
  if (!f) return 1;
  uint8_t *b = (uint8_t *)malloc(FUZZ_MAX_INPUT);
  if (!b) abort();
  size_t n = fread(b, 1, FUZZ_MAX_INPUT, f);
  fclose(f);
  run_one(b, n);
  free(b);
  return 0;
}

static int write_seeds(const char *dir) {
  mkdir(dir, 0755);
  for (size_t i = 0; i < g_n_seeds; i++) {
    char p[4096];
    snprintf(p, sizeof p, "%s/seed_%02zu.safetensors", dir, i);
    FILE *f = fopen(p, "wb");
    if (!f || fwrite(g_seeds[i].bytes, 1, g_seeds[i].size, f) != g_seeds[i].size) {
      fprintf(stderr, "fuzz driver: cannot write %s\n", p);
      if (f) fclose(f);
      return 1;
    }
    fclose(f);
  }
  printf("wrote %zu seeds to %s\n", g_n_seeds, dir);
  return 0;
}

int main(int argc, char **argv) {
  build_seeds();
  int rc = 0;
  if (argc == 3 && strcmp(argv[1], "--write-seeds") == 0) {
    rc = write_seeds(argv[2]);
  } else {
    for (int i = 1; i < argc; i++) rc |= replay_path(argv[i]);
    for (size_t i = 0; i < g_n_seeds; i++) run_one(g_seeds[i].bytes, g_seeds[i].size);
    long iters = 20000;
    const char *env = getenv("FUZZ_ITERS");
    if (env) iters = strtol(env, NULL, 10);
    uint8_t *b = (uint8_t *)malloc(FUZZ_MAX_INPUT);
    if (!b) abort();
    for (long it = 0; it < iters; it++) {
      const buf_t *seed = &g_seeds[rnd_below(g_n_seeds)];
      memcpy(b, seed->bytes, seed->size);
      size_t n = seed->size;
      int k = 1 + (int)rnd_below(4);
      for (int m = 0; m < k; m++) n = mutate(b, n);
      run_one(b, n);
    }
    free(b);
    printf("fuzz_safetensors: %zu seeds + %ld mutations: %zu accepted, %zu rejected, no broken promise\n",
           g_n_seeds, iters, g_accepted, g_rejected);
  }
  for (size_t i = 0; i < g_n_seeds; i++) free(g_seeds[i].bytes);
  return rc;
}
