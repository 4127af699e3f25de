/* mf_comm over MPI (Open MPI from Debian). */
#include <limits.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"

#define MF_MPI_CHECK(call)                                                                        \
  do {                                                                                            \
    int mf_rc_ = (call);                                                                          \
    if (mf_rc_ != MPI_SUCCESS) {                                                                  \
      char mf_msg_[MPI_MAX_ERROR_STRING];                                                         \
      int mf_len_ = 0;                                                                            \
      MPI_Error_string(mf_rc_, mf_msg_, &mf_len_);                                                \
      return mf_error_set(MF_ERR_MPI, __FILE__, __LINE__, "%s failed: %s", #call, mf_msg_);       \
    }                                                                                             \
  } while (0)

struct mf_comm {
  int rank, size, local_rank, local_size;
  int mpi;          /* MPI is in use */
  int we_init;      /* we called MPI_Init, so we finalize */
  MPI_Comm world;   /* a dup of MPI_COMM_WORLD */
  float *scratch;   /* allreduce gather buffer, grown when needed (outside step loops) */
  size_t scratch_n;
};

static int launched_by_mpirun(void) {
  const char *force = mf_env_word("MF_COMM", "mpi|none");
  if (force && strcmp(force, "mpi") == 0) return 1;
  if (force && strcmp(force, "none") == 0) return 0;
  return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK");
}

mf_status mf_comm_init(int *argc, char ***argv, mf_comm **out) {
  *out = NULL;
  mf_comm *c = (mf_comm *)calloc(1, sizeof *c);
  if (!c) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "comm: out of memory");
  c->size = c->local_size = 1;
  if (!launched_by_mpirun()) {
    *out = c;
    return MF_OK;
  }
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    int provided = 0;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
      free(c);
      return MF_ERR(MF_ERR_MPI, "comm: MPI_Init_thread failed (was this process started by mpirun?)");
    }
    c->we_init = 1;
  }
  c->mpi = 1;
  mf_status st = MF_OK;
#define TRY(call)                                                   \
  do {                                                              \
    if ((call) != MPI_SUCCESS) {                                    \
      st = MF_ERR(MF_ERR_MPI, "comm: %s failed", #call);            \
      goto fail;                                                    \
    }                                                               \
  } while (0)
  TRY(MPI_Comm_dup(MPI_COMM_WORLD, &c->world));
  TRY(MPI_Comm_rank(c->world, &c->rank));
  TRY(MPI_Comm_size(c->world, &c->size));
  MPI_Comm node;
  TRY(MPI_Comm_split_type(c->world, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &node));
  MPI_Comm_rank(node, &c->local_rank);
  MPI_Comm_size(node, &c->local_size);
  MPI_Comm_free(&node);
#undef TRY
  *out = c;
  return MF_OK;
fail:
  mf_comm_free(c);
  return st;
}

void mf_comm_free(mf_comm *c) {
  if (!c) return;
  if (c->mpi && c->world != MPI_COMM_NULL && c->world) MPI_Comm_free(&c->world);
  if (c->we_init) {
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Finalize();
  }
  free(c->scratch);
  free(c);
}

int mf_comm_rank(const mf_comm *c) { return c->rank; }
int mf_comm_size(const mf_comm *c) { return c->size; }
int mf_comm_local_rank(const mf_comm *c) { return c->local_rank; }
int mf_comm_local_size(const mf_comm *c) { return c->local_size; }
int mf_comm_uses_mpi(const mf_comm *c) { return c->mpi; }

mf_status mf_comm_barrier(mf_comm *c) {
  if (!c->mpi) return MF_OK;
  MF_MPI_CHECK(MPI_Barrier(c->world));
  return MF_OK;
}

/* MPI counts are int: move large buffers in pieces. */
#define MF_MPI_CHUNK ((size_t)1 << 30)

mf_status mf_comm_broadcast(mf_comm *c, void *buf, size_t bytes, int root) {
  if (root < 0 || root >= c->size) return MF_ERR(MF_ERR_INVALID_ARG, "comm: broadcast root %d of %d ranks", root, c->size);
  if (!c->mpi) return MF_OK;
  for (size_t off = 0; off < bytes; off += MF_MPI_CHUNK) {
    size_t n = bytes - off < MF_MPI_CHUNK ? bytes - off : MF_MPI_CHUNK;
    MF_MPI_CHECK(MPI_Bcast((char *)buf + off, (int)n, MPI_BYTE, root, c->world));
  }
  return MF_OK;
}

mf_status mf_comm_allreduce_sum_f32(mf_comm *c, float *buf, size_t n) {
  if (!c->mpi || c->size == 1 || n == 0) return MF_OK;
  /* Gather every rank's vector (in chunks) and add in rank order everywhere, so
   * all ranks hold the same bits whatever algorithm MPI would pick. */
  const size_t chunk = MF_MPI_CHUNK / sizeof(float) / (size_t)c->size;
  size_t need = chunk * (size_t)c->size;
  if (n < chunk) need = n * (size_t)c->size;
  if (c->scratch_n < need) {
    float *s = (float *)realloc(c->scratch, need * sizeof(float));
    if (!s) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "comm: out of memory for an allreduce of %zu floats", n);
    c->scratch = s;
    c->scratch_n = need;
  }
  for (size_t off = 0; off < n; off += chunk) {
    size_t m = n - off < chunk ? n - off : chunk;
    MF_MPI_CHECK(MPI_Allgather(buf + off, (int)m, MPI_FLOAT, c->scratch, (int)m, MPI_FLOAT, c->world));
    for (size_t i = 0; i < m; i++) {
      float s = c->scratch[i];
      for (int r = 1; r < c->size; r++) s += c->scratch[(size_t)r * m + i];
      buf[off + i] = s;
    }
  }
  return MF_OK;
}

mf_status mf_comm_allreduce_max_i64(mf_comm *c, int64_t *buf, size_t n) {
  if (!c->mpi || c->size == 1) return MF_OK;
  if (n > INT_MAX) return MF_ERR(MF_ERR_INVALID_ARG, "comm: max-allreduce of %zu values is too large", n);
  MF_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_INT64_T, MPI_MAX, c->world));
  return MF_OK;
}
