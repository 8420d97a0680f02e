// Interaction scripts: tests as data, in the shape of etcd's datadriven files. A script
// is a file of blocks, each a command and the output it must give:
//
//   # comments explain the scenario to a reader
//   join rank=1 now=5 error="disk full"
//   ----
//   abandon save: resource_exhausted
//   finish failed: resource_exhausted: ...
//
// A block's output ends at the first blank line (so an output never holds one).
// Values are bare words, or quoted: "..." (with \" and \\) or '...' (taken as is, for
// JSON with spaces). What a command means is the runner's business (job_script.h);
// this file reads the blocks, compares what the runner printed with what the file
// expects, and with TESSERA_REWRITE=1 writes the file again with what it printed.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "api/status.h"

namespace tessera::testing {

// One command of a script: `name key=value ...`. Each argument read is marked used, so
// that the runner can refuse the ones it did not read (a typo in a script).
class ScriptCommand {
 public:
  // Parses one command line; invalid_argument for a malformed argument.
  static Result<ScriptCommand> Parse(const std::string& text);

  const std::string& name() const { return name_; }
  bool Has(const std::string& key) const { return args_.count(key) > 0; }

  // The value of `key`, or nullopt when absent.
  std::optional<std::string> Get(const std::string& key);
  // A required value.
  Result<std::string> String(const std::string& key);
  std::string String(const std::string& key, const std::string& fallback);
  Result<int64_t> Int(const std::string& key);
  Result<int64_t> Int(const std::string& key, int64_t fallback);
  Result<bool> Bool(const std::string& key, bool fallback);
  // "0,2,3"; absent: `fallback`.
  Result<std::vector<int64_t>> Ints(const std::string& key, std::vector<int64_t> fallback);

  // invalid_argument naming the first argument nobody read.
  Status CheckAllUsed() const;

 private:
  Status Bad(const std::string& key, const std::string& what) const;

  std::string name_;
  std::map<std::string, std::string> args_;
  std::set<std::string> used_;
};

// A command's output: lines joined by '\n' (no blank line), or an error in the script
// itself (an unknown command or argument), which stops the script.
using ScriptRunner = std::function<Result<std::string>(ScriptCommand&)>;

// Where a script failed (the line of the block's command; 0 for the file) and how.
struct ScriptFailure {
  std::string file;
  int line = 0;
  std::string message;
};

struct ScriptReport {
  // Each block whose output differs (expected and got shown), or the script's error;
  // empty when the file passed or was rewritten.
  std::vector<ScriptFailure> failures;
  int blocks = 0;
  bool rewritten = false;
};

// Runs every block of the file at `path` through `run`, in order. With `rewrite`, the
// file is written again with the outputs `run` gave, unless the script failed.
ScriptReport RunScript(const std::string& path, const ScriptRunner& run, bool rewrite);

// The scripts of a folder: its *.txt files, sorted by name.
std::vector<std::string> ScriptFiles(const std::string& dir);

// True when the environment asks for the files to be rewritten (TESSERA_REWRITE=1).
bool RewriteRequested();

}  // namespace tessera::testing
