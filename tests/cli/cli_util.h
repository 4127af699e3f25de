// Running the real `moefit` binary from a test (it lies in the runfiles'
// root, where Bazel runs the test): exit status, signal and output.
#ifndef MF_TESTS_CLI_UTIL_H
#define MF_TESTS_CLI_UTIL_H

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <string>
#include <vector>

namespace {

struct Result {
  int code;    // exit status; -1 when killed by a signal
  int signal;  // the signal, or 0
  std::string out;
};

inline std::string tmpdir() {
  const char *t = getenv("TEST_TMPDIR");
  return t ? t : "/tmp";
}

// A shell command line's result (its stderr too when it says 2>&1).
inline Result shell(const std::string &cmd) {
  Result r{0, 0, ""};
  FILE *p = popen(cmd.c_str(), "r");
  if (!p) return Result{-1, 0, "popen failed"};
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int st = pclose(p);
  if (WIFEXITED(st)) {
    r.code = WEXITSTATUS(st);
  } else {
    r.code = -1;
    r.signal = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
  }
  return r;
}

inline Result moefit(const std::string &args) { return shell("./moefit " + args + " 2>&1"); }

inline void write_file(const std::string &path, const std::string &bytes) {
  std::ofstream f(path, std::ios::binary);
  f << bytes;
}

inline std::string read_file(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// A token file of numbered text lines (about `bytes` long) made by `moefit
// data bytes` under TEST_TMPDIR as NAME.tokens; once per test binary and name.
inline std::string text_tokens(const std::string &name, size_t bytes) {
  const std::string text = tmpdir() + "/" + name + ".txt", toks = tmpdir() + "/" + name + ".tokens";
  if (std::ifstream(toks).good()) return toks;
  std::string s;
  for (int i = 0; s.size() < bytes; i++) s += "line " + std::to_string(i) + ": the quick brown fox\n";
  write_file(text, s);
  Result r = moefit("data bytes " + text + " " + toks + " 2>&1");
  if (r.code != 0) fprintf(stderr, "moefit data bytes failed:\n%s\n", r.out.c_str());
  return toks;
}

// step -> loss of the step lines of dir/metrics.jsonl.
// What a run left as its final weights: final/model.safetensors, or a LoRA
// run's adapters (final/ is a PEFT adapter dir).
inline std::string final_weights(const std::string &dir) {
  const std::string m = read_file(dir + "/final/model.safetensors");
  return m.empty() ? read_file(dir + "/final/adapter_model.safetensors") : m;
}

inline std::map<int, std::string> step_losses(const std::string &dir) {
  std::map<int, std::string> m;
  const std::string text = read_file(dir + "/metrics.jsonl");
  size_t at = 0;
  while ((at = text.find("{\"step\":", at)) != std::string::npos) {
    const int step = std::stoi(text.substr(at + 8));
    const size_t l = text.find("\"loss\":", at) + 7;
    m[step] = text.substr(l, text.find(',', l) - l);
    at = l;
  }
  return m;
}

// The steps whose progress line ("step  9/12  loss ...") a train command's
// output holds, in order: with train.log_every=1 every step the process
// trained, and nothing else (a resume's lines start after its checkpoint).
inline std::vector<int> trained_steps(const std::string &out) {
  static const std::regex line("(^|\n)step +([0-9]+)/[0-9]+ ");
  std::vector<int> v;
  for (std::sregex_iterator it(out.begin(), out.end(), line), end; it != end; ++it)
    v.push_back(std::stoi((*it)[2]));
  return v;
}

// first, first + 1, ..., last.
inline std::vector<int> step_range(int first, int last) {
  std::vector<int> v;
  for (int s = first; s <= last; s++) v.push_back(s);
  return v;
}

// TEST_TMPDIR/NAME, removed first.
inline std::string fresh_dir(const std::string &name) {
  const std::string d = tmpdir() + "/" + name;
  shell("rm -rf " + d);
  return d;
}

// A shell command (`exec ./moefit ...`, or mpirun's) running in the
// background with `env` added to its environment, its stdout and stderr read
// as they come; Signal() goes to the process the command execs.
class Background {
 public:
  Background(const std::string &command, const std::vector<std::string> &env = {}) {
    int p[2];
    if (pipe(p) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(p[1], 1);
      dup2(p[1], 2);
      close(p[0]);
      close(p[1]);
      for (const std::string &e : env) putenv(const_cast<char *>(e.c_str()));
      execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char *>(nullptr));
      _exit(127);
    }
    close(p[1]);
    fd_ = p[0];
  }
  ~Background() {
    if (pid_ > 0 && !done_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (fd_ >= 0) close(fd_);
  }
  Background(const Background &) = delete;
  Background &operator=(const Background &) = delete;
  // Reads until the output from `from` on matches re (true), or it ends or
  // timeout_s passes (false).
  bool WaitFor(const std::regex &re, size_t from = 0, double timeout_s = 120) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    for (;;) {
      if (std::regex_search(out_.begin() + static_cast<long>(std::min(from, out_.size())), out_.end(), re)) return true;
      if (eof_ || std::chrono::steady_clock::now() > end) return false;
      Read(50);
    }
  }
  void Signal(int sig) { kill(pid_, sig); }
  // Waits for the exit: the status (-1 when a signal ended it, then *sig).
  int Finish(int *sig = nullptr) {
    while (!eof_) Read(1000);
    int st = 0;
    waitpid(pid_, &st, 0);
    done_ = true;
    if (sig) *sig = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  }
  const std::string &out() const { return out_; }

 private:
  void Read(int ms) {
    pollfd pf = {fd_, POLLIN, 0};
    if (poll(&pf, 1, ms) <= 0) return;
    char buf[4096];
    const ssize_t n = read(fd_, buf, sizeof buf);
    if (n <= 0)
      eof_ = true;
    else
      out_.append(buf, static_cast<size_t>(n));
  }
  pid_t pid_ = -1;
  int fd_ = -1;
  bool eof_ = false, done_ = false;
  std::string out_;
};

}  // namespace

// Wall-clock seconds (the multi-rank tests time how fast a job ends).
inline double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// `moefit train` of the demo shortened, as the multi-rank tests run it: 32-token
// sequences of 2 from `corpus`, `steps` steps, every step logged, into out.
inline std::string short_demo_args(const std::string &corpus, const std::string &out, const std::string &extra,
                                   int steps) {
  return "train configs/demo.yaml hardware.profile=configs/hw/cpu-2core.yaml data.valid=null data.seq_len=32 "
         "train.micro_batch=2 train.warmup=2 train.log_every=1 train.steps=" +
         std::to_string(steps) + " data.train=" + corpus + " output.dir=" + out + " " + extra;
}

// `mpirun -np N ./moefit ARGS` as the multi-rank tests run it, env (NAME=VALUE ...) passed to every rank;
// ./moefit_test (the test build, src/core/env.h) when env has a test-only hook.
inline Result Mpirun(int n, const std::string &args, const std::string &env = "") {
  const bool hook = env.find("MF_INJECT_FAIL") != std::string::npos || env.find("MF_TEST_") != std::string::npos;
  const std::string vader = tmpdir() + "/vader";
  shell("mkdir -p " + vader);
  std::string x;
  size_t at = 0;
  while (at < env.size()) {
    size_t e = env.find(' ', at);
    if (e == std::string::npos) e = env.size();
    const std::string kv = env.substr(at, e - at);
    if (!kv.empty()) x += " -x " + kv;
    at = e + 1;
  }
  // Under ASan: Open MPI keeps allocations until exit; tests/lsan.supp names
  // its libraries, which match only with full stacks and its plugins still
  // loaded at exit.
  const std::string lsan =
      "LSAN_OPTIONS=\"$LSAN_OPTIONS${LSAN_OPTIONS:+:}fast_unwind_on_malloc=0\" "
      "OMPI_MCA_mca_base_component_disable_dlclose=1 ";
  return shell(
      lsan + "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TMPDIR=" + tmpdir() + " mpirun -np " +
      std::to_string(n) +
      " --oversubscribe --mca pml ob1 --mca btl self,vader --mca btl_vader_single_copy_mechanism none "
      "--mca btl_vader_backing_directory " +
      vader + " -x LSAN_OPTIONS -x OMPI_MCA_mca_base_component_disable_dlclose" + x +
      (hook ? " ./moefit_test " : " ./moefit ") + args +
      " 2>&1");
}

// `moefit plan TRAIN_ARGS --ranks N --json` (train_args starting "train ")
// writes what rank 0 of `mpirun -np N moefit train TRAIN_ARGS` writes to
// out/plan.json, byte for byte (plan first: a run's routing.json in the output
// dir would make plan price the copies by the measured routing). Returns plan's
// output.
// One rank's run (args_one, into `one`) against `mpirun -np n` (args_many, env
// as Mpirun takes it, into `many`): both succeed, and the n ranks' final
// weights and each of their `steps` losses are the one rank's, bit for bit.
// The n ranks' result, for the caller's own checks of its output.
inline Result ExpectRanksGiveOneRanksBits(int n, const std::string &one, const std::string &args_one,
                                          const std::string &many, const std::string &args_many,
                                          const std::string &env, int steps) {
  Result r1 = moefit(args_one);
  EXPECT_EQ(r1.code, 0) << r1.out;
  Result rn = Mpirun(n, args_many, env);
  EXPECT_EQ(rn.code, 0) << rn.out;
  EXPECT_FALSE(final_weights(one).empty());
  EXPECT_EQ(final_weights(one), final_weights(many)) << "final weights differ\n" << rn.out;
  const auto l1 = step_losses(one), ln = step_losses(many);
  EXPECT_EQ(ln.size(), (size_t)steps) << rn.out;
  for (int s = 1; s <= steps && l1.count(s) && ln.count(s); s++)
    EXPECT_EQ(l1.at(s), ln.at(s)) << "step " << s;
  return rn;
}

inline std::string ExpectPlanIsWhatTrainRuns(int n, const std::string &train_args, const std::string &out,
                                             const std::string &json) {
  Result rp = moefit("plan" + train_args.substr(5) + " --ranks " + std::to_string(n) + " --json " + json);
  EXPECT_EQ(rp.code, 0) << rp.out;
  Result rt = Mpirun(n, train_args);
  EXPECT_EQ(rt.code, 0) << rt.out;
  EXPECT_TRUE(read_file(json) == read_file(out + "/plan.json")) << "diff " << json << " " << out << "/plan.json";
  return rp.out;
}

#endif  // MF_TESTS_CLI_UTIL_H
