#include "worker/task_feed.h"

#include "http/router.h"

namespace tessera::worker {

std::string TaskFeed::Query() const {
  MutexLock lock(mu_);
  return "&ack=" + std::to_string(ack_) + "&meshes=" + std::to_string(meshes_) +
         "&queue=" + http::PercentEncode(queue_);
}

std::string TaskFeed::queue() const {
  MutexLock lock(mu_);
  return queue_;
}

void TaskFeed::Received(const Json& answer) {
  MutexLock lock(mu_);
  const std::string queue = answer.value("queue", "");
  if (queue != queue_) {
    queue_ = queue;
    meshes_ = 0;
  }
  ack_ = answer.value("ack", uint64_t{0});
  if (answer.contains("meshes")) meshes_ = answer.value("meshes_version", uint64_t{0});
}

bool TaskFeed::Start(const std::string& id) {
  MutexLock lock(mu_);
  if (ids_.count(id)) {
    ++repeated_;
    return false;
  }
  ++started_;
  ids_.insert(id);
  order_.push_back(id);
  if (order_.size() > remember_) {
    ids_.erase(order_.front());
    order_.pop_front();
  }
  return true;
}

int64_t TaskFeed::started() const {
  MutexLock lock(mu_);
  return started_;
}

int64_t TaskFeed::repeated() const {
  MutexLock lock(mu_);
  return repeated_;
}

}  // namespace tessera::worker
