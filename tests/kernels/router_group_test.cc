// DeepSeek-V3's and GLM-4.5's sigmoid router (kernels/cpu/router_group.c)
// against transformers' DeepseekV3TopkRouter (tests/fixtures/router_group,
// tools/make_router_fixtures.py): the same experts chosen, their weights and
// the autograd gradient of the logits within fp32 rounding (1e-6 of the
// largest), on DeepSeek-V3's proportions, without a group limit, with one
// group kept, and with choice scores below zero (the left-out group's experts,
// masked to 0.0 as transformers masks them, chosen); the bits do not depend
// on the thread count; bad shapes are refused.
#include <gtest/gtest.h>
#include <jansson.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "src/core/core.h"
#include "src/io/safetensors.h"

namespace {

const char kFile[] = "tests/fixtures/router_group/cases.safetensors";

struct Cfg {
  int64_t T = 0, E = 0, K = 0, n_group = 0, topk_group = 0;
  int norm_topk = 0;
  float scaling = 0;
};

class RouterGroup : public ::testing::TestWithParam<const char *> {
 protected:
  void SetUp() override {
    ASSERT_EQ(mf_safetensors_open(kFile, &st_), MF_OK) << mf_last_error();
    const char *m = mf_safetensors_metadata(st_, GetParam());
    ASSERT_NE(m, nullptr) << "no metadata entry " << GetParam();
    json_error_t je;
    json_t *j = json_loads(m, 0, &je);
    ASSERT_NE(j, nullptr) << je.text;
    c_.E = json_integer_value(json_object_get(j, "E"));
    c_.K = json_integer_value(json_object_get(j, "K"));
    c_.n_group = json_integer_value(json_object_get(j, "n_group"));
    c_.topk_group = json_integer_value(json_object_get(j, "topk_group"));
    c_.norm_topk = (int)json_integer_value(json_object_get(j, "norm_topk"));
    c_.scaling = (float)json_number_value(json_object_get(j, "scaling"));
    json_decref(j);
    const mf_st_tensor *l = find("logits");
    ASSERT_TRUE(l && l->ndim == 2 && (int64_t)l->shape[1] == c_.E);
    c_.T = (int64_t)l->shape[0];
  }
  void TearDown() override { mf_safetensors_close(st_); }
  const mf_st_tensor *find(const char *what) const {
    return mf_safetensors_find(st_, (std::string(GetParam()) + "." + what).c_str());
  }
  template <typename T>
  const T *data(const char *what) const {
    const mf_st_tensor *x = find(what);
    EXPECT_NE(x, nullptr) << GetParam() << "." << what;
    return x ? (const T *)x->data : nullptr;
  }
  // Forward with `threads` pool threads (0: none).
  void forward(int threads, std::vector<float> *s, std::vector<int32_t> *idx, std::vector<float> *w) const {
    s->assign((size_t)(c_.T * c_.E), -1.0f);
    idx->assign((size_t)(c_.T * c_.K), -1);
    w->assign((size_t)(c_.T * c_.K), -1.0f);
    mf_threadpool *pool = nullptr;
    if (threads) {
      ASSERT_EQ(mf_threadpool_create(threads, &pool), MF_OK);
    }
    mf_kctx ctx = {};
    ctx.pool = pool;
    ASSERT_EQ(mf_cpu_router_group_fwd(data<float>("logits"), data<float>("bias"), c_.T, c_.E, c_.K,
                                      c_.n_group, c_.topk_group, c_.norm_topk, c_.scaling, s->data(),
                                      idx->data(), w->data(), &ctx),
              MF_OK)
        << mf_last_error();
    mf_threadpool_free(pool);
  }
  void backward(int threads, const std::vector<float> &s, const std::vector<int32_t> &idx,
                std::vector<float> *dl) const {
    const float *G = data<float>("G");
    std::vector<float> g((size_t)(c_.T * c_.K));
    for (int64_t t = 0; t < c_.T; t++)
      for (int64_t j = 0; j < c_.K; j++) g[t * c_.K + j] = G[t * c_.E + idx[t * c_.K + j]];
    dl->assign((size_t)(c_.T * c_.E), NAN);
    mf_threadpool *pool = nullptr;
    if (threads) {
      ASSERT_EQ(mf_threadpool_create(threads, &pool), MF_OK);
    }
    mf_kctx ctx = {};
    ctx.pool = pool;
    ASSERT_EQ(mf_cpu_router_group_bwd(s.data(), idx.data(), g.data(), c_.T, c_.E, c_.K, c_.norm_topk,
                                      c_.scaling, dl->data(), &ctx),
              MF_OK)
        << mf_last_error();
    mf_threadpool_free(pool);
  }
  mf_safetensors *st_ = nullptr;
  Cfg c_;
};

double max_abs(const float *x, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; i++) m = std::max(m, (double)std::fabs(x[i]));
  return m;
}

TEST_P(RouterGroup, ChoosesTransformersExpertsWithItsWeights) {
  std::vector<float> s, w;
  std::vector<int32_t> idx;
  forward(0, &s, &idx, &w);
  const int32_t *chosen = data<int32_t>("chosen");
  const float *weight = data<float>("weight");
  ASSERT_TRUE(chosen && weight);
  std::vector<int32_t> mine((size_t)(c_.T * c_.E), 0);
  std::vector<float> mw((size_t)(c_.T * c_.E), 0.0f);
  for (int64_t t = 0; t < c_.T; t++)
    for (int64_t j = 0; j < c_.K; j++) {
      const int32_t e = idx[t * c_.K + j];
      ASSERT_TRUE(e >= 0 && e < c_.E) << "row " << t;
      EXPECT_EQ(mine[t * c_.E + e], 0) << "row " << t << ": expert " << e << " chosen twice";
      mine[t * c_.E + e] = 1;
      mw[t * c_.E + e] = w[t * c_.K + j];
    }
  for (int64_t t = 0; t < c_.T; t++)
    for (int64_t e = 0; e < c_.E; e++)
      EXPECT_EQ(mine[t * c_.E + e], chosen[t * c_.E + e]) << "row " << t << " e " << e;
  const double tol = 1e-6 * max_abs(weight, mw.size());
  for (size_t i = 0; i < mw.size(); i++) EXPECT_NEAR(mw[i], weight[i], tol) << "element " << i;
}

TEST_P(RouterGroup, BackwardIsAutogradsGradient) {
  std::vector<float> s, w, dl;
  std::vector<int32_t> idx;
  forward(0, &s, &idx, &w);
  backward(0, s, idx, &dl);
  const float *want = data<float>("dlogits");
  ASSERT_NE(want, nullptr);
  const double scale = max_abs(want, dl.size());
  ASSERT_GT(scale, 0);
  for (size_t i = 0; i < dl.size(); i++) EXPECT_NEAR(dl[i], want[i], 1e-6 * scale) << "element " << i;
}

TEST_P(RouterGroup, ThreadsDoNotChangeTheBits) {
  std::vector<float> s0, w0, s3, w3, d0, d3;
  std::vector<int32_t> i0, i3;
  forward(0, &s0, &i0, &w0);
  forward(3, &s3, &i3, &w3);
  EXPECT_EQ(s0, s3);
  EXPECT_EQ(i0, i3);
  EXPECT_EQ(memcmp(w0.data(), w3.data(), w0.size() * 4), 0);
  backward(0, s0, i0, &d0);
  backward(3, s0, i0, &d3);
  EXPECT_EQ(memcmp(d0.data(), d3.data(), d0.size() * 4), 0);
}

INSTANTIATE_TEST_SUITE_P(Cases, RouterGroup, ::testing::Values("v3", "flat", "one_group", "negative"),
                         [](const ::testing::TestParamInfo<const char *> &i) {
                           return std::string(i.param);
                         });

TEST(RouterGroupArgs, BadShapesAreRefused) {
  std::vector<float> l(64), s(64), w(8);
  std::vector<int32_t> idx(8);
  const struct {
    int64_t E, K, n_group, topk_group;
    const char *want;
  } cases[] = {
      {16, 17, 1, 1, "K=17 experts of E=16"},    {16, 2, 3, 1, "n_group 3 must divide E=16"},
      {16, 2, 16, 1, "groups of 2 or more"},     {16, 6, 4, 1, "cannot hold K=6"},
      {16, 2, 4, 5, "topk_group 5 of 4 groups"},
  };
  for (const auto &c : cases) {
    EXPECT_EQ(mf_cpu_router_group_fwd(l.data(), nullptr, 4, c.E, c.K, c.n_group, c.topk_group, 1, 1.0f,
                                      s.data(), idx.data(), w.data(), nullptr),
              MF_ERR_INVALID_ARG)
        << c.want;
    EXPECT_NE(std::string(mf_last_error()).find(c.want), std::string::npos) << mf_last_error();
  }
}

}  // namespace
