// The special fp32 values the AdamW tests mix into random buffers: NaN of both
// signs, +-Inf, denormals, the smallest normal, +-0, FLT_MAX and large values.
#ifndef MF_TESTS_OPTIM_SPECIAL_VALUES_H
#define MF_TESTS_OPTIM_SPECIAL_VALUES_H

#include <limits>
#include <vector>

namespace mf_ot {

inline std::vector<float> special_values() {
  return {std::numeric_limits<float>::quiet_NaN(),
          -std::numeric_limits<float>::quiet_NaN(),
          std::numeric_limits<float>::infinity(),
          -std::numeric_limits<float>::infinity(),
          std::numeric_limits<float>::denorm_min(),
          -std::numeric_limits<float>::denorm_min(),
          1e-40f,
          -3e-39f,
          std::numeric_limits<float>::min(),
          0.0f,
          -0.0f,
          std::numeric_limits<float>::max(),
          -1e30f,
          1e20f};
}

}  // namespace mf_ot

#endif  // MF_TESTS_OPTIM_SPECIAL_VALUES_H
