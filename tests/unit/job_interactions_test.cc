// The jobs' state machines through scripted interactions, as etcd's raft package tests
// its own: each file of tests/unit/testdata/jobs/ is a scenario a reader can follow, its
// events in and the actions the machine returned out (the commands: job_script.h; the
// format: interaction_script.h). A new case is a new file; ctest lists it after the
// next build, the binary finds it at once.
//
// When a machine's output changes on purpose, rewrite the files with what the machines
// return now and review the diff:
//   TESSERA_REWRITE=1 build/bin/job_interactions_test
#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <iostream>

#include "interaction_script.h"
#include "job_script.h"

namespace tessera::service {
namespace {

const char* const kScripts = TESSERA_JOB_SCRIPTS;

class JobInteractions : public ::testing::TestWithParam<std::string> {};

TEST_P(JobInteractions, Replay) {
  JobScript script;
  const testing::ScriptReport report = testing::RunScript(
      GetParam(), [&](testing::ScriptCommand& cmd) { return script.Run(cmd); },
      testing::RewriteRequested());
  // Each failure at its script's line, so that the report points into the file.
  for (const testing::ScriptFailure& f : report.failures) {
    ADD_FAILURE_AT(f.file.c_str(), f.line) << f.message;
  }
  if (report.failures.empty()) {
    EXPECT_GT(report.blocks, 0) << GetParam() << " holds no command";
  }
  if (report.rewritten) std::cout << "rewrote " << GetParam() << "\n";
}

// A test name from the file's: "save_rest_happy_path".
std::string FileName(const ::testing::TestParamInfo<std::string>& info) {
  std::string name = std::filesystem::path(info.param).stem().string();
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
}

INSTANTIATE_TEST_SUITE_P(Files, JobInteractions,
                         ::testing::ValuesIn(testing::ScriptFiles(kScripts)), FileName);

// A wrong path would otherwise run no file and pass.
TEST(JobInteractionFiles, TheFolderHoldsScripts) {
  EXPECT_GE(testing::ScriptFiles(kScripts).size(), 10u) << kScripts;
}

}  // namespace
}  // namespace tessera::service
