/*
 * Hardware profiles: what the planner's cost model knows about a machine.
 * A profile is a YAML file (configs/hw/*.yaml, or written by `moefit profile`)
 * with rates measured or taken from a cited source:
 *
 *   name: "NVIDIA H100 PCIe 80GB"       # free text
 *   source: "..."                      # where the figures come from
 *   device:
 *     memory: 80GiB                     # usable device memory
 *     reserve: 2GiB                     # CUDA context, library workspaces
 *     copies_overlap_compute: true      # false on the cpu backend (one thread of work)
 *   links:
 *     h2d: {bandwidth: 25GB, latency_us: 10}   # bytes per second, per-copy latency
 *     d2h: {bandwidth: 25GB, latency_us: 10}
 *   compute:                             # achieved rates, FLOP/s, by shape
 *     gemm:      [{m: 4096, n: 4096, k: 4096, flops: 7.0e14}, ...]
 *     attention: [{s: 4096, d: 128, flops: 3.5e14}, ...]
 *     elementwise_bandwidth: 2.0TB      # bytes per second for memory-bound kernels
 *     launch_us: 5                      # fixed cost per kernel
 *   host:
 *     memory: 128GiB
 *     adamw_params_per_s: 1.2e9         # host AdamW updates per second (all threads)
 *     memory_bandwidth: 40GB
 *   nvme: {bandwidth: 3GB}              # optional
 *
 * Rates between table points are interpolated (log-log in the GEMM's FLOPs).
 */
#ifndef MF_PLANNER_HWPROFILE_H
#define MF_PLANNER_HWPROFILE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "src/core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MF_HW_MAX_POINTS 64

typedef struct mf_hw_gemm_point {
  double m, n, k;
  double flops; /* achieved FLOP/s */
} mf_hw_gemm_point;

typedef struct mf_hw_attn_point {
  double s, d;  /* sequence length, head dim */
  double flops; /* achieved FLOP/s, forward and backward alike */
} mf_hw_attn_point;

typedef struct mf_hwprofile {
  char name[128];
  char source[512];
  uint64_t device_memory;
  uint64_t device_reserve;
  int copies_overlap_compute;
  double h2d_bandwidth, h2d_latency_s;
  double d2h_bandwidth, d2h_latency_s;
  mf_hw_gemm_point gemm[MF_HW_MAX_POINTS];
  int n_gemm;
  mf_hw_attn_point attn[MF_HW_MAX_POINTS];
  int n_attn;
  double elementwise_bandwidth; /* bytes/s */
  double launch_s;
  uint64_t host_memory;
  double host_adamw_params_per_s;
  double host_memory_bandwidth;
  double nvme_bandwidth; /* 0: none */
} mf_hwprofile;

/* Loads and validates a profile file; errors name file:line:column and the key. */
mf_status mf_hwprofile_load(const char *path, mf_hwprofile *out);
/* Writes a profile as YAML (loading it back gives the same values). */
mf_status mf_hwprofile_save(const mf_hwprofile *p, const char *path);

/* Cost model pieces (seconds). */
double mf_hw_gemm_seconds(const mf_hwprofile *p, double m, double n, double k);
double mf_hw_attention_seconds(const mf_hwprofile *p, double flops, double s, double d);
double mf_hw_elementwise_seconds(const mf_hwprofile *p, double bytes);
double mf_hw_copy_seconds(const mf_hwprofile *p, int h2d, double bytes);
double mf_hw_adamw_seconds(const mf_hwprofile *p, double params);

#ifdef __cplusplus
}
#endif

#endif /* MF_PLANNER_HWPROFILE_H */
