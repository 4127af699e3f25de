/*
 * Host buffers: large blocks of host memory (master weights, gradient sums,
 * AdamW moments) that live either in anonymous memory or in a file on a
 * directory of a real disk (memory.nvme_dir), mapped into the address space.
 * Callers use b->ptr the same way in both cases; past host memory the kernel's
 * page cache moves the pages between memory and the file, so a run whose
 * state exceeds host memory still runs, with bits identical to the run in
 * memory. planner/host.h decides which parts spill.
 *
 * On disk: the file is created with mkstemp as DIR/moefit-<what>-XXXXXX
 * (<what> with every byte outside [A-Za-z0-9._-] replaced by '_', cut at 48),
 * unlinked at once (nothing is left behind, however the process ends),
 * reserved whole with posix_fallocate (a full disk is an error here, not a
 * SIGBUS at some later store through the mapping), mapped MAP_SHARED
 * read/write and marked MADV_SEQUENTIAL. It reads as zeros at first.
 * Before creating the file, the size is checked against the space that
 * statvfs reports free to unprivileged users (f_bavail: reserved blocks are
 * left alone even when running as root), so an impossible request fails
 * without first filling the disk; posix_fallocate stays the authority.
 * A directory on tmpfs works but holds the pages in memory (a warning says so).
 *
 * Writeback: Linux writes dirty pages of the mapping back on its own (the
 * flusher threads; a process dirtying pages faster than the disk takes them
 * is throttled at its page faults). mf_hostbuf_advise tells it where the
 * caller is: see there.
 *
 * Not thread-safe per buffer for alloc/free; advise may be called from
 * several threads on disjoint or overlapping ranges, and concurrently with
 * loads and stores to the buffer (it never changes the data).
 */
#ifndef MF_CORE_HOSTBUF_H
#define MF_CORE_HOSTBUF_H

#include <stddef.h>

#include "src/core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MF_HOSTBUF_PATH_MAX 4096

typedef struct mf_hostbuf {
  void *ptr;                      /* bytes bytes, zeroed at allocation; NULL when bytes == 0 */
  size_t bytes;                   /* as asked */
  int on_disk;                    /* 1: backed by an (unlinked) file in the directory */
  char path[MF_HOSTBUF_PATH_MAX]; /* on disk: the file's name when it existed, for messages; else "" */
  /* private */
  int fd_; /* on disk: the file, kept open for writeback and read-ahead advice */
} mf_hostbuf;

/* Allocates `bytes` zeroed bytes for `what` (a name for messages and for the
 * file name; NULL: "buffer").
 *   dir NULL: anonymous memory (mmap, MAP_PRIVATE | MAP_ANONYMOUS), as calloc
 *     would give; failure is MF_ERR_OUT_OF_MEMORY.
 *   dir set: a file in that directory, as described at the top. Failures are
 *     MF_ERR_IO naming the directory, the size, `what` and the fault: no such
 *     directory, not a directory, not writable (mkstemp's errno), not enough
 *     space (with what statvfs reports free), the file size limit, mmap.
 * bytes == 0 is valid: ptr NULL, on_disk 0, no file and no mapping (a set
 * dir is still checked to be an existing directory, so a bad directory is an
 * error whatever the size). *out is zeroed first (mf_hostbuf_free is then
 * safe on it whatever the outcome). */
mf_status mf_hostbuf_alloc(const char *dir, const char *what, size_t bytes, mf_hostbuf *out);

/* Bytes statvfs says an unprivileged user may still write in dir; -1 when
 * unknown (dir missing or unreadable, or a filesystem reporting no blocks at
 * all, as pseudo and some network filesystems do). */
int64_t mf_hostbuf_dir_free(const char *dir);

/* This machine's memory as a process here can use it: `available` 1 —
 * MemAvailable (what the kernel can hand out without swapping), else 0 — all
 * of it (MemTotal); either bounded by the cgroup's memory limit (v2 or v1).
 * /proc/meminfo missing: sysconf's pages. `source` (may be NULL) gets where
 * the figure came from, for messages. 0 when nothing says. */
uint64_t mf_hostbuf_machine_memory(int available, char *source, size_t source_cap);

/* Unmaps the buffer and closes its file (whose blocks the filesystem then
 * frees); zeroes *b. NULL, a zeroed struct, or a second free are fine. */
void mf_hostbuf_free(mf_hostbuf *b);

/* Tells the kernel about [offset, offset + bytes) of the buffer. Never
 * changes the data; only costs or saves time. The range is widened to whole
 * pages (a neighbour in a shared page at worst takes a minor fault later).
 *   will_need 1: about to be used: queues reads of the whole range from
 *     the file (MADV_WILLNEED, in chunks: one call on a long range would
 *     read only the first read-ahead window) without waiting for them.
 *     Queueing blocks once the device's queue is full, so for a range much
 *     larger than that the call takes about the time to read it: call it a
 *     tensor ahead, or from a helper thread, for the reads to overlap work.
 *   will_need 0: done with it for a while (e.g. one tensor's moments after
 *     its AdamW update): unmaps the range's pages from this process
 *     (MADV_DONTNEED: for a MAP_SHARED file mapping the pages stay in the
 *     page cache and keep their dirty mark there, so nothing is lost and
 *     the next access faults the contents back in; on anonymous or
 *     MAP_PRIVATE memory the same call would throw the data away, which is
 *     why it is never made there), starts writing them to the file
 *     (sync_file_range SYNC_FILE_RANGE_WRITE; msync(MS_ASYNC) does nothing
 *     on Linux since 2.6.19) without waiting, and drops from the page cache
 *     what is already clean (posix_fadvise POSIX_FADV_DONTNEED); pages still
 *     being written are moved to the inactive list, the first reclaimed.
 *     Like the reads, queueing the writes blocks once the device's queue
 *     is full.
 * In memory (not on_disk) both are no-ops. bytes == 0 is a no-op.
 * MF_ERR_INVALID_ARG for a range outside the buffer; MF_ERR_IO when a call
 * fails (naming the file, the range and the call). */
mf_status mf_hostbuf_advise(mf_hostbuf *b, size_t offset, size_t bytes, int will_need);

#ifdef __cplusplus
}
#endif

#endif /* MF_CORE_HOSTBUF_H */
