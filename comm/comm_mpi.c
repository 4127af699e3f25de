/* mf_comm over MPI (Open MPI from Debian): start-up, the world's collectives.
 * The node's collectives, shared memory and the relay are in comm_node.c and
 * comm_relay.c; the deadline every wait has, in comm_wait.c. The collectives
 * send and receive through the comm's own buffers, never the caller's: one
 * that timed out stays with MPI, which may still write into its buffer. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm_internal.h"
#include "src/core/env.h"

/* A broadcast goes through the comm's buffer in pieces of at most this. */
#define MF_STAGE_PIECE ((size_t)16 << 20)
/* A wait that moves more than this is "heavy" (mf_comm_poll). */
#define MF_HEAVY_BYTES ((size_t)64 << 10)

mf_status mf_comm_mpi_error(int rc, const char *file, int line, const char *call) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "error %d", rc);
  return mf_error_set(MF_ERR_MPI, file, line, "%s failed: %s", call, msg);
}

static int launched_by_mpirun(void) {
  const char *force = mf_env_string(MF_ENV_COMM);
  if (force && strcmp(force, "mpi") == 0) return 1;
  if (force && strcmp(force, "none") == 0) return 0;
  return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK");
}

/* MF_COMM_NODE_RANKS=K: *k = K (>= 1), or 0 when unset or empty. Read even
 * without MPI, so a mistyped value fails the same way whatever the launch. */
static mf_status node_ranks_from_env(int *k) {
  double v = 0;
  *k = 0;
  MF_CHECK(mf_env_check(MF_ENV_COMM_NODE_RANKS));
  if (mf_env_number(MF_ENV_COMM_NODE_RANKS, &v)) *k = (int)v;
  return MF_OK;
}

mf_status mf_comm_init(int *argc, char ***argv, mf_comm **out) {
  *out = NULL;
  int node_ranks = 0;
  MF_CHECK(node_ranks_from_env(&node_ranks));
  mf_comm *c = (mf_comm *)calloc(1, sizeof *c);
  if (!c) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "comm: out of memory");
  c->world = c->node_comm = c->leaders = c->fails = MPI_COMM_NULL;
  c->fail_rq = c->late_rq = MPI_REQUEST_NULL;
  c->size = c->local_size = c->nodes = 1;
  c->timeout_s = mf_comm_timeout_from_env();
  if (!launched_by_mpirun()) {
    *out = c;
    return MF_OK;
  }
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    int provided = 0;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
      free(c);
      return MF_ERR(MF_ERR_MPI, "comm: MPI_Init_thread failed (was this process started by mpirun?)");
    }
    c->we_init = 1;
  }
  c->mpi = 1;
  mf_status st = MF_OK;
#define TRY(call)                                        \
  do {                                                   \
    if ((call) != MPI_SUCCESS) {                         \
      st = MF_ERR(MF_ERR_MPI, "comm: %s failed", #call); \
      goto fail;                                         \
    }                                                    \
  } while (0)
  TRY(MPI_Comm_dup(MPI_COMM_WORLD, &c->world));
  TRY(MPI_Comm_dup(MPI_COMM_WORLD, &c->fails));
  TRY(MPI_Comm_rank(c->world, &c->rank));
  TRY(MPI_Comm_size(c->world, &c->size));
  /* Keyed by world rank, so rank order within a node is world rank order. */
  TRY(MPI_Comm_split_type(c->world, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &c->node_comm));
  if (node_ranks > 0) {
    MPI_Comm machine = c->node_comm;
    int machine_rank = 0;
    c->node_comm = MPI_COMM_NULL;
    int rc = MPI_Comm_rank(machine, &machine_rank);
    if (rc == MPI_SUCCESS)
      rc = MPI_Comm_split(machine, machine_rank / node_ranks, machine_rank, &c->node_comm);
    MPI_Comm_free(&machine);
    TRY(rc);
  }
  TRY(MPI_Comm_rank(c->node_comm, &c->local_rank));
  TRY(MPI_Comm_size(c->node_comm, &c->local_size));
  /* Errors on the node (a shared window larger than the machine can give)
   * come back as statuses instead of ending the job. */
  TRY(MPI_Comm_set_errhandler(c->node_comm, MPI_ERRORS_RETURN));
  TRY(MPI_Comm_split(c->world, c->local_rank == 0 ? 0 : MPI_UNDEFINED, c->rank, &c->leaders));
  /* A node's index is its leader's rank among the leaders (ordered by world
   * rank), which the leader tells its node. */
  int ids[2] = {0, 1};
  if (c->local_rank == 0) {
    TRY(MPI_Comm_rank(c->leaders, &ids[0]));
    TRY(MPI_Comm_size(c->leaders, &ids[1]));
  }
  TRY(MPI_Bcast(ids, 2, MPI_INT, 0, c->node_comm));
  c->node = ids[0];
  c->nodes = ids[1];
  if (c->local_rank == 0 && c->nodes > 1) { /* to name them when the leaders' exchange waits too long */
    c->leader_ranks = (int *)calloc((size_t)c->nodes, sizeof *c->leader_ranks);
    if (!c->leader_ranks) {
      st = MF_ERR(MF_ERR_OUT_OF_MEMORY, "comm: out of memory");
      goto fail;
    }
    TRY(MPI_Allgather(&c->rank, 1, MPI_INT, c->leader_ranks, 1, MPI_INT, c->leaders));
  }
#undef TRY
  /* The node's board: each rank's slot says who it is; the node barrier
   * after the writes shows them to the others. */
  st = mf_comm_shared_alloc(c, (size_t)c->local_size * sizeof(mf_comm_slot), "the node's board",
                            &c->board_mem);
  if (st != MF_OK) goto fail;
  c->board = (mf_comm_slot *)mf_comm_shared_ptr(c->board_mem);
  c->board[c->local_rank].rank = c->rank;
  c->board[c->local_rank].pid = (int64_t)getpid();
  st = mf_comm_node_barrier(c);
  if (st != MF_OK) goto fail;
  *out = c;
  return MF_OK;
fail:
  mf_comm_free(c);
  return st;
}

void mf_comm_free(mf_comm *c) {
  if (!c) return;
  int fin = 0, late_done = c->late_rq == MPI_REQUEST_NULL;
  if (c->mpi) MPI_Finalized(&fin);
  if (c->mpi && !fin) {
    /* MPI_Finalize waits for every rank, without end: the ranks meet first,
     * with the deadline, unless each has said it failed (all are here). A
     * rank that does not come ends the job. */
    if (c->we_init && c->size > 1 && !c->all_failed && c->world != MPI_COMM_NULL &&
        mf_comm_barrier(c) != MF_OK) {
      MF_LOGE("comm", "rank %d of %d: %s", c->rank, c->size, mf_last_error());
      mf_comm_abort(c, 1);
    }
    /* Completed when every rank joined them late; else left to MPI. */
    if (!late_done) MPI_Test(&c->late_rq, &late_done, MPI_STATUS_IGNORE);
    if (c->fail_rq != MPI_REQUEST_NULL) {
      int done = 0;
      MPI_Test(&c->fail_rq, &done, MPI_STATUS_IGNORE);
    }
    mf_comm_shared_free(c->board_mem);
    c->board = NULL;
    if (c->fails != MPI_COMM_NULL) MPI_Comm_free(&c->fails);
    if (c->leaders != MPI_COMM_NULL) MPI_Comm_free(&c->leaders);
    if (c->node_comm != MPI_COMM_NULL) MPI_Comm_free(&c->node_comm);
    if (c->world != MPI_COMM_NULL) MPI_Comm_free(&c->world);
    if (c->we_init) {
      MPI_Finalize();
      late_done = 1;
    }
  } else {
    mf_comm_shared_free(c->board_mem); /* without MPI: this process's own pages */
  }
  free(c->scratch);
  free(c->stage);
  if (late_done) free(c->parts_rq); /* else MPI may still hold requests of it */
  free(c->parts_due);
  if (late_done) free(c->late_buf); /* else MPI may still write into it: left to the process's end */
  free(c->leader_ranks);
  free(c->fail_every); /* MPI is finalized (or never wrote to it) */
  free(c);
}

int mf_comm_rank(const mf_comm *c) {
  return c->rank;
}
int mf_comm_size(const mf_comm *c) {
  return c->size;
}
int mf_comm_local_rank(const mf_comm *c) {
  return c->local_rank;
}
int mf_comm_local_size(const mf_comm *c) {
  return c->local_size;
}
int mf_comm_uses_mpi(const mf_comm *c) {
  return c->mpi;
}

mf_status mf_comm_barrier(mf_comm *c) {
  if (!c->mpi || c->size == 1) return MF_OK;
  int64_t ticket = 0;
  MF_CHECK(mf_comm_enter(c, MF_COMM_WORLD, &ticket));
  MPI_Request rq;
  MF_MPI_CHECK(MPI_Ibarrier(c->world, &rq));
  return mf_comm_finish(c, &rq, MF_COMM_WORLD, ticket, 0, MF_COMM_NO_BUFFER, "at a barrier of every rank");
}

mf_status mf_comm_barrier_solo(mf_comm *c, int root, const char *what) {
  c->solo = 1;
  c->solo_root = root;
  c->solo_what = what;
  const mf_status st = mf_comm_barrier(c);
  c->solo = 0;
  return st;
}

mf_status mf_comm_bcast_staged(mf_comm *c, MPI_Comm comm, mf_comm_scope scope, int me, int root, void *buf,
                               size_t bytes, const char *where) {
  const size_t piece = bytes < MF_STAGE_PIECE ? bytes : MF_STAGE_PIECE;
  MF_CHECK(mf_comm_stage_reserve(c, piece));
  for (size_t off = 0; off < bytes; off += piece) {
    const size_t n = bytes - off < piece ? bytes - off : piece;
    if (me == root) memcpy(c->stage, (char *)buf + off, n);
    int64_t ticket = 0;
    MF_CHECK(mf_comm_enter(c, scope, &ticket));
    MPI_Request rq;
    MF_MPI_CHECK(MPI_Ibcast(c->stage, (int)n, MPI_BYTE, root, comm, &rq));
    MF_CHECK(mf_comm_finish(c, &rq, scope, ticket, n > MF_HEAVY_BYTES, MF_COMM_STAGE, where));
    if (me != root) memcpy((char *)buf + off, c->stage, n);
  }
  return MF_OK;
}

mf_status mf_comm_broadcast(mf_comm *c, void *buf, size_t bytes, int root) {
  if (root < 0 || root >= c->size)
    return MF_ERR(MF_ERR_INVALID_ARG, "comm: broadcast root %d of %d ranks", root, c->size);
  if (!c->mpi || c->size == 1) return MF_OK;
  char where[64];
  snprintf(where, sizeof where, "in a broadcast from rank %d", root);
  return mf_comm_bcast_staged(c, c->world, MF_COMM_WORLD, c->rank, root, buf, bytes, where);
}

mf_status mf_comm_scratch_reserve(mf_comm *c, size_t n) {
  if (c->scratch_n >= n) return MF_OK;
  float *s = (float *)realloc(c->scratch, n * sizeof(float));
  if (!s) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "comm: out of memory for a gather buffer of %zu floats", n);
  c->scratch = s;
  c->scratch_n = n;
  return MF_OK;
}

mf_status mf_comm_ordered_sum_f32(mf_comm *c, MPI_Comm comm, mf_comm_scope scope, int me, int size,
                                  size_t gather_bytes, float *buf, size_t n, const char *where) {
  /* Gather every member's vector (in chunks) and add in member order
   * everywhere, so all hold the same bits whatever algorithm MPI would pick. */
  size_t chunk = gather_bytes / sizeof(float) / (size_t)size;
  if (chunk == 0) chunk = 1;
  MF_CHECK(mf_comm_scratch_reserve(c, (n < chunk ? n : chunk) * (size_t)size));
  for (size_t off = 0; off < n; off += chunk) {
    size_t m = n - off < chunk ? n - off : chunk;
    int64_t ticket = 0;
    MF_CHECK(mf_comm_enter(c, scope, &ticket));
    memcpy(c->scratch + (size_t)me * m, buf + off, m * sizeof(float));
    MPI_Request rq;
    MF_MPI_CHECK(
        MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, c->scratch, (int)m, MPI_FLOAT, comm, &rq));
    MF_CHECK(mf_comm_finish(c, &rq, scope, ticket, 1, MF_COMM_SCRATCH, where));
    for (size_t i = 0; i < m; i++) {
      float s = c->scratch[i];
      for (int r = 1; r < size; r++) s += c->scratch[(size_t)r * m + i];
      buf[off + i] = s;
    }
  }
  return MF_OK;
}

mf_status mf_comm_allreduce_sum_f32(mf_comm *c, float *buf, size_t n) {
  if (!c->mpi || c->size == 1 || n == 0) return MF_OK;
  return mf_comm_ordered_sum_f32(c, c->world, MF_COMM_WORLD, c->rank, c->size, MF_MPI_CHUNK, buf, n,
                                 "in a sum over every rank");
}

/* In-place op over every rank of n integers, through the stage. */
static mf_status allreduce_i64(mf_comm *c, int64_t *buf, size_t n, MPI_Op op, const char *what) {
  if (!c->mpi || c->size == 1 || n == 0) return MF_OK;
  if (n > INT_MAX)
    return MF_ERR(MF_ERR_INVALID_ARG, "comm: %s-allreduce of %zu integers is too large", what, n);
  MF_CHECK(mf_comm_stage_reserve(c, n * sizeof(int64_t)));
  memcpy(c->stage, buf, n * sizeof(int64_t));
  int64_t ticket = 0;
  MF_CHECK(mf_comm_enter(c, MF_COMM_WORLD, &ticket));
  MPI_Request rq;
  MF_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, c->stage, (int)n, MPI_INT64_T, op, c->world, &rq));
  char where[64];
  snprintf(where, sizeof where, "in a %s over every rank", what);
  MF_CHECK(mf_comm_finish(c, &rq, MF_COMM_WORLD, ticket, n * sizeof(int64_t) > MF_HEAVY_BYTES, MF_COMM_STAGE,
                          where));
  memcpy(buf, c->stage, n * sizeof(int64_t));
  return MF_OK;
}

mf_status mf_comm_allreduce_max_i64(mf_comm *c, int64_t *buf, size_t n) {
  return allreduce_i64(c, buf, n, MPI_MAX, "max");
}

mf_status mf_comm_allreduce_sum_i64(mf_comm *c, int64_t *buf, size_t n) {
  return allreduce_i64(c, buf, n, MPI_SUM, "sum");
}

mf_status mf_comm_allreduce_sum_f64(mf_comm *c, double *buf, size_t n) {
  if (!c->mpi || c->size == 1 || n == 0) return MF_OK;
  if (n > INT_MAX / (size_t)c->size)
    return MF_ERR(MF_ERR_INVALID_ARG,
                  "comm: f64 sum-allreduce of %zu values is too large (it is for short vectors)", n);
  /* Gathered and added in rank order, like the f32 sum (through the stage:
   * the few values, losses and norms, this is for). */
  MF_CHECK(mf_comm_stage_reserve(c, n * (size_t)c->size * sizeof(double)));
  memcpy((double *)c->stage + (size_t)c->rank * n, buf, n * sizeof(double));
  int64_t ticket = 0;
  MF_CHECK(mf_comm_enter(c, MF_COMM_WORLD, &ticket));
  MPI_Request rq;
  MF_MPI_CHECK(
      MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, c->stage, (int)n, MPI_DOUBLE, c->world, &rq));
  MF_CHECK(mf_comm_finish(c, &rq, MF_COMM_WORLD, ticket, 0, MF_COMM_STAGE, "in a sum over every rank"));
  const double *all = (const double *)c->stage;
  for (size_t i = 0; i < n; i++) {
    double s = all[i];
    for (int r = 1; r < c->size; r++) s += all[(size_t)r * n + i];
    buf[i] = s;
  }
  return MF_OK;
}

/* A part's pieces for MPI (int counts): MF_MPI_CHUNK bytes each, the last shorter. */
static size_t pieces_of(size_t bytes) {
  return (bytes + MF_MPI_CHUNK - 1) / MF_MPI_CHUNK;
}

/* With one rank: each receive is the next send of the same bytes. */
static mf_status exchange_self(const mf_comm_part *sends, int n_send, const mf_comm_part *recvs, int n_recv) {
  int j = 0;
  for (int i = 0; i < n_recv; i++) {
    if (!recvs[i].bytes) continue;
    while (j < n_send && !sends[j].bytes) j++;
    if (j == n_send || sends[j].bytes != recvs[i].bytes)
      return MF_ERR(MF_ERR_MPI, "comm: exchange: receive %d of %zu bytes matches no send of its size", i,
                    recvs[i].bytes);
    memmove(recvs[i].ptr, sends[j++].ptr, recvs[i].bytes);
  }
  return MF_OK;
}

#define MF_COMM_TAG_PARTS 41

mf_status mf_comm_exchange(mf_comm *c, const mf_comm_part *sends, int n_send, const mf_comm_part *recvs,
                           int n_recv) {
  const int P = c->mpi ? c->size : 1;
  size_t n_req = 0, bytes = 0;
  for (int k = 0; k < n_send + n_recv; k++) {
    const mf_comm_part *q = k < n_send ? &sends[k] : &recvs[k - n_send];
    if (q->peer < 0 || q->peer >= P)
      return MF_ERR(MF_ERR_INVALID_ARG, "comm: exchange: %s %d names rank %d of %d",
                    k < n_send ? "send" : "receive", k < n_send ? k : k - n_send, q->peer, P);
    n_req += pieces_of(q->bytes);
    bytes += q->bytes;
  }
  if (P == 1) return exchange_self(sends, n_send, recvs, n_recv);
  if (n_req > c->parts_n) { /* grows once to an exchange's size (outside the steps after the first) */
    MPI_Request *r = (MPI_Request *)realloc(c->parts_rq, n_req * sizeof *r);
    if (r) c->parts_rq = r;
    int *d = r ? (int *)realloc(c->parts_due, n_req * sizeof *d) : NULL;
    if (d) c->parts_due = d;
    if (!r || !d) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "comm: out of memory for %zu requests", n_req);
    c->parts_n = n_req;
  }
  int64_t ticket = 0;
  MF_CHECK(mf_comm_enter(c, MF_COMM_WORLD, &ticket));
  /* The receives first, then the sends; the pieces of each part in order (MPI keeps a pair's order). */
  size_t at = 0;
  for (int k = 0; k < n_recv + n_send; k++) {
    const int recv = k < n_recv;
    const mf_comm_part *q = recv ? &recvs[k] : &sends[k - n_recv];
    for (size_t o = 0; o < q->bytes; o += MF_MPI_CHUNK) {
      const int n = (int)(q->bytes - o < MF_MPI_CHUNK ? q->bytes - o : MF_MPI_CHUNK);
      char *p = (char *)q->ptr + o;
      const int rc = recv ? MPI_Irecv(p, n, MPI_BYTE, q->peer, MF_COMM_TAG_PARTS, c->world, &c->parts_rq[at])
                          : MPI_Isend(p, n, MPI_BYTE, q->peer, MF_COMM_TAG_PARTS, c->world, &c->parts_rq[at]);
      if (rc != MPI_SUCCESS)
        return mf_comm_mpi_error(rc, __FILE__, __LINE__, recv ? "MPI_Irecv" : "MPI_Isend");
      c->parts_due[at++] = recv ? n : -1;
    }
  }
  /* Each piece in the order posted; a receive must get all the bytes it was posted for (a shorter
   * message would leave the rest of its rows as they were). */
  for (size_t r = 0; r < at; r++) {
    MPI_Status st;
    MF_CHECK(mf_comm_finish_status(c, &c->parts_rq[r], MF_COMM_WORLD, ticket, bytes > MF_HEAVY_BYTES,
                                   MF_COMM_NO_BUFFER, "in an exchange of rows", &st));
    int got = c->parts_due[r];
    if (got >= 0 && (MPI_Get_count(&st, MPI_BYTE, &got) != MPI_SUCCESS || got != c->parts_due[r]))
      return MF_ERR(
          MF_ERR_MPI,
          "comm: exchange: a receive got %d bytes from rank %d where %d were due: the ranks disagree "
          "on the parts",
          got, st.MPI_SOURCE, c->parts_due[r]);
  }
  return MF_OK;
}

void mf_comm_abort(mf_comm *c, int code) {
  if (!c || !c->mpi) return;
  MPI_Abort(c->world != MPI_COMM_NULL ? c->world : MPI_COMM_WORLD, code);
}

/* FNV-1a: equal messages give equal hashes; different ones almost never do. */
static uint64_t text_hash(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; s && *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

void mf_comm_fail_agree(mf_comm *c, const char *message, double seconds, int *all, int *alike, int *say) {
  *all = *alike = *say = 1;
  if (!c || !c->mpi || c->size == 1 || c->fails == MPI_COMM_NULL) return;
  *all = *alike = 0;
  if (c->fail_rq != MPI_REQUEST_NULL) { /* an earlier one timed out: still open, or done without us looking */
    int done = 0;
    if (MPI_Test(&c->fail_rq, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || !done) return;
  }
  free(c->fail_every);
  c->fail_every = (uint64_t *)calloc(2 * (size_t)c->size, sizeof *c->fail_every);
  if (!c->fail_every) return;
  c->fail_mine[0] = text_hash(message);
  c->fail_mine[1] = (uint64_t)(c->peer_failed != 0);
  if (MPI_Iallgather(c->fail_mine, 2, MPI_UINT64_T, c->fail_every, 2, MPI_UINT64_T, c->fails, &c->fail_rq) !=
      MPI_SUCCESS) {
    c->fail_rq = MPI_REQUEST_NULL;
    return;
  }
  /* Polled, not waited for: a rank that did not fail never joins. */
  mf_comm_poll p;
  mf_comm_poll_start(&p, seconds > 0 ? seconds : 0, 0);
  int done = 0;
  for (;;) {
    if (MPI_Test(&c->fail_rq, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return;
    if (done || !mf_comm_poll_next(&p)) break;
  }
  if (!done) return;
  /* Every rank failed. Alike: one message everywhere, each a fault of the
   * rank's own. Else the ranks with a fault of their own report it (the
   * others only heard of one), or every rank when none has. */
  *all = c->all_failed = 1;
  int news = 0, own = 0;
  *alike = 1;
  for (int r = 0; r < c->size; r++) {
    if (c->fail_every[2 * r] != c->fail_mine[0]) *alike = 0;
    c->fail_every[2 * r + 1] ? news++ : own++;
  }
  if (news) *alike = 0;
  *say = *alike ? c->rank == 0 : !c->fail_mine[1] || own == 0;
}
