#include "service/etcd_client.h"

#include <cstdlib>

#include "api/base64.h"

namespace tessera::service {
namespace {

// etcd's gateway writes 64-bit numbers as strings.
int64_t Int(const Json& j, const char* key) {
  if (!j.is_object() || !j.contains(key)) return 0;
  const Json& v = j[key];
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_string()) return std::strtoll(v.get<std::string>().c_str(), nullptr, 10);
  return 0;
}

Result<EtcdKey> KeyOf(const Json& kv) {
  EtcdKey k;
  ASSIGN_OR_RETURN(k.value, Base64Decode(kv.value("value", ""), "an etcd value"));
  k.lease = Int(kv, "lease");
  k.create_revision = Int(kv, "create_revision");
  return k;
}

}  // namespace

EtcdClient::EtcdClient(std::vector<std::string> urls, std::string prefix, int timeout_s)
    : urls_(std::move(urls)), prefix_(std::move(prefix)), timeout_s_(timeout_s) {}

Result<std::unique_ptr<EtcdClient>> EtcdClient::Open(const std::string& spec, int timeout_s) {
  const std::string scheme = "etcd://";
  auto bad = [&](const std::string& why) {
    return InvalidArgument("--ha " + spec + ": " + why + " (expected etcd://HOST:PORT[,HOST:PORT...][/PREFIX])",
                           {{"field", "ha"}});
  };
  if (spec.rfind(scheme, 0) != 0) return bad("not an etcd:// address");
  std::string rest = spec.substr(scheme.size());
  std::string prefix = "/tessera";
  if (size_t slash = rest.find('/'); slash != std::string::npos) {
    prefix = rest.substr(slash);
    rest = rest.substr(0, slash);
    while (prefix.size() > 1 && prefix.back() == '/') prefix.pop_back();
  }
  std::vector<std::string> urls;
  size_t start = 0;
  while (start <= rest.size()) {
    size_t comma = rest.find(',', start);
    if (comma == std::string::npos) comma = rest.size();
    const std::string hostport = rest.substr(start, comma - start);
    const size_t colon = hostport.rfind(':');
    if (hostport.empty() || colon == std::string::npos || colon == 0 || colon + 1 == hostport.size() ||
        hostport.find_first_not_of("0123456789", colon + 1) != std::string::npos) {
      return bad("\"" + hostport + "\" is not HOST:PORT");
    }
    urls.push_back("http://" + hostport);
    start = comma + 1;
  }
  return std::unique_ptr<EtcdClient>(new EtcdClient(std::move(urls), std::move(prefix), timeout_s));
}

std::string EtcdClient::endpoints() const {
  std::string out;
  for (const auto& u : urls_) out += (out.empty() ? "" : ",") + u;
  return out;
}

Result<Json> EtcdClient::Post(const std::string& path, const Json& body) {
  Status last;
  for (size_t tried = 0; tried < urls_.size(); ++tried) {
    if (!client_) client_ = std::make_unique<http::Client>(urls_[current_], "", timeout_s_);
    auto r = client_->Send("POST", path, body.dump());
    if (r.ok() && r->status == 200) {
      Json j = Json::parse(r->body, nullptr, false);
      if (j.is_object()) return j;
      return Internal("etcd at " + urls_[current_] + " answered " + path + " with something not JSON",
                      {{"endpoint", urls_[current_]}});
    }
    if (r.ok()) {
      // etcd's own error ({"error", "code", "message"}): the request reached it.
      Json j = Json::parse(r->body, nullptr, false);
      const std::string msg = j.is_object() ? j.value("message", r->body) : r->body;
      return Unavailable("etcd at " + urls_[current_] + " refused " + path + ": " + msg,
                         {{"endpoint", urls_[current_]}, {"http_status", r->status}});
    }
    last = r.status();
    client_.reset();
    current_ = (current_ + 1) % urls_.size();
  }
  return Unavailable("etcd is unreachable at " + endpoints() + ": " + last.message(),
                     {{"endpoint", endpoints()}});
}

Result<int64_t> EtcdClient::Grant(int64_t ttl_s) {
  ASSIGN_OR_RETURN(Json r, Post("/v3/lease/grant", {{"TTL", std::to_string(ttl_s)}}));
  const int64_t id = Int(r, "ID");
  if (id == 0) return Unavailable("etcd granted no lease: " + r.dump(), {{"endpoint", endpoints()}});
  return id;
}

Result<int64_t> EtcdClient::KeepAlive(int64_t lease) {
  ASSIGN_OR_RETURN(Json r, Post("/v3/lease/keepalive", {{"ID", std::to_string(lease)}}));
  return Int(r.value("result", Json::object()), "TTL");
}

Status EtcdClient::Revoke(int64_t lease) {
  return Post("/v3/lease/revoke", {{"ID", std::to_string(lease)}}).status();
}

Result<std::pair<bool, EtcdKey>> EtcdClient::CreateIfAbsent(const std::string& key,
                                                            const std::string& value, int64_t lease) {
  const std::string k = Base64Encode(key);
  Json txn = {
      {"compare", Json::array({{{"key", k}, {"target", "CREATE"}, {"create_revision", "0"}}})},
      {"success", Json::array({{{"request_put", {{"key", k}, {"value", Base64Encode(value)},
                                                  {"lease", std::to_string(lease)}}}}})},
      {"failure", Json::array({{{"request_range", {{"key", k}}}}})}};
  ASSIGN_OR_RETURN(Json r, Post("/v3/kv/txn", txn));
  if (r.value("succeeded", false)) {
    ASSIGN_OR_RETURN(auto mine, Get(key));
    if (mine) return std::make_pair(true, *mine);
    return Unavailable("etcd lost key " + key + " right after creating it", {{"endpoint", endpoints()}});
  }
  for (const Json& resp : r.value("responses", Json::array())) {
    const Json range = resp.value("response_range", Json::object());
    for (const Json& kv : range.value("kvs", Json::array())) {
      ASSIGN_OR_RETURN(EtcdKey there, KeyOf(kv));
      return std::make_pair(false, there);
    }
  }
  // Gone between the compare and the range: nobody holds it; the caller tries again.
  return std::make_pair(false, EtcdKey{});
}

Result<std::optional<EtcdKey>> EtcdClient::Get(const std::string& key) {
  ASSIGN_OR_RETURN(Json r, Post("/v3/kv/range", {{"key", Base64Encode(key)}}));
  for (const Json& kv : r.value("kvs", Json::array())) {
    ASSIGN_OR_RETURN(EtcdKey k, KeyOf(kv));
    return std::optional<EtcdKey>(std::move(k));
  }
  return std::optional<EtcdKey>();
}

Status EtcdClient::DeleteIfCreated(const std::string& key, int64_t create_revision) {
  const std::string k = Base64Encode(key);
  Json txn = {{"compare", Json::array({{{"key", k}, {"target", "CREATE"},
                                        {"create_revision", std::to_string(create_revision)}}})},
              {"success", Json::array({{{"request_delete_range", {{"key", k}}}}})}};
  return Post("/v3/kv/txn", txn).status();
}

}  // namespace tessera::service
