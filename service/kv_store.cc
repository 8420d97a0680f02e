#include "service/kv_store.h"

#include <chrono>
#include <cstdio>

#include "api/base64.h"
#include "service/records.h"

namespace tessera::service {

Status KvStore::Load() {
  ASSIGN_OR_RETURN(auto docs, catalog_->All("kv"));
  MutexLock lock(mu_);
  for (const auto& doc : docs) {
    if (!doc.is_object() || !doc.contains("key") || !doc["key"].is_string()) continue;
    const std::string key = doc["key"];
    if (key.rfind(kInternalKvPrefix, 0) == 0) continue;
    auto value = Base64Decode(doc.value("value_b64", ""), "catalog kv value of " + key);
    if (!value.ok()) {
      // One bad record must not keep tesserad from starting; the key reads as absent.
      std::fprintf(stderr, "catalog: %s\n", value.status().ToString().c_str());
      continue;
    }
    values_[key] = std::move(*value);
  }
  return Status::Ok();
}

Status KvStore::Put(const std::string& key, std::string value) {
  if (value.size() > kMaxKvValueBytes) {
    Status st(Code::kPayloadTooLarge,
              "value of KV key " + key + " is " + std::to_string(value.size()) +
                  " bytes; the limit is " + std::to_string(kMaxKvValueBytes),
              {{"key", key}, {"bytes", value.size()}, {"limit", kMaxKvValueBytes}});
    CountOp("put", st);
    return st;
  }
  WriteTurns::Turn turn = turns_.Take();  // the catalog and the map change in one order
  Status st = catalog_->Put(
      "kv", key, {{"key", key}, {"value_b64", Base64Encode(value)}, {"updated_at", WallMs()}});
  if (st.ok()) {
    {
      MutexLock lock(mu_);
      values_[key] = std::move(value);
    }
    cv_.NotifyAll();
  }
  CountOp("put", st);
  return st.ok() ? st : st.WithContext("storing KV key " + key).WithDetail("key", key);
}

Result<std::string> KvStore::Get(const std::string& key, int64_t wait_ms) {
  MutexLock lock(mu_);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(std::max<int64_t>(0, wait_ms));
  ++waiting_;
  while (!stopping_ && !values_.count(key)) {
    if (!cv_.WaitUntil(mu_, deadline)) break;
  }
  --waiting_;
  auto it = values_.find(key);
  if (it != values_.end()) {
    std::string value = it->second;
    lock.unlock();
    CountOp("get", Status::Ok());
    return value;
  }
  Status st = stopping_ ? Unavailable("tesserad is shutting down", {{"key", key}})
                        : NotFound("no KV key " + key, {{"key", key}});
  lock.unlock();
  CountOp("get", st);
  return st;
}

std::vector<std::string> KvStore::Keys(const std::string& prefix) {
  std::vector<std::string> out;
  {
    MutexLock lock(mu_);
    for (auto it = values_.lower_bound(prefix); it != values_.end(); ++it) {
      if (it->first.compare(0, prefix.size(), prefix) != 0) break;
      out.push_back(it->first);
    }
  }
  CountOp("list", Status::Ok());
  return out;
}

Status KvStore::Delete(const std::string& key) {
  WriteTurns::Turn turn = turns_.Take();
  bool present = false;
  {
    MutexLock lock(mu_);
    present = values_.count(key) > 0;
  }
  Status st = present ? catalog_->Delete("kv", key) : NotFound("no KV key " + key, {{"key", key}});
  if (st.ok()) {
    MutexLock lock(mu_);
    values_.erase(key);
  }
  CountOp("delete", st);
  return st.ok() || !present ? st : st.WithContext("deleting KV key " + key).WithDetail("key", key);
}

int64_t KvStore::waiting() {
  MutexLock lock(mu_);
  return waiting_;
}

int64_t KvStore::size() {
  MutexLock lock(mu_);
  return static_cast<int64_t>(values_.size());
}

void KvStore::Shutdown() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  cv_.NotifyAll();
}

void KvStore::CountOp(const char* op, const Status& outcome) {
  if (metrics_) {
    metrics_->Count("tessera_kv_ops_total", "op=\"" + std::string(op) + "\"," + OutcomeLabel(outcome));
  }
}

}  // namespace tessera::service
