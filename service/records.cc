#include "service/records.h"

#include <chrono>
#include <cstdio>
#include <random>

namespace tessera::service {
namespace {

constexpr const char* kCancelled = "cancelled";

}  // namespace

Status CancelledStatus(const std::string& job) {
  return Status(Code::kConflict, "job " + job + " was cancelled", {{kCancelled, true}});
}

bool IsCancelled(const Status& st) {
  return st.details().is_object() && st.details().value(kCancelled, false);
}

Json WorkerRecord::ToJson(int64_t mono_now, const std::vector<std::string>& meshes) const {
  return {{"id", id},
          {"host", host},
          {"state", state},
          {"last_heartbeat_ms_ago", std::max<int64_t>(0, mono_now - last_beat_mono_ms)},
          {"devices", devices},
          {"data_port", data_port},
          {"local_port", local_port},
          // The local API listens on the worker host's loopback only: this address
          // works for trainers on that host, and nowhere else.
          {"local_api", "http://127.0.0.1:" + std::to_string(local_port)},
          {"registered_at", registered_ms},
          {"task_polls_waiting", polls_waiting},
          {"meshes", meshes}};
}

WorkerRecord WorkerRecord::FromJson(const Json& j) {
  WorkerRecord w;
  w.id = j.value("id", "");
  w.host = j.value("host", "127.0.0.1");
  w.data_port = j.value("data_port", 0);
  w.local_port = j.value("local_port", 0);
  w.devices = j.value("devices", 1);
  w.state = StateOr(j, "state", WorkerState::kDead);
  w.registered_ms = j.value("registered_at", int64_t{0});
  return w;
}

Json MeshRecord::ToJson() const {
  Json j = MeshToJson(mesh);
  j["workers"] = workers;
  Json devices = Json::array();
  for (int64_t d = 0; d < mesh.num_devices(); ++d) {
    int64_t rank = mesh.WorkerOfDevice(d);
    devices.push_back({{"device", d},
                       {"worker", rank < static_cast<int64_t>(workers.size()) ? workers[rank] : ""},
                       {"rank", rank},
                       {"local_index", d % mesh.devices_per_worker},
                       {"coords", mesh.DeviceCoords(d)}});
  }
  j["devices"] = devices;
  j["num_devices"] = mesh.num_devices();
  j["created_at"] = created_ms;
  return j;
}

Result<MeshRecord> MeshRecord::FromJson(const Json& j) {
  MeshRecord m;
  ASSIGN_OR_RETURN(m.mesh, tessera::MeshFromJson(j));
  m.workers = j.value("workers", std::vector<std::string>{});
  m.created_ms = j.value("created_at", int64_t{0});
  return m;
}

Json CheckpointRecord::Summary() const {
  return {{"mesh", mesh},
          {"step", step},
          {"state", state},
          {"job", job},
          {"tensors", tensors.size()},
          {"logical_bytes", logical_bytes},
          {"stored_bytes", stored_bytes},
          {"referenced_bytes", referenced_bytes},
          {"created_at", created_ms},
          {"duration_ms", duration_ms},
          {"error", error}};
}

Json CheckpointRecord::ToJson() const {
  Json j = Summary();
  j["tensors"] = tensors;
  j["metadata"] = metadata;
  return j;
}

CheckpointRecord CheckpointRecord::FromJson(const Json& j) {
  CheckpointRecord c;
  c.mesh = j.value("mesh", "");
  c.step = j.value("step", int64_t{0});
  c.state = StateOr(j, "state", CheckpointState::kFailed);
  c.job = j.value("job", "");
  c.tensors = j.value("tensors", Json::array());
  c.logical_bytes = j.value("logical_bytes", uint64_t{0});
  c.stored_bytes = j.value("stored_bytes", uint64_t{0});
  c.referenced_bytes = j.value("referenced_bytes", uint64_t{0});
  c.created_ms = j.value("created_at", int64_t{0});
  c.duration_ms = j.value("duration_ms", int64_t{0});
  c.metadata = j.value("metadata", Json::object());
  c.error = j.value("error", Json());
  return c;
}

void JobRecord::Seal() {
  sealed = std::make_shared<const std::string>(
      ToJson().dump(-1, ' ', false, Json::error_handler_t::replace));
  request = Json::object();
  tasks.clear();
  joins.clear();
  error = nullptr;
  result = nullptr;
  timings = Json::object();
}

Json JobRecord::ToJson() const {
  if (sealed) return Json::parse(*sealed);
  Json workers = Json::array();
  for (const auto& [task, t] : tasks) {
    workers.push_back({{"id", t.worker},
                       {"rank", t.rank},
                       {"task", task},
                       {"state", t.state},
                       {"done_bytes", t.done_bytes},
                       {"total_bytes", t.total_bytes},
                       {"error", t.error}});
  }
  for (size_t rank = 0; rank < joins.size(); ++rank) {
    const Join& j = joins[rank];
    workers.push_back({{"id", j.worker},
                       {"rank", rank},
                       {"state", j.written ? "joined" : "waiting"},
                       {"done_bytes", j.written.value_or(0)}});
  }
  return {{"id", id},
          {"seq", seq},
          {"kind", kind},
          {"mesh", mesh},
          {"step", step < 0 ? Json() : Json(step)},
          {"state", state},
          {"phase", phase},
          {"progress", {{"done_bytes", done_bytes}, {"total_bytes", total_bytes}}},
          {"workers", workers},
          {"error", error},
          {"request", request},
          {"created_at", created_ms},
          {"started_at", started_ms},
          {"ended_at", ended_ms ? Json(ended_ms) : Json()},
          {"timings_ms", timings},
          {"result", result}};
}

JobRecord JobRecord::FromJson(const Json& j) {
  JobRecord r;
  r.id = j.value("id", "");
  r.seq = j.contains("seq") && j["seq"].is_number_unsigned() ? j["seq"].get<uint64_t>() : 0;
  r.kind = j.value("kind", "");
  r.mesh = j.value("mesh", "");
  r.step = j.contains("step") && j["step"].is_number_integer() ? j["step"].get<int64_t>() : -1;
  r.state = StateOr(j, "state", JobState::kFailed);
  r.phase = j.value("phase", "");
  r.request = j.value("request", Json::object());
  if (j.contains("progress") && j["progress"].is_object()) {
    r.done_bytes = j["progress"].value("done_bytes", uint64_t{0});
    r.total_bytes = j["progress"].value("total_bytes", uint64_t{0});
  }
  r.error = j.value("error", Json());
  r.result = j.value("result", Json());
  r.timings = j.value("timings_ms", Json::object());
  r.created_ms = j.value("created_at", int64_t{0});
  r.started_ms = j.value("started_at", int64_t{0});
  r.ended_ms = j.contains("ended_at") && j["ended_at"].is_number() ? j["ended_at"].get<int64_t>() : 0;
  return r;
}

Json RetentionPolicy::ToJson() const {
  return {{"keep_last", keep_last ? Json(keep_last) : Json()},
          {"keep_every_n_steps", keep_every_n_steps ? Json(keep_every_n_steps) : Json()}};
}

Json RetentionPolicy::CatalogRow(const std::string& mesh) const {
  Json row = ToJson();
  row["mesh"] = mesh;
  return row;
}

RetentionPolicy RetentionPolicy::FromJson(const Json& j) {
  auto number = [&](const char* key) {
    return j.is_object() && j.contains(key) && j[key].is_number() ? j[key].get<int64_t>() : 0;
  };
  return RetentionPolicy{number("keep_last"), number("keep_every_n_steps")};
}

std::vector<int64_t> StepsToPrune(const std::vector<int64_t>& steps, const RetentionPolicy& policy) {
  std::vector<int64_t> out;
  if (policy.keep_last <= 0) return out;
  const size_t n = steps.size();
  for (size_t i = 0; i + policy.keep_last < n; ++i) {
    int64_t s = steps[i];
    if (policy.keep_every_n_steps > 0 && s % policy.keep_every_n_steps == 0) continue;
    out.push_back(s);
  }
  return out;
}

void CheckpointRecord::TakeSummary(const Json& summary) {
  tensors = summary.value("tensors", Json::array());
  logical_bytes = summary.value("logical_bytes", uint64_t{0});
  stored_bytes = summary.value("stored_bytes", uint64_t{0});
  referenced_bytes = summary.value("referenced_bytes", uint64_t{0});
  if (summary.contains("metadata") && summary["metadata"].is_object()) metadata = summary["metadata"];
}

std::string NewId(const std::string& prefix) {
  static thread_local std::mt19937_64 rng(std::random_device{}() ^
                                          reinterpret_cast<uintptr_t>(&rng));
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%012llx",
                static_cast<unsigned long long>(rng() & 0xffffffffffffULL));
  return prefix + "-" + buf;
}

}  // namespace tessera::service
