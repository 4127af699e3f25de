// issue 28 (never silently wrong), the findings of the mutation campaign as a
// user met them, with the real `moefit`: a checkpoint of a 2-step demo run
// (zstd, byte-plane filter) damaged, then `train --resume` and `export`.
//  - one byte of manifest.json changed (an entry's "filter" key renamed):
//    resume trained on scrambled weights (every step skipped, NaN weights,
//    exit 0) and export wrote a NaN model; now both refuse, naming the file;
//  - config.yaml damaged: reported as damaged, not as a setting that differs;
//  - a state.json that contradicts itself (sealed into the manifest, as a
//    faulty writer would): refused at resume before any step, not after the
//    training when routing.json is written.
#include "tests/ckpt/ckpt_util.h"
#include "tests/cli/cli_util.h"

namespace {

// The demo shortened: 32-token sequences, 2 a step, zstd checkpoints.
std::string Args(const std::string &out, int steps) {
  return "train configs/demo.yaml hardware.profile=configs/hw/cpu-2core.yaml data.valid=null data.seq_len=32 "
         "train.micro_batch=2 train.warmup=1 train.log_every=1 output.checkpoint_compression=zstd-1 train.steps=" +
         std::to_string(steps) + " data.train=" + text_tokens("ckpt_resume_corpus", 20000) + " output.dir=" + out;
}

// A copy of the 2-step run (trained once per test binary) in a fresh dir:
// its output dir and its checkpoint.
struct Copy {
  std::string out, ckpt;
};

Copy Trained(const std::string &name) {
  static const std::string base = [] {
    const std::string d = fresh_dir("ckpt_resume_base");
    const Result r = moefit(Args(d, 2));
    EXPECT_EQ(r.code, 0) << r.out;
    return d;
  }();
  Copy run{fresh_dir(name), ""};
  shell("cp -r " + base + " " + run.out + " && rm -r " + run.out + "/final");  // final/: a resume's to write
  run.ckpt = run.out + "/checkpoints/step-000002";
  EXPECT_TRUE(Has(read_file(run.ckpt + "/manifest.json"), "\"filter\": \"byteplane\""));
  return run;
}

// The resume refused before any step: no step after the checkpoint's ran, no
// final weights.
void ExpectRefusedBeforeTraining(const Copy &run, const Result &r) {
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_FALSE(std::ifstream(run.out + "/final/model.safetensors").good()) << r.out;
  EXPECT_EQ(step_losses(run.out).count(3), 0u) << r.out;
  EXPECT_FALSE(Has(r.out, "resumed from")) << r.out;
}

// A copy of the run whose checkpoint's `file` has `from` replaced by `to`
// (and the manifest sealed over it when reseal), resumed to step 4: refused
// before any step. The resume's output.
Result ResumeDamaged(const Copy &run, const std::string &file, const std::string &from, const std::string &to,
                     bool reseal) {
  Edit(run.ckpt + "/" + file, from, to);
  if (reseal) Reseal(run.ckpt, file);
  const Result r = moefit(Args(run.out, 4) + " --resume " + run.ckpt);
  ExpectRefusedBeforeTraining(run, r);
  return r;
}

TEST(CkptResume, OneByteOfTheManifestIsRefusedByResumeAndExport) {
  const Copy run = Trained("filter");
  const Result r = ResumeDamaged(run, "manifest.json", "\"filter\": \"byteplane\"", "\"filtes\": \"byteplane\"", false);
  EXPECT_TRUE(Has(r.out, run.ckpt + "/manifest.json: checksum")) << r.out;
  EXPECT_TRUE(Has(r.out, "(the manifest is damaged)")) << r.out;
  const Result e = moefit("export " + run.ckpt + " --out " + run.out + "/hf");
  EXPECT_NE(e.code, 0) << e.out;
  EXPECT_TRUE(Has(e.out, run.ckpt + "/manifest.json")) << e.out;
  EXPECT_FALSE(std::ifstream(run.out + "/hf/model.safetensors").good());
}

TEST(CkptResume, ADamagedConfigIsReportedAsDamaged) {
  const Result r = ResumeDamaged(Trained("config"), "config.yaml", "lr: 0.003", "lr: 0.004", false);
  EXPECT_TRUE(Has(r.out, "/config/checkpoints/step-000002/config.yaml: checksum")) << r.out;
  EXPECT_TRUE(Has(r.out, "(the file is damaged)")) << r.out;
  EXPECT_FALSE(Has(r.out, "differ")) << r.out;
}

TEST(CkptResume, AStateThatContradictsItselfIsRefusedBeforeAnyStep) {
  {  // the step one less: the AdamW step counts and the loader's position are of two steps
    const Copy run = Trained("step");
    const Result r = ResumeDamaged(run, "state.json", "\"step\": 2", "\"step\": 1", true);
    EXPECT_TRUE(Has(r.out, run.ckpt + "/state.")) << r.out;  // state.json or state.safetensors beside it
    EXPECT_TRUE(Has(r.out, "state.json's step 1")) << r.out;
  }
  {  // the loader's position moved: not where two steps leave it
    const Copy run = Trained("index");
    const Result r = ResumeDamaged(run, "state.json", "\"index\": ", "\"index\": 1", true);
    EXPECT_TRUE(Has(r.out, run.ckpt + "/state.json: data: epoch 0 at index 1")) << r.out;
    EXPECT_TRUE(Has(r.out, "the state is inconsistent")) << r.out;
  }
}

}  // namespace
