// The task protocol's codecs: what tesserad encodes, a worker decodes to the same task
// (and back for results and reports); malformed messages are errors naming the field.
#include "api/task_protocol.h"

#include <gtest/gtest.h>

namespace tessera {
namespace {

const Mesh kMesh{"m", {{"data", 2}, {"model", 2}}, 2};

Task Envelope(TaskKind kind) {
  Task t;
  t.id = "t-1";
  t.job = "j-1";
  t.kind = kind;
  t.mesh = kMesh;
  t.rank = 1;
  return t;
}

TEST(TaskProtocol, EveryKindRoundTrips) {
  Task snapshot = Envelope(TaskKind::kSnapshot);
  snapshot.step = 7;
  snapshot.tensor_names = std::vector<std::string>{"a", "b/c"};
  snapshot.staging = "/ck/m/.staging-7-w";
  snapshot.compress = false;
  snapshot.level = 5;
  Task restore = Envelope(TaskKind::kRestore);
  restore.dir = "/ck/m/step-7";
  restore.tensors = {TensorMeta("a", DType::kBFloat16, {8, 8}, Layout{{"data", "unsharded"}})};
  Task collective = Envelope(TaskKind::kCollective);
  collective.workers = {"w-a", "w-b"};
  collective.request = {{"op", "all_reduce"}, {"tensor", "g"}};
  collective.timeout_ms = 1234;
  Task exp = Envelope(TaskKind::kExport);
  exp.dir = "/ck/m/step-7";
  exp.out_dir = "s3://bucket/hf";
  exp.files = {{"model-00001-of-00002.safetensors", {"a", "b/c"}}};
  exp.block_bytes = 1 << 20;
  Task imp = Envelope(TaskKind::kImport);
  imp.step = 7;
  imp.staging = "/ck/m/.staging-7-j-1";
  imp.sources = {"/models/hf/model-00001-of-00002.safetensors"};
  imp.tensors = {TensorMeta("a", DType::kFloat16, {3}, Layout{{"unsharded"}})};
  imp.compress = false;
  for (const Task& t : {snapshot, restore, collective, exp, imp}) {
    auto back = TaskFromJson(TaskToJson(t));
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(TaskToJson(*back), TaskToJson(t));
    EXPECT_EQ(back->mesh, kMesh);
    EXPECT_EQ(back->rank, 1);
  }
  auto s = TaskFromJson(TaskToJson(snapshot));
  ASSERT_TRUE(s.ok());
  EXPECT_FALSE(s->compress);
  EXPECT_EQ(s->level, 5);
  auto r = TaskFromJson(TaskToJson(restore));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->tensors, restore.tensors);
  auto ex = TaskFromJson(TaskToJson(exp));
  ASSERT_TRUE(ex.ok());
  ASSERT_EQ(ex->files.size(), 1u);
  EXPECT_EQ(ex->files[0].tensors, (std::vector<std::string>{"a", "b/c"}));
  EXPECT_EQ(ex->block_bytes, uint64_t{1} << 20);
  auto im = TaskFromJson(TaskToJson(imp));
  ASSERT_TRUE(im.ok());
  EXPECT_EQ(im->sources, imp.sources);
  EXPECT_EQ(im->tensors, imp.tensors);
  EXPECT_FALSE(im->compress);

  Task abort;
  abort.id = "t-2";
  abort.job = "j-1";
  abort.mesh_name = "m";
  abort.error = DeadlineExceeded("ranks [2] did not arrive", {{"missing_ranks", {2}}});
  auto a = TaskFromJson(TaskToJson(abort));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->kind, TaskKind::kAbort);
  EXPECT_EQ(a->mesh_name, "m");
  EXPECT_EQ(a->error.code(), Code::kDeadlineExceeded);
  EXPECT_EQ(a->error.message(), "job j-1 failed: ranks [2] did not arrive");

  Task ended;
  ended.id = "t-3";
  ended.job = "j-2";
  ended.kind = TaskKind::kSaveEnded;
  ended.mesh_name = "m/x";
  ended.step = 12;
  auto e = TaskFromJson(TaskToJson(ended));
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->kind, TaskKind::kSaveEnded);
  EXPECT_EQ(e->mesh_name, "m/x");
  EXPECT_EQ(e->step, 12);
  EXPECT_TRUE(e->error.ok());  // committed
  ended.error = Unavailable("worker w-b (rank 1) is dead", {{"worker", "w-b"}});
  e = TaskFromJson(TaskToJson(ended));
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->error.code(), Code::kUnavailable);
  EXPECT_EQ(e->error.details().value("worker", ""), "w-b");
  Json no_step = TaskToJson(ended);
  no_step.erase("step");
  EXPECT_FALSE(TaskFromJson(no_step).ok());
}

TEST(TaskProtocol, MalformedTasksNameTheField) {
  const Json good = TaskToJson(Envelope(TaskKind::kSnapshot));
  auto field_of = [](const Json& j) {
    auto t = TaskFromJson(j);
    EXPECT_FALSE(t.ok()) << j;
    return t.ok() || !t.status().details().is_object() ? std::string()
                                                       : t.status().details().value("field", "");
  };
  Json j = good;
  j["kind"] = "reboot";
  EXPECT_EQ(field_of(j), "kind");
  j = good;
  j.erase("id");
  EXPECT_EQ(field_of(j), "id");
  j = good;
  j["rank"] = 4;  // the mesh has 2 workers
  EXPECT_EQ(field_of(j), "rank");
  j = good;
  j["tensors"] = {1, 2};
  EXPECT_EQ(field_of(j), "tensors");
  // A save's write is a phase of its snapshot task on the worker, never a task of its own.
  j = good;
  j["kind"] = "write";
  EXPECT_EQ(field_of(j), "kind");
  EXPECT_FALSE(TaskFromJson(Json::array()).ok());
  EXPECT_FALSE(TaskFromJson("x").ok());
}

TEST(TaskProtocol, ResultsAndReportsRoundTrip) {
  SnapshotResult s;
  s.tensors.push_back({TensorMeta("a", DType::kInt8, {4}, Layout{{"data"}}), {2, 3}});
  s.snapshot_bytes = 4;
  auto s2 = SnapshotResultFromJson(SnapshotResultToJson(s));
  ASSERT_TRUE(s2.ok());
  EXPECT_EQ(s2->tensors[0].meta, s.tensors[0].meta);
  EXPECT_EQ(s2->tensors[0].devices, (std::vector<int64_t>{2, 3}));
  auto w = WriteResultFromJson(WriteResultToJson({std::nullopt, 0, 0}));
  ASSERT_TRUE(w.ok());
  EXPECT_FALSE(w->fragment.has_value());
  auto r = RestoreResultFromJson(RestoreResultToJson({10, 7, 2}));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->stored_bytes_read, 7u);
  EXPECT_EQ(RestoreResultFromJson({{"bytes", -1}}).status().details()["field"], "bytes");

  TaskReport failed{ReportState::kFailed, 5, 10, nullptr, DataLoss("chunk 3", {{"file", "f"}})};
  auto f = TaskReportFromJson(TaskReportToJson(failed));
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->state, ReportState::kFailed);
  EXPECT_EQ(f->error.code(), Code::kDataLoss);
  EXPECT_EQ(f->done_bytes, 5u);
  EXPECT_EQ(TaskReportFromJson({{"state", "done"}}).status().details()["field"], "state");
  // A failure without an error is still a failure, with a message that says so.
  auto bare = TaskReportFromJson({{"state", "failed"}});
  ASSERT_TRUE(bare.ok());
  EXPECT_FALSE(bare->error.ok());
}

}  // namespace
}  // namespace tessera
