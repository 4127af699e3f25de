/*
 * A byte-level tokenizer as Hugging Face files, for the models `moefit init`
 * makes: with it an init'd dir is a whole HF model dir, which
 * AutoTokenizer.from_pretrained and tools/prepare_data.py read like a real one.
 *
 * The tokenizer (`tokenizers`' JSON format, MF_HF_TRANSFORMERS_VERSION's
 * tokenizers 0.22): a BPE model over the 256 bytes and no merges, behind GPT-2's
 * ByteLevel pre-tokenizer and decoder. Byte b is token id b (its vocab entry is
 * GPT-2's printable stand-in for b), so a text's ids are its UTF-8 bytes, the
 * ids `moefit data bytes` writes; then three special tokens, Qwen's:
 *   256 <|endoftext|>  (pad)   257 <|im_start|>   258 <|im_end|>  (eos)
 * and no BOS. tokenizer_config.json holds a ChatML chat template:
 *   <|im_start|>ROLE\nCONTENT<|im_end|>\n  for each message, and with
 *   add_generation_prompt  <|im_start|>assistant\n
 * The files are those PreTrainedTokenizerFast.save_pretrained writes for that
 * tokenizer (tokenizer.json byte for byte; tests/model/hf_tokenizer_test.cc),
 * with the template in tokenizer_config.json, where every transformers release
 * with chat templates reads it.
 */
#ifndef MF_MODEL_HF_TOKENIZER_H
#define MF_MODEL_HF_TOKENIZER_H

#include <stdint.h>

#include "src/core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Token ids the byte-level tokenizer uses: every id is below MF_HF_BYTE_TOKENIZER_VOCAB. */
#define MF_HF_BYTE_TOKEN_ENDOFTEXT 256
#define MF_HF_BYTE_TOKEN_IM_START 257
#define MF_HF_BYTE_TOKEN_IM_END 258
#define MF_HF_BYTE_TOKENIZER_VOCAB 259

/* tokenizer.json's text (NUL-terminated, malloc'd; the caller frees it). */
mf_status mf_hf_byte_tokenizer_json(char **out_text);

/* tokenizer_config.json's text for a model of `max_seq` positions (model_max_length). */
mf_status mf_hf_byte_tokenizer_config_json(int64_t max_seq, char **out_text);

/* Writes DIR/tokenizer.json, DIR/tokenizer_config.json and
 * DIR/special_tokens_map.json (each atomically; DIR must exist). A model whose
 * vocab (`model_vocab`, config.json's vocab_size) is below
 * MF_HF_BYTE_TOKENIZER_VOCAB cannot take its ids: MF_ERR_INVALID_ARG, nothing written. */
mf_status mf_hf_byte_tokenizer_write(const char *dir, int64_t model_vocab, int64_t max_seq);

#ifdef __cplusplus
}
#endif

#endif /* MF_MODEL_HF_TOKENIZER_H */
