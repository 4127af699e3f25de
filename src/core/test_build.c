/* A test build: the test-only MF_ hooks are read (src/core/env.h). This
 * strong definition replaces env.c's weak one returning 0; the library is
 * alwayslink, so the linker keeps it though nothing refers to it. */
#include "src/core/env.h"

int mf_env_test_build(void) {
  return 1;
}
