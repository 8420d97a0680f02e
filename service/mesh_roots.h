// The one owner of each mesh's checkpoints in the root (docs/semantics.md, S9). Every
// change of them goes through its mesh's turn, one after the other in the order they
// came: a save's or an import's commit with the release of its bases, retention (the
// choice of the steps to prune and their deletes, in one turn), a REST delete (the
// retire or removal of its step and the sweep after it), and the collector's sweep of
// retired dirs. So what a sweep may remove is decided, in the turn, from the root as the
// turn's holder sees it: the references of every committed checkpoint, none of which can
// commit or go meanwhile. Files that a save still being written refers to are its bases'
// (held until its commit, CheckpointRegistry::HoldBase), so they are live too: the live
// set is every live version plus the pending outputs, as in LevelDB's DeleteObsoleteFiles.
//
// A turn is not a lock held across I/O: the state of the registries stays behind their
// own locks, and a reader never waits for a turn. Writers of one mesh queue; those of
// different meshes do not.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "api/thread_annotations.h"
#include "service/write_turns.h"

namespace tessera::service {

class MeshRoots {
 public:
  // A mesh's turn, from Take() until destroyed.
  class Turn {
   public:
    const std::string& mesh() const { return mesh_; }

   private:
    friend class MeshRoots;
    Turn(std::string mesh, std::shared_ptr<WriteTurns> turns)
        : mesh_(std::move(mesh)), turns_(std::move(turns)), turn_(turns_->Take()) {}
    std::string mesh_;
    std::shared_ptr<WriteTurns> turns_;  // outlives turn_
    WriteTurns::Turn turn_;
  };

  // Waits for the turns of `mesh` taken before. REQUIRES: the caller holds no turn of
  // `mesh` (turns do not nest) and no lock that a turn's holder takes.
  Turn Take(const std::string& mesh) EXCLUDES(mu_);
  // Turns of `mesh` taken and not yet passed (its writer at work and those waiting).
  uint64_t Queued(const std::string& mesh) EXCLUDES(mu_);

 private:
  std::shared_ptr<WriteTurns> TurnsOf(const std::string& mesh) EXCLUDES(mu_);

  Mutex mu_;  // for the map alone
  std::map<std::string, std::shared_ptr<WriteTurns>> meshes_ GUARDED_BY(mu_);
};

}  // namespace tessera::service
