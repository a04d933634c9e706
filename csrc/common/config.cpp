#include "config.hpp"

#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "error.hpp"
#include "setting_choices.hpp"

namespace roce {
namespace {

size_t floorPow2(size_t x) { return x ? std::bit_floor(x) : 0; }

std::string readTestFault(EnvReader& r) {
  return r.oneOf(perRank("ROCE_PG_TEST_FAULT", "common"), "",
                 {"garbage_frames", "no_doorbell", "shm_full", "fail_forming", "slow_teardown", "next_protocol"});
}

}  // namespace

Config Config::fromEnv() {
  std::vector<SettingValue> values;
  EnvReader environment(&values);
  Config c = read(environment);
  c.values_ = std::move(values);
  return c;
}

std::vector<Setting> Config::settings() {
  std::vector<Setting> table;
  EnvReader recorder(table);
  (void)read(recorder);
  return table;
}

Config Config::read(EnvReader& r) {
  // Layers by their csrc/ folders; the scope says what the ranks of a group
  // must agree on (env_reader.hpp), and Scope::Group settings are what
  // formation compares (algorithmSettings()).
  constexpr const char* kAlgorithms = "algorithms";
  constexpr const char* kVerbs = "transport/verbs";
  constexpr const char* kTorch = "torch";
  Config c;
  c.forceNetwork = r.flag(sameInGroup("ROCE_PG_FORCE_NETWORK", "membership").alsoPlacement());
  c.simRanksPerNode =
      static_cast<int>(r.integer(perRank("ROCE_PG_SIM_RANKS_PER_NODE", "group").alsoPlacement(), 0, 0, 1 << 20));
  c.simNode = r.token(perRank("ROCE_PG_SIM_NODE", "group").alsoPlacement(), 64);
  // The algorithm names are the allreduce registry's (setting_choices.hpp).
  // ROCE_PG_ALGO is compared through ROCE_PG_ALGO_ALLREDUCE, which it defaults.
  c.algoAllreduce =
      r.oneOf(sameInGroup("ROCE_PG_ALGO_ALLREDUCE", kAlgorithms),
              r.oneOf(advised("ROCE_PG_ALGO", kAlgorithms), "auto", settingChoices("ROCE_PG_ALGO", {"auto"})),
              settingChoices("ROCE_PG_ALGO_ALLREDUCE", {"auto"}));
  c.algoAllreduceAcross = r.oneOf(sameInGroup("ROCE_PG_ALGO_ALLREDUCE_ACROSS", kAlgorithms), "auto",
                                  settingChoices("ROCE_PG_ALGO_ALLREDUCE_ACROSS", {"auto"}));
  c.connect = r.choice(perRank("ROCE_PG_CONNECT", "comm"), c.connect);
  c.subgroups = r.choice(sameInGroup("ROCE_PG_SUBGROUPS", kTorch), c.subgroups);
  c.algoAllgather = r.choice(sameInGroup("ROCE_PG_ALGO_ALLGATHER", kAlgorithms), c.algoAllgather);
  c.algoReduceScatter = r.choice(sameInGroup("ROCE_PG_ALGO_REDUCE_SCATTER", kAlgorithms), c.algoReduceScatter);
  c.algoBroadcast = r.choice(sameInGroup("ROCE_PG_ALGO_BROADCAST", kAlgorithms), c.algoBroadcast);
  // A threshold left unset leaves its rows to the cost model, which one set to
  // the default value does not: ranks compare "auto" and the value as different.
  const Key rdMax = sameInGroup("ROCE_PG_ALGO_RD_MAX_BYTES", kAlgorithms).unsetMeansAuto();
  const Key ringMin = sameInGroup("ROCE_PG_ALGO_RING_MIN_BYTES", kAlgorithms).unsetMeansAuto();
  const Key hierMin = sameInGroup("ROCE_PG_ALGO_HIER_MIN_BYTES", kAlgorithms).unsetMeansAuto();
  c.rdMaxBytes = r.integer(rdMax, c.rdMaxBytes, 0, 1ll << 40);
  c.ringMinBytes = r.integer(ringMin, c.ringMinBytes, 0, 1ll << 40);
  c.hierMinBytes = r.integer(hierMin, c.hierMinBytes, 0, 1ll << 40);
  c.rdMaxBytesSet = r.isSet(rdMax.name);
  c.ringMinBytesSet = r.isSet(ringMin.name);
  c.hierMinBytesSet = r.isSet(hierMin.name);
  c.netAlphaUs = r.number(sameInGroup("ROCE_PG_ALGO_NET_ALPHA_US", kAlgorithms), c.netAlphaUs, 0, 1e6);
  c.netGBps = r.number(sameInGroup("ROCE_PG_ALGO_NET_GBPS", kAlgorithms), c.netGBps, 1e-6, 1e6);
  c.nicGBps = r.number(sameInGroup("ROCE_PG_ALGO_NIC_GBPS", kAlgorithms), c.nicGBps, 1e-6, 1e6);
  c.shmAlphaUs = r.number(sameInGroup("ROCE_PG_ALGO_SHM_ALPHA_US", kAlgorithms), c.shmAlphaUs, 0, 1e6);
  c.shmGBps = r.number(sameInGroup("ROCE_PG_ALGO_SHM_GBPS", kAlgorithms), c.shmGBps, 1e-6, 1e6);
  c.reduceGBps = r.number(sameInGroup("ROCE_PG_ALGO_REDUCE_GBPS", kAlgorithms), c.reduceGBps, 1e-6, 1e6);
  c.bruckMaxBytes = r.integer(sameInGroup("ROCE_PG_ALGO_BRUCK_MAX_BYTES", kAlgorithms), c.bruckMaxBytes, 0, 1ll << 40);
  // Each rank finds its own transport; a rank without the one the group
  // needs fails formation naming itself (so this is not compared).
  c.netTransport = r.choice(advised("ROCE_PG_NET_TRANSPORT", "group").alsoPlacement(), c.netTransport);
  c.ibHca = r.text(perRank("ROCE_PG_IB_HCA", kVerbs));
  c.ibGidIndex = static_cast<int>(r.integer(perRank("ROCE_PG_IB_GID_INDEX", kVerbs), -1, -1, 1 << 16));
  c.ibTc = static_cast<int>(r.integer(perRank("ROCE_PG_IB_TC", kVerbs), 0, 0, 255));
  c.ibSl = static_cast<int>(r.integer(perRank("ROCE_PG_IB_SL", kVerbs), 0, 0, 15));
  c.ibTimeout = static_cast<int>(r.integer(perRank("ROCE_PG_IB_TIMEOUT", kVerbs), 18, 1, 31));
  c.ibRetryCnt = static_cast<int>(r.integer(perRank("ROCE_PG_IB_RETRY_CNT", kVerbs), 7, 0, 7));
  // Both ends of a peer must make as many queue pairs: the verbs handshake
  // checks the count it derives from this (and the channels and ports).
  c.ibQpsPerConnection = static_cast<int>(r.integer(advised("ROCE_PG_IB_QPS_PER_CONNECTION", kVerbs), 1, 1, 16));
  // Sizes the queues for what peers post.
  c.ibSlots = static_cast<int>(r.integer(sameInGroup("ROCE_PG_IB_SLOTS", kVerbs), 8, 2, 256));
  c.ibPoolBytes = r.integer(perRank("ROCE_PG_IB_POOL_BYTES", kVerbs), c.ibPoolBytes, 64 << 10, 1ll << 36);
  // Checked in the verbs handshake, which names both values.
  c.ibSlotBytes = r.integer(advised("ROCE_PG_IB_SLOT_BYTES", kVerbs), c.ibSlotBytes, 256, 1ll << 30);
  c.ibEagerMaxBytes = r.integer(perRank("ROCE_PG_IB_EAGER_MAX_BYTES", kVerbs), c.ibEagerMaxBytes, 0, 1ll << 30);
  c.ibZeroCopyMinBytes =
      r.integer(perRank("ROCE_PG_IB_ZERO_COPY_MIN_BYTES", kVerbs), c.ibZeroCopyMinBytes, 0, 1ll << 40);
  c.ibRegCacheBytes = r.integer(perRank("ROCE_PG_IB_REG_CACHE_BYTES", kVerbs), 0, 0, 1ll << 50);
  // Decides which calls go by GPUDirect, which changes their messages.
  c.ibDeviceRegBytes =
      r.integer(sameInGroup("ROCE_PG_IB_DEVICE_REG_BYTES", kVerbs), c.ibDeviceRegBytes, 0, 1ll << 50);
  c.socketIfname = r.text(perRank("ROCE_PG_SOCKET_IFNAME", "runtime"));
  c.chunkBytes = r.integer(sameInGroup("ROCE_PG_CHUNK_BYTES", kAlgorithms), c.chunkBytes, 4096, 1ll << 30);
  c.nChannels = static_cast<int>(r.integer(sameInGroup("ROCE_PG_NCHANNELS", kAlgorithms), 0, 0, kMaxChannels));
  c.workers = static_cast<int>(r.integer(perRank("ROCE_PG_WORKERS", "group"), 0, 0, kMaxWorkers));
  // The ranks of a machine share the segments these size and the messages
  // these shape: formation checks the sizes (the roster), the shared-memory
  // collectives the chunking (each with an error of its own). Machines may
  // differ (the chunk follows each machine's cache).
  c.shmSlotBytes = r.integer(sameOnMachine("ROCE_PG_SHM_SLOT_BYTES", "membership"), c.shmSlotBytes, 4096, 1ll << 30);
  c.shmRingBytes = r.integer(sameOnMachine("ROCE_PG_SHM_RING_BYTES", "membership"), c.shmRingBytes, 4096, 1ll << 30);
  c.shmOneShotMaxBytes =
      r.integer(sameOnMachine("ROCE_PG_SHM_ONESHOT_MAX_BYTES", kAlgorithms), c.shmOneShotMaxBytes, 0, 1ll << 30);
  c.inlineMaxBytes = r.integer(perRank("ROCE_PG_INLINE_MAX_BYTES", kTorch), c.inlineMaxBytes, 0, 1ll << 40);
  c.syncInlineMaxBytes =
      r.integer(perRank("ROCE_PG_SYNC_INLINE_MAX_BYTES", kTorch), c.syncInlineMaxBytes, 0, 1ll << 40);
  c.devicePieceBytes =
      r.integer(sameInGroup("ROCE_PG_DEVICE_PIECE_BYTES", kTorch), c.devicePieceBytes, 4096, 1ll << 40);
  c.deviceReduce = r.choice(sameInGroup("ROCE_PG_DEVICE_REDUCE", kTorch), c.deviceReduce);
  c.gpudirect = r.choice(sameInGroup("ROCE_PG_GPUDIRECT", kTorch), c.gpudirect);
  c.deviceStagingCacheBytes =
      r.integer(perRank("ROCE_PG_DEVICE_STAGING_CACHE_BYTES", kTorch), c.deviceStagingCacheBytes, 0, 1ll << 50);
  c.spinUs = static_cast<int>(r.integer(perRank("ROCE_PG_SPIN_US", "comm"), c.spinUs, 0, 1000000));
  // Rings index with a mask: round up to a power of two.
  size_t ring = 4096;
  while (ring < c.shmRingBytes) ring <<= 1;
  c.shmRingBytes = ring;
  c.shmSlotBytes = (c.shmSlotBytes + 63) & ~size_t(63);
  c.shmChunkBytes = r.integerOrZero(sameOnMachine("ROCE_PG_SHM_CHUNK_BYTES", kAlgorithms), 0, 4096, 1ll << 30,
                                    "use at least 4096, or 0 for the cache-sized default");
  if (c.shmChunkBytes == 0) c.shmChunkBytes = shmChunkAuto();
  c.shmChunkBytes = floorPow2(c.shmChunkBytes);
  c.shutdownGraceMs =
      static_cast<int>(r.integer(perRank("ROCE_PG_SHUTDOWN_GRACE_MS", kTorch), c.shutdownGraceMs, 0, 3600000));
  c.traceEntries = r.integer(perRank("ROCE_PG_TRACE_ENTRIES", "engine"), c.traceEntries, 0, 1ll << 24);
  c.torchFlightRecorder = r.choice(perRank("ROCE_PG_TORCH_FR", kTorch), c.torchFlightRecorder);
  c.traceDump = r.text(perRank("ROCE_PG_TRACE_DUMP", kTorch));
  const std::string signal =
      r.oneOf(perRank("ROCE_PG_TRACE_SIGNAL", kTorch), "off", {"off", "SIGUSR1", "SIGUSR2"});
  c.traceSignal = signal == "SIGUSR1" ? SIGUSR1 : signal == "SIGUSR2" ? SIGUSR2 : 0;
  // Also how often heartbeats are sent: neighbours must agree when silence means death.
  c.heartbeatTimeoutMs = static_cast<int>(r.integerOrZero(
      sameInGroup("ROCE_PG_HEARTBEAT_TIMEOUT_MS", "liveness"), c.heartbeatTimeoutMs, 1000, 86400000,
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

std::string Config::joinValues(bool (*wanted)(const SettingValue&)) const {
  std::string out;
  for (const SettingValue& v : values_)
    if (wanted(v)) out += str(out.empty() ? "" : " ", v.name, "=", v.text);
  return out;
}

std::string Config::placementSettings() const {
  return joinValues([](const SettingValue& v) { return v.placement; });
}

std::string Config::algorithmSettings() const {
  return joinValues([](const SettingValue& v) { return v.scope == Scope::Group; });
}

std::string Config::describe() const {
  return str(joinValues([](const SettingValue&) { return true; }), "; resolved: nchannels=", nChannels,
             " workers=", workers, " shm_chunk_bytes=", shmChunkBytes, " shm_ring_bytes=", shmRingBytes,
             " shm_slot_bytes=", shmSlotBytes);
}

}  // namespace roce
