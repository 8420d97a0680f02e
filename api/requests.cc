#include "api/requests.h"

#include <set>

#include "api/names.h"

namespace tessera {
namespace {

Status CheckNames(const std::vector<std::string>& names, const std::string& field) {
  std::set<std::string> seen;
  for (const std::string& n : names) {
    RETURN_IF_ERROR(ValidateName(n, field));
    if (!seen.insert(n).second) {
      return InvalidArgument(field + " names '" + n + "' twice", {{"field", field}, {"tensor", n}});
    }
  }
  return Status::Ok();
}

Result<RestoreTensor> RestoreTensorFromJson(const Json& j, size_t i) {
  const std::string where = "tensors[" + std::to_string(i) + "]";
  RestoreTensor t;
  if (j.is_string()) {
    t.name = j.get<std::string>();
  } else if (j.is_object() && j.contains("name") && j["name"].is_string()) {
    t.name = j["name"].get<std::string>();
    if (j.contains("dtype") && !j["dtype"].is_null()) {
      ASSIGN_OR_RETURN(t.dtype, DTypeFromJson(j["dtype"], where + ".dtype"));
    }
    if (j.contains("shape") && !j["shape"].is_null()) {
      ASSIGN_OR_RETURN(t.shape, ShapeFromJson(j["shape"], where + ".shape"));
    }
  } else {
    return InvalidArgument("each entry of 'tensors' is a name or {name, dtype?, shape?}; " +
                               where + " is " + j.dump().substr(0, 80),
                           {{"field", "tensors"}});
  }
  RETURN_IF_ERROR(ValidateName(t.name, "tensors"));
  return t;
}

}  // namespace

Result<SaveRequest> SaveRequest::FromJson(const Json& body, std::optional<int64_t> step) {
  RETURN_IF_ERROR(RequireObject(body));
  SaveRequest r;
  if (step) {
    r.step = *step;
  } else {
    ASSIGN_OR_RETURN(r.step, RequiredInt(body, "step"));
  }
  if (r.step < 0) return InvalidArgument("step must be ≥ 0", {{"field", "step"}});
  ASSIGN_OR_RETURN(r.tensors, OptionalNameList(body, "tensors"));
  if (r.tensors) RETURN_IF_ERROR(CheckNames(*r.tensors, "tensors"));
  ASSIGN_OR_RETURN(auto compression, OptionalString(body, "compression"));
  if (compression && *compression != "zstd" && *compression != "none") {
    return InvalidArgument("compression must be \"zstd\" or \"none\"", {{"field", "compression"}});
  }
  r.compress = compression.value_or("zstd") == "zstd";
  ASSIGN_OR_RETURN(auto level, OptionalInt(body, "level"));
  if (level && (*level < 1 || *level > 19)) {
    return InvalidArgument("level must be 1..19", {{"field", "level"}});
  }
  r.level = level.value_or(1);
  ASSIGN_OR_RETURN(auto full, OptionalBool(body, "full"));
  r.full = full.value_or(false);
  ASSIGN_OR_RETURN(auto full_every, OptionalInt(body, "full_every"));
  if (full_every && (*full_every < 1 || *full_every > 1000000)) {
    return InvalidArgument("full_every must be 1..1000000 (1: every save writes every chunk)",
                           {{"field", "full_every"}});
  }
  r.full_every = full_every.value_or(10);
  if (body.contains("metadata") && !body["metadata"].is_null()) {
    if (!body["metadata"].is_object()) {
      return InvalidArgument("field 'metadata' must be a JSON object", {{"field", "metadata"}});
    }
    r.metadata = body["metadata"];
  }
  ASSIGN_OR_RETURN(auto wait, OptionalBool(body, "wait_for_trainer"));
  r.wait_for_trainer = wait.value_or(false);
  ASSIGN_OR_RETURN(auto from_memory, OptionalBool(body, "from_memory"));
  r.from_memory = from_memory.value_or(false);
  if (r.from_memory && (r.tensors || r.wait_for_trainer)) {
    return InvalidArgument("a save from the memory tier writes the whole memory checkpoint, "
                           "now: no tensors, no wait_for_trainer",
                           {{"field", r.tensors ? "tensors" : "wait_for_trainer"}});
  }
  return r;
}

Json SaveRequest::ToJson() const {
  Json j = {{"step", step},
            {"compression", compress ? "zstd" : "none"},
            {"level", level},
            {"full_every", full_every},
            {"metadata", metadata}};
  if (full) j["full"] = true;
  if (tensors) j["tensors"] = *tensors;
  if (wait_for_trainer) j["wait_for_trainer"] = true;
  if (from_memory) j["from_memory"] = true;
  return j;
}

bool SaveRequest::SameSave(const SaveRequest& o) const {
  return step == o.step && tensors == o.tensors && compress == o.compress && level == o.level &&
         wait_for_trainer == o.wait_for_trainer && from_memory == o.from_memory;
}

Result<SaveJoinRequest> SaveJoinRequest::FromJson(const Json& body, int64_t step) {
  SaveJoinRequest r;
  ASSIGN_OR_RETURN(r.save, SaveRequest::FromJson(body, step));
  r.save.wait_for_trainer = true;
  ASSIGN_OR_RETURN(r.worker, RequiredString(body, "worker"));
  ASSIGN_OR_RETURN(r.job, OptionalString(body, "job"));
  if (body.contains("snapshot_age_ms")) {
    const Json& age = body["snapshot_age_ms"];
    if (!age.is_number_integer() || age.get<int64_t>() < 0) {
      return InvalidArgument("field 'snapshot_age_ms' must be a non-negative integer",
                             {{"field", "snapshot_age_ms"}});
    }
    r.snapshot_age_ms = age.get<int64_t>();
  }
  if (!body.contains("snapshot")) {
    return InvalidArgument("missing field 'snapshot' (the worker's snapshot of this step)",
                           {{"field", "snapshot"}});
  }
  auto snapshot = SnapshotResultFromJson(body["snapshot"]);
  if (!snapshot.ok()) return snapshot.status().WithContext("field 'snapshot'");
  r.snapshot = std::move(*snapshot);
  const bool has_error = body.contains("error") && !body["error"].is_null();
  const bool has_written = body.contains("written") && !body["written"].is_null();
  if (has_error == has_written) {
    return InvalidArgument("a join carries exactly one of 'written' (what the worker wrote) and "
                           "'error' (why it could not)",
                           {{"field", "written"}});
  }
  if (has_error) {
    if (!body["error"].is_object()) {
      return InvalidArgument("field 'error' must be an error object", {{"field", "error"}});
    }
    r.error = StatusFromErrorJson(body["error"]);
    if (r.error.ok()) r.error = Internal("the worker failed without an error code");
    return r;
  }
  const Json& w = body["written"];
  if (!w.is_object()) {
    return InvalidArgument("field 'written' must be an object", {{"field", "written"}});
  }
  SaveWritten written;
  for (auto [field, out] : {std::pair{"bytes", &written.bytes}, {"stored_bytes", &written.stored_bytes}}) {
    if (!w.contains(field) || !w[field].is_number_integer() || w[field].get<int64_t>() < 0) {
      return InvalidArgument(std::string("field 'written.") + field + "' must be a byte count",
                             {{"field", std::string("written.") + field}});
    }
    *out = w[field].get<uint64_t>();
  }
  if (w.contains("reused_bytes")) {
    if (!w["reused_bytes"].is_number_integer() || w["reused_bytes"].get<int64_t>() < 0) {
      return InvalidArgument("field 'written.reused_bytes' must be a byte count",
                             {{"field", "written.reused_bytes"}});
    }
    written.reused_bytes = w["reused_bytes"].get<uint64_t>();
  }
  if (w.contains("base") && !w["base"].is_null()) {
    if (!w["base"].is_number_integer() || w["base"].get<int64_t>() < 0) {
      return InvalidArgument("field 'written.base' must be a step", {{"field", "written.base"}});
    }
    written.base = w["base"].get<int64_t>();
  }
  if (!w.contains("fragment") || !w["fragment"].is_array()) {
    return InvalidArgument("field 'written.fragment' must be a list of slices",
                           {{"field", "written.fragment"}});
  }
  written.fragment = w["fragment"];
  r.written = std::move(written);
  return r;
}

Json SaveJoinRequest::ToJson() const {
  Json j = save.ToJson();
  j.erase("wait_for_trainer");
  j["worker"] = worker;
  if (job) j["job"] = *job;
  if (snapshot_age_ms >= 0) j["snapshot_age_ms"] = snapshot_age_ms;
  j["snapshot"] = SnapshotResultToJson(snapshot);
  if (written) {
    j["written"] = {{"bytes", written->bytes},
                    {"stored_bytes", written->stored_bytes},
                    {"fragment", written->fragment}};
    if (written->base) {
      j["written"]["base"] = *written->base;
      j["written"]["reused_bytes"] = written->reused_bytes;
    }
  } else {
    j["error"] = ErrorBody(error)["error"];
  }
  return j;
}

Result<RestoreRequest> RestoreRequest::FromJson(const Json& body) {
  RETURN_IF_ERROR(RequireObject(body));
  RestoreRequest r;
  ASSIGN_OR_RETURN(r.target_mesh, OptionalString(body, "target_mesh"));
  if (r.target_mesh) RETURN_IF_ERROR(ValidateName(*r.target_mesh, "target_mesh"));
  if (body.contains("tensors") && !body["tensors"].is_null()) {
    const Json& list = body["tensors"];
    if (!list.is_array()) {
      return InvalidArgument("field 'tensors' must be a list", {{"field", "tensors"}});
    }
    std::vector<RestoreTensor> tensors;
    std::set<std::string> seen;
    for (size_t i = 0; i < list.size(); ++i) {
      ASSIGN_OR_RETURN(RestoreTensor t, RestoreTensorFromJson(list[i], i));
      if (!seen.insert(t.name).second) {
        return InvalidArgument("tensors names '" + t.name + "' twice",
                               {{"field", "tensors"}, {"tensor", t.name}});
      }
      tensors.push_back(std::move(t));
    }
    r.tensors = std::move(tensors);
  }
  if (body.contains("layouts") && !body["layouts"].is_null()) {
    const Json& layouts = body["layouts"];
    if (!layouts.is_object()) {
      return InvalidArgument("field 'layouts' must be an object {tensor: layout}",
                             {{"field", "layouts"}});
    }
    for (const auto& [name, spec] : layouts.items()) {
      RETURN_IF_ERROR(ValidateName(name, "layouts"));
      ASSIGN_OR_RETURN(r.layouts[name], LayoutFromJson(spec, "layouts." + name));
    }
  }
  if (body.contains("workers") && !body["workers"].is_null()) {
    ASSIGN_OR_RETURN(r.workers, OptionalNameList(body, "workers"));
    if (r.workers->empty()) {
      return InvalidArgument("field 'workers' must be a non-empty list of worker ids",
                             {{"field", "workers"}});
    }
  }
  return r;
}

Json RestoreRequest::ToJson() const {
  Json j = Json::object();
  if (target_mesh) j["target_mesh"] = *target_mesh;
  if (tensors) {
    Json list = Json::array();
    for (const RestoreTensor& t : *tensors) {
      if (!t.dtype && !t.shape) {
        list.push_back(t.name);
        continue;
      }
      Json e = {{"name", t.name}};
      if (t.dtype) e["dtype"] = DTypeToJson(*t.dtype);
      if (t.shape) e["shape"] = ShapeToJson(*t.shape);
      list.push_back(std::move(e));
    }
    j["tensors"] = std::move(list);
  }
  if (!layouts.empty()) {
    Json l = Json::object();
    for (const auto& [name, layout] : layouts) l[name] = LayoutToJson(layout);
    j["layouts"] = std::move(l);
  }
  if (workers) j["workers"] = *workers;
  return j;
}

namespace {

// A path every process reads the same: absolute, or an object store's.
Result<std::string> SharedPath(const Json& body, const std::string& field) {
  ASSIGN_OR_RETURN(std::string path, RequiredString(body, field));
  if (path.empty() || (path[0] != '/' && path.rfind("s3://", 0) != 0)) {
    return InvalidArgument(field + " must be an absolute path (or s3://BUCKET/PREFIX) that tesserad and "
                               "the workers see alike, not '" + path.substr(0, 200) + "'",
                           {{"field", field}});
  }
  return path;
}

}  // namespace

Result<ExportRequest> ExportRequest::FromJson(const Json& body) {
  RETURN_IF_ERROR(RequireObject(body));
  ExportRequest r;
  ASSIGN_OR_RETURN(r.dir, SharedPath(body, "dir"));
  ASSIGN_OR_RETURN(std::optional<int64_t> max, OptionalInt(body, "max_file_size"));
  if (max && *max < 1) return InvalidArgument("max_file_size must be ≥ 1", {{"field", "max_file_size"}});
  if (max) r.max_file_bytes = static_cast<uint64_t>(*max);
  return r;
}

Json ExportRequest::ToJson() const { return {{"dir", dir}, {"max_file_size", max_file_bytes}}; }

Result<ImportRequest> ImportRequest::FromJson(const Json& body) {
  ImportRequest r;
  Json rest = body;
  if (rest.is_object()) rest.erase("source");
  ASSIGN_OR_RETURN(r.save, SaveRequest::FromJson(rest));
  if (r.save.tensors || r.save.wait_for_trainer) {
    return InvalidArgument("an import takes every tensor of its files: no tensors or wait_for_trainer",
                           {{"field", r.save.tensors ? "tensors" : "wait_for_trainer"}});
  }
  ASSIGN_OR_RETURN(r.source, SharedPath(body, "source"));
  return r;
}

Json ImportRequest::ToJson() const {
  Json j = save.ToJson();
  j["source"] = source;
  return j;
}

}  // namespace tessera
