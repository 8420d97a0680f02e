// JSON codecs for the public types. Decoders take untrusted input: every
// failure is invalid_argument naming the offending field, never an exception.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/dtype.h"
#include "api/mesh.h"
#include "api/shape.h"
#include "api/status.h"

namespace tessera {

using Json = nlohmann::json;

// Arrays and objects nested deeper than this are refused: copying, comparing or
// printing a JSON value recurses once per level, so a deeper document (a 2 MiB
// body holds a million levels) would overflow the stack.
inline constexpr int kMaxJsonDepth = 512;

// Parses text as JSON; a syntax error, or nesting deeper than kMaxJsonDepth, is
// invalid_argument with the position.
Result<Json> ParseJson(std::string_view text, std::string_view what = "request body");
// ParseJson for untrusted requests: an object that repeats a key is also
// invalid_argument, naming the key (details.key), where ParseJson keeps the last.
Result<Json> ParseStrictJson(std::string_view text, std::string_view what = "request body");

// Field readers for objects from untrusted input. `field` names it in errors.
// Absent (or null) optional fields give nullopt; wrong types are errors.
Result<std::optional<int64_t>> OptionalInt(const Json& obj, const std::string& field);
Result<int64_t> RequiredInt(const Json& obj, const std::string& field);
Result<std::optional<std::string>> OptionalString(const Json& obj, const std::string& field);
Result<std::string> RequiredString(const Json& obj, const std::string& field);
Result<std::optional<bool>> OptionalBool(const Json& obj, const std::string& field);
// A list of strings (tensor names, say); anything else is invalid_argument.
Result<std::optional<std::vector<std::string>>> OptionalNameList(const Json& obj,
                                                                 const std::string& field);
// Fails unless `obj` is an object; names `what`.
Status RequireObject(const Json& obj, std::string_view what = "request body");

Json DTypeToJson(DType dtype);
Result<DType> DTypeFromJson(const Json& j, const std::string& field = "dtype");

Json ShapeToJson(const Shape& shape);
Result<Shape> ShapeFromJson(const Json& j, const std::string& field = "shape");

Json SliceToJson(const SliceSpec& slice);
Result<SliceSpec> SliceFromJson(const Json& j, const std::string& field = "slice");

// Layouts are lists of axis names or "unsharded" (null is accepted as "unsharded").
Json LayoutToJson(const Layout& layout);
Result<Layout> LayoutFromJson(const Json& j, const std::string& field = "layout");

// {"name", "axes":[{"name","size"}], "devices_per_worker"}; `name` overrides the
// body's name when given (REST: the name comes from the path). Validates.
Json MeshToJson(const Mesh& mesh);
Result<Mesh> MeshFromJson(const Json& j, std::optional<std::string> name = std::nullopt);

}  // namespace tessera
