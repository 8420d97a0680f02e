#include "http/server_list.h"

#include <algorithm>

namespace tessera::http {
namespace {

std::string Trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

}  // namespace

Result<ServerList> ServerList::Parse(const std::string& spec, const std::string& what) {
  std::vector<std::string> urls;
  size_t start = 0;
  while (start <= spec.size()) {
    size_t comma = spec.find(',', start);
    if (comma == std::string::npos) comma = spec.size();
    std::string url = Trim(spec.substr(start, comma - start));
    while (!url.empty() && url.back() == '/') url.pop_back();
    if (!url.empty() && std::find(urls.begin(), urls.end(), url) == urls.end()) urls.push_back(url);
    start = comma + 1;
  }
  if (urls.empty()) {
    return InvalidArgument(what + " names no server (expected URL or URL1,URL2,...)", {{"field", what}});
  }
  return ServerList(std::move(urls));
}

ServerList::ServerList(std::vector<std::string> urls) : urls_(std::move(urls)) {}

ServerList::ServerList(const ServerList& other) {
  MutexLock lock(other.mu_);
  urls_ = other.urls_;
  current_ = other.current_;
}

std::string ServerList::Current() const {
  MutexLock lock(mu_);
  return urls_[current_];
}

std::string ServerList::Describe() const {
  MutexLock lock(mu_);
  std::string out;
  for (const auto& u : urls_) out += (out.empty() ? "" : ",") + u;
  return out;
}

size_t ServerList::size() const {
  MutexLock lock(mu_);
  return urls_.size();
}

bool ServerList::FailOver(const std::string& url, const Status& st) {
  MutexLock lock(mu_);
  if (urls_[current_] != url) return true;  // another caller moved on already
  if (IsNotLeader(st)) {
    const std::string leader = LeaderNamed(st);
    if (!leader.empty() && leader != url) {
      auto it = std::find(urls_.begin(), urls_.end(), leader);
      if (it == urls_.end()) it = urls_.insert(urls_.end(), leader);  // a leader not in the list
      current_ = static_cast<size_t>(it - urls_.begin());
      return true;
    }
  } else if (!IsUnreachable(st)) {
    return false;
  }
  if (urls_.size() < 2) return false;
  current_ = (current_ + 1) % urls_.size();
  return true;
}

bool IsNotLeader(const Status& st) {
  return st.code() == Code::kUnavailable && st.details().is_object() &&
         st.details().value("reason", "") == "not_leader";
}

std::string LeaderNamed(const Status& st) {
  if (!IsNotLeader(st)) return "";
  const auto& leader = st.details()["leader"];
  return leader.is_string() ? leader.get<std::string>() : "";
}

bool IsUnreachable(const Status& st) {
  return st.code() == Code::kUnavailable && st.details().is_object() && st.details().contains("sent");
}

}  // namespace tessera::http
