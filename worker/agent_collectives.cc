// The agent's collectives work: REST collectives jobs, the mesh self-test and the
// preemption sync point, all through MeshCollectives and tesserad.
#include <algorithm>
#include <cstdio>

#include "worker/agent.h"
#include "collectives/hash.h"
#include "collectives/sparse_all_reduce.h"
#include "worker/device_groups.h"

namespace tessera::worker {
namespace {

// The output description of a REST collective on a tensor described by `in`, or
// nullopt for ops without an output. Shards keep their meaning: all_reduce and
// broadcast combine per-device shards into a tensor of the same layout; all_gather
// unshards the first dimension (sharded on the one axis gathered); reduce_scatter
// shards an unsharded first dimension on the one axis given.
Result<std::optional<TensorDesc>> OutputDesc(const Mesh& mesh, const CollectiveRequest& r,
                                             const std::string& tensor, const TensorDesc& in) {
  switch (r.op) {
    case CollectiveOp::kAllReduce:
    case CollectiveOp::kBroadcast:
      return std::optional<TensorDesc>(in);
    case CollectiveOp::kAllGather:
    case CollectiveOp::kReduceScatter: {
      const bool gather = r.op == CollectiveOp::kAllGather;
      const std::string want = gather ? "sharded on the axis gathered" : "unsharded";
      if (r.axes.size() != 1 || in.shape.empty() ||
          in.layout.dims[0] != (gather ? r.axes[0] : std::string(kUnsharded)) ||
          (gather && !r.tiled)) {
        return InvalidArgument(
            std::string(CollectiveOpName(r.op)) + " over REST works on a tensor's first " +
                "dimension along one axis" + (gather ? " (tiled=true)" : "") + ": tensor '" +
                tensor + "' is " + in.ToString() + "; its first dimension must be " + want +
                " (the local API takes any values)",
            {{"tensor", tensor}, {"field", "axes"}, {"layout", LayoutToJson(in.layout)}});
      }
      TensorDesc out = in;
      out.layout.dims[0] = gather ? std::string(kUnsharded) : r.axes[0];
      RETURN_IF_ERROR(ValidateLayout(mesh, out.layout, out.shape));
      return std::optional<TensorDesc>(out);
    }
    case CollectiveOp::kSparseAllReduce: {  // the dense sum, on every device
      TensorDesc out{in.dtype, r.dense_shape, Layout::Replicated(r.dense_shape.size())};
      const uint64_t bytes = out.logical_bytes();
      if (bytes > collectives::SparseAllReduceOptions().max_dense_bytes) {
        return ResourceExhausted("the dense output " + out.ToString() + " would hold " +
                                     std::to_string(bytes) + " bytes on every device",
                                 {{"field", "dense_shape"}, {"tensor", tensor}});
      }
      return std::optional<TensorDesc>(out);
    }
    default:
      return std::optional<TensorDesc>();
  }
}

// A device's indices tensor as int64 [rows]; invalid_argument naming it otherwise.
Result<collectives::Tensor> IndicesOf(const std::string& name, const TensorDesc& desc,
                                      const Shape& local_shape, const std::string& bytes) {
  if ((desc.dtype != DType::kInt32 && desc.dtype != DType::kInt64) || local_shape.size() != 1) {
    return InvalidArgument("indices '" + name + "' must be int32 or int64 with one dimension, not " +
                               desc.ToString(),
                           {{"tensor", name}, {"field", "indices"}});
  }
  return IndicesAsInt64(desc.dtype, bytes.data(), static_cast<size_t>(local_shape[0]));
}

}  // namespace

PeerAddresses Agent::DataAddresses() {
  return [this](const MeshPlacement& p) -> Result<std::vector<std::string>> {
    ASSIGN_OR_RETURN(Json workers, control_.Call("GET", "/api/v1/workers", nullptr, 10));
    std::vector<std::string> out;
    for (const std::string& id : p.workers) {
      auto it = std::find_if(workers.begin(), workers.end(),
                             [&](const Json& w) { return w.value("id", "") == id; });
      if (it == workers.end()) return Unavailable("worker " + id + " is not registered", {{"worker", id}});
      if (it->value("state", "") == "dead") {
        return Unavailable("worker " + id + " of mesh " + p.mesh.name + " is dead", {{"worker", id}});
      }
      const int port = it->value("data_port", 0);
      if (port <= 0) return Unavailable("worker " + id + " has no data port", {{"worker", id}});
      out.push_back(id + "@" + it->value("host", std::string("127.0.0.1")) + ":" +
                    std::to_string(port));
    }
    if (out.empty()) return Internal("mesh " + p.mesh.name + " lists no workers");
    return out;
  };
}

Status Agent::CheckCollectives() const {
  if (collectives_ != nullptr) return Status::Ok();
  return Unavailable("worker " + id_ + " runs no collectives (it has no data port)",
                     {{"worker", id_}});
}

Result<Json> Agent::DoCollective(const Task& task) {
  RETURN_IF_ERROR(CheckCollectives());
  const MeshPlacement p = PlacementFromTask(task);
  const Json& params = task.request;
  ASSIGN_OR_RETURN(CollectiveRequest r,
                   ParseCollectiveRequest(params.value("op", ""), [&](const std::string& key) {
                     // dtype and shape come from the tensor; the rest from the request.
                     if (key == "dtype") return std::optional<std::string>("float32");
                     if (key == "shape") return std::optional<std::string>("");
                     return JsonParams(params)(key);
                   }));
  r.mesh = p.mesh.name;
  r.job = task.job;
  const std::string tensor = params.value("tensor", ""), output = params.value("output", "");
  std::vector<collectives::Tensor> inputs;
  TensorDesc desc;
  if (r.takes_input()) {
    for (int64_t device : p.devices) {
      std::string bytes;
      auto ref = store_->Read(p.mesh.name, tensor, device, &bytes);
      if (!ref.ok()) return ref.status().WithContext("worker " + id_).WithDetail("worker", id_);
      desc = ref->desc;
      collectives::Tensor t;
      t.dtype = ref->desc.dtype;
      t.shape = ref->local_shape;
      t.data.assign(bytes.begin(), bytes.end());
      inputs.push_back(std::move(t));
      if (r.op == CollectiveOp::kSparseAllReduce) {
        const std::string indices = params.value("indices", "");
        auto iref = store_->Read(p.mesh.name, indices, device, &bytes);
        if (!iref.ok()) return iref.status().WithContext("worker " + id_).WithDetail("worker", id_);
        ASSIGN_OR_RETURN(collectives::Tensor idx,
                         IndicesOf(indices, iref->desc, iref->local_shape, bytes));
        inputs.push_back(std::move(idx));
      }
    }
    r.dtype = desc.dtype;
    r.shape = inputs.at(0).shape;
    RETURN_IF_ERROR(CheckReduction(r));
  }
  std::optional<TensorDesc> out_desc;
  if (r.takes_input()) {
    ASSIGN_OR_RETURN(out_desc, OutputDesc(p.mesh, r, tensor, desc));
  }
  ASSIGN_OR_RETURN(CollectiveResult result, collectives_->Run(p, r, std::move(inputs)));
  Json sparse;  // sparse_all_reduce: the path taken; the outputs become dense sums
  if (r.op == CollectiveOp::kSparseAllReduce) {
    std::vector<collectives::Tensor> dense;
    for (size_t i = 0; i + 1 < result.outputs.size(); i += 2) {
      if (result.paths[i / 2] == "dense") {  // every row in order: the values are the sum
        dense.push_back(std::move(result.outputs[i]));
        continue;
      }
      auto indices = result.outputs[i + 1].values<int64_t>();
      ASSIGN_OR_RETURN(collectives::Tensor d,
                       collectives::Densify({std::move(result.outputs[i]),
                                             {indices.begin(), indices.end()}, r.dense_shape}));
      dense.push_back(std::move(d));
    }
    sparse = {{"path", result.paths.empty() ? "" : result.paths[0]},
              {"rows", result.outputs.empty() ? 0 : result.outputs[1].shape[0]}};
    result.outputs = std::move(dense);
  }
  Json out = {{"op", CollectiveOpName(r.op)}, {"bytes", 0}};
  if (out_desc && !output.empty()) {
    uint64_t bytes = 0;
    for (size_t i = 0; i < result.outputs.size(); ++i) {
      const collectives::Tensor& t = result.outputs[i];
      RETURN_IF_ERROR(
          store_->Install(p.mesh.name, output, *out_desc, p.devices[i], t.data.data(), t.data.size()));
      bytes += t.data.size();
    }
    out = TensorDescToJson(*out_desc);
    out["op"] = CollectiveOpName(r.op);
    out["output"] = output;
    out["bytes"] = bytes;
  }
  if (sparse.is_object()) out.update(sparse);
  return out;
}

Result<Json> Agent::DoMeshInit(const Task& task) {
  RETURN_IF_ERROR(CheckCollectives());
  const MeshPlacement p = PlacementFromTask(task);
  const Mesh& mesh = p.mesh;
  // Seed 000's device table: one row per global device, (worker rank + 1, local
  // index, the worker's device count). Each local device fills only its own row
  // of a zero table; the sum over every device is the merged table.
  const int64_t n = mesh.num_devices();
  CollectiveRequest r;
  r.op = CollectiveOp::kAllReduce;
  r.mesh = mesh.name;
  r.dtype = DType::kInt64;
  r.shape = {n, 3};
  r.timeout_ms = task.timeout_ms;
  r.job = task.job;
  std::vector<collectives::Tensor> inputs;
  for (int64_t device : p.devices) {
    collectives::Tensor t = collectives::Tensor::Zeros(DType::kInt64, r.shape);
    auto row = t.values<int64_t>().subspan(static_cast<size_t>(device) * 3, 3);
    row[0] = p.rank + 1;
    row[1] = device - p.rank * mesh.devices_per_worker;
    row[2] = options_.devices;
    inputs.push_back(std::move(t));
  }
  ASSIGN_OR_RETURN(CollectiveResult result, collectives_->Run(p, r, std::move(inputs)));
  const collectives::Tensor& table = result.outputs.at(0);
  auto rows = table.values<int64_t>();
  Json out_rows = Json::array();
  for (int64_t d = 0; d < n; ++d) {
    const int64_t owner = mesh.WorkerOfDevice(d);
    const std::string who = MeshCollectives::WorkerName(p, owner);
    const int64_t* row = &rows[static_cast<size_t>(d) * 3];
    if (row[0] != owner + 1 || row[1] != d % mesh.devices_per_worker) {
      return Internal("device table: device " + std::to_string(d) + " should be filled by " +
                          who + " (rank " + std::to_string(owner) + "), found " +
                          Json(std::vector<int64_t>(row, row + 3)).dump(),
                      {{"device", d}, {"worker", who}});
    }
    if (row[2] != mesh.devices_per_worker) {
      return InvalidArgument(who + " reports " + std::to_string(row[2]) +
                                 " devices but the mesh needs " +
                                 std::to_string(mesh.devices_per_worker) + " per worker",
                             {{"worker", who}, {"rank", owner}, {"devices", row[2]}});
    }
    out_rows.push_back({{"device", d}, {"worker", who}, {"rank", owner}, {"local_index", row[1]}});
  }
  auto digest = collectives::HashBytes(table.data);
  char hex[33];
  std::snprintf(hex, sizeof(hex), "%016llx%016llx", static_cast<unsigned long long>(digest[0]),
                static_cast<unsigned long long>(digest[1]));
  return Json{{"digest", hex}, {"devices", out_rows}, {"bytes", 0}};
}

Result<Json> Agent::PreemptionSyncPoint(const std::string& mesh, int64_t step, int64_t timeout_ms) {
  ASSIGN_OR_RETURN(Json j, control_.Wait("POST",
                                         "/api/v1/meshes/" + http::PercentEncode(mesh) +
                                             "/preemption/sync",
                                         Json{{"worker", id_}, {"step", step}, {"timeout_ms", timeout_ms}},
                                         timeout_ms));
  Json sync_step = j.value("sync_step", Json());
  const bool sync = j.value("noticed", false) && sync_step.is_number_integer() &&
                    sync_step.get<int64_t>() == step;
  return Json{{"sync", sync}, {"sync_step", sync_step}};
}

}  // namespace tessera::worker
