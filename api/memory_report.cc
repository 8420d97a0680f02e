#include "api/memory_report.h"

#include <algorithm>
#include <set>

#include "api/names.h"

namespace tessera {
namespace {

Status Bad(const std::string& field, const std::string& rule) {
  return InvalidArgument("field '" + field + "' " + rule, {{"field", field}});
}

// A reader's result for field `key` of the element at `where` ("workers[2]"): its error
// says where, and names the field by its path ("workers[2].rank").
template <typename T>
Result<T> At(const std::string& where, const std::string& key, Result<T> r) {
  if (r.ok()) return r;
  return r.status().WithContext(where).WithDetail("field", where + "." + key);
}

Result<int64_t> AtLeast(Result<int64_t> r, int64_t min, const std::string& field) {
  if (r.ok() && *r < min) return Bad(field, "must be ≥ " + std::to_string(min));
  return r;
}

// A list at body[field], as an array (absent: missing).
Result<const Json*> ListOf(const Json& body, const std::string& field) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null()) {
    return InvalidArgument("missing field '" + field + "'", {{"field", field}});
  }
  if (!it->is_array()) return Bad(field, "must be a list");
  return &*it;
}

Result<std::vector<int64_t>> StepsFromJson(const Json& body, int64_t step) {
  ASSIGN_OR_RETURN(const Json* list, ListOf(body, "steps"));
  std::vector<int64_t> steps;
  for (size_t i = 0; i < list->size(); ++i) {
    const std::string field = "steps[" + std::to_string(i) + "]";
    const Json& s = (*list)[i];
    if (!s.is_number_integer() || (s.is_number_unsigned() && s.get<uint64_t>() > INT64_MAX) ||
        s.get<int64_t>() < 0) {
      return Bad(field, "must be a step (an integer ≥ 0)");
    }
    if (!steps.empty() && s.get<int64_t>() <= steps.back()) {
      return Bad(field, "must be above the step before it: steps are ascending");
    }
    steps.push_back(s.get<int64_t>());
  }
  if (!std::binary_search(steps.begin(), steps.end(), step)) {
    return InvalidArgument("field 'steps' must hold the report's step " + std::to_string(step),
                           {{"field", "steps"}, {"step", step}});
  }
  return steps;
}

// The objects of the list body[field], each decoded by `one(object, where)`, `where` being
// its path ("workers[2]"); `shape` says what each must be.
template <typename T, typename F>
Result<std::vector<T>> ObjectsFromJson(const Json& body, const std::string& field,
                                       const std::string& shape, F one) {
  ASSIGN_OR_RETURN(const Json* list, ListOf(body, field));
  std::vector<T> out;
  for (size_t i = 0; i < list->size(); ++i) {
    const std::string where = field + "[" + std::to_string(i) + "]";
    if (!(*list)[i].is_object()) return Bad(where, "must be an object " + shape);
    ASSIGN_OR_RETURN(T item, one((*list)[i], where));
    out.push_back(std::move(item));
  }
  return out;
}

// `names`: those of the tensors before it.
Result<MemoryCheckpointReport::Tensor> TensorFromJson(const Json& t, const std::string& where,
                                                      std::set<std::string>* names) {
  MemoryCheckpointReport::Tensor tensor;
  ASSIGN_OR_RETURN(tensor.name, At(where, "name", RequiredString(t, "name")));
  RETURN_IF_ERROR(ValidateName(tensor.name, where + ".name"));
  if (!names->insert(tensor.name).second) {
    return InvalidArgument("tensors name '" + tensor.name + "' twice",
                           {{"field", where + ".name"}, {"tensor", tensor.name}});
  }
  ASSIGN_OR_RETURN(tensor.dtype, DTypeFromJson(t.value("dtype", Json()), where + ".dtype"));
  ASSIGN_OR_RETURN(tensor.shape, ShapeFromJson(t.value("shape", Json()), where + ".shape"));
  return tensor;
}

// `ranks`: those of the workers before it.
Result<MemoryCheckpointReport::Worker> WorkerFromJson(const Json& w, const std::string& where,
                                                      std::set<int64_t>* ranks) {
  MemoryCheckpointReport::Worker worker;
  ASSIGN_OR_RETURN(worker.worker, At(where, "worker", RequiredString(w, "worker")));
  RETURN_IF_ERROR(ValidateName(worker.worker, where + ".worker"));
  ASSIGN_OR_RETURN(worker.rank,
                   AtLeast(At(where, "rank", RequiredInt(w, "rank")), 0, where + ".rank"));
  if (!ranks->insert(worker.rank).second) {
    return InvalidArgument(
        "workers name rank " + std::to_string(worker.rank) + " twice",
        {{"field", where + ".rank"}, {"rank", worker.rank}, {"worker", worker.worker}});
  }
  ASSIGN_OR_RETURN(int64_t bytes,
                   AtLeast(At(where, "memory_bytes", RequiredInt(w, "memory_bytes")), 0,
                           where + ".memory_bytes"));
  worker.memory_bytes = static_cast<uint64_t>(bytes);
  return worker;
}

}  // namespace

Result<MemoryCheckpointReport> MemoryCheckpointReport::FromJson(const Json& body) {
  RETURN_IF_ERROR(RequireObject(body));
  MemoryCheckpointReport r;
  ASSIGN_OR_RETURN(r.step, AtLeast(RequiredInt(body, "step"), 0, "step"));
  ASSIGN_OR_RETURN(r.redundancy, RequiredString(body, "redundancy"));
  if (r.redundancy != "replica" && r.redundancy != "parity") {
    return InvalidArgument("field 'redundancy' must be \"replica\" or \"parity\"",
                           {{"field", "redundancy"}});
  }
  // The ranges of the save's options (docs/memory-tier.md, "The body's fields").
  struct Option {
    const char* name;
    int64_t min, max;
    int64_t* value;
  };
  for (const Option& o :
       {Option{"replicas", 1, INT64_MAX, &r.replicas}, Option{"group", 2, INT64_MAX, &r.group},
        Option{"parity", 1, INT64_MAX, &r.parity}, Option{"keep", 1, 16, &r.keep}}) {
    ASSIGN_OR_RETURN(std::optional<int64_t> v, OptionalInt(body, o.name));
    if (!v) continue;
    if (*v < o.min || *v > o.max) {
      return Bad(o.name, o.max == INT64_MAX
                             ? "must be ≥ " + std::to_string(o.min)
                             : "must be " + std::to_string(o.min) + " to " + std::to_string(o.max));
    }
    *o.value = *v;
  }
  ASSIGN_OR_RETURN(r.steps, StepsFromJson(body, r.step));
  ASSIGN_OR_RETURN(int64_t bytes, AtLeast(RequiredInt(body, "bytes"), 0, "bytes"));
  r.bytes = static_cast<uint64_t>(bytes);
  std::set<std::string> names;
  ASSIGN_OR_RETURN(r.tensors, ObjectsFromJson<Tensor>(body, "tensors", "{name, dtype, shape}",
                                                      [&](const Json& t, const std::string& where) {
                                                        return TensorFromJson(t, where, &names);
                                                      }));
  std::set<int64_t> ranks;
  ASSIGN_OR_RETURN(r.workers,
                   ObjectsFromJson<Worker>(body, "workers", "{worker, rank, memory_bytes}",
                                           [&](const Json& w, const std::string& where) {
                                             return WorkerFromJson(w, where, &ranks);
                                           }));
  ASSIGN_OR_RETURN(r.persisted, OptionalInt(body, "persisted"));
  if (r.persisted && *r.persisted < -1) {
    return Bad("persisted", "must be a step (≥ 0), or -1 or null for none");
  }
  if (r.persisted == -1) r.persisted.reset();  // the workers' "none"
  ASSIGN_OR_RETURN(std::optional<int64_t> timeline, OptionalInt(body, "timeline"));
  if (timeline && *timeline < 0) return Bad("timeline", "must be ≥ 0");
  r.timeline = timeline.value_or(0);
  return r;
}

Json MemoryCheckpointReport::TensorsJson() const {
  Json out = Json::array();
  for (const Tensor& t : tensors) {
    out.push_back(
        {{"name", t.name}, {"dtype", DTypeToJson(t.dtype)}, {"shape", ShapeToJson(t.shape)}});
  }
  return out;
}

Json MemoryCheckpointReport::ToJson() const {
  Json out_workers = Json::array();
  for (const Worker& w : workers) {
    out_workers.push_back(
        {{"worker", w.worker}, {"rank", w.rank}, {"memory_bytes", w.memory_bytes}});
  }
  Json out = {{"step", step},
          {"redundancy", redundancy},
          {"replicas", replicas},
          {"group", group},
          {"parity", parity},
          {"keep", keep},
          {"steps", steps},
          {"bytes", bytes},
          {"tensors", TensorsJson()},
          {"workers", out_workers},
          {"persisted", persisted ? Json(*persisted) : Json()}};
  if (timeline > 0) out["timeline"] = timeline;
  return out;
}

bool MemoryCheckpointReport::Holds(int64_t s) const {
  return std::binary_search(steps.begin(), steps.end(), s);
}

}  // namespace tessera
