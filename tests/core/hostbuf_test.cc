// src/core/hostbuf.c: host buffers in anonymous memory or in an unlinked,
// mapped file in a directory (the NVMe spill of master weights, gradient sums
// and AdamW moments).
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "src/core/core.h"
#include "src/core/hostbuf.h"
#include "tests/core/test_dir.h"

#if defined(__SANITIZE_ADDRESS__)
#define MF_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MF_TEST_ASAN 1
#endif
#endif

namespace {

std::vector<std::string> List(const std::string &dir) {
  std::vector<std::string> names;
  DIR *d = opendir(dir.c_str());
  if (!d) return names;
  while (struct dirent *e = readdir(d))
    if (std::strcmp(e->d_name, ".") && std::strcmp(e->d_name, "..")) names.push_back(e->d_name);
  closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

bool Contains(const std::string &s, const std::string &part) {
  return s.find(part) != std::string::npos;
}

// Byte i of pattern `seed`: a hash, so a shifted, truncated or zeroed page shows.
uint8_t PatternByte(uint64_t seed, size_t i) {
  uint64_t x = (uint64_t)i * 0x9E3779B97F4A7C15ull + seed * 0xBF58476D1CE4E5B9ull + 1;
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  return (uint8_t)x;
}

void Fill(void *p, size_t n, uint64_t seed) {
  uint8_t *b = static_cast<uint8_t *>(p);
  for (size_t i = 0; i < n; i++) b[i] = PatternByte(seed, i);
}

// The index of the first byte that differs from the pattern, or n.
size_t FirstMismatch(const void *p, size_t n, uint64_t seed) {
  const uint8_t *b = static_cast<const uint8_t *>(p);
  for (size_t i = 0; i < n; i++)
    if (b[i] != PatternByte(seed, i)) return i;
  return n;
}

size_t FirstNonZero(const void *p, size_t n) {
  const uint8_t *b = static_cast<const uint8_t *>(p);
  for (size_t i = 0; i < n; i++)
    if (b[i]) return i;
  return n;
}

// The descriptors this process has open (entries of /proc/self/fd).
int OpenFds() {
  return (int)List("/proc/self/fd").size() - 1; /* opendir's own */
}

// The (unlinked) file behind a buffer, through /proc/self/fd: the descriptor
// whose link reads "PATH (deleted)". Empty when there is none.
std::string DeletedFileLink(const std::string &path) {
  std::string want = path + " (deleted)";
  for (const std::string &fd : List("/proc/self/fd")) {
    std::string link = "/proc/self/fd/" + fd;
    char target[4200];
    ssize_t n = readlink(link.c_str(), target, sizeof target - 1);
    if (n <= 0) continue;
    target[n] = 0;
    if (want == target) return link;
  }
  return "";
}

std::string ReadDeletedFile(const std::string &path) {
  std::string link = DeletedFileLink(path);
  if (link.empty()) return "";
  std::ifstream f(link, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// Bytes of disk the file holds (st_blocks), -1 when it cannot be found.
long long AllocatedBytes(const std::string &path) {
  std::string link = DeletedFileLink(path);
  struct stat sb;
  if (link.empty() || stat(link.c_str(), &sb) != 0) return -1;
  return (long long)sb.st_blocks * 512;
}

size_t Page() {
  return (size_t)sysconf(_SC_PAGESIZE);
}

// Writes a pattern, advises the whole range away and back, and checks every byte.
void RoundTrip(mf_hostbuf *b, uint64_t seed) {
  Fill(b->ptr, b->bytes, seed);
  ASSERT_EQ(mf_hostbuf_advise(b, 0, b->bytes, 0), MF_OK) << mf_last_error();
  ASSERT_EQ(mf_hostbuf_advise(b, 0, b->bytes, 1), MF_OK) << mf_last_error();
  EXPECT_EQ(FirstMismatch(b->ptr, b->bytes, seed), b->bytes);
}

TEST(HostBuf, InMemoryIsZeroedAndKeepsItsData) {
  mf_hostbuf b;
  size_t n = 3 * Page() + 123;
  ASSERT_EQ(mf_hostbuf_alloc(nullptr, "Adam first moments", n, &b), MF_OK) << mf_last_error();
  ASSERT_NE(b.ptr, nullptr);
  EXPECT_EQ(b.bytes, n);
  EXPECT_EQ(b.on_disk, 0);
  EXPECT_STREQ(b.path, "");
  EXPECT_EQ(FirstNonZero(b.ptr, n), n);
  RoundTrip(&b, 1);
  mf_hostbuf_free(&b);
  EXPECT_EQ(b.ptr, nullptr);
  EXPECT_EQ(b.bytes, 0u);
  mf_hostbuf_free(&b);  // a second free is fine
  mf_hostbuf_free(nullptr);
}

TEST(HostBuf, OnDiskIsZeroedUnlinkedAndSharedWithTheFile) {
  std::string dir = TestDir();
  int fds = OpenFds();
  size_t n = 5 * Page() + 77;  // not a multiple of the page size
  mf_hostbuf b;
  ASSERT_EQ(mf_hostbuf_alloc(dir.c_str(), "Adam first moments", n, &b), MF_OK) << mf_last_error();
  ASSERT_NE(b.ptr, nullptr);
  EXPECT_EQ(b.bytes, n);
  EXPECT_EQ(b.on_disk, 1);
  // Named after the directory and `what` (sanitized), then unlinked at once.
  std::string path = b.path;
  EXPECT_EQ(path.rfind(dir + "/moefit-Adam_first_moments-", 0), 0u) << path;
  EXPECT_EQ(path.size(), dir.size() + std::strlen("/moefit-Adam_first_moments-XXXXXX"));
  EXPECT_EQ(List(dir), std::vector<std::string>{});
  EXPECT_EQ(OpenFds(), fds + 1);
  EXPECT_EQ(FirstNonZero(b.ptr, n), n);
  // Reserved whole before the first store (not a sparse file that a full disk
  // would turn into SIGBUS).
  EXPECT_GE(AllocatedBytes(path), (long long)n);

  // Stores land in the file itself (a private mapping would leave it zero).
  Fill(b.ptr, n, 2);
  ASSERT_EQ(mf_hostbuf_advise(&b, 0, n, 0), MF_OK) << mf_last_error();
  std::string file = ReadDeletedFile(path);
  ASSERT_EQ(file.size(), n) << "no open file " << path << " (deleted)";
  EXPECT_EQ(FirstMismatch(file.data(), n, 2), n);
  // And the mapping still reads them after the pages were let go.
  ASSERT_EQ(mf_hostbuf_advise(&b, 0, n, 1), MF_OK) << mf_last_error();
  EXPECT_EQ(FirstMismatch(b.ptr, n, 2), n);

  mf_hostbuf_free(&b);
  EXPECT_EQ(b.on_disk, 0);
  EXPECT_EQ(OpenFds(), fds);
  EXPECT_EQ(List(dir), std::vector<std::string>{});
}

TEST(HostBuf, AdviceNeverLosesData) {
  std::string dir = TestDir();
  size_t n = (size_t)24 << 20 | 5;
  mf_hostbuf b;
  ASSERT_EQ(mf_hostbuf_alloc(dir.c_str(), "master weights", n, &b), MF_OK) << mf_last_error();
  RoundTrip(&b, 3);
  // Rewritten after the pages were dropped: the new data wins, everywhere.
  RoundTrip(&b, 4);
  // Ranges that start and end inside pages, as tensors in one buffer do: each
  // is rewritten and let go in turn; the advice, widened to whole pages,
  // keeps the neighbours' fresh stores in the pages they share.
  size_t page = Page();
  size_t cuts[] = {0, 100, page - 1, page + 1, 3 * page + 17, n / 2 + 3, n - 1, n};
  uint8_t *p = static_cast<uint8_t *>(b.ptr);
  for (size_t i = 0; i + 1 < sizeof cuts / sizeof *cuts; i++) {
    size_t off = cuts[i], len = cuts[i + 1] - cuts[i];
    for (size_t j = off; j < off + len; j++) p[j] = PatternByte(8, j);
    ASSERT_EQ(mf_hostbuf_advise(&b, off, len, 0), MF_OK) << mf_last_error();
    ASSERT_EQ(mf_hostbuf_advise(&b, off, len, 1), MF_OK) << mf_last_error();
  }
  EXPECT_EQ(FirstMismatch(b.ptr, n, 8), n);
  EXPECT_EQ(mf_hostbuf_advise(&b, n, 0, 0), MF_OK);  // empty, at the end
  mf_hostbuf_free(&b);
}

// Bytes of [p, p + n) in the page cache (mincore on a file mapping).
size_t CachedBytes(void *p, size_t n) {
  size_t page = Page(), pages = (n + page - 1) / page, c = 0;
  std::vector<unsigned char> v(pages);
  if (mincore(p, n, v.data()) != 0) return SIZE_MAX;
  for (unsigned char x : v) c += x & 1;
  return c * page;
}

// Polls `cond` for up to `seconds`.
template <typename F>
bool Within(double seconds, F cond) {
  for (double t0 = mf_time_now(); mf_time_now() - t0 < seconds; usleep(20000))
    if (cond()) return true;
  return cond();
}

// On a disk filesystem, advice 0 lets the pages go once written, and advice 1
// brings the whole range back, not just the first read-ahead window (8 MiB
// at most by default, an eighth of the range). The read-back asks again while
// it polls and takes 15/16 of the range: under memory pressure (CI's asan run
// beside its builds) the kernel evicted a few pages it had read back
// (66007040 of 67108864 bytes cached after 10 s, 2026-11-28), which says
// nothing about the advice.
TEST(HostBuf, AdviceMovesThePages) {
  std::string dir = TestDir();
  struct statfs fs;
  ASSERT_EQ(statfs(dir.c_str(), &fs), 0);
  const long ext4 = 0xEF53, xfs = 0x58465342, btrfs = 0x9123683E;
  if (fs.f_type != ext4 && fs.f_type != xfs && fs.f_type != btrfs)
    GTEST_SKIP() << dir << " is not on ext4, xfs or btrfs (f_type 0x" << std::hex << fs.f_type
                 << "): its page cache may keep the pages";
  size_t n = (size_t)64 << 20;
  mf_hostbuf b;
  ASSERT_EQ(mf_hostbuf_alloc(dir.c_str(), "moments", n, &b), MF_OK) << mf_last_error();
  Fill(b.ptr, n, 9);
  EXPECT_EQ(CachedBytes(b.ptr, n), n);
  // Pages still being written stay; asking again after the writes drops them.
  EXPECT_TRUE(
      Within(10, [&] { return mf_hostbuf_advise(&b, 0, n, 0) == MF_OK && CachedBytes(b.ptr, n) < n / 16; }))
      << CachedBytes(b.ptr, n) << " of " << n << " bytes still cached";
  ASSERT_EQ(mf_hostbuf_advise(&b, 0, n, 1), MF_OK) << mf_last_error();
  EXPECT_TRUE(Within(
      10, [&] { return mf_hostbuf_advise(&b, 0, n, 1) == MF_OK && CachedBytes(b.ptr, n) >= n - n / 16; }))
      << CachedBytes(b.ptr, n) << " of " << n << " bytes read back";
  EXPECT_EQ(FirstMismatch(b.ptr, n, 9), n);
  mf_hostbuf_free(&b);
}

TEST(HostBuf, AdviceOutsideTheBufferIsRefused) {
  std::string dir = TestDir();
  mf_hostbuf b;
  ASSERT_EQ(mf_hostbuf_alloc(dir.c_str(), "grads", 1000, &b), MF_OK) << mf_last_error();
  EXPECT_EQ(mf_hostbuf_advise(&b, 999, 2, 0), MF_ERR_INVALID_ARG);
  EXPECT_TRUE(Contains(mf_last_error(), b.path)) << mf_last_error();
  EXPECT_TRUE(Contains(mf_last_error(), "1000 bytes")) << mf_last_error();
  EXPECT_EQ(mf_hostbuf_advise(&b, 1001, 0, 1), MF_ERR_INVALID_ARG);
  EXPECT_EQ(mf_hostbuf_advise(&b, 8, SIZE_MAX, 1), MF_ERR_INVALID_ARG);  // wraps
  EXPECT_EQ(mf_hostbuf_advise(nullptr, 0, 0, 1), MF_ERR_INVALID_ARG);
  EXPECT_EQ(mf_hostbuf_advise(&b, 999, 1, 0), MF_OK) << mf_last_error();
  mf_hostbuf_free(&b);
  mf_hostbuf z;
  std::memset(&z, 0, sizeof z);
  EXPECT_EQ(mf_hostbuf_advise(&z, 0, 0, 0), MF_OK);
  EXPECT_EQ(mf_hostbuf_advise(&z, 0, 1, 0), MF_ERR_INVALID_ARG);
}

TEST(HostBuf, TwoBuffersAtOnce) {
  std::string dir = TestDir();
  size_t n1 = 2 * Page() + 1, n2 = 7 * Page() - 3;
  mf_hostbuf a, b, c;
  ASSERT_EQ(mf_hostbuf_alloc(dir.c_str(), "m", n1, &a), MF_OK) << mf_last_error();
  ASSERT_EQ(mf_hostbuf_alloc(dir.c_str(), "m", n2, &b), MF_OK) << mf_last_error();
  ASSERT_EQ(mf_hostbuf_alloc(nullptr, "v", n2, &c), MF_OK) << mf_last_error();
  EXPECT_STRNE(a.path, b.path);
  EXPECT_EQ(List(dir), std::vector<std::string>{});
  Fill(a.ptr, n1, 5);
  Fill(b.ptr, n2, 6);
  Fill(c.ptr, n2, 7);
  ASSERT_EQ(mf_hostbuf_advise(&a, 0, n1, 0), MF_OK) << mf_last_error();
  ASSERT_EQ(mf_hostbuf_advise(&b, 0, n2, 0), MF_OK) << mf_last_error();
  ASSERT_EQ(mf_hostbuf_advise(&c, 0, n2, 0), MF_OK) << mf_last_error();
  EXPECT_EQ(FirstMismatch(a.ptr, n1, 5), n1);
  EXPECT_EQ(FirstMismatch(b.ptr, n2, 6), n2);
  EXPECT_EQ(FirstMismatch(c.ptr, n2, 7), n2);
  mf_hostbuf_free(&a);
  EXPECT_EQ(FirstMismatch(b.ptr, n2, 6), n2);  // freeing one leaves the other
  mf_hostbuf_free(&b);
  mf_hostbuf_free(&c);
}

TEST(HostBuf, ZeroBytes) {
  std::string dir = TestDir();
  mf_hostbuf b;
  ASSERT_EQ(mf_hostbuf_alloc(nullptr, "nothing", 0, &b), MF_OK) << mf_last_error();
  EXPECT_EQ(b.ptr, nullptr);
  EXPECT_EQ(b.bytes, 0u);
  mf_hostbuf_free(&b);
  ASSERT_EQ(mf_hostbuf_alloc(dir.c_str(), "nothing", 0, &b), MF_OK) << mf_last_error();
  EXPECT_EQ(b.ptr, nullptr);
  EXPECT_EQ(b.on_disk, 0);
  EXPECT_EQ(List(dir), std::vector<std::string>{});
  EXPECT_EQ(mf_hostbuf_advise(&b, 0, 0, 0), MF_OK);
  mf_hostbuf_free(&b);
  // A bad directory is an error whatever the size.
  std::string missing = dir + "/missing";
  EXPECT_EQ(mf_hostbuf_alloc(missing.c_str(), "nothing", 0, &b), MF_ERR_IO);
  EXPECT_TRUE(Contains(mf_last_error(), missing)) << mf_last_error();
}

TEST(HostBuf, NamesAreSanitized) {
  std::string dir = TestDir() + "//";  // trailing slashes are not doubled
  mf_hostbuf b;
  ASSERT_EQ(mf_hostbuf_alloc(dir.c_str(), "layer 3/experts.w1 (m)", 10, &b), MF_OK) << mf_last_error();
  std::string path = b.path;
  std::string want = dir.substr(0, dir.size() - 2) + "/moefit-layer_3_experts.w1__m_-";
  EXPECT_EQ(path.rfind(want, 0), 0u) << path;
  mf_hostbuf_free(&b);
  ASSERT_EQ(mf_hostbuf_alloc(dir.c_str(), nullptr, 10, &b), MF_OK) << mf_last_error();
  EXPECT_TRUE(Contains(b.path, "/moefit-buffer-")) << b.path;
  mf_hostbuf_free(&b);
  std::string longname(300, 'x');
  ASSERT_EQ(mf_hostbuf_alloc(dir.c_str(), longname.c_str(), 10, &b), MF_OK) << mf_last_error();
  EXPECT_TRUE(Contains(b.path, "/moefit-" + std::string(48, 'x') + "-")) << b.path;
  EXPECT_FALSE(Contains(b.path, std::string(49, 'x'))) << b.path;
  mf_hostbuf_free(&b);
}

TEST(HostBuf, MissingDirectory) {
  std::string dir = TestDir() + "/no/such/dir";
  mf_hostbuf b;
  std::memset(&b, 0xab, sizeof b);
  EXPECT_EQ(mf_hostbuf_alloc(dir.c_str(), "Adam second moments", 1 << 20, &b), MF_ERR_IO);
  std::string msg = mf_last_error();
  EXPECT_TRUE(Contains(msg, dir)) << msg;
  EXPECT_TRUE(Contains(msg, "no such directory")) << msg;
  EXPECT_TRUE(Contains(msg, "1.00 MiB")) << msg;
  EXPECT_TRUE(Contains(msg, "Adam second moments")) << msg;
  EXPECT_EQ(b.ptr, nullptr);  // zeroed on failure: free is safe
  mf_hostbuf_free(&b);
}

TEST(HostBuf, AFileInsteadOfADirectory) {
  std::string dir = TestDir(), file = dir + "/afile";
  std::ofstream(file) << "x";
  mf_hostbuf b;
  EXPECT_EQ(mf_hostbuf_alloc(file.c_str(), "grads", 4096, &b), MF_ERR_IO);
  std::string msg = mf_last_error();
  EXPECT_TRUE(Contains(msg, file)) << msg;
  EXPECT_TRUE(Contains(msg, "not a directory")) << msg;
  EXPECT_EQ(List(dir), std::vector<std::string>{"afile"});
  EXPECT_EQ(mf_hostbuf_alloc("", "grads", 4096, &b), MF_ERR_INVALID_ARG);
  EXPECT_EQ(mf_hostbuf_alloc(dir.c_str(), "grads", 4096, nullptr), MF_ERR_INVALID_ARG);
}

TEST(HostBuf, MoreThanTheFilesystemHasFree) {
  std::string dir = TestDir();
  struct statvfs v;
  ASSERT_EQ(statvfs(dir.c_str(), &v), 0);
  long double free_b = (long double)v.f_bavail * v.f_frsize;
  const uint64_t gib = 1ull << 30;
  if (v.f_frsize == 0 || free_b <= 0 || free_b > (long double)(1ull << 60))
    GTEST_SKIP() << dir << ": statvfs reports " << (double)free_b << " bytes free";
  size_t want = (size_t)free_b + gib;
  int fds = OpenFds();
  mf_hostbuf b;
  double t0 = mf_time_now();
  EXPECT_EQ(mf_hostbuf_alloc(dir.c_str(), "Adam first moments", want, &b), MF_ERR_IO);
  EXPECT_LT(mf_time_now() - t0, 5.0);  // refused up front, not after filling the disk
  std::string msg = mf_last_error();
  EXPECT_TRUE(Contains(msg, dir)) << msg;
  EXPECT_TRUE(Contains(msg, "not enough space")) << msg;
  EXPECT_TRUE(Contains(msg, "free there")) << msg;
  char h[32];
  EXPECT_TRUE(Contains(msg, mf_format_bytes(want, h, sizeof h))) << msg;
  EXPECT_EQ(b.ptr, nullptr);
  EXPECT_EQ(List(dir), std::vector<std::string>{});
  EXPECT_EQ(OpenFds(), fds);
}

TEST(HostBuf, ReadOnlyDirectory) {
  if (geteuid() == 0) GTEST_SKIP() << "root ignores directory permissions";
  std::string dir = TestDir() + "/ro";
  ASSERT_EQ(mkdir(dir.c_str(), 0555), 0);
  mf_hostbuf b;
  EXPECT_EQ(mf_hostbuf_alloc(dir.c_str(), "grads", 4096, &b), MF_ERR_IO);
  std::string msg = mf_last_error();
  EXPECT_TRUE(Contains(msg, dir)) << msg;
  EXPECT_TRUE(Contains(msg, "mkstemp")) << msg;
  EXPECT_TRUE(Contains(msg, "writable")) << msg;
  chmod(dir.c_str(), 0755);
  EXPECT_EQ(List(dir), std::vector<std::string>{});
}

// Runs fn in a child process (for limits that must not touch this one);
// returns the child's exit code, its message in *msg.
template <typename F>
int InChild(F fn, std::string *msg) {
  int pipefd[2];
  if (pipe(pipefd) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    close(pipefd[0]);
    std::string m;
    int code = fn(&m);
    if (write(pipefd[1], m.data(), m.size()) < 0) code = 100;
    _exit(code);
  }
  close(pipefd[1]);
  char buf[4096];
  ssize_t n;
  while ((n = read(pipefd[0], buf, sizeof buf)) > 0) msg->append(buf, (size_t)n);
  close(pipefd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 200 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

// The reservation failing (here: the file size limit) is a clean error, with
// nothing left behind.
TEST(HostBuf, ReservationFailureIsAnError) {
  std::string dir = TestDir();
  std::string msg;
  int code = InChild(
      [&](std::string *m) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {1 << 20, 1 << 20};
        if (setrlimit(RLIMIT_FSIZE, &rl) != 0) return 101;
        mf_hostbuf b;
        mf_status s = mf_hostbuf_alloc(dir.c_str(), "master weights", 8 << 20, &b);
        *m = mf_last_error();
        return (int)s;
      },
      &msg);
  EXPECT_EQ(code, (int)MF_ERR_IO) << msg;
  EXPECT_TRUE(Contains(msg, dir)) << msg;
  EXPECT_TRUE(Contains(msg, "posix_fallocate")) << msg;
  EXPECT_TRUE(Contains(msg, "8.00 MiB")) << msg;
  EXPECT_EQ(List(dir), std::vector<std::string>{});
}

TEST(HostBuf, MapFailureIsAnError) {
#ifdef MF_TEST_ASAN
  GTEST_SKIP() << "an address-space limit breaks AddressSanitizer's own mappings";
#endif
  std::string dir = TestDir();
  std::string msg;
  size_t want = (size_t)64 << 20;
  int code = InChild(
      [&](std::string *m) {
        // Room for what is mapped now plus a little: the 64 MiB mapping cannot fit.
        std::ifstream statm("/proc/self/statm");
        unsigned long pages = 0;
        statm >> pages;
        rlim_t cap = (rlim_t)pages * Page() + (8 << 20);
        struct rlimit rl = {cap, cap};
        if (setrlimit(RLIMIT_AS, &rl) != 0) return 101;
        mf_hostbuf b;
        mf_status s = mf_hostbuf_alloc(dir.c_str(), "grads", want, &b);
        *m = mf_last_error();
        if (s == MF_OK) mf_hostbuf_free(&b);
        mf_hostbuf c;
        mf_status s2 = mf_hostbuf_alloc(nullptr, "grads", want, &c);
        if (s2 != MF_ERR_OUT_OF_MEMORY) return 102;
        *m += "\n" + std::string(mf_last_error());
        return (int)s;
      },
      &msg);
  EXPECT_EQ(code, (int)MF_ERR_IO) << msg;
  EXPECT_TRUE(Contains(msg, dir)) << msg;
  EXPECT_TRUE(Contains(msg, "mmap")) << msg;
  EXPECT_TRUE(Contains(msg, "64.00 MiB")) << msg;
  EXPECT_EQ(List(dir), std::vector<std::string>{});
}

}  // namespace
