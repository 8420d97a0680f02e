#include "worker/collectives/sparse_all_reduce.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>

#include "worker/collectives/call.h"
#include "worker/collectives/engine.h"

namespace tessera::collectives {
namespace {

Status ValidateSlices(const IndexedSlices& s) {
  RETURN_IF_ERROR(s.values.Validate("values"));
  RETURN_IF_ERROR(CheckShapeSize(s.dense_shape, "dense_shape"));
  if (s.values.shape.empty() || s.dense_shape.size() != s.values.shape.size() ||
      !std::equal(s.values.shape.begin() + 1, s.values.shape.end(), s.dense_shape.begin() + 1)) {
    return InvalidArgument("values " + DescribeType(s.values.dtype, s.values.shape) +
                               " are not rows of dense_shape [" + ShapeToString(s.dense_shape) +
                               "]",
                           {{"field", "values"}});
  }
  if (static_cast<int64_t>(s.indices.size()) != s.values.shape[0]) {
    return InvalidArgument(std::to_string(s.indices.size()) + " indices for " +
                               std::to_string(s.values.shape[0]) + " value rows",
                           {{"field", "indices"}});
  }
  for (size_t i = 0; i < s.indices.size(); ++i) {
    if (s.indices[i] < 0 || s.indices[i] >= s.dense_shape[0]) {
      return InvalidArgument("indices[" + std::to_string(i) +
                                 "] = " + std::to_string(s.indices[i]) + " is outside [0, " +
                                 std::to_string(s.dense_shape[0]) + ")",
                             {{"field", "indices"}});
    }
  }
  return Status::Ok();
}

// Scatter-adds the rows into a zeroed dense buffer of accumulation dtype.
std::vector<uint8_t> DenseAccum(const IndexedSlices& s) {
  const DType accum_dtype = AccumDType(s.values.dtype);
  const size_t es = DTypeSize(accum_dtype);
  const size_t row =
      static_cast<size_t>(NumElements(Shape(s.dense_shape.begin() + 1, s.dense_shape.end())));
  std::vector<uint8_t> dense(static_cast<size_t>(NumElements(s.dense_shape)) * es, 0);
  std::vector<uint8_t> values(static_cast<size_t>(s.values.num_elements()) * es);
  ToAccum(s.values.dtype, s.values.data.data(), s.values.num_elements(), values.data());
  for (size_t i = 0; i < s.indices.size(); ++i) {
    uint8_t* dst = dense.data() + static_cast<size_t>(s.indices[i]) * row * es;
    ReduceElements(ReduceOp::kSum, accum_dtype, dst, values.data() + i * row * es, dst, row);
  }
  return dense;
}

}  // namespace

Result<Tensor> Densify(const IndexedSlices& slices) {
  RETURN_IF_ERROR(ValidateSlices(slices));
  std::vector<uint8_t> accum = DenseAccum(slices);
  Tensor dense = Tensor::Zeros(slices.values.dtype, slices.dense_shape);
  FromAccum(dense.dtype, accum.data(), dense.num_elements(), dense.data.data());
  return dense;
}

Result<IndexedSlices> SparseAllReduce(Group& group, const IndexedSlices& slices,
                                      const SparseAllReduceOptions& o) {
  RETURN_IF_ERROR(ValidateSlices(slices));
  const int n = group.size();
  static constexpr const char* kPathNames[] = {"auto", "gather", "dense"};
  Session session(group, o.timeout);
  {
    // Step 1: everyone's row count (the exchange is all that is needed).
    ASSIGN_OR_RETURN(
        Call call,
        session.Begin({"sparse_all_reduce", DescribeType(slices.values.dtype, slices.dense_shape) +
                                                ", path=" + kPathNames[static_cast<int>(o.path)]}));
    const int64_t rows = slices.values.shape[0];
    ASSIGN_OR_RETURN(auto counts, call.Exchange({Algorithm::kDirect, 0},
                                                ConstBytes(reinterpret_cast<const uint8_t*>(&rows),
                                                           sizeof(rows))));
    bool equal = true;
    for (int r = 0; r < n; ++r) {
      if (counts[r].size() != sizeof(rows)) {
        return call.Fail(Internal("protocol error: bad row count from rank " + std::to_string(r)));
      }
      equal = equal && std::memcmp(counts[r].data(), &rows, sizeof(rows)) == 0;
    }
    const bool gather = o.path == SparsePath::kGather || (o.path == SparsePath::kAuto && equal);
    if (gather) {
      IndexedSlices result;
      result.dense_shape = slices.dense_shape;
      RETURN_IF_ERROR(
          GatherTensor(session, slices.values, result.values, true, o, "sparse_all_reduce.values"));
      Tensor indices{DType::kInt64, {rows}, {}};
      indices.data.resize(slices.indices.size() * sizeof(int64_t));
      CopyBytes(indices.data.data(), slices.indices.data(), indices.data.size());
      Tensor all_indices;
      RETURN_IF_ERROR(
          GatherTensor(session, indices, all_indices, true, o, "sparse_all_reduce.indices"));
      auto gathered = all_indices.values<int64_t>();
      result.indices.assign(gathered.begin(), gathered.end());
      return result;
    }
  }
  // Step 2, dense path: every rank densifies, then one all-reduce of the dense sum.
  std::vector<uint8_t> accum = DenseAccum(slices);
  const DType accum_dtype = AccumDType(slices.values.dtype);
  const size_t count = static_cast<size_t>(NumElements(slices.dense_shape));
  ASSIGN_OR_RETURN(Call call,
                   session.Begin({"sparse_all_reduce.dense",
                                  DescribeType(slices.values.dtype, slices.dense_shape)}));
  RETURN_IF_ERROR(AllReduceAccum(call, ReduceOp::kSum, accum_dtype, accum.data(), count, o));
  IndexedSlices result;
  result.dense_shape = slices.dense_shape;
  result.values = Tensor::Zeros(slices.values.dtype, slices.dense_shape);
  FromAccum(result.values.dtype, accum.data(), count, result.values.data.data());
  result.indices.resize(static_cast<size_t>(slices.dense_shape[0]));
  std::iota(result.indices.begin(), result.indices.end(), int64_t{0});
  return result;
}

}  // namespace tessera::collectives
