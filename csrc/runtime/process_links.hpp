// One TCP connection per peer process, shared by the lifelines of every
// group of the process: a group opens no sockets of its own for liveness,
// so an extra group costs no descriptor per peer. The lifelines of a 3-D parallel job's many groups run
// between the same few processes; each group's records (heartbeat, BYE,
// FAIL, state, settings: liveness/lifeline.hpp) travel as records tagged
// with the destination group's nonce, the key its process knows the group
// by, and the sender's group rank and nonce.
//
// Links:
//   * a process dials a peer process the first time one of its groups has a
//     lifeline to it and no open link to that process exists, and says who
//     it is (its process key: host id, advertised address and listener
//     port); the peer's front desk hands the connection here (LinkKind::Process).
//     Of two processes only the one with the smaller key dials, so one link
//     joins a pair. The other's link is pending until that dial arrives: its
//     groups' records wait in the link's queue and go out once the accepted
//     socket is moved into it. After 2 s it dials the peer itself (without
//     blocking): the peer may create the group much later, or have failed or
//     died before dialing. A refusal closes the link (the process is gone);
//     a connection carries the queued records, which the peer answers with
//     GONE if its group failed;
//   * either end sends on its one link to the other process and reads every
//     link (two threads of the smaller side dialing at once make a second
//     one, which is only read from);
//   * a link lives as long as both processes: its EOF means the process on
//     the other end is gone (it never closes one on purpose), and every
//     group with a lifeline over it judges that (a BYE first says the group
//     left on purpose).
// Records for a group this process has not created yet are kept until it
// does (a subgroup formed from its parent is created at different moments
// on different ranks). One for a group it closed, or whose creation failed
// here, is answered with GONE (record::kGroupGone), so a neighbour whose records
// reach a live process where the group no longer exists stops waiting for
// it at once.
//
// Lifelines never get callbacks from here: they pull their records and look
// at the links' state in their tick() on the runtime thread, so no lock is
// held across the two. Everything here is thread-safe.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "../common/backoff.hpp"
#include "../common/config.hpp"
#include "process_runtime.hpp"

namespace roce::runtime {

class FrontDesk;
class Mailbox;
struct TcpEndpoint;

// What the front desk routes process links by: no group nonce (a random
// 64-bit value) is expected to take it.
constexpr uint64_t kProcessLinksKey = 0x70726f636c696e6bULL;  // "proclink"
// The lifeline's record types (liveness/lifeline.cpp says what each
// carries), in one place: the links count heartbeats and state records when
// they park them, and answer GONE themselves. GONE is the answer to a record
// for a group that is gone here: it names the sender's nonce as its
// destination and the gone group's as its source (no rank: matched by nonce).
namespace record {
enum Type : uint16_t { kHeartbeat = 1, kBye = 2, kFail = 3, kState = 4, kSettings = 5, kGroupGone = 0x102 };
}  // namespace record

struct LinkRecord {
  uint16_t type;
  int32_t srcRank;    // the sender's rank in the group
  uint64_t srcNonce;  // the sender's nonce for the group
  int link;           // where it came from
  std::string text;
};

class ProcessLinks : public RuntimeService {
 public:
  ProcessLinks(ProcessRuntime& runtime, FrontDesk& desk);
  ~ProcessLinks() override;

  // The process's key as peers name it (see above).
  static std::string processKey(const std::string& hostId, const std::string& host, int port);

  // The link to send on to the process `peerKey`: an open one, else one
  // dialed now to `ep` when `selfKey` < `peerKey` (blocking until
  // `deadline`; `probe` as for dialRank; the link's first record names
  // `selfKey`), else a pending one that the peer's dial completes.
  int linkTo(const std::string& peerKey, const std::string& selfKey, const TcpEndpoint& ep, int peerRank,
             Clock::time_point deadline, const std::function<void()>& probe);
  // The same without blocking: an open link, else a pending one whose dial
  // (by the side that would dial) starts on the runtime thread at once. A
  // dial refused (the peer process is gone) closes it. For a thread that must
  // not wait (a group's progress thread in an operation).
  int linkSoon(const std::string& peerKey, const std::string& selfKey, const TcpEndpoint& ep, int peerRank);
  // Queues a record, sent at once as far as the socket takes it. A
  // `droppable` one (a heartbeat) is skipped while the link is backed up.
  void send(int link, uint64_t dstNonce, uint64_t srcNonce, int srcRank, uint16_t type, const std::string& text,
            bool droppable = false);
  // Waits up to `bound` for the link to take what is queued (a group's last words).
  void flush(int link, std::chrono::milliseconds bound);

  // Records naming `nonce` are kept for take() from now on (those that came
  // before are handed over); after close(), dropped.
  void open(uint64_t nonce);
  // The group `nonce` has `ranks` ranks, until close(nonce): the links this
  // process may hold under names its groups never linked to follow the
  // ranks of its groups (twice their sum), not a fixed count, so that a
  // large group's peers who dial before this side asks for them are taken.
  void countGroup(uint64_t nonce, size_t ranks);
  void close(uint64_t nonce);
  std::vector<LinkRecord> take(uint64_t nonce);
  // Reads every link now (a lifeline about to judge a silent peer: this
  // thread may not have run for a while).
  void readNow();

  // Whether a record read on `recordLink` came from the process that
  // `peerLink` leads to (the same link, or another naming the same process):
  // a lifeline takes a peer's records only from its own process, so a
  // connection naming some other process cannot speak for it. Counted when
  // not (recordsMisrouted in parkedStats).
  bool cameFrom(int recordLink, int peerLink);

  // False once the link closed: `err` is its errno (0: EOF), `corrupted`
  // says it carried garbage, and `refusedWhy` (if given) why the peer
  // refused the name this side dialed with ("" if it did not).
  bool isOpen(int link, int* err, bool* corrupted, std::string* refusedWhy = nullptr) const;
  // When the link last delivered bytes (any group's: the peer process's
  // runtime thread is running, so its lifelines are).
  Clock::time_point lastRead(int link) const;
  // Bumped whenever a link closes: a lifeline looks at its links only then.
  uint64_t closures() const;
  size_t openLinks() const;
  // Records kept for groups not created here yet, within the process's
  // budget (process_links.cpp), and those dropped over it (a flood from
  // someone who can reach the listener, or a group created very late).
  // Also the links held (open, and closed ones kept a while) and those
  // refused: over the unidentified limit, records before the process's
  // name, no name in time, or a name no group here expects over the limit
  // on those; and the records a lifeline refused for coming from another
  // process than the rank they name (cameFrom).
  struct ParkedStats {
    size_t groups = 0, bytes = 0;
    uint64_t dropped = 0;
    uint64_t parkedEver = 0;  // records kept for a group not created yet, since the process began
    uint64_t overBudget = 0;  // of `dropped`, those over a budget (bytes, groups), not duplicates or extra heartbeats
    size_t links = 0;
    uint64_t linksRefused = 0;
    uint64_t recordsMisrouted = 0;
    uint64_t recordsForged = 0;  // records whose MAC was not the job secret's (each closed its link)
  };
  ParkedStats parkedStats() const;

  Clock::time_point tick(Clock::time_point now) override;
  void addPollFds(std::vector<pollfd>& fds) override;
  void polled(const pollfd* fds, size_t n) override;

 private:
  struct Link;
  struct Parked {
    Clock::time_point since;
    std::vector<LinkRecord> records;
    size_t beats = 0;  // heartbeats among them
    size_t bytes = 0;  // what they cost against NetworkBudgets::parkedRecordBytes
    size_t othersBytes = 0;  // of them, what came on links no group here asked for (the others' half)
    bool openedByOther = false;  // parked first by such a link: one of the others' half of the groups
    std::set<std::tuple<uint16_t, int32_t, uint64_t>> lastWords;  // BYE, FAIL, SETTINGS kept: (type, rank, nonce)
  };
  // Erases a parked group, giving its bytes back to the budget.
  std::unordered_map<uint64_t, Parked>::iterator unpark(std::unordered_map<uint64_t, Parked>::iterator it);  // under mu_
  void adoptArrivals();                         // under mu_
  int addPending(const std::string& peerKey, const std::string& selfKey, const TcpEndpoint& ep, int peerRank,
                 Clock::time_point since);      // under mu_
  void readLink(Link& l);                       // under mu_
  void parse(Link& l);                          // under mu_
  void closeLink(Link& l, int err, bool corrupted);  // under mu_
  void sendQueued(Link& l);                     // under mu_
  void keep(Link& from, uint64_t nonce, LinkRecord r);  // under mu_
  void answerGone(Link& from, const LinkRecord& r, uint64_t nonce);  // under mu_
  // Whether one more link may name `key`: always one a group here asked
  // for, others only while fewer than NetworkBudgets::unexpectedLinks (or
  // twice the ranks of this process's groups) are open (under mu_).
  bool mayName(const std::string& key) const;
  const std::string* keyOf(int link) const;  // under mu_: an open, closed or erased link's name (null: none)
  static std::string identityRecord(const std::string& selfKey);
  // The local address a dial to `ep` leaves from ("": any).
  static std::string dialSource(const std::string& selfKey, const TcpEndpoint& ep);
  // Closes an accepted link whose name does not fit where it came from,
  // telling its dialer why.
  void refuseName(Link& l, const std::string& why);  // under mu_
  void startPendingDial(Link& l, Clock::time_point now);   // under mu_
  void finishPendingDial(Link& l, Clock::time_point now);  // under mu_
  void enqueue(Link& l, uint64_t dstNonce, uint64_t srcNonce, int srcRank, uint16_t type,
               const std::string& text);  // under mu_

  ProcessRuntime& runtime_;
  FrontDesk& desk_;
  std::shared_ptr<Mailbox> mailbox_;  // inbound links, from the front desk
  const NetworkBudgets budgets_;
  mutable std::mutex mu_;
  std::map<int, std::unique_ptr<Link>> links_;   // by id; closed ones keep their reason
  std::unordered_map<std::string, int> sendOn_;  // process key -> the link this side sends on
  std::unordered_set<std::string> wanted_;        // process keys a group of this process linked to
  std::unordered_map<uint64_t, size_t> groupRanks_;  // countGroup's, by nonce
  size_t ranksCounted_ = 0;                          // their sum
  // Keys of links erased a while after they closed, for cameFrom (bounded).
  std::unordered_map<int, std::string> erasedKeys_;
  int nextId_ = 1;
  uint64_t closures_ = 0;
  std::unordered_map<uint64_t, std::vector<LinkRecord>> inbox_;  // open nonces
  std::unordered_map<uint64_t, Parked> parked_;                  // nonces not open yet
  size_t parkedBytes_ = 0;
  size_t othersParkedBytes_ = 0;   // of parkedBytes_, what links no group here asked for parked
  size_t othersParkedGroups_ = 0;  // groups such links parked first
  uint64_t parkedDropped_ = 0;
  uint64_t parkedEver_ = 0;
  uint64_t droppedOverBudget_ = 0;
  uint64_t linksRefused_ = 0;
  uint64_t recordsMisrouted_ = 0;
  uint64_t recordsForged_ = 0;
  std::unordered_set<uint64_t> closed_;
  std::set<std::pair<uint64_t, uint64_t>> goneAnswered_;  // (gone group's nonce, asker's nonce)
  std::vector<int> polledLinks_;  // the links addPollFds() listed, in order (runtime thread)
  Clock::time_point nextParkCheck_{};
};

}  // namespace roce::runtime
