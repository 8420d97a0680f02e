#include "api/json_codec.h"

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace tessera {
namespace {

Status TypeError(const std::string& field, const char* expected) {
  return InvalidArgument("field '" + field + "' must be " + expected, {{"field", field}});
}

// The offset of the first '[' or '{' nested deeper than kMaxJsonDepth, or npos.
// Exact for valid JSON, which is all that matters: anything else fails to parse.
size_t TooDeepAt(std::string_view text) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) return i;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return std::string_view::npos;
}

}  // namespace

namespace {

// Parses `text`; with `seen` (a stack of the keys of the objects open), each key
// is checked against its object's, and the first repeated one is kept in *dup.
Result<Json> Parse(std::string_view text, std::string_view what,
                   std::vector<std::set<std::string>>* seen, std::optional<std::string>* dup) {
  if (size_t at = TooDeepAt(text); at != std::string_view::npos) {
    return InvalidArgument(std::string(what) + " nests arrays and objects deeper than " +
                               std::to_string(kMaxJsonDepth) + " levels at byte " +
                               std::to_string(at),
                           {{"field", what}});
  }
  Json::parser_callback_t check = nullptr;
  if (seen != nullptr) {
    check = [seen, dup](int, Json::parse_event_t event, Json& parsed) {
      if (event == Json::parse_event_t::object_start) {
        seen->emplace_back();
      } else if (event == Json::parse_event_t::object_end) {
        seen->pop_back();
      } else if (event == Json::parse_event_t::key && !*dup &&
                 !seen->back().insert(parsed.get<std::string>()).second) {
        *dup = parsed.get<std::string>();
      }
      return true;
    };
  }
  try {
    return Json::parse(text, check);
  } catch (const Json::exception& e) {
    std::string where;
    if (const auto* pe = dynamic_cast<const Json::parse_error*>(&e)) {
      where = " at byte " + std::to_string(pe->byte);
    }
    return InvalidArgument("malformed JSON in " + std::string(what) + where, {{"field", what}});
  }
}

}  // namespace

Result<Json> ParseJson(std::string_view text, std::string_view what) {
  return Parse(text, what, nullptr, nullptr);
}

Result<Json> ParseStrictJson(std::string_view text, std::string_view what) {
  std::vector<std::set<std::string>> seen;
  std::optional<std::string> dup;
  ASSIGN_OR_RETURN(Json j, Parse(text, what, &seen, &dup));
  if (dup) {
    return InvalidArgument(std::string(what) + " repeats the key '" + *dup +
                               "' in one object; each key may appear once",
                           {{"field", what}, {"key", *dup}});
  }
  return j;
}

Status RequireObject(const Json& obj, std::string_view what) {
  if (!obj.is_object()) {
    return InvalidArgument(std::string(what) + " must be a JSON object", {{"field", what}});
  }
  return Status::Ok();
}

Result<std::optional<int64_t>> OptionalInt(const Json& obj, const std::string& field) {
  auto it = obj.find(field);
  if (it == obj.end() || it->is_null()) return std::optional<int64_t>();
  if (!it->is_number_integer()) return TypeError(field, "an integer");
  if (it->is_number_unsigned() && it->get<uint64_t>() > uint64_t{INT64_MAX}) {
    return TypeError(field, "an integer below 2^63");
  }
  return std::optional<int64_t>(it->get<int64_t>());
}

Result<int64_t> RequiredInt(const Json& obj, const std::string& field) {
  ASSIGN_OR_RETURN(auto v, OptionalInt(obj, field));
  if (!v) return InvalidArgument("missing field '" + field + "'", {{"field", field}});
  return *v;
}

Result<std::optional<std::string>> OptionalString(const Json& obj, const std::string& field) {
  auto it = obj.find(field);
  if (it == obj.end() || it->is_null()) return std::optional<std::string>();
  if (!it->is_string()) return TypeError(field, "a string");
  return std::optional<std::string>(it->get<std::string>());
}

Result<std::optional<std::vector<std::string>>> OptionalNameList(const Json& obj,
                                                                 const std::string& field) {
  auto it = obj.find(field);
  if (it == obj.end() || it->is_null()) return std::optional<std::vector<std::string>>();
  auto bad = [&] {
    return InvalidArgument("field '" + field + "' must be a list of names", {{"field", field}});
  };
  if (!it->is_array()) return bad();
  std::vector<std::string> names;
  for (const auto& n : *it) {
    if (!n.is_string()) return bad();
    names.push_back(n.get<std::string>());
  }
  return std::optional<std::vector<std::string>>(std::move(names));
}

Result<std::string> RequiredString(const Json& obj, const std::string& field) {
  ASSIGN_OR_RETURN(auto v, OptionalString(obj, field));
  if (!v) return InvalidArgument("missing field '" + field + "'", {{"field", field}});
  return *v;
}

Result<std::optional<bool>> OptionalBool(const Json& obj, const std::string& field) {
  auto it = obj.find(field);
  if (it == obj.end() || it->is_null()) return std::optional<bool>();
  if (!it->is_boolean()) return TypeError(field, "true or false");
  return std::optional<bool>(it->get<bool>());
}

Json DTypeToJson(DType dtype) { return std::string(DTypeName(dtype)); }

Result<DType> DTypeFromJson(const Json& j, const std::string& field) {
  if (!j.is_string()) return TypeError(field, "a dtype string such as \"float32\"");
  return ParseDType(j.get<std::string>(), field);
}

Json ShapeToJson(const Shape& shape) { return Json(shape); }

Result<Shape> ShapeFromJson(const Json& j, const std::string& field) {
  if (!j.is_array()) return TypeError(field, "a list of non-negative integers");
  Shape shape;
  for (const auto& d : j) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0) {
      return TypeError(field, "a list of non-negative integers");
    }
    shape.push_back(d.get<int64_t>());
  }
  RETURN_IF_ERROR(CheckShapeSize(shape, field));
  return shape;
}

Json SliceToJson(const SliceSpec& slice) {
  return {{"offsets", slice.offsets}, {"lengths", slice.lengths}};
}

Result<SliceSpec> SliceFromJson(const Json& j, const std::string& field) {
  if (!j.is_object()) return TypeError(field, "an object with offsets and lengths");
  SliceSpec s;
  ASSIGN_OR_RETURN(s.offsets, ShapeFromJson(j.value("offsets", Json()), field + ".offsets"));
  ASSIGN_OR_RETURN(s.lengths, ShapeFromJson(j.value("lengths", Json()), field + ".lengths"));
  if (s.offsets.size() != s.lengths.size()) {
    return InvalidArgument("field '" + field + "': offsets and lengths differ in rank",
                           {{"field", field}});
  }
  return s;
}

Json LayoutToJson(const Layout& layout) { return Json(layout.dims); }

Result<Layout> LayoutFromJson(const Json& j, const std::string& field) {
  if (!j.is_array()) return TypeError(field, "a list of mesh axis names or \"unsharded\"");
  Layout layout;
  for (const auto& d : j) {
    if (d.is_null()) {
      layout.dims.push_back(kUnsharded);
    } else if (d.is_string() && !d.get<std::string>().empty()) {
      layout.dims.push_back(d.get<std::string>());
    } else {
      return TypeError(field, "a list of mesh axis names or \"unsharded\"");
    }
  }
  return layout;
}

Json MeshToJson(const Mesh& mesh) {
  Json axes = Json::array();
  for (const auto& a : mesh.axes) axes.push_back({{"name", a.name}, {"size", a.size}});
  return {{"name", mesh.name}, {"axes", axes}, {"devices_per_worker", mesh.devices_per_worker}};
}

Result<Mesh> MeshFromJson(const Json& j, std::optional<std::string> name) {
  RETURN_IF_ERROR(RequireObject(j, "mesh"));
  Mesh mesh;
  if (name) {
    mesh.name = *name;
  } else {
    ASSIGN_OR_RETURN(mesh.name, RequiredString(j, "name"));
  }
  auto axes = j.find("axes");
  if (axes == j.end() || !axes->is_array()) {
    return InvalidArgument("field 'axes' must be a list of {name, size}", {{"field", "axes"}});
  }
  for (size_t i = 0; i < axes->size(); ++i) {
    const Json& a = (*axes)[i];
    const std::string field = "axes[" + std::to_string(i) + "]";
    if (!a.is_object()) return TypeError(field, "an object {name, size}");
    MeshAxis axis;
    ASSIGN_OR_RETURN(auto axis_name, RequiredString(a, "name"));
    ASSIGN_OR_RETURN(auto size, RequiredInt(a, "size"));
    axis.name = axis_name;
    axis.size = size;
    mesh.axes.push_back(axis);
  }
  ASSIGN_OR_RETURN(auto dpw, OptionalInt(j, "devices_per_worker"));
  mesh.devices_per_worker = dpw.value_or(1);
  RETURN_IF_ERROR(mesh.Validate());
  return mesh;
}

}  // namespace tessera
