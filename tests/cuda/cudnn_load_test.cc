// cuDNN, loaded at run time for the cuda backend's attention
// (kernels/cuda/attention_cudnn.h): the frontend's dynamic loading finds
// libcudnn.so.9 and its symbols, reads its version, and reports what it cannot
// do as a status naming cuDNN, never an exception or a crash. Not a gpu test:
// on a machine without a GPU (CI) cudnnCreate is the step that fails, after
// the library and its version were read; with a GPU the handle is made.
#include <gtest/gtest.h>

#include <string>

#include "kernels/cuda/attention_cudnn.h"
#include "kernels/cuda/cuda.h"
#include "src/core/core.h"
#include "tests/require.h"

TEST(CudnnLoad, LoadsAndReadsItsVersionOrSaysWhy) {
  if (!mf_cuda_compiled()) GTEST_SKIP() << "built without CUDA";
  if (!mf_cuda_cudnn_built()) MF_TOOL_MISSING("built without cuDNN's frontend headers (tools/setup)");
  mf_cuda_cudnn *c = nullptr;
  const mf_status st = mf_cuda_cudnn_create(&c);
  const std::string err = st == MF_OK ? "" : mf_last_error();
  if (st == MF_ERR_UNSUPPORTED && err.find("libcudnn.so.9 could not be loaded") != std::string::npos)
    MF_TOOL_MISSING(err);
  int n = 0;
  ASSERT_EQ(mf_cuda_device_count(&n, nullptr, 0), MF_OK);
  if (n > 0) {
    ASSERT_EQ(st, MF_OK) << err;
    EXPECT_GE(mf_cuda_cudnn_version(c), 90000);
    mf_cuda_cudnn_free(c);
    return;
  }
  // No GPU: the library loaded and gave its version; the handle could not be made.
  EXPECT_EQ(st, MF_ERR_CUDA) << err;
  EXPECT_EQ(c, nullptr);
  EXPECT_NE(err.find("cudnnCreate failed (cuDNN 9"), std::string::npos) << err;
}

// A context that is not there takes no call: the caller runs its own kernels.
TEST(CudnnLoad, NoContextRunsNothing) {
  int ran = 1;
  EXPECT_EQ(mf_cuda_attn_cudnn_fwd(nullptr, nullptr, nullptr, nullptr, 1, 8, 2, 1, 64, 0.125f, nullptr,
                                   nullptr, nullptr, 0, &ran, nullptr),
            mf_cuda_compiled() ? MF_OK : MF_ERR_NO_DEVICE);
  EXPECT_EQ(ran, 0);
}
