// The byte-level tokenizer `moefit init` writes (src/model/hf_tokenizer.h):
// tokenizer.json byte for byte what `tokenizers` serializes for the same
// tokenizer (data/byte_tokenizer.json, written by data/make_byte_tokenizer.py),
// byte b as token b by GPT-2's byte-to-unicode map (recomputed here), the
// special tokens and ChatML template in tokenizer_config.json, and a model
// vocab too small for its ids refused with nothing written.
#include <gtest/gtest.h>
#include <jansson.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "src/model/hf_tokenizer.h"

namespace {

std::string read_file(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string tmpdir(const std::string &name) {
  const char *t = getenv("TEST_TMPDIR");
  std::string d = std::string(t ? t : "/tmp") + "/" + name;
  mkdir(d.c_str(), 0755);
  return d;
}

// GPT-2's bytes_to_unicode, written out from its definition.
unsigned byte_char(unsigned b) {
  auto printable = [](unsigned c) {
    return (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255);
  };
  if (printable(b)) return b;
  unsigned n = 0;
  for (unsigned c = 0; c < b; c++) n += !printable(c);
  return 256 + n;
}

std::string utf8(unsigned c) {
  std::string s;
  if (c < 0x80) {
    s += (char)c;
  } else {
    s += (char)(0xC0 | (c >> 6));
    s += (char)(0x80 | (c & 0x3F));
  }
  return s;
}

TEST(HfTokenizer, TokenizerJsonIsWhatTokenizersWrites) {
  char *text = nullptr;
  ASSERT_EQ(mf_hf_byte_tokenizer_json(&text), MF_OK);
  const std::string golden = read_file("tests/model/data/byte_tokenizer.json");
  ASSERT_FALSE(golden.empty());
  EXPECT_EQ(std::string(text), golden);
  free(text);
}

TEST(HfTokenizer, ByteBIsTokenBAndTheSpecialTokensFollow) {
  char *text = nullptr;
  ASSERT_EQ(mf_hf_byte_tokenizer_json(&text), MF_OK);
  json_error_t err;
  json_t *j = json_loads(text, JSON_REJECT_DUPLICATES, &err);
  free(text);
  ASSERT_NE(j, nullptr) << err.text;
  json_t *model = json_object_get(j, "model");
  EXPECT_STREQ(json_string_value(json_object_get(model, "type")), "BPE");
  EXPECT_EQ(json_array_size(json_object_get(model, "merges")), 0u);
  json_t *vocab = json_object_get(model, "vocab");
  ASSERT_EQ(json_object_size(vocab), 256u);
  for (unsigned b = 0; b < 256; b++) {
    json_t *id = json_object_get(vocab, utf8(byte_char(b)).c_str());
    ASSERT_NE(id, nullptr) << "byte " << b;
    EXPECT_EQ(json_integer_value(id), (json_int_t)b) << "byte " << b;
  }
  EXPECT_STREQ(json_string_value(json_object_get(json_object_get(j, "pre_tokenizer"), "type")), "ByteLevel");
  EXPECT_STREQ(json_string_value(json_object_get(json_object_get(j, "decoder"), "type")), "ByteLevel");
  json_t *added = json_object_get(j, "added_tokens");
  ASSERT_EQ(json_array_size(added), 3u);
  const char *names[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  const int ids[] = {MF_HF_BYTE_TOKEN_ENDOFTEXT, MF_HF_BYTE_TOKEN_IM_START, MF_HF_BYTE_TOKEN_IM_END};
  for (size_t i = 0; i < 3; i++) {
    json_t *t = json_array_get(added, i);
    EXPECT_STREQ(json_string_value(json_object_get(t, "content")), names[i]);
    EXPECT_EQ(json_integer_value(json_object_get(t, "id")), ids[i]);
    EXPECT_TRUE(json_is_true(json_object_get(t, "special")));
  }
  EXPECT_EQ(MF_HF_BYTE_TOKENIZER_VOCAB, 259);
  json_decref(j);
}

TEST(HfTokenizer, WritesTheThreeFilesWithAChatMLTemplate) {
  const std::string dir = tmpdir("hf_tokenizer_ok");
  ASSERT_EQ(mf_hf_byte_tokenizer_write(dir.c_str(), 272, 4096), MF_OK) << mf_last_error();
  EXPECT_EQ(read_file(dir + "/tokenizer.json"), read_file("tests/model/data/byte_tokenizer.json"));
  json_error_t err;
  json_t *cfg = json_load_file((dir + "/tokenizer_config.json").c_str(), JSON_REJECT_DUPLICATES, &err);
  ASSERT_NE(cfg, nullptr) << err.text;
  EXPECT_STREQ(json_string_value(json_object_get(cfg, "tokenizer_class")), "PreTrainedTokenizerFast");
  EXPECT_STREQ(json_string_value(json_object_get(cfg, "eos_token")), "<|im_end|>");
  EXPECT_STREQ(json_string_value(json_object_get(cfg, "pad_token")), "<|endoftext|>");
  EXPECT_TRUE(json_is_null(json_object_get(cfg, "bos_token")));
  EXPECT_EQ(json_integer_value(json_object_get(cfg, "model_max_length")), 4096);
  EXPECT_STREQ(json_string_value(json_object_get(cfg, "chat_template")),
               "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
               "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}"
               "{{ '<|im_start|>assistant\\n' }}{% endif %}");
  json_t *dec = json_object_get(cfg, "added_tokens_decoder");
  EXPECT_STREQ(json_string_value(json_object_get(json_object_get(dec, "258"), "content")), "<|im_end|>");
  json_decref(cfg);
  json_t *map = json_load_file((dir + "/special_tokens_map.json").c_str(), JSON_REJECT_DUPLICATES, &err);
  ASSERT_NE(map, nullptr) << err.text;
  EXPECT_STREQ(json_string_value(json_object_get(map, "eos_token")), "<|im_end|>");
  EXPECT_STREQ(json_string_value(json_object_get(map, "pad_token")), "<|endoftext|>");
  json_decref(map);
}

TEST(HfTokenizer, AVocabBelowItsIdsIsRefusedWithNothingWritten) {
  const std::string dir = tmpdir("hf_tokenizer_small");
  EXPECT_EQ(mf_hf_byte_tokenizer_write(dir.c_str(), 258, 4096), MF_ERR_INVALID_ARG);
  const std::string msg = mf_last_error();
  EXPECT_NE(msg.find("needs a vocab of at least 259 (256 bytes and 3 special tokens); the model's is 258"),
            std::string::npos)
      << msg;
  EXPECT_NE(access((dir + "/tokenizer.json").c_str(), F_OK), 0);
  EXPECT_NE(access((dir + "/tokenizer_config.json").c_str(), F_OK), 0);
  EXPECT_EQ(mf_hf_byte_tokenizer_write(dir.c_str(), 259, 64), MF_OK) << "259 ids fit a vocab of 259";
}

}  // namespace
