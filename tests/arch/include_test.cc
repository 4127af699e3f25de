// The folders' include arrows (docs/development.md "Layout"): reads the
// `#include "..."` lines of every C, C++ and CUDA source of the library and
// the tests (each package's `sources` filegroup, tools/build_defs.bzl
// mf_sources) and fails on
//   - an include that points up or sideways in the levels below (docs/
//     development.md "Layout"): a folder includes its own headers and those of folders on
//     a lower level — the design's cli → train → exec → planner → experts →
//     model → kernels/backend.h → core, with io and config beside model
//     (the model reads its files through io; the config names the model's
//     family), optim beside experts, ckpt beside exec, comm beside kernels;
//   - a cycle between folders (reported as the path around it);
//   - an include past kernels/backend.h and kernels/registry.h from outside
//     kernels/: backends are created by name (kernels/registry.h), nothing
//     else includes kernels/cpu or kernels/cuda. Only the twin tests
//     (tests/kernels, tests/cuda), which test a backend's kernels directly,
//     may.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

namespace {

// Modules by folder, with their place in the layering (a module includes only
// modules of a lower rank). kernels/cpu and kernels/cuda belong to kernels.
struct Module {
  const char *folder;
  const char *name;
  int rank;
};
const Module kModules[] = {
    {"src/core/", "core", 0},       {"kernels/", "kernels", 1},  {"comm/", "comm", 1},
    {"src/io/", "io", 2},           {"src/model/", "model", 3},  {"src/config/", "config", 4},
    {"src/optim/", "optim", 5},     {"experts/", "experts", 5},  {"planner/", "planner", 6},
    {"src/exec/", "exec", 7},       {"src/ckpt/", "ckpt", 7},    {"src/train/", "train", 8},
    {"src/cli/", "cli", 9},
};

const Module *module_of(const std::string &path) {
  const Module *best = nullptr;
  for (const Module &m : kModules)
    if (path.rfind(m.folder, 0) == 0 && (!best || strlen(m.folder) > strlen(best->folder))) best = &m;
  return best;
}

struct Include {
  std::string from, to;  // workspace paths
  int line;
};

bool is_source(const std::string &name) {
  static const std::regex ext(R"(.*\.(c|h|cc|cu|cuh)$)");
  return std::regex_match(name, ext);
}

// Every source under `dir` of the runfiles tree (the test's data), recursively.
void walk(const std::string &dir, std::vector<std::string> *out) {
  DIR *d = opendir(dir.empty() ? "." : dir.c_str());
  if (!d) return;
  while (struct dirent *e = readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == ".." || name == "external" || name.rfind("_", 0) == 0) continue;
    const std::string path = dir.empty() ? name : dir + "/" + name;
    struct stat st;
    if (stat(path.c_str(), &st) != 0) continue;
    if (S_ISDIR(st.st_mode))
      walk(path, out);
    else if (is_source(name))
      out->push_back(path);
  }
  closedir(d);
}

std::vector<Include> read_includes(const std::vector<std::string> &files) {
  static const std::regex inc(R"(^\s*#\s*include\s+"([^"]+)\")");
  std::vector<Include> out;
  for (const std::string &f : files) {
    std::ifstream in(f);
    std::string line;
    int n = 0;
    while (std::getline(in, line)) {
      n++;
      std::smatch m;
      if (std::regex_search(line, m, inc)) out.push_back({f, m[1].str(), n});
    }
  }
  return out;
}

class Includes : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    walk("", &files_);
    includes_ = read_includes(files_);
  }
  static std::vector<std::string> files_;
  static std::vector<Include> includes_;
};
std::vector<std::string> Includes::files_;
std::vector<Include> Includes::includes_;

// The check reads what it should: every module's folder has sources here.
TEST_F(Includes, EveryModuleIsRead) {
  for (const Module &m : kModules) {
    if (std::string(m.name) == "ckpt") continue;  // not built yet
    int n = 0;
    for (const std::string &f : files_) n += f.rfind(m.folder, 0) == 0;
    EXPECT_GT(n, 0) << "no sources of " << m.folder << " in the test's data: add mf_sources() to its BUILD and "
                    << "the filegroup to tests/arch/BUILD";
  }
  EXPECT_GT(includes_.size(), 500u);
}

TEST_F(Includes, FollowTheLayering) {
  for (const Include &i : includes_) {
    const Module *from = module_of(i.from), *to = module_of(i.to);
    if (!from || !to || from == to) continue;
    EXPECT_LT(to->rank, from->rank) << i.from << ":" << i.line << ": " << from->name << " includes " << i.to
                                    << " (" << to->name << "): " << to->name << " is not below " << from->name
                                    << " in the layering (tests/arch/include_test.cc)";
  }
}

TEST_F(Includes, NoCycleBetweenFolders) {
  std::map<std::string, std::set<std::string>> edges;
  std::map<std::pair<std::string, std::string>, std::string> where;
  for (const Include &i : includes_) {
    const Module *from = module_of(i.from), *to = module_of(i.to);
    if (!from || !to || from == to) continue;
    edges[from->name].insert(to->name);
    where.emplace(std::make_pair(std::string(from->name), std::string(to->name)),
                  i.from + ":" + std::to_string(i.line) + " includes " + i.to);
  }
  std::map<std::string, int> state;  // 0 new, 1 on the path, 2 done
  std::vector<std::string> path;
  std::string cycle;
  std::function<void(const std::string &)> dfs = [&](const std::string &m) {
    state[m] = 1;
    path.push_back(m);
    for (const std::string &n : edges[m]) {
      if (!cycle.empty()) break;
      if (state[n] == 1) {
        size_t k = 0;
        while (path[k] != n) k++;
        for (size_t j = k; j < path.size(); j++) {
          const std::string &a = path[j], &b = j + 1 < path.size() ? path[j + 1] : n;
          cycle += "\n  " + a + " -> " + b + " (" + where[{a, b}] + ")";
        }
      } else if (state[n] == 0) {
        dfs(n);
      }
    }
    path.pop_back();
    state[m] = 2;
  };
  for (const auto &e : edges)
    if (state[e.first] == 0 && cycle.empty()) dfs(e.first);
  EXPECT_TRUE(cycle.empty()) << "a cycle between folders:" << cycle;
}

TEST_F(Includes, NothingOutsideKernelsIncludesABackendsOwnHeaders) {
  for (const Include &i : includes_) {
    if (i.to.rfind("kernels/", 0) != 0 || i.from.rfind("kernels/", 0) == 0) continue;
    if (i.to == "kernels/backend.h" || i.to == "kernels/registry.h") continue;
    if (i.from.rfind("tests/kernels/", 0) == 0 || i.from.rfind("tests/cuda/", 0) == 0) continue;  // the twin tests
    ADD_FAILURE() << i.from << ":" << i.line << ": includes " << i.to
                  << ": outside kernels/ only kernels/backend.h and kernels/registry.h (create backends by name)";
  }
}

}  // namespace
