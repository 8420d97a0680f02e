// The agent's side of POST /v1/checkpoints/{step}/read (trainer_api.cc): boxes of tensors of
// a committed checkpoint, read from the root for a trainer that reshards on its own
// (tessera.dcp's Reader onto another world size or sharding). Any worker that reaches
// the root may read any mesh's checkpoint: the trainer's credential is the check, as
// for GET /v1/checkpoints. Only the chunks that overlap a box are read
// (storage::PlanRead), each verified against its checksum.
#include "api/json_codec.h"
#include "api/names.h"
#include "storage/checkpoint_dir.h"
#include "storage/index.h"
#include "storage/read_planner.h"
#include "worker/agent.h"

namespace tessera::worker {
namespace {

// One call reads at most this much; the client asks in batches.
constexpr uint64_t kMaxReadBytes = uint64_t{1} << 30;
constexpr size_t kMaxBoxes = 100000;

}  // namespace

Result<Json> Agent::ReadBoxes(const std::string& mesh, const std::string& step, const Json& body,
                              std::string* out) {
  if (!body.is_object() || !body.contains("reads") || !body["reads"].is_array()) {
    return InvalidArgument("the body must be {\"reads\": [{tensor, offsets, lengths}, ...]}",
                           {{"field", "reads"}});
  }
  const Json& reads = body["reads"];
  if (reads.size() > kMaxBoxes) {
    return InvalidArgument("at most " + std::to_string(kMaxBoxes) + " reads per call",
                           {{"field", "reads"}});
  }
  ASSIGN_OR_RETURN(Json ck, Checkpoint(mesh, step));
  const int64_t resolved = ck.value("step", int64_t{-1});
  if (const std::string state = ck.value("state", ""); state != "committed") {
    return Conflict("checkpoint " + mesh + " step " + std::to_string(resolved) + " is " + state +
                        ", not committed",
                    {{"mesh", mesh}, {"step", resolved}, {"state", state}});
  }
  std::string root;
  {
    MutexLock lock(mu_);
    root = checkpoint_root_;
  }
  if (root.empty()) {
    return Unavailable("worker " + id_ + " has no checkpoint root: tesserad gave none at registration");
  }
  ASSIGN_OR_RETURN(std::string dir, storage::CommittedDir(env_, root, mesh, resolved));
  ASSIGN_OR_RETURN(auto index, storage::CheckpointIndex::Open(env_, dir));
  // Checked and sized before anything is read.
  struct Box {
    const storage::TensorEntry* entry;
    SliceSpec slice;
    uint64_t bytes;
  };
  std::vector<Box> boxes;
  uint64_t total = 0;
  for (size_t i = 0; i < reads.size(); ++i) {
    const Json& r = reads[i];
    const std::string field = "reads[" + std::to_string(i) + "]";
    if (!r.is_object() || !r.contains("tensor") || !r["tensor"].is_string()) {
      return InvalidArgument(field + " needs a tensor name", {{"field", field + ".tensor"}});
    }
    const std::string name = r["tensor"].get<std::string>();
    const storage::TensorEntry* e = index.Find(name);
    if (!e) {
      return NotFound("checkpoint " + mesh + " step " + std::to_string(resolved) +
                          " has no tensor '" + name + "'",
                      {{"tensor", name}, {"mesh", mesh}, {"step", resolved}});
    }
    ASSIGN_OR_RETURN(Shape offsets, ShapeFromJson(r.value("offsets", Json()), field + ".offsets"));
    ASSIGN_OR_RETURN(Shape lengths, ShapeFromJson(r.value("lengths", Json()), field + ".lengths"));
    const Shape& shape = e->meta.shape;
    bool inside = offsets.size() == shape.size() && lengths.size() == shape.size();
    for (size_t d = 0; inside && d < shape.size(); ++d) {
      inside = offsets[d] >= 0 && lengths[d] >= 0 && offsets[d] <= shape[d] &&
               lengths[d] <= shape[d] - offsets[d];
    }
    SliceSpec slice{offsets, lengths};
    if (!inside) {
      return InvalidArgument(field + ": box " + slice.ToString() + " is not inside tensor '" + name +
                                 "' of shape " + ShapeToString(shape),
                             {{"field", field}, {"tensor", name}});
    }
    const uint64_t bytes = static_cast<uint64_t>(slice.NumElements()) * DTypeSize(e->meta.dtype);
    total += bytes;
    if (total > kMaxReadBytes) {
      return InvalidArgument("a read call asks for more than " + std::to_string(kMaxReadBytes) +
                                 " bytes: ask in batches",
                             {{"field", "reads"}});
    }
    boxes.push_back({e, std::move(slice), bytes});
  }
  storage::ShardCache shards(env_, dir);
  out->assign(total, '\0');
  uint64_t at = 0, stored = 0;
  for (const Box& b : boxes) {
    ASSIGN_OR_RETURN(auto plan, storage::PlanRead(*b.entry, b.slice));
    RETURN_IF_ERROR(storage::ExecuteRead(plan, &shards, out->data() + at, b.bytes, &io_pool_));
    stored += plan.stored_bytes;
    at += b.bytes;
  }
  return Json{{"step", resolved}, {"bytes", total}, {"stored_bytes", stored}};
}

}  // namespace tessera::worker
