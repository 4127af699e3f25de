// comm/ over MPI. Started by Bazel as one process, the test re-launches itself
// under mpirun (own TMPDIR and shared-memory directory, so concurrent tests do
// not collide); rank 0 alone writes the XML results and the exit status is the
// worst of all ranks. comm_test runs 2 ranks on one node; comm3_test runs 3
// ranks with MF_COMM_NODE_RANKS=1 (three nodes of one rank: the paths between
// nodes). MF_COMM_TEST_NP sets the number of ranks (default 2), so the tests
// check what follows from the world's shape instead of assuming one.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm.h"
#include "src/core/core.h"
#include "src/core/env.h"

namespace {

mf_comm *g_comm = nullptr;

int env_int(const char *name, int dflt) {
  const char *v = getenv(name);
  return v && *v ? atoi(v) : dflt;
}

double now_s() {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// Sets an environment variable for one scope and puts the old value back.
struct ScopedEnv {
  std::string name, old;
  bool had;
  ScopedEnv(const char *n, const char *v) : name(n) {
    const char *o = getenv(n);
    had = o != nullptr;
    if (had) old = o;
    if (v)
      setenv(n, v, 1);
    else
      unsetenv(n);
    mf_env_reload();  // the library reads its MF_ variables once
  }
  ~ScopedEnv() {
    if (had)
      setenv(name.c_str(), old.c_str(), 1);
    else
      unsetenv(name.c_str());
    mf_env_reload();
  }
};

TEST(Comm, WorldShape) {
  const int size = mf_comm_size(g_comm), rank = mf_comm_rank(g_comm);
  EXPECT_EQ(size, env_int("MF_COMM_TEST_NP", 2));
  EXPECT_TRUE(mf_comm_uses_mpi(g_comm));
  const int k = env_int("MF_COMM_NODE_RANKS", 0);
  if (k == 0) {  // every rank on this machine: one node
    EXPECT_EQ(mf_comm_nodes(g_comm), 1);
    EXPECT_EQ(mf_comm_node(g_comm), 0);
    EXPECT_EQ(mf_comm_local_size(g_comm), size);
    EXPECT_EQ(mf_comm_local_rank(g_comm), rank);
  } else {  // nodes of k consecutive ranks, the last one shorter
    EXPECT_EQ(mf_comm_nodes(g_comm), (size + k - 1) / k);
    EXPECT_EQ(mf_comm_node(g_comm), rank / k);
    EXPECT_EQ(mf_comm_local_size(g_comm), std::min(k, size - rank / k * k));
    EXPECT_EQ(mf_comm_local_rank(g_comm), rank % k);
  }
  EXPECT_EQ(mf_comm_is_leader(g_comm), mf_comm_local_rank(g_comm) == 0);
}

TEST(Comm, NodeRanksMustBeAWholeNumber) {
  for (const char *bad : {"0", "-2", "two", "3x"}) {
    ScopedEnv env("MF_COMM_NODE_RANKS", bad);
    mf_comm *c = nullptr;
    EXPECT_EQ(mf_comm_init(nullptr, nullptr, &c), MF_ERR_CONFIG) << bad;
    EXPECT_EQ(c, nullptr);
    EXPECT_NE(strstr(mf_last_error(), "MF_COMM_NODE_RANKS"), nullptr) << mf_last_error();
  }
}

// MF_COMM=none inside an MPI rank: a world of one rank beside the real one.
TEST(Comm, SingleProcessWorld) {
  ScopedEnv env("MF_COMM", "none");
  mf_comm *c = nullptr;
  ASSERT_EQ(mf_comm_init(nullptr, nullptr, &c), MF_OK) << mf_last_error();
  EXPECT_FALSE(mf_comm_uses_mpi(c));
  EXPECT_EQ(mf_comm_size(c), 1);
  EXPECT_EQ(mf_comm_nodes(c), 1);
  EXPECT_EQ(mf_comm_node(c), 0);
  EXPECT_TRUE(mf_comm_is_leader(c));
  EXPECT_EQ(mf_comm_node_barrier(c), MF_OK);
  double d[2] = {1.5, -0.0};
  int64_t i[1] = {7};
  float f[3] = {1, 2, 3};
  EXPECT_EQ(mf_comm_allreduce_sum_f64(c, d, 2), MF_OK);
  EXPECT_EQ(mf_comm_allreduce_sum_i64(c, i, 1), MF_OK);
  EXPECT_EQ(mf_comm_leaders_allreduce_sum_f32(c, f, 3), MF_OK);
  EXPECT_EQ(mf_comm_node_broadcast(c, f, sizeof f), MF_OK);
  EXPECT_EQ(d[0], 1.5);
  EXPECT_TRUE(std::signbit(d[1]));
  EXPECT_EQ(i[0], 7);
  EXPECT_EQ(f[2], 3.0f);
  float rows[4] = {1, 2, 3, 4}, into[4] = {0, 0, 0, 0};
  const mf_comm_part to_self[3] = {
      {rows, 0, 0}, {rows, 2 * sizeof(float), 0}, {rows + 2, 2 * sizeof(float), 0}};
  const mf_comm_part from_self[2] = {{into + 2, 2 * sizeof(float), 0}, {into, 2 * sizeof(float), 0}};
  EXPECT_EQ(mf_comm_exchange(c, to_self, 3, from_self, 2), MF_OK) << mf_last_error();
  EXPECT_EQ(into[2], 1.0f);  // the first receive takes the first send of bytes
  EXPECT_EQ(into[1], 4.0f);
  const mf_comm_part longer = {into, 4 * sizeof(float), 0};
  EXPECT_EQ(mf_comm_exchange(c, to_self, 3, &longer, 1), MF_ERR_MPI);

  mf_comm_shared *s = nullptr;
  ASSERT_EQ(mf_comm_shared_alloc(c, 10000, "test memory", &s), MF_OK) << mf_last_error();
  auto *p = (unsigned char *)mf_comm_shared_ptr(s);
  ASSERT_NE(p, nullptr);
  for (int k = 0; k < 10000; k++) ASSERT_EQ(p[k], 0);
  p[9999] = 1;
  mf_comm_shared_free(s);
  ASSERT_EQ(mf_comm_shared_alloc(c, 0, "nothing", &s), MF_OK);
  EXPECT_EQ(mf_comm_shared_ptr(s), nullptr);
  mf_comm_shared_free(s);
  mf_comm_shared_free(nullptr);

  mf_comm_relay *r = nullptr;
  ASSERT_EQ(mf_comm_relay_create(c, 3, &r), MF_OK) << mf_last_error();
  for (int64_t round = 0; round < 3; round++) {
    mf_comm_relay_begin(r, round);
    for (int64_t item = 2; item >= 0; item--) {  // never blocks, in any order
      ASSERT_EQ(mf_comm_relay_wait(r, item), MF_OK);
      mf_comm_relay_pass(r, item);
    }
  }
  EXPECT_EQ(mf_comm_relay_wait(r, 3), MF_ERR_INVALID_ARG);
  mf_comm_relay_free(r);
  mf_comm_relay_free(nullptr);

  mf_comm_abort(c, 3);  // without MPI it returns
  mf_comm_free(c);
}

TEST(Comm, BroadcastFromEitherRoot) {
  for (int root = 0; root < 2; root++) {
    std::vector<int> v(1000, mf_comm_rank(g_comm) == root ? 7 + root : -1);
    ASSERT_EQ(mf_comm_broadcast(g_comm, v.data(), v.size() * sizeof(int), root), MF_OK) << mf_last_error();
    for (int x : v) ASSERT_EQ(x, 7 + root);
  }
  int x = 0;
  EXPECT_EQ(mf_comm_broadcast(g_comm, &x, sizeof x, 5), MF_ERR_INVALID_ARG);
}

TEST(Comm, AllreduceSumIsRankOrderedAndIdentical) {
  const int r = mf_comm_rank(g_comm);
  const size_t n = 100001;
  std::vector<float> v(n);
  for (size_t i = 0; i < n; i++)
    v[i] = (r == 0 ? 1e8f : 1.0f) * (float)((i % 13) + 1) + (r == 0 ? 0.0f : 0.3f);
  std::vector<float> want(n);
  for (size_t i = 0; i < n; i++) {
    float a = 1e8f * (float)((i % 13) + 1), b = 1.0f * (float)((i % 13) + 1) + 0.3f;
    want[i] = a;  // rank 0's value first, then rank 1's, ...
    for (int k = 1; k < mf_comm_size(g_comm); k++) want[i] += b;
  }
  ASSERT_EQ(mf_comm_allreduce_sum_f32(g_comm, v.data(), n), MF_OK) << mf_last_error();
  EXPECT_EQ(memcmp(v.data(), want.data(), n * sizeof(float)), 0);
}

TEST(Comm, AllreduceMax) {
  int64_t v[3] = {mf_comm_rank(g_comm), -mf_comm_rank(g_comm), 5};
  ASSERT_EQ(mf_comm_allreduce_max_i64(g_comm, v, 3), MF_OK);
  EXPECT_EQ(v[0], mf_comm_size(g_comm) - 1);
  EXPECT_EQ(v[1], 0);
  EXPECT_EQ(v[2], 5);
  EXPECT_EQ(mf_comm_barrier(g_comm), MF_OK);
}

TEST(Comm, AllreduceSumI64) {
  const int64_t r = mf_comm_rank(g_comm), n = mf_comm_size(g_comm);
  int64_t v[3] = {r + 1, -r, (int64_t)1 << 40};
  ASSERT_EQ(mf_comm_allreduce_sum_i64(g_comm, v, 3), MF_OK) << mf_last_error();
  EXPECT_EQ(v[0], n * (n + 1) / 2);
  EXPECT_EQ(v[1], -n * (n - 1) / 2);
  EXPECT_EQ(v[2], n << 40);
}

// Expert parallelism's exchanges: counts (a part to and from every rank), then rows as parts,
// one per (receiver, part k) with k < 3 of (to + 1) * (from + 1) % 4 rows (some
// none), each row's bytes naming (sender, receiver, part, row); each rank
// receives every part in order, in place, its own included.
TEST(Comm, ExchangeMovesCountsAndPartsInOrder) {
  const int me = mf_comm_rank(g_comm), P = mf_comm_size(g_comm);
  auto rows = [](int from, int to, int k) { return (int64_t)(((to + 1) * (from + 1) + k) % 4); };
  std::vector<int64_t> cnt(3 * (size_t)P), got(3 * (size_t)P);
  for (int d = 0; d < P; d++)
    for (int k = 0; k < 3; k++) cnt[3 * d + k] = rows(me, d, k);
  std::vector<mf_comm_part> to(P), from(P);
  for (int q = 0; q < P; q++) {
    to[q] = {&cnt[3 * (size_t)q], 3 * sizeof(int64_t), q};
    from[q] = {&got[3 * (size_t)q], 3 * sizeof(int64_t), q};
  }
  ASSERT_EQ(mf_comm_exchange(g_comm, to.data(), P, from.data(), P), MF_OK) << mf_last_error();
  for (int q = 0; q < P; q++)
    for (int k = 0; k < 3; k++) EXPECT_EQ(got[3 * q + k], rows(q, me, k)) << "from rank " << q;
  const size_t unit = 4 * sizeof(int32_t);
  std::vector<int32_t> send, recv, want;
  std::vector<mf_comm_part> sends, recvs;
  for (int d = 0; d < P; d++)
    for (int k = 0; k < 3; k++)
      for (int64_t r = 0; r < rows(me, d, k); r++) send.insert(send.end(), {me, d, k, (int32_t)r});
  for (int q = 0; q < P; q++)
    for (int k = 0; k < 3; k++)
      for (int64_t r = 0; r < got[3 * q + k]; r++) want.insert(want.end(), {q, me, k, (int32_t)r});
  recv.assign(want.size() + 1, -1);
  send.push_back(7);  // never empty
  size_t at = 0;
  for (int d = 0; d < P; d++)
    for (int k = 0; k < 3; k++) {
      sends.push_back({send.data() + at, (size_t)rows(me, d, k) * unit, d});
      at += 4 * (size_t)rows(me, d, k);
    }
  at = 0;
  for (int q = 0; q < P; q++)
    for (int k = 0; k < 3; k++) {
      recvs.push_back({recv.data() + at, (size_t)got[3 * q + k] * unit, q});
      at += 4 * (size_t)got[3 * q + k];
    }
  ASSERT_EQ(mf_comm_exchange(g_comm, sends.data(), (int)sends.size(), recvs.data(), (int)recvs.size()), MF_OK)
      << mf_last_error();
  recv.pop_back();
  EXPECT_EQ(recv, want);
  // Sizes that disagree: rank 1 waits for 12 bytes where rank 0 sends 8, and says so (never a short
  // receive taken for a whole one).
  if (P >= 2) {
    int32_t sent[2] = {1, 2}, into[3] = {-1, -1, -1};
    const mf_comm_part s8 = {sent, sizeof sent, 1}, r12 = {into, sizeof into, 0};
    const mf_status st = mf_comm_exchange(g_comm, &s8, me == 0 ? 1 : 0, &r12, me == 1 ? 1 : 0);
    if (me == 1) {
      EXPECT_EQ(st, MF_ERR_MPI);
      EXPECT_NE(std::string(mf_last_error()).find("got 8 bytes from rank 0 where 12 were due"),
                std::string::npos)
          << mf_last_error();
    } else {
      EXPECT_EQ(st, MF_OK) << mf_last_error();
    }
  }
  // A part naming a rank outside the world is refused on the rank that passes it (before any MPI call).
  mf_comm_part bad = {recv.data(), 0, P};
  EXPECT_EQ(mf_comm_exchange(g_comm, &bad, 1, nullptr, 0), MF_ERR_INVALID_ARG);
  EXPECT_NE(std::string(mf_last_error()).find("names rank"), std::string::npos) << mf_last_error();
}

// Rank r's i-th value: with three or more ranks the order of the additions
// changes the bits ((1e17 + 3.3) - 1e17 is not 3.3).
double f64_value(int r, size_t i) {
  if (i == 0) return -0.0;  // -0.0 + -0.0 is -0.0; 0.0 + -0.0 would be 0.0
  const double k = (double)i;
  switch (r % 3) {
    case 0:
      return 1e17 * k;
    case 1:
      return 3.3 + k;
    default:
      return -1e17 * k + 0.7;
  }
}

TEST(Comm, AllreduceSumF64IsRankOrdered) {
  const int rank = mf_comm_rank(g_comm), size = mf_comm_size(g_comm);
  const size_t n = 37;
  std::vector<double> v(n), want(n);
  for (size_t i = 0; i < n; i++) {
    v[i] = f64_value(rank, i);
    double s = f64_value(0, i);  // rank 0's value first, then rank 1's, ...
    for (int r = 1; r < size; r++) s += f64_value(r, i);
    want[i] = s;
  }
  ASSERT_EQ(mf_comm_allreduce_sum_f64(g_comm, v.data(), n), MF_OK) << mf_last_error();
  EXPECT_EQ(memcmp(v.data(), want.data(), n * sizeof(double)), 0);
  EXPECT_TRUE(std::signbit(v[0]));
}

TEST(Comm, NodeBroadcastFromTheLeader) {
  const int node = mf_comm_node(g_comm);
  std::vector<int> v(100000, mf_comm_is_leader(g_comm) ? 40 + node : -1);
  ASSERT_EQ(mf_comm_node_broadcast(g_comm, v.data(), v.size() * sizeof(int)), MF_OK) << mf_last_error();
  for (int x : v) ASSERT_EQ(x, 40 + node);
  EXPECT_EQ(mf_comm_node_barrier(g_comm), MF_OK);
}

float leader_value(int node, size_t i) {
  const float k = (float)((i % 13) + 1);
  switch (node % 3) {
    case 0:
      return 1e8f * k;
    case 1:
      return k + 0.3f;
    default:
      return -1e8f * k + 0.1f;
  }
}

TEST(Comm, LeadersAllreduceIsNodeOrdered) {
  const int nodes = mf_comm_nodes(g_comm), node = mf_comm_node(g_comm);
  if (!mf_comm_is_leader(g_comm)) {
    float x = 1;
    EXPECT_EQ(mf_comm_leaders_allreduce_sum_f32(g_comm, &x, 1), MF_ERR_INVALID_ARG);
    return;
  }
  // Over more than 64 MiB of gathered floats with three nodes: two pieces.
  const size_t n = nodes > 1 ? (size_t)6 << 20 : 1000;
  std::vector<float> v(n), want(n);
  for (size_t i = 0; i < n; i++) {
    v[i] = leader_value(node, i);
    float s = leader_value(0, i);
    for (int k = 1; k < nodes; k++) s += leader_value(k, i);
    want[i] = s;
  }
  ASSERT_EQ(mf_comm_leaders_allreduce_sum_f32(g_comm, v.data(), n), MF_OK) << mf_last_error();
  EXPECT_EQ(memcmp(v.data(), want.data(), n * sizeof(float)), 0);
}

TEST(Comm, SharedMemoryIsZeroedAndSeenByTheNode) {
  const int lr = mf_comm_local_rank(g_comm), ls = mf_comm_local_size(g_comm);
  const size_t bytes = (3 << 20) + 123;
  mf_comm_shared *s = nullptr;
  ASSERT_EQ(mf_comm_shared_alloc(g_comm, bytes, "test memory", &s), MF_OK) << mf_last_error();
  auto *p = (unsigned char *)mf_comm_shared_ptr(s);
  ASSERT_NE(p, nullptr);
  size_t nonzero = 0;
  for (size_t i = 0; i < bytes; i++) nonzero += p[i] != 0;
  EXPECT_EQ(nonzero, 0u);
  ASSERT_EQ(mf_comm_node_barrier(g_comm), MF_OK);
  if (lr == ls - 1)  // the last local rank writes, all of them read
    for (size_t i = 0; i < bytes; i++) p[i] = (unsigned char)(i * 7 + 1);
  ASSERT_EQ(mf_comm_node_barrier(g_comm), MF_OK);
  size_t wrong = 0;
  for (size_t i = 0; i < bytes; i++) wrong += p[i] != (unsigned char)(i * 7 + 1);
  EXPECT_EQ(wrong, 0u);
  ASSERT_EQ(mf_comm_node_barrier(g_comm), MF_OK);
  mf_comm_shared_free(s);

  ASSERT_EQ(mf_comm_shared_alloc(g_comm, 0, "nothing", &s), MF_OK) << mf_last_error();
  EXPECT_EQ(mf_comm_shared_ptr(s), nullptr);
  mf_comm_shared_free(s);
}

// Shared memory the backing file system cannot give (Docker's 64 MiB
// /dev/shm, here MF_TEST_SHM_FREE) is refused on every rank of the node with
// one message naming the sizes and the way out, instead of a SIGBUS when the
// pages are first touched.
TEST(Comm, SharedMemoryWithoutTheRoomIsAnErrorOnEveryRank) {
  if (mf_comm_local_size(g_comm) < 2) GTEST_SKIP() << "a node of one rank uses its own anonymous memory";
  mf_comm_shared *s = nullptr;
  mf_status st;
  {
    ScopedEnv env("MF_TEST_SHM_FREE", "1048576");
    st = mf_comm_shared_alloc(g_comm, 8u << 20, "the test's state", &s);
  }
  EXPECT_EQ(st, MF_ERR_OUT_OF_MEMORY);
  EXPECT_EQ(s, nullptr);
  const std::string e = mf_last_error();
  EXPECT_NE(e.find("the test's state takes 8.00 MiB of memory the node's"), std::string::npos) << e;
  EXPECT_NE(e.find("whose file system has 1.00 MiB free: give it more (docker run --shm-size=SIZE"),
            std::string::npos)
      << e;
  // The next allocation, with the room, works.
  ASSERT_EQ(mf_comm_shared_alloc(g_comm, 1u << 20, "after", &s), MF_OK) << mf_last_error();
  mf_comm_shared_free(s);
}

// Every local rank appends its local rank to each item's log under the relay,
// over rounds that grow by uneven steps, some rounds from a second thread and
// rank 1 going through the items backwards: each log must read 0, 1, ... per
// round.
TEST(Comm, RelayOrdersTheNodesRanks) {
  const int lr = mf_comm_local_rank(g_comm), ls = mf_comm_local_size(g_comm);
  const int64_t items = 48;
  const int rounds = 5;
  const int64_t round_ids[rounds] = {0, 2, 3, 7, 8};
  const size_t slots = (size_t)rounds * (size_t)ls;
  mf_comm_shared *mem = nullptr;
  ASSERT_EQ(mf_comm_shared_alloc(g_comm, (size_t)items * (slots + 1) * sizeof(int64_t), "relay log", &mem),
            MF_OK)
      << mf_last_error();
  auto *pos = (int64_t *)mf_comm_shared_ptr(mem);  // items counts, then the logs
  int64_t *log = pos + items;
  mf_comm_relay *r = nullptr;
  {
    ScopedEnv env("MF_COMM_TIMEOUT_S", "30");  // a broken relay fails the test, not Bazel's timeout
    ASSERT_EQ(mf_comm_relay_create(g_comm, items, &r), MF_OK) << mf_last_error();
  }
  for (int k = 0; k < rounds; k++) {
    mf_comm_relay_begin(r, round_ids[k]);
    mf_status st = MF_OK;
    auto work = [&] {
      for (int64_t j = 0; j < items && st == MF_OK; j++) {
        const int64_t item = lr == 1 ? items - 1 - j : j;
        st = mf_comm_relay_wait(r, item);
        if (st != MF_OK) break;
        if (lr == 0 && item % 8 == 0) usleep(200);  // leave the next ranks time to run ahead
        int64_t at = pos[item];
        log[item * (int64_t)slots + at] = lr;
        pos[item] = at + 1;
        mf_comm_relay_pass(r, item);
      }
    };
    if (k % 2)
      std::thread(work).join();
    else
      work();
    EXPECT_EQ(st, MF_OK) << mf_last_error();
    ASSERT_EQ(mf_comm_node_barrier(g_comm), MF_OK);
  }
  size_t wrong = 0;
  for (int64_t item = 0; item < items; item++) {
    wrong += pos[item] != (int64_t)slots;
    for (size_t at = 0; at < slots; at++) wrong += log[item * (int64_t)slots + at] != (int64_t)(at % ls);
  }
  EXPECT_EQ(wrong, 0u);
  ASSERT_EQ(mf_comm_node_barrier(g_comm), MF_OK);
  mf_comm_relay_free(r);
  mf_comm_shared_free(mem);
}

// A relay in an order of the caller's (expert parallelism's groups): the
// node's ranks backwards, each log reading ls - 1, ..., 0 per round; a place
// outside the order, or a rank before it outside the node, is refused.
TEST(Comm, RelayAtPlacesOfTheCallers) {
  const int lr = mf_comm_local_rank(g_comm), ls = mf_comm_local_size(g_comm);
  const int64_t items = 16;
  const int rounds = 3;
  const size_t slots = (size_t)rounds * (size_t)ls;
  mf_comm_relay *r = nullptr;
  EXPECT_EQ(mf_comm_relay_create_at(g_comm, items, ls, ls, lr, &r), MF_ERR_INVALID_ARG);
  EXPECT_EQ(mf_comm_relay_create_at(g_comm, items, 1, 2, ls, &r), MF_ERR_INVALID_ARG);
  EXPECT_EQ(r, nullptr);
  mf_comm_shared *mem = nullptr;
  ASSERT_EQ(mf_comm_shared_alloc(g_comm, (size_t)items * (slots + 1) * sizeof(int64_t), "relay log", &mem),
            MF_OK)
      << mf_last_error();
  auto *pos = (int64_t *)mf_comm_shared_ptr(mem);
  int64_t *log = pos + items;
  {
    ScopedEnv env("MF_COMM_TIMEOUT_S", "30");
    ASSERT_EQ(mf_comm_relay_create_at(g_comm, items, ls - 1 - lr, ls, lr + 1, &r), MF_OK) << mf_last_error();
  }
  for (int k = 0; k < rounds; k++) {
    mf_comm_relay_begin(r, k);
    for (int64_t item = 0; item < items; item++) {
      ASSERT_EQ(mf_comm_relay_wait(r, item), MF_OK) << mf_last_error();
      if (lr == ls - 1 && item % 4 == 0) usleep(200);  // the first place: leave the others time to run ahead
      const int64_t at = pos[item];
      log[item * (int64_t)slots + at] = lr;
      pos[item] = at + 1;
      mf_comm_relay_pass(r, item);
    }
    ASSERT_EQ(mf_comm_node_barrier(g_comm), MF_OK);
  }
  size_t wrong = 0;
  for (int64_t item = 0; item < items; item++) {
    wrong += pos[item] != (int64_t)slots;
    for (size_t at = 0; at < slots; at++)
      wrong += log[item * (int64_t)slots + at] != (int64_t)(ls - 1 - (int)(at % ls));
  }
  EXPECT_EQ(wrong, 0u);
  ASSERT_EQ(mf_comm_node_barrier(g_comm), MF_OK);
  mf_comm_relay_free(r);
  mf_comm_shared_free(mem);
}

TEST(Comm, RelayFailStopsTheWaiters) {
  if (mf_comm_local_size(g_comm) < 2) GTEST_SKIP() << "a node of one rank waits for nobody";
  const int lr = mf_comm_local_rank(g_comm);
  ScopedEnv env("MF_COMM_TIMEOUT_S", "60");
  mf_comm_relay *r = nullptr;
  ASSERT_EQ(mf_comm_relay_create(g_comm, 4, &r), MF_OK) << mf_last_error();
  mf_comm_relay_begin(r, 1);
  const double t0 = now_s();
  if (lr == 0) {
    usleep(100000);
    mf_comm_relay_fail(r);
  } else {
    EXPECT_EQ(mf_comm_relay_wait(r, 0), MF_ERR_MPI);
    EXPECT_NE(strstr(mf_last_error(), "another rank of this node failed"), nullptr) << mf_last_error();
    EXPECT_LT(now_s() - t0, 10.0);
  }
  ASSERT_EQ(mf_comm_node_barrier(g_comm), MF_OK);
  EXPECT_EQ(mf_comm_relay_wait(r, 1), MF_ERR_MPI);  // local rank 0 learns of it too
  ASSERT_EQ(mf_comm_node_barrier(g_comm), MF_OK);
  mf_comm_relay_free(r);
}

TEST(Comm, RelayWaitTimesOut) {
  if (mf_comm_local_size(g_comm) < 2) GTEST_SKIP() << "a node of one rank waits for nobody";
  const int lr = mf_comm_local_rank(g_comm);
  mf_comm_relay *r = nullptr;
  {
    ScopedEnv env("MF_COMM_TIMEOUT_S", "0.5");  // read when the relay is created
    ASSERT_EQ(mf_comm_relay_create(g_comm, 2, &r), MF_OK) << mf_last_error();
  }
  mf_comm_relay_begin(r, 3);
  // Every rank passes item 0; local rank 0 never passes item 1.
  ASSERT_EQ(mf_comm_relay_wait(r, 0), MF_OK) << mf_last_error();
  mf_comm_relay_pass(r, 0);
  if (lr > 0) {
    const double t0 = now_s();
    EXPECT_EQ(mf_comm_relay_wait(r, 1), MF_ERR_MPI);
    const double waited = now_s() - t0;
    EXPECT_GE(waited, 0.45);
    EXPECT_LT(waited, 10.0);
    const std::string want = "(local rank " + std::to_string(lr - 1) + ", pid ";
    EXPECT_NE(strstr(mf_last_error(), want.c_str()), nullptr) << mf_last_error();
    EXPECT_NE(strstr(mf_last_error(), ") to pass item 1 of round 3: it stopped or hangs"), nullptr)
        << mf_last_error();
    EXPECT_NE(strstr(mf_last_error(), "MF_COMM_TIMEOUT_S"), nullptr) << mf_last_error();
  }
  ASSERT_EQ(mf_comm_node_barrier(g_comm), MF_OK);
  mf_comm_relay_free(r);
}

TEST(Comm, RelayTimeoutMustBeANumber) {
  FILE *f = tmpfile();
  ASSERT_NE(f, nullptr);
  mf_log_set_stream(f);
  mf_comm_relay *r = nullptr;
  {
    ScopedEnv env("MF_COMM_TIMEOUT_S", "soon");
    ASSERT_EQ(mf_comm_relay_create(g_comm, 1, &r), MF_OK) << mf_last_error();
  }
  mf_log_set_stream(nullptr);
  mf_comm_relay_free(r);
  rewind(f);
  char buf[4096];
  size_t got = fread(buf, 1, sizeof buf - 1, f);
  buf[got] = 0;
  fclose(f);
  EXPECT_NE(strstr(buf, "MF_COMM_TIMEOUT_S='soon'"), nullptr) << buf;
}

// Every rank failing: with one message, rank 0 alone reports it; with a
// message a rank, each does; a rank whose relay only brought news of
// another's failure stays quiet while one with a fault of its own reports.
TEST(Comm, FailAgreeWhenEveryRankFails) {
  const int rank = mf_comm_rank(g_comm), size = mf_comm_size(g_comm);
  int all = 0, alike = 0, say = 0;
  const double t0 = now_s();
  mf_comm_fail_agree(g_comm, "data.train: bad file", 30, &all, &alike, &say);
  EXPECT_LT(now_s() - t0, 10.0);
  EXPECT_TRUE(all);
  EXPECT_TRUE(alike);
  EXPECT_EQ(say, rank == 0);
  const std::string mine = "rank " + std::to_string(rank) + " failed";
  mf_comm_fail_agree(g_comm, mine.c_str(), 30, &all, &alike, &say);
  EXPECT_TRUE(all);
  EXPECT_EQ(alike, size == 1);
  EXPECT_TRUE(say);
  // News of a failure through the relay (local rank 0 fails it), then every
  // rank fails: the node's ranks that heard the news stay quiet.
  mf_comm_relay *r = nullptr;
  ASSERT_EQ(mf_comm_relay_create(g_comm, 1, &r), MF_OK) << mf_last_error();
  mf_comm_relay_begin(r, 1);
  const int lr = mf_comm_local_rank(g_comm), ls = mf_comm_local_size(g_comm);
  if (lr == 0) mf_comm_relay_fail(r);
  ASSERT_EQ(mf_comm_node_barrier(g_comm), MF_OK);
  if (lr > 0) {
    EXPECT_EQ(mf_comm_relay_wait(r, 0), MF_ERR_MPI);
  }
  ASSERT_EQ(mf_comm_node_barrier(g_comm), MF_OK);
  mf_comm_fail_agree(g_comm, lr > 0 ? "news" : mine.c_str(), 30, &all, &alike, &say);
  EXPECT_TRUE(all);
  EXPECT_EQ(alike, size == 1);
  EXPECT_EQ(say, lr == 0 || ls == 1) << "local rank " << lr;
  mf_comm_relay_free(r);
}

// Rank 0 fails alone: it waits its time and learns that not every rank
// failed (then it would end the job). Here the others join late, which
// completes the open gather, so the tests can go on.
TEST(Comm, FailAgreeWhenOneRankFailsAlone) {
  const int rank = mf_comm_rank(g_comm), size = mf_comm_size(g_comm);
  int all = 0, alike = 0, say = 0;
  if (rank == 0) {
    const double t0 = now_s();
    mf_comm_fail_agree(g_comm, "alone", 0.3, &all, &alike, &say);
    const double waited = now_s() - t0;
    EXPECT_EQ(all, size == 1);
    if (size > 1) {
      EXPECT_GE(waited, 0.29);
    }
    EXPECT_LT(waited, 10.0);
    EXPECT_TRUE(say);
  }
  ASSERT_EQ(mf_comm_barrier(g_comm), MF_OK);
  if (rank > 0) {
    mf_comm_fail_agree(g_comm, "late", 30, &all, &alike, &say);
    EXPECT_TRUE(all);
  }
  ASSERT_EQ(mf_comm_barrier(g_comm), MF_OK);
}

// ------------------------------------------------ waits with a deadline
//
// Each test below makes a comm of its own whose waits give up after a
// fraction of a second (MF_COMM_TIMEOUT_S, read when the comm is created):
// a wait that times out leaves its comm out of step with the others', so it
// is used for that test alone, and the ranks meet afterwards on g_comm's
// world barrier (whose MPI polls let the open collectives of the comm that
// timed out complete).

// The deadline tests: the waiters' deadline is 0.5 s; the late rank comes
// 2.5 s after them, with a deadline of its own of 3 s, so that on a loaded
// machine (CI runs several MPI tests on 2 cores) its own call, which needs the
// others' MPI progress, does not time out in turn. (Not longer: when it frees
// its communicator, the node barrier there waits its deadline out for a
// waiter that timed out, which is out of step and never comes.) A waiter that
// gave up on its deadline returns well before the late rank comes.
constexpr const char *kLateTimeout = "3";
constexpr useconds_t kLateUs = 2500000;
constexpr double kGaveUpBefore = 2.0;

mf_comm *comm_with_timeout(const char *seconds) {
  ScopedEnv env("MF_COMM_TIMEOUT_S", seconds);
  mf_comm *c = nullptr;
  EXPECT_EQ(mf_comm_init(nullptr, nullptr, &c), MF_OK) << mf_last_error();
  return c;
}

// Every rank's process id, by world rank.
std::vector<int64_t> pids() {
  std::vector<int64_t> p((size_t)mf_comm_size(g_comm), 0);
  p[(size_t)mf_comm_rank(g_comm)] = getpid();
  EXPECT_EQ(mf_comm_allreduce_sum_i64(g_comm, p.data(), p.size()), MF_OK) << mf_last_error();
  return p;
}

double thread_cpu_s() {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

bool has(const char *text, const std::string &what) {
  return strstr(text, what.c_str()) != nullptr;
}

// The node's last rank stops itself (SIGSTOP) before the node's barrier: the
// others give up after the timeout, naming it (its rank, pid, and that it is
// stopped), and their comm refuses the next collective at once. Continued,
// the stopped rank passes the barrier (the others came to it).
TEST(CommDeadline, NodeBarrierNamesAStoppedRank) {
  if (mf_comm_local_size(g_comm) < 2) GTEST_SKIP() << "a node of one rank waits for nobody";
  const std::vector<int64_t> pid = pids();
  mf_comm *c = comm_with_timeout("0.5");
  ASSERT_NE(c, nullptr);
  const int lr = mf_comm_local_rank(c), ls = mf_comm_local_size(c), last = mf_comm_rank(c) - lr + ls - 1;
  ASSERT_EQ(mf_comm_barrier(g_comm), MF_OK);
  if (lr == ls - 1) {
    raise(SIGSTOP);  // local rank 0 continues it once its wait has timed out
    EXPECT_EQ(mf_comm_node_barrier(c), MF_OK) << mf_last_error();
  } else {
    const double t0 = now_s();
    const mf_status st = mf_comm_node_barrier(c);
    const double waited = now_s() - t0;
    const std::string msg = mf_last_error();
    if (lr == 0) kill((pid_t)pid[(size_t)last], SIGCONT);
    EXPECT_EQ(st, MF_ERR_MPI);
    EXPECT_GE(waited, 0.45);
    EXPECT_LT(waited, 5.0);
    const std::string who =
        "waited 0.5 s for rank " + std::to_string(last) + " (local rank " + std::to_string(ls - 1) +
        ", pid " + std::to_string(pid[(size_t)last]) +
        ", stopped by a signal) at the node's barrier: it stopped or hangs (MF_COMM_TIMEOUT_S)";
    EXPECT_TRUE(has(msg.c_str(), who)) << msg;
    EXPECT_EQ(mf_comm_node_barrier(c), MF_ERR_MPI);
    EXPECT_TRUE(has(mf_last_error(), "out of step since an earlier wait timed out")) << mf_last_error();
  }
  ASSERT_EQ(mf_comm_barrier(g_comm), MF_OK);
  mf_comm_free(c);
}

// The last rank comes 1.5 s late to a max over every rank: the others give up
// after 0.5 s naming it (on this node from the board, else as a rank of
// another node), their values untouched; the late rank gets the max of all.
TEST(CommDeadline, WorldCollectiveNamesTheLateRank) {
  const int last = mf_comm_size(g_comm) - 1;
  mf_comm *c = comm_with_timeout(mf_comm_rank(g_comm) == last ? kLateTimeout : "0.5");
  ASSERT_NE(c, nullptr);
  const int rank = mf_comm_rank(c);
  ASSERT_EQ(mf_comm_barrier(g_comm), MF_OK);
  int64_t v[2] = {rank, 10 * rank};
  if (rank == last) {
    usleep(kLateUs);
    EXPECT_EQ(mf_comm_allreduce_max_i64(c, v, 2), MF_OK) << mf_last_error();
    EXPECT_EQ(v[0], last);
    EXPECT_EQ(v[1], 10 * last);
  } else {
    const double t0 = now_s();
    EXPECT_EQ(mf_comm_allreduce_max_i64(c, v, 2), MF_ERR_MPI);
    const double waited = now_s() - t0;
    EXPECT_GE(waited, 0.45);
    EXPECT_LT(waited, kGaveUpBefore);
    const char *msg = mf_last_error();
    EXPECT_TRUE(has(msg, "comm: waited 0.5 s for ")) << msg;
    EXPECT_TRUE(has(msg, " in a max over every rank: it stopped or hangs")) << msg;
    if (mf_comm_nodes(c) == 1) {
      EXPECT_TRUE(
          has(msg, "for rank " + std::to_string(last) + " (local rank " + std::to_string(last) + ", pid "))
          << msg;
    } else {
      EXPECT_TRUE(has(msg, std::to_string(last) + " (on other nodes)")) << msg;
    }
    EXPECT_EQ(v[0], rank);  // what timed out wrote nothing
    EXPECT_EQ(v[1], 10 * rank);
    EXPECT_EQ(mf_comm_allreduce_max_i64(c, v, 2), MF_ERR_MPI);
    EXPECT_TRUE(has(mf_last_error(), "out of step since an earlier wait timed out")) << mf_last_error();
  }
  ASSERT_EQ(mf_comm_barrier(g_comm), MF_OK);
  mf_comm_free(c);
}

// Rank 0 works alone for 1.5 s (an evaluation, a checkpoint) while the others
// wait at mf_comm_barrier_solo with a 0.5 s deadline: on its node they wait
// on for it (it is alive), saying so; on another node (comm3_test: it cannot
// be seen) they give up as at any barrier.
TEST(CommDeadline, ASoloBarrierWaitsForARootAtWork) {
  mf_comm *c = comm_with_timeout(mf_comm_rank(g_comm) == 0 ? kLateTimeout : "0.5");
  ASSERT_NE(c, nullptr);
  const int rank = mf_comm_rank(c);
  const bool root_here = mf_comm_rank(c) - mf_comm_local_rank(c) == 0;  // rank 0 is on this node
  ASSERT_EQ(mf_comm_barrier(g_comm), MF_OK);
  if (rank == 0) {
    usleep(kLateUs);
    EXPECT_EQ(mf_comm_barrier_solo(c, 0, "evaluating"), MF_OK) << mf_last_error();
  } else {
    FILE *f = tmpfile();
    ASSERT_NE(f, nullptr);
    mf_log_set_stream(f);
    const double t0 = now_s();
    const mf_status st = mf_comm_barrier_solo(c, 0, "evaluating");
    const double waited = now_s() - t0;
    mf_log_set_stream(nullptr);
    rewind(f);
    char buf[8192];
    buf[fread(buf, 1, sizeof buf - 1, f)] = 0;
    fclose(f);
    if (root_here) {
      EXPECT_EQ(st, MF_OK) << mf_last_error();
      EXPECT_GE(waited, kLateUs * 1e-6 - 0.2);
      EXPECT_TRUE(has(buf, "still waiting for rank 0 (pid ")) << buf;
      EXPECT_TRUE(has(buf, "evaluating alone, after ")) << buf;
    } else {
      EXPECT_EQ(st, MF_ERR_MPI);
      EXPECT_LT(waited, kGaveUpBefore);
    }
  }
  ASSERT_EQ(mf_comm_barrier(g_comm), MF_OK);
  mf_comm_free(c);
}

// A root stopped (SIGSTOP) is no root at work: the others' solo barrier times
// out naming it.
TEST(CommDeadline, ASoloBarrierGivesUpOnAStoppedRoot) {
  const std::vector<int64_t> pid = pids();
  mf_comm *c = comm_with_timeout("0.5");
  ASSERT_NE(c, nullptr);
  const int rank = mf_comm_rank(c);
  ASSERT_EQ(mf_comm_barrier(g_comm), MF_OK);
  if (rank == 0) {
    raise(SIGSTOP);  // rank 1 continues it once its wait has timed out
    (void)mf_comm_barrier_solo(c, 0, "writing a checkpoint");
  } else {
    const double t0 = now_s();
    const mf_status st = mf_comm_barrier_solo(c, 0, "writing a checkpoint");
    const double waited = now_s() - t0;
    const std::string msg = mf_last_error();
    if (rank == 1) {
      usleep(1000000);  // every other waiter's deadline has passed too
      kill((pid_t)pid[0], SIGCONT);
    }
    EXPECT_EQ(st, MF_ERR_MPI);
    EXPECT_LT(waited, 5.0);
    EXPECT_TRUE(has(msg.c_str(), "it stopped or hangs (MF_COMM_TIMEOUT_S)")) << msg;
  }
  ASSERT_EQ(mf_comm_barrier(g_comm), MF_OK);
  mf_comm_free(c);
}

// Nodes of their own (comm3_test): the last node's leader comes late to the
// leaders' exchange; the others give up naming the leaders they wait for.
TEST(CommDeadline, LeadersExchangeNamesTheOtherLeaders) {
  if (mf_comm_nodes(g_comm) < 2) GTEST_SKIP() << "one node: no leaders' exchange";
  const bool late_leader = mf_comm_node(g_comm) == mf_comm_nodes(g_comm) - 1;
  mf_comm *c = comm_with_timeout(late_leader ? kLateTimeout : "0.5");
  ASSERT_NE(c, nullptr);
  ASSERT_EQ(mf_comm_barrier(g_comm), MF_OK);
  if (mf_comm_is_leader(c)) {
    const int node = mf_comm_node(c), nodes = mf_comm_nodes(c);
    float f[3] = {1, 2, (float)node};
    if (node == nodes - 1) {
      usleep(kLateUs);
      EXPECT_EQ(mf_comm_leaders_allreduce_sum_f32(c, f, 3), MF_OK) << mf_last_error();
      EXPECT_EQ(f[0], (float)nodes);
      EXPECT_EQ(f[2], (float)(nodes * (nodes - 1) / 2));
    } else {
      EXPECT_EQ(mf_comm_leaders_allreduce_sum_f32(c, f, 3), MF_ERR_MPI);
      const char *msg = mf_last_error();
      EXPECT_TRUE(has(msg, "comm: waited 0.5 s for the other nodes' leaders (rank ")) << msg;
      EXPECT_TRUE(has(msg, "in the leaders' exchange of the nodes' gradient sums")) << msg;
      EXPECT_EQ(f[2], (float)node);
    }
  }
  ASSERT_EQ(mf_comm_barrier(g_comm), MF_OK);
  mf_comm_free(c);
}

// A rank waiting a second for a late one at a barrier (the world's, the
// node's) sleeps: it takes a small part of a core, not all of it (ranks share
// the machine's cores). Its thread's CPU time, printed.
TEST(CommDeadline, AWaitCostsNoCpu) {
  mf_comm *c = comm_with_timeout("30");
  ASSERT_NE(c, nullptr);
  const int late = mf_comm_rank(c) == mf_comm_size(c) - 1;
  for (int node = 0; node < 2; node++) {
    if (node && mf_comm_local_size(c) < 2) break;
    ASSERT_EQ(mf_comm_barrier(g_comm), MF_OK);
    if (late) usleep(1000000);
    const double t0 = now_s(), cpu0 = thread_cpu_s();
    ASSERT_EQ(node ? mf_comm_node_barrier(c) : mf_comm_barrier(c), MF_OK) << mf_last_error();
    const double waited = now_s() - t0, cpu = thread_cpu_s() - cpu0;
    if (!late)
      printf("%s barrier: %.3f s of CPU in %.3f s of waiting\n", node ? "node" : "world", cpu, waited);
    if (!late && waited > 0.5) {
      // Spinning takes all of a core (MPI_Barrier did); sleeping, a few % (up
      // to 20% under ASan on a loaded machine).
      EXPECT_LT(cpu, 0.5 * waited) << (node ? "node" : "world") << " barrier: " << cpu << " s of CPU in "
                                   << waited << " s";
    }
  }
  ASSERT_EQ(mf_comm_barrier(g_comm), MF_OK);
  mf_comm_free(c);
}

// mf_comm_wait_until (NCCL's transfers on a GPU, which no MPI request
// tracks): done after some polls is OK; a fault the probe reports is
// returned; never done gives up after the comm's deadline, naming what it
// waited for.
TEST(CommDeadline, WaitUntilGivesUpAtTheDeadline) {
  mf_comm *c = comm_with_timeout("0.5");
  ASSERT_NE(c, nullptr);
  struct Probe {
    int polls = 0, after = 0;
    mf_status fault = MF_OK;
    static int done(void *ctx, mf_status *st) {
      Probe *p = (Probe *)ctx;
      if (++p->polls < p->after) return 0;
      if (p->after <= 0) return 0;  // never
      *st = p->fault;
      return 1;
    }
  };
  Probe soon;
  soon.after = 460;  // past the spins, into the yields (a few: a yield on a loaded machine is long)
  EXPECT_EQ(mf_comm_wait_until(c, Probe::done, &soon, "a test's work"), MF_OK) << mf_last_error();
  EXPECT_EQ(soon.polls, 460);
  Probe fails;
  fails.after = 3;
  fails.fault = MF_ERR_UNSUPPORTED;
  EXPECT_EQ(mf_comm_wait_until(c, Probe::done, &fails, "a test's work"), MF_ERR_UNSUPPORTED);
  Probe never;
  const double t0 = now_s();
  EXPECT_EQ(mf_comm_wait_until(c, Probe::done, &never, "a test's work"), MF_ERR_MPI);
  const double waited = now_s() - t0;
  EXPECT_GE(waited, 0.5);
  EXPECT_LT(waited, 5.0);
  EXPECT_TRUE(has(mf_last_error(),
                  "waited 0.5 s for a test's work: another rank stopped or hangs "
                  "(MF_COMM_TIMEOUT_S)"))
      << mf_last_error();
  ASSERT_EQ(mf_comm_barrier(g_comm), MF_OK);
  mf_comm_free(c);
}

// Rank 0 stops every other rank for 2 s while they wait at a barrier (1.5 s
// timeout) and comes to it 0.3 s after continuing them: the time they were
// stopped is not the others' delay, so nobody times out.
TEST(CommDeadline, TheWaitersOwnStopDoesNotCount) {
  const std::vector<int64_t> pid = pids();
  mf_comm *c = comm_with_timeout("1.5");
  ASSERT_NE(c, nullptr);
  const int rank = mf_comm_rank(c), size = mf_comm_size(c);
  ASSERT_EQ(mf_comm_barrier(g_comm), MF_OK);
  if (rank == 0) {
    usleep(200000);  // the others are waiting in the barrier by now
    for (int r = 1; r < size; r++) kill((pid_t)pid[(size_t)r], SIGSTOP);
    usleep(2000000);
    for (int r = 1; r < size; r++) kill((pid_t)pid[(size_t)r], SIGCONT);
    usleep(300000);
  }
  EXPECT_EQ(mf_comm_barrier(c), MF_OK) << mf_last_error();
  ASSERT_EQ(mf_comm_barrier(g_comm), MF_OK);
  mf_comm_free(c);
}

int relaunch_under_mpirun(int argc, char **argv) {
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return 1;
  self[n] = 0;
  char tmpl[] = "/tmp/mpitest.XXXXXX";
  if (!mkdtemp(tmpl)) return 1;
  setenv("TMPDIR", tmpl, 1);
  // Open MPI's own allocations live until exit; tests/lsan.supp names its
  // libraries, which only matches with full (slow) stacks: MPI tests alone.
  const char *lsan = getenv("LSAN_OPTIONS");
  std::string lsan_opts =
      std::string(lsan ? lsan : "") + (lsan && *lsan ? ":" : "") + "fast_unwind_on_malloc=0";
  setenv("LSAN_OPTIONS", lsan_opts.c_str(), 1);
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  const std::string np = std::to_string(env_int("MF_COMM_TEST_NP", 2));
  std::vector<std::string> args = {"mpirun",
                                   "-np",
                                   np,
                                   "--oversubscribe",
                                   "--mca",
                                   "pml",
                                   "ob1",
                                   "--mca",
                                   "btl",
                                   "self,vader",
                                   "--mca",
                                   "btl_vader_single_copy_mechanism",
                                   "none",
                                   "--mca",
                                   "btl_vader_backing_directory",
                                   tmpl,
                                   self};
  for (int i = 1; i < argc; i++) args.push_back(argv[i]);
  pid_t pid = fork();
  if (pid == 0) {
    std::vector<char *> cargv;
    for (auto &a : args) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    execvp("mpirun", cargv.data());
    perror("execvp mpirun");
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  std::string rm = std::string("rm -rf ") + tmpl;
  if (system(rm.c_str()) != 0) fprintf(stderr, "could not remove %s\n", tmpl);
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  fprintf(stderr, "mpirun ended by signal %d\n", WTERMSIG(status));
  return 1;
}

}  // namespace

int main(int argc, char **argv) {
  if (!getenv("OMPI_COMM_WORLD_SIZE")) return relaunch_under_mpirun(argc, argv);
  if (mf_comm_init(&argc, &argv, &g_comm) != MF_OK) {
    fprintf(stderr, "comm init: %s\n", mf_last_error());
    return 1;
  }
  if (mf_comm_rank(g_comm) != 0) {
    unsetenv("XML_OUTPUT_FILE");
    unsetenv("GTEST_OUTPUT");
    unsetenv("TEST_PREMATURE_EXIT_FILE");
    unsetenv("TEST_SHARD_STATUS_FILE");
  }
  // gtest read XML_OUTPUT_FILE into its output flag during static
  // initialisation, and InitGoogleTest installs the XML writer from the flag:
  // clear it first on the other ranks, or they race rank 0 for Bazel's file.
  if (mf_comm_rank(g_comm) != 0) GTEST_FLAG_SET(output, "");
  ::testing::InitGoogleTest(&argc, argv);
  int64_t failed = RUN_ALL_TESTS() != 0;
  mf_comm_allreduce_max_i64(g_comm, &failed, 1);
  mf_comm_free(g_comm);
  return failed ? 1 : 0;
}
