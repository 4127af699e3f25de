/* What a file that should be a .tokens file looks like (tokens.h
 * mf_tokens_sniff): read by its first bytes, for the message of a data file
 * that is something else (a JSONL corpus not tokenized yet, a config, model
 * weights). */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "src/io/tokens.h"

#define SNIFF_BYTES 4096

static int is_space(uint8_t c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* Text is UTF-8 without control characters but tab and line ends (a
 * character cut at the window's end is fine). */
static int is_text(const uint8_t *b, size_t n, uint64_t size) {
  for (size_t i = 0; i < n; i++)
    if ((b[i] < 0x20 && !is_space(b[i])) || b[i] == 0x7f) return 0;
  const size_t bad = mf_utf8_invalid_at(b, n);
  return bad >= n || (n < size && n - bad < 4);
}

/* JSONL: the first line is one JSON object ("{ ... }" on one line) and the
 * next line, if any, begins another; or a first line "{..." longer than the
 * bytes read (a pretty-printed JSON object breaks its first line early). */
static int is_jsonl(const uint8_t *b, size_t n, size_t i, int whole) {
  const uint8_t *nl = memchr(b + i, '\n', n - i);
  if (!nl && !whole) return 1;
  size_t end = nl ? (size_t)(nl - b) : n;
  size_t last = end;
  while (last > i && is_space(b[last - 1])) last--;
  if (last <= i + 1 || b[last - 1] != '}') return 0;
  if (!nl) return 1; /* one line, all of the file */
  size_t j = end + 1;
  while (j < n && is_space(b[j])) j++;
  return j >= n || b[j] == '{';
}

/* YAML: a comment, a document marker, a directive or a first line "key: ...". */
static int is_yaml(const uint8_t *b, size_t n, size_t i) {
  if (b[i] == '#' || b[i] == '%' || (n - i >= 3 && memcmp(b + i, "---", 3) == 0)) return 1;
  size_t k = i;
  while (k < n && (b[k] == '_' || b[k] == '-' || b[k] == '.' || (b[k] >= '0' && b[k] <= '9') ||
                   ((b[k] | 0x20) >= 'a' && (b[k] | 0x20) <= 'z')))
    k++;
  return k > i && k < n && b[k] == ':' && (k + 1 == n || is_space(b[k + 1]));
}

/* A safetensors file: an 8-byte little-endian header length that fits the
 * file, then its JSON header. */
static int is_safetensors(const uint8_t *b, size_t n, uint64_t size) {
  if (n < 9 || size < 9) return 0;
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | b[i];
  return hlen >= 2 && hlen <= size - 8 && b[8] == '{';
}

/* " (it begins "...")": the first line, at most 40 bytes of it. */
static void begins(const uint8_t *b, size_t n, size_t i, char *out, size_t cap) {
  char first[64];
  size_t o = 0, k = i;
  for (; k < n && k - i < 40 && b[k] != '\n' && b[k] != '\r'; k++)
    first[o++] = b[k] == '\t' ? ' ' : (char)b[k];
  /* a UTF-8 character cut at the 40th byte is left out whole */
  while (o > 0 && k < n && b[k] != '\n' && b[k] != '\r' && ((uint8_t)first[o - 1] & 0xc0) == 0x80) o--;
  if (o > 0 && k < n && b[k] != '\n' && b[k] != '\r' && ((uint8_t)first[o - 1] & 0xc0) == 0xc0) o--;
  first[o] = 0;
  snprintf(out, cap, " (it begins \"%s%s\")", first, k < n && b[k] != '\n' && b[k] != '\r' ? "..." : "");
}

mf_tokens_kind mf_tokens_sniff_bytes(const uint8_t *b, size_t n, uint64_t size, char *desc, size_t cap) {
  char tail[96] = "";
  mf_tokens_kind kind = MF_TOKENS_KIND_BINARY;
  const char *what = NULL;
  if (size == 0 || n == 0) {
    kind = MF_TOKENS_KIND_EMPTY, what = "an empty file";
  } else if (memcmp(b, MF_TOKENS_MAGIC, n < 8 ? n : 8) == 0) {
    kind = MF_TOKENS_KIND_TOKENS, what = "a .tokens file";
  } else if (n >= 2 && b[0] == 0x1f && b[1] == 0x8b) {
    kind = MF_TOKENS_KIND_COMPRESSED, what = "gzip-compressed data";
  } else if (n >= 4 && memcmp(b, "\x28\xb5\x2f\xfd", 4) == 0) {
    kind = MF_TOKENS_KIND_COMPRESSED, what = "zstd-compressed data";
  } else if (n >= 6 && memcmp(b,
                              "\xfd"
                              "7zXZ\0",
                              6) == 0) {
    kind = MF_TOKENS_KIND_COMPRESSED, what = "xz-compressed data";
  } else if (n >= 3 && memcmp(b, "BZh", 3) == 0) {
    kind = MF_TOKENS_KIND_COMPRESSED, what = "bzip2-compressed data";
  } else if (n >= 4 && memcmp(b, "PK\x03\x04", 4) == 0) {
    kind = MF_TOKENS_KIND_COMPRESSED, what = "a zip archive";
  } else if (n >= 4 && memcmp(b, "PAR1", 4) == 0) {
    kind = MF_TOKENS_KIND_BINARY, what = "a Parquet file (a dataset table: export its text column as JSONL)";
  } else if (n >= 6 && memcmp(b, "\x93NUMPY", 6) == 0) {
    kind = MF_TOKENS_KIND_BINARY, what = "a NumPy .npy array";
  } else if (is_safetensors(b, n, size)) {
    kind = MF_TOKENS_KIND_SAFETENSORS,
    what = "a safetensors file (model weights: model.path takes their directory)";
  } else if (is_text(b, n, size)) {
    size_t i = n >= 3 && memcmp(b, "\xef\xbb\xbf", 3) == 0 ? 3 : 0; /* a UTF-8 BOM */
    while (i < n && is_space(b[i])) i++;
    if (i >= n) {
      kind = MF_TOKENS_KIND_TEXT, what = "blank text";
    } else if (b[i] == '{' && is_jsonl(b, n, i, (uint64_t)n == size)) {
      kind = MF_TOKENS_KIND_JSONL, what = "JSONL text, one JSON object a line";
    } else if (b[i] == '{' || b[i] == '[') {
      kind = MF_TOKENS_KIND_JSON, what = "JSON text";
    } else if (is_yaml(b, n, i)) {
      kind = MF_TOKENS_KIND_YAML, what = "YAML text";
    } else {
      kind = MF_TOKENS_KIND_TEXT, what = "plain text";
    }
    if (i < n) begins(b, n, i, tail, sizeof tail);
  } else {
    what = "binary data of no format moefit knows";
    size_t o = (size_t)snprintf(tail, sizeof tail, " (its first bytes:");
    for (size_t k = 0; k < n && k < 8 && o < sizeof tail; k++)
      o += (size_t)snprintf(tail + o, sizeof tail - o, " %02x", b[k]);
    if (o < sizeof tail) snprintf(tail + o, sizeof tail - o, ")");
  }
  if (cap) snprintf(desc, cap, "%s%s", what, tail);
  return kind;
}

mf_status mf_tokens_sniff(const char *path, mf_tokens_kind *kind, char *desc, size_t cap) {
  int fd, e;
  uint64_t size;
  const mf_status opened = mf_open_regular(path, "a data file", &fd, &size, &e);
  if (opened != MF_OK) return e ? MF_ERR(MF_ERR_IO, "%s: %s", path, strerror(e)) : opened;
  uint8_t b[SNIFF_BYTES];
  size_t n = 0;
  while (n < sizeof b) {
    const ssize_t r = read(fd, b + n, sizeof b - n);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      e = errno;
      close(fd);
      return MF_ERR(MF_ERR_IO, "%s: %s", path, strerror(e));
    }
    if (r == 0) break;
    n += (size_t)r;
  }
  close(fd);
  *kind = mf_tokens_sniff_bytes(b, n, size, desc, cap);
  return MF_OK;
}
