// The narrow interface every transport implements (shared memory, TCP and RDMA
// verbs: shm/, tcp/, verbs/ beside this file). Algorithms never see a concrete
// transport: they post Requests through roce::comm::Communicator (csrc/comm/
// communicator.hpp), which routes each peer to the transport that serves it.
//
// Semantics, identical for every transport:
//  * reliable, and FIFO per (peer, tag): the k-th send with a tag matches the
//    k-th receive posted for that tag from that peer;
//  * a message must be received into a buffer of exactly its size; a mismatch
//    fails the receive with a message naming both ranks and sizes;
//  * a message that arrives before its receive is posted is held by the
//    transport (eagerly buffered, or parked at the sender by a rendezvous);
//  * calls come from one thread at a time (the group's progress thread, or a
//    caller running a small collective inline while that thread is parked:
//    Engine::runInline): no locking. What a transport shares with the
//    process's other groups locks inside the shared object.
#pragma once
#include <poll.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "../common/counters.hpp"
#include "../common/error.hpp"
#include "../common/wakeup.hpp"

namespace roce::transport {

// What keeps a request's buffer alive, for transports that hand the buffer to
// the NIC directly (verbs zero copy). `keep` is a reference to the allocation
// (a tensor's c10::Storage, a Communicator scratch block); while a transport's
// registration cache holds it, the memory cannot be freed and reused at the
// same address, so a cached registration can never point at someone else's
// data. Device memory is the exception: `keep` holds it weakly (the torch
// adapter's directOwner says why that is safe there), so that a tensor the
// user dropped goes back to its allocator at once. `id` names the allocation
// (StorageImpl*, block address) and stays the same across operations;
// [base, base + len) is all of it. Empty (keep null): the transport copies
// through its own registered buffers.
struct BufferOwner {
  std::shared_ptr<void> keep;
  const void* id = nullptr;
  char* base = nullptr;
  size_t len = 0;
  // True when nothing but `keep` refers to the allocation any more (the user
  // freed it): the cache may drop it first. Null: only keep.use_count() counts.
  bool (*released)(const void* keep) = nullptr;
  // Device memory (GPUDirect RDMA, docs/ACCELERATORS.md): the CPU must never
  // read or write it, so only a transport that registers it with the NIC
  // (verbs) is given such a buffer, and it moves it by RDMA at every size:
  // never eagerly, never through its staging or landing slots.
  bool device = false;
  // Device memory the NIC should reach through a dma-buf (registered with
  // ibv_reg_dmabuf_mr): exports one for the allocation holding [base, len)
  // on device `deviceIndex` and gives base's offset in it; -1 if it cannot
  // (the transport then registers the pointer, as with peer memory).
  int (*exportDmabuf)(const void* base, size_t len, int deviceIndex, uint64_t* offset) = nullptr;
  int deviceIndex = -1;
  // Device memory: the id of the allocation behind `base` when the owner was
  // made (CUDA's CU_POINTER_ATTRIBUTE_BUFFER_ID; 0: unknown). An allocation
  // object may be given new memory at the same address (a storage resized
  // to 0 and back after the caching allocator released the segment): a
  // registration of the old memory, kept by address, would reach pages that
  // are no longer the tensor's. Ids differ there, so a cached registration is
  // reused only while they match.
  uint64_t bufferId = 0;

  explicit operator bool() const { return keep != nullptr; }
  bool covers(const void* p, size_t n) const {
    auto* c = static_cast<const char*>(p);
    return keep && c >= base && n <= len && static_cast<size_t>(c - base) <= len - n;
  }
};

// Memory a peer exposed for one-sided writes (Transport::expose), as that
// peer described it: opaque to everything above the transport that made it
// (verbs: the address and each rail's rkey). All zero: not exposed.
struct RemoteMemory {
  static constexpr size_t kBytes = 48;
  uint8_t bytes[kBytes] = {};
  bool exposed() const {
    for (uint8_t b : bytes)
      if (b) return true;
    return false;
  }
};

// What keeps memory exposed: peers may write into it until it is destroyed.
class ExposedMemory {
 public:
  virtual ~ExposedMemory() = default;
  virtual RemoteMemory describe() const = 0;
};

struct Request {
  // Write and Read are one-sided: r.buf/len into (out of) the peer's exposed
  // memory (`remote`) at `remoteOffset`; no receive matches them and the
  // peer's CPU takes no part. A write is done once the bytes are in the
  // peer's memory (an acknowledged RDMA write): a message sent after that
  // arrives after them. A read is done once the bytes are in r.buf.
  enum class Kind : uint8_t { Send, Recv, Write, Read };
  Kind kind = Kind::Send;
  int peer = -1;       // group rank
  uint64_t tag = 0;
  void* buf = nullptr;
  size_t len = 0;
  BufferOwner owner;   // optional: what keeps buf alive (set by the Communicator / torch adapter)
  // 0: any path. k > 0: the request belongs to channel k-1 of a collective
  // (ROCE_PG_NCHANNELS); a transport with several paths to a peer keeps each
  // channel on a path of its own (verbs: queue pair (k-1) mod its count).
  uint8_t lane = 0;
  const RemoteMemory* remote = nullptr;  // Write and Read: must stay alive until done
  uint64_t remoteOffset = 0;
  // Set by the transport.
  bool done = false;
  std::string error;   // non-empty once failed (done is then true as well)
  // Failed because the peer ended its side on purpose (it destroyed or aborted
  // the group): often the echo of a failure elsewhere, which the group's
  // lifeline names (Communicator::throwFailure waits a moment for it).
  bool peerEnded = false;

  bool failed() const { return !error.empty(); }
  void fail(const std::string& why, bool byPeerEnding = false) {
    if (!done) { error = why; peerEnded = byPeerEnding; done = true; }
  }
};

// What a pipe throws when its peer ended the stream on purpose (see
// Request::peerEnded); any other failure is a plain Error.
class PeerEndedError : public Error {
 public:
  using Error::Error;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const = 0;
  // The request (and its buffer) must stay alive until request->done.
  virtual void postSend(Request* r) = 0;
  virtual void postRecv(Request* r) = 0;
  // Advances transfers without blocking; returns true if anything moved.
  virtual bool progress() = 0;
  // True if a message with this tag from this peer has arrived (or is arriving)
  // with no receive posted for it: lets recv-from-any-source pick a peer.
  virtual bool hasUnmatched(int peer, uint64_t tag) = 0;
  // Slow-path liveness check, called while a wait has been idle for a while:
  // fails pending requests of a peer that is known to be gone and returns why
  // (empty while every peer is fine).
  virtual std::string checkPeers() { return {}; }
  // Fails every pending request with `why` (abort / shutdown).
  virtual void failAll(const std::string& why) = 0;

  // Connections made on demand (csrc/comm/connection_manager.hpp). A transport
  // whose peers are reached through a TCP connection that may not exist yet
  // (TCP itself; verbs, whose queue pairs are set up over one) queues requests
  // to such a peer and asks for it through needsConnection; the Communicator
  // then hands it the established socket (adoptConnection: owned from then
  // on), or reports that the peer cannot be reached (failPeer).
  virtual bool needsConnection(int peer) const {
    (void)peer;
    return false;
  }
  virtual void adoptConnection(int peer, int fd) {
    (void)peer;
    ::close(fd);  // only transports whose needsConnection() said yes are handed sockets
  }
  virtual void failPeer(int peer, const std::string& why) = 0;

  // Event-driven waiting (the Communicator's idle wait). prepareWait appends
  // the descriptors that become ready when progress() may move something
  // (arming notifications where the device needs it) and returns false when
  // this transport has pending work that no descriptor announces (then the
  // waiter keeps polling instead of blocking). `anySource`: a receive from any
  // peer is pending, so a message arriving unannounced matters too. The caller
  // runs progress() once more after preparing (a completion that landed just
  // before arming raises no event) and calls afterWait() once it woke.
  virtual bool prepareWait(std::vector<pollfd>& fds, bool anySource) {
    (void)fds;
    (void)anySource;
    return false;
  }
  virtual void afterWait() {}
  // After a successful prepareWait: true if a peer may start sending to this
  // rank without any descriptor announcing it (shared-memory rings without a
  // usable doorbell); a blocked wait then wakes every millisecond to drain
  // such traffic, or a sender filling the ring stalls. afterWait() is called
  // after every prepareWait that returned true, also when the wait did not
  // sleep (the re-check found work, or a later transport could not block).
  virtual bool hasSilentPeers() const { return false; }

  // One-sided access (windows). expose registers [base, base + len) for
  // peers' writes and reads and returns what keeps it so, or null when this transport
  // cannot (then peers reach that memory through messages): `why` says why,
  // empty when the transport has no one-sided writes at all.
  // postOneSided carries out a Request of Kind::Write or Kind::Read; only a
  // transport whose expose() succeeded on the target's side is given one.
  virtual std::unique_ptr<ExposedMemory> expose(void* base, size_t len, std::string* why) {
    (void)base;
    (void)len;
    why->clear();
    return nullptr;
  }
  virtual void postOneSided(Request* r) { r->fail(std::string(name()) + " has no one-sided writes or reads"); }

  // GPUDirect RDMA by dma-buf: whether this transport's NIC registers
  // dma-bufs (the provider's answer; only verbs can), and why.
  virtual bool registersDmabuf(std::string* why) const {
    *why = std::string(name()) + " does not take device memory";
    return false;
  }

  // Where copies into or out of staging are counted (set by the Communicator).
  void setCounters(Counters* c) { counters_ = c; }
  // The group's wake-up (set by the Communicator, outlives the transport): a
  // transport whose events arrive on another thread (verbs: the process's
  // completion channel, read by the runtime thread) wakes the group's
  // blocked wait through it.
  void setWakeup(Wakeup* w) { wakeup_ = w; }
  // Asks the group to watch a connected peer's departure for this transport
  // (its lifeline, over the link between the processes: liveness/
  // lifeline.hpp); true if it does, and then failPeer() reports a departure.
  // Verbs then closes the connection's setup socket, which it otherwise
  // keeps only for its EOF. Called on the group's thread.
  void setPeerWatch(std::function<bool(int)> watch) { peerWatch_ = std::move(watch); }

 protected:
  void countCopied(size_t n) {
    if (counters_) Counters::add(counters_->bytesCopied, n);
  }
  Counters* counters() const { return counters_; }
  Wakeup* wakeup() const { return wakeup_; }
  bool watchPeer(int peer) const { return peerWatch_ && peerWatch_(peer); }

 private:
  Counters* counters_ = nullptr;
  Wakeup* wakeup_ = nullptr;
  std::function<bool(int)> peerWatch_;
};

}  // namespace roce::transport
