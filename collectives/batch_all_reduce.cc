#include "collectives/batch_all_reduce.h"

#include <string>

#include "collectives/call.h"
#include "collectives/engine.h"

namespace tessera::collectives {

std::vector<std::vector<size_t>> GroupBySize(std::span<const Tensor> tensors,
                                             size_t bytes_per_pack) {
  std::vector<std::vector<size_t>> packs;
  size_t last_pack_bytes = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (packs.empty() || (bytes_per_pack > 0 && last_pack_bytes > bytes_per_pack)) {
      packs.emplace_back();
      last_pack_bytes = 0;
    }
    packs.back().push_back(i);
    last_pack_bytes += tensors[i].num_bytes();
  }
  return packs;
}

Status BatchAllReduce(Group& group, std::span<Tensor> tensors, const BatchAllReduceOptions& o) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    RETURN_IF_ERROR(tensors[i].Validate("tensors[" + std::to_string(i) + "]"));
    RETURN_IF_ERROR(CheckReducible(tensors[i].dtype, o.op));
  }
  Session session(group, o.timeout);
  Status first_non_finite;
  std::vector<uint8_t> fused;
  for (const auto& pack : GroupBySize(tensors, o.bytes_per_pack)) {
    for (size_t begin = 0; begin < pack.size();) {
      // One fused all-reduce per run of equal dtypes.
      const DType dtype = tensors[pack[begin]].dtype;
      const DType accum_dtype = AccumDType(dtype);
      const size_t es = DTypeSize(accum_dtype);
      size_t end = begin, count = 0;
      std::string shapes;
      for (; end < pack.size() && tensors[pack[end]].dtype == dtype; ++end) {
        count += static_cast<size_t>(tensors[pack[end]].num_elements());
        shapes += (shapes.empty() ? "[" : ",[") + ShapeToString(tensors[pack[end]].shape) + "]";
      }
      fused.resize(count * es);
      for (size_t i = begin, at = 0; i < end; ++i) {
        const Tensor& t = tensors[pack[i]];
        ToAccum(dtype, t.data.data(), t.num_elements(), fused.data() + at);
        at += t.num_elements() * es;
      }
      ASSIGN_OR_RETURN(Call call, session.Begin({"batch_all_reduce",
                                                 std::string(DTypeName(dtype)) + "{" + shapes +
                                                     "}, " + std::string(ReduceOpName(o.op))}));
      RETURN_IF_ERROR(AllReduceAccum(call, o.op, accum_dtype, fused.data(), count, o));
      for (size_t i = begin, at = 0; i < end; ++i) {
        Tensor& t = tensors[pack[i]];
        Status st = FinishReduce(o.op, dtype, fused.data() + at, t.num_elements(), group.size(),
                                 o.check_inf_nan, t.data.data(),
                                 "batch_all_reduce tensors[" + std::to_string(pack[i]) + "]");
        if (first_non_finite.ok()) first_non_finite = st;
        at += t.num_elements() * es;
      }
      begin = end;
    }
  }
  return first_non_finite;
}

}  // namespace tessera::collectives
