// The decoders of client JSON (api/json_codec.h) and the text parsers of
// api/ that client strings reach (dtype, shape, layout, name, base64).
//
// The input is a request body. It goes to ParseJson; a document that parses is
// handed, with each of its members and elements down to a few levels, to every
// decoder. Properties checked:
//  - every failure is invalid_argument naming its field (details.field);
//  - what decodes re-encodes and decodes to the same value, and an integer
//    read is the number sent;
//  - a mesh, shape and layout that validate together give device slices that
//    lie in the tensor and, counted once per distinct slice, tile it;
//  - base64 decodes what it encodes.
#include <cstdint>
#include <string>
#include <string_view>

#include "api/base64.h"
#include "api/dtype.h"
#include "api/json_codec.h"
#include "api/mesh.h"
#include "api/names.h"
#include "api/shape.h"
#include "fuzz/fuzz_check.h"

namespace tessera {
namespace {

using fuzz::IsCleanError;

// The field names the REST handlers read, besides whatever keys the input has.
const char* const kFields[] = {"step",   "name",    "axes",   "size",      "devices_per_worker",
                               "dtype",  "shape",   "layout", "tensors",   "target_mesh",
                               "rank",   "world",   "timeout_ms", "keep_last", "metadata",
                               "offsets", "lengths", "slice",  "workers",   "self_test"};

void CheckError(const Status& st, const std::string& what) {
  FUZZ_CHECK(IsCleanError(st, {Code::kInvalidArgument}), what + ": " + st.ToString() + " " +
                                                             st.details().dump(-1, ' ', false,
                                                                               Json::error_handler_t::replace));
  if (!st.ok()) FUZZ_CHECK(st.details().contains("field"), what + ": " + st.ToString());
}

void CheckStrings(std::string_view s) {
  if (auto d = ParseDType(s); d.ok()) {
    FUZZ_CHECK(DTypeName(*d) == s, "dtype name");
  } else {
    CheckError(d.status(), "ParseDType");
  }
  if (auto shape = ParseShape(s); shape.ok()) {
    FUZZ_CHECK(CheckShapeSize(*shape).ok(), "parsed shape is too large");
    auto again = ParseShape(ShapeToString(*shape));
    FUZZ_CHECK(again.ok() && *again == *shape, "shape round trip: " + ShapeToString(*shape));
  } else {
    CheckError(shape.status(), "ParseShape");
  }
  if (auto layout = ParseLayout(s); layout.ok()) {
    auto again = ParseLayout(layout->ToString());
    FUZZ_CHECK(again.ok() && *again == *layout, "layout round trip: " + layout->ToString());
  } else {
    CheckError(layout.status(), "ParseLayout");
  }
  CheckError(ValidateName(s, "name"), "ValidateName");
  if (auto bytes = Base64Decode(s); bytes.ok()) {
    auto again = Base64Decode(Base64Encode(*bytes));
    FUZZ_CHECK(again.ok() && *again == *bytes, "base64 round trip of decoded bytes");
  } else {
    CheckError(bytes.status(), "Base64Decode");
  }
  auto round = Base64Decode(Base64Encode(s));
  FUZZ_CHECK(round.ok() && *round == s, "base64 round trip");
}

void CheckMesh(const Mesh& mesh) {
  FUZZ_CHECK(mesh.Validate().ok(), "a decoded mesh validates");
  auto again = MeshFromJson(MeshToJson(mesh));
  FUZZ_CHECK(again.ok() && *again == mesh, "mesh round trip: " + mesh.ToString());
  const int64_t n = mesh.num_devices();
  FUZZ_CHECK(n >= 1 && n % mesh.devices_per_worker == 0, "mesh device count");
  (void)mesh.ToString();
  (void)mesh.DeviceCoords(0);
  (void)mesh.DeviceCoords(n - 1);
  (void)mesh.WorkerOfDevice(n - 1);
}

// A tensor as a save or restore request describes it: {mesh, shape, layout, dtype}.
void CheckTensor(const Mesh& mesh, const Shape& shape, const Layout& layout) {
  Status st = ValidateLayout(mesh, layout, shape);
  if (!st.ok()) {
    CheckError(st, "ValidateLayout");
    return;
  }
  auto text = ParseLayout(layout.ToString());
  FUZZ_CHECK(text.ok() && *text == layout, "a valid layout survives its text form");
  const SliceSpec full = FullSlice(shape);
  FUZZ_CHECK(LocalShape(mesh, layout, shape).size() == shape.size(), "local shape rank");
  for (int64_t d : {int64_t{0}, mesh.num_devices() - 1}) {
    SliceSpec s = DeviceSlice(mesh, layout, shape, d);
    FUZZ_CHECK(Contains(full, s), "device slice " + s.ToString() + " outside the tensor");
  }
  if (mesh.num_devices() > 256) return;  // enumerating every device costs too much per input
  int64_t covered = 0;
  for (const auto& r : DistinctSlices(mesh, layout, shape)) {
    FUZZ_CHECK(Contains(full, r.slice), "distinct slice outside the tensor");
    FUZZ_CHECK(!r.devices.empty(), "a slice with no device");
    covered += r.slice.NumElements();
  }
  FUZZ_CHECK(covered == NumElements(shape), "distinct slices do not tile the tensor");
}

void Decode(const Json& j, int depth) {
  if (auto d = DTypeFromJson(j); d.ok()) {
    auto again = DTypeFromJson(DTypeToJson(*d));
    FUZZ_CHECK(again.ok() && *again == *d, "dtype round trip");
  } else {
    CheckError(d.status(), "DTypeFromJson");
  }
  if (auto shape = ShapeFromJson(j); shape.ok()) {
    auto again = ShapeFromJson(ShapeToJson(*shape));
    FUZZ_CHECK(again.ok() && *again == *shape, "shape round trip");
    FUZZ_CHECK(NumElements(*shape) <= kMaxElements, "shape too large");
  } else {
    CheckError(shape.status(), "ShapeFromJson");
  }
  if (auto slice = SliceFromJson(j); slice.ok()) {
    auto again = SliceFromJson(SliceToJson(*slice));
    FUZZ_CHECK(again.ok() && *again == *slice, "slice round trip");
    (void)slice->NumElements();
    (void)slice->ToString();
    FUZZ_CHECK(Contains(*slice, *slice), "a slice contains itself");
    auto self = Intersect(*slice, *slice);
    FUZZ_CHECK(slice->NumElements() == 0 || (self && *self == *slice), "a slice meets itself");
  } else {
    CheckError(slice.status(), "SliceFromJson");
  }
  if (auto layout = LayoutFromJson(j); layout.ok()) {
    auto again = LayoutFromJson(LayoutToJson(*layout));
    FUZZ_CHECK(again.ok() && *again == *layout, "layout round trip");
  } else {
    CheckError(layout.status(), "LayoutFromJson");
  }
  for (bool named : {false, true}) {
    auto mesh = named ? MeshFromJson(j, "fuzz/mesh") : MeshFromJson(j);
    if (mesh.ok()) {
      CheckMesh(*mesh);
    } else {
      CheckError(mesh.status(), "MeshFromJson");
    }
  }
  if (j.is_string()) CheckStrings(j.get_ref<const std::string&>());
  if (!j.is_object()) {
    CheckError(RequireObject(j), "RequireObject");
  } else {
    std::vector<std::string> fields(std::begin(kFields), std::end(kFields));
    for (const auto& [key, value] : j.items()) fields.push_back(key);
    for (const auto& f : fields) {
      auto i = OptionalInt(j, f);
      CheckError(i.status(), "OptionalInt");
      if (i.ok() && i->has_value()) FUZZ_CHECK(Json(**i) == j[f], "OptionalInt changed " + f);
      CheckError(RequiredInt(j, f).status(), "RequiredInt");
      CheckError(OptionalString(j, f).status(), "OptionalString");
      CheckError(RequiredString(j, f).status(), "RequiredString");
      CheckError(OptionalBool(j, f).status(), "OptionalBool");
      CheckError(OptionalNameList(j, f).status(), "OptionalNameList");
    }
    // A tensor spec: {"mesh": {...}, "shape": [...], "layout": [...], "dtype": "..."}.
    if (j.contains("mesh") && j.contains("shape") && j.contains("layout")) {
      auto mesh = MeshFromJson(j["mesh"]);
      auto shape = ShapeFromJson(j["shape"]);
      auto layout = LayoutFromJson(j["layout"]);
      if (mesh.ok() && shape.ok() && layout.ok()) CheckTensor(*mesh, *shape, *layout);
    }
  }
  if (depth >= 3 || !j.is_structured()) return;
  for (const auto& v : j) Decode(v, depth + 1);
}

}  // namespace
}  // namespace tessera

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto j = ParseJson(text);
  if (!j.ok()) {
    CheckError(j.status(), "ParseJson");
    CheckStrings(text);
    return 0;
  }
  // What handlers do with a body besides decoding it: copy, store and print it.
  Json copy = *j;
  FUZZ_CHECK(copy == *j, "a copy of the document differs");
  auto reparsed = ParseJson(copy.dump(-1, ' ', false, Json::error_handler_t::replace));
  FUZZ_CHECK(reparsed.ok(), "a printed document does not parse: " + reparsed.status().ToString());
  Decode(*j, 0);
  return 0;
}
