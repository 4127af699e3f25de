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
    if (t) {
      EXPECT_EQ(t->dtype, dt) << name;
    }
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
    // a bf16 input widened to fp32 first, as bitsandbytes does (Input)
    ASSERT_EQ(mf_nf4_quantize(Input(k + ".input").data(), n, c.blocksize, packed.data(), absmax.data(), k.c_str()),
              MF_OK)
        << mf_last_error();
    EXPECT_EQ(Diff(packed, Get<uint8_t>(k + ".packed", MF_DTYPE_U8), k + ".packed"), 0);
    EXPECT_EQ(Diff(absmax, Get<float>(k + ".absmax", MF_DTYPE_F32), k + ".absmax"), 0);
  }
}

// The weight's shape from its input tensor (2-D in every case).
mf_qweight Nf4Weight(const mf_st_tensor *in, int64_t blocksize) {
  mf_qweight w = {};
  w.kind = MF_QUANT_NF4;
  w.rows = in->shape[0];
  w.cols = in->shape[1];
  w.blocksize = blocksize;
  return w;
}

// Dequantizes w whole to fp32 and bf16 and compares with the fixture's; a row
// range from the middle gives the same bits.
void ExpectDequantized(const mf_qweight &w, const std::vector<float> &want32, const std::vector<uint16_t> &want16,
                       const std::string &k) {
  ASSERT_EQ(mf_qweight_check(&w, k.c_str()), MF_OK) << mf_last_error();
  const int64_t n = w.rows * w.cols;
  std::vector<float> got32((size_t)n);
  std::vector<uint16_t> got16((size_t)n);
  mf_qweight_dequantize_f32(&w, 0, w.rows, got32.data());
  mf_qweight_dequantize_bf16(&w, 0, w.rows, got16.data());
  if (!want32.empty()) {
    EXPECT_EQ(Diff(got32, want32, k + ".f32"), 0);
  }
  if (!want16.empty()) {
    EXPECT_EQ(Diff(got16, want16, k + ".bf16"), 0);
  }
  const int64_t r0 = w.rows / 2 - 1, nr = 3;
  std::vector<float> part((size_t)(nr * w.cols));
  mf_qweight_dequantize_f32(&w, r0, nr, part.data());
  EXPECT_EQ(Diff(part, std::vector<float>(got32.begin() + r0 * w.cols, got32.begin() + (r0 + nr) * w.cols),
                 k + " rows"),
            0);
}

TEST_F(QuantFormat, Nf4DequantizeIsBitsandbytes) {
  for (const Nf4Case &c : kNf4) {
    const std::string k = std::string("nf4.") + c.name;
    const std::vector<uint8_t> packed = Get<uint8_t>(k + ".packed", MF_DTYPE_U8);
    const std::vector<float> absmax = Get<float>(k + ".absmax", MF_DTYPE_F32);
    mf_qweight w = Nf4Weight(mf_safetensors_find(st_, (k + ".input").c_str()), c.blocksize);
    w.q = packed.data();
    w.scales = absmax.data();
    EXPECT_EQ(mf_qweight_q_bytes(&w), (int64_t)packed.size());
    EXPECT_EQ(mf_qweight_scale_bytes(&w), (int64_t)absmax.size() * 4);
    ExpectDequantized(w, Get<float>(k + ".f32", MF_DTYPE_F32), Get<uint16_t>(k + ".bf16", MF_DTYPE_BF16), k);
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
    ASSERT_EQ(code2.size(), 256u);
    ASSERT_EQ(off.size(), 1u);
    mf_qweight w = Nf4Weight(mf_safetensors_find(st_, (k + ".input").c_str()), 64);
    w.q = packed.data();
    w.nested = 1;
    w.scales = q.data();
    w.absmax2 = a2.data();
    w.code2 = code2.data();
    w.offset = off[0];
    EXPECT_EQ(mf_qweight_scale_bytes(&w), (int64_t)q.size());
    EXPECT_EQ(mf_qweight_absmax2_count(&w), (int64_t)a2.size());
    ExpectDequantized(w, Get<float>(k + ".f32", MF_DTYPE_F32), Get<uint16_t>(k + ".bf16", MF_DTYPE_BF16), k);
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
  mf_qweight st = {};
  st.kind = MF_QUANT_NF4;
  st.nested = 1;
  st.scales = q.data();
  st.absmax2 = a2.data();
  st.code2 = code2.data();
  st.offset = offset;
  // The dynamic map's widest gap is 1/64 of its range (its top decade has 64
  // steps over [0.1, 1]): half of it, times the block's absmax, bounds the error.
  for (int64_t j = 0; j < nb; j++) {
    const float bound = a2[(size_t)(j / MF_NF4_DQ_BLOCK)] * (0.9f / 64.0f) * 0.5f + 1e-6f;
    EXPECT_LE(std::fabs(mf_qweight_nf4_absmax(&st, j) - absmax[(size_t)j]), bound) << j;
  }
}

TEST_F(QuantFormat, Fp8DecodingIsTorch) {
  const std::vector<uint8_t> codes = Get<uint8_t>("fp8.codes", MF_DTYPE_F8_E4M3);
  const std::vector<float> want = Get<float>("fp8.codes_f32", MF_DTYPE_F32);
  ASSERT_EQ(codes.size(), 256u);
  for (int i = 0; i < 256; i++) {
    const float got = mf_qf_e4m3(codes[(size_t)i]);
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
    mf_qweight q = {};
    q.kind = MF_QUANT_FP8;
    q.rows = rows;
    q.cols = cols;
    q.q = want_w.data();
    q.scales = want_s.data();
    // fp32: torch's decoding of each byte times its block's scale.
    std::vector<float> want32((size_t)(rows * cols));
    const int64_t bc = cols / 128;
    for (int64_t r = 0; r < rows; r++)
      for (int64_t c = 0; c < cols; c++)
        want32[(size_t)(r * cols + c)] =
            codes_f32[want_w[(size_t)(r * cols + c)]] * want_s[(size_t)((r / 128) * bc + c / 128)];
    ExpectDequantized(q, want32, Get<uint16_t>(k + ".bf16", MF_DTYPE_BF16), k);
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
    mf_qweight q = {};
    q.kind = MF_QUANT_MXFP4;
    q.rows = e * r;
    q.cols = cols;
    q.q = blocks.data();
    q.scales = scales.data();
    // transformers writes [E, cols, R]: ours is [E, R, cols].
    const std::vector<uint16_t> want_t = Get<uint16_t>(k + ".bf16", MF_DTYPE_BF16);
    std::vector<uint16_t> want((size_t)(e * r * cols)), got((size_t)(e * r * cols));
    for (int64_t x = 0; x < e; x++)
      for (int64_t i = 0; i < r; i++)
        for (int64_t j = 0; j < cols; j++)
          want[(size_t)((x * r + i) * cols + j)] = want_t[(size_t)((x * cols + j) * r + i)];
    EXPECT_EQ(mf_qweight_q_bytes(&q), (int64_t)blocks.size());
    EXPECT_EQ(mf_qweight_scale_bytes(&q), (int64_t)scales.size());
    ExpectDequantized(q, {}, want, k);
  }
}

// The four families' weights (the parity fixtures' models): every 2-D weight
// but the embedding quantized to NF4 and FP8 gives bitsandbytes' and
// transformers' bits, and NF4 dequantizes to bitsandbytes' bf16.
TEST(QuantFamilies, WeightsQuantizeAndDequantizeAsTheReferences) {
  mf_safetensors *ref = nullptr;
  ASSERT_EQ(mf_safetensors_open("tests/fixtures/quant/families.safetensors", &ref), MF_OK) << mf_last_error();
  int weights = 0;
  for (const char *fam : {"mixtral", "qwen2_moe", "qwen3_moe", "olmoe"}) {
    mf_safetensors *m = nullptr;
    ASSERT_EQ(mf_safetensors_open((std::string("tests/fixtures/") + fam + "/model.safetensors").c_str(), &m), MF_OK)
        << mf_last_error();
    for (size_t t = 0; t < mf_safetensors_count(m); t++) {
      const mf_st_tensor *w = mf_safetensors_get(m, t);
      const std::string name = w->name;
      if (w->ndim != 2 || name.find("embed_tokens") != std::string::npos) continue;
      ASSERT_EQ(w->dtype, MF_DTYPE_F32) << name;
      const std::string k = std::string(fam) + "/" + name;
      auto get = [&](const std::string &suffix) {
        const mf_st_tensor *r = mf_safetensors_find(ref, (k + suffix).c_str());
        EXPECT_NE(r, nullptr) << k + suffix;
        return r ? std::vector<uint8_t>((const uint8_t *)r->data, (const uint8_t *)r->data + r->nbytes)
                 : std::vector<uint8_t>();
      };
      const int64_t rows = w->shape[0], cols = w->shape[1], n = rows * cols, nb = mf_quant_blocks(n, 64);
      std::vector<float> x((size_t)n);
      std::memcpy(x.data(), w->data, w->nbytes);
      std::vector<uint8_t> packed((size_t)(n + 1) / 2);
      std::vector<float> absmax((size_t)nb);
      ASSERT_EQ(mf_nf4_quantize(x.data(), n, 64, packed.data(), absmax.data(), k.c_str()), MF_OK);
      EXPECT_EQ(Diff(packed, get(".nf4"), k + ".nf4"), 0);
      std::vector<uint8_t> am((size_t)nb * 4);
      std::memcpy(am.data(), absmax.data(), am.size());
      EXPECT_EQ(Diff(am, get(".absmax"), k + ".absmax"), 0);
      mf_qweight q = {};
      q.kind = MF_QUANT_NF4;
      q.rows = rows;
      q.cols = cols;
      q.blocksize = 64;
      q.q = packed.data();
      q.scales = absmax.data();
      std::vector<uint16_t> deq((size_t)n);
      mf_qweight_dequantize_bf16(&q, 0, rows, deq.data());
      std::vector<uint8_t> deqb((size_t)n * 2);
      std::memcpy(deqb.data(), deq.data(), deqb.size());
      EXPECT_EQ(Diff(deqb, get(".nf4_bf16"), k + ".nf4_bf16"), 0);
      const int64_t sb = mf_quant_blocks(rows, 128) * mf_quant_blocks(cols, 128);
      std::vector<uint8_t> f8((size_t)n);
      std::vector<float> si((size_t)sb);
      ASSERT_EQ(mf_fp8_quantize(x.data(), rows, cols, f8.data(), si.data(), k.c_str()), MF_OK);
      EXPECT_EQ(Diff(f8, get(".fp8"), k + ".fp8"), 0);
      std::vector<uint8_t> sib((size_t)sb * 4);
      std::memcpy(sib.data(), si.data(), sib.size());
      EXPECT_EQ(Diff(sib, get(".scale_inv"), k + ".scale_inv"), 0);
      weights++;
    }
    mf_safetensors_close(m);
  }
  mf_safetensors_close(ref);
  EXPECT_GE(weights, 100);  // every family's attention, router and expert weights
}

// Damaged stored data is refused, naming the tensor, the place and the fault.
TEST(QuantCheck, RefusesDamagedData) {
  float absmax[3] = {1.0f, NAN, 2.0f};
  uint8_t packed[96] = {};
  mf_qweight a = {};
  a.kind = MF_QUANT_NF4;
  a.rows = 3;
  a.cols = 64;
  a.blocksize = 64;
  a.q = packed;
  a.scales = absmax;
  EXPECT_EQ(mf_qweight_check(&a, "layers.0.w"), MF_ERR_FORMAT);
  EXPECT_NE(std::string(mf_last_error()).find("layers.0.w: absmax[1] is nan"), std::string::npos) << mf_last_error();
  absmax[1] = -1.0f;
  EXPECT_EQ(mf_qweight_check(&a, "w"), MF_ERR_FORMAT);
  absmax[1] = 0.0f;
  EXPECT_EQ(mf_qweight_check(&a, "w"), MF_OK);
  a.blocksize = 48;
  EXPECT_EQ(mf_qweight_check(&a, "w"), MF_ERR_FORMAT);
  EXPECT_NE(std::string(mf_last_error()).find("block size 48"), std::string::npos) << mf_last_error();
  // Double quantized: a map entry that is not finite, an absmax that restores negative.
  a.blocksize = 64;
  a.nested = 1;
  uint8_t aq[3] = {0, 1, 2};
  float a2[1] = {1.0f}, code2[256];
  for (int i = 0; i < 256; i++) code2[i] = (float)i / 255.0f;
  a.scales = aq;
  a.absmax2 = a2;
  a.code2 = code2;
  a.offset = 0.5f;
  EXPECT_EQ(mf_qweight_check(&a, "w"), MF_OK) << mf_last_error();
  code2[200] = INFINITY;
  EXPECT_EQ(mf_qweight_check(&a, "w"), MF_ERR_FORMAT);
  EXPECT_NE(std::string(mf_last_error()).find("nested_quant_map[200] is inf"), std::string::npos) << mf_last_error();
  code2[200] = 0.5f;
  a.offset = -0.6f;
  EXPECT_EQ(mf_qweight_check(&a, "w"), MF_ERR_FORMAT);
  EXPECT_NE(std::string(mf_last_error()).find("absmax[0] restores to"), std::string::npos) << mf_last_error();

  uint8_t w[4] = {0x10, 0x7f, 0x00, 0x01};
  float s[1] = {0.5f};
  mf_qweight f = {};
  f.kind = MF_QUANT_FP8;
  f.rows = 2;
  f.cols = 2;
  f.q = w;
  f.scales = s;
  EXPECT_EQ(mf_qweight_check(&f, "fp8w"), MF_ERR_FORMAT);
  EXPECT_NE(std::string(mf_last_error()).find("fp8w: element [0, 1] is the e4m3 NaN"), std::string::npos)
      << mf_last_error();
  w[1] = 0;
  s[0] = INFINITY;
  EXPECT_EQ(mf_qweight_check(&f, "fp8w"), MF_ERR_FORMAT);
  EXPECT_NE(std::string(mf_last_error()).find("weight_scale_inv[0, 0] is inf"), std::string::npos) << mf_last_error();

  uint8_t sc[4] = {127, 127, 255, 1}, blk[64] = {};
  mf_qweight m = {};
  m.kind = MF_QUANT_MXFP4;
  m.rows = 2;
  m.cols = 64;
  m.q = blk;
  m.scales = sc;
  EXPECT_EQ(mf_qweight_check(&m, "gate_up_proj_scales"), MF_ERR_FORMAT);
  EXPECT_NE(std::string(mf_last_error()).find("scale [1, 0] is 255"), std::string::npos) << mf_last_error();
  m.cols = 48;
  EXPECT_EQ(mf_qweight_check(&m, "x"), MF_ERR_FORMAT);
  EXPECT_NE(std::string(mf_last_error()).find("48 columns"), std::string::npos) << mf_last_error();

  float x[2] = {1.0f, NAN};
  float am[1];
  EXPECT_EQ(mf_nf4_quantize(x, 2, 64, packed, am, "q.w"), MF_ERR_INVALID_ARG);
  EXPECT_NE(std::string(mf_last_error()).find("q.w: element 1 is not finite"), std::string::npos) << mf_last_error();
  EXPECT_EQ(mf_nf4_quantize(x, 1, 48, packed, am, "q.w"), MF_ERR_INVALID_ARG);

  EXPECT_STREQ(mf_quant_name(MF_QUANT_MXFP4), "mxfp4");
}

}  // namespace
