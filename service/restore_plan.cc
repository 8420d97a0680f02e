#include "service/restore_plan.h"

#include <map>
#include <set>

namespace tessera::service {

Layout AdaptLayout(const Layout& saved, const Shape& shape, const Mesh& mesh) {
  Layout out = saved;
  std::set<std::string> used;
  for (size_t i = 0; i < out.dims.size(); ++i) {
    const std::string& ax = out.dims[i];
    if (ax == kUnsharded) continue;
    int idx = mesh.AxisIndex(ax);
    if (idx < 0 || shape[i] % mesh.axes[idx].size != 0 || !used.insert(ax).second) {
      out.dims[i] = kUnsharded;
    }
  }
  return out;
}

Result<std::vector<TensorMeta>> PlanRestoreTensors(const std::vector<TensorMeta>& saved,
                                                   const RestoreRequest& request,
                                                   const Mesh& target, const std::string& what) {
  std::map<std::string, const TensorMeta*> by_name;
  for (const TensorMeta& m : saved) by_name[m.name] = &m;
  std::vector<RestoreTensor> asked;
  if (request.tensors) {
    asked = *request.tensors;
  } else {
    for (const TensorMeta& m : saved) asked.push_back({m.name, std::nullopt, std::nullopt});
  }
  std::set<std::string> restored;
  std::vector<TensorMeta> out;
  for (const RestoreTensor& t : asked) {
    auto it = by_name.find(t.name);
    if (it == by_name.end()) {
      return InvalidArgument(what + " has no tensor '" + t.name + "'",
                             {{"field", "tensors"}, {"tensor", t.name}});
    }
    TensorMeta m = *it->second;
    if (t.dtype && *t.dtype != m.dtype) {
      return InvalidArgument("tensor '" + t.name + "': " + what + " holds " +
                                 std::string(DTypeName(m.dtype)) + " but " +
                                 std::string(DTypeName(*t.dtype)) + " was asked for",
                             {{"tensor", t.name}, {"field", "dtype"}});
    }
    if (t.shape && *t.shape != m.shape) {
      return InvalidArgument("tensor '" + t.name + "': " + what + " holds shape [" +
                                 ShapeToString(m.shape) + "] but [" + ShapeToString(*t.shape) +
                                 "] was asked for",
                             {{"tensor", t.name}, {"field", "shape"}});
    }
    auto layout = request.layouts.find(t.name);
    if (layout != request.layouts.end()) {
      m.layout = layout->second;
      Status v = ValidateLayout(target, m.layout, m.shape);
      if (!v.ok()) {
        return InvalidArgument("tensor '" + t.name + "': layout " + m.layout.ToString() +
                                   " does not fit mesh " + target.ToString() + ": " + v.message(),
                               {{"tensor", t.name}, {"field", "layouts." + t.name}});
      }
    } else {
      m.layout = AdaptLayout(m.layout, m.shape, target);
    }
    restored.insert(t.name);
    out.push_back(std::move(m));
  }
  for (const auto& [name, layout] : request.layouts) {
    if (restored.count(name)) continue;
    return InvalidArgument(
        "layouts names tensor '" + name + "', which " +
            (by_name.count(name) ? std::string("this restore does not include")
                                 : what + " does not hold"),
        {{"tensor", name}, {"field", "layouts." + name}});
  }
  return out;
}

}  // namespace tessera::service
