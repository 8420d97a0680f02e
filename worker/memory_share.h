// A worker's share of a memory checkpoint: the bytes of its snapshot, laid end to
// end (tensors by name, shards by device), and the header that describes them
// with a checksum per piece. The header travels with every copy and every parity,
// so a copy is checked before it is kept and before it is restored.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "api/json_codec.h"
#include "api/status.h"
#include "api/tensor_desc.h"
#include "worker/tensor_store.h"

namespace tessera::worker {

using Bytes = std::span<const uint8_t>;

struct ShareHeader {
  struct Piece {
    TensorMeta tensor;
    int64_t device = 0;
    uint64_t offset = 0;  // in the share's bytes
    uint64_t bytes = 0;
    uint64_t checksum = 0;  // ShareChecksum
    // The step of this rank's checkpoint before whose piece of (tensor, device) holds
    // the same bytes (the snapshot shared it), or -1: a copy's holder that kept that
    // step's copy keeps the piece from it, and only the other pieces travel.
    int64_t same_as = -1;
  };
  int64_t step = 0;
  int64_t rank = 0;
  int64_t mesh_fingerprint = 0;
  int64_t policy_fingerprint = 0;
  uint64_t bytes = 0;  // the share's length
  Json metadata = Json::object();  // the save's
  // The memory settings it was taken with (MemoryPolicy::ToJson; null when not told):
  // what a worker given the share back in a restore takes its redundancy again with.
  Json policy;
  std::vector<Piece> pieces;

  Json ToJson() const;
  // invalid_argument naming the field (the header came from a peer).
  static Result<ShareHeader> FromJson(const Json& j);
  // The tensors, once each: [{name, dtype, shape, layout}].
  Json Tensors() const;
  // The pieces by (tensor, device).
  std::map<std::pair<std::string, int64_t>, const Piece*> PiecesByShard() const;
};

// The checksum of a share's piece or parity: xxh3-64 (several times faster than the
// shard files' xxh64, which matters at every restore's check of what a worker holds).
uint64_t ShareChecksum(const void* data, size_t n);

// The mesh's identity as one number: its definition, its workers in rank order and
// its registration. Shares of another identity (another layout, other workers or
// order, a mesh registered again) are never restored.
int64_t MeshFingerprint(const MeshPlacement& p);

// The header of `snap` (one pass over its bytes for the checksums). With `base` and
// `base_header` (this rank's checkpoint before and its header), a shard that shares
// base's buffer takes its checksum from base_header and names its step (same_as).
ShareHeader DescribeShare(const Snapshot& snap, int64_t step, int64_t rank, int64_t mesh_fingerprint,
                          int64_t policy_fingerprint, const Json& metadata, const Snapshot* base = nullptr,
                          const ShareHeader* base_header = nullptr);

// Where the bytes a worker keeps for its peers come from: buffers that come back
// checkpoint after checkpoint (TensorStore::AcquireSnapshotBuffer), so that once a
// mesh's ring is warm an exchange faults no pages and frees none.
using AcquireBuffer = std::function<Result<std::shared_ptr<ShardBuffer>>(size_t bytes)>;

// Where the pieces of a share received in a restore go, by piece: the trainer's shard
// it is restored into (its bytes land there: no copy follows), or an empty span for a
// buffer of the share's own. `keep` holds what the spans point into.
struct Landing {
  std::vector<std::span<uint8_t>> pieces;
  std::vector<std::shared_ptr<void>> keep;
};
using LandShare = std::function<Landing(const ShareHeader& header)>;

// A share's bytes: a snapshot's buffers (no copy) or bytes received from a peer.
class ShareBytes {
 public:
  ShareBytes() = default;
  explicit ShareBytes(std::shared_ptr<const Snapshot> snap);
  // `n` bytes, uninitialised, to receive into.
  static ShareBytes Allocate(uint64_t n);
  // The same from `acquire` (resource_exhausted when the memory is not there).
  static Result<ShareBytes> Allocate(uint64_t n, const AcquireBuffer& acquire);
  // `header`'s pieces to be received one by one, each where `landing` puts it or in one
  // buffer of the share's own; data_loss when the pieces do not tile the share.
  static Result<ShareBytes> Receive(const ShareHeader& header, Landing landing);
  // `header`'s pieces where `from[i]` ≥ 0 are the bytes of `base` at that offset (kept,
  // not copied: the copy before, whose piece did not change); the others, in order,
  // are to be received into fresh() (from `acquire`). One span per piece.
  static Result<ShareBytes> Compose(const ShareHeader& header, const ShareBytes& base,
                                    const std::vector<int64_t>& from, const AcquireBuffer& acquire);
  // Compose's buffer of the pieces to receive.
  std::span<uint8_t> fresh() { return buffer_ ? std::span<uint8_t>(buffer_->data(), buffer_->size()) : std::span<uint8_t>(); }
  // Receive's: where piece i goes, and whether that is the trainer's own shard.
  std::span<uint8_t> Piece(size_t i) const { return pieces_.at(i); }
  bool InPlace(size_t i) const { return i < in_place_.size() && in_place_[i]; }

  // The bytes in order, as spans, and what keeps each alive (a buffer, shared by the
  // checkpoints that hold it).
  const std::vector<Bytes>& spans() const { return spans_; }
  const std::vector<std::shared_ptr<const void>>& owners() const { return owners_; }
  uint64_t size() const { return size_; }
  // Received bytes: where to write them (null for a snapshot's).
  uint8_t* writable() { return owned_ ? owned_.get() : buffer_ ? buffer_->data() : nullptr; }
  // The spans covering [offset, offset + n), clipped to the share's end.
  std::vector<Bytes> Range(uint64_t offset, uint64_t n) const;
  // Copies [offset, offset + n) into dst, zeros past the end.
  void CopyRange(uint64_t offset, uint64_t n, uint8_t* dst) const;
  // The snapshot the share is, or null for received bytes.
  const std::shared_ptr<const Snapshot>& snapshot() const { return snap_; }

 private:
  std::shared_ptr<const Snapshot> snap_;
  std::shared_ptr<uint8_t[]> owned_;
  std::shared_ptr<ShardBuffer> buffer_;  // from an AcquireBuffer
  std::vector<std::span<uint8_t>> pieces_;  // Receive's, by piece
  std::vector<bool> in_place_;              // Receive's, by piece
  std::vector<std::shared_ptr<void>> keep_;  // what landed pieces point into
  std::vector<Bytes> spans_;
  std::vector<std::shared_ptr<const void>> owners_;  // by span (null: a trainer's mapping)
  uint64_t size_ = 0;
};

// data_loss naming the piece (tensor, device) whose checksum does not match, and `whose`
// ("the copy of rank 2 (w-c) held by w-a"). With `only`, the pieces i where only[i].
Status CheckShare(const ShareHeader& header, const ShareBytes& bytes, const std::string& whose,
                  const std::vector<bool>* only = nullptr);

// The bytes of `views` (shares, copies and parity a worker holds), each buffer counted
// once however many of them share it.
uint64_t DistinctBytes(const std::vector<const ShareBytes*>& views);

// The share as a snapshot of `placement` (what a persist writes): the snapshot it was
// taken as, or, for received bytes (a share rebuilt from a peer), copies of its pieces.
Result<std::shared_ptr<const Snapshot>> ShareSnapshot(const ShareHeader& header, const ShareBytes& bytes,
                                                      const MeshPlacement& placement);

// Writes each piece of `bytes` whose tensor is in `names` into the store (mesh `mesh`),
// each checked against its checksum as it lands (one pass over its bytes): data_loss as
// CheckShare's, naming `whose`, when one does not match (what was written stays). A
// piece received in place (ShareBytes::InPlace) is only checked where it is.
Status InstallShare(TensorStore& store, const std::string& mesh, const ShareHeader& header,
                    const ShareBytes& bytes, const std::vector<std::string>& names, const std::string& whose);

}  // namespace tessera::worker
