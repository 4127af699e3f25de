/* The node's relay (comm.h): one int64 counter per item in memory the node's
 * ranks share. In round r, the rank at place q of L (local rank q of the
 * node's L, or its place in a chain of its own) may work on an item once its
 * counter reaches r * L + q, and passes it on by storing r * L + q + 1.
 * Rounds only grow and the caller separates them with a barrier, so a counter
 * never goes back and a value left from an earlier round is always below what
 * any rank waits for.
 *
 * Layout of the shared memory:
 *   [0, 64)            int64 fail flag, alone on its cache line
 *   [64, 64 + 8 n)     int64 counters[n]
 */
#include <stdatomic.h>
#include <stdlib.h>

#include "comm/comm_internal.h"

/* The counters are updated by several processes: the atomics must not be a
 * lock inside one process's memory. */
_Static_assert(__atomic_always_lock_free(sizeof(int64_t), 0), "int64 atomics must be lock-free");
_Static_assert(sizeof(_Atomic int64_t) == sizeof(int64_t), "an atomic int64 must have an int64's layout");

#define RELAY_HEADER 64

struct mf_comm_relay {
  mf_comm *comm; /* told when the relay brings news of another rank's failure (mf_comm_fail_agree) */
  mf_comm_shared *mem;
  _Atomic int64_t *fail;
  _Atomic int64_t *counters;
  int64_t n, round;
  int place, places; /* this rank's place in the relay's order, and their number */
  int before;        /* the local rank at place - 1 (for messages) */
  double timeout_s;
};

mf_status mf_comm_relay_create(mf_comm *c, int64_t n_items, mf_comm_relay **out) {
  const int lr = mf_comm_local_rank(c);
  return mf_comm_relay_create_at(c, n_items, lr, mf_comm_local_size(c), lr - 1, out);
}

mf_status mf_comm_relay_create_at(mf_comm *c, int64_t n_items, int place, int places, int before,
                                  mf_comm_relay **out) {
  *out = NULL;
  if (n_items < 0 || (uint64_t)n_items > (SIZE_MAX - RELAY_HEADER) / sizeof(int64_t))
    return MF_ERR(MF_ERR_INVALID_ARG, "comm: a relay over %lld items", (long long)n_items);
  if (places < 1 || place < 0 || place >= places ||
      (place > 0 && (before < 0 || before >= mf_comm_local_size(c))))
    return MF_ERR(MF_ERR_INVALID_ARG,
                  "comm: place %d of %d in a relay (the rank before: local rank %d of %d)", place, places,
                  before, mf_comm_local_size(c));
  mf_comm_relay *r = (mf_comm_relay *)calloc(1, sizeof *r);
  if (!r) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "comm: out of memory for a relay");
  r->n = n_items;
  r->comm = c;
  r->place = place;
  r->places = places;
  r->before = before;
  r->timeout_s = mf_comm_timeout_from_env(); /* read when the relay is created */
  mf_status st = mf_comm_shared_alloc(c, RELAY_HEADER + (size_t)n_items * sizeof(int64_t),
                                      "the relay's counters", &r->mem);
  if (st != MF_OK) {
    free(r);
    mf_error_trace(__FILE__, __LINE__, "mf_comm_shared_alloc");
    return st;
  }
  /* The window starts on a page: the flag and the counters are aligned. */
  char *base = (char *)mf_comm_shared_ptr(r->mem);
  r->fail = (_Atomic int64_t *)base;
  r->counters = (_Atomic int64_t *)(base + RELAY_HEADER);
  *out = r;
  return MF_OK;
}

void mf_comm_relay_free(mf_comm_relay *r) {
  if (!r) return;
  r->comm->peer_failed = 0; /* its news of a failure goes with it */
  mf_comm_shared_free(r->mem);
  free(r);
}

void mf_comm_relay_forget(mf_comm_relay *r) {
  if (!r) return;
  mf_comm_shared_forget(r->mem);
  free(r);
}

void mf_comm_relay_begin(mf_comm_relay *r, int64_t round) {
  MF_ASSERT(round >= 0 && round <= (INT64_MAX - r->places) / r->places);
  r->round = round;
}

static mf_status relay_failed(mf_comm_relay *r, int64_t item) {
  r->comm->peer_failed = 1;
  return MF_ERR(MF_ERR_MPI,
                "comm: relay: another rank of this node failed (waiting for item %lld of round %lld)",
                (long long)item, (long long)r->round);
}

mf_status mf_comm_relay_wait(mf_comm_relay *r, int64_t item) {
  if (item < 0 || item >= r->n)
    return MF_ERR(MF_ERR_INVALID_ARG, "comm: relay item %lld of %lld", (long long)item, (long long)r->n);
  /* The first place has nobody to wait for, but it learns of a failure too. */
  if (atomic_load_explicit(r->fail, memory_order_acquire)) return relay_failed(r, item);
  if (r->place == 0) return MF_OK;
  const int64_t want = r->round * r->places + r->place;
  _Atomic int64_t *counter = &r->counters[item];
  if (atomic_load_explicit(counter, memory_order_acquire) >= want) return MF_OK;
  /* The rank before is usually a short while behind: spin first, then give
   * the core away, then sleep, so a long wait costs no CPU. */
  mf_comm_poll p;
  mf_comm_poll_start(&p, r->timeout_s, 0);
  for (;;) {
    if (atomic_load_explicit(counter, memory_order_acquire) >= want) return MF_OK;
    if (atomic_load_explicit(r->fail, memory_order_acquire)) return relay_failed(r, item);
    if (!mf_comm_poll_next(&p)) break;
  }
  char who[160];
  mf_comm_describe_local(r->comm, r->before, who, sizeof who);
  return MF_ERR(
      MF_ERR_MPI,
      "comm: waited %g s for %s to pass item %lld of round %lld: it stopped or hangs (MF_COMM_TIMEOUT_S)",
      r->timeout_s, who, (long long)item, (long long)r->round);
}

void mf_comm_relay_pass(mf_comm_relay *r, int64_t item) {
  MF_ASSERT(item >= 0 && item < r->n);
  atomic_store_explicit(&r->counters[item], r->round * r->places + r->place + 1, memory_order_release);
}

void mf_comm_relay_fail(mf_comm_relay *r) {
  atomic_store_explicit(r->fail, 1, memory_order_release);
}
