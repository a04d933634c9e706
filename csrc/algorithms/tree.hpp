// Pipelined double binary tree allreduce (tree.cpp): two binary trees over the
// members of a Team, each carrying half of the vector, reduce up and
// broadcast down chunk by chunk. Depth ~lg p in both directions instead of the
// ring's p-1 steps, and ~2n bytes per rank in total, like the ring.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "../common/dtype.hpp"
#include "allreduce_call.hpp"
#include "cost_model.hpp"
#include "pass.hpp"
#include "select.hpp"
#include "team.hpp"

namespace roce::algorithms {

// One node's place in a binary tree over team positions 0..m-1 (-1: none).
struct TreeNode {
  int parent = -1;
  int children[2] = {-1, -1};  // lower position first: the order of the reduction
  int numChildren() const { return (children[0] >= 0) + (children[1] >= 0); }
};

// Position `pos`'s place in the two trees over m positions. The first is the
// in-order binary tree (a node's subtree is a contiguous range of positions;
// root 0), whose interior nodes are the even positions; the second is the
// in-order tree over positions 1..m of an (m+1)-node tree without its node 0,
// whose interior nodes are the odd positions. So every position is interior
// in at most one tree (for any m), and contiguous ranges, i.e. machines in
// node-sorted order, hold whole subtrees.
std::array<TreeNode, 2> doubleBinaryTree(int m, int pos);

// Non-blocking form (hier advances it together with its in-machine passes).
// Tree t uses tag channelTag(tag, t) (a peer can be this rank's child in one
// tree and its parent in the other), `chunks` chunks per half, and scratch
// `scratchIndex` for the children's partial results (at most 2 x half).
class TreePass : public Pass {
 public:
  TreePass(Communicator& c, const Team& team, uint64_t tag, void* data, size_t count, DataType t, ReduceOp op,
           int chunks, int scratchIndex);
  TreePass(const TreePass&) = delete;
  TreePass& operator=(const TreePass&) = delete;
  void start() override;
  bool advance() override;
  void run();

 private:
  // One tree's half of the vector and where its chunks are.
  struct Half {
    TreeNode node;  // group ranks, not positions
    uint64_t tag = 0;
    char* base = nullptr;
    size_t count = 0, numChunks = 0;
    char* landing[2] = {nullptr, nullptr};   // each child's partial results
    std::vector<Request*> fromChild[2];      // per chunk
    std::vector<Request*> up, fromParent;    // per chunk
    std::vector<Request*> down;              // every send to a child
    size_t reduced = 0, resultsPosted = 0, forwarded = 0;
  };
  size_t chunkOffset(size_t k) const { return k * chunkElems_; }
  size_t chunkCount(const Half& h, size_t k) const;
  void sendDown(Half& h, size_t k);
  bool advanceHalf(Half& h);

  Communicator& c_;
  DataType t_;
  ReduceOp op_;
  size_t esz_, chunkElems_ = 1;
  int scratchIndex_;
  bool started_ = false;
  Half halves_[2];
};

// Kernel-level (op is a kernel operator), in place, among `team`'s members;
// `chunks` per half (treeChunksFor in select.hpp).
void treeAllreduce(Communicator& c, const Team& team, uint64_t tag, void* data, size_t count, DataType t, ReduceOp op,
                   int chunks);

// Its entry in the allreduce registry (allreduce_registry.hpp).
struct TreeAllreduce {
  static constexpr Algo id = Algo::Tree;
  static constexpr const char* name = "tree";
  static constexpr bool amongMachines = true, pipelines = true;
  static double cost(const CostConstants& k, const Shape& s, double bytes, Algo) { return costTree(k, s, bytes); }
  static void run(const AllreduceCall& a);
};

}  // namespace roce::algorithms
