#include "timing.hpp"

#include <algorithm>
#include <vector>

#include "../../csrc/algorithms/algorithms.hpp"
#include "../../csrc/comm/communicator.hpp"
#include "../../csrc/common/error.hpp"
#include "checks.hpp"
#include "patterns.hpp"

namespace scale {
namespace {

using Clock = std::chrono::steady_clock;

// The slowest rank's warm-up, in microseconds, as every rank learns it.
int64_t slowestMicros(Checker& k, Clock::duration mine) {
  int64_t us = std::chrono::duration_cast<std::chrono::microseconds>(mine).count();
  k.run("agreeing on the iteration count", [&] {
    roce::algorithms::allreduce(k.comm, &us, 1, roce::DataType::Int64, roce::Reduction{roce::ReduceOp::Max});
  });
  return std::max<int64_t>(us, 1);
}

}  // namespace

double timeAllreduce(Checker& k, size_t bytes, int maxIters, std::chrono::milliseconds budget) {
  const int n = k.comm.size(), me = k.comm.rank();
  const size_t count = std::max<size_t>(1, bytes / sizeof(int64_t));
  std::vector<int64_t> data(count);
  for (size_t i = 0; i < count; ++i) data[i] = reduceInput(me, i, n);
  const std::string what = roce::str("allreduce MAX of ", count * sizeof(int64_t), " bytes");
  const auto call = [&] {
    k.run(what, [&] {
      roce::algorithms::allreduce(k.comm, data.data(), count, roce::DataType::Int64, roce::Reduction{roce::ReduceOp::Max});
    });
  };
  const auto warm = Clock::now();
  call();
  const int64_t pace = slowestMicros(k, Clock::now() - warm);
  const int iters = static_cast<int>(std::clamp<int64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(budget).count() / pace, 1, maxIters));
  k.run("barrier before timing", [&] { roce::algorithms::barrier(k.comm); });
  const auto start = Clock::now();
  for (int i = 0; i < iters; ++i) call();
  const std::chrono::duration<double> took = Clock::now() - start;
  k.expect(what + " (timed)", data.data(), count, [&](size_t i) { return expectedMax(i, n); });
  return took.count() / iters;
}

int defaultIterations(size_t bytes) { return bytes <= (64u << 10) ? 20 : bytes <= (4u << 20) ? 5 : 2; }

}  // namespace scale
