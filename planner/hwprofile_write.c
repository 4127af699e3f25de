/* Hardware profiles written as YAML that reads back bit for bit (see hwprofile.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planner/hwprofile.h"
#include "planner/hwprofile_internal.h"

/* ------------------------------------------------------------- writing */

/* v's shortest decimal that reads back as v, times 10^shift, written plain or
 * with an exponent (whichever is shorter), then `suffix`. parse_scaled(text,
 * -shift) gives v back exactly: the shift moves only the decimal point. */
static void fmt_decimal(double v, int shift, const char *suffix, char *buf, size_t cap) {
  if (v == 0) {
    snprintf(buf, cap, "0%s", suffix);
    return;
  }
  char e[40];
  for (int prec = 0; prec <= 16; prec++) {
    snprintf(e, sizeof e, "%.*e", prec, v);
    if (strtod(e, NULL) == v) break;
  }
  const char *x = e + (e[0] == '-');
  char ds[24];
  int n = 0;
  for (; *x && *x != 'e' && n < 23; x++)
    if (*x != '.') ds[n++] = *x;
  while (n > 1 && ds[n - 1] == '0') n--;
  ds[n] = 0;
  long ex = strtol(x + 1, NULL, 10) + shift; /* v = d.ddd x 10^ex */
  const char *sign = e[0] == '-' ? "-" : "";
  char sci[64], plain[64] = "";
  if (n > 1)
    snprintf(sci, sizeof sci, "%s%c.%se%ld", sign, ds[0], ds + 1, ex);
  else
    snprintf(sci, sizeof sci, "%s%ce%ld", sign, ds[0], ex);
  long point = ex + 1; /* digits before the decimal point */
  if (point > -24 && point < 24) {
    size_t o = (size_t)snprintf(plain, sizeof plain, "%s", sign);
    if (point <= 0) {
      o += (size_t)snprintf(plain + o, sizeof plain - o, "0.");
      for (long i = 0; i < -point; i++) plain[o++] = '0';
      snprintf(plain + o, sizeof plain - o, "%s", ds);
    } else if (point >= n) {
      o += (size_t)snprintf(plain + o, sizeof plain - o, "%s", ds);
      for (long i = n; i < point; i++) plain[o++] = '0';
      plain[o] = 0;
    } else {
      snprintf(plain + o, sizeof plain - o, "%.*s.%s", (int)point, ds, ds + point);
    }
  }
  snprintf(buf, cap, "%s%s", *plain && strlen(plain) <= strlen(sci) ? plain : sci, suffix);
}

static void fmt_number(double v, char *buf, size_t cap) {
  fmt_decimal(v, 0, "", buf, cap);
}

/* A bandwidth: the shortest text, with a decimal unit (the larger on a tie) or
 * a plain number. */
static void fmt_bandwidth(double v, char *buf, size_t cap) {
  static const char *const units[] = {"KB", "MB", "GB", "TB"};
  fmt_number(v, buf, cap);
  for (int u = 0; u < 4; u++) {
    char cand[64];
    if (v < pow(10.0, 3 * (u + 1))) break;
    fmt_decimal(v, -3 * (u + 1), units[u], cand, sizeof cand);
    if (strlen(cand) <= strlen(buf)) snprintf(buf, cap, "%s", cand);
  }
}

/* A size: the shortest exact text, with a binary unit or as digits. */
static void fmt_size(uint64_t v, char *buf, size_t cap) {
  static const char *const units[] = {"TiB", "GiB", "MiB", "KiB"};
  snprintf(buf, cap, "%llu", (unsigned long long)v);
  for (int u = 3; u >= 0; u--) {
    uint64_t m = (uint64_t)1 << (10 * (4 - u));
    if (v < m) continue;
    for (int prec = 1; prec <= 17; prec++) {
      char cand[64];
      uint64_t back;
      snprintf(cand, sizeof cand, "%.*g%s", prec, (double)v / (double)m, units[u]);
      if (strchr(cand, 'e') || mf_parse_size(cand, &back) != 0 || back != v) continue;
      if (strlen(cand) <= strlen(buf)) snprintf(buf, cap, "%s", cand);
      break;
    }
  }
}

/* "  # 23.54 GiB" after a size of a GiB or more not written in GiB or TiB, for people. */
static const char *size_note(const char *text, uint64_t v, char *buf, size_t cap) {
  char h[32];
  if (strstr(text, "GiB") || strstr(text, "TiB") || v < ((uint64_t)1 << 30)) return "";
  snprintf(buf, cap, "  # %s", mf_format_bytes(v, h, sizeof h));
  return buf;
}

static const char *fmt_duration(double s, char *buf, size_t cap) {
  if (s < 1e-3)
    snprintf(buf, cap, "%.3g us", s * 1e6);
  else if (s < 1)
    snprintf(buf, cap, "%.3g ms", s * 1e3);
  else
    snprintf(buf, cap, "%.3g s", s);
  return buf;
}

static void put_quoted(FILE *f, const char *s) {
  fputc('"', f);
  const unsigned char *u = (const unsigned char *)s;
  while (*u) {
    unsigned c = *u, n = 0, cp = c;
    if (c >= 0x80) {
      n = (c & 0xe0) == 0xc0 ? 1 : (c & 0xf0) == 0xe0 ? 2 : 3;
      cp = c & (0x3f >> n);
      for (unsigned k = 1; k <= n; k++) cp = (cp << 6) | (u[k] & 0x3f);
    }
    if (c == '"' || c == '\\') {
      fprintf(f, "\\%c", c);
    } else if (c == '\n') {
      fputs("\\n", f);
    } else if (c == '\t') {
      fputs("\\t", f);
    } else if (cp < 0x20 || cp == 0x7f) {
      fprintf(f, "\\x%02x", cp);
    } else if (cp == 0x85 || cp == 0x2028 || cp == 0x2029) {
      fputs(cp == 0x85 ? "\\N" : cp == 0x2028 ? "\\L" : "\\P", f); /* YAML line breaks */
    } else if ((cp >= 0x80 && cp < 0xa0) || cp == 0xfffe || cp == 0xffff) {
      fprintf(f, "\\u%04x", cp); /* not printable in YAML */
    } else {
      fwrite(u, 1, n + 1, f);
    }
    u += n + 1;
  }
  fputc('"', f);
}

mf_status mf_hwprofile_write(const mf_hwprofile *p, FILE *f) {
  MF_CHECK(mf_hwprofile_validate(p));
  char a[64], b[64], c[64], d[64];
  fputs("# moefit hardware profile (format: planner/hwprofile.h)\nname: ", f);
  put_quoted(f, p->name);
  fputs("\nsource: ", f);
  put_quoted(f, p->source);
  char note[48], note2[48];
  fmt_size(p->device_memory, a, sizeof a);
  fmt_size(p->device_reserve, b, sizeof b);
  fprintf(f, "\ndevice:\n  memory: %s%s\n  reserve: %s%s\n  copies_overlap_compute: %s\nlinks:\n", a,
          size_note(a, p->device_memory, note, sizeof note), b,
          size_note(b, p->device_reserve, note2, sizeof note2), p->copies_overlap_compute ? "true" : "false");
  fmt_bandwidth(p->h2d_bandwidth, a, sizeof a);
  fmt_decimal(p->h2d_latency_s, 6, "", b, sizeof b);
  fprintf(f, "  h2d: {bandwidth: %s, latency_us: %s}\n", a, b);
  fmt_bandwidth(p->d2h_bandwidth, a, sizeof a);
  fmt_decimal(p->d2h_latency_s, 6, "", b, sizeof b);
  fprintf(f, "  d2h: {bandwidth: %s, latency_us: %s}\ncompute:\n  gemm:\n", a, b);
  for (int i = 0; i < p->n_gemm; i++) {
    fmt_number(p->gemm[i].m, a, sizeof a);
    fmt_number(p->gemm[i].n, b, sizeof b);
    fmt_number(p->gemm[i].k, c, sizeof c);
    fmt_number(p->gemm[i].flops, d, sizeof d);
    fprintf(f, "    - {m: %s, n: %s, k: %s, flops: %s}  # %s\n", a, b, c, d,
            fmt_duration(gemm_work(&p->gemm[i]) / p->gemm[i].flops, note, sizeof note));
  }
  fputs("  attention:\n", f);
  for (int i = 0; i < p->n_attn; i++) {
    fmt_number(p->attn[i].s, a, sizeof a);
    fmt_number(p->attn[i].d, b, sizeof b);
    fmt_number(p->attn[i].flops, c, sizeof c);
    fprintf(f, "    - {s: %s, d: %s, flops: %s}\n", a, b, c);
  }
  fmt_bandwidth(p->elementwise_bandwidth, a, sizeof a);
  fmt_decimal(p->launch_s, 6, "", b, sizeof b);
  fprintf(f, "  elementwise_bandwidth: %s\n  launch_us: %s\n", a, b);
  if (p->n_kernels > 0) fputs("  kernels:\n", f);
  for (int i = 0; i < p->n_kernels; i++) {
    const mf_hw_kernel_point *k = &p->kernels[i];
    fprintf(f, "    - {kernel: %s, sizes: [", k->kernel);
    for (int j = 0; j < k->n_sizes; j++) fprintf(f, "%s%lld", j ? ", " : "", (long long)k->sizes[j]);
    fmt_number(k->bytes, a, sizeof a);
    fmt_number(k->seconds, b, sizeof b);
    fprintf(f, "], bytes: %s, seconds: %s}  # %s\n", a, b, fmt_duration(k->seconds, note, sizeof note));
  }
  fputs("host:\n", f);
  fmt_size(p->host_memory, a, sizeof a);
  fmt_number(p->host_adamw_params_per_s, b, sizeof b);
  fmt_bandwidth(p->host_memory_bandwidth, c, sizeof c);
  fprintf(f, "  memory: %s%s\n  adamw_params_per_s: %s\n  memory_bandwidth: %s\n", a,
          size_note(a, p->host_memory, note, sizeof note), b, c);
  if (p->nvme_bandwidth > 0) {
    fmt_bandwidth(p->nvme_bandwidth, a, sizeof a);
    fprintf(f, "nvme: {bandwidth: %s}\n", a);
  }
  if (p->network_bandwidth > 0) {
    fmt_bandwidth(p->network_bandwidth, a, sizeof a);
    fprintf(f, "network: {bandwidth: %s}\n", a);
  }
  if (p->nvlink_bandwidth > 0) {
    fmt_bandwidth(p->nvlink_bandwidth, a, sizeof a);
    fprintf(f, "nvlink: {bandwidth: %s}\n", a);
  }
  if (ferror(f)) return MF_ERR(MF_ERR_IO, "writing a hardware profile: the stream failed");
  return MF_OK;
}

mf_status mf_hwprofile_save(const mf_hwprofile *p, const char *path) {
  if (!p || !path) return MF_ERR(MF_ERR_INVALID_ARG, "mf_hwprofile_save: NULL argument");
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  if (!f) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "%s: cannot buffer the profile text", path);
  mf_status st = mf_hwprofile_write(p, f);
  if (fclose(f) != 0 && st == MF_OK)
    st = MF_ERR(MF_ERR_OUT_OF_MEMORY, "%s: cannot buffer the profile text", path);
  if (st == MF_OK) st = mf_write_file_atomic(path, text, len);
  free(text);
  if (st != MF_OK) mf_error_trace(__FILE__, __LINE__, "mf_hwprofile_save");
  return st;
}
