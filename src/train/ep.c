/* Expert parallelism's exchanges (train_internal.h mf_ep; the program's
 * EP_DISPATCH and EP_COMBINE, kernels/backend.h) over the ranks' comm.
 *
 * Rank r of ep owns experts [r El, (r + 1) El), El = E / ep. A micro-batch's
 * expert-sorted rows are contiguous by expert, so the rows for rank d are one
 * run, loffs[d El] .. loffs[(d + 1) El]: the dispatch sends them as they lie,
 * after an all-to-all of the El counts each rank sends each other rank, and
 * receives source-major (source 0's rows for each of this rank's experts,
 * then source 1's, ...) into a scratch that it lays out expert-major into y:
 * for expert j, source 0's rows, then source 1's. The combine sends each
 * source its rows back in the order it sent them, so they land straight in
 * x at the source's own loffs. On the cpu backend the device arena is host
 * memory and the rows move through MPI as they are. */
#include <stdlib.h>
#include <string.h>

#include "src/train/train_internal.h"

void mf_ep_free(mf_ep *e) {
  if (!e) return;
  free(e->scratch);
  free(e->cnt_send);
  free(e->cnt_recv);
  free(e->send_n);
  free(e->recv_n);
  memset(e, 0, sizeof *e);
}

mf_status mf_ep_init(mf_ep *e, mf_comm *comm, const mf_program *p) {
  memset(e, 0, sizeof *e);
  e->comm = comm;
  e->ep = p->ep;
  e->rank = p->ep_rank;
  e->E = p->spec.experts;
  if (e->ep != mf_comm_size(comm) || e->rank != mf_comm_rank(comm))
    return MF_ERR(MF_ERR_INTERNAL, "expert parallelism: rank %lld of %lld in a world of %d (this rank %d)",
                  (long long)e->rank, (long long)e->ep, mf_comm_size(comm), mf_comm_rank(comm));
  /* The scratch holds the most rows an exchange receives (dispatch) or sends (combine). */
  size_t most = 0;
  for (int32_t k = 0; k < p->n_ops; k++) {
    const mf_pop *o = &p->ops[k];
    if (!mf_kernel_is_exchange(o->kind)) continue;
    const int32_t y = o->t[o->kind == MF_K_EP_DISPATCH ? 2 : 0];
    if (p->tensors[y].bytes > most) most = p->tensors[y].bytes;
  }
  const size_t n = (size_t)e->ep;
  MF_CHECK(mf_calloc(most ? most : 1, 1, "the expert exchange's rows", (void **)&e->scratch));
  e->scratch_bytes = most;
  MF_CHECK(mf_calloc((size_t)e->E, sizeof(int64_t), "the expert exchange's counts", (void **)&e->cnt_send));
  MF_CHECK(mf_calloc((size_t)e->E, sizeof(int64_t), "the expert exchange's counts", (void **)&e->cnt_recv));
  MF_CHECK(mf_calloc(n, sizeof(int64_t), "the expert exchange's counts", (void **)&e->send_n));
  MF_CHECK(mf_calloc(n, sizeof(int64_t), "the expert exchange's counts", (void **)&e->recv_n));
  return MF_OK;
}

/* The call's sizes against this exchange's, and its row size in bytes. */
static mf_status check_call(const mf_ep *e, const mf_kernel_call *k, size_t *row) {
  const mf_dtype dt = k->b[0].dtype != MF_DTYPE_INVALID ? k->b[0].dtype : MF_DTYPE_F32;
  if (k->i[0] != e->E || k->i[1] != e->ep || k->i[3] != e->rank || k->i[2] < 1)
    return MF_ERR(MF_ERR_INTERNAL,
                  "%s: E %lld, ep %lld, rank %lld, C %lld in an exchange of E %lld, ep %lld, rank %lld",
                  k->label ? k->label : mf_kernel_name(k->kind), (long long)k->i[0], (long long)k->i[1],
                  (long long)k->i[3], (long long)k->i[2], (long long)e->E, (long long)e->ep,
                  (long long)e->rank);
  *row = (size_t)k->i[2] * mf_dtype_size(dt);
  return MF_OK;
}

/* loffs [E + 1]: the local rows by expert, within `rows`. */
static mf_status check_local(const mf_kernel_call *k, const int64_t *loffs, int64_t E, int64_t rows) {
  for (int64_t x = 0; x < E; x++)
    if (loffs[x + 1] < loffs[x])
      return MF_ERR(MF_ERR_INTERNAL, "%s: expert offsets go back at expert %lld", k->label, (long long)x);
  if (loffs[0] != 0 || loffs[E] > rows)
    return MF_ERR(MF_ERR_INTERNAL, "%s: expert offsets [%lld, %lld] outside %lld rows", k->label,
                  (long long)loffs[0], (long long)loffs[E], (long long)rows);
  return MF_OK;
}

static mf_status dispatch(mf_ep *e, const mf_kernel_call *k) {
  size_t row = 0;
  MF_CHECK(check_call(e, k, &row));
  const int64_t E = e->E, P = e->ep, El = E / P, me = e->rank;
  const int64_t *loffs = (const int64_t *)k->b[1].ptr;
  MF_CHECK(check_local(k, loffs, E, (int64_t)(k->b[0].bytes / row)));
  for (int64_t x = 0; x < E; x++) e->cnt_send[x] = loffs[x + 1] - loffs[x];
  for (int64_t d = 0; d < P; d++) e->send_n[d] = loffs[(d + 1) * El] - loffs[d * El];
  /* cnt_recv[s El + j]: the rows source s sends this rank's expert j */
  MF_CHECK(mf_comm_alltoall_i64(e->comm, e->cnt_send, e->cnt_recv, (size_t)El));
  int64_t total = 0;
  for (int64_t s = 0; s < P; s++) {
    e->recv_n[s] = 0;
    for (int64_t j = 0; j < El; j++) {
      if (e->cnt_recv[s * El + j] < 0)
        return MF_ERR(MF_ERR_MPI, "%s: rank %lld sends %lld rows to expert %lld", k->label, (long long)s,
                      (long long)e->cnt_recv[s * El + j], (long long)(me * El + j));
      e->recv_n[s] += e->cnt_recv[s * El + j];
    }
    total += e->recv_n[s];
  }
  const int64_t cap = (int64_t)(k->b[2].bytes / row);
  if (total > cap || (size_t)total * row > e->scratch_bytes)
    return MF_ERR(MF_ERR_INTERNAL, "%s: %lld rows arrive for %lld places", k->label, (long long)total,
                  (long long)cap);
  MF_CHECK(mf_comm_alltoallv(e->comm, k->b[0].ptr, e->send_n, e->scratch, e->recv_n, row));
  /* Source-major in the scratch, expert-major into y; the layout around it. */
  int64_t *offs = (int64_t *)k->b[3].ptr, *seg = (int64_t *)k->b[4].ptr;
  int64_t *counts = k->b[5].ptr ? (int64_t *)k->b[5].ptr : NULL;
  uint8_t *y = (uint8_t *)k->b[2].ptr;
  int64_t at = 0;
  for (int64_t x = 0; x < E; x++) {
    offs[x] = at;
    const int64_t j = x - me * El;
    const int mine = j >= 0 && j < El;
    for (int64_t s = 0; s < P; s++) {
      seg[x * P + s] = at;
      if (!mine) continue;
      int64_t from = 0; /* source s's rows before expert j in the scratch */
      for (int64_t q = 0; q < s; q++) from += e->recv_n[q];
      for (int64_t q = 0; q < j; q++) from += e->cnt_recv[s * El + q];
      const int64_t n = e->cnt_recv[s * El + j];
      if (n) memcpy(y + (size_t)at * row, e->scratch + (size_t)from * row, (size_t)n * row);
      at += n;
    }
    if (counts) counts[x] = mine ? at - offs[x] : 0;
  }
  offs[E] = at;
  seg[E * P] = at;
  /* Rows past the received ones: zeros, so the ops over all rows read no stale bytes */
  if ((size_t)at * row < k->b[2].bytes) memset(y + (size_t)at * row, 0, k->b[2].bytes - (size_t)at * row);
  return MF_OK;
}

static mf_status combine(mf_ep *e, const mf_kernel_call *k) {
  size_t row = 0;
  MF_CHECK(check_call(e, k, &row));
  const int64_t E = e->E, P = e->ep, El = E / P, me = e->rank;
  const int64_t *offs = (const int64_t *)k->b[1].ptr, *seg = (const int64_t *)k->b[2].ptr;
  const int64_t *loffs = (const int64_t *)k->b[3].ptr;
  MF_CHECK(check_local(k, loffs, E, (int64_t)(k->b[4].bytes / row)));
  if (offs[E] > (int64_t)(k->b[0].bytes / row) || (size_t)offs[E] * row > e->scratch_bytes)
    return MF_ERR(MF_ERR_INTERNAL, "%s: %lld rows in %zu bytes", k->label, (long long)offs[E], k->b[0].bytes);
  /* Back to each source, in the order it sent them: its rows of expert j, for each of this rank's j. */
  const uint8_t *y = (const uint8_t *)k->b[0].ptr;
  int64_t at = 0;
  for (int64_t s = 0; s < P; s++) {
    e->send_n[s] = 0;
    for (int64_t j = 0; j < El; j++) {
      const int64_t x = me * El + j;
      const int64_t a = seg[x * P + s], n = seg[x * P + s + 1] - a;
      if (n < 0 || a < offs[x] || a + n > offs[x + 1])
        return MF_ERR(MF_ERR_INTERNAL, "%s: expert %lld's part from rank %lld lies outside its rows",
                      k->label, (long long)x, (long long)s);
      if (n) memcpy(e->scratch + (size_t)at * row, y + (size_t)a * row, (size_t)n * row);
      at += n;
      e->send_n[s] += n;
    }
  }
  for (int64_t d = 0; d < P; d++) e->recv_n[d] = loffs[(d + 1) * El] - loffs[d * El];
  return mf_comm_alltoallv(e->comm, e->scratch, e->send_n, k->b[4].ptr, e->recv_n, row);
}

mf_status mf_ep_run(void *ctx, const mf_kernel_call *call) {
  mf_ep *e = (mf_ep *)ctx;
  if (call->kind == MF_K_EP_DISPATCH) return dispatch(e, call);
  if (call->kind == MF_K_EP_COMBINE) return combine(e, call);
  return MF_ERR(MF_ERR_INTERNAL, "expert parallelism: %s is not an exchange", mf_kernel_name(call->kind));
}
