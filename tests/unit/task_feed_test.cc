// The worker's side of task delivery: acks, queues, repeats skipped (worker/task_feed.h);
// pushed placements (worker/placements.h); progress reports throttled (worker/throttle.h).
#include <gtest/gtest.h>

#include "worker/placements.h"
#include "worker/task_feed.h"
#include "worker/throttle.h"

namespace tessera::worker {
namespace {

TEST(TaskFeed, AcknowledgesWhatItReceivedAndForgetsAnotherQueuesNumbers) {
  TaskFeed feed;
  EXPECT_EQ(feed.Query(), "&ack=0&meshes=0&queue=");
  feed.Received({{"tasks", Json::array()}, {"ack", 7}, {"queue", "q-1"}, {"meshes", Json::array()},
                 {"meshes_version", 3}});
  EXPECT_EQ(feed.Query(), "&ack=7&meshes=3&queue=q-1");
  // An answer without meshes keeps the version.
  feed.Received({{"tasks", Json::array()}, {"ack", 9}, {"queue", "q-1"}});
  EXPECT_EQ(feed.Query(), "&ack=9&meshes=3&queue=q-1");
  // A fresh tesserad: its numbers replace the old ones, placements included.
  feed.Received({{"tasks", Json::array()}, {"ack", 2}, {"queue", "q-2"}});
  EXPECT_EQ(feed.Query(), "&ack=2&meshes=0&queue=q-2");
}

TEST(TaskFeed, EachTaskStartsOnceAndOnlyTheNewestIdsAreKept) {
  TaskFeed feed(2);
  EXPECT_TRUE(feed.Start("t-1"));
  EXPECT_FALSE(feed.Start("t-1"));
  EXPECT_TRUE(feed.Start("t-2"));
  EXPECT_TRUE(feed.Start("t-3"));  // t-1 is forgotten now
  EXPECT_FALSE(feed.Start("t-3"));
  EXPECT_FALSE(feed.Start("t-2"));
  EXPECT_TRUE(feed.Start("t-1"));
  EXPECT_EQ(feed.started(), 4);
  EXPECT_EQ(feed.repeated(), 3);
}

Json MeshJson(const std::string& name, std::vector<std::string> workers) {
  return {{"name", name}, {"axes", {{{"name", "data"}, {"size", workers.size()}}}},
          {"devices_per_worker", 1}, {"workers", workers}};
}

TEST(Placements, PushedMeshesReplaceEveryPlacement) {
  Placements p;
  ASSERT_TRUE(p.ReplaceAll(Json::array({MeshJson("a", {"w-x", "w-y"}), MeshJson("b", {"w-y"})}),
                           "w-y").ok());
  EXPECT_EQ(p.Names(), (std::vector<std::string>{"a", "b"}));
  ASSERT_TRUE(p.Find("a"));
  EXPECT_EQ(p.Find("a")->rank, 1);
  EXPECT_EQ(p.Find("a")->devices, (std::vector<int64_t>{1}));
  // b was deleted; c does not hold this worker and is named.
  Status st = p.ReplaceAll(Json::array({MeshJson("a", {"w-x", "w-y"}), MeshJson("c", {"w-x"})}), "w-y");
  EXPECT_EQ(st.code(), Code::kConflict) << st.ToString();
  EXPECT_NE(st.ToString().find("mesh c"), std::string::npos) << st.ToString();
  EXPECT_EQ(p.Names(), (std::vector<std::string>{"a"}));
  EXPECT_FALSE(p.Find("b"));
}

TEST(Throttle, FirstFiresOnceAnIntervalHasPassedSinceTheTaskBegan) {
  Throttle t(1000);
  EXPECT_FALSE(t.Due(1000));
  EXPECT_FALSE(t.Due(1000 + Throttle::kIntervalMs - 1));
  EXPECT_TRUE(t.Due(1000 + Throttle::kIntervalMs));
  EXPECT_FALSE(t.Due(1000 + Throttle::kIntervalMs + 1));
  EXPECT_TRUE(t.Due(1000 + 2 * Throttle::kIntervalMs));
}

}  // namespace
}  // namespace tessera::worker
