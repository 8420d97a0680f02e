// TcpTransport: the mesh handshake, framing, and how a peer's goodbye, abort or
// death reaches the other ranks. Ops over TCP are covered by collectives_test.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "worker/collectives/collectives.h"
#include "worker/collectives/local_mesh.h"
#include "worker/collectives/tcp_transport.h"

namespace tessera::collectives {
namespace {

using namespace std::chrono_literals;

// details[key] of `status`, or null: const operator[] must not see a missing key.
nlohmann::json Detail(const Status& status, const std::string& key) {
  const auto& d = status.details();
  return d.is_object() && d.contains(key) ? d.at(key) : nlohmann::json();
}

struct Listeners {
  std::vector<std::unique_ptr<TcpListener>> listeners;
  std::vector<std::string> addresses;
};

Listeners BindLoopback(int n) {
  Listeners l;
  for (int r = 0; r < n; ++r) {
    auto listener = TcpListener::Bind("127.0.0.1", 0);
    EXPECT_TRUE(listener.ok()) << listener.status().ToString();
    l.addresses.push_back((*listener)->address());
    l.listeners.push_back(std::move(listener).value());
  }
  return l;
}

std::vector<std::unique_ptr<Transport>> Mesh(int n) {
  auto mesh = ConnectLoopbackMesh(n, "tcp-test");
  EXPECT_TRUE(mesh.ok()) << mesh.status().ToString();
  return mesh.ok() ? std::move(mesh).value() : std::vector<std::unique_ptr<Transport>>();
}

Deadline In(std::chrono::milliseconds d) { return Clock::now() + d; }

TEST(TcpListener, BindsPortZeroToAFreePort) {
  auto listener = TcpListener::Bind("127.0.0.1", 0);
  ASSERT_TRUE(listener.ok()) << listener.status().ToString();
  EXPECT_GT((*listener)->port(), 0);
  EXPECT_EQ((*listener)->address(), "127.0.0.1:" + std::to_string((*listener)->port()));
  EXPECT_FALSE(TcpListener::Bind("256.1.1.1", 0).ok());
}

TEST(TcpTransport, RefusesAPeerWithAnotherWorldSizeOnBothSides) {
  Listeners l = BindLoopback(2);
  std::vector<Status> st(2);
  RunRanks(2, [&](int r) {
    std::vector<std::string> addresses = l.addresses;
    if (r == 1) addresses.push_back("127.0.0.1:1");  // rank 1 believes in 3 ranks
    auto t = TcpTransport::Connect(
        std::move(l.listeners[r]), addresses,
        {.rank = r, .size = r == 0 ? 2 : 3, .group_id = "g", .connect_timeout = 5s});
    st[r] = t.status();
  });
  for (const Status& s : st) {
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find("rank 1 has world size 3, rank 0 has world size 2"),
              std::string::npos)
        << s.message();
  }
}

TEST(TcpTransport, RefusesAPeerOfAnotherGroup) {
  Listeners l = BindLoopback(2);
  std::vector<Status> st(2);
  RunRanks(2, [&](int r) {
    auto t = TcpTransport::Connect(
        std::move(l.listeners[r]), l.addresses,
        {.rank = r, .size = 2, .group_id = r == 0 ? "mesh-a" : "mesh-b", .connect_timeout = 5s});
    st[r] = t.status();
  });
  for (const Status& s : st) {
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find("'mesh-a'"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("'mesh-b'"), std::string::npos) << s.message();
  }
}

TEST(TcpTransport, ConnectTimesOutNamingTheRanksThatNeverCame) {
  Listeners l = BindLoopback(4);
  std::vector<Status> st(2);
  RunRanks(2, [&](int r) {  // ranks 2 and 3 never start
    auto t =
        TcpTransport::Connect(std::move(l.listeners[r]), l.addresses,
                              {.rank = r, .size = 4, .group_id = "g", .connect_timeout = 300ms});
    st[r] = t.status();
  });
  for (const Status& s : st) {
    EXPECT_EQ(s.code(), Code::kDeadlineExceeded) << s.ToString();
    EXPECT_EQ(Detail(s, "missing_ranks"), (std::vector<int>{2, 3})) << s.ToString();
  }
}

TEST(TcpTransport, ConnectRetriesUntilTheLowerRankListens) {
  // Rank 1 knows rank 0's address before rank 0 listens: refused connections are
  // retried until the connect timeout.
  auto probe = TcpListener::Bind("127.0.0.1", 0);
  ASSERT_TRUE(probe.ok());
  const int port = (*probe)->port();
  probe->reset();
  auto one = TcpListener::Bind("127.0.0.1", 0);
  ASSERT_TRUE(one.ok());
  const std::vector<std::string> addresses = {"127.0.0.1:" + std::to_string(port),
                                              (*one)->address()};
  Status rank1;
  std::thread late([&] {
    auto t = TcpTransport::Connect(std::move(one).value(), addresses,
                                   {.rank = 1, .size = 2, .group_id = "g", .connect_timeout = 5s});
    rank1 = t.status();
  });
  std::this_thread::sleep_for(200ms);
  auto zero = TcpListener::Bind("127.0.0.1", port);
  ASSERT_TRUE(zero.ok()) << zero.status().ToString();
  auto t0 = TcpTransport::Connect(std::move(zero).value(), addresses,
                                  {.rank = 0, .size = 2, .group_id = "g", .connect_timeout = 5s});
  late.join();
  EXPECT_TRUE(t0.ok()) << t0.status().ToString();
  EXPECT_TRUE(rank1.ok()) << rank1.ToString();
}

TEST(TcpTransport, DeliversManyMessagesOfOddSizesInOrderBothWays) {
  auto mesh = Mesh(2);
  ASSERT_EQ(mesh.size(), 2u);
  constexpr int kMessages = 150;
  auto sizes = [](int seed) {
    std::mt19937 rng(seed);
    std::vector<size_t> s;
    for (int i = 0; i < kMessages; ++i) {
      s.push_back(i % 10 == 0 ? 0 : std::uniform_int_distribution<size_t>(1, 300000)(rng));
    }
    return s;
  };
  auto fill = [](size_t i, size_t n) {
    std::vector<uint8_t> v(n);
    for (size_t k = 0; k < n; ++k) v[k] = static_cast<uint8_t>(k * 31 + i);
    return v;
  };
  RunRanks(2, [&](int r) {
    const int peer = 1 - r;
    // Send everything first: the peer's receiver thread drains it meanwhile, so
    // this cannot deadlock even though both sides send before receiving.
    const auto mine = sizes(r);
    for (size_t i = 0; i < mine.size(); ++i) {
      auto bytes = fill(i, mine[i]);
      const ConstBytes header(reinterpret_cast<const uint8_t*>(&i), sizeof(i));
      const ConstBytes parts[] = {header, bytes};
      ASSERT_TRUE(mesh[r]->Send(peer, parts, In(10s)).ok());
    }
    const auto theirs = sizes(peer);
    Buffer message;
    for (size_t i = 0; i < theirs.size(); ++i) {
      ASSERT_TRUE(mesh[r]->Recv(peer, &message, In(10s)).ok());
      ASSERT_EQ(message.size(), sizeof(i) + theirs[i]);
      size_t index;
      std::memcpy(&index, message.data(), sizeof(index));
      ASSERT_EQ(index, i);
      auto want = fill(i, theirs[i]);
      ASSERT_TRUE(std::equal(want.begin(), want.end(), message.data() + sizeof(i))) << i;
    }
  });
}

TEST(TcpTransport, RecvTimesOutWithoutPoisoning) {
  auto mesh = Mesh(2);
  Buffer message;
  Status st = mesh[0]->Recv(1, &message, In(50ms));
  EXPECT_EQ(st.code(), Code::kDeadlineExceeded);
  EXPECT_TRUE(mesh[0]->status().ok());
  const uint8_t byte = 7;
  ASSERT_TRUE(mesh[1]->Send(0, ConstBytes(&byte, 1), In(1s)).ok());
  EXPECT_TRUE(mesh[0]->Recv(1, &message, In(1s)).ok());
}

TEST(TcpTransport, GoodbyeKeepsQueuedMessagesThenNamesThePeer) {
  auto mesh = Mesh(3);
  const uint8_t byte = 42;
  ASSERT_TRUE(mesh[2]->Send(0, ConstBytes(&byte, 1), In(1s)).ok());
  mesh[2]->Close();
  Buffer message;
  ASSERT_TRUE(mesh[0]->Recv(2, &message, In(1s)).ok());  // sent before the goodbye
  EXPECT_EQ(message.data()[0], 42);
  Status st = mesh[0]->Recv(2, &message, In(5s));
  EXPECT_EQ(st.code(), Code::kUnavailable);
  EXPECT_NE(st.message().find("rank 2 closed its transport"), std::string::npos) << st.message();
  // Sticky: every later call fails with the same error, whichever peer it names.
  EXPECT_EQ(mesh[0]->Send(1, ConstBytes(&byte, 1), In(1s)).message(), st.message());
  // Rank 1 was not using rank 2: it is unaffected until it needs rank 2.
  EXPECT_TRUE(mesh[1]->Send(0, ConstBytes(&byte, 1), In(1s)).ok());
}

TEST(TcpTransport, AbortReachesEveryPeerWithTheReason) {
  auto mesh = Mesh(3);
  mesh[1]->Abort(DataLoss("checksum mismatch in shard 3", {{"file", "shard-3.tsr"}}));
  for (int r : {0, 2}) {
    Buffer message;
    Status st = mesh[r]->Recv(1, &message, In(5s));
    EXPECT_EQ(st.code(), Code::kDataLoss) << st.ToString();
    EXPECT_NE(st.message().find("rank 1 aborted the group: checksum mismatch"), std::string::npos)
        << st.message();
    EXPECT_EQ(Detail(st, "aborted_by"), 1);
    EXPECT_EQ(Detail(st, "file"), "shard-3.tsr");
  }
}

TEST(TcpTransport, APeerProcessThatDiesIsNamed) {
  // Rank 2 is a child process: it joins, takes part in one barrier, then dies
  // without closing anything (as a crash would).
  Listeners l = BindLoopback(3);
  std::fflush(nullptr);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    l.listeners[0].reset();
    l.listeners[1].reset();
    auto t = TcpTransport::Connect(std::move(l.listeners[2]), l.addresses,
                                   {.rank = 2, .size = 3, .group_id = "g", .connect_timeout = 10s});
    if (!t.ok()) ::_exit(1);
    Group group(std::move(t).value(), "g");
    ::_exit(Barrier(group).ok() ? 0 : 2);
  }
  l.listeners[2].reset();
  std::vector<Status> st(2);
  RunRanks(2, [&](int r) {
    auto t = TcpTransport::Connect(std::move(l.listeners[r]), l.addresses,
                                   {.rank = r, .size = 3, .group_id = "g", .connect_timeout = 10s});
    if (!t.ok()) {
      st[r] = t.status();
      return;
    }
    Group group(std::move(t).value(), "g");
    st[r] = Barrier(group);
    if (!st[r].ok()) return;
    Tensor x = Tensor::Zeros(DType::kFloat32, {1000});
    AllReduceOptions o;
    o.timeout = 20s;
    const auto start = Clock::now();
    st[r] = AllReduce(group, x, o);
    EXPECT_LT(Clock::now() - start, 10s);
  });
  int wstatus = 0;
  ASSERT_EQ(::waitpid(child, &wstatus, 0), child);
  EXPECT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << wstatus;
  for (const Status& s : st) {
    EXPECT_EQ(s.code(), Code::kUnavailable) << s.ToString();
    EXPECT_NE(s.message().find("rank 2"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("did the process die?"), std::string::npos) << s.message();
  }
}

TEST(TcpTransport, LargeAllReduceOverTheRing) {
  auto mesh = Mesh(4);
  ASSERT_EQ(mesh.size(), 4u);
  std::vector<std::unique_ptr<Group>> groups;
  for (auto& t : mesh) groups.push_back(std::make_unique<Group>(std::move(t), "big"));
  const int64_t count = 4 << 20;  // 16 MiB of float32
  std::vector<Status> st(4);
  std::vector<Tensor> x(4);
  RunRanks(4, [&](int r) {
    x[r] = Tensor::Zeros(DType::kFloat32, {count});
    for (int64_t i = 0; i < count; ++i) x[r].values<float>()[i] = static_cast<float>(r + i % 7);
    AllReduceOptions o;
    o.timeout = 60s;
    st[r] = AllReduce(*groups[r], x[r], o);
  });
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(st[r].ok()) << st[r].ToString();
    EXPECT_TRUE(x[r] == x[0]);
  }
  for (int64_t i = 0; i < count; i += 4099) {
    ASSERT_EQ(x[0].values<float>()[i], static_cast<float>(6 + 4 * (i % 7))) << i;
  }
}

}  // namespace
}  // namespace tessera::collectives
