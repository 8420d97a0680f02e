#include "worker/collective_request.h"

#include <charconv>
#include <climits>
#include <cstring>
#include <utility>

namespace tessera::worker {
namespace {

Result<bool> ParseBool(const std::string& text, const std::string& field) {
  if (text == "true" || text == "1") return true;
  if (text == "false" || text == "0") return false;
  return InvalidArgument(field + " must be true or false, not '" + text + "'", {{"field", field}});
}

Result<int64_t> ParseInt(const std::string& text, const std::string& field) {
  int64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size()) {
    return InvalidArgument(field + " must be an integer, not '" + text + "'", {{"field", field}});
  }
  return v;
}

std::vector<std::string> SplitCommas(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size() && !text.empty()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    if (comma > start) out.push_back(text.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

Status ParseSparse(const ParamGetter& get, CollectiveRequest& r) {
  auto dense_shape = get("dense_shape");
  if (!dense_shape) {
    return InvalidArgument("missing parameter 'dense_shape' (e.g. 1000,64)", {{"field", "dense_shape"}});
  }
  ASSIGN_OR_RETURN(r.dense_shape, ParseShape(*dense_shape, "dense_shape"));
  if (r.dense_shape.empty()) {
    return InvalidArgument("dense_shape needs at least one dimension (the rows indices pick)",
                           {{"field", "dense_shape"}});
  }
  if (auto v = get("rows")) {
    for (const std::string& text : SplitCommas(*v)) {
      ASSIGN_OR_RETURN(int64_t rows, ParseInt(text, "rows"));
      if (rows < 0 || rows > (int64_t{1} << 40)) {
        return InvalidArgument("rows must be 0..2^40, not " + text, {{"field", "rows"}});
      }
      r.rows.push_back(rows);
    }
  }
  if (auto v = get("index_dtype")) {
    ASSIGN_OR_RETURN(r.index_dtype, ParseDType(*v, "index_dtype"));
    if (r.index_dtype != DType::kInt32 && r.index_dtype != DType::kInt64) {
      return InvalidArgument("index_dtype must be int32 or int64, not " + *v,
                             {{"field", "index_dtype"}});
    }
  }
  if (r.index_dtype == DType::kInt32 && r.dense_shape[0] > INT32_MAX) {
    return InvalidArgument("int32 indices cannot address the " + std::to_string(r.dense_shape[0]) +
                               " rows of dense_shape; use index_dtype=int64",
                           {{"field", "index_dtype"}});
  }
  if (auto v = get("path")) {
    bool known = false;
    for (auto p : {collectives::SparsePath::kAuto, collectives::SparsePath::kGather,
                   collectives::SparsePath::kDense}) {
      if (*v == collectives::SparsePathName(p)) r.path = p, known = true;
    }
    if (!known) {
      return InvalidArgument("path must be auto, gather or dense, not '" + *v + "'",
                             {{"field", "path"}});
    }
  }
  return Status::Ok();
}

// `devices` runs of tensors of dtype × shapes (device-major).
Result<std::vector<collectives::Tensor>> SplitDense(std::string_view bytes, size_t devices,
                                                    DType dtype, const std::vector<Shape>& shapes) {
  std::vector<collectives::Tensor> inputs;
  if (shapes.empty()) return inputs;
  size_t per_device = 0;
  std::string described;
  for (const Shape& shape : shapes) {
    RETURN_IF_ERROR(CheckShapeSize(shape, shapes.size() == 1 ? "shape" : "shapes"));
    per_device += static_cast<size_t>(NumElements(shape)) * DTypeSize(dtype);
    described += (described.empty() ? "" : " + ") + collectives::DescribeType(dtype, shape);
  }
  if (bytes.size() != per_device * devices) {
    return InvalidArgument(
        "the body has " + std::to_string(bytes.size()) + " bytes; expected " +
            std::to_string(devices) + " device(s) × (" + described + ") = " +
            std::to_string(per_device * devices) + " bytes",
        {{"field", "body"}, {"expected_bytes", per_device * devices}, {"bytes", bytes.size()}});
  }
  size_t offset = 0;
  for (size_t d = 0; d < devices; ++d) {
    for (const Shape& shape : shapes) {
      collectives::Tensor t;
      t.dtype = dtype;
      t.shape = shape;
      const size_t n = static_cast<size_t>(NumElements(shape)) * DTypeSize(dtype);
      t.data.assign(bytes.begin() + static_cast<ptrdiff_t>(offset),
                    bytes.begin() + static_cast<ptrdiff_t>(offset + n));
      offset += n;
      inputs.push_back(std::move(t));
    }
  }
  return inputs;
}

// sparse_all_reduce: the body holds, for each local device in order, its values
// (rows × dense_shape[1:] of dtype) and then its indices (rows of index_dtype).
Result<std::vector<collectives::Tensor>> SplitSparse(std::string_view bytes, size_t devices,
                                                     const CollectiveRequest& r) {
  if (r.rows.size() != devices) {
    return InvalidArgument("rows must list the row count of each of this worker's " +
                               std::to_string(devices) + " device(s) of mesh " + r.mesh +
                               ", e.g. rows=" + std::string(devices > 1 ? "3,5" : "3"),
                           {{"field", "rows"}, {"devices", devices}});
  }
  const size_t index_size = DTypeSize(r.index_dtype);
  std::vector<collectives::Tensor> inputs;
  size_t expected = 0;
  for (int64_t rows : r.rows) {
    Shape shape = r.dense_shape;
    shape[0] = rows;
    RETURN_IF_ERROR(CheckShapeSize(shape, "rows"));
    expected += static_cast<size_t>(NumElements(shape)) * DTypeSize(r.dtype) +
                static_cast<size_t>(rows) * index_size;
    inputs.push_back({r.dtype, std::move(shape), {}});
    inputs.push_back({DType::kInt64, {rows}, {}});
  }
  if (bytes.size() != expected) {
    std::string rows;
    for (int64_t n : r.rows) rows += (rows.empty() ? "" : ",") + std::to_string(n);
    return InvalidArgument("the body has " + std::to_string(bytes.size()) + " bytes; rows=" + rows +
                               " of " + collectives::DescribeType(r.dtype, r.dense_shape) +
                               " with " + std::string(DTypeName(r.index_dtype)) +
                               " indices need " + std::to_string(expected),
                           {{"field", "body"}, {"expected_bytes", expected}, {"bytes", bytes.size()}});
  }
  size_t offset = 0;
  for (size_t i = 0; i < inputs.size(); i += 2) {
    collectives::Tensor& values = inputs[i];
    const size_t n = values.num_bytes();
    values.data.assign(bytes.begin() + offset, bytes.begin() + offset + n);
    offset += n;
    const size_t rows = static_cast<size_t>(inputs[i + 1].shape[0]);
    inputs[i + 1] = IndicesAsInt64(r.index_dtype, bytes.data() + offset, rows);
    offset += rows * index_size;
  }
  return inputs;
}

}  // namespace

Result<CollectiveRequest> ParseCollectiveRequest(std::string_view op, const ParamGetter& get) {
  CollectiveRequest r;
  ASSIGN_OR_RETURN(r.op, ParseCollectiveOp(op));
  if (auto v = get("mesh")) r.mesh = *v;
  if (auto v = get("axes")) r.axes = SplitCommas(*v);
  if (r.takes_input()) {
    auto dtype = get("dtype");
    if (!dtype) return InvalidArgument("missing parameter 'dtype'", {{"field", "dtype"}});
    ASSIGN_OR_RETURN(r.dtype, ParseDType(*dtype, "dtype"));
    if (r.op == CollectiveOp::kBatchAllReduce) {
      auto shapes = get("shapes");
      if (!shapes) {
        return InvalidArgument("missing parameter 'shapes' (e.g. 4,2;8)", {{"field", "shapes"}});
      }
      size_t start = 0;
      while (start <= shapes->size()) {
        size_t end = shapes->find(';', start);
        if (end == std::string::npos) end = shapes->size();
        ASSIGN_OR_RETURN(Shape one, ParseShape(shapes->substr(start, end - start), "shapes"));
        r.shapes.push_back(std::move(one));
        start = end + 1;
      }
      if (r.shapes.size() > 4096) {
        return InvalidArgument("at most 4096 tensors per batch", {{"field", "shapes"}});
      }
      if (auto v = get("bytes_per_pack")) {
        ASSIGN_OR_RETURN(int64_t b, ParseInt(*v, "bytes_per_pack"));
        if (b < 0) return InvalidArgument("bytes_per_pack must be ≥ 0", {{"field", "bytes_per_pack"}});
        r.bytes_per_pack = static_cast<uint64_t>(b);
      }
    } else if (r.op == CollectiveOp::kSparseAllReduce) {
      RETURN_IF_ERROR(ParseSparse(get, r));
    } else {
      auto shape = get("shape");
      if (!shape) return InvalidArgument("missing parameter 'shape'", {{"field", "shape"}});
      ASSIGN_OR_RETURN(r.shape, ParseShape(*shape, "shape"));
    }
  }
  if (auto v = get("reduce")) {
    ASSIGN_OR_RETURN(r.reduce, ParseReduceOp(*v));
  }
  if (auto v = get("tiled")) {
    ASSIGN_OR_RETURN(r.tiled, ParseBool(*v, "tiled"));
  }
  if (auto v = get("root")) {
    ASSIGN_OR_RETURN(r.root, ParseInt(*v, "root"));
  }
  if (auto v = get("is_source")) {
    ASSIGN_OR_RETURN(r.is_source, ParseBool(*v, "is_source"));
  }
  if (auto v = get("check_inf_nan")) {
    ASSIGN_OR_RETURN(r.check_inf_nan, ParseBool(*v, "check_inf_nan"));
  }
  if (auto v = get("message")) r.message = *v;
  if (auto v = get("local_devices")) {
    ASSIGN_OR_RETURN(r.local_devices, ParseInt(*v, "local_devices"));
    if (r.local_devices < 0) {
      return InvalidArgument("local_devices must be ≥ 0", {{"field", "local_devices"}});
    }
  }
  if (auto v = get("name")) r.name = *v;
  if (auto v = get("timeout_ms")) {
    ASSIGN_OR_RETURN(r.timeout_ms, ParseInt(*v, "timeout_ms"));
    if (r.timeout_ms < 1 || r.timeout_ms > 3600 * 1000) {
      return InvalidArgument("timeout_ms must be 1..3600000", {{"field", "timeout_ms"}});
    }
  }
  if (r.root < 0) return InvalidArgument("root must be ≥ 0", {{"field", "root"}});
  RETURN_IF_ERROR(CheckReduction(r));
  return r;
}

Status CheckReduction(const CollectiveRequest& r) {
  if (r.op == CollectiveOp::kSparseAllReduce) {
    if (r.dtype == DType::kBool) {
      return InvalidArgument("sparse_all_reduce sums its values: bool values cannot be summed",
                             {{"field", "dtype"}});
    }
    return Status::Ok();
  }
  if (r.op != CollectiveOp::kAllReduce && r.op != CollectiveOp::kReduceScatter &&
      r.op != CollectiveOp::kBatchAllReduce) {
    return Status::Ok();
  }
  return collectives::CheckReducible(r.dtype, r.reduce);
}

Result<std::vector<collectives::Tensor>> SplitInputs(std::string_view bytes, size_t devices,
                                                     const CollectiveRequest& r) {
  if (r.op == CollectiveOp::kSparseAllReduce) return SplitSparse(bytes, devices, r);
  return SplitDense(bytes, devices, r.dtype, r.input_shapes());
}

collectives::Tensor IndicesAsInt64(DType index_dtype, const void* data, size_t count) {
  collectives::Tensor t{DType::kInt64, {static_cast<int64_t>(count)}, {}};
  t.data.resize(count * sizeof(int64_t));
  auto out = t.values<int64_t>();
  const auto* in = static_cast<const uint8_t*>(data);
  for (size_t k = 0; k < count; ++k) {
    if (index_dtype == DType::kInt32) {
      int32_t v;
      std::memcpy(&v, in + k * sizeof(v), sizeof(v));
      out[k] = v;
    } else {
      std::memcpy(&out[k], in + k * sizeof(int64_t), sizeof(int64_t));
    }
  }
  return t;
}

ParamGetter JsonParams(const Json& object) {
  return [object](const std::string& key) -> std::optional<std::string> {
    auto it = object.find(key);
    if (it == object.end() || it->is_null()) return std::nullopt;
    if (it->is_string()) return it->get<std::string>();
    if (it->is_array()) {
      std::string joined;
      for (const Json& e : *it) {
        if (!joined.empty()) joined += ',';
        joined += e.is_string() ? e.get<std::string>() : e.dump();
      }
      return joined;
    }
    return it->dump();
  };
}

}  // namespace tessera::worker
