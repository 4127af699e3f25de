// The checks of a twin case as a call (tests/cuda/twin_cases.h
// mf_case_problems): what the operand table and mf_kernel_call_check say,
// and per kind the operands' bytes against the sizes and the integer operands
// against their ranges — what a device kernel would read past or index out
// of, where the cpu twin might not notice.
#include <algorithm>
#include <cstring>
#include <set>

#include "src/core/qformat.h"
#include "src/optim/optim.h"
#include "tests/cuda/twin_cases.h"

namespace {

using Bytes = std::vector<uint8_t>;

template <typename V>
std::vector<V> as(const Bytes &b) {
  std::vector<V> v(b.size() / sizeof(V));
  if (!v.empty()) memcpy(v.data(), b.data(), v.size() * sizeof(V));
  return v;
}

}  // namespace

namespace {

// The checks of one case; `bad` collects what is wrong.
class Validity {
 public:
  Validity(const MfKernelCase &c, std::vector<std::string> *bad) : c_(c), bad_(bad) {}
  int64_t sz(const char *name) const {
    const mf_kernel_info *t = mf_kernel_info_of(c_.call.kind);
    for (int j = 0; j < 8 && t->i[j]; j++)
      if (strcmp(t->i[j], name) == 0) return c_.call.i[j];
    return 0;
  }
  int slot(const char *name) const {
    const mf_kernel_info *t = mf_kernel_info_of(c_.call.kind);
    for (int j = 0; j < mf_kernel_n_operands(c_.call.kind); j++)
      if (strcmp(t->b[j].name, name) == 0) return j;
    return -1;
  }
  // Operand `name`, when present, holds exactly `elems` elements of its dtype.
  void elems(const char *name, int64_t n) {
    const int j = slot(name);
    if (j < 0 || !c_.present[j]) return;
    const size_t es = mf_case_elem_size(mf_case_dtype(c_.call, j)), got = c_.call.b[j].bytes;
    if (n < 0 || got != (size_t)n * es)
      fail(name, std::to_string(got) + " bytes; the sizes make it " + std::to_string(n) + " elements of " +
                     std::to_string(es) + " bytes");
  }
  // The integer operand's elements (empty when absent).
  template <typename V>
  std::vector<V> ints_of(const char *name) const {
    const int j = slot(name);
    if (j < 0 || !c_.present[j]) return {};
    return as<V>(c_.ops[c_.alias[j] >= 0 ? c_.alias[j] : j]);
  }
  void in_range(const char *name, int64_t lo, int64_t hi) {
    const std::vector<int32_t> v = ints_of<int32_t>(name);
    for (size_t i = 0; i < v.size(); i++)
      if (v[i] < lo || v[i] > hi) {
        fail(name, "element " + std::to_string(i) + " is " + std::to_string(v[i]) + ", outside [" +
                       std::to_string(lo) + ", " + std::to_string(hi) + "]");
        return;
      }
  }
  // Top-k choices: K distinct experts of [0, E) per row.
  void topk(const char *name, int64_t K, int64_t E) {
    const std::vector<int32_t> v = ints_of<int32_t>(name);
    in_range(name, 0, E - 1);
    for (size_t r = 0; K > 0 && r < v.size() / (size_t)K; r++) {
      std::set<int32_t> seen(v.begin() + (ptrdiff_t)(r * (size_t)K),
                             v.begin() + (ptrdiff_t)((r + 1) * (size_t)K));
      if ((int64_t)seen.size() != K) {
        fail(name, "row " + std::to_string(r) + " repeats an expert");
        return;
      }
    }
  }
  // A permutation of [0, n).
  void permutation(const char *name, int64_t n) {
    std::vector<int32_t> v = ints_of<int32_t>(name);
    std::sort(v.begin(), v.end());
    for (size_t i = 0; i < v.size(); i++)
      if (v[i] != (int32_t)i) {
        fail(name, "is not a permutation of the rows [0, " + std::to_string(n) + ")");
        return;
      }
  }
  // Expert offsets: E + 1 of them from 0, not decreasing, the last at most R.
  void offsets(int64_t E, int64_t R) {
    const std::vector<int64_t> v = ints_of<int64_t>("offsets");
    if ((int64_t)v.size() != E + 1) return;  // elems() says so
    bool ok = v[0] == 0 && v[(size_t)E] <= R;
    for (int64_t e = 0; e < E; e++) ok &= v[(size_t)e] <= v[(size_t)e + 1];
    if (!ok)
      fail("offsets",
           "are not E + 1 rising row offsets from 0 to at most the " + std::to_string(R) + " rows");
  }
  void fail(const char *name, const std::string &what) {
    bad_->push_back(c_.name + ": operand " + name + ": " + what);
  }

 private:
  const MfKernelCase &c_;
  std::vector<std::string> *bad_;
};

// Operand bytes against the sizes, and integer operands in range, per kind.
void check_kind(const MfKernelCase &c, Validity &v) {
  auto S = [&](const char *n) { return v.sz(n); };
  switch (c.call.kind) {
    case MF_K_ZERO:
      break;
    case MF_K_EMBED_FWD:
    case MF_K_EMBED_BWD:
      v.elems("ids", S("T"));
      v.elems("table", S("V") * S("H"));
      v.elems("dtable", S("V") * S("H"));
      v.elems("out", S("T") * S("H"));
      v.elems("dout", S("T") * S("H"));
      v.in_range("ids", 0, S("V") - 1);
      break;
    case MF_K_RMSNORM_FWD:
    case MF_K_RMSNORM_BWD:
      for (const char *n : {"x", "y", "dy", "dx"}) v.elems(n, S("R") * S("C"));
      v.elems("w", S("C"));
      v.elems("dw", S("C"));
      v.elems("rstd", S("R"));
      break;
    case MF_K_LINEAR_FWD:
    case MF_K_LINEAR_BWD_DATA:
    case MF_K_LINEAR_BWD_WEIGHT:
      v.elems("x", S("M") * S("K"));
      v.elems("dx", S("M") * S("K"));
      v.elems("W", S("N") * S("K"));
      v.elems("dW", S("N") * S("K"));
      v.elems("y", S("M") * S("N"));
      v.elems("dy", S("M") * S("N"));
      v.elems("bias", S("N"));
      v.elems("db", S("N"));
      break;
    case MF_K_ROPE_FWD:
    case MF_K_ROPE_BWD:
      v.elems("x", S("T") * S("nh") * S("D"));
      v.elems("dx", S("T") * S("nh") * S("D"));
      v.elems("pos", S("T"));
      v.in_range("pos", 0, INT32_MAX);
      break;
    case MF_K_ATTN_FWD:
    case MF_K_ATTN_BWD: {
      const int64_t BS = S("B") * S("S"), D = S("D"), Dv = S("Dv") ? S("Dv") : D;  // Dv: 0 is D
      if (S("Hkv") <= 0 || S("Hq") % S("Hkv") != 0) v.fail("q", "Hq is not a multiple of Hkv");
      v.elems("q", BS * S("Hq") * D);
      v.elems("dq", BS * S("Hq") * D);
      v.elems("k", BS * S("Hkv") * D);
      v.elems("dk", BS * S("Hkv") * D);
      v.elems("v", BS * S("Hkv") * Dv);
      v.elems("dv", BS * S("Hkv") * Dv);
      v.elems("o", BS * S("Hq") * Dv);
      v.elems("dout", BS * S("Hq") * Dv);
      v.elems("lse", BS * S("Hq"));
      v.elems("sinks", S("Hq"));
      v.elems("dsinks", S("Hq"));
      if (S("window") < 0) v.fail("q", "a negative sliding window");
      break;
    }
    case MF_K_SWIGLU_FWD:
    case MF_K_SWIGLU_BWD:
    case MF_K_SWIGLU_CLAMP_FWD:
    case MF_K_SWIGLU_CLAMP_BWD:
      for (const char *n : {"g", "u", "act", "dact", "dg", "du"}) v.elems(n, S("n"));
      break;
    case MF_K_EXPERT_BIAS_FWD:
    case MF_K_EXPERT_BIAS_BWD: {  // R: the rows of y (dy), a bound on offsets[E]
      const int64_t E = S("E"), N = S("N");
      const int j = c.call.kind == MF_K_EXPERT_BIAS_FWD ? v.slot("y") : v.slot("dy");
      const int64_t n = (int64_t)(c.call.b[j].bytes / mf_case_elem_size(mf_case_dtype(c.call, j)));
      if (N <= 0 || n % N != 0)
        v.fail(c.call.kind == MF_K_EXPERT_BIAS_FWD ? "y" : "dy", "is not whole rows of N");
      v.elems("offsets", E + 1);
      v.offsets(E, N > 0 ? n / N : 0);
      v.elems("bias", E * N);
      v.elems("db", E * N);
      break;
    }
    case MF_K_SIGGATE_FWD:
    case MF_K_SIGGATE_BWD:
      for (const char *n : {"x", "y", "dy", "dx"}) v.elems(n, S("R") * S("C"));
      v.elems("gl", S("R"));
      v.elems("dgl", S("R"));
      break;
    case MF_K_ADD:
    case MF_K_SCALE:
      v.elems("x", S("n"));
      v.elems("y", S("n"));
      break;
    case MF_K_DROPOUT: {  // with segments: parts of received rows (mf_cpu_dropout_parts)
      v.elems("x", S("n"));
      v.elems("y", S("n"));
      v.elems("segments", S("parts") + 1);
      v.elems("starts", S("parts"));
      v.elems("seeds", S("sources"));
      const std::vector<int64_t> g = v.ints_of<int64_t>("segments");
      const int64_t rows = S("row") > 0 ? S("n") / S("row") : 0;
      for (size_t k = 0; k < g.size(); k++)
        if (g[k] < 0 || g[k] > rows || (k > 0 && g[k] < g[k - 1])) {
          v.fail("segments", "do not rise from >= 0 within the " + std::to_string(rows) + " rows");
          break;
        }
      break;
    }
    case MF_K_ROUTER_FWD:
    case MF_K_ROUTER_BWD:
    case MF_K_ROUTER_GROUP_FWD:
    case MF_K_ROUTER_GROUP_BWD: {
      const int64_t TE = S("T") * S("E"), TK = S("T") * S("K");
      for (const char *n : {"logits", "probs", "scores", "dprobs_extra", "dlogits"}) v.elems(n, TE);
      for (const char *n : {"topk_idx", "topk_w", "dtopk_w"}) v.elems(n, TK);
      v.elems("bias", S("E"));
      if (c.call.kind == MF_K_ROUTER_BWD || c.call.kind == MF_K_ROUTER_GROUP_BWD)
        v.topk("topk_idx", S("K"), S("E"));
      if (S("mode") != 0 && S("mode") != 1) v.fail("logits", "mode is neither 0 nor 1");
      if (c.call.kind == MF_K_ROUTER_GROUP_FWD || c.call.kind == MF_K_ROUTER_GROUP_BWD) {
        const int64_t G = S("n_group"), TG = S("topk_group");
        if (G <= 0 || S("E") % G != 0 || (G > 1 && S("E") / G < 2) || TG < 1 || TG > G ||
            S("K") > TG * (S("E") / G))
          v.fail("logits", "n_group, topk_group and K do not make groups of the experts");
      }
      break;
    }
    case MF_K_MOE_DISPATCH:
      v.elems("topk_idx", S("T") * S("K"));
      v.elems("counts", S("E"));
      v.elems("offsets", S("E") + 1);
      v.elems("row_of", S("T") * S("K"));
      v.elems("token_of_row", S("T") * S("K"));
      v.topk("topk_idx", S("K"), S("E"));
      break;
    case MF_K_MOE_GATHER: {
      const int64_t H = S("H"),
                    x = H > 0 ? (int64_t)(c.call.b[0].bytes / mf_case_elem_size(mf_case_dtype(c.call, 0)))
                              : 0;
      if (H <= 0 || x % H != 0) v.fail("x", "is not whole rows of H");
      v.elems("token_of_row", S("R"));
      v.elems("xe", S("R") * H);
      v.in_range("token_of_row", 0, H > 0 ? x / H - 1 : -1);
      break;
    }
    case MF_K_MOE_GATHER_BWD:
    case MF_K_MOE_COMBINE:
    case MF_K_MOE_COMBINE_BWD: {
      const int64_t TK = S("T") * S("K"), H = S("H");
      for (const char *n : {"dxe", "ye", "dye"}) v.elems(n, TK * H);
      for (const char *n : {"dx", "y", "dy"}) v.elems(n, S("T") * H);
      v.elems("w", TK);
      v.elems("dw", TK);
      v.elems("row_of", TK);
      v.permutation("row_of", TK);
      break;
    }
    case MF_K_EXPERT_FWD:
    case MF_K_EXPERT_BWD_DATA:
    case MF_K_EXPERT_BWD_WEIGHT: {
      const int64_t E = S("E"), N = S("N"), Kd = S("Kd");
      const int j = c.call.kind == MF_K_EXPERT_BWD_DATA || c.call.kind == MF_K_EXPERT_BWD_WEIGHT
                        ? v.slot("dye")
                        : v.slot("xe");
      const int64_t width = j == v.slot("dye") ? N : Kd;
      const int64_t R =
          width > 0 ? (int64_t)(c.call.b[j].bytes / mf_case_elem_size(mf_case_dtype(c.call, j))) / width : 0;
      for (const char *n : {"xe", "dxe"}) v.elems(n, R * Kd);
      for (const char *n : {"ye", "dye"}) v.elems(n, R * N);
      v.elems("offsets", E + 1);
      v.offsets(E, R);
      if ((int64_t)c.experts.size() != E)
        v.fail("offsets", "E is " + std::to_string(E) + " but the case has " +
                              std::to_string(c.experts.size()) + " expert weights");
      for (size_t e = 0; e < c.experts.size(); e++) {
        if (!c.experts[e].empty() && c.experts[e].size() != c.call.expert_bytes)
          v.fail("offsets", "expert " + std::to_string(e) + "'s weight is not expert_bytes");
      }
      if (c.call.expert_bytes != (size_t)(N * Kd) * mf_case_elem_size(c.call.expert_dtype))
        v.fail("offsets", "expert_bytes is not N x Kd elements");
      break;
    }
    case MF_K_CROSS_ENTROPY:
      v.elems("h", S("T") * S("H"));
      v.elems("dh", S("T") * S("H"));
      v.elems("W", S("V") * S("H"));
      v.elems("dW", S("V") * S("H"));
      v.elems("target", S("T"));
      v.elems("ws", S("T") * S("chunk"));
      v.elems("lse", S("T"));
      v.elems("scalars", 2);
      v.in_range("target", -1, S("V") - 1);
      break;
    case MF_K_AUX_ACCUMULATE:
    case MF_K_AUX_VALUE:
    case MF_K_AUX_GRAD:
      v.elems("probs", S("T") * S("E"));
      v.elems("dprobs", S("T") * S("E"));
      v.elems("topk_idx", S("T") * S("K"));
      v.elems("counts", S("E"));
      v.elems("psum", S("E"));
      v.elems("aux", 1);
      if (c.call.kind == MF_K_AUX_ACCUMULATE) v.topk("topk_idx", S("K"), S("E"));
      break;
    case MF_K_GRAD_SUMSQ: {
      v.elems("g", S("n"));
      const size_t sums = c.call.b[1].bytes / 8,
                   need = (size_t)S("first") + mf_optim_norm_chunks((size_t)S("n"));
      if (S("first") < 0 || sums < need)
        v.fail("sums",
               "holds " + std::to_string(sums) + " sums; the call writes up to " + std::to_string(need));
      break;
    }
    case MF_K_ADAMW: {
      const int64_t n = S("n");
      const size_t ms = S("moment_bf16") ? 2 : 4, master = c.storage == MF_DTYPE_BF16 ? 4 : 0;
      v.elems("param", n);
      v.elems("grad", n);
      if (c.call.b[2].bytes != (size_t)n * (master + 2 * ms))
        v.fail("state", "is not the master (BF16), m and v of n elements");
      if (S("t") < 1) v.fail("state", "steps count from 1");
      break;
    }
    case MF_K_DEQUANT: {
      mf_qweight w = {};
      w.kind = (int32_t)S("kind"), w.rows = S("rows"), w.cols = S("cols"), w.blocksize = S("blocksize");
      w.nested = (int32_t)S("nested");
      v.elems("y", w.rows * w.cols);
      v.elems("qw", mf_qweight_blob_bytes(&w));
      break;
    }
    case MF_K_SLICE:
    case MF_K_SLICE_BWD: {
      const int64_t rows = c.call.kind == MF_K_SLICE ? S("R") : S("Q"), rep = S("rep"), C = S("C");
      if (rep < 1 || S("xo") < 0 || S("yo") < 0 || S("xo") + C > S("xs") || S("yo") + C > S("ys"))
        v.fail(c.call.kind == MF_K_SLICE ? "x" : "dy", "a block outside its rows, or rep below 1");
      const int64_t xrows = c.call.kind == MF_K_SLICE ? (rows + rep - 1) / std::max<int64_t>(rep, 1) : rows;
      const int64_t yrows = c.call.kind == MF_K_SLICE ? rows : rows * rep;
      v.elems("x", xrows * S("xs"));
      v.elems("dx", xrows * S("xs"));
      v.elems("y", yrows * S("ys"));
      v.elems("dy", yrows * S("ys"));
      break;
    }
    default:
      v.fail("-", "twin_case_check.cc checks no sizes of this kind: add it to check_kind");
  }
}

}  // namespace

std::vector<std::string> mf_case_problems(const MfKernelCase &c) {
  std::vector<std::string> bad;
  for (const std::string &e : c.errors) bad.push_back(c.name + ": " + e);
  const mf_kernel_info *t = mf_kernel_info_of(c.call.kind);
  if (!t) {
    bad.push_back(c.name + ": kind " + std::to_string((int)c.call.kind) + " is not in the operand table");
    return bad;
  }
  const int n = mf_kernel_n_operands(c.call.kind);
  for (int j = 0; j < MF_KBUF_MAX; j++) {
    if (j >= n && c.present[j])
      bad.push_back(c.name + ": operand slot " + std::to_string(j) + " is past the table's");
    if (j < n && !t->b[j].optional && !c.present[j])
      bad.push_back(c.name + ": operand " + t->b[j].name + " is required and absent");
    if (c.present[j] && c.call.b[j].bytes == 0)
      bad.push_back(c.name + ": operand " + (j < n ? t->b[j].name : "?") + " is present with no bytes");
    if (c.present[j] && c.alias[j] < 0 && c.ops[j].size() != c.call.b[j].bytes)
      bad.push_back(c.name + ": operand " + (j < n ? t->b[j].name : "?") + ": contents and bytes disagree");
  }
  if (c.has_experts != (t->experts.name != nullptr))
    bad.push_back(c.name +
                  (c.has_experts ? ": expert weights for a kind without them" : ": no expert weights"));
  // The call as a backend sees it (pointers: the case's own bytes).
  mf_kernel_call k = c.call;
  std::vector<void *> eptr;
  for (int j = 0; j < MF_KBUF_MAX; j++)
    if (c.present[j]) k.b[j].ptr = const_cast<uint8_t *>(c.ops[c.alias[j] >= 0 ? c.alias[j] : j].data());
  for (const Bytes &w : c.experts) eptr.push_back(w.empty() ? nullptr : const_cast<uint8_t *>(w.data()));
  if (c.has_experts) k.experts = eptr.data();
  k.label = c.name.c_str();
  mf_dtype storage = MF_DTYPE_INVALID;
  if (mf_kernel_call_check(&k) != MF_OK)
    bad.push_back(c.name + ": mf_kernel_call_check: " + mf_last_error());
  else if (mf_kernel_call_dtype(&k, &storage) != MF_OK || storage != c.storage)
    bad.push_back(c.name + ": computes in " + mf_dtype_name(storage) + ", not the case's " +
                  mf_dtype_name(c.storage));
  Validity v(c, &bad);
  check_kind(c, v);
  return bad;
}
