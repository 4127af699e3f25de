/*
 * .tokens: a tokenized dataset, memory-mapped for training.
 *
 * One file holds a stream of token ids, an optional loss mask, and the document
 * boundaries. Everything is little-endian. A fixed 128-byte header comes first and
 * names every section by offset and size, so a reader never has to guess:
 *
 *   offset size  type     field
 *   ------ ----  -------  ------------------------------------------------------------
 *        0    8  char[8]  magic "MFTOKENS"
 *        8    4  u32      version (1)
 *       12    4  u32      header_size: 128 (readers accept more, a multiple of 8, for
 *                         fields a later version adds); sections start at or after it
 *       16    4  u32      vocab: ids are < vocab; >= 1, <= 65536 for width 2
 *       20    4  u32      width: bytes per token id, 2 (u16) or 4 (u32)
 *       24    8  u64      count: number of tokens
 *       32    8  u64      doc_count: number of documents (0 exactly when count is 0)
 *       40    8  u64      flags: bit 0 = a loss-mask section is present; others 0
 *       48    8  u64      tokens_offset   \  the token ids, count × width bytes
 *       56    8  u64      tokens_size     /
 *       64    8  u64      mask_offset     \  the loss mask, ceil(count / 8) bytes
 *       72    8  u64      mask_size       /  (both 0 when flag bit 0 is clear)
 *       80    8  u64      docs_offset     \  document starts, doc_count × u64
 *       88    8  u64      docs_size       /
 *       96    8  u64      file_size: the file's exact size in bytes
 *      104    4  u32      payload_crc32: CRC-32 of bytes [128, file_size)
 *      108   16  -        reserved, zero
 *      124    4  u32      header_crc32: CRC-32 of bytes [0, 124)
 *
 * Sections start at multiples of 8, at or after header_size, end at or before
 * file_size and do not overlap; the bytes between them are zero padding (covered by
 * the payload checksum). The writer lays them out as header | tokens | mask | docs.
 *
 *   tokens  count ids, u16 or u32 LE; every id < vocab.
 *   mask    one bit per token, token i at bit (i % 8) of byte i / 8 (LSB first);
 *           1 = the token counts in the loss (its prediction from the tokens before
 *           it is trained), 0 = context only (prompts, system text). Bits past count
 *           are 0. Without the section every token counts.
 *   docs    doc_count u64 start indices: the first is 0, each is < count and
 *           larger than the one before; document d is [docs[d], docs[d+1]) and the
 *           last ends at count. So a document is never empty: the writer drops
 *           empty documents.
 *
 * The checksums are CRC-32 (IEEE 802.3, the one zlib and Python's zlib.crc32
 * compute), so any language's standard library can write the format;
 * tools/prepare_data.py is a second writer.
 *
 * mf_tokens_open maps the file read-only and validates all of it before returning:
 * the header fields, the section bounds (with overflow checks), both checksums,
 * every token id against vocab, the document starts and the mask's padding bits.
 * A fault is MF_ERR_FORMAT with a message naming the file, the place (byte offset,
 * header field, token or document index) and the fault. After a successful open
 * the accessors need no further checks.
 */
#ifndef MF_IO_TOKENS_H
#define MF_IO_TOKENS_H

#include <stddef.h>
#include <stdint.h>

#include "src/core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MF_TOKENS_MAGIC "MFTOKENS"
#define MF_TOKENS_VERSION 1u
#define MF_TOKENS_HEADER_SIZE 128u
#define MF_TOKENS_FLAG_MASK 1u /* a loss-mask section is present */
#define MF_TOKENS_FLAGS_KNOWN MF_TOKENS_FLAG_MASK

/* Byte offsets of the header fields (for tests and other writers). */
enum {
  MF_TOKENS_OFF_MAGIC = 0,
  MF_TOKENS_OFF_VERSION = 8,
  MF_TOKENS_OFF_HEADER_SIZE = 12,
  MF_TOKENS_OFF_VOCAB = 16,
  MF_TOKENS_OFF_WIDTH = 20,
  MF_TOKENS_OFF_COUNT = 24,
  MF_TOKENS_OFF_DOC_COUNT = 32,
  MF_TOKENS_OFF_FLAGS = 40,
  MF_TOKENS_OFF_TOKENS_OFFSET = 48,
  MF_TOKENS_OFF_TOKENS_SIZE = 56,
  MF_TOKENS_OFF_MASK_OFFSET = 64,
  MF_TOKENS_OFF_MASK_SIZE = 72,
  MF_TOKENS_OFF_DOCS_OFFSET = 80,
  MF_TOKENS_OFF_DOCS_SIZE = 88,
  MF_TOKENS_OFF_FILE_SIZE = 96,
  MF_TOKENS_OFF_PAYLOAD_CRC = 104,
  MF_TOKENS_OFF_RESERVED = 108,
  MF_TOKENS_OFF_HEADER_CRC = 124,
};

/* CRC-32 (IEEE, reflected, zlib's): crc = mf_tokens_crc32(0, p, n) and chained as
 * mf_tokens_crc32(crc, more, m), exactly like zlib's crc32(). */
uint32_t mf_tokens_crc32(uint32_t crc, const void *data, size_t n);

/* ------------------------------------------------------------------ reader */

typedef struct mf_tokens mf_tokens;

/* The header as read, plus the id range found while validating. */
typedef struct mf_tokens_info {
  uint32_t version;
  uint32_t header_size;
  uint32_t vocab;
  uint32_t width;
  uint64_t count;
  uint64_t doc_count;
  uint64_t flags;
  uint64_t tokens_offset, tokens_size;
  uint64_t mask_offset, mask_size;
  uint64_t docs_offset, docs_size;
  uint64_t file_size;
  uint32_t payload_crc32;
  uint32_t header_crc32;
  uint32_t min_id, max_id; /* 0, 0 when count is 0 */
} mf_tokens_info;

/* Statistics for `moefit inspect` (one pass over the tokens, a histogram of
 * max_id + 1 counters). */
typedef struct mf_tokens_stats {
  uint32_t min_id, max_id;
  uint64_t distinct;         /* ids that occur at least once */
  double entropy_bits;       /* unigram entropy of the ids, bits per token */
  uint64_t loss_tokens;      /* tokens whose mask bit is 1 (count when there is no mask) */
  double loss_fraction;      /* loss_tokens / count (1 when count is 0) */
  uint64_t doc_min, doc_max; /* document lengths in tokens (0 when there are none) */
  double doc_mean;
} mf_tokens_stats;

/* Maps and validates `path` (see the top of this file). On failure *out is NULL. */
mf_status mf_tokens_open(const char *path, mf_tokens **out);
void mf_tokens_close(mf_tokens *t); /* NULL is fine */

const char *mf_tokens_path(const mf_tokens *t);
uint64_t mf_tokens_count(const mf_tokens *t);
uint32_t mf_tokens_vocab(const mf_tokens *t);
uint32_t mf_tokens_width(const mf_tokens *t);
int mf_tokens_has_mask(const mf_tokens *t);
uint64_t mf_tokens_doc_count(const mf_tokens *t);
void mf_tokens_get_info(const mf_tokens *t, mf_tokens_info *out);

/* Token i (i < count; a larger i is a caller bug and asserts). */
uint32_t mf_tokens_at(const mf_tokens *t, uint64_t i);
/* The loss-mask bit of token i: 1 when it counts in the loss (always 1 without a mask). */
int mf_tokens_mask_at(const mf_tokens *t, uint64_t i);
/* Copies tokens [start, start + n) into ids (widened to u32) and, when mask is not
 * NULL, their mask bits (0/1 bytes). MF_ERR_INVALID_ARG when the range is past count. */
mf_status mf_tokens_read(const mf_tokens *t, uint64_t start, size_t n, uint32_t *ids, uint8_t *mask);
/* The doc_count start indices (in the mapping; valid until close). */
const uint64_t *mf_tokens_doc_starts(const mf_tokens *t);
/* Document d is tokens [*begin, *end). MF_ERR_INVALID_ARG when d >= doc_count. */
mf_status mf_tokens_doc_range(const mf_tokens *t, uint64_t d, uint64_t *begin, uint64_t *end);

mf_status mf_tokens_compute_stats(const mf_tokens *t, mf_tokens_stats *out);

/* What a file given as a .tokens file looks like, by its first bytes: for
 * the message of one that is something else (mf_tokens_sniff). */
typedef enum mf_tokens_kind {
  MF_TOKENS_KIND_TOKENS = 0,  /* begins with the MFTOKENS magic (valid or not: mf_tokens_open says) */
  MF_TOKENS_KIND_EMPTY,       /* no bytes */
  MF_TOKENS_KIND_JSONL,       /* UTF-8 text, one JSON object a line */
  MF_TOKENS_KIND_JSON,        /* UTF-8 text, one JSON value */
  MF_TOKENS_KIND_YAML,        /* UTF-8 text: a comment, "---" or "key: ..." first */
  MF_TOKENS_KIND_TEXT,        /* other UTF-8 text */
  MF_TOKENS_KIND_SAFETENSORS, /* model weights */
  MF_TOKENS_KIND_COMPRESSED,  /* gzip, zstd, xz, bzip2 or zip */
  MF_TOKENS_KIND_BINARY,      /* anything else */
} mf_tokens_kind;

/* The kind of a file whose first n bytes are b (of size bytes in all), and
 * a description for people into desc (cap bytes): "JSONL text, one JSON
 * object a line (it begins \"{\"text\": \"...\")", "a safetensors file
 * (model weights: ...)", "an empty file", ... */
mf_tokens_kind mf_tokens_sniff_bytes(const uint8_t *b, size_t n, uint64_t size, char *desc, size_t cap);
/* The same for the file at path (its first 4 KiB read). MF_ERR_IO naming
 * the path and strerror when it cannot be opened or read, or is a directory. */
mf_status mf_tokens_sniff(const char *path, mf_tokens_kind *kind, char *desc, size_t cap);

/* ------------------------------------------------------------------ writer */

/* Streams a .tokens file: tokens go to `path`.tmp as they come (an mf_atomic_file:
 * a stale `path`.tmp is replaced; the mask bits go to an unlinked spool file
 * beside it), the mask and document sections and then the header are written by
 * finish, which fsyncs and renames over `path`. Until then `path` is untouched;
 * a writer freed before finish removes its temporary file. The directory of
 * `path` must exist. */
typedef struct mf_tokens_writer mf_tokens_writer;

/* width: 2, 4, or 0 for the smallest that holds vocab. with_mask: write a loss-mask
 * section. MF_ERR_INVALID_ARG for vocab 0, a width other than 0/2/4 or a vocab the
 * width cannot hold; MF_ERR_IO when the temporary file cannot be created. */
mf_status mf_tokens_writer_create(const char *path, uint32_t vocab, int width, int with_mask,
                                  mf_tokens_writer **out);
/* Appends n tokens to the current document. mask: n bytes, nonzero = counts in the
 * loss; NULL = all count. A non-NULL mask for a writer without one is
 * MF_ERR_INVALID_ARG, and so is an id >= vocab (naming its index in the file and its
 * value); nothing of a rejected call is written. */
mf_status mf_tokens_writer_append(mf_tokens_writer *w, const uint32_t *ids, const uint8_t *mask, size_t n);
/* Ends the current document. Ending an empty one does nothing (documents are never
 * empty); tokens appended after the last call form a last document at finish. */
mf_status mf_tokens_writer_end_document(mf_tokens_writer *w);
/* Writes the sections and header, fsyncs, renames over path. Once only; the writer
 * must still be freed. */
mf_status mf_tokens_writer_finish(mf_tokens_writer *w);
/* NULL is fine; an unfinished writer is aborted (its temporary file removed). */
void mf_tokens_writer_free(mf_tokens_writer *w);

uint64_t mf_tokens_writer_count(const mf_tokens_writer *w);     /* tokens so far */
uint64_t mf_tokens_writer_doc_count(const mf_tokens_writer *w); /* documents ended so far */

#ifdef __cplusplus
}
#endif

#endif /* MF_IO_TOKENS_H */
