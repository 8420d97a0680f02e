// What tesserad knows of the memory tier, end to end over HTTP with real workers: rank 0's
// report (PUT /api/v1/meshes/{m}/memory-checkpoints, sent here by the test and by the
// workers after a memory save) shows in the checkpoint list and records beside the
// persisted checkpoints, an older report is ignored, the workers list
// their memory bytes summed over meshes, a deleted mesh's report is forgotten, and a bad
// report is refused naming its field (or 404 for an unknown mesh).
#include <httplib.h>

#include <map>
#include <string>
#include <thread>
#include <vector>

#include "api/clock.h"
#include "cluster_fixture.h"

namespace tessera::e2e {
namespace {

class MemoryTierOverHttp : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tools::ClusterOptions opts;
    opts.workers = 3;
    cluster_ = StartCluster(opts).release();
    ASSERT_NE(cluster_, nullptr);
    // "mem": workers 0 and 1, with persisted checkpoints at steps 10 and 12.
    const Mesh mem{"mem", {{"data", 2}}, 1};
    ASSERT_TRUE(cluster_->PutMesh("mem", MeshToJson(mem)["axes"]).ok());
    Push(*cluster_, mem,
         MakeGlobal("w", DType::kFloat32, {8, 8}, Layout{{"data", "unsharded"}}, 1));
    SaveAndWait(*cluster_, "mem", 10);
    SaveAndWait(*cluster_, "mem", 12);
  }
  static void TearDownTestSuite() { delete cluster_; }

  // A report of `mesh` whose rank r is workers[r] with memory_bytes[r].
  static Json ReportOf(int64_t step, std::vector<int64_t> steps,
                       const std::vector<std::string>& workers,
                       const std::vector<uint64_t>& memory_bytes) {
    Json list = Json::array();
    for (size_t r = 0; r < workers.size(); ++r) {
      list.push_back({{"worker", workers[r]}, {"rank", r}, {"memory_bytes", memory_bytes[r]}});
    }
    return {{"step", step},        {"redundancy", "replica"}, {"replicas", 1},
            {"group", 4},          {"keep", 2},               {"steps", steps},
            {"bytes", 512},        {"workers", list},         {"persisted", 12},
            {"tensors", {{{"name", "w"}, {"dtype", "float32"}, {"shape", {8, 8}}}}}};
  }
  static Json MemReport(int64_t step, std::vector<int64_t> steps) {
    return ReportOf(step, std::move(steps), {W(0), W(1)}, {300, 500});
  }
  static std::string W(int i) { return cluster_->worker_id(i); }

  static Result<Json> Put(const std::string& mesh, const Json& body) {
    return cluster_->Call("PUT", "/api/v1/meshes/" + mesh + "/memory-checkpoints", body);
  }
  static Json Get(const std::string& path) {
    auto r = cluster_->Call("GET", path);
    EXPECT_TRUE(r.ok()) << path << ": " << r.status().ToString();
    return r.ok() ? *r : Json();
  }
  // Each worker's memory_bytes, as GET /api/v1/workers lists them.
  static std::map<std::string, uint64_t> MemoryBytes() {
    std::map<std::string, uint64_t> out;
    for (const Json& w : Get("/api/v1/workers")) {
      EXPECT_TRUE(w.contains("memory_bytes")) << w.dump();
      out[w.value("id", "")] = w.value("memory_bytes", uint64_t{0});
    }
    return out;
  }

  static LocalCluster* cluster_;
};
LocalCluster* MemoryTierOverHttp::cluster_ = nullptr;

// The list's steps with their tiers, newest first.
std::vector<std::pair<int64_t, Json>> StepsAndTiers(const Json& list) {
  std::vector<std::pair<int64_t, Json>> out;
  for (const Json& c : list) {
    out.emplace_back(c.value("step", int64_t{-1}), c.value("tiers", Json()));
  }
  return out;
}

// Reads the event stream from its first kept event until `needle` comes (or 20 s pass).
std::string EventsUntil(LocalCluster& c, const std::string& needle) {
  httplib::Client cli(c.url());
  cli.set_read_timeout(20, 0);
  std::string received;
  cli.Get("/api/v1/events",
          {{"Authorization", "Bearer " + c.token()}, {"Last-Event-ID", "0"}},
          [&](const char* data, size_t n) {
            received.append(data, n);
            return received.find(needle) == std::string::npos && received.size() < (4 << 20);
          });
  return received;
}

TEST_F(MemoryTierOverHttp, TheListAndRecordsShowBothTiers) {
  auto ack = Put("mem", MemReport(13, {12, 13}));
  ASSERT_TRUE(ack.ok()) << ack.status().ToString();
  EXPECT_EQ(*ack, Json({{"acknowledged", true}}));

  const Json mem = {"memory"}, disk = {"persisted"}, both = {"memory", "persisted"};
  using Tiers = std::vector<std::pair<int64_t, Json>>;
  const Json list = Get("/api/v1/meshes/mem/checkpoints");
  EXPECT_EQ(StepsAndTiers(list), (Tiers{{13, mem}, {12, both}, {10, disk}})) << list.dump();
  ASSERT_EQ(list.size(), 3u);
  EXPECT_EQ(list[0]["state"], "committed");
  EXPECT_EQ(list[0]["redundancy"], "replica");
  EXPECT_EQ(list[0]["bytes"], 512);
  EXPECT_EQ(list[0]["tensors"], 1);
  EXPECT_GT(list[1].value("logical_bytes", 0), 0) << "a persisted entry keeps its fields";

  // A step only memory holds has a record with the report's tensors.
  const Json record = Get("/api/v1/meshes/mem/checkpoints/13");
  EXPECT_EQ(record["tiers"], mem);
  EXPECT_EQ(record["state"], "committed");
  EXPECT_EQ(record["redundancy"], "replica");
  EXPECT_EQ(record["tensors"], Json::parse(R"([{"name":"w","dtype":"float32","shape":[8,8]}])"));
  // A persisted one keeps its record, with its tiers; "latest" stays the newest persisted.
  const Json twelve = Get("/api/v1/meshes/mem/checkpoints/12");
  EXPECT_EQ(twelve["tiers"], both);
  EXPECT_EQ(twelve["tensors"][0]["layout"], Json({"data", "unsharded"})) << twelve.dump();
  EXPECT_EQ(Get("/api/v1/meshes/mem/checkpoints/10")["tiers"], disk);
  const Json latest = Get("/api/v1/meshes/mem/checkpoints/latest");
  EXPECT_EQ(latest["step"], 12);
  EXPECT_EQ(latest["tiers"], both);

  // An older report (late, or resent) is acknowledged and ignored.
  ack = Put("mem", MemReport(11, {11}));
  ASSERT_TRUE(ack.ok()) << ack.status().ToString();
  EXPECT_EQ(ack->value("ignored", ""), "older than step 13");
  EXPECT_EQ(StepsAndTiers(Get("/api/v1/meshes/mem/checkpoints")),
            (Tiers{{13, mem}, {12, both}, {10, disk}}));
  // A newer one replaces what tesserad knew: step 12 left the workers' memory.
  ASSERT_TRUE(Put("mem", MemReport(14, {13, 14})).ok());
  EXPECT_EQ(StepsAndTiers(Get("/api/v1/meshes/mem/checkpoints")),
            (Tiers{{14, mem}, {13, mem}, {12, disk}, {10, disk}}));
  auto gone = cluster_->Call("GET", "/api/v1/meshes/mem/checkpoints/11");
  EXPECT_EQ(gone.status().code(), Code::kNotFound) << gone.status().ToString();

  // Each kept report is published; the metric counts both outcomes.
  const std::string events = EventsUntil(*cluster_, R"("steps":[13,14])");
  EXPECT_NE(events.find("event: memory_checkpoint\n"), std::string::npos) << events.substr(0, 2000);
  EXPECT_NE(events.find(R"({"mesh":"mem","step":14,"steps":[13,14]})"), std::string::npos);
  EXPECT_EQ(events.find(R"("step":11,"steps":[11])"), std::string::npos) << "an ignored one too";
  auto metrics = cluster_->Client().Send("GET", "/metrics");
  ASSERT_TRUE(metrics.ok());
  EXPECT_NE(metrics->body.find("tessera_memory_checkpoint_reports_total{outcome=\"ok\"}"),
            std::string::npos);
  EXPECT_NE(metrics->body.find("tessera_memory_checkpoint_reports_total{outcome=\"ignored\"} 1"),
            std::string::npos);
}

TEST_F(MemoryTierOverHttp, TheWorkersOwnReportOfAMemorySaveShowsUp) {
  // The trainers of "mem" save step 20 in memory together (every worker is on 127.0.0.1,
  // hence force); rank 0 reports it once the workers agree.
  std::vector<Result<http::RawResponse>> answers(2, Status(Code::kInternal, "not sent"));
  std::vector<std::thread> trainers;
  for (int i = 0; i < 2; ++i) {
    trainers.emplace_back([&answers, i] {
      answers[i] = cluster_->WorkerClient(i).Send("POST", "/v1/save?mesh=mem&step=20",
                                                  R"({"tier": "memory", "force": true})");
    });
  }
  for (std::thread& t : trainers) t.join();
  for (const auto& a : answers) {
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    ASSERT_EQ(a->status, 200) << a->body;
  }
  Json list;
  (void)::tessera::testing::Eventually([&] {  // until the report is in
    list = Get("/api/v1/meshes/mem/checkpoints");
    return !list.empty() && list[0].value("step", 0) == 20;
  }, std::chrono::seconds(30));
  ASSERT_FALSE(list.empty());
  EXPECT_EQ(list[0]["step"], 20) << list.dump();
  EXPECT_EQ(list[0]["tiers"], Json({"memory"}));
  EXPECT_EQ(list[0]["redundancy"], "replica");
  EXPECT_GE(list[0].value("bytes", uint64_t{0}), 8u * 8u * 4u) << list[0].dump();
  const Json record = Get("/api/v1/meshes/mem/checkpoints/20");
  EXPECT_EQ(record["tensors"], Json::parse(R"([{"name":"w","dtype":"float32","shape":[8,8]}])"));
  // Each worker of the mesh holds its share and a copy of the other's.
  const std::map<std::string, uint64_t> bytes = MemoryBytes();
  EXPECT_GE(bytes.at(W(0)), 2u * 4u * 8u * 4u);
  EXPECT_GE(bytes.at(W(1)), 2u * 4u * 8u * 4u);
  EXPECT_EQ(bytes.at(W(2)), 0u);
  // "latest" stays the newest persisted checkpoint.
  EXPECT_EQ(Get("/api/v1/meshes/mem/checkpoints/latest")["step"], 12);
}

TEST_F(MemoryTierOverHttp, WorkersShowTheirMemoryBytesSummedOverMeshes) {
  // "pair": workers 1 and 2, so worker 1 is in two meshes.
  ASSERT_TRUE(cluster_->PutMesh("pair", Json::parse(R"([{"name":"data","size":2}])"), 1, 1).ok());
  // Of a later timeline than the workers' own report of "mem" (the suite in one process).
  Json report = MemReport(20, {19, 20});
  report["timeline"] = WallMs();
  ASSERT_TRUE(Put("mem", report).ok());
  const std::map<std::string, uint64_t> before = MemoryBytes();
  EXPECT_EQ(before.at(W(0)), 300u);
  EXPECT_EQ(before.at(W(1)), 500u);
  EXPECT_EQ(before.at(W(2)), 0u);

  ASSERT_TRUE(Put("pair", ReportOf(4, {4}, {W(1), W(2)}, {70, 90})).ok());
  using Bytes = std::map<std::string, uint64_t>;
  EXPECT_EQ(MemoryBytes(), (Bytes{{W(0), 300}, {W(1), 570}, {W(2), 90}}));
  EXPECT_EQ(Get("/api/v1/workers/" + W(1))["memory_bytes"], 570);
  EXPECT_EQ(Get("/api/v1/workers/" + W(2))["memory_bytes"], 90);

  // A deleted mesh takes its report along; registered again, it starts clean.
  ASSERT_TRUE(cluster_->Call("DELETE", "/api/v1/meshes/pair").ok());
  EXPECT_EQ(MemoryBytes(), before);
  ASSERT_TRUE(cluster_->PutMesh("pair", Json::parse(R"([{"name":"data","size":2}])"), 1, 1).ok());
  EXPECT_EQ(Get("/api/v1/meshes/pair/checkpoints"), Json::array());
  ASSERT_TRUE(Put("pair", ReportOf(1, {1}, {W(1), W(2)}, {7, 9})).ok())
      << "an older step is new to the mesh registered again";
  EXPECT_EQ(MemoryBytes(), (Bytes{{W(0), 300}, {W(1), 507}, {W(2), 9}}));
}

TEST_F(MemoryTierOverHttp, ABadReportIsRefusedNamingTheField) {
  struct Case {
    std::string what;
    Json body;
    std::string field;
  };
  Json wrong_worker = MemReport(30, {30});
  wrong_worker["workers"][1]["worker"] = W(2);
  Json outside = MemReport(30, {30});
  outside["workers"][1]["rank"] = 2;
  Json twice = MemReport(30, {30});
  twice["workers"][1]["rank"] = 0;
  Json bad_tensor = MemReport(30, {30});
  bad_tensor["tensors"][0]["dtype"] = "float7";
  Json no_steps = MemReport(30, {30});
  no_steps.erase("steps");
  Json raid = MemReport(30, {30});
  raid["redundancy"] = "raid";
  const std::vector<Case> cases = {
      {"a worker that is not its rank's", wrong_worker, "workers[1].worker"},
      {"a rank outside the mesh", outside, "workers[1].rank"},
      {"a rank twice", twice, "workers[1].rank"},
      {"a step below 0", MemReport(-1, {0}), "step"},
      {"steps descending", MemReport(30, {30, 29}), "steps[1]"},
      {"steps without the step", MemReport(30, {28, 29}), "steps"},
      {"no steps", no_steps, "steps"},
      {"a bad redundancy", raid, "redundancy"},
      {"a bad dtype", bad_tensor, "tensors[0].dtype"},
      {"a list for a body", Json::array(), "request body"},
  };
  http::Client client = cluster_->Client();
  for (const Case& c : cases) {
    auto r = client.Send("PUT", "/api/v1/meshes/mem/memory-checkpoints", c.body.dump());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->status, 400) << c.what << ": " << r->body;
    const Json error = Json::parse(r->body, nullptr, false)["error"];
    EXPECT_EQ(error["code"], "invalid_argument") << c.what << ": " << r->body;
    EXPECT_EQ(error["details"]["field"], c.field) << c.what << ": " << r->body;
  }
  // The worker that is not its rank's is named, with the one the mesh has there.
  auto r = client.Send("PUT", "/api/v1/meshes/mem/memory-checkpoints", wrong_worker.dump());
  ASSERT_TRUE(r.ok());
  const Json details = Json::parse(r->body)["error"]["details"];
  EXPECT_EQ(details["worker"], W(2));
  EXPECT_EQ(details["rank"], 1);
  EXPECT_EQ(details["expected"], W(1));
  EXPECT_NE(r->body.find(W(2)), std::string::npos);
  // Not JSON at all; an unknown mesh; a name that is no mesh name.
  r = client.Send("PUT", "/api/v1/meshes/mem/memory-checkpoints", "{\"step\":");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 400) << r->body;
  r = client.Send("PUT", "/api/v1/meshes/nope/memory-checkpoints", MemReport(30, {30}).dump());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 404) << r->body;
  EXPECT_EQ(Json::parse(r->body)["error"]["details"]["mesh"], "nope");
  r = client.Send("PUT", "/api/v1/meshes/a%20b/memory-checkpoints", MemReport(30, {30}).dump());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 400) << r->body;
  // Without the token, nothing.
  http::Client anonymous(cluster_->url(), "");
  r = anonymous.Send("PUT", "/api/v1/meshes/mem/memory-checkpoints", MemReport(30, {30}).dump());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 401);
  // None of these changed what tesserad knows.
  for (const Json& c : Get("/api/v1/meshes/mem/checkpoints")) EXPECT_NE(c["step"], 30) << c.dump();
}

}  // namespace
}  // namespace tessera::e2e
