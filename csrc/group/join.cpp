#include "join.hpp"

#include <arpa/inet.h>
#include <cstdint>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sstream>
#include <thread>

#include "../common/backoff.hpp"
#include "../common/bootstrap.hpp"
#include "../common/config.hpp"
#include "../common/sockets.hpp"
#include "../common/error.hpp"
#include "../common/hex.hpp"
#include "../common/parse.hpp"
#include "../runtime/connect.hpp"
#include "../runtime/front_desk.hpp"
#include "../runtime/process_runtime.hpp"

namespace roce::group {
using namespace roce::runtime;

namespace {

constexpr const char* kLeaderKey = "roce/leader";
constexpr uint32_t kMaxInfoBytes = 64 * 1024;
// Stale: the joiner named an earlier incarnation. Version: the join's
// versions are not the leader's; the leader's two versions (uint16 each)
// follow, and the leader's formation fails.
enum Reply : char { kAccepted = 'A', kStale = 'S', kVersion = 'V' };

// The versions this process forms with: the join's (which covers the RankInfo
// text and the leader record) and the data connections' hello.
struct Protocol {
  uint16_t join = kJoinVersion, hello = kHelloVersion;
  bool operator==(const Protocol&) const = default;
  std::string text() const { return str(join, ".", hello); }
};

// ROCE_PG_TEST_FAULT=next_protocol: this rank forms as a build one join version newer would.
Protocol protocolOf(const Config& cfg) {
  Protocol p;
  if (cfg.testNextProtocol) p.join = kJoinVersion + 1;
  return p;
}

// Fails a formation among roce_pg builds that cannot form a group together;
// `others` says who runs what ("rank 3 runs roce_pg formation protocol 3.5").
[[noreturn]] void throwVersionsDiffer(int rank, const std::string& others, const Protocol& mine) {
  throwInvalid(str("roce process group init on rank ", rank, ": ", others, "; this rank runs ", mine.text(),
                   " (join.hello versions). Every rank of a job must run the same roce_pg build: compare "
                   "`pip show roce_pg` on each machine and install one version everywhere"));
}

// A joiner that connected but does not finish its message within this long
// is dropped (the leader never waits on one connection).
constexpr auto kJoinMessageDeadline = std::chrono::seconds(30);
// How long a joiner waits for the leader to answer before trying again.
constexpr auto kReplyWait = std::chrono::seconds(5);
constexpr auto kConnectAttempt = std::chrono::seconds(2);
// How often the leader says whom it still waits for (for the others' timeout messages).
constexpr auto kProgressEvery = std::chrono::seconds(2);

std::string rosterKey(const std::string& inc) { return str("roce/", inc, "/roster"); }
std::string waitingKey(const std::string& inc) { return str("roce/", inc, "/waiting"); }

std::string errorRecord(const Error& e) { return str("error ", static_cast<int>(e.kind()), "\n", e.what()); }

// ---- the leader ---------------------------------------------------------------

struct LeaderRecord {
  std::string hostId, tcpHost;
  int port = 0;
  uint64_t nonce = 0;
  int pid = 0;
  // The leader's versions; a record of join version 1 has none (then 0.0).
  // Fields after them are allowed (a later version's).
  Protocol protocol{0, 0};
  std::string encode() const {
    return str(hostId, "\t", tcpHost, "\t", port, "\t", nonce, "\t", pid, "\t", protocol.join, ".", protocol.hello);
  }
  static bool decode(const std::string& s, LeaderRecord& out) {
    std::istringstream in(s);
    std::string port, nonce, pid, versions;
    uint64_t v = 0;
    if (!std::getline(in, out.hostId, '\t') || !std::getline(in, out.tcpHost, '\t') || !std::getline(in, port, '\t') ||
        !std::getline(in, nonce, '\t') || !std::getline(in, pid, '\t'))
      return false;
    if (!parseU64(port, 1, 65535, v)) return false;
    out.port = static_cast<int>(v);
    if (!parseU64(pid, 1, INT32_MAX, v)) return false;
    out.pid = static_cast<int>(v);
    // Later versions may append fields after this one.
    if (std::getline(in, versions, '\t')) {
      const size_t dot = versions.find('.');
      uint64_t join = 0, hello = 0;
      if (dot == std::string::npos || !parseU64(versions.substr(0, dot), 1, UINT16_MAX, join) ||
          !parseU64(versions.substr(dot + 1), 1, UINT16_MAX, hello))
        return false;
      out.protocol = Protocol{static_cast<uint16_t>(join), static_cast<uint16_t>(hello)};
    }
    return parseU64(nonce, 0, UINT64_MAX, out.nonce);
  }
  std::string describe() const { return str("rank 0 (host ", tcpHost, ", pid ", pid, ")"); }
};

// One joiner's connection to the leader, read without blocking (`buf`
// starts with the header the front desk read).
struct Pending {
  UniqueFd fd;
  std::string buf;
  Clock::time_point since = Clock::now();
};

// Takes what `p` sent: true when it is done with (joined, stale or garbage).
// A join of other versions is answered with ours and counts as heard from,
// its versions added to `mismatched`: the formation fails once every rank
// was heard from (failing at once would leave the ranks that have not
// joined yet retrying a closed listener until their timeout).
bool takeJoin(Pending& p, const RankInfo& me, const Protocol& mine, int size, std::vector<RankInfo>& infos,
              std::vector<bool>& have, std::string& mismatched) {
  char tmp[4096];
  for (;;) {
    const ssize_t n = recv(p.fd.get(), tmp, sizeof(tmp), MSG_DONTWAIT);
    if (n > 0) {
      p.buf.append(tmp, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) break;
    return true;  // closed before finishing: not a joiner (or it gave up)
  }
  if (p.buf.size() < sizeof(JoinHeader)) return Clock::now() - p.since > kJoinMessageDeadline;
  JoinHeader h;
  std::memcpy(&h, p.buf.data(), sizeof(h));
  if (h.magic != kJoinMagic || h.rank <= 0 || h.rank >= size) return true;  // not one of ours: dropped quietly
  if (const Protocol theirs{h.version, h.helloVersion}; !(theirs == mine)) {
    char r[5] = {kVersion};
    std::memcpy(r + 1, &mine.join, 2);
    std::memcpy(r + 3, &mine.hello, 2);
    (void)!send(p.fd.get(), r, sizeof(r), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (!have[h.rank] && mismatched.size() < 2000)
      mismatched += str(mismatched.empty() ? "" : ", ", "rank ", h.rank, " runs roce_pg formation protocol ",
                        theirs.text());
    have[h.rank] = true;
    return true;
  }
  if (h.infoLen > kMaxInfoBytes) return true;
  if (h.leaderNonce != me.nonce) {
    // It read an earlier incarnation's record that named this same address.
    const char r = kStale;
    (void)!send(p.fd.get(), &r, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
    return true;
  }
  if (p.buf.size() < sizeof(h) + h.infoLen) return Clock::now() - p.since > kJoinMessageDeadline;
  // The latest joiner of a rank wins: an earlier process that joined and then
  // died was replaced; if both live, the earlier one finds another process in
  // its roster entry and fails (joinGroup's check of its own roster entry).
  infos[h.rank] = RankInfo::decode(p.buf.substr(sizeof(h), h.infoLen), h.rank);
  have[h.rank] = true;
  const char r = kAccepted;
  (void)!send(p.fd.get(), &r, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
  return true;
}

// refusedBefore: the desk's count of unsigned connections before the leader
// published its address (joiners signing with another secret never reach
// the mailbox).
std::vector<RankInfo> gatherAtLeader(Bootstrap& store, Mailbox& mailbox, int size, const RankInfo& me,
                                     const Protocol& mine, const std::string& inc, Clock::time_point deadline,
                                     std::chrono::milliseconds timeout, uint64_t refusedBefore) {
  std::vector<RankInfo> infos(size);
  std::vector<bool> have(size, false);
  infos[0] = me;
  have[0] = true;
  std::vector<Pending> pending;
  std::vector<pollfd> fds;
  std::string mismatched;
  const FrontDesk& desk = ProcessRuntime::get().desk();
  auto missing = [&] {
    std::string m;
    for (int r = 0; r < size && m.size() < 2000; ++r)
      if (!have[r]) m += str(m.empty() ? "" : ", ", "rank ", r);
    return m;
  };
  Clock::time_point nextProgress = Clock::now() + kProgressEvery;
  while (std::find(have.begin(), have.end(), false) != have.end()) {
    store.checkCancelled();
    if (Clock::now() >= deadline)
      throwTimeout(str("roce process group init on rank 0 timed out after ", timeout.count(), " ms; still waiting for ",
                       missing(), " (not joined the group). Check that every rank started and reached the same "
                       "call, or raise the timeout of init_process_group/new_group",
                       mismatched.empty() ? "" : str(". Also, ", mismatched, " (this rank runs ", mine.text(),
                                                     "): every rank must run the same roce_pg build"),
                       desk.unauthenticated() == refusedBefore
                           ? ""
                           : str(". Meanwhile this process refused ", desk.unauthenticated() - refusedBefore,
                                 " connection(s) not signed with its job secret: if they were ranks of this "
                                 "group, ROCE_PG_JOB_SECRET must be the same on every rank, or unset on all")));
    if (Clock::now() >= nextProgress) {
      store.set(waitingKey(inc), missing());  // the others name these in their own timeout messages
      nextProgress = Clock::now() + kProgressEvery;
    }
    fds.assign(1, pollfd{mailbox.fd(), POLLIN, 0});
    for (auto& p : pending) fds.push_back(pollfd{p.fd.get(), POLLIN, 0});
    poll(fds.data(), fds.size(), static_cast<int>(std::clamp(msLeft(deadline), 1LL, 100LL)));
    for (Arrival& a : mailbox.takeAll())
      if (a.kind == LinkKind::Join) pending.push_back(Pending{std::move(a.fd), std::move(a.head)});
    pending.erase(std::remove_if(pending.begin(), pending.end(),
                                 [&](Pending& p) { return takeJoin(p, me, mine, size, infos, have, mismatched); }),
                  pending.end());
  }
  if (!mismatched.empty()) throwVersionsDiffer(0, mismatched, mine);
  return infos;
}

// ---- the other ranks ------------------------------------------------------------

enum class Attempt { Joined, Stale, Retry };

// Where this rank reaches the leader `rec` (loopback on the same host).
TcpEndpoint leaderEndpoint(const LeaderRecord& rec, const RankInfo& me) {
  return TcpEndpoint{rec.hostId == me.hostId ? std::string(kLoopbackAddress) : rec.tcpHost, rec.port};
}

// Blocking, bounded: connect to the leader `rec`, send the join, read the answer.
Attempt tryJoin(const LeaderRecord& rec, const RankInfo& me, const Protocol& mine, int rank,
                const std::string& infoText, std::string& why) {
  const TcpEndpoint ep = leaderEndpoint(rec, me);
  UniqueFd fd = startDial(ep, 0);
  pollfd p{fd.get(), POLLOUT, 0};
  if (poll(&p, 1, static_cast<int>(std::chrono::milliseconds(kConnectAttempt).count())) <= 0) {
    why = "the connection to rank 0 timed out";
    return Attempt::Retry;
  }
  if (const int err = connectResult(fd.get()); err != 0) {
    why = str("rank 0's address ", ep.host, ":", ep.port, ": ", std::strerror(err));
    // Refused: no listener there, so the record is an earlier incarnation's.
    return err == ECONNREFUSED ? Attempt::Stale : Attempt::Retry;
  }
  setNonBlocking(fd.get(), false);
  timeval tv{static_cast<time_t>(std::chrono::seconds(kReplyWait).count()), 0};
  setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  const JoinHeader h{kJoinMagic, mine.join, mine.hello, rank, static_cast<uint32_t>(infoText.size()), rec.nonce};
  // Signed where the leader's desk expects it: a join of this build's version
  // (ROCE_PG_TEST_FAULT=next_protocol joins as a newer build would, unsigned).
  std::string msg;
  if (h.version == kJoinVersion) {
    const auto s = signHead(h);
    msg.assign(reinterpret_cast<const char*>(&s), sizeof(s));
  } else {
    msg.assign(reinterpret_cast<const char*>(&h), sizeof(h));
  }
  msg += infoText;
  if (send(fd.get(), msg.data(), msg.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(msg.size())) {
    why = "rank 0 closed the connection";
    return Attempt::Retry;
  }
  char reply = 0;
  ssize_t n = recv(fd.get(), &reply, 1, 0);
  // Closed with our rank info unread (the desk refused the join header): a reset.
  if (n < 0 && errno == ECONNRESET) n = 0;
  if (n == 1 && reply == kAccepted) return Attempt::Joined;
  if (n == 1 && reply == kVersion) {
    Protocol theirs = rec.protocol;
    char v[4];
    if (recv(fd.get(), v, sizeof(v), MSG_WAITALL) == sizeof(v)) {
      std::memcpy(&theirs.join, v, 2);
      std::memcpy(&theirs.hello, v + 2, 2);
    }
    throwVersionsDiffer(rank, str(rec.describe(), " runs roce_pg formation protocol ", theirs.text()), mine);
  }
  if (n == 1 && reply == kStale) {
    why = "an earlier incarnation's rank 0 record";
    return Attempt::Stale;
  }
  // A live leader of join version 1 (its record names no versions) closes a
  // join of any other version without an answer: retrying would never end.
  // (A dead one's record refuses the connection above: stale, as before.)
  if (n == 0 && rec.protocol.join == 0)
    throwVersionsDiffer(rank,
                        str(rec.describe(), " runs roce_pg formation protocol 1 (an older roce_pg: its address "
                                            "record names no versions)"),
                        mine);
  why = n == 0 ? "rank 0 closed the connection without answering: a record of an earlier incarnation, or rank 0 "
                 "holds another job secret (ROCE_PG_JOB_SECRET set differently on the ranks)"
               : "rank 0 did not answer";
  return n == 0 ? Attempt::Stale : Attempt::Retry;
}

LeaderRecord joinLeader(Bootstrap& store, const RankInfo& me, const Protocol& mine, int rank,
                        Clock::time_point deadline, std::chrono::milliseconds timeout) {
  const std::string infoText = me.encode();
  const std::string what = str("roce process group init on rank ", rank);
  auto describe = [](size_t) { return std::string("rank 0 (it publishes the group's address)"); };
  std::string text = waitForKeys(store, {kLeaderKey}, deadline, timeout, what, describe)[0];
  std::string stale;  // a record known to be an earlier incarnation's
  auto sleep = std::chrono::milliseconds(10);
  std::string why;
  for (;;) {
    LeaderRecord rec;
    if (text != stale) {
      if (!LeaderRecord::decode(text, rec))
        throwComm(str("rank 0 published a malformed address record '", text.substr(0, 200), "' (mixed roce_pg versions "
                      "across ranks, or another program writing this group's store keys)"));
      const Attempt a = tryJoin(rec, me, mine, rank, infoText, why);
      if (a == Attempt::Joined) return rec;
      if (a == Attempt::Stale) stale = text;
    }
    store.checkCancelled();
    if (Clock::now() >= deadline)
      throwTimeout(str(what, " timed out after ", timeout.count(), " ms joining rank 0 (", why,
                       "). Check that rank 0 started and reached the same call, or raise the timeout of "
                       "init_process_group/new_group"));
    // Wait for a newer record (or retry a busy leader), backing off: every
    // rank may be polling this one key while rank 0 is still starting.
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, std::chrono::milliseconds(500));
    text = store.multiGet({kLeaderKey})[0];
  }
}

}  // namespace

Joined joinGroup(Bootstrap& store, Mailbox& mailbox, int rank, int size, const RankInfo& me, const Config& cfg,
                 Clock::time_point deadline, std::chrono::milliseconds timeout) {
  Joined j;
  if (rank == 0) {
    j.incarnation = hex64(me.nonce);
    const Protocol mine = protocolOf(cfg);
    const uint64_t refusedBefore = ProcessRuntime::get().desk().unauthenticated();
    store.set(kLeaderKey, LeaderRecord{me.hostId, me.tcpHost, me.tcpPort, me.nonce, me.pid, mine}.encode());
    try {
      j.roster = planGroup(
          cfg, gatherAtLeader(store, mailbox, size, me, mine, j.incarnation, deadline, timeout, refusedBefore));
    } catch (const Error& e) {
      // Every rank raises the same verdict; one of rank 0 giving up (its
      // program aborted the forming group) says whose it was.
      store.set(rosterKey(j.incarnation),
                errorRecord(e.kind() == ErrorKind::Aborted ? Error(e.kind(), str("rank 0 stopped forming the group: ",
                                                                                 e.what()))
                                                           : e));
      throw;
    }
    store.set(rosterKey(j.incarnation), j.roster.encode());
    return j;
  }
  const LeaderRecord leader = joinLeader(store, me, protocolOf(cfg), rank, deadline, timeout);
  j.incarnation = hex64(leader.nonce);
  // The leader publishes a verdict even when it times out itself: allow it a
  // moment past our own deadline, so this rank reports its reason.
  const std::string what = str("roce process group init on rank ", rank);
  auto blame = [&](size_t) {
    const std::string waiting = store.check(waitingKey(j.incarnation))
                                    ? store.multiGet({waitingKey(j.incarnation)})[0]
                                    : std::string();
    return waiting.empty() ? std::string("rank 0 (it checks every rank's information)")
                           : str("rank 0, which still waits for ", waiting, " (not joined the group)");
  };
  // A leader that dies after taking our join never publishes: its listener,
  // open until the roster is out, then refuses (probed once per wait slice).
  const TcpEndpoint leaderAt = leaderEndpoint(leader, me);
  auto leaderAlive = [&] {
    if (refusesConnections(leaderAt))
      throwComm(str(what, ": rank 0 (", leaderAt.host, ":", leaderAt.port, ") took this rank's join and then "
                    "stopped listening before publishing the group: it exited or was killed (see its log)"));
  };
  const std::string text = waitForKeys(store, {rosterKey(j.incarnation)}, deadline + std::chrono::seconds(2),
                                       timeout, what, blame, leaderAlive)[0];
  j.roster = Roster::decodeOrThrow(text, size);
  if (j.roster.ranks[rank].nonce != me.nonce || j.roster.ranks[rank].pid != me.pid)
    throwComm(str("rank 0 formed this group with another process in rank ", rank, "'s place (pid ",
                  j.roster.ranks[rank].pid, ", this process is ", me.pid, "): two processes claim rank ", rank,
                  "; check the launcher's RANK assignment"));
  return j;
}

}  // namespace roce::group
