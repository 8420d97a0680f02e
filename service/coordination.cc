#include "service/coordination.h"

#include <algorithm>
#include <limits>

#include "api/names.h"

namespace tessera::service {
namespace {

constexpr size_t kMaxReasonLength = 1000;

}  // namespace

Coordination::Coordination(CoordinationOptions options, Catalog* catalog, EventBus* events,
                           Metrics* metrics)
    : options_(options),
      barriers_(events, metrics, options.clock != nullptr ? options.clock : RealClock()),
      kv_(catalog, metrics),
      preemption_(catalog, events, metrics) {}

Result<std::unique_ptr<Coordination>> Coordination::Open(CoordinationOptions options,
                                                         Catalog* catalog, EventBus* events,
                                                         Metrics* metrics) {
  std::unique_ptr<Coordination> c(new Coordination(options, catalog, events, metrics));
  RETURN_IF_ERROR(c->kv_.Load());
  RETURN_IF_ERROR(c->preemption_.Load());
  return c;
}

Result<int64_t> Coordination::Timeout(const Json& body) {
  ASSIGN_OR_RETURN(auto timeout, OptionalInt(body, "timeout_ms"));
  if (timeout && *timeout < 0) {
    return InvalidArgument("timeout_ms must be >= 0, got " + std::to_string(*timeout),
                           {{"field", "timeout_ms"}});
  }
  return std::min(timeout.value_or(options_.default_timeout_ms), options_.max_wait_ms);
}

// ---------------------------------------------------------------- barriers

Result<Json> Coordination::ArriveBarrier(const std::string& name, const Json& body) {
  RETURN_IF_ERROR(ValidateName(name, "barrier"));
  RETURN_IF_ERROR(RequireObject(body));
  ASSIGN_OR_RETURN(int64_t rank, RequiredInt(body, "rank"));
  ASSIGN_OR_RETURN(int64_t world, RequiredInt(body, "world"));
  ASSIGN_OR_RETURN(int64_t timeout_ms, Timeout(body));
  if (world < 1 || world > kMaxBarrierWorld) {
    return InvalidArgument("world must be 1.." + std::to_string(kMaxBarrierWorld) + ", got " +
                               std::to_string(world),
                           {{"field", "world"}, {"barrier", name}});
  }
  if (rank < 0 || rank >= world) {
    return InvalidArgument("rank must be 0.." + std::to_string(world - 1) + " for world " +
                               std::to_string(world) + ", got " + std::to_string(rank),
                           {{"field", "rank"}, {"barrier", name}});
  }
  return barriers_.Arrive(name, rank, world, timeout_ms);
}

Json Coordination::ListBarriers() { return barriers_.List(); }

// ---------------------------------------------------------------- KV

Status Coordination::PutValue(const std::string& key, std::string value) {
  RETURN_IF_ERROR(ValidateName(key, "key"));
  return kv_.Put(key, std::move(value));
}

Result<std::string> Coordination::GetValue(const std::string& key, int64_t wait_ms) {
  RETURN_IF_ERROR(ValidateName(key, "key"));
  return kv_.Get(key, std::clamp<int64_t>(wait_ms, 0, options_.max_wait_ms));
}

Json Coordination::ListKeys(const std::string& prefix) { return {{"keys", kv_.Keys(prefix)}}; }

Status Coordination::DeleteValue(const std::string& key) {
  RETURN_IF_ERROR(ValidateName(key, "key"));
  return kv_.Delete(key);
}

// ---------------------------------------------------------------- preemption

Result<Json> Coordination::NoticePreemption(const std::string& mesh, const Json& body) {
  RETURN_IF_ERROR(RequireObject(body));
  ASSIGN_OR_RETURN(auto reason, OptionalString(body, "reason"));
  if (reason && reason->size() > kMaxReasonLength) {
    return InvalidArgument("reason is longer than " + std::to_string(kMaxReasonLength) +
                               " characters",
                           {{"field", "reason"}});
  }
  return preemption_.Notice(mesh, reason.value_or(""));
}

Json Coordination::PreemptionState(const std::string& mesh) { return preemption_.State(mesh); }

Status Coordination::ClearPreemption(const std::string& mesh) { return preemption_.Clear(mesh); }

Result<Json> Coordination::SyncPreemption(const std::string& mesh,
                                          const std::vector<std::string>& workers,
                                          const Json& body) {
  RETURN_IF_ERROR(RequireObject(body));
  ASSIGN_OR_RETURN(std::string worker, RequiredString(body, "worker"));
  ASSIGN_OR_RETURN(int64_t step, RequiredInt(body, "step"));
  ASSIGN_OR_RETURN(int64_t timeout_ms, Timeout(body));
  if (step < 0 || step == std::numeric_limits<int64_t>::max()) {  // the sync step is max + 1
    return InvalidArgument("step must be 0.." + std::to_string(std::numeric_limits<int64_t>::max() - 1) +
                               ", got " + std::to_string(step),
                           {{"field", "step"}});
  }
  return preemption_.Sync(mesh, workers, worker, step, timeout_ms);
}

// ---------------------------------------------------------------- state

Json Coordination::Counts() {
  return {{"open_barriers", barriers_.open_count()},
          {"preemption_notices", preemption_.noticed_count()},
          {"kv_keys", kv_.size()},
          {"kv_waiting_gets", kv_.waiting()}};
}

void Coordination::Shutdown() {
  barriers_.Shutdown();
  kv_.Shutdown();
  preemption_.Shutdown();
}

}  // namespace tessera::service
