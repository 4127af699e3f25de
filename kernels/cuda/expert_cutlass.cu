// The grouped expert GEMMs of BF16 storage on Hopper's wgmma and TMA, through
// CUTLASS 4.x's sm90 ptr-array grouped GEMM (headers from the nvidia-cutlass
// wheel, installed by tools/setup; ops.cuh: mf_cuda_expert_cutlass_*). The same
// three products as expert_mma.cu, per expert e with rows r in
// [offsets[e], offsets[e+1]):
//   FWD:  ye[r, n]    = sum_k xe[r, k]  W_e[n*Kd + k]   GEMM M = rows, N = N,  K = Kd
//   DATA: dxe[r, k]   = sum_n dye[r, n] W_e[n*Kd + k]   GEMM M = rows, N = Kd, K = N
//   WGT:  dW_e[n, k] += sum_r dye[r, n] xe[r, k]        GEMM M = N,    N = Kd, K = rows
// In CUTLASS's terms (A is M x K, B is N x K): FWD is A row-major (K-major), B
// column-major (W_e as stored, K-major); DATA is A row-major, B row-major
// (W_e read N-major: TMA and wgmma take the 16-bit transpose); WGT is A
// column-major (dye read M-major), B row-major (xe N-major), C = D = dW_e in
// fp32 with beta 1, so the sum lands on the old gradient in the epilogue.
//
// Why CUTLASS: cuBLASLt 13.0 has no grouped GEMM with device-side sizes (its
// cublasGemmGroupedBatchedEx takes host arrays, a sync per call), and our
// mma.sync kernel ran at 23-28% of the dense bf16 rate on an H100; wgmma with
// TMA multicast-free 128 x 128 x 64 tiles and a warp-specialized persistent
// schedule is what cuBLAS itself runs for the dense GEMM.
//
// The row counts stay on the device: one small launch (fill_groups) reads
// offsets and writes each group's problem shape, operand pointers and strides
// into the kernel scratch; the grouped kernel is then launched with as many
// CTAs as the GPU has SMs (CUTLASS's persistent group scheduler, told there are
// no host-side shapes) and walks the groups' tiles on the device. An expert with
// no rows (or no weights) gets shape 0 x 0 x 0: no tile, its pointers never read;
// the rows of one with rows and no weights (a cold expert's LoRA adapter) are
// zeroed by one more small launch (zero_rows), made only when a pointer is NULL.
// Each output tile is owned by one CTA and summed over K in one order (no split
// K), so two runs give the same bits. Results agree with the round_bf16 cpu
// twin to the same tolerance as the mma.sync kernel (fp32 accumulation in a
// different order; one rounding of FWD / DATA outputs to bf16).
//
// Conditions (else *ran = 0 and nothing is launched, as for expert_mma.cu):
// built with CUTLASS (MF_HAVE_CUTLASS), an sm_90 device, N and Kd multiples of
// 8 (TMA: every row stride a multiple of 16 bytes), operand and expert pointers
// 16-byte aligned, E in [1, MF_CUDA_MAX_EXPERTS], and the scratch large enough
// (CUTLASS's workspace for the GPU's SMs, then the E groups' arrays).
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops.cuh"

#ifndef MF_HAVE_CUTLASS
#define MF_HAVE_CUTLASS 0
#endif

#if MF_HAVE_CUTLASS

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/thread/linear_combination.h"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"

// A named namespace: nvcc's host stubs of kernels in an anonymous one clash
// with cute's own anonymous namespaces.
namespace mf_cutlass {

using cute::_1;
using cute::_128;
using cute::_64;
using cute::make_shape;
using cute::Shape;

enum { CK_FWD = 0, CK_DATA = 1, CK_WGT = 2 };

using Problem = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
using Bf16 = cutlass::bfloat16_t;
using RowMajor = cutlass::layout::RowMajor;
using ColMajor = cutlass::layout::ColumnMajor;

// One grouped GEMM: A and B bf16 in the given layouts, fp32 accumulators, D of
// ElementD row-major, C (the source) ElementC row-major or void (none).
template <class LayoutA, class LayoutB, class ElementC, class ElementD>
struct grouped {
  using Tile = Shape<_128, _128, _64>;
  using Cluster = Shape<_1, _1, _1>;
  static constexpr int kAlignAB = 8;                          // 16 bytes of bf16
  static constexpr int kAlignD = 16 / (int)sizeof(ElementD);  // 16 bytes
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, ElementC, RowMajor *, kAlignD, ElementD,
      RowMajor *, kAlignD, cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
      cutlass::epilogue::fusion::LinearCombination<ElementD, float, ElementC, float>>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Bf16, LayoutA *, kAlignAB, Bf16, LayoutB *,
      kAlignAB, float, Tile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Problem, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideC = typename Kernel::InternalStrideC;
  using StrideD = typename Kernel::InternalStrideD;
  using CPtr = typename Gemm::ElementC const *;  // void const * without a source
};

using GemmFwd = grouped<RowMajor, ColMajor, void, Bf16>;
using GemmData = grouped<RowMajor, RowMajor, void, Bf16>;
using GemmWgt = grouped<ColMajor, RowMajor, float, float>;

// The per-group arrays in the scratch, after CUTLASS's own workspace.
template <class G>
struct group_arrays {
  Problem::UnderlyingProblemShape *shape;
  const Bf16 **a;
  const Bf16 **b;
  typename G::CPtr *c;
  typename G::Gemm::ElementD **d;
  typename G::StrideA *sa;
  typename G::StrideB *sb;
  typename G::StrideC *sc;
  typename G::StrideD *sd;
};

struct expert_ptrs {
  const void *p[MF_CUDA_MAX_EXPERTS];
};

constexpr size_t kAlign = 256;

size_t round_up(size_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}

// Lays the arrays of E groups out from `base` (bytes used in *bytes); base may
// be null to size them.
template <class G>
group_arrays<G> lay_out(char *base, int64_t E, size_t *bytes) {
  group_arrays<G> g;
  size_t off = 0;
  auto take = [&](auto **p, size_t each) {
    *p = base ? reinterpret_cast<std::remove_reference_t<decltype(*p)>>(base + off) : nullptr;
    off += round_up(each * (size_t)E);
  };
  take(&g.shape, sizeof *g.shape);
  take(&g.a, sizeof *g.a);
  take(&g.b, sizeof *g.b);
  take(&g.c, sizeof *g.c);
  take(&g.d, sizeof *g.d);
  take(&g.sa, sizeof *g.sa);
  take(&g.sb, sizeof *g.sb);
  take(&g.sc, sizeof *g.sc);
  take(&g.sd, sizeof *g.sd);
  *bytes = off;
  return g;
}

// One thread per expert: its group's shape, pointers and strides (the header).
// `in` is xe (FWD), dye (DATA, WGT); `in2` xe (WGT); `out` ye / dxe (row-major
// bf16), unused for WGT, whose outputs are the expert pointers (dW_e).
template <int KIND, class G>
__global__ void fill_groups(const int64_t *offsets, int E, int64_t N, int64_t Kd, const Bf16 *in,
                            const Bf16 *in2, Bf16 *out, const expert_ptrs W, group_arrays<G> g) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= E) return;
  const int64_t r0 = offsets[e], rows = offsets[e + 1] - r0;
  const void *w = W.p[e];
  const bool idle = rows <= 0 || !w;  // no rows, or no weights (zero_rows writes those rows)
  int m, n, k;
  if (KIND == CK_FWD) {
    m = (int)rows, n = (int)N, k = (int)Kd;
    g.a[e] = in + r0 * Kd;
    g.b[e] = (const Bf16 *)w;
    g.d[e] = (typename G::Gemm::ElementD *)(out + r0 * N);
  } else if (KIND == CK_DATA) {
    m = (int)rows, n = (int)Kd, k = (int)N;
    g.a[e] = in + r0 * N;
    g.b[e] = (const Bf16 *)w;
    g.d[e] = (typename G::Gemm::ElementD *)(out + r0 * Kd);
  } else {
    m = (int)N, n = (int)Kd, k = (int)rows;
    g.a[e] = in + r0 * N;
    g.b[e] = in2 + r0 * Kd;
    g.d[e] = (typename G::Gemm::ElementD *)w;
  }
  g.c[e] = (typename G::CPtr)g.d[e];
  if (idle) m = n = k = 0;
  g.shape[e] = make_shape(m, n, k);
  // Packed strides from the extents; a zero extent would give a zero stride, so
  // an idle group (never read) keeps the real leading dimensions.
  const int sm = idle ? 1 : m, sn = idle ? 1 : n, sk = idle ? 1 : k;
  const int lm = KIND == CK_WGT ? (int)N : sm, ln = KIND == CK_WGT ? (int)Kd : sn;
  const int lk = KIND == CK_FWD ? (int)Kd : KIND == CK_DATA ? (int)N : sk;
  g.sa[e] = cutlass::make_cute_packed_stride(typename G::StrideA{}, make_shape(lm, lk, 1));
  g.sb[e] = cutlass::make_cute_packed_stride(typename G::StrideB{}, make_shape(ln, lk, 1));
  g.sc[e] = cutlass::make_cute_packed_stride(typename G::StrideC{}, make_shape(lm, ln, 1));
  g.sd[e] = cutlass::make_cute_packed_stride(typename G::StrideD{}, make_shape(lm, ln, 1));
}

// FWD / DATA: the rows of an expert with rows but no weights (a cold expert's
// LoRA adapter) are zeros; block e writes expert e's, Nout bf16 a row.
__global__ void zero_rows(const int64_t *offsets, int64_t Nout, const expert_ptrs W, Bf16 *out) {
  const int e = blockIdx.x;
  if (W.p[e]) return;
  const int64_t r0 = offsets[e], n = (offsets[e + 1] - r0) * Nout;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) out[r0 * Nout + i] = Bf16(0.0f);
}

bool aligned16(const void *p) {
  return ((uintptr_t)p & 15) == 0;
}

// The device's SM count and whether it is an sm_90 part, asked once per device.
struct device_facts {
  int device = -1, sms = 0, sm90 = 0;
};

mf_status facts(device_facts *f) {
  int dev = 0;
  MF_CUDA_CHECK(cudaGetDevice(&dev));
  static thread_local device_facts cached;
  if (cached.device != dev) {
    int major = 0, sms = 0;
    MF_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    MF_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    cached.device = dev, cached.sms = sms, cached.sm90 = major == 9;
  }
  *f = cached;
  return MF_OK;
}

template <class G>
typename G::Gemm::Arguments arguments(int64_t E, const group_arrays<G> &g, const device_facts &f,
                                      float beta) {
  typename G::Gemm::Arguments args;
  args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
  args.problem_shape = Problem{(int)E, g.shape, nullptr};
  args.mainloop = {g.a, g.sa, g.b, g.sb};
  args.epilogue.thread.alpha = 1.0f;
  args.epilogue.thread.beta = beta;
  args.epilogue.ptr_C = beta != 0.0f ? g.c : nullptr;
  args.epilogue.dC = beta != 0.0f ? g.sc : nullptr;
  args.epilogue.ptr_D = g.d;
  args.epilogue.dD = g.sd;
  args.hw_info.device_id = f.device;
  args.hw_info.sm_count = f.sms;
  return args;
}

// The scratch one call of G needs: CUTLASS's workspace, then the group arrays.
template <class G>
size_t scratch_need(int64_t E, const device_facts &f, size_t *workspace) {
  size_t arrays = 0;
  group_arrays<G> g = lay_out<G>(nullptr, E, &arrays);
  *workspace = round_up(G::Gemm::get_workspace_size(arguments<G>(E, g, f, 0.0f)));
  return *workspace + arrays;
}

template <int KIND, class G>
mf_status run(const int64_t *offsets, int64_t E, int64_t N, int64_t Kd, const void *in, const void *in2,
              void *out, const void *const *experts, void *scratch, size_t scratch_bytes, int *ran,
              cudaStream_t s) {
  *ran = 0;
  device_facts f;
  MF_CHECK(facts(&f));
  if (!f.sm90 || E <= 0 || E > MF_CUDA_MAX_EXPERTS || !experts || N <= 0 || Kd <= 0 || N % 8 || Kd % 8 ||
      N > INT32_MAX || Kd > INT32_MAX || !aligned16(in) || (in2 && !aligned16(in2)) ||
      (out && !aligned16(out)) || !scratch)
    return MF_OK;
  expert_ptrs W;
  memset(&W, 0, sizeof W);
  bool null = false;
  for (int64_t e = 0; e < E; e++) {
    if (experts[e] && !aligned16(experts[e])) return MF_OK;
    W.p[e] = experts[e];
    null |= !experts[e];
  }
  size_t ws = 0;
  if (scratch_need<G>(E, f, &ws) > scratch_bytes) return MF_OK;
  size_t arrays = 0;
  group_arrays<G> g = lay_out<G>((char *)scratch + ws, E, &arrays);
  fill_groups<KIND, G><<<(unsigned)((E + 127) / 128), 128, 0, s>>>(offsets, (int)E, N, Kd, (const Bf16 *)in,
                                                                   (const Bf16 *)in2, (Bf16 *)out, W, g);
  MF_CUDA_CHECK_LAUNCH();
  if (null && KIND != CK_WGT) {
    zero_rows<<<(unsigned)E, 256, 0, s>>>(offsets, KIND == CK_FWD ? N : Kd, W, (Bf16 *)out);
    MF_CUDA_CHECK_LAUNCH();
  }
  typename G::Gemm gemm;
  const auto args = arguments<G>(E, g, f, KIND == CK_WGT ? 1.0f : 0.0f);
  cutlass::Status st = gemm.can_implement(args);
  if (st != cutlass::Status::kSuccess)
    return MF_ERR(MF_ERR_CUDA, "cutlass grouped expert GEMM (kind %d): can_implement: %s", KIND,
                  cutlassGetStatusString(st));
  st = gemm.initialize(args, scratch, s);
  if (st == cutlass::Status::kSuccess) st = gemm.run(s);
  if (st != cutlass::Status::kSuccess)
    return MF_ERR(MF_ERR_CUDA, "cutlass grouped expert GEMM (kind %d): %s (%s)", KIND,
                  cutlassGetStatusString(st), cudaGetErrorString(cudaGetLastError()));
  MF_CUDA_CHECK_LAUNCH();
  *ran = 1;
  return MF_OK;
}

}  // namespace mf_cutlass

using namespace mf_cutlass;

mf_status mf_cuda_expert_cutlass_fwd(const mf_bf16 *xe, const mf_bf16 *const *W, const int64_t *offsets,
                                     int64_t R, int64_t E, int64_t N, int64_t Kd, mf_bf16 *ye, void *scratch,
                                     size_t scratch_bytes, int *ran, cudaStream_t s) {
  *ran = 0;
  if (R <= 0) return MF_OK;
  return run<CK_FWD, GemmFwd>(offsets, E, N, Kd, xe, nullptr, ye, (const void *const *)W, scratch,
                              scratch_bytes, ran, s);
}

mf_status mf_cuda_expert_cutlass_bwd_data(const mf_bf16 *dye, const mf_bf16 *const *W, const int64_t *offsets,
                                          int64_t R, int64_t E, int64_t N, int64_t Kd, mf_bf16 *dxe,
                                          void *scratch, size_t scratch_bytes, int *ran, cudaStream_t s) {
  *ran = 0;
  if (R <= 0) return MF_OK;
  return run<CK_DATA, GemmData>(offsets, E, N, Kd, dye, nullptr, dxe, (const void *const *)W, scratch,
                                scratch_bytes, ran, s);
}

mf_status mf_cuda_expert_cutlass_bwd_weight(const mf_bf16 *dye, const mf_bf16 *xe, const int64_t *offsets,
                                            int64_t E, int64_t N, int64_t Kd, float *const *dW, void *scratch,
                                            size_t scratch_bytes, int *ran, cudaStream_t s) {
  return run<CK_WGT, GemmWgt>(offsets, E, N, Kd, dye, xe, nullptr, (const void *const *)dW, scratch,
                              scratch_bytes, ran, s);
}

#else  // built without CUTLASS: the path never takes a call

mf_status mf_cuda_expert_cutlass_fwd(const mf_bf16 *, const mf_bf16 *const *, const int64_t *, int64_t,
                                     int64_t, int64_t, int64_t, mf_bf16 *, void *, size_t, int *ran,
                                     cudaStream_t) {
  *ran = 0;
  return MF_OK;
}

mf_status mf_cuda_expert_cutlass_bwd_data(const mf_bf16 *, const mf_bf16 *const *, const int64_t *, int64_t,
                                          int64_t, int64_t, int64_t, mf_bf16 *, void *, size_t, int *ran,
                                          cudaStream_t) {
  *ran = 0;
  return MF_OK;
}

mf_status mf_cuda_expert_cutlass_bwd_weight(const mf_bf16 *, const mf_bf16 *, const int64_t *, int64_t,
                                            int64_t, int64_t, float *const *, void *, size_t, int *ran,
                                            cudaStream_t) {
  *ran = 0;
  return MF_OK;
}

#endif  // MF_HAVE_CUTLASS

int mf_cuda_expert_cutlass_built(void) {
  return MF_HAVE_CUTLASS ? 1 : 0;
}
