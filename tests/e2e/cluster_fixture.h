// Helpers for end-to-end tests against a LocalCluster of real processes.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "http/router.h"
#include "api/mesh.h"
#include "storage/slice_copy.h"
#include "storage/synthetic.h"
#include "tests/unit/eventually.h"
#include "tools/local_cluster.h"

namespace tessera::e2e {

using tools::LocalCluster;

struct GlobalTensor {
  std::string name;
  DType dtype;
  Shape shape;
  Layout layout;
  std::string bytes;

  std::string Slice(const SliceSpec& s) const {
    const size_t esize = DTypeSize(dtype);
    std::string out(s.NumElements() * esize, '\0');
    storage::CopyOverlap(FullSlice(shape), bytes.data(), s, out.data(), esize);
    return out;
  }
};

inline GlobalTensor MakeGlobal(std::string name, DType dtype, Shape shape, Layout layout,
                               uint64_t seed) {
  GlobalTensor t{std::move(name), dtype, std::move(shape), std::move(layout), {}};
  t.bytes = storage::SyntheticBytes(dtype, NumElements(t.shape), seed);
  return t;
}

inline std::unique_ptr<LocalCluster> StartCluster(tools::ClusterOptions opts = {}) {
  opts.bin_dir = TESSERA_BIN_DIR;
  auto c = LocalCluster::Start(opts);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(*c) : nullptr;
}

// PUTs every device shard of `t` for `mesh` whose rank r is worker first_worker + r.
inline void Push(LocalCluster& c, const Mesh& mesh, const GlobalTensor& t, int first_worker = 0) {
  for (int64_t d = 0; d < mesh.num_devices(); ++d) {
    http::Client local = c.WorkerClient(first_worker + static_cast<int>(mesh.WorkerOfDevice(d)));
    std::string path = "/v1/tensors/" + http::PercentEncode(t.name) + "?mesh=" + mesh.name +
                       "&device=" + std::to_string(d) + "&dtype=" + std::string(DTypeName(t.dtype)) +
                       "&shape=" + ShapeToString(t.shape) + "&layout=" + t.layout.ToString();
    auto r = local.Send("PUT", path, t.Slice(DeviceSlice(mesh, t.layout, t.shape, d)),
                        "application/octet-stream");
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->status, 204) << t.name << " device " << d << ": " << r->body;
  }
}

// Reads every device shard of `name` on `mesh` and compares with `t` laid out as `layout`.
inline void ExpectShards(LocalCluster& c, const Mesh& mesh, const GlobalTensor& t,
                         const Layout& layout, int first_worker = 0) {
  for (int64_t d = 0; d < mesh.num_devices(); ++d) {
    http::Client local = c.WorkerClient(first_worker + static_cast<int>(mesh.WorkerOfDevice(d)));
    auto r = local.Send("GET", "/v1/tensors/" + http::PercentEncode(t.name) + "?mesh=" +
                                   mesh.name + "&device=" + std::to_string(d));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->status, 200) << t.name << " device " << d << ": " << r->body;
    EXPECT_EQ(r->body, t.Slice(DeviceSlice(mesh, layout, t.shape, d)))
        << t.name << " on " << mesh.name << " device " << d;
  }
}

// Worker i's data port, as tesserad lists it for the other workers; 0 if unlisted.
inline int DataPort(LocalCluster& c, int i) {
  auto workers = c.Call("GET", "/api/v1/workers");
  EXPECT_TRUE(workers.ok()) << workers.status().ToString();
  if (!workers.ok()) return 0;
  for (const Json& w : *workers) {
    if (w.value("id", "") == c.worker_id(i)) return w.value("data_port", 0);
  }
  return 0;
}

// The connections worker i's data port has refused so far (its /healthz); -1 if unknown.
inline int64_t RefusedAtDataPort(LocalCluster& c, int i) {
  auto health = c.WorkerClient(i, 10).Call("GET", "/healthz");
  if (!health.ok() || !health->contains("data_port")) return -1;
  return (*health)["data_port"].value("refused_connections", int64_t{-1});
}

// Starts a save and returns the job id.
inline std::string StartSave(LocalCluster& c, const std::string& mesh, int64_t step,
                             Json extra = Json::object()) {
  extra["step"] = step;
  auto r = c.Call("POST", "/api/v1/meshes/" + mesh + "/checkpoints", extra);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? r->value("job", "") : "";
}

inline Json Wait(LocalCluster& c, const std::string& job) {
  auto r = c.WaitJob(job, 120000);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : Json();
}

inline Json SaveAndWait(LocalCluster& c, const std::string& mesh, int64_t step,
                        Json extra = Json::object()) {
  Json j = Wait(c, StartSave(c, mesh, step, std::move(extra)));
  EXPECT_EQ(j.value("state", ""), "succeeded") << j.dump();
  return j;
}

inline Json RestoreAndWait(LocalCluster& c, const std::string& mesh, const std::string& step,
                           const Json& body) {
  auto r = c.Call("POST", "/api/v1/meshes/" + mesh + "/checkpoints/" + step + "/restore", body);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? Wait(c, r->value("job", "")) : Json();
}

// Polls a job until it reaches `phase` (or ends).
inline Json WaitPhase(LocalCluster& c, const std::string& job, const std::string& phase) {
  Json seen;  // the last record read: the caller's message shows it when the phase never came
  (void)::tessera::testing::Eventually([&] {
    auto r = c.Call("GET", "/api/v1/jobs/" + job);
    if (!r.ok()) return false;
    seen = *r;
    const std::string state = seen.value("state", "");
    return seen["phase"] == phase || state == "succeeded" || state == "failed" || state == "cancelled";
  });
  return seen;
}

// The staging and deleting dirs in `mesh`'s dir of the root.
inline std::vector<std::string> Leftovers(LocalCluster& c, const std::string& mesh) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto& e : std::filesystem::directory_iterator(c.checkpoint_root() + "/" + mesh, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind(".staging", 0) == 0 || n.rfind(".deleting", 0) == 0) out.push_back(n);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The leftovers once they are gone, or after 30 s those still there: a failed save's
// late writers remove their files once their joins are refused, and tesserad's
// collector removes the dirs one lease after that.
inline std::vector<std::string> LeftoversOnceCollected(LocalCluster& c, const std::string& mesh) {
  std::vector<std::string> left;
  (void)::tessera::testing::Eventually([&] { return (left = Leftovers(c, mesh)).empty(); }, std::chrono::seconds(30));
  return left;
}

}  // namespace tessera::e2e
