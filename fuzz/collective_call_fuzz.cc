// The decoding of a collective call made on a worker's local API
// (worker/collective_request.h): its parameters (ParseCollectiveRequest) and its
// body (SplitInputs), for every op, sparse_all_reduce's indexed slices included.
//
// The input is three lines: the op, the query (k=v&k=v; `devices=N`, 1..4, is
// the harness's own: how many local devices the worker holds), and the body
// (the rest). Properties checked:
//  - every failure is invalid_argument naming its field (details.field);
//  - a body that splits gives devices × inputs_per_device() tensors, each of
//    exactly its dtype × shape bytes, and never more bytes than the body held
//    (int32 indices widen to int64: twice theirs at most);
//  - sparse_all_reduce: each device's values are rows of dense_shape with as
//    many int64 indices; CheckSlices either refuses them naming a field or
//    Densify gives a tensor of dense_shape whose integer sum is the values' sum.
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <string_view>

#include "fuzz/fuzz_check.h"
#include "worker/collective_request.h"
#include "collectives/sparse_all_reduce.h"

namespace tessera::worker {
namespace {

using fuzz::IsCleanError;

void CheckError(const Status& st, const std::string& what) {
  FUZZ_CHECK(IsCleanError(st, {Code::kInvalidArgument}), what + ": " + st.ToString());
  if (!st.ok()) FUZZ_CHECK(st.details().contains("field"), what + ": " + st.ToString());
}

std::map<std::string, std::string> ParseQuery(std::string_view q) {
  std::map<std::string, std::string> out;
  while (!q.empty()) {
    const size_t amp = q.find('&');
    std::string_view item = q.substr(0, amp);
    const size_t eq = item.find('=');
    if (eq != std::string_view::npos) {
      out[std::string(item.substr(0, eq))] = std::string(item.substr(eq + 1));
    }
    if (amp == std::string_view::npos) break;
    q.remove_prefix(amp + 1);
  }
  return out;
}

int64_t SumAsInt(const collectives::Tensor& t) {
  int64_t sum = 0;
  for (int32_t v : t.values<int32_t>()) sum += v;
  return sum;
}

void CheckSparse(const CollectiveRequest& r, const std::vector<collectives::Tensor>& inputs) {
  for (size_t i = 0; i + 1 < inputs.size(); i += 2) {
    const collectives::Tensor& values = inputs[i];
    const collectives::Tensor& indices = inputs[i + 1];
    FUZZ_CHECK(indices.dtype == DType::kInt64 && indices.shape.size() == 1 &&
                   !values.shape.empty() && indices.shape[0] == values.shape[0],
               "sparse split: values " + collectives::DescribeType(values.dtype, values.shape) +
                   ", indices " + collectives::DescribeType(indices.dtype, indices.shape));
    collectives::IndexedSlices s{values, {}, r.dense_shape};
    auto idx = indices.values<int64_t>();
    s.indices.assign(idx.begin(), idx.end());
    Status st = collectives::CheckSlices(s);
    CheckError(st, "CheckSlices");
    // Densify allocates dense_shape: only small ones.
    if (!st.ok() || NumElements(r.dense_shape) > (int64_t{1} << 16)) continue;
    auto dense = collectives::Densify(s);
    FUZZ_CHECK(dense.ok(), "Densify of checked slices: " + dense.status().ToString());
    FUZZ_CHECK(dense->shape == r.dense_shape, "Densify shape");
    if (r.dtype == DType::kInt32) {
      // Integer sums wrap alike in both orders.
      FUZZ_CHECK(static_cast<int32_t>(SumAsInt(*dense)) == static_cast<int32_t>(SumAsInt(values)),
                 "Densify loses or invents values");
    }
  }
}

void Run(std::string_view op, std::string_view query, std::string_view body) {
  std::map<std::string, std::string> params = ParseQuery(query);
  size_t devices = 1;
  if (auto it = params.find("devices"); it != params.end() && it->second.size() == 1 &&
                                         it->second[0] >= '1' && it->second[0] <= '4') {
    devices = static_cast<size_t>(it->second[0] - '0');
  }
  auto r = ParseCollectiveRequest(op, [&](const std::string& key) -> std::optional<std::string> {
    auto it = params.find(key);
    if (it == params.end()) return std::nullopt;
    return it->second;
  });
  CheckError(r.status(), "ParseCollectiveRequest");
  if (!r.ok()) return;
  if (r->process_level()) devices = 1;
  auto inputs = SplitInputs(body, devices, *r);
  CheckError(inputs.status(), "SplitInputs");
  if (!inputs.ok()) return;
  FUZZ_CHECK(inputs->size() == devices * r->inputs_per_device(),
             std::to_string(inputs->size()) + " inputs for " + std::to_string(devices) +
                 " device(s)");
  size_t bytes = 0;
  for (const collectives::Tensor& t : *inputs) {
    FUZZ_CHECK(t.Validate().ok(), "split tensor: " + t.Validate().ToString());
    bytes += t.data.size();
  }
  FUZZ_CHECK(bytes <= 2 * body.size(), "the split holds more than the body");
  if (r->op == CollectiveOp::kSparseAllReduce) CheckSparse(*r, *inputs);
}

}  // namespace
}  // namespace tessera::worker

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t first = in.find('\n');
  if (first == std::string_view::npos) return 0;
  const size_t second = in.find('\n', first + 1);
  if (second == std::string_view::npos) return 0;
  tessera::worker::Run(in.substr(0, first), in.substr(first + 1, second - first - 1),
                       in.substr(second + 1));
  return 0;
}
