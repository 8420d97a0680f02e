#include "service/safetensors_machines.h"

#include <algorithm>
#include <numeric>

namespace tessera::service {

std::map<int64_t, std::vector<size_t>> SpreadOverRanks(const std::vector<uint64_t>& bytes, int64_t ranks) {
  std::map<int64_t, std::vector<size_t>> out;
  if (ranks < 1) return out;
  std::vector<uint64_t> load(static_cast<size_t>(ranks), 0);
  std::vector<size_t> order(bytes.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return bytes[a] > bytes[b]; });
  for (size_t i : order) {
    const auto r = static_cast<int64_t>(std::min_element(load.begin(), load.end()) - load.begin());
    out[r].push_back(i);
    load[static_cast<size_t>(r)] += bytes[i];
  }
  for (auto& [r, items] : out) std::sort(items.begin(), items.end());
  return out;
}

namespace {

template <typename T>
std::vector<uint64_t> SizesOf(const std::vector<T>& files) {
  std::vector<uint64_t> out;
  for (const auto& f : files) out.push_back(f.bytes);
  return out;
}

}  // namespace

// --- export ---

ExportMachine::ExportMachine(JobSpec spec, std::vector<storage::ExportFile> files, std::string out_dir)
    : JobMachine(std::move(spec)), files_(std::move(files)), out_dir_(std::move(out_dir)) {}

Result<JobActions> ExportMachine::OnStart(int64_t) {
  return JobActions{SetPhase("plan"), RunIo(IoKind::kFindCommitted)};
}

Result<JobActions> ExportMachine::OnIoDone(int64_t now, Json result) {
  if (written_) {
    Json files = Json::array();
    uint64_t bytes = 0;
    for (const auto& f : files_) {
      files.push_back(f.name);
      bytes += f.bytes;
    }
    return JobActions{Finish({{"dir", out_dir_},
                              {"files", files},
                              {"index", storage::kSafetensorsIndexFile},
                              {"bytes", bytes}})};
  }
  std::map<int64_t, Task> tasks;
  uint64_t total = 0;
  for (const auto& [rank, items] : SpreadOverRanks(SizesOf(files_), spec_.mesh.mesh.num_workers())) {
    Task& t = tasks[rank] = MeshTask(TaskKind::kExport, spec_.mesh.mesh, rank);
    t.dir = result.value("dir", "");
    t.out_dir = out_dir_;
    for (size_t i : items) {
      t.files.push_back({files_[i].name, files_[i].tensors});
      total += files_[i].bytes;
    }
  }
  if (tasks.empty()) return OnTasksDone(now, {});
  return JobActions{SetPhase("write"), QueueTasks(std::move(tasks), total, now, spec_.task_timeout_ms)};
}

Result<JobActions> ExportMachine::OnTasksDone(int64_t, std::map<int64_t, Json> results) {
  for (const auto& [rank, res] : results) {
    auto wrote = ExportResultFromJson(res);
    if (!wrote.ok()) return wrote.status().WithContext("the export of worker " + spec_.mesh.workers.at(rank));
  }
  written_ = true;
  JobAction index = RunIo(IoKind::kWriteExportIndex);
  Json files = Json::array();
  for (const auto& f : files_) files.push_back({{"name", f.name}, {"tensors", f.tensors}, {"bytes", f.bytes}});
  index.io_input = {{"dir", out_dir_}, {"files", std::move(files)}};
  return JobActions{SetPhase("index"), std::move(index)};
}

// --- import ---

ImportMachine::ImportMachine(JobSpec spec, SaveRequest request, std::string source)
    : JobMachine(std::move(spec)), request_(std::move(request)), source_(std::move(source)) {}

Result<JobActions> ImportMachine::OnStart(int64_t) {
  JobAction read = RunIo(IoKind::kReadSafetensors);
  read.io_input = {{"source", source_}};
  return JobActions{SetPhase("plan"), std::move(read)};
}

Result<JobActions> ImportMachine::OnIoDone(int64_t now, Json result) {
  switch (stage_) {
    case Stage::kPlan: {
      const Json files = result.value("files", Json::array());
      for (const Json& f : files) {
        File file;
        file.path = f.value("path", "");
        file.bytes = f.value("bytes", uint64_t{0});
        for (const Json& tj : f.value("tensors", Json::array())) {
          ASSIGN_OR_RETURN(TensorMeta meta, TensorMetaFromJson(tj));
          RETURN_IF_ERROR(ValidateLayout(spec_.mesh.mesh, meta.layout, meta.shape).WithContext("tensor '" + meta.name + "' of " + file.path));
          file.tensors.push_back(std::move(meta));
        }
        files_.push_back(std::move(file));
      }
      stage_ = Stage::kStaging;
      return JobActions{RunIo(IoKind::kCreateStaging)};
    }
    case Stage::kStaging: {
      std::map<int64_t, Task> writes;
      uint64_t total = 0;
      for (const auto& [rank, items] : SpreadOverRanks(SizesOf(files_), spec_.mesh.mesh.num_workers())) {
        Task& t = writes[rank] = MeshTask(TaskKind::kImport, spec_.mesh.mesh, rank);
        t.step = spec_.step;
        t.staging = spec_.staging;
        t.compress = request_.compress;
        t.level = request_.level;
        for (size_t i : items) {
          t.sources.push_back(files_[i].path);
          t.tensors.insert(t.tensors.end(), files_[i].tensors.begin(), files_[i].tensors.end());
          total += files_[i].bytes;
        }
      }
      stage_ = Stage::kWrite;
      return WriteRound(std::move(writes), total, now);
    }
    case Stage::kMerge:
      stage_ = Stage::kCommit;
      return CommitStep({});
    case Stage::kCommit:
      return JobActions{Finish(std::move(result))};
    case Stage::kWrite:
      break;
  }
  return Internal("import job " + spec_.id + ": an I/O step ended in a stage without one");
}

Result<JobActions> ImportMachine::OnTasksDone(int64_t, std::map<int64_t, Json> results) {
  stage_ = Stage::kMerge;
  return MergeWritten(results, "import");
}

JobActions ImportMachine::OnFailure(const Status& st) {
  return {Cleanup(JobAction::Kind::kAbandonSave, st)};
}

}  // namespace tessera::service
