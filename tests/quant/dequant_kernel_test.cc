// The cpu backend's DEQUANT kernel (kernels/backend.h) on the reference data
// of tests/fixtures/quant/formats.safetensors: in its checking mode, inside a
// device arena, fp32 and bf16 storage, it gives bitsandbytes' and
// transformers' bits; a call whose operands are too short for the weight it
// describes is refused naming the operand.
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "src/core/core.h"
#include "src/core/qformat.h"
#include "src/io/quant.h"
#include "src/io/safetensors.h"

namespace {

const char kFile[] = "tests/fixtures/quant/formats.safetensors";

class DequantKernel : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(mf_safetensors_open(kFile, &st_), MF_OK) << mf_last_error();
    mf_cpu_backend_opts o = {};
    o.checking = 1;
    ASSERT_EQ(mf_backend_cpu_create(&o, &b_), MF_OK) << mf_last_error();
    ASSERT_EQ(b_->stream_create(b_, &s_), MF_OK) << mf_last_error();
    void *base = nullptr;
    ASSERT_EQ(b_->arena_create(b_, kArena, &base), MF_OK) << mf_last_error();
    arena_ = static_cast<uint8_t *>(base);
  }
  void TearDown() override {
    if (b_) {
      if (s_) b_->stream_free(b_, s_);
      mf_backend_free(b_);
    }
    mf_safetensors_close(st_);
  }

  const mf_st_tensor *T(const std::string &name) {
    const mf_st_tensor *t = mf_safetensors_find(st_, name.c_str());
    EXPECT_NE(t, nullptr) << name;
    return t;
  }

  // Puts a tensor's bytes into the arena (marked live); NULL for none.
  void *Put(const mf_st_tensor *t) {
    if (!t) return nullptr;
    return Put(t->data, t->nbytes);
  }
  void *Put(const void *src, size_t bytes) {
    uint8_t *p = arena_ + off_;
    off_ += (bytes + 63) / 64 * 64;
    EXPECT_LE(off_, kArena);
    EXPECT_EQ(b_->mark(b_, p, bytes, 1), MF_OK) << mf_last_error();
    EXPECT_EQ(b_->copy(b_, p, src, bytes, MF_COPY_H2D, s_), MF_OK) << mf_last_error();
    return p;
  }

  // Runs DEQUANT of w (its pieces on the host, packed into a blob in the
  // arena) in `storage`, returns y's bytes.
  std::vector<uint8_t> Run(const mf_qweight &w, mf_dtype storage) {
    std::vector<uint8_t> blob((size_t)mf_qweight_blob_bytes(&w));
    mf_qweight_pack(&w, blob.data());
    mf_kernel_call c = {};
    c.kind = MF_K_DEQUANT;
    c.label = "test";
    c.i[0] = w.kind, c.i[1] = w.rows, c.i[2] = w.cols, c.i[3] = w.blocksize, c.i[4] = w.nested;
    c.b[0] = {Put(blob.data(), blob.size()), blob.size(), 0, MF_DTYPE_U8};
    const size_t yb = (size_t)(w.rows * w.cols) * mf_dtype_size(storage);
    std::vector<uint8_t> y(yb, 0x55);
    void *dy = Put(y.data(), yb);
    c.b[1] = {dy, yb, 1, storage};
    EXPECT_EQ(b_->run(b_, &c, s_), MF_OK) << mf_last_error();
    EXPECT_EQ(b_->copy(b_, y.data(), dy, yb, MF_COPY_D2H, s_), MF_OK) << mf_last_error();
    EXPECT_EQ(b_->stream_sync(b_, s_), MF_OK) << mf_last_error();
    return y;
  }

  void Expect(const std::vector<uint8_t> &got, const mf_st_tensor *want, const std::string &what) {
    ASSERT_NE(want, nullptr) << what;
    ASSERT_EQ(got.size(), want->nbytes) << what;
    EXPECT_EQ(std::memcmp(got.data(), want->data, got.size()), 0) << what;
  }

  static constexpr size_t kArena = 4 << 20;
  mf_safetensors *st_ = nullptr;
  mf_backend *b_ = nullptr;
  mf_stream *s_ = nullptr;
  uint8_t *arena_ = nullptr;
  size_t off_ = 0;
};

TEST_F(DequantKernel, Nf4IsBitsandbytes) {
  const struct {
    const char *name;
    int64_t bs;
  } cases[] = {{"nf4.b64", 64}, {"nf4.b64_tail", 64}, {"nf4.b32", 32}, {"nf4.b128_bf16", 128}, {"nf4dq.b64", 64}};
  for (const auto &k : cases) {
    const std::string n = k.name;
    const mf_st_tensor *in = T(n + ".input");
    ASSERT_NE(in, nullptr);
    mf_qweight w = {};
    w.kind = MF_QUANT_NF4;
    w.rows = in->shape[0];
    w.cols = in->shape[1];
    w.blocksize = k.bs;
    const bool nested = n.rfind("nf4dq.", 0) == 0;
    if (nested) {
      w.nested = 1;
      std::memcpy(&w.offset, T(n + ".offset")->data, 4);
      w.absmax2 = static_cast<const float *>(T(n + ".absmax2")->data);
      w.code2 = static_cast<const float *>(T(n + ".code2")->data);
    }
    w.q = static_cast<const uint8_t *>(T(n + ".packed")->data);
    w.scales = T(n + (nested ? ".absmax_q" : ".absmax"))->data;
    Expect(Run(w, MF_DTYPE_F32), T(n + ".f32"), n + " f32");
    Expect(Run(w, MF_DTYPE_BF16), T(n + ".bf16"), n + " bf16");
  }
}

TEST_F(DequantKernel, Fp8AndMxfp4AreTransformers) {
  const mf_st_tensor *in = T("fp8.r256c128.input");
  ASSERT_NE(in, nullptr);
  mf_qweight w = {};
  w.kind = MF_QUANT_FP8;
  w.rows = in->shape[0];
  w.cols = in->shape[1];
  w.q = static_cast<const uint8_t *>(T("fp8.r256c128.weight")->data);
  w.scales = T("fp8.r256c128.scale_inv")->data;
  Expect(Run(w, MF_DTYPE_BF16), T("fp8.r256c128.bf16"), "fp8 bf16");

  // MXFP4: transformers' output is [E, cols, R]; the kernel writes [E * R, cols].
  const mf_st_tensor *blocks = T("mxfp4.e2r3g2.blocks"), *want_t = T("mxfp4.e2r3g2.bf16");
  ASSERT_NE(blocks, nullptr);
  ASSERT_NE(want_t, nullptr);
  const int64_t E = blocks->shape[0], R = blocks->shape[1], cols = blocks->shape[2] * 32;
  mf_qweight m = {};
  m.kind = MF_QUANT_MXFP4;
  m.rows = E * R;
  m.cols = cols;
  m.q = static_cast<const uint8_t *>(blocks->data);
  m.scales = T("mxfp4.e2r3g2.scales")->data;
  const std::vector<uint8_t> got = Run(m, MF_DTYPE_BF16);
  const uint16_t *wt = static_cast<const uint16_t *>(want_t->data);
  int bad = 0;
  for (int64_t e = 0; e < E; e++)
    for (int64_t r = 0; r < R; r++)
      for (int64_t j = 0; j < cols; j++) {
        uint16_t g;
        std::memcpy(&g, &got[(size_t)(((e * R + r) * cols + j) * 2)], 2);
        bad += g != wt[(e * cols + j) * R + r];
      }
  EXPECT_EQ(bad, 0);
}

TEST_F(DequantKernel, RefusesOperandsTooShortForTheWeight) {
  std::vector<uint8_t> qw(96 + 12);  // NF4 3 x 64, blocks of 64: 96 bytes of codes, 3 absmax at 96
  std::vector<float> y(192);
  mf_kernel_call c = {};
  c.kind = MF_K_DEQUANT;
  c.label = "layers.0.w";
  c.i[0] = MF_QUANT_NF4, c.i[1] = 3, c.i[2] = 64, c.i[3] = 64;
  c.b[0] = {Put(qw.data(), qw.size()), qw.size() - 1, 0, MF_DTYPE_U8};
  c.b[1] = {Put(y.data(), y.size() * 4), y.size() * 4, 1, MF_DTYPE_F32};
  EXPECT_EQ(b_->run(b_, &c, s_), MF_ERR_INVALID_ARG);
  EXPECT_NE(
      std::string(mf_last_error()).find("dequant in layers.0.w: operand 0 (qw) has 107 bytes, the weight needs 108"),
      std::string::npos)
      << mf_last_error();
  c.b[0].bytes = qw.size();
  EXPECT_EQ(b_->run(b_, &c, s_), MF_OK) << mf_last_error();
  c.i[3] = 48;
  EXPECT_EQ(b_->run(b_, &c, s_), MF_ERR_INVALID_ARG);
  EXPECT_NE(std::string(mf_last_error()).find("NF4 block size 48"), std::string::npos) << mf_last_error();
  c.i[0] = 7;
  EXPECT_EQ(b_->run(b_, &c, s_), MF_ERR_INVALID_ARG);
  c.i[0] = MF_QUANT_NF4, c.i[3] = 64, c.i[4] = 1;  // nested: the blob would hold its map and offset too
  EXPECT_EQ(b_->run(b_, &c, s_), MF_ERR_INVALID_ARG);
  EXPECT_NE(std::string(mf_last_error()).find("the weight needs"), std::string::npos) << mf_last_error();
}

// A blob made at load (mf_quant_blob) is the format's pieces in their places:
// it dequantizes to what the pieces quantized apart do.
TEST_F(DequantKernel, BlobsMadeAtLoadDequantizeAsTheirPieces) {
  const mf_st_tensor *in = T("nf4dq.b64.input");
  ASSERT_NE(in, nullptr);
  const int64_t rows = in->shape[0], cols = in->shape[1];
  const float *x = static_cast<const float *>(in->data);
  for (int nested : {0, 1}) {
    mf_qweight w = {};
    w.kind = MF_QUANT_NF4, w.rows = rows, w.cols = cols, w.blocksize = 64, w.nested = nested;
    std::vector<uint8_t> blob((size_t)mf_qweight_blob_bytes(&w));
    ASSERT_EQ(mf_quant_blob(MF_QUANT_NF4, x, rows, cols, 64, nested, blob.data(), "x"), MF_OK) << mf_last_error();
    mf_qweight v = w;
    mf_qweight_blob_view(&v, blob.data());
    ASSERT_EQ(mf_qweight_check(&v, "x"), MF_OK) << mf_last_error();
    EXPECT_EQ(std::memcmp(v.q, T("nf4dq.b64.packed")->data, (size_t)mf_qweight_q_bytes(&w)), 0);  // bitsandbytes' codes
    std::vector<float> host((size_t)(rows * cols));
    mf_qweight_dequantize_f32(&v, 0, rows, host.data());
    const std::vector<uint8_t> dev = Run(v, MF_DTYPE_F32);
    EXPECT_EQ(std::memcmp(dev.data(), host.data(), dev.size()), 0) << "nested " << nested;
  }
  mf_qweight f = {};
  f.kind = MF_QUANT_FP8, f.rows = 256, f.cols = 128;
  std::vector<uint8_t> blob((size_t)mf_qweight_blob_bytes(&f));
  ASSERT_EQ(mf_quant_blob(MF_QUANT_FP8, static_cast<const float *>(T("fp8.r256c128.input")->data), 256, 128, 0, 0,
                          blob.data(), "x"),
            MF_OK);
  mf_qweight_blob_view(&f, blob.data());
  EXPECT_EQ(std::memcmp(f.q, T("fp8.r256c128.weight")->data, 256 * 128), 0);
  Expect(Run(f, MF_DTYPE_BF16), T("fp8.r256c128.bf16"), "fp8 blob bf16");
  EXPECT_EQ(mf_quant_blob(MF_QUANT_MXFP4, x, 2, 32, 0, 0, blob.data(), "x"), MF_ERR_INVALID_ARG);
}

}  // namespace
