/* Whether an output directory already holds a training run (train.h
 * mf_train_check_output_dir): `moefit train` without --resume refuses one
 * rather than overwrite its metrics, weights and checkpoints.
 *
 * What marks a run: metrics.jsonl, final/ and checkpoints/ (train writes
 * metrics.jsonl before its first step). Not a run: plan.json (what `moefit
 * plan --json` may have written there first, and what train rewrites with
 * the same bytes), routing.json (an input of memory.routing auto, which a
 * user may copy in), hw-cuda.yaml (a cached profile) and data/ (the demo
 * keeps its token files in runs/demo/data). */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "src/ckpt/ckpt.h"
#include "src/train/train.h"

static int exists(const char *dir, const char *name, int want_dir) {
  char p[4400];
  struct stat sb;
  snprintf(p, sizeof p, "%s/%s", dir, name);
  if (lstat(p, &sb) != 0) return 0;
  return want_dir ? S_ISDIR(sb.st_mode) : 1;
}

/* The newest step-NNNNNN under dir/checkpoints with a COMPLETE marker ("" when
 * none). Only the marker is looked at: --resume verifies the files. */
static void newest_complete(const char *dir, char *name, size_t cap) {
  char root[4400];
  int64_t steps[4096], newest = -1;
  size_t n = 0;
  name[0] = '\0';
  snprintf(root, sizeof root, "%s/checkpoints", dir);
  if (mf_ckpt_list_steps(root, 1, steps, sizeof steps / sizeof steps[0], &n) != 0) return;
  for (size_t i = 0; i < n; i++)
    if (steps[i] > newest) newest = steps[i];
  if (newest >= 0) snprintf(name, cap, "step-%06lld", (long long)newest);
}

mf_status mf_train_check_output_dir(const char *dir, const char *resume_cmd) {
  struct stat sb;
  if (stat(dir, &sb) != 0) {
    if (errno == ENOENT) return MF_OK;
    return MF_ERR(MF_ERR_IO, "output.dir %s: stat: %s", dir, strerror(errno));
  }
  if (!S_ISDIR(sb.st_mode)) return MF_ERR(MF_ERR_CONFIG, "output.dir %s: exists and is not a directory", dir);
  static const struct {
    const char *name;
    int is_dir;
  } marks[] = {{"metrics.jsonl", 0}, {"final", 1}, {"checkpoints", 1}};
  char held[256] = "";
  size_t n = 0;
  for (size_t i = 0; i < sizeof marks / sizeof marks[0]; i++) {
    if (!exists(dir, marks[i].name, marks[i].is_dir)) continue;
    n += (size_t)snprintf(held + n, sizeof held - n, "%s%s%s", n ? ", " : "", marks[i].name,
                          marks[i].is_dir ? "/" : "");
  }
  if (n == 0) return MF_OK;
  char ckpt[64];
  newest_complete(dir, ckpt, sizeof ckpt);
  if (ckpt[0])
    return MF_ERR(
        MF_ERR_CONFIG,
        "output.dir %s holds an earlier run (%s; newest complete checkpoint %s/checkpoints/%s): training "
        "into it would overwrite that run, so nothing was changed. Continue it with `%s`, or give another "
        "output.dir (e.g. output.dir=%s-2)",
        dir, held, dir, ckpt, resume_cmd ? resume_cmd : "moefit train CONFIG --resume", dir);
  return MF_ERR(
      MF_ERR_CONFIG,
      "output.dir %s holds an earlier run (%s; no complete checkpoint to resume from): training into it "
      "would overwrite that run, so nothing was changed. Give another output.dir (e.g. output.dir=%s-2), "
      "or move the old run aside",
      dir, held, dir);
}
