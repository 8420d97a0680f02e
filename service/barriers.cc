#include "service/barriers.h"

#include <algorithm>

#include "service/records.h"

namespace tessera::service {
namespace {

// Idle names kept (for their generation count) before they are forgotten.
constexpr size_t kKeepBarriers = 4096;

Json ArrivedRanks(const std::map<int64_t, int64_t>& arrived) {
  Json out = Json::array();
  for (const auto& [rank, ms] : arrived) out.push_back(rank);
  return out;
}

Json MissingRanks(const std::map<int64_t, int64_t>& arrived, int64_t world) {
  Json out = Json::array();
  for (int64_t r = 0; r < world; ++r) {
    if (!arrived.count(r)) out.push_back(r);
  }
  return out;
}

}  // namespace

Result<Json> Barriers::Arrive(const std::string& name, int64_t rank, int64_t world,
                              int64_t timeout_ms) {
  const int64_t start = clock_->MonoMs();
  MutexLock lock(mu_);
  if (stopping_) {
    Status st = Unavailable("tesserad is shutting down", {{"barrier", name}});
    CountWait(st);
    return st;
  }
  std::shared_ptr<Barrier>& slot = barriers_[name];
  if (!slot) slot = std::make_shared<Barrier>();
  std::shared_ptr<Barrier> b = slot;
  if (!b->arrived.empty() && b->world != world) {
    Status st = Conflict("barrier " + name + " is open with world " + std::to_string(b->world) +
                             ", rank " + std::to_string(rank) + " arrived with world " +
                             std::to_string(world),
                         {{"barrier", name}, {"field", "world"}, {"world", world},
                          {"open_world", b->world}});
    CountWait(st);
    return st;
  }
  if (b->arrived.count(rank)) {
    Status st = Conflict("rank " + std::to_string(rank) + " is already waiting at barrier " + name,
                         {{"barrier", name}, {"field", "rank"}, {"rank", rank}});
    CountWait(st);
    return st;
  }
  const int64_t now = clock_->WallMs();
  if (b->arrived.empty()) {
    b->world = world;
    b->opened_ms = now;
  }
  b->arrived[rank] = now;
  const int64_t generation = b->generation;
  Publish({{"name", name}, {"action", "arrived"}, {"rank", rank}, {"world", world},
           {"generation", generation}, {"arrived", b->arrived.size()}});
  auto waited = [&] { return clock_->MonoMs() - start; };
  const Json done = {{"name", name}, {"world", world}, {"generation", generation}};
  if (static_cast<int64_t>(b->arrived.size()) == world) {
    b->arrived.clear();
    b->generation++;
    Publish({{"name", name}, {"action", "completed"}, {"world", world}, {"generation", generation}});
    ForgetIdle();
    lock.unlock();
    cv_.NotifyAll();
    CountWait(Status::Ok());
    Json out = done;
    out["waited_ms"] = waited();
    return out;
  }
  // At least 1: a deadline of 0 means none to the clock.
  const int64_t deadline = std::max<int64_t>(1, clock_->MonoMs() + timeout_ms);
  while (!stopping_ && b->generation == generation) {
    if (!clock_->WaitUntil(cv_, mu_, deadline)) break;
  }
  if (b->generation != generation) {
    lock.unlock();
    CountWait(Status::Ok());
    Json out = done;
    out["waited_ms"] = waited();
    return out;
  }
  // Timed out or shutting down: this rank leaves the round.
  Json arrived = ArrivedRanks(b->arrived);
  Json missing = MissingRanks(b->arrived, world);
  b->arrived.erase(rank);
  Status st;
  if (stopping_) {
    st = Unavailable("tesserad is shutting down; barrier " + name + " abandoned",
                     {{"barrier", name}, {"rank", rank}});
  } else {
    Publish({{"name", name}, {"action", "timed_out"}, {"rank", rank}, {"world", world},
             {"generation", generation}, {"missing_ranks", missing}});
    st = DeadlineExceeded("barrier " + name + ": rank " + std::to_string(rank) + " waited " +
                              std::to_string(timeout_ms) + " ms; " +
                              std::to_string(missing.size()) + " of " + std::to_string(world) +
                              " ranks did not arrive",
                          {{"barrier", name}, {"rank", rank}, {"world", world},
                           {"missing_ranks", missing}, {"arrived_ranks", arrived}});
  }
  if (b->arrived.empty()) ForgetIdle();
  lock.unlock();
  CountWait(st);
  return st;
}

Json Barriers::List() {
  MutexLock lock(mu_);
  const int64_t now = clock_->WallMs();
  Json out = Json::array();
  for (const auto& [name, b] : barriers_) {
    if (b->arrived.empty()) continue;
    out.push_back({{"name", name},
                   {"world", b->world},
                   {"generation", b->generation},
                   {"arrived_ranks", ArrivedRanks(b->arrived)},
                   {"missing_ranks", MissingRanks(b->arrived, b->world)},
                   {"waiting_ms", std::max<int64_t>(0, now - b->opened_ms)}});
  }
  return out;
}

int64_t Barriers::open_count() {
  MutexLock lock(mu_);
  int64_t n = 0;
  for (const auto& [name, b] : barriers_) n += b->arrived.empty() ? 0 : 1;
  return n;
}

void Barriers::Shutdown() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  cv_.NotifyAll();
}

void Barriers::ForgetIdle() {
  // Open barriers each hold an HTTP thread, so after a sweep few names remain
  // and the next sweep is kKeepBarriers arrivals of new names away.
  if (barriers_.size() <= kKeepBarriers) return;
  std::erase_if(barriers_, [](const auto& entry) { return entry.second->arrived.empty(); });
}

void Barriers::Publish(Json event) {
  if (events_) events_->Publish("barrier", std::move(event));
}

void Barriers::CountWait(const Status& outcome) {
  if (metrics_) metrics_->Count("tessera_barrier_waits_total", OutcomeLabel(outcome));
}

}  // namespace tessera::service
