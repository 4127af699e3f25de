/* `moefit bench kernels`' copies section (bench_copies.c): host<->device
 * copies on the bench's backend, straight from pinned memory and through the
 * staging slabs with the executor's own code. Private to src/cli. */
#ifndef MF_CLI_BENCH_COPIES_H
#define MF_CLI_BENCH_COPIES_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/backend.h"
#include "planner/run_plan.h"
#include "src/config/config.h"
#include "src/core/core.h"

/* What the copies run on: the bench's backend, its timed stream and device
 * memory (2 x bytes, not in use), the bytes each way, the best of `reps`. */
typedef struct mf_cli_copies_in {
  mf_backend *b;
  mf_stream *s;
  uint8_t *dev;
  size_t bytes;
  int reps;
} mf_cli_copies_in;

/* How the staged copies are staged (bench_copies.c mf_cli_copies_layout). */
typedef struct mf_cli_copies_layout {
  size_t slab_bytes;
  int slabs;    /* in flight, each way */
  int threads;  /* host threads per fill, per copy-out */
  int planned;  /* 1: the chosen plan's layout; 0: it stages nothing, the defaults */
  size_t bytes; /* staged each way (the pinned copies' bytes, or fewer: at most 16384 slabs) */
} mf_cli_copies_layout;

/* Seconds of each copy (the best of reps) and what they give. */
typedef struct mf_cli_copies {
  mf_cli_copies_layout lay;
  size_t bytes;                  /* each pinned copy's */
  double h2d_s, d2h_s;           /* alone */
  double both_s;                 /* h2d and d2h at once, first start to last end */
  double both_h2d_s, both_d2h_s; /* each direction's own time in it */
  double h2d_staged_s, d2h_staged_s;
  /* of them (the best run's), the host's: the slab fills and the copy-outs
   * (mf_exec_stager_host_seconds; NAN untimed) */
  double h2d_fill_s, d2h_drain_s;
  size_t pinned_staging_bytes; /* the stager's rings */
} mf_cli_copies;

/* The slabs, slabs in flight and threads of rp's run of cfg (top of bench_copies.c). */
void mf_cli_copies_layout_of(const mf_run_plan *rp, const mf_config *cfg, size_t bytes,
                             mf_cli_copies_layout *out);
mf_status mf_cli_copies_measure(const mf_cli_copies_in *in, const mf_cli_copies_layout *lay,
                                mf_cli_copies *out);
mf_status mf_cli_copies_print(const mf_cli_copies *c, const char *backend);
json_t *mf_cli_copies_json(const mf_cli_copies *c);

#endif /* MF_CLI_BENCH_COPIES_H */
