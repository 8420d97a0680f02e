// Meshes and their retention policies. A job holds the mesh it runs on from its
// start to its end, so a held mesh cannot be deleted under it. One lock, held for
// memory alone: the caller writes the root and the catalog first (Service::WriteState)
// and changes this registry last.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "api/status.h"
#include "api/thread_annotations.h"
#include "service/records.h"

namespace tessera::service {

class MeshRegistry {
 public:
  void Load(MeshRecord m);
  void LoadRetention(const std::string& mesh, RetentionPolicy p);

  // Adds a new mesh (self_testing as the record says): nullopt, or the mesh already
  // registered under the name (nothing changes).
  std::optional<MeshRecord> Add(const MeshRecord& m);
  // Forgets the mesh and its retention policy (a failed self-test's, once written).
  void Drop(const std::string& name);
  void MarkTested(const std::string& name);  // its self-test passed: jobs may start

  // The mesh, once its self-test has passed, held for job `job` until Release:
  // not_found, or unavailable while the test runs. `field` names the request's field.
  Result<MeshRecord> Hold(const std::string& name, const std::string& job,
                          const std::string& field = "");
  void Release(const std::string& name, const std::string& job);
  // Whether a held mesh has `worker` (it may not be removed then).
  bool WorkerHeld(const std::string& worker) const;
  // The first half of a removal: not_found, unavailable during its self-test, or
  // conflict naming a job that holds it; else no job can hold it until EndRemove, which
  // forgets it (`removed`) or gives it back (the root or the catalog refused).
  Status BeginRemove(const std::string& name);
  void EndRemove(const std::string& name, bool removed);

  Result<MeshRecord> Get(const std::string& name) const;  // not_found
  bool Has(const std::string& name) const;
  std::vector<MeshRecord> List() const;  // by name
  std::vector<std::string> MeshesOf(const std::string& worker) const;
  size_t Size() const;

  Status SetRetention(const std::string& mesh, const RetentionPolicy& p);  // not_found
  std::optional<RetentionPolicy> Retention(const std::string& mesh) const;
  // The record as REST shows it, with its retention policy.
  Json JsonOf(const MeshRecord& m) const;

 private:
  struct Entry {
    MeshRecord record;
    std::multiset<std::string> holders;  // jobs running on it
    bool removing = false;               // between BeginRemove and EndRemove
  };
  mutable Mutex mu_;
  std::map<std::string, Entry> meshes_ GUARDED_BY(mu_);
  std::map<std::string, RetentionPolicy> retention_ GUARDED_BY(mu_);
};

}  // namespace tessera::service
