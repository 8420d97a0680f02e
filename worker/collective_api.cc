#include "worker/collective_api.h"

#include <chrono>
#include <cstring>
#include <string>
#include <utility>

#include "api/names.h"

namespace tessera::worker {
namespace {

using http::Request;
using http::Response;

ParamGetter QueryParams(const Request& req) {
  return [&req](const std::string& key) { return req.Query(key); };
}

Result<MeshPlacement> Placement(const MeshResolver& resolver, const CollectiveRequest& r) {
  if (r.mesh.empty()) return http::MissingQuery("mesh");
  RETURN_IF_ERROR(ValidateName(r.mesh, "mesh"));
  return resolver(r.mesh);
}

std::string JoinList(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : ",") + s;
  return out;
}

// sparse_all_reduce: the body holds, for each local device in order, its values
// (rows × dense_shape[1:] of dtype) and then its indices (rows of index_dtype).
Result<std::vector<collectives::Tensor>> SplitSparseInputs(std::string_view bytes,
                                                           size_t devices,
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
    collectives::Tensor& indices = inputs[i + 1];
    const size_t rows = static_cast<size_t>(indices.shape[0]);
    indices.data.resize(rows * sizeof(int64_t));
    auto out = indices.values<int64_t>();
    for (size_t k = 0; k < rows; ++k, offset += index_size) {
      if (index_size == sizeof(int32_t)) {
        int32_t v;
        std::memcpy(&v, bytes.data() + offset, sizeof(v));
        out[k] = v;
      } else {
        std::memcpy(&out[k], bytes.data() + offset, sizeof(int64_t));
      }
    }
  }
  return inputs;
}

// Each local device's result: its values, then its indices as index_dtype.
Response SparseResponse(const CollectiveRequest& r, const CollectiveResult& result) {
  Response res;
  res.content_type = "application/octet-stream";
  std::vector<std::string> rows;
  for (size_t i = 0; i + 1 < result.outputs.size(); i += 2) {
    const collectives::Tensor& values = result.outputs[i];
    res.body.append(reinterpret_cast<const char*>(values.data.data()), values.data.size());
    for (int64_t index : result.outputs[i + 1].values<int64_t>()) {
      if (r.index_dtype == DType::kInt32) {
        const int32_t v = static_cast<int32_t>(index);
        res.body.append(reinterpret_cast<const char*>(&v), sizeof(v));
      } else {
        res.body.append(reinterpret_cast<const char*>(&index), sizeof(index));
      }
    }
    rows.push_back(std::to_string(values.shape.empty() ? 0 : values.shape[0]));
  }
  res.headers = {{"X-Tessera-Dtype", std::string(DTypeName(r.dtype))},
                 {"X-Tessera-Index-Dtype", std::string(DTypeName(r.index_dtype))},
                 {"X-Tessera-Dense-Shape", ShapeToString(r.dense_shape)},
                 {"X-Tessera-Rows", JoinList(rows)},
                 {"X-Tessera-Sparse-Path", JoinList(result.paths)},
                 {"X-Tessera-Outputs", std::to_string(rows.size())}};
  if (!result.outputs.empty()) {
    res.headers.push_back({"X-Tessera-Shape", ShapeToString(result.outputs[0].shape)});
  }
  return res;
}

Result<Response> RunCollective(const MeshResolver& resolver, MeshCollectives* collectives,
                               const Request& req) {
  ASSIGN_OR_RETURN(CollectiveRequest r, ParseCollectiveRequest(req.Param("op"), QueryParams(req)));
  ASSIGN_OR_RETURN(MeshPlacement p, Placement(resolver, r));
  if (r.op == CollectiveOp::kSparseAllReduce) {
    ASSIGN_OR_RETURN(std::vector<collectives::Tensor> inputs,
                     SplitSparseInputs(req.body, p.devices.size(), r));
    ASSIGN_OR_RETURN(CollectiveResult result, collectives->Run(p, r, std::move(inputs)));
    return SparseResponse(r, result);
  }
  const size_t devices = r.process_level() ? 1 : p.devices.size();
  ASSIGN_OR_RETURN(std::vector<collectives::Tensor> inputs,
                   SplitInputs(req.body, devices, r.dtype, r.input_shapes()));
  ASSIGN_OR_RETURN(CollectiveResult result, collectives->Run(p, r, std::move(inputs)));
  Response res;
  res.content_type = "application/octet-stream";
  for (const collectives::Tensor& t : result.outputs) {
    res.body.append(reinterpret_cast<const char*>(t.data.data()), t.data.size());
  }
  if (!result.outputs.empty()) {
    res.headers = {{"X-Tessera-Dtype", std::string(DTypeName(result.outputs[0].dtype))},
                   {"X-Tessera-Shape", ShapeToString(result.outputs[0].shape)}};
  }
  if (r.op == CollectiveOp::kBatchAllReduce) {
    std::string shapes;
    for (size_t i = 0; i < r.shapes.size(); ++i) shapes += (i ? ";" : "") + ShapeToString(r.shapes[i]);
    res.headers.push_back({"X-Tessera-Shapes", shapes});
  }
  res.headers.push_back({"X-Tessera-Outputs", std::to_string(result.outputs.size())});
  return res;
}

Result<Response> RunBarrier(const MeshResolver& resolver, MeshCollectives* collectives,
                            const Request& req) {
  RETURN_IF_ERROR(ValidateName(req.Param("name"), "name"));
  ASSIGN_OR_RETURN(CollectiveRequest r, ParseCollectiveRequest("barrier", QueryParams(req)));
  r.name = req.Param("name");
  ASSIGN_OR_RETURN(MeshPlacement p, Placement(resolver, r));
  const auto start = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(collectives->Run(p, r, {}).status());
  const auto waited = std::chrono::duration_cast<std::chrono::microseconds>(
      std::chrono::steady_clock::now() - start);
  return Response::Json(200, {{"name", r.name},
                              {"mesh", p.mesh.name},
                              {"workers", p.mesh.num_workers()},
                              {"devices", p.mesh.num_devices()},
                              {"waited_us", waited.count()}});
}

}  // namespace

Result<std::vector<collectives::Tensor>> SplitInputs(std::string_view bytes, size_t devices,
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

void AddCollectiveRoutes(http::Router* router, MeshResolver resolver,
                         MeshCollectives* collectives) {
  auto wrap = [resolver, collectives](
                  Result<Response> (*fn)(const MeshResolver&, MeshCollectives*, const Request&)) {
    return http::Handle(
        [resolver, collectives, fn](const Request& req) { return fn(resolver, collectives, req); });
  };
  router->Add({"POST", "/v1/collectives/{op}", wrap(RunCollective),
               "SPMD collective across the mesh's workers: body = local-device inputs", true});
  router->Add({"POST", "/v1/barriers/{name+}", wrap(RunBarrier),
               "SPMD barrier across the mesh's workers (sync_global_devices)", true});
}

}  // namespace tessera::worker
