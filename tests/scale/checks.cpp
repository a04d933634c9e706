#include "checks.hpp"

#include <algorithm>
#include <set>
#include <vector>

#include "../../csrc/algorithms/algorithms.hpp"
#include "../../csrc/comm/communicator.hpp"
#include "../../csrc/common/error.hpp"
#include "operation.hpp"
#include "patterns.hpp"

namespace scale {
namespace {

using roce::DataType;
using roce::ReduceOp;
using roce::Reduction;

// Per-rank buffers of the checks stay below this, so 1,024 ranks fit.
constexpr size_t kMaxCheckBytes = 2u << 20;

using roce::str;

// The first, the last and a middle rank: roots at both ends of the ring and
// one inside it (recursive trees rooted elsewhere than 0 relabel ranks).
std::vector<int> rootsOf(int n) {
  std::set<int> roots{0, n - 1, (n / 2 + 1) % n};
  return {roots.begin(), roots.end()};
}

std::vector<int64_t> reductionInput(int rank, size_t count, int n, size_t first = 0) {
  std::vector<int64_t> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = reduceInput(rank, first + i, n);
  return v;
}

std::vector<uint8_t> bytesFrom(int from, int to, size_t len) {
  std::vector<uint8_t> v(len);
  for (size_t j = 0; j < len; ++j) v[j] = byteOf(from, to, j);
  return v;
}

void checkReduce(Checker& k, size_t count) {
  const int n = k.comm.size(), me = k.comm.rank();
  for (int root : rootsOf(n)) {
    auto data = reductionInput(me, count, n);
    const std::string what = str("reduce SUM of ", count, " int64 to root ", root);
    k.run(what, [&] { roce::algorithms::reduce(k.comm, data.data(), count, DataType::Int64, Reduction{ReduceOp::Sum}, root); });
    if (me == root) k.expect(what, data.data(), count, [&](size_t i) { return expectedSum(i, n); });
    else k.expect(what + " (a non-root's input)", data.data(), count, [&](size_t i) { return reduceInput(me, i, n); });
  }
}

void checkBroadcast(Checker& k) {
  const int n = k.comm.size(), me = k.comm.rank();
  // 1.5 MB goes down the chain, the others down the binomial tree.
  for (size_t len : {size_t(1), size_t(1000), size_t(3) << 19})
    for (int root : rootsOf(n)) {
      std::vector<uint8_t> data = me == root ? bytesFrom(root, 0, len) : std::vector<uint8_t>(len, 0);
      const std::string what = str("broadcast of ", len, " bytes from root ", root);
      k.run(what, [&] { roce::algorithms::broadcast(k.comm, data.data(), len, root); });
      k.expect(what, data.data(), len, [&](size_t j) { return byteOf(root, 0, j); });
    }
}

// A barrier lets no rank out before all came in: each rank counts itself in
// the store before, and reads the count after.
void checkBarrier(Checker& k) {
  const int n = k.comm.size();
  for (int round = 0; round < 3; ++round) {
    const std::string key = str("barrier-check/", k.group(), "/", round);
    k.store.add(key, 1);
    const std::string what = str("barrier ", round);
    k.run(what, [&] { roce::algorithms::barrier(k.comm); });
    const int64_t arrived = k.store.add(key, 0);
    k.expect(what + ": ranks in before anyone left", &arrived, 1, [&](size_t) { return int64_t(n); });
  }
}

void checkGatherScatter(Checker& k) {
  const int n = k.comm.size(), me = k.comm.rank();
  for (size_t block : {size_t(1), size_t(100)})
    for (int root : rootsOf(n)) {
      const auto mine = bytesFrom(me, root, block);
      std::vector<uint8_t> all(me == root ? block * n : 0);
      std::string what = str("gather of ", block, "-byte blocks to root ", root);
      k.run(what, [&] { roce::algorithms::gather(k.comm, mine.data(), all.data(), block, root); });
      if (me == root) k.expect(what, all.data(), all.size(), [&](size_t j) { return byteOf(j / block, root, j % block); });

      std::vector<uint8_t> blocks;
      if (me == root)
        for (int to = 0; to < n; ++to) {
          const auto b = bytesFrom(root, to, block);
          blocks.insert(blocks.end(), b.begin(), b.end());
        }
      std::vector<uint8_t> got(block);
      what = str("scatter of ", block, "-byte blocks from root ", root);
      k.run(what, [&] { roce::algorithms::scatter(k.comm, blocks.data(), got.data(), block, root); });
      k.expect(what, got.data(), block, [&](size_t j) { return byteOf(root, me, j); });
    }
}

// Rank `from` sends this many bytes to rank `to`: 0 to 66, some pairs nothing.
size_t alltoallBytes(int from, int to) { return static_cast<size_t>((from * 5 + to * 3) % 7) * 11; }

void checkAlltoallv(Checker& k) {
  const int n = k.comm.size(), me = k.comm.rank();
  std::vector<size_t> sendBytes(n), sendOffsets(n), recvBytes(n), recvOffsets(n);
  std::vector<uint8_t> in;
  size_t recvTotal = 0;
  for (int q = 0; q < n; ++q) {
    sendBytes[q] = alltoallBytes(me, q);
    sendOffsets[q] = in.size();
    const auto b = bytesFrom(me, q, sendBytes[q]);
    in.insert(in.end(), b.begin(), b.end());
    recvBytes[q] = alltoallBytes(q, me);
    recvOffsets[q] = recvTotal;
    recvTotal += recvBytes[q];
  }
  std::vector<uint8_t> out(recvTotal);
  k.run("alltoallv with uneven sizes",
        [&] { roce::algorithms::alltoallv(k.comm, in.data(), sendBytes, sendOffsets, out.data(), recvBytes, recvOffsets); });
  std::vector<uint8_t> want;
  for (int q = 0; q < n; ++q) {
    const auto b = bytesFrom(q, me, recvBytes[q]);
    want.insert(want.end(), b.begin(), b.end());
  }
  k.expect("alltoallv with uneven sizes", out.data(), out.size(), [&](size_t j) { return want[j]; });
}

}  // namespace

void Checker::run(const std::string& what, const std::function<void()>& body) {
  runOperation(comm, group_ + ": " + what, timeout_, body);
}

void checkAllreduce(Checker& k) {
  const int n = k.comm.size(), me = k.comm.rank();
  // Around rd's 64 KiB and ring's 1 MiB, and fewer elements than ranks.
  for (size_t count : {size_t(1), size_t(3), static_cast<size_t>(n) + 5, size_t(8191), size_t(70001), size_t(140001)})
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max}) {
      auto data = reductionInput(me, count, n);
      const std::string what = str("allreduce ", roce::reduceOpName(op), " of ", count, " int64");
      k.run(what, [&] { roce::algorithms::allreduce(k.comm, data.data(), count, DataType::Int64, Reduction{op}); });
      k.expect(what, data.data(), count,
               [&](size_t i) { return op == ReduceOp::Sum ? expectedSum(i, n) : expectedMax(i, n); });
    }
}

void checkAllgatherAndReduceScatter(Checker& k) {
  const int n = k.comm.size(), me = k.comm.rank();
  const size_t maxBlock = std::max<size_t>(1, kMaxCheckBytes / n);
  for (size_t block : {size_t(1), size_t(24), std::min<size_t>(3000, maxBlock)}) {
    const auto mine = bytesFrom(me, 0, block);
    std::vector<uint8_t> all(block * n);
    const std::string what = str("allgather of ", block, "-byte blocks");
    k.run(what, [&] { roce::algorithms::allgather(k.comm, mine.data(), all.data(), block); });
    k.expect(what, all.data(), all.size(), [&](size_t j) { return byteOf(j / block, 0, j % block); });
  }
  const size_t maxCount = std::max<size_t>(1, kMaxCheckBytes / sizeof(int64_t) / n);
  for (size_t count : {size_t(1), size_t(7), std::min<size_t>(3001, maxCount)}) {
    // Block b of the input is elements [b * count, (b + 1) * count) of one long vector.
    const auto in = reductionInput(me, count * n, n);
    std::vector<int64_t> out(count);
    const std::string what = str("reduce_scatter SUM of ", count, "-element blocks");
    k.run(what, [&] {
      roce::algorithms::reduceScatter(k.comm, in.data(), out.data(), count, DataType::Int64, Reduction{ReduceOp::Sum});
    });
    k.expect(what, out.data(), count, [&](size_t i) { return expectedSum(me * count + i, n); });
  }
}

void checkFewPeerCollectives(Checker& k) {
  checkAllreduce(k);
  checkAllgatherAndReduceScatter(k);
  checkReduce(k, 5);  // small: an allreduce on a copy
  checkBroadcast(k);
  checkBarrier(k);
}

void checkAllPeerCollectives(Checker& k) {
  checkReduce(k, 140001);  // 1.1 MB: reduce-scatter, then every segment to the root
  checkGatherScatter(k);
  checkAlltoallv(k);
}

}  // namespace scale
