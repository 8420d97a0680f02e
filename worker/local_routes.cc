#include "worker/local_routes.h"

#include "worker/collective_api.h"
#include "worker/local_api.h"
#include "worker/trainer_api.h"

namespace tessera::worker {

void AddLocalRoutes(http::Router* router, TensorStore* store, Agent* agent,
                    MeshCollectives* collectives) {
  AddTensorRoutes(router, store);
  agent->AddRoutes(router);
  AddTrainerRoutes(router, agent);
  AddCollectiveRoutes(router, agent->Resolver(), collectives);
}

}  // namespace tessera::worker
