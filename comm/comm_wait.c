/* Waiting for other ranks, with a deadline (comm_internal.h). A blocking MPI
 * call cannot time out: a rank that stopped (SIGSTOP, a stuck machine) or
 * hangs would keep the others in it for ever. So every wait between ranks is
 * polled against MF_COMM_TIMEOUT_S — MPI's non-blocking collectives tested,
 * counters in the node's shared memory read — and when the deadline passes
 * the wait fails with an error that names the ranks it waited for; the
 * caller ends the job (moefit train: mf_comm_fail_agree, then MPI_Abort).
 *
 * The node's board says how far each of its ranks has come: a slot a local
 * rank with its counts of the node's and of the world's collectives, which
 * each rank raises as it enters one. The node barrier is the board itself
 * (a rank waits until every count has reached its own). */
#include <errno.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm_internal.h"
#include "src/core/env.h"

#define MF_COMM_DEFAULT_TIMEOUT_S 600.0

_Static_assert(sizeof(mf_comm_slot) == 64, "a board slot is one cache line");

double mf_comm_timeout_from_env(void) {
  double v = MF_COMM_DEFAULT_TIMEOUT_S; /* src/core/env.c's warning says "waiting 600 s" */
  (void)mf_env_number(MF_ENV_COMM_TIMEOUT_S, &v);
  return v;
}

/* ---------------------------------------------------------------- polling */

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

void mf_comm_poll_start(mf_comm_poll *p, double timeout_s, int heavy) {
  p->t0 = p->last = mf_time_now();
  p->timeout_s = timeout_s;
  p->spins = 0;
  p->sleep_ns = 1000;
  p->heavy = heavy;
}

int mf_comm_poll_next(mf_comm_poll *p) {
  const unsigned k = p->spins++;
  if (k < 400) { /* about 10 us: the usual wait, for a rank a moment behind */
    cpu_relax();
    return 1;
  }
  const double now = mf_time_now();
  /* Polls come 10 ms apart at most: a longer gap is this rank stopped
   * itself (SIGSTOP, then SIGCONT), which is not the others' delay. */
  if (now - p->last > 0.5) p->t0 += now - p->last;
  p->last = now;
  const double waited = now - p->t0;
  if (waited > p->timeout_s) return 0;
  if (k < 400 + 50 || (p->heavy && waited < 1.0)) {
    sched_yield();
  } else {
    const struct timespec ts = {0, p->sleep_ns};
    nanosleep(&ts, NULL);
    /* Up to 1 ms a poll; after a second, 10 ms (a wait that long is for a
     * rank busy elsewhere: a few ms later makes no difference), unless the
     * wait moves data. */
    const long cap = p->heavy || waited < 1.0 ? 1000000 : 10000000;
    p->sleep_ns = p->sleep_ns * 2 < cap ? p->sleep_ns * 2 : cap;
  }
  return 1;
}

/* ------------------------------------------------------------------ names */

/* What /proc says of process pid: "stopped by a signal", ..., or NULL. */
static const char *process_state(int64_t pid) {
  if (pid <= 0) return NULL;
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%lld/stat", (long long)pid);
  FILE *f = fopen(path, "r");
  if (!f) return "gone";
  const size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  const char *paren = strrchr(buf, ')'); /* the command's name may hold spaces and parentheses */
  if (!paren || paren[1] != ' ') return NULL;
  switch (paren[2]) {
    case 'R':
      return "running";
    case 'S':
      return "sleeping";
    case 'D':
      return "waiting in the kernel (I/O)";
    case 'T':
      return "stopped by a signal";
    case 't':
      return "stopped by a debugger";
    case 'Z':
    case 'X':
      return "gone";
    default:
      return NULL;
  }
}

void mf_comm_describe_local(const mf_comm *c, int lr, char *out, size_t cap) {
  if (!c->board || lr < 0 || lr >= c->local_size) {
    snprintf(out, cap, "local rank %d", lr);
    return;
  }
  const mf_comm_slot *s = &c->board[lr];
  const char *state = process_state(s->pid);
  snprintf(out, cap, "rank %lld (local rank %d, pid %lld%s%s)", (long long)s->rank, lr, (long long)s->pid,
           state ? ", " : "", state ? state : "");
}

/* printf onto the end of out (of cap bytes, *len used). */
static void __attribute__((format(printf, 4, 5)))
add(char *out, size_t cap, size_t *len, const char *fmt, ...) {
  if (*len + 1 >= cap) return;
  va_list ap;
  va_start(ap, fmt);
  const int n = vsnprintf(out + *len, cap - *len, fmt, ap);
  va_end(ap);
  if (n > 0) *len += (size_t)n < cap - *len ? (size_t)n : cap - *len - 1;
}

/* The other ranks of this node whose count of `scope`'s calls is below
 * ticket (INT64_MAX: all of them): described into out; their number. */
static int late_on_node(const mf_comm *c, mf_comm_scope scope, int64_t ticket, char *out, size_t cap,
                        size_t *len) {
  int late = 0;
  for (int lr = 0; c->board && lr < c->local_size; lr++) {
    if (lr == c->local_rank) continue;
    const mf_comm_slot *s = &c->board[lr];
    const int64_t at =
        atomic_load_explicit(scope == MF_COMM_NODE ? &s->node_calls : &s->world_calls, memory_order_acquire);
    if (at >= ticket) continue;
    char one[160];
    mf_comm_describe_local(c, lr, one, sizeof one);
    add(out, cap, len, "%s%s", late ? ", " : "", one);
    late++;
  }
  return late;
}

/* Is world rank r one of this node's? */
static int on_node(const mf_comm *c, int r) {
  for (int lr = 0; c->board && lr < c->local_size; lr++)
    if (c->board[lr].rank == r) return 1;
  return !c->board && r == c->rank;
}

/* "ranks 2, 3, 5 (on other nodes)": the world's ranks outside this node (at
 * most 16 named). */
static void others(const mf_comm *c, char *out, size_t cap, size_t *len) {
  int n = 0;
  for (int r = 0; r < c->size; r++) n += !on_node(c, r);
  add(out, cap, len, "%s", n == 1 ? "rank " : "ranks ");
  int said = 0;
  for (int r = 0; r < c->size && said < 16; r++)
    if (!on_node(c, r)) add(out, cap, len, "%s%d", said++ ? ", " : "", r);
  if (n > said) add(out, cap, len, " and %d more", n - said);
  add(out, cap, len, " (on other nodes)");
}

mf_status mf_comm_timed_out(mf_comm *c, mf_comm_scope scope, int64_t ticket, const char *where,
                            const char *file, int line) {
  char who[1536];
  size_t len = 0;
  who[0] = 0;
  if (scope == MF_COMM_LEADERS) {
    add(who, sizeof who, &len, "the other nodes' leaders (");
    int said = 0;
    for (int k = 0; k < c->nodes && c->leader_ranks; k++)
      if (k != c->node) add(who, sizeof who, &len, "%srank %d", said++ ? ", " : "", c->leader_ranks[k]);
    add(who, sizeof who, &len, ")");
  } else if (!late_on_node(c, scope, ticket, who, sizeof who, &len)) {
    /* Every rank of the node has come: the late ones are elsewhere, or one
     * came and stopped inside the call. */
    if (scope == MF_COMM_WORLD && c->nodes > 1)
      others(c, who, sizeof who, &len);
    else
      late_on_node(c, scope, INT64_MAX, who, sizeof who, &len);
  }
  const mf_status st = mf_error_set(MF_ERR_MPI, file, line,
                                    "comm: waited %g s for %s %s: it stopped or hangs (MF_COMM_TIMEOUT_S)",
                                    c->timeout_s, who, where);
  snprintf(c->late_why, sizeof c->late_why, "%s", mf_last_error());
  return st;
}

/* ------------------------------------------------------- MPI collectives */

mf_status mf_comm_stage_reserve(mf_comm *c, size_t bytes) {
  if (c->stage_n >= bytes) return MF_OK;
  void *s = realloc(c->stage, bytes);
  if (!s) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "comm: out of memory for a buffer of %zu bytes", bytes);
  c->stage = s;
  c->stage_n = bytes;
  return MF_OK;
}

mf_status mf_comm_enter(mf_comm *c, mf_comm_scope scope, int64_t *ticket) {
  *ticket = 0;
  if (c->late_why[0])
    return MF_ERR(MF_ERR_MPI,
                  "comm: this rank's collectives are out of step since an earlier wait timed out (%s)",
                  c->late_why);
  if (scope == MF_COMM_LEADERS) return MF_OK; /* the board is the node's: nothing of the leaders' on it */
  int64_t *mine = scope == MF_COMM_NODE ? &c->node_calls : &c->world_calls;
  *ticket = ++*mine;
  if (c->board) {
    mf_comm_slot *s = &c->board[c->local_rank];
    atomic_store_explicit(scope == MF_COMM_NODE ? &s->node_calls : &s->world_calls, *ticket,
                          memory_order_release);
  }
  return MF_OK;
}

/* Inside mf_comm_barrier_solo, past the deadline: whether the root works on
 * (a process of this node, running, sleeping or in I/O), said in one line;
 * else 0, and the wait times out. since: when the wait began. */
static int solo_root_alive(const mf_comm *c, double since) {
  if (!c->solo || c->solo_root == c->rank) return 0;
  for (int lr = 0; c->board && lr < c->local_size; lr++) {
    if (c->board[lr].rank != c->solo_root) continue;
    const char *state = process_state(c->board[lr].pid);
    if (!state || (strcmp(state, "running") && strcmp(state, "sleeping") && strncmp(state, "waiting", 7)))
      return 0;
    MF_LOGI("comm", "rank %d of %d: still waiting for rank %d (pid %lld, %s), %s alone, after %.0f s",
            c->rank, c->size, c->solo_root, (long long)c->board[lr].pid, state, c->solo_what,
            mf_time_now() - since);
    return 1;
  }
  return 0;
}

mf_status mf_comm_finish(mf_comm *c, MPI_Request *rq, mf_comm_scope scope, int64_t ticket, int heavy,
                         mf_comm_buffer buf, const char *where) {
  return mf_comm_finish_status(c, rq, scope, ticket, heavy, buf, where, NULL);
}

mf_status mf_comm_finish_status(mf_comm *c, MPI_Request *rq, mf_comm_scope scope, int64_t ticket, int heavy,
                                mf_comm_buffer buf, const char *where, MPI_Status *status) {
  mf_comm_poll p;
  const double since = mf_time_now();
  mf_comm_poll_start(&p, c->timeout_s, heavy);
  for (;;) {
    int done = 0;
    const int rc = MPI_Test(rq, &done, status ? status : MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return mf_comm_mpi_error(rc, __FILE__, __LINE__, where);
    if (done) return MF_OK;
    if (mf_comm_poll_next(&p)) continue;
    if (!solo_root_alive(c, since)) break;
    mf_comm_poll_start(&p, c->timeout_s, heavy); /* a root at work: another period */
  }
  const mf_status st = mf_comm_timed_out(c, scope, ticket, where, __FILE__, __LINE__);
  c->late_rq = *rq;
  *rq = MPI_REQUEST_NULL;
  if (buf == MF_COMM_STAGE) {
    c->late_buf = c->stage;
    c->stage = NULL;
    c->stage_n = 0;
  } else if (buf == MF_COMM_SCRATCH) {
    c->late_buf = c->scratch;
    c->scratch = NULL;
    c->scratch_n = 0;
  }
  return st;
}

mf_status mf_comm_wait_until(mf_comm *c, int (*done)(void *ctx, mf_status *st), void *ctx, const char *what) {
  mf_comm_poll p;
  mf_comm_poll_start(&p, c->timeout_s, 1); /* it is usually a GPU a moment from done: yield, not sleep */
  for (;;) {
    mf_status st = MF_OK;
    if (done(ctx, &st)) return st;
    if (!mf_comm_poll_next(&p)) break;
  }
  return MF_ERR(MF_ERR_MPI, "comm: waited %g s for %s: another rank stopped or hangs (MF_COMM_TIMEOUT_S)",
                c->timeout_s, what);
}
