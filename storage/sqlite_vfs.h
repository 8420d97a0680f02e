// A SQLite VFS over an Env, for databases SQLite manages in place (tesserad's catalog):
// the bytes live where the default VFS keeps them, but every change to a file (create,
// write, truncate, sync, delete) is first put to the Env (Env::BeforeChange), so an
// Env that injects faults (FaultEnv) reaches these databases like every other file.
#pragma once

#include <string>

#include "api/status.h"
#include "storage/env.h"

namespace tessera::storage {

// The name of the VFS for `env`, registered with SQLite on first use (once per Env;
// `env` must outlive every database opened with it). Pass it to sqlite3_open_v2.
Result<std::string> EnvVfsName(Env* env);

}  // namespace tessera::storage
