// issue 28: a FIFO (mkfifo) where moefit expects a file would make open(2)
// wait for a writer forever. In place of each kind of file a user hands
// moefit — the config, data.train, model.path's model.safetensors and
// config.json, a checkpoint's state.json, a LoRA adapter's
// adapter_model.safetensors, a plan file (memory.plan), hardware.profile, a
// file to inspect — the command exits 1 at once naming the path and what it
// is (src/core mf_open_regular). Every run is under `timeout`, so a command
// that waits fails the test (status 137) instead of hanging it.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include "cli_util.h"

namespace {

constexpr int kTimeoutS = 20;  // ample under ASan on a busy machine; a FIFO opened for reading never returns

const std::string kArgs =
    " configs/demo.yaml hardware.profile=configs/hw/cpu-2core.yaml data.valid=null data.seq_len=32 "
    "train.micro_batch=2 train.warmup=1 train.steps=1 ";

std::string Corpus() {
  return text_tokens("fifo_corpus", 6000);
}

// PATH replaced by a FIFO.
void MakeFifo(const std::string &path) {
  unlink(path.c_str());
  ASSERT_EQ(mkfifo(path.c_str(), 0600), 0) << path << ": " << strerror(errno);
}

// `moefit ARGS` under a timeout: status 1 quickly, the FIFO named.
void ExpectRefused(const std::string &args, const std::string &fifo) {
  SCOPED_TRACE(args);
  const auto t0 = std::chrono::steady_clock::now();
  Result r = shell("timeout -s KILL " + std::to_string(kTimeoutS) + " ./moefit " + args + " 2>&1");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(r.code, 137) << "moefit waited on the FIFO " << fifo << " (killed after " << kTimeoutS << " s):\n"
                         << r.out;
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find(fifo + ": not a regular file but a FIFO (named pipe)"), std::string::npos) << r.out;
  printf("fifo_test: refused in %.2f s: %s\n", s, fifo.c_str());
}

TEST(Fifo, EveryFileAUserNamesIsRefusedNotWaitedOn) {
  const std::string d = fresh_dir("fifo");
  ASSERT_EQ(shell("mkdir -p " + d).code, 0);
  const std::string data = " data.train=" + Corpus();
  // A base model dir, and a LoRA run over it: a checkpoint (step 1) and an
  // adapter dir (final/).
  const std::string base = d + "/base", run = d + "/run";
  Result init = moefit("init --family mixtral --preset tiny --seed 1 --out " + base);
  ASSERT_EQ(init.code, 0) << init.out;
  const std::string lora =
      " model.init=null model.path=" + base + " train.lora.rank=4 train.lora.targets=[q_proj,v_proj]";
  Result t = moefit("train" + kArgs + data + lora + " output.dir=" + run);
  ASSERT_EQ(t.code, 0) << t.out;
  // Copies with one file each replaced by a FIFO (cp before mkfifo: cp would
  // wait on one itself).
  ASSERT_EQ(
      shell("cp -r " + base + " " + d + "/base_w && cp -r " + base + " " + d + "/base_c && cp -r " + run +
            "/checkpoints/step-000001 " + d + "/ckpt && cp -r " + run + "/final " + d + "/adapter")
          .code,
      0);
  const std::string fifo = d + "/fifo", weights = d + "/base_w/model.safetensors",
                    hf_config = d + "/base_c/config.json", state = d + "/ckpt/state.json",
                    adapter = d + "/adapter/adapter_model.safetensors", plan = d + "/plan.json";
  for (const std::string &p : {fifo, weights, hf_config, state, adapter, plan}) MakeFifo(p);

  const std::string out = " output.dir=" + d + "/out";
  ExpectRefused("train " + fifo, fifo);                                // the config
  ExpectRefused("train" + kArgs + " data.train=" + fifo + out, fifo);  // data.train
  ExpectRefused("train" + kArgs + data + " model.init=null model.path=" + d + "/base_w" + out, weights);
  ExpectRefused("train" + kArgs + data + " model.init=null model.path=" + d + "/base_c" + out, hf_config);
  ExpectRefused("train" + kArgs + data + lora + " train.steps=2" + out + " --resume " + d + "/ckpt", state);
  ExpectRefused(
      "eval" + kArgs + data + " model.init=null model.path=" + base + " --model " + d + "/adapter" + out,
      adapter);
  ExpectRefused("train" + kArgs + data + " memory.plan=" + plan + out, plan);
  ExpectRefused("plan" + kArgs + " hardware.profile=" + fifo, fifo);
  ExpectRefused("inspect " + fifo, fifo);

  // A directory where the config is expected: said so too.
  Result dir = moefit("train " + d);
  EXPECT_EQ(dir.code, 1) << dir.out;
  EXPECT_NE(
      dir.out.find(d + ": not a regular file but a directory; a config is read only from a regular file"),
      std::string::npos)
      << dir.out;
}

}  // namespace
