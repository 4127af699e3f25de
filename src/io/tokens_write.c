/* .tokens files: the streaming writer. The format is described at the top of
 * tokens.h; the reader is tokens_read.c. */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/io/tokens.h"

typedef unsigned long long ull; /* for printf */

#define WBUF_SIZE (1u << 20)
#define MBUF_SIZE (1u << 16)

struct mf_tokens_writer {
  char *path;
  mf_atomic_file *file; /* path.tmp; NULL once committed or aborted */
  int mask_fd;          /* unlinked spool of the packed mask bits, -1 without a mask */
  uint32_t vocab;
  uint32_t width;
  int with_mask;
  int finished;
  uint64_t count;
  uint64_t doc_start; /* first token of the current document */
  uint64_t *docs;
  size_t n_docs, cap_docs;
  uint8_t *buf; /* bytes after the header not yet written to the file */
  size_t buf_n;
  uint64_t pos; /* file offset of the next byte emitted */
  uint32_t crc; /* payload CRC of the bytes flushed so far */
  uint8_t *mbuf;
  size_t mbuf_n;
  uint64_t mask_bytes;
  uint8_t mbits; /* the partial mask byte and how many bits it holds */
  int mbits_n;
};

static mf_status wflush(mf_tokens_writer *w) {
  if (!w->buf_n) return MF_OK;
  w->crc = mf_tokens_crc32(w->crc, w->buf, w->buf_n);
  mf_status s = mf_atomic_file_write(w->file, w->buf, w->buf_n);
  w->buf_n = 0;
  return s;
}

static mf_status wemit(mf_tokens_writer *w, const void *data, size_t n) {
  const uint8_t *p = (const uint8_t *)data;
  while (n) {
    if (w->buf_n == WBUF_SIZE) MF_CHECK(wflush(w));
    size_t k = WBUF_SIZE - w->buf_n < n ? WBUF_SIZE - w->buf_n : n;
    memcpy(w->buf + w->buf_n, p, k);
    w->buf_n += k;
    w->pos += k;
    p += k;
    n -= k;
  }
  return MF_OK;
}

static mf_status wpad8(mf_tokens_writer *w) {
  static const uint8_t zeros[8] = {0};
  return w->pos % 8 ? wemit(w, zeros, 8 - w->pos % 8) : MF_OK;
}

static mf_status mask_push(mf_tokens_writer *w, uint8_t byte) {
  w->mbuf[w->mbuf_n++] = byte;
  w->mask_bytes++;
  if (w->mbuf_n == MBUF_SIZE) {
    w->mbuf_n = 0;
    return mf_write_all(w->mask_fd, mf_atomic_file_tmp_path(w->file), w->mbuf, MBUF_SIZE);
  }
  return MF_OK;
}

static char *path_with_suffix(const char *path, const char *what) {
  static atomic_uint seq;
  unsigned n = atomic_fetch_add(&seq, 1u);
  size_t len = strlen(path) + strlen(what) + 48;
  char *s = (char *)malloc(len);
  if (s) snprintf(s, len, "%s.%s.%ld.%u", path, what, (long)getpid(), n);
  return s;
}

mf_status mf_tokens_writer_create(const char *path, uint32_t vocab, int width, int with_mask,
                                  mf_tokens_writer **out) {
  if (!out || !path) return MF_ERR(MF_ERR_INVALID_ARG, "mf_tokens_writer_create: path or out is NULL");
  *out = NULL;
  if (vocab == 0) return MF_ERR(MF_ERR_INVALID_ARG, "%s: vocab size 0 (must be >= 1)", path);
  if (width == 0) width = vocab <= 65536u ? 2 : 4;
  if (width != 2 && width != 4)
    return MF_ERR(MF_ERR_INVALID_ARG, "%s: token width %d is not 2 (u16) or 4 (u32)", path, width);
  if (width == 2 && vocab > 65536u)
    return MF_ERR(MF_ERR_INVALID_ARG, "%s: vocab size %u does not fit 2-byte tokens (at most 65536)", path,
                  vocab);

  mf_tokens_writer *w = (mf_tokens_writer *)calloc(1, sizeof *w);
  if (!w) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "%s: out of memory creating a token writer", path);
  w->mask_fd = -1;
  w->vocab = vocab;
  w->width = (uint32_t)width;
  w->with_mask = with_mask != 0;
  w->pos = MF_TOKENS_HEADER_SIZE;
  w->path = mf_strdup(path);
  w->buf = (uint8_t *)malloc(WBUF_SIZE);
  w->mbuf = w->with_mask ? (uint8_t *)malloc(MBUF_SIZE) : NULL;
  if (!w->path || !w->buf || (w->with_mask && !w->mbuf)) {
    mf_tokens_writer_free(w);
    return MF_ERR(MF_ERR_OUT_OF_MEMORY, "%s: out of memory creating a token writer", path);
  }
  mf_status s = mf_atomic_file_open(path, &w->file);
  if (s != MF_OK) {
    mf_tokens_writer_free(w);
    return s;
  }
  if (w->with_mask) {
    char *spool = path_with_suffix(path, "mask");
    w->mask_fd = spool ? open(spool, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600) : -1;
    int e = errno;
    if (w->mask_fd >= 0) unlink(spool); /* the fd keeps it; nothing is left behind */
    if (w->mask_fd < 0) {
      s = MF_ERR(MF_ERR_IO, "%s: cannot create the mask spool file %s: %s", path, spool ? spool : "?",
                 spool ? strerror(e) : "out of memory");
      free(spool);
      mf_tokens_writer_free(w);
      return s;
    }
    free(spool);
  }
  /* The header's place, rewritten by finish. */
  static const uint8_t zeros[MF_TOKENS_HEADER_SIZE] = {0};
  s = mf_atomic_file_write(w->file, zeros, sizeof zeros);
  if (s != MF_OK) {
    mf_tokens_writer_free(w);
    return s;
  }
  *out = w;
  return MF_OK;
}

mf_status mf_tokens_writer_append(mf_tokens_writer *w, const uint32_t *ids, const uint8_t *mask, size_t n) {
  if (w->finished) return MF_ERR(MF_ERR_INVALID_ARG, "%s: append after finish", w->path);
  if (mask && !w->with_mask)
    return MF_ERR(MF_ERR_INVALID_ARG, "%s: a loss mask was given, but the writer was created without one",
                  w->path);
  for (size_t i = 0; i < n; i++)
    if (ids[i] >= w->vocab)
      return MF_ERR(MF_ERR_INVALID_ARG, "%s: token %llu: id %u >= vocab %u", w->path, (ull)(w->count + i),
                    ids[i], w->vocab);
  uint8_t tmp[4096 * 4];
  for (size_t b = 0; b < n;) {
    size_t k = n - b < 4096 ? n - b : 4096;
    if (w->width == 2)
      for (size_t i = 0; i < k; i++) {
        uint16_t v = (uint16_t)ids[b + i];
        memcpy(tmp + 2 * i, &v, 2);
      }
    else
      memcpy(tmp, ids + b, 4 * k);
    MF_CHECK(wemit(w, tmp, k * w->width));
    b += k;
  }
  if (w->with_mask)
    for (size_t i = 0; i < n; i++) {
      uint8_t bit = mask ? mask[i] != 0 : 1;
      w->mbits |= (uint8_t)(bit << w->mbits_n);
      if (++w->mbits_n == 8) {
        MF_CHECK(mask_push(w, w->mbits));
        w->mbits = 0;
        w->mbits_n = 0;
      }
    }
  w->count += n;
  return MF_OK;
}

mf_status mf_tokens_writer_end_document(mf_tokens_writer *w) {
  if (w->finished) return MF_ERR(MF_ERR_INVALID_ARG, "%s: end_document after finish", w->path);
  if (w->count == w->doc_start) return MF_OK;
  if (w->n_docs == w->cap_docs) {
    size_t cap = w->cap_docs ? 2 * w->cap_docs : 1024;
    uint64_t *d = (uint64_t *)realloc(w->docs, cap * sizeof *d);
    if (!d) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "%s: out of memory for %zu document starts", w->path, cap);
    w->docs = d;
    w->cap_docs = cap;
  }
  w->docs[w->n_docs++] = w->doc_start;
  w->doc_start = w->count;
  return MF_OK;
}

static mf_status finish_body(mf_tokens_writer *w) {
  MF_CHECK(mf_tokens_writer_end_document(w));
  uint64_t tokens_offset = MF_TOKENS_HEADER_SIZE, tokens_size = w->count * w->width;
  MF_CHECK(wpad8(w));
  uint64_t mask_offset = 0, mask_size = 0;
  if (w->with_mask) {
    if (w->mbits_n) MF_CHECK(mask_push(w, w->mbits));
    if (w->mbuf_n) MF_CHECK(mf_write_all(w->mask_fd, mf_atomic_file_tmp_path(w->file), w->mbuf, w->mbuf_n));
    w->mbuf_n = 0;
    mask_offset = w->pos;
    mask_size = w->mask_bytes;
    if (lseek(w->mask_fd, 0, SEEK_SET) != 0)
      return MF_ERR(MF_ERR_IO, "%s: cannot rewind the mask spool: %s", w->path, strerror(errno));
    for (uint64_t left = mask_size; left;) {
      size_t want = left < MBUF_SIZE ? (size_t)left : MBUF_SIZE;
      ssize_t k = read(w->mask_fd, w->mbuf, want);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0)
        return MF_ERR(MF_ERR_IO, "%s: reading the mask spool back: %s", w->path,
                      k < 0 ? strerror(errno) : "short");
      MF_CHECK(wemit(w, w->mbuf, (size_t)k));
      left -= (uint64_t)k;
    }
    MF_CHECK(wpad8(w));
  }
  uint64_t docs_offset = w->pos, docs_size = 8 * (uint64_t)w->n_docs;
  MF_CHECK(wemit(w, w->docs, (size_t)docs_size));
  MF_CHECK(wflush(w));

  uint8_t h[MF_TOKENS_HEADER_SIZE] = {0};
  uint32_t u32;
  uint64_t u64;
  memcpy(h, MF_TOKENS_MAGIC, 8);
#define PUT32(off, v) (u32 = (uint32_t)(v), memcpy(h + (off), &u32, 4))
#define PUT64(off, v) (u64 = (uint64_t)(v), memcpy(h + (off), &u64, 8))
  PUT32(MF_TOKENS_OFF_VERSION, MF_TOKENS_VERSION);
  PUT32(MF_TOKENS_OFF_HEADER_SIZE, MF_TOKENS_HEADER_SIZE);
  PUT32(MF_TOKENS_OFF_VOCAB, w->vocab);
  PUT32(MF_TOKENS_OFF_WIDTH, w->width);
  PUT64(MF_TOKENS_OFF_COUNT, w->count);
  PUT64(MF_TOKENS_OFF_DOC_COUNT, w->n_docs);
  PUT64(MF_TOKENS_OFF_FLAGS, w->with_mask ? MF_TOKENS_FLAG_MASK : 0);
  PUT64(MF_TOKENS_OFF_TOKENS_OFFSET, tokens_offset);
  PUT64(MF_TOKENS_OFF_TOKENS_SIZE, tokens_size);
  PUT64(MF_TOKENS_OFF_MASK_OFFSET, mask_offset);
  PUT64(MF_TOKENS_OFF_MASK_SIZE, mask_size);
  PUT64(MF_TOKENS_OFF_DOCS_OFFSET, docs_offset);
  PUT64(MF_TOKENS_OFF_DOCS_SIZE, docs_size);
  PUT64(MF_TOKENS_OFF_FILE_SIZE, w->pos);
  PUT32(MF_TOKENS_OFF_PAYLOAD_CRC, w->crc);
  PUT32(MF_TOKENS_OFF_HEADER_CRC, mf_tokens_crc32(0, h, MF_TOKENS_OFF_HEADER_CRC));
#undef PUT32
#undef PUT64
  if (pwrite(mf_atomic_file_fd(w->file), h, sizeof h, 0) != (ssize_t)sizeof h)
    return MF_ERR(MF_ERR_IO, "%s: writing the header failed: pwrite: %s", mf_atomic_file_tmp_path(w->file),
                  strerror(errno));
  mf_atomic_file *f = w->file;
  w->file = NULL; /* commit frees it, and on failure removes the temporary file */
  w->finished = 1;
  return mf_atomic_file_commit(f);
}

mf_status mf_tokens_writer_finish(mf_tokens_writer *w) {
  if (w->finished) return MF_ERR(MF_ERR_INVALID_ARG, "%s: finish called twice", w->path);
  mf_status s = finish_body(w);
  if (s != MF_OK) {
    /* A failed finish leaves nothing behind: the temporary file goes, path is untouched. */
    mf_atomic_file_abort(w->file);
    w->file = NULL;
    w->finished = 1;
  }
  return s;
}

void mf_tokens_writer_free(mf_tokens_writer *w) {
  if (!w) return;
  mf_atomic_file_abort(w->file); /* still there only while unfinished */
  if (w->mask_fd >= 0) close(w->mask_fd);
  free(w->docs);
  free(w->buf);
  free(w->mbuf);
  free(w->path);
  free(w);
}

uint64_t mf_tokens_writer_count(const mf_tokens_writer *w) {
  return w->count;
}
uint64_t mf_tokens_writer_doc_count(const mf_tokens_writer *w) {
  return w->n_docs;
}
