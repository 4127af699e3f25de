/*
 * Resume checkpoints: everything a training run carries from one step to the
 * next, written so that a run continued from it takes the same steps, bit for
 * bit, as one that never stopped.
 *
 * Layout: <output.dir>/checkpoints/step-NNNNNN/ (N the optimizer steps done)
 *
 *   master.safetensors[.zst]    fp32 master weights, one tensor per parameter
 *                               under its HF name
 *   optimizer.safetensors[.zst] AdamW moments as stored (F32 or BF16):
 *                               exp_avg.<name>, exp_avg_sq.<name>
 *   state.safetensors           adam_step [n_params] I64 (each parameter's
 *                               AdamW step count: advanced only when it got a
 *                               gradient), routed_tokens [layers, experts] I64
 *                               (the routing statistics summed over the steps)
 *   state.json                  the step, the schedule position (the next
 *                               step's learning rate is lr_at(step + 1)), the
 *                               data order and position (the loader's seed,
 *                               epoch and index: its xoshiro256** generator is
 *                               a function of (seed, epoch), so these are its
 *                               whole state), skipped steps, step 1's loss,
 *                               the ranks, the model's sizes, the moments'
 *                               dtype, the compression and the filter
 *   config.yaml                 the config as resolved (mf_config_print)
 *   plan.json                   the plan the run followed (a copy; when the
 *                               run has OUTPUT/plan.json)
 *   base.json                   the run's base identity (mf_ckpt_data.base_json;
 *                               when it has one)
 *   manifest.json               every file above, each once: its name, bytes
 *                               on disk and their checksum ("bytes", "hash"),
 *                               how it is read ("compression": zstd|none,
 *                               "filter": byteplane|none), the file as read
 *                               ("raw_bytes", "raw_hash": decompressed, planes
 *                               joined); sealed by its last line,
 *                               "manifest_hash": the checksum of every byte
 *                               before that line
 *   COMPLETE                    written last: the checkpoint is whole
 *
 * `.zst` files are one zstd frame of the safetensors file. With the byte-plane
 * filter ("filter": "byteplane", in the manifest entry and in state.json) the
 * frame holds the file with its tensor data filtered: the header as it is,
 * then the data section (all one dtype of w bytes) in blocks of 4 MiB (the
 * last shorter), each block of n elements written as w planes of n bytes,
 * plane b holding byte b of every element (the sign and exponent bytes of
 * similar values then sit together, where zstd finds them). The checksum is
 * mf_ckpt_hash64: FNV-1a 64 over the bytes taken as little-endian 8-byte
 * words (the tail zero-padded), the length mixed in last.
 *
 * Reading trusts nothing before it is verified (issue 28, never silently
 * wrong): the manifest's seal first, then its entries parsed strictly (every
 * key known and present; a filter or compression it does not know is an
 * error, never "none"), the files it lists (each known file once, the
 * required ones all there: master, optimizer, state.safetensors, state.json,
 * config.yaml) against those on disk (a known file not listed is refused),
 * each file's bytes against its checksum before its content is parsed or
 * compared (a damaged config.yaml is damaged, not a setting that differs),
 * state.json against itself and the manifest, and a tensor file once
 * decompressed against raw_hash. A manifest without its seal (version 1,
 * written before it) is refused: what it says about how its files are read
 * was never checked.
 *
 * Writing: into checkpoints/.tmp-step-NNNNNN (each file fsynced), the
 * directory fsynced, renamed to step-NNNNNN, the parent fsynced, then COMPLETE
 * written and fsynced. A directory without COMPLETE is a checkpoint that was
 * being written when the run died: resume passes over it.
 */
#ifndef MF_CKPT_CKPT_H
#define MF_CKPT_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "src/config/config.h"
#include "src/core/core.h"
#include "src/model/base_id.h"
#include "src/model/params.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The large state: the caller's buffers, read when writing, filled when
 * reading (each in the parameter table's layout). */
typedef struct mf_ckpt_data {
  const mf_param_table *t;
  float *master;       /* [t->total_numel] fp32 master weights (of them the trained parameters' are saved) */
  void *m, *v;         /* [t->trainable_numel] AdamW moments, `moments` each (at mf_param.toff) */
  mf_dtype moments;    /* MF_DTYPE_F32 or MF_DTYPE_BF16 */
  int64_t *adam_steps; /* [t->n] */
  int64_t *routed;     /* [n_routed] tokens routed to each expert (layers x experts) */
  size_t n_routed;
  /* LoRA (t->lora_a): the frozen base is not saved, only its identity, this
   * checksum of its weights (mf_ckpt_base_sum): a checkpoint read onto
   * another base is refused. 0 without LoRA. */
  uint64_t base_sum;
  int base_bf16; /* base_sum is of the base's bf16 values (its bf16 home), else of its fp32 ones */
  /* master holds the trained parameters only, each at its mf_param.toff (a
   * LoRA run's snapshot: src/train/ckpt_async.c); else the table's layout */
  int master_at_toff;
  /* The run's base identity (issue 28: which base model, spec and weights, a
   * checkpoint or adapter belongs to): a NUL-terminated JSON document the
   * writer stores as base.json, listed and checksummed in the manifest like
   * every other file (mf_ckpt_read_base_json gives it back verified); NULL:
   * none. Written beside training, it must stay valid until the write is
   * done. */
  const char *base_json;
} mf_ckpt_data;

/* The checksum of the frozen parameters' weights, in parameter order, as
 * mf_ckpt_hash64 over their bytes: their fp32 values in w, or with
 * frozen_bf16 (their bf16 home, params.h mf_lora_base_bf16) its bf16 ones
 * (the table's layout); 0 when none is frozen. */
uint64_t mf_ckpt_base_sum(const mf_param_table *t, const float *w, const uint16_t *frozen_bf16);

/* The small state: what the loop carries besides the tensors. */
typedef struct mf_ckpt_state {
  int64_t step;            /* optimizer steps done (skipped ones included) */
  int64_t skipped;         /* of them, skipped for non-finite gradients */
  double first_loss;       /* step 1's loss */
  double lr;               /* the learning rate of step `step` (for people) */
  int64_t train_steps;     /* train.steps of the run that wrote it */
  uint64_t data_epoch;     /* the training loader (train/loader.h mf_loader_state) */
  uint64_t data_index;
  uint64_t data_seed;
  uint64_t data_windows;
  /* The data-parallel ranks of the run that wrote it (0 taken as 1; absent
   * in checkpoints of one rank written before ranks existed): a step was
   * ranks x train.grad_accum micro-batches. */
  int64_t ranks;
} mf_ckpt_state;

/* One checkpoint's figures. */
typedef struct mf_ckpt_stats {
  char dir[4200];     /* the checkpoint's directory */
  double seconds;     /* wall time of the write, fsyncs included */
  uint64_t bytes;     /* bytes on disk */
  uint64_t raw_bytes; /* bytes before compression */
} mf_ckpt_stats;

/* FNV-1a 64 over little-endian 8-byte words (see above), streamed. */
typedef struct mf_ckpt_hash {
  uint64_t h, len;
  uint8_t tail[8];
  unsigned n_tail;
} mf_ckpt_hash;

void mf_ckpt_hash_init(mf_ckpt_hash *s);
void mf_ckpt_hash_update(mf_ckpt_hash *s, const void *bytes, size_t n);
uint64_t mf_ckpt_hash_final(const mf_ckpt_hash *s);
uint64_t mf_ckpt_hash64(const void *bytes, size_t n);

/* ------------------------------------------------------------- writing */

typedef struct mf_ckpt_writer mf_ckpt_writer;

/* A writer for cfg's run: output.dir, output.checkpoint_compression (zstd
 * with train.threads workers where the library has them), output.
 * keep_checkpoints, the resolved config (printed now) and OUTPUT/plan.json.
 * Its buffers are sized once here. */
mf_status mf_ckpt_writer_create(const mf_config *cfg, mf_ckpt_writer **out);
void mf_ckpt_writer_free(mf_ckpt_writer *w); /* NULL is fine */

/* Writes checkpoints/step-NNNNNN (s->step) as above, then removes complete
 * checkpoints older than the newest output.keep_checkpoints. A checkpoint of
 * that step already there is replaced (a resumed run repeating a step). On
 * failure nothing named step-NNNNNN is left incomplete by this call and the
 * earlier checkpoints are untouched. */
mf_status mf_ckpt_write(mf_ckpt_writer *w, const mf_ckpt_data *d, const mf_ckpt_state *s, mf_ckpt_stats *out);
/* mf_ckpt_write in two halves, for a caller that records something of the
 * step between them: everything but COMPLETE (the checkpoint exists but
 * resume passes over it), then COMPLETE and the pruning. The training loop
 * writes its step's metrics line in between, so that a run killed before the
 * line was written resumes from the checkpoint before, whose line is there. */
mf_status mf_ckpt_write_files(mf_ckpt_writer *w, const mf_ckpt_data *d, const mf_ckpt_state *s,
                              mf_ckpt_stats *out);
mf_status mf_ckpt_commit(mf_ckpt_writer *w, int64_t step);

/* ------------------------------------------------------------- reading */

/* One file of a checkpoint as the manifest lists it. */
typedef struct mf_ckpt_file {
  char name[64];
  uint64_t bytes;     /* on disk */
  uint64_t hash;      /* mf_ckpt_hash64 of those bytes */
  uint64_t raw_bytes; /* before compression (== bytes when none) */
  int zstd;           /* 1: one zstd frame */
  int byteplane;      /* 1: the tensor data went through the byte-plane filter before zstd */
  uint64_t raw_hash;  /* mf_ckpt_hash64 of the raw_bytes (the file as read: decompressed, planes joined) */
} mf_ckpt_file;

/* Reads dir/manifest.json (checked as mf_ckpt_verify checks it; the files
 * themselves are not read): its first `cap` entries into files[], their
 * count in *n (`moefit inspect` lists them). An error names the file and
 * the fault (MF_ERR_FORMAT; MF_ERR_IO when it cannot be read). */
mf_status mf_ckpt_read_manifest(const char *dir, mf_ckpt_file *files, int cap, int *n);

/* Checks a checkpoint directory whole: COMPLETE present, manifest.json sealed
 * and well formed (above), every file it names present with its size and
 * checksum and no known file left out, state.json consistent in itself
 * (skipped <= step <= train_steps, the data index inside its windows, ranks
 * >= 1) and with the manifest (compression, filter). An error names the file
 * and the fault (MF_ERR_FORMAT; MF_ERR_IO when a file cannot be read). */
mf_status mf_ckpt_verify(const char *dir);

/* The steps of the checkpoint directories (step-NNNNNN) in root, in
 * directory order, at most cap of them into steps[], their count in *n; with
 * complete_only, only those with a COMPLETE marker (not verified). Returns 0,
 * or the errno of opening root (nothing set in the error state: each caller
 * says what a missing root means to it). */
int mf_ckpt_list_steps(const char *root, int complete_only, int64_t *steps, size_t cap, size_t *n);

/* The checkpoint to resume from under output_dir/checkpoints: the highest
 * step that verifies; each newer one that does not is passed over with a
 * warning naming its fault. MF_ERR_CONFIG (a message saying where it looked)
 * when none verifies. */
mf_status mf_ckpt_find_latest(const char *output_dir, char *dir, size_t cap);

/* Verifies the manifest, config.yaml and state.json (a damaged one is
 * MF_ERR_FORMAT naming it), then refuses (MF_ERR_CONFIG) a checkpoint
 * written under a config whose maths differ from cfg's: the model,
 * data.train, data.seq_len and the train.*
 * keys (train.steps, threads, log_every, eval_every and overlap_optimizer
 * excepted), naming the keys that differ with both values' sources.
 * train.grad_accum may differ when the micro-batches of a step do not: the
 * checkpoint's ranks (state.json) x its grad_accum against cfg->ranks x
 * cfg's (the same step spread over another number of ranks). */
mf_status mf_ckpt_check_config(const char *dir, const mf_config *cfg);
/* dir/config.yaml loaded for `use` once it and the manifest are verified (a
 * damaged one is MF_ERR_FORMAT naming it, never a config difference);
 * mf_ckpt_check_config reads it this way, as should anyone loading a
 * checkpoint's config (export). *cfg NULL on failure. */
mf_status mf_ckpt_load_config(const char *dir, mf_config_use use, mf_config **cfg);

/* Verifies dir (mf_ckpt_verify), then reads it into d's buffers (d->t the
 * run's table: a tensor missing, of another shape or dtype is MF_ERR_FORMAT
 * naming the file and the tensor) and *s: state.json's model sizes, routing
 * counts, moments and (LoRA) base checked against d, each tensor file once
 * decompressed against its raw_hash, and every parameter's AdamW step count
 * at most the steps not skipped. */
mf_status mf_ckpt_read(const char *dir, const mf_ckpt_data *d, mf_ckpt_state *s);

/* Verifies dir, then reads only its master weights into master[t->total_numel]
 * (t: the checkpoint's model; a tensor missing or of another shape is
 * MF_ERR_FORMAT naming the file and the tensor): the trained parameters' (a
 * LoRA table's frozen base is not in a checkpoint: the caller loads it). */
mf_status mf_ckpt_read_master(const char *dir, const mf_param_table *t, float *master);
/* A LoRA checkpoint's base identity against the base in w, or in its bf16
 * home (t's frozen weights): MF_ERR_CONFIG naming state.json when the
 * checksums differ. mf_ckpt_base_is_bf16: whether dir's record is of bf16
 * values (state.json base_sum_of), so the caller loads the base that way. */
mf_status mf_ckpt_check_base(const char *dir, const mf_param_table *t, const float *w,
                             const uint16_t *frozen_bf16);
mf_status mf_ckpt_base_is_bf16(const char *dir, int *bf16);
/* A LoRA checkpoint's hot experts (train.lora.experts: hot; state.json
 * lora_hot, one list of expert indices per layer, which mf_ckpt_save writes
 * from t->lora.hot) as hot[layers * experts] (malloc'd, the caller frees):
 * resume and export rebuild the table the run trained, whatever routing is
 * measured since. MF_ERR_FORMAT naming state.json when it is missing or not
 * of this shape. */
mf_status mf_ckpt_read_lora_hot(const char *dir, int64_t layers, int64_t experts, uint8_t **hot);

/* dir's base.json (mf_ckpt_data.base_json), verified against the manifest
 * first (its size and checksum; the manifest's own checksum): *json the
 * malloc'd NUL-terminated text (the caller frees), or NULL with MF_OK when
 * the checkpoint has none. A damaged or unlisted file is MF_ERR_FORMAT
 * naming it. */
mf_status mf_ckpt_read_base_json(const char *dir, char **json);

/* ------------------------------------------------------------- export */

typedef struct mf_ckpt_export_opts {
  mf_dtype dtype;             /* MF_DTYPE_F32 or MF_DTYPE_BF16 */
  uint64_t max_shard_bytes;   /* tensor bytes per shard (0: 5 GB, transformers' default) */
  /* mf_ckpt_export_model: the frozen parameters' bf16 home (LoRA's base loaded
   * straight into bf16: mf_params_load_home), or NULL: they are in w */
  const uint16_t *frozen_bf16;
  /* mf_ckpt_export_model: the base model dir whose tokenizer and chat-template
   * files (tokenizer.json, tokenizer_config.json, special_tokens_map.json,
   * tokenizer.model, vocab.json, merges.txt, added_tokens.json,
   * chat_template.jinja, chat_template.json: those present) are copied into
   * the export byte for byte, before it is renamed into place; NULL: none, for
   * the reason tokenizer_none (info->tokenizer_note). mf_ckpt_export_tokenizer_of
   * sets both from a run's config; mf_ckpt_export finds them itself. */
  const char *tokenizer_dir;
  const char *tokenizer_none;
} mf_ckpt_export_opts;

typedef struct mf_ckpt_export_info {
  char source[4200];  /* the checkpoint or final/ dir the weights came from */
  size_t shards;      /* 1: model.safetensors, else model-0000i-of-0000n */
  uint64_t bytes;     /* tensor bytes written */
  int64_t tensors;
  int tokenizer_files;       /* tokenizer files copied */
  char tokenizer_note[4800]; /* one line: which were copied from where, or why none */
} mf_ckpt_export_info;

/* The tokenizer of an export of a run with config cfg: model.path's files, or
 * none when the model came from model.init (o's tokenizer_* point into cfg). */
void mf_ckpt_export_tokenizer_of(const mf_config *cfg, mf_ckpt_export_opts *o);

/* Writes a Hugging Face model dir at out_dir from `src`: a checkpoint dir
 * (verified whole; its model from its config.yaml), or a run's output dir (its
 * newest complete checkpoint, else its final/). Files: config.json (torch_dtype
 * the export's dtype), model.safetensors or model-0000i-of-0000n.safetensors
 * with model.safetensors.index.json (over max_shard_bytes),
 * generation_config.json, and the tokenizer files of the checkpoint's
 * model.path (o's tokenizer_* are not read; a model.init run, or a final/
 * without a checkpoint, has none: info->tokenizer_note says so). Written
 * into a temporary sibling dir that is renamed into place: out_dir appears
 * whole or not at all. A non-empty out_dir is refused (MF_ERR_INVALID_ARG). */
mf_status mf_ckpt_export(const char *src, const char *out_dir, const mf_ckpt_export_opts *o, mf_ckpt_export_info *info);
/* Its parts, for weights the caller has (a LoRA run's: the base loaded, the
 * adapters from a checkpoint). mf_ckpt_export_source: which weights `src`
 * names, as above (*is_ckpt: a checkpoint dir, else a run's final/).
 * mf_ckpt_export_model: the model dir of t's weights w (LoRA: the adapted
 * weights merged, mf_params_merged), info->source set to `source`.
 * mf_ckpt_export_adapter: a PEFT adapter dir of t's adapters
 * (mf_params_save_adapter_dir; base_model: its base_model_name_or_path, and
 * the dir whose tokenizer files are copied beside the adapters; NULL: a
 * model.init base, none; base_json: the base's record, written beside them
 * as moefit_base.json with the adapter files' checksums
 * (mf_ckpt_adapter_record_write), or NULL). Both write into a
 * temporary sibling renamed into place; out_dir must not exist
 * or be empty. */
mf_status mf_ckpt_export_source(const char *src, mf_ckpt_export_info *info, int *is_ckpt);
mf_status mf_ckpt_export_model(const mf_param_table *t, const float *w, const char *source,
                               const char *out_dir, const mf_ckpt_export_opts *o, mf_ckpt_export_info *info);
mf_status mf_ckpt_export_adapter(const mf_param_table *t, const float *w, const char *base_model,
                                 const char *base_json, const char *out_dir, mf_ckpt_export_info *info);

/* An adapter dir's record: its base's (src/model/base_id.h, version 2) with
 * the size and checksum of each file PEFT reads (adapter_model.safetensors,
 * adapter_config.json: PEFT's own files carry none), sealed by a closing
 * "record_hash", the checksum of every byte above it.
 * mf_ckpt_adapter_record_write: DIR/moefit_base.json (atomically) from
 * base_json, the base's record as mf_base_id_format gives it, with the
 * checksums of the adapter files now in DIR; files 0: without them, the
 * record written before the files are (one left so says they may not be
 * whole).
 * mf_ckpt_adapter_record_read: DIR/moefit_base.json (*found 0 and rec zeroed
 * when there is none), its seal verified before anything it says is read
 * (a damaged record is reported damaged), then the files against it: a file
 * changed, cut or missing, or a record that lists none, is MF_ERR_FORMAT
 * naming the file and the way out. A version 1 record (no files, no seal) is
 * read with a warning that the files cannot be checked. */
mf_status mf_ckpt_adapter_record_write(const char *dir, const char *base_json, int files);
mf_status mf_ckpt_adapter_record_read(const char *dir, mf_base_id *rec, int *found);

#ifdef __cplusplus
}
#endif

#endif /* MF_CKPT_CKPT_H */
