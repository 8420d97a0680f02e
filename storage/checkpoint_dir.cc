#include "storage/checkpoint_dir.h"

#include <atomic>
#include <chrono>
#include <algorithm>
#include <charconv>

namespace tessera::storage {
namespace {

constexpr std::string_view kStepPrefix = "step-";
constexpr std::string_view kStagingPrefix = ".staging-";
constexpr std::string_view kDeletingPrefix = ".deleting-";

bool ParseStep(std::string_view name, int64_t* step) {
  if (name.substr(0, kStepPrefix.size()) != kStepPrefix) return false;
  std::string_view digits = name.substr(kStepPrefix.size());
  auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), *step);
  return ec == std::errc() && p == digits.data() + digits.size() && !digits.empty() && *step >= 0;
}

}  // namespace

std::string MeshDir(const std::string& root, const std::string& mesh) {
  // One directory per mesh even when its name has '/': '%' cannot occur in names.
  std::string escaped;
  for (char c : mesh) escaped += c == '/' ? std::string("%2F") : std::string(1, c);
  return JoinPath(root, escaped);
}

std::string CheckpointDir(const std::string& root, const std::string& mesh, int64_t step) {
  return JoinPath(MeshDir(root, mesh), std::string(kStepPrefix) + std::to_string(step));
}

std::string StagingDir(const std::string& root, const std::string& mesh, int64_t step,
                       const std::string& id) {
  return JoinPath(MeshDir(root, mesh),
                  std::string(kStagingPrefix) + std::to_string(step) + "-" + id);
}

Status CreateStaging(Env* env, const std::string& root, const std::string& mesh, int64_t step,
                     const std::string& id) {
  if (env->Exists(CheckpointDir(root, mesh, step))) {
    return Conflict("step " + std::to_string(step) + " of mesh " + mesh + " is already committed",
                    {{"step", step}});
  }
  const std::string staging = StagingDir(root, mesh, step, id);
  RETURN_IF_ERROR(env->DeleteTree(staging));
  return env->CreateDirs(staging);
}

Status Commit(Env* env, const std::string& root, const std::string& mesh, int64_t step,
              const std::string& id) {
  const std::string staging = StagingDir(root, mesh, step, id);
  const std::string final_dir = CheckpointDir(root, mesh, step);
  if (env->Exists(final_dir)) {
    return Conflict("step " + std::to_string(step) + " of mesh " + mesh + " is already committed",
                    {{"step", step}});
  }
  RETURN_IF_ERROR(env->SyncDir(staging));
  RETURN_IF_ERROR(env->Rename(staging, final_dir));
  Status st = env->SyncDir(MeshDir(root, mesh));
  // The mesh dir (and the root) may be new: their own entries must be durable too.
  if (st.ok()) st = env->SyncDir(root);
  if (st.ok()) st = env->SyncDir(ParentDir(root));
  if (!st.ok()) {
    // Not known to be durable: take it back, so a failed commit leaves no visible step.
    if (env->Rename(final_dir, staging).ok()) (void)env->SyncDir(MeshDir(root, mesh));
  }
  return st;
}

Status DeleteCheckpoint(Env* env, const std::string& root, const std::string& mesh, int64_t step) {
  const std::string dir = CheckpointDir(root, mesh, step);
  if (!env->IsDirectory(dir)) {
    return NotFound("mesh " + mesh + " has no committed step " + std::to_string(step),
                    {{"step", step}});
  }
  static std::atomic<uint64_t> counter{0};
  const std::string doomed =
      JoinPath(MeshDir(root, mesh), std::string(kDeletingPrefix) + std::to_string(step) + "-" +
                                        std::to_string(counter++));
  RETURN_IF_ERROR(env->Rename(dir, doomed));
  RETURN_IF_ERROR(env->SyncDir(MeshDir(root, mesh)));
  return env->DeleteTree(doomed);
}

Result<std::vector<int64_t>> ListSteps(Env* env, const std::string& root, const std::string& mesh) {
  std::vector<int64_t> steps;
  const std::string dir = MeshDir(root, mesh);
  if (!env->IsDirectory(dir)) return steps;
  ASSIGN_OR_RETURN(auto names, env->ListDir(dir));
  for (const auto& n : names) {
    int64_t step;
    if (ParseStep(n, &step) && env->IsDirectory(JoinPath(dir, n))) steps.push_back(step);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

Result<std::vector<std::string>> CollectGarbage(Env* env, const std::string& root,
                                                const std::set<std::string>& keep) {
  std::vector<std::string> removed;
  if (!env->IsDirectory(root)) return removed;
  ASSIGN_OR_RETURN(auto meshes, env->ListDir(root));
  for (const auto& m : meshes) {
    const std::string dir = JoinPath(root, m);
    if (!env->IsDirectory(dir)) continue;
    ASSIGN_OR_RETURN(auto names, env->ListDir(dir));
    for (const auto& n : names) {
      const std::string path = JoinPath(dir, n);
      if (n.starts_with(kStagingPrefix)) {
        std::string_view rest = std::string_view(n).substr(kStagingPrefix.size());
        size_t dash = rest.find('-');
        if (dash != rest.npos && keep.count(std::string(rest.substr(dash + 1)))) continue;
      } else if (!n.starts_with(kDeletingPrefix)) {
        continue;
      }
      RETURN_IF_ERROR(env->DeleteTree(path));
      removed.push_back(path);
    }
  }
  return removed;
}

}  // namespace tessera::storage
