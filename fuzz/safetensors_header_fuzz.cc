// The safetensors header reader (storage/safetensors_format.h) over a whole file:
// the input is the file's bytes, read the way an import reads a mapped file.
// Properties checked:
//  - a bad file is data_loss or invalid_argument naming the file, never a crash,
//    a hang or another code;
//  - a header that parses describes tensors inside the file, each of the bytes its
//    dtype and shape need, none overlapping another (their first and last bytes are
//    touched here, so ASan sees a range past the input);
//  - a parsed header written again by the encoder parses to the same tensors.
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz/fuzz_check.h"
#include "storage/safetensors_format.h"

namespace tessera::storage {
namespace {

const std::string kFile = "fuzz.safetensors";

void Check(std::string_view file) {
  auto n = ParseSafetensorsPrefix(file.substr(0, 8), file.size(), kFile);
  if (!n.ok()) {
    FUZZ_CHECK(fuzz::IsCleanError(n.status(), {Code::kDataLoss, Code::kInvalidArgument}), n.status().ToString());
    FUZZ_CHECK(n.status().details().value("file", "") == kFile, n.status().ToString());
    return;
  }
  FUZZ_CHECK(8 + *n <= file.size(), "the header size passed the end");
  auto h = ParseSafetensorsHeader(file.substr(8, *n), file.size(), kFile);
  if (!h.ok()) {
    FUZZ_CHECK(fuzz::IsCleanError(h.status(), {Code::kDataLoss, Code::kInvalidArgument}), h.status().ToString());
    FUZZ_CHECK(h.status().details().value("file", "") == kFile, h.status().ToString());
    return;
  }
  uint64_t end = h->data_start;
  volatile char sink = 0;
  std::vector<SafetensorsEntry> again;
  for (const SafetensorsTensor& t : h->tensors) {
    FUZZ_CHECK(t.offset >= h->data_start && t.offset + t.bytes <= file.size(), t.name);
    uint64_t elements = 1;
    for (int64_t d : t.shape) elements *= static_cast<uint64_t>(d);
    FUZZ_CHECK(elements * DTypeSize(t.dtype) == t.bytes, t.name);
    if (t.bytes > 0) {
      FUZZ_CHECK(t.offset >= end, "tensor " + t.name + " overlaps the one before");
      end = t.offset + t.bytes;
      sink = sink + file[t.offset] + file[t.offset + t.bytes - 1];
    }
    again.push_back({t.name, t.dtype, t.shape, t.bytes});
  }
  (void)sink;
  const std::string encoded = EncodeSafetensorsHeader(again, h->metadata);
  std::string rewritten = encoded;
  rewritten.resize(encoded.size() + (end - h->data_start) + file.size(), '\0');
  auto m = ParseSafetensorsPrefix(std::string_view(rewritten).substr(0, 8), rewritten.size(), kFile);
  FUZZ_CHECK(m.ok(), m.status().ToString());
  auto h2 = ParseSafetensorsHeader(std::string_view(rewritten).substr(8, *m), rewritten.size(), kFile);
  FUZZ_CHECK(h2.ok(), h2.status().ToString());
  FUZZ_CHECK(h2->tensors.size() == h->tensors.size(), "the encoder lost tensors");
}

}  // namespace
}  // namespace tessera::storage

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tessera::storage::Check(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
