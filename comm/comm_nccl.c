/* NCCL between the ranks' GPUs (comm_nccl.h). libnccl is loaded at run time
 * (dlopen), like cuDNN: a binary built with the CUDA toolkit runs where NCCL
 * is missing, and says so only when a run needs it. */
#include "comm/comm_nccl.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The entry points used, from libnccl.so.2. */
static struct {
  void *lib;
  char why[256]; /* why it could not be loaded ("" when loaded) */
  ncclResult_t (*get_unique_id)(ncclUniqueId *);
  ncclResult_t (*comm_init_rank)(ncclComm_t *, int, ncclUniqueId, int);
  ncclResult_t (*comm_destroy)(ncclComm_t);
  ncclResult_t (*get_version)(int *);
  ncclResult_t (*group_start)(void);
  ncclResult_t (*group_end)(void);
  ncclResult_t (*send)(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*recv)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  const char *(*error_string)(ncclResult_t);
  ncclResult_t (*async_error)(ncclComm_t, ncclResult_t *);
  ncclResult_t (*comm_abort)(ncclComm_t);
} g_nccl;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void load(void) {
  g_nccl.lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (!g_nccl.lib) {
    snprintf(g_nccl.why, sizeof g_nccl.why, "cannot load libnccl.so.2 (%s)", dlerror());
    return;
  }
#define SYM(field, name)                                                                       \
  do {                                                                                         \
    *(void **)&g_nccl.field = dlsym(g_nccl.lib, name);                                         \
    if (!g_nccl.field) {                                                                       \
      snprintf(g_nccl.why, sizeof g_nccl.why, "libnccl.so.2 has no %s: too old a NCCL", name); \
      return;                                                                                  \
    }                                                                                          \
  } while (0)
  SYM(get_unique_id, "ncclGetUniqueId");
  SYM(comm_init_rank, "ncclCommInitRank");
  SYM(comm_destroy, "ncclCommDestroy");
  SYM(get_version, "ncclGetVersion");
  SYM(group_start, "ncclGroupStart");
  SYM(group_end, "ncclGroupEnd");
  SYM(send, "ncclSend");
  SYM(recv, "ncclRecv");
  SYM(error_string, "ncclGetErrorString");
  SYM(async_error, "ncclCommGetAsyncError");
  SYM(comm_abort, "ncclCommAbort");
#undef SYM
}

struct mf_nccl {
  mf_comm *c; /* its deadline (mf_nccl_wait) */
  ncclComm_t comm;
  cudaEvent_t done; /* recorded after each exchange */
  int pending;      /* an exchange not yet seen done */
  int aborted;      /* after a wait that failed: comm is gone */
  int rank, size;
  char version[32];
};

static mf_status nccl_error(ncclResult_t r, const char *call) {
  return MF_ERR(MF_ERR_MPI, "nccl: %s: %s (%d)", call, g_nccl.error_string(r), (int)r);
}

mf_status mf_nccl_create(mf_comm *c, int device, mf_nccl **out) {
  *out = NULL;
  pthread_once(&g_once, load);
  /* Every rank decides alike whether NCCL is there, so that none waits alone in the broadcast. */
  int64_t missing = g_nccl.why[0] != 0;
  MF_CHECK(mf_comm_allreduce_max_i64(c, &missing, 1));
  if (missing)
    return MF_ERR(MF_ERR_UNSUPPORTED, "nccl: %s",
                  g_nccl.why[0] ? g_nccl.why : "another rank cannot load NCCL");
  const cudaError_t ce = cudaSetDevice(device);
  if (ce != cudaSuccess)
    return MF_ERR(MF_ERR_UNSUPPORTED, "nccl: CUDA device %d: %s", device, cudaGetErrorString(ce));
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  if (mf_comm_rank(c) == 0) {
    const ncclResult_t r = g_nccl.get_unique_id(&id);
    if (r != ncclSuccess) return nccl_error(r, "ncclGetUniqueId");
  }
  MF_CHECK(mf_comm_broadcast(c, &id, sizeof id, 0));
  mf_nccl *n = (mf_nccl *)calloc(1, sizeof *n);
  if (!n) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "nccl: out of memory");
  n->c = c;
  n->rank = mf_comm_rank(c);
  n->size = mf_comm_size(c);
  const cudaError_t ee = cudaEventCreateWithFlags(&n->done, cudaEventDisableTiming);
  if (ee != cudaSuccess) {
    free(n);
    return MF_ERR(MF_ERR_UNSUPPORTED, "nccl: an event: %s", cudaGetErrorString(ee));
  }
  const ncclResult_t r = g_nccl.comm_init_rank(&n->comm, n->size, id, n->rank);
  if (r != ncclSuccess) {
    cudaEventDestroy(n->done);
    free(n);
    return nccl_error(r, "ncclCommInitRank");
  }
  int v = 0;
  g_nccl.get_version(&v);
  snprintf(n->version, sizeof n->version, "NCCL %d.%d.%d", v / 10000, v / 100 % 100, v % 100);
  *out = n;
  return MF_OK;
}

void mf_nccl_free(mf_nccl *n) {
  if (!n) return;
  if (!n->aborted) g_nccl.comm_destroy(n->comm);
  cudaEventDestroy(n->done);
  free(n);
}

const char *mf_nccl_version(const mf_nccl *n) {
  return n->version;
}

mf_status mf_nccl_exchange(mf_nccl *n, const mf_comm_part *sends, int n_send, const mf_comm_part *recvs,
                           int n_recv, void *stream) {
  const cudaStream_t s = (cudaStream_t)stream;
  if (n->aborted) return MF_ERR(MF_ERR_MPI, "nccl: an exchange after the communicator was aborted");
  ncclResult_t r = g_nccl.group_start();
  if (r != ncclSuccess) return nccl_error(r, "ncclGroupStart");
  const char *what = "ncclSend";
  for (int i = 0; i < n_send && r == ncclSuccess; i++)
    if (sends[i].bytes) r = g_nccl.send(sends[i].ptr, sends[i].bytes, ncclUint8, sends[i].peer, n->comm, s);
  if (r == ncclSuccess) what = "ncclRecv";
  for (int i = 0; i < n_recv && r == ncclSuccess; i++)
    if (recvs[i].bytes) r = g_nccl.recv(recvs[i].ptr, recvs[i].bytes, ncclUint8, recvs[i].peer, n->comm, s);
  const ncclResult_t g = g_nccl.group_end(); /* the group is closed whatever happened in it */
  if (r != ncclSuccess) return nccl_error(r, what);
  if (g != ncclSuccess) return nccl_error(g, "ncclGroupEnd");
  const cudaError_t e = cudaEventRecord(n->done, s);
  if (e != cudaSuccess) return MF_ERR(MF_ERR_MPI, "nccl: recording an exchange: %s", cudaGetErrorString(e));
  n->pending = 1;
  return MF_OK;
}

/* mf_comm_wait_until's probe: the exchange's event, and NCCL's faults meanwhile. */
static int exchange_done(void *ctx, mf_status *st) {
  mf_nccl *n = (mf_nccl *)ctx;
  const cudaError_t e = cudaEventQuery(n->done);
  if (e == cudaSuccess) return 1;
  if (e != cudaErrorNotReady) {
    *st = MF_ERR(MF_ERR_MPI, "nccl: waiting for an exchange of rows: %s", cudaGetErrorString(e));
    return 1;
  }
  ncclResult_t r = ncclSuccess;
  if (g_nccl.async_error(n->comm, &r) == ncclSuccess && r != ncclSuccess && r != ncclInProgress) {
    *st = nccl_error(r, "an exchange of rows");
    return 1;
  }
  return 0;
}

mf_status mf_nccl_wait(mf_nccl *n) {
  if (!n || !n->pending) return MF_OK;
  const mf_status st = mf_comm_wait_until(n->c, exchange_done, n, "an NCCL exchange of rows");
  if (st == MF_OK) {
    n->pending = 0;
    return MF_OK;
  }
  /* Its kernels would wait for the other rank forever: aborted, they return, and the step fails. */
  if (!n->aborted) g_nccl.comm_abort(n->comm);
  n->aborted = 1;
  n->pending = 0;
  return st;
}
