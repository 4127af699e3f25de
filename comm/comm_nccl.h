/*
 * NCCL between the GPUs of a run's ranks (comm.h's world, one GPU a rank):
 * expert parallelism's exchanges of rows on the cuda backend
 * (src/train/ep.c). One communicator over the world, made from a unique id
 * rank 0 draws and sends over MPI; the transfers are enqueued on a stream the
 * caller gives — the backend's compute stream (kernels/backend.h
 * native_stream: a cudaStream_t), so they run in order with the kernels
 * around them; mf_nccl_wait waits for them with the comm's deadline.
 *
 * A build without the CUDA toolkit (--config=nocuda) has stand-ins that
 * return MF_ERR_UNSUPPORTED.
 */
#ifndef MF_COMM_NCCL_H
#define MF_COMM_NCCL_H

#include "comm/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mf_nccl mf_nccl;

/* Collective over the comm's world: every rank calls it with its own CUDA
 * device (the one its backend uses). MF_ERR_UNSUPPORTED without CUDA,
 * MF_ERR_MPI when NCCL fails (its words in the message). */
mf_status mf_nccl_create(mf_comm *c, int device, mf_nccl **out);
void mf_nccl_free(mf_nccl *n); /* NULL is fine */
/* "NCCL 2.28.9": the library's version, for a run's log. */
const char *mf_nccl_version(const mf_nccl *n);

/* The parts of one exchange as mf_comm_exchange takes them (comm.h), in
 * device memory: sends[0 .. n_send) and recvs[0 .. n_recv) as one NCCL group
 * on `stream` (a cudaStream_t). A rank's receives from one peer match that
 * peer's sends to it in order, one for one, of the same bytes. Enqueued, not
 * waited for: mf_nccl_wait says when it is done. */
mf_status mf_nccl_exchange(mf_nccl *n, const mf_comm_part *sends, int n_send, const mf_comm_part *recvs,
                           int n_recv, void *stream);
/* The last exchange done, with the comm's deadline (comm.h
 * mf_comm_wait_until): a caller about to wait on the exchange's stream calls
 * it first, so that a rank that stopped or hangs ends this one's wait with
 * an error (MF_ERR_MPI) instead of holding it forever; so does a fault NCCL
 * reports meanwhile. Then the communicator is aborted (its kernels return,
 * and it serves no more exchanges). OK at once with nothing pending. */
mf_status mf_nccl_wait(mf_nccl *n);

#ifdef __cplusplus
}
#endif

#endif /* MF_COMM_NCCL_H */
