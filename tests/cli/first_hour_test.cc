// A newcomer's first hour with the real `moefit` binary (issue 13): a routing
// file left by another model's run breaks no command; `moefit plan` exits 1
// for a plan that cannot run, and no row says "fits" past a limit; `train`
// refuses such a plan, and a model this machine cannot hold, before it
// allocates anything large.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "tests/cli/cli_util.h"

namespace {

bool has(const std::string &text, const std::string &part) {
  return text.find(part) != std::string::npos;
}

bool exists(const std::string &path) {
  return access(path.c_str(), F_OK) == 0;
}

// How many lines of text contain part.
int lines_with(const std::string &text, const std::string &part) {
  std::istringstream in(text);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) n += has(line, part);
  return n;
}

std::string last_line(const std::string &text) {
  std::string t = text;
  while (!t.empty() && t.back() == '\n') t.pop_back();
  const size_t nl = t.rfind('\n');
  return nl == std::string::npos ? t : t.substr(nl + 1);
}

// Byte-level token files of `n` lines of text (the demo's seq_len of 128
// needs 129 tokens; the mixtral default of 256 a few hundred).
std::string tokens(const std::string &name, int n) {
  const std::string text = tmpdir() + "/" + name + ".txt", toks = tmpdir() + "/" + name + ".tokens";
  if (exists(toks)) return toks;
  std::string corpus;
  for (int i = 0; i < n; i++)
    corpus += "a newcomer reads the readme and runs the demo, line " + std::to_string(i) + "\n";
  write_file(text, corpus);
  Result r = moefit("data bytes " + text + " " + toks);
  EXPECT_EQ(r.code, 0) << r.out;
  return toks;
}

// The demo config on files of the test's own (it reads runs/demo/data).
std::string demo_data(const std::string &out) {
  return " data.train=" + tokens("first_hour_train", 400) + " data.valid=" + tokens("first_hour_valid", 60) +
         " output.dir=" + out;
}

// The acceptance scenario of issue 13, item 1: the demo, then a 3-layer run
// planned with the demo's routing file (copied into its own output directory:
// train refuses a directory that holds a run), then the unchanged demo
// config's plan and eval; a model of another family evaluated with the demo
// config.
TEST(FirstHour, ARoutingFileOfAnotherModelBreaksNoCommand) {
  const std::string first = tmpdir() + "/first_hour_demo";
  Result demo = moefit("train configs/demo.yaml train.steps=3 train.warmup=1" + demo_data(first));
  ASSERT_EQ(demo.code, 0) << demo.out;
  ASSERT_TRUE(has(read_file(first + "/routing.json"), "\"layers\": 2")) << "the demo measured its routing";
  const std::string out = tmpdir() + "/first_hour_l3", common = demo_data(out);
  shell("mkdir -p " + out + " && cp " + first + "/routing.json " + out + "/routing.json");

  Result l3 = moefit("train configs/demo.yaml model.init.layers=3 train.steps=3 train.warmup=1" + common);
  EXPECT_EQ(l3.code, 0) << l3.out;
  EXPECT_EQ(lines_with(l3.out, "planning with uniform routing"), 1) << "one info line, not one per plan:\n"
                                                                    << l3.out;
  EXPECT_TRUE(
      has(l3.out, "routing: " + out +
                      "/routing.json: model.layers: the routing was measured on a model with layers 2, the "
                      "model has 3; planning with uniform routing"))
      << l3.out;
  EXPECT_TRUE(has(read_file(out + "/routing.json"), "\"layers\": 3")) << "train rewrites it for its model";

  // The unchanged (2-layer) demo config against the 3-layer routing file.
  Result plan = moefit("plan configs/demo.yaml" + common);
  EXPECT_EQ(plan.code, 0) << plan.out;
  EXPECT_EQ(lines_with(plan.out, "planning with uniform routing"), 1) << plan.out;
  EXPECT_TRUE(has(plan.out, "measured on a model with layers 3, the model has 2")) << plan.out;
  // eval evaluates the run's final weights (the 3-layer model: its routing).
  Result eval = moefit("eval configs/demo.yaml" + common);
  EXPECT_EQ(eval.code, 0) << eval.out;
  EXPECT_TRUE(has(eval.out, "perplexity")) << eval.out;
  EXPECT_TRUE(has(eval.out, out + "/final has layers 3, the config's model.init 2: it is the model a run left"))
      << eval.out;
  // Another family's model with the demo config.
  const std::string qwen = tmpdir() + "/first_hour_qwen3";
  Result init = moefit("init --family qwen3_moe --preset tiny --out " + qwen);
  ASSERT_EQ(init.code, 0) << init.out;
  Result other = moefit("eval configs/demo.yaml --model " + qwen + common);
  EXPECT_EQ(other.code, 0) << other.out;
  EXPECT_EQ(lines_with(other.out,
                       "the routing was measured on family mixtral, the model is qwen3_moe; planning "
                       "with uniform routing"),
            1)
      << other.out;

  // A routing file named in memory.routing is this model's or an error that says what to do.
  Result named = moefit("plan configs/demo.yaml memory.routing=" + out + "/routing.json" + common);
  EXPECT_EQ(named.code, 1) << named.out;
  EXPECT_TRUE(has(named.out, "memory.routing: " + out + "/routing.json: model.layers:")) << named.out;
  EXPECT_TRUE(has(named.out, "set memory.routing=none")) << named.out;
}

// The rows of the plan table (the lines from "  chosen" to the blank line).
std::vector<std::string> table_rows(const std::string &text) {
  std::vector<std::string> rows;
  std::istringstream in(text);
  std::string line;
  bool on = false;
  while (std::getline(in, line)) {
    if (line.rfind("  chosen ", 0) == 0 || line.rfind("  memory.plan ", 0) == 0) on = true;
    if (on && line.empty()) break;
    if (on) rows.push_back(line);
  }
  return rows;
}

bool ends_with(const std::string &s, const std::string &end) {
  return s.size() >= end.size() && s.compare(s.size() - end.size(), end.size(), end) == 0;
}

// Issue 13, item 2: the exit status says whether the plan can run.
TEST(FirstHour, PlanExitsOneWhenThePlanCannotRun) {
  Result fits = moefit("plan configs/demo.yaml");
  EXPECT_EQ(fits.code, 0) << fits.out;
  const std::vector<std::string> ok_rows = table_rows(fits.out);
  ASSERT_EQ(ok_rows.size(), 6u) << fits.out;
  EXPECT_TRUE(ends_with(ok_rows[0], "  fits")) << ok_rows[0];
  EXPECT_FALSE(has(fits.out, "cannot run")) << fits.out;

  struct Case {
    const char *overrides, *label, *reason, *key;
  } cases[] = {
      {" memory.host_limit=1MiB", "over host_limit", "host memory: the plan needs", "memory.host_limit"},
      {" memory.staging=true memory.pinned_limit=1KiB", "over pinned_limit",
       "do not fit memory.pinned_limit 1.00 KiB", "memory.pinned_limit"},
  };
  for (const Case &c : cases) {
    SCOPED_TRACE(c.overrides);
    const std::string json = tmpdir() + "/first_hour_over.plan.json";
    unlink(json.c_str());
    Result r = moefit(std::string("plan configs/demo.yaml") + c.overrides + " --json " + json);
    EXPECT_EQ(r.code, 1) << r.out;
    const std::vector<std::string> rows = table_rows(r.out);
    ASSERT_EQ(rows.size(), 6u) << r.out;
    EXPECT_TRUE(ends_with(rows[0], c.label)) << rows[0];
    for (const std::string &row : rows) EXPECT_FALSE(ends_with(row, "fits")) << row;
    const std::string closing = last_line(r.out);
    EXPECT_EQ(closing.rfind("moefit plan: error: the plan cannot run: ", 0), 0u) << r.out;
    EXPECT_TRUE(has(closing, c.reason)) << closing;
    EXPECT_TRUE(has(closing, c.key)) << closing;
    EXPECT_TRUE(exists(json)) << "the plan is still written";

    // train refuses the same plan with the same reason, before the arena and the weights.
    const std::string out = tmpdir() + "/first_hour_refused";
    Result t = moefit(std::string("train configs/demo.yaml") + c.overrides + demo_data(out));
    EXPECT_EQ(t.code, 1) << t.out;
    const std::string why = closing.substr(closing.find("the plan cannot run: "));
    EXPECT_TRUE(has(t.out, "moefit train: error: " + why)) << why << "\n" << t.out;
    EXPECT_FALSE(exists(out + "/final"));
    EXPECT_FALSE(exists(out + "/metrics.jsonl"));
  }
  Result help = moefit("plan --help");
  EXPECT_TRUE(has(help.out, "Exit status: 0 when the chosen plan fits every limit")) << help.out;
}

// What a plan spills to NVMe must have a place: memory.nvme_dir existing (and
// with the room), else the plan cannot run here — moe-61x256 as written spills
// about 1 TiB to /nvme/moefit.
TEST(FirstHour, PlanSpillNeedsTheNvmeDirectory) {
  const std::string dir = tmpdir() + "/first_hour_nvme", missing = tmpdir() + "/first_hour_no_nvme";
  mkdir(dir.c_str(), 0755);
  const std::string spill = "plan configs/demo.yaml hardware.profile=configs/hw/h100-pcie.yaml memory.host_limit=4MiB";
  Result there = moefit(spill + " memory.nvme_dir=" + dir);
  EXPECT_EQ(there.code, 0) << there.out;
  EXPECT_TRUE(has(there.out, "NVMe spill")) << there.out;
  Result gone = moefit(spill + " memory.nvme_dir=" + missing);
  EXPECT_EQ(gone.code, 1) << gone.out;
  EXPECT_TRUE(ends_with(table_rows(gone.out)[0], "over nvme_dir")) << gone.out;
  EXPECT_TRUE(has(last_line(gone.out), "NVMe: the plan spills ")) << gone.out;
  EXPECT_TRUE(has(last_line(gone.out), missing + ", which does not exist")) << gone.out;

  Result big = moefit("plan tests/planner/data/moe-61x256.yaml");
  EXPECT_EQ(big.code, 1) << big.out;
  EXPECT_EQ(last_line(big.out).rfind("moefit plan: error: the plan cannot run: ", 0), 0u) << big.out;
  EXPECT_TRUE(has(last_line(big.out), "NVMe: the plan spills ")) << big.out;
}

// Limits this process's address space for the commands it runs (their
// children inherit it), so that a command that tries to allocate a large
// model fails instead of swapping. Not under ASan, which reserves terabytes
// of address space for its shadow memory.
struct AddressSpaceLimit {
  rlimit old{};
  bool set = false;
  explicit AddressSpaceLimit(uint64_t bytes) {
#if !defined(__SANITIZE_ADDRESS__)
    if (getrlimit(RLIMIT_AS, &old) != 0) return;
    rlimit lim = old;
    lim.rlim_cur = bytes;
    set = setrlimit(RLIMIT_AS, &lim) == 0;
#endif
  }
  ~AddressSpaceLimit() {
    if (set) setrlimit(RLIMIT_AS, &old);
  }
};

struct Env {
  std::string name;
  Env(const char *n, const char *v) : name(n) { setenv(n, v, 1); }
  ~Env() { unsetenv(name.c_str()); }
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Issue 13, item 4: "only three things required" — model.init {family:
// mixtral} is a full Mixtral-8x7B (46.7B parameters). train checks the config
// and the data, then the plan against its limits and this machine's memory,
// before it allocates anything large: each failure in a moment, under a 4 GiB
// address space, naming the figure and the key.
TEST(FirstHour, TheMinimalConfigIsNoTrap) {
  const std::string dir = tmpdir() + "/first_hour_minimal";
  mkdir(dir.c_str(), 0755);
  const std::string no_data = dir + "/no_data.yaml", with_data = dir + "/with_data.yaml";
  write_file(no_data, "model:\n  init: {family: mixtral}\ntrain:\n  steps: 10\n");
  write_file(with_data,
             "model:\n  init: {family: mixtral}\ndata:\n  train: " + tokens("first_hour_train", 400) +
                 "\ntrain:\n  steps: 10\noutput:\n  dir: " + dir + "/run\n");
  AddressSpaceLimit cap(4ull << 30);
  auto t0 = std::chrono::steady_clock::now();
  Result missing = moefit("train " + no_data);
  EXPECT_EQ(missing.code, 1) << missing.out;
  EXPECT_TRUE(has(missing.out, "missing required key 'data.train'")) << missing.out;
  EXPECT_LT(seconds_since(t0), 5.0);

  // Over the host limit (auto: the profile's host memory) with no NVMe.
  t0 = std::chrono::steady_clock::now();
  Result host = moefit("train " + with_data);
  EXPECT_EQ(host.code, 1) << host.out;
  EXPECT_TRUE(has(host.out, "moefit train: error: the plan cannot run: host memory: the plan needs "))
      << host.out;
  EXPECT_TRUE(
      has(host.out, "raise memory.host_limit, set memory.nvme_dir to spill to NVMe, or use a smaller model"))
      << host.out;
  EXPECT_FALSE(has(host.out, "cannot allocate")) << host.out;
  EXPECT_LT(seconds_since(t0), 10.0);

  // Within memory.host_limit, but not within this machine's memory.
  {
    Env machine("MF_HOST_MEMORY", "1GiB");
    t0 = std::chrono::steady_clock::now();
    Result ram = moefit("train " + with_data + " memory.host_limit=1000TiB");
    EXPECT_EQ(ram.code, 1) << ram.out;
    EXPECT_TRUE(has(ram.out, "moefit train: error: the plan cannot run: this machine: the plan keeps "))
        << ram.out;
    EXPECT_TRUE(has(ram.out,
                    "but it has 1.00 GiB available (MF_HOST_MEMORY): use a smaller model, or set "
                    "memory.host_limit below that with memory.nvme_dir"))
        << ram.out;
    EXPECT_FALSE(has(ram.out, "host memory: the plan needs")) << "within host_limit: " << ram.out;
    EXPECT_LT(seconds_since(t0), 10.0);
  }
  EXPECT_FALSE(exists(dir + "/run/final"));

  // The data files: each error names its key.
  Result yaml = moefit("train " + with_data + " data.train=" + with_data);
  EXPECT_EQ(yaml.code, 1) << yaml.out;
  EXPECT_TRUE(has(yaml.out, "moefit train: error: command line: data.train: " + with_data +
                                ": not a .tokens file: it is YAML text"))
      << yaml.out;
  Result valid = moefit("train " + with_data + " data.valid=" + dir + "/nope.tokens");
  EXPECT_EQ(valid.code, 1) << valid.out;
  EXPECT_TRUE(has(valid.out, "moefit train: error: command line: data.valid: " + dir +
                                 "/nope.tokens: No such file or directory"))
      << valid.out;
  Result vocab = moefit("train " + with_data + " model.init.vocab=100");
  EXPECT_EQ(vocab.code, 1) << vocab.out;
  EXPECT_TRUE(has(vocab.out, "data.train: " + tokens("first_hour_train", 400) +
                                 ": its vocabulary (256) is larger than the model's (100)"))
      << vocab.out;
}

}  // namespace
