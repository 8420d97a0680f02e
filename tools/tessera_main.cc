// tessera: command-line entry point (inspect, verify, demo).
#include <CLI/CLI.hpp>

#include "tools/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"tessera: sharded checkpoints for multi-host training"};
  app.set_version_flag("--version", TESSERA_VERSION);
  app.require_subcommand(1);

  std::string dir;
  bool json = false;
  int threads = 2;
  auto* inspect = app.add_subcommand("inspect", "Show the tensors, slices and sizes of a checkpoint");
  inspect->add_option("checkpoint", dir, "Checkpoint directory (…/step-N)")->required();
  inspect->add_flag("--json", json, "Print JSON instead of a table");

  auto* verify = app.add_subcommand("verify", "Check every chunk's checksum");
  verify->add_option("checkpoint", dir, "Checkpoint directory (…/step-N)")->required();
  verify->add_flag("--json", json, "Print JSON instead of text");
  verify->add_option("--threads", threads, "Decode threads")->check(CLI::Range(1, 64));

  bool keep = false;
  std::string demo_dir;
  auto* demo = app.add_subcommand("demo", "Save, inspect, verify and restore a sample checkpoint");
  demo->add_option("--dir", demo_dir, "Checkpoint root (default: a new temp dir)");
  demo->add_flag("--keep", keep, "Keep the checkpoint root afterwards");

  CLI11_PARSE(app, argc, argv);
  if (*inspect) return tessera::tools::RunInspect(dir, json);
  if (*verify) return tessera::tools::RunVerify(dir, json, threads);
  if (*demo) return tessera::tools::RunDemo(demo_dir, keep);
  return 1;
}
