// The worker's collectives runtime with several "workers" in one process, each
// with its own data port (a TcpAcceptor) and MeshCollectives, over real TCP:
// every op along every subset of axes, on meshes whose workers hold several
// devices (so groups cut through workers unevenly), against a naive reference.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <thread>

#include "eventually.h"
#include "worker/collective_request.h"
#include "collectives/collectives.h"
#include "collectives/sparse_all_reduce.h"
#include "collectives/transport/subset_transport.h"
#include "collectives/transport/in_process_transport.h"
#include "collectives/transport/tcp/tcp_transport.h"
#include "worker/device_groups.h"
#include "worker/mesh_collectives.h"

namespace tessera {
// Test names show the mesh, not its bytes.
void PrintTo(const Mesh& mesh, std::ostream* os) {
  *os << mesh.ToString() << " x" << mesh.devices_per_worker;
}
}  // namespace tessera

namespace tessera::worker {
namespace {

using collectives::Tensor;

TEST(DeviceGroups, PartitionAlongAxes) {
  const Mesh mesh{"m", {{"data", 2}, {"model", 3}}, 2};  // 6 devices, 3 workers
  auto along_model = DeviceGroups(mesh, {"model"});
  ASSERT_EQ(along_model.size(), 2u);
  EXPECT_EQ(along_model[0].devices, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(along_model[0].workers, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(along_model[0].CountOn(mesh, 0), 2);
  EXPECT_EQ(along_model[0].CountOn(mesh, 1), 1);
  EXPECT_EQ(along_model[1].devices, (std::vector<int64_t>{3, 4, 5}));
  EXPECT_EQ(along_model[1].workers, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(along_model[1].FirstPositionOn(mesh, 2), 1);
  auto along_data = DeviceGroups(mesh, {"data"});
  ASSERT_EQ(along_data.size(), 3u);
  EXPECT_EQ(along_data[1].devices, (std::vector<int64_t>{1, 4}));
  auto all = DeviceGroups(mesh, {"data", "model"});
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].workers, (std::vector<int64_t>{0, 1, 2}));
}

TEST(DeviceGroups, AxesAreCheckedAndOrdered) {
  const Mesh mesh{"m", {{"data", 2}, {"model", 2}}, 1};
  EXPECT_EQ(*NormalizeAxes(mesh, {"model", "data"}), (std::vector<std::string>{"data", "model"}));
  EXPECT_EQ(*NormalizeAxes(mesh, {}), (std::vector<std::string>{"data", "model"}));
  auto bad = NormalizeAxes(mesh, {"pipe"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("pipe"), std::string::npos);
  EXPECT_FALSE(NormalizeAxes(mesh, {"data", "data"}).ok());
}

TEST(CollectiveRequest, ParsesAndNamesBadFields) {
  auto params = [](std::map<std::string, std::string> m) {
    return [m](const std::string& k) -> std::optional<std::string> {
      auto it = m.find(k);
      return it == m.end() ? std::nullopt : std::optional<std::string>(it->second);
    };
  };
  auto r = ParseCollectiveRequest(
      "all_reduce", params({{"dtype", "bfloat16"}, {"shape", "4,2"}, {"axes", "data,model"},
                            {"reduce", "mean"}, {"timeout_ms", "500"}}));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->dtype, DType::kBFloat16);
  EXPECT_EQ(r->shape, (Shape{4, 2}));
  EXPECT_EQ(r->axes, (std::vector<std::string>{"data", "model"}));
  EXPECT_EQ(r->reduce, collectives::ReduceOp::kMean);
  EXPECT_EQ(r->timeout_ms, 500);
  struct Bad {
    std::string op;
    std::map<std::string, std::string> params;
    std::string field;
  };
  for (const Bad& b : std::vector<Bad>{
           {"all_scatter", {{"dtype", "float32"}, {"shape", "1"}}, "op"},
           {"all_reduce", {{"shape", "1"}}, "dtype"},
           {"all_reduce", {{"dtype", "float32"}}, "shape"},
           {"all_reduce", {{"dtype", "float32"}, {"shape", "1"}, {"reduce", "avg"}}, "reduce"},
           {"all_gather", {{"dtype", "float32"}, {"shape", "1"}, {"tiled", "yes"}}, "tiled"},
           {"broadcast", {{"dtype", "float32"}, {"shape", "1"}, {"root", "-1"}}, "root"},
           {"broadcast", {{"dtype", "float32"}, {"shape", "1"}, {"root", "x"}}, "root"},
           {"barrier", {{"timeout_ms", "0"}}, "timeout_ms"},
           {"batch_all_reduce", {{"dtype", "float32"}}, "shapes"},
           {"batch_all_reduce", {{"dtype", "float32"}, {"shapes", "4;x"}}, "shapes"},
           {"batch_all_reduce", {{"dtype", "float32"}, {"shapes", "4"}, {"bytes_per_pack", "-1"}},
            "bytes_per_pack"},
           {"sparse_all_reduce", {{"dtype", "float32"}}, "dense_shape"},
           {"sparse_all_reduce", {{"dtype", "float32"}, {"dense_shape", ""}}, "dense_shape"},
           {"sparse_all_reduce", {{"dtype", "float32"}, {"dense_shape", "4,-2"}}, "dense_shape"},
           {"sparse_all_reduce", {{"dtype", "bool"}, {"dense_shape", "4"}}, "dtype"},
           {"sparse_all_reduce", {{"dtype", "float32"}, {"dense_shape", "4"}, {"rows", "1,-1"}}, "rows"},
           {"sparse_all_reduce", {{"dtype", "float32"}, {"dense_shape", "4"}, {"index_dtype", "float32"}},
            "index_dtype"},
           {"sparse_all_reduce",
            {{"dtype", "float32"}, {"dense_shape", "3000000000"}, {"index_dtype", "int32"}},
            "index_dtype"},
           {"sparse_all_reduce", {{"dtype", "float32"}, {"dense_shape", "4"}, {"path", "fast"}}, "path"},
       }) {
    auto res = ParseCollectiveRequest(b.op, params(b.params));
    ASSERT_FALSE(res.ok()) << b.op << " " << b.field;
    EXPECT_EQ(res.status().code(), Code::kInvalidArgument);
    EXPECT_EQ(res.status().details().value("field", ""), b.field) << res.status().ToString();
  }
  // Booleans and products that cannot be reduced.
  EXPECT_FALSE(
      ParseCollectiveRequest("all_reduce", params({{"dtype", "bool"}, {"shape", "1"}, {"reduce", "mean"}}))
          .ok());
  // JSON parameters: lists join with commas, numbers and booleans print.
  auto j = ParseCollectiveRequest(
      "all_gather", JsonParams({{"dtype", "int8"}, {"shape", {3}}, {"axes", {"x"}}, {"tiled", true}}));
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  EXPECT_TRUE(j->tiled);
  EXPECT_EQ(j->shape, Shape{3});
  auto sparse = ParseCollectiveRequest(
      "sparse_all_reduce",
      JsonParams({{"dtype", "float16"}, {"dense_shape", {100, 8}}, {"path", "dense"}}));
  ASSERT_TRUE(sparse.ok()) << sparse.status().ToString();
  EXPECT_EQ(sparse->dense_shape, (Shape{100, 8}));
  EXPECT_EQ(sparse->path, collectives::SparsePath::kDense);
  EXPECT_EQ(sparse->index_dtype, DType::kInt64);
  EXPECT_EQ(sparse->inputs_per_device(), 2u);
}

TEST(SubsetTransport, RoutesToParentRanksAndSharesErrors) {
  auto group = collectives::InProcessTransport::CreateGroup(4);
  auto a = collectives::SubsetTransport::Create(group[1].get(), {1, 3});
  auto b = collectives::SubsetTransport::Create(group[3].get(), {1, 3});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ((*a)->rank(), 0);
  EXPECT_EQ((*b)->rank(), 1);
  const uint8_t msg[] = {7, 8};
  auto deadline = collectives::Clock::now() + std::chrono::seconds(5);
  ASSERT_TRUE((*a)->Send(1, collectives::ConstBytes(msg, 2), deadline).ok());
  collectives::Buffer got;
  ASSERT_TRUE((*b)->Recv(0, &got, deadline).ok());
  EXPECT_EQ(got.size(), 2u);
  EXPECT_FALSE((*a)->Send(2, collectives::ConstBytes(msg, 2), deadline).ok());  // no rank 2
  EXPECT_FALSE(collectives::SubsetTransport::Create(group[0].get(), {1, 3}).ok());  // not a member
  EXPECT_FALSE(collectives::SubsetTransport::Create(group[1].get(), {1, 1}).ok());
  (*a)->Abort(Internal("boom"));
  EXPECT_FALSE(group[1]->status().ok());  // the parent is poisoned too
}

// Several groups through one acceptor per process, formed in any order.
TEST(TcpAcceptor, ServesManyGroupsOnOnePort) {
  constexpr int kRanks = 3;
  std::vector<std::unique_ptr<collectives::TcpAcceptor>> acceptors;
  std::vector<std::string> addresses;
  for (int r = 0; r < kRanks; ++r) {
    auto l = collectives::TcpListener::Bind("127.0.0.1", 0);
    ASSERT_TRUE(l.ok());
    auto a = collectives::TcpAcceptor::Start(std::move(*l), collectives::DataPortKey{});
    ASSERT_TRUE(a.ok());
    addresses.push_back("rank" + std::to_string(r) + "@" + (*a)->address());
    acceptors.push_back(std::move(*a));
  }
  std::vector<std::thread> threads;
  std::vector<Status> results(kRanks * 2);
  std::atomic<bool> joining[kRanks] = {};
  for (int r = 0; r < kRanks; ++r) {
    for (int g = 0; g < 2; ++g) {
      threads.emplace_back([&, r, g] {
        // Ranks join the second group in the opposite order: each once the rank
        // above it has begun to.
        if (g == 1) {
          ASSERT_TRUE(testing::Eventually([&] { return r == kRanks - 1 || joining[r + 1].load(); }));
          joining[r] = true;
        }
        collectives::TcpOptions o;
        o.rank = r;
        o.size = kRanks;
        o.group_id = "group-" + std::to_string(g);
        o.connect_timeout = std::chrono::seconds(10);
        auto t = collectives::TcpTransport::Connect(*acceptors[r], addresses, o);
        if (!t.ok()) {
          results[r * 2 + g] = t.status();
          return;
        }
        collectives::Group group(std::move(*t), o.group_id);
        Tensor x = Tensor::Zeros(DType::kInt32, {1});
        x.values<int32_t>()[0] = r + 1 + 100 * g;
        results[r * 2 + g] = collectives::AllReduce(group, x);
        if (results[r * 2 + g].ok() && x.values<int32_t>()[0] != 6 + 300 * g) {
          results[r * 2 + g] = Internal("wrong sum");
        }
      });
    }
  }
  for (auto& t : threads) t.join();
  for (const Status& st : results) EXPECT_TRUE(st.ok()) << st.ToString();

  // A group that never forms names the ranks that did not connect.
  collectives::TcpOptions o;
  o.rank = 0;
  o.size = 2;
  o.group_id = "lonely";
  o.connect_timeout = std::chrono::milliseconds(300);
  auto lonely = collectives::TcpTransport::Connect(*acceptors[0], {addresses[0], addresses[1]}, o);
  ASSERT_FALSE(lonely.ok());
  EXPECT_EQ(lonely.status().code(), Code::kDeadlineExceeded);
  EXPECT_EQ(lonely.status().details()["missing_ranks"], Json::array({1}));
}

// ---- MeshCollectives against a reference ----

struct Workers {
  std::vector<std::unique_ptr<collectives::TcpAcceptor>> acceptors;
  std::vector<std::string> addresses;
  std::vector<std::unique_ptr<MeshCollectives>> runtimes;
  std::vector<MeshPlacement> placements;

  explicit Workers(const Mesh& mesh) {
    const int n = static_cast<int>(mesh.num_workers());
    std::vector<std::string> ids;
    for (int r = 0; r < n; ++r) {
      auto listener = collectives::TcpListener::Bind("127.0.0.1", 0);
      auto a = collectives::TcpAcceptor::Start(std::move(listener).value(),
                                               collectives::DataPortKey{});
      addresses.push_back((*a)->address());
      acceptors.push_back(std::move(*a));
      ids.push_back("w-" + std::to_string(r));
    }
    for (int r = 0; r < n; ++r) {
      runtimes.push_back(std::make_unique<MeshCollectives>(
          acceptors[r].get(), [this](const MeshPlacement&) { return addresses; }));
      MeshPlacement p{mesh, r, {}, ids};
      for (int64_t i = 0; i < mesh.devices_per_worker; ++i) {
        p.devices.push_back(r * mesh.devices_per_worker + i);
      }
      placements.push_back(p);
    }
  }

  // Runs `r` on workers `only` (default all) with `per_device` inputs per device
  // from `in` (device-major, by global device).
  std::vector<Result<CollectiveResult>> Run(const CollectiveRequest& r, const std::vector<Tensor>& in,
                                            size_t per_device = 1, std::vector<size_t> only = {}) {
    if (only.empty()) {
      for (size_t w = 0; w < runtimes.size(); ++w) only.push_back(w);
    }
    std::vector<Result<CollectiveResult>> out(runtimes.size(), Internal("not run"));
    std::vector<std::thread> threads;
    for (size_t w : only) {
      threads.emplace_back([&, w] {
        std::vector<Tensor> mine;
        for (int64_t d : placements[w].devices) {
          for (size_t i = 0; i < per_device && !in.empty(); ++i) {
            mine.push_back(in[static_cast<size_t>(d) * per_device + i]);
          }
        }
        out[w] = runtimes[w]->Run(placements[w], r, std::move(mine));
      });
    }
    for (auto& t : threads) t.join();
    return out;
  }
};

std::vector<std::vector<std::string>> AxisSubsets(const Mesh& mesh) {
  std::vector<std::vector<std::string>> out;
  for (size_t mask = 1; mask < (size_t{1} << mesh.axes.size()); ++mask) {
    std::vector<std::string> axes;
    for (size_t i = 0; i < mesh.axes.size(); ++i) {
      if (mask & (size_t{1} << i)) axes.push_back(mesh.axes[i].name);
    }
    out.push_back(axes);
  }
  return out;
}

class MeshCollectivesTest : public ::testing::TestWithParam<Mesh> {};

TEST_P(MeshCollectivesTest, EveryOpAlongEveryAxisSetMatchesTheReference) {
  const Mesh mesh = GetParam();
  Workers workers(mesh);
  std::mt19937 rng(static_cast<uint32_t>(mesh.num_devices()));
  const int64_t n_dev = mesh.num_devices();
  for (const auto& axes : AxisSubsets(mesh)) {
    const auto groups = DeviceGroups(mesh, axes);
    const int64_t group_size = static_cast<int64_t>(groups[0].devices.size());
    const Shape shape{group_size * 2, 3};
    std::vector<Tensor> in;
    for (int64_t d = 0; d < n_dev; ++d) {
      Tensor t = Tensor::Zeros(DType::kInt32, shape);
      for (int32_t& v : t.values<int32_t>()) v = static_cast<int32_t>(rng() % 1000) - 500;
      in.push_back(t);
    }
    auto group_of = [&](int64_t d) -> const DeviceGroup& {
      for (const auto& g : groups) {
        if (std::count(g.devices.begin(), g.devices.end(), d)) return g;
      }
      throw std::logic_error("no group");
    };
    auto sum_of = [&](const DeviceGroup& g) {
      Tensor s = Tensor::Zeros(DType::kInt32, shape);
      for (int64_t d : g.devices) {
        for (size_t i = 0; i < s.values<int32_t>().size(); ++i) {
          s.values<int32_t>()[i] += in[d].values<int32_t>()[i];
        }
      }
      return s;
    };
    for (CollectiveOp op : {CollectiveOp::kAllReduce, CollectiveOp::kAllGather,
                            CollectiveOp::kReduceScatter, CollectiveOp::kBroadcast}) {
      for (bool tiled : {false, true}) {
        if (op != CollectiveOp::kAllGather && tiled) continue;
        CollectiveRequest r;
        r.op = op;
        r.mesh = mesh.name;
        r.axes = axes;
        r.dtype = DType::kInt32;
        r.shape = shape;
        r.tiled = tiled;
        r.root = group_size - 1;
        r.timeout_ms = 10000;
        auto results = workers.Run(r, in);
        for (size_t w = 0; w < results.size(); ++w) {
          const std::string what = std::string(CollectiveOpName(op)) + " tiled=" +
                                   std::to_string(tiled) + " mesh " + mesh.ToString() + " dpw " +
                                   std::to_string(mesh.devices_per_worker) + " along " +
                                   Json(axes).dump() + " worker " + std::to_string(w);
          ASSERT_TRUE(results[w].ok()) << what << ": " << results[w].status().ToString();
          const auto& p = workers.placements[w];
          ASSERT_EQ(results[w]->outputs.size(), p.devices.size()) << what;
          for (size_t i = 0; i < p.devices.size(); ++i) {
            const int64_t d = p.devices[i];
            const DeviceGroup& g = group_of(d);
            const int64_t pos = std::find(g.devices.begin(), g.devices.end(), d) - g.devices.begin();
            Tensor want;
            if (op == CollectiveOp::kAllReduce) {
              want = sum_of(g);
            } else if (op == CollectiveOp::kReduceScatter) {
              Tensor s = sum_of(g);
              const int64_t rows = shape[0] / group_size;
              want = Tensor::Zeros(DType::kInt32, {rows, 3});
              std::copy_n(s.data.begin() + pos * rows * 3 * 4, rows * 3 * 4, want.data.begin());
            } else if (op == CollectiveOp::kBroadcast) {
              want = in[g.devices[r.root]];
            } else {
              want.dtype = DType::kInt32;
              want.shape = tiled ? Shape{shape[0] * group_size, 3} : Shape{group_size, shape[0], 3};
              for (int64_t gd : g.devices) {
                want.data.insert(want.data.end(), in[gd].data.begin(), in[gd].data.end());
              }
            }
            EXPECT_EQ(results[w]->outputs[i], want) << what << " device " << d;
          }
        }
      }
    }
  }
  // batch_all_reduce: three tensors per device (one a scalar), packed in 16-byte packs.
  for (const auto& axes : AxisSubsets(mesh)) {
    const auto groups = DeviceGroups(mesh, axes);
    const std::vector<Shape> shapes = {{2, 3}, {}, {5}};
    std::vector<Tensor> in;  // device-major
    for (int64_t d = 0; d < n_dev; ++d) {
      for (const Shape& shape : shapes) {
        Tensor t = Tensor::Zeros(DType::kInt32, shape);
        for (int32_t& v : t.values<int32_t>()) v = static_cast<int32_t>(rng() % 1000) - 500;
        in.push_back(t);
      }
    }
    CollectiveRequest r;
    r.op = CollectiveOp::kBatchAllReduce;
    r.mesh = mesh.name;
    r.axes = axes;
    r.dtype = DType::kInt32;
    r.shapes = shapes;
    r.bytes_per_pack = 16;
    r.timeout_ms = 10000;
    auto results = workers.Run(r, in, shapes.size());
    for (size_t w = 0; w < results.size(); ++w) {
      ASSERT_TRUE(results[w].ok()) << Json(axes).dump() << ": " << results[w].status().ToString();
      const auto& p = workers.placements[w];
      ASSERT_EQ(results[w]->outputs.size(), p.devices.size() * shapes.size());
      for (size_t j = 0; j < p.devices.size(); ++j) {
        const int64_t d = p.devices[j];
        const DeviceGroup* g = nullptr;
        for (const auto& cand : groups) {
          if (std::count(cand.devices.begin(), cand.devices.end(), d)) g = &cand;
        }
        for (size_t i = 0; i < shapes.size(); ++i) {
          Tensor want = Tensor::Zeros(DType::kInt32, shapes[i]);
          for (int64_t gd : g->devices) {
            for (size_t e = 0; e < want.values<int32_t>().size(); ++e) {
              want.values<int32_t>()[e] += in[gd * shapes.size() + i].values<int32_t>()[e];
            }
          }
          EXPECT_EQ(results[w]->outputs[j * shapes.size() + i], want)
              << "batch along " << Json(axes).dump() << " device " << d << " tensor " << i;
        }
      }
    }
  }
  // sparse_all_reduce: each device brings rows of a [6, 2] tensor; a worker's
  // share of a group is its devices' rows concatenated. Equal counts per device,
  // then a different count on every device.
  for (const auto& axes : AxisSubsets(mesh)) {
    const auto groups = DeviceGroups(mesh, axes);
    for (bool equal : {true, false}) {
      for (auto path : {collectives::SparsePath::kAuto, collectives::SparsePath::kGather,
                        collectives::SparsePath::kDense}) {
        const Shape dense_shape{6, 2};
        std::vector<Tensor> in;  // device-major: values, indices
        std::vector<Tensor> dense_in;
        for (int64_t d = 0; d < n_dev; ++d) {
          const int64_t rows = equal ? 2 : 1 + d % 3;
          collectives::IndexedSlices s{Tensor::Zeros(DType::kInt32, {rows, 2}), {}, dense_shape};
          for (int32_t& v : s.values.values<int32_t>()) v = static_cast<int32_t>(rng() % 100);
          Tensor idx = Tensor::Zeros(DType::kInt64, {rows});
          for (int64_t& i : idx.values<int64_t>()) i = static_cast<int64_t>(rng() % 6);
          s.indices.assign(idx.values<int64_t>().begin(), idx.values<int64_t>().end());
          dense_in.push_back(*collectives::Densify(s));
          in.push_back(s.values);
          in.push_back(idx);
        }
        CollectiveRequest r;
        r.op = CollectiveOp::kSparseAllReduce;
        r.mesh = mesh.name;
        r.axes = axes;
        r.dtype = DType::kInt32;
        r.dense_shape = dense_shape;
        r.path = path;
        r.timeout_ms = 10000;
        auto results = workers.Run(r, in, 2);
        const std::string what = "sparse along " + Json(axes).dump() + " equal=" +
                                 std::to_string(equal) + " path " + collectives::SparsePathName(path);
        for (size_t w = 0; w < results.size(); ++w) {
          ASSERT_TRUE(results[w].ok()) << what << ": " << results[w].status().ToString();
          const auto& p = workers.placements[w];
          ASSERT_EQ(results[w]->outputs.size(), p.devices.size() * 2) << what;
          for (size_t j = 0; j < p.devices.size(); ++j) {
            const int64_t d = p.devices[j];
            const DeviceGroup* g = nullptr;
            for (const auto& cand : groups) {
              if (std::count(cand.devices.begin(), cand.devices.end(), d)) g = &cand;
            }
            Tensor want = Tensor::Zeros(DType::kInt32, dense_shape);
            std::map<int64_t, int64_t> rows_of_worker;
            for (int64_t gd : g->devices) {
              for (size_t e = 0; e < want.values<int32_t>().size(); ++e) {
                want.values<int32_t>()[e] += dense_in[gd].values<int32_t>()[e];
              }
              rows_of_worker[mesh.WorkerOfDevice(gd)] += in[gd * 2].shape[0];
            }
            bool counts_equal = true;
            for (const auto& [worker, rows] : rows_of_worker) {
              counts_equal = counts_equal && rows == rows_of_worker.begin()->second;
            }
            const bool gathered = path == collectives::SparsePath::kGather ||
                                  (path == collectives::SparsePath::kAuto && counts_equal);
            EXPECT_EQ(results[w]->paths.at(j), gathered ? "gather" : "dense") << what;
            const Tensor& idx = results[w]->outputs[j * 2 + 1];
            collectives::IndexedSlices sum{results[w]->outputs[j * 2],
                                           {idx.values<int64_t>().begin(), idx.values<int64_t>().end()},
                                           dense_shape};
            auto dense = collectives::Densify(sum);
            ASSERT_TRUE(dense.ok()) << what << ": " << dense.status().ToString();
            EXPECT_EQ(*dense, want) << what << " device " << d;
          }
        }
      }
    }
  }
  // Barrier and a process-level op on the same mesh connections.
  CollectiveRequest barrier;
  barrier.op = CollectiveOp::kBarrier;
  barrier.name = "b";
  for (auto& res : workers.Run(barrier, {})) EXPECT_TRUE(res.ok()) << res.status().ToString();
}

INSTANTIATE_TEST_SUITE_P(Meshes, MeshCollectivesTest,
                         ::testing::Values(Mesh{"flat", {{"x", 4}}, 1},
                                           Mesh{"grid", {{"data", 2}, {"model", 2}}, 2},
                                           Mesh{"uneven", {{"data", 2}, {"model", 3}}, 2},
                                           Mesh{"cube", {{"a", 2}, {"b", 2}, {"c", 2}}, 2},
                                           Mesh{"single", {{"x", 4}}, 4}),
                         [](const ::testing::TestParamInfo<Mesh>& info) { return info.param.name; });

// An all-reduce of one float32 on mesh "m".
CollectiveRequest ScalarAllReduce(int64_t timeout_ms) {
  CollectiveRequest r;
  r.op = CollectiveOp::kAllReduce;
  r.mesh = "m";
  r.dtype = DType::kFloat32;
  r.shape = {1};
  r.timeout_ms = timeout_ms;
  return r;
}

TEST(MeshCollectives, ErrorsNameWorkersAndTheMeshRecovers) {
  const Mesh mesh{"m", {{"x", 3}}, 1};
  Workers workers(mesh);
  CollectiveRequest r = ScalarAllReduce(500);
  std::vector<Tensor> in(3, Tensor::Zeros(DType::kFloat32, {1}));
  // Worker 2 does not come: the others time out naming it.
  auto out = workers.Run(r, in, 1, {0, 1});
  out.pop_back();
  for (const auto& res : out) {
    ASSERT_FALSE(res.ok());
    EXPECT_EQ(res.status().code(), Code::kDeadlineExceeded) << res.status().ToString();
    EXPECT_EQ(res.status().details()["missing_workers"], Json::array({"w-2"})) << res.status().ToString();
  }
  // The next call (by everyone) rebuilds the connections and succeeds.
  r.timeout_ms = 10000;
  for (auto& res : workers.Run(r, in)) EXPECT_TRUE(res.ok()) << res.status().ToString();
  // A wrong number of inputs is refused before any communication.
  auto wrong = workers.runtimes[0]->Run(workers.placements[0], r, {});
  EXPECT_EQ(wrong.status().code(), Code::kInvalidArgument);
}

TEST(MeshCollectives, AnAbortWhileJoiningANewGroupEndsTheStaleCall) {
  // A job's call on worker 0 starts late, after the mesh's group was poisoned:
  // it is joining a new group when the job's abort comes, so there is no
  // transport to stop. It must not run once the group forms for the next job's
  // collective, which the other workers have begun.
  const Mesh mesh{"m", {{"x", 3}}, 1};
  Workers workers(mesh);
  CollectiveRequest r = ScalarAllReduce(300);
  std::vector<Tensor> in(3, Tensor::Zeros(DType::kFloat32, {1}));
  // Worker 2 stays away: everyone else times out and the group is poisoned.
  (void)workers.Run(r, in, 1, {0, 1});
  CollectiveRequest stale = r;
  stale.job = "j-stale";
  stale.timeout_ms = 20000;
  Result<CollectiveResult> stale_result = Internal("not run");
  std::thread late([&] { stale_result = workers.runtimes[0]->Run(workers.placements[0], stale, {in[0]}); });
  // The stale call has begun (joining the new group, or about to): the abort
  // is remembered either way.
  ASSERT_TRUE(testing::Eventually([&] { return workers.runtimes[0]->in_flight() == 1; }));
  workers.runtimes[0]->Abort("m", "j-stale", Unavailable("job j-stale failed elsewhere"));
  CollectiveRequest barrier;
  barrier.op = CollectiveOp::kBarrier;
  barrier.mesh = "m";
  barrier.name = "next-job";
  barrier.timeout_ms = 20000;
  std::vector<Result<CollectiveResult>> next(3, Internal("not run"));
  std::thread b1([&] { next[1] = workers.runtimes[1]->Run(workers.placements[1], barrier, {}); });
  std::thread b2([&] { next[2] = workers.runtimes[2]->Run(workers.placements[2], barrier, {}); });
  late.join();
  EXPECT_EQ(stale_result.status().code(), Code::kUnavailable) << stale_result.status().ToString();
  next[0] = workers.runtimes[0]->Run(workers.placements[0], barrier, {});
  b1.join();
  b2.join();
  for (const auto& res : next) EXPECT_TRUE(res.ok()) << res.status().ToString();
}

TEST(MeshCollectives, AMalformedSparseShareFailsEveryWorkerNamingItsDevice) {
  const Mesh mesh{"m", {{"x", 4}}, 2};  // 2 workers, 2 devices each
  Workers workers(mesh);
  CollectiveRequest r;
  r.op = CollectiveOp::kSparseAllReduce;
  r.mesh = "m";
  r.dtype = DType::kFloat32;
  r.dense_shape = {3, 1};
  r.timeout_ms = 20000;
  std::vector<Tensor> in;
  for (int d = 0; d < 4; ++d) {
    in.push_back(Tensor::Zeros(DType::kFloat32, {1, 1}));
    Tensor idx = Tensor::Zeros(DType::kInt64, {1});
    idx.values<int64_t>()[0] = d == 3 ? 7 : d % 3;  // device 3 (worker 1) points past row 2
    in.push_back(idx);
  }
  for (const auto& res : workers.Run(r, in, 2)) {
    ASSERT_FALSE(res.ok());
    const Status& st = res.status();
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.ToString();
    EXPECT_EQ(st.details()["invalid_workers"], Json::array({"w-1"})) << st.ToString();
    EXPECT_EQ(st.details().value("field", ""), "indices") << st.ToString();
    EXPECT_NE(st.message().find("device 3"), std::string::npos) << st.ToString();
  }
  in[7].values<int64_t>()[0] = 2;
  for (const auto& res : workers.Run(r, in, 2)) EXPECT_TRUE(res.ok()) << res.status().ToString();
}

}  // namespace
}  // namespace tessera::worker
