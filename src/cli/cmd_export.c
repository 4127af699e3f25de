/* `moefit export RUN_OR_CHECKPOINT --out DIR [--dtype bf16|fp32] [--shard-size SIZE]`. */
#include <stdio.h>
#include <string.h>

#include "src/ckpt/ckpt.h"
#include "src/cli/commands.h"

static const char k_export_usage[] =
    "usage: moefit export RUN_OR_CHECKPOINT --out DIR [--dtype bf16|fp32] [--shard-size SIZE]\n\n"
    "Writes a run's weights as a Hugging Face model directory that transformers loads\n"
    "(from_pretrained) and `moefit eval --model DIR` evaluates: config.json, model.safetensors\n"
    "(or model-0000i-of-0000n.safetensors and model.safetensors.index.json when the tensors\n"
    "are over SIZE, packed in order like save_pretrained) and generation_config.json.\n"
    "RUN_OR_CHECKPOINT is a run's output dir (its newest complete checkpoint, else its final/)\n"
    "or one checkpoint dir (OUTPUT/checkpoints/step-NNNNNN), whose checksums are verified first:\n"
    "a damaged or unfinished checkpoint is refused. The weights are the checkpoint's fp32\n"
    "master copy, written as bf16 (default; rounded to nearest even) or fp32.\n"
    "--shard-size: tensor bytes per shard (default 5GB; KB/MB/GB powers of 1000, KiB/MiB/GiB\n"
    "of 1024). DIR must not exist or be empty; it is written beside itself and renamed into\n"
    "place, so it appears whole or not at all.\n\n"
    "example (the demo's run, after ./tools/demo):\n"
    "  moefit export runs/demo --out runs/demo-fp32 --dtype fp32\n"
    "  moefit eval configs/demo.yaml --model runs/demo-fp32\n";

int mf_cli_export(int argc, char **argv) {
  if (mf_cli_wants_help(argc, argv)) {
    printf("%s", k_export_usage);
    return MF_EXIT_OK;
  }
  const char *src = NULL, *out = NULL, *dtype = "bf16", *shard = "5GB";
  for (int i = 1; i < argc; i++) {
    const char **slot = NULL;
    if (strcmp(argv[i], "--out") == 0)
      slot = &out;
    else if (strcmp(argv[i], "--dtype") == 0)
      slot = &dtype;
    else if (strcmp(argv[i], "--shard-size") == 0)
      slot = &shard;
    else if (strncmp(argv[i], "--", 2) == 0)
      return mf_cli_usage_error("export", "unknown option '%s'", argv[i]);
    else if (src)
      return mf_cli_usage_error("export", "one RUN_OR_CHECKPOINT, got '%s' and '%s'", src, argv[i]);
    else
      src = argv[i];
    if (slot) {
      if (i + 1 >= argc) return mf_cli_usage_error("export", "%s needs a value", argv[i]);
      *slot = argv[++i];
    }
  }
  if (!src) return mf_cli_usage_error("export", "expected a run dir or a checkpoint dir");
  if (!out) return mf_cli_usage_error("export", "expected --out DIR");
  mf_ckpt_export_opts o = {MF_DTYPE_BF16, 0};
  if (strcmp(dtype, "fp32") == 0 || strcmp(dtype, "f32") == 0 || strcmp(dtype, "float32") == 0)
    o.dtype = MF_DTYPE_F32;
  else if (strcmp(dtype, "bf16") != 0 && strcmp(dtype, "bfloat16") != 0)
    return mf_cli_usage_error("export", "--dtype %s: bf16 or fp32", dtype);
  if (mf_parse_size(shard, &o.max_shard_bytes) != 0 || o.max_shard_bytes == 0)
    return mf_cli_usage_error("export", "--shard-size %s: not a size (e.g. 5GB, 500MiB)", shard);
  mf_ckpt_export_info info;
  mf_status st = mf_ckpt_export(src, out, &o, &info);
  if (st != MF_OK) return mf_cli_fail("export", st);
  printf("exported %s -> %s: %lld tensors, %.2f MiB %s, %s\n", info.source, out, (long long)info.tensors,
         (double)info.bytes / (1024.0 * 1024.0), o.dtype == MF_DTYPE_F32 ? "fp32" : "bf16",
         info.shards == 1 ? "model.safetensors" : "sharded");
  if (info.shards > 1)
    printf("  %zu shards of at most %s; model.safetensors.index.json\n", info.shards, shard);
  return MF_EXIT_OK;
}
