#include "worker/memory_reports.h"

#include <chrono>
#include <cstdio>

namespace tessera::worker {

MemoryReports::MemoryReports(Send send) : send_(std::move(send)), thread_([this] { Loop(); }) {}

MemoryReports::~MemoryReports() { Stop(); }

void MemoryReports::Post(const std::string& mesh, Json body) {
  {
    MutexLock lock(mu_);
    pending_[mesh] = std::move(body);
  }
  cv_.NotifyAll();
}

void MemoryReports::SendAgain() {
  {
    MutexLock lock(mu_);
    for (const auto& [mesh, body] : delivered_) pending_.try_emplace(mesh, body);
  }
  cv_.NotifyAll();
}

size_t MemoryReports::pending() const {
  MutexLock lock(mu_);
  return pending_.size();
}

void MemoryReports::Stop() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  cv_.NotifyAll();
  if (thread_.joinable()) thread_.join();
}

void MemoryReports::Loop() {
  bool failed = false;
  while (true) {
    std::string mesh;
    Json body;
    {
      MutexLock lock(mu_);
      if (failed && !stopping_) cv_.WaitFor(mu_, std::chrono::milliseconds(kRetryMs));
      while (!stopping_ && pending_.empty()) cv_.Wait(mu_);
      if (stopping_) return;
      auto it = pending_.begin();
      mesh = it->first;
      body = std::move(it->second);
      pending_.erase(it);
    }
    Status st = send_(mesh, body);
    failed = !st.ok() && st.code() == Code::kUnavailable;
    if (st.ok()) {
      MutexLock lock(mu_);
      auto& last = delivered_[mesh];
      if (!last.is_object() || last.value("step", int64_t{-1}) <= body.value("step", int64_t{-1})) last = body;
    } else if (failed) {
      MutexLock lock(mu_);
      pending_.try_emplace(mesh, std::move(body));  // unless a newer one came meanwhile
    } else {
      {
        MutexLock lock(mu_);
        delivered_.erase(mesh);  // refused (the mesh is gone): nothing to send again
      }
      std::fprintf(stderr, "the report of memory checkpoint step %lld of mesh %s was refused: %s\n",
                   static_cast<long long>(body.value("step", int64_t{-1})), mesh.c_str(),
                   st.ToString().c_str());
    }
  }
}

}  // namespace tessera::worker
