// What `moefit train`, `eval`, `plan` and `init` print for people: evaluation
// progress and its time kept out of the training figures, the losses named
// for what they are, counts in human units and aligned tables.
#include <gtest/gtest.h>
#include <jansson.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "tests/cli/cli_util.h"

namespace {

std::vector<std::string> lines_of(const std::string &text) {
  std::vector<std::string> v;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) v.push_back(line);
  return v;
}

std::vector<std::string> lines_with(const std::string &text, const std::string &what) {
  std::vector<std::string> v;
  for (const std::string &l : lines_of(text))
    if (l.find(what) != std::string::npos) v.push_back(l);
  return v;
}

// moefit with MF_PROGRESS_EVERY set to `every` (nullptr: unset).
Result moefit_every(const std::string &args, const char *every) {
  if (every)
    setenv("MF_PROGRESS_EVERY", every, 1);
  else
    unsetenv("MF_PROGRESS_EVERY");
  Result r = moefit(args);
  unsetenv("MF_PROGRESS_EVERY");
  return r;
}

// A token file of `bytes` bytes of text, made by `moefit data bytes`.
std::string corpus(const std::string &name, size_t bytes) {
  const std::string text = tmpdir() + "/" + name + ".txt", toks = tmpdir() + "/" + name + ".tokens";
  std::string s;
  for (int i = 0; s.size() < bytes; i++) s += "line " + std::to_string(i) + ": the quick brown fox jumps over the lazy dog\n";
  s.resize(bytes);
  write_file(text, s);
  Result r = moefit("data bytes " + text + " " + toks);
  EXPECT_EQ(r.code, 0) << r.out;
  return toks;
}

// "12.3K tok/s" in a progress line -> 12300.
double rate_in(const std::string &line) {
  const size_t at = line.find(" tok/s");
  if (at == std::string::npos) return NAN;
  const size_t start = line.rfind(' ', at - 1) + 1;
  const std::string word = line.substr(start, at - start);
  char *end = nullptr;
  double v = strtod(word.c_str(), &end);
  if (*end == 'K') v *= 1e3;
  if (*end == 'M') v *= 1e6;
  return v;
}

struct Line {
  double tokens_per_s, step_s, eval_s, window_loss, loss;
  long long window_steps;
};

std::vector<Line> metrics(const std::string &path) {
  std::vector<Line> v;
  for (const std::string &l : lines_of(read_file(path))) {
    json_error_t err;
    json_t *j = json_loads(l.c_str(), 0, &err);
    EXPECT_NE(j, nullptr) << err.text << ": " << l;
    if (!j) continue;
    auto num = [&](const char *k) {
      json_t *x = json_object_get(j, k);
      return x && json_is_number(x) ? json_number_value(x) : NAN;
    };
    v.push_back({num("tokens_per_s"), num("step_s"), num("eval_s"), num("window_loss"), num("loss"),
                 (long long)num("window_steps")});
    json_decref(j);
  }
  return v;
}

// 300 validation windows against steps of one 32-token sequence: each
// evaluation takes about a hundred steps' time. It must not be counted in
// the steps' tokens/s, step_s (the ETA's) or the summary's tokens/s; it
// reports its own progress instead.
TEST(Output, EvaluationTimeIsNotTrainingTime) {
  const std::string train = corpus("train", 20000), valid = corpus("valid", 300 * 32 + 1);
  const std::string run = tmpdir() + "/run_eval";
  Result r = moefit(
      "train configs/demo.yaml hardware.profile=configs/hw/cpu-2core.yaml data.seq_len=32 train.micro_batch=1 "
      "train.steps=4 train.warmup=1 train.log_every=1 train.eval_every=2 data.train=" +
      train + " data.valid=" + valid + " output.dir=" + run);
  ASSERT_EQ(r.code, 0) << r.out;

  // metrics.jsonl: steps 1 and 3 did not evaluate, 2 and 4 did, for much longer than a step.
  std::vector<Line> m = metrics(run + "/metrics.jsonl");
  ASSERT_EQ(m.size(), 4u) << read_file(run + "/metrics.jsonl");
  EXPECT_TRUE(std::isnan(m[0].eval_s));
  EXPECT_TRUE(std::isnan(m[2].eval_s));
  // Each step here is 32 tokens and a few ms; the evaluation beside it about a
  // hundred steps' time. Had the evaluation been counted in the step (the bug:
  // ~100x slower steps), a step's time would exceed its evaluation's and its
  // rate would be at most 32 / (step + eval). The bounds leave a factor of 3 to
  // 5 for a loaded machine (a 2-core CI runner once gave a 45 ms step between
  // 5 ms ones, 11x: a ratio to another step's time is noise, not the bug).
  const double tokens = 32;
  for (int i : {1, 3}) {
    EXPECT_LT(m[i].step_s, 0.2 * m[i].eval_s) << "step " << i + 1 << " counts its evaluation";
    EXPECT_GT(m[i].tokens_per_s, 3 * tokens / (m[i].step_s + m[i].eval_s)) << "step " << i + 1;
  }
  // The progress lines say the same.
  std::vector<std::string> steps = lines_with(r.out, " tok/s");
  ASSERT_EQ(steps.size(), 4u) << r.out;
  EXPECT_NE(steps[3].find("step  4/4"), std::string::npos) << steps[3];
  for (int i : {1, 3})
    EXPECT_GT(rate_in(steps[i]), 3 * tokens / (m[i].step_s + m[i].eval_s)) << steps[i];
  // The summary: training, evaluation and checkpoint time apart.
  std::vector<std::string> done = lines_with(r.out, "done: 4 steps in ");
  ASSERT_EQ(done.size(), 1u) << r.out;
  EXPECT_NE(done[0].find(" s of training ("), std::string::npos) << done[0];
  EXPECT_NE(done[0].find(" s of evaluation"), std::string::npos) << done[0];
  EXPECT_NE(done[0].find(" s of checkpoints; "), std::string::npos) << done[0];
  const double train_s = strtod(done[0].c_str() + strlen("done: 4 steps in "), nullptr);
  const double eval_s = strtod(done[0].c_str() + done[0].find(" + ") + 3, nullptr);
  EXPECT_GT(eval_s, train_s) << done[0];
}

// A long evaluation shows how far it is (windows done of all, ETA), at most
// every MF_PROGRESS_EVERY seconds (0: every batch), and says when it is done;
// a short one (the default 2 s) prints nothing. In training and in `moefit eval`.
TEST(Output, LongEvaluationShowsProgress) {
  const std::string train = corpus("train_p", 8000), valid = corpus("valid_p", 40 * 32 + 1);
  const std::string data = " configs/demo.yaml hardware.profile=configs/hw/cpu-2core.yaml data.seq_len=32 "
                           "train.micro_batch=4 data.train=" + train + " data.valid=" + valid + " output.dir=";
  const std::string what = "eval " + valid + ": ";
  for (const char *every : {"0", static_cast<const char *>(nullptr)}) {
    // A run dir each: train refuses one that holds a run.
    const std::string common = data + tmpdir() + "/run_progress_" + (every ? "0" : "default");
    Result tr = moefit_every("train" + common + " train.steps=2 train.warmup=1", every);
    ASSERT_EQ(tr.code, 0) << tr.out;
    Result ev = moefit_every("eval" + common, every);
    ASSERT_EQ(ev.code, 0) << ev.out;
    for (const Result *r : {&tr, &ev}) {
      std::vector<std::string> p = lines_with(r->out, what);
      if (!every) {
        EXPECT_TRUE(p.empty()) << "a short evaluation prints no progress:\n" << r->out;
        continue;
      }
      // 10 batches of 4 windows: a line after each, the last one the closing line.
      ASSERT_EQ(p.size(), 10u) << r->out;
      EXPECT_EQ(p[0].rfind(what + "4/40 windows (10%), ", 0), 0u) << p[0];
      EXPECT_NE(p[0].find(", eta "), std::string::npos) << p[0];
      EXPECT_EQ(p[8].rfind(what + "36/40 windows (90%), ", 0), 0u) << p[8];
      EXPECT_EQ(p[9].rfind(what + "40/40 windows (100%), ", 0), 0u) << p[9];
      EXPECT_EQ(p[9].find("eta"), std::string::npos) << p[9];
    }
  }
  Result bad = moefit_every("eval" + data + tmpdir() + "/run_progress_0", "soon");
  EXPECT_EQ(bad.code, 0) << bad.out;
  EXPECT_NE(bad.out.find("MF_PROGRESS_EVERY='soon' is not a number of seconds"), std::string::npos) << bad.out;
}

// The step lines' loss is the mean over the steps since the previous line
// and says so; metrics.jsonl keeps the step's loss and that mean apart; the
// summary says which losses it compares (and keeps "loss A -> B", which
// tools/gpu_check.sh reads).
TEST(Output, LossesSayWhatTheyAre) {
  const std::string train = corpus("train_l", 20000);
  const std::string run = tmpdir() + "/run_loss";
  Result r = moefit(
      "train configs/demo.yaml hardware.profile=configs/hw/cpu-2core.yaml data.seq_len=32 train.micro_batch=2 "
      "train.steps=7 train.warmup=1 train.log_every=3 data.valid=null data.train=" +
      train + " output.dir=" + run);
  ASSERT_EQ(r.code, 0) << r.out;
  std::vector<std::string> steps = lines_with(r.out, " tok/s");
  ASSERT_EQ(steps.size(), 4u) << r.out;  // steps 1, 3, 6, 7
  EXPECT_EQ(steps[0].find("mean of"), std::string::npos) << steps[0];
  EXPECT_NE(steps[1].find("(mean of 2 steps)"), std::string::npos) << steps[1];
  EXPECT_NE(steps[2].find("(mean of 3 steps)"), std::string::npos) << steps[2];
  EXPECT_EQ(steps[3].find("mean of"), std::string::npos) << steps[3];
  std::vector<Line> m = metrics(run + "/metrics.jsonl");
  ASSERT_EQ(m.size(), 4u);
  const long long want[4] = {1, 2, 3, 1};
  for (int i = 0; i < 4; i++) EXPECT_EQ(m[i].window_steps, want[i]) << i;
  EXPECT_EQ(m[0].window_loss, m[0].loss);
  EXPECT_EQ(m[3].window_loss, m[3].loss);
  EXPECT_NE(m[2].window_loss, m[2].loss) << "the mean of three steps is not the last one's";
  std::vector<std::string> done = lines_with(r.out, "done: ");
  ASSERT_EQ(done.size(), 1u) << r.out;
  EXPECT_TRUE(std::regex_search(done[0], std::regex("; train loss [0-9.]+ -> [0-9.]+ nats/token \\(step 1 -> step 7\\); ")))
      << done[0];
  EXPECT_EQ(done[0].find(" of evaluation"), std::string::npos) << "no data.valid: " << done[0];
}

// "452K" -> 452000, "75.5B" -> 7.55e10 (mf_format_count's units); NaN when not a count.
double count_value(const std::string &word) {
  char *end = nullptr;
  double v = strtod(word.c_str(), &end);
  if (end == word.c_str()) return NAN;
  const std::string unit(end);
  const double scale = unit == "" ? 1 : unit == "K" ? 1e3 : unit == "M" ? 1e6 : unit == "B" ? 1e9 : unit == "T" ? 1e12 : NAN;
  return v * scale;
}

// The word before `what` in `text`, e.g. the count before " parameters".
std::string word_before(const std::string &text, const std::string &what) {
  const size_t at = text.find(what);
  if (at == std::string::npos || at == 0) return "";
  const size_t start = text.find_last_of(" (", at - 1);
  return text.substr(start == std::string::npos ? 0 : start + 1, at - (start == std::string::npos ? 0 : start + 1));
}

// Where each whitespace-separated word of `line` ends (one past its last character).
std::vector<size_t> word_ends(const std::string &line) {
  std::vector<size_t> v;
  for (size_t i = 0; i < line.size(); i++)
    if (line[i] != ' ' && (i + 1 == line.size() || line[i + 1] == ' ')) v.push_back(i + 1);
  return v;
}

// The per-layer table: under each count column's header, every row's number
// ends where the header word ends (right-aligned to the widest value).
void expect_layer_table_aligned(const std::string &out) {
  const std::vector<std::string> lines = lines_of(out);
  size_t h = 0;
  while (h < lines.size() && lines[h].rfind("per layer:", 0) != 0) h++;
  h += 2;  // the title, the column groups, the header
  ASSERT_LT(h, lines.size()) << "no per-layer table:\n" << out;
  std::vector<size_t> ends = word_ends(lines[h]);  // resident streamed device streamed optimizer kept ...
  ASSERT_EQ(ends.size(), 8u) << lines[h];
  ends.erase(ends.begin() + 4);  // the optimizer's words are left-aligned
  const std::string &head = lines[h];
  int rows = 0;
  ASSERT_EQ(lines[h + 1].rfind("  embed/head ", 0), 0u) << lines[h + 1];
  for (size_t i = h + 2; i < lines.size() && lines[i].rfind("  layer ", 0) == 0; i++, rows++) {
    std::vector<size_t> we = word_ends(lines[i]);
    // "layer", "N", four counts, the optimizer word(s), three counts.
    ASSERT_GE(we.size(), 9u) << lines[i];
    for (int k = 0; k < 4; k++) EXPECT_EQ(we[2 + k], ends[k]) << "column " << k << " of\n" << head << "\n" << lines[i];
    for (int k = 0; k < 3; k++)
      EXPECT_EQ(we[we.size() - 3 + k], ends[4 + k]) << "activation column " << k << " of\n" << head << "\n" << lines[i];
  }
  EXPECT_GT(rows, 1) << out;
}

// Counts in human units (three significant digits, K/M/B/T), never "e+":
// the plan header, init, inspect and train's start line agree with the exact
// count inspect reads from the safetensors file.
TEST(Output, ReadableNumbers) {
  const std::string dir = tmpdir() + "/tiny";
  Result init = moefit("init --family mixtral --preset tiny --out " + dir);
  ASSERT_EQ(init.code, 0) << init.out;
  Result ins = moefit("inspect " + dir);
  ASSERT_EQ(ins.code, 0) << ins.out;
  // "total: 65 tensors, 452K parameters (451904), ..."
  const size_t at = ins.out.find(" parameters (");
  ASSERT_NE(at, std::string::npos) << ins.out;
  const double exact = strtod(ins.out.c_str() + at + strlen(" parameters ("), nullptr);
  ASSERT_GT(exact, 1000) << ins.out;
  Result plan = moefit("plan configs/demo.yaml hardware.profile=configs/hw/cpu-2core.yaml");
  ASSERT_EQ(plan.code, 0) << plan.out;
  for (const Result *r : {&init, &ins, &plan}) {
    const std::string w = word_before(r->out, " parameters");
    EXPECT_NEAR(count_value(w), exact, 0.005 * exact) << "'" << w << "' in:\n" << r->out;
    EXPECT_EQ(r->out.find("e+"), std::string::npos) << r->out;
  }
  expect_layer_table_aligned(plan.out);

  // Mixtral-8x7B: "46.7B parameters", not "4.67e+04M" (transformers counts
  // 46,702,792,704 for mistralai/Mixtral-8x7B-v0.1).
  Result big = moefit("plan tests/planner/data/mixtral-8x7b.yaml");
  const std::string head = lines_of(big.out).at(0);
  EXPECT_EQ(head.find("e+"), std::string::npos) << head;
  EXPECT_EQ(word_before(head, " parameters"), "46.7B") << head;
  const double total = count_value(word_before(head, " parameters")), active = count_value(word_before(head, " active"));
  EXPECT_NEAR(total, 46702792704.0, 0.005 * 46702792704.0) << head;
  EXPECT_GT(active, 1e10) << head;
  EXPECT_LT(active, total) << head;
  expect_layer_table_aligned(big.out);
  const std::string opt = lines_with(big.out, "optimizer: ").at(0);
  EXPECT_EQ(opt.find("e+"), std::string::npos) << opt;
}

}  // namespace
