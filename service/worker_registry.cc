#include "service/worker_registry.h"

#include <algorithm>
#include <chrono>

#include "api/clock.h"

namespace tessera::service {

void WorkerRegistry::Load(WorkerRecord w, int64_t now) {
  w.state = WorkerState::kSuspect;
  Touch(&w, now);
  MutexLock lock(mu_);
  const std::string id = w.id;
  if (workers_.count(id)) return;
  order_.push_back(id);
  workers_[id].record = std::move(w);
}

WorkerRecord WorkerRegistry::Register(const WorkerRecord& fields, int64_t now) {
  MutexLock lock(mu_);
  auto [it, inserted] = workers_.try_emplace(fields.id);
  WorkerRecord& w = it->second.record;
  if (inserted) {
    order_.push_back(fields.id);
    w.registered_ms = fields.registered_ms;
  }
  w.id = fields.id;
  w.host = fields.host;
  w.data_port = fields.data_port;
  w.local_port = fields.local_port;
  w.devices = fields.devices;
  w.state = WorkerState::kAlive;
  Touch(&w, now);
  return w;
}

Result<std::optional<WorkerRecord>> WorkerRegistry::Heartbeat(const std::string& id, int64_t now) {
  MutexLock lock(mu_);
  auto it = workers_.find(id);
  if (it == workers_.end()) {
    return NotFound("unknown worker " + id + "; register again", {{"worker", id}});
  }
  WorkerRecord& w = it->second.record;
  Touch(&w, now);
  if (w.state == WorkerState::kAlive) return std::optional<WorkerRecord>();
  w.state = WorkerState::kAlive;
  return std::optional<WorkerRecord>(w);
}

Result<PollAnswer> WorkerRegistry::Poll(const std::string& id, const PollRequest& request,
                                         int64_t now) {
  MutexLock lock(mu_);
  auto it = workers_.find(id);
  if (it == workers_.end()) return NotFound("unknown worker " + id, {{"worker", id}});
  // Numbers of another queue (a tesserad before this one) say nothing here.
  const bool ours = request.queue == queue_;
  PollAnswer answer;
  answer.queue = queue_;
  answer.ack = ours ? request.ack : 0;
  const bool wants_meshes = request.meshes.has_value();
  const uint64_t known = ours ? request.meshes.value_or(0) : 0;
  std::deque<Leased>& queued = it->second.tasks;
  while (!queued.empty() && queued.front().seq <= answer.ack) queued.pop_front();
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(request.wait_ms);
  std::shared_ptr<CondVar> wake = it->second.wake;  // the entry may go (Remove) while we wait
  const uint64_t mine = ++polls_;
  it->second.poll = mine;
  wake->NotifyAll();  // an older poll of this worker gives way now
  ++polls_waiting_;
  ++it->second.record.polls_waiting;
  while (true) {
    auto w = workers_.find(id);
    if (stopping_ || w == workers_.end() || w->second.poll != mine || !w->second.tasks.empty() ||
        (wants_meshes && placements_ > known)) {
      break;
    }
    if (!wake->WaitUntil(mu_, deadline)) break;
  }
  --polls_waiting_;
  it = workers_.find(id);
  if (it == workers_.end()) return answer;
  WorkerRecord& w = it->second.record;
  w.polls_waiting = std::max<int64_t>(0, w.polls_waiting - 1);
  if (it->second.poll != mine) return answer;
  Touch(&w, now);  // a poll answered is a sign of life from when it began
  for (const Leased& l : it->second.tasks) {
    answer.tasks.push_back(l.task);
    answer.ack = std::max(answer.ack, l.seq);
  }
  if (wants_meshes && placements_ > known) answer.meshes = placements_;
  return answer;
}

void WorkerRegistry::Acknowledge(const std::string& id, const std::string& task) {
  MutexLock lock(mu_);
  auto it = workers_.find(id);
  if (it == workers_.end()) return;
  std::erase_if(it->second.tasks, [&](const Leased& l) { return l.task.value("id", "") == task; });
}

void WorkerRegistry::PlacementsChanged() {
  MutexLock lock(mu_);
  ++placements_;
  for (auto& [id, e] : workers_) e.wake->NotifyAll();
}

void WorkerRegistry::Enqueue(Entry& e, Json task) {
  e.tasks.push_back({++seq_, std::move(task)});
  e.wake->NotifyAll();
}

std::optional<Unreachable> WorkerRegistry::QueueAll(
    const std::vector<std::pair<std::string, Json>>& tasks, int64_t now) {
  MutexLock lock(mu_);
  for (const auto& [id, task] : tasks) {
    auto w = workers_.find(id);
    if (w == workers_.end()) return Unreachable{id, 0};
    if (w->second.record.state == WorkerState::kDead) {
      return Unreachable{id, now - w->second.record.last_beat_mono_ms};
    }
  }
  for (const auto& [id, task] : tasks) Enqueue(workers_.at(id), task);
  return std::nullopt;
}

void WorkerRegistry::QueueToLive(const std::vector<std::string>& ids,
                                 const std::function<Json()>& make) {
  MutexLock lock(mu_);
  for (const std::string& id : ids) {
    auto w = workers_.find(id);
    if (w == workers_.end() || w->second.record.state == WorkerState::kDead) continue;
    Enqueue(w->second, make());
  }
}

std::optional<WorkerRecord> WorkerRegistry::Get(const std::string& id) const {
  MutexLock lock(mu_);
  auto it = workers_.find(id);
  if (it == workers_.end()) return std::nullopt;
  return it->second.record;
}

std::vector<WorkerRecord> WorkerRegistry::List() const {
  MutexLock lock(mu_);
  std::vector<WorkerRecord> out;
  out.reserve(order_.size());
  for (const std::string& id : order_) out.push_back(workers_.at(id).record);
  return out;
}

Status WorkerRegistry::Remove(const std::string& id) {
  MutexLock lock(mu_);
  auto it = workers_.find(id);
  if (it == workers_.end()) return NotFound("no worker " + id, {{"worker", id}});
  it->second.wake->NotifyAll();
  workers_.erase(it);
  order_.erase(std::remove(order_.begin(), order_.end(), id), order_.end());
  return Status::Ok();
}

std::vector<WorkerChange> WorkerRegistry::Scan(int64_t now, int64_t suspect_ms, int64_t lease_ms) {
  MutexLock lock(mu_);
  std::vector<WorkerChange> changed;
  for (auto& [id, e] : workers_) {
    WorkerRecord& w = e.record;
    if (w.state == WorkerState::kDead) continue;
    const int64_t age = now - w.last_beat_mono_ms;
    const WorkerState state = age > lease_ms     ? WorkerState::kDead
                              : age > suspect_ms ? WorkerState::kSuspect
                                                 : WorkerState::kAlive;
    if (state == w.state) continue;
    w.state = state;
    if (state == WorkerState::kDead) e.tasks.clear();
    changed.push_back({w, age});
  }
  return changed;
}

WorkerRegistry::Counts WorkerRegistry::Count() const {
  MutexLock lock(mu_);
  Counts c;
  for (const auto& [id, e] : workers_) {
    switch (e.record.state) {
      case WorkerState::kAlive: ++c.alive; break;
      case WorkerState::kSuspect: ++c.suspect; break;
      case WorkerState::kDead: ++c.dead; break;
    }
  }
  c.polls_waiting = polls_waiting_;
  return c;
}

void WorkerRegistry::Stop() {
  MutexLock lock(mu_);
  stopping_ = true;
  for (auto& [id, e] : workers_) e.wake->NotifyAll();
}

}  // namespace tessera::service
