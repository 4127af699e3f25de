// Malformed single files: each must fail with MF_ERR_FORMAT (or UNSUPPORTED
// where noted) and a message naming the file and the fault.
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "src/core/core.h"
#include "src/io/safetensors.h"
#include "tests/safetensors/st_test_util.h"

using st_test::Image;
using st_test::Le64;

namespace {

struct Case {
  const char *name;
  std::string bytes;
  const char *fault;  // substring of the message
  mf_status status;
};

// One F32 [2] tensor, well formed, for variations.
const std::string kData8(8, '\x01');

std::string Entry(const std::string &body) {
  return "{\"t\":" + body + "}";
}

std::vector<Case> Cases() {
  std::string ok = Entry("{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}");
  std::string valid = Image(ok, kData8);
  return {
      {"empty_file", "", "too short for the 8-byte header length", MF_ERR_FORMAT},
      {"shorter_than_8", "abc", "file is 3 bytes, too short", MF_ERR_FORMAT},
      {"truncated_header", valid.substr(0, 20), "runs past the end of the file", MF_ERR_FORMAT},
      {"header_len_past_end", Le64(1000) + "{}", "header length 1000 (byte offset 0) runs past the end",
       MF_ERR_FORMAT},
      {"absurd_header_len", Le64(1ull << 63) + "{}", "exceeds the 100000000-byte limit", MF_ERR_FORMAT},
      {"header_len_max", Le64(~0ull) + "{}", "exceeds the 100000000-byte limit", MF_ERR_FORMAT},
      {"empty_header", Le64(0), "does not start with '{'", MF_ERR_FORMAT},
      {"not_json", Image("{abc"), "not valid JSON", MF_ERR_FORMAT},
      {"not_object", Image("[1, 2]"), "does not start with '{'", MF_ERR_FORMAT},
      {"leading_space", Image(" {}"), "does not start with '{'", MF_ERR_FORMAT},
      {"trailing_garbage", Image("{} x"), "end of file expected", MF_ERR_FORMAT},
      {"trailing_nul", Image(std::string("{}\0", 3)), "not valid JSON", MF_ERR_FORMAT},
      {"non_utf8", Image("{\"\xff\xfe\":{}}"), "unable to decode byte 0xff", MF_ERR_FORMAT},
      {"nul_in_name", Image("{\"a\\u0000b\":{}}"), "NUL byte", MF_ERR_FORMAT},
      {"entry_not_object", Image(Entry("7")), "tensor \"t\": entry is an integer", MF_ERR_FORMAT},
      {"dtype_number", Image(Entry("{\"dtype\":5,\"shape\":[2],\"data_offsets\":[0,8]}"), kData8),
       "tensor \"t\": dtype is an integer, expected a string", MF_ERR_FORMAT},
      {"unknown_dtype", Image(Entry("{\"dtype\":\"F17\",\"shape\":[2],\"data_offsets\":[0,8]}"), kData8),
       "tensor \"t\": unknown dtype \"F17\"", MF_ERR_FORMAT},
      {"lowercase_dtype", Image(Entry("{\"dtype\":\"f32\",\"shape\":[2],\"data_offsets\":[0,8]}"), kData8),
       "unknown dtype \"f32\"", MF_ERR_FORMAT},
      {"newer_dtype", Image(Entry("{\"dtype\":\"F8_E8M0\",\"shape\":[8],\"data_offsets\":[0,8]}"), kData8),
       "dtype F8_E8M0 is not supported", MF_ERR_UNSUPPORTED},
      {"shape_string", Image(Entry("{\"dtype\":\"F32\",\"shape\":\"2\",\"data_offsets\":[0,8]}"), kData8),
       "tensor \"t\": shape is a string, expected an array", MF_ERR_FORMAT},
      {"shape_negative", Image(Entry("{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}"), kData8),
       "shape[0] is negative", MF_ERR_FORMAT},
      {"shape_float", Image(Entry("{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}"), kData8),
       "shape[0] is a real number", MF_ERR_FORMAT},
      {"shape_nested", Image(Entry("{\"dtype\":\"F32\",\"shape\":[[2]],\"data_offsets\":[0,8]}"), kData8),
       "shape[0] is an array", MF_ERR_FORMAT},
      {"rank_9",
       Image(Entry("{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,8],\"data_offsets\":[0,8]}"), kData8),
       "shape has 9 dimensions, more than 8", MF_ERR_FORMAT},
      {"offsets_float", Image(Entry("{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0.0,8.0]}"), kData8),
       "data_offsets[0] is a real number", MF_ERR_FORMAT},
      {"offsets_negative", Image(Entry("{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}"), kData8),
       "data_offsets[0] is negative", MF_ERR_FORMAT},
      {"offsets_string", Image(Entry("{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":\"0,8\"}"), kData8),
       "data_offsets is a string", MF_ERR_FORMAT},
      {"offsets_three", Image(Entry("{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,8]}"), kData8),
       "data_offsets is an array of the wrong length", MF_ERR_FORMAT},
      {"offsets_too_big",
       Image(Entry("{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,99999999999999999999]}"), kData8),
       "too big integer", MF_ERR_FORMAT},
      {"extent_mismatch", Image(Entry("{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,8]}"), kData8),
       "shape [4] of F32 needs 16 bytes but data_offsets [0, 8] hold 8", MF_ERR_FORMAT},
      {"shape_overflow",
       Image(Entry("{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4611686018427387904],\"data_offsets\":["
                   "0,8]}"),
             kData8),
       "overflows 64-bit byte counts", MF_ERR_FORMAT},
      {"shape_overflow_then_zero",
       Image(Entry("{\"dtype\":\"U8\",\"shape\":[4611686018427387904,4611686018427387904,0],\"data_offsets\":"
                   "[0,0]}")),
       "overflows", MF_ERR_FORMAT},
      {"dtype_overflow",
       Image(Entry("{\"dtype\":\"F64\",\"shape\":[4611686018427387904],\"data_offsets\":[0,8]}"), kData8),
       "overflows 64-bit byte counts", MF_ERR_FORMAT},
      {"offsets_past_buffer",
       Image(Entry("{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}"), kData8),
       "data_offsets [8, 16] run past the end of the 8-byte data buffer", MF_ERR_FORMAT},
      {"offsets_reversed", Image(Entry("{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}"), kData8),
       "data_offsets [8, 0] are reversed", MF_ERR_FORMAT},
      {"overlap",
       Image("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
             std::string(12, '\0')),
       "tensor \"b\" (data_offsets [4, 12]) overlaps tensor \"a\", which ends at 8", MF_ERR_FORMAT},
      {"overlap_same_range",
       Image("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"b\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
             kData8),
       "overlaps tensor", MF_ERR_FORMAT},
      {"empty_inside_other",
       Image("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"b\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]}}",
             kData8),
       "tensor \"b\" (data_offsets [4, 4]) overlaps tensor \"a\"", MF_ERR_FORMAT},
      {"hole",
       Image("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
             "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
             std::string(12, '\0')),
       "data buffer bytes [4, 8) (file offset", MF_ERR_FORMAT},
      {"hole_at_start", Image(Entry("{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}"), kData8),
       "a hole before tensor \"t\"", MF_ERR_FORMAT},
      {"buffer_longer", Image(ok, kData8 + "xyz"), "3 trailing bytes", MF_ERR_FORMAT},
      {"no_tensors_but_data", Image("{}", "x"), "1 trailing bytes", MF_ERR_FORMAT},
      {"duplicate_names",
       Image("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
             "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
             kData8),
       "duplicate object key near '\"a\"'", MF_ERR_FORMAT},
      {"metadata_int", Image("{\"__metadata__\":{\"format\":\"pt\",\"step\":3}}"),
       "__metadata__[\"step\"] is an integer, expected a string", MF_ERR_FORMAT},
      {"metadata_array", Image("{\"__metadata__\":[\"pt\"]}"), "__metadata__ is an array", MF_ERR_FORMAT},
      {"metadata_nested", Image("{\"__metadata__\":{\"k\":{\"x\":\"y\"}}}"),
       "__metadata__[\"k\"] is an object", MF_ERR_FORMAT},
      {"extra_key",
       Image(Entry("{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"strides\":[1]}"), kData8),
       "tensor \"t\": unknown key \"strides\"", MF_ERR_FORMAT},
      {"missing_key", Image(Entry("{\"dtype\":\"F32\",\"data_offsets\":[0,8]}"), kData8),
       "tensor \"t\": missing key \"shape\"", MF_ERR_FORMAT},
      {"deep_nesting", Image("{\"t\":" + std::string(10000, '[') + std::string(10000, ']') + "}"),
       "nests deeper than 4 levels at byte offset", MF_ERR_FORMAT},
      {"deep_nesting_unclosed", Image("{\"t\":" + std::string(10000, '{')), "nests deeper than 4 levels",
       MF_ERR_FORMAT},
  };
}

class Malformed : public ::testing::TestWithParam<Case> {};

TEST_P(Malformed, FailsWithFileAndFault) {
  const Case &c = GetParam();
  std::string path = st_test::TestDir() + "/bad_" + c.name + ".safetensors";
  st_test::WriteFile(path, c.bytes);
  mf_safetensors *st = reinterpret_cast<mf_safetensors *>(0x1);
  mf_error_clear();
  mf_status s = mf_safetensors_open(path.c_str(), &st);
  EXPECT_EQ(s, c.status) << mf_last_error();
  EXPECT_EQ(st, nullptr);
  std::string msg = mf_last_error();
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find(c.fault), std::string::npos) << "expected \"" << c.fault << "\" in: " << msg;

  // The in-memory parser gives the same verdict, labelled with its label.
  s = mf_safetensors_open_buffer("mem.safetensors", c.bytes.data(), c.bytes.size(), &st);
  EXPECT_EQ(s, c.status) << mf_last_error();
  EXPECT_EQ(st, nullptr);
  EXPECT_NE(std::string(mf_last_error()).find("mem.safetensors"), std::string::npos) << mf_last_error();
}

INSTANTIATE_TEST_SUITE_P(Safetensors, Malformed, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case> &i) { return std::string(i.param.name); });

// Well-formed corner cases the rules allow.
TEST(SafetensorsValid, EdgeCasesParse) {
  struct Ok {
    std::string bytes;
    size_t tensors;
  } oks[] = {
      {Image("{}"), 0},
      {Image("{}      "), 0},   // space padding
      {Image("{} \t\r\n"), 0},  // other JSON whitespace, as serde accepts
      {Image("{\"__metadata__\":{}}"), 0},
      {Image("{\"s\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[0,8]}}", kData8), 1},  // 0-rank
      {Image("{\"e\":{\"dtype\":\"F32\",\"shape\":[0,3],\"data_offsets\":[0,0]},"
             "\"f\":{\"dtype\":\"BF16\",\"shape\":[3,0],\"data_offsets\":[0,0]},"
             "\"g\":{\"data_offsets\":[0,8],\"shape\":[2,2],\"dtype\":\"I16\"}}",
             kData8),
       3},  // empty tensors sharing an offset; keys in any order
      {Image("{\"\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", "x"),
       1},  // empty name is legal
  };
  for (const Ok &o : oks) {
    mf_safetensors *st = nullptr;
    ASSERT_EQ(mf_safetensors_open_buffer("ok", o.bytes.data(), o.bytes.size(), &st), MF_OK)
        << mf_last_error();
    EXPECT_EQ(mf_safetensors_count(st), o.tensors);
    for (size_t i = 0; i < mf_safetensors_count(st); i++) {
      const mf_st_tensor *t = mf_safetensors_get(st, i);
      EXPECT_EQ(mf_safetensors_find(st, t->name), t);
    }
    mf_safetensors_close(st);
  }
}

TEST(SafetensorsValid, ZeroRankAndEmptyFields) {
  std::string img = Image(
      "{\"e\":{\"dtype\":\"F32\",\"shape\":[0,3],\"data_offsets\":[0,0]},"
      "\"s\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[0,8]}}",
      kData8);
  mf_safetensors *st = nullptr;
  ASSERT_EQ(mf_safetensors_open_buffer("ok", img.data(), img.size(), &st), MF_OK) << mf_last_error();
  const mf_st_tensor *s = mf_safetensors_find(st, "s");
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->ndim, 0);
  EXPECT_EQ(s->numel, 1u);
  EXPECT_EQ(s->nbytes, 8u);
  EXPECT_EQ(s->offset, img.size() - 8);  // the data buffer is its last 8 bytes
  const mf_st_tensor *e = mf_safetensors_find(st, "e");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->numel, 0u);
  EXPECT_EQ(e->nbytes, 0u);
  EXPECT_EQ(mf_safetensors_find(st, "nope"), nullptr);
  EXPECT_EQ(mf_safetensors_get(st, 2), nullptr);
  EXPECT_EQ(mf_safetensors_total_bytes(st), 8u);
  mf_safetensors_close(st);
}

TEST(SafetensorsValid, OpenErrors) {
  mf_safetensors *st = nullptr;
  std::string dir = st_test::TestDir();
  EXPECT_EQ(mf_safetensors_open((dir + "/missing.safetensors").c_str(), &st), MF_ERR_IO);
  EXPECT_NE(std::string(mf_last_error()).find("missing.safetensors"), std::string::npos);
  // A directory with neither model.safetensors nor an index.
  EXPECT_EQ(mf_safetensors_open(dir.c_str(), &st), MF_ERR_IO);
  EXPECT_NE(std::string(mf_last_error()).find("neither model.safetensors"), std::string::npos);
  EXPECT_EQ(mf_safetensors_open_file(dir.c_str(), &st), MF_ERR_IO);
  EXPECT_EQ(st, nullptr);
  mf_safetensors_close(nullptr);
}

}  // namespace
