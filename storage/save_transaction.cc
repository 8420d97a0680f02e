#include "storage/save_transaction.h"

#include <algorithm>
#include <map>
#include <set>

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

Status SaveTransaction::MergeSlices(const std::vector<std::vector<FragmentSlice>>& fragments,
                                    const Json& metadata) {
  CheckpointMeta meta{mesh_, step_, metadata.is_null() ? Json::object() : metadata, WallMs()};
  // Every file the joins name is there and holds its chunks: the index never refers to
  // a file that is gone (removed by the collector, say) or was cut short.
  std::map<std::string, uint64_t> needed;  // file → bytes its chunks reach
  for (const auto& fragment : fragments) {
    for (const FragmentSlice& s : fragment) {
      for (const SliceChunk& c : s.chunks) {
        uint64_t& end = needed[s.file];
        end = std::max(end, c.loc.offset + c.loc.length);
      }
    }
  }
  for (const auto& [file, end] : needed) {
    const std::string path = JoinPath(staging_, file);
    auto size = env_->FileSize(path);
    if (!size.ok()) {
      return DataLoss("shard file " + path + " that a worker's join names cannot be read: " +
                          size.status().message(),
                      {{"file", file}});
    }
    if (*size < end) {
      return DataLoss("shard file " + path + " holds " + std::to_string(*size) +
                          " bytes, and its worker's join names chunks up to byte " + std::to_string(end),
                      {{"file", file}});
    }
  }
  RETURN_IF_ERROR(storage::MergeSlices(env_, staging_, fragments, meta));
  RETURN_IF_ERROR(WriteSummary(env_, staging_));
  std::set<std::string> keep = {kIndexFile, kSummaryFile};
  for (const auto& fragment : fragments) {
    for (const FragmentSlice& s : fragment) keep.insert(s.file);
  }
  ASSIGN_OR_RETURN(std::vector<std::string> names, env_->ListDir(staging_));
  for (const std::string& n : names) {
    if (keep.count(n)) continue;
    Status st = env_->DeleteFile(JoinPath(staging_, n));
    if (!st.ok() && st.code() != Code::kNotFound) return st;
  }
  return Status::Ok();
}

Result<std::string> SaveTransaction::Commit() {
  RETURN_IF_ERROR(storage::Commit(env_, root_, mesh_.name, step_, id_));
  return CommittedDir(env_, root_, mesh_.name, step_);
}

void SaveTransaction::Abandon() { (void)env_->DeleteTree(staging_); }

}  // namespace tessera::storage
