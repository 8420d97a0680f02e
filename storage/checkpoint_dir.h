// Where checkpoints live and the commit protocol, written once:
//   <root>/<mesh>/.staging-<step>-<id>/   while being written
//   <root>/<mesh>/step-<step>/            committed: one atomic rename
// Commit = fsync staging dir → rename → fsync parent. A reader never sees a
// partial checkpoint; staging leftovers of failed saves are garbage collected.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "api/status.h"
#include "storage/env.h"

namespace tessera::storage {

// <root>/<mesh>, with '/' in the mesh name escaped as %2F.
std::string MeshDir(const std::string& root, const std::string& mesh);
std::string CheckpointDir(const std::string& root, const std::string& mesh, int64_t step);
std::string StagingDir(const std::string& root, const std::string& mesh, int64_t step,
                       const std::string& id);

// Creates a fresh, empty staging dir (and its parents). A committed step is conflict.
Status CreateStaging(Env* env, const std::string& root, const std::string& mesh, int64_t step,
                     const std::string& id);

// Makes the staging dir the committed checkpoint of `step`. REQUIRES: every file
// in it has been fsynced by its writer. Fails (conflict) if the step exists.
// If the rename cannot be made durable it is undone; only if the disk refuses
// even that does the (complete) checkpoint stay visible.
Status Commit(Env* env, const std::string& root, const std::string& mesh, int64_t step,
              const std::string& id);

// Removes a committed checkpoint: first renamed out of sight (so a crash mid-delete
// never leaves a partial "step-N"), then deleted. not_found if absent.
Status DeleteCheckpoint(Env* env, const std::string& root, const std::string& mesh, int64_t step);

// Committed steps of a mesh, ascending.
Result<std::vector<int64_t>> ListSteps(Env* env, const std::string& root, const std::string& mesh);

// Removes staging and half-deleted dirs of every mesh under `root`, except
// staging dirs whose id is in `keep` (saves still running). Returns the removed paths.
Result<std::vector<std::string>> CollectGarbage(Env* env, const std::string& root,
                                                const std::set<std::string>& keep = {});

}  // namespace tessera::storage
