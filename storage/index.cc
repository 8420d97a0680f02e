#include "storage/index.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <set>

#include "storage/chunk_codec.h"
#include "storage/chunk_ref.h"

namespace tessera::storage {
namespace {


Status Corrupt(const std::string& file, const std::string& why) {
  return DataLoss(file + " is corrupt: " + why, {{"file", file}});
}

uint64_t LoadLe64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = v << 8 | static_cast<uint8_t>(p[i]);
  return v;
}

// The SQLite image of an index file, its trailer checked and taken off; the
// whole file when it has none (*sealed false: only version 1 may lack it).
Result<std::string> UnsealIndexImage(std::string file, const std::string& path, bool* sealed) {
  *sealed = file.size() >= kIndexSealBytes &&
            file.compare(file.size() - kIndexSealBytes, 8, kIndexSealMagic, 8) == 0;
  if (!*sealed) return file;
  const uint64_t stored = LoadLe64(file.data() + file.size() - 8);
  file.resize(file.size() - kIndexSealBytes);
  const uint64_t computed = Checksum(file.data(), file.size());
  if (stored != computed) {
    char hex[64];
    std::snprintf(hex, sizeof(hex), "stored %016llx, computed %016llx",
                  static_cast<unsigned long long>(stored), static_cast<unsigned long long>(computed));
    return Corrupt(path, std::string("its checksum does not match its content (") + hex +
                             "): it changed after the checkpoint was committed");
  }
  return file;
}

// Slices of one tensor must tile it: disjoint, and together every element.
// Disjointness is a sweep along the dimension with the most distinct offsets,
// comparing only slices whose extents meet there.
Status CheckTiling(const TensorEntry& t, const std::string& path) {
  int64_t covered = 0;
  for (const auto& s : t.slices) covered += s.slice.NumElements();
  const int64_t want = NumElements(t.meta.shape);
  if (covered != want) {
    return Corrupt(path, "the slices of tensor '" + t.meta.name + "' cover " +
                             std::to_string(covered) + " of its " + std::to_string(want) +
                             " elements");
  }
  const size_t rank = t.meta.shape.size();
  size_t dim = 0, most = 0;
  for (size_t d = 0; d < rank; ++d) {
    std::set<int64_t> offsets;
    for (const auto& s : t.slices) offsets.insert(s.slice.offsets[d]);
    if (offsets.size() > most) most = offsets.size(), dim = d;
  }
  std::vector<const SliceSpec*> order;
  for (const auto& s : t.slices) order.push_back(&s.slice);
  auto start = [&](const SliceSpec* s) { return rank == 0 ? 0 : s->offsets[dim]; };
  auto end = [&](const SliceSpec* s) { return rank == 0 ? 1 : s->offsets[dim] + s->lengths[dim]; };
  std::sort(order.begin(), order.end(),
            [&](const SliceSpec* a, const SliceSpec* b) { return start(a) < start(b); });
  for (size_t i = 0; i < order.size(); ++i) {
    for (size_t j = i + 1; j < order.size() && start(order[j]) < end(order[i]); ++j) {
      if (Intersect(*order[i], *order[j]).has_value()) {
        return Corrupt(path, "the slices " + order[i]->ToString() + " and " +
                                 order[j]->ToString() + " of tensor '" + t.meta.name +
                                 "' overlap");
      }
    }
  }
  return Status::Ok();
}

// Steps a query of the index at `file`. The index is an image in memory, so a
// failure comes from its bytes (a damaged page met on the way, a schema that
// does not compile): the file is corrupt, and named. Only running out of
// memory is not the file's fault.
Result<bool> StepIn(SqliteStmt& stmt, const std::string& file) {
  auto row = stmt.Step();
  if (!row.ok()) {
    const Code code =
        row.status().code() == Code::kResourceExhausted ? Code::kResourceExhausted : Code::kDataLoss;
    return Status(code, file + ": " + row.status().message(), {{"file", file}});
  }
  return row;
}

}  // namespace

std::string SealIndexImage(std::string image) {
  const uint64_t sum = Checksum(image.data(), image.size());
  image.append(kIndexSealMagic, 8);
  for (int i = 0; i < 8; ++i) image.push_back(static_cast<char>(sum >> (8 * i)));
  return image;
}

namespace {

// The queries of Open must read stored rows, which the file's size bounds: a view
// (a recursive one never ends), a virtual table or a generated column would compute
// them instead.
Status CheckSchema(SqliteDb& db, const std::string& path) {
  auto fail = [&](const std::string& why) { return Corrupt(path, why); };
  auto stmt = db.Prepare(
      "SELECT (SELECT count(*) FROM sqlite_master WHERE type = 'table' AND "
      "name IN ('meta', 'tensors', 'slices', 'chunks') AND sql LIKE 'CREATE TABLE %'), "
      "(SELECT count(*) FROM pragma_table_xinfo('meta') WHERE hidden != 0) + "
      "(SELECT count(*) FROM pragma_table_xinfo('tensors') WHERE hidden != 0) + "
      "(SELECT count(*) FROM pragma_table_xinfo('slices') WHERE hidden != 0) + "
      "(SELECT count(*) FROM pragma_table_xinfo('chunks') WHERE hidden != 0)");
  if (!stmt.ok()) return fail("no schema");
  ASSIGN_OR_RETURN(bool row, StepIn(*stmt, path));
  if (!row || stmt->Int(0) != 4 || stmt->Int(1) != 0) {
    return fail("meta, tensors, slices and chunks must be plain tables of stored columns");
  }
  return Status::Ok();
}

}  // namespace

Status CheckpointIndex::LoadMeta(SqliteDb& db, const std::string& path, bool sealed) {
  auto fail = [&](const std::string& why) { return Corrupt(path, why); };
  auto stmt = db.Prepare("SELECT key, value FROM meta");
  if (!stmt.ok()) return fail("no meta table");
  std::map<std::string, std::string> kv;
  while (true) {
    ASSIGN_OR_RETURN(bool row, StepIn(*stmt, path));
    if (!row) break;
    kv[stmt->Text(0)] = stmt->Text(1);
  }
  if (!kv.count("format_version")) return fail("no format_version");
  format_version_ = std::atoi(kv["format_version"].c_str());
  if (format_version_ >= kSealedIndexFormatVersion && format_version_ <= kIndexFormatVersion &&
      !sealed) {
    return fail("it has no checksum trailer, which its format version " +
                std::to_string(format_version_) + " requires");
  }
  if ((format_version_ < kSealedIndexFormatVersion || format_version_ > kIndexFormatVersion) &&
      !(format_version_ == kUnsealedIndexFormatVersion && !sealed)) {
    return InvalidArgument(path + " has index format version " + kv["format_version"] +
                               "; this build reads version " +
                               std::to_string(kIndexFormatVersion),
                           {{"file", path}});
  }
  auto mesh_json = ParseJson(kv["mesh"], "mesh");
  if (!mesh_json.ok()) return fail("bad mesh");
  auto mesh = MeshFromJson(*mesh_json);
  if (!mesh.ok()) return fail("bad mesh: " + mesh.status().message());
  meta_.mesh = *mesh;
  meta_.step = std::atoll(kv["step"].c_str());
  auto md = ParseJson(kv["metadata"], "metadata");
  meta_.metadata = md.ok() ? *md : Json::object();
  meta_.created_at_ms = std::atoll(kv["created_at_ms"].c_str());
  return Status::Ok();
}

Status CheckpointIndex::LoadTensors(SqliteDb& db, const std::string& path,
                                    std::map<int64_t, size_t>* tensor_pos) {
  auto fail = [&](const std::string& why) { return Corrupt(path, why); };
  auto stmt = db.Prepare("SELECT id, name, dtype, shape, layout, elements FROM tensors ORDER BY id");
  if (!stmt.ok()) return fail("no tensors table");
  while (true) {
    ASSIGN_OR_RETURN(bool row, StepIn(*stmt, path));
    if (!row) break;
    TensorEntry t;
    t.meta.name = stmt->Text(1);
    auto dtype = ParseDType(stmt->Text(2));
    auto shape = ParseShape(stmt->Text(3));
    auto layout = ParseLayout(stmt->Text(4));
    if (!dtype.ok() || !shape.ok() || !layout.ok() ||
        layout->dims.size() != shape->size() || NumElements(*shape) != stmt->Int(5)) {
      return fail("tensor '" + t.meta.name + "' has a malformed dtype, shape or layout");
    }
    t.meta.dtype = *dtype;
    t.meta.shape = *shape;
    t.meta.layout = *layout;
    (*tensor_pos)[stmt->Int(0)] = tensors_.size();
    by_name_[t.meta.name] = tensors_.size();
    tensors_.push_back(std::move(t));
  }
  return Status::Ok();
}

Status CheckpointIndex::LoadSlices(SqliteDb& db, const std::string& path,
                                   const std::map<int64_t, size_t>& tensor_pos,
                                   std::map<int64_t, std::pair<size_t, size_t>>* slice_pos) {
  auto fail = [&](const std::string& why) { return Corrupt(path, why); };
  auto stmt = db.Prepare("SELECT id, tensor_id, offsets, lengths, file FROM slices ORDER BY id");
  if (!stmt.ok()) return fail("no slices table");
  while (true) {
    ASSIGN_OR_RETURN(bool row, StepIn(*stmt, path));
    if (!row) break;
    auto t = tensor_pos.find(stmt->Int(1));
    if (t == tensor_pos.end()) return fail("slice of an unknown tensor");
    TensorEntry& tensor = tensors_[t->second];
    SliceEntry s;
    auto offsets = ParseShape(stmt->Text(2));
    auto lengths = ParseShape(stmt->Text(3));
    s.file = stmt->Text(4);
    if (!offsets.ok() || !lengths.ok() || offsets->size() != tensor.meta.shape.size() ||
        lengths->size() != tensor.meta.shape.size() ||
        !Contains(FullSlice(tensor.meta.shape), SliceSpec{*offsets, *lengths}) ||
        !IsPlainFileName(s.file)) {
      return fail("slice " + std::to_string(stmt->Int(0)) + " of tensor '" + tensor.meta.name +
                  "' is malformed");
    }
    s.slice = SliceSpec{*offsets, *lengths};
    (*slice_pos)[stmt->Int(0)] = {t->second, tensor.slices.size()};
    tensor.slices.push_back(std::move(s));
  }
  return Status::Ok();
}

Status CheckpointIndex::LoadChunks(
    SqliteDb& db, const std::string& path,
    const std::map<int64_t, std::pair<size_t, size_t>>& slice_pos) {
  auto fail = [&](const std::string& why) { return Corrupt(path, why); };
  // Before version 3 every chunk is in its slice's file.
  const std::string file_column = format_version_ >= 3 ? "file" : "NULL";
  auto stmt = db.Prepare("SELECT slice_id, raw_offset, offset, length, raw_length, codec, checksum, " +
                         file_column + " FROM chunks ORDER BY slice_id, raw_offset");
  if (!stmt.ok()) return fail("no chunks table");
  while (true) {
    ASSIGN_OR_RETURN(bool row, StepIn(*stmt, path));
    if (!row) break;
    auto s = slice_pos.find(stmt->Int(0));
    if (s == slice_pos.end()) return fail("chunk of an unknown slice");
    TensorEntry& tensor = tensors_[s->second.first];
    SliceChunk c;
    c.raw_offset = stmt->Int(1);
    c.loc = {static_cast<uint64_t>(stmt->Int(2)), static_cast<uint64_t>(stmt->Int(3)),
             static_cast<uint64_t>(stmt->Int(4)), static_cast<uint64_t>(stmt->Int(6)),
             static_cast<Codec>(stmt->Int(5))};
    if (stmt->Int(1) < 0 || stmt->Int(2) < 0 || stmt->Int(3) < 0 || stmt->Int(4) < 0 ||
        c.loc.raw_length > kMaxChunkSize || c.loc.length > 2 * kMaxChunkSize ||
        !IsCodec(static_cast<uint64_t>(c.loc.codec))) {
      return fail("a chunk of tensor '" + tensor.meta.name + "' is malformed");
    }
    if (!stmt->IsNull(7)) {
      c.file = stmt->Text(7);
      if (!ParseChunkRef(c.file)) {
        return fail("a chunk of tensor '" + tensor.meta.name + "' refers to '" + c.file +
                    "', not to a shard file of another checkpoint of its mesh");
      }
    }
    tensor.stored_bytes += c.loc.length;
    tensor.slices[s->second.second].chunks.push_back(c);
  }
  return Status::Ok();
}

Status CheckpointIndex::CheckCoverage(const std::string& path) const {
  auto fail = [&](const std::string& why) { return Corrupt(path, why); };
  for (const auto& t : tensors_) {
    RETURN_IF_ERROR(CheckTiling(t, path));
    const uint64_t esize = DTypeSize(t.meta.dtype);
    for (const auto& s : t.slices) {
      uint64_t expect = 0;
      for (const auto& c : s.chunks) {
        if (c.raw_offset != expect) break;
        expect += c.loc.raw_length;
      }
      if (expect != static_cast<uint64_t>(s.slice.NumElements()) * esize) {
        return fail("the chunks of tensor '" + t.meta.name + "' slice " + s.slice.ToString() +
                    " do not cover it");
      }
    }
  }
  return Status::Ok();
}

Result<CheckpointIndex> CheckpointIndex::Open(Env* env, const std::string& dir) {
  const std::string path = JoinPath(dir, kIndexFile);
  auto image = ReadWholeFile(env, path);
  // Missing is said so; any other failure (a store refusing us) is passed on as is.
  if (!image.ok() && image.status().code() == Code::kNotFound && !env->Exists(path)) {
    return NotFound("no " + std::string(kIndexFile) + " in " + dir +
                        " (not a checkpoint, or an unfinished one)",
                    {{"file", path}});
  }
  if (!image.ok()) return image.status();
  bool sealed = false;
  ASSIGN_OR_RETURN(std::string sqlite_image, UnsealIndexImage(std::move(*image), path, &sealed));
  ASSIGN_OR_RETURN(SqliteDb db, SqliteDb::FromImage(sqlite_image, path));
  RETURN_IF_ERROR(CheckSchema(db, path));
  CheckpointIndex index;
  RETURN_IF_ERROR(index.LoadMeta(db, path, sealed));
  std::map<int64_t, size_t> tensor_pos;
  RETURN_IF_ERROR(index.LoadTensors(db, path, &tensor_pos));
  std::map<int64_t, std::pair<size_t, size_t>> slice_pos;  // slice id → (tensor, slice)
  RETURN_IF_ERROR(index.LoadSlices(db, path, tensor_pos, &slice_pos));
  RETURN_IF_ERROR(index.LoadChunks(db, path, slice_pos));
  RETURN_IF_ERROR(index.CheckCoverage(path));
  return index;
}

const TensorEntry* CheckpointIndex::Find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

uint64_t CheckpointIndex::logical_bytes() const {
  uint64_t n = 0;
  for (const auto& t : tensors_) n += t.meta.logical_bytes();
  return n;
}

uint64_t CheckpointIndex::stored_bytes() const {
  uint64_t n = 0;
  for (const auto& t : tensors_) n += t.stored_bytes;
  return n;
}

std::vector<std::string> CheckpointIndex::files() const {
  std::set<std::string> files;
  for (const auto& t : tensors_) {
    for (const auto& s : t.slices) {
      for (const auto& c : s.chunks) {
        if (c.file.empty()) files.insert(s.file);
      }
      if (s.chunks.empty()) files.insert(s.file);
    }
  }
  return {files.begin(), files.end()};
}

std::vector<std::string> CheckpointIndex::referenced_files() const {
  std::set<std::string> files;
  for (const auto& t : tensors_) {
    for (const auto& s : t.slices) {
      for (const auto& c : s.chunks) {
        if (!c.file.empty()) files.insert(c.file);
      }
    }
  }
  return {files.begin(), files.end()};
}

uint64_t CheckpointIndex::referenced_bytes() const {
  uint64_t n = 0;
  for (const auto& t : tensors_) {
    for (const auto& s : t.slices) {
      for (const auto& c : s.chunks) {
        if (!c.file.empty()) n += c.loc.length;
      }
    }
  }
  return n;
}

}  // namespace tessera::storage
