// The collectives: one free function per op, each with its options struct.
//
// Every op is SPMD: all ranks of the group call it with the same arguments
// (shapes, dtypes, options), in the same order (see group.h). Any failure after
// the call started talking to its peers poisons the group, as in Gloo: later
// calls fail fast with the original error. An argument error detected locally
// (wrong byte count, bad root) returns before any communication and leaves the
// group usable; that rank's peers then time out waiting for it.
//
// Results are bit-identical on every rank. Reductions follow reduce.h: float16
// and bfloat16 are accumulated in float32 and rounded once; mean divides by the
// number of contributions.
#pragma once

#include <string>
#include <string_view>

#include "api/status.h"
#include "collectives/group.h"
#include "collectives/options.h"
#include "collectives/reduce.h"
#include "collectives/tensor.h"

namespace tessera::collectives {

struct AllReduceOptions : Options {
  ReduceOp op = ReduceOp::kSum;
  // When set, a NaN or infinity in the result is an invalid_argument error
  // (details nan_count, inf_count, first_index) on every rank; the tensor still
  // holds the result.
  bool check_inf_nan = false;
};

// Reduces `tensor` over the group, in place.
Status AllReduce(Group& group, Tensor& tensor, const AllReduceOptions& options = {});

struct AllGatherOptions : Options {
  // false: stack on a new leading axis of size n (inputs must have equal shapes).
  // true: concatenate along axis 0; first dimensions may differ between ranks
  // (the lengths travel in the opening exchange; the ring pads to the longest
  // and strips the padding). Scalars are always stacked.
  bool tiled = false;
};

// Gathers every rank's `input` in rank order into `output` (dtype and shape are
// set; its storage is reused when large enough). REQUIRES: &output != &input.
Status AllGatherInto(Group& group, const Tensor& input, Tensor& output,
                     const AllGatherOptions& options = {});
Result<Tensor> AllGather(Group& group, const Tensor& input, const AllGatherOptions& options = {});

struct ReduceScatterOptions : Options {
  ReduceOp op = ReduceOp::kSum;
};

// Reduces `input` over the group and returns this rank's slice of the result
// along axis 0: rows [r·d/n, (r+1)·d/n). The first dimension d must be divisible
// by the group size.
Result<Tensor> ReduceScatter(Group& group, const Tensor& input,
                             const ReduceScatterOptions& options = {});

struct BroadcastOptions : Options {
  int root = 0;
};

// Every rank's `tensor` becomes the root's. Non-roots contribute nothing: they
// give the dtype and shape, their bytes are ignored (and may be empty).
Status Broadcast(Group& group, Tensor& tensor, const BroadcastOptions& options = {});

struct BarrierOptions : Options {
  // Ranks with different names fail with both names (sync_global_devices).
  std::string name;
  // This rank's devices; each contributes a one to the all-reduce.
  int64_t local_devices = 1;
  // The device count the barrier must reach; -1 means size() · local_devices.
  int64_t mesh_size = -1;
};

// Returns once every rank has arrived. It is an all-reduce of ones, one per
// device: a sum other than mesh_size fails on every rank with conflict "wrong
// mesh size" and both numbers (details.expected, details.actual).
Status Barrier(Group& group, const BarrierOptions& options = {});

// OK if every rank holds the same dtype, shape and bytes; else conflict on every
// rank with `message`, the ranks whose value differs from rank 0's
// (details.differing_ranks) and the classes of equal values (details.classes).
// Values are compared by a 128-bit digest.
Status AssertEqual(Group& group, const Tensor& value, std::string_view message,
                   const Options& options = {});

}  // namespace tessera::collectives
