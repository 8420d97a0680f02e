#include "collectives/transport/tcp/handshake_table.h"

#include <algorithm>

namespace tessera::collectives::tcp {

Deadline HandshakeTable::NewDeadline(Deadline now) const {
  // With the newcomer, more than a quarter of the cap would wait (TightenUnderLoad).
  return now + (live_ >= limits_.total / 4 ? limits_.hello_timeout_under_load
                                           : limits_.hello_timeout);
}

template <typename Pred>
size_t HandshakeTable::Victim(Pred in, size_t skip) const {
  size_t oldest = entries_.size();
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Entry& e = entries_[i];
    if (i == skip || e.handshake == nullptr || !in(e)) continue;
    if (e.handshake->Silent()) return i;
    if (oldest == entries_.size()) oldest = i;
  }
  return oldest;
}

HandshakeTable::Dropped HandshakeTable::Drop(size_t i, Status why) {
  return {Take(i), std::move(why)};
}

std::vector<HandshakeTable::Dropped> HandshakeTable::Admit(std::unique_ptr<ServerHandshake> h) {
  const std::string source = h->source();
  entries_.push_back({std::move(h), source});
  ++live_;
  const size_t self = entries_.size() - 1;
  std::vector<Dropped> dropped;
  if (++per_source_[source] > limits_.per_source) {
    const size_t v = Victim([&](const Entry& e) { return e.source == source; }, self);
    if (v < entries_.size()) {
      dropped.push_back(Drop(v, ResourceExhausted(
                                    std::to_string(limits_.per_source) +
                                    " newer connections from " + source +
                                    " are in the middle of their handshake")));
    }
  }
  if (live_ > limits_.total) {
    const size_t v = Victim([](const Entry&) { return true; }, self);
    if (v < entries_.size()) {
      dropped.push_back(Drop(v, ResourceExhausted(std::to_string(limits_.total) +
                                                  " newer connections are in the middle of "
                                                  "their handshake")));
    }
  }
  return dropped;
}

void HandshakeTable::TightenUnderLoad() {
  if (live_ <= limits_.total / 4) return;
  for (Entry& e : entries_) {
    if (e.handshake != nullptr) e.handshake->Tighten(limits_.hello_timeout_under_load);
  }
}

std::unique_ptr<ServerHandshake> HandshakeTable::Take(size_t i) {
  Entry& e = entries_[i];
  if (e.handshake == nullptr) return nullptr;
  --live_;
  auto it = per_source_.find(e.source);
  if (--it->second == 0) per_source_.erase(it);
  return std::move(e.handshake);
}

void HandshakeTable::Compact() {
  std::erase_if(entries_, [](const Entry& e) { return e.handshake == nullptr; });
}

}  // namespace tessera::collectives::tcp
