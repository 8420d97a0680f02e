#include "api/collective_ops.h"

namespace tessera {
namespace {

struct OpInfo {
  CollectiveOp op;
  std::string_view name;
  bool rest;  // offered as a REST collectives job
};
constexpr OpInfo kOps[] = {
    {CollectiveOp::kAllReduce, "all_reduce", true},
    {CollectiveOp::kAllGather, "all_gather", true},
    {CollectiveOp::kReduceScatter, "reduce_scatter", true},
    {CollectiveOp::kBroadcast, "broadcast", true},
    {CollectiveOp::kAssertEqual, "assert_equal", true},
    {CollectiveOp::kBatchAllReduce, "batch_all_reduce", false},
    {CollectiveOp::kSparseAllReduce, "sparse_all_reduce", true},
    {CollectiveOp::kBarrier, "barrier", true},
    {CollectiveOp::kBroadcastOneToAll, "broadcast_one_to_all", false},
    {CollectiveOp::kProcessAllGather, "process_allgather", false},
};

struct ReduceInfo {
  ReduceOp op;
  std::string_view name;
};
constexpr ReduceInfo kReductions[] = {
    {ReduceOp::kSum, "sum"}, {ReduceOp::kProd, "prod"}, {ReduceOp::kMin, "min"},
    {ReduceOp::kMax, "max"}, {ReduceOp::kMean, "mean"},
};

}  // namespace

std::string_view CollectiveOpName(CollectiveOp op) {
  for (const OpInfo& o : kOps) {
    if (o.op == op) return o.name;
  }
  return "?";
}

Result<CollectiveOp> ParseCollectiveOp(std::string_view name) {
  std::vector<std::string> names;
  for (const OpInfo& o : kOps) {
    if (o.name == name) return o.op;
    names.emplace_back(o.name);
  }
  return InvalidArgument("unknown collective '" + std::string(name) + "'",
                         {{"field", "op"}, {"allowed", names}});
}

bool IsRestCollective(CollectiveOp op) {
  for (const OpInfo& o : kOps) {
    if (o.op == op) return o.rest;
  }
  return false;
}

std::string RestCollectiveNames() {
  std::string out;
  for (const OpInfo& o : kOps) {
    if (!o.rest) continue;
    if (!out.empty()) out += ", ";
    out += o.name;
  }
  return out;
}

std::string_view ReduceOpName(ReduceOp op) {
  for (const ReduceInfo& r : kReductions) {
    if (r.op == op) return r.name;
  }
  return "?";
}

Result<ReduceOp> ParseReduceOp(std::string_view name) {
  std::string names;
  for (const ReduceInfo& r : kReductions) {
    if (r.name == name) return r.op;
    names += (names.empty() ? "" : ", ") + std::string(r.name);
  }
  return InvalidArgument("reduce must be one of " + names + ", not '" + std::string(name) + "'",
                         {{"field", "reduce"}});
}

}  // namespace tessera
