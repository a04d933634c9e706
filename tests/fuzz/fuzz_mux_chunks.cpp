// The TCP transport's chunk routing (csrc/transport/tcp/mux_link.hpp): one
// peer process's connection, carrying chunks for the streams of several
// groups, read by a group's stream and by the runtime thread's idle reads.
// The input is a script for the peer: chunks for this rank's stream, for a
// group not created here (parked) and for one destroyed here, with headers
// intact or not (a wrong magic, a wrong check, a claimed length beyond a
// chunk's, fewer payload bytes than claimed), CLOSE, GONE and OPEN chunks,
// interleaved with the stream's reads, idle reads, its close and the
// group's end. Whatever the peer sends, nothing crashes (ASan, UBSan) and
// nothing is read past a buffer, and when the script only sent intact
// chunks the stream reads exactly the bytes sent to it, in order.
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/wakeup.hpp"
#include "transport/tcp/mux_chunk.hpp"
#include "transport/tcp/tcp_mux.hpp"

using namespace roce::transport::tcp;

namespace {

constexpr uint64_t kMine = 0x1111, kParked = 0x2222, kGoneHere = 0x3333, kPeerNonce = 0x4444;
constexpr int kPeerRank = 1;

struct Input {
  const uint8_t* p;
  size_t n;
  uint8_t byte() { return n ? (--n, *p++) : 0; }
  uint32_t u16() { return byte() | uint32_t(byte()) << 8; }
};

// The peer's end of the connection: writes what fits at once (the socket
// pair's buffer is far larger than an input's chunks).
struct Peer {
  int fd;
  bool send(const void* p, size_t n) { return n == 0 || ::send(fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL) == ssize_t(n); }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in{data, size};
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return 0;
  fcntl(sv[0], F_SETFL, O_NONBLOCK);
  Peer peer{sv[1]};
  {
    TcpMux mux([] {});
    roce::Wakeup wake, goneWake;
    std::atomic<bool> newPeers{false}, goneNewPeers{false};
    mux.registerGroup(kMine, 0, &wake, &newPeers);
    mux.registerGroup(kGoneHere, 0, &goneWake, &goneNewPeers);
    mux.unregisterGroup(kGoneHere);
    mux.dropGroup(kGoneHere, 0);
    mux.adopt("peer", sv[0], "fuzz:1");
    std::shared_ptr<MuxLink> link = mux.find("peer");
    if (!link) std::abort();
    const MuxLink::Stream stream{kMine, kPeerNonce, 0, kPeerRank, "rank 1"};
    link->open(stream, &wake);
    bool open = true, intact = true, ended = false;
    std::string sent, got;
    std::vector<char> buf(1 << 17);
    while (in.n) {
      const uint8_t op = in.byte() % 8;
      if (op <= 1) {  // an intact data chunk for this rank's stream
        const uint32_t len = in.u16() % 600;
        std::string payload;
        for (uint32_t i = 0; i < len; ++i) payload.push_back(static_cast<char>(in.byte()));
        const ChunkHeader h = makeHeader(kMine, kPeerNonce, kPeerRank, kData, len);
        if (!peer.send(&h, sizeof(h)) || !peer.send(payload.data(), payload.size())) {
          intact = false;  // part of a chunk went: the stream is cut
          break;
        }
        if (!ended) sent += payload;
      } else if (op == 2) {  // any header, then up to 255 payload bytes
        static const uint64_t nonces[] = {kMine, kParked, kGoneHere, 0x5555};
        const uint8_t pick = in.byte();
        const uint16_t flags = in.byte() % 6;
        const uint32_t len = (pick & 0x40) ? (in.u16() << 4) : in.byte();  // up to 1 MiB: past kChunkPayload
        ChunkHeader h = makeHeader(nonces[pick % 4], kPeerNonce, (pick >> 2) % 3, flags, len);
        if (pick & 0x80) h.check ^= static_cast<uint16_t>(in.byte() | 1);
        if ((pick & 0x30) == 0x30) h.magic ^= 1u << (in.byte() % 32);
        const uint32_t payloadBytes = std::min<uint32_t>(len, in.byte());
        std::string payload(payloadBytes, static_cast<char>(in.byte()));
        if (!peer.send(&h, sizeof(h)) || !peer.send(payload.data(), payload.size())) {
          intact = false;
          break;
        }
        // The stream's bytes as the link sees them are no longer the script's.
        if (h.dstNonce == kMine || h.magic != kChunkMagic || h.check != chunkCheck(h) || payloadBytes < len)
          intact = false;
      } else if (op == 3 || op == 4) {  // the stream reads
        if (!open) continue;
        try {
          const size_t n = link->read(stream, buf.data(), 1 + in.u16() % buf.size());
          got.append(buf.data(), n);
        } catch (const roce::Error&) {
          ended = true;  // the link died or the stream ended: reading goes on failing
        }
      } else if (op == 5) {  // the runtime thread's idle read
        std::vector<pollfd> fds;
        link->addRuntimePollFds(fds, roce::Clock::now() + std::chrono::hours(1));
        for (auto& f : fds) f.revents = POLLIN | POLLOUT;
        link->runtimePolled(fds.data(), fds.size());
      } else if (op == 6) {  // parked streams past their time
        link->dropStaleParked(roce::Clock::now() + std::chrono::hours(1));
      } else if (open) {  // the group closes the stream
        link->close(stream);
        open = false;
      }
    }
    // What is left of an intact script's bytes arrives whole.
    for (int spins = 0; open && !ended && intact && got.size() < sent.size() && spins < 1000; ++spins) {
      try {
        const size_t n = link->read(stream, buf.data(), buf.size());
        got.append(buf.data(), n);
      } catch (const roce::Error&) {
        ended = true;
      }
    }
    if (intact && !ended && open && got != sent) std::abort();
    if (got.size() > sent.size() && intact) std::abort();
    if (open) link->close(stream);
    mux.unregisterGroup(kMine);
    mux.dropGroup(kMine, 0);
  }
  ::close(sv[1]);
  return 0;
}
