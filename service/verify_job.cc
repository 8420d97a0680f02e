// A verify: every chunk of a committed checkpoint read back against its checksum.
#include "service/service.h"
#include "storage/checkpoint_dir.h"
#include "storage/index.h"
#include "storage/thread_pool.h"
#include "storage/verify.h"

namespace tessera::service {

Result<Json> Service::StartVerify(const std::string& mesh, const std::string& step) {
  MutexLock lock(mu_);
  ASSIGN_OR_RETURN(CheckpointRecord * c, FindCommitted(mesh, step));
  JobRecord* job = NewJob("verify", mesh, c->step, Json::object());
  Launch(job->id, &Service::RunVerify);
  return Json{{"job", job->id}, {"checkpoint", c->Summary()}};
}

Status Service::RunVerify(const std::string& job_id) {
  MutexLock lock(mu_);
  JobRecord& job = BeginJob(job_id);
  SetPhase(job_id, "verify");
  const std::string mesh_name = job.mesh;
  const int64_t step = job.step;
  lock.unlock();
  storage::ThreadPool pool(2);
  auto last = std::chrono::steady_clock::now();
  auto dir = storage::CommittedDir(env_, options_.checkpoint_root, mesh_name, step);
  auto report = !dir.ok() ? Result<storage::VerifyReport>(dir.status())
                          : storage::VerifyCheckpoint(env_, *dir, &pool, [&](uint64_t done, uint64_t total) {
    auto now = std::chrono::steady_clock::now();
    if (now - last < std::chrono::milliseconds(100) && done != total) return;
    last = now;
    MutexLock l(mu_);
    JobRecord& j = jobs_.at(job_id);
    j.done_bytes = done;
    j.total_bytes = total;
    PublishJob(j);
  });
  lock.lock();
  Status st = report.status();
  Json result;
  if (report.ok()) {
    result = report->ToJson();
    if (!report->ok()) {
      std::string first = report->problems.empty()
                              ? "tensor '" + report->bad_chunks[0].tensor + "' in " +
                                    report->bad_chunks[0].file + " at offset " +
                                    std::to_string(report->bad_chunks[0].offset)
                              : report->problems[0];
      st = DataLoss("checkpoint is corrupt: " + std::to_string(report->bad_chunks.size()) +
                        " bad chunks, " + std::to_string(report->problems.size()) +
                        " problems; first: " + first,
                    {{"bad_chunks", result["bad_chunks"]}, {"problems", result["problems"]}});
    }
  }
  FinishJob(job_id, st, result);
  return st;
}

}  // namespace tessera::service
