#include "worker/restore_match.h"

#include <algorithm>
#include <map>
#include <set>

namespace tessera::worker {
namespace {

// Names shown in a message; the details carry every one.
constexpr size_t kNamesShown = 5;

std::string Shown(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < kNamesShown; ++i) {
    out += (i ? ", " : "") + names[i];
  }
  if (names.size() > kNamesShown) out += ", ... (" + std::to_string(names.size()) + " in all)";
  return out;
}

// `name` without DDP's "module." at the start of its last '/'-separated part
// ("model/module.fc.weight" → "model/fc.weight"), or "" when it has none.
std::string WithoutModulePrefix(const std::string& name) {
  static const std::string kPrefix = "module.";
  const size_t slash = name.rfind('/');
  const size_t part = slash == std::string::npos ? 0 : slash + 1;
  if (name.compare(part, kPrefix.size(), kPrefix) != 0) return "";
  return name.substr(0, part) + name.substr(part + kPrefix.size());
}

// A hint when the two lists differ only by DDP's prefix.
std::string PrefixHint(const std::vector<std::string>& missing,
                       const std::vector<std::string>& unexpected) {
  const std::set<std::string> absent(missing.begin(), missing.end());
  size_t paired = 0;
  for (const std::string& u : unexpected) paired += absent.count(WithoutModulePrefix(u));
  if (paired == 0) return "";
  return "; " + std::to_string(paired) +
         " of the checkpoint's names differ from attached ones only by DDP's 'module.' prefix: "
         "it was saved under a wrapper's names, which attach_state_dict no longer uses, so "
         "those tensors restore only into tensors attached under the same names";
}

}  // namespace

Result<RestoreMatch> MatchCheckpoint(const RestoreRequest& request,
                                     const std::vector<HeldTensor>& held,
                                     const Json& checkpoint_tensors) {
  std::map<std::string, TensorMeta> saved;
  if (checkpoint_tensors.is_array()) {
    for (const Json& t : checkpoint_tensors) {
      auto meta = TensorMetaFromJson(t);
      if (!meta.ok()) {
        return meta.status().WithContext("tesserad's record of checkpoint " + request.mesh +
                                         " step " + std::to_string(request.step));
      }
      saved.emplace(meta->name, *meta);
    }
  }
  std::map<std::string, const TensorDesc*> have;
  for (const HeldTensor& h : held) have.emplace(h.name, &h.desc);

  // The names matched: those asked for, or every name either side has.
  std::set<std::string> wanted;
  if (request.names) {
    wanted.insert(request.names->begin(), request.names->end());
  } else {
    for (const auto& [name, d] : have) wanted.insert(name);
    for (const auto& [name, m] : saved) wanted.insert(name);
  }

  RestoreMatch out;
  Json mismatched = Json::array();
  for (const std::string& name : wanted) {
    auto s = saved.find(name);
    auto h = have.find(name);
    if (s == saved.end()) {
      out.missing.push_back(name);
      continue;
    }
    if (h == have.end()) {
      if (!request.names) {
        out.unexpected.push_back(name);
        continue;
      }
    } else if (h->second->dtype != s->second.dtype || h->second->shape != s->second.shape) {
      mismatched.push_back({{"tensor", name},
                            {"held", h->second->ToString()},
                            {"checkpoint", s->second.ToString()}});
      continue;
    }
    out.tensors.push_back({{"name", name},
                           {"dtype", std::string(DTypeName(s->second.dtype))},
                           {"shape", ShapeToJson(s->second.shape)}});
    if (h != have.end()) out.layouts[name] = LayoutToJson(h->second->layout);
  }

  const std::string what = "checkpoint " + request.mesh + " step " + std::to_string(request.step);
  Json details = {{"mesh", request.mesh},
                  {"step", request.step},
                  {"worker", request.worker},
                  {"field", "tensors"},
                  {"missing", out.missing},
                  {"unexpected", out.unexpected},
                  {"mismatched", mismatched}};
  if (!mismatched.empty()) {
    const Json& m = mismatched[0];
    details["tensor"] = m["tensor"];
    return Conflict(what + " holds " + std::to_string(mismatched.size()) +
                        " tensor(s) of another dtype or shape than worker " + request.worker +
                        " holds: '" + m["tensor"].get<std::string>() + "' is " +
                        m["checkpoint"].get<std::string>() + " there and " +
                        m["held"].get<std::string>() + " here (details.mismatched lists them)",
                    std::move(details));
  }
  if (request.strict && (!out.missing.empty() || !out.unexpected.empty())) {
    std::string msg = what + " does not match the tensors of worker " + request.worker + ":";
    if (!out.missing.empty()) {
      msg += " " + std::to_string(out.missing.size()) + " attached but not in the checkpoint (" +
             Shown(out.missing) + ")";
    }
    if (!out.unexpected.empty()) {
      msg += std::string(out.missing.empty() ? "" : ";") + " " +
             std::to_string(out.unexpected.size()) + " in the checkpoint but not attached (" +
             Shown(out.unexpected) + ")";
    }
    msg += PrefixHint(out.missing, out.unexpected);
    msg += "; nothing was restored (strict=false restores the " +
           std::to_string(out.tensors.size()) + " tensor(s) both have)";
    return Conflict(std::move(msg), std::move(details));
  }
  return out;
}

}  // namespace tessera::worker
