// The checkpoint root is the truth and tesserad's catalog a cache of it
// (docs/format.md, "What the root holds"): a tesserad started with an empty data dir on
// an existing root finds every mesh (its workers and retention policy) and every
// committed checkpoint, restores and verifies them bit for bit, lists nothing that was
// not committed, and saves on.
#include <filesystem>

#include "tests/e2e/cluster_fixture.h"

namespace tessera::e2e {
namespace {

const Mesh kTwo{"two", {{"data", 2}}, 1};

void WipeCatalog(LocalCluster& c) {
  c.KillServer();
  std::error_code ec;
  for (const char* f : {"catalog.sqlite", "catalog.sqlite-wal", "catalog.sqlite-shm"}) {
    std::filesystem::remove(c.dir() + "/data/" + f, ec);
  }
  ASSERT_FALSE(std::filesystem::exists(c.dir() + "/data/catalog.sqlite"));
  ASSERT_TRUE(c.RestartServer().ok()) << c.server_log();
}

std::vector<int64_t> Steps(LocalCluster& c, const std::string& mesh) {
  auto list = c.Call("GET", "/api/v1/meshes/" + mesh + "/checkpoints");
  EXPECT_TRUE(list.ok()) << list.status().ToString();
  std::vector<int64_t> steps;
  if (!list.ok()) return steps;
  for (const Json& ck : *list) {
    EXPECT_EQ(ck["state"], "committed") << ck.dump();
    steps.push_back(ck["step"]);
  }
  return steps;
}

// Two workers and mesh "two" over them.
std::unique_ptr<LocalCluster> StartTwo() {
  tools::ClusterOptions opts;
  opts.workers = 2;
  auto c = StartCluster(opts);
  if (c == nullptr) return c;
  EXPECT_TRUE(c->PutMesh("two", MeshToJson(kTwo)["axes"]).ok());
  return c;
}

TEST(StoreIsTheTruth, AnEmptyCatalogIsRebuiltFromTheRoot) {
  auto c = StartTwo();
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->Call("PUT", "/api/v1/meshes/two/retention", {{"keep_last", 5}}).ok());
  const Layout sharded{{"data", "unsharded"}};
  auto t1 = MakeGlobal("w", DType::kFloat32, {64, 8}, sharded, 1);
  Push(*c, kTwo, t1);
  SaveAndWait(*c, "two", 1, {{"metadata", {{"epoch", 3}}}});
  auto t2 = MakeGlobal("w", DType::kFloat32, {64, 8}, sharded, 2);
  Push(*c, kTwo, t2);
  SaveAndWait(*c, "two", 2);
  auto before = c->Call("GET", "/api/v1/meshes/two/checkpoints/2");
  ASSERT_TRUE(before.ok());

  WipeCatalog(*c);
  ASSERT_TRUE(c->WaitAlive(2, 20000).ok());  // the workers register again, same ids
  auto mesh = c->Call("GET", "/api/v1/meshes/two");
  ASSERT_TRUE(mesh.ok()) << mesh.status().ToString() << "\n" << c->server_log();
  EXPECT_EQ((*mesh)["workers"], Json({c->worker_id(0), c->worker_id(1)}));
  EXPECT_EQ((*mesh)["retention"]["keep_last"], 5);
  EXPECT_EQ(Steps(*c, "two"), (std::vector<int64_t>{2, 1}));
  auto after = c->Call("GET", "/api/v1/meshes/two/checkpoints/2");
  ASSERT_TRUE(after.ok());
  for (const char* field : {"tensors", "logical_bytes", "stored_bytes"}) {
    EXPECT_EQ((*after)[field], (*before)[field]) << field;
  }
  // The index's time (the merge), a moment after the catalog's (the save's start).
  EXPECT_GE((*after)["created_at"].get<int64_t>(), (*before)["created_at"].get<int64_t>());
  auto first = c->Call("GET", "/api/v1/meshes/two/checkpoints/1");
  ASSERT_TRUE(first.ok());
  EXPECT_EQ((*first)["metadata"], Json({{"epoch", 3}}));

  // Restores bit for bit, both steps; verifies.
  ASSERT_EQ(RestoreAndWait(*c, "two", "1", Json::object())["state"], "succeeded");
  ExpectShards(*c, kTwo, t1, sharded);
  ASSERT_EQ(RestoreAndWait(*c, "two", "latest", Json::object())["state"], "succeeded");
  ExpectShards(*c, kTwo, t2, sharded);
  auto v = c->Call("POST", "/api/v1/meshes/two/checkpoints/2/verify", Json::object());
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(Wait(*c, (*v)["job"])["state"], "succeeded");
  // And saves on.
  SaveAndWait(*c, "two", 3);
  EXPECT_EQ(Steps(*c, "two"), (std::vector<int64_t>{3, 2, 1}));

  // A deleted mesh stays deleted, and a deleted checkpoint is not brought back.
  ASSERT_TRUE(c->Call("DELETE", "/api/v1/meshes/two/checkpoints/1").ok());
  ASSERT_TRUE(c->Call("DELETE", "/api/v1/meshes/two").ok());
  WipeCatalog(*c);
  EXPECT_EQ(c->Call("GET", "/api/v1/meshes/two").status().code(), Code::kNotFound);
  EXPECT_EQ(Steps(*c, "two"), (std::vector<int64_t>{3, 2}));
}

TEST(StoreIsTheTruth, ACatalogEntryTheRootNoLongerHoldsIsForgotten) {
  auto c = StartTwo();
  ASSERT_TRUE(c);
  auto t = MakeGlobal("w", DType::kFloat32, {16}, Layout{{"data"}}, 1);
  Push(*c, kTwo, t);
  SaveAndWait(*c, "two", 1);
  SaveAndWait(*c, "two", 2);
  // Another hand removes step 1 from the root while tesserad is down.
  c->KillServer();
  std::filesystem::remove_all(c->checkpoint_root() + "/two/step-1");
  ASSERT_TRUE(c->RestartServer().ok()) << c->server_log();
  EXPECT_EQ(Steps(*c, "two"), (std::vector<int64_t>{2}));
  EXPECT_EQ(c->Call("GET", "/api/v1/meshes/two/checkpoints/1").status().code(), Code::kNotFound);
}

}  // namespace
}  // namespace tessera::e2e
