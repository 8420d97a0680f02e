// Typed requests at the door: the codecs of api/requests.h, the restore plan
// StartRestore checks before any job exists, and how a worker's record of an
// in-loop save takes the end tesserad pushes (also when it comes early).
#include <gtest/gtest.h>

#include "api/requests.h"
#include "service/restore_plan.h"
#include "worker/trainer_saves.h"

namespace tessera {
namespace {

void ExpectField(const Status& st, const std::string& field) {
  EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.ToString();
  ASSERT_TRUE(st.details().is_object()) << st.ToString();
  EXPECT_EQ(st.details().value("field", ""), field) << st.ToString();
}

TEST(SaveRequest, DecodesOnceWithDefaultsAndRoundTrips) {
  auto r = SaveRequest::FromJson({{"step", 7}});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->step, 7);
  EXPECT_TRUE(r->compress);
  EXPECT_EQ(r->level, 1);
  EXPECT_FALSE(r->tensors.has_value());
  EXPECT_TRUE(r->metadata.is_object());
  auto full = SaveRequest::FromJson({{"step", 3}, {"tensors", {"a", "b/c"}}, {"compression", "none"},
                                     {"level", 5}, {"metadata", {{"loss", 0.5}}}});
  ASSERT_TRUE(full.ok()) << full.status().ToString();
  auto again = SaveRequest::FromJson(full->ToJson());
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->SameSave(*full));
  EXPECT_EQ(again->metadata, full->metadata);
  // The path's step wins over the body's.
  EXPECT_EQ(SaveRequest::FromJson({{"step", 1}}, 9)->step, 9);
  EXPECT_FALSE(full->SameSave(*SaveRequest::FromJson({{"step", 3}})));
}

TEST(SaveRequest, EveryBadFieldIsNamed) {
  ExpectField(SaveRequest::FromJson(Json::object()).status(), "step");
  ExpectField(SaveRequest::FromJson({{"step", -1}}).status(), "step");
  ExpectField(SaveRequest::FromJson({{"step", 1}, {"compression", "lz4"}}).status(), "compression");
  ExpectField(SaveRequest::FromJson({{"step", 1}, {"level", 20}}).status(), "level");
  ExpectField(SaveRequest::FromJson({{"step", 1}, {"metadata", "x"}}).status(), "metadata");
  ExpectField(SaveRequest::FromJson({{"step", 1}, {"tensors", {"a", "a"}}}).status(), "tensors");
  ExpectField(SaveRequest::FromJson({{"step", 1}, {"tensors", {"../x"}}}).status(), "tensors");
  ExpectField(SaveRequest::FromJson({{"step", 1}, {"wait_for_trainer", 1}}).status(),
              "wait_for_trainer");
  EXPECT_EQ(SaveRequest::FromJson(Json::array()).status().code(), Code::kInvalidArgument);
}

TEST(SaveJoinRequest, NeedsTheWorkerAndItsSnapshot) {
  Json snapshot = {{"tensors", {{{"name", "w"}, {"dtype", "float32"}, {"shape", {4}},
                                 {"layout", {"d"}}, {"devices", {0}}}}},
                   {"snapshot_bytes", 8}};
  const Json written = {{"bytes", 8}, {"stored_bytes", 8}, {"fragment", Json::array()}};
  auto j = SaveJoinRequest::FromJson({{"worker", "w-a"}, {"snapshot", snapshot}, {"written", written}}, 4);
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  EXPECT_EQ(j->save.step, 4);
  EXPECT_TRUE(j->save.wait_for_trainer);
  ASSERT_EQ(j->snapshot.tensors.size(), 1u);
  EXPECT_EQ(j->snapshot.tensors[0].devices, std::vector<int64_t>{0});
  auto again = SaveJoinRequest::FromJson(j->ToJson(), 4);
  ASSERT_TRUE(again.ok()) << again.status().ToString() << " " << j->ToJson().dump();
  EXPECT_TRUE(again->save.SameSave(j->save));
  ExpectField(SaveJoinRequest::FromJson({{"snapshot", snapshot}, {"written", written}}, 4).status(),
              "worker");
  ExpectField(SaveJoinRequest::FromJson({{"worker", "w-a"}, {"written", written}}, 4).status(),
              "snapshot");
  // The join is the report: it says what the worker wrote, or why it could not.
  Status neither = SaveJoinRequest::FromJson({{"worker", "w-a"}, {"snapshot", snapshot}}, 4).status();
  EXPECT_EQ(neither.code(), Code::kInvalidArgument);
  EXPECT_NE(neither.message().find("written"), std::string::npos) << neither.ToString();
  Status st = SaveJoinRequest::FromJson({{"worker", "w-a"}, {"snapshot", 3}}, 4).status();
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("snapshot"), std::string::npos) << st.ToString();
}

TEST(RestoreRequest, DecodesNamesSpecsLayoutsAndWorkers) {
  auto r = RestoreRequest::FromJson(
      {{"target_mesh", "t"},
       {"tensors", {"a", {{"name", "b"}, {"dtype", "int8"}, {"shape", {2, 3}}}}},
       {"layouts", {{"a", {"x", nullptr}}}},
       {"workers", {"w-1"}}});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r->target_mesh, "t");
  ASSERT_EQ(r->tensors->size(), 2u);
  EXPECT_EQ((*r->tensors)[1].dtype, DType::kInt8);
  EXPECT_EQ(*(*r->tensors)[1].shape, (Shape{2, 3}));
  EXPECT_EQ(r->layouts.at("a").ToString(), "x,unsharded");
  auto again = RestoreRequest::FromJson(r->ToJson());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->ToJson(), r->ToJson());

  ExpectField(RestoreRequest::FromJson({{"tensors", "a"}}).status(), "tensors");
  ExpectField(RestoreRequest::FromJson({{"tensors", {7}}}).status(), "tensors");
  ExpectField(RestoreRequest::FromJson({{"tensors", {"a", "a"}}}).status(), "tensors");
  ExpectField(RestoreRequest::FromJson({{"tensors", {{{"name", "a"}, {"dtype", "f"}}}}}).status(),
              "tensors[0].dtype");
  ExpectField(RestoreRequest::FromJson({{"layouts", {"a"}}}).status(), "layouts");
  ExpectField(RestoreRequest::FromJson({{"workers", Json::array()}}).status(), "workers");
  ExpectField(RestoreRequest::FromJson({{"target_mesh", 3}}).status(), "target_mesh");
}

const Mesh kTwoByTwo{"m", {{"data", 2}, {"model", 2}}, 1};

std::vector<TensorMeta> Saved() {
  return {TensorMeta{"a", DType::kFloat32, {8, 4}, Layout{{"data", "model"}}},
          TensorMeta{"b", DType::kInt32, {3}, Layout{{"unsharded"}}}};
}

TEST(PlanRestoreTensors, AllInIndexOrderOrTheOrderGiven) {
  auto all = service::PlanRestoreTensors(Saved(), {}, kTwoByTwo, "checkpoint m step 1");
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].name, "a");
  RestoreRequest r;
  r.tensors = std::vector<RestoreTensor>{{"b", DType::kInt32, Shape{3}}, {"a", {}, {}}};
  auto some = service::PlanRestoreTensors(Saved(), r, kTwoByTwo, "checkpoint m step 1");
  ASSERT_TRUE(some.ok()) << some.status().ToString();
  EXPECT_EQ((*some)[0].name, "b");
  EXPECT_EQ((*some)[1].name, "a");
}

TEST(PlanRestoreTensors, SavedLayoutsAdaptToTheTargetMesh) {
  const Mesh three{"t", {{"data", 3}}, 1};
  auto plan = service::PlanRestoreTensors(Saved(), {}, three, "c");
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  // 8 rows do not divide by 3 and "model" is not an axis: both unsharded.
  EXPECT_EQ((*plan)[0].layout.ToString(), "unsharded,unsharded");
}

TEST(PlanRestoreTensors, WhatCannotWorkIsNamed) {
  auto fails = [](RestoreRequest r, const std::string& tensor, const std::string& field) {
    Status st = service::PlanRestoreTensors(Saved(), r, kTwoByTwo, "checkpoint m step 1").status();
    ExpectField(st, field);
    EXPECT_EQ(st.details().value("tensor", ""), tensor) << st.ToString();
  };
  RestoreRequest missing;
  missing.tensors = std::vector<RestoreTensor>{{"zz", {}, {}}};
  fails(missing, "zz", "tensors");
  RestoreRequest dtype;
  dtype.tensors = std::vector<RestoreTensor>{{"a", DType::kFloat16, {}}};
  fails(dtype, "a", "dtype");
  RestoreRequest shape;
  shape.tensors = std::vector<RestoreTensor>{{"a", {}, Shape{4, 8}}};
  fails(shape, "a", "shape");
  RestoreRequest unfit;
  unfit.layouts["b"] = Layout{{"model"}};  // 3 does not divide by 2
  fails(unfit, "b", "layouts.b");
  RestoreRequest no_axis;
  no_axis.layouts["a"] = Layout{{"x", "unsharded"}};
  fails(no_axis, "a", "layouts.a");
  RestoreRequest left_out;
  left_out.tensors = std::vector<RestoreTensor>{{"a", {}, {}}};
  left_out.layouts["b"] = Layout{{"unsharded"}};
  fails(left_out, "b", "layouts.b");
}

TEST(TrainerSaves, APushedEndIsKeptUntilItsJobStarts) {
  worker::TrainerSaves saves;
  saves.Snapshotted("m", 1);
  // The end arrives before the create-or-join's answer named the job.
  saves.JobEnded("j-1", Status::Ok());
  auto w = saves.Wait("m", 1, worker::TrainerSaves::Until::kNow, 0);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ((*w)["state"], "snapshotted");
  saves.Started("m", 1, "j-1");
  w = saves.Wait("m", 1, worker::TrainerSaves::Until::kCommitted, 0);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ((*w)["state"], "committed");
  // The first end stands.
  saves.Ended("m", 1, Internal("late"));
  EXPECT_TRUE(saves.Wait("m", 1, worker::TrainerSaves::Until::kNow, 0).ok());

  saves.Snapshotted("m", 2);
  saves.Started("m", 2, "j-2");
  saves.JobEnded("j-other", Internal("not this save"));
  EXPECT_EQ((*saves.Wait("m", 2, worker::TrainerSaves::Until::kNow, 0))["state"], "running");
  saves.JobEnded("j-2", DeadlineExceeded("ranks [1] did not join", {{"missing_ranks", {1}}}));
  Status st = saves.Wait("m", 2, worker::TrainerSaves::Until::kCommitted, 0).status();
  EXPECT_EQ(st.code(), Code::kDeadlineExceeded);
  EXPECT_EQ(st.details()["missing_ranks"], Json({1}));
}

TEST(TrainerSaves, AFailedSaveTheTrainerTookNoPartInIsItsNextSavesAnswerOnce) {
  worker::TrainerSaves saves;
  const Status died = Unavailable("worker w-1 (rank 1) is dead", {{"worker", "w-1"}});
  // The others' save of step 3 failed before this trainer saved step 3.
  saves.Told("j-3", "m", 3, died, 1000);
  auto seen = saves.Wait("m", 3, worker::TrainerSaves::Until::kCommitted, 0);
  EXPECT_EQ(seen.status().code(), Code::kConflict) << seen.status().ToString();
  EXPECT_NE(seen.status().message().find("worker w-1 (rank 1) is dead"), std::string::npos);
  EXPECT_EQ(seen.status().details()["job"], "j-3");
  auto missed = saves.TakeMissed("m", 3, 2000);
  ASSERT_TRUE(missed.has_value());
  EXPECT_EQ(missed->details()["reason"], "job_ended");
  // Once: the trainer's save after that is a new save.
  EXPECT_FALSE(saves.TakeMissed("m", 3, 2000).has_value());

  // Too late to be the save it missed.
  saves.Told("j-4", "m", 4, died, 1000);
  EXPECT_FALSE(saves.TakeMissed("m", 4, 1000 + worker::TrainerSaves::kMissedMs + 1).has_value());

  // Its own save's end is not a missed one, nor is a success, nor a REST save it served.
  saves.Snapshotted("m", 5);
  saves.Told("j-5", "m", 5, died, 1000);
  EXPECT_FALSE(saves.TakeMissed("m", 5, 1000).has_value());
  saves.Told("j-6", "m", 6, Status::Ok(), 1000);
  EXPECT_FALSE(saves.TakeMissed("m", 6, 1000).has_value());
  saves.ServedByTask("j-7");
  saves.Told("j-7", "m", 7, died, 1000);
  EXPECT_FALSE(saves.TakeMissed("m", 7, 1000).has_value());

  // A retry of a step whose first save this trainer took part in: the retry, failed
  // without it, is missed too.
  saves.Snapshotted("m", 8);
  saves.Started("m", 8, "j-8");
  saves.JobEnded("j-8", died);
  saves.Told("j-8b", "m", 8, Internal("the retry failed"), 1000);
  missed = saves.TakeMissed("m", 8, 1000);
  ASSERT_TRUE(missed.has_value());
  EXPECT_EQ(missed->details()["job"], "j-8b");
}

}  // namespace
}  // namespace tessera
