// Sharded sets: the writer's layout and index, opening by dir / index / shard,
// and the index rules (each fault is MF_ERR_FORMAT naming the file and fault).

#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "src/core/core.h"
#include "src/io/safetensors.h"
#include "tests/safetensors/st_test_util.h"

using st_test::Exists;
using st_test::ReadFile;
using st_test::WriteFile;

namespace {

struct Tensor {
  std::string name;
  std::vector<float> data;
};

// n F32 tensors of `elems` floats each, named layers.<i>.w.
std::vector<Tensor> Layers(int n, int elems) {
  std::vector<Tensor> ts;
  for (int i = 0; i < n; i++) {
    Tensor t{"model.layers." + std::to_string(i) + ".w", std::vector<float>(elems)};
    for (int k = 0; k < elems; k++) t.data[k] = (float)(i * 100 + k);
    ts.push_back(t);
  }
  return ts;
}

std::vector<mf_st_tensor> View(const std::vector<Tensor> &ts) {
  std::vector<mf_st_tensor> v(ts.size());
  for (size_t i = 0; i < ts.size(); i++) {
    memset(&v[i], 0, sizeof v[i]);
    v[i].name = ts[i].name.c_str();
    v[i].dtype = MF_DTYPE_F32;
    v[i].ndim = 1;
    v[i].shape[0] = (int64_t)ts[i].data.size();
    v[i].data = ts[i].data.data();
  }
  return v;
}

void ExpectSame(const mf_safetensors *st, const std::vector<Tensor> &ts) {
  ASSERT_EQ(mf_safetensors_count(st), ts.size());
  for (const Tensor &t : ts) {
    const mf_st_tensor *r = mf_safetensors_find(st, t.name.c_str());
    ASSERT_NE(r, nullptr) << t.name;
    ASSERT_EQ(r->nbytes, t.data.size() * 4);
    EXPECT_EQ(memcmp(r->data, t.data.data(), r->nbytes), 0) << t.name;
  }
}

TEST(SafetensorsSharded, RoundTrip) {
  std::string dir = st_test::TestDir() + "/ckpt";
  std::vector<Tensor> ts = Layers(6, 8);  // 32 bytes each
  std::vector<mf_st_tensor> v = View(ts);
  mf_st_meta meta[] = {{"producer", "moefit"}};
  size_t n_shards = 0;
  ASSERT_EQ(mf_safetensors_write_sharded(dir.c_str(), v.data(), v.size(), meta, 1, 64, &n_shards), MF_OK)
      << mf_last_error();
  EXPECT_EQ(n_shards, 3u);
  for (int i = 1; i <= 3; i++) {
    std::string shard = dir + "/model-0000" + std::to_string(i) + "-of-00003.safetensors";
    EXPECT_TRUE(Exists(shard)) << shard;
    EXPECT_FALSE(Exists(shard + ".tmp"));
  }
  EXPECT_FALSE(Exists(dir + "/model.safetensors"));

  // The index: indent 2, sorted keys, total_size = tensor bytes, trailing newline.
  std::string index = ReadFile(dir + "/model.safetensors.index.json");
  EXPECT_EQ(index.rfind("{\n  \"metadata\": {\n    \"total_size\": 192\n  },\n  \"weight_map\": {\n", 0), 0u)
      << index;
  EXPECT_NE(index.find("    \"model.layers.0.w\": \"model-00001-of-00003.safetensors\",\n"),
            std::string::npos);
  EXPECT_NE(index.find("    \"model.layers.5.w\": \"model-00003-of-00003.safetensors\"\n"),
            std::string::npos);
  EXPECT_EQ(index.back(), '\n');

  const std::string ways[] = {dir, dir + "/", dir + "/model.safetensors.index.json",
                              dir + "/model-00002-of-00003.safetensors"};
  for (const std::string &path : ways) {
    SCOPED_TRACE(path);
    mf_safetensors *st = nullptr;
    ASSERT_EQ(mf_safetensors_open(path.c_str(), &st), MF_OK) << mf_last_error();
    ExpectSame(st, ts);
    EXPECT_EQ(mf_safetensors_shard_count(st), 3u);
    EXPECT_NE(std::string(mf_safetensors_index_path(st)).find("model.safetensors.index.json"),
              std::string::npos);
    EXPECT_NE(std::string(mf_safetensors_shard_path(st, 2)).find("model-00003-of-00003.safetensors"),
              std::string::npos);
    EXPECT_EQ(mf_safetensors_find(st, "model.layers.4.w")->shard, 2);
    EXPECT_STREQ(mf_safetensors_metadata(st, "format"), "pt");
    EXPECT_STREQ(mf_safetensors_metadata(st, "producer"), "moefit");
    EXPECT_EQ(mf_safetensors_metadata_count(st), 2u);  // merged over shards, no repeats
    ASSERT_EQ(mf_safetensors_index_metadata_count(st), 1u);
    EXPECT_STREQ(mf_safetensors_index_metadata_at(st, 0)->key, "total_size");
    EXPECT_STREQ(mf_safetensors_index_metadata_at(st, 0)->value, "192");
    EXPECT_EQ(mf_safetensors_total_bytes(st), 192u);
    mf_safetensors_close(st);
  }

  // open_file reads one shard alone.
  mf_safetensors *one = nullptr;
  ASSERT_EQ(mf_safetensors_open_file((dir + "/model-00002-of-00003.safetensors").c_str(), &one), MF_OK);
  EXPECT_EQ(mf_safetensors_count(one), 2u);
  EXPECT_NE(mf_safetensors_find(one, "model.layers.2.w"), nullptr);
  mf_safetensors_close(one);
}

TEST(SafetensorsSharded, OversizedTensorGetsItsOwnShard) {
  std::string dir = st_test::TestDir();
  std::vector<Tensor> ts = {
      {"a", std::vector<float>(2)}, {"big", std::vector<float>(100)}, {"c", std::vector<float>(2)}};
  std::vector<mf_st_tensor> v = View(ts);
  size_t n_shards = 0;
  ASSERT_EQ(mf_safetensors_write_sharded(dir.c_str(), v.data(), v.size(), nullptr, 0, 64, &n_shards), MF_OK)
      << mf_last_error();
  EXPECT_EQ(n_shards, 3u);
  mf_safetensors *st = nullptr;
  ASSERT_EQ(mf_safetensors_open(dir.c_str(), &st), MF_OK) << mf_last_error();
  EXPECT_EQ(mf_safetensors_find(st, "a")->shard, 0);
  EXPECT_EQ(mf_safetensors_find(st, "big")->shard, 1);
  EXPECT_EQ(mf_safetensors_find(st, "c")->shard, 2);
  ExpectSame(st, ts);
  mf_safetensors_close(st);
}

// One shard is written as model.safetensors (no index), as transformers does;
// a later save replaces the earlier layout's files.
TEST(SafetensorsSharded, SingleShardAndStaleFiles) {
  std::string dir = st_test::TestDir() + "/ckpt";
  std::vector<Tensor> ts = Layers(4, 8);
  std::vector<mf_st_tensor> v = View(ts);
  size_t n_shards = 0;
  ASSERT_EQ(mf_safetensors_write_sharded(dir.c_str(), v.data(), v.size(), nullptr, 0, 32, &n_shards), MF_OK);
  EXPECT_EQ(n_shards, 4u);
  WriteFile(dir + "/notes.txt", "keep me");

  ASSERT_EQ(mf_safetensors_write_sharded(dir.c_str(), v.data(), v.size(), nullptr, 0, 64, &n_shards), MF_OK);
  EXPECT_EQ(n_shards, 2u);
  EXPECT_FALSE(Exists(dir + "/model-00001-of-00004.safetensors"));
  EXPECT_FALSE(Exists(dir + "/model-00004-of-00004.safetensors"));
  EXPECT_TRUE(Exists(dir + "/model-00002-of-00002.safetensors"));

  ASSERT_EQ(mf_safetensors_write_sharded(dir.c_str(), v.data(), v.size(), nullptr, 0, 1 << 20, &n_shards),
            MF_OK);
  EXPECT_EQ(n_shards, 1u);
  EXPECT_TRUE(Exists(dir + "/model.safetensors"));
  EXPECT_FALSE(Exists(dir + "/model.safetensors.index.json"));
  EXPECT_FALSE(Exists(dir + "/model-00001-of-00002.safetensors"));
  EXPECT_EQ(ReadFile(dir + "/notes.txt"), "keep me");
  mf_safetensors *st = nullptr;
  ASSERT_EQ(mf_safetensors_open(dir.c_str(), &st), MF_OK) << mf_last_error();
  EXPECT_EQ(mf_safetensors_index_path(st), nullptr);
  ExpectSame(st, ts);
  mf_safetensors_close(st);

  // Back to sharded: the single file goes, or loaders would pick it first.
  ASSERT_EQ(mf_safetensors_write_sharded(dir.c_str(), v.data(), v.size(), nullptr, 0, 64, &n_shards), MF_OK);
  EXPECT_FALSE(Exists(dir + "/model.safetensors"));
  ASSERT_EQ(mf_safetensors_open(dir.c_str(), &st), MF_OK) << mf_last_error();
  EXPECT_EQ(mf_safetensors_shard_count(st), 2u);
  mf_safetensors_close(st);
}

TEST(SafetensorsSharded, WriterRefusesBadArguments) {
  std::string dir = st_test::TestDir() + "/ckpt";
  std::vector<Tensor> ts = {{"a", std::vector<float>(2)}, {"a", std::vector<float>(2)}};
  std::vector<mf_st_tensor> v = View(ts);
  EXPECT_EQ(mf_safetensors_write_sharded(dir.c_str(), v.data(), v.size(), nullptr, 0, 4, nullptr),
            MF_ERR_INVALID_ARG);
  EXPECT_NE(std::string(mf_last_error()).find("appears twice"), std::string::npos);
  EXPECT_FALSE(Exists(dir));  // refused before anything was created
  EXPECT_EQ(mf_safetensors_write_sharded(dir.c_str(), v.data(), 1, nullptr, 0, 0, nullptr),
            MF_ERR_INVALID_ARG);
}

// ---------------------------------------------------------- index faults

class IndexFaults : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = st_test::TestDir();
    // s1: a, b   s2: c, d   s3 (b again): b   s4: e (unlisted anywhere)
    WriteShard("s1.safetensors", {"a", "b"});
    WriteShard("s2.safetensors", {"c", "d"});
    WriteShard("s3.safetensors", {"b"});
    WriteShard("s4.safetensors", {"e"});
  }
  void WriteShard(const std::string &name, const std::vector<std::string> &names) {
    std::vector<Tensor> ts;
    for (const std::string &n : names) ts.push_back({n, std::vector<float>(4, 1.0f)});
    std::vector<mf_st_tensor> v = View(ts);
    ASSERT_EQ(mf_safetensors_write((dir_ + "/" + name).c_str(), v.data(), v.size(), nullptr, 0), MF_OK);
  }
  // Writes the index and opens it; returns the status.
  mf_status Open(const std::string &index_json, mf_safetensors **st = nullptr) {
    std::string path = dir_ + "/model.safetensors.index.json";
    WriteFile(path, index_json);
    mf_safetensors *tmp = nullptr;
    mf_status s = mf_safetensors_open(path.c_str(), st ? st : &tmp);
    if (!st) mf_safetensors_close(tmp);
    return s;
  }
  void ExpectFormat(const std::string &index_json, const std::string &fault) {
    mf_error_clear();
    EXPECT_EQ(Open(index_json), MF_ERR_FORMAT) << mf_last_error();
    std::string msg = mf_last_error();
    EXPECT_NE(msg.find("model.safetensors.index.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find(fault), std::string::npos) << "expected \"" << fault << "\" in: " << msg;
  }
  std::string dir_;
};

const char kGood[] = R"({"metadata": {"total_size": 64}, "weight_map": {
  "a": "s1.safetensors", "b": "s1.safetensors", "c": "s2.safetensors", "d": "s2.safetensors"}})";

TEST_F(IndexFaults, GoodIndexOpens) {
  mf_safetensors *st = nullptr;
  ASSERT_EQ(Open(kGood, &st), MF_OK) << mf_last_error();
  EXPECT_EQ(mf_safetensors_count(st), 4u);
  EXPECT_EQ(mf_safetensors_shard_count(st), 2u);
  mf_safetensors_close(st);
}

TEST_F(IndexFaults, MissingShard) {
  ExpectFormat(R"({"weight_map": {"a": "s1.safetensors", "z": "s9.safetensors"}})",
               "names shard \"s9.safetensors\", which does not exist");
}

TEST_F(IndexFaults, ShardNameEscapesTheDirectory) {
  ExpectFormat(R"({"weight_map": {"a": "../s1.safetensors"}})", "is not a plain file name");
  ExpectFormat(R"({"weight_map": {"a": "/etc/passwd"}})", "is not a plain file name");
  ExpectFormat(R"({"weight_map": {"a": ".."}})", "is not a plain file name");
  ExpectFormat(R"({"weight_map": {"a": ""}})", "is not a plain file name");
}

TEST_F(IndexFaults, TensorMissingFromItsShard) {
  ExpectFormat(R"({"weight_map": {"a": "s1.safetensors", "b": "s1.safetensors", "x": "s1.safetensors"}})",
               "maps tensor \"x\" to shard s1.safetensors, which has no such tensor");
}

TEST_F(IndexFaults, TensorInTwoShards) {
  ExpectFormat(R"({"weight_map": {"a": "s1.safetensors", "b": "s1.safetensors", "x": "s3.safetensors"}})",
               "tensor \"b\" is in two shards: s1.safetensors and s3.safetensors");
}

TEST_F(IndexFaults, TensorInAnotherShardThanMapped) {
  ExpectFormat(R"({"weight_map": {"a": "s1.safetensors", "b": "s3.safetensors", "c": "s2.safetensors",
               "d": "s2.safetensors"}})",
               "is in two shards");
  ExpectFormat(R"({"weight_map": {"a": "s2.safetensors", "c": "s1.safetensors"}})",
               "is in shard s1.safetensors, but weight_map maps it to s2.safetensors");
}

TEST_F(IndexFaults, WrongTypes) {
  ExpectFormat("[]", "index is an array, expected a JSON object");
  ExpectFormat("{\"weight_map\": ", "index is not valid JSON");
  ExpectFormat("{\"metadata\": {}}", "no \"weight_map\" key");
  ExpectFormat("{\"weight_map\": []}", "weight_map is an array");
  ExpectFormat("{\"weight_map\": {\"a\": 1}}", "weight_map[\"a\"] is an integer");
  ExpectFormat("{\"metadata\": 3, \"weight_map\": {}}", "metadata is an integer");
  ExpectFormat(
      "{\"metadata\": {\"total_size\": \"64\"}, \"weight_map\": {\"a\": \"s1.safetensors\", \"b\": "
      "\"s1.safetensors\"}}",
      "metadata.total_size is a string");
  ExpectFormat(
      "{\"metadata\": {\"total_size\": -1}, \"weight_map\": {\"a\": \"s1.safetensors\", \"b\": "
      "\"s1.safetensors\"}}",
      "metadata.total_size is negative");
  ExpectFormat("{\"weight_map\": {\"a\": \"s1.safetensors\", \"a\": \"s1.safetensors\"}}",
               "duplicate object key");
  ExpectFormat("{\"weight_map\": " + std::string(5000, '[') + "}", "nests deeper than");
}

TEST_F(IndexFaults, MalformedShardIsNamed) {
  WriteFile(dir_ + "/s5.safetensors", std::string("\x02\0\0\0\0\0\0\0[]", 10));
  mf_error_clear();
  EXPECT_EQ(Open(R"({"weight_map": {"a": "s1.safetensors", "b": "s1.safetensors", "q": "s5.safetensors"}})"),
            MF_ERR_FORMAT);
  EXPECT_NE(std::string(mf_last_error()).find("s5.safetensors: header does not start with '{'"),
            std::string::npos)
      << mf_last_error();
}

// Decisions, not faults: unlisted shard tensors are kept (warning); a wrong
// total_size is a warning; extra top-level keys are ignored.
TEST_F(IndexFaults, LenientCases) {
  mf_safetensors *st = nullptr;
  ASSERT_EQ(Open(R"({"metadata": {"total_size": 1, "total_parameters": 20, "note": "x"}, "extra": [1],
                    "weight_map": {"a": "s1.safetensors", "e": "s4.safetensors"}})",
                 &st),
            MF_OK)
      << mf_last_error();
  EXPECT_EQ(mf_safetensors_count(st), 3u);  // b is unlisted but kept
  EXPECT_NE(mf_safetensors_find(st, "b"), nullptr);
  EXPECT_EQ(mf_safetensors_index_metadata_count(st), 3u);
  mf_safetensors_close(st);
}

TEST_F(IndexFaults, ShardNotInIndex) {
  WriteFile(dir_ + "/model.safetensors.index.json", kGood);
  // model-...-of-... names look for model.safetensors.index.json beside them.
  WriteShard("model-00003-of-00003.safetensors", {"zz"});
  mf_safetensors *st = nullptr;
  EXPECT_EQ(mf_safetensors_open((dir_ + "/model-00003-of-00003.safetensors").c_str(), &st), MF_ERR_FORMAT);
  EXPECT_NE(std::string(mf_last_error()).find("does not list shard \"model-00003-of-00003.safetensors\""),
            std::string::npos)
      << mf_last_error();
  // open_file still reads it alone.
  ASSERT_EQ(mf_safetensors_open_file((dir_ + "/model-00003-of-00003.safetensors").c_str(), &st), MF_OK);
  mf_safetensors_close(st);
}

}  // namespace
