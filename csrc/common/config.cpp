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

NetworkBudgets readNetworkBudgets(EnvReader& r) {
  NetworkBudgets b;
  auto bytes = [&](const char* name, size_t dflt, long long lo) {
    return static_cast<size_t>(r.integer(perRank(name, "runtime"), static_cast<long long>(dflt), lo, 1ll << 40));
  };
  auto count = [&](const char* name, size_t dflt) {
    return static_cast<size_t>(r.integer(perRank(name, "runtime"), static_cast<long long>(dflt), 1, 1 << 20));
  };
  b.parkedRecordBytes = bytes("ROCE_PG_NET_PARKED_RECORD_BYTES", b.parkedRecordBytes, 64 << 10);
  b.unnamedLinks = count("ROCE_PG_NET_UNNAMED_LINKS", b.unnamedLinks);
  b.unexpectedLinks = count("ROCE_PG_NET_UNEXPECTED_LINKS", b.unexpectedLinks);
  b.pendingHeads = count("ROCE_PG_NET_PENDING_HEADS", b.pendingHeads);
  b.pendingHeadsPerSource = count("ROCE_PG_NET_PENDING_HEADS_PER_SOURCE", b.pendingHeadsPerSource);
  b.parkedStreamBytes = bytes("ROCE_PG_NET_PARKED_STREAM_BYTES", b.parkedStreamBytes, 16 << 20);
  return b;
}

std::string readTestFault(EnvReader& r) {
  return r.oneOf(perRank("ROCE_PG_TEST_FAULT", "common"), "",
                 {"garbage_frames", "no_doorbell", "shm_full", "fail_forming", "slow_teardown", "next_protocol",
                   "late_lifeline", "late_mailbox", "lost_settings", "die_forming_shm"});
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
  c.placement.forceNetwork = r.flag(sameInGroup("ROCE_PG_FORCE_NETWORK", "membership").alsoPlacement());
  c.placement.simRanksPerNode =
      static_cast<int>(r.integer(perRank("ROCE_PG_SIM_RANKS_PER_NODE", "group").alsoPlacement(), 0, 0, 1 << 20));
  c.placement.simNode = r.token(perRank("ROCE_PG_SIM_NODE", "group").alsoPlacement(), 64);
  // The algorithm names are the allreduce registry's (setting_choices.hpp).
  // ROCE_PG_ALGO is compared through ROCE_PG_ALGO_ALLREDUCE, which it defaults.
  c.algo.allreduce =
      r.oneOf(sameInGroup("ROCE_PG_ALGO_ALLREDUCE", kAlgorithms),
              r.oneOf(advised("ROCE_PG_ALGO", kAlgorithms), "auto", settingChoices("ROCE_PG_ALGO", {"auto"})),
              settingChoices("ROCE_PG_ALGO_ALLREDUCE", {"auto"}));
  c.algo.allreduceAcross = r.oneOf(sameInGroup("ROCE_PG_ALGO_ALLREDUCE_ACROSS", kAlgorithms), "auto",
                                  settingChoices("ROCE_PG_ALGO_ALLREDUCE_ACROSS", {"auto"}));
  c.connect = r.choice(perRank("ROCE_PG_CONNECT", "comm"), c.connect);
  c.subgroups = r.choice(sameInGroup("ROCE_PG_SUBGROUPS", kTorch), c.subgroups);
  c.algo.allgather = r.choice(sameInGroup("ROCE_PG_ALGO_ALLGATHER", kAlgorithms), c.algo.allgather);
  c.algo.reduceScatter = r.choice(sameInGroup("ROCE_PG_ALGO_REDUCE_SCATTER", kAlgorithms), c.algo.reduceScatter);
  c.algo.broadcast = r.choice(sameInGroup("ROCE_PG_ALGO_BROADCAST", kAlgorithms), c.algo.broadcast);
  // A threshold left unset leaves its rows to the cost model, which one set to
  // the default value does not: ranks compare "auto" and the value as different.
  const Key rdMax = sameInGroup("ROCE_PG_ALGO_RD_MAX_BYTES", kAlgorithms).unsetMeansAuto();
  const Key ringMin = sameInGroup("ROCE_PG_ALGO_RING_MIN_BYTES", kAlgorithms).unsetMeansAuto();
  const Key hierMin = sameInGroup("ROCE_PG_ALGO_HIER_MIN_BYTES", kAlgorithms).unsetMeansAuto();
  c.algo.rdMaxBytes = r.integer(rdMax, c.algo.rdMaxBytes, 0, 1ll << 40);
  c.algo.ringMinBytes = r.integer(ringMin, c.algo.ringMinBytes, 0, 1ll << 40);
  c.algo.hierMinBytes = r.integer(hierMin, c.algo.hierMinBytes, 0, 1ll << 40);
  c.algo.rdMaxBytesSet = r.isSet(rdMax.name);
  c.algo.ringMinBytesSet = r.isSet(ringMin.name);
  c.algo.hierMinBytesSet = r.isSet(hierMin.name);
  c.algo.netAlphaUs = r.number(sameInGroup("ROCE_PG_ALGO_NET_ALPHA_US", kAlgorithms), c.algo.netAlphaUs, 0, 1e6);
  c.algo.netGBps = r.number(sameInGroup("ROCE_PG_ALGO_NET_GBPS", kAlgorithms), c.algo.netGBps, 1e-6, 1e6);
  c.algo.nicGBps = r.number(sameInGroup("ROCE_PG_ALGO_NIC_GBPS", kAlgorithms), c.algo.nicGBps, 1e-6, 1e6);
  c.algo.shmAlphaUs = r.number(sameInGroup("ROCE_PG_ALGO_SHM_ALPHA_US", kAlgorithms), c.algo.shmAlphaUs, 0, 1e6);
  c.algo.shmGBps = r.number(sameInGroup("ROCE_PG_ALGO_SHM_GBPS", kAlgorithms), c.algo.shmGBps, 1e-6, 1e6);
  c.algo.reduceGBps = r.number(sameInGroup("ROCE_PG_ALGO_REDUCE_GBPS", kAlgorithms), c.algo.reduceGBps, 1e-6, 1e6);
  c.algo.bruckMaxBytes =
      r.integer(sameInGroup("ROCE_PG_ALGO_BRUCK_MAX_BYTES", kAlgorithms), c.algo.bruckMaxBytes, 0, 1ll << 40);
  // Each rank finds its own transport; a rank without the one the group
  // needs fails formation naming itself (so this is not compared).
  c.placement.netTransport =
      r.choice(advised("ROCE_PG_NET_TRANSPORT", "group").alsoPlacement(), c.placement.netTransport);
  c.verbs.hca = r.text(perRank("ROCE_PG_IB_HCA", kVerbs));
  c.verbs.gidIndex = static_cast<int>(r.integer(perRank("ROCE_PG_IB_GID_INDEX", kVerbs), -1, -1, 1 << 16));
  c.verbs.tc = static_cast<int>(r.integer(perRank("ROCE_PG_IB_TC", kVerbs), 0, 0, 255));
  c.verbs.sl = static_cast<int>(r.integer(perRank("ROCE_PG_IB_SL", kVerbs), 0, 0, 15));
  c.verbs.timeout = static_cast<int>(r.integer(perRank("ROCE_PG_IB_TIMEOUT", kVerbs), 18, 1, 31));
  c.verbs.retryCnt = static_cast<int>(r.integer(perRank("ROCE_PG_IB_RETRY_CNT", kVerbs), 7, 0, 7));
  // Both ends of a peer must make as many queue pairs: the verbs handshake
  // checks the count it derives from this (and the channels and ports).
  c.verbs.qpsPerConnection = static_cast<int>(r.integer(advised("ROCE_PG_IB_QPS_PER_CONNECTION", kVerbs), 1, 1, 16));
  // Sizes the queues for what peers post.
  c.verbs.slots = static_cast<int>(r.integer(sameInGroup("ROCE_PG_IB_SLOTS", kVerbs), 8, 2, 256));
  c.verbs.poolBytes = r.integer(perRank("ROCE_PG_IB_POOL_BYTES", kVerbs), c.verbs.poolBytes, 64 << 10, 1ll << 36);
  // Checked in the verbs handshake, which names both values.
  c.verbs.slotBytes = r.integer(advised("ROCE_PG_IB_SLOT_BYTES", kVerbs), c.verbs.slotBytes, 256, 1ll << 30);
  c.verbs.eagerMaxBytes = r.integer(perRank("ROCE_PG_IB_EAGER_MAX_BYTES", kVerbs), c.verbs.eagerMaxBytes, 0, 1ll << 30);
  c.verbs.zeroCopyMinBytes =
      r.integer(perRank("ROCE_PG_IB_ZERO_COPY_MIN_BYTES", kVerbs), c.verbs.zeroCopyMinBytes, 0, 1ll << 40);
  c.verbs.regCacheBytes = r.integer(perRank("ROCE_PG_IB_REG_CACHE_BYTES", kVerbs), 0, 0, 1ll << 50);
  // Decides which calls go by GPUDirect, which changes their messages.
  c.verbs.deviceRegBytes =
      r.integer(sameInGroup("ROCE_PG_IB_DEVICE_REG_BYTES", kVerbs), c.verbs.deviceRegBytes, 0, 1ll << 50);
  c.socketIfname = r.text(perRank("ROCE_PG_SOCKET_IFNAME", "runtime"));
  c.algo.chunkBytes = r.integer(sameInGroup("ROCE_PG_CHUNK_BYTES", kAlgorithms), c.algo.chunkBytes, 4096, 1ll << 30);
  c.algo.nChannels =
      static_cast<int>(r.integer(sameInGroup("ROCE_PG_NCHANNELS", kAlgorithms), 0, 0, Algorithms::kMaxChannels));
  c.workers = static_cast<int>(r.integer(perRank("ROCE_PG_WORKERS", "group"), 0, 0, kMaxWorkers));
  // The ranks of a machine share the segments these size and the messages
  // these shape: formation checks the sizes (the roster), the shared-memory
  // collectives the chunking (each with an error of its own). Machines may
  // differ (the chunk follows each machine's cache).
  c.shm.slotBytes = r.integer(sameOnMachine("ROCE_PG_SHM_SLOT_BYTES", "membership"), c.shm.slotBytes, 4096, 1ll << 30);
  c.shm.ringBytes = r.integer(sameOnMachine("ROCE_PG_SHM_RING_BYTES", "membership"), c.shm.ringBytes, 4096, 1ll << 30);
  c.shm.oneShotMaxBytes =
      r.integer(sameOnMachine("ROCE_PG_SHM_ONESHOT_MAX_BYTES", kAlgorithms), c.shm.oneShotMaxBytes, 0, 1ll << 30);
  c.inlineMaxBytes = r.integer(perRank("ROCE_PG_INLINE_MAX_BYTES", kTorch), c.inlineMaxBytes, 0, 1ll << 40);
  c.syncInlineMaxBytes =
      r.integer(perRank("ROCE_PG_SYNC_INLINE_MAX_BYTES", kTorch), c.syncInlineMaxBytes, 0, 1ll << 40);
  c.device.pieceBytes =
      r.integer(sameInGroup("ROCE_PG_DEVICE_PIECE_BYTES", kTorch), c.device.pieceBytes, 4096, 1ll << 40);
  c.device.reduce = r.choice(sameInGroup("ROCE_PG_DEVICE_REDUCE", kTorch), c.device.reduce);
  c.device.gpudirect = r.choice(sameInGroup("ROCE_PG_GPUDIRECT", kTorch), c.device.gpudirect);
  c.device.stagingCacheBytes =
      r.integer(perRank("ROCE_PG_DEVICE_STAGING_CACHE_BYTES", kTorch), c.device.stagingCacheBytes, 0, 1ll << 50);
  c.spinUs = static_cast<int>(r.integer(perRank("ROCE_PG_SPIN_US", "comm"), c.spinUs, 0, 1000000));
  // Rings index with a mask: round up to a power of two.
  size_t ring = 4096;
  while (ring < c.shm.ringBytes) ring <<= 1;
  c.shm.ringBytes = ring;
  c.shm.slotBytes = (c.shm.slotBytes + 63) & ~size_t(63);
  c.shm.chunkBytes = r.integerOrZero(sameOnMachine("ROCE_PG_SHM_CHUNK_BYTES", kAlgorithms), 0, 4096, 1ll << 30,
                                    "use at least 4096, or 0 for the cache-sized default");
  if (c.shm.chunkBytes == 0) c.shm.chunkBytes = shmChunkAuto();
  c.shm.chunkBytes = floorPow2(c.shm.chunkBytes);
  c.shutdownGraceMs =
      static_cast<int>(r.integer(perRank("ROCE_PG_SHUTDOWN_GRACE_MS", kTorch), c.shutdownGraceMs, 0, 3600000));
  c.trace.entries = r.integer(perRank("ROCE_PG_TRACE_ENTRIES", "engine"), c.trace.entries, 0, 1ll << 24);
  c.trace.torchFlightRecorder = r.choice(perRank("ROCE_PG_TORCH_FR", kTorch), c.trace.torchFlightRecorder);
  c.trace.dump = r.text(perRank("ROCE_PG_TRACE_DUMP", kTorch));
  const std::string signal =
      r.oneOf(perRank("ROCE_PG_TRACE_SIGNAL", kTorch), "off", {"off", "SIGUSR1", "SIGUSR2"});
  c.trace.signal = signal == "SIGUSR1" ? SIGUSR1 : signal == "SIGUSR2" ? SIGUSR2 : 0;
  // Also how often heartbeats are sent: neighbours must agree when silence means death.
  c.heartbeatTimeoutMs = static_cast<int>(r.integerOrZero(
      sameInGroup("ROCE_PG_HEARTBEAT_TIMEOUT_MS", "liveness"), c.heartbeatTimeoutMs, 1000, 86400000,
      "heartbeats are sent every few hundred ms and a busy machine would declare live peers "
      "dead; use >= 1000 or 0 (off)"));
  c.net = readNetworkBudgets(r);  // validated with the rest of the configuration
  const std::string fault = readTestFault(r);
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

const NetworkBudgets& NetworkBudgets::get() {
  static const NetworkBudgets budgets = [] {
    EnvReader environment;
    return readNetworkBudgets(environment);
  }();
  return budgets;
}

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
  return str(joinValues([](const SettingValue&) { return true; }), "; resolved: nchannels=", algo.nChannels,
             " workers=", workers, " shm_chunk_bytes=", shm.chunkBytes, " shm_ring_bytes=", shm.ringBytes,
             " shm_slot_bytes=", shm.slotBytes);
}

}  // namespace roce
