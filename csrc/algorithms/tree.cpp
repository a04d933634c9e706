// Pipelined double binary tree allreduce, after NCCL's trees
// (docs/ALGORITHMS.md, "The double binary tree"): the first half of the vector is reduced up
// and broadcast down one binary tree, the second half another, and every rank
// is interior in at most one of them, so the two trees together load every
// rank about equally (~2n bytes sent and received per rank). Each half moves
// in chunks: a node reduces chunk k of its children's partial results into
// its own and passes it up as soon as both have landed, the root's chunk k is
// final and goes down at once, and a node forwards chunk k of the result to
// its children as soon as it arrives, so a medium message crosses ~2 lg p
// hops instead of the ring's 2(p-1) steps.
//
// Bitwise identical results: each element's final value is computed once, at
// its tree's root, and only copied below it; the order of every reduction is
// fixed (own data, then the children in position order), so a float sum is
// also the same from one call to the next.
#include "tree.hpp"

#include <algorithm>
#include <bit>
#include <cstdint>

#include "../comm/communicator.hpp"
#include "../common/error.hpp"
#include "../reduce/reduce.hpp"
#include "on_workers.hpp"
#include "ring.hpp"

namespace roce::algorithms {
using namespace roce::comm;
using namespace roce::reduce;

namespace {

// Scratch buffer of the children's partial results (shared with recursive.cpp:
// an allreduce runs one algorithm at a time).
constexpr int kScratchTree = 2;

// In-order binary tree over positions [0, m). Node v > 0 with lowest set bit b
// spans the positions v-b+1 .. v+b-1; its children are v-b/2 and v+b/2 (the
// latter moved down to v+b/4, ... while it is >= m), its parent whichever of
// v-b and v+b has lowest set bit 2b, or v-b when v+b is >= m. Node 0 is the
// root, with one child: the largest power of two below m.
TreeNode inOrderTree(int m, int v) {
  TreeNode n;
  if (m < 2) return n;
  if (v == 0) {
    n.children[0] = static_cast<int>(std::bit_floor(static_cast<unsigned>(m - 1)));
    return n;
  }
  const int b = v & -v;
  n.parent = (v ^ b) | (b << 1);
  if (n.parent >= m) n.parent = v ^ b;
  if (b > 1) {
    n.children[0] = v - b / 2;
    int right = b / 2;
    while (right > 0 && v + right >= m) right /= 2;
    if (right > 0) n.children[1] = v + right;
  }
  return n;
}

}  // namespace

std::array<TreeNode, 2> doubleBinaryTree(int m, int pos) {
  std::array<TreeNode, 2> trees = {inOrderTree(m, pos), inOrderTree(m + 1, pos + 1)};
  // The second tree lives on positions 1..m of m+1: shift back by one and
  // drop node 0, whose only child becomes the root.
  TreeNode& second = trees[1];
  second.parent = second.parent <= 0 ? -1 : second.parent - 1;
  for (int& child : second.children)
    if (child >= 0) child -= 1;
  return trees;
}

TreePass::TreePass(Communicator& c, const Team& team, uint64_t tag, void* data, size_t count, DataType t, ReduceOp op,
                   int chunks, int scratchIndex)
    : c_(c), t_(t), op_(op), esz_(elementSize(t)), scratchIndex_(scratchIndex) {
  const std::array<TreeNode, 2> nodes = doubleBinaryTree(team.size(), team.index);
  auto rankAt = [&](int pos) { return pos < 0 ? -1 : team.rankAt(pos); };
  const size_t firstHalf = (count + 1) / 2;
  chunkElems_ = std::max<size_t>(1, (firstHalf + std::max(chunks, 1) - 1) / std::max(chunks, 1));
  for (int i = 0; i < 2; ++i) {
    Half& h = halves_[i];
    h.node.parent = rankAt(nodes[i].parent);
    for (int k = 0; k < 2; ++k) h.node.children[k] = rankAt(nodes[i].children[k]);
    h.tag = channelTag(tag, i);
    h.base = static_cast<char*>(data) + (i == 0 ? 0 : firstHalf) * esz_;
    h.count = i == 0 ? firstHalf : count - firstHalf;
    h.numChunks = (h.count + chunkElems_ - 1) / chunkElems_;
  }
}

size_t TreePass::chunkCount(const Half& h, size_t k) const {
  return std::min(chunkElems_, h.count - chunkOffset(k));
}

void TreePass::start() {
  started_ = true;
  size_t landingElems = 0;
  for (const Half& h : halves_) landingElems += h.node.numChildren() * h.count;
  char* landing = landingElems ? static_cast<char*>(c_.scratch(landingElems * esz_, scratchIndex_)) : nullptr;
  // Every chunk a child will send has a place to land from the start.
  for (Half& h : halves_) {
    for (int i = 0; i < h.node.numChildren(); ++i) {
      h.landing[i] = landing;
      landing += h.count * esz_;
      for (size_t k = 0; k < h.numChunks; ++k)
        h.fromChild[i].push_back(c_.post(Request::Kind::Recv, h.node.children[i], h.tag,
                                         h.landing[i] + chunkOffset(k) * esz_, chunkCount(h, k) * esz_));
    }
  }
}

void TreePass::sendDown(Half& h, size_t k) {
  for (int i = 0; i < h.node.numChildren(); ++i)
    h.down.push_back(c_.post(Request::Kind::Send, h.node.children[i], h.tag, h.base + chunkOffset(k) * esz_,
                             chunkCount(h, k) * esz_));
}

bool TreePass::advanceHalf(Half& h) {
  const bool root = h.node.parent < 0;
  const int children = h.node.numChildren();
  // Chunks whose children's partial results are all in: reduce them into
  // this rank's data and pass the chunk up; at the root it is final.
  while (h.reduced < h.numChunks) {
    const size_t k = h.reduced;
    bool ready = true;
    for (int i = 0; i < children && ready; ++i) ready = finished(c_, h.fromChild[i][k]);
    if (!ready) break;
    char* mine = h.base + chunkOffset(k) * esz_;
    for (int i = 0; i < children; ++i)
      detail::reduceIntoOnWorkers(c_, t_, op_, mine, h.landing[i] + chunkOffset(k) * esz_, chunkCount(h, k));
    if (root) sendDown(h, k);
    else h.up.push_back(c_.post(Request::Kind::Send, h.node.parent, h.tag, mine, chunkCount(h, k) * esz_));
    ++h.reduced;
  }
  if (!root) {
    // The result lands where the partial result was sent from: its receive
    // is posted once that send is done (a transport may read the buffer until
    // then), in chunk order, as the parent sends them.
    while (h.resultsPosted < h.reduced && finished(c_, h.up[h.resultsPosted])) {
      const size_t k = h.resultsPosted++;
      h.fromParent.push_back(c_.post(Request::Kind::Recv, h.node.parent, h.tag, h.base + chunkOffset(k) * esz_,
                                     chunkCount(h, k) * esz_));
    }
    while (h.forwarded < h.resultsPosted && finished(c_, h.fromParent[h.forwarded])) sendDown(h, h.forwarded++);
  }
  const bool handled = h.reduced == h.numChunks && (root || h.forwarded == h.numChunks);
  return handled && finished(c_, h.down) && finished(c_, h.up);
}

bool TreePass::advance() {
  if (!started_) start();
  const bool first = advanceHalf(halves_[0]);
  const bool second = advanceHalf(halves_[1]);
  return first && second;
}

void TreePass::run() {
  start();
  c_.waitUntil([&] { return advance(); }, [&] {
    const Half& a = halves_[0];
    const Half& b = halves_[1];
    return str("the tree allreduce's parents and children of rank ", c_.rank(), " (first tree: parent ", a.node.parent,
               ", children ", a.node.children[0], " ", a.node.children[1], ", chunks reduced ", a.reduced, "/",
               a.numChunks, ", forwarded ", a.forwarded, "; second tree: parent ", b.node.parent, ", children ",
               b.node.children[0], " ", b.node.children[1], ", chunks reduced ", b.reduced, "/", b.numChunks,
               ", forwarded ", b.forwarded, ")");
  });
}

void treeAllreduce(Communicator& c, const Team& team, uint64_t tag, void* data, size_t count, DataType t, ReduceOp op,
                   int chunks) {
  if (team.size() == 1) return;
  TreePass(c, team, tag, data, count, t, op, chunks, kScratchTree).run();
}

void TreeAllreduce::run(const AllreduceCall& a) {
  treeAllreduce(a.c, a.team, a.tag, a.data, a.count, a.t, a.op,
                treeChunksFor(a.c, a.count * elementSize(a.t), a.amongMachines));
}

}  // namespace roce::algorithms
