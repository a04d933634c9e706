// The first bytes of every TCP connection between roce processes: what the
// front desk (front_desk.hpp) reads to know which group, and which of the
// group's waits, a connection belongs to. Two kinds:
//   * Hello: a connection between two ranks of a formed group (data mesh),
//     or between two processes (their lifeline link). It names the
//     destination rank's nonce, the random 64-bit value that rank published
//     for this group incarnation, which is the key the desk routes by (one
//     listener serves every group of the process); a process link names
//     kProcessLinksKey instead;
//   * JoinHeader: a rank joining a group at its leader (group/join.cpp). It
//     names the leader nonce the joiner read from the store: the key of the
//     leader's mailbox while the group forms.
// Both are 24 bytes up to the key's end for a join, 32 for a hello; the magic
// in the first 4 bytes tells them apart. Of the current versions, each is
// followed by the job secret's MAC of its bytes (kMacBytes,
// common/job_secret.hpp): the front desk reads and checks it before it routes
// anything, and closes the connection unread when it does not match.
#pragma once
#include <cstdint>
#include <cstring>

#include "../common/job_secret.hpp"

namespace roce::runtime {

constexpr uint32_t kHelloMagic = 0x526f4345;  // "RoCE"
// 3: data connections are answered (HelloReply); 4: the hello names the
// destination's nonce (one listener per process); 5: lifelines
// travel over process links (process_links.hpp); 6: the job secret's MAC
// follows the hello; 7: TCP streams are flow-controlled by CREDIT chunks
// (transport/tcp/mux_chunk.hpp), and a process link's name must fit the
// address it came from.
constexpr uint16_t kHelloVersion = 7;

// Probe: answered by the front desk itself (Gone if the key's mailbox was
// closed, else Accepted), never delivered: a forming rank asks whether a
// neighbour's group still exists on a process that is alive.
// Process: a link between two processes for every group's lifelines
// (process_links.hpp); its key is kProcessLinksKey. 2 stays unassigned: a
// peer built before version 5 used it for one group's lifeline.
enum class LinkKind : uint16_t { Mesh = 1, Join = 3, Probe = 4, Process = 5 };

struct Hello {
  uint32_t magic;
  uint16_t version;
  uint16_t kind;       // LinkKind
  int32_t src;         // group ranks
  int32_t dst;
  uint64_t srcNonce;   // proves the dialer is of this incarnation
  uint64_t dstNonce;   // the desk's routing key
};
static_assert(sizeof(Hello) == 32);

constexpr uint32_t kJoinMagic = 0x4a4f494e;  // "JOIN"
// Covers the join header, the RankInfo text after it, the leader's address
// record and its replies. 2: the record and the header name both versions,
// and the leader answers a join of other versions with them. 3: the settings
// members compare are every setting Config::read declares sameInGroup, in
// reading order (a build of version 2 would only report a settings mismatch).
// 4: the job secret's MAC follows the header (a join of another version
// comes without one and is answered with the versions, as before).
constexpr uint16_t kJoinVersion = 4;

struct JoinHeader {
  uint32_t magic;
  uint16_t version;
  uint16_t helloVersion;  // version 1 sent 0 here
  int32_t rank;
  uint32_t infoLen;      // the RankInfo text that follows
  uint64_t leaderNonce;  // the record the joiner read; the desk's routing key
};
static_assert(sizeof(JoinHeader) == 24);

// The bytes a head of the current version takes on the wire: the head, then
// its MAC.
template <class Head>
struct Signed {
  Head head;
  uint8_t mac[kMacBytes];
};
static_assert(sizeof(Signed<Hello>) == 48 && sizeof(Signed<JoinHeader>) == 40);

// `head` followed by the job secret's MAC of it.
template <class Head>
Signed<Head> signHead(const Head& head) {
  Signed<Head> s{head, {}};
  const Mac m = JobSecret::mac(&head, sizeof(head));
  std::memcpy(s.mac, m.data(), kMacBytes);
  return s;
}

}  // namespace roce::runtime
