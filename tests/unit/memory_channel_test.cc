// The memory tier's channel with two "workers" in one process over real TCP: a mesh's
// group has one owner at a time (a call waits for the lease, never for a lock held
// across the exchange), and the next call reuses the group it hands back.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>

#include "collectives/collectives.h"
#include "collectives/transport/tcp/tcp_transport.h"
#include "worker/memory_channel.h"

namespace tessera::worker {
namespace {

struct Pair {
  std::vector<std::unique_ptr<collectives::TcpAcceptor>> acceptors;
  std::vector<std::string> addresses;
  std::vector<std::unique_ptr<MemoryChannel>> channels;
  std::vector<MeshPlacement> placements;

  Pair() {
    const Mesh mesh{"m", {{"data", 2}}, 1};
    for (int r = 0; r < 2; ++r) {
      auto a = collectives::TcpAcceptor::Start(collectives::TcpListener::Bind("127.0.0.1", 0).value(),
                                               collectives::DataPortKey{});
      addresses.push_back((*a)->address());
      acceptors.push_back(std::move(*a));
    }
    for (int r = 0; r < 2; ++r) {
      channels.push_back(std::make_unique<MemoryChannel>(
          acceptors[r].get(), [this](const MeshPlacement&) { return addresses; }));
      placements.push_back(MeshPlacement{mesh, r, {r}, {"w-0", "w-1"}});
    }
  }
};

TEST(MemoryChannel, OneCallAtATimeOwnsAMeshsGroupAndTheNextReusesIt) {
  Pair w;
  constexpr int kCalls = 3;
  std::atomic<int> inside[2] = {0, 0};
  std::atomic<int> most[2] = {0, 0};
  std::vector<const collectives::Group*> groups[2];
  std::vector<Status> results[2];
  std::mutex results_mu;
  std::vector<std::thread> threads;
  // Each worker makes kCalls calls at once, from as many threads: they take turns.
  for (int r = 0; r < 2; ++r) {
    for (int c = 0; c < kCalls; ++c) {
      threads.emplace_back([&, r] {
        Status st = w.channels[r]->With(
            w.placements[r], std::chrono::seconds(20), "test",
            [&](collectives::Group& group, const std::vector<std::string>& addresses) -> Status {
              const int now = ++inside[r];
              most[r] = std::max(most[r].load(), now);
              groups[r].push_back(&group);  // one call at a time: no race
              EXPECT_EQ(addresses, w.addresses);
              auto all = collectives::AllGather(group, collectives::Tensor::Zeros(DType::kInt64, {1}));
              --inside[r];
              return all.status();
            });
        std::lock_guard<std::mutex> lock(results_mu);
        results[r].push_back(st);
      });
    }
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(results[r].size(), static_cast<size_t>(kCalls));
    for (const Status& st : results[r]) EXPECT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(most[r].load(), 1);
    ASSERT_EQ(groups[r].size(), static_cast<size_t>(kCalls));
    for (const collectives::Group* g : groups[r]) EXPECT_EQ(g, groups[r][0]) << "joined again";
  }
  EXPECT_EQ(w.channels[0]->in_flight(), 0);
}

}  // namespace
}  // namespace tessera::worker
