// The allreduce cost model and auto selection (csrc/algorithms/cost_model.*):
// docs/ALGORITHMS.md's worked examples (the choice and every estimate, to
// the microsecond the table rounds to), the precedence of set thresholds
// over the model, hier's algorithm among the machines, and the pieces and
// chunk counts that hier.cpp and tree.cpp cut their vectors by.
#include <cmath>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "algorithms/allreduce_registry.hpp"
#include "algorithms/cost_model.hpp"
#include "algorithms/select.hpp"
#include "common/config.hpp"
#include "roce_check.hpp"

using roce::algorithms::Algo;
using roce::algorithms::Choice;
using roce::Config;
using roce::algorithms::Shape;

namespace {

constexpr size_t KiB = 1024, MiB = 1024 * 1024;

Shape shape(int machines, int perMachine) {
  return Shape::group(machines * perMachine, machines, perMachine, true, false);
}

// One row of docs/ALGORITHMS.md, "Worked examples": estimates in µs, -1 where
// the table has "-" (hier does not apply).
struct Row {
  int machines, perMachine;
  size_t bytes;
  Algo algo, across;
  double rd, rabenseifner, ring, tree, hier;
};

const Row kWorked[] = {
    {2, 1, 8, Algo::Rd, Algo::Rd, 10, 20, 20, 20, -1},
    {2, 1, 64 * KiB, Algo::Rd, Algo::Rd, 29, 35, 35, 49, -1},
    {2, 1, 1 * MiB, Algo::Rabenseifner, Algo::Rd, 309, 253, 253, 418, -1},
    {2, 1, 32 * MiB, Algo::Ring, Algo::Rd, 9573, 7486, 5520, 11170, -1},
    {6, 1, 8, Algo::Rd, Algo::Rd, 40, 60, 100, 60, -1},
    {6, 1, 64 * KiB, Algo::Rd, Algo::Rd, 107, 111, 124, 124, -1},
    {6, 1, 1 * MiB, Algo::Ring, Algo::Rd, 1104, 877, 489, 599, -1},
    {6, 1, 32 * MiB, Algo::Ring, Algo::Rd, 34098, 26191, 9703, 11960, -1},
    {16, 1, 8, Algo::Rd, Algo::Rd, 40, 80, 300, 80, -1},
    {16, 1, 64 * KiB, Algo::Rabenseifner, Algo::Rd, 115, 107, 327, 155, -1},
    {16, 1, 1 * MiB, Algo::Rabenseifner, Algo::Rd, 1235, 517, 737, 661, -1},
    {16, 1, 32 * MiB, Algo::Tree, Algo::Rd, 38292, 14078, 12332, 12213, -1},
    {128, 1, 8, Algo::Rd, Algo::Rd, 70, 140, 2540, 140, -1},
    {128, 1, 64 * KiB, Algo::Rabenseifner, Algo::Rd, 201, 169, 2569, 237, -1},
    {128, 1, 1 * MiB, Algo::Rabenseifner, Algo::Rd, 2162, 603, 3003, 809, -1},
    {128, 1, 32 * MiB, Algo::Tree, Algo::Rd, 67011, 14955, 17355, 12880, -1},
    {1024, 1, 8, Algo::Rd, Algo::Rd, 100, 200, 20460, 200, -1},
    {1024, 1, 64 * KiB, Algo::Rabenseifner, Algo::Rd, 287, 229, 20489, 319, -1},
    {1024, 1, 1 * MiB, Algo::Rabenseifner, Algo::Rd, 3088, 666, 20926, 956, -1},
    {1024, 1, 32 * MiB, Algo::Tree, Algo::Rd, 95730, 15117, 35377, 13290, -1},
    {2, 8, 8, Algo::Rd, Algo::Rd, 13, 26, 48, 26, 24},
    {2, 8, 64 * KiB, Algo::Hier, Algo::Rd, 107, 81, 75, 93, 49},
    {2, 8, 1 * MiB, Algo::Hier, Algo::Rd, 1523, 912, 485, 576, 422},
    {2, 8, 32 * MiB, Algo::Hier, Algo::Ring, 48331, 28369, 12080, 11970, 8120},
    {16, 8, 8, Algo::Rd, Algo::Rd, 43, 86, 524, 86, 54},
    {16, 8, 64 * KiB, Algo::Hier, Algo::Rd, 288, 173, 553, 177, 98},
    {16, 8, 1 * MiB, Algo::Hier, Algo::Rabenseifner, 3959, 1486, 987, 731, 565},
    {16, 8, 32 * MiB, Algo::Hier, Algo::Ring, 125369, 44880, 15339, 12730, 10176},
    {128, 8, 8, Algo::Rd, Algo::Rd, 73, 146, 4332, 146, 84},
    {128, 8, 64 * KiB, Algo::Hier, Algo::Rd, 468, 238, 4361, 259, 147},
    {128, 8, 1 * MiB, Algo::Hier, Algo::Rabenseifner, 6396, 1610, 4798, 879, 635},
    {128, 8, 32 * MiB, Algo::Hier, Algo::Tree, 202406, 46996, 19249, 13142, 11441},
};

// The table prints whole microseconds.
void checkEstimate(const Choice& ch, Algo a, double docUs) {
  INFO("estimate of ", roce::algorithms::algoName(a));
  const double e = ch.estimateFor(a);
  if (docUs < 0) {
    CHECK(std::isnan(e));
    return;
  }
  CHECK_LE(std::fabs(e * 1e6 - docUs), 0.5 + 1e-9);
}

}  // namespace

TEST(worked_examples_of_the_algorithms_doc) {
  const Config defaults;
  for (const Row& r : kWorked) {
    INFO(r.machines, " x ", r.perMachine, ", ", r.bytes, " bytes");
    const Choice ch = roce::algorithms::planAllreduce(defaults, shape(r.machines, r.perMachine), r.bytes);
    CHECK_EQ(std::string(roce::algorithms::algoName(ch.algo)), roce::algorithms::algoName(r.algo));
    if (r.algo == Algo::Hier) CHECK_EQ(std::string(roce::algorithms::algoName(ch.across)), roce::algorithms::algoName(r.across));
    CHECK(ch.decidedBy == nullptr);  // no threshold set: the model decided
    checkEstimate(ch, Algo::Rd, r.rd);
    checkEstimate(ch, Algo::Rabenseifner, r.rabenseifner);
    checkEstimate(ch, Algo::Ring, r.ring);
    checkEstimate(ch, Algo::Tree, r.tree);
    checkEstimate(ch, Algo::Hier, r.hier);
  }
}

TEST(examples_from_the_doc_text) {
  const Config defaults;
  // 1,000 flat ranks at 1 MiB: Rabenseifner folds 976 positions, the tree wins.
  const Choice flat = roce::algorithms::planAllreduce(defaults, shape(1000, 1), 1 * MiB);
  CHECK_EQ(flat.algo, Algo::Tree);
  CHECK_LE(std::fabs(flat.estimateFor(Algo::Tree) * 1e6 - 956), 0.5);
  CHECK_LE(std::fabs(flat.estimateFor(Algo::Rabenseifner) * 1e6 - 1132), 0.5);
  CHECK_LE(std::fabs(flat.estimateFor(Algo::Ring) * 1e6 - 20446), 0.5);
  // 125 x 8 at 4 MiB: the flat tree (2,292 us) beats hier (2,448 us).
  const Choice big = roce::algorithms::planAllreduce(defaults, shape(125, 8), 4 * MiB);
  CHECK_EQ(big.algo, Algo::Tree);
  CHECK_LE(std::fabs(big.estimateFor(Algo::Tree) * 1e6 - 2292), 0.5);
  CHECK_LE(std::fabs(big.estimateFor(Algo::Hier) * 1e6 - 2448), 0.5);
}

TEST(one_machine_costs_from_the_formulas) {
  // rd over 8 ranks of one machine: 3 rounds of hop_s(n) + n*gamma.
  const Config d;
  const roce::algorithms::CostConstants k(d);
  CHECK_LE(std::fabs(k.netAlpha - 10e-6), 1e-20);
  CHECK_LE(std::fabs(k.shmAlpha - 1e-6), 1e-20);
  CHECK_LE(std::fabs(k.gamma - 1 / 8e9), 1e-24);
  const double n = 1e6;
  const double rd = 3 * (1e-6 + n / 10e9 + n / 8e9);
  CHECK_LE(std::fabs(roce::algorithms::costRecursiveDoubling(k, shape(1, 8), n) - rd), 1e-15);
  // The ring over 4 ranks of one machine: segments of n/4 (under one chunk).
  const double seg = n / 4;
  const double ring = 2 * 3 * 1e-6 + 3 * (seg / 8e9 + seg / 10e9) + 3 * seg / 10e9;
  CHECK_LE(std::fabs(roce::algorithms::costRing(k, shape(1, 4), n) - ring), 1e-15);
  // A single rank costs nothing to reduce with itself.
  CHECK_EQ(roce::algorithms::costRecursiveDoubling(k, shape(1, 1), n), 0.0);
  CHECK_EQ(roce::algorithms::costTree(k, shape(1, 1), n), 0.0);
}

TEST(shapes) {
  const Shape forced = Shape::group(8, 2, 4, true, true);  // ROCE_PG_FORCE_NETWORK: every rank a machine
  CHECK_EQ(forced.machines, 8);
  CHECK_EQ(forced.perMachine, 1);
  CHECK(forced.even);
  CHECK(!forced.hierApplies());
  const Shape uneven = Shape::group(7, 2, 4, false, false);
  CHECK(!uneven.hierApplies());
  CHECK(shape(2, 4).hierApplies());
  CHECK(!shape(1, 8).hierApplies());
  const Shape team = shape(16, 8).acrossMachines();
  CHECK_EQ(team.ranks, 16);
  CHECK_EQ(team.machines, 16);
  CHECK_EQ(team.perMachine, 1);
  CHECK_EQ(team.nicSharers, 8);  // the machine's 8 teams share its port
  // hier never applies on uneven machines: no estimate, never picked.
  const Choice ch = roce::algorithms::planAllreduce(Config{}, uneven, 32 * MiB);
  CHECK(std::isnan(ch.estimateFor(Algo::Hier)));
  CHECK_NE(ch.algo, Algo::Hier);
  const roce::algorithms::CostConstants k{Config{}};
  CHECK(std::isnan(roce::algorithms::costHier(k, uneven, 1e6, Algo::Ring)));
}

TEST(set_thresholds_take_precedence_over_the_model) {
  Config rd;
  rd.algo.rdMaxBytes = 8 * KiB;
  rd.algo.rdMaxBytesSet = true;
  const Choice small = roce::algorithms::planAllreduce(rd, shape(16, 1), 4 * KiB);
  CHECK_EQ(small.algo, Algo::Rd);
  REQUIRE(small.decidedBy);
  CHECK_EQ(std::string(small.decidedBy), "ROCE_PG_ALGO_RD_MAX_BYTES");
  // ... and never above it, even where the model alone picks rd.
  CHECK_EQ(roce::algorithms::planAllreduce(Config{}, shape(16, 1), 16 * KiB).algo, Algo::Rd);
  const Choice above = roce::algorithms::planAllreduce(rd, shape(16, 1), 16 * KiB);
  CHECK_NE(above.algo, Algo::Rd);
  CHECK(above.decidedBy == nullptr);
  CHECK(std::isnan(above.estimateFor(Algo::Rd)));

  Config hier;
  hier.algo.hierMinBytes = 1 * KiB;
  hier.algo.hierMinBytesSet = true;
  const Choice h = roce::algorithms::planAllreduce(hier, shape(2, 8), 2 * KiB);  // the model says rd here
  CHECK_EQ(h.algo, Algo::Hier);
  REQUIRE(h.decidedBy);
  CHECK_EQ(std::string(h.decidedBy), "ROCE_PG_ALGO_HIER_MIN_BYTES");
  CHECK_NE(roce::algorithms::planAllreduce(hier, shape(2, 8), 512).algo, Algo::Hier);
  // Where hier does not apply its row is skipped.
  CHECK(roce::algorithms::planAllreduce(hier, shape(16, 1), 2 * KiB).decidedBy == nullptr);

  Config ring;
  ring.algo.ringMinBytes = 256 * KiB;
  ring.algo.ringMinBytesSet = true;
  const Choice flat = roce::algorithms::planAllreduce(ring, shape(16, 1), 1 * MiB);  // the model: rabenseifner
  CHECK_EQ(flat.algo, Algo::Ring);
  REQUIRE(flat.decidedBy);
  CHECK_EQ(std::string(flat.decidedBy), "ROCE_PG_ALGO_RING_MIN_BYTES");
  // Where the model may pick hier, the ring row does not hold.
  const Choice multi = roce::algorithms::planAllreduce(ring, shape(2, 8), 32 * MiB);
  CHECK(multi.decidedBy == nullptr);
  CHECK_EQ(multi.algo, Algo::Hier);
}

TEST(hier_across_the_machines) {
  Config forced;
  forced.algo.allreduceAcross = "tree";
  const Choice f = roce::algorithms::planAcross(forced, shape(16, 8), 4 * MiB, false);
  CHECK_EQ(f.algo, Algo::Tree);
  REQUIRE(f.decidedBy);
  CHECK_EQ(std::string(f.decidedBy), "ROCE_PG_ALGO_ALLREDUCE_ACROSS");
  for (double e : f.estimate) CHECK(std::isnan(e));
  // Overlapped pieces need passes that do not block: only the ring and the tree.
  const Choice over = roce::algorithms::planAcross(Config{}, shape(16, 8), 4 * MiB, true);
  CHECK(std::isnan(over.estimateFor(Algo::Rd)));
  CHECK(std::isnan(over.estimateFor(Algo::Rabenseifner)));
  CHECK(over.algo == Algo::Ring || over.algo == Algo::Tree);
  const Choice seq = roce::algorithms::planAcross(Config{}, shape(16, 8), 8, false);
  CHECK_EQ(seq.algo, Algo::Rd);
  CHECK(std::isnan(seq.estimateFor(Algo::Hier)));
  // With rd forced across, hier's phases run in sequence (no pieces).
  Config rdAcross;
  rdAcross.algo.allreduceAcross = "rd";
  CHECK_EQ(roce::algorithms::hierPieces(roce::algorithms::CostConstants(rdAcross), 64 * MiB), 1);
  const Choice plan = roce::algorithms::planAllreduce(rdAcross, shape(2, 8), 32 * MiB);
  if (plan.algo == Algo::Hier) CHECK_EQ(plan.across, Algo::Rd);
}

TEST(hier_pieces_and_tree_chunks) {
  const roce::algorithms::CostConstants k{Config{}};
  // Pieces of at least max(RING_MIN 1 MiB, 2 chunks of 1 MiB) per shard, 2 to 4.
  CHECK_EQ(roce::algorithms::hierPieces(k, 3 * MiB), 1);
  CHECK_EQ(roce::algorithms::hierPieces(k, 4 * MiB), 2);
  CHECK_EQ(roce::algorithms::hierPieces(k, 7 * MiB), 3);
  CHECK_EQ(roce::algorithms::hierPieces(k, 100 * MiB), 4);
  // The tree: a power of two of chunks per half, each at most one chunk
  // (1 MiB) unless that would take them under 4 KiB.
  for (size_t bytes : {size_t(8), 64 * KiB, 1 * MiB, 3 * MiB, 32 * MiB, 256 * MiB}) {
    for (int machines : {2, 16, 128}) {
      INFO(bytes, " bytes over ", machines, " machines");
      const int chunks = roce::algorithms::treeChunks(k, shape(machines, 1), bytes);
      CHECK_GE(chunks, 1);
      CHECK_EQ(chunks & (chunks - 1), 0);
      const double half = std::ceil(bytes / 2.0), c = std::ceil(half / chunks);
      CHECK(c <= 1 * MiB || c <= 4096);
      if (chunks > 1) CHECK_GT(std::ceil(half / (chunks / 2)), 4096.0);  // half as many would not be under the floor
    }
  }
  CHECK_GE(roce::algorithms::treeChunks(k, shape(16, 1), 32 * MiB), 16);  // 16 MiB halves in chunks of <= 1 MiB
}

TEST(staged_device_reduce_estimates) {
  // Device: two flat exchanges of (p-1)/p of the piece, the rows over PCIe
  // (n in, n/p out at 25 GB/s) and 20 us of launches.
  const Config d;
  const Shape four = shape(1, 4);
  const double n = 4.0 * MiB, share = 3.0 / 4;
  const double shmDevice = 2 * (3 * 1e-6 + share * n / 10e9) + (n + n / 4) / 25e9 + 20e-6;
  CHECK_LE(std::fabs(roce::algorithms::costStagedDeviceReduce(d, four, 4 * MiB, true) - shmDevice), 1e-12);
  // Host on one machine: the shared-memory two-step.
  const double shmHost = 2 * 1e-6 + share * n * (2 / 10e9 + 1 / 8e9);
  CHECK_LE(std::fabs(roce::algorithms::costStagedHostReduce(d, four, 4 * MiB, true) - shmHost), 1e-12);
  CHECK_EQ(roce::algorithms::stagedReducePrefersDevice(d, four, 4 * MiB, true), shmDevice < shmHost);
  // Over the network the host estimate is the cheapest of the model's.
  const Choice ch = roce::algorithms::planAllreduce(d, shape(16, 1), 32 * MiB);
  CHECK_LE(std::fabs(roce::algorithms::costStagedHostReduce(d, shape(16, 1), 32 * MiB, false) - ch.estimateFor(Algo::Tree)), 1e-12);
}

TEST(registry_names_and_flags) {
  using R = roce::algorithms::AllreduceAlgorithms;
  CHECK_EQ(roce::algorithms::candidateCount(), R::size);
  const char* expected[] = {"rd", "rabenseifner", "ring", "tree", "hier"};
  REQUIRE(R::size == 5);
  for (int i = 0; i < R::size; ++i) {
    CHECK_EQ(std::string(roce::algorithms::candidateName(i)), expected[i]);
    CHECK_EQ(std::string(roce::algorithms::algoName(R::ids[i])), expected[i]);  // one name per algorithm
    CHECK_EQ(R::indexOf(R::ids[i]), i);
    CHECK_EQ(R::indexOf(std::string_view(expected[i])), i);
  }
  CHECK_EQ(R::indexOf(Algo::Bruck), -1);
  CHECK_EQ(R::indexOf(std::string_view("auto")), -1);
  // hier composes the others: it never runs among machines itself, and only
  // the pipelined ones (ring, tree) serve its overlapped form.
  CHECK(!R::amongMachines[R::indexOf(Algo::Hier)]);
  CHECK(R::amongMachines[R::indexOf(Algo::Rd)] && R::amongMachines[R::indexOf(Algo::Tree)]);
  CHECK(R::pipelines[R::indexOf(Algo::Ring)] && R::pipelines[R::indexOf(Algo::Tree)]);
  CHECK(!R::pipelines[R::indexOf(Algo::Rd)] && !R::pipelines[R::indexOf(Algo::Rabenseifner)]);
  CHECK_EQ(std::string(roce::algorithms::algoName(Algo::RsGather)), "reduce_scatter+gather");
  CHECK_EQ(std::string(roce::algorithms::algoName(Algo::Shm)), "shm");
}

// The settings that force an algorithm accept exactly the registry's names.
TEST(settings_accept_the_registry_names) {
  std::vector<roce::Setting> table = Config::settings();
  auto choices = [&](const char* name) {
    for (const roce::Setting& s : table)
      if (s.name == name) return s.choices;
    return std::vector<std::string>{};
  };
  CHECK((choices("ROCE_PG_ALGO_ALLREDUCE") == std::vector<std::string>{"auto", "rd", "rabenseifner", "ring", "tree", "hier"}));
  CHECK((choices("ROCE_PG_ALGO") == choices("ROCE_PG_ALGO_ALLREDUCE")));
  CHECK((choices("ROCE_PG_ALGO_ALLREDUCE_ACROSS") == std::vector<std::string>{"auto", "rd", "rabenseifner", "ring", "tree"}));
}
