/* The command line as the user typed it, and the one that resumes a run
 * (commands.h mf_cli_remember_command, mf_cli_resume_command). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "src/cli/commands.h"

/* main's argv before mf_cli_split_options changed it, copied. */
static char **g_words;
static int g_n;

static void forget(void) {
  for (int i = 0; g_words && i < g_n; i++) free(g_words[i]);
  free(g_words);
  g_words = NULL;
  g_n = 0;
}

void mf_cli_remember_command(int argc, char **argv) {
  forget();
  if (argc <= 0 || !(g_words = calloc((size_t)argc, sizeof *g_words))) return; /* no hint then */
  for (int i = 0; i < argc; i++)
    if (!(g_words[i] = mf_strdup(argv[i]))) {
      g_n = i;
      forget();
      return;
    }
  g_n = argc;
}

int mf_cli_resume_takes_dir(const char *next) {
  if (!next || strncmp(next, "--", 2) == 0 || strchr(next, '=')) return 0;
  const size_t len = strlen(next);
  const int yaml =
      (len > 5 && strcmp(next + len - 5, ".yaml") == 0) || (len > 4 && strcmp(next + len - 4, ".yml") == 0);
  struct stat sb;
  return !yaml || (stat(next, &sb) == 0 && S_ISDIR(sb.st_mode));
}

/* Appends s at buf[*n] (cut at cap, counted past it, as snprintf). */
static void put(char *buf, size_t cap, size_t *n, const char *s) {
  for (; *s; s++, (*n)++)
    if (*n + 1 < cap) buf[*n] = *s, buf[*n + 1] = 0;
}

/* A word as a POSIX shell reads it back: bare when it is made of characters
 * no shell treats specially, else in single quotes ('\'' for a quote). */
static void put_word(char *buf, size_t cap, size_t *n, const char *w) {
  static const char safe[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_@%+=:,./-";
  if (*n) put(buf, cap, n, " ");
  if (*w && strspn(w, safe) == strlen(w)) {
    put(buf, cap, n, w);
    return;
  }
  put(buf, cap, n, "'");
  for (const char *p = w; *p; p++) {
    const char c[2] = {*p, 0};
    put(buf, cap, n, *p == '\'' ? "'\\''" : c);
  }
  put(buf, cap, n, "'");
}

static const char *base_name(const char *p) {
  const char *s = strrchr(p, '/');
  return s ? s + 1 : p;
}

static int is_launcher(const char *word) {
  static const char *const names[] = {"mpirun",          "mpiexec",       "orterun",
                                      "prterun",         "mpiexec.hydra", "mpirun.openmpi",
                                      "mpiexec.openmpi", "mpirun.mpich",  "mpiexec.mpich"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (strcmp(base_name(word), names[i]) == 0) return 1;
  return 0;
}

/* The launcher's words before this program's when the parent process is
 * mpirun (or mpiexec) and its command line ends with exactly this
 * process's: how many words of `pw` (the parent's, np of them) come before
 * the program, or -1 when that is not known for sure. */
static int launcher_words(char **pw, int np) {
  if (np < 2 || !is_launcher(pw[0]) || g_n < 1 || np <= g_n) return -1;
  const int k = np - g_n; /* the program's word in the parent's */
  if (strcmp(base_name(pw[k]), base_name(g_words[0])) != 0) return -1;
  for (int i = 1; i < g_n; i++)
    if (strcmp(pw[k + i], g_words[i]) != 0) return -1;
  return k;
}

/* /proc/PPID/cmdline as words (at most cap of them, into a buffer of the
 * caller's); the count, or 0 when it cannot be read. */
static int parent_words(char *text, size_t text_cap, char **words, int cap) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/cmdline", (int)getppid());
  FILE *f = fopen(path, "rb");
  if (!f) return 0;
  const size_t len = fread(text, 1, text_cap - 1, f);
  const int whole = feof(f);
  fclose(f);
  if (!whole || len == 0) return 0; /* cut: not a command line to repeat */
  text[len] = 0;
  int n = 0;
  for (size_t i = 0; i < len && n < cap; i += strlen(text + i) + 1) words[n++] = text + i;
  return n;
}

size_t mf_cli_resume_command(int ranks, char *buf, size_t cap, int *exact) {
  size_t n = 0;
  if (cap) buf[0] = 0;
  *exact = 1;
  if (g_n < 2) return 0;
  /* Under mpirun: its words before ours when the parent is the mpirun that
   * ran this command, else "mpirun -np N" and *exact 0 (its other options
   * are not known) */
  static char ptext[16384];
  char *pw[512];
  const int np = ranks > 1 ? parent_words(ptext, sizeof ptext, pw, 512) : 0;
  const int k = np > 0 ? launcher_words(pw, np) : -1;
  if (k > 0) {
    for (int i = 0; i < k; i++) put_word(buf, cap, &n, pw[i]);
  } else if (ranks > 1) {
    char np_arg[32];
    snprintf(np_arg, sizeof np_arg, "%d", ranks);
    put_word(buf, cap, &n, "mpirun");
    put_word(buf, cap, &n, "-np");
    put_word(buf, cap, &n, np_arg);
    *exact = 0;
  }
  /* `bazel run` starts the binary from its runfiles: the command to type is bazel's */
  const char *wd = getenv("BUILD_WORKING_DIRECTORY");
  if (k > 0) {
    put_word(buf, cap, &n, pw[k]);
  } else if (wd && *wd && ranks <= 1) {
    put_word(buf, cap, &n, "bazel");
    put_word(buf, cap, &n, "run");
    put_word(buf, cap, &n, "//:moefit");
    put_word(buf, cap, &n, "--");
  } else {
    put_word(buf, cap, &n, g_words[0]);
  }
  for (int i = 1; i < g_n; i++) {
    const char *w = g_words[i];
    if (strncmp(w, "--resume=", 9) == 0) continue;
    if (strcmp(w, "--resume") == 0) {
      if (i + 1 < g_n && mf_cli_resume_takes_dir(g_words[i + 1])) i++;
      continue;
    }
    put_word(buf, cap, &n, w);
  }
  put_word(buf, cap, &n, "--resume");
  return n;
}
