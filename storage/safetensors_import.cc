#include "storage/safetensors_import.h"

#include <algorithm>
#include <map>
#include <set>

#include "storage/mapped_file.h"
#include "storage/root_meta.h"
#include "storage/save_transaction.h"

namespace tessera::storage {
namespace {

bool EndsWith(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The files a folder's *.safetensors.index.json names, with the tensors it maps to
// each; an empty map when the folder has none.
Result<std::map<std::string, std::set<std::string>>> IndexedFiles(Env* env, const std::string& dir,
                                                                  const std::vector<std::string>& names) {
  std::map<std::string, std::set<std::string>> files;
  std::string index;
  for (const std::string& n : names) {
    if (!EndsWith(n, ".safetensors.index.json")) continue;
    if (!index.empty()) {
      return InvalidArgument("folder " + dir + " has two safetensors indexes, " + index + " and " + n +
                                 "; import one of them by naming its files' folder with only it",
                             {{"file", JoinPath(dir, n)}});
    }
    index = n;
  }
  if (index.empty()) return files;
  const std::string path = JoinPath(dir, index);
  ASSIGN_OR_RETURN(auto f, env->NewRandomAccessFile(path));
  if (f->Size() > kMaxSafetensorsHeader) {
    return InvalidArgument("safetensors index " + path + " is over " + std::to_string(kMaxSafetensorsHeader) + " bytes",
                           {{"file", path}});
  }
  std::string text(f->Size(), '\0');
  RETURN_IF_ERROR(f->Read(0, text.size(), text.data()));
  auto j = ParseJson(text, path);
  if (!j.ok() || !j->is_object() || !j->contains("weight_map") || !(*j)["weight_map"].is_object()) {
    return DataLoss("safetensors index " + path + " is not JSON with a \"weight_map\" object",
                    {{"file", path}});
  }
  for (const auto& [tensor, file] : (*j)["weight_map"].items()) {
    if (!file.is_string() || file.get<std::string>().empty() ||
        file.get<std::string>().find('/') != std::string::npos || file.get<std::string>() == "..") {
      return DataLoss("safetensors index " + path + " maps tensor '" + tensor + "' to " + file.dump() +
                          ", not a file name of its folder",
                      {{"file", path}, {"tensor", tensor}});
    }
    files[file.get<std::string>()].insert(tensor);
  }
  return files;
}

}  // namespace

Result<std::vector<SafetensorsSource>> ReadSafetensorsSource(Env* env, const std::string& source) {
  if (env->IsObjectStore(source)) {
    return InvalidArgument("import reads safetensors files from a file system; " + source +
                               " is in an object store: copy its files to a local folder first",
                           {{"field", "source"}, {"file", source}});
  }
  if (!env->Exists(source)) {
    return NotFound("no safetensors file or folder " + source, {{"field", "source"}, {"file", source}});
  }
  std::vector<std::string> paths;
  std::map<std::string, std::set<std::string>> indexed;
  if (env->IsDirectory(source)) {
    ASSIGN_OR_RETURN(std::vector<std::string> names, env->ListDir(source));
    ASSIGN_OR_RETURN(indexed, IndexedFiles(env, source, names));
    if (!indexed.empty()) {
      for (const auto& [name, tensors] : indexed) paths.push_back(JoinPath(source, name));
    } else {
      for (const std::string& n : names) {
        if (EndsWith(n, ".safetensors")) paths.push_back(JoinPath(source, n));
      }
    }
    if (paths.empty()) {
      return NotFound("folder " + source + " has no .safetensors file", {{"field", "source"}, {"file", source}});
    }
  } else {
    paths.push_back(source);
  }
  std::vector<SafetensorsSource> out;
  std::map<std::string, std::string> file_of;  // tensor → the file that holds it
  for (const std::string& path : paths) {
    SafetensorsSource s;
    s.path = path;
    ASSIGN_OR_RETURN(s.header, ReadSafetensorsHeader(env, path));
    for (const SafetensorsTensor& t : s.header.tensors) {
      s.bytes += t.bytes;
      auto [it, inserted] = file_of.emplace(t.name, path);
      if (!inserted) {
        return InvalidArgument("tensor '" + t.name + "' is in two files: " + it->second + " and " + path,
                               {{"tensor", t.name}, {"file", path}, {"other_file", it->second}});
      }
    }
    out.push_back(std::move(s));
  }
  // What the index maps must be where it says.
  for (const auto& [name, tensors] : indexed) {
    for (const std::string& t : tensors) {
      auto it = file_of.find(t);
      const std::string path = JoinPath(source, name);
      if (it == file_of.end() || it->second != path) {
        return DataLoss("the safetensors index of " + source + " maps tensor '" + t + "' to " + name +
                            (it == file_of.end() ? ", which does not hold it" : ", but it is in " + it->second),
                        {{"tensor", t}, {"file", path}});
      }
    }
  }
  return out;
}

TensorMeta ImportedTensor(const SafetensorsTensor& t) {
  return TensorMeta{t.name, t.dtype, t.shape, Layout::Replicated(t.shape.size())};
}

std::vector<TensorMeta> ImportedTensors(const std::vector<SafetensorsSource>& files) {
  std::vector<TensorMeta> out;
  for (const auto& f : files) {
    for (const auto& t : f.header.tensors) out.push_back(ImportedTensor(t));
  }
  return out;
}

Result<RankWriteResult> WriteImportRank(Env* env, const std::vector<std::string>& files,
                                        const std::vector<TensorMeta>& expected, const std::string& staging,
                                        int64_t rank, const ShardOptions& options) {
  std::vector<std::unique_ptr<MappedFile>> maps;
  std::vector<SliceToWrite> slices;
  std::map<std::string, const TensorMeta*> planned;
  for (const TensorMeta& m : expected) planned[m.name] = &m;
  size_t found = 0;
  for (const std::string& path : files) {
    ASSIGN_OR_RETURN(auto map, env->MapFile(path));
    const std::string_view bytes(map->data(), map->size());
    ASSIGN_OR_RETURN(uint64_t n, ParseSafetensorsPrefix(bytes.substr(0, 8), map->size(), path));
    ASSIGN_OR_RETURN(SafetensorsHeader h, ParseSafetensorsHeader(bytes.substr(8, n), map->size(), path));
    for (const SafetensorsTensor& t : h.tensors) {
      const TensorMeta meta = ImportedTensor(t);
      if (!expected.empty()) {
        auto it = planned.find(t.name);
        if (it == planned.end() || !(*it->second == meta)) {
          return DataLoss("safetensors file " + path + " changed since the import was planned: tensor '" +
                              t.name + "' is " + meta.ToString() +
                              (it == planned.end() ? std::string(", not planned") : ", planned " + it->second->ToString()),
                          {{"file", path}, {"tensor", t.name}});
        }
        ++found;
      }
      slices.push_back({meta, FullSlice(meta.shape), map->data() + t.offset, static_cast<size_t>(t.bytes)});
    }
    maps.push_back(std::move(map));
  }
  if (!expected.empty() && found != expected.size()) {
    return DataLoss("the safetensors files of rank " + std::to_string(rank) + " hold " + std::to_string(found) +
                        " of the " + std::to_string(expected.size()) + " tensors planned from them: they changed",
                    {{"file", files.empty() ? std::string() : files[0]}});
  }
  return WriteRank(env, staging, rank, slices, options);
}

Result<ImportSummary> ImportSafetensors(Env* env, const std::string& source, const std::string& root,
                                        const ImportOptions& options) {
  ASSIGN_OR_RETURN(std::vector<SafetensorsSource> files, ReadSafetensorsSource(env, source));
  Mesh mesh;
  mesh.name = options.mesh;
  mesh.axes = {{"replica", 1}};
  ASSIGN_OR_RETURN(auto doc, ReadMeshDoc(env, root, options.mesh));
  if (doc && !doc->deleted()) {
    auto m = MeshFromJson(doc->doc, options.mesh);
    if (m.ok()) mesh = *m;
  }
  std::vector<std::string> paths;
  for (const auto& f : files) paths.push_back(f.path);
  const std::vector<TensorMeta> tensors = ImportedTensors(files);
  SaveTransaction txn(env, root, mesh, options.step, "import");
  RETURN_IF_ERROR(txn.Stage());
  auto written = WriteImportRank(env, paths, tensors, txn.staging(), 0, options.shard);
  Status st = written.status();
  if (st.ok()) st = txn.Merge({FragmentFileName(0)}, options.metadata);
  auto dir = st.ok() ? txn.Commit() : Result<std::string>(st);
  if (!dir.ok()) {
    txn.Abandon();
    return dir.status();
  }
  ImportSummary s;
  s.dir = *dir;
  s.files = files.size();
  s.tensors = tensors.size();
  s.bytes = written->raw_bytes;
  s.stored_bytes = written->stored_bytes;
  return s;
}

}  // namespace tessera::storage
