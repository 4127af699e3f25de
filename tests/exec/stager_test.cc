// Bytes streamed through staging slabs with the executor's slab code
// (src/exec/exec.h "bytes streamed through the slabs", what `moefit bench
// kernels` times): every byte arrives intact both ways, for sizes that are
// and are not a multiple of the slab, with one to several slabs in flight
// and one or more host threads, on the cpu backend's immediate and deferred
// streams (lazy: copies late and host functions early; copies-first the
// other way round), with each slab poisoned once used — so a missing wait
// between slabs that share bytes shows as NaN bytes; bad sizes are refused.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "src/core/core.h"
#include "src/exec/exec.h"

namespace {

struct Case {
  size_t bytes, slab;
  int slabs, threads;
};

void check_round_trip(mf_cpu_streams mode, const Case &c) {
  SCOPED_TRACE(testing::Message() << "streams " << (int)mode << ", " << c.bytes << " bytes in slabs of "
                                  << c.slab << ", " << c.slabs << " in flight, " << c.threads << " threads");
  mf_cpu_backend_opts o = {nullptr, 0, 0, nullptr, mode};
  mf_backend *b = nullptr;
  ASSERT_EQ(mf_backend_cpu_create(&o, &b), MF_OK) << mf_last_error();
  void *dev = nullptr;
  ASSERT_EQ(b->arena_create(b, c.bytes + 64, &dev), MF_OK) << mf_last_error();
  std::vector<uint8_t> src(c.bytes), back(c.bytes + 64, 0xab);
  std::mt19937 rng(7);
  for (auto &v : src) v = (uint8_t)rng();
  const mf_exec_staging_opts so = {c.threads, 1, 0};  // poison each slab once used
  mf_exec_stager *sg = nullptr;
  ASSERT_EQ(mf_exec_stager_create(b, c.bytes, c.slab, c.slabs, &so, &sg), MF_OK) << mf_last_error();
  EXPECT_GE(mf_exec_stager_pinned_bytes(sg), 2 * c.slab);
  for (int rep = 0; rep < 2; rep++) {  // a second move reuses the slabs and their events
    memset(dev, 0xcd, c.bytes + 64);
    const double t0 = mf_time_now();
    ASSERT_EQ(mf_exec_stager_h2d(sg, dev, src.data(), c.bytes), MF_OK) << mf_last_error();
    // The host's part of the move (its fills) is timed, and within the move.
    const double wall = mf_time_now() - t0;
    double host = -1;
    ASSERT_EQ(mf_exec_stager_host_seconds(sg, 1, &host), MF_OK) << mf_last_error();
    EXPECT_GE(host, 0.0);  // (a 1000-byte fill may take less than the clock's step)
    EXPECT_LE(host, wall);
    EXPECT_EQ(memcmp(dev, src.data(), c.bytes), 0) << "upload " << rep;
    EXPECT_EQ(((uint8_t *)dev)[c.bytes], 0xcd) << "the upload wrote past its bytes";
    ASSERT_EQ(mf_exec_stager_d2h(sg, back.data(), dev, c.bytes), MF_OK) << mf_last_error();
    EXPECT_EQ(memcmp(back.data(), src.data(), c.bytes), 0) << "download " << rep;
    EXPECT_EQ(back[c.bytes], 0xab) << "the download wrote past its bytes";
  }
  // A shorter move through the same slabs.
  const size_t part = c.bytes / 3 + 1;
  memset(dev, 0, c.bytes);
  ASSERT_EQ(mf_exec_stager_h2d(sg, dev, src.data() + 1, part), MF_OK) << mf_last_error();
  EXPECT_EQ(memcmp(dev, src.data() + 1, part), 0);
  EXPECT_EQ(((uint8_t *)dev)[part], 0);
  mf_exec_stager_free(sg);
  mf_backend_free(b);
}

TEST(Stager, BytesArriveIntactBothWays) {
  const Case cases[] = {
      {3 * 4108 + 1000, 4108, 2, 1},  // not a multiple of the slab (nor of 4: poison's words)
      {5 * 4096, 4096, 1, 1},         // a multiple; one slab in flight: each waits for the last
      {100003, 8191, 3, 3},           // several host threads per slab
      {1000, 4096, 4, 2},             // less than one slab
      {64 * 1024 + 7, 1024, 8, 1},    // many slabs through a ring of 8
  };
  for (mf_cpu_streams mode : {MF_CPU_STREAMS_IMMEDIATE, MF_CPU_STREAMS_LAZY, MF_CPU_STREAMS_COPIES_FIRST})
    for (const Case &c : cases) check_round_trip(mode, c);
}

TEST(Stager, BadSizesAreRefused) {
  mf_cpu_backend_opts o = {nullptr, 0, 0, nullptr, MF_CPU_STREAMS_IMMEDIATE};
  mf_backend *b = nullptr;
  ASSERT_EQ(mf_backend_cpu_create(&o, &b), MF_OK) << mf_last_error();
  mf_exec_stager *sg = nullptr;
  EXPECT_EQ(mf_exec_stager_create(b, 1000, 0, 2, nullptr, &sg), MF_ERR_INVALID_ARG);
  EXPECT_EQ(mf_exec_stager_create(b, 1000, 100, 0, nullptr, &sg), MF_ERR_INVALID_ARG);
  EXPECT_EQ(mf_exec_stager_create(b, (size_t)1 << 30, 1024, 2, nullptr, &sg), MF_ERR_INVALID_ARG);
  EXPECT_NE(std::string(mf_last_error()).find("slabs"), std::string::npos) << mf_last_error();
  EXPECT_EQ(sg, nullptr);
  ASSERT_EQ(mf_exec_stager_create(b, 1000, 100, 2, nullptr, &sg), MF_OK) << mf_last_error();
  std::vector<uint8_t> h(2000);
  void *dev = nullptr;
  ASSERT_EQ(b->arena_create(b, 2000, &dev), MF_OK);
  EXPECT_EQ(mf_exec_stager_h2d(sg, dev, h.data(), 1001), MF_ERR_INVALID_ARG);
  EXPECT_NE(std::string(mf_last_error()).find("at most 1000"), std::string::npos) << mf_last_error();
  EXPECT_EQ(mf_exec_stager_d2h(sg, h.data(), dev, 1001), MF_ERR_INVALID_ARG);
  mf_exec_stager_free(sg);
  mf_exec_stager_free(nullptr);
  mf_backend_free(b);
}

}  // namespace
