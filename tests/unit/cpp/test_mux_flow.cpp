// Flow control of the TCP streams (csrc/transport/tcp/mux_chunk.hpp): a
// real MuxLink over a socket pair whose other end plays the peer process.
// The reader gives credit back as it takes bytes; a writer stops at its
// window and goes on when credit comes; a peer that sends past the window
// of a stream nobody reads kills the link instead of growing the inbox.
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/wakeup.hpp"
#include "roce_check.hpp"
#include "transport/tcp/mux_chunk.hpp"
#include "transport/tcp/tcp_mux.hpp"
#include "transport/transport.hpp"

using namespace roce::transport::tcp;

namespace {

constexpr uint64_t kMine = 0x1111, kPeerNonce = 0x4444, kNotHere = 0x7777;
constexpr int kPeerRank = 1;

// This rank's group with one stream to and from rank 1 of the peer process,
// whose end of the connection is `peer`.
struct Setup {
  TcpMux mux{[] {}};
  roce::Wakeup wake;
  std::atomic<bool> newPeers{false};
  int peer = -1;
  std::shared_ptr<MuxLink> link;
  MuxLink::Stream stream{kMine, kPeerNonce, 0, kPeerRank, "rank 1"};
  Setup() {
    int sv[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    fcntl(sv[0], F_SETFL, O_NONBLOCK);
    peer = sv[1];
    fcntl(sv[1], F_SETFL, O_NONBLOCK);
    mux.registerGroup(kMine, 0, &wake, &newPeers);
    mux.adopt("peer", sv[0], "unit:1");
    link = mux.find("peer");
    link->open(stream, &wake);
  }
  ~Setup() {
    link->close(stream);
    mux.unregisterGroup(kMine);
    mux.dropGroup(kMine, 0);
    close(peer);
  }
  // The peer sends `n` bytes of its stream to this rank's group `nonce`, in
  // whole chunks, while `pump` reads this rank's end whenever the socket is
  // full (one thread plays both); stops early once `pump` says the link died.
  void peerSends(uint64_t nonce, size_t n, const std::function<bool()>& pump) {
    std::string bytes;
    for (size_t sent = 0; sent < n;) {
      const uint32_t len = static_cast<uint32_t>(std::min(n - sent, kChunkPayload));
      const ChunkHeader h = makeHeader(nonce, kPeerNonce, kPeerRank, kData, len);
      bytes.append(reinterpret_cast<const char*>(&h), sizeof(h));
      bytes.append(len, 'p');
      sent += len;
    }
    for (size_t at = 0; at < bytes.size();) {
      const ssize_t r = send(peer, bytes.data() + at, bytes.size() - at, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (r > 0) at += static_cast<size_t>(r);
      else if (!pump()) return;
    }
  }
  // The chunk headers the peer received so far (whole chunks only).
  std::vector<ChunkHeader> peerReceives() {
    char buf[1 << 16];
    ssize_t r;
    while ((r = recv(peer, buf, sizeof(buf), MSG_DONTWAIT)) > 0) inbuf.append(buf, static_cast<size_t>(r));
    std::vector<ChunkHeader> got;
    size_t at = 0;
    ChunkHeader h;
    while (inbuf.size() - at >= sizeof(h)) {
      std::memcpy(&h, inbuf.data() + at, sizeof(h));
      const size_t whole = sizeof(h) + (h.flags == kData ? h.len : 0);
      if (inbuf.size() - at < whole) break;
      got.push_back(h);
      at += whole;
    }
    inbuf.erase(0, at);
    return got;
  }
  std::string inbuf;  // what the peer read and has not parsed yet
};

size_t creditIn(const std::vector<ChunkHeader>& chunks) {
  size_t credit = 0;
  for (const auto& h : chunks)
    if (h.flags == kCredit) credit += h.len;
  return credit;
}

}  // namespace

TEST(the_reader_gives_credit_back_as_it_takes_bytes) {
  Setup s;
  std::vector<char> buf(kChunkPayload);
  size_t got = 0;
  auto take = [&] {
    try {
      got += s.link->read(s.stream, buf.data(), buf.size());
      return true;
    } catch (const roce::Error&) {
      return false;
    }
  };
  s.peerSends(kMine, 3 * kCreditEvery, take);
  for (int spins = 0; got < 3 * kCreditEvery && spins < 100000; ++spins) take();
  CHECK_EQ(got, 3 * kCreditEvery);
  // Credit in batches of at least kCreditEvery, for no more than was taken,
  // addressed to the sender's stream.
  const auto chunks = s.peerReceives();
  const size_t credit = creditIn(chunks);
  CHECK(credit >= 2 * kCreditEvery && credit <= 3 * kCreditEvery);
  for (const auto& h : chunks) {
    CHECK(h.flags == kCredit || h.flags == kOpenStream);  // open() announced the stream
    if (h.flags == kCredit)
      CHECK(h.len >= kCreditEvery && h.dstNonce == kPeerNonce && h.srcRank == 0 && h.srcNonce == kMine);
  }
}

TEST(a_writer_stops_at_its_window_and_goes_on_with_credit) {
  Setup s;
  std::vector<char> data(kStreamWindow + 1000, 'w');
  size_t wrote = 0;
  for (int spins = 0; spins < 100000; ++spins) {
    iovec v{data.data() + wrote, data.size() - wrote};
    const size_t n = s.link->write(s.stream, &v, 1);
    if (n == 0) {
      // The peer reads what came (and gives no credit): then only credit can hold the writer.
      s.peerReceives();
      const size_t again = s.link->write(s.stream, &v, 1);
      if (again == 0) break;
      wrote += again;
      continue;
    }
    wrote += n;
  }
  CHECK_EQ(wrote, kStreamWindow);
  // The peer's reader took a quarter: its credit lets exactly that much more go.
  const ChunkHeader credit = makeHeader(kMine, kPeerNonce, kPeerRank, kCredit, static_cast<uint32_t>(kCreditEvery));
  REQUIRE(send(s.peer, &credit, sizeof(credit), MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof(credit)));
  std::vector<char> none(16);
  s.link->read(s.stream, none.data(), none.size());  // reads the socket: the CREDIT chunk
  iovec v{data.data() + wrote, data.size() - wrote};
  const size_t more = s.link->write(s.stream, &v, 1);
  CHECK_EQ(more, std::min<size_t>(1000, kCreditEvery));
}

TEST(a_peer_that_sends_past_the_window_of_an_unread_stream_loses_the_link) {
  Setup s;
  // For a group not created here: parked, unread, until one chunk too many.
  std::vector<char> buf(16);
  std::string why;
  auto pump = [&] {
    try {
      s.link->read(s.stream, buf.data(), buf.size());  // reads the socket on behalf of every stream
      return true;
    } catch (const roce::Error& e) {
      why = e.what();
      return false;
    }
  };
  s.peerSends(kNotHere, kStreamWindow + kChunkPayload, pump);
  for (int spins = 0; spins < 1000 && why.empty(); ++spins) pump();
  CHECK(why.find("past its window") != std::string::npos);
  CHECK(!s.link->alive());
}

TEST(a_stream_abandoned_by_its_reader_is_credited_as_its_bytes_are_dropped) {
  Setup s;
  // Another group of this process reads the socket meanwhile (for every
  // stream), as the abandoning group no longer does.
  constexpr uint64_t kOther = 0x2222;
  MuxLink::Stream other{kOther, kPeerNonce + 1, 0, kPeerRank, "rank 1"};
  s.mux.registerGroup(kOther, 0, &s.wake, &s.newPeers);
  s.link->open(other, &s.wake);
  std::vector<char> buf(16);
  auto pump = [&] {
    try {
      s.link->read(other, buf.data(), buf.size());
      return true;
    } catch (const roce::Error&) {
      return false;
    }
  };
  // Half a window arrives unread; then the group gives up on the peer (it
  // failed here), and the peer, not knowing, sends three windows more.
  s.peerSends(kMine, kStreamWindow / 2, pump);
  for (int spins = 0; spins < 1000; ++spins) pump();
  CHECK(s.link->hasBuffered(s.stream));
  // What was held is given back at once, whole.
  s.link->abandon(s.stream);
  size_t credit = creditIn(s.peerReceives());
  CHECK_EQ(credit, kStreamWindow / 2);
  // What arrives later is dropped and credited as it comes, so a sender
  // that follows the window keeps going (the link is not refused).
  const size_t later = 3 * kStreamWindow;
  for (size_t sent = 0; sent < later; sent += kCreditEvery) {
    s.peerSends(kMine, kCreditEvery, pump);
    for (int spins = 0; spins < 1000; ++spins) pump();
    credit += creditIn(s.peerReceives());
  }
  CHECK(s.link->alive());
  CHECK_EQ(credit, kStreamWindow / 2 + later);
  s.link->close(other);
  s.mux.unregisterGroup(kOther);
  s.mux.dropGroup(kOther, 0);
}

TEST(a_peer_that_closed_its_stream_then_exited_is_reported_as_having_ended_it) {
  Setup s;
  // The peer's group closes its stream (CLOSE), then its process exits: a
  // write here fails on the dead socket, and the error says the peer ended
  // the stream on purpose (what the group then waits to explain), not that
  // its connection broke.
  const ChunkHeader close = makeHeader(kMine, kPeerNonce, kPeerRank, kClose, 0);
  REQUIRE(send(s.peer, &close, sizeof(close), MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof(close)));
  ::close(s.peer);
  s.peer = -1;
  std::vector<char> data(4096, 'w');
  iovec v{data.data(), data.size()};
  std::string why;
  bool peerEnded = false;
  try {
    for (int i = 0; i < 100; ++i) s.link->write(s.stream, &v, 1);
  } catch (const roce::transport::PeerEndedError& e) {
    why = e.what();
    peerEnded = true;
  } catch (const roce::Error& e) {
    why = e.what();
  }
  CHECK(peerEnded);
  CHECK(why.find("destroyed the process group") != std::string::npos);
}
