/* The cpu backend's optimizer kernels (kernels/backend.h MF_K_GRAD_SUMSQ,
 * MF_K_ADAMW): the host optimizer's own functions on the call's buffers. */
#include "kernels/backend.h"
#include "src/optim/optim.h"

/* ADAMW. An F32 param is the master, updated in place; state holds m then v.
 * A BF16 param (BF16 storage) is the master's working copy: state holds the
 * fp32 master first (n floats), then m and v; the update runs on the master
 * and writes the param as its bf16 rounding — the cuda backend's layout
 * (kernels/backend.c's table) and the step program's state bytes. */
static mf_status run_adamw(const mf_kernel_call *k, mf_threadpool *pool) {
  const int64_t n = k->i[0];
  const mf_dtype pd = k->b[0].dtype != MF_DTYPE_INVALID ? k->b[0].dtype : MF_DTYPE_F32;
  if (pd != MF_DTYPE_F32 && pd != MF_DTYPE_BF16)
    return MF_ERR(MF_ERR_UNSUPPORTED, "optimizer kernel adamw%s%s: its param is %s; it must be F32 or BF16",
                  k->label ? " in " : "", k->label ? k->label : "", mf_dtype_name(pd));
  const mf_dtype md = k->i[2] ? MF_DTYPE_BF16 : MF_DTYPE_F32;
  const size_t ms = mf_dtype_size(md);
  const size_t master = pd == MF_DTYPE_BF16 ? (size_t)n * sizeof(float) : 0;
  if ((uint64_t)n > SIZE_MAX / 16 || k->b[0].bytes < (size_t)n * mf_dtype_size(pd) ||
      k->b[1].bytes < (size_t)n * sizeof(float) || k->b[2].bytes < master + 2 * (size_t)n * ms)
    return MF_ERR(
        MF_ERR_INVALID_ARG,
        "optimizer kernel adamw: %lld elements (%s param, %s moments) do not fit its buffers (param "
        "%zu bytes, grad %zu bytes, state %zu bytes)",
        (long long)n, mf_dtype_name(pd), mf_dtype_name(md), k->b[0].bytes, k->b[1].bytes, k->b[2].bytes);
  const double coef = k->f[5];
  if (coef < 1.0) {
    const mf_optim_buf g = {(float *)k->b[1].ptr, (size_t)n};
    MF_CHECK(mf_optim_grad_scale(&g, 1, coef, pool));
  }
  const mf_adamw_hparams h = {k->f[0], k->f[1], k->f[2], k->f[3], k->f[4]};
  char *state = (char *)k->b[2].ptr;
  char *mv = state + master; /* m, then v */
  mf_adamw_bufs b = {(float *)k->b[0].ptr, k->b[1].ptr, mv, mv + (size_t)n * ms, NULL, (size_t)n,
                     MF_DTYPE_F32,         md};
  if (pd == MF_DTYPE_BF16) {
    b.param = (float *)state;
    b.bf16_out = (uint16_t *)k->b[0].ptr;
  }
  return mf_adamw_update_bufs(&h, k->i[1], &b, pool);
}

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
  return run_adamw(k, pool);
}
