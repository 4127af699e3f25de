// DEQUANT on the cuda backend against its cpu twin, bit for bit: NF4 (plain
// and double-quantized absmax), FP8 in 128 x 128 blocks with partial edge
// blocks, MXFP4 at gpt-oss' 2880 columns; fp32 and bf16 storage. Both read
// every element through src/core/qformat.h mf_qweight_at (the device with
// __fmul_rn / __fadd_rn, which nvcc does not fuse), so nothing may differ.
// The cpu twin itself is checked against bitsandbytes and transformers in
// tests/quant/dequant_kernel_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "src/core/core.h"
#include "src/core/qformat.h"
#include "tests/cuda/twin_fixture.h"

namespace {

struct Weight {
  std::string name;
  mf_qweight w = {};
  std::vector<uint8_t> q, scales;
  std::vector<float> absmax2, code2;
  std::vector<uint8_t> blob;  // the pieces packed (mf_qweight_blob_view's layout)
};

Weight Make(const std::string &name, int kind, int64_t rows, int64_t cols, int64_t bs, int nested, uint64_t seed) {
  std::mt19937_64 g(seed);
  Weight x;
  x.name = name;
  x.w.kind = kind;
  x.w.rows = rows;
  x.w.cols = cols;
  x.w.blocksize = bs;
  x.w.nested = nested;
  x.w.offset = 0.0123f;
  x.q.resize((size_t)mf_qweight_q_bytes(&x.w));
  std::uniform_int_distribution<int> byte(0, 255), e4m3(0, 0x7e), e8m0(100, 150);
  for (auto &b : x.q) b = (uint8_t)(kind == MF_QUANT_FP8 ? (e4m3(g) | (byte(g) & 0x80)) : byte(g));
  x.scales.resize((size_t)mf_qweight_scale_bytes(&x.w));
  std::uniform_real_distribution<float> pos(1e-3f, 4.0f), any(-1.0f, 1.0f);
  if (kind == MF_QUANT_MXFP4 || nested) {
    for (auto &b : x.scales) b = (uint8_t)(kind == MF_QUANT_MXFP4 ? e8m0(g) : byte(g));
  } else {
    std::vector<float> f(x.scales.size() / 4);
    for (auto &v : f) v = pos(g);
    std::memcpy(x.scales.data(), f.data(), x.scales.size());
  }
  if (nested) {
    x.absmax2.resize((size_t)mf_qweight_absmax2_count(&x.w));
    for (auto &v : x.absmax2) v = pos(g);
    x.code2.resize(256);
    for (auto &v : x.code2) v = any(g);
  }
  // The blob: every piece at its place (the layout of src/core/qformat.h).
  x.blob.assign((size_t)mf_qweight_blob_bytes(&x.w), 0);
  std::memcpy(x.blob.data(), x.q.data(), x.q.size());
  std::memcpy(&x.blob[(size_t)mf_qweight_blob_scales_at(&x.w)], x.scales.data(), x.scales.size());
  if (nested) {
    std::memcpy(&x.blob[(size_t)mf_qweight_blob_absmax2_at(&x.w)], x.absmax2.data(), x.absmax2.size() * 4);
    std::memcpy(&x.blob[(size_t)mf_qweight_blob_code2_at(&x.w)], x.code2.data(), 1024);
    std::memcpy(&x.blob[(size_t)mf_qweight_blob_offset_at(&x.w)], &x.w.offset, 4);
  }
  return x;
}

class Dequant : public CudaTwin<((size_t)64 << 20)> {
 protected:
  // The call on `b` with operands at the given pointers (host or device).
  static mf_kernel_call Call(const Weight &x, mf_dtype storage, void *qw, void *y) {
    mf_kernel_call c = {};
    c.kind = MF_K_DEQUANT;
    c.label = x.name.c_str();
    c.i[0] = x.w.kind;
    c.i[1] = x.w.rows;
    c.i[2] = x.w.cols;
    c.i[3] = x.w.blocksize;
    c.i[4] = x.w.nested;
    c.b[0] = {qw, x.blob.size(), 0, MF_DTYPE_U8};
    c.b[1] = {y, (size_t)(x.w.rows * x.w.cols) * mf_dtype_size(storage), 1, storage};
    return c;
  }

  std::vector<uint8_t> OnGpu(const Weight &x, mf_dtype storage) {
    size_t off = 0;
    auto put = [&](const void *src, size_t bytes) -> void * {
      if (!bytes) return nullptr;
      uint8_t *p = arena_ + off;
      off += (bytes + 255) / 256 * 256;
      EXPECT_LE(off, kArena);
      EXPECT_EQ(gpu_->copy(gpu_, p, src, bytes, MF_COPY_H2D, gpu_s_), MF_OK) << mf_last_error();
      return p;
    };
    void *qw = put(x.blob.data(), x.blob.size());
    const size_t ybytes = (size_t)(x.w.rows * x.w.cols) * mf_dtype_size(storage);
    std::vector<uint8_t> y(ybytes, 0xAB);
    void *dy = put(y.data(), ybytes);
    const mf_kernel_call c = Call(x, storage, qw, dy);
    EXPECT_EQ(gpu_->run(gpu_, &c, gpu_s_), MF_OK) << mf_last_error();
    EXPECT_EQ(gpu_->copy(gpu_, y.data(), dy, ybytes, MF_COPY_D2H, gpu_s_), MF_OK) << mf_last_error();
    EXPECT_EQ(gpu_->stream_sync(gpu_, gpu_s_), MF_OK) << mf_last_error();
    return y;
  }

  std::vector<uint8_t> OnCpu(const Weight &x, mf_dtype storage) {
    Weight h = x;
    std::vector<uint8_t> y((size_t)(x.w.rows * x.w.cols) * mf_dtype_size(storage), 0xCD);
    const mf_kernel_call c = Call(h, storage, h.blob.data(), y.data());
    EXPECT_EQ(cpu_->run(cpu_, &c, cpu_s_), MF_OK) << mf_last_error();
    EXPECT_EQ(cpu_->stream_sync(cpu_, cpu_s_), MF_OK) << mf_last_error();
    return y;
  }
};

TEST_F(Dequant, EveryFormatGivesTheCpuTwinsBits) {
  const Weight cases[] = {
      Make("nf4 b64", MF_QUANT_NF4, 300, 1000, 64, 0, 1),
      Make("nf4 b64 nested", MF_QUANT_NF4, 257, 640, 64, 1, 2),
      Make("nf4 b128 odd", MF_QUANT_NF4, 13, 77, 128, 0, 3),
      Make("fp8 partial blocks", MF_QUANT_FP8, 300, 520, 0, 0, 4),
      Make("mxfp4 2880", MF_QUANT_MXFP4, 96, 2880, 0, 0, 5),
  };
  for (const Weight &x : cases)
    for (mf_dtype storage : {MF_DTYPE_F32, MF_DTYPE_BF16}) {
      SCOPED_TRACE(x.name + (storage == MF_DTYPE_BF16 ? " bf16" : " f32"));
      const std::vector<uint8_t> cpu = OnCpu(x, storage), gpu = OnGpu(x, storage);
      ASSERT_EQ(cpu.size(), gpu.size());
      size_t bad = 0, first = cpu.size();
      const size_t es = mf_dtype_size(storage);
      for (size_t i = 0; i < cpu.size(); i += es)
        if (std::memcmp(&cpu[i], &gpu[i], es) != 0) bad++, first = std::min(first, i / es);
      EXPECT_EQ(bad, 0u) << "first differing element " << first;
    }
}

}  // namespace
