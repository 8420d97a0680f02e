// Rank 0's memory-tier reports (worker/memory_reports.h) against a scripted tesserad:
// an unreachable one gets the newest report once it answers, a refused report is not
// sent again, and a tesserad that lost what it was told gets each mesh's newest
// delivered report again, never an older one.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "api/thread_annotations.h"
#include "eventually.h"
#include "worker/memory_reports.h"

namespace tessera::worker {
namespace {

using testing::Eventually;

// Answers with `answer` and records what it took.
struct FakeTesserad {
  Mutex mu;
  Status answer GUARDED_BY(mu) = Status::Ok();
  std::vector<std::pair<std::string, int64_t>> taken GUARDED_BY(mu);  // (mesh, step) answered ok
  int tries GUARDED_BY(mu) = 0;

  Status Send(const std::string& mesh, const Json& body) {
    MutexLock lock(mu);
    ++tries;
    if (answer.ok()) taken.emplace_back(mesh, body.value("step", int64_t{-1}));
    return answer;
  }
  void Answer(Status st) {
    MutexLock lock(mu);
    answer = std::move(st);
  }
  std::vector<std::pair<std::string, int64_t>> Taken() {
    MutexLock lock(mu);
    return taken;
  }
  int Tries() {
    MutexLock lock(mu);
    return tries;
  }
};

Json Report(int64_t step) { return Json{{"step", step}}; }

TEST(MemoryReports, TheNewestReportReachesATesseradThatWasAwayAndOneThatLostIt) {
  FakeTesserad t;
  MemoryReports reports([&t](const std::string& mesh, const Json& body) { return t.Send(mesh, body); });
  using Taken = std::vector<std::pair<std::string, int64_t>>;
  reports.Post("m", Report(1));
  ASSERT_TRUE(Eventually([&] { return t.Taken() == Taken{{"m", 1}}; }));
  // Away: steps 2 and 3 come; only the newest is delivered once it answers.
  t.Answer(Unavailable("away"));
  reports.Post("m", Report(2));
  ASSERT_TRUE(Eventually([&] { return t.Tries() >= 2; }));
  reports.Post("m", Report(3));
  t.Answer(Status::Ok());
  ASSERT_TRUE(Eventually([&] { return reports.pending() == 0 && t.Taken().size() == 2; }));
  EXPECT_EQ(t.Taken(), (Taken{{"m", 1}, {"m", 3}}));
  // A tesserad that lost it: step 3 again, the newest delivered, for each mesh.
  reports.Post("n", Report(7));
  ASSERT_TRUE(Eventually([&] { return t.Taken().size() == 3; }));
  reports.SendAgain();
  ASSERT_TRUE(Eventually([&] { return t.Taken().size() == 5; }));
  const Taken all = t.Taken();
  Taken again(all.begin() + 3, all.end());
  std::sort(again.begin(), again.end());
  EXPECT_EQ(again, (Taken{{"m", 3}, {"n", 7}}));
  // Refused (the mesh is gone): not sent again.
  t.Answer(NotFound("no mesh n"));
  const int tries = t.Tries();
  reports.Post("n", Report(8));
  ASSERT_TRUE(Eventually([&] { return reports.pending() == 0 && t.Tries() == tries + 1; }));
  t.Answer(Status::Ok());
  reports.SendAgain();
  ASSERT_TRUE(Eventually([&] { return t.Taken().size() == 6; }));
  EXPECT_EQ(t.Taken().back(), (std::pair<std::string, int64_t>{"m", 3}));
  reports.Stop();
  EXPECT_EQ(t.Taken().size(), 6u);
}

}  // namespace
}  // namespace tessera::worker
