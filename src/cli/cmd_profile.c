/* `moefit profile`: measures this machine's hardware profile for the planner's
 * cost model (planner/hwprofile.h) and writes it as YAML. The measuring is
 * src/train/hwmeasure.h's (hardware.profile auto on cuda runs the same code);
 * this is the command: its options, the file and the summary people read. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planner/hwprofile.h"
#include "src/cli/commands.h"
#include "src/config/config.h"
#include "src/core/core.h"
#include "src/train/hwmeasure.h"
#include "src/train/run.h"

static const char k_usage[] =
    "usage: moefit profile [--backend cpu|cuda] [--out FILE.yaml] [--quick] [--config CONFIG.yaml]\n"
    "\n"
    "Measures this machine's hardware profile for the planner's cost model and writes it\n"
    "as YAML (the format is in planner/hwprofile.h; configs/hw/ has bundled profiles).\n"
    "\n"
    "  --backend cpu|cuda  what to measure (default cpu). cpu: the device is host memory and\n"
    "                      the kernels are moefit's cpu kernels on all cores (MF_THREADS=N\n"
    "                      to use fewer). cuda: the first visible GPU, through the cuda backend\n"
    "                      (no GPU, or a build without CUDA: exit 1, saying so)\n"
    "  --out FILE          where to write (default runs/hw/cpu.yaml, with --backend cuda\n"
    "                      runs/hw/cuda.yaml; directories are created; the file is replaced\n"
    "                      atomically)\n"
    "  --quick             fewer shapes and repeats: about 10 s on 2 cores (default about 60 s)\n"
    "  --config CONFIG     also time every kernel call of the config's training step (its model,\n"
    "                      train.lora's adapters included; a model.path one on random weights\n"
    "                      of its shape; micro-batch, sequence length and accumulation, in the storage its\n"
    "                      train.precision gives: auto is bf16 on cuda, fp32 on cpu) and write\n"
    "                      them to compute.kernels: the planner then prices those calls by their\n"
    "                      measured time instead of the rate tables (threads: the config's\n"
    "                      train.threads)\n"
    "\n"
    "Measured on cpu, each figure the best of several runs; copies and kernels are submitted to\n"
    "the cpu backend (its copy and run) with their device operands in its arena:\n"
    "  links.h2d / d2h          the backend's copies (a one-thread memcpy) of 64 MiB each way;\n"
    "                           latency from 4 KiB copies\n"
    "  compute.gemm             linear_fwd kernels (fp32; with --config its storage) at square\n"
    "                           shapes 64^3 .. 1024^3 (.. 2048^3 without --quick)\n"
    "  compute.attention        attn_fwd + attn_bwd kernels, causal, 8 query / 2 kv heads\n"
    "  compute.launch_us        an empty mf_threadpool_run (what each parallel cpu kernel pays)\n"
    "  compute.elementwise_bandwidth, host.memory_bandwidth\n"
    "                           an add kernel over 16M floats (12 bytes moved per element)\n"
    "  host.adamw_params_per_s  mf_adamw_update over 16M fp32 parameters, with the bf16 copy\n"
    "  host.memory              physical memory (the cgroup limit when lower)\n"
    "  compute.kernels          (--config) each kernel call of one training step, run by the\n"
    "                           executor with every tensor resident on random weights and tokens,\n"
    "                           in 5 rounds between the other measurements: each call's median over\n"
    "                           the fastest half of the steps, averaged over the calls with the\n"
    "                           same kernel, sizes and operand bytes\n"
    "Set, not measured: device.memory = half of host memory, device.reserve = 0,\n"
    "copies_overlap_compute = false (the cpu backend copies on the compute thread), no nvme.\n"
    "\n"
    "Measured on cuda, each figure the best of several runs timed by the cuda backend's timed\n"
    "events on its stream; copies and kernels are submitted as the executor submits them, device\n"
    "operands in its arena, host buffers pinned (its host_alloc), kernels in bf16 storage (fp32\n"
    "with --config and train.precision fp32):\n"
    "  links.h2d / d2h          pinned copies of 64 MiB each way alone; latency from 4 KiB copies.\n"
    "                           Also timed, printed and noted (no profile field: the planner's\n"
    "                           links run apart): both directions at once on two streams, and a\n"
    "                           device-to-device copy (the memory roofline)\n"
    "  compute.gemm             linear_fwd (cuBLASLt) at square shapes 256^3 .. 4096^3\n"
    "                           (.. 8192^3 without --quick)\n"
    "  compute.attention        attn_fwd + attn_bwd, causal, 16 query / 8 kv heads, B x S = 16384\n"
    "                           tokens (S 512 .. 4096, .. 8192 without --quick)\n"
    "  compute.launch_us        back-to-back add kernels of 256 elements\n"
    "  compute.elementwise_bandwidth\n"
    "                           an add kernel over 16M elements (3 x 2 bytes each in bf16)\n"
    "  compute.kernels          (--config) as on cpu, on the GPU; a step that does not fit the\n"
    "                           GPU all resident is an error\n"
    "  host.memory_bandwidth    the cpu backend's add kernel over 16M floats on the host's cores\n"
    "  host.adamw_params_per_s, host.memory\n"
    "                           as on cpu (the host optimizer's rate with the machine's cores)\n"
    "  device.memory            the GPU's total memory; device.reserve: what was in use beyond\n"
    "                           moefit's CUDA context (an estimate) when measuring began\n"
    "Set, not measured: copies_overlap_compute = true (copy engines run beside kernels), no nvme.\n"
    "\n"
    "hardware.profile auto on cuda takes OUTPUT/hw-cuda.yaml (OUTPUT: the config's output.dir),\n"
    "else runs/hw/cuda.yaml (what --backend cuda writes), else the bundled\n"
    "configs/hw/h100-pcie.yaml (spec-sheet estimates, not measured; what a machine without the\n"
    "GPU plans with, and says so). With the GPU present and neither file there, train, eval and\n"
    "plan first measure the GPU once, as --backend cuda --quick --config CONFIG does (the step's\n"
    "calls timed when they fit the GPU all resident), and cache it in OUTPUT/hw-cuda.yaml,\n"
    "saying so; delete that file to measure again. On cpu auto takes runs/hw/cpu.yaml; when it\n"
    "is missing train, eval, plan and bench kernels first measure it once, as --quick does (some\n"
    "seconds), saying so (under mpirun with several ranks they plan with the bundled\n"
    "configs/hw/cpu-2core.yaml).\n";

static const char *storage_word(mf_dtype d) { return d == MF_DTYPE_BF16 ? "bf16" : "fp32"; }

/* The lines both backends print: rates, the host optimizer, the step's calls. */
static void print_rates(const mf_hwprofile *p, const mf_hwmeasure_info *in) {
  printf("  gemm (%s)     ", storage_word(in->storage));
  for (int i = 0; i < p->n_gemm; i++) printf(" %.0f^3 %.3g", p->gemm[i].m, p->gemm[i].flops / 1e9);
  printf("  GFLOP/s\n  attention       ");
  for (int i = 0; i < p->n_attn; i++)
    printf(" s%.0f/d%.0f %.3g", p->attn[i].s, p->attn[i].d, p->attn[i].flops / 1e9);
  printf("  GFLOP/s (fwd+bwd)\n");
  printf("  host AdamW       %.0f M params/s (%s body; %.1f GB/s at the ~30 bytes an update moves per param)\n",
         p->host_adamw_params_per_s / 1e6, in->adamw_impl ? in->adamw_impl : "?",
         p->host_adamw_params_per_s * 30 / 1e9);
  if (p->n_kernels > 0)
    printf("  program kernels  %d kernel calls timed at the config's shapes (compute.kernels), the longest %s "
           "%.3g ms\n",
           p->n_kernels, p->kernels[0].kernel, p->kernels[0].seconds * 1e3);
}

static void print_cpu(const mf_hwprofile *p, const mf_hwmeasure_info *in) {
  char a[32], b[32];
  printf("  host memory      %s (device memory set to %s: half, the cpu backend's default)\n",
         mf_format_bytes(p->host_memory, a, sizeof a), mf_format_bytes(p->device_memory, b, sizeof b));
  printf("  copies (memcpy)  h2d %.2f GB/s, d2h %.2f GB/s, latency %.2g us\n", p->h2d_bandwidth / 1e9,
         p->d2h_bandwidth / 1e9, p->h2d_latency_s * 1e6);
  printf("  kernel launch    %.2g us (thread-pool dispatch)\n", p->launch_s * 1e6);
  printf("  elementwise      %.2f GB/s (add kernel, %d bytes/element; also host.memory_bandwidth)\n",
         p->elementwise_bandwidth / 1e9, 3 * (int)mf_dtype_size(in->storage));
  print_rates(p, in);
}

static void print_cuda(const mf_hwprofile *p, const mf_hwmeasure_info *in) {
  char a[32], b[32], c[32];
  printf("  device memory    %s (reserve %s: in use beyond moefit's context; %s free when measuring began)\n",
         mf_format_bytes(p->device_memory, a, sizeof a), mf_format_bytes(p->device_reserve, b, sizeof b),
         mf_format_bytes(in->device_free, c, sizeof c));
  printf("  host memory      %s\n", mf_format_bytes(p->host_memory, a, sizeof a));
  printf("  copies (pinned)  h2d %.2f GB/s, d2h %.2f GB/s, latency %.2g us; both at once %.2f GB/s each way\n",
         p->h2d_bandwidth / 1e9, p->d2h_bandwidth / 1e9, p->h2d_latency_s * 1e6, in->duplex_bandwidth / 1e9);
  printf("  device copy      %.1f GB/s (device to device, bytes read + written)\n", in->d2d_bandwidth / 1e9);
  printf("  kernel launch    %.2g us (back-to-back tiny kernels)\n", p->launch_s * 1e6);
  printf("  elementwise      %.1f GB/s (add kernel, %d bytes/element)\n", p->elementwise_bandwidth / 1e9,
         3 * (int)mf_dtype_size(in->storage));
  printf("  host memory bw   %.2f GB/s (the cpu backend's add kernel on %d threads)\n",
         p->host_memory_bandwidth / 1e9, in->threads);
  print_rates(p, in);
}

static void print_summary(const mf_hwprofile *p, const mf_hwmeasure_info *in, int cuda, const char *out,
                          double secs) {
  printf("moefit profile: %s\n", p->name);
  (cuda ? print_cuda : print_cpu)(p, in);
  printf("wrote %s (%.1f s, best of %d runs each)\n", out, secs, in->reps);
}

/* Measures, writes `out` and checks that it reads back as measured. */
static mf_status profile_to(const mf_hwmeasure_opts *o, const char *out, mf_hwprofile *p, mf_hwmeasure_info *info) {
  MF_CHECK(mf_mkdir_parents(out)); /* before measuring: a bad --out fails at once */
  fprintf(stderr, "moefit profile: measuring the %s backend%s ...\n", o->backend, o->quick ? " (quick)" : "");
  MF_CHECK(mf_hwmeasure(o, p, info));
  MF_CHECK(mf_hwprofile_save(p, out));
  mf_hwprofile *back = NULL; /* what the planner will read */
  MF_CHECK(mf_calloc(1, sizeof *back, "hardware profile", (void **)&back));
  mf_status st = mf_hwprofile_load(out, back);
  if (st == MF_OK && !mf_hwprofile_equal(p, back))
    st = MF_ERR(MF_ERR_INTERNAL, "%s: the written profile does not read back equal", out);
  free(back);
  return st;
}

int mf_cli_profile(int argc, char **argv) {
  const char *cmd = "profile", *backend = "cpu", *out = NULL, *config = NULL;
  int quick = 0;
  if (mf_cli_wants_help(argc, argv)) {
    printf("%s", k_usage);
    return MF_EXIT_OK;
  }
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--quick") == 0) {
      quick = 1;
    } else if (strcmp(a, "--backend") == 0 || strcmp(a, "--out") == 0 || strcmp(a, "--config") == 0) {
      if (i + 1 >= argc) return mf_cli_usage_error(cmd, "%s needs a value", a);
      if (strcmp(a, "--backend") == 0)
        backend = argv[++i];
      else if (strcmp(a, "--out") == 0)
        out = argv[++i];
      else
        config = argv[++i];
    } else {
      return mf_cli_usage_error(cmd, "unexpected argument '%s'", a);
    }
  }
  const int cuda = strcmp(backend, "cuda") == 0;
  if (!cuda && strcmp(backend, "cpu") != 0)
    return mf_cli_usage_error(cmd, "--backend must be cpu or cuda, not '%s'", backend);
  if (!out) out = cuda ? "runs/hw/cuda.yaml" : "runs/hw/cpu.yaml";
  if (!*out) return mf_cli_usage_error(cmd, "--out needs a file name");
  if (config && !*config) return mf_cli_usage_error(cmd, "--config needs a file name");
  mf_config *cfg = NULL;
  mf_run run; /* --config: the run train would open, up to its table (train.lora's adapters included) */
  memset(&run, 0, sizeof run);
  if (config) {
    const mf_run_opts ro = {.use = MF_RUN_TRAIN, .upto = MF_RUN_TABLE};
    mf_status cst = mf_config_load(config, NULL, 0, &cfg);
    if (cst == MF_OK) cst = mf_run_open(cfg, &ro, &run);
    if (cst != MF_OK) {
      mf_run_close(&run);
      mf_config_free(cfg);
      return mf_cli_fail(cmd, cst);
    }
  }
  char cmdline[1200];
  snprintf(cmdline, sizeof cmdline, "moefit profile --backend %s%s%s%s", backend, quick ? " --quick" : "",
           config ? " --config " : "", config ? config : "");
  const mf_hwmeasure_opts o = {
      .backend = backend, .quick = quick, .cfg = cfg, .cfg_path = config, .table = run.t, .cmdline = cmdline};
  mf_hwprofile *p = NULL;
  mf_hwmeasure_info *info = NULL;
  mf_status st = mf_calloc(1, sizeof *p, "hardware profile", (void **)&p);
  if (st == MF_OK) st = mf_calloc(1, sizeof *info, "profile figures", (void **)&info);
  const double t0 = mf_time_now();
  if (st == MF_OK) st = profile_to(&o, out, p, info);
  if (st == MF_OK) print_summary(p, info, cuda, out, mf_time_now() - t0);
  free(info);
  free(p);
  mf_run_close(&run);
  mf_config_free(cfg);
  return st == MF_OK ? MF_EXIT_OK : mf_cli_fail(cmd, st);
}
