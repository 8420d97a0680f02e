// Collectives and coordination through real processes: tesserad + 4 workers on
// loopback, mesh {data:2, model:2}, driven through the workers' local API (SPMD
// calls from 4 threads, one per "trainer") and through REST collectives jobs.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <chrono>
#include <random>
#include <thread>

#include "cluster_fixture.h"
#include "collectives/hash.h"
#include "collectives/transport/tcp/tcp_wire.h"

namespace tessera::e2e {
namespace {

const Mesh kMesh{"m", {{"data", 2}, {"model", 2}}, 1};

std::string Floats(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

std::vector<float> ToFloats(const std::string& s) {
  std::vector<float> v(s.size() / sizeof(float));
  std::memcpy(v.data(), s.data(), v.size() * sizeof(float));
  return v;
}

std::string Header(const http::RawResponse& r, const std::string& name) {
  for (const auto& [k, v] : r.headers) {
    if (strcasecmp(k.c_str(), name.c_str()) == 0) return v;
  }
  return "";
}

struct Answer {
  int status = 0;
  std::string body;
  std::string shape;
  Json error;  // the error object of a non-2xx answer
  http::RawResponse raw;
};

// Runs fn(rank) on one thread per rank and collects the answers.
std::vector<Answer> OnWorkers(int n, const std::function<Answer(int)>& fn) {
  std::vector<Answer> out(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { out[r] = fn(r); });
  for (auto& t : threads) t.join();
  return out;
}

class CollectivesE2E : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cluster_ = StartCluster().release();
    ASSERT_NE(cluster_, nullptr);
    auto m = cluster_->PutMesh("m", Json::parse(R"([{"name":"data","size":2},{"name":"model","size":2}])"));
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    // Registration ran the self-test: the merged device table, same on every worker.
    ASSERT_TRUE((*m).contains("self_test")) << m->dump();
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }

  // POST /v1/collectives/{op} on worker `rank` of mesh m.
  static Answer Collective(int rank, const std::string& op, const std::string& query,
                           const std::string& body) {
    http::Client local = cluster_->WorkerClient(rank, 60);
    auto r = local.Send("POST", "/v1/collectives/" + op + "?mesh=m&" + query, body,
                        "application/octet-stream");
    Answer a;
    if (!r.ok()) {
      a.error = {{"message", r.status().ToString()}};
      return a;
    }
    a.status = r->status;
    a.body = r->body;
    a.shape = Header(*r, "X-Tessera-Shape");
    a.raw = *r;
    if (a.status >= 300) a.error = Json::parse(a.body, nullptr, false).value("error", Json());
    return a;
  }

  static LocalCluster* cluster_;
};
LocalCluster* CollectivesE2E::cluster_ = nullptr;

TEST_F(CollectivesE2E, AllReduceAlongDataMatchesReference) {
  // Device d = (data d/2, model d%2); along data the groups are {0,2} and {1,3}.
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> small(-50, 50);
  std::vector<std::vector<float>> in(4, std::vector<float>(6));
  for (auto& v : in) {
    for (float& x : v) x = static_cast<float>(small(rng));
  }
  for (const char* reduce : {"sum", "max", "mean"}) {
    auto answers = OnWorkers(4, [&](int r) {
      return Collective(r, "all_reduce", std::string("axes=data&dtype=float32&shape=2,3&reduce=") + reduce,
                        Floats(in[r]));
    });
    for (int r = 0; r < 4; ++r) {
      ASSERT_EQ(answers[r].status, 200) << reduce << " rank " << r << ": " << answers[r].body;
      EXPECT_EQ(answers[r].shape, "2,3");
      const int peer = r ^ 2;  // the other device of the data group
      std::vector<float> want(6);
      for (int i = 0; i < 6; ++i) {
        float a = in[r][i], b = in[peer][i];
        want[i] = std::string(reduce) == "sum" ? a + b : std::string(reduce) == "max" ? std::max(a, b)
                                                                                     : (a + b) / 2;
      }
      EXPECT_EQ(ToFloats(answers[r].body), want) << reduce << " rank " << r;
    }
  }
}

TEST_F(CollectivesE2E, BatchAllReducePacksTensors) {
  // Two tensors per device, [2] and [3]; along data the groups are {0,2} and {1,3}.
  auto answers = OnWorkers(4, [&](int r) {
    return Collective(r, "batch_all_reduce", "axes=data&dtype=float32&shapes=2;3&bytes_per_pack=8",
                      Floats({float(r), 1, 10.f * r, 2, 3}));
  });
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(answers[r].status, 200) << answers[r].body;
    const int peer = r ^ 2;
    EXPECT_EQ(ToFloats(answers[r].body),
              (std::vector<float>{float(r + peer), 2, 10.f * (r + peer), 4, 6}))
        << r;
  }
}

TEST_F(CollectivesE2E, AllGatherAlongModelTiledAndStacked) {
  // Along model the groups are {0,1} and {2,3}.
  auto tiled = OnWorkers(4, [&](int r) {
    return Collective(r, "all_gather", "axes=model&dtype=float32&shape=2&tiled=true",
                      Floats({float(r), float(10 * r)}));
  });
  auto stacked = OnWorkers(4, [&](int r) {
    return Collective(r, "all_gather", "axes=model&dtype=float32&shape=2",
                      Floats({float(r), float(10 * r)}));
  });
  for (int r = 0; r < 4; ++r) {
    const int first = r & ~1;
    std::vector<float> want = {float(first), float(10 * first), float(first + 1),
                               float(10 * (first + 1))};
    ASSERT_EQ(tiled[r].status, 200) << tiled[r].body;
    EXPECT_EQ(tiled[r].shape, "4");
    EXPECT_EQ(ToFloats(tiled[r].body), want);
    ASSERT_EQ(stacked[r].status, 200) << stacked[r].body;
    EXPECT_EQ(stacked[r].shape, "2,2");
    EXPECT_EQ(ToFloats(stacked[r].body), want);
  }
}

TEST_F(CollectivesE2E, ReduceScatterAndBroadcastOverTheWholeMesh) {
  auto rs = OnWorkers(4, [&](int r) {
    std::vector<float> v(8);
    for (int i = 0; i < 8; ++i) v[i] = float(i * (r + 1));
    return Collective(r, "reduce_scatter", "dtype=float32&shape=8", Floats(v));
  });
  auto bc = OnWorkers(4, [&](int r) {
    return Collective(r, "broadcast", "dtype=float32&shape=2&root=2", Floats({float(r), 7.f}));
  });
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(rs[r].status, 200) << rs[r].body;
    // Sum over ranks of i·(r+1) = 10·i; device r keeps rows [2r, 2r+2).
    EXPECT_EQ(ToFloats(rs[r].body), (std::vector<float>{10.f * 2 * r, 10.f * (2 * r + 1)}));
    ASSERT_EQ(bc[r].status, 200) << bc[r].body;
    EXPECT_EQ(ToFloats(bc[r].body), (std::vector<float>{2.f, 7.f}));
  }
}

TEST_F(CollectivesE2E, MultihostUtils) {
  // broadcast_one_to_all: rank 0 is the source by default; others contribute zeros.
  auto b = OnWorkers(4, [&](int r) {
    return Collective(r, "broadcast_one_to_all", "dtype=float32&shape=3",
                      Floats({float(r + 1), 2.f, 3.f}));
  });
  // With an explicit source.
  auto b2 = OnWorkers(4, [&](int r) {
    return Collective(r, "broadcast_one_to_all",
                      std::string("dtype=float32&shape=1&is_source=") + (r == 3 ? "true" : "false"),
                      Floats({float(r + 1)}));
  });
  // process_allgather: stacked adds a leading axis of size 4; tiled concatenates;
  // scalars are always stacked.
  auto stacked = OnWorkers(4, [&](int r) {
    return Collective(r, "process_allgather", "dtype=float32&shape=2", Floats({float(r), 1.f}));
  });
  auto tiled = OnWorkers(4, [&](int r) {
    return Collective(r, "process_allgather", "dtype=float32&shape=2&tiled=true",
                      Floats({float(r), 1.f}));
  });
  auto scalar = OnWorkers(4, [&](int r) {
    return Collective(r, "process_allgather", "dtype=float32&shape=&tiled=true", Floats({float(r)}));
  });
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(b[r].status, 200) << b[r].body;
    EXPECT_EQ(ToFloats(b[r].body), (std::vector<float>{1.f, 2.f, 3.f}));
    ASSERT_EQ(b2[r].status, 200) << b2[r].body;
    EXPECT_EQ(ToFloats(b2[r].body), (std::vector<float>{4.f}));
    ASSERT_EQ(stacked[r].status, 200) << stacked[r].body;
    EXPECT_EQ(stacked[r].shape, "4,2");
    EXPECT_EQ(ToFloats(stacked[r].body), (std::vector<float>{0, 1, 1, 1, 2, 1, 3, 1}));
    ASSERT_EQ(tiled[r].status, 200) << tiled[r].body;
    EXPECT_EQ(tiled[r].shape, "8");
    ASSERT_EQ(scalar[r].status, 200) << scalar[r].body;
    EXPECT_EQ(scalar[r].shape, "4");
    EXPECT_EQ(ToFloats(scalar[r].body), (std::vector<float>{0, 1, 2, 3}));
  }
}

TEST_F(CollectivesE2E, AssertEqualNamesTheDifferingWorker) {
  auto ok = OnWorkers(4, [&](int r) {
    return Collective(r, "assert_equal", "dtype=float32&shape=1&message=weights", Floats({1.f}));
  });
  for (int r = 0; r < 4; ++r) EXPECT_EQ(ok[r].status, 200) << ok[r].body;
  auto bad = OnWorkers(4, [&](int r) {
    return Collective(r, "assert_equal", "dtype=float32&shape=1&message=weights",
                      Floats({r == 2 ? 5.f : 1.f}));
  });
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(bad[r].status, 409) << bad[r].body;
    const std::string msg = bad[r].error.value("message", "");
    EXPECT_NE(msg.find("weights"), std::string::npos) << msg;
    EXPECT_EQ(bad[r].error["details"]["differing_workers"], Json::array({"w-worker-2"}))
        << bad[r].error.dump();
  }
}

TEST_F(CollectivesE2E, BarrierNameHashAndMeshSize) {
  auto barrier = [&](int r, const std::string& name, const std::string& extra = "") {
    http::Client local = cluster_->WorkerClient(r, 60);
    auto res = local.Send("POST", "/v1/barriers/" + name + "?mesh=m&timeout_ms=10000" + extra, "{}");
    Answer a;
    if (res.ok()) {
      a.status = res->status;
      a.body = res->body;
      a.error = Json::parse(a.body, nullptr, false).value("error", Json());
    }
    return a;
  };
  auto ok = OnWorkers(4, [&](int r) { return barrier(r, "epoch-1"); });
  for (int r = 0; r < 4; ++r) EXPECT_EQ(ok[r].status, 200) << ok[r].body;

  // sync_global_devices with mixed names fails everywhere, naming both.
  auto mixed = OnWorkers(4, [&](int r) { return barrier(r, r == 1 ? "epoch-X" : "epoch-2"); });
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(mixed[r].status, 409) << mixed[r].body;
    const std::string msg = mixed[r].error.value("message", "");
    EXPECT_NE(msg.find("epoch-X"), std::string::npos) << msg;
    EXPECT_NE(msg.find("epoch-2"), std::string::npos) << msg;
  }

  // A worker that brings another number of devices: the all-reduce of ones does
  // not add up to the mesh size.
  auto wrong = OnWorkers(4, [&](int r) { return barrier(r, "epoch-3", r == 0 ? "&local_devices=2" : ""); });
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(wrong[r].status, 409) << wrong[r].body;
    EXPECT_NE(wrong[r].error.value("message", "").find("wrong mesh size"), std::string::npos)
        << wrong[r].body;
    EXPECT_EQ(wrong[r].error["details"]["expected"], 4);
    EXPECT_EQ(wrong[r].error["details"]["actual"], 5);
  }

  // The group recovers: the next barrier passes.
  auto again = OnWorkers(4, [&](int r) { return barrier(r, "epoch-4"); });
  for (int r = 0; r < 4; ++r) EXPECT_EQ(again[r].status, 200) << again[r].body;
}

TEST_F(CollectivesE2E, MismatchedOpsAreNamedAndTheGroupRecovers) {
  auto mixed = OnWorkers(4, [&](int r) {
    return r == 3 ? Collective(r, "all_gather", "dtype=float32&shape=2", Floats({1, 2}))
                  : Collective(r, "all_reduce", "dtype=float32&shape=2", Floats({1, 2}));
  });
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(mixed[r].status, 409) << mixed[r].body;
    const std::string msg = mixed[r].error.value("message", "");
    EXPECT_NE(msg.find("all_gather"), std::string::npos) << msg;
    EXPECT_NE(msg.find("all_reduce"), std::string::npos) << msg;
  }
  auto after = OnWorkers(4, [&](int r) {
    return Collective(r, "all_reduce", "dtype=int32&shape=1", std::string("\x01\0\0\0", 4));
  });
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(after[r].status, 200) << after[r].body;
    EXPECT_EQ(after[r].body, std::string("\x04\0\0\0", 4));
  }
}

TEST_F(CollectivesE2E, MissingWorkerTimesOutNamingIt) {
  auto answers = OnWorkers(3, [&](int r) {
    return Collective(r, "all_reduce", "dtype=float32&shape=1&timeout_ms=1500", Floats({1.f}));
  });
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(answers[r].status, 504) << answers[r].body;
    EXPECT_EQ(answers[r].error["details"]["missing_workers"], Json::array({"w-worker-3"}))
        << answers[r].error.dump();
  }
  // Worker 3 catches up later with the same call; it finds nobody and times out too,
  // then everyone is in step again.
  auto late = Collective(3, "all_reduce", "dtype=float32&shape=1&timeout_ms=1500", Floats({1.f}));
  EXPECT_EQ(late.status, 504) << late.body;
  auto after = OnWorkers(4, [&](int r) {
    return Collective(r, "all_reduce", "dtype=float32&shape=1", Floats({1.f}));
  });
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(after[r].status, 200) << after[r].body;
    EXPECT_EQ(ToFloats(after[r].body), std::vector<float>{4.f});
  }
}

TEST_F(CollectivesE2E, RestCollectiveJobs) {
  // x: [4,2] float32 sharded on data; g: replicated, a different value on each device.
  GlobalTensor x = MakeGlobal("x", DType::kFloat32, {4, 2}, Layout{{"data", "unsharded"}}, 11);
  Push(*cluster_, kMesh, x);
  for (int d = 0; d < 4; ++d) {
    http::Client local = cluster_->WorkerClient(d);
    auto r = local.Send("PUT", "/v1/tensors/g?mesh=m&device=" + std::to_string(d) +
                                   "&dtype=float32&shape=2&layout=unsharded",
                        Floats({float(d), 1.f}), "application/octet-stream");
    ASSERT_TRUE(r.ok() && r->status == 204);
  }
  auto run = [&](const Json& body) {
    auto r = cluster_->Call("POST", "/api/v1/meshes/m/collectives", body);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? Wait(*cluster_, r->value("job", "")) : Json();
  };
  // all_gather along data unshards x's first dimension: every device holds all of x.
  Json j = run({{"op", "all_gather"}, {"tensor", "x"}, {"output", "x_full"}, {"axes", {"data"}},
                {"tiled", true}});
  ASSERT_EQ(j.value("state", ""), "succeeded") << j.dump();
  EXPECT_EQ(j["result"]["layout"], Json::array({"unsharded", "unsharded"}));
  GlobalTensor full = x;
  full.name = "x_full";
  ExpectShards(*cluster_, kMesh, full, Layout{{"unsharded", "unsharded"}});

  // all_reduce mean of g along data: devices {0,2} → (0+2)/2, {1,3} → (1+3)/2.
  j = run({{"op", "all_reduce"}, {"tensor", "g"}, {"output", "g_mean"}, {"axes", {"data"}},
           {"reduce", "mean"}});
  ASSERT_EQ(j.value("state", ""), "succeeded") << j.dump();
  for (int d = 0; d < 4; ++d) {
    http::Client local = cluster_->WorkerClient(d);
    auto r = local.Send("GET", "/v1/tensors/g_mean?mesh=m&device=" + std::to_string(d));
    ASSERT_TRUE(r.ok() && r->status == 200);
    EXPECT_EQ(ToFloats(r->body), (std::vector<float>{d % 2 == 0 ? 1.f : 2.f, 1.f})) << d;
  }

  // reduce_scatter of x_full along data: the sum over the 2 devices, sharded on data.
  j = run({{"op", "reduce_scatter"}, {"tensor", "x_full"}, {"output", "x_rs"}, {"axes", {"data"}}});
  ASSERT_EQ(j.value("state", ""), "succeeded") << j.dump();
  EXPECT_EQ(j["result"]["layout"], Json::array({"data", "unsharded"}));
  for (int d = 0; d < 4; ++d) {
    http::Client local = cluster_->WorkerClient(d);
    auto r = local.Send("GET", "/v1/tensors/x_rs?mesh=m&device=" + std::to_string(d));
    ASSERT_TRUE(r.ok() && r->status == 200);
    std::vector<float> want = ToFloats(x.Slice(DeviceSlice(kMesh, x.layout, x.shape, d)));
    for (float& v : want) v *= 2;
    EXPECT_EQ(ToFloats(r->body), want) << d;
  }

  // assert_equal fails naming the workers whose g differs; barrier passes.
  j = run({{"op", "assert_equal"}, {"tensor", "g"}, {"message", "g must be replicated"}});
  EXPECT_EQ(j.value("state", ""), "failed") << j.dump();
  EXPECT_NE(j["error"].value("message", "").find("g must be replicated"), std::string::npos)
      << j.dump();
  j = run({{"op", "barrier"}});
  EXPECT_EQ(j.value("state", ""), "succeeded") << j.dump();

  // Bad requests are refused before any worker is involved.
  for (const Json& body : {Json{{"op", "all_scatter"}, {"tensor", "x"}, {"output", "y"}},
                           Json{{"op", "all_reduce"}, {"tensor", "x"}},
                           Json{{"op", "all_reduce"}, {"tensor", "x"}, {"output", "y"}, {"axes", {"pipe"}}},
                           Json{{"op", "all_reduce"}, {"tensor", "x"}, {"output", "y"}, {"reduce", "avg"}}}) {
    auto r = cluster_->Call("POST", "/api/v1/meshes/m/collectives", body);
    ASSERT_FALSE(r.ok()) << body.dump();
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << r.status().ToString();
  }
  // A tensor only three workers hold: worker 3 fails at once, the job fails naming
  // it, and the others, already inside the all-reduce, are aborted instead of
  // waiting out their 20 s: a barrier with a 5 s budget right after succeeds.
  for (int d = 0; d < 3; ++d) {
    http::Client local = cluster_->WorkerClient(d);
    auto r = local.Send("PUT", "/v1/tensors/partial?mesh=m&device=" + std::to_string(d) +
                                   "&dtype=float32&shape=1&layout=unsharded",
                        Floats({1.f}), "application/octet-stream");
    ASSERT_TRUE(r.ok() && r->status == 204);
  }
  j = run({{"op", "all_reduce"}, {"tensor", "partial"}, {"output", "p"}, {"timeout_ms", 20000}});
  EXPECT_EQ(j.value("state", ""), "failed") << j.dump();
  EXPECT_NE(j["error"].value("message", "").find("w-worker-3"), std::string::npos) << j.dump();
  j = run({{"op", "barrier"}, {"timeout_ms", 5000}});
  EXPECT_EQ(j.value("state", ""), "succeeded") << j.dump();

  // A tensor that is not there: the job fails naming it.
  j = run({{"op", "all_reduce"}, {"tensor", "nope"}, {"output", "y"}, {"timeout_ms", 2000}});
  EXPECT_EQ(j.value("state", ""), "failed");
  EXPECT_NE(j["error"].value("message", "").find("nope"), std::string::npos) << j.dump();
}

// A device's indexed slices: rows of a [kSparseRows, 2] float32 tensor.
constexpr int64_t kSparseRows = 5;
struct Slices {
  std::vector<float> values;  // rows × 2
  std::vector<int64_t> indices;
  std::string Body() const {
    return Floats(values) + std::string(reinterpret_cast<const char*>(indices.data()),
                                        indices.size() * sizeof(int64_t));
  }
  std::string Query(const std::string& extra = "") const {
    return "dtype=float32&dense_shape=" + std::to_string(kSparseRows) +
           ",2&rows=" + std::to_string(indices.size()) + extra;
  }
};

std::vector<float> Dense(const Slices& s) {
  std::vector<float> d(kSparseRows * 2, 0.f);
  for (size_t i = 0; i < s.indices.size(); ++i) {
    d[s.indices[i] * 2] += s.values[i * 2];
    d[s.indices[i] * 2 + 1] += s.values[i * 2 + 1];
  }
  return d;
}

// The answer's slices (values then int64 indices), densified.
std::vector<float> DenseAnswer(const Answer& a, std::string* path, int64_t* rows) {
  *path = Header(a.raw, "X-Tessera-Sparse-Path");
  *rows = std::stoll(Header(a.raw, "X-Tessera-Rows"));
  Slices s;
  s.values = ToFloats(a.body.substr(0, *rows * 2 * sizeof(float)));
  s.indices.resize(*rows);
  std::memcpy(s.indices.data(), a.body.data() + *rows * 2 * sizeof(float), *rows * sizeof(int64_t));
  EXPECT_EQ(a.body.size(), *rows * (2 * sizeof(float) + sizeof(int64_t)));
  return Dense(s);
}

Slices RandomSlices(int64_t rows, std::mt19937& rng) {
  Slices s;
  for (int64_t i = 0; i < rows; ++i) {
    s.values.push_back(float(rng() % 50));
    s.values.push_back(float(rng() % 50) - 25.f);
    s.indices.push_back(static_cast<int64_t>(rng() % kSparseRows));  // repeats add up
  }
  return s;
}

TEST_F(CollectivesE2E, SparseAllReduceBothPathsGiveTheDenseSum) {
  std::mt19937 rng(41);
  struct Case {
    std::string axes;  // along data the groups are devices {0,2} and {1,3}
    bool equal_rows;
    std::string path;
    std::string want_path;
  };
  for (const Case& c : std::vector<Case>{{"data", true, "", "gather"},
                                         {"data", false, "", "dense"},
                                         {"data,model", true, "auto", "gather"},
                                         {"data,model", false, "auto", "dense"},
                                         {"data,model", true, "dense", "dense"},
                                         {"data,model", false, "gather", "gather"}}) {
    std::vector<Slices> in;
    for (int r = 0; r < 4; ++r) in.push_back(RandomSlices(c.equal_rows ? 3 : r + 1, rng));
    auto answers = OnWorkers(4, [&](int r) {
      return Collective(r, "sparse_all_reduce",
                        in[r].Query("&axes=" + c.axes + (c.path.empty() ? "" : "&path=" + c.path)),
                        in[r].Body());
    });
    const std::string what = "axes " + c.axes + " equal " + std::to_string(c.equal_rows) + " path " + c.path;
    for (int r = 0; r < 4; ++r) {
      ASSERT_EQ(answers[r].status, 200) << what << " rank " << r << ": " << answers[r].body;
      std::vector<float> want(kSparseRows * 2, 0.f);
      for (int d = 0; d < 4; ++d) {
        if (c.axes == "data" && d % 2 != r % 2) continue;  // another group
        for (size_t i = 0; i < want.size(); ++i) want[i] += Dense(in[d])[i];
      }
      std::string path;
      int64_t rows = 0;
      EXPECT_EQ(DenseAnswer(answers[r], &path, &rows), want) << what << " rank " << r;
      EXPECT_EQ(path, c.want_path) << what;
      if (path == "dense") {
        EXPECT_EQ(rows, kSparseRows) << what;
      }
      EXPECT_EQ(Header(answers[r].raw, "X-Tessera-Dense-Shape"), "5,2");
    }
  }
  // int32 indices in, int32 indices out.
  auto answers = OnWorkers(4, [&](int r) {
    std::vector<int32_t> idx = {r, 4};
    return Collective(r, "sparse_all_reduce", "dtype=float32&dense_shape=5,2&rows=2&index_dtype=int32",
                      Floats({1, 2, 3, 4}) +
                          std::string(reinterpret_cast<const char*>(idx.data()), 8));
  });
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(answers[r].status, 200) << answers[r].body;
    EXPECT_EQ(Header(answers[r].raw, "X-Tessera-Index-Dtype"), "int32");
    ASSERT_EQ(answers[r].body.size(), 8u * (2 * 4 + 4));
    std::vector<int32_t> idx(8);
    std::memcpy(idx.data(), answers[r].body.data() + 64, 32);
    EXPECT_EQ(idx, (std::vector<int32_t>{0, 4, 1, 4, 2, 4, 3, 4}));
  }
}

TEST_F(CollectivesE2E, SparseAllReduceMalformedInputIsNamedAndTheMeshGoesOn) {
  std::mt19937 rng(43);
  // Refused by the worker it is sent to, before the call.
  const std::string body = RandomSlices(2, rng).Body();
  struct Bad {
    std::string query;
    std::string body;
    std::string field;
  };
  for (const Bad& b : std::vector<Bad>{
           {"dtype=float32&rows=2", body, "dense_shape"},
           {"dtype=float32&dense_shape=5,2", body, "rows"},
           {"dtype=float32&dense_shape=5,2&rows=2,2", body, "rows"},
           {"dtype=float32&dense_shape=5,2&rows=3", body, "body"},
           {"dtype=float32&dense_shape=5,2&rows=2&index_dtype=float32", body, "index_dtype"},
           {"dtype=bool&dense_shape=5,2&rows=2", body, "dtype"},
           {"dtype=float32&dense_shape=5,2&rows=2&path=sideways", body, "path"},
           {"dtype=float32&dense_shape=5,2&rows=1099511627777", body, "rows"},
           {"dtype=float32&dense_shape=5,2&rows=1099511627776", body, "body"},
       }) {
    Answer a = Collective(0, "sparse_all_reduce", b.query, b.body);
    EXPECT_EQ(a.status, 400) << b.query << ": " << a.body;
    EXPECT_EQ(a.error["details"].value("field", ""), b.field) << b.query << ": " << a.body;
  }
  // Found inside the call on one worker: every worker hears at once, naming it.
  struct Spoiled {
    std::string what;
    std::function<void(Slices&)> spoil;
    std::string field;
  };
  for (const Spoiled& b : std::vector<Spoiled>{
           {"index past the rows", [](Slices& s) { s.indices[0] = kSparseRows; }, "indices"},
           {"negative index", [](Slices& s) { s.indices[1] = -3; }, "indices"},
       }) {
    std::vector<Slices> in;
    for (int r = 0; r < 4; ++r) in.push_back(RandomSlices(2, rng));
    b.spoil(in[2]);
    auto answers = OnWorkers(4, [&](int r) {
      return Collective(r, "sparse_all_reduce", in[r].Query("&timeout_ms=30000"), in[r].Body());
    });
    for (int r = 0; r < 4; ++r) {  // a worker that waited for its timeout answers 504
      ASSERT_EQ(answers[r].status, 400) << b.what << ": " << answers[r].body;
      EXPECT_EQ(answers[r].error["details"]["invalid_workers"], Json::array({"w-worker-2"}))
          << answers[r].body;
      EXPECT_EQ(answers[r].error["details"].value("field", ""), b.field) << answers[r].body;
    }
  }
  // A dense_shape one worker disagrees on: a conflict naming it.
  std::vector<Slices> shares;
  for (int r = 0; r < 4; ++r) shares.push_back(RandomSlices(2, rng));
  auto answers = OnWorkers(4, [&](int r) {
    std::string q = shares[r].Query();
    if (r == 1) q = "dtype=float32&dense_shape=6,2&rows=2";
    return Collective(r, "sparse_all_reduce", q, shares[r].Body());
  });
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(answers[r].status, 409) << answers[r].body;
    const Json want = r == 1 ? Json::array({"w-worker-0", "w-worker-2", "w-worker-3"})
                             : Json::array({"w-worker-1"});
    EXPECT_EQ(answers[r].error["details"]["mismatched_workers"], want) << answers[r].body;
  }
  // The workers still serve the next collective.
  std::vector<Slices> in;
  for (int r = 0; r < 4; ++r) in.push_back(RandomSlices(2, rng));
  answers = OnWorkers(4, [&](int r) { return Collective(r, "sparse_all_reduce", in[r].Query(), in[r].Body()); });
  for (int r = 0; r < 4; ++r) EXPECT_EQ(answers[r].status, 200) << answers[r].body;
}

TEST_F(CollectivesE2E, SparseAllReduceAsARestJob) {
  // Each device holds 2 rows of a [5, 3] gradient (values, int32 indices),
  // replicated layout but different on each device.
  std::vector<std::vector<float>> values(4);
  std::vector<std::vector<int32_t>> indices(4);
  for (int d = 0; d < 4; ++d) {
    values[d] = {float(d), 1, 2, float(10 * d), 0, -1};
    indices[d] = {d, (d + 1) % 5};
  }
  auto put = [&](int d, const std::string& name, const std::string& query, const std::string& bytes) {
    http::Client local = cluster_->WorkerClient(d);
    auto r = local.Send("PUT", "/v1/tensors/" + name + "?mesh=m&device=" + std::to_string(d) + "&" + query,
                        bytes, "application/octet-stream");
    ASSERT_TRUE(r.ok() && r->status == 204) << (r.ok() ? r->body : r.status().ToString());
  };
  for (int d = 0; d < 4; ++d) {
    put(d, "emb_grad", "dtype=float32&shape=2,3&layout=unsharded,unsharded", Floats(values[d]));
    put(d, "emb_idx", "dtype=int32&shape=2&layout=unsharded",
        std::string(reinterpret_cast<const char*>(indices[d].data()), 8));
    put(d, "emb_bad_idx", "dtype=float32&shape=2&layout=unsharded", Floats({0, 1}));
  }
  std::vector<float> want(15, 0.f);
  for (int d = 0; d < 4; ++d) {
    for (int i = 0; i < 2; ++i) {
      for (int k = 0; k < 3; ++k) want[indices[d][i] * 3 + k] += values[d][i * 3 + k];
    }
  }
  auto run = [&](const Json& body) {
    auto r = cluster_->Call("POST", "/api/v1/meshes/m/collectives", body);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? Wait(*cluster_, r->value("job", "")) : Json();
  };
  for (const char* path : {"auto", "dense"}) {
    const std::string output = std::string("emb_sum_") + path;
    Json j = run({{"op", "sparse_all_reduce"}, {"tensor", "emb_grad"}, {"indices", "emb_idx"},
                  {"dense_shape", {5, 3}}, {"output", output}, {"path", path}});
    ASSERT_EQ(j.value("state", ""), "succeeded") << j.dump();
    EXPECT_EQ(j["result"].value("path", ""), std::string(path) == "auto" ? "gather" : "dense") << j.dump();
    EXPECT_EQ(j["result"]["shape"], Json::array({5, 3})) << j.dump();
    EXPECT_EQ(j["result"]["layout"], Json::array({"unsharded", "unsharded"})) << j.dump();
    for (int d = 0; d < 4; ++d) {
      http::Client local = cluster_->WorkerClient(d);
      auto r = local.Send("GET", "/v1/tensors/" + output + "?mesh=m&device=" + std::to_string(d));
      ASSERT_TRUE(r.ok() && r->status == 200);
      EXPECT_EQ(ToFloats(r->body), want) << path << " device " << d;
    }
  }
  // Indices out of range on the workers (dense_shape too small), and indices of a
  // wrong dtype: the job fails naming them.
  Json j = run({{"op", "sparse_all_reduce"}, {"tensor", "emb_grad"}, {"indices", "emb_idx"},
                {"dense_shape", {3, 3}}, {"output", "y"}, {"timeout_ms", 20000}});
  EXPECT_EQ(j.value("state", ""), "failed") << j.dump();
  EXPECT_NE(j["error"].value("message", "").find("outside [0, 3)"), std::string::npos) << j.dump();
  j = run({{"op", "sparse_all_reduce"}, {"tensor", "emb_grad"}, {"indices", "emb_bad_idx"},
           {"dense_shape", {5, 3}}, {"output", "y"}, {"timeout_ms", 20000}});
  EXPECT_EQ(j.value("state", ""), "failed") << j.dump();
  EXPECT_NE(j["error"].value("message", "").find("emb_bad_idx"), std::string::npos) << j.dump();
  // Bad requests are refused before any worker is involved.
  const Json base = {{"op", "sparse_all_reduce"}, {"tensor", "emb_grad"}, {"indices", "emb_idx"},
                     {"dense_shape", {5, 3}}, {"output", "y"}};
  for (const auto& [key, value] : std::vector<std::pair<std::string, Json>>{
           {"indices", nullptr}, {"indices", "emb_grad"}, {"dense_shape", nullptr},
           {"dense_shape", Json::array()}, {"dense_shape", {5, -3}}, {"dense_shape", "5,3"},
           {"path", "sideways"}}) {
    Json body = base;
    if (value.is_null()) {
      body.erase(key);
    } else {
      body[key] = value;
    }
    auto r = cluster_->Call("POST", "/api/v1/meshes/m/collectives", body);
    ASSERT_FALSE(r.ok()) << body.dump();
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << r.status().ToString();
    EXPECT_EQ(r.status().details().value("field", ""), key) << r.status().ToString();
  }
  // The mesh still works.
  j = run({{"op", "barrier"}, {"timeout_ms", 5000}});
  EXPECT_EQ(j.value("state", ""), "succeeded") << j.dump();
}

TEST_F(CollectivesE2E, MalformedCallsAreRefusedNamingTheField) {
  struct Bad {
    std::string path;
    std::string body;
    int status;
    std::string field;  // expected details.field, or empty
  };
  const std::string f1 = Floats({1.f});
  for (const Bad& b : std::vector<Bad>{
           {"/v1/collectives/all_scatter?mesh=m&dtype=float32&shape=1", f1, 400, "op"},
           {"/v1/collectives/all_reduce?dtype=float32&shape=1", f1, 400, "mesh"},
           {"/v1/collectives/all_reduce?mesh=../x&dtype=float32&shape=1", f1, 400, "mesh"},
           {"/v1/collectives/all_reduce?mesh=nope&dtype=float32&shape=1", f1, 404, ""},
           {"/v1/collectives/all_reduce?mesh=m&dtype=float128&shape=1", f1, 400, "dtype"},
           {"/v1/collectives/all_reduce?mesh=m&dtype=float32&shape=x", f1, 400, "shape"},
           {"/v1/collectives/all_reduce?mesh=m&dtype=float32&shape=2", f1, 400, "body"},
           {"/v1/collectives/all_reduce?mesh=m&dtype=float32&shape=1099511627776,1099511627776", f1,
            400, "shape"},
           {"/v1/collectives/all_reduce?mesh=m&dtype=float32&shape=1&reduce=avg", f1, 400, "reduce"},
           {"/v1/collectives/all_reduce?mesh=m&dtype=bool&shape=1&reduce=mean", std::string(1, '\1'),
            400, ""},
           {"/v1/collectives/all_reduce?mesh=m&dtype=float32&shape=1&axes=pipe", f1, 400, "axes"},
           {"/v1/collectives/all_reduce?mesh=m&dtype=float32&shape=1&timeout_ms=abc", f1, 400,
            "timeout_ms"},
           {"/v1/collectives/broadcast?mesh=m&dtype=float32&shape=1&root=-3", f1, 400, "root"},
           {"/v1/collectives/broadcast?mesh=m&dtype=float32&shape=1&root=9", f1, 400, "root"},
           {"/v1/collectives/reduce_scatter?mesh=m&dtype=float32&shape=3", Floats({1, 2, 3}), 400,
            "shape"},
           {"/v1/barriers/a/../b?mesh=m", "{}", 400, "name"},
           {"/v1/barriers/ok?mesh=m&local_devices=-1", "{}", 400, "local_devices"},
       }) {
    http::Client local = cluster_->WorkerClient(0, 10);
    auto r = local.Send("POST", b.path, b.body, "application/octet-stream");
    ASSERT_TRUE(r.ok()) << b.path << ": " << r.status().ToString();
    EXPECT_EQ(r->status, b.status) << b.path << ": " << r->body;
    Json e = Json::parse(r->body, nullptr, false).value("error", Json());
    if (!b.field.empty()) {
      EXPECT_EQ(e["details"].value("field", ""), b.field) << b.path << ": " << r->body;
    }
  }
  // The worker is still there, and the mesh still works for everyone.
  auto after = OnWorkers(4, [&](int r) {
    return Collective(r, "all_reduce", "dtype=float32&shape=1", Floats({1.f}));
  });
  for (int r = 0; r < 4; ++r) EXPECT_EQ(after[r].status, 200) << after[r].body;
}

TEST_F(CollectivesE2E, PreemptionSyncPointThroughTheLocalApi) {
  auto ask = [&](int r, int64_t step) {
    http::Client local = cluster_->WorkerClient(r, 60);
    auto res = local.Call("GET", "/v1/preemption?mesh=m&step=" + std::to_string(step));
    EXPECT_TRUE(res.ok()) << res.status().ToString();
    return res.ok() ? *res : Json();
  };
  // No notice: false at once, no sync step.
  Json before = ask(0, 5);
  EXPECT_EQ(before["sync"], false);
  EXPECT_TRUE(before["sync_step"].is_null()) << before.dump();

  ASSERT_TRUE(cluster_->Call("POST", "/api/v1/meshes/m/preemption", {{"reason", "maintenance"}}).ok());
  // Each worker reports where it is; the sync step is max + 1 everywhere.
  const int64_t steps[] = {5, 7, 6, 7};
  std::vector<Json> answers(4);
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r) threads.emplace_back([&, r] { answers[r] = ask(r, steps[r]); });
  for (auto& t : threads) t.join();
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(answers[r]["sync_step"], 8) << answers[r].dump();
    EXPECT_EQ(answers[r]["sync"], false) << answers[r].dump();
  }
  // True exactly at the sync step.
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(ask(r, 7)["sync"], false);
    EXPECT_EQ(ask(r, 8)["sync"], true);
  }
  auto state = cluster_->Call("GET", "/api/v1/meshes/m/preemption");
  ASSERT_TRUE(state.ok());
  EXPECT_EQ((*state)["noticed"], true);
  EXPECT_EQ((*state)["sync_step"], 8);
  ASSERT_TRUE(cluster_->Call("DELETE", "/api/v1/meshes/m/preemption").ok());
  EXPECT_EQ(ask(1, 9)["sync"], false);
}

// The data port admits only peers that prove they know the cluster's token. A
// stranger who can reach worker 0's data port and knows the mesh's group id
// tries to join it as rank 1 before the group re-forms: it is refused, logged
// and counted (/healthz), and the mesh's collectives go on without it.
TEST_F(CollectivesE2E, AStrangerAtADataPortIsRefusedAndTheMeshGoesOn) {
  // Worker 0's data port, as tesserad lists it for the other workers.
  const int port = DataPort(*cluster_, 0);
  ASSERT_GT(port, 0);
  auto refused = [&] { return RefusedAtDataPort(*cluster_, 0); };
  const int64_t before = refused();
  ASSERT_GE(before, 0);
  // The id of the mesh-wide group, as the workers name it.
  std::string def = kMesh.ToString() + "/1";
  for (int r = 0; r < 4; ++r) def += "/" + cluster_->worker_id(r);
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx",
                static_cast<unsigned long long>(collectives::HashString(def)));
  const std::string group = "mesh/m#" + std::string(hex);

  auto connect = [&] {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    timeval tv{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return fd;
  };
  auto send = [](int fd, const std::string& bytes) {
    EXPECT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
  };
  // Everything the worker sends until it closes (or 5 s pass: then "open").
  auto read_to_end = [](int fd) {
    std::string got;
    char buf[4096];
    while (true) {
      const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      if (n == 0 || (n < 0 && errno == ECONNRESET)) return got;
      if (n < 0) return got + "(still open)";
      got.append(buf, static_cast<size_t>(n));
    }
  };

  // A hello of the current protocol claiming rank 1 of the mesh, then a made-up proof.
  int forged = connect();
  collectives::wire::Hello hello{1, 0, 4, group, {}};
  hello.nonce[0] = 7;
  send(forged, collectives::wire::EncodeHello(hello));
  char challenge[collectives::wire::kChallengeBytes];
  ASSERT_EQ(::recv(forged, challenge, sizeof(challenge), MSG_WAITALL),
            static_cast<ssize_t>(sizeof(challenge)));
  send(forged, collectives::wire::EncodeProof({}));
  EXPECT_EQ(read_to_end(forged), "");
  ::close(forged);
  // A hello as peers sent it before the data port asked for a proof: version 1,
  // no nonce. It is told why, and closed.
  int old = connect();
  std::string old_hello;
  for (uint32_t v : {collectives::wire::kHelloMagic, 1u, 1u, 0u, 4u,
                     static_cast<uint32_t>(group.size())}) {
    old_hello.append(reinterpret_cast<const char*>(&v), 4);
  }
  send(old, old_hello + group);
  const std::string answer = read_to_end(old);
  ::close(old);
  auto reply = collectives::wire::DecodeReply(collectives::wire::AsBytes(answer));
  ASSERT_TRUE(reply.ok() && reply->value) << answer;
  EXPECT_FALSE(reply->value->accepted);
  EXPECT_NE(reply->value->reason.find("protocol version 2"), std::string::npos)
      << reply->value->reason;

  int64_t now = before;
  (void)::tessera::testing::Eventually([&] { return (now = refused()) >= before + 2; });
  EXPECT_EQ(now, before + 2);
  std::ifstream log_file(cluster_->worker_log(0));
  const std::string log((std::istreambuf_iterator<char>(log_file)),
                        std::istreambuf_iterator<char>());
  EXPECT_NE(log.find("refused a connection from 127.0.0.1:"), std::string::npos) << log;
  EXPECT_NE(log.find("claiming to be rank 1 of group '" + group + "'"), std::string::npos) << log;

  // A mismatch poisons the mesh's group, so the next call forms it again: only
  // the real workers take part.
  auto mixed = OnWorkers(4, [&](int r) {
    return r == 3 ? Collective(r, "all_gather", "dtype=float32&shape=2", Floats({1, 2}))
                  : Collective(r, "all_reduce", "dtype=float32&shape=2", Floats({1, 2}));
  });
  for (int r = 0; r < 4; ++r) EXPECT_EQ(mixed[r].status, 409) << mixed[r].body;
  auto after = OnWorkers(4, [&](int r) {
    return Collective(r, "all_reduce", "dtype=int32&shape=1", std::string("\x01\0\0\0", 4));
  });
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(after[r].status, 200) << after[r].body;
    EXPECT_EQ(after[r].body, std::string("\x04\0\0\0", 4));
  }
}

// Last in the suite: it kills a worker.
TEST_F(CollectivesE2E, ZKilledPeerMidCollectiveIsNamed) {
  // Three workers enter an all-reduce that worker 3 never joins; then it dies. It
  // dies once each of them is inside the call (their /healthz counts it), not after
  // a while.
  std::thread killer([&] {
    auto inside = [&](int r) {
      auto health = cluster_->WorkerClient(r, 10).Call("GET", "/healthz");
      return health.ok() && health->value("collectives_in_flight", int64_t{0}) == 1;
    };
    EXPECT_TRUE(::tessera::testing::Eventually([&] { return inside(0) && inside(1) && inside(2); }))
        << "workers 0-2 never were all inside the all-reduce";
    cluster_->KillWorker(3);
  });
  auto answers = OnWorkers(3, [&](int r) {
    return Collective(r, "all_reduce", "dtype=float32&shape=1&timeout_ms=20000", Floats({1.f}));
  });
  killer.join();
  for (int r = 0; r < 3; ++r) {
    // Not a timeout: the lost connection ends the call at once, naming the worker.
    EXPECT_EQ(answers[r].status, 503) << answers[r].body;
    EXPECT_NE(answers[r].error.dump().find("w-worker-3"), std::string::npos)
        << answers[r].error.dump();
  }
}

TEST(MeshSelfTest, AWorkerThatDoesNotJoinIsNamed) {
  tools::ClusterOptions opts;
  opts.workers = 2;
  opts.worker_env[1] = {"TESSERA_FAULT_TASK_DELAY=mesh_init:4000"};
  auto c = StartCluster(opts);
  ASSERT_NE(c, nullptr);
  auto r = c->Call("PUT", "/api/v1/meshes/pair",
                   {{"axes", {{{"name", "data"}, {"size", 2}}}},
                    {"workers", {"w-worker-0", "w-worker-1"}},
                    {"self_test_timeout_ms", 1500}});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kDeadlineExceeded) << r.status().ToString();
  EXPECT_NE(r.status().ToString().find("w-worker-1"), std::string::npos) << r.status().ToString();
  // Not registered.
  EXPECT_FALSE(c->Call("GET", "/api/v1/meshes/pair").ok());
}

}  // namespace
}  // namespace tessera::e2e
