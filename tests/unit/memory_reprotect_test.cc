// A rebuilt worker given its redundancy back (Agent::Reprotect): the checkpoint's
// exchange run again with only the rebuilt ranks receiving gives each of them, bit for
// bit, the copies or the parity it held before it was lost, while the others send
// from a copy of what they hold and keep it unchanged.
#include <gtest/gtest.h>

#include <thread>

#include "collectives/transport/in_process_transport.h"
#include "tests/unit/memory_checkpoint_testing.h"
#include "worker/memory_exchange.h"
#include "worker/memory_layout.h"
#include "worker/memory_tier.h"

namespace tessera::worker {
namespace {

const Mesh kMesh{"m", {{"data", 4}}, 1};
const std::vector<std::string> kWorkers = {"w-a", "w-b", "w-c", "w-d"};
const AcquireBuffer kHeap = [](size_t n) { return ShardBuffer::Heap(n); };

std::vector<uint8_t> Bytes(const ShareBytes& b) {
  std::vector<uint8_t> out(b.size());
  b.CopyRange(0, out.size(), out.data());
  return out;
}

// Every rank's checkpoint of step 3 of `policy`, its share of a size that differs by rank.
std::vector<std::shared_ptr<MemoryCheckpoint>> Checkpoints(const MemoryPolicy& policy) {
  auto layout = PlanMemoryLayout({"a", "b", "c", "d"}, policy);
  EXPECT_TRUE(layout.ok());
  std::vector<std::shared_ptr<MemoryCheckpoint>> cks;
  for (int r = 0; r < 4; ++r) {
    TensorStore store([r](const std::string&) -> Result<MeshPlacement> { return MeshPlacement{kMesh, r, {r}, kWorkers}; });
    std::string w(static_cast<size_t>(3 << 20) + 17 * r, static_cast<char>('a' + r));
    for (size_t i = 0; i < w.size(); i += 4093) w[i] = static_cast<char>(i * 7 + r);
    TensorDesc d{DType::kUInt8, {4 * static_cast<int64_t>(w.size())}, Layout{{"data"}}};
    EXPECT_TRUE(store.Put("m", "w" + std::to_string(r), d, r, w).ok());
    auto snap = store.TakeSnapshot("m");
    EXPECT_TRUE(snap.ok());
    cks.push_back(memory_testing::NewCheckpoint(*snap, 3, r, policy, *layout));
  }
  return cks;
}

// Each rank runs the exchange on cks[r]; `only_to`: the ranks that receive.
void ExchangeAll(std::vector<std::shared_ptr<MemoryCheckpoint>>& cks, const std::set<int>* only_to) {
  auto transports = collectives::InProcessTransport::CreateGroup(4);
  std::vector<Status> st(4);
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r) {
    threads.emplace_back([&, r] {
      collectives::Group group(std::move(transports[r]), "memory/m");
      st[r] = ExchangeRedundancy(group, *cks[r], kWorkers, kHeap, collectives::Clock::now() + std::chrono::seconds(30),
                                 {}, only_to);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 4; ++r) ASSERT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r].ToString();
}

void ExpectGivenBack(const MemoryPolicy& policy, const std::set<int>& lost) {
  auto before = Checkpoints(policy);
  ExchangeAll(before, nullptr);
  // The lost ranks start again from their share alone (as a restore rebuilt it); the
  // others exchange from copies of their checkpoints.
  std::vector<std::shared_ptr<MemoryCheckpoint>> after;
  for (int r = 0; r < 4; ++r) {
    auto ck = std::make_shared<MemoryCheckpoint>(*before[r]);
    if (lost.count(r)) {
      ck->copies.clear();
      ck->group.clear();
      ck->group_headers.clear();
      ck->parity = ShareBytes();
      ck->stripe_length = 0;
      ck->parity_checksum = 0;
    }
    after.push_back(ck);
  }
  ExchangeAll(after, &lost);
  for (int r = 0; r < 4; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const MemoryCheckpoint& was = *before[r];
    const MemoryCheckpoint& got = *after[r];
    ASSERT_EQ(got.copies.size(), was.copies.size());
    for (const auto& [s, copy] : was.copies) {
      EXPECT_EQ(Bytes(got.copies.at(s).bytes), Bytes(copy.bytes)) << "the copy of rank " << s;
      EXPECT_EQ(got.copies.at(s).header.ToJson(), copy.header.ToJson());
    }
    EXPECT_EQ(Bytes(got.parity), Bytes(was.parity));
    EXPECT_EQ(got.parity_checksum, was.parity_checksum);
    EXPECT_EQ(got.stripe_length, was.stripe_length);
    EXPECT_EQ(got.group, was.group);
    ASSERT_EQ(got.group_headers.size(), was.group_headers.size());
    for (const auto& [i, h] : was.group_headers) EXPECT_EQ(got.group_headers.at(i).ToJson(), h.ToJson());
  }
}

MemoryPolicy Policy(MemoryPolicy::Mode mode, int64_t parity = 1) {
  MemoryPolicy p;
  p.mode = mode;
  p.parity = parity;
  p.force = true;
  return p;
}

TEST(MemoryReprotect, ALostReplicaHolderGetsItsCopiesBack) {
  ExpectGivenBack(Policy(MemoryPolicy::Mode::kReplica), {2});
}

TEST(MemoryReprotect, ALostParityMemberGetsItsParityBack) {
  ExpectGivenBack(Policy(MemoryPolicy::Mode::kParity), {2});
}

TEST(MemoryReprotect, TwoLostReedSolomonMembersGetTheirParityBack) {
  ExpectGivenBack(Policy(MemoryPolicy::Mode::kParity, 2), {1, 2});
}

TEST(MemoryReprotect, ThePlanNamesTheRanksItRebuilds) {
  ShareTransfer copy;
  copy.to = 3;
  copy.from = 0;
  ShareTransfer parity;
  parity.kind = ShareTransfer::Kind::kParity;
  parity.to = 1;
  parity.group = {0, 1, 2, 3};
  parity.lost = {1, 2};
  EXPECT_EQ(RebuiltRanks({copy, parity}), (std::set<int>{1, 2, 3}));
  EXPECT_TRUE(RebuiltRanks({}).empty());
}

}  // namespace
}  // namespace tessera::worker
