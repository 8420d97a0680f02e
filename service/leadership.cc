#include "service/leadership.h"

#include <unistd.h>

#include <cstdio>

#include "api/clock.h"

namespace tessera::service {

Leadership::Leadership(LeadershipOptions options, std::unique_ptr<EtcdClient> etcd)
    : options_(std::move(options)), etcd_(std::move(etcd)) {}

Leadership::~Leadership() {
  stopping_ = true;
  {
    MutexLock lock(mu_);
    cv_.NotifyAll();
  }
  if (keeper_.joinable()) keeper_.join();
}

Result<std::unique_ptr<Leadership>> Leadership::Open(LeadershipOptions options) {
  if (options.lease_s < 2) {
    return InvalidArgument("--ha-lease-s must be at least 2 (etcd's smallest lease)", {{"field", "ha-lease-s"}});
  }
  ASSIGN_OR_RETURN(auto etcd, EtcdClient::Open(options.ha));
  std::unique_ptr<Leadership> l(new Leadership(std::move(options), std::move(etcd)));
  // One read of the key: etcd answers, and a misconfigured group shows at once.
  ASSIGN_OR_RETURN(auto there, l->etcd_->Get(l->key()));
  if (there) {
    Json leader = Json::parse(there->value, nullptr, false);
    if (leader.is_object()) {
      RETURN_IF_ERROR(l->SameRoot(leader));
      l->SetLeader(std::move(leader));
    }
  }
  return l;
}

Status Leadership::SameRoot(const Json& leader) const {
  const std::string their_root = leader.value("root", "");
  if (their_root.empty() || their_root == options_.root) return Status::Ok();
  return InvalidArgument("the leader " + leader.value("url", "?") + " of " + key() + " in etcd " +
                             etcd_->endpoints() + " serves checkpoint root " + their_root +
                             ", this tesserad " + options_.root +
                             ": every tesserad of a group must share one root",
                         {{"field", "checkpoint-root"}, {"leader", leader.value("url", "")}});
}

void Leadership::SetLeader(Json leader) {
  MutexLock lock(mu_);
  leader_ = std::move(leader);
}

Json Leadership::leader() const {
  MutexLock lock(mu_);
  return leader_;
}

Result<bool> Leadership::CampaignOnce(Json* me, bool* said_standby) {
  ASSIGN_OR_RETURN(auto there, etcd_->Get(key()));
  if (!there) {
    auto left = lease_ == 0 ? Result<int64_t>(int64_t{0}) : etcd_->KeepAlive(lease_);
    if (!left.ok() || *left <= 0) {
      ASSIGN_OR_RETURN(lease_, etcd_->Grant(options_.lease_s));
    }
    const int64_t began = options_.clock->MonoMs();
    (*me)["since_ms"] = options_.clock->WallMs();
    ASSIGN_OR_RETURN(auto won, etcd_->CreateIfAbsent(key(), me->dump(), lease_));
    if (won.first) {
      renewed_mono_ms_ = began;
      created_revision_ = won.second.create_revision;
      leading_ = true;
      SetLeader(*me);
      return true;
    }
    there = won.second;
  }
  Json leader = Json::parse(there->value, nullptr, false);
  if (leader.is_object()) {
    RETURN_IF_ERROR(SameRoot(leader));
    if (!*said_standby) {
      std::fprintf(stderr, "standby: %s leads (%s in etcd %s)\n", leader.value("url", "?").c_str(),
                   key().c_str(), etcd_->endpoints().c_str());
      *said_standby = true;
    }
    SetLeader(std::move(leader));
  }
  return false;
}

Status Leadership::Campaign(const std::string& url, const std::atomic<bool>& stop) {
  const int64_t poll_ms = options_.lease_s * 1000 / 4;
  Json me = {{"url", url}, {"root", options_.root}, {"pid", static_cast<int64_t>(::getpid())}};
  bool said_standby = false;
  while (!stop && !stopping_) {
    auto led = CampaignOnce(&me, &said_standby);
    if (led.ok() && *led) return Status::Ok();
    if (!led.ok()) {
      if (led.status().code() == Code::kInvalidArgument) return led.status();  // a misconfigured group
      std::fprintf(stderr, "campaign: %s\n", led.status().ToString().c_str());
      SetLeader(nullptr);
    }
    MutexLock lock(mu_);
    if (stop || stopping_) break;
    options_.clock->WaitUntil(cv_, mu_, options_.clock->MonoMs() + poll_ms);
  }
  return Unavailable("stopped before leading");
}

Status Leadership::Check() const {
  if (!leading_) return Unavailable("this tesserad no longer leads", {{"reason", "not_leader"}});
  const int64_t age = options_.clock->MonoMs() - renewed_mono_ms_.load();
  if (age > options_.lease_s * 1000 * 3 / 4) {
    return Unavailable("this tesserad's etcd lease was last renewed " + std::to_string(age) +
                           " ms ago; a standby may lead now",
                       {{"reason", "lease_expired"}});
  }
  return Status::Ok();
}

void Leadership::Start(std::function<void(const Status&)> on_lost) {
  on_lost_ = std::move(on_lost);
  keeper_ = std::thread([this] { KeepAliveLoop(); });
}

void Leadership::KeepAliveLoop() {
  const int64_t period_ms = options_.lease_s * 1000 / 3;
  MutexLock lock(mu_);
  while (!stopping_) {
    const int64_t due = options_.clock->MonoMs() + period_ms;
    while (!stopping_ && options_.clock->WaitUntil(cv_, mu_, due)) {
    }
    if (stopping_) return;
    lock.unlock();
    const int64_t began = options_.clock->MonoMs();
    auto ttl = etcd_->KeepAlive(lease_);
    Status lost;
    if (ttl.ok() && *ttl > 0) {
      renewed_mono_ms_ = began;
    } else if (ttl.ok()) {
      lost = Unavailable("this tesserad's etcd lease expired: another tesserad may lead now",
                         {{"reason", "lease_expired"}});
    } else if (began - renewed_mono_ms_.load() > options_.lease_s * 1000) {
      lost = ttl.status().WithContext("etcd unreachable for a whole lease");
    } else {
      std::fprintf(stderr, "renewing the etcd lease: %s\n", ttl.status().ToString().c_str());
    }
    if (!lost.ok()) {
      leading_ = false;
      if (on_lost_) on_lost_(lost);
      return;
    }
    lock.lock();
  }
}

void Leadership::Interrupt() {
  MutexLock lock(mu_);
  cv_.NotifyAll();
}

void Leadership::Resign() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
    cv_.NotifyAll();
  }
  if (keeper_.joinable()) keeper_.join();
  if (!leading_.exchange(false)) return;
  (void)etcd_->DeleteIfCreated(key(), created_revision_);
  (void)etcd_->Revoke(lease_);
}

}  // namespace tessera::service
