// What roce's flight recorder costs per operation (the target: below 0.2 us):
// the three calls the engine makes for every operation (record at issue,
// started, finished), plus the clock reads they imply, on one thread, with
// the ring on (2000 entries, wrapping many times) and off. Timed in this
// thread's CPU time, so that other processes on a busy machine do not count
// (they still cost it cache). Torch-free:
//
//   g++ -O2 -std=c++20 -Icsrc benchmarks/trace_cost.cpp csrc/engine/trace.cpp -o /tmp/trace_cost -lpthread
//   /tmp/trace_cost [operations]
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "engine/trace.hpp"

namespace {

double cpuNs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

double nsPerOp(roce::TraceRing& ring, long ops) {
  roce::TraceEntry e;
  e.op = "allreduce";
  e.bytes = 8;
  e.inElems = e.outElems = 2;
  e.inDtype = e.outDtype = 6;
  const double t0 = cpuNs();
  for (long i = 0; i < ops; ++i) {
    e.seq = static_cast<uint64_t>(i) + 1;
    const uint64_t pos = ring.record(e);
    ring.started(pos, roce::TraceRing::nowNs(), true);  // the engine reuses its deadline's clock read here
    ring.finished(pos, roce::TraceRing::nowNs(), "shm", nullptr);
  }
  return (cpuNs() - t0) / ops;
}

}  // namespace

int main(int argc, char** argv) {
  const long ops = argc > 1 ? std::atol(argv[1]) : 5000000;
  roce::TraceRing on(2000), off(0);
  nsPerOp(on, ops / 10);  // warm up
  double bestOn = 1e9, bestOff = 1e9;
  for (int rep = 0; rep < 5; ++rep) {
    bestOn = std::min(bestOn, nsPerOp(on, ops));
    bestOff = std::min(bestOff, nsPerOp(off, ops));
  }
  std::printf("trace on:  %.1f ns per operation (record + started + finished + 2 clock reads)\n", bestOn);
  std::printf("trace off: %.1f ns per operation (ROCE_PG_TRACE_ENTRIES=0: 2 clock reads)\n", bestOff);
  std::printf("recording: %.1f ns per operation\n", bestOn - bestOff);
}
