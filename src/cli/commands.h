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
/* `moefit inspect` on a training run's output dir (cmd_inspect_run.c): the
 * steps, losses, throughput, checkpoints, final/ and the plan's prediction. */
int mf_cli_inspect_run(const char *dir);
/* ... on a resume checkpoint dir: its manifest, every file verified, state.json
 * (cmd_inspect_ckpt.c); exit 1 when a file does not match the manifest. */
int mf_cli_inspect_checkpoint(const char *dir);
/* ... on a LoRA (PEFT) adapter dir: adapter_config.json and the adapter tensors. */
int mf_cli_inspect_adapter(const char *dir);
/* What a directory holds: a run (metrics.jsonl, checkpoints/, or final/ with
 * plan.json), a checkpoint (manifest.json), an adapter dir
 * (adapter_config.json and adapter_model.safetensors, no model.safetensors). */
int mf_cli_is_run_dir(const char *dir);
int mf_cli_is_checkpoint_dir(const char *dir);
int mf_cli_is_adapter_dir(const char *dir);
/* `moefit plot RUN` (cmd_plot.c). */
int mf_cli_plot(int argc, char **argv);

/* The command line as main got it (argv[0] the program as typed), kept
 * before mf_cli_split_options changes it: what mf_cli_resume_command repeats. */
void mf_cli_remember_command(int argc, char **argv);
/* The shell command that continues this `moefit train` run: the remembered
 * command line, each word quoted where a shell needs it, with its
 * `--resume [DIR]` left out and `--resume` at the end (the newest complete
 * checkpoint). With `ranks` > 1 (under mpirun) the launcher's words come
 * first: mpirun's own (read from the parent process) when it is the mpirun
 * that ran this command line, else `mpirun -np RANKS` and *exact 0 (its
 * other options unknown). Under `bazel run`, `bazel run //:moefit --` for
 * the program. Into buf (cap bytes, cut as snprintf); returns the length
 * (0: nothing remembered). */
size_t mf_cli_resume_command(int ranks, char *buf, size_t cap, int *exact);
/* Whether the word after `--resume` is its DIR: not an option, not a
 * key=value, and not a *.yaml / *.yml file (the config) unless a directory. */
int mf_cli_resume_takes_dir(const char *next);

/* Prints "moefit CMD: error: <last error>" (and the trace when MF_LOG=debug)
 * to stderr and returns MF_EXIT_FAIL. */
int mf_cli_fail(const char *cmd, mf_status s);
/* Prints "moefit CMD: <msg>" and a hint to run --help; returns MF_EXIT_USAGE. */
int mf_cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* 1 when any argument is -h or --help. */
int mf_cli_wants_help(int argc, char **argv);

/* SIGINT, SIGTERM and SIGUSR1 as stop requests (core.h mf_stop_request) for
 * a long command (train, eval): the first only sets the flag, which the
 * command's loop reads between steps; a second one ends the process at once
 * with status 128 + its number (130, 143, 138) through _exit, touching no
 * file. SIGUSR1 is what Open MPI's mpirun forwards to every rank as it comes
 * (and what batch schedulers send before a time limit). */
void mf_cli_catch_stop(void);
/* The stop signal (mf_cli_catch_stop) when this process's parent sent it
 * (under mpirun: Open MPI's launcher), else 0. */
int mf_cli_stop_by_parent(void);


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
