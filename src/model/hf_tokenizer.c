/* The byte-level tokenizer's Hugging Face files (src/model/hf_tokenizer.h). */
#include "src/model/hf_tokenizer.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A growing text; `failed` once an allocation did not succeed. */
typedef struct text {
  char *p;
  size_t n, cap;
  int failed;
} text;

static void put(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(text *t, const char *fmt, ...) {
  if (t->failed) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    const int k = vsnprintf(t->p ? t->p + t->n : NULL, t->p ? t->cap - t->n : 0, fmt, ap);
    va_end(ap);
    if (k < 0) {
      t->failed = 1;
      return;
    }
    if (t->p && t->n + (size_t)k < t->cap) {
      t->n += (size_t)k;
      return;
    }
    size_t cap = t->cap ? t->cap : 4096;
    while (cap <= t->n + (size_t)k) cap *= 2;
    char *q = (char *)realloc(t->p, cap);
    if (!q) {
      t->failed = 1;
      return;
    }
    t->p = q;
    t->cap = cap;
  }
}

static mf_status finish(text *t, const char *what, char **out) {
  if (t->failed) {
    free(t->p);
    return MF_ERR(MF_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
  }
  *out = t->p;
  return MF_OK;
}

/* GPT-2's bytes_to_unicode: the printable Latin-1 bytes stand for themselves,
 * the other 68 (controls, space, DEL, NBSP, soft hyphen) for U+0100 on, in
 * byte order. */
static unsigned byte_char(unsigned b) {
  const int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  if (printable) return b;
  unsigned n = 0;
  for (unsigned c = 0; c < b; c++)
    if (!((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF))) n++;
  return 256 + n;
}

/* The vocab key of byte b as a JSON string body: UTF-8, '"' and '\\' escaped. */
static void put_byte_key(text *t, unsigned b) {
  const unsigned c = byte_char(b);
  if (c == '"' || c == '\\')
    put(t, "\\%c", (char)c);
  else if (c < 0x80)
    put(t, "%c", (char)c);
  else
    put(t, "%c%c", (char)(0xC0 | (c >> 6)), (char)(0x80 | (c & 0x3F)));
}

static const char *const k_special[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
enum { N_SPECIAL = (int)(sizeof k_special / sizeof k_special[0]) };
#define EOS_TOKEN k_special[MF_HF_BYTE_TOKEN_IM_END - MF_HF_BYTE_TOKEN_ENDOFTEXT]
#define PAD_TOKEN k_special[0]

/* ChatML, as jinja source (its '\n' are jinja string escapes). */
static const char k_chat_template[] =
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/* tokenizers' Tokenizer.to_str(pretty=True) layout: two-space indents, the
 * vocab in id order, no final newline. */
mf_status mf_hf_byte_tokenizer_json(char **out_text) {
  text t = {0};
  put(&t,
      "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n  \"added_tokens\": [\n");
  for (int i = 0; i < N_SPECIAL; i++)
    put(&t,
        "    {\n      \"id\": %d,\n      \"content\": \"%s\",\n      \"single_word\": false,\n"
        "      \"lstrip\": false,\n      \"rstrip\": false,\n      \"normalized\": false,\n"
        "      \"special\": true\n    }%s\n",
        MF_HF_BYTE_TOKEN_ENDOFTEXT + i, k_special[i], i + 1 < N_SPECIAL ? "," : "");
  put(&t,
      "  ],\n  \"normalizer\": null,\n"
      "  \"pre_tokenizer\": {\n    \"type\": \"ByteLevel\",\n    \"add_prefix_space\": false,\n"
      "    \"trim_offsets\": true,\n    \"use_regex\": true\n  },\n"
      "  \"post_processor\": {\n    \"type\": \"ByteLevel\",\n    \"add_prefix_space\": true,\n"
      "    \"trim_offsets\": false,\n    \"use_regex\": true\n  },\n"
      "  \"decoder\": {\n    \"type\": \"ByteLevel\",\n    \"add_prefix_space\": true,\n"
      "    \"trim_offsets\": true,\n    \"use_regex\": true\n  },\n"
      "  \"model\": {\n    \"type\": \"BPE\",\n    \"dropout\": null,\n    \"unk_token\": null,\n"
      "    \"continuing_subword_prefix\": null,\n    \"end_of_word_suffix\": null,\n"
      "    \"fuse_unk\": false,\n    \"byte_fallback\": false,\n    \"ignore_merges\": false,\n"
      "    \"vocab\": {\n");
  for (unsigned b = 0; b < 256; b++) {
    put(&t, "      \"");
    put_byte_key(&t, b);
    put(&t, "\": %u%s\n", b, b < 255 ? "," : "");
  }
  put(&t, "    },\n    \"merges\": []\n  }\n}");
  return finish(&t, "tokenizer.json", out_text);
}

/* What save_pretrained writes (sorted keys, indent 2, a final newline), with
 * the chat template and "bos_token": null. */
mf_status mf_hf_byte_tokenizer_config_json(int64_t max_seq, char **out_text) {
  text t = {0};
  put(&t, "{\n  \"added_tokens_decoder\": {\n");
  for (int i = 0; i < N_SPECIAL; i++)
    put(&t,
        "    \"%d\": {\n      \"content\": \"%s\",\n      \"lstrip\": false,\n      \"normalized\": false,\n"
        "      \"rstrip\": false,\n      \"single_word\": false,\n      \"special\": true\n    }%s\n",
        MF_HF_BYTE_TOKEN_ENDOFTEXT + i, k_special[i], i + 1 < N_SPECIAL ? "," : "");
  put(&t, "  },\n  \"bos_token\": null,\n  \"chat_template\": \"");
  for (const char *c = k_chat_template; *c; c++) {
    if (*c == '\\')
      put(&t, "\\\\");
    else
      put(&t, "%c", *c);
  }
  put(&t,
      "\",\n  \"clean_up_tokenization_spaces\": false,\n  \"eos_token\": \"%s\",\n"
      "  \"extra_special_tokens\": {},\n  \"model_max_length\": %lld,\n  \"pad_token\": \"%s\",\n"
      "  \"tokenizer_class\": \"PreTrainedTokenizerFast\"\n}\n",
      EOS_TOKEN, (long long)max_seq, PAD_TOKEN);
  return finish(&t, "tokenizer_config.json", out_text);
}

static mf_status write_text(const char *dir, const char *name, const char *body) {
  char path[4200];
  if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
    return MF_ERR(MF_ERR_INVALID_ARG, "%s: path too long", dir);
  return mf_write_file_atomic(path, body, strlen(body));
}

mf_status mf_hf_byte_tokenizer_write(const char *dir, int64_t model_vocab, int64_t max_seq) {
  if (model_vocab < MF_HF_BYTE_TOKENIZER_VOCAB)
    return MF_ERR(
        MF_ERR_INVALID_ARG,
        "%s: a byte-level tokenizer needs a vocab of at least %d (256 bytes and %d special tokens); "
        "the model's is %lld",
        dir, MF_HF_BYTE_TOKENIZER_VOCAB, N_SPECIAL, (long long)model_vocab);
  char *tok = NULL, *cfg = NULL;
  mf_status st = mf_hf_byte_tokenizer_json(&tok);
  if (st == MF_OK) st = mf_hf_byte_tokenizer_config_json(max_seq, &cfg);
  if (st == MF_OK) st = write_text(dir, "tokenizer.json", tok);
  if (st == MF_OK) st = write_text(dir, "tokenizer_config.json", cfg);
  if (st == MF_OK) {
    char map[160];
    snprintf(map, sizeof map, "{\n  \"eos_token\": \"%s\",\n  \"pad_token\": \"%s\"\n}\n", EOS_TOKEN,
             PAD_TOKEN);
    st = write_text(dir, "special_tokens_map.json", map);
  }
  free(tok);
  free(cfg);
  return st;
}
