// The writing side of the index (storage/index.h): fragments, their merge into
// index.sqlite, and the names of the files a save writes.
#include "storage/index.h"

#include <map>
#include <set>

#include "storage/chunk_codec.h"

namespace tessera::storage {
namespace {

constexpr const char* kFragmentSchema = R"sql(
CREATE TABLE tensors(name TEXT PRIMARY KEY, dtype TEXT NOT NULL, shape TEXT NOT NULL,
                     layout TEXT NOT NULL, elements INTEGER NOT NULL);
CREATE TABLE slices(id INTEGER PRIMARY KEY, tensor TEXT NOT NULL, offsets TEXT NOT NULL,
                    lengths TEXT NOT NULL, elements INTEGER NOT NULL, file TEXT NOT NULL);
CREATE TABLE chunks(slice_id INTEGER NOT NULL, raw_offset INTEGER NOT NULL,
                    offset INTEGER NOT NULL, length INTEGER NOT NULL,
                    raw_length INTEGER NOT NULL, codec INTEGER NOT NULL,
                    checksum INTEGER NOT NULL, file TEXT);
)sql";

constexpr const char* kIndexSchema = R"sql(
CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE tensors(id INTEGER PRIMARY KEY, name TEXT UNIQUE NOT NULL, dtype TEXT NOT NULL,
                     shape TEXT NOT NULL, layout TEXT NOT NULL, elements INTEGER NOT NULL);
CREATE TABLE slices(id INTEGER PRIMARY KEY, tensor_id INTEGER NOT NULL, offsets TEXT NOT NULL,
                    lengths TEXT NOT NULL, elements INTEGER NOT NULL, file TEXT NOT NULL);
CREATE TABLE chunks(slice_id INTEGER NOT NULL, raw_offset INTEGER NOT NULL,
                    offset INTEGER NOT NULL, length INTEGER NOT NULL,
                    raw_length INTEGER NOT NULL, codec INTEGER NOT NULL,
                    checksum INTEGER NOT NULL, file TEXT);
)sql";

Status Corrupt(const std::string& file, const std::string& why) {
  return DataLoss(file + " is corrupt: " + why, {{"file", file}});
}

}  // namespace

std::string FragmentFileName(int64_t rank) { return "fragment-" + std::to_string(rank) + ".sqlite"; }
std::string ShardFileName(int64_t rank) { return "shard-" + std::to_string(rank) + ".tsr"; }
std::string ShardFileName(int64_t rank, const std::string& tag) {
  return "shard-" + std::to_string(rank) + "-" + tag + ".tsr";
}

Result<FragmentBuilder> FragmentBuilder::Create() {
  ASSIGN_OR_RETURN(SqliteDb db, SqliteDb::OpenMemory());
  RETURN_IF_ERROR(db.Exec(kFragmentSchema));
  RETURN_IF_ERROR(db.Exec("BEGIN"));
  return FragmentBuilder(std::move(db));
}

Status FragmentBuilder::AddSlice(const TensorMeta& t, const SliceSpec& slice,
                                 const std::string& file, const std::vector<SliceChunk>& chunks) {
  ASSIGN_OR_RETURN(auto ins_tensor,
                   db_.Prepare("INSERT OR IGNORE INTO tensors VALUES(?1, ?2, ?3, ?4, ?5)"));
  RETURN_IF_ERROR(ins_tensor.Bind(1, t.name)
                      .Bind(2, DTypeName(t.dtype))
                      .Bind(3, ShapeToString(t.shape))
                      .Bind(4, t.layout.ToString())
                      .Bind(5, NumElements(t.shape))
                      .Run());
  int64_t id = next_slice_++;
  ASSIGN_OR_RETURN(auto ins_slice, db_.Prepare("INSERT INTO slices VALUES(?1, ?2, ?3, ?4, ?5, ?6)"));
  RETURN_IF_ERROR(ins_slice.Bind(1, id)
                      .Bind(2, t.name)
                      .Bind(3, ShapeToString(slice.offsets))
                      .Bind(4, ShapeToString(slice.lengths))
                      .Bind(5, slice.NumElements())
                      .Bind(6, file)
                      .Run());
  ASSIGN_OR_RETURN(auto ins_chunk, db_.Prepare("INSERT INTO chunks VALUES(?1,?2,?3,?4,?5,?6,?7,?8)"));
  for (const auto& c : chunks) {
    if (c.file.empty()) {
      ins_chunk.BindNull(8);
    } else {
      ins_chunk.Bind(8, std::string_view(c.file));
    }
    RETURN_IF_ERROR(ins_chunk.Bind(1, id)
                        .Bind(2, static_cast<int64_t>(c.raw_offset))
                        .Bind(3, static_cast<int64_t>(c.loc.offset))
                        .Bind(4, static_cast<int64_t>(c.loc.length))
                        .Bind(5, static_cast<int64_t>(c.loc.raw_length))
                        .Bind(6, static_cast<int64_t>(c.loc.codec))
                        .Bind(7, static_cast<int64_t>(c.loc.checksum))
                        .Run());
  }
  return Status::Ok();
}

Result<std::string> FragmentBuilder::Image() {
  RETURN_IF_ERROR(db_.Exec("COMMIT"));
  ASSIGN_OR_RETURN(std::string image, db_.Serialize());
  RETURN_IF_ERROR(db_.Exec("BEGIN"));
  return image;
}

Status FragmentBuilder::WriteTo(Env* env, const std::string& path) {
  ASSIGN_OR_RETURN(std::string image, Image());
  ASSIGN_OR_RETURN(auto file, env->NewWritableFile(path));
  RETURN_IF_ERROR(file->Append(image.data(), image.size()));
  RETURN_IF_ERROR(file->Sync());
  return file->Close();
}

namespace {

// A fragment's SQLite image and the name its errors give it.
struct FragmentImage {
  std::string name;
  std::string image;
};

// Merges the fragments' images into `dir`/index.sqlite (fsynced, not its directory).
Status MergeImages(Env* env, const std::string& dir, const std::vector<FragmentImage>& fragments,
                   const CheckpointMeta& meta) {
  ASSIGN_OR_RETURN(SqliteDb db, SqliteDb::OpenMemory());
  RETURN_IF_ERROR(db.Exec(kIndexSchema));
  for (const auto& [name, image] : fragments) {
    RETURN_IF_ERROR(db.AttachImage("f", image, name));
    // Two writers must agree on what a tensor is.
    ASSIGN_OR_RETURN(auto clash, db.Prepare(
        "SELECT f.name, t.dtype, t.shape, t.layout, f.dtype, f.shape, f.layout "
        "FROM f.tensors f JOIN main.tensors t ON t.name = f.name "
        "WHERE t.dtype != f.dtype OR t.shape != f.shape OR t.layout != f.layout LIMIT 1"));
    ASSIGN_OR_RETURN(bool has_clash, clash.Step());
    if (has_clash) {
      Status st = InvalidArgument(
          "tensor '" + clash.Text(0) + "' is recorded as " + clash.Text(1) + "[" + clash.Text(2) +
              "] layout " + clash.Text(3) + " by one writer and " + clash.Text(4) + "[" +
              clash.Text(5) + "] layout " + clash.Text(6) + " by " + name,
          {{"tensor", clash.Text(0)}, {"file", name}});
      clash = SqliteStmt();
      return st;
    }
    clash = SqliteStmt();
    ASSIGN_OR_RETURN(auto base_stmt, db.Prepare("SELECT COALESCE(MAX(id), 0) FROM main.slices"));
    RETURN_IF_ERROR(base_stmt.Step().status());
    const std::string base = std::to_string(base_stmt.Int(0));
    base_stmt = SqliteStmt();
    // ATTACH/DETACH cannot happen inside a transaction, so each fragment gets one.
    Status st = db.Exec(
        "BEGIN;"
        "INSERT OR IGNORE INTO main.tensors(name, dtype, shape, layout, elements) "
        "SELECT name, dtype, shape, layout, elements FROM f.tensors;"
        "INSERT INTO main.slices SELECT s.id + " + base + ", t.id, s.offsets, s.lengths, "
        "s.elements, s.file FROM f.slices s JOIN main.tensors t ON t.name = s.tensor;"
        "INSERT INTO main.chunks SELECT slice_id + " + base + ", raw_offset, offset, length, "
        "raw_length, codec, checksum, file FROM f.chunks;"
        "COMMIT;");
    if (!st.ok()) return Corrupt(name, st.message());
    RETURN_IF_ERROR(db.Detach("f"));
  }
  // Every tensor must be covered exactly once by its (disjoint) slices.
  ASSIGN_OR_RETURN(auto cover, db.Prepare(
      "SELECT t.name, t.elements, COALESCE(SUM(s.elements), 0) FROM tensors t "
      "LEFT JOIN slices s ON s.tensor_id = t.id GROUP BY t.id "
      "HAVING COALESCE(SUM(s.elements), 0) != t.elements LIMIT 1"));
  ASSIGN_OR_RETURN(bool gap, cover.Step());
  if (gap) {
    return Internal("tensor '" + cover.Text(0) + "' has " + std::to_string(cover.Int(1)) +
                        " elements but its saved slices hold " + std::to_string(cover.Int(2)),
                    {{"tensor", cover.Text(0)}});
  }
  cover = SqliteStmt();
  RETURN_IF_ERROR(db.Exec("CREATE INDEX slices_by_tensor ON slices(tensor_id);"
                          "CREATE INDEX chunks_by_slice ON chunks(slice_id, raw_offset);"));
  ASSIGN_OR_RETURN(auto ins_meta, db.Prepare("INSERT INTO meta VALUES(?1, ?2)"));
  const std::pair<std::string, std::string> rows[] = {
      {"format_version", std::to_string(kIndexFormatVersion)},
      {"mesh", MeshToJson(meta.mesh).dump()},
      {"step", std::to_string(meta.step)},
      {"metadata", meta.metadata.dump()},
      {"created_at_ms", std::to_string(meta.created_at_ms)},
  };
  for (const auto& [k, v] : rows) RETURN_IF_ERROR(ins_meta.Bind(1, k).Bind(2, v).Run());
  ins_meta = SqliteStmt();
  ASSIGN_OR_RETURN(std::string image, db.Serialize());
  image = SealIndexImage(std::move(image));
  const std::string path = JoinPath(dir, kIndexFile);
  ASSIGN_OR_RETURN(auto file, env->NewWritableFile(path));
  RETURN_IF_ERROR(file->Append(image.data(), image.size()));
  RETURN_IF_ERROR(file->Sync());
  return file->Close();
}

}  // namespace

Status MergeFragments(Env* env, const std::string& dir, const std::vector<std::string>& fragments,
                      const CheckpointMeta& meta) {
  std::vector<FragmentImage> images;
  images.reserve(fragments.size());
  for (const auto& name : fragments) {
    ASSIGN_OR_RETURN(std::string image, ReadWholeFile(env, JoinPath(dir, name)));
    images.push_back({name, std::move(image)});
  }
  RETURN_IF_ERROR(MergeImages(env, dir, images, meta));
  // The commit fsyncs the dir before its rename: these deletions need no sync of their own.
  for (const auto& name : fragments) RETURN_IF_ERROR(env->DeleteFile(JoinPath(dir, name)));
  return Status::Ok();
}

Status MergeSlices(Env* env, const std::string& dir,
                   const std::vector<std::vector<FragmentSlice>>& fragments,
                   const CheckpointMeta& meta) {
  // One builder for every writer's slices: a tensor two writers describe differently
  // is found here, since the builder keeps the first description.
  std::map<std::string, std::pair<const TensorMeta*, std::string>> seen;  // name → (meta, file)
  ASSIGN_OR_RETURN(auto builder, FragmentBuilder::Create());
  for (const auto& fragment : fragments) {
    for (const FragmentSlice& s : fragment) {
      auto [it, fresh] = seen.try_emplace(s.tensor.name, &s.tensor, s.file);
      if (!fresh && !(*it->second.first == s.tensor)) {
        return InvalidArgument("tensor '" + s.tensor.name + "' is recorded as " +
                                   it->second.first->ToString() + " by the writer of " +
                                   it->second.second + " and " + s.tensor.ToString() +
                                   " by the writer of " + s.file,
                               {{"tensor", s.tensor.name}, {"file", s.file}});
      }
      RETURN_IF_ERROR(builder.AddSlice(s.tensor, s.slice, s.file, s.chunks));
    }
  }
  ASSIGN_OR_RETURN(std::string image, builder.Image());
  return MergeImages(env, dir, {{"the writers' fragments", std::move(image)}}, meta);
}

}  // namespace tessera::storage
