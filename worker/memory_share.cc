#include "worker/memory_share.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "collectives/hash.h"
#include "worker/guarded_copy.h"

namespace tessera::worker {
namespace {

Result<uint64_t> RequiredU64(const Json& j, const std::string& field) {
  ASSIGN_OR_RETURN(int64_t v, RequiredInt(j, field));
  if (v < 0) return InvalidArgument("field '" + field + "' must be ≥ 0", {{"field", field}});
  return static_cast<uint64_t>(v);
}

// [offset, offset + n) of `bytes` in one span: in place when it lies in one of its
// spans, else copied into *scratch.
Bytes Contiguous(const ShareBytes& bytes, uint64_t offset, uint64_t n, std::vector<uint8_t>* scratch) {
  std::vector<Bytes> parts = bytes.Range(offset, n);
  if (parts.size() == 1) return parts[0];
  scratch->resize(n);
  bytes.CopyRange(offset, n, scratch->data());
  return Bytes(scratch->data(), n);
}

}  // namespace

uint64_t ShareChecksum(const void* data, size_t n) { return Checksum64(data, n); }

Json ShareHeader::ToJson() const {
  Json p = Json::array();
  for (const Piece& piece : pieces) {
    p.push_back({{"tensor", TensorMetaToJson(piece.tensor)},
                 {"device", piece.device},
                 {"offset", piece.offset},
                 {"bytes", piece.bytes},
                 // as a signed number: JSON readers keep 63 bits
                 {"checksum", static_cast<int64_t>(piece.checksum)}});
    if (piece.same_as >= 0) p.back()["same_as"] = piece.same_as;
  }
  Json out = {{"step", step},
              {"rank", rank},
              {"mesh_fingerprint", mesh_fingerprint},
              {"policy_fingerprint", policy_fingerprint},
              {"bytes", bytes},
              {"metadata", metadata},
              {"pieces", std::move(p)}};
  if (!policy.is_null()) out["policy"] = policy;
  return out;
}

Result<ShareHeader> ShareHeader::FromJson(const Json& j) {
  if (!j.is_object()) return InvalidArgument("a share header must be a JSON object");
  ShareHeader h;
  ASSIGN_OR_RETURN(h.step, RequiredInt(j, "step"));
  ASSIGN_OR_RETURN(h.rank, RequiredInt(j, "rank"));
  ASSIGN_OR_RETURN(h.mesh_fingerprint, RequiredInt(j, "mesh_fingerprint"));
  ASSIGN_OR_RETURN(h.policy_fingerprint, RequiredInt(j, "policy_fingerprint"));
  ASSIGN_OR_RETURN(h.bytes, RequiredU64(j, "bytes"));
  h.metadata = j.value("metadata", Json::object());
  h.policy = j.value("policy", Json());
  if (!h.policy.is_null() && !h.policy.is_object()) {
    return InvalidArgument("field 'policy' must be an object", {{"field", "policy"}});
  }
  const Json& pieces = j.value("pieces", Json());
  if (!pieces.is_array()) return InvalidArgument("field 'pieces' must be an array", {{"field", "pieces"}});
  uint64_t end = 0;
  for (const Json& p : pieces) {
    if (!p.is_object()) return InvalidArgument("a piece must be an object", {{"field", "pieces"}});
    Piece piece;
    ASSIGN_OR_RETURN(piece.tensor, TensorMetaFromJson(p.value("tensor", Json())));
    ASSIGN_OR_RETURN(piece.device, RequiredInt(p, "device"));
    ASSIGN_OR_RETURN(piece.offset, RequiredU64(p, "offset"));
    ASSIGN_OR_RETURN(piece.bytes, RequiredU64(p, "bytes"));
    ASSIGN_OR_RETURN(int64_t sum, RequiredInt(p, "checksum"));
    piece.checksum = static_cast<uint64_t>(sum);
    if (p.contains("same_as")) {
      ASSIGN_OR_RETURN(piece.same_as, RequiredInt(p, "same_as"));
      if (piece.same_as < 0 || piece.same_as >= h.step) {
        return InvalidArgument("piece of tensor '" + piece.tensor.name + "' is the same as step " +
                                   std::to_string(piece.same_as) + ", not one before step " + std::to_string(h.step),
                               {{"field", "pieces"}, {"tensor", piece.tensor.name}});
      }
    }
    if (piece.offset != end || piece.bytes > h.bytes - std::min(h.bytes, end)) {
      return InvalidArgument("piece of tensor '" + piece.tensor.name + "' is not where the share's bytes put it",
                             {{"field", "pieces"}, {"tensor", piece.tensor.name}});
    }
    end += piece.bytes;
    h.pieces.push_back(std::move(piece));
  }
  if (end != h.bytes) {
    return InvalidArgument("the pieces cover " + std::to_string(end) + " of the share's " +
                               std::to_string(h.bytes) + " bytes",
                           {{"field", "bytes"}});
  }
  return h;
}

Json ShareHeader::Tensors() const {
  Json out = Json::array();
  std::set<std::string> seen;
  for (const Piece& p : pieces) {
    if (seen.insert(p.tensor.name).second) out.push_back(TensorMetaToJson(p.tensor));
  }
  return out;
}

std::map<std::pair<std::string, int64_t>, const ShareHeader::Piece*> ShareHeader::PiecesByShard() const {
  std::map<std::pair<std::string, int64_t>, const Piece*> out;
  for (const Piece& p : pieces) out[{p.tensor.name, p.device}] = &p;
  return out;
}

int64_t MeshFingerprint(const MeshPlacement& p) {
  // Its workers by rank: the same name with its workers in another order puts other
  // slices on each rank.
  std::string def = p.mesh.ToString() + "/" + std::to_string(p.mesh.devices_per_worker) + "/" +
                    std::to_string(p.workers.size()) + "/" + std::to_string(p.registration);
  for (const std::string& w : p.workers) def += "/" + w;
  return static_cast<int64_t>(collectives::HashString(def) >> 1);
}

ShareHeader DescribeShare(const Snapshot& snap, int64_t step, int64_t rank, int64_t mesh_fingerprint,
                          int64_t policy_fingerprint, const Json& metadata, const Snapshot* base,
                          const ShareHeader* base_header) {
  std::map<std::pair<std::string, int64_t>, const ShareHeader::Piece*> before;
  if (base != nullptr && base_header != nullptr) before = base_header->PiecesByShard();
  ShareHeader h;
  h.step = step;
  h.rank = rank;
  h.mesh_fingerprint = mesh_fingerprint;
  h.policy_fingerprint = policy_fingerprint;
  h.metadata = metadata;
  for (const Snapshot::Tensor& t : snap.tensors) {
    for (const Snapshot::Shard& s : t.shards) {
      ShareHeader::Piece piece;
      piece.tensor = TensorMeta(t.name, t.desc);
      piece.device = s.device;
      piece.offset = h.bytes;
      piece.bytes = s.buffer->size();
      auto was = before.find({t.name, s.device});
      if (was != before.end() && was->second->bytes == piece.bytes && Snapshot::SharedWith(base, t, s)) {
        piece.checksum = was->second->checksum;
        piece.same_as = base_header->step;
      } else {
        piece.checksum = ShareChecksum(s.buffer->data(), s.buffer->size());
      }
      h.bytes += piece.bytes;
      h.pieces.push_back(std::move(piece));
    }
  }
  return h;
}

ShareBytes::ShareBytes(std::shared_ptr<const Snapshot> snap) : snap_(std::move(snap)) {
  for (const Snapshot::Tensor& t : snap_->tensors) {
    for (const Snapshot::Shard& s : t.shards) {
      if (s.buffer->size() == 0) continue;
      spans_.emplace_back(s.buffer->data(), s.buffer->size());
      owners_.push_back(s.buffer);
      size_ += s.buffer->size();
    }
  }
}

ShareBytes ShareBytes::Allocate(uint64_t n) {
  ShareBytes b;
  b.owned_.reset(new uint8_t[std::max<uint64_t>(n, 1)]);  // uninitialised: received into
  b.size_ = n;
  if (n > 0) b.spans_.emplace_back(b.owned_.get(), n), b.owners_.push_back(b.owned_);
  return b;
}

Result<ShareBytes> ShareBytes::Allocate(uint64_t n, const AcquireBuffer& acquire) {
  ShareBytes b;
  ASSIGN_OR_RETURN(b.buffer_, acquire(n));
  b.size_ = n;
  if (n > 0) b.spans_.emplace_back(b.buffer_->data(), n), b.owners_.push_back(b.buffer_);
  return b;
}

Result<ShareBytes> ShareBytes::Compose(const ShareHeader& header, const ShareBytes& base,
                                       const std::vector<int64_t>& from, const AcquireBuffer& acquire) {
  ShareBytes b;
  uint64_t fresh = 0;
  for (size_t i = 0; i < header.pieces.size(); ++i) {
    if (i >= from.size() || from[i] < 0) fresh += header.pieces[i].bytes;
  }
  if (fresh > 0) {
    ASSIGN_OR_RETURN(b.buffer_, acquire(fresh));
  }
  uint64_t at = 0;
  for (size_t i = 0; i < header.pieces.size(); ++i) {
    const uint64_t n = header.pieces[i].bytes;
    if (n == 0) continue;
    if (i < from.size() && from[i] >= 0) {
      // The piece's bytes in base, with what keeps each part alive.
      uint64_t pos = 0;
      for (size_t k = 0; k < base.spans_.size(); ++k) {
        const Bytes& s = base.spans_[k];
        const uint64_t lo = std::max<uint64_t>(from[i], pos);
        const uint64_t hi = std::min<uint64_t>(from[i] + n, pos + s.size());
        if (lo < hi) b.spans_.push_back(s.subspan(lo - pos, hi - lo)), b.owners_.push_back(base.owners_.at(k));
        pos += s.size();
      }
    } else {
      b.spans_.emplace_back(b.buffer_->data() + at, n);
      b.owners_.push_back(b.buffer_);
      at += n;
    }
  }
  b.size_ = header.bytes;
  return b;
}

Result<ShareBytes> ShareBytes::Receive(const ShareHeader& header, Landing landing) {
  ShareBytes b;
  uint64_t own = 0;
  uint64_t at = 0;
  auto lands = [&](size_t i) {
    return i < landing.pieces.size() && header.pieces[i].bytes > 0 &&
           landing.pieces[i].size() == header.pieces[i].bytes;
  };
  for (size_t i = 0; i < header.pieces.size(); ++i) {
    const ShareHeader::Piece& p = header.pieces[i];
    if (p.offset != at) {
      return DataLoss("piece " + std::to_string(i) + " of the share of rank " + std::to_string(header.rank) +
                          " starts at byte " + std::to_string(p.offset) + ", not " + std::to_string(at),
                      {{"step", header.step}, {"rank", header.rank}});
    }
    at += p.bytes;
    if (!lands(i)) own += p.bytes;
  }
  if (at != header.bytes) {
    return DataLoss("the pieces of the share of rank " + std::to_string(header.rank) + " hold " +
                        std::to_string(at) + " bytes where its header says " + std::to_string(header.bytes),
                    {{"step", header.step}, {"rank", header.rank}});
  }
  b.owned_.reset(new uint8_t[std::max<uint64_t>(own, 1)]);  // uninitialised: received into
  uint64_t mine = 0;
  for (size_t i = 0; i < header.pieces.size(); ++i) {
    const uint64_t n = header.pieces[i].bytes;
    const bool landed = lands(i);
    const std::span<uint8_t> where = landed ? landing.pieces[i] : std::span<uint8_t>(b.owned_.get() + mine, n);
    if (!landed) mine += n;
    b.pieces_.push_back(where);
    b.in_place_.push_back(landed);
    if (n > 0) b.spans_.emplace_back(where.data(), n), b.owners_.push_back(landed ? nullptr : b.owned_);
  }
  b.size_ = header.bytes;
  b.keep_ = std::move(landing.keep);
  return b;
}

std::vector<Bytes> ShareBytes::Range(uint64_t offset, uint64_t n) const {
  std::vector<Bytes> out;
  uint64_t at = 0;
  for (const Bytes& s : spans_) {
    const uint64_t lo = std::max(offset, at);
    const uint64_t hi = std::min(offset + n, at + s.size());
    if (lo < hi) out.push_back(s.subspan(lo - at, hi - lo));
    at += s.size();
    if (at >= offset + n) break;
  }
  return out;
}

void ShareBytes::CopyRange(uint64_t offset, uint64_t n, uint8_t* dst) const {
  uint64_t done = 0;
  for (const Bytes& s : Range(offset, n)) {
    std::memcpy(dst + done, s.data(), s.size());
    done += s.size();
  }
  if (done < n) std::memset(dst + done, 0, n - done);
}

namespace {

Status SizeDiffers(const ShareHeader& header, const ShareBytes& bytes, const std::string& whose) {
  return DataLoss(whose + " holds " + std::to_string(bytes.size()) + " bytes where its header says " +
                      std::to_string(header.bytes),
                  {{"step", header.step}, {"rank", header.rank}});
}

Status PieceDiffers(const ShareHeader& header, const ShareHeader::Piece& p, const std::string& whose) {
  return DataLoss("the checksum of tensor '" + p.tensor.name + "' (device " + std::to_string(p.device) + ") in " +
                      whose + " does not match: its bytes changed",
                  {{"tensor", p.tensor.name}, {"device", p.device}, {"step", header.step}, {"rank", header.rank}});
}

}  // namespace

Status CheckShare(const ShareHeader& header, const ShareBytes& bytes, const std::string& whose,
                  const std::vector<bool>* only) {
  if (bytes.size() != header.bytes) return SizeDiffers(header, bytes, whose);
  std::vector<uint8_t> scratch;
  for (size_t i = 0; i < header.pieces.size(); ++i) {
    if (only != nullptr && (i >= only->size() || !(*only)[i])) continue;
    const ShareHeader::Piece& p = header.pieces[i];
    const Bytes piece = Contiguous(bytes, p.offset, p.bytes, &scratch);
    if (ShareChecksum(piece.data(), piece.size()) != p.checksum) return PieceDiffers(header, p, whose);
  }
  return Status::Ok();
}

uint64_t DistinctBytes(const std::vector<const ShareBytes*>& views) {
  std::vector<std::pair<uintptr_t, uintptr_t>> spans;  // [begin, end)
  for (const ShareBytes* v : views) {
    for (const Bytes& s : v->spans()) {
      const auto at = reinterpret_cast<uintptr_t>(s.data());
      spans.emplace_back(at, at + s.size());
    }
  }
  std::sort(spans.begin(), spans.end());
  uint64_t n = 0;
  uintptr_t end = 0;
  for (const auto& [lo, hi] : spans) {
    if (hi <= end) continue;
    n += hi - std::max(lo, end);
    end = hi;
  }
  return n;
}

Result<std::shared_ptr<const Snapshot>> ShareSnapshot(const ShareHeader& header, const ShareBytes& bytes,
                                                      const MeshPlacement& placement) {
  if (bytes.snapshot()) return bytes.snapshot();
  auto snap = std::make_shared<Snapshot>();
  snap->placement = placement;
  std::map<std::string, Snapshot::Tensor> tensors;
  for (const ShareHeader::Piece& p : header.pieces) {
    Snapshot::Tensor& t = tensors[p.tensor.name];
    t.name = p.tensor.name;
    t.desc = p.tensor.desc();
    ASSIGN_OR_RETURN(std::shared_ptr<ShardBuffer> copy, ShardBuffer::Heap(p.bytes));
    bytes.CopyRange(p.offset, p.bytes, copy->data());
    t.shards.push_back({p.device, std::move(copy)});
  }
  for (auto& [name, t] : tensors) {
    std::sort(t.shards.begin(), t.shards.end(), [](const auto& a, const auto& b) { return a.device < b.device; });
    for (int64_t device : placement.devices) {
      const bool held = std::any_of(t.shards.begin(), t.shards.end(), [&](const auto& s) { return s.device == device; });
      if (!held) t.absent_devices.push_back(device);
    }
    snap->tensors.push_back(std::move(t));
  }
  return std::shared_ptr<const Snapshot>(std::move(snap));
}

Status InstallShare(TensorStore& store, const std::string& mesh, const ShareHeader& header,
                    const ShareBytes& bytes, const std::vector<std::string>& names, const std::string& whose) {
  if (bytes.size() != header.bytes) return SizeDiffers(header, bytes, whose);
  const std::set<std::string> wanted(names.begin(), names.end());
  std::vector<uint8_t> scratch;
  for (size_t i = 0; i < header.pieces.size(); ++i) {
    const ShareHeader::Piece& p = header.pieces[i];
    if (!wanted.count(p.tensor.name)) continue;
    if (bytes.InPlace(i)) {
      const std::span<uint8_t> where = bytes.Piece(i);
      uint64_t sum = 0;
      if (!GuardedChecksum(where.data(), where.size(), &sum)) {
        return Conflict("the shard of tensor '" + p.tensor.name + "' (device " + std::to_string(p.device) +
                            ") shrank while " + whose + " was received into it (its file truncated by its trainer?)",
                        {{"tensor", p.tensor.name}, {"device", p.device}});
      }
      if (sum != p.checksum) return PieceDiffers(header, p, whose);
      continue;
    }
    const Bytes piece = Contiguous(bytes, p.offset, p.bytes, &scratch);
    uint64_t landed = 0;
    RETURN_IF_ERROR(store.Install(mesh, p.tensor.name, p.tensor.desc(), p.device, piece.data(), p.bytes, &landed));
    if (landed != p.checksum) return PieceDiffers(header, p, whose);
  }
  return Status::Ok();
}

}  // namespace tessera::worker
