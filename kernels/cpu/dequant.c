/* DEQUANT: a frozen weight stored quantized to fp32 (kernels/backend.h,
 * src/core/qformat.h). The rows are split over the pool's threads; every
 * element is mf_qweight_at, the one definition the host code and the cuda
 * twin read too. */
#include "kernels/cpu/cpu_ops.h"
#include "src/core/qformat.h"

#define DQ_PARALLEL_MIN (1 << 15) /* elements */

typedef struct dq_args {
  mf_qweight w;
  float *y;
  int round_bf16;
} dq_args;

static void dq_task(void *arg, int i, int n) {
  const dq_args *a = (const dq_args *)arg;
  size_t b, e;
  mf_partition((size_t)a->w.rows, 1, i, n, &b, &e);
  for (int64_t r = (int64_t)b; r < (int64_t)e; r++)
    for (int64_t c = 0; c < a->w.cols; c++) {
      const float v = mf_qweight_at(&a->w, r, c);
      a->y[r * a->w.cols + c] = a->round_bf16 ? mf_round_to_bf16(v) : v;
    }
}

mf_status mf_cpu_dequant(const uint8_t *qw, int64_t kind, int64_t rows, int64_t cols, int64_t blocksize,
                         int64_t nested, float *y, const mf_kctx *ctx) {
  if (kind <= MF_QUANT_NONE || kind >= MF_QUANT_COUNT_)
    return MF_ERR(MF_ERR_INVALID_ARG, "dequant: format %lld is not NF4, FP8 or MXFP4", (long long)kind);
  if (rows <= 0 || cols <= 0) return MF_OK;
  dq_args a = {{(int32_t)kind, (int32_t)nested, rows, cols, blocksize, 0, 0, 0, 0, 0.0f}, y, ctx->round_bf16};
  mf_qweight_blob_view(&a.w, qw);
  if ((double)rows * (double)cols < DQ_PARALLEL_MIN)
    dq_task(&a, 0, 1);
  else
    mf_threadpool_run(ctx->pool, dq_task, &a);
  return MF_OK;
}
