#include "storage/rank_writer.h"

namespace tessera::storage {

Result<RankWriteResult> WriteRank(Env* env, const std::string& staging, int64_t rank,
                                  const std::vector<SliceToWrite>& slices,
                                  const ShardOptions& options) {
  const std::string shard_name = ShardFileName(rank);
  for (const auto& s : slices) {
    uint64_t expect = s.slice.NumElements() * DTypeSize(s.tensor.dtype);
    if (s.bytes != expect) {
      return InvalidArgument("slice " + s.slice.ToString() + " of tensor '" + s.tensor.name +
                                 "' has " + std::to_string(s.bytes) + " bytes, expected " +
                                 std::to_string(expect),
                             {{"tensor", s.tensor.name}});
    }
  }
  ASSIGN_OR_RETURN(auto writer, ShardWriter::Create(env, JoinPath(staging, shard_name), options));
  std::vector<size_t> handles;
  handles.reserve(slices.size());
  for (const auto& s : slices) {
    ASSIGN_OR_RETURN(size_t h, writer->Add(s.data, s.bytes));
    handles.push_back(h);
  }
  RETURN_IF_ERROR(writer->Finish());
  ASSIGN_OR_RETURN(auto fragment, FragmentBuilder::Create());
  for (size_t i = 0; i < slices.size(); ++i) {
    RETURN_IF_ERROR(
        fragment.AddSlice(slices[i].tensor, slices[i].slice, shard_name, writer->chunks(handles[i])));
  }
  RETURN_IF_ERROR(fragment.WriteTo(env, JoinPath(staging, FragmentFileName(rank))));
  return RankWriteResult{writer->raw_bytes(), writer->stored_bytes()};
}

}  // namespace tessera::storage
