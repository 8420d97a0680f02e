#include "service/events.h"

namespace tessera::service {

void EventBus::Publish(const std::string& type, Json data) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back({++seq_, type, std::move(data)});
    while (events_.size() > keep_) events_.pop_front();
  }
  cv_.notify_all();
}

std::vector<Event> EventBus::WaitAfter(uint64_t after, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return shutdown_ || seq_ > after; });
  std::vector<Event> out;
  for (const auto& e : events_) {
    if (e.seq > after) out.push_back(e);
  }
  return out;
}

uint64_t EventBus::last_seq() {
  std::lock_guard<std::mutex> lock(mu_);
  return seq_;
}

void EventBus::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_ = true;
  }
  cv_.notify_all();
}

std::string FormatSse(const Event& e) {
  return "event: " + e.type + "\nid: " + std::to_string(e.seq) + "\ndata: " + e.data.dump() +
         "\n\n";
}

}  // namespace tessera::service
