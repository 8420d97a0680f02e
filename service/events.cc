#include "service/events.h"

namespace tessera::service {

void EventBus::Publish(const std::string& type, Json data) {
  {
    MutexLock lock(mu_);
    events_.push_back({++seq_, type, std::move(data)});
    while (events_.size() > keep_) events_.pop_front();
  }
  cv_.NotifyAll();
}

std::vector<Event> EventBus::WaitAfter(uint64_t after, std::chrono::milliseconds timeout) {
  MutexLock lock(mu_);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!shutdown_ && seq_ <= after) {
    if (!cv_.WaitUntil(mu_, deadline)) break;
  }
  std::vector<Event> out;
  for (const auto& e : events_) {
    if (e.seq > after) out.push_back(e);
  }
  return out;
}

uint64_t EventBus::last_seq() {
  MutexLock lock(mu_);
  return seq_;
}

void EventBus::Shutdown() {
  {
    MutexLock lock(mu_);
    shutdown_ = true;
  }
  cv_.NotifyAll();
}

std::string FormatSse(const Event& e) {
  return "event: " + e.type + "\nid: " + std::to_string(e.seq) + "\ndata: " + e.data.dump() +
         "\n\n";
}

}  // namespace tessera::service
