// issue 13, item 3: errors that blame their cause, as a user meets them on the
// command line — the override that made two keys inconsistent, the model eval
// really runs, a file that is not safetensors, a tab in YAML, a fraction of a
// byte, a negative seed, and environment variables that were ignored in silence.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "tests/cli/cli_util.h"

namespace {

int count(const std::string &s, const std::string &what) {
  int n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) n++;
  return n;
}

// "configs/demo.yaml:L:C" for the line of `key:` indented by `indent` in the
// demo config, read from the file so that an edit of its comments does not
// break the test.
std::string demo_place(const std::string &key, int indent) {
  const std::string want = std::string(indent, ' ') + key + ":";
  std::ifstream f("configs/demo.yaml");
  std::string line;
  for (int n = 1; std::getline(f, line); n++)
    if (line.rfind(want, 0) == 0)
      return "configs/demo.yaml:" + std::to_string(n) + ":" + std::to_string(indent + 1);
  ADD_FAILURE() << "no '" << want << "' in configs/demo.yaml";
  return "?";
}

// A byte-level token file of n tokens (moefit data bytes).
std::string tokens_file(const std::string &name, size_t n) {
  const std::string text = tmpdir() + "/" + name + ".txt", toks = tmpdir() + "/" + name + ".tokens";
  std::string corpus;
  while (corpus.size() < n) corpus += "the quick brown fox jumps over the lazy dog\n";
  corpus.resize(n);
  write_file(text, corpus);
  Result r = moefit("data bytes " + text + " " + toks);
  EXPECT_EQ(r.code, 0) << r.out;
  return toks;
}

// Runs moefit with one environment variable set.
Result moefit_env(const char *name, const char *value, const std::string &args) {
  setenv(name, value, 1);
  Result r = moefit(args);
  unsetenv(name);
  return r;
}

TEST(Errors, CrossKeyErrorNamesTheOverrideAndTheFileLine) {
  Result r = moefit("config configs/demo.yaml train.steps=20");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("error: command line: train.steps=20: train.warmup (30) must be <= train.steps (20); "
                       "train.warmup is set at " +
                       demo_place("warmup", 2)),
            std::string::npos)
      << r.out;
  Result e = moefit("config configs/demo.yaml train=");
  EXPECT_EQ(e.code, 1) << e.out;
  EXPECT_NE(e.out.find("error: command line: train=: missing required key 'train.steps'"), std::string::npos)
      << e.out;
}

// train.lora is read and checked, but training adapters is not built yet:
// plan and train say so, naming the key's place, before anything is written.
// train.lora: plan shows the adapters and the frozen base; what is not built
// yet (adapters on the hot experts only) is refused naming the key's place.
TEST(Errors, LoraIsPlannedAndItsUnbuiltPartsRefused) {
  Result p = moefit("plan configs/demo.yaml train.lora.rank=16 train.lora.targets=[q_proj,w1]");
  EXPECT_EQ(p.code, 0) << p.out;
  EXPECT_NE(p.out.find("LoRA rank 16, alpha 16 (scale 1) on q_proj, w1: 36 adapters on 18 weights; "),
            std::string::npos)
      << p.out;
  EXPECT_NE(p.out.find("the base's 452K frozen"), std::string::npos) << p.out;
  EXPECT_NE(p.out.find("optimizer: "), std::string::npos) << p.out;
  EXPECT_EQ(p.out.find(" 101 "), std::string::npos) << "the frozen base is counted as optimized:\n" << p.out;
  // Hot experts need measured routing: without it, refused naming the key and the way to get it.
  Result h = moefit(
      "plan configs/demo.yaml train.lora.rank=16 train.lora.targets=[q_proj,w1] train.lora.experts=hot "
      "memory.routing=none");
  EXPECT_EQ(h.code, 1) << h.out;
  EXPECT_NE(h.out.find("error: train.lora.experts: hot (command line: train.lora.experts=hot) takes each "
                       "layer's most-routed experts by measured routing, and there is none"),
            std::string::npos)
      << h.out;
  EXPECT_NE(h.out.find("point memory.routing at the routing.json a run on this model wrote"),
            std::string::npos)
      << h.out;
  Result c = moefit("config configs/demo.yaml train.lora.rank=16 train.lora.targets=[q_proj,w1]");
  EXPECT_EQ(c.code, 0) << c.out;
  EXPECT_NE(c.out.find("targets: [q_proj, w1]"), std::string::npos) << c.out;
}

// --model DIR is the model eval runs: data.seq_len is checked against DIR's
// config.json (max_position_embeddings 4096 for an `init` preset), not against
// the config's model.init.max_seq (128 in the demo).
TEST(Errors, EvalChecksSeqLenAgainstTheModelItRuns) {
  const std::string dir = tmpdir() + "/m4k";
  Result init = moefit("init --family mixtral --preset tiny --out " + dir);
  ASSERT_EQ(init.code, 0) << init.out;
  const std::string toks = tokens_file("long", 9000);
  const std::string common = " --tokens " + toks +
                             " train.micro_batch=1 memory.device_budget=auto output.dir=" + tmpdir() +
                             "/no-run";
  Result ok = moefit("eval configs/demo.yaml --model " + dir + common + " data.seq_len=4096");
  EXPECT_EQ(ok.code, 0) << ok.out;
  EXPECT_NE(ok.out.find("(8192 tokens in 2 sequences)"), std::string::npos) << ok.out;
  Result over = moefit("eval configs/demo.yaml --model " + dir + common + " data.seq_len=8192");
  EXPECT_EQ(over.code, 1) << over.out;
  EXPECT_NE(
      over.out.find("command line: data.seq_len=8192: data.seq_len (8192) exceeds max_position_embeddings "
                    "(4096) in " +
                    dir + "/config.json"),
      std::string::npos)
      << over.out;
  // without --model the config's model.init is the one run, and named with its place
  Result init_model = moefit("eval configs/demo.yaml" + common + " data.seq_len=4096");
  EXPECT_EQ(init_model.code, 1) << init_model.out;
  EXPECT_NE(init_model.out.find("data.seq_len (4096) exceeds model.init.max_seq (128; set at " +
                                demo_place("max_seq", 4) + ")"),
            std::string::npos)
      << init_model.out;
}

TEST(Errors, InspectSaysWhatAFileIsWhenItIsNotSafetensors) {
  Result yaml = moefit("inspect configs/demo.yaml");
  EXPECT_EQ(yaml.code, 1) << yaml.out;
  EXPECT_NE(yaml.out.find("configs/demo.yaml: not a safetensors file: it is YAML text"), std::string::npos)
      << yaml.out;
  EXPECT_EQ(yaml.out.find("exceeds the"), std::string::npos) << yaml.out;  // no absurd header length

  const std::string d = tmpdir();
  write_file(d + "/weights.bin", "{\"a\": 1}\n");
  Result json = moefit("inspect " + d + "/weights.bin");
  EXPECT_EQ(json.code, 1) << json.out;
  EXPECT_NE(json.out.find("not a safetensors file: it is JSON text (it begins \"{\"a\": 1}\")"),
            std::string::npos)
      << json.out;
  write_file(d + "/notes.safetensors", "these are my notes about the model, not weights\n");
  Result text = moefit("inspect " + d + "/notes.safetensors");
  EXPECT_NE(text.out.find("not a safetensors file: it is text"), std::string::npos) << text.out;
  write_file(d + "/k.safetensors", "key: value\n");
  EXPECT_NE(moefit("inspect " + d + "/k.safetensors").out.find("it is YAML text"), std::string::npos);

  const std::string model = d + "/qwen";
  ASSERT_EQ(moefit("init --family qwen3_moe --preset tiny --out " + model).code, 0);
  Result cj = moefit("inspect " + model + "/config.json");
  EXPECT_EQ(cj.code, 1) << cj.out;
  EXPECT_NE(cj.out.find(model + "/config.json: a Hugging Face model config.json (model_type qwen3_moe), not "
                                "safetensors weights or their index"),
            std::string::npos)
      << cj.out;
  EXPECT_NE(cj.out.find("open the model directory, " + model + ", instead"), std::string::npos) << cj.out;
  EXPECT_EQ(moefit("inspect " + model).code, 0);  // which works
  write_file(d + "/other.json", "{\"vocab\": {}}");
  Result other = moefit("inspect " + d + "/other.json");
  EXPECT_NE(other.out.find("no \"weight_map\" key: not a safetensors index"), std::string::npos) << other.out;
}

TEST(Errors, TabIndentationInAConfig) {
  const std::string path = tmpdir() + "/tab.yaml";
  write_file(path, "model:\n\tinit: {family: mixtral}\n");
  Result r = moefit("config " + path);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find(path + ":2:1: YAML syntax error: tabs are not allowed for indentation in YAML"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("cannot start any token"), std::string::npos) << r.out;
}

TEST(Errors, FractionalSizeSaysWhy) {
  Result r = moefit("config configs/demo.yaml memory.device_budget=1.3MiB");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(
      r.out.find("memory.device_budget must be a whole number of bytes (got '1.3MiB' = 1363148.8 bytes): "
                 "write e.g. 1331KiB or 1363148"),
      std::string::npos)
      << r.out;
  EXPECT_EQ(moefit("config configs/demo.yaml memory.device_budget=1331KiB").code, 0);
}

// strtoull alone reads "-1" as 2^64 - 1: every seed that is not digits is refused.
TEST(Errors, InitRefusesSeedsThatAreNotNonNegativeIntegers) {
  const std::string out = tmpdir() + "/seeded";
  for (const char *bad : {"-1", "' 7'", "+7", "1e3", "7x", "''", "18446744073709551616"}) {
    Result r = moefit(std::string("init --family mixtral --out ") + out + " --seed " + bad);
    EXPECT_EQ(r.code, 2) << bad << ": " << r.out;
    EXPECT_NE(r.out.find("--seed must be an integer from 0 to 18446744073709551615"), std::string::npos)
        << bad << ": " << r.out;
    EXPECT_NE(access(out.c_str(), F_OK), 0) << bad << ": nothing is written";
  }
  Result max = moefit("init --family mixtral --out " + out + " --seed 18446744073709551615");
  EXPECT_EQ(max.code, 0) << max.out;
  EXPECT_NE(max.out.find("seed 18446744073709551615"), std::string::npos) << max.out;
}

// MF_LOG and MF_THREADS with values moefit cannot use are said once, with the
// variable, the value and what is accepted, and the run goes on with the default.
TEST(Errors, BadEnvironmentVariablesWarnOnce) {
  const std::string toks = tokens_file("env", 4000);
  const std::string eval = "eval configs/demo.yaml --tokens " + toks + " output.dir=" + tmpdir() + "/no-run";
  Result log = moefit_env("MF_LOG", "bogus", eval);
  EXPECT_EQ(log.code, 0) << log.out;
  EXPECT_EQ(count(log.out,
                  "MF_LOG='bogus' is not a log level (error, warn, info, debug or trace): logging at info"),
            1)
      << log.out;
  EXPECT_NE(log.out.find("perplexity"), std::string::npos) << log.out;
  Result fail =
      moefit_env("MF_LOG", "verbose", "config " + tmpdir() + "/none.yaml");  // a failure consults it too
  EXPECT_EQ(count(fail.out, "MF_LOG='verbose' is not a log level"), 1) << fail.out;
  Result quiet = moefit_env("MF_LOG", "bogus", "config configs/demo.yaml");  // a command that logs nothing
  EXPECT_EQ(quiet.code, 0) << quiet.out;
  EXPECT_EQ(count(quiet.out, "MF_LOG='bogus' is not a log level"), 1) << quiet.out;

  Result thr = moefit_env("MF_THREADS", "abc", eval);
  EXPECT_EQ(thr.code, 0) << thr.out;
  EXPECT_EQ(count(thr.out,
                  "MF_THREADS='abc' is not a number of threads (a whole number from 1 to 1024): using the "),
            1)
      << thr.out;
  Result zero = moefit_env("MF_THREADS", "0", eval);
  EXPECT_EQ(count(zero.out, "MF_THREADS='0' is not a number of threads"), 1) << zero.out;
  Result simd = moefit_env("MF_CPU_SIMD", "avx9", eval);  // read at every attention call: said once
  EXPECT_EQ(simd.code, 0) << simd.out;
  EXPECT_EQ(count(simd.out, "MF_CPU_SIMD='avx9' is not one of base: ignored"), 1) << simd.out;
  Result scoring = moefit_env("MF_PLAN_SCORING", "fast", "plan configs/demo.yaml");
  EXPECT_EQ(count(scoring.out, "MF_PLAN_SCORING='fast' is not one of exact|proxy: ignored"), 1) << scoring.out;
  Result good = moefit_env("MF_THREADS", "2", eval);
  EXPECT_EQ(good.code, 0) << good.out;
  EXPECT_EQ(good.out.find("MF_THREADS"), std::string::npos) << good.out;
}

}  // namespace
