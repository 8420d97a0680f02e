// tesserad's records. Each has ToJson (the REST shape of docs/openapi.json, also what the
// catalog stores) and FromJson (for loading the catalog).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include "api/clock.h"
#include "api/json_codec.h"
#include "api/mesh.h"
#include "service/states.h"

namespace tessera::service {


// A worker as tesserad knows it. Its queue of tasks and its long-polls live in the
// WorkerRegistry (worker_registry.h), which hands out copies of this record.
struct WorkerRecord {
  std::string id;
  std::string host = "127.0.0.1";
  int data_port = 0;
  int local_port = 0;
  int devices = 1;
  WorkerState state = WorkerState::kAlive;
  int64_t registered_ms = 0;
  int64_t last_beat_mono_ms = 0;  // not persisted: MonoMs() of the last heartbeat or poll
  int64_t polls_waiting = 0;      // not persisted: its long-polls waiting in tesserad now

  Json ToJson(int64_t mono_now, const std::vector<std::string>& meshes) const;
  static WorkerRecord FromJson(const Json& j);
};

struct MeshRecord {
  Mesh mesh;
  std::vector<std::string> workers;  // by rank
  int64_t created_ms = 0;
  // Registered, but its self-test is running: visible to its workers (who read
  // it), and no job may start on it until the test passes.
  bool self_testing = false;

  Json ToJson() const;  // docs/openapi.json: axes, devices_per_worker, workers, devices
  static Result<MeshRecord> FromJson(const Json& j);
};

struct CheckpointRecord {
  std::string mesh;
  int64_t step = 0;
  CheckpointState state = CheckpointState::kPending;
  std::string job;
  Json tensors = Json::array();   // [{name, dtype, shape, layout, logical_bytes, stored_bytes}]
  uint64_t logical_bytes = 0;
  uint64_t stored_bytes = 0;
  uint64_t referenced_bytes = 0;  // of stored_bytes, in earlier checkpoints' files
  int64_t created_ms = 0;
  int64_t duration_ms = 0;
  Json metadata = Json::object();
  Json error;

  std::string key() const { return Key(mesh, step); }
  // tensors (with their sizes), logical_bytes and stored_bytes, from a committed
  // checkpoint's summary (storage/root_meta.h).
  void TakeSummary(const Json& summary);
  // "<mesh>@<step>", the key of checkpoints_ and of the catalog's rows.
  static std::string Key(const std::string& mesh, int64_t step) {
    return mesh + "@" + std::to_string(step);
  }
  Json Summary() const;  // list entry
  Json ToJson() const;   // detail
  static CheckpointRecord FromJson(const Json& j);
};

struct TaskState {
  std::string worker;
  int64_t rank = 0;
  TaskRunState state = TaskRunState::kQueued;
  int64_t round = 0;             // not persisted: the job machine's round of tasks
  uint64_t done_bytes = 0;
  uint64_t total_bytes = 0;
  Json result;
  Json error;
};

// The status of a job ended by POST /api/v1/jobs/{id}/cancel (a conflict, marked as such).
Status CancelledStatus(const std::string& job);
bool IsCancelled(const Status& st);

struct JobRecord {
  std::string id;
  uint64_t seq = 0;  // creation order, from 1; GET /api/v1/jobs pages by it
  std::string kind;  // save restore verify
  std::string mesh;
  int64_t step = -1;
  JobState state = JobState::kQueued;
  std::string phase;
  Json request = Json::object();
  uint64_t done_bytes = 0;
  uint64_t total_bytes = 0;
  std::map<std::string, TaskState> tasks;  // by task id (current phase)
  // A save's workers by rank, and the bytes each one's join says it wrote (absent: it
  // has not joined yet). A save has no tasks to report on: its joins are its reports.
  struct Join {
    std::string worker;
    std::optional<uint64_t> written;
  };
  std::vector<Join> joins;
  Json error;
  Json result;
  int64_t created_ms = 0;
  int64_t started_ms = 0;
  int64_t ended_ms = 0;
  Json timings = Json::object();  // phase → ms spent in it
  int64_t phase_started_ms = 0;
  int64_t published_ms = 0;  // last job event; task reports publish at most every 100 ms

  // Once finished, the record as JSON text, and the record keeps only what the
  // job list filters and the history policy need (Seal): an ended job never changes.
  std::shared_ptr<const std::string> sealed;

  bool finished() const {
    return state == JobState::kSucceeded || state == JobState::kFailed ||
           state == JobState::kCancelled;
  }
  // REQUIRES: finished(). Keeps the JSON text and drops the rest.
  void Seal();
  Json ToJson() const;
  static JobRecord FromJson(const Json& j);
};

struct RetentionPolicy {
  int64_t keep_last = 0;           // 0: keep all
  int64_t keep_every_n_steps = 0;  // 0: none kept for this reason
  Json ToJson() const;
  Json CatalogRow(const std::string& mesh) const;  // the catalog's `retention` row: ToJson and mesh
  static RetentionPolicy FromJson(const Json& j);  // absent or null values: 0
};

// Steps to delete under `policy`, given committed steps ascending.
std::vector<int64_t> StepsToPrune(const std::vector<int64_t>& steps, const RetentionPolicy& policy);

// A random id such as "j-3f9a0c1d2b4e".
std::string NewId(const std::string& prefix);

}  // namespace tessera::service
