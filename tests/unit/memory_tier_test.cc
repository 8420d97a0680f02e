// The memory tier's parts without processes: where redundancy goes (layout), which
// step a restore takes (choice), what a worker keeps (retention), and the transfers
// themselves over in-process transports: copies and parity are exchanged, a lost
// share is rebuilt bit for bit, and a damaged copy is named by its checksum.
#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <thread>

#include "collectives/transport/in_process_transport.h"
#include "tests/unit/memory_checkpoint_testing.h"
#include "tests/unit/memory_held_step.h"
#include "worker/memory_choice.h"
#include "worker/memory_exchange.h"
#include "worker/memory_layout.h"
#include "worker/memory_tier.h"
#include "worker/parity_code.h"

namespace tessera::worker {
namespace {

MemoryPolicy Replica(int64_t k, bool force = false) {
  MemoryPolicy p;
  p.replicas = k;
  p.force = force;
  return p;
}

MemoryPolicy Parity(int64_t g, bool force = false, int64_t parity = 1) {
  MemoryPolicy p;
  p.mode = MemoryPolicy::Mode::kParity;
  p.group = g;
  p.parity = parity;
  p.force = force;
  return p;
}

TEST(MemoryLayout, CopiesGoToOtherHostsAndEveryWorkerHoldsAsMany) {
  // Two workers per host: rank r's next rank is on its own host, so its copies skip it.
  const std::vector<std::string> hosts = {"a", "a", "b", "b", "c", "c"};
  auto l = PlanMemoryLayout(hosts, Replica(2));
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  for (int r = 0; r < 6; ++r) {
    std::set<std::string> seen = {hosts[r]};
    for (int t : l->targets[r]) EXPECT_TRUE(seen.insert(hosts[t]).second) << "rank " << r << " → " << t;
    EXPECT_EQ(l->targets[r].size(), 2u);
    EXPECT_EQ(l->sources[r].size(), 2u) << "rank " << r;  // balanced
  }
  EXPECT_EQ(l->targets[0], (std::vector<int>{2, 4}));
  EXPECT_TRUE(l->diversity_problem.empty());
}

TEST(MemoryLayout, OneHostIsRefusedUnlessForced) {
  const std::vector<std::string> hosts(4, "h");
  auto refused = PlanMemoryLayout(hosts, Replica(1));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Code::kConflict);
  EXPECT_EQ(refused.status().details()["reason"], "no_host_diversity");
  EXPECT_NE(refused.status().message().find("force"), std::string::npos);
  auto forced = PlanMemoryLayout(hosts, Replica(1, true));
  ASSERT_TRUE(forced.ok());
  EXPECT_FALSE(forced->diversity_problem.empty());
  EXPECT_EQ(forced->targets[3], (std::vector<int>{0}));
  EXPECT_FALSE(PlanMemoryLayout(hosts, Parity(4)).ok());
  EXPECT_FALSE(PlanMemoryLayout({"a", "b"}, Replica(2)).ok());  // 3 workers needed
  EXPECT_FALSE(PlanMemoryLayout({"a"}, Replica(1)).ok());
}

TEST(MemoryLayout, ParityGroupsSpanHostsAndALastSingleJoinsTheOneBefore) {
  // 9 ranks on 3 hosts, groups of 3: each group takes one rank of each host.
  const std::vector<std::string> hosts = {"a", "a", "a", "b", "b", "b", "c", "c", "c"};
  auto l = PlanMemoryLayout(hosts, Parity(3));
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  ASSERT_EQ(l->groups.size(), 3u);
  EXPECT_EQ(l->groups[0], (std::vector<int>{0, 3, 6}));
  EXPECT_EQ(l->group_of[4], 1);
  // 5 distinct hosts, groups of 4: the fifth rank joins the first group (of 5).
  auto five = PlanMemoryLayout({"a", "b", "c", "d", "e"}, Parity(4));
  ASSERT_TRUE(five.ok());
  ASSERT_EQ(five->groups.size(), 1u);
  EXPECT_EQ(five->groups[0].size(), 5u);
}

TEST(MemoryPolicy, FieldsAreCheckedAndNamed) {
  EXPECT_EQ(MemoryPolicy::FromJson({{"redundancy", "raid"}}).status().details()["field"], "redundancy");
  EXPECT_EQ(MemoryPolicy::FromJson({{"group", 1}}).status().details()["field"], "group");
  EXPECT_EQ(MemoryPolicy::FromJson({{"keep", 0}}).status().details()["field"], "keep");
  EXPECT_EQ(MemoryPolicy::FromJson({{"replicas", "2"}}).status().details()["field"], "replicas");
  EXPECT_EQ(MemoryPolicy::FromJson({{"parity", 4}}).status().details()["field"], "parity");
  // A group must outnumber the losses it survives.
  auto small = PlanMemoryLayout({"a", "b", "c", "d", "e", "f"}, Parity(4, false, 2));
  ASSERT_FALSE(small.ok());  // groups of 4 and 2
  EXPECT_EQ(small.status().details()["field"], "parity");
  EXPECT_NE(small.status().message().find("group 1 of this mesh has 2"), std::string::npos) << small.status().ToString();
  auto p = MemoryPolicy::FromJson({{"redundancy", "parity"}, {"group", 3}, {"persist_every_steps", 10}});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->mode, MemoryPolicy::Mode::kParity);
  EXPECT_NE(p->Fingerprint(), MemoryPolicy().Fingerprint());
}

using memory_testing::Held;

std::vector<Inventory> Inventories(int n, int64_t persisted) {
  std::vector<Inventory> v(n);
  for (auto& inv : v) {
    inv.persisted = persisted;
    inv.mesh_fingerprint = 7;
  }
  return v;
}

const std::vector<std::string> kWorkers = {"w-a", "w-b", "w-c", "w-d"};
// What the exchanges keep comes from fresh heap buffers here (a worker's from its pool).
const AcquireBuffer kHeap = [](size_t n) { return ShardBuffer::Heap(n); };
constexpr auto kRep = MemoryPolicy::Mode::kReplica;
constexpr auto kPar = MemoryPolicy::Mode::kParity;

TEST(MemoryChoice, NewestCompleteStepWinsAndALostShareComesFromItsCopy) {
  auto inv = Inventories(4, 3);
  for (int r = 0; r < 4; ++r) {
    inv[r].steps.push_back(Held(4, true, kRep, {(r + 3) % 4}));
    // Step 5: rank 2 lost everything (a replacement); rank 3 holds its copy.
    if (r != 2) inv[r].steps.push_back(Held(5, true, kRep, {(r + 3) % 4}));
  }
  RestoreChoice c = ChooseRestore(inv, 7, kWorkers);
  EXPECT_TRUE(c.memory);
  EXPECT_EQ(c.step, 5);
  ASSERT_EQ(c.plan.size(), 1u);
  EXPECT_EQ(c.plan[0].to, 2);
  EXPECT_EQ(c.plan[0].from, 3);
  EXPECT_EQ(c.sources, (std::vector<std::string>{"local", "local", "replica", "local"}));
}

TEST(MemoryChoice, TwoLossesInAParityGroupFallBackNamingThem) {
  auto inv = Inventories(4, 3);
  const std::vector<int> group = {0, 1, 2, 3};
  inv[0].steps.push_back(Held(6, true, kPar, group));
  inv[1].steps.push_back(Held(6, true, kPar, group));
  RestoreChoice c = ChooseRestore(inv, 7, kWorkers);
  EXPECT_FALSE(c.memory);
  EXPECT_EQ(c.step, 3);
  EXPECT_NE(c.fallback.find("step 6"), std::string::npos) << c.fallback;
  EXPECT_NE(c.fallback.find("w-c"), std::string::npos) << c.fallback;
  // One loss is rebuilt from the group.
  inv[2].steps.push_back(Held(6, true, kPar, group));
  c = ChooseRestore(inv, 7, kWorkers);
  EXPECT_TRUE(c.memory);
  ASSERT_EQ(c.plan.size(), 1u);
  EXPECT_EQ(c.plan[0].kind, ShareTransfer::Kind::kParity);
  EXPECT_EQ(c.plan[0].to, 3);
  // A damaged parity on a survivor: not rebuildable.
  inv[1].steps[0].redundancy = false;
  c = ChooseRestore(inv, 7, kWorkers);
  EXPECT_FALSE(c.memory);
  EXPECT_NE(c.fallback.find("w-b"), std::string::npos) << c.fallback;
  // With parity 2 the group survives both: rank 3's loss and rank 1's damaged parity.
  for (auto& i : inv) {
    for (auto& h : i.steps) h.parity = 2;
  }
  c = ChooseRestore(inv, 7, kWorkers);
  ASSERT_TRUE(c.memory) << c.fallback;
  ASSERT_EQ(c.plan.size(), 1u);
  EXPECT_EQ(c.plan[0].lost, (std::vector<int>{3}));
  EXPECT_EQ(c.plan[0].unusable, (std::vector<int>{1}));
  EXPECT_EQ(c.plan[0].parity, 2);
  // Two lost shares with parity 2: both rebuilt in one transfer; a third loss is one too many.
  inv[1].steps[0].redundancy = true;
  inv[2].steps.clear();
  c = ChooseRestore(inv, 7, kWorkers);
  ASSERT_TRUE(c.memory) << c.fallback;
  ASSERT_EQ(c.plan.size(), 1u);
  EXPECT_EQ(c.plan[0].lost, (std::vector<int>{2, 3}));
  EXPECT_EQ(c.sources, (std::vector<std::string>{"local", "local", "parity", "parity"}));
  inv[1].steps.clear();
  c = ChooseRestore(inv, 7, kWorkers);
  EXPECT_FALSE(c.memory);
  EXPECT_NE(c.fallback.find("survives 2 losses"), std::string::npos) << c.fallback;
}

TEST(MemoryChoice, PersistedNewerThanMemoryAndOtherMeshDefinitions) {
  auto inv = Inventories(4, 9);
  for (int r = 0; r < 4; ++r) inv[r].steps.push_back(Held(8, true, kRep, {}));
  RestoreChoice c = ChooseRestore(inv, 7, kWorkers);
  EXPECT_FALSE(c.memory);
  EXPECT_EQ(c.step, 9);
  EXPECT_EQ(c.fallback, "");
  // The same step in both: memory.
  for (auto& i : inv) i.persisted = 8;
  EXPECT_TRUE(ChooseRestore(inv, 7, kWorkers).memory);
  // Shares of another definition of the mesh do not count.
  inv[1].mesh_fingerprint = 8;
  EXPECT_FALSE(ChooseRestore(inv, 7, kWorkers).memory);
  // A worker that saw no persisted step: nothing persisted counts.
  inv[1].mesh_fingerprint = 7;
  inv[3].persisted = -1;
  c = ChooseRestore(inv, 7, kWorkers);
  EXPECT_TRUE(c.memory);
  EXPECT_EQ(c.step, 8);
}

TEST(MemoryChoice, InventoriesTravelAsFixedRecords) {
  Inventory inv;
  inv.persisted = 12;
  inv.mesh_fingerprint = 99;
  inv.lookup_failed = true;
  for (int s = 0; s < 12; ++s) inv.steps.push_back(Held(s, s % 2 == 0, kPar, {1, 2, 3}, s % 3 == 0));
  const std::vector<int64_t> record = EncodeInventory(inv);
  ASSERT_EQ(record.size(), InventoryRecordSize());
  Inventory back = DecodeInventory(record.data());
  EXPECT_EQ(back.persisted, 12);
  EXPECT_EQ(back.mesh_fingerprint, 99);
  EXPECT_TRUE(back.lookup_failed);
  ASSERT_EQ(back.steps.size(), static_cast<size_t>(MemoryPolicy::kMaxKeep + 1));  // the newest
  EXPECT_EQ(back.steps.back().step, 11);
  EXPECT_EQ(back.steps.back().ranks, (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(back.steps.back().own, false);
  EXPECT_EQ(back.steps.front().step, 3);
  EXPECT_EQ(back.steps.front().redundancy, true);
}

// --- shares over in-process transports

const Mesh kMesh{"m", {{"data", 4}}, 1};

// Rank r's store holds "w" (its shard, of a size that differs by rank through "x",
// held only by some ranks) filled from `seed`.
struct Rank {
  explicit Rank(int r)
      : store([r](const std::string&) -> Result<MeshPlacement> {
          return MeshPlacement{kMesh, r, {r}, kWorkers};
        }) {}
  TensorStore store;
};

// `floats` per rank in "w": small shares follow their header at once, large ones
// (over 1 MiB) wait for the receiver's "ready".
std::vector<std::unique_ptr<Rank>> MakeRanks(int seed, int64_t floats = 1000) {
  std::vector<std::unique_ptr<Rank>> ranks;
  for (int r = 0; r < 4; ++r) {
    ranks.push_back(std::make_unique<Rank>(r));
    std::vector<float> w(static_cast<size_t>(floats));
    for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(seed * 10000 + r * 1000 + i);
    TensorDesc d{DType::kFloat32, {4 * floats}, Layout{{"data"}}};
    EXPECT_TRUE(ranks[r]->store.Put("m", "w", d, r,
                                    std::string_view(reinterpret_cast<char*>(w.data()), w.size() * 4)).ok());
    // Shares of different lengths: rank r also holds r * 37 extra bytes.
    std::string extra(static_cast<size_t>(r) * 37 + 1, static_cast<char>('a' + r));
    TensorDesc e{DType::kUInt8, {static_cast<int64_t>(extra.size())}, Layout{{"unsharded"}}};
    EXPECT_TRUE(ranks[r]->store.Put("m", "x" + std::to_string(r), e, r, extra).ok());
  }
  return ranks;
}

std::vector<std::shared_ptr<MemoryCheckpoint>> Exchange(std::vector<std::unique_ptr<Rank>>& ranks,
                                                        const MemoryPolicy& policy,
                                                        std::vector<std::unique_ptr<collectives::Group>>& groups,
                                                        const AcquireBuffer& acquire = kHeap) {
  auto layout = PlanMemoryLayout({"a", "b", "c", "d"}, policy);
  EXPECT_TRUE(layout.ok());
  std::vector<std::shared_ptr<MemoryCheckpoint>> cks(4);
  std::vector<Status> st(4);
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r) {
    auto snap = ranks[r]->store.TakeSnapshot("m");
    EXPECT_TRUE(snap.ok());
    cks[r] = memory_testing::NewCheckpoint(*snap, 5, r, policy, *layout);
    threads.emplace_back([&, r] {
      st[r] = ExchangeRedundancy(*groups[r], *cks[r], kWorkers, acquire,
                                 collectives::Clock::now() + std::chrono::seconds(30));
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 4; ++r) EXPECT_TRUE(st[r].ok()) << st[r].ToString();
  return cks;
}

std::vector<std::unique_ptr<collectives::Group>> Groups() {
  std::vector<std::unique_ptr<collectives::Group>> groups;
  for (auto& t : collectives::InProcessTransport::CreateGroup(4)) {
    groups.push_back(std::make_unique<collectives::Group>(std::move(t), "memory/m"));
  }
  return groups;
}

// The ranks in `lost` lose their checkpoints; the others rebuild their shares per
// `choice`: what each rank received.
struct Rebuilt {
  std::vector<ShareHeader> headers = std::vector<ShareHeader>(4);
  std::vector<ShareBytes> bytes = std::vector<ShareBytes>(4);
  std::vector<Status> st = std::vector<Status>(4);
};

Rebuilt Rebuild(std::vector<std::shared_ptr<MemoryCheckpoint>>& cks, const std::set<int>& lost,
                const RestoreChoice& choice, const LandShare& land = {}) {
  auto groups = Groups();
  Rebuilt out;
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r) {
    threads.emplace_back([&, r] {
      out.st[r] = RebuildShares(*groups[r], lost.count(r) ? nullptr : cks[r].get(), 5, choice.plan, kWorkers,
                                land, collectives::Clock::now() + std::chrono::seconds(30), &out.headers[r],
                                &out.bytes[r]);
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

std::vector<Inventory> InventoriesOf(const std::vector<std::shared_ptr<MemoryCheckpoint>>& cks,
                                     const std::set<int>& lost) {
  auto inv = Inventories(4, -1);
  for (int r = 0; r < 4; ++r) {
    if (lost.count(r)) continue;
    const MemoryCheckpoint& ck = *cks[r];
    std::vector<int> ranks;
    if (ck.policy.mode == kRep) {
      for (const auto& [s, copy] : ck.copies) {
        if (CheckShare(copy.header, copy.bytes, "copy").ok()) ranks.push_back(static_cast<int>(s));
      }
    } else {
      ranks = ck.group;
    }
    inv[r].steps.push_back(Held(5, true, ck.policy.mode, ranks));
    inv[r].steps.back().parity = ck.layout.parity;
  }
  return inv;
}

void ExpectSameShare(const MemoryCheckpoint& original, const ShareHeader& header, const ShareBytes& bytes) {
  ASSERT_EQ(bytes.size(), original.own.size());
  std::vector<uint8_t> a(bytes.size()), b(bytes.size());
  bytes.CopyRange(0, bytes.size(), a.data());
  original.own.CopyRange(0, original.own.size(), b.data());
  EXPECT_EQ(a, b);
  EXPECT_EQ(header.ToJson(), original.own_header.ToJson());
}

TEST(MemoryExchange, ParityRebuildsALostShareBitForBit) {
  for (int lost = 0; lost < 4; ++lost) {
    auto ranks = MakeRanks(lost);
    auto groups = Groups();
    auto cks = Exchange(ranks, Parity(4), groups);
    // Each member keeps a third of the longest share, not a copy.
    EXPECT_EQ(cks[0]->parity.size(), StripeLength(cks[3]->own.size(), 3));
    RestoreChoice choice = ChooseRestore(InventoriesOf(cks, {lost}), 7, kWorkers);
    ASSERT_TRUE(choice.memory);
    Rebuilt got = Rebuild(cks, {lost}, choice);
    for (int r = 0; r < 4; ++r) ASSERT_TRUE(got.st[r].ok()) << "rank " << r << ": " << got.st[r].ToString();
    ExpectSameShare(*cks[lost], got.headers[lost], got.bytes[lost]);
  }
}

TEST(MemoryExchange, ReedSolomonParityRebuildsAnyTwoLostSharesBitForBit) {
  auto ranks = MakeRanks(3, 20000);  // 80 kB a share: ISA-L's vector kernels and their tails
  auto groups = Groups();
  auto cks = Exchange(ranks, Parity(4, false, 2), groups);
  // Each member keeps two parity rows of half the longest share.
  EXPECT_EQ(cks[0]->parity.size(), 2 * StripeLength(cks[3]->own.size(), 2));
  for (int a = 0; a < 4; ++a) {
    for (int b = a + 1; b < 4; ++b) {
      RestoreChoice choice = ChooseRestore(InventoriesOf(cks, {a, b}), 7, kWorkers);
      ASSERT_TRUE(choice.memory) << choice.fallback;
      Rebuilt got = Rebuild(cks, {a, b}, choice);
      for (int r = 0; r < 4; ++r) ASSERT_TRUE(got.st[r].ok()) << "rank " << r << ": " << got.st[r].ToString();
      ExpectSameShare(*cks[a], got.headers[a], got.bytes[a]);
      ExpectSameShare(*cks[b], got.headers[b], got.bytes[b]);
    }
  }
  // Three lost: one too many.
  EXPECT_FALSE(ChooseRestore(InventoriesOf(cks, {0, 1, 2}), 7, kWorkers).memory);
}

TEST(MemoryExchange, LargeCopiesWaitForTheReceiverAndArriveWhole) {
  auto ranks = MakeRanks(2, 600 * 1000);  // 2.4 MB a share
  auto groups = Groups();
  auto cks = Exchange(ranks, Replica(1), groups);
  RestoreChoice choice = ChooseRestore(InventoriesOf(cks, {2}), 7, kWorkers);
  ASSERT_TRUE(choice.memory);
  ASSERT_EQ(choice.plan.size(), 1u);
  Rebuilt got = Rebuild(cks, {2}, choice);
  for (int r = 0; r < 4; ++r) ASSERT_TRUE(got.st[r].ok()) << got.st[r].ToString();
  ExpectSameShare(*cks[2], got.headers[2], got.bytes[2]);
  // Again, its large piece landing in memory the receiver names (a worker: the
  // trainer's mapping), the small one in the share's buffer, a wrong size not at all.
  const std::vector<ShareHeader::Piece>& pieces = cks[2]->own_header.pieces;
  const size_t iw = std::find_if(pieces.begin(), pieces.end(), [](const auto& p) { return p.tensor.name == "w"; }) -
                    pieces.begin();
  ASSERT_LT(iw, pieces.size());
  for (int64_t wrong : {0, 1}) {
    std::vector<uint8_t> mapped(pieces[iw].bytes + wrong, 0xee);
    const LandShare land = [&](const ShareHeader& h) {
      Landing l;
      l.pieces.resize(h.pieces.size());
      l.pieces[iw] = std::span<uint8_t>(mapped);
      return l;
    };
    got = Rebuild(cks, {2}, choice, land);
    for (int r = 0; r < 4; ++r) ASSERT_TRUE(got.st[r].ok()) << got.st[r].ToString();
    ExpectSameShare(*cks[2], got.headers[2], got.bytes[2]);
    EXPECT_EQ(got.bytes[2].InPlace(iw), wrong == 0);
    EXPECT_FALSE(got.bytes[2].InPlace(1 - iw));
    std::vector<uint8_t> want(pieces[iw].bytes);
    cks[2]->own.CopyRange(pieces[iw].offset, pieces[iw].bytes, want.data());
    EXPECT_EQ(mapped, wrong == 0 ? want : std::vector<uint8_t>(mapped.size(), 0xee));
  }
}

TEST(MemoryExchange, ADamagedCopyIsNamedAndAnotherIsUsed) {
  auto ranks = MakeRanks(1);
  auto groups = Groups();
  auto cks = Exchange(ranks, Replica(2), groups);
  // Rank 1's share is copied to ranks 2 and 3; a bit flips in rank 2's copy.
  ASSERT_TRUE(cks[2]->copies.count(1));
  MemoryCheckpoint::Copy& copy = cks[2]->copies[1];
  copy.bytes.writable()[17] ^= 0x04;
  Status damaged = CheckShare(copy.header, copy.bytes, "the copy of rank 1 held by w-c");
  EXPECT_EQ(damaged.code(), Code::kDataLoss);
  EXPECT_NE(damaged.message().find("'w'"), std::string::npos) << damaged.ToString();
  EXPECT_NE(damaged.message().find("w-c"), std::string::npos) << damaged.ToString();
  RestoreChoice choice = ChooseRestore(InventoriesOf(cks, {1}), 7, kWorkers);
  ASSERT_TRUE(choice.memory);
  ASSERT_EQ(choice.plan.size(), 1u);
  EXPECT_EQ(choice.plan[0].from, 3);  // not the damaged one
  Rebuilt got = Rebuild(cks, {1}, choice);
  for (int r = 0; r < 4; ++r) ASSERT_TRUE(got.st[r].ok()) << got.st[r].ToString();
  ExpectSameShare(*cks[1], got.headers[1], got.bytes[1]);
}

TEST(MemoryExchange, ASaveOfAnotherStepIsRefusedNamingTheWorker) {
  auto ranks = MakeRanks(0);
  auto groups = Groups();
  auto layout = PlanMemoryLayout({"a", "b", "c", "d"}, Replica(1));
  std::vector<Status> st(4);
  std::vector<std::thread> threads;
  std::vector<std::shared_ptr<MemoryCheckpoint>> cks(4);
  for (int r = 0; r < 4; ++r) {
    auto snap = ranks[r]->store.TakeSnapshot("m");
    auto ck = std::make_shared<MemoryCheckpoint>();
    ck->step = r == 1 ? 6 : 5;  // rank 1's trainer is a step ahead
    ck->layout = *layout;
    ck->mesh_fingerprint = 7;
    ck->own = ShareBytes(*snap);
    ck->own_header = DescribeShare(**snap, ck->step, r, 7, Replica(1).Fingerprint(), Json::object());
    cks[r] = ck;
    threads.emplace_back([&, r] {
      st[r] = ExchangeRedundancy(*groups[r], *cks[r], kWorkers, kHeap,
                                 collectives::Clock::now() + std::chrono::seconds(5));
      if (!st[r].ok()) groups[r]->transport().Abort(st[r]);
    });
  }
  for (auto& t : threads) t.join();
  // Rank 1 receives rank 0's copy of step 5, and rank 2 rank 1's of step 6: whichever
  // sees it first aborts the group, and every error names rank 1, the odd one.
  for (int r : {1, 2}) {
    EXPECT_EQ(st[r].code(), Code::kConflict) << st[r].ToString();
    EXPECT_NE(st[r].message().find("rank 1 (w-b)"), std::string::npos) << st[r].ToString();
  }
}

TEST(MemoryExchange, WhatAWorkerKeepsComesBackToItsPoolAndIsReused) {
  // Copies and parity from the worker's pool: once the checkpoints they were kept for
  // are gone, the next exchange takes the same buffers (their pages already faulted).
  for (const MemoryPolicy& policy : {Replica(1), Parity(4)}) {
    auto pool = ShardBufferPool::Create(size_t{1} << 30);
    const AcquireBuffer pooled = [&pool](size_t n) { return pool->Acquire(n); };
    auto ranks = MakeRanks(3, 300000);  // shares over 1 MiB
    auto groups = Groups();
    Exchange(ranks, policy, groups, pooled).clear();  // kept, then dropped: back to the pool
    const auto warm = pool->stats();
    EXPECT_GT(warm.pooled_bytes, 0u) << policy.ToJson().dump();
    auto cks = Exchange(ranks, policy, groups, pooled);
    EXPECT_EQ(pool->stats().allocated, warm.allocated) << policy.ToJson().dump();
    EXPECT_GT(pool->stats().reused, warm.reused) << policy.ToJson().dump();
    EXPECT_EQ(pool->stats().pooled_bytes, 0u) << policy.ToJson().dump();
  }
}

}  // namespace
}  // namespace tessera::worker
