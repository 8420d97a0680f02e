#include "collectives/hierarchical_all_reduce.h"

#include <string>
#include <vector>

#include "collectives/call.h"
#include "collectives/engine.h"

namespace tessera::collectives {

Status HierarchicalAllReduce(Group& group, std::span<Tensor> local,
                             const HierarchicalAllReduceOptions& o) {
  if (local.empty()) {
    return InvalidArgument("hierarchical_all_reduce needs at least one local tensor");
  }
  const Tensor& first = local[0];
  for (size_t i = 0; i < local.size(); ++i) {
    const std::string what = "local[" + std::to_string(i) + "]";
    RETURN_IF_ERROR(local[i].Validate(what));
    if (local[i].dtype != first.dtype || local[i].shape != first.shape) {
      return InvalidArgument(what + " is " + DescribeType(local[i].dtype, local[i].shape) +
                             ", local[0] is " + DescribeType(first.dtype, first.shape));
    }
  }
  RETURN_IF_ERROR(CheckReducible(first.dtype, o.op));
  const DType accum_dtype = AccumDType(first.dtype);
  const size_t count = static_cast<size_t>(first.num_elements());
  std::vector<uint8_t> accum(count * DTypeSize(accum_dtype)), device(accum.size());
  ToAccum(first.dtype, first.data.data(), count, accum.data());
  for (size_t i = 1; i < local.size(); ++i) {  // device order, as the flat reduction
    ToAccum(first.dtype, local[i].data.data(), count, device.data());
    ReduceElements(o.op, accum_dtype, accum.data(), device.data(), accum.data(), count);
  }

  Session session(group, o.timeout);
  ASSIGN_OR_RETURN(Call call,
                   session.Begin({"hierarchical_all_reduce",
                                  DescribeType(first.dtype, first.shape) + ", " +
                                      std::string(ReduceOpName(o.op)) +
                                      (o.total_devices < 0
                                           ? ", local_devices=" + std::to_string(local.size())
                                           : ", devices=" + std::to_string(o.total_devices))}));
  RETURN_IF_ERROR(AllReduceAccum(call, o.op, accum_dtype, accum.data(), count, o));
  const int64_t devices = o.total_devices >= 0
                              ? o.total_devices
                              : group.size() * static_cast<int64_t>(local.size());
  Status st = FinishReduce(o.op, first.dtype, accum.data(), count, devices, o.check_inf_nan,
                           local[0].data.data(), call.description());
  for (size_t i = 1; i < local.size(); ++i) local[i].data = local[0].data;
  return st;
}

}  // namespace tessera::collectives
