#include "tests/faults/fault_hooks.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <thread>

#include "storage/env.h"
#include "storage/testing/fault_transport.h"

namespace tessera::faults {
namespace {

// A whole non-negative decimal number, or nullopt.
std::optional<int64_t> ParseCount(const std::string& s) {
  if (s.empty() || s.size() > 18 || s.find_first_not_of("0123456789") != std::string::npos) {
    return std::nullopt;
  }
  return std::strtoll(s.c_str(), nullptr, 10);
}

Result<std::map<std::string, int64_t>> ParseDelays(const std::string& spec) {
  std::map<std::string, int64_t> delays;
  for (size_t pos = 0; pos <= spec.size();) {
    const size_t comma = std::min(spec.find(',', pos), spec.size());
    const std::string item = spec.substr(pos, comma - pos);
    const size_t colon = item.find(':');
    const auto ms = colon == std::string::npos ? std::nullopt : ParseCount(item.substr(colon + 1));
    if (colon == 0 || !ms) {
      return InvalidArgument(
          "TESSERA_FAULT_TASK_DELAY='" + spec + "': '" + item + "' is not kind:milliseconds",
          {{"field", "TESSERA_FAULT_TASK_DELAY"}});
    }
    delays[item.substr(0, colon)] = *ms;
    pos = comma + 1;
  }
  return delays;
}

void Announce(const std::string& program, const char* name, const char* value) {
  std::fprintf(stderr, "warning: fault injection is on (%s): %s=%s\n", program.c_str(), name,
               value);
}

}  // namespace

Result<FaultHooks> LoadFaultHooks(const std::string& program, bool runs_tasks) {
  FaultHooks hooks;
  if (const char* spec = std::getenv("TESSERA_FAULT_TASK_DELAY"); spec != nullptr && !runs_tasks) {
    std::fprintf(stderr, "warning: %s runs no tasks and ignores TESSERA_FAULT_TASK_DELAY\n",
                 program.c_str());
  } else if (spec != nullptr) {
    ASSIGN_OR_RETURN(hooks.task_delay_ms, ParseDelays(spec));
    Announce(program, "TESSERA_FAULT_TASK_DELAY", spec);
  }
  if (const char* limit = std::getenv("TESSERA_FAULT_DISK_FULL_AFTER")) {
    const auto bytes = ParseCount(limit);
    if (!bytes) {
      return InvalidArgument(
          std::string("TESSERA_FAULT_DISK_FULL_AFTER='") + limit + "' is not a number of bytes",
          {{"field", "TESSERA_FAULT_DISK_FULL_AFTER"}});
    }
    hooks.env = std::make_unique<storage::FaultEnv>(storage::DefaultEnv());
    hooks.env->FailAfterBytes(static_cast<uint64_t>(*bytes));
    Announce(program, "TESSERA_FAULT_DISK_FULL_AFTER", limit);
  }
  if (const char* n = std::getenv("TESSERA_FAULT_DROP_POLLS"); n != nullptr && runs_tasks) {
    std::fprintf(stderr, "warning: %s answers no polls and ignores TESSERA_FAULT_DROP_POLLS\n",
                 program.c_str());
  } else if (n != nullptr) {
    const auto count = ParseCount(n);
    if (!count) {
      return InvalidArgument(std::string("TESSERA_FAULT_DROP_POLLS='") + n +
                                 "' is not a number of poll answers",
                             {{"field", "TESSERA_FAULT_DROP_POLLS"}});
    }
    hooks.drop_polls = *count;
    Announce(program, "TESSERA_FAULT_DROP_POLLS", n);
  }
  for (const char* name : {"TESSERA_FAULT_FLIP_MEMORY_COPY", "TESSERA_FAULT_FLIP_MEMORY_OWN"}) {
    const char* step = std::getenv(name);
    if (step == nullptr || !runs_tasks) continue;
    const auto n = ParseCount(step);
    if (!n) return InvalidArgument(std::string(name) + "='" + step + "' is not a step", {{"field", name}});
    hooks.flip_memory_step = static_cast<int64_t>(*n);
    hooks.flip_own = std::string_view(name).ends_with("OWN");
    Announce(program, name, step);
  }
  if (const char* text = std::getenv("TESSERA_FAULT_S3"); text != nullptr && *text != '\0') {
    hooks.s3_transport =
        std::make_shared<storage::FaultTransport>(storage::s3::NewCurlTransport(), text);
    Announce(program, "TESSERA_FAULT_S3", text);
  }
  return hooks;
}

worker::TaskRunner FaultHooks::TaskDelays() const {
  if (task_delay_ms.empty()) return nullptr;
  return [delays = task_delay_ms](const Task& task, const std::function<Result<Json>()>& run) {
    const std::string kind(TaskKindName(task.kind));
    const auto delay = delays.find(kind);
    if (delay == delays.end()) return run();
    std::this_thread::sleep_for(std::chrono::milliseconds(delay->second));
    Result<Json> r = run();
    // Tests that delay a task wait for this line: the late task has run.
    std::fprintf(stderr,
                 "fault injection: the %s task of job %s (mesh %s step %lld), delayed %lld ms, "
                 "ended: %s\n",
                 kind.c_str(), task.job.empty() ? "-" : task.job.c_str(), task.mesh.name.c_str(),
                 static_cast<long long>(task.step), static_cast<long long>(delay->second),
                 r.ok() ? "ok" : r.status().ToString().c_str());
    return r;
  };
}

std::function<Status(const std::string& worker, size_t tasks)> FaultHooks::DropPolls() const {
  if (drop_polls == 0) return nullptr;
  auto left = std::make_shared<std::atomic<int64_t>>(drop_polls);
  return [left](const std::string& worker, size_t tasks) -> Status {
    if (tasks == 0 || left->fetch_sub(1) <= 0) return Status::Ok();
    // Tests count these lines: each lost answer's tasks must still run, once.
    std::fprintf(stderr, "fault injection: dropped a poll answer of worker %s (%zu tasks)\n",
                 worker.c_str(), tasks);
    return Unavailable("fault injection: the poll answer of worker " + worker + " is lost",
                       {{"worker", worker}});
  };
}

std::function<void(worker::MemoryCheckpoint&)> FaultHooks::FlipMemoryCopy() const {
  if (flip_memory_step < 0) return nullptr;
  return [step = flip_memory_step, own = flip_own](worker::MemoryCheckpoint& ck) {
    if (ck.step != step) return;
    uint8_t* bytes = nullptr;
    std::string what;
    if (own && ck.own.size() > 0) {
      // RAM going bad under the tier: its own share is the snapshot's (const) buffers.
      bytes = const_cast<uint8_t*>(ck.own.spans()[0].data());
      what = "its own share";
    } else if (own) {
      return;
    } else if (!ck.copies.empty() && ck.copies.begin()->second.bytes.size() > 0) {
      bytes = ck.copies.begin()->second.bytes.writable();
      what = "the copy of rank " + std::to_string(ck.copies.begin()->first) + "'s share";
    } else if (ck.parity.size() > 0) {
      bytes = ck.parity.writable();
      what = "the parity";
    }
    if (bytes == nullptr) return;
    bytes[0] ^= 0x10;
    // Tests wait for this line.
    std::fprintf(stderr, "fault injection: flipped a bit in %s of memory checkpoint step %lld\n",
                 what.c_str(), static_cast<long long>(step));
  };
}

}  // namespace tessera::faults
