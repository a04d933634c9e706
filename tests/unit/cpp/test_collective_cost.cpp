// Estimates of every call for torch's time estimation (csrc/algorithms/
// collective_cost.*): allreduce is the cost model's, the others follow their
// algorithms' forms: they grow with the size, a ring's bandwidth term with
// (p-1)/p, and one machine uses the shared-memory constants.
#include <cmath>

#include "algorithms/collective_cost.hpp"
#include "common/config.hpp"
#include "roce_check.hpp"

using roce::algorithms::CollectiveKind;
using roce::Config;
using roce::algorithms::CostConstants;
using roce::algorithms::Shape;
using roce::algorithms::estimateCall;

namespace {
constexpr size_t MiB = 1024 * 1024;
const CollectiveKind kAll[] = {CollectiveKind::Allreduce, CollectiveKind::Reduce,        CollectiveKind::Broadcast,
                               CollectiveKind::Allgather, CollectiveKind::ReduceScatter, CollectiveKind::Gather,
                               CollectiveKind::Scatter,   CollectiveKind::AllToAll,      CollectiveKind::PointToPoint};
Shape machines(int n, int perMachine) { return Shape::group(n * perMachine, n, perMachine, true, false); }
}  // namespace

TEST(one_rank_costs_nothing) {
  const Config cfg;
  for (CollectiveKind k : kAll) CHECK_EQ(estimateCall(cfg, machines(1, 1), k, MiB), 0.0);
}

TEST(every_call_grows_with_its_size_and_costs_at_least_a_message) {
  const Config cfg;
  const CostConstants k(cfg);
  for (const Shape& s : {machines(4, 1), machines(1, 4), machines(2, 4)}) {
    for (CollectiveKind kind : kAll) {
      INFO("kind ", static_cast<int>(kind), " ranks ", s.ranks, " machines ", s.machines);
      const double small = estimateCall(cfg, s, kind, 1024), big = estimateCall(cfg, s, kind, 64 * MiB);
      CHECK_GT(small, 0.0);
      CHECK_GT(big, small);
      CHECK_GE(small, std::min(k.shmAlpha, k.netAlpha));
    }
    CHECK_GT(estimateCall(cfg, s, CollectiveKind::Barrier, 0), 0.0);
  }
}

TEST(allreduce_is_the_cost_models_and_rings_follow_alpha_beta) {
  const Config cfg;
  const CostConstants k(cfg);
  const Shape net = machines(4, 1);
  CHECK_EQ(estimateCall(cfg, net, CollectiveKind::Allreduce, MiB), roce::algorithms::costStagedHostReduce(cfg, net, MiB, false));
  const double n = 8.0 * MiB;
  // Allgather of 2 MiB blocks among 4: 3 messages, 3/4 of 8 MiB through each rank.
  CHECK(std::abs(estimateCall(cfg, net, CollectiveKind::Allgather, 2 * MiB) - (3 * k.netAlpha + 0.75 * n * k.netBeta)) <
        1e-12);
  CHECK(std::abs(estimateCall(cfg, net, CollectiveKind::ReduceScatter, 8 * MiB) -
                 (3 * k.netAlpha + 0.75 * n * (k.netBeta + k.gamma))) < 1e-12);
  // One machine: the shared-memory constants.
  const Shape shm = machines(1, 4);
  CHECK(std::abs(estimateCall(cfg, shm, CollectiveKind::PointToPoint, MiB) - (k.shmAlpha + MiB * k.shmBeta)) < 1e-12);
  CHECK(std::abs(estimateCall(cfg, net, CollectiveKind::PointToPoint, MiB) - (k.netAlpha + MiB * k.netBeta)) < 1e-12);
}
