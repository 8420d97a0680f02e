// The fault loops over the path tesserad takes: a Service whose checkpoint root and
// catalog go through a FaultEnv, and three workers in the process that answer their
// snapshot tasks as agents do on a shared file system: they write their shards through
// the same Env (storage::WriteShard) and join the save. Every I/O of a save, in turn, fails once (EIO or ENOSPC), or
// the power goes after it (MemEnv's crash model) and tesserad starts again. Each
// time: the checkpoint committed before is whole, the new one is either whole and
// listed or absent, and the garbage collector leaves no staging behind.
#include "service/catalog.h"
#include "tests/unit/save_fault_fixture.h"

namespace tessera::service {
namespace {

using testing::SaveFaults;
using testing::State;

TEST_F(SaveFaults, EveryFailingIoOfTesseradsSaveLeavesNothingVisible) {
  const State before(1), after(2);
  Serve(before);
  ASSERT_EQ(Save(1)["state"], "succeeded") << Save(1).dump();
  Serve(after);
  int failed = 0;
  for (uint64_t n = 1; n < 2000; ++n) {
    const int64_t step = 100 + static_cast<int64_t>(n);
    env_.FailAt(n, n % 2 ? storage::FaultEnv::Kind::kIoError : storage::FaultEnv::Kind::kNoSpace);
    Json job = Save(step);
    const bool fired = env_.fired();
    env_.Reset();
    const std::string when = "I/O " + std::to_string(n) + " failing";
    ExpectWhole(1, before, when);
    if (!job.is_null() && job["state"] == "succeeded") {
      ExpectWhole(step, after, when);
      if (!fired) break;  // past the last I/O of a save
    } else {
      ++failed;
      EXPECT_TRUE(fired) << when << ": " << job.dump();
      ExpectAbsent(step, when);
    }
  }
  EXPECT_GT(failed, 20) << "the save's I/O did not go through the Env";
}

TEST_F(SaveFaults, PowerLossAfterAnyIoOfTesseradsSaveKeepsCheckpointsWhole) {
  const State before(1), after(2);
  Serve(before);
  ASSERT_EQ(Save(1)["state"], "succeeded");
  int crashed = 0;
  int recovered = 0;  // jobs the restart found committed, though they ended otherwise before
  for (uint64_t n = 1; n < 2000; n += 3) {
    const int64_t step = 100 + static_cast<int64_t>(n);
    Serve(after);
    // From the Nth I/O on, nothing reaches the disk: the power is gone.
    env_.FailAt(n, storage::FaultEnv::Kind::kIoError, /*sticky=*/true);
    Json job = Save(step);
    const bool fired = env_.fired();
    LosePowerAndRestart();
    ASSERT_NE(service_, nullptr);
    const std::string when = "power lost at I/O " + std::to_string(n);
    ExpectWhole(1, before, when);
    // A save reported committed survives the power loss.
    if (!job.is_null() && job["state"] == "succeeded") ExpectWhole(step, after, when);
    if (storage::CommittedDir(&env_, opts_.checkpoint_root, "m", step).ok()) {
      ExpectWhole(step, after, when);
      // The restarted tesserad reports the save's job as it ended: it committed. (A
      // job whose record never reached the disk is not known at all.)
      if (!job.is_null()) {
        auto again = service_->GetJob(job.value("id", ""), 0);
        if (again.ok()) {
          EXPECT_EQ((*again)["state"], "succeeded") << when << ": " << again->dump();
          recovered += (*again)["result"].value("recovered", false) ? 1 : 0;
        }
      }
    } else {
      ExpectAbsent(step, when);
    }
    if (!fired) {
      EXPECT_EQ(job["state"], "succeeded") << when;
      break;
    }
    ++crashed;
  }
  EXPECT_GT(crashed, 5);
  EXPECT_GT(recovered, 0) << "no power loss fell between a commit and its job's end";
}

// A save refused at its start leaves no record anywhere: each I/O of StartSave fails in
// turn (the job's record, then the checkpoint's), and neither memory nor the catalog
// (read through a connection of its own) knows of the job or the step.
TEST_F(SaveFaults, ASaveRefusedAtItsStartLeavesNoRecord) {
  const State state(1);  // the workers answer from it while the test runs
  Serve(state);
  int refused = 0;
  std::set<std::string> tables;  // whose write refused a start
  for (uint64_t n = 1; n < 50; ++n) {
    const int64_t step = 10 + static_cast<int64_t>(n);
    const std::string when = "I/O " + std::to_string(n) + " of the start failing";
    env_.FailAt(n, storage::FaultEnv::Kind::kIoError);
    SaveRequest request;
    request.step = step;
    request.compress = false;
    auto started = service_->StartSave("m", request);
    const bool fired = env_.fired();
    env_.Reset();
    if (started.ok()) {
      auto job = service_->GetJob(started->value("job", ""), 30000);
      ASSERT_TRUE(job.ok()) << when;
      if (!fired) break;  // past the start's I/O
      continue;
    }
    ++refused;
    const std::string message = started.status().message();
    for (const char* table : {"jobs", "checkpoints"}) {
      if (message.find(std::string("catalog ") + table + "/") != std::string::npos) tables.insert(table);
    }
    EXPECT_NE(message.find("catalog"), std::string::npos) << when << ": " << message;
    EXPECT_FALSE(service_->GetCheckpoint("m", std::to_string(step)).ok()) << when;
    auto jobs = service_->ListJobs("", "save", "m", 1000);
    ASSERT_TRUE(jobs.ok()) << when;
    for (const Json& j : Json::parse(jobs->json)) {
      EXPECT_NE(j.value("step", int64_t{-1}), step) << when << ": " << j.dump();
    }
    auto catalog = Catalog::Open(&mem_, opts_.data_dir);
    ASSERT_TRUE(catalog.ok()) << catalog.status().ToString();
    for (const char* table : {"jobs", "checkpoints"}) {
      auto docs = (*catalog)->All(table);
      ASSERT_TRUE(docs.ok()) << when;
      for (const Json& d : *docs) {
        EXPECT_NE(d.value("step", int64_t{-1}), step) << when << ": " << table << " " << d.dump();
      }
    }
  }
  EXPECT_GE(refused, 2) << "neither record of a save's start went through the Env";
  // The job's record is written, and checked, before the step's.
  EXPECT_EQ(tables, (std::set<std::string>{"checkpoints", "jobs"}));
}

}  // namespace
}  // namespace tessera::service
