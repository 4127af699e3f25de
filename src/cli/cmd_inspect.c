/* `moefit inspect PATH`: a .tokens file, a safetensors file / index / model dir, a
 * training run, a resume checkpoint or a LoRA adapter dir. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "src/cli/commands.h"

static const char k_usage[] =
    "usage: moefit inspect PATH\n\n"
    "PATH is one of:\n"
    "  FILE.safetensors                    its tensors (name, dtype, shape, bytes), totals, metadata\n"
    "  model.safetensors.index.json        the same over every shard\n"
    "  MODEL_DIR                           a Hugging Face model directory's tensors\n"
    "  RUN_DIR                             a training run (train's output.dir): the steps done of those\n"
    "                                      planned, the first and last train loss, the eval losses,\n"
    "                                      tokens/s, the plan's predicted step time against the executed\n"
    "                                      one, the checkpoints and whether each is complete, final/\n"
    "  RUN_DIR/checkpoints/step-NNNNNN     a resume checkpoint: its files with their sizes and checksums,\n"
    "                                      each verified against manifest.json, and state.json (the step,\n"
    "                                      data position, learning rate, optimizer state)\n"
    "  ADAPTER_DIR                         a LoRA adapter dir (a LoRA run's final/): rank, alpha, target\n"
    "                                      modules, base model, the adapter tensors' count and bytes\n"
    "  FILE.tokens                         a token file's header and statistics\n\n"
    "A malformed file is reported with the file, the place and the fault (exit status 1); so is a\n"
    "checkpoint whose files do not match its manifest. `moefit plot RUN_DIR` draws a run's curves.\n";

/* A token file is recognised by its magic, so a renamed file still works. */
static int looks_like_tokens(const char *path) {
  size_t n = strlen(path);
  if (n >= 7 && strcmp(path + n - 7, ".tokens") == 0) return 1;
  int fd;
  if (mf_open_regular(path, NULL, &fd, NULL, NULL) != MF_OK) return 0; /* the safetensors reader says why */
  char magic[8] = {0};
  ssize_t got = read(fd, magic, sizeof magic);
  close(fd);
  return got == (ssize_t)sizeof magic && memcmp(magic, "MFTOKENS", 8) == 0;
}

int mf_cli_inspect(int argc, char **argv) {
  if (mf_cli_wants_help(argc, argv)) {
    printf("%s", k_usage);
    return MF_EXIT_OK;
  }
  if (argc != 2) return mf_cli_usage_error("inspect", "expected exactly one PATH");
  const char *path = argv[1];
  if (access(path, F_OK) != 0) {
    fprintf(stderr, "moefit inspect: error: %s: no such file or directory\n", path);
    return MF_EXIT_FAIL;
  }
  if (looks_like_tokens(path)) return mf_cli_inspect_tokens(path);
  if (mf_cli_is_checkpoint_dir(path)) return mf_cli_inspect_checkpoint(path);
  if (mf_cli_is_adapter_dir(path)) return mf_cli_inspect_adapter(path);
  if (mf_cli_is_run_dir(path)) return mf_cli_inspect_run(path);
  return mf_cli_inspect_safetensors(path);
}
