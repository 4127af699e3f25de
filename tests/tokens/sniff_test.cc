// A file given where a .tokens file belongs says what it is (issue 27 item
// 4): mf_tokens_sniff's kinds and descriptions, and mf_tokens_open's message
// for a file without the magic; files that begin with the magic keep the
// header faults.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "src/io/tokens.h"

namespace {

std::string TmpPath(const std::string &name) {
  const char *d = getenv("TEST_TMPDIR");
  return std::string(d ? d : "/tmp") + "/" + name;
}

std::string Write(const std::string &name, const std::string &bytes) {
  const std::string p = TmpPath(name);
  std::ofstream(p, std::ios::binary) << bytes;
  return p;
}

struct Sniffed {
  mf_tokens_kind kind;
  std::string desc;
};

Sniffed Sniff(const std::string &bytes) {
  char desc[512];
  const mf_tokens_kind k = mf_tokens_sniff_bytes(reinterpret_cast<const uint8_t *>(bytes.data()),
                                                 bytes.size(), bytes.size(), desc, sizeof desc);
  return {k, desc};
}

TEST(TokensSniff, SaysWhatAFileIs) {
  Sniffed s = Sniff("{\"text\": \"The quick brown fox\"}\n{\"text\": \"jumps\"}\n");
  EXPECT_EQ(s.kind, MF_TOKENS_KIND_JSONL);
  EXPECT_EQ(s.desc, "JSONL text, one JSON object a line (it begins \"{\"text\": \"The quick brown fox\"}\")");
  // One line, one object: JSONL of one record.
  EXPECT_EQ(Sniff("{\"messages\": []}").kind, MF_TOKENS_KIND_JSONL);
  // A first line longer than what is read, starting with "{": JSONL (a pretty-printed object breaks early).
  std::string long_line = "{\"text\": \"" + std::string(10000, 'a') + "\"}\n";
  char desc[512];
  EXPECT_EQ(mf_tokens_sniff_bytes(reinterpret_cast<const uint8_t *>(long_line.data()), 4096, long_line.size(),
                                  desc, sizeof desc),
            MF_TOKENS_KIND_JSONL)
      << desc;
  EXPECT_NE(std::string(desc).find("...\")"), std::string::npos) << desc;  // the first line cut
  EXPECT_EQ(Sniff("{\n  \"a\": 1\n}\n").kind, MF_TOKENS_KIND_JSON);
  EXPECT_EQ(Sniff("[1, 2, 3]").kind, MF_TOKENS_KIND_JSON);
  EXPECT_EQ(Sniff("model:\n  init: {}\n").kind, MF_TOKENS_KIND_YAML);
  EXPECT_EQ(Sniff("# a config\n").kind, MF_TOKENS_KIND_YAML);
  s = Sniff("It was a dark and stormy night; the rain fell in torrents.\nExcept at occasional intervals\n");
  EXPECT_EQ(s.kind, MF_TOKENS_KIND_TEXT);
  EXPECT_EQ(s.desc, "plain text (it begins \"It was a dark and stormy night; the rain...\")");
  EXPECT_EQ(Sniff("\xef\xbb\xbf"
                  "caf\xc3\xa9 au lait\n")
                .kind,
            MF_TOKENS_KIND_TEXT);  // UTF-8 with a BOM
  s = Sniff("");
  EXPECT_EQ(s.kind, MF_TOKENS_KIND_EMPTY);
  EXPECT_EQ(s.desc, "an empty file");
  EXPECT_EQ(Sniff("MFTOKENS\x01\x00").kind, MF_TOKENS_KIND_TOKENS);
  EXPECT_EQ(Sniff("MFTO").kind, MF_TOKENS_KIND_TOKENS);  // a cut .tokens file is still one
  // safetensors: an 8-byte header length that fits, then "{".
  std::string st = std::string("\x0e\0\0\0\0\0\0\0", 8) + "{\"__metadata__\":{}}";
  st.resize(8 + 14 + 8);
  st[8] = '{';
  s = Sniff(st);
  EXPECT_EQ(s.kind, MF_TOKENS_KIND_SAFETENSORS) << s.desc;
  EXPECT_NE(s.desc.find("model weights"), std::string::npos) << s.desc;
  EXPECT_EQ(Sniff(std::string("\x1f\x8b\x08\0\0\0", 6)).desc, "gzip-compressed data");
  EXPECT_EQ(Sniff(std::string("\x28\xb5\x2f\xfd\0", 5)).desc, "zstd-compressed data");
  EXPECT_EQ(Sniff(std::string("PK\x03\x04zzzz", 8)).desc, "a zip archive");
  s = Sniff(std::string("\x01\x02\x03\x04\x05\x06\x07\x08\x09", 9));
  EXPECT_EQ(s.kind, MF_TOKENS_KIND_BINARY);
  EXPECT_EQ(s.desc, "binary data of no format moefit knows (its first bytes: 01 02 03 04 05 06 07 08)");
  // Invalid UTF-8 is not text.
  EXPECT_EQ(Sniff("abc\xff\xfe def ghi jkl").kind, MF_TOKENS_KIND_BINARY);
}

TEST(TokensSniff, Files) {
  mf_tokens_kind k;
  char desc[512];
  ASSERT_EQ(mf_tokens_sniff(Write("a.jsonl", "{\"text\":\"hi\"}\n").c_str(), &k, desc, sizeof desc), MF_OK);
  EXPECT_EQ(k, MF_TOKENS_KIND_JSONL);
  const std::string missing = TmpPath("no-such.tokens");
  EXPECT_EQ(mf_tokens_sniff(missing.c_str(), &k, desc, sizeof desc), MF_ERR_IO);
  EXPECT_EQ(std::string(mf_last_error()), missing + ": No such file or directory");
  const char *dir = getenv("TEST_TMPDIR");
  ASSERT_NE(dir, nullptr);
  EXPECT_EQ(mf_tokens_sniff(dir, &k, desc, sizeof desc), MF_ERR_IO);
  EXPECT_NE(std::string(mf_last_error()).find(std::string(dir) + ": not a regular file but a directory"),
            std::string::npos)
      << mf_last_error();
}

// mf_tokens_open on what is not a .tokens file says what it is; the text kinds
// without the magic bytes (their first line says more), the others with them.
TEST(TokensSniff, OpenSaysWhatItIs) {
  mf_tokens *t = nullptr;
  const std::string jsonl =
      Write("corpus.jsonl", "{\"text\":\"hi\"}\n");  // 14 bytes: once "truncated header"
  EXPECT_EQ(mf_tokens_open(jsonl.c_str(), &t), MF_ERR_FORMAT);
  EXPECT_EQ(
      std::string(mf_last_error()),
      jsonl +
          ": not a .tokens file: it is JSONL text, one JSON object a line (it begins \"{\"text\":\"hi\"}\")");
  const std::string text = Write("notes.txt", std::string(300, 'x'));
  EXPECT_EQ(mf_tokens_open(text.c_str(), &t), MF_ERR_FORMAT);
  EXPECT_NE(std::string(mf_last_error()).find(": not a .tokens file: it is plain text"), std::string::npos)
      << mf_last_error();
  const std::string zip = Write("data.zip", std::string("PK\x03\x04zzzz", 8) + std::string(200, '\0'));
  EXPECT_EQ(mf_tokens_open(zip.c_str(), &t), MF_ERR_FORMAT);
  EXPECT_EQ(std::string(mf_last_error()), zip +
                                              ": byte 0 (magic): \"PK\\x03\\x04zzzz\" is not \"MFTOKENS\": "
                                              "not a .tokens file: it is a zip archive");
  // The magic, then too little: the header fault as before.
  const std::string cut = Write("cut.tokens", "MFTOKENS" + std::string(20, '\0'));
  EXPECT_EQ(mf_tokens_open(cut.c_str(), &t), MF_ERR_FORMAT);
  EXPECT_EQ(std::string(mf_last_error()),
            cut + ": byte 28: truncated header: the file is 28 bytes, the header alone is 128");
  EXPECT_EQ(t, nullptr);
}

}  // namespace
