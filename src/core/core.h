/*
 * moefit core: status codes and errors, logging, dtypes and bf16/fp16 <-> fp32,
 * a thread pool with a fixed partition, arena allocators, and files: written
 * atomically (temporary file, fsync, rename), read whole or mapped.
 *
 * Errors: a fallible function returns mf_status. The first function to see a
 * fault records a message with its context (file, place, fault) through
 * MF_ERR(...); callers passing the status up with MF_CHECK add their file:line
 * to a trace. mf_last_error() gives the message, mf_last_error_trace() the trail.
 * Both are per thread. Library code never exits; the CLI turns a status into a
 * message and an exit code.
 */
#ifndef MF_CORE_H
#define MF_CORE_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- status */

typedef enum mf_status {
  MF_OK = 0,
  MF_ERR_INVALID_ARG,     /* a caller passed arguments that make no sense */
  MF_ERR_IO,              /* open/read/write/mmap failed */
  MF_ERR_FORMAT,          /* an input file is malformed */
  MF_ERR_CONFIG,          /* a config value is missing, mistyped or out of range */
  MF_ERR_OUT_OF_MEMORY,   /* host allocation failed or a budget is exceeded */
  MF_ERR_UNSUPPORTED,     /* valid input that moefit does not handle (yet) */
  MF_ERR_NOT_IMPLEMENTED, /* a part of moefit that is not built yet */
  MF_ERR_NO_DEVICE,       /* no usable GPU */
  MF_ERR_CUDA,
  MF_ERR_CUBLAS,
  MF_ERR_NCCL,
  MF_ERR_MPI,
  MF_ERR_INTERNAL, /* a broken invariant: a bug in moefit */
  MF_STATUS_COUNT_
} mf_status;

const char *mf_status_name(mf_status s);

/* Records `fmt` as this thread's last error (replacing the trace) and returns s.
 * Use through MF_ERR so file and line are filled in. */
mf_status mf_error_set(mf_status s, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Prefixes the current message with context ("reading x.safetensors: ..."). */
void mf_error_prefix(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Appends "file:line: expr" to this thread's error trace. */
void mf_error_trace(const char *file, int line, const char *expr);
const char *mf_last_error(void);
const char *mf_last_error_trace(void);
void mf_error_clear(void);

#define MF_ERR(status, ...) mf_error_set((status), __FILE__, __LINE__, __VA_ARGS__)

#define MF_CHECK(expr)                              \
  do {                                              \
    mf_status mf_s_ = (expr);                       \
    if (mf_s_ != MF_OK) {                           \
      mf_error_trace(__FILE__, __LINE__, #expr);    \
      return mf_s_;                                 \
    }                                               \
  } while (0)

/* Single-exit cleanup: `st` receives the status, control jumps to `label`. */
#define MF_CHECK_GOTO(expr, st, label)              \
  do {                                              \
    (st) = (expr);                                  \
    if ((st) != MF_OK) {                            \
      mf_error_trace(__FILE__, __LINE__, #expr);    \
      goto label;                                   \
    }                                               \
  } while (0)

/* For broken invariants only (never for bad input): logs and aborts. */
void mf_assert_fail(const char *file, int line, const char *expr) __attribute__((noreturn));
#define MF_ASSERT(cond) \
  do {                  \
    if (!(cond)) mf_assert_fail(__FILE__, __LINE__, #cond); \
  } while (0)

/* --------------------------------------------------------------- logging */

typedef enum mf_log_level {
  MF_LOG_ERROR = 0,
  MF_LOG_WARN = 1,
  MF_LOG_INFO = 2,
  MF_LOG_DEBUG = 3,
  MF_LOG_TRACE = 4,
} mf_log_level;

/* MF_LOG=error|warn|info|debug|trace sets the level (default info);
 * MF_LOG_SUBSYS=io,config,... limits debug/trace output to those subsystems
 * (errors, warnings and info always pass). Both come from the environment
 * table (src/core/env.h), applied at the first message; mf_log_configure
 * applies them again (after mf_env_reload, in tests) and has the table
 * reported (its warnings), which the CLI does first thing. */
void mf_log_configure(void);
void mf_log_set_level(mf_log_level level);
void mf_log_set_stream(FILE *f); /* default stderr */
int mf_log_enabled(mf_log_level level, const char *subsys);
void mf_log(mf_log_level level, const char *subsys, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define MF_LOGE(subsys, ...) mf_log(MF_LOG_ERROR, (subsys), __VA_ARGS__)
#define MF_LOGW(subsys, ...) mf_log(MF_LOG_WARN, (subsys), __VA_ARGS__)
#define MF_LOGI(subsys, ...) mf_log(MF_LOG_INFO, (subsys), __VA_ARGS__)
#define MF_LOGD(subsys, ...) mf_log(MF_LOG_DEBUG, (subsys), __VA_ARGS__)
#define MF_LOGT(subsys, ...) mf_log(MF_LOG_TRACE, (subsys), __VA_ARGS__)

/* Progress of long work for people at a terminal (planning a real-size
 * model): mf_progress_start(label, after) starts a reporter thread, when
 * stderr is a terminal, that from `after` seconds on rewrites one line on
 * stderr each second, "\r<label>: <what> (N s)", <what> being the last
 * mf_progress_note; mf_progress_stop ends it and wipes the line. Log lines
 * wipe it first (mf_progress_clear), the reporter writes it again at its
 * next second. Not on a terminal, all of it does nothing. MF_PROGRESS_AFTER
 * (seconds) replaces `after` (tests). Starts nest: an inner start/stop pair
 * (a plan made while planning) shares the outer one's line. */
void mf_progress_start(const char *label, double after_seconds);
void mf_progress_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void mf_progress_clear(void);
void mf_progress_stop(void);

/* ---------------------------------------------------------------- dtypes */

/* The dtypes a safetensors header names; F32/BF16/F16 are the ones computed with. */
typedef enum mf_dtype {
  MF_DTYPE_INVALID = 0,
  MF_DTYPE_BOOL,
  MF_DTYPE_U8,
  MF_DTYPE_I8,
  MF_DTYPE_I16,
  MF_DTYPE_U16,
  MF_DTYPE_F16,
  MF_DTYPE_BF16,
  MF_DTYPE_I32,
  MF_DTYPE_U32,
  MF_DTYPE_F32,
  MF_DTYPE_F64,
  MF_DTYPE_I64,
  MF_DTYPE_U64,
  MF_DTYPE_F8_E4M3,
  MF_DTYPE_F8_E5M2,
  MF_DTYPE_COUNT_
} mf_dtype;

size_t mf_dtype_size(mf_dtype t);        /* bytes per element; 0 for INVALID */
const char *mf_dtype_name(mf_dtype t);   /* safetensors spelling: "BF16" */
/* Parses the safetensors spelling (exact, case-sensitive); MF_DTYPE_INVALID if unknown. */
mf_dtype mf_dtype_from_name(const char *name, size_t len);

/* bf16: round to nearest even; NaN stays NaN (quiet, sign kept). */
static inline uint16_t mf_fp32_to_bf16(float f) {
  union { float f; uint32_t u; } v = {f};
  if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x0040u);
  uint32_t rounding = 0x7fffu + ((v.u >> 16) & 1u);
  return (uint16_t)((v.u + rounding) >> 16);
}

static inline float mf_bf16_to_fp32(uint16_t h) {
  union { uint32_t u; float f; } v = {(uint32_t)h << 16};
  return v.f;
}

/* IEEE binary16, round to nearest even; NaN kept, overflow to Inf, subnormals exact. */
uint16_t mf_fp32_to_fp16(float f);
float mf_fp16_to_fp32(uint16_t h);

void mf_fp32_to_bf16_n(const float *src, uint16_t *dst, size_t n);
void mf_bf16_to_fp32_n(const uint16_t *src, float *dst, size_t n);
void mf_fp16_to_fp32_n(const uint16_t *src, float *dst, size_t n);

/* ------------------------------------------------------- overflow checks */

/* a*b and a+b on sizes, reporting overflow instead of wrapping (returns 0 on overflow). */
static inline int mf_mul_size(size_t a, size_t b, size_t *out) {
  return !__builtin_mul_overflow(a, b, out);
}
static inline int mf_add_size(size_t a, size_t b, size_t *out) {
  return !__builtin_add_overflow(a, b, out);
}

/* splitmix64: the next of the sequence *x seeds (its state advanced); a fixed
 * algorithm, the same numbers on every platform. */
static inline uint64_t mf_splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* ---------------------------------------------------------- thread pool */

/* A fixed set of workers. mf_threadpool_run calls fn(ctx, i, n) for i in [0, n)
 * with n = the pool's thread count, the caller acting as worker 0, and returns
 * when all are done. The partition of work over i is the caller's, so results
 * can be made independent of timing. */
typedef struct mf_threadpool mf_threadpool;
typedef void (*mf_task_fn)(void *ctx, int i, int n);

/* n_threads <= 0: the number of online CPUs (or MF_THREADS when set). */
mf_status mf_threadpool_create(int n_threads, mf_threadpool **out);
void mf_threadpool_free(mf_threadpool *p); /* NULL is fine */
int mf_threadpool_size(const mf_threadpool *p);
void mf_threadpool_run(mf_threadpool *p, mf_task_fn fn, void *ctx);
/* [begin, end) of the i-th of n equal contiguous parts of [0, count), each part a
 * multiple of `grain` except the last. Deterministic. */
void mf_partition(size_t count, size_t grain, int i, int n, size_t *begin, size_t *end);

/* --------------------------------------------------------------- arenas */

/* A bump allocator over one block: sized once, allocated once, reset as a whole.
 * Either it owns its block (mf_arena_create) or it carves a caller's block
 * (mf_arena_init). */
typedef struct mf_arena {
  uint8_t *base;
  size_t size;
  size_t used;
  size_t peak;
  int owns;
} mf_arena;

mf_status mf_arena_create(mf_arena *a, size_t size, size_t align);
void mf_arena_init(mf_arena *a, void *block, size_t size);
void mf_arena_destroy(mf_arena *a); /* frees an owned block; a zeroed arena is fine */
/* Returns a block of `size` bytes aligned to `align` (a power of two), or
 * MF_ERR_OUT_OF_MEMORY naming `what` when the arena is full. */
mf_status mf_arena_alloc(mf_arena *a, size_t size, size_t align, const char *what, void **out);
void mf_arena_reset(mf_arena *a);
/* Bytes an arena needs for allocations of these sizes at this alignment. */
size_t mf_arena_estimate(const size_t *sizes, size_t n, size_t align);

/* ------------------------------------------------------- offset packing */

/* Static placement of blocks that come and go in a known order (the device
 * arena's slots, the staging arena's slabs): a block takes the smallest free
 * range that holds it (best fit), else extends a free range at the top, else
 * grows the top; a freed block's bytes merge with free neighbours. Blocks
 * alive at the same time never share bytes; `top` is the arena size needed.
 * O(free ranges) per call. A zeroed mf_packer is empty and ready. */
typedef struct mf_packer {
  size_t *off, *len; /* free ranges below top, sorted by offset */
  int32_t n, cap;
  size_t top;
} mf_packer;

size_t mf_packer_take(mf_packer *p, size_t bytes); /* the new block's offset */
/* Gives [off, off + bytes) back; MF_ERR_OUT_OF_MEMORY naming `what` when the free list cannot grow. */
mf_status mf_packer_give(mf_packer *p, size_t off, size_t bytes, const char *what);
void mf_packer_free(mf_packer *p);

/* ------------------------------------------------------------ utilities */

/* Allocation wrappers that record an MF_ERR_OUT_OF_MEMORY naming `what`. */
mf_status mf_malloc(size_t size, const char *what, void **out);
mf_status mf_calloc(size_t count, size_t size, const char *what, void **out);
char *mf_strdup(const char *s); /* NULL on failure */

/* Parses a byte size: "24GiB", "512MiB", "1.5GB", "4096", "8k". Binary units
 * (KiB, MiB, GiB, TiB and K/M/G/T) are powers of 1024; KB/MB/GB/TB are powers
 * of 1000. Returns 0 and sets *out on success, -1 on a malformed or
 * overflowing size. */
int mf_parse_size(const char *s, uint64_t *out);
/* Formats bytes for people: "1.50 GiB" (binary units, two decimals; "12 B"
 * below 1 KiB; never "1024.00 KiB"). buf of at least 32 bytes. */
const char *mf_format_bytes(uint64_t bytes, char *buf, size_t cap);
/* Formats a count or a rate for people with three significant digits and
 * decimal units: "950", "1.00K", "12.3K", "452K", "1.27B", "46.7B" (K = 10^3,
 * M = 10^6, B = 10^9, T = 10^12; "1000T" and up stay in T). Below 1000 it is
 * the value rounded to a whole number; negative values keep their sign; NaN
 * and infinities give "-". Parameters, tokens, tokens/s: wherever people read
 * a count. buf of at least 32 bytes. */
const char *mf_format_count(double n, char *buf, size_t cap);

/* The byte offset of the first invalid UTF-8 sequence in s[0, len), or len
 * when all of it is valid. */
size_t mf_utf8_invalid_at(const void *s, size_t len);

/* Monotonic seconds. */
double mf_time_now(void);

/* ---------------------------------------------------------- text tables */

/* A table for people: every column as wide as its widest cell (the header
 * row's included), each right- or left-aligned as the column says, two spaces
 * between columns, no trailing spaces. Group labels over runs of columns
 * ("weights" over "res" and "stream") go on a line of their own above the
 * first row, centred over their columns (which widen to fit the label). Cells
 * are added row by row: a row ends after its last column's cell. Allocation
 * failures stick and are reported by mf_table_print.
 *
 *   mf_table *t; mf_table_create("lrr", &t);
 *   mf_table_cell(t, "plan"); mf_table_cell(t, "arena"); mf_table_cell(t, "step s");
 *   mf_table_cell(t, "chosen"); mf_table_cell(t, "%s", bytes); mf_table_cell(t, "%.4f", s);
 *   mf_table_print(t, stdout, "  "); mf_table_free(t);
 */
typedef struct mf_table mf_table;
/* align: one 'l' or 'r' per column ("lrrrl"); MF_ERR_INVALID_ARG otherwise. */
mf_status mf_table_create(const char *align, mf_table **out);
void mf_table_group(mf_table *t, int first_col, int n_cols, const char *label);
void mf_table_cell(mf_table *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Every row, each line after `indent`; MF_ERR_IO when `out` reports an error. */
mf_status mf_table_print(mf_table *t, FILE *out, const char *indent);
void mf_table_free(mf_table *t); /* NULL is fine */

/* ---------------------------------------------------------- atomic files */

/* A file that appears at its path whole or not at all. It is written as
 * PATH.tmp beside the target (so the rename stays on one filesystem), then
 * commit fsyncs it, renames it over PATH and fsyncs the directory. Until the
 * rename PATH is untouched; abort, or a failed write or commit, removes
 * PATH.tmp. open removes a stale PATH.tmp (a crashed writer's) and creates its
 * own exclusively, so a link planted under that name is never followed; commit
 * renames only the file it created, so a second writer of the same PATH
 * (which removed this one's PATH.tmp) makes this commit fail, not publish the
 * other's half-written file. Every message names the file, the failing call
 * and strerror. */
typedef struct mf_atomic_file mf_atomic_file;

mf_status mf_atomic_file_open(const char *path, mf_atomic_file **out);
/* All n bytes at the current offset (loops on short writes and EINTR). */
mf_status mf_atomic_file_write(mf_atomic_file *f, const void *data, size_t n);
/* The temporary file's descriptor, for pwrite/lseek (-1 after sync). */
int mf_atomic_file_fd(const mf_atomic_file *f);
const char *mf_atomic_file_tmp_path(const mf_atomic_file *f); /* PATH.tmp, for messages */
/* fsync and close now; commit then only renames. For a set of files that must
 * all be complete before the first of them appears (and that would otherwise
 * hold one descriptor each). */
mf_status mf_atomic_file_sync(mf_atomic_file *f);
/* fsync, close, rename over PATH, fsync the directory (a failure of that last
 * step is only a warning: the file is in place). Frees f, failing or not; on
 * failure PATH is as it was. A file whose write or sync failed is not renamed. */
mf_status mf_atomic_file_commit(mf_atomic_file *f);
/* Closes and removes PATH.tmp and frees f. NULL is fine. */
void mf_atomic_file_abort(mf_atomic_file *f);

/* open + write + commit. */
mf_status mf_write_file_atomic(const char *path, const void *data, size_t n);
/* mkdir -p: creates dir and its missing parents (0777 & ~umask). */
mf_status mf_mkdir_p(const char *dir);
/* Creates the missing directories above a file's path ("a/b/c.txt": a and a/b). */
mf_status mf_mkdir_parents(const char *path);

/* Writes all n bytes to fd (loops on short writes and EINTR); a failure is
 * MF_ERR_IO naming `path`. */
mf_status mf_write_all(int fd, const char *path, const void *data, size_t n);

/* ---------------------------------------------------------- reading files */

/* Opens `path` read-only (following links) as a regular file: *fd (close it)
 * and *size (may be NULL). Anything else a user could put at the path is
 * refused at once, never waited on: a FIFO (opening one for reading waits for
 * a writer, forever), a device, a socket, a directory: MF_ERR_IO "PATH: not a
 * regular file but a FIFO (named pipe); WHAT is read only from a regular
 * file" (`what`, e.g. "a plan", may be NULL). A path that cannot be stat'ed
 * or opened is MF_ERR_IO "PATH: cannot open: strerror"; *err (may be NULL)
 * gets that errno (ENOENT: no such file), else 0. Every reader of a file a
 * user names opens it through here (or mf_read_file / mf_map_file). */
mf_status mf_open_regular(const char *path, const char *what, int *fd, uint64_t *size, int *err);
/* "a directory", "a FIFO (named pipe)", "a socket", ... of a st_mode. */
const char *mf_file_kind(unsigned mode);

/* Reads the whole regular file `path` into a malloc'ed buffer, NUL-terminated
 * (the caller frees it; *len excludes the NUL). A file larger than max_bytes
 * is MF_ERR_FORMAT "PATH: N bytes is too large for WHAT (at most MAX)"; a path
 * that cannot be opened, stat'ed or read, or that is not a regular file (as
 * mf_open_regular), is MF_ERR_IO. A file that shrinks while it is read gives what was there. */
mf_status mf_read_file(const char *path, size_t max_bytes, const char *what, char **out, size_t *len);

/* Maps the regular file `path` read-only and private (opened as
 * mf_open_regular does, so a FIFO is refused, not waited on). An empty file gives
 * *base NULL and *size 0 (nothing is mapped). Failures are MF_ERR_IO naming
 * the path and the call; *err (may be NULL) gets the errno of a failed open
 * or fstat (ENOENT: no such file), else 0. */
mf_status mf_map_file(const char *path, const uint8_t **base, size_t *size, int *err);
void mf_unmap_file(const void *base, size_t size); /* NULL or 0 bytes is fine */


/* ------------------------------------------------------- stop requests */

/* A request to stop a long run cleanly (SIGINT, SIGTERM): the command line
 * installs the handlers and the handler calls mf_stop_request, which only
 * stores the signal number in a volatile sig_atomic_t (async-signal-safe).
 * Long loops (the training steps, an evaluation pass) read it between steps
 * and stop at the next safe point; library code never exits on it. */
void mf_stop_request(int signo);
int mf_stop_requested(void); /* the signal number of the first request, or 0 */
void mf_stop_clear(void);
/* "SIGINT", "SIGTERM", "SIGUSR1", else "signal N" (a static string for those three). */
const char *mf_stop_signal_name(int signo, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif

#endif /* MF_CORE_H */
