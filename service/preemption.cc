#include "service/preemption.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "service/kv_store.h"
#include "service/records.h"

namespace tessera::service {
namespace {

const std::string kKeyPrefix = std::string(kInternalKvPrefix) + "preemption/";

Json Undecided(bool noticed) { return {{"noticed", noticed}, {"sync_step", nullptr}}; }

Json Decided(int64_t sync_step, int64_t step) {
  return {{"noticed", true}, {"sync_step", sync_step}, {"reached", step == sync_step}};
}

}  // namespace

std::string Preemption::CatalogKey(const std::string& mesh) { return kKeyPrefix + mesh; }

Status Preemption::Load() {
  ASSIGN_OR_RETURN(auto docs, catalog_->All("kv"));
  MutexLock lock(mu_);
  for (const auto& doc : docs) {
    if (!doc.is_object() || !doc.contains("key") || !doc["key"].is_string()) continue;
    const std::string key = doc["key"];
    if (key.rfind(kKeyPrefix, 0) != 0 || !doc.contains("mesh") || !doc["mesh"].is_string()) {
      continue;
    }
    Record r;
    r.epoch = next_epoch_++;
    r.reason = doc.value("reason", Json("")).is_string() ? doc["reason"].get<std::string>() : "";
    r.noticed_ms = doc.value("noticed_at", Json(0)).is_number_integer()
                       ? doc["noticed_at"].get<int64_t>()
                       : 0;
    if (doc.contains("sync_step") && doc["sync_step"].is_number_integer()) {
      r.sync_step = doc["sync_step"].get<int64_t>();
    }
    if (doc.contains("reported_steps") && doc["reported_steps"].is_object()) {
      for (const auto& [worker, step] : doc["reported_steps"].items()) {
        if (step.is_number_integer()) r.reported[worker] = step.get<int64_t>();
      }
    }
    notices_[doc["mesh"].get<std::string>()] = std::move(r);
  }
  return Status::Ok();
}

Json Preemption::ToJson(const std::string& mesh, const Record* r) const {
  Json reported = Json::object();
  if (r) {
    for (const auto& [worker, step] : r->reported) reported[worker] = step;
  }
  return {{"mesh", mesh},
          {"noticed", r != nullptr},
          {"reason", r ? Json(r->reason) : Json()},
          {"noticed_at", r ? Json(r->noticed_ms) : Json()},
          {"sync_step", r && r->sync_step ? Json(*r->sync_step) : Json()},
          {"reported_steps", reported}};
}

Status Preemption::Persist(const std::string& mesh, const Record* r) {
  Status st;
  if (r == nullptr) {
    st = catalog_->Delete("kv", CatalogKey(mesh));
  } else {
    Json doc = ToJson(mesh, r);
    doc["key"] = CatalogKey(mesh);
    st = catalog_->Put("kv", CatalogKey(mesh), doc);
  }
  if (st.ok()) return st;
  if (metrics_) metrics_->Count("tessera_catalog_write_failures_total", "table=\"kv\"");
  return st.WithContext(std::string(r ? "storing" : "deleting") +
                        " the preemption notice of mesh " + mesh)
      .WithDetail("mesh", mesh);
}

Result<Json> Preemption::Notice(const std::string& mesh, const std::string& reason) {
  WriteTurns::Turn turn = turns_.Take();
  Record r;
  {
    MutexLock lock(mu_);
    auto it = notices_.find(mesh);
    if (it != notices_.end()) return ToJson(mesh, &it->second);
    r.epoch = next_epoch_++;
  }
  r.reason = reason;
  r.noticed_ms = WallMs();
  RETURN_IF_ERROR(Persist(mesh, &r));
  Json state = ToJson(mesh, &r);
  {
    MutexLock lock(mu_);
    notices_[mesh] = std::move(r);
  }
  std::fprintf(stderr, "mesh %s: preemption noticed (%s)\n", mesh.c_str(), reason.c_str());
  Publish({{"mesh", mesh}, {"action", "noticed"}, {"reason", reason}});
  return state;
}

Json Preemption::State(const std::string& mesh) {
  MutexLock lock(mu_);
  auto it = notices_.find(mesh);
  return ToJson(mesh, it == notices_.end() ? nullptr : &it->second);
}

Status Preemption::Clear(const std::string& mesh) {
  WriteTurns::Turn turn = turns_.Take();
  {
    MutexLock lock(mu_);
    if (!notices_.count(mesh)) return Status::Ok();
  }
  RETURN_IF_ERROR(Persist(mesh, nullptr));
  {
    MutexLock lock(mu_);
    notices_.erase(mesh);
  }
  cv_.NotifyAll();
  Publish({{"mesh", mesh}, {"action", "cleared"}});
  return Status::Ok();
}

Result<Json> Preemption::Report(const std::string& mesh, const std::vector<std::string>& workers,
                                const std::string& worker, int64_t step, uint64_t* epoch) {
  WriteTurns::Turn turn = turns_.Take();
  Record r;
  {
    MutexLock lock(mu_);
    if (stopping_) return Unavailable("tesserad is shutting down", {{"mesh", mesh}, {"worker", worker}});
    auto it = notices_.find(mesh);
    if (it == notices_.end()) return Undecided(false);
    if (std::find(workers.begin(), workers.end(), worker) == workers.end()) {
      return Conflict("worker " + worker + " is not a worker of mesh " + mesh,
                      {{"mesh", mesh}, {"worker", worker}, {"field", "worker"}});
    }
    if (it->second.sync_step) return Decided(*it->second.sync_step, step);
    r = it->second;
  }
  auto [slot, inserted] = r.reported.try_emplace(worker, step);
  if (!inserted) slot->second = std::max(slot->second, step);
  int64_t max_step = -1;
  bool all = true;
  for (const auto& w : workers) {
    auto s = r.reported.find(w);
    all = all && s != r.reported.end();
    if (s != r.reported.end()) max_step = std::max(max_step, s->second);
  }
  if (all) r.sync_step = max_step + 1;
  // The report is stored before it counts: a failed write fails this call (the worker
  // reports again), and memory stays as the catalog has it.
  RETURN_IF_ERROR(Persist(mesh, &r).WithDetail("worker", worker));
  *epoch = r.epoch;
  const std::optional<int64_t> sync_step = r.sync_step;
  {
    MutexLock lock(mu_);
    notices_[mesh] = std::move(r);
  }
  if (!sync_step) return Json();  // wait for the others
  std::fprintf(stderr, "mesh %s: preemption sync step %lld\n", mesh.c_str(),
               static_cast<long long>(*sync_step));
  Publish({{"mesh", mesh}, {"action", "sync_step"}, {"sync_step", *sync_step}});
  cv_.NotifyAll();
  return Decided(*sync_step, step);
}

Result<Json> Preemption::Sync(const std::string& mesh, const std::vector<std::string>& workers,
                              const std::string& worker, int64_t step, int64_t timeout_ms) {
  uint64_t epoch = 0;
  Result<Json> reported = Report(mesh, workers, worker, step, &epoch);
  if (!reported.ok() || !reported->is_null()) return CountSync(std::move(reported));
  MutexLock lock(mu_);
  // Re-found after every wake: Clear() may erase the record meanwhile.
  auto current = [&]() REQUIRES(mu_) -> Record* {
    auto n = notices_.find(mesh);
    return n == notices_.end() || n->second.epoch != epoch ? nullptr : &n->second;
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  Record* c = current();
  while (!stopping_ && c && !c->sync_step.has_value()) {
    const bool woken = cv_.WaitUntil(mu_, deadline);
    c = current();
    if (!woken) break;
  }
  if (c && c->sync_step) return CountSync(Decided(*c->sync_step, step));
  if (stopping_) {
    return CountSync(Unavailable("tesserad is shutting down", {{"mesh", mesh}, {"worker", worker}}));
  }
  if (!c) {
    if (notices_.count(mesh)) {
      return CountSync(Conflict("the preemption notice of mesh " + mesh +
                                    " was replaced while waiting; report again",
                                {{"mesh", mesh}, {"worker", worker}}));
    }
    return CountSync(Undecided(false));
  }
  Json missing_now = Json::array();
  for (const auto& w : workers) {
    if (!c->reported.count(w)) missing_now.push_back(w);
  }
  std::sort(missing_now.begin(), missing_now.end());
  return CountSync(DeadlineExceeded(
      "mesh " + mesh + ": worker " + worker + " waited " + std::to_string(timeout_ms) +
          " ms for the preemption sync point; " + std::to_string(missing_now.size()) + " of " +
          std::to_string(workers.size()) + " workers did not report a step",
      {{"mesh", mesh}, {"worker", worker}, {"missing_workers", missing_now}}));
}

int64_t Preemption::noticed_count() {
  MutexLock lock(mu_);
  return static_cast<int64_t>(notices_.size());
}

void Preemption::Shutdown() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  cv_.NotifyAll();
}

void Preemption::Publish(Json event) {
  if (events_) events_->Publish("preemption", std::move(event));
}

Result<Json> Preemption::CountSync(Result<Json> outcome) {
  if (metrics_) metrics_->Count("tessera_preemption_syncs_total", OutcomeLabel(outcome.status()));
  return outcome;
}

}  // namespace tessera::service
