// The training loop end to end on a tiny model: it learns (the loss falls below
// the corpus's unigram entropy), two runs with the same seed give the same bits,
// and 1 and 2 threads give the same bits; metrics.jsonl and the final weights
// are written; eval reads the weights back.
#include <gtest/gtest.h>

#include <dirent.h>
#include <sys/stat.h>

#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <jansson.h>

#include "kernels/registry.h"
#include "planner/hwprofile.h"
#include "planner/plan.h"
#include "planner/run_plan.h"
#include "src/config/config.h"
#include "src/core/core.h"
#include "src/train/train.h"
#include "src/io/tokens.h"
#include "src/model/params.h"
#include "src/model/program.h"

namespace {

std::string tmp() {
  const char *t = getenv("TEST_TMPDIR");
  return t ? t : "/tmp";
}

// A small corpus with structure a model can learn: repeated phrases.
std::string make_corpus() {
  static std::string path;
  if (!path.empty()) return path;
  path = tmp() + "/corpus.tokens";
  mf_tokens_writer *w = nullptr;
  EXPECT_EQ(mf_tokens_writer_create(path.c_str(), 64, 2, 0, &w), MF_OK) << mf_last_error();
  const char *phrases[] = {"the cat sat on the mat. ", "a dog ran in the park. ", "birds sing at dawn. "};
  uint32_t state = 7;
  for (int i = 0; i < 600; i++) {
    state = state * 1103515245u + 12345u;
    const char *s = phrases[(state >> 16) % 3];
    std::vector<uint32_t> ids;
    for (const char *c = s; *c; c++) ids.push_back((uint32_t)(*c) % 64);
    EXPECT_EQ(mf_tokens_writer_append(w, ids.data(), nullptr, ids.size()), MF_OK);
  }
  EXPECT_EQ(mf_tokens_writer_end_document(w), MF_OK);
  EXPECT_EQ(mf_tokens_writer_finish(w), MF_OK) << mf_last_error();
  mf_tokens_writer_free(w);
  return path;
}

mf_config *config(const std::string &out, int threads, int steps = 40, const char *memory = nullptr) {
  std::string corpus = make_corpus();
  std::ostringstream y;
  y << "model:\n  init: {family: mixtral, hidden: 32, layers: 2, heads: 4, kv_heads: 2, experts: 4, top_k: 2,\n"
       "         expert_ffn: 32, vocab: 64, max_seq: 32, seed: 5}\n"
    << "data: {train: " << corpus << ", valid: " << corpus << ", seq_len: 32}\n"
    << "train: {micro_batch: 4, grad_accum: 2, steps: " << steps
    << ", lr: 1e-2, warmup: " << (steps < 5 ? steps : 5) << ", weight_decay: 0.01, log_every: 10, threads: " << threads << "}\n"
    << "output: {dir: " << out << "}\nbackend: cpu\n";
  if (memory) y << "memory: " << memory << "\nhardware: {profile: configs/hw/cpu-2core.yaml}\n";
  std::string text = y.str();
  mf_config *cfg = nullptr;
  EXPECT_EQ(mf_config_load_string(text.c_str(), text.size(), "test.yaml", nullptr, 0, &cfg), MF_OK) << mf_last_error();
  return cfg;
}

std::string slurp(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// metrics.jsonl without the timing fields, which differ run to run.
std::string losses_of(const std::string &metrics) {
  std::string out;
  std::istringstream in(metrics);
  std::string line;
  while (std::getline(in, line)) {
    size_t a = line.find("\"loss\""), b = line.find("\"lr\"");
    if (a != std::string::npos && b != std::string::npos) out += line.substr(a, b - a) + "\n";
  }
  return out;
}

TEST(Train, LearnsAndIsDeterministic) {
  mf_train_summary a, b, c;
  mf_config *ca = config(tmp() + "/run_a", 2), *cb = config(tmp() + "/run_b", 2), *cc = config(tmp() + "/run_c", 1);
  ASSERT_EQ(mf_train(ca, 1, &a), MF_OK) << mf_last_error();
  ASSERT_EQ(mf_train(cb, 1, &b), MF_OK) << mf_last_error();
  ASSERT_EQ(mf_train(cc, 1, &c), MF_OK) << mf_last_error();
  EXPECT_EQ(a.steps, 40);
  EXPECT_EQ(a.skipped, 0);
  EXPECT_LT(a.final_loss, a.first_loss - 1.0);
  EXPECT_LT(a.valid_loss, a.entropy_nats) << "the model should beat the unigram entropy";
  // Same seed, same bits; 1 and 2 threads, same bits.
  EXPECT_EQ(a.final_loss, b.final_loss);
  EXPECT_EQ(a.valid_loss, c.valid_loss);
  std::string wa = slurp(tmp() + "/run_a/final/model.safetensors");
  ASSERT_FALSE(wa.empty());
  EXPECT_EQ(wa, slurp(tmp() + "/run_b/final/model.safetensors"));
  EXPECT_EQ(wa, slurp(tmp() + "/run_c/final/model.safetensors"));
  std::string ma = slurp(tmp() + "/run_a/metrics.jsonl");
  EXPECT_NE(ma.find("\"step\":40"), std::string::npos) << ma;
  EXPECT_NE(ma.find("\"aux_loss\""), std::string::npos);
  EXPECT_NE(ma.find("\"tokens_per_s\""), std::string::npos);
  EXPECT_EQ(losses_of(ma), losses_of(slurp(tmp() + "/run_c/metrics.jsonl")));

  // eval reads the trained weights back (OUTPUT/final) and agrees with training's last validation.
  mf_eval_opts eo = {nullptr, nullptr, nullptr};
  mf_eval_result er;
  ASSERT_EQ(mf_eval(ca, &eo, &er), MF_OK) << mf_last_error();
  EXPECT_EQ(er.loss, a.valid_loss);
  EXPECT_NEAR(er.perplexity, std::exp(er.loss), 1e-9 * er.perplexity);
  mf_config_free(ca);
  mf_config_free(cb);
  mf_config_free(cc);
}

// A device budget too small for everything resident: the planner streams
// weights and recomputes or offloads activations, and training gives the same
// bits as with everything resident (plan invariance over 5 steps).
TEST(Train, PlannedRunMatchesResidentRun) {
  mf_train_summary a, b;
  mf_config *ca = config(tmp() + "/run_resident", 2, 5);
  ASSERT_EQ(mf_train(ca, 1, &a), MF_OK) << mf_last_error();
  mf_config *cb = config(tmp() + "/run_planned", 2, 5, "{device_budget: 700KiB}");
  ASSERT_EQ(mf_train(cb, 1, &b), MF_OK) << mf_last_error();
  EXPECT_EQ(a.final_loss, b.final_loss);
  EXPECT_EQ(a.valid_loss, b.valid_loss);
  EXPECT_EQ(slurp(tmp() + "/run_resident/final/model.safetensors"), slurp(tmp() + "/run_planned/final/model.safetensors"));
  mf_config_free(ca);
  mf_config_free(cb);
  // Below the least-memory plan: an error that says what the minimum is.
  mf_config *cc = config(tmp() + "/run_tiny", 2, 5, "{device_budget: 8KiB}");
  EXPECT_EQ(mf_train(cc, 1, &b), MF_ERR_CONFIG);
  EXPECT_NE(std::string(mf_last_error()).find("below the minimum"), std::string::npos) << mf_last_error();
  mf_config_free(cc);
}

// backend: cuda on a machine without a GPU (or a build without the toolkit):
// a clean error naming the backend, no run started — after the plan it would
// have run is written to OUTPUT/plan.json. (On a GPU machine tools/gpu_check.sh
// runs the demo on cuda.)
TEST(Train, CudaBackendWithoutAGpuIsACleanError) {
  const char *found = nullptr;
  ASSERT_EQ(mf_backend_resolve("auto", &found), MF_OK);
  if (std::string(found) == "cuda") GTEST_SKIP() << "a GPU is present";
  mf_config *cfg = config(tmp() + "/run_cuda", 2, 2);
  ASSERT_NE(cfg, nullptr);
  cfg->backend = MF_CONFIG_BACKEND_CUDA;
  mf_train_summary sum;
  const mf_status st = mf_train(cfg, 1, &sum);
  mf_config_free(cfg);
  EXPECT_TRUE(st == MF_ERR_NO_DEVICE || st == MF_ERR_UNSUPPORTED) << mf_status_name(st);
  EXPECT_NE(std::string(mf_last_error()).find("backend: cuda"), std::string::npos) << mf_last_error();
  EXPECT_EQ(sum.steps, 0);
  EXPECT_FALSE(slurp(tmp() + "/run_cuda/plan.json").empty()) << "the plan is written before the backend starts";
}

// memory.nvme_dir: past memory.host_limit the plan's host accounting spills
// the AdamW moments, then the master weights, then the gradient sums, and the
// run keeps those in (unlinked) files there — the same bits as in memory, for
// a host limit that spills only the moments and for one that spills all three.
TEST(Train, HostStateSpilledToNvmeGivesTheSameBits) {
  // The bundled cpu profile has no NVMe (no spill possible): one that has.
  const std::string profile = tmp() + "/cpu-nvme.yaml";
  {
    std::ofstream f(profile);
    f << slurp("configs/hw/cpu-2core.yaml") << "nvme: {bandwidth: 1GB}\n";
  }
  const std::string nvme = tmp() + "/nvme";
  ASSERT_EQ(mkdir(nvme.c_str(), 0755), 0);
  mf_config *ref = config(tmp() + "/run_spill_ref", 2, 5, "{device_budget: 700KiB}");
  mf_train_summary a;
  ASSERT_EQ(mf_train(ref, 1, &a), MF_OK) << mf_last_error();
  mf_config_free(ref);
  // The model has 35k parameters: 140 KB of master weights, as much of
  // gradients, 280 KB of moments. 300 KB of host spills the moments only;
  // 16 KB all three — gradient sums spill only when they land home once a
  // step, so that run is layer-major (the same bits: order_test).
  for (const char *limit : {"300KB", "16KB"}) {
    SCOPED_TRACE(limit);
    const std::string dir = tmp() + "/run_spill_" + limit;
    mf_config *cfg = config(dir, 2, 5,
                            ("{device_budget: 700KiB, host_limit: " + std::string(limit) + ", nvme_dir: " + nvme + "}")
                                .c_str());
    ASSERT_NE(cfg, nullptr);
    free(cfg->hardware.profile);
    cfg->hardware.profile = strdup(profile.c_str());
    const bool all = std::string(limit) == "16KB";
    if (all) cfg->train.micro_batch_order = MF_CONFIG_MB_ORDER_LAYER;
    FILE *log = tmpfile();
    mf_log_set_level(MF_LOG_INFO);
    mf_log_set_stream(log);
    mf_train_summary b;
    const mf_status st = mf_train(cfg, 0, &b);
    mf_log_set_stream(nullptr);
    std::string text(ftell(log) > 0 ? (size_t)ftell(log) : 0, '\0');
    rewind(log);
    if (!text.empty()) {
      EXPECT_EQ(fread(&text[0], 1, text.size(), log), text.size());
    }
    fclose(log);
    mf_config_free(cfg);
    ASSERT_EQ(st, MF_OK) << mf_last_error();
    EXPECT_NE(text.find("host state on NVMe (" + nvme), std::string::npos) << text;
    EXPECT_NE(text.find("AdamW moments"), std::string::npos) << text;
    EXPECT_EQ(text.find("master weights") != std::string::npos, all) << text;
    EXPECT_EQ(text.find("gradient sums") != std::string::npos, all) << text;
    EXPECT_EQ(a.final_loss, b.final_loss);
    EXPECT_EQ(a.valid_loss, b.valid_loss);
    EXPECT_EQ(slurp(tmp() + "/run_spill_ref/final/model.safetensors"), slurp(dir + "/final/model.safetensors"));
    EXPECT_EQ(losses_of(slurp(tmp() + "/run_spill_ref/metrics.jsonl")), losses_of(slurp(dir + "/metrics.jsonl")));
  }
  // Nothing left behind in the directory.
  DIR *d = opendir(nvme.c_str());
  ASSERT_NE(d, nullptr);
  int entries = 0;
  while (struct dirent *e = readdir(d))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) entries++;
  closedir(d);
  EXPECT_EQ(entries, 0);
}

// A planned run reports its streams in metrics.jsonl: busy within the step,
// bytes each way and the peak equal to the plan's schedule; and the summary's
// predicted step is the plan's simulated one.
TEST(Train, StreamMetricsMatchThePlan) {
  mf_config *cfg = config(tmp() + "/run_streams", 2, 12, "{device_budget: 700KiB}");
  ASSERT_NE(cfg, nullptr);
  mf_train_summary sum;
  ASSERT_EQ(mf_train(cfg, 1, &sum), MF_OK) << mf_last_error();

  // The plan train follows: the run plan of the same config.
  mf_param_table *t = nullptr;
  ASSERT_EQ(mf_param_table_build(&cfg->model.init, &t), MF_OK) << mf_last_error();
  mf_run_plan *rp = nullptr;
  ASSERT_EQ(mf_run_plan_make(cfg, t, MF_RUN_TRAIN, 1, &rp), MF_OK) << mf_last_error();
  const mf_plan *plan = rp->plan;
  const mf_schedule *s = plan->s;
  ASSERT_GT(s->h2d_bytes, 0u) << "the budget should make the plan stream";
  EXPECT_EQ(sum.predicted_step_s, plan->sim.step_seconds);
  EXPECT_GT(sum.executed_step_s, 0.0);

  std::istringstream in(slurp(tmp() + "/run_streams/metrics.jsonl"));
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    json_error_t err;
    json_t *j = json_loads(line.c_str(), 0, &err);
    ASSERT_NE(j, nullptr) << err.text << ": " << line;
    auto num = [&](const char *k) {
      json_t *v = json_object_get(j, k);
      EXPECT_TRUE(v && json_is_number(v)) << k << " in " << line;
      return v && json_is_number(v) ? json_number_value(v) : NAN;
    };
    const double step_s = num("step_s");
    double busy_sum = 0;
    for (const char *st : {"compute", "h2d", "d2h"}) {
      const double busy = num((std::string(st) + "_busy_s").c_str()), idle = num((std::string(st) + "_idle_s").c_str());
      EXPECT_GE(busy, 0.0) << st;
      EXPECT_LE(busy, step_s) << st;
      EXPECT_NEAR(idle, step_s - busy, 1e-8 * step_s) << st;  // each written to 9 digits
      busy_sum += busy;
    }
    EXPECT_GT(num("compute_busy_s"), 0.0);
    EXPECT_GT(num("h2d_busy_s"), 0.0);
    EXPECT_LE(busy_sum, step_s) << "one timeline on the cpu backend";
    // The schedule's copies, less those of experts no token reached (src/exec/exec.h).
    EXPECT_LE(num("h2d_bytes"), (double)s->h2d_bytes);
    EXPECT_GT(num("h2d_bytes"), 0.5 * (double)s->h2d_bytes);
    EXPECT_LE(num("d2h_bytes"), (double)s->d2h_bytes);
    EXPECT_GT(num("d2h_bytes"), 0.5 * (double)s->d2h_bytes);
    EXPECT_EQ(num("peak_device_bytes"), (double)s->peak_live_bytes);
    EXPECT_GE(num("optimizer_hidden_s"), 0.0);
    EXPECT_GE(num("optimizer_exposed_s"), 0.0);
    json_decref(j);
    n++;
  }
  EXPECT_GE(n, 2);  // steps 1, 10, 12
  mf_run_plan_free(rp);
  mf_param_table_free(t);
  mf_config_free(cfg);
}

TEST(Train, BadInputsAreErrors) {
  mf_config *cfg = config(tmp() + "/run_bad", 1, 2);
  free(cfg->data.train);
  cfg->data.train = strdup((tmp() + "/missing.tokens").c_str());
  mf_train_summary s;
  EXPECT_NE(mf_train(cfg, 1, &s), MF_OK);
  EXPECT_NE(std::string(mf_last_error()).find("missing.tokens"), std::string::npos) << mf_last_error();
  mf_config_free(cfg);
  // backend: cuda without a GPU: CudaBackendWithoutAGpuIsACleanError.
}

// A stop request (what the CLI's SIGINT/SIGTERM handlers make) through the C
// API: the step under way finishes, a checkpoint of it, MF_OK with
// stop_signal and no final weights; cleared, a resume goes to the end. An
// evaluation stops after its first batch.
TEST(Train, StopRequestEndsTheRunWithACheckpoint) {
  const std::string out = tmp() + "/stop_request";
  mf_config *cfg = config(out, 1, 6);
  ASSERT_NE(cfg, nullptr);
  mf_train_summary s;
  mf_stop_request(SIGTERM);
  const mf_status st = mf_train(cfg, 1, &s);
  mf_stop_clear();
  ASSERT_EQ(st, MF_OK) << mf_last_error();
  EXPECT_EQ(s.stop_signal, SIGTERM);
  EXPECT_EQ(s.steps, 1);
  EXPECT_EQ(std::string(s.checkpoint_dir), out + "/checkpoints/step-000001");
  EXPECT_TRUE(std::ifstream(out + "/checkpoints/step-000001/COMPLETE").good());
  EXPECT_FALSE(std::ifstream(out + "/final/model.safetensors").good());
  ASSERT_EQ(mf_train_resume(cfg, nullptr, 1, &s), MF_OK) << mf_last_error();
  EXPECT_EQ(s.stop_signal, 0);
  EXPECT_EQ(s.steps, 6);
  EXPECT_TRUE(std::ifstream(out + "/final/model.safetensors").good());
  mf_eval_opts o = {nullptr, nullptr, nullptr};
  mf_eval_result whole, cut;
  ASSERT_EQ(mf_eval(cfg, &o, &whole), MF_OK) << mf_last_error();
  EXPECT_EQ(whole.stopped, 0);
  mf_stop_request(SIGINT);
  const mf_status se = mf_eval(cfg, &o, &cut);
  mf_stop_clear();
  ASSERT_EQ(se, MF_OK) << mf_last_error();
  EXPECT_EQ(cut.stopped, 1);
  EXPECT_EQ(cut.sequences, 4);  // one batch of train.micro_batch
  EXPECT_LT(cut.sequences, whole.sequences);
  mf_config_free(cfg);
}

}  // namespace
