// src/optim: AdamW with bf16 moments and bf16 gradients (mf_adamw_update_bufs).
//
// The bf16 rounding itself against a reference written here from the
// definition (nearest of the two neighbouring bf16 values, exact in double;
// ties to the even one), on hand-picked ties and on random bit patterns. The
// update against its definition in optim.h: widen, the fp32 update, round m
// and v — computed here from the fp32 entry point and from the test's own
// torch formula. Every body at every thread count (1, 2, 3, 7) against the
// scalar body on one thread, for each dtype combination, on random data with
// NaN, Inf, denormals and values on and next to bf16 ties.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tests/optim/special_values.h"
#include "src/core/core.h"
#include "src/optim/optim.h"

namespace {

struct Pool {
  mf_threadpool *p = nullptr;
  explicit Pool(int n) { EXPECT_EQ(mf_threadpool_create(n, &p), MF_OK); }
  ~Pool() { mf_threadpool_free(p); }
};

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

mf_adamw_hparams hp(double lr, double b1, double b2, double eps, double wd) {
  mf_adamw_hparams h;
  h.lr = lr;
  h.beta1 = b1;
  h.beta2 = b2;
  h.eps = eps;
  h.weight_decay = wd;
  return h;
}

// ------------------------------------------------------ the rounding itself

// Round to nearest even from the definition: the two bf16 values around x
// (truncation and the next one away from zero), the distances exact in
// double, a tie to the one with an even last bit. A finite x past the largest
// bf16 by at least half an ulp of it rounds to Inf (IEEE overflow under
// nearest-even); NaN becomes the quiet NaN with x's sign and top payload bits.
uint16_t ref_bf16(float x) {
  const uint32_t u = bits(x);
  if (std::isnan(x)) return (uint16_t)((u >> 16) | 0x0040u);
  if (std::isinf(x)) return (uint16_t)(u >> 16);
  const uint16_t lo = (uint16_t)(u >> 16);  // toward zero
  const uint16_t hi = (uint16_t)(lo + 1);   // away from zero (0x7f80 / 0xff80 is Inf)
  const double xd = std::fabs((double)x);
  const double lo_d = std::fabs((double)from_bits((uint32_t)lo << 16));
  double hi_d;
  if ((hi & 0x7fffu) == 0x7f80u)  // the next value up is Inf: measure against 2^128
    hi_d = std::ldexp(1.0, 128);
  else
    hi_d = std::fabs((double)from_bits((uint32_t)hi << 16));
  const double dlo = xd - lo_d, dhi = hi_d - xd;
  if (dlo < dhi) return lo;
  if (dhi < dlo) return hi;
  return (lo & 1u) ? hi : lo;
}

TEST(Bf16Rounding, HandPickedTies) {
  struct Case {
    uint32_t in;
    uint16_t want;
  } cases[] = {
      {0x3f800000u, 0x3f80},  // 1.0 exact
      {0x3f808000u, 0x3f80},  // 1 + 2^-8: halfway between 0x3f80 and 0x3f81, to even (down)
      {0x3f818000u, 0x3f82},  // halfway between 0x3f81 and 0x3f82, to even (up)
      {0x3f807fffu, 0x3f80},  // just below the tie
      {0x3f808001u, 0x3f81},  // just above the tie
      {0xbf808000u, 0xbf80},  // negative tie, to even
      {0xbf818000u, 0xbf82},
      {0x00008000u, 0x0000},  // denormal tie at zero: to +0
      {0x00018000u, 0x0002},  // denormal tie, to even (up)
      {0x00010000u, 0x0001},  // the smallest bf16 denormal, exact
      {0x80008000u, 0x8000},  // -denormal tie to -0
      {0x007f8000u, 0x0080},  // largest denormals round up into the normals
      {0x7f7f0000u, 0x7f7f},  // the largest bf16
      {0x7f7f7fffu, 0x7f7f},  // below the tie with 2^128
      {0x7f7f8000u, 0x7f80},  // tie between the largest bf16 and 2^128: to even, Inf
      {0x7f7fffffu, 0x7f80},  // FLT_MAX rounds to Inf
      {0xff7fffffu, 0xff80},
      {0x7f800000u, 0x7f80},  // Inf kept
      {0xff800000u, 0xff80},
      {0x7fc00000u, 0x7fc0},  // quiet NaN kept
      {0xffc00000u, 0xffc0},
      {0x7f800001u, 0x7fc0},  // a signalling NaN whose payload is all in the low half stays NaN
      {0x7fbf8000u, 0x7fff},  // NaN with a payload that would carry into the exponent: not rounded
      {0xff810000u, 0xffc1},
  };
  for (const Case &c : cases) {
    const float x = from_bits(c.in);
    EXPECT_EQ(ref_bf16(x), c.want) << std::hex << c.in;
    EXPECT_EQ(mf_fp32_to_bf16(x), c.want) << std::hex << c.in;
  }
}

TEST(Bf16Rounding, MatchesTheDefinitionOnRandomBitsAndWidensExactly) {
  std::mt19937 rng(4242);
  size_t ties = 0;
  for (int k = 0; k < 2000000; k++) {
    uint32_t u = rng();
    if (k % 4 == 1) u = (u & 0xffff0000u) | 0x8000u;                  // a tie
    if (k % 4 == 2) u = (u & 0xffff0000u) | (0x7fffu + (rng() % 3));  // next to one
    const float x = from_bits(u);
    ties += (u & 0xffffu) == 0x8000u;
    const uint16_t got = mf_fp32_to_bf16(x);
    ASSERT_EQ(got, ref_bf16(x)) << std::hex << u;
    // widening is exact: every bf16 value is an fp32 value
    const uint16_t h = (uint16_t)(u >> 16);
    ASSERT_EQ(bits(mf_bf16_to_fp32(h)), (uint32_t)h << 16);
    if (!std::isnan(x)) {
      ASSERT_EQ(mf_fp32_to_bf16(mf_bf16_to_fp32(h)), h);
    }
  }
  EXPECT_GT(ties, 400000u);
}

// ------------------------------------------------- buffers of any dtype

struct Dtypes {
  mf_dtype g, m;
  const char *name;
};
const Dtypes kDtypes[] = {{MF_DTYPE_F32, MF_DTYPE_F32, "g f32, m f32"},
                          {MF_DTYPE_BF16, MF_DTYPE_F32, "g bf16, m f32"},
                          {MF_DTYPE_F32, MF_DTYPE_BF16, "g f32, m bf16"},
                          {MF_DTYPE_BF16, MF_DTYPE_BF16, "g bf16, m bf16"}};

// One update's buffers of n elements, with one element of slack in front so
// that the bodies see buffers off vector alignment. Only the vectors of the
// chosen dtypes are used.
struct Bufs {
  size_t n = 0;
  std::vector<float> p, g32, m32, v32;
  std::vector<uint16_t> g16, m16, v16, out;
  mf_adamw_bufs view(mf_dtype gd, mf_dtype md) {
    mf_adamw_bufs b;
    b.param = p.data() + 1;
    b.grad = gd == MF_DTYPE_BF16 ? (const void *)(g16.data() + 1) : (const void *)(g32.data() + 1);
    b.m = md == MF_DTYPE_BF16 ? (void *)(m16.data() + 1) : (void *)(m32.data() + 1);
    b.v = md == MF_DTYPE_BF16 ? (void *)(v16.data() + 1) : (void *)(v32.data() + 1);
    b.bf16_out = out.data() + 1;
    b.n = n;
    b.grad_dtype = gd;
    b.moment_dtype = md;
    return b;
  }
  // "" when bit-identical, else the first buffer and element that differ
  std::string diff(const Bufs &o) const {
    char msg[160];
    auto first = [&](const auto &a, const auto &b, const char *what) -> bool {
      for (size_t i = 0; i < a.size(); i++)
        if (std::memcmp(&a[i], &b[i], sizeof a[i]) != 0) {
          uint32_t x = 0, y = 0;
          std::memcpy(&x, &a[i], sizeof a[i]);
          std::memcpy(&y, &b[i], sizeof b[i]);
          std::snprintf(msg, sizeof msg, "%s[%zu]: %#x vs %#x", what, i, x, y);
          return true;
        }
      return false;
    };
    if (first(p, o.p, "p") || first(m32, o.m32, "m") || first(v32, o.v32, "v") ||
        first(m16, o.m16, "m bf16") || first(v16, o.v16, "v bf16") || first(out, o.out, "bf16 copy") ||
        first(g32, o.g32, "g") || first(g16, o.g16, "g bf16"))
      return msg;
    return "";
  }
  bool operator==(const Bufs &o) const {
    auto same = [](const auto &a, const auto &b) {
      return a.size() == b.size() &&
             (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof a[0]) == 0);
    };
    return same(p, o.p) && same(g32, o.g32) && same(m32, o.m32) && same(v32, o.v32) && same(g16, o.g16) &&
           same(m16, o.m16) && same(v16, o.v16) && same(out, o.out);
  }
};

// The shared special values and two bf16 rounding ties.
const std::vector<float> kSpecial = [] {
  std::vector<float> v = mf_ot::special_values();
  v.push_back(1.00390625f);
  v.push_back(-1.01171875f);
  return v;
}();
const size_t kSpecials = kSpecial.size();

// Random values over many decades, with specials and, for fp32, values whose
// low 16 bits sit on a bf16 tie or next to one.
std::vector<float> random_floats(size_t n, std::mt19937 &rng, float scale, bool nonneg) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::uniform_real_distribution<float> mag(-6.0f, 2.0f);
  std::vector<float> x(n);
  for (auto &e : x) {
    e = scale * d(rng) * std::pow(10.0f, mag(rng));
    if (nonneg) e = std::fabs(e);
    const uint32_t r = rng() % 16;
    if (r == 0) e = kSpecial[rng() % kSpecials];
    if (r == 1 || r == 2) e = from_bits((bits(e) & 0xffff0000u) | (r == 1 ? 0x8000u : 0x7fffu + rng() % 3));
  }
  return x;
}

std::vector<uint16_t> random_bf16(size_t n, std::mt19937 &rng, float scale, bool nonneg) {
  const uint16_t kRaw[] = {
      0x0001, 0x8001, 0x007f, 0x0080, 0x7f7f, 0xff7f, 0x7f80,
      0xff80, 0x7fc0, 0xffc0, 0x7fc1, 0x0000, 0x8000};  // denormals, max, Inf, NaN, zeros
  std::vector<float> f = random_floats(n, rng, scale, nonneg);
  std::vector<uint16_t> h(n);
  for (size_t i = 0; i < n; i++) {
    h[i] = mf_fp32_to_bf16(f[i]);
    if (rng() % 24 == 0) h[i] = kRaw[rng() % (sizeof kRaw / sizeof kRaw[0])];
  }
  return h;
}

Bufs random_bufs(size_t n, std::mt19937 &rng) {
  Bufs b;
  b.n = n;
  b.p = random_floats(n + 1, rng, 1.0f, false);
  b.g32 = random_floats(n + 1, rng, 1.0f, false);
  b.m32 = random_floats(n + 1, rng, 1.0f, false);
  b.v32 = random_floats(n + 1, rng, 1e-3f, true);
  b.g16 = random_bf16(n + 1, rng, 1.0f, false);
  b.m16 = random_bf16(n + 1, rng, 1.0f, false);
  b.v16 = random_bf16(n + 1, rng, 1e-3f, true);
  b.out.assign(n + 1, 0xdead);
  return b;
}

// The definition in optim.h, element by element, written here from the torch
// formula (decoupled weight decay, lerp, fused addcmul, sqrt, addcdiv), on the
// widened inputs; m and v rounded where stored when the moments are bf16.
void definition_step(const mf_adamw_hparams &h, int64_t t, Bufs &b, mf_dtype gd, mf_dtype md) {
  const double bc1 = 1.0 - std::pow(h.beta1, (double)t), bc2 = 1.0 - std::pow(h.beta2, (double)t);
  const float decay = (float)(1.0 - h.lr * h.weight_decay), w = (float)(1.0 - h.beta1);
  const float neg_step = (float)-(h.lr / bc1), bc2_sqrt = (float)std::pow(bc2, 0.5);
  for (size_t i = 1; i <= b.n; i++) {
    const float g = gd == MF_DTYPE_BF16 ? mf_bf16_to_fp32(b.g16[i]) : b.g32[i];
    const float m = md == MF_DTYPE_BF16 ? mf_bf16_to_fp32(b.m16[i]) : b.m32[i];
    const float v = md == MF_DTYPE_BF16 ? mf_bf16_to_fp32(b.v16[i]) : b.v32[i];
    const float p = b.p[i] * decay;
    const float mn = std::fabs(w) < 0.5f ? std::fma(w, g - m, m) : std::fma(w - 1.0f, g - m, g);
    const float vn = std::fma((float)(1.0 - h.beta2) * g, g, v * (float)h.beta2);
    const float pn =
        p + (neg_step * mn) / (std::sqrt(vn) / bc2_sqrt + (float)h.eps);  // NaN: any (same_values)
    b.p[i] = pn;
    b.out[i] = ref_bf16(pn);
    if (md == MF_DTYPE_BF16) {
      b.m16[i] = ref_bf16(mn);
      b.v16[i] = ref_bf16(vn);
    } else {
      b.m32[i] = mn;
      b.v32[i] = vn;
    }
  }
}

// Equal values, any NaN equal to any NaN (the test's formula and the library
// may carry different NaN payloads: libm's and the compiler's operand order).
bool same_values(const Bufs &a, const Bufs &b, std::string *where) {
  auto f32 = [&](const std::vector<float> &x, const std::vector<float> &y, const char *what) {
    for (size_t i = 0; i < x.size(); i++)
      if (!(bits(x[i]) == bits(y[i]) || (std::isnan(x[i]) && std::isnan(y[i])))) {
        *where = std::string(what) + " element " + std::to_string(i);
        return false;
      }
    return true;
  };
  auto b16 = [&](const std::vector<uint16_t> &x, const std::vector<uint16_t> &y, const char *what) {
    for (size_t i = 0; i < x.size(); i++) {
      const bool nx = std::isnan(mf_bf16_to_fp32(x[i])), ny = std::isnan(mf_bf16_to_fp32(y[i]));
      if (!(x[i] == y[i] || (nx && ny))) {
        *where = std::string(what) + " element " + std::to_string(i);
        return false;
      }
    }
    return true;
  };
  return f32(a.p, b.p, "p") && f32(a.m32, b.m32, "m") && f32(a.v32, b.v32, "v") &&
         b16(a.m16, b.m16, "m bf16") && b16(a.v16, b.v16, "v bf16") && b16(a.out, b.out, "bf16 copy");
}

// -------------------------------------------------------------- the update

// bf16 inputs are exactly their widened fp32 values and bf16 moments are the
// fp32 update's m and v rounded: checked through the fp32 entry point (which
// optim_test checks against torch).
TEST(AdamWBf16, IsTheFp32UpdateOnWidenedInputsWithRoundedMoments) {
  std::mt19937 rng(7);
  const size_t n = 3 * MF_ADAMW_GRAIN + 19;
  const mf_adamw_hparams h = hp(1e-3, 0.9, 0.999, 1e-8, 0.05);
  for (const Dtypes &d : kDtypes) {
    Bufs b = random_bufs(n, rng);
    // the same state in fp32: widened copies
    std::vector<float> p = b.p, g(n + 1), m(n + 1), v(n + 1);
    std::vector<uint16_t> out(n + 1, 0xdead);
    for (size_t i = 0; i <= n; i++) {
      g[i] = d.g == MF_DTYPE_BF16 ? mf_bf16_to_fp32(b.g16[i]) : b.g32[i];
      m[i] = d.m == MF_DTYPE_BF16 ? mf_bf16_to_fp32(b.m16[i]) : b.m32[i];
      v[i] = d.m == MF_DTYPE_BF16 ? mf_bf16_to_fp32(b.v16[i]) : b.v32[i];
    }
    for (int64_t t = 1; t <= 3; t++) {
      const mf_adamw_bufs view = b.view(d.g, d.m);
      ASSERT_EQ(mf_adamw_update_bufs(&h, t, &view, nullptr), MF_OK) << mf_last_error();
      ASSERT_EQ(mf_adamw_update(&h, t, p.data() + 1, g.data() + 1, m.data() + 1, v.data() + 1, n,
                                out.data() + 1, nullptr),
                MF_OK);
      if (d.m == MF_DTYPE_BF16)  // the stored state is the rounded one
        for (size_t i = 1; i <= n; i++) {
          ASSERT_EQ(b.m16[i], mf_fp32_to_bf16(m[i])) << d.name << " step " << t << " m " << i;
          ASSERT_EQ(b.v16[i], mf_fp32_to_bf16(v[i])) << d.name << " step " << t << " v " << i;
          m[i] = mf_bf16_to_fp32(b.m16[i]);
          v[i] = mf_bf16_to_fp32(b.v16[i]);
        }
      else
        ASSERT_TRUE(std::memcmp(b.m32.data(), m.data(), m.size() * 4) == 0 &&
                    std::memcmp(b.v32.data(), v.data(), v.size() * 4) == 0)
            << d.name << " step " << t;
      ASSERT_EQ(std::memcmp(b.p.data(), p.data(), p.size() * 4), 0) << d.name << " step " << t;
      ASSERT_EQ(std::memcmp(b.out.data(), out.data(), out.size() * 2), 0) << d.name << " step " << t;
    }
  }
}

// Every body at every thread count against the scalar body on one thread, and
// the scalar body against the test's own formula, for every dtype
// combination; both lerp forms, lengths that leave every vector tail.
TEST(AdamWBf16, EveryBodyAndThreadCountBitIdenticalOnSpecialValues) {
  struct Case {
    double lr, b1, b2, eps, wd;
    int64_t step;
  } cases[] = {{1e-3, 0.9, 0.999, 1e-8, 0.05, 3},
               {0.5, 0.3, 0.95, 1e-30, 0.0, 1},
               {1e-38, 0.0, 0.0, 0.0, 1e-3, 7}};  // beta1 0: m_new = g, so ties in g are ties of m's store
  const size_t sizes[] = {
      1, 7, 8, 15, 16, 17, 31, 32, 33, 47, 100, 2 * MF_ADAMW_GRAIN + 13, 7 * MF_ADAMW_GRAIN + 5};
  std::vector<const char *> bodies;
  for (const char *name : {"avx512", "avx2", "fma", "scalar"}) {
    if (mf_adamw_select_impl(name) == MF_OK)
      bodies.push_back(name);
    else
      std::printf("body %s: not supported on this CPU, skipped\n", name);
  }
  Pool pool1(1), pool2(2), pool3(3), pool7(7);
  mf_threadpool *pools[] = {nullptr, pool1.p, pool2.p, pool3.p, pool7.p};
  std::mt19937 rng(99);
  size_t n_nan = 0, n_checked = 0, m_ties = 0;
  for (const Dtypes &d : kDtypes) {
    for (const Case &c : cases) {
      const mf_adamw_hparams h = hp(c.lr, c.b1, c.b2, c.eps, c.wd);
      for (size_t n : sizes) {
        const Bufs start = random_bufs(n, rng);
        Bufs ref = start;
        ASSERT_EQ(mf_adamw_select_impl("scalar"), MF_OK);
        mf_adamw_bufs view = ref.view(d.g, d.m);
        ASSERT_EQ(mf_adamw_update_bufs(&h, c.step, &view, nullptr), MF_OK) << mf_last_error();
        // the scalar body is the definition
        Bufs def = start;
        definition_step(h, c.step, def, d.g, d.m);
        std::string where;
        ASSERT_TRUE(same_values(ref, def, &where))
            << d.name << " n " << n << " beta1 " << c.b1 << ": " << where;
        for (size_t i = 1; i <= n; i++) n_nan += std::isnan(ref.p[i]);
        if (c.b1 == 0.0 && d.m == MF_DTYPE_BF16 && d.g == MF_DTYPE_F32)
          for (size_t i = 1; i <= n; i++) m_ties += (bits(start.g32[i]) & 0xffffu) == 0x8000u;
        for (const char *name : bodies) {
          ASSERT_EQ(mf_adamw_select_impl(name), MF_OK);
          for (mf_threadpool *pool : pools) {
            Bufs got = start;
            view = got.view(d.g, d.m);
            ASSERT_EQ(mf_adamw_update_bufs(&h, c.step, &view, pool), MF_OK);
            const int threads = pool ? mf_threadpool_size(pool) : 0;
            EXPECT_EQ(got.diff(ref), "")
                << name << " " << d.name << " n " << n << " threads " << threads << " beta1 " << c.b1;
            n_checked++;
          }
        }
      }
    }
  }
  std::printf("bf16 dtypes: %zu NaN params in the references, %zu m stores on a tie, %zu body/thread runs\n",
              n_nan, m_ties, n_checked);
  EXPECT_GT(n_nan, 100u);
  EXPECT_GT(m_ties, 1000u);
  ASSERT_EQ(mf_adamw_select_impl("auto"), MF_OK);
}

// bf16 moments change the result (from the second step: the first starts
// from zero moments and uses the fp32 m_new, v_new), and stay close to fp32
// moments: the rounding is to nearest, not a truncation or a wrong scale.
TEST(AdamWBf16, MomentsInBf16AreUsedAndStayClose) {
  const size_t n = 50000;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> p32(n), p16, m32(n, 0.0f), v32(n, 0.0f), g(n);
  for (auto &e : p32) e = nd(rng);
  p16 = p32;
  std::vector<uint16_t> m16(n, 0), v16(n, 0);
  const mf_adamw_hparams h = hp(1e-3, 0.9, 0.999, 1e-8, 0.0);
  size_t differ = 0;
  double err2 = 0, ref2 = 0;
  for (int64_t t = 1; t <= 10; t++) {
    for (auto &e : g) e = 1e-2f * nd(rng);
    ASSERT_EQ(mf_adamw_update(&h, t, p32.data(), g.data(), m32.data(), v32.data(), n, nullptr, nullptr),
              MF_OK);
    const mf_adamw_bufs b = {p16.data(), g.data(), m16.data(),   v16.data(),
                             nullptr,    n,        MF_DTYPE_F32, MF_DTYPE_BF16};
    ASSERT_EQ(mf_adamw_update_bufs(&h, t, &b, nullptr), MF_OK);
    differ = 0;
    err2 = ref2 = 0;
    for (size_t i = 0; i < n; i++) {
      differ += bits(p32[i]) != bits(p16[i]);
      const double e = (double)mf_bf16_to_fp32(m16[i]) - m32[i];
      err2 += e * e;
      ref2 += (double)m32[i] * m32[i];
    }
    if (t == 1) {
      EXPECT_EQ(differ, 0u) << "step 1 uses the fp32 m_new and v_new";
    }
  }
  EXPECT_GT(differ, n / 2);
  // relative rms error of m: a few of bf16's half-ulps (2^-9), not more
  const double rel = std::sqrt(err2 / ref2);
  std::printf("bf16 moments after 10 steps: m rms relative error %.3g, p differs in %zu of %zu\n", rel,
              differ, n);
  EXPECT_LT(rel, 8 * std::ldexp(1.0, -9));
  EXPECT_GT(rel, 0.0);
}

TEST(AdamWBf16, RejectsBadDtypesWritingNothing) {
  std::mt19937 rng(1);
  Bufs b = random_bufs(64, rng);
  const Bufs before = b;
  const mf_adamw_hparams h = hp(1e-3, 0.9, 0.999, 1e-8, 0.0);
  mf_adamw_bufs v = b.view(MF_DTYPE_F32, MF_DTYPE_F32);
  v.grad_dtype = MF_DTYPE_F16;
  EXPECT_EQ(mf_adamw_update_bufs(&h, 1, &v, nullptr), MF_ERR_INVALID_ARG);
  EXPECT_NE(std::string(mf_last_error()).find("gradient dtype F16"), std::string::npos) << mf_last_error();
  v = b.view(MF_DTYPE_F32, MF_DTYPE_F32);
  v.moment_dtype = MF_DTYPE_INVALID;
  EXPECT_EQ(mf_adamw_update_bufs(&h, 1, &v, nullptr), MF_ERR_INVALID_ARG);
  EXPECT_NE(std::string(mf_last_error()).find("moment dtype"), std::string::npos) << mf_last_error();
  v = b.view(MF_DTYPE_BF16, MF_DTYPE_BF16);
  v.m = nullptr;
  EXPECT_EQ(mf_adamw_update_bufs(&h, 1, &v, nullptr), MF_ERR_INVALID_ARG);
  v = b.view(MF_DTYPE_BF16, MF_DTYPE_BF16);
  EXPECT_EQ(mf_adamw_update_bufs(&h, 0, &v, nullptr), MF_ERR_INVALID_ARG);
  EXPECT_EQ(mf_adamw_update_bufs(&h, 1, nullptr, nullptr), MF_ERR_INVALID_ARG);
  EXPECT_TRUE(b == before);
  v.n = 0;
  v.param = nullptr;
  v.grad = nullptr;
  EXPECT_EQ(mf_adamw_update_bufs(&h, 1, &v, nullptr), MF_OK);
}

}  // namespace
