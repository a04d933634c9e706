#include "process_links.hpp"

#include <cstdint>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "../common/config.hpp"
#include "../common/error.hpp"
#include "../common/log.hpp"
#include "../common/sockets.hpp"
#include "connect.hpp"
#include "front_desk.hpp"
#include "link_identity.hpp"
#include "link_record.hpp"

namespace roce::runtime {
namespace {

// A peer process this far behind in reading is hung; its lifelines say so.
// Room for every rank's state record (~150 bytes each) of many thousand
// ranks passing through, in several groups at once.
constexpr size_t kMaxQueued = 16 << 20;
// A heartbeat is skipped only behind this much unsent data: one group's
// burst (a verdict's state records) must not silence the others.
constexpr size_t kHeartbeatBacklog = 256 << 10;
// Records kept for a group this process has not created yet: a member that
// late has timed out its peers anyway (front_desk.cpp parks hellos as long).
constexpr auto kParkLimit = std::chrono::minutes(30);
constexpr size_t kMaxParkedHeartbeats = 64;  // one says the peer is there; the rest add nothing
// Records beyond this are dropped for a group not created yet. BYE, FAIL and
// SETTINGS come once per neighbour: kept once per sender, so that a flood of
// heartbeats and state records cannot push them out.
constexpr size_t kMaxParkedRecords = 4096;
constexpr size_t kMaxParkedGroups = 4096;
// All parked records of the process together, text and bookkeeping, are
// bounded by NetworkBudgets::parkedRecordBytes (16 MiB by default): anyone
// who can reach the listener can send records for groups that do not exist
// (nonces are not checked before the group opens), and nothing else bounds
// what they cost. Legitimately parked records are a few per neighbour
// (~150 bytes each): 16 MiB holds those of ~50,000 ranks.
// Half of that budget, and of kMaxParkedGroups, is kept for the links of
// processes a group here linked to (wanted_): the others (an insider under
// a made-up name; a peer whose group formed before this process's linked to
// it) share the other half, so that a flood from them cannot drop the
// settings and heartbeats of the groups forming with known peers, which
// would wait for them until their timeout. What this does not cover: the
// first records of a process no group here links to yet share the half
// with such a flood; and an insider on a known peer's machine may name that
// peer's process (over loopback any local name fits its address) and so
// park in the known peers' half.
// What a parked record costs besides its text: its vector slot, twice (the
// vector doubles), the text's allocation, and a node of the set of senders'
// last words.
constexpr size_t kParkedRecordOverhead = 2 * sizeof(LinkRecord) + 96;
// An accepted link must name its process (its first record) within this
// long, and at most NetworkBudgets::unnamedLinks may be waiting to: a
// peer's dial sends the name with the hello, so only someone who is not a
// roce process waits. Links naming a process no group here linked to yet
// (NetworkBudgets::unexpectedLinks, or twice the processes the groups here
// link to): a peer whose group formed before this process's dials first,
// so some are expected, but whoever holds the job secret could otherwise
// open links without limit under made-up names.
constexpr auto kIdentifyWithin = std::chrono::seconds(10);
// Refused names are logged up to this many times per process (a flood of
// them is counted in links_refused).
constexpr uint64_t kRefusalsLogged = 8;
// A closed link is kept this long for the lifelines that were heard on it
// (they read its reason right after closures() moves), then erased.
constexpr auto kClosedKeep = std::chrono::seconds(60);
// Erased links' names kept for cameFrom (forgotten all at once when this many).
constexpr size_t kMaxErasedKeys = 1 << 16;
// (gone group, asker) pairs answered: forgotten when this many, so that GONE
// may be answered twice but the set cannot grow without limit.
constexpr size_t kMaxGoneAnswered = 1 << 16;
// A pending link dials the peer itself after this long: the peer may have
// failed or died before its dial, or create the group much later.
constexpr auto kPendingGrace = std::chrono::seconds(2);
constexpr auto kDialAttempt = std::chrono::seconds(5);

}  // namespace

struct ProcessLinks::Link {
  int id;
  int fd;  // -1 while pending: the peer process has not dialed yet
  std::string key;  // the peer process's, once it said (dialed: known from the start)
  std::string source;  // accepted: the address it came from, which its name must fit
  std::string refusedWhy;  // dialed: why the peer refused its name (it closed then)
  std::string inbuf, outbuf;
  bool open = true;
  int err = 0;
  bool corrupted = false;
  Clock::time_point lastRead = Clock::now();
  // Only the process with the smaller key dials. The other's link is
  // pending until that dial arrives: the groups send into its queue, and
  // the accepted socket is moved into it (their link ids stay valid).
  // After kPendingGrace it dials the peer itself, without blocking (the
  // runtime thread): a refusal says the peer's process is gone; a
  // connection carries the queued records, which a live process whose
  // group failed answers with GONE.
  bool pending = false;
  TcpEndpoint ep;
  int peerRank = -1;
  std::string selfKey;
  Clock::time_point pendingSince{};
  int dialFd = -1;  // the pending link's own dial, in progress
  Clock::time_point dialStart{};
  Clock::time_point openedAt = Clock::now();
  Clock::time_point closedAt{};
};

ProcessLinks::ProcessLinks(ProcessRuntime& runtime, FrontDesk& desk)
    : runtime_(runtime), desk_(desk), mailbox_(desk.open(kProcessLinksKey)), budgets_(NetworkBudgets::get()) {}

ProcessLinks::~ProcessLinks() {
  desk_.close(kProcessLinksKey);
  for (auto& [id, l] : links_) {
    if (l->fd >= 0) ::close(l->fd);
    if (l->dialFd >= 0) ::close(l->dialFd);
  }
}

std::string ProcessLinks::processKey(const std::string& hostId, const std::string& host, int port) {
  return str(hostId, "/", host, ":", port);
}

int ProcessLinks::linkTo(const std::string& peerKey, const std::string& selfKey, const TcpEndpoint& ep, int peerRank,
                         Clock::time_point deadline, const std::function<void()>& probe) {
  {
    // Accepted links are adopted, and their identity read, on the runtime
    // thread only.
    std::lock_guard<std::mutex> g(mu_);
    wanted_.insert(peerKey);
    if (auto it = sendOn_.find(peerKey); it != sendOn_.end()) return it->second;
    // The peer process dials when its side of a group needs the link (it
    // may create the group later); this side's records wait until then.
    if (selfKey > peerKey) return addPending(peerKey, selfKey, ep, peerRank, Clock::now());
  }
  UniqueFd fd =
      dialRank(ep, LinkKind::Process, -1, peerRank, 0, kProcessLinksKey, deadline, probe, dialSource(selfKey, ep));
  tuneSocket(fd.get());
  setNonBlocking(fd.get(), true);
  int id;
  {
    std::lock_guard<std::mutex> g(mu_);
    auto l = std::make_unique<Link>();
    l->id = nextId_++;
    l->fd = fd.release();
    l->key = peerKey;
    Link& link = *l;
    links_.emplace(link.id, std::move(l));
    // Another group's thread may have linked the same process meanwhile:
    // both links stay (read from), the first one carries this side's records.
    id = sendOn_.emplace(peerKey, link.id).first->second;
    link.outbuf = identityRecord(selfKey);
    sendQueued(link);
  }
  runtime_.poke();  // watch the new link from the next round on
  return id;
}

int ProcessLinks::linkSoon(const std::string& peerKey, const std::string& selfKey, const TcpEndpoint& ep,
                           int peerRank) {
  int id;
  {
    std::lock_guard<std::mutex> g(mu_);
    wanted_.insert(peerKey);
    if (auto it = sendOn_.find(peerKey); it != sendOn_.end()) return it->second;
    // The side that would dial dials at the runtime thread's next round (a
    // pending link past its grace); the other waits for it as in linkTo.
    const auto since = selfKey < peerKey ? Clock::now() - kPendingGrace : Clock::now();
    id = addPending(peerKey, selfKey, ep, peerRank, since);
  }
  runtime_.poke();
  return id;
}

int ProcessLinks::addPending(const std::string& peerKey, const std::string& selfKey, const TcpEndpoint& ep,
                             int peerRank, Clock::time_point since) {
  auto l = std::make_unique<Link>();
  l->id = nextId_++;
  l->fd = -1;
  l->key = peerKey;
  l->pending = true;
  l->ep = ep;
  l->peerRank = peerRank;
  l->selfKey = selfKey;
  l->pendingSince = since;
  const int id = l->id;
  links_.emplace(id, std::move(l));
  sendOn_.emplace(peerKey, id);
  return id;
}

void ProcessLinks::send(int link, uint64_t dstNonce, uint64_t srcNonce, int srcRank, uint16_t type,
                        const std::string& text, bool droppable) {
  bool backlog;
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = links_.find(link);
    if (it == links_.end() || !it->second->open) return;
    Link& l = *it->second;
    if (droppable && l.outbuf.size() > kHeartbeatBacklog) return;  // the peer is not reading anyway
    enqueue(l, dstNonce, srcNonce, srcRank, type, text);
    backlog = !l.outbuf.empty();
  }
  if (backlog) runtime_.poke();  // the rest goes when the socket polls writable
}

std::string ProcessLinks::dialSource(const std::string& selfKey, const TcpEndpoint& ep) {
  // Over loopback the peer accepts any name of this machine; elsewhere the
  // connection must leave from the address the name holds (link_identity.hpp).
  return ep.host == kLoopbackAddress ? std::string() : keyAddress(selfKey);
}

std::string ProcessLinks::identityRecord(const std::string& selfKey) {
  return encodeRecord(kIdentityRecord, -1, 0, 0, selfKey);
}

void ProcessLinks::startPendingDial(Link& l, Clock::time_point now) {
  try {
    l.dialFd = runtime::startDial(l.ep, l.peerRank, dialSource(l.selfKey, l.ep)).release();
    l.dialStart = now;
  } catch (const Error&) {
    l.pendingSince = now;  // no descriptor now: later
  }
}

void ProcessLinks::finishPendingDial(Link& l, Clock::time_point now) {
  const int err = connectResult(l.dialFd);
  if (err == ECONNREFUSED) {
    // Its listener is open for the process's life: the process is gone.
    closeLink(l, err, false);
    return;
  }
  if (err != 0 || !sendHello(l.dialFd, LinkKind::Process, -1, l.peerRank, 0, kProcessLinksKey)) {
    ::close(std::exchange(l.dialFd, -1));
    l.pendingSince = now;  // unreachable for now: again after the grace
    return;
  }
  tuneSocket(l.dialFd);
  setNonBlocking(l.dialFd, true);
  l.fd = std::exchange(l.dialFd, -1);
  l.pending = false;
  l.lastRead = now;
  l.outbuf.insert(0, identityRecord(l.selfKey));  // first, before what the groups queued
  sendQueued(l);
}

void ProcessLinks::enqueue(Link& l, uint64_t dstNonce, uint64_t srcNonce, int srcRank, uint16_t type,
                           const std::string& text) {
  const std::string record = encodeRecord(type, srcRank, dstNonce, srcNonce, text);
  if (l.outbuf.size() + record.size() > kMaxQueued) return;
  l.outbuf += record;
  sendQueued(l);
}

void ProcessLinks::flush(int link, std::chrono::milliseconds bound) {
  const auto until = Clock::now() + bound;
  for (;;) {
    int fd;
    {
      std::lock_guard<std::mutex> g(mu_);
      auto it = links_.find(link);
      if (it == links_.end() || !it->second->open || it->second->pending) return;
      sendQueued(*it->second);
      if (it->second->outbuf.empty()) return;
      fd = it->second->fd;
    }
    if (Clock::now() >= until) return;  // the peer may be hung
    pollfd p{fd, POLLOUT, 0};
    poll(&p, 1, 10);
  }
}

void ProcessLinks::open(uint64_t nonce) {
  std::lock_guard<std::mutex> g(mu_);
  auto& box = inbox_[nonce];
  if (auto it = parked_.find(nonce); it != parked_.end()) {
    for (auto& r : it->second.records) box.push_back(std::move(r));
    unpark(it);
  }
}

void ProcessLinks::countGroup(uint64_t nonce, size_t ranks) {
  std::lock_guard<std::mutex> g(mu_);
  auto [it, fresh] = groupRanks_.emplace(nonce, ranks);
  if (fresh) ranksCounted_ += ranks;
}

void ProcessLinks::close(uint64_t nonce) {
  std::lock_guard<std::mutex> g(mu_);
  if (auto it = groupRanks_.find(nonce); it != groupRanks_.end()) {
    ranksCounted_ -= it->second;
    groupRanks_.erase(it);
  }
  inbox_.erase(nonce);
  if (auto it = parked_.find(nonce); it != parked_.end()) unpark(it);
  closed_.insert(nonce);
}

std::unordered_map<uint64_t, ProcessLinks::Parked>::iterator ProcessLinks::unpark(
    std::unordered_map<uint64_t, Parked>::iterator it) {
  parkedBytes_ -= it->second.bytes;
  othersParkedBytes_ -= it->second.othersBytes;
  othersParkedGroups_ -= it->second.openedByOther;
  return parked_.erase(it);
}

ProcessLinks::ParkedStats ProcessLinks::parkedStats() const {
  std::lock_guard<std::mutex> g(mu_);
  return {parked_.size(), parkedBytes_, parkedDropped_, parkedEver_, droppedOverBudget_,
          links_.size(), linksRefused_, recordsMisrouted_, recordsForged_};
}

const std::string* ProcessLinks::keyOf(int link) const {
  if (auto it = links_.find(link); it != links_.end()) return it->second->key.empty() ? nullptr : &it->second->key;
  auto it = erasedKeys_.find(link);
  return it == erasedKeys_.end() ? nullptr : &it->second;
}

bool ProcessLinks::cameFrom(int recordLink, int peerLink) {
  std::lock_guard<std::mutex> g(mu_);
  if (recordLink == peerLink) return true;
  // The peer's own link may have closed (and been erased) while another
  // link to the same process carries on.
  const std::string *a = keyOf(recordLink), *b = keyOf(peerLink);
  if (a && b && *a == *b) return true;
  ++recordsMisrouted_;
  return false;
}

bool ProcessLinks::mayName(const std::string& key) const {
  if (wanted_.count(key)) return true;
  const size_t unexpected = static_cast<size_t>(std::count_if(links_.begin(), links_.end(), [&](const auto& e) {
    return e.second->open && !e.second->key.empty() && !wanted_.count(e.second->key);
  }));
  return unexpected < std::max({budgets_.unexpectedLinks, 2 * wanted_.size(), 2 * ranksCounted_});
}

std::vector<LinkRecord> ProcessLinks::take(uint64_t nonce) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = inbox_.find(nonce);
  if (it == inbox_.end()) return {};
  return std::exchange(it->second, {});
}

void ProcessLinks::readNow() {
  std::lock_guard<std::mutex> g(mu_);
  adoptArrivals();
  for (auto& [id, l] : links_)
    if (l->open && !l->pending) readLink(*l);
}

bool ProcessLinks::isOpen(int link, int* err, bool* corrupted, std::string* refusedWhy) const {
  std::lock_guard<std::mutex> g(mu_);
  auto it = links_.find(link);
  if (it == links_.end()) {  // closed long ago, and erased
    *err = 0;
    *corrupted = false;
    return false;
  }
  *err = it->second->err;
  *corrupted = it->second->corrupted;
  if (refusedWhy) *refusedWhy = it->second->refusedWhy;
  return it->second->open;
}

Clock::time_point ProcessLinks::lastRead(int link) const {
  std::lock_guard<std::mutex> g(mu_);
  auto it = links_.find(link);
  return it == links_.end() ? Clock::time_point{} : it->second->lastRead;
}

uint64_t ProcessLinks::closures() const {
  std::lock_guard<std::mutex> g(mu_);
  return closures_;
}

size_t ProcessLinks::openLinks() const {
  std::lock_guard<std::mutex> g(mu_);
  return static_cast<size_t>(std::count_if(links_.begin(), links_.end(), [](const auto& e) { return e.second->open; }));
}

void ProcessLinks::adoptArrivals() {
  for (Arrival& a : mailbox_->takeAll()) {
    if (a.kind != LinkKind::Process) continue;  // closed as `a` goes
    auto l = std::make_unique<Link>();
    l->id = nextId_++;
    tuneSocket(a.fd.get());
    setNonBlocking(a.fd.get(), true);
    l->fd = a.fd.release();
    l->source = peerIp(l->fd);
    Link& added = *links_.emplace(l->id, std::move(l)).first->second;
    readLink(added);  // a roce process's dial carries its name right behind the hello
  }
  // Over the limit, the oldest unnamed links go, not the newest: many peers'
  // dials may land at once, each named a moment later.
  std::vector<Link*> unnamed;
  for (auto& [id, l] : links_)
    if (l->open && l->key.empty() && !l->pending) unnamed.push_back(l.get());
  if (unnamed.size() <= budgets_.unnamedLinks) return;
  std::sort(unnamed.begin(), unnamed.end(), [](const Link* a, const Link* b) { return a->openedAt < b->openedAt; });
  size_t over = unnamed.size() - budgets_.unnamedLinks;
  for (Link* l : unnamed) {
    if (over == 0) break;
    readLink(*l);  // its name may have come since it was adopted
    if (l->open && l->key.empty()) {
      ++linksRefused_;
      closeLink(*l, 0, true);
    }
    if (!l->open || !l->key.empty()) --over;
  }
}

void ProcessLinks::readLink(Link& l) {
  // Records are taken out of the buffer as it fills, and one call reads at
  // most kReadBudget (the poll reports the rest): a peer that writes faster
  // than this thread parses would otherwise grow the buffer without limit
  // and keep the thread from every other link.
  constexpr size_t kParseEvery = 64 << 10, kReadBudget = 1 << 20;
  char buf[4096];
  bool closed = false;
  int err = 0;
  for (size_t taken = 0; taken < kReadBudget;) {
    const ssize_t n = recv(l.fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n > 0) {
      l.inbuf.append(buf, static_cast<size_t>(n));
      l.lastRead = Clock::now();
      taken += static_cast<size_t>(n);
      if (l.inbuf.size() >= kParseEvery) {
        parse(l);
        if (!l.open || l.fd < 0) return;  // corrupted, or handed to the link it completes
      }
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) break;
    closed = true;  // EOF or a reset: the process on the other end is gone
    err = n == 0 ? 0 : errno;
    break;
  }
  // The records first: a group leaving on purpose sends BYE, and its process
  // may exit right after; both arrive before this thread runs.
  parse(l);
  if (closed && l.open) closeLink(l, err, false);
}

void ProcessLinks::parse(Link& l) {
  size_t at = 0;
  RecordHead h;
  std::string_view view;
  while (l.open) {
    const RecordParse got = nextRecord(l.inbuf, at, h, view);
    if (got == RecordParse::Forged) {
      // Past a signed head, only someone without the secret who got into
      // the connection sends these.
      if (recordsForged_++ == 0)
        ROCE_WARN("roce: closed a process link", l.key.empty() ? std::string() : str(" to ", l.key),
                  ": a record on it was not signed with the job secret (bytes injected into the connection?)");
      closeLink(l, 0, true);
      return;
    }
    if (got == RecordParse::Corrupt) {
      closeLink(l, 0, true);
      return;
    }
    if (got == RecordParse::Partial) break;  // the rest is still on its way
    std::string text(view);
    if (h.type == kIdentityRecord) {
      // A link is named once, by its dialer, and never with nothing.
      if (!l.key.empty() || text.empty()) {
        ++linksRefused_;
        closeLink(l, 0, true);
        return;
      }
      if (!mayName(text)) {
        refuseName(l, str("it names ", text, ", a process none of this process's groups knows, while as many such "
                          "links are open as this process takes (ROCE_PG_NET_UNEXPECTED_LINKS, or twice the ranks of "
                          "its groups)"));
        return;
      }
      if (std::string why = nameMismatch(text, l.source, isLocalAddress); !why.empty()) {
        refuseName(l, why);
        return;
      }
      l.key = text;
      auto it = sendOn_.find(text);
      auto named = it == sendOn_.end() ? links_.end() : links_.find(it->second);
      if (named == links_.end()) {
        sendOn_[text] = l.id;  // this side's records go on it too
      } else if (Link& p = *named->second; p.pending) {
        // The dial this side's groups waited for: the socket moves into the
        // link they hold; what follows the identity is read there.
        if (p.dialFd >= 0) ::close(std::exchange(p.dialFd, -1));  // its own dial is not needed
        p.fd = std::exchange(l.fd, -1);
        p.pending = false;
        p.lastRead = l.lastRead;
        p.inbuf = l.inbuf.substr(at);
        l.inbuf.clear();
        l.open = false;  // an empty husk, not a closure: nobody holds its id
        sendQueued(p);
        parse(p);
        return;
      }
    } else if (h.type == kRefusedRecord && l.source.empty()) {
      // The peer refused the name this side dialed with: its lifelines say why.
      l.refusedWhy = text;
      closeLink(l, 0, false);
      return;
    } else if (l.key.empty()) {
      // Every roce process names itself first on the links it dials.
      ++linksRefused_;
      closeLink(l, 0, true);
      return;
    } else {
      keep(l, h.dstNonce, LinkRecord{h.type, h.srcRank, h.srcNonce, l.id, std::move(text)});
    }
  }
  l.inbuf.erase(0, at);
}

void ProcessLinks::refuseName(Link& l, const std::string& why) {
  ++linksRefused_;
  if (linksRefused_ <= kRefusalsLogged)
    ROCE_WARN("roce: refused a process link: ", why);
  // Its last record says why, as far as the socket takes it at once.
  const std::string record = encodeRecord(kRefusedRecord, -1, 0, 0, why);
  (void)!::send(l.fd, record.data(), record.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  closeLink(l, 0, true);
}

void ProcessLinks::keep(Link& from, uint64_t nonce, LinkRecord r) {
  if (auto it = inbox_.find(nonce); it != inbox_.end()) {
    it->second.push_back(std::move(r));
    return;
  }
  if (closed_.count(nonce) || desk_.wasClosed(nonce)) {
    answerGone(from, r, nonce);
    return;
  }
  const size_t cost = kParkedRecordOverhead + r.text.size();
  const bool other = !wanted_.count(from.key);
  const bool bytesFit = parkedBytes_ + cost <= budgets_.parkedRecordBytes &&
                        (!other || othersParkedBytes_ + cost <= budgets_.parkedRecordBytes / 2);
  auto it = parked_.find(nonce);
  if (it == parked_.end() &&
      (!bytesFit || parked_.size() >= kMaxParkedGroups || (other && othersParkedGroups_ >= kMaxParkedGroups / 2))) {
    ++parkedDropped_;
    ++droppedOverBudget_;
    return;
  }
  if (it == parked_.end()) {
    it = parked_.emplace(nonce, Parked{Clock::now()}).first;
    it->second.openedByOther = other;
    othersParkedGroups_ += other;
  }
  Parked& p = it->second;
  const bool oncePerSender = r.type == record::kBye || r.type == record::kFail || r.type == record::kSettings;
  const bool fits = bytesFit && (r.type == record::kHeartbeat ? p.beats < kMaxParkedHeartbeats
                                                              : oncePerSender || p.records.size() < kMaxParkedRecords);
  if (!fits || (oncePerSender && !p.lastWords.insert({r.type, r.srcRank, r.srcNonce}).second)) {
    ++parkedDropped_;
    droppedOverBudget_ += !bytesFit;
    return;
  }
  p.beats += r.type == record::kHeartbeat;
  ++parkedEver_;
  p.bytes += cost;
  parkedBytes_ += cost;
  if (other) {
    p.othersBytes += cost;
    othersParkedBytes_ += cost;
  }
  p.records.push_back(std::move(r));
}

void ProcessLinks::answerGone(Link& from, const LinkRecord& r, uint64_t nonce) {
  if (r.type == record::kGroupGone) return;  // never an answer to an answer
  if (goneAnswered_.size() >= kMaxGoneAnswered) goneAnswered_.clear();
  if (!goneAnswered_.insert({nonce, r.srcNonce}).second) return;  // once per neighbour: it stops at the first
  // On the link this side sends on to that process, where the group's own
  // last records (a BYE) went before: the neighbour reads those first.
  Link* out = &from;
  if (auto it = sendOn_.find(from.key); it != sendOn_.end())
    if (auto l = links_.find(it->second); l != links_.end() && l->second->open) out = l->second.get();
  enqueue(*out, r.srcNonce, nonce, -1, record::kGroupGone, "");
}

void ProcessLinks::closeLink(Link& l, int err, bool corrupted) {
  if (!l.open) return;
  l.open = false;
  l.err = err;
  l.corrupted = corrupted;
  if (l.fd >= 0) ::close(l.fd);
  if (l.dialFd >= 0) ::close(l.dialFd);
  l.fd = l.dialFd = -1;
  l.pending = false;
  l.closedAt = Clock::now();
  std::string().swap(l.inbuf);  // its memory too: a closed link may stay a minute
  std::string().swap(l.outbuf);
  if (auto it = sendOn_.find(l.key); it != sendOn_.end() && it->second == l.id) {
    sendOn_.erase(it);
    // Another open link to that process (both dialed at once) carries on.
    for (auto& [id, other] : links_)
      if (other->open && !l.key.empty() && other->key == l.key) {
        sendOn_.emplace(l.key, id);
        break;
      }
  }
  closures_++;
}

void ProcessLinks::sendQueued(Link& l) {
  while (l.open && !l.pending && !l.outbuf.empty()) {
    const ssize_t n = ::send(l.fd, l.outbuf.data(), l.outbuf.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n <= 0) break;  // full (retried on POLLOUT) or broken (the read side reports it)
    l.outbuf.erase(0, static_cast<size_t>(n));
  }
}

Clock::time_point ProcessLinks::tick(Clock::time_point now) {
  std::lock_guard<std::mutex> g(mu_);
  adoptArrivals();
  if (now >= nextParkCheck_) {
    nextParkCheck_ = now + std::chrono::seconds(1);
    for (auto it = parked_.begin(); it != parked_.end();)
      it = now - it->second.since > kParkLimit ? unpark(it) : std::next(it);
    for (auto it = links_.begin(); it != links_.end();) {
      Link& l = *it->second;
      if (l.open && l.key.empty() && !l.pending && now - l.openedAt > kIdentifyWithin) {
        readLink(l);  // this thread may have been held up: the name may be waiting
        if (l.open && l.key.empty()) {
          ++linksRefused_;
          closeLink(l, 0, true);
        }
      }
      // A husk (its socket moved into the pending link it completed) is erased at once.
      const bool husk = !l.open && l.closedAt == Clock::time_point{};
      if (!l.open && (husk || now - l.closedAt > kClosedKeep)) {
        if (!husk && !l.key.empty()) {
          if (erasedKeys_.size() >= kMaxErasedKeys) erasedKeys_.clear();
          erasedKeys_.emplace(l.id, l.key);
        }
        it = links_.erase(it);
      } else {
        it = std::next(it);
      }
    }
  }
  Clock::time_point next = nextParkCheck_;
  for (auto& [id, l] : links_) {
    if (!l->open || !l->pending) continue;
    if (l->dialFd >= 0 && now - l->dialStart > kDialAttempt) {
      ::close(std::exchange(l->dialFd, -1));  // unroutable: again after the grace
      l->pendingSince = now;
    }
    if (l->dialFd < 0 && now - l->pendingSince >= kPendingGrace) startPendingDial(*l, now);
    next = std::min(next, l->dialFd >= 0 ? l->dialStart + kDialAttempt : l->pendingSince + kPendingGrace);
  }
  return next;
}

void ProcessLinks::addPollFds(std::vector<pollfd>& fds) {
  std::lock_guard<std::mutex> g(mu_);
  polledLinks_.clear();
  fds.push_back({mailbox_->fd(), POLLIN, 0});
  for (auto& [id, l] : links_) {
    if (!l->open) continue;
    if (l->pending) {
      if (l->dialFd < 0) continue;
      fds.push_back({l->dialFd, POLLOUT, 0});  // its own dial completing
    } else {
      fds.push_back({l->fd, static_cast<short>(POLLIN | (l->outbuf.empty() ? 0 : POLLOUT)), 0});
    }
    polledLinks_.push_back(id);
  }
}

void ProcessLinks::polled(const pollfd* fds, size_t n) {
  std::lock_guard<std::mutex> g(mu_);
  if (n > 0 && fds[0].revents) adoptArrivals();
  for (size_t k = 1; k < n && k - 1 < polledLinks_.size(); ++k) {
    auto it = links_.find(polledLinks_[k - 1]);
    if (it == links_.end() || !it->second->open) continue;
    Link& l = *it->second;
    if (l.pending) {  // the entry was its dial's (a merge may have ended the dial meanwhile)
      if (fds[k].revents && l.dialFd == fds[k].fd) finishPendingDial(l, Clock::now());
      continue;
    }
    if (fds[k].fd != l.fd) continue;  // it was a dial that completed meanwhile: next round
    if (fds[k].revents & POLLOUT) sendQueued(*it->second);
    if (fds[k].revents & (POLLIN | POLLHUP | POLLERR)) readLink(*it->second);
  }
}

}  // namespace roce::runtime
