// A pair: this rank's verbs connection to one peer (as in Gloo's ibverbs
// transport: device, pair, memory region). It owns the connection's queue
// pairs (one per rail in turn, memory_region.hpp), their control rings, the
// side-channel handshake that connects them (endpoints), the control-message
// flow control, and posting on its queue pairs; and it holds the protocol
// state of the messages in flight with that peer, which VerbsTransport
// (matching, landing grants, streaming; verbs_transport.hpp) drives.
// Internal to csrc/transport/verbs/.
#pragma once
#include <cstdint>
#include <infiniband/verbs.h>

#include <array>
#include <deque>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "../../common/counters.hpp"
#include "../transport.hpp"
#include "cq_set.hpp"
#include "memory_region.hpp"
#include "reg_cache.hpp"
#include "verbs_wire.hpp"

namespace roce::transport::verbs {

struct Endpoint;

// What every pair of one transport shares (VerbsTransport fills it once).
struct PairShape {
  int rank = 0;               // this rank, for messages
  int qps = 1;                // queue pairs per connection (the group's groupQueuePairs)
  int sqDepth = 0, rqDepth = 0;
  int cap = 0;                // ROCE_PG_IB_SLOTS: chunks in flight per peer
  size_t slotBytes = 0, stride = 0;  // landing-slot geometry, the same on both ends
  int tc = 0, sl = 0, timeout = 0, retryCnt = 0;
};

struct ActiveSend {
  Request* r;
  uint32_t recvId;  // 0: eager (posted from the announcement queue, not by streamSends)
  uint64_t chunks, posted = 0, done = 0;
  // Eager only: the receive's RTR arrived (kept: a send that then finds no
  // landing credit goes as a rendezvous to that receive); the size mismatch
  // it revealed, if any.
  bool matched = false;
  Ctrl rtr{};
  std::string mismatch;
  // Zero copy (zc non-null): pieces of `piece` bytes go to remoteAddr/rkey.
  RegCache::Entry* zc = nullptr;
  uint64_t piece = 0, remoteAddr = 0;
  std::array<uint32_t, kMaxRails> rkeys{};  // the receive buffer's, per rail of the receiver
};

// A one-sided operation in flight (Request::Kind::Write or Read): pieces of
// `step` bytes go by RDMA WRITE to (or RDMA READ from) the peer's exposed
// memory, each signaled; the request is done once every piece completed
// (the peer's NIC acknowledged the write, or the read's bytes are in).
struct ActiveOneSided {
  Request* r;
  uint32_t id;                 // names its pieces' completions (24 bits)
  // The request's buffer registered; else pieces go through staging slots
  // (a write's copied in before, a read's copied out after).
  RegCache::Entry* zc = nullptr;
  uint64_t remoteAddr = 0;     // where the request's first byte goes
  std::array<uint32_t, kMaxRails> rkeys{};  // the owner's, per rail of the owner
  uint32_t remoteRails = 0;
  uint64_t step = 0, chunks = 0, posted = 0, done = 0;
};

struct Qp {
  ibv_qp* qp = nullptr;
  int rail = 0;                 // our port it is on (index into the transport's rails)
  int remoteRail = 0;           // the peer's port it reaches
  int posted = 0;             // send WRs not yet known complete
  int unsignaled = 0;         // send WRs since the last signaled one
  std::deque<int> covers;     // per signaled WR in flight: WRs it retires
  uint64_t ringNext = 0;      // next entry of this queue pair's send ring (control, zero-copy headers)
  std::vector<ActiveSend*> headerOwner;  // per send-ring entry: the zero-copy send its header ends
  uint32_t maxInline = 0;     // bytes a send may carry inline (IBV_SEND_INLINE); 0: none
};

struct Arrival {
  bool eager;
  uint64_t len;
  std::vector<char> data;  // eager payload, when no receive was waiting
};

class Pair {
 public:
  Pair(int peer, const PairShape& shape, const Rails& rails, Counters* counters)
      : peer_(peer), shape_(shape), rails_(rails), counters_(counters) {}
  ~Pair() { release(); }
  Pair(const Pair&) = delete;
  Pair& operator=(const Pair&) = delete;

  // ---- connection (verbs_pair.cpp) ----
  // Creates the queue pairs (queue pair q on rail q mod rails, its CQ from
  // cqs[rail]) and control rings, and posts the rings' receives.
  void setUp(std::vector<std::unique_ptr<CqSet>>& cqs);
  // Takes the side channel and sends `mine` (this rank's endpoint) on it.
  void startHandshake(int fd, const std::string& endpoint);
  // Non-blocking: writes what is queued, reads what the peer sent, connects
  // the queue pairs once its endpoint is in and becomes ready once the peer
  // says its queue pairs receive. Throws when the peer closed or sent garbage.
  bool advanceHandshake();
  // The queue pairs to the error state: the NIC stops touching this pair's buffers.
  void toError();
  // Destroys the queue pairs, deregisters the rings, closes the side channel.
  void release();
  // Takes the rings' bytes off the group's counters now and stops touching
  // them: the pair outlives its group on the reaper (reaper.hpp).
  void forgetCounters();
  bool ready() const { return phase == Phase::Ready && deadReason.empty(); }
  // ---- posting (verbs_pair.cpp) ----
  void postRecv(int q, int index);
  uint32_t takeRingEntry(Qp& q);
  char* recvBuffer(int q, uint32_t index) const {
    return ctrlMem + (static_cast<size_t>(q) * shape_.rqDepth + index) * kCtrlBytes;
  }
  char* sendRingEntry(int q, uint32_t entry) const {
    return ctrlMem + (static_cast<size_t>(shape_.qps) * shape_.rqDepth + static_cast<size_t>(q) * shape_.sqDepth +
                      entry) * kCtrlBytes;
  }
  // Control messages, in order on queue pair 0, as far as the peer's credits allow.
  void queueCtrl(const Ctrl& msg);
  bool flushCtrl();
  void postCtrl(Ctrl msg);
  // A signaled send completed: the work requests it covers are done.
  static void retire(Qp& q);
  VerbsDevice& railOf(const Qp& q) const { return *rails_[q.rail]; }
  std::string failureText(const ibv_wc& wc) const;

  // Connection: no socket yet -> handshake over the socket (endpoints) ->
  // our queue pairs are ready, waiting for the peer's -> ready (data flows).
  enum class Phase { Unconnected, Handshake, AwaitReady, Ready };
  Phase phase = Phase::Unconnected;
  // The side channel (ConnectionManager's socket). Closed once ready if the
  // group watches the peer's departure (Transport::setPeerWatch), else kept
  // for its EOF.
  int sock = -1;
  bool watchAsked = false;  // the group was asked to watch this peer
  std::string inbuf, outbuf;
  std::vector<Qp> qps;
  std::string deadReason;
  bool deadByEnding = false;  // the peer ended its side on purpose (Request::peerEnded)
  std::string remoteGid;  // the peer's GIDs, one per rail, for messages
  uint32_t remoteQpn0 = 0;
  uint32_t localPsn = 0;  // our send PSN, published to the peer as its receive PSN
  int mtu = 0;
  // Control memory registered for this peer: per queue pair a receive ring
  // (rq entries) and a send ring (sq entries) of 64-byte buffers.
  char* ctrlMem = nullptr;
  MemoryRegion ctrlMrs;  // registered on every rail
  size_t ctrlBytes = 0;
  // The peer's landing slots we may write (its credits: where each is, and
  // its rkey per rail of the peer; a queue pair uses its remoteRail's).
  struct RemoteSlot {
    uint32_t id;  // the immediate
    uint64_t addr;
    std::array<uint32_t, kMaxRails> rkey;
  };
  std::deque<RemoteSlot> remoteFree;
  std::unordered_set<uint32_t> remoteHeld;  // ids in remoteFree (a duplicate CREDIT is an error)
  void addCredit(uint32_t id, uint64_t addr, const uint32_t* rkeys, size_t rails);
  // Our landing slots this peer holds: granted and not yet consumed; of
  // them, reserved ones (at most one: landing_pool.hpp).
  int granted = 0;
  int reservedHeld = 0;
  // Control-message flow control: SENDs on QP 0 each consume one of the peer's
  // posted receives, so we send only while we hold credits for them (no RNR).
  int ctrlCredits = 0;
  int ctrlCreditsMax = 0;
  uint32_t ctrlToReturn = 0;  // our control receives re-posted, not yet reported
  // Sender side matching: per tag, sends in posting order still waiting for
  // their receive's RTR (the k-th RTR belongs to the k-th send). An eager send
  // waits too, although its data may be gone already: the RTR carries the
  // receive's size, and the send completes (or fails on a size mismatch, as a
  // rendezvous send does) only once both its write and the RTR are in.
  struct WaitingSend {
    Request* r;
    ActiveSend* eager;  // non-null for an eager send (in `active`)
  };
  std::unordered_map<uint64_t, std::deque<WaitingSend>> sendsWaiting;
  std::unordered_map<uint64_t, std::deque<Ctrl>> rtrsWaiting;
  std::list<ActiveSend> active;
  // What announces each send to the receiver, in posting order on QP 0: an
  // RTS for a rendezvous send, the data itself for an eager one. The receiver
  // pairs these with its receives per tag in the same order, so they must not
  // overtake each other (other control messages may pass them).
  struct Announcement {
    Ctrl rts;
    ActiveSend* eager = nullptr;  // non-null: the eager send to write (in `active`)
  };
  std::deque<Announcement> announcements;
  // Receiver side.
  struct RecvState {
    Request* r;
    uint64_t expected;          // chunks (pieces in zero-copy mode); 0 until the mode is known
    uint64_t got;
    std::vector<bool> seen;     // per chunk: a duplicate would complete the receive with a hole
    RegCache::Entry* zc = nullptr;  // zero copy offered: the receive buffer's registration
    uint64_t piece = 0;             // zero-copy piece size announced in the RTR
    int mode = 0;                   // 0: not yet known (zero copy offered), 1: copy, 2: zero copy
  };
  std::unordered_map<uint32_t, RecvState> recvs;
  // Pairing per tag, k-th announcement with k-th receive: what arrived with no
  // receive posted yet (an RTS, or an eager message copied out of its landing
  // slot), and receives posted with no announcement yet.
  std::unordered_map<uint64_t, std::deque<Arrival>> arrivals;
  std::unordered_map<uint64_t, std::deque<uint32_t>> unannounced;
  uint32_t nextRecvId = 1;
  std::deque<Ctrl> ctrlQueue;
  uint32_t nextQp = 0;
  // One-sided writes and reads to this peer, in posting order.
  std::list<ActiveOneSided> oneSided;
  uint32_t nextOneSidedId = 1;

 private:
  void connect(const Endpoint& e);

  const int peer_;
  // Copies, not references to the transport's: a broken group's pairs are
  // released after the transport is gone (reaper.hpp).
  const PairShape shape_;
  const Rails rails_;
  Counters* counters_;
};

}  // namespace roce::transport::verbs
