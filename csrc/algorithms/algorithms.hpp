// Collective algorithms. They see only roce::comm::Communicator (csrc/comm/
// communicator.hpp: point-to-point requests routed to whatever transport
// serves each peer) and, for the single-machine allreduce, allgather,
// broadcast and reduce-scatter, the node's shared memory. Buffers are
// contiguous host memory, except a data-movement call's under GPUDirect RDMA,
// which may be device memory the CPU must not touch (the algorithms copy
// their own blocks with Communicator::copyLocal); the adapter above handles
// tensors, devices and layouts.
//
// Every function is collective over the group and must be called by all ranks
// in the same order. Block layouts are in group-rank order.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "../common/dtype.hpp"

namespace roce::comm {
class Communicator;
}
namespace roce::membership {
struct Topology;
}
namespace roce::algorithms {
using namespace roce::membership;
using namespace roce::comm;


// In place. The algorithm is chosen per call (select.hpp): shared memory when
// the whole group is on one machine, else recursive doubling, Rabenseifner,
// ring, double binary tree or hierarchical by a cost model of size and
// topology, or the one ROCE_PG_ALGO* forces.
void allreduce(Communicator& c, void* data, size_t count, DataType t, Reduction red);
// Result lands in `data` on `root` only; other ranks' `data` is left untouched.
void reduce(Communicator& c, void* data, size_t count, DataType t, Reduction red, int root);
// input: size() blocks of blockCount elements; output: this rank's reduced block.
void reduceScatter(Communicator& c, const void* input, void* output, size_t blockCount, DataType t,
                   Reduction red);
// output: size() blocks of blockBytes; this rank's block is copied from input.
void allgather(Communicator& c, const void* input, void* output, size_t blockBytes);
void broadcast(Communicator& c, void* data, size_t bytes, int root);
// Root receives size() blocks into output (rank order); others only send.
void gather(Communicator& c, const void* input, void* output, size_t blockBytes, int root);
// Root sends block r of input to rank r; every rank receives its block into output.
void scatter(Communicator& c, const void* input, void* output, size_t blockBytes, int root);
// Sends sendBytes[r] bytes from input+sendOffsets[r] to rank r, receives
// recvBytes[r] bytes from rank r into output+recvOffsets[r].
void alltoallv(Communicator& c, const void* input, const std::vector<size_t>& sendBytes,
               const std::vector<size_t>& sendOffsets, void* output, const std::vector<size_t>& recvBytes,
               const std::vector<size_t>& recvOffsets);
void barrier(Communicator& c);

// Building blocks shared by the algorithms above.
namespace detail {
void shmAllreduce(Communicator& c, void* data, size_t count, DataType t, Reduction red);
// The same through the node's shared-memory slots (shm_copies.cpp,
// shm_reduce_scatter.cpp), for a group on one machine; arguments as above.
void shmAllgather(Communicator& c, const void* input, void* output, size_t blockBytes);
void shmBroadcast(Communicator& c, void* data, size_t bytes, int root);
void shmReduceScatter(Communicator& c, const void* input, void* output, size_t blockCount, DataType t,
                      Reduction red);
// Kernel-level building blocks: `op` is a kernel operator (AVG and PREMUL_SUM
// are applied by the callers), `tag` the collective's tag.
// Ring reduce-scatter + allgather among `order` (group ranks, ring order).
void ringAllreduce(Communicator& c, const std::vector<int>& order, uint64_t tag, void* data, size_t count,
                   DataType t, ReduceOp op);
void hierAllreduce(Communicator& c, uint64_t tag, void* data, size_t count, DataType t, ReduceOp op);
// Hierarchical reduce-scatter: `work` holds size() blocks of blockCount laid
// out shard-major, rank r's block at hierBlockIndex(r); returns where this
// rank's reduced block ends up (inside `work`).
size_t hierBlockIndex(const Topology& topo, int rank);
char* hierReduceScatter(Communicator& c, uint64_t tag, void* work, size_t blockCount, DataType t, ReduceOp op);
// Hierarchical allgather into `output` (size() blocks in rank order); input may alias its slot.
void hierAllgather(Communicator& c, uint64_t tag, const void* input, void* output, size_t blockBytes);
// Into `output` (size() blocks in rank order); the input block may alias its slot.
void bruckAllgather(Communicator& c, uint64_t tag, const void* input, void* output, size_t blockBytes);
}  // namespace detail

}  // namespace roce::algorithms
