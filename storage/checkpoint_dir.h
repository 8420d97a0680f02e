// Where checkpoints live and the commit protocol, written once.
//
// On a file system:
//   <root>/<mesh>/.staging-<step>-<id>/   while being written
//   <root>/<mesh>/step-<step>/            committed: one atomic rename
// Commit = fsync staging dir → rename → fsync parent.
//
// On an object store (Env::IsObjectStore; there is no rename):
//   <root>/<mesh>/.staging-<step>-<id>/   the files, written in place
//   <root>/<mesh>/step-<step>.commit      the manifest naming that prefix
// Commit = publish the manifest, once (If-None-Match: *). It is written last,
// after the index, so its presence alone makes the checkpoint visible.
//
// Either way a reader never sees a partial checkpoint, and staging leftovers of
// failed saves (and their unfinished uploads) are garbage collected.
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "api/status.h"
#include "storage/env.h"

namespace tessera::storage {

// <root>/<mesh>, with '/' in the mesh name escaped as %2F.
std::string MeshDir(const std::string& root, const std::string& mesh);
// Where `step` is when committed on a file system. Callers that may meet an
// object store use CommittedDir.
std::string CheckpointDir(const std::string& root, const std::string& mesh, int64_t step);
// The directory holding the files of committed `step`: CheckpointDir on a file
// system, the prefix the manifest names on an object store. not_found if the
// step is not committed.
Result<std::string> CommittedDir(Env* env, const std::string& root, const std::string& mesh,
                                 int64_t step);
std::string StagingDir(const std::string& root, const std::string& mesh, int64_t step,
                       const std::string& id);
// The id of a save's staging dir: every worker of the mesh writes its shard of `step`
// there at its snapshot, before any job exists, so the name is one they all know.
inline constexpr const char* kSaveStagingId = "w";
// The name in the mesh dir of the dir that holds a worker save's files of `step` once
// committed: "step-<step>" on a file system, its staging prefix on an object store.
std::string SaveDirName(Env* env, const std::string& root, int64_t step);
// The directory of the checkpoint a user names by `path`: on an object store,
// ".../<mesh>/step-<N>" is the prefix its manifest names (not_found naming the
// manifest when the step is not committed); any other path is itself.
Result<std::string> ResolveCheckpointPath(Env* env, const std::string& path);

// Creates a fresh, empty staging dir (and its parents). A committed step is conflict.
Status CreateStaging(Env* env, const std::string& root, const std::string& mesh, int64_t step,
                     const std::string& id);

// Makes the staging dir the committed checkpoint of `step`. REQUIRES: every file
// in it has been fsynced by its writer. Fails (conflict) if the step exists.
// If the rename cannot be made durable it is undone; only if the disk refuses
// even that does the (complete) checkpoint stay visible.
Status Commit(Env* env, const std::string& root, const std::string& mesh, int64_t step,
              const std::string& id);

// Removes a committed checkpoint whole: first renamed out of sight (so a crash mid-delete
// never leaves a partial "step-N"), then deleted. not_found if absent. A checkpoint whose
// files later ones may refer to goes through DeleteCheckpoint (shared_chunks.h) instead.
Status RemoveCheckpoint(Env* env, const std::string& root, const std::string& mesh, int64_t step);

// A deleted checkpoint whose files later checkpoints still refer to is "retired": its dir
// stays, holding the marker `retired` and only the files referred to, and it is no step
// any more (docs/format.md, "Incremental checkpoints").
inline constexpr const char* kRetiredFile = "retired";
bool IsRetired(Env* env, const std::string& dir);
// Retires committed `step`: the marker is published in its dir (from then on the step is
// gone), and on an object store its manifest deleted. Its dir, whose files the caller
// removes but those referred to.
Result<std::string> RetireCheckpoint(Env* env, const std::string& root, const std::string& mesh,
                                     int64_t step);
// The retired dirs of a mesh.
Result<std::vector<std::string>> RetiredDirs(Env* env, const std::string& root,
                                             const std::string& mesh);
// conflict when the dir a save of `step` commits into is a retired checkpoint's.
Status CheckNotRetired(Env* env, const std::string& root, const std::string& mesh, int64_t step);

// Committed steps of a mesh, ascending.
Result<std::vector<int64_t>> ListSteps(Env* env, const std::string& root, const std::string& mesh);

// A staging dir as the garbage collector finds it.
struct StagingRef {
  std::string mesh;  // unescaped
  int64_t step = -1;
  std::string id;
};

// Removes staging and half-deleted dirs of every mesh under `root`, except
// staging dirs that `keep` keeps (saves still running) and retired dirs (SweepRetired,
// shared_chunks.h, removes what of them is no longer referred to). Returns the removed
// paths.
// `keep` is asked at the moment a staging dir is found, so a save that
// starts while the collection runs is seen.
Result<std::vector<std::string>> CollectGarbage(Env* env, const std::string& root,
                                                const std::function<bool(const StagingRef&)>& keep);
// Keeps the staging dirs whose id is in `keep`.
Result<std::vector<std::string>> CollectGarbage(Env* env, const std::string& root,
                                                const std::set<std::string>& keep = {});

}  // namespace tessera::storage
