// `moefit data bytes` and `moefit inspect FILE.tokens`, called as functions.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <string>
#include <vector>

#include "src/cli/commands.h"
#include "src/io/tokens.h"

namespace {

std::string TmpPath(const std::string &name) {
  const char *d = getenv("TEST_TMPDIR");
  return std::string(d ? d : "/tmp") + "/" + name;
}

void WriteText(const std::string &path, const std::string &s) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << s;
}

std::string ReadText(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

struct Result {
  int code;
  std::string out, err;
};

Result RunCmd(int (*fn)(int, char **), std::initializer_list<std::string> args) {
  std::vector<std::string> keep(args);
  std::vector<char *> argv;
  for (auto &a : keep) argv.push_back(&a[0]);
  argv.push_back(nullptr);
  int argc = (int)keep.size();
  char **split = mf_cli_split_options(&argc, argv.data());  // as main hands them over
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  int code = fn(argc, split);
  free(split);
  fflush(stdout);
  Result r{code, testing::internal::GetCapturedStdout(), testing::internal::GetCapturedStderr()};
  return r;
}

// The documents of a byte-level file, as strings.
std::vector<std::string> Docs(const std::string &path) {
  mf_tokens *t = nullptr;
  EXPECT_EQ(mf_tokens_open(path.c_str(), &t), MF_OK) << mf_last_error();
  std::vector<std::string> docs;
  if (!t) return docs;
  EXPECT_EQ(mf_tokens_vocab(t), 256u);
  EXPECT_EQ(mf_tokens_width(t), 2u);
  EXPECT_FALSE(mf_tokens_has_mask(t));
  for (uint64_t d = 0; d < mf_tokens_doc_count(t); d++) {
    uint64_t b, e;
    EXPECT_EQ(mf_tokens_doc_range(t, d, &b, &e), MF_OK);
    std::string s;
    for (uint64_t i = b; i < e; i++) s.push_back((char)mf_tokens_at(t, i));
    docs.push_back(s);
  }
  mf_tokens_close(t);
  return docs;
}

const char kFortunes1[] = "A fortune.\n%\nTwo\nlines.\n%\n%\nThird, after an empty record.\n%\n";
const char kFortunes2[] = "Fourth\r\n%\r\nFifth, no final separator\n";

TEST(DataCli, Help) {
  Result r = RunCmd(mf_cli_data, {"data", "--help"});
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("--split-on LINE"), std::string::npos);
  EXPECT_NE(r.out.find("--valid-fraction"), std::string::npos);
  EXPECT_EQ(RunCmd(mf_cli_data, {"data", "bytes", "-h"}).code, 0);
  EXPECT_EQ(RunCmd(mf_cli_data, {"data"}).code, 2);
}

TEST(DataCli, SplitOnPercentWithValidation) {
  std::string a = TmpPath("f1.txt"), b = TmpPath("f2.txt");
  WriteText(a, kFortunes1);
  WriteText(b, kFortunes2);
  std::string out = TmpPath("made/by/data/train.tokens"), valid = TmpPath("made/valid.tokens");
  Result r = RunCmd(mf_cli_data, {"data", "bytes", a, b, out, "--split-on", "%", "--valid-fraction", "0.4",
                                  "--valid-out", valid});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("5 documents"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("bits/token"), std::string::npos) << r.out;
  // Documents 0..4; F = 0.4 sends i = 2 and 4 (floor((i+1)F) > floor(iF)) to valid.
  std::vector<std::string> all = {"A fortune.\n", "Two\nlines.\n", "Third, after an empty record.\n",
                                  "Fourth\r\n", "Fifth, no final separator\n"};
  EXPECT_EQ(Docs(out), (std::vector<std::string>{all[0], all[1], all[3]}));
  EXPECT_EQ(Docs(valid), (std::vector<std::string>{all[2], all[4]}));

  // Deterministic: the same command gives the same bytes.
  std::string first = ReadText(out);
  ASSERT_EQ(RunCmd(mf_cli_data, {"data", "bytes", a, b, out, "--split-on=%", "--valid-fraction=0.4",
                                 "--valid-out=" + valid})
                .code,
            0);
  EXPECT_EQ(ReadText(out), first);
}

TEST(DataCli, WholeFilesAndBlankLines) {
  std::string a = TmpPath("w1.txt"), b = TmpPath("w2.txt"), e = TmpPath("empty.txt");
  WriteText(a, "para one\nstill one\n\n \t\npara two\n");
  WriteText(b, "x");
  WriteText(e, "");
  std::string out = TmpPath("whole.tokens");
  ASSERT_EQ(RunCmd(mf_cli_data, {"data", "bytes", a, e, b, out}).code, 0);
  EXPECT_EQ(Docs(out), (std::vector<std::string>{ReadText(a), "x"}));  // the empty file adds nothing
  ASSERT_EQ(RunCmd(mf_cli_data, {"data", "bytes", a, b, out, "--split-on-blank"}).code, 0);
  EXPECT_EQ(Docs(out), (std::vector<std::string>{"para one\nstill one\n", "para two\n", "x"}));
}

TEST(DataCli, UsageErrors) {
  std::string a = TmpPath("u.txt"), out = TmpPath("u.tokens");
  WriteText(a, "abc");
  EXPECT_EQ(RunCmd(mf_cli_data, {"data", "bytes", out}).code, 2);
  EXPECT_EQ(RunCmd(mf_cli_data, {"data", "words", a, out}).code, 2);
  EXPECT_EQ(RunCmd(mf_cli_data, {"data", "bytes", a, out, "--bogus"}).code, 2);
  EXPECT_EQ(RunCmd(mf_cli_data, {"data", "bytes", a, out, "--valid-fraction", "0.1"}).code, 2);
  EXPECT_EQ(RunCmd(mf_cli_data, {"data", "bytes", a, out, "--valid-out", TmpPath("v.tokens")}).code, 2);
  EXPECT_EQ(
      RunCmd(mf_cli_data, {"data", "bytes", a, out, "--valid-fraction", "1.5", "--valid-out", TmpPath("v")})
          .code,
      2);
  EXPECT_EQ(
      RunCmd(mf_cli_data, {"data", "bytes", a, out, "--valid-fraction", "x", "--valid-out", TmpPath("v")})
          .code,
      2);
  EXPECT_EQ(
      RunCmd(mf_cli_data, {"data", "bytes", a, out, "--valid-fraction", "0.5", "--valid-out", out}).code, 2);
  EXPECT_EQ(RunCmd(mf_cli_data, {"data", "bytes", a, out, "--split-on", "%", "--split-on-blank"}).code, 2);
  EXPECT_EQ(RunCmd(mf_cli_data, {"data", "bytes", a, out, "--split-on"}).code, 2);
}

TEST(DataCli, RuntimeErrorsLeaveNothingBehind) {
  std::string a = TmpPath("r.txt"), out = TmpPath("r.tokens");
  WriteText(a, "abc");
  Result r = RunCmd(mf_cli_data, {"data", "bytes", a, TmpPath("missing.txt"), out});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("missing.txt: cannot open"), std::string::npos) << r.err;
  struct stat st;
  EXPECT_NE(stat(out.c_str(), &st), 0);

  r = RunCmd(mf_cli_data, {"data", "bytes", TmpPath(""), out});  // a directory
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("is a directory"), std::string::npos) << r.err;

  r = RunCmd(mf_cli_data, {"data", "bytes", a, a});  // OUT would replace the input
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(ReadText(a), "abc");

  WriteText(TmpPath("afile"), "");
  r = RunCmd(mf_cli_data, {"data", "bytes", a, TmpPath("afile/sub/x.tokens")});  // parent is a file
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("afile"), std::string::npos) << r.err;
}

TEST(InspectTokens, GoodAndMalformed) {
  std::string a = TmpPath("i.txt"), out = TmpPath("i.tokens");
  WriteText(a, "aab%\nb\n");
  ASSERT_EQ(RunCmd(mf_cli_data, {"data", "bytes", a, out}).code, 0);
  testing::internal::CaptureStdout();
  int code = mf_cli_inspect_tokens(out.c_str());
  fflush(stdout);
  std::string text = testing::internal::GetCapturedStdout();
  EXPECT_EQ(code, 0);
  for (const char *want : {"format version 1", "vocab         256", "tokens        7", "documents     1",
                           "every token counts", "entropy", "distinct", "first ids     97 97 98 37 10 98 10"})
    EXPECT_NE(text.find(want), std::string::npos) << "missing '" << want << "' in:\n" << text;

  std::string bad = TmpPath("bad.tokens");
  std::string bytes = ReadText(out);
  bytes[130] ^= 1;  // a token byte: the payload checksum fails
  WriteText(bad, bytes);
  testing::internal::CaptureStderr();
  code = mf_cli_inspect_tokens(bad.c_str());
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(code, 1);
  EXPECT_NE(err.find("moefit inspect: error: " + bad + ": byte 104 (payload_crc32)"), std::string::npos)
      << err;

  WriteText(bad, "");
  testing::internal::CaptureStderr();
  EXPECT_EQ(mf_cli_inspect_tokens(bad.c_str()), 1);
  EXPECT_NE(testing::internal::GetCapturedStderr().find("empty"), std::string::npos);
}

}  // namespace
