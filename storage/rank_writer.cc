#include "storage/rank_writer.h"

namespace tessera::storage {

Result<ShardWritten> WriteShard(Env* env, const std::string& staging, const std::string& file,
                                const std::vector<SliceToWrite>& slices,
                                const ShardOptions& options) {
  for (const auto& s : slices) {
    uint64_t expect = s.slice.NumElements() * DTypeSize(s.tensor.dtype);
    if (s.bytes != expect) {
      return InvalidArgument("slice " + s.slice.ToString() + " of tensor '" + s.tensor.name +
                                 "' has " + std::to_string(s.bytes) + " bytes, expected " +
                                 std::to_string(expect),
                             {{"tensor", s.tensor.name}});
    }
  }
  ASSIGN_OR_RETURN(auto writer, ShardWriter::Create(env, JoinPath(staging, file), options));
  std::vector<size_t> handles;
  handles.reserve(slices.size());
  for (const auto& s : slices) {
    const int width = PlaneWidth(s.tensor.dtype);
    ASSIGN_OR_RETURN(size_t h, s.read ? writer->Add(s.read, s.bytes, width, s.base)
                                      : writer->Add(s.data, s.bytes, width, s.base));
    handles.push_back(h);
  }
  RETURN_IF_ERROR(writer->Finish());
  ShardWritten out{writer->raw_bytes(), writer->stored_bytes(), writer->reused_bytes(),
                   writer->written(), {}};
  out.fragment.reserve(slices.size());
  for (size_t i = 0; i < slices.size(); ++i) {
    out.fragment.push_back({slices[i].tensor, slices[i].slice, file, writer->chunks(handles[i])});
  }
  return out;
}

Result<RankWriteResult> WriteRank(Env* env, const std::string& staging, int64_t rank,
                                  const std::vector<SliceToWrite>& slices,
                                  const ShardOptions& options) {
  ASSIGN_OR_RETURN(ShardWritten w, WriteShard(env, staging, ShardFileName(rank), slices, options));
  ASSIGN_OR_RETURN(auto fragment, FragmentBuilder::Create());
  for (const FragmentSlice& s : w.fragment) {
    RETURN_IF_ERROR(fragment.AddSlice(s.tensor, s.slice, s.file, s.chunks));
  }
  RETURN_IF_ERROR(fragment.WriteTo(env, JoinPath(staging, FragmentFileName(rank))));
  return RankWriteResult{w.raw_bytes, w.stored_bytes};
}

}  // namespace tessera::storage
