// The handshakes a data port holds under a flood (handshake_table.h): capped per
// source and in all, the oldest silent connection makes room, a newcomer is never
// the one turned away, and deadlines tighten under load.
#include "collectives/transport/tcp/handshake_table.h"

#include <gtest/gtest.h>
#include <sys/socket.h>

#include <algorithm>
#include <set>
#include <utility>
#include <vector>

#include "collectives/transport/tcp/tcp_wire.h"

namespace tessera::collectives::tcp {
namespace {

using namespace std::chrono_literals;

const DataPortKey kKey = *DeriveDataPortKey("token");

// A handshake over one end of a socket pair, claiming to come from `remote`; the
// other end stays in `peers` to speak for it.
struct Pairs {
  std::vector<Fd> peers;
  std::unique_ptr<ServerHandshake> Make(const std::string& remote, Deadline deadline) {
    int sv[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
    peers.emplace_back(sv[1]);
    return std::make_unique<ServerHandshake>(Fd(sv[0]), remote, kKey, deadline);
  }
};

std::set<std::string> Remotes(const std::vector<HandshakeTable::Dropped>& dropped) {
  std::set<std::string> out;
  for (const auto& d : dropped) out.insert(d.handshake->remote());
  return out;
}

TEST(HandshakeTable, OverASourcesCapItsOldestSilentConnectionMakesRoom) {
  HandshakeTable table({.per_source = 3, .total = 100});
  Pairs p;
  const Deadline far = Clock::now() + 60s;
  // The first connection sends half a hello: it is talking, no longer silent.
  auto talking = p.Make("10.0.0.1:1", far);
  const std::string hello = wire::EncodeHello({1, 0, 2, "g", {}});
  ASSERT_EQ(::send(p.peers.back().get(), hello.data(), 10, 0), 10);
  ASSERT_TRUE(talking->Step().ok());
  EXPECT_FALSE(talking->Silent());
  EXPECT_TRUE(table.Admit(std::move(talking)).empty());
  EXPECT_TRUE(table.Admit(p.Make("10.0.0.1:2", far)).empty());
  EXPECT_TRUE(table.Admit(p.Make("10.0.0.2:1", far)).empty());  // another source
  EXPECT_TRUE(table.Admit(p.Make("10.0.0.1:3", far)).empty());
  // The fourth from 10.0.0.1: its oldest silent one goes, not the talking one.
  auto dropped = table.Admit(p.Make("10.0.0.1:4", far));
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_EQ(dropped[0].handshake->remote(), "10.0.0.1:2");
  EXPECT_EQ(dropped[0].why.code(), Code::kResourceExhausted);
  EXPECT_NE(dropped[0].why.message().find("from 10.0.0.1"), std::string::npos)
      << dropped[0].why.ToString();
  EXPECT_EQ(Remotes(table.Admit(p.Make("10.0.0.1:5", far))), std::set<std::string>{"10.0.0.1:3"});
  EXPECT_EQ(Remotes(table.Admit(p.Make("10.0.0.1:6", far))), std::set<std::string>{"10.0.0.1:4"});
  // The talking connection outlived three silent ones from its source.
  table.Compact();
  EXPECT_EQ(table.size(), 4u);
}

TEST(HandshakeTable, ANewcomerIsNeverTurnedAwayAndTheTotalCapHolds) {
  HandshakeTable table({.per_source = 1000, .total = 8});
  Pairs p;
  const Deadline far = Clock::now() + 60s;
  size_t dropped = 0;
  for (int i = 0; i < 100; ++i) {
    const std::string remote = "10.0.1." + std::to_string(i % 5) + ":" + std::to_string(i);
    for (const auto& d : table.Admit(p.Make(remote, far))) {
      EXPECT_NE(d.handshake->remote(), remote);
      ++dropped;
    }
    table.Compact();
    EXPECT_LE(table.size(), 8u);
    EXPECT_EQ(table.at(table.size() - 1).remote(), remote);  // the newest stays
  }
  EXPECT_EQ(dropped, 92u);
}

TEST(HandshakeTable, DeadlinesTightenPastAQuarterOfTheCap) {
  HandshakeTable table({.per_source = 100, .total = 8, .hello_timeout = 2000ms,
                        .hello_timeout_under_load = 250ms});
  Pairs p;
  const Deadline now = Clock::now();
  const Deadline given = now + 2000ms;
  EXPECT_EQ(table.NewDeadline(now), given);
  // Each connection arrives (starts its clock) between these two readings.
  std::vector<std::pair<Deadline, Deadline>> arrived;
  auto admit = [&](int i) {
    const Deadline before = Clock::now();
    auto h = p.Make("10.0.2.1:" + std::to_string(i), given);
    arrived.emplace_back(before, Clock::now());
    table.Admit(std::move(h));
  };
  for (int i = 0; i < 2; ++i) admit(i);
  table.TightenUnderLoad();  // 2 of 8: not under load yet
  for (size_t i = 0; i < table.size(); ++i) EXPECT_EQ(table.at(i).deadline(), given) << i;
  EXPECT_EQ(table.NewDeadline(now), now + 250ms);
  admit(2);
  table.TightenUnderLoad();  // 3 of 8: at most 250 ms after each arrival, never later than given
  for (size_t i = 0; i < table.size(); ++i) {
    EXPECT_GE(table.at(i).deadline(), std::min(given, arrived[i].first + 250ms)) << i;
    EXPECT_LE(table.at(i).deadline(), std::min(given, arrived[i].second + 250ms)) << i;
  }
}

TEST(HandshakeTable, TakingAConnectionFreesItsPlace) {
  HandshakeTable table({.per_source = 2, .total = 100});
  Pairs p;
  const Deadline far = Clock::now() + 60s;
  table.Admit(p.Make("10.0.3.1:1", far));
  table.Admit(p.Make("10.0.3.1:2", far));
  ASSERT_NE(table.Take(0), nullptr);
  EXPECT_EQ(table.Take(0), nullptr);  // already taken
  table.Compact();
  EXPECT_TRUE(table.Admit(p.Make("10.0.3.1:3", far)).empty());
  EXPECT_EQ(table.size(), 2u);
}

}  // namespace
}  // namespace tessera::collectives::tcp
