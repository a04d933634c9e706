// Point-to-point messages over TCP sockets, one connection per peer pair
// (the lower rank connects, the higher accepts). Serves the peers on other
// machines with ROCE_PG_NET_TRANSPORT=tcp (machines without RDMA); with
// ROCE_PG_FORCE_NETWORK=1 as well, the ranks of its own machine too (tests).
#pragma once
#include <string>
#include <vector>

#include "../stream_transport.hpp"
#include "tcp_connect.hpp"

namespace roce {

struct Config;

// Listening socket opened before the bootstrap exchange so its port can be published.
class TcpListener {
 public:
  TcpListener();
  ~TcpListener();
  TcpListener(const TcpListener&) = delete;
  TcpListener& operator=(const TcpListener&) = delete;
  int port() const { return port_; }
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// The IPv4 address peers on other machines should dial: the one of
// ROCE_PG_SOCKET_IFNAME if set, else the first up, non-loopback interface.
std::string tcpAdvertiseAddress(const Config& cfg);

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
