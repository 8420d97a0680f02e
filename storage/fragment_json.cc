#include "storage/fragment_json.h"

#include "api/names.h"
#include "api/shape.h"
#include "storage/chunk_ref.h"

namespace tessera::storage {
namespace {

constexpr size_t kChunkFields = 6;  // a 7th: the file of a chunk that refers to a base

Status Bad(const std::string& what, size_t i, const std::string& tensor = "") {
  Json details = {{"field", "fragment"}, {"slice", i}};
  if (!tensor.empty()) details["tensor"] = tensor;
  return InvalidArgument("fragment slice " + std::to_string(i) +
                             (tensor.empty() ? "" : " (tensor '" + tensor + "')") + ": " + what,
                         std::move(details));
}

Result<SliceChunk> ChunkFromJson(const Json& j, size_t i, const std::string& tensor) {
  if (!j.is_array() || (j.size() != kChunkFields && j.size() != kChunkFields + 1)) {
    return Bad("a chunk must be [raw_offset, offset, length, raw_length, codec, checksum] "
               "and, for one in an earlier checkpoint, its file",
               i, tensor);
  }
  for (size_t f = 0; f < kChunkFields; ++f) {
    const Json& v = j[f];
    if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0)) {
      return Bad("chunk fields must be unsigned integers", i, tensor);
    }
  }
  SliceChunk c;
  if (j.size() > kChunkFields) {
    if (!j[kChunkFields].is_string() || !ParseChunkRef(j[kChunkFields].get<std::string>())) {
      return Bad("a chunk's file must be \"../<checkpoint dir>/<shard file>\"", i, tensor);
    }
    c.file = j[kChunkFields].get<std::string>();
  }
  c.raw_offset = j[0].get<uint64_t>();
  c.loc.offset = j[1].get<uint64_t>();
  c.loc.length = j[2].get<uint64_t>();
  c.loc.raw_length = j[3].get<uint64_t>();
  const uint64_t codec = j[4].get<uint64_t>();
  if (!IsCodec(codec)) {
    return Bad("unknown chunk codec " + std::to_string(codec), i, tensor);
  }
  c.loc.codec = static_cast<Codec>(codec);
  c.loc.checksum = j[5].get<uint64_t>();
  return c;
}

}  // namespace

Json FragmentToJson(const std::vector<FragmentSlice>& slices) {
  Json out = Json::array();
  for (const FragmentSlice& s : slices) {
    Json chunks = Json::array();
    for (const SliceChunk& c : s.chunks) {
      Json chunk = {c.raw_offset, c.loc.offset, c.loc.length, c.loc.raw_length,
                    static_cast<uint64_t>(c.loc.codec), c.loc.checksum};
      if (!c.file.empty()) chunk.push_back(c.file);
      chunks.push_back(std::move(chunk));
    }
    out.push_back({{"tensor", TensorMetaToJson(s.tensor)},
                   {"slice", SliceToJson(s.slice)},
                   {"file", s.file},
                   {"chunks", std::move(chunks)}});
  }
  return out;
}

Result<std::vector<FragmentSlice>> FragmentFromJson(const Json& j) {
  if (!j.is_array()) return InvalidArgument("fragment must be a list of slices", {{"field", "fragment"}});
  std::vector<FragmentSlice> out;
  out.reserve(j.size());
  for (size_t i = 0; i < j.size(); ++i) {
    const Json& e = j[i];
    if (!e.is_object() || !e.contains("tensor") || !e.contains("slice") || !e.contains("chunks")) {
      return Bad("must be an object with tensor, slice, file and chunks", i);
    }
    FragmentSlice s;
    auto tensor = TensorMetaFromJson(e["tensor"]);
    if (!tensor.ok()) return Bad(tensor.status().message(), i);
    s.tensor = std::move(*tensor);
    const std::string& name = s.tensor.name;
    if (Status st = ValidateName(name, "tensor"); !st.ok()) return Bad(st.message(), i);
    if (Status st = CheckShapeSize(s.tensor.shape, "shape"); !st.ok()) return Bad(st.message(), i, name);
    auto slice = SliceFromJson(e["slice"]);
    if (!slice.ok()) return Bad(slice.status().message(), i, name);
    s.slice = std::move(*slice);
    if (s.slice.offsets.size() != s.tensor.shape.size() ||
        s.slice.lengths.size() != s.tensor.shape.size() ||
        !Contains(FullSlice(s.tensor.shape), s.slice)) {
      return Bad("slice " + s.slice.ToString() + " is not inside shape " +
                     ShapeToString(s.tensor.shape), i, name);
    }
    auto file = RequiredString(e, "file");
    if (!file.ok()) return Bad(file.status().message(), i, name);
    s.file = std::move(*file);
    // The index reader's rule (chunk_ref.h): what a merge takes, a reader opens.
    if (!IsPlainFileName(s.file)) {
      return Bad("file must be a plain file name (not empty, no '/', not starting with '.', at "
                 "most 255 bytes)",
                 i, name);
    }
    const Json& chunks = e["chunks"];
    if (!chunks.is_array()) return Bad("chunks must be a list", i, name);
    const uint64_t bytes = static_cast<uint64_t>(s.slice.NumElements()) * DTypeSize(s.tensor.dtype);
    uint64_t covered = 0;
    for (const Json& c : chunks) {
      ASSIGN_OR_RETURN(SliceChunk chunk, ChunkFromJson(c, i, name));
      if (chunk.raw_offset != covered || chunk.loc.raw_length == 0 ||
          chunk.loc.raw_length > bytes - covered) {
        return Bad("chunks must tile the slice's " + std::to_string(bytes) + " bytes in order", i, name);
      }
      covered += chunk.loc.raw_length;
      s.chunks.push_back(chunk);
    }
    if (covered != bytes) {
      return Bad("chunks cover " + std::to_string(covered) + " of the slice's " +
                     std::to_string(bytes) + " bytes", i, name);
    }
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace tessera::storage
