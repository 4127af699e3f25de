// The twin harness's case table (as ggml's test-backend-ops): for every kernel
// kind of kernels/backend.h, shapes with a function that builds a valid call
// of that shape (random but seeded values; integer operands made consistent:
// routing maps from the cpu dispatch, offsets from its counts, indices in
// range), the storage dtypes the kind computes in, and a tolerance per written
// operand. tests/cuda/twin_harness_test.cc runs every case on the cuda backend
// against the cpu backend (a GPU test); tests/cuda/twin_cases_test.cc checks
// on the CPU that every kind has cases in each storage it computes in, that
// every case is a valid call and that the cpu backend runs it (CI).
//
// Storage. A case is built for one storage dtype: F32, or BF16, where every
// FLOAT operand (kernels/backend.c's operand table) holds bf16 elements and
// the other operands keep their fixed types. The cpu side of a BF16 case is
// the cpu backend's BF16 path, which is the round_bf16 twin of
// tests/cuda/bf16_twin.h with its FLOAT operands narrowed (kernels/cpu/
// backend_cpu.c run_bf16: widen, run with round_bf16, narrow what it wrote;
// tests/kernels/bf16_storage_test.cc holds it to that bit for bit). So both
// backends get the same bytes and their outputs are compared in the storage.
// A kind without FLOAT operands (ZERO: bytes; the routing bookkeeping; the
// aux loss; GRAD_SUMSQ) says so in its entry and runs once, with its fixed
// types.
//
// Sizes and scalars are set by the names the operand table gives them
// (`size("T", 3)`), so sizes added to a kind later keep their default 0.
#ifndef MF_TESTS_CUDA_TWIN_CASES_H
#define MF_TESTS_CUDA_TWIN_CASES_H

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "src/core/core.h"

// How the two sides' copies of one written operand are compared. Integer and
// byte operands are always compared bit for bit (unless kSkip).
struct MfCaseTol {
  enum Mode { kExact, kNmse, kSkip };
  Mode mode = kExact;
  // kNmse: sum (got - ref)^2 / max(sum ref^2, n * rms_floor^2) <= nmse, over
  // the elements whose bits differ (NaN against a number fails).
  double nmse = 0;
  double rms_floor = 0;
};
inline MfCaseTol mf_tol_exact() {
  return MfCaseTol{};
}
inline MfCaseTol mf_tol_nmse(double bound, double rms_floor = 0) {
  return MfCaseTol{MfCaseTol::kNmse, bound, rms_floor};
}
inline MfCaseTol mf_tol_skip() {
  return MfCaseTol{MfCaseTol::kSkip, 0, 0};
}

// The tolerance of one written operand: `operand` is its name in the operand
// table, "experts" the per-expert weights, "*" every other one the kind writes.
struct MfCaseTolRule {
  const char *operand;
  MfCaseTol f32, bf16;  // with F32 storage, with BF16 storage
};

class MfCaseBuild;
struct MfCaseEntry;

// One call of one kind in one storage, with its operands' initial contents.
struct MfKernelCase {
  std::string name;       // "rmsnorm_fwd R=37 C=129 in_place=0 BF16"
  std::string data_name;  // the name without the storage: the seed of its values
  const MfCaseEntry *entry = nullptr;
  std::vector<int64_t> shape;
  mf_dtype storage = MF_DTYPE_F32;
  // kind, sizes, scalars; per operand its bytes and dtype (ptr NULL here; the
  // runner points them at each backend's copy).
  mf_kernel_call call = {};
  std::vector<uint8_t> ops[MF_KBUF_MAX];  // the initial contents of present operands
  bool present[MF_KBUF_MAX] = {};
  int alias[MF_KBUF_MAX];                     // >= 0: the same memory as that operand (in place); -1 its own
  std::vector<std::vector<uint8_t>> experts;  // the per-expert weights; empty: NULL
  bool has_experts = false;
  std::vector<std::string> errors;  // what the builder was asked and could not do
  MfKernelCase() {
    for (int &a : alias) a = -1;
  }
};

// One kind's entry in the table.
struct MfCaseEntry {
  mf_kernel kind;
  // NULL: the kind computes in F32 and in BF16 storage, and every shape runs
  // in both. Otherwise why one run (F32: the operands' fixed types) covers it.
  const char *one_storage;
  const char *shape_names;  // what each shape's numbers are, e.g. "T V H"
  std::vector<std::vector<int64_t>> shapes;
  void (*build)(MfCaseBuild &b, const std::vector<int64_t> &s);
  std::vector<MfCaseTolRule> tol;  // must hold a "*" rule
};

// What a case builder calls: operands by their names in the operand table.
class MfCaseBuild {
 public:
  MfCaseBuild(MfKernelCase *c, uint64_t seed);
  mf_dtype storage() const { return c_->storage; }
  std::mt19937_64 &rng() { return rng_; }

  MfCaseBuild &size(const char *name, int64_t v);
  MfCaseBuild &scalar(const char *name, double v);
  // Values of a FLOAT (in the storage dtype), F32 or F64 operand.
  MfCaseBuild &values(const char *name, const std::vector<float> &v);
  MfCaseBuild &uniform(const char *name, size_t n, float lo = -1.0f, float hi = 1.0f);
  MfCaseBuild &f64(const char *name, const std::vector<double> &v);
  MfCaseBuild &i32(const char *name, const std::vector<int32_t> &v);
  MfCaseBuild &i64(const char *name, const std::vector<int64_t> &v);
  MfCaseBuild &bytes(const char *name, const std::vector<uint8_t> &v);
  // An output of n elements: where the call only writes it, NaN (integers
  // -7), so an element one side leaves unwritten fails; where it reads it too
  // (added into, accumulate set), values in [-1, 1]. Set the sizes first.
  MfCaseBuild &out(const char *name, size_t n);
  // Operand `name` is operand `of`'s memory (in place), with its bytes.
  MfCaseBuild &alias(const char *name, const char *of);
  // E expert weights of n elements each, in [-1, 1] (NaN-free: EXPERT_BWD_WEIGHT
  // adds into them); those with null[e] NULL.
  MfCaseBuild &experts(int64_t E, size_t n, const std::vector<bool> &null);
  // Operand `name` holds these bytes, of dtype dt (inputs that follow from
  // another call's outputs).
  MfCaseBuild &raw(const char *name, const std::vector<uint8_t> &bytes, mf_dtype dt);
  // The case cannot be built as asked: mf_case_problems reports `why`.
  void fail(const std::string &why);

 private:
  int slot(const char *name);
  MfCaseBuild &put(int j, mf_dtype dt, std::vector<uint8_t> b);
  MfKernelCase *c_;
  std::mt19937_64 rng_;
};

// The table: one entry per kind it covers, in kind order.
const std::vector<MfCaseEntry> &mf_case_table();
// The kind's entry; NULL when the table has none.
const MfCaseEntry *mf_case_entry(mf_kernel k);
// Whether a kind has FLOAT operands or FLOAT expert weights (computes in a storage dtype).
bool mf_case_has_float(mf_kernel k);
// The storages an entry's cases are built in: {F32, BF16}, or {F32} for one_storage.
std::vector<mf_dtype> mf_case_storages(const MfCaseEntry &e);
// Shape `s` of entry `e` in `storage`.
MfKernelCase mf_case_make(const MfCaseEntry &e, size_t s, mf_dtype storage);
// Every case of kind k in `storage` (empty without an entry).
std::vector<MfKernelCase> mf_case_all(mf_kernel k, mf_dtype storage);
// The tolerance of operand `slot` of c (100: the expert weights).
MfCaseTol mf_case_tol(const MfKernelCase &c, int slot);

// What is wrong with c as a call: the builder's errors, a required operand
// absent, mf_kernel_call_check's refusal (dtypes, DEQUANT's sizes), operand
// bytes that differ from what the sizes make of them, integer operands out of
// range (ids, positions, routing maps, offsets, targets). Empty: a valid call.
std::vector<std::string> mf_case_problems(const MfKernelCase &c);
// Bytes the case's operands and experts take in a device arena placed at
// 256-byte boundaries.
size_t mf_case_arena_bytes(const MfKernelCase &c);

// The dtype of operand j of a call: as given, or its type's with F32 storage
// (U8 past the table's operands).
mf_dtype mf_case_dtype(const mf_kernel_call &k, int j);
// Bytes per element (1 for raw bytes).
size_t mf_case_elem_size(mf_dtype d);
// Element i of b as a double (bf16 widened, integers converted).
double mf_case_value(const std::vector<uint8_t> &b, mf_dtype d, size_t i);
// n values uniform in [lo, hi).
std::vector<float> mf_case_uniform(std::mt19937_64 &g, size_t n, float lo, float hi);

// Where a run's operands live (host vectors, a device arena).
class MfCaseMemory {
 public:
  virtual ~MfCaseMemory() = default;
  // A copy of `bytes` in the memory; NULL (and *why) when it cannot.
  virtual void *put(const std::vector<uint8_t> &bytes, std::string *why) = 0;
  // out->size() bytes from p (a pointer put returned).
  virtual bool get(const void *p, std::vector<uint8_t> *out, std::string *why) = 0;
  // Called once every operand is placed, before the call runs.
  virtual void placed() {}
};

// Host vectors, one per operand, of exactly its bytes (so ASan sees a
// kernel's read past an operand).
class MfCaseHostMemory : public MfCaseMemory {
 public:
  void *put(const std::vector<uint8_t> &bytes, std::string *why) override;
  bool get(const void *p, std::vector<uint8_t> *out, std::string *why) override;

 private:
  std::vector<std::vector<uint8_t>> held_;
};

// Every operand after a run: per slot (empty for an absent or aliased
// operand: its home slot holds it), then per expert (empty: NULL).
struct MfCaseOut {
  mf_status status = MF_OK;
  std::string error;  // why the run failed
  std::vector<uint8_t> ops[MF_KBUF_MAX];
  std::vector<std::vector<uint8_t>> experts;
  void *ptr[MF_KBUF_MAX] = {};  // where each operand was (aliases: their home's)
  std::vector<void *> expert_ptr;
};

// Puts c's operands into `mem`, runs c on backend b (stream s), waits and
// reads every operand back.
MfCaseOut mf_case_run(mf_backend *b, mf_stream *s, const MfKernelCase &c, MfCaseMemory *mem);

// The operands c writes (mf_kernel_writes; the experts when the kind writes
// them), `got` against `ref` with each operand's tolerance (exact: bit for
// bit, whatever the table says): one message per operand out of it, naming
// the case (kind, shape, storage), the operand and its worst element (the
// sides named rname and gname). Empty: everything within.
std::vector<std::string> mf_case_compare(const MfKernelCase &c, const MfCaseOut &ref, const MfCaseOut &got,
                                         bool exact = false, const char *rname = "cpu",
                                         const char *gname = "cuda");

#endif  // MF_TESTS_CUDA_TWIN_CASES_H
