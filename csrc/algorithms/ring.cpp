#include "ring.hpp"

#include <algorithm>

#include "../comm/communicator.hpp"
#include "../reduce/reduce.hpp"

namespace roce {
namespace {

struct RingPosition {
  int pos, n, left, right;
  RingPosition(const Communicator& c, const std::vector<int>& order) {
    n = static_cast<int>(order.size());
    pos = static_cast<int>(std::find(order.begin(), order.end(), c.rank()) - order.begin());
    left = order[(pos + n - 1) % n];
    right = order[(pos + 1) % n];
  }
  int seg(int delta) const { return ((pos + delta) % n + n) % n; }
};

// Splits [offset, offset+count) elements into pipeline chunks.
template <class Fn>
void forChunks(size_t count, size_t chunkElems, Fn&& fn) {
  for (size_t done = 0; done < count; done += chunkElems) fn(done, std::min(chunkElems, count - done));
}

// One pass around the ring: `rsSteps` reduce-scatter steps followed by
// `agSteps` allgather steps (n-1 each, or 0). Step g receives the segment that
// step g+1 sends, so every chunk is forwarded the moment it has landed (and,
// in a reduce-scatter step, been reduced into `data`): the send of step g+1
// never waits for the rest of step g, and one large message streams through
// the ring chunk by chunk instead of step by step. The reduce writes straight
// into the bytes that are sent next; nothing is copied.
class RingPass {
 public:
  RingPass(Communicator& c, const std::vector<int>& order, uint64_t tag, void* data, const RingSegments& segs,
           DataType t, ReduceOp op, size_t esz, bool reduceScatter, bool allgather)
      : c_(c), rp_(c, order), tag_(tag), base_(static_cast<char*>(data)), segs_(segs), t_(t), op_(op), esz_(esz),
        chunkElems_(std::max<size_t>(1, c.config().chunkBytes / esz)),
        rsSteps_(reduceScatter ? rp_.n - 1 : 0), steps_(rsSteps_ + (allgather ? rp_.n - 1 : 0)) {}

  void run() {
    if (rp_.n == 1 || steps_ == 0) return;
    if (rsSteps_) {
      // Two landing buffers: step g+1's receives are posted while step g's are reduced.
      const size_t m = segs_.maxCount() * esz_;
      char* s = static_cast<char*>(c_.scratch(2 * m, 0));
      incoming_[0] = s;
      incoming_[1] = s + m;
    }
    sends_.assign(steps_, {});
    recvs_.assign(steps_, {});
    forChunks(segs_.count[sendSeg(0)], chunkElems_, [&](size_t at, size_t n) { postSend(0, sendSeg(0), at, n); });
    postRecvs(0);
    for (int g = 0; g < steps_; ++g) {
      if (g + 1 < steps_) postRecvs(g + 1);
      const int seg = recvSeg(g);
      size_t k = 0;
      forChunks(segs_.count[seg], chunkElems_, [&](size_t at, size_t n) {
        c_.wait(*recvs_[g][k++]);
        if (g < rsSteps_) reduceInto(t_, op_, at_(seg, at), incoming_[g % 2] + at * esz_, n);
        if (g + 1 < steps_) postSend(g + 1, seg, at, n);
      });
    }
    for (auto& s : sends_) c_.waitAll(s.data(), s.size());
  }

 private:
  bool isRs(int g) const { return g < rsSteps_; }
  int sendSeg(int g) const { return isRs(g) ? rp_.seg(-g - 1) : rp_.seg(-(g - rsSteps_)); }
  // Equal to sendSeg(g + 1): what lands in step g is what step g+1 forwards.
  int recvSeg(int g) const { return isRs(g) ? rp_.seg(-g - 2) : rp_.seg(-(g - rsSteps_) - 1); }
  char* at_(int seg, size_t at) const { return base_ + (segs_.offset[seg] + at) * esz_; }

  void postSend(int g, int seg, size_t at, size_t n) {
    sends_[g].push_back(c_.post(Request::Kind::Send, rp_.right, tag_, at_(seg, at), n * esz_));
  }

  void postRecvs(int g) {
    const int seg = recvSeg(g);
    if (!isRs(g) && rsSteps_ > 0) {
      // An allgather step lands in the segment that reduce-scatter step
      // (g - rsSteps_) sent from: that send must be finished (long since, as
      // the data came round the whole ring, but a transport may still hold it).
      auto& s = sends_[g - rsSteps_];
      c_.waitAll(s.data(), s.size());
    }
    forChunks(segs_.count[seg], chunkElems_, [&](size_t at, size_t n) {
      char* dst = isRs(g) ? incoming_[g % 2] + at * esz_ : at_(seg, at);
      recvs_[g].push_back(c_.post(Request::Kind::Recv, rp_.left, tag_, dst, n * esz_));
    });
  }

  Communicator& c_;
  const RingPosition rp_;
  const uint64_t tag_;
  char* const base_;
  const RingSegments& segs_;
  const DataType t_;
  const ReduceOp op_;
  const size_t esz_, chunkElems_;
  const int rsSteps_, steps_;
  char* incoming_[2] = {nullptr, nullptr};
  std::vector<std::vector<Request*>> sends_, recvs_;  // per step
};

}  // namespace

size_t RingSegments::maxCount() const {
  return count.empty() ? 0 : *std::max_element(count.begin(), count.end());
}

RingSegments RingSegments::even(size_t count, int n) {
  RingSegments s;
  size_t at = 0;
  for (int q = 0; q < n; ++q) {
    size_t c = count / n + (static_cast<size_t>(q) < count % n ? 1 : 0);
    s.offset.push_back(at);
    s.count.push_back(c);
    at += c;
  }
  return s;
}

RingSegments RingSegments::blocks(const std::vector<int>& ringOrder, size_t blockCount) {
  RingSegments s;
  for (int r : ringOrder) {
    s.offset.push_back(static_cast<size_t>(r) * blockCount);
    s.count.push_back(blockCount);
  }
  return s;
}

void ringReduceScatter(Communicator& c, const std::vector<int>& order, uint64_t tag, void* data,
                       const RingSegments& segs, DataType t, ReduceOp op) {
  RingPass(c, order, tag, data, segs, t, op, elementSize(t), true, false).run();
}

void ringAllgather(Communicator& c, const std::vector<int>& order, uint64_t tag, void* data, const RingSegments& segs,
                   size_t esz) {
  RingPass(c, order, tag, data, segs, DataType::Float32, ReduceOp::Sum, esz, false, true).run();
}

void ringReduceScatterAllgather(Communicator& c, const std::vector<int>& order, uint64_t tag, void* data,
                                const RingSegments& segs, DataType t, ReduceOp op) {
  RingPass(c, order, tag, data, segs, t, op, elementSize(t), true, true).run();
}

}  // namespace roce
