// Writing single files: round trip, layout (order, alignment, padding),
// metadata, argument checks and atomicity.
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "src/core/core.h"
#include "src/io/safetensors.h"
#include "tests/safetensors/st_test_util.h"

namespace {

struct Tensor {
  std::string name;
  mf_dtype dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;
};

Tensor Make(const std::string &name, mf_dtype dt, std::vector<int64_t> shape, int seed) {
  size_t numel = 1;
  for (int64_t d : shape) numel *= (size_t)d;
  Tensor t{name, dt, shape, std::vector<uint8_t>(numel * mf_dtype_size(dt))};
  for (size_t i = 0; i < t.data.size(); i++) t.data[i] = (uint8_t)(seed * 37 + i * 11);
  return t;
}

std::vector<mf_st_tensor> View(const std::vector<Tensor> &ts) {
  std::vector<mf_st_tensor> v(ts.size());
  for (size_t i = 0; i < ts.size(); i++) {
    memset(&v[i], 0, sizeof v[i]);
    v[i].name = ts[i].name.c_str();
    v[i].dtype = ts[i].dtype;
    v[i].ndim = (int)ts[i].shape.size();
    for (size_t d = 0; d < ts[i].shape.size(); d++) v[i].shape[d] = ts[i].shape[d];
    v[i].data = ts[i].data.empty() ? nullptr : ts[i].data.data();
  }
  return v;
}

void ExpectSame(const mf_safetensors *st, const std::vector<Tensor> &ts) {
  ASSERT_EQ(mf_safetensors_count(st), ts.size());
  for (const Tensor &t : ts) {
    const mf_st_tensor *r = mf_safetensors_find(st, t.name.c_str());
    ASSERT_NE(r, nullptr) << t.name;
    EXPECT_EQ(r->dtype, t.dtype) << t.name;
    ASSERT_EQ(r->ndim, (int)t.shape.size()) << t.name;
    for (size_t d = 0; d < t.shape.size(); d++) EXPECT_EQ(r->shape[d], t.shape[d]) << t.name;
    ASSERT_EQ(r->nbytes, t.data.size()) << t.name;
    if (!t.data.empty()) {
      EXPECT_EQ(memcmp(r->data, t.data.data(), t.data.size()), 0) << t.name;
    }
  }
}

std::vector<Tensor> Mixed() {
  return {
      Make("model.layers.0.mlp.gate.weight", MF_DTYPE_BF16, {8, 4}, 1),
      Make("model.embed_tokens.weight", MF_DTYPE_F32, {5, 3}, 2),
      Make("step", MF_DTYPE_I64, {}, 3),       // 0-rank
      Make("empty", MF_DTYPE_F16, {0, 7}, 4),  // empty
      Make("mask", MF_DTYPE_BOOL, {3}, 5),     // odd size, 1-byte type
      Make("scale", MF_DTYPE_F64, {2}, 6),
      Make("fp8", MF_DTYPE_F8_E4M3, {3, 3}, 7),
      Make("idx", MF_DTYPE_I32, {1}, 8),
      Make("u16", MF_DTYPE_U16, {3}, 9),
      Make("also_empty", MF_DTYPE_U8, {0}, 10),
  };
}

TEST(SafetensorsWrite, RoundTripSeveralDtypes) {
  std::string path = st_test::TestDir() + "/model.safetensors";
  std::vector<Tensor> ts = Mixed();
  std::vector<mf_st_tensor> v = View(ts);
  mf_st_meta meta[] = {{"producer", "moefit"}, {"format", "pt"}, {"note", "ünïcödé"}};
  ASSERT_EQ(mf_safetensors_write(path.c_str(), v.data(), v.size(), meta, 3), MF_OK) << mf_last_error();
  EXPECT_FALSE(st_test::Exists(path + ".tmp"));

  mf_safetensors *st = nullptr;
  ASSERT_EQ(mf_safetensors_open(path.c_str(), &st), MF_OK) << mf_last_error();
  ExpectSame(st, ts);
  EXPECT_STREQ(mf_safetensors_metadata(st, "format"), "pt");
  EXPECT_STREQ(mf_safetensors_metadata(st, "producer"), "moefit");
  EXPECT_STREQ(mf_safetensors_metadata(st, "note"), "ünïcödé");
  EXPECT_EQ(mf_safetensors_metadata_count(st), 3u);
  EXPECT_EQ(mf_safetensors_shard_count(st), 1u);
  EXPECT_STREQ(mf_safetensors_shard_path(st, 0), path.c_str());
  EXPECT_EQ(mf_safetensors_index_path(st), nullptr);
  EXPECT_EQ(mf_safetensors_index_metadata_count(st), 0u);

  // Reference layout: dtype size descending (by the reference's dtype order),
  // then name; every tensor
  // naturally aligned in the file and in the mapping.
  for (size_t i = 0; i < mf_safetensors_count(st); i++) {
    const mf_st_tensor *t = mf_safetensors_get(st, i);
    size_t a = mf_dtype_size(t->dtype);
    EXPECT_EQ(t->offset % a, 0u) << t->name;
    EXPECT_EQ((uintptr_t)t->data % a, 0u) << t->name;
    if (i > 0) {
      const mf_st_tensor *p = mf_safetensors_get(st, i - 1);
      EXPECT_LE(p->offset + p->nbytes, t->offset);
      size_t pa = mf_dtype_size(p->dtype);
      EXPECT_GE(pa, a) << p->name << " then " << t->name;
      if (p->dtype == t->dtype) {
        EXPECT_LT(strcmp(p->name, t->name), 0) << p->name << " then " << t->name;
      }
    }
  }
  mf_safetensors_close(st);

  // The header: length a multiple of 8, space padded, __metadata__ first.
  std::string raw = st_test::ReadFile(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = (n << 8) | (uint8_t)raw[i];
  EXPECT_EQ(n % 8, 0u);
  std::string header = raw.substr(8, n);
  EXPECT_EQ(header.rfind("{\"__metadata__\":{\"format\":\"pt\"", 0), 0u) << header;
  size_t end = header.find_last_not_of(' ');
  EXPECT_EQ(header[end], '}');
  EXPECT_LT(n - end - 1, 8u);
}

TEST(SafetensorsWrite, AlwaysWritesFormatPt) {
  std::string path = st_test::TestDir() + "/m.safetensors";
  std::vector<Tensor> ts = {Make("a", MF_DTYPE_F32, {2}, 1)};
  std::vector<mf_st_tensor> v = View(ts);
  ASSERT_EQ(mf_safetensors_write(path.c_str(), v.data(), v.size(), nullptr, 0), MF_OK) << mf_last_error();
  mf_safetensors *st = nullptr;
  ASSERT_EQ(mf_safetensors_open_file(path.c_str(), &st), MF_OK) << mf_last_error();
  EXPECT_STREQ(mf_safetensors_metadata(st, "format"), "pt");
  ExpectSame(st, ts);
  mf_safetensors_close(st);
}

TEST(SafetensorsWrite, NoTensors) {
  std::string path = st_test::TestDir() + "/empty.safetensors";
  ASSERT_EQ(mf_safetensors_write(path.c_str(), nullptr, 0, nullptr, 0), MF_OK) << mf_last_error();
  mf_safetensors *st = nullptr;
  ASSERT_EQ(mf_safetensors_open(path.c_str(), &st), MF_OK) << mf_last_error();
  EXPECT_EQ(mf_safetensors_count(st), 0u);
  EXPECT_EQ(st_test::ReadFile(path).size() % 8, 0u);
  mf_safetensors_close(st);
}

TEST(SafetensorsWrite, OverwritesAnExistingFile) {
  std::string path = st_test::TestDir() + "/m.safetensors";
  st_test::WriteFile(path, "old contents");
  std::vector<Tensor> ts = {Make("a", MF_DTYPE_BF16, {3, 3}, 4)};
  std::vector<mf_st_tensor> v = View(ts);
  ASSERT_EQ(mf_safetensors_write(path.c_str(), v.data(), v.size(), nullptr, 0), MF_OK) << mf_last_error();
  mf_safetensors *st = nullptr;
  ASSERT_EQ(mf_safetensors_open(path.c_str(), &st), MF_OK) << mf_last_error();
  ExpectSame(st, ts);
  mf_safetensors_close(st);
}

// A tmp file left by a crashed writer is replaced, not appended to or kept.
TEST(SafetensorsWrite, StaleTmpFromACrash) {
  std::string path = st_test::TestDir() + "/m.safetensors";
  st_test::WriteFile(path + ".tmp", std::string(100, 'x'));
  std::vector<Tensor> ts = {Make("a", MF_DTYPE_F32, {4}, 1)};
  std::vector<mf_st_tensor> v = View(ts);
  ASSERT_EQ(mf_safetensors_write(path.c_str(), v.data(), v.size(), nullptr, 0), MF_OK) << mf_last_error();
  EXPECT_FALSE(st_test::Exists(path + ".tmp"));
  mf_safetensors *st = nullptr;
  ASSERT_EQ(mf_safetensors_open(path.c_str(), &st), MF_OK) << mf_last_error();
  ExpectSame(st, ts);
  mf_safetensors_close(st);
}

// Invalid arguments are refused before anything is written: the old file stays.
TEST(SafetensorsWrite, InvalidTensorsLeaveTheOldFile) {
  std::string path = st_test::TestDir() + "/keep.safetensors";
  st_test::WriteFile(path, "precious");
  uint8_t buf[16] = {0};
  struct Bad {
    const char *what;
    mf_st_tensor t[2];
    size_t n;
    mf_st_meta meta;
    size_t n_meta;
    const char *fault;
  };
  auto T = [&](const char *name, mf_dtype dt, int ndim, int64_t d0, const void *data) {
    mf_st_tensor t;
    memset(&t, 0, sizeof t);
    t.name = name;
    t.dtype = dt;
    t.ndim = ndim;
    t.shape[0] = d0;
    t.data = data;
    return t;
  };
  Bad bads[] = {
      {"duplicate",
       {T("a", MF_DTYPE_U8, 1, 2, buf), T("a", MF_DTYPE_U8, 1, 2, buf)},
       2,
       {},
       0,
       "appears twice"},
      {"empty name", {T("", MF_DTYPE_U8, 1, 2, buf)}, 1, {}, 0, "empty name"},
      {"null name", {T(nullptr, MF_DTYPE_U8, 1, 2, buf)}, 1, {}, 0, "empty name"},
      {"reserved", {T("__metadata__", MF_DTYPE_U8, 1, 2, buf)}, 1, {}, 0, "reserved"},
      {"bad utf8", {T("\xff", MF_DTYPE_U8, 1, 2, buf)}, 1, {}, 0, "UTF-8"},
      {"bad dtype", {T("a", MF_DTYPE_INVALID, 1, 2, buf)}, 1, {}, 0, "invalid dtype"},
      {"ndim", {T("a", MF_DTYPE_U8, 9, 2, buf)}, 1, {}, 0, "ndim 9"},
      {"negative", {T("a", MF_DTYPE_U8, 1, -2, buf)}, 1, {}, 0, "negative"},
      {"null data", {T("a", MF_DTYPE_U8, 1, 2, nullptr)}, 1, {}, 0, "data is NULL"},
      {"format tf", {T("a", MF_DTYPE_U8, 1, 2, buf)}, 1, {"format", "tf"}, 1, "must be \"pt\""},
  };
  for (const Bad &b : bads) {
    SCOPED_TRACE(b.what);
    mf_status s = mf_safetensors_write(path.c_str(), b.t, b.n, b.n_meta ? &b.meta : nullptr, b.n_meta);
    EXPECT_EQ(s, MF_ERR_INVALID_ARG);
    EXPECT_NE(std::string(mf_last_error()).find(b.fault), std::string::npos) << mf_last_error();
    EXPECT_NE(std::string(mf_last_error()).find("keep.safetensors"), std::string::npos) << mf_last_error();
    EXPECT_EQ(st_test::ReadFile(path), "precious");
    EXPECT_FALSE(st_test::Exists(path + ".tmp"));
  }
}

// A failure after the data is written (the rename) removes the tmp file and
// leaves what was at the path.
TEST(SafetensorsWrite, FailedRenameLeavesTargetAndNoTmp) {
  std::string dir = st_test::TestDir();
  std::string target = dir + "/is_a_dir.safetensors";
  ASSERT_EQ(mkdir(target.c_str(), 0755), 0);
  st_test::WriteFile(target + "/inside", "x");
  std::vector<Tensor> ts = {Make("a", MF_DTYPE_F32, {4}, 1)};
  std::vector<mf_st_tensor> v = View(ts);
  EXPECT_EQ(mf_safetensors_write(target.c_str(), v.data(), v.size(), nullptr, 0), MF_ERR_IO);
  EXPECT_NE(std::string(mf_last_error()).find("is_a_dir.safetensors"), std::string::npos) << mf_last_error();
  EXPECT_FALSE(st_test::Exists(target + ".tmp"));
  EXPECT_EQ(st_test::ReadFile(target + "/inside"), "x");
}

TEST(SafetensorsWrite, MissingDirectoryIsAnIoError) {
  std::string path = st_test::TestDir() + "/no/such/dir/m.safetensors";
  std::vector<Tensor> ts = {Make("a", MF_DTYPE_F32, {4}, 1)};
  std::vector<mf_st_tensor> v = View(ts);
  EXPECT_EQ(mf_safetensors_write(path.c_str(), v.data(), v.size(), nullptr, 0), MF_ERR_IO);
  EXPECT_NE(std::string(mf_last_error()).find("m.safetensors.tmp"), std::string::npos) << mf_last_error();
}

// Without root, a read-only directory cannot take the tmp file; the old file stays.
TEST(SafetensorsWrite, ReadOnlyDirectory) {
  if (geteuid() == 0) GTEST_SKIP() << "root ignores directory permissions";
  std::string dir = st_test::TestDir() + "/ro";
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
  st_test::WriteFile(dir + "/m.safetensors", "old");
  ASSERT_EQ(chmod(dir.c_str(), 0555), 0);
  std::vector<Tensor> ts = {Make("a", MF_DTYPE_F32, {4}, 1)};
  std::vector<mf_st_tensor> v = View(ts);
  EXPECT_EQ(mf_safetensors_write((dir + "/m.safetensors").c_str(), v.data(), v.size(), nullptr, 0),
            MF_ERR_IO);
  chmod(dir.c_str(), 0755);
  EXPECT_EQ(st_test::ReadFile(dir + "/m.safetensors"), "old");
}

}  // namespace
