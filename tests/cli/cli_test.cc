// The `moefit` command end to end: help, subcommands not built yet, config
// errors, and `inspect` on malformed files — a clean message and exit status 1,
// never a signal or a sanitizer report.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "src/core/core.h"
#include "src/io/safetensors.h"
#include "src/io/tokens.h"
#include "tests/cli/cli_util.h"

namespace {

std::string u64le(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; i++) s[i] = (char)((v >> (8 * i)) & 0xff);
  return s;
}

std::string safetensors_bytes(const std::string &header, const std::string &data) {
  return u64le(header.size()) + header + data;
}

const char *const kCommands[] = {"train", "plan", "eval", "init", "data",
                                 "config", "inspect", "profile", "export", "bench"};

TEST(Cli, HelpListsEverySubcommand) {
  Result r = moefit("--help");
  EXPECT_EQ(r.code, 0);
  for (const char *c : kCommands) EXPECT_NE(r.out.find(std::string("  ") + c + " "), std::string::npos) << c;
  Result none = moefit("");
  EXPECT_EQ(none.code, 2);
  Result bad = moefit("frobnicate");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.out.find("unknown command 'frobnicate'"), std::string::npos);
}

TEST(Cli, EverySubcommandHasHelp) {
  for (const char *c : kCommands) {
    Result r = moefit(std::string(c) + " --help");
    EXPECT_EQ(r.code, 0) << c << ": " << r.out;
    EXPECT_NE(r.out.find("usage: moefit"), std::string::npos) << c << ": " << r.out;
  }
}

TEST(Cli, UnbuiltSubcommandsSaySoAndFail) {
  for (const char *c : {"bench transfer"}) {
    Result r = moefit(c);
    EXPECT_EQ(r.code, 1) << c;
    EXPECT_NE(r.out.find("not built yet"), std::string::npos) << c << ": " << r.out;
  }
  Result unknown = moefit("bench frobnicate");
  EXPECT_EQ(unknown.code, 2) << unknown.out;
}

// The top-level help says which commands are not built yet, as each command does.
TEST(Cli, HelpSaysWhatIsNotBuilt) {
  Result help = moefit("--help");
  for (const char *c : {"bench"}) {
    const size_t at = help.out.find(std::string("\n  ") + c + " ");
    ASSERT_NE(at, std::string::npos) << c;
    const std::string line = help.out.substr(at + 1, help.out.find('\n', at + 1) - at - 1);
    EXPECT_NE(line.find("not built yet"), std::string::npos) << line;
  }
}

// Every long option takes its value after '=' too, for every command.
TEST(Cli, LongOptionsTakeEquals) {
  const std::string json = tmpdir() + "/eq-plan.json", svg = tmpdir() + "/eq-plan.svg";
  Result plan = moefit("plan configs/demo.yaml hardware.profile=configs/hw/cpu-2core.yaml --json=" + json +
                       " --svg=" + svg + " --tensor=model.norm.weight");
  EXPECT_EQ(plan.code, 0) << plan.out;
  EXPECT_EQ(access(json.c_str(), R_OK), 0) << plan.out;
  EXPECT_EQ(access(svg.c_str(), R_OK), 0) << plan.out;
  EXPECT_NE(plan.out.find("tensors matching model.norm.weight"), std::string::npos) << plan.out;
  const std::string in = tmpdir() + "/eq-in.txt", tok = tmpdir() + "/eq.tokens", valid = tmpdir() + "/eq-v.tokens";
  write_file(in, "one\n%\ntwo\n%\nthree\n%\nfour\n");
  Result data = moefit("data bytes " + in + " " + tok + " --split-on=% --valid-fraction=0.25 --valid-out=" + valid);
  EXPECT_EQ(data.code, 0) << data.out;
  EXPECT_NE(data.out.find("4 documents"), std::string::npos) << data.out;
  Result unknown = moefit("plan configs/demo.yaml --frobnicate=1");
  EXPECT_EQ(unknown.code, 2) << unknown.out;
  EXPECT_NE(unknown.out.find("unknown option '--frobnicate'"), std::string::npos) << unknown.out;
}

// --tensor with a weight's name shows the weight, its optimizer and its
// gradient (named grad.NAME); a pattern that matches nothing shows what names
// look like.
TEST(Cli, PlanTensorShowsAWeightsGradient) {
  Result r = moefit("plan configs/demo.yaml hardware.profile=configs/hw/cpu-2core.yaml --tensor "
                    "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("\n  model.layers.0.self_attn.q_proj.weight "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("its optimizer"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\n  grad.model.layers.0.self_attn.q_proj.weight "), std::string::npos) << r.out;
  Result none = moefit("plan configs/demo.yaml hardware.profile=configs/hw/cpu-2core.yaml --tensor 'model.layers.*.nothing*'");
  EXPECT_EQ(none.code, 0) << none.out;
  EXPECT_NE(none.out.find("names look like 'model."), std::string::npos) << none.out;
}

// hardware.profile auto without a profile measured here says whose rates the
// plan uses and how to measure this machine's.
TEST(Cli, AutoProfileSaysItIsBundled) {
  Result r = moefit("plan configs/demo.yaml");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("hardware.profile auto: configs/hw/cpu-2core.yaml, bundled with moefit"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("`moefit profile` measures this one"), std::string::npos) << r.out;
  Result named = moefit("plan configs/demo.yaml hardware.profile=configs/hw/cpu-2core.yaml");
  EXPECT_EQ(named.out.find("bundled with moefit"), std::string::npos) << named.out;
}

TEST(Cli, TrainEvalInitAndInspect) {
  std::string dir = tmpdir();
  std::string text = dir + "/corpus.txt";
  std::string toks = dir + "/corpus.tokens";
  std::string corpus;
  for (int i = 0; i < 200; i++) corpus += "the quick brown fox jumps over the lazy dog\n";
  write_file(text, corpus);
  ASSERT_EQ(moefit("data bytes " + text + " " + toks).code, 0);
  const std::string run = dir + "/run";
  const std::string common = " data.train=" + toks + " data.valid=null output.dir=" + run;
  Result r = moefit("train configs/demo.yaml train.steps=3 train.warmup=1 train.log_every=1" + common);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("unigram entropy"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("step  3/3"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("done: 3 steps"), std::string::npos) << r.out;
  EXPECT_EQ(access((run + "/metrics.jsonl").c_str(), R_OK), 0);
  EXPECT_EQ(access((run + "/final/model.safetensors").c_str(), R_OK), 0);

  Result e = moefit("eval configs/demo.yaml --tokens " + toks + common + " --dump-logits " + dir + "/logits.bin");
  EXPECT_EQ(e.code, 0) << e.out;
  EXPECT_NE(e.out.find("perplexity"), std::string::npos) << e.out;
  EXPECT_NE(e.out.find(run + "/final"), std::string::npos) << "eval should use the trained weights: " << e.out;
  std::ifstream logits(dir + "/logits.bin", std::ios::binary | std::ios::ate);
  EXPECT_EQ((long long)logits.tellg(), 128LL * 256 * 4);  // [seq_len, vocab] float32

  // eval and plan need no train.steps or data.train: a config with the model alone.
  const std::string model_only = dir + "/model_only.yaml";
  write_file(model_only, "model:\n  init: {family: mixtral, hidden: 64, layers: 2, heads: 4, kv_heads: 2, experts: 8, "
                         "top_k: 2, expert_ffn: 128, vocab: 256, max_seq: 128}\ndata: {seq_len: 128}\noutput: {dir: " +
                         run + "}\n");
  Result me = moefit("eval " + model_only + " --tokens " + toks);
  EXPECT_EQ(me.code, 0) << me.out;
  EXPECT_NE(me.out.find("perplexity"), std::string::npos) << me.out;
  Result mp = moefit("plan " + model_only);
  EXPECT_EQ(mp.code, 0) << mp.out;
  Result mn = moefit("eval " + model_only);
  EXPECT_EQ(mn.code, 1) << mn.out;
  EXPECT_NE(mn.out.find("give --tokens FILE, data.valid or data.train"), std::string::npos) << mn.out;
  Result mt = moefit("train " + model_only);
  EXPECT_EQ(mt.code, 1) << mt.out;
  EXPECT_NE(mt.out.find("missing required key 'data.train'"), std::string::npos) << mt.out;

  Result missing = moefit("train configs/demo.yaml data.train=" + dir + "/nope.tokens data.valid=null");
  EXPECT_EQ(missing.code, 1);
  EXPECT_NE(missing.out.find("nope.tokens"), std::string::npos) << missing.out;

  Result init = moefit("init --family qwen2_moe --preset tiny --out " + dir + "/qwen --seed 3");
  EXPECT_EQ(init.code, 0) << init.out;
  // A whole HF model dir: the byte-level tokenizer beside the weights, its 259
  // ids within the tiny preset's vocab (tests/model/hf_tokenizer_test: the files).
  EXPECT_NE(read_file(dir + "/qwen/config.json").find("\"vocab_size\": 272"), std::string::npos);
  EXPECT_NE(read_file(dir + "/qwen/tokenizer.json").find("\"<|im_end|>\""), std::string::npos);
  EXPECT_NE(read_file(dir + "/qwen/tokenizer_config.json").find("\"chat_template\""), std::string::npos);
  EXPECT_NE(read_file(dir + "/qwen/special_tokens_map.json").find("\"eos_token\""), std::string::npos);
  Result ins = moefit("inspect " + dir + "/qwen");
  EXPECT_EQ(ins.code, 0) << ins.out;
  EXPECT_NE(ins.out.find("model.layers.1.mlp.shared_expert_gate.weight"), std::string::npos) << ins.out;
  Result bad = moefit("init --family gpt2 --out " + dir + "/x");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.out.find("gpt2"), std::string::npos) << bad.out;
}

TEST(Cli, ProfileAndPlan) {
  const std::string out = tmpdir() + "/hw.yaml";
  Result prof = moefit("profile --quick --out " + out);
  EXPECT_EQ(prof.code, 0) << prof.out;
  EXPECT_EQ(access(out.c_str(), R_OK), 0);
  // --backend cuda: tests/cli/profile_cuda_test.cc

  const std::string json = tmpdir() + "/plan.json";
  Result plan = moefit("plan configs/demo.yaml hardware.profile=" + out + " --json " + json +
                       " --tensor 'model.layers.1.self_attn.*'");
  EXPECT_EQ(plan.code, 0) << plan.out;
  for (const char *want : {"chosen", "all resident", "ZeRO-Offload-like", "MegaTrain-like", "checkpoint every layer",
                           "per layer", "self_attn.q_proj.weight", "plan written to"})
    EXPECT_NE(plan.out.find(want), std::string::npos) << want << "\n" << plan.out;
  EXPECT_EQ(access(json.c_str(), R_OK), 0);
  Result small = moefit("plan configs/demo.yaml hardware.profile=" + out + " memory.device_budget=64KiB");
  EXPECT_EQ(small.code, 1);
  EXPECT_NE(small.out.find("below the minimum"), std::string::npos) << small.out;
}

// profile --config opens the config's run as train does, up to its table
// (src/train/run.h): a model.path config is timed on its shape (before, only
// model.init configs could be), with train.lora's adapters in the step.
TEST(Cli, ProfileConfigTimesTheRunsStep) {
  const std::string dir = tmpdir(), text = dir + "/prof.txt", toks = dir + "/prof.tokens";
  std::string corpus;
  for (int i = 0; i < 200; i++) corpus += "hello world " + std::to_string(i) + "\n";
  write_file(text, corpus);
  ASSERT_EQ(moefit("data bytes " + text + " " + toks).code, 0);
  int64_t calls[2] = {0, 0};
  for (int lora = 0; lora < 2; lora++) {
    const std::string cfg = dir + "/prof" + std::to_string(lora) + ".yaml";
    write_file(cfg, "model: {path: tests/fixtures/mixtral}\ndata: {train: " + toks +
                        ", seq_len: 16}\ntrain: {micro_batch: 2, steps: 1" + (lora ? ", lora: {rank: 4}" : "") +
                        "}\nbackend: cpu\n");
    const std::string hw = dir + "/prof" + std::to_string(lora) + ".hw.yaml";
    Result r = moefit("profile --quick --config " + cfg + " --out " + hw);
    ASSERT_EQ(r.code, 0) << r.out;
    const std::string prof = read_file(hw), what = "compute.kernels: the ";
    const size_t at = prof.find(what);
    ASSERT_NE(at, std::string::npos) << prof;
    calls[lora] = std::stoll(prof.substr(at + what.size()));  // "the N compute calls of one training step"
  }
  EXPECT_GT(calls[0], 0);
  // LoRA's step: no weight gradients for the frozen base, the adapters' GEMMs
  EXPECT_NE(calls[1], calls[0]) << "profile timed the full step for a LoRA config";
}

// The optimizer on the device through memory.overrides: shown in the summary,
// the per-layer table and --tensor (with the other placement priced), written
// to the plan file and read back; an impossible override is a clean error
// naming its place.
TEST(Cli, PlanOptimizerOnTheDevice) {
  const std::string dir = tmpdir(), json = dir + "/optim.plan.json", svg = dir + "/optim.svg";
  const std::string common =
      "plan configs/demo.yaml hardware.profile=configs/hw/cpu-2core.yaml "
      "memory.device_budget=1GiB ";
  // Every optimizer at home but layer 1's, whatever the baseline decided.
  Result r = moefit(common +
                    "memory.plan=resident 'memory.overrides=[{match: \"*\", optimizer: host}, "
                    "{match: \"model.layers.1.*\", optimizer: device}]'"
                    " --tensor 'model.layers.1.self_attn.q_proj.weight' --json " +
                    json + " --svg " + svg);
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char *want : {"parameters (", "updated on the device", "of AdamW state (fp32 moments)",
                           "  offloaded  recomputed", "its optimizer", "device     host "})
    EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;
  // The table: layer 1 on the device, layer 0 and the rest at home.
  const size_t l1 = r.out.find("\n  layer 1 "), l0 = r.out.find("\n  layer 0 ");
  ASSERT_NE(l1, std::string::npos) << r.out;
  ASSERT_NE(l0, std::string::npos) << r.out;
  const std::string row1 = r.out.substr(l1, r.out.find('\n', l1 + 1) - l1);
  const std::string row0 = r.out.substr(l0, r.out.find('\n', l0 + 1) - l0);
  EXPECT_NE(row1.find(" device "), std::string::npos) << row1;
  EXPECT_NE(row0.find(" host "), std::string::npos) << row0;
  std::ifstream jf(json);
  std::string text((std::istreambuf_iterator<char>(jf)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("\"optimizer\": \"device\""), std::string::npos);
  EXPECT_NE(text.find("\"version\": 6"), std::string::npos);
  std::ifstream sf(svg);
  std::string pic((std::istreambuf_iterator<char>(sf)), std::istreambuf_iterator<char>());
  EXPECT_NE(pic.find("id=\"optim-begin\""), std::string::npos);
  // The same summary from the plan file.
  const size_t at = r.out.find("\noptimizer: ");
  ASSERT_NE(at, std::string::npos) << r.out;
  const std::string summary = r.out.substr(at, r.out.find('\n', at + 1) - at);
  Result back = moefit(common + "memory.plan=" + json);
  ASSERT_EQ(back.code, 0) << back.out;
  EXPECT_NE(back.out.find(summary), std::string::npos) << summary << "\n" << back.out;

  Result bad = moefit(
      common + "'memory.overrides=[{match: \"model.layers.1.*\", params: stream, optimizer: device}]'");
  EXPECT_EQ(bad.code, 1) << bad.out;
  EXPECT_NE(bad.out.find("command line: memory.overrides="), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("memory.overrides[0]: optimizer: device needs the weights resident"),
            std::string::npos)
      << bad.out;
  EXPECT_EQ(bad.out.find("Sanitizer"), std::string::npos) << bad.out;
}

TEST(Cli, ConfigErrorsNameTheKeyAndPlace) {
  Result ok = moefit("config configs/demo.yaml");
  EXPECT_EQ(ok.code, 0) << ok.out;
  EXPECT_NE(ok.out.find("seq_len"), std::string::npos);

  Result bogus = moefit("config configs/demo.yaml train.lr=bogus");
  EXPECT_EQ(bogus.code, 1);
  EXPECT_NE(bogus.out.find("train.lr"), std::string::npos) << bogus.out;
  EXPECT_NE(bogus.out.find("bogus"), std::string::npos) << bogus.out;

  std::string path = tmpdir() + "/typo.yaml";
  write_file(path, "model:\n  init: {family: mixtral}\ndata:\n  train: x.tokens\ntrain:\n  steps: 3\n  lrr: 0.1\n");
  Result typo = moefit("config " + path);
  EXPECT_EQ(typo.code, 1);
  EXPECT_NE(typo.out.find(path + ":7:3"), std::string::npos) << typo.out;
  EXPECT_NE(typo.out.find("train.lrr"), std::string::npos) << typo.out;
}

TEST(Cli, InspectListsAValidSafetensorsFile) {
  std::string path = tmpdir() + "/ok.safetensors";
  float w[6] = {1, 2, 3, 4, 5, 6};
  int64_t shape[2] = {2, 3};
  mf_st_tensor t{};
  t.name = "model.embed_tokens.weight";
  t.dtype = MF_DTYPE_F32;
  t.ndim = 2;
  t.shape[0] = shape[0];
  t.shape[1] = shape[1];
  t.nbytes = sizeof w;
  t.data = w;
  ASSERT_EQ(mf_safetensors_write(path.c_str(), &t, 1, nullptr, 0), MF_OK) << mf_last_error();
  Result r = moefit("inspect " + path);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("model.embed_tokens.weight"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("F32"), std::string::npos) << r.out;
}

TEST(Cli, InspectRejectsMalformedFilesCleanly) {
  const std::string d = tmpdir();
  const std::string good_entry = "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
  struct Case {
    const char *name;
    std::string bytes;
  } cases[] = {
      {"short.safetensors", "abc"},
      {"hugelen.safetensors", u64le(1ull << 62) + "{}"},
      {"pastend.safetensors", u64le(1000) + "{}"},
      {"notjson.safetensors", safetensors_bytes("{not json", "")},
      {"array.safetensors", safetensors_bytes("[1,2,3]", "")},
      {"baddtype.safetensors",
       safetensors_bytes("{\"w\":{\"dtype\":\"F33\",\"shape\":[2],\"data_offsets\":[0,8]}}", std::string(8, 0))},
      {"extent.safetensors",
       safetensors_bytes("{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", std::string(8, 0))},
      {"reversed.safetensors",
       safetensors_bytes("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", std::string(8, 0))},
      {"overflow.safetensors",
       safetensors_bytes("{\"w\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4],\"data_offsets\":[0,8]}}",
                         std::string(8, 0))},
      {"hole.safetensors", safetensors_bytes(good_entry, std::string(16, 0))},
      {"dup.safetensors",
       safetensors_bytes("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                         "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                         std::string(8, 0))},
      {"utf8.safetensors", safetensors_bytes("{\"\xff\xfe\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
                                             std::string(8, 0))},
      {"deep.safetensors", safetensors_bytes(std::string(5000, '[') + std::string(5000, ']'), "")},
      {"bad.tokens", "MFTOKENS" + std::string(40, '\x01')},
  };
  for (const Case &c : cases) {
    std::string path = d + "/" + c.name;
    write_file(path, c.bytes);
    Result r = moefit("inspect " + path);
    EXPECT_EQ(r.signal, 0) << c.name << ": killed by signal " << r.signal;
    EXPECT_EQ(r.code, 1) << c.name << ": " << r.out;
    EXPECT_NE(r.out.find(path), std::string::npos) << c.name << ": message does not name the file: " << r.out;
    EXPECT_EQ(r.out.find("Sanitizer"), std::string::npos) << c.name << ": " << r.out;
  }
  Result missing = moefit("inspect " + d + "/does-not-exist");
  EXPECT_EQ(missing.code, 1);
}

}  // namespace
