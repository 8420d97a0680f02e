// A worker's collectives runtime: runs CollectiveRequests against the meshes it
// belongs to, over TCP between the mesh's workers.
//
// Each mesh gets one full TCP mesh between its workers (rank = the worker's rank
// in the mesh), joined through every worker's data port (a TcpAcceptor) at the
// addresses tesserad lists. Subgroups along mesh axes are views of it
// (SubsetTransport), so collectives of one mesh run one at a time on a worker;
// every worker walks its device groups in the same order, so that cannot
// deadlock. A failure poisons the mesh's transport on every worker; the next
// collective on the mesh joins a fresh one (the group recovers for the next call).
//
// Device-level ops with several local devices reduce or concatenate locally
// first and send one message per worker (hierarchical). Errors name workers:
// "rank 2" of a group becomes "rank 2 (w-b)", and details gain missing_workers,
// differing_workers, mismatched_workers, invalid_workers, peer_worker,
// aborted_by_worker.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "api/status.h"
#include "api/thread_annotations.h"
#include "worker/collective_request.h"
#include "collectives/group.h"
#include "collectives/transport/tcp/tcp_transport.h"
#include "collectives/tensor.h"
#include "worker/device_groups.h"
#include "worker/mesh_placement.h"

namespace tessera::worker {

// The data-port addresses ("host:port") of a mesh's workers, by rank.
using PeerAddresses = std::function<Result<std::vector<std::string>>(const MeshPlacement&)>;

struct CollectiveResult {
  // Device-level ops: one output per local device, in device order; process-level
  // ops: one; barrier and assert_equal: none. sparse_all_reduce: two per local
  // device, the summed slices' values and indices (int64 [rows]).
  std::vector<collectives::Tensor> outputs;
  // sparse_all_reduce: the path each local device's group took ("gather", "dense").
  std::vector<std::string> paths;
};

class MeshCollectives {
 public:
  // `acceptor` (this worker's data port) must outlive this object.
  MeshCollectives(collectives::TcpAcceptor* acceptor, PeerAddresses addresses);
  ~MeshCollectives();
  MeshCollectives(const MeshCollectives&) = delete;
  MeshCollectives& operator=(const MeshCollectives&) = delete;

  // Runs `request` as this worker (rank p.rank of p.mesh). `inputs`: one tensor
  // of request.dtype × request.shape per local device, in device order (process-
  // level ops: exactly one; barrier: none; sparse_all_reduce: values [rows, ...]
  // and indices (int64 [rows]) per local device). SPMD: every worker of the mesh must
  // make the same call (those outside a device group simply take no part in it).
  // Calls of Run in progress (the worker's /healthz shows it).
  int64_t in_flight() const { return in_flight_.load(); }

  Result<CollectiveResult> Run(const MeshPlacement& p, const CollectiveRequest& request,
                               std::vector<collectives::Tensor> inputs);

  // Ends the collective of job `job` running on `mesh`, if any, with `reason` on
  // every worker of the mesh (it poisons the mesh's connections, which the next
  // call rebuilds). For a tesserad job that failed elsewhere: the workers still
  // inside it need not wait for their timeout.
  void Abort(const std::string& mesh, const std::string& job, const Status& reason);

  // The worker ids (or "rank N" when unknown) of `p`'s mesh, for messages.
  static std::string WorkerName(const MeshPlacement& p, int64_t rank);

 private:
  struct MeshState;
  std::shared_ptr<MeshState> StateFor(const std::string& mesh);
  // The mesh-wide group of `p`, joined (again) if absent, poisoned or stale.
  Result<collectives::Group*> MeshGroup(MeshState& state, const MeshPlacement& p,
                                        std::chrono::milliseconds timeout);
  // The group of the workers `ranks` (mesh ranks, ascending) within the mesh group.
  Result<collectives::Group*> Subgroup(MeshState& state, const std::vector<int64_t>& ranks);
  Result<CollectiveResult> RunDeviceOp(MeshState& state, const MeshPlacement& p,
                                       const CollectiveRequest& r,
                                       std::vector<collectives::Tensor>& inputs);
  // batch_all_reduce within group `g` (of `n` devices, `count` of them here from
  // local device `first` on); inputs and outputs are device-major, shapes.size() each.
  Status BatchOnGroup(collectives::Group& sub, const DeviceGroup& g, int64_t n, int64_t count,
                      size_t first, const CollectiveRequest& r,
                      std::vector<collectives::Tensor>& inputs,
                      std::vector<collectives::Tensor>& outputs);
  Result<CollectiveResult> RunProcessOp(collectives::Group& group, const MeshPlacement& p,
                                        const CollectiveRequest& r,
                                        std::vector<collectives::Tensor>& inputs);

  std::atomic<int64_t> in_flight_{0};
  collectives::TcpAcceptor* acceptor_;
  PeerAddresses addresses_;
  Mutex mu_;
  std::map<std::string, std::shared_ptr<MeshState>> meshes_ GUARDED_BY(mu_);
};

// The id of a group over `p`'s mesh: "<prefix>/<mesh>#<hash>", the hash naming the
// mesh's definition and membership, so that workers disagreeing about either never
// join one group.
std::string GroupId(const std::string& prefix, const MeshPlacement& p);

// Rewrites an engine error of a group whose rank i is mesh rank ranks[i] so that
// it names workers (see above) and says which collective failed.
Status NameWorkers(const Status& status, const MeshPlacement& p,
                   const std::vector<int64_t>& ranks, const std::string& context);

}  // namespace tessera::worker
