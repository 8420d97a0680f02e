// The names of the collectives and of their reductions: one list, read by the worker's
// local API and engine and by tesserad's REST collectives jobs.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "api/status.h"

namespace tessera {

enum class CollectiveOp {
  // Device-level, within each group of devices along `axes` (all axes if empty).
  // Every local device contributes one input of `shape` and gets one output.
  kAllReduce,      // reduce=sum|prod|min|max|mean, check_inf_nan
  kAllGather,      // tiled: concatenate along axis 0; else stack on a new axis
  kReduceScatter,  // reduce; device at group position p gets rows [p·d/n, (p+1)·d/n)
  kBroadcast,      // root: position within the group whose input everyone gets
  kAssertEqual,    // message; every device of the group must hold equal values
  // Several tensors (`shapes`) per device, all-reduced with few messages: packed
  // by group_by_size (bytes_per_pack) when each worker holds one device of a
  // group, else tensor by tensor (hierarchically).
  kBatchAllReduce,
  // Indexed slices (values [k, ...], indices [k], dense_shape) summed within each
  // group: gathered when every worker brings as many rows, else densified and
  // all-reduced (TF cross_device_utils); path=auto|gather|dense.
  kSparseAllReduce,
  kBarrier,  // the whole mesh: all-reduce of ones checked against its size
  // Process-level (jax.experimental.multihost_utils): one value per worker.
  kBroadcastOneToAll,  // is_source (default: the worker of rank 0)
  kProcessAllGather,   // tiled
};

enum class ReduceOp { kSum, kProd, kMin, kMax, kMean };

// "all_reduce", ... (the {op} of the local API's routes and the "op" of a REST job).
std::string_view CollectiveOpName(CollectiveOp op);
// invalid_argument naming the field "op" and listing the allowed names.
Result<CollectiveOp> ParseCollectiveOp(std::string_view name);
// The ops a REST collectives job runs on tensors the workers hold.
bool IsRestCollective(CollectiveOp op);
// "all_reduce, all_gather, ..." of the REST ops, for error messages.
std::string RestCollectiveNames();

// "sum", "prod", "min", "max", "mean".
std::string_view ReduceOpName(ReduceOp op);
// invalid_argument naming the field "reduce".
Result<ReduceOp> ParseReduceOp(std::string_view name);

}  // namespace tessera
