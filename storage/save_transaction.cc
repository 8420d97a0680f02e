#include "storage/save_transaction.h"

#include "api/clock.h"
#include "storage/checkpoint_dir.h"
#include "storage/root_meta.h"

namespace tessera::storage {

SaveTransaction::SaveTransaction(Env* env, std::string root, Mesh mesh, int64_t step,
                                 std::string id)
    : env_(env),
      root_(std::move(root)),
      mesh_(std::move(mesh)),
      step_(step),
      id_(std::move(id)),
      staging_(StagingDir(root_, mesh_.name, step_, id_)) {}

Status SaveTransaction::Stage() { return CreateStaging(env_, root_, mesh_.name, step_, id_); }

Status SaveTransaction::Merge(const std::vector<std::string>& fragments, const Json& metadata) {
  CheckpointMeta meta{mesh_, step_, metadata.is_null() ? Json::object() : metadata, WallMs()};
  RETURN_IF_ERROR(MergeFragments(env_, staging_, fragments, meta));
  // What a control plane rebuilding its catalog reads instead of the index.
  return WriteSummary(env_, staging_);
}

Result<std::string> SaveTransaction::Commit() {
  RETURN_IF_ERROR(storage::Commit(env_, root_, mesh_.name, step_, id_));
  return CommittedDir(env_, root_, mesh_.name, step_);
}

void SaveTransaction::Abandon() { (void)env_->DeleteTree(staging_); }

}  // namespace tessera::storage
