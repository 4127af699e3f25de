/* Expert parallelism's exchanges (train_internal.h mf_ep; the program's
 * EP_DISPATCH and EP_COMBINE, kernels/backend.h) between the ranks.
 *
 * Rank r of ep owns experts [r El, (r + 1) El), El = E / ep; with more ranks
 * than ep, each group of ep consecutive ranks (world ranks base .. base +
 * ep - 1) exchanges among itself. A micro-batch's
 * rows are sorted by expert (local offsets loffs), so the rows for expert x
 * are one run, loffs[x] .. loffs[x + 1]. An exchange moves them as parts, one
 * for each (rank, expert) pair: the dispatch sends the run of expert x to x's
 * rank, for x = 0 .. E - 1 (to each rank its experts in order), and each rank
 * receives them straight into their places in y, expert-major and inside an
 * expert by source rank; the combine sends each part back where it came from
 * (a rank's parts for each source, expert by expert), and they land at the
 * source's own loffs. Between one pair of ranks the parts go in expert order
 * both ways, which is how each side matches its receives to the other's
 * sends. The sizes both sides agree on come from the counts: the local
 * offsets brought to the host, and an all-to-all in the group of each rank's
 * counts for each other rank's experts (MPI, on the host).
 *
 * The parts travel over MPI between host buffers — the cpu backend, whose
 * device arena is host memory (mf_comm_exchange) — or with NCCL between
 * GPUs, enqueued on the backend's compute stream (comm/comm_nccl.h; the
 * layout arrays go up by the stream's copies before them). The same code
 * lays out both, so what CI runs on the cpu backend is what a GPU runs but
 * the transfer. */
#include <stdlib.h>
#include <string.h>

#include "src/train/train_internal.h"

void mf_ep_free(mf_ep *e) {
  if (!e) return;
  mf_nccl_free(e->nccl);
  if (e->b)
    for (int k = 0; k < 6; k++)
      if (e->host[k]) e->b->host_free(e->b, e->host[k]);
  free(e->cnt_send);
  free(e->msg);
  free(e->sends);
  free(e->recvs);
  memset(e, 0, sizeof *e);
}

static mf_status init(mf_ep *e, mf_comm *comm, const mf_program *p, mf_backend *b, int device) {
  memset(e, 0, sizeof *e);
  e->comm = comm;
  e->b = b;
  e->ep = p->ep;
  e->rank = p->ep_rank;
  e->E = p->spec.experts;
  if (mf_comm_size(comm) % e->ep || e->rank != mf_comm_rank(comm) % e->ep)
    return MF_ERR(MF_ERR_INTERNAL, "expert parallelism: rank %lld of %lld in a world of %d (this rank %d)",
                  (long long)e->rank, (long long)e->ep, mf_comm_size(comm), mf_comm_rank(comm));
  e->base = mf_comm_rank(comm) - e->rank;
  const size_t E = (size_t)e->E, P = (size_t)e->ep;
  /* Host arrays the layout is made in: the local offsets, the received offsets and parts, the counts,
   * the parts' first rows in their sources and the sources' dropout seeds. */
  const size_t n[6] = {E + 1, E + 1, E * P + 1, E, E * P, P};
  for (int k = 0; k < 6; k++) {
    void *h = NULL;
    MF_CHECK(b->host_alloc(b, n[k] * sizeof(int64_t), &h));
    e->host[k] = (int64_t *)h;
  }
  e->loffs = e->host[0], e->offs = e->host[1], e->seg = e->host[2], e->counts = e->host[3];
  e->starts = e->host[4], e->seeds = e->host[5];
  MF_CHECK(mf_calloc(E, sizeof(int64_t), "the expert exchange's counts", (void **)&e->cnt_send));
  /* what a rank tells each other of its rows for that rank's El experts: counts, first rows, its seed */
  MF_CHECK(mf_calloc(2 * (2 * E + P), sizeof(int64_t), "the expert exchange's counts", (void **)&e->msg));
  MF_CHECK(mf_calloc(E, sizeof(mf_comm_part), "the expert exchange's parts", (void **)&e->sends));
  MF_CHECK(mf_calloc(E, sizeof(mf_comm_part), "the expert exchange's parts", (void **)&e->recvs));
  if (b->native_stream) MF_CHECK(mf_nccl_create(comm, device, &e->nccl)); /* rows between GPUs */
  return MF_OK;
}

static mf_status run_exchange(void *ctx, const mf_kernel_call *call, mf_backend *b, mf_stream *s);

/* mf_exec_exchange.wait: NCCL's transfers, with the deadline (MPI's are done when run_exchange returns). */
static mf_status wait_exchanges(void *ctx) {
  return mf_nccl_wait(((mf_ep *)ctx)->nccl);
}

mf_status mf_ep_attach(mf_ep *e, mf_comm *comm, const mf_program *p, mf_exec *x, mf_backend *b, int device) {
  MF_CHECK(init(e, comm, p, b, device));
  const mf_exec_exchange xc = {e, run_exchange, wait_exchanges};
  mf_exec_set_exchange(x, &xc);
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

/* offs [E + 1]: rows by expert, rising from 0, within `rows`. */
static mf_status check_offsets(const mf_kernel_call *k, const char *what, const int64_t *offs, int64_t E,
                               int64_t rows) {
  for (int64_t x = 0; x < E; x++)
    if (offs[x + 1] < offs[x])
      return MF_ERR(MF_ERR_INTERNAL, "%s: %s go back at expert %lld", k->label, what, (long long)x);
  if (offs[0] != 0 || offs[E] > rows)
    return MF_ERR(MF_ERR_INTERNAL, "%s: %s [%lld, %lld] outside %lld rows", k->label, what,
                  (long long)offs[0], (long long)offs[E], (long long)rows);
  return MF_OK;
}

/* Device to host (the cpu backend's copy is a memcpy), then waits. */
static mf_status fetch(mf_backend *b, mf_stream *s, int64_t *host, const void *dev, size_t n) {
  MF_CHECK(b->copy(b, host, dev, n * sizeof(int64_t), MF_COPY_D2H, s));
  return b->stream_sync(b, s);
}

/* The parts, over NCCL on the stream or over MPI once the stream is done. */
static mf_status transfer(mf_ep *e, mf_backend *b, mf_stream *s, int n_send, int n_recv) {
  if (e->nccl) return mf_nccl_exchange(e->nccl, e->sends, n_send, e->recvs, n_recv, b->native_stream(b, s));
  MF_CHECK(b->stream_sync(b, s));
  return mf_comm_exchange(e->comm, e->sends, n_send, e->recvs, n_recv);
}

static mf_status dispatch(mf_ep *e, const mf_kernel_call *k, mf_backend *b, mf_stream *s) {
  size_t row = 0;
  MF_CHECK(check_call(e, k, &row));
  const int64_t E = e->E, P = e->ep, El = E / P, me = e->rank;
  int64_t *loffs = e->loffs, *offs = e->offs, *seg = e->seg;
  MF_CHECK(fetch(b, s, loffs, k->b[1].ptr, (size_t)E + 1));
  MF_CHECK(check_offsets(k, "the local expert offsets", loffs, E, (int64_t)(k->b[0].bytes / row)));
  for (int64_t x = 0; x < E; x++) e->cnt_send[x] = loffs[x + 1] - loffs[x];
  /* The group's own all-to-all: to rank q, for each of its experts, the rows this rank sends it and where
   * they start in this rank's layout, then this rank's dropout seed; from q the same: in[q w + j], the
   * rows rank q sends this rank's expert j, in[q w + El + j] where they start there. */
  const int64_t w = 2 * El + 1;
  int64_t *out = e->msg, *in = e->msg + P * w;
  for (int64_t q = 0; q < P; q++) {
    for (int64_t j = 0; j < El; j++) {
      out[q * w + j] = e->cnt_send[q * El + j];
      out[q * w + El + j] = loffs[q * El + j];
    }
    out[q * w + 2 * El] = k->i[4];
    e->sends[q] = (mf_comm_part){out + q * w, (size_t)w * sizeof(int64_t), (int)(e->base + q)};
    e->recvs[q] = (mf_comm_part){in + q * w, (size_t)w * sizeof(int64_t), (int)(e->base + q)};
  }
  MF_CHECK(mf_comm_exchange(e->comm, e->sends, (int)P, e->recvs, (int)P));
  for (int64_t q = 0; q < P; q++) e->seeds[q] = in[q * w + 2 * El];
  int64_t at = 0;
  for (int64_t x = 0; x < E; x++) {
    offs[x] = at;
    const int64_t j = x - me * El;
    const int mine = j >= 0 && j < El;
    for (int64_t q = 0; q < P; q++) {
      seg[x * P + q] = at;
      e->starts[x * P + q] = mine ? in[q * w + El + j] : 0;
      const int64_t n = mine ? in[q * w + j] : 0;
      if (n < 0)
        return MF_ERR(MF_ERR_MPI, "%s: rank %lld sends %lld rows to expert %lld", k->label, (long long)q,
                      (long long)n, (long long)x);
      at += n;
    }
    e->counts[x] = at - offs[x];
  }
  offs[E] = at;
  seg[E * P] = at;
  const int64_t cap = (int64_t)(k->b[2].bytes / row);
  if (at > cap)
    return MF_ERR(MF_ERR_INTERNAL, "%s: %lld rows arrive for %lld places", k->label, (long long)at,
                  (long long)cap);
  /* Expert x's run to its rank; into this rank's experts, each source's rows in their place */
  uint8_t *x0 = (uint8_t *)k->b[0].ptr, *y = (uint8_t *)k->b[2].ptr;
  for (int64_t x = 0; x < E; x++)
    e->sends[x] =
        (mf_comm_part){x0 + (size_t)loffs[x] * row, (size_t)e->cnt_send[x] * row, (int)(e->base + x / El)};
  int nr = 0;
  for (int64_t q = 0; q < P; q++)
    for (int64_t j = 0; j < El; j++) {
      const int64_t x = me * El + j;
      e->recvs[nr++] =
          (mf_comm_part){y + (size_t)seg[x * P + q] * row, (size_t)in[q * w + j] * row, (int)(e->base + q)};
    }
  /* The layout up before the rows (the stream's order), the rows past the received ones zeroed */
  MF_CHECK(b->copy(b, k->b[3].ptr, offs, ((size_t)E + 1) * sizeof(int64_t), MF_COPY_H2D, s));
  MF_CHECK(b->copy(b, k->b[4].ptr, seg, ((size_t)(E * P) + 1) * sizeof(int64_t), MF_COPY_H2D, s));
  if (k->b[5].ptr) MF_CHECK(b->copy(b, k->b[5].ptr, e->counts, (size_t)E * sizeof(int64_t), MF_COPY_H2D, s));
  if (k->b[6].ptr)
    MF_CHECK(b->copy(b, k->b[6].ptr, e->starts, (size_t)(E * P) * sizeof(int64_t), MF_COPY_H2D, s));
  if (k->b[7].ptr) MF_CHECK(b->copy(b, k->b[7].ptr, e->seeds, (size_t)P * sizeof(int64_t), MF_COPY_H2D, s));
  if ((size_t)at * row < k->b[2].bytes) {
    mf_kernel_call z;
    memset(&z, 0, sizeof z);
    z.kind = MF_K_ZERO;
    z.b[0] = (mf_kbuf){y + (size_t)at * row, k->b[2].bytes - (size_t)at * row, 1, MF_DTYPE_INVALID};
    z.label = "the rows no rank sent";
    MF_CHECK(b->run(b, &z, s));
  }
  return transfer(e, b, s, (int)E, nr);
}

static mf_status combine(mf_ep *e, const mf_kernel_call *k, mf_backend *b, mf_stream *s) {
  size_t row = 0;
  MF_CHECK(check_call(e, k, &row));
  const int64_t E = e->E, P = e->ep, El = E / P, me = e->rank;
  int64_t *loffs = e->loffs, *offs = e->offs, *seg = e->seg;
  MF_CHECK(b->copy(b, offs, k->b[1].ptr, ((size_t)E + 1) * sizeof(int64_t), MF_COPY_D2H, s));
  MF_CHECK(b->copy(b, seg, k->b[2].ptr, ((size_t)(E * P) + 1) * sizeof(int64_t), MF_COPY_D2H, s));
  MF_CHECK(fetch(b, s, loffs, k->b[3].ptr, (size_t)E + 1));
  MF_CHECK(check_offsets(k, "the local expert offsets", loffs, E, (int64_t)(k->b[4].bytes / row)));
  MF_CHECK(check_offsets(k, "the received expert offsets", offs, E, (int64_t)(k->b[0].bytes / row)));
  /* Back to each source, expert by expert, as it sent them; from each rank its experts' rows in place */
  const uint8_t *y = (const uint8_t *)k->b[0].ptr;
  uint8_t *x0 = (uint8_t *)k->b[4].ptr;
  int ns = 0;
  for (int64_t q = 0; q < P; q++)
    for (int64_t j = 0; j < El; j++) {
      const int64_t x = me * El + j, a = seg[x * P + q], n = seg[x * P + q + 1] - a;
      if (n < 0 || a < offs[x] || a + n > offs[x + 1])
        return MF_ERR(MF_ERR_INTERNAL, "%s: expert %lld's part from rank %lld lies outside its rows",
                      k->label, (long long)x, (long long)q);
      e->sends[ns++] = (mf_comm_part){(void *)(y + (size_t)a * row), (size_t)n * row, (int)(e->base + q)};
    }
  for (int64_t x = 0; x < E; x++)
    e->recvs[x] = (mf_comm_part){x0 + (size_t)loffs[x] * row, (size_t)(loffs[x + 1] - loffs[x]) * row,
                                 (int)(e->base + x / El)};
  return transfer(e, b, s, ns, (int)E);
}

/* mf_exec_exchange.run: ctx is the mf_ep. */
static mf_status run_exchange(void *ctx, const mf_kernel_call *call, mf_backend *b, mf_stream *s) {
  mf_ep *e = (mf_ep *)ctx;
  if (call->kind == MF_K_EP_DISPATCH) return dispatch(e, call, b, s);
  if (call->kind == MF_K_EP_COMBINE) return combine(e, call, b, s);
  return MF_ERR(MF_ERR_INTERNAL, "expert parallelism: %s is not an exchange", mf_kernel_name(call->kind));
}
