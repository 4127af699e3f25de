/*
 * The training data loader: fixed-length samples from a .tokens file.
 *
 * Samples. The file's token stream is cut into windows of S + 1 consecutive
 * tokens (S = seq_len) that start at multiples of S, so neighbouring windows
 * share one token and every token but the first is a target exactly once:
 *
 *   window w = tokens [w·S, w·S + S]      inputs  = window[0 .. S)
 *   windows  = (count - 1) / S            targets = window[1 .. S]
 *
 * A partial window at the end is dropped. A target whose loss-mask bit is 0
 * (prompt, system text) becomes -1: the loss ignores it but the model still
 * reads the token as input.
 *
 * Packing. Windows ignore document boundaries: a window may end one document
 * and begin the next, with attention across the boundary and position ids that
 * run 0..S-1 over the whole window. This wastes no tokens on padding and is what
 * most pre-training and fine-tuning recipes do with packed data;
 * tools/prepare_data.py ends each text document with the tokenizer's EOS
 * (unless --no-eos) so the model sees where one ends. (Per-document masking and position resets would need a
 * document-aware attention kernel; the .tokens file keeps the document starts
 * should that come.)
 *
 * Order. TRAIN visits every window once per epoch in an order shuffled by a
 * seeded PRNG (xoshiro256**, seeded through splitmix64 from (seed, epoch)), so
 * the order depends only on (seed, epoch) and is the same on every platform.
 * Epochs follow each other without a gap: a micro-batch that crosses the end of
 * an epoch takes its remaining windows from the next epoch's order, so every
 * TRAIN batch is full. EVAL visits the windows in file order; its last batch of
 * a pass may hold fewer than micro_batch sequences.
 *
 * Memory. create allocates the epoch permutation (8 bytes per window: 8 MiB for
 * a billion tokens at S = 1024) and a scratch window; next allocates nothing.
 * The file stays memory-mapped (mf_tokens_open); a loader is not thread-safe.
 */
#ifndef MF_TRAIN_LOADER_H
#define MF_TRAIN_LOADER_H

#include <stdint.h>

#include "src/core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mf_loader_mode {
  MF_LOADER_TRAIN = 0, /* shuffled per epoch, endless, full batches */
  MF_LOADER_EVAL = 1,  /* file order, passes end, last batch may be partial */
} mf_loader_mode;

typedef struct mf_loader mf_loader;

/* Where the loader stands, for resume checkpoints. epoch counts epochs (TRAIN)
 * or passes (EVAL) from 0; index is the number of windows of that epoch already
 * handed out (0 <= index < windows). seed and windows are recorded so that
 * set_state can refuse a state taken with other data, seq_len or seed. */
typedef struct mf_loader_state {
  uint64_t epoch;
  uint64_t index;
  uint64_t seed;
  uint64_t windows;
} mf_loader_state;

/* What one call of mf_loader_next produced. */
typedef struct mf_loader_batch {
  int64_t n_seq;     /* sequences filled: micro_batch, or fewer in EVAL's last batch */
  int64_t n_targets; /* targets that count (not -1) in those sequences */
  int end_of_pass;   /* this batch held the last window of an epoch (TRAIN) or pass (EVAL) */
  uint64_t epoch;    /* the epoch or pass the batch's first window belongs to */
} mf_loader_batch;

/* Opens and validates `path` (mf_tokens_open) and prepares epoch 0 (or pass 0).
 * MF_ERR_CONFIG, naming the value, for seq_len < 1 or micro_batch < 1 (or sizes
 * past int32 positions / size_t buffers), and, naming the file and the numbers,
 * for a file of fewer than seq_len + 1 tokens. Ids must fit int32 (vocab <=
 * 2^31). Checking the vocab against the model is the caller's (mf_loader_vocab).
 * On failure *out is NULL. */
mf_status mf_loader_create(const char *path, int64_t seq_len, int64_t micro_batch, uint64_t seed,
                           mf_loader_mode mode, mf_loader **out);
void mf_loader_free(mf_loader *l); /* NULL is fine */

/* Where a data file was named, for its messages (mf_loader_open). */
typedef struct mf_loader_origin {
  const char *key;       /* "data.train", "data.valid" or "--tokens" */
  const char *where;     /* the key's place in the config (config.h mf_config_where: "configs/x.yaml:22:10"
                            or "command line: data.train=X"), or NULL */
  const char *model_dir; /* model.path: the tokenizer a how-to names (NULL: a placeholder) */
} mf_loader_origin;

/* mf_loader_create for the data file a config key names, every error
 * prefixed by the key's place and the key ("configs/x.yaml:22:10: data.train:
 * PATH: No such file or directory"; "command line: data.train: PATH: ..." for
 * an override). A
 * file that is not a .tokens file says what it looks like (src/io/tokens.h
 * mf_tokens_sniff: JSONL, plain text, YAML, JSON, safetensors, empty, ...)
 * and how to make one (tools/prepare_data.py with a tokenizer; `moefit data
 * bytes` for byte-level tokens); one that begins with the .tokens magic gets
 * the reader's own message. */
mf_status mf_loader_open(const mf_loader_origin *o, const char *path, int64_t seq_len, int64_t micro_batch,
                         uint64_t seed, mf_loader_mode mode, mf_loader **out);

/* Fills one micro-batch, each a row-major [micro_batch, seq_len] int32 array:
 * ids[b,s] = window[s], targets[b,s] = window[s+1] or -1 (masked), positions[b,s]
 * = s. positions may be NULL. Rows past batch->n_seq (EVAL's last batch) are
 * padding: ids 0, targets -1, positions s, so a caller that always runs the full
 * shape adds nothing to the loss. After the batch that ends a pass, the next call
 * starts the next pass (EVAL: from the first window again). `batch` may be NULL.
 * Allocates nothing. */
mf_status mf_loader_next(mf_loader *l, int32_t *ids, int32_t *targets, int32_t *positions,
                         mf_loader_batch *batch);

void mf_loader_get_state(const mf_loader *l, mf_loader_state *out);
/* Continues from a state that get_state returned (this run's or a saved one), so
 * the batches that follow are the ones the saved run would have seen next.
 * MF_ERR_CONFIG when the state's seed (TRAIN only) or window count differ from
 * this loader's, or its index is not below the window count. */
mf_status mf_loader_set_state(mf_loader *l, const mf_loader_state *st);

uint64_t mf_loader_windows(const mf_loader *l);         /* samples per epoch */
int64_t mf_loader_tokens_per_batch(const mf_loader *l); /* micro_batch × seq_len */
int64_t mf_loader_seq_len(const mf_loader *l);
int64_t mf_loader_micro_batch(const mf_loader *l);
uint32_t mf_loader_vocab(const mf_loader *l); /* the file's: every id is below it */
/* Targets that count (mask bit 1) over all windows, / (windows × seq_len);
 * 1 for a file without a loss mask. */
double mf_loader_target_fraction(const mf_loader *l);
const char *mf_loader_path(const mf_loader *l);

#ifdef __cplusplus
}
#endif

#endif /* MF_TRAIN_LOADER_H */
