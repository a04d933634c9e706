#include "tcp_transport.hpp"

#include <algorithm>
#include <cstdint>

#include "../../common/error.hpp"
#include "../../common/sockets.hpp"
#include "../../runtime/process_runtime.hpp"
#include "tcp_mux.hpp"

namespace roce::transport::tcp {
using namespace roce::runtime;

namespace {

// How long a destroyed group waits for its last bytes (and its goodbyes) to
// leave a socket the peer does not drain: a peer that stopped reading gets
// no more than this of the caller's time.
constexpr auto kLastWordsBound = std::chrono::seconds(2);

// One group's stream to one peer, over the link to the peer's process.
class MuxPipe : public BytePipe {
 public:
  MuxPipe(std::shared_ptr<MuxLink> link, MuxLink::Stream s, Wakeup* wake) : link_(std::move(link)), s_(std::move(s)) {
    link_->open(s_, wake);
  }
  ~MuxPipe() override { link_->close(s_); }
  size_t write(const iovec* iov, int n) override { return link_->write(s_, iov, n); }
  size_t read(void* dst, size_t n) override { return link_->read(s_, dst, n); }
  int pollFd() const override { return link_->sendFd(); }
  void addPollFds(std::vector<pollfd>& fds, bool wantWrite) override { link_->addPollFds(s_, fds, wantWrite); }
  bool hasBuffered() const override { return link_->hasBuffered(s_); }
  void abandon() override { link_->abandon(s_); }

 private:
  std::shared_ptr<MuxLink> link_;
  MuxLink::Stream s_;
};

}  // namespace

TcpTransport::TcpTransport(int rank, int size, const std::vector<std::string>& hostNames,
                           std::function<std::string(int)> processKeyOf, const std::vector<uint64_t>& nonces,
                           Wakeup* wake)
    : StreamTransport(rank, std::vector<std::unique_ptr<BytePipe>>(size)),
      hostNames_(hostNames),
      processKeyOf_(std::move(processKeyOf)),
      nonces_(nonces),
      wake_(wake),
      mux_(ProcessRuntime::get().service<TcpMux>()) {
  mux_.registerGroup(nonces_[rank], rank, wake_, &newPeers_);
}

TcpTransport::~TcpTransport() {
  // From now on chunks for this group are dropped (and their senders told);
  // then each stream says goodbye after its last bytes.
  mux_.unregisterGroup(nonces_[rank_]);
  closePipes();
  mux_.dropGroup(nonces_[rank_], rank_);
  const auto until = Clock::now() + kLastWordsBound;
  for (auto& l : links_) l->drainTail(until);
}

bool TcpTransport::needsConnection(int peer) const {
  return !hasPipe(peer) && !mux_.connected(processKeyOf_(peer));
}

void TcpTransport::adoptConnection(int peer, int fd) {
  setNonBlocking(fd, true);
  mux_.adopt(processKeyOf_(peer), fd, peerAddress(fd));
  attach(peer);
}

bool TcpTransport::attach(int peer) {
  if (peer < 0 || peer >= static_cast<int>(hostNames_.size()) || peer == rank_ || hasPipe(peer)) return false;
  auto link = mux_.find(processKeyOf_(peer));
  if (!link) return false;
  if (std::find(links_.begin(), links_.end(), link) == links_.end()) links_.push_back(link);
  // "host hostname, a.b.c.d:port": errors name the machine as operators know it.
  MuxLink::Stream s{nonces_[rank_], nonces_[peer], rank_, peer,
                    str("host ", hostNames_.at(peer), ", ", link->address())};
  addPipe(peer, std::make_unique<MuxPipe>(std::move(link), std::move(s), wake_));
  return true;
}

void TcpTransport::postSend(Request* r) {
  attach(r->peer);
  StreamTransport::postSend(r);
}

void TcpTransport::postRecv(Request* r) {
  attach(r->peer);
  StreamTransport::postRecv(r);
}

FirstContact TcpTransport::firstContact(int peer) { return mux_.firstContact(processKeyOf_(peer), nonces_[rank_]); }

void TcpTransport::dialEnded(int peer) { mux_.endDial(processKeyOf_(peer), nonces_[rank_]); }

bool TcpTransport::progress() {
  bool moved = false;
  if (newPeers_.load(std::memory_order_acquire))
    for (int p : mux_.takeNewPeers(nonces_[rank_])) moved |= attach(p);
  return StreamTransport::progress() || moved;
}

bool TcpTransport::prepareWait(std::vector<pollfd>& fds, bool anySource) {
  if (newPeers_.load(std::memory_order_acquire)) return false;
  return StreamTransport::prepareWait(fds, anySource);
}

}  // namespace roce::transport::tcp
