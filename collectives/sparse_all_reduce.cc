#include "collectives/sparse_all_reduce.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>

#include "collectives/call.h"
#include "collectives/engine.h"

namespace tessera::collectives {
namespace {

}  // namespace

Status CheckSlices(const IndexedSlices& s) {
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

namespace {

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
  RETURN_IF_ERROR(CheckSlices(slices));
  std::vector<uint8_t> accum = DenseAccum(slices);
  Tensor dense = Tensor::Zeros(slices.values.dtype, slices.dense_shape);
  FromAccum(dense.dtype, accum.data(), dense.num_elements(), dense.data.data());
  return dense;
}

const char* SparsePathName(SparsePath path) {
  static constexpr const char* kNames[] = {"auto", "gather", "dense"};
  return kNames[static_cast<int>(path)];
}

namespace {

// Step 1's payload: the row count, or -1 and "field\0message" for a malformed input.
std::vector<uint8_t> RowsPayload(int64_t rows, const Status& input) {
  std::vector<uint8_t> out(sizeof(int64_t));
  const int64_t value = input.ok() ? rows : -1;
  std::memcpy(out.data(), &value, sizeof(value));
  if (!input.ok()) {
    const std::string field =
        input.details().is_object() ? input.details().value("field", std::string()) : "";
    out.insert(out.end(), field.begin(), field.end());
    out.push_back(0);
    out.insert(out.end(), input.message().begin(), input.message().end());
  }
  return out;
}

// invalid_argument naming every rank whose input is malformed, the same on every rank.
Status MalformedRanks(const std::string& call, const std::vector<ConstBytes>& payloads) {
  std::vector<int> ranks;
  std::string field, first;
  for (size_t r = 0; r < payloads.size(); ++r) {
    int64_t rows = 0;
    std::memcpy(&rows, payloads[r].data(), sizeof(rows));
    if (rows >= 0) continue;
    ranks.push_back(static_cast<int>(r));
    if (ranks.size() > 1) continue;
    std::string text(reinterpret_cast<const char*>(payloads[r].data()) + sizeof(rows),
                     payloads[r].size() - sizeof(rows));
    const size_t nul = text.find('\0');
    field = text.substr(0, nul);
    first = nul == std::string::npos ? text : text.substr(nul + 1);
  }
  std::string who = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) who += (i ? ", " : "") + std::to_string(ranks[i]);
  nlohmann::json details = {{"invalid_ranks", ranks}};
  if (!field.empty()) details["field"] = field;
  return InvalidArgument(call + ": the input of " + who + " is malformed: " + first,
                         std::move(details));
}

}  // namespace

Result<IndexedSlices> SparseAllReduce(Group& group, const IndexedSlices& slices,
                                      const SparseAllReduceOptions& o, SparsePath* path_taken) {
  const Status input = !o.input_error.ok() ? o.input_error : CheckSlices(slices);
  const int n = group.size();
  Session session(group, o.timeout);
  const std::string type = DescribeType(slices.values.dtype, slices.dense_shape);
  const int64_t rows = input.ok() ? slices.values.shape[0] : 0;
  bool gather = false;
  {
    // Step 1: everyone's row count, or why its input is malformed (then every
    // rank fails alike, and the group stays usable).
    ASSIGN_OR_RETURN(Call call, session.Begin({"sparse_all_reduce",
                                               type + ", path=" + SparsePathName(o.path)}));
    const std::vector<uint8_t> mine = RowsPayload(rows, input);
    call.SetLatencyBound(true);
    ASSIGN_OR_RETURN(auto counts, call.Exchange({Algorithm::kDirect, 0}, ConstBytes(mine)));
    bool equal = true, malformed = false;
    for (int r = 0; r < n; ++r) {
      if (counts[r].size() < sizeof(rows)) {
        return call.Fail(Internal("protocol error: bad row count from rank " + std::to_string(r)));
      }
      int64_t theirs = 0;
      std::memcpy(&theirs, counts[r].data(), sizeof(theirs));
      malformed = malformed || theirs < 0;
      equal = equal && theirs == rows;
    }
    if (malformed) return MalformedRanks(call.description(), counts);
    gather = o.path == SparsePath::kGather || (o.path == SparsePath::kAuto && equal);
    const uint64_t dense_bytes = static_cast<uint64_t>(NumElements(slices.dense_shape)) *
                                 DTypeSize(AccumDType(slices.values.dtype));
    if (!gather && dense_bytes > o.max_dense_bytes) {
      return ResourceExhausted(
          call.description() + ": the dense path would hold " + std::to_string(dense_bytes) +
              " bytes, more than " + std::to_string(o.max_dense_bytes) +
              " (row counts differ; with equal row counts the values are gathered instead)",
          {{"field", "dense_shape"}, {"dense_bytes", dense_bytes}});
    }
    if (path_taken != nullptr) *path_taken = gather ? SparsePath::kGather : SparsePath::kDense;
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
  ASSIGN_OR_RETURN(Call call, session.Begin({"sparse_all_reduce.dense", type}));
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
