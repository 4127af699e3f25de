/* Files: atomic replacement (PATH.tmp, fsync, rename, fsync of the directory),
 * a write(2) loop, whole-file reads and read-only maps. The rules are in
 * core.h. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "src/core/core.h"

struct mf_atomic_file {
  char *path;
  char *tmp;
  int fd;     /* the temporary file; -1 once synced */
  int failed; /* a write or sync failed: commit will not rename */
  dev_t dev;  /* the inode open created: only that one is renamed or removed */
  ino_t ino;
};

mf_status mf_write_all(int fd, const char *path, const void *data, size_t n) {
  const uint8_t *p = (const uint8_t *)data;
  while (n) {
    size_t chunk = n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n;
    ssize_t w = write(fd, p, chunk);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return MF_ERR(MF_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    if (w == 0) return MF_ERR(MF_ERR_IO, "%s: write failed: no progress", path);
    p += w;
    n -= (size_t)w;
  }
  return MF_OK;
}

/* After the rename the file is in place; a directory that cannot be synced only
 * means the new entry might not survive a crash, which is worth a warning. */
static void fsync_dir_of(const char *path) {
  const char *slash = strrchr(path, '/');
  size_t len = slash && slash != path ? (size_t)(slash - path) : 1;
  char *dir = (char *)malloc(len + 1);
  if (!dir) {
    MF_LOGW("io", "%s: out of memory; the directory was not fsynced", path);
    return;
  }
  memcpy(dir, slash ? path : ".", len); /* slash == path: "/" */
  dir[len] = 0;
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    MF_LOGW("io", "%s: cannot open the directory to fsync it (open: %s); %s may not survive a crash", dir,
            strerror(errno), path);
  } else {
    if (fsync(fd) != 0 && errno != EINVAL) /* EINVAL: a filesystem without directory fsync */
      MF_LOGW("io", "%s: fsync of the directory failed (%s); %s may not survive a crash", dir,
              strerror(errno), path);
    close(fd);
  }
  free(dir);
}

/* Is PATH.tmp still the file open created? *err gets lstat's errno, or 0. */
static int tmp_is_ours(const mf_atomic_file *f, int *err) {
  struct stat sb;
  *err = 0;
  if (lstat(f->tmp, &sb) != 0) {
    *err = errno;
    return 0;
  }
  return sb.st_dev == f->dev && sb.st_ino == f->ino;
}

static void file_free(mf_atomic_file *f) {
  if (f->fd >= 0) close(f->fd);
  free(f->tmp);
  free(f->path);
  free(f);
}

mf_status mf_atomic_file_open(const char *path, mf_atomic_file **out) {
  if (!out) return MF_ERR(MF_ERR_INVALID_ARG, "mf_atomic_file_open: out is NULL");
  *out = NULL;
  if (!path || !path[0]) return MF_ERR(MF_ERR_INVALID_ARG, "mf_atomic_file_open: no path");
  mf_atomic_file *f;
  MF_CHECK(mf_calloc(1, sizeof *f, "an atomic file", (void **)&f));
  f->fd = -1;
  mf_status s;
  size_t n = strlen(path) + sizeof ".tmp";
  f->path = mf_strdup(path);
  MF_CHECK_GOTO(mf_malloc(n, "a temporary file name", (void **)&f->tmp), s, fail);
  if (!f->path) {
    s = MF_ERR(MF_ERR_OUT_OF_MEMORY, "%s: out of host memory", path);
    goto fail;
  }
  snprintf(f->tmp, n, "%s.tmp", path);
  /* ENOENT/ENOTDIR: nothing there, or no such directory, which open reports. */
  if (unlink(f->tmp) != 0 && errno != ENOENT && errno != ENOTDIR) {
    s = MF_ERR(MF_ERR_IO, "%s: cannot remove the stale temporary file %s: unlink: %s", path, f->tmp,
               strerror(errno));
    goto fail;
  }
  /* O_EXCL: should a link reappear under the name, open fails instead of following it. */
  f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
  if (f->fd < 0) {
    int e = errno;
    s = MF_ERR(MF_ERR_IO, "%s: cannot create the temporary file %s: open: %s%s", path, f->tmp, strerror(e),
               e == ENOENT ? " (does the directory exist?)" : "");
    goto fail;
  }
  struct stat sb;
  if (fstat(f->fd, &sb) != 0) {
    s = MF_ERR(MF_ERR_IO, "%s: fstat failed: %s", f->tmp, strerror(errno));
    close(f->fd);
    f->fd = -1;
    unlink(f->tmp); /* just created by us, nothing else can be there */
    goto fail;
  }
  f->dev = sb.st_dev;
  f->ino = sb.st_ino;
  *out = f;
  return MF_OK;
fail:
  file_free(f);
  return s;
}

mf_status mf_atomic_file_write(mf_atomic_file *f, const void *data, size_t n) {
  if (!f || (n && !data)) return MF_ERR(MF_ERR_INVALID_ARG, "mf_atomic_file_write: NULL argument");
  if (f->fd < 0) return MF_ERR(MF_ERR_INVALID_ARG, "%s: write after sync", f->tmp);
  mf_status s = mf_write_all(f->fd, f->tmp, data, n);
  if (s != MF_OK) f->failed = 1;
  return s;
}

int mf_atomic_file_fd(const mf_atomic_file *f) {
  return f ? f->fd : -1;
}

const char *mf_atomic_file_tmp_path(const mf_atomic_file *f) {
  return f ? f->tmp : NULL;
}

mf_status mf_atomic_file_sync(mf_atomic_file *f) {
  if (!f) return MF_ERR(MF_ERR_INVALID_ARG, "mf_atomic_file_sync: NULL file");
  if (f->fd < 0) return MF_OK;
  int fd = f->fd;
  f->fd = -1;
  if (fsync(fd) != 0) {
    int e = errno;
    close(fd);
    f->failed = 1;
    return MF_ERR(MF_ERR_IO, "%s: fsync failed: %s", f->tmp, strerror(e));
  }
  if (close(fd) != 0) {
    f->failed = 1;
    return MF_ERR(MF_ERR_IO, "%s: close failed: %s", f->tmp, strerror(errno));
  }
  return MF_OK;
}

mf_status mf_atomic_file_commit(mf_atomic_file *f) {
  if (!f) return MF_ERR(MF_ERR_INVALID_ARG, "mf_atomic_file_commit: NULL file");
  mf_status s;
  if (f->failed) {
    s = MF_ERR(MF_ERR_INVALID_ARG, "%s: not renamed over %s: a write to it failed", f->tmp, f->path);
    goto fail;
  }
  MF_CHECK_GOTO(mf_atomic_file_sync(f), s, fail);
  int e;
  if (!tmp_is_ours(f, &e)) {
    s = MF_ERR(MF_ERR_IO, "%s: not renamed: the temporary file %s was %s (another writer of %s?)", f->path,
               f->tmp, e ? "removed" : "replaced", f->path);
    file_free(f); /* what is there now is not ours to remove */
    return s;
  }
  if (rename(f->tmp, f->path) != 0) {
    s = MF_ERR(MF_ERR_IO, "%s: cannot rename %s over it: %s", f->path, f->tmp, strerror(errno));
    goto fail;
  }
  fsync_dir_of(f->path);
  file_free(f);
  return MF_OK;
fail:
  mf_atomic_file_abort(f);
  return s;
}

void mf_atomic_file_abort(mf_atomic_file *f) {
  if (!f) return;
  if (f->fd >= 0) close(f->fd);
  f->fd = -1;
  int e;
  if (tmp_is_ours(f, &e)) unlink(f->tmp);
  file_free(f);
}

mf_status mf_write_file_atomic(const char *path, const void *data, size_t n) {
  mf_atomic_file *f;
  MF_CHECK(mf_atomic_file_open(path, &f));
  mf_status s = mf_atomic_file_write(f, data, n);
  if (s != MF_OK) {
    mf_atomic_file_abort(f);
    return s;
  }
  return mf_atomic_file_commit(f);
}

/* ---------------------------------------------------------- reading files */

const char *mf_file_kind(unsigned mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "neither a file nor a directory";
}

static mf_status not_regular(const char *path, const char *what, mode_t mode) {
  return MF_ERR(MF_ERR_IO, "%s: not a regular file but %s%s%s%s", path, mf_file_kind(mode), what ? "; " : "",
                what ? what : "", what ? " is read only from a regular file" : "");
}

/* stat first: a socket cannot be opened at all, and opening a device can do
 * something (rewind a tape). O_NONBLOCK: should a FIFO take the file's place
 * between the stat and the open, open returns at once instead of waiting for a
 * writer, and fstat then refuses it. */
mf_status mf_open_regular(const char *path, const char *what, int *fd_out, uint64_t *size, int *err) {
  if (err) *err = 0;
  if (!path || !fd_out) return MF_ERR(MF_ERR_INVALID_ARG, "mf_open_regular: NULL argument");
  *fd_out = -1;
  struct stat sb;
  if (stat(path, &sb) != 0) {
    if (err) *err = errno;
    return MF_ERR(MF_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  }
  if (!S_ISREG(sb.st_mode)) return not_regular(path, what, sb.st_mode);
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (err) *err = errno;
    return MF_ERR(MF_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  }
  if (fstat(fd, &sb) != 0) {
    int e = errno;
    if (err) *err = e;
    close(fd);
    return MF_ERR(MF_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
  }
  if (!S_ISREG(sb.st_mode)) {
    close(fd);
    return not_regular(path, what, sb.st_mode);
  }
  const int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
    int e = errno;
    if (err) *err = e;
    close(fd);
    return MF_ERR(MF_ERR_IO, "%s: fcntl: %s", path, strerror(e));
  }
  *fd_out = fd;
  if (size) *size = (uint64_t)sb.st_size;
  return MF_OK;
}

mf_status mf_read_file(const char *path, size_t max_bytes, const char *what, char **out, size_t *out_len) {
  if (!path || !out || !out_len) return MF_ERR(MF_ERR_INVALID_ARG, "mf_read_file: NULL argument");
  uint64_t size;
  int fd;
  MF_CHECK(mf_open_regular(path, what, &fd, &size, NULL));
  mf_status s = MF_OK;
  char *buf = NULL;
  if (size > (uint64_t)max_bytes) {
    s = MF_ERR(MF_ERR_FORMAT, "%s: %llu bytes is too large for %s (at most %zu)", path,
               (unsigned long long)size, what ? what : "this file", max_bytes);
    goto done;
  }
  size_t cap = (size_t)size, len = 0;
  MF_CHECK_GOTO(mf_malloc(cap + 1, path, (void **)&buf), s, done);
  while (len < cap) {
    ssize_t n = read(fd, buf + len, cap - len);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      s = MF_ERR(MF_ERR_IO, "%s: read failed: %s", path, strerror(errno));
      goto done;
    }
    if (n == 0) break; /* shrank under us: what is there */
    len += (size_t)n;
  }
  buf[len] = 0;
  *out = buf;
  *out_len = len;
  buf = NULL;
done:
  free(buf);
  close(fd);
  return s;
}

mf_status mf_map_file(const char *path, const uint8_t **base, size_t *size, int *err) {
  if (err) *err = 0;
  if (!path || !base || !size) return MF_ERR(MF_ERR_INVALID_ARG, "mf_map_file: NULL argument");
  uint64_t bytes;
  int fd;
  MF_CHECK(mf_open_regular(path, NULL, &fd, &bytes, err));
  size_t n = (size_t)bytes;
  void *p = NULL;
  if (n) { /* mmap refuses 0 bytes */
    p = mmap(NULL, n, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      close(fd);
      return MF_ERR(MF_ERR_IO, "%s: cannot mmap %zu bytes: %s", path, n, strerror(e));
    }
  }
  close(fd); /* the mapping keeps the file */
  *base = (const uint8_t *)p;
  *size = n;
  return MF_OK;
}

void mf_unmap_file(const void *base, size_t size) {
  if (base && size) munmap((void *)base, size);
}

static mf_status mkdir_prefix(char *p, const char *shown) {
  if (mkdir(p, 0777) != 0 && errno != EEXIST)
    return MF_ERR(MF_ERR_IO, "%s: cannot create the directory %s: %s", shown, p, strerror(errno));
  return MF_OK;
}

mf_status mf_mkdir_parents(const char *path) {
  char *p = mf_strdup(path);
  if (!p) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
  mf_status st = MF_OK;
  for (char *s = strchr(p + 1, '/'); s && st == MF_OK; s = strchr(s + 1, '/')) {
    *s = 0;
    st = mkdir_prefix(p, path);
    *s = '/';
  }
  free(p);
  return st;
}

mf_status mf_mkdir_p(const char *dir) {
  MF_CHECK(mf_mkdir_parents(dir));
  char *p = mf_strdup(dir);
  if (!p) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "%s: out of memory", dir);
  mf_status st = mkdir_prefix(p, dir);
  free(p);
  return st;
}
