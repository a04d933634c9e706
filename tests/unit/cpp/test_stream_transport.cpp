// Framing and matching over byte streams (csrc/transport/stream_transport.*):
// two transports in one process joined by in-memory pipes that take only a
// few bytes per write, so headers and payloads arrive in pieces. Checks the
// transport.hpp contract: FIFO per (peer, tag), exact sizes (a mismatch fails
// the receive naming both ranks and sizes, and the stream stays framed),
// messages that arrive before their receive are held, a corrupted header
// fails everything pending with that peer, and a dead peer fails new requests.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "common/counters.hpp"
#include "roce_check.hpp"
#include "transport/stream_transport.hpp"

using roce::transport::Request;

namespace {

// One direction of a pipe: a byte queue that holds at most `capacity` bytes.
struct Channel {
  std::deque<char> bytes;
  size_t capacity;
  size_t writes = 0;  // write() calls that moved bytes
};

class MemPipe : public roce::transport::BytePipe {
 public:
  MemPipe(std::shared_ptr<Channel> out, std::shared_ptr<Channel> in, size_t maxPerCall)
      : out_(std::move(out)), in_(std::move(in)), maxPerCall_(maxPerCall) {}
  size_t write(const iovec* iov, int iovcnt) override {
    if (gone) roce::throwComm("the pipe's far end is gone");
    size_t moved = 0;
    for (int i = 0; i < iovcnt; ++i) {
      const char* p = static_cast<const char*>(iov[i].iov_base);
      for (size_t k = 0; k < iov[i].iov_len; ++k) {
        if (out_->bytes.size() >= out_->capacity || moved >= maxPerCall_) goto done;
        out_->bytes.push_back(p[k]);
        ++moved;
      }
    }
  done:
    if (moved) ++out_->writes;
    return moved;
  }
  size_t read(void* dst, size_t n) override {
    n = std::min({n, in_->bytes.size(), maxPerCall_});
    std::copy_n(in_->bytes.begin(), n, static_cast<char*>(dst));
    in_->bytes.erase(in_->bytes.begin(), in_->bytes.begin() + static_cast<long>(n));
    return n;
  }
  void checkAlive() override {
    if (gone) roce::throwComm("rank 1 exited");
  }
  void abandon() override { abandoned = true; }
  bool gone = false, abandoned = false;

 private:
  std::shared_ptr<Channel> out_, in_;
  size_t maxPerCall_;
};

class Stream : public roce::transport::StreamTransport {
 public:
  using StreamTransport::StreamTransport;
  const char* name() const override { return "test-stream"; }
};

// Ranks 0 and 1, each with a pipe to the other.
struct Pair {
  std::shared_ptr<Channel> toOne, toZero;
  MemPipe* pipe0 = nullptr;  // rank 0's end (owned by t0)
  MemPipe* pipe1 = nullptr;
  std::unique_ptr<Stream> t0, t1;

  explicit Pair(size_t capacity = 64, size_t maxPerCall = 7, bool copies = false)
      : toOne(std::make_shared<Channel>(Channel{{}, capacity})), toZero(std::make_shared<Channel>(Channel{{}, capacity})) {
    std::vector<std::unique_ptr<roce::transport::BytePipe>> p0(2), p1(2);
    auto a = std::make_unique<MemPipe>(toOne, toZero, maxPerCall);
    auto b = std::make_unique<MemPipe>(toZero, toOne, maxPerCall);
    pipe0 = a.get();
    pipe1 = b.get();
    p0[1] = std::move(a);
    p1[0] = std::move(b);
    t0 = std::make_unique<Stream>(0, std::move(p0), copies);
    t1 = std::make_unique<Stream>(1, std::move(p1), copies);
  }
  // Progress both sides until nothing moves.
  void settle() {
    for (int i = 0; i < 100000; ++i)
      if (!(t0->progress() | t1->progress())) return;
    unit::fail(__FILE__, __LINE__, "the transports never went quiet");
  }
};

Request send(int peer, uint64_t tag, const void* buf, size_t len) {
  Request r;
  r.kind = Request::Kind::Send;
  r.peer = peer;
  r.tag = tag;
  r.buf = const_cast<void*>(buf);
  r.len = len;
  return r;
}
Request recv(int peer, uint64_t tag, void* buf, size_t len) {
  Request r = send(peer, tag, buf, len);
  r.kind = Request::Kind::Recv;
  return r;
}

std::vector<char> pattern(size_t n, int salt) {
  std::vector<char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<char>(i * 31 + salt * 7 + (i >> 8));
  return v;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST(message_arrives_whole_through_small_writes) {
  Pair p(64, 7);
  const std::vector<char> data = pattern(1000, 1);
  std::vector<char> got(1000, 0);
  Request s = send(1, 42, data.data(), data.size());
  Request r = recv(0, 42, got.data(), got.size());
  p.t1->postRecv(&r);
  p.t0->postSend(&s);
  p.settle();
  CHECK(s.done && !s.failed());
  CHECK(r.done && !r.failed());
  CHECK(got == data);
  CHECK_GT(p.toOne->writes, 100u);  // it really went 7 bytes at a time
}

TEST(wire_frame_starts_with_magic_and_carries_tag_and_length) {
  // 24-byte header: magic "RPGF" (0x52504746, little-endian), a check word,
  // then the tag and the length as 64-bit words, then the payload.
  Pair p(1 << 16, 1 << 16);
  const char payload[5] = {'h', 'e', 'l', 'l', 'o'};
  Request s = send(1, 0x1122334455667788ull, payload, 5);
  p.t0->postSend(&s);
  p.t0->progress();
  const std::vector<char> wire(p.toOne->bytes.begin(), p.toOne->bytes.end());
  REQUIRE_EQ(wire.size(), 24u + 5u);
  uint32_t magic;
  uint64_t tag, len;
  std::memcpy(&magic, wire.data(), 4);
  std::memcpy(&tag, wire.data() + 8, 8);
  std::memcpy(&len, wire.data() + 16, 8);
  CHECK_EQ(magic, 0x52504746u);
  CHECK_EQ(tag, 0x1122334455667788ull);
  CHECK_EQ(len, 5u);
  CHECK_EQ(std::string(wire.data() + 24, 5), "hello");
}

TEST(fifo_per_tag_and_tags_independent) {
  Pair p;
  int a1 = 1, a2 = 2, b1 = 3;
  int ra1 = 0, ra2 = 0, rb1 = 0;
  Request s1 = send(1, 7, &a1, 4), s2 = send(1, 7, &a2, 4), s3 = send(1, 9, &b1, 4);
  p.t0->postSend(&s1);
  p.t0->postSend(&s2);
  p.t0->postSend(&s3);
  // Receives posted in another order than the sends, tag 9 first.
  Request r9 = recv(0, 9, &rb1, 4), r7a = recv(0, 7, &ra1, 4), r7b = recv(0, 7, &ra2, 4);
  p.t1->postRecv(&r9);
  p.t1->postRecv(&r7a);
  p.settle();
  p.t1->postRecv(&r7b);  // after its message arrived: delivered from the buffer at once
  CHECK(r7b.done);
  p.settle();
  CHECK_EQ(ra1, 1);
  CHECK_EQ(ra2, 2);
  CHECK_EQ(rb1, 3);
  CHECK(r9.done && r7a.done && !r7b.failed());
}

TEST(early_message_is_held_and_announced) {
  Pair p;
  const std::vector<char> data = pattern(300, 5);
  Request s = send(1, 11, data.data(), data.size());
  p.t0->postSend(&s);
  p.settle();
  CHECK(p.t1->hasUnmatched(0, 11));
  CHECK(!p.t1->hasUnmatched(0, 12));
  std::vector<char> got(300);
  Request r = recv(0, 11, got.data(), got.size());
  p.t1->postRecv(&r);
  CHECK(r.done);
  CHECK(got == data);
  CHECK(!p.t1->hasUnmatched(0, 11));
}

TEST(zero_length_messages) {
  Pair p;
  Request s = send(1, 3, nullptr, 0), r = recv(0, 3, nullptr, 0);
  p.t1->postRecv(&r);
  p.t0->postSend(&s);
  p.settle();
  CHECK(s.done && r.done && !r.failed());
}

TEST(size_mismatch_fails_the_receive_and_keeps_the_stream_framed) {
  Pair p;
  const std::vector<char> big = pattern(100, 2), next = pattern(10, 3);
  std::vector<char> small(60), after(10);
  Request s1 = send(1, 5, big.data(), big.size()), s2 = send(1, 5, next.data(), next.size());
  Request r1 = recv(0, 5, small.data(), small.size()), r2 = recv(0, 5, after.data(), after.size());
  p.t1->postRecv(&r1);
  p.t1->postRecv(&r2);
  p.t0->postSend(&s1);
  p.t0->postSend(&s2);
  p.settle();
  CHECK(r1.failed());
  CHECK(contains(r1.error, "rank 1 expected a message of 60 bytes from rank 0 but rank 0 sent 100 bytes"));
  CHECK(contains(r1.error, "same size and dtype"));
  CHECK(r2.done && !r2.failed());  // the next message is read as a message, not as leftover bytes
  CHECK(after == next);
  // A held message of the wrong size fails the receive posted later.
  Request s3 = send(1, 6, big.data(), 8);
  p.t0->postSend(&s3);
  p.settle();
  Request r3 = recv(0, 6, small.data(), 16);
  p.t1->postRecv(&r3);
  CHECK(r3.failed());
  CHECK(contains(r3.error, "expected a message of 16 bytes from rank 0 but rank 0 sent 8 bytes"));
}

TEST(corrupted_header_fails_the_peer) {
  Pair p;
  int x = 0;
  Request pending = recv(0, 1, &x, 4);
  p.t1->postRecv(&pending);
  // 24 bytes that are not a frame header (what a wrong process would send).
  for (int i = 0; i < 24; ++i) p.toOne->bytes.push_back(static_cast<char>(0xA0 + i));
  p.t1->progress();
  CHECK(pending.failed());
  CHECK(contains(pending.error, "rank 1 received a corrupted frame header from rank 0"));
  CHECK(contains(pending.error, "magic 0xa3a2a1a0"));
  CHECK(p.pipe1->abandoned);
  // The peer stays failed: new requests fail at once with the same reason.
  Request later = send(0, 2, &x, 4);
  p.t1->postSend(&later);
  CHECK(later.failed());
  CHECK_EQ(later.error, pending.error);
  CHECK(contains(p.t1->checkPeers(), "corrupted frame header"));
}

TEST(header_with_an_altered_length_is_corruption) {
  // The check word covers the tag and the length: a length changed in
  // flight is caught before it sizes a buffer.
  Pair p(1 << 16, 1 << 16);
  uint64_t big = 1;
  Request s = send(1, 8, &big, 8);
  p.t0->postSend(&s);
  p.t0->progress();
  REQUIRE_EQ(p.toOne->bytes.size(), 32u);
  for (int i = 16; i < 24; ++i) p.toOne->bytes[i] = static_cast<char>(0x7f);  // the length word
  p.t1->progress();
  CHECK(contains(p.t1->checkPeers(), "corrupted frame header"));
}

TEST(dead_peer_fails_pending_and_new_requests) {
  Pair p(16, 16);  // a small pipe: the send stays queued
  const std::vector<char> data = pattern(500, 9);
  std::vector<char> got(8);
  Request s = send(1, 4, data.data(), data.size()), r = recv(1, 4, got.data(), got.size());
  p.t0->postSend(&s);
  p.t0->postRecv(&r);
  p.t0->progress();
  CHECK(!s.done);
  p.pipe0->gone = true;
  const std::string why = p.t0->checkPeers();
  CHECK(contains(why, "rank 1 exited"));
  CHECK(s.failed() && r.failed());
  CHECK(contains(s.error, "rank 1 exited"));
  Request again = send(1, 4, data.data(), 1);
  p.t0->postSend(&again);
  CHECK(again.failed());
}

TEST(fail_all_and_fail_peer) {
  Pair p;
  int x = 0;
  Request r = recv(1, 1, &x, 4);
  p.t0->postRecv(&r);
  p.t0->failAll("group aborted");
  CHECK(r.failed());
  CHECK_EQ(r.error, "group aborted");
  Pair q;
  Request r2 = recv(1, 1, &x, 4);
  q.t0->postRecv(&r2);
  q.t0->failPeer(1, "no route to rank 1");
  CHECK_EQ(r2.error, "no route to rank 1");
}

TEST(copies_are_counted_only_for_copying_pipes) {
  for (bool copies : {false, true}) {
    INFO("copiesPayload ", copies);
    Pair p(64, 7, copies);
    roce::Counters c0, c1;
    p.t0->setCounters(&c0);
    p.t1->setCounters(&c1);
    const std::vector<char> data = pattern(200, 4);
    std::vector<char> got(200);
    Request s = send(1, 1, data.data(), 200), r = recv(0, 1, got.data(), 200);
    p.t1->postRecv(&r);
    p.t0->postSend(&s);
    p.settle();
    CHECK_EQ(c0.bytesCopied.load(), copies ? 200u : 0u);
    CHECK_EQ(c1.bytesCopied.load(), copies ? 200u : 0u);
    // A held message is always copied out of the transport's buffer.
    Request s2 = send(1, 2, data.data(), 50);
    p.t0->postSend(&s2);
    p.settle();
    Request r2 = recv(0, 2, got.data(), 50);
    p.t1->postRecv(&r2);
    CHECK_EQ(c1.bytesCopied.load(), copies ? 300u : 50u);
  }
}

TEST(pipes_added_later_carry_queued_requests) {
  auto toOne = std::make_shared<Channel>(Channel{{}, 64}), toZero = std::make_shared<Channel>(Channel{{}, 64});
  Stream t0(0, std::vector<std::unique_ptr<roce::transport::BytePipe>>(2));
  std::vector<std::unique_ptr<roce::transport::BytePipe>> p1(2);
  p1[0] = std::make_unique<MemPipe>(toZero, toOne, 64);
  Stream t1(1, std::move(p1));
  CHECK(!t0.hasPipe(1));
  const int v = 77;
  int got = 0;
  Request s = send(1, 1, &v, 4), r = recv(0, 1, &got, 4);
  t0.postSend(&s);
  t1.postRecv(&r);
  t0.progress();
  CHECK(!s.done);  // no connection yet
  t0.addPipe(1, std::make_unique<MemPipe>(toOne, toZero, 64));
  CHECK(t0.hasPipe(1));
  for (int i = 0; i < 10; ++i) t0.progress(), t1.progress();
  CHECK(s.done && r.done);
  CHECK_EQ(got, 77);
}

TEST(prepare_wait_refuses_to_block_on_silent_pipes_with_work) {
  Pair p;
  std::vector<pollfd> fds;
  CHECK(p.t0->prepareWait(fds, false));  // nothing pending: safe to block
  CHECK(fds.empty());
  CHECK(p.t0->hasSilentPeers());
  int x = 0;
  Request r = recv(1, 1, &x, 4);
  p.t0->postRecv(&r);
  CHECK(!p.t0->prepareWait(fds, false));  // a receive from a pipe no descriptor announces
  CHECK(!Pair().t0->prepareWait(fds, true));  // any-source receives: same
}

TEST(a_header_claiming_terabytes_allocates_only_what_arrives) {
  // A peer (or a stranger past the handshake) announces a 1 TiB payload and
  // sends 40 bytes of it: the receiver buffers what came, not what was
  // announced. Sizing the buffer by the header failed the peer as out of
  // memory here, and a claim the machine could hold (tens of GB) zero-filled
  // that much memory before a byte of it came.
  Pair p(64, 64);
  std::vector<char> some(64, 'x');
  Request s = send(1, 3, some.data(), size_t(1) << 40);
  p.t0->postSend(&s);
  p.t0->progress();  // the header and 40 bytes fill the 64-byte channel; t0 is not progressed again
  p.t1->progress();
  CHECK_EQ(p.t1->checkPeers(), "");
}

TEST(early_messages_larger_than_the_first_buffer_arrive_whole) {
  // Held payloads grow by doubling from 64 KiB; a size mismatch drains one
  // through a reused buffer and the next message is still framed.
  Pair p(1 << 16, 1 << 16);
  const std::vector<char> big = pattern(300'001, 1), next = pattern(70'000, 2);
  Request s1 = send(1, 4, big.data(), big.size()), s2 = send(1, 5, big.data(), big.size()),
          s3 = send(1, 6, next.data(), next.size());
  p.t0->postSend(&s1);
  p.t0->postSend(&s2);
  p.t0->postSend(&s3);
  std::vector<char> small(10), got(big.size()), got3(next.size());
  Request r2 = recv(0, 5, small.data(), small.size());
  p.t1->postRecv(&r2);  // posted first: tag 5 arrives matched to a receive of the wrong size
  p.settle();
  Request r1 = recv(0, 4, got.data(), got.size()), r3 = recv(0, 6, got3.data(), got3.size());
  p.t1->postRecv(&r1);
  p.t1->postRecv(&r3);
  p.settle();
  CHECK(r1.done && !r1.failed() && got == big);
  CHECK(r2.failed());
  CHECK(r3.done && !r3.failed() && got3 == next);
}
