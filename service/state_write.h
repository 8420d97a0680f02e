// One change of tesserad's state, written to its three stores in one order: the root
// (the truth, docs/format.md "What the root holds"), then the catalog (its cache), then
// memory (the registries). Each store is reached only once the one before it took the
// change, so memory never shows what is not stored, and a restart that rebuilds from
// the root never brings back what the catalog lost.
//
// A failure is counted (tessera_state_write_failures_total{store}), logged and named in
// the error, never swallowed. When the root or the catalog refuses a change, the root is
// put back (`undo_root`: a failed write may have landed, its rename done and the sync of
// its directory not), so that the three stores agree after every failure; where
// the root cannot be put back (a deleted checkpoint's files), memory follows the root,
// the catalog is left stale (/healthz says degraded) and the next start reconciles it.
// A root change is fenced first (Service::Fence, with `what`): a tesserad that no longer
// holds the root writes nothing. Service::WriteState carries one out.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "api/status.h"
#include "service/catalog.h"

namespace tessera::service {

struct StateWrite {
  std::string what;                   // "register mesh m": the errors' and the fence's context
  std::function<Status()> root;       // null: the root does not change
  std::function<Status()> undo_root;  // null: the root's change cannot be undone
  std::vector<CatalogChange> catalog;  // one transaction
  std::function<void()> memory;       // cannot fail; null: nothing in memory changes
};

}  // namespace tessera::service
