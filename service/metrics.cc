#include "service/metrics.h"

#include <algorithm>
#include <sstream>

namespace tessera::service {
namespace {

std::string Escape(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

// Counters kept through Count(), with their help lines.
const std::map<std::string, std::string> kCounterHelp = {
    {"tessera_barrier_waits_total", "Barrier arrivals by outcome."},
    {"tessera_kv_ops_total", "KV store operations by op and outcome."},
    {"tessera_preemption_syncs_total", "Preemption sync-point calls by outcome."},
    {"tessera_catalog_write_failures_total", "Catalog writes that failed, by table."},
    {"tessera_memory_checkpoint_reports_total",
     "Reports of meshes' memory tiers by outcome (ok, ignored: older than the one held, or the "
     "error's code)."},
    {"tessera_http_connections_dropped_total",
     "HTTP connections the server closed unserved: header not in time (408), over a "
     "connection cap, header too large (431), failed TLS handshake."},
};

// Gauges that Render is given, with their help lines.
const std::map<std::string, std::string> kGaugeHelp = {
    {"tessera_barriers_open", "Barriers with ranks waiting."},
    {"tessera_preemption_notices", "Meshes with a pending preemption notice."},
    {"tessera_kv_keys", "Keys in the coordination KV store."},
    {"tessera_kv_waiting_gets", "KV reads waiting for their key to appear."},
    {"tessera_workers", "Registered workers by liveness state."},
    {"tessera_jobs", "Jobs by state and kind."},
    {"tessera_checkpoints_committed", "Committed checkpoints."},
    {"tessera_checkpoint_stored_bytes", "Bytes of committed checkpoints in storage."},
    {"tessera_meshes", "Registered meshes."},
    {"tessera_task_polls_waiting", "Workers' task long-polls waiting for a task."},
    {"tessera_http_connections_waiting", "HTTP connections waiting for a whole request."},
    {"tessera_leader", "1 while this tesserad leads, 0 while it stands by."},
    {"tessera_leader_since_seconds", "When this tesserad began to lead (Unix time)."},
    {"tessera_root_epoch", "The checkpoint root's epoch this tesserad holds."},
};

}  // namespace

std::string OutcomeLabel(const Status& status) {
  return "outcome=\"" + std::string(status.ok() ? "ok" : CodeName(status.code())) + "\"";
}

void Metrics::CountRequest(const std::string& route, const std::string& method, int status) {
  MutexLock lock(mu_);
  requests_[route + "|" + method + "|" + std::to_string(status)]++;
}

void Metrics::Observe(Summary* s, double v) {
  s->count++;
  s->sum += v;
  s->recent.push_back(v);
  if (s->recent.size() > 1000) s->recent.erase(s->recent.begin());
}

void Metrics::ObserveSave(double seconds, uint64_t bytes) {
  MutexLock lock(mu_);
  Observe(&save_seconds_, seconds);
  saved_bytes_ += bytes;
}

void Metrics::ObserveRestore(double seconds, uint64_t bytes) {
  MutexLock lock(mu_);
  Observe(&restore_seconds_, seconds);
  restored_bytes_ += bytes;
}

void Metrics::Count(const std::string& name, const std::string& labels) {
  MutexLock lock(mu_);
  counters_[name][labels]++;
}

std::string Metrics::Render(
    const std::map<std::string, std::map<std::string, double>>& gauges,
    const std::map<std::string, std::map<std::string, double>>& counters) const {
  MutexLock lock(mu_);
  std::ostringstream out;
  out << "# HELP tessera_http_requests_total HTTP requests by route, method and status code.\n"
      << "# TYPE tessera_http_requests_total counter\n";
  for (const auto& [key, n] : requests_) {
    size_t a = key.find('|'), b = key.rfind('|');
    out << "tessera_http_requests_total{route=\"" << Escape(key.substr(0, a)) << "\",method=\""
        << key.substr(a + 1, b - a - 1) << "\",code=\"" << key.substr(b + 1) << "\"} " << n << "\n";
  }
  out << "# HELP tessera_saved_bytes_total Logical bytes of committed checkpoints.\n"
      << "# TYPE tessera_saved_bytes_total counter\ntessera_saved_bytes_total " << saved_bytes_
      << "\n# HELP tessera_restored_bytes_total Bytes restored onto workers.\n"
      << "# TYPE tessera_restored_bytes_total counter\ntessera_restored_bytes_total "
      << restored_bytes_ << "\n";
  auto summary = [&out](const char* name, const char* help, const Summary& s) {
    out << "# HELP " << name << " " << help << "\n# TYPE " << name << " summary\n";
    std::vector<double> v = s.recent;
    std::sort(v.begin(), v.end());
    for (double q : {0.5, 0.9, 0.99}) {
      out << name << "{quantile=\"" << q << "\"} ";
      // No observations: no quantile either (NaN, as Prometheus' own clients write it).
      if (v.empty()) {
        out << "NaN\n";
      } else {
        out << v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))] << "\n";
      }
    }
    out << name << "_sum " << s.sum << "\n" << name << "_count " << s.count << "\n";
  };
  // One metric family: HELP, TYPE and a line per label set.
  auto family = [&out](const std::string& name, const std::map<std::string, std::string>& helps,
                       const char* type, const auto& series) {
    auto help = helps.find(name);
    out << "# HELP " << name << " " << (help != helps.end() ? help->second : std::string(type))
        << "\n# TYPE " << name << " " << type << "\n";
    for (const auto& [labels, n] : series) {
      out << name << (labels.empty() ? "" : "{" + labels + "}") << " " << n << "\n";
    }
  };
  for (const auto& [name, series] : counters_) family(name, kCounterHelp, "counter", series);
  for (const auto& [name, series] : counters) family(name, kCounterHelp, "counter", series);
  summary("tessera_save_duration_seconds", "Duration of successful saves.", save_seconds_);
  summary("tessera_restore_duration_seconds", "Duration of successful restores.", restore_seconds_);
  for (const auto& [name, series] : gauges) family(name, kGaugeHelp, "gauge", series);
  return out.str();
}

}  // namespace tessera::service
