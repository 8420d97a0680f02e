// The checkpoints of a mesh: list, detail and delete of the catalog's (the records live in
// the CheckpointRegistry, checkpoint_registry.h), and the reports of its memory tier (kept
// in MemoryCheckpoints, memory_checkpoints.h), which the list and detail show too.
#include <cstdio>
#include <set>

#include "api/names.h"
#include "service/service.h"
#include "storage/checkpoint_dir.h"
#include "storage/shared_chunks.h"

namespace tessera::service {

Result<Json> Service::ListCheckpoints(const std::string& mesh) {
  std::vector<Json> list = checkpoints_.Summaries(mesh);
  if (list.empty() && !meshes_.Has(mesh)) return NotFound("no mesh " + mesh, {{"mesh", mesh}});
  const MemoryCheckpoints::Report memory = memory_checkpoints_.Get(mesh);
  return Json(WithMemoryTier(mesh, std::move(list), memory.get()));
}

Result<Json> Service::GetCheckpoint(const std::string& mesh, const std::string& step) {
  const MemoryCheckpoints::Report memory = memory_checkpoints_.Get(mesh);
  auto with_tiers = [&](const CheckpointRecord& c) {
    Json j = c.ToJson();
    j["tiers"] = Tiers(memory && memory->Holds(c.step), c.state == CheckpointState::kCommitted);
    return j;
  };
  // Workers restore "latest" from the root: it stays the newest persisted checkpoint.
  if (step == "latest") {
    ASSIGN_OR_RETURN(CheckpointRecord c, checkpoints_.FindCommitted(mesh, step));
    return with_tiers(c);
  }
  ASSIGN_OR_RETURN(int64_t s, ParseStep(step));
  if (auto c = checkpoints_.Get(CheckpointRecord::Key(mesh, s))) return with_tiers(*c);
  if (memory && memory->Holds(s)) return MemoryCheckpointRecord(mesh, *memory, s);
  return NotFound("mesh " + mesh + " has no checkpoint at step " + std::to_string(s),
                  {{"mesh", mesh}, {"step", s}});
}

Result<Json> Service::StartPersist(const std::string& mesh, const std::string& step,
                                  const Json& body) {
  ASSIGN_OR_RETURN(int64_t s, ParseStep(step));
  Json request = body.is_object() ? body : Json::object();
  for (const auto& [field, value] : request.items()) {
    if (field != "compression" && field != "level") {
      return InvalidArgument("a persist takes only compression and level, not " + field,
                             {{"field", field}});
    }
  }
  if (!meshes_.Has(mesh)) return NotFound("no mesh " + mesh, {{"mesh", mesh}});
  const MemoryCheckpoints::Report memory = memory_checkpoints_.Get(mesh);
  if (!memory || !memory->Holds(s)) {
    Json held = memory ? Json(memory->steps) : Json::array();
    return NotFound("the memory tier of mesh " + mesh + " holds no step " + std::to_string(s) +
                        " (it holds " + held.dump() + ")",
                    {{"mesh", mesh}, {"step", s}, {"memory_steps", held}});
  }
  if (auto c = checkpoints_.Get(CheckpointRecord::Key(mesh, s));
      c && c->state == CheckpointState::kCommitted) {
    return Conflict("step " + std::to_string(s) + " of mesh " + mesh + " is persisted already",
                    {{"mesh", mesh}, {"step", s}, {"state", "committed"}});
  }
  request["step"] = s;
  request["from_memory"] = true;
  ASSIGN_OR_RETURN(SaveRequest save, SaveRequest::FromJson(request));
  return StartSave(mesh, save);
}

Result<Json> Service::ReportMemoryCheckpoints(const std::string& mesh,
                                              const Result<MemoryCheckpointReport>& report) {
  Result<Json> answer = KeepMemoryReport(mesh, report);
  std::string outcome = OutcomeLabel(answer.status());
  if (answer.ok() && answer->contains("ignored")) outcome = "outcome=\"ignored\"";
  metrics_.Count("tessera_memory_checkpoint_reports_total", outcome);
  return answer;
}

Result<Json> Service::KeepMemoryReport(const std::string& mesh,
                                       const Result<MemoryCheckpointReport>& report) {
  RETURN_IF_ERROR(report.status());
  ASSIGN_OR_RETURN(MeshRecord m, meshes_.Get(mesh));
  for (size_t i = 0; i < report->workers.size(); ++i) {
    const MemoryCheckpointReport::Worker& w = report->workers[i];
    const std::string where = "workers[" + std::to_string(i) + "]";
    Json details = {{"mesh", mesh}, {"rank", w.rank}, {"worker", w.worker}};
    if (w.rank >= static_cast<int64_t>(m.workers.size())) {
      details["field"] = where + ".rank";
      return InvalidArgument(where + ": worker " + w.worker + " has rank " +
                                 std::to_string(w.rank) + ", but mesh " + mesh + " has " +
                                 std::to_string(m.workers.size()) + " ranks",
                             details);
    }
    const std::string& expected = m.workers[static_cast<size_t>(w.rank)];
    if (w.worker != expected) {
      details["field"] = where + ".worker";
      details["expected"] = expected;
      return InvalidArgument(where + ": rank " + std::to_string(w.rank) + " of mesh " + mesh +
                                 " is worker " + expected + ", not " + w.worker,
                             details);
    }
  }
  const int64_t step = report->step;
  const std::vector<int64_t> steps = report->steps;
  if (std::optional<int64_t> held = memory_checkpoints_.Put(mesh, *report)) {
    return Json{{"acknowledged", true}, {"ignored", "older than step " + std::to_string(*held)}};
  }
  // The mesh may have been deleted meanwhile: what its deletion forgot stays forgotten.
  if (!meshes_.Has(mesh)) {
    memory_checkpoints_.Forget(mesh);
    return NotFound("no mesh " + mesh, {{"mesh", mesh}});
  }
  events_.Publish("memory_checkpoint", {{"mesh", mesh}, {"step", step}, {"steps", steps}});
  return Json{{"acknowledged", true}};
}

Status Service::DeleteCheckpoint(const std::string& mesh, const std::string& step_text) {
  ASSIGN_OR_RETURN(int64_t step, ParseStep(step_text));
  MeshRoots::Turn turn = mesh_roots_.Take(mesh);
  return DeleteInTurn(turn, step);
}

Status Service::DeleteInTurn(const MeshRoots::Turn& turn, int64_t step) {
  const std::string& mesh = turn.mesh();
  const std::string& root = options_.checkpoint_root;
  const std::string key = CheckpointRecord::Key(mesh, step);
  // From here no job can hold it, and no save can take its step, until EndDelete.
  RETURN_IF_ERROR(checkpoints_.BeginDelete(mesh, step).status());
  std::set<std::string> live;
  bool swept_ready = false;
  StateWrite w;
  w.what = "delete step " + std::to_string(step) + " of mesh " + mesh;  // fenced by WriteState
  w.root = [&]() -> Status {
    Status st = storage::RetireOrRemove(env_, root, mesh, step, &live);
    swept_ready = st.ok();
    if (st.ok() || st.code() == Code::kNotFound) return Status::Ok();  // gone already: deleted
    // A failure after the change landed (the sync of a rename, say) still deleted the step:
    // the catalog and memory follow the root, and the collector finishes the rest.
    if (storage::CommittedDir(env_, root, mesh, step).status().code() == Code::kNotFound) {
      std::fprintf(stderr, "%s: the step is gone from the root, though %s\n", w.what.c_str(),
                   st.ToString().c_str());
      CollectGarbageSoon();
      return Status::Ok();
    }
    return st;
  };
  // No undo: deleted files do not come back, so memory follows the root.
  w.catalog = {{"checkpoints", key, std::nullopt}};
  bool deleted = false;
  w.memory = [&] { deleted = true; };
  Status st = WriteState(w);
  checkpoints_.EndDelete(key, deleted);
  RETURN_IF_ERROR(st);
  events_.Publish("checkpoint", {{"mesh", mesh}, {"step", step}, {"state", "deleted"}});
  // The sweep decides from `live`, read in this turn: no checkpoint of the mesh committed
  // or went since. Its failure leaves files the collector removes later, nothing more.
  if (swept_ready) {
    std::vector<std::string> removed;
    if (Status swept = storage::SweepRetired(env_, root, mesh, live, &removed); !swept.ok()) {
      std::fprintf(stderr, "%s: its sweep is left to the collector: %s\n", w.what.c_str(),
                   swept.ToString().c_str());
      CollectGarbageSoon();
    }
  }
  return Status::Ok();
}

}  // namespace tessera::service
