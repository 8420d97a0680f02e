#include "storage/safetensors_format.h"

#include <algorithm>
#include <limits>

#include "api/names.h"
#include "api/shape.h"

namespace tessera::storage {
namespace {

Json Where(const std::string& file, const std::string& tensor = "") {
  Json d = {{"file", file}};
  if (!tensor.empty()) d["tensor"] = tensor;
  return d;
}

Status Corrupt(const std::string& file, const std::string& tensor, const std::string& what) {
  return DataLoss("safetensors file " + file + (tensor.empty() ? "" : ", tensor '" + tensor + "'") +
                      ": " + what,
                  Where(file, tensor));
}

// The safetensors dtypes Tessera has no dtype for: named as such rather than unknown.
constexpr std::string_view kForeign[] = {"U16", "U32", "U64", "F8_E4M3", "F8_E5M2", "F8_E8M0",
                                         "F4", "F6_E2M3", "F6_E3M2", "C64"};

// One entry of the header, checked: its dtype, shape and byte range.
Result<SafetensorsTensor> Entry(const std::string& name, const Json& e, uint64_t data_start,
                                uint64_t file_size, const std::string& file) {
  if (!e.is_object()) return Corrupt(file, name, "the entry is not an object");
  const auto dtype = e.find("dtype");
  const auto shape = e.find("shape");
  const auto offsets = e.find("data_offsets");
  if (dtype == e.end() || !dtype->is_string()) return Corrupt(file, name, "no \"dtype\" string");
  if (shape == e.end() || !shape->is_array()) return Corrupt(file, name, "no \"shape\" array");
  if (offsets == e.end() || !offsets->is_array() || offsets->size() != 2 ||
      !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned()) {
    return Corrupt(file, name, "\"data_offsets\" is not [begin, end]");
  }
  SafetensorsTensor t;
  t.name = name;
  ASSIGN_OR_RETURN(t.dtype, DTypeOfSafetensors(dtype->get<std::string>(), file, name));
  if (shape->size() > kMaxRank) {
    return InvalidArgument("safetensors file " + file + ", tensor '" + name + "': " + std::to_string(shape->size()) +
                               " dimensions, more than Tessera's " + std::to_string(kMaxRank),
                           Where(file, name));
  }
  // The element count, refusing what overflows: no file holds 2^63 bytes.
  uint64_t elements = 1;
  bool overflow = false;
  for (const Json& d : *shape) {
    if (!d.is_number_unsigned()) return Corrupt(file, name, "shape " + shape->dump() + " is not of non-negative integers");
    const uint64_t n = d.get<uint64_t>();
    if (n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) overflow = true;
    t.shape.push_back(static_cast<int64_t>(std::min<uint64_t>(n, std::numeric_limits<int64_t>::max())));
    if (n != 0 && elements > (std::numeric_limits<uint64_t>::max() >> 4) / n) overflow = true;
    elements *= n;
  }
  const uint64_t begin = (*offsets)[0].get<uint64_t>();
  const uint64_t end = (*offsets)[1].get<uint64_t>();
  if (end < begin) return Corrupt(file, name, "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "] end before they begin");
  const uint64_t data_size = file_size - data_start;
  if (end > data_size) {
    return Corrupt(file, name, "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                                   "] run out of the file (" + std::to_string(data_size) +
                                   " bytes after the header)");
  }
  const uint64_t expected = elements * DTypeSize(t.dtype);
  if (overflow || end - begin != expected) {
    return Corrupt(file, name, "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                                   "] hold " + std::to_string(end - begin) + " bytes, where " +
                                   dtype->get<std::string>() + " " + shape->dump() + " needs " +
                                   (overflow ? std::string("more than a file can hold") : std::to_string(expected)));
  }
  t.offset = data_start + begin;
  t.bytes = end - begin;
  return t;
}

}  // namespace

std::string SafetensorsDType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "F32";
    case DType::kFloat64: return "F64";
    case DType::kFloat16: return "F16";
    case DType::kBFloat16: return "BF16";
    case DType::kInt8: return "I8";
    case DType::kInt16: return "I16";
    case DType::kInt32: return "I32";
    case DType::kInt64: return "I64";
    case DType::kUInt8: return "U8";
    case DType::kBool: return "BOOL";
  }
  return "";
}

Result<DType> DTypeOfSafetensors(std::string_view name, const std::string& file, const std::string& tensor) {
  for (DType d : AllDTypes()) {
    if (SafetensorsDType(d) == name) return d;
  }
  const bool foreign = std::find(std::begin(kForeign), std::end(kForeign), name) != std::end(kForeign);
  Json details = Where(file, tensor);
  details["dtype"] = std::string(name.substr(0, 64));
  return InvalidArgument("safetensors file " + file + ", tensor '" + tensor + "': dtype " +
                             std::string(name.substr(0, 64)) +
                             (foreign ? " has no Tessera dtype" : " is not a safetensors dtype") +
                             " (Tessera takes BOOL, U8, I8, I16, I32, I64, F16, BF16, F32, F64)",
                         std::move(details));
}

std::string EncodeSafetensorsHeader(const std::vector<SafetensorsEntry>& tensors, const Json& metadata) {
  Json h = Json::object();
  uint64_t offset = 0;
  for (const SafetensorsEntry& t : tensors) {
    h[t.name] = {{"dtype", SafetensorsDType(t.dtype)},
                 {"shape", t.shape},
                 {"data_offsets", {offset, offset + t.bytes}}};
    offset += t.bytes;
  }
  if (!metadata.is_null() && !metadata.empty()) h["__metadata__"] = metadata;
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(static_cast<uint64_t>(text.size()) >> (8 * i));
  return out + text;
}

Result<uint64_t> ParseSafetensorsPrefix(std::string_view first8, uint64_t file_size, const std::string& file) {
  if (first8.size() < 8 || file_size < 8) {
    return Corrupt(file, "", "the file has " + std::to_string(file_size) + " bytes, fewer than the 8 of its header size");
  }
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<uint8_t>(first8[i])) << (8 * i);
  if (n > kMaxSafetensorsHeader) {
    return InvalidArgument("safetensors file " + file + ": a header of " + std::to_string(n) +
                               " bytes is over the limit of " + std::to_string(kMaxSafetensorsHeader),
                           Where(file));
  }
  if (n > file_size - 8) {
    return Corrupt(file, "", "its header size " + std::to_string(n) + " runs past the end of the file (" +
                                 std::to_string(file_size) + " bytes)");
  }
  if (n < 2) return Corrupt(file, "", "an empty header");
  return n;
}

Result<SafetensorsHeader> ParseSafetensorsHeader(std::string_view json, uint64_t file_size, const std::string& file) {
  auto parsed = ParseStrictJson(json, "safetensors header of " + file);
  if (!parsed.ok()) return Corrupt(file, "", "the header is not valid JSON: " + parsed.status().message());
  if (!parsed->is_object()) return Corrupt(file, "", "the header is not a JSON object");
  SafetensorsHeader h;
  h.data_start = 8 + json.size();
  if (h.data_start > file_size) return Corrupt(file, "", "the header runs past the end of the file");
  for (const auto& [name, e] : parsed->items()) {
    if (name == "__metadata__") {
      if (!e.is_object()) return Corrupt(file, "", "__metadata__ is not an object");
      for (const auto& [k, v] : e.items()) {
        if (!v.is_string()) return Corrupt(file, "", "__metadata__ value of '" + k + "' is not a string");
      }
      h.metadata = e;
      continue;
    }
    if (Status valid = ValidateName(name, "tensor"); !valid.ok()) {
      return InvalidArgument("safetensors file " + file + ": tensor name '" + name.substr(0, 200) +
                                 "' cannot be a Tessera name: " + valid.message(),
                             Where(file, name.substr(0, 200)));
    }
    ASSIGN_OR_RETURN(SafetensorsTensor t, Entry(name, e, h.data_start, file_size, file));
    h.tensors.push_back(std::move(t));
  }
  std::sort(h.tensors.begin(), h.tensors.end(), [](const auto& a, const auto& b) {
    return a.offset != b.offset ? a.offset < b.offset : a.bytes < b.bytes;
  });
  // The tensor reaching furthest so far: a later one starting before its end overlaps it.
  const SafetensorsTensor* reach = nullptr;
  for (const SafetensorsTensor& t : h.tensors) {
    if (t.bytes == 0) continue;
    if (reach != nullptr && reach->offset + reach->bytes > t.offset) {
      return Corrupt(file, t.name, "its bytes overlap those of tensor '" + reach->name + "'")
          .WithDetail("other_tensor", reach->name);
    }
    if (reach == nullptr || t.offset + t.bytes > reach->offset + reach->bytes) reach = &t;
  }
  return h;
}

Result<SafetensorsHeader> ReadSafetensorsHeader(Env* env, const std::string& path) {
  ASSIGN_OR_RETURN(auto f, env->NewRandomAccessFile(path));
  const uint64_t size = f->Size();
  std::string first8(8, '\0');
  if (size < 8) return ParseSafetensorsPrefix("", size, path).status();
  RETURN_IF_ERROR(f->Read(0, 8, first8.data()));
  ASSIGN_OR_RETURN(uint64_t n, ParseSafetensorsPrefix(first8, size, path));
  std::string json(n, '\0');
  RETURN_IF_ERROR(f->Read(8, n, json.data()));
  return ParseSafetensorsHeader(json, size, path);
}

}  // namespace tessera::storage
