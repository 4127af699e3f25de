// Quantized weight formats (src/io/quant.h) against the implementations people
// load them with: tests/fixtures/quant/formats.safetensors was written by
// tools/make_quant_fixtures.py with bitsandbytes (NF4, QLoRA's own code),
// transformers' FP8 quantizer and its MXFP4 unpacking, on the CPU. Every
// comparison is of bits.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "src/core/core.h"
#include "src/io/quant.h"
#include "src/io/safetensors.h"

namespace {

const char kFile[] = "tests/fixtures/quant/formats.safetensors";

class QuantFormat : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { ASSERT_EQ(mf_safetensors_open(kFile, &st_), MF_OK) << mf_last_error(); }
  static void TearDownTestSuite() {
    mf_safetensors_close(st_);
    st_ = nullptr;
  }
  static const mf_st_tensor *T(const std::string &name, mf_dtype dt) {
    const mf_st_tensor *t = mf_safetensors_find(st_, name.c_str());
    EXPECT_NE(t, nullptr) << name;
    if (t) EXPECT_EQ(t->dtype, dt) << name;
    return t;
  }
  template <typename V>
  static std::vector<V> Get(const std::string &name, mf_dtype dt) {
    const mf_st_tensor *t = T(name, dt);
    if (!t) return {};
    std::vector<V> v(t->nbytes / sizeof(V));
    memcpy(v.data(), t->data, t->nbytes);
    return v;
  }
  static std::vector<float> Input(const std::string &name) {
    const mf_st_tensor *t = mf_safetensors_find(st_, name.c_str());
    EXPECT_NE(t, nullptr) << name;
    if (!t) return {};
    std::vector<float> v(t->numel);
    if (t->dtype == MF_DTYPE_BF16)
      mf_bf16_to_fp32_n((const uint16_t *)t->data, v.data(), t->numel);
    else
      memcpy(v.data(), t->data, t->nbytes);
    return v;
  }
  static mf_safetensors *st_;
};
mf_safetensors *QuantFormat::st_ = nullptr;

uint32_t Bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

// Counts the elements whose bits differ, printing the first few.
template <typename V>
int Diff(const std::vector<V> &got, const std::vector<V> &want, const std::string &what) {
  EXPECT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); i++) {
    V a = got[i], b = want[i];
    if (memcmp(&a, &b, sizeof(V)) != 0 && bad++ < 4)
      ADD_FAILURE() << what << "[" << i << "]: " << (double)a << " vs " << (double)b;
  }
  return bad;
}

int Diff(const std::vector<float> &got, const std::vector<float> &want, const std::string &what) {
  std::vector<uint32_t> a(got.size()), b(want.size());
  for (size_t i = 0; i < got.size(); i++) a[i] = Bits(got[i]);
  for (size_t i = 0; i < want.size(); i++) b[i] = Bits(want[i]);
  return Diff(a, b, what);
}

TEST_F(QuantFormat, Nf4CodeAndDynamicMapAreBitsandbytes) {
  std::vector<float> code(mf_nf4_code, mf_nf4_code + 16);
  EXPECT_EQ(Diff(code, Get<float>("nf4.code", MF_DTYPE_F32), "nf4.code"), 0);
  std::vector<float> dyn(256);
  mf_quant_dynamic_map(dyn.data());
  EXPECT_EQ(Diff(dyn, Get<float>("dynamic.code", MF_DTYPE_F32), "dynamic.code"), 0);
}

struct Nf4Case {
  const char *name;
  int64_t blocksize;
};
const Nf4Case kNf4[] = {{"b64", 64}, {"b64_tail", 64}, {"b32", 32}, {"b128_bf16", 128}, {"b64_zeros", 64}};

TEST_F(QuantFormat, Nf4QuantizeIsBitsandbytes) {
  for (const Nf4Case &c : kNf4) {
    const std::string k = std::string("nf4.") + c.name;
    const mf_st_tensor *in = mf_safetensors_find(st_, (k + ".input").c_str());
    ASSERT_NE(in, nullptr) << k;
    const int64_t n = (int64_t)in->numel, nb = mf_quant_blocks(n, c.blocksize);
    std::vector<uint8_t> packed((size_t)(n + 1) / 2);
    std::vector<float> absmax((size_t)nb);
    if (in->dtype == MF_DTYPE_BF16)
      ASSERT_EQ(mf_nf4_quantize_bf16((const uint16_t *)in->data, n, c.blocksize, packed.data(), absmax.data(),
                                     k.c_str()),
                MF_OK)
          << mf_last_error();
    else
      ASSERT_EQ(mf_nf4_quantize(Input(k + ".input").data(), n, c.blocksize, packed.data(), absmax.data(), k.c_str()),
                MF_OK)
          << mf_last_error();
    EXPECT_EQ(Diff(packed, Get<uint8_t>(k + ".packed", MF_DTYPE_U8), k + ".packed"), 0);
    EXPECT_EQ(Diff(absmax, Get<float>(k + ".absmax", MF_DTYPE_F32), k + ".absmax"), 0);
  }
}

TEST_F(QuantFormat, Nf4DequantizeIsBitsandbytes) {
  for (const Nf4Case &c : kNf4) {
    const std::string k = std::string("nf4.") + c.name;
    const std::vector<uint8_t> packed = Get<uint8_t>(k + ".packed", MF_DTYPE_U8);
    const std::vector<float> absmax = Get<float>(k + ".absmax", MF_DTYPE_F32);
    const std::vector<float> want32 = Get<float>(k + ".f32", MF_DTYPE_F32);
    const std::vector<uint16_t> want16 = Get<uint16_t>(k + ".bf16", MF_DTYPE_BF16);
    const int64_t n = (int64_t)want32.size();
    mf_nf4_absmax a = {};
    a.absmax = absmax.data();
    ASSERT_EQ(mf_nf4_check(&a, (int64_t)absmax.size(), k.c_str()), MF_OK);
    std::vector<float> got32((size_t)n);
    std::vector<uint16_t> got16((size_t)n);
    mf_nf4_dequantize_f32(packed.data(), &a, c.blocksize, 0, n, got32.data());
    mf_nf4_dequantize_bf16(packed.data(), &a, c.blocksize, 0, n, got16.data());
    EXPECT_EQ(Diff(got32, want32, k + ".f32"), 0);
    EXPECT_EQ(Diff(got16, want16, k + ".bf16"), 0);
    // A slice that starts inside a block and inside a byte gives the same bits.
    const int64_t i0 = 37, len = n - i0 - 3;
    std::vector<float> part((size_t)len);
    mf_nf4_dequantize_f32(packed.data(), &a, c.blocksize, i0, len, part.data());
    EXPECT_EQ(Diff(part, std::vector<float>(want32.begin() + i0, want32.begin() + i0 + len), k + " slice"), 0);
  }
}

TEST_F(QuantFormat, Nf4DoubleQuantizedDequantizeIsBitsandbytes) {
  for (const char *name : {"b64", "b64_bf16"}) {
    const std::string k = std::string("nf4dq.") + name;
    const std::vector<uint8_t> packed = Get<uint8_t>(k + ".packed", MF_DTYPE_U8);
    const std::vector<uint8_t> q = Get<uint8_t>(k + ".absmax_q", MF_DTYPE_U8);
    const std::vector<float> a2 = Get<float>(k + ".absmax2", MF_DTYPE_F32);
    const std::vector<float> code2 = Get<float>(k + ".code2", MF_DTYPE_F32);
    const std::vector<float> off = Get<float>(k + ".offset", MF_DTYPE_F32);
    const std::vector<float> want32 = Get<float>(k + ".f32", MF_DTYPE_F32);
    const std::vector<uint16_t> want16 = Get<uint16_t>(k + ".bf16", MF_DTYPE_BF16);
    ASSERT_EQ(code2.size(), 256u);
    ASSERT_EQ(off.size(), 1u);
    mf_nf4_absmax a = {};
    a.absmax_q = q.data();
    a.absmax2 = a2.data();
    a.code2 = code2.data();
    a.offset = off[0];
    ASSERT_EQ(mf_nf4_check(&a, (int64_t)q.size(), k.c_str()), MF_OK);
    const int64_t n = (int64_t)want32.size();
    std::vector<float> got32((size_t)n);
    std::vector<uint16_t> got16((size_t)n);
    mf_nf4_dequantize_f32(packed.data(), &a, 64, 0, n, got32.data());
    mf_nf4_dequantize_bf16(packed.data(), &a, 64, 0, n, got16.data());
    EXPECT_EQ(Diff(got32, want32, k + ".f32"), 0);
    EXPECT_EQ(Diff(got16, want16, k + ".bf16"), 0);
  }
}

// moefit's own double quantization: its offset is the fp64 mean (bitsandbytes'
// is torch's fp32 sum, whose order is its own), so its state is not
// bitsandbytes' bit for bit; it must restore every absmax within the 8-bit
// map's step, and the 4-bit codes (quantized before) are bitsandbytes'.
TEST_F(QuantFormat, Nf4DoubleQuantizeRestoresTheAbsmax) {
  const std::string k = "nf4dq.b64";
  const std::vector<float> x = Input(k + ".input");
  const int64_t n = (int64_t)x.size(), nb = mf_quant_blocks(n, 64);
  std::vector<uint8_t> packed((size_t)(n + 1) / 2), q((size_t)nb);
  std::vector<float> absmax((size_t)nb), a2((size_t)mf_quant_blocks(nb, MF_NF4_DQ_BLOCK)), code2(256);
  ASSERT_EQ(mf_nf4_quantize(x.data(), n, 64, packed.data(), absmax.data(), "x"), MF_OK);
  EXPECT_EQ(Diff(packed, Get<uint8_t>(k + ".packed", MF_DTYPE_U8), k + ".packed"), 0);
  mf_quant_dynamic_map(code2.data());
  float offset = 0;
  ASSERT_EQ(mf_nf4_double_quantize(absmax.data(), nb, code2.data(), q.data(), a2.data(), &offset), MF_OK);
  const float bnb_offset = Get<float>(k + ".offset", MF_DTYPE_F32)[0];
  EXPECT_LE(std::fabs(offset - bnb_offset), 1e-6f * std::fabs(bnb_offset));
  mf_nf4_absmax st = {};
  st.absmax_q = q.data();
  st.absmax2 = a2.data();
  st.code2 = code2.data();
  st.offset = offset;
  // The dynamic map's widest gap is 1/64 of its range (its top decade has 64
  // steps over [0.1, 1]): half of it, times the block's absmax, bounds the error.
  for (int64_t j = 0; j < nb; j++) {
    const float bound = a2[(size_t)(j / MF_NF4_DQ_BLOCK)] * (0.9f / 64.0f) * 0.5f + 1e-6f;
    EXPECT_LE(std::fabs(mf_nf4_absmax_at(&st, j) - absmax[(size_t)j]), bound) << j;
  }
}

TEST_F(QuantFormat, Fp8DecodingIsTorch) {
  const std::vector<uint8_t> codes = Get<uint8_t>("fp8.codes", MF_DTYPE_F8_E4M3);
  const std::vector<float> want = Get<float>("fp8.codes_f32", MF_DTYPE_F32);
  ASSERT_EQ(codes.size(), 256u);
  for (int i = 0; i < 256; i++) {
    const float got = mf_e4m3_to_fp32(codes[(size_t)i]);
    if (std::isnan(want[(size_t)i])) {
      EXPECT_TRUE(std::isnan(got)) << i;
      continue;
    }
    EXPECT_EQ(Bits(got), Bits(want[(size_t)i])) << i;
    EXPECT_EQ(mf_fp32_to_e4m3(got), codes[(size_t)i]) << i;  // every finite code round-trips
  }
}

TEST_F(QuantFormat, Fp8QuantizeAndDequantizeAreTransformers) {
  const std::vector<float> codes_f32 = Get<float>("fp8.codes_f32", MF_DTYPE_F32);
  for (const char *name : {"r128c256", "r256c128"}) {
    const std::string k = std::string("fp8.") + name;
    const mf_st_tensor *in = T(k + ".input", MF_DTYPE_F32);
    ASSERT_EQ(in->ndim, 2);
    const int64_t rows = in->shape[0], cols = in->shape[1];
    const std::vector<float> x = Input(k + ".input");
    const std::vector<uint8_t> want_w = Get<uint8_t>(k + ".weight", MF_DTYPE_F8_E4M3);
    const std::vector<float> want_s = Get<float>(k + ".scale_inv", MF_DTYPE_F32);
    std::vector<uint8_t> w((size_t)(rows * cols));
    std::vector<float> s(want_s.size());
    ASSERT_EQ(mf_fp8_quantize(x.data(), rows, cols, w.data(), s.data(), k.c_str()), MF_OK) << mf_last_error();
    EXPECT_EQ(Diff(w, want_w, k + ".weight"), 0);
    EXPECT_EQ(Diff(s, want_s, k + ".scale_inv"), 0);
    ASSERT_EQ(mf_fp8_check(want_w.data(), want_s.data(), rows, cols, k.c_str()), MF_OK);
    std::vector<float> got32((size_t)(rows * cols)), want32((size_t)(rows * cols));
    std::vector<uint16_t> got16((size_t)(rows * cols));
    mf_fp8_dequantize_f32(want_w.data(), want_s.data(), cols, 0, rows, got32.data());
    mf_fp8_dequantize_bf16(want_w.data(), want_s.data(), cols, 0, rows, got16.data());
    // fp32: torch's decoding of each byte times its block's scale.
    const int64_t bc = cols / 128;
    for (int64_t r = 0; r < rows; r++)
      for (int64_t c = 0; c < cols; c++)
        want32[(size_t)(r * cols + c)] = codes_f32[want_w[(size_t)(r * cols + c)]] * want_s[(size_t)((r / 128) * bc + c / 128)];
    EXPECT_EQ(Diff(got32, want32, k + ".f32"), 0);
    EXPECT_EQ(Diff(got16, Get<uint16_t>(k + ".bf16", MF_DTYPE_BF16), k + ".bf16"), 0);
    // Rows from the middle of a block (across two where there are two): the same bits.
    const int64_t r0 = rows > 128 ? 126 : 100;
    std::vector<float> part((size_t)(5 * cols));
    mf_fp8_dequantize_f32(want_w.data(), want_s.data(), cols, r0, 5, part.data());
    EXPECT_EQ(Diff(part, std::vector<float>(got32.begin() + r0 * cols, got32.begin() + (r0 + 5) * cols), k + " rows"),
              0);
  }
}

TEST_F(QuantFormat, Mxfp4DequantizeIsTransformers) {
  for (const char *name : {"e2r3g2", "e1r8g1"}) {
    const std::string k = std::string("mxfp4.") + name;
    const mf_st_tensor *bt = T(k + ".blocks", MF_DTYPE_U8);
    ASSERT_EQ(bt->ndim, 4);
    const int64_t e = bt->shape[0], r = bt->shape[1], g = bt->shape[2], cols = g * 32;
    const std::vector<uint8_t> blocks = Get<uint8_t>(k + ".blocks", MF_DTYPE_U8);
    const std::vector<uint8_t> scales = Get<uint8_t>(k + ".scales", MF_DTYPE_U8);
    ASSERT_EQ(mf_mxfp4_check(scales.data(), e * r, g, k.c_str()), MF_OK);
    // transformers writes [E, cols, R]: ours is [E, R, cols].
    const std::vector<uint16_t> want_t = Get<uint16_t>(k + ".bf16", MF_DTYPE_BF16);
    std::vector<uint16_t> want((size_t)(e * r * cols)), got((size_t)(e * r * cols));
    for (int64_t x = 0; x < e; x++)
      for (int64_t i = 0; i < r; i++)
        for (int64_t j = 0; j < cols; j++)
          want[(size_t)((x * r + i) * cols + j)] = want_t[(size_t)((x * cols + j) * r + i)];
    mf_mxfp4_dequantize_bf16(blocks.data(), scales.data(), g, 0, e * r, got.data());
    EXPECT_EQ(Diff(got, want, k), 0);
    // fp32 rounds to the same bf16.
    std::vector<float> f((size_t)(e * r * cols));
    mf_mxfp4_dequantize_f32(blocks.data(), scales.data(), g, 0, e * r, f.data());
    for (size_t i = 0; i < f.size(); i++) got[i] = mf_fp32_to_bf16(f[i]);
    EXPECT_EQ(Diff(got, want, k + " via f32"), 0);
  }
}

// Damaged stored data is refused, naming the tensor, the place and the fault.
TEST(QuantCheck, RefusesDamagedData) {
  float absmax[3] = {1.0f, NAN, 2.0f};
  mf_nf4_absmax a = {};
  a.absmax = absmax;
  EXPECT_EQ(mf_nf4_check(&a, 3, "layers.0.w"), MF_ERR_FORMAT);
  EXPECT_NE(std::string(mf_last_error()).find("layers.0.w: absmax[1] is nan"), std::string::npos) << mf_last_error();
  absmax[1] = -1.0f;
  EXPECT_EQ(mf_nf4_check(&a, 3, "w"), MF_ERR_FORMAT);
  absmax[1] = 0.0f;
  EXPECT_EQ(mf_nf4_check(&a, 3, "w"), MF_OK);

  uint8_t w[4] = {0x10, 0x7f, 0x00, 0x01};
  float s[1] = {0.5f};
  EXPECT_EQ(mf_fp8_check(w, s, 2, 2, "fp8w"), MF_ERR_FORMAT);
  EXPECT_NE(std::string(mf_last_error()).find("fp8w: element [0, 1] is the e4m3 NaN"), std::string::npos)
      << mf_last_error();
  w[1] = 0;
  s[0] = INFINITY;
  EXPECT_EQ(mf_fp8_check(w, s, 2, 2, "fp8w"), MF_ERR_FORMAT);
  EXPECT_NE(std::string(mf_last_error()).find("weight_scale_inv[0, 0] is inf"), std::string::npos) << mf_last_error();

  uint8_t sc[4] = {127, 127, 255, 1};
  EXPECT_EQ(mf_mxfp4_check(sc, 2, 2, "gate_up_proj_scales"), MF_ERR_FORMAT);
  EXPECT_NE(std::string(mf_last_error()).find("scale [1, 0] is 255"), std::string::npos) << mf_last_error();

  float x[2] = {1.0f, NAN};
  uint8_t packed[1];
  float am[1];
  EXPECT_EQ(mf_nf4_quantize(x, 2, 64, packed, am, "q.w"), MF_ERR_INVALID_ARG);
  EXPECT_NE(std::string(mf_last_error()).find("q.w: element 1 is not finite"), std::string::npos) << mf_last_error();
  EXPECT_EQ(mf_nf4_quantize(x, 1, 48, packed, am, "q.w"), MF_ERR_INVALID_ARG);

  mf_quant_kind k;
  EXPECT_EQ(mf_quant_parse("nf4", &k), MF_OK);
  EXPECT_EQ(k, MF_QUANT_NF4);
  EXPECT_EQ(mf_quant_parse("int4", &k), MF_ERR_INVALID_ARG);
  EXPECT_STREQ(mf_quant_name(MF_QUANT_MXFP4), "mxfp4");
}

}  // namespace
