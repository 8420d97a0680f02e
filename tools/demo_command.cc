// `tessera demo`, the main job: a local cluster (tesserad + 4 workers as real
// processes) saves a mesh-sharded state pushed by "trainers", restores it after
// the trainers changed it, reshards it onto another mesh, verifies it, and
// prints what it did.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "http/router.h"
#include "api/mesh.h"
#include "storage/checkpoint_dir.h"
#include "storage/slice_copy.h"
#include "storage/synthetic.h"
#include "tools/commands.h"
#include "tools/local_cluster.h"

namespace tessera::tools {
namespace {

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

struct DemoTensor {
  std::string name;
  DType dtype;
  Shape shape;
  Layout layout;
  std::string global;  // row-major bytes
};

std::string Cut(const DemoTensor& t, const SliceSpec& s) {
  const size_t esize = DTypeSize(t.dtype);
  std::string out(s.NumElements() * esize, '\0');
  storage::CopyOverlap(FullSlice(t.shape), t.global.data(), s, out.data(), esize);
  return out;
}

std::string TensorPath(const DemoTensor& t, const std::string& mesh, int64_t device) {
  return "/v1/tensors/" + http::PercentEncode(t.name) + "?mesh=" + mesh +
         "&device=" + std::to_string(device) + "&dtype=" + std::string(DTypeName(t.dtype)) +
         "&shape=" + ShapeToString(t.shape) + "&layout=" + t.layout.ToString();
}

Status Fail(const std::string& what, const Status& st) { return st.WithContext(what); }

// Pushes every device shard of `tensors` to the workers of `mesh` (worker i owns device i).
Status Push(LocalCluster& c, const Mesh& mesh, const std::vector<DemoTensor>& tensors) {
  for (int64_t d = 0; d < mesh.num_devices(); ++d) {
    http::Client local = c.WorkerClient(static_cast<int>(mesh.WorkerOfDevice(d)));
    for (const auto& t : tensors) {
      std::string bytes = Cut(t, DeviceSlice(mesh, t.layout, t.shape, d));
      ASSIGN_OR_RETURN(auto r, local.Send("PUT", TensorPath(t, mesh.name, d), bytes,
                                          "application/octet-stream"));
      if (r.status != 204) return http::StatusFromResponse(r.status, r.body).WithContext(t.name);
    }
  }
  return Status::Ok();
}

// Reads every device shard of `mesh` back and compares with `tensors` laid out as `layouts`.
Result<int> Compare(LocalCluster& c, const Mesh& mesh, const std::vector<DemoTensor>& tensors,
                    const std::vector<Layout>& layouts, int first_worker) {
  int mismatches = 0;
  for (int64_t d = 0; d < mesh.num_devices(); ++d) {
    http::Client local = c.WorkerClient(first_worker + static_cast<int>(mesh.WorkerOfDevice(d)));
    for (size_t i = 0; i < tensors.size(); ++i) {
      const auto& t = tensors[i];
      ASSIGN_OR_RETURN(auto r, local.Send("GET", "/v1/tensors/" + http::PercentEncode(t.name) +
                                                     "?mesh=" + mesh.name +
                                                     "&device=" + std::to_string(d)));
      if (r.status != 200 || r.body != Cut(t, DeviceSlice(mesh, layouts[i], t.shape, d))) {
        std::printf("  MISMATCH %s on %s device %lld (HTTP %d)\n", t.name.c_str(),
                    mesh.name.c_str(), static_cast<long long>(d), r.status);
        ++mismatches;
      }
    }
  }
  return mismatches;
}

Status RunDemoSteps(LocalCluster& c) {
  Mesh mesh{"demo", {{"data", 2}, {"model", 2}}, 1};
  auto L = [](std::vector<std::string> d) { return Layout{std::move(d)}; };
  std::vector<DemoTensor> tensors = {
      {"embedding", DType::kFloat32, {8192, 512}, L({"unsharded", "model"}), {}},
      {"dense/kernel", DType::kBFloat16, {2048, 2048}, L({"data", "model"}), {}},
      {"dense/bias", DType::kFloat16, {2048}, L({"unsharded"}), {}},
      {"optimizer/step", DType::kInt64, {}, L({}), {}},
      {"optimizer/momentum", DType::kFloat64, {512, 256}, L({"data", "unsharded"}), {}},
      {"tokens", DType::kInt32, {1024, 128}, L({"data", "model"}), {}},
      {"mask", DType::kBool, {256, 256}, L({"model", "data"}), {}},
      {"quantized/w", DType::kInt8, {1024, 512}, L({"unsharded", "data"}), {}},
      {"quantized/scale", DType::kUInt8, {512}, L({"model"}), {}},
      {"histogram", DType::kInt16, {64, 64}, L({"unsharded", "unsharded"}), {}},
  };
  uint64_t logical = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    auto& t = tensors[i];
    t.global = storage::SyntheticBytes(t.dtype, NumElements(t.shape), 1000 + i);
    logical += t.global.size();
  }
  std::printf("cluster: tesserad %s + %d workers (logs in %s)\n", c.url().c_str(), c.num_workers(),
              c.dir().c_str());

  auto t0 = Clock::now();
  RETURN_IF_ERROR(Fail("register mesh", c.PutMesh("demo", MeshToJson(mesh)["axes"]).status()));
  std::printf("[mesh]    demo %s registered on workers 0-3\n", mesh.ToString().c_str());
  RETURN_IF_ERROR(Fail("push tensors", Push(c, mesh, tensors)));
  std::printf("[push]    %zu tensors (10 dtypes; sharded, partly sharded, replicated, scalar), "
              "%s logical, in %.0f ms\n",
              tensors.size(), HumanBytes(logical).c_str(), MsSince(t0));

  // Save from inside the "training loop": every trainer calls /v1/save and is
  // released as soon as its own worker has snapshotted.
  std::vector<Result<Json>> answers(4, Internal("not run"));
  std::vector<double> stall_ms(4);
  std::vector<std::thread> trainers;
  t0 = Clock::now();
  for (int w = 0; w < 4; ++w) {
    trainers.emplace_back([&, w] {
      auto s = Clock::now();
      http::Client local = c.WorkerClient(w, 120);
      auto r = local.Send("POST", "/v1/save?mesh=demo&step=100", "{}");
      stall_ms[w] = MsSince(s);
      if (!r.ok()) {
        answers[w] = r.status();
      } else if (r->status != 200) {
        answers[w] = http::StatusFromResponse(r->status, r->body);
      } else {
        answers[w] = ParseJson(r->body);
      }
    });
  }
  for (auto& t : trainers) t.join();
  for (int w = 0; w < 4; ++w) RETURN_IF_ERROR(Fail("save from trainer " + std::to_string(w), answers[w].status()));
  // The job was started in the background; any worker can say which it is.
  ASSIGN_OR_RETURN(Json started,
                   c.WorkerClient(0, 60).Call("GET", "/v1/saves/100?mesh=demo&wait=started"));
  const std::string job = started.value("job", "");
  std::printf("[save]    4 trainers called /v1/save?step=100; released after");
  for (int w = 0; w < 4; ++w) std::printf(" %.1f", stall_ms[w]);
  std::printf(" ms (job %s)\n", job.c_str());
  // The trainers go on immediately: step 101 overwrites every tensor.
  std::vector<DemoTensor> changed = tensors;
  for (size_t i = 0; i < changed.size(); ++i) {
    changed[i].global = storage::SyntheticBytes(changed[i].dtype, NumElements(changed[i].shape), 5000 + i);
  }
  RETURN_IF_ERROR(Fail("overwrite tensors", Push(c, mesh, changed)));
  ASSIGN_OR_RETURN(Json done, c.WaitJob(job));
  if (done.value("state", "") != "succeeded") {
    return Internal("save job " + job + " " + done.value("state", "") + ": " + done["error"].dump());
  }
  const Json ck = done["result"]["checkpoint"];
  std::printf("          committed step 100 in %lld ms: %s logical, %s stored (zstd-1, ratio %.2f)\n",
              static_cast<long long>(ck.value("duration_ms", 0)),
              HumanBytes(ck.value("logical_bytes", 0.0)).c_str(),
              HumanBytes(ck.value("stored_bytes", 0.0)).c_str(),
              ck.value("logical_bytes", 0.0) / std::max(1.0, ck.value("stored_bytes", 1.0)));
  std::printf("          bytes written per worker: %s (replicated tensors written once)\n",
              done["result"]["bytes_per_rank"].dump().c_str());
  std::printf("          trainers overwrote every tensor while it was written (step 101)\n");

  // Restore onto the same mesh: the step-100 values come back.
  t0 = Clock::now();
  ASSIGN_OR_RETURN(Json rj, c.Call("POST", "/api/v1/meshes/demo/checkpoints/100/restore", Json::object()));
  ASSIGN_OR_RETURN(Json restored, c.WaitJob(rj.value("job", "")));
  if (restored.value("state", "") != "succeeded") return Internal("restore failed: " + restored["error"].dump());
  std::vector<Layout> same;
  for (const auto& t : tensors) same.push_back(t.layout);
  ASSIGN_OR_RETURN(int bad, Compare(c, mesh, tensors, same, 0));
  std::printf("[restore] step 100 onto demo in %.0f ms: %s\n", MsSince(t0),
              bad == 0 ? "every shard equals the saved values (not the overwritten ones)"
                       : "MISMATCHES");
  if (bad) return DataLoss(std::to_string(bad) + " shards differ after restore");

  // Reshard onto {data:4}: axes the new mesh lacks become unsharded.
  Mesh four{"demo-data4", {{"data", 4}}, 1};
  RETURN_IF_ERROR(Fail("register mesh", c.PutMesh(four.name, MeshToJson(four)["axes"]).status()));
  t0 = Clock::now();
  ASSIGN_OR_RETURN(rj, c.Call("POST", "/api/v1/meshes/demo/checkpoints/100/restore",
                              {{"target_mesh", four.name}}));
  ASSIGN_OR_RETURN(restored, c.WaitJob(rj.value("job", "")));
  if (restored.value("state", "") != "succeeded") return Internal("reshard failed: " + restored["error"].dump());
  std::map<std::string, Layout> by_name;
  for (const auto& tj : restored["result"]["layouts"]) {
    ASSIGN_OR_RETURN(by_name[tj.value("name", "")], LayoutFromJson(tj["layout"]));
  }
  std::vector<Layout> layouts;
  for (const auto& t : tensors) {
    if (!by_name.count(t.name)) return Internal("restore did not report tensor " + t.name);
    layouts.push_back(by_name[t.name]);
  }
  ASSIGN_OR_RETURN(bad, Compare(c, four, tensors, layouts, 0));
  std::printf("[reshard] step 100 onto demo-data4 %s in %.0f ms (read %s of chunks): %s\n",
              four.ToString().c_str(), MsSince(t0),
              HumanBytes(restored["result"].value("stored_bytes_read", 0.0)).c_str(),
              bad == 0 ? "same global tensors" : "MISMATCHES");
  if (bad) return DataLoss(std::to_string(bad) + " shards differ after resharding");

  ASSIGN_OR_RETURN(Json vj, c.Call("POST", "/api/v1/meshes/demo/checkpoints/100/verify", Json::object()));
  ASSIGN_OR_RETURN(Json verified, c.WaitJob(vj.value("job", "")));
  std::printf("[verify]  %s: %lld chunks checked, %zu bad\n", verified.value("state", "").c_str(),
              static_cast<long long>(verified["result"].value("chunks_checked", 0)),
              verified["result"].value("bad_chunks", Json::array()).size());
  if (verified.value("state", "") != "succeeded") return DataLoss("verify found corruption");

  const std::string dir = storage::CheckpointDir(c.checkpoint_root(), "demo", 100);
  std::printf("\n[inspect] %s\n", dir.c_str());
  if (RunInspect(dir, false) != 0) return Internal("inspect failed");
  return Status::Ok();
}

}  // namespace

int RunDemo(const std::string& dir, bool keep) {
  ClusterOptions opts;
  opts.dir = dir;
  auto cluster = LocalCluster::Start(opts);
  if (!cluster.ok()) {
    std::fprintf(stderr, "error: cannot start the local cluster: %s\n",
                 cluster.status().ToString().c_str());
    return 1;
  }
  Status st = RunDemoSteps(**cluster);
  if (!st.ok()) {
    std::fprintf(stderr, "\ndemo FAILED: %s\n(logs in %s)\n", st.ToString().c_str(),
                 (*cluster)->dir().c_str());
    return 1;
  }
  std::printf("\ndemo OK: saved, restored, resharded and verified on a real local cluster\n");
  if (keep || !dir.empty()) {
    std::printf("kept %s (checkpoints under %s)\n", (*cluster)->dir().c_str(),
                (*cluster)->checkpoint_root().c_str());
  }
  return 0;
}

}  // namespace tessera::tools
