#include "collectives/call.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "collectives/core_ranks.h"
#include "collectives/hash.h"

namespace tessera::collectives {
namespace {

constexpr uint32_t kHeaderMagic = 0x44435354;  // "TSCD"
constexpr size_t kHeaderBytes = 40;
// Descriptions travel for error messages only (the fingerprint covers the full
// signature), so long ones (batch_all_reduce of many tensors) are cut.
constexpr size_t kMaxDescriptionBytes = 240;

// Fixed part of the header, in host byte order.
struct HeaderFields {
  uint32_t magic;
  uint32_t rank;
  uint64_t seq;
  uint64_t fingerprint;
  uint32_t algorithm;
  uint32_t description_bytes;
  uint64_t chunk_bytes;
};
static_assert(sizeof(HeaderFields) == kHeaderBytes);

size_t PadTo8(size_t n) { return (n + 7) & ~size_t{7}; }

// A rank whose relayed header exchange timed out sends every rank this note
// ([magic][seq]), then waits this long (at most the call's timeout) for a
// message from each rank it has not heard of: those it hears from are in the
// collective, the others did not arrive. Relay messages begin with a
// record length (< 2^40), never with the magic.
constexpr uint64_t kRollCallMagic = 0x4c4c4143'4c4c4f52;  // "ROLLCALL"
constexpr std::chrono::milliseconds kRollCallGrace{1000};

// The header at the front of `record`, when it is one of `rank`'s; desc_end:
// where the description ends (and the payload starts).
bool ReadHeader(ConstBytes record, int rank, HeaderFields* fields, size_t* desc_end) {
  if (record.size() < kHeaderBytes) return false;
  std::memcpy(fields, record.data(), kHeaderBytes);
  *desc_end = kHeaderBytes + PadTo8(fields->description_bytes);
  return fields->magic == kHeaderMagic && fields->rank == static_cast<uint32_t>(rank) &&
         *desc_end <= record.size();
}

Status MalformedFrom(int peer) {
  return Internal("protocol error: malformed collective header from rank " + std::to_string(peer),
                  {{"peer_rank", peer}});
}

bool IsRollCall(ConstBytes message) {
  uint64_t magic = 0;
  if (message.size() != 2 * sizeof(uint64_t)) return false;
  std::memcpy(&magic, message.data(), sizeof(magic));
  return magic == kRollCallMagic;
}

std::string PlanText(uint32_t algorithm, uint64_t chunk_bytes) {
  std::string text(AlgorithmName(static_cast<Algorithm>(algorithm)));
  if (chunk_bytes > 0) text += " in " + std::to_string(chunk_bytes) + "-byte chunks";
  return text;
}

}  // namespace

std::string_view AlgorithmName(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::kAuto:
      return "auto";
    case Algorithm::kDirect:
      return "direct";
    case Algorithm::kRecursiveDoubling:
      return "recursive_doubling";
    case Algorithm::kRing:
      return "ring";
    case Algorithm::kHalvingDoubling:
      return "halving_doubling";
    case Algorithm::kStar:
      return "star";
    case Algorithm::kScatter:
      return "scatter";
  }
  return "unknown";
}

Session::Session(Group& group, std::chrono::milliseconds timeout)
    : group_(group), lock_(group.mu_), timeout_(timeout), deadline_(Clock::now() + timeout) {}

Result<Call> Session::Begin(Signature signature) {
  if (Status st = group_.transport_->Poll(); !st.ok()) {
    return st.WithContext(signature.Describe() + ": group '" + group_.id() +
                          "' was aborted by an earlier error (rebuild it on a new transport)");
  }
  group_.mu_.AssertHeld();  // by lock_
  group_.transport_->SetLatencyBound(false);
  return Call(*group_.transport_, group_.id(), std::move(signature), group_.next_seq_++, timeout_,
              deadline_);
}

Call::Call(Transport& transport, const std::string& group_id, Signature signature, uint64_t seq,
           std::chrono::milliseconds timeout, Deadline deadline)
    : transport_(&transport),
      group_id_(group_id),
      description_(signature.Describe()),
      fingerprint_(HashString(group_id + '\0' + description_)),
      seq_(seq),
      timeout_(timeout),
      deadline_(deadline) {}

Status Call::Fail(const Status& status, bool tell_peers) {
  Status annotated =
      status
          .WithContext(description_ + " (collective #" + std::to_string(seq_) + " of group '" +
                       group_id_ + "', rank " + std::to_string(rank()) + ")")
          .WithDetail("op", description_)
          .WithDetail("seq", seq_);
  if (tell_peers) {
    transport_->Abort(annotated);
  } else {
    transport_->Poison(annotated);
  }
  return annotated;
}

Status Call::TransportFailure(const Status& status) {
  // A peer's abort may have landed while this rank waited: the first error is
  // the cause, this rank's timeout only a consequence.
  Status first = transport_->status();
  return Fail(first.ok() ? status : first);
}

Status Call::Send(int peer, std::span<const ConstBytes> parts) {
  Status st = transport_->Send(peer, parts, deadline_);
  return st.ok() ? st : TransportFailure(st);
}

Status Call::Recv(int peer, Buffer* message, size_t expected_bytes) {
  Status st = transport_->Recv(peer, message, deadline_);
  if (!st.ok()) return TransportFailure(st);
  if (message->size() != expected_bytes && IsRollCall(message->bytes())) {
    // This rank got through the opening exchange just as `peer` gave up on it.
    return Fail(DeadlineExceeded("rank " + std::to_string(peer) +
                                     " timed out in this call's opening exchange",
                                 {{"peer_rank", peer}}));
  }
  if (message->size() != expected_bytes) {
    return Fail(WrongMessageSize(peer, expected_bytes, message->size()));
  }
  return Status::Ok();
}

Status Call::RecvInto(int peer, std::span<uint8_t> dst) {
  Status st = transport_->RecvInto(peer, dst, deadline_);
  return st.ok() ? st : TransportFailure(st);
}

Call::Gathered Call::GatherDirect(ConstBytes header, ConstBytes payload) {
  // Send to every peer, then wait for every peer until the deadline. Past it, or
  // past an error, only collect what already arrived: the error then lists every
  // missing rank, and a mismatch among the headers at hand (the root cause,
  // when a peer that saw it first aborted the group) is reported first.
  const int n = size(), me = rank();
  Gathered got;
  got.records.resize(n);
  got.arrived.resize(n, false);
  const ConstBytes parts[] = {header, payload};
  for (int i = 1; i < n && got.failure.ok(); ++i) {
    got.failure = transport_->Send((me + i) % n, parts, deadline_);
  }
  received_.resize(n);
  for (int i = 1; i < n; ++i) {
    const int peer = (me - i + n) % n;
    const Deadline wait = got.missing.empty() && got.failure.ok() ? deadline_ : Deadline();
    Status st = transport_->Recv(peer, &received_[peer], wait);
    if (st.ok()) {
      got.records[peer] = received_[peer].bytes();
      got.arrived[peer] = true;
    } else if (st.code() == Code::kDeadlineExceeded && transport_->status().ok()) {
      got.missing.push_back(peer);
    } else if (got.failure.ok()) {
      got.failure = st;
    }
  }
  return got;
}

Call::Gathered Call::GatherByDoubling(ConstBytes header, ConstBytes payload) {
  // Recursive doubling among p, the largest power of two ≤ n: in round k every
  // core rank swaps with the core rank ^ 2^k the records it holds so far (those
  // of its block), so after log2(p) rounds every core rank holds every record.
  // The first 2(n-p) ranks pair up around it, as in the all-reduce: the even
  // one hands its record to its odd neighbour first and gets all the others
  // from it at the end. A message is records in an order both sides know, each
  // [u64 length][record] padded to 8 bytes. n log2(n) messages when n is a
  // power of two, where all-to-all takes n(n-1).
  const int n = size(), me = rank();
  const CoreRanks doubling(n, me);
  const int p = doubling.p, folded = doubling.folded, core = doubling.rank;
  // The group ranks whose records core position c holds once folded in.
  auto ranks_of = [&](int c, std::vector<int>& out) {
    if (c < folded) {
      out.push_back(2 * c);
      out.push_back(2 * c + 1);
    } else {
      out.push_back(c + folded);
    }
  };

  Gathered got;
  got.records.resize(n);
  got.arrived.resize(n, false);
  std::vector<uint64_t> lengths(n, 0);
  lengths[me] = header.size() + payload.size();
  size_t slot = 0;
  if (core < 0) {
    // Folded: hand the record over, get every other one back.
    std::vector<int> others;
    for (int r = 0; r < n; ++r) {
      if (r != me) others.push_back(r);
    }
    if (SendRecords(me + 1, {me}, header, payload, lengths, got)) ReceiveRecords(me + 1, others, slot, lengths, got);
    return got;
  }
  if (me < 2 * folded && !ReceiveRecords(me - 1, {me - 1}, slot++, lengths, got)) return got;
  for (int mask = 1; mask < p; mask <<= 1) {
    const int partner = core ^ mask;
    const int mine = core & ~(mask - 1), theirs = partner & ~(mask - 1);
    std::vector<int> out, in;
    for (int c = mine; c < mine + mask; ++c) ranks_of(c, out);
    for (int c = theirs; c < theirs + mask; ++c) ranks_of(c, in);
    const int to = doubling.Member(partner);
    if (!SendRecords(to, out, header, payload, lengths, got) ||
        !ReceiveRecords(to, in, slot++, lengths, got)) {
      return got;
    }
  }
  if (me < 2 * folded) {
    std::vector<int> all;
    for (int r = 0; r < n; ++r) {
      if (r != me - 1) all.push_back(r);
    }
    SendRecords(me - 1, all, header, payload, lengths, got);
  }
  return got;
}

// One message of a doubling gather: the records of `ranks` in that order, each
// [u64 length][record] padded to 8 bytes (this rank's own is `header` + `payload`).
bool Call::SendRecords(int to, const std::vector<int>& ranks, ConstBytes header,
                       ConstBytes payload, const std::vector<uint64_t>& lengths, Gathered& got) {
  static constexpr uint8_t kZeros[8] = {};
  const int me = rank();
  std::vector<ConstBytes> parts;
  for (int r : ranks) {
    parts.push_back(ConstBytes(reinterpret_cast<const uint8_t*>(&lengths[r]), sizeof(uint64_t)));
    if (r == me) {
      parts.push_back(header);
      parts.push_back(payload);
    } else {
      parts.push_back(got.records[r]);
    }
    parts.push_back(ConstBytes(kZeros, PadTo8(lengths[r]) - lengths[r]));
  }
  got.failure = transport_->Send(to, parts, deadline_);
  return got.failure.ok();
}

// Receives the records of `ranks` from `from` into received_[slot]; false when the
// exchange ends here (`got` says why).
bool Call::ReceiveRecords(int from, const std::vector<int>& ranks, size_t slot,
                          std::vector<uint64_t>& lengths, Gathered& got) {
  if (received_.size() <= slot) received_.resize(slot + 1);
  Buffer& message = received_[slot];
  Status st = transport_->Recv(from, &message, deadline_);
  if (!st.ok()) {
    if (st.code() != Code::kDeadlineExceeded || !transport_->status().ok()) {
      got.failure = st;
    } else {
      RollCall(got, -1);
    }
    return false;
  }
  if (IsRollCall(message.bytes())) {
    // The sender gave up waiting further back: so does this rank.
    RollCall(got, from);
    return false;
  }
  size_t at = 0;
  for (int r : ranks) {
    uint64_t length = 0;
    bool whole = message.size() - at >= sizeof(length);
    if (whole) {
      std::memcpy(&length, message.data() + at, sizeof(length));
      at += sizeof(length);
      whole = length <= message.size() - at && PadTo8(length) <= message.size() - at;
    }
    // Checked here, not after the last round: the relay must not go on.
    HeaderFields fields;
    size_t desc_end = 0;
    if (!whole || !ReadHeader(message.bytes().subspan(at, length), r, &fields, &desc_end)) {
      got.malformed = MalformedFrom(from);
      return false;
    }
    got.records[r] = message.bytes().subspan(at, length);
    got.arrived[r] = true;
    lengths[r] = length;
    at += PadTo8(length);
  }
  if (at != message.size()) {
    got.malformed = MalformedFrom(from);
    return false;
  }
  return true;
}

void Call::RollCall(Gathered& got, int heard_from) {
  const int n = size(), me = rank();
  const Deadline until =
      Clock::now() + std::min<std::chrono::milliseconds>(timeout_, kRollCallGrace);
  std::vector<int> lacking;
  for (int r = 0; r < n; ++r) {
    if (r != me && !got.arrived[r]) lacking.push_back(r);
  }
  const uint64_t note[2] = {kRollCallMagic, seq_};
  const ConstBytes part(reinterpret_cast<const uint8_t*>(note), sizeof(note));
  // To every rank, not only those not heard of: one this rank has heard of may
  // be waiting for a message from it (a folded rank for the records back).
  for (int r = 0; r < n; ++r) {
    if (r == me) continue;
    Status st = transport_->Send(r, std::span<const ConstBytes>(&part, 1), until);
    if (!st.ok() && (st.code() != Code::kDeadlineExceeded || !transport_->status().ok())) {
      got.failure = st;
      return;
    }
  }
  // Any message from a rank (its roll call, or a relay message this rank never
  // got to) shows that it is in this collective.
  for (int r : lacking) {
    if (r == heard_from) continue;
    Buffer message;
    Status st = transport_->Recv(r, &message, until);
    if (st.ok()) continue;
    if (st.code() != Code::kDeadlineExceeded || !transport_->status().ok()) {
      got.failure = st;
      return;
    }
    got.missing.push_back(r);
  }
}

Result<std::vector<ConstBytes>> Call::Exchange(const Plan& plan, ConstBytes payload) {
  const int n = size(), me = rank();
  const std::string shown = description_.substr(0, kMaxDescriptionBytes);
  std::vector<uint8_t> header(kHeaderBytes + PadTo8(shown.size()), 0);
  const HeaderFields fields{kHeaderMagic,
                            static_cast<uint32_t>(me),
                            seq_,
                            fingerprint_,
                            static_cast<uint32_t>(plan.algorithm),
                            static_cast<uint32_t>(shown.size()),
                            plan.chunk_bytes};
  std::memcpy(header.data(), &fields, kHeaderBytes);
  CopyBytes(header.data() + kHeaderBytes, shown.data(), shown.size());

  Gathered got = n >= 4 ? GatherByDoubling(header, payload) : GatherDirect(header, payload);
  if (!got.malformed.ok()) return Fail(got.malformed);
  Status failure = got.failure;
  std::vector<int>& missing = got.missing;
  const std::vector<ConstBytes>& records = got.records;
  const std::vector<bool>& arrived = got.arrived;

  std::vector<ConstBytes> payloads(n);
  std::vector<int> mismatched;
  std::string conflicts;
  for (int peer = 0; peer < n; ++peer) {
    if (!arrived[peer]) continue;
    const ConstBytes message = records[peer];
    HeaderFields theirs{};
    size_t desc_end = 0;
    if (!ReadHeader(message, peer, &theirs, &desc_end)) return Fail(MalformedFrom(peer));
    const std::string their_desc(reinterpret_cast<const char*>(message.data()) + kHeaderBytes,
                                 theirs.description_bytes);
    payloads[peer] = message.subspan(desc_end);
    std::string conflict;
    if (theirs.seq != seq_) {
      conflict = "rank " + std::to_string(peer) + " is at collective #" +
                 std::to_string(theirs.seq) + " (" + their_desc + ") while rank " +
                 std::to_string(me) + " is at #" + std::to_string(seq_) + " (" + description_ + ")";
    } else if (theirs.fingerprint != fingerprint_) {
      conflict = "rank " + std::to_string(peer) + " called " + their_desc + " while rank " +
                 std::to_string(me) + " called " + description_;
    } else if (theirs.algorithm != static_cast<uint32_t>(plan.algorithm) ||
               theirs.chunk_bytes != plan.chunk_bytes) {
      conflict = "rank " + std::to_string(peer) + " runs it as " +
                 PlanText(theirs.algorithm, theirs.chunk_bytes) + " while rank " +
                 std::to_string(me) + " runs it as " +
                 PlanText(static_cast<uint32_t>(plan.algorithm), plan.chunk_bytes) +
                 " (collective options must be equal on every rank)";
    }
    if (!conflict.empty()) {
      mismatched.push_back(peer);
      conflicts += (conflicts.empty() ? "" : "; ") + conflict;
    }
  }
  if (!mismatched.empty()) {
    // Every rank got every header: each finds the mismatch itself and reports it
    // as it sees it. An abort could overtake a relayed header and make a peer
    // report this rank's view instead.
    const bool complete = failure.ok() && missing.empty();
    return Fail(Conflict(conflicts, {{"mismatched_ranks", mismatched}}), !complete);
  }
  if (!failure.ok()) return TransportFailure(failure);
  if (!missing.empty()) {
    std::sort(missing.begin(), missing.end());
    return Fail(DeadlineExceeded("timed out after " + std::to_string(timeout_.count()) +
                                     " ms: ranks " + RankList(missing) + " did not arrive",
                                 {{"missing_ranks", missing}}));
  }
  payloads[me] = payload;
  return payloads;
}

}  // namespace tessera::collectives
