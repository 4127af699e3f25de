/* Host buffers in anonymous memory or in an unlinked, mapped file. The rules
 * are in hostbuf.h. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "src/core/hostbuf.h"

#define TMPFS_MAGIC_ 0x01021994 /* linux/magic.h */
#define WHAT_MAX_ 48
#define WILLNEED_CHUNK_ ((size_t)128 << 10) /* a multiple of the page size */

static size_t page_size(void) {
  long p = sysconf(_SC_PAGESIZE);
  return p > 0 ? (size_t)p : 4096;
}

/* Bytes statvfs says an unprivileged user may still write in dir; -1 when
 * unknown (a filesystem reporting no blocks at all, as pseudo and some
 * network filesystems do, says nothing about its space). */
int64_t mf_hostbuf_dir_free(const char *dir) {
  struct statvfs v;
  if (statvfs(dir, &v) != 0 || v.f_frsize == 0 || v.f_blocks == 0) return -1;
  uint64_t n;
  if (__builtin_mul_overflow((uint64_t)v.f_bavail, (uint64_t)v.f_frsize, &n) || n > (uint64_t)INT64_MAX)
    return -1;
  return (int64_t)n;
}

/* ", X free" for messages ("" when statvfs fails). */
static const char *free_note(const char *dir, char *buf, size_t cap) {
  int64_t f = mf_hostbuf_dir_free(dir);
  if (f < 0) return "";
  char h[32];
  snprintf(buf, cap, " (%s free there)", mf_format_bytes((uint64_t)f, h, sizeof h));
  return buf;
}

/* DIR/moefit-<what>-XXXXXX, the directory's trailing slashes dropped. */
static mf_status file_template(const char *dir, const char *what, char *out, size_t cap) {
  size_t dl = strlen(dir);
  while (dl > 1 && dir[dl - 1] == '/') dl--;
  char w[WHAT_MAX_ + 1];
  size_t wl = 0;
  for (const char *c = what; *c && wl < WHAT_MAX_; c++) {
    int ok = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '.' ||
             *c == '_' || *c == '-';
    w[wl++] = ok ? *c : '_';
  }
  w[wl] = 0;
  int n = snprintf(out, cap, "%.*s%smoefit-%s-XXXXXX", (int)dl, dir, dir[dl - 1] == '/' ? "" : "/", w);
  if (n < 0 || (size_t)n >= cap)
    return MF_ERR(MF_ERR_INVALID_ARG,
                  "%s: the directory's path is too long for a file name (at most %d bytes)", dir,
                  (int)cap - 1);
  return MF_OK;
}

static mf_status alloc_anonymous(const char *what, size_t bytes, mf_hostbuf *out) {
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    char h[32];
    return MF_ERR(MF_ERR_OUT_OF_MEMORY, "out of host memory allocating %s for %s: mmap: %s",
                  mf_format_bytes(bytes, h, sizeof h), what, strerror(errno));
  }
  out->ptr = p;
  out->bytes = bytes;
  return MF_OK;
}

/* Creates, unlinks, reserves and maps the file; on failure closes what it opened. */
static mf_status alloc_file(const char *dir, const char *what, size_t bytes, const char *size_h,
                            mf_hostbuf *out) {
  char note[64];
  if ((uint64_t)bytes > (uint64_t)INT64_MAX) /* off_t */
    return MF_ERR(MF_ERR_IO, "%s: cannot hold %s (%zu bytes) for %s: larger than any file", dir, size_h,
                  bytes, what);
  int64_t avail = mf_hostbuf_dir_free(dir);
  if (avail >= 0 && (uint64_t)bytes > (uint64_t)avail)
    return MF_ERR(MF_ERR_IO, "%s: cannot hold %s for %s: not enough space%s", dir, size_h, what,
                  free_note(dir, note, sizeof note));
  MF_CHECK(file_template(dir, what, out->path, sizeof out->path));
  int fd = mkostemp(out->path, O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    return MF_ERR(MF_ERR_IO, "%s: cannot hold %s for %s: cannot create a file there: mkstemp: %s%s", dir,
                  size_h, what, strerror(e),
                  e == EACCES || e == EROFS || e == EPERM ? " (is the directory writable?)" : "");
  }
  /* Unlinked before anything else can fail or crash: the file lives as long as fd and the mapping. */
  if (unlink(out->path) != 0) {
    int e = errno;
    close(fd);
    return MF_ERR(MF_ERR_IO, "%s: cannot unlink the new file %s: %s", dir, out->path, strerror(e));
  }
  mf_status s = MF_OK;
  struct statfs fs;
  if (fstatfs(fd, &fs) == 0 && (uint64_t)fs.f_type == TMPFS_MAGIC_)
    MF_LOGW("io", "%s is on tmpfs: %s of %s placed there stays in memory", dir, size_h, what);
  int e;
  do e = posix_fallocate(fd, 0, (off_t)bytes);
  while (e == EINTR);
  if (e != 0) {
    s = MF_ERR(MF_ERR_IO, "%s: cannot hold %s for %s: posix_fallocate: %s%s%s", dir, size_h, what,
               strerror(e), e == ENOSPC || e == EDQUOT ? free_note(dir, note, sizeof note) : "",
               e == EFBIG ? " (the filesystem's or this process's file size limit)" : "");
    goto fail;
  }
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    s = MF_ERR(MF_ERR_IO, "%s: cannot map %s for %s: mmap of %s: %s", dir, size_h, what, out->path,
               strerror(errno));
    goto fail;
  }
  /* A hint only (read-ahead grows, pages behind are let go sooner): a refusal changes nothing. */
  if (madvise(p, bytes, MADV_SEQUENTIAL) != 0)
    MF_LOGD("io", "%s: madvise(MADV_SEQUENTIAL) failed: %s", out->path, strerror(errno));
  out->ptr = p;
  out->bytes = bytes;
  out->on_disk = 1;
  out->fd_ = fd;
  MF_LOGD("io", "%s: %s for %s in the unlinked file %s", dir, size_h, what, out->path);
  return MF_OK;
fail:
  close(fd); /* the filesystem frees what posix_fallocate reserved */
  return s;
}

mf_status mf_hostbuf_alloc(const char *dir, const char *what, size_t bytes, mf_hostbuf *out) {
  if (!out) return MF_ERR(MF_ERR_INVALID_ARG, "mf_hostbuf_alloc: out is NULL");
  memset(out, 0, sizeof *out);
  if (!what || !what[0]) what = "buffer";
  if (!dir) return bytes ? alloc_anonymous(what, bytes, out) : MF_OK;
  char size_h[32];
  mf_format_bytes(bytes, size_h, sizeof size_h);
  if (!dir[0]) return MF_ERR(MF_ERR_INVALID_ARG, "mf_hostbuf_alloc: an empty directory name for %s", what);
  struct stat sb;
  if (stat(dir, &sb) != 0) {
    int e = errno;
    return MF_ERR(MF_ERR_IO, "%s: cannot hold %s for %s: %s", dir, size_h, what,
                  e == ENOENT ? "no such directory" : strerror(e));
  }
  if (!S_ISDIR(sb.st_mode))
    return MF_ERR(MF_ERR_IO, "%s: cannot hold %s for %s: not a directory", dir, size_h, what);
  if (!bytes) return MF_OK;
  mf_status s = alloc_file(dir, what, bytes, size_h, out);
  if (s != MF_OK) memset(out, 0, sizeof *out);
  return s;
}

void mf_hostbuf_free(mf_hostbuf *b) {
  if (!b) return;
  if (b->ptr && b->bytes) munmap(b->ptr, b->bytes);
  if (b->on_disk) close(b->fd_);
  memset(b, 0, sizeof *b);
}

mf_status mf_hostbuf_advise(mf_hostbuf *b, size_t offset, size_t bytes, int will_need) {
  if (!b) return MF_ERR(MF_ERR_INVALID_ARG, "mf_hostbuf_advise: NULL buffer");
  size_t end;
  if (!mf_add_size(offset, bytes, &end) || end > b->bytes)
    return MF_ERR(MF_ERR_INVALID_ARG, "%s: advice for bytes [%zu, %zu + %zu) outside the buffer of %zu bytes",
                  b->on_disk ? b->path : "host buffer", offset, offset, bytes, b->bytes);
  if (!bytes || !b->on_disk) return MF_OK;
  /* Whole pages; the mapping's last page is whole too, so rounding up stays inside it. */
  size_t page = page_size();
  size_t lo = offset & ~(page - 1);
  size_t hi = (end + page - 1) & ~(page - 1);
  uint8_t *base = (uint8_t *)b->ptr;
  if (will_need) {
    /* One MADV_WILLNEED reads ahead at most the file's read-ahead window
     * (max of read_ahead_kb and max_sectors_kb, 128 KiB at the least by
     * default), whatever the length; chunks of that size queue the whole range. */
    for (size_t at = lo; at < hi; at += WILLNEED_CHUNK_) {
      size_t n = hi - at < WILLNEED_CHUNK_ ? hi - at : WILLNEED_CHUNK_;
      if (madvise(base + at, n, MADV_WILLNEED) != 0)
        return MF_ERR(MF_ERR_IO, "%s: madvise(MADV_WILLNEED) of bytes [%zu, %zu) failed: %s", b->path, at,
                      at + n, strerror(errno));
    }
    return MF_OK;
  }
  if (hi > b->bytes) hi = b->bytes; /* past here only the file's calls, which need no page rounding */
  /* Order matters: posix_fadvise cannot drop pages still mapped. The page
   * cache already knows which pages are dirty (a store to a clean page of a
   * shared file mapping faults and marks it), and unmapping keeps that mark. */
  if (madvise(base + lo, ((hi - lo) + page - 1) & ~(page - 1), MADV_DONTNEED) != 0)
    return MF_ERR(MF_ERR_IO, "%s: madvise(MADV_DONTNEED) of bytes [%zu, %zu) failed: %s", b->path, lo, hi,
                  strerror(errno));
  if (sync_file_range(b->fd_, (off_t)lo, (off_t)(hi - lo), SYNC_FILE_RANGE_WRITE) != 0)
    return MF_ERR(MF_ERR_IO, "%s: sync_file_range of bytes [%zu, %zu) failed: %s", b->path, lo, hi,
                  strerror(errno));
  int e = posix_fadvise(b->fd_, (off_t)lo, (off_t)(hi - lo), POSIX_FADV_DONTNEED);
  if (e != 0)
    return MF_ERR(MF_ERR_IO, "%s: posix_fadvise(POSIX_FADV_DONTNEED) of bytes [%zu, %zu) failed: %s", b->path,
                  lo, hi, strerror(e));
  return MF_OK;
}

/* The first number on the line of `file` that starts with `key` ("" for the
 * file's first line), times `unit`; 0 when absent or not a number. */
static uint64_t number_in(const char *file, const char *key, uint64_t unit) {
  FILE *f = fopen(file, "r");
  if (!f) return 0;
  char line[256];
  uint64_t v = 0;
  const size_t k = strlen(key);
  while (!v && fgets(line, sizeof line, f))
    if (strncmp(line, key, k) == 0) v = strtoull(line + k, NULL, 10) * unit;
  fclose(f);
  return v;
}

uint64_t mf_hostbuf_machine_memory(int available, char *source, size_t source_cap) {
  char dummy[8];
  if (!source) source = dummy, source_cap = sizeof dummy;
  const char *key = available ? "MemAvailable:" : "MemTotal:";
  uint64_t bytes = number_in("/proc/meminfo", key, 1024);
  snprintf(source, source_cap, "%.*s in /proc/meminfo", (int)strlen(key) - 1, key);
  if (!bytes) {
    const long pages = sysconf(available ? _SC_AVPHYS_PAGES : _SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    bytes = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
    snprintf(source, source_cap, "%s physical pages (sysconf)", available ? "available" : "all");
  }
  static const char *const limits[] = {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"};
  for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++) {
    const uint64_t lim = number_in(limits[i], "", 1);
    if (lim > 0 && (bytes == 0 || lim < bytes)) {
      bytes = lim;
      snprintf(source, source_cap, "the cgroup limit in %s", limits[i]);
    }
  }
  return bytes;
}
