// .tokens files: writer/reader round trips, statistics, and malformed files that
// must each be MF_ERR_FORMAT naming the file, the place and the fault.
#include <gtest/gtest.h>

#include <dirent.h>
#include <sys/stat.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "src/io/tokens.h"

namespace {

std::string TmpDir() {
  const char *d = getenv("TEST_TMPDIR");
  return d ? d : "/tmp";
}

std::string TmpPath(const std::string &name) {
  return TmpDir() + "/" + name;
}

std::vector<uint8_t> ReadFile(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

void WriteFile(const std::string &path, const std::vector<uint8_t> &b) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char *>(b.data()), (std::streamsize)b.size());
}

bool Exists(const std::string &path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

uint64_t Get64(const std::vector<uint8_t> &b, size_t off) {
  uint64_t v;
  memcpy(&v, b.data() + off, 8);
  return v;
}
void Put32(std::vector<uint8_t> &b, size_t off, uint32_t v) {
  memcpy(b.data() + off, &v, 4);
}
void Put64(std::vector<uint8_t> &b, size_t off, uint64_t v) {
  memcpy(b.data() + off, &v, 8);
}

void FixPayloadCrc(std::vector<uint8_t> &b) {
  Put32(b, MF_TOKENS_OFF_PAYLOAD_CRC, mf_tokens_crc32(0, b.data() + 128, b.size() - 128));
}
void FixHeaderCrc(std::vector<uint8_t> &b) {
  Put32(b, MF_TOKENS_OFF_HEADER_CRC, mf_tokens_crc32(0, b.data(), MF_TOKENS_OFF_HEADER_CRC));
}
void FixCrcs(std::vector<uint8_t> &b) {
  FixPayloadCrc(b);
  FixHeaderCrc(b);
}

// Writes docs (each a list of ids) with an optional mask (id % 3 != 0 counts).
std::string WriteDocs(const std::string &name, uint32_t vocab, int width, bool with_mask,
                      const std::vector<std::vector<uint32_t>> &docs) {
  std::string path = TmpPath(name);
  mf_tokens_writer *w = nullptr;
  EXPECT_EQ(mf_tokens_writer_create(path.c_str(), vocab, width, with_mask, &w), MF_OK) << mf_last_error();
  for (const auto &d : docs) {
    std::vector<uint8_t> m(d.size());
    for (size_t i = 0; i < d.size(); i++) m[i] = d[i] % 3 != 0;
    EXPECT_EQ(mf_tokens_writer_append(w, d.data(), with_mask ? m.data() : nullptr, d.size()), MF_OK)
        << mf_last_error();
    EXPECT_EQ(mf_tokens_writer_end_document(w), MF_OK);
  }
  EXPECT_EQ(mf_tokens_writer_finish(w), MF_OK) << mf_last_error();
  mf_tokens_writer_free(w);
  return path;
}

// A small valid file: u16, vocab 1000, with a mask, 3 documents of 5, 7 and 9 tokens.
std::vector<uint8_t> ValidImage(std::string *path_out = nullptr) {
  std::vector<std::vector<uint32_t>> docs = {
      {1, 2, 3, 4, 5}, {10, 20, 30, 40, 50, 60, 70}, {999, 0, 7, 7, 7, 7, 7, 7, 8}};
  std::string path = WriteDocs("valid_image.tokens", 1000, 2, true, docs);
  if (path_out) *path_out = path;
  return ReadFile(path);
}

// Opening must fail with MF_ERR_FORMAT and a message naming the file and containing
// every fragment.
void ExpectFormatError(const std::string &name, const std::vector<uint8_t> &image,
                       const std::vector<std::string> &fragments) {
  std::string path = TmpPath(name);
  WriteFile(path, image);
  mf_tokens *t = reinterpret_cast<mf_tokens *>(0x1);
  mf_error_clear();
  EXPECT_EQ(mf_tokens_open(path.c_str(), &t), MF_ERR_FORMAT) << name;
  EXPECT_EQ(t, nullptr);
  std::string msg = mf_last_error();
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  for (const auto &f : fragments)
    EXPECT_NE(msg.find(f), std::string::npos) << "missing '" << f << "' in: " << msg;
}

TEST(TokensCrc, MatchesZlib) {
  EXPECT_EQ(mf_tokens_crc32(0, "123456789", 9), 0xCBF43926u);
  EXPECT_EQ(mf_tokens_crc32(0, "", 0), 0u);
  std::string s = "the quick brown fox jumps over the lazy dog, twice over";
  uint32_t whole = mf_tokens_crc32(0, s.data(), s.size());
  for (size_t cut = 0; cut <= s.size(); cut++)
    EXPECT_EQ(mf_tokens_crc32(mf_tokens_crc32(0, s.data(), cut), s.data() + cut, s.size() - cut), whole);
}

TEST(TokensRoundTrip, U16WithMaskManyDocs) {
  std::vector<std::vector<uint32_t>> docs = {{1, 2, 3}, {4}, {5, 6, 7, 8, 9, 10, 11, 12, 13}, {999, 0}};
  std::string path = WriteDocs("u16_mask.tokens", 1000, 2, true, docs);
  mf_tokens *t = nullptr;
  ASSERT_EQ(mf_tokens_open(path.c_str(), &t), MF_OK) << mf_last_error();
  EXPECT_STREQ(mf_tokens_path(t), path.c_str());
  EXPECT_EQ(mf_tokens_count(t), 15u);
  EXPECT_EQ(mf_tokens_vocab(t), 1000u);
  EXPECT_EQ(mf_tokens_width(t), 2u);
  EXPECT_TRUE(mf_tokens_has_mask(t));
  ASSERT_EQ(mf_tokens_doc_count(t), 4u);
  const uint64_t *starts = mf_tokens_doc_starts(t);
  EXPECT_EQ(starts[0], 0u);
  EXPECT_EQ(starts[1], 3u);
  EXPECT_EQ(starts[2], 4u);
  EXPECT_EQ(starts[3], 13u);
  uint64_t i = 0;
  for (size_t d = 0; d < docs.size(); d++) {
    uint64_t b, e;
    ASSERT_EQ(mf_tokens_doc_range(t, d, &b, &e), MF_OK);
    EXPECT_EQ(e - b, docs[d].size());
    for (uint32_t id : docs[d]) {
      EXPECT_EQ(mf_tokens_at(t, i), id);
      EXPECT_EQ(mf_tokens_mask_at(t, i), id % 3 != 0 ? 1 : 0);
      i++;
    }
  }
  uint64_t b, e;
  EXPECT_EQ(mf_tokens_doc_range(t, 4, &b, &e), MF_ERR_INVALID_ARG);
  std::vector<uint32_t> ids(9);
  std::vector<uint8_t> mask(9);
  ASSERT_EQ(mf_tokens_read(t, 4, 9, ids.data(), mask.data()), MF_OK);
  for (size_t k = 0; k < 9; k++) {
    EXPECT_EQ(ids[k], docs[2][k]);
    EXPECT_EQ(mask[k], docs[2][k] % 3 != 0);
  }
  EXPECT_EQ(mf_tokens_read(t, 10, 6, ids.data(), nullptr), MF_ERR_INVALID_ARG);
  EXPECT_EQ(mf_tokens_read(t, 15, 0, ids.data(), nullptr), MF_OK);

  mf_tokens_info in;
  mf_tokens_get_info(t, &in);
  EXPECT_EQ(in.version, 1u);
  EXPECT_EQ(in.header_size, 128u);
  EXPECT_EQ(in.flags, (uint64_t)MF_TOKENS_FLAG_MASK);
  EXPECT_EQ(in.tokens_offset, 128u);
  EXPECT_EQ(in.tokens_size, 30u);
  EXPECT_EQ(in.mask_offset, 160u);  // 128 + 30, padded to 8
  EXPECT_EQ(in.mask_size, 2u);
  EXPECT_EQ(in.docs_offset, 168u);
  EXPECT_EQ(in.docs_size, 32u);
  EXPECT_EQ(in.file_size, 200u);
  EXPECT_EQ(in.min_id, 0u);
  EXPECT_EQ(in.max_id, 999u);
  for (uint64_t off : {in.tokens_offset, in.mask_offset, in.docs_offset}) EXPECT_EQ(off % 8, 0u);
  mf_tokens_close(t);
}

TEST(TokensRoundTrip, U32WithoutMask) {
  std::vector<std::vector<uint32_t>> docs = {{70000, 1, 99999}, {65536, 65535}};
  std::string path = WriteDocs("u32_nomask.tokens", 100000, 0, false, docs);  // width 0: picks 4
  mf_tokens *t = nullptr;
  ASSERT_EQ(mf_tokens_open(path.c_str(), &t), MF_OK) << mf_last_error();
  EXPECT_EQ(mf_tokens_width(t), 4u);
  EXPECT_FALSE(mf_tokens_has_mask(t));
  EXPECT_EQ(mf_tokens_count(t), 5u);
  EXPECT_EQ(mf_tokens_doc_count(t), 2u);
  std::vector<uint32_t> ids(5);
  std::vector<uint8_t> mask(5, 0);
  ASSERT_EQ(mf_tokens_read(t, 0, 5, ids.data(), mask.data()), MF_OK);
  EXPECT_EQ(ids, (std::vector<uint32_t>{70000, 1, 99999, 65536, 65535}));
  for (int k = 0; k < 5; k++) {
    EXPECT_EQ(mask[k], 1);
    EXPECT_EQ(mf_tokens_mask_at(t, k), 1);
  }
  mf_tokens_info in;
  mf_tokens_get_info(t, &in);
  EXPECT_EQ(in.mask_offset, 0u);
  EXPECT_EQ(in.mask_size, 0u);
  mf_tokens_close(t);
}

TEST(TokensRoundTrip, U32WithMaskAndU16WithoutMask) {
  std::vector<std::vector<uint32_t>> docs = {{1, 2, 3, 4, 5, 6, 7, 8, 9}, {3}};
  for (int width : {2, 4})
    for (bool with_mask : {false, true}) {
      std::string name = "combo_" + std::to_string(width) + "_" + std::to_string(with_mask) + ".tokens";
      std::string path = WriteDocs(name, 10, width, with_mask, docs);
      mf_tokens *t = nullptr;
      ASSERT_EQ(mf_tokens_open(path.c_str(), &t), MF_OK) << mf_last_error();
      EXPECT_EQ(mf_tokens_width(t), (uint32_t)width);
      EXPECT_EQ(mf_tokens_has_mask(t), with_mask ? 1 : 0);
      EXPECT_EQ(mf_tokens_count(t), 10u);
      for (uint64_t i = 0; i < 10; i++) {
        uint32_t id = i < 9 ? (uint32_t)i + 1 : 3;
        EXPECT_EQ(mf_tokens_at(t, i), id);
        EXPECT_EQ(mf_tokens_mask_at(t, i), with_mask ? (id % 3 != 0) : 1);
      }
      mf_tokens_close(t);
    }
}

// Millions of tokens cross the writer's 1 MiB buffer and 64 KiB mask spool buffer;
// a count that is not a multiple of 8 leaves a partial mask byte.
TEST(TokensRoundTrip, LargeStreamedInPieces) {
  const uint64_t n = 3000003;
  std::mt19937 rng(7);
  std::vector<uint32_t> ids(n);
  std::vector<uint8_t> mask(n);
  for (uint64_t i = 0; i < n; i++) {
    ids[i] = rng() % 50000;
    mask[i] = (rng() & 3) != 0;
  }
  std::string path = TmpPath("large.tokens");
  mf_tokens_writer *w = nullptr;
  ASSERT_EQ(mf_tokens_writer_create(path.c_str(), 50000, 2, 1, &w), MF_OK);
  for (uint64_t b = 0; b < n;) {
    uint64_t k = std::min<uint64_t>(n - b, 1 + rng() % 100000);
    if (rng() % 2 == 0) {
      ASSERT_EQ(mf_tokens_writer_end_document(w), MF_OK);
    }
    ASSERT_EQ(mf_tokens_writer_append(w, ids.data() + b, mask.data() + b, k), MF_OK);
    b += k;
  }
  uint64_t docs_before = mf_tokens_writer_doc_count(w);
  ASSERT_EQ(mf_tokens_writer_finish(w), MF_OK) << mf_last_error();
  mf_tokens_writer_free(w);

  mf_tokens *t = nullptr;
  ASSERT_EQ(mf_tokens_open(path.c_str(), &t), MF_OK) << mf_last_error();
  ASSERT_EQ(mf_tokens_count(t), n);
  EXPECT_EQ(mf_tokens_doc_count(t), docs_before + 1);
  std::vector<uint32_t> back(n);
  std::vector<uint8_t> mback(n);
  ASSERT_EQ(mf_tokens_read(t, 0, n, back.data(), mback.data()), MF_OK);
  EXPECT_TRUE(back == ids);
  EXPECT_TRUE(mback == mask);
  mf_tokens_stats st;
  ASSERT_EQ(mf_tokens_compute_stats(t, &st), MF_OK);
  uint64_t ones = 0;
  for (uint8_t m : mask) ones += m;
  EXPECT_EQ(st.loss_tokens, ones);
  EXPECT_NEAR(st.entropy_bits, std::log2(50000.0), 0.02);
  mf_tokens_close(t);
}

// Documents are never empty: ending an empty one is a no-op, and tokens after the
// last end_document form the last document.
TEST(TokensRoundTrip, EmptyDocumentsAreDropped) {
  std::string path = TmpPath("empty_docs.tokens");
  mf_tokens_writer *w = nullptr;
  ASSERT_EQ(mf_tokens_writer_create(path.c_str(), 256, 2, 0, &w), MF_OK);
  uint32_t a[] = {1, 2}, b[] = {3};
  EXPECT_EQ(mf_tokens_writer_end_document(w), MF_OK);  // empty: nothing
  ASSERT_EQ(mf_tokens_writer_append(w, a, nullptr, 2), MF_OK);
  EXPECT_EQ(mf_tokens_writer_end_document(w), MF_OK);
  EXPECT_EQ(mf_tokens_writer_end_document(w), MF_OK);  // empty: nothing
  EXPECT_EQ(mf_tokens_writer_doc_count(w), 1u);
  ASSERT_EQ(mf_tokens_writer_append(w, b, nullptr, 1), MF_OK);
  ASSERT_EQ(mf_tokens_writer_append(w, b, nullptr, 0), MF_OK);
  ASSERT_EQ(mf_tokens_writer_finish(w), MF_OK);  // closes the last document
  EXPECT_EQ(mf_tokens_writer_append(w, b, nullptr, 1), MF_ERR_INVALID_ARG);
  EXPECT_EQ(mf_tokens_writer_finish(w), MF_ERR_INVALID_ARG);
  mf_tokens_writer_free(w);
  mf_tokens *t = nullptr;
  ASSERT_EQ(mf_tokens_open(path.c_str(), &t), MF_OK) << mf_last_error();
  EXPECT_EQ(mf_tokens_count(t), 3u);
  ASSERT_EQ(mf_tokens_doc_count(t), 2u);
  EXPECT_EQ(mf_tokens_doc_starts(t)[1], 2u);
  mf_tokens_close(t);
}

TEST(TokensRoundTrip, NoTokensAtAll) {
  for (bool with_mask : {false, true}) {
    std::string path = TmpPath(with_mask ? "zero_mask.tokens" : "zero.tokens");
    mf_tokens_writer *w = nullptr;
    ASSERT_EQ(mf_tokens_writer_create(path.c_str(), 5, 4, with_mask, &w), MF_OK);
    EXPECT_EQ(mf_tokens_writer_end_document(w), MF_OK);
    ASSERT_EQ(mf_tokens_writer_finish(w), MF_OK);
    mf_tokens_writer_free(w);
    mf_tokens *t = nullptr;
    ASSERT_EQ(mf_tokens_open(path.c_str(), &t), MF_OK) << mf_last_error();
    EXPECT_EQ(mf_tokens_count(t), 0u);
    EXPECT_EQ(mf_tokens_doc_count(t), 0u);
    mf_tokens_stats st;
    ASSERT_EQ(mf_tokens_compute_stats(t, &st), MF_OK);
    EXPECT_EQ(st.distinct, 0u);
    EXPECT_EQ(st.entropy_bits, 0.0);
    mf_tokens_close(t);
  }
}

TEST(TokensWriter, RejectsBadArguments) {
  std::string path = TmpPath("bad_args.tokens");
  mf_tokens_writer *w = reinterpret_cast<mf_tokens_writer *>(0x1);
  EXPECT_EQ(mf_tokens_writer_create(path.c_str(), 0, 2, 0, &w), MF_ERR_INVALID_ARG);
  EXPECT_EQ(w, nullptr);
  EXPECT_EQ(mf_tokens_writer_create(path.c_str(), 10, 3, 0, &w), MF_ERR_INVALID_ARG);
  EXPECT_EQ(mf_tokens_writer_create(path.c_str(), 65537, 2, 0, &w), MF_ERR_INVALID_ARG);
  EXPECT_NE(std::string(mf_last_error()).find("65537"), std::string::npos);
  ASSERT_EQ(mf_tokens_writer_create(path.c_str(), 65536, 2, 0, &w), MF_OK);
  uint32_t ids[] = {1, 65535, 2};
  uint8_t mask[] = {1, 1, 1};
  EXPECT_EQ(mf_tokens_writer_append(w, ids, mask, 3), MF_ERR_INVALID_ARG);  // no mask in this file
  mf_tokens_writer_free(w);
  EXPECT_FALSE(Exists(path));
}

TEST(TokensWriter, RejectsIdsAtOrPastVocabAndKeepsGoing) {
  std::string path = TmpPath("bad_id.tokens");
  mf_tokens_writer *w = nullptr;
  ASSERT_EQ(mf_tokens_writer_create(path.c_str(), 256, 2, 1, &w), MF_OK);
  uint32_t good[] = {1, 2, 3}, bad[] = {4, 5, 256, 6};
  ASSERT_EQ(mf_tokens_writer_append(w, good, nullptr, 3), MF_OK);
  EXPECT_EQ(mf_tokens_writer_append(w, bad, nullptr, 4), MF_ERR_INVALID_ARG);
  std::string msg = mf_last_error();
  EXPECT_NE(msg.find("token 5"), std::string::npos) << msg;  // index in the file: 3 + 2
  EXPECT_NE(msg.find("id 256 >= vocab 256"), std::string::npos) << msg;
  EXPECT_EQ(mf_tokens_writer_count(w), 3u);  // nothing of the rejected call was written
  ASSERT_EQ(mf_tokens_writer_append(w, good, nullptr, 3), MF_OK);
  ASSERT_EQ(mf_tokens_writer_finish(w), MF_OK);
  mf_tokens_writer_free(w);
  mf_tokens *t = nullptr;
  ASSERT_EQ(mf_tokens_open(path.c_str(), &t), MF_OK) << mf_last_error();
  EXPECT_EQ(mf_tokens_count(t), 6u);
  mf_tokens_close(t);
}

TEST(TokensWriter, MissingDirectoryIsAnIoError) {
  std::string path = TmpPath("no/such/dir/x.tokens");
  mf_tokens_writer *w = nullptr;
  EXPECT_EQ(mf_tokens_writer_create(path.c_str(), 256, 2, 0, &w), MF_ERR_IO);
  EXPECT_EQ(w, nullptr);
  std::string msg = mf_last_error();
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("No such file or directory"), std::string::npos) << msg;
}

// The file appears whole at finish or not at all; an abort leaves nothing behind.
TEST(TokensWriter, AtomicReplaceAndAbort) {
  std::string dir = TmpPath("atomic");
  mkdir(dir.c_str(), 0777);
  std::string path = dir + "/a.tokens";
  std::vector<uint8_t> old_bytes = {'o', 'l', 'd'};
  WriteFile(path, old_bytes);
  uint32_t ids[] = {1, 2, 3};

  mf_tokens_writer *w = nullptr;
  ASSERT_EQ(mf_tokens_writer_create(path.c_str(), 10, 2, 1, &w), MF_OK);
  ASSERT_EQ(mf_tokens_writer_append(w, ids, nullptr, 3), MF_OK);
  EXPECT_EQ(ReadFile(path), old_bytes);
  mf_tokens_writer_free(w);  // abort
  EXPECT_EQ(ReadFile(path), old_bytes);

  ASSERT_EQ(mf_tokens_writer_create(path.c_str(), 10, 2, 1, &w), MF_OK);
  ASSERT_EQ(mf_tokens_writer_append(w, ids, nullptr, 3), MF_OK);
  EXPECT_EQ(ReadFile(path), old_bytes);
  ASSERT_EQ(mf_tokens_writer_finish(w), MF_OK);
  mf_tokens_writer_free(w);
  mf_tokens *t = nullptr;
  ASSERT_EQ(mf_tokens_open(path.c_str(), &t), MF_OK) << mf_last_error();
  mf_tokens_close(t);
  mf_tokens_close(nullptr);
  mf_tokens_writer_free(nullptr);

  // Only a.tokens is left: no temporary or spool file.
  DIR *d = opendir(dir.c_str());
  ASSERT_NE(d, nullptr);
  std::vector<std::string> names;
  while (struct dirent *e = readdir(d))
    if (e->d_name[0] != '.') names.push_back(e->d_name);
  closedir(d);
  EXPECT_EQ(names, std::vector<std::string>{"a.tokens"});
}

// ids 0,0,0,0,1,1,2,3: p = 1/2, 1/4, 1/8, 1/8 -> H = 1.75 bits.
TEST(TokensStats, KnownDistribution) {
  std::vector<std::vector<uint32_t>> docs = {{0, 0, 0}, {0, 1}, {1, 2, 3}};
  std::string path = WriteDocs("stats.tokens", 100, 2, true, docs);
  mf_tokens *t = nullptr;
  ASSERT_EQ(mf_tokens_open(path.c_str(), &t), MF_OK) << mf_last_error();
  mf_tokens_stats st;
  ASSERT_EQ(mf_tokens_compute_stats(t, &st), MF_OK);
  EXPECT_EQ(st.min_id, 0u);
  EXPECT_EQ(st.max_id, 3u);
  EXPECT_EQ(st.distinct, 4u);
  EXPECT_NEAR(st.entropy_bits, 1.75, 1e-12);
  EXPECT_EQ(st.loss_tokens, 3u);  // ids 1, 1, 2 (id % 3 != 0)
  EXPECT_NEAR(st.loss_fraction, 3.0 / 8.0, 1e-12);
  EXPECT_EQ(st.doc_min, 2u);
  EXPECT_EQ(st.doc_max, 3u);
  EXPECT_NEAR(st.doc_mean, 8.0 / 3.0, 1e-12);
  mf_tokens_close(t);
}

TEST(TokensStats, UniformAndSingleId) {
  std::vector<uint32_t> all(256 * 4);
  for (size_t i = 0; i < all.size(); i++) all[i] = (uint32_t)(i % 256);
  std::string path = WriteDocs("uniform.tokens", 256, 2, false, {all});
  mf_tokens *t = nullptr;
  ASSERT_EQ(mf_tokens_open(path.c_str(), &t), MF_OK);
  mf_tokens_stats st;
  ASSERT_EQ(mf_tokens_compute_stats(t, &st), MF_OK);
  EXPECT_NEAR(st.entropy_bits, 8.0, 1e-12);
  EXPECT_EQ(st.distinct, 256u);
  EXPECT_EQ(st.loss_fraction, 1.0);
  mf_tokens_close(t);

  path = WriteDocs("single.tokens", 256, 4, false, {{42, 42, 42}});
  ASSERT_EQ(mf_tokens_open(path.c_str(), &t), MF_OK);
  ASSERT_EQ(mf_tokens_compute_stats(t, &st), MF_OK);
  EXPECT_EQ(st.entropy_bits, 0.0);
  EXPECT_EQ(st.distinct, 1u);
  mf_tokens_close(t);
}

// ------------------------------------------------------------- malformed files

TEST(TokensMalformed, ValidImageOpens) {
  std::string path;
  std::vector<uint8_t> b = ValidImage(&path);
  ASSERT_EQ(b.size(), 128u + 48 + 8 + 24);  // tokens 21 x 2 padded, mask 3 padded, 3 docs
  mf_tokens *t = nullptr;
  ASSERT_EQ(mf_tokens_open(path.c_str(), &t), MF_OK) << mf_last_error();
  mf_tokens_close(t);
}

TEST(TokensMalformed, MissingFileIsIo) {
  std::string path = TmpPath("does_not_exist.tokens");
  mf_tokens *t = nullptr;
  EXPECT_EQ(mf_tokens_open(path.c_str(), &t), MF_ERR_IO);
  EXPECT_NE(std::string(mf_last_error()).find(path), std::string::npos);
  EXPECT_EQ(mf_tokens_open(TmpDir().c_str(), &t), MF_ERR_IO);  // a directory
}

TEST(TokensMalformed, EmptyAndTruncatedHeader) {
  ExpectFormatError("empty.tokens", {}, {"byte 0", "empty"});
  std::vector<uint8_t> b = ValidImage();
  b.resize(77);
  ExpectFormatError("short_header.tokens", b, {"truncated header", "77 bytes"});
}

TEST(TokensMalformed, BadMagic) {
  std::vector<uint8_t> b = ValidImage();
  memcpy(b.data(), "PK\x03\x04zzzz", 8);
  ExpectFormatError("magic.tokens", b, {"byte 0 (magic)", "\"PK\\x03\\x04zzzz\"", "not a .tokens file"});
}

TEST(TokensMalformed, FutureOrZeroVersion) {
  std::vector<uint8_t> b = ValidImage();
  Put32(b, MF_TOKENS_OFF_VERSION, 2);
  FixHeaderCrc(b);
  ExpectFormatError("version2.tokens", b, {"byte 8 (version)", "version 2", "newer"});
  Put32(b, MF_TOKENS_OFF_VERSION, 0);
  FixHeaderCrc(b);
  ExpectFormatError("version0.tokens", b, {"byte 8 (version)", "invalid"});
}

TEST(TokensMalformed, BadHeaderChecksum) {
  std::vector<uint8_t> b = ValidImage();
  b[MF_TOKENS_OFF_VOCAB] ^= 0x10;  // a flipped bit, checksum not updated
  ExpectFormatError("header_crc.tokens", b, {"byte 124 (header_crc32)", "header is corrupt"});
}

TEST(TokensMalformed, BadPayloadChecksum) {
  std::vector<uint8_t> b = ValidImage();
  b[128 + 3] ^= 0x01;  // a token byte
  ExpectFormatError("payload_crc.tokens", b, {"byte 104 (payload_crc32)", "corrupt"});
  b = ValidImage();
  b[b.size() - 1] ^= 0x80;  // the last document start
  ExpectFormatError("payload_crc2.tokens", b, {"payload checksum"});
}

TEST(TokensMalformed, TruncatedPayloadAndTrailingBytes) {
  std::vector<uint8_t> b = ValidImage();
  b.resize(b.size() - 8);
  ExpectFormatError("trunc_payload.tokens", b, {"byte 96 (file_size)", "208 bytes but it is 200: truncated"});
  b = ValidImage();
  b.resize(b.size() + 8, 0);
  ExpectFormatError("trailing.tokens", b, {"byte 96 (file_size)", "bytes after its end"});
}

TEST(TokensMalformed, Width3) {
  std::vector<uint8_t> b = ValidImage();
  Put32(b, MF_TOKENS_OFF_WIDTH, 3);
  FixHeaderCrc(b);
  ExpectFormatError("width3.tokens", b, {"byte 20 (width)", "token width 3"});
}

TEST(TokensMalformed, VocabZeroAndTooLargeForWidth) {
  std::vector<uint8_t> b = ValidImage();
  Put32(b, MF_TOKENS_OFF_VOCAB, 0);
  FixHeaderCrc(b);
  ExpectFormatError("vocab0.tokens", b, {"byte 16 (vocab)", "vocab size 0"});
  Put32(b, MF_TOKENS_OFF_VOCAB, 70000);
  FixHeaderCrc(b);
  ExpectFormatError("vocab_u16.tokens", b, {"byte 16 (vocab)", "70000", "2-byte"});
}

TEST(TokensMalformed, UnknownFlagBits) {
  std::vector<uint8_t> b = ValidImage();
  Put64(b, MF_TOKENS_OFF_FLAGS, 1 | 4 | (1ull << 40));
  FixHeaderCrc(b);
  ExpectFormatError("flags.tokens", b, {"byte 40 (flags)", "unknown flag bits 0x10000000004"});
}

TEST(TokensMalformed, ReservedBytesAndHeaderSize) {
  std::vector<uint8_t> b = ValidImage();
  b[MF_TOKENS_OFF_RESERVED + 5] = 1;
  FixHeaderCrc(b);
  ExpectFormatError("reserved.tokens", b, {"byte 113 (reserved)"});
  b = ValidImage();
  Put32(b, MF_TOKENS_OFF_HEADER_SIZE, 64);
  FixHeaderCrc(b);
  ExpectFormatError("header_size.tokens", b, {"byte 12 (header_size)", "header size 64"});
}

TEST(TokensMalformed, TokenCountTimesWidthPastTheEnd) {
  std::vector<uint8_t> b = ValidImage();
  Put64(b, MF_TOKENS_OFF_COUNT, 1000);
  Put64(b, MF_TOKENS_OFF_TOKENS_SIZE, 2000);
  Put64(b, MF_TOKENS_OFF_MASK_SIZE, 125);
  FixHeaderCrc(b);
  ExpectFormatError("count_past_end.tokens", b,
                    {"byte 48 (tokens_offset)", "runs past the end", "(208 bytes)"});
  // The count alone changed: the sizes disagree.
  b = ValidImage();
  Put64(b, MF_TOKENS_OFF_COUNT, 1000);
  FixHeaderCrc(b);
  ExpectFormatError("count_vs_size.tokens", b, {"byte 56 (tokens_size)", "1000 x 2 = 2000"});
}

TEST(TokensMalformed, CountTimesWidthOverflows) {
  std::vector<uint8_t> b = ValidImage();
  Put64(b, MF_TOKENS_OFF_COUNT, 1ull << 63);
  FixHeaderCrc(b);
  ExpectFormatError("count_overflow.tokens", b,
                    {"byte 24 (count)", "9223372036854775808 tokens x 2 bytes overflows"});
  b = ValidImage();
  Put64(b, MF_TOKENS_OFF_DOC_COUNT, 1ull << 62);
  FixHeaderCrc(b);
  ExpectFormatError("docs_overflow.tokens", b, {"byte 32 (doc_count)", "overflows"});
}

TEST(TokensMalformed, OffsetsOverflow) {
  std::vector<uint8_t> b = ValidImage();
  Put64(b, MF_TOKENS_OFF_TOKENS_OFFSET, 1ull << 63);
  FixHeaderCrc(b);
  ExpectFormatError("offset_2p63.tokens", b,
                    {"byte 48 (tokens_offset)", "9223372036854775808", "runs past the end of the file"});
  b = ValidImage();
  Put64(b, MF_TOKENS_OFF_DOCS_OFFSET, ~0ull - 7);  // 2^64 - 8: offset + size wraps
  FixHeaderCrc(b);
  ExpectFormatError("offset_wrap.tokens", b, {"byte 80 (docs_offset)", "overflows"});
  b = ValidImage();
  Put64(b, MF_TOKENS_OFF_MASK_OFFSET, (1ull << 63) + 8);
  FixHeaderCrc(b);
  ExpectFormatError("mask_2p63.tokens", b, {"byte 64 (mask_offset)", "runs past the end"});
}

TEST(TokensMalformed, SectionOverlapsHeaderOrAnother) {
  std::vector<uint8_t> b = ValidImage();
  Put64(b, MF_TOKENS_OFF_TOKENS_OFFSET, 64);
  FixHeaderCrc(b);
  ExpectFormatError("over_header.tokens", b, {"byte 48 (tokens_offset)", "overlaps the 128-byte header"});
  b = ValidImage();
  Put64(b, MF_TOKENS_OFF_DOCS_OFFSET, 144);  // inside the tokens [128, 170)
  FixHeaderCrc(b);
  ExpectFormatError("overlap.tokens", b, {"sections tokens [128, 170) and docs [144, 168) overlap"});
  b = ValidImage();
  Put64(b, MF_TOKENS_OFF_MASK_OFFSET, 132);
  FixHeaderCrc(b);
  ExpectFormatError("misaligned.tokens", b, {"byte 64 (mask_offset)", "not 8-byte aligned"});
}

TEST(TokensMalformed, SectionSizesDisagreeWithCounts) {
  std::vector<uint8_t> b = ValidImage();
  Put64(b, MF_TOKENS_OFF_MASK_SIZE, 8);
  FixHeaderCrc(b);
  ExpectFormatError("mask_size.tokens", b, {"byte 72 (mask_size)", "21 tokens need 3"});
  b = ValidImage();
  Put64(b, MF_TOKENS_OFF_FLAGS, 0);  // the mask section is still named
  FixHeaderCrc(b);
  ExpectFormatError("mask_no_flag.tokens", b, {"byte 64 (mask_offset)", "no loss mask"});
  b = ValidImage();
  Put64(b, MF_TOKENS_OFF_DOCS_SIZE, 16);
  FixHeaderCrc(b);
  ExpectFormatError("docs_size.tokens", b, {"byte 88 (docs_size)"});
  b = ValidImage();
  Put64(b, MF_TOKENS_OFF_DOC_COUNT, 0);
  Put64(b, MF_TOKENS_OFF_DOCS_SIZE, 0);
  FixHeaderCrc(b);
  ExpectFormatError("no_docs.tokens", b, {"byte 32 (doc_count)", "0 documents for 21 tokens"});
}

TEST(TokensMalformed, IdAtOrPastVocab) {
  std::vector<uint8_t> b = ValidImage();
  uint16_t bad = 1234;
  memcpy(b.data() + 128 + 2 * 13, &bad, 2);  // token 13
  bad = 1000;
  memcpy(b.data() + 128 + 2 * 17, &bad, 2);  // a later one: the first is reported
  FixPayloadCrc(b);
  FixHeaderCrc(b);
  ExpectFormatError("id_vocab.tokens", b, {"token 13 (byte 154)", "id 1234 >= vocab 1000"});
  // Lowering vocab makes existing ids invalid: the first is token 2 (id 3 >= 3).
  b = ValidImage();
  Put32(b, MF_TOKENS_OFF_VOCAB, 3);
  FixHeaderCrc(b);
  ExpectFormatError("id_vocab2.tokens", b, {"token 2 (byte 132)", "id 3 >= vocab 3"});
}

TEST(TokensMalformed, DocumentStarts) {
  std::vector<uint8_t> b = ValidImage();
  const size_t docs = Get64(b, MF_TOKENS_OFF_DOCS_OFFSET);
  ASSERT_EQ(Get64(b, docs + 8), 5u);
  ASSERT_EQ(Get64(b, docs + 16), 12u);

  Put64(b, docs + 16, 5);  // not increasing
  FixCrcs(b);
  ExpectFormatError("docs_equal.tokens", b,
                    {"(docs)", "document 2 starts at token 5, not after document 1's start 5"});
  Put64(b, docs + 16, 3);  // decreasing
  FixCrcs(b);
  ExpectFormatError("docs_down.tokens", b, {"document 2 starts at token 3"});
  Put64(b, docs + 16, 21);  // == count
  FixCrcs(b);
  ExpectFormatError("docs_range.tokens", b,
                    {"byte 200 (docs)", "document 2 starts at token 21, past the 21 tokens"});
  b = ValidImage();
  Put64(b, docs, 1);
  FixCrcs(b);
  ExpectFormatError("docs_first.tokens", b, {"document 0 starts at token 1 (must be 0)"});
}

TEST(TokensMalformed, MaskPaddingBits) {
  std::vector<uint8_t> b = ValidImage();
  const size_t mask = Get64(b, MF_TOKENS_OFF_MASK_OFFSET);
  b[mask + 2] |= 0x80;  // 21 tokens: bits 5..7 of byte 2 are padding
  FixCrcs(b);
  ExpectFormatError("mask_pad.tokens", b, {"byte 178 (mask)", "bits past the last token"});
}

// Written by tools/prepare_data.py from a tiny tokenizer and chat JSONL (see
// tests/tokens/data/make_fixture.py); .expected holds what the tokenizer itself
// produced, so this checks the Python writer against the C reader.
TEST(TokensFixture, PythonWriterChatFile) {
  mf_tokens *t = nullptr;
  ASSERT_EQ(mf_tokens_open("tests/tokens/data/chat_tiny.tokens", &t), MF_OK) << mf_last_error();
  std::ifstream f("tests/tokens/data/chat_tiny.expected");
  ASSERT_TRUE(f.good());
  std::string line, key;
  uint64_t vocab = 0, width = 0, count = 0, n_docs = 0;
  std::vector<uint64_t> ids, starts;
  std::string mask;
  while (std::getline(f, line)) {
    std::istringstream ss(line);
    ss >> key;
    uint64_t v;
    if (key == "vocab")
      ss >> vocab;
    else if (key == "width")
      ss >> width;
    else if (key == "count")
      ss >> count;
    else if (key == "docs")
      ss >> n_docs;
    else if (key == "ids")
      while (ss >> v) ids.push_back(v);
    else if (key == "starts")
      while (ss >> v) starts.push_back(v);
    else if (key == "mask")
      ss >> mask;
  }
  ASSERT_GT(count, 0u);
  EXPECT_EQ(mf_tokens_vocab(t), vocab);
  EXPECT_EQ(mf_tokens_width(t), width);
  ASSERT_EQ(mf_tokens_count(t), count);
  ASSERT_EQ(ids.size(), count);
  ASSERT_EQ(mask.size(), count);
  ASSERT_EQ(mf_tokens_doc_count(t), n_docs);
  ASSERT_EQ(starts.size(), n_docs);
  EXPECT_TRUE(mf_tokens_has_mask(t));
  uint64_t ones = 0;
  for (uint64_t i = 0; i < count; i++) {
    EXPECT_EQ(mf_tokens_at(t, i), ids[i]) << i;
    EXPECT_EQ(mf_tokens_mask_at(t, i), mask[i] == '1' ? 1 : 0) << i;
    ones += mask[i] == '1';
  }
  EXPECT_GT(ones, 0u);     // assistant turns count
  EXPECT_LT(ones, count);  // prompts do not
  for (uint64_t d = 0; d < n_docs; d++) EXPECT_EQ(mf_tokens_doc_starts(t)[d], starts[d]);
  mf_tokens_close(t);
}

}  // namespace
