/* Private to comm/: the communicator's state, shared by the world collectives
 * (comm_mpi.c), the node ones (comm_node.c), the relay (comm_relay.c) and the
 * waits with a deadline they all use (comm_wait.c). */
#ifndef MF_COMM_INTERNAL_H
#define MF_COMM_INTERNAL_H

#include <mpi.h>
#include <stdatomic.h>

#include "comm/comm.h"

/* MF_ERR_MPI for an MPI call that returned rc, with MPI's words for it. */
mf_status mf_comm_mpi_error(int rc, const char *file, int line, const char *call);

#define MF_MPI_CHECK(call)                                                                  \
  do {                                                                                      \
    int mf_rc_ = (call);                                                                    \
    if (mf_rc_ != MPI_SUCCESS) return mf_comm_mpi_error(mf_rc_, __FILE__, __LINE__, #call); \
  } while (0)

/* MPI counts are int: move large buffers in pieces. */
#define MF_MPI_CHUNK ((size_t)1 << 30)

/* The node's board: a cache line a local rank in memory the node's ranks
 * share, where each says how far it has come, so a rank that waits too long
 * can name the ranks it waits for (and see a stopped one in /proc). */
typedef struct mf_comm_slot {
  _Atomic int64_t node_calls;  /* the node's collectives this rank entered (the node barrier counts them) */
  _Atomic int64_t world_calls; /* the world's collectives it entered */
  int64_t rank, pid;           /* its world rank and process id, written once at start-up */
  int64_t pad_[4];
} mf_comm_slot;

/* Whom a timed-out wait waited for: the node's ranks, the world's, the other
 * nodes' leaders. */
typedef enum { MF_COMM_NODE, MF_COMM_WORLD, MF_COMM_LEADERS } mf_comm_scope;

/* MF_COMM_TIMEOUT_S in seconds (default 600), or the default with one warning
 * per process for a value that is not a number of seconds above 0. Every
 * wait for other ranks reads it here: the comm's when it is created, a
 * relay's when the relay is. */
double mf_comm_timeout_from_env(void);

/* Waiting on something another rank does, with a deadline: spins a little
 * (the other rank is usually a moment behind), then gives the core away,
 * then sleeps (up to 1 ms a poll, 10 ms after a second), so a long wait
 * costs no CPU on a machine whose cores the ranks share. `heavy`: a wait that moves data through MPI
 * (whose progress needs this rank's polls) yields for its first second
 * before it sleeps. Time this rank itself spent stopped does not count. */
typedef struct mf_comm_poll {
  double t0, last, timeout_s; /* the wait's start (less any time this rank was stopped), the last poll */
  unsigned spins;
  long sleep_ns;
  int heavy;
} mf_comm_poll;
void mf_comm_poll_start(mf_comm_poll *p, double timeout_s, int heavy);
/* One step of backing off: 0 once the deadline has passed. */
int mf_comm_poll_next(mf_comm_poll *p);

/* "rank R (local rank L, pid P, stopped by a signal)": local rank lr of this
 * node as the board and /proc tell it. */
void mf_comm_describe_local(const mf_comm *c, int lr, char *out, size_t cap);
/* The error of a wait `where` ("at the node's barrier") that passed the
 * deadline: it names the ranks of `scope` that had not come as far as this
 * rank's call `ticket` (its count of that scope's calls), or those it waits
 * for when the board cannot tell. The comm's collectives fail from then on. */
mf_status mf_comm_timed_out(mf_comm *c, mf_comm_scope scope, int64_t ticket, const char *where,
                            const char *file, int line);
/* The comm's own memory a collective sends and receives through. */
typedef enum { MF_COMM_NO_BUFFER, MF_COMM_STAGE, MF_COMM_SCRATCH } mf_comm_buffer;
/* Waits with the deadline for `rq`, a collective of `scope` that this rank
 * entered as its call `ticket` (mf_comm_enter), through `buf`: MF_OK when it
 * completed; else the request and the buffer are left to MPI (the comm
 * grows a new one) and every later collective of this comm fails at once. */
mf_status mf_comm_finish(mf_comm *c, MPI_Request *rq, mf_comm_scope scope, int64_t ticket, int heavy,
                         mf_comm_buffer buf, const char *where);
/* The same, with the completed request's status (a receive's source and count). */
mf_status mf_comm_finish_status(mf_comm *c, MPI_Request *rq, mf_comm_scope scope, int64_t ticket, int heavy,
                                mf_comm_buffer buf, const char *where, MPI_Status *status);
/* Counts this rank's entry into a collective of `scope` on its slot and
 * returns the count (the ticket): MF_ERR_MPI instead when an earlier wait
 * timed out. */
mf_status mf_comm_enter(mf_comm *c, mf_comm_scope scope, int64_t *ticket);
/* Grows c->stage to at least `bytes`. */
mf_status mf_comm_stage_reserve(mf_comm *c, size_t bytes);

struct mf_comm {
  int rank, size, local_rank, local_size;
  int nodes, node;       /* number of nodes, this rank's node (the leader's rank among the leaders) */
  int mpi;               /* MPI is in use */
  int we_init;           /* we called MPI_Init, so we finalize */
  MPI_Comm world;        /* a dup of MPI_COMM_WORLD */
  MPI_Comm node_comm;    /* this node's ranks (MPI_COMM_NULL without MPI) */
  MPI_Comm leaders;      /* local rank 0 of every node; MPI_COMM_NULL on the other ranks */
  MPI_Comm fails;        /* another dup of MPI_COMM_WORLD, for mf_comm_fail_agree alone */
  MPI_Request fail_rq;   /* its gather when it timed out (MPI_REQUEST_NULL: none open) */
  uint64_t *fail_every;  /* that gather's buffer: {hash, news} a rank */
  uint64_t fail_mine[2]; /* and what this rank sends */
  int peer_failed;       /* a relay told this rank of another's failure (news, not a fault of its own) */
  int all_failed;        /* mf_comm_fail_agree found every rank failed: all are alive and ending */
  float *scratch;        /* allreduce gather buffer, grown when needed (outside step loops) */
  size_t scratch_n;
  void *stage; /* what the small collectives send and receive through, grown when needed */
  size_t stage_n;
  MPI_Request *parts_rq; /* mf_comm_exchange's requests, grown when needed */
  int *parts_due;        /* and the bytes each receive is due (-1: a send) */
  size_t parts_n;
  double timeout_s;                /* MF_COMM_TIMEOUT_S: the longest any wait for other ranks may take */
  mf_comm_shared *board_mem;       /* the node's board (mf_comm_slot[local_size]) */
  mf_comm_slot *board;             /* NULL before it exists (start-up) and without MPI */
  int64_t node_calls, world_calls; /* this rank's counts, as on its slot */
  int *leader_ranks;               /* on a leader: the world rank of every node's leader */
  /* After a wait timed out this rank's collectives are out of step with the
   * others' and fail at once (`late_why`, its error, says why). One of MPI's
   * that timed out cannot be cancelled: its request and the memory it may
   * still write are left to MPI. */
  MPI_Request late_rq;
  void *late_buf;
  char late_why[512];
  /* Inside mf_comm_barrier_solo: the rank working alone, and at what */
  int solo, solo_root;
  const char *solo_what;
};

/* Grows c->scratch to at least n floats (it never shrinks). */
mf_status mf_comm_scratch_reserve(mf_comm *c, size_t n);
/* In-place sum of n floats over the `size` members of comm (of `scope`; this
 * rank is member `me`), gathered in pieces of at most gather_bytes through
 * c->scratch and added in member order (the same bits everywhere). */
mf_status mf_comm_ordered_sum_f32(mf_comm *c, MPI_Comm comm, mf_comm_scope scope, int me, int size,
                                  size_t gather_bytes, float *buf, size_t n, const char *where);
/* Broadcast of `bytes` from member `root` of comm (this rank is member `me`)
 * through the comm's stage, in pieces, each waited for with the deadline. */
mf_status mf_comm_bcast_staged(mf_comm *c, MPI_Comm comm, mf_comm_scope scope, int me, int root, void *buf,
                               size_t bytes, const char *where);

#endif /* MF_COMM_INTERNAL_H */
