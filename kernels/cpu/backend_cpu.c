/* The cpu backend: a real "device" arena of exactly the budgeted size, memcpy
 * copies, streams that run work as it is submitted, and the checking mode
 * (NaN-poisoned releases, every operand checked against the live ranges).
 *
 * BF16 storage. The cpu kernels compute on fp32 arrays; a call whose storage
 * is BF16 (mf_kernel_call_dtype) runs as the twin of the cuda backend's bf16
 * kernels: every FLOAT operand present (the operand table's MF_KT_FLOAT, and
 * the expert weights when they are FLOAT) is widened from bf16 into an fp32
 * copy (exact), the fp32 kernel runs on the copies with round_bf16 on, and
 * every FLOAT operand the call writes is narrowed back to bf16 (round to
 * nearest even, mf_fp32_to_bf16). Operands of fixed types are passed as they
 * are. So a BF16 call gives, bit for bit, the round_bf16 fp32 call on the
 * widened values, narrowed. Written-only operands are widened too: a kernel
 * may leave part of an output alone (rows of ye past offsets[E]) and those
 * bytes must come back unchanged.
 *
 * Where the fp32 copies live (sized once, allocated once):
 *  - an operand inside the arena: in the shadow, an fp32 image of the arena
 *    made at arena_create (2 x its bytes of address space, mapped without
 *    reserving memory: pages are touched only where BF16 operands lie, and
 *    then kept, so a BF16 program holds up to 2 x its arena again); arena
 *    byte o has its copy at shadow byte 2 o, so operands that alias (an
 *    in-place y == x) have aliasing copies, and no two calls' copies collide;
 *  - an operand outside the arena (tests pass host pointers when checking is
 *    off): in the side buffer, grown to the largest call seen and then kept;
 *    one that lies inside an earlier operand of b[] shares that one's copy (in
 *    place), the others get their own. Partial overlaps outside the arena are
 *    not supported (the twins assume none).
 * MF_K_ADAMW with a BF16 param is not converted: the optimizer kernel reads
 * the param's dtype and keeps the fp32 master in the state (backend.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_ops.h"

#define GRANULE 4 /* bytes per bit of the residency bitmap */
/* The poison of dead arena bytes: a NaN read as one fp32 (0x7fc07fc0) and as
 * each of two bf16 (0x7fc0). */
#define POISON 0x7fc07fc0u
#define SIDE_ALIGN 64 /* bytes: each copy in the side buffer starts on a cache line */

typedef struct cpu_impl {
  mf_cpu_backend_opts opts;
  mf_kctx kctx;
  uint8_t *arena;
  size_t arena_bytes;
  uint64_t *live; /* one bit per GRANULE bytes of the arena (checking mode) */
  mf_backend_stats stats;
  /* BF16 storage (top of the file): the fp32 copies of a call's FLOAT operands. */
  float *shadow;       /* arena byte o's copy at shadow + o / 2; NULL: not mapped (side buffer) */
  size_t shadow_bytes; /* 2 x arena_bytes */
  uint8_t *side;       /* copies of operands outside the arena */
  size_t side_bytes;
  void **experts; /* the fp32 copies of a call's expert weights */
  size_t experts_cap;
} cpu_impl;

/* Deferred streams (mf_cpu_backend_opts.streams != MF_CPU_STREAMS_IMMEDIATE):
 * each stream is a FIFO of work run only when something needs it — a
 * stream_sync, a stream_wait on an event of it reached by another stream's
 * work, or (MF_CPU_STREAMS_COPIES_FIRST) a copy's own submission. Positions
 * count every item a stream ever took; an event is a position. */
typedef enum { Q_COPY, Q_RUN, Q_WAIT, Q_HOST, Q_STAMP } qkind;

typedef struct qitem {
  qkind kind;
  mf_kernel_call call; /* Q_RUN; call.experts points into `experts` */
  void **experts;      /* Q_RUN: owned copy of the expert pointers */
  void *dst;           /* Q_COPY */
  const void *src;
  size_t bytes;
  mf_copy_kind ck;
  mf_stream *on; /* Q_WAIT: the stream and position waited for */
  uint64_t pos;
  void (*fn)(void *); /* Q_HOST */
  void *ctx;
  mf_event *ev; /* Q_STAMP: the timed event whose time this sets */
} qitem;

struct mf_stream {
  qitem *q;
  size_t n, cap, done; /* items held, room, items run (of q) */
  uint64_t base;       /* items dropped from the front of q before q[0] */
  int eager;           /* the last item given to it ran when given (a copy first, a lazy host function) */
};
struct mf_event {
  mf_stream *on; /* NULL: complete */
  uint64_t pos;
  int timed;
  double t; /* timed: when its last record was reached (mf_time_now) */
};

static cpu_impl *impl_of(mf_backend *b) {
  return (cpu_impl *)b->impl;
}

/* The shadow of BF16 storage, 2 x the arena's bytes of address space. Mapped
 * without a reservation, so an F32 program never gives it memory. Where the
 * mapping fails (an address space too small) it stays NULL and the side
 * buffer takes arena operands too. */
static void map_shadow(cpu_impl *c) {
  size_t bytes;
  if (c->arena_bytes == 0 || __builtin_mul_overflow(c->arena_bytes, (size_t)2, &bytes)) return;
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return;
  c->shadow = (float *)p;
  c->shadow_bytes = bytes;
}

static mf_status cpu_arena_create(mf_backend *b, size_t bytes, void **base) {
  cpu_impl *c = impl_of(b);
  *base = NULL;
  if (c->arena) return MF_ERR(MF_ERR_INTERNAL, "cpu backend: the device arena exists already");
  void *p = NULL;
  if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) {
    char buf[32];
    return MF_ERR(MF_ERR_OUT_OF_MEMORY, "cpu backend: cannot allocate a device arena of %s",
                  mf_format_bytes(bytes, buf, sizeof buf));
  }
  c->arena = (uint8_t *)p;
  c->arena_bytes = bytes;
  mf_backend_arena_held((int64_t)bytes);
  if (c->opts.checking) {
    size_t granules = (bytes + GRANULE - 1) / GRANULE;
    c->live = (uint64_t *)calloc((granules + 63) / 64 + 1, sizeof(uint64_t));
    if (!c->live) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "cpu backend: no memory for the residency map");
    /* Nothing is live yet: the whole arena starts poisoned. */
    uint32_t nan_bits = POISON;
    for (size_t i = 0; i + 4 <= bytes; i += 4) memcpy(c->arena + i, &nan_bits, 4);
  }
  map_shadow(c);
  *base = p;
  return MF_OK;
}

static mf_status cpu_host_alloc(mf_backend *b, size_t bytes, void **out) {
  *out = NULL;
  if (posix_memalign(out, 64, bytes ? bytes : 64) != 0)
    return MF_ERR(MF_ERR_OUT_OF_MEMORY, "cpu backend: cannot allocate %zu bytes of host staging memory",
                  bytes);
  return MF_OK;
}

static void cpu_host_free(mf_backend *b, void *p) {
  free(p);
}

static mf_status cpu_host_register(mf_backend *b, void *ptr, size_t bytes) {
  if (!ptr || bytes == 0)
    return MF_ERR(MF_ERR_INVALID_ARG, "cpu backend: pinning %zu bytes at %p: no memory", bytes, ptr);
  impl_of(b)->stats.host_registered_bytes += bytes;
  return MF_OK;
}

static void cpu_host_unregister(mf_backend *b, void *ptr, size_t bytes) {
  cpu_impl *c = impl_of(b);
  if (!ptr) return;
  c->stats.host_registered_bytes -=
      bytes < c->stats.host_registered_bytes ? bytes : c->stats.host_registered_bytes;
}

static mf_status cpu_stream_create(mf_backend *b, mf_stream **out) {
  *out = (mf_stream *)calloc(1, sizeof(mf_stream));
  return *out ? MF_OK : MF_ERR(MF_ERR_OUT_OF_MEMORY, "cpu backend: out of memory for a stream");
}
static void drop_items(mf_stream *s) {
  for (size_t i = 0; i < s->n; i++) free(s->q[i].experts);
}
static void cpu_stream_free(mf_backend *b, mf_stream *s) {
  if (!s) return;
  drop_items(s);
  free(s->q);
  free(s);
}
static mf_status cpu_event_create(mf_backend *b, mf_event **out) {
  *out = (mf_event *)calloc(1, sizeof(mf_event));
  return *out ? MF_OK : MF_ERR(MF_ERR_OUT_OF_MEMORY, "cpu backend: out of memory for an event");
}
static mf_status cpu_event_create_timed(mf_backend *b, mf_event **out) {
  MF_CHECK(cpu_event_create(b, out));
  (*out)->timed = 1;
  return MF_OK;
}
static void cpu_event_free(mf_backend *b, mf_event *e) {
  free(e);
}

static mf_status run_now(cpu_impl *c, const mf_kernel_call *k);
static mf_status copy_now(cpu_impl *c, void *dst, const void *src, size_t bytes, mf_copy_kind kind);

/* Runs s's items until `pos` items have run (deferred streams). */
static mf_status drain(cpu_impl *c, mf_stream *s, uint64_t pos) {
  while (s->base + s->done < pos && s->done < s->n) {
    qitem *it = &s->q[s->done++];
    switch (it->kind) {
      case Q_WAIT:
        MF_CHECK(drain(c, it->on, it->pos));
        break;
      case Q_COPY:
        MF_CHECK(copy_now(c, it->dst, it->src, it->bytes, it->ck));
        break;
      case Q_RUN:
        MF_CHECK(run_now(c, &it->call));
        break;
      case Q_HOST:
        it->fn(it->ctx);
        break;
      case Q_STAMP:
        it->ev->t = mf_time_now();
        break;
    }
  }
  if (s->done == s->n) { /* all run: start the queue afresh */
    drop_items(s);
    s->base += s->n;
    s->n = s->done = 0;
  }
  return MF_OK;
}

static mf_status enqueue(mf_stream *s, const qitem *it) {
  if (s->n == s->cap) {
    size_t cap = s->cap ? 2 * s->cap : 256;
    qitem *q = (qitem *)realloc(s->q, cap * sizeof *q);
    if (!q) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "cpu backend: out of memory for a deferred stream");
    s->q = q;
    s->cap = cap;
  }
  s->q[s->n++] = *it;
  s->eager = 0;
  return MF_OK;
}

static mf_status cpu_stream_sync(mf_backend *b, mf_stream *s) {
  cpu_impl *c = impl_of(b);
  if (c->opts.streams == MF_CPU_STREAMS_IMMEDIATE) return MF_OK;
  return drain(c, s, s->base + s->n);
}
/* Immediate streams run work when submitted, so an event is complete when it
 * is recorded. On deferred streams a timed event's record is an item that
 * stamps the time when the stream reaches it (at once when the stream ran its
 * last work as it was given and has nothing queued). */
static mf_status cpu_event_record(mf_backend *b, mf_event *e, mf_stream *s) {
  cpu_impl *c = impl_of(b);
  if (c->opts.streams == MF_CPU_STREAMS_IMMEDIATE) {
    e->on = NULL;
    if (e->timed) e->t = mf_time_now();
    return MF_OK;
  }
  if (e->timed && s->eager && s->done == s->n) {
    e->t = mf_time_now(); /* its last work ran when given, nothing since: the stream is there now */
  } else if (e->timed) {
    qitem it;
    memset(&it, 0, sizeof it);
    it.kind = Q_STAMP;
    it.ev = e;
    MF_CHECK(enqueue(s, &it));
  }
  e->on = s;
  e->pos = s->base + s->n;
  return MF_OK;
}
static mf_status cpu_event_query(mf_backend *b, mf_event *e, int *done) {
  *done = !e->on || e->on->base + e->on->done >= e->pos;
  return MF_OK;
}
static mf_status cpu_event_elapsed(mf_backend *b, mf_event *from, mf_event *to, double *seconds) {
  *seconds = 0;
  if (!from->timed || !to->timed)
    return MF_ERR(MF_ERR_INVALID_ARG,
                  "cpu backend: elapsed time between events not made by event_create_timed");
  int d1 = 0, d2 = 0;
  MF_CHECK(cpu_event_query(b, from, &d1));
  MF_CHECK(cpu_event_query(b, to, &d2));
  if (!d1 || !d2) return MF_ERR(MF_ERR_INVALID_ARG, "cpu backend: elapsed time of an event not reached yet");
  *seconds = to->t - from->t;
  return MF_OK;
}
/* Host functions: at once on immediate streams; on deferred ones an item run
 * in order, as early as its waits allow (lazy, unless it follows a queued copy
 * or kernel on its stream) or as late as possible (copies first) — the
 * opposite of that mode's copies (backend.h). */
static mf_status cpu_host_fn(mf_backend *b, mf_stream *s, void (*fn)(void *ctx), void *ctx) {
  cpu_impl *c = impl_of(b);
  if (!fn) return MF_ERR(MF_ERR_INVALID_ARG, "cpu backend: host function is NULL");
  if (c->opts.streams == MF_CPU_STREAMS_IMMEDIATE) {
    fn(ctx);
    return MF_OK;
  }
  qitem it;
  memset(&it, 0, sizeof it);
  it.kind = Q_HOST;
  it.fn = fn;
  it.ctx = ctx;
  /* Lazy: early only behind waits and other host functions; behind a queued
   * copy or kernel it stays as late as they are. */
  int early = c->opts.streams == MF_CPU_STREAMS_LAZY;
  for (size_t i = s->done; i < s->n && early; i++) early = s->q[i].kind != Q_COPY && s->q[i].kind != Q_RUN;
  MF_CHECK(enqueue(s, &it));
  if (!early) return MF_OK;
  MF_CHECK(drain(c, s, s->base + s->n));
  s->eager = 1;
  return MF_OK;
}
static mf_status cpu_stream_wait(mf_backend *b, mf_stream *s, mf_event *e) {
  cpu_impl *c = impl_of(b);
  if (c->opts.streams == MF_CPU_STREAMS_IMMEDIATE || !e->on) return MF_OK;
  if (e->on == s) return MF_OK; /* a stream runs in order */
  qitem it;
  memset(&it, 0, sizeof it);
  it.kind = Q_WAIT;
  it.on = e->on;
  it.pos = e->pos;
  return enqueue(s, &it);
}

/* ------------------------------------------------------------- checking */

static int bit_get(const uint64_t *m, size_t g) {
  return (int)((m[g >> 6] >> (g & 63)) & 1u);
}
static void bit_set(uint64_t *m, size_t g, int v) {
  if (v)
    m[g >> 6] |= (uint64_t)1 << (g & 63);
  else
    m[g >> 6] &= ~((uint64_t)1 << (g & 63));
}

static mf_status cpu_mark(mf_backend *b, void *ptr, size_t bytes, int live) {
  cpu_impl *c = impl_of(b);
  if (!c->opts.checking || bytes == 0) return MF_OK;
  uint8_t *p = (uint8_t *)ptr;
  if (!c->arena || p < c->arena || p + bytes > c->arena + c->arena_bytes)
    return MF_ERR(MF_ERR_INTERNAL, "cpu backend: mark of %zu bytes at %p outside the device arena", bytes,
                  ptr);
  size_t off = (size_t)(p - c->arena);
  size_t g0 = off / GRANULE, g1 = (off + bytes + GRANULE - 1) / GRANULE;
  for (size_t g = g0; g < g1; g++) bit_set(c->live, g, live);
  if (!live) {
    uint32_t nan_bits = POISON;
    size_t i = 0;
    for (; i + 4 <= bytes; i += 4) memcpy(p + i, &nan_bits, 4);
    memset(p + i, 0xff, bytes - i);
  }
  return MF_OK;
}

/* Whether [ptr, ptr+bytes) passes the residency check: 0 it does (or checking
 * is off), 1 it is not inside the arena, 2 it covers bytes that hold no live
 * tensor, the first at *dead. */
static int residency_fault(cpu_impl *c, const void *ptr, size_t bytes, size_t *dead) {
  if (!c->opts.checking || !ptr || bytes == 0) return 0;
  c->stats.checks++;
  const uint8_t *p = (const uint8_t *)ptr;
  if (!c->arena || p < c->arena || p + bytes > c->arena + c->arena_bytes) return 1;
  size_t off = (size_t)(p - c->arena);
  size_t g0 = off / GRANULE, g1 = (off + bytes + GRANULE - 1) / GRANULE;
  for (size_t g = g0; g < g1; g++)
    if (!bit_get(c->live, g)) {
      *dead = g * GRANULE;
      return 2;
    }
  return 0;
}

/* An operand must lie in the arena, in ranges marked live. `what` names it:
 * "copy destination", or (what NULL) operand `slot` of kernel call k, by the
 * operand table's names. */
static mf_status check_range(cpu_impl *c, const void *ptr, size_t bytes, const char *what,
                             const mf_kernel_call *k, int slot) {
  size_t dead = 0;
  const int fault = residency_fault(c, ptr, bytes, &dead);
  if (!fault) return MF_OK;
  char name[256], op[64];
  if (!what) {
    snprintf(name, sizeof name, "%s%s%s %s", mf_kernel_name(k->kind), k->label ? " in " : "",
             k->label ? k->label : "", mf_kernel_operand_text(k->kind, slot, op, sizeof op));
    what = name;
  }
  if (fault == 1)
    return MF_ERR(MF_ERR_INTERNAL, "residency check: %s (%zu bytes) is not in the device arena", what, bytes);
  const size_t off = (size_t)((const uint8_t *)ptr - c->arena);
  return MF_ERR(
      MF_ERR_INTERNAL,
      "residency check: %s reads or writes arena bytes [%zu, %zu) that hold no live tensor (first dead "
      "byte at %zu)",
      what, off, off + bytes, dead);
}

static mf_status check_call(cpu_impl *c, const mf_kernel_call *k) {
  if (!c->opts.checking) return MF_OK;
  for (int j = 0; j < MF_KBUF_MAX; j++) MF_CHECK(check_range(c, k->b[j].ptr, k->b[j].bytes, NULL, k, j));
  if (k->experts)
    for (int64_t e = 0; e < k->i[0]; e++) /* NULL: no weights (a cold expert's LoRA adapter) */
      if (k->experts[e]) MF_CHECK(check_range(c, k->experts[e], k->expert_bytes, NULL, k, 100 + (int)e));
  return MF_OK;
}

static mf_status cpu_copy(mf_backend *b, void *dst, const void *src, size_t bytes, mf_copy_kind kind,
                          mf_stream *s) {
  cpu_impl *c = impl_of(b);
  if (c->opts.streams == MF_CPU_STREAMS_IMMEDIATE) return copy_now(c, dst, src, bytes, kind);
  qitem it;
  memset(&it, 0, sizeof it);
  it.kind = Q_COPY;
  it.dst = dst;
  it.src = src;
  it.bytes = bytes;
  it.ck = kind;
  MF_CHECK(enqueue(s, &it));
  /* Copies first: a copy stream runs as soon as it is given work. */
  if (c->opts.streams != MF_CPU_STREAMS_COPIES_FIRST) return MF_OK;
  MF_CHECK(drain(c, s, s->base + s->n));
  s->eager = 1;
  return MF_OK;
}

static mf_status copy_now(cpu_impl *c, void *dst, const void *src, size_t bytes, mf_copy_kind kind) {
  if (bytes == 0) return MF_OK;
  if (kind == MF_COPY_H2D || kind == MF_COPY_D2D)
    MF_CHECK(check_range(c, dst, bytes, "copy destination", NULL, 0));
  if (kind == MF_COPY_D2H || kind == MF_COPY_D2D)
    MF_CHECK(check_range(c, src, bytes, "copy source", NULL, 0));
  memmove(dst, src, bytes);
  if (kind == MF_COPY_H2D) c->stats.bytes_h2d += bytes;
  if (kind == MF_COPY_D2H) c->stats.bytes_d2h += bytes;
  if (kind == MF_COPY_D2D) c->stats.bytes_d2d += bytes;
  return MF_OK;
}

/* --------------------------------------------------------------- kernels */

#define F(j) ((float *)k->b[j].ptr)
#define CF(j) ((const float *)k->b[j].ptr)
#define I32(j) ((int32_t *)k->b[j].ptr)
#define CI32(j) ((const int32_t *)k->b[j].ptr)
#define I64(j) ((int64_t *)k->b[j].ptr)
#define CI64(j) ((const int64_t *)k->b[j].ptr)
#define D64(j) ((double *)k->b[j].ptr)
#define CD64(j) ((const double *)k->b[j].ptr)

static mf_status cpu_run(mf_backend *b, const mf_kernel_call *k, mf_stream *s) {
  cpu_impl *c = impl_of(b);
  mf_status st = mf_kernel_call_check(k);
  if (st != MF_OK) {
    mf_error_prefix("cpu backend");
    return st;
  }
  if (c->opts.streams == MF_CPU_STREAMS_IMMEDIATE) return run_now(c, k);
  qitem it;
  memset(&it, 0, sizeof it);
  it.kind = Q_RUN;
  it.call = *k;
  if (k->experts) {
    const int64_t E = k->i[0] > 0 ? k->i[0] : 1;
    it.experts = (void **)malloc((size_t)E * sizeof(void *));
    if (!it.experts) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "cpu backend: out of memory for a deferred kernel");
    memcpy(it.experts, k->experts, (size_t)E * sizeof(void *));
    it.call.experts = it.experts;
  }
  st = enqueue(s, &it);
  if (st != MF_OK) free(it.experts);
  return st;
}

static mf_status run_kernel(cpu_impl *c, const mf_kernel_call *k, const mf_kctx *x);
static mf_status run_bf16(cpu_impl *c, const mf_kernel_call *k);

/* A call when it runs (at once, or when its deferred stream reaches it). */
static mf_status run_now(cpu_impl *c, const mf_kernel_call *k) {
  MF_CHECK(check_call(c, k));
  mf_dtype storage;
  MF_CHECK(mf_kernel_call_dtype(k, &storage));
  /* ADAMW's BF16 param is the optimizer kernel's own (the master is in the state). */
  if (storage == MF_DTYPE_BF16 && k->kind != MF_K_ADAMW) return run_bf16(c, k);
  return run_kernel(c, k, &c->kctx);
}

/* The kernel on the call's buffers as they are: FLOAT operands fp32 (ADAMW's
 * param either: the optimizer kernel reads its dtype). */
static mf_status run_kernel(cpu_impl *c, const mf_kernel_call *k, const mf_kctx *x) {
  const int64_t *i = k->i;
  c->stats.kernels++;
  switch (k->kind) {
    case MF_K_ZERO:
      memset(k->b[0].ptr, 0, k->b[0].bytes);
      return MF_OK;
    case MF_K_EMBED_FWD:
      return mf_cpu_embed_fwd(CI32(0), i[0], CF(1), i[1], i[2], F(2), x);
    case MF_K_EMBED_BWD:
      return mf_cpu_embed_bwd(CI32(0), i[0], CF(1), i[1], i[2], F(2), x);
    case MF_K_RMSNORM_FWD:
      return mf_cpu_rmsnorm_fwd(CF(0), CF(1), i[0], i[1], (float)k->f[0], F(2), F(3), x);
    case MF_K_RMSNORM_BWD:
      return mf_cpu_rmsnorm_bwd(CF(0), CF(1), CF(2), CF(3), i[0], i[1], F(4), F(5), (int)i[2], x);
    case MF_K_LINEAR_FWD:
      return mf_cpu_linear_fwd(CF(0), CF(1), CF(2), i[0], i[1], i[2], F(3), (int)i[3], x);
    case MF_K_LINEAR_BWD_DATA:
      return mf_cpu_linear_bwd_data(CF(0), CF(1), i[0], i[1], i[2], F(2), (int)i[3], x);
    case MF_K_LINEAR_BWD_WEIGHT:
      return mf_cpu_linear_bwd_weight(CF(0), CF(1), i[0], i[1], i[2], F(2), F(3), x);
    case MF_K_ROPE_FWD:
      return mf_cpu_rope_fwd(F(0), i[0], i[1], i[2], CI32(1), mf_rope_args_of(i, k->f), x);
    case MF_K_ROPE_BWD:
      return mf_cpu_rope_bwd(F(0), i[0], i[1], i[2], CI32(1), mf_rope_args_of(i, k->f), x);
    case MF_K_ATTN_FWD:
      return mf_cpu_attn_fwd(CF(0), CF(1), CF(2), i[0], i[1], i[2], i[3], i[4], i[5], i[6], CF(5),
                             (float)k->f[0], F(3), F(4), x);
    case MF_K_ATTN_BWD:
      return mf_cpu_attn_bwd(CF(0), CF(1), CF(2), CF(3), CF(4), CF(5), i[0], i[1], i[2], i[3], i[4], i[5],
                             i[6], CF(9), (float)k->f[0], F(6), F(7), F(8), F(10), x);
    case MF_K_SWIGLU_FWD:
      return mf_cpu_swiglu_fwd(CF(0), CF(1), i[0], F(2), x);
    case MF_K_SWIGLU_BWD:
      return mf_cpu_swiglu_bwd(CF(0), CF(1), CF(2), i[0], F(3), F(4), x);
    case MF_K_SIGGATE_FWD:
      return mf_cpu_sigmoid_gate_fwd(CF(0), CF(1), i[0], i[1], F(2), x);
    case MF_K_SIGGATE_BWD:
      return mf_cpu_sigmoid_gate_bwd(CF(0), CF(1), CF(2), i[0], i[1], F(3), F(4), x);
    case MF_K_ADD: {
      mf_kctx exact = *x;
      if (i[1]) exact.round_bf16 = 0; /* gradient sums stay fp32 */
      return mf_cpu_add(CF(0), i[0], F(1), &exact);
    }
    case MF_K_SCALE:
      return mf_cpu_scale(F(0), i[0], (float)k->f[0], x);
    case MF_K_DEQUANT:
      return mf_cpu_dequant((const uint8_t *)k->b[0].ptr, i[0], i[1], i[2], i[3], i[4], F(1), x);
    case MF_K_DROPOUT:
      if (k->b[2].ptr)
        return mf_cpu_dropout_parts(CF(0), i[0], (uint64_t)i[1], k->f[0], i[3], CI64(2), CI64(3), CI64(4),
                                    i[4], i[5], F(1), x);
      return mf_cpu_dropout(CF(0), i[0], (uint64_t)i[1], (uint64_t)i[2], k->f[0], F(1), x);
    case MF_K_ROUTER_FWD:
      return mf_cpu_router_fwd(CF(0), i[0], i[1], i[2], (int)i[3], (int)i[4], F(1), I32(2), F(3), x);
    case MF_K_ROUTER_BWD:
      return mf_cpu_router_bwd(CF(0), CI32(1), CF(2), CF(3), CF(4), i[0], i[1], i[2], (int)i[3], (int)i[4], F(5),
                               x);
    case MF_K_ROUTER_GROUP_FWD:
      return mf_cpu_router_group_fwd(CF(0), CF(1), i[0], i[1], i[2], i[3], i[4], (int)i[5], (float)k->f[0],
                                     F(2), I32(3), F(4), x);
    case MF_K_ROUTER_GROUP_BWD:
      return mf_cpu_router_group_bwd(CF(0), CI32(1), CF(2), i[0], i[1], i[2], (int)i[5], (float)k->f[0], F(3),
                                     x);
    case MF_K_SLICE:
      return mf_cpu_slice(CF(0), i[0], i[1], i[2], i[3], i[4], i[5], i[6], (int)i[7], F(1), x);
    case MF_K_SLICE_BWD:
      return mf_cpu_slice_bwd(CF(0), i[0], i[1], i[2], i[3], i[4], i[5], i[6], (int)i[7], F(1), x);
    case MF_K_SWIGLU_CLAMP_FWD:
      return mf_cpu_swiglu_clamp_fwd(CF(0), CF(1), i[0], (float)k->f[0], (float)k->f[1], F(2), x);
    case MF_K_SWIGLU_CLAMP_BWD:
      return mf_cpu_swiglu_clamp_bwd(CF(0), CF(1), CF(2), i[0], (float)k->f[0], (float)k->f[1], F(3), F(4), x);
    case MF_K_EXPERT_BIAS_FWD:
      return mf_cpu_expert_bias_fwd(CF(2), CI64(1), mf_kernel_expert_rows(k), i[0], i[1], F(0), x);
    case MF_K_EXPERT_BIAS_BWD:
      return mf_cpu_expert_bias_bwd_parts(CF(0), CI64(1), CI64(3), i[0], i[1], i[2], F(2), x);
    case MF_K_MOE_DISPATCH:
      return mf_cpu_moe_dispatch(CI32(0), i[0], i[1], i[2], I64(1), I64(2), I32(3), I32(4));
    case MF_K_MOE_GATHER:
      return mf_cpu_moe_gather(CF(0), CI32(1), i[0], i[1], F(2), x);
    case MF_K_MOE_GATHER_BWD:
      return mf_cpu_moe_gather_bwd(CF(0), CI32(1), i[0], i[1], i[2], F(2), (int)i[3], x);
    case MF_K_MOE_COMBINE:
      return mf_cpu_moe_combine(CF(0), CF(1), CI32(2), i[0], i[1], i[2], F(3), x);
    case MF_K_MOE_COMBINE_BWD:
      return mf_cpu_moe_combine_bwd(CF(0), CF(1), CF(2), CI32(3), i[0], i[1], i[2], F(4), F(5), x);
    case MF_K_EXPERT_FWD:
      return mf_cpu_expert_fwd(CF(0), (const float *const *)k->experts, CI64(1), mf_kernel_expert_rows(k),
                               i[0], i[1], i[2], F(2), x);
    case MF_K_EXPERT_BWD_DATA:
      return mf_cpu_expert_bwd_data(CF(0), (const float *const *)k->experts, CI64(1),
                                    mf_kernel_expert_rows(k), i[0], i[1], i[2], F(2), x);
    case MF_K_EXPERT_BWD_WEIGHT:
      return mf_cpu_expert_bwd_weight_parts(CF(0), CF(1), CI64(2), CI64(3), i[0], i[1], i[2], i[3],
                                            (float *const *)k->experts, x);
    case MF_K_CROSS_ENTROPY:
      return mf_cpu_cross_entropy(CF(0), CF(1), CI32(2), i[0], i[1], i[2], i[3], (float)k->f[0], F(3), F(4),
                                  D64(5), F(6), F(7), x);
    case MF_K_AUX_ACCUMULATE:
      return mf_cpu_aux_accumulate(CF(0), CI32(1), i[0], i[1], i[2], I64(2), D64(3));
    case MF_K_AUX_VALUE:
      return mf_cpu_aux_value(CI64(0), CD64(1), i[0], i[1], D64(2));
    case MF_K_AUX_GRAD:
      return mf_cpu_aux_grad(CI64(0), i[0], i[1], k->f[0], i[2], F(1));
    case MF_K_GRAD_SUMSQ:
    case MF_K_ADAMW:
      /* The device is host memory: the host optimizer's code, passed in. */
      if (!c->opts.optim)
        return MF_ERR(MF_ERR_UNSUPPORTED,
                      "cpu backend: %s needs the optimizer kernels (mf_cpu_backend_opts.optim = "
                      "mf_optim_run_kernel)",
                      mf_kernel_name(k->kind));
      return c->opts.optim(k, c->opts.pool);
    default: /* a kind of the table without a case here */
      return MF_ERR(MF_ERR_UNSUPPORTED, "cpu backend: no %s kernel", mf_kernel_name(k->kind));
  }
}

/* ---------------------------------------------------------- BF16 storage */

#define CVT_GRAIN ((size_t)1 << 14) /* elements per part of a parallel conversion */

/* Widening (exact) or narrowing (each element rounded on its own) of n
 * elements, in parts of a fixed split: the bits do not depend on it. */
typedef struct cvt_job {
  uint16_t *h;
  float *f;
  size_t n;
  int narrow; /* 1: f -> h; 0: h -> f */
} cvt_job;

static void cvt_part(void *ctx, int i, int n) {
  const cvt_job *j = (const cvt_job *)ctx;
  size_t b, e;
  mf_partition(j->n, CVT_GRAIN, i, n, &b, &e);
  if (j->narrow)
    mf_fp32_to_bf16_n(j->f + b, j->h + b, e - b);
  else
    mf_bf16_to_fp32_n(j->h + b, j->f + b, e - b);
}

static void convert(cpu_impl *c, void *h, float *f, size_t n, int narrow) {
  cvt_job j = {(uint16_t *)h, f, n, narrow};
  if (c->opts.pool && n >= 4 * CVT_GRAIN)
    mf_threadpool_run(c->opts.pool, cvt_part, &j);
  else
    cvt_part(&j, 0, 1);
}

/* Whether operand j of the call is a FLOAT one present. */
static int float_operand(const mf_kernel_call *k, int j) {
  const mf_kernel_info *t = mf_kernel_info_of(k->kind);
  return j < mf_kernel_n_operands(k->kind) && t->b[j].type == MF_KT_FLOAT && k->b[j].ptr;
}

/* The expert weights the call converts: E when they are FLOAT, else 0. */
static int64_t float_experts(const mf_kernel_call *k) {
  const mf_kernel_info *t = mf_kernel_info_of(k->kind);
  return t->experts.name && t->experts.type == MF_KT_FLOAT && k->experts && k->i[0] > 0 ? k->i[0] : 0;
}

static int in_shadow(const cpu_impl *c, const void *p, size_t bytes) {
  const uint8_t *q = (const uint8_t *)p;
  return c->shadow && q >= c->arena && (size_t)(q - c->arena) <= c->arena_bytes &&
         bytes <= c->arena_bytes - (size_t)(q - c->arena);
}

/* A BF16 operand (slot: mf_kernel_operand_text's) must hold whole, aligned
 * bf16 elements; *side grows by the room its copy takes in the side buffer. */
static mf_status size_bf16(const cpu_impl *c, const mf_kernel_call *k, int slot, const void *p, size_t bytes,
                           size_t *side) {
  char what[64];
  if (((uintptr_t)p | bytes) & 1u)
    return MF_ERR(MF_ERR_INVALID_ARG, "cpu backend: kernel %s%s%s: %s is BF16 but %s",
                  mf_kernel_name(k->kind), k->label ? " in " : "", k->label ? k->label : "",
                  mf_kernel_operand_text(k->kind, slot, what, sizeof what),
                  (uintptr_t)p & 1u ? "at an odd address" : "of an odd number of bytes");
  const size_t room = (2 * bytes + SIDE_ALIGN - 1) / SIDE_ALIGN * SIDE_ALIGN;
  if (!in_shadow(c, p, bytes) && (bytes > SIZE_MAX / 4 || !mf_add_size(*side, room, side)))
    return MF_ERR(MF_ERR_INVALID_ARG,
                  "cpu backend: kernel %s: the fp32 copies of its operands overflow a size",
                  mf_kernel_name(k->kind));
  return MF_OK;
}

/* The side buffer of at least `bytes`, and room for E expert pointers: grown
 * (once, to the largest call seen) before any copy is placed. */
static mf_status reserve_bf16(cpu_impl *c, size_t bytes, int64_t E) {
  if (bytes > c->side_bytes) {
    free(c->side);
    c->side = NULL;
    c->side_bytes = 0;
    void *p = NULL;
    if (posix_memalign(&p, SIDE_ALIGN, bytes) != 0)
      return MF_ERR(MF_ERR_OUT_OF_MEMORY,
                    "cpu backend: no memory for %zu bytes of fp32 copies of BF16 operands", bytes);
    c->side = (uint8_t *)p;
    c->side_bytes = bytes;
  }
  if ((size_t)E > c->experts_cap) {
    void **e = (void **)realloc(c->experts, (size_t)E * sizeof *e);
    if (!e)
      return MF_ERR(MF_ERR_OUT_OF_MEMORY, "cpu backend: no memory for %lld expert pointers", (long long)E);
    c->experts = e;
    c->experts_cap = (size_t)E;
  }
  return MF_OK;
}

/* Where the fp32 copy of [p, p + bytes) goes (top of the file): its image in
 * the shadow, or the next room of the side buffer at *used. */
static float *copy_at(cpu_impl *c, const void *p, size_t bytes, size_t *used) {
  if (in_shadow(c, p, bytes)) return c->shadow + ((const uint8_t *)p - c->arena) / 2;
  float *f = (float *)(c->side + *used);
  *used += (2 * bytes + SIDE_ALIGN - 1) / SIDE_ALIGN * SIDE_ALIGN;
  return f;
}

/* The call with its FLOAT operands replaced by widened fp32 copies. */
static mf_status widen_call(cpu_impl *c, const mf_kernel_call *k, mf_kernel_call *w) {
  const int64_t E = float_experts(k);
  size_t side = 0;
  for (int j = 0; j < MF_KBUF_MAX; j++)
    if (float_operand(k, j)) MF_CHECK(size_bf16(c, k, j, k->b[j].ptr, k->b[j].bytes, &side));
  for (int64_t e = 0; e < E; e++)
    if (k->experts[e]) MF_CHECK(size_bf16(c, k, 100 + (int)e, k->experts[e], k->expert_bytes, &side));
  MF_CHECK(reserve_bf16(c, side, E));
  *w = *k;
  size_t used = 0;
  for (int j = 0; j < MF_KBUF_MAX; j++) {
    if (!float_operand(k, j)) continue;
    const uint8_t *p = (const uint8_t *)k->b[j].ptr;
    float *f = NULL;
    /* Outside the arena an operand inside an earlier one shares its copy (in place). */
    for (int i = 0; i < j && !f && !in_shadow(c, p, k->b[j].bytes); i++) {
      const uint8_t *q = (const uint8_t *)k->b[i].ptr;
      if (float_operand(k, i) && p >= q && p + k->b[j].bytes <= q + k->b[i].bytes)
        f = (float *)w->b[i].ptr + (p - q) / 2;
    }
    if (!f) f = copy_at(c, p, k->b[j].bytes, &used);
    convert(c, k->b[j].ptr, f, k->b[j].bytes / 2, 0);
    w->b[j] = (mf_kbuf){f, 2 * k->b[j].bytes, k->b[j].write, MF_DTYPE_F32};
  }
  if (E == 0) return MF_OK;
  for (int64_t e = 0; e < E; e++) {
    c->experts[e] = k->experts[e] ? copy_at(c, k->experts[e], k->expert_bytes, &used) : NULL;
    if (c->experts[e]) convert(c, k->experts[e], (float *)c->experts[e], k->expert_bytes / 2, 0);
  }
  w->experts = c->experts;
  w->expert_bytes = 2 * k->expert_bytes;
  w->expert_dtype = MF_DTYPE_F32;
  return MF_OK;
}

/* A call with BF16 storage: the fp32 kernel with round_bf16 on the widened
 * copies, then every FLOAT operand it writes narrowed back. */
static mf_status run_bf16(cpu_impl *c, const mf_kernel_call *k) {
  mf_kernel_call w;
  MF_CHECK(widen_call(c, k, &w));
  mf_kctx x = c->kctx;
  x.round_bf16 = 1;
  MF_CHECK(run_kernel(c, &w, &x));
  const uint32_t writes = mf_kernel_writes(k);
  for (int j = 0; j < MF_KBUF_MAX; j++)
    if ((writes >> j & 1u) && float_operand(k, j)) convert(c, k->b[j].ptr, w.b[j].ptr, k->b[j].bytes / 2, 1);
  const int64_t E = mf_kernel_writes_experts(k->kind) ? float_experts(k) : 0;
  for (int64_t e = 0; e < E; e++)
    if (k->experts[e]) convert(c, k->experts[e], (float *)w.experts[e], k->expert_bytes / 2, 1);
  return MF_OK;
}

static void cpu_get_stats(mf_backend *b, mf_backend_stats *out) {
  *out = impl_of(b)->stats;
}

static void cpu_free(mf_backend *b) {
  cpu_impl *c = impl_of(b);
  if (c->arena) mf_backend_arena_held(-(int64_t)c->arena_bytes);
  free(c->arena);
  free(c->live);
  if (c->shadow) munmap(c->shadow, c->shadow_bytes);
  free(c->side);
  free(c->experts);
  free(c);
  free(b);
}

mf_status mf_backend_cpu_create(const mf_cpu_backend_opts *opts, mf_backend **out) {
  *out = NULL;
  mf_backend *b = (mf_backend *)calloc(1, sizeof *b);
  cpu_impl *c = (cpu_impl *)calloc(1, sizeof *c);
  if (!b || !c) {
    free(b);
    free(c);
    return MF_ERR(MF_ERR_OUT_OF_MEMORY, "cpu backend: out of memory");
  }
  if (opts) c->opts = *opts;
  if (c->opts.streams < MF_CPU_STREAMS_IMMEDIATE || c->opts.streams > MF_CPU_STREAMS_COPIES_FIRST) {
    const int mode = (int)c->opts.streams;
    free(b);
    free(c);
    return MF_ERR(MF_ERR_INVALID_ARG, "cpu backend: unknown streams mode %d", mode);
  }
  /* Deferred streams run work out of submission order: the liveness marks,
   * made in submission order, would poison memory queued work still reads. */
  if (c->opts.streams != MF_CPU_STREAMS_IMMEDIATE) c->opts.checking = 0;
  c->kctx.pool = c->opts.pool;
  c->kctx.round_bf16 = c->opts.round_bf16;
  *b = (mf_backend){
      /* .name = */ "cpu",
      /* .impl = */ c,
      /* .arena_create = */ cpu_arena_create,
      /* .host_alloc = */ cpu_host_alloc,
      /* .host_free = */ cpu_host_free,
      /* .stream_create = */ cpu_stream_create,
      /* .stream_free = */ cpu_stream_free,
      /* .stream_sync = */ cpu_stream_sync,
      /* .event_create = */ cpu_event_create,
      /* .event_free = */ cpu_event_free,
      /* .event_record = */ cpu_event_record,
      /* .stream_wait = */ cpu_stream_wait,
      /* .host_fn = */ cpu_host_fn,
      /* .event_query = */ cpu_event_query,
      /* .event_create_timed = */ cpu_event_create_timed,
      /* .event_elapsed = */ cpu_event_elapsed,
      /* .copy = */ cpu_copy,
      /* .run = */ cpu_run,
      /* .mark = */ cpu_mark,
      /* .get_stats = */ cpu_get_stats,
      /* .free = */ cpu_free,
      /* .host_register = */ cpu_host_register,
      /* .host_unregister = */ cpu_host_unregister,
      /* .native_stream = */ NULL, /* the device is host memory */
  };
  *out = b;
  return MF_OK;
}

void mf_backend_free(mf_backend *b) {
  if (b && b->free) b->free(b);
}
