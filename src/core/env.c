/* The MF_* environment variables: one table, read once (env.h).
 *
 * Reading and reporting are two steps. The read happens in pthread_once and
 * logs nothing; the report (a debug line per set variable, a warning per bad
 * value) follows it, outside the once, at the first use after. Logging is
 * configured from this table (MF_LOG, MF_LOG_SUBSYS): log.c reads it through
 * mf_env_string_unreported inside its own once, so a report that logs never
 * re-enters the log's configuration, and the report's debug lines are
 * filtered by the MF_LOG the table read. */
#include "src/core/env.h"

#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef enum kind { WORD, TEXT, NUMBER, BYTES, PAIR } kind;

enum {
  NOCASE = 1,    /* a word in any case */
  STRICT = 2,    /* a bad value is an error where used (mf_env_check), not a warning */
  TEST_ONLY = 4, /* read only in a test build */
};

typedef struct entry {
  mf_env_var var;
  kind kind;
  const char *words; /* WORD: "a|b" */
  double lo, hi;     /* NUMBER: the range, lo excluded when lo_open; BYTES: lo the least */
  int lo_open, whole;
  size_t max_len;        /* TEXT: the longest value */
  const char *otherwise; /* what a bad value leaves: "ignored", "logging at info" */
  unsigned flags;
} entry;

#define THE_WORDS(w) .kind = WORD, .words = w
#define WHOLE(a, b) .kind = NUMBER, .lo = (a), .hi = (b), .whole = 1
#define SECONDS(a, open, b) .kind = NUMBER, .lo = (a), .lo_open = (open), .hi = (b)

static const entry k_table[MF_ENV_COUNT_] = {
    [MF_ENV_LOG] = {{"MF_LOG", "a log level (error, warn, info, debug or trace)",
                     "the log level (default info)", 0},
                    THE_WORDS("error|warn|info|debug|trace"),
                    .otherwise = "logging at info",
                    .flags = NOCASE},
    [MF_ENV_LOG_SUBSYS] = {{"MF_LOG_SUBSYS", "a comma-separated list of subsystems of at most 508 characters",
                            "limits debug and trace output to these subsystems", 0},
                           .kind = TEXT,
                           .max_len = 508,
                           .otherwise = "logging every subsystem"},
    [MF_ENV_THREADS] = {{"MF_THREADS", "a number of threads (a whole number from 1 to 1024)",
                         "host worker threads (default: the online CPUs)", 0},
                        WHOLE(1, 1024),
                        .otherwise = "using the machine's online CPUs"},
    [MF_ENV_CPU_SIMD] = {{"MF_CPU_SIMD", "one of base", "base: cpu kernels without AVX2 (tests)", 0},
                         THE_WORDS("base"),
                         .otherwise = "ignored"},
    [MF_ENV_CPU_PROFILE] = {{"MF_CPU_PROFILE", "one of bundled",
                             "bundled: hardware.profile auto on cpu keeps the bundled profile (tests)", 0},
                            THE_WORDS("bundled"),
                            .otherwise = "ignored"},
    [MF_ENV_PROGRESS_AFTER] = {{"MF_PROGRESS_AFTER", "a number of seconds >= 0",
                                "seconds before a progress line shows on a terminal (tests)", 0},
                               SECONDS(0, 0, INFINITY),
                               .otherwise = "ignored"},
    [MF_ENV_PROGRESS_EVERY] = {{"MF_PROGRESS_EVERY", "a number of seconds >= 0",
                                "seconds between evaluation progress lines (default 2; 0: every batch)", 0},
                               SECONDS(0, 0, DBL_MAX),
                               .otherwise = "using 2"},
    [MF_ENV_HOST_MEMORY] = {{"MF_HOST_MEMORY", "a size above 0 such as 64GiB",
                             "the memory train and eval take the machine to have available (tests)", 0},
                            .kind = BYTES,
                            .lo = 1,
                            .otherwise = "it stands in for this machine's available memory",
                            .flags = STRICT},
    [MF_ENV_PLAN_SCORING] = {{"MF_PLAN_SCORING", "one of exact|proxy",
                              "score the planner's candidates on the full step or the proxy model", 0},
                             THE_WORDS("exact|proxy"),
                             .otherwise = "ignored"},
    [MF_ENV_EXPERT_GEMM] = {{"MF_EXPERT_GEMM", "one of mma|cutlass", "overrides kernels.expert_gemm",
                             0},
                            THE_WORDS("mma|cutlass"),
                            .otherwise = "ignored"},
    [MF_ENV_ATTENTION] = {{"MF_ATTENTION", "one of mma|cudnn", "overrides kernels.attention", 0},
                          THE_WORDS("mma|cudnn"),
                          .otherwise = "ignored"},
    [MF_ENV_COMM] = {{"MF_COMM", "one of mpi|none",
                      "the collectives between ranks (default: mpi under mpirun)", 0},
                     THE_WORDS("mpi|none"),
                     .otherwise = "ignored"},
    [MF_ENV_COMM_TIMEOUT_S] = {{"MF_COMM_TIMEOUT_S", "a number of seconds above 0",
                                "the longest a rank waits for another (default 600)", 0},
                               SECONDS(0, 1, INFINITY),
                               .otherwise = "waiting 600 s"},
    [MF_ENV_COMM_NODE_RANKS] = {{"MF_COMM_NODE_RANKS", "a number of ranks per node, 1 or more",
                                 "every K consecutive ranks of a machine are a node of their own (tests)", 0},
                                WHOLE(1, INT_MAX),
                                .otherwise = "every K consecutive ranks of a machine are taken for a node",
                                .flags = STRICT},
    [MF_ENV_INJECT_FAIL] = {{"MF_INJECT_FAIL", "RANK:STEP (two whole numbers)",
                             "rank RANK fails at the start of step STEP", 1},
                            .kind = PAIR,
                            .otherwise = "ignored",
                            .flags = TEST_ONLY},
    [MF_ENV_TEST_CKPT_PAUSE_MS] = {{"MF_TEST_CKPT_PAUSE_MS", "a whole number from 1 to 1000000",
                                    "sleep N ms after each file of a checkpoint", 1},
                                   WHOLE(1, 1000000),
                                   .otherwise = "ignored",
                                   .flags = TEST_ONLY},
    [MF_ENV_TEST_CKPT_ENOSPC] = {{"MF_TEST_CKPT_ENOSPC", "a whole number from 1 to 1000000",
                                  "the Nth checkpoint file written fails with ENOSPC", 1},
                                 WHOLE(1, 1000000),
                                 .otherwise = "ignored",
                                 .flags = TEST_ONLY},
    [MF_ENV_TEST_CKPT_NO_FILTER] = {{"MF_TEST_CKPT_NO_FILTER", "a whole number from 1 to 1000000",
                                     "zstd-N checkpoints without the byte-plane filter", 1},
                                    WHOLE(1, 1000000),
                                    .otherwise = "ignored",
                                    .flags = TEST_ONLY},
    [MF_ENV_TEST_SHM_FREE] = {{"MF_TEST_SHM_FREE", "a size in bytes such as 1048576 or 1GiB",
                               "the free bytes of the node-shared memory's file system", 1},
                              .kind = BYTES,
                              .lo = 0,
                              .otherwise = "ignored",
                              .flags = TEST_ONLY},
    [MF_ENV_TEST_EP_SELF] = {{"MF_TEST_EP_SELF", "1",
                              "a training program exchanges its experts' rows with its own rank (expert "
                              "parallelism's code on one rank)",
                              1},
                             WHOLE(1, 1),
                             .otherwise = "ignored",
                             .flags = TEST_ONLY},
};

typedef enum state { UNSET = 0, TAKEN, BAD, NOT_TEST_BUILD } state;

#define VALUE_CAP 512

typedef struct value {
  state st;
  char text[VALUE_CAP]; /* as set (cut at VALUE_CAP - 1: then BAD) */
  double number;
  uint64_t bytes;
  int64_t pair[2];
} value;

static value g_values[MF_ENV_COUNT_];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static atomic_int g_reported;

__attribute__((weak)) int mf_env_test_build(void) {
  return 0;
}

const mf_env_var *mf_env_var_of(int id) {
  return id >= 0 && id < MF_ENV_COUNT_ ? &k_table[id].var : NULL;
}

static int is_word(const entry *e, const char *v) {
  const size_t n = strlen(v);
  for (const char *w = e->words; *w;) {
    const char *bar = strchr(w, '|');
    const size_t len = bar ? (size_t)(bar - w) : strlen(w);
    if (len == n && ((e->flags & NOCASE) ? strncasecmp(w, v, n) : strncmp(w, v, n)) == 0) return 1;
    w += len + (bar != NULL);
  }
  return 0;
}

/* A whole number of the string (optional sign, digits, nothing after). */
static int parse_whole(const char *s, long long *out) {
  char *end = NULL;
  errno = 0;
  *out = strtoll(s, &end, 10);
  return !errno && end != s && *end == 0;
}

/* Parses v as entry e takes it into *out: 1 taken, 0 not. */
static int parse(const entry *e, const char *v, value *out) {
  switch (e->kind) {
    case WORD:
      return is_word(e, v);
    case TEXT:
      return strlen(v) <= e->max_len;
    case NUMBER: {
      double d;
      if (e->whole) {
        long long n;
        if (!parse_whole(v, &n)) return 0;
        d = (double)n;
      } else {
        char *end = NULL;
        errno = 0;
        d = strtod(v, &end);
        if (errno || end == v || *end || isnan(d)) return 0;
      }
      if (d < e->lo || (e->lo_open && d == e->lo) || d > e->hi) return 0;
      out->number = d;
      return 1;
    }
    case BYTES:
      return mf_parse_size(v, &out->bytes) == 0 && out->bytes >= (uint64_t)e->lo;
    case PAIR: {
      const char *colon = strchr(v, ':');
      if (!colon || colon == v) return 0;
      char first[32];
      if ((size_t)(colon - v) >= sizeof first) return 0;
      memcpy(first, v, (size_t)(colon - v));
      first[colon - v] = 0;
      long long a, b;
      if (!parse_whole(first, &a) || !parse_whole(colon + 1, &b)) return 0;
      out->pair[0] = a, out->pair[1] = b;
      return 1;
    }
  }
  return 0;
}

static void read_one(mf_env_id id, int test_build) {
  const entry *e = &k_table[id];
  value *v = &g_values[id];
  memset(v, 0, sizeof *v);
  const char *s = getenv(e->var.name);
  if (!s || !*s) return;
  snprintf(v->text, sizeof v->text, "%s", s);
  if ((e->flags & TEST_ONLY) && !test_build)
    v->st = NOT_TEST_BUILD;
  else
    v->st = strlen(s) < sizeof v->text && parse(e, v->text, v) ? TAKEN : BAD;
}

static void read_all(void) {
  const int test_build = mf_env_test_build();
  for (int i = 0; i < MF_ENV_COUNT_; i++) read_one((mf_env_id)i, test_build);
}

/* The "..." after a value cut at 80 characters in a message. */
static const char *cut(const value *v) {
  return strlen(v->text) > 80 ? "..." : "";
}

static void report(void) {
  for (int i = 0; i < MF_ENV_COUNT_; i++) {
    const entry *e = &k_table[i];
    const value *v = &g_values[i];
    switch (v->st) {
      case UNSET:
        break;
      case TAKEN:
        if (e->flags & TEST_ONLY)
          MF_LOGW("env", "%s=%.80s%s: a test-only hook is on", e->var.name, v->text, cut(v));
        else
          MF_LOGD("env", "%s=%.80s%s", e->var.name, v->text, cut(v));
        break;
      case BAD:
        if (e->flags & STRICT)
          MF_LOGD("env", "%s='%.80s%s' is not %s: an error where it is used", e->var.name, v->text, cut(v),
                  e->var.takes);
        else
          MF_LOGW("env", "%s='%.80s%s' is not %s: %s", e->var.name, v->text, cut(v), e->var.takes,
                  e->otherwise);
        break;
      case NOT_TEST_BUILD:
        MF_LOGW("env", "%s is a test-only hook and this moefit is not a test build: ignored", e->var.name);
        break;
    }
  }
}

static const value *get_unreported(mf_env_id id) {
  MF_ASSERT(id >= 0 && id < MF_ENV_COUNT_);
  pthread_once(&g_once, read_all);
  return &g_values[id];
}

static const value *get(mf_env_id id) {
  const value *v = get_unreported(id);
  if (!atomic_load_explicit(&g_reported, memory_order_acquire) && !atomic_exchange(&g_reported, 1)) report();
  return v;
}

const char *mf_env_string_unreported(mf_env_id id) {
  const value *v = get_unreported(id);
  return v->st == TAKEN ? v->text : NULL;
}

const char *mf_env_string(mf_env_id id) {
  const value *v = get(id);
  return v->st == TAKEN ? v->text : NULL;
}

int mf_env_number(mf_env_id id, double *out) {
  const value *v = get(id);
  MF_ASSERT(k_table[id].kind == NUMBER);
  if (v->st != TAKEN) return 0;
  *out = v->number;
  return 1;
}

int mf_env_bytes(mf_env_id id, uint64_t *out) {
  const value *v = get(id);
  MF_ASSERT(k_table[id].kind == BYTES);
  if (v->st != TAKEN) return 0;
  *out = v->bytes;
  return 1;
}

int mf_env_pair(mf_env_id id, int64_t out[2]) {
  const value *v = get(id);
  MF_ASSERT(k_table[id].kind == PAIR);
  if (v->st != TAKEN) return 0;
  out[0] = v->pair[0], out[1] = v->pair[1];
  return 1;
}

mf_status mf_env_check(mf_env_id id) {
  const value *v = get(id);
  const entry *e = &k_table[id];
  if (v->st != BAD || !(e->flags & STRICT)) return MF_OK;
  return MF_ERR(MF_ERR_CONFIG, "%s='%.80s%s' is not %s (%s)", e->var.name, v->text, cut(v), e->var.takes,
                e->otherwise);
}

void mf_env_reload(void) {
  pthread_once(&g_once, read_all);
  read_all();
  atomic_store(&g_reported, 0);
  (void)mf_env_string(MF_ENV_LOG); /* reported again */
}
