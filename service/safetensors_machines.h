// The jobs between a checkpoint and safetensors files, as state machines (JobMachine):
//   export  find the committed dir (I/O) → write: a task per rank that has files, each
//           writing its share of the planned files → the weight map (I/O) → done
//   import  read and check the files' headers (I/O) → create the staging dir (I/O)
//           → write: a task per rank that has files, each writing their tensors as its
//           shard + fragment → merge (I/O) → commit (I/O; no cancel from here on) → done.
//           Any failure before the commit abandons the checkpoint, as a save's does.
#pragma once

#include "service/job_machine.h"
#include "storage/safetensors_export.h"

namespace tessera::service {

// The ranks that write each of `bytes` (by item): the largest item first, each to the
// rank with the fewest bytes so far.
std::map<int64_t, std::vector<size_t>> SpreadOverRanks(const std::vector<uint64_t>& bytes, int64_t ranks);

class ExportMachine : public JobMachine {
 public:
  // `files`: planned from the checkpoint's tensors; `out_dir`: where they go.
  ExportMachine(JobSpec spec, std::vector<storage::ExportFile> files, std::string out_dir);

 protected:
  Result<JobActions> OnStart(int64_t now) override;
  Result<JobActions> OnIoDone(int64_t now, Json result) override;
  Result<JobActions> OnTasksDone(int64_t now, std::map<int64_t, Json> results) override;

 private:
  const std::vector<storage::ExportFile> files_;
  const std::string out_dir_;
  bool written_ = false;
};

class ImportMachine : public JobMachine {
 public:
  ImportMachine(JobSpec spec, SaveRequest request, std::string source);

 protected:
  Result<JobActions> OnStart(int64_t now) override;
  Result<JobActions> OnIoDone(int64_t now, Json result) override;
  Result<JobActions> OnTasksDone(int64_t now, std::map<int64_t, Json> results) override;
  JobActions OnFailure(const Status& st) override;

 private:
  enum class Stage { kPlan, kStaging, kWrite, kMerge, kCommit };
  struct File {
    std::string path;
    uint64_t bytes = 0;
    std::vector<TensorMeta> tensors;
  };

  const SaveRequest request_;
  const std::string source_;
  Stage stage_ = Stage::kPlan;
  std::vector<File> files_;
};

}  // namespace tessera::service
