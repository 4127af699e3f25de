// Interop with the reference implementation: testdata/reference.safetensors was
// written by safetensors 0.8.0 (testdata/make_reference.py). moefit reads it,
// and its writer reproduces it byte for byte (order, offsets, header, padding).
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "src/core/core.h"
#include "src/io/safetensors.h"
#include "tests/safetensors/st_test_util.h"

namespace {

const char kRef[] = "tests/safetensors/testdata/reference.safetensors";

template <typename T>
void ExpectArange(const mf_safetensors *st, const char *name, mf_dtype dt, size_t n) {
  const mf_st_tensor *t = mf_safetensors_find(st, name);
  ASSERT_NE(t, nullptr) << name;
  EXPECT_EQ(t->dtype, dt) << name;
  ASSERT_EQ(t->nbytes, n * sizeof(T)) << name;
  std::vector<T> v(n);
  memcpy(v.data(), t->data, t->nbytes);
  for (size_t i = 0; i < n; i++) EXPECT_EQ(v[i], (T)i) << name << "[" << i << "]";
}

TEST(SafetensorsReference, ReadsTheReferenceFile) {
  mf_safetensors *st = nullptr;
  ASSERT_EQ(mf_safetensors_open(kRef, &st), MF_OK) << mf_last_error();
  EXPECT_EQ(mf_safetensors_count(st), 12u);
  ExpectArange<float>(st, "model.layers.10.w", MF_DTYPE_F32, 15);
  ExpectArange<double>(st, "d", MF_DTYPE_F64, 4);
  ExpectArange<int8_t>(st, "i8", MF_DTYPE_I8, 5);
  ExpectArange<int16_t>(st, "i16", MF_DTYPE_I16, 3);
  ExpectArange<int32_t>(st, "i32", MF_DTYPE_I32, 7);
  ExpectArange<uint16_t>(st, "u16", MF_DTYPE_U16, 2);
  ExpectArange<uint32_t>(st, "u32", MF_DTYPE_U32, 3);
  ExpectArange<uint64_t>(st, "u64", MF_DTYPE_U64, 1);
  const mf_st_tensor *t = mf_safetensors_find(st, "model.layers.10.w");
  EXPECT_EQ(t->ndim, 2);
  EXPECT_EQ(t->shape[0], 3);
  EXPECT_EQ(t->shape[1], 5);
  t = mf_safetensors_find(st, "model.layers.2.w");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, MF_DTYPE_F16);
  for (int i = 0; i < 4; i++) EXPECT_EQ(mf_fp16_to_fp32(((const uint16_t *)t->data)[i]), (float)i);
  t = mf_safetensors_find(st, "i64");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->ndim, 0);
  EXPECT_EQ(*(const int64_t *)t->data, 5);
  t = mf_safetensors_find(st, "u8");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->ndim, 2);
  EXPECT_EQ(t->shape[0], 0);
  EXPECT_EQ(t->nbytes, 0u);
  t = mf_safetensors_find(st, "b");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, MF_DTYPE_BOOL);
  EXPECT_EQ(memcmp(t->data, "\1\0\1", 3), 0);
  EXPECT_STREQ(mf_safetensors_metadata(st, "format"), "pt");
  EXPECT_STREQ(mf_safetensors_metadata(st, "k"), "v");
  mf_safetensors_close(st);
}

TEST(SafetensorsReference, WriterReproducesItByteForByte) {
  mf_safetensors *st = nullptr;
  ASSERT_EQ(mf_safetensors_open(kRef, &st), MF_OK) << mf_last_error();
  // Hand the tensors over in reverse file order: the writer's order must not
  // depend on the caller's.
  std::vector<mf_st_tensor> v;
  for (size_t i = mf_safetensors_count(st); i-- > 0;) v.push_back(*mf_safetensors_get(st, i));
  std::vector<mf_st_meta> meta;
  for (size_t i = 0; i < mf_safetensors_metadata_count(st); i++)
    meta.push_back(*mf_safetensors_metadata_at(st, i));
  std::string out = st_test::TestDir() + "/rewritten.safetensors";
  ASSERT_EQ(mf_safetensors_write(out.c_str(), v.data(), v.size(), meta.data(), meta.size()), MF_OK)
      << mf_last_error();
  mf_safetensors_close(st);
  std::string want = st_test::ReadFile(kRef), got = st_test::ReadFile(out);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_TRUE(got == want) << "header written:\n"
                           << got.substr(8, 400) << "\nreference:\n"
                           << want.substr(8, 400);
}

}  // namespace
