// The states of tesserad's records as enums, with one codec: each state's name (in
// the REST API, the catalog, events and metrics) and its parse. A state compared
// as a string, or serialized as a number, does not compile.
#pragma once

#include <array>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "api/status.h"

namespace tessera::service {

enum class WorkerState { kAlive, kSuspect, kDead };
enum class CheckpointState { kPending, kWriting, kMerging, kCommitted, kFailed };
enum class JobState { kQueued, kRunning, kSucceeded, kFailed, kCancelled };
enum class TaskRunState { kQueued, kRunning, kSucceeded, kFailed };

template <typename E>
struct StateNames;
template <>
struct StateNames<WorkerState> {
  static constexpr std::string_view kWhat = "worker state";
  static constexpr std::array<std::string_view, 3> kNames = {"alive", "suspect", "dead"};
};
template <>
struct StateNames<CheckpointState> {
  static constexpr std::string_view kWhat = "checkpoint state";
  static constexpr std::array<std::string_view, 5> kNames = {"pending", "writing", "merging",
                                                             "committed", "failed"};
};
template <>
struct StateNames<JobState> {
  static constexpr std::string_view kWhat = "job state";
  static constexpr std::array<std::string_view, 5> kNames = {"queued", "running", "succeeded",
                                                             "failed", "cancelled"};
};
template <>
struct StateNames<TaskRunState> {
  static constexpr std::string_view kWhat = "task state";
  static constexpr std::array<std::string_view, 4> kNames = {"queued", "running", "succeeded",
                                                             "failed"};
};

template <typename E>
std::string_view StateName(E state) {
  return StateNames<E>::kNames.at(static_cast<size_t>(state));
}

template <typename E>
std::string StateString(E state) {
  return std::string(StateName(state));
}

// invalid_argument naming `field` for a name that is no state of E.
template <typename E>
Result<E> ParseState(std::string_view name, const std::string& field = "state") {
  const auto& names = StateNames<E>::kNames;
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == name) return static_cast<E>(i);
  }
  std::string known;
  for (auto n : names) known += (known.empty() ? "" : ", ") + std::string(n);
  return InvalidArgument("'" + std::string(name) + "' is no " +
                             std::string(StateNames<E>::kWhat) + " (" + known + ")",
                         {{"field", field}});
}

// A state of a JSON document, or `fallback` when it is absent or unknown (records
// read back from the catalog).
template <typename E>
E StateOr(const nlohmann::json& j, const std::string& field, E fallback) {
  auto it = j.find(field);
  if (it == j.end() || !it->is_string()) return fallback;
  auto parsed = ParseState<E>(it->template get<std::string>(), field);
  return parsed.ok() ? *parsed : fallback;
}

// JSON holds a state by its name.
inline void to_json(nlohmann::json& j, WorkerState s) { j = StateName(s); }
inline void to_json(nlohmann::json& j, CheckpointState s) { j = StateName(s); }
inline void to_json(nlohmann::json& j, JobState s) { j = StateName(s); }
inline void to_json(nlohmann::json& j, TaskRunState s) { j = StateName(s); }

}  // namespace tessera::service
