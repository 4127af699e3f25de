/*
 * One collective interface for the ranks of a run. Today: MPI over host
 * memory (the cpu backend's path, and the bootstrap of every run); NCCL for
 * device buffers comes with the multi-GPU work behind the same calls.
 *
 * A process started without mpirun is a world of one rank and needs no MPI
 * daemon. Collectives are blocking and called by every rank in the same order.
 */
#ifndef MF_COMM_H
#define MF_COMM_H

#include <stddef.h>

#include "src/core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mf_comm mf_comm;

/* Initialises MPI when this process was launched by mpirun (or MF_COMM=mpi),
 * else a single-rank world. argc/argv may be NULL. */
mf_status mf_comm_init(int *argc, char ***argv, mf_comm **out);
/* Finalizes MPI if mf_comm_init started it. NULL is fine. */
void mf_comm_free(mf_comm *c);

int mf_comm_rank(const mf_comm *c);
int mf_comm_size(const mf_comm *c);
/* Ranks on this node and this rank's index among them (for GPU selection). */
int mf_comm_local_rank(const mf_comm *c);
int mf_comm_local_size(const mf_comm *c);
int mf_comm_uses_mpi(const mf_comm *c);

mf_status mf_comm_barrier(mf_comm *c);
mf_status mf_comm_broadcast(mf_comm *c, void *buf, size_t bytes, int root);
/* In-place sum over ranks. The result is bit-identical on every rank and does
 * not depend on the MPI library's reduction order: rank r's contribution is
 * gathered and added in rank order. */
mf_status mf_comm_allreduce_sum_f32(mf_comm *c, float *buf, size_t n);
/* In-place max over ranks (exact, order-free): for flags and error agreement. */
mf_status mf_comm_allreduce_max_i64(mf_comm *c, int64_t *buf, size_t n);

#ifdef __cplusplus
}
#endif

#endif /* MF_COMM_H */
