/* `moefit inspect` on a resume checkpoint directory (its manifest, each
 * file's size and checksum verified, state.json's facts) and on a LoRA
 * adapter directory (adapter_config.json and the adapter tensors). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "src/ckpt/ckpt.h"
#include "src/cli/commands.h"
#include "src/io/safetensors.h"

#define MAX_FILES 64
#define MAX_JSON_BYTES ((size_t)16 << 20)

/* dir/name as a JSON object (NULL when missing, unreadable or not an
 * object: *why says which). */
static json_t *load_object(const char *dir, const char *name, char *why, size_t cap) {
  char path[4400];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  char *text = NULL;
  size_t len = 0;
  if (mf_read_file(path, MAX_JSON_BYTES, name, &text, &len) != MF_OK) {
    snprintf(why, cap, "%s", mf_last_error());
    return NULL;
  }
  json_error_t e;
  json_t *o = json_loadb(text, len, 0, &e);
  free(text);
  if (!json_is_object(o)) {
    snprintf(why, cap, "%s:%d:%d: %s", path, e.line, e.column, o ? "not a JSON object" : e.text);
    json_decref(o);
    return NULL;
  }
  return o;
}

static int64_t get_int(const json_t *o, const char *key, int64_t dflt) {
  const json_t *v = json_object_get(o, key);
  return json_is_integer(v) ? (int64_t)json_integer_value(v) : dflt;
}

static double get_num(const json_t *o, const char *key) {
  const json_t *v = json_object_get(o, key);
  return json_is_number(v) ? json_number_value(v) : NAN;
}

static const char *get_str(const json_t *o, const char *key, const char *dflt) {
  const json_t *v = json_object_get(o, key);
  return json_is_string(v) ? json_string_value(v) : dflt;
}

int mf_cli_is_checkpoint_dir(const char *dir) {
  char p[4400];
  snprintf(p, sizeof p, "%s/manifest.json", dir);
  return access(p, F_OK) == 0;
}

int mf_cli_is_adapter_dir(const char *dir) {
  char a[4400], b[4400], m[4400];
  snprintf(a, sizeof a, "%s/adapter_config.json", dir);
  snprintf(b, sizeof b, "%s/adapter_model.safetensors", dir);
  snprintf(m, sizeof m, "%s/model.safetensors", dir);
  return access(a, F_OK) == 0 && access(b, F_OK) == 0 && access(m, F_OK) != 0;
}

/* One manifest entry against the file on disk: "ok", or what is wrong
 * (into why); 1 when it verifies. */
static int verify_file(const char *dir, const mf_ckpt_file *f, char *why, size_t cap) {
  char path[4400];
  snprintf(path, sizeof path, "%s/%s", dir, f->name);
  struct stat sb;
  if (stat(path, &sb) != 0) {
    snprintf(why, cap, "MISSING");
    return 0;
  }
  if ((uint64_t)sb.st_size != f->bytes) {
    snprintf(why, cap, "SIZE %llu on disk (%s)", (unsigned long long)sb.st_size,
             (uint64_t)sb.st_size < f->bytes ? "truncated" : "grown");
    return 0;
  }
  const uint8_t *base = NULL;
  size_t size = 0;
  if (mf_map_file(path, &base, &size, NULL) != MF_OK) {
    snprintf(why, cap, "UNREADABLE (%s)", mf_last_error());
    return 0;
  }
  const uint64_t h = mf_ckpt_hash64(base, size);
  mf_unmap_file(base, size);
  if (h != f->hash) {
    snprintf(why, cap, "CHECKSUM %016llx: damaged", (unsigned long long)h);
    return 0;
  }
  snprintf(why, cap, "ok");
  return 1;
}

/* state.json's facts, for people. */
static void print_state(const char *dir) {
  char why[1200];
  json_t *s = load_object(dir, "state.json", why, sizeof why);
  if (!s) {
    printf("state.json: %s\n", why);
    return;
  }
  const int64_t step = get_int(s, "step", -1), planned = get_int(s, "train_steps", -1);
  printf("state (state.json):\n  step          %lld", (long long)step);
  if (planned > 0) printf(" of train.steps %lld", (long long)planned);
  printf(" (%lld skipped for non-finite values)\n", (long long)get_int(s, "skipped", 0));
  printf("  step 1 loss   %.4f\n  lr            %.3g (of step %lld; the next step's follows the schedule)\n",
         get_num(s, "first_loss"), get_num(s, "lr"), (long long)step);
  const json_t *d = json_object_get(s, "data");
  if (json_is_object(d))
    printf("  data          epoch %lld, %lld of %lld windows done in it (shuffle seed %lld)\n",
           (long long)get_int(d, "epoch", 0), (long long)get_int(d, "index", 0),
           (long long)get_int(d, "windows", 0), (long long)get_int(d, "seed", 0));
  const json_t *m = json_object_get(s, "model");
  if (json_is_object(m)) {
    char n1[32];
    printf("  model         %lld parameter tensors, %s values", (long long)get_int(m, "params", 0),
           mf_format_count((double)get_int(m, "numel", 0), n1, sizeof n1));
    if (get_int(m, "experts_routed", 0) > 0)
      printf(", %lld routed experts", (long long)get_int(m, "experts_routed", 0));
    printf("\n");
  }
  printf("  optimizer     AdamW moments %s; compression %s", get_str(s, "moments", "?"),
         get_str(s, "compression", "?"));
  if (get_int(s, "ranks", 1) > 1) printf("; written by %lld ranks", (long long)get_int(s, "ranks", 1));
  printf("\n");
  if (json_object_get(s, "lora_hot"))
    printf("  lora          adapters on each layer's hot experts (lora_hot)\n");
  json_decref(s);
}

int mf_cli_inspect_checkpoint(const char *dir) {
  mf_ckpt_file files[MAX_FILES];
  int n = 0;
  mf_status st = mf_ckpt_read_manifest(dir, files, MAX_FILES, &n);
  if (st != MF_OK) return mf_cli_fail("inspect", st);
  char marker[4400];
  snprintf(marker, sizeof marker, "%s/COMPLETE", dir);
  const int complete = access(marker, F_OK) == 0;
  printf("%s: a resume checkpoint, %s\n", dir,
         complete
             ? "complete"
             : "INCOMPLETE (no COMPLETE marker: its run stopped while writing it; resume passes over it)");
  size_t name_w = 4;
  for (int i = 0; i < n && i < MAX_FILES; i++)
    if (strlen(files[i].name) > name_w) name_w = strlen(files[i].name);
  printf("%-*s  %12s  %12s  %-16s  %-16s  %s\n", (int)name_w, "file", "bytes", "raw bytes", "stored",
         "checksum", "verified");
  int bad = 0;
  uint64_t total = 0, raw = 0;
  for (int i = 0; i < n && i < MAX_FILES; i++) {
    const mf_ckpt_file *f = &files[i];
    char b1[32], b2[32], why[256], hash[20];
    bad += !verify_file(dir, f, why, sizeof why);
    snprintf(hash, sizeof hash, "%016llx", (unsigned long long)f->hash);
    printf("%-*s  %12s  %12s  %-16s  %-16s  %s\n", (int)name_w, f->name,
           mf_format_bytes(f->bytes, b1, sizeof b1), mf_format_bytes(f->raw_bytes, b2, sizeof b2),
           f->zstd ? (f->byteplane ? "zstd, byteplane" : "zstd") : "plain", hash, why);
    total += f->bytes;
    raw += f->raw_bytes;
  }
  char b1[32], b2[32];
  printf("\n%d files, %s on disk (%s before compression): ", n, mf_format_bytes(total, b1, sizeof b1),
         mf_format_bytes(raw, b2, sizeof b2));
  if (bad)
    printf("%d of them do NOT match manifest.json: resume and export refuse this checkpoint\n", bad);
  else
    printf("every size and checksum matches manifest.json\n");
  print_state(dir);
  if (!bad && complete)
    printf(
        "\nnext: `moefit train CONFIG --resume %s` continues from it; `moefit export %s --out DIR` writes "
        "its "
        "weights as a Hugging Face model dir\n",
        dir, dir);
  if (!bad) return MF_EXIT_OK;
  fprintf(stderr, "moefit inspect: error: %s: %d file%s damaged or missing\n", dir, bad, bad == 1 ? "" : "s");
  return MF_EXIT_FAIL;
}

int mf_cli_inspect_adapter(const char *dir) {
  char why[1200];
  json_t *c = load_object(dir, "adapter_config.json", why, sizeof why);
  if (!c) {
    fprintf(stderr, "moefit inspect: error: %s\n", why);
    return MF_EXIT_FAIL;
  }
  const char *version = get_str(c, "peft_version", "");
  printf("%s: a LoRA adapter dir (PEFT%s%s, %s)\n", dir, version[0] ? " " : "", version,
         get_str(c, "peft_type", "no peft_type"));
  const int64_t r = get_int(c, "r", 0);
  const double alpha = get_num(c, "lora_alpha"), drop = get_num(c, "lora_dropout");
  printf("  rank (r)      %lld\n  lora_alpha    %g (scale alpha/r = %g)\n", (long long)r, alpha,
         r > 0 ? alpha / (double)r : NAN);
  if (isfinite(drop)) printf("  dropout       %g\n", drop);
  printf("  targets      ");
  const json_t *t = json_object_get(c, "target_modules");
  if (json_is_array(t)) {
    for (size_t i = 0; i < json_array_size(t); i++)
      printf("%s%s", i ? ", " : " ",
             json_is_string(json_array_get(t, i)) ? json_string_value(json_array_get(t, i)) : "?");
  } else if (json_is_string(t)) {
    printf(" %s (a regular expression)", json_string_value(t));
  } else {
    printf(" (none listed)");
  }
  printf("\n");
  const json_t *save = json_object_get(c, "modules_to_save");
  if (json_is_array(save) && json_array_size(save) > 0) {
    printf("  trained whole");
    for (size_t i = 0; i < json_array_size(save); i++)
      printf("%s%s", i ? ", " : " ",
             json_is_string(json_array_get(save, i)) ? json_string_value(json_array_get(save, i)) : "?");
    printf("\n");
  }
  const char *base = get_str(c, "base_model_name_or_path", "");
  printf("  base model    %s\n", base[0] ? base : "(not recorded: a random-init base, or set when exported)");
  json_decref(c);

  char path[4400];
  snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
  mf_safetensors *st = NULL;
  mf_status s = mf_safetensors_open(path, &st);
  if (s != MF_OK) return mf_cli_fail("inspect", s);
  const size_t n = mf_safetensors_count(st);
  size_t n_a = 0, n_b = 0;
  uint64_t params = 0;
  int dtypes[MF_DTYPE_COUNT_] = {0};
  for (size_t i = 0; i < n; i++) {
    const mf_st_tensor *x = mf_safetensors_get(st, i);
    n_a += strstr(x->name, "lora_A") != NULL;
    n_b += strstr(x->name, "lora_B") != NULL;
    params += x->numel;
    dtypes[x->dtype]++;
  }
  char b1[32], n1[32];
  printf(
      "  tensors       %zu in adapter_model.safetensors (%zu lora_A, %zu lora_B, %zu other): %s parameters, "
      "%s,",
      n, n_a, n_b, n - n_a - n_b, mf_format_count((double)params, n1, sizeof n1),
      mf_format_bytes(mf_safetensors_total_bytes(st), b1, sizeof b1));
  for (int d = 1; d < MF_DTYPE_COUNT_; d++)
    if (dtypes[d]) printf(" %s", mf_dtype_name((mf_dtype)d));
  printf("\n  adapted       %zu modules (one lora_A/lora_B pair each)\n", n_a < n_b ? n_a : n_b);
  mf_safetensors_close(st);
  printf(
      "\nnext: `moefit eval CONFIG --model %s` evaluates it on the config's base; `moefit inspect %s` lists "
      "every tensor\n",
      dir, path);
  return MF_EXIT_OK;
}
