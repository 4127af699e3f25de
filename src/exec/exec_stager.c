/* Bytes streamed through staging slabs with the executor's slab code
 * (exec.h "bytes streamed through the slabs"): what `moefit bench kernels`
 * times beside a plain pinned copy.
 *
 * The stager lays out a staging layout of its own (planner/staging.h's
 * struct, filled here, not by the planner): for a move of up to max_bytes in
 * slabs of slab_bytes, m = ceil(max_bytes / slab_bytes) H2D slabs, then m
 * D2H slabs, one copy each. Slab j of a direction sits in ring place
 * j mod n (n = min(slabs, m), places of slab_bytes rounded up to 256 bytes;
 * the H2D ring first, the D2H ring after it) and waits for slab j - n, the
 * previous occupant of its bytes (wait_slab) — the order the planner's
 * layouts give slabs that share bytes. The slabs, streams, events and host
 * functions are exec_staging.c's (mf_exec_slabs_create, mf_exec_slab_*), as
 * a staged step submits them:
 *   H2D slab j  fill stream: wait for slab j - n's DMA; host: copy the
 *               pageable bytes in (MF_SG_PARTS, one part: a tensor's upload)
 *               h2d stream: wait for the fill; DMA; slab free
 *   D2H slab j  d2h stream: wait for slab j - n's copy-out; DMA
 *               drain stream: wait for the DMA; host: copy out (MF_SG_COPY)
 * A move fills in its slabs' copy sizes and host addresses (each slab has
 * its own entries, so a host function still queued reads its own), submits
 * every slab, then synchronizes the four streams.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "src/exec/exec_internal.h"

#define STAGER_ALIGN 256
#define STAGER_MAX_SLABS ((size_t)1 << 16) /* per move: events are made per slab */

struct mf_exec_stager {
  mf_backend *b;
  mf_staging L; /* its slabs, copies and waits are allocated here */
  exec_staging *g;
  mf_stream *h2d, *d2h;
  int32_t m; /* slabs per direction */
  size_t max_bytes, slab_bytes;
  int32_t last_n[2]; /* slabs of the last move [down, up] */
};

void mf_exec_stager_free(mf_exec_stager *sg) {
  if (!sg) return;
  mf_exec_slabs_free(sg->g);
  if (sg->h2d) sg->b->stream_free(sg->b, sg->h2d);
  if (sg->d2h) sg->b->stream_free(sg->b, sg->d2h);
  free(sg->L.slabs);
  free(sg->L.copies);
  free(sg->L.wait_slab);
  free(sg->L.wait_host);
  free(sg);
}

/* The layout (the top of the file): 2 m slabs of one copy each. */
static mf_status stager_layout(mf_exec_stager *sg, int slabs) {
  mf_staging *L = &sg->L;
  const int32_t m = sg->m, n = slabs < m ? slabs : m;
  const size_t stride = (sg->slab_bytes + STAGER_ALIGN - 1) / STAGER_ALIGN * STAGER_ALIGN;
  MF_CHECK(mf_calloc((size_t)(2 * m), sizeof *L->slabs, "stager slabs", (void **)&L->slabs));
  MF_CHECK(mf_calloc((size_t)(2 * m), sizeof *L->copies, "stager copies", (void **)&L->copies));
  MF_CHECK(mf_calloc((size_t)(2 * m), sizeof *L->wait_slab, "stager waits", (void **)&L->wait_slab));
  MF_CHECK(mf_calloc((size_t)(2 * m), sizeof *L->wait_host, "stager waits", (void **)&L->wait_host));
  L->opts.align = STAGER_ALIGN;
  L->opts.max_slab_bytes = sg->slab_bytes;
  L->n_slabs = L->n_copies = 2 * m;
  L->n_h2d_slabs = m;
  L->h2d_region_bytes = (size_t)n * stride;
  L->arena_bytes = 2 * L->h2d_region_bytes;
  L->largest_slab_bytes = sg->slab_bytes;
  L->max_slabs_inflight = 2 * n;
  for (int32_t k = 0; k < 2 * m; k++) {
    const int d2h = k >= m;
    const int32_t j = k - (d2h ? m : 0);
    const size_t offset = (d2h ? L->h2d_region_bytes : 0) + (size_t)(j % n) * stride;
    L->slabs[k] = (mf_staging_slab){.dir = (uint8_t)(d2h ? MF_I_D2H : MF_I_H2D),
                                    .group = -1,
                                    .first_copy = k,
                                    .n_copies = 1,
                                    .offset = offset,
                                    .bytes = sg->slab_bytes};
    L->copies[k] = (mf_staging_copy){.instr = -1, .tensor = -1, .slab = k, .offset = offset, .bytes = 0};
    L->wait_slab[k] = j >= n ? k - n : -1;
    L->wait_host[k] = -1;
  }
  return MF_OK;
}

mf_status mf_exec_stager_create(mf_backend *b, size_t max_bytes, size_t slab_bytes, int slabs,
                                const mf_exec_staging_opts *o, mf_exec_stager **out) {
  *out = NULL;
  if (!b || slab_bytes < 1 || slabs < 1 || max_bytes < 1)
    return MF_ERR(MF_ERR_INVALID_ARG,
                  "stager: %zu bytes in slabs of %zu bytes, %d in flight: nothing to stage", max_bytes,
                  slab_bytes, slabs);
  const size_t m = (max_bytes + slab_bytes - 1) / slab_bytes;
  if (m > STAGER_MAX_SLABS)
    return MF_ERR(MF_ERR_INVALID_ARG, "stager: %zu bytes in slabs of %zu bytes is %zu slabs, more than %zu",
                  max_bytes, slab_bytes, m, STAGER_MAX_SLABS);
  mf_exec_stager *sg = (mf_exec_stager *)calloc(1, sizeof *sg);
  if (!sg) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "stager: out of memory");
  sg->b = b;
  sg->m = (int32_t)m;
  sg->max_bytes = max_bytes;
  sg->slab_bytes = slab_bytes;
  mf_exec_staging_opts so = {0, 0, 0};
  if (o) so = *o;
  so.drop_waits = 0;
  mf_status st = MF_OK;
  MF_CHECK_GOTO(stager_layout(sg, slabs), st, fail);
  MF_CHECK_GOTO(b->stream_create(b, &sg->h2d), st, fail);
  MF_CHECK_GOTO(b->stream_create(b, &sg->d2h), st, fail);
  /* the host functions timed (mf_exec_stager_host_seconds) where the backend has timed events */
  MF_CHECK_GOTO(mf_exec_slabs_create(b, &sg->L, &so, b->event_create_timed && b->event_elapsed, &sg->g), st,
                fail);
  sg->g->h2d = sg->h2d;
  sg->g->d2h = sg->d2h;
  *out = sg;
  return MF_OK;
fail:
  mf_exec_stager_free(sg);
  return st;
}

size_t mf_exec_stager_pinned_bytes(const mf_exec_stager *sg) {
  return sg->L.arena_bytes;
}

/* The move's slabs: how many, and slab j's bytes. */
static mf_status stager_chunks(const mf_exec_stager *sg, size_t bytes, const char *dir, int32_t *n) {
  if (bytes > sg->max_bytes)
    return MF_ERR(MF_ERR_INVALID_ARG, "stager: %s of %zu bytes, made for at most %zu", dir, bytes,
                  sg->max_bytes);
  *n = (int32_t)((bytes + sg->slab_bytes - 1) / sg->slab_bytes);
  return MF_OK;
}

static size_t chunk_bytes(const mf_exec_stager *sg, size_t bytes, int32_t j) {
  const size_t at = (size_t)j * sg->slab_bytes;
  return bytes - at < sg->slab_bytes ? bytes - at : sg->slab_bytes;
}

/* Every stream synchronized, even after a failed submission (host functions
 * still queued read the caller's memory); the first failure is returned. */
static mf_status stager_finish(mf_exec_stager *sg, mf_status st) {
  const mf_status a = sg->b->stream_sync(sg->b, sg->h2d), c = sg->b->stream_sync(sg->b, sg->d2h),
                  d = mf_exec_slabs_sync(sg->g);
  return st != MF_OK ? st : a != MF_OK ? a : c != MF_OK ? c : d;
}

/* Slab j of a move each way: its copy's size and host bytes decided, then
 * its fill, DMA and release (up) or its DMA and copy-out (down). */
static mf_status stager_slab(mf_exec_stager *sg, int up, uint8_t *dev, uint8_t *host, size_t bytes,
                             int32_t j) {
  exec_staging *g = sg->g;
  const int32_t k = up ? j : sg->m + j;
  const size_t at = (size_t)j * sg->slab_bytes, len = chunk_bytes(sg, bytes, j);
  sg->L.copies[k].bytes = len;
  sg_copy_rt *r = &g->rt[k];
  memset(r, 0, sizeof *r);
  r->home = -1;
  r->turn = -1;
  if (!up) {
    r->host = host + at;
    r->mode = MF_SG_COPY;
    MF_CHECK(mf_exec_slab_wait(g, k));
    MF_CHECK(mf_exec_slab_dma(g, k, dev + at));
    return mf_exec_slab_drain(g, k, 1);
  }
  r->src.part[0] = host + at;
  r->src.bytes[0] = len;
  r->src.n = 1;
  r->mode = MF_SG_PARTS;
  g->work[k] = 1;
  MF_CHECK(mf_exec_slab_fill(g, k));
  MF_CHECK(mf_exec_slab_dma(g, k, dev + at));
  return mf_exec_slab_uploaded(g, k);
}

static mf_status stager_move(mf_exec_stager *sg, int up, uint8_t *dev, uint8_t *host, size_t bytes) {
  int32_t n = 0;
  MF_CHECK(stager_chunks(sg, bytes, up ? "an upload" : "a download", &n));
  mf_status st = MF_OK;
  sg->last_n[up] = n;
  for (int32_t j = 0; j < n && st == MF_OK; j++) st = stager_slab(sg, up, dev, host, bytes, j);
  return stager_finish(sg, st);
}

mf_status mf_exec_stager_host_seconds(const mf_exec_stager *sg, int up, double *seconds) {
  const exec_staging *g = sg->g;
  *seconds = NAN;
  if (!g->tf0) return MF_OK;
  *seconds = 0;
  for (int32_t j = 0; j < sg->last_n[up ? 1 : 0]; j++) {
    const int32_t k = up ? j : sg->m + j;
    double dt = 0;
    MF_CHECK(sg->b->event_elapsed(sg->b, g->tf0[k], g->tf1[k], &dt));
    *seconds += dt;
  }
  return MF_OK;
}

/* The host side is only read on the way up, the device side only on the way down. */
mf_status mf_exec_stager_h2d(mf_exec_stager *sg, void *dev, const void *host, size_t bytes) {
  return stager_move(sg, 1, (uint8_t *)dev, (uint8_t *)(uintptr_t)host, bytes);
}

mf_status mf_exec_stager_d2h(mf_exec_stager *sg, void *host, const void *dev, size_t bytes) {
  return stager_move(sg, 0, (uint8_t *)(uintptr_t)dev, (uint8_t *)host, bytes);
}
