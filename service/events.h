// Event bus behind /api/v1/events (SSE): every state change is published with
// a sequence number; subscribers wait for events after the last one they saw.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "api/json_codec.h"
#include "api/thread_annotations.h"

namespace tessera::service {

struct Event {
  uint64_t seq = 0;
  std::string type;  // worker, mesh, job, checkpoint, memory_checkpoint, barrier, preemption
  Json data;
};

class EventBus {
 public:
  explicit EventBus(size_t keep = 2000) : keep_(keep) {}
  void Publish(const std::string& type, Json data);
  // Events with seq > after, waiting up to `timeout` for at least one.
  // Returns early (empty) after Shutdown().
  std::vector<Event> WaitAfter(uint64_t after, std::chrono::milliseconds timeout);
  uint64_t last_seq();
  void Shutdown();

 private:
  Mutex mu_;
  CondVar cv_;
  std::deque<Event> events_ GUARDED_BY(mu_);
  uint64_t seq_ GUARDED_BY(mu_) = 0;
  bool shutdown_ GUARDED_BY(mu_) = false;
  size_t keep_;
};

// "event: <type>\nid: <seq>\ndata: <json>\n\n"
std::string FormatSse(const Event& e);

}  // namespace tessera::service
