#include "worker/agent.h"

#include <chrono>
#include <cstdio>

#include "api/names.h"
#include "storage/index.h"
#include "storage/rank_writer.h"
#include "storage/s3/s3_env.h"
#include "storage/read_planner.h"

namespace tessera::worker {
namespace {

using Clock = std::chrono::steady_clock;

int64_t SteadyMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch())
      .count();
}

Json DescJson(const std::string& name, const TensorDesc& d) {
  return {{"name", name},
          {"dtype", DTypeName(d.dtype)},
          {"shape", d.shape},
          {"layout", LayoutToJson(d.layout)}};
}

// Reports progress at most every 100 ms.
class Throttle {
 public:
  bool Due() {
    int64_t now = SteadyMs();
    if (now - last_ < 100) return false;
    last_ = now;
    return true;
  }

 private:
  int64_t last_ = 0;
};

}  // namespace

Agent::Agent(AgentOptions options, storage::Env* env)
    : options_(std::move(options)), env_(env), io_pool_(options_.io_threads),
      clients_(options_.server, options_.token, 30) {}

Agent::~Agent() { Stop(); }

// Placements are cached for a second. An older entry is still served (mesh
// placements change only when a mesh is registered again) while a thread
// fetches a fresh one, so a trainer's save never waits on tesserad for it.
MeshResolver Agent::Resolver() {
  return [this](const std::string& mesh) -> Result<MeshPlacement> {
    {
      MutexLock lock(mu_);
      auto it = mesh_cache_.find(mesh);
      if (it != mesh_cache_.end()) {
        const int64_t age = SteadyMs() - it->second.first;
        if (age < 1000 || refreshing_.count(mesh)) return it->second.second;
        if (age < 60 * 1000 && !stopping_) {
          refreshing_.insert(mesh);
          task_threads_.Spawn([this, mesh] {
            (void)FetchPlacement(mesh);
            MutexLock l(mu_);
            refreshing_.erase(mesh);
          });
          return it->second.second;
        }
      }
    }
    return FetchPlacement(mesh);
  };
}

Result<MeshPlacement> Agent::FetchPlacement(const std::string& mesh) {
  auto j = clients_.Acquire()->Call("GET", "/api/v1/meshes/" + http::PercentEncode(mesh));
  if (!j.ok()) {
    if (j.status().code() == Code::kNotFound) {
      MutexLock lock(mu_);
      mesh_cache_.erase(mesh);
    }
    return j.status();
  }
  ASSIGN_OR_RETURN(Mesh m, MeshFromJson(*j));
  MeshPlacement p;
  p.mesh = m;
  auto workers = j->value("workers", std::vector<std::string>{});
  auto it = std::find(workers.begin(), workers.end(), id_);
  if (it == workers.end()) {
    MutexLock lock(mu_);
    mesh_cache_.erase(mesh);
    return Conflict("this worker (" + id_ + ") is not part of mesh " + mesh, {{"mesh", mesh}});
  }
  p.rank = it - workers.begin();
  p.workers = workers;
  for (int64_t i = 0; i < m.devices_per_worker; ++i) {
    p.devices.push_back(p.rank * m.devices_per_worker + i);
  }
  MutexLock lock(mu_);
  mesh_cache_[mesh] = {SteadyMs(), p};
  return p;
}

Status Agent::Register(int64_t timeout_ms) {
  http::Client client(options_.server, options_.token, 10);
  Json body = {{"host", options_.host},
               {"local_port", options_.local_port},
               {"data_port", options_.data_port},
               {"devices", options_.devices}};
  if (!id_.empty()) {
    body["id"] = id_;
  } else if (!options_.name.empty()) {
    body["name"] = options_.name;
  }
  const int64_t deadline = SteadyMs() + timeout_ms;
  while (true) {
    auto r = client.Call("POST", "/api/v1/workers", body);
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
      // The object store's address, unless this host was given its own.
      if (auto e = r->value("s3_endpoint", ""); !e.empty() && storage::DefaultS3Endpoint().empty()) {
        storage::SetDefaultS3Endpoint(e);
      }
      return Status::Ok();
    }
    // Only an unreachable server is worth waiting for; a refusal is final.
    if (r.status().code() != Code::kUnavailable || SteadyMs() > deadline) return r.status();
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
}

void Agent::HeartbeatLoop() {
  // A connection per heartbeat: an idle keep-alive connection between beats
  // would cost tesserad more (it polls each one) than opening a new one.
  http::Client client(options_.server, options_.token, 5, /*keep_alive=*/false);
  MutexLock lock(mu_);
  while (!stopping_) {
    cv_.WaitFor(mu_, std::chrono::milliseconds(heartbeat_ms_.load()));
    if (stopping_) break;
    lock.unlock();
    auto r = client.Call("POST", "/api/v1/workers/" + http::PercentEncodeSegment(id_) + "/heartbeat");
    if (!r.ok() && r.status().code() == Code::kNotFound) {
      // tesserad lost us (a fresh catalog): register again under the same id.
      Status st = Register(1000);
      std::fprintf(stderr, "worker %s: re-registered: %s\n", id_.c_str(), st.ToString().c_str());
    }
    lock.lock();
  }
}

void Agent::TaskLoop() {
  http::Client client(options_.server, options_.token, 30);
  while (true) {
    {
      MutexLock lock(mu_);
      if (stopping_) return;
    }
    auto r = client.Call("GET", "/api/v1/workers/" + http::PercentEncodeSegment(id_) + "/tasks?wait_ms=5000");
    if (!r.ok()) {
      MutexLock lock(mu_);
      cv_.WaitFor(mu_, std::chrono::milliseconds(200));
      continue;
    }
    for (auto& task : r->value("tasks", Json::array())) {
      task_threads_.Spawn([this, task] { Execute(task); });
    }
  }
}

void Agent::Report(http::Client* client, const std::string& task, const std::string& state,
                   uint64_t done, uint64_t total, const Json& result, const Status& error) {
  Json body = {{"state", state}, {"progress", {{"done_bytes", done}, {"total_bytes", total}}}};
  if (!result.is_null()) body["result"] = result;
  if (!error.ok()) body["error"] = ErrorBody(error)["error"];
  // The outcome must arrive: retry while tesserad is unreachable (e.g. restarting).
  for (int attempt = 0; attempt < 50; ++attempt) {
    auto r = client->Call("POST", "/api/v1/workers/" + http::PercentEncodeSegment(id_) + "/tasks/" +
                                     http::PercentEncodeSegment(task) + "/report", body);
    if (r.ok() || r.status().code() != Code::kUnavailable || state == "running") return;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

void Agent::Execute(Json task) {
  const std::string kind = task.value("kind", ""), tid = task.value("id", "");
  const std::string job = task.value("job", "");
  if (kind == "abort") {
    if (collectives_ != nullptr && task.contains("mesh_name")) {
      const Json e = task.value("error", Json::object());
      collectives_->Abort(task.value("mesh_name", ""), job,
                          Status(CodeFromName(e.value("code", "internal")),
                                 "job " + job + " failed: " + e.value("message", ""),
                                 e.value("details", Json::object())));
    }
    MutexLock lock(mu_);
    snapshots_.erase(job);
    return;
  }
  // tesserad marked the task running when it handed it over: only the outcome is reported.
  if (auto d = options_.task_delay_ms.find(kind); d != options_.task_delay_ms.end()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(d->second));
  }
  Result<Json> r = InvalidArgument("unknown task kind '" + kind + "'");
  if (kind == "snapshot") r = DoSnapshot(task);
  if (kind == "write") r = DoWrite(task);
  if (kind == "restore") r = DoRestore(task);
  if (kind == "collective") r = DoCollective(task);
  if (kind == "mesh_init") r = DoMeshInit(task);
  if (!r.ok()) {
    std::fprintf(stderr, "worker %s: %s task of job %s failed: %s\n", id_.c_str(), kind.c_str(),
                 job.c_str(), r.status().ToString().c_str());
    MutexLock lock(mu_);
    snapshots_.erase(job);
  }
  uint64_t bytes = r.ok() ? r->value("bytes", uint64_t{0}) : 0;
  auto client = clients_.Acquire();
  Report(client.get(), tid, r.ok() ? "succeeded" : "failed", bytes, bytes, r.ok() ? *r : Json(),
         r.status());
}

Result<MeshPlacement> Agent::PlacementFromTask(const Json& task) {
  ASSIGN_OR_RETURN(Mesh mesh, MeshFromJson(task.value("mesh", Json())));
  MeshPlacement p;
  p.mesh = mesh;
  p.rank = task.value("rank", int64_t{0});
  if (task.contains("workers") && task["workers"].is_array()) {
    for (const auto& w : task["workers"]) p.workers.push_back(w.get<std::string>());
  }
  for (int64_t i = 0; i < mesh.devices_per_worker; ++i) {
    p.devices.push_back(p.rank * mesh.devices_per_worker + i);
  }
  return p;
}

Result<Json> Agent::DoSnapshot(const Json& task) {
  const std::string job = task.value("job", "");
  ASSIGN_OR_RETURN(MeshPlacement p, PlacementFromTask(task));
  const int64_t step = task.value("step", int64_t{0});
  std::optional<std::vector<std::string>> names;
  if (task.contains("tensors") && task["tensors"].is_array()) {
    names = task["tensors"].get<std::vector<std::string>>();
  }
  std::shared_ptr<const Snapshot> snap;
  {
    // A trainer-driven save: use the copy its /v1/save took at the right moment.
    MutexLock lock(mu_);
    auto key = std::make_pair(p.mesh.name, step);
    if (task.value("wait_for_trainer", false)) {
      const auto deadline =
          std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.trainer_wait_ms);
      while (!stopping_ && !trainer_snapshots_.count(key)) {
        if (!cv_.WaitUntil(mu_, deadline)) break;
      }
      if (!trainer_snapshots_.count(key)) {
        return DeadlineExceeded("the trainer on worker " + id_ + " did not call /v1/save for step " +
                                std::to_string(step));
      }
    }
    auto it = trainer_snapshots_.find(key);
    if (it != trainer_snapshots_.end()) {
      snap = it->second;
      trainer_snapshots_.erase(it);
    }
  }
  if (!snap) {
    ASSIGN_OR_RETURN(snap, store_->TakeSnapshot(p.mesh.name, names));
  }
  Json tensors = Json::array();
  for (const auto& t : snap->tensors) {
    if (names && std::find(names->begin(), names->end(), t.name) == names->end()) continue;
    Json tj = DescJson(t.name, t.desc);
    std::vector<int64_t> devices;
    for (const auto& s : t.shards) devices.push_back(s.device);
    tj["devices"] = devices;
    tensors.push_back(tj);
  }
  if (names) {
    for (const auto& n : *names) {
      if (!snap->Find(n)) {
        return NotFound("worker " + id_ + " holds no tensor '" + n + "' in mesh " + p.mesh.name,
                        {{"tensor", n}});
      }
    }
  }
  MutexLock lock(mu_);
  snapshots_[job] = snap;
  return Json{{"tensors", tensors}, {"snapshot_bytes", snap->bytes()}};
}

Result<Json> Agent::DoWrite(const Json& task) {
  const std::string job = task.value("job", "");
  ASSIGN_OR_RETURN(MeshPlacement p, PlacementFromTask(task));
  std::shared_ptr<const Snapshot> snap;
  {
    MutexLock lock(mu_);
    auto it = snapshots_.find(job);
    if (it == snapshots_.end()) {
      return Internal("worker " + id_ + " has no snapshot for job " + job);
    }
    snap = it->second;
  }
  const Json slices = task.value("slices", Json::array());
  std::vector<storage::SliceToWrite> todo;
  uint64_t total = 0;
  for (const auto& sj : slices) {
    const std::string name = sj.value("tensor", "");
    const Snapshot::Tensor* t = snap->Find(name);
    if (!t) return Internal("snapshot of job " + job + " lacks tensor '" + name + "'");
    const int64_t device = sj.value("device", int64_t{-1});
    const ShardBuffer* buf = nullptr;
    for (const auto& s : t->shards) {
      if (s.device == device) buf = s.buffer.get();
    }
    if (!buf) {
      return Internal("snapshot of tensor '" + name + "' lacks device " + std::to_string(device),
                      {{"tensor", name}});
    }
    storage::TensorMeta meta{name, t->desc.dtype, t->desc.shape, t->desc.layout};
    SliceSpec slice = DeviceSlice(p.mesh, meta.layout, meta.shape, device);
    todo.push_back({meta, slice, buf->data(), buf->size()});
    total += buf->size();
  }
  Json result = {{"fragment", nullptr}, {"bytes", 0}};
  if (!todo.empty()) {
    auto client = clients_.Acquire();
    Throttle throttle;
    const std::string tid = task.value("id", "");
    storage::ShardOptions opt;
    opt.compress = task.value("compression", "zstd") == "zstd";
    opt.level = task.value("level", 1);
    opt.pool = &io_pool_;
    opt.on_progress = [&](uint64_t done) {
      if (throttle.Due()) Report(client.get(), tid, "running", done, total, nullptr, Status::Ok());
    };
    ASSIGN_OR_RETURN(auto w, storage::WriteRank(env_, task.value("staging", ""), p.rank, todo, opt));
    result = {{"fragment", storage::FragmentFileName(p.rank)},
              {"bytes", w.raw_bytes},
              {"stored_bytes", w.stored_bytes}};
  }
  MutexLock lock(mu_);
  snapshots_.erase(job);  // written: the buffers go back to the pool
  return result;
}

Result<Json> Agent::DoRestore(const Json& task) {
  ASSIGN_OR_RETURN(MeshPlacement p, PlacementFromTask(task));
  const std::string dir = task.value("dir", "");
  ASSIGN_OR_RETURN(auto index, storage::CheckpointIndex::Open(env_, dir));
  storage::ShardCache shards(env_, dir);
  auto client = clients_.Acquire();
  Throttle throttle;
  const std::string tid = task.value("id", "");
  uint64_t total = 0, done = 0, read = 0;
  struct Item {
    const storage::TensorEntry* entry;
    TensorDesc desc;
  };
  std::vector<Item> items;
  for (const auto& tj : task.value("tensors", Json::array())) {
    const std::string name = tj.value("name", "");
    const storage::TensorEntry* e = index.Find(name);
    if (!e) return NotFound("checkpoint has no tensor '" + name + "'", {{"tensor", name}});
    TensorDesc desc{e->meta.dtype, e->meta.shape, Layout()};
    ASSIGN_OR_RETURN(desc.layout, LayoutFromJson(tj.value("layout", Json())));
    RETURN_IF_ERROR(ValidateLayout(p.mesh, desc.layout, desc.shape));
    items.push_back({e, desc});
    total += NumElements(LocalShape(p.mesh, desc.layout, desc.shape)) * DTypeSize(desc.dtype) *
             p.devices.size();
  }
  for (const auto& it : items) {
    const auto& name = it.entry->meta.name;
    // Devices of this worker that hold the same slice (replicas) share one read.
    std::map<std::vector<int64_t>, std::string> read_once;
    for (int64_t device : p.devices) {
      SliceSpec slice = DeviceSlice(p.mesh, it.desc.layout, it.desc.shape, device);
      auto cached = read_once.find(slice.offsets);
      if (cached == read_once.end()) {
        ASSIGN_OR_RETURN(auto plan, storage::PlanRead(*it.entry, slice));
        std::string buf(slice.NumElements() * DTypeSize(it.desc.dtype), '\0');
        RETURN_IF_ERROR(storage::ExecuteRead(plan, &shards, buf.data(), buf.size(), &io_pool_));
        read += plan.stored_bytes;
        cached = read_once.emplace(slice.offsets, std::move(buf)).first;
      }
      RETURN_IF_ERROR(store_->Install(p.mesh.name, name, it.desc, device, cached->second.data(),
                                      cached->second.size()));
      done += cached->second.size();
      if (throttle.Due()) Report(client.get(), tid, "running", done, total, nullptr, Status::Ok());
    }
  }
  return Json{{"bytes", done}, {"stored_bytes_read", read}, {"tensors", items.size()}};
}

void Agent::AddRoutes(http::Router* router) {
  AddTrainerRoutes(router);
  router->Add({"GET", "/v1/preemption", [this](const http::Request& req) {
    auto mesh = req.Query("mesh");
    if (!mesh) return http::Response::Error(InvalidArgument("missing query parameter 'mesh'", {{"field", "mesh"}}));
    Status n = ValidateName(*mesh, "mesh");
    if (!n.ok()) return http::Response::Error(n);
    if (!req.Query("step")) {
      return http::Response::Error(InvalidArgument("missing query parameter 'step'", {{"field", "step"}}));
    }
    auto step = http::QueryInt(req, "step", -1);
    if (!step.ok()) return http::Response::Error(step.status());
    auto timeout = http::QueryInt(req, "timeout_ms", 60000);
    if (!timeout.ok()) return http::Response::Error(timeout.status());
    auto r = PreemptionSyncPoint(*mesh, *step, *timeout);
    return r.ok() ? http::Response::Json(200, *r) : http::Response::Error(r.status());
  }, "reached_preemption_sync_point(step): {sync, sync_step}", true});
  router->Add({"GET", "/healthz", [this](const http::Request&) {
    return http::Response::Json(200, {{"status", "ok"}, {"worker", id_},
                                      {"data_port", {{"refused_connections",
                                                      collectives::RefusedConnections()}}}});
  }, "liveness", false});
}

}  // namespace tessera::worker
