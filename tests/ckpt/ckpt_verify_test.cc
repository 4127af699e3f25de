// issue 28 (never silently wrong): a checkpoint's manifest is sealed by its
// own checksum and is the one source of truth about its files. Each test is
// one finding of the mutation campaign against the cpu backend: a one-byte
// edit of a manifest entry's filter, an entry taken out, a damaged
// config.yaml compared as a setting, a state.json that contradicts itself or
// the manifest; and base.json, the hook for the base identity.
#include "tests/ckpt/ckpt_util.h"

namespace {

// A zstd checkpoint (byte-plane filter on) of step 4 under TestDir()/name.
struct Ckpt {
  mf_config *cfg = nullptr;
  std::string out, dir;
  State *a = nullptr;
  explicit Ckpt(const std::string &name, const char *base_json = nullptr,
                const std::string &extra = "checkpoint_compression: zstd-1") {
    out = TestDir() + "/" + name;
    mkdir(out.c_str(), 0755);
    cfg = Config(out, extra);
    a = new State(cfg, MF_DTYPE_F32, 1);
    dir = Write(cfg, *a, 4, nullptr, base_json);
  }
  ~Ckpt() {
    delete a;
    mf_config_free(cfg);
  }
  // mf_ckpt_read's status; on failure the message is in mf_last_error().
  mf_status Read() {
    State b(cfg, MF_DTYPE_F32, 2);
    mf_ckpt_data d = b.Data();
    mf_ckpt_state s;
    return mf_ckpt_read(dir.c_str(), &d, &s);
  }
  void Edit(const std::string &file, const std::string &from, const std::string &to) {
    ::Edit(dir + "/" + file, from, to);
  }
};

// Both calls refuse dir, and the message names dir/file and says `fault`.
void ExpectRefused(Ckpt &c, const std::string &file, const std::string &fault) {
  EXPECT_NE(mf_ckpt_verify(c.dir.c_str()), MF_OK) << file;
  std::string msg = mf_last_error();
  EXPECT_TRUE(Has(msg, c.dir + "/" + file)) << msg;
  EXPECT_TRUE(Has(msg, fault)) << msg;
  EXPECT_NE(c.Read(), MF_OK) << file;
  msg = mf_last_error();
  EXPECT_TRUE(Has(msg, c.dir + "/" + file)) << msg;
  EXPECT_TRUE(Has(msg, fault)) << msg;
}

// Finding 1: `"filter"` of the master weights' entry renamed by one byte read
// as "no filter" and loaded scrambled weights; now the seal refuses it.
TEST(CkptVerify, OneByteEditOfAManifestFilterIsRefused) {
  Ckpt c("filter");
  ASSERT_EQ(mf_ckpt_verify(c.dir.c_str()), MF_OK) << mf_last_error();
  c.Edit("manifest.json", "\"filter\": \"byteplane\"", "\"filtes\": \"byteplane\"");
  ExpectRefused(c, "manifest.json", "(the manifest is damaged)");
  char found[4200];
  EXPECT_NE(mf_ckpt_find_latest(c.out.c_str(), found, sizeof found), MF_OK);
}

// The same edits made by a writer that sealed what it wrote: the key missing,
// or the value another, is refused by the parser or by state.json's own
// record of the filter, never read as "no filter".
TEST(CkptVerify, AFilterThatIsNotTheFilesIsRefusedEvenWhenSealed) {
  {
    Ckpt c("missing");
    c.Edit("manifest.json", ", \"filter\": \"byteplane\"", "");
    Spit(c.dir + "/manifest.json", Seal(Slurp(c.dir + "/manifest.json")));
    ExpectRefused(c, "manifest.json", "files[0]: missing 'filter'");
  }
  {
    Ckpt c("none");
    c.Edit("manifest.json", "\"filter\": \"byteplane\"", "\"filter\": \"none\"");
    Spit(c.dir + "/manifest.json", Seal(Slurp(c.dir + "/manifest.json")));
    ExpectRefused(c, "manifest.json", "stored differently");
    c.Edit("manifest.json", "\"filter\": \"byteplane\"", "\"filter\": \"none\"");
    Spit(c.dir + "/manifest.json", Seal(Slurp(c.dir + "/manifest.json")));
    ExpectRefused(c, "state.json", "(state.json and the manifest disagree)");
  }
  {
    Ckpt c("state_filter");  // state.json edited and sealed: it disagrees with the manifest
    c.Edit("state.json", "\"filter\": \"byteplane\"", "\"filter\": \"none\"");
    Reseal(c.dir, "state.json");
    ExpectRefused(c, "state.json", "(state.json and the manifest disagree)");
  }
}

// Finding 1 too: with state.json's entry taken out of the manifest, an edited
// state.json was read unverified. Every file is listed; a required one
// missing, a file on disk left out, one listed twice or an unknown one listed
// is refused, sealed or not.
TEST(CkptVerify, EveryFileIsListedOnceAndNoOther) {
  const auto drop_entry = [](Ckpt &c, const std::string &name) {
    std::string t = Slurp(c.dir + "/manifest.json");
    const size_t at = t.find("    {\"name\": \"" + name + "\"");
    ASSERT_NE(at, std::string::npos) << t;
    t.erase(at, t.find('\n', at) + 1 - at);
    Spit(c.dir + "/manifest.json", t);
  };
  {
    Ckpt c("unsealed");
    drop_entry(c, "state.json");
    ExpectRefused(c, "manifest.json", "(the manifest is damaged)");
  }
  {
    Ckpt c("sealed");
    drop_entry(c, "state.json");
    Spit(c.dir + "/manifest.json", Seal(Slurp(c.dir + "/manifest.json")));
    ExpectRefused(c, "manifest.json", "lists no state.json (every checkpoint has one)");
  }
  {
    Ckpt c("plan");  // an optional file: present on disk, so listed
    Spit(c.out + "/plan.json", "{\"plan\": 1}\n");
    c.dir = Write(c.cfg, *c.a, 5);
    ASSERT_TRUE(Has(Slurp(c.dir + "/manifest.json"), "\"name\": \"plan.json\"")) << Slurp(c.dir + "/manifest.json");
    drop_entry(c, "plan.json");
    std::string t = Slurp(c.dir + "/manifest.json");
    t.replace(t.rfind("},\n  ]"), 6, "}\n  ]");  // the entry dropped was the last one
    Spit(c.dir + "/manifest.json", Seal(t));
    ExpectRefused(c, "plan.json", "a checkpoint file that manifest.json does not list");
  }
  {
    Ckpt c("twice");
    std::string t = Slurp(c.dir + "/manifest.json");
    const size_t at = t.find("    {\"name\": \"config.yaml\"");
    std::string line = t.substr(at, t.find('\n', at) - at);  // the last entry: a comma added
    t.insert(at, line + (line.back() == ',' ? "\n" : ",\n"));
    Spit(c.dir + "/manifest.json", Seal(t));
    ExpectRefused(c, "manifest.json", "both list config.yaml");
  }
  {
    Ckpt c("unknown");
    Spit(c.dir + "/notes.txt", "hello");
    c.Edit("manifest.json", "\"name\": \"config.yaml\"", "\"name\": \"notes.txt\"");
    Spit(c.dir + "/manifest.json", Seal(Slurp(c.dir + "/manifest.json")));
    ExpectRefused(c, "manifest.json", "'notes.txt' is not a file of a moefit checkpoint");
  }
}

// A manifest written before the seal (version 1) is refused, saying so.
TEST(CkptVerify, AManifestWithoutItsSealIsRefusedAsOlder) {
  Ckpt c("v1");
  std::string t = Slurp(c.dir + "/manifest.json");
  t = std::regex_replace(t, std::regex(", \"raw_hash\": \"[0-9a-f]+\""), "");
  t = std::regex_replace(t, std::regex(", \"filter\": \"none\""), "");
  t = std::regex_replace(t, std::regex("\"version\": 2"), "\"version\": 1");
  t = t.substr(0, t.find("  ],\n")) + "  ]\n}\n";
  Spit(c.dir + "/manifest.json", t);
  ExpectRefused(c, "manifest.json", "predates verified manifests");
}

// Finding 2: a damaged config.yaml (here train.lr changed in it) was compared
// before its checksum and reported as "train.lr differs"; now as damaged.
TEST(CkptVerify, ADamagedConfigIsDamagedNotADifference) {
  Ckpt c("config");
  ASSERT_EQ(mf_ckpt_check_config(c.dir.c_str(), c.cfg), MF_OK) << mf_last_error();
  c.Edit("config.yaml", "lr: 0.001", "lr: 0.002");
  EXPECT_NE(mf_ckpt_check_config(c.dir.c_str(), c.cfg), MF_OK);
  const std::string msg = mf_last_error();
  EXPECT_TRUE(Has(msg, c.dir + "/config.yaml: checksum")) << msg;
  EXPECT_TRUE(Has(msg, "(the file is damaged)")) << msg;
  EXPECT_FALSE(Has(msg, "differ")) << msg;
  mf_config *loaded = nullptr;
  EXPECT_NE(mf_ckpt_load_config(c.dir.c_str(), MF_CONFIG_FOR_EVAL, &loaded), MF_OK);
  EXPECT_EQ(loaded, nullptr);
  EXPECT_TRUE(Has(mf_last_error(), c.dir + "/config.yaml")) << mf_last_error();
}

// Finding 3, its src/ckpt half: a state.json that contradicts itself, the
// manifest or the tensors beside it is refused when read, naming it, even
// when the manifest was sealed over it.
TEST(CkptVerify, AStateThatContradictsItselfIsRefused) {
  struct Case {
    const char *name, *file, *from, *to, *fault;
  } cases[] = {
      {"skipped", "state.json", "\"skipped\": 1", "\"skipped\": 5", "not a state a run writes"},
      {"beyond", "state.json", "\"train_steps\": 10", "\"train_steps\": 3", "not a state a run writes"},
      {"index", "state.json", "\"index\": 17", "\"index\": 123", "index 123 is not inside the 123 windows"},
      {"ranks", "state.json", "\"ranks\": 1", "\"ranks\": 0", "not a state a run writes"},
      {"routed", "state.json", "\"experts_routed\": 8", "\"experts_routed\": 6", "and 6 routing counts"},
      {"unknown", "state.json", "\"lr\":", "\"lr_\": 1, \"lr\":", "unknown key 'lr_'"},
      {"comp", "state.json", "\"compression\": \"zstd-1\"", "\"compression\": \"none\"",
       "(state.json and the manifest disagree)"},
      {"moments", "state.json", "\"moments\": \"F32\"", "\"moments\": \"BF16\"", "moments: the checkpoint's"},
      // step 1 with 1 skipped: no parameter was updated, but state.safetensors has AdamW steps of 1
      {"adam", "state.json", "\"step\": 4", "\"step\": 1", "took 0 updates"},
  };
  for (const Case &k : cases) {
    SCOPED_TRACE(k.name);
    Ckpt c(k.name);
    c.Edit(k.file, k.from, k.to);
    Reseal(c.dir, k.file);
    EXPECT_NE(c.Read(), MF_OK);
    const std::string msg = mf_last_error();
    EXPECT_TRUE(Has(msg, c.dir + "/state")) << msg;  // state.json, or state.safetensors beside it
    EXPECT_TRUE(Has(msg, k.fault)) << msg;
  }
}

// base.json (mf_ckpt_data.base_json): written, listed and checksummed like
// the others, given back verified; none when the writer had none.
TEST(CkptVerify, BaseJsonIsWrittenListedAndVerified) {
  const char *base = "{\"model\": \"demo\", \"weights\": \"0123456789abcdef\"}";
  {
    Ckpt c("with", base);
    EXPECT_TRUE(Has(Slurp(c.dir + "/manifest.json"), "\"name\": \"base.json\"")) << Slurp(c.dir + "/manifest.json");
    char *json = nullptr;
    ASSERT_EQ(mf_ckpt_read_base_json(c.dir.c_str(), &json), MF_OK) << mf_last_error();
    ASSERT_NE(json, nullptr);
    EXPECT_EQ(std::string(json), base);
    free(json);
    ASSERT_EQ(c.Read(), MF_OK) << mf_last_error();
    c.Edit("base.json", "demo", "dema");
    json = reinterpret_cast<char *>(1);
    EXPECT_NE(mf_ckpt_read_base_json(c.dir.c_str(), &json), MF_OK);
    EXPECT_EQ(json, nullptr);
    EXPECT_TRUE(Has(mf_last_error(), c.dir + "/base.json: checksum")) << mf_last_error();
    ExpectRefused(c, "base.json", "(the file is damaged)");
  }
  {
    Ckpt c("without");
    EXPECT_FALSE(Exists(c.dir + "/base.json"));
    char *json = reinterpret_cast<char *>(1);
    ASSERT_EQ(mf_ckpt_read_base_json(c.dir.c_str(), &json), MF_OK) << mf_last_error();
    EXPECT_EQ(json, nullptr);
    // A base.json put beside a checkpoint that has none is not taken.
    Spit(c.dir + "/base.json", base);
    EXPECT_NE(mf_ckpt_read_base_json(c.dir.c_str(), &json), MF_OK);
    EXPECT_TRUE(Has(mf_last_error(), c.dir + "/base.json: a checkpoint file that manifest.json does not list"))
        << mf_last_error();
  }
  {
    const std::string out = TestDir() + "/notjson";
    mkdir(out.c_str(), 0755);
    mf_config *cfg = Config(out, "checkpoint_compression: none");
    State a(cfg, MF_DTYPE_F32, 1);
    mf_ckpt_writer *w = nullptr;
    ASSERT_EQ(mf_ckpt_writer_create(cfg, &w), MF_OK) << mf_last_error();
    mf_ckpt_data d = a.Data();
    d.base_json = "{\"model\": ";
    mf_ckpt_state s = SmallState(3);
    mf_ckpt_stats st;
    EXPECT_NE(mf_ckpt_write(w, &d, &s, &st), MF_OK);
    EXPECT_TRUE(Has(mf_last_error(), "base.json: the base identity is not JSON")) << mf_last_error();
    EXPECT_FALSE(Exists(StepDir(out, 3)));
    mf_ckpt_writer_free(w);
    mf_config_free(cfg);
  }
}

}  // namespace
