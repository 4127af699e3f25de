// The cuda backend (kernels/cuda/backend_cuda.h): kernels/backend.h over the CUDA
// runtime. One device arena (one cudaMalloc, once), kernel scratch allocated at
// create, pinned host staging, non-blocking streams, timing-free events, async
// copies, and `run` dispatching mf_kernel_call.kind to the launchers of
// kernels/cuda/ops.cuh. Every CUDA call is checked (MF_CUDA_CHECK); nothing is
// allocated on the device after create except the arena.
//
// Kernel scratch is one buffer shared by every stream: kernels that use it are
// serialised across streams by an event (each waits for the previous user's
// record, then records its own) under a host mutex, so concurrent streams never
// share partial sums and the bits stay those of a lone call.
//
// Every entry point selects the backend's device first (cudaSetDevice is per
// host thread, and the executor may call from more than one thread).
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#include "kernels/backend.h"
#include "kernels/cuda/attention_cudnn.h"
#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops.cuh"

struct mf_stream {
  cudaStream_t s;
};
struct mf_event {
  cudaEvent_t e;
};

typedef struct cuda_impl {
  int device;
  void *arena;
  size_t arena_bytes;
  void *scratch;
  size_t scratch_bytes;
  cudaEvent_t scratch_done; /* recorded after the last kernel that used scratch */
  int have_scratch_event;
  pthread_mutex_t scratch_lock;
  mf_cuda_blas *blas; /* cuBLASLt handle, workspace and algorithm cache (gemm.cu) */
  int expert_cutlass; /* BF16 expert GEMMs on expert_cutlass.cu (else expert_mma.cu) */
  uint64_t cutlass_calls; /* expert GEMM calls expert_cutlass.cu ran */
  mf_cuda_cudnn *cudnn;   /* cuDNN, loaded when attention first asks for it (attention_cudnn.h) */
  int attn_cudnn;         /* BF16 attention on cuDNN (else attention_mma.cu) */
  uint64_t cudnn_calls;   /* attention calls cuDNN ran */
  mf_backend_stats stats;
} cuda_impl;

static cuda_impl *impl_of(mf_backend *b) {
  return (cuda_impl *)b->impl;
}
static cudaStream_t stream_of(mf_stream *s) {
  return s ? s->s : (cudaStream_t)0;
}

static void *cuda_native_stream(mf_backend *b, mf_stream *s) {
  (void)b;
  return (void *)stream_of(s);
}

#define SET_DEVICE(c) MF_CUDA_CHECK(cudaSetDevice((c)->device))

// ----------------------------------------------------------------- memory

static mf_status cuda_arena_create(mf_backend *b, size_t bytes, void **base) {
  cuda_impl *c = impl_of(b);
  *base = NULL;
  if (c->arena) return MF_ERR(MF_ERR_INTERNAL, "cuda backend: the device arena exists already");
  SET_DEVICE(c);
  void *p = NULL;
  cudaError_t e = cudaMalloc(&p, bytes ? bytes : 256);
  if (e != cudaSuccess) {
    char buf[32];
    size_t free_b = 0, total_b = 0;
    cudaGetLastError();
    cudaMemGetInfo(&free_b, &total_b);
    cudaGetLastError();
    char fbuf[32];
    return MF_ERR(e == cudaErrorMemoryAllocation ? MF_ERR_OUT_OF_MEMORY : MF_ERR_CUDA,
                  "cuda backend: cudaMalloc of the device arena (%s) on device %d failed: %s (%s); %s free",
                  mf_format_bytes(bytes, buf, sizeof buf), c->device, cudaGetErrorString(e),
                  cudaGetErrorName(e), mf_format_bytes(free_b, fbuf, sizeof fbuf));
  }
  c->arena = p;
  c->arena_bytes = bytes;
  mf_backend_arena_held((int64_t)bytes);
  *base = p;
  return MF_OK;
}

static mf_status cuda_host_alloc(mf_backend *b, size_t bytes, void **out) {
  cuda_impl *c = impl_of(b);
  *out = NULL;
  SET_DEVICE(c);
  MF_CUDA_CHECK(cudaHostAlloc(out, bytes ? bytes : 64, cudaHostAllocPortable));
  return MF_OK;
}

static void cuda_host_free(mf_backend *b, void *p) {
  if (p) cudaFreeHost(p);
}

static mf_status cuda_host_register(mf_backend *b, void *ptr, size_t bytes) {
  cuda_impl *c = impl_of(b);
  if (!ptr || bytes == 0)
    return MF_ERR(MF_ERR_INVALID_ARG, "cuda backend: pinning %zu bytes at %p: no memory", bytes, ptr);
  SET_DEVICE(c);
  const cudaError_t e = cudaHostRegister(ptr, bytes, cudaHostRegisterPortable);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return MF_ERR(MF_ERR_CUDA, "cuda backend: pinning %zu bytes of host memory failed: %s (%s)", bytes,
                  cudaGetErrorString(e), cudaGetErrorName(e));
  }
  c->stats.host_registered_bytes += bytes;
  return MF_OK;
}

static void cuda_host_unregister(mf_backend *b, void *ptr, size_t bytes) {
  cuda_impl *c = impl_of(b);
  if (!ptr) return;
  cudaSetDevice(c->device);
  if (cudaHostUnregister(ptr) != cudaSuccess) cudaGetLastError();
  c->stats.host_registered_bytes -= bytes < c->stats.host_registered_bytes ? bytes : c->stats.host_registered_bytes;
}

// ------------------------------------------------------- streams, events

static mf_status cuda_stream_create(mf_backend *b, mf_stream **out) {
  cuda_impl *c = impl_of(b);
  *out = NULL;
  SET_DEVICE(c);
  mf_stream *s = (mf_stream *)calloc(1, sizeof *s);
  if (!s) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "cuda backend: out of memory for a stream");
  cudaError_t e = cudaStreamCreateWithFlags(&s->s, cudaStreamNonBlocking);
  if (e != cudaSuccess) {
    free(s);
    MF_CUDA_CHECK(e);
  }
  *out = s;
  return MF_OK;
}

static void cuda_stream_free(mf_backend *b, mf_stream *s) {
  if (!s) return;
  cudaSetDevice(impl_of(b)->device);
  cudaStreamDestroy(s->s);
  free(s);
}

static mf_status cuda_stream_sync(mf_backend *b, mf_stream *s) {
  SET_DEVICE(impl_of(b));
  MF_CUDA_CHECK(cudaStreamSynchronize(stream_of(s)));
  return MF_OK;
}

// Events order streams without timing (cheaper to record and wait for); the
// timed ones (cudaEventDefault) carry a time for cudaEventElapsedTime.
static mf_status make_event(mf_backend *b, unsigned flags, mf_event **out) {
  cuda_impl *c = impl_of(b);
  *out = NULL;
  SET_DEVICE(c);
  mf_event *ev = (mf_event *)calloc(1, sizeof *ev);
  if (!ev) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "cuda backend: out of memory for an event");
  cudaError_t e = cudaEventCreateWithFlags(&ev->e, flags);
  if (e != cudaSuccess) {
    free(ev);
    MF_CUDA_CHECK(e);
  }
  *out = ev;
  return MF_OK;
}

static mf_status cuda_event_create(mf_backend *b, mf_event **out) {
  return make_event(b, cudaEventDisableTiming, out);
}

static mf_status cuda_event_create_timed(mf_backend *b, mf_event **out) {
  return make_event(b, cudaEventDefault, out);
}

static void cuda_event_free(mf_backend *b, mf_event *e) {
  if (!e) return;
  cudaSetDevice(impl_of(b)->device);
  cudaEventDestroy(e->e);
  free(e);
}

static mf_status cuda_event_record(mf_backend *b, mf_event *e, mf_stream *s) {
  SET_DEVICE(impl_of(b));
  MF_CUDA_CHECK(cudaEventRecord(e->e, stream_of(s)));
  return MF_OK;
}

static mf_status cuda_stream_wait(mf_backend *b, mf_stream *s, mf_event *e) {
  SET_DEVICE(impl_of(b));
  MF_CUDA_CHECK(cudaStreamWaitEvent(stream_of(s), e->e, 0));
  return MF_OK;
}

// A host function on a stream (cudaLaunchHostFunc): it runs on a driver
// thread once the stream's earlier work is done, and the stream's later work
// waits for it. It must not call CUDA.
static mf_status cuda_host_fn(mf_backend *b, mf_stream *s, void (*fn)(void *ctx), void *ctx) {
  if (!fn) return MF_ERR(MF_ERR_INVALID_ARG, "cuda backend: host function is NULL");
  SET_DEVICE(impl_of(b));
  MF_CUDA_CHECK(cudaLaunchHostFunc(stream_of(s), (cudaHostFn_t)fn, ctx));
  return MF_OK;
}

static mf_status cuda_event_query(mf_backend *b, mf_event *e, int *done) {
  *done = 0;
  SET_DEVICE(impl_of(b));
  const cudaError_t r = cudaEventQuery(e->e);
  if (r == cudaErrorNotReady) {
    cudaGetLastError(); /* not an error: the work is still running */
    return MF_OK;
  }
  MF_CUDA_CHECK(r);
  *done = 1;
  return MF_OK;
}

static mf_status cuda_event_elapsed(mf_backend *b, mf_event *from, mf_event *to, double *seconds) {
  *seconds = 0;
  SET_DEVICE(impl_of(b));
  float ms = 0;
  MF_CUDA_CHECK(cudaEventElapsedTime(&ms, from->e, to->e));
  *seconds = (double)ms * 1e-3;
  return MF_OK;
}

// ----------------------------------------------------------------- copies

static mf_status cuda_copy(mf_backend *b, void *dst, const void *src, size_t bytes, mf_copy_kind kind,
                           mf_stream *s) {
  cuda_impl *c = impl_of(b);
  if (bytes == 0) return MF_OK;
  cudaMemcpyKind k;
  switch (kind) {
    case MF_COPY_H2D:
      k = cudaMemcpyHostToDevice;
      break;
    case MF_COPY_D2H:
      k = cudaMemcpyDeviceToHost;
      break;
    case MF_COPY_D2D:
      k = cudaMemcpyDeviceToDevice;
      break;
    default:
      return MF_ERR(MF_ERR_INVALID_ARG, "cuda backend: copy of unknown kind %d", (int)kind);
  }
  if (!dst || !src)
    return MF_ERR(MF_ERR_INVALID_ARG, "cuda backend: copy of %zu bytes with a NULL %s", bytes,
                  dst ? "source" : "destination");
  SET_DEVICE(c);
  MF_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, k, stream_of(s)));
  if (kind == MF_COPY_H2D) c->stats.bytes_h2d += bytes;
  if (kind == MF_COPY_D2H) c->stats.bytes_d2h += bytes;
  if (kind == MF_COPY_D2D) c->stats.bytes_d2d += bytes;
  return MF_OK;
}

// ---------------------------------------------------------------- kernels

#define F(j) ((float *)k->b[j].ptr)
#define CF(j) ((const float *)k->b[j].ptr)
// A FLOAT operand (kernels/backend.c): the call's storage type T.
#define S(j) ((T *)k->b[j].ptr)
#define CS(j) ((const T *)k->b[j].ptr)
#define I32(j) ((int32_t *)k->b[j].ptr)
#define CI32(j) ((const int32_t *)k->b[j].ptr)
#define I64(j) ((int64_t *)k->b[j].ptr)
#define CI64(j) ((const int64_t *)k->b[j].ptr)
#define D64(j) ((double *)k->b[j].ptr)
#define CD64(j) ((const double *)k->b[j].ptr)

// The optimizer kinds (kernels/backend.h), with src/optim/kernel.c's checks of
// the element count against the operands' bytes.
static mf_status launch_grad_sumsq(const mf_kernel_call *k, cudaStream_t s) {
  const int64_t n = k->i[0], first = k->i[1];
  if (n < 0 || first < 0 || (uint64_t)n > SIZE_MAX / 8 || (uint64_t)first > SIZE_MAX / 16)
    return MF_ERR(MF_ERR_INVALID_ARG, "%lld elements from chunk %lld: not a valid count or chunk",
                  (long long)n, (long long)first);
  const size_t chunks = ((size_t)n + MF_CUDA_NORM_CHUNK - 1) / MF_CUDA_NORM_CHUNK;
  if (k->b[0].bytes < (size_t)n * sizeof(float) || k->b[1].bytes / sizeof(double) < (size_t)first + chunks)
    return MF_ERR(MF_ERR_INVALID_ARG,
                  "%lld elements (%zu chunk sums from chunk %lld) do not fit the operands (g %zu bytes, "
                  "sums %zu bytes)",
                  (long long)n, chunks, (long long)first, k->b[0].bytes, k->b[1].bytes);
  if (n == 0) return MF_OK;
  return mf_cuda_grad_chunk_sumsq(CF(0), (size_t)n, D64(1) + first, s);
}

// bf16_param (BF16 storage): the state holds the fp32 master first, then m
// and v; the update runs on the master and writes the param as its bf16
// working copy.
static mf_status launch_adamw(const mf_kernel_call *k, int bf16_param, cudaStream_t s) {
  const int64_t n = k->i[0];
  const int mbf = k->i[2] != 0;
  const size_t ms = mbf ? sizeof(uint16_t) : sizeof(float);
  if (n < 0 || (uint64_t)n > SIZE_MAX / 16)
    return MF_ERR(MF_ERR_INVALID_ARG, "%lld elements: not a valid count", (long long)n);
  const size_t ps = bf16_param ? sizeof(uint16_t) : sizeof(float);
  const size_t master = bf16_param ? (size_t)n * sizeof(float) : 0;
  if (k->b[0].bytes < (size_t)n * ps || k->b[1].bytes < (size_t)n * sizeof(float) ||
      k->b[2].bytes < master + 2 * (size_t)n * ms)
    return MF_ERR(MF_ERR_INVALID_ARG,
                  "%lld elements (%s param, %s moments) do not fit the operands (param %zu bytes, grad %zu "
                  "bytes, state %zu bytes)",
                  (long long)n, bf16_param ? "bf16" : "fp32", mbf ? "bf16" : "fp32", k->b[0].bytes,
                  k->b[1].bytes, k->b[2].bytes);
  const mf_cuda_adamw_step h = {k->f[0], k->f[1], k->f[2], k->f[3], k->f[4], k->i[1]};
  char *state = (char *)k->b[2].ptr;
  char *mv = state + master; /* m, then v */
  float *param = bf16_param ? (float *)state : F(0);
  uint16_t *working = bf16_param ? (uint16_t *)k->b[0].ptr : NULL;
  return mf_cuda_adamw_update_scaled(&h, param, F(1), k->f[5], mv, mv + (size_t)n * ms, mbf, working,
                                     (size_t)n, s);
}

// Runs `launch` (a launcher using the kernel scratch) after the scratch's
// previous user on any stream, under the scratch lock, and records it as the
// last user. More than the backend's scratch (`need` bytes): MF_ERR_OUT_OF_MEMORY
// naming `what`, nothing launched.
template <typename Launch>
static mf_status with_scratch(cuda_impl *c, size_t need, const char *what, cudaStream_t s, Launch launch) {
  if (need > c->scratch_bytes)
    return MF_ERR(MF_ERR_OUT_OF_MEMORY,
                  "cuda backend: %s needs %zu bytes of kernel scratch; the backend has %zu "
                  "(mf_cuda_backend_opts.scratch_bytes)",
                  what, need, c->scratch_bytes);
  pthread_mutex_lock(&c->scratch_lock);
  cudaError_t e = cudaStreamWaitEvent(s, c->scratch_done, 0);
  mf_status st = e == cudaSuccess ? launch()
                                  : MF_ERR(MF_ERR_CUDA, "cudaStreamWaitEvent on the scratch event failed: %s",
                                           cudaGetErrorString(e));
  if (st == MF_OK && (e = cudaEventRecord(c->scratch_done, s)) != cudaSuccess)
    st = MF_ERR(MF_ERR_CUDA, "cudaEventRecord of the scratch event failed: %s", cudaGetErrorString(e));
  pthread_mutex_unlock(&c->scratch_lock);
  return st;
}

// EXPERT_FWD / BWD_DATA / BWD_WEIGHT on gemm.cu's launchers (expert_mma.cu for
// BF16 where it fits, the CUDA-core kernel otherwise).
template <typename T>
static mf_status run_expert(const mf_kernel_call *k, cudaStream_t s) {
  const int64_t *i = k->i;
  if (k->kind == MF_K_EXPERT_FWD)
    return mf_cuda_expert_fwd<T>(CS(0), (const T *const *)k->experts, CI64(1), mf_kernel_expert_rows(k), i[0],
                                 i[1], i[2], S(2), s);
  if (k->kind == MF_K_EXPERT_BWD_DATA)
    return mf_cuda_expert_bwd_data<T>(CS(0), (const T *const *)k->experts, CI64(1), mf_kernel_expert_rows(k),
                                      i[0], i[1], i[2], S(2), s);
  return mf_cuda_expert_bwd_weight<T>(CS(0), CS(1), CI64(2), i[0], i[1], i[2], (float *const *)k->experts, s);
}

// The same on expert_cutlass.cu, which writes its group arrays into the kernel
// scratch (so it takes the scratch's turn; it checks its own need against the
// scratch's bytes); a call it does not take runs on run_expert.
static mf_status run_expert_cutlass(cuda_impl *c, const mf_kernel_call *k, cudaStream_t s) {
  typedef mf_bf16 T;
  const int64_t *i = k->i;
  int ran = 0;
  MF_CHECK(with_scratch(c, 0, "the cutlass expert GEMM", s, [&] {
    if (k->kind == MF_K_EXPERT_FWD)
      return mf_cuda_expert_cutlass_fwd(CS(0), (const T *const *)k->experts, CI64(1),
                                        mf_kernel_expert_rows(k), i[0], i[1], i[2], S(2), c->scratch,
                                        c->scratch_bytes, &ran, s);
    if (k->kind == MF_K_EXPERT_BWD_DATA)
      return mf_cuda_expert_cutlass_bwd_data(CS(0), (const T *const *)k->experts, CI64(1),
                                             mf_kernel_expert_rows(k), i[0], i[1], i[2], S(2), c->scratch,
                                             c->scratch_bytes, &ran, s);
    return mf_cuda_expert_cutlass_bwd_weight(CS(0), CS(1), CI64(2), i[0], i[1], i[2],
                                             (float *const *)k->experts, c->scratch, c->scratch_bytes, &ran,
                                             s);
  }));
  if (!ran) return run_expert<T>(k, s);
  __atomic_add_fetch(&c->cutlass_calls, 1, __ATOMIC_RELAXED);
  return MF_OK;
}

// ATTN_FWD / ATTN_BWD of BF16 storage on cuDNN (attention_cudnn.h), its
// workspace the kernel scratch (so it takes the scratch's turn); a call cuDNN
// does not take runs on attention.cu (attention_mma.cu where it fits).
static mf_status run_attn_cudnn(cuda_impl *c, const mf_kernel_call *k, cudaStream_t s) {
  typedef mf_bf16 T;
  const int64_t *i = k->i;
  const float scale = (float)k->f[0];
  int ran = 0;
  MF_CHECK(with_scratch(c, 0, "cuDNN attention", s, [&] {
    if (k->kind == MF_K_ATTN_FWD)
      return mf_cuda_attn_cudnn_fwd(c->cudnn, CS(0), CS(1), CS(2), i[0], i[1], i[2], i[3], i[4], scale, S(3),
                                    F(4), c->scratch, c->scratch_bytes, &ran, s);
    return mf_cuda_attn_cudnn_bwd(c->cudnn, CS(0), CS(1), CS(2), CS(3), CS(4), CF(5), i[0], i[1], i[2], i[3],
                                  i[4], scale, S(6), S(7), S(8), c->scratch, c->scratch_bytes, &ran, s);
  }));
  if (ran) {
    __atomic_add_fetch(&c->cudnn_calls, 1, __ATOMIC_RELAXED);
    return MF_OK;
  }
  if (k->kind == MF_K_ATTN_FWD)
    return mf_cuda_attn_fwd<T>(CS(0), CS(1), CS(2), i[0], i[1], i[2], i[3], i[4], i[5], i[6], CS(5), scale,
                               S(3), F(4), s);
  return mf_cuda_attn_bwd<T>(CS(0), CS(1), CS(2), CS(3), CS(4), CF(5), i[0], i[1], i[2], i[3], i[4], i[5],
                             i[6], CS(9), scale, S(6), S(7), S(8), F(10), s);
}

// Whether an attention call can go to cuDNN: only with one head dim (Dv, i[5],
// 0 or D), no sliding window (i[6] 0, or at least S: it hides nothing) and no
// sinks (ATTN_FWD's b[5], ATTN_BWD's b[9]). cuDNN's SDPA does take a value head
// dim unlike q/k's, and has sliding windows and sink tokens of its own, but our
// graphs (attention_cudnn.cc) and its workspace bound have one D and neither; a
// call with Dv != D (DeepSeek-V3's latent attention) or gpt-oss's windows and
// sinks runs on attention.cu's CUDA-core kernels instead (which keep such calls
// off attention_mma.cu's tensor-core kernels too).
static int attn_cudnn_takes(const mf_kernel_call *k) {
  const int sinks = k->kind == MF_K_ATTN_FWD ? 5 : 9;
  return (k->i[5] == 0 || k->i[5] == k->i[4]) && (k->i[6] == 0 || k->i[6] >= k->i[1]) && !k->b[sinks].ptr;
}

// The kernels of a call computing in storage T (float: F32, mf_bf16: BF16).
template <typename T>
static mf_status launch(cuda_impl *c, const mf_kernel_call *k, cudaStream_t s) {
  const int64_t *i = k->i;
  switch (k->kind) {
    case MF_K_ZERO:
      if (k->b[0].bytes) MF_CUDA_CHECK(cudaMemsetAsync(k->b[0].ptr, 0, k->b[0].bytes, s));
      return MF_OK;
    case MF_K_EMBED_FWD:
      return mf_cuda_embed_fwd<T>(CI32(0), i[0], CS(1), i[1], i[2], S(2), s);
    case MF_K_EMBED_BWD: {
      char what[80];
      snprintf(what, sizeof what, "embed_bwd over %lld tokens and %lld rows", (long long)i[0],
               (long long)i[1]);
      return with_scratch(c, mf_cuda_embed_bwd_scratch_bytes(i[0], i[1]), what, s, [&] {
        return mf_cuda_embed_bwd<T>(CI32(0), i[0], CS(1), i[1], i[2], F(2), (int32_t *)c->scratch, s);
      });
    }
    case MF_K_RMSNORM_FWD:
      return mf_cuda_rmsnorm_fwd<T>(CS(0), CS(1), i[0], i[1], (float)k->f[0], S(2), F(3), s);
    case MF_K_RMSNORM_BWD: {
      const int64_t R = i[0], C = i[1];
      const size_t need =
          R > 0 && C > 0 ? (size_t)mf_cuda_rmsnorm_dw_parts(R) * (size_t)C * sizeof(float) : 0;
      char what[64];
      snprintf(what, sizeof what, "rmsnorm_bwd over %lld columns", (long long)C);
      return with_scratch(c, need, what, s, [&] {
        return mf_cuda_rmsnorm_bwd<T>(CS(0), CS(1), CS(2), CF(3), R, C, S(4), F(5), (int)i[2],
                                      (float *)c->scratch, s);
      });
    }
    case MF_K_ROPE_FWD:
      return mf_cuda_rope_fwd<T>(S(0), i[0], i[1], i[2], CI32(1), mf_rope_args_of(i, k->f), s);
    case MF_K_ROPE_BWD:
      return mf_cuda_rope_bwd<T>(S(0), i[0], i[1], i[2], CI32(1), mf_rope_args_of(i, k->f), s);
    // Dv != D, a window or sinks: attention.cu's CUDA-core kernels (attn_cudnn_takes, attention.cu)
    case MF_K_ATTN_FWD:
      if constexpr (std::is_same<T, mf_bf16>::value) {
        if (c->attn_cudnn && attn_cudnn_takes(k)) return run_attn_cudnn(c, k, s);
      }
      return mf_cuda_attn_fwd<T>(CS(0), CS(1), CS(2), i[0], i[1], i[2], i[3], i[4], i[5], i[6], CS(5),
                                 (float)k->f[0], S(3), F(4), s);
    case MF_K_ATTN_BWD:
      if constexpr (std::is_same<T, mf_bf16>::value) {
        if (c->attn_cudnn && attn_cudnn_takes(k)) return run_attn_cudnn(c, k, s);
      }
      return mf_cuda_attn_bwd<T>(CS(0), CS(1), CS(2), CS(3), CS(4), CF(5), i[0], i[1], i[2], i[3], i[4], i[5],
                                 i[6], CS(9), (float)k->f[0], S(6), S(7), S(8), F(10), s);
    case MF_K_SWIGLU_FWD:
      return mf_cuda_swiglu_fwd<T>(CS(0), CS(1), i[0], S(2), s);
    case MF_K_SWIGLU_BWD:
      return mf_cuda_swiglu_bwd<T>(CS(0), CS(1), CS(2), i[0], S(3), S(4), s);
    case MF_K_SIGGATE_FWD:
      return mf_cuda_sigmoid_gate_fwd<T>(CS(0), CS(1), i[0], i[1], S(2), s);
    case MF_K_SIGGATE_BWD:
      return mf_cuda_sigmoid_gate_bwd<T>(CS(0), CS(1), CS(2), i[0], i[1], S(3), S(4), s);
    case MF_K_ADD: /* the fp32 flag (gradient sums): their operands are F32, so T is float */
      return mf_cuda_add<T>(CS(0), i[0], S(1), s);
    case MF_K_SLICE:
      return mf_cuda_slice<T>(CS(0), i[0], i[1], i[2], i[3], i[4], i[5], i[6], (int)i[7], S(1), s);
    case MF_K_SLICE_BWD:
      return mf_cuda_slice_bwd<T>(CS(0), i[0], i[1], i[2], i[3], i[4], i[5], i[6], (int)i[7], S(1), s);
    case MF_K_SWIGLU_CLAMP_FWD:
      return mf_cuda_swiglu_clamp_fwd<T>(CS(0), CS(1), i[0], (float)k->f[0], (float)k->f[1], S(2), s);
    case MF_K_SWIGLU_CLAMP_BWD:
      return mf_cuda_swiglu_clamp_bwd<T>(CS(0), CS(1), CS(2), i[0], (float)k->f[0], (float)k->f[1], S(3), S(4),
                                         s);
    case MF_K_EXPERT_BIAS_FWD:
      return mf_cuda_expert_bias_fwd<T>(CS(2), CI64(1), mf_kernel_expert_rows(k), i[0], i[1], S(0), s);
    case MF_K_EXPERT_BIAS_BWD:
      return mf_cuda_expert_bias_bwd<T>(CS(0), CI64(1), i[0], i[1], F(2), s);
    case MF_K_SCALE:
      return mf_cuda_scale<T>(S(0), i[0], (float)k->f[0], s);
    case MF_K_DROPOUT:
      if (k->b[2].ptr)
        return mf_cuda_dropout_parts<T>(CS(0), i[0], (uint64_t)i[1], k->f[0], i[3], CI64(2), CI64(3), CI64(4),
                                        i[4], i[5], S(1), s);
      return mf_cuda_dropout<T>(CS(0), i[0], (uint64_t)i[1], (uint64_t)i[2], k->f[0], S(1), s);
    case MF_K_ROUTER_FWD:
      return mf_cuda_router_fwd<T>(CS(0), i[0], i[1], i[2], (int)i[3], (int)i[4], F(1), I32(2), F(3), s);
    case MF_K_ROUTER_BWD:
      return mf_cuda_router_bwd<T>(CF(0), CI32(1), CF(2), CS(3), CF(4), i[0], i[1], i[2], (int)i[3], (int)i[4],
                                   S(5), s);
    case MF_K_ROUTER_GROUP_FWD:
      return mf_cuda_router_group_fwd<T>(CS(0), CS(1), i[0], i[1], i[2], i[3], i[4], (int)i[5], (float)k->f[0],
                                         F(2), I32(3), F(4), s);
    case MF_K_ROUTER_GROUP_BWD:
      return mf_cuda_router_group_bwd<T>(CF(0), CI32(1), CS(2), i[0], i[1], i[2], (int)i[5], (float)k->f[0], S(3),
                                         s);
    case MF_K_MOE_DISPATCH:
      return mf_cuda_moe_dispatch(CI32(0), i[0], i[1], i[2], I64(1), I64(2), I32(3), I32(4), s);
    case MF_K_MOE_GATHER:
      return mf_cuda_moe_gather<T>(CS(0), CI32(1), i[0], i[1], S(2), s);
    case MF_K_MOE_GATHER_BWD:
      return mf_cuda_moe_gather_bwd<T>(CS(0), CI32(1), i[0], i[1], i[2], S(2), (int)i[3], s);
    case MF_K_MOE_COMBINE:
      return mf_cuda_moe_combine<T>(CS(0), CF(1), CI32(2), i[0], i[1], i[2], S(3), s);
    case MF_K_MOE_COMBINE_BWD:
      return mf_cuda_moe_combine_bwd<T>(CS(0), CS(1), CF(2), CI32(3), i[0], i[1], i[2], S(4), S(5), s);
    case MF_K_AUX_ACCUMULATE:
      return mf_cuda_aux_accumulate(CF(0), CI32(1), i[0], i[1], i[2], I64(2), D64(3), s);
    case MF_K_AUX_VALUE:
      return mf_cuda_aux_value(CI64(0), CD64(1), i[0], i[1], D64(2), s);
    case MF_K_AUX_GRAD:
      return mf_cuda_aux_grad(CI64(0), i[0], i[1], k->f[0], i[2], F(1), s);
    case MF_K_LINEAR_FWD:
      return mf_cuda_linear_fwd<T>(CS(0), CS(1), CS(2), i[0], i[1], i[2], S(3), (int)i[3], c->blas, s);
    case MF_K_LINEAR_BWD_DATA:
      return mf_cuda_linear_bwd_data<T>(CS(0), CS(1), i[0], i[1], i[2], S(2), (int)i[3], c->blas, s);
    case MF_K_LINEAR_BWD_WEIGHT:
      return mf_cuda_linear_bwd_weight<T>(CS(0), CS(1), i[0], i[1], i[2], F(2), F(3), c->blas, s);
    case MF_K_EXPERT_FWD:
    case MF_K_EXPERT_BWD_DATA:
    case MF_K_EXPERT_BWD_WEIGHT:
      if constexpr (std::is_same<T, mf_bf16>::value) {
        if (c->expert_cutlass) return run_expert_cutlass(c, k, s);
      }
      return run_expert<T>(k, s);
    case MF_K_CROSS_ENTROPY:
      return mf_cuda_cross_entropy<T>(CS(0), CS(1), CI32(2), i[0], i[1], i[2], i[3], (float)k->f[0], F(3), F(4),
                                   D64(5), S(6), F(7), c->blas, s);
    case MF_K_GRAD_SUMSQ:
      return launch_grad_sumsq(k, s);
    case MF_K_ADAMW:
      return launch_adamw(k, sizeof(T) == 2, s);
    case MF_K_DEQUANT:
      return mf_cuda_dequant<T>((const uint8_t *)k->b[0].ptr, i[0], i[1], i[2], i[3], i[4], S(1), s);
    default:
      return MF_ERR(MF_ERR_UNSUPPORTED, "the cuda backend has no %s kernel", mf_kernel_name(k->kind));
  }
}

// The storage a call computes in (mf_kernel_call_dtype, checked by
// mf_kernel_call_check) picks the instantiation.
static mf_status launch_call(cuda_impl *c, const mf_kernel_call *k, cudaStream_t s) {
  mf_dtype storage;
  MF_CHECK(mf_kernel_call_dtype(k, &storage));
  if (storage == MF_DTYPE_BF16) return launch<mf_bf16>(c, k, s);
  return launch<float>(c, k, s);
}

static mf_status cuda_run(mf_backend *b, const mf_kernel_call *k, mf_stream *st) {
  cuda_impl *c = impl_of(b);
  const char *name = mf_kernel_name(k->kind);
  const char *label = k->label ? k->label : "";
  mf_status checked = mf_kernel_call_check(k); /* a kind of the table, its required operands present */
  if (checked != MF_OK) {
    mf_error_prefix("cuda backend");
    return checked;
  }
  SET_DEVICE(c);
  mf_status st_ = launch_call(c, k, stream_of(st));
  if (st_ != MF_OK) {
    mf_error_prefix("cuda backend: kernel %s%s%s", name, *label ? " in " : "", label);
    return st_;
  }
  c->stats.kernels++;
  return MF_OK;
}

// ------------------------------------------------------------ lifecycle

static void cuda_get_stats(mf_backend *b, mf_backend_stats *out) {
  *out = impl_of(b)->stats;
}

static void cuda_free(mf_backend *b) {
  cuda_impl *c = impl_of(b);
  if (c) {
    cudaSetDevice(c->device);
    if (c->arena || c->scratch) cudaDeviceSynchronize(); /* no kernel may still use them */
    if (c->arena) {
      cudaFree(c->arena);
      mf_backend_arena_held(-(int64_t)c->arena_bytes);
    }
    if (c->scratch) cudaFree(c->scratch);
    mf_cuda_blas_free(c->blas);
    mf_cuda_cudnn_free(c->cudnn);
    if (c->have_scratch_event) cudaEventDestroy(c->scratch_done);
    pthread_mutex_destroy(&c->scratch_lock);
    free(c);
  }
  free(b);
}

extern "C" mf_status mf_backend_cuda_create(const mf_cuda_backend_opts *opts, mf_backend **out) {
  *out = NULL;
  mf_cuda_backend_opts o = {0, 0, 0, MF_CUDA_EXPERT_GEMM_AUTO, MF_CUDA_ATTENTION_AUTO};
  if (opts) o = *opts;
  if (o.scratch_bytes == 0) o.scratch_bytes = MF_CUDA_SCRATCH_DEFAULT;
  int n = 0;
  char why[256] = "";
  MF_CHECK(mf_cuda_device_count(&n, why, sizeof why));
  if (n == 0) return MF_ERR(MF_ERR_NO_DEVICE, "cuda backend: no usable GPU (%s)", why);
  if (o.device < 0 || o.device >= n)
    return MF_ERR(MF_ERR_NO_DEVICE, "cuda backend: device %d asked for, %d device%s visible", o.device, n,
                  n == 1 ? "" : "s");

  mf_backend *b = (mf_backend *)calloc(1, sizeof *b);
  cuda_impl *c = (cuda_impl *)calloc(1, sizeof *c);
  if (!b || !c) {
    free(b);
    free(c);
    return MF_ERR(MF_ERR_OUT_OF_MEMORY, "cuda backend: out of memory");
  }
  c->device = o.device;
  pthread_mutex_init(&c->scratch_lock, NULL);
  *b = mf_backend{
      /* .name = */ "cuda",
      /* .impl = */ c,
      /* .arena_create = */ cuda_arena_create,
      /* .host_alloc = */ cuda_host_alloc,
      /* .host_free = */ cuda_host_free,
      /* .stream_create = */ cuda_stream_create,
      /* .stream_free = */ cuda_stream_free,
      /* .stream_sync = */ cuda_stream_sync,
      /* .event_create = */ cuda_event_create,
      /* .event_free = */ cuda_event_free,
      /* .event_record = */ cuda_event_record,
      /* .stream_wait = */ cuda_stream_wait,
      /* .host_fn = */ cuda_host_fn,
      /* .event_query = */ cuda_event_query,
      /* .event_create_timed = */ cuda_event_create_timed,
      /* .event_elapsed = */ cuda_event_elapsed,
      /* .copy = */ cuda_copy,
      /* .run = */ cuda_run,
      /* .mark = */ NULL, /* no checking mode on cuda */
      /* .get_stats = */ cuda_get_stats,
      /* .free = */ cuda_free,
      /* .host_register = */ cuda_host_register,
      /* .host_unregister = */ cuda_host_unregister,
      /* .native_stream = */ cuda_native_stream,
  };
  mf_status st = MF_OK;
  cudaError_t e = cudaSetDevice(c->device);
  if (e == cudaSuccess) {
    void *p = NULL;
    e = cudaMalloc(&p, o.scratch_bytes);
    if (e == cudaSuccess) c->scratch = p;
  }
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&c->scratch_done, cudaEventDisableTiming);
  if (e == cudaSuccess) c->have_scratch_event = 1;
  if (e != cudaSuccess) {
    cudaGetLastError();
    st = MF_ERR(MF_ERR_CUDA,
                "cuda backend: setting up device %d (kernel scratch of %zu bytes) failed: %s (%s)", c->device,
                o.scratch_bytes, cudaGetErrorString(e), cudaGetErrorName(e));
    cuda_free(b);
    return st;
  }
  c->scratch_bytes = o.scratch_bytes;
  if (o.gemm_workspace_bytes == 0) o.gemm_workspace_bytes = MF_CUDA_GEMM_WORKSPACE_DEFAULT;
  st = mf_cuda_blas_create(c->device, o.gemm_workspace_bytes, &c->blas);
  if (st == MF_OK) st = mf_backend_cuda_set_expert_gemm(b, o.expert_gemm);
  if (st == MF_OK) st = mf_backend_cuda_set_attention(b, o.attention);
  if (st != MF_OK) {
    cuda_free(b);
    return st;
  }
  *out = b;
  return MF_OK;
}

extern "C" mf_status mf_backend_cuda_set_expert_gemm(mf_backend *b, int which) {
  if (!b || strcmp(b->name, "cuda") != 0)
    return MF_ERR(MF_ERR_INVALID_ARG, "mf_backend_cuda_set_expert_gemm: not a cuda backend");
  cuda_impl *c = impl_of(b);
  if (which == MF_CUDA_EXPERT_GEMM_AUTO || which == MF_CUDA_EXPERT_GEMM_MMA) {
    // auto: mma, the kernel measured on a GPU (a run sets the kernel its plan
    // chose by name: planner/run_plan.h mf_run_plan_kernels)
    c->expert_cutlass = 0;
    return MF_OK;
  }
  if (which != MF_CUDA_EXPERT_GEMM_CUTLASS)
    return MF_ERR(MF_ERR_INVALID_ARG,
                  "expert GEMM kernel %d: expected MF_CUDA_EXPERT_GEMM_AUTO, _MMA or _CUTLASS", which);
  if (!mf_cuda_expert_cutlass_built())
    return MF_ERR(MF_ERR_UNSUPPORTED,
                  "the cutlass expert GEMM: moefit was built without CUTLASS's headers (tools/setup installs "
                  "them where the CUDA toolkit is; then build again)");
  cudaDeviceProp p;
  MF_CUDA_CHECK(cudaGetDeviceProperties(&p, c->device));
  if (p.major != 9) {
    return MF_ERR(MF_ERR_UNSUPPORTED,
                  "the cutlass expert GEMM is built for sm_90 only; device %d is %s (sm_%d%d)", c->device,
                  p.name, p.major, p.minor);
  }
  c->expert_cutlass = 1;
  return MF_OK;
}

extern "C" const char *mf_backend_cuda_expert_gemm(const mf_backend *b) {
  if (!b || strcmp(b->name, "cuda") != 0) return NULL;
  return ((const cuda_impl *)b->impl)->expert_cutlass ? "cutlass sm90 (wgmma + TMA)" : "mma.sync";
}

extern "C" mf_status mf_backend_cuda_set_attention(mf_backend *b, int which) {
  if (!b || strcmp(b->name, "cuda") != 0)
    return MF_ERR(MF_ERR_INVALID_ARG, "mf_backend_cuda_set_attention: not a cuda backend");
  cuda_impl *c = impl_of(b);
  if (which == MF_CUDA_ATTENTION_AUTO || which == MF_CUDA_ATTENTION_MMA) {
    // auto: mma, as for the expert GEMM
    c->attn_cudnn = 0;
    return MF_OK;
  }
  if (which != MF_CUDA_ATTENTION_CUDNN)
    return MF_ERR(MF_ERR_INVALID_ARG, "attention kernel %d: expected MF_CUDA_ATTENTION_AUTO, _MMA or _CUDNN",
                  which);
  if (!c->cudnn) {
    SET_DEVICE(c);
    MF_CHECK(mf_cuda_cudnn_create(&c->cudnn));
  }
  c->attn_cudnn = 1;
  return MF_OK;
}

extern "C" const char *mf_backend_cuda_attention(const mf_backend *b) {
  if (!b || strcmp(b->name, "cuda") != 0) return NULL;
  return ((const cuda_impl *)b->impl)->attn_cudnn ? "cudnn" : "mma.sync";
}

extern "C" uint64_t mf_backend_cuda_cudnn_calls(const mf_backend *b) {
  if (!b || strcmp(b->name, "cuda") != 0) return 0;
  return __atomic_load_n(&((const cuda_impl *)b->impl)->cudnn_calls, __ATOMIC_RELAXED);
}

extern "C" uint64_t mf_backend_cuda_mma_calls(int which) {
  return mf_cuda_mma_calls(which);
}

extern "C" uint64_t mf_backend_cuda_cutlass_calls(const mf_backend *b) {
  if (!b || strcmp(b->name, "cuda") != 0) return 0;
  return __atomic_load_n(&((const cuda_impl *)b->impl)->cutlass_calls, __ATOMIC_RELAXED);
}
