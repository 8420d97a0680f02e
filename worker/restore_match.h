// A trainer's restore, matched against the checkpoint before a byte moves: which of
// the tensors the worker holds for the mesh the checkpoint lacks (missing), which
// checkpoint tensors nobody holds (unexpected), and which differ in dtype or
// global shape (mismatched). Strict, as torch's load_state_dict(strict=True): any
// missing or unexpected name refuses the restore; a mismatch always does. The
// restore then asks for exactly the tensors both sides have, each with the
// layout it is held in, so a mapped tensor is written in place whatever layout
// it was saved with.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "api/json_codec.h"
#include "api/status.h"
#include "api/tensor_desc.h"

namespace tessera::worker {

struct HeldTensor {
  std::string name;
  TensorDesc desc;
};

struct RestoreMatch {
  std::vector<std::string> missing;     // held here, absent from the checkpoint (sorted)
  std::vector<std::string> unexpected;  // in the checkpoint, held by nobody here (sorted)
  Json tensors = Json::array();         // what to restore: [{name, dtype, shape}]
  Json layouts = Json::object();        // {name: layout} of the held ones among them
};

struct RestoreRequest {
  std::string mesh;
  int64_t step = 0;
  std::string worker;  // for messages
  // The names the trainer asked for; nullopt = everything it holds.
  std::optional<std::vector<std::string>> names;
  bool strict = true;
};

// `held`: the worker's tensors of the mesh; `checkpoint_tensors`: the "tensors"
// of tesserad's checkpoint record ([{name, dtype, shape, layout, ...}]).
// With names, only they are matched: a name the checkpoint lacks is missing, and
// one held nowhere is created by the restore (nothing is unexpected).
// Errors (conflict, details mesh, step, worker, missing, unexpected, mismatched):
// a mismatch of dtype or shape; with strict, any missing or unexpected name.
Result<RestoreMatch> MatchCheckpoint(const RestoreRequest& request,
                                     const std::vector<HeldTensor>& held,
                                     const Json& checkpoint_tensors);

}  // namespace tessera::worker
