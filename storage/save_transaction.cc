#include "storage/save_transaction.h"

#include <algorithm>
#include <map>
#include <set>

#include "api/clock.h"
#include "storage/checkpoint_dir.h"
#include "storage/chunk_ref.h"
#include "storage/root_meta.h"

namespace tessera::storage {
namespace {

std::string JoinSteps(const std::set<int64_t>& steps) {
  std::string out;
  for (int64_t s : steps) out += (out.empty() ? "" : ", ") + std::to_string(s);
  return out.empty() ? "none" : out;
}

}  // namespace

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
  // As MergeSlices: an import (or a local save) commits no step that is retired.
  RETURN_IF_ERROR(CheckNotRetired(env_, root_, mesh_.name, step_));
  RETURN_IF_ERROR(MergeFragments(env_, staging_, fragments, meta));
  // What a control plane rebuilding its catalog reads instead of the index.
  return WriteSummary(env_, staging_);
}

Status SaveTransaction::MergeSlices(const std::vector<std::vector<FragmentSlice>>& fragments,
                                    const Json& metadata, const std::set<int64_t>& bases) {
  CheckpointMeta meta{mesh_, step_, metadata.is_null() ? Json::object() : metadata, WallMs()};
  // A retired step's dir keeps files that later checkpoints refer to (an object store's
  // is this very staging prefix): no save of that step commits until they are deleted.
  RETURN_IF_ERROR(CheckNotRetired(env_, root_, mesh_.name, step_));
  // What the bases hold: a reference elsewhere could name a file nothing keeps.
  std::set<std::string> referable;
  for (int64_t base : bases) {
    ASSIGN_OR_RETURN(std::string dir, CommittedDir(env_, root_, mesh_.name, base));
    ASSIGN_OR_RETURN(CheckpointIndex index, CheckpointIndex::Open(env_, dir));
    const std::string name = dir.substr(ParentDir(dir).size() + 1);
    for (const std::string& f : index.files()) referable.insert(ChunkRef{name, f}.ToString());
    for (const std::string& f : index.referenced_files()) referable.insert(f);
  }
  // Every file the joins name is there and holds its chunks: the index never refers to
  // a file that is gone (removed by the collector, say) or was cut short.
  std::map<std::string, uint64_t> needed;  // file → bytes its chunks reach
  for (const auto& fragment : fragments) {
    for (const FragmentSlice& s : fragment) {
      for (const SliceChunk& c : s.chunks) {
        if (!c.file.empty() && !referable.count(c.file)) {
          return InvalidArgument("a chunk of tensor '" + s.tensor.name + "' refers to " + c.file +
                                     ", which no checkpoint this save builds on (steps " +
                                     JoinSteps(bases) + ") holds",
                                 {{"tensor", s.tensor.name}, {"file", c.file}});
        }
        uint64_t& end = needed[c.file.empty() ? s.file : c.file];
        end = std::max(end, c.loc.offset + c.loc.length);
      }
    }
  }
  for (const auto& [file, end] : needed) {
    const std::string path = ResolveChunkFile(staging_, file);
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
  for (const auto& [file, end] : needed) {
    if (!ParseChunkRef(file)) keep.insert(file);
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

void SaveTransaction::Abandon() {
  // A retired checkpoint's dir (an object store's staging prefix) keeps the files later
  // checkpoints refer to: the garbage collector sweeps it, never wholesale. One listing
  // tells; a store that cannot be listed now leaves it to the collector too.
  auto names = env_->ListDir(staging_);
  if (!names.ok()) {
    if (names.status().code() != Code::kNotFound && !env_->IsObjectStore(staging_)) {
      (void)env_->DeleteTree(staging_);
    }
    return;
  }
  if (std::find(names->begin(), names->end(), kRetiredFile) != names->end()) return;
  (void)env_->DeleteTree(staging_);
}

}  // namespace tessera::storage
