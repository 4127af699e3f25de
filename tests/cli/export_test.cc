// issue 16 item 5: `moefit export RUN_OR_CHECKPOINT --out DIR` writes a
// Hugging Face model dir. An fp32 export of a run evaluates to the very loss
// of the run's own weights, and a bf16 export holds each of its values rounded
// to nearest even; a tiny --shard-size gives a valid sharded set holding every
// tensor once with the same bytes; a non-empty --out and a damaged checkpoint
// are refused, leaving nothing behind, and the temporary dirs of killed
// exports are removed by the next export beside them; where a
// python with transformers and torch is at hand (MF_HF_PYTHON), transformers
// loads the export with no missing or unexpected keys. The export carries the
// tokenizer files of the run's model.path (none for model.init, said so).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <regex>
#include <set>
#include <string>

#include "cli_util.h"
#include "src/io/safetensors.h"
#include "tests/require.h"

namespace {

bool has(const std::string &s, const std::string &what) {
  return s.find(what) != std::string::npos;
}

std::string Corpus() {
  return text_tokens("export_corpus", 30000);
}

const std::string kModel =
    " configs/demo.yaml hardware.profile=configs/hw/cpu-2core.yaml data.valid=null data.seq_len=32 ";

// A short demo run (a checkpoint at steps 2 and 4), once per test binary.
std::string DemoRun() {
  static std::string run;
  if (!run.empty()) return run;
  run = tmpdir() + "/export_run";
  Result r = moefit("train" + kModel +
                    "train.micro_batch=2 train.warmup=1 train.steps=4 output.checkpoint_every=2 "
                    "output.checkpoint_compression=zstd-1 " +
                    "data.train=" + Corpus() + " output.dir=" + run);
  EXPECT_EQ(r.code, 0) << r.out;
  return run;
}

// The loss `moefit eval` prints for the weights of model_dir (`model`: the
// config's model overrides, e.g. a LoRA run's base).
double EvalLoss(const std::string &model_dir, const std::string &model = "") {
  Result r = moefit("eval" + kModel + model + " --tokens " + Corpus() + " --model " + model_dir +
                    " output.dir=" + tmpdir() + "/export_eval_nothing");
  EXPECT_EQ(r.code, 0) << r.out;
  std::smatch m;
  if (!std::regex_search(r.out, m, std::regex("loss ([0-9.]+)  perplexity"))) {
    ADD_FAILURE() << "no loss line:\n" << r.out;
    return NAN;
  }
  return std::stod(m[1]);
}

// bf16 of an fp32 value rounded to nearest, ties to even, spelled out bit by
// bit (apart from the project's own conversion, which this checks): keep the
// upper 16 bits, and step up one when the lower 16 are over half, or exactly
// half with the kept value odd. NaN stays NaN (quiet).
uint16_t RoundToBf16(uint32_t f) {
  const uint16_t kept = static_cast<uint16_t>(f >> 16);
  const uint32_t rest = f & 0xffffu;
  if ((f & 0x7f800000u) == 0x7f800000u && (f & 0x7fffffu)) return static_cast<uint16_t>(kept | 0x40);
  if (rest > 0x8000u || (rest == 0x8000u && (kept & 1))) return static_cast<uint16_t>(kept + 1);
  return kept;
}

// Every tensor of the bf16 export is the fp32 export's, each value rounded to
// nearest even; the count of values that rounded up, so a test of it can
// tell rounding from truncation.
void ExpectBf16IsTheRoundedFp32(const std::string &f32_dir, const std::string &b16_dir) {
  mf_safetensors *a = nullptr, *b = nullptr;
  ASSERT_EQ(mf_safetensors_open(f32_dir.c_str(), &a), MF_OK) << mf_last_error();
  ASSERT_EQ(mf_safetensors_open(b16_dir.c_str(), &b), MF_OK) << mf_last_error();
  EXPECT_EQ(mf_safetensors_count(a), mf_safetensors_count(b));
  uint64_t values = 0, up = 0;
  for (size_t i = 0; i < mf_safetensors_count(a); i++) {
    const mf_st_tensor *x = mf_safetensors_get(a, i), *y = mf_safetensors_find(b, x->name);
    ASSERT_NE(y, nullptr) << x->name;
    ASSERT_EQ(x->dtype, MF_DTYPE_F32) << x->name;
    ASSERT_EQ(y->dtype, MF_DTYPE_BF16) << x->name;
    ASSERT_EQ(x->ndim, y->ndim) << x->name;
    for (int k = 0; k < x->ndim; k++) ASSERT_EQ(x->shape[k], y->shape[k]) << x->name;
    ASSERT_EQ(x->numel, y->numel) << x->name;
    uint64_t wrong = 0, first = 0;
    for (uint64_t e = 0; e < x->numel; e++) {
      uint32_t f;
      uint16_t h;
      std::memcpy(&f, static_cast<const uint8_t *>(x->data) + 4 * e, 4);
      std::memcpy(&h, static_cast<const uint8_t *>(y->data) + 2 * e, 2);
      if (h != RoundToBf16(f) && !wrong++) first = e;
      up += h != static_cast<uint16_t>(f >> 16);
    }
    EXPECT_EQ(wrong, 0u) << x->name << ": " << wrong << " of " << x->numel
                         << " values are not the fp32 value rounded to nearest even, the first at " << first;
    values += x->numel;
  }
  EXPECT_GT(values, 100000u);
  EXPECT_GT(up, values / 4) << "about half the values round up";
  mf_safetensors_close(a);
  mf_safetensors_close(b);
}

TEST(Export, Fp32EvaluatesToTheRunsLossAndBf16IsItRoundedToNearestEven) {
  const std::string run = DemoRun(), f32 = tmpdir() + "/export_f32", b16 = tmpdir() + "/export_b16";
  Result e = moefit("export " + run + " --out " + f32 + " --dtype fp32");
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_TRUE(has(e.out, "exported " + run + "/checkpoints/step-000004 -> " + f32)) << e.out;
  for (const char *f : {"config.json", "model.safetensors", "generation_config.json"})
    EXPECT_EQ(access((f32 + "/" + f).c_str(), R_OK), 0) << f;
  EXPECT_TRUE(has(read_file(f32 + "/config.json"), "\"torch_dtype\": \"float32\""));
  EXPECT_EQ(read_file(f32 + "/generation_config.json"),
            "{\n  \"_from_model_config\": true,\n  \"bos_token_id\": 1,\n  \"eos_token_id\": 2,\n"
            "  \"transformers_version\": \"4.57.6\"\n}\n");
  const double want = EvalLoss(run + "/final"), got = EvalLoss(f32);
  EXPECT_EQ(got, want) << "the fp32 export is the run's weights";

  Result b = moefit("export " + run + " --out " + b16);
  ASSERT_EQ(b.code, 0) << b.out;
  EXPECT_TRUE(has(read_file(b16 + "/config.json"), "\"torch_dtype\": \"bfloat16\""));
  ExpectBf16IsTheRoundedFp32(f32, b16);

  // A checkpoint named directly: the older one, its own weights.
  const std::string s2 = tmpdir() + "/export_s2";
  Result c = moefit("export " + run + "/checkpoints/step-000002 --out " + s2 + " --dtype fp32");
  ASSERT_EQ(c.code, 0) << c.out;
  EXPECT_NE(read_file(s2 + "/model.safetensors"), read_file(f32 + "/model.safetensors"));
}

TEST(Export, ASmallShardSizeGivesAValidIndex) {
  const std::string run = DemoRun(), one = tmpdir() + "/export_one", sh = tmpdir() + "/export_sharded";
  ASSERT_EQ(moefit("export " + run + " --out " + one + " --dtype fp32").code, 0);
  Result r = moefit("export " + run + " --out " + sh + " --dtype fp32 --shard-size 300KB");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(access((sh + "/model.safetensors").c_str(), F_OK), -1) << "no single file beside the shards";
  mf_safetensors *a = nullptr, *b = nullptr;
  ASSERT_EQ(mf_safetensors_open((one + "/model.safetensors").c_str(), &a), MF_OK) << mf_last_error();
  ASSERT_EQ(mf_safetensors_open(sh.c_str(), &b), MF_OK) << mf_last_error();  // the index's rules checked
  EXPECT_GT(mf_safetensors_shard_count(b), 2u);
  ASSERT_EQ(mf_safetensors_count(a), mf_safetensors_count(b));
  std::set<std::string> seen;
  uint64_t total = 0;
  for (size_t i = 0; i < mf_safetensors_count(b); i++) {
    const mf_st_tensor *x = mf_safetensors_get(b, i);
    EXPECT_TRUE(seen.insert(x->name).second) << x->name << " twice";
    const mf_st_tensor *y = mf_safetensors_find(a, x->name);
    ASSERT_NE(y, nullptr) << x->name;
    ASSERT_EQ(x->nbytes, y->nbytes) << x->name;
    EXPECT_EQ(std::memcmp(x->data, y->data, x->nbytes), 0) << x->name;
    total += x->nbytes;
  }
  EXPECT_TRUE(
      has(read_file(sh + "/model.safetensors.index.json"), "\"total_size\": " + std::to_string(total)));
  mf_safetensors_close(a);
  mf_safetensors_close(b);
  EXPECT_EQ(EvalLoss(sh), EvalLoss(one));
}

TEST(Export, RefusesANonEmptyOutAndADamagedCheckpoint) {
  const std::string run = DemoRun(), busy = tmpdir() + "/export_busy";
  ASSERT_EQ(shell("mkdir -p " + busy + " && echo keep > " + busy + "/notes.txt").code, 0);
  Result r = moefit("export " + run + " --out " + busy);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(has(r.out, "moefit export: error: --out " + busy + ": not empty")) << r.out;
  EXPECT_EQ(shell("ls -A " + busy).out, "notes.txt\n");

  const std::string bad = tmpdir() + "/export_bad_ckpt", out = tmpdir() + "/export_from_bad";
  ASSERT_EQ(shell("cp -r " + run + "/checkpoints/step-000004 " + bad).code, 0);
  std::string m = read_file(bad + "/master.safetensors.zst");
  m[m.size() / 2] ^= 0x10;
  write_file(bad + "/master.safetensors.zst", m);
  Result d = moefit("export " + bad + " --out " + out);
  EXPECT_EQ(d.code, 1) << d.out;
  EXPECT_TRUE(has(d.out, bad + "/master.safetensors.zst: checksum")) << d.out;
  EXPECT_NE(access(out.c_str(), F_OK), 0) << "nothing written";
  EXPECT_EQ(shell("ls -d " + tmpdir() + "/export_from_bad* 2>/dev/null").out, "") << "no temporary dir left";

  Result none = moefit("export " + tmpdir() + " --out " + tmpdir() + "/export_none");
  EXPECT_EQ(none.code, 1) << none.out;
  EXPECT_TRUE(has(none.out, "neither a checkpoint")) << none.out;
}

// A killed export leaves OUT.tmp-export-PID behind. The next export into the
// same parent removes those whose process is gone and whose lock (the flock a
// running export holds on its dir) is free, saying so in one line, and names
// those it leaves: a PID that runs, or a lock held (an export whose PID means
// nothing here: another container on the volume). A name with no PID is not
// an export's.
pid_t DeadPid() {
  const pid_t p = fork();
  if (p == 0) _exit(0);
  waitpid(p, nullptr, 0);
  return p;
}

TEST(Export, RemovesTheTemporaryDirsOfKilledExports) {
  const std::string parent = fresh_dir("export_stale");
  const std::string gone = parent + "/a.tmp-export-" + std::to_string(DeadPid()),
                    running = parent + "/b.tmp-export-" + std::to_string(getpid()),
                    locked_pid = std::to_string(DeadPid()), locked = parent + "/c.tmp-export-" + locked_pid,
                    other = parent + "/d.tmp-export-x";
  ASSERT_EQ(shell("mkdir -p " + gone + " " + running + " " + locked + " " + other + " && touch " + gone +
                  "/model.safetensors.tmp")
                .code,
            0);
  const int lock = open(locked.c_str(), O_RDONLY | O_DIRECTORY);
  ASSERT_GE(lock, 0);
  ASSERT_EQ(flock(lock, LOCK_EX | LOCK_NB), 0);
  Result r = moefit("export " + DemoRun() + " --out " + parent + "/out");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(
      r.out, "removed the temporary dir of 1 killed export (no such process, no lock held): " + gone + "\n"))
      << r.out;
  EXPECT_TRUE(has(r.out, running + ": left alone: process " + std::to_string(getpid()) + " is running"))
      << r.out;
  EXPECT_TRUE(has(r.out, locked + ": left alone: the lock of process " + locked_pid + " is held")) << r.out;
  EXPECT_FALSE(has(r.out, other)) << r.out;
  EXPECT_NE(access(gone.c_str(), F_OK), 0);
  for (const std::string &d : {running, locked, other}) EXPECT_EQ(access(d.c_str(), F_OK), 0) << d;
  EXPECT_EQ(shell("ls " + parent + "/out | grep -c tmp-export").out, "0\n") << "the export's own is renamed";
  // Its lock let go: removed by the next export.
  close(lock);
  Result r2 = moefit("export " + DemoRun() + " --out " + parent + "/out2");
  ASSERT_EQ(r2.code, 0) << r2.out;
  EXPECT_TRUE(has(r2.out, "killed export (no such process, no lock held): " + locked + "\n")) << r2.out;
  EXPECT_NE(access(locked.c_str(), F_OK), 0);
  EXPECT_EQ(shell("ls " + parent).out,
            "b.tmp-export-" + std::to_string(getpid()) + "\nd.tmp-export-x\nout\nout2\n");
}

// transformers' own loader on the export (needs torch; skipped, saying so,
// without it).
// A LoRA run (train.lora over a base `moefit init` wrote, model.path): its
// checkpoints hold the adapters; export loads the base again and merges them
// (an fp32 export evaluates to the loss of the base with the run's final/
// adapters within 1e-5), or with --adapter writes the PEFT adapter dir (the
// newest checkpoint's is the run's final/ byte for byte); a non-LoRA run has
// no adapters to export, and a base that changed under model.path is refused.
const std::string &LoraRun() {
  static std::string run;
  if (!run.empty()) return run;
  const std::string base = tmpdir() + "/export_lora_base";
  EXPECT_EQ(moefit("init --family qwen2_moe --preset tiny --seed 3 --out " + base).code, 0);
  run = tmpdir() + "/export_lora_run";
  Result r = moefit("train" + kModel + "model.init=null model.path=" + base +
                    " train.lora.rank=4 train.lora.alpha=8 train.lr=1e-2 "
                    "train.lora.targets=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj] "
                    "train.micro_batch=2 train.warmup=1 train.steps=4 output.checkpoint_every=2 "
                    "data.train=" +
                    Corpus() + " output.dir=" + run);
  EXPECT_EQ(r.code, 0) << r.out;
  return run;
}

// The same over each MoE layer's hottest quarter of experts (train.lora.experts
// hot) by the routing LoraRun measured: the shared expert's and the dense
// layers' projections adapted whole, the routed experts' only where hot.
const std::string &LoraHotRun() {
  static std::string run;
  if (!run.empty()) return run;
  const std::string routing = LoraRun() + "/routing.json";
  run = tmpdir() + "/export_lora_hot_run";
  Result r = moefit("train" + kModel + "model.init=null model.path=" + tmpdir() +
                    "/export_lora_base train.lora.rank=4 train.lora.alpha=8 train.lr=1e-2 "
                    "train.lora.targets=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj] "
                    "train.lora.experts=hot memory.routing=" +
                    routing + " train.micro_batch=2 train.warmup=1 train.steps=4 output.checkpoint_every=2 " +
                    "data.train=" + Corpus() + " output.dir=" + run);
  EXPECT_EQ(r.code, 0) << r.out;
  return run;
}

double LoraEvalLoss(const std::string &model_dir) {
  return EvalLoss(model_dir, "model.init=null model.path=" + tmpdir() + "/export_lora_base");
}

TEST(Export, LoraMergedModelAndPeftAdapter) {
  const std::string run = LoraRun(), merged = tmpdir() + "/export_lora_merged",
                    ad = tmpdir() + "/export_lora_ad";
  Result m = moefit("export " + run + " --out " + merged + " --dtype fp32");
  ASSERT_EQ(m.code, 0) << m.out;
  EXPECT_TRUE(has(m.out, "exported " + run + "/checkpoints/step-000004 -> " + merged)) << m.out;
  const double lm = LoraEvalLoss(merged),
               lf = LoraEvalLoss(run + "/final");  // merged; base + final/'s adapters
  EXPECT_NEAR(lm, lf, 1e-5 * lf) << "the merged export is the run's final model";
  Result a = moefit("export " + run + " --out " + ad + " --adapter");
  ASSERT_EQ(a.code, 0) << a.out;
  for (const char *f : {"adapter_model.safetensors", "adapter_config.json"}) {
    EXPECT_FALSE(read_file(ad + "/" + f).empty()) << f;
    EXPECT_EQ(read_file(ad + "/" + f), read_file(run + "/final/" + f)) << f;
  }
  const std::string cfg = read_file(ad + "/adapter_config.json");
  EXPECT_TRUE(has(cfg, "\"peft_type\": \"LORA\"") && has(cfg, "\"r\": 4") && has(cfg, "\"lora_alpha\": 8") &&
              has(cfg, "\"base_model_name_or_path\": \"" + tmpdir() + "/export_lora_base\""))
      << cfg;
  mf_safetensors *st = nullptr;
  ASSERT_EQ(mf_safetensors_open((ad + "/adapter_model.safetensors").c_str(), &st), MF_OK) << mf_last_error();
  EXPECT_EQ(mf_safetensors_count(st), 76u) << "38 adapted weights, A and B each";
  EXPECT_NE(mf_safetensors_find(st, "base_model.model.model.layers.1.mlp.experts.0.gate_proj.lora_A.weight"),
            nullptr);
  EXPECT_NE(mf_safetensors_find(st, "base_model.model.model.layers.0.self_attn.o_proj.lora_B.weight"),
            nullptr);
  mf_safetensors_close(st);
  // The older checkpoint's adapters are its own.
  Result a2 = moefit("export " + run + "/checkpoints/step-000002 --out " + ad + "2 --adapter");
  ASSERT_EQ(a2.code, 0) << a2.out;
  EXPECT_NE(read_file(ad + "2/adapter_model.safetensors"), read_file(ad + "/adapter_model.safetensors"));
  // No adapters in a run that trained every weight.
  Result n = moefit("export " + DemoRun() + " --out " + tmpdir() + "/export_no_ad --adapter");
  EXPECT_EQ(n.code, 1) << n.out;
  EXPECT_TRUE(has(n.out, "is not a LoRA run's (train.lora.rank 0): it has no adapters")) << n.out;
  // Another base under model.path: refused, naming the checkpoint's record.
  const std::string base = tmpdir() + "/export_lora_base";
  ASSERT_EQ(moefit("init --family qwen2_moe --preset tiny --seed 4 --out " + base + "_other").code, 0);
  ASSERT_EQ(shell("mv " + base + " " + base + "_kept && mv " + base + "_other " + base).code, 0);
  Result b = moefit("export " + run + " --out " + tmpdir() + "/export_lora_other");
  ASSERT_EQ(shell("rm -rf " + base + " && mv " + base + "_kept " + base).code, 0);
  EXPECT_EQ(b.code, 1) << b.out;
  EXPECT_TRUE(has(b.out, "state.json: base_sum: the checkpoint's adapters were trained on a base")) << b.out;
  EXPECT_NE(access((tmpdir() + "/export_lora_other").c_str(), F_OK), 0) << "nothing left behind";
}

// Where a python with PEFT is at hand (MF_HF_PYTHON): PeftModel.from_pretrained
// loads the exported adapter onto the base and reproduces moefit's logits
// (tools/check_peft_adapter.py, relative error < 1e-5).
void PeftReproducesTheLogits(const std::string &run, const std::string &tag) {
  const char *py = getenv("MF_HF_PYTHON");
  if (!py || !*py) MF_TOOL_MISSING("MF_HF_PYTHON unset: no python with transformers and peft");
  if (shell(std::string(py) + " -c 'import torch, transformers, peft' 2>&1").code != 0)
    MF_TOOL_MISSING(py << " has no torch, transformers and peft");
  const std::string ad = tmpdir() + "/export_" + tag + "_peft", d = tmpdir() + "/export_" + tag + "_check";
  ASSERT_EQ(moefit("export " + run + " --out " + ad + " --adapter").code, 0);
  ASSERT_EQ(shell("mkdir -p " + d + " && printf 'the cat s' > " + d + "/in.txt").code, 0);
  ASSERT_EQ(moefit("data bytes " + d + "/in.txt " + d + "/in.tokens").code, 0);
  Result e =
      moefit("eval" + kModel + "model.init=null model.path=" + tmpdir() +
             "/export_lora_base data.seq_len=8 train.micro_batch=1 --tokens " + d + "/in.tokens --model " +
             run + "/final --dump-logits " + d + "/logits.f32 output.dir=" + d + "/ev");
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_TRUE(has(e.out, "with the LoRA adapters of " + run + "/final")) << e.out;
  Result w = shell(std::string(py) +
                   " -c \"import numpy as np; from safetensors.numpy import save_file; "
                   "ids = np.frombuffer(b'the cat ', dtype=np.uint8).astype('<i4')[None]; "
                   "lg = np.fromfile('" +
                   d +
                   "/logits.f32', dtype='<f4').reshape(1, 8, -1); "
                   "save_file({'input_ids': ids, 'logits': lg}, '" +
                   d + "/ref.safetensors')\" 2>&1");
  ASSERT_EQ(w.code, 0) << w.out;
  Result c = shell(std::string(py) + " tools/check_peft_adapter.py --base " + tmpdir() +
                   "/export_lora_base --adapter " + ad + " --fixture " + d + "/ref.safetensors 2>&1");
  EXPECT_EQ(c.code, 0) << c.out;
  EXPECT_TRUE(has(c.out, "OK")) << c.out;
}

TEST(Export, PeftLoadsTheAdapterAndReproducesTheLogits) {
  PeftReproducesTheLogits(LoraRun(), "lora");
}

// Hot experts: target_modules names the shared expert's, the dense layers'
// and the hot experts' projections by their full names, which PEFT matches
// exactly (and moefit reads back as the same hot set: eval above).
TEST(Export, PeftLoadsTheHotExpertsAdapterAndReproducesTheLogits) {
  const std::string cfg = read_file(LoraHotRun() + "/final/adapter_config.json");
  EXPECT_TRUE(has(cfg, "\"q_proj\"") && has(cfg, ".mlp.shared_expert.gate_proj\"") &&
              !has(cfg, "\"gate_proj\""))
      << cfg;
  PeftReproducesTheLogits(LoraHotRun(), "lora_hot");
}

TEST(Export, TransformersLoadsItWithNoMissingOrUnexpectedKeys) {
  const char *py = getenv("MF_HF_PYTHON");
  if (!py || !*py) MF_TOOL_MISSING("MF_HF_PYTHON unset: no python with transformers");
  if (shell(std::string(py) + " -c 'import torch, transformers' 2>&1").code != 0)
    MF_TOOL_MISSING(py << " has no torch (transformers needs it to load a model)");
  const std::string dir = tmpdir() + "/export_hf";
  ASSERT_EQ(moefit("export " + DemoRun() + " --out " + dir + " --dtype bf16 --shard-size 300KB").code, 0);
  Result r = shell(std::string(py) +
                   " -c \"import sys, transformers as t; m, info = "
                   "t.AutoModelForCausalLM.from_pretrained(sys.argv[1], output_loading_info=True); "
                   "print('missing', info['missing_keys'], 'unexpected', info['unexpected_keys'])\" " +
                   dir + " 2>&1");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, "missing [] unexpected []")) << r.out;
}

// GLM-4.5 (glm4_moe), DeepSeek-V3 (deepseek_v3) and gpt-oss (gpt_oss): a full
// fine-tune of the tiny preset exported loads in transformers with no missing
// or unexpected keys (GLM-4.5's and DeepSeek-V3's routers'
// e_score_correction_bias included: a buffer of the checkpoint, carried through
// untrained; gpt-oss's experts as its fused tensors) and gives the logits
// moefit eval gives on the export. DeepSeek-V3's preset has latent attention
// with a low-rank q and interleaved RoPE.
struct HfExportCase {
  std::string family, arch;
  std::string train;  // the family's train (and eval) overrides
  std::string dtype;  // the export's --dtype ("": its default, bf16)
  std::string text;   // the bytes read: eval's data.seq_len is their length - 1
  std::string probe;  // a python expression of the loaded model m, printed after "probe "
  std::string want;   // what the probe must print
};

void TransformersGivesTheExportsLogits(const HfExportCase &c) {
  const char *py = getenv("MF_HF_PYTHON");
  if (!py || !*py) MF_TOOL_MISSING("MF_HF_PYTHON unset: no python with transformers");
  if (shell(std::string(py) + " -c 'import torch, transformers' 2>&1").code != 0)
    MF_TOOL_MISSING(py << " has no torch (transformers needs it to load a model)");
  const std::string &family = c.family;
  const std::string base = tmpdir() + "/export_" + family + "_base",
                    run = tmpdir() + "/export_" + family + "_run",
                    hf = tmpdir() + "/export_" + family + "_hf",
                    d = tmpdir() + "/export_" + family + "_check";
  ASSERT_EQ(moefit("init --family " + family + " --preset tiny --seed 6 --out " + base).code, 0);
  Result t = moefit("train" + kModel + "model.init=null model.path=" + base + c.train +
                    " train.micro_batch=2 train.warmup=1 train.steps=3 train.lr=1e-2 "
                    "data.train=" +
                    Corpus() + " output.dir=" + run);
  ASSERT_EQ(t.code, 0) << t.out;
  ASSERT_EQ(moefit("export " + run + " --out " + hf + (c.dtype.empty() ? "" : " --dtype " + c.dtype)).code,
            0);
  ASSERT_EQ(shell("mkdir -p " + d).code, 0);
  write_file(d + "/in.txt", c.text);
  ASSERT_EQ(moefit("data bytes " + d + "/in.txt " + d + "/in.tokens").code, 0);
  Result e = moefit("eval" + kModel + "model.init=null model.path=" + hf + c.train +
                    " data.seq_len=" + std::to_string(c.text.size() - 1) + " train.micro_batch=1 --tokens " +
                    d + "/in.tokens --dump-logits " + d + "/logits.f32 output.dir=" + d + "/ev");
  ASSERT_EQ(e.code, 0) << e.out;
  const std::string probe = "print('probe', " + c.probe + "); ";
  Result r = shell(
      std::string(py) +
      " -c \"import sys, numpy as np, torch, transformers as t; "
      "m, info = t.AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32, "
      "attn_implementation='eager', output_loading_info=True); m.eval(); "
      "print(type(m).__name__, 'missing', info['missing_keys'], 'unexpected', info['unexpected_keys']); "
      "ids = torch.tensor([list(open(sys.argv[3], 'rb').read()[:-1])]); "
      "ref = m(input_ids=ids).logits[0].detach().numpy(); "
      "got = np.fromfile(sys.argv[2], dtype='<f4').reshape(ref.shape); "
      "err = np.linalg.norm(got - ref) / np.linalg.norm(ref); " +
      probe + "print('rel err %.3g' % err, 'OK' if err < 1e-5 else 'DIFFERS')\" " + hf + " " + d +
      "/logits.f32 " + d + "/in.txt 2>&1");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, c.arch + " missing [] unexpected []")) << r.out;
  EXPECT_TRUE(has(r.out, "probe " + c.want)) << r.out;
  EXPECT_TRUE(has(r.out, "OK")) << r.out;
}

// the demo config sets train.aux_loss_coef, which these families' loss has not (refused, naming it)
const char kNoAux[] = " train.aux_loss_coef=null";
const char kRouterBias[] = "tuple(m.model.layers[1].mlp.gate.e_score_correction_bias.shape)";

TEST(Export, TransformersLoadsAGlm4MoeExportAndGivesItsLogits) {
  TransformersGivesTheExportsLogits(
      {"glm4_moe", "Glm4MoeForCausalLM", kNoAux, "", "the cat s", kRouterBias, "(8,)"});
}

TEST(Export, TransformersLoadsADeepseekV3ExportAndGivesItsLogits) {
  TransformersGivesTheExportsLogits(
      {"deepseek_v3", "DeepseekV3ForCausalLM", kNoAux, "", "the cat s", kRouterBias, "(8,)"});
}

// gpt-oss, exported in fp32: the experts as transformers' fused tensors
// (gate_up_proj [E, H, 2I], gate and up interleaved), the sinks, the biases;
// 96 tokens, past the preset's sliding window of 64 in layer 0 (transformers
// gives other logits past row 64 with that layer's window dropped).
TEST(Export, TransformersLoadsAGptOssExportAndGivesItsLogits) {
  const std::string text = std::string(
                               "The cat sat on the mat; a quick brown fox jumps over the lazy dog, and then "
                               "the cat ran far away, ")
                               .substr(0, 97);
  TransformersGivesTheExportsLogits({"gpt_oss", "GptOssForCausalLM", "", "fp32", text,
                                     "tuple(m.model.layers[0].mlp.experts.gate_up_proj.shape), "
                                     "tuple(m.model.layers[0].self_attn.sinks.shape), "
                                     "m.config.layer_types[0], m.config.sliding_window",
                                     "(8, 64, 256) (4,) sliding_attention 64"});
}

// The export is a whole model: the tokenizer and chat-template files of the
// run's model.path are copied into it byte for byte (a link followed, a file
// that is not a tokenizer's left out), for a full fine-tune and for a LoRA
// run's merged model and adapter dir; a model.init run says it has none; a
// tokenizer file that cannot be read fails the export with nothing left.
const char *const kTokenizerFiles[] = {
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",   "vocab.json",
    "merges.txt",     "added_tokens.json",     "chat_template.jinja",     "chat_template.json"};

void ExpectTokenizerCopied(const std::string &base, const std::string &out) {
  for (const char *f : kTokenizerFiles) {
    const std::string want = read_file(base + "/" + f);
    EXPECT_FALSE(want.empty()) << base << "/" << f;
    EXPECT_EQ(read_file(out + "/" + f), want) << out << "/" << f << " is not " << base << "/" << f;
  }
  EXPECT_NE(access((out + "/README.md").c_str(), F_OK), 0) << "only the tokenizer's files are copied";
}

// An init'd base (tokenizer.json, tokenizer_config.json, special_tokens_map.json)
// with the other tokenizer files a Hugging Face dir may hold: tokenizer.model
// binary (NUL and high bytes) and a link to a blob, as a hub cache's snapshot.
std::string TokenizerBase() {
  static std::string base;
  if (!base.empty()) return base;
  base = tmpdir() + "/export_tok_base";
  EXPECT_EQ(moefit("init --family qwen3_moe --preset tiny --seed 5 --out " + base).code, 0);
  std::string binary("\x00\x01\xff\xfe sentencepiece\x00\n", 19);
  write_file(base + "/blob-tokenizer-model", binary);
  EXPECT_EQ(shell("ln -s blob-tokenizer-model " + base + "/tokenizer.model").code, 0);
  write_file(base + "/vocab.json", "{\"a\": 0, \"b\": 1}");
  write_file(base + "/merges.txt", "#version: 0.2\na b\n");
  write_file(base + "/added_tokens.json", "{\"<|extra|>\": 300}\n");
  write_file(base + "/chat_template.jinja", "{% for m in messages %}{{ m['content'] }}{% endfor %}\r\n");
  write_file(base + "/chat_template.json", "{\"chat_template\": \"{{ messages }}\"}");
  write_file(base + "/README.md", "not a tokenizer file\n");
  return base;
}

TEST(Export, CopiesTheBaseTokenizerIntoAFullFineTunesExport) {
  const std::string base = TokenizerBase(), run = tmpdir() + "/export_tok_full",
                    out = tmpdir() + "/export_tok_full_hf";
  Result t = moefit("train" + kModel + "model.init=null model.path=" + base +
                    " train.micro_batch=2 train.warmup=1 train.steps=2 data.train=" + Corpus() +
                    " output.dir=" + run);
  ASSERT_EQ(t.code, 0) << t.out;
  Result e = moefit("export " + run + " --out " + out + " --shard-size 300KB");
  ASSERT_EQ(e.code, 0) << e.out;
  ExpectTokenizerCopied(base, out);
  EXPECT_TRUE(
      has(e.out,
          "  tokenizer: tokenizer.json, tokenizer_config.json, special_tokens_map.json, tokenizer.model, "
          "vocab.json, merges.txt, added_tokens.json, chat_template.jinja, chat_template.json (copied from " +
              base + ")\n"))
      << e.out;
  struct stat sb;
  ASSERT_EQ(lstat((out + "/tokenizer.model").c_str(), &sb), 0);
  EXPECT_TRUE(S_ISREG(sb.st_mode)) << "the link's bytes, not the link";

  // A tokenizer file that cannot be read: the export fails naming it, and
  // leaves neither the dir nor its temporary sibling.
  const std::string bad = tmpdir() + "/export_tok_bad";
  ASSERT_EQ(
      shell("mv " + base + "/chat_template.jinja " + base + "/kept && mkdir " + base + "/chat_template.jinja")
          .code,
      0);
  Result b = moefit("export " + run + " --out " + bad);
  ASSERT_EQ(
      shell("rmdir " + base + "/chat_template.jinja && mv " + base + "/kept " + base + "/chat_template.jinja")
          .code,
      0);
  EXPECT_EQ(b.code, 1) << b.out;
  EXPECT_TRUE(has(b.out, base + "/chat_template.jinja: not a regular file")) << b.out;
  EXPECT_EQ(shell("ls -d " + bad + "* 2>/dev/null").out, "") << "nothing left behind";
}

TEST(Export, CopiesTheBaseTokenizerIntoALoraRunsMergedModelAndAdapterDir) {
  const std::string base = tmpdir() + "/export_lora_base", merged = tmpdir() + "/export_tok_lora_merged",
                    ad = tmpdir() + "/export_tok_lora_ad";
  Result m = moefit("export " + LoraRun() + " --out " + merged);
  ASSERT_EQ(m.code, 0) << m.out;
  Result a = moefit("export " + LoraRun() + " --out " + ad + " --adapter");
  ASSERT_EQ(a.code, 0) << a.out;
  for (const std::string &d : {merged, ad})
    for (const char *f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}) {
      EXPECT_FALSE(read_file(base + "/" + f).empty()) << "moefit init writes " << f;
      EXPECT_EQ(read_file(d + "/" + f), read_file(base + "/" + f)) << d << "/" << f;
    }
  const std::string line =
      "  tokenizer: tokenizer.json, tokenizer_config.json, special_tokens_map.json (copied from " + base +
      ")\n";
  EXPECT_TRUE(has(m.out, line)) << m.out;
  EXPECT_TRUE(has(a.out, line)) << a.out;
}

TEST(Export, AModelInitRunSaysItHasNoTokenizer) {
  const std::string out = tmpdir() + "/export_tok_init";
  Result e = moefit("export " + DemoRun() + " --out " + out);
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_TRUE(has(e.out,
                  "\n  no tokenizer: the run's model came from model.init (random weights, no tokenizer "
                  "files to copy)\n"))
      << e.out;
  for (const char *f : kTokenizerFiles) EXPECT_NE(access((out + "/" + f).c_str(), F_OK), 0) << f;
}

}  // namespace
