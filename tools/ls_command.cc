// `tessera ls ROOT`: a checkpoint root's meshes and committed steps with their sizes,
// read from the root alone (docs/format.md, "What the root holds"): no tesserad.
#include <cstdio>
#include <iostream>

#include "storage/checkpoint_dir.h"
#include "storage/root_meta.h"
#include "tools/commands.h"

namespace tessera::tools {

int RunLs(const std::string& root, bool json) {
  storage::Env* env = storage::DefaultEnv();
  if (!env->IsObjectStore(root) && !env->IsDirectory(root)) {
    return Fail(NotFound("no checkpoint root at " + root, {{"file", root}}), json);
  }
  auto meshes = storage::ListMeshDirs(env, root);
  if (!meshes.ok()) return Fail(meshes.status().WithContext("listing " + root), json);
  Json out = {{"root", root}, {"meshes", Json::array()}};
  int errors = 0;
  for (const std::string& mesh : *meshes) {
    auto steps = storage::ListSteps(env, root, mesh);
    if (!steps.ok()) return Fail(steps.status().WithContext("listing mesh " + mesh), json);
    Json m = {{"mesh", mesh}, {"checkpoints", Json::array()}};
    for (int64_t step : *steps) {
      Json c = {{"step", step}};
      auto dir = storage::CommittedDir(env, root, mesh, step);
      auto summary = dir.ok() ? storage::ReadSummary(env, *dir) : Result<Json>(dir.status());
      if (summary.ok()) {
        c["dir"] = *dir;
        c["created_at_ms"] = summary->value("created_at", int64_t{0});
        c["tensors"] = summary->value("tensors", Json::array()).size();
        c["logical_bytes"] = summary->value("logical_bytes", uint64_t{0});
        c["stored_bytes"] = summary->value("stored_bytes", uint64_t{0});
      } else {
        c["error"] = ErrorBody(summary.status())["error"];
        ++errors;
      }
      m["checkpoints"].push_back(std::move(c));
    }
    out["meshes"].push_back(std::move(m));
  }
  if (json) {
    std::cout << out.dump(2) << "\n";
    return errors ? 2 : 0;
  }
  std::printf("%-24s %8s %8s %10s %10s  %s\n", "MESH", "STEP", "TENSORS", "LOGICAL", "STORED", "WHERE");
  for (const Json& m : out["meshes"]) {
    for (const Json& c : m["checkpoints"]) {
      if (c.contains("error")) {
        std::printf("%-24s %8lld  unreadable: %s\n", m["mesh"].get<std::string>().c_str(),
                    static_cast<long long>(c["step"].get<int64_t>()),
                    c["error"].value("message", "").c_str());
        continue;
      }
      std::printf("%-24s %8lld %8zu %10s %10s  %s\n", m["mesh"].get<std::string>().c_str(),
                  static_cast<long long>(c["step"].get<int64_t>()), c["tensors"].get<size_t>(),
                  HumanBytes(c["logical_bytes"].get<double>()).c_str(),
                  HumanBytes(c["stored_bytes"].get<double>()).c_str(), c["dir"].get<std::string>().c_str());
    }
  }
  return errors ? 2 : 0;
}

}  // namespace tessera::tools
