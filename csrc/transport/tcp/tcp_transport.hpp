// Point-to-point messages over TCP. Serves the peers on other machines with
// ROCE_PG_NET_TRANSPORT=tcp (machines without RDMA); with
// ROCE_PG_FORCE_NETWORK=1 as well, the ranks of its own machine too (tests).
//
// A group's stream to each peer travels over its process's one connection
// to the peer's process (tcp_mux.hpp), shared with every other group of the
// two processes: the first group that needs that process dials it through
// its ConnectionManager; later groups find the connection there and attach
// at once, with no dial and no descriptor of their own.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "../stream_transport.hpp"
#include "tcp_mux.hpp"

namespace roce::transport::tcp {


class TcpTransport : public StreamTransport {
 public:
  // `hostNames` (per group rank, for messages) and `nonces` (what each rank
  // published for this group) must outlive the transport; `processKeyOf`
  // names a rank's process (ProcessLinks::processKey); `wake` is the
  // group's, woken when another group's thread leaves bytes for this one.
  TcpTransport(int rank, int size, const std::vector<std::string>& hostNames,
               std::function<std::string(int)> processKeyOf, const std::vector<uint64_t>& nonces, Wakeup* wake);
  ~TcpTransport() override;
  const char* name() const override { return "tcp"; }
  bool needsConnection(int peer) const override;
  void adoptConnection(int peer, int fd) override;
  void postSend(Request* r) override;
  void postRecv(Request* r) override;
  bool progress() override;
  // First contact with a peer's process, shared with the process's other
  // groups (ConnectionManager::SharedDials): a connection reaches it
  // (Linked); or this group may dial it (Dial: no other group is; then this
  // one is, until dialEnded); or it waits (Wait); and using the existing
  // connection.
  FirstContact firstContact(int peer);
  void dialEnded(int peer);
  void useLink(int peer) { attach(peer); }
  bool prepareWait(std::vector<pollfd>& fds, bool anySource) override;

 private:
  // Gives `peer` a pipe over its process's connection, if there is one.
  bool attach(int peer);

  const std::vector<std::string>& hostNames_;
  const std::function<std::string(int)> processKeyOf_;
  const std::vector<uint64_t>& nonces_;
  Wakeup* wake_;
  TcpMux& mux_;
  std::atomic<bool> newPeers_{false};
  std::vector<std::shared_ptr<MuxLink>> links_;  // the connections this group's pipes use
};

}  // namespace roce::transport::tcp
