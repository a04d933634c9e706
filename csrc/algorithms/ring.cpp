#include "ring.hpp"

#include <algorithm>
#include <cstdint>

#include "../comm/communicator.hpp"
#include "../common/error.hpp"
#include "../common/helper_thread.hpp"
#include "../reduce/reduce.hpp"
#include "on_workers.hpp"

namespace roce::algorithms {
using namespace roce::comm;
using namespace roce::reduce;

namespace {

// Splits [0, count) elements into pipeline chunks.
template <class Fn>
void forChunks(size_t count, size_t chunkElems, Fn&& fn) {
  for (size_t done = 0; done < count; done += chunkElems) fn(done, std::min(chunkElems, count - done));
}

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

RingSegments RingSegments::strided(int n, size_t stride, size_t count) {
  RingSegments s;
  for (int q = 0; q < n; ++q) {
    s.offset.push_back(static_cast<size_t>(q) * stride);
    s.count.push_back(count);
  }
  return s;
}

RingPass::RingPass(Communicator& c, const std::vector<int>& order, uint64_t tag, void* data, RingSegments segs,
                   DataType t, ReduceOp op, bool reduceScatter, bool allgather, int scratchIndex)
    : c_(c), tag_(tag), base_(static_cast<char*>(data)), segs_(std::move(segs)), t_(t), op_(op),
      esz_(elementSize(t)), chunkElems_(std::max<size_t>(1, c.config().algo.chunkBytes / esz_)),
      scratchIndex_(scratchIndex) {
  n_ = static_cast<int>(order.size());
  pos_ = static_cast<int>(std::find(order.begin(), order.end(), c.rank()) - order.begin());
  if (pos_ == n_) throwInvalid("ring pass: this rank is not a member of the ring");
  left_ = order[(pos_ + n_ - 1) % n_];
  right_ = order[(pos_ + 1) % n_];
  rsSteps_ = reduceScatter ? n_ - 1 : 0;
  steps_ = rsSteps_ + (allgather ? n_ - 1 : 0);
}

RingPass::~RingPass() {
  if (reducing_) helper_->waitIdle();
}

void RingPass::asChannel(int channel, HelperThread* helper) {
  lane_ = static_cast<uint8_t>(channel + 1);
  helper_ = helper;
}

void RingPass::runReduce(void* job) {
  const auto& j = *static_cast<const ReduceJob*>(job);
  reduceInto(j.t, j.op, j.dst, j.src, j.n);
}

bool RingPass::reduced(int seg, size_t at, size_t n) {
  void* dst = this->at(seg, at);
  const void* src = incoming_[step_ % 2] + at * esz_;
  if (!helper_) {  // channel 0, or no channels: on the progress thread and the worker pool
    detail::reduceIntoOnWorkers(c_, t_, op_, dst, src, n);
    return true;
  }
  if (!reducing_) {
    job_ = ReduceJob{t_, op_, dst, src, n};
    helper_->submit(&RingPass::runReduce, &job_);
    reducing_ = true;
  }
  if (!helper_->idle()) return false;
  reducing_ = false;
  return true;
}

// Ring position of the segment `delta` places from this rank's own.
static int segAt(int pos, int n, int delta) { return ((pos + delta) % n + n) % n; }

int RingPass::sendSeg(int g) const {
  return isRs(g) ? segAt(pos_, n_, -g - 1) : segAt(pos_, n_, -(g - rsSteps_));
}

int RingPass::recvSeg(int g) const {
  return isRs(g) ? segAt(pos_, n_, -g - 2) : segAt(pos_, n_, -(g - rsSteps_) - 1);
}

void RingPass::postSend(int g, int seg, size_t at, size_t n) {
  sends_[g].push_back(c_.post(Request::Kind::Send, right_, tag_, this->at(seg, at), n * esz_, lane_));
}

// Receives of step g may be posted once the step before the previous one
// (same landing buffer) is processed, and, for an allgather step that lands in
// the segment reduce-scatter step s = g - rsSteps_ sent from, once that send
// has finished (long since, as the data came round the whole ring, but a
// transport may still hold the buffer).
bool RingPass::canPostRecvs(int g) const {
  if (g > step_ + 1) return false;
  if (isRs(g) || rsSteps_ == 0) return true;
  for (const Request* r : sends_[g - rsSteps_])
    if (!r->done) return false;
  return true;
}

void RingPass::postRecvs(int g) {
  const int seg = recvSeg(g);
  forChunks(segs_.count[seg], chunkElems_, [&](size_t at, size_t n) {
    char* dst = isRs(g) ? incoming_[g % 2] + at * esz_ : this->at(seg, at);
    recvs_[g].push_back(c_.post(Request::Kind::Recv, left_, tag_, dst, n * esz_, lane_));
  });
  recvsPosted_ = g;
}

void RingPass::start() {
  started_ = true;
  if (n_ == 1 || steps_ == 0) return;
  if (rsSteps_) {
    const size_t m = segs_.maxCount() * esz_;
    char* s = static_cast<char*>(c_.scratch(2 * m, scratchIndex_));
    incoming_[0] = s;
    incoming_[1] = s + m;
  }
  sends_.assign(steps_, {});
  recvs_.assign(steps_, {});
  forChunks(segs_.count[sendSeg(0)], chunkElems_, [&](size_t at, size_t n) { postSend(0, sendSeg(0), at, n); });
  postRecvs(0);
  if (steps_ > 1) postRecvs(1);
}

bool RingPass::advance() {
  if (!started_) start();
  if (n_ == 1 || steps_ == 0) return true;
  while (step_ < steps_) {
    while (recvsPosted_ + 1 < steps_ && canPostRecvs(recvsPosted_ + 1)) postRecvs(recvsPosted_ + 1);
    if (recvsPosted_ < step_) return false;
    std::vector<Request*>& recvs = recvs_[step_];
    if (chunk_ < recvs.size()) {
      Request* r = recvs[chunk_];
      if (!finished(c_, r)) return false;
      const size_t at = chunk_ * chunkElems_, n = r->len / esz_;
      const int seg = recvSeg(step_);
      if (isRs(step_) && !reduced(seg, at, n)) return false;
      if (step_ + 1 < steps_) postSend(step_ + 1, seg, at, n);
      ++chunk_;
      continue;
    }
    ++step_;
    chunk_ = 0;
  }
  for (auto& s : sends_)
    if (!finished(c_, s)) return false;
  return true;
}

void RingPass::run() {
  start();
  c_.waitUntil([&] { return advance(); }, [&] {
    return str("rank ", left_, " to send ring step ", step_, " (or rank ", right_, " to receive)");
  });
}

void ringReduceScatter(Communicator& c, const std::vector<int>& order, uint64_t tag, void* data,
                       const RingSegments& segs, DataType t, ReduceOp op) {
  RingPass(c, order, tag, data, segs, t, op, true, false).run();
}

void ringAllgather(Communicator& c, const std::vector<int>& order, uint64_t tag, void* data, const RingSegments& segs,
                   size_t esz) {
  // Byte-sized elements: an allgather never looks at the values.
  RingSegments bytes = segs;
  for (size_t q = 0; q < bytes.offset.size(); ++q) {
    bytes.offset[q] *= esz;
    bytes.count[q] *= esz;
  }
  RingPass(c, order, tag, data, std::move(bytes), DataType::UInt8, ReduceOp::Sum, false, true).run();
}

void ringReduceScatterAllgather(Communicator& c, const std::vector<int>& order, uint64_t tag, void* data,
                                const RingSegments& segs, DataType t, ReduceOp op) {
  RingPass(c, order, tag, data, segs, t, op, true, true).run();
}

}  // namespace roce::algorithms
