/*
 * One collective interface for the ranks of a run: MPI over host memory (the
 * bootstrap of every run, the reductions of data-parallel training) and the
 * memory the ranks of one machine share.
 *
 * A process started without mpirun is a world of one rank and needs no MPI
 * daemon. Collectives are blocking and called by every rank in the same order.
 *
 * No wait for other ranks lasts for ever: every collective, barrier and
 * relay wait gives up after MF_COMM_TIMEOUT_S seconds (default 600; read by
 * mf_comm_init, and by mf_comm_relay_create for its relay) and fails with
 * MF_ERR_MPI, naming the ranks it waited for — those of the node that had
 * not come (world rank, local rank, pid, and what /proc says of it: "stopped
 * by a signal" for a SIGSTOPped one), else those of the other nodes — and
 * the seconds; the caller ends the job (mf_comm_fail_agree, mf_comm_abort).
 * A stopped rank is a rank that does not come; the time a waiting rank was
 * stopped itself does not count. The deadline covers every wait, those for
 * rank 0's work alone (planning, evaluation, checkpoints) too: a run whose
 * rank 0 takes longer than that needs a larger MF_COMM_TIMEOUT_S. Waiting,
 * a rank sleeps (up to 10 ms a poll) instead of spinning on a core. After a
 * wait timed out the comm's collectives fail at once (this rank is out of
 * step with the others). The start-up's own collectives (mf_comm_init)
 * wait as MPI does.
 */
#ifndef MF_COMM_H
#define MF_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "src/core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mf_comm mf_comm;

/* Initialises MPI when this process was launched by mpirun (or MF_COMM=mpi),
 * else a single-rank world. argc/argv may be NULL. */
mf_status mf_comm_init(int *argc, char ***argv, mf_comm **out);
/* Finalizes MPI if mf_comm_init started it. NULL is fine. MPI_Finalize
 * waits for every rank without end, so the ranks meet first with the
 * deadline (unless mf_comm_fail_agree found that all failed); when one does
 * not come, this logs the error and ends the job (MPI_Abort). */
void mf_comm_free(mf_comm *c);

int mf_comm_rank(const mf_comm *c);
int mf_comm_size(const mf_comm *c);
/* Ranks on this node and this rank's index among them (for GPU selection).
 * With MF_COMM_NODE_RANKS (below) these are of the node it makes. */
int mf_comm_local_rank(const mf_comm *c);
int mf_comm_local_size(const mf_comm *c);
int mf_comm_uses_mpi(const mf_comm *c);

mf_status mf_comm_barrier(mf_comm *c);
/* A barrier of every rank while rank `root` works alone (`what`: "evaluating",
 * "writing a checkpoint", ...: said in the waiting ranks' lines). Past
 * MF_COMM_TIMEOUT_S the others keep waiting for a root on their node that is
 * alive (running, sleeping or in I/O), saying so once a timeout period; a root
 * stopped (SIGSTOP), gone, or on another node (it cannot be seen) ends the
 * wait as any other. So a long evaluation or checkpoint is not a hang, and a
 * stopped rank 0 still is. */
mf_status mf_comm_barrier_solo(mf_comm *c, int root, const char *what);
mf_status mf_comm_broadcast(mf_comm *c, void *buf, size_t bytes, int root);
/* In-place sum over ranks. The result is bit-identical on every rank and does
 * not depend on the MPI library's reduction order: rank r's contribution is
 * gathered and added in rank order. */
mf_status mf_comm_allreduce_sum_f32(mf_comm *c, float *buf, size_t n);
/* In-place max over ranks (exact, order-free): for flags and error agreement. */
mf_status mf_comm_allreduce_max_i64(mf_comm *c, int64_t *buf, size_t n);
/* In-place sum over ranks of integers (exact, order-free): counts. */
mf_status mf_comm_allreduce_sum_i64(mf_comm *c, int64_t *buf, size_t n);
/* In-place sum over ranks of doubles, added in rank order (0 + v0 + v1 + ...
 * is v0 + v1 + ..., so one rank's partial sums continued by the next give the
 * bits of one rank adding them all): losses. For short vectors. */
mf_status mf_comm_allreduce_sum_f64(mf_comm *c, double *buf, size_t n);

/* One transfer of a point-to-point exchange: `bytes` at ptr, to or from rank
 * `peer`. */
typedef struct mf_comm_part {
  void *ptr;
  size_t bytes;
  int peer;
} mf_comm_part;
/* A point-to-point exchange (expert parallelism's rows) between host buffers:
 * sends[0 .. n_send) and recvs[0 .. n_recv) all at once, then waited for with
 * the deadline. A rank's receives from one peer match that peer's sends to it
 * in order, one for one, of the same bytes (else MF_ERR_MPI); a part of 0
 * bytes moves nothing (both sides know the sizes). A part may be this rank's
 * own (peer = this rank). Every rank calls it as often as the others (the
 * ranks it names together; counted as a collective of the world, so the
 * deadline names the ranks that did not come). MF_ERR_INVALID_ARG for a
 * peer outside the world; with one rank, the parts are copied in order. After
 * a timeout MPI may still write into the receives (the job ends then). */
mf_status mf_comm_exchange(mf_comm *c, const mf_comm_part *sends, int n_send, const mf_comm_part *recvs,
                           int n_recv);

/* Waits with the comm's deadline (MF_COMM_TIMEOUT_S) for work another rank
 * holds up that is not an MPI request — NCCL's transfers on a GPU stream
 * (comm_nccl.h): polls done(ctx, &st) until it returns nonzero, then
 * returns st (OK unless done set a fault); it backs off as every wait here
 * does, yielding the core (not sleeping) for its first second.
 * Past the deadline MF_ERR_MPI "comm: waited N s for `what`: another rank
 * stopped or hangs (MF_COMM_TIMEOUT_S)"; time this process spent stopped
 * does not count. */
mf_status mf_comm_wait_until(mf_comm *c, int (*done)(void *ctx, mf_status *st), void *ctx, const char *what);

/* Ends every rank of the job at once (MPI_Abort) with `code`; without MPI,
 * returns (the caller exits). For a rank that failed while others may wait
 * for it in a collective. */
void mf_comm_abort(mf_comm *c, int code);

/* After this rank failed with `message` (e.g. mf_last_error()), while the
 * others may be anywhere — failing the same way at the same place (a bad data
 * file every rank opens), or waiting for this rank in a collective: waits up
 * to `seconds` for every rank to say that it failed too (a non-blocking
 * gather on a communicator of its own, which nothing else uses). *all: every
 * rank failed, so each may end normally instead of the job being aborted.
 * Then *alike: all with the same message (compared by a hash), each a fault
 * of its own; *say: this rank reports its message — rank 0 alone when alike,
 * else each rank with a fault of its own, not one whose relay (not freed
 * since) only brought news of another rank's failure (mf_comm_relay_wait's
 * "another rank of this node failed"), or every rank when
 * all have only news. Without MPI, or with one rank, all three are 1 at
 * once. When *all is 0 (*alike 0, *say 1) the gather stays open and the
 * caller ends the job (mf_comm_abort); a later call on this rank finds it
 * open and gives the same at once. Every failing rank calls it. */
void mf_comm_fail_agree(mf_comm *c, const char *message, double seconds, int *all, int *alike, int *say);

/* ------------------------------------------------------------------ nodes
 *
 * The ranks of one machine form a node: they share host memory (one copy of
 * the model's host state, mf_comm_shared_alloc) and order their work on it
 * among themselves (mf_comm_relay); rank order within a node is world rank
 * order. The lowest rank of each node is its leader; the leaders, in node
 * order, reduce across nodes. MF_COMM_NODE_RANKS=K splits a machine's ranks
 * into nodes of K consecutive ranks (testing the paths between nodes on one
 * machine); unset, a node is every rank MPI finds on the machine. */

int mf_comm_nodes(const mf_comm *c);     /* number of nodes */
int mf_comm_node(const mf_comm *c);      /* this rank's node, 0 .. nodes-1 */
int mf_comm_is_leader(const mf_comm *c); /* local rank 0 */

mf_status mf_comm_node_barrier(mf_comm *c);
/* In-place sum over the node leaders of n floats, added in node order (the
 * same bits on every leader); called by the leaders only (another rank gets
 * MF_ERR_INVALID_ARG), nothing with one node. Moves the vector in pieces
 * through a gather buffer of at most 64 MiB on each node (every node's piece
 * together), however large n is. */
mf_status mf_comm_leaders_allreduce_sum_f32(mf_comm *c, float *buf, size_t n);
/* Sends n bytes from the leader (local rank 0) to the node's other ranks. */
mf_status mf_comm_node_broadcast(mf_comm *c, void *buf, size_t bytes);

/* Memory every rank of the node maps (MPI-3 shared window on the node's
 * communicator; one process: anonymous memory), zeroed. Collective over the
 * node: every local rank calls it with the same bytes. `what` names it in
 * errors. The pages are counted once for the node whatever the number of
 * ranks (in /proc's Pss each rank is charged its share). A warning says so
 * when MPI put the window in a file on disk instead of tmpfs. */
typedef struct mf_comm_shared mf_comm_shared;
mf_status mf_comm_shared_alloc(mf_comm *c, size_t bytes, const char *what, mf_comm_shared **out);
void *mf_comm_shared_ptr(const mf_comm_shared *s); /* NULL when bytes was 0 */
/* Collective over the node; NULL is fine. When a rank of the node does not
 * come within the deadline the window is left to MPI (and the comm's next
 * collective fails). */
void mf_comm_shared_free(mf_comm_shared *s);
/* After a failure, when the node's other ranks may never come to free it
 * with this one: lets go of this process's handle without the collective
 * (an MPI window stays to MPI and the process's end). NULL is fine. */
void mf_comm_shared_forget(mf_comm_shared *s);

/* An ordered hand-off among the node's ranks over n items (each item, e.g. a
 * parameter's gradient sum in shared memory, is worked on by local rank 0,
 * then 1, ...): in round `round` (>= 0 and > every earlier round; e.g. the
 * step), a rank calls mf_comm_relay_wait(item) before its work on the item
 * and mf_comm_relay_pass(item) after it. Local rank 0 never waits (its wait
 * returns at once, MF_ERR_MPI after a mf_comm_relay_fail). Between rounds
 * the caller separates the ranks (a barrier), so no rank starts round k + 1
 * while another is still in round k. pass may be called from any thread.
 * wait returns MF_ERR_MPI when the rank before has not passed within the
 * timeout (MF_COMM_TIMEOUT_S, read when the relay is created; default 600 s:
 * it stopped or hangs; the error names it), or at once when a rank of the
 * node called mf_comm_relay_fail. Collective to create and free. */
typedef struct mf_comm_relay mf_comm_relay;
mf_status mf_comm_relay_create(mf_comm *c, int64_t n_items, mf_comm_relay **out);
/* As mf_comm_relay_create, in an order of the caller's: this rank works on
 * items at `place` of `places` (place 0 never waits), after the rank at
 * place - 1, which is local rank `before` (named when a wait times out). The
 * ranks that work on one item must hold places 0, 1, ... of it without a
 * gap; a rank may leave an item alone (it neither waits for nor passes it).
 * Every local rank calls it (the memory is the node's). MF_ERR_INVALID_ARG
 * for a place outside [0, places) or a `before` outside the node. For expert
 * parallelism beside data parallelism, where an expert's owner in group g
 * adds after its owner in group g - 1 (src/train/ranks.c). */
mf_status mf_comm_relay_create_at(mf_comm *c, int64_t n_items, int place, int places, int before,
                                  mf_comm_relay **out);
void mf_comm_relay_free(mf_comm_relay *r); /* NULL is fine */
/* As mf_comm_shared_forget, for a relay (its news of a failure stays with
 * the communicator, for mf_comm_fail_agree). */
void mf_comm_relay_forget(mf_comm_relay *r);
void mf_comm_relay_begin(mf_comm_relay *r, int64_t round);
mf_status mf_comm_relay_wait(mf_comm_relay *r, int64_t item);
void mf_comm_relay_pass(mf_comm_relay *r, int64_t item);
void mf_comm_relay_fail(mf_comm_relay *r);

#ifdef __cplusplus
}
#endif

#endif /* MF_COMM_H */
