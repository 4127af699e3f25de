"""Repository rules for libraries that live on the machine (nothing is downloaded)."""

_CUDA_BUILD = """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "headers",
    hdrs = glob(["include/**"]),
    includes = ["include"],
)

# Static runtime: only the driver is needed at run time.
cc_library(
    name = "cudart",
    srcs = ["lib64/libcudart_static.a"],
    linkopts = ["-ldl", "-lrt", "-lpthread"],
    alwayslink = 1,
    deps = [":headers"],
)

cc_library(
    name = "cublas",
    srcs = ["lib64/libcublas.so.13", "lib64/libcublasLt.so.13"],
    deps = [":headers"],
)

cc_library(
    name = "nccl",
    srcs = glob(["lib64/libnccl.so.2"]),
    deps = [":headers"],
)

filegroup(name = "nvcc_files", srcs = glob(["bin/**", "include/**", "nvvm/**"]))
"""

_NO_CUDA_BUILD = """
package(default_visibility = ["//visibility:public"])

# No CUDA toolkit was found at {home}: these targets are empty.
cc_library(name = "headers")
cc_library(name = "cudart")
cc_library(name = "cublas")
cc_library(name = "nccl")
filegroup(name = "nvcc_files", srcs = [])
"""

def _cuda_repository_impl(ctx):
    home = ctx.os.environ.get("CUDA_HOME", "/usr/local/cuda")
    have = ctx.path(home + "/include/cuda_runtime.h").exists and ctx.path(home + "/bin/nvcc").exists
    if have:
        for d in ["include", "lib64", "bin", "nvvm"]:
            if ctx.path(home + "/" + d).exists:
                ctx.symlink(home + "/" + d, d)
        ctx.file("BUILD", _CUDA_BUILD)
    else:
        ctx.file("BUILD", _NO_CUDA_BUILD.format(home = home))
    ctx.file("defs.bzl", "HAVE_CUDA = %s\nNVCC = \"%s/bin/nvcc\"\n" % (have, home))

mf_cuda_repository = repository_rule(
    implementation = _cuda_repository_impl,
    environ = ["CUDA_HOME"],
    local = True,
)
