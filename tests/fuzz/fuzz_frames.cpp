// StreamTransport's receiving side (csrc/transport/stream_transport.hpp), the
// frames every TCP and shared-memory message travels in, on any stream. A
// second StreamTransport writes the frames the input asks for (sends of a
// tag and a length), the receiver posts the receives it asks for, and the
// stream between them is cut into the reads the input picks and may have one
// byte changed. Whatever arrives, nothing crashes and nothing is written past
// a receive's buffer (ASan); on an intact stream every receive whose length
// matches its send completes with exactly the bytes sent.
#include <sys/uio.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "transport/stream_transport.hpp"

using roce::transport::BytePipe;
using roce::transport::Request;
using roce::transport::StreamTransport;

namespace {

struct Wire {
  std::string bytes;
  size_t readPos = 0;
  size_t corruptAt = SIZE_MAX;  // the position whose byte is changed, as it is read
  uint8_t corruptXor = 0;
};

// The sender's end appends everything written and reads nothing; the
// receiver's end reads at most `piece` bytes at a time, cycling through the
// sizes the input gave (and never writes: the receiver sends nothing).
class MemoryPipe : public BytePipe {
 public:
  MemoryPipe(Wire* wire, bool sending, std::vector<size_t> pieces = {})
      : wire_(wire), sending_(sending), pieces_(std::move(pieces)) {}
  size_t write(const iovec* iov, int iovcnt) override {
    if (!sending_) std::abort();
    size_t n = 0;
    for (int i = 0; i < iovcnt; ++i) {
      wire_->bytes.append(static_cast<const char*>(iov[i].iov_base), iov[i].iov_len);
      n += iov[i].iov_len;
    }
    return n;
  }
  size_t read(void* dst, size_t n) override {
    if (sending_) return 0;
    const size_t piece = pieces_.empty() ? n : pieces_[next_++ % pieces_.size()];
    const size_t got = std::min({n, piece, wire_->bytes.size() - wire_->readPos});
    std::memcpy(dst, wire_->bytes.data() + wire_->readPos, got);
    const size_t at = wire_->corruptAt;
    if (at >= wire_->readPos && at < wire_->readPos + got) static_cast<uint8_t*>(dst)[at - wire_->readPos] ^= wire_->corruptXor;
    wire_->readPos += got;
    return got;
  }

 private:
  Wire* wire_;
  bool sending_;
  std::vector<size_t> pieces_;
  size_t next_ = 0;
};

struct Input {
  const uint8_t* p;
  size_t n;
  uint8_t byte() { return n ? (--n, *p++) : 0; }
};

class Stream : public StreamTransport {
 public:
  using StreamTransport::StreamTransport;
  const char* name() const override { return "fuzz"; }
};

uint8_t pattern(size_t send, size_t i) { return static_cast<uint8_t>(send * 131 + i * 7 + 1); }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in{data, size};
  const uint8_t flags = in.byte();
  Wire wire;
  if (flags & 1) {
    const size_t lo = in.byte();
    wire.corruptAt = lo | static_cast<size_t>(in.byte()) << 8;
    wire.corruptXor = in.byte() | 1;
  }
  std::vector<size_t> pieces;
  for (int i = 0, np = in.byte() % 5; i < np; ++i) pieces.push_back(1 + in.byte() % 40);

  // Operations: (kind, tag, length); at most 12, payloads up to 2 KiB.
  struct Op { bool send; uint64_t tag; size_t len; };
  std::vector<Op> ops;
  for (int i = 0, nops = in.byte() % 13; i < nops; ++i) {
    const uint8_t k = in.byte();
    const size_t lo = in.byte();
    const size_t len = lo | static_cast<size_t>(in.byte() & 7) << 8;
    ops.push_back({(k & 1) != 0, static_cast<uint64_t>(k >> 1 & 3), len});
  }

  std::vector<std::unique_ptr<BytePipe>> sendPipes(2), recvPipes(2);
  sendPipes[0] = std::make_unique<MemoryPipe>(&wire, true);
  recvPipes[1] = std::make_unique<MemoryPipe>(&wire, false, pieces);
  Stream sender(1, std::move(sendPipes));
  Stream receiver(0, std::move(recvPipes));

  std::deque<Request> sends, recvs;  // deque: requests must not move
  std::vector<std::vector<uint8_t>> sendBufs, recvBufs;
  sendBufs.reserve(ops.size());
  recvBufs.reserve(ops.size());
  for (const Op& op : ops) {
    if (op.send) {
      auto& buf = sendBufs.emplace_back(op.len);
      for (size_t i = 0; i < op.len; ++i) buf[i] = pattern(sendBufs.size() - 1, i);
      Request& r = sends.emplace_back();
      r.kind = Request::Kind::Send, r.peer = 0, r.tag = op.tag, r.buf = buf.data(), r.len = op.len;
      sender.postSend(&r);
    } else {
      auto& buf = recvBufs.emplace_back(op.len, 0xee);
      Request& r = recvs.emplace_back();
      r.kind = Request::Kind::Recv, r.peer = 1, r.tag = op.tag, r.buf = buf.data(), r.len = op.len;
      receiver.postRecv(&r);
    }
  }
  for (int round = 0; round < 10000; ++round) {
    const bool moved = sender.progress() | receiver.progress();
    if (!moved) break;
  }
  receiver.failAll("the fuzz run ended");
  sender.failAll("the fuzz run ended");

  // On an intact stream the k-th receive of a tag takes the k-th send of that
  // tag: one of another length fails (and the stream stays framed: the
  // receives after it are unaffected), one of the same length completes
  // with exactly the bytes sent.
  if (wire.corruptAt < wire.bytes.size()) return 0;
  constexpr size_t kMismatch = SIZE_MAX - 1;
  std::vector<size_t> sendOf;  // per receive, its send's index, kMismatch, or SIZE_MAX (no send)
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].send) continue;
    size_t rank = 0;
    for (size_t j = 0; j < i; ++j) rank += !ops[j].send && ops[j].tag == ops[i].tag;
    size_t s = 0, seen = 0, found = SIZE_MAX;
    for (size_t j = 0; j < ops.size(); ++j) {
      if (!ops[j].send) continue;
      if (ops[j].tag == ops[i].tag && seen++ == rank) found = s;
      ++s;
    }
    sendOf.push_back(found != SIZE_MAX && sends[found].len != ops[i].len ? kMismatch : found);
  }
  for (size_t ri = 0; ri < recvs.size(); ++ri) {
    const Request& r = recvs[ri];
    if (sendOf[ri] == SIZE_MAX) continue;
    if (sendOf[ri] == kMismatch) {
      if (!r.failed() || r.error == "the fuzz run ended") std::abort();  // failed as a size mismatch
      continue;
    }
    if (!r.done || r.failed()) std::abort();  // an intact message of the right length must arrive
    for (size_t b = 0; b < r.len; ++b)
      if (recvBufs[ri][b] != pattern(sendOf[ri], b)) std::abort();
  }
  return 0;
}
