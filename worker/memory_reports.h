// Rank 0's reports of committed memory checkpoints to tesserad (docs/memory-tier.md):
// one request per checkpoint, sent from a thread of its own so that no memory save
// waits on tesserad. A report that cannot be delivered (tesserad away) is kept, the
// newer replacing the older of the same mesh, and sent again until it is taken. A
// tesserad that lost what it was told (restarted with a fresh catalog, or a standby
// that took over) is sent each mesh's newest delivered report again (SendAgain).
#pragma once

#include <functional>
#include <map>
#include <string>
#include <thread>

#include "api/json_codec.h"
#include "api/status.h"
#include "api/thread_annotations.h"

namespace tessera::worker {

class MemoryReports {
 public:
  using Send = std::function<Status(const std::string& mesh, const Json& body)>;
  // Tries again this long after a failed delivery.
  static constexpr int64_t kRetryMs = 500;

  explicit MemoryReports(Send send);
  ~MemoryReports();
  MemoryReports(const MemoryReports&) = delete;
  MemoryReports& operator=(const MemoryReports&) = delete;

  // Queues `body` for `mesh`, replacing one not sent yet.
  void Post(const std::string& mesh, Json body) EXCLUDES(mu_);
  // Queues again each mesh's newest delivered report, unless a newer one waits.
  void SendAgain() EXCLUDES(mu_);
  // Reports not delivered yet.
  size_t pending() const EXCLUDES(mu_);
  void Stop() EXCLUDES(mu_);

 private:
  void Loop();

  const Send send_;
  mutable Mutex mu_;
  CondVar cv_;
  std::map<std::string, Json> pending_ GUARDED_BY(mu_);
  std::map<std::string, Json> delivered_ GUARDED_BY(mu_);  // the newest, by mesh
  bool stopping_ GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace tessera::worker
