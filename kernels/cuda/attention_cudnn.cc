// Attention on cuDNN's fused flash kernels (attention_cudnn.h): host code only,
// compiled by the host compiler against the CUDA toolkit's cudnn.h and cuDNN's
// C++ frontend (third_party/cudnn_frontend, installed by tools/setup) in its
// dynamic-loading mode, so nothing links cuDNN: create dlopens it.
//
// The frontend reports errors as values but its dynamic loading throws when a
// symbol is missing; every call into it is inside try, and nothing throws out
// of this file. A graph per shape (kind, B, S, Hq, Hkv, D, scale) is built on
// first use under the context's lock and kept with its variant pack, whose
// pointers are the only thing a later call changes.
#include "kernels/cuda/attention_cudnn.h"

#include "kernels/cuda/backend_cuda.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#ifndef MF_HAVE_CUDNN_FE
#define MF_HAVE_CUDNN_FE 0
#endif

#if MF_HAVE_CUDNN_FE
#include <cuda_runtime_api.h>
#include <cudnn_frontend.h>

// The frontend's dynamic loading looks its cuDNN symbols up in this handle.
namespace cudnn_frontend {
void *cudnn_dlhandle = nullptr;
}

namespace {

namespace fe = cudnn_frontend;

// Tensor ids of the graphs (the variant packs' keys), in the order of the
// entry points' pointers: the forward's are Q_ID .. STATS_ID, the backward's all.
enum : int64_t { Q_ID = 1, K_ID, V_ID, O_ID, STATS_ID, DO_ID, DQ_ID, DK_ID, DV_ID };

struct Key {
  int kind;  // 0 forward, 1 backward
  int64_t B, S, Hq, Hkv, D;
  uint32_t scale_bits;
  bool operator==(const Key &o) const {
    return kind == o.kind && B == o.B && S == o.S && Hq == o.Hq && Hkv == o.Hkv && D == o.D &&
           scale_bits == o.scale_bits;
  }
};

struct Entry {
  Key key;
  std::shared_ptr<fe::graph::Graph> graph;  // null: refused (not supported, or too much workspace)
  int64_t workspace = 0;
  std::unordered_map<int64_t, void *> pack;  // every id of the graph (made by the first call), its pointer
};

std::string key_name(const Key &k) {
  return std::string(k.kind ? "backward" : "forward") + " B=" + std::to_string(k.B) +
         " S=" + std::to_string(k.S) + " Hq=" + std::to_string(k.Hq) + " Hkv=" + std::to_string(k.Hkv) +
         " D=" + std::to_string(k.D);
}

// A token-major [B*S, H, D] tensor as cuDNN's (B, H, S, D).
fe::graph::Tensor_attributes bshd(const char *name, int64_t id, int64_t B, int64_t H, int64_t S, int64_t D) {
  return fe::graph::Tensor_attributes()
      .set_name(name)
      .set_uid(id)
      .set_dim({B, H, S, D})
      .set_stride({S * H * D, D, H * D, 1});
}

void set_bshd(const std::shared_ptr<fe::graph::Tensor_attributes> &t, int64_t id, int64_t B, int64_t H,
              int64_t S, int64_t D) {
  t->set_output(true).set_uid(id).set_dim({B, H, S, D}).set_stride({S * H * D, D, H * D, 1});
}

std::shared_ptr<fe::graph::Graph> make_graph(const Key &k, float scale) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto q = g->tensor(bshd("q", Q_ID, k.B, k.Hq, k.S, k.D));
  auto kk = g->tensor(bshd("k", K_ID, k.B, k.Hkv, k.S, k.D));
  auto v = g->tensor(bshd("v", V_ID, k.B, k.Hkv, k.S, k.D));
  if (k.kind == 0) {
    auto opts = fe::graph::SDPA_attributes()
                    .set_name("moefit attention forward")
                    .set_generate_stats(true)
                    .set_attn_scale(scale)
                    .set_causal_mask(true);
    auto [o, stats] = g->sdpa(q, kk, v, opts);
    set_bshd(o, O_ID, k.B, k.Hq, k.S, k.D);
    stats->set_output(true)
        .set_uid(STATS_ID)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim({k.B, k.Hq, k.S, 1})
        .set_stride({k.Hq * k.S, k.S, 1, 1});
    return g;
  }
  auto o = g->tensor(bshd("o", O_ID, k.B, k.Hq, k.S, k.D));
  auto dout = g->tensor(bshd("do", DO_ID, k.B, k.Hq, k.S, k.D));
  auto stats = g->tensor(fe::graph::Tensor_attributes()
                             .set_name("lse")
                             .set_uid(STATS_ID)
                             .set_dim({k.B, k.Hq, k.S, 1})
                             .set_stride({k.Hq * k.S, k.S, 1, 1})
                             .set_data_type(fe::DataType_t::FLOAT));
  auto opts = fe::graph::SDPA_backward_attributes()
                  .set_name("moefit attention backward")
                  .set_attn_scale(scale)
                  .set_causal_mask(true)
                  .set_deterministic_algorithm(true);
  auto [dq, dk, dv] = g->sdpa_backward(q, kk, v, o, dout, stats, opts);
  set_bshd(dq, DQ_ID, k.B, k.Hq, k.S, k.D);
  set_bshd(dk, DK_ID, k.B, k.Hkv, k.S, k.D);
  set_bshd(dv, DV_ID, k.B, k.Hkv, k.S, k.D);
  return g;
}

}  // namespace

struct mf_cuda_cudnn {
  void *lib = nullptr;
  cudnnHandle_t handle = nullptr;
  int64_t version = 0;
  std::mutex lock;
  Entry entries[MF_CUDNN_GRAPHS];
  int n = 0;
};

namespace {

// The entry of `k` (built now if new), or null when the table is full.
Entry *entry_of(mf_cuda_cudnn *c, const Key &k, float scale) {
  for (int i = 0; i < c->n; i++)
    if (c->entries[i].key == k) return &c->entries[i];
  if (c->n == MF_CUDNN_GRAPHS) {
    static std::once_flag said;
    std::call_once(said, [&] {
      MF_LOGW("cuda",
              "cuDNN attention: more than %d attention shapes in one process; %s and later new shapes run "
              "on attention_mma.cu",
              MF_CUDNN_GRAPHS, key_name(k).c_str());
    });
    return nullptr;
  }
  Entry *e = &c->entries[c->n++];
  e->key = k;
  std::shared_ptr<fe::graph::Graph> g;
  fe::error_t st;
  try {  // a cuDNN without a symbol the frontend asks for throws: that shape is not supported
    g = make_graph(k, scale);
    st = g->build(c->handle, {fe::HeurMode_t::A});
    if (st.is_good()) st = g->get_workspace_size(e->workspace);
  } catch (const std::exception &x) {
    st = fe::error_t(fe::error_code_t::GRAPH_NOT_SUPPORTED, x.what());
  }
  if (st.is_bad()) {
    MF_LOGW("cuda",
            "cuDNN attention: the %s is not supported by cuDNN %lld (%s); it runs on attention_mma.cu",
            key_name(k).c_str(), (long long)c->version, st.get_message().c_str());
    return e;
  }
  e->graph = g;
  return e;
}

mf_status run(mf_cuda_cudnn *c, const Key &k, float scale, void *const *ptrs, void *ws, size_t ws_bytes,
              int *ran, void *stream) {
  *ran = 0;
  if (!c) return MF_OK;
  std::lock_guard<std::mutex> hold(c->lock);
  try {
    Entry *e = entry_of(c, k, scale);
    if (!e || !e->graph) return MF_OK;
    if (e->workspace > 0 && (uint64_t)e->workspace > ws_bytes) {
      MF_LOGW("cuda",
              "cuDNN attention: the %s needs %lld bytes of workspace, the kernel scratch has %zu; it runs "
              "on attention_mma.cu",
              key_name(k).c_str(), (long long)e->workspace, ws_bytes);
      e->graph.reset();
      return MF_OK;
    }
    for (int64_t id = Q_ID; id <= (k.kind ? DV_ID : STATS_ID); id++) e->pack[id] = ptrs[id - Q_ID];
    fe::error_t st = fe::detail::set_stream(c->handle, (cudaStream_t)stream) == CUDNN_STATUS_SUCCESS
                         ? fe::error_t()
                         : fe::error_t(fe::error_code_t::CUDNN_BACKEND_API_FAILED, "cudnnSetStream failed");
    if (st.is_good()) st = e->graph->execute(c->handle, e->pack, e->workspace > 0 ? ws : nullptr);
    if (st.is_bad())
      return MF_ERR(MF_ERR_CUDA, "cuDNN attention: the %s failed: %s", key_name(k).c_str(),
                    st.get_message().c_str());
    *ran = 1;
    return MF_OK;
  } catch (const std::exception &x) {
    return MF_ERR(MF_ERR_CUDA, "cuDNN attention: the %s failed: %s", key_name(k).c_str(), x.what());
  } catch (...) {
    return MF_ERR(MF_ERR_CUDA, "cuDNN attention: the %s failed (an exception)", key_name(k).c_str());
  }
}

uint32_t bits_of(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

}  // namespace

extern "C" int mf_cuda_cudnn_built(void) {
  return 1;
}

extern "C" mf_status mf_cuda_cudnn_create(mf_cuda_cudnn **out) {
  *out = nullptr;
  void *lib = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
  if (!lib) lib = dlopen("libcudnn_graph.so.9", RTLD_NOW | RTLD_LOCAL);
  if (!lib)
    return MF_ERR(MF_ERR_UNSUPPORTED,
                  "cuDNN: libcudnn.so.9 could not be loaded (%s): install cuDNN 9 or put its lib folder on "
                  "LD_LIBRARY_PATH",
                  dlerror());
  mf_cuda_cudnn *c = new (std::nothrow) mf_cuda_cudnn;
  if (!c) {
    dlclose(lib);
    return MF_ERR(MF_ERR_OUT_OF_MEMORY, "cuDNN: out of memory");
  }
  c->lib = lib;
  fe::cudnn_dlhandle = lib;
  // The frontend dlopens a CUDA runtime for its own few runtime calls and, with
  // both libcudart.so.12 and .13 on the loader's path, takes the first: ask
  // for the major this build was compiled with (the caller's own choice kept).
  char cudart[32];
  snprintf(cudart, sizeof cudart, "libcudart.so.%d", CUDART_VERSION / 1000);
  setenv("CUDNN_FRONTEND_CUDART_LIB_NAME", cudart, 0);
  mf_status st = MF_OK;
  try {
    c->version = fe::detail::get_backend_version();
    if (c->version < 90000)
      st = MF_ERR(MF_ERR_UNSUPPORTED, "cuDNN: version %lld was loaded; attention needs cuDNN 9",
                  (long long)c->version);
    else if (fe::detail::create_handle(&c->handle) != CUDNN_STATUS_SUCCESS)
      st = MF_ERR(MF_ERR_CUDA, "cuDNN: cudnnCreate failed (cuDNN %lld)", (long long)c->version);
  } catch (const std::exception &x) {
    st = MF_ERR(MF_ERR_UNSUPPORTED, "cuDNN: %s", x.what());
  } catch (...) {
    st = MF_ERR(MF_ERR_UNSUPPORTED, "cuDNN: loading it failed (an exception)");
  }
  if (st != MF_OK) {
    c->handle = nullptr;
    mf_cuda_cudnn_free(c);
    return st;
  }
  *out = c;
  return MF_OK;
}

extern "C" void mf_cuda_cudnn_free(mf_cuda_cudnn *c) {
  if (!c) return;
  try {
    for (int i = 0; i < c->n; i++) c->entries[i].graph.reset();
    if (c->handle) fe::detail::destroy_handle(c->handle);
  } catch (...) {
  }
  // The library stays loaded: the frontend keeps function pointers to it in statics.
  delete c;
}

extern "C" int64_t mf_cuda_cudnn_version(const mf_cuda_cudnn *c) {
  return c ? c->version : 0;
}

extern "C" mf_status mf_cuda_attn_cudnn_fwd(mf_cuda_cudnn *c, const void *q, const void *k, const void *v,
                                            int64_t B, int64_t S, int64_t Hq, int64_t Hkv, int64_t D,
                                            float scale, void *o, float *lse, void *ws, size_t ws_bytes,
                                            int *ran, void *stream) {
  const Key key = {0, B, S, Hq, Hkv, D, bits_of(scale)};
  void *const ptrs[] = {(void *)q, (void *)k, (void *)v, o, lse};
  return run(c, key, scale, ptrs, ws, ws_bytes, ran, stream);
}

extern "C" mf_status mf_cuda_attn_cudnn_bwd(mf_cuda_cudnn *c, const void *q, const void *k, const void *v,
                                            const void *o, const void *dout, const float *lse, int64_t B,
                                            int64_t S, int64_t Hq, int64_t Hkv, int64_t D, float scale,
                                            void *dq, void *dk, void *dv, void *ws, size_t ws_bytes, int *ran,
                                            void *stream) {
  const Key key = {1, B, S, Hq, Hkv, D, bits_of(scale)};
  void *const ptrs[] = {(void *)q, (void *)k, (void *)v, (void *)o, (void *)lse, (void *)dout, dq, dk, dv};
  return run(c, key, scale, ptrs, ws, ws_bytes, ran, stream);
}

#else  // !MF_HAVE_CUDNN_FE

struct mf_cuda_cudnn {
  int unused;
};

extern "C" int mf_cuda_cudnn_built(void) {
  return 0;
}

extern "C" mf_status mf_cuda_cudnn_create(mf_cuda_cudnn **out) {
  *out = nullptr;
  return MF_ERR(
      MF_ERR_UNSUPPORTED,
      "cuDNN attention: moefit was built without cuDNN's frontend headers (tools/setup installs them "
      "where the CUDA toolkit is; then build again)");
}

extern "C" void mf_cuda_cudnn_free(mf_cuda_cudnn *c) {
  (void)c;
}

extern "C" int64_t mf_cuda_cudnn_version(const mf_cuda_cudnn *c) {
  return 0;
}

extern "C" mf_status mf_cuda_attn_cudnn_fwd(mf_cuda_cudnn *c, const void *q, const void *k, const void *v,
                                            int64_t B, int64_t S, int64_t Hq, int64_t Hkv, int64_t D,
                                            float scale, void *o, float *lse, void *ws, size_t ws_bytes,
                                            int *ran, void *stream) {
  *ran = 0;
  return MF_OK;
}

extern "C" mf_status mf_cuda_attn_cudnn_bwd(mf_cuda_cudnn *c, const void *q, const void *k, const void *v,
                                            const void *o, const void *dout, const float *lse, int64_t B,
                                            int64_t S, int64_t Hq, int64_t Hkv, int64_t D, float scale,
                                            void *dq, void *dk, void *dv, void *ws, size_t ws_bytes, int *ran,
                                            void *stream) {
  *ran = 0;
  return MF_OK;
}

#endif  // MF_HAVE_CUDNN_FE

extern "C" uint64_t mf_cuda_attn_cudnn_workspace_bound(int64_t B, int64_t S, int64_t Hq, int64_t Hkv,
                                                       int64_t D) {
  if (B <= 0 || S <= 0 || Hq <= 0 || D <= 0) return 0;
  (void)Hkv;
  const uint64_t s = ((uint64_t)S + 127) / 128 * 128;
  const uint64_t rows = (uint64_t)B * (uint64_t)Hq * s;
  /* dP (bf16); fp32 accumulators of dQ and, with GQA, dK and dV per query head; the softmax sums */
  return rows * s * 2 + 3 * rows * (uint64_t)D * 4 + rows * 2 * 4 + ((uint64_t)1 << 20);
}
