// The memory tier's channel with "workers" in one process over real TCP: a mesh's
// group has one owner at a time (a call waits for the lease, never for a lock held
// across the exchange), and the next call reuses the group it hands back; a mesh
// larger than full_mesh_max connects only the pairs its exchanges use.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>

#include "collectives/collectives.h"
#include "collectives/transport/tcp/tcp_transport.h"
#include "collectives/tree_gather.h"
#include "worker/memory_channel.h"

namespace tessera::worker {
namespace {

struct Pair {
  std::vector<std::unique_ptr<collectives::TcpAcceptor>> acceptors;
  std::vector<std::string> addresses;
  std::vector<std::unique_ptr<MemoryChannel>> channels;
  std::vector<MeshPlacement> placements;

  explicit Pair(int n = 2, size_t full_mesh_max = MemoryChannel::kDefaultFullMeshMax) {
    const Mesh mesh{"m", {{"data", n}}, 1};
    std::vector<std::string> workers;
    for (int r = 0; r < n; ++r) {
      auto a = collectives::TcpAcceptor::Start(collectives::TcpListener::Bind("127.0.0.1", 0).value(),
                                               collectives::DataPortKey{});
      addresses.push_back((*a)->address());
      acceptors.push_back(std::move(*a));
      workers.push_back("w-" + std::to_string(r));
    }
    for (int r = 0; r < n; ++r) {
      channels.push_back(std::make_unique<MemoryChannel>(
          acceptors[r].get(), [this](const MeshPlacement&) { return addresses; }, full_mesh_max));
      placements.push_back(MeshPlacement{mesh, r, {r}, workers});
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

TEST(MemoryChannel, AMeshPastTheFullMeshMaxConnectsOnlyWhatItsCallsUse) {
  constexpr int kWorkers = 12;
  Pair w(kWorkers, /*full_mesh_max=*/8);
  std::vector<std::thread> threads;
  std::vector<Status> results(kWorkers);
  std::vector<std::vector<int>> reached(kWorkers);
  for (int r = 0; r < kWorkers; ++r) {
    threads.emplace_back([&, r] {
      for (int call = 0; call < 2 && results[r].ok(); ++call) {
        results[r] = w.channels[r]->With(
            w.placements[r], std::chrono::seconds(30), "test",
            [&](collectives::Group& group, const std::vector<std::string>&) -> Status {
              const int64_t mine = r * 10 + call;
              auto all = collectives::TreeAllGather(group.transport(), std::span<const int64_t>(&mine, 1),
                                                    collectives::Clock::now() + std::chrono::seconds(30));
              if (!all.ok()) return all.status();
              for (int j = 0; j < kWorkers; ++j) {
                if ((*all)[j] != j * 10 + call) return Internal("rank " + std::to_string(j) + "'s value is wrong");
              }
              reached[r].clear();
              for (int j = 0; j < kWorkers; ++j) {
                if (j != r && group.transport().Reached(j)) reached[r].push_back(j);
              }
              return Status::Ok();
            });
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kWorkers; ++r) {
    ASSERT_TRUE(results[r].ok()) << "worker " << r << ": " << results[r].ToString();
    std::vector<int> tree = collectives::TreeNeighbours(r, kWorkers);
    std::sort(tree.begin(), tree.end());
    EXPECT_EQ(reached[r], tree) << "worker " << r;
  }
}

}  // namespace
}  // namespace tessera::worker
