// One collective as a worker is asked to run it: by a trainer through the local
// API (POST /v1/collectives/{op}?mesh=&axes=&dtype=&shape=&...) or by tesserad in
// a REST collectives job (the same parameters in JSON).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "api/collective_ops.h"
#include "api/dtype.h"
#include "api/json_codec.h"
#include "api/shape.h"
#include "api/status.h"
#include "collectives/reduce.h"
#include "collectives/sparse_all_reduce.h"
#include "collectives/tensor.h"

namespace tessera::worker {

using ::tessera::CollectiveOp;
using ::tessera::CollectiveOpName;
using ::tessera::ParseCollectiveOp;
using ::tessera::ParseReduceOp;

struct CollectiveRequest {
  CollectiveOp op = CollectiveOp::kAllReduce;
  std::string mesh;
  std::vector<std::string> axes;  // as asked; empty = every axis
  DType dtype = DType::kFloat32;
  Shape shape;  // one device's (or, process-level, one worker's) input
  std::vector<Shape> shapes;  // batch_all_reduce: one device's inputs, in order
  uint64_t bytes_per_pack = 0;
  // sparse_all_reduce: values [rows, dense_shape[1:]...] of `dtype` and as many
  // indices of `index_dtype` (int32 or int64) per local device.
  Shape dense_shape;
  std::vector<int64_t> rows;  // the local API: each local device's row count
  DType index_dtype = DType::kInt64;
  collectives::SparsePath path = collectives::SparsePath::kAuto;
  collectives::ReduceOp reduce = collectives::ReduceOp::kSum;
  bool tiled = false;
  int64_t root = 0;
  std::optional<bool> is_source;
  bool check_inf_nan = false;
  std::string message;  // assert_equal
  std::string name;     // barrier: every participant must pass the same
  int64_t local_devices = -1;  // barrier: devices this worker brings; -1 = the mesh's
  int64_t timeout_ms = 30000;
  std::string job;  // the tesserad job running it, if any (for MeshCollectives::Abort)

  bool process_level() const {
    return op == CollectiveOp::kBroadcastOneToAll || op == CollectiveOp::kProcessAllGather;
  }
  // Ops without an input tensor.
  bool takes_input() const { return op != CollectiveOp::kBarrier; }
  // The shapes of one device's inputs (one worker's, process-level); not for
  // sparse_all_reduce, whose shapes differ by device.
  std::vector<Shape> input_shapes() const {
    if (!takes_input()) return {};
    return op == CollectiveOp::kBatchAllReduce ? shapes : std::vector<Shape>{shape};
  }
  // How many input tensors each device (process-level: the worker) brings:
  // sparse_all_reduce two, values and indices (as int64).
  size_t inputs_per_device() const {
    return op == CollectiveOp::kSparseAllReduce ? 2 : input_shapes().size();
  }
};

// Reads a request from named string parameters (query parameters, or JSON values
// rendered as strings: axes "data,model", booleans "true"/"false"). `get` returns
// nullopt for an absent parameter. `dtype` and `shape` are required when the op
// takes an input; errors are invalid_argument naming the field.
using ParamGetter = std::function<std::optional<std::string>(const std::string& key)>;
Result<CollectiveRequest> ParseCollectiveRequest(std::string_view op, const ParamGetter& get);

// invalid_argument when the op reduces and `reduce` does not apply to `dtype`
// (ParseCollectiveRequest checks it; call it again once the dtype is known later).
Status CheckReduction(const CollectiveRequest& request);

// This worker's inputs of `r` from the body of a local-API call: for each of
// `devices` local devices in order, its tensors of r.dtype × r.input_shapes();
// sparse_all_reduce: its values (r.rows[d] × dense_shape[1:]) then its indices
// (r.rows[d] of r.index_dtype, returned as int64 [rows]). invalid_argument naming
// the field (body, rows) when the bytes do not fit.
Result<std::vector<collectives::Tensor>> SplitInputs(std::string_view bytes, size_t devices,
                                                     const CollectiveRequest& r);

// `count` indices of `index_dtype` (int32 or int64, host order) at `data` as an
// int64 [count] tensor.
collectives::Tensor IndicesAsInt64(DType index_dtype, const void* data, size_t count);

// A ParamGetter over a JSON object (strings as they are, numbers and booleans
// printed, arrays of strings joined with commas).
ParamGetter JsonParams(const Json& object);

}  // namespace tessera::worker
