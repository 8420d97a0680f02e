#include "storage/local_checkpoint.h"

#include <chrono>

#include "api/clock.h"
#include "api/names.h"
#include "storage/checkpoint_dir.h"
#include "storage/rank_writer.h"
#include "storage/read_planner.h"
#include "storage/save_plan.h"
#include "storage/save_transaction.h"

namespace tessera::storage {
namespace {

Result<SaveSummary> SaveInStaging(Env* env, const SaveRequest& req, SaveTransaction& txn) {
  for (const auto& t : req.tensors) {
    RETURN_IF_ERROR(ValidateName(t.name, "tensor"));
    Status st = ValidateLayout(req.mesh, t.layout, t.shape);
    if (!st.ok()) return st.WithContext("tensor '" + t.name + "'").WithDetail("tensor", t.name);
  }
  SaveSummary summary;
  auto plan = PlanSave(req.mesh, req.tensors);
  summary.bytes_per_rank = BytesPerRank(req.mesh, plan);
  std::vector<std::string> fragments;
  for (int64_t rank = 0; rank < req.mesh.num_workers(); ++rank) {
    std::vector<SliceToWrite> slices;
    for (const auto& p : plan) {
      if (p.rank != rank) continue;
      slices.push_back({req.tensors[p.tensor], p.slice, req.source(p.tensor, p.device), p.bytes});
    }
    if (slices.empty()) continue;
    ASSIGN_OR_RETURN(auto r, WriteRank(env, txn.staging(), rank, slices, req.options));
    summary.written_raw_bytes += r.raw_bytes;
    summary.stored_bytes += r.stored_bytes;
    fragments.push_back(FragmentFileName(rank));
  }
  RETURN_IF_ERROR(txn.Merge(fragments, req.metadata));
  for (const auto& t : req.tensors) summary.logical_bytes += t.logical_bytes();
  return summary;
}

}  // namespace

Result<SaveSummary> SaveCheckpoint(Env* env, const SaveRequest& req) {
  RETURN_IF_ERROR(req.mesh.Validate());
  SaveTransaction txn(env, req.root, req.mesh, req.step, req.id);
  RETURN_IF_ERROR(txn.Stage());
  auto summary = SaveInStaging(env, req, txn);
  auto dir = summary.ok() ? txn.Commit() : Result<std::string>(summary.status());
  if (!dir.ok()) {
    txn.Abandon();
    return dir.status();
  }
  summary->dir = *dir;
  return summary;
}

Result<std::string> ReadSlice(Env* env, const std::string& dir, const std::string& name,
                              const SliceSpec& target) {
  ASSIGN_OR_RETURN(auto index, CheckpointIndex::Open(env, dir));
  const TensorEntry* t = index.Find(name);
  if (!t) return NotFound("checkpoint " + dir + " has no tensor '" + name + "'", {{"tensor", name}});
  ASSIGN_OR_RETURN(auto plan, PlanRead(*t, target));
  std::string out(target.NumElements() * DTypeSize(t->meta.dtype), '\0');
  ShardCache shards(env, dir);
  RETURN_IF_ERROR(ExecuteRead(plan, &shards, out.data(), out.size()));
  return out;
}

}  // namespace tessera::storage
