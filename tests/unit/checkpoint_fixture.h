// Shared by storage tests: the builders of checkpoint_builders.h, and a
// committed checkpoint over them whose failure is reported by GoogleTest.
#pragma once

#include "tests/unit/checkpoint_builders.h"

namespace tessera::testing {

// A committed checkpoint (step 1) of MixedTensors over Mesh22 in an in-memory Env.
// `dir` is empty if the save failed (the failure is reported).
struct MixedCheckpoint {
  storage::MemEnv env;
  Mesh mesh = Mesh22();
  std::vector<SyntheticTensor> tensors = MixedTensors(mesh);
  std::string dir;

  MixedCheckpoint() {
    auto saved = storage::SaveCheckpoint(&env, MakeRequest("root", mesh, 1, tensors));
    EXPECT_TRUE(saved.ok()) << saved.status().ToString();
    if (saved.ok()) dir = saved->dir;
  }
};

}  // namespace tessera::testing
