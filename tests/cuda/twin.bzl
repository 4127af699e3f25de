"""The bf16 twin tests of tests/cuda."""

load("//tools:build_defs.bzl", "mf_test")

# A kernel family in BF16 storage against the cpu backend's round_bf16 twin
# (bf16_twin.h): NAME.cc, tagged gpu.
def bf16_twin_test(name):
    mf_test(
        name = name,
        srcs = [
            name + ".cc",
            "bf16_twin.h",
            "gpu_test_util.h",
            "twin_fixture.h",
        ],
        size = "medium",
        tags = ["gpu"],
        deps = [
            "//kernels:backend",
            "//kernels/cpu",
            "//kernels/cpu:ops",
            "//kernels/cuda",
            "//src/core",
        ],
    )
