// Which RDMA ports a rank drives (docs/ARCHITECTURE.md, "Every NIC"): every
// ACTIVE port that ROCE_PG_IB_HCA selects (NCCL syntax: "mlx5_0:1,mlx5_1", "^mlx5_2",
// "=exact"), or by default the ports nearest the rank: with a GPU
// (Config::verbs.nearDevicePci), the NICs fewest PCI hops from it (a NIC under the
// GPU's PCIe switch before one behind the CPU's root port); otherwise, or
// when no NIC shares the GPU's root complex, those on the NUMA nodes its
// CPUs are on, and all of them when the rank is not pinned to a subset of
// nodes or no port is on its nodes. One link layer
// per rank (RoCE or InfiniBand, the first port's), at most kMaxRails ports:
// with more, each rank starts at a different one (its global rank), so
// eight ranks share eight NICs instead of crowding the first four.
#pragma once
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace roce {
struct Config;
}
struct ibv_context;  // <infiniband/verbs.h>, which the membership layer need not see
namespace roce::transport::verbs {


// Ports one rank drives at once ("rails"). Bounded by what a control message
// can carry: an RTR names the receive buffer's key on each of them (verbs_wire.hpp).
constexpr int kMaxRails = 4;

struct VerbsPortChoice {
  std::string device;
  int port = 1;
  int gidIndex = 0;
  bool ethernet = true;  // RoCE (GRH addressing) vs InfiniBand (LID addressing)
  int numaNode = -1;     // the NIC's NUMA node (sysfs), -1 unknown
  std::string pciPath;   // the NIC's sysfs device path, empty if none (rxe)
};

// The ports to use, in rail order; empty with `why` explaining what was
// looked for. `rank` spreads ranks over the ports when more than kMaxRails qualify.
std::vector<VerbsPortChoice> chooseVerbsPorts(const Config& cfg, int rank, std::string& why);
// The GID index a RoCE port of the open device `ctx` is used with
// (ROCE_PG_IB_GID_INDEX, else the automatic choice); -1 if none is usable.
int gidIndexFor(const Config& cfg, ibv_context* ctx, int port, int tableLen);

// The selection rule alone (pure, for tests): indices into `portNodes` (each
// port's NUMA node, -1 unknown) of the ports a rank on `rankNodes` uses when
// ROCE_PG_IB_HCA is unset, before the kMaxRails cap.
std::vector<size_t> nearestPorts(const std::vector<int>& portNodes, const std::set<int>& rankNodes);
// Hops between two PCI devices given by their sysfs paths
// (/sys/devices/pci0000:00/0000:00:01.0/0000:02:00.0): up from each to their
// closest common bridge. kPciFar when either is unknown (empty, virtual) or
// they hang off different root complexes (traffic crosses the CPU interconnect).
constexpr int kPciFar = 1 << 20;
int pciDistance(const std::string& a, const std::string& b);
// Indices of the NICs (their sysfs device paths) nearest `device`; empty
// when none shares its root complex.
std::vector<size_t> nearestToDevice(const std::vector<std::string>& nicPaths, const std::string& device);
// At most kMaxRails of `ports`, starting at `rank` modulo their count.
std::vector<size_t> capRails(const std::vector<size_t>& ports, int rank);
// NUMA nodes of the CPUs this process may run on (sched_getaffinity); empty if unknown.
std::set<int> processNumaNodes();
// "0-3,8,10-11" -> {0,1,2,3,8,10,11}; malformed parts are skipped.
std::set<int> parseCpuList(const std::string& text);

}  // namespace roce::transport::verbs
