/*
 * The load-balancing (aux) loss of transformers' load_balancing_loss_func
 * (tests/fixtures/NOTES.md, "Loss"), pooled over all MoE layers of a forward pass. With N rows in all (L layers x T tokens), E experts, top-k K:
 *   count[e] = #(row, choice) pairs that picked e   (= N * sum_j f[j,e])
 *   P[e]     = mean_n probs[n, e]
 *   aux      = E * sum_e (count[e] / N) * P[e]
 * so aux = K under uniform routing. Only P depends on probs (the selection is
 * piecewise constant), so d aux / d probs[n, e] = E * count[e] / N^2 for every
 * row n of every layer.
 *
 * Shapes: probs [T, E], topk_idx [T, K], counts/psum/dprobs-row [E].
 * Sums are serial in a fixed order (row, then choice) and in double; these
 * kernels are O(T*E), tiny next to the GEMMs, so they take no thread pool.
 */
#include "kernels/cpu/cpu_ops.h"

mf_status mf_cpu_aux_accumulate(const float *probs, const int32_t *topk_idx, int64_t T, int64_t E, int64_t K,
                                int64_t *counts, double *psum) {
  for (int64_t i = 0; i < T * K; i++) {
    if (topk_idx[i] < 0 || topk_idx[i] >= E)
      return MF_ERR(MF_ERR_INVALID_ARG, "aux loss: topk_idx[%lld] = %d is not an expert of %lld",
                    (long long)i, (int)topk_idx[i], (long long)E);
  }
  for (int64_t i = 0; i < T * K; i++) counts[topk_idx[i]]++;
  for (int64_t t = 0; t < T; t++) {
    const float *p = probs + t * E;
    for (int64_t e = 0; e < E; e++) psum[e] += (double)p[e];
  }
  return MF_OK;
}

mf_status mf_cpu_aux_value(const int64_t *counts, const double *psum, int64_t E, int64_t n_rows,
                           double *aux) {
  *aux = 0.0;
  if (n_rows <= 0) return MF_OK;
  const double N = (double)n_rows;
  double s = 0.0;
  for (int64_t e = 0; e < E; e++) s += ((double)counts[e] / N) * (psum[e] / N);
  *aux = (double)E * s;
  return MF_OK;
}

mf_status mf_cpu_aux_grad(const int64_t *counts, int64_t E, int64_t n_rows, double coef, int64_t T,
                          float *dprobs) {
  if (T <= 0 || E <= 0) return MF_OK;
  if (n_rows <= 0) return MF_ERR(MF_ERR_INVALID_ARG, "aux loss gradient over %lld rows", (long long)n_rows);
  const double N = (double)n_rows;
  for (int64_t e = 0; e < E; e++) dprobs[e] = (float)(coef * (double)E * (double)counts[e] / (N * N));
  for (int64_t t = 1; t < T; t++) {
    for (int64_t e = 0; e < E; e++) dprobs[t * E + e] = dprobs[e];
  }
  return MF_OK;
}
