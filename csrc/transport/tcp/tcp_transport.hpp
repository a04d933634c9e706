// Point-to-point messages over TCP sockets, one connection per peer pair
// (the lower rank connects, the higher accepts). Serves the peers on other
// machines with ROCE_PG_NET_TRANSPORT=tcp (machines without RDMA); with
// ROCE_PG_FORCE_NETWORK=1 as well, the ranks of its own machine too (tests).
#pragma once
#include <string>
#include <vector>

#include "../stream_transport.hpp"

namespace roce {

struct Config;

class TcpTransport : public StreamTransport {
 public:
  // Serves the peers not on this machine (or every peer with
  // ROCE_PG_FORCE_NETWORK=1); their connections arrive on demand from the
  // group's ConnectionManager (adoptConnection).
  // `hostNames` (per group rank, for messages) must outlive the transport.
  TcpTransport(int rank, int size, const std::vector<std::string>& hostNames);
  const char* name() const override { return "tcp"; }
  bool needsConnection(int peer) const override { return !hasPipe(peer); }
  void adoptConnection(int peer, int fd) override;

 private:
  const std::vector<std::string>& hostNames_;
};

}  // namespace roce
