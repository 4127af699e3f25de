/* What is specific to Mixture-of-Experts (see experts.h). */
#include "experts/experts.h"

#include <math.h>

int32_t mf_experts_heat_rank(const double *row, int64_t E, int64_t e) {
  int32_t r = 0;
  for (int64_t f = 0; f < E; f++) r += row[f] > row[e] || (row[f] == row[e] && f < e);
  return r;
}

int64_t mf_experts_lora_hot(const double *share, int64_t layers, int64_t E, double fraction, uint8_t *hot) {
  /* ceil, with a hair of slack so that 0.25 x 8 is 2, not 3 */
  int64_t k = (int64_t)ceil(fraction * (double)E - 1e-9);
  k = k < 1 ? 1 : k > E ? E : k;
  int64_t n = 0;
  for (int64_t l = 0; l < layers; l++) {
    const double *row = share + l * E;
    int routed = 0;
    for (int64_t e = 0; e < E; e++) routed |= row[e] > 0;
    for (int64_t e = 0; e < E; e++) {
      hot[l * E + e] = (uint8_t)(routed && mf_experts_heat_rank(row, E, e) < k);
      n += hot[l * E + e];
    }
  }
  return n;
}

void mf_experts_hot_quarter(int64_t E, int q, int64_t *lo, int64_t *hi) {
  *lo = (int64_t)(q - 1) * E / 4;
  *hi = (int64_t)q * E / 4;
}

double mf_experts_use_chance(double share, int64_t top_k, double tokens) {
  double q = (double)top_k * share;
  if (q > 1) q = 1;
  if (q < 0) q = 0;
  return 1.0 - pow(1.0 - q, tokens);
}

double mf_experts_expected_busy(int64_t E, int64_t top_k, double tokens) {
  const double e = (double)E, k = (double)top_k;
  double active = e * (1.0 - pow(1.0 - (k < e ? k / e : 1.0), tokens));
  if (active < 1.0) active = 1.0;
  if (active > tokens * k) active = tokens * k;
  return active;
}

int mf_experts_idle(const int64_t *counts, int64_t L, int64_t E, int32_t layer, int32_t e, int32_t mlo,
                    int32_t mhi) {
  for (int32_t m = mlo; m <= mhi; m++)
    if (counts[((int64_t)m * L + layer) * E + e] > 0) return 0;
  return 1;
}

int64_t mf_experts_group_key(const mf_program *p, int32_t k, int recompute) {
  const mf_pop *o = &p->ops[k];
  const int64_t L = p->spec.layers + 2;
  const int bwd = (o->phase == MF_PHASE_BWD || recompute) ? 1 : 0;
  return ((int64_t)(o->micro + 1) * 2 + bwd) * L + (o->layer + 1);
}
