// src/core/file.c: atomic file replacement (mf_atomic_file, mf_write_file_atomic),
// whole-file reads and read-only maps, and the open of a file a user names
// that refuses a FIFO, a device, a socket or a directory without waiting.
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "src/core/core.h"
#include "tests/core/test_dir.h"

namespace {


void WriteFile(const std::string &path, const std::string &bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << bytes;
  ASSERT_TRUE(f.good()) << path;
}

std::string ReadFile(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

bool Exists(const std::string &path) {
  struct stat sb;
  return lstat(path.c_str(), &sb) == 0;
}

std::vector<std::string> List(const std::string &dir) {
  std::vector<std::string> names;
  DIR *d = opendir(dir.c_str());
  if (!d) return names;
  while (struct dirent *e = readdir(d))
    if (e->d_name[0] != '.') names.push_back(e->d_name);
  closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

bool Contains(const std::string &s, const std::string &part) {
  return s.find(part) != std::string::npos;
}

TEST(AtomicFile, CommitReplacesTheFileWhole) {
  std::string dir = TestDir(), path = dir + "/data.bin";
  WriteFile(path, "old contents");
  mf_atomic_file *f = nullptr;
  ASSERT_EQ(mf_atomic_file_open(path.c_str(), &f), MF_OK) << mf_last_error();
  EXPECT_EQ(std::string(mf_atomic_file_tmp_path(f)), path + ".tmp");
  EXPECT_GE(mf_atomic_file_fd(f), 0);
  ASSERT_EQ(mf_atomic_file_write(f, "new ", 4), MF_OK);
  ASSERT_EQ(mf_atomic_file_write(f, "contents!", 9), MF_OK);
  // Until the commit, the path holds the old file and the new one is elsewhere.
  EXPECT_EQ(ReadFile(path), "old contents");
  EXPECT_EQ(ReadFile(path + ".tmp"), "new contents!");
  ASSERT_EQ(mf_atomic_file_commit(f), MF_OK) << mf_last_error();
  EXPECT_EQ(ReadFile(path), "new contents!");
  EXPECT_EQ(List(dir), std::vector<std::string>{"data.bin"});
}

TEST(AtomicFile, PwriteThroughTheDescriptor) {
  std::string dir = TestDir(), path = dir + "/header_last.bin";
  mf_atomic_file *f = nullptr;
  ASSERT_EQ(mf_atomic_file_open(path.c_str(), &f), MF_OK) << mf_last_error();
  ASSERT_EQ(mf_atomic_file_write(f, "....body", 8), MF_OK);
  ASSERT_EQ(pwrite(mf_atomic_file_fd(f), "HEAD", 4, 0), 4);
  ASSERT_EQ(mf_atomic_file_commit(f), MF_OK) << mf_last_error();
  EXPECT_EQ(ReadFile(path), "HEADbody");
}

TEST(AtomicFile, AbortLeavesTheOldFileAndNoTemporary) {
  std::string dir = TestDir(), path = dir + "/keep.bin";
  WriteFile(path, "precious");
  mf_atomic_file *f = nullptr;
  ASSERT_EQ(mf_atomic_file_open(path.c_str(), &f), MF_OK) << mf_last_error();
  ASSERT_EQ(mf_atomic_file_write(f, "half", 4), MF_OK);
  mf_atomic_file_abort(f);
  mf_atomic_file_abort(nullptr);
  EXPECT_EQ(ReadFile(path), "precious");
  EXPECT_EQ(List(dir), std::vector<std::string>{"keep.bin"});
}

TEST(AtomicFile, MissingDirectoryNamesThePath) {
  std::string path = TestDir() + "/no/such/dir/x.bin";
  mf_atomic_file *f = reinterpret_cast<mf_atomic_file *>(0x1);
  EXPECT_EQ(mf_atomic_file_open(path.c_str(), &f), MF_ERR_IO);
  EXPECT_EQ(f, nullptr);
  std::string msg = mf_last_error();
  EXPECT_TRUE(Contains(msg, path)) << msg;
  EXPECT_TRUE(Contains(msg, "open")) << msg;
  EXPECT_TRUE(Contains(msg, "No such file or directory")) << msg;

  EXPECT_EQ(mf_write_file_atomic(path.c_str(), "x", 1), MF_ERR_IO);
  EXPECT_TRUE(Contains(mf_last_error(), path)) << mf_last_error();
}

TEST(AtomicFile, AFileWhereTheDirectoryShouldBe) {
  std::string dir = TestDir();
  WriteFile(dir + "/afile", "");
  std::string path = dir + "/afile/x.bin";
  EXPECT_EQ(mf_write_file_atomic(path.c_str(), "x", 1), MF_ERR_IO);
  std::string msg = mf_last_error();
  EXPECT_TRUE(Contains(msg, path)) << msg;
  EXPECT_TRUE(Contains(msg, "Not a directory")) << msg;
}

// A temporary file left by a crashed writer (here longer than the new data) is
// replaced, not appended to, reused or kept.
TEST(AtomicFile, StaleTemporaryIsReplaced) {
  std::string dir = TestDir(), path = dir + "/m.bin";
  WriteFile(path + ".tmp", std::string(100, 'x'));
  ASSERT_EQ(mf_write_file_atomic(path.c_str(), "fresh", 5), MF_OK) << mf_last_error();
  EXPECT_EQ(ReadFile(path), "fresh");
  EXPECT_EQ(List(dir), std::vector<std::string>{"m.bin"});
}

// A link planted at PATH.tmp is removed, never written through.
TEST(AtomicFile, LinkAtTheTemporaryNameIsNotFollowed) {
  std::string dir = TestDir(), path = dir + "/out.bin", victim = dir + "/victim";
  WriteFile(victim, "do not touch");
  ASSERT_EQ(symlink(victim.c_str(), (path + ".tmp").c_str()), 0);
  ASSERT_EQ(mf_write_file_atomic(path.c_str(), "payload", 7), MF_OK) << mf_last_error();
  EXPECT_EQ(ReadFile(victim), "do not touch");
  EXPECT_EQ(ReadFile(path), "payload");
  struct stat sb;
  ASSERT_EQ(lstat(path.c_str(), &sb), 0);
  EXPECT_TRUE(S_ISREG(sb.st_mode));
  EXPECT_FALSE(Exists(path + ".tmp"));

  // A dangling link: its target is not created.
  std::string nowhere = dir + "/would_be_created";
  ASSERT_EQ(symlink(nowhere.c_str(), (path + ".tmp").c_str()), 0);
  ASSERT_EQ(mf_write_file_atomic(path.c_str(), "again", 5), MF_OK) << mf_last_error();
  EXPECT_FALSE(Exists(nowhere));
  EXPECT_EQ(ReadFile(path), "again");
  EXPECT_EQ(List(dir), (std::vector<std::string>{"out.bin", "victim"}));
}

// A second writer of the same path removes the first one's PATH.tmp: the first
// commit fails instead of publishing the second's unfinished file, and leaves
// the second's temporary file alone.
TEST(AtomicFile, SecondWriterOfTheSamePath) {
  std::string dir = TestDir(), path = dir + "/shared.bin";
  WriteFile(path, "old");
  mf_atomic_file *a = nullptr, *b = nullptr;
  ASSERT_EQ(mf_atomic_file_open(path.c_str(), &a), MF_OK) << mf_last_error();
  ASSERT_EQ(mf_atomic_file_write(a, "from a", 6), MF_OK);
  ASSERT_EQ(mf_atomic_file_open(path.c_str(), &b), MF_OK) << mf_last_error();
  ASSERT_EQ(mf_atomic_file_write(b, "fro", 3), MF_OK);
  EXPECT_EQ(mf_atomic_file_commit(a), MF_ERR_IO);
  EXPECT_TRUE(Contains(mf_last_error(), "another writer")) << mf_last_error();
  EXPECT_EQ(ReadFile(path), "old");
  EXPECT_EQ(ReadFile(path + ".tmp"), "fro");
  ASSERT_EQ(mf_atomic_file_write(b, "m b", 3), MF_OK);
  ASSERT_EQ(mf_atomic_file_commit(b), MF_OK) << mf_last_error();
  EXPECT_EQ(ReadFile(path), "from b");
  EXPECT_EQ(List(dir), std::vector<std::string>{"shared.bin"});
}

// rename fails (the target is a directory): the message names the path and the
// call, the temporary file goes, the directory stays.
TEST(AtomicFile, FailedRenameRemovesTheTemporary) {
  std::string dir = TestDir(), target = dir + "/is_a_dir";
  ASSERT_EQ(mkdir(target.c_str(), 0755), 0);
  WriteFile(target + "/inside", "x");
  EXPECT_EQ(mf_write_file_atomic(target.c_str(), "data", 4), MF_ERR_IO);
  std::string msg = mf_last_error();
  EXPECT_TRUE(Contains(msg, target)) << msg;
  EXPECT_TRUE(Contains(msg, "rename")) << msg;
  EXPECT_FALSE(Exists(target + ".tmp"));
  EXPECT_EQ(ReadFile(target + "/inside"), "x");
}

// A write that fails marks the file: commit refuses to rename it and removes it.
TEST(AtomicFile, FailedWriteIsNotCommitted) {
  std::string dir = TestDir(), path = dir + "/w.bin";
  WriteFile(path, "old");
  mf_atomic_file *f = nullptr;
  ASSERT_EQ(mf_atomic_file_open(path.c_str(), &f), MF_OK) << mf_last_error();
  int ro = open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(ro, 0);
  ASSERT_GE(dup2(ro, mf_atomic_file_fd(f)), 0);  // the descriptor now refuses writes
  close(ro);
  EXPECT_EQ(mf_atomic_file_write(f, "abc", 3), MF_ERR_IO);
  EXPECT_TRUE(Contains(mf_last_error(), path + ".tmp: write failed")) << mf_last_error();
  EXPECT_NE(mf_atomic_file_commit(f), MF_OK);
  EXPECT_EQ(ReadFile(path), "old");
  EXPECT_EQ(List(dir), std::vector<std::string>{"w.bin"});
}

// sync completes files first; commit then only renames (a set appears in order).
TEST(AtomicFile, SyncThenCommitASet) {
  std::string dir = TestDir();
  mf_atomic_file *f[2] = {nullptr, nullptr};
  for (int i = 0; i < 2; i++) {
    std::string p = dir + "/part" + std::to_string(i);
    ASSERT_EQ(mf_atomic_file_open(p.c_str(), &f[i]), MF_OK) << mf_last_error();
    ASSERT_EQ(mf_atomic_file_write(f[i], p.data(), p.size()), MF_OK);
    ASSERT_EQ(mf_atomic_file_sync(f[i]), MF_OK) << mf_last_error();
    EXPECT_EQ(mf_atomic_file_fd(f[i]), -1);
    EXPECT_EQ(mf_atomic_file_write(f[i], "x", 1), MF_ERR_INVALID_ARG);  // after sync
  }
  EXPECT_EQ(List(dir), (std::vector<std::string>{"part0.tmp", "part1.tmp"}));
  for (int i = 0; i < 2; i++) ASSERT_EQ(mf_atomic_file_commit(f[i]), MF_OK) << mf_last_error();
  EXPECT_EQ(List(dir), (std::vector<std::string>{"part0", "part1"}));
  EXPECT_EQ(ReadFile(dir + "/part1"), dir + "/part1");
}

// A bare file name lives in the current directory (whose fsync is of ".").
TEST(AtomicFile, RelativePathWithoutADirectory) {
  std::string dir = TestDir();
  char cwd[4096];
  ASSERT_NE(getcwd(cwd, sizeof cwd), nullptr);
  ASSERT_EQ(chdir(dir.c_str()), 0);
  mf_status s = mf_write_file_atomic("bare.bin", "", 0);
  ASSERT_EQ(chdir(cwd), 0);
  ASSERT_EQ(s, MF_OK) << mf_last_error();
  EXPECT_EQ(List(dir), std::vector<std::string>{"bare.bin"});
  EXPECT_EQ(ReadFile(dir + "/bare.bin"), "");
}

TEST(AtomicFile, BadArguments) {
  mf_atomic_file *f = nullptr;
  EXPECT_EQ(mf_atomic_file_open(nullptr, &f), MF_ERR_INVALID_ARG);
  EXPECT_EQ(mf_atomic_file_open("", &f), MF_ERR_INVALID_ARG);
  EXPECT_EQ(mf_atomic_file_open("x", nullptr), MF_ERR_INVALID_ARG);
  EXPECT_EQ(mf_atomic_file_commit(nullptr), MF_ERR_INVALID_ARG);
  EXPECT_EQ(mf_atomic_file_sync(nullptr), MF_ERR_INVALID_ARG);
  EXPECT_EQ(mf_atomic_file_fd(nullptr), -1);
  EXPECT_EQ(mf_atomic_file_tmp_path(nullptr), nullptr);
}

TEST(WriteAll, WritesEverythingAndNamesThePathOnFailure) {
  std::string path = TestDir() + "/all.bin";
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  std::string big(3 << 20, 'z');
  ASSERT_EQ(mf_write_all(fd, path.c_str(), big.data(), big.size()), MF_OK);
  close(fd);
  EXPECT_EQ(ReadFile(path), big);
  fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(mf_write_all(fd, path.c_str(), "x", 1), MF_ERR_IO);
  EXPECT_TRUE(Contains(mf_last_error(), path + ": write failed: Bad file descriptor")) << mf_last_error();
  close(fd);
}

TEST(ReadFile, WholeFileNulTerminated) {
  std::string dir = TestDir(), path = dir + "/config.json";
  WriteFile(path, "{\"a\": 1}");
  char *text = nullptr;
  size_t len = 0;
  ASSERT_EQ(mf_read_file(path.c_str(), 64, "a config", &text, &len), MF_OK) << mf_last_error();
  EXPECT_EQ(len, 8u);
  EXPECT_STREQ(text, "{\"a\": 1}");
  free(text);

  WriteFile(dir + "/empty", "");
  ASSERT_EQ(mf_read_file((dir + "/empty").c_str(), 64, "a config", &text, &len), MF_OK) << mf_last_error();
  EXPECT_EQ(len, 0u);
  EXPECT_STREQ(text, "");
  free(text);
}

TEST(ReadFile, RefusesWhatItCannotRead) {
  std::string dir = TestDir(), path = dir + "/big";
  WriteFile(path, "12345");
  char *text = nullptr;
  size_t len = 0;
  EXPECT_EQ(mf_read_file(path.c_str(), 4, "a thing", &text, &len), MF_ERR_FORMAT);
  EXPECT_TRUE(Contains(mf_last_error(), path + ": 5 bytes is too large for a thing (at most 4)"))
      << mf_last_error();
  EXPECT_EQ(mf_read_file((dir + "/missing").c_str(), 4, "a thing", &text, &len), MF_ERR_IO);
  EXPECT_TRUE(Contains(mf_last_error(), dir + "/missing: cannot open: No such file or directory"))
      << mf_last_error();
  EXPECT_EQ(mf_read_file(dir.c_str(), 4, "a thing", &text, &len), MF_ERR_IO);
  EXPECT_TRUE(Contains(mf_last_error(), dir + ": not a regular file")) << mf_last_error();
  EXPECT_EQ(text, nullptr);
}

TEST(MapFile, MapsReadOnly) {
  std::string dir = TestDir(), path = dir + "/data";
  WriteFile(path, "mapped bytes");
  const uint8_t *base = nullptr;
  size_t size = 0;
  int err = -1;
  ASSERT_EQ(mf_map_file(path.c_str(), &base, &size, &err), MF_OK) << mf_last_error();
  EXPECT_EQ(err, 0);
  ASSERT_EQ(size, 12u);
  EXPECT_EQ(std::string(reinterpret_cast<const char *>(base), size), "mapped bytes");
  mf_unmap_file(base, size);

  // An empty file maps to nothing, which is fine to unmap.
  WriteFile(dir + "/empty", "");
  base = reinterpret_cast<const uint8_t *>(1);
  ASSERT_EQ(mf_map_file((dir + "/empty").c_str(), &base, &size, nullptr), MF_OK) << mf_last_error();
  EXPECT_EQ(base, nullptr);
  EXPECT_EQ(size, 0u);
  mf_unmap_file(base, size);
  mf_unmap_file(nullptr, 0);
}

TEST(MapFile, FailuresNameThePathAndTheCall) {
  std::string dir = TestDir();
  const uint8_t *base = nullptr;
  size_t size = 0;
  int err = 0;
  EXPECT_EQ(mf_map_file((dir + "/missing").c_str(), &base, &size, &err), MF_ERR_IO);
  EXPECT_EQ(err, ENOENT);
  EXPECT_TRUE(Contains(mf_last_error(), dir + "/missing: cannot open: No such file or directory"))
      << mf_last_error();
  EXPECT_EQ(mf_map_file(dir.c_str(), &base, &size, &err), MF_ERR_IO);
  EXPECT_EQ(err, 0);
  EXPECT_TRUE(Contains(mf_last_error(), dir + ": not a regular file")) << mf_last_error();
  EXPECT_EQ(mf_map_file(nullptr, &base, &size, nullptr), MF_ERR_INVALID_ARG);
}

// What a user can put where a file is expected, each refused at once naming
// the path and what it is: a FIFO (an open for reading would wait for a
// writer forever; alarm ends the test instead of hanging it), a directory, a
// character device, a socket. A regular file (and a link to one) opens with
// O_NONBLOCK cleared.
TEST(OpenRegular, RefusesWhatIsNotARegularFileWithoutWaiting) {
  const std::string dir = TestDir(), fifo = dir + "/fifo";
  unlink(fifo.c_str());
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0) << strerror(errno);
  char tmpl[] = "/tmp/mfsockXXXXXX";  // a socket's path must be short
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string sock = std::string(tmpl) + "/s";
  const int sfd = socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(sfd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  snprintf(addr.sun_path, sizeof addr.sun_path, "%s", sock.c_str());
  ASSERT_EQ(bind(sfd, reinterpret_cast<sockaddr *>(&addr), sizeof addr), 0) << strerror(errno);
  alarm(20);
  struct Case {
    std::string path, kind;
  };
  for (const Case &c : {Case{fifo, "a FIFO (named pipe)"}, Case{dir, "a directory"},
                        Case{"/dev/null", "a character device"}, Case{sock, "a socket"}}) {
    SCOPED_TRACE(c.path);
    int fd = 7, err = -1;
    uint64_t size = 9;
    EXPECT_EQ(mf_open_regular(c.path.c_str(), "a plan", &fd, &size, &err), MF_ERR_IO);
    EXPECT_EQ(fd, -1);
    EXPECT_EQ(err, 0);
    EXPECT_TRUE(Contains(mf_last_error(), c.path + ": not a regular file but " + c.kind +
                                              "; a plan is read only from a regular file"))
        << mf_last_error();
    char *text = nullptr;
    size_t len = 0;
    EXPECT_EQ(mf_read_file(c.path.c_str(), 64, "a config", &text, &len), MF_ERR_IO);
    EXPECT_TRUE(Contains(mf_last_error(), c.path + ": not a regular file but " + c.kind + "; a config is"))
        << mf_last_error();
    const uint8_t *base = nullptr;
    EXPECT_EQ(mf_map_file(c.path.c_str(), &base, &len, &err), MF_ERR_IO);
    EXPECT_TRUE(Contains(mf_last_error(), c.path + ": not a regular file but " + c.kind)) << mf_last_error();
  }
  alarm(0);
  close(sfd);
  unlink(sock.c_str());
  rmdir(tmpl);

  const std::string file = dir + "/file", link = dir + "/link";
  WriteFile(file, "12345");
  unlink(link.c_str());
  ASSERT_EQ(symlink(file.c_str(), link.c_str()), 0);
  int fd = -1, err = -1;
  uint64_t size = 0;
  ASSERT_EQ(mf_open_regular(link.c_str(), nullptr, &fd, &size, &err), MF_OK) << mf_last_error();
  EXPECT_EQ(err, 0);
  EXPECT_EQ(size, 5u);
  EXPECT_EQ(fcntl(fd, F_GETFL) & O_NONBLOCK, 0) << "reads of it may block as for any file";
  EXPECT_NE(fcntl(fd, F_GETFD) & FD_CLOEXEC, 0);
  close(fd);
  EXPECT_EQ(mf_open_regular((dir + "/missing").c_str(), "a plan", &fd, nullptr, &err), MF_ERR_IO);
  EXPECT_EQ(err, ENOENT);
  EXPECT_TRUE(Contains(mf_last_error(), dir + "/missing: cannot open: No such file or directory"))
      << mf_last_error();
  EXPECT_STREQ(mf_file_kind(S_IFBLK), "a block device");
  EXPECT_STREQ(mf_file_kind(S_IFREG), "a regular file");
}

}  // namespace
