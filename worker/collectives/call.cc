#include "worker/collectives/call.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "worker/collectives/hash.h"

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

Status Call::Fail(const Status& status) {
  Status annotated =
      status
          .WithContext(description_ + " (collective #" + std::to_string(seq_) + " of group '" +
                       group_id_ + "', rank " + std::to_string(rank()) + ")")
          .WithDetail("op", description_)
          .WithDetail("seq", seq_);
  transport_->Abort(annotated);
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
  if (message->size() != expected_bytes) {
    return Fail(WrongMessageSize(peer, expected_bytes, message->size()));
  }
  return Status::Ok();
}

Status Call::RecvInto(int peer, std::span<uint8_t> dst) {
  Status st = transport_->RecvInto(peer, dst, deadline_);
  return st.ok() ? st : TransportFailure(st);
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

  // Send to every peer, then wait for every peer until the deadline. Past it, or
  // past an error, only collect what already arrived: the error then lists every
  // missing rank, and a mismatch among the headers at hand (the root cause,
  // when a peer that saw it first aborted the group) is reported first.
  Status failure;
  const ConstBytes parts[] = {header, payload};
  for (int i = 1; i < n && failure.ok(); ++i) {
    failure = transport_->Send((me + i) % n, parts, deadline_);
  }
  received_.resize(n);
  std::vector<bool> arrived(n, false);
  std::vector<int> missing;
  for (int i = 1; i < n; ++i) {
    const int peer = (me - i + n) % n;
    const Deadline wait = missing.empty() && failure.ok() ? deadline_ : Deadline();
    Status st = transport_->Recv(peer, &received_[peer], wait);
    if (st.ok()) {
      arrived[peer] = true;
    } else if (st.code() == Code::kDeadlineExceeded && transport_->status().ok()) {
      missing.push_back(peer);
    } else if (failure.ok()) {
      failure = st;
    }
  }

  std::vector<ConstBytes> payloads(n);
  std::vector<int> mismatched;
  std::string conflicts;
  for (int peer = 0; peer < n; ++peer) {
    if (!arrived[peer]) continue;
    const Buffer& message = received_[peer];
    HeaderFields theirs{};
    if (message.size() >= kHeaderBytes) std::memcpy(&theirs, message.data(), kHeaderBytes);
    const size_t desc_end = kHeaderBytes + PadTo8(theirs.description_bytes);
    if (message.size() < kHeaderBytes || theirs.magic != kHeaderMagic ||
        theirs.rank != static_cast<uint32_t>(peer) || desc_end > message.size()) {
      return Fail(
          Internal("protocol error: malformed collective header from rank " + std::to_string(peer),
                   {{"peer_rank", peer}}));
    }
    const std::string their_desc(reinterpret_cast<const char*>(message.data()) + kHeaderBytes,
                                 theirs.description_bytes);
    payloads[peer] = message.bytes().subspan(desc_end);
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
    return Fail(Conflict(conflicts, {{"mismatched_ranks", mismatched}}));
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
