#include "config.hpp"

#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <charconv>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "error.hpp"
#include "setting_choices.hpp"

namespace roce {
namespace {

// The shortest text that reads back as exactly `x`: two ranks whose values
// differ in the last bit must not print the same settings.
std::string exact(double x) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof(buf), x);
  return std::string(buf, r.ptr);
}

size_t floorPow2(size_t x) { return x ? std::bit_floor(x) : 0; }

std::string readTestFault(EnvReader& r) {
  return r.oneOf("ROCE_PG_TEST_FAULT", "", {"garbage_frames", "no_doorbell", "shm_full", "fail_forming", "slow_teardown",
                                          "next_protocol"});
}

}  // namespace

Config Config::fromEnv() {
  EnvReader environment;
  return read(environment);
}

std::vector<Setting> Config::settings() {
  std::vector<Setting> table;
  EnvReader recorder(table);
  (void)read(recorder);
  return table;
}

Config Config::read(EnvReader& r) {
  Config c;
  c.forceNetwork = r.flag("ROCE_PG_FORCE_NETWORK");
  c.simRanksPerNode = static_cast<int>(r.integer("ROCE_PG_SIM_RANKS_PER_NODE", 0, 0, 1 << 20));
  c.simNode = r.token("ROCE_PG_SIM_NODE", 64);
  // The algorithm names are the allreduce registry's (setting_choices.hpp).
  c.algoAllreduce = r.oneOf("ROCE_PG_ALGO_ALLREDUCE",
                            r.oneOf("ROCE_PG_ALGO", "auto", settingChoices("ROCE_PG_ALGO", {"auto"})),
                            settingChoices("ROCE_PG_ALGO_ALLREDUCE", {"auto"}));
  c.algoAllreduceAcross = r.oneOf("ROCE_PG_ALGO_ALLREDUCE_ACROSS", "auto",
                                  settingChoices("ROCE_PG_ALGO_ALLREDUCE_ACROSS", {"auto"}));
  c.connect = r.choice("ROCE_PG_CONNECT", c.connect);
  c.subgroups = r.choice("ROCE_PG_SUBGROUPS", c.subgroups);
  c.algoAllgather = r.oneOf("ROCE_PG_ALGO_ALLGATHER", "auto", {"auto", "shm", "ring", "bruck", "hier"});
  c.algoReduceScatter = r.oneOf("ROCE_PG_ALGO_REDUCE_SCATTER", "auto", {"auto", "shm", "ring", "hier"});
  c.algoBroadcast = r.oneOf("ROCE_PG_ALGO_BROADCAST", "auto", {"auto", "shm", "binomial", "chain"});
  c.rdMaxBytes = r.integer("ROCE_PG_ALGO_RD_MAX_BYTES", c.rdMaxBytes, 0, 1ll << 40);
  c.ringMinBytes = r.integer("ROCE_PG_ALGO_RING_MIN_BYTES", c.ringMinBytes, 0, 1ll << 40);
  c.hierMinBytes = r.integer("ROCE_PG_ALGO_HIER_MIN_BYTES", c.hierMinBytes, 0, 1ll << 40);
  c.rdMaxBytesSet = r.isSet("ROCE_PG_ALGO_RD_MAX_BYTES");
  c.ringMinBytesSet = r.isSet("ROCE_PG_ALGO_RING_MIN_BYTES");
  c.hierMinBytesSet = r.isSet("ROCE_PG_ALGO_HIER_MIN_BYTES");
  c.netAlphaUs = r.number("ROCE_PG_ALGO_NET_ALPHA_US", c.netAlphaUs, 0, 1e6);
  c.netGBps = r.number("ROCE_PG_ALGO_NET_GBPS", c.netGBps, 1e-6, 1e6);
  c.nicGBps = r.number("ROCE_PG_ALGO_NIC_GBPS", c.nicGBps, 1e-6, 1e6);
  c.shmAlphaUs = r.number("ROCE_PG_ALGO_SHM_ALPHA_US", c.shmAlphaUs, 0, 1e6);
  c.shmGBps = r.number("ROCE_PG_ALGO_SHM_GBPS", c.shmGBps, 1e-6, 1e6);
  c.reduceGBps = r.number("ROCE_PG_ALGO_REDUCE_GBPS", c.reduceGBps, 1e-6, 1e6);
  c.bruckMaxBytes = r.integer("ROCE_PG_ALGO_BRUCK_MAX_BYTES", c.bruckMaxBytes, 0, 1ll << 40);
  c.netTransport = r.choice("ROCE_PG_NET_TRANSPORT", c.netTransport);
  c.ibHca = r.text("ROCE_PG_IB_HCA");
  c.ibGidIndex = static_cast<int>(r.integer("ROCE_PG_IB_GID_INDEX", -1, -1, 1 << 16));
  c.ibTc = static_cast<int>(r.integer("ROCE_PG_IB_TC", 0, 0, 255));
  c.ibSl = static_cast<int>(r.integer("ROCE_PG_IB_SL", 0, 0, 15));
  c.ibTimeout = static_cast<int>(r.integer("ROCE_PG_IB_TIMEOUT", 18, 1, 31));
  c.ibRetryCnt = static_cast<int>(r.integer("ROCE_PG_IB_RETRY_CNT", 7, 0, 7));
  c.ibQpsPerConnection = static_cast<int>(r.integer("ROCE_PG_IB_QPS_PER_CONNECTION", 1, 1, 16));
  c.ibSlots = static_cast<int>(r.integer("ROCE_PG_IB_SLOTS", 8, 2, 256));
  c.ibPoolBytes = r.integer("ROCE_PG_IB_POOL_BYTES", c.ibPoolBytes, 64 << 10, 1ll << 36);
  c.ibSlotBytes = r.integer("ROCE_PG_IB_SLOT_BYTES", c.ibSlotBytes, 256, 1ll << 30);
  c.ibEagerMaxBytes = r.integer("ROCE_PG_IB_EAGER_MAX_BYTES", c.ibEagerMaxBytes, 0, 1ll << 30);
  c.ibZeroCopyMinBytes = r.integer("ROCE_PG_IB_ZERO_COPY_MIN_BYTES", c.ibZeroCopyMinBytes, 0, 1ll << 40);
  c.ibRegCacheBytes = r.integer("ROCE_PG_IB_REG_CACHE_BYTES", 0, 0, 1ll << 50);
  c.ibDeviceRegBytes = r.integer("ROCE_PG_IB_DEVICE_REG_BYTES", c.ibDeviceRegBytes, 0, 1ll << 50);
  c.socketIfname = r.text("ROCE_PG_SOCKET_IFNAME");
  c.chunkBytes = r.integer("ROCE_PG_CHUNK_BYTES", c.chunkBytes, 4096, 1ll << 30);
  c.nChannels = static_cast<int>(r.integer("ROCE_PG_NCHANNELS", 0, 0, kMaxChannels));
  c.workers = static_cast<int>(r.integer("ROCE_PG_WORKERS", 0, 0, kMaxWorkers));
  c.shmSlotBytes = r.integer("ROCE_PG_SHM_SLOT_BYTES", c.shmSlotBytes, 4096, 1ll << 30);
  c.shmRingBytes = r.integer("ROCE_PG_SHM_RING_BYTES", c.shmRingBytes, 4096, 1ll << 30);
  c.shmOneShotMaxBytes = r.integer("ROCE_PG_SHM_ONESHOT_MAX_BYTES", c.shmOneShotMaxBytes, 0, 1ll << 30);
  c.inlineMaxBytes = r.integer("ROCE_PG_INLINE_MAX_BYTES", c.inlineMaxBytes, 0, 1ll << 40);
  c.syncInlineMaxBytes = r.integer("ROCE_PG_SYNC_INLINE_MAX_BYTES", c.syncInlineMaxBytes, 0, 1ll << 40);
  c.devicePieceBytes = r.integer("ROCE_PG_DEVICE_PIECE_BYTES", c.devicePieceBytes, 4096, 1ll << 40);
  c.deviceReduce = r.choice("ROCE_PG_DEVICE_REDUCE", c.deviceReduce);
  c.gpudirect = r.choice("ROCE_PG_GPUDIRECT", c.gpudirect);
  c.deviceStagingCacheBytes =
      r.integer("ROCE_PG_DEVICE_STAGING_CACHE_BYTES", c.deviceStagingCacheBytes, 0, 1ll << 50);
  c.spinUs = static_cast<int>(r.integer("ROCE_PG_SPIN_US", c.spinUs, 0, 1000000));
  // Rings index with a mask: round up to a power of two.
  size_t ring = 4096;
  while (ring < c.shmRingBytes) ring <<= 1;
  c.shmRingBytes = ring;
  c.shmSlotBytes = (c.shmSlotBytes + 63) & ~size_t(63);
  c.shmChunkBytes = r.integerOrZero("ROCE_PG_SHM_CHUNK_BYTES", 0, 4096, 1ll << 30,
                                    "use at least 4096, or 0 for the cache-sized default");
  if (c.shmChunkBytes == 0) c.shmChunkBytes = shmChunkAuto();
  c.shmChunkBytes = floorPow2(c.shmChunkBytes);
  c.shutdownGraceMs = static_cast<int>(r.integer("ROCE_PG_SHUTDOWN_GRACE_MS", c.shutdownGraceMs, 0, 3600000));
  c.traceEntries = r.integer("ROCE_PG_TRACE_ENTRIES", c.traceEntries, 0, 1ll << 24);
  c.torchFlightRecorder = r.choice("ROCE_PG_TORCH_FR", c.torchFlightRecorder);
  c.traceDump = r.text("ROCE_PG_TRACE_DUMP");
  const std::string signal = r.oneOf("ROCE_PG_TRACE_SIGNAL", "off", {"off", "SIGUSR1", "SIGUSR2"});
  c.traceSignal = signal == "SIGUSR1" ? SIGUSR1 : signal == "SIGUSR2" ? SIGUSR2 : 0;
  c.heartbeatTimeoutMs = static_cast<int>(r.integerOrZero(
      "ROCE_PG_HEARTBEAT_TIMEOUT_MS", c.heartbeatTimeoutMs, 1000, 86400000,
      "heartbeats are sent every few hundred ms and a busy machine would declare live peers "
      "dead; use >= 1000 or 0 (off)"));
  const std::string fault = readTestFault(r);  // validated with the rest of the configuration
  c.testFailForming = fault == "fail_forming";
  c.testNextProtocol = fault == "next_protocol";
  return c;
}

size_t Config::shmChunkAuto() {
  long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);  // glibc: per core on x86; 0 or -1 where unknown
  if (l2 <= 0) {
    std::ifstream f("/sys/devices/system/cpu/cpu0/cache/index2/size");  // e.g. "1024K"
    long v = 0;
    char unit = 0;
    if (f >> v >> unit) l2 = unit == 'K' ? v << 10 : unit == 'M' ? v << 20 : v;
  }
  if (l2 <= 0) return 512u << 10;
  return std::clamp<size_t>(floorPow2(static_cast<size_t>(l2) / 2), 64u << 10, 1u << 20);
}

namespace {
// A container's CPU quota in whole CPUs (cgroup v2 cpu.max "quota period",
// else v1 cfs_quota_us / cfs_period_us), rounded up; 0 without one.
int cgroupCpuQuota() {
  long quota = -1, period = 0;
  std::ifstream v2("/sys/fs/cgroup/cpu.max");
  std::string q;
  if (v2 >> q >> period) {
    if (q == "max") return 0;
    quota = std::atol(q.c_str());
  } else {
    std::ifstream fq("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"), fp("/sys/fs/cgroup/cpu/cpu.cfs_period_us");
    if (!(fq >> quota) || !(fp >> period)) return 0;
  }
  if (quota <= 0 || period <= 0) return 0;
  return static_cast<int>((quota + period - 1) / period);
}
}  // namespace

int Config::usableCpus() {
  cpu_set_t set;
  int cpus = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 0;
  if (cpus <= 0) cpus = static_cast<int>(std::max(1l, sysconf(_SC_NPROCESSORS_ONLN)));
  const int quota = cgroupCpuQuota();  // a pod limited to 4 CPUs on a 128-CPU host has 4
  return quota > 0 ? std::min(cpus, quota) : cpus;
}

int Config::channelsAuto(int cpus, int localRanks) {
  return std::clamp(cpus / (2 * std::max(1, localRanks)), 1, 4);
}

int Config::workersAuto(int cpus, int localRanks) { return std::clamp(cpus / std::max(1, localRanks), 1, 8); }

const std::string& testFault() {
  static const std::string fault = [] {
    EnvReader environment;
    return readTestFault(environment);
  }();
  return fault;
}

std::string Config::placementSettings() const {
  return str("ROCE_PG_NET_TRANSPORT=", settingName(netTransport), " ROCE_PG_FORCE_NETWORK=", forceNetwork ? 1 : 0,
             " ROCE_PG_SIM_RANKS_PER_NODE=", simRanksPerNode, " ROCE_PG_SIM_NODE=", simNode);
}

std::string Config::algorithmSettings() const {
  // A threshold left unset leaves its rows to the cost model, which one set to
  // the default value does not: "auto" and the value differ here too.
  auto threshold = [](bool set, size_t v) { return set ? std::to_string(v) : std::string("auto"); };
  return str("ROCE_PG_ALGO_ALLREDUCE=", algoAllreduce, " ROCE_PG_ALGO_ALLREDUCE_ACROSS=", algoAllreduceAcross,
             " ROCE_PG_ALGO_ALLGATHER=", algoAllgather,
             " ROCE_PG_ALGO_REDUCE_SCATTER=", algoReduceScatter, " ROCE_PG_ALGO_BROADCAST=", algoBroadcast,
             " ROCE_PG_ALGO_RD_MAX_BYTES=", threshold(rdMaxBytesSet, rdMaxBytes),
             " ROCE_PG_ALGO_RING_MIN_BYTES=", threshold(ringMinBytesSet, ringMinBytes),
             " ROCE_PG_ALGO_HIER_MIN_BYTES=", threshold(hierMinBytesSet, hierMinBytes),
             " ROCE_PG_ALGO_BRUCK_MAX_BYTES=", bruckMaxBytes, " ROCE_PG_ALGO_NET_ALPHA_US=", exact(netAlphaUs),
             " ROCE_PG_ALGO_NET_GBPS=", exact(netGBps), " ROCE_PG_ALGO_NIC_GBPS=", exact(nicGBps),
             " ROCE_PG_ALGO_SHM_ALPHA_US=", exact(shmAlphaUs), " ROCE_PG_ALGO_SHM_GBPS=", exact(shmGBps),
             " ROCE_PG_ALGO_REDUCE_GBPS=", exact(reduceGBps), " ROCE_PG_CHUNK_BYTES=", chunkBytes,
             " ROCE_PG_NCHANNELS=", nChannels == 0 ? std::string("auto") : std::to_string(nChannels),
             " ROCE_PG_FORCE_NETWORK=", forceNetwork ? 1 : 0, " ROCE_PG_DEVICE_PIECE_BYTES=", devicePieceBytes,
             " ROCE_PG_DEVICE_REDUCE=", settingName(deviceReduce), " ROCE_PG_GPUDIRECT=", settingName(gpudirect),
             " ROCE_PG_IB_DEVICE_REG_BYTES=", ibDeviceRegBytes, " ROCE_PG_SUBGROUPS=", settingName(subgroups),
             " ROCE_PG_IB_SLOTS=", ibSlots, " ROCE_PG_HEARTBEAT_TIMEOUT_MS=", heartbeatTimeoutMs);
}

std::string Config::describe() const {
  return str("force_network=", forceNetwork, " sim_ranks_per_node=", simRanksPerNode,
             simNode.empty() ? "" : str(" sim_node=", simNode), " algo_allreduce=", algoAllreduce,
             " algo_allreduce_across=", algoAllreduceAcross,
             " algo_allgather=", algoAllgather, " algo_reduce_scatter=", algoReduceScatter, " algo_broadcast=", algoBroadcast, " rd_max_bytes=", rdMaxBytes, " ring_min_bytes=", ringMinBytes,
             " hier_min_bytes=", hierMinBytes, " bruck_max_bytes=", bruckMaxBytes, " net_alpha_us=", netAlphaUs,
             " net_gbps=", netGBps, " nic_gbps=", nicGBps, " shm_alpha_us=", shmAlphaUs, " shm_gbps=", shmGBps,
             " reduce_gbps=", reduceGBps,
             " net_transport=", settingName(netTransport), " connect=", settingName(connect), " subgroups=", settingName(subgroups), " chunk_bytes=", chunkBytes, " nchannels=", nChannels, " workers=", workers,
             " shm_slot_bytes=", shmSlotBytes, " shm_chunk_bytes=", shmChunkBytes, " shm_oneshot_max_bytes=", shmOneShotMaxBytes,
             " inline_max_bytes=", inlineMaxBytes, " sync_inline_max_bytes=", syncInlineMaxBytes, " spin_us=", spinUs, " shm_ring_bytes=", shmRingBytes, " ib_hca=", ibHca.empty() ? "<auto>" : ibHca,
             " ib_gid_index=", ibGidIndex, " ib_tc=", ibTc, " ib_sl=", ibSl, " ib_timeout=", ibTimeout,
             " ib_retry_cnt=", ibRetryCnt, " ib_qps_per_connection=", ibQpsPerConnection, " ib_slots=", ibSlots, " ib_pool_bytes=", ibPoolBytes, " ib_slot_bytes=", ibSlotBytes, " ib_eager_max_bytes=", ibEagerMaxBytes, " ib_zero_copy_min_bytes=", ibZeroCopyMinBytes,
             " ib_reg_cache_bytes=", ibRegCacheBytes, " ib_device_reg_bytes=", ibDeviceRegBytes, " gpudirect=", settingName(gpudirect), " device_piece_bytes=", devicePieceBytes, " device_reduce=", settingName(deviceReduce),
             " device_staging_cache_bytes=", deviceStagingCacheBytes,
             " heartbeat_timeout_ms=", heartbeatTimeoutMs, " trace_entries=", traceEntries,
             " trace_dump=", traceDump.empty() ? "<off>" : traceDump);
}

}  // namespace roce
