// The REST surface of docs/openapi.json, as one route table over Service.
#include <fstream>
#include <sstream>

#include "api/names.h"
#include "service/openapi.h"
#include "service/service.h"

namespace tessera::service {
namespace {

using http::Reply;
using http::ReplyStatus;
using http::Request;
using http::Response;

// Runs `fn(body)` after parsing the JSON body.
template <typename F>
Response WithBody(const Request& req, F fn) {
  auto body = http::JsonBody(req);
  if (!body.ok()) return Response::Error(body.status());
  return fn(*body);
}

Status CheckName(const Request& req, const std::string& param, const std::string& field) {
  return ValidateName(req.Param(param), field);
}

// A save's create-or-join lists every tensor of the worker's snapshot, and a memory tier's
// report every tensor of its checkpoint: more than the 2 MiB of other JSON bodies for a
// model of many tensors.
constexpr uint64_t kMaxTensorListBody = 32ull << 20;

// A task long-poll's query: how long to wait, and what the worker has (ack, meshes, queue);
// its bases in the query (GET) or, unbounded by a header's size, in a POST's body.
Result<PollRequest> PollRequestOf(const Request& req, const Json* body) {
  PollRequest poll;
  ASSIGN_OR_RETURN(poll.wait_ms, http::QueryInt(req, "wait_ms", 0));
  for (const char* key : {"ack", "meshes"}) {
    if (!req.Query(key)) continue;
    ASSIGN_OR_RETURN(int64_t v, http::QueryInt(req, key, 0));
    if (v < 0) return InvalidArgument(std::string(key) + " must be >= 0", {{"field", key}});
    (std::string_view(key) == "ack" ? poll.ack : poll.meshes.emplace()) = static_cast<uint64_t>(v);
  }
  poll.queue = req.Query("queue").value_or("");
  if (auto bases = req.Query("bases")) {
    ASSIGN_OR_RETURN(Json j, ParseStrictJson(*bases, "bases"));
    ASSIGN_OR_RETURN(poll.bases, BaseReportFromJson(j));
  }
  if (body != nullptr && body->contains("bases")) {
    if (poll.bases) return InvalidArgument("bases twice: in the query and the body", {{"field", "bases"}});
    ASSIGN_OR_RETURN(poll.bases, BaseReportFromJson(body->at("bases")));
  }
  return poll;
}

}  // namespace

void Service::AddRoutes(http::Router* router) {
  auto add = [router](std::string method, std::string pattern, http::Handler h, std::string help,
                      bool auth = true, uint64_t body_limit = 0) {
    // A name in the path obeys the name rules before any handler sees it; errors name its kind.
    static const std::pair<const char*, const char*> kNamed[] = {
        {"m", "mesh"}, {"name", "mesh"}, {"barrier", "barrier"}, {"key", "key"}};
    for (const auto& [param, field] : kNamed) {
      if (pattern.find("{" + std::string(param) + "+}") == std::string::npos) continue;
      h = [h = std::move(h), param = param, field = field](const Request& req) {
        Status st = CheckName(req, param, field);
        return st.ok() ? h(req) : Response::Error(st);
      };
      break;
    }
    std::function<uint64_t(const Request&)> limit;
    if (body_limit) limit = [body_limit](const Request&) { return body_limit; };
    router->Add({std::move(method), std::move(pattern), std::move(h), std::move(help), auth,
                 std::move(limit)});
  };
  add("GET", "/healthz", [this](const Request&) {
    Json health = Health();
    health["version"] = TESSERA_VERSION;
    return Response::Json(health["status"] == "ok" ? 200 : 503, health);
  }, "liveness; 503 degraded once a catalog write has failed", false);
  add("GET", "/metrics", [this](const Request&) {
    Response r;
    r.body = RenderMetrics();
    r.content_type = "text/plain; version=0.0.4";
    return r;
  }, "Prometheus metrics", false);
  add("GET", "/api/v1", [router](const Request&) {
    Json routes = Json::array();
    for (const auto& r : router->routes()) {
      routes.push_back({{"method", r.method}, {"path", r.pattern}, {"help", r.help}});
    }
    return Response::Json(200, {{"routes", routes}});
  }, "this list");
  add("GET", "/api/v1/openapi.json", [](const Request&) {
    Response r;
    r.body = std::string(OpenApiDocument());
    return r;
  }, "the REST reference (OpenAPI 3)");
  add("GET", "/api/v1/cluster", [this](const Request&) { return Response::Json(200, Cluster()); },
      "counts of workers, meshes, jobs, storage bytes");
  add("GET", "/api/v1/events", [this](const Request& req) {
    Response r;
    r.content_type = "text/event-stream";
    r.headers.push_back({"Cache-Control", "no-cache"});
    // Resume after Last-Event-ID, else start from now.
    uint64_t after = events_.last_seq();
    std::string last = req.Header("last-event-id");
    if (!last.empty()) after = std::strtoull(last.c_str(), nullptr, 10);
    auto cursor = std::make_shared<uint64_t>(after);
    auto first = std::make_shared<bool>(true);
    r.stream = [this, cursor, first](const std::function<bool(std::string_view)>& write) {
      if (*first) {
        *first = false;
        return write(": tessera events\nretry: 2000\n\n");
      }
      auto events = events_.WaitAfter(*cursor, std::chrono::seconds(15));
      if (stopping_) return false;
      if (events.empty()) return write(": keep-alive\n\n");
      std::string out;
      for (const auto& e : events) {
        out += FormatSse(e);
        *cursor = e.seq;
      }
      return write(out);
    };
    return r;
  }, "Server-Sent Events: worker, mesh, job, checkpoint, memory_checkpoint, barrier, preemption");
  // EventSource cannot send a header: this route alone also takes ?token=.
  router->SetQueryToken("GET", "/api/v1/events");

  // Workers.
  add("POST", "/api/v1/workers", [this](const Request& req) {
    return WithBody(req, [&](const Json& b) { return Reply(RegisterWorker(b), 201); });
  }, "internal: register a worker");
  add("POST", "/api/v1/workers/{id}/heartbeat",
      [this](const Request& req) { return Reply(Heartbeat(req.Param("id"))); },
      "internal: heartbeat");
  add("GET", "/api/v1/workers/{id}/tasks", [this](const Request& req) {
    auto poll = PollRequestOf(req, nullptr);
    if (!poll.ok()) return Response::Error(poll.status());
    return Reply(PollTasks(req.Param("id"), *poll));
  }, "internal: long-poll tasks");
  add("POST", "/api/v1/workers/{id}/tasks", [this](const Request& req) {
    return WithBody(req, [&](const Json& b) {
      auto poll = PollRequestOf(req, &b);
      if (!poll.ok()) return Response::Error(poll.status());
      return Reply(PollTasks(req.Param("id"), *poll));
    });
  }, "internal: long-poll tasks, with the worker's bases {bases} in the body", true,
      kMaxTensorListBody);
  add("POST", "/api/v1/workers/{id}/tasks/{task}/report", [this](const Request& req) {
    return WithBody(req, [&](const Json& b) {
      Status st = ReportTask(req.Param("id"), req.Param("task"), b);
      return st.ok() ? Response::Json(200, {{"ok", true}}) : Response::Error(st);
    });
  }, "internal: task progress and result");
  add("GET", "/api/v1/workers", [this](const Request&) { return Response::Json(200, ListWorkers()); },
      "workers with state and heartbeat age");
  add("GET", "/api/v1/workers/{id}", [this](const Request& req) { return Reply(GetWorker(req.Param("id"))); },
      "one worker");
  add("DELETE", "/api/v1/workers/{id}",
      [this](const Request& req) { return ReplyStatus(DeleteWorker(req.Param("id"))); },
      "deregister a worker");

  add("POST", "/api/v1/gc", [this](const Request&) { return Reply(CollectGarbage()); },
      "remove what failed saves left in the checkpoint root (also runs periodically)");

  // Checkpoints (before the plain mesh routes: mesh names may contain '/').
  add("POST", "/api/v1/meshes/{m+}/checkpoints", [this](const Request& req) {
    return WithBody(req, [&](const Json& b) {
      auto tier = OptionalString(b, "tier");
      if (!tier.ok()) return Response::Error(tier.status());
      if (*tier && **tier == "memory") return Reply(StartMemorySave(req.Param("m"), b), 202);
      if (*tier && **tier != "disk") {
        return Response::Error(InvalidArgument("tier must be \"disk\" or \"memory\"", {{"field", "tier"}}));
      }
      auto request = SaveRequest::FromJson(b);
      if (!request.ok()) return Response::Error(request.status());
      return Reply(StartSave(req.Param("m"), *request), 202);
    });
  }, "start a save {step, tensors?, compression?, level?, metadata?, tier?}");
  add("PUT", "/api/v1/meshes/{m+}/checkpoints/{step}", [this](const Request& req) {
    auto step = ParseStep(req.Param("step"));
    if (!step.ok()) return Response::Error(step.status());
    return WithBody(req, [&](const Json& b) {
      auto join = SaveJoinRequest::FromJson(b, *step);
      if (!join.ok()) return Response::Error(join.status());
      auto r = JoinSave(req.Param("m"), *join);
      if (!r.ok()) return Response::Error(r.status());
      return Response::Json(r->first, r->second);
    });
  }, "internal: a worker creates (201) or joins (200) the in-loop save of a step "
     "{worker, snapshot, tensors?, compression?, level?, metadata?}",
     true, kMaxTensorListBody);
  add("PUT", "/api/v1/meshes/{m+}/memory-checkpoints", [this](const Request& req) {
    return WithBody(req, [&](const Json& b) {
      return Reply(ReportMemoryCheckpoints(req.Param("m"), MemoryCheckpointReport::FromJson(b)));
    });
  }, "internal: rank 0's report of the mesh's memory tier {step, redundancy, steps, bytes, "
     "tensors, workers, replicas?, group?, parity?, keep?, persisted?}",
     true, kMaxTensorListBody);
  add("GET", "/api/v1/meshes/{m+}/checkpoints",
      [this](const Request& req) { return Reply(ListCheckpoints(req.Param("m"))); },
      "checkpoints of a mesh, newest first");
  add("GET", "/api/v1/meshes/{m+}/checkpoints/{step}",
      [this](const Request& req) { return Reply(GetCheckpoint(req.Param("m"), req.Param("step"))); },
      "one checkpoint (or 'latest') with tensors and metadata");
  add("DELETE", "/api/v1/meshes/{m+}/checkpoints/{step}", [this](const Request& req) {
    return ReplyStatus(DeleteCheckpoint(req.Param("m"), req.Param("step")));
  }, "delete a checkpoint");
  add("POST", "/api/v1/meshes/{m+}/checkpoints/{step}/restore", [this](const Request& req) {
    return WithBody(req, [&](const Json& b) {
      auto request = RestoreRequest::FromJson(b);
      if (!request.ok()) return Response::Error(request.status());
      return Reply(StartRestore(req.Param("m"), req.Param("step"), *request), 202);
    });
  }, "restore {target_mesh?, tensors?, layouts?}");
  add("POST", "/api/v1/meshes/{m+}/checkpoints/{step}/persist", [this](const Request& req) {
    return WithBody(req, [&](const Json& b) {
      return Reply(StartPersist(req.Param("m"), req.Param("step"), b), 202);
    });
  }, "persist a memory checkpoint now: its workers write their shares from RAM {compression?, level?}");
  add("POST", "/api/v1/meshes/{m+}/checkpoints/{step}/verify", [this](const Request& req) {
    return Reply(StartVerify(req.Param("m"), req.Param("step")), 202);
  }, "verify every chunk");
  add("POST", "/api/v1/meshes/{m+}/checkpoints/{step}/export", [this](const Request& req) {
    return WithBody(req, [&](const Json& b) {
      auto request = ExportRequest::FromJson(b);
      if (!request.ok()) return Response::Error(request.status());
      return Reply(StartExport(req.Param("m"), req.Param("step"), *request), 202);
    });
  }, "export as safetensors files {dir, max_file_size?}");
  add("POST", "/api/v1/meshes/{m+}/imports", [this](const Request& req) {
    return WithBody(req, [&](const Json& b) {
      auto request = ImportRequest::FromJson(b);
      if (!request.ok()) return Response::Error(request.status());
      return Reply(StartImport(req.Param("m"), *request), 202);
    });
  }, "import safetensors files as a checkpoint {source, step, compression?, level?, metadata?}");
  add("PUT", "/api/v1/meshes/{m+}/retention", [this](const Request& req) {
    return WithBody(req, [&](const Json& b) { return Reply(PutRetention(req.Param("m"), b)); });
  }, "retention {keep_last?, keep_every_n_steps?}");
  add("POST", "/api/v1/meshes/{m+}/collectives", [this](const Request& req) {
    return WithBody(req, [&](const Json& b) { return Reply(StartCollective(req.Param("m"), b), 202); });
  }, "collective job {op, tensor, output, reduce?, axes?, tiled?, root?, message?, timeout_ms?}");

  // Preemption (before the plain mesh routes, like checkpoints).
  add("POST", "/api/v1/meshes/{m+}/preemption/sync", [this](const Request& req) {
    return WithBody(req, [&](const Json& b) { return Reply(SyncPreemption(req.Param("m"), b)); });
  }, "internal: a worker's preemption sync-point call {worker, step, timeout_ms?}");
  add("POST", "/api/v1/meshes/{m+}/preemption", [this](const Request& req) {
    return WithBody(req, [&](const Json& b) { return Reply(NoticePreemption(req.Param("m"), b)); });
  }, "record a preemption notice {reason?}");
  add("GET", "/api/v1/meshes/{m+}/preemption",
      [this](const Request& req) { return Reply(GetPreemption(req.Param("m"))); },
      "preemption notice, reported steps and sync step");
  add("DELETE", "/api/v1/meshes/{m+}/preemption",
      [this](const Request& req) { return ReplyStatus(ClearPreemption(req.Param("m"))); },
      "clear the preemption notice (for the restarted job)");

  // Meshes.
  add("GET", "/api/v1/meshes", [this](const Request&) { return Response::Json(200, ListMeshes()); },
      "meshes");
  add("PUT", "/api/v1/meshes/{name+}", [this](const Request& req) {
    return WithBody(req, [&](const Json& b) {
      auto r = PutMesh(req.Param("name"), b);
      if (!r.ok()) return Response::Error(r.status());
      return Response::Json(r->first, r->second);
    });
  }, "register a mesh {axes, devices_per_worker, workers?} (idempotent)");
  add("GET", "/api/v1/meshes/{name+}",
      [this](const Request& req) { return Reply(GetMesh(req.Param("name"))); }, "one mesh");
  add("DELETE", "/api/v1/meshes/{name+}",
      [this](const Request& req) { return ReplyStatus(DeleteMesh(req.Param("name"))); },
      "delete a mesh");

  // Barriers and KV.
  add("POST", "/api/v1/barriers/{barrier+}", [this](const Request& req) {
    return WithBody(req, [&](const Json& b) {
      return Reply(coordination_->ArriveBarrier(req.Param("barrier"), b));
    });
  }, "wait at a barrier {rank, world, timeout_ms?} until all ranks arrive");
  add("GET", "/api/v1/barriers",
      [this](const Request&) { return Response::Json(200, coordination_->ListBarriers()); },
      "open barriers with arrived and missing ranks");
  add("PUT", "/api/v1/kv/{key+}", [this](const Request& req) {
    // httplib keeps only the parts of a multipart body, never the bytes as sent.
    if (req.Header("content-type").rfind("multipart/", 0) == 0) {
      return Response::Error(InvalidArgument(
          "send the value as the raw body (e.g. Content-Type: application/octet-stream)",
          {{"field", "body"}, {"key", req.Param("key")}}));
    }
    return ReplyStatus(coordination_->PutValue(req.Param("key"), req.body));
  }, "store a value (raw body, <= 1 MiB)");
  add("GET", "/api/v1/kv/{key+}", [this](const Request& req) {
    auto wait = http::QueryInt(req, "wait_ms", 0);
    if (!wait.ok()) return Response::Error(wait.status());
    auto value = coordination_->GetValue(req.Param("key"), *wait);
    if (!value.ok()) return Response::Error(value.status());
    Response r;
    r.body = std::move(*value);
    r.content_type = "application/octet-stream";
    return r;
  }, "a value as raw bytes (?wait_ms= waits for the key to appear)");
  add("GET", "/api/v1/kv", [this](const Request& req) {
    return Response::Json(200, coordination_->ListKeys(req.Query("prefix").value_or("")));
  }, "keys, sorted (?prefix=)");
  add("DELETE", "/api/v1/kv/{key+}",
      [this](const Request& req) { return ReplyStatus(coordination_->DeleteValue(req.Param("key"))); },
      "delete a key");

  // Jobs.
  add("GET", "/api/v1/jobs", [this](const Request& req) {
    auto limit = http::QueryInt(req, "limit", 100);
    if (!limit.ok()) return Response::Error(limit.status());
    auto before = http::QueryInt(req, "before", 0);
    if (!before.ok()) return Response::Error(before.status());
    if (*before < 0) {
      return Response::Error(InvalidArgument("before must be a job's seq", {{"field", "before"}}));
    }
    auto page = ListJobs(req.Query("state").value_or(""), req.Query("kind").value_or(""),
                         req.Query("mesh").value_or(""), *limit, static_cast<uint64_t>(*before));
    if (!page.ok()) return Response::Error(page.status());
    Response r;
    r.body = std::move(page->json);
    if (static_cast<int64_t>(page->count) == *limit) {
      // The next page: RFC 8288, with the same filters.
      std::string next = "/api/v1/jobs?limit=" + std::to_string(*limit) +
                         "&before=" + std::to_string(page->last_seq);
      for (const char* key : {"state", "kind", "mesh"}) {
        if (auto v = req.Query(key)) next += std::string("&") + key + "=" + http::PercentEncode(*v);
      }
      r.headers.emplace_back("Link", "<" + next + ">; rel=\"next\"");
    }
    return r;
  }, "jobs, newest first (?state=&kind=&mesh=&limit=1..1000&before=seq)");
  add("GET", "/api/v1/jobs/{id}", [this](const Request& req) {
    auto wait = http::QueryInt(req, "wait_ms", 0);
    if (!wait.ok()) return Response::Error(wait.status());
    return Reply(GetJob(req.Param("id"), *wait));
  }, "one job (?wait_ms= long-polls until it ends)");
  add("POST", "/api/v1/jobs/{id}/cancel",
      [this](const Request& req) { return Reply(CancelJob(req.Param("id")), 202); },
      "cancel a job");
}

}  // namespace tessera::service
