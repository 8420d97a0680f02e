// The fault loops over chains of incremental saves (docs/semantics.md, "Incremental
// checkpoints"), on the path tesserad takes (save_fault_fixture.h). Each round: a full
// save, an incremental one that refers to the first's file for the unchanged tensor "r",
// then, with the Nth I/O failing (or the power going after it): a third save (which
// refers to the first's file too), the deletes of the first two (the first is retired:
// later ones use its file) and a garbage collection. Every committed checkpoint then
// restores bit for bit, and after a collection the shard files on disk are exactly those
// the committed checkpoints refer to.
#include <set>

#include "storage/chunk_ref.h"
#include "storage/index.h"
#include "tests/unit/save_fault_fixture.h"

namespace tessera::service {
namespace {

using testing::SaveFaults;
using testing::State;

class IncrementalFaults : public SaveFaults {
 protected:
  const State a_{1, 9}, b_{2, 9}, c_{3, 9};  // "r" never changes

  const State& StateOf(int64_t step) const {
    return step % 10 == 1 ? a_ : step % 10 == 2 ? b_ : c_;
  }

  // A round's steps before the fault: its first save (full) and its second (incremental).
  void Prefix(int64_t s) {
    Serve(a_, /*incremental=*/true);
    ASSERT_EQ(Save(s + 1, /*full=*/true)["state"], "succeeded");
    WaitForBases(s + 1);
    Serve(b_, true);
    Json second = Save(s + 2);
    ASSERT_EQ(second["state"], "succeeded") << second.dump();
    auto listed = service_->GetCheckpoint("m", std::to_string(s + 2));
    ASSERT_TRUE(listed.ok());
    EXPECT_GT((*listed).value("referenced_bytes", 0), 0) << "the second save wrote r again";
    WaitForBases(s + 2);
    Serve(c_, true);
  }

  // The round's operations in order, to the first that fails; true when all succeeded.
  bool Operations(int64_t s) {
    Json third = Save(s + 3);
    if (third.is_null() || third["state"] != "succeeded") return false;
    if (!service_->DeleteCheckpoint("m", std::to_string(s + 1)).ok()) return false;
    if (!service_->DeleteCheckpoint("m", std::to_string(s + 2)).ok()) return false;
    return service_->CollectGarbage().ok();
  }

  // Every step of the round that the root holds is whole; the collector then leaves
  // exactly the shard files that committed checkpoints refer to.
  void ExpectConsistent(int64_t s, const std::string& when) {
    for (int64_t step = s + 1; step <= s + 3; ++step) {
      if (storage::CommittedDir(&env_, opts_.checkpoint_root, "m", step).ok()) {
        ExpectWhole(step, StateOf(step), when + ", step " + std::to_string(step));
      }
    }
    CollectUntilNoLeftovers(when);
    ExpectOnlyReferenced(when);
  }

  // Deletes what is left of the round: nothing of it may stay on disk.
  void Clear(int64_t s, const std::string& when) {
    for (int64_t step = s + 3; step > s; --step) {
      Status st = service_->DeleteCheckpoint("m", std::to_string(step));
      EXPECT_TRUE(st.ok() || st.code() == Code::kNotFound)
          << when << ": " << st.ToString() << " "
          << [&] {
               auto job = service_->GetJob(st.details().value("job", ""), 0);
               return job.ok() ? job->dump() : job.status().ToString();
             }();
    }
    CollectUntilNoLeftovers(when);
    auto names = env_.ListDir(storage::MeshDir(opts_.checkpoint_root, "m"));
    ASSERT_TRUE(names.ok()) << when;
    for (const std::string& n : *names) {
      EXPECT_FALSE(n.starts_with("step-") || n[0] == '.') << when << ": left " << n;
    }
  }
};

TEST_F(IncrementalFaults, EveryFailingIoOfAChainLeavesEveryCheckpointWhole) {
  int failed = 0;
  // Every other I/O, to keep the loop short: each round sets its chain up again.
  for (uint64_t n = 1; n < 2000; n += 2) {
    const int64_t s = 10 * static_cast<int64_t>(n);
    Prefix(s);
    if (HasFatalFailure()) return;
    env_.FailAt(n, n % 4 == 1 ? storage::FaultEnv::Kind::kIoError : storage::FaultEnv::Kind::kNoSpace);
    const bool done = Operations(s);
    const bool fired = env_.fired();
    env_.Reset();
    const std::string when = "I/O " + std::to_string(n) + " failing";
    ExpectConsistent(s, when);
    Clear(s, when);
    if (HasFatalFailure()) return;
    if (!fired) break;  // past the last I/O of the round
    failed += done ? 0 : 1;  // (a job's record in the catalog may fail alone: logged)
  }
  EXPECT_GT(failed, 10) << "the round's I/O did not go through the Env";
}

TEST_F(IncrementalFaults, PowerLossAfterAnyIoOfAChainKeepsEveryCheckpointWhole) {
  int crashed = 0;
  for (uint64_t n = 1; n < 2000; n += 3) {
    const int64_t s = 10 * static_cast<int64_t>(n);
    Prefix(s);
    if (HasFatalFailure()) return;
    env_.FailAt(n, storage::FaultEnv::Kind::kIoError, /*sticky=*/true);
    (void)Operations(s);
    const bool fired = env_.fired();
    LosePowerAndRestart();
    ASSERT_NE(service_, nullptr);
    const std::string when = "power lost at I/O " + std::to_string(n);
    ExpectConsistent(s, when);
    Clear(s, when);
    if (HasFatalFailure()) return;
    if (!fired) break;
    ++crashed;
  }
  EXPECT_GT(crashed, 8);
}

}  // namespace
}  // namespace tessera::service
