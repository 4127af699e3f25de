/*
 * The MF_* environment variables moefit reads: one table (src/core/env.c)
 * naming each, what it takes and what it does. Every variable is read once,
 * at the first use of any of them, into the table; callers ask the table by
 * id, never getenv. A set variable is logged at debug level (subsystem "env")
 * with the value taken; a value a variable does not take is warned about
 * once and ignored (read as unset) — except the two marked "an error where
 * used" below, which mf_env_check turns into MF_ERR_CONFIG.
 *
 * Test-only hooks (MF_INJECT_FAIL, MF_TEST_*) are read only in a test build
 * (a binary linked with //src/core:test_build: every test, //:moefit_test);
 * elsewhere a set one is warned about once and ignored.
 */
#ifndef MF_CORE_ENV_H
#define MF_CORE_ENV_H

#include <stdint.h>

#include "src/core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mf_env_id {
  MF_ENV_LOG,             /* error|warn|info|debug|trace (any case) */
  MF_ENV_LOG_SUBSYS,      /* text: io,config,... */
  MF_ENV_THREADS,         /* number: 1 to 1024 */
  MF_ENV_CPU_SIMD,        /* word: base */
  MF_ENV_CPU_PROFILE,     /* word: bundled */
  MF_ENV_PROGRESS_AFTER,  /* number: seconds >= 0 */
  MF_ENV_PROGRESS_EVERY,  /* number: seconds >= 0 */
  MF_ENV_HOST_MEMORY,     /* bytes: a size above 0; an error where used */
  MF_ENV_PLAN_SCORING,    /* word: exact|proxy */
  MF_ENV_EXPERT_GEMM,     /* word: mma|cutlass */
  MF_ENV_ATTENTION,       /* word: mma|cudnn */
  MF_ENV_COMM,            /* word: mpi|none */
  MF_ENV_COMM_TIMEOUT_S,  /* number: seconds above 0 */
  MF_ENV_COMM_NODE_RANKS, /* number: 1 or more; an error where used */
  /* Test-only hooks. */
  MF_ENV_INJECT_FAIL,         /* pair: RANK:STEP */
  MF_ENV_TEST_CKPT_PAUSE_MS,  /* number: 1 to 1000000 */
  MF_ENV_TEST_CKPT_ENOSPC,    /* number: 1 to 1000000 */
  MF_ENV_TEST_CKPT_NO_FILTER, /* number: 1 to 1000000 */
  MF_ENV_TEST_SHM_FREE,       /* bytes: a size */
  MF_ENV_TEST_EP_SELF,        /* number: 1 */
  MF_ENV_COUNT_
} mf_env_id;

/* A row of the table, for listing it (docs, tests). */
typedef struct mf_env_var {
  const char *name;  /* "MF_ATTENTION" */
  const char *takes; /* what it takes, as warnings say it: "one of mma|cudnn" */
  const char *does;  /* one line */
  int test_only;     /* read only in a test build */
} mf_env_var;

/* Row `id` of the table; NULL outside 0 .. MF_ENV_COUNT_-1. */
const mf_env_var *mf_env_var_of(int id);

/* The value of a set variable as it was taken (a word variable: the word),
 * NULL when unset, refused or ignored. Any kind of variable. */
const char *mf_env_string(mf_env_id id);
/* A number variable (whole numbers and seconds): 1 and *v when set to a
 * value it takes, else 0 (*v untouched). */
int mf_env_number(mf_env_id id, double *v);
/* A byte-size variable ("64GiB", "1000"): as mf_env_number. */
int mf_env_bytes(mf_env_id id, uint64_t *v);
/* A pair variable ("RANK:STEP"): as mf_env_number, v[0] and v[1]. */
int mf_env_pair(mf_env_id id, int64_t v[2]);
/* For the variables whose bad value is an error where used (MF_HOST_MEMORY,
 * MF_COMM_NODE_RANKS): MF_ERR_CONFIG naming it, the value and what it takes
 * when it is set to a value it does not take; else (and for any other
 * variable) MF_OK. */
mf_status mf_env_check(mf_env_id id);

/* For tests: reads every variable again (a test that setenv()s an MF_
 * variable between calls) and reports them as at the first read. Logging
 * applies the new MF_LOG / MF_LOG_SUBSYS at mf_log_configure (a level set by
 * mf_log_set_level stays until then). Call it while no other thread uses
 * the table. */
void mf_env_reload(void);

/* 1 in a test build, else 0: env.c's weak definition returns 0,
 * //src/core:test_build (src/core/test_build.c) a strong one returning 1. */
int mf_env_test_build(void);

/* For src/core/log.c only, which configures logging from the table: as
 * mf_env_string without reporting the table (its report logs). */
const char *mf_env_string_unreported(mf_env_id id);

#ifdef __cplusplus
}
#endif

#endif /* MF_CORE_ENV_H */
