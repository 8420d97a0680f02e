// What a standby tesserad answers while another one leads (docs/ha.md): its health
// and metrics, which say it stands by and who leads; the dashboard, as a redirect to
// the leader's; and every /api/ request as 503 unavailable with details
// {"reason": "not_leader", "leader", "standby"} and the header X-Tessera-Leader (when a
// leader is known), so that clients given a list of servers move to the leader.
#pragma once

#include <string>

#include "http/router.h"
#include "service/leadership.h"

namespace tessera::service {

void AddStandbyRoutes(http::Router* router, const Leadership* leadership, const std::string& self_url);

}  // namespace tessera::service
