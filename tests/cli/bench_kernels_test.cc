// `moefit bench kernels` on the demo's step (cpu backend): one row for every
// group of kernel calls the chosen plan's step makes — the groups and their
// calls derived here from the plan through the C API — each timed, with a
// finite ratio to its roofline, the two rooflines measured; the copies
// section (pinned each way, both at once, staged through the slabs of the
// plan's layout or the default ones); and its errors.
#include <gtest/gtest.h>
#include <jansson.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/registry.h"
#include "planner/run_plan.h"
#include "planner/simulate.h"
#include "src/config/config.h"
#include "src/model/params.h"
#include "tests/cli/cli_util.h"

namespace {

const char kDemo[] = "configs/demo.yaml backend=cpu hardware.profile=configs/hw/cpu-2core.yaml";

using Shape = std::pair<std::string, std::vector<int64_t>>;

// The step's compute calls as bench kernels groups them: calls per kernel
// name, the kernels' shapes (name and sizes), and the number of groups (the
// distinct kernel, sizes and operand bytes: zero calls of one shape differ
// only by their bytes).
struct Step {
  std::map<std::string, int64_t> calls;
  std::set<Shape> shapes;
  size_t groups = 0;
  // The staging layout's slab cut (its largest slab if smaller) and slabs in
  // flight; 0 when the plan stages nothing.
  size_t slab_bytes = 0;
  int slabs = 0;
};

Step step_of(const std::vector<const char *> &overrides) {
  Step out;
  mf_config *cfg = nullptr;
  EXPECT_EQ(
      mf_config_load_for("configs/demo.yaml", overrides.data(), overrides.size(), MF_CONFIG_FOR_PLAN, &cfg),
      MF_OK)
      << mf_last_error();
  if (!cfg) return out;
  mf_param_table *t = nullptr;
  mf_run_plan *rp = nullptr;
  EXPECT_EQ(mf_param_table_build(&cfg->model.init, &t), MF_OK) << mf_last_error();
  if (t) {
    EXPECT_EQ(mf_run_plan_make(cfg, t, MF_RUN_TRAIN, 1, &rp), MF_OK) << mf_last_error();
  }
  std::set<std::tuple<std::string, std::vector<int64_t>, double>> keys;
  for (int32_t i = 0; rp && i < rp->plan->s->n_instr; i++) {
    const char *kernel;
    int64_t sizes[8];
    int n;
    double bytes;
    if (!mf_sim_instr_key(rp->plan->s, i, &kernel, sizes, &n, &bytes)) continue;
    while (n > 0 && sizes[n - 1] == 0) n--;
    out.calls[kernel]++;
    out.shapes.insert(Shape(kernel, std::vector<int64_t>(sizes, sizes + n)));
    keys.insert(std::make_tuple(std::string(kernel), std::vector<int64_t>(sizes, sizes + n), bytes));
  }
  out.groups = keys.size();
  if (rp && rp->staged && rp->staging && rp->staging->n_slabs > 0) {
    out.slab_bytes = std::min(rp->staging->opts.max_slab_bytes, rp->staging->largest_slab_bytes);
    out.slabs = rp->staging->max_slabs_inflight;
  }
  mf_run_plan_free(rp);
  mf_param_table_free(t);
  mf_config_free(cfg);
  return out;
}

double num(const json_t *o, const char *key) {
  const json_t *v = json_object_get(o, key);
  EXPECT_TRUE(json_is_number(v)) << key;
  return json_number_value(v);
}

// The copies section: its five rows in the table and in the JSON, each with a
// positive finite rate; the staged ones with their ratio to the pinned copy of
// their direction; the slabs the plan's layout gives, or the default ones.
void check_copies(const Result &r, const json_t *root, const Step &want) {
  EXPECT_NE(r.out.find("\ncopies: h2d staged "), std::string::npos) << r.out;
  const json_t *c = json_object_get(root, "copies");
  ASSERT_TRUE(json_is_object(c));
  const std::string layout = json_string_value(json_object_get(c, "layout"));
  if (want.slab_bytes) {
    EXPECT_EQ(layout, "plan");
    EXPECT_EQ(num(c, "slab_bytes"), (double)want.slab_bytes);
    EXPECT_EQ(num(c, "slabs_in_flight"), want.slabs);
  } else {
    EXPECT_EQ(layout, "default");
    EXPECT_EQ(num(c, "slab_bytes"), 64.0 * 1024 * 1024);
    EXPECT_EQ(num(c, "slabs_in_flight"), 2);
  }
  EXPECT_EQ(num(c, "threads"), 1);  // train's on cpu
  const json_t *rows = json_object_get(c, "rows");
  const char *names[] = {"h2d pinned", "d2h pinned", "h2d+d2h pinned", "h2d staged", "d2h staged"};
  ASSERT_EQ(json_array_size(rows), 5u);
  std::map<std::string, double> gbs;
  for (size_t i = 0; i < 5; i++) {
    const json_t *row = json_array_get(rows, i);
    const std::string name = json_string_value(json_object_get(row, "copy"));
    EXPECT_EQ(name, names[i]);
    gbs[name] = num(row, "gbs");
    EXPECT_TRUE(std::isfinite(gbs[name]) && gbs[name] > 0) << name << " " << gbs[name];
    EXPECT_GT(num(row, "ms"), 0) << name;
    EXPECT_EQ(num(row, "bytes"), (i == 2 ? 512.0 : 256.0) * 1024 * 1024) << name;
    EXPECT_NE(r.out.find("\n  " + name + " "), std::string::npos) << name << "\n" << r.out;
    if (i == 2) {
      EXPECT_TRUE(num(row, "h2d_gbs") > 0 && std::isfinite(num(row, "h2d_gbs")));
      EXPECT_TRUE(num(row, "d2h_gbs") > 0 && std::isfinite(num(row, "d2h_gbs")));
    }
    if (i >= 3) {
      const double pinned = gbs[i == 3 ? "h2d pinned" : "d2h pinned"];
      EXPECT_NEAR(num(row, "ratio"), gbs[name] / pinned, 1e-9 * gbs[name] / pinned) << name;
    } else {
      EXPECT_EQ(json_object_get(row, "ratio"), nullptr) << name;
    }
  }
}

// Runs bench kernels on the demo with `extra` overrides and checks its rows
// against the step the plan makes with the same overrides.
void check_rows(const std::string &extra, const std::vector<const char *> &overrides,
                const std::set<std::string> &must_have) {
  const std::string json = tmpdir() + "/bench-kernels.json";
  Result r = moefit("bench kernels " + std::string(kDemo) + " " + extra + " --reps 1 --json " + json);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("\nkernels: step "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("gemm roofline "), std::string::npos) << r.out;
  const Step want = step_of(overrides);
  for (const std::string &k : must_have) EXPECT_TRUE(want.calls.count(k)) << "the step has no " << k;

  json_error_t err;
  json_t *root = json_load_file(json.c_str(), 0, &err);
  ASSERT_NE(root, nullptr) << err.text;
  EXPECT_STREQ(json_string_value(json_object_get(root, "backend")), "cpu");
  const json_t *gemm = json_object_get(root, "gemm_roofline"), *copy = json_object_get(root, "copy_roofline");
  EXPECT_EQ(num(gemm, "m"), 1024);
  EXPECT_GT(num(gemm, "tflops"), 0);
  EXPECT_EQ(num(copy, "bytes"), 256.0 * 1024 * 1024);
  EXPECT_GT(num(copy, "gbs"), 0);

  std::map<std::string, int64_t> calls;
  std::set<Shape> shapes;
  double step_ms = 0, shares = 0;
  const json_t *rows = json_object_get(root, "rows");
  for (size_t i = 0; i < json_array_size(rows); i++) {
    const json_t *row = json_array_get(rows, i);
    const std::string kernel = json_string_value(json_object_get(row, "kernel"));
    const double ms = num(row, "ms_per_call"), ratio = num(row, "ratio"), n = num(row, "calls");
    EXPECT_GT(ms, 0) << kernel;
    EXPECT_TRUE(std::isfinite(ratio) && ratio > 0) << kernel << " ratio " << ratio;
    EXPECT_GT(num(row, "bytes"), 0) << kernel;
    const bool gemm_like = std::string(json_string_value(json_object_get(row, "bound"))) == "gemm";
    static const std::set<std::string> kGemmLike = {"linear_fwd", "linear_bwd_data", "linear_bwd_weight",
                                                    "expert_fwd", "expert_bwd_data", "expert_bwd_weight",
                                                    "attn_fwd",   "attn_bwd",        "cross_entropy"};
    EXPECT_EQ(gemm_like, kGemmLike.count(kernel) == 1) << kernel;
    if (gemm_like) {
      EXPECT_GT(num(row, "flop"), 0) << kernel;
    }
    std::vector<int64_t> sizes;
    const json_t *sz = json_object_get(row, "sizes");
    for (size_t k = 0; k < json_array_size(sz); k++)
      sizes.push_back(json_integer_value(json_array_get(sz, k)));
    shapes.insert(Shape(kernel, sizes));
    calls[kernel] += (int64_t)n;
    step_ms += n * ms;
    shares += num(row, "share");
    // the table shows the row too
    EXPECT_NE(r.out.find("\n  " + kernel + " "), std::string::npos) << kernel;
  }
  EXPECT_EQ(calls, want.calls);
  EXPECT_EQ(shapes, want.shapes);
  EXPECT_EQ(json_array_size(rows), want.groups);
  EXPECT_NEAR(step_ms, num(root, "step_ms"), 1e-9 * step_ms);
  EXPECT_NEAR(shares, 1.0, 1e-6);
  check_copies(r, root, want);
  json_decref(root);
}

TEST(BenchKernels, DemoStepEveryKernelTimed) {
  check_rows("", {"backend=cpu", "hardware.profile=configs/hw/cpu-2core.yaml"},
             {"embed_fwd", "linear_fwd", "attn_fwd", "attn_bwd", "router_fwd", "moe_dispatch", "expert_fwd",
              "expert_bwd_weight", "cross_entropy"});
}

// Everything resident with the optimizer on the device: its grad_sumsq and
// adamw calls are in the step and timed; two micro-batches add the sums.
TEST(BenchKernels, DeviceOptimizerStep) {
  check_rows("memory.plan=resident memory.device_budget=auto train.grad_accum=2",
             {"backend=cpu", "hardware.profile=configs/hw/cpu-2core.yaml", "memory.plan=resident",
              "memory.device_budget=auto", "train.grad_accum=2"},
             {"adamw", "grad_sumsq", "linear_fwd", "expert_fwd", "attn_fwd", "cross_entropy"});
}

// A plan that stages its copies: the staged rows use its layout's slabs.
TEST(BenchKernels, StagedPlanCopiesThroughItsSlabs) {
  check_rows("memory.device_budget=9MiB memory.staging=true",
             {"backend=cpu", "hardware.profile=configs/hw/cpu-2core.yaml", "memory.device_budget=9MiB",
              "memory.staging=true"},
             {"linear_fwd", "expert_fwd"});
}

TEST(BenchKernels, ErrorsExitWithAStatus) {
  Result none = moefit("bench kernels");
  EXPECT_EQ(none.code, 2) << none.out;
  EXPECT_NE(none.out.find("expected a CONFIG"), std::string::npos) << none.out;
  Result reps = moefit("bench kernels configs/demo.yaml --reps 0");
  EXPECT_EQ(reps.code, 2) << reps.out;
  Result missing = moefit("bench kernels no-such-config.yaml");
  EXPECT_EQ(missing.code, 1) << missing.out;
  EXPECT_NE(missing.out.find("no-such-config.yaml"), std::string::npos) << missing.out;
  Result backend = moefit("bench kernels configs/demo.yaml backend=tpu");
  EXPECT_EQ(backend.code, 1) << backend.out;
  EXPECT_NE(backend.out.find("tpu"), std::string::npos) << backend.out;
  const char *found = nullptr;
  ASSERT_EQ(mf_backend_resolve("auto", &found), MF_OK);
  if (std::string(found) != "cuda") {  // no GPU here: backend=cuda must say so (a budget it can plan in)
    Result cuda = moefit(
        "bench kernels configs/demo.yaml backend=cuda memory.device_budget=4GiB "
        "hardware.profile=configs/hw/cpu-2core.yaml");
    EXPECT_EQ(cuda.code, 1) << cuda.out;
    EXPECT_NE(cuda.out.find("moefit bench kernels: error: backend: cuda"), std::string::npos) << cuda.out;
  }
}

TEST(BenchKernels, HelpHasAnExample) {
  for (const char *c : {"bench --help", "bench kernels --help"}) {
    Result r = moefit(c);
    EXPECT_EQ(r.code, 0) << c;
    EXPECT_NE(r.out.find("  moefit bench kernels configs/demo.yaml backend=cpu"), std::string::npos) << r.out;
  }
}

}  // namespace
