// TcpTransport: the mesh handshake (and the proof of the key that comes with it),
// framing, the wire format, and how a peer's goodbye, abort or death reaches the
// other ranks. Ops over TCP are covered by collectives_test.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <chrono>
#include <cstring>
#include <functional>
#include <random>
#include <thread>

#include "collectives/transport/tcp/auth.h"
#include "collectives/collectives.h"
#include "collectives/local_mesh.h"
#include "collectives/transport/tcp/tcp_handshake.h"
#include "collectives/transport/tcp/tcp_transport.h"
#include "collectives/transport/tcp/tcp_wire.h"
#include "eventually.h"

namespace tessera::collectives {
namespace {

using namespace std::chrono_literals;

using tessera::testing::Eventually;

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

// Rank r of a group of `size` over `l`, group id "g".
Result<std::unique_ptr<TcpTransport>> Join(Listeners& l, int r, int size) {
  return TcpTransport::Connect(std::move(l.listeners[r]), l.addresses,
                               {.rank = r, .size = size, .group_id = "g", .connect_timeout = 10s});
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
  const uint64_t retries = ConnectRetries();
  std::thread late([&] {
    auto t = TcpTransport::Connect(std::move(one).value(), addresses,
                                   {.rank = 1, .size = 2, .group_id = "g", .connect_timeout = 5s});
    rank1 = t.status();
  });
  // Rank 1 has been refused and is retrying before rank 0 listens.
  ASSERT_TRUE(Eventually([&] { return ConnectRetries() > retries; }));
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
    // Send everything first: a sender waiting for room reads what its peer
    // sent meanwhile, so this cannot deadlock even though both sides send
    // before receiving.
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

TEST(TcpTransport, PollReadsAnAbortThatCameWhileIdle) {
  // No thread of rank 0 is inside a call when rank 1 aborts; Poll (which every
  // collective and every reuse of a group begins with) must see it, or rank 0
  // would run its next call on the stale messages queued before the abort.
  auto mesh = Mesh(2);
  ASSERT_EQ(mesh.size(), 2u);
  const uint8_t stale = 1;
  ASSERT_TRUE(mesh[1]->Send(0, ConstBytes(&stale, 1), In(1s)).ok());
  mesh[1]->Abort(DataLoss("checksum mismatch"));
  Status st = mesh[0]->Poll();
  EXPECT_EQ(st.code(), Code::kDataLoss) << st.ToString();
  EXPECT_EQ(Detail(st, "aborted_by"), 1);
}

// Pins `thread` to `cpu`.
bool PinTo(pthread_t thread, int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(thread, sizeof(set), &set) == 0;
}

// A receiver that shares its CPU with a busy thread, in a call bound by latency,
// stops spinning at its first yield (which runs the busy thread) and sleeps in
// poll, even with a spin of 10 s: on a shared CPU, spinning only takes turns
// from the threads it waits for. Without that, the whole 100 ms wait would be
// spent spinning (no sleep counted), as it is for bulk transfers.
void ReceiveOnASharedCpu(bool latency_bound, TcpTransport::WaitStats* stats) {
  Listeners l = BindLoopback(2);
  std::unique_ptr<TcpTransport> sender;
  std::thread joiner([&] {
    auto t = Join(l, 1, 2);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    sender = std::move(t).value();
  });
  auto receiver = TcpTransport::Connect(std::move(l.listeners[0]), l.addresses,
                                        {.rank = 0, .size = 2, .group_id = "g",
                                         .connect_timeout = 10s, .spin = 10s});
  joiner.join();
  ASSERT_TRUE(receiver.ok()) << receiver.status().ToString();
  ASSERT_NE(sender, nullptr);
  (*receiver)->SetLatencyBound(latency_bound);

  const int cpu = sched_getcpu();
  ASSERT_GE(cpu, 0);
  std::atomic<bool> busy_running{false}, stop{false};
  std::thread busy([&] {
    busy_running = true;
    while (!stop.load(std::memory_order_relaxed)) {
    }
  });
  const bool pinned = PinTo(busy.native_handle(), cpu);
  while (!busy_running.load()) std::this_thread::yield();
  // The message comes once the receiver waits: spinning (bulk), or past its
  // spin, asleep in poll (bound by latency).
  std::thread late_sender([&] {
    EXPECT_TRUE(Eventually([&] {
      const TcpTransport::WaitStats w = (*receiver)->wait_stats();
      return latency_bound ? w.sleeps >= 1 : w.waits >= 1;
    }));
    const uint8_t byte = 5;
    EXPECT_TRUE(sender->Send(0, ConstBytes(&byte, 1), In(5s)).ok());
  });
  Status st = Internal("the receiving thread could not be pinned");
  Buffer message;
  std::thread waiter([&] {
    if (PinTo(pthread_self(), cpu)) st = (*receiver)->Recv(1, &message, In(5s));
  });
  waiter.join();
  stop = true;
  busy.join();
  late_sender.join();
  ASSERT_TRUE(pinned);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_EQ(message.size(), 1u);
  EXPECT_EQ(message.data()[0], 5);
  *stats = (*receiver)->wait_stats();
}

TEST(TcpTransport, AReceiverOnASharedCpuSleepsInsteadOfSpinningInCallsBoundByLatency) {
  TcpTransport::WaitStats stats;
  ASSERT_NO_FATAL_FAILURE(ReceiveOnASharedCpu(true, &stats));
  EXPECT_EQ(stats.waits, 1u);
  EXPECT_GE(stats.spins_cut, 1u);
  EXPECT_EQ(stats.sleeps, 1u);
}

TEST(TcpTransport, AReceiverOfBulkDataSpinsOnASharedCpu) {
  TcpTransport::WaitStats stats;
  ASSERT_NO_FATAL_FAILURE(ReceiveOnASharedCpu(false, &stats));
  EXPECT_EQ(stats.waits, 1u);
  EXPECT_EQ(stats.spins_cut, 0u);
  EXPECT_EQ(stats.sleeps, 0u);
}

// A broadcast of 4 MiB or more goes by scatter and all-gather, so every rank
// waits on every other one in the middle of the call. Rank 3 (a child process)
// is killed while the others broadcast 16 MiB again and again: each of them
// fails at once, naming rank 3, and none waits for its timeout.
TEST(TcpTransport, APeerThatDiesMidScatterBroadcastIsNamed) {
  constexpr int64_t kCount = 4 << 20;  // 16 MiB of float32
  Listeners l = BindLoopback(4);
  std::fflush(nullptr);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    for (int r = 0; r < 3; ++r) l.listeners[r].reset();
    auto t = Join(l, 3, 4);
    if (!t.ok()) ::_exit(1);
    Group group(std::move(t).value(), "g");
    Tensor x = Tensor::Zeros(DType::kFloat32, {kCount});
    BroadcastOptions o;
    o.timeout = 60s;
    while (Broadcast(group, x, o).ok()) {
    }
    ::_exit(2);
  }
  l.listeners[3].reset();
  std::atomic<int> done{0};  // broadcasts rank 0 finished
  std::thread killer([&] {
    EXPECT_TRUE(Eventually([&] { return done.load() >= 2; }));
    ::kill(child, SIGKILL);
  });
  std::vector<Status> st(3);
  RunRanks(3, [&](int r) {
    auto t = Join(l, r, 4);
    if (!t.ok()) {
      st[r] = t.status();
      return;
    }
    Group group(std::move(t).value(), "g");
    Tensor x = Tensor::Zeros(DType::kFloat32, {kCount});
    BroadcastOptions o;
    o.timeout = 60s;
    for (int i = 0; i < 100000 && st[r].ok(); ++i) {
      st[r] = Broadcast(group, x, o);
      if (st[r].ok() && r == 0) ++done;
    }
  });
  killer.join();
  int wstatus = 0;
  ASSERT_EQ(::waitpid(child, &wstatus, 0), child);
  EXPECT_TRUE(WIFSIGNALED(wstatus)) << wstatus;
  EXPECT_GE(done.load(), 2);
  for (const Status& s : st) {  // a rank that waited for its timeout says deadline_exceeded
    EXPECT_EQ(s.code(), Code::kUnavailable) << s.ToString();
    EXPECT_NE(s.message().find("rank 3"), std::string::npos) << s.message();
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
    auto t = Join(l, 2, 3);
    if (!t.ok()) ::_exit(1);
    Group group(std::move(t).value(), "g");
    ::_exit(Barrier(group).ok() ? 0 : 2);
  }
  l.listeners[2].reset();
  std::vector<Status> st(2);
  RunRanks(2, [&](int r) {
    auto t = Join(l, r, 3);
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
    st[r] = AllReduce(group, x, o);
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

TEST(TcpTransport, APostedReceiveLandsInPlaceAndACancelledOneIsQueued) {
  auto mesh = Mesh(2);
  ASSERT_EQ(mesh.size(), 2u);
  const uint8_t first[] = {1, 2, 3, 4, 5}, second[] = {6, 7, 8, 9, 10};
  uint8_t place[5] = {};
  mesh[0]->PostRecv(1, place);
  ASSERT_TRUE(mesh[1]->Send(0, ConstBytes(first, 5), In(1s)).ok());
  ASSERT_TRUE(mesh[0]->RecvInto(1, place, In(5s)).ok());
  EXPECT_TRUE(std::equal(place, place + 5, first));
  // Withdrawn before the bytes come: they are an ordinary queued message, and
  // the memory that was posted is left alone.
  uint8_t withdrawn[5] = {};
  mesh[0]->PostRecv(1, withdrawn);
  mesh[0]->CancelRecv(1);
  ASSERT_TRUE(mesh[1]->Send(0, ConstBytes(second, 5), In(1s)).ok());
  Buffer message;
  ASSERT_TRUE(mesh[0]->Recv(1, &message, In(5s)).ok());
  ASSERT_EQ(message.size(), 5u);
  EXPECT_TRUE(std::equal(message.data(), message.data() + 5, second));
  EXPECT_TRUE(std::all_of(withdrawn, withdrawn + 5, [](uint8_t b) { return b == 0; }));
  EXPECT_TRUE(mesh[0]->status().ok());
}

TEST(TcpTransport, APostedReceiveFilledWhileWaitingElsewhereComesBeforeLaterMessages) {
  // Rank 0 posts a receive from rank 1, then waits for rank 2: meanwhile it
  // reads rank 1's two messages, the first into the posted memory and the
  // second into the queue. RecvInto must return the first (it once took the
  // queued second), and Recv the second.
  auto mesh = Mesh(3);
  ASSERT_EQ(mesh.size(), 3u);
  const uint8_t m1[] = {1, 1, 1, 1}, m2[] = {2, 2, 2, 2}, x[] = {3};
  uint8_t place[4] = {};
  mesh[0]->PostRecv(1, place);
  ASSERT_TRUE(mesh[1]->Send(0, ConstBytes(m1, 4), In(1s)).ok());
  ASSERT_TRUE(mesh[1]->Send(0, ConstBytes(m2, 4), In(1s)).ok());
  ASSERT_TRUE(mesh[2]->Send(0, ConstBytes(x, 1), In(1s)).ok());
  Buffer message;
  ASSERT_TRUE(mesh[0]->Recv(2, &message, In(5s)).ok());
  ASSERT_TRUE(mesh[0]->RecvInto(1, place, In(5s)).ok());
  EXPECT_TRUE(std::equal(place, place + 4, m1));
  ASSERT_TRUE(mesh[0]->Recv(1, &message, In(5s)).ok());
  ASSERT_EQ(message.size(), 4u);
  EXPECT_TRUE(std::equal(message.data(), message.data() + 4, m2));
}

TEST(TcpTransport, RecvIntoAMessageOfAnotherSizeIsAProtocolErrorNamingThePeer) {
  auto mesh = Mesh(2);
  ASSERT_EQ(mesh.size(), 2u);
  const uint8_t seven[7] = {};
  uint8_t place[5] = {};
  mesh[0]->PostRecv(1, place);
  ASSERT_TRUE(mesh[1]->Send(0, ConstBytes(seven, 7), In(1s)).ok());
  Status st = mesh[0]->RecvInto(1, place, In(5s));
  EXPECT_EQ(st.code(), Code::kInternal) << st.ToString();
  EXPECT_NE(st.message().find("expected a message of 5 bytes from rank 1, got 7"),
            std::string::npos)
      << st.message();
  EXPECT_EQ(Detail(st, "peer_rank"), 1);
  EXPECT_FALSE(mesh[0]->status().ok());  // poisoned: the stream cannot be trusted
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

// ---- The data port's handshake: only peers that know the key join ----

DataPortKey KeyOf(const std::string& token) {
  auto key = DeriveDataPortKey(token);
  EXPECT_TRUE(key.ok()) << key.status().ToString();
  return key.ok() ? *key : DataPortKey{};
}

struct Acceptors {
  std::vector<std::unique_ptr<TcpAcceptor>> acceptors;
  std::vector<std::string> addresses;
};

// One data port per key, in rank order.
Acceptors StartAcceptors(const std::vector<DataPortKey>& keys) {
  Acceptors a;
  for (const DataPortKey& key : keys) {
    auto listener = TcpListener::Bind("127.0.0.1", 0);
    EXPECT_TRUE(listener.ok()) << listener.status().ToString();
    auto acceptor = TcpAcceptor::Start(std::move(listener).value(), key);
    EXPECT_TRUE(acceptor.ok()) << acceptor.status().ToString();
    a.addresses.push_back((*acceptor)->address());
    a.acceptors.push_back(std::move(acceptor).value());
  }
  return a;
}

// Forms group `id` over every acceptor and sums rank + 1 over it: the status of
// each rank (internal if the sum is wrong).
std::vector<Status> FormAndSum(Acceptors& a, const std::string& id,
                               std::chrono::milliseconds timeout = 10s) {
  const int n = static_cast<int>(a.acceptors.size());
  std::vector<Status> st(n);
  RunRanks(n, [&](int r) {
    auto t = TcpTransport::Connect(
        *a.acceptors[r], a.addresses,
        {.rank = r, .size = n, .group_id = id, .connect_timeout = timeout});
    if (!t.ok()) {
      st[r] = t.status();
      return;
    }
    Group group(std::move(t).value(), id);
    Tensor x = Tensor::Zeros(DType::kInt32, {1});
    x.values<int32_t>()[0] = r + 1;
    st[r] = AllReduce(group, x);
    if (st[r].ok() && x.values<int32_t>()[0] != n * (n + 1) / 2) st[r] = Internal("wrong sum");
  });
  return st;
}

// A plain blocking TCP connection to 127.0.0.1:`port`, as a stranger opens one.
class RawClient {
 public:
  explicit RawClient(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~RawClient() { Close(); }
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  bool connected() const { return connected_; }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  bool Send(const std::string& bytes) {
    return ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
           static_cast<ssize_t>(bytes.size());
  }
  // Exactly n bytes, or what came before the end of the stream or `timeout`.
  std::string Read(size_t n, std::chrono::milliseconds timeout = 5s) {
    std::string out;
    const auto deadline = Clock::now() + timeout;
    while (out.size() < n) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, PollTimeoutMs(deadline)) <= 0) break;
      char buf[4096];
      const ssize_t r = ::recv(fd_, buf, std::min(sizeof(buf), n - out.size()), 0);
      if (r <= 0) break;
      out.append(buf, static_cast<size_t>(r));
    }
    return out;
  }
  // True once the other side closed (end of stream or reset) within `timeout`;
  // whatever came before is dropped.
  bool ClosedWithin(std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    while (true) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, PollTimeoutMs(deadline)) <= 0) return false;
      char buf[4096];
      const ssize_t r = ::recv(fd_, buf, sizeof(buf), 0);
      if (r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN)) return true;
    }
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

// The bytes of a version 1 hello (what peers sent before the handshake).
std::string OldHello(uint32_t from, uint32_t to, uint32_t size, const std::string& group) {
  std::string out;
  for (uint32_t v : {wire::kHelloMagic, 1u, from, to, size, static_cast<uint32_t>(group.size())}) {
    out.append(reinterpret_cast<const char*>(&v), 4);
  }
  return out + group;
}

wire::Hello NewHello(uint32_t from, uint32_t to, uint32_t size, const std::string& group) {
  wire::Hello h{from, to, size, group, {}};
  EXPECT_TRUE(RandomBytes(h.nonce).ok());
  return h;
}

TEST(TcpAuth, KeysAreHkdfSha256OfTheToken) {
  // HMAC-SHA256 itself: RFC 4231 test case 2 (a key shorter than a block is
  // zero-padded, so "Jefe" and "Jefe" followed by zeros are the same key).
  DataPortKey jefe;
  std::memcpy(jefe.bytes.data(), "Jefe", 4);
  const std::string data = "what do ya want for nothing?";
  const ConstBytes part(reinterpret_cast<const uint8_t*>(data.data()), data.size());
  auto mac = HmacSha256(jefe, std::span<const ConstBytes>(&part, 1));
  ASSERT_TRUE(mac.ok());
  const uint8_t want[] = {0x5b, 0xdc, 0xc1, 0x46, 0xbf, 0x60, 0x75, 0x4e, 0x6a, 0x04, 0x24,
                          0x26, 0x08, 0x95, 0x75, 0xc7, 0x5a, 0x00, 0x3f, 0x08, 0x9d, 0x27,
                          0x39, 0x83, 0x9d, 0xec, 0x58, 0xb9, 0x64, 0xec, 0x38, 0x43};
  EXPECT_TRUE(std::equal(mac->begin(), mac->end(), std::begin(want)));

  // HKDF (RFC 5869) without salt: PRK = HMAC(zeros, token); key = HMAC(PRK, info | 0x01).
  for (const std::string token : {"tessera-local-1234", ""}) {
    const ConstBytes ikm(reinterpret_cast<const uint8_t*>(token.data()), token.size());
    auto prk = HmacSha256(DataPortKey{}, std::span<const ConstBytes>(&ikm, 1));
    ASSERT_TRUE(prk.ok());
    DataPortKey prk_key;
    prk_key.bytes = *prk;
    const uint8_t one = 1;
    const ConstBytes expand[] = {
        ConstBytes(reinterpret_cast<const uint8_t*>(kDataPortKeyInfo.data()),
                   kDataPortKeyInfo.size()),
        ConstBytes(&one, 1)};
    auto okm = HmacSha256(prk_key, expand);
    ASSERT_TRUE(okm.ok());
    EXPECT_EQ(KeyOf(token).bytes, *okm) << "token '" << token << "'";
  }
  EXPECT_NE(KeyOf("a").bytes, KeyOf("b").bytes);
  EXPECT_NE(KeyOf("").bytes, DataPortKey{}.bytes);
  EXPECT_TRUE(ConstantTimeEqual(KeyOf("a").bytes, KeyOf("a").bytes));
  EXPECT_FALSE(ConstantTimeEqual(KeyOf("a").bytes, KeyOf("b").bytes));
}

TEST(TcpAuth, AGroupWithTheRightKeyFormsAndAllReduces) {
  const DataPortKey key = KeyOf("cluster token");
  Acceptors a = StartAcceptors({key, key, key});
  for (const Status& st : FormAndSum(a, "g")) EXPECT_TRUE(st.ok()) << st.ToString();
  for (const auto& acceptor : a.acceptors) EXPECT_EQ(acceptor->refused(), 0u);
}

TEST(TcpAuth, AConnectorWithAnotherKeyIsRefusedAndTheGroupStillForms) {
  const DataPortKey key = KeyOf("cluster token");
  Acceptors a = StartAcceptors({key, key});
  const uint64_t refused_before = RefusedConnections();
  // A stranger who knows the group id and the addresses but not the token tries
  // to join as rank 1 (from a listener of its own).
  auto own = TcpListener::Bind("127.0.0.1", 0);
  ASSERT_TRUE(own.ok());
  const std::vector<std::string> addresses = {a.addresses[0], (*own)->address()};
  auto stranger = TcpTransport::Connect(std::move(own).value(), addresses,
                                        {.rank = 1, .size = 2, .group_id = "g",
                                         .connect_timeout = 5s, .key = KeyOf("a guess")});
  ASSERT_FALSE(stranger.ok());
  EXPECT_EQ(stranger.status().code(), Code::kUnauthenticated) << stranger.status().ToString();
  EXPECT_NE(stranger.status().message().find("the data port at " + a.addresses[0] +
                                             " (rank 0) did not prove it knows the cluster secret"),
            std::string::npos)
      << stranger.status().message();
  EXPECT_NE(stranger.status().message().find("rank 1 of group 'g'"), std::string::npos)
      << stranger.status().message();
  EXPECT_EQ(Detail(stranger.status(), "peer_rank"), 0);
  // Rank 0's data port saw it give up without a proof.
  EXPECT_TRUE(Eventually([&] { return a.acceptors[0]->refused() == 1; }))
      << a.acceptors[0]->refused();
  EXPECT_GE(RefusedConnections(), refused_before + 1);
  // The real ranks are not disturbed.
  for (const Status& st : FormAndSum(a, "g")) EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(a.acceptors[0]->refused(), 1u);
  EXPECT_EQ(a.acceptors[1]->refused(), 0u);
}

TEST(TcpAuth, AnAcceptorWithAnotherKeyIsDetectedByTheConnector) {
  // Rank 0's data port was given another token (or is a rogue listener at its
  // address): rank 1 finds out before it proves anything.
  Acceptors a = StartAcceptors({KeyOf("another token"), KeyOf("cluster token")});
  std::vector<Status> st = FormAndSum(a, "g", 1500ms);
  EXPECT_EQ(st[1].code(), Code::kUnauthenticated) << st[1].ToString();
  EXPECT_NE(st[1].message().find("rank 1 of group 'g': the data port at " + a.addresses[0] +
                                 " (rank 0) did not prove it knows the cluster secret"),
            std::string::npos)
      << st[1].message();
  EXPECT_EQ(st[0].code(), Code::kDeadlineExceeded) << st[0].ToString();
  EXPECT_EQ(Detail(st[0], "missing_ranks"), (std::vector<int>{1}));
  EXPECT_EQ(a.acceptors[0]->refused(), 1u);
}

TEST(TcpAuth, RawStrangersAreRefusedAndCounted) {
  const DataPortKey key = KeyOf("cluster token");
  Acceptors a = StartAcceptors({key, key});
  TcpAcceptor& port = *a.acceptors[0];
  uint64_t refused = 0;
  auto expect_refused = [&](RawClient& c, const std::string& what) {
    EXPECT_TRUE(c.ClosedWithin(5s)) << what << ": still open";
    EXPECT_TRUE(Eventually([&] { return port.refused() == refused + 1; }))
        << what << ": " << port.refused() << " refused, want " << refused + 1;
    refused = port.refused();
  };

  {  // A version 1 hello, as every peer sent it before the handshake: it hears why.
    RawClient c(port.port());
    ASSERT_TRUE(c.connected());
    ASSERT_TRUE(c.Send(OldHello(1, 0, 2, "g")));
    const std::string head = c.Read(wire::kReplyHeadBytes);
    ASSERT_EQ(head.size(), wire::kReplyHeadBytes);
    uint32_t reason_len = 0;
    std::memcpy(&reason_len, head.data() + 8, 4);
    auto reply = wire::DecodeReply(wire::AsBytes(head + c.Read(reason_len)));
    ASSERT_TRUE(reply.ok() && reply->value) << reply.status().ToString();
    EXPECT_FALSE(reply->value->accepted);
    EXPECT_NE(reply->value->reason.find("protocol version 2, the connecting peer version 1"),
              std::string::npos)
        << reply->value->reason;
    expect_refused(c, "an old hello");
  }
  {  // Bytes of another protocol.
    RawClient c(port.port());
    ASSERT_TRUE(c.Send("GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
    expect_refused(c, "garbage");
  }
  {  // A hello without the key: its proof is made up.
    RawClient c(port.port());
    ASSERT_TRUE(c.Send(wire::EncodeHello(NewHello(1, 0, 2, "g"))));
    auto challenge = wire::DecodeChallenge(wire::AsBytes(c.Read(wire::kChallengeBytes)));
    ASSERT_TRUE(challenge.ok() && challenge->value) << challenge.status().ToString();
    wire::Proof guess;
    ASSERT_TRUE(RandomBytes(guess.mac).ok());
    ASSERT_TRUE(c.Send(wire::EncodeProof(guess)));
    expect_refused(c, "a made-up proof");
  }
  {  // A hello, then the connection closes instead of a proof.
    RawClient c(port.port());
    ASSERT_TRUE(c.Send(wire::EncodeHello(NewHello(1, 0, 2, "g"))));
    ASSERT_EQ(c.Read(wire::kChallengeBytes).size(), wire::kChallengeBytes);
    c.Close();
    EXPECT_TRUE(Eventually([&] { return port.refused() == refused + 1; })) << "closed";
    refused = port.refused();
  }
  {  // Silence: dropped after the hello timeout, and the data port serves others meanwhile.
    RawClient silent(port.port());
    RawClient half(port.port());  // half a hello, then silence
    ASSERT_TRUE(half.Send(wire::EncodeHello(NewHello(1, 0, 2, "g")).substr(0, 10)));
    ASSERT_TRUE(Eventually([&] { return port.handshaking() == 2; }));
    for (const Status& st : FormAndSum(a, "g")) EXPECT_TRUE(st.ok()) << st.ToString();
    // Neither stranger has been dropped yet (that takes the hello timeout): the mesh
    // formed while their handshakes were pending, not after.
    EXPECT_EQ(port.refused(), refused) << "the handshakes of strangers held the port up";
    EXPECT_TRUE(silent.ClosedWithin(TcpAcceptor::kHelloTimeout + 3s));
    EXPECT_TRUE(half.ClosedWithin(3s));
    EXPECT_TRUE(Eventually([&] { return port.refused() == refused + 2; })) << "silence";
    refused = port.refused();
  }
  EXPECT_EQ(a.acceptors[1]->refused(), 0u);
}

TEST(TcpAuth, AReplayedProofIsRefused) {
  const DataPortKey key = KeyOf("cluster token");
  Acceptors a = StartAcceptors({key});
  TcpAcceptor& port = *a.acceptors[0];
  // An exchange of rank 1 of group "g" with rank 0's data port, done right (this
  // test knows the key), and recorded.
  const wire::Hello hello = NewHello(1, 0, 2, "g");
  const std::string hello_bytes = wire::EncodeHello(hello);
  std::string recorded_proof;
  {
    RawClient c(port.port());
    ASSERT_TRUE(c.Send(hello_bytes));
    auto challenge = wire::DecodeChallenge(wire::AsBytes(c.Read(wire::kChallengeBytes)));
    ASSERT_TRUE(challenge.ok() && challenge->value);
    auto mac_a = wire::HandshakeMac(key, wire::Side::kAcceptor, wire::AsBytes(hello_bytes),
                                    challenge->value->nonce);
    ASSERT_TRUE(mac_a.ok());
    EXPECT_EQ(*mac_a, challenge->value->mac);
    auto mac_c = wire::HandshakeMac(key, wire::Side::kConnector, wire::AsBytes(hello_bytes),
                                    challenge->value->nonce);
    ASSERT_TRUE(mac_c.ok());
    recorded_proof = wire::EncodeProof({*mac_c});
    ASSERT_TRUE(c.Send(recorded_proof));
    // Rank 0 joining group "g" takes it as rank 1.
    std::unique_ptr<TcpTransport> t0;
    std::thread rank0([&] {
      auto t = TcpTransport::Connect(
          port, {a.addresses[0], "127.0.0.1:1"},
          {.rank = 0, .size = 2, .group_id = "g", .connect_timeout = 5s});
      EXPECT_TRUE(t.ok()) << t.status().ToString();
      if (t.ok()) t0 = std::move(t).value();
    });
    const std::string head = c.Read(wire::kReplyHeadBytes);
    rank0.join();
    auto reply = wire::DecodeReply(wire::AsBytes(head));
    ASSERT_TRUE(reply.ok() && reply->value) << reply.status().ToString();
    EXPECT_TRUE(reply->value->accepted);
    EXPECT_EQ(port.refused(), 0u);
  }
  // The same hello and proof again: the data port's challenge has a new nonce.
  RawClient c(port.port());
  ASSERT_TRUE(c.Send(hello_bytes));
  ASSERT_EQ(c.Read(wire::kChallengeBytes).size(), wire::kChallengeBytes);
  ASSERT_TRUE(c.Send(recorded_proof));
  EXPECT_TRUE(c.ClosedWithin(5s));
  EXPECT_TRUE(Eventually([&] { return port.refused() == 1; })) << port.refused();
}

TEST(TcpAuth, AListenerRefusesAStrangerAndStillJoins) {
  // Connect with a listener (forked processes, tests) runs the same handshake.
  const DataPortKey key = KeyOf("cluster token");
  Listeners l = BindLoopback(2);
  const uint64_t refused_before = RefusedConnections();
  const int port = std::stoi(l.addresses[0].substr(l.addresses[0].rfind(':') + 1));
  RawClient stranger(port);
  ASSERT_TRUE(stranger.Send(wire::EncodeHello(NewHello(1, 0, 2, "g"))));
  std::vector<Status> st(2);
  RunRanks(2, [&](int r) {
    // Rank 1's connection queues behind the stranger's, which connected first.
    auto t = TcpTransport::Connect(
        std::move(l.listeners[r]), l.addresses,
        {.rank = r, .size = 2, .group_id = "g", .connect_timeout = 10s, .key = key});
    st[r] = t.status();
  });
  for (const Status& s : st) EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(stranger.ClosedWithin(5s));
  EXPECT_EQ(RefusedConnections(), refused_before + 1);
}

TEST(TcpAuth, RefusalsAreLoggedAtMostOnceASecond) {
  // The second of an earlier test's line is over, and nothing is held back.
  ASSERT_TRUE(Eventually([] { return tcp::RefusalLogIdle(); }));
  const uint64_t lines_before = tcp::RefusalLogLines();
  const DataPortKey key = KeyOf("cluster token");
  Acceptors a = StartAcceptors({key});
  TcpAcceptor& port = *a.acceptors[0];
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 5; ++i) {
    RawClient c(port.port());
    ASSERT_TRUE(c.Send(wire::EncodeHello(NewHello(1, 0, 2, "mesh/x#1\nforged line"))));
    ASSERT_EQ(c.Read(wire::kChallengeBytes).size(), wire::kChallengeBytes);
    ASSERT_TRUE(c.Send(wire::EncodeProof({})));
    EXPECT_TRUE(c.ClosedWithin(5s));
  }
  EXPECT_TRUE(Eventually([&] { return port.refused() == 5; })) << port.refused();
  // The rest are summed up in one line once their second is over.
  EXPECT_TRUE(Eventually([&] { return tcp::RefusalLogLines() == lines_before + 2; }));
  const std::string log = ::testing::internal::GetCapturedStderr();
  std::vector<std::string> lines;
  for (size_t pos = 0, nl; (nl = log.find('\n', pos)) != std::string::npos; pos = nl + 1) {
    lines.push_back(log.substr(pos, nl - pos));
  }
  ASSERT_EQ(lines.size(), 2u) << log;
  EXPECT_NE(lines[0].find("data port " + port.address() + ": refused a connection from 127.0.0.1:"),
            std::string::npos)
      << lines[0];
  // The claimed group, escaped: a stranger cannot write lines of its own.
  EXPECT_NE(lines[0].find("claiming to be rank 1 of group 'mesh/x#1\\x0aforged line'"),
            std::string::npos)
      << lines[0];
  EXPECT_NE(lines[0].find("its proof is wrong"), std::string::npos) << lines[0];
  EXPECT_NE(lines[1].find("4 more connections were refused, not logged"), std::string::npos)
      << lines[1];
}

// ---- The wire format ----

TEST(TcpWire, EveryMessageRoundTripsAndItsPrefixesNeedMore) {
  wire::Hello hello = NewHello(3, 1, 8, "mesh/m#0123456789abcdef");
  wire::Challenge challenge;
  ASSERT_TRUE(RandomBytes(challenge.nonce).ok());
  ASSERT_TRUE(RandomBytes(challenge.mac).ok());
  wire::Proof proof;
  ASSERT_TRUE(RandomBytes(proof.mac).ok());
  const wire::Reply reply{false, "it is in group 'a', this rank in group 'b'"};
  const wire::FrameHeader header{wire::FrameKind::kAbort, 12345};

  auto check = [](const std::string& bytes, auto decode, const auto& want, const char* what) {
    auto whole = decode(wire::AsBytes(bytes + "trailing"));
    ASSERT_TRUE(whole.ok() && whole->value) << what << ": " << whole.status().ToString();
    EXPECT_TRUE(*whole->value == want) << what;
    EXPECT_EQ(whole->length, bytes.size()) << what;
    for (size_t n = 0; n < bytes.size(); ++n) {
      auto part = decode(wire::AsBytes(bytes.substr(0, n)));
      ASSERT_TRUE(part.ok()) << what << " prefix " << n << ": " << part.status().ToString();
      EXPECT_FALSE(part->value) << what << " prefix " << n;
      EXPECT_GT(part->length, n) << what << " prefix " << n;
      EXPECT_LE(part->length, bytes.size()) << what << " prefix " << n;
    }
  };
  check(wire::EncodeHello(hello), &wire::DecodeHello, hello, "hello");
  check(wire::EncodeChallenge(challenge), &wire::DecodeChallenge, challenge, "challenge");
  check(wire::EncodeProof(proof), &wire::DecodeProof, proof, "proof");
  check(wire::EncodeReply(reply), &wire::DecodeReply, reply, "reply");
  check(wire::EncodeFrameHeader(header), &wire::DecodeFrameHeader, header, "frame header");
  EXPECT_EQ(wire::EncodeFrameHeader(header).size(), wire::kFrameHeaderBytes);
}

TEST(TcpWire, DecodersRefuseWhatCannotBeginAMessage) {
  auto field = [](const auto& result) {
    return result.ok() ? std::string("(ok)") : Detail(result.status(), "field").dump();
  };
  std::string hello = wire::EncodeHello(NewHello(1, 0, 2, "g"));
  EXPECT_EQ(field(wire::DecodeHello(wire::AsBytes(std::string("GET / HTTP/1.1")))), "\"magic\"");
  EXPECT_EQ(field(wire::DecodeChallenge(wire::AsBytes(hello))), "\"magic\"");
  EXPECT_EQ(field(wire::DecodeProof(wire::AsBytes(hello))), "\"magic\"");
  EXPECT_EQ(field(wire::DecodeFrameHeader(wire::AsBytes(hello))), "\"magic\"");
  // Another version is named as soon as it is there, whatever follows.
  auto old = wire::DecodeHello(wire::AsBytes(OldHello(1, 0, 2, "g").substr(0, 8)));
  ASSERT_FALSE(old.ok());
  EXPECT_EQ(Detail(old.status(), "peer_version"), 1);
  std::string long_id = hello;
  const uint32_t huge = wire::kMaxGroupIdBytes + 1;
  std::memcpy(long_id.data() + 20, &huge, 4);
  EXPECT_EQ(field(wire::DecodeHello(wire::AsBytes(long_id))), "\"group_id\"");
  std::string reply = wire::EncodeReply({true, ""});
  reply[4] = 7;
  EXPECT_EQ(field(wire::DecodeReply(wire::AsBytes(reply))), "\"accepted\"");
  std::string frame = wire::EncodeFrameHeader({wire::FrameKind::kData, 1});
  frame[4] = 9;
  EXPECT_EQ(field(wire::DecodeFrameHeader(wire::AsBytes(frame))), "\"kind\"");
  frame = wire::EncodeFrameHeader({wire::FrameKind::kData, wire::kMaxFrameBytes + 1});
  EXPECT_EQ(field(wire::DecodeFrameHeader(wire::AsBytes(frame))), "\"length\"");
}

TEST(TcpWire, HandshakeMacsAreBoundToTheHelloTheNonceAndTheSide) {
  const DataPortKey key = KeyOf("cluster token");
  const wire::Hello hello = NewHello(1, 0, 2, "g");
  Nonce nonce{};
  ASSERT_TRUE(RandomBytes(nonce).ok());
  auto mac = [&](const DataPortKey& k, wire::Side side, wire::Hello h, const Nonce& n) {
    auto m = wire::HandshakeMac(k, side, wire::AsBytes(wire::EncodeHello(h)), n);
    EXPECT_TRUE(m.ok());
    return m.ok() ? *m : Mac{};
  };
  const Mac base = mac(key, wire::Side::kConnector, hello, nonce);
  EXPECT_EQ(base, mac(key, wire::Side::kConnector, hello, nonce));
  EXPECT_NE(base, mac(key, wire::Side::kAcceptor, hello, nonce));
  EXPECT_NE(base, mac(KeyOf("another token"), wire::Side::kConnector, hello, nonce));
  Nonce other_nonce = nonce;
  other_nonce[0] ^= 1;
  EXPECT_NE(base, mac(key, wire::Side::kConnector, hello, other_nonce));
  for (auto change : std::vector<std::function<void(wire::Hello&)>>{
           [](wire::Hello& h) { h.group_id = "h"; }, [](wire::Hello& h) { h.from_rank = 2; },
           [](wire::Hello& h) { h.to_rank = 1; }, [](wire::Hello& h) { h.size = 3; },
           [](wire::Hello& h) { h.nonce[31] ^= 1; }}) {
    wire::Hello h = hello;
    change(h);
    EXPECT_NE(base, mac(key, wire::Side::kConnector, h, nonce));
  }
}

}  // namespace
}  // namespace tessera::collectives
