#include "worker/memory_layout.h"

#include <algorithm>
#include <map>
#include <set>

#include "collectives/hash.h"

namespace tessera::worker {

Result<MemoryPolicy> MemoryPolicy::FromJson(const Json& body) {
  MemoryPolicy p;
  ASSIGN_OR_RETURN(auto redundancy, OptionalString(body, "redundancy"));
  if (redundancy) {
    if (*redundancy == "replica") {
      p.mode = Mode::kReplica;
    } else if (*redundancy == "parity") {
      p.mode = Mode::kParity;
    } else {
      return InvalidArgument("redundancy must be \"replica\" or \"parity\", not \"" + *redundancy + "\"",
                             {{"field", "redundancy"}});
    }
  }
  struct Bounded {
    const char* field;
    int64_t* value;
    int64_t lo, hi;
  };
  for (const Bounded& b : {Bounded{"replicas", &p.replicas, 1, kMaxReplicas},
                           Bounded{"group", &p.group, 2, kMaxGroup},
                           Bounded{"parity", &p.parity, 1, kMaxParity},
                           Bounded{"keep", &p.keep, 1, kMaxKeep},
                           Bounded{"persist_every_steps", &p.persist_every_steps, 0, int64_t{1} << 40},
                           Bounded{"persist_every_s", &p.persist_every_s, 0, int64_t{1} << 30}}) {
    ASSIGN_OR_RETURN(auto v, OptionalInt(body, b.field));
    if (!v) continue;
    if (*v < b.lo || *v > b.hi) {
      return InvalidArgument(std::string(b.field) + " must be " + std::to_string(b.lo) + ".." +
                                 std::to_string(b.hi) + ", not " + std::to_string(*v),
                             {{"field", b.field}});
    }
    *b.value = *v;
  }
  ASSIGN_OR_RETURN(auto force, OptionalBool(body, "force"));
  p.force = force.value_or(false);
  return p;
}

Json MemoryPolicy::ToJson() const {
  return {{"redundancy", ModeName()},
          {"replicas", replicas},
          {"group", group},
          {"parity", parity},
          {"keep", keep},
          {"persist_every_steps", persist_every_steps},
          {"persist_every_s", persist_every_s},
          {"force", force}};
}

int64_t MemoryPolicy::Fingerprint() const {
  return static_cast<int64_t>(collectives::HashString(ToJson().dump()) >> 1);
}

std::vector<int> LayoutPeers(const MemoryLayout& layout, int rank) {
  std::set<int> peers;
  const auto r = static_cast<size_t>(rank);
  if (layout.mode == MemoryPolicy::Mode::kReplica) {
    if (r < layout.targets.size()) peers.insert(layout.targets[r].begin(), layout.targets[r].end());
    if (r < layout.sources.size()) peers.insert(layout.sources[r].begin(), layout.sources[r].end());
  } else if (r < layout.group_of.size()) {
    const auto& g = layout.groups.at(static_cast<size_t>(layout.group_of[r]));
    peers.insert(g.begin(), g.end());
  }
  peers.erase(rank);
  return {peers.begin(), peers.end()};
}

std::string HostOfAddress(const std::string& address) {
  const size_t at = address.find('@');
  std::string rest = at == std::string::npos ? address : address.substr(at + 1);
  const size_t colon = rest.rfind(':');
  if (colon != std::string::npos) rest.resize(colon);
  if (rest.size() >= 2 && rest.front() == '[' && rest.back() == ']') rest = rest.substr(1, rest.size() - 2);
  return rest;
}

namespace {

// The ranks host by host in turn: the first rank of each host (in order of first
// appearance), then the second, ...; neighbours in it are on different hosts.
std::vector<int> InterleavedByHost(const std::vector<std::string>& hosts) {
  const int n = static_cast<int>(hosts.size());
  std::vector<std::string> order_of_hosts;
  std::map<std::string, std::vector<int>> ranks_of;
  for (int r = 0; r < n; ++r) {
    auto& v = ranks_of[hosts[r]];
    if (v.empty()) order_of_hosts.push_back(hosts[r]);
    v.push_back(r);
  }
  std::vector<int> order;
  for (size_t round = 0; static_cast<int>(order.size()) < n; ++round) {
    for (const std::string& h : order_of_hosts) {
      if (round < ranks_of[h].size()) order.push_back(ranks_of[h][round]);
    }
  }
  return order;
}

void PlanReplicas(const std::vector<std::string>& hosts, const MemoryPolicy& policy,
                  MemoryLayout& out) {
  const int n = static_cast<int>(hosts.size());
  out.targets.assign(n, {});
  out.sources.assign(n, {});
  // Each rank's copies go to the ranks after it in the host-interleaved order: with as
  // many workers on every host, each holds exactly `replicas` copies.
  const std::vector<int> order = InterleavedByHost(hosts);
  int short_of_hosts = -1;
  for (int i = 0; i < n; ++i) {
    const int r = order[i];
    std::set<std::string> used = {hosts[r]};
    std::vector<int>& t = out.targets[r];
    for (int s = 1; s < n && static_cast<int64_t>(t.size()) < policy.replicas; ++s) {
      const int j = order[(i + s) % n];
      if (used.insert(hosts[j]).second) t.push_back(j);
    }
    if (static_cast<int64_t>(t.size()) < policy.replicas && short_of_hosts < 0) short_of_hosts = r;
    // Forced: the next ranks not taken yet, whatever their host.
    for (int s = 1; s < n && static_cast<int64_t>(t.size()) < policy.replicas; ++s) {
      const int j = order[(i + s) % n];
      if (std::find(t.begin(), t.end(), j) == t.end()) t.push_back(j);
    }
    for (int j : t) out.sources[j].push_back(r);
  }
  for (auto& s : out.sources) std::sort(s.begin(), s.end());
  if (short_of_hosts >= 0) {
    out.diversity_problem = "rank " + std::to_string(short_of_hosts) + " (host " +
                            hosts[short_of_hosts] + ") finds no " + std::to_string(policy.replicas) +
                            " other host(s) for its copies among the mesh's workers";
  }
}

void PlanParity(const std::vector<std::string>& hosts, const MemoryPolicy& policy,
                MemoryLayout& out) {
  const int n = static_cast<int>(hosts.size());
  const std::vector<int> order = InterleavedByHost(hosts);
  const int g = static_cast<int>(policy.group);
  for (int i = 0; i < n; i += g) {
    out.groups.emplace_back(order.begin() + i, order.begin() + std::min(n, i + g));
  }
  if (out.groups.size() >= 2 && out.groups.back().size() == 1) {
    out.groups[out.groups.size() - 2].push_back(out.groups.back()[0]);
    out.groups.pop_back();
  }
  out.group_of.assign(n, -1);
  for (size_t gi = 0; gi < out.groups.size(); ++gi) {
    std::set<std::string> seen;
    for (int r : out.groups[gi]) {
      out.group_of[r] = static_cast<int>(gi);
      if (!seen.insert(hosts[r]).second && out.diversity_problem.empty()) {
        out.diversity_problem = "parity group " + std::to_string(gi) + " has two workers on host " +
                                hosts[r] + " (rank " + std::to_string(r) + " and another); it needs " +
                                std::to_string(out.groups[gi].size()) + " hosts";
      }
    }
  }
}

}  // namespace

Result<MemoryLayout> PlanMemoryLayout(const std::vector<std::string>& hosts,
                                      const MemoryPolicy& policy) {
  const int64_t n = static_cast<int64_t>(hosts.size());
  if (n < 2) {
    return InvalidArgument("a memory checkpoint needs at least 2 workers in the mesh, which has " +
                               std::to_string(n),
                           {{"field", "tier"}});
  }
  MemoryLayout out;
  out.mode = policy.mode;
  if (policy.mode == MemoryPolicy::Mode::kReplica) {
    if (policy.replicas + 1 > n) {
      return InvalidArgument(std::to_string(policy.replicas) + " replica(s) need " +
                                 std::to_string(policy.replicas + 1) + " workers; the mesh has " +
                                 std::to_string(n),
                             {{"field", "replicas"}});
    }
    PlanReplicas(hosts, policy, out);
  } else {
    PlanParity(hosts, policy, out);
    out.parity = static_cast<int>(policy.parity);
    for (size_t gi = 0; gi < out.groups.size(); ++gi) {
      if (static_cast<int64_t>(out.groups[gi].size()) <= policy.parity) {
        return InvalidArgument("parity " + std::to_string(policy.parity) + " needs groups of at least " +
                                   std::to_string(policy.parity + 1) + " workers; parity group " +
                                   std::to_string(gi) + " of this mesh has " +
                                   std::to_string(out.groups[gi].size()),
                               {{"field", "parity"}});
      }
    }
  }
  if (!out.diversity_problem.empty() && !policy.force) {
    return Conflict(
        "no host diversity for a " + std::string(policy.ModeName()) + " memory checkpoint: " +
            out.diversity_problem + " (a host's loss would take a share with its redundancy; " +
            "\"force\": true takes it anyway)",
        {{"field", "tier"}, {"reason", "no_host_diversity"}});
  }
  return out;
}

}  // namespace tessera::worker
