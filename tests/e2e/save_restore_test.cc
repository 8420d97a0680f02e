// End to end over real processes on loopback: sharded save and restore,
// resharding, trainer-driven saves with snapshot semantics, retention, cancel.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <filesystem>
#include <optional>
#include <thread>

#include "cluster_fixture.h"
#include "storage/checkpoint_dir.h"
#include "storage/index.h"

namespace tessera::e2e {
namespace {

const Mesh kMesh{"m", {{"data", 2}, {"model", 2}}, 1};

std::vector<GlobalTensor> MixedTensors(uint64_t seed) {
  auto L = [](std::vector<std::string> d) { return Layout{std::move(d)}; };
  std::vector<GlobalTensor> out;
  // Every dtype; sharded on both axes, partly sharded, replicated, scalar.
  int i = 0;
  for (DType d : AllDTypes()) {
    Layout layout = i % 4 == 0   ? L({"data", "model"})
                    : i % 4 == 1 ? L({"unsharded", "model"})
                    : i % 4 == 2 ? L({"data", "unsharded"})
                                 : L({"unsharded", "unsharded"});
    out.push_back(MakeGlobal("t/" + std::string(DTypeName(d)), d, {16, 8}, layout, seed + i));
    ++i;
  }
  out.push_back(MakeGlobal("scalar", DType::kInt64, {}, Layout{}, seed + 99));
  return out;
}

TEST(SaveRestore, EveryDtypeAndLayoutRoundTripsAndReshards) {
  auto c = StartCluster();
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->PutMesh("m", MeshToJson(kMesh)["axes"]).ok());
  auto saved = MixedTensors(1);
  for (const auto& t : saved) Push(*c, kMesh, t);
  Json job = SaveAndWait(*c, "m", 5, {{"metadata", {{"lr", 0.5}}}});
  EXPECT_EQ(job["phase"], "done");
  EXPECT_EQ(job["progress"]["done_bytes"], job["progress"]["total_bytes"]);

  // The checkpoint is listed, latest, and has every tensor.
  auto latest = c->Call("GET", "/api/v1/meshes/m/checkpoints/latest");
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ((*latest)["step"], 5);
  EXPECT_EQ((*latest)["state"], "committed");
  EXPECT_EQ((*latest)["tensors"].size(), saved.size());
  EXPECT_EQ((*latest)["metadata"]["lr"], 0.5);

  // Replicated data is written once: one slice per distinct shard in the index.
  auto index = storage::CheckpointIndex::Open(
      storage::DefaultEnv(), storage::CheckpointDir(c->checkpoint_root(), "m", 5));
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  for (const auto& t : saved) {
    const auto* e = index->Find(t.name);
    ASSERT_NE(e, nullptr) << t.name;
    EXPECT_EQ(e->slices.size(), DistinctSlices(kMesh, t.layout, t.shape).size()) << t.name;
  }

  // Trainers move on; restore brings step 5 back on the same mesh.
  for (const auto& t : MixedTensors(2)) Push(*c, kMesh, t);
  Json restored = RestoreAndWait(*c, "m", "5", Json::object());
  ASSERT_EQ(restored["state"], "succeeded") << restored.dump();
  for (const auto& t : saved) ExpectShards(*c, kMesh, t, t.layout);

  // Resharding onto {data:4} and onto another layout gives the same global tensors.
  const Mesh four{"four", {{"data", 4}}, 1};
  ASSERT_TRUE(c->PutMesh("four", MeshToJson(four)["axes"]).ok());
  Json layouts = {{"t/float32", {"unsharded", "data"}}, {"t/int8", {"data", "unsharded"}}};
  restored = RestoreAndWait(*c, "m", "latest", {{"target_mesh", "four"}, {"layouts", layouts}});
  ASSERT_EQ(restored["state"], "succeeded") << restored.dump();
  for (const auto& tj : restored["result"]["layouts"]) {
    auto it = std::find_if(saved.begin(), saved.end(), [&](auto& t) { return t.name == tj["name"]; });
    ASSERT_NE(it, saved.end());
    Layout layout = *LayoutFromJson(tj["layout"]);
    if (it->name == "t/float32") {
      EXPECT_EQ(layout, (Layout{{"unsharded", "data"}}));
    }
    ExpectShards(*c, four, *it, layout);
  }
}

// Names may contain '/': a worker named rack/7-<i> heartbeats, gets its tasks,
// saves and restores like any other.
TEST(SaveRestore, WorkersWithSlashesInTheirNames) {
  tools::ClusterOptions opts;
  opts.worker_name_prefix = "rack/7-";
  auto c = StartCluster(opts);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->worker_id(2), "w-rack/7-2");
  auto worker = c->Call("GET", "/api/v1/workers/" + http::PercentEncodeSegment(c->worker_id(2)));
  ASSERT_TRUE(worker.ok()) << worker.status().ToString();
  EXPECT_EQ((*worker)["state"], "alive");
  ASSERT_TRUE(c->PutMesh("m", MeshToJson(kMesh)["axes"]).ok());  // its self-test runs tasks
  auto saved = MixedTensors(5);
  for (const auto& t : saved) Push(*c, kMesh, t);
  SaveAndWait(*c, "m", 1);
  Json r = RestoreAndWait(*c, "m", "1", {{"tensors", {"t/int32"}}});
  EXPECT_EQ(r["state"], "succeeded") << r.dump();
}

// What a worker's saves build on goes to tesserad with its task polls; a worker that
// saved into many meshes has more to say than a request line holds (8 KiB here): it still
// gets its tasks, and its next save commits.
TEST(SaveRestore, AWorkerInManyMeshesKeepsGettingTasks) {
  tools::ClusterOptions opts;
  opts.workers = 1;
  auto c = StartCluster(opts);
  ASSERT_TRUE(c);
  const std::string pad(100, 'x');
  for (int i = 0; i < 80; ++i) {
    const std::string name = "mesh-" + std::to_string(i) + "-" + pad;
    const Mesh mesh{name, {{"data", 1}}, 1};
    ASSERT_TRUE(c->PutMesh(name, MeshToJson(mesh)["axes"]).ok()) << name;
    Push(*c, mesh, MakeGlobal("w", DType::kFloat32, {4}, Layout{std::vector<std::string>{"unsharded"}}, i));
    SaveAndWait(*c, name, 1);
    if (HasFailure()) return;
  }
}

TEST(SaveRestore, SubsetInOrderWithDtypeAndShapeChecks) {
  auto c = StartCluster();
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->PutMesh("m", MeshToJson(kMesh)["axes"]).ok());
  auto saved = MixedTensors(3);
  for (const auto& t : saved) Push(*c, kMesh, t);
  SaveAndWait(*c, "m", 1);
  Json r = RestoreAndWait(*c, "m", "1", {{"tensors", {"t/int32", "t/bool"}}});
  ASSERT_EQ(r["state"], "succeeded");
  EXPECT_EQ(r["result"]["tensors"], Json({"t/int32", "t/bool"}));  // the order given

  // What cannot work is refused at the door (400, no job), naming the tensor and field.
  auto refused = [&](const Json& body) {
    auto started = c->Call("POST", "/api/v1/meshes/m/checkpoints/1/restore", body);
    EXPECT_FALSE(started.ok()) << body.dump() << " started job " << started->dump();
    return started.ok() ? Status::Ok() : started.status();
  };
  Status st = refused({{"tensors", {{{"name", "t/int32"}, {"dtype", "int32"}, {"shape", {4, 4}}}}}});
  EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.ToString();
  EXPECT_EQ(st.details().value("tensor", ""), "t/int32");
  EXPECT_EQ(st.details().value("field", ""), "shape");
  EXPECT_NE(st.message().find("[16,8]"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("[4,4]"), std::string::npos) << st.ToString();

  st = refused({{"tensors", {{{"name", "t/int32"}, {"dtype", "float16"}}}}});
  EXPECT_EQ(st.details().value("tensor", ""), "t/int32");
  EXPECT_EQ(st.details().value("field", ""), "dtype");
  EXPECT_NE(st.message().find("float16"), std::string::npos);

  st = refused({{"tensors", {"nope"}}});
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_EQ(st.details().value("tensor", ""), "nope");
  EXPECT_EQ(st.details().value("field", ""), "tensors");

  // A layout that does not fit the target mesh: t/int32 is [16,8]; mesh m is {data:2, model:2}.
  st = refused({{"tensors", {"t/int32"}}, {"layouts", {{"t/int32", {"nope_axis", "unsharded"}}}}});
  EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.ToString();
  EXPECT_EQ(st.details().value("tensor", ""), "t/int32");
  EXPECT_EQ(st.details().value("field", ""), "layouts.t/int32");
  // A layout for a tensor the restore leaves out.
  st = refused({{"tensors", {"t/int32"}}, {"layouts", {{"t/bool", {"data", "unsharded"}}}}});
  EXPECT_EQ(st.details().value("tensor", ""), "t/bool");
  // Not a worker of the target mesh.
  st = refused({{"workers", {"w-nobody"}}});
  EXPECT_EQ(st.details().value("field", ""), "workers");
  // Nothing was started for any of them.
  auto jobs = c->Call("GET", "/api/v1/jobs?kind=restore&state=failed");
  ASSERT_TRUE(jobs.ok());
  EXPECT_TRUE(jobs->empty()) << jobs->dump();

  // A tensor the workers hold with another shape: Install refuses, naming both.
  auto other = MakeGlobal("t/int32", DType::kInt32, {32, 8}, Layout{{"data", "model"}}, 9);
  Mesh m2{"m2", {{"data", 2}, {"model", 2}}, 1};
  ASSERT_TRUE(c->PutMesh("m2", MeshToJson(m2)["axes"]).ok());
  Push(*c, m2, other);
  r = RestoreAndWait(*c, "m", "1", {{"target_mesh", "m2"}, {"tensors", {"t/int32"}}});
  ASSERT_EQ(r["state"], "failed");
  EXPECT_NE(r["error"]["message"].get<std::string>().find("t/int32"), std::string::npos);
}

// The in-loop save's create-or-join, as a worker calls it: 201 for the first call, 200
// for a join (or a repeat), 409 only for a real conflict, 400 naming what is wrong.
TEST(SaveRestore, CreateOrJoinAnswers201Then200And409OnlyForAConflict) {
  auto c = StartCluster();
  ASSERT_TRUE(c);
  const Mesh two{"two", {{"data", 2}}, 1};
  ASSERT_TRUE(c->PutMesh("two", MeshToJson(two)["axes"]).ok());
  auto snapshot = [](int64_t device) {
    return Json{{"tensors", {{{"name", "w"}, {"dtype", "float32"}, {"shape", {8}},
                               {"layout", {"data"}}, {"devices", {device}}}}}};
  };
  const Json written = {{"bytes", 0}, {"stored_bytes", 0}, {"fragment", Json::array()}};
  auto put = [&](int w, const Json& extra = Json::object()) {
    Json body = {{"worker", c->worker_id(w)},
                 {"snapshot", snapshot(w)},
                 {"written", written}};
    body.update(extra);
    http::Client client = c->Client();
    return client.Send("PUT", "/api/v1/meshes/two/checkpoints/5", body.dump(), "application/json");
  };
  auto first = put(0);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_EQ(first->status, 201) << first->body;
  const std::string job = Json::parse(first->body)["job"];
  auto repeat = put(0);
  ASSERT_TRUE(repeat.ok());
  EXPECT_EQ(repeat->status, 200) << repeat->body;
  EXPECT_EQ(Json::parse(repeat->body)["job"], job);
  // Another request for the same step: a real conflict, naming the job.
  auto other = put(1, {{"compression", "none"}});
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->status, 409) << other->body;
  EXPECT_EQ(Json::parse(other->body)["error"]["details"]["job"], job);
  // Not a worker of the mesh; a malformed snapshot.
  auto stranger = c->Call("PUT", "/api/v1/meshes/two/checkpoints/5",
                          {{"worker", "w-nobody"}, {"snapshot", snapshot(0)}, {"written", written}});
  EXPECT_EQ(stranger.status().details().value("field", ""), "worker") << stranger.status().ToString();
  auto malformed = c->Call("PUT", "/api/v1/meshes/two/checkpoints/5",
                           {{"worker", c->worker_id(1)}, {"snapshot", {{"tensors", 3}}}});
  EXPECT_EQ(malformed.status().code(), Code::kInvalidArgument) << malformed.status().ToString();
  // The workers hold no snapshot of step 5 (nobody called /v1/save): cancel the job.
  ASSERT_TRUE(c->Call("POST", "/api/v1/jobs/" + job + "/cancel", Json::object()).ok());
  EXPECT_NE(Wait(*c, job)["state"], "succeeded");

  // Trainers save step 6 for real; then a create-or-join of it is a conflict.
  auto t = MakeGlobal("w", DType::kFloat32, {8}, Layout{{"data"}}, 3);
  Push(*c, two, t);
  std::vector<std::thread> trainers;
  for (int w = 0; w < 2; ++w) {
    trainers.emplace_back([&, w] {
      auto r = c->WorkerClient(w, 60).Call("POST", "/v1/save?mesh=two&step=6&wait=committed",
                                           Json::object());
      EXPECT_TRUE(r.ok()) << r.status().ToString();
    });
  }
  for (auto& th : trainers) th.join();
  auto late = c->Call("PUT", "/api/v1/meshes/two/checkpoints/6",
                      {{"worker", c->worker_id(0)}, {"snapshot", snapshot(0)}, {"written", written}});
  EXPECT_EQ(late.status().code(), Code::kConflict) << late.status().ToString();
  EXPECT_NE(late.status().message().find("already committed"), std::string::npos);
  // A bad request is the trainer's 400 at /v1/save, before any copy.
  auto bad = c->WorkerClient(0).Call("POST", "/v1/save?mesh=two&step=7", {{"level", 99}});
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(bad.status().details().value("field", ""), "level");
}

TEST(SaveRestore, ReshardingReadsOnlyOverlappingChunks) {
  auto c = StartCluster();
  ASSERT_TRUE(c);
  const Mesh two{"two", {{"data", 2}}, 1};
  ASSERT_TRUE(c->PutMesh("two", MeshToJson(two)["axes"]).ok());
  // 32 MiB in two 16 MiB slices of four 4 MiB chunks each.
  auto t = MakeGlobal("big", DType::kUInt8, {8192, 4096}, Layout{{"data", "unsharded"}}, 4);
  Push(*c, two, t);
  SaveAndWait(*c, "two", 1, {{"compression", "none"}});
  const Mesh four{"four", {{"data", 4}}, 1};
  ASSERT_TRUE(c->PutMesh("four", MeshToJson(four)["axes"]).ok());
  Json r = RestoreAndWait(*c, "two", "1", {{"target_mesh", "four"}});
  ASSERT_EQ(r["state"], "succeeded") << r.dump();
  // Each of the four targets needs 8 MiB = exactly two chunks: 32 MiB read in all, not 64.
  EXPECT_EQ(r["result"]["stored_bytes_read"], 32u << 20);
  ExpectShards(*c, four, t, Layout{{"data", "unsharded"}});
}

TEST(SaveRestore, TrainerSaveReturnsAfterSnapshotAndKeepsOldValues) {
  auto c = StartCluster();
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->PutMesh("m", MeshToJson(kMesh)["axes"]).ok());
  auto before = MixedTensors(10);
  for (const auto& t : before) Push(*c, kMesh, t);
  // A mapped tensor: the trainer keeps its state in the worker's shm file.
  auto mapped = MakeGlobal("mapped", DType::kFloat32, {64, 64}, Layout{{"data", "model"}}, 11);
  std::vector<std::pair<void*, size_t>> maps;
  for (int64_t d = 0; d < 4; ++d) {
    http::Client local = c->WorkerClient(static_cast<int>(d));
    auto r = local.Call("POST", "/v1/tensors/mapped/mapping?mesh=m&device=" + std::to_string(d) +
                                    "&dtype=float32&shape=64,64&layout=data,model",
                        Json::object());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    int fd = ::open((*r)["path"].get<std::string>().c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    size_t n = (*r)["bytes"];
    void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    ASSERT_NE(p, MAP_FAILED);
    std::string shard = mapped.Slice(DeviceSlice(kMesh, mapped.layout, mapped.shape, d));
    std::memcpy(p, shard.data(), n);
    maps.push_back({p, n});
  }
  std::vector<std::thread> trainers;
  std::vector<Json> answers(4);
  for (int w = 0; w < 4; ++w) {
    trainers.emplace_back([&, w] {
      http::Client local = c->WorkerClient(w, 60);
      auto r = local.Call("POST", "/v1/save?mesh=m&step=7", Json::object());
      answers[w] = r.ok() ? *r : ErrorBody(r.status());
    });
  }
  for (auto& t : trainers) t.join();
  // The answer comes after the snapshot, before any job exists on tesserad.
  for (const auto& a : answers) {
    ASSERT_TRUE(a.contains("snapshot_ms")) << a.dump();
    EXPECT_FALSE(a.contains("job")) << a.dump();
    EXPECT_EQ(a["checkpoint"]["step"], 7);
  }
  // Overwrite everything right away, including the mapped memory.
  for (const auto& t : MixedTensors(20)) Push(*c, kMesh, t);
  for (auto& [p, n] : maps) std::memset(p, 0x7f, n);
  // Every worker started or joined the same job in the background.
  std::vector<std::string> jobs;
  for (int w = 0; w < 4; ++w) {
    http::Client local = c->WorkerClient(w, 60);
    auto s = local.Call("GET", "/v1/saves/7?mesh=m&wait=started");
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    jobs.push_back((*s)["job"]);
  }
  EXPECT_EQ(jobs[0], jobs[3]);
  EXPECT_EQ(jobs[1], jobs[2]);
  EXPECT_EQ(jobs[0], jobs[1]);
  {
    http::Client local = c->WorkerClient(1, 60);
    auto s = local.Call("GET", "/v1/saves/7?mesh=m&wait=committed");
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_EQ((*s)["state"], "committed");
  }
  Json job = Wait(*c, jobs[0]);
  ASSERT_EQ(job["state"], "succeeded") << job.dump();
  // Created and joined over PUT, with the snapshots: no snapshot task went back.
  EXPECT_EQ(job["request"].value("joined", false), true) << job.dump();
  Json r = RestoreAndWait(*c, "m", "7", Json::object());
  ASSERT_EQ(r["state"], "succeeded") << r.dump();
  for (const auto& t : before) ExpectShards(*c, kMesh, t, t.layout);
  // Restore wrote into the mapping: the trainer sees the saved values in place.
  for (int64_t d = 0; d < 4; ++d) {
    std::string shard = mapped.Slice(DeviceSlice(kMesh, mapped.layout, mapped.shape, d));
    EXPECT_EQ(std::memcmp(maps[d].first, shard.data(), shard.size()), 0) << "device " << d;
    ::munmap(maps[d].first, maps[d].second);
  }
  // wait=committed answers after the commit.
  std::vector<std::thread> waiters;
  for (int w = 0; w < 4; ++w) {
    waiters.emplace_back([&, w] {
      http::Client local = c->WorkerClient(w, 60);
      auto r = local.Call("POST", "/v1/save?mesh=m&step=8&wait=committed", Json::object());
      answers[w] = r.ok() ? *r : ErrorBody(r.status());
    });
  }
  for (auto& t : waiters) t.join();
  EXPECT_EQ(answers[1]["state"], "committed") << answers[1].dump();
  EXPECT_TRUE(answers[1]["job"].is_string()) << answers[1].dump();
  http::Client local = c->WorkerClient(2);
  auto lat = local.Call("GET", "/v1/checkpoints/latest?mesh=m");
  ASSERT_TRUE(lat.ok());
  EXPECT_EQ((*lat)["step"], 8);
}

// The trainer-side routes: a save that cannot start is reported on
// /v1/saves; /v1/restore restores only the calling worker; /v1/checkpoints lists.
TEST(SaveRestore, TrainerRoutesRestoreOwnWorkerAndReportFailedSaves) {
  auto c = StartCluster();
  ASSERT_TRUE(c);
  const Mesh two{"two", {{"data", 2}}, 1};
  ASSERT_TRUE(c->PutMesh("two", MeshToJson(two)["axes"]).ok());
  GlobalTensor w = MakeGlobal("w", DType::kFloat32, {8, 4}, Layout{{"data", "unsharded"}}, 3);
  Push(*c, two, w);
  SaveAndWait(*c, "two", 5);
  http::Client w0 = c->WorkerClient(0, 60), w1 = c->WorkerClient(1, 60);

  // Step 5 is committed already: the snapshot answers, the background start fails,
  // and /v1/saves reports the conflict with the step, on both wait modes.
  auto again = w0.Call("POST", "/v1/save?mesh=two&step=5", Json::object());
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  auto failed = w0.Call("GET", "/v1/saves/5?mesh=two&wait=committed&timeout_ms=10000");
  ASSERT_EQ(failed.status().code(), Code::kConflict) << failed.status().ToString();
  EXPECT_EQ(failed.status().details()["step"], 5);
  EXPECT_EQ(w0.Call("GET", "/v1/saves/5?mesh=two&wait=started").status().code(), Code::kConflict);
  // A save this worker never took; bad parameters.
  auto unknown = w0.Call("GET", "/v1/saves/6?mesh=two");
  EXPECT_EQ(unknown.status().code(), Code::kNotFound);
  EXPECT_EQ(unknown.status().details()["step"], 6);
  EXPECT_EQ(w0.Call("GET", "/v1/saves/x?mesh=two").status().details()["field"], "step");
  EXPECT_EQ(w0.Call("GET", "/v1/saves/5?mesh=two&wait=soon").status().details()["field"], "wait");
  EXPECT_EQ(w0.Call("GET", "/v1/saves/5").status().details()["field"], "mesh");
  EXPECT_EQ(w0.Call("POST", "/v1/save?mesh=nope&step=1", Json::object()).status().code(),
            Code::kNotFound);

  // Only worker 0 restores: worker 1 keeps what it holds now.
  GlobalTensor changed = MakeGlobal("w", DType::kFloat32, {8, 4}, Layout{{"data", "unsharded"}}, 4);
  Push(*c, two, changed);
  auto restored = w0.Call("POST", "/v1/restore?mesh=two&step=5", Json::object());
  ASSERT_TRUE(restored.ok()) << restored.status().ToString();
  EXPECT_EQ((*restored)["checkpoint"]["step"], 5);
  EXPECT_EQ((*restored)["bytes"], 8 * 4 * 4 / 2);
  auto shard = [&](http::Client& cl) {
    auto r = cl.Send("GET", "/v1/tensors/w?mesh=two&device=" + std::string(&cl == &w0 ? "0" : "1"));
    return r.ok() ? r->body : std::string();
  };
  EXPECT_EQ(shard(w0), w.Slice(DeviceSlice(two, w.layout, w.shape, 0)));
  EXPECT_EQ(shard(w1), changed.Slice(DeviceSlice(two, changed.layout, changed.shape, 1)));
  // latest is the default, and the mesh's workers agree on it: alone, worker 1 waits
  // for worker 0 and names it; together, both restore step 5.
  auto alone = w1.Call("POST", "/v1/restore?mesh=two&timeout_ms=300", Json::object());
  ASSERT_EQ(alone.status().code(), Code::kDeadlineExceeded) << alone.status().ToString();
  EXPECT_EQ(alone.status().details()["missing_workers"], Json::array({c->worker_id(0)})) << alone.status().ToString();
  EXPECT_EQ(shard(w1), changed.Slice(DeviceSlice(two, changed.layout, changed.shape, 1)));
  std::optional<Result<Json>> latest0;
  std::thread first([&] { latest0 = w0.Call("POST", "/v1/restore?mesh=two", Json::object()); });
  auto latest = w1.Call("POST", "/v1/restore?mesh=two", Json::object());
  first.join();
  ASSERT_TRUE(latest.ok()) << latest.status().ToString();
  ASSERT_TRUE(latest0->ok()) << latest0->status().ToString();
  EXPECT_EQ((*latest)["checkpoint"]["step"], 5);
  EXPECT_EQ((**latest0)["checkpoint"]["step"], 5);
  EXPECT_EQ(shard(w1), w.Slice(DeviceSlice(two, w.layout, w.shape, 1)));
  // An unknown step names it.
  auto missing = w1.Call("POST", "/v1/restore?mesh=two&step=9", Json::object());
  EXPECT_EQ(missing.status().code(), Code::kNotFound);
  EXPECT_EQ(missing.status().details()["step"], 9);
  // A worker list naming a stranger is refused over REST.
  auto stranger = c->Call("POST", "/api/v1/meshes/two/checkpoints/5/restore",
                          {{"workers", {"w-nobody"}}});
  EXPECT_EQ(stranger.status().details()["field"], "workers");

  auto list = w1.Call("GET", "/v1/checkpoints?mesh=two");
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  ASSERT_EQ((*list)["checkpoints"].size(), 1u) << list->dump();  // the refused retry made none
  EXPECT_EQ((*list)["checkpoints"][0]["step"], 5);
}

TEST(SaveRestore, RetentionKeepsLastAndEveryN) {
  auto c = StartCluster();
  ASSERT_TRUE(c);
  const Mesh two{"two", {{"data", 2}}, 1};
  ASSERT_TRUE(c->PutMesh("two", MeshToJson(two)["axes"]).ok());
  Push(*c, two, MakeGlobal("w", DType::kFloat32, {8, 8}, Layout{{"data", "unsharded"}}, 1));
  ASSERT_TRUE(c->Call("PUT", "/api/v1/meshes/two/retention",
                      {{"keep_last", 2}, {"keep_every_n_steps", 100}}).ok());
  for (int64_t step : {100, 110, 120, 130}) SaveAndWait(*c, "two", step);
  auto list = c->Call("GET", "/api/v1/meshes/two/checkpoints");
  ASSERT_TRUE(list.ok());
  std::vector<int64_t> steps;
  for (const auto& e : *list) steps.push_back(e["step"]);
  EXPECT_EQ(steps, (std::vector<int64_t>{130, 120, 100}));  // newest first; 100 kept by every-n
  EXPECT_EQ(*storage::ListSteps(storage::DefaultEnv(), c->checkpoint_root(), "two"),
            (std::vector<int64_t>{100, 120, 130}));
  // Saving a committed step again is a conflict.
  auto again = c->Call("POST", "/api/v1/meshes/two/checkpoints", {{"step", 130}});
  EXPECT_EQ(again.status().code(), Code::kConflict);
  ASSERT_TRUE(c->Call("DELETE", "/api/v1/meshes/two/checkpoints/120").ok());
  EXPECT_EQ(c->Call("GET", "/api/v1/meshes/two/checkpoints/120").status().code(), Code::kNotFound);
}

TEST(SaveRestore, CancelCleansUpLikeAFailure) {
  tools::ClusterOptions opts;
  opts.workers = 2;
  opts.worker_env[1] = {"TESSERA_FAULT_TASK_DELAY=write:3000"};
  auto c = StartCluster(opts);
  ASSERT_TRUE(c);
  const Mesh two{"two", {{"data", 2}}, 1};
  ASSERT_TRUE(c->PutMesh("two", MeshToJson(two)["axes"]).ok());
  Push(*c, two, MakeGlobal("w", DType::kFloat32, {8, 8}, Layout{{"data", "unsharded"}}, 1));
  std::string job = StartSave(*c, "two", 1);
  WaitPhase(*c, job, "write");
  ASSERT_TRUE(c->Call("POST", "/api/v1/jobs/" + job + "/cancel", Json::object()).ok());
  Json j = Wait(*c, job);
  EXPECT_EQ(j["state"], "cancelled");
  auto ck = c->Call("GET", "/api/v1/meshes/two/checkpoints/1");
  ASSERT_TRUE(ck.ok());
  EXPECT_EQ((*ck)["state"], "failed");
  EXPECT_TRUE(storage::ListSteps(storage::DefaultEnv(), c->checkpoint_root(), "two")->empty());
  // Worker 1's write, held back, comes after the cancel: its join is refused, it removes
  // its file, and the collector the dir. Then only the mesh's document (docs/format.md,
  // "What the root holds") stays.
  EXPECT_EQ(LeftoversOnceCollected(*c, "two"), std::vector<std::string>{});
  std::error_code ec;
  for (auto& e : std::filesystem::directory_iterator(c->checkpoint_root() + "/two", ec)) {
    if (e.path().filename().string().rfind("mesh-", 0) == 0) continue;
    ADD_FAILURE() << "left behind: " << e.path();
  }
  // The step can be saved again afterwards.
  SaveAndWait(*c, "two", 1);
}

}  // namespace
}  // namespace tessera::e2e
