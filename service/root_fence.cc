#include "service/root_fence.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "api/clock.h"

namespace tessera::service {
namespace {

std::string ReadFirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// One machine's processes see one pid space: same boot, same pid namespace.
std::string MachineId() {
  struct stat st {};
  const std::string ns = ::stat("/proc/self/ns/pid", &st) == 0 ? std::to_string(st.st_ino) : "?";
  return ReadFirstLine("/proc/sys/kernel/random/boot_id") + "/" + ns;
}

// The start time of process `pid` in clock ticks since boot (/proc/<pid>/stat field
// 22), "" when there is no such process.
std::string StartTicks(int64_t pid) {
  const std::string stat = ReadFirstLine("/proc/" + std::to_string(pid) + "/stat");
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return "";
  std::istringstream fields(stat.substr(paren + 2));
  std::string field;
  for (int i = 3; i <= 22 && fields >> field; ++i) {
    if (i == 22) return field;
  }
  return "";
}

std::string HostName() {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  return name;
}

std::string Describe(const storage::EpochDoc& e) {
  const Json h = e.doc.value("holder", Json::object());
  std::string out = h.value("url", "?");
  out += " (pid " + std::to_string(h.value("pid", int64_t{0})) + " on " + h.value("host", "?");
  out += ", epoch " + std::to_string(e.epoch) + ")";
  return out;
}

}  // namespace

Json ThisProcess(const std::string& url) {
  const int64_t pid = ::getpid();
  return {{"url", url}, {"host", HostName()}, {"pid", pid}, {"machine", MachineId()},
          {"start_ticks", StartTicks(pid)}};
}

Holder HolderState(const Json& holder) {
  if (!holder.is_object() || holder.value("machine", "") != MachineId()) return Holder::kElsewhere;
  const int64_t pid = holder.value("pid", int64_t{0});
  if (pid <= 0) return Holder::kElsewhere;
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return Holder::kGone;
  const std::string ticks = StartTicks(pid);
  if (ticks.empty()) return Holder::kGone;
  return ticks == holder.value("start_ticks", "") ? Holder::kRunningHere : Holder::kGone;  // reused pid
}

RootFence::RootFence(storage::Env* env, RootFenceOptions options, int64_t epoch)
    : env_(env), options_(std::move(options)), clock_(options_.clock), epoch_(epoch),
      since_ms_(clock_->WallMs()), renewed_mono_ms_(clock_->MonoMs()) {}

RootFence::~RootFence() { Stop(false); }

Result<std::unique_ptr<RootFence>> RootFence::Acquire(
    storage::Env* env, RootFenceOptions options, const std::function<void(const std::string&)>& log) {
  const std::string root = options.root;  // options moves into the fence below
  ASSIGN_OR_RETURN(std::optional<storage::EpochDoc> newest, storage::ReadNewestEpoch(env, root));
  const int64_t next = newest ? newest->epoch + 1 : 1;
  if (newest) {
    const Json holder = newest->doc.value("holder", Json::object());
    ASSIGN_OR_RETURN(std::string lease, storage::ReadLease(env, root, newest->epoch));
    const Json lease_doc = Json::parse(lease, nullptr, false);
    const bool released = lease_doc.is_object() && lease_doc.value("released", false);
    const std::string their_ha = newest->doc.value("ha", "");
    const bool same_group = !options.ha.empty() && their_ha == options.ha;
    const Holder state = HolderState(holder);
    auto held = [&] {
      std::string how = their_ha.empty() ? "" : " (it runs with --ha " + their_ha + ")";
      return Conflict("checkpoint root " + root + " is held by the tesserad at " + Describe(*newest) + how +
                          ", which is alive: stop it first, or run both with the same --ha etcd://...",
                      {{"holder", newest->holder_url()}, {"epoch", newest->epoch}, {"root", root}});
    };
    if (!released && !same_group && state == Holder::kRunningHere) return held();
    if (!released && !same_group && state == Holder::kElsewhere) {
      const Json& renewed_every = lease_doc.is_object() ? lease_doc["ttl_ms"] : Json();
      const int64_t their_lease = renewed_every.is_number_integer() ? renewed_every.get<int64_t>()
                                                                    : options.lease_ms;
      const int64_t watch_ms = their_lease + their_lease / 3;
      log("checkpoint root " + root + " is held by " + Describe(*newest) +
          "; watching its lease for " + std::to_string(watch_ms) + " ms");
      Clock* clock = options.clock;
      const int64_t deadline = clock->MonoMs() + watch_ms;
      while (clock->MonoMs() < deadline) {
        ASSIGN_OR_RETURN(std::string now, storage::ReadLease(env, root, newest->epoch));
        ASSIGN_OR_RETURN(bool newer, storage::EpochTaken(env, root, next));
        if (now != lease || newer) return held();
        clock->SleepFor(50);  // a lease renews every third of its length: poll well within that
      }
      log("the lease of " + Describe(*newest) + " was not renewed: taking the root over");
    }
  }
  Json doc = {{"format", "tessera-root/" + std::to_string(storage::kRootFormatVersion)},
              {"epoch", next},
              {"holder", ThisProcess(options.url)},
              {"ha", options.ha},
              {"root", root},
              {"created_ms", options.clock->WallMs()}};
  RETURN_IF_ERROR(storage::CreateEpoch(env, root, next, doc));
  std::unique_ptr<RootFence> fence(new RootFence(env, std::move(options), next));
  RETURN_IF_ERROR(storage::WriteLease(env, root, next,
                                      {{"epoch", next}, {"renewals", 0}, {"ttl_ms", fence->options_.lease_ms}}));
  return fence;
}

Status RootFence::CheckNewer() {
  ASSIGN_OR_RETURN(bool newer, storage::EpochTaken(env_, options_.root, epoch_ + 1));
  if (!newer) return Status::Ok();
  deposed_ = true;
  std::string holder = "another tesserad";
  if (auto e = storage::ReadNewestEpoch(env_, options_.root); e.ok() && *e) holder = Describe(**e);
  return Unavailable("this tesserad (epoch " + std::to_string(epoch_) + ") was deposed: checkpoint root " +
                         options_.root + " is now held by " + holder,
                     {{"reason", "deposed"}, {"epoch", epoch_}, {"root", options_.root}});
}

Status RootFence::Check(const std::string& what) {
  auto refuse = [&](const Status& why) { return why.WithContext("refusing to " + what); };
  if (deposed_) return refuse(CheckNewer());
  const int64_t age = clock_->MonoMs() - renewed_mono_ms_.load();
  if (age > options_.lease_ms * 3 / 4) {
    return refuse(Unavailable("the lease on checkpoint root " + options_.root + " (epoch " +
                                  std::to_string(epoch_) + ") was last renewed " + std::to_string(age) +
                                  " ms ago; another tesserad may hold it now",
                              {{"reason", "lease_expired"}, {"epoch", epoch_}}));
  }
  if (leader_check_) {
    if (Status st = leader_check_(); !st.ok()) return refuse(st);
  }
  if (Status st = CheckNewer(); !st.ok()) return refuse(st);
  return Status::Ok();
}

void RootFence::Start(std::function<void(const Status&)> on_deposed) {
  on_deposed_ = std::move(on_deposed);
  renewer_ = std::thread([this] { RenewLoop(); });
}

void RootFence::RenewLoop() {
  MutexLock lock(mu_);
  while (!stopping_) {
    const int64_t due = clock_->MonoMs() + options_.lease_ms / 3;
    while (!stopping_ && clock_->WaitUntil(cv_, mu_, due)) {
    }
    if (stopping_) return;
    lock.unlock();
    const int64_t began = clock_->MonoMs();
    Status st = CheckNewer();
    if (!st.ok() && deposed_) {
      if (on_deposed_) on_deposed_(st);
      return;
    }
    if (st.ok()) {
      st = storage::WriteLease(env_, options_.root, epoch_,
                               {{"epoch", epoch_}, {"renewals", ++renewals_}, {"ttl_ms", options_.lease_ms}});
    }
    if (st.ok()) {
      renewed_mono_ms_ = began;
    } else {
      std::fprintf(stderr, "renewing the lease on %s: %s\n", options_.root.c_str(), st.ToString().c_str());
    }
    lock.lock();
  }
}

void RootFence::Stop(bool release) {
  {
    MutexLock lock(mu_);
    stopping_ = true;
    cv_.NotifyAll();
  }
  if (renewer_.joinable()) renewer_.join();
  if (release && !deposed_ && CheckNewer().ok()) {
    Status st = storage::WriteLease(env_, options_.root, epoch_,
                                    {{"epoch", epoch_}, {"released", true}, {"ttl_ms", options_.lease_ms}});
    if (!st.ok()) std::fprintf(stderr, "releasing %s: %s\n", options_.root.c_str(), st.ToString().c_str());
  }
}

}  // namespace tessera::service
