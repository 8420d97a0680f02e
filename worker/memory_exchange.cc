#include "worker/memory_exchange.h"

#include <algorithm>
#include <cstring>


namespace tessera::worker {
namespace {

using collectives::ConstBytes;
using collectives::Deadline;

// Parity moves in messages of at most this much, so a receiver buffers little.
constexpr uint64_t kChunk = uint64_t{16} << 20;
constexpr uint8_t kReady = 1;
// A share up to this size follows its header at once: buffered on arrival, it costs
// the receiver little, and the round trip of "ready" would cost more than it saves.
constexpr uint64_t kNoReadyBelow = uint64_t{1} << 20;

std::string Who(const std::vector<std::string>& workers, int64_t rank) {
  const std::string id = rank >= 0 && rank < static_cast<int64_t>(workers.size()) ? workers[rank] : "";
  return "rank " + std::to_string(rank) + (id.empty() ? "" : " (" + id + ")");
}

Status SendText(collectives::Transport& t, int peer, const std::string& text, Deadline deadline) {
  return t.Send(peer, ConstBytes(reinterpret_cast<const uint8_t*>(text.data()), text.size()), deadline);
}

Status SendSpans(collectives::Transport& t, int peer, const std::vector<Bytes>& spans, Deadline deadline) {
  return t.Send(peer, std::span<const ConstBytes>(spans.data(), spans.size()), deadline);
}

Status SendReady(collectives::Transport& t, int peer, Deadline deadline) {
  return t.Send(peer, ConstBytes(&kReady, 1), deadline);
}

Status AwaitReady(collectives::Transport& t, int peer, Deadline deadline) {
  uint8_t b = 0;
  return t.RecvInto(peer, std::span<uint8_t>(&b, 1), deadline);
}

// The header a peer sent, checked against what this worker expects of it.
Result<ShareHeader> RecvHeader(collectives::Transport& t, int peer, const MemoryCheckpoint* ck,
                               int64_t step, int64_t rank_of_share,
                               const std::vector<std::string>& workers, Deadline deadline) {
  collectives::Buffer buf;
  RETURN_IF_ERROR(t.Recv(peer, &buf, deadline));
  const std::string from = Who(workers, peer);
  auto json = ParseStrictJson(std::string_view(reinterpret_cast<const char*>(buf.data()), buf.size()),
                              "a share header");
  if (!json.ok()) return json.status().WithContext("from " + from);
  auto h = ShareHeader::FromJson(*json);
  if (!h.ok()) return h.status().WithContext("the share header from " + from);
  Json details = {{"worker", peer < static_cast<int>(workers.size()) ? workers[peer] : ""},
                  {"rank", peer}};
  if (h->step != step) {
    return Conflict(from + " sent its share of step " + std::to_string(h->step) + " to " + Who(workers, t.rank()) +
                        ", which takes step " + std::to_string(step) + ": the mesh's trainers must save the same steps",
                    details);
  }
  if (h->rank != rank_of_share) {
    return Internal(from + " sent the share of rank " + std::to_string(h->rank) + " where rank " +
                        std::to_string(rank_of_share) + "'s was due",
                    details);
  }
  if (ck != nullptr && h->policy_fingerprint != ck->own_header.policy_fingerprint) {
    return Conflict(from + " took step " + std::to_string(step) +
                        " with other memory settings (redundancy, replicas, group, keep, persist_*) than this worker",
                    details);
  }
  if (ck != nullptr && h->mesh_fingerprint != ck->mesh_fingerprint) {
    return Conflict(from + " sees another definition of the mesh", details);
  }
  return h;
}

void XorInto(uint8_t* dst, const uint8_t* src, uint64_t n) {
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t a, b;
    std::memcpy(&a, dst + i, 8);
    std::memcpy(&b, src + i, 8);
    a ^= b;
    std::memcpy(dst + i, &a, 8);
  }
  for (; i < n; ++i) dst[i] ^= src[i];
}

// Sends [offset, offset + n) of `bytes`, zero-padded past its end, as one message.
Status SendRange(collectives::Transport& t, int peer, const ShareBytes& bytes, uint64_t offset, uint64_t n,
                 Deadline deadline) {
  static const std::vector<uint8_t> zeros(kChunk, 0);
  std::vector<Bytes> parts = bytes.Range(offset, n);
  uint64_t have = 0;
  for (const Bytes& p : parts) have += p.size();
  if (have < n) parts.emplace_back(zeros.data(), n - have);
  return SendSpans(t, peer, parts, deadline);
}

Status ExchangeCopies(collectives::Group& group, MemoryCheckpoint& ck,
                      const std::vector<std::string>& workers, Deadline deadline) {
  collectives::Transport& t = group.transport();
  const int me = group.rank();
  const std::string header = ck.own_header.ToJson().dump();
  const std::vector<int>& targets = ck.layout.targets.at(me);
  const std::vector<int>& sources = ck.layout.sources.at(me);
  for (int j : targets) RETURN_IF_ERROR(SendText(t, j, header, deadline));
  for (int s : sources) {
    ASSIGN_OR_RETURN(ShareHeader h, RecvHeader(t, s, &ck, ck.step, s, workers, deadline));
    const uint64_t n = h.bytes;
    MemoryCheckpoint::Copy copy{std::move(h), ShareBytes::Allocate(n)};
    if (n >= kNoReadyBelow) {
      t.PostRecv(s, std::span<uint8_t>(copy.bytes.writable(), copy.bytes.size()));
      RETURN_IF_ERROR(SendReady(t, s, deadline));
    }
    ck.copies[s] = std::move(copy);
  }
  for (int j : targets) {
    if (ck.own.size() >= kNoReadyBelow) RETURN_IF_ERROR(AwaitReady(t, j, deadline));
    if (ck.own.size() > 0) RETURN_IF_ERROR(SendSpans(t, j, ck.own.spans(), deadline));
  }
  for (int s : sources) {
    MemoryCheckpoint::Copy& copy = ck.copies[s];
    if (copy.bytes.size() == 0) continue;
    RETURN_IF_ERROR(t.RecvInto(s, std::span<uint8_t>(copy.bytes.writable(), copy.bytes.size()), deadline));
    RETURN_IF_ERROR(CheckShare(copy.header, copy.bytes,
                               "the copy of " + Who(workers, s) + "'s share sent to " + Who(workers, me)));
  }
  return Status::Ok();
}

Status ExchangeParity(collectives::Group& group, MemoryCheckpoint& ck,
                      const std::vector<std::string>& workers, Deadline deadline) {
  collectives::Transport& t = group.transport();
  const int me = group.rank();
  ck.group = ck.layout.groups.at(ck.layout.group_of.at(me));
  const std::vector<int>& g = ck.group;
  const int m = static_cast<int>(g.size());
  const int mine = static_cast<int>(std::find(g.begin(), g.end(), me) - g.begin());
  const std::string header = ck.own_header.ToJson().dump();
  for (int j : g) {
    if (j != me) RETURN_IF_ERROR(SendText(t, j, header, deadline));
  }
  ck.group_headers[me] = ck.own_header;
  uint64_t longest = ck.own.size();
  for (int i : g) {
    if (i == me) continue;
    ASSIGN_OR_RETURN(ShareHeader h, RecvHeader(t, i, &ck, ck.step, i, workers, deadline));
    longest = std::max(longest, h.bytes);
    ck.group_headers[i] = std::move(h);
  }
  const uint64_t L = StripeLength(longest, m);
  ck.stripe_length = L;
  ck.parity = ShareBytes::Allocate(L);
  if (L > 0) std::memset(ck.parity.writable(), 0, L);
  std::vector<uint8_t> scratch(std::min(L, kChunk));
  for (uint64_t c = 0; c < L; c += kChunk) {
    const uint64_t n = std::min(kChunk, L - c);
    for (int jj = 0; jj < m; ++jj) {
      if (jj == mine) continue;
      const uint64_t stripe = static_cast<uint64_t>(StripeFor(mine, jj, m));
      RETURN_IF_ERROR(SendRange(t, g[jj], ck.own, stripe * L + c, n, deadline));
    }
    for (int ii = 0; ii < m; ++ii) {
      if (ii == mine) continue;
      RETURN_IF_ERROR(t.RecvInto(g[ii], std::span<uint8_t>(scratch.data(), n), deadline));
      XorInto(ck.parity.writable() + c, scratch.data(), n);
    }
  }
  ck.parity_checksum = L > 0 ? ShareChecksum(ck.parity.writable(), L) : 0;
  return Status::Ok();
}

Status SendCopy(collectives::Transport& t, const MemoryCheckpoint& ck, int to, Deadline deadline) {
  const MemoryCheckpoint::Copy& copy = ck.copies.at(to);
  RETURN_IF_ERROR(SendText(t, to, copy.header.ToJson().dump(), deadline));
  if (copy.bytes.size() >= kNoReadyBelow) RETURN_IF_ERROR(AwaitReady(t, to, deadline));
  if (copy.bytes.size() == 0) return Status::Ok();
  return SendSpans(t, to, copy.bytes.spans(), deadline);
}

Status ReceiveShare(collectives::Transport& t, int from, int64_t step, int me,
                    const std::vector<std::string>& workers, Deadline deadline, ShareHeader* header,
                    ShareBytes* bytes) {
  ASSIGN_OR_RETURN(*header, RecvHeader(t, from, nullptr, step, me, workers, deadline));
  *bytes = ShareBytes::Allocate(header->bytes);
  if (bytes->size() >= kNoReadyBelow) {
    t.PostRecv(from, std::span<uint8_t>(bytes->writable(), bytes->size()));
    RETURN_IF_ERROR(SendReady(t, from, deadline));
  }
  if (bytes->size() == 0) return Status::Ok();
  return t.RecvInto(from, std::span<uint8_t>(bytes->writable(), bytes->size()), deadline);
}

// One lost member `x` of a parity group: every other member j XORs its parity with
// the stripes the others hold of it, which gives x's stripe that j covers.
Status RebuildFromParity(collectives::Transport& t, const MemoryCheckpoint* ck, int64_t step,
                         const ShareTransfer& tr, const std::vector<std::string>& workers, int me,
                         Deadline deadline, ShareHeader* header, ShareBytes* bytes) {
  const std::vector<int>& g = tr.group;
  const int m = static_cast<int>(g.size());
  const int x = static_cast<int>(tr.to);
  const int ix = static_cast<int>(std::find(g.begin(), g.end(), x) - g.begin());
  const int mine = static_cast<int>(std::find(g.begin(), g.end(), me) - g.begin());
  const int first = g[ix == 0 ? 1 : 0];  // sends x's header
  if (me == x) {
    ASSIGN_OR_RETURN(*header, RecvHeader(t, first, nullptr, step, x, workers, deadline));
    collectives::Buffer l;
    RETURN_IF_ERROR(t.Recv(first, &l, deadline));
    uint64_t L = 0;
    if (l.size() != sizeof(L)) return Internal("a stripe length of the wrong size from " + Who(workers, first));
    std::memcpy(&L, l.data(), sizeof(L));
    *bytes = ShareBytes::Allocate(header->bytes);
    std::vector<uint8_t> scratch(std::min(L, kChunk));
    for (int jj = 0; jj < m; ++jj) {
      if (jj == ix) continue;
      const uint64_t base = static_cast<uint64_t>(StripeFor(ix, jj, m)) * L;
      for (uint64_t c = 0; c < L; c += kChunk) {
        const uint64_t n = std::min(kChunk, L - c);
        RETURN_IF_ERROR(t.RecvInto(g[jj], std::span<uint8_t>(scratch.data(), n), deadline));
        const uint64_t at = base + c;
        if (at < header->bytes) std::memcpy(bytes->writable() + at, scratch.data(), std::min(n, header->bytes - at));
      }
    }
    return Status::Ok();
  }
  if (mine == m || ck == nullptr) return Internal("rank " + std::to_string(me) + " is not in the parity group it serves");
  const uint64_t L = ck->stripe_length;
  if (me == first) {
    RETURN_IF_ERROR(SendText(t, x, ck->group_headers.at(x).ToJson().dump(), deadline));
    RETURN_IF_ERROR(t.Send(x, ConstBytes(reinterpret_cast<const uint8_t*>(&L), sizeof(L)), deadline));
  }
  // The stripes this member holds that the others need.
  for (int jj = 0; jj < m; ++jj) {
    if (jj == mine || jj == ix) continue;
    const uint64_t base = static_cast<uint64_t>(StripeFor(mine, jj, m)) * L;
    for (uint64_t c = 0; c < L; c += kChunk) {
      RETURN_IF_ERROR(SendRange(t, g[jj], ck->own, base + c, std::min(kChunk, L - c), deadline));
    }
  }
  ShareBytes rebuilt = ShareBytes::Allocate(L);
  if (L > 0) ck->parity.CopyRange(0, L, rebuilt.writable());
  std::vector<uint8_t> scratch(std::min(L, kChunk));
  for (int ii = 0; ii < m; ++ii) {
    if (ii == mine || ii == ix) continue;
    for (uint64_t c = 0; c < L; c += kChunk) {
      const uint64_t n = std::min(kChunk, L - c);
      RETURN_IF_ERROR(t.RecvInto(g[ii], std::span<uint8_t>(scratch.data(), n), deadline));
      XorInto(rebuilt.writable() + c, scratch.data(), n);
    }
  }
  for (uint64_t c = 0; c < L; c += kChunk) {
    RETURN_IF_ERROR(SendRange(t, x, rebuilt, c, std::min(kChunk, L - c), deadline));
  }
  return Status::Ok();
}

}  // namespace

Status ExchangeRedundancy(collectives::Group& group, MemoryCheckpoint& ck,
                          const std::vector<std::string>& workers, Deadline deadline) {
  // Small shares make an exchange bound by latency: a waiting thread then stops
  // spinning once the CPU turns out to be shared (Transport::SetLatencyBound).
  group.transport().SetLatencyBound(ck.own.size() < kNoReadyBelow);
  Status st = ck.layout.mode == MemoryPolicy::Mode::kReplica ? ExchangeCopies(group, ck, workers, deadline)
                                                              : ExchangeParity(group, ck, workers, deadline);
  group.transport().SetLatencyBound(false);
  return st;
}

Status RebuildShares(collectives::Group& group, const MemoryCheckpoint* ck, int64_t step,
                     const std::vector<ShareTransfer>& plan, const std::vector<std::string>& workers,
                     Deadline deadline, ShareHeader* header, ShareBytes* bytes) {
  collectives::Transport& t = group.transport();
  const int me = group.rank();
  for (const ShareTransfer& tr : plan) {
    if (tr.kind == ShareTransfer::Kind::kCopy) {
      if (tr.from == me) {
        if (ck == nullptr) return Internal("asked to send a copy of a step this worker does not hold");
        RETURN_IF_ERROR(SendCopy(t, *ck, static_cast<int>(tr.to), deadline));
      } else if (tr.to == me) {
        RETURN_IF_ERROR(ReceiveShare(t, static_cast<int>(tr.from), step, me, workers, deadline, header, bytes));
      }
      continue;
    }
    if (std::find(tr.group.begin(), tr.group.end(), me) == tr.group.end()) continue;
    RETURN_IF_ERROR(RebuildFromParity(t, ck, step, tr, workers, me, deadline, header, bytes));
  }
  if (bytes->size() > 0 || header->pieces.size() > 0) {
    RETURN_IF_ERROR(CheckShare(*header, *bytes, "the share of " + Who(workers, me) + " rebuilt from its peers"));
  }
  return Status::Ok();
}

}  // namespace tessera::worker
