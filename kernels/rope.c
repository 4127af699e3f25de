/*
 * RoPE's host side shared by both backends (kernels/rope.h): a call's
 * arguments checked and resolved (YaRN's correction range in double, as
 * transformers' Python floats), and YaRN's mscale for the callers
 * (kernels/backend.h).
 */
#include "kernels/rope.h"

#include <math.h>

double mf_rope_yarn_mscale(double factor, double mscale) {
  if (factor <= 1) return 1.0;
  return 0.1 * mscale * log(factor) + 1.0;
}

double mf_rope_yarn_attention_factor(double factor, double mscale, double mscale_all_dim) {
  if (mscale != 0 && mscale_all_dim != 0)
    return mf_rope_yarn_mscale(factor, mscale) / mf_rope_yarn_mscale(factor, mscale_all_dim);
  return mf_rope_yarn_mscale(factor, 1.0);
}

/* _compute_yarn_parameters' find_correction_dim: the dim whose wavelength
 * turns `rotations` times over the original context. */
static double correction_dim(double rotations, int64_t dim, double base, double original_max) {
  return ((double)dim * log(original_max / (rotations * 2 * M_PI))) / (2 * log(base));
}

mf_status mf_rope_plan_make(const mf_rope_args *a, int64_t D, mf_rope_plan *p) {
  const int64_t off = a->off;
  if (off < 0 || off > D)
    return MF_ERR(MF_ERR_INVALID_ARG, "rope: rotary offset %lld outside a head of %lld", (long long)off,
                  (long long)D);
  const int64_t rot = a->rot == 0 ? D - off : a->rot;
  if (rot < 0 || rot > D - off || (rot % 2 != 0 && rot != D - off))
    return MF_ERR(MF_ERR_INVALID_ARG,
                  "rope: %lld rotary dims of a head of %lld from dim %lld: an even number that fits, or the "
                  "rest of the head",
                  (long long)a->rot, (long long)D, (long long)off);
  if (a->interleaved != 0 && a->interleaved != 1)
    return MF_ERR(MF_ERR_INVALID_ARG, "rope: interleaved is %lld, not 0 or 1", (long long)a->interleaved);
  if (a->truncate < -1 || a->truncate > 1)
    return MF_ERR(MF_ERR_INVALID_ARG, "rope: truncate is %lld, not -1 (false), 0 (default: true) or 1",
                  (long long)a->truncate);
  if (!isfinite(a->theta) || !isfinite(a->factor) || !isfinite(a->attention_factor))
    return MF_ERR(MF_ERR_INVALID_ARG, "rope: theta %g, factor %g, attention_factor %g: not all finite",
                  a->theta, a->factor, a->attention_factor);
  p->off = off;
  p->rot = rot;
  p->half = rot / 2;
  p->step = a->interleaved ? 2 : 1;
  p->pair = a->interleaved ? 1 : p->half;
  p->theta = (float)a->theta;
  p->attn = a->attention_factor == 0 ? 1.0f : (float)a->attention_factor;
  p->scaled = p->attn != 1.0f;
  p->yarn = a->factor > 1;
  p->factor = (float)a->factor;
  p->low = 0, p->span = 1;
  if (!p->yarn) return MF_OK;

  const double beta_fast = a->beta_fast != 0 ? a->beta_fast : 32,
               beta_slow = a->beta_slow != 0 ? a->beta_slow : 1;
  if (!(a->original_max > 0) || !(a->theta > 0) || a->theta == 1 || !(beta_fast > 0) || !(beta_slow > 0) ||
      !isfinite(a->original_max) || !isfinite(beta_fast) || !isfinite(beta_slow))
    return MF_ERR(MF_ERR_INVALID_ARG,
                  "rope: YaRN (factor %g) with original_max_position_embeddings %g, theta %g, beta_fast %g, "
                  "beta_slow %g: each must be positive (theta not 1)",
                  a->factor, a->original_max, a->theta, beta_fast, beta_slow);
  /* find_correction_range, then linear_ramp_factor's guard */
  double low = correction_dim(beta_fast, rot, a->theta, a->original_max);
  double high = correction_dim(beta_slow, rot, a->theta, a->original_max);
  if (a->truncate >= 0) {
    low = floor(low);
    high = ceil(high);
  }
  if (low < 0) low = 0;
  if (high > (double)(rot - 1)) high = (double)(rot - 1);
  if (low == high) high += 0.001;
  p->low = (float)low;
  p->span = (float)(high - low);
  return MF_OK;
}
