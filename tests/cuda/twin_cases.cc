// The twin harness's case builder, runner and comparison (tests/cuda/
// twin_cases.h); the cases themselves are twin_case_table.cc's, the checks of
// a case as a call twin_case_check.cc's.
#include "tests/cuda/twin_cases.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

namespace {

using Bytes = std::vector<uint8_t>;
const float kNaN = std::numeric_limits<float>::quiet_NaN();

template <typename V>
Bytes bytes_of(const std::vector<V> &v) {
  Bytes b(v.size() * sizeof(V));
  if (!b.empty()) memcpy(b.data(), v.data(), b.size());
  return b;
}
uint64_t fnv1a(const std::string &s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  return h;
}

bool is_float(mf_dtype d) {
  return d == MF_DTYPE_F32 || d == MF_DTYPE_BF16 || d == MF_DTYPE_F64;
}
std::string element_text(const Bytes &b, mf_dtype d, size_t i) {
  char buf[64];
  const size_t es = mf_case_elem_size(d);
  uint64_t bits = 0;
  memcpy(&bits, &b[i * es], es);
  if (is_float(d))
    snprintf(buf, sizeof buf, "%.9g (0x%0*" PRIx64 ")", mf_case_value(b, d, i), (int)(2 * es), bits);
  else if (d == MF_DTYPE_I64)
    snprintf(buf, sizeof buf, "%" PRId64, (int64_t)bits);
  else if (d == MF_DTYPE_I32)
    snprintf(buf, sizeof buf, "%d", (int)(int32_t)bits);
  else
    snprintf(buf, sizeof buf, "0x%02x", (unsigned)bits);
  return buf;
}

}  // namespace

mf_dtype mf_case_dtype(const mf_kernel_call &k, int j) {
  if (k.b[j].dtype != MF_DTYPE_INVALID) return k.b[j].dtype;
  const mf_kernel_info *t = mf_kernel_info_of(k.kind);
  return j < mf_kernel_n_operands(k.kind) ? mf_kop_type_dtype(t->b[j].type, MF_DTYPE_F32) : MF_DTYPE_U8;
}
size_t mf_case_elem_size(mf_dtype d) {
  const size_t s = mf_dtype_size(d);
  return s ? s : 1;
}
double mf_case_value(const std::vector<uint8_t> &b, mf_dtype d, size_t i) {
  switch (d) {
    case MF_DTYPE_F32: {
      float f;
      memcpy(&f, &b[i * 4], 4);
      return f;
    }
    case MF_DTYPE_BF16: {
      uint16_t h;
      memcpy(&h, &b[i * 2], 2);
      return mf_bf16_to_fp32(h);
    }
    case MF_DTYPE_F64: {
      double x;
      memcpy(&x, &b[i * 8], 8);
      return x;
    }
    case MF_DTYPE_I32: {
      int32_t x;
      memcpy(&x, &b[i * 4], 4);
      return x;
    }
    case MF_DTYPE_I64: {
      int64_t x;
      memcpy(&x, &b[i * 8], 8);
      return (double)x;
    }
    default:
      return b[i];
  }
}
std::vector<float> mf_case_uniform(std::mt19937_64 &g, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto &x : v) x = d(g);
  return v;
}
// ------------------------------------------------------------- the builder

MfCaseBuild::MfCaseBuild(MfKernelCase *c, uint64_t seed) : c_(c), rng_(seed) {}

int MfCaseBuild::slot(const char *name) {
  const mf_kernel_info *t = mf_kernel_info_of(c_->call.kind);
  for (int j = 0; t && j < mf_kernel_n_operands(c_->call.kind); j++)
    if (strcmp(t->b[j].name, name) == 0) return j;
  c_->errors.push_back(std::string("the builder names operand \"") + name + "\", which " +
                       mf_kernel_name(c_->call.kind) + " does not have");
  return -1;
}

MfCaseBuild &MfCaseBuild::size(const char *name, int64_t v) {
  const mf_kernel_info *t = mf_kernel_info_of(c_->call.kind);
  for (int j = 0; t && j < 8 && t->i[j]; j++)
    if (strcmp(t->i[j], name) == 0) {
      c_->call.i[j] = v;
      return *this;
    }
  c_->errors.push_back(std::string("no size named \"") + name + "\" in " + mf_kernel_name(c_->call.kind));
  return *this;
}

MfCaseBuild &MfCaseBuild::scalar(const char *name, double v) {
  const mf_kernel_info *t = mf_kernel_info_of(c_->call.kind);
  for (int j = 0; t && j < 6 && t->f[j]; j++)
    if (strcmp(t->f[j], name) == 0) {
      c_->call.f[j] = v;
      return *this;
    }
  c_->errors.push_back(std::string("no scalar named \"") + name + "\" in " + mf_kernel_name(c_->call.kind));
  return *this;
}

MfCaseBuild &MfCaseBuild::put(int j, mf_dtype dt, Bytes b) {
  c_->ops[j] = std::move(b);
  c_->present[j] = true;
  c_->call.b[j].bytes = c_->ops[j].size();
  c_->call.b[j].dtype = dt;
  return *this;
}

MfCaseBuild &MfCaseBuild::values(const char *name, const std::vector<float> &v) {
  const int j = slot(name);
  if (j < 0) return *this;
  const mf_kop_type t = mf_kernel_info_of(c_->call.kind)->b[j].type;
  if (t == MF_KT_F64) return put(j, MF_DTYPE_F64, bytes_of(std::vector<double>(v.begin(), v.end())));
  if (t != MF_KT_FLOAT && t != MF_KT_F32) {
    c_->errors.push_back(std::string("float values for operand ") + name + ", which is not a float operand");
    return *this;
  }
  const mf_dtype dt = mf_kop_type_dtype(t, c_->storage);
  if (dt == MF_DTYPE_BF16) {
    std::vector<uint16_t> h(v.size());
    if (!v.empty()) mf_fp32_to_bf16_n(v.data(), h.data(), v.size());
    return put(j, dt, bytes_of(h));
  }
  return put(j, dt, bytes_of(v));
}

MfCaseBuild &MfCaseBuild::uniform(const char *name, size_t n, float lo, float hi) {
  return values(name, mf_case_uniform(rng_, n, lo, hi));
}

MfCaseBuild &MfCaseBuild::f64(const char *name, const std::vector<double> &v) {
  const int j = slot(name);
  return j < 0 ? *this : put(j, MF_DTYPE_F64, bytes_of(v));
}
MfCaseBuild &MfCaseBuild::i32(const char *name, const std::vector<int32_t> &v) {
  const int j = slot(name);
  return j < 0 ? *this : put(j, MF_DTYPE_I32, bytes_of(v));
}
MfCaseBuild &MfCaseBuild::i64(const char *name, const std::vector<int64_t> &v) {
  const int j = slot(name);
  return j < 0 ? *this : put(j, MF_DTYPE_I64, bytes_of(v));
}
MfCaseBuild &MfCaseBuild::bytes(const char *name, const std::vector<uint8_t> &v) {
  const int j = slot(name);
  return j < 0 ? *this : put(j, MF_DTYPE_U8, v);
}

MfCaseBuild &MfCaseBuild::out(const char *name, size_t n) {
  const int j = slot(name);
  if (j < 0) return *this;
  const bool read = (mf_kernel_reads(&c_->call) >> j) & 1u;
  switch (mf_kernel_info_of(c_->call.kind)->b[j].type) {
    case MF_KT_FLOAT:
    case MF_KT_F32:
      return values(name, read ? mf_case_uniform(rng_, n, -1, 1) : std::vector<float>(n, kNaN));
    case MF_KT_F64: {
      std::vector<double> v(n, std::nan(""));
      std::uniform_real_distribution<double> d(0, 100);
      if (read)
        for (auto &x : v) x = d(rng_);
      return f64(name, v);
    }
    case MF_KT_I32:
      return i32(name, std::vector<int32_t>(n, -7));  // no kind reads an I32 output
    case MF_KT_I64: {
      std::vector<int64_t> v(n, -7);
      std::uniform_int_distribution<int64_t> d(0, 1000);
      if (read)
        for (auto &x : v) x = d(rng_);
      return i64(name, v);
    }
    default: {
      Bytes b(n);
      for (auto &x : b) x = (uint8_t)(rng_() | 1u);
      return bytes(name, b);
    }
  }
}

MfCaseBuild &MfCaseBuild::alias(const char *name, const char *of) {
  const int j = slot(name), a = slot(of);
  if (j < 0 || a < 0) return *this;
  if (!c_->present[a]) {
    c_->errors.push_back(std::string("operand ") + name + " aliases " + of + ", which is not set yet");
    return *this;
  }
  c_->alias[j] = a;
  c_->present[j] = true;
  c_->ops[j].clear();
  c_->call.b[j].bytes = c_->ops[a].size();
  c_->call.b[j].dtype = c_->call.b[a].dtype;
  return *this;
}

MfCaseBuild &MfCaseBuild::experts(int64_t E, size_t n, const std::vector<bool> &null) {
  const mf_kop &op = mf_kernel_info_of(c_->call.kind)->experts;
  if (!op.name) {
    c_->errors.push_back(std::string(mf_kernel_name(c_->call.kind)) + " takes no expert weights");
    return *this;
  }
  const mf_dtype dt = mf_kop_type_dtype(op.type, c_->storage);
  c_->experts.assign((size_t)E, Bytes());
  for (int64_t e = 0; e < E; e++) {
    if ((size_t)e < null.size() && null[(size_t)e]) continue;
    const std::vector<float> v = mf_case_uniform(rng_, n, -1, 1);
    if (dt == MF_DTYPE_BF16) {
      std::vector<uint16_t> h(n);
      mf_fp32_to_bf16_n(v.data(), h.data(), n);
      c_->experts[(size_t)e] = bytes_of(h);
    } else {
      c_->experts[(size_t)e] = bytes_of(v);
    }
  }
  c_->has_experts = true;
  c_->call.expert_bytes = n * mf_case_elem_size(dt);
  c_->call.expert_dtype = dt;
  return *this;
}

MfCaseBuild &MfCaseBuild::raw(const char *name, const std::vector<uint8_t> &bytes, mf_dtype dt) {
  const int j = slot(name);
  return j < 0 ? *this : put(j, dt, bytes);
}

void MfCaseBuild::fail(const std::string &why) {
  c_->errors.push_back(why);
}

const MfCaseEntry *mf_case_entry(mf_kernel k) {
  for (const MfCaseEntry &e : mf_case_table())
    if (e.kind == k) return &e;
  return nullptr;
}

bool mf_case_has_float(mf_kernel k) {
  const mf_kernel_info *t = mf_kernel_info_of(k);
  if (!t) return false;
  bool f = t->experts.name && t->experts.type == MF_KT_FLOAT;
  for (int j = 0; j < mf_kernel_n_operands(k); j++) f |= t->b[j].type == MF_KT_FLOAT;
  return f;
}

std::vector<mf_dtype> mf_case_storages(const MfCaseEntry &e) {
  if (e.one_storage) return {MF_DTYPE_F32};
  return {MF_DTYPE_F32, MF_DTYPE_BF16};
}

MfKernelCase mf_case_make(const MfCaseEntry &e, size_t s, mf_dtype storage) {
  MfKernelCase c;
  c.entry = &e;
  c.shape = e.shapes[s];
  c.storage = storage;
  c.call.kind = e.kind;
  c.data_name = mf_kernel_name(e.kind);
  // "T V H" and {37, 5, 129}: " T=37 V=5 H=129".
  const std::string names = e.shape_names ? e.shape_names : "";
  size_t at = 0;
  for (size_t d = 0; d < c.shape.size(); d++) {
    const size_t end = std::min(names.find(' ', at), names.size());
    const std::string nm = at < names.size() ? names.substr(at, end - at) : "s" + std::to_string(d);
    c.data_name += " " + nm + "=" + std::to_string(c.shape[d]);
    at = end + 1;
  }
  c.name = c.data_name + (e.one_storage ? "" : storage == MF_DTYPE_BF16 ? " BF16" : " F32");
  MfCaseBuild b(&c, fnv1a(c.data_name));
  e.build(b, c.shape);
  // The write flags the table gives (the sizes are set now: accumulate).
  const uint32_t writes = mf_kernel_writes(&c.call);
  for (int j = 0; j < MF_KBUF_MAX; j++) c.call.b[j].write = (int)((writes >> j) & 1u);
  return c;
}

std::vector<MfKernelCase> mf_case_all(mf_kernel k, mf_dtype storage) {
  std::vector<MfKernelCase> v;
  const MfCaseEntry *e = mf_case_entry(k);
  for (size_t s = 0; e && s < e->shapes.size(); s++) v.push_back(mf_case_make(*e, s, storage));
  return v;
}

MfCaseTol mf_case_tol(const MfKernelCase &c, int slot) {
  const mf_kernel_info *t = mf_kernel_info_of(c.call.kind);
  const char *name = slot >= 100 ? "experts" : t->b[slot].name;
  const MfCaseTolRule *any = nullptr;
  for (const MfCaseTolRule &r : c.entry->tol) {
    if (strcmp(r.operand, name) == 0) return c.storage == MF_DTYPE_BF16 ? r.bf16 : r.f32;
    if (strcmp(r.operand, "*") == 0) any = &r;
  }
  if (!any) return mf_tol_exact();
  return c.storage == MF_DTYPE_BF16 ? any->bf16 : any->f32;
}

size_t mf_case_arena_bytes(const MfKernelCase &c) {
  size_t n = 0;
  for (int j = 0; j < MF_KBUF_MAX; j++)
    if (c.present[j] && c.alias[j] < 0) n += (c.ops[j].size() + 255) / 256 * 256;
  for (const Bytes &w : c.experts) n += (w.size() + 255) / 256 * 256;
  return n;
}

// ------------------------------------------------------------ running

void *MfCaseHostMemory::put(const std::vector<uint8_t> &bytes, std::string *why) {
  held_.push_back(bytes);
  return held_.back().data();
}

bool MfCaseHostMemory::get(const void *p, std::vector<uint8_t> *out, std::string *why) {
  if (!out->empty()) memcpy(out->data(), p, out->size());
  return true;
}

MfCaseOut mf_case_run(mf_backend *b, mf_stream *s, const MfKernelCase &c, MfCaseMemory *mem) {
  MfCaseOut o;
  mf_kernel_call k = c.call;
  k.label = c.name.c_str();
  std::string why;
  for (int j = 0; j < MF_KBUF_MAX; j++) {
    if (!c.present[j] || c.alias[j] >= 0) continue;
    if (!(o.ptr[j] = mem->put(c.ops[j], &why))) {
      o.status = MF_ERR_OUT_OF_MEMORY;
      o.error = "placing operand " + std::to_string(j) + ": " + why;
      return o;
    }
  }
  for (int j = 0; j < MF_KBUF_MAX; j++)
    if (c.present[j] && c.alias[j] >= 0) o.ptr[j] = o.ptr[c.alias[j]];
  for (int j = 0; j < MF_KBUF_MAX; j++) k.b[j].ptr = c.present[j] ? o.ptr[j] : nullptr;
  for (size_t e = 0; e < c.experts.size(); e++) {
    void *p = nullptr;
    if (!c.experts[e].empty() && !(p = mem->put(c.experts[e], &why))) {
      o.status = MF_ERR_OUT_OF_MEMORY;
      o.error = "placing expert " + std::to_string(e) + ": " + why;
      return o;
    }
    o.expert_ptr.push_back(p);
  }
  if (c.has_experts) k.experts = o.expert_ptr.data();
  mem->placed();
  mf_status st = b->run(b, &k, s);
  if (st == MF_OK) st = b->stream_sync(b, s);
  if (st != MF_OK) {
    o.status = st;
    o.error = mf_last_error();
    return o;
  }
  for (int j = 0; j < MF_KBUF_MAX; j++) {
    if (!c.present[j] || c.alias[j] >= 0) continue;
    o.ops[j].resize(c.ops[j].size());
    if (!mem->get(o.ptr[j], &o.ops[j], &why)) {
      o.status = MF_ERR_INTERNAL;
      o.error = "reading operand " + std::to_string(j) + " back: " + why;
      return o;
    }
  }
  o.experts.resize(c.experts.size());
  for (size_t e = 0; e < c.experts.size(); e++) {
    if (!o.expert_ptr[e]) continue;
    o.experts[e].resize(c.experts[e].size());
    if (!mem->get(o.expert_ptr[e], &o.experts[e], &why)) {
      o.status = MF_ERR_INTERNAL;
      o.error = "reading expert " + std::to_string(e) + " back: " + why;
      return o;
    }
  }
  return o;
}

// ----------------------------------------------------------- comparing

namespace {

// One operand's two copies: a message when out of `tol`, else "".
std::string compare_one(const std::string &what, mf_dtype d, const Bytes &ref, const Bytes &got,
                        MfCaseTol tol, const char *rname, const char *gname) {
  if (tol.mode == MfCaseTol::kSkip) return "";
  if (ref.size() != got.size())
    return what + ": " + std::to_string(got.size()) + " bytes from " + gname + ", " +
           std::to_string(ref.size()) + " from " + rname;
  const size_t es = mf_case_elem_size(d), n = ref.size() / es;
  char buf[160];
  if (!is_float(d) || tol.mode == MfCaseTol::kExact) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
      if (memcmp(&ref[i * es], &got[i * es], es) != 0 && bad++ == 0) first = i;
    if (!bad) return "";
    snprintf(buf, sizeof buf,
             "%zu of %zu elements differ (the same bits expected); the first, element %zu: ", bad, n, first);
    return what + ": " + buf + rname + " " + element_text(ref, d, first) + ", " + gname + " " +
           element_text(got, d, first);
  }
  double num = 0, den = 0, worst = -1;
  size_t at = 0, differ = 0, nan_mismatch = 0;
  for (size_t i = 0; i < n; i++) {
    const double a = mf_case_value(ref, d, i), b = mf_case_value(got, d, i);
    if (!std::isnan(a)) den += a * a;
    if (memcmp(&ref[i * es], &got[i * es], es) == 0 || (std::isnan(a) && std::isnan(b))) continue;
    differ++;
    const double diff = std::isnan(a) != std::isnan(b) ? INFINITY : std::fabs(b - a);
    if (std::isinf(diff))
      nan_mismatch++;
    else
      num += diff * diff;
    if (diff > worst) worst = diff, at = i;
  }
  den = std::max({den, (double)n * tol.rms_floor * tol.rms_floor, 1e-300});
  const double err = nan_mismatch ? INFINITY : num / den;
  if (err <= tol.nmse) return "";
  snprintf(buf, sizeof buf,
           "NMSE %.3g > %.3g over %zu elements (%zu differ, %zu NaN on one side only); worst, element %zu: ",
           err, tol.nmse, n, differ, nan_mismatch, at);
  return what + ": " + buf + rname + " " + element_text(ref, d, at) + ", " + gname + " " +
         element_text(got, d, at);
}

}  // namespace

std::vector<std::string> mf_case_compare(const MfKernelCase &c, const MfCaseOut &ref, const MfCaseOut &got,
                                         bool exact, const char *rname, const char *gname) {
  std::vector<std::string> msgs;
  if (ref.status != MF_OK) msgs.push_back(c.name + ": the " + rname + " run failed: " + ref.error);
  if (got.status != MF_OK) msgs.push_back(c.name + ": the " + gname + " run failed: " + got.error);
  if (!msgs.empty()) return msgs;
  char what[96];
  const uint32_t writes = mf_kernel_writes(&c.call);
  for (int j = 0; j < mf_kernel_n_operands(c.call.kind); j++) {
    if (!c.present[j] || !((writes >> j) & 1u)) continue;
    const int home = c.alias[j] >= 0 ? c.alias[j] : j;
    const MfCaseTol tol = exact ? mf_tol_exact() : mf_case_tol(c, j);
    mf_kernel_operand_text(c.call.kind, j, what, sizeof what);
    const std::string m =
        compare_one(c.name + ": " + what + " " + mf_dtype_name(mf_case_dtype(c.call, j)),
                    mf_case_dtype(c.call, j), ref.ops[home], got.ops[home], tol, rname, gname);
    if (!m.empty()) msgs.push_back(m);
  }
  if (c.has_experts && mf_kernel_writes_experts(c.call.kind)) {
    const MfCaseTol tol = exact ? mf_tol_exact() : mf_case_tol(c, 100);
    for (size_t e = 0; e < c.experts.size() && e < ref.experts.size() && e < got.experts.size(); e++) {
      mf_kernel_operand_text(c.call.kind, 100 + (int)e, what, sizeof what);
      const std::string m =
          compare_one(c.name + ": " + what + " " + mf_dtype_name(c.call.expert_dtype), c.call.expert_dtype,
                      ref.experts[e], got.experts[e], tol, rname, gname);
      if (!m.empty()) msgs.push_back(m);
    }
  }
  return msgs;
}
