// Memory checkpoints that share what did not change with the one before
// (docs/memory-tier.md, "What it costs in RAM"): a snapshot shares its base's buffer
// for a shard whose bytes are the same (held by the store, or borrowed from the
// trainer), the share's header names that step, a holder that kept the copy of that
// step receives only the pieces that changed, and the tier counts a shared buffer once.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include "collectives/transport/in_process_transport.h"
#include "tests/unit/memory_checkpoint_testing.h"
#include "worker/borrowed_memory.h"
#include "worker/borrowed_snapshot.h"
#include "worker/memory_exchange.h"
#include "worker/memory_layout.h"
#include "worker/memory_tier.h"

namespace tessera::worker {
namespace {

const Mesh kMesh{"m", {{"data", 4}}, 1};
const std::vector<std::string> kWorkers = {"w-a", "w-b", "w-c", "w-d"};
const AcquireBuffer kHeap = [](size_t n) { return ShardBuffer::Heap(n); };
// A frozen base of 600k floats (2.4 MB: over the size that waits for a holder's
// answer) and a small adapter that changes every step.
constexpr int64_t kFrozen = 600 * 1000;
constexpr int64_t kAdapter = 1000;

std::string Floats(int64_t n, float seed) {
  std::vector<float> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = seed + static_cast<float>(i);
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

struct Rank {
  explicit Rank(int r)
      : store([r](const std::string&) -> Result<MeshPlacement> { return MeshPlacement{kMesh, r, {r}, kWorkers}; }) {}
  void Put(const std::string& name, int64_t floats, float seed) {
    TensorDesc d{DType::kFloat32, {4 * floats}, Layout{{"data"}}};
    ASSERT_TRUE(store.Put("m", name, d, rank(), Floats(floats, seed)).ok());
  }
  int rank() const { return store.Placement("m")->rank; }
  TensorStore store;
  MemoryTier tier;
};

const ShardBuffer* BufferOf(const Snapshot& snap, const std::string& name) {
  return snap.Find(name)->shards.at(0).buffer.get();
}

TEST(MemorySharing, ASnapshotSharesTheShardsThatDidNotChange) {
  Rank r(1);
  r.Put("frozen", kFrozen, 1);
  r.Put("adapter", kAdapter, 2);
  auto placement = *r.store.Placement("m");
  auto first = r.store.TakeSnapshot(placement, std::nullopt);
  ASSERT_TRUE(first.ok());
  // Changed in its last byte only: compared whole, not sampled.
  std::string adapter = Floats(kAdapter, 2);
  adapter.back() ^= 1;
  TensorDesc d{DType::kFloat32, {4 * kAdapter}, Layout{{"data"}}};
  ASSERT_TRUE(r.store.Put("m", "adapter", d, 1, adapter).ok());
  auto second = r.store.TakeSnapshot(placement, std::nullopt, first->get());
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(BufferOf(**second, "frozen"), BufferOf(**first, "frozen"));
  EXPECT_NE(BufferOf(**second, "adapter"), BufferOf(**first, "adapter"));
  const ShardBuffer* got = BufferOf(**second, "adapter");
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(got->data()), got->size()), adapter);
  EXPECT_TRUE(Snapshot::SharedWith(first->get(), *(*second)->Find("frozen"), (*second)->Find("frozen")->shards[0]));
  // The header takes the base's checksum and names its step; the other piece its own.
  ShareHeader h1 = DescribeShare(**first, 1, 1, 7, 9, Json::object());
  ShareHeader h2 = DescribeShare(**second, 2, 1, 7, 9, Json::object(), first->get(), &h1);
  ShareHeader fresh = DescribeShare(**second, 2, 1, 7, 9, Json::object());
  for (size_t i = 0; i < h2.pieces.size(); ++i) {
    EXPECT_EQ(h2.pieces[i].checksum, fresh.pieces[i].checksum) << h2.pieces[i].tensor.name;
    EXPECT_EQ(h2.pieces[i].same_as, h2.pieces[i].tensor.name == "frozen" ? 1 : -1);
  }
  // same_as travels, and must name an earlier step.
  auto back = ShareHeader::FromJson(h2.ToJson());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->ToJson(), h2.ToJson());
  Json bad = h2.ToJson();
  bad["pieces"][1]["same_as"] = 2;
  EXPECT_EQ(ShareHeader::FromJson(bad).status().details()["field"], "pieces");
  // A tensor of another description is copied, not shared.
  ASSERT_TRUE(r.store.Delete("m", "frozen").ok());
  r.Put("frozen", kFrozen + 1, 1);
  auto third = r.store.TakeSnapshot(placement, std::nullopt, second->get());
  ASSERT_TRUE(third.ok());
  EXPECT_NE(BufferOf(**third, "frozen"), BufferOf(**second, "frozen"));
}

TEST(MemorySharing, BaseChecksumsCompareInOnePassAndTheirVerdictIsTaken) {
  Rank r(1);
  r.Put("frozen", kFrozen, 1);
  r.Put("adapter", kAdapter * 100, 2);  // 400 KB: past the first block compared
  auto placement = *r.store.Placement("m");
  auto first = r.store.TakeSnapshot(placement, std::nullopt);
  ASSERT_TRUE(first.ok());
  ShareHeader h1 = DescribeShare(**first, 1, 1, 7, 9, Json::object());
  ShardChecksums sums;
  for (const auto& p : h1.pieces) sums[{p.tensor.name, p.device}] = p.checksum;
  // Changed past its first 64 KiB: found by its checksum.
  std::string adapter = Floats(kAdapter * 100, 2);
  adapter[adapter.size() - 5] ^= 1;
  TensorDesc d{DType::kFloat32, {4 * kAdapter * 100}, Layout{{"data"}}};
  ASSERT_TRUE(r.store.Put("m", "adapter", d, 1, adapter).ok());
  auto second = r.store.TakeSnapshot(placement, std::nullopt, first->get(), &sums);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(BufferOf(**second, "frozen"), BufferOf(**first, "frozen"));
  EXPECT_NE(BufferOf(**second, "adapter"), BufferOf(**first, "adapter"));
  // The checksum decides: one that does not match the bytes makes them a copy.
  sums[{"frozen", 1}] ^= 1;
  auto third = r.store.TakeSnapshot(placement, std::nullopt, second->get(), &sums);
  ASSERT_TRUE(third.ok());
  EXPECT_NE(BufferOf(**third, "frozen"), BufferOf(**second, "frozen"));
  const ShardBuffer* got = BufferOf(**third, "frozen");
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(got->data()), got->size()), Floats(kFrozen, 1));
}

TEST(MemorySharing, BorrowedShardsEqualToTheBaseAreNotCopied) {
  TensorStore store([](const std::string&) -> Result<MeshPlacement> { return MeshPlacement{kMesh, 0, {0}, kWorkers}; });
  std::string frozen = Floats(kFrozen, 3), adapter = Floats(kAdapter, 4);
  auto lend = [&] {
    auto snap = std::make_shared<Snapshot>();
    snap->placement = MeshPlacement{kMesh, 0, {0}, kWorkers};
    for (auto [name, bytes] : {std::pair<const char*, std::string*>{"adapter", &adapter}, {"frozen", &frozen}}) {
      TensorDesc d{DType::kFloat32, {4 * static_cast<int64_t>(bytes->size() / 4)}, Layout{{"data"}}};
      auto lent = std::make_shared<const BorrowedMemory>(getpid(), reinterpret_cast<uint64_t>(bytes->data()),
                                                         bytes->size(), name, 0);
      snap->tensors.push_back({name, d, {{0, nullptr, lent}}, {}});
    }
    return std::shared_ptr<const Snapshot>(snap);
  };
  auto first = OwnSnapshot(lend(), &store);
  ASSERT_TRUE(first.ok());
  adapter[adapter.size() / 2] ^= 1;
  auto second = OwnSnapshot(lend(), &store, first->get());
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(BufferOf(**second, "frozen"), BufferOf(**first, "frozen"));
  EXPECT_NE(BufferOf(**second, "adapter"), BufferOf(**first, "adapter"));
  const ShardBuffer* got = BufferOf(**second, "adapter");
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(got->data()), got->size()), adapter);
  EXPECT_FALSE((*second)->borrows());
  // With base's checksums: the frozen shard (past its first block) by its checksum; a
  // checksum that does not match makes it a copy.
  ShareHeader h = DescribeShare(**second, 2, 0, 7, 9, Json::object());
  ShardChecksums sums;
  for (const auto& p : h.pieces) sums[{p.tensor.name, p.device}] = p.checksum;
  auto third = OwnSnapshot(lend(), &store, second->get(), &sums);
  ASSERT_TRUE(third.ok());
  EXPECT_EQ(BufferOf(**third, "frozen"), BufferOf(**second, "frozen"));
  EXPECT_EQ(BufferOf(**third, "adapter"), BufferOf(**second, "adapter"));
  sums[{"frozen", 0}] ^= 1;
  auto fourth = OwnSnapshot(lend(), &store, third->get(), &sums);
  ASSERT_TRUE(fourth.ok());
  EXPECT_NE(BufferOf(**fourth, "frozen"), BufferOf(**third, "frozen"));
}

TEST(MemorySharing, ThePoolGivesBackWhatAFrozenStateNoLongerNeeds) {
  // A save that shared most of its shards trims the snapshot pool to `keep` sets of
  // what it copied (Agent::ReserveRing): the oldest idle buffers go first.
  auto pool = ShardBufferPool::Create(size_t{1} << 30);
  ASSERT_TRUE(pool->Reserve(1000).ok());
  ASSERT_TRUE(pool->Reserve(300).ok());
  ASSERT_TRUE(pool->Reserve(200).ok());
  EXPECT_EQ(pool->stats().pooled_bytes, 1500u);
  pool->Trim(600);
  EXPECT_EQ(pool->stats().pooled_bytes, 500u);
  auto in_use = pool->Acquire(300);  // taken from the pool: not idle, not trimmed
  ASSERT_TRUE(in_use.ok());
  pool->Trim(0);
  EXPECT_EQ(pool->stats().pooled_bytes, 0u);
  EXPECT_EQ((*in_use)->size(), 300u);
  in_use->reset();
  EXPECT_EQ(pool->stats().pooled_bytes, 300u);
}

// Each rank takes `step` (its snapshot sharing with its newest checkpoint), exchanges
// one copy, and commits it in its tier. `forget`: a rank that lost its checkpoints first.
void TakeStep(std::vector<std::unique_ptr<Rank>>& ranks, int64_t step, int forget = -1) {
  auto layout = PlanMemoryLayout({"a", "b", "c", "d"}, MemoryPolicy{});
  ASSERT_TRUE(layout.ok());
  if (forget >= 0) {
    for (const auto& ck : ranks[forget]->tier.Committed("m")) ranks[forget]->tier.Drop("m", ck->step);
  }
  auto groups = collectives::InProcessTransport::CreateGroup(4);
  std::vector<std::thread> threads;
  std::vector<Status> st(4);
  for (int r = 0; r < 4; ++r) {
    std::shared_ptr<const MemoryCheckpoint> before = ranks[r]->tier.Newest("m");
    auto snap = ranks[r]->store.TakeSnapshot(*ranks[r]->store.Placement("m"), std::nullopt,
                                             before ? before->own.snapshot().get() : nullptr);
    ASSERT_TRUE(snap.ok());
    auto ck = memory_testing::NewCheckpoint(*snap, step, r, MemoryPolicy{}, *layout, before.get());
    ranks[r]->tier.Begin(ck);
    threads.emplace_back([&, r, ck] {
      collectives::Group group(std::move(groups[r]), "memory/m");
      st[r] = ExchangeRedundancy(group, *ck, kWorkers, kHeap, collectives::Clock::now() + std::chrono::seconds(30),
                                 [&, r](int64_t s) { return ranks[r]->tier.Find("m", s); });
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(st[r].ok()) << st[r].ToString();
    ASSERT_TRUE(ranks[r]->tier.Commit("m", step));
  }
}

TEST(MemorySharing, AHolderReceivesOnlyThePiecesThatChanged) {
  std::vector<std::unique_ptr<Rank>> ranks;
  for (int r = 0; r < 4; ++r) {
    ranks.push_back(std::make_unique<Rank>(r));
    ranks[r]->Put("frozen", kFrozen, static_cast<float>(r));
    ranks[r]->Put("adapter", kAdapter, static_cast<float>(10 + r));
  }
  TakeStep(ranks, 1);
  const uint64_t full = ranks[0]->tier.Bytes("m");
  for (int64_t step = 2; step <= 3; ++step) {
    for (int r = 0; r < 4; ++r) ranks[r]->Put("adapter", kAdapter, static_cast<float>(100 * step + r));
    TakeStep(ranks, step);
  }
  // Each holder's copy of step 3 keeps step 1's frozen piece (the same bytes, not
  // sent again) and step 3's adapter, as the sender holds them.
  for (int r = 0; r < 4; ++r) {
    auto cks = ranks[r]->tier.Committed("m");
    ASSERT_EQ(cks.size(), 2u);
    const MemoryCheckpoint& ck = *cks.back();
    ASSERT_EQ(ck.copies.size(), 1u);
    const auto& [s, copy] = *ck.copies.begin();
    const MemoryCheckpoint& sender = *ranks[s]->tier.Committed("m").back();
    ASSERT_TRUE(CheckShare(copy.header, copy.bytes, "copy").ok());
    std::vector<uint8_t> got(copy.bytes.size()), want(sender.own.size());
    copy.bytes.CopyRange(0, got.size(), got.data());
    sender.own.CopyRange(0, want.size(), want.data());
    EXPECT_EQ(got, want) << "rank " << r;
    const MemoryCheckpoint& older = *cks.front();
    for (size_t i = 0; i < copy.header.pieces.size(); ++i) {
      const bool frozen = copy.header.pieces[i].tensor.name == "frozen";
      const auto& p = copy.header.pieces[i];
      const bool same = copy.bytes.Range(p.offset, 1)[0].data() ==
                        older.copies.at(s).bytes.Range(older.copies.at(s).header.pieces[i].offset, 1)[0].data();
      EXPECT_EQ(same, frozen) << "rank " << r << " piece " << p.tensor.name;
    }
    // Two checkpoints, each with its own share and a copy: the frozen halves counted once.
    EXPECT_LT(ranks[r]->tier.Bytes("m"), full + full / 50) << "rank " << r;
  }
  // A holder that lost its copies receives the whole share again.
  for (int r = 0; r < 4; ++r) ranks[r]->Put("adapter", kAdapter, static_cast<float>(400 + r));
  TakeStep(ranks, 4, /*forget=*/2);
  const MemoryCheckpoint& ck = *ranks[2]->tier.Committed("m").back();
  const auto& [s, copy] = *ck.copies.begin();
  std::vector<uint8_t> got(copy.bytes.size()), want(copy.bytes.size());
  copy.bytes.CopyRange(0, got.size(), got.data());
  ranks[s]->tier.Committed("m").back()->own.CopyRange(0, want.size(), want.data());
  EXPECT_EQ(got, want);
  EXPECT_TRUE(CheckShare(copy.header, copy.bytes, "copy").ok());
}

}  // namespace
}  // namespace tessera::worker
