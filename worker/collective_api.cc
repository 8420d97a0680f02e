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

std::string JoinList(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : ",") + s;
  return out;
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
  const size_t devices = r.process_level() ? 1 : p.devices.size();
  ASSIGN_OR_RETURN(std::vector<collectives::Tensor> inputs, SplitInputs(req.body, devices, r));
  ASSIGN_OR_RETURN(CollectiveResult result, collectives->Run(p, r, std::move(inputs)));
  if (r.op == CollectiveOp::kSparseAllReduce) return SparseResponse(r, result);
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

void AddCollectiveRoutes(http::Router* router, MeshResolver resolver,
                         MeshCollectives* collectives) {
  auto wrap = [resolver, collectives](
                  Result<Response> (*fn)(const MeshResolver&, MeshCollectives*, const Request&)) {
    return http::Handle(
        [resolver, collectives, fn](const Request& req) { return fn(resolver, collectives, req); });
  };
  router->Add({"POST", "/v1/collectives/{op}", wrap(RunCollective),
               "SPMD collective across the mesh's workers: body = local-device inputs", true,
               http::ServerMaxBody});
  router->Add({"POST", "/v1/barriers/{name+}", wrap(RunBarrier),
               "SPMD barrier across the mesh's workers (sync_global_devices)", true});
}

}  // namespace tessera::worker
