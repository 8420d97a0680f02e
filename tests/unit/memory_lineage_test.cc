// The memory tier's lineage and identity without processes (docs/memory-tier.md):
// a restore to an earlier step starts a new timeline and retention counts that
// timeline's newest commits; a mesh registered again (or with its workers in another
// order) is another mesh; a named-step restore is one choice for every rank; and an
// inventory carries the largest parity group whole.
#include <gtest/gtest.h>

#include <limits>

#include "tests/unit/memory_held_step.h"
#include "worker/memory_choice.h"
#include "worker/memory_layout.h"
#include "worker/memory_share.h"
#include "worker/memory_tier.h"
#include "worker/placements.h"

namespace tessera::worker {
namespace {

constexpr auto kRep = MemoryPolicy::Mode::kReplica;
constexpr auto kPar = MemoryPolicy::Mode::kParity;
const std::vector<std::string> kWorkers = {"w-a", "w-b", "w-c", "w-d"};

struct Tier {
  MemoryTier tier;
  void Add(int64_t step, int64_t fingerprint = 7) {
    auto ck = std::make_shared<MemoryCheckpoint>();
    ck->mesh = "m";
    ck->step = step;
    ck->policy.keep = 2;
    ck->mesh_fingerprint = fingerprint;
    ck->own = ShareBytes::Allocate(10);
    tier.Begin(ck);
  }
  void Save(int64_t step, int64_t fingerprint = 7) {
    Add(step, fingerprint);
    ASSERT_TRUE(tier.Commit("m", step));
  }
  std::vector<int64_t> Steps() const {
    std::vector<int64_t> out;
    for (const auto& ck : tier.Committed("m")) out.push_back(ck->step);
    return out;
  }
};

TEST(MemoryLineage, ARestoreToAnEarlierStepStartsANewTimeline) {
  Tier t;
  t.Save(200);
  t.Save(300);
  // The trainer restores step 100 (persisted): 200 and 300 are another timeline's.
  EXPECT_EQ(t.tier.Rollback("m", 100, 7), (std::vector<int64_t>{200, 300}));
  EXPECT_EQ(t.Steps(), (std::vector<int64_t>{}));
  t.Save(101);
  EXPECT_EQ(t.Steps(), (std::vector<int64_t>{101}));
  t.Save(102);
  t.Save(103);
  EXPECT_EQ(t.Steps(), (std::vector<int64_t>{102, 103}));
  EXPECT_EQ(t.tier.Bytes("m"), 20u);
}

TEST(MemoryLineage, ARestoreOfAHeldStepKeepsItAndWhatCameBefore) {
  Tier t;
  t.Save(200);
  t.Save(300);
  EXPECT_EQ(t.tier.Rollback("m", 200, 7), (std::vector<int64_t>{300}));
  t.Save(201);
  EXPECT_EQ(t.Steps(), (std::vector<int64_t>{200, 201}));
  t.Save(202);
  EXPECT_EQ(t.Steps(), (std::vector<int64_t>{201, 202}));
}

TEST(MemoryLineage, ACommitOfAnEarlierStepAbandonsWhatCameAfterAndIsKept) {
  // A rollback the worker did not see (a persisted restore over REST): the commit of an
  // earlier step is the timeline's newest, never freed by its own retention.
  Tier t;
  t.Save(200);
  t.Save(300);
  t.Add(400);  // in flight: not committed, left alone
  t.Save(101);
  EXPECT_EQ(t.Steps(), (std::vector<int64_t>{101}));
  t.Save(102);
  EXPECT_EQ(t.Steps(), (std::vector<int64_t>{101, 102}));
}

TEST(MemoryLineage, ATimelineBeginsLaterThanTheOneBefore) {
  Tier t;
  EXPECT_EQ(t.tier.Timeline("m"), 0);
  t.Add(1);
  t.tier.Commit("m", 1, 1000);
  EXPECT_EQ(t.tier.Timeline("m"), 1000);
  t.Add(2);
  t.tier.Commit("m", 2, 2000);  // the same timeline
  EXPECT_EQ(t.tier.Timeline("m"), 1000);
  t.Add(1);
  t.tier.Commit("m", 1, 500);  // abandons step 2; a clock behind still moves it on
  EXPECT_EQ(t.tier.Timeline("m"), 1001);
  t.tier.Rollback("m", 1, 7, 3000);  // the timeline the workers agreed on
  EXPECT_EQ(t.tier.Timeline("m"), 3000);
  std::vector<Inventory> inv(3);
  inv[1].timeline = 4000;
  inv[2].timeline = 3500;
  EXPECT_EQ(AgreedTimeline(inv), 4000);
  EXPECT_EQ(DecodeInventory(EncodeInventory(inv[1]).data()).timeline, 4000);
}

TEST(MemoryLineage, AnotherIdentityOfTheMeshIsFreed) {
  Tier t;
  t.Save(1, 7);
  t.Save(2, 7);
  t.Save(3, 8);  // the mesh registered again: the old registration's RAM goes
  EXPECT_EQ(t.Steps(), (std::vector<int64_t>{3}));
  EXPECT_EQ(t.tier.Rollback("m", std::numeric_limits<int64_t>::max(), 9), (std::vector<int64_t>{3}));
  EXPECT_EQ(t.tier.Bytes(), 0u);
}

TEST(MemoryIdentity, WorkersInRankOrderAndTheRegistrationAreTheMesh) {
  const Json record = {{"name", "m"},
                       {"axes", Json::array({{{"name", "data"}, {"size", 4}}})},
                       {"devices_per_worker", 1},
                       {"workers", kWorkers},
                       {"created_at", 1234}};
  auto p = PlacementOf(record, "w-c");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->registration, 1234);
  const int64_t fingerprint = MeshFingerprint(*p);
  MeshPlacement reordered = *p;
  std::swap(reordered.workers[0], reordered.workers[1]);
  EXPECT_NE(MeshFingerprint(reordered), fingerprint);
  MeshPlacement again = *p;
  again.registration = 1235;
  EXPECT_NE(MeshFingerprint(again), fingerprint);
  EXPECT_EQ(MeshFingerprint(*p), fingerprint);
}

using memory_testing::Held;

std::vector<Inventory> Inventories(int n, int64_t requested, int64_t persisted) {
  std::vector<Inventory> v(n);
  for (auto& inv : v) {
    inv.requested = requested;
    inv.persisted = persisted;
    inv.mesh_fingerprint = 7;
  }
  return v;
}

// Through the record each inventory travels as.
std::vector<Inventory> Travelled(const std::vector<Inventory>& v) {
  std::vector<Inventory> out;
  for (const Inventory& inv : v) out.push_back(DecodeInventory(EncodeInventory(inv).data()));
  return out;
}

TEST(MemoryNamedRestore, EveryRankRestoresTheNamedStepOrNoneDoes) {
  auto inv = Inventories(4, 200, -1);
  for (int r = 0; r < 4; ++r) {
    inv[r].steps.push_back(Held(200, true, kRep, {}));
    inv[r].steps.push_back(Held(300, true, kRep, {}));
  }
  RestoreChoice c = ChooseRestore(Travelled(inv), 7, kWorkers, 200);
  EXPECT_TRUE(c.memory);
  EXPECT_EQ(c.step, 200);
  // Rank 2 never committed 200 and nobody holds a copy: all fail, naming it.
  inv[2].steps.erase(inv[2].steps.begin());
  c = ChooseRestore(Travelled(inv), 7, kWorkers, 200);
  EXPECT_FALSE(c.memory);
  EXPECT_EQ(c.step, -1);
  EXPECT_EQ(c.culprit, 2);
  EXPECT_NE(c.fallback.find("rank 2 (w-c)"), std::string::npos) << c.fallback;
  // ... unless its copy is held elsewhere.
  inv[1].steps[0].ranks = {2};
  c = ChooseRestore(Travelled(inv), 7, kWorkers, 200);
  EXPECT_TRUE(c.memory);
  EXPECT_EQ(c.sources, (std::vector<std::string>{"local", "local", "replica", "local"}));
  // Persisted on every worker: the root then.
  inv[1].steps[0].ranks = {};
  for (auto& i : inv) i.persisted = 200;
  c = ChooseRestore(Travelled(inv), 7, kWorkers, 200);
  EXPECT_FALSE(c.memory);
  EXPECT_EQ(c.step, 200);
  // A step nobody holds and the root lacks.
  EXPECT_EQ(ChooseRestore(Travelled(Inventories(4, 5, -1)), 7, kWorkers, 5).step, -1);
}

TEST(MemoryNamedRestore, ATrainerAskingForAnotherStepIsNamed) {
  auto inv = Inventories(4, 200, -1);
  EXPECT_EQ(DisagreeingRank(Travelled(inv)), -1);
  inv[3].requested = 300;
  EXPECT_EQ(DisagreeingRank(Travelled(inv)), 3);
  inv[3].requested = -1;  // the latest
  EXPECT_EQ(DisagreeingRank(Travelled(inv)), 3);
}

TEST(MemoryChoiceBounds, TheLargestParityGroupTravelsWhole) {
  // 17 ranks, groups of 16: the last group of one joins the one before (17 members).
  std::vector<std::string> hosts;
  for (int r = 0; r < 17; ++r) hosts.push_back("h" + std::to_string(r));
  MemoryPolicy policy;
  policy.mode = kPar;
  policy.group = MemoryPolicy::kMaxGroup;
  auto layout = PlanMemoryLayout(hosts, policy);
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  ASSERT_EQ(layout->groups.size(), 1u);
  const std::vector<int> group = layout->groups[0];
  ASSERT_EQ(group.size(), 17u);
  EXPECT_LE(group.size(), kMaxRanks);
  // The member that comes last in the group lost its share: rebuilt from parity.
  auto inv = Inventories(17, -1, -1);
  for (int r = 0; r < 17; ++r) {
    if (r != group.back()) inv[r].steps.push_back(Held(5, true, kPar, group));
  }
  std::vector<std::string> workers(hosts.begin(), hosts.end());
  RestoreChoice c = ChooseRestore(Travelled(inv), 7, workers);
  ASSERT_TRUE(c.memory) << c.fallback;
  EXPECT_EQ(c.step, 5);
  ASSERT_EQ(c.plan.size(), 1u);
  EXPECT_EQ(c.plan[0].to, group.back());
  EXPECT_EQ(c.plan[0].group, group);
}

TEST(MemoryTierStore, KeepsTheNewestCommittedAndFreesOldOnesOnlyAfterANewerCommits) {
  MemoryTier tier;
  auto add = [&](int64_t step) {
    auto ck = std::make_shared<MemoryCheckpoint>();
    ck->mesh = "m";
    ck->step = step;
    ck->policy.keep = 2;
    ck->own = ShareBytes::Allocate(100);
    tier.Begin(ck);
  };
  auto steps = [&] {
    std::vector<int64_t> out;
    for (const auto& ck : tier.Committed("m")) out.push_back(ck->step);
    return out;
  };
  add(1);
  tier.Commit("m", 1);
  add(2);
  tier.Commit("m", 2);
  add(3);  // in flight: 1 and 2 stay
  EXPECT_EQ(steps(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(tier.Bytes("m"), 300u);
  tier.Drop("m", 3);  // failed: nothing else changes
  EXPECT_EQ(steps(), (std::vector<int64_t>{1, 2}));
  add(4);
  EXPECT_TRUE(tier.Commit("m", 4));
  EXPECT_EQ(steps(), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(tier.Bytes(), 200u);
  EXPECT_FALSE(tier.Commit("m", 9));
  EXPECT_EQ(tier.Summary()["meshes"]["m"]["steps"], Json::array({2, 4}));
}

}  // namespace
}  // namespace tessera::worker
