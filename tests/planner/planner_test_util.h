// Shared fixtures of the planner tests: small model shapes and a hardware profile.
#ifndef MF_TESTS_PLANNER_TEST_UTIL_H
#define MF_TESTS_PLANNER_TEST_UTIL_H

#include <cstdio>

#include "planner/hwprofile.h"
#include "src/model/spec.h"

namespace mf_pt {

struct Shape {
  const char *name;
  mf_model_spec spec;
};

// The three shapes the planner tests run: 0 the demo's (smaller), 1 a dense
// layer and a shared expert, 2 many small experts with q/k norm.
inline Shape make_shape(int which) {
  Shape sh;
  mf_model_spec &s = sh.spec;
  if (which == 0) {  // the demo's shape, smaller
    sh.name = "mixtral";
    mf_model_spec_defaults(MF_FAMILY_MIXTRAL, &s);
    s.hidden = 32, s.layers = 2, s.heads = 4, s.kv_heads = 2, s.head_dim = 8, s.experts = 8, s.top_k = 2;
    s.expert_ffn = 32, s.vocab = 64;
  } else if (which == 1) {  // a dense layer and a shared expert
    sh.name = "qwen2_dense_shared";
    mf_model_spec_defaults(MF_FAMILY_QWEN2_MOE, &s);
    s.hidden = 32, s.layers = 3, s.heads = 4, s.kv_heads = 2, s.head_dim = 8, s.experts = 8, s.top_k = 2;
    s.expert_ffn = 16, s.shared_ffn = 24, s.dense_ffn = 20, s.vocab = 64, s.n_mlp_only = 1, s.mlp_only_layers[0] = 0;
  } else {  // many small experts, q/k norm
    sh.name = "olmoe_many_experts";
    mf_model_spec_defaults(MF_FAMILY_OLMOE, &s);
    s.hidden = 32, s.layers = 2, s.heads = 4, s.kv_heads = 4, s.head_dim = 8, s.experts = 32, s.top_k = 4;
    s.expert_ffn = 8, s.vocab = 64;
  }
  s.max_seq = 64;
  s.rope_theta = 10000.0;
  return sh;
}

// A small machine: slow enough links that streaming costs something, GEMM rates
// in two points; overlap = 0 runs copies and compute on one timeline.
inline mf_hwprofile small_profile(int overlap) {
  mf_hwprofile hw{};
  snprintf(hw.name, sizeof hw.name, "test");
  hw.device_memory = 1ull << 30;
  hw.copies_overlap_compute = overlap;
  hw.h2d_bandwidth = hw.d2h_bandwidth = 2e9;
  hw.h2d_latency_s = hw.d2h_latency_s = 5e-6;
  hw.gemm[0] = {64, 64, 64, 5e9};
  hw.gemm[1] = {1024, 1024, 1024, 2e10};
  hw.n_gemm = 2;
  hw.attn[0] = {64, 8, 1e10};
  hw.n_attn = 1;
  hw.elementwise_bandwidth = 1e10;
  hw.launch_s = 2e-6;
  hw.host_memory = 1ull << 34;
  hw.host_adamw_params_per_s = 5e8;
  hw.host_memory_bandwidth = 2e10;
  return hw;
}

}  // namespace mf_pt

#endif  // MF_TESTS_PLANNER_TEST_UTIL_H
