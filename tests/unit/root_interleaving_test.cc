// Interleavings of the changes of one mesh's checkpoints in the root (docs/semantics.md,
// S9), through the seam of the root's Env: one operation is paused at one of its steps
// (FaultEnv's hook) while another runs, then let go. Whatever the order, every checkpoint
// listed as committed restores bit for bit, and what a retention or delete reports is
// what happened. On the path tesserad takes (save_fault_fixture.h: the Service with three
// in-process workers that write incrementally, as agents do).
#include <atomic>
#include <future>
#include <string>

#include "tests/unit/eventually.h"
#include "tests/unit/save_fault_fixture.h"

namespace tessera::service {
namespace {

using storage::FaultEnv;
using testing::SaveFaults;
using testing::State;
using ::tessera::testing::Eventually;

// Holds the first mutating operation that `match` picks until Release(): its thread waits
// in the Env, in the middle of whatever it was doing. The hook owns what it uses, so an
// operation that comes after the Pause is gone finds nothing to wait for.
class Pause {
 public:
  using Match = std::function<bool(FaultEnv::Op, const std::string&)>;
  Pause(FaultEnv* env, Match match) : env_(env), gate_(std::make_shared<Gate>()) {
    gate_->match = std::move(match);
    env_->SetHook([gate = gate_](FaultEnv::Op op, const std::string& path) { gate->Hold(op, path); });
  }
  ~Pause() {
    env_->SetHook(nullptr);
    Release();
  }
  // True once an operation is held (false after the test's patience ran out).
  bool WaitHeld() {
    MutexLock lock(gate_->mu);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!gate_->held) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      gate_->cv.WaitFor(gate_->mu, std::chrono::milliseconds(50));
    }
    return true;
  }
  void Release() {
    {
      MutexLock lock(gate_->mu);
      gate_->released = true;
    }
    gate_->cv.NotifyAll();
  }

 private:
  struct Gate {
    Match match;
    Mutex mu;
    CondVar cv;
    bool held GUARDED_BY(mu) = false;
    bool released GUARDED_BY(mu) = false;
    void Hold(FaultEnv::Op op, const std::string& path) {
      MutexLock lock(mu);
      if (held || released || !match(op, path)) return;
      held = true;
      cv.NotifyAll();
      while (!released) cv.Wait(mu);
    }
  };
  FaultEnv* env_;
  std::shared_ptr<Gate> gate_;
};

bool Removing(FaultEnv::Op op, const std::string& path, const std::string& what) {
  return op == FaultEnv::Op::kDelete && path.find(what) != std::string::npos;
}

class RootInterleavings : public SaveFaults {
 protected:
  // x changes from a to b, r never does: b's saves refer to a's file for r.
  const State zero_{7, 3}, a_{1, 9}, b_{2, 9};

  void SetPolicy(int64_t keep_last, int64_t every) {
    auto set = service_->PutRetention("m", {{"keep_last", keep_last}, {"keep_every_n_steps", every}});
    ASSERT_TRUE(set.ok()) << set.status().ToString();
  }
  void SaveOk(int64_t step, const State& state, bool full) {
    Serve(state, /*incremental=*/true);
    Json job = Save(step, full);
    ASSERT_EQ(job["state"], "succeeded") << job.dump();
    WaitForBases(step);
  }
  // `first` runs until the operation `held` picks and is held there, while a save of
  // `step` runs as far as it can (to its end, or to the root turn `first` holds); then both
  // finish. The save's job; `first` succeeded.
  Json SaveWhileHeld(Pause::Match held, const std::function<Status()>& first, int64_t step,
                     bool full = false) {
    Pause pause(&env_, std::move(held));
    auto done = std::async(std::launch::async, first);
    EXPECT_TRUE(pause.WaitHeld());
    auto saved = std::async(std::launch::async, [&] { return Save(step, full); });
    WaitQueuedOrDone(saved);
    pause.Release();
    Status st = done.get();
    EXPECT_TRUE(st.ok()) << st.ToString();
    return saved.get();
  }
  // `step` holds `state` (after `when`), and still does after a collection, which leaves
  // exactly the files committed checkpoints refer to.
  void ExpectWholeThroughACollection(int64_t step, const State& state, const std::string& when) {
    ExpectWhole(step, state, when);
    ASSERT_TRUE(service_->CollectGarbage().ok()) << when;
    ExpectWhole(step, state, when + ", then a collection");
    ExpectOnlyReferenced(when + ", then a collection");
  }
  // Until `done` or another writer of the mesh's root waits for the held one's turn.
  void WaitQueuedOrDone(const std::future<Json>& done) {
    ASSERT_TRUE(Eventually([&] {
      return done.wait_for(std::chrono::seconds(0)) == std::future_status::ready ||
             service_->RootTurnsQueued("m") >= 2;
    }));
  }
};

// A delete's sweep decides from the references it read; a save that commits meanwhile
// refers to its base's own files, and its retention retires that base. Swept with what
// the delete read, the base's files would go, and the new checkpoint with them.
TEST_F(RootInterleavings, ADeletesSweepNeverRemovesFilesACommitMeanwhileReferredTo) {
  SetPolicy(/*keep_last=*/1, /*every=*/100);  // step 0 stays; the rest keep one
  SaveOk(0, zero_, /*full=*/true);
  SaveOk(1, a_, true);
  SaveOk(2, b_, false);  // refers to step 1's r; retention retires step 1
  Serve(b_, true);       // step 3 changes nothing: it refers to step 2's x and step 1's r

  // The delete of step 0 (nothing refers to it: removed whole) is held after it read the
  // live references, at the removal of its dir, before its sweep.
  Json job = SaveWhileHeld(
      [](FaultEnv::Op op, const std::string& path) { return Removing(op, path, "/.deleting-0-"); },
      [&] { return service_->DeleteCheckpoint("m", "0"); }, 3);
  ASSERT_EQ(job["state"], "succeeded") << job.dump();
  EXPECT_EQ(storage::CommittedDir(&env_, opts_.checkpoint_root, "m", 2).status().code(),
            Code::kNotFound)
      << "retention kept step 2";
  ExpectWholeThroughACollection(3, b_, "after the delete's sweep");
}

// The collector's sweep reads the retired dirs and the references; a commit and its
// retention meanwhile retire the base the commit refers to.
TEST_F(RootInterleavings, TheCollectorsSweepNeverRemovesFilesACommitMeanwhileReferredTo) {
  SetPolicy(1, 0);
  SaveOk(1, a_, true);
  SaveOk(2, b_, false);  // step 1 retired: step 2 refers to its r
  // A leftover for the collector to remove first: it is held there, mid-collection.
  ASSERT_TRUE(env_.CreateDirs(storage::StagingDir(opts_.checkpoint_root, "m", 1, "gone")).ok());
  Serve(b_, true);
  Json job = SaveWhileHeld(
      [](FaultEnv::Op op, const std::string& path) {
        return (op == FaultEnv::Op::kDelete || op == FaultEnv::Op::kRename) &&
               path.find(".staging-1-gone") != std::string::npos;
      },
      [&] { return service_->CollectGarbage().status(); }, 3);
  ASSERT_EQ(job["state"], "succeeded") << job.dump();
  ExpectWholeThroughACollection(3, b_, "after the collection");
}

// Retention chooses its steps in the turn that deletes them: a REST delete of one of them
// that came first is seen, not met half-way (a 404 from the retention's PUT before).
TEST_F(RootInterleavings, RetentionAfterADeleteOfOneOfItsStepsPrunesTheRestWithoutError) {
  SaveOk(1, a_, true);
  SaveOk(2, b_, true);
  SaveOk(3, a_, true);
  Pause pause(&env_, [](FaultEnv::Op op, const std::string& path) {
    return Removing(op, path, "/.deleting-1-");
  });
  auto deleted = std::async(std::launch::async, [&] { return service_->DeleteCheckpoint("m", "1"); });
  ASSERT_TRUE(pause.WaitHeld());
  auto retained = std::async(std::launch::async, [&] {
    auto r = service_->PutRetention("m", {{"keep_last", 1}});
    return r.ok() ? Json() : ErrorBody(r.status());
  });
  ASSERT_TRUE(Eventually([&] {
    return retained.wait_for(std::chrono::seconds(0)) == std::future_status::ready ||
           service_->RootTurnsQueued("m") >= 2;
  }));
  pause.Release();
  ASSERT_TRUE(deleted.get().ok());
  Json error = retained.get();
  EXPECT_TRUE(error.is_null()) << error.dump();
  EXPECT_EQ(*storage::ListSteps(&env_, opts_.checkpoint_root, "m"), std::vector<int64_t>{3});
  ExpectWhole(3, a_, "after retention");
}

// A commit whose retention prunes a step a REST delete is removing: the save's result
// carries no retention error, and retention does not prune past its policy.
TEST_F(RootInterleavings, ACommitsRetentionAfterADeleteOfItsStepKeepsThePolicy) {
  SetPolicy(2, 0);
  SaveOk(1, a_, true);
  SaveOk(2, b_, true);
  Serve(a_, true);
  Json job = SaveWhileHeld(
      [](FaultEnv::Op op, const std::string& path) { return Removing(op, path, "/.deleting-2-"); },
      [&] { return service_->DeleteCheckpoint("m", "2"); }, 3, /*full=*/true);
  ASSERT_EQ(job["state"], "succeeded") << job.dump();
  EXPECT_FALSE(job["result"].contains("retention_error")) << job.dump();
  // Deleted 2 first, then 3 committed: keep_last 2 keeps 1 and 3.
  EXPECT_EQ(*storage::ListSteps(&env_, opts_.checkpoint_root, "m"), (std::vector<int64_t>{1, 3}));
}

// A save whose snapshot came before its workers heard of the commit before it builds on
// the one before that. That commit's retention waits for the workers' word (their polls'
// reports) and keeps the older base while the save is in flight; the save commits, and
// its own retention prunes both (before, it failed `conflict`: its base was gone).
TEST_F(RootInterleavings, RetentionKeepsTheBaseOfASaveInFlight) {
  SetPolicy(1, 0);
  SaveOk(1, a_, true);
  // Step 3's snapshot, in the loop, before step 2 is saved: each worker builds on step 1.
  SaveRequest three;
  three.step = 3;
  three.compress = false;
  three.wait_for_trainer = true;  // as a trainer's save in the loop asks
  std::vector<std::shared_ptr<const worker::SaveBase>> early;
  for (int r = 0; r < testing::kRanks; ++r) {
    early.push_back(bases_[r]->For("m", three));
    ASSERT_NE(early.back(), nullptr);
    ASSERT_EQ(early.back()->step, 1);
  }
  SaveOk(2, b_, false);  // x changed: only step 2's r refers to step 1
  EXPECT_EQ(*storage::ListSteps(&env_, opts_.checkpoint_root, "m"), (std::vector<int64_t>{1, 2}))
      << "retention took the base of a save in flight";
  // Step 3's workers write (x back to a: every chunk is step 1's) and join now.
  for (int r = 0; r < testing::kRanks; ++r) {
    auto joined = testing::WriteAndJoin(service_.get(), &env_, a_, r, three, "", early[r],
                                        bases_[r].get(), opts_.checkpoint_root);
    ASSERT_TRUE(joined.ok()) << "rank " << r << ": " << joined.status().ToString();
  }
  std::string job;
  ASSERT_TRUE(Eventually([&] {
    auto c = service_->GetCheckpoint("m", "3");
    if (c.ok()) job = c->value("job", "");
    return !job.empty();
  }));
  auto ended = service_->GetJob(job, 30000);
  ASSERT_TRUE(ended.ok());
  ASSERT_EQ((*ended)["state"], "succeeded") << ended->dump();
  EXPECT_EQ(*storage::ListSteps(&env_, opts_.checkpoint_root, "m"), std::vector<int64_t>{3});
  ExpectWholeThroughACollection(3, a_, "after its commit");
}

// A delete whose change of the root landed but whose sync failed: the step is gone from
// the root, so the catalog and memory say so too (they said committed before).
TEST_F(RootInterleavings, ADeleteWhoseRenameLandedButWhoseSyncFailedIsADelete) {
  SaveOk(1, a_, true);
  SaveOk(2, b_, true);
  std::atomic<bool> renamed{false};
  env_.SetHook([&](FaultEnv::Op op, const std::string& path) {
    if (op == FaultEnv::Op::kRename && path.find("/step-1") != std::string::npos) renamed = true;
  });
  // The rename is the next mutating I/O of the delete, its directory's sync the one after.
  env_.FailAt(2, FaultEnv::Kind::kIoError);
  Status st = service_->DeleteCheckpoint("m", "1");
  env_.SetHook(nullptr);
  env_.Reset();
  ASSERT_TRUE(renamed);
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(storage::CommittedDir(&env_, opts_.checkpoint_root, "m", 1).status().code(),
            Code::kNotFound);
  EXPECT_EQ(service_->GetCheckpoint("m", "1").status().code(), Code::kNotFound);
  ExpectWholeThroughACollection(2, b_, "after the delete");
}

}  // namespace
}  // namespace tessera::service
