// src/ckpt through its C API: a checkpoint written and read back gives the
// same bits (zstd and none, fp32 and bf16 moments, the byte-plane filter on
// odd sizes, and a checkpoint written without the filter as before it
// existed); the manifest's checksums
// catch a flipped byte and a truncated file; an unfinished checkpoint (no
// COMPLETE) is refused and passed over for the previous one; keep_checkpoints
// removes the older ones; a config that changes the maths is refused.
#include "src/core/env.h"
#include "tests/ckpt/ckpt_util.h"

namespace {

TEST(CkptHash, KnownValuesAndStreaming) {
  // FNV-1a 64 over words: the empty input is the offset basis mixed with length 0.
  EXPECT_EQ(mf_ckpt_hash64("", 0), 0xcbf29ce484222325ull * 0x100000001b3ull);
  const std::string s = "the quick brown fox jumps over the lazy dog, twice over";
  const uint64_t whole = mf_ckpt_hash64(s.data(), s.size());
  for (size_t cut = 0; cut <= s.size(); cut++) {
    mf_ckpt_hash h;
    mf_ckpt_hash_init(&h);
    mf_ckpt_hash_update(&h, s.data(), cut);
    mf_ckpt_hash_update(&h, s.data() + cut, s.size() - cut);
    EXPECT_EQ(mf_ckpt_hash_final(&h), whole) << cut;
  }
  EXPECT_NE(mf_ckpt_hash64("ab", 2), mf_ckpt_hash64("ab\0", 3));
  EXPECT_NE(mf_ckpt_hash64("ab", 2), mf_ckpt_hash64("ba", 2));
}

void RoundTrip(const std::string &extra, mf_dtype moments) {
  const std::string out = TestDir();
  mf_config *cfg = Config(out, extra);
  ASSERT_NE(cfg, nullptr);
  State a(cfg, moments, 1), b(cfg, moments, 2);
  mf_ckpt_stats stats;
  const std::string dir = Write(cfg, a, 7, &stats);
  EXPECT_EQ(std::string(stats.dir), dir);
  EXPECT_GT(stats.bytes, 0u);
  EXPECT_GE(stats.raw_bytes, (uint64_t)a.t->total_numel * (4 + 2 * mf_dtype_size(moments)));
  for (const char *f : {"COMPLETE", "manifest.json", "state.json", "state.safetensors", "config.yaml"})
    EXPECT_TRUE(Exists(dir + "/" + f)) << f;
  EXPECT_FALSE(Exists(out + "/checkpoints/.tmp-step-000007"));
  mf_ckpt_data d = b.Data();
  mf_ckpt_state s;
  ASSERT_EQ(mf_ckpt_read(dir.c_str(), &d, &s), MF_OK) << mf_last_error();
  EXPECT_EQ(a.w, b.w);
  EXPECT_EQ(a.m, b.m);
  EXPECT_EQ(a.v, b.v);
  EXPECT_EQ(a.steps, b.steps);
  EXPECT_EQ(a.routed, b.routed);
  const mf_ckpt_state want = SmallState(7);
  EXPECT_EQ(s.step, want.step);
  EXPECT_EQ(s.skipped, want.skipped);
  EXPECT_EQ(s.first_loss, want.first_loss);
  EXPECT_EQ(s.lr, want.lr);
  EXPECT_EQ(s.train_steps, want.train_steps);
  EXPECT_EQ(s.data_epoch, want.data_epoch);
  EXPECT_EQ(s.data_index, want.data_index);
  EXPECT_EQ(s.data_seed, want.data_seed);
  EXPECT_EQ(s.data_windows, want.data_windows);
  EXPECT_EQ(mf_ckpt_check_config(dir.c_str(), cfg), MF_OK) << mf_last_error();
  mf_config_free(cfg);
}

TEST(Ckpt, RoundTripZstd) {
  RoundTrip("checkpoint_compression: zstd-3", MF_DTYPE_F32);
  EXPECT_TRUE(Exists(TestDir() + "/checkpoints/step-000007/master.safetensors.zst"));
}
TEST(Ckpt, RoundTripNone) {
  RoundTrip("checkpoint_compression: none", MF_DTYPE_F32);
  EXPECT_TRUE(Exists(TestDir() + "/checkpoints/step-000007/optimizer.safetensors"));
}
TEST(Ckpt, RoundTripBf16Moments) { RoundTrip("checkpoint_compression: zstd-1", MF_DTYPE_BF16); }

TEST(Ckpt, CompressionKeyRefusesOtherWords) {
  const std::string text = "model: {init: {family: mixtral}}\ndata: {train: x.tokens}\noutput: {checkpoint_compression: gzip}\n";
  mf_config *cfg = nullptr;
  EXPECT_NE(mf_config_load_string(text.c_str(), text.size(), "t.yaml", nullptr, 0, &cfg), MF_OK);
  EXPECT_NE(std::string(mf_last_error()).find("output.checkpoint_compression must be none or zstd-N"),
            std::string::npos)
      << mf_last_error();
}

// Each damage is refused with a message naming the file and the fault, and
// find_latest passes over the damaged newest one for the previous.
struct Damage {
  const char *name;
  void (*apply)(const std::string &dir);
  const char *file, *fault;
};

// A model whose tensors are multiples of no power of two above 2 (30 x 20483,
// 17 x 30, ...)
// and whose data sections are longer than one 4 MiB block of the filter
// (vocab 20483: the embedding and the output head are 2.5 MB each at F32), so the
// blocks end inside tensors.
const char kOddModel[] =
    "{family: mixtral, hidden: 30, layers: 1, heads: 3, kv_heads: 1, experts: 3, top_k: 1,\n"
    "         expert_ffn: 17, vocab: 20483, max_seq: 32, seed: 5}";

std::string WriteWith(const mf_config *cfg, State &st, int64_t step, bool filter) {
  if (!filter) setenv("MF_TEST_CKPT_NO_FILTER", "1", 1);
  mf_env_reload();
  const std::string dir = Write(cfg, st, step);
  unsetenv("MF_TEST_CKPT_NO_FILTER");
  mf_env_reload();
  return dir;
}

void ExpectSame(State &a, State &b) {
  EXPECT_EQ(a.w, b.w);
  EXPECT_EQ(a.m, b.m);
  EXPECT_EQ(a.v, b.v);
  EXPECT_EQ(a.steps, b.steps);
  EXPECT_EQ(a.routed, b.routed);
}

// zstd-N filters the master weights and the moments (the manifest and
// state.json say so); both kinds of file read back to the same bits, and on
// values that share exponents the filtered file is the smaller.
TEST(CkptFilter, RoundTripOddSizesBothWays) {
  for (mf_dtype moments : {MF_DTYPE_F32, MF_DTYPE_BF16}) {
    SCOPED_TRACE(mf_dtype_name(moments));
    const std::string out = TestDir() + "/" + mf_dtype_name(moments);
    mkdir(out.c_str(), 0755);
    mf_config *cfg = Config(out, "checkpoint_compression: zstd-1, keep_checkpoints: 0", kOddModel);
    ASSERT_NE(cfg, nullptr);
    State a(cfg, moments, 3);
    uint32_t x = 7;  // weights as an init gives them: random mantissas, a few exponents
    for (float &w : a.w) w = 0.02f * ((float)((x = x * 1664525u + 1013904223u) >> 8) / 16777216.0f - 0.5f);
    const std::string filtered = WriteWith(cfg, a, 1, true), plain = WriteWith(cfg, a, 2, false);
    const std::string manifest = Slurp(filtered + "/manifest.json");
    EXPECT_NE(manifest.find("\"name\": \"master.safetensors.zst\", "), std::string::npos) << manifest;
    size_t filters = 0;
    for (size_t at = manifest.find("\"filter\": \"byteplane\""); at != std::string::npos;
         at = manifest.find("\"filter\": \"byteplane\"", at + 1))
      filters++;
    EXPECT_EQ(filters, 2u) << manifest;  // master and optimizer, not state.safetensors
    EXPECT_NE(Slurp(filtered + "/state.json").find("\"filter\": \"byteplane\""), std::string::npos);
    // Said either way: no entry leaves its filter to be guessed.
    EXPECT_EQ(Slurp(plain + "/manifest.json").find("byteplane"), std::string::npos);
    EXPECT_NE(Slurp(plain + "/manifest.json").find("\"compression\": \"zstd\", \"filter\": \"none\""),
              std::string::npos);
    EXPECT_NE(Slurp(plain + "/state.json").find("\"filter\": \"none\""), std::string::npos);
    EXPECT_LT(Slurp(filtered + "/master.safetensors.zst").size(),
              Slurp(plain + "/master.safetensors.zst").size());
    for (const std::string &dir : {filtered, plain}) {
      SCOPED_TRACE(dir);
      State b(cfg, moments, 4);
      mf_ckpt_data d = b.Data();
      mf_ckpt_state s;
      ASSERT_EQ(mf_ckpt_read(dir.c_str(), &d, &s), MF_OK) << mf_last_error();
      ExpectSame(a, b);
      std::vector<float> master(a.w.size());
      ASSERT_EQ(mf_ckpt_read_master(dir.c_str(), a.t, master.data()), MF_OK) << mf_last_error();
      EXPECT_EQ(master, a.w);
    }
    mf_config_free(cfg);
  }
}

void Flip(const std::string &dir) {
  std::string b = Slurp(dir + "/optimizer.safetensors.zst");
  b[b.size() / 2] ^= 0x10;
  Spit(dir + "/optimizer.safetensors.zst", b);
}
void Truncate(const std::string &dir) {
  std::string b = Slurp(dir + "/master.safetensors.zst");
  Spit(dir + "/master.safetensors.zst", b.substr(0, b.size() - 100));
}
void Unfinished(const std::string &dir) { unlink((dir + "/COMPLETE").c_str()); }
void NoManifest(const std::string &dir) { unlink((dir + "/manifest.json").c_str()); }
void BadManifest(const std::string &dir) { Spit(dir + "/manifest.json", "{\"format\": 3"); }
void FlipMaster(const std::string &dir) {
  std::string b = Slurp(dir + "/master.safetensors.zst");
  b[b.size() / 3] ^= 0x01;
  Spit(dir + "/master.safetensors.zst", b);
}
void BadFilter(const std::string &dir) {
  std::string b = Slurp(dir + "/manifest.json");
  const size_t at = b.find("\"byteplane\"");
  ASSERT_NE(at, std::string::npos) << b;
  b.replace(at, 11, "\"shuffle4\"");
  Spit(dir + "/manifest.json", b);
}
void FlipState(const std::string &dir) {
  std::string b = Slurp(dir + "/state.json");
  b[20] ^= 1;
  Spit(dir + "/state.json", b);
}

TEST(Ckpt, DamageIsRefusedAndPassedOver) {
  const Damage damages[] = {
      {"flip", Flip, "optimizer.safetensors.zst", "the file is damaged"},
      {"truncate", Truncate, "master.safetensors.zst", "truncated"},
      {"unfinished", Unfinished, "COMPLETE", "the checkpoint was not finished"},
      {"no_manifest", NoManifest, "manifest.json", "No such file"},
      {"bad_manifest", BadManifest, "manifest.json", "is not the manifest_hash line"},
      {"flip_state", FlipState, "state.json", "the file is damaged"},
      {"flip_filtered_master", FlipMaster, "master.safetensors.zst", "the file is damaged"},
      {"bad_filter", BadFilter, "manifest.json", "(the manifest is damaged)"},
  };
  for (const Damage &dmg : damages) {
    SCOPED_TRACE(dmg.name);
    const std::string out = TestDir() + "/" + dmg.name;
    mkdir(out.c_str(), 0755);
    mf_config *cfg = Config(out, "checkpoint_compression: zstd-1");
    ASSERT_NE(cfg, nullptr);
    State a(cfg, MF_DTYPE_F32, 1), b(cfg, MF_DTYPE_F32, 2);
    const std::string older = Write(cfg, a, 4), newest = Write(cfg, a, 8);
    dmg.apply(newest);
    EXPECT_NE(mf_ckpt_verify(newest.c_str()), MF_OK);
    const std::string msg = mf_last_error();
    EXPECT_NE(msg.find(newest + "/" + dmg.file), std::string::npos) << msg;
    EXPECT_NE(msg.find(dmg.fault), std::string::npos) << msg;
    mf_ckpt_data d = b.Data();
    mf_ckpt_state s;
    EXPECT_NE(mf_ckpt_read(newest.c_str(), &d, &s), MF_OK);
    char found[4200];
    ASSERT_EQ(mf_ckpt_find_latest(out.c_str(), found, sizeof found), MF_OK) << mf_last_error();
    EXPECT_EQ(std::string(found), older);
    mf_config_free(cfg);
  }
}

TEST(Ckpt, NoneCompleteIsAnError) {
  const std::string out = TestDir();
  mf_config *cfg = Config(out, "checkpoint_compression: none");
  State a(cfg, MF_DTYPE_F32, 1);
  Unfinished(Write(cfg, a, 3));
  char found[4200];
  EXPECT_EQ(mf_ckpt_find_latest(out.c_str(), found, sizeof found), MF_ERR_CONFIG);
  EXPECT_NE(std::string(mf_last_error()).find("no complete checkpoint in " + out + "/checkpoints"), std::string::npos)
      << mf_last_error();
  mf_config_free(cfg);
}

TEST(Ckpt, KeepCheckpointsPrunesOlderComplete) {
  const std::string out = TestDir();
  mf_config *cfg = Config(out, "checkpoint_compression: none, keep_checkpoints: 2");
  State a(cfg, MF_DTYPE_F32, 1);
  for (int s = 1; s <= 4; s++) Write(cfg, a, s);
  EXPECT_FALSE(Exists(out + "/checkpoints/step-000001"));
  EXPECT_FALSE(Exists(out + "/checkpoints/step-000002"));
  EXPECT_TRUE(Exists(out + "/checkpoints/step-000003/COMPLETE"));
  EXPECT_TRUE(Exists(out + "/checkpoints/step-000004/COMPLETE"));
  // The same step again replaces it.
  Write(cfg, a, 4);
  EXPECT_TRUE(Exists(out + "/checkpoints/step-000004/COMPLETE"));
  EXPECT_EQ(mf_ckpt_verify((out + "/checkpoints/step-000004").c_str()), MF_OK) << mf_last_error();
  mf_config_free(cfg);
}

TEST(Ckpt, ConfigThatChangesTheMathsIsRefused) {
  const std::string out = TestDir();
  mf_config *cfg = Config(out, "checkpoint_compression: none");
  State a(cfg, MF_DTYPE_F32, 1);
  const std::string dir = Write(cfg, a, 2);
  const char *same[] = {"train.steps=50", "train.threads=1", "memory.device_budget=9MiB", "train.log_every=1"};
  mf_config *ok = nullptr;
  const std::string text = Slurp(dir + "/config.yaml");
  ASSERT_EQ(mf_config_load_string(text.c_str(), text.size(), "c.yaml", same, 4, &ok), MF_OK) << mf_last_error();
  EXPECT_EQ(mf_ckpt_check_config(dir.c_str(), ok), MF_OK) << mf_last_error();
  mf_config_free(ok);
  const char *diff[] = {"train.lr=2e-3", "model.init.hidden=64", "train.steps=3"};
  mf_config *bad = nullptr;
  ASSERT_EQ(mf_config_load_string(text.c_str(), text.size(), "c.yaml", diff, 3, &bad), MF_OK) << mf_last_error();
  EXPECT_EQ(mf_ckpt_check_config(dir.c_str(), bad), MF_ERR_CONFIG);
  const std::string msg = mf_last_error();
  EXPECT_NE(msg.find(dir + "/config.yaml"), std::string::npos) << msg;
  EXPECT_NE(msg.find("change the training: model.init.hidden, train.lr differ from"), std::string::npos) << msg;
  mf_config_free(bad);
  mf_config_free(cfg);
}

}  // namespace

namespace {

// What a kill inside a write leaves: a .tmp-step dir (here a whole copy, its
// marker too) is never taken; the next write of that step replaces it.
TEST(Ckpt, TmpDirOfAKilledWriteIsPassedOver) {
  const std::string out = TestDir();
  mf_config *cfg = Config(out, "checkpoint_compression: zstd-1");
  State a(cfg, MF_DTYPE_F32, 1);
  Write(cfg, a, 4);
  const std::string s8 = Write(cfg, a, 8);
  ASSERT_EQ(system(("cp -r " + s8 + " " + out + "/checkpoints/.tmp-step-000012").c_str()), 0);
  char found[4200];
  ASSERT_EQ(mf_ckpt_find_latest(out.c_str(), found, sizeof found), MF_OK) << mf_last_error();
  EXPECT_EQ(std::string(found), s8);
  const std::string s12 = Write(cfg, a, 12);
  EXPECT_FALSE(Exists(out + "/checkpoints/.tmp-step-000012"));
  EXPECT_EQ(mf_ckpt_verify(s12.c_str()), MF_OK) << mf_last_error();
  mf_config_free(cfg);
}

// The two halves of mf_ckpt_write: after the files, a checkpoint resume passes
// over (no COMPLETE); after the commit, the newest.
TEST(Ckpt, WriteFilesThenCommit) {
  const std::string out = TestDir();
  mf_config *cfg = Config(out, "checkpoint_compression: none");
  State a(cfg, MF_DTYPE_F32, 1);
  const std::string s4 = Write(cfg, a, 4);
  mf_ckpt_writer *w = nullptr;
  ASSERT_EQ(mf_ckpt_writer_create(cfg, &w), MF_OK) << mf_last_error();
  mf_ckpt_data d = a.Data();
  mf_ckpt_state s = SmallState(8);
  mf_ckpt_stats st;
  ASSERT_EQ(mf_ckpt_write_files(w, &d, &s, &st), MF_OK) << mf_last_error();
  EXPECT_EQ(std::string(st.dir), StepDir(out, 8));
  EXPECT_FALSE(Exists(StepDir(out, 8) + "/COMPLETE"));
  char found[4200];
  ASSERT_EQ(mf_ckpt_find_latest(out.c_str(), found, sizeof found), MF_OK) << mf_last_error();
  EXPECT_EQ(std::string(found), s4);
  ASSERT_EQ(mf_ckpt_commit(w, 8), MF_OK) << mf_last_error();
  ASSERT_EQ(mf_ckpt_find_latest(out.c_str(), found, sizeof found), MF_OK) << mf_last_error();
  EXPECT_EQ(std::string(found), StepDir(out, 8));
  mf_ckpt_writer_free(w);
  mf_config_free(cfg);
}

// A full disk (the test-only MF_TEST_CKPT_ENOSPC, read when the writer is
// created): the write fails naming the file and the fault, leaves no .tmp
// dir, and the older checkpoint stays whole.
TEST(Ckpt, FullDiskFailsTheWriteKeepingTheOlder) {
  const std::string out = TestDir();
  mf_config *cfg = Config(out, "checkpoint_compression: zstd-1");
  State a(cfg, MF_DTYPE_F32, 1);
  const std::string s4 = Write(cfg, a, 4);
  setenv("MF_TEST_CKPT_ENOSPC", "2", 1);
  mf_env_reload();
  mf_ckpt_writer *w = nullptr;
  const mf_status created = mf_ckpt_writer_create(cfg, &w);
  unsetenv("MF_TEST_CKPT_ENOSPC");
  mf_env_reload();
  ASSERT_EQ(created, MF_OK) << mf_last_error();
  mf_ckpt_data d = a.Data();
  mf_ckpt_state s = SmallState(8);
  mf_ckpt_stats st;
  EXPECT_EQ(mf_ckpt_write(w, &d, &s, &st), MF_ERR_IO);
  const std::string msg = mf_last_error();
  EXPECT_NE(msg.find(out + "/checkpoints/.tmp-step-000008/optimizer.safetensors.zst"), std::string::npos) << msg;
  EXPECT_NE(msg.find("No space left on device"), std::string::npos) << msg;
  EXPECT_FALSE(Exists(out + "/checkpoints/.tmp-step-000008"));
  EXPECT_FALSE(Exists(StepDir(out, 8)));
  EXPECT_EQ(mf_ckpt_verify(s4.c_str()), MF_OK) << mf_last_error();
  mf_ckpt_writer_free(w);
  mf_config_free(cfg);
}

}  // namespace
