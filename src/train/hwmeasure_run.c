/* A profile measured on the cpu or the cuda backend (hwmeasure.h): the
 * shapes, the order of the measurements, the fields nothing measures and
 * the notes that say so; and hardware.profile auto on cuda. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/registry.h"
#include "planner/plan.h"
#include "planner/run_plan.h"
#include "src/core/env.h"
#include "src/core/hostbuf.h"
#include "src/optim/optim.h"
#include "src/train/hwmeasure.h"
#include "src/train/hwmeasure_internal.h"

/* What a backend is measured at. */
typedef struct shapes {
  const int64_t *gemm; /* square GEMM sizes, ascending */
  int n_gemm, n_gemm_quick;
  mf_bench_attn attn;
  int n_attn, n_attn_quick;
  size_t arena_elems; /* the bench's arena, in storage elements (and at least the copies' bytes) */
} shapes;

static const int64_t k_cpu_gemm[] = {64, 128, 256, 512, 1024, 2048};
static const int64_t k_cpu_attn[][2] = {{128, 64}, {256, 64}, {512, 64}, {512, 128}, {1024, 128}, {2048, 128}};
static const shapes k_cpu = {k_cpu_gemm, 6, 5, {k_cpu_attn, 8, 2, 0}, 6, 4, (size_t)32 << 20};

/* cuda: square GEMMs up to 8192^3, the dense roofline; attention over a
 * step's worth of tokens (B x S = 16384) with 16 query and 8 kv heads (the
 * issue's 644M model), so that every shape has the blocks to fill the GPU, as
 * a training step's attention has. The arena holds the largest of them: the
 * 8192^3 GEMM's three operands, or attention's q, k, v, o, their gradients
 * and dout. */
static const int64_t k_cuda_gemm[] = {256, 512, 1024, 2048, 4096, 8192};
static const int64_t k_cuda_attn[][2] = {{512, 64}, {1024, 64}, {1024, 128}, {2048, 128}, {4096, 128}, {8192, 128}};
static const shapes k_cuda = {k_cuda_gemm, 6, 5, {k_cuda_attn, 16, 8, 16384}, 6, 5, (size_t)256 << 20};

#define BENCH_HOST (2 * MF_BENCH_COPY_BYTES) /* host buffers: the copies each way */
#define HOST_BENCH_ARENA ((size_t)128 << 20) /* cuda's host bandwidth: 2 x 16M floats */
#define PROG_MARGIN ((uint64_t)256 << 20) /* device memory left beside a timed step (allocator slack) */
#define PROG_ROUNDS 5                      /* rounds of the step's timing, one after each benchmark */

typedef struct measure {
  const mf_hwmeasure_opts *o;
  mf_hwmeasure_info *info;
  mf_bench_run ri;
  const shapes *sh;
  int cuda;
  mf_threadpool *pool, *own_pool;
  mf_bench dev;  /* the backend measured */
  mf_bench host; /* cuda: the cpu backend, for host.memory_bandwidth */
  mf_hwmeasure_prog *prog;
  mf_backend_memory mem; /* cuda: the GPU when measuring began */
} measure;

/* The step's timer, or its absence noted (o->kernels_optional). */
static mf_status make_prog(measure *m) {
  const mf_hwmeasure_opts *o = m->o;
  mf_hwmeasure_prog_opts po = {o->backend, m->pool, m->info->storage, 0, PROG_ROUNDS, o->quick ? 5 : 9};
  if (m->cuda) { /* the room the GPU has left beside the benchmarks, as its backend would see it */
    mf_backend_memory now;
    MF_CHECK(mf_backend_query_memory("cuda", NULL, 1, &now));
    const uint64_t keep = now.total_bytes + PROG_MARGIN;
    po.device_room = now.device_free_bytes > keep ? now.device_free_bytes - keep : 1;
  }
  const mf_status st = mf_hwmeasure_prog_create(o->cfg, o->table, &po, &m->prog);
  if (st == MF_OK || !o->kernels_optional || (st != MF_ERR_CONFIG && st != MF_ERR_OUT_OF_MEMORY)) return st;
  snprintf(m->info->kernels_skipped, sizeof m->info->kernels_skipped, "%s", mf_last_error());
  return MF_OK;
}

static mf_status setup(measure *m) {
  const mf_hwmeasure_opts *o = m->o;
  m->pool = o->pool;
  if (!m->pool) MF_CHECK(mf_threadpool_create(o->cfg ? (int)o->cfg->train.threads : 0, &m->own_pool));
  if (!m->pool) m->pool = m->own_pool;
  m->info->threads = mf_threadpool_size(m->pool);
  m->info->reps = m->ri.reps;
  m->info->storage = mf_run_plan_storage(o->cfg, o->backend);
  const size_t kernels = m->sh->arena_elems * mf_dtype_size(m->info->storage);
  const size_t arena = kernels > 2 * MF_BENCH_COPY_BYTES ? kernels : 2 * MF_BENCH_COPY_BYTES;
  if (m->cuda) MF_CHECK(mf_backend_query_memory("cuda", NULL, 1, &m->mem));
  /* the kernels a run of the config (else a run of defaults) would run; attention on cuDNN
   * keeps its backward's workspace in the kernel scratch */
  mf_run_kernels k;
  mf_run_plan_kernels(o->cfg, o->backend, m->info->storage, &k);
  const int cudnn = strcmp(k.attention, "cudnn") == 0;
  uint64_t scratch = 0;
  const mf_bench_attn *a = &m->sh->attn;
  for (int i = 0; a->tokens > 0 && i < m->sh->n_attn; i++) {
    const int64_t S = a->shapes[i][0], D = a->shapes[i][1];
    const uint64_t need =
        mf_backend_attention_scratch(o->backend, m->info->storage, cudnn, a->tokens / S, S, a->hq, a->hkv, D);
    if (need > scratch) scratch = need;
  }
  const mf_status st =
      mf_bench_create(o->backend, m->pool, m->info->storage, arena, BENCH_HOST, scratch, &m->dev);
  if (st != MF_OK && m->cuda && (st == MF_ERR_NO_DEVICE || st == MF_ERR_UNSUPPORTED))
    mf_error_prefix("--backend cuda: no GPU to measure");
  MF_CHECK(st);
  MF_CHECK(mf_backend_set_kernels(m->dev.b, k.expert_gemm, k.attention));
  if (m->cuda) {
    snprintf(m->info->device_name, sizeof m->info->device_name, "%s", m->mem.device_name);
    m->info->device_free = m->mem.device_free_bytes;
    MF_CHECK(mf_bench_create("cpu", m->pool, MF_DTYPE_F32, HOST_BENCH_ARENA, (size_t)16 << 20, 0, &m->host));
  }
  return o->cfg ? make_prog(m) : MF_OK;
}

static mf_status prog_round(measure *m) { return m->prog ? mf_hwmeasure_prog_round(m->prog) : MF_OK; }

/* Every benchmark, with a round of the step's timing between each (spread
 * over the run: see hwmeasure_prog.c). */
static mf_status run_all(measure *m, mf_hwprofile *p) {
  const mf_bench_run *ri = &m->ri;
  const shapes *sh = m->sh;
  mf_hwmeasure_info *info = m->info;
  MF_CHECK(mf_bench_links(p, &m->dev, ri, m->cuda, &info->duplex_bandwidth, &info->d2d_bandwidth));
  MF_CHECK(prog_round(m));
  /* launch before the kernels: launch_s comes off their times */
  if (m->cuda) {
    MF_CHECK(mf_bench_launch(&m->dev, ri, &p->launch_s));
    MF_CHECK(mf_bench_dispatch(m->pool, ri, &info->host_launch_s));
    MF_CHECK(mf_bench_bandwidth(&m->host, ri, info->host_launch_s, &p->host_memory_bandwidth));
  } else {
    MF_CHECK(mf_bench_dispatch(m->pool, ri, &p->launch_s));
  }
  MF_CHECK(mf_bench_bandwidth(&m->dev, ri, p->launch_s, &p->elementwise_bandwidth));
  if (!m->cuda) p->host_memory_bandwidth = p->elementwise_bandwidth; /* the device is host memory */
  MF_CHECK(prog_round(m));
  MF_CHECK(mf_bench_gemm(p, &m->dev, ri, sh->gemm, ri->quick ? sh->n_gemm_quick : sh->n_gemm));
  MF_CHECK(prog_round(m));
  MF_CHECK(mf_bench_attention(p, &m->dev, ri, &sh->attn, ri->quick ? sh->n_attn_quick : sh->n_attn));
  MF_CHECK(prog_round(m));
  MF_CHECK(mf_bench_adamw(p, m->pool, ri));
  info->adamw_impl = mf_adamw_impl_name();
  return prog_round(m);
}

/* The memory fields: measured, or set (the notes say which). */
static mf_status machine(measure *m, mf_hwprofile *p) {
  p->host_memory = mf_hostbuf_machine_memory(0, NULL, 0) >> 20 << 20; /* whole MiB: readable, and exact enough */
  if (p->host_memory == 0) return MF_ERR(MF_ERR_IO, "cannot tell this machine's memory (sysconf and /proc)");
  p->nvme_bandwidth = 0;
  p->copies_overlap_compute = m->cuda; /* cuda: copy engines beside the kernels; cpu: one compute thread */
  if (!m->cuda) {
    const uint64_t grain = (uint64_t)256 << 20;
    p->device_memory = p->host_memory / 2 / grain * grain;
    if (p->device_memory == 0) p->device_memory = p->host_memory / 2;
    p->device_reserve = 0;
    return MF_OK;
  }
  const uint64_t mib = (uint64_t)1 << 20, total = m->mem.device_total_bytes, free_b = m->mem.device_free_bytes;
  if (!m->mem.device_known || total < mib)
    return MF_ERR(MF_ERR_INTERNAL, "profile: the GPU's memory was not read");
  p->device_memory = total / mib * mib;
  /* What others held (beyond moefit's context, which the backend counts itself: MF_CUDA_CONTEXT_RESERVE) */
  const uint64_t used = total > free_b ? total - free_b : 0;
  const uint64_t others = used > MF_CUDA_CONTEXT_RESERVE ? used - MF_CUDA_CONTEXT_RESERVE : 0;
  p->device_reserve = (others + mib - 1) / mib * mib;
  if (p->device_reserve >= p->device_memory) p->device_reserve = p->device_memory - mib;
  return MF_OK;
}

/* compute.kernels, and their note. */
static mf_status finish_kernels(measure *m, mf_hwprofile *p, char *note, size_t cap) {
  note[0] = 0;
  const mf_hwmeasure_opts *o = m->o;
  if (m->info->kernels_skipped[0]) {
    snprintf(note, cap, " compute.kernels: left out: %.300s", m->info->kernels_skipped);
    return MF_OK;
  }
  if (!m->prog) return MF_OK;
  int dropped = 0, n_calls = 0, steps = 0;
  MF_CHECK(mf_hwmeasure_prog_finish(m->prog, p, &n_calls, &dropped, &steps));
  m->info->kernel_calls = n_calls;
  const mf_config *cfg = o->cfg;
  snprintf(note, cap,
           " compute.kernels: the %d compute calls of one training step of %s (B=%lld, S=%lld, G=%lld, all "
           "tensors resident, random weights and tokens), each the median over the fastest half of %d steps "
           "timed in %d rounds spread over the run, averaged over the calls of the same kernel, sizes and "
           "operand bytes%s.",
           n_calls, o->cfg_path ? o->cfg_path : cfg->source, (long long)cfg->train.micro_batch,
           (long long)cfg->data.seq_len, (long long)cfg->train.grad_accum, steps, PROG_ROUNDS,
           dropped ? " (the keys with the least time left out)" : "");
  return MF_OK;
}

static void notes_cpu(const measure *m, mf_hwprofile *p, const char *date, const char *kern_note) {
  const mf_hwmeasure_info *in = m->info;
  char model[200];
  mf_bench_cpu_model(model, sizeof model);
  snprintf(p->name, sizeof p->name, "cpu backend: %s, %d threads", model, in->threads);
  snprintf(p->source, sizeof p->source,
           "Measured on this machine by `%s` on %s, %d threads; each figure the best of %d runs. "
           "Copies and kernels run through the cpu backend (copy, run), device operands in its arena. "
           "links: its copies, a one-thread memcpy of 64 MiB (latency: 4 KiB copies less bytes/bandwidth). "
           "gemm: linear_fwd, %s, square shapes. attention: attn_fwd+attn_bwd, causal, B=1, "
           "Hq=8, Hkv=2, rate = fwd+bwd FLOPs (mf_hw_attention_flops) / time. launch_us: an empty "
           "mf_threadpool_run (what each parallel cpu kernel pays), taken off the gemm and attention times. "
           "elementwise_bandwidth and "
           "host.memory_bandwidth: add over 16M %s, %d bytes per element. adamw: mf_adamw_update over "
           "16M fp32 params with the bf16 copy (%s body). host.memory: physical memory or the cgroup limit. "
           "Figures rounded to 3 significant digits. Not measured: device.memory is half of host memory and "
           "device.reserve 0 (cpu-backend defaults), copies_overlap_compute false (the cpu backend copies on "
           "the compute thread), no nvme.%s",
           m->o->cmdline, date, in->threads, in->reps, in->storage == MF_DTYPE_BF16 ? "bf16" : "fp32",
           in->storage == MF_DTYPE_BF16 ? "bf16 values" : "floats", 3 * (int)mf_dtype_size(in->storage),
           in->adamw_impl ? in->adamw_impl : "?", kern_note);
}

static void notes_cuda(const measure *m, mf_hwprofile *p, const char *date, const char *kern_note) {
  const mf_hwmeasure_info *in = m->info;
  const int elt = (int)mf_dtype_size(in->storage);
  snprintf(p->name, sizeof p->name, "cuda backend: %s", in->device_name);
  snprintf(p->source, sizeof p->source,
           "Measured on this machine by `%s` on %s; each figure the best of %d runs, timed by the cuda "
           "backend's timed events on its stream; kernels in %s storage, operands in its arena. links: pinned "
           "(host_alloc) copies of 64 MiB each way alone (latency: 4 KiB copies less bytes/bandwidth); both at "
           "once on two streams: %.3g GB/s each way (the planner's links run apart); device-to-device copy "
           "%.3g GB/s read+written. gemm: linear_fwd, square shapes. attention: attn_fwd+attn_bwd, causal, "
           "B*S=16384 tokens, Hq=16, Hkv=8, rate = fwd+bwd FLOPs (mf_hw_attention_flops) / time. launch_us: "
           "back-to-back add kernels of 256 elements, taken off the gemm and attention times. "
           "elementwise_bandwidth: add over 16M elements, %d bytes each. host: memory_bandwidth the cpu "
           "backend's add over 16M floats on %d threads; adamw mf_adamw_update over 16M fp32 params with the "
           "bf16 copy (%s body); memory physical or the cgroup limit. device.memory: the GPU's total; "
           "device.reserve: what was in use beyond moefit's context estimate when measured. Set: "
           "copies_overlap_compute true (copy engines beside the kernels); no nvme. 3 significant digits.%s",
           m->o->cmdline, date, in->reps, in->storage == MF_DTYPE_BF16 ? "bf16" : "fp32",
           in->duplex_bandwidth / 1e9, in->d2d_bandwidth / 1e9, 3 * elt, in->threads,
           in->adamw_impl ? in->adamw_impl : "?", kern_note);
}

static void teardown(measure *m) {
  mf_hwmeasure_prog_free(m->prog);
  mf_bench_free(&m->host);
  mf_bench_free(&m->dev);
  mf_threadpool_free(m->own_pool);
}

mf_status mf_hwmeasure(const mf_hwmeasure_opts *o, mf_hwprofile *p, mf_hwmeasure_info *info) {
  memset(p, 0, sizeof *p);
  memset(info, 0, sizeof *info);
  const int cuda = strcmp(o->backend, "cuda") == 0;
  if (!cuda && strcmp(o->backend, "cpu") != 0)
    return MF_ERR(MF_ERR_INVALID_ARG, "profile: backend '%s': cpu or cuda", o->backend);
  measure m = {.o = o, .info = info, .cuda = cuda, .sh = cuda ? &k_cuda : &k_cpu};
  m.ri = (mf_bench_run){.quick = o->quick, .reps = o->quick ? 5 : 7, .min_run = o->quick ? 0.02 : 0.05};
  char kern_note[600];
  mf_status st = setup(&m);
  if (st == MF_OK) st = run_all(&m, p);
  if (st == MF_OK) st = finish_kernels(&m, p, kern_note, sizeof kern_note);
  if (st == MF_OK) st = machine(&m, p);
  if (st == MF_OK) {
    char date[32];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", &tm);
    (cuda ? notes_cuda : notes_cpu)(&m, p, date, kern_note);
  }
  teardown(&m);
  return st;
}

/* ------------------------------------------------ hardware.profile auto */

/* Measures the GPU into `out` as `moefit profile --backend cuda --quick --config` does. */
static mf_status measure_into(const mf_config *cfg, const mf_param_table *t, mf_threadpool *pool, const char *out,
                              mf_hwmeasure_info *info) {
  mf_hwprofile *p = NULL;
  MF_CHECK(mf_calloc(1, sizeof *p, "hardware profile", (void **)&p));
  char cmdline[1200];
  snprintf(cmdline, sizeof cmdline, "hardware.profile auto (moefit profile --backend cuda --quick --config %s)",
           cfg->source);
  const mf_hwmeasure_opts o = {.backend = "cuda",
                               .quick = 1,
                               .cfg = cfg,
                               .cfg_path = cfg->source,
                               .table = t,
                               .kernels_optional = 1,
                               .pool = pool,
                               .cmdline = cmdline};
  mf_status st = mf_hwmeasure(&o, p, info);
  if (st == MF_OK) st = mf_hwprofile_save(p, out);
  free(p);
  return st;
}

/* Where planner/plan.c mf_plan_profile_path looks first for a cpu run's
 * hardware.profile auto (`moefit profile` writes it too). */
#define CPU_PROFILE_MEASURED "runs/hw/cpu.yaml"

/* hardware.profile auto on cpu: `moefit profile --quick` into runs/hw/cpu.yaml
 * (no config: the machine's profile, which every config's auto reads), once. */
static mf_status auto_cpu(const mf_config *cfg) {
  if (mf_env_string(MF_ENV_CPU_PROFILE)) return MF_OK; /* bundled (tests): the bundled profile's predictions */
  if (cfg->ranks > 1 || cfg->node_ranks > 1)
    return MF_OK;                                        /* the other ranks would share the cores measured */
  if (mf_mkdir_parents(CPU_PROFILE_MEASURED) != MF_OK) { /* a directory we cannot write: plan without */
    MF_LOGW("plan",
            "hardware.profile auto: cannot measure this machine into %s here (%s): %s stays the profile",
            CPU_PROFILE_MEASURED, mf_last_error(), MF_PLAN_CPU_PROFILE_BUNDLED);
    return MF_OK;
  }
  MF_LOGI(
      "plan",
      "hardware.profile auto: no cpu profile measured on this machine yet: measuring one once (as `moefit "
      "profile --quick`, some seconds) into %s",
      CPU_PROFILE_MEASURED);
  mf_hwprofile *p = NULL;
  mf_hwmeasure_info *info = NULL;
  mf_status st = mf_calloc(1, sizeof *p, "hardware profile", (void **)&p);
  if (st == MF_OK) st = mf_calloc(1, sizeof *info, "profile figures", (void **)&info);
  const double t0 = mf_time_now();
  const mf_hwmeasure_opts o = {.backend = "cpu",
                               .quick = 1,
                               .cmdline = "hardware.profile auto (moefit profile --backend cpu --quick)"};
  if (st == MF_OK) st = mf_hwmeasure(&o, p, info);
  if (st == MF_OK) st = mf_hwprofile_save(p, CPU_PROFILE_MEASURED);
  if (st == MF_OK)
    MF_LOGI("plan",
            "hardware.profile auto: wrote %s in %.0f s; auto uses it from now on (`moefit profile` "
            "measures again, more thoroughly)",
            CPU_PROFILE_MEASURED, mf_time_now() - t0);
  else /* the plan only loses its rates: it goes on with the bundled profile, which says so */
    MF_LOGW("plan", "hardware.profile auto: measuring this machine failed, %s stays the profile: %s",
            MF_PLAN_CPU_PROFILE_BUNDLED, mf_last_error());
  free(info);
  free(p);
  return MF_OK;
}

mf_status mf_hwmeasure_auto(const mf_config *cfg, const mf_param_table *t, mf_threadpool *pool) {
  const char *backend = NULL;
  MF_CHECK(mf_backend_resolve(mf_config_backend_name(cfg->backend), &backend));
  char path[MF_PLAN_PROFILE_PATH_MAX], out[MF_PLAN_PROFILE_PATH_MAX];
  mf_plan_profile_origin origin;
  mf_plan_profile_path(cfg->hardware.profile, backend, cfg->output.dir, path, sizeof path, &origin);
  if (origin != MF_PROFILE_BUNDLED) return MF_OK;
  if (strcmp(backend, "cpu") == 0) return auto_cpu(cfg);
  if (strcmp(backend, "cuda") != 0 || !cfg->output.dir || !*cfg->output.dir) return MF_OK;
  const int n = snprintf(out, sizeof out, "%s/%s", cfg->output.dir, MF_PLAN_CUDA_PROFILE_CACHE);
  if (n < 0 || (size_t)n >= sizeof out) return MF_OK; /* a path the plan would not look for */
  mf_backend_memory mem;
  MF_CHECK(mf_backend_query_memory(backend, NULL, 1, &mem));
  if (!mem.device_known) return MF_OK; /* no GPU: the plan says it uses the bundled profile */
  MF_CHECK(mf_mkdir_parents(out));
  MF_LOGI("plan",
          "hardware.profile auto: no profile measured on %s yet: measuring one once (as `moefit profile --backend "
          "cuda --quick --config`, some seconds) into %s",
          mem.device_name, out);
  mf_hwmeasure_info *info = NULL;
  MF_CHECK(mf_calloc(1, sizeof *info, "profile figures", (void **)&info));
  const double t0 = mf_time_now();
  const mf_status st = measure_into(cfg, t, pool, out, info);
  if (st == MF_OK)
    MF_LOGI("plan", "hardware.profile auto: wrote %s in %.0f s (%s%s); auto uses it for this output.dir from now on",
            out, mf_time_now() - t0, info->kernel_calls ? "the step's kernel calls timed" : "the step's kernels not timed: ",
            info->kernel_calls ? "" : (info->kernels_skipped[0] ? info->kernels_skipped : "no step given"));
  else /* the plan only loses its rates: it goes on with the bundled profile, which says so */
    MF_LOGW("plan", "hardware.profile auto: measuring %s failed, %s stays the profile: %s", mem.device_name,
            MF_PLAN_CUDA_PROFILE_BUNDLED, mf_last_error());
  free(info);
  return MF_OK;
}
