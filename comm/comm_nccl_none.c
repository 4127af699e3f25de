/* comm_nccl.h without the CUDA toolkit (--config=nocuda): no NCCL. */
#include "comm/comm_nccl.h"

mf_status mf_nccl_create(mf_comm *c, int device, mf_nccl **out) {
  (void)c;
  (void)device;
  *out = NULL;
  return MF_ERR(MF_ERR_UNSUPPORTED, "nccl: this build has no CUDA toolkit (built with --config=nocuda)");
}

void mf_nccl_free(mf_nccl *n) {
  (void)n;
}

const char *mf_nccl_version(const mf_nccl *n) {
  (void)n;
  return "no NCCL";
}

mf_status mf_nccl_exchange(mf_nccl *n, const mf_comm_part *sends, int n_send, const mf_comm_part *recvs,
                           int n_recv, void *stream) {
  (void)n, (void)sends, (void)n_send, (void)recvs, (void)n_recv, (void)stream;
  return MF_ERR(MF_ERR_UNSUPPORTED, "nccl: this build has no CUDA toolkit (built with --config=nocuda)");
}

mf_status mf_nccl_wait(mf_nccl *n) {
  (void)n;
  return MF_OK;
}
