/*
 * Hardware profiles: what the planner's cost model knows about a machine.
 * A profile is a YAML file (configs/hw/NAME.yaml, or written by `moefit profile`)
 * with rates measured or taken from a cited source:
 *
 *   name: "NVIDIA H100 PCIe 80GB"       # free text (required, < 128 bytes)
 *   source: "..."                      # where the figures come from (required, < 2048 bytes)
 *   device:
 *     memory: 80GiB                     # usable device memory (required)
 *     reserve: 2GiB                     # CUDA context, library workspaces (default 0; < memory)
 *     copies_overlap_compute: true      # false on the cpu backend (one thread of work) (required)
 *   links:
 *     h2d: {bandwidth: 25GB, latency_us: 10}   # bytes per second, per-copy latency (default 0)
 *     d2h: {bandwidth: 25GB, latency_us: 10}
 *   compute:                             # achieved rates, FLOP/s, by shape
 *     gemm:      [{m: 4096, n: 4096, k: 4096, flops: 7.0e14}, ...]
 *     attention: [{s: 4096, d: 128, flops: 3.5e14}, ...]
 *     elementwise_bandwidth: 2.0TB      # bytes per second for memory-bound kernels
 *     launch_us: 5                      # fixed cost per kernel (default 0)
 *     kernels:                          # optional: kernels timed at one program's shapes
 *       - {kernel: swiglu_fwd, sizes: [131072], bytes: 1572864, seconds: 0.00088}
 *   host:
 *     memory: 128GiB
 *     adamw_params_per_s: 1.2e9         # host AdamW updates per second (all threads)
 *     memory_bandwidth: 40GB
 *   nvme: {bandwidth: 3GB}              # optional
 *   network: {bandwidth: 25GB}          # optional: between machines, each way a node
 *   nvlink: {bandwidth: 450GB}          # optional: between a machine's GPUs, each way a GPU
 *
 * Sizes (memory, reserve) are whole bytes: mf_parse_size's units (KiB/MiB/
 * GiB/TiB binary, KB/MB/GB/TB decimal) or plain digits. A bandwidth is bytes
 * per second with the same units (25GB = 25e9 bytes/s), read as one decimal
 * number (2.3GB is 2.3e9 rounded once; fractions of a byte allowed). Numbers
 * are plain decimals (no quotes, hex, inf or nan); *_us values are read as the
 * decimal times 1e-6, so written profiles load back bit for bit. Rates,
 * bandwidths and memory must be > 0, latencies and reserve >= 0. Every section
 * and key is required unless marked otherwise; unknown and duplicate keys are
 * errors. Each table holds 1 to MF_HW_MAX_POINTS points, in any order.
 *
 * compute.kernels (written by `moefit profile --config CONFIG`) holds the
 * measured seconds of moefit's kernels at the exact calls one step program
 * makes: `kernel` is mf_kernel_name (lower case, digits, '_'; < 32 bytes),
 * `sizes` the call's integer sizes (mf_kernel_call.i without its trailing
 * zeros; at most 8, each >= 0), `bytes` the operand bytes the simulator counts
 * for it (>= 0) and `seconds` (> 0) the time, launch included. The simulator
 * uses such a point for an instruction with the same key instead of the rate
 * model below (planner/simulate.h, mf_sim_instr_key); other shapes keep the
 * model. At most MF_HW_MAX_KERNELS points; two with the same key are an error.
 *
 * Rates between table points are interpolated log-log: log(rate) is linear in
 * log(2mnk) for GEMMs and in log(s*d) for attention, between the nearest points
 * below and above (points of equal key are averaged); outside the table the
 * rate of the nearest end is used (clamped); one point is a constant rate.
 * So that a bigger GEMM never costs less, a GEMM table must have 2mnk/flops
 * non-decreasing in 2mnk (to 1 part in 1e9; the loader names the point that
 * breaks it); with that, mf_hw_gemm_seconds is non-decreasing in 2mnk
 * everywhere.
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
#define MF_HW_NAME_MAX 128    /* sizeof name, NUL included */
#define MF_HW_SOURCE_MAX 2048 /* sizeof source, NUL included */
#define MF_HW_MAX_KERNELS 256
#define MF_HW_KERNEL_NAME_MAX 32 /* sizeof kernel, NUL included */
#define MF_HW_KERNEL_SIZES 8

typedef struct mf_hw_gemm_point {
  double m, n, k;
  double flops; /* achieved FLOP/s */
} mf_hw_gemm_point;

typedef struct mf_hw_attn_point {
  double s, d;  /* sequence length, head dim */
  double flops; /* achieved FLOP/s, forward and backward alike (mf_hw_attention_flops) */
} mf_hw_attn_point;

/* One kernel call timed at its exact key (see compute.kernels above). */
typedef struct mf_hw_kernel_point {
  char kernel[MF_HW_KERNEL_NAME_MAX];
  int64_t sizes[MF_HW_KERNEL_SIZES];
  int n_sizes;    /* sizes[n_sizes - 1] != 0 when n_sizes > 0 */
  double bytes;   /* operand bytes, as the simulator counts them */
  double seconds; /* measured, launch included */
} mf_hw_kernel_point;

typedef struct mf_hwprofile {
  char name[MF_HW_NAME_MAX];
  char source[MF_HW_SOURCE_MAX];
  uint64_t device_memory;
  uint64_t device_reserve;
  int copies_overlap_compute; /* 0 or 1 */
  double h2d_bandwidth, h2d_latency_s;
  double d2h_bandwidth, d2h_latency_s;
  mf_hw_gemm_point gemm[MF_HW_MAX_POINTS];
  int n_gemm;
  mf_hw_attn_point attn[MF_HW_MAX_POINTS];
  int n_attn;
  double elementwise_bandwidth; /* bytes/s */
  double launch_s;
  mf_hw_kernel_point kernels[MF_HW_MAX_KERNELS];
  int n_kernels; /* 0: none */
  uint64_t host_memory;
  double host_adamw_params_per_s;
  double host_memory_bandwidth; /* bytes/s */
  double nvme_bandwidth;        /* bytes/s; 0: none */
  /* Between machines (`network: {bandwidth: ...}`), bytes/s each way a node:
   * what several nodes' gradient sums move at; 0: unknown (not priced). */
  double network_bandwidth;
  /* Between the GPUs of one machine (`nvlink: {bandwidth: ...}`: NVLink, or
   * PCIe peer to peer), bytes/s each way a GPU: what expert parallelism's
   * exchanges move at; 0: unknown (mf_hw_link_bandwidth's stand-in). */
  double nvlink_bandwidth;
} mf_hwprofile;

/* The bandwidth expert parallelism's exchanges move rows at, each way a
 * rank: nvlink.bandwidth when the profile has it; else, on a profile whose
 * copies overlap compute (a GPU), the slower of h2d and d2h (the rows go
 * through host memory), and on a serial one (the cpu backend: ranks of one
 * machine share memory) host.memory_bandwidth. */
double mf_hw_link_bandwidth(const mf_hwprofile *hw);

/* Loads and validates a profile file. Errors are MF_ERR_CONFIG with a message
 * "FILE:LINE:COLUMN: key.path: fault" (1-based; the key path like
 * "compute.gemm[2].flops"), MF_ERR_IO when the file cannot be read. *out is
 * written only on success. */
mf_status mf_hwprofile_load(const char *path, mf_hwprofile *out);
/* The same from text in memory; `name` stands for the file in messages. */
mf_status mf_hwprofile_parse(const char *text, size_t len, const char *name, mf_hwprofile *out);
/* Writes a profile as YAML, atomically (loading it back gives mf_hwprofile_equal
 * values). MF_ERR_INVALID_ARG (naming the field) when the profile would not load:
 * see mf_hwprofile_validate. */
mf_status mf_hwprofile_save(const mf_hwprofile *p, const char *path);
/* The YAML text of mf_hwprofile_save, to a stream. MF_ERR_IO when the write fails. */
mf_status mf_hwprofile_write(const mf_hwprofile *p, FILE *f);
/* Checks what the loader checks (ranges, table sizes, GEMM times non-decreasing,
 * reserve < memory, strings non-empty, valid UTF-8 and short enough):
 * MF_ERR_INVALID_ARG naming the field. */
mf_status mf_hwprofile_validate(const mf_hwprofile *p);
/* 1 when every field is equal (numbers exactly, tables in order). */
int mf_hwprofile_equal(const mf_hwprofile *a, const mf_hwprofile *b);

/* Interpolated achieved rates (FLOP/s); NAN for an empty table. */
double mf_hw_gemm_rate(const mf_hwprofile *p, double m, double n, double k);
double mf_hw_attention_rate(const mf_hwprofile *p, double s, double d);
/* The FLOPs counted for causal attention over B sequences of S tokens with Hq
 * query heads of dim D, as the step program counts them (src/model/program_attention.c):
 * forward 2*B*Hq*D*S*(S+1) (QK^T and PV over the causal triangle, diagonal
 * included); backward 2.5x that (five such products). Profiles' attention rates
 * and mf_hw_attention_seconds' `flops` use this count. */
double mf_hw_attention_flops(double B, double S, double Hq, double D, int backward);

/* Cost model pieces (seconds). A zero-sized piece (no FLOPs, no bytes, no
 * params) costs 0: no kernel is launched and no copy issued for it. */
/* 2mnk / rate(2mnk) + launch. */
double mf_hw_gemm_seconds(const mf_hwprofile *p, double m, double n, double k);
/* flops / rate(s*d) + launch. */
double mf_hw_attention_seconds(const mf_hwprofile *p, double flops, double s, double d);
/* bytes moved (read + written) / elementwise_bandwidth + launch. */
double mf_hw_elementwise_seconds(const mf_hwprofile *p, double bytes);
/* latency + bytes / bandwidth of the h2d (h2d != 0) or d2h link. */
double mf_hw_copy_seconds(const mf_hwprofile *p, int h2d, double bytes);
/* params / host_adamw_params_per_s. */
double mf_hw_adamw_seconds(const mf_hwprofile *p, double params);
/* The measured seconds of the compute.kernels point with this key (sizes with
 * trailing zeros are trimmed first), or NAN when the profile has none. */
double mf_hw_kernel_seconds(const mf_hwprofile *p, const char *kernel, const int64_t *sizes, int n_sizes,
                            double bytes);

/* The cpu backend's ranks on one machine share its cores, and a cpu profile
 * is measured on all of them (`moefit profile` runs a thread per core): its
 * "device" kernels and host AdamW are the cores. `node_ranks` ranks on a
 * machine of `cores` cores, each running `threads` threads (0: cores /
 * node_ranks, at least 1: what train gives a rank), each have min(threads,
 * cores / node_ranks) of the cores, 1/f of the profile's. This scales p to
 * one such rank and returns f (1, p unchanged, for one rank): GEMM and
 * attention rates and elementwise_bandwidth divided by f, compute.kernels'
 * seconds and launch multiplied by f (a rank's kernels take f times as long:
 * measured here, 2 ranks' steps of the demo's shape took 1.9x one process's
 * of the same per-rank work); the host AdamW rate multiplied by node_ranks
 * / f (a rank updates 1/node_ranks of the parameters, on 1/f of the cores,
 * and the simulator prices them all: the step's host optimizer time is then
 * the rank's); links divided by node_ranks / cores when that is above 1 (one
 * thread copies, and more ranks than cores share even that); memory
 * unchanged. The name gets " (a rank's 1/f of the cores)" when it fits. */
double mf_hwprofile_share_cores(mf_hwprofile *p, long cores, int64_t node_ranks, int64_t threads);

#ifdef __cplusplus
}
#endif

#endif /* MF_PLANNER_HWPROFILE_H */
