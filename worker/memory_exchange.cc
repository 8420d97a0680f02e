#include "worker/memory_exchange.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <utility>

#include "worker/parity_code.h"

namespace tessera::worker {
namespace {

using collectives::ConstBytes;
using collectives::Deadline;

// Parity moves in messages of at most this much, so a receiver buffers little.
constexpr uint64_t kChunk = uint64_t{2} << 20;
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
                        " with other memory settings (redundancy, replicas, group, parity, keep, persist_*) than this worker",
                    details);
  }
  if (ck != nullptr && h->mesh_fingerprint != ck->mesh_fingerprint) {
    return Conflict(from + " sees another definition of the mesh", details);
  }
  return h;
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

bool SharesPieces(const ShareHeader& h) {
  return std::any_of(h.pieces.begin(), h.pieces.end(), [](const auto& p) { return p.same_as >= 0; });
}

// For each piece of `h` marked same_as, its offset in the copy of the same rank this
// worker kept at that step, when that copy's piece is the same (tensor, device, size,
// checksum); else -1. *base receives that copy's bytes.
std::vector<int64_t> KeptPieces(const ShareHeader& h, const HeldCheckpoint& held, int64_t rank,
                                std::shared_ptr<const MemoryCheckpoint>* base_ck, const ShareBytes** base) {
  std::vector<int64_t> from(h.pieces.size(), -1);
  int64_t step = -1;
  for (const ShareHeader::Piece& p : h.pieces) step = std::max(step, p.same_as);
  *base_ck = held && step >= 0 ? held(step) : nullptr;
  auto copy = *base_ck ? (*base_ck)->copies.find(rank) : std::map<int64_t, MemoryCheckpoint::Copy>::const_iterator();
  if (!*base_ck || copy == (*base_ck)->copies.end()) return from;
  *base = &copy->second.bytes;
  const auto before = copy->second.header.PiecesByShard();
  for (size_t i = 0; i < h.pieces.size(); ++i) {
    const ShareHeader::Piece& p = h.pieces[i];
    auto b = before.find({p.tensor.name, p.device});
    if (p.same_as == step && b != before.end() && b->second->bytes == p.bytes &&
        b->second->checksum == p.checksum && b->second->tensor.desc() == p.tensor.desc()) {
      from[i] = static_cast<int64_t>(b->second->offset);
    }
  }
  return from;
}

// The pieces a holder asks for (one byte each, 1: send it), sent back before them.
Status SendNeeds(collectives::Transport& t, int peer, const std::vector<int64_t>& from, Deadline deadline) {
  std::vector<uint8_t> needs(from.size());
  for (size_t i = 0; i < from.size(); ++i) needs[i] = from[i] < 0 ? 1 : 0;
  return t.Send(peer, ConstBytes(needs.data(), needs.size()), deadline);
}

// Sends the pieces of this worker's share that `peer` asked for, as one message.
Status SendNeeded(collectives::Transport& t, int peer, const MemoryCheckpoint& ck,
                  const std::vector<std::string>& workers, Deadline deadline) {
  collectives::Buffer needs;
  RETURN_IF_ERROR(t.Recv(peer, &needs, deadline));
  const std::vector<ShareHeader::Piece>& pieces = ck.own_header.pieces;
  if (needs.size() != pieces.size()) {
    return Internal(Who(workers, peer) + " asked for " + std::to_string(needs.size()) + " pieces of a share of " +
                    std::to_string(pieces.size()));
  }
  std::vector<Bytes> spans;
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (needs.data()[i] == 0 || pieces[i].bytes == 0) continue;
    for (const Bytes& b : ck.own.Range(pieces[i].offset, pieces[i].bytes)) spans.push_back(b);
  }
  return spans.empty() ? Status::Ok() : SendSpans(t, peer, spans, deadline);
}

// A share whose pieces did not change since the step before (ShareHeader::Piece::same_as)
// travels in part: each holder answers the header with the pieces it lacks (it kept the
// others with its copy of that step) and receives those alone, as one message.
Status ExchangeCopies(collectives::Group& group, MemoryCheckpoint& ck,
                      const std::vector<std::string>& workers, const AcquireBuffer& acquire,
                      const HeldCheckpoint& held, const std::set<int>* only_to, Deadline deadline) {
  collectives::Transport& t = group.transport();
  const int me = group.rank();
  const std::string header = ck.own_header.ToJson().dump();
  std::vector<int> targets = ck.layout.targets.at(me);
  std::vector<int> sources = ck.layout.sources.at(me);
  if (only_to != nullptr) {
    std::erase_if(targets, [&](int j) { return !only_to->count(j); });
    if (!only_to->count(me)) sources.clear();
  }
  for (int j : targets) RETURN_IF_ERROR(SendText(t, j, header, deadline));
  std::map<int, std::vector<bool>> received;  // by source sharing pieces: which were sent
  for (int s : sources) {
    ASSIGN_OR_RETURN(ShareHeader h, RecvHeader(t, s, &ck, ck.step, s, workers, deadline));
    if (SharesPieces(h)) {
      std::shared_ptr<const MemoryCheckpoint> base_ck;
      const ShareBytes* base = nullptr;
      const std::vector<int64_t> from = KeptPieces(h, held, s, &base_ck, &base);
      ASSIGN_OR_RETURN(ShareBytes kept, ShareBytes::Compose(h, base ? *base : ShareBytes(), from, acquire));
      MemoryCheckpoint::Copy copy{std::move(h), std::move(kept)};
      if (!copy.bytes.fresh().empty()) t.PostRecv(s, copy.bytes.fresh());
      RETURN_IF_ERROR(SendNeeds(t, s, from, deadline));
      std::vector<bool>& sent = received[s];
      for (int64_t f : from) sent.push_back(f < 0);
      ck.copies[s] = std::move(copy);
      continue;
    }
    const uint64_t n = h.bytes;
    ASSIGN_OR_RETURN(ShareBytes kept, ShareBytes::Allocate(n, acquire));
    MemoryCheckpoint::Copy copy{std::move(h), std::move(kept)};
    if (n >= kNoReadyBelow) {
      t.PostRecv(s, std::span<uint8_t>(copy.bytes.writable(), copy.bytes.size()));
      RETURN_IF_ERROR(SendReady(t, s, deadline));
    }
    ck.copies[s] = std::move(copy);
  }
  const bool sharing = SharesPieces(ck.own_header);
  for (int j : targets) {
    if (sharing) {
      RETURN_IF_ERROR(SendNeeded(t, j, ck, workers, deadline));
      continue;
    }
    if (ck.own.size() >= kNoReadyBelow) RETURN_IF_ERROR(AwaitReady(t, j, deadline));
    if (ck.own.size() > 0) RETURN_IF_ERROR(SendSpans(t, j, ck.own.spans(), deadline));
  }
  for (int s : sources) {
    MemoryCheckpoint::Copy& copy = ck.copies[s];
    auto part = received.find(s);
    const std::span<uint8_t> into = part != received.end() ? copy.bytes.fresh()
                                                           : std::span<uint8_t>(copy.bytes.writable(), copy.bytes.size());
    if (!into.empty()) RETURN_IF_ERROR(t.RecvInto(s, into, deadline));
    RETURN_IF_ERROR(CheckShare(copy.header, copy.bytes,
                               "the copy of " + Who(workers, s) + "'s share sent to " + Who(workers, me),
                               part != received.end() ? &part->second : nullptr));
  }
  return Status::Ok();
}

// Each member sends each stripe of its share to the holders of its codeword's parity
// rows, chunk by chunk, and adds what it receives into its own parity rows
// (parity_code.h).
Status ExchangeParity(collectives::Group& group, MemoryCheckpoint& ck,
                      const std::vector<std::string>& workers, const AcquireBuffer& acquire,
                      const std::set<int>* only_to, Deadline deadline) {
  collectives::Transport& t = group.transport();
  const int me = group.rank();
  // Whether `rank` receives in this exchange (every member, unless only_to says which).
  auto to = [only_to](int rank) { return only_to == nullptr || only_to->count(rank) > 0; };
  ck.group = ck.layout.groups.at(ck.layout.group_of.at(me));
  const std::vector<int>& g = ck.group;
  const int m = static_cast<int>(g.size());
  const int p = ck.layout.parity;
  const int k = m - p;
  const int mine = static_cast<int>(std::find(g.begin(), g.end(), me) - g.begin());
  const std::string header = ck.own_header.ToJson().dump();
  for (int j : g) {
    if (j != me && to(j)) RETURN_IF_ERROR(SendText(t, j, header, deadline));
  }
  ck.group_headers[me] = ck.own_header;
  uint64_t longest = ck.own.size();
  for (int i : g) {
    if (i == me || !to(me)) continue;
    ASSIGN_OR_RETURN(ShareHeader h, RecvHeader(t, i, &ck, ck.step, i, workers, deadline));
    longest = std::max(longest, h.bytes);
    ck.group_headers[i] = std::move(h);
  }
  const ParityCode code(k, p);
  // A member that only sends keeps the stripe length it computed when it took the step.
  const uint64_t L = to(me) ? StripeLength(longest, k) : ck.stripe_length;
  if (to(me)) {
    ck.stripe_length = L;
    ASSIGN_OR_RETURN(ck.parity, ShareBytes::Allocate(static_cast<uint64_t>(p) * L, acquire));
    if (L > 0) std::memset(ck.parity.writable(), 0, ck.parity.size());
  }
  // Each member sends this one, chunk after chunk, a message for each codeword where it
  // holds data and this one a parity row. Each lands in one of two buffers per member,
  // posted before it arrives (the next as soon as the one before is received), so that
  // nothing waits in the transport's memory.
  std::vector<size_t> per_chunk(m, 0);  // by member: its messages of one chunk
  for (int i = 0; i < m && to(me); ++i) {
    for (int r = 0; i != mine && r < m; ++r) {
      if (SymbolOf(r, i, m, p) < k && SymbolOf(r, mine, m, p) >= k) ++per_chunk[i];
    }
  }
  const size_t chunks = (L + kChunk - 1) / kChunk;
  std::vector<std::vector<uint8_t>> landing(2 * static_cast<size_t>(m));  // two per member
  for (size_t b = 0; b < landing.size(); ++b) {
    if (per_chunk[b / 2] > 0) landing[b].resize(std::min(L, kChunk));
  }
  std::vector<size_t> received(m, 0);  // messages received from each member
  auto post = [&](int i) {
    if (received[i] >= per_chunk[i] * chunks) return;
    const uint64_t c = (received[i] / per_chunk[i]) * kChunk;
    t.PostRecv(g[i], std::span<uint8_t>(landing[2 * i + received[i] % 2].data(), std::min(kChunk, L - c)));
  };
  for (int i = 0; i < m; ++i) {
    if (per_chunk[i] > 0) post(i);
  }
  Status st = Status::Ok();
  for (uint64_t c = 0; st.ok() && c < L; c += kChunk) {
    const uint64_t n = std::min(kChunk, L - c);
    for (int r = 0; st.ok() && r < m; ++r) {
      const int d = SymbolOf(r, mine, m, p);
      if (d >= k) continue;
      for (int q = 0; st.ok() && q < p; ++q) {
        if (to(g[ParityHolder(r, q, m)])) st = SendRange(t, g[ParityHolder(r, q, m)], ck.own, d * L + c, n, deadline);
      }
    }
    for (int r = 0; st.ok() && to(me) && r < m; ++r) {
      const int q = SymbolOf(r, mine, m, p) - k;
      if (q < 0) continue;
      for (int i = 0; st.ok() && i < m; ++i) {
        const int d = SymbolOf(r, i, m, p);
        if (d >= k) continue;
        std::vector<uint8_t>& b = landing[2 * i + received[i] % 2];
        st = t.RecvInto(g[i], std::span<uint8_t>(b.data(), n), deadline);
        if (!st.ok()) break;
        ++received[i];
        post(i);
        MulAdd(code.Coefficient(q, d), b.data(), ck.parity.writable() + q * L + c, n);
      }
    }
  }
  if (!st.ok()) {
    for (int i = 0; i < m; ++i) {
      if (i != mine) t.CancelRecv(g[i]);
    }
    return st;
  }
  if (to(me)) ck.parity_checksum = L > 0 ? ShareChecksum(ck.parity.writable(), ck.parity.size()) : 0;
  return Status::Ok();
}

// A copy a rebuild sends: its header, then each piece as a message of its own, a large
// one once the receiver said it is ready (its bytes then land where that piece goes).
Status SendCopy(collectives::Transport& t, const MemoryCheckpoint& ck, int to, Deadline deadline) {
  const MemoryCheckpoint::Copy& copy = ck.copies.at(to);
  RETURN_IF_ERROR(SendText(t, to, copy.header.ToJson().dump(), deadline));
  for (const ShareHeader::Piece& p : copy.header.pieces) {
    if (p.bytes == 0) continue;
    if (p.bytes >= kNoReadyBelow) RETURN_IF_ERROR(AwaitReady(t, to, deadline));
    RETURN_IF_ERROR(SendSpans(t, to, copy.bytes.Range(p.offset, p.bytes), deadline));
  }
  return Status::Ok();
}

Status ReceiveShare(collectives::Transport& t, int from, int64_t step, int me,
                    const std::vector<std::string>& workers, const LandShare& land, Deadline deadline,
                    ShareHeader* header, ShareBytes* bytes) {
  ASSIGN_OR_RETURN(*header, RecvHeader(t, from, nullptr, step, me, workers, deadline));
  ASSIGN_OR_RETURN(*bytes, ShareBytes::Receive(*header, land ? land(*header) : Landing{}));
  for (size_t i = 0; i < header->pieces.size(); ++i) {
    const std::span<uint8_t> where = bytes->Piece(i);
    if (where.empty()) continue;
    if (where.size() >= kNoReadyBelow) {
      t.PostRecv(from, where);
      if (Status st = SendReady(t, from, deadline); !st.ok()) {
        t.CancelRecv(from);
        return st;
      }
    }
    RETURN_IF_ERROR(t.RecvInto(from, where, deadline));
  }
  return Status::Ok();
}

// Where this member's symbol s (a stripe, or k + a parity row) lies: the bytes holding
// it and the offset of its first byte there.
std::pair<const ShareBytes*, uint64_t> SymbolBytes(const MemoryCheckpoint& ck, int s, int k) {
  const uint64_t L = ck.stripe_length;
  if (s < k) return {&ck.own, static_cast<uint64_t>(s) * L};
  return {&ck.parity, static_cast<uint64_t>(s - k) * L};
}

// The lost members of a parity group (tr.lost, at most tr.parity of them) get their
// shares back. For each lost member x and each codeword where x held a stripe, k of
// the survivors' symbols determine it (ParityCode::Decoder): one survivor, the
// aggregator, receives the others' symbols, combines them with its own and sends x the
// stripe, so x receives no more than its share. The aggregator rotates with the
// codeword, spreading that work over the group.
Status RebuildFromParity(collectives::Transport& t, const MemoryCheckpoint* ck, int64_t step,
                         const ShareTransfer& tr, const std::vector<std::string>& workers, int me,
                         Deadline deadline, ShareHeader* header, ShareBytes* bytes) {
  const std::vector<int>& g = tr.group;
  const int m = static_cast<int>(g.size());
  const int p = tr.parity;
  const int k = m - p;
  auto position = [&g](int rank) { return static_cast<int>(std::find(g.begin(), g.end(), rank) - g.begin()); };
  std::vector<int> survivors;  // positions in g
  auto in = [](const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); };
  for (int i = 0; i < m; ++i) {
    if (!in(tr.lost, g[i]) && !in(tr.unusable, g[i])) survivors.push_back(i);
  }
  if (k < 1 || static_cast<int>(survivors.size()) < k) {
    return Internal("a parity group of " + std::to_string(m) + " with parity " + std::to_string(p) +
                    " cannot rebuild with " + std::to_string(m - static_cast<int>(survivors.size())) +
                    " members out");
  }
  const int first = g[survivors[0]];  // sends each lost member its header and stripe length
  const int mine = position(me);
  const bool lost = in(tr.lost, me);
  if (in(tr.unusable, me)) return Status::Ok();
  if (!lost && (mine == m || ck == nullptr)) {
    return Internal("rank " + std::to_string(me) + " is not in the parity group it serves");
  }
  uint64_t L = lost ? 0 : ck->stripe_length;
  if (lost) {
    ASSIGN_OR_RETURN(*header, RecvHeader(t, first, nullptr, step, me, workers, deadline));
    collectives::Buffer l;
    RETURN_IF_ERROR(t.Recv(first, &l, deadline));
    if (l.size() != sizeof(L)) return Internal("a stripe length of the wrong size from " + Who(workers, first));
    std::memcpy(&L, l.data(), sizeof(L));
    *bytes = ShareBytes::Allocate(header->bytes);
  } else if (me == first) {
    for (int x : tr.lost) {
      RETURN_IF_ERROR(SendText(t, x, ck->group_headers.at(x).ToJson().dump(), deadline));
      RETURN_IF_ERROR(t.Send(x, ConstBytes(reinterpret_cast<const uint8_t*>(&L), sizeof(L)), deadline));
    }
  }
  const ParityCode code(k, p);
  std::vector<uint8_t> scratch(std::min(L, kChunk)), sum(lost ? 0 : std::min(L, kChunk));
  for (int x : tr.lost) {
    const int ix = position(x);
    for (int r = 0; r < m; ++r) {
      const int want = SymbolOf(r, ix, m, p);
      if (want >= k) continue;  // x held parity there: not rebuilt
      std::vector<int> from(k), have(k);  // positions, and their symbols in codeword r
      for (int j = 0; j < k; ++j) {
        from[j] = survivors[(static_cast<size_t>(r) + j) % survivors.size()];
        have[j] = SymbolOf(r, from[j], m, p);
      }
      const int aggregator = from[0];
      std::vector<uint8_t> coef;
      if (mine == aggregator) {
        ASSIGN_OR_RETURN(coef, code.Decoder(have, want));
      }
      for (uint64_t c = 0; c < L; c += kChunk) {
        const uint64_t n = std::min(kChunk, L - c);
        if (me == x) {
          RETURN_IF_ERROR(t.RecvInto(g[aggregator], std::span<uint8_t>(scratch.data(), n), deadline));
          const uint64_t at = want * L + c;
          if (at < header->bytes) std::memcpy(bytes->writable() + at, scratch.data(), std::min(n, header->bytes - at));
        } else if (mine == aggregator) {
          // Its own symbol's term, then each other survivor's.
          const auto [held, at] = SymbolBytes(*ck, have[0], k);
          held->CopyRange(at + c, n, scratch.data());
          std::memset(sum.data(), 0, n);
          MulAdd(coef[0], scratch.data(), sum.data(), n);
          for (int j = 1; j < k; ++j) {
            RETURN_IF_ERROR(t.RecvInto(g[from[j]], std::span<uint8_t>(scratch.data(), n), deadline));
            MulAdd(coef[j], scratch.data(), sum.data(), n);
          }
          RETURN_IF_ERROR(t.Send(x, ConstBytes(sum.data(), n), deadline));
        } else if (std::find(from.begin() + 1, from.end(), mine) != from.end()) {
          const auto [held, at] = SymbolBytes(*ck, SymbolOf(r, mine, m, p), k);
          RETURN_IF_ERROR(SendRange(t, g[aggregator], *held, at + c, n, deadline));
        }
      }
    }
  }
  return Status::Ok();
}

}  // namespace

Status ExchangeRedundancy(collectives::Group& group, MemoryCheckpoint& ck,
                          const std::vector<std::string>& workers, const AcquireBuffer& acquire,
                          Deadline deadline, const HeldCheckpoint& held, const std::set<int>* only_to) {
  // A group that connects pair by pair (a large mesh) connects what the layout pairs.
  RETURN_IF_ERROR(group.transport().Reach(LayoutPeers(ck.layout, group.rank()), deadline));
  // Small shares make an exchange bound by latency: a waiting thread then stops
  // spinning once the CPU turns out to be shared (Transport::SetLatencyBound).
  group.transport().SetLatencyBound(ck.own.size() < kNoReadyBelow);
  Status st = ck.layout.mode == MemoryPolicy::Mode::kReplica ? ExchangeCopies(group, ck, workers, acquire, held, only_to, deadline)
                                                              : ExchangeParity(group, ck, workers, acquire, only_to, deadline);
  group.transport().SetLatencyBound(false);
  return st;
}

std::vector<int> PlanPeers(const std::vector<ShareTransfer>& plan, int rank) {
  std::set<int> peers;
  for (const ShareTransfer& tr : plan) {
    if (tr.kind == ShareTransfer::Kind::kCopy) {
      if (tr.from == rank) peers.insert(static_cast<int>(tr.to));
      if (tr.to == rank) peers.insert(static_cast<int>(tr.from));
    } else if (std::find(tr.group.begin(), tr.group.end(), rank) != tr.group.end()) {
      peers.insert(tr.group.begin(), tr.group.end());
    }
  }
  peers.erase(rank);
  return {peers.begin(), peers.end()};
}

std::set<int> RebuiltRanks(const std::vector<ShareTransfer>& plan) {
  std::set<int> out;
  for (const ShareTransfer& tr : plan) {
    if (tr.kind == ShareTransfer::Kind::kCopy) out.insert(static_cast<int>(tr.to));
    if (tr.kind == ShareTransfer::Kind::kParity) out.insert(tr.lost.begin(), tr.lost.end());
  }
  return out;
}

Status RebuildShares(collectives::Group& group, const MemoryCheckpoint* ck, int64_t step,
                     const std::vector<ShareTransfer>& plan, const std::vector<std::string>& workers,
                     const LandShare& land, Deadline deadline, ShareHeader* header, ShareBytes* bytes) {
  collectives::Transport& t = group.transport();
  const int me = group.rank();
  RETURN_IF_ERROR(t.Reach(PlanPeers(plan, me), deadline));
  for (const ShareTransfer& tr : plan) {
    if (tr.kind == ShareTransfer::Kind::kCopy) {
      if (tr.from == me) {
        if (ck == nullptr) return Internal("asked to send a copy of a step this worker does not hold");
        RETURN_IF_ERROR(SendCopy(t, *ck, static_cast<int>(tr.to), deadline));
      } else if (tr.to == me) {
        RETURN_IF_ERROR(ReceiveShare(t, static_cast<int>(tr.from), step, me, workers, land, deadline, header, bytes));
      }
      continue;
    }
    if (std::find(tr.group.begin(), tr.group.end(), me) == tr.group.end()) continue;
    RETURN_IF_ERROR(RebuildFromParity(t, ck, step, tr, workers, me, deadline, header, bytes));
  }
  return Status::Ok();  // checked as it is installed (InstallShare)
}

}  // namespace tessera::worker
