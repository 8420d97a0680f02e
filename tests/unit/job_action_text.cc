#include "job_action_text.h"

#include "service/records.h"
#include "service/states.h"

namespace tessera::service {
namespace {

std::string Joined(const std::vector<std::string>& parts, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? sep : "") + parts[i];
  return out;
}

std::string TasksText(const std::map<int64_t, Task>& tasks) {
  std::vector<std::string> parts;
  for (const auto& [rank, task] : tasks) {
    parts.push_back("rank " + std::to_string(rank) + " " + TaskText(task));
  }
  return parts.empty() ? "none" : Joined(parts, ", ");
}

std::string SliceText(const std::string& tensor, const SliceSpec& slice) {
  return tensor + slice.ToString();
}

std::string IoText(const JobAction& a, const std::vector<std::string>& tensors) {
  std::string out = "io " + std::string(IoKindName(a.io));
  std::vector<std::string> parts;
  for (const auto& fragment : a.slices) {
    for (const storage::FragmentSlice& s : fragment) {
      parts.push_back(SliceText(s.tensor.name, s.slice) + " in " + s.file);
    }
  }
  for (const std::string& f : a.fragments) parts.push_back(f);
  if (!parts.empty()) out += ": " + Joined(parts, ", ");
  if (!a.plan.empty()) out += ": plan " + PlanText(a.plan, tensors);
  if (!a.io_input.is_null()) out += " input " + a.io_input.dump();
  return out;
}

}  // namespace

std::string PlanText(const std::vector<storage::PlannedSlice>& plan,
                     const std::vector<std::string>& tensors) {
  std::vector<std::string> parts;
  for (const storage::PlannedSlice& p : plan) {
    const std::string name =
        p.tensor < tensors.size() ? tensors[p.tensor] : "#" + std::to_string(p.tensor);
    parts.push_back(SliceText(name, p.slice) + " by rank " + std::to_string(p.rank));
  }
  return parts.empty() ? "nothing" : Joined(parts, ", ");
}

std::string StatusText(const Status& st) {
  if (st.ok()) return "ok";
  std::string out = std::string(CodeName(st.code())) + ": " + st.message();
  if (!st.details().is_null() && !st.details().empty()) out += " " + st.details().dump();
  return out;
}

std::string TaskText(const Task& task) {
  std::string out(TaskKindName(task.kind));
  switch (task.kind) {
    case TaskKind::kSnapshot:
      out += "(step " + std::to_string(task.step);
      if (task.tensor_names) out += ": " + Joined(*task.tensor_names, " ");
      return out + ")";
    case TaskKind::kRestore: {
      std::vector<std::string> names;
      for (const TensorMeta& m : task.tensors) names.push_back(m.name);
      return out + "(" + task.dir + ": " + Joined(names, " ") + ")";
    }
    case TaskKind::kCollective:
      return out + "(" + task.request.value("op", "?") + ", " + std::to_string(task.timeout_ms) +
             " ms)";
    case TaskKind::kMeshInit:
      return out + "(" + std::to_string(task.timeout_ms) + " ms)";
    default:
      return out;
  }
}

std::string ActionText(const JobAction& a, const std::vector<std::string>& tensors) {
  using Kind = JobAction::Kind;
  switch (a.kind) {
    case Kind::kSetPhase:
      return "phase " + a.phase;
    case Kind::kSetCheckpointState:
      return "checkpoint " + StateString(a.checkpoint_state);
    case Kind::kQueueTasks:
      return "queue round " + std::to_string(a.round) +
             (a.total_bytes ? " (" + std::to_string(a.total_bytes) + " bytes)" : "") + ": " +
             TasksText(a.tasks);
    case Kind::kSendTasks:
      return "send tasks: " + TasksText(a.tasks);
    case Kind::kSetProgress:
    {
      std::string joined;
      for (const auto& [rank, bytes] : a.joined) {
        joined += (joined.empty() ? "" : ", ") + std::to_string(rank);
      }
      return "progress: " + std::to_string(a.done_bytes) + " of " + std::to_string(a.total_bytes) +
             " bytes, joined: " + (joined.empty() ? "none" : joined);
    }
    case Kind::kRunIo:
      return IoText(a, tensors);
    // The cleanups carry the job's error, which the finish that follows shows whole.
    case Kind::kAbandonSave:
      return "abandon save: " + std::string(CodeName(a.status.code()));
    case Kind::kAbortCollective:
      return "abort collective: " + std::string(CodeName(a.status.code()));
    case Kind::kFinish: {
      // As the loop records the job: succeeded, cancelled or failed.
      if (a.status.ok()) return "finish succeeded " + a.result.dump();
      std::string out =
          std::string(IsCancelled(a.status) ? "finish cancelled: " : "finish failed: ") +
          StatusText(a.status);
      if (!a.result.is_null()) out += " result " + a.result.dump();
      return out;
    }
  }
  return "unknown action";
}

}  // namespace tessera::service
