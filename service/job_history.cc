// Jobs as records: queries (paged, newest first), cancellation, and the history
// policy that keeps them bounded. A finished job is kept while it is one of the last
// ServiceOptions::job_history_per_mesh finished jobs of its mesh, or ended less than
// job_history_min_age_ms ago; the rest go from memory (JobRegistry::Prune) and from
// the catalog, in one transaction.
#include <algorithm>

#include "service/service.h"

namespace tessera::service {

Result<JobPage> Service::ListJobs(const std::string& state, const std::string& kind,
                                  const std::string& mesh, int64_t limit, uint64_t before) {
  return jobs_.List(state, kind, mesh, limit, before);
}

Result<Json> Service::GetJob(const std::string& id, int64_t wait_ms) {
  return jobs_.Get(id, std::clamp<int64_t>(wait_ms, 0, options_.max_wait_ms));
}

Result<Json> Service::CancelJob(const std::string& id) { return jobs_.Cancel(id); }

void Service::PruneJobHistory() {
  const std::vector<std::string> gone = jobs_.Prune(
      options_.job_history_per_mesh, clock_->WallMs() - options_.job_history_min_age_ms);
  if (gone.empty()) return;
  Status st = catalog_->DeleteMany("jobs", gone);
  if (!st.ok()) {
    // The rows stay behind; the next start of tesserad prunes them again.
    NoteCatalogFailure("jobs", st.WithContext("pruning " + std::to_string(gone.size()) +
                                              " jobs from the catalog"));
  }
}

}  // namespace tessera::service
