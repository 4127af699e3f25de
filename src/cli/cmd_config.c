/* `moefit config CONFIG [key=value ...]`: load, check and print a config. */
#include <stdlib.h>
#include <string.h>

#include "src/cli/commands.h"
#include "src/config/config.h"

static void usage(FILE *f) {
  fputs(
      "usage: moefit config CONFIG [key.path=value ...]\n"
      "\n"
      "Loads the YAML file CONFIG, applies the key.path=value overrides in order,\n"
      "checks every value and prints the resolved config as YAML with every\n"
      "default filled in (the output loads back to the same config).\n"
      "A value is read as YAML: train.lr=1e-4  memory.device_budget=4GiB\n"
      "data.valid=null  model.init.mlp_only_layers=[0,2]. Sizes take units\n"
      "(512MiB, 24GiB; KiB/MiB/GiB are powers of 1024, KB/MB/GB of 1000).\n"
      "\n"
      "keys (default, meaning [type]):\n",
      f);
  mf_config_print_keys(f);
  fputs(
      "\n"
      "exit status: 0 the config is valid, 1 it is not (or cannot be read),\n"
      "2 usage error\n",
      f);
}

int mf_cli_config(int argc, char **argv) {
  const char *cmd = "config";
  if (mf_cli_wants_help(argc, argv)) {
    usage(stdout);
    return MF_EXIT_OK;
  }
  const char *path = NULL;
  const char **overrides = NULL;
  size_t n_overrides = 0;
  if (argc > 1 && mf_malloc((size_t)argc * sizeof *overrides, "overrides", (void **)&overrides) != MF_OK)
    return mf_cli_fail(cmd, MF_ERR_OUT_OF_MEMORY);
  int rc = MF_EXIT_OK;
  int dashdash = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!dashdash && strcmp(a, "--") == 0) {
      dashdash = 1;
    } else if (!dashdash && a[0] == '-' && a[1]) {
      rc = mf_cli_usage_error(cmd, "unknown option '%s'", a);
      break;
    } else if (!path) {
      path = a;
    } else if (!strchr(a, '=')) {
      rc = mf_cli_usage_error(cmd, "'%s' is not an override: overrides are key.path=value", a);
      break;
    } else {
      overrides[n_overrides++] = a;
    }
  }
  if (rc == MF_EXIT_OK && !path) rc = mf_cli_usage_error(cmd, "missing the CONFIG file");
  if (rc == MF_EXIT_OK) {
    mf_config *cfg = NULL;
    mf_status st = mf_config_load(path, overrides, n_overrides, &cfg);
    if (st == MF_OK) st = mf_config_print(cfg, stdout);
    if (st != MF_OK) rc = mf_cli_fail(cmd, st);
    mf_config_free(cfg);
  }
  free(overrides);
  return rc;
}
