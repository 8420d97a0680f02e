#include "worker/borrowed_snapshot.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "api/mesh.h"
#include "api/names.h"
#include "api/tensor_desc.h"
#include "worker/guarded_copy.h"

namespace tessera::worker {
namespace {

Status Field(const std::string& field, const std::string& why, Json details = Json::object()) {
  details["field"] = field;
  return InvalidArgument(field + " " + why, std::move(details));
}

// `text` as bytes: two hex digits each.
Result<std::string> HexDecode(const std::string& text, const std::string& field) {
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  if (text.size() % 2 != 0) return Field(field, "must be hex digits, two per byte");
  std::string out;
  for (size_t i = 0; i < text.size(); i += 2) {
    const int hi = digit(text[i]), lo = digit(text[i + 1]);
    if (hi < 0 || lo < 0) return Field(field, "must be hex digits, two per byte");
    out.push_back(static_cast<char>(hi * 16 + lo));
  }
  return out;
}

// One "tensors" entry: its description and its borrowed shards, checked against
// this worker's place in the mesh.
Result<Snapshot::Tensor> BorrowedTensor(const MeshPlacement& placement, pid_t pid,
                                        const Json& j, const std::string& where) {
  if (!j.is_object()) return Field(where, "must be an object");
  auto meta = TensorMetaFromJson(j);
  if (!meta.ok()) return meta.status().WithContext(where);
  RETURN_IF_ERROR(ValidateName(meta->name, where + ".name"));
  RETURN_IF_ERROR(CheckShapeSize(meta->shape, where + ".shape"));
  RETURN_IF_ERROR(ValidateLayout(placement.mesh, meta->layout, meta->shape));
  const size_t bytes =
      static_cast<size_t>(NumElements(LocalShape(placement.mesh, meta->layout, meta->shape))) *
      DTypeSize(meta->dtype);
  if (!j.contains("shards") || !j["shards"].is_array()) {
    return Field(where + ".shards", "must be an array", {{"tensor", meta->name}});
  }
  Snapshot::Tensor t{meta->name, meta->desc(), {}, {}};
  std::map<int64_t, std::shared_ptr<const BorrowedMemory>> by_device;
  for (size_t k = 0; k < j["shards"].size(); ++k) {
    const Json& s = j["shards"][k];
    const std::string at = where + ".shards[" + std::to_string(k) + "]";
    if (!s.is_object()) return Field(at, "must be an object", {{"tensor", meta->name}});
    ASSIGN_OR_RETURN(int64_t device, RequiredInt(s, "device"));
    ASSIGN_OR_RETURN(int64_t address, RequiredInt(s, "address"));
    ASSIGN_OR_RETURN(int64_t n, RequiredInt(s, "bytes"));
    if (!placement.Owns(device)) {
      return Field(at + ".device", "is device " + std::to_string(device) +
                                       ", not one of this worker's " + ShapeToString(placement.devices),
                   {{"tensor", meta->name}, {"device", device}});
    }
    if (n < 0 || static_cast<size_t>(n) != bytes) {
      return Field(at + ".bytes", "is " + std::to_string(n) + "; the shard of tensor '" +
                                      meta->name + "' " + meta->desc().ToString() + " on device " +
                                      std::to_string(device) + " has " + std::to_string(bytes),
                   {{"tensor", meta->name}, {"device", device}});
    }
    if (address <= 0 && bytes > 0) return Field(at + ".address", "must be a positive address");
    if (by_device.count(device)) {
      return Field(at + ".device", "names device " + std::to_string(device) + " twice",
                   {{"tensor", meta->name}, {"device", device}});
    }
    if (Status lent = CheckLent(pid, static_cast<uint64_t>(address), bytes); !lent.ok()) {
      return lent.WithContext(at + " (tensor '" + meta->name + "', device " + std::to_string(device) + ")")
          .WithDetail("tensor", meta->name)
          .WithDetail("field", at + ".address");
    }
    by_device[device] = std::make_shared<const BorrowedMemory>(pid, static_cast<uint64_t>(address),
                                                               bytes, meta->name, device);
  }
  for (int64_t device : placement.devices) {
    auto it = by_device.find(device);
    if (it == by_device.end()) {
      t.absent_devices.push_back(device);
    } else {
      t.shards.push_back({device, nullptr, it->second});
    }
  }
  return t;
}

}  // namespace

Result<std::shared_ptr<const Snapshot>> BorrowedSnapshot(const MeshPlacement& placement,
                                                         const Json& borrow,
                                                         const std::string& field) {
  if (!borrow.is_object()) return Field(field, "must be an object");
  ASSIGN_OR_RETURN(int64_t pid, RequiredInt(borrow, "pid"));
  ASSIGN_OR_RETURN(int64_t token_address, RequiredInt(borrow, "token_address"));
  ASSIGN_OR_RETURN(std::string token_hex, RequiredString(borrow, "token"));
  ASSIGN_OR_RETURN(std::string token, HexDecode(token_hex, field + ".token"));
  RETURN_IF_ERROR(CheckLender(static_cast<pid_t>(pid), static_cast<uint64_t>(token_address), token));
  if (!borrow.contains("tensors") || !borrow["tensors"].is_array()) {
    return Field(field + ".tensors", "must be an array");
  }
  auto snap = std::make_shared<Snapshot>();
  snap->placement = placement;
  std::set<std::string> seen;
  for (size_t i = 0; i < borrow["tensors"].size(); ++i) {
    const std::string where = field + ".tensors[" + std::to_string(i) + "]";
    ASSIGN_OR_RETURN(Snapshot::Tensor t,
                     BorrowedTensor(placement, static_cast<pid_t>(pid), borrow["tensors"][i], where));
    if (!seen.insert(t.name).second) {
      return Field(where + ".name", "names tensor '" + t.name + "' twice", {{"tensor", t.name}});
    }
    snap->tensors.push_back(std::move(t));
  }
  std::sort(snap->tensors.begin(), snap->tensors.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  return std::shared_ptr<const Snapshot>(std::move(snap));
}

std::shared_ptr<const Snapshot> MergeSnapshots(std::shared_ptr<const Snapshot> a,
                                               std::shared_ptr<const Snapshot> b) {
  if (!a || a->tensors.empty()) return b ? b : a;
  if (!b || b->tensors.empty()) return a;
  auto out = std::make_shared<Snapshot>();
  out->placement = a->placement;
  std::merge(a->tensors.begin(), a->tensors.end(), b->tensors.begin(), b->tensors.end(),
             std::back_inserter(out->tensors),
             [](const auto& x, const auto& y) { return x.name < y.name; });
  return out;
}

namespace {

// Borrowed bytes are compared through a block of this size (read, then compared).
constexpr size_t kCompareBlock = size_t{1} << 20;

// Whether `lent` holds the bytes of `base` (its size): the first block compared, then,
// with `expected` (base's Checksum64), the checksum of the rest as it is read; else
// every block.
Result<bool> LentSameAsBase(const BorrowedMemory& lent, const ShardBuffer& base, const uint64_t* expected) {
  std::vector<uint8_t> block(std::min(lent.size(), kCompareBlock));
  Checksum64Stream sum;
  for (size_t at = 0; at < lent.size(); at += block.size()) {
    const size_t n = std::min(block.size(), lent.size() - at);
    RETURN_IF_ERROR(lent.Read(at, n, block.data()));
    if ((at == 0 || expected == nullptr) && std::memcmp(block.data(), base.data() + at, n) != 0) return false;
    if (expected != nullptr) sum.Update(block.data(), n);
  }
  return expected == nullptr || sum.Digest() == *expected;
}

}  // namespace

Result<std::shared_ptr<const Snapshot>> OwnSnapshot(std::shared_ptr<const Snapshot> snap,
                                                    TensorStore* store, const Snapshot* base,
                                                    const ShardChecksums* base_sums) {
  if (!snap->borrows()) return snap;
  auto out = std::make_shared<Snapshot>(*snap);
  for (auto& t : out->tensors) {
    for (auto& s : t.shards) {
      if (s.borrowed == nullptr) continue;
      if (const Snapshot::Shard* b = Snapshot::BaseShard(base, t, s)) {
        ASSIGN_OR_RETURN(bool same,
                         LentSameAsBase(*s.borrowed, *b->buffer, ChecksumOf(base_sums, t.name, s.device)));
        if (same) {
          s.buffer = b->buffer;
          s.borrowed = nullptr;
          continue;
        }
      }
      ASSIGN_OR_RETURN(std::shared_ptr<ShardBuffer> copy, store->AcquireSnapshotBuffer(s.borrowed->size()));
      RETURN_IF_ERROR(s.borrowed->Read(0, s.borrowed->size(), copy->data()));
      s.buffer = std::move(copy);
      s.borrowed = nullptr;
    }
  }
  return std::shared_ptr<const Snapshot>(std::move(out));
}

}  // namespace tessera::worker
