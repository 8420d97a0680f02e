// Several tesserads of which one leads (docs/ha.md), as clients are given them:
// "--server URL1,URL2" or TESSERA_SERVER=URL1,URL2. Calls go to the server that
// answered last; after a failure they move to the leader a standby names (its 503
// carries details {"reason": "not_leader", "leader"}), or else to the next server of
// the list when the one tried could not be reached. Thread-safe.
#pragma once

#include <string>
#include <vector>

#include "api/status.h"
#include "api/thread_annotations.h"

namespace tessera::http {

class ServerList {
 public:
  // Splits "URL1,URL2,..." (blanks around commas ignored); invalid_argument naming
  // `what` (the flag) when no URL is given.
  static Result<ServerList> Parse(const std::string& spec, const std::string& what);
  explicit ServerList(std::vector<std::string> urls);
  ServerList(const ServerList& other);

  std::string Current() const;
  // "URL1,URL2" for messages.
  std::string Describe() const;
  size_t size() const;
  // After a call to `url` failed with `st`: true when another server should be tried,
  // Current() having moved to it (the leader named, else the next one of the list).
  // A request that may have reached a server that then died (`st`'s details say
  // "sent") moves on too, but the caller decides whether it may be sent again.
  bool FailOver(const std::string& url, const Status& st);

 private:
  mutable Mutex mu_;
  std::vector<std::string> urls_ GUARDED_BY(mu_);
  size_t current_ GUARDED_BY(mu_) = 0;
};

// Whether `st` is a standby's answer, and the leader it names ("" when none is known).
bool IsNotLeader(const Status& st);
std::string LeaderNamed(const Status& st);
// Whether `st` says that no server answered (a connect that failed, a connection lost).
bool IsUnreachable(const Status& st);

}  // namespace tessera::http
