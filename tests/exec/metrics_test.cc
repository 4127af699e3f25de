// metrics.jsonl (every line parsed back with jansson) and the progress line.
#include <gtest/gtest.h>
#include <jansson.h>

#include <sys/stat.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "src/train/metrics.h"

namespace {

std::string TmpPath(const std::string &name) {
  const char *d = getenv("TEST_TMPDIR");
  return std::string(d ? d : "/tmp") + "/" + name;
}

std::string ReadText(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

std::vector<std::string> Lines(const std::string &path) {
  std::vector<std::string> v;
  std::istringstream in(ReadText(path));
  for (std::string line; std::getline(in, line);) v.push_back(line);
  return v;
}

mf_step_metrics Step(int64_t step) {
  mf_step_metrics s;
  mf_step_metrics_init(&s);
  s.step = step;
  s.loss = 2.5 - 0.01 * (double)step;
  s.ce_loss = s.loss - 0.02;
  s.aux_loss = 2.0104;
  s.lr = 2.6666666e-3;
  s.grad_norm = 0.512;
  s.tokens_per_s = 12345.6;
  s.tokens = 4096 * step;
  s.elapsed_s = 0.3 * (double)step;
  return s;
}

// Parses a line; fails the test when it is not one JSON object.
json_t *Parse(const std::string &line) {
  json_error_t err;
  json_t *j = json_loads(line.c_str(), JSON_REJECT_DUPLICATES, &err);
  EXPECT_NE(j, nullptr) << err.text << " in: " << line;
  if (j) {
    EXPECT_TRUE(json_is_object(j)) << line;
  }
  return j;
}

double Num(json_t *j, const char *key) {
  json_t *v = json_object_get(j, key);
  EXPECT_TRUE(v && json_is_number(v)) << key;
  return v ? json_number_value(v) : NAN;
}

TEST(Metrics, LinesAreJson) {
  std::string dir = TmpPath("run_a/nested/dir");  // created with its parents
  mf_metrics *m = nullptr;
  ASSERT_EQ(mf_metrics_open(dir.c_str(), 0, &m), MF_OK) << mf_last_error();
  EXPECT_EQ(std::string(mf_metrics_path(m)), dir + "/metrics.jsonl");
  for (int64_t i = 1; i <= 3; i++) {
    mf_step_metrics s = Step(i);
    if (i == 2) {
      s.skipped = 1;
      s.loss = NAN;
      s.grad_norm = INFINITY;
      s.eval_loss = 1.75;
      s.eval_s = 12.5;
      s.window_steps = 10;
      s.window_loss = 2.375;
      s.window_aux_loss = 2.0625;
      s.step_s = 0.25;
      s.expert_imbalance = 1.5;
      s.busy_s[0] = 0.125, s.busy_s[1] = 0.0625, s.busy_s[2] = 0.03125;
      for (int k = 0; k < 3; k++) s.idle_s[k] = s.step_s - s.busy_s[k];
      s.h2d_bytes = 1824768;
      s.d2h_bytes = 9007199254740992.0;  // 2^53: bytes stay exact integers
      s.peak_device_bytes = 14145536;
      s.optimizer_hidden_s = 0.015;
      s.optimizer_exposed_s = 0.005;
      s.staging_fill_s = 0.0078125;
      s.staging_drain_s = 0.00390625;
      s.checkpoint_s = 0.5;
      s.checkpoint_bytes = 5e9;
    }
    ASSERT_EQ(mf_metrics_write(m, &s), MF_OK) << mf_last_error();
    // Each line is in the file as soon as write returns.
    EXPECT_EQ(Lines(dir + "/metrics.jsonl").size(), (size_t)i);
  }
  mf_metrics_close(m);

  std::vector<std::string> lines = Lines(dir + "/metrics.jsonl");
  ASSERT_EQ(lines.size(), 3u);
  const char *keys[] = {"step",
                        "loss",
                        "ce_loss",
                        "aux_loss",
                        "window_steps",
                        "window_loss",
                        "window_aux_loss",
                        "lr",
                        "grad_norm",
                        "tokens_per_s",
                        "tokens",
                        "elapsed_s",
                        "skipped",
                        "eval_loss",
                        "eval_s",
                        "step_s",
                        "expert_imbalance",
                        "compute_busy_s",
                        "h2d_busy_s",
                        "d2h_busy_s",
                        "compute_idle_s",
                        "h2d_idle_s",
                        "d2h_idle_s",
                        "host_submit_s",
                        "h2d_bytes",
                        "d2h_bytes",
                        "peak_device_bytes",
                        "optimizer_hidden_s",
                        "optimizer_exposed_s",
                        "staging_fill_s",
                        "staging_drain_s",
                        "checkpoint_s",
                        "checkpoint_bytes",
                        "checkpoint_write_s"};
  for (size_t i = 0; i < lines.size(); i++) {
    json_t *j = Parse(lines[i]);
    ASSERT_NE(j, nullptr);
    EXPECT_EQ(json_object_size(j), sizeof keys / sizeof keys[0]);
    for (const char *k : keys) EXPECT_NE(json_object_get(j, k), nullptr) << k;
    mf_step_metrics s = Step((int64_t)i + 1);
    EXPECT_TRUE(json_is_integer(json_object_get(j, "step")));
    EXPECT_EQ(json_integer_value(json_object_get(j, "step")), (json_int_t)i + 1);
    EXPECT_EQ(json_integer_value(json_object_get(j, "tokens")), (json_int_t)s.tokens);
    EXPECT_DOUBLE_EQ(Num(j, "aux_loss"), 2.0104);
    EXPECT_NEAR(Num(j, "lr"), 2.6666666e-3, 1e-12);  // %.9g keeps 9 digits
    EXPECT_DOUBLE_EQ(Num(j, "tokens_per_s"), 12345.6);
    EXPECT_DOUBLE_EQ(Num(j, "elapsed_s"), s.elapsed_s);
    if (i == 1) {
      EXPECT_TRUE(json_is_null(json_object_get(j, "loss"))) << "NaN is written as null";
      EXPECT_TRUE(json_is_null(json_object_get(j, "grad_norm"))) << "Inf is written as null";
      EXPECT_TRUE(json_is_true(json_object_get(j, "skipped")));
      EXPECT_DOUBLE_EQ(Num(j, "eval_loss"), 1.75);
      EXPECT_DOUBLE_EQ(Num(j, "eval_s"), 12.5);
      EXPECT_EQ(json_integer_value(json_object_get(j, "window_steps")), 10);
      EXPECT_DOUBLE_EQ(Num(j, "window_loss"), 2.375);
      EXPECT_DOUBLE_EQ(Num(j, "window_aux_loss"), 2.0625);
      EXPECT_DOUBLE_EQ(Num(j, "step_s"), 0.25);
      EXPECT_DOUBLE_EQ(Num(j, "expert_imbalance"), 1.5);
      EXPECT_DOUBLE_EQ(Num(j, "compute_busy_s"), 0.125);
      EXPECT_DOUBLE_EQ(Num(j, "h2d_busy_s"), 0.0625);
      EXPECT_DOUBLE_EQ(Num(j, "d2h_busy_s"), 0.03125);
      EXPECT_DOUBLE_EQ(Num(j, "compute_idle_s"), 0.125);
      EXPECT_DOUBLE_EQ(Num(j, "h2d_idle_s"), 0.1875);
      EXPECT_DOUBLE_EQ(Num(j, "d2h_idle_s"), 0.21875);
      EXPECT_DOUBLE_EQ(Num(j, "h2d_bytes"), 1824768.0);
      EXPECT_DOUBLE_EQ(Num(j, "d2h_bytes"), 9007199254740992.0);
      EXPECT_DOUBLE_EQ(Num(j, "peak_device_bytes"), 14145536.0);
      EXPECT_DOUBLE_EQ(Num(j, "optimizer_hidden_s"), 0.015);
      EXPECT_DOUBLE_EQ(Num(j, "optimizer_exposed_s"), 0.005);
      EXPECT_DOUBLE_EQ(Num(j, "staging_fill_s"), 0.0078125);
      EXPECT_DOUBLE_EQ(Num(j, "staging_drain_s"), 0.00390625);
      EXPECT_DOUBLE_EQ(Num(j, "checkpoint_s"), 0.5);
      EXPECT_DOUBLE_EQ(Num(j, "checkpoint_bytes"), 5e9);
    } else {
      EXPECT_DOUBLE_EQ(Num(j, "loss"), s.loss);
      EXPECT_DOUBLE_EQ(Num(j, "ce_loss"), s.ce_loss);
      EXPECT_DOUBLE_EQ(Num(j, "grad_norm"), 0.512);
      EXPECT_TRUE(json_is_false(json_object_get(j, "skipped")));
      // Optional fields left at their init value (NaN) are null.
      EXPECT_TRUE(json_is_null(json_object_get(j, "eval_loss")));
      EXPECT_TRUE(json_is_null(json_object_get(j, "eval_s")));
      EXPECT_EQ(json_integer_value(json_object_get(j, "window_steps")), 0) << "no window";
      EXPECT_TRUE(json_is_null(json_object_get(j, "window_loss")));
      EXPECT_TRUE(json_is_null(json_object_get(j, "window_aux_loss")));
      EXPECT_TRUE(json_is_null(json_object_get(j, "step_s")));
      EXPECT_TRUE(json_is_null(json_object_get(j, "expert_imbalance")));
      // Streams not measured: null; the optimizer's overlap fields default to 0.
      for (const char *k : {"compute_busy_s", "h2d_busy_s", "d2h_busy_s", "compute_idle_s", "h2d_idle_s",
                            "d2h_idle_s", "h2d_bytes", "d2h_bytes", "peak_device_bytes", "staging_fill_s",
                            "staging_drain_s", "checkpoint_s", "checkpoint_bytes", "checkpoint_write_s"})
        EXPECT_TRUE(json_is_null(json_object_get(j, k))) << k;
      EXPECT_EQ(Num(j, "optimizer_hidden_s"), 0.0);
      EXPECT_EQ(Num(j, "optimizer_exposed_s"), 0.0);
    }
    json_decref(j);
  }
}

TEST(Metrics, ExtremeValuesStayValidJson) {
  mf_step_metrics s = Step(7);
  s.loss = -0.0;
  s.lr = 1e-300;
  s.grad_norm = 1.7976931348623157e308;
  s.ce_loss = -INFINITY;
  s.step = INT64_MAX;
  s.tokens = INT64_MAX;
  char buf[1024];
  size_t n = mf_metrics_format_json(buf, sizeof buf, &s);
  ASSERT_LT(n, sizeof buf);
  EXPECT_EQ(n, strlen(buf));
  json_t *j = Parse(buf);
  ASSERT_NE(j, nullptr);
  EXPECT_DOUBLE_EQ(Num(j, "lr"), 1e-300);
  EXPECT_TRUE(json_is_null(json_object_get(j, "ce_loss")));
  json_decref(j);

  // A short buffer is cut like snprintf's and says how much it needed.
  char small[16];
  size_t need = mf_metrics_format_json(small, sizeof small, &s);
  EXPECT_EQ(need, n);
  EXPECT_EQ(strlen(small), sizeof small - 1);
}

TEST(Metrics, NewRunTruncatesResumeAppends) {
  std::string dir = TmpPath("run_b");
  std::string file = dir + "/metrics.jsonl";
  mf_metrics *m = nullptr;
  ASSERT_EQ(mf_metrics_open(dir.c_str(), 0, &m), MF_OK) << mf_last_error();
  for (int i = 1; i <= 4; i++) {
    mf_step_metrics s = Step(i);
    ASSERT_EQ(mf_metrics_write(m, &s), MF_OK);
  }
  mf_metrics_close(m);
  ASSERT_EQ(Lines(file).size(), 4u);

  // A crash in the middle of a line: resume drops the half line.
  {
    std::ofstream f(file, std::ios::binary | std::ios::app);
    f << "{\"step\":5,\"loss\":2.4";
  }
  ASSERT_EQ(mf_metrics_open(dir.c_str(), 1, &m), MF_OK) << mf_last_error();
  mf_step_metrics s = Step(5);
  ASSERT_EQ(mf_metrics_write(m, &s), MF_OK);
  mf_metrics_close(m);
  std::vector<std::string> lines = Lines(file);
  ASSERT_EQ(lines.size(), 5u);
  for (size_t i = 0; i < lines.size(); i++) {
    json_t *j = Parse(lines[i]);
    ASSERT_NE(j, nullptr);
    EXPECT_EQ(json_integer_value(json_object_get(j, "step")), (json_int_t)i + 1);
    json_decref(j);
  }

  // A new run starts the file again.
  ASSERT_EQ(mf_metrics_open(dir.c_str(), 0, &m), MF_OK);
  s = Step(1);
  ASSERT_EQ(mf_metrics_write(m, &s), MF_OK);
  mf_metrics_close(m);
  EXPECT_EQ(Lines(file).size(), 1u);

  // A file that is only a half line is emptied on resume.
  {
    std::ofstream f(file, std::ios::binary | std::ios::trunc);
    f << "{\"step\":1,\"lo";
  }
  ASSERT_EQ(mf_metrics_open(dir.c_str(), 1, &m), MF_OK);
  mf_metrics_close(m);
  EXPECT_EQ(ReadText(file), "");
}

TEST(Metrics, RewindDropsRepeatedSteps) {
  std::string dir = TmpPath("run_c");
  std::string file = dir + "/metrics.jsonl";
  mf_metrics *m = nullptr;
  ASSERT_EQ(mf_metrics_open(dir.c_str(), 0, &m), MF_OK);
  for (int i = 1; i <= 10; i++) {
    mf_step_metrics s = Step(i);
    ASSERT_EQ(mf_metrics_write(m, &s), MF_OK);
  }
  mf_metrics_close(m);
  {
    std::ofstream f(file, std::ios::binary | std::ios::app);
    f << "# a note someone added\n";
  }

  // The run resumes from its checkpoint of step 6.
  ASSERT_EQ(mf_metrics_open(dir.c_str(), 1, &m), MF_OK);
  ASSERT_EQ(mf_metrics_rewind(m, 6), MF_OK) << mf_last_error();
  for (int i = 7; i <= 8; i++) {
    mf_step_metrics s = Step(i);
    ASSERT_EQ(mf_metrics_write(m, &s), MF_OK) << mf_last_error();
  }
  ASSERT_EQ(mf_metrics_rewind(m, 100), MF_OK);  // nothing to drop
  mf_metrics_close(m);

  std::vector<std::string> lines = Lines(file);
  ASSERT_EQ(lines.size(), 9u);
  EXPECT_EQ(lines[6], "# a note someone added");
  std::vector<int> steps;
  for (const auto &l : lines) {
    if (l[0] == '#') continue;
    json_t *j = Parse(l);
    ASSERT_NE(j, nullptr);
    steps.push_back((int)json_integer_value(json_object_get(j, "step")));
    json_decref(j);
  }
  EXPECT_EQ(steps, (std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8}));
  struct stat sb;
  EXPECT_NE(stat((file + ".tmp").c_str(), &sb), 0) << "the temporary file is gone";
}

TEST(Metrics, OpenErrorsNameThePath) {
  // A directory path through a regular file cannot be created.
  std::string blocker = TmpPath("blocker");
  {
    std::ofstream f(blocker);
    f << "x";
  }
  std::string dir = blocker + "/sub";
  mf_metrics *m = reinterpret_cast<mf_metrics *>(0x1);
  EXPECT_EQ(mf_metrics_open(dir.c_str(), 0, &m), MF_ERR_IO);
  EXPECT_EQ(m, nullptr);
  EXPECT_NE(std::string(mf_last_error()).find(dir), std::string::npos) << mf_last_error();
  EXPECT_EQ(mf_metrics_open(blocker.c_str(), 0, &m), MF_ERR_IO);
  EXPECT_NE(std::string(mf_last_error()).find("not a directory"), std::string::npos) << mf_last_error();
  EXPECT_EQ(mf_metrics_open("", 0, &m), MF_ERR_INVALID_ARG);
  mf_metrics_close(nullptr);
}

// Step 40 of 300 as the progress tests print it, at step_s seconds a step.
mf_step_metrics Step40(double step_s) {
  mf_step_metrics s;
  mf_step_metrics_init(&s);
  s.step = 40;
  s.loss = 2.34121;
  s.aux_loss = 2.01041;
  s.lr = 2.6666e-3;
  s.grad_norm = 0.51234;
  s.tokens_per_s = 12301.5;
  s.step_s = step_s;
  s.elapsed_s = 40 * step_s;
  return s;
}

TEST(Progress, Format) {
  mf_step_metrics s = Step40(0.35);  // 260 steps left × 0.35 s = 91 s
  char buf[256];
  size_t n = mf_progress_format(buf, sizeof buf, &s, 300, 1);
  EXPECT_EQ(n, strlen(buf));
  EXPECT_STREQ(buf, "step   40/300  loss 2.3412  aux 2.0104  lr 2.67e-03  |g| 0.512  12.3K tok/s  eta 1m31s");

  // Without step_s the ETA comes from the mean step time so far.
  s.step_s = NAN;
  s.elapsed_s = 40 * 10.0;  // 260 × 10 s = 43 min 20 s
  mf_progress_format(buf, sizeof buf, &s, 300, 1);
  EXPECT_NE(std::string(buf).find("eta 43m20s"), std::string::npos) << buf;
  s.elapsed_s = 40 * 100.0;  // 26000 s
  mf_progress_format(buf, sizeof buf, &s, 300, 1);
  EXPECT_NE(std::string(buf).find("eta 7h13m"), std::string::npos) << buf;

  // Rates, eval loss, skipped steps, the last step and no total.
  s.tokens_per_s = 950;
  s.eval_loss = 1.9;
  s.skipped = 1;
  s.step = 300;
  mf_progress_format(buf, sizeof buf, &s, 300, 1);
  EXPECT_STREQ(
      buf,
      "step  300/300  loss 2.3412  aux 2.0104  eval 1.9000  lr 2.67e-03  |g| 0.512  950 tok/s  eta 0s"
      "  SKIPPED (non-finite gradients)");
  s.tokens_per_s = 2.5e6;
  s.skipped = 0;
  s.eval_loss = NAN;
  s.step = 7;
  mf_progress_format(buf, sizeof buf, &s, 0, 1);
  EXPECT_STREQ(buf, "step 7  loss 2.3412  aux 2.0104  lr 2.67e-03  |g| 0.512  2.50M tok/s");

  // A NaN loss prints as nan; an unknown rate as "-"; a cut line stays a C string.
  s.loss = NAN;
  s.tokens_per_s = NAN;
  mf_progress_format(buf, sizeof buf, &s, 10, 1);
  EXPECT_NE(std::string(buf).find("loss nan"), std::string::npos) << buf;
  EXPECT_NE(std::string(buf).find("- tok/s"), std::string::npos) << buf;
  char small[10];
  size_t need = mf_progress_format(small, sizeof small, &s, 10, 1);
  EXPECT_GT(need, sizeof small);
  EXPECT_EQ(strlen(small), sizeof small - 1);
}

TEST(Progress, Streams) {
  mf_step_metrics s = Step40(0.04);
  s.busy_s[0] = 0.0312, s.busy_s[1] = 0.0006, s.busy_s[2] = 0.0002;
  s.h2d_bytes = 1824768;        // 1.74 MiB
  s.d2h_bytes = 1803264;        // 1.72 MiB
  s.peak_device_bytes = 14145536;  // 13.49 MiB
  char buf[512];
  mf_progress_format(buf, sizeof buf, &s, 300, 1);
  EXPECT_STREQ(buf,
               "step   40/300  loss 2.3412  aux 2.0104  lr 2.67e-03  |g| 0.512  12.3K tok/s  eta 10s"
               "  busy c 78% up 2% dn 0%  io 1.74 MiB/1.72 MiB  peak 13.49 MiB");
  // Small and large byte counts; the optimizer's overlap when it is reported.
  s.h2d_bytes = 512;
  s.d2h_bytes = 3.5 * 1024;
  s.peak_device_bytes = 2.5 * 1024 * 1024 * 1024;
  s.optimizer_hidden_s = 0.012;
  s.optimizer_exposed_s = 0.003;
  mf_progress_format(buf, sizeof buf, &s, 300, 1);
  EXPECT_NE(std::string(buf).find("io 512 B/3.50 KiB  peak 2.50 GiB  opt hidden 12.0ms exposed 3.0ms"),
            std::string::npos)
      << buf;
  // Where %.3g of K showed "1.01e+03K" (1010 KiB) the units move up.
  s.h2d_bytes = 1010 * 1024;
  s.d2h_bytes = 997 * 1024;
  mf_progress_format(buf, sizeof buf, &s, 300, 1);
  EXPECT_NE(std::string(buf).find("io 1010.00 KiB/997.00 KiB"), std::string::npos) << buf;
  s.h2d_bytes = 1048575;  // 1023.999 KiB
  mf_progress_format(buf, sizeof buf, &s, 300, 1);
  EXPECT_NE(std::string(buf).find("io 1.00 MiB/"), std::string::npos) << buf;
  EXPECT_EQ(std::string(buf).find("e+"), std::string::npos) << buf;
  EXPECT_EQ(std::string(buf).find("staging"), std::string::npos) << "not staged: " << buf;
  // With the copies staged: the host's share of the step filling and draining slabs.
  s.step_s = 0.5;
  s.staging_fill_s = 0.05;
  s.staging_drain_s = 0.025;
  mf_progress_format(buf, sizeof buf, &s, 300, 1);
  EXPECT_NE(std::string(buf).find("  staging in 10% out 5%"), std::string::npos) << buf;
  // Not measured (a backend without stream timing): no busy part.
  mf_step_metrics_init(&s);
  s.step = 1;
  s.step_s = 0.04;
  mf_progress_format(buf, sizeof buf, &s, 300, 1);
  EXPECT_EQ(std::string(buf).find("busy"), std::string::npos) << buf;
  EXPECT_EQ(std::string(buf).find("peak"), std::string::npos) << buf;
}

// The loss and aux of a progress line are the window's means and say so when
// the window holds more than one step; one step's are shown as they are.
TEST(Progress, WindowMeans) {
  mf_step_metrics s = Step40(0.35);
  s.window_steps = 10;
  s.window_loss = s.loss;
  s.window_aux_loss = s.aux_loss;
  s.loss = 2.5;  // the step's own
  s.aux_loss = 2.25;
  char buf[256];
  mf_progress_format(buf, sizeof buf, &s, 300, 1);
  EXPECT_STREQ(buf,
               "step   40/300  loss 2.3412  aux 2.0104 (mean of 10 steps)  lr 2.67e-03  |g| 0.512  12.3K tok/s"
               "  eta 1m31s");
  s.window_steps = 1;
  s.window_loss = 2.5;
  s.window_aux_loss = 2.25;
  mf_progress_format(buf, sizeof buf, &s, 300, 1);
  EXPECT_STREQ(buf, "step   40/300  loss 2.5000  aux 2.2500  lr 2.67e-03  |g| 0.512  12.3K tok/s  eta 1m31s");
}

// The default progress line (issue 27): step, loss, eval, lr, tok/s and the
// ETA in about 100 columns; the router's loss, |g| and the stream figures
// only with --verbose (metrics.jsonl keeps them all).
TEST(Progress, CompactByDefault) {
  mf_step_metrics s = Step40(0.35);
  s.window_steps = 10;
  s.window_loss = s.loss;
  s.window_aux_loss = s.aux_loss;
  s.busy_s[0] = 0.3, s.busy_s[1] = 0.01, s.busy_s[2] = 0.01;
  s.host_submit_s = 0.34;
  s.h2d_bytes = 1824768;
  s.d2h_bytes = 1803264;
  s.peak_device_bytes = 14145536;
  s.optimizer_exposed_s = 0.003;
  s.staging_fill_s = 0.05;
  s.staging_drain_s = 0.025;
  char buf[512];
  size_t n = mf_progress_format(buf, sizeof buf, &s, 300, 0);
  EXPECT_EQ(n, strlen(buf));
  EXPECT_STREQ(buf, "step   40/300  loss 2.3412 (mean of 10 steps)  lr 2.67e-03  12.3K tok/s  eta 1m31s");
  s.eval_loss = 2.1003;
  mf_progress_format(buf, sizeof buf, &s, 300, 0);
  EXPECT_STREQ(
      buf, "step   40/300  loss 2.3412 (mean of 10 steps)  eval 2.1003  lr 2.67e-03  12.3K tok/s  eta 1m31s");
  // A long run: five-digit steps, a window of 100, hours left: still within 100 columns.
  s.step = 12340;
  s.window_steps = 100;
  s.tokens_per_s = 123456;
  mf_progress_format(buf, sizeof buf, &s, 99999, 0);
  EXPECT_LE(strlen(buf), 100u) << buf;
  EXPECT_NE(std::string(buf).find("eta 8h31m"), std::string::npos) << buf;  // 87659 steps x 0.35 s
  // The verbose line has the rest, the compact one none of it.
  for (const char *part : {"aux ", "|g|", "busy c", "host ", "io ", "peak ", "opt hidden", "staging in"})
    EXPECT_EQ(std::string(buf).find(part), std::string::npos) << part << " in " << buf;
  mf_progress_format(buf, sizeof buf, &s, 99999, 1);
  for (const char *part : {"aux ", "|g|", "busy c", "host ", "io ", "peak ", "opt hidden", "staging in"})
    EXPECT_NE(std::string(buf).find(part), std::string::npos) << part << " not in " << buf;
  // A skipped step says so in both.
  s.skipped = 1;
  mf_progress_format(buf, sizeof buf, &s, 99999, 0);
  EXPECT_NE(std::string(buf).find("  SKIPPED (non-finite gradients)"), std::string::npos) << buf;
}

// metrics.jsonl read back: every field of a written line; a resumed run's
// lines past its checkpoint dropped and the resume kept; a step written again
// counts once, the later line; a half-written line counted, not read.
TEST(MetricsRead, ReadsWhatWasWrittenAndFollowsResumes) {
  const std::string dir = TmpPath("metrics_read");
  mf_metrics *m = nullptr;
  ASSERT_EQ(mf_metrics_open(dir.c_str(), 0, &m), MF_OK) << mf_last_error();
  for (int step = 1; step <= 6; step++) {
    mf_step_metrics s = Step40(0.25);
    s.step = step;
    s.loss = 10.0 - step;
    s.window_steps = 1;
    s.window_loss = s.loss;
    s.tokens = step * 1024;
    s.busy_s[1] = 0.125;
    s.h2d_bytes = 1824768;
    if (step == 3) s.eval_loss = 5.5, s.skipped = 1;
    ASSERT_EQ(mf_metrics_write(m, &s), MF_OK);
  }
  mf_metrics_close(m);
  // Resumed from the checkpoint of step 4 (without a rewind: steps 5 and 6 again).
  ASSERT_EQ(mf_metrics_open(dir.c_str(), 1, &m), MF_OK);
  ASSERT_EQ(mf_metrics_write_resume(m, (dir + "/checkpoints/step-000004").c_str(), 4), MF_OK);
  for (int step = 5; step <= 7; step++) {
    mf_step_metrics s = Step40(0.25);
    s.step = step;
    s.loss = 100.0 + step;
    ASSERT_EQ(mf_metrics_write(m, &s), MF_OK);
  }
  mf_step_metrics again = Step40(0.25);
  again.step = 7;
  again.loss = 77;
  ASSERT_EQ(mf_metrics_write(m, &again), MF_OK);  // step 7 again: the later line counts
  mf_metrics_close(m);
  {
    std::ofstream f(dir + "/metrics.jsonl", std::ios::app);
    f << "{\"step\":8,\"loss\":1.2";  // a run killed mid-write
  }
  mf_metrics_log log;
  ASSERT_EQ(mf_metrics_read((dir + "/metrics.jsonl").c_str(), &log), MF_OK) << mf_last_error();
  ASSERT_EQ(log.n, 7u);
  const int steps[7] = {1, 2, 3, 4, 5, 6, 7};
  const double losses[7] = {9, 8, 7, 6, 105, 106, 77};
  for (int i = 0; i < 7; i++) {
    EXPECT_EQ(log.lines[i].step, steps[i]);
    EXPECT_EQ(log.lines[i].loss, losses[i]) << "step " << steps[i];
  }
  EXPECT_EQ(log.lines[2].eval_loss, 5.5);
  EXPECT_TRUE(log.lines[2].skipped);
  EXPECT_TRUE(std::isnan(log.lines[1].eval_loss));
  EXPECT_EQ(log.lines[1].tokens, 2048);
  EXPECT_EQ(log.lines[1].window_steps, 1);
  EXPECT_EQ(log.lines[1].busy_s[1], 0.125);
  EXPECT_EQ(log.lines[1].h2d_bytes, 1824768.0);
  EXPECT_EQ(log.lines[1].step_s, 0.25);
  EXPECT_EQ(log.lines[1].lr, 2.6666e-3);
  ASSERT_EQ(log.n_resumes, 1u);
  EXPECT_EQ(log.resumes[0].step, 4);
  EXPECT_EQ(std::string(log.resumes[0].from), dir + "/checkpoints/step-000004");
  EXPECT_EQ(log.unread, 1u);
  EXPECT_EQ(log.first_unread, 12u);  // 6 step lines, the resume line, 4 step lines, then it
  mf_metrics_log_free(&log);
  mf_metrics_log_free(&log);  // twice is fine

  mf_metrics_log none;
  EXPECT_EQ(mf_metrics_read((dir + "/missing.jsonl").c_str(), &none), MF_ERR_IO);
  EXPECT_NE(std::string(mf_last_error()).find("missing.jsonl"), std::string::npos) << mf_last_error();
  mf_metrics_log_free(&none);
}

// An evaluation under way: windows done of all, the share, the time so far
// and the ETA at the pace so far; the closing line without an ETA.
TEST(Progress, Evaluation) {
  char buf[256];
  size_t n = mf_eval_progress_format(buf, sizeof buf, "valid.tokens", 1200, 3326, 4.0);
  EXPECT_EQ(n, strlen(buf));
  // 2126 windows left at 300 windows/s: 7.09 s.
  EXPECT_STREQ(buf, "eval valid.tokens: 1200/3326 windows (36%), 4s, eta 7s");
  mf_eval_progress_format(buf, sizeof buf, "v", 10, 1000, 125.0);  // 990 x 12.5 s = 3 h 26 min
  EXPECT_STREQ(buf, "eval v: 10/1000 windows (1%), 2m05s, eta 3h26m");
  mf_eval_progress_format(buf, sizeof buf, "valid.tokens", 3326, 3326, 12.4);
  EXPECT_STREQ(buf, "eval valid.tokens: 3326/3326 windows (100%), 12s");
  mf_eval_progress_format(buf, sizeof buf, "v", 0, 8, 0.0);
  EXPECT_STREQ(buf, "eval v: 0/8 windows (0%), 0s");
  char small[12];
  size_t need = mf_eval_progress_format(small, sizeof small, "valid.tokens", 1, 2, 1.0);
  EXPECT_GT(need, sizeof small);
  EXPECT_EQ(strlen(small), sizeof small - 1);
}

}  // namespace
