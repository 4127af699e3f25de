/* `moefit data`: makes .tokens files (the byte-level tokenizer of the demo), and
 * `moefit inspect FILE.tokens` (mf_cli_inspect_tokens). Real tokenizers are
 * tools/prepare_data.py's job. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "src/cli/commands.h"
#include "src/io/tokens.h"

static const char k_usage[] =
    "usage: moefit data bytes INPUT... OUT.tokens [options]\n"
    "\n"
    "Makes a .tokens file with the byte-level tokenizer: every byte of the input is one\n"
    "token (vocab 256, stored as u16) and every token counts in the loss (no mask\n"
    "section). For a model's own tokenizer and chat data use tools/prepare_data.py.\n"
    "\n"
    "Each INPUT file ('-' is standard input) is one document, unless it is split:\n"
    "  --split-on LINE         a line that is exactly LINE ends a document; the line itself\n"
    "                          is dropped (fortune files: --split-on %)\n"
    "  --split-on-blank        blank lines end a document (paragraphs)\n"
    "Empty documents are dropped; a document keeps its final newline.\n"
    "\n"
    "  --valid-fraction F      put a fraction F (0 < F < 1) of the documents in a validation\n"
    "                          file: document i (counted over all inputs, in order) goes\n"
    "                          there when floor((i+1)*F) > floor(i*F). The split is\n"
    "                          deterministic and spread evenly over the inputs.\n"
    "  --valid-out FILE        the validation file (needed with --valid-fraction)\n"
    "\n"
    "Missing output directories are created; outputs are written atomically (a temporary\n"
    "file renamed into place), so a failed run leaves any old file as it was. Prints the\n"
    "documents, tokens and unigram entropy (the loss a model that ignores context would\n"
    "reach; a trained model should beat it) of each output.\n"
    "\n"
    "example (the demo's data, from the Debian package `fortunes`):\n"
    "  F=/usr/share/games/fortunes\n"
    "  moefit data bytes $F/computers $F/science $F/wisdom $F/fortunes runs/demo/data/train.tokens \\\n"
    "      --split-on % --valid-fraction 0.05 --valid-out runs/demo/data/valid.tokens\n"
    "\n"
    "Inspect a result with `moefit inspect FILE.tokens`.\n";

typedef struct {
  mf_tokens_writer *train, *valid;
  double valid_fraction;
  mf_tokens_writer *cur; /* the current document's file; NULL between documents */
  unsigned long long n_docs, n_bytes;
} bytes_job;

/* Document i goes to the validation file when floor((i+1)F) > floor(iF): exactly a
 * fraction F, spread evenly (tools/prepare_data.py uses the same rule). */
static int is_valid_doc(unsigned long long i, double f) {
  return f > 0 && floor((double)(i + 1) * f) > floor((double)i * f);
}

static mf_status doc_bytes(bytes_job *j, const char *p, size_t n) {
  if (n == 0) return MF_OK;
  if (!j->cur) { /* a document starts with its first byte, so empty ones never count */
    j->cur = j->valid && is_valid_doc(j->n_docs, j->valid_fraction) ? j->valid : j->train;
    j->n_docs++;
  }
  uint32_t ids[4096];
  for (size_t b = 0; b < n;) {
    size_t k = n - b < 4096 ? n - b : 4096;
    for (size_t i = 0; i < k; i++) ids[i] = (uint8_t)p[b + i];
    MF_CHECK(mf_tokens_writer_append(j->cur, ids, NULL, k));
    b += k;
  }
  j->n_bytes += n;
  return MF_OK;
}

static mf_status doc_end(bytes_job *j) {
  if (j->cur) MF_CHECK(mf_tokens_writer_end_document(j->cur));
  j->cur = NULL;
  return MF_OK;
}

static int is_blank(const char *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\f' && s[i] != '\v') return 0;
  return 1;
}

/* split: NULL = the whole file is one document; "" with blank = blank lines split. */
static mf_status read_input(bytes_job *j, const char *path, const char *split_on, int split_blank) {
  int is_stdin = strcmp(path, "-") == 0;
  FILE *f = is_stdin ? stdin : fopen(path, "rb");
  if (!f) return MF_ERR(MF_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  mf_status st = MF_OK;
  if (!split_on && !split_blank) {
    char buf[1 << 16];
    size_t n;
    while (st == MF_OK && (n = fread(buf, 1, sizeof buf, f)) > 0) st = doc_bytes(j, buf, n);
  } else {
    char *line = NULL;
    size_t cap = 0, sep_len = split_on ? strlen(split_on) : 0;
    ssize_t len;
    while (st == MF_OK && (len = getline(&line, &cap, f)) >= 0) {
      size_t body = (size_t)len;
      if (body && line[body - 1] == '\n') body--;
      if (body && line[body - 1] == '\r') body--;
      int sep =
          split_blank ? is_blank(line, body) : (body == sep_len && memcmp(line, split_on, sep_len) == 0);
      st = sep ? doc_end(j) : doc_bytes(j, line, (size_t)len);
    }
    free(line);
  }
  if (st == MF_OK && ferror(f)) st = MF_ERR(MF_ERR_IO, "%s: read failed: %s", path, strerror(errno));
  if (!is_stdin) fclose(f);
  if (st == MF_OK) st = doc_end(j); /* a file's end always ends a document */
  return st;
}


/* The output must not replace one of the inputs. */
static int same_file(const char *a, const char *b) {
  struct stat sa, sb;
  return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

static mf_status summarize(const char *what, const char *path) {
  mf_tokens *t = NULL;
  mf_tokens_stats s;
  MF_CHECK(mf_tokens_open(path, &t)); /* reading it back also validates it */
  mf_tokens_info in;
  mf_tokens_get_info(t, &in);
  mf_status st = mf_tokens_compute_stats(t, &s);
  if (st == MF_OK) {
    char size[32];
    printf("  %-5s  %s: %llu documents, %llu tokens, %s; unigram entropy %.3f bits/token (%.3f nats)\n", what,
           path, (unsigned long long)in.doc_count, (unsigned long long)in.count,
           mf_format_bytes(in.file_size, size, sizeof size), s.entropy_bits, s.entropy_bits * log(2.0));
    if (in.count == 0) fprintf(stderr, "moefit data: warning: %s has no documents\n", path);
  }
  mf_tokens_close(t);
  return st;
}

static int data_bytes(int argc, char **argv) {
  const char *pos[argc];
  int n_pos = 0, split_blank = 0, only_pos = 0;
  const char *split_on = NULL, *valid_out = NULL, *fraction_s = NULL;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char **value = NULL;
    if (only_pos || a[0] != '-' || strcmp(a, "-") == 0) {
      pos[n_pos++] = a;
      continue;
    }
    if (strcmp(a, "--") == 0)
      only_pos = 1;
    else if (strcmp(a, "--split-on-blank") == 0)
      split_blank = 1;
    else if (strcmp(a, "--split-on") == 0)
      value = &split_on;
    else if (strcmp(a, "--valid-out") == 0)
      value = &valid_out;
    else if (strcmp(a, "--valid-fraction") == 0)
      value = &fraction_s;
    else
      return mf_cli_usage_error("data", "unknown option '%s'", a);
    if (value) {
      if (i + 1 >= argc) return mf_cli_usage_error("data", "%s needs a value", a);
      *value = argv[++i];
    }
  }
  if (n_pos < 2) return mf_cli_usage_error("data", "bytes: expected INPUT... and OUT.tokens");
  if (split_on && split_blank)
    return mf_cli_usage_error("data", "--split-on and --split-on-blank exclude each other");
  if (!fraction_s != !valid_out)
    return mf_cli_usage_error("data", "--valid-fraction and --valid-out go together");
  double fraction = 0;
  if (fraction_s) {
    char *end;
    errno = 0;
    fraction = strtod(fraction_s, &end);
    if (errno || end == fraction_s || *end || !(fraction > 0 && fraction < 1))
      return mf_cli_usage_error("data", "--valid-fraction '%s': expected a number between 0 and 1",
                                fraction_s);
  }
  const char *out = pos[n_pos - 1];
  const int n_in = n_pos - 1;
  if (valid_out && (strcmp(valid_out, out) == 0 || same_file(valid_out, out)))
    return mf_cli_usage_error("data", "OUT and --valid-out name the same file");

  /* Every input is checked before anything is written. */
  for (int i = 0; i < n_in; i++) {
    struct stat st;
    if (strcmp(pos[i], "-") == 0) continue;
    if (stat(pos[i], &st) != 0) {
      MF_ERR(MF_ERR_IO, "%s: cannot open: %s", pos[i], strerror(errno));
      return mf_cli_fail("data", MF_ERR_IO);
    }
    if (S_ISDIR(st.st_mode)) {
      MF_ERR(MF_ERR_IO, "%s: is a directory (pass the files in it)", pos[i]);
      return mf_cli_fail("data", MF_ERR_IO);
    }
    if (same_file(pos[i], out) || (valid_out && same_file(pos[i], valid_out))) {
      MF_ERR(MF_ERR_IO, "%s: is an input and an output: refusing to overwrite it", pos[i]);
      return mf_cli_fail("data", MF_ERR_IO);
    }
  }

  bytes_job j = {.valid_fraction = fraction};
  mf_status st;
  MF_CHECK_GOTO(mf_mkdir_parents(out), st, fail);
  MF_CHECK_GOTO(mf_tokens_writer_create(out, 256, 2, 0, &j.train), st, fail);
  if (valid_out) {
    MF_CHECK_GOTO(mf_mkdir_parents(valid_out), st, fail);
    MF_CHECK_GOTO(mf_tokens_writer_create(valid_out, 256, 2, 0, &j.valid), st, fail);
  }
  for (int i = 0; i < n_in; i++) MF_CHECK_GOTO(read_input(&j, pos[i], split_on, split_blank), st, fail);
  MF_CHECK_GOTO(mf_tokens_writer_finish(j.train), st, fail);
  if (j.valid) MF_CHECK_GOTO(mf_tokens_writer_finish(j.valid), st, fail);
  mf_tokens_writer_free(j.train);
  mf_tokens_writer_free(j.valid);
  j.train = j.valid = NULL;

  printf("moefit data: %d input%s, %llu documents, %llu bytes (byte-level tokens: vocab 256, u16)\n", n_in,
         n_in == 1 ? "" : "s", j.n_docs, j.n_bytes);
  MF_CHECK_GOTO(summarize("train", out), st, fail);
  if (valid_out) MF_CHECK_GOTO(summarize("valid", valid_out), st, fail);
  return MF_EXIT_OK;

fail:
  mf_tokens_writer_free(j.train); /* unfinished: the temporary files go */
  mf_tokens_writer_free(j.valid);
  return mf_cli_fail("data", st);
}

int mf_cli_data(int argc, char **argv) {
  if (mf_cli_wants_help(argc, argv)) {
    printf("%s", k_usage);
    return MF_EXIT_OK;
  }
  if (argc < 2) return mf_cli_usage_error("data", "expected a tokenizer (bytes)");
  if (strcmp(argv[1], "bytes") == 0) return data_bytes(argc - 1, argv + 1);
  return mf_cli_usage_error("data", "unknown tokenizer '%s' (this command has: bytes)", argv[1]);
}

/* ------------------------------------------------------------ inspect */

int mf_cli_inspect_tokens(const char *path) {
  mf_tokens *t = NULL;
  mf_status st = mf_tokens_open(path, &t);
  if (st != MF_OK) return mf_cli_fail("inspect", st);
  mf_tokens_info in;
  mf_tokens_stats s;
  mf_tokens_get_info(t, &in);
  st = mf_tokens_compute_stats(t, &s);
  if (st != MF_OK) {
    mf_tokens_close(t);
    return mf_cli_fail("inspect", st);
  }
  typedef unsigned long long ull;
  char buf[32];
  printf("%s: moefit .tokens, format version %u (checksums verified)\n", path, in.version);
  printf("  file size     %llu bytes (%s)\n", (ull)in.file_size,
         mf_format_bytes(in.file_size, buf, sizeof buf));
  printf("  header        %u bytes, crc32 0x%08x; payload crc32 0x%08x\n", in.header_size, in.header_crc32,
         in.payload_crc32);
  printf("  vocab         %u\n", in.vocab);
  printf("  token width   %u bytes (u%u)\n", in.width, 8 * in.width);
  printf("  tokens        %llu\n", (ull)in.count);
  printf("  documents     %llu", (ull)in.doc_count);
  if (in.doc_count)
    printf(" (tokens per document: min %llu, mean %.1f, max %llu)", (ull)s.doc_min, s.doc_mean,
           (ull)s.doc_max);
  printf("\n");
  if (in.flags & MF_TOKENS_FLAG_MASK)
    printf("  loss mask     %llu of %llu tokens count in the loss (%.2f%%)\n", (ull)s.loss_tokens,
           (ull)in.count, 100.0 * s.loss_fraction);
  else
    printf("  loss mask     none: every token counts\n");
  printf("  sections      tokens [%llu, %llu)", (ull)in.tokens_offset,
         (ull)(in.tokens_offset + in.tokens_size));
  if (in.flags & MF_TOKENS_FLAG_MASK)
    printf("  mask [%llu, %llu)", (ull)in.mask_offset, (ull)(in.mask_offset + in.mask_size));
  printf("  docs [%llu, %llu)\n", (ull)in.docs_offset, (ull)(in.docs_offset + in.docs_size));
  if (in.count) {
    printf("  ids           min %u, max %u, %llu distinct of %u\n", s.min_id, s.max_id, (ull)s.distinct,
           in.vocab);
    printf("  entropy       %.4f bits/token (%.4f nats), unigram; uniform over the vocab: %.4f bits\n",
           s.entropy_bits, s.entropy_bits * log(2.0), log2((double)in.vocab));
    uint64_t n = in.count < 16 ? in.count : 16;
    printf("  first ids    ");
    for (uint64_t i = 0; i < n; i++) printf(" %u", mf_tokens_at(t, i));
    printf("%s\n", in.count > n ? " ..." : "");
  }
  mf_tokens_close(t);
  return MF_EXIT_OK;
}
