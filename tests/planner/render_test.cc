// `moefit plan --svg`: the picture of a planned step is written whole, is
// well-formed XML, has its three lanes, the budget line and sane rectangles,
// escapes every name, stays small for long schedules, draws the optimizer on
// the device as its own category, and a path that cannot be written is an
// error naming it. And the text `moefit plan` prints about decisions: the
// per-layer table (with the optimizer column) and the optimizer summary.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "planner/plan.h"
#include "planner/render.h"
#include "planner/schedule.h"
#include "src/core/core.h"
#include "src/model/params.h"
#include "src/model/program.h"
#include "tests/planner/planner_test_util.h"

namespace {

using namespace mf_pt;

std::string tmp_path(const std::string &name) {
  const char *d = getenv("TEST_TMPDIR");
  return std::string(d ? d : "/tmp") + "/" + name;
}

std::string slurp(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// What `write` prints to a FILE, and its status.
std::string capture(const std::function<mf_status(FILE *)> &write, mf_status *st) {
  char *buf = nullptr;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f) {
    *st = MF_ERR_IO;
    return "";
  }
  *st = write(f);
  fclose(f);
  std::string s(buf ? buf : "", len);
  free(buf);
  return s;
}

// The whitespace-separated words of the table row that starts with `head`
// ("  layer 1 ", "  embed/head "), or none.
std::vector<std::string> row_words(const std::string &table, const std::string &head) {
  std::istringstream in(table);
  std::string line;
  while (std::getline(in, line))
    if (line.compare(0, head.size(), head) == 0) {
      std::istringstream w(line);
      std::vector<std::string> words;
      std::string x;
      while (w >> x) words.push_back(x);
      return words;
    }
  return {};
}

int count(const std::string &s, const std::string &what) {
  int n = 0;
  for (size_t i = s.find(what); i != std::string::npos; i = s.find(what, i + 1)) n++;
  return n;
}

// A small XML well-formedness check: tags balance and nest, attribute values
// are quoted, and '&' only starts an entity. Returns "" or what is wrong.
std::string xml_check(const std::string &s) {
  std::vector<std::string> stack;
  size_t i = 0;
  auto entity_ok = [&](size_t at) {
    static const char *const ents[] = {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"};
    for (const char *e : ents)
      if (s.compare(at, strlen(e), e) == 0) return true;
    return false;
  };
  while (i < s.size()) {
    if (s[i] == '&') {
      if (!entity_ok(i)) return "bad entity at " + std::to_string(i);
      i++;
      continue;
    }
    if (s[i] == '>') return "stray '>' at " + std::to_string(i);
    if (s[i] != '<') {
      i++;
      continue;
    }
    if (s.compare(i, 4, "<!--") == 0) {
      size_t e = s.find("-->", i);
      if (e == std::string::npos) return "unclosed comment";
      i = e + 3;
      continue;
    }
    const bool closing = i + 1 < s.size() && s[i + 1] == '/';
    size_t j = i + (closing ? 2 : 1);
    size_t n0 = j;
    while (j < s.size() && (isalnum((unsigned char)s[j]) || s[j] == '-' || s[j] == ':' || s[j] == '_')) j++;
    const std::string name = s.substr(n0, j - n0);
    if (name.empty()) return "tag without a name at " + std::to_string(i);
    // Attributes: name="value" pairs up to '>' or '/>'.
    bool self = false;
    while (true) {
      while (j < s.size() && isspace((unsigned char)s[j])) j++;
      if (j >= s.size()) return "unterminated tag " + name;
      if (s[j] == '>') break;
      if (s.compare(j, 2, "/>") == 0 && !closing) {
        self = true;
        j++;
        break;
      }
      if (closing) return "attribute on a closing tag " + name;
      size_t a0 = j;
      while (j < s.size() && s[j] != '=' && !isspace((unsigned char)s[j]) && s[j] != '>') j++;
      if (j == a0 || j >= s.size() || s[j] != '=') return "bad attribute in " + name;
      j++;
      if (j >= s.size() || (s[j] != '"' && s[j] != '\'')) return "unquoted attribute in " + name;
      const char q = s[j++];
      size_t v0 = j;
      while (j < s.size() && s[j] != q) {
        if (s[j] == '<') return "'<' in an attribute of " + name;
        j++;
      }
      if (j >= s.size()) return "unterminated attribute in " + name;
      for (size_t k = v0; k < j; k++)
        if (s[k] == '&' && !entity_ok(k)) return "bad entity in an attribute of " + name;
      j++;
    }
    if (closing) {
      if (stack.empty() || stack.back() != name) return "mismatched </" + name + ">";
      stack.pop_back();
    } else if (!self) {
      stack.push_back(name);
    }
    i = j + 1;
    if (stack.empty() && i < s.size() && s.find('<', i) != std::string::npos) return "content after the root";
  }
  if (!stack.empty()) return "unclosed <" + stack.back() + ">";
  return "";
}

// Every <rect ... width="W"> with W parsed; -1 where one has no width.
std::vector<double> rect_widths(const std::string &s) {
  std::vector<double> w;
  for (size_t i = s.find("<rect"); i != std::string::npos; i = s.find("<rect", i + 1)) {
    const size_t end = s.find('>', i);
    const size_t a = s.find(" width=\"", i);
    w.push_back(a != std::string::npos && a < end ? strtod(s.c_str() + a + 8, nullptr) : -1);
  }
  return w;
}

class Render : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    const mf_model_spec s = make_shape(1).spec;  // a dense layer and a shared expert
    ASSERT_EQ(mf_param_table_build(&s, &t_), MF_OK) << mf_last_error();
    mf_program_opts po = {2, 32, 2, 0.01, 16, 0};
    ASSERT_EQ(mf_program_build(t_, &po, &p_), MF_OK) << mf_last_error();
    hw_ = small_profile(GetParam());
  }
  void TearDown() override {
    mf_program_free(p_);
    mf_param_table_free(t_);
  }
  // A plan between the least-memory and the all-resident arenas: uploads,
  // downloads and recompute all appear, and the budget is on the scale.
  mf_plan *choose() {
    mf_plan *least = nullptr, *resident = nullptr, *c = nullptr;
    EXPECT_EQ(mf_plan_baseline(p_, &hw_, MF_PLAN_LEAST_MEMORY, UINT64_MAX, &least), MF_OK) << mf_last_error();
    EXPECT_EQ(mf_plan_baseline(p_, &hw_, MF_PLAN_RESIDENT, UINT64_MAX, &resident), MF_OK) << mf_last_error();
    if (!least || !resident) return nullptr;
    const uint64_t budget = least->s->arena_bytes + (resident->s->arena_bytes - least->s->arena_bytes) / 4;
    EXPECT_EQ(mf_plan_choose(p_, &hw_, budget, nullptr, nullptr, &c), MF_OK) << mf_last_error();
    mf_plan_free(least);
    mf_plan_free(resident);
    return c;
  }
  mf_param_table *t_ = nullptr;
  mf_program *p_ = nullptr;
  mf_hwprofile hw_;
};

TEST_P(Render, WritesAWellFormedPicture) {
  mf_plan *c = choose();
  ASSERT_NE(c, nullptr);
  const std::string path = tmp_path("plan" + std::to_string(GetParam()) + ".svg");
  ASSERT_EQ(mf_render_svg(c, nullptr, "configs/tiny.yaml", path.c_str()), MF_OK) << mf_last_error();
  const std::string s = slurp(path);
  ASSERT_EQ(s.compare(0, 4, "<svg"), 0) << s.substr(0, 80);
  EXPECT_EQ(xml_check(s), "");
  for (const char *want :
       {">compute<", ">H2D<", ">D2H<", "id=\"budget\"", "stroke-dasharray", "configs/tiny.yaml", ">forward<",
        ">backward<", ">upload<", ">device optimizer<", "peak ", "<title>upload "})
    EXPECT_NE(s.find(want), std::string::npos) << want;
  EXPECT_EQ(s.find("<script"), std::string::npos);
  EXPECT_EQ(s.find("@font-face"), std::string::npos);
  EXPECT_EQ(s.find("href"), std::string::npos);
  const std::vector<double> w = rect_widths(s);
  // Lanes' rectangles are at least one per drawn instruction group; every
  // instruction is in some group, so there are more than the legend's.
  EXPECT_GT(w.size(), 20u);
  for (double x : w) EXPECT_GE(x, 0.0);
  EXPECT_LT(s.size(), 2u << 20);
  // Written atomically: nothing left beside it.
  EXPECT_TRUE(slurp(path + ".tmp").empty());
  mf_plan_free(c);
}

TEST_P(Render, EscapesEveryName) {
  for (int32_t k = 0; k < p_->n_ops; k++) snprintf(p_->ops[k].label, sizeof p_->ops[k].label, "op<&>\"'%d", k);
  for (int32_t k = 0; k < p_->n_tensors; k++)
    snprintf(p_->tensors[k].name, sizeof p_->tensors[k].name, "t<&>%d", k);
  mf_plan *c = choose();
  ASSERT_NE(c, nullptr);
  const std::string path = tmp_path("escape" + std::to_string(GetParam()) + ".svg");
  ASSERT_EQ(mf_render_svg(c, nullptr, "a<b>&\"c\".yaml", path.c_str()), MF_OK) << mf_last_error();
  const std::string s = slurp(path);
  EXPECT_EQ(xml_check(s), "");
  EXPECT_EQ(s.find("<&>"), std::string::npos);
  EXPECT_NE(s.find("a&lt;b&gt;&amp;&quot;c&quot;.yaml"), std::string::npos);
  EXPECT_NE(s.find("op&lt;&amp;&gt;&quot;&apos;"), std::string::npos);
  EXPECT_NE(s.find("t&lt;&amp;&gt;"), std::string::npos);
  mf_plan_free(c);
}

// A long schedule (300k instructions) draws in a bounded file: tiny
// rectangles merge, the memory curve keeps one step per pixel column.
TEST_P(Render, LongSchedulesStaySmall) {
  mf_plan *c = choose();
  ASSERT_NE(c, nullptr);
  const int32_t n = 300000, base = c->s->n_instr;
  std::vector<mf_instr> instr(n);
  std::vector<uint8_t> stream(n);
  std::vector<double> cost(n), start(n), end(n);
  std::vector<size_t> live(n);
  double t[MF_SIM_STREAMS] = {0, 0, 0};
  size_t peak = 0;
  int32_t peak_i = 0;
  for (int32_t i = 0; i < n; i++) {
    const int32_t j = i % base;
    instr[i] = c->s->instr[j];
    stream[i] = c->sim.stream[j];
    cost[i] = c->sim.cost[j] > 0 ? c->sim.cost[j] : 1e-6;
    start[i] = t[stream[i]];
    end[i] = t[stream[i]] = start[i] + cost[i];
    live[i] = c->sim.live_bytes[j] + (size_t)(i % 977) * 64;
    if (live[i] > peak) peak = live[i], peak_i = i;
  }
  mf_schedule s = *c->s;
  s.instr = instr.data();
  s.n_instr = n;
  mf_plan big = *c;
  big.s = &s;
  big.sim.n_instr = n;
  big.sim.stream = stream.data();
  big.sim.cost = cost.data();
  big.sim.start = start.data();
  big.sim.end = end.data();
  big.sim.live_bytes = live.data();
  big.sim.peak_live_bytes = peak;
  big.sim.peak_instr = peak_i;
  big.sim.streams_seconds = big.sim.step_seconds = std::max(t[0], std::max(t[1], t[2]));
  const std::string path = tmp_path("long" + std::to_string(GetParam()) + ".svg");
  ASSERT_EQ(mf_render_svg(&big, nullptr, "long", path.c_str()), MF_OK) << mf_last_error();
  const std::string out = slurp(path);
  EXPECT_EQ(xml_check(out), "");
  EXPECT_LT(out.size(), 3u << 20) << "bytes for " << n << " instructions";
  EXPECT_NE(out.find(" instructions: "), std::string::npos) << "no merged run";
  for (double x : rect_widths(out)) EXPECT_GE(x, 0.0);
  mf_plan_free(c);
}

// The optimizer on the device: its NORM and OPTIM runs are their own colour
// and the OPTIM part's start is marked; with every optimizer on the host,
// neither appears (the colour only in the legend).
TEST_P(Render, DeviceOptimizerIsItsOwnCategory) {
  mf_decisions *d = nullptr;
  ASSERT_EQ(mf_decisions_create(p_, &d), MF_OK);
  const std::string optim_fill = "fill=\"#eeca3b\"";
  for (int device = 0; device < 2; device++) {
    memset(d->optim, device ? MF_OPTIM_DEVICE : MF_OPTIM_HOST, (size_t)d->n_params);
    mf_plan *pl = nullptr;
    ASSERT_EQ(mf_plan_evaluate(p_, &hw_, d, UINT64_MAX, MF_PLAN_CHOSEN, &pl), MF_OK) << mf_last_error();
    ASSERT_EQ(pl->s->n_optim_device, device ? d->n_params : 0);
    const std::string path = tmp_path("optim" + std::to_string(device) + std::to_string(GetParam()) + ".svg");
    ASSERT_EQ(mf_render_svg(pl, nullptr, "optim", path.c_str()), MF_OK) << mf_last_error();
    const std::string s = slurp(path);
    EXPECT_EQ(xml_check(s), "");
    EXPECT_NE(s.find(">device optimizer<"), std::string::npos);  // the legend, always
    if (device) {
      EXPECT_GE(count(s, optim_fill), 2) << "no lane rectangle of the device optimizer";
      EXPECT_NE(s.find("id=\"optim-begin\""), std::string::npos);
      EXPECT_NE(s.find("adamw model."), std::string::npos) << "an AdamW run named in a title";
    } else {
      EXPECT_EQ(count(s, optim_fill), 1);
      EXPECT_EQ(s.find("id=\"optim-begin\""), std::string::npos);
      EXPECT_EQ(s.find("adamw model."), std::string::npos);
    }
    mf_plan_free(pl);
  }
  mf_decisions_free(d);
}

TEST_P(Render, LayerTableHasTheOptimizerColumn) {
  mf_decisions *d = nullptr;
  ASSERT_EQ(mf_decisions_create(p_, &d), MF_OK);
  mf_status st;
  std::string t = capture([&](FILE *f) { return mf_render_layer_table(p_, d, f); }, &st);
  ASSERT_EQ(st, MF_OK) << mf_last_error();
  EXPECT_NE(t.find("per layer:"), std::string::npos) << t;
  EXPECT_NE(t.find("optimizer"), std::string::npos) << t;
  const int L = (int)p_->spec.layers;
  ASSERT_GE(L, 2);
  // Words of a row: "layer", N, weights resident, streamed, gradients on the
  // device, streamed, the optimizer, ... (embed/head: one word fewer).
  EXPECT_EQ(row_words(t, "  embed/head ").at(5), "host") << t;
  for (int l = 0; l < L; l++)
    EXPECT_EQ(row_words(t, "  layer " + std::to_string(l) + " ").at(6), "host") << t;

  // Layer 0 on the device, one parameter of layer 1, the rest at home.
  int n1 = 0, first1 = -1;
  for (int32_t i = 0; i < d->n_params; i++) {
    const int layer = p_->params->params[i].layer;
    if (layer == 0) d->optim[i] = MF_OPTIM_DEVICE;
    if (layer == 1 && n1++ == 0) first1 = i;
  }
  ASSERT_GT(n1, 1);
  d->optim[first1] = MF_OPTIM_DEVICE;
  t = capture([&](FILE *f) { return mf_render_layer_table(p_, d, f); }, &st);
  ASSERT_EQ(st, MF_OK) << mf_last_error();
  EXPECT_EQ(row_words(t, "  embed/head ").at(5), "host") << t;
  EXPECT_EQ(row_words(t, "  layer 0 ").at(6), "device") << t;
  const std::vector<std::string> w1 = row_words(t, "  layer 1 ");
  ASSERT_GE(w1.size(), 8u) << t;
  EXPECT_EQ(w1[6], "mixed") << t;
  EXPECT_EQ(w1[7], "1/" + std::to_string(n1)) << t;
  EXPECT_EQ(row_words(t, "  layer 2 ").at(6), "host") << t;
  // The other columns did not move: weights and gradients, all resident/on the device.
  EXPECT_EQ(w1[2], std::to_string(n1)) << t;
  EXPECT_EQ(w1[3], "0") << t;

  // A forward-only program has no optimizer.
  mf_program *fwd = nullptr;
  mf_program_opts po = {2, 32, 1, 0.01, 16, 1};
  ASSERT_EQ(mf_program_build(t_, &po, &fwd), MF_OK) << mf_last_error();
  mf_decisions *fd = nullptr;
  ASSERT_EQ(mf_decisions_create(fwd, &fd), MF_OK);
  t = capture([&](FILE *f) { return mf_render_layer_table(fwd, fd, f); }, &st);
  ASSERT_EQ(st, MF_OK) << mf_last_error();
  EXPECT_EQ(row_words(t, "  layer 0 ").at(6), "-") << t;
  std::string sum = capture([&](FILE *f) { return mf_render_optimizer_summary(fwd, fd, f); }, &st);
  EXPECT_EQ(st, MF_OK);
  EXPECT_NE(sum.find("optimizer: none"), std::string::npos) << sum;
  // Decisions of another program, NULLs.
  capture([&](FILE *f) { return mf_render_layer_table(p_, fd, f); }, &st);
  EXPECT_EQ(st, MF_ERR_INVALID_ARG);
  EXPECT_EQ(mf_render_layer_table(p_, d, nullptr), MF_ERR_INVALID_ARG);
  EXPECT_EQ(mf_render_optimizer_summary(nullptr, d, stdout), MF_ERR_INVALID_ARG);
  mf_decisions_free(fd);
  mf_program_free(fwd);
  mf_decisions_free(d);
}

TEST_P(Render, OptimizerSummaryCountsParametersAndState) {
  mf_decisions *d = nullptr;
  ASSERT_EQ(mf_decisions_create(p_, &d), MF_OK);
  mf_status st;
  std::string s = capture([&](FILE *f) { return mf_render_optimizer_summary(p_, d, f); }, &st);
  ASSERT_EQ(st, MF_OK) << mf_last_error();
  EXPECT_NE(s.find("optimizer: all " + std::to_string(d->n_params) + " parameters updated on the host"),
            std::string::npos)
      << s;
  // Every other parameter on the device: fp32 weights (4 bytes an element)
  // and fp32 m and v (8 bytes an element) stay there.
  int dev = 0;
  uint64_t numel = 0;
  for (int32_t i = 0; i < d->n_params; i += 2) {
    d->optim[i] = MF_OPTIM_DEVICE;
    dev++;
    numel += (uint64_t)p_->params->params[i].numel;
  }
  s = capture([&](FILE *f) { return mf_render_optimizer_summary(p_, d, f); }, &st);
  ASSERT_EQ(st, MF_OK) << mf_last_error();
  char w[32], m[32];
  const std::string want =
      "optimizer: " + std::to_string(dev) + " of " + std::to_string(d->n_params) + " parameters";
  EXPECT_NE(s.find(want), std::string::npos) << s;
  EXPECT_NE(s.find(std::string(mf_format_bytes(4 * numel, w, sizeof w)) + " of weights"), std::string::npos)
      << s;
  EXPECT_NE(s.find(std::string(mf_format_bytes(8 * numel, m, sizeof m)) + " of AdamW state (fp32 moments)"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("; " + std::to_string(d->n_params - dev) + " on the host"), std::string::npos) << s;
  mf_decisions_free(d);
}

// Issue 27 item 4: the host's lane. The least-memory plan stages every copy
// (its layout built as the run plan builds it) and updates every parameter on
// the host: the lane shows the slabs' fills and copy-outs and the host AdamW,
// with their times; the all-resident plan with the optimizer on the device
// and nothing staged leaves it empty. An NVMe floor on the optimizer draws it
// as NVMe-bound.
TEST_P(Render, HostLaneShowsStagingAndTheHostOptimizer) {
  mf_plan *least = nullptr, *resident = nullptr;
  ASSERT_EQ(mf_plan_baseline(p_, &hw_, MF_PLAN_LEAST_MEMORY, UINT64_MAX, &least), MF_OK) << mf_last_error();
  ASSERT_EQ(mf_plan_baseline(p_, &hw_, MF_PLAN_RESIDENT, UINT64_MAX, &resident), MF_OK) << mf_last_error();
  mf_staging *sg = nullptr;
  ASSERT_EQ(mf_staging_build(least->s, &least->sim, &hw_, nullptr, &sg), MF_OK) << mf_last_error();
  ASSERT_GT(sg->n_slabs, 0);
  const std::string path = tmp_path("host" + std::to_string(GetParam()) + ".svg");
  ASSERT_EQ(mf_render_svg(least, sg, "host", path.c_str()), MF_OK) << mf_last_error();
  std::string s = slurp(path);
  EXPECT_EQ(xml_check(s), "");
  const size_t lane = s.find("<g id=\"lane-host\">"), end = s.find("</g>", lane);
  ASSERT_NE(lane, std::string::npos);
  const std::string host = s.substr(lane, end - lane);
  EXPECT_NE(host.find("<title>staging fill of "), std::string::npos) << host.substr(0, 400);
  EXPECT_NE(host.find("<title>staging copy-out of "), std::string::npos) << host.substr(0, 400);
  ASSERT_GT(least->sim.optimizer_seconds, 0);
  EXPECT_NE(host.find("<title>host AdamW: "), std::string::npos) << host.substr(0, 400);
  EXPECT_EQ(host.find("NVMe-bound"), std::string::npos);
  EXPECT_NE(s.find(">host<"), std::string::npos);
  EXPECT_NE(s.find(">staging fill<"), std::string::npos);  // the legend

  // Its optimizer's state streaming from NVMe sets the updates' pace.
  mf_plan *slow = nullptr;
  mf_sim_opts so = least->so;
  so.optimizer_floor_seconds = 10 * least->sim.optimizer_seconds + 1;
  ASSERT_EQ(mf_plan_evaluate_like(least, least->d, &slow), MF_OK) << mf_last_error();
  mf_sim_result_free(&slow->sim);
  slow->so = so;
  ASSERT_EQ(mf_simulate(slow->s, &hw_, &slow->so, &slow->sim), MF_OK) << mf_last_error();
  ASSERT_EQ(mf_render_svg(slow, nullptr, "nvme", path.c_str()), MF_OK) << mf_last_error();
  s = slurp(path);
  EXPECT_NE(s.find("<title>host AdamW (NVMe-bound): "), std::string::npos);
  EXPECT_EQ(mf_plan_bound(slow), MF_BOUND_NVME);

  ASSERT_EQ(mf_render_svg(resident, nullptr, "resident", path.c_str()), MF_OK) << mf_last_error();
  s = slurp(path);
  const size_t l2 = s.find("<g id=\"lane-host\">");
  ASSERT_NE(l2, std::string::npos);
  EXPECT_EQ(s.substr(l2, s.find("</g>", l2) - l2).find("<rect"), std::string::npos)
      << "nothing staged, the optimizer on the device: the host lane is empty";
  mf_staging_free(sg);
  mf_plan_free(least);
  mf_plan_free(resident);
  mf_plan_free(slow);
}

TEST_P(Render, UnwritablePathIsAnIoErrorNamingIt) {
  mf_plan *c = choose();
  ASSERT_NE(c, nullptr);
  const char *bad = "/nonexistent-moefit-dir/plan.svg";
  EXPECT_EQ(mf_render_svg(c, nullptr, "x", bad), MF_ERR_IO);
  EXPECT_NE(std::string(mf_last_error()).find("/nonexistent-moefit-dir/plan.svg"), std::string::npos)
      << mf_last_error();
  EXPECT_EQ(mf_render_svg(nullptr, nullptr, "x", "/tmp/x.svg"), MF_ERR_INVALID_ARG);
  EXPECT_EQ(mf_render_svg(c, nullptr, "x", nullptr), MF_ERR_INVALID_ARG);
  mf_plan_free(c);
}

INSTANTIATE_TEST_SUITE_P(Profiles, Render, ::testing::Values(0, 1),
                         [](const ::testing::TestParamInfo<int> &i) {
                           return std::string(i.param ? "overlapping_copies" : "serial");
                         });

}  // namespace
