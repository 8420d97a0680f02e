// POST /api/v1/meshes/{m}/checkpoints/{step}/persist, end to end with real workers: a
// memory checkpoint is written to the root from the workers' RAM as a save job (with
// its metadata, whatever the tensors hold since), restores from the root bit for bit,
// and what cannot be persisted is refused naming why.
#include <thread>
#include <vector>

#include "cluster_fixture.h"
#include "tests/unit/eventually.h"

namespace tessera::e2e {
namespace {

using ::tessera::testing::Eventually;

const Mesh kMesh{"p", {{"data", 2}}, 1};

class MemoryPersist : public ::testing::Test {
 protected:
  void SetUp() override {
    tools::ClusterOptions opts;
    opts.workers = 2;
    cluster_ = StartCluster(opts);
    ASSERT_NE(cluster_, nullptr);
    ASSERT_TRUE(cluster_->PutMesh("p", MeshToJson(kMesh)["axes"]).ok());
  }

  // Both trainers save `step` in memory together (every worker is on 127.0.0.1: force).
  void MemorySave(int64_t step, const Json& metadata) {
    std::vector<Result<http::RawResponse>> answers(2, Status(Code::kInternal, "not sent"));
    const std::string body = Json{{"tier", "memory"}, {"force", true}, {"metadata", metadata}}.dump();
    std::vector<std::thread> trainers;
    for (int i = 0; i < 2; ++i) {
      trainers.emplace_back([&, i] {
        answers[i] = cluster_->WorkerClient(i).Send(
            "POST", "/v1/save?mesh=p&step=" + std::to_string(step) + "&wait=committed", body);
      });
    }
    for (std::thread& t : trainers) t.join();
    for (const auto& a : answers) {
      ASSERT_TRUE(a.ok()) << a.status().ToString();
      ASSERT_EQ(a->status, 200) << a->body;
    }
    // tesserad knows it once rank 0 reported it.
    ASSERT_TRUE(Eventually([&] {
      auto record = cluster_->Call("GET", "/api/v1/meshes/p/checkpoints/" + std::to_string(step));
      return record.ok() && (*record)["tiers"] == Json({"memory"});
    }));
  }

  Result<Json> Persist(const std::string& mesh, const std::string& step, const Json& body) {
    return cluster_->Call("POST", "/api/v1/meshes/" + mesh + "/checkpoints/" + step + "/persist",
                          body);
  }

  std::unique_ptr<LocalCluster> cluster_;
};

TEST_F(MemoryPersist, WritesTheMemoryCheckpointToTheRootAsAJob) {
  const GlobalTensor saved = MakeGlobal("w", DType::kFloat32, {64, 16}, Layout{{"data", "unsharded"}}, 1);
  Push(*cluster_, kMesh, saved);
  MemorySave(5, {{"note", "step five"}});
  // The trainers go on: what the store holds now is not what step 5 holds.
  const GlobalTensor later = MakeGlobal("w", DType::kFloat32, {64, 16}, Layout{{"data", "unsharded"}}, 2);
  Push(*cluster_, kMesh, later);

  auto started = Persist("p", "5", Json::object());
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  const Json job = Wait(*cluster_, started->value("job", ""));
  EXPECT_EQ(job.value("state", ""), "succeeded") << job.dump();
  EXPECT_EQ(job.value("kind", ""), "save") << job.dump();
  EXPECT_EQ(job["request"].value("from_memory", false), true) << job.dump();
  EXPECT_EQ(job["progress"].value("done_bytes", uint64_t{0}), saved.bytes.size()) << job.dump();

  auto record = cluster_->Call("GET", "/api/v1/meshes/p/checkpoints/5");
  ASSERT_TRUE(record.ok()) << record.status().ToString();
  EXPECT_EQ((*record)["state"], "committed") << record->dump();
  EXPECT_EQ((*record)["tiers"], Json({"memory", "persisted"})) << record->dump();
  EXPECT_EQ((*record)["metadata"], Json({{"note", "step five"}})) << record->dump();
  // From the root (a REST restore reads the root): step 5's bytes, not the store's.
  const Json restored = RestoreAndWait(*cluster_, "p", "5", Json::object());
  EXPECT_EQ(restored.value("state", ""), "succeeded") << restored.dump();
  ExpectShards(*cluster_, kMesh, saved, saved.layout);

  // Persisted already; a step the memory tier does not hold; fields a persist takes not.
  auto again = Persist("p", "5", Json::object());
  EXPECT_EQ(again.status().code(), Code::kConflict) << again.status().ToString();
  auto absent = Persist("p", "6", Json::object());
  EXPECT_EQ(absent.status().code(), Code::kNotFound) << absent.status().ToString();
  EXPECT_EQ(absent.status().details()["memory_steps"], Json({5})) << absent.status().ToString();
  auto subset = Persist("p", "5", {{"tensors", {"w"}}});
  EXPECT_EQ(subset.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(subset.status().details().value("field", ""), "tensors");
  EXPECT_EQ(Persist("nomesh", "5", Json::object()).status().code(), Code::kNotFound);
  EXPECT_EQ(Persist("p", "x", Json::object()).status().code(), Code::kInvalidArgument);
}

TEST_F(MemoryPersist, AWorkerThatNoLongerHoldsTheStepFailsItNamed) {
  Push(*cluster_, kMesh, MakeGlobal("w", DType::kFloat32, {8, 4}, Layout{{"data", "unsharded"}}, 3));
  MemorySave(7, Json::object());
  // Worker 1 restarts with empty RAM: tesserad still lists step 7 (rank 0 holds it).
  const std::string path = "/api/v1/workers/" + cluster_->worker_id(1);
  auto before = cluster_->Call("GET", path);
  ASSERT_TRUE(before.ok()) << before.status().ToString();
  cluster_->KillWorker(1);
  ASSERT_TRUE(cluster_->RestartWorker(1).ok());
  ASSERT_TRUE(Eventually([&] {  // registered again (its local API on a new port), alive
    auto now = cluster_->Call("GET", path);
    return now.ok() && (*now)["local_port"] != (*before)["local_port"] &&
           (*now)["state"] == "alive";
  }));
  auto started = Persist("p", "7", Json::object());
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  const Json job = Wait(*cluster_, started->value("job", ""));
  EXPECT_EQ(job.value("state", ""), "failed") << job.dump();
  EXPECT_EQ(job["error"]["details"].value("worker", ""), cluster_->worker_id(1)) << job.dump();
  EXPECT_NE(job["error"].value("message", "").find("holds no memory checkpoint of step 7"),
            std::string::npos)
      << job.dump();
  auto record = cluster_->Call("GET", "/api/v1/meshes/p/checkpoints/7");
  ASSERT_TRUE(record.ok());
  EXPECT_EQ((*record)["tiers"], Json({"memory"})) << record->dump();
}

}  // namespace
}  // namespace tessera::e2e
