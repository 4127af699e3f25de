"""Build macros: C11 libraries, GoogleTest tests and nvcc-compiled CUDA libraries."""

load("@cuda//:defs.bzl", "HAVE_CUDA", "NVCC")

MF_COPTS = [
    "-std=c11",
    "-D_GNU_SOURCE",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-Wno-unused-parameter",
    "-Wno-format-truncation",  # messages are cut on purpose at their buffer size
    "-fno-math-errno",
    "-pthread",
]

MF_TEST_COPTS = [
    "-std=c++17",
    "-Wall",
    "-Wextra",
    "-Wno-unused-parameter",
    "-Wno-missing-field-initializers",
    "-pthread",
]

def mf_library(name, srcs = [], hdrs = [], deps = [], copts = [], **kwargs):
    """A C11 module: one cc_library with the project's warnings."""
    native.cc_library(
        name = name,
        srcs = srcs,
        hdrs = hdrs,
        deps = deps,
        copts = MF_COPTS + copts,
        linkopts = ["-pthread", "-lm"],
        visibility = ["//visibility:public"],
        **kwargs
    )

# The environment of every test: hardware.profile auto on the cpu backend
# measures this machine once into runs/hw/cpu.yaml (src/train/hwmeasure.h);
# tests keep the bundled profile (the same predictions on every machine, no
# seconds of measuring in each fresh runfiles tree).
MF_TEST_ENV = {"MF_CPU_PROFILE": "bundled"}

def mf_test(name, srcs, deps = [], tags = [], data = [], size = "small", copts = [], env = {}, **kwargs):
    """A GoogleTest file calling the C API, a test build (//src/core:test_build:
    the test-only MF_ hooks of src/core/env.h are read)."""
    test_env = dict(MF_TEST_ENV)
    test_env.update(env)
    native.cc_test(
        env = test_env,
        name = name,
        srcs = srcs,
        deps = deps + ["//src/core:test_build", "//third_party:gtest_main"],
        copts = MF_TEST_COPTS + copts,
        tags = tags,
        data = data + ["//tests:lsan.supp"],
        size = size,
        # Static: the nvcc objects and the static CUDA runtime resolve in one link.
        linkstatic = 1,
        **kwargs
    )

_GENCODE = " ".join([
    "-gencode arch=compute_80,code=sm_80",
    "-gencode arch=compute_90a,code=sm_90a",
    "-gencode arch=compute_90,code=compute_90",
])

# A .cu compiled against CUTLASS's headers (cuda_library's `cutlass_srcs`):
# sm_90a only (its kernels are Hopper's wgmma + TMA), NDEBUG (an assert's call
# inside the mainloop makes ptxas serialise the wgmma pipeline), and
# MF_HAVE_CUTLASS=1 when tools/setup installed the headers, 0 (stubs) when not.
_CUTLASS = "third_party/cutlass"
_CUTLASS_FLAGS = (
    "$$(if [ -f " + _CUTLASS + "/include/cutlass/cutlass.h ]; then " +
    "echo -DMF_HAVE_CUTLASS=1 -DNDEBUG --expt-relaxed-constexpr -I" + _CUTLASS + "/include -I" +
    _CUTLASS + "/util/include; else echo -DMF_HAVE_CUTLASS=0; fi) " +
    "-gencode arch=compute_90a,code=sm_90a"
)

# A host-only C++ file against cuDNN's C++ frontend (cuda_library's
# `cudnn_srcs`): compiled by g++ (the frontend is templates with no device code;
# nvcc's front end takes four times as long on it), -O1 (it builds graphs
# once), in the frontend's dynamic-loading mode (cuDNN is dlopen'd at run time,
# never linked), its headers as system headers (their own warnings are not
# ours); MF_HAVE_CUDNN_FE=1 when tools/setup installed them, 0 (stubs) when not.
_CUDNN_FE = "third_party/cudnn_frontend"
_CUDNN_FE_FLAGS = (
    "$$(if [ -f " + _CUDNN_FE + "/include/cudnn_frontend.h ]; then " +
    "echo -DMF_HAVE_CUDNN_FE=1 -DNV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING -isystem " + _CUDNN_FE + "/include; " +
    "else echo -DMF_HAVE_CUDNN_FE=0; fi)"
)

def cuda_library(name, srcs, hdrs = [], nvcc_hdrs = [], fallback_srcs = [], deps = [], cutlass_srcs = [],
                 cudnn_srcs = [], **kwargs):
    """Compiles each .cu with nvcc (one genrule per file) into an alwayslink cc_library.

    `hdrs` are the public headers; `nvcc_hdrs` every other header the .cu files
    include (nvcc sees only what is listed). Without the toolkit, or with
    --config=nocuda, the library is built from `fallback_srcs` (C files that
    report "no GPU") instead, so callers need no #ifdefs. `cutlass_srcs` are
    .cu files compiled against CUTLASS's headers (_CUTLASS_FLAGS above);
    `cudnn_srcs` host-only .cc files against cuDNN's frontend (_CUDNN_FE_FLAGS).
    """
    objs = []
    if HAVE_CUDA:
        for src in srcs + cutlass_srcs:
            obj = "_" + name + "_" + src.replace("/", "_").replace(".cu", ".pic.o")
            cutlass = src in cutlass_srcs
            native.genrule(
                name = obj + "_nvcc",
                srcs = [src] + hdrs + nvcc_hdrs + ["@cuda//:nvcc_files"] +
                       (["//third_party:cutlass_headers"] if cutlass else []),
                outs = [obj],
                cmd = (NVCC + " -c -Xcompiler=-fPIC -std=c++17 -O3 -ccbin=/usr/bin/g++ " +
                       (_CUTLASS_FLAGS if cutlass else _GENCODE) +
                       " -I. -Iexternal/cuda/include -DMF_HAVE_CUDA=1 -o $@ $(location " + src + ")"),
                tags = ["manual"],
                message = "nvcc " + src,
            )
            objs.append(":" + obj)
        for src in cudnn_srcs:
            obj = "_" + name + "_" + src.replace("/", "_").replace(".cc", ".pic.o")
            native.genrule(
                name = obj + "_gxx",
                srcs = [src] + hdrs + nvcc_hdrs + ["@cuda//:nvcc_files", "//third_party:cudnn_frontend_headers"],
                outs = [obj],
                cmd = ("/usr/bin/g++ -c -fPIC -std=c++17 -O1 -Wall -Wextra -Werror -Wno-unused-parameter " +
                       _CUDNN_FE_FLAGS + " -I. -Iexternal/cuda/include -o $@ $(location " + src + ")"),
                tags = ["manual"],
                message = "g++ " + src,
            )
            objs.append(":" + obj)
    native.cc_library(
        name = name,
        srcs = select({
            "//tools:nocuda": fallback_srcs,
            "//conditions:default": objs if HAVE_CUDA else fallback_srcs,
        }),
        hdrs = hdrs,
        copts = MF_COPTS,
        deps = deps + select({
            "//tools:nocuda": [],
            "//conditions:default": ["@cuda//:cudart"] if HAVE_CUDA else [],
        }),
        alwayslink = 1,
        visibility = ["//visibility:public"],
        **kwargs
    )

def cu_textual(name, textual_hdrs = [], visibility = None):
    """NAME.cu as an includable file for the CPU emulation tests (tests/cuda/mma_emu.h).

    Bazel takes no .cu as a header: a genrule NAME_inc copies it to NAME_cu.inc,
    and a cc_library NAME_textual offers that copy (and `textual_hdrs`, the
    headers the .cu includes in emulation) to the tests.
    """
    native.genrule(
        name = name + "_inc",
        srcs = [name + ".cu"],
        outs = [name + "_cu.inc"],
        cmd = "cp $< $@",
    )
    native.cc_library(
        name = name + "_textual",
        textual_hdrs = [":" + name + "_inc"] + textual_hdrs,
        visibility = visibility,
    )

# Every library package's `sources` (mf_sources below): the include arrows'
# test and the environment table's test read them all.
MF_LIBRARY_SOURCES = [
    "//comm:sources",
    "//experts:sources",
    "//kernels:sources",
    "//kernels/cpu:sources",
    "//kernels/cuda:sources",
    "//planner:sources",
    "//src/ckpt:sources",
    "//src/cli:sources",
    "//src/config:sources",
    "//src/core:sources",
    "//src/exec:sources",
    "//src/io:sources",
    "//src/model:sources",
    "//src/optim:sources",
    "//src/train:sources",
]

def mf_sources(name = "sources"):
    """The package's C, C++ and CUDA sources as a filegroup: what
    //tests/arch:include_test reads to check the folders' include arrows, and
    //tests/core:env_test to check that only src/core/env.c reads MF_ variables."""
    native.filegroup(
        name = name,
        srcs = native.glob(["*.c", "*.h", "*.cc", "*.cu", "*.cuh"]),
        visibility = ["//tests/arch:__pkg__", "//tests/core:__pkg__"],
    )
