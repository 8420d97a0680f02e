// The memory tier as tesserad knows it: rank 0's report decoded at the door (every bad
// field named by its path), the registry of the newest report per mesh (an older one
// ignored, a newer or equal one replacing it, a deleted mesh's forgotten, the workers'
// bytes summed over meshes), and how the checkpoint list and records show the tiers.
#include <gtest/gtest.h>

#include <functional>
#include <map>

#include "api/memory_report.h"
#include "service/memory_checkpoints.h"

namespace tessera::service {
namespace {

Json ReportJson(int64_t step, std::vector<int64_t> steps,
                std::vector<std::pair<std::string, uint64_t>> workers = {{"w-a", 100},
                                                                         {"w-b", 200}}) {
  Json list = Json::array();
  for (size_t rank = 0; rank < workers.size(); ++rank) {
    list.push_back({{"worker", workers[rank].first},
                    {"rank", rank},
                    {"memory_bytes", workers[rank].second}});
  }
  return {{"step", step},
          {"redundancy", "replica"},
          {"replicas", 1},
          {"group", 4},
          {"parity", 1},
          {"keep", 2},
          {"steps", steps},
          {"bytes", 4096},
          {"tensors", {{{"name", "w"}, {"dtype", "float32"}, {"shape", {32, 32}}}}},
          {"workers", list},
          {"persisted", nullptr}};
}

MemoryCheckpointReport Report(int64_t step, std::vector<int64_t> steps,
                              std::vector<std::pair<std::string, uint64_t>> workers = {
                                  {"w-a", 100}, {"w-b", 200}}) {
  auto r = MemoryCheckpointReport::FromJson(ReportJson(step, std::move(steps), std::move(workers)));
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : MemoryCheckpointReport{};
}

TEST(MemoryCheckpointReport, DecodesOnceAndRoundTrips) {
  Json body = ReportJson(12, {11, 12});
  body["persisted"] = 10;
  auto r = MemoryCheckpointReport::FromJson(body);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->step, 12);
  EXPECT_EQ(r->steps, (std::vector<int64_t>{11, 12}));
  EXPECT_EQ(r->persisted, 10);
  ASSERT_EQ(r->workers.size(), 2u);
  EXPECT_EQ(r->workers[1].worker, "w-b");
  EXPECT_EQ(r->workers[1].memory_bytes, 200u);
  EXPECT_EQ(r->ToJson(), body);
  EXPECT_TRUE(r->Holds(11));
  EXPECT_FALSE(r->Holds(10));
  // The save's options take their defaults when absent.
  body["persisted"] = -1;  // none, as workers say it
  EXPECT_FALSE(MemoryCheckpointReport::FromJson(body)->persisted.has_value());
  for (const char* key : {"replicas", "group", "parity", "keep", "persisted"}) body.erase(key);
  auto defaults = MemoryCheckpointReport::FromJson(body);
  ASSERT_TRUE(defaults.ok()) << defaults.status().ToString();
  EXPECT_EQ(defaults->replicas, 1);
  EXPECT_EQ(defaults->group, 4);
  EXPECT_EQ(defaults->parity, 1);
  EXPECT_EQ(defaults->keep, 2);
  EXPECT_FALSE(defaults->persisted.has_value());
}

TEST(MemoryCheckpointReport, EveryBadFieldIsNamedByItsPath) {
  const std::vector<std::pair<std::function<void(Json&)>, std::string>> cases = {
      {[](Json& b) { b.erase("step"); }, "step"},
      {[](Json& b) { b["step"] = "12"; }, "step"},
      {[](Json& b) { b["step"] = -1; }, "step"},
      {[](Json& b) { b["redundancy"] = "mirror"; }, "redundancy"},
      {[](Json& b) { b.erase("redundancy"); }, "redundancy"},
      {[](Json& b) { b["replicas"] = 0; }, "replicas"},
      {[](Json& b) { b["group"] = 1; }, "group"},
      {[](Json& b) { b["keep"] = 17; }, "keep"},
      {[](Json& b) { b["keep"] = 1.5; }, "keep"},
      {[](Json& b) { b.erase("steps"); }, "steps"},
      {[](Json& b) { b["steps"] = 12; }, "steps"},
      {[](Json& b) { b["steps"] = {12, 11}; }, "steps[1]"},
      {[](Json& b) { b["steps"] = {11, 11, 12}; }, "steps[1]"},
      {[](Json& b) { b["steps"] = {-1, 12}; }, "steps[0]"},
      {[](Json& b) { b["steps"] = {10, 11}; }, "steps"},
      {[](Json& b) { b["bytes"] = -5; }, "bytes"},
      {[](Json& b) { b["tensors"] = Json::object(); }, "tensors"},
      {[](Json& b) { b["tensors"][0] = "w"; }, "tensors[0]"},
      {[](Json& b) { b["tensors"][0]["name"] = "../w"; }, "tensors[0].name"},
      {[](Json& b) { b["tensors"][0]["dtype"] = "float7"; }, "tensors[0].dtype"},
      {[](Json& b) { b["tensors"][0]["shape"] = {-1}; }, "tensors[0].shape"},
      {[](Json& b) { b["tensors"].push_back(b["tensors"][0]); }, "tensors[1].name"},
      {[](Json& b) { b.erase("workers"); }, "workers"},
      {[](Json& b) { b["workers"][1].erase("worker"); }, "workers[1].worker"},
      {[](Json& b) { b["workers"][1]["rank"] = "1"; }, "workers[1].rank"},
      {[](Json& b) { b["workers"][1]["rank"] = -1; }, "workers[1].rank"},
      {[](Json& b) { b["workers"][1]["rank"] = 0; }, "workers[1].rank"},
      {[](Json& b) { b["workers"][0]["memory_bytes"] = -1; }, "workers[0].memory_bytes"},
      {[](Json& b) { b["persisted"] = -2; }, "persisted"},
  };
  for (const auto& [spoil, field] : cases) {
    Json body = ReportJson(12, {11, 12});
    spoil(body);
    Status st = MemoryCheckpointReport::FromJson(body).status();
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << body.dump();
    ASSERT_TRUE(st.details().is_object()) << st.ToString();
    EXPECT_EQ(st.details().value("field", ""), field) << st.ToString();
  }
  EXPECT_EQ(MemoryCheckpointReport::FromJson(Json::array()).status().details().value("field", ""),
            "request body");
}

TEST(MemoryCheckpoints, AnOlderReportIsIgnoredAndANewerOrEqualOneReplaces) {
  MemoryCheckpoints memory;
  EXPECT_EQ(memory.Get("m"), nullptr);
  EXPECT_EQ(memory.Put("m", Report(12, {11, 12})), std::nullopt);
  // Out of order: the report of step 11 came late.
  EXPECT_EQ(memory.Put("m", Report(11, {10, 11})), 12);
  ASSERT_NE(memory.Get("m"), nullptr);
  EXPECT_EQ(memory.Get("m")->steps, (std::vector<int64_t>{11, 12}));
  // The same step again (rank 0 resends it once tesserad is back) replaces it.
  EXPECT_EQ(memory.Put("m", Report(12, {12})), std::nullopt);
  EXPECT_EQ(memory.Get("m")->steps, (std::vector<int64_t>{12}));
  EXPECT_EQ(memory.Put("m", Report(13, {12, 13})), std::nullopt);
  EXPECT_EQ(memory.Get("m")->step, 13);
  // A copy handed out stays as it was.
  MemoryCheckpoints::Report held = memory.Get("m");
  EXPECT_EQ(memory.Put("m", Report(14, {13, 14})), std::nullopt);
  EXPECT_EQ(held->step, 13);
}

TEST(MemoryCheckpoints, ALaterTimelineReplacesLargerStepsAndAnEarlierOneIsIgnored) {
  MemoryCheckpoints memory;
  auto report = [](int64_t step, std::vector<int64_t> steps, int64_t timeline) {
    Json j = ReportJson(step, std::move(steps));
    j["timeline"] = timeline;
    auto r = MemoryCheckpointReport::FromJson(j);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->ToJson(), j);
    return *r;
  };
  EXPECT_EQ(memory.Put("m", Report(300, {200, 300})), std::nullopt);
  // The trainers went back to step 100: step 101 begins a later timeline.
  EXPECT_EQ(memory.Put("m", report(101, {101}, 5000)), std::nullopt);
  EXPECT_EQ(memory.Get("m")->steps, (std::vector<int64_t>{101}));
  // The abandoned timeline's report, resent late, is older.
  EXPECT_EQ(memory.Put("m", Report(300, {200, 300})), 101);
  EXPECT_EQ(memory.Put("m", report(300, {200, 300}, 4000)), 101);
  EXPECT_EQ(memory.Put("m", report(102, {101, 102}, 5000)), std::nullopt);
  EXPECT_EQ(memory.Get("m")->step, 102);
  Json bad = ReportJson(1, {1});
  bad["timeline"] = -1;
  EXPECT_EQ(MemoryCheckpointReport::FromJson(bad).status().details().value("field", ""), "timeline");
}

TEST(MemoryCheckpoints, ADeletedMeshIsForgotten) {
  MemoryCheckpoints memory;
  EXPECT_EQ(memory.Put("m", Report(12, {12})), std::nullopt);
  EXPECT_EQ(memory.Put("n", Report(3, {3})), std::nullopt);
  memory.Forget("m");
  EXPECT_EQ(memory.Get("m"), nullptr);
  ASSERT_NE(memory.Get("n"), nullptr);
  // A mesh registered again under the name starts clean: an older step is taken.
  EXPECT_EQ(memory.Put("m", Report(1, {1})), std::nullopt);
  EXPECT_EQ(memory.Get("m")->step, 1);
  memory.Forget("nope");  // nothing to forget
}

TEST(MemoryCheckpoints, AWorkersBytesAreSummedOverTheNewestReportOfEachMesh) {
  MemoryCheckpoints memory;
  EXPECT_TRUE(memory.WorkerBytes().empty());
  EXPECT_EQ(memory.Put("m", Report(1, {1}, {{"w-a", 100}, {"w-b", 200}})), std::nullopt);
  EXPECT_EQ(memory.Put("n", Report(1, {1}, {{"w-b", 30}, {"w-c", 40}})), std::nullopt);
  using Bytes = std::map<std::string, uint64_t>;
  EXPECT_EQ(memory.WorkerBytes(), (Bytes{{"w-a", 100}, {"w-b", 230}, {"w-c", 40}}));
  // A newer report replaces the mesh's bytes; an older one changes nothing.
  EXPECT_EQ(memory.Put("m", Report(2, {1, 2}, {{"w-a", 150}, {"w-b", 250}})), std::nullopt);
  EXPECT_EQ(memory.Put("m", Report(1, {1}, {{"w-a", 1}, {"w-b", 1}})), 2);
  EXPECT_EQ(memory.WorkerBytes(), (Bytes{{"w-a", 150}, {"w-b", 280}, {"w-c", 40}}));
  memory.Forget("n");
  EXPECT_EQ(memory.WorkerBytes(), (Bytes{{"w-a", 150}, {"w-b", 250}}));
}

Json Entry(int64_t step, const std::string& state) {
  return {{"mesh", "m"}, {"step", step}, {"state", state}, {"tensors", 3}};
}

std::vector<std::pair<int64_t, Json>> StepsAndTiers(const std::vector<Json>& list) {
  std::vector<std::pair<int64_t, Json>> out;
  for (const Json& e : list) out.emplace_back(e["step"].get<int64_t>(), e["tiers"]);
  return out;
}

TEST(TiersOfCheckpoints, TheListShowsBothTiersNewestFirst) {
  const std::vector<Json> persisted = {Entry(30, "committed"), Entry(20, "writing"),
                                       Entry(12, "committed"), Entry(5, "committed")};
  const MemoryCheckpointReport memory = Report(20, {12, 16, 20});
  const std::vector<Json> list = WithMemoryTier("m", persisted, &memory);
  const Json mem = {"memory"}, disk = {"persisted"}, both = {"memory", "persisted"};
  using Tiers = std::vector<std::pair<int64_t, Json>>;
  EXPECT_EQ(StepsAndTiers(list),
            (Tiers{{30, disk}, {20, mem}, {16, mem}, {12, both}, {5, disk}}));
  // The catalog's entries keep what they had; a step only memory holds is committed there.
  EXPECT_EQ(list[1]["state"], "writing");
  EXPECT_EQ(list[3]["tensors"], 3);
  const Json& only = list[2];
  EXPECT_EQ(only["mesh"], "m");
  EXPECT_EQ(only["state"], "committed");
  EXPECT_EQ(only["redundancy"], "replica");
  EXPECT_EQ(only["replicas"], 1);
  EXPECT_EQ(only["bytes"], 4096);
  EXPECT_EQ(only["tensors"], 1);
  // Without a report, or without a catalog entry, one tier alone.
  EXPECT_EQ(StepsAndTiers(WithMemoryTier("m", persisted, nullptr)),
            (Tiers{{30, disk}, {20, Json::array()}, {12, disk}, {5, disk}}));
  EXPECT_EQ(StepsAndTiers(WithMemoryTier("m", {}, &memory)),
            (Tiers{{20, mem}, {16, mem}, {12, mem}}));
  // Memory steps newer and older than every persisted one.
  EXPECT_EQ(StepsAndTiers(WithMemoryTier("m", {Entry(15, "committed")}, &memory)),
            (Tiers{{20, mem}, {16, mem}, {15, disk}, {12, mem}}));
}

TEST(TiersOfCheckpoints, AStepOnlyMemoryHoldsHasARecordWithTheReportsTensors) {
  MemoryCheckpointReport memory = Report(20, {16, 20});
  memory.redundancy = "parity";
  memory.group = 3;
  memory.parity = 2;
  for (int64_t step : {16, 20}) {
    const Json record = MemoryCheckpointRecord("m", memory, step);
    EXPECT_EQ(record["step"], step);
    EXPECT_EQ(record["state"], "committed");
    EXPECT_EQ(record["tiers"], Json({"memory"}));
    EXPECT_EQ(record["redundancy"], "parity");
    EXPECT_EQ(record["group"], 3);
    EXPECT_EQ(record["parity"], 2);
    EXPECT_FALSE(record.contains("replicas"));
    EXPECT_EQ(record["tensors"],
              Json::parse(R"([{"name": "w", "dtype": "float32", "shape": [32, 32]}])"));
  }
  EXPECT_EQ(Tiers(false, false), Json::array());
  EXPECT_EQ(Tiers(true, true), Json({"memory", "persisted"}));
}

}  // namespace
}  // namespace tessera::service
