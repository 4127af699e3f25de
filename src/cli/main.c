/* moefit: the command-line entry point. Dispatches to the subcommands in cmd_*.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/cli/commands.h"

#ifndef MF_VERSION
#define MF_VERSION "0.1.0-dev"
#endif

typedef struct {
  const char *name;
  int (*run)(int argc, char **argv);
  const char *summary;
} command;

static const command k_commands[] = {
    {"train", mf_cli_train, "fine-tune a model from a YAML config (mpirun -np N: N data-parallel ranks)"},
    {"plan", mf_cli_plan, "show the planner's per-tensor decisions, memory and predicted step time"},
    {"eval", mf_cli_eval, "mean loss and perplexity of a model over a token file"},
    {"init", mf_cli_init, "write a randomly initialised model dir (config.json + safetensors)"},
    {"data", mf_cli_data, "make .tokens dataset files (byte-level tokenizer for the demo)"},
    {"config", mf_cli_config, "print a config with every default filled in, after overrides"},
    {"inspect", mf_cli_inspect,
     "summarise a run, checkpoint, adapter or model dir, safetensors or .tokens file"},
    {"plot", mf_cli_plot, "draw a run's loss and tokens/s curves from its metrics.jsonl as SVG"},
    {"profile", mf_cli_profile, "measure this machine's hardware profile for the planner"},
    {"export", mf_cli_export, "write a run or checkpoint as a Hugging Face model dir"},
    {"bench", mf_cli_bench, "benchmarks: host AdamW, the step's kernels (transfer: not built yet)"},
};
#define N_COMMANDS (sizeof k_commands / sizeof k_commands[0])

static void print_help(FILE *f) {
  fprintf(f,
          "moefit %s: fine-tune Mixture-of-Experts models larger than your GPU\n\n"
          "usage: moefit <command> [args]   (moefit <command> --help for details)\n\n"
          "commands:\n",
          MF_VERSION);
  for (size_t i = 0; i < N_COMMANDS; i++) fprintf(f, "  %-8s  %s\n", k_commands[i].name, k_commands[i].summary);
  fprintf(f,
          "\noptions:\n"
          "  -h, --help     this help\n"
          "  --version      print the version\n\n"
          "environment:\n"
          "  MF_LOG=error|warn|info|debug|trace   log level (default info)\n"
          "  MF_LOG_SUBSYS=io,config,...           limit debug/trace output to these subsystems\n"
          "  MF_THREADS=N                          host worker threads (default: all cores)\n\n"
          "Long options take their value as the next argument or after '=': --json FILE, --json=FILE.\n");
}

int main(int argc, char **argv) {
  /* `bazel run` starts us in the runfiles tree; work where the user typed the command. */
  const char *wd = getenv("BUILD_WORKING_DIRECTORY");
  if (wd && *wd && chdir(wd) != 0) {
    fprintf(stderr, "moefit: cannot enter %s\n", wd);
    return MF_EXIT_FAIL;
  }
  mf_log_configure(); /* a bad MF_LOG / MF_LOG_SUBSYS is reported by every command */
  mf_cli_remember_command(argc, argv); /* before mf_cli_split_options changes argv: resume hints repeat it */
  if (argc < 2) {
    print_help(stderr);
    return MF_EXIT_USAGE;
  }
  const char *cmd = argv[1];
  if (strcmp(cmd, "-h") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "help") == 0) {
    print_help(stdout);
    return MF_EXIT_OK;
  }
  if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "version") == 0) {
    printf("moefit %s\n", MF_VERSION);
    return MF_EXIT_OK;
  }
  for (size_t i = 0; i < N_COMMANDS; i++) {
    if (strcmp(cmd, k_commands[i].name) != 0) continue;
    int n = argc - 1;
    char **args = mf_cli_split_options(&n, argv + 1);
    if (!args) {
      fprintf(stderr, "moefit: out of memory\n");
      return MF_EXIT_FAIL;
    }
    const int rc = k_commands[i].run(n, args);
    free(args);
    return rc;
  }
  fprintf(stderr, "moefit: unknown command '%s'\n\n", cmd);
  print_help(stderr);
  return MF_EXIT_USAGE;
}
