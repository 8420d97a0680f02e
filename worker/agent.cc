#include "worker/agent.h"

#include <chrono>
#include <cstdio>

#include "api/clock.h"
#include "storage/s3/s3_env.h"

namespace tessera::worker {
namespace {

// --server as a list (checked by the worker's flags already).
http::ServerList ServersOf(const std::string& spec) {
  auto servers = http::ServerList::Parse(spec, "--server");
  return servers.ok() ? *servers : http::ServerList({spec});
}

}  // namespace

Agent::Agent(AgentOptions options, storage::Env* env)
    : options_(std::move(options)), env_(env), io_pool_(options_.io_threads),
      control_(ServersOf(options_.server), options_.token) {}

Agent::~Agent() { Stop(); }

// Placements come pushed by tesserad (registration and long-poll answers) and have no
// age, so a trainer's save never waits on tesserad for one; only a mesh this worker has
// not heard of is looked up.
MeshResolver Agent::Resolver() {
  return [this](const std::string& mesh) -> Result<MeshPlacement> {
    if (auto p = placements_.Find(mesh)) return *p;
    return FetchPlacement(mesh);
  };
}

Result<MeshPlacement> Agent::FetchPlacement(const std::string& mesh) {
  auto j = control_.Call("GET", "/api/v1/meshes/" + http::PercentEncode(mesh));
  if (!j.ok()) {
    if (j.status().code() == Code::kNotFound) placements_.Forget(mesh);
    return j.status();
  }
  Result<MeshPlacement> p = PlacementOf(*j, id_);
  if (!p.ok()) {
    placements_.Forget(mesh);
    return p.status();
  }
  placements_.Put(mesh, *p);
  return p;
}

// Takes the meshes tesserad pushed (a registration or long-poll answer).
void Agent::TakeMeshes(const Json& answer) {
  if (!answer.contains("meshes")) return;
  Status st = placements_.ReplaceAll(answer["meshes"], id_);
  if (!st.ok()) {
    std::fprintf(stderr, "worker %s: %s\n", id_.c_str(), st.ToString().c_str());
  }
}

Status Agent::Register(int64_t timeout_ms) {
  Json body = {{"host", options_.host},
               {"local_port", options_.local_port},
               {"data_port", options_.data_port},
               {"devices", options_.devices}};
  if (!id_.empty()) {
    body["id"] = id_;
  } else if (!options_.name.empty()) {
    body["name"] = options_.name;
  }
  const int64_t deadline = MonoMs() + timeout_ms;
  while (true) {
    auto r = control_.Call("POST", "/api/v1/workers", body, 10);
    if (r.ok()) {
      const std::string id = r->value("id", "");
      if (id_.empty()) {
        id_ = id;
      } else if (id != id_) {
        // Never rewritten: other threads read id_ without a lock.
        return Internal("tesserad re-registered worker " + id_ + " as " + id,
                        {{"worker", id_}});
      }
      heartbeat_ms_ = r->value("heartbeat_ms", int64_t{500});
      {
        MutexLock lock(mu_);
        checkpoint_root_ = r->value("checkpoint_root", "");
      }
      TakeMeshes(*r);
      // The object store's address, unless this host was given its own.
      if (auto e = r->value("s3_endpoint", ""); !e.empty() && storage::DefaultS3Endpoint().empty()) {
        storage::SetDefaultS3Endpoint(e);
      }
      return Status::Ok();
    }
    // Only an unreachable server is worth waiting for; a refusal is final.
    if (r.status().code() != Code::kUnavailable || MonoMs() > deadline) return r.status();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

void Agent::Start() {
  heartbeat_ = std::thread([this] { HeartbeatLoop(); });
  tasks_ = std::thread([this] { TaskLoop(); });
}

void Agent::Stop() {
  trainer_saves_.Shutdown();
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  cv_.NotifyAll();
  if (heartbeat_.joinable()) heartbeat_.join();
  if (tasks_.joinable()) tasks_.join();
  task_threads_.JoinAll();
  if (memory_reports_) memory_reports_->Stop();
}

void Agent::HeartbeatLoop() {
  MutexLock lock(mu_);
  while (!stopping_) {
    // cv_ is shared with the saves: a wake-up before the beat is due is not one.
    const auto due = std::chrono::steady_clock::now() + std::chrono::milliseconds(heartbeat_ms_.load());
    while (!stopping_ && std::chrono::steady_clock::now() < due) cv_.WaitUntil(mu_, due);
    if (stopping_) break;
    lock.unlock();
    auto r = control_.Heartbeat(id_);
    if (!r.ok() && r.status().code() == Code::kNotFound) {
      // tesserad lost us (a fresh catalog): register again under the same id. What it
      // was told of the memory tier went with its catalog: rank 0 tells it again.
      Status st = Register(1000);
      std::fprintf(stderr, "worker %s: re-registered: %s\n", id_.c_str(), st.ToString().c_str());
      if (st.ok() && memory_reports_) memory_reports_->SendAgain();
    }
    lock.lock();
  }
}

void Agent::TaskLoop() {
  constexpr int64_t kPollMs = 5000;
  // What the last answered poll reported of the bases (empty: tesserad may not have it,
  // as after a failed poll or from a new queue's tesserad): only a change is sent again.
  std::string reported;
  std::string poll_error;  // the last failed poll's error, said once
  while (true) {
    {
      MutexLock lock(mu_);
      if (stopping_) return;
    }
    const Json report = save_bases_.Report();
    const std::string bases = report.dump();
    const std::string queue = feed_.queue();
    // A changed report goes in a POST's body: a worker in many meshes has more to say
    // than a request header holds.
    const bool send = bases != reported;
    auto r = control_.Wait(send ? "POST" : "GET",
                           ControlPlane::WorkerPath(id_) + "/tasks?wait_ms=" +
                               std::to_string(kPollMs) + feed_.Query(),
                           send ? Json{{"bases", report}} : Json(nullptr), kPollMs);
    if (!r.ok()) {
      // Said once per kind of failure, not per retry: a poll that keeps failing leaves
      // this worker without tasks, which must not go unseen.
      if (const std::string why = r.status().ToString(); why != poll_error) {
        std::fprintf(stderr, "worker %s: task poll failed (retrying): %s\n", id_.c_str(),
                     why.c_str());
        poll_error = why;
      }
      reported.clear();
      MutexLock lock(mu_);
      cv_.WaitFor(mu_, std::chrono::milliseconds(200));
      continue;
    }
    poll_error.clear();
    reported = r->value("queue", "") == queue ? bases : "";
    // Received: the next poll acknowledges these tasks, and tesserad drops them.
    feed_.Received(*r);
    TakeMeshes(*r);
    for (const Json& j : r->value("tasks", Json::array())) {
      // Tasks stay leased until acknowledged, so one may come again: each runs once.
      const std::string tid = j.is_object() ? j.value("id", "") : "";
      if (!tid.empty() && !feed_.Start(tid)) continue;
      auto task = TaskFromJson(j);
      if (!task.ok()) {
        // Not one this worker can read (another version of tesserad?): fail it, named.
        std::fprintf(stderr, "worker %s: unreadable task %s: %s\n", id_.c_str(), tid.c_str(),
                     task.status().ToString().c_str());
        if (!tid.empty()) {
          task_threads_.Spawn([this, tid, st = task.status()] {
            Report(tid, ReportState::kFailed, 0, 0, nullptr, st.WithContext("unreadable task"));
          });
        }
        continue;
      }
      // A save's end is taken in before the next poll, whose report (the bases) then says
      // what this worker builds on since: retention waits for that (docs/semantics.md, S9).
      if (task->kind == TaskKind::kSaveEnded) {
        Execute(*task);
        continue;
      }
      task_threads_.Spawn([this, t = std::move(*task)] { Execute(t); });
    }
  }
}

void Agent::Report(const std::string& task, ReportState state, uint64_t done, uint64_t total,
                   const Json& result, const Status& error) {
  const Json body = TaskReportToJson({state, done, total, result, error});
  // The outcome must arrive: retry while tesserad is unreachable (e.g. restarting).
  for (int attempt = 0; attempt < 50; ++attempt) {
    auto r = control_.Call("POST",
                           ControlPlane::WorkerPath(id_) + "/tasks/" +
                               http::PercentEncodeSegment(task) + "/report",
                           body);
    if (r.ok() || r.status().code() != Code::kUnavailable || state == ReportState::kRunning) {
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

void Agent::Execute(const Task& task) {
  const std::string kind(TaskKindName(task.kind));
  const std::string& job = task.job;
  if (task.kind == TaskKind::kAbort) {
    if (collectives_ != nullptr && !task.mesh_name.empty()) {
      collectives_->Abort(task.mesh_name, job, task.error);
    }
    return;
  }
  if (task.kind == TaskKind::kSaveEnded) {
    // A save's end, pushed on this long-poll: nothing to report.
    save_bases_.Ended(task.mesh_name, task.step, task.error.ok());
    trainer_saves_.Told(job, task.mesh_name, task.step, task.error, MonoMs());
    return;
  }
  if (task.kind == TaskKind::kSnapshot) {
    // A REST save: snapshot, write, join. The join is the report (agent_save.cc).
    SaveForJob(task);
    return;
  }
  // tesserad marked the task running when it handed it over: only the outcome is reported.
  const auto run = [this, &task] { return Run(task); };
  Result<Json> r = options_.around_task ? options_.around_task(task, run) : run();
  if (!r.ok()) {
    std::fprintf(stderr, "worker %s: %s task of job %s failed: %s\n", id_.c_str(), kind.c_str(),
                 job.c_str(), r.status().ToString().c_str());
  }
  uint64_t bytes = r.ok() ? r->value("bytes", uint64_t{0}) : 0;
  Report(task.id, r.ok() ? ReportState::kSucceeded : ReportState::kFailed, bytes, bytes,
         r.ok() ? *r : Json(), r.status());
}

Result<Json> Agent::Run(const Task& task) {
  switch (task.kind) {
    case TaskKind::kRestore:
      return DoRestore(task);
    case TaskKind::kCollective:
      return DoCollective(task);
    case TaskKind::kMeshInit:
      return DoMeshInit(task);
    case TaskKind::kExport:
      return DoExport(task);
    case TaskKind::kImport:
      return DoImport(task);
    case TaskKind::kMemorySave:
      return DoMemorySave(task);
    case TaskKind::kSnapshot:  // Execute runs it: its answer is a join, not a report
    case TaskKind::kWrite:     // a save's write runs at its snapshot, never as a task
    case TaskKind::kAbort:
    case TaskKind::kSaveEnded:
      break;
  }
  return Internal("task kind " + std::string(TaskKindName(task.kind)) + " has no executor");
}

void Agent::AddRoutes(http::Router* router) {
  router->Add({"GET", "/healthz", [this](const http::Request&) {
    const int64_t in_flight = (collectives_ != nullptr ? collectives_->in_flight() : 0) +
                              (memory_channel_ != nullptr ? memory_channel_->in_flight() : 0);
    return http::Response::Json(200, {{"status", "ok"}, {"worker", id_},
                                      {"collectives_in_flight", in_flight},
                                      {"pending_saves", PendingSaves()},
                                      {"memory_tier", MemorySummary()},
                                      {"meshes", placements_.Names()},
                                      {"tasks_started", feed_.started()},
                                      {"tasks_repeated", feed_.repeated()},
                                      {"data_port", {{"refused_connections",
                                                      collectives::RefusedConnections()}}}});
  }, "liveness", false});
}

}  // namespace tessera::worker
