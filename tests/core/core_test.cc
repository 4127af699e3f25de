// src/core: errors and traces, logging filters, dtype conversions, the thread
// pool's partition, arenas and byte sizes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "src/core/core.h"
#include "src/core/env.h"

namespace {

mf_status inner_fails() { return MF_ERR(MF_ERR_FORMAT, "x.bin: byte 12: bad magic"); }
mf_status outer_passes_up() {
  MF_CHECK(inner_fails());
  return MF_OK;
}

TEST(Error, MessageAndTraceCarryContext) {
  mf_error_clear();
  EXPECT_EQ(outer_passes_up(), MF_ERR_FORMAT);
  EXPECT_STREQ(mf_last_error(), "x.bin: byte 12: bad magic");
  std::string trace = mf_last_error_trace();
  EXPECT_NE(trace.find("core_test.cc"), std::string::npos) << trace;
  EXPECT_NE(trace.find("inner_fails()"), std::string::npos) << trace;
  mf_error_prefix("loading %s", "model");
  EXPECT_STREQ(mf_last_error(), "loading model: x.bin: byte 12: bad magic");
  mf_error_clear();
  EXPECT_STREQ(mf_last_error(), "no error recorded");
}

// A message that wraps the one before it (mf_last_error() as an argument, at
// the start or the end) keeps it whole.
TEST(Error, AMessageMayWrapTheLastOne) {
  (void)MF_ERR(MF_ERR_FORMAT, "bad magic");
  EXPECT_EQ(MF_ERR(MF_ERR_CONFIG, "%s (at %s)", mf_last_error(), "config.yaml:3"), MF_ERR_CONFIG);
  EXPECT_STREQ(mf_last_error(), "bad magic (at config.yaml:3)");
  (void)MF_ERR(MF_ERR_FORMAT, "%s: the checkpoint's config does not load: %s", "ck", mf_last_error());
  EXPECT_STREQ(mf_last_error(), "ck: the checkpoint's config does not load: bad magic (at config.yaml:3)");
  mf_error_clear();
}

TEST(Error, CheckGotoRunsCleanup) {
  int cleaned = 0;
  auto fn = [&]() -> mf_status {
    mf_status st = MF_OK;
    MF_CHECK_GOTO(inner_fails(), st, done);
    ADD_FAILURE() << "not reached";
  done:
    cleaned = 1;
    return st;
  };
  EXPECT_EQ(fn(), MF_ERR_FORMAT);
  EXPECT_EQ(cleaned, 1);
}

TEST(Error, StatusNamesAreDistinct) {
  for (int a = 0; a < MF_STATUS_COUNT_; a++)
    for (int b = a + 1; b < MF_STATUS_COUNT_; b++)
      EXPECT_STRNE(mf_status_name((mf_status)a), mf_status_name((mf_status)b));
  EXPECT_STREQ(mf_status_name((mf_status)999), "unknown status");
}

std::string capture_log(const char *level, const char *subsys, void (*emit)()) {
  setenv("MF_LOG", level, 1);
  if (subsys)
    setenv("MF_LOG_SUBSYS", subsys, 1);
  else
    unsetenv("MF_LOG_SUBSYS");
  mf_env_reload();
  mf_log_configure();
  FILE *f = tmpfile();
  mf_log_set_stream(f);
  emit();
  mf_log_set_stream(nullptr);
  std::string out;
  rewind(f);
  char buf[512];
  while (fgets(buf, sizeof buf, f)) out += buf;
  fclose(f);
  unsetenv("MF_LOG");
  unsetenv("MF_LOG_SUBSYS");
  mf_env_reload();
  mf_log_configure();
  return out;
}

void emit_all() {
  MF_LOGE("io", "e-io");
  MF_LOGW("config", "w-config");
  MF_LOGI("io", "i-io");
  MF_LOGD("io", "d-io");
  MF_LOGD("config", "d-config");
  MF_LOGT("io", "t-io");
}

TEST(Log, LevelAndSubsystemFilters) {
  std::string info = capture_log("info", nullptr, emit_all);
  EXPECT_NE(info.find("e-io"), std::string::npos);
  EXPECT_NE(info.find("w-config"), std::string::npos);
  EXPECT_NE(info.find("i-io"), std::string::npos);
  EXPECT_EQ(info.find("d-io"), std::string::npos);

  std::string dbg = capture_log("debug", "io", emit_all);
  EXPECT_NE(dbg.find("d-io"), std::string::npos);
  EXPECT_EQ(dbg.find("d-config"), std::string::npos);  // filtered by subsystem
  EXPECT_NE(dbg.find("w-config"), std::string::npos);  // warnings always pass
  EXPECT_EQ(dbg.find("t-io"), std::string::npos);

  std::string err = capture_log("error", nullptr, emit_all);
  EXPECT_NE(err.find("e-io"), std::string::npos);
  EXPECT_EQ(err.find("w-config"), std::string::npos);
}

uint32_t bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
float from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// The bf16 result must be the nearest bf16 value, ties to the even mantissa.
TEST(Dtype, Bf16RoundsToNearestEven) {
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; i++) {
    uint32_t u = rng();
    float x = from_bits(u);
    if (std::isnan(x)) continue;
    uint16_t h = mf_fp32_to_bf16(x);
    uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;
    uint32_t rest = u & 0xffffu;
    uint32_t expect;
    if (rest < 0x8000u)
      expect = lo;
    else if (rest > 0x8000u)
      expect = hi;
    else
      expect = ((lo >> 16) & 1u) ? hi : lo;
    ASSERT_EQ((uint32_t)h << 16, expect) << std::hex << u;
  }
  EXPECT_EQ(mf_fp32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(mf_fp32_to_bf16(from_bits(0x3f808000u)), 0x3f80);  // tie, even stays
  EXPECT_EQ(mf_fp32_to_bf16(from_bits(0x3f818000u)), 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(mf_fp32_to_bf16(from_bits(0x7f7fffffu)), 0x7f80);  // max float rounds to Inf
  EXPECT_EQ(mf_fp32_to_bf16(-INFINITY), 0xff80);
}

TEST(Dtype, Bf16KeepsNaN) {
  const uint32_t nans[] = {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu, 0x7f80ffffu};
  for (uint32_t n : nans) {
    uint16_t h = mf_fp32_to_bf16(from_bits(n));
    EXPECT_TRUE(std::isnan(mf_bf16_to_fp32(h))) << std::hex << n;
    EXPECT_EQ(h & 0x8000u, (n >> 16) & 0x8000u);
  }
  for (uint32_t h = 0; h < 65536; h++) {
    float f = mf_bf16_to_fp32((uint16_t)h);
    if (!std::isnan(f)) {
      ASSERT_EQ(mf_fp32_to_bf16(f), h);
    }
  }
}

TEST(Dtype, Fp16MatchesCompiler) {
  // Every half value converts exactly and back.
  for (uint32_t h = 0; h < 65536; h++) {
    _Float16 ref;
    uint16_t hh = (uint16_t)h;
    memcpy(&ref, &hh, 2);
    float f = mf_fp16_to_fp32(hh);
    if (std::isnan((float)ref)) {
      ASSERT_TRUE(std::isnan(f));
      continue;
    }
    ASSERT_EQ(bits(f), bits((float)ref)) << h;
    ASSERT_EQ(mf_fp32_to_fp16(f), hh) << h;
  }
  // Random floats round like the compiler's conversion (round to nearest even).
  std::mt19937 rng(11);
  for (int i = 0; i < 500000; i++) {
    float x = from_bits(rng());
    if (std::isnan(x)) continue;
    _Float16 ref = (_Float16)x;
    uint16_t rb;
    memcpy(&rb, &ref, 2);
    ASSERT_EQ(mf_fp32_to_fp16(x), rb) << std::hex << bits(x);
  }
}

TEST(Dtype, NamesAndSizes) {
  EXPECT_EQ(mf_dtype_from_name("BF16", 4), MF_DTYPE_BF16);
  EXPECT_EQ(mf_dtype_from_name("F8_E4M3", 7), MF_DTYPE_F8_E4M3);
  EXPECT_EQ(mf_dtype_from_name("bf16", 4), MF_DTYPE_INVALID);
  EXPECT_EQ(mf_dtype_from_name("F3", 2), MF_DTYPE_INVALID);
  EXPECT_EQ(mf_dtype_from_name("F32x", 3), MF_DTYPE_F32);  // length-delimited
  EXPECT_EQ(mf_dtype_size(MF_DTYPE_F64), 8u);
  EXPECT_EQ(mf_dtype_size(MF_DTYPE_INVALID), 0u);
  for (int t = 1; t < MF_DTYPE_COUNT_; t++) {
    const char *n = mf_dtype_name((mf_dtype)t);
    EXPECT_EQ(mf_dtype_from_name(n, strlen(n)), (mf_dtype)t);
  }
}

struct SumCtx {
  const std::vector<double> *v;
  double partial[64];
};

void sum_part(void *ctx, int i, int n) {
  SumCtx *c = (SumCtx *)ctx;
  size_t b, e;
  mf_partition(c->v->size(), 16, i, n, &b, &e);
  double s = 0;
  for (size_t k = b; k < e; k++) s += (*c->v)[k];
  c->partial[i] = s;
}

TEST(ThreadPool, EveryWorkerRunsItsPartOnce) {
  std::vector<double> v(100003);
  for (size_t i = 0; i < v.size(); i++) v[i] = (double)(i % 97);
  double want = 0;
  for (double x : v) want += x;
  for (int n : {1, 2, 3, 8}) {
    mf_threadpool *p = nullptr;
    ASSERT_EQ(mf_threadpool_create(n, &p), MF_OK);
    EXPECT_EQ(mf_threadpool_size(p), n);
    for (int rep = 0; rep < 50; rep++) {
      SumCtx c{&v, {0}};
      mf_threadpool_run(p, sum_part, &c);
      double got = 0;
      for (int i = 0; i < n; i++) got += c.partial[i];
      ASSERT_EQ(got, want);
    }
    mf_threadpool_free(p);
  }
  mf_threadpool_free(nullptr);
}

TEST(ThreadPool, PartitionCoversExactly) {
  for (size_t count : {0ul, 1ul, 7ul, 64ul, 1000ul, 1001ul})
    for (size_t grain : {1ul, 8ul, 64ul})
      for (int n : {1, 2, 3, 7}) {
        size_t next = 0;
        for (int i = 0; i < n; i++) {
          size_t b, e;
          mf_partition(count, grain, i, n, &b, &e);
          ASSERT_EQ(b, next);
          ASSERT_LE(b, e);
          if (e < count) {
            ASSERT_EQ((e - b) % grain, 0u);
          }
          next = e;
        }
        ASSERT_EQ(next, count);
      }
}

TEST(Arena, AlignsAndReportsExhaustion) {
  mf_arena a;
  ASSERT_EQ(mf_arena_create(&a, 1024, 256), MF_OK);
  void *p1, *p2, *p3;
  ASSERT_EQ(mf_arena_alloc(&a, 10, 64, "a", &p1), MF_OK);
  ASSERT_EQ(mf_arena_alloc(&a, 100, 256, "b", &p2), MF_OK);
  EXPECT_EQ((uintptr_t)p1 % 64, 0u);
  EXPECT_EQ((uintptr_t)p2 % 256, 0u);
  EXPECT_EQ(mf_arena_alloc(&a, 2000, 8, "weights", &p3), MF_ERR_OUT_OF_MEMORY);
  EXPECT_EQ(p3, nullptr);
  EXPECT_NE(std::string(mf_last_error()).find("weights"), std::string::npos);
  EXPECT_EQ(mf_arena_alloc(&a, 8, 3, "bad", &p3), MF_ERR_INVALID_ARG);
  EXPECT_EQ(a.peak, 356u);
  mf_arena_reset(&a);
  EXPECT_EQ(a.used, 0u);
  ASSERT_EQ(mf_arena_alloc(&a, 1024, 1, "all", &p3), MF_OK);
  mf_arena_destroy(&a);
  mf_arena_destroy(&a);  // a zeroed arena is fine

  size_t sizes[] = {10, 100, 7};
  EXPECT_EQ(mf_arena_estimate(sizes, 3, 64), 128u + 64u + 7u);
  alignas(64) static unsigned char block[199];
  mf_arena b;
  mf_arena_init(&b, block, sizeof block);
  for (size_t s : sizes) ASSERT_EQ(mf_arena_alloc(&b, s, 64, "x", &p1), MF_OK);
  EXPECT_EQ(mf_arena_alloc(&b, 1, 1, "x", &p1), MF_ERR_OUT_OF_MEMORY);
  mf_arena_destroy(&b);
}

TEST(Util, ParseSize) {
  uint64_t v = 0;
  EXPECT_EQ(mf_parse_size("24GiB", &v), 0);
  EXPECT_EQ(v, 24ull << 30);
  EXPECT_EQ(mf_parse_size("512MiB", &v), 0);
  EXPECT_EQ(v, 512ull << 20);
  EXPECT_EQ(mf_parse_size("1.5G", &v), 0);
  EXPECT_EQ(v, 3ull << 29);
  EXPECT_EQ(mf_parse_size("2GB", &v), 0);
  EXPECT_EQ(v, 2000000000ull);
  EXPECT_EQ(mf_parse_size("4096", &v), 0);
  EXPECT_EQ(v, 4096u);
  EXPECT_EQ(mf_parse_size(" 8 KiB ", &v), 0);
  EXPECT_EQ(v, 8192u);
  // Decimal sizes that are whole bytes though their product is inexact in binary.
  for (int tenths = 1; tenths < 1000; tenths++) {
    char buf[32];
    snprintf(buf, sizeof buf, "%d.%dGB", tenths / 10, tenths % 10);
    ASSERT_EQ(mf_parse_size(buf, &v), 0) << buf;
    ASSERT_EQ(v, (uint64_t)tenths * 100000000ull) << buf;
  }
  for (const char *bad : {"", "GiB", "-1GiB", "12 parsecs", "1e400", "0.5", "nan", "99999999999TiB", "1..2G"})
    EXPECT_EQ(mf_parse_size(bad, &v), -1) << bad;
  char buf[32];
  EXPECT_STREQ(mf_format_bytes(1536, buf, sizeof buf), "1.50 KiB");
  EXPECT_STREQ(mf_format_bytes(12, buf, sizeof buf), "12 B");
}

// Bytes switch unit where two decimals would round up to 1024 of the smaller one.
TEST(Util, FormatBytesNeverShows1024OfAUnit) {
  char buf[32];
  EXPECT_STREQ(mf_format_bytes(1023, buf, sizeof buf), "1023 B");
  EXPECT_STREQ(mf_format_bytes(1024, buf, sizeof buf), "1.00 KiB");
  EXPECT_STREQ(mf_format_bytes(1048575, buf, sizeof buf), "1.00 MiB");  // 1023.999 KiB
  EXPECT_STREQ(mf_format_bytes(1048570, buf, sizeof buf), "1023.99 KiB");
  EXPECT_STREQ(mf_format_bytes(18874368, buf, sizeof buf), "18.00 MiB");
  EXPECT_STREQ(mf_format_bytes((1ull << 40) - 1, buf, sizeof buf), "1.00 TiB");
  EXPECT_STREQ(mf_format_bytes(UINT64_MAX, buf, sizeof buf), "16.00 EiB");
}

// Counts for people: three significant digits, K/M/B/T, never "1e+03K".
TEST(Util, FormatCount) {
  char buf[32];
  const struct {
    double n;
    const char *want;
  } cases[] = {
      {0, "0"},
      {7, "7"},
      {950, "950"},
      {999, "999"},
      {999.4, "999"},
      {999.5, "1.00K"},
      {1000, "1.00K"},
      {1010, "1.01K"},
      {9994, "9.99K"},
      {9995, "10.0K"},  // where %.2f would show 10.00K
      {12345, "12.3K"},
      {99949, "99.9K"},
      {99950, "100K"},  // where %.1f would show 100.0K
      {451904, "452K"},
      {999499, "999K"},
      {999500, "1.00M"},  // not "1e+03K" or "1000K"
      {1034000, "1.03M"},
      {3042000000.0, "3.04B"},
      {12750000000.0, "12.8B"},
      {46702792704.0, "46.7B"},
      {75490000000.0, "75.5B"},
      {1.5e12, "1.50T"},
      {2.5e15, "2500T"},
      {-12345, "-12.3K"},
      {0.4, "0"},
      {NAN, "-"},
      {INFINITY, "-"},
  };
  for (const auto &c : cases) EXPECT_STREQ(mf_format_count(c.n, buf, sizeof buf), c.want) << c.n;
  // A short buffer is cut like snprintf's and stays a C string.
  char small[4];
  EXPECT_STREQ(mf_format_count(46702792704.0, small, sizeof small), "46.");
}

std::string PrintTable(mf_table *t, const char *indent) {
  char *text = nullptr;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  EXPECT_EQ(mf_table_print(t, f, indent), MF_OK) << mf_last_error();
  fclose(f);
  std::string s(text, len);
  free(text);
  return s;
}

// Each column as wide as its widest cell, header included; numbers right,
// words left; no trailing spaces; group labels centred over their columns.
TEST(Table, AlignsEachColumnToItsWidestCell) {
  mf_table *t = nullptr;
  ASSERT_EQ(mf_table_create("lrrl", &t), MF_OK);
  for (const char *c : {"layer", "res", "stream", "optimizer"}) mf_table_cell(t, "%s", c);
  mf_table_cell(t, "layer %d", 0), mf_table_cell(t, "%d", 777), mf_table_cell(t, "%d", 0), mf_table_cell(t, "device");
  mf_table_cell(t, "layer %d", 10), mf_table_cell(t, "%d", 10), mf_table_cell(t, "%d", 11), mf_table_cell(t, "host");
  EXPECT_EQ(PrintTable(t, "  "),
            "  layer     res  stream  optimizer\n"
            "  layer 0   777       0  device\n"
            "  layer 10   10      11  host\n");
  mf_table_free(t);

  // A group label wider than its columns widens the last of them; a short
  // last row is padded with empty cells.
  ASSERT_EQ(mf_table_create("lrr", &t), MF_OK);
  mf_table_group(t, 1, 2, "activations kept");
  for (const char *c : {"", "a", "b"}) mf_table_cell(t, "%s", c);
  mf_table_cell(t, "x"), mf_table_cell(t, "1"), mf_table_cell(t, "22");
  mf_table_cell(t, "embed/head");
  EXPECT_EQ(PrintTable(t, ""),
            "            activations kept\n"
            "            a              b\n"
            "x           1             22\n"
            "embed/head\n");
  mf_table_free(t);

  EXPECT_EQ(mf_table_create("lx", &t), MF_ERR_INVALID_ARG);
  EXPECT_EQ(t, nullptr);
  EXPECT_EQ(mf_table_create("", &t), MF_ERR_INVALID_ARG);
  mf_table_free(nullptr);
}

}  // namespace
