// Releasing a broken group's verbs objects off the caller's thread.
//
// Why: Soft-RoCE (rdma_rxe in Linux 6.1, Debian 12's kernel) waits up to
// 50 s inside a destroy verb (ibv_destroy_qp, ibv_dereg_mr, ibv_destroy_cq)
// for references the driver still holds to the object: after a port went
// down, packets it queued on the stopped netdev keep their queue pair busy.
// destroy_process_group on a group broken that way would block for those
// 50 s. The objects are already harmless when a group is broken: its queue
// pairs are in the error state, so the NIC no longer reads or writes their
// buffers, and the shared pools' slots go back at once. So
// the group returns, and the reaper destroys its queue pairs, registrations
// and CQs afterwards, in the order the verbs require, keeping the devices
// (protection domain, context) alive until then.
//
// One thread per process, started when there is something to release and
// gone when there is nothing left: a healthy job never has one, and groups
// that shut down in order release their objects on the spot.
#pragma once
#include <chrono>
#include <memory>
#include <vector>

#include "memory_region.hpp"

namespace roce::transport::verbs {

class CqSet;
class LandingPool;
class RegCache;
class StagingPool;
class Pair;

// What a broken group leaves behind: released in this order by the destructor.
struct VerbsRemains {
  std::vector<std::unique_ptr<verbs::Pair>> pairs;    // queue pairs before the CQs they post to
  std::vector<std::unique_ptr<RegCache>> regCaches;   // user buffers' registrations
  std::vector<std::unique_ptr<CqSet>> cqs;            // their wake-ups detached (CqSet::detachWake)
  std::shared_ptr<LandingPool> landing;               // the process's pools: freed here if the
  std::shared_ptr<StagingPool> staging;               // group was their last user
  Rails rails;                                        // last: the devices the objects belong to
  VerbsRemains();
  ~VerbsRemains();
};

// Hands `remains` to the process's reaper thread (started if none runs).
// `delay`: ROCE_PG_TEST_FAULT=slow_teardown, the driver's wait made certain.
// If no thread can be started, releases them here.
void releaseLater(std::unique_ptr<VerbsRemains> remains, std::chrono::milliseconds delay);

// Remains handed over and not released yet (_runtime_stats()["verbs_remains_pending"]).
size_t remainsPending();

}  // namespace roce::transport::verbs
