/* .tokens files: CRC-32, the validating reader and statistics. The format is
 * described at the top of tokens.h; the writer is tokens_write.c. */
#include "src/io/tokens.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* The mapping is read in place: u16/u32/u64 fields are little-endian on disk. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "moefit reads .tokens files in place: little-endian hosts only");

/* ------------------------------------------------------------------ CRC-32 */

/* Slicing-by-8 over the reflected IEEE polynomial: ~1 byte per cycle, so checking a
 * multi-GiB file costs about as much as reading it from the page cache. */
static uint32_t g_crc[8][256];
static pthread_once_t g_crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = (c & 1u) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    g_crc[0][i] = c;
  }
  for (int i = 0; i < 256; i++)
    for (int t = 1; t < 8; t++) g_crc[t][i] = (g_crc[t - 1][i] >> 8) ^ g_crc[0][g_crc[t - 1][i] & 0xffu];
}

uint32_t mf_tokens_crc32(uint32_t crc, const void *data, size_t n) {
  pthread_once(&g_crc_once, crc_init);
  const uint8_t *p = (const uint8_t *)data;
  crc = ~crc;
  for (; n >= 8; p += 8, n -= 8) {
    uint32_t lo, hi;
    memcpy(&lo, p, 4);
    memcpy(&hi, p + 4, 4);
    lo ^= crc;
    crc = g_crc[7][lo & 0xffu] ^ g_crc[6][(lo >> 8) & 0xffu] ^ g_crc[5][(lo >> 16) & 0xffu] ^
          g_crc[4][lo >> 24] ^ g_crc[3][hi & 0xffu] ^ g_crc[2][(hi >> 8) & 0xffu] ^
          g_crc[1][(hi >> 16) & 0xffu] ^ g_crc[0][hi >> 24];
  }
  while (n--) crc = g_crc[0][(crc ^ *p++) & 0xffu] ^ (crc >> 8);
  return ~crc;
}

/* ------------------------------------------------------------------ reader */

struct mf_tokens {
  char *path;
  const uint8_t *map;
  size_t map_size;
  mf_tokens_info info;
  const uint8_t *tokens;
  const uint8_t *mask; /* NULL without a mask section */
  const uint64_t *docs;
};

static uint32_t rd32(const uint8_t *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}

static uint64_t rd64(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

typedef unsigned long long ull; /* for printf */

typedef struct {
  const char *name;
  int field; /* header offset of its *_offset field */
  uint64_t off, size;
} section;

static mf_status check_sections(const char *path, const mf_tokens_info *h, section *s, int n) {
  for (int i = 0; i < n; i++) {
    uint64_t end;
    if (s[i].off % 8 != 0)
      return MF_ERR(MF_ERR_FORMAT, "%s: byte %d (%s_offset): section %s at byte %llu is not 8-byte aligned",
                    path, s[i].field, s[i].name, s[i].name, (ull)s[i].off);
    if (__builtin_add_overflow(s[i].off, s[i].size, &end))
      return MF_ERR(MF_ERR_FORMAT, "%s: byte %d (%s_offset): section %s: offset %llu + size %llu overflows",
                    path, s[i].field, s[i].name, s[i].name, (ull)s[i].off, (ull)s[i].size);
    if (s[i].off < h->header_size)
      return MF_ERR(MF_ERR_FORMAT,
                    "%s: byte %d (%s_offset): section %s at byte %llu overlaps the %u-byte header", path,
                    s[i].field, s[i].name, s[i].name, (ull)s[i].off, h->header_size);
    if (end > h->file_size)
      return MF_ERR(
          MF_ERR_FORMAT,
          "%s: byte %d (%s_offset): section %s [%llu, %llu) runs past the end of the file (%llu bytes)", path,
          s[i].field, s[i].name, s[i].name, (ull)s[i].off, (ull)end, (ull)h->file_size);
  }
  for (int i = 0; i < n; i++)
    for (int j = i + 1; j < n; j++) {
      if (s[i].size == 0 || s[j].size == 0) continue;
      if (s[i].off < s[j].off + s[j].size && s[j].off < s[i].off + s[i].size)
        return MF_ERR(MF_ERR_FORMAT, "%s: sections %s [%llu, %llu) and %s [%llu, %llu) overlap", path,
                      s[i].name, (ull)s[i].off, (ull)(s[i].off + s[i].size), s[j].name, (ull)s[j].off,
                      (ull)(s[j].off + s[j].size));
    }
  return MF_OK;
}

/* "byte 0 (magic): "..." is not "MFTOKENS"" as the first bytes show it. */
static void show_magic(const uint8_t *h, size_t n, char *shown, size_t cap) {
  size_t k = 0;
  shown[0] = 0;
  for (size_t i = 0; i < n && i < 8 && k + 5 < cap; i++) {
    if (h[i] >= 0x20 && h[i] < 0x7f && h[i] != '\\' && h[i] != '"')
      shown[k++] = (char)h[i], shown[k] = 0;
    else
      k += (size_t)snprintf(shown + k, cap - k, "\\x%02x", h[i]);
  }
}

/* A file that does not begin with the magic: what it is instead (text
 * needs no magic shown; its first line says more). */
static mf_status not_tokens(const char *path, const uint8_t *h, size_t size) {
  char what[256], shown[8 * 4 + 2];
  const mf_tokens_kind kind = mf_tokens_sniff_bytes(h, size < 4096 ? size : 4096, size, what, sizeof what);
  if (kind == MF_TOKENS_KIND_JSONL || kind == MF_TOKENS_KIND_JSON || kind == MF_TOKENS_KIND_YAML ||
      kind == MF_TOKENS_KIND_TEXT)
    return MF_ERR(MF_ERR_FORMAT, "%s: not a .tokens file: it is %s", path, what);
  show_magic(h, size, shown, sizeof shown);
  return MF_ERR(MF_ERR_FORMAT, "%s: byte 0 (magic): \"%s\" is not \"MFTOKENS\": not a .tokens file: it is %s",
                path, shown, what);
}

/* The header: everything that can be checked without reading the payload. */
static mf_status check_header(mf_tokens *t) {
  const char *path = t->path;
  const uint8_t *h = t->map;
  const uint64_t size = t->map_size;
  mf_tokens_info *in = &t->info;

  if (memcmp(h, MF_TOKENS_MAGIC, 8) != 0) return not_tokens(path, h, size); /* mf_tokens_open checks first */
  in->version = rd32(h + MF_TOKENS_OFF_VERSION);
  if (in->version == 0 || in->version > MF_TOKENS_VERSION)
    return MF_ERR(MF_ERR_FORMAT, "%s: byte 8 (version): format version %u %s (this moefit reads version %u)",
                  path, in->version, in->version == 0 ? "is invalid" : "is newer than this moefit reads",
                  MF_TOKENS_VERSION);
  in->header_crc32 = rd32(h + MF_TOKENS_OFF_HEADER_CRC);
  uint32_t crc = mf_tokens_crc32(0, h, MF_TOKENS_OFF_HEADER_CRC);
  if (crc != in->header_crc32)
    return MF_ERR(
        MF_ERR_FORMAT,
        "%s: byte 124 (header_crc32): header checksum 0x%08x does not match the header's bytes (0x%08x): "
        "the header is corrupt",
        path, in->header_crc32, crc);

  in->header_size = rd32(h + MF_TOKENS_OFF_HEADER_SIZE);
  in->vocab = rd32(h + MF_TOKENS_OFF_VOCAB);
  in->width = rd32(h + MF_TOKENS_OFF_WIDTH);
  in->count = rd64(h + MF_TOKENS_OFF_COUNT);
  in->doc_count = rd64(h + MF_TOKENS_OFF_DOC_COUNT);
  in->flags = rd64(h + MF_TOKENS_OFF_FLAGS);
  in->tokens_offset = rd64(h + MF_TOKENS_OFF_TOKENS_OFFSET);
  in->tokens_size = rd64(h + MF_TOKENS_OFF_TOKENS_SIZE);
  in->mask_offset = rd64(h + MF_TOKENS_OFF_MASK_OFFSET);
  in->mask_size = rd64(h + MF_TOKENS_OFF_MASK_SIZE);
  in->docs_offset = rd64(h + MF_TOKENS_OFF_DOCS_OFFSET);
  in->docs_size = rd64(h + MF_TOKENS_OFF_DOCS_SIZE);
  in->file_size = rd64(h + MF_TOKENS_OFF_FILE_SIZE);
  in->payload_crc32 = rd32(h + MF_TOKENS_OFF_PAYLOAD_CRC);

  if (in->file_size != size)
    return MF_ERR(MF_ERR_FORMAT,
                  "%s: byte 96 (file_size): the header says the file is %llu bytes but it is %llu: %s", path,
                  (ull)in->file_size, (ull)size,
                  size < in->file_size ? "truncated" : "there are bytes after its end");
  if (in->header_size < MF_TOKENS_HEADER_SIZE || in->header_size % 8 != 0 || in->header_size > size)
    return MF_ERR(MF_ERR_FORMAT,
                  "%s: byte 12 (header_size): header size %u (must be a multiple of 8, >= %u, <= %llu)", path,
                  in->header_size, MF_TOKENS_HEADER_SIZE, (ull)size);
  for (int i = MF_TOKENS_OFF_RESERVED; i < MF_TOKENS_OFF_HEADER_CRC; i++)
    if (h[i] != 0)
      return MF_ERR(MF_ERR_FORMAT, "%s: byte %d (reserved): 0x%02x where bytes 108-123 must be zero", path, i,
                    h[i]);
  if (in->width != 2 && in->width != 4)
    return MF_ERR(MF_ERR_FORMAT, "%s: byte 20 (width): token width %u is not 2 (u16) or 4 (u32)", path,
                  in->width);
  if (in->vocab == 0) return MF_ERR(MF_ERR_FORMAT, "%s: byte 16 (vocab): vocab size 0 (must be >= 1)", path);
  if (in->width == 2 && in->vocab > 65536u)
    return MF_ERR(MF_ERR_FORMAT,
                  "%s: byte 16 (vocab): vocab size %u does not fit 2-byte tokens (at most 65536)", path,
                  in->vocab);
  if (in->flags & ~(uint64_t)MF_TOKENS_FLAGS_KNOWN)
    return MF_ERR(MF_ERR_FORMAT, "%s: byte 40 (flags): unknown flag bits 0x%llx (known: 0x1 = loss mask)",
                  path, (ull)(in->flags & ~(uint64_t)MF_TOKENS_FLAGS_KNOWN));

  uint64_t want;
  if (__builtin_mul_overflow(in->count, (uint64_t)in->width, &want))
    return MF_ERR(MF_ERR_FORMAT, "%s: byte 24 (count): %llu tokens x %u bytes overflows", path,
                  (ull)in->count, in->width);
  if (in->tokens_size != want)
    return MF_ERR(MF_ERR_FORMAT,
                  "%s: byte 56 (tokens_size): %llu bytes, but count x width = %llu x %u = %llu", path,
                  (ull)in->tokens_size, (ull)in->count, in->width, (ull)want);
  int has_mask = (in->flags & MF_TOKENS_FLAG_MASK) != 0;
  if (has_mask) {
    want = in->count / 8 + (in->count % 8 != 0);
    if (in->mask_size != want)
      return MF_ERR(MF_ERR_FORMAT, "%s: byte 72 (mask_size): %llu bytes, but %llu tokens need %llu", path,
                    (ull)in->mask_size, (ull)in->count, (ull)want);
  } else if (in->mask_offset != 0 || in->mask_size != 0) {
    return MF_ERR(MF_ERR_FORMAT,
                  "%s: byte 64 (mask_offset): flags say there is no loss mask, but mask_offset %llu, "
                  "mask_size %llu",
                  path, (ull)in->mask_offset, (ull)in->mask_size);
  }
  if (__builtin_mul_overflow(in->doc_count, (uint64_t)8, &want))
    return MF_ERR(MF_ERR_FORMAT, "%s: byte 32 (doc_count): %llu documents x 8 bytes overflows", path,
                  (ull)in->doc_count);
  if (in->docs_size != want)
    return MF_ERR(MF_ERR_FORMAT, "%s: byte 88 (docs_size): %llu bytes, but doc_count x 8 = %llu", path,
                  (ull)in->docs_size, (ull)want);
  if ((in->doc_count == 0) != (in->count == 0) || in->doc_count > in->count)
    return MF_ERR(MF_ERR_FORMAT,
                  "%s: byte 32 (doc_count): %llu documents for %llu tokens (documents are not empty)", path,
                  (ull)in->doc_count, (ull)in->count);

  section s[3] = {
      {"tokens", MF_TOKENS_OFF_TOKENS_OFFSET, in->tokens_offset, in->tokens_size},
      {"docs", MF_TOKENS_OFF_DOCS_OFFSET, in->docs_offset, in->docs_size},
      {"mask", MF_TOKENS_OFF_MASK_OFFSET, in->mask_offset, in->mask_size},
  };
  return check_sections(path, in, s, has_mask ? 3 : 2);
}

/* The payload: checksum, document starts, every id, the mask's padding bits. */
static mf_status check_payload(mf_tokens *t) {
  const char *path = t->path;
  mf_tokens_info *in = &t->info;
  uint32_t crc = mf_tokens_crc32(0, t->map + MF_TOKENS_HEADER_SIZE, t->map_size - MF_TOKENS_HEADER_SIZE);
  if (crc != in->payload_crc32)
    return MF_ERR(
        MF_ERR_FORMAT,
        "%s: byte 104 (payload_crc32): payload checksum 0x%08x does not match the data (0x%08x): the file is "
        "corrupt",
        path, in->payload_crc32, crc);

  for (uint64_t d = 0; d < in->doc_count; d++) {
    uint64_t s = t->docs[d];
    ull at = (ull)(in->docs_offset + 8 * d);
    if (d == 0 && s != 0)
      return MF_ERR(MF_ERR_FORMAT, "%s: byte %llu (docs): document 0 starts at token %llu (must be 0)", path,
                    at, (ull)s);
    if (s >= in->count)
      return MF_ERR(MF_ERR_FORMAT,
                    "%s: byte %llu (docs): document %llu starts at token %llu, past the %llu tokens", path,
                    at, (ull)d, (ull)s, (ull)in->count);
    if (d > 0 && s <= t->docs[d - 1])
      return MF_ERR(
          MF_ERR_FORMAT,
          "%s: byte %llu (docs): document %llu starts at token %llu, not after document %llu's start %llu",
          path, at, (ull)d, (ull)s, (ull)(d - 1), (ull)t->docs[d - 1]);
  }

  /* Chunks keep the hot loop a branch-free min/max that the compiler vectorises;
   * only a chunk holding a bad id is searched again for its first one. */
  uint32_t lo = UINT32_MAX, hi = 0;
  const uint64_t n = in->count;
  const uint64_t chunk = 1u << 16;
  for (uint64_t b = 0; b < n; b += chunk) {
    uint64_t e = n - b < chunk ? n : b + chunk;
    uint32_t clo = UINT32_MAX, chi = 0;
    if (in->width == 2) {
      const uint16_t *v = (const uint16_t *)t->tokens;
      for (uint64_t i = b; i < e; i++) {
        uint32_t x = v[i];
        clo = x < clo ? x : clo;
        chi = x > chi ? x : chi;
      }
    } else {
      const uint32_t *v = (const uint32_t *)t->tokens;
      for (uint64_t i = b; i < e; i++) {
        uint32_t x = v[i];
        clo = x < clo ? x : clo;
        chi = x > chi ? x : chi;
      }
    }
    if (chi >= in->vocab) {
      for (uint64_t i = b; i < e; i++) {
        uint32_t x = mf_tokens_at(t, i);
        if (x >= in->vocab)
          return MF_ERR(MF_ERR_FORMAT, "%s: token %llu (byte %llu): id %u >= vocab %u", path, (ull)i,
                        (ull)(in->tokens_offset + i * in->width), x, in->vocab);
      }
    }
    lo = clo < lo ? clo : lo;
    hi = chi > hi ? chi : hi;
  }
  in->min_id = n ? lo : 0;
  in->max_id = n ? hi : 0;

  if (t->mask && n % 8 != 0) {
    uint8_t last = t->mask[in->mask_size - 1];
    if (last >> (n % 8))
      return MF_ERR(MF_ERR_FORMAT, "%s: byte %llu (mask): bits past the last token are set (0x%02x)", path,
                    (ull)(in->mask_offset + in->mask_size - 1), last);
  }
  return MF_OK;
}

mf_status mf_tokens_open(const char *path, mf_tokens **out) {
  if (!out) return MF_ERR(MF_ERR_INVALID_ARG, "mf_tokens_open: out is NULL");
  *out = NULL;
  if (!path) return MF_ERR(MF_ERR_INVALID_ARG, "mf_tokens_open: path is NULL");
  const uint8_t *map = NULL;
  size_t size = 0;
  MF_CHECK(mf_map_file(path, &map, &size, NULL));
  if (size > 0 && memcmp(map, MF_TOKENS_MAGIC, size < 8 ? size : 8) != 0) {
    const mf_status s = not_tokens(path, map, size);
    mf_unmap_file(map, size);
    return s;
  }
  if (size < MF_TOKENS_HEADER_SIZE) {
    mf_unmap_file(map, size);
    if (size == 0)
      return MF_ERR(MF_ERR_FORMAT,
                    "%s: byte 0: the file is empty (a .tokens file starts with a %u-byte header)", path,
                    MF_TOKENS_HEADER_SIZE);
    return MF_ERR(MF_ERR_FORMAT,
                  "%s: byte %llu: truncated header: the file is %llu bytes, the header alone is %u", path,
                  (ull)size, (ull)size, MF_TOKENS_HEADER_SIZE);
  }

  mf_tokens *t = (mf_tokens *)calloc(1, sizeof *t);
  char *p = mf_strdup(path);
  if (!t || !p) {
    free(t);
    free(p);
    mf_unmap_file(map, size);
    return MF_ERR(MF_ERR_OUT_OF_MEMORY, "%s: out of memory opening the token file", path);
  }
  t->path = p;
  t->map = map;
  t->map_size = size;
  mf_status s = check_header(t);
  if (s == MF_OK) {
    t->tokens = t->map + t->info.tokens_offset;
    t->docs = (const uint64_t *)(t->map + t->info.docs_offset);
    t->mask = (t->info.flags & MF_TOKENS_FLAG_MASK) ? t->map + t->info.mask_offset : NULL;
    madvise((void *)map, size, MADV_SEQUENTIAL);
    s = check_payload(t);
    madvise((void *)map, size, MADV_NORMAL);
  }
  if (s != MF_OK) {
    mf_tokens_close(t);
    return s;
  }
  MF_LOGD("io", "%s: %llu tokens in %llu documents, vocab %u, width %u%s", path, (ull)t->info.count,
          (ull)t->info.doc_count, t->info.vocab, t->info.width, t->mask ? ", loss mask" : "");
  *out = t;
  return MF_OK;
}

void mf_tokens_close(mf_tokens *t) {
  if (!t) return;
  mf_unmap_file(t->map, t->map_size);
  free(t->path);
  free(t);
}

const char *mf_tokens_path(const mf_tokens *t) {
  return t->path;
}
uint64_t mf_tokens_count(const mf_tokens *t) {
  return t->info.count;
}
uint32_t mf_tokens_vocab(const mf_tokens *t) {
  return t->info.vocab;
}
uint32_t mf_tokens_width(const mf_tokens *t) {
  return t->info.width;
}
int mf_tokens_has_mask(const mf_tokens *t) {
  return t->mask != NULL;
}
uint64_t mf_tokens_doc_count(const mf_tokens *t) {
  return t->info.doc_count;
}
void mf_tokens_get_info(const mf_tokens *t, mf_tokens_info *out) {
  *out = t->info;
}
const uint64_t *mf_tokens_doc_starts(const mf_tokens *t) {
  return t->docs;
}

uint32_t mf_tokens_at(const mf_tokens *t, uint64_t i) {
  MF_ASSERT(i < t->info.count);
  if (t->info.width == 2) return ((const uint16_t *)t->tokens)[i];
  return ((const uint32_t *)t->tokens)[i];
}

int mf_tokens_mask_at(const mf_tokens *t, uint64_t i) {
  MF_ASSERT(i < t->info.count);
  return t->mask ? (t->mask[i >> 3] >> (i & 7)) & 1 : 1;
}

mf_status mf_tokens_read(const mf_tokens *t, uint64_t start, size_t n, uint32_t *ids, uint8_t *mask) {
  if (start > t->info.count || n > t->info.count - start)
    return MF_ERR(MF_ERR_INVALID_ARG, "%s: tokens [%llu, %llu + %zu) are past the %llu tokens", t->path,
                  (ull)start, (ull)start, n, (ull)t->info.count);
  if (ids) {
    if (t->info.width == 2) {
      const uint16_t *v = (const uint16_t *)t->tokens + start;
      for (size_t i = 0; i < n; i++) ids[i] = v[i];
    } else {
      memcpy(ids, (const uint32_t *)t->tokens + start, n * sizeof *ids);
    }
  }
  if (mask) {
    if (!t->mask)
      memset(mask, 1, n);
    else
      for (size_t i = 0; i < n; i++)
        mask[i] = (uint8_t)((t->mask[(start + i) >> 3] >> ((start + i) & 7)) & 1);
  }
  return MF_OK;
}

mf_status mf_tokens_doc_range(const mf_tokens *t, uint64_t d, uint64_t *begin, uint64_t *end) {
  if (d >= t->info.doc_count)
    return MF_ERR(MF_ERR_INVALID_ARG, "%s: document %llu does not exist (%llu documents)", t->path, (ull)d,
                  (ull)t->info.doc_count);
  *begin = t->docs[d];
  *end = d + 1 < t->info.doc_count ? t->docs[d + 1] : t->info.count;
  return MF_OK;
}

/* A histogram of max_id + 1 counters; past this many the stats are refused rather
 * than allocating gigabytes (real vocabularies are far below it). */
#define MF_TOKENS_STATS_MAX_IDS (1u << 27)

mf_status mf_tokens_compute_stats(const mf_tokens *t, mf_tokens_stats *out) {
  const mf_tokens_info *in = &t->info;
  memset(out, 0, sizeof *out);
  out->min_id = in->min_id;
  out->max_id = in->max_id;
  out->loss_fraction = 1.0;
  const uint64_t n = in->count;
  if (n == 0) return MF_OK;
  if (in->max_id >= MF_TOKENS_STATS_MAX_IDS)
    return MF_ERR(MF_ERR_UNSUPPORTED,
                  "%s: statistics over ids up to %u need too large a histogram (limit %u ids)", t->path,
                  in->max_id, MF_TOKENS_STATS_MAX_IDS);
  uint64_t *hist = NULL;
  MF_CHECK(mf_calloc((size_t)in->max_id + 1, sizeof *hist, "the token histogram", (void **)&hist));
  if (in->width == 2) {
    const uint16_t *v = (const uint16_t *)t->tokens;
    for (uint64_t i = 0; i < n; i++) hist[v[i]]++;
  } else {
    const uint32_t *v = (const uint32_t *)t->tokens;
    for (uint64_t i = 0; i < n; i++) hist[v[i]]++;
  }
  /* H = -sum p log2 p = log2 N - (1/N) sum c log2 c */
  double sum = 0.0;
  for (uint64_t id = 0; id <= in->max_id; id++) {
    if (!hist[id]) continue;
    out->distinct++;
    sum += (double)hist[id] * log2((double)hist[id]);
  }
  free(hist);
  out->entropy_bits = log2((double)n) - sum / (double)n;
  if (out->entropy_bits < 0) out->entropy_bits = 0; /* rounding when one id fills the file */

  if (t->mask) {
    for (uint64_t b = 0; b < in->mask_size; b++) out->loss_tokens += (uint64_t)__builtin_popcount(t->mask[b]);
  } else {
    out->loss_tokens = n;
  }
  out->loss_fraction = (double)out->loss_tokens / (double)n;

  out->doc_min = UINT64_MAX;
  for (uint64_t d = 0; d < in->doc_count; d++) {
    uint64_t len = (d + 1 < in->doc_count ? t->docs[d + 1] : n) - t->docs[d];
    out->doc_min = len < out->doc_min ? len : out->doc_min;
    out->doc_max = len > out->doc_max ? len : out->doc_max;
  }
  out->doc_mean = (double)n / (double)in->doc_count;
  return MF_OK;
}
