/*
 * The backend interface: one struct of function pointers that the cpu backend
 * (kernels/cpu) and the cuda backend (kernels/cuda) both fill — the shape ggml
 * uses for its backends. The executor (src/exec) talks only to this.
 *
 * Memory. A backend has one device arena of exactly the budgeted size,
 * allocated once (`arena_create`); every device tensor lives at an offset in it
 * chosen by the program's memory plan. Host staging memory for transfers comes
 * from `host_alloc` (pinned on cuda).
 *
 * Work. Kernels are described as data (`mf_kernel_call`: a kind, its operand
 * buffers and its sizes) and submitted to a stream with `run`. Copies go on
 * streams too; events order streams. On the cpu backend a stream executes its
 * work in submission order as it is submitted (an ordered queue that is always
 * drained), so every event is complete when recorded; on cuda they are CUDA
 * streams and events.
 *
 * Checking (cpu, `checking` on): the executor tells the backend which arena
 * ranges hold live tensors (`mark`); freed ranges are filled with NaN, and every
 * kernel operand and copy must lie inside the arena and inside live ranges, or
 * the call fails with MF_ERR_INTERNAL naming the kernel and the operand — so an
 * offload bug fails a test instead of passing by luck.
 */
#ifndef MF_KERNELS_BACKEND_H
#define MF_KERNELS_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "src/core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __CUDACC__
#define MF_HOST_DEVICE __host__ __device__
#else
#define MF_HOST_DEVICE
#endif

/* MF_K_DROPOUT's mask, the same integers on both backends: element j of a
 * call with seed `seed` and stream `stream` is kept when these 32 bits are
 * at least `threshold` (p x 2^32, mf_dropout_threshold): a counter-based hash
 * (splitmix64's finaliser), so a mask is a function of (seed, stream, j)
 * alone, whatever the thread layout, and the backward draws its forward's. */
static inline MF_HOST_DEVICE uint32_t mf_dropout_bits(uint64_t seed, uint64_t stream, uint64_t j) {
  uint64_t z = seed ^ (stream * 0x9e3779b97f4a7c15ull) ^ ((j + 1) * 0xd6e8feb86659fd93ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return (uint32_t)((z ^ (z >> 31)) >> 32);
}
static inline uint32_t mf_dropout_threshold(double p) {
  const double t = p * 4294967296.0;
  return t <= 0 ? 0u : t >= 4294967295.0 ? 4294967295u : (uint32_t)t;
}

/* MF_K_DROPOUT over parts of received rows (mf_cpu_dropout_parts): the sizes
 * both backends check (the segments' values are the cpu's to check: on a GPU
 * they are device memory, and the kernel leaves rows outside them zeros). */
static inline mf_status mf_dropout_parts_sizes(int64_t n, int64_t row, int64_t sources, int64_t parts,
                                               int given) {
  if (row >= 1 && n % row == 0 && sources >= 1 && parts >= 0 && given) return MF_OK;
  return MF_ERR(MF_ERR_INVALID_ARG,
                "dropout: %lld elements in rows of %lld from %lld sources in %lld parts (segments, starts and "
                "seeds all given)",
                (long long)n, (long long)row, (long long)sources, (long long)parts);
}

/* YaRN (rope_scaling rope_type "yarn") for the callers of MF_K_ROPE_*
 * (kernels/rope.h; defined in kernels/rope.c), in double as transformers'
 * Python floats. mf_rope_yarn_mscale is yarn_get_mscale: 1 for factor <= 1,
 * else 0.1 mscale ln(factor) + 1; DeepSeek-V3 multiplies its softmax scale by
 * mf_rope_yarn_mscale(factor, mscale_all_dim)^2 when mscale_all_dim is set
 * (non-zero). mf_rope_yarn_attention_factor is _compute_yarn_parameters'
 * attention_factor when the config gives none (the call's f[5]): mscale(factor,
 * mscale) / mscale(factor, mscale_all_dim) when both are non-zero, else
 * mscale(factor, 1). */
double mf_rope_yarn_mscale(double factor, double mscale);
double mf_rope_yarn_attention_factor(double factor, double mscale, double mscale_all_dim);

/* The kernels. What each computes is the contract of its cpu twin,
 * mf_cpu_<name> in kernels/cpu/cpu_ops.h (the reference; the cuda twin is
 * mf_cuda_<name> in kernels/cuda/ops.cuh), <name> being mf_kernel_name(kind).
 * The layout of each kind's calls — its operands b[] with their names and
 * roles, its sizes i[] and scalars f[] — is written once, in the operand table
 * of kernels/backend.c (mf_kernel_info_of below). */
typedef enum mf_kernel {
  MF_K_ZERO = 0, /* no twin: its one operand's bytes are set to 0 */
  MF_K_EMBED_FWD,
  MF_K_EMBED_BWD,
  MF_K_RMSNORM_FWD,
  MF_K_RMSNORM_BWD,
  MF_K_LINEAR_FWD,
  MF_K_LINEAR_BWD_DATA,
  MF_K_LINEAR_BWD_WEIGHT,
  MF_K_ROPE_FWD,
  MF_K_ROPE_BWD,
  MF_K_ATTN_FWD,
  MF_K_ATTN_BWD,
  MF_K_SWIGLU_FWD,
  MF_K_SWIGLU_BWD,
  MF_K_SIGGATE_FWD, /* the twins: mf_cpu_sigmoid_gate_fwd, mf_cuda_sigmoid_gate_fwd */
  MF_K_SIGGATE_BWD,
  MF_K_ADD,
  MF_K_SCALE,   /* x *= s in place (the LoRA adapters' alpha / rank) */
  MF_K_DROPOUT, /* y = x * keep / (1 - p): the LoRA adapters' input dropout (mf_dropout_keep) */
  MF_K_ROUTER_FWD,
  MF_K_ROUTER_BWD,
  MF_K_MOE_DISPATCH,
  MF_K_MOE_GATHER,
  MF_K_MOE_GATHER_BWD,
  MF_K_MOE_COMBINE,
  MF_K_MOE_COMBINE_BWD,
  MF_K_EXPERT_FWD,
  MF_K_EXPERT_BWD_DATA,
  MF_K_EXPERT_BWD_WEIGHT,
  MF_K_CROSS_ENTROPY,
  MF_K_AUX_ACCUMULATE,
  MF_K_AUX_VALUE,
  MF_K_AUX_GRAD,
  /* The optimizer on the device; its cpu twins are src/optim's (passed to the
   * cpu backend, kernels/ does not depend on src/), and src/optim/optim.h
   * defines the arithmetic, bit for bit. GRAD_SUMSQ writes the norm's chunk
   * sums of one gradient (fp32) into sums (f64) at [first, first + ceil(n /
   * 65536)): sums[first + k] = the sum of squares of elements [65536 k, 65536
   * (k + 1)) as mf_optim_grad_chunk_sumsq computes it. ADAMW first multiplies
   * the gradient in place by (float)coef when coef < 1 (clipping, as
   * mf_optim_grad_scale), then runs one mf_adamw_update_bufs step t over n
   * elements: state holds m then v, n elements each, bf16 when moment_bf16
   * else fp32; with a BF16 param (BF16 storage) the fp32 master comes first
   * in state, the update runs on it and the param receives it rounded to
   * bf16. */
  MF_K_GRAD_SUMSQ,
  MF_K_ADAMW,
  /* A frozen weight stored quantized into y [rows, cols] in the storage
   * dtype: qw is its blob (src/core/qformat.h mf_qweight_blob_view: kind NF4,
   * FP8 or MXFP4, rows x cols, NF4's block size and nested absmax), y =
   * mf_qweight_at rounded once to the storage. */
  MF_K_DEQUANT,
  /* DeepSeek-V3's and GLM-4.5's sigmoid router with a correction bias and
   * group-limited top-k, and its backward (kernels/cpu/router_group.c; the
   * twins: mf_cpu_router_group_fwd, mf_cuda_router_group_fwd). */
  MF_K_ROUTER_GROUP_FWD,
  MF_K_ROUTER_GROUP_BWD,
  /* Strided column blocks (kernels/cpu/slice.c): a block of each row of x
   * into y, a row of x broadcast to `rep` rows of y; and the transpose, the
   * rep rows summed. DeepSeek-V3's latent attention takes its projections
   * apart and puts them together with them. */
  MF_K_SLICE,
  MF_K_SLICE_BWD,
  /* gpt-oss's experts (transformers' GptOssExperts): its clamped SwiGLU
   * (kernels/cpu/swiglu_clamp.c) and the per-expert bias of its expert
   * projections over the expert-sorted rows (kernels/cpu/expert_bias.c). */
  MF_K_SWIGLU_CLAMP_FWD,
  MF_K_SWIGLU_CLAMP_BWD,
  MF_K_EXPERT_BIAS_FWD,
  MF_K_EXPERT_BIAS_BWD,
  /* Expert parallelism's exchanges between ranks (no twin: not kernels, a
   * backend refuses them; the executor hands them to its exchange, src/exec/exec.h
   * mf_exec_set_exchange). Rank r of ep owns experts [r E/ep, (r + 1) E/ep).
   * EP_DISPATCH sends each of this rank's expert-sorted rows x [R, C] (local
   * offsets loffs [E + 1]) to its expert's owner and receives the rows every
   * rank sends this one's experts into y [ep R, C], expert-major and, inside an
   * expert, by source rank (each source's rows in its own order): offsets
   * [E + 1] the received experts' rows (another rank's experts: none), segments
   * [E ep + 1] where each (expert, source) part starts (expert e's rows from
   * source s: [segments[e ep + s], segments[e ep + s + 1])), and, when present,
   * counts [E] the rows each expert received (0 for another rank's).
   * EP_COMBINE sends the rows of y back where EP_DISPATCH took them from: x
   * [R, C] in the local expert-sorted order. */
  MF_K_EP_DISPATCH,
  MF_K_EP_COMBINE,
  MF_K_COUNT_
} mf_kernel;

const char *mf_kernel_name(mf_kernel k); /* "unknown" for a kind out of range */
/* EP_DISPATCH and EP_COMBINE: exchanges between ranks, not kernels. */
int mf_kernel_is_exchange(mf_kernel k);

/* SLICE's and SLICE_BWD's sizes (both twins check them): blocks of C columns
 * inside rows of stride xs and ys, rep >= 1. `what` names the kernel. */
mf_status mf_kernel_slice_check(const char *what, int64_t rows, int64_t C, int64_t xs, int64_t xo, int64_t ys,
                                int64_t yo, int64_t rep);

/* Operand slots of a call: the most any kind has (ATTN_BWD's 11) and one to spare. */
#define MF_KBUF_MAX 12

/* One operand: where it is, how many bytes the kernel may touch, whether it
 * writes them, and the dtype of its elements. dtype MF_DTYPE_INVALID (0, left
 * out) stands for the operand's type in the operand table with fp32 storage
 * (mf_kop_type below): F32 for a FLOAT operand. */
typedef struct mf_kbuf {
  void *ptr;
  size_t bytes;
  int write;
  mf_dtype dtype;
} mf_kbuf;

typedef struct mf_kernel_call {
  mf_kernel kind;
  mf_kbuf b[MF_KBUF_MAX];
  int64_t i[8];
  double f[6];
  /* Per-expert weights (EXPERT_*): E pointers, each to `expert_bytes` bytes;
   * NULL for an expert with no rows. Written for EXPERT_BWD_WEIGHT. */
  void **experts;
  size_t expert_bytes;
  mf_dtype expert_dtype; /* their elements' dtype (0: as a kbuf's dtype 0) */
  const char *label; /* the program op's name, for messages (may be NULL) */
} mf_kernel_call;

/* ------------------------------------------------------- operand table
 * One entry per kind (kernels/backend.c): what the planner (lifetimes,
 * recompute chains), both backends (operand checks and their messages) and
 * the tests know of a call's layout, and nothing else restates. */

/* What a kernel does to an operand. */
typedef enum mf_kop_role {
  MF_KOP_READ = 1,
  MF_KOP_WRITE = 2,                        /* overwritten: not read */
  MF_KOP_ADD = MF_KOP_READ | MF_KOP_WRITE, /* added into (or updated in place): read and written */
  MF_KOP_ACCUMULATE = MF_KOP_WRITE | 4,    /* written, or added (so read too) when the call's
                                              `accumulate` size is non-zero */
} mf_kop_role;

/* The element type of an operand. A call computes in one storage dtype, F32
 * or BF16 (the step program's: weights, activations and their gradients):
 * every FLOAT operand of a call has it. The other types are fixed whatever the
 * storage: gradient sums, statistics and softmax sums stay fp32, indices are
 * integers, loss and norm sums are doubles. */
typedef enum mf_kop_type {
  MF_KT_FLOAT = 0, /* the call's storage dtype: F32 or BF16 */
  MF_KT_F32,
  MF_KT_F64,
  MF_KT_I32,
  MF_KT_I64,
  MF_KT_BYTES, /* any dtype: raw bytes laid out by the call's sizes (ZERO; ADAMW's state) */
} mf_kop_type;

typedef struct mf_kop {
  const char *name; /* as the cpu twin names it; NULL: no such operand */
  mf_kop_role role;
  int optional; /* may be absent (ptr NULL): the kernel then does without it */
  mf_kop_type type;
} mf_kop;

typedef struct mf_kernel_info {
  const char *name;      /* mf_kernel_name */
  mf_kop b[MF_KBUF_MAX]; /* operands b[0..], in order; unnamed past the last */
  const char *i[8];      /* what i[0..] hold; NULL past the last */
  const char *f[6];      /* what f[0..] hold; NULL past the last */
  mf_kop experts;        /* the per-expert weights (EXPERT_*); unnamed for other kinds */
} mf_kernel_info;

/* The kind's entry; NULL for a kind out of range. */
const mf_kernel_info *mf_kernel_info_of(mf_kernel k);
/* Operands of a kind (named slots of b[]); 0 out of range. */
int mf_kernel_n_operands(mf_kernel k);
/* Whether the call's `accumulate` flag is set (0 for kinds without one). */
int mf_kernel_accumulates(const mf_kernel_call *call);

/* Which operands (bits of b[]) a call writes, and which it reads, by the table:
 * an added operand is both; an ACCUMULATE one is read only when the call
 * accumulates. For EXPERT_BWD_WEIGHT the per-expert gradients are added
 * (mf_kernel_writes_experts); the other EXPERT_* kinds read their expert
 * weights. The planner derives lifetimes and recompute chains from these. */
uint32_t mf_kernel_writes(const mf_kernel_call *call);
uint32_t mf_kernel_reads(const mf_kernel_call *call);
int mf_kernel_writes_experts(mf_kernel k);

/* The checks both backends make of a call before running it: its kind is one
 * of the table's (else MF_ERR_INVALID_ARG naming the kind's number), no
 * operand the table does not mark optional is a NULL pointer with bytes
 * (MF_ERR_INVALID_ARG naming the kernel, the call's label and the operand),
 * and its operands' dtypes agree with the table (mf_kernel_call_dtype). Which
 * storage dtypes a backend computes is its own check. */
mf_status mf_kernel_call_check(const mf_kernel_call *call);

/* The dtype a call computes in (its storage): that of its FLOAT operands and
 * FLOAT expert weights (dtype 0 read as F32), which must be F32 or BF16 and all
 * the same; every operand of a fixed type must have that type's dtype (or 0).
 * Otherwise MF_ERR_INVALID_ARG naming the kernel, the call's label, the operand
 * and the dtypes. A call without FLOAT operands computes in F32. */
mf_status mf_kernel_call_dtype(const mf_kernel_call *call, mf_dtype *storage);

/* The dtype an operand of type `t` has in a call computing in `storage`
 * (MF_DTYPE_INVALID for BYTES: any). */
mf_dtype mf_kop_type_dtype(mf_kop_type t, mf_dtype storage);

/* "operand 3 (y)": how messages name operand `slot` of a kind (slot >= 100:
 * expert slot - 100's weight). Returns buf. */
const char *mf_kernel_operand_text(mf_kernel k, int slot, char *buf, size_t cap);

/* The rows R of an EXPERT_FWD, EXPERT_BWD_DATA or EXPERT_BIAS_FWD call, from
 * its first operand's bytes and dtype (xe [R, Kd], dye [R, N], y [R, N]): a
 * bound on offsets[E] that a device can use without reading offsets. 0 for
 * other kinds and empty rows. */
int64_t mf_kernel_expert_rows(const mf_kernel_call *call);

typedef struct mf_stream mf_stream;
typedef struct mf_event mf_event;
typedef struct mf_backend mf_backend;

typedef enum mf_copy_kind {
  MF_COPY_H2D = 0,
  MF_COPY_D2H,
  MF_COPY_D2D,
} mf_copy_kind;

typedef struct mf_backend_stats {
  uint64_t kernels;      /* kernel calls run */
  uint64_t bytes_h2d;    /* bytes copied host -> device */
  uint64_t bytes_d2h;
  uint64_t bytes_d2d;
  uint64_t checks;       /* operands checked (checking mode) */
  uint64_t host_registered_bytes; /* host memory pinned by host_register now */
} mf_backend_stats;

struct mf_backend {
  const char *name; /* "cpu", "cuda" */
  void *impl;

  /* The device arena: allocated once, exactly `bytes`. */
  mf_status (*arena_create)(mf_backend *b, size_t bytes, void **base);
  /* Host memory for transfers (pinned on cuda); freed with host_free. */
  mf_status (*host_alloc)(mf_backend *b, size_t bytes, void **out);
  void (*host_free)(mf_backend *b, void *p);

  mf_status (*stream_create)(mf_backend *b, mf_stream **out);
  void (*stream_free)(mf_backend *b, mf_stream *s);
  mf_status (*stream_sync)(mf_backend *b, mf_stream *s);
  mf_status (*event_create)(mf_backend *b, mf_event **out);
  void (*event_free)(mf_backend *b, mf_event *e);
  mf_status (*event_record)(mf_backend *b, mf_event *e, mf_stream *s);
  /* Work submitted to `s` after this waits for `e`. */
  mf_status (*stream_wait)(mf_backend *b, mf_stream *s, mf_event *e);
  /* Runs fn(ctx) on the host once the work submitted to `s` before it is
   * done; work submitted to `s` after it waits for it to return. fn must not
   * call the backend, and may run on another host thread (cuda:
   * cudaLaunchHostFunc, on a driver thread): the executor's host copies into
   * and out of the pinned staging arena. */
  mf_status (*host_fn)(mf_backend *b, mf_stream *s, void (*fn)(void *ctx), void *ctx);
  /* Without waiting: *done = 1 when the work before the event's last record
   * is done (or it was never recorded), else 0. */
  mf_status (*event_query)(mf_backend *b, mf_event *e, int *done);
  /* Timing (optional: NULL when a backend cannot time its streams). An event
   * from event_create_timed carries the time its record was reached on its
   * stream; event_elapsed gives the seconds between two such records, once
   * both are done (after a sync). */
  mf_status (*event_create_timed)(mf_backend *b, mf_event **out);
  mf_status (*event_elapsed)(mf_backend *b, mf_event *from, mf_event *to, double *seconds);

  mf_status (*copy)(mf_backend *b, void *dst, const void *src, size_t bytes, mf_copy_kind kind, mf_stream *s);
  mf_status (*run)(mf_backend *b, const mf_kernel_call *call, mf_stream *s);

  /* Checking mode bookkeeping (optional: NULL when the backend has none).
   * live = 1: [ptr, ptr+bytes) now holds a tensor; live = 0: released
   * (poisoned with NaN on cpu). */
  mf_status (*mark)(mf_backend *b, void *ptr, size_t bytes, int live);

  void (*get_stats)(mf_backend *b, mf_backend_stats *out);
  void (*free)(mf_backend *b);

  /* Pins [ptr, ptr + bytes) of host memory the caller allocated (cuda:
   * cudaHostRegister), so that copies from and into it are single DMA
   * transfers; the cpu twin checks the range and counts it (stats). Each
   * registration is undone by host_unregister with the same ptr and bytes,
   * before the memory is freed and before the backend is. Optional: NULL when
   * a backend cannot pin (copies from the memory are then correct, only not
   * straight). */
  mf_status (*host_register)(mf_backend *b, void *ptr, size_t bytes);
  void (*host_unregister)(mf_backend *b, void *ptr, size_t bytes);

  /* The library's own handle of stream s (cuda: its cudaStream_t), for work
   * another library enqueues in its order (NCCL's transfers: comm/comm_nccl.h).
   * Optional: NULL on a backend whose device is host memory (cpu). */
  void *(*native_stream)(mf_backend *b, mf_stream *s);
};

/* The cpu backend. `pool` (may be NULL) runs the kernels; `round_bf16` stores
 * activations rounded to bf16 precision; `checking` turns on the checking mode.
 * `optim` runs GRAD_SUMSQ and ADAMW: on the cpu backend the device is host
 * memory, and its optimizer is the host's (src/optim mf_optim_run_kernel,
 * passed in because kernels/ does not depend on src/); NULL: those two kinds
 * fail with MF_ERR_UNSUPPORTED. */
typedef enum mf_cpu_streams {
  MF_CPU_STREAMS_IMMEDIATE = 0, /* work runs when submitted (events complete when recorded) */
  /* For testing what a GPU's streams would do: each stream is a queue whose
   * work runs only when something needs it — a stream_sync, or a stream that
   * reaches a stream_wait on one of its events — as late as possible, so a
   * missing wait shows as a reader running before its writer; host functions
   * the other way round, as soon as what they wait for allows (so a host copy
   * into memory a queued copy has not read yet shows) — unless a copy or a
   * kernel is queued before one on its stream: then it waits with them; */
  MF_CPU_STREAMS_LAZY,
  /* the same, but a stream runs as soon as it is given a copy (after what
   * it waits for): copies as early as possible, so a missing wait shows as a
   * copy overwriting memory queued work still reads; host functions as late
   * as possible (so a copy into memory a host function has not read yet
   * shows). */
  MF_CPU_STREAMS_COPIES_FIRST,
} mf_cpu_streams;

typedef struct mf_cpu_backend_opts {
  mf_threadpool *pool;
  int round_bf16;
  int checking; /* ignored with deferred streams (marks are made in submission order) */
  mf_status (*optim)(const mf_kernel_call *call, mf_threadpool *pool);
  mf_cpu_streams streams; /* 0: immediate */
} mf_cpu_backend_opts;

mf_status mf_backend_cpu_create(const mf_cpu_backend_opts *opts, mf_backend **out);
void mf_backend_free(mf_backend *b); /* NULL is fine */

/* The device arenas of every backend of this process: the most bytes held
 * at once since the last reset (each backend's arena_create and free report
 * theirs: mf_backend_arena_held). What a run holds on the device beside its
 * backends' own workspaces and scratch. */
void mf_backend_arena_held(int64_t bytes); /* + at create, - at free */
uint64_t mf_backend_arena_peak(void);
void mf_backend_arena_peak_reset(void);

#ifdef __cplusplus
}
#endif

#endif /* MF_KERNELS_BACKEND_H */
