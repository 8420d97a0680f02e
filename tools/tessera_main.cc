// tessera: command-line entry point (inspect, verify, ls, export, import, demo).
#include <CLI/CLI.hpp>

#include <unistd.h>

#include <cstdio>

#include "tools/commands.h"
#include "tools/local_cluster.h"

int main(int argc, char** argv) {
  CLI::App app{"tessera: sharded checkpoints for multi-host training"};
  app.set_version_flag("--version", TESSERA_VERSION);
  app.require_subcommand(1);

  std::string dir;
  bool json = false;
  int threads = 2;
  auto* inspect = app.add_subcommand("inspect", "Show the tensors, slices and sizes of a checkpoint");
  const char* where = "Checkpoint: a directory …/step-N, or s3://BUCKET/PREFIX/MESH/step-N "
                      "(S3 endpoint from TESSERA_S3_ENDPOINT, credentials from AWS_ACCESS_KEY_ID and "
                      "AWS_SECRET_ACCESS_KEY)";
  inspect->add_option("checkpoint", dir, where)->required();
  inspect->add_flag("--json", json, "Print JSON instead of a table");

  auto* verify = app.add_subcommand("verify", "Check every chunk's checksum");
  verify->add_option("checkpoint", dir, where)->required();
  verify->add_flag("--json", json, "Print JSON instead of text");
  verify->add_option("--threads", threads, "Decode threads")->check(CLI::Range(1, 64));

  std::string root;
  auto* ls = app.add_subcommand("ls", "List a checkpoint root's meshes and committed steps, without tesserad");
  ls->add_option("root", root, "The root: a directory, or s3://BUCKET/PREFIX")->required();
  ls->add_flag("--json", json, "Print JSON instead of a table");

  std::string out_dir;
  uint64_t max_file_bytes = 5'000'000'000;
  auto* exp = app.add_subcommand("export", "Write a committed checkpoint as Hugging Face safetensors files, without tesserad");
  exp->add_option("checkpoint", dir, where)->required();
  exp->add_option("dir", out_dir, "Where the .safetensors files and model.safetensors.index.json go")->required();
  exp->add_option("--max-file-size", max_file_bytes, "Bytes per file at most (a larger tensor gets a file of its own)")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 50))
      ->capture_default_str();
  exp->add_option("--threads", threads, "Decode threads")->check(CLI::Range(1, 64));
  int writers = 2;
  exp->add_option("--writers", writers, "Threads writing one file at once")->check(CLI::Range(1, 64))->capture_default_str();
  uint64_t block_bytes = 64 << 20;
  exp->add_option("--block-size", block_bytes, "Bytes of a tensor in memory at a time (twice: one read while one is written)")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 40))
      ->capture_default_str();

  std::string source, mesh, compression = "zstd";
  int64_t step = 0;
  int level = 1;
  auto* imp = app.add_subcommand("import", "Make a committed checkpoint from safetensors files, without tesserad");
  imp->add_option("source", source, "A .safetensors file, or a folder of them (a Hugging Face model folder, "
                                    "with its model.safetensors.index.json when sharded)")->required();
  imp->add_option("root", root, "Checkpoint root: a directory, or s3://BUCKET/PREFIX")->required();
  imp->add_option("--mesh", mesh, "The checkpoint's mesh: it lands in ROOT/MESH/step-N")->required();
  imp->add_option("--step", step, "The checkpoint's step")->required()->check(CLI::NonNegativeNumber);
  imp->add_option("--compression", compression, "zstd or none")->capture_default_str();
  imp->add_option("--level", level, "zstd level")->check(CLI::Range(1, 19))->capture_default_str();

  bool keep = false;
  std::string demo_dir;
  auto* demo = app.add_subcommand("demo", "Save, inspect, verify and restore a sample checkpoint");
  demo->add_option("--dir", demo_dir, "Checkpoint root (default: a new temp dir)");
  demo->add_flag("--keep", keep, "Keep the checkpoint root afterwards");

  // `tessera serve ...` and `tessera worker ...` run the sibling programs.
  auto* serve = app.add_subcommand("serve", "Run tesserad (arguments are passed on)");
  serve->prefix_command();
  auto* worker = app.add_subcommand("worker", "Run tessera-worker (arguments are passed on)");
  worker->prefix_command();

  CLI11_PARSE(app, argc, argv);
  if (*serve || *worker) {
    std::string program = tessera::tools::SelfDir() + (*serve ? "/tesserad" : "/tessera-worker");
    std::vector<std::string> args = (*serve ? serve : worker)->remaining();
    std::vector<char*> argv_out = {program.data()};
    for (auto& a : args) argv_out.push_back(a.data());
    argv_out.push_back(nullptr);
    execv(program.c_str(), argv_out.data());
    std::perror(program.c_str());
    return 127;
  }
  if (*inspect) return tessera::tools::RunInspect(dir, json);
  if (*verify) return tessera::tools::RunVerify(dir, json, threads);
  if (*exp) return tessera::tools::RunExport(dir, out_dir, max_file_bytes, block_bytes, threads, writers);
  if (*imp) return tessera::tools::RunImport(source, root, mesh, step, compression, level);
  if (*ls) return tessera::tools::RunLs(root, json);
  if (*demo) return tessera::tools::RunDemo(demo_dir, keep);
  return 1;
}
