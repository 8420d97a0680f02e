// tesserad's workers: registration, heartbeats, task long-polls and reports, listing
// and removal (the records live in the WorkerRegistry, worker_registry.h).
#include <algorithm>
#include <cstdio>

#include "api/names.h"
#include "service/service.h"

namespace tessera::service {

// ---------------------------------------------------------------- workers

Result<Json> Service::RegisterWorker(const Json& body) {
  RETURN_IF_ERROR(RequireObject(body));
  ASSIGN_OR_RETURN(auto host, OptionalString(body, "host"));
  ASSIGN_OR_RETURN(auto data_port, OptionalInt(body, "data_port"));
  ASSIGN_OR_RETURN(auto local_port, RequiredInt(body, "local_port"));
  ASSIGN_OR_RETURN(auto devices, OptionalInt(body, "devices"));
  ASSIGN_OR_RETURN(auto name, OptionalString(body, "name"));
  ASSIGN_OR_RETURN(auto id, OptionalString(body, "id"));
  if (local_port < 1 || local_port > 65535) {
    return InvalidArgument("local_port must be 1..65535", {{"field", "local_port"}});
  }
  if (data_port && (*data_port < 0 || *data_port > 65535)) {
    return InvalidArgument("data_port must be 0..65535", {{"field", "data_port"}});
  }
  if (devices && (*devices < 1 || *devices > 4096)) {
    return InvalidArgument("devices must be 1..4096", {{"field", "devices"}});
  }
  std::string wid;
  if (id) {
    RETURN_IF_ERROR(ValidateName(*id, "id"));
    wid = *id;  // re-registration after a tesserad restart keeps the id
  } else if (name) {
    RETURN_IF_ERROR(ValidateName(*name, "name"));
    wid = "w-" + *name;
  } else {
    wid = NewId("w");
  }
  WorkerRecord fields;
  fields.id = wid;
  fields.host = host.value_or("127.0.0.1");
  fields.data_port = static_cast<int>(data_port.value_or(0));
  fields.local_port = static_cast<int>(local_port);
  fields.devices = static_cast<int>(devices.value_or(1));
  fields.registered_ms = clock_->WallMs();
  const WorkerRecord w = workers_.Register(fields, clock_->MonoMs());
  (void)PersistWorker(w);
  PublishWorker(w);
  std::fprintf(stderr, "worker %s registered (%s, local port %d, %d devices)\n", wid.c_str(),
               w.host.c_str(), w.local_port, w.devices);
  Json reply = {{"id", wid}, {"heartbeat_ms", options_.heartbeat_ms}, {"lease_ms", options_.lease_ms},
                {"checkpoint_root", options_.checkpoint_root}, {"meshes", MeshesOfWorker(wid)}};
  if (!options_.s3_endpoint.empty()) reply["s3_endpoint"] = options_.s3_endpoint;
  return reply;
}

Result<Json> Service::Heartbeat(const std::string& id) {
  ASSIGN_OR_RETURN(std::optional<WorkerRecord> revived, workers_.Heartbeat(id, clock_->MonoMs()));
  if (revived) {
    (void)PersistWorker(*revived);
    PublishWorker(*revived);
  }
  return Json{{"state", "alive"}, {"heartbeat_ms", options_.heartbeat_ms}};
}

Result<Json> Service::PollTasks(const std::string& id, PollRequest request) {
  request.wait_ms = std::clamp<int64_t>(request.wait_ms, 0, options_.max_wait_ms);
  if (request.bases) base_use_.Put(id, std::move(*request.bases));
  ASSIGN_OR_RETURN(PollAnswer a, workers_.Poll(id, request, clock_->MonoMs()));
  // Delivered is running: the worker reports only the outcome and progress.
  jobs_.MarkDelivered(a.tasks);
  const size_t count = a.tasks.size();
  Json out = {{"tasks", std::move(a.tasks)}, {"ack", a.ack}, {"queue", a.queue}};
  if (a.meshes) {
    // Read after the version: the list is at least that new.
    out["meshes"] = MeshesOfWorker(id);
    out["meshes_version"] = *a.meshes;
  }
  if (options_.after_poll) RETURN_IF_ERROR(options_.after_poll(id, count));
  return out;
}

Status Service::ReportTask(const std::string& worker, const std::string& task, const Json& body) {
  ASSIGN_OR_RETURN(TaskReport report, TaskReportFromJson(body));
  workers_.Acknowledge(worker, task);  // a report says the worker has it
  return jobs_.Report(worker, task, report);
}

Json Service::MeshesOfWorker(const std::string& id) const {
  Json out = Json::array();
  for (const std::string& name : meshes_.MeshesOf(id)) {
    if (auto m = meshes_.Get(name); m.ok()) out.push_back(meshes_.JsonOf(*m));
  }
  return out;
}

Json Service::WorkerJson(const WorkerRecord& w,
                         const std::map<std::string, uint64_t>& memory_bytes) const {
  Json j = w.ToJson(clock_->MonoMs(), meshes_.MeshesOf(w.id));
  auto bytes = memory_bytes.find(w.id);
  j["memory_bytes"] = bytes == memory_bytes.end() ? 0 : bytes->second;
  return j;
}

Json Service::ListWorkers() {
  Json out = Json::array();
  const std::map<std::string, uint64_t> memory_bytes = memory_checkpoints_.WorkerBytes();
  for (const WorkerRecord& w : workers_.List()) out.push_back(WorkerJson(w, memory_bytes));
  return out;
}

Result<Json> Service::GetWorker(const std::string& id) {
  auto w = workers_.Get(id);
  if (!w) return NotFound("no worker " + id, {{"worker", id}});
  return WorkerJson(*w, memory_checkpoints_.WorkerBytes());
}

Status Service::DeleteWorker(const std::string& id) {
  if (!workers_.Get(id)) return NotFound("no worker " + id, {{"worker", id}});
  // A job that starts after this check finds the worker gone and fails naming it.
  if (meshes_.WorkerHeld(id)) {
    return Conflict("worker " + id + " is in a running job", {{"worker", id}});
  }
  RETURN_IF_ERROR(workers_.Remove(id));
  RETURN_IF_ERROR(catalog_->Delete("workers", id));
  events_.Publish("worker", {{"id", id}, {"state", "deregistered"}});
  return Status::Ok();
}

}  // namespace tessera::service
