// Which of several tesserads leads (--ha etcd://...): the one that created the key
// <prefix>/leader in etcd under a lease it keeps alive; the others are standbys that
// read the key every quarter of a lease and campaign once it is gone (its holder died,
// stopped, or was cut off for one lease). The key's value says who leads: {"url", "root", "since_ms", "pid",
// "host"}, which is how a standby names the leader to clients. See docs/ha.md.
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
#include "service/etcd_client.h"

namespace tessera::service {

struct LeadershipOptions {
  std::string ha;        // etcd://HOST:PORT[,...][/PREFIX]
  std::string root;      // its checkpoint root: every tesserad of a group must share it
  int64_t lease_s = 5;
  Clock* clock = RealClock();  // the lease's renewals, its age in Check, the campaign's polls
};

class Leadership {
 public:
  // Parses --ha and checks that etcd answers (unavailable naming its endpoints if not).
  static Result<std::unique_ptr<Leadership>> Open(LeadershipOptions options);
  ~Leadership();

  // Campaigns as `url` (this tesserad's advertised URL). Blocks until this tesserad leads (ok), `stop` becomes true (unavailable), or the
  // group turns out misconfigured (invalid_argument: the leader's root differs).
  // While it waits, leader() names the current leader.
  Status Campaign(const std::string& url, const std::atomic<bool>& stop);
  // The leader as last seen: {"url", "root", "since_ms", ...}, null when none is known.
  Json leader() const;
  bool leading() const { return leading_; }
  // Ok while this tesserad leads and renewed its etcd lease within 3/4 of it.
  Status Check() const;
  // Keeps the lease alive; `on_lost` is called once when it is gone (expired, or etcd
  // unreachable for a whole lease).
  void Start(std::function<void(const Status&)> on_lost);
  // Wakes a Campaign so that it sees its `stop`.
  void Interrupt();
  // A clean stop: the key goes and the lease is revoked, so a standby takes over at once.
  void Resign();
  const LeadershipOptions& options() const { return options_; }
  std::string key() const { return etcd_->prefix() + "/leader"; }

 private:
  explicit Leadership(LeadershipOptions options, std::unique_ptr<EtcdClient> etcd);
  void KeepAliveLoop();
  // One round of Campaign: true once this tesserad leads, false while another one does.
  Result<bool> CampaignOnce(Json* me, bool* said_standby);
  void SetLeader(Json leader);
  // invalid_argument when `leader` serves another root than this tesserad.
  Status SameRoot(const Json& leader) const;

  const LeadershipOptions options_;
  std::unique_ptr<EtcdClient> etcd_;  // the campaigning, then the keep-alive thread's
  int64_t lease_ = 0;
  int64_t created_revision_ = 0;
  std::atomic<bool> leading_{false};
  std::atomic<int64_t> renewed_mono_ms_{0};
  std::atomic<bool> stopping_{false};
  std::function<void(const Status&)> on_lost_;
  mutable Mutex mu_;
  CondVar cv_;
  Json leader_ GUARDED_BY(mu_);
  std::thread keeper_;
};

}  // namespace tessera::service
