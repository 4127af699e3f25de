/* `moefit export RUN_OR_CHECKPOINT --out DIR [--dtype bf16|fp32] [--shard-size SIZE]`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/ckpt/ckpt.h"
#include "src/cli/commands.h"
#include "src/io/quant.h"
#include "src/train/base.h"
#include "src/train/train.h"

static const char k_export_usage[] =
    "usage: moefit export RUN_OR_CHECKPOINT --out DIR [--dtype bf16|fp32] [--shard-size SIZE]\n"
    "       moefit export RUN_OR_CHECKPOINT --out DIR --adapter     (a LoRA run)\n\n"
    "Writes a run's weights as a Hugging Face model directory that transformers loads\n"
    "(from_pretrained) and `moefit eval --model DIR` evaluates: config.json, model.safetensors\n"
    "(or model-0000i-of-0000n.safetensors and model.safetensors.index.json when the tensors\n"
    "are over SIZE, packed in order like save_pretrained), generation_config.json, and the\n"
    "tokenizer and chat-template files of the run's model.path, copied as they are\n"
    "(tokenizer.json, tokenizer_config.json, special_tokens_map.json, tokenizer.model, vocab.json,\n"
    "merges.txt, added_tokens.json, chat_template.jinja, chat_template.json: those it holds), so\n"
    "the dir is a whole model; a model.init run has no tokenizer, and the last line says so.\n"
    "RUN_OR_CHECKPOINT is a run's output dir (its newest complete checkpoint, else its final/)\n"
    "or one checkpoint dir (OUTPUT/checkpoints/step-NNNNNN), whose checksums are verified first:\n"
    "a damaged or unfinished checkpoint is refused. The weights are the checkpoint's fp32\n"
    "master copy, written as bf16 (default; rounded to nearest even) or fp32.\n"
    "--shard-size: tensor bytes per shard (default 5GB; KB/MB/GB powers of 1000, KiB/MiB/GiB\n"
    "of 1024). DIR must not exist or be empty; it is written beside itself and renamed into\n"
    "place, so it appears whole or not at all.\n"
    "A LoRA run (train.lora): its checkpoints hold the adapters, not the frozen base, which is\n"
    "loaded again from the checkpoint's config (model.path, or model.init's seed) and checked\n"
    "against the checkpoint's record of it; the model dir has the adapters merged into their\n"
    "weights (W + alpha/r B A). --adapter writes the adapters alone instead, as a PEFT adapter\n"
    "dir (adapter_config.json, adapter_model.safetensors) that PeftModel.from_pretrained loads\n"
    "onto the base (a LoRA run's final/ is that dir already), with the base's tokenizer files\n"
    "beside them as transformers' Trainer leaves them (PEFT ignores them) and moefit_base.json,\n"
    "the base's record that `moefit eval --model DIR` checks.\n"
    "A checkpoint records the base its run trained on (base.json: the base's config and its\n"
    "weights' checksums): a base under model.path whose config.json (rope_theta, rms_norm_eps,\n"
    "the router's settings, ...) or, for LoRA, weights changed since is refused, naming what\n"
    "differs.\n\n"
    "example (the demo's run, after ./tools/demo):\n"
    "  moefit export runs/demo --out runs/demo-fp32 --dtype fp32\n"
    "  moefit eval configs/demo.yaml --model runs/demo-fp32\n";

/* The base a checkpoint's run trained on (its base.json) against the base its
 * config names now: the spec before anything is loaded; with LoRA, where the
 * base's weights enter the export, its frozen weights as loaded too
 * (state.json's base_sum; per tensor for an adapter dir's record). Then a LoRA run's export
 * (*lora = 1): the table and base as the run built them (its config.yaml), the
 * trained parameters from the checkpoint; the merged model dir or (adapter)
 * the PEFT dir with the base's record beside it. Else nothing (*lora = 0;
 * info->source set): a full fine-tune's checkpoint holds every weight, so its
 * base's spec is all there is to check. */
static mf_status export_lora(const char *src, const char *out, int adapter, const mf_ckpt_export_opts *o,
                             mf_ckpt_export_info *info, int *lora, char *quant_note, size_t note_cap) {
  *lora = 0;
  quant_note[0] = 0;
  int is_ckpt = 0;
  MF_CHECK(mf_ckpt_export_source(src, info, &is_ckpt));
  if (!is_ckpt) return MF_OK; /* final/ of a run that trained every weight (a LoRA run's is an adapter dir) */
  mf_config *cfg = NULL;
  MF_CHECK(mf_ckpt_load_config(info->source, MF_CONFIG_FOR_EVAL, &cfg));
  mf_param_table *t = NULL;
  float *w = NULL;
  uint16_t *home = NULL; /* the base in bf16, as the run kept it (state.json base_sum_of) */
  mf_threadpool *pool = NULL;
  mf_base_id rec, have;
  memset(&rec, 0, sizeof rec);
  memset(&have, 0, sizeof have);
  char desc[4200], where[4400], *base_json = NULL;
  mf_status st = MF_OK;
  int bf16 = 0, found = 0;
  const int is_lora = cfg->train.lora.rank > 0;
  MF_CHECK_GOTO(mf_run_model_table(cfg, NULL, info->source, &t), st, done);
  MF_CHECK_GOTO(mf_run_base_read_ckpt(info->source, is_lora,
                                      is_lora && adapter ? "the adapter dir records the base loaded now"
                                                         : "the export goes on",
                                      &rec, &found, where, sizeof where),
                st, done);
  if (found)
    MF_CHECK_GOTO(mf_run_base_check_spec(&rec, where, cfg, &t->spec, "the run", MF_BASE_WAY_OUT_RUN), st, done);
  if (!is_lora) goto done;
  *lora = 1;
  MF_CHECK_GOTO(mf_ckpt_base_is_bf16(info->source, &bf16), st, done);
  /* the frozen part of w is never touched with a bf16 home: its pages are never committed */
  MF_CHECK_GOTO(mf_malloc((size_t)t->total_numel * sizeof(float) + 1, "the weights", (void **)&w), st, done);
  if (bf16)
    MF_CHECK_GOTO(mf_malloc((size_t)t->total_numel * sizeof(uint16_t) + 1, "the bf16 base", (void **)&home),
                  st, done);
  MF_CHECK_GOTO(mf_param_table_alloc_qhome(t), st, done);
  MF_CHECK_GOTO(mf_threadpool_create(0, &pool), st, done);
  MF_CHECK_GOTO(mf_run_load_weights_home(cfg, NULL, t, w, home, pool, desc, sizeof desc), st, done);
  MF_CHECK_GOTO(mf_ckpt_read_master(info->source, t, w), st, done);
  MF_CHECK_GOTO(mf_ckpt_check_base(info->source, t, w, home), st, done);
  if (adapter) { /* the base's record beside the adapters: the base as loaded, the run's once compared */
    MF_CHECK_GOTO(mf_run_base_id(cfg, t, w, home, bf16, pool, &have), st, done);
    if (found) MF_CHECK_GOTO(mf_base_id_compare(&rec, where, &have, "the run", MF_BASE_WAY_OUT_RUN), st, done);
    MF_CHECK_GOTO(mf_base_id_format(&have, &base_json), st, done);
    st = mf_ckpt_export_adapter(t, w, cfg->model.has_init ? NULL : cfg->model.path, base_json, out, info);
  } else {
    mf_ckpt_export_opts oh = *o;
    oh.frozen_bf16 = home;
    mf_ckpt_export_tokenizer_of(cfg, &oh); /* the base's tokenizer: model.path's files */
    st = mf_ckpt_export_model(t, w, info->source, out, &oh, info);
    if (t->base_quant != MF_QUANT_NONE)
      snprintf(quant_note, note_cap,
               "the base as the run trained over it: its %s weights dequantized, then the adapters merged (as "
               "PEFT merges over a 4-bit base), not the original base's values",
               mf_quant_name(t->base_quant));
  }
done:
  free(base_json);
  mf_base_id_free(&have);
  mf_base_id_free(&rec);
  mf_threadpool_free(pool);
  free(home);
  free(w);
  mf_param_table_free(t);
  mf_config_free(cfg);
  return st;
}

int mf_cli_export(int argc, char **argv) {
  if (mf_cli_wants_help(argc, argv)) {
    printf("%s", k_export_usage);
    return MF_EXIT_OK;
  }
  const char *src = NULL, *out = NULL, *dtype = "bf16", *shard = "5GB";
  int adapter = 0;
  for (int i = 1; i < argc; i++) {
    const char **slot = NULL;
    if (strcmp(argv[i], "--adapter") == 0)
      adapter = 1;
    else if (strcmp(argv[i], "--out") == 0)
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
  mf_ckpt_export_opts o = {MF_DTYPE_BF16, 0, NULL, NULL, NULL};
  if (strcmp(dtype, "fp32") == 0 || strcmp(dtype, "f32") == 0 || strcmp(dtype, "float32") == 0)
    o.dtype = MF_DTYPE_F32;
  else if (strcmp(dtype, "bf16") != 0 && strcmp(dtype, "bfloat16") != 0)
    return mf_cli_usage_error("export", "--dtype %s: bf16 or fp32", dtype);
  if (mf_parse_size(shard, &o.max_shard_bytes) != 0 || o.max_shard_bytes == 0)
    return mf_cli_usage_error("export", "--shard-size %s: not a size (e.g. 5GB, 500MiB)", shard);
  mf_ckpt_export_info info;
  int lora = 0;
  char quant_note[256];
  mf_status st = export_lora(src, out, adapter, &o, &info, &lora, quant_note, sizeof quant_note);
  if (st == MF_OK && !lora) {
    if (adapter)
      st = MF_ERR(MF_ERR_INVALID_ARG,
                  "--adapter: %s is not a LoRA run's (train.lora.rank 0): it has no adapters", info.source);
    else
      st = mf_ckpt_export(src, out, &o, &info);
  }
  if (st != MF_OK) return mf_cli_fail("export", st);
  if (adapter) {
    printf(
        "exported %s -> %s: the LoRA adapters as a PEFT adapter dir (adapter_config.json, "
        "adapter_model.safetensors)\n",
        info.source, out);
    printf("  %s\n", info.tokenizer_note);
    return MF_EXIT_OK;
  }
  printf("exported %s -> %s: %lld tensors, %.2f MiB %s, %s\n", info.source, out, (long long)info.tensors,
         (double)info.bytes / (1024.0 * 1024.0), o.dtype == MF_DTYPE_F32 ? "fp32" : "bf16",
         info.shards == 1 ? "model.safetensors" : "sharded");
  if (info.shards > 1)
    printf("  %zu shards of at most %s; model.safetensors.index.json\n", info.shards, shard);
  if (quant_note[0]) printf("  %s\n", quant_note);
  printf("  %s\n", info.tokenizer_note);
  return MF_EXIT_OK;
}
