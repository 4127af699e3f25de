/*
 * The resolved config as YAML (every default written out, in the key table's
 * order) and the key list of --help. Written so that loading the output gives
 * an equal config: floats with the fewest digits that read back exactly,
 * sizes in the largest exact binary unit, strings quoted when plain YAML would
 * read them differently.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "src/config/config_impl.h"

static void put_float(FILE *f, double v) {
  char buf[64];
  if (isnan(v)) {
    fputs("null", f);
    return;
  }
  if (v == floor(v) && fabs(v) < 1e15) {
    fprintf(f, "%.1f", v);
    return;
  }
  for (int p = 1; p <= 17; p++) {
    snprintf(buf, sizeof buf, "%.*g", p, v);
    if (strtod(buf, NULL) == v) break;
  }
  fputs(buf, f);
}

static void put_size(FILE *f, uint64_t v) {
  static const struct {
    const char *unit;
    int shift;
  } units[] = {{"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}};
  if (v == MF_CONFIG_SIZE_AUTO) {
    fputs("auto", f);
    return;
  }
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
    uint64_t u = (uint64_t)1 << units[i].shift;
    if (v % u == 0) {
      fprintf(f, "%llu%s", (unsigned long long)(v / u), units[i].unit);
      return;
    }
  }
  fprintf(f, "%llu", (unsigned long long)v);
}

/* Plain when YAML reads it back as the same string and nobody would read it as
 * a number, a boolean or null; double-quoted otherwise. */
static int plain_ok(const char *s) {
  static const char *const words[] = {"null", "~",   "true", "false", "yes", "no",
                                      "on",   "off", "y",    "n",     "auto"};
  if (!s[0] || !strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_/.", s[0])) return 0;
  if (strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_/.+-") != strlen(s)) return 0;
  for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
    if (strcasecmp(s, words[i]) == 0) return strcmp(s, "auto") == 0;
  char *end;
  strtod(s, &end);
  return *end != 0; /* reads as a number: quote it */
}

static void put_str(FILE *f, const char *s) {
  if (!s) {
    fputs("null", f);
    return;
  }
  if (plain_ok(s)) {
    fputs(s, f);
    return;
  }
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\')
      fprintf(f, "\\%c", *p);
    else if (*p == '\n')
      fputs("\\n", f);
    else if (*p == '\t')
      fputs("\\t", f);
    else if (*p < 0x20 || *p == 0x7f)
      fprintf(f, "\\x%02X", *p);
    else
      fputc(*p, f); /* UTF-8 passes through */
  }
  fputc('"', f);
}

static const char *last_part(const char *path) {
  const char *dot = strrchr(path, '.');
  return dot ? dot + 1 : path;
}

static int depth_of(const char *p) {
  int d = 0;
  for (; *p; p++) d += *p == '.';
  return d;
}

static void put_overrides(FILE *f, const mf_config_memory *m, int indent) {
  if (m->n_overrides == 0) {
    fputs(" []\n", f);
    return;
  }
  fputc('\n', f);
  for (size_t i = 0; i < m->n_overrides; i++) {
    const mf_config_mem_override *o = &m->overrides[i];
    const char *names[] = {"match", "params", "activations", "grads", "optimizer"};
    const char *vals[] = {o->match, o->params, o->activations, o->grads, o->optimizer};
    int first = 1;
    for (int j = 0; j < 5; j++) {
      if (!vals[j]) continue;
      fprintf(f, "%*s%s %s: ", indent + 2, "", first ? "-" : " ", names[j]);
      put_str(f, vals[j]);
      fputc('\n', f);
      first = 0;
    }
  }
}

mf_status mf_config_print(const mf_config *cfg, FILE *f) {
  if (!cfg || !f) return MF_ERR(MF_ERR_INVALID_ARG, "mf_config_print: NULL argument");
  fputs("# moefit config", f);
  if (cfg->source) {
    fputs(" resolved from ", f);
    for (const unsigned char *p = (const unsigned char *)cfg->source; *p; p++) fputc(*p < 0x20 ? '?' : *p, f);
  }
  fputs(" (every default filled in)\n", f);
  for (size_t i = 0; i < mf_config_n_keys; i++) {
    const mf_config_key *k = &mf_config_keys[i];
    const int init = strncmp(k->path, "model.init", 10) == 0;
    if (init && !cfg->model.has_init) continue;
    if (strcmp(k->path, "model.path") == 0 && !cfg->model.path) continue;
    const int depth = depth_of(k->path);
    if (depth == 0 && i > 0) fputc('\n', f);
    fprintf(f, "%*s%s:", 2 * depth, "", last_part(k->path));
    const void *v = (const char *)cfg + k->off;
    char buf[64];
    if (k->kind == MF_CK_OVERRIDES) {
      put_overrides(f, &cfg->memory, 2 * depth);
      continue;
    }
    if (k->kind != MF_CK_SECTION) fputc(' ', f);
    switch (k->kind) {
      case MF_CK_SECTION:
        break;
      case MF_CK_INT:
        fprintf(f, "%lld", (long long)*(const int64_t *)v);
        break;
      case MF_CK_U64:
        fprintf(f, "%llu", (unsigned long long)*(const uint64_t *)v);
        break;
      case MF_CK_FLOAT:
        put_float(f, *(const double *)v);
        break;
      case MF_CK_BOOL:
        fputs(*(const int *)v ? "true" : "false", f);
        break;
      case MF_CK_STR:
        put_str(f, *(char *const *)v);
        break;
      case MF_CK_SIZE:
        put_size(f, *(const uint64_t *)v);
        break;
      case MF_CK_ENUM: {
        int e;
        memcpy(&e, v, sizeof e);
        const char *c = mf_config_key_choice(k, e, buf, sizeof buf);
        fputs(c ? c : "invalid", f);
        break;
      }
      case MF_CK_FAMILY:
        fputs(mf_family_name(cfg->model.init.family), f);
        break;
      case MF_CK_NAMELIST: {
        const mf_config_lora *l = &cfg->train.lora;
        fputc('[', f);
        for (int64_t j = 0; j < l->n_targets; j++) fprintf(f, "%s%s", j ? ", " : "", l->targets[j]);
        fputc(']', f);
        break;
      }
      case MF_CK_INTLIST: {
        const mf_model_spec *s = &cfg->model.init;
        fputc('[', f);
        for (int64_t j = 0; j < s->n_mlp_only; j++) fprintf(f, "%s%d", j ? ", " : "", s->mlp_only_layers[j]);
        fputc(']', f);
        break;
      }
      case MF_CK_OVERRIDES:
        break;
    }
    fputc('\n', f);
  }
  if (fflush(f) != 0 || ferror(f)) return MF_ERR(MF_ERR_IO, "writing the config failed");
  return MF_OK;
}

void mf_config_print_keys(FILE *f) {
  for (size_t i = 0; i < mf_config_n_keys; i++) {
    const mf_config_key *k = &mf_config_keys[i];
    char type[96];
    if (k->kind == MF_CK_SECTION) {
      fprintf(f, "  %-33s %s\n", k->path, k->help);
      continue;
    }
    const char *def = k->flags & MF_CK_REQUIRED ? "(required)" : k->def ? k->def : "-";
    const int top = !strchr(k->path, '.');
    fprintf(f, "%*s%-*s %-12s %s [%s]\n", top ? 2 : 4, "", top ? 33 : 31, k->path, def, k->help,
            mf_config_key_type(k, type, sizeof type));
  }
}
