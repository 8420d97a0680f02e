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
  if (r.mesh.empty()) return InvalidArgument("missing query parameter 'mesh'", {{"field", "mesh"}});
  RETURN_IF_ERROR(ValidateName(r.mesh, "mesh"));
  return resolver(r.mesh);
}

Result<Response> RunCollective(const MeshResolver& resolver, MeshCollectives* collectives,
                               const Request& req) {
  ASSIGN_OR_RETURN(CollectiveRequest r, ParseCollectiveRequest(req.Param("op"), QueryParams(req)));
  if (r.op == CollectiveOp::kBarrier) r.name = req.Query("name").value_or("");
  ASSIGN_OR_RETURN(MeshPlacement p, Placement(resolver, r));
  const size_t count = !r.takes_input() ? 0 : r.process_level() ? 1 : p.devices.size();
  ASSIGN_OR_RETURN(std::vector<collectives::Tensor> inputs,
                   SplitInputs(req.body, count, r.dtype, r.shape));
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

Result<std::vector<collectives::Tensor>> SplitInputs(std::string_view bytes, size_t count,
                                                     DType dtype, const Shape& shape) {
  std::vector<collectives::Tensor> inputs;
  if (count == 0) return inputs;
  RETURN_IF_ERROR(CheckShapeSize(shape, "shape"));
  const size_t each = static_cast<size_t>(NumElements(shape)) * DTypeSize(dtype);
  if (bytes.size() != each * count) {
    return InvalidArgument(
        "the body has " + std::to_string(bytes.size()) + " bytes; expected " +
            std::to_string(count) + " input(s) of " + collectives::DescribeType(dtype, shape) +
            " = " + std::to_string(each * count) + " bytes",
        {{"field", "body"}, {"expected_bytes", each * count}, {"bytes", bytes.size()}});
  }
  for (size_t i = 0; i < count; ++i) {
    collectives::Tensor t;
    t.dtype = dtype;
    t.shape = shape;
    t.data.assign(bytes.begin() + static_cast<ptrdiff_t>(i * each),
                  bytes.begin() + static_cast<ptrdiff_t>((i + 1) * each));
    inputs.push_back(std::move(t));
  }
  return inputs;
}

void AddCollectiveRoutes(http::Router* router, MeshResolver resolver,
                         MeshCollectives* collectives) {
  auto wrap = [resolver, collectives](
                  Result<Response> (*fn)(const MeshResolver&, MeshCollectives*, const Request&)) {
    return [resolver, collectives, fn](const Request& req) {
      Result<Response> res = fn(resolver, collectives, req);
      return res.ok() ? std::move(res).value() : Response::Error(res.status());
    };
  };
  router->Add({"POST", "/v1/collectives/{op}", wrap(RunCollective),
               "SPMD collective across the mesh's workers: body = local-device inputs", false});
  router->Add({"POST", "/v1/barriers/{name+}", wrap(RunBarrier),
               "SPMD barrier across the mesh's workers (sync_global_devices)", false});
}

}  // namespace tessera::worker
