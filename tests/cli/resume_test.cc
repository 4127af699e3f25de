// issue 16 items 1-2: `moefit train` writes resume checkpoints and
// `moefit train CONFIG --resume [DIR]` continues from one to the same bits as
// a run that never stopped — the same loss at every step after the resume and
// byte-identical final weights — on the cpu backend, with fp32 and bf16
// storage, the optimizer overlapped, weights streamed under a small device
// budget and the optimizer on the device; and a damaged, unfinished or
// mismatched checkpoint is passed over or refused with its file and fault.
// A resume trains the steps after its checkpoint's, each once (its own
// progress lines and the metrics after its marker): a retrain from step 1,
// which the same bits would hide, fails.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "cli_util.h"

namespace {

std::string Corpus() { return text_tokens("resume_corpus", 60000); }

// The demo shortened: 32-token sequences, 2 a step, every step logged,
// a checkpoint every 4 steps.
std::string Args(const std::string &out, int steps, const std::string &extra) {
  return "train configs/demo.yaml hardware.profile=configs/hw/cpu-2core.yaml data.valid=null data.seq_len=32 "
         "train.micro_batch=2 train.warmup=2 train.log_every=1 output.checkpoint_every=4 train.steps=" +
         std::to_string(steps) + " data.train=" + Corpus() + " output.dir=" + out + " " + extra;
}

std::map<int, std::string> Losses(const std::string &dir) { return step_losses(dir); }

// The steps of the metrics lines of dir/metrics.jsonl after its resume marker, in order.
std::vector<int> StepsAfterTheResume(const std::string &dir) {
  const std::string m = read_file(dir + "/metrics.jsonl");
  std::vector<int> v;
  for (size_t at = m.find("{\"resumed_from\":");
       at != std::string::npos && (at = m.find("{\"step\":", at)) != std::string::npos; at += 8)
    v.push_back(std::stoi(m.substr(at + 8)));
  return v;
}

std::string Fresh(const std::string &name) { return fresh_dir(name); }

struct Variant {
  const char *name, *extra;
};

// An uninterrupted 12-step run against one stopped after step 8 (train.steps=8)
// and resumed to 12 (a constant schedule, so the learning rate of a step does
// not depend on train.steps).
void StopAndResume(const Variant &v, const std::function<void()> &between = nullptr) {
  SCOPED_TRACE(v.name);
  const std::string extra = std::string("train.schedule=constant ") + v.extra;
  const std::string a = Fresh(std::string("whole_") + v.name), c = Fresh(std::string("cut_") + v.name);
  Result ra = moefit(Args(a, 12, extra));
  ASSERT_EQ(ra.code, 0) << ra.out;
  EXPECT_EQ(trained_steps(ra.out), step_range(1, 12)) << ra.out;
  Result rc = moefit(Args(c, 8, extra));
  ASSERT_EQ(rc.code, 0) << rc.out;
  EXPECT_EQ(trained_steps(rc.out), step_range(1, 8)) << rc.out;
  EXPECT_NE(rc.out.find("checkpoint: " + c + "/checkpoints/step-000008 ("), std::string::npos) << rc.out;
  if (between) between();
  Result rr = moefit(Args(c, 12, extra) + " --resume");
  ASSERT_EQ(rr.code, 0) << rr.out;
  EXPECT_NE(rr.out.find("resumed from " + c + "/checkpoints/step-000008 (step 8)"), std::string::npos) << rr.out;
  EXPECT_EQ(trained_steps(rr.out), step_range(9, 12)) << "the checkpoint's step 8 + 1 on, each once:\n"
                                                      << rr.out;
  EXPECT_EQ(StepsAfterTheResume(c), step_range(9, 12));
  EXPECT_FALSE(final_weights(a).empty());
  EXPECT_EQ(final_weights(a), final_weights(c)) << "final weights differ";
  const auto la = Losses(a), lc = Losses(c);
  for (int s = 1; s <= 12; s++) EXPECT_EQ(la.at(s), lc.at(s)) << "step " << s;
  EXPECT_EQ(lc.size(), 12u); // the resumed run's lines replaced nothing twice
  EXPECT_NE(read_file(c + "/metrics.jsonl").find("{\"resumed_from\":\"" + c + "/checkpoints/step-000008\",\"resume_step\":8}"),
            std::string::npos);
  // The checkpoint's figures are in its step's line.
  EXPECT_NE(read_file(a + "/metrics.jsonl").find("\"checkpoint_s\":"), std::string::npos);
}

TEST(Resume, SameBitsFp32) { StopAndResume({"fp32", ""}); }
TEST(Resume, SameBitsOverlappedOptimizer) { StopAndResume({"overlap", "train.overlap_optimizer=true"}); }
TEST(Resume, SameBitsStreamedWeights) { StopAndResume({"streamed", "memory.device_budget=1.5MiB"}); }
TEST(Resume, SameBitsLora) {
  StopAndResume({"lora",
                 "train.lora.rank=4 train.lora.alpha=8 train.lr=1e-2 train.lora.dropout=0.1 "
                 "train.lora.targets=[q_proj,v_proj,w1,w2,w3]"});
}
// train.lora.experts: hot — adapters on each layer's two most-routed experts
// by a routing file; the checkpoint records them (state.json lora_hot), and a
// resume keeps them although the file says other experts are hot by then.
TEST(Resume, SameBitsLoraHotExpertsWhateverTheRoutingSaysSince) {
  const std::string routing = tmpdir() + "/lora_hot_routing.json";
  const auto counts = [&](const std::string &rows) {
    write_file(routing, R"({"format": "moefit-routing", "version": 1,
        "model": {"family": "mixtral", "layers": 2, "experts": 8, "top_k": 2}, "tokens": 100, "counts": )" +
                            rows + "}");
  };
  counts("[[60, 10, 50, 5, 40, 5, 20, 10], [5, 70, 5, 5, 5, 60, 40, 10]]");
  StopAndResume(
      {"lora_hot", ("train.lora.rank=4 train.lora.alpha=8 train.lr=1e-2 train.lora.dropout=0.1 "
                    "train.lora.targets=[q_proj,v_proj,w1,w2,w3] train.lora.experts=hot memory.routing=" +
                    routing)
                       .c_str()},
      [&] { counts("[[10, 60, 5, 50, 40, 5, 20, 10], [70, 5, 5, 5, 5, 10, 40, 60]]"); });
  const std::string state = read_file((tmpdir() + "/cut_lora_hot") + "/checkpoints/step-000008/state.json");
  EXPECT_NE(state.find("\"lora_hot\": [[0, 2], [1, 5]]"), std::string::npos) << state;
  const std::string adapter = read_file((tmpdir() + "/cut_lora_hot") + "/final/adapter_config.json");
  EXPECT_NE(adapter.find("\"model.layers.0.block_sparse_moe.experts.2.w1\""), std::string::npos) << adapter;
  EXPECT_EQ(adapter.find("\"model.layers.0.block_sparse_moe.experts.1.w1\""), std::string::npos) << adapter;
}

// bf16 storage: the frozen base at home in bf16 alone, loaded into it again on resume
TEST(Resume, SameBitsLoraBf16Base) {
  StopAndResume({"lora_bf16",
                 "train.precision=bf16 train.lora.rank=4 train.lora.alpha=8 train.lr=1e-2 "
                 "train.lora.targets=[q_proj,v_proj,w1,w2,w3]"});
}
// QLoRA: the base quantized at load (NF4 double quantized, streamed under a
// small budget; FP8), again on resume: the same bits.
TEST(Resume, SameBitsQloraNf4StreamedAndFp8) {
  StopAndResume({"qlora_nf4",
                 "train.precision=bf16 train.lora.rank=4 train.lora.alpha=8 train.lr=1e-2 "
                 "train.lora.targets=[q_proj,v_proj,w1,w2,w3] train.lora.base_dtype=nf4 "
                 "train.lora.base_double_quant=true memory.device_budget=1.5MiB"});
  StopAndResume({"qlora_fp8",
                 "train.lora.rank=4 train.lora.alpha=8 train.lr=1e-2 train.lora.targets=[q_proj,v_proj,w1,w2,w3] "
                 "train.lora.base_dtype=fp8"});
}
// A LoRA run's checkpoints hold the adapters and their AdamW state, not the
// frozen base: only its identity (state.json base_sum, the checksum of its
// weights). Resumed onto a base whose weights changed under the same
// model.path, the run is refused, saying so.
TEST(Resume, LoraCheckpointsHoldTheAdaptersAndTheBaseIdentity) {
  const std::string d = Fresh("lora_base"), base = d + "/base", out = d + "/run";
  Result init = moefit("init --family mixtral --preset tiny --seed 1 --out " + base);
  ASSERT_EQ(init.code, 0) << init.out;
  const std::string lora = " model.init=null model.path=" + base +
                           " train.lora.rank=4 train.lora.targets=[q_proj,v_proj,w1,w2,w3] train.lr=1e-2";
  Result r = moefit(Args(out, 4, "train.schedule=constant" + lora));
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string ck = out + "/checkpoints/step-000004";
  const std::string state = read_file(ck + "/state.json");
  EXPECT_NE(state.find("\"base_sum\": \""), std::string::npos) << state;
  struct stat a {
  }, b{};
  ASSERT_EQ(stat((ck + "/master.safetensors").c_str(), &a), 0);
  ASSERT_EQ(stat((base + "/model.safetensors").c_str(), &b), 0);
  EXPECT_LT(a.st_size * 4, b.st_size) << "the checkpoint's weights are the adapters', not the base's";
  // Another base under the same path: refused.
  ASSERT_EQ(moefit("init --family mixtral --preset tiny --seed 2 --out " + d + "/base2").code, 0);
  ASSERT_EQ(shell("rm -rf " + base + " && mv " + d + "/base2 " + base).code, 0);
  Result rr = moefit(Args(out, 8, "train.schedule=constant" + lora) + " --resume");
  EXPECT_EQ(rr.code, 1) << rr.out;
  EXPECT_NE(
      rr.out.find("/state.json: base_sum: the checkpoint's adapters were trained on a base whose weights "
                  "have checksum "),
      std::string::npos)
      << rr.out;
}

TEST(Resume, SameBitsBf16) { StopAndResume({"bf16", "train.precision=bf16 train.adam_moments=bf16"}); }
TEST(Resume, SameBitsOptimizerOnDevice) {
  StopAndResume({"device_optim", "'memory.overrides=[{match: \"model.layers.*\", optimizer: device}]'"});
}

// output.checkpoint_async: checkpoints written on their own thread from a
// snapshot while training goes on hold the same bytes as those written with
// training paused, land (COMPLETE) a step or more later, and change nothing of
// the training; one of them resumes to the same bits (ExplicitDirCosine's run
// writes its step-8 checkpoint beside training too: auto is on there).
TEST(Resume, CheckpointsWrittenBesideTrainingHoldTheSameBytes) {
  const std::string a = Fresh("async_on"), b = Fresh("async_off");
  Result ra = moefit(Args(a, 12, "output.checkpoint_async=true"));
  ASSERT_EQ(ra.code, 0) << ra.out;
  Result rb = moefit(Args(b, 12, "output.checkpoint_async=false"));
  ASSERT_EQ(rb.code, 0) << rb.out;
  for (const char *step : {"000004", "000008", "000012"}) {
    SCOPED_TRACE(step);
    for (const char *f :
         {"master.safetensors", "optimizer.safetensors", "state.safetensors", "state.json", "COMPLETE"})
      EXPECT_EQ(read_file(a + "/checkpoints/step-" + step + "/" + f),
                read_file(b + "/checkpoints/step-" + step + "/" + f))
          << f;
  }
  EXPECT_NE(ra.out.find("checkpoint: " + a + "/checkpoints/step-000004 ("), std::string::npos) << ra.out;
  EXPECT_NE(ra.out.find("written beside training, which paused "), std::string::npos) << ra.out;
  EXPECT_EQ(rb.out.find("written beside training"), std::string::npos) << rb.out;
  EXPECT_EQ(read_file(a + "/final/model.safetensors"), read_file(b + "/final/model.safetensors"));
  EXPECT_EQ(Losses(a), Losses(b));
  // The write's figures on the line of the step where it landed.
  EXPECT_NE(read_file(a + "/metrics.jsonl").find("\"checkpoint_write_s\":0"), std::string::npos);
  // Resumed from the step-8 checkpoint written beside training: the same bits.
  const std::string c = Fresh("async_copy");
  shell("cp -r " + a + " " + c + " && rm -rf " + c + "/checkpoints/step-000012 " + c + "/final");
  Result rc =
      moefit(Args(c, 12, "output.checkpoint_async=true") + " --resume " + c + "/checkpoints/step-000008");
  ASSERT_EQ(rc.code, 0) << rc.out;
  EXPECT_EQ(trained_steps(rc.out), step_range(9, 12)) << rc.out;
  EXPECT_EQ(read_file(a + "/final/model.safetensors"), read_file(c + "/final/model.safetensors"));
}

// The cosine schedule over train.steps: resume from an explicit DIR of a run's
// copy whose later checkpoint and weights were removed (as if it had died
// after step 8).
TEST(Resume, ExplicitDirCosine) {
  const std::string a = Fresh("cos_whole"), b = Fresh("cos_copy");
  Result ra = moefit(Args(a, 12, "output.checkpoint_compression=none output.keep_checkpoints=2"));
  ASSERT_EQ(ra.code, 0) << ra.out;
  EXPECT_NE(access((a + "/checkpoints/step-000004").c_str(), F_OK), 0) << "keep_checkpoints 2 keeps 8 and 12";
  shell("cp -r " + a + " " + b + " && rm -rf " + b + "/checkpoints/step-000012 " + b + "/final");
  Result rb = moefit(Args(b, 12, "output.checkpoint_compression=none") + " --resume " + b + "/checkpoints/step-000008");
  ASSERT_EQ(rb.code, 0) << rb.out;
  EXPECT_EQ(trained_steps(rb.out), step_range(9, 12)) << rb.out;
  EXPECT_EQ(read_file(a + "/final/model.safetensors"), read_file(b + "/final/model.safetensors"));
  EXPECT_EQ(Losses(a), Losses(b));
}

// Damage: the newest checkpoint is passed over with a warning when no DIR is
// given, refused when it is named; a config that changes the maths is refused.
TEST(Resume, DamagedUnfinishedAndMismatchedCheckpoints) {
  const std::string a = Fresh("dmg");
  const std::string extra = "train.schedule=constant output.checkpoint_compression=zstd-1";
  Result ra = moefit(Args(a, 8, extra));
  ASSERT_EQ(ra.code, 0) << ra.out;
  const std::string s8 = a + "/checkpoints/step-000008";
  // A flipped byte in the moments.
  std::string opt = read_file(s8 + "/optimizer.safetensors.zst");
  opt[opt.size() / 3] ^= 0x01;
  write_file(s8 + "/optimizer.safetensors.zst", opt);
  Result r1 = moefit(Args(a, 12, extra) + " --resume " + s8);
  EXPECT_NE(r1.code, 0) << r1.out;
  EXPECT_NE(r1.out.find(s8 + "/optimizer.safetensors.zst: checksum"), std::string::npos) << r1.out;
  EXPECT_NE(r1.out.find("the file is damaged"), std::string::npos) << r1.out;
  Result r2 = moefit(Args(a, 12, extra) + " --resume");
  ASSERT_EQ(r2.code, 0) << r2.out;
  EXPECT_NE(r2.out.find("passing over " + s8 + ": " + s8 + "/optimizer.safetensors.zst: checksum"), std::string::npos)
      << r2.out;
  EXPECT_NE(r2.out.find("resumed from " + a + "/checkpoints/step-000004 (step 4)"), std::string::npos) << r2.out;
  EXPECT_EQ(trained_steps(r2.out), step_range(5, 12)) << r2.out;
  // Truncated master weights; then no COMPLETE.
  const std::string s12 = a + "/checkpoints/step-000012";
  std::string master = read_file(s12 + "/master.safetensors.zst");
  write_file(s12 + "/master.safetensors.zst", master.substr(0, master.size() / 2));
  Result r3 = moefit(Args(a, 16, extra) + " --resume " + s12);
  EXPECT_NE(r3.code, 0) << r3.out;
  EXPECT_NE(r3.out.find(s12 + "/master.safetensors.zst: "), std::string::npos) << r3.out;
  EXPECT_NE(r3.out.find("(truncated)"), std::string::npos) << r3.out;
  shell("rm " + a + "/checkpoints/step-000004/COMPLETE");
  Result r4 = moefit(Args(a, 16, extra) + " --resume " + a + "/checkpoints/step-000004");
  EXPECT_NE(r4.code, 0) << r4.out;
  EXPECT_NE(r4.out.find("/checkpoints/step-000004/COMPLETE: missing"), std::string::npos) << r4.out;
  // Settings that change the maths.
  Result r5 = moefit(Args(a, 16, extra + " train.lr=1e-2 train.seed=7") + " --resume " + s8);
  EXPECT_NE(r5.code, 0) << r5.out;
  EXPECT_NE(r5.out.find(s8 + "/config.yaml: the checkpoint was written with other settings that change the "
                        "training: train.lr, train.seed differ"),
            std::string::npos)
      << r5.out;
}

}  // namespace
