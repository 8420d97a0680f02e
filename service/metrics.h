// Prometheus metrics of tesserad. Counters and summaries are kept here; gauges
// that mirror state (jobs by state, workers by state) are computed at scrape time.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "api/status.h"
#include "api/thread_annotations.h"

namespace tessera::service {

class Metrics {
 public:
  void CountRequest(const std::string& route, const std::string& method, int status);
  void ObserveSave(double seconds, uint64_t logical_bytes);
  void ObserveRestore(double seconds, uint64_t bytes);
  // Adds one to counter `name` (declared in kCounterHelp of metrics.cc) with
  // the label set `labels`, e.g. Count("tessera_kv_ops_total", "op=\"put\"").
  void Count(const std::string& name, const std::string& labels);
  // Renders counters plus the given gauges and outside counters (kept by
  // someone else, e.g. the HTTP server): name → (label set → value).
  std::string Render(const std::map<std::string, std::map<std::string, double>>& gauges,
                     const std::map<std::string, std::map<std::string, double>>& counters = {}) const;

 private:
  struct Summary {
    uint64_t count = 0;
    double sum = 0;
    std::vector<double> recent;  // for quantiles, bounded
  };
  static void Observe(Summary* s, double v);
  mutable Mutex mu_;
  std::map<std::string, uint64_t> requests_ GUARDED_BY(mu_);  // "route|method|code"
  Summary save_seconds_ GUARDED_BY(mu_);
  Summary restore_seconds_ GUARDED_BY(mu_);
  uint64_t saved_bytes_ GUARDED_BY(mu_) = 0;
  uint64_t restored_bytes_ GUARDED_BY(mu_) = 0;
  std::map<std::string, std::map<std::string, uint64_t>> counters_ GUARDED_BY(mu_);
};

// `outcome="ok"` or `outcome="<error code>"`: the label of operations that can fail.
std::string OutcomeLabel(const Status& status);

}  // namespace tessera::service
