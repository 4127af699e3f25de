/* Private to comm/: the communicator's state, shared by the world collectives
 * (comm_mpi.c) and the node ones (comm_node.c). */
#ifndef MF_COMM_INTERNAL_H
#define MF_COMM_INTERNAL_H

#include <mpi.h>

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

struct mf_comm {
  int rank, size, local_rank, local_size;
  int nodes, node;    /* number of nodes, this rank's node (the leader's rank among the leaders) */
  int mpi;            /* MPI is in use */
  int we_init;        /* we called MPI_Init, so we finalize */
  MPI_Comm world;     /* a dup of MPI_COMM_WORLD */
  MPI_Comm node_comm; /* this node's ranks (MPI_COMM_NULL without MPI) */
  MPI_Comm leaders;   /* local rank 0 of every node; MPI_COMM_NULL on the other ranks */
  MPI_Comm fails;     /* another dup of MPI_COMM_WORLD, for mf_comm_fail_agree alone */
  MPI_Request fail_rq;  /* its gather when it timed out (MPI_REQUEST_NULL: none open) */
  uint64_t *fail_every; /* that gather's buffer: {hash, news} a rank */
  uint64_t fail_mine[2]; /* and what this rank sends */
  int peer_failed;       /* a relay told this rank of another's failure (news, not a fault of its own) */
  float *scratch;     /* allreduce gather buffer, grown when needed (outside step loops) */
  size_t scratch_n;
};

/* Grows c->scratch to at least n floats (it never shrinks). */
mf_status mf_comm_scratch_reserve(mf_comm *c, size_t n);
/* In-place sum of n floats over the `size` members of comm, gathered in
 * pieces of at most gather_bytes and added in member order (the same bits
 * everywhere). */
mf_status mf_comm_ordered_sum_f32(mf_comm *c, MPI_Comm comm, int size, size_t gather_bytes, float *buf,
                                  size_t n);

#endif /* MF_COMM_INTERNAL_H */
