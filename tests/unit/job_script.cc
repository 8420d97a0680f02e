#include "job_script.h"

#include <charconv>

#include "api/dtype.h"
#include "api/names.h"
#include "job_action_text.h"
#include "service/collective_machine.h"
#include "service/restore_machine.h"
#include "service/save_machine.h"
#include "service/verify_machine.h"
#include "storage/checkpoint_dir.h"
#include "storage/fragment_json.h"
#include "storage/save_plan.h"

namespace tessera::service {
namespace {

using testing::ScriptCommand;

constexpr const char* kJob = "j-1";
constexpr const char* kRoot = "/root";
constexpr int64_t kDefaultTaskTimeoutMs = 30 * 60 * 1000;
constexpr int64_t kDefaultCollectiveTimeoutMs = 10000;

std::string Joined(const std::vector<std::string>& parts, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? sep : "") + parts[i];
  return out;
}

// code=resource_exhausted (default: internal); a name that is no code is refused.
Result<Code> CodeOf(ScriptCommand& cmd) {
  const std::string name = cmd.String("code", "internal");
  const Code code = CodeFromName(name);
  if (code == Code::kOk || CodeName(code) != name) {
    return InvalidArgument("code=" + name + " is no error code (resource_exhausted, internal, …)");
  }
  return code;
}

// error="..." code=...: the error a task, a join or an I/O step ended with, into `error`.
Status ErrorOf(ScriptCommand& cmd, Status* error) {
  ASSIGN_OR_RETURN(std::string message, cmd.String("error"));
  ASSIGN_OR_RETURN(Code code, CodeOf(cmd));
  *error = Status(code, message);
  return Status::Ok();
}

Result<Json> ResultOf(ScriptCommand& cmd) {
  const std::string text = cmd.String("result", "{}");
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument("result=" + text + " is not JSON");
  return j;
}

uint64_t SliceBytes(const TensorMeta& t, const SliceSpec& slice) {
  return static_cast<uint64_t>(slice.NumElements()) * DTypeSize(t.dtype);
}

// What rank `rank` wrote: the slices `plan` gives it, one raw chunk each, in its own file.
std::vector<storage::FragmentSlice> Written(const std::vector<TensorMeta>& tensors,
                                            const std::vector<storage::PlannedSlice>& plan,
                                            int64_t rank) {
  std::vector<storage::FragmentSlice> out;
  uint64_t offset = 0;
  for (const storage::PlannedSlice& p : plan) {
    if (p.rank != rank) continue;
    storage::FragmentSlice s;
    s.tensor = tensors[p.tensor];
    s.slice = p.slice;
    s.file = "shard-" + std::to_string(rank) + "-t.tsr";
    const uint64_t bytes = SliceBytes(s.tensor, s.slice);
    s.chunks.push_back({0, storage::ChunkLocation{offset, bytes, bytes, 0, storage::Codec::kRaw}, {}});
    offset += bytes;
    out.push_back(std::move(s));
  }
  return out;
}

// Rank `rank`'s slices made to disagree with the plan in the way `how` names.
Status Spoil(const std::string& how, int64_t num_workers, const std::vector<TensorMeta>& tensors,
             const std::vector<storage::PlannedSlice>& plan, int64_t rank,
             std::vector<storage::FragmentSlice>* slices) {
  if (how == "extra_slice") {  // also a slice the plan gives another rank
    for (storage::PlannedSlice p : plan) {
      if (p.rank == rank) continue;
      p.rank = rank;
      slices->push_back(Written(tensors, {p}, rank).at(0));
      return Status::Ok();
    }
    return InvalidArgument("bad_fragment=extra_slice: the plan gives other ranks nothing");
  }
  if (slices->empty()) {
    return InvalidArgument("bad_fragment=" + how + ": the plan gives rank " + std::to_string(rank) +
                           " nothing to spoil");
  }
  if (how == "missing_slice") {
    slices->pop_back();
  } else if (how == "foreign_file") {  // the next rank's shard file
    slices->front().file = "shard-" + std::to_string((rank + 1) % num_workers) + "-t.tsr";
  } else if (how == "torn_chunks") {  // chunks that cover one byte less than the slice
    slices->front().chunks[0].loc.raw_length -= 1;
  } else {
    return InvalidArgument(
        "bad_fragment=" + how +
        " is none of extra_slice, missing_slice, foreign_file, torn_chunks, none");
  }
  return Status::Ok();
}

}  // namespace

Result<std::string> JobScript::Run(ScriptCommand& cmd) {
  const std::string& name = cmd.name();
  if (name == "tensor") {
    ASSIGN_OR_RETURN(std::string out, DeclareTensor(cmd));
    RETURN_IF_ERROR(cmd.CheckAllUsed());
    return out;
  }
  if (name == "save" || name == "restore" || name == "collective" || name == "self_test" ||
      name == "verify") {
    ASSIGN_OR_RETURN(std::string out, CreateJob(cmd));
    RETURN_IF_ERROR(cmd.CheckAllUsed());
    return out;
  }
  if (!machine_) {
    return InvalidArgument(name + " before any job (save, restore, collective, self_test, verify)");
  }
  return Deliver(cmd);  // which checks its arguments before the machine steps
}

Result<std::string> JobScript::DeclareTensor(ScriptCommand& cmd) {
  ASSIGN_OR_RETURN(std::string name, cmd.String("name"));
  RETURN_IF_ERROR(ValidateName(name, "name"));
  ASSIGN_OR_RETURN(DType dtype, ParseDType(cmd.String("dtype", "float32")));
  ASSIGN_OR_RETURN(std::string shape_text, cmd.String("shape"));
  ASSIGN_OR_RETURN(Shape shape, ParseShape(shape_text));
  ASSIGN_OR_RETURN(Layout layout, ParseLayout(cmd.String("layout", "")));
  tensors_.push_back(TensorMeta{name, dtype, shape, layout});
  return "tensor " + name + " " + tensors_.back().ToString();
}

Status JobScript::TensorsFit() const {
  for (const TensorMeta& t : tensors_) {
    Status valid = ValidateLayout(mesh_.mesh, t.layout, t.shape);
    if (!valid.ok()) return valid.WithContext("tensor " + t.name + " does not fit the mesh");
  }
  return Status::Ok();
}

std::vector<std::string> JobScript::TensorNames() const {
  std::vector<std::string> names;
  for (const TensorMeta& t : tensors_) names.push_back(t.name);
  return names;
}

Result<MeshRecord> JobScript::MeshOf(ScriptCommand& cmd) {
  MeshRecord rec;
  rec.mesh.name = "m";
  ASSIGN_OR_RETURN(std::string axes, cmd.String("mesh"));
  ASSIGN_OR_RETURN(rec.mesh.devices_per_worker, cmd.Int("devices_per_worker", 1));
  size_t pos = 0;
  while (pos <= axes.size()) {
    const size_t comma = std::min(axes.find(',', pos), axes.size());
    const std::string axis = axes.substr(pos, comma - pos);
    const size_t colon = axis.find(':');
    if (colon == std::string::npos) {
      return InvalidArgument("mesh=" + axes + ": expected data:2,model:2");
    }
    int64_t size = 0;
    const char* end = axis.data() + axis.size();
    auto [ptr, ec] = std::from_chars(axis.data() + colon + 1, end, size);
    if (ec != std::errc() || ptr != end) {
      return InvalidArgument("mesh=" + axes + ": bad size of axis " + axis);
    }
    rec.mesh.axes.push_back({axis.substr(0, colon), size});
    pos = comma + 1;
  }
  RETURN_IF_ERROR(rec.mesh.Validate());
  for (int64_t r = 0; r < rec.mesh.num_workers(); ++r) {
    rec.workers.push_back("w-" + std::to_string(r));
  }
  return rec;
}

Result<std::string> JobScript::CreateJob(ScriptCommand& cmd) {
  ASSIGN_OR_RETURN(mesh_, MeshOf(cmd));
  const std::string kind = cmd.name();
  step_ = 0;
  if (kind == "save" || kind == "restore" || kind == "verify") {
    ASSIGN_OR_RETURN(step_, cmd.Int("step"));
  }
  const int64_t default_timeout = kind == "collective" || kind == "self_test"
                                      ? kDefaultCollectiveTimeoutMs
                                      : kDefaultTaskTimeoutMs;
  ASSIGN_OR_RETURN(int64_t timeout_ms, cmd.Int("timeout_ms", default_timeout));
  JobSpec spec = JobSpec::Of(kJob, mesh_, step_, timeout_ms);
  const Mesh& mesh = mesh_.mesh;
  std::vector<std::string> out{kind + " " + kJob + ": mesh " + mesh.name + " " + mesh.ToString()};
  std::vector<std::string> workers;
  for (int64_t r = 0; r < mesh.num_workers(); ++r) {
    workers.push_back("rank " + std::to_string(r) + " " + mesh_.workers[r] + " devices " +
                      Json(mesh.DevicesOfWorker(r)).dump());
  }
  out.push_back("workers: " + Joined(workers, ", "));
  if (kind == "save" || kind == "restore") RETURN_IF_ERROR(TensorsFit());
  if (kind == "save") {
    SaveRequest request;
    request.step = step_;
    ASSIGN_OR_RETURN(bool from_loop, cmd.Bool("from_loop", false));
    ASSIGN_OR_RETURN(request.wait_for_trainer, cmd.Bool("wait_for_trainer", false));
    ASSIGN_OR_RETURN(int64_t join_wait_ms, cmd.Int("join_wait_ms", 0));
    spec.staging = storage::StagingDir(kRoot, mesh.name, step_, storage::kSaveStagingId);
    out[0] += ", step " + std::to_string(step_) +
              (from_loop                  ? ", in the loop"
               : request.wait_for_trainer ? ", over REST waiting for the trainers"
                                          : ", over REST") +
              ", join_wait_ms " + std::to_string(join_wait_ms) + ", timeout_ms " +
              std::to_string(timeout_ms) + ", staging " + spec.staging;
    // The plan every worker computes, as the commit will name it.
    out.push_back("plan: " + PlanText(storage::PlanSave(mesh, tensors_), TensorNames()));
    machine_ = std::make_unique<SaveMachine>(spec, request, from_loop, join_wait_ms);
  } else if (kind == "restore") {
    std::vector<int64_t> all;
    for (int64_t r = 0; r < mesh.num_workers(); ++r) all.push_back(r);
    ASSIGN_OR_RETURN(std::vector<int64_t> ranks, cmd.Ints("ranks", all));
    out[0] += ", step " + std::to_string(step_) + ", ranks " + Json(ranks).dump() + " read " +
              Joined(TensorNames(), " ") + ", timeout_ms " + std::to_string(timeout_ms);
    machine_ = std::make_unique<RestoreMachine>(spec, tensors_, ranks);
  } else if (kind == "collective") {
    ASSIGN_OR_RETURN(std::string op, cmd.String("op"));
    out[0] += ", " + op + ", timeout_ms " + std::to_string(timeout_ms);
    machine_ = std::make_unique<CollectiveMachine>(spec, TaskKind::kCollective, Json{{"op", op}},
                                                   timeout_ms);
  } else if (kind == "self_test") {
    out[0] += ", timeout_ms " + std::to_string(timeout_ms);
    machine_ =
        std::make_unique<CollectiveMachine>(spec, TaskKind::kMeshInit, Json::object(), timeout_ms);
  } else {
    out[0] += ", step " + std::to_string(step_);
    machine_ = std::make_unique<VerifyMachine>(spec);
  }
  now_ = 0;
  round_ = 0;
  deadline_ = 0;
  return Joined(out, "\n");
}

Result<std::string> JobScript::Deliver(ScriptCommand& cmd) {
  ASSIGN_OR_RETURN(int64_t now, cmd.Int("now", now_));
  if (now < now_) {
    return InvalidArgument("now=" + std::to_string(now) + " is before the last event's " +
                           std::to_string(now_) + ": time never goes back");
  }
  ASSIGN_OR_RETURN(JobEvent event, EventOf(cmd, now));
  RETURN_IF_ERROR(cmd.CheckAllUsed());
  now_ = now;
  const bool was_ended = machine_->ended();
  std::vector<std::string> out;
  for (const JobAction& a : machine_->Step(event)) {
    if (a.kind == JobAction::Kind::kQueueTasks) round_ = a.round;
    out.push_back(ActionText(a, TensorNames()));
  }
  if (machine_->ended() && !was_ended) {
    out.push_back("ended");
  } else if (machine_->deadline_ms() != deadline_) {
    out.push_back(machine_->deadline_ms() ? "deadline " + std::to_string(machine_->deadline_ms())
                                          : "deadline none");
  }
  deadline_ = machine_->deadline_ms();
  if (out.empty()) out.push_back("(no actions)");
  return Joined(out, "\n");
}

Result<JobEvent> JobScript::EventOf(ScriptCommand& cmd, int64_t now) {
  const std::string& name = cmd.name();
  if (name == "start") return JobEvent::Start(now);
  if (name == "cancel") return JobEvent::Cancel(now);
  if (name == "tick") return JobEvent::Tick(now);
  if (name == "stop") return JobEvent::Stop(now);
  if (name == "join") {
    ASSIGN_OR_RETURN(int64_t rank, cmd.Int("rank"));
    ASSIGN_OR_RETURN(SaveJoinRequest join, JoinOf(cmd, rank));
    return JobEvent::Joined(now, rank, std::move(join));
  }
  if (name == "task_ok" || name == "task_failed") {
    ASSIGN_OR_RETURN(int64_t rank, cmd.Int("rank"));
    ASSIGN_OR_RETURN(int64_t round, cmd.Int("round", round_));
    if (name == "task_failed") {
      Status error;
      RETURN_IF_ERROR(ErrorOf(cmd, &error));
      return JobEvent::TaskFailed(now, round, rank, std::move(error));
    }
    ASSIGN_OR_RETURN(Json result, ResultOf(cmd));
    return JobEvent::TaskSucceeded(now, round, rank, std::move(result));
  }
  if (name == "worker_dead") {
    ASSIGN_OR_RETURN(std::string worker, cmd.String("worker"));
    ASSIGN_OR_RETURN(int64_t silent_ms, cmd.Int("silent_ms"));
    return JobEvent::WorkerDead(now, worker, silent_ms);
  }
  if (name == "io_done") {
    if (cmd.Has("error")) {
      Status error;
      RETURN_IF_ERROR(ErrorOf(cmd, &error));
      return JobEvent::IoDone(now, Result<Json>(std::move(error)));
    }
    ASSIGN_OR_RETURN(Json result, ResultOf(cmd));
    return JobEvent::IoDone(now, std::move(result));
  }
  return InvalidArgument("unknown command '" + name + "'");
}

Result<SaveJoinRequest> JobScript::JoinOf(ScriptCommand& cmd, int64_t rank) {
  const Mesh& mesh = mesh_.mesh;
  const int64_t n = mesh.num_workers();
  if (rank < 0 || rank >= n) {
    return InvalidArgument("rank=" + std::to_string(rank) + " is not a rank of the mesh");
  }
  RETURN_IF_ERROR(TensorsFit());  // storage::PlanSave requires it
  SaveJoinRequest join;
  join.save.step = step_;
  join.worker = mesh_.workers[rank];
  const std::string bad_snapshot = cmd.String("bad_snapshot", "");
  std::vector<int64_t> devices = mesh.DevicesOfWorker(rank);
  if (bad_snapshot == "wrong_devices") devices = mesh.DevicesOfWorker((rank + 1) % n);
  for (const TensorMeta& t : tensors_) {
    join.snapshot.tensors.push_back({t, devices});
    join.snapshot.snapshot_bytes +=
        NumElements(LocalShape(mesh, t.layout, t.shape)) * DTypeSize(t.dtype) * devices.size();
  }
  if (bad_snapshot == "missing_tensor") {
    if (join.snapshot.tensors.empty()) {
      return InvalidArgument("bad_snapshot=missing_tensor: no tensor declared");
    }
    join.snapshot.tensors.pop_back();
  } else if (!bad_snapshot.empty() && bad_snapshot != "wrong_devices") {
    return InvalidArgument("bad_snapshot=" + bad_snapshot +
                           " is neither wrong_devices nor missing_tensor");
  }
  if (cmd.Has("error")) {
    RETURN_IF_ERROR(ErrorOf(cmd, &join.error));
    return join;
  }
  const std::string bad_fragment = cmd.String("bad_fragment", "");
  if (bad_fragment == "none") return join;  // neither written nor an error
  const std::vector<storage::PlannedSlice> plan = storage::PlanSave(mesh, tensors_);
  std::vector<storage::FragmentSlice> slices = Written(tensors_, plan, rank);
  if (!bad_fragment.empty()) {
    RETURN_IF_ERROR(Spoil(bad_fragment, n, tensors_, plan, rank, &slices));
  }
  uint64_t bytes = 0;
  for (const storage::FragmentSlice& s : slices) bytes += SliceBytes(s.tensor, s.slice);
  join.written = SaveWritten{bytes, bytes, storage::FragmentToJson(slices), 0, std::nullopt};
  return join;
}

}  // namespace tessera::service
