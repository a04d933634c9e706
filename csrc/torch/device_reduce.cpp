#include <roce_torch_headers.hpp>  // first: a precompiled header (setup.py)
#include "device_reduce.hpp"

#include <ATen/core/grad_mode.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <cstdint>

#include <mutex>
#include <set>
#include <tuple>
#include <vector>

#include "../algorithms/algorithms.hpp"
#include "../comm/communicator.hpp"
#include "../common/counters.hpp"
#include "../common/error.hpp"
#include "../common/log.hpp"
#include "device_staging.hpp"

namespace roce::adapter {
using namespace roce::algorithms;
using namespace roce::comm;

namespace {

bool integral(const at::Tensor& t) { return c10::isIntegralType(t.scalar_type(), /*includeBool=*/false); }

// Folds the rows with an in-place binary op, in rank order.
template <class Op>
at::Tensor foldRows(const at::Tensor& rows, Op op) {
  at::Tensor acc = rows[0].clone();
  for (int64_t j = 1; j < rows.size(0); ++j) op(acc, rows[j]);
  return acc;
}

// The slices of a piece of `count` elements among p ranks (as the host
// shared-memory allreduce cuts its chunks): rank j owns [lo(j), lo(j+1)).
struct Slices {
  size_t count;
  int p;
  size_t lo(int j) const { return count * static_cast<size_t>(j) / static_cast<size_t>(p); }
  size_t size(int j) const { return lo(j + 1) - lo(j); }
};

// On `stream`: rows (pinned host, p x m) to the device, reduced, the result
// into `out` (pinned host, m elements). Returns once `out` holds it.
void reduceRowsThroughDevice(Communicator& c, c10::Stream stream, const at::Tensor& rows, const at::Tensor& out,
                             Reduction red) {
  if (out.numel() == 0) return;
  c10::Event done(stream.device_type());
  {
    at::NoGradGuard noGrad;
    // The scratch tensors are allocated on `stream` (the caching allocator
    // ties a block to the stream current at allocation), so freeing them
    // here, before the kernels ran, is stream-ordered and safe.
    c10::StreamGuard guard(stream);
    at::Tensor onDevice = at::empty(rows.sizes(), rows.options().device(stream.device()).pinned_memory(false));
    onDevice.copy_(rows, /*non_blocking=*/true);
    out.copy_(reduceRowsOnDevice(onDevice, red), /*non_blocking=*/true);
    done.record(stream);
  }
  awaitDeviceEvent(done, stream, c, [&] {
    return str("the reduction of ", rows.size(0), " rows of ", out.numel(), " elements on ", stream.device().str());
  });
  Counters::add(c.counters().bytesReducedOnDevice, rows.numel() * rows.element_size());
}

// Step 1 of both collectives: block j of `input` (at byteOffset(j), blockBytes(j))
// to rank j; row j of `rows` (rowBytes each) receives this rank's block from rank j.
template <class Offset, class Size>
void exchangeBlocks(Communicator& c, const at::Tensor& input, Offset byteOffset, Size blockBytes,
                    const at::Tensor& rows, size_t rowBytes) {
  const int p = c.size();
  std::vector<size_t> sendBytes(p), sendOffsets(p), recvBytes(p, rowBytes), recvOffsets(p);
  for (int j = 0; j < p; ++j) {
    sendBytes[j] = blockBytes(j);
    sendOffsets[j] = byteOffset(j);
    recvOffsets[j] = static_cast<size_t>(j) * rowBytes;
  }
  alltoallv(c, input.data_ptr(), sendBytes, sendOffsets, rows.data_ptr(), recvBytes, recvOffsets);
}

// The shapes prepareDeviceReduction launched already. Bounded: beyond the
// limit (a job calling with thousands of distinct sizes) a kernel's first
// launch is left to the progress thread, as without preparation.
constexpr size_t kMaxPrepared = 4096;
// Rows longer than this are prepared at this length: what loads is the
// kernels' module (a first bfloat16 sum after a float one did not wait on the
// H200), and a reduce-scatter's full p x m scratch would double its input's
// device memory at its first call.
constexpr int64_t kMaxPreparedRow = 1 << 16;
using PreparedKey = std::tuple<int, int, int, int, int, int64_t>;  // device type, index, dtype, op, p, m

class PreparedShapes {
 public:
  bool known(const PreparedKey& key) {
    std::lock_guard<std::mutex> g(mu_);
    return done_.size() >= kMaxPrepared || done_.count(key);
  }
  // Runs `launch` for `key` unless a thread did already; one thread at a
  // time (a launch may wait for the device), so a concurrent caller of the
  // same shape returns once the kernels are loaded, not before.
  template <class Launch>
  void prepare(const PreparedKey& key, Launch launch) {
    std::lock_guard<std::mutex> one(launching_);
    if (known(key)) return;
    launch();
    std::lock_guard<std::mutex> g(mu_);
    done_.insert(key);
  }

 private:
  std::mutex mu_, launching_;
  std::set<PreparedKey> done_;
};

PreparedShapes& preparedShapes() {
  static PreparedShapes shapes;
  return shapes;
}

}  // namespace

void prepareDeviceReduction(c10::Stream stream, at::ScalarType dtype, ReduceOp op, int p, int me, int64_t total,
                            int64_t pieceElems) {
  if (total <= 0 || p < 1) return;
  std::vector<int64_t> rowLengths;
  if (pieceElems <= 0) {
    rowLengths.push_back(total);
  } else {
    // Full pieces, and the last one where it is shorter; this rank's slice of each.
    for (int64_t count : {std::min(pieceElems, total), total % pieceElems}) {
      if (count == 0) continue;
      const Slices s{static_cast<size_t>(count), p};
      rowLengths.push_back(static_cast<int64_t>(s.size(me)));
    }
  }
  const c10::Device device = stream.device();
  for (int64_t m : rowLengths) {
    m = std::min(m, kMaxPreparedRow);
    if (m == 0) continue;
    const PreparedKey key{static_cast<int>(device.type()), device.index(), static_cast<int>(dtype),
                          static_cast<int>(op), p, m};
    if (preparedShapes().known(key)) continue;
    // Only a head start: a failure here (out of device memory) is left to the
    // call itself, which then launches the kernels from the progress thread.
    try {
      preparedShapes().prepare(key, [&] {
        at::NoGradGuard noGrad;
        c10::StreamGuard guard(stream);
        // Scratch contents: only the kernels matter, not what they compute.
        at::Tensor rows = at::empty({p, m}, at::TensorOptions().dtype(dtype).device(device));
        reduceRowsOnDevice(rows, Reduction{op, 1.0});
      });
    } catch (const std::exception& e) {
      ROCE_WARN("roce: launching the device reduction of ", p, " x ", m, " ", c10::toString(dtype),
                " ahead of its call failed (the call's progress thread will launch it first): ", e.what());
    }
  }
}

at::Tensor reduceRowsOnDevice(const at::Tensor& rows, Reduction red) {
  const bool isBool = rows.scalar_type() == at::kBool;
  const at::ScalarType dtype = rows.scalar_type();
  switch (red.op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg:
    case ReduceOp::PreMulSum: {
      at::Tensor scaled = rows;
      if (red.op == ReduceOp::PreMulSum)  // each rank's input, as the host's scaleCopy
        scaled = integral(rows) ? (rows.to(at::kDouble) * red.factor).to(dtype) : rows * red.factor;
      at::Tensor sum = isBool ? scaled.any(0) : scaled.sum(0, /*keepdim=*/false, dtype);
      if (red.op == ReduceOp::Avg)
        sum = integral(sum) ? sum.div(rows.size(0), "trunc") : sum.div(rows.size(0));
      return sum;
    }
    case ReduceOp::Product: return isBool ? rows.all(0) : rows.prod(0, /*keepdim=*/false, dtype);
    case ReduceOp::Min: return isBool ? rows.all(0) : rows.amin(0);
    case ReduceOp::Max: return isBool ? rows.any(0) : rows.amax(0);
    case ReduceOp::BAnd: return foldRows(rows, [](at::Tensor& a, const at::Tensor& b) { a.bitwise_and_(b); });
    case ReduceOp::BOr: return foldRows(rows, [](at::Tensor& a, const at::Tensor& b) { a.bitwise_or_(b); });
    case ReduceOp::BXor: return foldRows(rows, [](at::Tensor& a, const at::Tensor& b) { a.bitwise_xor_(b); });
  }
  throwInvalid(str("internal: no device reduction for reduce op ", reduceOpName(red.op)));
}

void reduceReducingOnDevice(Communicator& c, c10::Stream stream, const at::Tensor& piece, const at::Tensor& rows,
                            Reduction red, int root) {
  const int p = c.size(), me = c.rank();
  const size_t esz = piece.element_size();
  const Slices s{static_cast<size_t>(piece.numel()), p};
  const size_t m = s.size(me);
  exchangeBlocks(
      c, piece, [&](int j) { return s.lo(j) * esz; }, [&](int j) { return s.size(j) * esz; }, rows, m * esz);
  const at::Tensor mine = piece.narrow(0, static_cast<int64_t>(s.lo(me)), static_cast<int64_t>(m));
  reduceRowsThroughDevice(c, stream, rows.narrow(0, 0, static_cast<int64_t>(p * m)).view({p, static_cast<int64_t>(m)}),
                          mine, red);
  // Step 3: the reduced slices to everyone, or to the root (input and output
  // are the piece: this rank sends from its own slice and receives into the others').
  std::vector<size_t> sendBytes(p), sendOffsets(p, s.lo(me) * esz), recvBytes(p), recvOffsets(p);
  for (int j = 0; j < p; ++j) {
    sendBytes[j] = root < 0 || j == root ? m * esz : 0;
    recvBytes[j] = root < 0 || me == root ? s.size(j) * esz : 0;
    recvOffsets[j] = s.lo(j) * esz;
  }
  alltoallv(c, piece.data_ptr(), sendBytes, sendOffsets, piece.data_ptr(), recvBytes, recvOffsets);
}

void reduceScatterReducingOnDevice(Communicator& c, c10::Stream stream, const at::Tensor& input,
                                   const at::Tensor& rows, const at::Tensor& out, Reduction red) {
  const int p = c.size();
  const size_t blockBytes = out.numel() * out.element_size();
  exchangeBlocks(
      c, input, [&](int j) { return j * blockBytes; }, [&](int) { return blockBytes; }, rows, blockBytes);
  reduceRowsThroughDevice(c, stream, rows.view({p, out.numel()}), out, red);
}

}  // namespace roce::adapter
