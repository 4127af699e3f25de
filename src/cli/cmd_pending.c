/* Subcommands whose machinery is not built yet. Each has its real usage text and
 * says plainly that it is not built, exiting non-zero: no fake output. */
#include <stdio.h>

#include "src/cli/commands.h"

typedef struct {
  const char *name;
  const char *usage;
  const char *missing;
} pending_command;

static int run_pending(const pending_command *c, int argc, char **argv) {
  if (mf_cli_wants_help(argc, argv)) {
    printf("%s", c->usage);
    printf("\nstatus: not built yet (%s).\n", c->missing);
    return MF_EXIT_OK;
  }
  fprintf(stderr, "moefit %s: not built yet: %s\n", c->name, c->missing);
  return MF_EXIT_FAIL;
}




static const pending_command k_export = {
    "export",
    "usage: moefit export RUN_DIR|CHECKPOINT --out DIR [--dtype bf16|fp32]\n\n"
    "Writes a checkpoint's weights as a Hugging Face model directory (sharded safetensors +\n"
    "config.json).\n",
    "checkpoints come with the training work"};

int mf_cli_export(int argc, char **argv) { return run_pending(&k_export, argc, argv); }
