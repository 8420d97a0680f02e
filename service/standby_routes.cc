#include "service/standby_routes.h"

namespace tessera::service {
namespace {

using http::Request;
using http::Response;

std::string LeaderUrl(const Leadership* l) {
  const Json leader = l->leader();
  return leader.is_object() ? leader.value("url", "") : "";
}

Response NotLeader(const Leadership* l, const std::string& self) {
  const std::string leader = LeaderUrl(l);
  const std::string who = leader.empty() ? "no leader is known yet (a takeover may be under way)"
                                         : "the leader is " + leader;
  Response r = Response::Error(Unavailable(
      "this tesserad (" + self + ") is a standby and changes nothing; " + who,
      {{"reason", "not_leader"}, {"leader", leader.empty() ? Json() : Json(leader)}, {"standby", self}}));
  if (!leader.empty()) r.headers.emplace_back("X-Tessera-Leader", leader);
  return r;
}

// The dashboard is the leader's: a browser that opens a standby goes there.
Response ToLeader(const Leadership* l, const std::string& self, const std::string& path) {
  const std::string leader = LeaderUrl(l);
  if (leader.empty()) {
    Response r;
    r.status = 503;
    r.content_type = "text/html; charset=utf-8";
    r.body = "<!doctype html><meta http-equiv=\"refresh\" content=\"2\"><title>Tessera standby</title>"
             "<p>This tesserad (" + self + ") is a standby, and no leader is known yet. This page "
             "reloads until one is.";
    return r;
  }
  Response r;
  r.status = 307;
  r.content_type = "text/plain; charset=utf-8";
  r.body = "the leader is " + leader + "\n";
  r.headers.emplace_back("Location", leader + path);
  r.headers.emplace_back("X-Tessera-Leader", leader);
  return r;
}

}  // namespace

void AddStandbyRoutes(http::Router* router, const Leadership* l, const std::string& self) {
  router->Add({"GET", "/healthz", [l, self](const Request&) {
                 const Json leader = l->leader();
                 Json body = {{"status", "ok"}, {"version", TESSERA_VERSION}, {"role", "standby"},
                              {"self", self}, {"ha", l->options().ha},
                              {"leader", leader.is_object() ? leader.value("url", Json()) : Json()},
                              {"leader_since_ms", leader.is_object() ? leader.value("since_ms", Json()) : Json()}};
                 return Response::Json(200, body);
               },
               "liveness; a standby says so and names the leader", /*auth=*/false});
  router->Add({"GET", "/metrics", [](const Request&) {
                 Response r;
                 r.content_type = "text/plain; version=0.0.4";
                 r.body = "# HELP tessera_leader 1 while this tesserad leads, 0 while it stands by\n"
                          "# TYPE tessera_leader gauge\ntessera_leader 0\n";
                 return r;
               },
               "Prometheus metrics of a standby", /*auth=*/false});
  router->Add({"GET", "/", [l, self](const Request&) { return ToLeader(l, self, "/"); },
               "the leader's dashboard", /*auth=*/false});
  router->Add({"GET", "/assets/{file+}",
               [l, self](const Request& req) { return ToLeader(l, self, req.path); },
               "the leader's dashboard", /*auth=*/false});
  // The event stream takes its token in the query (browsers' EventSource): a standby's
  // answers it too, rather than a 401.
  http::Route events{"GET", "/api/v1/events", [l, self](const Request&) { return NotLeader(l, self); },
                     "a standby: the leader's event stream"};
  events.query_token = true;
  router->Add(std::move(events));
  for (const char* method : {"GET", "POST", "PUT", "DELETE", "PATCH"}) {
    router->Add({method, "/api/{path+}", [l, self](const Request&) { return NotLeader(l, self); },
                 "a standby: every request goes to the leader"});
  }
}

}  // namespace tessera::service
