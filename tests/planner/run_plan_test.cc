// The run plan (planner/run_plan.h): what it decides from a config and a
// backend — the budget and its split, the device storage, staging and the
// optimizer's overlap by backend, the program for train and for eval — and
// that the plan file it writes is the same bytes every time.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <unistd.h>

#include "experts/routing.h"
#include "kernels/registry.h"
#include "planner/run_plan.h"
#include "src/config/config.h"
#include "src/core/core.h"
#include "src/core/env.h"
#include "src/model/params.h"

namespace {

const char kConfig[] =
    "model:\n"
    "  init: {family: mixtral, hidden: 32, layers: 2, heads: 4, kv_heads: 2, experts: 4, top_k: 2,\n"
    "         expert_ffn: 48, vocab: 64, max_seq: 16}\n"
    "data: {seq_len: 16}\n"
    "train: {micro_batch: 2, grad_accum: 2}\n"
    "hardware: {profile: configs/hw/cpu-2core.yaml}\n"
    "memory: {routing: none}\n";

struct Planned {
  mf_config *cfg = nullptr;
  mf_param_table *t = nullptr;
  mf_run_plan *rp = nullptr;
  mf_status st = MF_OK;
  std::string err;
  ~Planned() {
    mf_run_plan_free(rp);
    mf_param_table_free(t);
    mf_config_free(cfg);
  }
};

void make(Planned *r, std::vector<const char *> overrides, mf_run_use use = MF_RUN_TRAIN) {
  const char *p = getenv("TEST_TMPDIR");
  const std::string path = std::string(p ? p : "/tmp") + "/run_plan.yaml";
  std::ofstream(path) << kConfig;
  ASSERT_EQ(mf_config_load_for(path.c_str(), overrides.data(), overrides.size(), MF_CONFIG_FOR_PLAN, &r->cfg), MF_OK)
      << mf_last_error();
  ASSERT_EQ(mf_param_table_build(&r->cfg->model.init, &r->t), MF_OK) << mf_last_error();
  r->st = mf_run_plan_make(r->cfg, r->t, use, 1, &r->rp);
  if (r->st != MF_OK) r->err = mf_last_error();
}

bool gpu_present() {
  const char *b = nullptr;
  return mf_backend_resolve("auto", &b) == MF_OK && std::string(b) == "cuda";
}

TEST(RunPlan, CpuBudgetAutoIsTheProfilesDeviceMemory) {
  Planned r;
  make(&r, {"backend=cpu"});
  ASSERT_EQ(r.st, MF_OK) << r.err;
  EXPECT_STREQ(r.rp->dev.name, "cpu");
  EXPECT_EQ(r.rp->dev.total_bytes, 0u);
  EXPECT_EQ(r.rp->budget, r.rp->hw.device_memory - r.rp->hw.device_reserve);
  EXPECT_EQ(r.rp->arena_limit, r.rp->budget);
  EXPECT_EQ(r.rp->prog->storage, MF_DTYPE_F32);
  EXPECT_FALSE(r.rp->staged) << "memory.staging auto: off on cpu";
  EXPECT_FALSE(r.rp->overlap_optimizer) << "train.overlap_optimizer auto: off on cpu";
  EXPECT_EQ(r.rp->staging, nullptr);
  EXPECT_EQ(r.rp->fig.staging_bytes, 0u);
  EXPECT_EQ(r.rp->fig.device_budget_bytes, r.rp->budget);
  EXPECT_EQ(r.rp->fig.device_backend_bytes, 0u);
  EXPECT_EQ(r.rp->prog->G, 2);
  EXPECT_FALSE(r.rp->prog->forward_only);
}

// train.precision: auto is bf16 on cuda, fp32 on cpu; fp32 and bf16 are taken
// as given; the program (what the plan sizes) stores what was decided.
TEST(RunPlan, PrecisionDecidesTheDeviceStorage) {
  struct Case {
    const char *backend, *precision;
    mf_dtype want;
  } cases[] = {{"cpu", "auto", MF_DTYPE_F32},   {"cpu", "fp32", MF_DTYPE_F32},  {"cpu", "bf16", MF_DTYPE_BF16},
               {"cuda", "auto", MF_DTYPE_BF16}, {"cuda", "fp32", MF_DTYPE_F32}, {"cuda", "bf16", MF_DTYPE_BF16}};
  for (const Case &c : cases) {
    if (!strcmp(c.backend, "cuda") && gpu_present()) continue; /* the budget would be the GPU's */
    Planned r;
    const std::string be = std::string("backend=") + c.backend, pr = std::string("train.precision=") + c.precision;
    make(&r, {be.c_str(), pr.c_str(), "memory.device_budget=600MiB", "memory.plan=resident"});
    ASSERT_EQ(r.st, MF_OK) << c.backend << " " << c.precision << ": " << r.err;
    EXPECT_EQ(r.rp->storage, c.want) << c.backend << " " << c.precision;
    EXPECT_EQ(r.rp->prog->storage, c.want) << c.backend << " " << c.precision;
  }
}

// Attention on cuDNN (kernels.attention=cudnn, or MF_ATTENTION=cudnn over it) keeps its backward's workspace in the
// kernel scratch: a cuda training plan reserves it beside the arena, exactly
// what the registry says for the step's attention shape, and it bounds what
// cuDNN's frontend asks on Hopper for the deterministic backward (dP in bf16,
// B x Hq x S x S with S rounded up to 64, plus an fp32 dQ accumulator). fp32
// storage, an eval plan and the mma kernels reserve nothing more.
TEST(RunPlan, CudnnAttentionReservesItsWorkspaceBesideTheArena) {
  if (gpu_present()) GTEST_SKIP() << "a GPU is present: the budget would be its free memory";
  struct Env {
    explicit Env(const char *v) {
      setenv("MF_ATTENTION", v, 1);
      mf_env_reload();
    }
    ~Env() {
      unsetenv("MF_ATTENTION");
      mf_env_reload();
    }
  };
  const std::vector<const char *> base = {"backend=cuda", "memory.device_budget=2GiB",
                                          "train.precision=bf16"};
  Planned mma;
  make(&mma, base);
  ASSERT_EQ(mma.st, MF_OK) << mma.err;
  EXPECT_EQ(mma.rp->dev.attn_scratch_bytes, 0u);
  const mf_model_spec &sp = mma.t->spec;
  const uint64_t want =
      mf_backend_attention_scratch("cuda", MF_DTYPE_BF16, 1, 2, 16, sp.heads, sp.kv_heads, sp.head_dim);
  if (want == 0) GTEST_SKIP() << "built without CUDA";
  {
    Env e("cudnn");
    Planned r;
    make(&r, base);
    ASSERT_EQ(r.st, MF_OK) << r.err;
    EXPECT_EQ(r.rp->dev.scratch_bytes, want);
    EXPECT_EQ(r.rp->dev.attn_scratch_bytes, want - mma.rp->dev.scratch_bytes);
    EXPECT_EQ(r.rp->dev.total_bytes, mma.rp->dev.total_bytes + r.rp->dev.attn_scratch_bytes);
    EXPECT_EQ(r.rp->arena_limit, mma.rp->arena_limit - r.rp->dev.attn_scratch_bytes);
    EXPECT_EQ(r.rp->fig.device_backend_bytes, r.rp->dev.total_bytes);
    Planned fp32, eval;
    std::vector<const char *> f = base;
    f.back() = "train.precision=fp32";
    make(&fp32, f);
    make(&eval, base, MF_RUN_EVAL);
    ASSERT_EQ(fp32.st, MF_OK) << fp32.err;
    ASSERT_EQ(eval.st, MF_OK) << eval.err;
    EXPECT_EQ(fp32.rp->dev.attn_scratch_bytes, 0u) << "fp32 storage runs attention.cu";
    EXPECT_EQ(eval.rp->dev.attn_scratch_bytes, 0u) << "no backward in an eval plan";
  }
  // cuDNN's stated need for shapes of the models, S not a multiple of 64 too.
  const int64_t shapes[][5] = {
      {4, 1024, 16, 8, 64}, {2, 4096, 32, 8, 128}, {3, 1000, 8, 8, 256}, {1, 1, 4, 2, 64}};
  for (const auto &s : shapes) {
    const uint64_t B = s[0], S64 = (s[1] + 63) / 64 * 64, Hq = s[2], D = s[4];
    const uint64_t cudnn_dp = B * Hq * S64 * S64 * 2, dq_acc = B * Hq * S64 * D * 4;
    const uint64_t got = mf_backend_attention_scratch("cuda", MF_DTYPE_BF16, 1, s[0], s[1], s[2], s[3], s[4]);
    EXPECT_GE(got, mma.rp->dev.scratch_bytes + cudnn_dp + dq_acc) << "B=" << s[0] << " S=" << s[1];
    EXPECT_EQ(mf_backend_attention_scratch("cuda", MF_DTYPE_BF16, 0, s[0], s[1], s[2], s[3], s[4]), 0u);
    EXPECT_EQ(mf_backend_attention_scratch("cpu", MF_DTYPE_BF16, 1, s[0], s[1], s[2], s[3], s[4]), 0u);
  }
}

// The kernels (kernels.expert_gemm, kernels.attention): the environment over
// the key, the key over auto (mma); the cpu backend's own; fp32 storage's
// CUDA-core kernels; recorded in the plan's figures (plan.json) and the
// cuDNN workspace reserved for a key as for the variable.
TEST(RunPlan, KernelChoicesAreInThePlan) {
  if (gpu_present()) GTEST_SKIP() << "a GPU is present: the budget would be its free memory";
  struct Want {
    std::vector<const char *> over;
    const char *env_gemm, *env_attn;
    const char *gemm, *attn, *gemm_from, *attn_from;
  } cases[] = {
      {{"backend=cpu"}, nullptr, nullptr, "cpu", "cpu", "the cpu backend's", "the cpu backend's"},
      {{"backend=cpu", "kernels.attention=cudnn"}, nullptr, "cudnn", "cpu", "cpu", "the cpu backend's",
       "the cpu backend's"},
      {{"train.precision=fp32"}, nullptr, nullptr, "cuda-core", "cuda-core", "fp32 storage", "fp32 storage"},
      {{}, nullptr, nullptr, "mma", "mma", "auto", "auto"},
      {{"kernels.expert_gemm=cutlass", "kernels.attention=cudnn"}, nullptr, nullptr, "cutlass", "cudnn",
       "kernels.expert_gemm", "kernels.attention"},
      {{"kernels.expert_gemm=mma"}, "cutlass", nullptr, "cutlass", "mma",
       "MF_EXPERT_GEMM=cutlass over kernels.expert_gemm", "auto"},
      {{}, nullptr, "cudnn", "mma", "cudnn", "auto", "MF_ATTENTION=cudnn"},
  };
  for (const Want &w : cases) {
    std::vector<const char *> over = {"backend=cuda", "memory.device_budget=2GiB"};
    over.insert(over.end(), w.over.begin(), w.over.end());
    if (w.env_gemm) setenv("MF_EXPERT_GEMM", w.env_gemm, 1);
    if (w.env_attn) setenv("MF_ATTENTION", w.env_attn, 1);
    mf_env_reload();
    Planned r;
    make(&r, over);
    unsetenv("MF_EXPERT_GEMM");
    unsetenv("MF_ATTENTION");
    mf_env_reload();
    ASSERT_EQ(r.st, MF_OK) << r.err;
    EXPECT_STREQ(r.rp->kernels.expert_gemm, w.gemm);
    EXPECT_STREQ(r.rp->kernels.attention, w.attn);
    EXPECT_STREQ(r.rp->kernels.expert_gemm_from, w.gemm_from);
    EXPECT_STREQ(r.rp->kernels.attention_from, w.attn_from);
    EXPECT_STREQ(r.rp->fig.expert_gemm, w.gemm) << "plan.json records what runs";
    EXPECT_STREQ(r.rp->fig.attention, w.attn);
    const bool cudnn = std::string(w.attn) == "cudnn";
    if (mf_backend_attention_scratch("cuda", MF_DTYPE_BF16, 1, 2, 16, 4, 2, 8) > 0)
      EXPECT_EQ(r.rp->dev.attn_scratch_bytes > 0, cudnn) << "the workspace is reserved for cuDNN only";
  }
}

TEST(RunPlan, CudaBudgetCoversWhatTheBackendKeeps) {
  if (gpu_present()) GTEST_SKIP() << "a GPU is present: the budget would be its free memory";
  Planned r;
  make(&r, {"backend=cuda", "memory.device_budget=600MiB"});
  ASSERT_EQ(r.st, MF_OK) << r.err;
  EXPECT_STREQ(r.rp->dev.name, "cuda");
  EXPECT_EQ(r.rp->dev.total_bytes, r.rp->dev.workspace_bytes + r.rp->dev.scratch_bytes + r.rp->dev.context_bytes);
  EXPECT_GT(r.rp->dev.workspace_bytes, 0u);
  EXPECT_GT(r.rp->dev.context_bytes, 0u);
  EXPECT_EQ(r.rp->budget, 600ull << 20);
  EXPECT_EQ(r.rp->arena_limit, r.rp->budget - r.rp->dev.total_bytes);
  EXPECT_LE(r.rp->plan->s->arena_bytes, r.rp->arena_limit);
  EXPECT_EQ(r.rp->fig.device_backend_bytes, r.rp->dev.total_bytes);
  EXPECT_EQ(r.rp->storage, MF_DTYPE_BF16) << "train.precision auto: bf16 on cuda";
  EXPECT_EQ(r.rp->prog->storage, r.rp->storage) << "the plan sizes tensors as the run stores them";
  EXPECT_TRUE(r.rp->staged) << "memory.staging auto: on for cuda";
  EXPECT_TRUE(r.rp->overlap_optimizer) << "train.overlap_optimizer auto: on for cuda";
  ASSERT_NE(r.rp->staging, nullptr);
  EXPECT_EQ(r.rp->fig.staging_bytes, r.rp->staging->arena_bytes);
  EXPECT_EQ(r.rp->host.pinned_bytes, r.rp->staging->arena_bytes) << "the staging arena counts in host memory";
  // The settings say what they say, whatever the backend.
  Planned off;
  make(&off, {"backend=cuda", "memory.device_budget=600MiB", "memory.staging=false", "train.overlap_optimizer=false"});
  ASSERT_EQ(off.st, MF_OK) << off.err;
  EXPECT_FALSE(off.rp->staged);
  EXPECT_FALSE(off.rp->overlap_optimizer);
  EXPECT_EQ(off.rp->host.pinned_bytes, 0u);
}

TEST(RunPlan, ABudgetBelowTheBackendsOwnMemoryIsAnError) {
  Planned r;
  make(&r, {"backend=cuda", "memory.device_budget=100MiB"});
  EXPECT_EQ(r.st, MF_ERR_CONFIG);
  EXPECT_NE(r.err.find("memory.device_budget 100.00 MiB: the cuda backend keeps"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("raise memory.device_budget"), std::string::npos) << r.err;
  EXPECT_EQ(r.rp, nullptr);
}

TEST(RunPlan, EvalPlansOneMicroBatchForward) {
  Planned r;
  make(&r, {"backend=cpu", "memory.device_budget=1MiB"}, MF_RUN_EVAL);
  ASSERT_EQ(r.st, MF_OK) << r.err;
  EXPECT_TRUE(r.rp->prog->forward_only);
  EXPECT_EQ(r.rp->prog->G, 1);
  EXPECT_FALSE(r.rp->overlap_optimizer) << "no optimizer in eval";
  EXPECT_LE(r.rp->plan->s->arena_bytes, 1u << 20);
}

std::string slurp(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// The plan file is a function of the config: two makes write the same bytes.
TEST(RunPlan, ThePlanFileIsTheSameBytesEveryTime) {
  const char *p = getenv("TEST_TMPDIR");
  const std::string dir = p ? p : "/tmp";
  std::string files[2];
  for (int i = 0; i < 2; i++) {
    Planned r;
    make(&r, {"backend=cpu", "memory.device_budget=600KiB"});
    ASSERT_EQ(r.st, MF_OK) << r.err;
    files[i] = dir + "/same" + std::to_string(i) + ".json";
    ASSERT_EQ(mf_run_plan_write_json(r.rp, files[i].c_str()), MF_OK) << mf_last_error();
  }
  EXPECT_FALSE(slurp(files[0]).empty());
  EXPECT_EQ(slurp(files[0]), slurp(files[1]));
}

std::string tmp() {
  const char *p = getenv("TEST_TMPDIR");
  return p ? p : "/tmp";
}

bool has(const std::string &text, const std::string &key) {
  return text.find(key) != std::string::npos;
}

// A plan fits when it fits every limit; the chosen plan's host memory over
// memory.host_limit with no NVMe does not, and the reason names the keys.
TEST(RunPlan, FitsMeansEveryLimit) {
  Planned ok;
  make(&ok, {"backend=cpu", "memory.device_budget=600KiB"});
  ASSERT_EQ(ok.st, MF_OK) << ok.err;
  EXPECT_TRUE(ok.rp->fit.device && ok.rp->fit.host && ok.rp->fit.pinned && ok.rp->fit.all);
  char why[1800] = "unset";
  EXPECT_EQ(mf_run_plan_misfit(ok.rp, ok.cfg, why, sizeof why), 0);
  EXPECT_STREQ(why, "");

  Planned host;
  make(&host, {"backend=cpu", "memory.device_budget=600KiB", "memory.host_limit=64KiB"});
  ASSERT_EQ(host.st, MF_OK) << "a plan over a host limit is made (moefit plan shows it): " << host.err;
  ASSERT_GT(host.rp->host.unplaced_bytes, 0u);
  EXPECT_TRUE(host.rp->fit.device);
  EXPECT_FALSE(host.rp->fit.host);
  EXPECT_FALSE(host.rp->fit.all);
  ASSERT_EQ(mf_run_plan_misfit(host.rp, host.cfg, why, sizeof why), 1);
  const std::string w = why;
  for (const char *want : {"host memory: the plan needs ", "against memory.host_limit 64.00 KiB",
                           "(memory.nvme_dir is not set)", "raise memory.host_limit", "set memory.nvme_dir"})
    EXPECT_TRUE(has(w, want)) << want << "\n" << w;
  // Every row's fit: a baseline's arena against the budget, its host memory
  // against the same limit.
  for (int k = MF_PLAN_RESIDENT; k < MF_PLAN_KIND_COUNT_; k++) {
    mf_run_fit f;
    ASSERT_EQ(mf_run_plan_fit_of(host.rp, host.cfg, (mf_plan_kind)k, &f), MF_OK) << mf_last_error();
    EXPECT_EQ(f.device, host.rp->all[k]->s->arena_bytes <= host.rp->arena_limit) << k;
    EXPECT_FALSE(f.host) << k << ": every plan keeps the master weights, more than 64 KiB";
    EXPECT_FALSE(f.all) << k;
    mf_run_fit g;
    ASSERT_EQ(mf_run_plan_fit_of(ok.rp, ok.cfg, (mf_plan_kind)k, &g), MF_OK) << mf_last_error();
    EXPECT_TRUE(g.host && g.pinned) << k;
    EXPECT_EQ(g.all, g.device) << k;
  }
}

// Copies staged through a pinned arena over memory.pinned_limit: the plan is
// made, does not fit, and the reason names the key — also for the baselines
// within the device budget (one over it cannot run whatever its staging, and
// is not laid out: it is over device_budget).
TEST(RunPlan, APinnedLimitUnderTheLargestCopyDoesNotFit) {
  Planned r;
  make(&r, {"backend=cpu", "memory.device_budget=600KiB", "memory.staging=true", "memory.pinned_limit=1KiB"});
  ASSERT_EQ(r.st, MF_OK) << r.err;
  ASSERT_TRUE(r.rp->staged);
  EXPECT_FALSE(r.rp->staging_fits);
  EXPECT_FALSE(r.rp->fit.pinned);
  EXPECT_TRUE(r.rp->fit.host);
  EXPECT_FALSE(r.rp->fit.all);
  char why[1800];
  ASSERT_EQ(mf_run_plan_misfit(r.rp, r.cfg, why, sizeof why), 1);
  EXPECT_TRUE(has(why, "do not fit memory.pinned_limit 1.00 KiB")) << why;
  EXPECT_TRUE(has(why, "raise memory.pinned_limit or set memory.staging: false")) << why;
  int laid_out = 0;
  for (int k = MF_PLAN_RESIDENT; k < MF_PLAN_KIND_COUNT_; k++) {
    mf_run_fit f;
    ASSERT_EQ(mf_run_plan_fit_of(r.rp, r.cfg, (mf_plan_kind)k, &f), MF_OK) << mf_last_error();
    EXPECT_FALSE(f.all) << k;
    if (r.rp->all[k]->fits) {
      EXPECT_FALSE(f.pinned) << k;
      laid_out++;
    } else {
      EXPECT_FALSE(f.device) << k;
    }
  }
  EXPECT_GT(laid_out, 0) << "a baseline within the budget shows the pinned limit too";
}

// Sets an environment variable for one scope.
struct Env {
  std::string name;
  Env(const char *n, const char *v) : name(n) {
    setenv(n, v, 1);
    mf_env_reload();  // the library reads its MF_ variables once
  }
  ~Env() {
    unsetenv(name.c_str());
    mf_env_reload();
  }
};

// A run admits a plan only when it fits and this machine can hold its host
// memory (MF_HOST_MEMORY stands in for the machine).
TEST(RunPlan, ARunAdmitsOnlyWhatFitsThisMachine) {
  Planned r;
  make(&r, {"backend=cpu", "memory.device_budget=600KiB"});
  ASSERT_EQ(r.st, MF_OK) << r.err;
  const uint64_t need = mf_host_resident_bytes(&r.rp->host) + r.rp->plan->s->arena_bytes;
  {
    Env e("MF_HOST_MEMORY", "1TiB");
    EXPECT_EQ(mf_run_plan_admit(r.rp, r.cfg), MF_OK) << mf_last_error();
  }
  {
    const std::string just = std::to_string(need);  // exactly enough
    Env e("MF_HOST_MEMORY", just.c_str());
    EXPECT_EQ(mf_run_plan_admit(r.rp, r.cfg), MF_OK) << mf_last_error();
  }
  {
    const std::string less = std::to_string(need - 1);
    Env e("MF_HOST_MEMORY", less.c_str());
    ASSERT_EQ(mf_run_plan_admit(r.rp, r.cfg), MF_ERR_CONFIG);
    char a[32], b[32], c[32];
    const std::string err = mf_last_error();
    for (const std::string &want :
         {std::string("the plan cannot run: this machine: the plan keeps ") +
              mf_format_bytes(need, a, sizeof a),
          std::string("host state ") + mf_format_bytes(mf_host_resident_bytes(&r.rp->host), b, sizeof b) +
              " + the cpu backend's device arena " + mf_format_bytes(r.rp->plan->s->arena_bytes, c, sizeof c),
          std::string("(MF_HOST_MEMORY)"), std::string("memory.host_limit"), std::string("memory.nvme_dir"),
          std::string("memory.device_budget")})
      EXPECT_TRUE(has(err, want)) << want << "\n" << err;
  }
  {
    Env e("MF_HOST_MEMORY", "lots");
    EXPECT_EQ(mf_run_plan_admit(r.rp, r.cfg), MF_ERR_CONFIG);
    EXPECT_TRUE(has(mf_last_error(), "MF_HOST_MEMORY='lots' is not a size")) << mf_last_error();
  }
  // Over memory.host_limit: refused with the same reason moefit plan gives.
  Planned host;
  make(&host, {"backend=cpu", "memory.device_budget=600KiB", "memory.host_limit=64KiB"});
  ASSERT_EQ(host.st, MF_OK) << host.err;
  char why[1800];
  ASSERT_EQ(mf_run_plan_misfit(host.rp, host.cfg, why, sizeof why), 1);
  Env e("MF_HOST_MEMORY", "1TiB");
  ASSERT_EQ(mf_run_plan_admit(host.rp, host.cfg), MF_ERR_CONFIG);
  // Its first line is moefit plan's reason; its second the plans tried instead.
  const std::string err = mf_last_error(), first = std::string("the plan cannot run: ") + why;
  EXPECT_EQ(err.substr(0, first.size()), first);
  EXPECT_EQ(err.substr(first.size(), 20), "\n  planned instead: ") << err;
  EXPECT_TRUE(has(err, "train.adam_moments=bf16: ")) << err;
}

// Without MF_HOST_MEMORY: the kernel's figure, within the machine's memory.
TEST(RunPlan, TheMachinesMemory) {
  unsetenv("MF_HOST_MEMORY");
  mf_env_reload();
  uint64_t have = 0;
  char source[160];
  ASSERT_EQ(mf_host_machine_memory(&have, source, sizeof source), MF_OK) << mf_last_error();
  const uint64_t total = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
  EXPECT_GT(have, 0u);
  EXPECT_LE(have, total);
  EXPECT_TRUE(has(source, "MemAvailable") || has(source, "cgroup") || has(source, "sysconf")) << source;
}

// memory.routing auto with a routing file measured on another model: planned
// with uniform routing, one note (logged when a run admits the plan).
TEST(RunPlan, ARoutingFileOfAnotherModelIsPassedOver) {
  const std::string dir = tmp() + "/run_plan_routing";
  ASSERT_EQ(mf_mkdir_p(dir.c_str()), MF_OK);
  mf_config *cfg = nullptr;
  const std::string path = tmp() + "/run_plan.yaml";
  std::ofstream(path) << kConfig;
  const std::string out = "output.dir=" + dir;
  std::vector<const char *> o = {"backend=cpu", "memory.routing=auto", out.c_str()};
  ASSERT_EQ(mf_config_load_for(path.c_str(), o.data(), o.size(), MF_CONFIG_FOR_PLAN, &cfg), MF_OK)
      << mf_last_error();
  // Measured on a 3-layer model of the same shape otherwise.
  mf_model_spec three = cfg->model.init;
  three.layers = 3;
  std::vector<int64_t> counts((size_t)(3 * three.experts), 0);
  for (int l = 0; l < 3; l++) counts[(size_t)(l * three.experts)] = 10 * three.top_k;
  ASSERT_EQ(mf_routing_write((dir + "/routing.json").c_str(), &three, counts.data(), 10), MF_OK)
      << mf_last_error();
  mf_param_table *t = nullptr;
  ASSERT_EQ(mf_param_table_build(&cfg->model.init, &t), MF_OK);
  mf_run_plan *rp = nullptr;
  ASSERT_EQ(mf_run_plan_make(cfg, t, MF_RUN_TRAIN, 1, &rp), MF_OK) << mf_last_error();
  EXPECT_FALSE(rp->routed);
  EXPECT_EQ(rp->routing.share, nullptr);
  EXPECT_TRUE(has(rp->routing_note, "routing: " + dir + "/routing.json: model.layers:")) << rp->routing_note;
  EXPECT_TRUE(has(rp->routing_note, "planning with uniform routing")) << rp->routing_note;
  FILE *log = tmpfile();
  mf_log_set_level(MF_LOG_INFO);
  mf_log_set_stream(log);
  Env e("MF_HOST_MEMORY", "1TiB");
  const mf_status st = mf_run_plan_admit(rp, cfg);
  mf_log_set_stream(nullptr);
  EXPECT_EQ(st, MF_OK) << mf_last_error();
  std::string text(4096, '\0');
  rewind(log);
  text.resize(fread(&text[0], 1, text.size(), log));
  fclose(log);
  EXPECT_TRUE(has(text, rp->routing_note)) << text;
  // Measured on this model: used, no note.
  std::vector<int64_t> mine((size_t)(2 * three.experts), 0);
  for (int l = 0; l < 2; l++) mine[(size_t)(l * three.experts + 1)] = 10 * three.top_k;
  ASSERT_EQ(mf_routing_write((dir + "/routing.json").c_str(), &cfg->model.init, mine.data(), 10), MF_OK);
  mf_run_plan *again = nullptr;
  ASSERT_EQ(mf_run_plan_make(cfg, t, MF_RUN_TRAIN, 1, &again), MF_OK) << mf_last_error();
  EXPECT_TRUE(again->routed);
  EXPECT_STREQ(again->routing_note, "");
  mf_run_plan_free(again);
  mf_run_plan_free(rp);
  mf_param_table_free(t);
  mf_config_free(cfg);
}

}  // namespace
