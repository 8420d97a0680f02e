// An all-gather of one small record per rank over a binomial tree rooted at rank 0:
// the records go up to the root and the whole set comes back down, 2·⌈log2 n⌉
// message rounds, each rank talking only to its tree neighbours (at most
// ⌈log2 n⌉ + 1 of them). For agreements in large groups whose transport connects
// pair by pair (TcpOptions::connect_all = false): a ring or the recursive doubling
// of AllGather would connect every rank to many more. Over the transport itself, not
// a Group's call (no header exchange): every rank must pass records of one size.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "api/status.h"
#include "collectives/transport/transport.h"

namespace tessera::collectives {

// The tree: rank r's parent is r with its lowest set bit cleared; its children are
// r + 2^k for every 2^k below r's lowest set bit (every 2^k < n for rank 0) that is
// still a rank. Parent first, then the children ascending.
std::vector<int> TreeNeighbours(int rank, int size);

// Every rank's `record` on every rank, in rank order (size × record.size() bytes).
// Errors: the transport's (the caller aborts the group, so that no rank waits out
// its deadline), among them the protocol error naming a child whose records are of
// another size.
Result<std::vector<uint8_t>> TreeAllGather(Transport& t, std::span<const uint8_t> record,
                                           Deadline deadline);

// The same for records of int64 values.
Result<std::vector<int64_t>> TreeAllGather(Transport& t, std::span<const int64_t> record,
                                           Deadline deadline);

}  // namespace tessera::collectives
