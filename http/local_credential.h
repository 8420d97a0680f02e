// The credential of a worker's local API: a random token the worker writes to
// a file only its user can read (0600, in a 0700 directory), and that the
// trainer's client reads and sends as a bearer token. Another local user can
// reach the loopback port but cannot read the file, so cannot use the API.
#pragma once

#include <string>

#include "api/status.h"

namespace tessera::http {

// /tmp/tessera-<uid>/local-<port>.key: where a worker whose local API listens
// on `port` writes its credential unless told otherwise, and where clients on
// the same host look for it.
std::string DefaultLocalCredentialPath(int port);

// A fresh random credential (64 hex digits).
Result<std::string> NewLocalCredential();

// Writes `credential` to `path` with mode 0600 (atomically: a temp file renamed).
// The directory is created 0700 if missing; an existing one must belong to this
// user and not be writable by others, or the write is refused naming it.
Status WriteLocalCredential(const std::string& path, const std::string& credential);

// Reads a credential file; not_found / permission errors name the path.
Result<std::string> ReadLocalCredential(const std::string& path);

// The local API URL's credential for a client on this host: $TESSERA_LOCAL_CREDENTIAL
// (a file) if set, else the default path of the URL's port. "" when there is none.
std::string FindLocalCredential(const std::string& url);

}  // namespace tessera::http
