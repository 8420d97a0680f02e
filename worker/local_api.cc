#include "worker/local_api.h"

#include <string>
#include <utility>

#include "api/dtype.h"
#include "api/json_codec.h"
#include "api/mesh.h"
#include "api/shape.h"

namespace tessera::worker {
namespace {

using http::Request;
using http::Response;
using http::RequiredQuery;

Result<int64_t> RequiredIntQuery(const Request& req, const std::string& key) {
  RETURN_IF_ERROR(RequiredQuery(req, key).status());
  return http::QueryInt(req, key, 0);
}

// The shard a request is about: ?mesh=&device=.
struct ShardQuery {
  std::string mesh;
  int64_t device = 0;
};

Result<ShardQuery> ShardFromQuery(const Request& req) {
  ShardQuery q;
  ASSIGN_OR_RETURN(q.mesh, RequiredQuery(req, "mesh"));
  ASSIGN_OR_RETURN(q.device, RequiredIntQuery(req, "device"));
  return q;
}

// ?dtype=&shape=&layout= of PUT and mapping.
Result<TensorDesc> DescFromQuery(const Request& req) {
  TensorDesc desc;
  ASSIGN_OR_RETURN(std::string dtype, RequiredQuery(req, "dtype"));
  ASSIGN_OR_RETURN(desc.dtype, ParseDType(dtype, "dtype"));
  ASSIGN_OR_RETURN(std::string shape, RequiredQuery(req, "shape"));
  ASSIGN_OR_RETURN(desc.shape, ParseShape(shape, "shape"));
  ASSIGN_OR_RETURN(std::string layout, RequiredQuery(req, "layout"));
  ASSIGN_OR_RETURN(desc.layout, ParseLayout(layout, "layout"));
  return desc;
}

// A PUT's body limit, from the header alone: the bytes of the whole tensor it
// declares (a shard is never larger). A query that does not parse leaves the
// server's limit; the handler then names what is wrong.
uint64_t DeclaredTensorBytes(const Request& req) {
  auto desc = DescFromQuery(req);
  if (!desc.ok() || !CheckShapeSize(desc->shape).ok()) return http::ServerMaxBody(req);
  return desc->logical_bytes();
}

Json InfoToJson(const TensorInfo& info) {
  Json j = TensorMetaToJson(TensorMeta(info.name, info.desc));
  j["mesh"] = info.mesh;
  j["devices"] = info.devices;
  j["mapped"] = info.mapped;
  return j;
}

Result<Response> MapShard(TensorStore* store, const Request& req) {
  ASSIGN_OR_RETURN(ShardQuery q, ShardFromQuery(req));
  ASSIGN_OR_RETURN(TensorDesc desc, DescFromQuery(req));
  ASSIGN_OR_RETURN(ShardMapping m, store->Map(q.mesh, req.Param("name"), desc, q.device));
  return Response::Json(
      200, {{"path", m.path}, {"bytes", m.bytes}, {"local_shape", ShapeToJson(m.local_shape)}});
}

Result<Response> PutShard(TensorStore* store, const Request& req) {
  ASSIGN_OR_RETURN(ShardQuery q, ShardFromQuery(req));
  ASSIGN_OR_RETURN(TensorDesc desc, DescFromQuery(req));
  RETURN_IF_ERROR(store->Put(q.mesh, req.Param("name"), desc, q.device, req.body));
  return Response::NoContent();
}

Result<Response> GetShard(TensorStore* store, const Request& req) {
  ASSIGN_OR_RETURN(ShardQuery q, ShardFromQuery(req));
  Response res;
  res.content_type = "application/octet-stream";
  ASSIGN_OR_RETURN(ShardRef ref, store->Read(q.mesh, req.Param("name"), q.device, &res.body));
  res.headers = {{"X-Tessera-Dtype", std::string(DTypeName(ref.desc.dtype))},
                 {"X-Tessera-Shape", ShapeToString(ref.desc.shape)},
                 {"X-Tessera-Layout", ref.desc.layout.ToString()},
                 {"X-Tessera-Local-Shape", ShapeToString(ref.local_shape)}};
  return res;
}

Result<Response> ListTensors(TensorStore* store, const Request&) {
  Json out = Json::array();
  for (const TensorInfo& info : store->List()) out.push_back(InfoToJson(info));
  return Response::Json(200, out);
}

Result<Response> DeleteTensor(TensorStore* store, const Request& req) {
  ASSIGN_OR_RETURN(std::string mesh, RequiredQuery(req, "mesh"));
  RETURN_IF_ERROR(store->Delete(mesh, req.Param("name")));
  return Response::NoContent();
}

// GET /v1/meshes/{mesh}/devices: this worker's rank and devices of a mesh.
Result<Response> MeshDevices(TensorStore* store, const Request& req) {
  ASSIGN_OR_RETURN(MeshPlacement p, store->Placement(req.Param("mesh")));
  return Response::Json(200, {{"mesh", p.mesh.name},
                              {"axes", MeshToJson(p.mesh)["axes"]},
                              {"devices_per_worker", p.mesh.devices_per_worker},
                              {"rank", p.rank},
                              {"devices", p.devices},
                              {"workers", p.workers}});
}

// A route (behind the worker's local credential) whose errors become docs/openapi-worker.json's JSON error.
http::Route LocalRoute(std::string method, std::string pattern, TensorStore* store,
                       Result<Response> (*handler)(TensorStore*, const Request&),
                       std::string help,
                       std::function<uint64_t(const Request&)> body_limit = nullptr) {
  return {std::move(method), std::move(pattern),
          http::Handle([store, handler](const Request& req) { return handler(store, req); }),
          std::move(help), true, std::move(body_limit)};
}

}  // namespace

void AddTensorRoutes(http::Router* router, TensorStore* store) {
  // Before the {name+} routes, so that ".../mapping" is never read as part of a name.
  router->Add(LocalRoute("POST", "/v1/tensors/{name+}/mapping", store, MapShard,
                         "map a local shard from a 0600 file in /dev/shm: {path, bytes, local_shape}"));
  router->Add(LocalRoute("PUT", "/v1/tensors/{name+}", store, PutShard,
                         "store the raw bytes of a device's local shard", DeclaredTensorBytes));
  router->Add(LocalRoute("GET", "/v1/tensors/{name+}", store, GetShard,
                         "the raw bytes of a device's local shard"));
  router->Add(
      LocalRoute("GET", "/v1/tensors", store, ListTensors, "the tensors this worker holds"));
  router->Add(LocalRoute("DELETE", "/v1/tensors/{name+}", store, DeleteTensor,
                         "drop a tensor and its mappings"));
  router->Add(LocalRoute("GET", "/v1/meshes/{mesh+}/devices", store, MeshDevices,
                         "this worker's rank and devices of a mesh"));
}

}  // namespace tessera::worker
