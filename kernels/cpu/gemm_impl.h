/*
 * The one fp32 GEMM of the cpu kernels (private to kernels/cpu): linear.c,
 * moe.c and cross_entropy.c call it on the output blocks their threads own. It
 * never touches the thread pool and allocates nothing.
 *
 *   C[i,j] = r( (load_c ? C[i,j] : 0) + A(i,0) B(0,j) + A(i,1) B(1,j) + ... + A(i,k-1) B(k-1,j) )
 *
 * for i < m, j < n: one fp32 sum over p in order, left to right, with one
 * rounding per multiply and per add; r is mf_round_to_bf16 when `round`, else
 * the identity. k = 0 gives r(load_c ? C : 0). The layout says how A (m x k)
 * and B (k x n) are read, each through a row stride:
 *
 *   MF_CPU_GEMM_NT  A(i,p) = a[i*lda + p]   B(p,j) = b[j*ldb + p]   (C = A . B^T)
 *   MF_CPU_GEMM_NN  A(i,p) = a[i*lda + p]   B(p,j) = b[p*ldb + j]   (C = A . B)
 *   MF_CPU_GEMM_TN  A(i,p) = a[p*lda + i]   B(p,j) = b[p*ldb + j]   (C = A^T . B)
 *
 * The bits depend only on these operands, never on the blocking inside or on
 * how a caller splits C: a caller that owns each C element with one thread gets
 * the same result for any thread count.
 */
#ifndef MF_KERNELS_CPU_GEMM_IMPL_H
#define MF_KERNELS_CPU_GEMM_IMPL_H

#include <stdint.h>

typedef enum mf_cpu_gemm_layout {
  MF_CPU_GEMM_NT,
  MF_CPU_GEMM_NN,
  MF_CPU_GEMM_TN,
} mf_cpu_gemm_layout;

void mf_cpu_gemm(mf_cpu_gemm_layout layout, const float *a, int64_t lda, const float *b, int64_t ldb,
                 int64_t m, int64_t n, int64_t k, float *c, int64_t ldc, int load_c, int round);

#endif /* MF_KERNELS_CPU_GEMM_IMPL_H */
