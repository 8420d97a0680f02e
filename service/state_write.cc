// Service::WriteState: the one order of writes (state_write.h).
#include <cstdio>

#include "service/service.h"

namespace tessera::service {

void Service::CountStateWriteFailure(const std::string& store, const Status& st) {
  // A catalog failure is logged by NoteCatalogFailure, which also marks /healthz degraded.
  if (store != "catalog") std::fprintf(stderr, "checkpoint root: %s\n", st.ToString().c_str());
  metrics_.Count("tessera_state_write_failures_total", "store=\"" + store + "\"");
}

Status Service::WriteState(const StateWrite& w) {
  // A failed write may still have landed (its rename done, the directory's sync not), so
  // a refusal by the root or the catalog puts the root back, if it can be put back.
  auto undo = [&](Status st) {
    if (!w.root || !w.undo_root) return st;
    if (Status u = w.undo_root(); !u.ok()) {
      u = u.WithContext("putting the checkpoint root back after failing to " + w.what);
      CountStateWriteFailure("root_undo", u);
      return st.WithDetail("root_undo_error", ErrorBody(u)["error"]);
    }
    return st;
  };
  if (w.root) {
    // The fence's refusal names itself and leaves nothing written, so nothing to undo.
    RETURN_IF_ERROR(Fence(w.what));
    if (Status st = w.root(); !st.ok()) {
      st = st.WithContext("cannot " + w.what + ": the checkpoint root refused it");
      CountStateWriteFailure("root", st);
      return undo(st);
    }
  }
  if (Status st = catalog_->Apply(w.catalog); !st.ok()) {
    st = st.WithContext("cannot " + w.what + ": the catalog refused it");
    NoteCatalogFailure(w.catalog.empty() ? "" : w.catalog.front().table, st);
    CountStateWriteFailure("catalog", st);
    if (w.root && !w.undo_root && w.memory) w.memory();  // the root's change stands
    return undo(st);
  }
  if (w.memory) w.memory();
  return Status::Ok();
}

}  // namespace tessera::service
