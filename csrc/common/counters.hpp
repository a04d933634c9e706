// Per-group traffic counters, readable from Python (roce_pg.counters()) while
// the progress thread updates them: relaxed atomics, because they are
// statistics and order nothing. Tests use them to check what an algorithm
// put on which transport; benchmarks to report bytes per rank.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>

namespace roce {

struct Counters {
  std::atomic<uint64_t> bytesSentShm{0};  // payload bytes posted to same-machine peers
  std::atomic<uint64_t> bytesSentNet{0};  // payload bytes posted to the network transport (TCP or verbs)
  std::atomic<uint64_t> bytesCopied{0};   // bytes a transport memcpy'd into or out of staging
  std::atomic<uint64_t> ops{0};           // operations begun (collectives and point-to-point)
  std::atomic<uint64_t> sends{0};         // messages posted (latency: an algorithm's rounds show here)
  std::atomic<uint64_t> blockedWaits{0};  // times an idle wait blocked in poll() instead of spinning or sleeping
  std::atomic<uint64_t> inlineOps{0};     // collectives run on the caller's thread (Engine::runInline)
  std::atomic<uint64_t> bytesWritten{0};   // payload bytes of one-sided writes into peers' windows (RDMA WRITE)
  std::atomic<uint64_t> bytesRead{0};      // payload bytes of one-sided reads from peers' windows (RDMA READ)
  std::atomic<uint64_t> windowPutsServed{0};  // puts of network peers this rank's window services received as messages
  std::atomic<uint64_t> windowSignalsServed{0};  // signals of network peers this rank's window services counted
  std::atomic<uint64_t> bytesZeroCopy{0}; // payload bytes the NIC moved straight from/into user buffers (verbs)
  std::atomic<uint64_t> registrations{0}; // ibv_reg_mr calls of the verbs registration cache
  std::atomic<uint64_t> eagerSends{0};    // verbs messages sent eagerly (no RTR round trip)
  std::atomic<uint64_t> stagingWaits{0};  // verbs chunks held back: the process's staging pool had no free slot
  std::atomic<uint64_t> landingWaits{0};  // verbs landing grants a receive needed that found no open slot free
  std::atomic<uint64_t> bytesReducedOnDevice{0};  // staged bytes reduced on their device (ROCE_PG_DEVICE_REDUCE)
  std::atomic<uint64_t> deviceBytesStaged{0};  // device tensor bytes copied through host staging buffers
  std::atomic<uint64_t> deviceBytesDirect{0};  // device tensor bytes handed to the transport itself (GPUDirect)
  std::atomic<uint64_t> deviceBytesLocal{0};   // GPUDirect: own blocks an algorithm copied within the rank, on the device
  std::atomic<uint64_t> workerSlices{0};  // slices of local copies/reductions run by worker-pool threads
  std::atomic<uint64_t> deviceWaitsNotified{0};  // waits for device work woken by a host function (no polling)
  std::atomic<uint64_t> deviceWaitNaps{0};  // naps of waits for device work polling its event (no host functions)
  // Time inside collectives (start to end on the thread that ran them) and
  // their count: a rank that keeps the others waiting spends little time
  // inside, the ones it keeps waiting much (roce_pg.straggler_report()).
  std::atomic<uint64_t> collectiveNs{0};
  std::atomic<uint64_t> collectivesTimed{0};
  // When the counters were last reset (steady clock, ns): the window they cover.
  std::atomic<int64_t> resetAtNs{steadyNs()};
  // Gauges, not reset:
  std::atomic<uint64_t> cachedMrs{0};        // memory registrations the verbs cache holds right now
  std::atomic<uint64_t> connections{0};      // network peers connected (TCP socket, or verbs queue pairs)
  std::atomic<uint64_t> registeredBytes{0};  // bytes the verbs transport registered for this group's own
                                             // buffers (its connections' control rings; not user tensors,
                                             // not the process's landing and staging pools)

  static void add(std::atomic<uint64_t>& c, uint64_t n) { c.fetch_add(n, std::memory_order_relaxed); }
  static int64_t steadyNs() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  void reset() {
    for (auto* c : {&bytesSentShm, &bytesSentNet, &bytesCopied, &ops, &sends, &blockedWaits, &inlineOps,
                    &bytesWritten, &bytesRead, &windowPutsServed, &windowSignalsServed, &bytesZeroCopy, &registrations, &eagerSends, &stagingWaits, &landingWaits, &bytesReducedOnDevice, &deviceBytesStaged,
                    &deviceBytesDirect, &deviceBytesLocal, &workerSlices, &deviceWaitsNotified, &deviceWaitNaps})
      c->store(0, std::memory_order_relaxed);
    resetWindow();
  }
  // Only the straggler window (collectiveNs, collectivesTimed, resetAtNs):
  // straggler_report() starts a new one without zeroing the traffic counters.
  void resetWindow() {
    collectiveNs.store(0, std::memory_order_relaxed);
    collectivesTimed.store(0, std::memory_order_relaxed);
    resetAtNs.store(steadyNs(), std::memory_order_relaxed);
  }
};

}  // namespace roce
