/*
 * The `moefit` subcommands. Each takes argv with argv[0] = the subcommand's
 * name and returns the process exit code: 0 success, 1 a runtime failure
 * (bad input file, I/O, not built yet), 2 a usage error.
 */
#ifndef MF_CLI_COMMANDS_H
#define MF_CLI_COMMANDS_H

#include "src/config/config.h"
#include "src/core/core.h"
#include "src/model/params.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { MF_EXIT_OK = 0, MF_EXIT_FAIL = 1, MF_EXIT_USAGE = 2 };

int mf_cli_train(int argc, char **argv);
int mf_cli_plan(int argc, char **argv);
int mf_cli_eval(int argc, char **argv);
int mf_cli_init(int argc, char **argv);
int mf_cli_data(int argc, char **argv);
int mf_cli_config(int argc, char **argv);
int mf_cli_inspect(int argc, char **argv);
int mf_cli_profile(int argc, char **argv);
int mf_cli_export(int argc, char **argv);
int mf_cli_bench(int argc, char **argv);

/* `moefit bench kernels` (cmd_bench_kernels.c) and its usage text. */
int mf_cli_bench_kernels(int argc, char **argv);
extern const char mf_cli_bench_kernels_usage[];

/* `moefit inspect` on a safetensors file, a sharded index or a checkpoint/model dir. */
int mf_cli_inspect_safetensors(const char *path);
/* `moefit inspect` on a .tokens file: header and statistics. */
int mf_cli_inspect_tokens(const char *path);

/* Prints "moefit CMD: error: <last error>" (and the trace when MF_LOG=debug)
 * to stderr and returns MF_EXIT_FAIL. */
int mf_cli_fail(const char *cmd, mf_status s);
/* Prints "moefit CMD: <msg>" and a hint to run --help; returns MF_EXIT_USAGE. */
int mf_cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* 1 when any argument is -h or --help. */
int mf_cli_wants_help(int argc, char **argv);

/* SIGINT and SIGTERM as stop requests (core.h mf_stop_request) for a long
 * command (train, eval): the first only sets the flag, which the command's
 * loop reads between steps; a second one ends the process at once with
 * status 128 + its number (130, 143) through _exit, touching no file. */
void mf_cli_catch_stop(void);

/* The parameter table of cfg's model: model.init's, or the config.json of
 * model.path's checkpoint (the shapes only: no weights are read), with
 * train.lora's adapters (src/train/train.h mf_run_model_table). */
mf_status mf_cli_param_table(const mf_config *cfg, mf_param_table **out);

/* A command's arguments as main hands them over: "--name=value" split into
 * "--name" "value" for every command's options alike (key=value overrides
 * have no leading "--" and pass through; "--" ends the options). Returns a
 * new NULL-terminated argv to free() (argc updated; the strings are argv's,
 * changed in place), or NULL when out of memory. */
char **mf_cli_split_options(int *argc, char **argv);

#ifdef __cplusplus
}
#endif

#endif /* MF_CLI_COMMANDS_H */
