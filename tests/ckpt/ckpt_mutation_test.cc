// issue 28 (never silently wrong): a seeded mutation campaign against one
// small zstd checkpoint (byte-plane filter on, plan.json and base.json beside
// the tensors). Each case copies it, damages it, and calls the readers
// directly (mf_ckpt_verify, mf_ckpt_check_config, mf_ckpt_read,
// mf_ckpt_read_master, mf_ckpt_read_base_json, mf_ckpt_read_manifest): each
// must refuse with a message naming a damaged file, or give exactly what the
// undamaged checkpoint gives. Three kinds of damage:
//   A. any file changed after the write (byte flips, truncation, bytes
//      appended, a key renamed or deleted, a value edited, a manifest entry
//      removed or doubled, files swapped, copied over or deleted, a known file
//      added unlisted): every byte is covered, so verify and read refuse;
//   B. the manifest edited and sealed again (a writer that wrote what it
//      should not): whatever it says, nothing reads differently;
//   C. a tensor file changed and its entry's size and checksum sealed over
//      it: its raw checksum still refuses it when it is read.
// MF_CKPT_MUTATION_SEED and MF_CKPT_MUTATION_CASES vary the campaign.
#include <dirent.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "tests/ckpt/ckpt_util.h"

namespace {

const char kBase[] = "{\"model\": \"mutation\", \"weights\": \"00112233aabbccdd\"}";

// One kind of damage to one copy of the checkpoint.
struct Damage {
  std::string what;               // for the trace
  std::set<std::string> blamed;   // the files an error may name
  char kind = 'A';                // A, B or C (above)
  bool small = false;             // A: manifest.json, state.json or config.yaml changed, or a file added
};

bool IsText(const std::string &name) {
  return name == "manifest.json" || name == "state.json" || name == "config.yaml" || name == "plan.json" ||
         name == "base.json";
}

// Every match of re in s: (position, length).
std::vector<std::pair<size_t, size_t>> Matches(const std::string &s, const std::regex &re) {
  std::vector<std::pair<size_t, size_t>> m;
  for (auto it = std::sregex_iterator(s.begin(), s.end(), re); it != std::sregex_iterator(); ++it)
    m.emplace_back((size_t)it->position(), (size_t)it->length());
  return m;
}

// The manifest's entry lines: (start, length with the newline).
std::vector<std::pair<size_t, size_t>> EntryLines(const std::string &manifest) {
  return Matches(manifest, std::regex("    \\{\"name\": [^\\n]*\\n"));
}

std::string NameOf(const std::string &entry) {
  const size_t at = entry.find("\"name\": \"") + 9;
  return entry.substr(at, entry.find('"', at) - at);
}

class Mutator {
 public:
  explicit Mutator(uint64_t seed) : rng_(seed) {}
  size_t Below(size_t n) { return n ? (size_t)(rng_() % n) : 0; }

  // A text edit of s: a key renamed or deleted, a value changed. Returns the
  // edit, or "" when s has nothing of that kind.
  std::string EditText(std::string &s, bool yaml) {
    const int op = (int)Below(3);
    if (op == 0) {  // a key renamed by one letter
      const auto keys = Matches(s, yaml ? std::regex("[a-z_]+:") : std::regex("\"[a-z_]+\":"));
      if (keys.empty()) return "";
      const auto k = keys[Below(keys.size())];
      const size_t at = k.first + (yaml ? 0 : 1) + Below(k.second - (yaml ? 1 : 3));
      s[at] = s[at] == 'z' ? 'a' : (char)(s[at] + 1);
      return "key renamed at " + std::to_string(at);
    }
    if (op == 1) {  // a key and its (scalar) value deleted
      const auto pairs = yaml ? Matches(s, std::regex("\\n *[a-z_]+: [^\\n{\\[]+"))
                              : Matches(s, std::regex("\"[a-z_]+\": (\"[^\"]*\"|[-+0-9.eE]+|null|true|false)(, )?"));
      if (pairs.empty()) return "";
      const auto p = pairs[Below(pairs.size())];
      const std::string gone = s.substr(p.first, p.second);
      s.erase(p.first, p.second);
      return "deleted <" + gone + ">";
    }
    // a value edited: a number changed, or a word swapped for another the format knows
    const auto nums = Matches(s, std::regex("[0-9]+"));
    const auto words = Matches(s, std::regex("\"(byteplane|none|zstd|F32|BF16|zstd-1)\""));
    if (nums.empty() && words.empty()) return "";
    if (!words.empty() && (nums.empty() || Below(3) == 0)) {
      static const char *const alt[] = {"\"byteplane\"", "\"none\"", "\"zstd\"", "\"F32\"", "\"BF16\"", "\"zstd-3\""};
      const auto w = words[Below(words.size())];
      const std::string old = s.substr(w.first, w.second), to = alt[Below(6)];
      if (to == old) return "";
      s.replace(w.first, w.second, to);
      return "value " + old + " -> " + to;
    }
    const auto n = nums[Below(nums.size())];
    const std::string old = s.substr(n.first, n.second);
    std::string to = std::to_string(Below(3) == 0 ? Below(100000) : std::stoull(old.substr(0, 18)) + 1 + Below(3));
    if (to == old) to += "1";
    s.replace(n.first, n.second, to);
    return "number " + old + " -> " + to;
  }

  // A byte-level change of s: a flip, a cut, bytes appended.
  std::string EditBytes(std::string &s) {
    const int op = (int)Below(4);
    if (op <= 1 && !s.empty()) {
      const size_t at = Below(s.size());
      const uint8_t x = (uint8_t)(1 + Below(255));
      s[at] = (char)((uint8_t)s[at] ^ x);
      return "byte " + std::to_string(at) + " ^= " + std::to_string(x);
    }
    if (op == 2 && !s.empty()) {
      const size_t n = Below(s.size());
      s.resize(n);
      return "cut to " + std::to_string(n);
    }
    const size_t n = 1 + Below(16);
    for (size_t i = 0; i < n; i++) s.push_back((char)Below(256));
    return std::to_string(n) + " bytes appended";
  }

  // Class A: one change to the files after the write.
  Damage Unsealed(Files &f, const std::vector<std::string> &names) {
    Damage d;
    d.kind = 'A';
    const std::string name = names[Below(names.size())];
    const int op = (int)Below(10);
    std::string &s = f[name];
    if (op <= 2 && IsText(name)) {
      d.what = EditText(s, name == "config.yaml");
      if (!d.what.empty()) d.blamed = {name};
    } else if (op == 3 && name == "manifest.json") {  // an entry removed or doubled
      const auto lines = EntryLines(s);
      const auto l = lines[Below(lines.size())];
      const std::string line = s.substr(l.first, l.second);
      if (Below(2)) {
        s.erase(l.first, l.second);
        d.what = "entry removed: " + NameOf(line);
      } else {
        s.insert(l.first, line);
        d.what = "entry doubled: " + NameOf(line);
      }
      d.blamed = {name};
    } else if (op == 4) {  // two files swapped, or one copied over another
      std::string other = names[Below(names.size())];
      if (other == name || f[other] == s) return d;
      if (Below(2)) {
        std::swap(f[name], f[other]);
        d.what = "swapped with " + other;
        d.blamed = {name, other};
      } else {
        s = f[other];
        d.what = "overwritten by " + other;
        d.blamed = {name};
      }
    } else if (op == 5) {
      f.erase(name);
      d.what = "deleted";
      d.blamed = {name};
    } else if (op == 6) {  // a known file put beside the listed ones
      const std::string extra = Below(2) ? "master.safetensors" : "optimizer.safetensors";
      f[extra] = Below(2) ? s : std::string("not a tensor file");
      d.what = "added " + extra;
      d.blamed = {extra};
      d.small = true;
      return d;
    } else {
      d.what = EditBytes(s);
      d.blamed = {name};
    }
    for (const std::string &b : d.blamed)
      d.small = d.small || b == "manifest.json" || b == "state.json" || b == "config.yaml";
    if (!d.what.empty()) d.what = name + ": " + d.what;
    return d;
  }

  // Class B: the manifest edited, then sealed again.
  Damage Resealed(Files &f) {
    Damage d;
    d.kind = 'B';
    std::string &s = f["manifest.json"];
    auto lines = EntryLines(s);
    const int op = (int)Below(5);
    if (op <= 2) {  // one entry's text, or the top's
      const bool top = op == 2;
      const auto l = lines[Below(lines.size())];
      const std::string name = NameOf(s.substr(l.first, l.second));
      std::string part = top ? s.substr(0, lines[0].first) : s.substr(l.first, l.second);
      d.what = EditText(part, false);
      if (d.what.empty()) return d;
      if (top) {
        s.replace(0, lines[0].first, part);
        d.blamed = {"manifest.json"};
      } else {
        s.replace(l.first, l.second, part);
        d.blamed = {"manifest.json", "state.json", name};
      }
      d.what = (top ? std::string("top: ") : name + ": ") + d.what;
    } else if (op == 3) {  // an entry removed (the commas kept right) or doubled
      const size_t i = Below(lines.size());
      const std::string name = NameOf(s.substr(lines[i].first, lines[i].second));
      if (Below(2)) {
        s.erase(lines[i].first, lines[i].second);
        const size_t close = s.rfind("},\n  ],");
        if (close != std::string::npos) s.replace(close, 7, "}\n  ],");
        d.what = "entry removed: " + name;
      } else {
        std::string line = s.substr(lines[i].first, lines[i].second);
        if (line.find("},\n") == std::string::npos) line.replace(line.size() - 2, 1, "},");
        s.insert(lines[0].first, line);
        d.what = "entry doubled: " + name;
      }
      d.blamed = {"manifest.json", name};
    } else {  // two entries in another order: nothing changes
      const size_t i = Below(lines.size()), j = Below(lines.size());
      std::vector<std::string> ls;
      for (const auto &l : lines) ls.push_back(s.substr(l.first, l.second));
      for (std::string &l : ls)
        if (l.find("},\n") == std::string::npos) l.replace(l.size() - 2, 1, "},");
      std::swap(ls[i], ls[j]);
      ls.back().replace(ls.back().size() - 3, 2, "}");
      std::string joined;
      for (const std::string &l : ls) joined += l;
      s.replace(lines[0].first, lines.back().first + lines.back().second - lines[0].first, joined);
      d.what = "entries " + std::to_string(i) + " and " + std::to_string(j) + " swapped";
      d.blamed = {"manifest.json"};
    }
    s = Seal(s);
    return d;
  }

 private:
  std::mt19937_64 rng_;
};

// What the undamaged checkpoint reads to.
struct Reference {
  std::vector<float> w, master;
  std::vector<uint8_t> m, v;
  std::vector<int64_t> steps, routed;
  mf_ckpt_state s;
  std::string base;
  std::vector<std::string> manifest;  // its entries, sorted
};

std::vector<std::string> Entries(const mf_ckpt_file *files, int n) {
  std::vector<std::string> e;
  for (int i = 0; i < n; i++) {
    const mf_ckpt_file &f = files[i];
    e.push_back(std::string(f.name) + " " + std::to_string(f.bytes) + " " + Hex16(f.hash) + " " +
                std::to_string(f.raw_bytes) + " " + Hex16(f.raw_hash) + " " + std::to_string(f.zstd) + " " +
                std::to_string(f.byteplane));
  }
  std::sort(e.begin(), e.end());
  return e;
}

bool SameState(const mf_ckpt_state &a, const mf_ckpt_state &b) {
  return a.step == b.step && a.skipped == b.skipped && a.first_loss == b.first_loss && a.lr == b.lr &&
         a.train_steps == b.train_steps && a.data_epoch == b.data_epoch && a.data_index == b.data_index &&
         a.data_seed == b.data_seed && a.data_windows == b.data_windows && a.ranks == b.ranks;
}

// One reader's outcome against the rule: refused naming a blamed file, or
// exactly the reference. `must_fail`: damage every byte of which is checked.
void Judge(const char *call, mf_status st, bool same, bool must_fail, const std::string &dir, const Damage &d,
           int *refused) {
  SCOPED_TRACE(call);
  if (st == MF_OK) {
    EXPECT_FALSE(must_fail) << "accepted";
    EXPECT_TRUE(same) << "read other values than the undamaged checkpoint's";
    return;
  }
  ++*refused;
  const std::string msg = mf_last_error();
  bool named = false;
  for (const std::string &b : d.blamed) named = named || Has(msg, dir + "/" + b);
  EXPECT_TRUE(named) << "the error names no damaged file: " << msg;
}

TEST(CkptMutation, EveryDamageIsRefusedNamingItsFileOrReadsTheSame) {
  const char *seed_env = getenv("MF_CKPT_MUTATION_SEED"), *cases_env = getenv("MF_CKPT_MUTATION_CASES");
  const uint64_t seed = seed_env ? std::stoull(seed_env) : 28;
  const int cases = cases_env ? std::stoi(cases_env) : 360;
  const std::string out = TestDir();
  Spit(out + "/plan.json", "{\"format\": \"moefit-plan\", \"steps\": [1, 2, 3]}\n");
  mf_config *cfg = Config(out, "checkpoint_compression: zstd-1");
  ASSERT_NE(cfg, nullptr);
  State a(cfg, MF_DTYPE_F32, 1);
  const std::string orig = Write(cfg, a, 4, nullptr, kBase);
  const Files files = ReadDir(orig);
  ASSERT_TRUE(files.count("plan.json") && files.count("base.json") && files.count("master.safetensors.zst"));
  std::vector<std::string> names;  // what may be damaged: every file but COMPLETE
  for (const auto &kv : files)
    if (kv.first != "COMPLETE") names.push_back(kv.first);

  Reference ref;
  {
    State b(cfg, MF_DTYPE_F32, 2);
    mf_ckpt_data d = b.Data();
    ASSERT_EQ(mf_ckpt_read(orig.c_str(), &d, &ref.s), MF_OK) << mf_last_error();
    ref.w = b.w, ref.m = b.m, ref.v = b.v, ref.steps = b.steps, ref.routed = b.routed;
    EXPECT_EQ(b.w, a.w);
    ref.master.assign(a.w.size(), 0.0f);
    ASSERT_EQ(mf_ckpt_read_master(orig.c_str(), a.t, ref.master.data()), MF_OK) << mf_last_error();
    char *json = nullptr;
    ASSERT_EQ(mf_ckpt_read_base_json(orig.c_str(), &json), MF_OK) << mf_last_error();
    ref.base = json;
    free(json);
    mf_ckpt_file mf[32];
    int n = 0;
    ASSERT_EQ(mf_ckpt_read_manifest(orig.c_str(), mf, 32, &n), MF_OK) << mf_last_error();
    ref.manifest = Entries(mf, n);
    ASSERT_EQ(mf_ckpt_check_config(orig.c_str(), cfg), MF_OK) << mf_last_error();
  }

  Mutator mut(seed);
  const std::string dir = out + "/case";
  int done = 0, refused_all = 0, by_kind[3] = {0, 0, 0};
  for (int i = 0; done < cases && i < cases * 4; i++) {
    Files f = files;
    const size_t kind = mut.Below(10);
    Damage dmg;
    if (kind < 6) {
      dmg = mut.Unsealed(f, names);
    } else if (kind < 9) {
      dmg = mut.Resealed(f);
    } else {  // C: a tensor file changed and sealed over
      const std::string name = mut.Below(2) ? "master.safetensors.zst" : "optimizer.safetensors.zst";
      dmg.kind = 'C';
      dmg.what = name + ": " + mut.EditBytes(f[name]) + ", its entry sealed over it";
      dmg.blamed = {name};
    }
    if (dmg.what.empty() || f == files) continue;  // nothing changed: draw again
    WriteDir(dir, f);
    if (dmg.kind == 'C') Reseal(dir, dmg.what.substr(0, dmg.what.find(':')));
    done++;
    by_kind[dmg.kind - 'A']++;
    SCOPED_TRACE("case " + std::to_string(done) + " (seed " + std::to_string(seed) + ", " + dmg.kind + "): " +
                 dmg.what);
    const bool a_kind = dmg.kind == 'A';
    int refused = 0;
    Judge("mf_ckpt_verify", mf_ckpt_verify(dir.c_str()), true, a_kind, dir, dmg, &refused);
    Judge("mf_ckpt_check_config", mf_ckpt_check_config(dir.c_str(), cfg), true, a_kind && dmg.small, dir, dmg,
          &refused);
    {
      State b(cfg, MF_DTYPE_F32, 3);
      mf_ckpt_data d = b.Data();
      mf_ckpt_state s;
      const mf_status st = mf_ckpt_read(dir.c_str(), &d, &s);
      const bool same = st == MF_OK && b.w == ref.w && b.m == ref.m && b.v == ref.v && b.steps == ref.steps &&
                        b.routed == ref.routed && SameState(s, ref.s);
      Judge("mf_ckpt_read", st, same, a_kind, dir, dmg, &refused);
    }
    std::vector<float> master(ref.master.size(), -1.0f);
    const mf_status sm = mf_ckpt_read_master(dir.c_str(), a.t, master.data());
    Judge("mf_ckpt_read_master", sm, master == ref.master, a_kind, dir, dmg, &refused);
    char *json = nullptr;
    const mf_status sb = mf_ckpt_read_base_json(dir.c_str(), &json);
    Judge("mf_ckpt_read_base_json", sb, json && ref.base == json, false, dir, dmg, &refused);
    free(json);
    mf_ckpt_file mf[32];
    int n = 0;
    const mf_status sf = mf_ckpt_read_manifest(dir.c_str(), mf, 32, &n);
    // (B and C rewrote the manifest: what it lists is theirs; the readers above judge the files)
    Judge("mf_ckpt_read_manifest", sf, !a_kind || Entries(mf, n) == ref.manifest, false, dir, dmg, &refused);
    refused_all += refused == 6;
    if (::testing::Test::HasFailure()) break;  // the first case that breaks the rule is the one to read
  }
  EXPECT_EQ(done, cases);
  // Each kind is drawn; B and C must not be accepted wholesale (an edit that
  // changes nothing, such as two entries in another order, may read through).
  EXPECT_GT(by_kind[0], cases / 3);
  EXPECT_GT(by_kind[1], cases / 8);
  EXPECT_GT(by_kind[2], cases / 40);
  printf("%d cases (seed %llu): %d of damage A, %d of B, %d of C; %d refused by every reader\n", done,
         (unsigned long long)seed, by_kind[0], by_kind[1], by_kind[2], refused_all);
  mf_config_free(cfg);
}

}  // namespace
