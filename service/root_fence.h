// Holding a checkpoint root (docs/format.md, "Epochs and fencing"): a control plane
// takes the root's next epoch before it changes anything there, keeps a lease on it
// fresh, and changes the root (commits, deletes, garbage collection, mesh documents)
// only while Check() says its epoch is still the newest and its lease fresh. A
// deposed or paused control plane therefore refuses to act once a newer epoch exists,
// and leaves alone the staging dirs of saves that a newer epoch runs (their job ids
// carry that epoch).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "api/clock.h"
#include "api/json_codec.h"
#include "api/status.h"
#include "api/thread_annotations.h"
#include "storage/env.h"
#include "storage/root_epoch.h"

namespace tessera::service {

struct RootFenceOptions {
  std::string root;
  std::string url;   // this control plane's advertised URL, named to whoever finds the root held
  std::string ha;    // "etcd://..." when leadership comes from etcd, else ""
  int64_t lease_ms = 10000;
  Clock* clock = RealClock();  // the lease's ages and waits
};

// What is known of the process an epoch file names: on this machine (same boot, same
// pid namespace) whether it runs; of another machine's process, nothing.
enum class Holder { kGone, kRunningHere, kElsewhere };
Holder HolderState(const Json& holder);
// This process as an epoch file names it: url, host, pid, machine, start_ticks.
Json ThisProcess(const std::string& url);

class RootFence {
 public:
  // Takes the next epoch of the root. The newest holder, if any, gives it up when its
  // lease was released, when it is a process of this machine that is gone, or when both
  // run with the same --ha (etcd chose this one). Otherwise its lease is watched for one
  // lease (`log` says so): renewed → conflict naming the holder; not renewed → taken.
  static Result<std::unique_ptr<RootFence>> Acquire(storage::Env* env, RootFenceOptions options,
                                                    const std::function<void(const std::string&)>& log);
  ~RootFence();

  int64_t epoch() const { return epoch_; }
  int64_t since_ms() const { return since_ms_; }
  // Ok while this control plane may change the root; else unavailable naming why
  // (a newer epoch and its holder, or a lease not renewed) and `what` was refused.
  Status Check(const std::string& what);
  // Another condition Check requires (with --ha: leadership in etcd still fresh).
  void SetLeaderCheck(std::function<Status()> check) { leader_check_ = std::move(check); }
  // Renews the lease every third of it; `on_deposed` is called once, from the renewing
  // thread, when a newer epoch appears.
  void Start(std::function<void(const Status&)> on_deposed);
  // Stops renewing; `release` marks the lease released (a clean stop), so that the next
  // control plane takes the root at once.
  void Stop(bool release);

 private:
  RootFence(storage::Env* env, RootFenceOptions options, int64_t epoch);
  void RenewLoop();
  // unavailable naming the newer epoch's holder when one exists.
  Status CheckNewer();

  storage::Env* const env_;
  const RootFenceOptions options_;
  Clock* const clock_;
  const int64_t epoch_;
  const int64_t since_ms_;
  std::function<Status()> leader_check_;
  std::function<void(const Status&)> on_deposed_;
  std::atomic<int64_t> renewed_mono_ms_;  // when the last successful renewal began (clock_)
  std::atomic<bool> deposed_{false};
  std::atomic<bool> stopping_{false};
  int64_t renewals_ = 0;  // the renewing thread's
  Mutex mu_;
  CondVar cv_;
  std::thread renewer_;
};

}  // namespace tessera::service
