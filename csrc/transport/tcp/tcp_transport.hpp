// Point-to-point messages over TCP sockets, one connection per peer pair
// (the lower rank connects, the higher accepts). Used between machines until
// the verbs transport serves them, and for every peer when tests force the
// network path on one host.
#pragma once
#include <chrono>
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
  // Connects to every rank r with serve[r] true (the lower rank dials). Blocks
  // until connected or the timeout expires.
  TcpTransport(int rank, TcpAcceptor& acceptor, const std::vector<TcpEndpoint>& endpoints,
               const std::vector<bool>& serve, const std::vector<std::string>& hostNames, uint64_t nonce,
               std::chrono::milliseconds timeout);
  const char* name() const override { return "tcp"; }
};

}  // namespace roce
