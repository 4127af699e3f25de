/* The cost model's rates and times from a hardware profile (see hwprofile.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planner/hwprofile.h"
#include "planner/hwprofile_internal.h"

/* ---------------------------------------------------------- cost model */

/* rate at x from (key[i], rate[i]): log-log between the nearest keys below and
 * above (equal keys averaged), clamped outside. NAN for an empty table. */
static double interp(const double *key, const double *rate, int n, double x) {
  double lo = -INFINITY, hi = INFINITY;
  for (int i = 0; i < n; i++) {
    double k = key[i];
    if (k <= x && k > lo) lo = k;
    if (k >= x && k < hi) hi = k;
  }
  double r_lo = 0, r_hi = 0;
  int c_lo = 0, c_hi = 0;
  for (int i = 0; i < n; i++) {
    double k = key[i];
    if (k == lo) r_lo += rate[i], c_lo++;
    if (k == hi) r_hi += rate[i], c_hi++;
  }
  if (!c_lo && !c_hi) return NAN;
  if (!c_lo) return r_hi / c_hi;
  if (!c_hi || lo == hi) return r_lo / c_lo;
  r_lo /= c_lo, r_hi /= c_hi;
  double t = log(x / lo) / log(hi / lo);
  return exp(log(r_lo) + t * log(r_hi / r_lo));
}

double mf_hw_gemm_rate(const mf_hwprofile *p, double m, double n, double k) {
  double key[MF_HW_MAX_POINTS], rate[MF_HW_MAX_POINTS];
  int np = p->n_gemm < MF_HW_MAX_POINTS ? p->n_gemm : MF_HW_MAX_POINTS;
  for (int i = 0; i < np; i++) key[i] = gemm_work(&p->gemm[i]), rate[i] = p->gemm[i].flops;
  return interp(key, rate, np, 2.0 * m * n * k);
}

double mf_hw_attention_rate(const mf_hwprofile *p, double s, double d) {
  double key[MF_HW_MAX_POINTS], rate[MF_HW_MAX_POINTS];
  int np = p->n_attn < MF_HW_MAX_POINTS ? p->n_attn : MF_HW_MAX_POINTS;
  for (int i = 0; i < np; i++) key[i] = p->attn[i].s * p->attn[i].d, rate[i] = p->attn[i].flops;
  return interp(key, rate, np, s * d);
}

double mf_hw_attention_flops(double B, double S, double Hq, double D, int backward) {
  double fwd = 2.0 * B * Hq * D * S * (S + 1);
  return backward ? 2.5 * fwd : fwd;
}

double mf_hw_gemm_seconds(const mf_hwprofile *p, double m, double n, double k) {
  if (!(m > 0 && n > 0 && k > 0)) return 0;
  return 2.0 * m * n * k / mf_hw_gemm_rate(p, m, n, k) + p->launch_s;
}

double mf_hw_attention_seconds(const mf_hwprofile *p, double flops, double s, double d) {
  if (!(flops > 0)) return 0;
  return flops / mf_hw_attention_rate(p, s, d) + p->launch_s;
}

double mf_hw_elementwise_seconds(const mf_hwprofile *p, double bytes) {
  if (!(bytes > 0)) return 0;
  return bytes / p->elementwise_bandwidth + p->launch_s;
}

double mf_hw_link_bandwidth(const mf_hwprofile *p) {
  if (p->nvlink_bandwidth > 0) return p->nvlink_bandwidth;
  if (p->copies_overlap_compute)
    return p->h2d_bandwidth < p->d2h_bandwidth ? p->h2d_bandwidth : p->d2h_bandwidth;
  return p->host_memory_bandwidth;
}

double mf_hw_copy_seconds(const mf_hwprofile *p, int h2d, double bytes) {
  if (!(bytes > 0)) return 0;
  return h2d ? p->h2d_latency_s + bytes / p->h2d_bandwidth : p->d2h_latency_s + bytes / p->d2h_bandwidth;
}

double mf_hw_kernel_seconds(const mf_hwprofile *p, const char *kernel, const int64_t *sizes, int n_sizes,
                            double bytes) {
  n_sizes = trim_sizes(sizes, n_sizes);
  for (int i = 0; i < p->n_kernels && i < MF_HW_MAX_KERNELS; i++)
    if (same_key(&p->kernels[i], kernel, sizes, n_sizes, bytes)) return p->kernels[i].seconds;
  return NAN;
}

double mf_hw_adamw_seconds(const mf_hwprofile *p, double params) {
  if (!(params > 0)) return 0;
  return params / p->host_adamw_params_per_s;
}
