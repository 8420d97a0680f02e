#include "worker/collective_api.h"

#include <chrono>
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

Result<Response> RunCollective(const MeshResolver& resolver, MeshCollectives* collectives,
                               const Request& req) {
  ASSIGN_OR_RETURN(CollectiveRequest r, ParseCollectiveRequest(req.Param("op"), QueryParams(req)));
  ASSIGN_OR_RETURN(MeshPlacement p, Placement(resolver, r));
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
