// Routing statistics: shares from counts, the JSON file's write/read round
// trip, every malformed file an error naming the file, the place and the
// fault, and `moefit train` writing routing.json whose counts cover every
// routed token of every step.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <jansson.h>

#include "experts/routing.h"
#include "src/config/config.h"
#include "src/core/core.h"
#include "src/train/train.h"
#include "src/io/tokens.h"
#include "src/model/spec.h"

namespace {

std::string tmp() {
  const char *t = getenv("TEST_TMPDIR");
  return t ? t : "/tmp";
}

std::string slurp(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

void put(const std::string &path, const std::string &text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
}

// Qwen3-MoE with 4 layers, every second one MoE: layers 0 and 2 dense, 1 and 3 MoE.
mf_model_spec qwen_spec() {
  mf_model_spec s;
  mf_model_spec_defaults(MF_FAMILY_QWEN3_MOE, &s);
  s.hidden = 32;
  s.layers = 4;
  s.heads = 4;
  s.kv_heads = 2;
  s.head_dim = 8;
  s.experts = 4;
  s.top_k = 2;
  s.expert_ffn = 16;
  s.dense_ffn = 32;
  s.vocab = 64;
  s.max_seq = 32;
  s.decoder_sparse_step = 2;
  s.n_mlp_only = 0;
  return s;
}

// Counts over 10 tokens, top-2: each MoE row sums to 20.
std::vector<int64_t> qwen_counts() {
  return {0, 0, 0, 0,   //
          7, 0, 3, 10,  //
          0, 0, 0, 0,   //
          5, 5, 5, 5};
}

TEST(Routing, SharesFromCounts) {
  const mf_model_spec s = qwen_spec();
  ASSERT_EQ(mf_model_spec_layer_is_moe(&s, 0), 0);
  ASSERT_EQ(mf_model_spec_layer_is_moe(&s, 1), 1);
  std::vector<int64_t> c = qwen_counts();
  mf_routing r;
  ASSERT_EQ(mf_routing_from_counts(&s, c.data(), 10, &r), MF_OK) << mf_last_error();
  EXPECT_EQ(r.layers, 4);
  EXPECT_EQ(r.experts, 4);
  EXPECT_EQ(r.top_k, 2);
  EXPECT_EQ(r.tokens, 10u);
  for (int l = 0; l < 4; l++) {
    double sum = 0;
    for (int e = 0; e < 4; e++) sum += r.share[l * 4 + e];
    EXPECT_DOUBLE_EQ(sum, (l % 2) ? 1.0 : 0.0) << "layer " << l;
  }
  EXPECT_DOUBLE_EQ(r.share[1 * 4 + 0], 0.35);
  EXPECT_DOUBLE_EQ(r.share[1 * 4 + 1], 0.0);
  EXPECT_DOUBLE_EQ(r.share[1 * 4 + 3], 0.5);
  EXPECT_DOUBLE_EQ(r.share[3 * 4 + 2], 0.25);
  mf_routing_free(&r);
  EXPECT_EQ(r.share, nullptr);
  EXPECT_EQ(r.layers, 0);
  mf_routing_free(nullptr);

  // Nothing measured: uniform over each MoE layer's experts.
  std::vector<int64_t> zero(16, 0);
  ASSERT_EQ(mf_routing_from_counts(&s, zero.data(), 0, &r), MF_OK) << mf_last_error();
  EXPECT_DOUBLE_EQ(r.share[1 * 4 + 2], 0.25);
  EXPECT_DOUBLE_EQ(r.share[0 * 4 + 2], 0.0);
  mf_routing_free(&r);
}

TEST(Routing, FromCountsRefusesCountsThatDoNotAddUp) {
  const mf_model_spec s = qwen_spec();
  mf_routing r;
  std::vector<int64_t> c = qwen_counts();
  c[4] = 8;  // layer 1 sums to 21
  EXPECT_EQ(mf_routing_from_counts(&s, c.data(), 10, &r), MF_ERR_INVALID_ARG);
  EXPECT_NE(std::string(mf_last_error()).find("counts[1]: the layer's counts sum to more than 20"),
            std::string::npos)
      << mf_last_error();
  EXPECT_EQ(r.share, nullptr);
  c = qwen_counts();
  c[1] = 1;  // a dense layer with a routed token
  EXPECT_EQ(mf_routing_from_counts(&s, c.data(), 10, &r), MF_ERR_INVALID_ARG);
  EXPECT_NE(std::string(mf_last_error()).find("counts[0][1]"), std::string::npos) << mf_last_error();
  c = qwen_counts();
  c[5] = -1;
  c[4] = 8;
  EXPECT_EQ(mf_routing_from_counts(&s, c.data(), 10, &r), MF_ERR_INVALID_ARG);
  EXPECT_NE(std::string(mf_last_error()).find("counts[1][1]: -1 is negative"), std::string::npos)
      << mf_last_error();
  // Nothing is written that would not read back.
  const std::string path = tmp() + "/refused.json";
  std::remove(path.c_str());
  EXPECT_EQ(mf_routing_write(path.c_str(), &s, c.data(), 10), MF_ERR_INVALID_ARG);
  EXPECT_NE(std::string(mf_last_error()).find(path), std::string::npos) << mf_last_error();
  EXPECT_TRUE(slurp(path).empty());
}

TEST(Routing, WriteReadRoundTripIsExact) {
  mf_model_spec s;
  mf_model_spec_defaults(MF_FAMILY_MIXTRAL, &s);
  s.layers = 3;
  s.experts = 8;
  s.top_k = 2;
  // Uneven counts, one expert never reached, large values: 2^40 tokens.
  const uint64_t tokens = (uint64_t)1 << 40;
  std::vector<int64_t> c(24);
  for (int l = 0; l < 3; l++) {
    int64_t left = (int64_t)(tokens * 2);
    for (int e = 0; e < 7; e++) {
      int64_t v = e == 3 ? 0 : left / (3 + e + l);
      c[l * 8 + e] = v;
      left -= v;
    }
    c[l * 8 + 7] = left;
  }
  const std::string path = tmp() + "/sub/routing.json";
  ASSERT_EQ(mf_mkdir_parents(path.c_str()), MF_OK) << mf_last_error();
  ASSERT_EQ(mf_routing_write(path.c_str(), &s, c.data(), tokens), MF_OK) << mf_last_error();
  mf_routing r;
  ASSERT_EQ(mf_routing_read(path.c_str(), &s, &r), MF_OK) << mf_last_error();
  EXPECT_EQ(r.tokens, tokens);
  EXPECT_EQ(r.layers, 3);
  EXPECT_EQ(r.experts, 8);
  EXPECT_EQ(r.top_k, 2);
  for (int i = 0; i < 24; i++) EXPECT_EQ(r.share[i], (double)c[i] / (double)(tokens * 2)) << i;
  mf_routing_free(&r);

  // The file itself, read independently: the counts exactly as given.
  json_error_t jerr;
  json_t *root = json_load_file(path.c_str(), 0, &jerr);
  ASSERT_NE(root, nullptr) << jerr.text;
  EXPECT_STREQ(json_string_value(json_object_get(root, "format")), "moefit-routing");
  EXPECT_EQ(json_integer_value(json_object_get(root, "version")), 1);
  EXPECT_STREQ(json_string_value(json_object_get(json_object_get(root, "model"), "family")), "mixtral");
  EXPECT_EQ((uint64_t)json_integer_value(json_object_get(root, "tokens")), tokens);
  json_t *rows = json_object_get(root, "counts");
  ASSERT_EQ(json_array_size(rows), 3u);
  for (int l = 0; l < 3; l++)
    for (int e = 0; e < 8; e++)
      EXPECT_EQ(json_integer_value(json_array_get(json_array_get(rows, l), e)), c[l * 8 + e]);
  json_decref(root);
  // No temporary left beside it.
  EXPECT_TRUE(slurp(path + ".tmp").empty());

  // Qwen's dense rows round trip as zeros.
  const mf_model_spec q = qwen_spec();
  std::vector<int64_t> qc = qwen_counts();
  ASSERT_EQ(mf_routing_write(path.c_str(), &q, qc.data(), 10), MF_OK) << mf_last_error();
  ASSERT_EQ(mf_routing_read(path.c_str(), &q, &r), MF_OK) << mf_last_error();
  EXPECT_EQ(r.share[0], 0.0);
  EXPECT_EQ(r.share[4 + 3], 0.5);
  mf_routing_free(&r);
  // The mixtral file is not this model's.
  ASSERT_EQ(mf_routing_read(path.c_str(), &s, &r), MF_ERR_CONFIG);
}

// ------------------------------------------------------------ malformed files

const char *kGood =
    "{\"format\": \"moefit-routing\", \"version\": 1,\n"
    " \"model\": {\"family\": \"qwen3_moe\", \"layers\": 4, \"experts\": 4, \"top_k\": 2},\n"
    " \"tokens\": 10,\n"
    " \"counts\": [[0,0,0,0], [7,0,3,10], [0,0,0,0], [5,5,5,5]]}\n";

std::string edit(std::string text, const std::string &from, const std::string &to) {
  size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

struct Bad {
  const char *what;
  std::string text;
  mf_status st;
  std::vector<std::string> parts;  // each must be in the message
};

TEST(Routing, MalformedFilesAreErrorsNamingFilePlaceAndFault) {
  const mf_model_spec s = qwen_spec();
  const std::string path = tmp() + "/bad_routing.json";
  put(path, kGood);
  mf_routing r;
  ASSERT_EQ(mf_routing_read(path.c_str(), &s, &r), MF_OK) << mf_last_error();
  EXPECT_DOUBLE_EQ(r.share[4], 0.35);
  mf_routing_free(&r);

  const std::string g = kGood;
  const std::vector<Bad> cases = {
      {"empty", "", MF_ERR_FORMAT, {"the file is empty"}},
      {"blank", "  \n\t\n", MF_ERR_FORMAT, {"the file is empty"}},
      {"not JSON", "format: moefit-routing\n", MF_ERR_FORMAT, {"line 1", "invalid JSON"}},
      {"truncated", g.substr(0, g.size() / 2), MF_ERR_FORMAT, {"invalid JSON"}},
      {"array at top", "[1, 2]", MF_ERR_FORMAT, {"the top level is an array"}},
      {"too deep", std::string(100, '[') + std::string(100, ']'), MF_ERR_FORMAT, {"nests deeper than"}},
      {"wrong format",
       edit(g, "moefit-routing", "moefit-plan"),
       MF_ERR_FORMAT,
       {"format: expected \"moefit-routing\", got 'moefit-plan'"}},
      {"format not a string",
       edit(g, "\"moefit-routing\"", "3"),
       MF_ERR_FORMAT,
       {"format: expected the string"}},
      {"no format",
       edit(g, "\"format\": \"moefit-routing\",", ""),
       MF_ERR_FORMAT,
       {"(top level): missing 'format'"}},
      {"newer version",
       edit(g, "\"version\": 1", "\"version\": 2"),
       MF_ERR_UNSUPPORTED,
       {"version: routing format version 2 is newer"}},
      {"version 0",
       edit(g, "\"version\": 1", "\"version\": 0"),
       MF_ERR_FORMAT,
       {"version: expected a positive integer"}},
      {"version a string",
       edit(g, "\"version\": 1", "\"version\": \"1\""),
       MF_ERR_FORMAT,
       {"version: expected a positive integer, got a string"}},
      {"no version", edit(g, "\"version\": 1,", ""), MF_ERR_FORMAT, {"(top level): missing 'version'"}},
      {"unknown key",
       edit(g, "\"tokens\": 10,", "\"tokens\": 10, \"steps\": 3,"),
       MF_ERR_FORMAT,
       {"(top level): unknown key 'steps'"}},
      {"unknown model key",
       edit(g, "\"top_k\": 2}", "\"top_k\": 2, \"hidden\": 32}"),
       MF_ERR_FORMAT,
       {"model: unknown key 'hidden'"}},
      {"duplicate key",
       edit(g, "\"tokens\": 10,", "\"tokens\": 10, \"tokens\": 10,"),
       MF_ERR_FORMAT,
       {"invalid JSON", "duplicate"}},
      {"wrong family",
       edit(g, "qwen3_moe", "mixtral"),
       MF_ERR_CONFIG,
       {"model.family: the routing was measured on family mixtral, the model is qwen3_moe"}},
      {"wrong layers",
       edit(g, "\"layers\": 4", "\"layers\": 5"),
       MF_ERR_CONFIG,
       {"model.layers: the routing was measured on a model with layers 5, the model has 4"}},
      {"wrong experts",
       edit(g, "\"experts\": 4", "\"experts\": 8"),
       MF_ERR_CONFIG,
       {"model.experts:", "experts 8"}},
      {"wrong top_k", edit(g, "\"top_k\": 2", "\"top_k\": 1"), MF_ERR_CONFIG, {"model.top_k:", "top_k 1"}},
      {"model not an object",
       edit(g, "{\"family\": \"qwen3_moe\", \"layers\": 4, \"experts\": 4, \"top_k\": 2}", "4"),
       MF_ERR_FORMAT,
       {"model: expected an object, got an integer"}},
      {"no model",
       edit(g, "\"model\": {\"family\": \"qwen3_moe\", \"layers\": 4, \"experts\": 4, \"top_k\": 2},", ""),
       MF_ERR_FORMAT,
       {"(top level): missing 'model'"}},
      {"no top_k", edit(g, ", \"top_k\": 2}", "}"), MF_ERR_FORMAT, {"model: missing 'top_k'"}},
      {"no tokens", edit(g, "\"tokens\": 10,", ""), MF_ERR_FORMAT, {"(top level): missing 'tokens'"}},
      {"negative tokens",
       edit(g, "\"tokens\": 10", "\"tokens\": -10"),
       MF_ERR_FORMAT,
       {"tokens: expected a non-negative integer, got a negative one"}},
      {"real tokens",
       edit(g, "\"tokens\": 10", "\"tokens\": 10.0"),
       MF_ERR_FORMAT,
       {"tokens: expected a non-negative integer, got a real number"}},
      {"no counts",
       edit(g, ",\n \"counts\": [[0,0,0,0], [7,0,3,10], [0,0,0,0], [5,5,5,5]]", ""),
       MF_ERR_FORMAT,
       {"(top level): missing 'counts'"}},
      {"counts not an array",
       edit(g, "[[0,0,0,0], [7,0,3,10], [0,0,0,0], [5,5,5,5]]", "{}"),
       MF_ERR_FORMAT,
       {"counts: expected an array of 4 rows (one per layer), got an object"}},
      {"too few rows",
       edit(g, ", [5,5,5,5]]", "]"),
       MF_ERR_FORMAT,
       {"counts: 3 rows, expected one per layer (model.layers = 4)"}},
      {"row not an array",
       edit(g, "[5,5,5,5]", "20"),
       MF_ERR_FORMAT,
       {"counts[3]: expected an array of 4 counts"}},
      {"short row",
       edit(g, "[7,0,3,10]", "[7,3,10]"),
       MF_ERR_FORMAT,
       {"counts[1]: 3 counts, expected one per expert (model.experts = 4)"}},
      {"negative count",
       edit(g, "[7,0,3,10]", "[8,-1,3,10]"),
       MF_ERR_FORMAT,
       {"counts[1][1]: expected a non-negative integer, got a negative one"}},
      {"real count",
       edit(g, "[7,0,3,10]", "[7,0,3,10.5]"),
       MF_ERR_FORMAT,
       {"counts[1][3]: expected a non-negative integer, got a real number"}},
      {"string count",
       edit(g, "[7,0,3,10]", "[7,\"0\",3,10]"),
       MF_ERR_FORMAT,
       {"counts[1][1]: expected a non-negative integer, got a string"}},
      {"null count", edit(g, "[5,5,5,5]", "[5,5,5,null]"), MF_ERR_FORMAT, {"counts[3][3]:", "got null"}},
      {"sum too small",
       edit(g, "[7,0,3,10]", "[7,0,3,9]"),
       MF_ERR_FORMAT,
       {"counts[1]: the layer's counts sum to 19, expected tokens x top_k = 10 x 2 = 20"}},
      {"sum too large", edit(g, "[5,5,5,5]", "[5,5,5,6]"), MF_ERR_FORMAT, {"counts[3]:", "more than 20"}},
      {"tokens not counts' tokens",
       edit(g, "\"tokens\": 10", "\"tokens\": 20"),
       MF_ERR_FORMAT,
       {"counts[1]: the layer's counts sum to 20, expected tokens x top_k = 20 x 2 = 40"}},
      {"routed dense layer",
       edit(g, "[0,0,0,0], [7", "[0,2,0,0], [7"),
       MF_ERR_CONFIG,
       {"counts[0][1]: 2 tokens routed in layer 0, a dense MLP layer"}},
      {"MoE layer that routed nothing (another model's dense layer)",
       edit(g, "[5,5,5,5]", "[0,0,0,0]"),
       MF_ERR_CONFIG,
       {"counts[3]: no tokens routed in layer 3: the routing was measured on a model whose layer 3 is a "
        "dense MLP "
        "layer; this model's is an MoE layer"}},
  };
  for (const Bad &b : cases) {
    put(path, b.text);
    r.layers = 99;  // overwritten: zeroed on failure
    mf_status st = mf_routing_read(path.c_str(), &s, &r);
    std::string err = mf_last_error();
    EXPECT_EQ(st, b.st) << b.what << ": " << err;
    EXPECT_EQ(r.share, nullptr) << b.what;
    EXPECT_EQ(r.layers, 0) << b.what;
    EXPECT_EQ(err.rfind(path + ": ", 0), 0u) << b.what << ": the message starts with the file: " << err;
    for (const std::string &p : b.parts)
      EXPECT_NE(err.find(p), std::string::npos) << b.what << ": " << p << " in: " << err;
  }
  // A file that is not there.
  EXPECT_EQ(mf_routing_read((tmp() + "/no_such_routing.json").c_str(), &s, &r), MF_ERR_IO);
  EXPECT_NE(std::string(mf_last_error()).find("no_such_routing.json"), std::string::npos) << mf_last_error();
}

// ------------------------------------------------------------ moefit train

std::string make_corpus() {
  const std::string path = tmp() + "/routing_corpus.tokens";
  mf_tokens_writer *w = nullptr;
  EXPECT_EQ(mf_tokens_writer_create(path.c_str(), 64, 2, 0, &w), MF_OK) << mf_last_error();
  uint32_t state = 11;
  std::vector<uint32_t> ids;
  for (int i = 0; i < 4000; i++) {
    state = state * 1664525u + 1013904223u;
    ids.push_back((state >> 20) % 64);
  }
  EXPECT_EQ(mf_tokens_writer_append(w, ids.data(), nullptr, ids.size()), MF_OK) << mf_last_error();
  EXPECT_EQ(mf_tokens_writer_end_document(w), MF_OK);
  EXPECT_EQ(mf_tokens_writer_finish(w), MF_OK) << mf_last_error();
  mf_tokens_writer_free(w);
  return path;
}

// A Qwen3-MoE run (dense layers 0 and 2, MoE 1 and 3): routing.json's counts
// cover every input token of every step, top_k times per MoE layer.
TEST(Routing, TrainWritesRoutingOfEveryStep) {
  const std::string out = tmp() + "/routing_run";
  const int64_t steps = 3, B = 2, S = 16, G = 2, K = 2;
  std::ostringstream y;
  y << "model:\n  init: {family: qwen3_moe, hidden: 32, layers: 4, heads: 4, kv_heads: 2, head_dim: 8,\n"
       "         experts: 4, top_k: "
    << K << ", expert_ffn: 16, dense_ffn: 32, decoder_sparse_step: 2, vocab: 64, max_seq: 32, seed: 3}\n"
    << "data: {train: " << make_corpus() << ", seq_len: " << S << "}\n"
    << "train: {micro_batch: " << B << ", grad_accum: " << G << ", steps: " << steps
    << ", lr: 1e-3, warmup: 1, log_every: 10, threads: 2}\n"
    << "output: {dir: " << out << "}\nbackend: cpu\n";
  const std::string text = y.str();
  mf_config *cfg = nullptr;
  ASSERT_EQ(mf_config_load_string(text.c_str(), text.size(), "routing.yaml", nullptr, 0, &cfg), MF_OK)
      << mf_last_error();
  mf_train_summary sum;
  ASSERT_EQ(mf_train(cfg, 1, &sum), MF_OK) << mf_last_error();
  ASSERT_EQ(sum.steps, steps);

  const std::string path = out + "/routing.json";
  const uint64_t tokens = (uint64_t)(steps * B * S * G);
  json_error_t jerr;
  json_t *root = json_load_file(path.c_str(), 0, &jerr);
  ASSERT_NE(root, nullptr) << path << ": " << jerr.text;
  EXPECT_EQ((uint64_t)json_integer_value(json_object_get(root, "tokens")), tokens);
  json_t *rows = json_object_get(root, "counts");
  ASSERT_EQ(json_array_size(rows), 4u);
  int spread = 0;
  for (size_t l = 0; l < 4; l++) {
    int64_t total = 0, nonzero = 0;
    json_t *row = json_array_get(rows, l);
    ASSERT_EQ(json_array_size(row), 4u);
    for (size_t e = 0; e < 4; e++) {
      int64_t v = json_integer_value(json_array_get(row, e));
      total += v;
      nonzero += v > 0;
    }
    EXPECT_EQ(total, l % 2 ? (int64_t)tokens * K : 0) << "layer " << l;
    spread += nonzero > 1;
  }
  EXPECT_EQ(spread, 2) << "a random router reaches more than one expert";
  json_decref(root);

  mf_routing r;
  ASSERT_EQ(mf_routing_read(path.c_str(), &cfg->model.init, &r), MF_OK) << mf_last_error();
  EXPECT_EQ(r.tokens, tokens);
  double s1 = 0;
  for (int e = 0; e < 4; e++) s1 += r.share[4 + e];
  EXPECT_NEAR(s1, 1.0, 1e-12);
  mf_routing_free(&r);

  // memory.routing auto finds it in output.dir; none ignores it; a path reads that file.
  int found = 0;
  char used[1024];
  ASSERT_EQ(mf_routing_for_config(cfg, &cfg->model.init, &r, &found, used, sizeof used, nullptr, 0), MF_OK)
      << mf_last_error();
  EXPECT_EQ(found, 1);
  EXPECT_EQ(std::string(used), path);
  EXPECT_EQ(r.tokens, tokens);
  mf_routing_free(&r);
  mf_config *none = nullptr, *file = nullptr, *missing = nullptr, *fresh = nullptr;
  const char *o_none[] = {"memory.routing=none"};
  ASSERT_EQ(mf_config_load_string(text.c_str(), text.size(), "routing.yaml", o_none, 1, &none), MF_OK);
  ASSERT_EQ(mf_routing_for_config(none, &none->model.init, &r, &found, nullptr, 0, nullptr, 0), MF_OK);
  EXPECT_EQ(found, 0);
  EXPECT_EQ(r.share, nullptr);
  const std::string o_file_s = "memory.routing=" + path;
  const char *o_file[] = {o_file_s.c_str()};
  ASSERT_EQ(mf_config_load_string(text.c_str(), text.size(), "routing.yaml", o_file, 1, &file), MF_OK);
  ASSERT_EQ(mf_routing_for_config(file, &file->model.init, &r, &found, nullptr, 0, nullptr, 0), MF_OK)
      << mf_last_error();
  EXPECT_EQ(found, 1);
  mf_routing_free(&r);
  const std::string o_missing_s = "memory.routing=" + tmp() + "/nowhere/routing.json";
  const char *o_missing[] = {o_missing_s.c_str()};
  ASSERT_EQ(mf_config_load_string(text.c_str(), text.size(), "routing.yaml", o_missing, 1, &missing), MF_OK);
  EXPECT_NE(mf_routing_for_config(missing, &missing->model.init, &r, &found, nullptr, 0, nullptr, 0), MF_OK);
  EXPECT_NE(std::string(mf_last_error()).find("nowhere/routing.json"), std::string::npos) << mf_last_error();
  const std::string o_fresh_s = "output.dir=" + tmp() + "/routing_fresh_dir";
  const char *o_fresh[] = {o_fresh_s.c_str()};
  ASSERT_EQ(mf_config_load_string(text.c_str(), text.size(), "routing.yaml", o_fresh, 1, &fresh), MF_OK);
  ASSERT_EQ(mf_routing_for_config(fresh, &fresh->model.init, &r, &found, nullptr, 0, nullptr, 0), MF_OK);
  EXPECT_EQ(found, 0) << "auto without a routing.json: uniform";
  // auto: a file measured on another model is not this model's routing —
  // uniform, and one line saying why. A file named in memory.routing that was
  // measured on another model is an error naming it and the way out.
  mf_model_spec other = cfg->model.init;
  other.experts = 8;
  char note[1536] = "unset";
  ASSERT_EQ(mf_routing_for_config(cfg, &other, &r, &found, used, sizeof used, note, sizeof note), MF_OK)
      << mf_last_error();
  EXPECT_EQ(found, 0);
  EXPECT_EQ(r.share, nullptr);
  EXPECT_STREQ(used, "");
  EXPECT_EQ(std::string(note),
            "routing: " + path +
                ": model.experts: the routing was measured on a model with experts 4, the model "
                "has 8; planning with uniform routing (memory.routing: auto)");
  EXPECT_EQ(mf_routing_for_config(file, &other, &r, &found, nullptr, 0, note, sizeof note), MF_ERR_CONFIG);
  EXPECT_EQ(std::string(mf_last_error()),
            "memory.routing: " + path +
                ": model.experts: the routing was measured on a model with experts "
                "4, the model has 8; it is not this model's routing: set "
                "memory.routing=none to plan with uniform routing");
  EXPECT_EQ(found, 0);
  // Measured on this model: no note.
  ASSERT_EQ(mf_routing_for_config(cfg, &cfg->model.init, &r, &found, nullptr, 0, note, sizeof note), MF_OK);
  EXPECT_EQ(found, 1);
  EXPECT_STREQ(note, "");
  mf_routing_free(&r);
  // Another family (the spec's layers and dense layers kept): also passed over.
  mf_model_spec olmoe = cfg->model.init;
  olmoe.family = MF_FAMILY_OLMOE;
  ASSERT_EQ(mf_routing_for_config(cfg, &olmoe, &r, &found, nullptr, 0, note, sizeof note), MF_OK);
  EXPECT_EQ(found, 0);
  EXPECT_NE(std::string(note).find("the routing was measured on family qwen3_moe, the model is olmoe"),
            std::string::npos)
      << note;
  // Another layout of dense layers (every layer MoE here; the file's layers 0
  // and 2 are dense): passed over too.
  mf_model_spec all_moe = cfg->model.init;
  all_moe.decoder_sparse_step = 1;
  ASSERT_EQ(mf_routing_for_config(cfg, &all_moe, &r, &found, nullptr, 0, note, sizeof note), MF_OK);
  EXPECT_EQ(found, 0);
  EXPECT_NE(std::string(note).find("counts[0]: no tokens routed in layer 0"), std::string::npos) << note;
  // A malformed file stays an error, auto or not.
  put(path, "{");
  EXPECT_EQ(mf_routing_for_config(cfg, &cfg->model.init, &r, &found, nullptr, 0, note, sizeof note),
            MF_ERR_FORMAT);
  EXPECT_NE(std::string(mf_last_error()).find(path), std::string::npos) << mf_last_error();
  mf_config_free(none);
  mf_config_free(file);
  mf_config_free(missing);
  mf_config_free(fresh);
  mf_config_free(cfg);
}

}  // namespace
