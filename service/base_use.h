// What each worker's incremental saves may still build on (docs/semantics.md, S9): the
// report every long-poll of an agent carries (worker/save_bases.h), per mesh the worker's
// base, the saves whose end it took in last, and each of its saves in flight with its
// base. Retention
// prunes only steps below every worker's floor, so that a save whose snapshot came before
// its worker heard of a newer commit does not fail for a base that retention took: the
// pending outputs of LevelDB's obsolete files, counted from the writers' own word.
//
// One lock, for the reports alone; a waiter waits on it with the service's clock.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "api/clock.h"
#include "api/json_codec.h"
#include "api/status.h"
#include "api/thread_annotations.h"

namespace tessera::service {

struct BaseReport {
  struct Mesh {
    int64_t base = -1;                               // -1: none
    std::vector<int64_t> ended;                      // the newest ends it took in
    std::vector<std::pair<int64_t, int64_t>> saves;  // (step, base step) in flight
  };
  std::map<std::string, Mesh> meshes;
};
// The `bases` of a long-poll's query: invalid_argument naming the field by its path.
Result<BaseReport> BaseReportFromJson(const Json& j);

class BaseUse {
 public:
  explicit BaseUse(Clock* clock) : clock_(clock) {}

  // Replaces what `worker` said before.
  void Put(const std::string& worker, BaseReport report) EXCLUDES(mu_);
  void Forget(const std::string& worker) EXCLUDES(mu_);
  // Until every one of `workers` that reports has taken in the end of the save of `step`
  // of `mesh` (so its report is as new), or `timeout_ms` passed: false then. Workers that
  // never reported (a client that runs no saves) are not waited for.
  bool WaitHeard(const std::vector<std::string>& workers, const std::string& mesh, int64_t step,
                 int64_t timeout_ms) EXCLUDES(mu_);
  // The lowest step of `mesh` one of `workers` may still build on: each one's base, and
  // the base of each of its saves that `open(step)` says may still commit.
  // nullopt: none of them builds on anything.
  std::optional<int64_t> Floor(const std::vector<std::string>& workers, const std::string& mesh,
                               const std::function<bool(int64_t step)>& open) EXCLUDES(mu_);

 private:
  Clock* const clock_;
  Mutex mu_;
  CondVar cv_;
  std::map<std::string, BaseReport> workers_ GUARDED_BY(mu_);
};

}  // namespace tessera::service
