// planner/hwprofile: the bundled profiles load; save -> load is exact; every
// kind of malformed file is MF_ERR_CONFIG naming file:line:column and the key;
// the cost functions interpolate, clamp and stay monotone as specified.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "planner/hwprofile.h"
#include "src/core/core.h"

namespace {

std::string TmpPath(const std::string &name) {
  const char *dir = getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

std::string WriteFile(const std::string &name, const std::string &text) {
  std::string path = TmpPath(name);
  std::ofstream f(path, std::ios::binary);
  f << text;
  return path;
}

std::string ReadFile(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string Bundled(const std::string &name) {
  const char *srcdir = getenv("TEST_SRCDIR"), *ws = getenv("TEST_WORKSPACE");
  if (srcdir && ws) {
    std::string p = std::string(srcdir) + "/" + ws + "/configs/hw/" + name;
    if (FILE *f = fopen(p.c_str(), "r")) {
      fclose(f);
      return p;
    }
  }
  return "configs/hw/" + name;
}

struct Result {
  mf_status st;
  std::string err;
};

Result LoadFile(const std::string &path, mf_hwprofile *out) {
  mf_error_clear();
  mf_status st = mf_hwprofile_load(path.c_str(), out);
  return {st, st == MF_OK ? "" : mf_last_error()};
}

// A valid profile; the malformed cases below are edits of it (line numbers matter).
const char kGood[] =
    "name: test machine\n"                              // 1
    "source: made up for a test\n"                      // 2
    "device:\n"                                         // 3
    "  memory: 80GiB\n"                                 // 4
    "  reserve: 2GiB\n"                                 // 5
    "  copies_overlap_compute: true\n"                  // 6
    "links:\n"                                          // 7
    "  h2d: {bandwidth: 25GB, latency_us: 10}\n"        // 8
    "  d2h: {bandwidth: 20GB}\n"                        // 9
    "compute:\n"                                        // 10
    "  gemm:\n"                                         // 11
    "    - {m: 256, n: 256, k: 256, flops: 5e13}\n"     // 12
    "    - {m: 4096, n: 4096, k: 4096, flops: 7e14}\n"  // 13
    "  attention:\n"                                    // 14
    "    - {s: 512, d: 64, flops: 5e13}\n"              // 15
    "  elementwise_bandwidth: 2.0TB\n"                  // 16
    "  launch_us: 5\n"                                  // 17
    "host:\n"                                           // 18
    "  memory: 128GiB\n"                                // 19
    "  adamw_params_per_s: 1.2e9\n"                     // 20
    "  memory_bandwidth: 40GB\n"                        // 21
    "nvme: {bandwidth: 3GB}\n";                         // 22

std::string Edit(const std::string &from, const std::string &to) {
  std::string s = kGood;
  size_t at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) s.replace(at, from.size(), to);
  return s;
}

// ------------------------------------------------------------ bundled

TEST(HwProfile, GoodLoadsWithEveryValue) {
  mf_hwprofile p;
  Result r = LoadFile(WriteFile("good.yaml", kGood), &p);
  ASSERT_EQ(r.st, MF_OK) << r.err;
  EXPECT_STREQ(p.name, "test machine");
  EXPECT_EQ(p.device_memory, 80ull << 30);
  EXPECT_EQ(p.device_reserve, 2ull << 30);
  EXPECT_EQ(p.copies_overlap_compute, 1);
  EXPECT_EQ(p.h2d_bandwidth, 25e9);
  EXPECT_EQ(p.h2d_latency_s, 10 / 1e6);
  EXPECT_EQ(p.d2h_bandwidth, 20e9);
  EXPECT_EQ(p.d2h_latency_s, 0);  // optional: no latency
  ASSERT_EQ(p.n_gemm, 2);
  EXPECT_EQ(p.gemm[1].m, 4096);
  EXPECT_EQ(p.gemm[1].flops, 7e14);
  ASSERT_EQ(p.n_attn, 1);
  EXPECT_EQ(p.attn[0].d, 64);
  EXPECT_EQ(p.elementwise_bandwidth, 2e12);
  EXPECT_EQ(p.launch_s, 5 / 1e6);
  EXPECT_EQ(p.host_memory, 128ull << 30);
  EXPECT_EQ(p.host_adamw_params_per_s, 1.2e9);
  EXPECT_EQ(p.host_memory_bandwidth, 40e9);
  EXPECT_EQ(p.nvme_bandwidth, 3e9);
  EXPECT_EQ(mf_hwprofile_validate(&p), MF_OK);
}

TEST(HwProfile, OptionalKeysDefault) {
  std::string s = Edit("  reserve: 2GiB\n", "");
  s = s.substr(0, s.find("nvme:"));
  s.replace(s.find("  launch_us: 5\n"), 15, "");
  mf_hwprofile p;
  ASSERT_EQ(mf_hwprofile_parse(s.data(), s.size(), "opt.yaml", &p), MF_OK) << mf_last_error();
  EXPECT_EQ(p.device_reserve, 0u);
  EXPECT_EQ(p.launch_s, 0);
  EXPECT_EQ(p.nvme_bandwidth, 0);
  EXPECT_EQ(p.network_bandwidth, 0);
  EXPECT_EQ(p.nvlink_bandwidth, 0);
}

TEST(HwProfile, NetworkBandwidthBetweenMachines) {
  const std::string s = std::string(kGood) + "network: {bandwidth: 25GB}\n";
  mf_hwprofile p;
  ASSERT_EQ(mf_hwprofile_parse(s.data(), s.size(), "net.yaml", &p), MF_OK) << mf_last_error();
  EXPECT_EQ(p.network_bandwidth, 25e9);
  const std::string bad = std::string(kGood) + "network: {bandwith: 25GB}\n";
  EXPECT_EQ(mf_hwprofile_parse(bad.data(), bad.size(), "net.yaml", &p), MF_ERR_CONFIG);
  EXPECT_NE(std::string(mf_last_error()).find("bandwith"), std::string::npos) << mf_last_error();
}

// The links between a machine's GPUs: what expert parallelism's exchanges move
// at; without them, a GPU's slower host link, or the cpu backend's memory.
TEST(HwProfile, NvlinkBandwidthBetweenGpus) {
  const std::string s = std::string(kGood) + "nvlink: {bandwidth: 450GB}\n";
  mf_hwprofile p;
  ASSERT_EQ(mf_hwprofile_parse(s.data(), s.size(), "nvlink.yaml", &p), MF_OK) << mf_last_error();
  EXPECT_EQ(p.nvlink_bandwidth, 450e9);
  EXPECT_EQ(mf_hw_link_bandwidth(&p), 450e9);
  p.nvlink_bandwidth = 0;
  p.copies_overlap_compute = 1;
  p.h2d_bandwidth = 20e9, p.d2h_bandwidth = 10e9;
  EXPECT_EQ(mf_hw_link_bandwidth(&p), 10e9);
  p.copies_overlap_compute = 0;
  EXPECT_EQ(mf_hw_link_bandwidth(&p), p.host_memory_bandwidth);
  const std::string bad = std::string(kGood) + "nvlink: {bandwidth: -1GB}\n";
  EXPECT_EQ(mf_hwprofile_parse(bad.data(), bad.size(), "nvlink.yaml", &p), MF_ERR_CONFIG);
  EXPECT_NE(std::string(mf_last_error()).find("nvlink.bandwidth"), std::string::npos) << mf_last_error();
}

// Decimal units and microseconds are read as one decimal number, rounded once:
// "2.3GB" is exactly the double nearest 2.3e9, "12.5" us the one nearest 12.5e-6.
TEST(HwProfile, DecimalUnitsAreExact) {
  for (int i = 1; i < 1000; i++) {
    char bw[32], us[32], want_bw[32], want_us[32];
    snprintf(bw, sizeof bw, "%d.%dGB", i / 10, i % 10);
    snprintf(want_bw, sizeof want_bw, "%d.%de9", i / 10, i % 10);
    snprintf(us, sizeof us, "%d.%02d", i / 100, i % 100);
    snprintf(want_us, sizeof want_us, "%d.%02de-6", i / 100, i % 100);
    std::string s = Edit("h2d: {bandwidth: 25GB, latency_us: 10}",
                         std::string("h2d: {bandwidth: ") + bw + ", latency_us: " + us + "}");
    mf_hwprofile p;
    ASSERT_EQ(mf_hwprofile_parse(s.data(), s.size(), "dec.yaml", &p), MF_OK) << bw << " " << mf_last_error();
    ASSERT_EQ(p.h2d_bandwidth, strtod(want_bw, nullptr)) << bw;
    ASSERT_EQ(p.h2d_latency_s, strtod(want_us, nullptr)) << us;
  }
  for (const char *bad : {"0x10", "1_000GB", "inf", "1e", "GB", "2.5 G B"}) {
    std::string s = Edit("bandwidth: 25GB", std::string("bandwidth: ") + bad);
    mf_hwprofile p;
    EXPECT_EQ(mf_hwprofile_parse(s.data(), s.size(), "dec.yaml", &p), MF_ERR_CONFIG) << bad;
  }
  std::string s = Edit("bandwidth: 25GB", "bandwidth: 1.5GiB");
  mf_hwprofile p;
  ASSERT_EQ(mf_hwprofile_parse(s.data(), s.size(), "bin.yaml", &p), MF_OK);
  EXPECT_EQ(p.h2d_bandwidth, 1.5 * 1073741824.0);
}

TEST(HwProfile, BundledProfilesLoad) {
  struct {
    const char *file;
    uint64_t memory;
    int overlap;
    double gemm_peak;  // the largest table rate
  } cases[] = {
      {"h100-pcie.yaml", (uint64_t)(79.5 * 1073741824.0), 1, 5.29e14},
      {"h200.yaml", 140ull << 30, 1, 6.92e14},
      {"cpu-2core.yaml", 0, 0, 0},
  };
  for (const auto &c : cases) {
    SCOPED_TRACE(c.file);
    mf_hwprofile p;
    Result r = LoadFile(Bundled(c.file), &p);
    ASSERT_EQ(r.st, MF_OK) << r.err;
    EXPECT_GT(strlen(p.source), 100u);  // says where the figures come from
    EXPECT_EQ(p.copies_overlap_compute, c.overlap);
    EXPECT_GE(p.n_gemm, 3);
    EXPECT_GE(p.n_attn, 3);
    EXPECT_LT(p.device_reserve, p.device_memory);
    if (c.memory) {
      EXPECT_EQ(p.device_memory, c.memory);
      EXPECT_NE(strstr(p.source, "ESTIMATE"), nullptr);  // not measured: says so
      EXPECT_EQ(p.h2d_bandwidth, 50e9);
      double peak = 0;
      for (int i = 0; i < p.n_gemm; i++) peak = std::max(peak, p.gemm[i].flops);
      EXPECT_EQ(peak, c.gemm_peak);
    } else {
      EXPECT_NE(strstr(p.source, "Measured on this machine by `moefit profile"), nullptr);
      EXPECT_EQ(p.device_memory * 2 / (1ull << 30), p.host_memory / (1ull << 30));  // half of host, roughly
    }
  }
}

// ------------------------------------------------------------ round trip

void ExpectRoundTrip(const mf_hwprofile &p, const std::string &name) {
  std::string path = TmpPath(name);
  ASSERT_EQ(mf_hwprofile_save(&p, path.c_str()), MF_OK) << mf_last_error();
  mf_hwprofile back;
  Result r = LoadFile(path, &back);
  ASSERT_EQ(r.st, MF_OK) << r.err << "\n" << ReadFile(path);
  EXPECT_TRUE(mf_hwprofile_equal(&p, &back)) << ReadFile(path);
  // Saving what was loaded writes the same text.
  std::string again = TmpPath(name + ".again");
  ASSERT_EQ(mf_hwprofile_save(&back, again.c_str()), MF_OK);
  EXPECT_EQ(ReadFile(path), ReadFile(again));
}

TEST(HwProfile, SaveLoadRoundTripBundled) {
  for (const char *f : {"h100-pcie.yaml", "h100-sxm.yaml", "h200.yaml", "cpu-2core.yaml"}) {
    SCOPED_TRACE(f);
    mf_hwprofile p;
    Result r = LoadFile(Bundled(f), &p);
    ASSERT_EQ(r.st, MF_OK) << r.err;
    ExpectRoundTrip(p, std::string("rt-") + f);
  }
}

mf_hwprofile Awkward() {
  mf_hwprofile p;
  memset(&p, 0, sizeof p);
  snprintf(p.name, sizeof p.name,
           "quotes \" and \\ and\nnewline, tab\t, caf\xc3\xa9, \xe2\x80\xa8 LS, \xc2\x85 NEL");
  snprintf(p.source, sizeof p.source, "%s",
           "# not a comment: 'single' \"double\" {flow} [list] &anchor *alias");
  p.device_memory = 12345678901ull;  // not a whole unit
  p.device_reserve = 0;
  p.copies_overlap_compute = 0;
  p.h2d_bandwidth = 12345.678;  // a fraction of a byte per second
  p.h2d_latency_s = 1.234567e-6;
  p.d2h_bandwidth = 3e9;
  p.d2h_latency_s = 0.1 / 3;
  p.n_gemm = MF_HW_MAX_POINTS;
  for (int i = 0; i < p.n_gemm; i++) p.gemm[i] = {1.0 + i, 7.0 + i / 3.0, 1e3 + i, 1e9 * (1 + 0.01 * i)};
  p.n_attn = 1;
  p.attn[0] = {1.5, 2.25, 3.0e-3};
  p.elementwise_bandwidth = 1.0 / 3.0;
  p.launch_s = 2.0 / 3.0 * 1e-6;
  p.host_memory = 1;
  p.host_adamw_params_per_s = 0.1;
  p.host_memory_bandwidth = 18446744073709551616.0 * 4;  // beyond uint64
  p.nvme_bandwidth = 2.5e9;
  p.network_bandwidth = 1.0 / 7.0 * 1e10;
  p.nvlink_bandwidth = 3.0 / 7.0 * 1e11;
  p.n_kernels = 3;
  p.kernels[0] = {"swiglu_fwd", {262144}, 1, 3145728, 2.3e-3};
  p.kernels[1] = {"linear_bwd_data", {1024, 32, 64, 1}, 4, 401408, 1.0 / 7.0 * 1e-3};
  p.kernels[2] = {"zero", {}, 0, 0.5, 1e-9};  // no sizes; any byte count
  return p;
}

TEST(HwProfile, SaveLoadRoundTripAwkwardValues) {
  mf_hwprofile p = Awkward();
  ASSERT_EQ(mf_hwprofile_validate(&p), MF_OK) << mf_last_error();
  ExpectRoundTrip(p, "awkward.yaml");
}

TEST(HwProfile, SaveLoadRoundTripRandomValues) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> mant(1.0, 10.0);
  std::uniform_int_distribution<int> ex(-9, 15);
  auto rnd = [&] { return mant(rng) * std::pow(10.0, ex(rng)); };
  for (int it = 0; it < 100; it++) {
    mf_hwprofile p = Awkward();
    p.h2d_bandwidth = rnd(), p.d2h_bandwidth = rnd();
    p.h2d_latency_s = rnd() * 1e-9, p.d2h_latency_s = rnd() * 1e-12;
    p.launch_s = rnd() * 1e-9;
    p.elementwise_bandwidth = rnd(), p.host_memory_bandwidth = rnd(), p.nvme_bandwidth = rnd();
    p.network_bandwidth = rnd(), p.nvlink_bandwidth = rnd();
    p.host_adamw_params_per_s = rnd();
    p.device_memory = rng() >> 1, p.device_reserve = p.device_memory >> 3, p.host_memory = rng() | 1;
    p.n_gemm = 1;
    p.gemm[0] = {rnd(), rnd(), rnd(), rnd()};
    p.attn[0] = {rnd(), rnd(), rnd()};
    std::string path = TmpPath("random.yaml");
    ASSERT_EQ(mf_hwprofile_save(&p, path.c_str()), MF_OK) << mf_last_error();
    mf_hwprofile back;
    Result r = LoadFile(path, &back);
    ASSERT_EQ(r.st, MF_OK) << r.err;
    ASSERT_TRUE(mf_hwprofile_equal(&p, &back)) << it << "\n" << ReadFile(path);
  }
}

TEST(HwProfile, SaveRefusesWhatWouldNotLoad) {
  std::string path = TmpPath("refused.yaml");
  remove(path.c_str());
  mf_hwprofile p = Awkward();
  p.h2d_bandwidth = 0;
  EXPECT_EQ(mf_hwprofile_save(&p, path.c_str()), MF_ERR_INVALID_ARG);
  EXPECT_NE(std::string(mf_last_error()).find("links.h2d.bandwidth"), std::string::npos) << mf_last_error();
  p = Awkward();
  p.device_reserve = p.device_memory;
  EXPECT_EQ(mf_hwprofile_save(&p, path.c_str()), MF_ERR_INVALID_ARG);
  p = Awkward();
  p.source[0] = 0;
  EXPECT_EQ(mf_hwprofile_save(&p, path.c_str()), MF_ERR_INVALID_ARG);
  p = Awkward();
  p.name[0] = '\xff';  // not UTF-8
  EXPECT_EQ(mf_hwprofile_save(&p, path.c_str()), MF_ERR_INVALID_ARG);
  p = Awkward();
  p.gemm[5].flops = 1e15;  // a bigger GEMM much faster than a smaller one
  EXPECT_EQ(mf_hwprofile_save(&p, path.c_str()), MF_ERR_INVALID_ARG);
  EXPECT_EQ(fopen(path.c_str(), "r"), nullptr);
}

// ------------------------------------------------------------ malformed

struct Bad {
  std::string text;
  std::string want;  // after "<path>:"
};

TEST(HwProfile, MalformedFilesNamePlaceAndKey) {
  std::string big_table = "  gemm:\n";
  for (int i = 0; i < MF_HW_MAX_POINTS + 1; i++) big_table += "    - {m: 1, n: 1, k: 1, flops: 1}\n";
  std::string long_name = "name: " + std::string(MF_HW_NAME_MAX, 'x') + "\n";
  std::string long_source = "source: " + std::string(MF_HW_SOURCE_MAX, 'y') + "\n";
  const std::vector<Bad> cases = {
      {Edit("  memory: 80GiB", "  memroy: 80GiB"),
       "4:3: device.memroy: unknown key 'memroy' (keys in device: "},
      {Edit("nvme:", "nvmee:"), "22:1: nvmee: unknown key"},
      {Edit("  h2d: {bandwidth: 25GB,", "  h2d: {bandwith: 25GB,"), "8:9: links.h2d.bandwith: unknown key"},
      {Edit("  memory: 80GiB", "  memory: [80GiB]"), "4:11: device.memory: expected a size"},
      {Edit("  memory: 80GiB", "  memory: 80GX"),
       "4:11: device.memory: expected a size (usable device memory)"},
      {Edit("  memory: 80GiB", "  memory: \"80GiB\""), "4:11: device.memory: expected a size"},
      {Edit("  memory: 80GiB", "  memory: 0"), "4:11: device.memory: must be > 0"},
      {Edit("  memory: 80GiB\n", ""), "3:1: device.memory: missing (required: usable device memory"},
      {Edit("  copies_overlap_compute: true", "  copies_overlap_compute: maybe"),
       "6:27: device.copies_overlap_compute: expected true or false"},
      {Edit("  reserve: 2GiB", "  reserve: 80GiB"), "5:12: device.reserve: must be less than device.memory"},
      {Edit("bandwidth: 25GB", "bandwidth: -25GB"), "8:20: links.h2d.bandwidth: must be > 0"},
      {Edit("bandwidth: 25GB", "bandwidth: 0GB"), "8:20: links.h2d.bandwidth: must be > 0"},
      {Edit("bandwidth: 25GB", "bandwidth: 25 GBps"), "8:20: links.h2d.bandwidth: expected a bandwidth"},
      {Edit("latency_us: 10", "latency_us: -1"), "8:38: links.h2d.latency_us: must be >= 0"},
      {Edit("  d2h: {bandwidth: 20GB}\n", ""), "7:1: links.d2h: missing"},
      {Edit("  d2h: {bandwidth: 20GB}", "  d2h: 20GB"), "9:8: links.d2h: expected a map"},
      {Edit("flops: 7e14", "flops: fast"),
       "13:42: compute.gemm[1].flops: expected a number (FLOP/s), got 'fast'"},
      {Edit("flops: 7e14", "flops: \"7e14\""), "13:42: compute.gemm[1].flops: expected a number"},
      {Edit("flops: 7e14", "flops: nan"), "13:42: compute.gemm[1].flops: expected a number"},
      {Edit("flops: 7e14", "flops: 0"), "13:42: compute.gemm[1].flops: must be > 0"},
      {Edit("{m: 4096, n: 4096, ", "{m: 4096, "), "13:7: compute.gemm[1].n: missing"},
      {Edit("flops: 7e14", "flops: 7e20"), "13:7: compute.gemm[1]: takes"},
      {Edit("  gemm:\n    - {m: 256, n: 256, k: 256, flops: 5e13}\n    - {m: 4096, n: 4096, k: 4096, flops: "
            "7e14}\n",
            "  gemm: []\n"),
       "11:9: compute.gemm: needs at least one point"},
      {Edit("  gemm:\n    - {m: 256, n: 256, k: 256, flops: 5e13}\n    - {m: 4096, n: 4096, k: 4096, flops: "
            "7e14}\n",
            big_table),
       "12:5: compute.gemm: has 65 points; at most 64"},
      {Edit("  attention:\n    - {s: 512, d: 64, flops: 5e13}\n", "  attention: {s: 512}\n"),
       "14:14: compute.attention: expected a list of points, got a map"},
      {Edit("  elementwise_bandwidth: 2.0TB\n", ""), "10:1: compute.elementwise_bandwidth: missing"},
      {Edit("  adamw_params_per_s: 1.2e9", "  adamw_params_per_s: -1.2e9"),
       "20:23: host.adamw_params_per_s: must be > 0"},
      {Edit("host:\n  memory: 128GiB\n  adamw_params_per_s: 1.2e9\n  memory_bandwidth: 40GB\n", "host: {}\n"),
       "18:1: host.memory: missing"},
      {Edit("  memory_bandwidth: 40GB", "  memory_bandwidth: 40GB\n  memory_bandwidth: 41GB"),
       "22:3: host.memory_bandwidth: duplicate key"},
      {Edit("nvme: {bandwidth: 3GB}", "nvme: {}"), "22:1: nvme.bandwidth: missing"},
      {Edit("name: test machine", "name: ~"), "1:7: name: expected text, got null"},
      {Edit("name: test machine", "name: {a: 1}"), "1:7: name: expected text, got a map"},
      {Edit("name: test machine", "name: \"\""), "1:7: name: must not be empty"},
      {Edit("name: test machine\n", long_name), "1:7: name: is 128 bytes long; at most 127"},
      {Edit("source: made up for a test\n", long_source), "2:9: source: is 2048 bytes long; at most 2047"},
      {Edit("source: made up for a test\n", ""), "1:1: source: missing"},
      {Edit("device:\n", "device:\n  memory: 1GiB\n  :\n"), "YAML syntax error"},
      {Edit("  h2d: {bandwidth: 25GB, latency_us: 10}", "  h2d: {bandwidth: 25GB, latency_us: 10"),
       "9:6: YAML syntax error: did not find expected ',' or '}'"},
      {Edit("  memory: 80GiB", "\tmemory: 80GiB"),
       "4:1: YAML syntax error: tabs are not allowed for indentation in YAML"},
      {Edit("test machine", "test \xff machine"), "1:12: YAML syntax error: invalid leading UTF-8 octet"},
      {std::string(kGood) + "---\nname: two\n", "24:1: a second YAML document"},
      {"", "1:1: empty file"},
      {"# only a comment\n\n", "1:1: empty file"},
      {"- a\n- b\n", "1:1: expected a map (a hardware profile)"},
      {"just text\n", "1:1: expected a map (a hardware profile)"},
  };
  for (size_t i = 0; i < cases.size(); i++) {
    const Bad &c = cases[i];
    std::string path = WriteFile("bad" + std::to_string(i) + ".yaml", c.text);
    SCOPED_TRACE(c.want);
    mf_hwprofile p;
    memset(&p, 0x5a, sizeof p);
    Result r = LoadFile(path, &p);
    EXPECT_EQ(r.st, MF_ERR_CONFIG) << r.err;
    std::string want = c.want.find("YAML syntax error") == 0 ? path + ":" : path + ":" + c.want;
    EXPECT_EQ(r.err.compare(0, want.size(), want), 0) << "got:  " << r.err << "\nwant: " << want;
    if (c.want.find("YAML syntax error") == 0) {
      EXPECT_NE(r.err.find(c.want), std::string::npos) << r.err;
    }
    EXPECT_EQ(p.name[0], 0x5a) << "*out written on failure";
  }
}

TEST(HwProfile, UnreadableFileIsIo) {
  mf_hwprofile p;
  Result r = LoadFile(TmpPath("no-such-profile.yaml"), &p);
  EXPECT_EQ(r.st, MF_ERR_IO);
  EXPECT_NE(r.err.find("no-such-profile.yaml"), std::string::npos) << r.err;
  r = LoadFile(TmpPath(""), &p);  // a directory
  EXPECT_EQ(r.st, MF_ERR_IO) << r.err;
}

// ------------------------------------------------------------ cost model

mf_hwprofile Simple() {
  mf_hwprofile p;
  memset(&p, 0, sizeof p);
  snprintf(p.name, sizeof p.name, "simple");
  snprintf(p.source, sizeof p.source, "test");
  p.device_memory = 1ull << 30;
  p.h2d_bandwidth = 25e9, p.h2d_latency_s = 10e-6;
  p.d2h_bandwidth = 20e9, p.d2h_latency_s = 7e-6;
  // works 2e6 and 2e9 FLOPs
  p.gemm[0] = {100, 100, 100, 1e12};
  p.gemm[1] = {1000, 1000, 1000, 1e14};
  p.n_gemm = 2;
  p.attn[0] = {256, 64, 1e13};    // key 16384
  p.attn[1] = {4096, 128, 4e14};  // key 524288
  p.n_attn = 2;
  p.elementwise_bandwidth = 2e12;
  p.launch_s = 5e-6;
  p.host_memory = 1ull << 30;
  p.host_adamw_params_per_s = 1.2e9;
  p.host_memory_bandwidth = 40e9;
  return p;
}

double Rel(double a, double b) {
  return std::fabs(a - b) / std::fabs(b);
}

TEST(HwCost, CopyIsLatencyPlusBytesOverBandwidth) {
  mf_hwprofile p = Simple();
  for (double bytes : {1.0, 4096.0, 1e6, 3.3e9}) {
    EXPECT_EQ(mf_hw_copy_seconds(&p, 1, bytes), 10e-6 + bytes / 25e9);
    EXPECT_EQ(mf_hw_copy_seconds(&p, 0, bytes), 7e-6 + bytes / 20e9);
  }
  EXPECT_EQ(mf_hw_copy_seconds(&p, 1, 0), 0);  // no copy issued
  EXPECT_EQ(mf_hw_elementwise_seconds(&p, 1e9), 1e9 / 2e12 + 5e-6);
  EXPECT_EQ(mf_hw_elementwise_seconds(&p, 0), 0);
  EXPECT_EQ(mf_hw_adamw_seconds(&p, 2.4e9), 2.4e9 / 1.2e9);
  EXPECT_EQ(mf_hw_adamw_seconds(&p, 0), 0);
}

TEST(HwCost, GemmInterpolatesLogLogBetweenPoints) {
  mf_hwprofile p = Simple();
  // at the points: exact
  EXPECT_LT(Rel(mf_hw_gemm_rate(&p, 100, 100, 100), 1e12), 1e-15);
  EXPECT_LT(Rel(mf_hw_gemm_rate(&p, 1000, 1000, 1000), 1e14), 1e-15);
  // a third of the way in log(work): a third of the way in log(rate)
  for (double f : {1.0 / 3, 0.5, 0.9}) {
    double w = 2e6 * std::pow(1e3, f), want = 1e12 * std::pow(1e2, f);
    EXPECT_LT(Rel(mf_hw_gemm_rate(&p, w / 2, 1, 1), want), 1e-12) << f;
    EXPECT_LT(Rel(mf_hw_gemm_seconds(&p, w / 2, 1, 1), w / want + 5e-6), 1e-12) << f;
  }
  // the shape does not matter, only 2mnk
  EXPECT_EQ(mf_hw_gemm_rate(&p, 500, 20, 100), mf_hw_gemm_rate(&p, 100, 100, 100));
  // table order does not matter
  mf_hwprofile q = p;
  std::swap(q.gemm[0], q.gemm[1]);
  EXPECT_EQ(mf_hw_gemm_rate(&q, 300, 300, 300), mf_hw_gemm_rate(&p, 300, 300, 300));
}

TEST(HwCost, GemmClampsOutsideTheTable) {
  mf_hwprofile p = Simple();
  EXPECT_EQ(mf_hw_gemm_rate(&p, 1, 1, 1), 1e12);
  EXPECT_EQ(mf_hw_gemm_rate(&p, 10, 10, 10), 1e12);
  EXPECT_EQ(mf_hw_gemm_rate(&p, 1e4, 1e4, 1e4), 1e14);
  EXPECT_EQ(mf_hw_gemm_seconds(&p, 10, 10, 10), 2e3 / 1e12 + 5e-6);
  EXPECT_EQ(mf_hw_gemm_seconds(&p, 1e4, 1e4, 1e4), 2e12 / 1e14 + 5e-6);
  EXPECT_EQ(mf_hw_gemm_seconds(&p, 0, 10, 10), 0);  // an expert with no tokens: no kernel
}

TEST(HwCost, SinglePointIsAConstantRate) {
  mf_hwprofile p = Simple();
  p.n_gemm = 1;
  p.n_attn = 1;
  for (double m : {1.0, 100.0, 1e5}) {
    EXPECT_EQ(mf_hw_gemm_rate(&p, m, 100, 100), 1e12);
    EXPECT_EQ(mf_hw_attention_rate(&p, m, 64), 1e13);
  }
}

TEST(HwCost, EqualKeysAreAveraged) {
  mf_hwprofile p = Simple();
  p.gemm[2] = {200, 50, 100, 3e12};  // same work as gemm[0]
  p.n_gemm = 3;
  EXPECT_EQ(mf_hw_gemm_rate(&p, 100, 100, 100), 2e12);
  EXPECT_EQ(mf_hw_gemm_rate(&p, 1, 1, 1), 2e12);
}

TEST(HwCost, AttentionUsesSTimesD) {
  mf_hwprofile p = Simple();
  EXPECT_EQ(mf_hw_attention_rate(&p, 256, 64), 1e13);
  EXPECT_EQ(mf_hw_attention_rate(&p, 128, 128), 1e13);   // same s*d
  EXPECT_EQ(mf_hw_attention_rate(&p, 64, 64), 1e13);     // clamped below
  EXPECT_EQ(mf_hw_attention_rate(&p, 8192, 128), 4e14);  // clamped above
  double key = std::sqrt(16384.0 * 524288.0);
  EXPECT_LT(Rel(mf_hw_attention_rate(&p, key / 64, 64), std::sqrt(1e13 * 4e14)), 1e-12);
  double f = mf_hw_attention_flops(2, 256, 8, 64, 0);
  EXPECT_EQ(f, 2.0 * 2 * 8 * 64 * 256 * 257);  // as src/model/program_attention.c counts
  EXPECT_EQ(mf_hw_attention_flops(2, 256, 8, 64, 1), 2.5 * f);
  EXPECT_EQ(mf_hw_attention_seconds(&p, f, 256, 64), f / 1e13 + 5e-6);
  EXPECT_EQ(mf_hw_attention_seconds(&p, 0, 256, 64), 0);
}

TEST(HwCost, MonotoneInSize) {
  for (const char *file : {"h100-pcie.yaml", "h100-sxm.yaml", "h200.yaml", "cpu-2core.yaml"}) {
    SCOPED_TRACE(file);
    mf_hwprofile p;
    Result r = LoadFile(Bundled(file), &p);
    ASSERT_EQ(r.st, MF_OK) << r.err;
    double prev_g = 0, prev_a = 0, prev_e = 0, prev_c = 0, prev_o = 0;
    for (double x = 1; x < 1e16; x *= 1.07) {
      double g = mf_hw_gemm_seconds(&p, x, 1, 1);
      double a = mf_hw_attention_seconds(&p, x, 1024, 128);
      double e = mf_hw_elementwise_seconds(&p, x), c = mf_hw_copy_seconds(&p, 1, x),
             o = mf_hw_adamw_seconds(&p, x);
      ASSERT_GE(g, prev_g * (1 - 1e-12)) << x;
      ASSERT_GT(a, prev_a) << x;
      ASSERT_GT(e, prev_e) << x;
      ASSERT_GT(c, prev_c) << x;
      ASSERT_GT(o, prev_o) << x;
      prev_g = g, prev_a = a, prev_e = e, prev_c = c, prev_o = o;
    }
    // square GEMMs too, through every table point
    double prev = 0;
    for (double s = 16; s < 20000; s *= 1.03) {
      double t = mf_hw_gemm_seconds(&p, s, s, s);
      ASSERT_GE(t, prev * (1 - 1e-12)) << s;
      prev = t;
    }
  }
}

// ------------------------------------------------------- timed kernels

const char kKernels[] =
    "  kernels:\n"                                                                        // 18
    "    - {kernel: swiglu_fwd, sizes: [262144], bytes: 3145728, seconds: 0.0023}\n"       // 19
    "    - {kernel: zero, sizes: [], bytes: 4096, seconds: 1.5e-6}\n"                      // 20
    "    - {kernel: linear_fwd, sizes: [1024, 64, 64, 0], bytes: 540672, seconds: 2.8e-4}\n";  // 21

std::string WithKernels(const std::string &kernels = kKernels) {
  return Edit("  launch_us: 5\n", "  launch_us: 5\n" + kernels);
}

TEST(HwKernels, LoadAndPriceTheirKeyOnly) {
  std::string text = WithKernels();
  mf_hwprofile p;
  ASSERT_EQ(mf_hwprofile_parse(text.data(), text.size(), "k.yaml", &p), MF_OK) << mf_last_error();
  ASSERT_EQ(p.n_kernels, 3);
  EXPECT_STREQ(p.kernels[0].kernel, "swiglu_fwd");
  EXPECT_EQ(p.kernels[0].n_sizes, 1);
  EXPECT_EQ(p.kernels[0].sizes[0], 262144);
  EXPECT_EQ(p.kernels[0].bytes, 3145728);
  EXPECT_EQ(p.kernels[0].seconds, 0.0023);
  EXPECT_EQ(p.kernels[1].n_sizes, 0);
  EXPECT_EQ(p.kernels[2].n_sizes, 3) << "a trailing 0 is no size";
  const int64_t sw[8] = {262144, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(mf_hw_kernel_seconds(&p, "swiglu_fwd", sw, 8, 3145728), 0.0023);
  EXPECT_TRUE(std::isnan(mf_hw_kernel_seconds(&p, "swiglu_fwd", sw, 8, 3145729))) << "other bytes";
  EXPECT_TRUE(std::isnan(mf_hw_kernel_seconds(&p, "swiglu_bwd", sw, 8, 3145728))) << "other kernel";
  const int64_t sw2[2] = {262144, 1};
  EXPECT_TRUE(std::isnan(mf_hw_kernel_seconds(&p, "swiglu_fwd", sw2, 2, 3145728))) << "other sizes";
  EXPECT_EQ(mf_hw_kernel_seconds(&p, "zero", nullptr, 0, 4096), 1.5e-6);
  const int64_t lf[4] = {1024, 64, 64, 0};
  EXPECT_EQ(mf_hw_kernel_seconds(&p, "linear_fwd", lf, 4, 540672), 2.8e-4);
  EXPECT_EQ(mf_hw_kernel_seconds(&p, "linear_fwd", lf, 3, 540672), 2.8e-4);
  EXPECT_EQ(mf_hwprofile_validate(&p), MF_OK);
  // Without the section: none, and every lookup is NaN.
  mf_hwprofile q;
  ASSERT_EQ(mf_hwprofile_parse(kGood, strlen(kGood), "good.yaml", &q), MF_OK) << mf_last_error();
  EXPECT_EQ(q.n_kernels, 0);
  EXPECT_TRUE(std::isnan(mf_hw_kernel_seconds(&q, "swiglu_fwd", sw, 8, 3145728)));
}

TEST(HwKernels, MalformedNamePlaceAndKey) {
  std::string many = "  kernels:\n";
  for (int i = 0; i < MF_HW_MAX_KERNELS + 1; i++)
    many += "    - {kernel: add, sizes: [" + std::to_string(i + 1) + "], bytes: 1, seconds: 1}\n";
  const std::vector<Bad> cases = {
      {WithKernels("  kernels: {a: 1}\n"), "18:12: compute.kernels: expected a list of timed kernels"},
      {WithKernels("  kernels:\n    - {kernel: Swiglu, sizes: [1], bytes: 1, seconds: 1}\n"),
       "19:16: compute.kernels[0].kernel: expected a kernel name (a-z, 0-9, _), got 'Swiglu'"},
      {WithKernels("  kernels:\n    - {kernel: " + std::string(MF_HW_KERNEL_NAME_MAX, 'a') +
                   ", sizes: [1], bytes: 1, seconds: 1}\n"),
       "19:16: compute.kernels[0].kernel: is 32 bytes long; at most 31"},
      {WithKernels("  kernels:\n    - {kernel: add, sizes: 7, bytes: 1, seconds: 1}\n"),
       "19:28: compute.kernels[0].sizes: expected a list of sizes, got '7'"},
      {WithKernels("  kernels:\n    - {kernel: add, sizes: [1, 2, 3, 4, 5, 6, 7, 8, 9], bytes: 1, seconds: 1}\n"),
       "19:28: compute.kernels[0].sizes: has 9 sizes; at most 8"},
      {WithKernels("  kernels:\n    - {kernel: add, sizes: [1.5], bytes: 1, seconds: 1}\n"),
       "19:29: compute.kernels[0].sizes[0]: expected a whole number, got '1.5'"},
      {WithKernels("  kernels:\n    - {kernel: add, sizes: [-1], bytes: 1, seconds: 1}\n"),
       "19:29: compute.kernels[0].sizes[0]: must be >= 0"},
      {WithKernels("  kernels:\n    - {kernel: add, sizes: [1], bytes: 1, seconds: 0}\n"),
       "19:52: compute.kernels[0].seconds: must be > 0"},
      {WithKernels("  kernels:\n    - {kernel: add, sizes: [1], seconds: 1}\n"),
       "19:7: compute.kernels[0].bytes: missing"},
      {WithKernels("  kernels:\n    - {kernel: add, sizes: [1], bytes: 1, seconds: 1, flops: 2}\n"),
       "19:55: compute.kernels[0].flops: unknown key"},
      {WithKernels("  kernels:\n    - {kernel: add, sizes: [1, 0], bytes: 1, seconds: 1}\n"
                   "    - {kernel: add, sizes: [1], bytes: 1, seconds: 2}\n"),
       "20:7: compute.kernels[1]: repeats the kernel, sizes and bytes of compute.kernels[0]"},
      {WithKernels(many), "19:5: compute.kernels: has 257 points; at most 256"},
  };
  for (size_t i = 0; i < cases.size(); i++) {
    const Bad &c = cases[i];
    std::string path = WriteFile("badk" + std::to_string(i) + ".yaml", c.text);
    SCOPED_TRACE(c.want);
    mf_hwprofile p;
    Result r = LoadFile(path, &p);
    EXPECT_EQ(r.st, MF_ERR_CONFIG) << r.err;
    std::string want = path + ":" + c.want;
    EXPECT_EQ(r.err.compare(0, want.size(), want), 0) << "got:  " << r.err << "\nwant: " << want;
  }
}

TEST(HwKernels, ValidateRefusesBadPoints) {
  mf_hwprofile p = Awkward();
  ASSERT_EQ(mf_hwprofile_validate(&p), MF_OK) << mf_last_error();
  mf_hwprofile q = p;
  q.kernels[1].seconds = 0;
  EXPECT_EQ(mf_hwprofile_validate(&q), MF_ERR_INVALID_ARG);
  q = p;
  q.kernels[1].sizes[3] = 0;  // a trailing 0 counted as a size
  EXPECT_EQ(mf_hwprofile_validate(&q), MF_ERR_INVALID_ARG);
  q = p;
  snprintf(q.kernels[0].kernel, sizeof q.kernels[0].kernel, "bad name");
  EXPECT_EQ(mf_hwprofile_validate(&q), MF_ERR_INVALID_ARG);
  q = p;
  q.kernels[2] = q.kernels[0];  // the same key twice
  EXPECT_EQ(mf_hwprofile_validate(&q), MF_ERR_INVALID_ARG);
  EXPECT_NE(std::string(mf_last_error()).find("compute.kernels[2] repeats"), std::string::npos) << mf_last_error();
  q = p;
  q.kernels[0].seconds = 1.0;  // equality sees every field
  EXPECT_FALSE(mf_hwprofile_equal(&p, &q));
}

}  // namespace
