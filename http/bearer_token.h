// Where a program's bearer token (the cluster's shared secret) comes from. Most
// private first: a file only its owner can read (--token-file), the environment
// (TESSERA_TOKEN, readable in /proc by its user alone), or --token on the command
// line, which every local user can read in /proc/<pid>/cmdline: accepted, with a
// warning on stderr. No program prints a token.
#pragma once

#include <string>

#include "api/status.h"

namespace tessera::http {

struct ChosenToken {
  std::string token;   // "" when none was given
  std::string source;  // "--token-file <path>", "TESSERA_TOKEN", "--token"; "" when none
};

// `flag` and `file` are the values of --token and --token-file ("" when unset);
// giving both is refused. Either wins over TESSERA_TOKEN. `program` names the
// caller in the warning.
Result<ChosenToken> ChooseToken(const std::string& flag, const std::string& file,
                                const std::string& program);

// ok when `path` is a regular file that nobody but its owner may read or
// write; else invalid_argument naming it (`what`, e.g. "the TLS key") and
// `field` (the flag that named it), with its mode and "chmod 600 it".
Status CheckOwnerOnly(const std::string& path, const std::string& what, const std::string& field);

// The first line of a token file. Refused, naming the file, when it is missing,
// empty, or readable or writable by anyone but its owner (chmod 600 it).
Result<std::string> ReadTokenFile(const std::string& path);

// Constant-time check of "Authorization: Bearer <token>".
bool BearerMatches(const std::string& header, const std::string& token);

}  // namespace tessera::http
