// The device-level collectives of MeshCollectives, one device group at a time:
// each op on this worker's devices of the group (their inputs in, their outputs
// out), over the group's workers.
#include "worker/device_ops.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "collectives/collectives.h"
#include "collectives/hierarchical_all_reduce.h"
#include "collectives/sparse_all_reduce.h"
#include "worker/mesh_collectives.h"

namespace tessera::worker {

using collectives::Group;
using collectives::Tensor;

namespace {

// The inputs of local devices `first`.. `first + count` concatenated into one
// tensor with a leading dimension: [count·d0, ...] when `merge_first`, else
// [count, ...].
Tensor Concat(const std::vector<Tensor>& inputs, size_t first, size_t count, bool merge_first) {
  Tensor t;
  t.dtype = inputs[first].dtype;
  t.shape = inputs[first].shape;
  if (merge_first) {
    t.shape[0] *= static_cast<int64_t>(count);
  } else {
    t.shape.insert(t.shape.begin(), static_cast<int64_t>(count));
  }
  for (size_t i = first; i < first + count; ++i) {
    t.data.insert(t.data.end(), inputs[i].data.begin(), inputs[i].data.end());
  }
  return t;
}

// Rows [row, row + rows) of `t` along axis 0.
Tensor Rows(const Tensor& t, int64_t row, int64_t rows) {
  Tensor out;
  out.dtype = t.dtype;
  out.shape = t.shape;
  out.shape[0] = rows;
  const size_t row_bytes = t.num_bytes() / static_cast<size_t>(t.shape[0]);
  out.data.assign(t.data.begin() + static_cast<ptrdiff_t>(row * row_bytes),
                  t.data.begin() + static_cast<ptrdiff_t>((row + rows) * row_bytes));
  return out;
}


Result<std::vector<Tensor>> AllReduceOnGroup(const OnGroup& on, std::vector<Tensor>& local) {
  collectives::HierarchicalAllReduceOptions o;
  o.timeout = on.timeout;
  o.op = on.r.reduce;
  o.check_inf_nan = on.r.check_inf_nan;
  o.total_devices = on.n;
  RETURN_IF_ERROR(collectives::HierarchicalAllReduce(on.sub, local, o));
  return std::move(local);
}

Result<std::vector<Tensor>> AllGatherOnGroup(const OnGroup& on, std::vector<Tensor>& local) {
  collectives::AllGatherOptions o;
  o.timeout = on.timeout;
  o.tiled = true;  // each worker's share is a run of devices: concatenate the runs
  const bool merge = on.r.tiled && !on.r.shape.empty();
  ASSIGN_OR_RETURN(Tensor gathered,
                   collectives::AllGather(on.sub, Concat(local, 0, local.size(), merge), o));
  return std::vector<Tensor>(local.size(), gathered);
}

Result<std::vector<Tensor>> ReduceScatterOnGroup(const OnGroup& on, std::vector<Tensor>& local) {
  const int64_t rows = on.r.shape[0] / on.n;
  if (static_cast<int64_t>(on.g.workers.size()) == on.n) {  // one device per worker
    collectives::ReduceScatterOptions o;
    o.timeout = on.timeout;
    o.op = on.r.reduce;
    ASSIGN_OR_RETURN(Tensor part, collectives::ReduceScatter(on.sub, local[0], o));
    return std::vector<Tensor>{std::move(part)};
  }
  // Several devices here: reduce everything, keep each device's rows.
  collectives::HierarchicalAllReduceOptions o;
  o.timeout = on.timeout;
  o.op = on.r.reduce;
  o.total_devices = on.n;
  RETURN_IF_ERROR(collectives::HierarchicalAllReduce(on.sub, local, o));
  std::vector<Tensor> results;
  for (int64_t i = 0; i < on.count; ++i) {
    results.push_back(Rows(local[0], (on.position + i) * rows, rows));
  }
  return results;
}

Result<std::vector<Tensor>> BroadcastOnGroup(const OnGroup& on, std::vector<Tensor>& local) {
  const int64_t root_rank = on.p.mesh.WorkerOfDevice(on.g.devices[on.r.root]);
  collectives::BroadcastOptions o;
  o.timeout = on.timeout;
  o.root = static_cast<int>(std::find(on.g.workers.begin(), on.g.workers.end(), root_rank) -
                            on.g.workers.begin());
  Tensor value = root_rank == on.p.rank ? local[on.r.root - on.position] : local[0];
  RETURN_IF_ERROR(collectives::Broadcast(on.sub, value, o));
  return std::vector<Tensor>(local.size(), value);
}

Result<std::vector<Tensor>> AssertEqualOnGroup(const OnGroup& on, std::vector<Tensor>& local) {
  collectives::Options o;
  o.timeout = on.timeout;
  RETURN_IF_ERROR(collectives::AssertEqual(on.sub, local[0], on.r.message, o));
  return std::vector<Tensor>();
}


Result<std::vector<Tensor>> NotADeviceOp(const OnGroup&, std::vector<Tensor>&) {
  return Internal("not a device-level collective");
}

}  // namespace

std::string Join(const std::vector<std::string>& parts) {
  std::string out;
  for (const std::string& s : parts) out += (out.empty() ? "" : ",") + s;
  return out;
}

// Argument errors of device-level ops, found before any communication so that
// the caller hears at once and the mesh's group stays usable.
Status CheckDeviceOp(const Mesh& mesh, const CollectiveRequest& r) {
  ASSIGN_OR_RETURN(std::vector<std::string> axes, NormalizeAxes(mesh, r.axes));
  const int64_t n = static_cast<int64_t>(DeviceGroups(mesh, axes).at(0).devices.size());
  const std::string context = std::string(CollectiveOpName(r.op)) + " on mesh '" + mesh.name +
                              "' along [" + Join(axes) + "]";
  if (r.op == CollectiveOp::kReduceScatter && (r.shape.empty() || r.shape[0] % n != 0)) {
    return InvalidArgument(context + ": the first dimension of " +
                               collectives::DescribeType(r.dtype, r.shape) +
                               " is not divisible by the group size " + std::to_string(n),
                           {{"field", "shape"}, {"group_size", n}});
  }
  if (r.op == CollectiveOp::kBroadcast && r.root >= n) {
    return InvalidArgument(context + ": root " + std::to_string(r.root) +
                               " is not a position in a group of " + std::to_string(n),
                           {{"field", "root"}, {"group_size", n}});
  }
  return Status::Ok();
}

// sparse_all_reduce within one group: the shares of this worker's devices of the
// group (values and indices, concatenated) are its rank's slices, and each of
// those devices gets the sum. A malformed share still joins the call, so that
// every worker fails at once naming it.
Status SparseOnGroup(Group& sub, const DeviceGroup& g, int64_t position, int64_t count,
                     size_t first, const CollectiveRequest& r, std::vector<Tensor>& inputs,
                     CollectiveResult& out) {
  collectives::SparseAllReduceOptions o;
  o.timeout = std::chrono::milliseconds(r.timeout_ms);
  o.path = r.path;
  collectives::IndexedSlices mine;
  mine.dense_shape = r.dense_shape;
  mine.values.dtype = r.dtype;
  mine.values.shape = r.dense_shape;
  mine.values.shape[0] = 0;
  for (int64_t d = 0; d < count && o.input_error.ok(); ++d) {
    const Tensor& values = inputs[(first + d) * 2];
    const Tensor& indices = inputs[(first + d) * 2 + 1];
    collectives::IndexedSlices share{values, {}, r.dense_shape};
    Status st = indices.dtype == DType::kInt64 && indices.shape.size() == 1
                    ? Status::Ok()
                    : InvalidArgument("indices must be int64[rows], not " +
                                          collectives::DescribeType(indices.dtype, indices.shape),
                                      {{"field", "indices"}});
    if (st.ok()) {
      auto idx = indices.values<int64_t>();
      share.indices.assign(idx.begin(), idx.end());
      st = collectives::CheckSlices(share);
    }
    if (!st.ok()) {
      const int64_t device = g.devices[position + d];
      o.input_error = st.WithContext("device " + std::to_string(device)).WithDetail("device", device);
      break;
    }
    mine.values.shape[0] += values.shape[0];
    mine.values.data.insert(mine.values.data.end(), values.data.begin(), values.data.end());
    mine.indices.insert(mine.indices.end(), share.indices.begin(), share.indices.end());
  }
  collectives::SparsePath path = collectives::SparsePath::kAuto;
  ASSIGN_OR_RETURN(collectives::IndexedSlices sum, collectives::SparseAllReduce(sub, mine, o, &path));
  Tensor indices{DType::kInt64, {static_cast<int64_t>(sum.indices.size())}, {}};
  indices.data.resize(sum.indices.size() * sizeof(int64_t));
  if (!sum.indices.empty()) std::memcpy(indices.data.data(), sum.indices.data(), indices.data.size());
  for (int64_t d = 0; d < count; ++d) {
    out.outputs[(first + d) * 2] = sum.values;
    out.outputs[(first + d) * 2 + 1] = indices;
    out.paths[first + d] = collectives::SparsePathName(path);
  }
  return Status::Ok();
}

DeviceOp DeviceOpOf(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kAllReduce:
      return AllReduceOnGroup;
    case CollectiveOp::kAllGather:
      return AllGatherOnGroup;
    case CollectiveOp::kReduceScatter:
      return ReduceScatterOnGroup;
    case CollectiveOp::kBroadcast:
      return BroadcastOnGroup;
    case CollectiveOp::kAssertEqual:
      return AssertEqualOnGroup;
    default:
      return NotADeviceOp;
  }
}

// assert_equal among this worker's own devices of the group, before the group's check.
Status LocalDevicesAgree(const OnGroup& on, const std::vector<Tensor>& local,
                         const std::string& context) {
  std::vector<int64_t> differing;
  for (int64_t i = 1; i < on.count; ++i) {
    if (local[i].data != local[0].data) differing.push_back(on.g.devices[on.position + i]);
  }
  if (differing.empty()) return Status::Ok();
  const std::string self = MeshCollectives::WorkerName(on.p, on.p.rank);
  return Conflict(context + ": " + (on.r.message.empty() ? "values differ" : on.r.message) +
                      ": devices " + Json(differing).dump() + " of " + self +
                      " differ from device " + std::to_string(on.g.devices[on.position]),
                  {{"differing_devices", differing}, {"worker", self}});
}

}  // namespace tessera::worker
