/* `moefit inspect PATH`: a .tokens file, or a safetensors file / index / model dir. */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "src/cli/commands.h"

static const char k_usage[] =
    "usage: moefit inspect PATH\n\n"
    "PATH is one of:\n"
    "  FILE.safetensors                    its tensors (name, dtype, shape, bytes), totals, metadata\n"
    "  model.safetensors.index.json        the same over every shard\n"
    "  DIR                                 a model or checkpoint directory\n"
    "  FILE.tokens                         a token file's header and statistics\n\n"
    "A malformed file is reported with the file, the place and the fault (exit status 1).\n";

/* A token file is recognised by its magic, so a renamed file still works. */
static int looks_like_tokens(const char *path) {
  size_t n = strlen(path);
  if (n >= 7 && strcmp(path + n - 7, ".tokens") == 0) return 1;
  int fd = open(path, O_RDONLY);
  if (fd < 0) return 0;
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
  return looks_like_tokens(path) ? mf_cli_inspect_tokens(path) : mf_cli_inspect_safetensors(path);
}
