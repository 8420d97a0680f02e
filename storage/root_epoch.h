// Who may change a checkpoint root: its epochs (docs/format.md, "Epochs and fencing").
//
//   <root>/.tesserad/epoch-<n>.json   the control plane that took epoch n, created once
//                                     (create-if-absent); the newest epoch holds the root
//   <root>/.tesserad/epoch-<n>.lease  rewritten by that control plane every third of its
//                                     lease: a counter that keeps changing while it lives,
//                                     and {"released": true} once it stopped cleanly
//
// A control plane acts on the root (commits, deletes, collects garbage, writes mesh
// documents) only while its epoch is the newest and its lease is fresh; see
// service/root_fence.h for the rules, this file for the files.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "api/json_codec.h"
#include "api/status.h"
#include "storage/env.h"

namespace tessera::storage {

// The format of the root's own files; a root written by a newer one is refused.
inline constexpr int kRootFormatVersion = 1;

struct EpochDoc {
  int64_t epoch = 0;
  Json doc;  // {"format": "tessera-root/1", "epoch", "holder": {...}, "ha"}
  std::string holder_url() const;
};

std::string EpochDir(const std::string& root);
std::string EpochPath(const std::string& root, int64_t epoch);
std::string LeasePath(const std::string& root, int64_t epoch);

// The newest epoch of the root, nullopt when none was ever taken. InvalidArgument
// for a root whose newest epoch was written by a newer format, naming the file.
Result<std::optional<EpochDoc>> ReadNewestEpoch(Env* env, const std::string& root);
// Takes epoch `epoch` (create-if-absent): conflict naming the file and its holder
// when another control plane took it first.
Status CreateEpoch(Env* env, const std::string& root, int64_t epoch, const Json& doc);
// Whether epoch `epoch` was taken.
Result<bool> EpochTaken(Env* env, const std::string& root, int64_t epoch);
// The lease file's text ("" when there is none yet).
Result<std::string> ReadLease(Env* env, const std::string& root, int64_t epoch);
Status WriteLease(Env* env, const std::string& root, int64_t epoch, const Json& lease);
// Garbage collection: the files of every epoch older than `keep_from`. The paths removed.
Result<std::vector<std::string>> PruneEpochs(Env* env, const std::string& root, int64_t keep_from);

// The epoch a job id carries ("j<epoch>-<hex>"), 0 for an id without one.
int64_t EpochOfJobId(std::string_view id);

}  // namespace tessera::storage
