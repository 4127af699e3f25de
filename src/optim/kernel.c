/* The cpu backend's optimizer kernels (kernels/backend.h MF_K_GRAD_SUMSQ,
 * MF_K_ADAMW): the host optimizer's own functions on the call's buffers. */
#include "kernels/backend.h"
#include "src/optim/optim.h"

mf_status mf_optim_run_kernel(const mf_kernel_call *k, mf_threadpool *pool) {
  if (!k) return MF_ERR(MF_ERR_INVALID_ARG, "optimizer kernel: NULL call");
  const int64_t n = k->i[0];
  if (n < 0)
    return MF_ERR(MF_ERR_INVALID_ARG, "optimizer kernel %s: %lld elements", mf_kernel_name(k->kind),
                  (long long)n);
  if (k->kind == MF_K_GRAD_SUMSQ) {
    const int64_t first = k->i[1];
    const size_t chunks = mf_optim_norm_chunks((size_t)n);
    if (first < 0 || k->b[0].bytes < (size_t)n * sizeof(float) ||
        k->b[1].bytes < ((size_t)first + chunks) * sizeof(double))
      return MF_ERR(MF_ERR_INVALID_ARG,
                    "optimizer kernel grad_sumsq: %lld elements from chunk %lld do not fit its buffers",
                    (long long)n, (long long)first);
    return mf_optim_grad_chunk_sumsq((const float *)k->b[0].ptr, (size_t)n, pool,
                                     (double *)k->b[1].ptr + first);
  }
  if (k->kind != MF_K_ADAMW)
    return MF_ERR(MF_ERR_INVALID_ARG, "optimizer kernel: %s is not one", mf_kernel_name(k->kind));
  const mf_dtype md = k->i[2] ? MF_DTYPE_BF16 : MF_DTYPE_F32;
  const size_t ms = mf_dtype_size(md);
  if (k->b[0].bytes < (size_t)n * sizeof(float) || k->b[1].bytes < (size_t)n * sizeof(float) ||
      k->b[2].bytes < 2 * (size_t)n * ms)
    return MF_ERR(MF_ERR_INVALID_ARG, "optimizer kernel adamw: %lld elements do not fit its buffers",
                  (long long)n);
  const double coef = k->f[5];
  if (coef < 1.0) {
    const mf_optim_buf g = {(float *)k->b[1].ptr, (size_t)n};
    MF_CHECK(mf_optim_grad_scale(&g, 1, coef, pool));
  }
  const mf_adamw_hparams h = {k->f[0], k->f[1], k->f[2], k->f[3], k->f[4]};
  char *state = (char *)k->b[2].ptr;
  const mf_adamw_bufs b = {(float *)k->b[0].ptr, k->b[1].ptr, state, state + (size_t)n * ms, NULL, (size_t)n,
                           MF_DTYPE_F32,         md};
  return mf_adamw_update_bufs(&h, k->i[1], &b, pool);
}
