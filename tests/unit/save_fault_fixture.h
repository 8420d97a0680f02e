// The fault loops' harness over the path tesserad takes (save_fault_test.cc,
// incremental_fault_test.cc): a Service whose checkpoint root and catalog go through a
// FaultEnv, and three workers in the process that answer their snapshot tasks as agents
// do on a shared file system: they write their shards through the same Env
// (storage::WriteShard) and join the save; with SaveBases, incrementally, as agents do.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <chrono>
#include <memory>
#include <set>
#include <thread>

#include "api/clock.h"
#include "storage/checkpoint_dir.h"
#include "storage/chunk_ref.h"
#include "storage/index.h"
#include "storage/local_checkpoint.h"
#include "storage/rank_writer.h"
#include "storage/save_plan.h"
#include "storage/testing/fault_env.h"
#include "storage/testing/mem_env.h"
#include "storage/verify.h"
#include "tests/unit/eventually.h"
#include "tests/unit/fake_worker.h"
#include "temp_dir.h"
#include "worker/save_bases.h"

namespace tessera::service::testing {

inline constexpr int kRanks = 3;
inline const Mesh kMesh{"m", {{"d", kRanks}}, 1};

// The state every worker holds: "x" sharded over d (4 floats a rank), "r" replicated.
struct State {
  std::string x;  // the global bytes
  std::string r;
  explicit State(uint8_t seed) : State(seed, seed) {}
  // `r` from its own seed: states that share it share r's chunks in incremental saves.
  State(uint8_t x_seed, uint8_t r_seed) : x(kRanks * 16, '\0'), r(24, '\0') {
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<char>(x_seed + 7 * i);
    for (size_t i = 0; i < r.size(); ++i) r[i] = static_cast<char>(r_seed ^ (3 * i));
  }
};

inline const TensorMeta kX{"x", DType::kFloat32, {kRanks * 4}, Layout{{"d"}}};
inline const TensorMeta kR{"r", DType::kFloat32, {6}, Layout{{"unsharded"}}};

inline SnapshotResult SnapshotOf(int64_t rank) {
  SnapshotResult s;
  for (const TensorMeta& m : {kX, kR}) s.tensors.push_back({m, {rank}});
  return s;
}

// What an agent does once it snapshotted `state` for a save of `request.step` (rank
// `rank`, REST save `job`, or "" in the loop): it plans from its snapshot, writes its
// slices through `env` into the step's staging dir (against `base`, when given; `bases`
// hears what it wrote), and joins the save (the Service method the join's route calls).
inline Result<std::pair<int, Json>> WriteAndJoin(Service* service, storage::Env* env, const State& state, int64_t rank,
                         const SaveRequest& request, const std::string& job,
                         std::shared_ptr<const worker::SaveBase> base, worker::SaveBases* bases,
                         const std::string& root) {
  SaveJoinRequest join;
  join.save = request;
  join.worker = "w-" + std::to_string(rank);
  if (!job.empty()) join.job = job;  // none: a save in the loop
  join.snapshot = SnapshotOf(rank);
  const std::vector<TensorMeta> metas = {kR, kX};  // by name, as a snapshot lists them
  std::vector<storage::SliceToWrite> slices;
  for (const auto& p : storage::PlanSave(kMesh, metas)) {
    if (p.rank != rank) continue;
    const bool sharded = metas[p.tensor].name == "x";
    const std::string& global = sharded ? state.x : state.r;
    const size_t offset = static_cast<size_t>(p.slice.offsets[0]) * 4;
    slices.push_back({metas[p.tensor], p.slice, global.data() + offset, p.bytes, nullptr});
  }
  for (auto& s : slices) s.base = base ? base->Find(s.tensor, s.slice) : nullptr;
  const std::string staging = storage::StagingDir(root, "m", request.step, storage::kSaveStagingId);
  Result<storage::ShardWritten> w = storage::ShardWritten{};
  if (!slices.empty()) {
    Status made = env->CreateDirs(staging);
    // A tag of its own per step: an incremental save refers to the files of earlier ones.
    w = made.ok() ? storage::WriteShard(env, staging,
                                        storage::ShardFileName(rank, "t" + std::to_string(request.step)),
                                        slices, storage::ShardOptions{})
                  : Result<storage::ShardWritten>(made);
  }
  if (w.ok()) {
    join.written = SaveWritten{w->raw_bytes, w->stored_bytes, storage::FragmentToJson(w->fragment), 0,
                               std::nullopt};
    if (w->reused_bytes > 0) {
      join.written->base = base->step;
      join.written->reused_bytes = w->reused_bytes;
    }
    if (bases) {
      bases->Wrote("m", request.step, storage::SaveDirName(env, root, request.step), w->fragment,
                   base.get());
    }
  } else {
    join.error = w.status();
  }
  return service->JoinSave("m", join);
}

// What an agent does with a save's snapshot task: WriteAndJoin against its base (when it
// keeps `bases`). No report: the join is the answer.
inline Json Answer(Service* service, storage::Env* env, const State& state, const Json& task_json,
                   worker::SaveBases* bases = nullptr, const std::string& root = "") {
  auto task = TaskFromJson(task_json);
  if (!task.ok()) return TaskReportToJson({ReportState::kFailed, 0, 0, nullptr, task.status()});
  if (task->kind != TaskKind::kSnapshot) return Json();
  SaveRequest request;
  request.step = task->step;
  request.compress = task->compress;
  request.full = task->full;
  request.full_every = task->full_every;
  std::shared_ptr<const worker::SaveBase> base = bases ? bases->For("m", request) : nullptr;
  (void)WriteAndJoin(service, env, state, task->rank, request, task->job, std::move(base), bases,
                     root);
  return Json();
}

class SaveFaults : public ::testing::Test {
 protected:
  void SetUp() override {
    opts_.data_dir = tmp_.path() + "/data";  // the catalog's bytes stay on disk (SQLite in place)
    ASSERT_EQ(::mkdir(opts_.data_dir.c_str(), 0700), 0);
    opts_.checkpoint_root = "/root";
    opts_.job_timeout_ms = 20000;
    ASSERT_TRUE(mem_.CreateDirs(opts_.data_dir).ok());
    Open();
    for (int r = 0; r < kRanks; ++r) {
      ASSERT_TRUE(service_->RegisterWorker({{"name", std::to_string(r)}, {"local_port", 1}}).ok());
    }
    ASSERT_TRUE(service_->PutMesh("m", {{"axes", {{{"name", "d"}, {"size", kRanks}}}},
                                        {"self_test", false}})
                    .ok());
  }
  void TearDown() override {
    Close();
  }
  void Open() {
    auto s = Service::Create(opts_, &env_);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    service_ = std::move(*s);
  }
  void Close() {
    workers_.clear();
    service_.reset();
  }
  // The power goes: what was not synced is lost, and tesserad starts again on the rest.
  void LosePowerAndRestart() {
    Close();
    env_.Reset();
    mem_.SimulateCrash();
    Open();
  }
  // The workers answer for `state` from now on; incrementally when `incremental`, each
  // with its SaveBases (kept across Serve calls, as an agent's across saves).
  void Serve(const State& state, bool incremental = false) {
    workers_.clear();
    if (bases_.empty()) {
      for (int r = 0; r < kRanks; ++r) bases_.push_back(std::make_unique<worker::SaveBases>());
    }
    for (int r = 0; r < kRanks; ++r) {
      worker::SaveBases* bases = incremental ? bases_[r].get() : nullptr;
      workers_.push_back(std::make_unique<FakeWorker>(
          service_.get(), "w-" + std::to_string(r),
          [this, &state, bases](const Json& task) {
            return Answer(service_.get(), &env_, state, task, bases, opts_.checkpoint_root);
          },
          [bases](const Json& ended) {
            auto t = TaskFromJson(ended);
            if (bases && t.ok()) bases->Ended(t->mesh_name, t->step, t->error.ok());
          },
          bases ? std::function<Json()>([bases] { return bases->Report(); }) : nullptr));
    }
  }
  // Until every worker's incremental saves build on `step` (its save_ended came).
  void WaitForBases(int64_t step) {
    const int64_t deadline = MonoMs() + 30000;
    for (const auto& b : bases_) {
      while (b->BaseStep("m") < step && MonoMs() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      ASSERT_GE(b->BaseStep("m"), step) << "a worker never heard that step " << step << " committed";
    }
  }
  // A save of `step`; the job's end (null when it could not even start).
  Json Save(int64_t step, bool full = false) {
    SaveRequest request;
    request.step = step;
    request.compress = false;
    request.full = full;
    auto started = service_->StartSave("m", request);
    if (!started.ok()) return Json();
    auto job = service_->GetJob(started->value("job", ""), 30000);
    EXPECT_TRUE(job.ok()) << job.status().ToString();
    return job.ok() ? *job : Json();
  }
  // Step `step` is committed, listed, and holds exactly `state`.
  void ExpectWhole(int64_t step, const State& state, const std::string& when) {
    auto dir = storage::CommittedDir(&env_, opts_.checkpoint_root, "m", step);
    ASSERT_TRUE(dir.ok()) << when << ": " << dir.status().ToString();
    auto report = storage::VerifyCheckpoint(&env_, *dir);
    ASSERT_TRUE(report.ok() && report->ok()) << when;
    auto x = storage::ReadSlice(&env_, *dir, "x", FullSlice(kX.shape));
    auto r = storage::ReadSlice(&env_, *dir, "r", FullSlice(kR.shape));
    ASSERT_TRUE(x.ok() && r.ok()) << when;
    EXPECT_EQ(*x, state.x) << when;
    EXPECT_EQ(*r, state.r) << when;
    auto listed = service_->GetCheckpoint("m", std::to_string(step));
    ASSERT_TRUE(listed.ok()) << when;
    EXPECT_EQ((*listed)["state"], "committed") << when;
  }
  // Step `step` is nowhere: not committed, not listed as committed, no staging left
  // once the garbage collector has run.
  void ExpectAbsent(int64_t step, const std::string& when) {
    EXPECT_EQ(storage::CommittedDir(&env_, opts_.checkpoint_root, "m", step).status().code(),
              Code::kNotFound)
        << when;
    auto listed = service_->GetCheckpoint("m", std::to_string(step));
    if (listed.ok()) {
      EXPECT_NE((*listed)["state"], "committed") << when;
    }
    CollectUntilNoLeftovers(when);
  }

  // Collects until the mesh's dir holds no leftover (no name starting with '.'). A
  // worker still writing for a save that already failed can make its staging dir again
  // after a collection (its join is then refused); the next collection takes it.
  void CollectUntilNoLeftovers(const std::string& when) {
    const std::string mesh_dir = storage::MeshDir(opts_.checkpoint_root, "m");
    std::string left;
    EXPECT_TRUE(::tessera::testing::Eventually([&] {
      if (!service_->CollectGarbage().ok()) return false;
      auto names = env_.ListDir(mesh_dir);
      if (!names.ok()) return false;
      left.clear();
      for (const auto& n : *names) {
        if (n[0] == '.') left = n;
      }
      return left.empty();
    })) << when << ": " << left << " stayed through collections";
  }

  // The shard files on disk are exactly those the committed checkpoints refer to.
  void ExpectOnlyReferenced(const std::string& when) {
    const std::string mesh_dir = storage::MeshDir(opts_.checkpoint_root, "m");
    std::set<std::string> referenced;
    auto steps = storage::ListSteps(&env_, opts_.checkpoint_root, "m");
    ASSERT_TRUE(steps.ok()) << when;
    for (int64_t step : *steps) {
      auto dir = storage::CommittedDir(&env_, opts_.checkpoint_root, "m", step);
      ASSERT_TRUE(dir.ok()) << when;
      auto index = storage::CheckpointIndex::Open(&env_, *dir);
      ASSERT_TRUE(index.ok()) << when << ": " << index.status().ToString();
      for (const auto& f : index->files()) referenced.insert(storage::JoinPath(*dir, f));
      for (const auto& f : index->referenced_files()) {
        referenced.insert(storage::ResolveChunkFile(*dir, f));
      }
    }
    std::set<std::string> on_disk;
    auto names = env_.ListDir(mesh_dir);
    ASSERT_TRUE(names.ok()) << when;
    for (const std::string& n : *names) {
      EXPECT_NE(n[0], '.') << when << ": " << n;
      const std::string dir = storage::JoinPath(mesh_dir, n);
      if (!env_.IsDirectory(dir)) continue;
      auto files = env_.ListDir(dir);
      ASSERT_TRUE(files.ok()) << when;
      for (const std::string& f : *files) {
        if (f.ends_with(".tsr")) on_disk.insert(storage::JoinPath(dir, f));
      }
    }
    EXPECT_EQ(on_disk, referenced) << when;
  }

  ::tessera::testing::TempDir tmp_{"tessera_save_faults"};  // goes last
  ServiceOptions opts_;
  storage::MemEnv mem_;
  storage::FaultEnv env_{&mem_};
  std::unique_ptr<Service> service_;
  std::vector<std::unique_ptr<worker::SaveBases>> bases_;
  std::vector<std::unique_ptr<FakeWorker>> workers_;  // destroyed first: it calls the others
};

}  // namespace tessera::service::testing
