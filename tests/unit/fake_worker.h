// A worker inside the test process: it long-polls a Service directly and answers
// each task through the same Service methods the HTTP routes call.
#pragma once

#include <atomic>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "service/service.h"

namespace tessera::service {

// A worker that long-polls the Service itself and answers each task with `answer`
// (state and result or error, or null for a task whose answer is no report: a save's
// snapshot, which `answer` joins itself), as the agent would over HTTP.
class FakeWorker {
 public:
  using Answer = std::function<Json(const Json& task)>;
  // `ended`, when given, is shown each save_ended task (a save's end).
  // `bases`, when given, is what each long-poll reports the worker's saves build on
  // (worker::SaveBases::Report), as an agent's polls do.
  FakeWorker(Service* service, std::string id, Answer answer,
             std::function<void(const Json& task)> ended = nullptr,
             std::function<Json()> bases = nullptr)
      : service_(service), id_(std::move(id)), answer_(std::move(answer)),
        ended_(std::move(ended)), bases_(std::move(bases)), thread_([this] { Loop(); }) {}
  ~FakeWorker() {
    stop_ = true;
    thread_.join();
  }
  std::vector<std::string> kinds() {
    std::lock_guard<std::mutex> lock(mu_);
    return kinds_;
  }

 private:
  void Loop() {
    while (!stop_) {
      if (bases_) {
        auto report = BaseReportFromJson(bases_());
        if (report.ok()) poll_.bases = std::move(*report);
      }
      auto tasks = service_->PollTasks(id_, poll_);
      if (!tasks.ok()) continue;
      // What the agent sends back (worker/task_feed.h): its tasks are then dropped.
      poll_.ack = tasks->value("ack", uint64_t{0});
      poll_.queue = tasks->value("queue", "");
      for (const Json& task : tasks->value("tasks", Json::array())) {
        {
          std::lock_guard<std::mutex> lock(mu_);
          kinds_.push_back(task.value("kind", ""));
        }
        const std::string kind = task.value("kind", "");
        if (kind == "save_ended" && ended_) ended_(task);
        if (kind == "abort" || kind == "save_ended") continue;
        const Json report = answer_(task);
        if (report.is_null()) continue;
        if (kind == "snapshot") {
          Join(task, report);
        } else {
          (void)service_->ReportTask(id_, task.value("id", ""), report);
        }
      }
    }
  }

  // A snapshot answered as a report ({state, result: snapshot} or {state, error}):
  // joined as an agent would, having written nothing.
  void Join(const Json& task_json, const Json& report) {
    auto task = TaskFromJson(task_json);
    if (!task.ok()) return;
    SaveJoinRequest join;
    join.save.step = task->step;
    join.worker = id_;
    join.job = task->job;
    if (report.value("state", "") == "failed") {
      join.error = StatusFromErrorJson(report.value("error", Json::object()));
    } else {
      auto snapshot = SnapshotResultFromJson(report.value("result", Json::object()));
      if (!snapshot.ok()) return;
      join.snapshot = *snapshot;
      join.written = SaveWritten{};
    }
    (void)service_->JoinSave(task->mesh.name, join);
  }

  Service* service_;
  std::string id_;
  Answer answer_;
  std::function<void(const Json&)> ended_;
  std::function<Json()> bases_;
  PollRequest poll_{100, 0, std::nullopt, ""};  // the loop's alone
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<std::string> kinds_;
  std::thread thread_;
};

}  // namespace tessera::service
