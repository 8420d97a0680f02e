// What the workers asked of tesserad, from its /metrics: the requests a save costs,
// counted on the server, per route. The heartbeats (liveness, not the save) and the
// benchmark's own calls (it starts the saves and waits on their jobs) are left out.
#pragma once

#include <map>
#include <sstream>
#include <string>

#include "tools/local_cluster.h"

namespace tessera::bench {

// "METHOD route" → requests answered so far.
inline std::map<std::string, double> WorkerRequests(const tools::LocalCluster& c) {
  std::map<std::string, double> out;
  auto r = c.Client(30).Send("GET", "/metrics");
  if (!r.ok()) return out;
  std::istringstream in(r->body);
  const std::string prefix = "tessera_http_requests_total{route=\"";
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(prefix, 0) != 0) continue;
    const size_t end = line.find('"', prefix.size());
    const std::string route = line.substr(prefix.size(), end - prefix.size());
    const size_t m = line.find("method=\"");
    if (m == std::string::npos || end == std::string::npos) continue;
    const std::string method = line.substr(m + 8, line.find('"', m + 8) - m - 8);
    if (route.find("heartbeat") != std::string::npos || route == "/metrics") continue;
    if (route.rfind("/api/v1/jobs", 0) == 0) continue;                    // the bench waits
    if (method == "POST" && route.size() >= 12 &&
        route.compare(route.size() - 12, 12, "/checkpoints") == 0) continue;  // the bench saves
    out[method + " " + route] += std::stod(line.substr(line.rfind(' ') + 1));
  }
  return out;
}

// The requests between two WorkerRequests, per route and in all.
inline std::map<std::string, double> RequestsSince(const std::map<std::string, double>& before,
                                                   const std::map<std::string, double>& after,
                                                   double* total) {
  std::map<std::string, double> out;
  *total = 0;
  for (const auto& [route, n] : after) {
    auto b = before.find(route);
    const double d = n - (b == before.end() ? 0 : b->second);
    if (d <= 0) continue;
    out[route] = d;
    *total += d;
  }
  return out;
}

}  // namespace tessera::bench
