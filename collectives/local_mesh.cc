#include "collectives/local_mesh.h"

#include <thread>

#include "collectives/transport/tcp/tcp_transport.h"

namespace tessera::collectives {

Result<std::vector<std::unique_ptr<Transport>>> ConnectLoopbackMesh(
    int size, const std::string& group_id, std::chrono::milliseconds timeout) {
  // Loopback ports are open to every local user: the mesh has a key of its own.
  ASSIGN_OR_RETURN(const DataPortKey key, RandomDataPortKey());
  std::vector<std::unique_ptr<TcpListener>> listeners;
  std::vector<std::string> addresses;
  for (int r = 0; r < size; ++r) {
    ASSIGN_OR_RETURN(auto listener, TcpListener::Bind("127.0.0.1", 0));
    addresses.push_back(listener->address());
    listeners.push_back(std::move(listener));
  }
  std::vector<std::unique_ptr<Transport>> mesh(size);
  std::vector<Status> errors(size);
  RunRanks(size, [&](int r) {
    auto joined = TcpTransport::Connect(
        std::move(listeners[r]), addresses,
        {.rank = r, .size = size, .group_id = group_id, .connect_timeout = timeout, .key = key});
    if (joined.ok()) {
      mesh[r] = std::move(joined).value();
    } else {
      errors[r] = joined.status();
    }
  });
  for (const Status& st : errors) RETURN_IF_ERROR(st);
  return mesh;
}

void RunRanks(int size, const std::function<void(int rank)>& fn) {
  std::vector<std::thread> threads;
  threads.reserve(size);
  for (int r = 0; r < size; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

}  // namespace tessera::collectives
