// The binomial tree's all-gather (collectives/tree_gather.h) and the TCP transport
// that connects pair by pair (TcpOptions::connect_all = false, TcpTransport::Reach):
// records gathered in rank order on every rank, each rank connected only to its tree
// neighbours, at 1,024 ranks over in-process and TCP transports; a send to a rank
// not reached fails naming it; an abort reaches ranks it has no connection to.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <atomic>
#include <cstdio>
#include <bit>
#include <cstring>
#include <map>
#include <set>
#include <thread>

#include "collectives/transport/in_process_transport.h"
#include "collectives/transport/tcp/tcp_transport.h"
#include "collectives/tree_gather.h"
#include "tests/unit/forwarding_transport.h"

namespace tessera::collectives {
namespace {

using namespace std::chrono_literals;

Deadline In(std::chrono::milliseconds d) { return Clock::now() + d; }

int Log2Ceil(int n) { return n <= 1 ? 0 : std::bit_width(static_cast<unsigned>(n - 1)); }

// The record rank r brings: three values only it has.
std::vector<int64_t> Record(int r) { return {r, r * 7 + 1, -static_cast<int64_t>(r)}; }

void ExpectGathered(const std::vector<int64_t>& all, int n, int on) {
  ASSERT_EQ(all.size(), static_cast<size_t>(n) * 3) << "on rank " << on;
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(std::vector<int64_t>(all.begin() + r * 3, all.begin() + r * 3 + 3), Record(r))
        << "rank " << r << "'s record on rank " << on;
  }
}

// Every rank's TreeAllGather of its Record, each on a thread of its own.
template <typename T>
std::vector<Result<std::vector<int64_t>>> GatherOnEveryRank(std::vector<std::unique_ptr<T>>& group,
                                                            std::chrono::milliseconds within) {
  const int n = static_cast<int>(group.size());
  std::vector<std::thread> threads;
  std::vector<Result<std::vector<int64_t>>> got(n, Internal("not run"));
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      const std::vector<int64_t> mine = Record(r);
      got[r] = TreeAllGather(*group[r], std::span<const int64_t>(mine), In(within));
    });
  }
  for (auto& t : threads) t.join();
  return got;
}

// Counts the peers each rank sends to or receives from, over any transport.
class Counting final : public ForwardingTransport {
 public:
  using ForwardingTransport::ForwardingTransport;
  Status Send(int peer, std::span<const ConstBytes> parts, Deadline d) override {
    peers_.insert(peer);
    return ForwardingTransport::Send(peer, parts, d);
  }
  using Transport::Send;
  Status Recv(int peer, Buffer* m, Deadline d) override {
    peers_.insert(peer);
    return ForwardingTransport::Recv(peer, m, d);
  }
  Status RecvInto(int peer, std::span<uint8_t> dst, Deadline d) override {
    peers_.insert(peer);
    return ForwardingTransport::RecvInto(peer, dst, d);
  }
  const std::set<int>& peers() const { return peers_; }

 private:
  std::set<int> peers_;
};

TEST(TreeNeighbours, FormOneTreeWithFewNeighboursEach) {
  for (int n : {1, 2, 3, 5, 8, 13, 64, 100, 255, 256, 257, 1000, 1024, 1025, 4096}) {
    std::map<int, std::set<int>> edges;
    for (int r = 0; r < n; ++r) {
      const std::vector<int> near = TreeNeighbours(r, n);
      EXPECT_LE(near.size(), static_cast<size_t>(Log2Ceil(n) + 1)) << "rank " << r << " of " << n;
      for (int j : near) {
        ASSERT_TRUE(j >= 0 && j < n && j != r) << j;
        edges[r].insert(j);
      }
      if (r > 0) {
        EXPECT_LT(near.front(), r) << "the parent of " << r << " comes first";
      }
    }
    size_t count = 0;
    for (const auto& [r, set] : edges) {
      for (int j : set) EXPECT_EQ(edges[j].count(r), 1u) << r << "-" << j << " of " << n << " one way";
      count += set.size();
    }
    EXPECT_EQ(count, static_cast<size_t>(2 * (n - 1))) << "a tree over " << n << " ranks";
  }
}

TEST(TreeAllGather, GathersEveryRecordInRankOrderAt1024InProcessRanks) {
  for (int n : {1, 2, 7, 64, 1024}) {
    auto group = InProcessTransport::CreateGroup(n);
    std::vector<std::unique_ptr<Counting>> counted;
    for (auto& t : group) counted.push_back(std::make_unique<Counting>(std::move(t)));
    auto got = GatherOnEveryRank(counted, 60s);
    for (int r = 0; r < n; ++r) {
      ASSERT_TRUE(got[r].ok()) << "rank " << r << " of " << n << ": " << got[r].status().ToString();
      ExpectGathered(*got[r], n, r);
      const std::vector<int> near = TreeNeighbours(r, n);
      EXPECT_EQ(counted[r]->peers(), std::set<int>(near.begin(), near.end())) << "rank " << r << " of " << n;
    }
  }
}

// n ranks, each with its own listener, joined without their full mesh.
std::vector<std::unique_ptr<TcpTransport>> SparseGroup(int n, const std::string& id) {
  std::vector<std::unique_ptr<TcpListener>> listeners;
  std::vector<std::string> addresses;
  for (int r = 0; r < n; ++r) {
    auto l = TcpListener::Bind("127.0.0.1", 0);
    EXPECT_TRUE(l.ok()) << l.status().ToString();
    if (!l.ok()) return {};
    addresses.push_back((*l)->address());
    listeners.push_back(std::move(l).value());
  }
  std::vector<std::unique_ptr<TcpTransport>> group;
  for (int r = 0; r < n; ++r) {
    TcpOptions o{.rank = r, .size = n, .group_id = id, .connect_timeout = 30s};
    o.connect_all = false;
    auto t = TcpTransport::Connect(std::move(listeners[r]), addresses, o);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    if (!t.ok()) return {};
    group.push_back(std::move(t).value());
  }
  return group;
}

// 1,024 threads with their sockets outgrow ThreadSanitizer's memory on a small machine:
// its build checks the same code at 128 ranks.
#if defined(__SANITIZE_THREAD__)
constexpr int kTcpRanks = 128;
#else
constexpr int kTcpRanks = 1024;
#endif

// Each rank holds a listener and both ends of its tree connections in this process:
// about 3 descriptors a rank. The soft limit is raised to the hard one (as the worker
// does); a hard limit too low for kTcpRanks halves the ranks, and says so.
int TcpRanksThisProcessCanHold() {
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) != 0) return kTcpRanks;
  if (files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    (void)setrlimit(RLIMIT_NOFILE, &files);
    (void)getrlimit(RLIMIT_NOFILE, &files);
  }
  int n = kTcpRanks;
  while (n > 64 && static_cast<rlim_t>(4 * n + 256) > files.rlim_cur) n /= 2;
  if (n < kTcpRanks) std::printf("open-file limit %llu: %d ranks\n", static_cast<unsigned long long>(files.rlim_cur), n);
  return n;
}

TEST(SparseTcp, TreeAllGatherAt1024RanksConnectsOnlyTheTree) {
  const int n = TcpRanksThisProcessCanHold();
  auto group = SparseGroup(n, "tree-1024");
  ASSERT_EQ(group.size(), static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) EXPECT_FALSE(group[r]->Reached((r + 1) % n)) << "joined with no connection";
  auto got = GatherOnEveryRank(group, 120s);
  size_t connections = 0;
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(got[r].ok()) << "rank " << r << ": " << got[r].status().ToString();
    ExpectGathered(*got[r], n, r);
    const std::vector<int> near = TreeNeighbours(r, n);
    for (int j = 0; j < n; ++j) {
      if (j == r) continue;
      const bool tree = std::find(near.begin(), near.end(), j) != near.end();
      ASSERT_EQ(group[r]->Reached(j), tree) << "rank " << r << " to rank " << j;
      connections += tree ? 1 : 0;
    }
  }
  // n - 1 connections (two ends each): 1,023 where the full mesh has 523,776.
  EXPECT_EQ(connections, static_cast<size_t>(2 * (n - 1)));
}

TEST(SparseTcp, ReachConnectsPairsAndRefusesARankNotReached) {
  auto group = SparseGroup(4, "pairs");
  ASSERT_EQ(group.size(), 4u);
  // 0-2 and 1-3, asked for on both sides, in any order.
  std::vector<std::thread> threads;
  std::vector<Status> reached(4);
  const std::vector<std::vector<int>> want = {{2}, {3}, {0}, {1}};
  for (int r = 0; r < 4; ++r) {
    threads.emplace_back([&, r] { reached[r] = group[r]->Reach(want[r], In(20s)); });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 4; ++r) ASSERT_TRUE(reached[r].ok()) << r << ": " << reached[r].ToString();
  const uint8_t byte = 42;
  ASSERT_TRUE(group[2]->Send(0, ConstBytes(&byte, 1), In(5s)).ok());
  Buffer got;
  ASSERT_TRUE(group[0]->Recv(2, &got, In(5s)).ok());
  EXPECT_EQ(got.size(), 1u);
  // Reaching a rank reached already costs nothing.
  EXPECT_TRUE(group[0]->Reach(std::vector<int>{2}, In(1s)).ok());
  Status st = group[1]->Send(2, ConstBytes(&byte, 1), In(5s));
  EXPECT_EQ(st.code(), Code::kInternal) << st.ToString();
  EXPECT_NE(st.message().find("has not reached rank 2"), std::string::npos) << st.ToString();
  st = group[3]->Recv(0, &got, In(5s));
  EXPECT_NE(st.message().find("has not reached rank 0"), std::string::npos) << st.ToString();
  // A rank that never asks is named when the wait ends.
  st = group[1]->Reach(std::vector<int>{2}, In(300ms));
  EXPECT_EQ(st.code(), Code::kDeadlineExceeded) << st.ToString();
  EXPECT_NE(st.message().find("2"), std::string::npos) << st.ToString();
}

TEST(SparseTcp, AnAbortReachesRanksWithNoConnectionToTheAborter) {
  const int n = 16;
  auto group = SparseGroup(n, "relay");
  ASSERT_EQ(group.size(), static_cast<size_t>(n));
  // Every rank but the last enters the gather; the last reaches its tree neighbours and
  // aborts instead. Each rank whose gather fails aborts the group as its users do
  // (worker/memory_channel.cc), which relays the abort to its neighbours: rank 14 to
  // rank 12, and so on up the tree and down again. Every rank fails with the abort,
  // naming rank 15, long before the gather's deadline.
  std::vector<std::thread> threads;
  std::vector<Status> got(n);
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      if (r == n - 1) {
        const std::vector<int> near = TreeNeighbours(r, n);
        got[r] = group[r]->Reach(near, In(20s));
        group[r]->Abort(ResourceExhausted("rank 15 ran out of memory"));
        return;
      }
      const std::vector<int64_t> mine = Record(r);
      auto all = TreeAllGather(*group[r], std::span<const int64_t>(mine), In(120s));
      got[r] = all.status();
      if (!all.ok()) group[r]->Abort(all.status());
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(got[n - 1].ok()) << got[n - 1].ToString();
  for (int r = 0; r + 1 < n; ++r) {
    EXPECT_EQ(got[r].code(), Code::kResourceExhausted) << "rank " << r << ": " << got[r].ToString();
    EXPECT_NE(got[r].message().find("rank 15 ran out of memory"), std::string::npos) << got[r].ToString();
    EXPECT_EQ(got[r].details().value("aborted_by", -1), 15) << "rank " << r << ": " << got[r].ToString();
  }
}

}  // namespace
}  // namespace tessera::collectives
