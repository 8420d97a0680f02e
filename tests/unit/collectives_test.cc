// The collectives engine: every op against a naive reference, over N ranks as
// threads, on the in-process transport and on TCP over 127.0.0.1.
#include "eventually.h"
#include "collectives/collectives.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <thread>

#include "collectives/algorithms.h"
#include "collectives/batch_all_reduce.h"
#include "api/half.h"
#include "collectives/hierarchical_all_reduce.h"
#include "collectives/transport/in_process_transport.h"
#include "collectives/local_mesh.h"
#include "collectives/sparse_all_reduce.h"
#include "tests/unit/forwarding_transport.h"

namespace tessera::collectives {
namespace {

using namespace std::chrono_literals;

// details[key] of `status`, or null: const operator[] must not see a missing key.
nlohmann::json Detail(const Status& status, const std::string& key) {
  const auto& d = status.details();
  return d.is_object() && d.contains(key) ? d.at(key) : nlohmann::json();
}

using Groups = std::vector<std::unique_ptr<Group>>;

enum class Kind { kInProcess, kTcp };

Groups MakeGroups(Kind kind, int n, const std::string& id = "test") {
  std::vector<std::unique_ptr<Transport>> transports;
  if (kind == Kind::kInProcess) {
    transports = InProcessTransport::CreateGroup(n);
  } else {
    auto mesh = ConnectLoopbackMesh(n, id);
    EXPECT_TRUE(mesh.ok()) << mesh.status().ToString();
    if (mesh.ok()) transports = std::move(mesh).value();
  }
  Groups groups;
  for (auto& t : transports) groups.push_back(std::make_unique<Group>(std::move(t), id));
  return groups;
}

// ---- Element access and a naive reference, independent of reduce.cc ----

double Get(const Tensor& t, size_t i) {
  const uint8_t* p = t.data.data() + i * DTypeSize(t.dtype);
  auto load = [p](auto v) {
    std::memcpy(&v, p, sizeof(v));
    return v;
  };
  switch (t.dtype) {
    case DType::kFloat32:
      return load(float{});
    case DType::kFloat64:
      return load(double{});
    case DType::kFloat16:
      return HalfToFloat(load(uint16_t{}));
    case DType::kBFloat16:
      return BFloat16ToFloat(load(uint16_t{}));
    case DType::kInt8:
      return load(int8_t{});
    case DType::kInt16:
      return load(int16_t{});
    case DType::kInt32:
      return load(int32_t{});
    case DType::kInt64:
      return static_cast<double>(load(int64_t{}));
    case DType::kUInt8:
      return load(uint8_t{});
    case DType::kBool:
      return load(uint8_t{}) != 0;
  }
  return 0;
}

void Set(Tensor& t, size_t i, double v) {
  uint8_t* p = t.data.data() + i * DTypeSize(t.dtype);
  auto store = [p](auto x) { std::memcpy(p, &x, sizeof(x)); };
  switch (t.dtype) {
    case DType::kFloat32:
      return store(static_cast<float>(v));
    case DType::kFloat64:
      return store(v);
    case DType::kFloat16:
      return store(FloatToHalf(static_cast<float>(v)));
    case DType::kBFloat16:
      return store(FloatToBFloat16(static_cast<float>(v)));
    case DType::kInt8:
      return store(static_cast<int8_t>(v));
    case DType::kInt16:
      return store(static_cast<int16_t>(v));
    case DType::kInt32:
      return store(static_cast<int32_t>(v));
    case DType::kInt64:
      return store(static_cast<int64_t>(v));
    case DType::kUInt8:
      return store(static_cast<uint8_t>(v));
    case DType::kBool:
      return store(static_cast<uint8_t>(v != 0));
  }
}

bool IsFloat(DType d) {
  return d == DType::kFloat32 || d == DType::kFloat64 || d == DType::kFloat16 ||
         d == DType::kBFloat16;
}

// Small integers: every sum, product, min, max and mean of ≤ 5 of them is exact
// in every dtype, so any reduction order gives the reference's bits.
Tensor RandomExact(DType dtype, const Shape& shape, ReduceOp op, std::mt19937& rng) {
  Tensor t = Tensor::Zeros(dtype, shape);
  const bool is_unsigned = dtype == DType::kUInt8 || dtype == DType::kBool;
  const int hi = dtype == DType::kBool ? 1 : op == ReduceOp::kProd ? 2 : 3;
  std::uniform_int_distribution<int> dist(is_unsigned ? 0 : -hi, hi);
  for (size_t i = 0; i < static_cast<size_t>(t.num_elements()); ++i) Set(t, i, dist(rng));
  return t;
}

// Element by element in rank order, in the accumulation type (float32 for the
// 16-bit floats), like the direct algorithm; exact for RandomExact inputs.
Tensor Reference(const std::vector<Tensor>& in, ReduceOp op) {
  Tensor out = in[0];
  const bool is_bool = out.dtype == DType::kBool;
  const bool in_float = IsFloat(out.dtype) && out.dtype != DType::kFloat64;
  auto round = [&](double v) { return in_float ? static_cast<double>(static_cast<float>(v)) : v; };
  for (size_t i = 0; i < static_cast<size_t>(out.num_elements()); ++i) {
    double acc = Get(in[0], i);
    for (size_t r = 1; r < in.size(); ++r) {
      const double v = Get(in[r], i);
      switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kMean:
          acc = is_bool ? (acc != 0 || v != 0) : round(acc + v);
          break;
        case ReduceOp::kProd:
          acc = is_bool ? (acc != 0 && v != 0) : round(acc * v);
          break;
        case ReduceOp::kMin:
          acc = std::min(acc, v);
          break;
        case ReduceOp::kMax:
          acc = std::max(acc, v);
          break;
      }
    }
    if (op == ReduceOp::kMean) {
      const double n = static_cast<double>(in.size());
      acc = IsFloat(out.dtype) ? round(acc / n) : std::trunc(acc / n);
    }
    Set(out, i, acc);
  }
  return out;
}

void ExpectValuesEqual(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.dtype, want.dtype) << what;
  ASSERT_EQ(got.shape, want.shape) << what;
  ASSERT_EQ(got.data.size(), want.data.size()) << what;
  for (size_t i = 0; i < static_cast<size_t>(got.num_elements()); ++i) {
    ASSERT_EQ(Get(got, i), Get(want, i)) << what << " element " << i;
  }
}

Shape RandomShape(std::mt19937& rng, int max_rank = 3, int max_dim = 6) {
  Shape shape(std::uniform_int_distribution<int>(0, max_rank)(rng));
  for (auto& d : shape) d = std::uniform_int_distribution<int>(0, max_dim)(rng);
  return shape;
}

template <typename T>
T Pick(std::mt19937& rng, const std::vector<T>& choices) {
  return choices[std::uniform_int_distribution<size_t>(0, choices.size() - 1)(rng)];
}

const std::vector<ReduceOp> kOps = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax,
                                    ReduceOp::kMean};
const std::vector<Algorithm> kAlgorithms = {Algorithm::kAuto,
                                            Algorithm::kDirect,
                                            Algorithm::kRecursiveDoubling,
                                            Algorithm::kRing,
                                            Algorithm::kHalvingDoubling,
                                            Algorithm::kStar,
                                            Algorithm::kScatter};

// Options that exercise chunking on small tensors.
Options RandomOptions(std::mt19937& rng) {
  Options o;
  o.timeout = 20s;
  o.algorithm = Pick(rng, kAlgorithms);
  o.chunk_bytes = Pick<size_t>(rng, {8, 24, 256, 1 << 20});
  o.direct_max_bytes = Pick<size_t>(rng, {0, 64, 16 << 10});
  o.large_min_bytes = Pick<size_t>(rng, {128, 256 << 10});
  o.scatter_min_bytes = Pick<size_t>(rng, {0, 4 << 20});
  return o;
}

// Runs fn(rank) on every rank and collects the statuses.
std::vector<Status> OnAllRanks(int n, const std::function<Status(int)>& fn) {
  std::vector<Status> statuses(n);
  RunRanks(n, [&](int r) { statuses[r] = fn(r); });
  return statuses;
}

void ExpectAllOk(const std::vector<Status>& statuses, const std::string& what) {
  for (size_t r = 0; r < statuses.size(); ++r) {
    EXPECT_TRUE(statuses[r].ok()) << what << " rank " << r << ": " << statuses[r].ToString();
  }
}

void ExpectSameBytes(const std::vector<Tensor>& outputs, const std::string& what) {
  for (size_t r = 1; r < outputs.size(); ++r) {
    EXPECT_TRUE(outputs[r] == outputs[0]) << what << ": rank " << r << " differs from rank 0";
  }
}

class CollectivesTest : public ::testing::TestWithParam<Kind> {
 protected:
  Groups Make(int n, const std::string& id = "test") { return MakeGroups(GetParam(), n, id); }
};

INSTANTIATE_TEST_SUITE_P(Transports, CollectivesTest,
                         ::testing::Values(Kind::kInProcess, Kind::kTcp), [](const auto& info) {
                           return info.param == Kind::kInProcess ? "InProcess" : "Tcp";
                         });

// ---- all_reduce ----

TEST_P(CollectivesTest, AllReduceMatchesReferenceOnEveryDtypeOpAndAlgorithm) {
  std::mt19937 rng(20261122);
  for (int n = 1; n <= 5; ++n) {
    Groups groups = Make(n);
    ASSERT_EQ(groups.size(), static_cast<size_t>(n));
    for (int iter = 0; iter < 30; ++iter) {
      const DType dtype = Pick(rng, AllDTypes());
      ReduceOp op = Pick(rng, kOps);
      if (dtype == DType::kBool && op == ReduceOp::kMean) op = ReduceOp::kMax;
      Shape shape = iter % 5 == 4 ? Shape{std::uniform_int_distribution<int>(1, 3000)(rng)}
                                  : RandomShape(rng);
      AllReduceOptions o;
      static_cast<Options&>(o) = RandomOptions(rng);
      o.op = op;
      std::vector<Tensor> inputs;
      for (int r = 0; r < n; ++r) inputs.push_back(RandomExact(dtype, shape, op, rng));
      const std::string what = "n=" + std::to_string(n) + " " + DescribeType(dtype, shape) + " " +
                               std::string(ReduceOpName(op)) + " " +
                               std::string(AlgorithmName(o.algorithm));
      std::vector<Tensor> outputs = inputs;
      ExpectAllOk(OnAllRanks(n, [&](int r) { return AllReduce(*groups[r], outputs[r], o); }), what);
      ExpectSameBytes(outputs, what);
      ExpectValuesEqual(outputs[0], Reference(inputs, op), what);
    }
  }
}

TEST_P(CollectivesTest, AllReduceOfRealsIsBitIdenticalAcrossRanks) {
  std::mt19937 rng(7);
  std::normal_distribution<double> normal(0, 1);
  for (int n : {3, 4, 5}) {
    Groups groups = Make(n);
    for (Algorithm algorithm : kAlgorithms) {
      for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
        AllReduceOptions o;
        o.algorithm = algorithm;
        o.chunk_bytes = 100;
        o.op = ReduceOp::kMean;
        std::vector<Tensor> inputs;
        for (int r = 0; r < n; ++r) {
          Tensor t = Tensor::Zeros(dtype, {257});
          for (size_t i = 0; i < 257; ++i) Set(t, i, normal(rng));
          inputs.push_back(t);
        }
        std::vector<Tensor> outputs = inputs;
        ExpectAllOk(OnAllRanks(n, [&](int r) { return AllReduce(*groups[r], outputs[r], o); }),
                    "reals");
        ExpectSameBytes(outputs, std::string(AlgorithmName(algorithm)));
        const Tensor want = Reference(inputs, ReduceOp::kMean);
        const double tolerance = dtype == DType::kFloat64   ? 1e-12
                                 : dtype == DType::kFloat32 ? 1e-5
                                                            : 0.05;  // an ulp of a 16-bit float
        for (size_t i = 0; i < 257; ++i) {
          EXPECT_NEAR(Get(outputs[0], i), Get(want, i), tolerance) << i;
        }
        if (algorithm == Algorithm::kDirect) {  // rank order, as the reference: same bits
          ExpectValuesEqual(outputs[0], want, "direct");
        }
      }
    }
  }
}

TEST_P(CollectivesTest, LargeRingAllReduce) {
  const int n = 4;
  Groups groups = Make(n);
  std::mt19937 rng(3);
  for (DType dtype : {DType::kFloat32, DType::kInt64, DType::kBFloat16}) {
    std::vector<Tensor> inputs;
    for (int r = 0; r < n; ++r) inputs.push_back(RandomExact(dtype, {300001}, ReduceOp::kSum, rng));
    AllReduceOptions o;
    o.chunk_bytes = 64 << 10;
    std::vector<Tensor> outputs = inputs;
    ExpectAllOk(OnAllRanks(n, [&](int r) { return AllReduce(*groups[r], outputs[r], o); }), "ring");
    ExpectSameBytes(outputs, "ring");
    ExpectValuesEqual(outputs[0], Reference(inputs, ReduceOp::kSum), "ring");
  }
}

TEST_P(CollectivesTest, IntegerSumsWrapAndMeansTruncate) {
  Groups groups = Make(2);
  std::vector<Tensor> t(2, Tensor::Zeros(DType::kInt8, {2}));
  t[0].values<int8_t>()[0] = 100;
  t[1].values<int8_t>()[0] = 100;  // 200 wraps to -56
  t[0].values<int8_t>()[1] = -7;
  t[1].values<int8_t>()[1] = 0;  // mean -3.5 truncates to -3
  std::vector<Tensor> sum = t, mean = t;
  ExpectAllOk(OnAllRanks(2, [&](int r) { return AllReduce(*groups[r], sum[r]); }), "sum");
  AllReduceOptions o;
  o.op = ReduceOp::kMean;
  ExpectAllOk(OnAllRanks(2, [&](int r) { return AllReduce(*groups[r], mean[r], o); }), "mean");
  EXPECT_EQ(sum[0].values<int8_t>()[0], -56);
  EXPECT_EQ(mean[1].values<int8_t>()[1], -3);
}

TEST_P(CollectivesTest, MeanOfBoolIsRejectedLocallyAndTheGroupStaysUsable) {
  Groups groups = Make(2);
  AllReduceOptions o;
  o.op = ReduceOp::kMean;
  std::vector<Tensor> t(2, Tensor::Zeros(DType::kBool, {3}));
  for (const Status& st : OnAllRanks(2, [&](int r) { return AllReduce(*groups[r], t[r], o); })) {
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.ToString();
    EXPECT_NE(st.message().find("bool"), std::string::npos);
  }
  ExpectAllOk(OnAllRanks(2, [&](int r) { return Barrier(*groups[r]); }), "after");
}

TEST_P(CollectivesTest, CheckInfNanReportsNonFiniteResults) {
  const int n = 3;
  Groups groups = Make(n);
  AllReduceOptions o;
  o.check_inf_nan = true;
  std::vector<Tensor> t(n, Tensor::Zeros(DType::kFloat32, {4}));
  t[1].values<float>()[2] = std::nanf("");
  for (const Status& st : OnAllRanks(n, [&](int r) { return AllReduce(*groups[r], t[r], o); })) {
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.ToString();
    EXPECT_EQ(Detail(st, "nan_count"), 1);
    EXPECT_EQ(Detail(st, "first_index"), 2);
  }
  // float16 overflows to infinity when rounded back: 3 · 30000 > 65504.
  std::vector<Tensor> h(n, Tensor::Zeros(DType::kFloat16, {2}));
  for (auto& x : h) x.values<uint16_t>()[1] = FloatToHalf(30000);
  for (const Status& st : OnAllRanks(n, [&](int r) { return AllReduce(*groups[r], h[r], o); })) {
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.ToString();
    EXPECT_EQ(Detail(st, "inf_count"), 1);
  }
  o.check_inf_nan = false;  // without the check, the same inputs pass
  ExpectAllOk(OnAllRanks(n, [&](int r) { return AllReduce(*groups[r], t[r], o); }), "no check");
}

// ---- all_gather, reduce_scatter, broadcast ----

TEST_P(CollectivesTest, AllGatherStackedAndTiledWithUnevenFirstDimensions) {
  std::mt19937 rng(11);
  for (int n = 1; n <= 5; ++n) {
    Groups groups = Make(n);
    for (int iter = 0; iter < 16; ++iter) {
      const DType dtype = Pick(rng, AllDTypes());
      AllGatherOptions o;
      static_cast<Options&>(o) = RandomOptions(rng);
      o.tiled = iter % 2 == 0;
      const Shape base = RandomShape(rng);
      const bool uneven = o.tiled && !base.empty() && iter % 4 == 0;
      std::vector<Tensor> inputs;
      for (int r = 0; r < n; ++r) {
        Shape shape = base;
        if (uneven) shape[0] = std::uniform_int_distribution<int>(0, 5)(rng);
        inputs.push_back(RandomExact(dtype, shape, ReduceOp::kSum, rng));
      }
      // Expected: concatenation (tiled) or a new leading axis (stacked, scalars).
      Tensor want{dtype, {}, {}};
      const bool stacked = !o.tiled || base.empty();
      int64_t rows = 0;
      for (const Tensor& in : inputs) {
        want.data.insert(want.data.end(), in.data.begin(), in.data.end());
        rows += stacked ? 1 : in.shape[0];
      }
      want.shape = {rows};
      want.shape.insert(want.shape.end(), base.begin() + (stacked ? 0 : 1), base.end());
      std::vector<Tensor> outputs(n);
      const std::string what = "n=" + std::to_string(n) + " " + DescribeType(dtype, base) +
                               (o.tiled ? " tiled" : " stacked") + (uneven ? " uneven " : " ") +
                               std::string(AlgorithmName(o.algorithm));
      ExpectAllOk(
          OnAllRanks(n, [&](int r) { return AllGatherInto(*groups[r], inputs[r], outputs[r], o); }),
          what);
      for (int r = 0; r < n; ++r) EXPECT_TRUE(outputs[r] == want) << what << " rank " << r;
    }
  }
}

TEST_P(CollectivesTest, ReduceScatterMatchesReference) {
  std::mt19937 rng(5);
  for (int n = 1; n <= 5; ++n) {
    Groups groups = Make(n);
    for (int iter = 0; iter < 10; ++iter) {
      const DType dtype = Pick(rng, AllDTypes());
      ReduceOp op = Pick(rng, kOps);
      if (dtype == DType::kBool && op == ReduceOp::kMean) op = ReduceOp::kSum;
      ReduceScatterOptions o;
      static_cast<Options&>(o) = RandomOptions(rng);
      o.op = op;
      Shape shape = RandomShape(rng, 2);
      shape.insert(shape.begin(), n * std::uniform_int_distribution<int>(0, 4)(rng));
      std::vector<Tensor> inputs;
      for (int r = 0; r < n; ++r) inputs.push_back(RandomExact(dtype, shape, op, rng));
      const Tensor full = Reference(inputs, op);
      std::vector<Tensor> outputs(n);
      ExpectAllOk(OnAllRanks(n,
                             [&](int r) -> Status {
                               ASSIGN_OR_RETURN(outputs[r],
                                                ReduceScatter(*groups[r], inputs[r], o));
                               return Status::Ok();
                             }),
                  "reduce_scatter");
      const size_t slice = full.data.size() / n;
      for (int r = 0; r < n; ++r) {
        Tensor want{
            dtype, shape, {full.data.begin() + r * slice, full.data.begin() + (r + 1) * slice}};
        want.shape[0] /= n;
        ExpectValuesEqual(outputs[r], want, "reduce_scatter rank " + std::to_string(r));
      }
    }
  }
}

TEST_P(CollectivesTest, ReduceScatterRejectsIndivisibleFirstDimension) {
  auto groups3 = Make(3);
  auto result = ReduceScatter(*groups3[0], Tensor::Zeros(DType::kFloat32, {4}));
  EXPECT_EQ(result.status().code(), Code::kInvalidArgument);
  EXPECT_NE(result.status().message().find("divisible"), std::string::npos);
}

TEST_P(CollectivesTest, BroadcastFromAnyRootIgnoresNonRootData) {
  std::mt19937 rng(13);
  for (int n = 1; n <= 5; ++n) {
    Groups groups = Make(n);
    for (int root = 0; root < n; ++root) {
      const DType dtype = Pick(rng, AllDTypes());
      const Shape shape =
          root % 2 ? Shape{std::uniform_int_distribution<int>(0, 5000)(rng)} : RandomShape(rng);
      BroadcastOptions o;
      static_cast<Options&>(o) = RandomOptions(rng);
      o.root = root;
      const Tensor source = RandomExact(dtype, shape, ReduceOp::kSum, rng);
      std::vector<Tensor> t(n);
      for (int r = 0; r < n; ++r) {
        t[r] = r == root ? source : Tensor{dtype, shape, {}};  // non-roots: no bytes at all
        if (r != root && r % 2) t[r] = RandomExact(dtype, shape, ReduceOp::kSum, rng);
      }
      ExpectAllOk(OnAllRanks(n, [&](int r) { return Broadcast(*groups[r], t[r], o); }),
                  "broadcast");
      for (int r = 0; r < n; ++r) EXPECT_TRUE(t[r] == source) << "n=" << n << " root=" << root;
    }
  }
}

// From scatter_min_bytes up the root sends every other rank one piece and the
// ranks pass their pieces on to each other: every byte must reach every rank,
// from any root, however the size splits into n - 1 pieces and into chunks.
TEST_P(CollectivesTest, BroadcastByScatterReachesEveryRankFromEveryRoot) {
  std::mt19937 rng(29);
  for (int n = 2; n <= 6; ++n) {
    Groups groups = Make(n, "scatter-" + std::to_string(n));
    for (int64_t count : {1, 2, 7, 1000}) {
      for (size_t chunk : {size_t{3}, size_t{64}, size_t{1} << 20}) {
        BroadcastOptions o;
        o.timeout = 20s;
        o.root = std::uniform_int_distribution<int>(0, n - 1)(rng);
        o.direct_max_bytes = 0;
        o.scatter_min_bytes = 0;
        o.chunk_bytes = chunk;
        const Tensor source = RandomExact(DType::kFloat32, {count}, ReduceOp::kSum, rng);
        std::vector<Tensor> t(n, Tensor::Zeros(DType::kFloat32, {count}));
        t[o.root] = source;
        ExpectAllOk(OnAllRanks(n, [&](int r) { return Broadcast(*groups[r], t[r], o); }),
                    "scatter broadcast");
        for (int r = 0; r < n; ++r) {
          EXPECT_TRUE(t[r] == source) << "n=" << n << " root=" << o.root << " rank " << r
                                      << " count=" << count << " chunk=" << chunk;
        }
      }
    }
  }
}

// Options that make ranks pick different broadcast data paths (here the size
// from which the scatter runs) are a conflict on every rank, naming both plans:
// run against each other, the root and one receiver could finish while the
// others failed.
TEST_P(CollectivesTest, BroadcastsThatWouldTakeDifferentPathsAreConflicts) {
  const int n = 4;
  Groups groups = Make(n, "paths");
  auto statuses = OnAllRanks(n, [&](int r) {
    Tensor t = Tensor::Zeros(DType::kFloat32, {1 << 16});
    BroadcastOptions o;
    o.timeout = 10s;
    o.scatter_min_bytes = r == 1 ? 0 : (64 << 20);
    return Broadcast(*groups[r], t, o);
  });
  for (int r = 0; r < n; ++r) {
    const Status& st = statuses[r];
    EXPECT_EQ(st.code(), Code::kConflict) << "rank " << r << ": " << st.ToString();
    const std::string other = r == 1 ? "runs it as star" : "rank 1 runs it as scatter";
    EXPECT_NE(st.message().find(other), std::string::npos) << "rank " << r << ": " << st.message();
  }
}

// ---- barrier, assert_equal ----

TEST_P(CollectivesTest, BarrierCountsDevicesAndRejectsTheWrongMeshSize) {
  for (int n = 1; n <= 4; ++n) {
    Groups groups = Make(n);
    ExpectAllOk(OnAllRanks(n, [&](int r) { return Barrier(*groups[r]); }), "barrier");
    BarrierOptions two;
    two.local_devices = 2;
    ExpectAllOk(OnAllRanks(n, [&](int r) { return Barrier(*groups[r], two); }), "2 devices");
    BarrierOptions wrong;
    wrong.mesh_size = n + 1;
    for (const Status& st : OnAllRanks(n, [&](int r) { return Barrier(*groups[r], wrong); })) {
      EXPECT_EQ(st.code(), Code::kConflict);
      EXPECT_NE(st.message().find("wrong mesh size"), std::string::npos) << st.message();
      EXPECT_NE(st.message().find(std::to_string(n) + " devices"), std::string::npos);
      EXPECT_NE(st.message().find("has " + std::to_string(n + 1)), std::string::npos);
      EXPECT_EQ(Detail(st, "expected"), n + 1);
      EXPECT_EQ(Detail(st, "actual"), n);
    }
    // The collective itself completed on every rank: the group is still usable.
    ExpectAllOk(OnAllRanks(n, [&](int r) { return Barrier(*groups[r]); }), "after");
  }
}

TEST_P(CollectivesTest, BarrierNamesMustMatch) {
  Groups groups = Make(2);
  auto statuses = OnAllRanks(2, [&](int r) {
    BarrierOptions o;
    o.name = r == 0 ? "save-begin" : "save-end";
    return Barrier(*groups[r], o);
  });
  for (const Status& st : statuses) {
    EXPECT_EQ(st.code(), Code::kConflict);
    EXPECT_NE(st.message().find("save-begin"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("save-end"), std::string::npos) << st.message();
  }
}

TEST_P(CollectivesTest, AssertEqualNamesTheRanksThatDiffer) {
  const int n = 4;
  Groups groups = Make(n);
  std::mt19937 rng(17);
  const Tensor value = RandomExact(DType::kFloat32, {3, 5}, ReduceOp::kSum, rng);
  ExpectAllOk(OnAllRanks(n, [&](int r) { return AssertEqual(*groups[r], value, "weights"); }),
              "equal");
  Tensor other = value;
  other.values<float>()[7] += 1;
  Tensor reshaped = value;
  reshaped.shape = {5, 3};
  auto statuses = OnAllRanks(n, [&](int r) {
    return AssertEqual(*groups[r], r == 1 ? other : r == 3 ? reshaped : value, "weights differ");
  });
  for (const Status& st : statuses) {
    EXPECT_EQ(st.code(), Code::kConflict);
    EXPECT_EQ(st.message().rfind("weights differ", 0), 0u) << st.message();
    EXPECT_EQ(Detail(st, "differing_ranks"), (std::vector<int>{1, 3})) << st.message();
    EXPECT_NE(st.message().find("float32[5,3]"), std::string::npos) << st.message();
  }
}

// ---- sparse, batch, hierarchical ----

IndexedSlices RandomSlices(DType dtype, const Shape& dense_shape, int64_t rows, std::mt19937& rng) {
  IndexedSlices s;
  s.dense_shape = dense_shape;
  Shape values_shape = dense_shape;
  values_shape[0] = rows;
  s.values = RandomExact(dtype, values_shape, ReduceOp::kSum, rng);
  std::uniform_int_distribution<int64_t> row(0, dense_shape[0] - 1);
  for (int64_t i = 0; i < rows; ++i) s.indices.push_back(row(rng));  // repeats allowed
  return s;
}

TEST_P(CollectivesTest, SparseAllReduceBothPathsGiveTheDenseSum) {
  const int n = 3;
  Groups groups = Make(n);
  std::mt19937 rng(19);
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kInt32}) {
    for (bool equal_lengths : {true, false}) {
      const Shape dense_shape = {10, 3};
      std::vector<IndexedSlices> in;
      for (int r = 0; r < n; ++r) {
        in.push_back(RandomSlices(dtype, dense_shape, equal_lengths ? 4 : r + 2, rng));
      }
      std::vector<Tensor> dense_in;
      for (const auto& s : in) dense_in.push_back(*Densify(s));
      const Tensor want = Reference(dense_in, ReduceOp::kSum);
      for (SparsePath path : {SparsePath::kAuto, SparsePath::kGather, SparsePath::kDense}) {
        SparseAllReduceOptions o;
        o.path = path;
        o.chunk_bytes = 16;  // for the ring steps of forced paths
        std::vector<IndexedSlices> out(n);
        ExpectAllOk(OnAllRanks(n,
                               [&](int r) -> Status {
                                 ASSIGN_OR_RETURN(out[r], SparseAllReduce(*groups[r], in[r], o));
                                 return Status::Ok();
                               }),
                    "sparse");
        const bool gathered =
            path == SparsePath::kGather || (path == SparsePath::kAuto && equal_lengths);
        for (int r = 0; r < n; ++r) {
          EXPECT_EQ(out[r].indices.size(), gathered ? (equal_lengths ? 12u : 9u) : 10u);
          auto dense = Densify(out[r]);
          ASSERT_TRUE(dense.ok()) << dense.status().ToString();
          ExpectValuesEqual(*dense, want, "sparse path " + std::to_string(static_cast<int>(path)));
        }
      }
    }
  }
}

TEST_P(CollectivesTest, SparseAllReduceReportsItsPathAndTakesEmptyShares) {
  const int n = 3;
  Groups groups = Make(n);
  std::mt19937 rng(29);
  const Shape dense_shape = {5, 2};
  // No rows anywhere: gathered (equal counts), and the sum is zero.
  std::vector<IndexedSlices> in(n);
  for (int r = 0; r < n; ++r) in[r] = RandomSlices(DType::kFloat32, dense_shape, 0, rng);
  std::vector<IndexedSlices> out(n);
  std::vector<SparsePath> taken(n, SparsePath::kAuto);
  auto run = [&](const std::string& what) {
    ExpectAllOk(OnAllRanks(n,
                           [&](int r) -> Status {
                             ASSIGN_OR_RETURN(out[r], SparseAllReduce(*groups[r], in[r], {}, &taken[r]));
                             return Status::Ok();
                           }),
                what);
  };
  run("empty");
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(taken[r], SparsePath::kGather);
    EXPECT_TRUE(out[r].indices.empty());
    EXPECT_EQ(*Densify(out[r]), Tensor::Zeros(DType::kFloat32, dense_shape));
  }
  // One rank with rows, the others none: counts differ, so the dense path runs.
  in[1] = RandomSlices(DType::kFloat32, dense_shape, 3, rng);
  run("one rank");
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(taken[r], SparsePath::kDense);
    EXPECT_EQ(out[r].indices, (std::vector<int64_t>{0, 1, 2, 3, 4}));
    EXPECT_EQ(*Densify(out[r]), *Densify(in[1]));
  }
}

TEST_P(CollectivesTest, SparseAllReduceMalformedInputOnOneRankFailsEveryRankNamingIt) {
  const int n = 3;
  Groups groups = Make(n);
  std::mt19937 rng(31);
  const Shape dense_shape = {4, 2};
  struct Bad {
    std::string what;
    std::function<void(IndexedSlices&)> spoil;
    std::string field;
  };
  for (const Bad& b : std::vector<Bad>{
           {"index out of range", [](IndexedSlices& s) { s.indices[1] = 4; }, "indices"},
           {"negative index", [](IndexedSlices& s) { s.indices[0] = -1; }, "indices"},
           {"fewer indices than rows", [](IndexedSlices& s) { s.indices.pop_back(); }, "indices"},
           {"rows of another shape",
            [](IndexedSlices& s) {
              s.values.shape = {1, 6};  // 6 elements, as before, but not rows of [4, 2]
            },
            "values"},
       }) {
    for (SparsePath path : {SparsePath::kAuto, SparsePath::kDense}) {
      std::vector<IndexedSlices> in(n);
      for (int r = 0; r < n; ++r) in[r] = RandomSlices(DType::kFloat32, dense_shape, 3, rng);
      b.spoil(in[2]);
      SparseAllReduceOptions o;
      o.path = path;
      o.timeout = 20s;  // waiting for it would end in deadline_exceeded, not the error
      auto statuses =
          OnAllRanks(n, [&](int r) { return SparseAllReduce(*groups[r], in[r], o).status(); });
      for (int r = 0; r < n; ++r) {
        const Status& st = statuses[r];
        EXPECT_EQ(st.code(), Code::kInvalidArgument) << b.what << " rank " << r << ": " << st.ToString();
        EXPECT_EQ(st.details()["invalid_ranks"], nlohmann::json::array({2})) << b.what << ": " << st.ToString();
        EXPECT_EQ(st.details().value("field", ""), b.field) << b.what << ": " << st.ToString();
        EXPECT_NE(st.message().find("rank 2"), std::string::npos) << st.ToString();
      }
    }
    // The group is still usable.
    std::vector<IndexedSlices> in(n);
    for (int r = 0; r < n; ++r) in[r] = RandomSlices(DType::kInt32, dense_shape, 2, rng);
    ExpectAllOk(OnAllRanks(n, [&](int r) { return SparseAllReduce(*groups[r], in[r]).status(); }),
                b.what + ", after");
  }
  // A dense_shape or dtype that differs across ranks is a conflict naming the rank.
  std::vector<IndexedSlices> in(n);
  for (int r = 0; r < n; ++r) in[r] = RandomSlices(DType::kFloat32, dense_shape, 2, rng);
  in[1] = RandomSlices(DType::kFloat32, {5, 2}, 2, rng);
  auto statuses = OnAllRanks(n, [&](int r) { return SparseAllReduce(*groups[r], in[r]).status(); });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(statuses[r].code(), Code::kConflict) << statuses[r].ToString();
    EXPECT_NE(statuses[r].message().find("[5,2]"), std::string::npos) << statuses[r].ToString();
  }
  // The dense path has a size limit, the same on every rank (on a new group: a
  // conflict poisons the group).
  groups = Make(n, "after-conflict");
  for (int r = 0; r < n; ++r) in[r] = RandomSlices(DType::kFloat32, dense_shape, r + 1, rng);
  SparseAllReduceOptions small;
  small.max_dense_bytes = 16;  // [4, 2] float32 is 32 bytes
  statuses = OnAllRanks(n, [&](int r) { return SparseAllReduce(*groups[r], in[r], small).status(); });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(statuses[r].code(), Code::kResourceExhausted) << statuses[r].ToString();
  }
  ExpectAllOk(OnAllRanks(n, [&](int r) { return SparseAllReduce(*groups[r], in[r]).status(); }),
              "after the limit");
}

TEST(GroupBySize, FollowsTensorFlowPacking) {
  std::vector<Tensor> t = {Tensor::Zeros(DType::kFloat32, {1}), Tensor::Zeros(DType::kFloat32, {1}),
                           Tensor::Zeros(DType::kFloat32, {1}),
                           Tensor::Zeros(DType::kFloat64, {2})};
  using Packs = std::vector<std::vector<size_t>>;
  EXPECT_EQ(GroupBySize(t, 0), (Packs{{0, 1, 2, 3}}));
  EXPECT_EQ(GroupBySize(t, 4), (Packs{{0, 1}, {2, 3}}));  // closed once over 4 bytes
  EXPECT_EQ(GroupBySize(t, 3), (Packs{{0}, {1}, {2}, {3}}));
  EXPECT_EQ(GroupBySize(t, 1000), (Packs{{0, 1, 2, 3}}));
  EXPECT_TRUE(GroupBySize({}, 4).empty());
}

TEST_P(CollectivesTest, BatchAllReduceEqualsPerTensorAllReduce) {
  const int n = 3;
  Groups groups = Make(n);
  std::mt19937 rng(23);
  for (size_t bytes_per_pack : {size_t{0}, size_t{16}, size_t{200}}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMean}) {
      std::vector<std::vector<Tensor>> inputs(n);  // [rank][tensor]
      for (int k = 0; k < 7; ++k) {
        const DType dtype = Pick<DType>(rng, {DType::kFloat32, DType::kFloat16, DType::kInt32});
        const Shape shape = RandomShape(rng, 2, 5);
        for (int r = 0; r < n; ++r) inputs[r].push_back(RandomExact(dtype, shape, op, rng));
      }
      BatchAllReduceOptions o;
      o.op = op;
      o.bytes_per_pack = bytes_per_pack;
      o.algorithm = Algorithm::kRing;
      o.chunk_bytes = 12;
      std::vector<std::vector<Tensor>> batched = inputs, single = inputs;
      ExpectAllOk(OnAllRanks(n, [&](int r) { return BatchAllReduce(*groups[r], batched[r], o); }),
                  "batch");
      ExpectAllOk(OnAllRanks(n,
                             [&](int r) -> Status {
                               for (Tensor& t : single[r])
                                 RETURN_IF_ERROR(AllReduce(*groups[r], t, o));
                               return Status::Ok();
                             }),
                  "single");
      for (int r = 0; r < n; ++r) {
        for (size_t k = 0; k < inputs[r].size(); ++k) {
          EXPECT_TRUE(batched[r][k] == single[r][k]) << "tensor " << k << " rank " << r;
        }
      }
    }
  }
}

TEST_P(CollectivesTest, HierarchicalAllReduceEqualsFlat) {
  std::mt19937 rng(29);
  for (int workers : {1, 2, 3}) {
    for (int devices : {1, 2, 3}) {
      Groups hierarchical = Make(workers);
      Groups flat = MakeGroups(Kind::kInProcess, workers * devices);
      for (ReduceOp op : kOps) {
        const DType dtype = Pick<DType>(rng, {DType::kFloat32, DType::kBFloat16, DType::kInt16});
        const Shape shape = RandomShape(rng, 2, 8);
        HierarchicalAllReduceOptions o;
        o.op = op;
        std::vector<Tensor> per_device;
        for (int d = 0; d < workers * devices; ++d) {
          per_device.push_back(RandomExact(dtype, shape, op, rng));
        }
        std::vector<Tensor> flat_out = per_device;
        ExpectAllOk(OnAllRanks(workers * devices,
                               [&](int d) { return AllReduce(*flat[d], flat_out[d], o); }),
                    "flat");
        std::vector<Tensor> local_out = per_device;  // worker w owns devices [w·D, (w+1)·D)
        ExpectAllOk(OnAllRanks(workers,
                               [&](int w) {
                                 return HierarchicalAllReduce(
                                     *hierarchical[w],
                                     std::span<Tensor>(local_out).subspan(w * devices, devices), o);
                               }),
                    "hierarchical");
        for (int d = 0; d < workers * devices; ++d) {
          EXPECT_TRUE(local_out[d] == flat_out[0]) << "device " << d << " op " << ReduceOpName(op);
        }
      }
    }
  }
}

TEST_P(CollectivesTest, HierarchicalAllReduceNamesADifferentDeviceCount) {
  Groups groups = Make(2);
  std::vector<Tensor> local(3, Tensor::Zeros(DType::kFloat32, {2}));
  auto statuses = OnAllRanks(2, [&](int w) {
    return HierarchicalAllReduce(*groups[w], std::span<Tensor>(local).subspan(w, w + 1));
  });
  for (const Status& st : statuses) {
    EXPECT_EQ(st.code(), Code::kConflict);
    EXPECT_NE(st.message().find("local_devices=1"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("local_devices=2"), std::string::npos) << st.message();
  }
}

// ---- errors: mismatches, timeouts, dead peers ----

TEST_P(CollectivesTest, MismatchedOpsFailOnEveryRankNamingBothCalls) {
  const int n = 3;
  Groups groups = Make(n, "mesh-a");
  auto statuses = OnAllRanks(n, [&](int r) -> Status {
    Tensor t = Tensor::Zeros(DType::kFloat32, {8});
    if (r == 0) return AllReduce(*groups[r], t);
    return AllGather(*groups[r], t).status();
  });
  const std::string reduce = "all_reduce(float32[8], sum)";
  const std::string gather = "all_gather(float32[8], stacked)";
  // Every rank fails with both calls named. Which rank states it depends on who
  // saw the mismatch first: a rank aborted before the mismatching header reached
  // it reports the aborting rank's account. Rank 1 gets rank 0's header before
  // anything else happens, so it always speaks for itself.
  for (const Status& st : statuses) {
    EXPECT_NE(st.message().find(reduce), std::string::npos) << st.message();
    EXPECT_NE(st.message().find(gather), std::string::npos) << st.message();
  }
  EXPECT_NE(
      statuses[1].message().find("rank 0 called " + reduce + " while rank 1 called " + gather),
      std::string::npos)
      << statuses[1].message();
  EXPECT_NE(statuses[0].message().find(" called " + gather + " while rank 0 called " + reduce),
            std::string::npos)
      << statuses[0].message();
  for (const Status& st : statuses) EXPECT_EQ(st.code(), Code::kConflict) << st.ToString();
  const auto mismatched = Detail(statuses[0], "mismatched_ranks");
  EXPECT_TRUE(mismatched == std::vector<int>({1, 2}) || mismatched == std::vector<int>({1}) ||
              mismatched == std::vector<int>({2}))
      << mismatched;
  EXPECT_NE(statuses[0].message().find("group 'mesh-a'"), std::string::npos);

  // Sticky: the next call fails at once with the original error.
  Tensor t = Tensor::Zeros(DType::kFloat32, {8});
  Status again = AllReduce(*groups[0], t);
  EXPECT_NE(again.message().find("earlier error"), std::string::npos) << again.message();
  EXPECT_NE(again.message().find(gather), std::string::npos) << again.message();

  // A rebuilt group works.
  Groups rebuilt = Make(n, "mesh-a");
  ExpectAllOk(OnAllRanks(n, [&](int r) { return Barrier(*rebuilt[r]); }), "rebuilt");
}

TEST_P(CollectivesTest, DifferentShapesOrOptionsAreConflicts) {
  Groups groups = Make(2);
  auto statuses = OnAllRanks(2, [&](int r) {
    Tensor t = Tensor::Zeros(DType::kFloat32, {r == 0 ? 8 : 9});
    return AllReduce(*groups[r], t);
  });
  EXPECT_NE(statuses[0].message().find("rank 1 called all_reduce(float32[9], sum)"),
            std::string::npos)
      << statuses[0].message();
  groups = Make(2);
  statuses = OnAllRanks(2, [&](int r) {
    Tensor t = Tensor::Zeros(DType::kFloat32, {8});
    AllReduceOptions o;
    o.algorithm = r == 0 ? Algorithm::kRing : Algorithm::kDirect;
    return AllReduce(*groups[r], t, o);
  });
  for (const Status& st : statuses) {
    EXPECT_EQ(st.code(), Code::kConflict);
    EXPECT_NE(st.message().find("options must be equal"), std::string::npos) << st.message();
  }
}

TEST_P(CollectivesTest, TimeoutNamesTheMissingRanks) {
  const int n = 4;
  Groups groups = Make(n);
  AllReduceOptions o;
  o.timeout = 300ms;
  // Ranks 2 and 3 never call.
  auto statuses = OnAllRanks(2, [&](int r) {
    Tensor t = Tensor::Zeros(DType::kFloat32, {8});
    return AllReduce(*groups[r], t, o);
  });
  for (const Status& st : statuses) {
    EXPECT_EQ(st.code(), Code::kDeadlineExceeded) << st.ToString();
    EXPECT_EQ(Detail(st, "missing_ranks"), (std::vector<int>{2, 3})) << st.ToString();
    EXPECT_NE(st.message().find("ranks [2, 3] did not arrive"), std::string::npos) << st.message();
  }
  // The late ranks were told: they fail with the group's abort, not their own timeout.
  Tensor t = Tensor::Zeros(DType::kFloat32, {8});
  Status st = AllReduce(*groups[2], t);
  EXPECT_EQ(st.code(), Code::kDeadlineExceeded) << st.ToString();
  EXPECT_NE(st.message().find("aborted the group"), std::string::npos) << st.message();
}

// From 4 ranks up the headers are relayed (recursive doubling, ranks beyond a
// power of two folded in and out), so a rank stuck behind a missing partner is
// not itself named: the roll call sorts them out.
TEST_P(CollectivesTest, TimeoutNamesOnlyTheMissingRanksWhenHeadersAreRelayed) {
  for (const auto& [n, absent] :
       std::vector<std::pair<int, std::vector<int>>>{
           {4, {3}}, {4, {0}}, {8, {5, 6}}, {8, {1}}, {5, {4}}, {6, {0}}, {6, {1}}, {7, {2, 5}}}) {
    Groups groups = Make(n, "relay-" + std::to_string(n) + "-" + std::to_string(absent[0]));
    AllReduceOptions o;
    o.timeout = 300ms;
    std::vector<int> present;
    for (int r = 0; r < n; ++r) {
      if (std::find(absent.begin(), absent.end(), r) == absent.end()) present.push_back(r);
    }
    auto statuses = OnAllRanks(static_cast<int>(present.size()), [&](int i) {
      Tensor t = Tensor::Zeros(DType::kFloat32, {8});
      return AllReduce(*groups[present[i]], t, o);
    });
    for (size_t i = 0; i < present.size(); ++i) {
      const Status& st = statuses[i];
      const std::string who = "rank " + std::to_string(present[i]) + ": " + st.ToString();
      EXPECT_EQ(st.code(), Code::kDeadlineExceeded) << who;
      EXPECT_EQ(Detail(st, "missing_ranks"), absent) << who;
    }
  }
}

// Groups of 5 to 16 relay the opening exchange (5-7 with ranks folded in and
// out): every rank's payload (the data of a small all-reduce or all-gather)
// reaches every rank, and a rank whose call differs is named by every other
// rank, while it names them all.
TEST_P(CollectivesTest, HeaderRelayReachesEveryRank) {
  for (int n : {5, 6, 7, 8, 16}) {
    Groups groups = Make(n, "relay-" + std::to_string(n));
    std::vector<Tensor> sums(n), gathered(n);
    ExpectAllOk(OnAllRanks(n,
                           [&](int r) {
                             sums[r] = Tensor::Zeros(DType::kInt32, {3});
                             for (int i = 0; i < 3; ++i) {
                               sums[r].values<int32_t>()[i] = (r + 1) << i;
                             }
                             RETURN_IF_ERROR(AllReduce(*groups[r], sums[r]));
                             Tensor mine = Tensor::Zeros(DType::kInt32, {2});
                             mine.values<int32_t>()[0] = r;
                             mine.values<int32_t>()[1] = -r;
                             AllGatherOptions o;
                             o.tiled = true;
                             ASSIGN_OR_RETURN(gathered[r], AllGather(*groups[r], mine, o));
                             return Status::Ok();
                           }),
                "n=" + std::to_string(n));
    const int32_t total = n * (n + 1) / 2;
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(sums[r].num_elements(), 3);
      for (int i = 0; i < 3; ++i) EXPECT_EQ(sums[r].values<int32_t>()[i], total << i) << r;
      ASSERT_EQ(gathered[r].num_elements(), 2 * n);
      for (int q = 0; q < n; ++q) {
        EXPECT_EQ(gathered[r].values<int32_t>()[2 * q], q) << "rank " << r;
        EXPECT_EQ(gathered[r].values<int32_t>()[2 * q + 1], -q) << "rank " << r;
      }
    }
    // One rank calls with another shape: a folded one (0), one in the core.
    for (int odd : {0, n - 2}) {
      Groups fresh = Make(n, "relay-" + std::to_string(n) + "-odd-" + std::to_string(odd));
      auto statuses = OnAllRanks(n, [&](int r) {
        Tensor t = Tensor::Zeros(DType::kFloat32, {r == odd ? 9 : 8});
        return AllReduce(*fresh[r], t);
      });
      for (int r = 0; r < n; ++r) {
        std::vector<int> want;
        for (int q = 0; q < n; ++q) {
          if (r == odd ? q != odd : q == odd) want.push_back(q);
        }
        EXPECT_EQ(statuses[r].code(), Code::kConflict) << r << ": " << statuses[r].ToString();
        EXPECT_EQ(Detail(statuses[r], "mismatched_ranks"), want)
            << "n=" << n << " rank " << r << ": " << statuses[r].ToString();
      }
    }
  }
}

// Counts the messages a rank sends (and those sent in calls bound by latency),
// passing everything on to `inner`.
class CountingTransport final : public ForwardingTransport {
 public:
  using ForwardingTransport::ForwardingTransport;
  Status Send(int peer, std::span<const ConstBytes> parts, Deadline deadline) override {
    ++sent;
    if (latency_bound_) ++sent_latency_bound;
    size_t bytes = 0;
    for (ConstBytes part : parts) bytes += part.size();
    // Within 256 bytes below a multiple of 64 KiB: with its frame header the
    // message would spill into one more TCP segment than its size needs.
    const size_t tail = bytes % (64 << 10);
    if (bytes > 0 && (tail == 0 || tail > (64 << 10) - 256)) ++spilling;
    return ForwardingTransport::Send(peer, parts, deadline);
  }
  using Transport::Send;
  void SetLatencyBound(bool latency_bound) override { latency_bound_ = latency_bound; }

  std::atomic<int> sent{0};
  std::atomic<int> sent_latency_bound{0};
  std::atomic<int> spilling{0};

 private:
  std::atomic<bool> latency_bound_{false};
};

// n in-process ranks whose sends are counted.
std::pair<Groups, std::vector<CountingTransport*>> CountedGroups(int n, const std::string& id) {
  std::pair<Groups, std::vector<CountingTransport*>> out;
  for (auto& t : InProcessTransport::CreateGroup(n)) {
    auto counting = std::make_unique<CountingTransport>(std::move(t));
    out.second.push_back(counting.get());
    out.first.push_back(std::make_unique<Group>(std::move(counting), id));
  }
  return out;
}

// The opening exchange's message counts: all-to-all below 4 ranks (n - 1 each),
// recursive doubling from 4 (log2(p) each in the core of p ranks, plus one to
// hand a folded rank's record over and one to hand all back).
TEST(HeaderRelay, SendsLog2MessagesPerRank) {
  const std::vector<std::pair<int, std::vector<int>>> cases = {
      {3, {2, 2, 2}},
      {4, {2, 2, 2, 2}},
      {5, {1, 3, 2, 2, 2}},
      {6, {1, 3, 1, 3, 2, 2}},
      {8, {3, 3, 3, 3, 3, 3, 3, 3}},
  };
  for (const auto& [n, want] : cases) {
    auto counted = CountedGroups(n, "count");
    Groups& groups = counted.first;
    const std::vector<CountingTransport*>& counters = counted.second;
    ExpectAllOk(OnAllRanks(n, [&](int r) { return Barrier(*groups[r]); }), "barrier");
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(counters[r]->sent.load(), want[r]) << "n=" << n << " rank " << r;
    }
  }
}

// Calls whose data rides the opening exchange are marked bound by latency
// (TcpTransport then sleeps on a shared CPU rather than spin); bulk transfers
// are not, whatever ran before them on the group.
TEST(LatencyBound, OnlyCallsWhoseDataRidesTheOpeningExchangeAreMarked) {
  constexpr int n = 4;
  using Op = std::function<Status(Group&, int64_t)>;
  const std::vector<std::pair<std::string, Op>> ops = {
      {"all_reduce",
       [](Group& g, int64_t count) {
         Tensor x = Tensor::Zeros(DType::kFloat32, {count});
         return AllReduce(g, x);
       }},
      {"broadcast",
       [](Group& g, int64_t count) {
         Tensor x = Tensor::Zeros(DType::kFloat32, {count});
         return Broadcast(g, x, BroadcastOptions{});
       }},
      {"all_gather",
       [](Group& g, int64_t count) {
         Tensor x = Tensor::Zeros(DType::kFloat32, {count}), out;
         return AllGatherInto(g, x, out, AllGatherOptions{});
       }},
      {"reduce_scatter",
       [](Group& g, int64_t count) {
         return ReduceScatter(g, Tensor::Zeros(DType::kFloat32, {count})).status();
       }},
  };
  for (const auto& [name, op] : ops) {
    for (const int64_t count : {int64_t{8}, int64_t{1} << 18}) {
      auto counted = CountedGroups(n, "latency");
      Groups& groups = counted.first;
      // A small call first, so that a large one must clear the mark itself.
      ExpectAllOk(OnAllRanks(n, [&](int r) { return Barrier(*groups[r]); }), "barrier");
      for (CountingTransport* c : counted.second) c->sent = c->sent_latency_bound = 0;
      ExpectAllOk(OnAllRanks(n, [&](int r) { return op(*groups[r], count); }), name);
      for (int r = 0; r < n; ++r) {
        const CountingTransport& c = *counted.second[r];
        EXPECT_GT(c.sent.load(), 0) << name << " of " << count << ", rank " << r;
        EXPECT_EQ(c.sent_latency_bound.load(), count == 8 ? c.sent.load() : 0)
            << name << " of " << count << " floats, rank " << r;
      }
    }
  }
  auto counted = CountedGroups(n, "assert");
  ExpectAllOk(OnAllRanks(n,
                         [&](int r) {
                           return AssertEqual(*counted.first[r],
                                              Tensor::Zeros(DType::kFloat32, {1 << 18}), "same");
                         }),
              "assert_equal");
  for (CountingTransport* c : counted.second) {
    EXPECT_EQ(c->sent_latency_bound.load(), c->sent.load()) << "assert_equal";
  }
}

// Chunked steps (halving and doubling, the ring, broadcast by star and by
// scatter, all-gather) cut their chunks so that a chunk's message fills whole
// 64 KiB TCP segments: 64 KiB chunks had sent a 69-byte segment of their own
// after each one. With 1 MiB inputs no step's last, shorter chunk ends near a
// multiple of 64 KiB either (with 16 MiB all-gathers one does, by chance).
TEST(Chunking, ChunkMessagesFillWholeSegments) {
  for (int n : {3, 4}) {
    auto counted = CountedGroups(n, "chunks");
    Groups& groups = counted.first;
    const std::vector<CountingTransport*>& counters = counted.second;
    ExpectAllOk(OnAllRanks(n,
                           [&](int r) {
                             Tensor x = Tensor::Zeros(DType::kFloat32, {int64_t{1} << 18});
                             RETURN_IF_ERROR(AllReduce(*groups[r], x));
                             BroadcastOptions star;
                             star.root = n - 1;
                             RETURN_IF_ERROR(Broadcast(*groups[r], x, star));
                             BroadcastOptions scatter = star;
                             scatter.scatter_min_bytes = 0;
                             RETURN_IF_ERROR(Broadcast(*groups[r], x, scatter));
                             Tensor out;
                             return AllGatherInto(*groups[r], x, out, AllGatherOptions{});
                           }),
                "chunked ops");
    for (int r = 0; r < n; ++r) {
      EXPECT_GT(counters[r]->sent.load(), 10) << "n=" << n << " rank " << r;
      EXPECT_EQ(counters[r]->spilling.load(), 0) << "n=" << n << " rank " << r;
    }
  }
}

TEST(Chunking, FitSegmentsLeavesRoomForTheHeadersInEvery64KiB) {
  EXPECT_EQ(FitSegments(16 << 10, 4), size_t{16} << 10);  // below 64 KiB: as it is
  EXPECT_EQ(FitSegments(65535, 1), size_t{65535});
  EXPECT_EQ(FitSegments(64 << 10, 4), size_t{65280});
  EXPECT_EQ(FitSegments(256 << 10, 1), size_t{4 * 65280});
  EXPECT_EQ(FitSegments((256 << 10) + 100, 1), size_t{4 * 65280});
  EXPECT_EQ(FitSegments(100000, 1), size_t{65280});  // 1 whole unit, not 1.5
  EXPECT_EQ(FitSegments(64 << 10, 24), size_t{65280} / 24 * 24);  // whole elements
  for (size_t chunk = 64 << 10; chunk < (8 << 20); chunk += 4093) {
    const size_t fitted = FitSegments(chunk, 8);
    EXPECT_LE(fitted, chunk);
    EXPECT_EQ(fitted % 8, 0u);
    // With its 16-byte frame header it fills no more loopback segments (65483
    // bytes of payload) than its size in 64 KiB units.
    const size_t units = (fitted + (64 << 10) - 1) / (64 << 10);
    EXPECT_LE(fitted + 16, units * 65483) << chunk;
  }
}

// A member that sends rank 0 something other than relayed headers in the first
// round (rank 1 is rank 0's partner there) fails rank 0 with a protocol error
// naming it, at once and without reading past the message.
TEST(HeaderRelay, AMalformedRelayMessageIsAProtocolErrorNamingItsSender) {
  auto u64 = [](uint64_t v) {
    std::string s(8, '\0');
    std::memcpy(s.data(), &v, 8);
    return s;
  };
  const std::string bad_magic = u64(48) + std::string(48, 'x');
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"empty", ""},
      {"short length", "abc"},
      {"length past the end", u64(uint64_t{1} << 50)},
      {"length 2^64 - 1", u64(~uint64_t{0}) + std::string(8, 'x')},
      {"zero length", u64(0)},
      {"two records where one is due", bad_magic + bad_magic},
      {"a record that is no header", bad_magic},
  };
  for (const auto& [what, message] : cases) {
    auto transports = InProcessTransport::CreateGroup(4);
    Group group(std::move(transports[0]), "relay");
    const ConstBytes bytes(reinterpret_cast<const uint8_t*>(message.data()), message.size());
    ASSERT_TRUE(transports[1]->Send(0, bytes, Clock::now() + 1s).ok()) << what;
    AllReduceOptions o;
    o.timeout = 5s;
    Tensor t = Tensor::Zeros(DType::kFloat32, {4});
    Status st = AllReduce(group, t, o);
    // internal, not deadline_exceeded: the bad header was seen, not waited out.
    EXPECT_EQ(st.code(), Code::kInternal) << what << ": " << st.ToString();
    EXPECT_NE(st.message().find("protocol error: malformed collective header"), std::string::npos)
        << what << ": " << st.ToString();
    EXPECT_EQ(Detail(st, "peer_rank"), 1) << what << ": " << st.ToString();
  }
}

TEST_P(CollectivesTest, ARankThatClosesItsTransportIsNamedWithoutAHang) {
  const int n = 3;
  Groups groups = Make(n);
  AllReduceOptions o;
  o.timeout = 20s;
  o.algorithm = Algorithm::kRing;
  std::atomic<int> entered{0};
  auto statuses = OnAllRanks(n, [&](int r) -> Status {
    if (r == 2) {  // leaves once the others have gone into the collective
      EXPECT_TRUE(testing::Eventually([&] { return entered.load() == 2; }));
      groups[r]->transport().Close();
      return Status::Ok();
    }
    Tensor t = Tensor::Zeros(DType::kFloat32, {100000});
    ++entered;
    return AllReduce(*groups[r], t, o);
  });
  // unavailable, not deadline_exceeded: the departure was seen, not waited out.
  for (int r : {0, 1}) {
    EXPECT_EQ(statuses[r].code(), Code::kUnavailable) << statuses[r].ToString();
    EXPECT_NE(statuses[r].message().find("rank 2"), std::string::npos) << statuses[r].message();
  }
}

TEST_P(CollectivesTest, SeparateGroupsRunConcurrently) {
  const int n = 3;
  Groups a = Make(n, "a"), b = Make(n, "b");
  std::vector<Tensor> ta(n, Tensor::Zeros(DType::kInt32, {1000})), tb = ta;
  for (int r = 0; r < n; ++r) {
    std::fill(ta[r].values<int32_t>().begin(), ta[r].values<int32_t>().end(), 1);
    std::fill(tb[r].values<int32_t>().begin(), tb[r].values<int32_t>().end(), r);
  }
  AllReduceOptions o;
  o.algorithm = Algorithm::kRing;
  o.chunk_bytes = 64;
  ExpectAllOk(OnAllRanks(2 * n,
                         [&](int i) {
                           const int r = i % n;
                           return i < n ? AllReduce(*a[r], ta[r], o) : AllReduce(*b[r], tb[r], o);
                         }),
              "concurrent");
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(ta[r].values<int32_t>()[999], n);
    EXPECT_EQ(tb[r].values<int32_t>()[0], 0 + 1 + 2);
  }
}

// ---- half precision ----

TEST(Half, RoundTripsEveryPatternAndRoundsToNearestEven) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const uint16_t h = static_cast<uint16_t>(bits);
    const float f = HalfToFloat(h);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f))));
    } else {
      EXPECT_EQ(FloatToHalf(f), h) << bits;
    }
    const float b = BFloat16ToFloat(h);
    if (!std::isnan(b)) {
      EXPECT_EQ(FloatToBFloat16(b), h) << bits;
    }
  }
  EXPECT_EQ(FloatToHalf(1.0f + 0x1p-11f), 0x3c00);  // tie → even
  EXPECT_EQ(FloatToHalf(1.0f + 3 * 0x1p-11f), 0x3c02);
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);
  EXPECT_EQ(FloatToHalf(0x1p-24f), 0x0001);
  EXPECT_EQ(FloatToHalf(0x1p-25f), 0x0000);
  EXPECT_EQ(FloatToHalf(3 * 0x1p-25f), 0x0002);
  EXPECT_EQ(FloatToBFloat16(1.0f + 0x1p-8f), 0x3f80);
  EXPECT_EQ(FloatToBFloat16(1.0f + 3 * 0x1p-8f), 0x3f82);
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(std::nanf("")))));
}

}  // namespace
}  // namespace tessera::collectives
