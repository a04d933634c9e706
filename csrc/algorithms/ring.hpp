// Ring reduce-scatter and allgather over segments indexed by ring position,
// pipelined by chunk (ROCE_PG_CHUNK_BYTES): each chunk is forwarded to the
// next step as soon as it has landed and been reduced, while later chunks are
// still in flight. `order` lists the ring's members (group ranks): the whole
// group in Communicator::topology().ringOrder, or a subset (one machine's
// ranks, or one rank per machine, in the hierarchical algorithms); this rank
// must be in it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "../common/dtype.hpp"
#include "../transport/transport.hpp"
#include "allreduce_call.hpp"
#include "cost_model.hpp"
#include "pass.hpp"
#include "select.hpp"

namespace roce::comm {
class Communicator;
}
namespace roce {
class HelperThread;
}
namespace roce::algorithms {
using namespace roce::comm;
using namespace roce::transport;


// The channelled ring allreduce's entry in the allreduce registry
// (allreduce_registry.hpp; the code is in allreduce.cpp).
struct RingAllreduce {
  static constexpr Algo id = Algo::Ring;
  static constexpr const char* name = "ring";
  static constexpr bool amongMachines = true, pipelines = true;
  static double cost(const CostConstants& k, const Shape& s, double bytes, Algo) { return costRing(k, s, bytes); }
  static void run(const AllreduceCall& a);
};

// Scratch indices of channels 1.. of a channelled ring (channel 0 uses the
// pass's default, 0): kScratchChannel + k - 1. Below it: reduce/reduce-scatter
// copies (1), recursive and tree (2: never at the same time), hierarchical
// phases (3, 4).
constexpr int kScratchChannel = 5;
// Tag of channel k of the collective with tag `tag`: derived, not drawn from
// the sequence, so ranks that split one call differently (hier's shards differ
// by an element) still agree on every later call's tags. Collective tags are
// sequence numbers far below bit 56; point-to-point tags use bit 63.
inline uint64_t channelTag(uint64_t tag, int k) { return tag | (static_cast<uint64_t>(k) << 56); }

struct RingSegments {
  std::vector<size_t> offset;  // in elements, per ring position
  std::vector<size_t> count;
  size_t maxCount() const;
  // count elements split as evenly as possible over n positions.
  static RingSegments even(size_t count, int n);
  // Position q is the block of rank ringOrder[q], blocks of blockCount in rank order.
  static RingSegments blocks(const std::vector<int>& ringOrder, size_t blockCount);
  // Positions 0..n-1, position q at q * stride, `count` elements each.
  static RingSegments strided(int n, size_t stride, size_t count);
};

// One pass around the ring: n-1 reduce-scatter steps and/or n-1 allgather
// steps. Step g receives the segment that step g+1 sends, so every chunk is
// forwarded the moment it has landed (and, in a reduce-scatter step, been
// reduced into `data`): step g+1 never waits for the rest of step g, one large
// message streams through the ring chunk by chunk, and with both halves the
// reduce-scatter's last step flows straight into the allgather's first. The
// reduce writes into the bytes that are sent next; nothing is copied.
//
// Non-blocking form, so that several passes (the phases of the hierarchical
// allreduce on different pieces) can advance together in one wait: start(),
// then advance() until it returns true. run() does both in one wait.
// Concurrent passes need distinct tags and distinct scratch indices.
//
// As channel k of a collective (asChannel), a pass tags its requests with lane
// k+1 (its own queue pair) and, given a helper thread, reduces there: the
// progress thread only posts and forwards, and advance() reports "not yet"
// while the helper works on a chunk. The destructor waits for a running
// reduction, so a pass that unwinds never leaves a helper writing into freed
// memory.
class RingPass : public Pass {
 public:
  RingPass(Communicator& c, const std::vector<int>& order, uint64_t tag, void* data, RingSegments segs, DataType t,
           ReduceOp op, bool reduceScatter, bool allgather, int scratchIndex = 0);
  ~RingPass() override;
  RingPass(const RingPass&) = delete;
  RingPass& operator=(const RingPass&) = delete;
  void asChannel(int channel, HelperThread* helper);
  void start() override;
  // Reduces and forwards whatever has landed; true once every receive has
  // been processed and every send has finished. Throws on a failed request.
  bool advance() override;
  void run();

 private:
  int recvSeg(int g) const;  // == sendSeg(g + 1)
  int sendSeg(int g) const;
  bool isRs(int g) const { return g < rsSteps_; }
  char* at(int seg, size_t at) const { return base_ + (segs_.offset[seg] + at) * esz_; }
  void postSend(int g, int seg, size_t at, size_t n);
  bool canPostRecvs(int g) const;
  void postRecvs(int g);
  // Reduces the landed chunk into the tensor; false while a helper still works on it.
  bool reduced(int seg, size_t at, size_t n);
  struct ReduceJob {
    DataType t;
    ReduceOp op;
    void* dst;
    const void* src;
    size_t n;
  };
  static void runReduce(void* job);

  Communicator& c_;
  int n_, pos_, left_, right_;
  uint64_t tag_;
  char* base_;
  RingSegments segs_;
  DataType t_;
  ReduceOp op_;
  size_t esz_, chunkElems_;
  int rsSteps_, steps_, scratchIndex_;
  char* incoming_[2] = {nullptr, nullptr};  // landing buffers of the reduce-scatter steps, by step parity
  std::vector<std::vector<Request*>> sends_, recvs_;  // per step
  int step_ = 0;            // the step being processed
  size_t chunk_ = 0;        // its next chunk
  int recvsPosted_ = -1;    // receives are posted up to this step
  bool started_ = false;
  uint8_t lane_ = 0;
  HelperThread* helper_ = nullptr;
  ReduceJob job_{};
  bool reducing_ = false;  // job_ was submitted to helper_ and not yet collected
};

// Afterwards ring position q holds the fully reduced segment q.
void ringReduceScatter(Communicator& c, const std::vector<int>& order, uint64_t tag, void* data,
                       const RingSegments& segs, DataType t, ReduceOp op);
// Starting with segment q complete at position q, leaves every segment everywhere.
void ringAllgather(Communicator& c, const std::vector<int>& order, uint64_t tag, void* data, const RingSegments& segs,
                   size_t elemSize);
// Both in one pass (the allreduce).
void ringReduceScatterAllgather(Communicator& c, const std::vector<int>& order, uint64_t tag, void* data,
                                const RingSegments& segs, DataType t, ReduceOp op);

}  // namespace roce::algorithms
