/* The ranks of one machine (a node): the node's collectives, the reduction
 * between node leaders and the memory a node's ranks share. */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/statvfs.h>
#include <sys/vfs.h>
#endif

#include "comm/comm_internal.h"
#include "src/core/env.h"

/* The leaders' gather buffer: whatever the vector's length, it goes through
 * pieces of at most this many bytes (all nodes' parts together). */
#define MF_LEADERS_GATHER_BYTES ((size_t)64 << 20)

int mf_comm_nodes(const mf_comm *c) {
  return c->nodes;
}
int mf_comm_node(const mf_comm *c) {
  return c->node;
}
int mf_comm_is_leader(const mf_comm *c) {
  return c->local_rank == 0;
}

mf_status mf_comm_node_barrier(mf_comm *c) {
  if (!c->mpi || c->local_size == 1) return MF_OK;
  int64_t ticket = 0;
  MF_CHECK(mf_comm_enter(c, MF_COMM_NODE, &ticket));
  if (!c->board) { /* start-up, before the board exists */
    MPI_Request rq;
    MF_MPI_CHECK(MPI_Ibarrier(c->node_comm, &rq));
    return mf_comm_finish(c, &rq, MF_COMM_NODE, ticket, 0, MF_COMM_NO_BUFFER, "at the node's barrier");
  }
  /* Every rank has come once every count on the board has reached ours (the
   * release of each count orders its rank's writes before what we do next). */
  mf_comm_poll p;
  mf_comm_poll_start(&p, c->timeout_s, 0);
  for (int lr = 0; lr < c->local_size; lr++)
    while (atomic_load_explicit(&c->board[lr].node_calls, memory_order_acquire) < ticket)
      if (!mf_comm_poll_next(&p))
        return mf_comm_timed_out(c, MF_COMM_NODE, ticket, "at the node's barrier", __FILE__, __LINE__);
  return MF_OK;
}

mf_status mf_comm_leaders_allreduce_sum_f32(mf_comm *c, float *buf, size_t n) {
  if (c->local_rank != 0)
    return MF_ERR(MF_ERR_INVALID_ARG,
                  "comm: leaders' allreduce called by local rank %d of node %d (only node leaders call it)",
                  c->local_rank, c->node);
  if (!c->mpi || c->nodes == 1 || n == 0) return MF_OK;
  /* As mf_comm_allreduce_sum_f32, between the leaders, in node order. */
  return mf_comm_ordered_sum_f32(c, c->leaders, MF_COMM_LEADERS, c->node, c->nodes, MF_LEADERS_GATHER_BYTES,
                                 buf, n, "in the leaders' exchange of the nodes' gradient sums");
}

mf_status mf_comm_node_broadcast(mf_comm *c, void *buf, size_t bytes) {
  if (!c->mpi || c->local_size == 1) return MF_OK;
  return mf_comm_bcast_staged(c, c->node_comm, MF_COMM_NODE, c->local_rank, 0, buf, bytes,
                              "in a broadcast from the node's leader");
}

/* ---------------------------------------------------------- shared memory */

struct mf_comm_shared {
  mf_comm *comm;
  MPI_Win win; /* MPI_WIN_NULL: anonymous memory of this process (or nothing) */
  void *base;
  size_t bytes;
};

#ifdef __linux__
#define MF_TMPFS_MAGIC 0x01021994

/* The file that backs the mapping at `base` (a shared window lives in a file
 * Open MPI maps: osc_sm_backing_directory, /dev/shm by default on Linux;
 * other builds and settings put it in the session directory under TMPDIR):
 * 1 with its path, its file system's type and the bytes it has free; 0 for
 * an anonymous mapping or when /proc does not say. */
static int backing_of(const void *base, char *path_out, size_t cap, long *fs_type, uint64_t *free_bytes) {
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f) return 0;
  char *line = NULL;
  size_t lcap = 0;
  int found = 0;
  while (!found && getline(&line, &lcap, f) > 0) {
    unsigned long lo = 0, hi = 0;
    int pos = 0;
    if (sscanf(line, "%lx-%lx %*s %*s %*s %*s %n", &lo, &hi, &pos) < 2 || pos == 0) continue;
    if ((uintptr_t)base < lo || (uintptr_t)base >= hi) continue;
    char *path = line + pos;
    path[strcspn(path, "\n")] = 0;
    /* Open MPI may unlink the file once every rank has mapped it. */
    char *deleted = strstr(path, " (deleted)");
    if (deleted) *deleted = 0;
    if (path[0] != '/') break; /* anonymous or a kernel mapping: not a file */
    struct statfs fs;
    struct statvfs vfs;
    int ok = statfs(path, &fs) == 0 && statvfs(path, &vfs) == 0;
    if (!ok) { /* the file is gone: its directory */
      char *slash = strrchr(path, '/');
      if (slash && slash != path) {
        *slash = 0;
        ok = statfs(path, &fs) == 0 && statvfs(path, &vfs) == 0;
        *slash = '/';
      }
    }
    if (ok) {
      snprintf(path_out, cap, "%s", path);
      *fs_type = (long)fs.f_type;
      *free_bytes = (uint64_t)vfs.f_bavail * (uint64_t)vfs.f_frsize;
      found = 1;
    }
    break;
  }
  free(line);
  fclose(f);
  return found;
}

/* On a disk file system the kernel writes the node's host state back to disk
 * as it changes: say so, once per process. */
static void warn_if_backed_by_disk(const char *path, long fs_type, const char *what) {
  static atomic_int warned;
  if (fs_type != MF_TMPFS_MAGIC && !atomic_exchange(&warned, 1))
    MF_LOGW("comm",
            "the node-shared host state (%s) is backed by %s, a file on disk: the kernel writes its pages "
            "back to the disk. TMPDIR=/dev/shm (or mpirun --mca osc_sm_backing_directory /dev/shm) keeps "
            "it in memory",
            what, path);
}

/* MF_TEST_SHM_FREE=BYTES: the free bytes the backing file system is taken to
 * have (a small /dev/shm without one; test-only, warned about). */
static int test_shm_free(uint64_t *out) { return mf_env_bytes(MF_ENV_TEST_SHM_FREE, out); }
#endif

static mf_status shared_oom(mf_comm *c, size_t bytes, const char *what, const char *why) {
  char size[32];
  return MF_ERR(MF_ERR_OUT_OF_MEMORY, "comm: cannot allocate %s (%s shared by the node's %d rank(s)): %s",
                what ? what : "shared memory", mf_format_bytes(bytes, size, sizeof size), c->local_size, why);
}

mf_status mf_comm_shared_alloc(mf_comm *c, size_t bytes, const char *what, mf_comm_shared **out) {
  *out = NULL;
  mf_comm_shared *s = (mf_comm_shared *)calloc(1, sizeof *s);
  if (!s) return shared_oom(c, bytes, what, "out of memory");
  s->comm = c;
  s->win = MPI_WIN_NULL;
  s->bytes = bytes;
  if (bytes == 0) { /* every local rank passes 0: nothing to agree on */
    *out = s;
    return MF_OK;
  }
  if (!c->mpi || c->local_size == 1) {
    /* Anonymous pages come zeroed; private is enough for one process. */
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      mf_status st = shared_oom(c, bytes, what, strerror(errno));
      free(s);
      return st;
    }
    s->base = p;
    *out = s;
    return MF_OK;
  }
  if (bytes > (size_t)PTRDIFF_MAX) {
    mf_status st = shared_oom(c, bytes, what, "larger than an MPI window can be");
    free(s);
    return st;
  }
  /* MPI_Win_allocate_shared waits for the node's ranks without end: they
   * meet first, with the deadline. */
  mf_status st = mf_comm_node_barrier(c);
  if (st != MF_OK) {
    free(s);
    return st;
  }
  /* Local rank 0 allocates the whole; the others map it. Non-contiguous lets
   * Open MPI align each rank's part to pages instead of packing them. */
  MPI_Info info;
  MF_MPI_CHECK(MPI_Info_create(&info));
  MPI_Info_set(info, "alloc_shared_noncontig", "true");
  void *mine = NULL;
  int rc = MPI_Win_allocate_shared(c->local_rank == 0 ? (MPI_Aint)bytes : 0, 1, info, c->node_comm, &mine,
                                   &s->win);
  MPI_Info_free(&info);
  if (rc != MPI_SUCCESS) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    free(s);
    return shared_oom(c, bytes, what, msg);
  }
  MPI_Aint got = 0;
  int disp = 0;
  rc = MPI_Win_shared_query(s->win, 0, &got, &disp, &s->base);
  if (rc != MPI_SUCCESS || (size_t)got < bytes || !s->base) {
    MPI_Win_free(&s->win);
    free(s);
    if (rc != MPI_SUCCESS) return mf_comm_mpi_error(rc, __FILE__, __LINE__, "MPI_Win_shared_query");
    return MF_ERR(MF_ERR_MPI, "comm: the shared window for %s has %lld bytes, not %zu",
                  what ? what : "memory", (long long)got, bytes);
  }
  /* Room: the backing file is sparse, and a page the file system cannot give
   * at its first touch is a SIGBUS (Docker's /dev/shm is 64 MiB), so local
   * rank 0 checks the free bytes first and every rank fails alike. */
  struct {
    uint64_t free_bytes;
    int64_t short_of;
    char path[512];
  } room;
  memset(&room, 0, sizeof room);
#ifdef __linux__
  long fs_type = 0;
  if (c->local_rank == 0 && backing_of(s->base, room.path, sizeof room.path, &fs_type, &room.free_bytes)) {
    test_shm_free(&room.free_bytes);
    room.short_of = room.free_bytes < bytes;
    if (!room.short_of) warn_if_backed_by_disk(room.path, fs_type, what ? what : "shared memory");
  }
#endif
  st = mf_comm_bcast_staged(c, c->node_comm, MF_COMM_NODE, c->local_rank, 0, &room, sizeof room,
                            "in the broadcast of the shared memory's room");
  if (st != MF_OK) {
    free(s); /* the window stays to MPI: freeing it would wait for the late rank */
    return st;
  }
  if (room.short_of) {
    MPI_Win_free(&s->win);
    free(s);
    char need[32], have[32];
    return MF_ERR(
        MF_ERR_OUT_OF_MEMORY,
        "comm: %s takes %s of memory the node's %d ranks share, in %s, whose file system has %s free: "
        "give it more (docker run --shm-size=SIZE; a larger tmpfs) or put it elsewhere (mpirun --mca "
        "osc_sm_backing_directory DIR, a tmpfs with the room)",
        what ? what : "shared memory", mf_format_bytes(bytes, need, sizeof need), c->local_size, room.path,
        mf_format_bytes(room.free_bytes, have, sizeof have));
  }
  /* Each local rank zeroes its own run of pages, so the first touches (and
   * with them the pages' NUMA placement and the page-fault work) are spread
   * over the node's ranks. */
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  const size_t pages = (bytes + page - 1) / page, L = (size_t)c->local_size, lr = (size_t)c->local_rank;
  size_t b0 = pages * lr / L * page, b1 = pages * (lr + 1) / L * page;
  if (b0 > bytes) b0 = bytes;
  if (b1 > bytes) b1 = bytes;
  memset((char *)s->base + b0, 0, b1 - b0);
  /* The barrier orders the other ranks' zeroing before anything this rank
   * does next; the fence keeps our stores from moving past it. */
  atomic_thread_fence(memory_order_seq_cst);
  st = mf_comm_node_barrier(c);
  atomic_thread_fence(memory_order_seq_cst);
  if (st != MF_OK) {
    free(s); /* as above */
    return st;
  }
  *out = s;
  return MF_OK;
}

void *mf_comm_shared_ptr(const mf_comm_shared *s) {
  return s ? s->base : NULL;
}

void mf_comm_shared_forget(mf_comm_shared *s) {
  if (!s) return;
  if (s->win == MPI_WIN_NULL && s->base) munmap(s->base, s->bytes); /* this process's own pages */
  free(s);
}

void mf_comm_shared_free(mf_comm_shared *s) {
  if (!s) return;
  /* MPI_Win_free waits for the node's ranks without end: they meet first,
   * with the deadline; when one does not come the window stays to MPI, and
   * the comm's next collective fails at once (mf_comm_free ends the job). */
  if (s->win != MPI_WIN_NULL) {
    if (mf_comm_node_barrier(s->comm) == MF_OK) MPI_Win_free(&s->win);
  } else if (s->base) {
    munmap(s->base, s->bytes);
  }
  free(s);
}
