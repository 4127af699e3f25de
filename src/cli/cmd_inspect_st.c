/* `moefit inspect` on safetensors: a file, a sharded index or a model directory.
 * Prints one aligned row per tensor (in natural name order, so layers.2 comes
 * before layers.10), then totals, per-dtype totals, shards and metadata. */
#include <stdlib.h>
#include <string.h>

#include "src/cli/commands.h"
#include "src/io/safetensors.h"

/* Natural order: runs of digits compare as numbers. */
static int natural_cmp(const char *a, const char *b) {
  while (*a && *b) {
    if (*a >= '0' && *a <= '9' && *b >= '0' && *b <= '9') {
      while (*a == '0') a++;
      while (*b == '0') b++;
      size_t na = strspn(a, "0123456789"), nb = strspn(b, "0123456789");
      if (na != nb) return na < nb ? -1 : 1;
      int c = strncmp(a, b, na);
      if (c) return c;
      a += na;
      b += nb;
    } else {
      if (*a != *b) return (unsigned char)*a < (unsigned char)*b ? -1 : 1;
      a++;
      b++;
    }
  }
  return (unsigned char)*a - (unsigned char)*b;
}

static int cmp_tensor_ptr(const void *x, const void *y) {
  const mf_st_tensor *a = *(const mf_st_tensor *const *)x, *b = *(const mf_st_tensor *const *)y;
  int c = natural_cmp(a->name, b->name);
  return c ? c : strcmp(a->name, b->name);
}

static void format_shape(const mf_st_tensor *t, char *buf, size_t cap) {
  size_t len = (size_t)snprintf(buf, cap, "[");
  for (int d = 0; d < t->ndim && len < cap; d++)
    len += (size_t)snprintf(buf + len, cap - len, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
  if (len < cap) snprintf(buf + len, cap - len, "]");
}

/* A metadata key or value on one line: control characters shown as '?',
 * values past 200 bytes cut (some exporters store whole configs there). */
static void print_meta(const mf_st_meta *m) {
  printf("  ");
  for (const char *p = m->key; *p; p++) putchar((unsigned char)*p < 0x20 ? '?' : *p);
  printf(": ");
  size_t len = strlen(m->value);
  for (size_t i = 0; i < len && i < 200; i++) putchar((unsigned char)m->value[i] < 0x20 ? '?' : m->value[i]);
  if (len > 200) printf("... (%zu bytes)", len);
  printf("\n");
}

static const char *base_name(const char *p) {
  const char *s = strrchr(p, '/');
  return s ? s + 1 : p;
}

int mf_cli_inspect_safetensors(const char *path) {
  mf_safetensors *st = NULL;
  mf_status s = mf_safetensors_open(path, &st);
  if (s != MF_OK) return mf_cli_fail("inspect", s);

  size_t n = mf_safetensors_count(st), n_shards = mf_safetensors_shard_count(st);
  const mf_st_tensor **order = (const mf_st_tensor **)calloc(n ? n : 1, sizeof *order);
  if (!order) {
    mf_safetensors_close(st);
    return mf_cli_fail("inspect", MF_ERR(MF_ERR_OUT_OF_MEMORY, "out of host memory"));
  }
  size_t name_w = 4, shape_w = 5;
  char shape[256], b1[32], b2[32];
  for (size_t i = 0; i < n; i++) {
    order[i] = mf_safetensors_get(st, i);
    size_t len = strlen(order[i]->name);
    if (len > name_w) name_w = len;
    format_shape(order[i], shape, sizeof shape);
    if (strlen(shape) > shape_w) shape_w = strlen(shape);
  }
  if (name_w > 96) name_w = 96; /* longer names just push their row */
  qsort(order, n, sizeof *order, cmp_tensor_ptr);

  const char *index = mf_safetensors_index_path(st);
  printf("%s: %s, %zu tensor%s\n", path, index ? "sharded safetensors" : "safetensors", n, n == 1 ? "" : "s");
  printf("%-*s  %-8s  %-*s  %12s%s\n", (int)name_w, "name", "dtype", (int)shape_w, "shape", "bytes",
         n_shards > 1 ? "  shard" : "");
  uint64_t params = 0, dt_count[MF_DTYPE_COUNT_] = {0}, dt_params[MF_DTYPE_COUNT_] = {0},
           dt_bytes[MF_DTYPE_COUNT_] = {0};
  for (size_t i = 0; i < n; i++) {
    const mf_st_tensor *t = order[i];
    format_shape(t, shape, sizeof shape);
    printf("%-*s  %-8s  %-*s  %12s", (int)name_w, t->name, mf_dtype_name(t->dtype), (int)shape_w, shape,
           mf_format_bytes(t->nbytes, b1, sizeof b1));
    if (n_shards > 1) printf("  %5d", t->shard + 1);
    printf("\n");
    params += t->numel;
    dt_count[t->dtype]++;
    dt_params[t->dtype] += t->numel;
    dt_bytes[t->dtype] += t->nbytes;
  }

  uint64_t bytes = mf_safetensors_total_bytes(st);
  printf("\ntotal: %zu tensors, %s parameters (%llu), %s (%llu bytes), %zu shard%s\n", n,
         mf_format_count((double)params, b1, sizeof b1), (unsigned long long)params,
         mf_format_bytes(bytes, b2, sizeof b2), (unsigned long long)bytes, n_shards,
         n_shards == 1 ? "" : "s");
  for (int d = 1; d < MF_DTYPE_COUNT_; d++) {
    if (!dt_count[d]) continue;
    printf("  %-8s %8llu tensors  %10s parameters  %12s\n", mf_dtype_name((mf_dtype)d),
           (unsigned long long)dt_count[d], mf_format_count((double)dt_params[d], b1, sizeof b1),
           mf_format_bytes(dt_bytes[d], b2, sizeof b2));
  }
  if (index) {
    printf("\nshards (index %s):\n", index);
    for (size_t i = 0; i < n_shards; i++)
      printf("  %5zu  %s\n", i + 1, base_name(mf_safetensors_shard_path(st, i)));
    if (mf_safetensors_index_metadata_count(st)) {
      printf("\nindex metadata:\n");
      for (size_t i = 0; i < mf_safetensors_index_metadata_count(st); i++) {
        print_meta(mf_safetensors_index_metadata_at(st, i));
      }
    }
  }
  printf("\nmetadata:%s\n", mf_safetensors_metadata_count(st) ? "" : " (none)");
  for (size_t i = 0; i < mf_safetensors_metadata_count(st); i++) {
    print_meta(mf_safetensors_metadata_at(st, i));
  }
  free(order);
  mf_safetensors_close(st);
  return MF_EXIT_OK;
}
