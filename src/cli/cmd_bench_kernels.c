/* `moefit bench kernels CONFIG`: every distinct kernel call of CONFIG's
 * training step timed at its training shape on the config's backend, beside
 * two rooflines measured in the same run on the same backend: a dense GEMM
 * (linear_fwd in the storage dtype, 8192^3 on cuda, 1024^3 on cpu) and a
 * device-to-device copy (1 GiB on cuda, 256 MiB on cpu).
 *
 * The step. The run plan `moefit train CONFIG` would make, opened as train
 * opens it (src/train/run.h: the hardware profile auto measures where it has
 * none, the plan, the backend): its program in the storage train.precision decides (auto: BF16 on cuda) and
 * the chosen plan's schedule. The schedule's compute instructions are the
 * calls the executor submits in one step: each op's RUN (a recomputed forward
 * op again; GRAD_SUMSQ and ADAMW only for the parameters whose optimizer the
 * plan puts on the device), the gradient slots' ZERO and the gradient sums'
 * ACCUM (add). They are grouped under the key `moefit profile --config`
 * records them by (planner/simulate.h mf_sim_instr_key: the kernel, its sizes
 * i[], its operand bytes): each key is timed once, on its first call, and
 * counted with its number of calls.
 *
 * Operands. One arena on the backend, as large as the largest call's operand
 * tensors (each tensor once, aligned to 256 bytes, expert weights included)
 * after the routing fixture below, or the rooflines' buffers if larger. Each
 * call's tensors are laid out after the fixture with their program dtypes,
 * and filled through a host buffer and H2D copies:
 *   floats (storage dtype, fp32, f64)  uniform in [-0.5, 0.5), bf16-representable;
 *   operands a call only writes       not filled: it overwrites them;
 *   ADAMW's state                     zero (moments 0: a valid state);
 *   token ids and targets             uniform in [0, V);
 *   positions                         token index mod S;
 *   routing (topk_idx, counts, offsets, row_of, token_of_row, and the
 *   router's probs and topk_w)        copied (D2D) from the fixture: the
 *                                     program's first router_fwd, run once on
 *                                     random logits, and its moe_dispatch run
 *                                     on that output — so every index a kernel
 *                                     reads is one the forward chain makes.
 * A read integer operand that none of these covers is an error, never timed
 * on garbage. The runtime scalars get plausible values: the cross-entropy's
 * loss scale 1 / (G T), AdamW's step 1 with its usual hyperparameters.
 *
 * Timing. One warm-up call, then R calls (--reps, default 5), each between two
 * timed events on the stream (event_create_timed; on a backend without them
 * wall time around the call and a stream_sync); the best is kept.
 *
 * Per key: calls per step, ms per call, FLOP (the program op's flops; add: one
 * per element), bytes moved (each operand's bytes once per role the operand
 * table gives it in the call: read, written, or both; an embedding table only
 * in the min(T, V) rows the tokens can touch, grad_sumsq's sums only in the
 * chunk sums it writes), the achieved rate and its ratio
 * to the roofline: GEMM-like kinds (linear_*, expert_*, attn_*,
 * cross_entropy) in TFLOP/s against the GEMM's, the others in GB/s against
 * the copy's (read + write bytes per second), and the key's share of the
 * step's summed time (copies and the host optimizer are not in it).
 *
 * Copies (src/cli/bench_copies.c), after the kernels, in the arena's first
 * 2 x the copy roofline's bytes: one host<->device copy of those bytes each
 * way from host_alloc memory (pinned on cuda) alone, both at once on two
 * streams (the aggregate and each direction's rate), and the same bytes of
 * pageable memory through staging slabs with the executor's own slab code
 * (src/exec/exec.h mf_exec_stager) — the slab size, slabs in flight and host
 * threads of the run (the chosen plan's staging layout and train's thread
 * count; the layout's default slab, two in flight, when the plan stages
 * nothing) — each staged rate with its ratio to the pinned copy of its
 * direction. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/registry.h"
#include "planner/run_plan.h"
#include "planner/simulate.h"
#include "src/cli/bench_copies.h"
#include "src/cli/commands.h"
#include "src/config/config.h"
#include "src/train/run.h"

const char mf_cli_bench_kernels_usage[] =
    "usage: moefit bench kernels CONFIG [key=value ...] [--reps R] [--json FILE]\n"
    "\n"
    "kernels: times each distinct kernel call of CONFIG's training step at its training\n"
    "shape on the config's backend (backend: auto|cpu|cuda) in the storage dtype the run\n"
    "uses (train.precision; auto: bf16 on cuda), beside a dense GEMM (linear_fwd, 8192^3 on\n"
    "cuda, 1024^3 on cpu) and a device-to-device copy (1 GiB on cuda, 256 MiB on cpu)\n"
    "measured in the same run. The calls are the chosen plan's (what `moefit train CONFIG`\n"
    "runs, `moefit plan CONFIG` shows it), grouped by kernel, sizes and operand bytes: each\n"
    "group is timed once and counted with its calls per step. One table, one row per group:\n"
    "calls per step, ms per call, FLOP, bytes moved (each operand once per role: read,\n"
    "written or both), the achieved TFLOP/s (linear_*, expert_*, attn_*, cross_entropy:\n"
    "against the GEMM's) or GB/s (the others: against the copy's, read + write bytes), the\n"
    "ratio to that roofline, and the share of the step's summed kernel time; then one line:\n"
    "  kernels: step <ms> ms; gemm roofline <X> TFLOP/s; copy <Y> GB/s\n"
    "On cuda it names the kernel the expert GEMMs ran on (the plan's: kernels.expert_gemm, mma.sync\n"
    "by default; cutlass is CUTLASS's sm90 grouped GEMM on wgmma + TMA) and, where the\n"
    "other kernel is available (an sm_90 GPU, a build with CUTLASS's headers), times the same\n"
    "expert calls on it: ms on each, its rate and ratio to the roofline, the speed-up. The same\n"
    "for attention (kernels.attention, mma.sync by default; cudnn is cuDNN's fused flash kernels,\n"
    "available where libcudnn.so.9 loads; with cudnn chosen, plan and train reserve its\n"
    "backward's workspace in the kernel scratch, and bench does too).\n"
    "Then the copies, in the same run on the same backend, bytes moved per second: rows h2d\n"
    "pinned, d2h pinned (one copy of the D2D copy's bytes each way from host_alloc memory,\n"
    "pinned on cuda), h2d+d2h pinned (both at once on two streams: the aggregate and each\n"
    "direction's), h2d staged, d2h staged (pageable host memory through staging slabs with the\n"
    "executor's own fill and copy-out code, with the ratio to the pinned copy of the same\n"
    "direction). The slabs are the run's: the chosen plan's staging layout (memory.staging;\n"
    "its slab size and most slabs busy at once) and the host threads train gives the fills and\n"
    "copy-outs on the backend; a plan that stages nothing gets 64 MiB slabs, two in flight\n"
    "(the line above the rows says which). It ends with one line:\n"
    "  copies: h2d staged <r> of pinned, d2h staged <r> of pinned; h2d+d2h pinned <Z> GB/s\n"
    "Operands hold small random values; token ids, positions and the routing indices are\n"
    "valid (the routing from the router and dispatch kernels run once on random logits).\n"
    "\n"
    "  --reps R      timed calls per kernel after one warm-up, the best kept (default 5)\n"
    "  --json FILE   also write the rows, the rooflines, the step and the copies as JSON\n"
    "\n"
    "Exit status 1: the config does not load, the backend cannot be created (backend=cuda\n"
    "without a GPU, or a build without CUDA), or a kernel or a copy fails; 2: a usage error.\n"
    "\n"
    "example (the demo's step on the cpu backend, a few seconds):\n"
    "  moefit bench kernels configs/demo.yaml backend=cpu --reps 2 --json runs/bench/demo-kernels.json\n";

#define ALIGN 256
#define FILL_CHUNK ((size_t)8 << 20) /* host staging for the fills: bytes per H2D */
#define MAX_OVERRIDES 256
#define MAX_ROUTING 9 /* router_fwd's 4 operands and moe_dispatch's 5 */

/* ------------------------------------------------------------ the bench */

typedef struct bench {
  const mf_program *p;
  mf_backend *b;
  mf_stream *s;
  mf_event *e0, *e1; /* timed events; NULL: wall time */
  uint8_t *arena;
  size_t arena_bytes;
  void *host; /* FILL_CHUNK bytes of host staging */
  uint32_t seed;
  int reps;
  /* The routing fixture: operands of the router and dispatch, by name. */
  int n_routing;
  const char *routing_name[MAX_ROUTING];
  void *routing_ptr[MAX_ROUTING];
  size_t routing_bytes[MAX_ROUTING];
  void **expert_ptrs; /* [spec.experts] */
} bench;

static size_t align_up(size_t n) {
  return (n + ALIGN - 1) / ALIGN * ALIGN;
}

/* A call before its operands are placed: its kind, operand tensors and sizes. */
typedef struct callspec {
  mf_kernel kind;
  int32_t t[MF_KBUF_MAX]; /* operand tensors, -1 absent */
  const int32_t *experts; /* E expert weight tensors, or NULL */
  int64_t i[8];
  double f[6];
  double flops;
  const char *label;
} callspec;

static void spec_of_op(const mf_program *p, int32_t k, callspec *c) {
  const mf_pop *o = &p->ops[k];
  memset(c, 0, sizeof *c);
  c->kind = o->kind;
  memcpy(c->t, o->t, sizeof c->t);
  c->experts = o->experts_at >= 0 ? p->id_pool + o->experts_at : NULL;
  memcpy(c->i, o->i, sizeof c->i);
  memcpy(c->f, o->f, sizeof c->f);
  c->flops = o->flops;
  c->label = o->label;
}

/* Compute instruction i of s as the executor submits it (src/exec/exec.c). */
static void spec_of_instr(const mf_schedule *s, int32_t i, callspec *c) {
  const mf_instr *in = &s->instr[i];
  if (in->kind == MF_I_RUN) {
    spec_of_op(s->prog, in->op, c);
    return;
  }
  memset(c, 0, sizeof *c);
  for (int j = 0; j < MF_KBUF_MAX; j++) c->t[j] = -1;
  c->t[0] = s->slots[in->slot].tensor;
  if (in->kind == MF_I_ZERO) {
    c->kind = MF_K_ZERO;
    c->label = "zero gradient slot";
    return;
  }
  c->kind = MF_K_ADD; /* MF_I_ACCUM: slot added into slot2, fp32 */
  c->t[1] = s->slots[in->slot2].tensor;
  c->i[0] = s->prog->tensors[c->t[0]].numel;
  c->i[1] = 1;
  c->flops = (double)c->i[0];
  c->label = "accumulate gradient";
}

/* The bytes c's distinct tensors take laid out from an aligned start. */
static size_t spec_bytes(const mf_program *p, const callspec *c) {
  size_t n = 0;
  for (int j = 0; j < MF_KBUF_MAX; j++) {
    int dup = c->t[j] < 0;
    for (int k = 0; k < j && !dup; k++) dup = c->t[k] == c->t[j];
    if (!dup) n += align_up(p->tensors[c->t[j]].bytes);
  }
  for (int64_t e = 0; c->experts && e < p->spec.experts; e++)
    n += c->experts[e] >= 0 ? align_up(p->tensors[c->experts[e]].bytes) : 0; /* -1: a cold expert's adapter */
  return n;
}

/* The call of c with its tensors laid out from `base` (each once); *used gets
 * the bytes taken. Runtime scalars get plausible values (top of the file). */
static void lay_out(bench *k, const callspec *c, uint8_t *base, mf_kernel_call *call, size_t *used) {
  const mf_program *p = k->p;
  memset(call, 0, sizeof *call);
  call->kind = c->kind;
  call->label = c->label;
  memcpy(call->i, c->i, sizeof call->i);
  memcpy(call->f, c->f, sizeof call->f);
  const uint32_t writes = mf_kernel_writes(call);
  size_t off = 0;
  for (int j = 0; j < MF_KBUF_MAX; j++) {
    if (c->t[j] < 0) continue;
    const mf_ptensor *t = &p->tensors[c->t[j]];
    void *ptr = NULL;
    for (int q = 0; q < j && !ptr; q++)
      if (c->t[q] == c->t[j]) ptr = call->b[q].ptr; /* the same tensor twice: in place */
    if (!ptr) {
      ptr = base + off;
      off += align_up(t->bytes);
    }
    call->b[j] = (mf_kbuf){ptr, t->bytes, (int)(writes >> j & 1u), t->dtype};
  }
  if (c->experts) {
    const mf_ptensor *first = NULL; /* a cold expert's adapter (-1) is NULL, as the executor passes it */
    for (int64_t e = 0; e < p->spec.experts; e++) {
      k->expert_ptrs[e] = c->experts[e] >= 0 ? base + off : NULL;
      if (c->experts[e] < 0) continue;
      off += align_up(p->tensors[c->experts[e]].bytes);
      if (!first) first = &p->tensors[c->experts[e]];
    }
    call->experts = k->expert_ptrs;
    call->expert_bytes = first ? first->bytes : 0;
    call->expert_dtype = first ? first->dtype : MF_DTYPE_F32;
  }
  if (c->kind == MF_K_CROSS_ENTROPY && c->f[0] == MF_PROGRAM_LOSS_SCALE_RUNTIME)
    call->f[0] = 1.0 / ((double)p->G * (double)(p->B * p->S));
  if (c->kind == MF_K_ADAMW) {
    const double h[6] = {1e-4, 0.9, 0.999, 1e-8, 0.01, 1.0}; /* lr, betas, eps, decay, clip coef */
    call->i[1] = 1;
    memcpy(call->f, h, sizeof h);
  }
  *used = off;
}

/* ------------------------------------------------------------ filling */

typedef enum gen { GEN_ZERO = 0, GEN_RANDOM, GEN_MOD_V, GEN_POSITIONS } gen;

static uint32_t lcg(uint32_t *s) {
  *s = *s * 1664525u + 1013904223u;
  return *s >> 8;
}

/* Element e of a fill, written at dst in dtype dt (random values are
 * bf16-representable, so every storage holds the same numbers). */
static void gen_one(bench *k, gen g, int64_t mod, mf_dtype dt, size_t e, uint8_t *dst) {
  double v = 0;
  if (g == GEN_RANDOM)
    v = mf_bf16_to_fp32(mf_fp32_to_bf16((float)((double)lcg(&k->seed) / 16777216.0 - 0.5)));
  if (g == GEN_MOD_V) v = (double)(lcg(&k->seed) % (uint32_t)mod);
  if (g == GEN_POSITIONS) v = (double)(e % (size_t)mod);
  switch (dt) {
    case MF_DTYPE_F32:
      *(float *)dst = (float)v;
      break;
    case MF_DTYPE_BF16:
      *(uint16_t *)dst = mf_fp32_to_bf16((float)v);
      break;
    case MF_DTYPE_F64:
      *(double *)dst = v;
      break;
    case MF_DTYPE_I32:
      *(int32_t *)dst = (int32_t)v;
      break;
    case MF_DTYPE_I64:
      *(int64_t *)dst = (int64_t)v;
      break;
    default:
      memset(dst, 0, mf_dtype_size(dt));
      break;
  }
}

/* dst (bytes of dtype dt on the device) = the generated values, through the
 * host staging, one chunk at a time. */
static mf_status fill(bench *k, void *dst, size_t bytes, mf_dtype dt, gen g, int64_t mod, const char *what) {
  const size_t es = mf_dtype_size(dt) ? mf_dtype_size(dt) : 1;
  if (g != GEN_ZERO && dt != MF_DTYPE_F32 && dt != MF_DTYPE_BF16 && dt != MF_DTYPE_F64 &&
      dt != MF_DTYPE_I32 && dt != MF_DTYPE_I64)
    return MF_ERR(MF_ERR_INTERNAL, "bench kernels: %s: no values to fill a %s operand with", what,
                  mf_dtype_name(dt));
  if ((g == GEN_MOD_V || g == GEN_POSITIONS) && mod < 1)
    return MF_ERR(MF_ERR_INTERNAL, "bench kernels: %s: no range for its indices", what);
  for (size_t done = 0; done < bytes;) {
    const size_t n = bytes - done < FILL_CHUNK ? bytes - done : FILL_CHUNK;
    uint8_t *h = k->host;
    if (g == GEN_ZERO)
      memset(h, 0, n);
    else
      for (size_t o = 0; o + es <= n; o += es) gen_one(k, g, mod, dt, (done + o) / es, h + o);
    MF_CHECK(k->b->copy(k->b, (uint8_t *)dst + done, h, n, MF_COPY_H2D, k->s));
    MF_CHECK(k->b->stream_sync(k->b, k->s)); /* before the chunk is reused */
    done += n;
  }
  return MF_OK;
}

/* Index of a routing operand called `name` in the fixture, or -1. */
static int routing_find(const bench *k, const char *name) {
  for (int r = 0; r < k->n_routing; r++)
    if (strcmp(k->routing_name[r], name) == 0) return r;
  return -1;
}

/* Operand j of call: its values by its role and name (top of the file). */
static mf_status fill_operand(bench *k, const mf_kernel_call *call, int j) {
  const mf_kop *op = &mf_kernel_info_of(call->kind)->b[j];
  const mf_kbuf *kb = &call->b[j];
  const int read = (int)(mf_kernel_reads(call) >> j & 1u);
  const int is_int = op->type == MF_KT_I32 || op->type == MF_KT_I64;
  const int r = routing_find(k, op->name);
  char what[160];
  snprintf(what, sizeof what, "kernel %s (%s) operand %s", mf_kernel_name(call->kind),
           call->label ? call->label : "", op->name);
  if (!read) return MF_OK; /* the call overwrites it */
  if (op->type == MF_KT_BYTES) return fill(k, kb->ptr, kb->bytes, kb->dtype, GEN_ZERO, 0, what);
  if (is_int && (!strcmp(op->name, "ids") || !strcmp(op->name, "target")))
    return fill(k, kb->ptr, kb->bytes, kb->dtype, GEN_MOD_V, call->i[1], what); /* i[1] = V (embed, CE) */
  if (is_int && !strcmp(op->name, "pos"))
    return fill(k, kb->ptr, kb->bytes, kb->dtype, GEN_POSITIONS, k->p->S, what);
  if (r >= 0 && (is_int || op->type == MF_KT_F32)) {
    if (k->routing_bytes[r] != kb->bytes)
      return MF_ERR(MF_ERR_INTERNAL, "bench kernels: %s has %zu bytes, the routing's %zu", what, kb->bytes,
                    k->routing_bytes[r]);
    MF_CHECK(k->b->copy(k->b, kb->ptr, k->routing_ptr[r], kb->bytes, MF_COPY_D2D, k->s));
    return k->b->stream_sync(k->b, k->s);
  }
  if (is_int) return MF_ERR(MF_ERR_INTERNAL, "bench kernels: %s: no valid values for these indices", what);
  return fill(k, kb->ptr, kb->bytes, kb->dtype, GEN_RANDOM, 0, what);
}

static mf_status fill_call(bench *k, const mf_kernel_call *call) {
  const uint32_t reads = mf_kernel_reads(call);
  for (int j = 0; j < MF_KBUF_MAX; j++) {
    if (!call->b[j].ptr) continue;
    int dup = 0; /* a tensor passed twice is filled for its first operand that is read */
    for (int q = 0; q < j; q++) dup |= call->b[q].ptr == call->b[j].ptr && (reads >> q & 1u);
    if (!dup) MF_CHECK(fill_operand(k, call, j));
  }
  for (int64_t e = 0; call->experts && e < k->p->spec.experts; e++)
    if (call->experts[e])
      MF_CHECK(
          fill(k, call->experts[e], call->expert_bytes, call->expert_dtype, GEN_RANDOM, 0, "expert weight"));
  return MF_OK;
}

/* The first op of `kind` laid out at base, filled and run once; its operands
 * join the routing fixture by name. *used: its bytes. */
static mf_status routing_step(bench *k, mf_kernel kind, uint8_t *base, size_t *used) {
  *used = 0;
  int32_t op = -1;
  for (int32_t o = 0; o < k->p->n_ops && op < 0; o++)
    if (k->p->ops[o].kind == kind) op = o;
  if (op < 0) return MF_OK; /* no MoE layer: nothing to route */
  callspec c;
  mf_kernel_call call;
  spec_of_op(k->p, op, &c);
  lay_out(k, &c, base, &call, used);
  MF_CHECK(fill_call(k, &call));
  MF_CHECK(k->b->run(k->b, &call, k->s));
  MF_CHECK(k->b->stream_sync(k->b, k->s));
  for (int j = 0; j < mf_kernel_n_operands(kind) && k->n_routing < MAX_ROUTING; j++) {
    const char *name = mf_kernel_info_of(kind)->b[j].name;
    if (!call.b[j].ptr || routing_find(k, name) >= 0) continue;
    k->routing_name[k->n_routing] = name;
    k->routing_ptr[k->n_routing] = call.b[j].ptr;
    k->routing_bytes[k->n_routing++] = call.b[j].bytes;
  }
  return MF_OK;
}

/* The routing fixture at the arena's start; *used: its bytes. */
static mf_status routing_make(bench *k, size_t *used) {
  size_t a = 0, b = 0;
  MF_CHECK(routing_step(k, MF_K_ROUTER_FWD, k->arena, &a));
  MF_CHECK(routing_step(k, MF_K_MOE_DISPATCH, k->arena + a, &b));
  *used = a + b;
  return MF_OK;
}

/* The fixture's bytes, before the arena exists. */
static size_t routing_bytes_needed(const mf_program *p) {
  size_t n = 0;
  const mf_kernel kinds[2] = {MF_K_ROUTER_FWD, MF_K_MOE_DISPATCH};
  for (int q = 0; q < 2; q++)
    for (int32_t o = 0; o < p->n_ops; o++)
      if (p->ops[o].kind == kinds[q]) {
        callspec c;
        spec_of_op(p, o, &c);
        n += spec_bytes(p, &c);
        break;
      }
  return n;
}

/* ------------------------------------------------------------ timing */

/* One call of work: a kernel, or a copy. */
typedef struct job {
  const mf_kernel_call *call; /* NULL: the copy */
  void *dst;
  const void *src;
  size_t bytes;
} job;

static mf_status submit(bench *k, const job *j) {
  if (j->call) return k->b->run(k->b, j->call, k->s);
  return k->b->copy(k->b, j->dst, j->src, j->bytes, MF_COPY_D2D, k->s);
}

/* Best seconds of one submission: a warm-up, then k->reps timed ones. */
static mf_status best_seconds(bench *k, const job *j, double *best) {
  MF_CHECK(submit(k, j));
  MF_CHECK(k->b->stream_sync(k->b, k->s));
  *best = INFINITY;
  for (int r = 0; r < k->reps; r++) {
    double t = 0, t0 = mf_time_now();
    if (k->e0) MF_CHECK(k->b->event_record(k->b, k->e0, k->s));
    MF_CHECK(submit(k, j));
    if (k->e1) MF_CHECK(k->b->event_record(k->b, k->e1, k->s));
    MF_CHECK(k->b->stream_sync(k->b, k->s));
    if (k->e0)
      MF_CHECK(k->b->event_elapsed(k->b, k->e0, k->e1, &t));
    else
      t = mf_time_now() - t0;
    if (t < *best) *best = t;
  }
  if (!(*best > 0)) *best = 1e-9; /* below the clock: keep the rates finite */
  return MF_OK;
}

/* ------------------------------------------------------------ rooflines */

typedef struct roofline {
  int64_t gemm_n;    /* M = N = K */
  double gemm_s;     /* seconds of one */
  double gemm_rate;  /* FLOP/s */
  size_t copy_bytes; /* bytes copied */
  double copy_s;
  double copy_rate; /* read + write bytes per second */
} roofline;

static int on_cuda(const bench *k) {
  return strcmp(k->b->name, "cuda") == 0;
}

static void roofline_sizes(const bench *k, roofline *rl) {
  rl->gemm_n = on_cuda(k) ? 8192 : 1024;
  rl->copy_bytes = on_cuda(k) ? (size_t)1 << 30 : (size_t)256 << 20;
}

static size_t roofline_bytes(const roofline *rl, size_t es) {
  const size_t g = 3 * align_up((size_t)(rl->gemm_n * rl->gemm_n) * es);
  return g > 2 * rl->copy_bytes ? g : 2 * rl->copy_bytes;
}

static mf_status measure_rooflines(bench *k, roofline *rl) {
  const mf_dtype dt = k->p->storage;
  const int64_t n = rl->gemm_n;
  const size_t mat = (size_t)(n * n) * mf_dtype_size(dt);
  mf_kernel_call g;
  memset(&g, 0, sizeof g);
  g.kind = MF_K_LINEAR_FWD;
  g.label = "roofline gemm";
  g.i[0] = g.i[1] = g.i[2] = n;
  g.b[0] = (mf_kbuf){k->arena, mat, 0, dt};
  g.b[1] = (mf_kbuf){k->arena + align_up(mat), mat, 0, dt};
  g.b[3] = (mf_kbuf){k->arena + 2 * align_up(mat), mat, 1, dt};
  MF_CHECK(fill(k, g.b[0].ptr, mat, dt, GEN_RANDOM, 0, "roofline gemm x"));
  MF_CHECK(fill(k, g.b[1].ptr, mat, dt, GEN_RANDOM, 0, "roofline gemm W"));
  const job gj = {&g, NULL, NULL, 0};
  MF_CHECK(best_seconds(k, &gj, &rl->gemm_s));
  rl->gemm_rate = 2.0 * (double)n * (double)n * (double)n / rl->gemm_s;
  const job cj = {NULL, k->arena + rl->copy_bytes, k->arena, rl->copy_bytes};
  MF_CHECK(best_seconds(k, &cj, &rl->copy_s));
  rl->copy_rate = 2.0 * (double)rl->copy_bytes / rl->copy_s;
  return MF_OK;
}

/* ------------------------------------------------------------ the step's kernels */

typedef struct kkey {
  const char *kernel;
  int64_t sizes[8];
  int n_sizes;
  double key_bytes; /* mf_sim_instr_key's: part of the key */
  int32_t instr;    /* its first call */
  int64_t calls;
  mf_kernel kind;
  double seconds, flops, bytes; /* per call */
  int gemm_like;
} kkey;

static int gemm_like(mf_kernel kind) {
  switch (kind) {
    case MF_K_LINEAR_FWD:
    case MF_K_LINEAR_BWD_DATA:
    case MF_K_LINEAR_BWD_WEIGHT:
    case MF_K_EXPERT_FWD:
    case MF_K_EXPERT_BWD_DATA:
    case MF_K_EXPERT_BWD_WEIGHT:
    case MF_K_ATTN_FWD:
    case MF_K_ATTN_BWD:
    case MF_K_CROSS_ENTROPY:
      return 1;
    default:
      return 0;
  }
}

/* Bytes a call moves: each operand once per role (read, written); an
 * embedding table only in the rows the tokens can touch; of grad_sumsq's
 * sums (every parameter's) only the chunk sums it writes. */
static double moved_bytes(const mf_kernel_call *c) {
  const uint32_t rd = mf_kernel_reads(c), wr = mf_kernel_writes(c);
  const int table = c->kind == MF_K_EMBED_FWD ? 1 : c->kind == MF_K_EMBED_BWD ? 2 : -1;
  double sum = 0;
  for (int j = 0; j < MF_KBUF_MAX; j++) {
    if (!c->b[j].ptr) continue;
    double b = (double)c->b[j].bytes;
    if (j == table && c->i[1] > c->i[0]) b = b / (double)c->i[1] * (double)c->i[0];
    if (c->kind == MF_K_GRAD_SUMSQ && j == 1)
      b = 8.0 * (double)((c->i[0] + 65535) / 65536); /* its chunk sums */
    sum += b * (double)((rd >> j & 1u) + (wr >> j & 1u));
  }
  for (int64_t e = 0; c->experts && e < c->i[0]; e++) /* i[0] = E weights (NULL: a cold expert's adapter) */
    if (c->experts[e])                                /* read, or added into by expert_bwd_weight */
      sum += (double)c->expert_bytes * (mf_kernel_writes_experts(c->kind) ? 2.0 : 1.0);
  return sum;
}

/* The schedule's compute instructions grouped by key (top of the file). */
static mf_status collect_keys(const mf_schedule *s, kkey **out, int *n_out, int64_t *n_calls) {
  kkey *keys = NULL;
  int n = 0;
  *n_calls = 0;
  MF_CHECK(mf_calloc((size_t)s->n_instr + 1, sizeof *keys, "kernel keys", (void **)&keys));
  for (int32_t i = 0; i < s->n_instr; i++) {
    kkey q;
    memset(&q, 0, sizeof q);
    if (!mf_sim_instr_key(s, i, &q.kernel, q.sizes, &q.n_sizes, &q.key_bytes)) continue;
    ++*n_calls;
    while (q.n_sizes > 0 && q.sizes[q.n_sizes - 1] == 0) q.n_sizes--;
    int j = 0;
    for (; j < n; j++)
      if (!strcmp(keys[j].kernel, q.kernel) && keys[j].n_sizes == q.n_sizes &&
          keys[j].key_bytes == q.key_bytes && !memcmp(keys[j].sizes, q.sizes, sizeof q.sizes))
        break;
    if (j == n) {
      q.instr = i;
      keys[n++] = q;
    }
    keys[j].calls++;
  }
  *out = keys;
  *n_out = n;
  return MF_OK;
}

/* The arena the bench needs: the fixture and the largest call, or the rooflines. */
static size_t arena_needed(const mf_schedule *s, const kkey *keys, int n, const roofline *rl) {
  size_t most = 0;
  for (int j = 0; j < n; j++) {
    callspec c;
    spec_of_instr(s, keys[j].instr, &c);
    const size_t b = spec_bytes(s->prog, &c);
    if (b > most) most = b;
  }
  const size_t calls = routing_bytes_needed(s->prog) + most,
               roof = roofline_bytes(rl, mf_dtype_size(s->prog->storage));
  return calls > roof ? calls : roof;
}

static mf_status time_key(bench *k, const mf_schedule *s, uint8_t *base, kkey *q) {
  callspec c;
  mf_kernel_call call;
  size_t used;
  spec_of_instr(s, q->instr, &c);
  lay_out(k, &c, base, &call, &used);
  MF_CHECK(fill_call(k, &call));
  const job j = {&call, NULL, NULL, 0};
  MF_CHECK(best_seconds(k, &j, &q->seconds));
  q->kind = call.kind;
  q->flops = c.flops;
  q->bytes = moved_bytes(&call);
  q->gemm_like = gemm_like(call.kind);
  return MF_OK;
}

static int expert_kind(mf_kernel kind) {
  return kind == MF_K_EXPERT_FWD || kind == MF_K_EXPERT_BWD_DATA || kind == MF_K_EXPERT_BWD_WEIGHT;
}

static int attention_kind(mf_kernel kind) {
  return kind == MF_K_ATTN_FWD || kind == MF_K_ATTN_BWD;
}

/* Kernels a cuda backend has two of (kernels/registry.h): the one it runs
 * ("mma.sync" or the other's words) and the switch by name. */
typedef struct kernel_choice {
  const char *what;     /* "expert GEMMs" */
  const char *json_key; /* its name in the --json file */
  const char *other;    /* the switch's name of the kernel that is not mma ("cutlass") */
  int (*is)(mf_kernel kind);
  const char *(*get)(const mf_backend *b);
  mf_status (*set)(mf_backend *b, const char *name);
} kernel_choice;

static const kernel_choice kChoices[] = {
    {"expert GEMMs", "expert_gemm", "cutlass", expert_kind, mf_backend_expert_gemm,
     mf_backend_set_expert_gemm},
    {"attention", "attention", "cudnn", attention_kind, mf_backend_attention, mf_backend_set_attention},
};
#define N_CHOICES ((int)(sizeof kChoices / sizeof kChoices[0]))

/* One choice's keys timed again on its other kernel. */
typedef struct alt_rows {
  kkey *keys;
  int n;
  char other[64]; /* the other kernel, in words */
  char why[512];  /* when there is no other: why, when there is a reason worth printing */
} alt_rows;

/* The keys of choice c timed again on the backend's other kernel (cuda, where
 * both are available), the backend's own choice restored after. a->n = 0 when
 * there is no other. */
static mf_status time_other(bench *k, const mf_schedule *s, uint8_t *base, const kkey *keys, int n,
                            const kernel_choice *c, alt_rows *a) {
  memset(a, 0, sizeof *a);
  const char *cur = c->get(k->b);
  int m = 0;
  for (int j = 0; j < n; j++) m += c->is(keys[j].kind);
  if (!cur || m == 0) return MF_OK;
  const int on_mma = strcmp(cur, "mma.sync") == 0;
  if (c->set(k->b, on_mma ? c->other : "mma") != MF_OK) {
    snprintf(a->why, sizeof a->why, "%s", mf_last_error());
    return MF_OK;
  }
  snprintf(a->other, sizeof a->other, "%s", c->get(k->b));
  mf_status st = mf_calloc((size_t)m, sizeof *a->keys, "rows on the other kernel", (void **)&a->keys);
  for (int j = 0; st == MF_OK && j < n; j++) {
    if (!c->is(keys[j].kind)) continue;
    a->keys[a->n] = keys[j];
    st = time_key(k, s, base, &a->keys[a->n++]);
  }
  const mf_status back = c->set(k->b, on_mma ? "mma" : c->other);
  return st != MF_OK ? st : back;
}

/* ------------------------------------------------------------ report */

/* The achieved rate in its unit, and its ratio to the roofline. */
static void rate_of(const kkey *q, const roofline *rl, double *achieved, double *ratio) {
  if (q->gemm_like) {
    *achieved = q->flops / q->seconds / 1e12;
    *ratio = q->flops / q->seconds / rl->gemm_rate;
  } else {
    *achieved = q->bytes / q->seconds / 1e9;
    *ratio = q->bytes / q->seconds / rl->copy_rate;
  }
}

/* "M=4096 N=1024 K=1024": the key's sizes by the operand table's names. */
static const char *sizes_text(const kkey *q, char *buf, size_t cap) {
  const mf_kernel_info *info = mf_kernel_info_of(q->kind);
  size_t o = 0;
  buf[0] = '\0';
  for (int i = 0; i < q->n_sizes && o < cap; i++)
    o += info && info->i[i]
             ? (size_t)snprintf(buf + o, cap - o, "%s%s=%lld", i ? " " : "", info->i[i],
                                (long long)q->sizes[i])
             : (size_t)snprintf(buf + o, cap - o, "%si%d=%lld", i ? " " : "", i, (long long)q->sizes[i]);
  if (!q->n_sizes) snprintf(buf, cap, "-");
  return buf;
}

/* 1234567 -> "1.23 M": FLOP counts in SI prefixes. */
static const char *si(double v, char *buf, size_t cap) {
  static const char *const pre[] = {"", "K", "M", "G", "T", "P"};
  int u = 0;
  while (fabs(v) >= 999.5 && u < 5) {
    v /= 1000.0;
    u++;
  }
  snprintf(buf, cap, "%.3g %s", v, pre[u]);
  return buf;
}

static int cmp_total(const void *a, const void *b) {
  const kkey *x = a, *y = b;
  const double tx = x->seconds * (double)x->calls, ty = y->seconds * (double)y->calls;
  return tx > ty ? -1 : tx < ty ? 1 : strcmp(x->kernel, y->kernel);
}

static mf_status print_table(const kkey *keys, int n, const roofline *rl, double step_s) {
  mf_table *tb = NULL;
  MF_CHECK(mf_table_create("llrrrrrrr", &tb));
  static const char *const head[] = {"kernel", "sizes",    "calls",       "ms/call", "FLOP",
                                     "bytes",  "achieved", "of roofline", "share"};
  for (size_t i = 0; i < sizeof head / sizeof head[0]; i++) mf_table_cell(tb, "%s", head[i]);
  for (int j = 0; j < n; j++) {
    const kkey *q = &keys[j];
    char sz[160], fl[32], by[32];
    double achieved, ratio;
    rate_of(q, rl, &achieved, &ratio);
    mf_table_cell(tb, "%s", q->kernel);
    mf_table_cell(tb, "%s", sizes_text(q, sz, sizeof sz));
    mf_table_cell(tb, "%lld", (long long)q->calls);
    mf_table_cell(tb, "%.4f", q->seconds * 1e3);
    mf_table_cell(tb, "%s", si(q->flops, fl, sizeof fl));
    mf_table_cell(tb, "%s", mf_format_bytes((uint64_t)q->bytes, by, sizeof by));
    mf_table_cell(tb, q->gemm_like ? "%.3g TFLOP/s" : "%.3g GB/s", achieved);
    mf_table_cell(tb, "%.3f %s", ratio, q->gemm_like ? "gemm" : "copy");
    mf_table_cell(tb, "%.1f%%", 100.0 * q->seconds * (double)q->calls / step_s);
  }
  mf_status st = mf_table_print(tb, stdout, "  ");
  mf_table_free(tb);
  return st;
}

/* Each key of a choice on both kernels: ms per call, the other's rate and its
 * ratio to the roofline, and the speed-up. */
static mf_status print_compare(const kkey *keys, int n, const kkey *alt, int n_alt, const char *cur,
                               const char *other, const roofline *rl) {
  mf_table *tb = NULL;
  MF_CHECK(mf_table_create("llrrrrr", &tb));
  mf_table_cell(tb, "kernel");
  mf_table_cell(tb, "sizes");
  mf_table_cell(tb, "ms (%s)", cur);
  mf_table_cell(tb, "ms (%s)", other);
  mf_table_cell(tb, "achieved");
  mf_table_cell(tb, "of roofline");
  mf_table_cell(tb, "speed-up");
  for (int a = 0; a < n_alt; a++) {
    const kkey *q = &alt[a], *p = NULL;
    for (int j = 0; j < n && !p; j++)
      if (keys[j].instr == q->instr) p = &keys[j];
    if (!p) continue;
    char sz[160];
    double achieved, ratio;
    rate_of(q, rl, &achieved, &ratio);
    mf_table_cell(tb, "%s", q->kernel);
    mf_table_cell(tb, "%s", sizes_text(q, sz, sizeof sz));
    mf_table_cell(tb, "%.4f", p->seconds * 1e3);
    mf_table_cell(tb, "%.4f", q->seconds * 1e3);
    mf_table_cell(tb, "%.3g TFLOP/s", achieved);
    mf_table_cell(tb, "%.3f gemm", ratio);
    mf_table_cell(tb, "%.2fx", p->seconds / q->seconds);
  }
  mf_status st = mf_table_print(tb, stdout, "  ");
  mf_table_free(tb);
  return st;
}

static json_t *json_row(const kkey *q, const roofline *rl, double step_s) {
  double achieved, ratio;
  rate_of(q, rl, &achieved, &ratio);
  json_t *sizes = json_array();
  for (int i = 0; i < q->n_sizes; i++) json_array_append_new(sizes, json_integer((json_int_t)q->sizes[i]));
  json_t *r = json_object();
  json_object_set_new(r, "kernel", json_string(q->kernel));
  json_object_set_new(r, "sizes", sizes);
  json_object_set_new(r, "calls", json_integer((json_int_t)q->calls));
  json_object_set_new(r, "ms_per_call", json_real(q->seconds * 1e3));
  json_object_set_new(r, "flop", json_real(q->flops));
  json_object_set_new(r, "bytes", json_real(q->bytes));
  json_object_set_new(r, "bound", json_string(q->gemm_like ? "gemm" : "copy"));
  json_object_set_new(r, "achieved", json_real(achieved));
  json_object_set_new(r, "unit", json_string(q->gemm_like ? "TFLOP/s" : "GB/s"));
  json_object_set_new(r, "ratio", json_real(ratio));
  json_object_set_new(r, "share", json_real(q->seconds * (double)q->calls / step_s));
  return r;
}

typedef struct report {
  const char *config, *device, *plan, *timer;
  int reps;
} report;

static mf_status write_json(const char *path, const bench *k, const report *rp, const kkey *keys, int n,
                            const roofline *rl, double step_s, const mf_cli_copies *copies,
                            const alt_rows *alt) {
  json_t *root = json_object(), *rows = json_array(), *gemm = json_object(), *copy = json_object();
  json_object_set_new(root, "config", json_string(rp->config));
  json_object_set_new(root, "backend", json_string(k->b->name));
  json_object_set_new(root, "device", json_string(rp->device));
  json_object_set_new(root, "storage", json_string(mf_dtype_name(k->p->storage)));
  json_object_set_new(root, "plan", json_string(rp->plan));
  json_object_set_new(root, "reps", json_integer(rp->reps));
  json_object_set_new(root, "timer", json_string(rp->timer));
  json_object_set_new(gemm, "m", json_integer((json_int_t)rl->gemm_n));
  json_object_set_new(gemm, "n", json_integer((json_int_t)rl->gemm_n));
  json_object_set_new(gemm, "k", json_integer((json_int_t)rl->gemm_n));
  json_object_set_new(gemm, "ms", json_real(rl->gemm_s * 1e3));
  json_object_set_new(gemm, "tflops", json_real(rl->gemm_rate / 1e12));
  json_object_set_new(copy, "bytes", json_integer((json_int_t)rl->copy_bytes));
  json_object_set_new(copy, "ms", json_real(rl->copy_s * 1e3));
  json_object_set_new(copy, "gbs", json_real(rl->copy_rate / 1e9));
  json_object_set_new(root, "gemm_roofline", gemm);
  json_object_set_new(root, "copy_roofline", copy);
  json_object_set_new(root, "step_ms", json_real(step_s * 1e3));
  for (int j = 0; j < n; j++) json_array_append_new(rows, json_row(&keys[j], rl, step_s));
  json_object_set_new(root, "rows", rows);
  for (int c = 0; c < N_CHOICES; c++) {
    const kernel_choice *ch = &kChoices[c];
    const char *cur = ch->get(k->b);
    json_object_set_new(root, ch->json_key, cur ? json_string(cur) : json_null());
    if (alt[c].n == 0) continue;
    /* its rows again on the other kernel ("share": of the step above), as "other_<key>" */
    json_t *o = json_object(), *orows = json_array();
    json_object_set_new(o, ch->json_key, json_string(alt[c].other));
    for (int j = 0; j < alt[c].n; j++) json_array_append_new(orows, json_row(&alt[c].keys[j], rl, step_s));
    json_object_set_new(o, "rows", orows);
    char key[64];
    snprintf(key, sizeof key, "other_%s", ch->json_key);
    json_object_set_new(root, key, o);
  }
  json_object_set_new(root, "copies", mf_cli_copies_json(copies));
  char *text = json_dumps(root, JSON_INDENT(1));
  json_decref(root);
  if (!text) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "bench kernels: out of memory writing %s", path);
  mf_status st = mf_mkdir_parents(path);
  if (st == MF_OK) st = mf_write_file_atomic(path, text, strlen(text));
  free(text);
  return st;
}

/* ------------------------------------------------------------ the command */

/* What the bench made on the run's backend (the backend, and the arena the
 * bench created on it, go with the run). */
static void bench_free(bench *k) {
  if (!k->b) return;
  if (k->host) k->b->host_free(k->b, k->host);
  if (k->e0) k->b->event_free(k->b, k->e0);
  if (k->e1) k->b->event_free(k->b, k->e1);
  if (k->s) k->b->stream_free(k->b, k->s);
  free(k->expert_ptrs);
  memset(k, 0, sizeof *k);
}

static mf_status bench_create(bench *k, const mf_run_plan *rp, int reps) {
  k->p = rp->prog;
  k->reps = reps;
  k->seed = 12345;
  MF_CHECK(k->b->stream_create(k->b, &k->s));
  if (k->b->event_create_timed && k->b->event_elapsed) {
    MF_CHECK(k->b->event_create_timed(k->b, &k->e0));
    MF_CHECK(k->b->event_create_timed(k->b, &k->e1));
  }
  MF_CHECK(k->b->host_alloc(k->b, FILL_CHUNK, &k->host));
  const int64_t E = k->p->spec.experts > 0 ? k->p->spec.experts : 1;
  return mf_calloc((size_t)E, sizeof(void *), "expert pointers", (void **)&k->expert_ptrs);
}

/* Everything after the plan on the backend of k: the rooflines, each key, the report. */
static mf_status run(bench *k, const mf_run_plan *rp, const mf_config *cfg, const char *path, int reps,
                     const char *json) {
  const mf_schedule *s = rp->plan->s;
  kkey *keys = NULL;
  alt_rows alt[N_CHOICES]; /* each choice's keys on its other kernel */
  memset(alt, 0, sizeof alt);
  int n = 0;
  int64_t n_calls = 0;
  roofline rl;
  memset(&rl, 0, sizeof rl);
  mf_status st = MF_OK;
  MF_CHECK_GOTO(bench_create(k, rp, reps), st, done);
  MF_CHECK_GOTO(collect_keys(s, &keys, &n, &n_calls), st, done);
  roofline_sizes(k, &rl);
  k->arena_bytes = arena_needed(s, keys, n, &rl);
  void *base = NULL;
  MF_CHECK_GOTO(k->b->arena_create(k->b, k->arena_bytes, &base), st, done);
  k->arena = base;

  const char *device = rp->dev.device_known ? rp->dev.device_name : on_cuda(k) ? "cuda" : "host memory";
  const char *timer = k->e0 ? "the backend's timed events" : "wall time around a stream sync";
  char b1[32], b2[32];
  printf(
      "bench kernels: %s on the %s backend (%s), %s storage; %s: %lld kernel calls per step in %d groups\n",
      path, k->b->name, device, mf_dtype_name(k->p->storage), rp->plan->name, (long long)n_calls, n);
  printf("each the best of %d after one warm-up, timed with %s; arena %s\n", reps, timer,
         mf_format_bytes(k->arena_bytes, b1, sizeof b1));
  fflush(stdout);
  MF_CHECK_GOTO(measure_rooflines(k, &rl), st, done);
  printf(
      "roofline: linear_fwd %s %lld^3 %.3f ms = %.3g TFLOP/s; D2D copy of %s %.3f ms = %.1f GB/s (read + "
      "write)%s\n",
      mf_dtype_name(k->p->storage), (long long)rl.gemm_n, rl.gemm_s * 1e3, rl.gemm_rate / 1e12,
      mf_format_bytes(rl.copy_bytes, b2, sizeof b2), rl.copy_s * 1e3, rl.copy_rate / 1e9,
      on_cuda(k) ? "" : " (cpu: smaller than on cuda's 8192^3 and 1 GiB, to stay quick)");
  fflush(stdout);
  size_t fixture = 0;
  MF_CHECK_GOTO(routing_make(k, &fixture), st, done);
  double step_s = 0;
  for (int j = 0; j < n; j++) {
    MF_CHECK_GOTO(time_key(k, s, k->arena + align_up(fixture), &keys[j]), st, done);
    step_s += keys[j].seconds * (double)keys[j].calls;
  }
  qsort(keys, (size_t)n, sizeof *keys, cmp_total);
  printf("\n");
  MF_CHECK_GOTO(print_table(keys, n, &rl, step_s), st, done);
  printf("\nkernels: step %.3f ms; gemm roofline %.3g TFLOP/s; copy %.1f GB/s\n", step_s * 1e3,
         rl.gemm_rate / 1e12, rl.copy_rate / 1e9);
  for (int c = 0; c < N_CHOICES; c++) {
    const kernel_choice *ch = &kChoices[c];
    const char *cur = ch->get(k->b);
    MF_CHECK_GOTO(time_other(k, s, k->arena + align_up(fixture), keys, n, ch, &alt[c]), st, done);
    if (cur && alt[c].n > 0) {
      printf("\n%s: the rows above ran on %s; the same calls on %s:\n", ch->what, cur, alt[c].other);
      MF_CHECK_GOTO(print_compare(keys, n, alt[c].keys, alt[c].n, cur, alt[c].other, &rl), st, done);
    } else if (cur) {
      printf("%s ran on %s%s%s\n", ch->what, cur, alt[c].why[0] ? "; the other kernel: " : "", alt[c].why);
    }
  }
  fflush(stdout);
  /* The copies after the kernels, in the arena's first 2 x copy_bytes (the D2D roofline's). */
  const mf_cli_copies_in ci = {k->b, k->s, k->arena, rl.copy_bytes, reps};
  mf_cli_copies_layout lay;
  mf_cli_copies copies;
  mf_cli_copies_layout_of(rp, cfg, rl.copy_bytes, &lay);
  MF_CHECK_GOTO(mf_cli_copies_measure(&ci, &lay, &copies), st, done);
  MF_CHECK_GOTO(mf_cli_copies_print(&copies, k->b->name), st, done);
  if (json) {
    const report r = {path, device, rp->plan->name, timer, reps};
    MF_CHECK_GOTO(write_json(json, k, &r, keys, n, &rl, step_s, &copies, alt), st, done);
    printf("rows written to %s\n", json);
  }
done:
  free(keys);
  for (int c = 0; c < N_CHOICES; c++) free(alt[c].keys);
  return st;
}

int mf_cli_bench_kernels(int argc, char **argv) {
  const char *cmd = "bench kernels", *path = NULL, *json = NULL;
  const char *overrides[MAX_OVERRIDES];
  size_t n_over = 0;
  int reps = 5;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--reps") || !strcmp(a, "--json")) {
      if (i + 1 >= argc) return mf_cli_usage_error(cmd, "%s needs a value", a);
      if (!strcmp(a, "--json")) {
        json = argv[++i];
        continue;
      }
      char *end;
      const long r = strtol(argv[++i], &end, 10);
      if (*end || r < 1 || r > 1000) return mf_cli_usage_error(cmd, "bad --reps \"%s\" (1 to 1000)", argv[i]);
      reps = (int)r;
    } else if (!strncmp(a, "--", 2)) {
      return mf_cli_usage_error(cmd, "unknown option '%s'", a);
    } else if (!path) {
      path = a;
    } else if (strchr(a, '=') && n_over < MAX_OVERRIDES) {
      overrides[n_over++] = a;
    } else {
      return mf_cli_usage_error(cmd, "'%s' is not a key=value override", a);
    }
  }
  if (!path) return mf_cli_usage_error(cmd, "expected a CONFIG file");
  if (json && !*json) return mf_cli_usage_error(cmd, "--json needs a file name");

  mf_config *cfg = NULL;
  mf_run rn;
  memset(&rn, 0, sizeof rn);
  mf_threadpool *pool = NULL;
  bench k;
  memset(&k, 0, sizeof k);
  mf_status st = MF_OK;
  MF_CHECK_GOTO(mf_config_load_for(path, overrides, n_over, MF_CONFIG_FOR_PLAN, &cfg), st, done);
  MF_CHECK_GOTO(mf_threadpool_create((int)cfg->train.threads, &pool), st, done);
  /* The run train would open, up to its backend: the profile, the plan, the
   * backend with the kernel scratch cuDNN's attention needs whichever
   * attention runs (both are timed). The bench's arena is its own, on it. */
  const mf_run_opts ro = {.use = MF_RUN_TRAIN, .upto = MF_RUN_BACKEND, .pool = pool, .cudnn_scratch = 1};
  MF_CHECK_GOTO(mf_run_open(cfg, &ro, &rn), st, done);
  k.b = rn.backend;
  st = run(&k, rn.rp, cfg, path, reps, json);
done:
  bench_free(&k);
  mf_run_close(&rn); /* the backend and the bench's arena with it */
  mf_threadpool_free(pool);
  mf_config_free(cfg);
  return st == MF_OK ? MF_EXIT_OK : mf_cli_fail(cmd, st);
}
