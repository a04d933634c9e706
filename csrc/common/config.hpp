// Every ROCE_PG_* environment variable is read here, once per process group
// (but ROCE_PG_DEBUG, which log.cpp reads at the first log line). Config::read
// declares each setting once (env_reader.hpp: name, layer, what ranks must
// agree on, kind, default, range): the parser, the table the doctor and the
// README's check use (Config::settings()) and the settings ranks compare
// (algorithmSettings()) all come from those calls.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "env_reader.hpp"

namespace roce {

// What the process keeps of what reaches it over the network before it
// knows whose it is (runtime/, transport/tcp/): budgets against peers that
// flood it, read once per process (ROCE_PG_NET_*; README, "Who can reach a rank").
struct NetworkBudgets {
  size_t parkedRecordBytes = 16 << 20;   // ROCE_PG_NET_PARKED_RECORD_BYTES: lifeline records for groups not created yet
  size_t unnamedLinks = 64;              // ROCE_PG_NET_UNNAMED_LINKS: process links waiting for their name
  size_t unexpectedLinks = 64;           // ROCE_PG_NET_UNEXPECTED_LINKS: links naming a process no group links to
  size_t pendingHeads = 4096;            // ROCE_PG_NET_PENDING_HEADS: connections whose head has not arrived
  size_t pendingHeadsPerSource = 256;    // ROCE_PG_NET_PENDING_HEADS_PER_SOURCE: the same from one address
  size_t parkedStreamBytes = size_t(1) << 30;  // ROCE_PG_NET_PARKED_STREAM_BYTES: TCP stream bytes for groups not created yet
  // The process's values (read once).
  static const NetworkBudgets& get();
};

struct Config {
  // Where ranks are and which transport joins them (group/, membership/):
  // what a subgroup compares with its parent (placementSettings()).
  struct Placement {
    // Route every peer, even one on the same machine, through the network transport.
    bool forceNetwork = false;             // ROCE_PG_FORCE_NETWORK=1
    // Pretend that consecutive blocks of this many global ranks are separate machines (tests).
    int simRanksPerNode = 0;               // ROCE_PG_SIM_RANKS_PER_NODE
    // This rank's simulated machine (any token; ranks with the same token share a
    // "machine"); overrides simRanksPerNode, so uneven machines can be tested.
    std::string simNode;                   // ROCE_PG_SIM_NODE
    // Network transport between machines: "auto" (verbs when every rank has a
    // usable RDMA port, else an error for groups spanning machines), "verbs" or "tcp".
    NetTransport netTransport = NetTransport::Auto;  // ROCE_PG_NET_TRANSPORT
  } placement;
  // The collective algorithms (algorithms/): selection, thresholds, the cost model, chunking.
  struct Algorithms {
    // Allreduce selection (select.cpp): "auto" or a forced name.
    std::string allreduce = "auto";    // ROCE_PG_ALGO_ALLREDUCE, else ROCE_PG_ALGO: auto|ring|hier|rd|rabenseifner|tree
    // hier's allreduce among the machines (auto: the cost model). rd and
    // rabenseifner cannot overlap hier's phases: forcing them runs hier in sequence.
    std::string allreduceAcross = "auto";  // ROCE_PG_ALGO_ALLREDUCE_ACROSS: auto|rd|rabenseifner|ring|tree
    // "shm" (the auto choice where the whole group is on one machine): through
    // the node's shared-memory slots; the others force the point-to-point route.
    AllgatherShape allgather = AllgatherShape::Auto;  // ROCE_PG_ALGO_ALLGATHER: auto|shm|ring|bruck|hier
    ReduceScatterShape reduceScatter = ReduceScatterShape::Auto;  // ROCE_PG_ALGO_REDUCE_SCATTER: auto|shm|ring|hier
    BroadcastShape broadcast = BroadcastShape::Auto;  // ROCE_PG_ALGO_BROADCAST: auto|shm|binomial|chain
    // Thresholds, in bytes per rank (allgather: output bytes). The allreduce
    // ones override the cost model below where set (*Set; docs/ALGORITHMS.md,
    // "Precedence"); the values also size the ring's channels and hier's pieces,
    // and pick the other collectives' algorithms.
    size_t rdMaxBytes = 64u << 10;         // ROCE_PG_ALGO_RD_MAX_BYTES: recursive doubling up to here
    size_t ringMinBytes = 1u << 20;        // ROCE_PG_ALGO_RING_MIN_BYTES: ring from here (Rabenseifner between)
    size_t hierMinBytes = 64u << 10;       // ROCE_PG_ALGO_HIER_MIN_BYTES: hierarchical from here (several ranks per machine)
    size_t bruckMaxBytes = 64u << 10;      // ROCE_PG_ALGO_BRUCK_MAX_BYTES: Bruck allgather up to here
    bool rdMaxBytesSet = false, ringMinBytesSet = false, hierMinBytesSet = false;
    // Cost model of the auto allreduce (csrc/algorithms/cost_model.cpp): per
    // message and per byte, across machines and inside one, and the reduction.
    double netAlphaUs = 10;                // ROCE_PG_ALGO_NET_ALPHA_US: one message across machines
    double netGBps = 6.25;                 // ROCE_PG_ALGO_NET_GBPS: GB/s one rank's network traffic gets
    double nicGBps = 12.5;                 // ROCE_PG_ALGO_NIC_GBPS: GB/s of one machine's port (100 Gb/s)
    double shmAlphaUs = 1;                 // ROCE_PG_ALGO_SHM_ALPHA_US: one message inside a machine
    double shmGBps = 10;                   // ROCE_PG_ALGO_SHM_GBPS: GB/s between ranks of a machine
    double reduceGBps = 8;                 // ROCE_PG_ALGO_REDUCE_GBPS: GB/s one rank reduces (output bytes)
    // Pipelining granularity of the ring algorithms.
    size_t chunkBytes = 1u << 20;          // ROCE_PG_CHUNK_BYTES
    // Large ring allreduces are split over this many channels: independent rings
    // over slices of the vector, each on its own queue pair (its own ECMP path)
    // and, beyond the first, with its reductions on a helper thread. 0 = auto:
    // the smallest channelsAuto() of the group's ranks (resolved by the
    // Communicator at group creation from every rank's CPUs, stored here).
    int nChannels = 0;                     // ROCE_PG_NCHANNELS (0: auto, else 1..kMaxChannels)
    static constexpr int kMaxChannels = 8;
  } algo;
  // Shared memory within a machine (membership/, transport/shm/, algorithms/shm_*).
  struct SharedMemory {
    // Per-rank staging slot of the shared-memory collectives (two of them per rank).
    size_t slotBytes = 1u << 20;        // ROCE_PG_SHM_SLOT_BYTES
    // Pipelining granularity of the two-step shared-memory allreduce and of the
    // shared-memory allgather, broadcast and reduce-scatter (capped by
    // the slot; a power of two). Chunks that stay in the cache between a rank
    // writing its slot and the peers reading it halve the memory traffic; the
    // default is half this CPU's per-core L2 (shmChunkAuto()).
    size_t chunkBytes = 0;              // ROCE_PG_SHM_CHUNK_BYTES (0: auto)
    // Shared-memory allreduce up to this many bytes goes one-shot (every rank
    // publishes its input, one synchronisation, every rank reduces all inputs);
    // above, reduce-scatter + allgather through the slots. Capped by the slot.
    size_t oneShotMaxBytes = 64u << 10; // ROCE_PG_SHM_ONESHOT_MAX_BYTES
    // Per-direction ring between two ranks on the same machine (point-to-point).
    size_t ringBytes = 2u << 20;        // ROCE_PG_SHM_RING_BYTES
  } shm;
  // Verbs (RoCE / InfiniBand; transport/verbs/), names as NCCL's NCCL_IB_*.
  struct Verbs {
    std::string hca;                     // ROCE_PG_IB_HCA: "mlx5_0:1,mlx5_1", "^mlx5_2", "=rxe0"
    // Not an environment setting: the sysfs path of the PCI device (GPU) this
    // rank computes on, given by the torch adapter when CUDA is in use; the
    // default port choice prefers the NICs nearest it (port_choice.hpp).
    std::string nearDevicePci;
    int gidIndex = -1;                   // ROCE_PG_IB_GID_INDEX (-1: RoCE v2 IPv4-mapped GID)
    int tc = 0;                          // ROCE_PG_IB_TC: traffic class (whole TOS byte, e.g. 106)
    int sl = 0;                          // ROCE_PG_IB_SL: service level
    int timeout = 18;                    // ROCE_PG_IB_TIMEOUT: 4.096 us * 2^t per retry
    int retryCnt = 7;                    // ROCE_PG_IB_RETRY_CNT
    int qpsPerConnection = 1;            // ROCE_PG_IB_QPS_PER_CONNECTION
    int slots = 8;                       // ROCE_PG_IB_SLOTS: landing slots a peer may hold at once (chunks in flight)
    // The most landing-pool bytes a group asks for (slots every peer writes
    // into, granted per message; docs/ARCHITECTURE.md, "The verbs transport");
    // below it a group asks what its verbs peers can use (verbsPoolSizes), and
    // its staging need is at most a quarter of it. Both pools are the
    // process's, shared by its groups, so their registered bytes stop growing
    // with the number of peers at this ceiling.
    size_t poolBytes = 16u << 20;        // ROCE_PG_IB_POOL_BYTES
    size_t slotBytes = 64u << 10;        // ROCE_PG_IB_SLOT_BYTES: payload per landing/staging slot
    // Verbs sends up to this size go eagerly: written into a landing slot of the
    // receiver at once, without waiting for its RTR (one trip instead of three).
    size_t eagerMaxBytes = 16 << 10;     // ROCE_PG_IB_EAGER_MAX_BYTES (0: off; capped by ROCE_PG_IB_SLOT_BYTES: one chunk)
    size_t zeroCopyMinBytes = 64 << 10;  // ROCE_PG_IB_ZERO_COPY_MIN_BYTES: RDMA straight from/into tensors
                                         // from this size on (0: never, always copy through staging)
    size_t regCacheBytes = 0;            // ROCE_PG_IB_REG_CACHE_BYTES: registration cache limit (0: auto)
    // Device memory the verbs transport keeps registered (GPUDirect RDMA; a
    // cache of its own: device memory is scarcer than host memory). 2 GiB: a DDP model's buckets or a few
    // FSDP all-gather buffers of a large model, a small part of a GPU's memory.
    // A device call larger than this is staged through host memory.
    size_t deviceRegBytes = size_t(2) << 30;  // ROCE_PG_IB_DEVICE_REG_BYTES
  } verbs;
  // Accelerator tensors (torch/, docs/ACCELERATORS.md).
  struct Device {
    // Element-wise collectives on device tensors are staged through host
    // memory in pieces of this many bytes, each a collective of its own, so
    // that the host part of piece k overlaps the device-to-host copy of piece
    // k+1 and the copy back of piece k-1. 4 MiB: a
    // piece's copy (~0.17 ms at PCIe 4.0 x16 rates) is long against the ~20-50 us
    // a piece costs the progress thread (events, a collective's own
    // synchronisation), and filling and draining the pipeline (one piece each
    // way) stays small against a DDP bucket's copies (25 MiB: ~1 ms each way).
    // Every rank must use the same value (it decides the messages).
    size_t pieceBytes = 4u << 20;    // ROCE_PG_DEVICE_PIECE_BYTES
    // Where reductions of staged device tensors run (csrc/torch/device_reduce.hpp):
    // "host" (roce's host kernels), "device" (ATen ops on the device, the host
    // only moves bytes) or "auto" (the cost model, per call). Every rank must
    // use the same value (the two send different messages).
    DeviceReduce reduce = DeviceReduce::Auto;  // ROCE_PG_DEVICE_REDUCE
    // Whether data-movement collectives hand device memory to the verbs
    // transport itself (docs/ACCELERATORS.md, GPUDirect RDMA): "auto" where the
    // device's memory can be registered and every peer is served by verbs,
    // "off" always stages. Every rank must use the same value (the two differ
    // in the messages they send).
    GpudirectMode gpudirect = GpudirectMode::Auto;  // ROCE_PG_GPUDIRECT
    // Most bytes of pinned host staging buffers a group keeps for reuse while no
    // operation uses them; beyond it, released buffers go back to the device's
    // host allocator once their copies are done. 512 MiB: twenty DDP buckets, or
    // a few FSDP all-gathers, without a pinned allocation per call.
    size_t stagingCacheBytes = 512u << 20;  // ROCE_PG_DEVICE_STAGING_CACHE_BYTES
  } device;
  // The flight recorder (engine/trace.hpp) and its dumps (torch/).
  struct Trace {
    // Operations each group's flight recorder keeps (csrc/engine/trace.hpp); 0: off.
    size_t entries = 2000;            // ROCE_PG_TRACE_ENTRIES
    // Whether torch's generic flight-recorder hook also records this group:
    // "native" declares roce self-recording (like Gloo), so torch skips it and
    // a call saves the hook's ~2 us; "hook" keeps torch's hook, fed roce's
    // completions, for tools that read torch's own dumps. With the recorder
    // off (entries 0) torch's hook stays whatever this says.
    TorchRecorder torchFlightRecorder = TorchRecorder::Native;  // ROCE_PG_TORCH_FR
    // Where a group writes its trace when an operation first breaks it: this
    // prefix + "<global rank>_<group name>.json" (empty: nowhere).
    std::string dump;                 // ROCE_PG_TRACE_DUMP
    // A signal (SIGUSR1/SIGUSR2) on which every group of the process writes its
    // trace to ROCE_PG_TRACE_DUMP's prefix, or /tmp/roce_trace_ where that is
    // unset (torch/trace_signal.hpp); 0: off.
    int signal = 0;                   // ROCE_PG_TRACE_SIGNAL
  } trace;
  // When network connections are made: "lazy" (default) when an algorithm or
  // a point-to-point call first needs a peer, so a rank connects to the peers
  // it talks to; "eager" connects every pair at init (a full mesh).
  ConnectMode connect = ConnectMode::Lazy;  // ROCE_PG_CONNECT: lazy|eager
  // How a subgroup of a roce world group forms: "join" joins
  // through the store like any group (the leader compares every member's
  // settings); "parent" derives its roster from the world group's, with no
  // join and no comparison. Every rank must agree (algorithmSettings).
  SubgroupMode subgroups = SubgroupMode::Parent;  // ROCE_PG_SUBGROUPS: join|parent
  // Interface whose IPv4 address peers use to reach this rank over TCP.
  std::string socketIfname;              // ROCE_PG_SOCKET_IFNAME
  // Threads that share a rank's local copies and reductions (the
  // shared-memory collectives, the network algorithms' reductions): the caller plus workers-1 threads of the
  // process's worker pool (csrc/common/worker_pool.hpp). 1: everything on the
  // calling thread. 0 = auto: workersAuto(), resolved by the Communicator at
  // group creation. A per-rank setting: peers never depend on it.
  int workers = 0;                       // ROCE_PG_WORKERS (0: auto, else 1..kMaxWorkers)
  static constexpr int kMaxWorkers = 64;
  // Collectives on CPU tensors up to this many bytes run on the caller's thread
  // when the progress engine is idle (no thread hand-off). Off by default: such
  // a call blocks until the peers arrive even with async_op=True, so
  // wait(timeout) cannot expire on it (tests/test_api.py work_semantics).
  size_t inlineMaxBytes = 0;             // ROCE_PG_INLINE_MAX_BYTES
  size_t syncInlineMaxBytes = 256 << 10;  // ROCE_PG_SYNC_INLINE_MAX_BYTES
  // Waits spin this long before blocking (futex, poll; see README).
  int spinUs = 20;                       // ROCE_PG_SPIN_US
  // How long shutdown() lets queued work finish before failing it.
  int shutdownGraceMs = 5000;            // ROCE_PG_SHUTDOWN_GRACE_MS
  bool recordsNatively() const { return trace.entries > 0 && trace.torchFlightRecorder == TorchRecorder::Native; }
  // A ring neighbour that sends no heartbeat on its lifeline for this long is
  // declared dead (hung process, machine or network down). 0 disables the
  // check; a killed process is found through its closed connection anyway.
  int heartbeatTimeoutMs = 20000;        // ROCE_PG_HEARTBEAT_TIMEOUT_MS
  bool testFailForming = false;          // ROCE_PG_TEST_FAULT=fail_forming when this group was created
  bool testNextProtocol = false;         // ROCE_PG_TEST_FAULT=next_protocol when this group was created

  static Config fromEnv();
  // Every setting fromEnv() reads, with the values it accepts, in reading
  // order: what read() asks a recording reader for (env_reader.hpp).
  static std::vector<Setting> settings();
  // Half the per-core L2 cache as the OS reports it, as a power of two in
  // [64 KiB, 1 MiB]; 512 KiB where the OS does not say.
  static size_t shmChunkAuto();
  // CPUs this process may use: its affinity mask, capped by a cgroup CPU quota.
  static int usableCpus();
  // Channels for a rank with `cpus` usable CPUs and `localRanks` ranks on its
  // machine: one per two CPUs each local rank gets (each channel beyond the
  // first keeps a helper thread busy beside the progress thread), 1 to 4.
  static int channelsAuto(int cpus, int localRanks);
  // Threads for a rank's local work with `cpus` usable CPUs and `localRanks`
  // ranks on its machine: its share of the CPUs, 1 to 8 (beyond 8, the memory
  // bandwidth of a socket is saturated long before the threads are busy).
  static int workersAuto(int cpus, int localRanks);
  // Every setting as read ("NAME=value ..."), then the values resolved at
  // group creation.
  std::string describe() const;
  // "NAME=value ..." of the settings every rank of a group must share
  // (Scope::Group in read(): the algorithms pair up their messages, the verbs
  // queues fit what peers post, neighbours agree when silence means death),
  // as read by fromEnv(), before group creation resolves auto values (a field
  // changed afterwards is not in it; a Config not from fromEnv() gives "").
  // Formation compares it.
  std::string algorithmSettings() const;
  // The same for what decides where ranks are and which transport joins them
  // (ROCE_PG_NET_TRANSPORT, ROCE_PG_FORCE_NETWORK, ROCE_PG_SIM_*): a subgroup
  // whose creation sees other values than its parent's joins instead of
  // deriving the parent's placement (roce_pg/__init__.py).
  std::string placementSettings() const;
  // Declared with the rest so the settings table and the doctor list them;
  // the process reads them once (NetworkBudgets::get).
  NetworkBudgets net;

 private:
  static Config read(EnvReader& r);
  std::string joinValues(bool (*wanted)(const SettingValue&)) const;
  std::vector<SettingValue> values_;  // what fromEnv() read, in reading order
};

// ROCE_PG_TEST_FAULT: fault injection for the test suite only ("" when unset).
//   garbage_frames  this rank sends corrupted frame headers over TCP/shm streams
//   no_doorbell     this process opens no shared-memory doorbell
//   shm_full        allocating a shared-memory ring's pages fails on this rank
//                   as on a full /dev/shm (shm_transport.cpp)
//   slow_teardown   a broken group's verbs objects are released 15 s late
//                   (the wait Soft-RoCE may make its destroy verbs do)
//   late_lifeline   this rank's lifelines act on a failure 250 ms after they
//                   read it: the runtime thread sleeps, as one kept that long
//                   from a core stalls (every service of the process waits)
//   late_mailbox    this rank opens each new group's lifeline mailbox 2 s
//                   late, so that its neighbours' first records (settings)
//                   park until then (what a slow rank's peers' records do)
//   lost_settings   this rank's lifelines never send a group's first
//                   settings record (as one dropped on the way): only the
//                   ones its neighbours' heartbeats ask for again arrive
//   die_forming_shm this process SIGKILLs itself right after it publishes
//                   its group's shared-memory segment, before the peers
//                   mapped it (what a rank killed during formation leaves)
// (those eight read once per process), and per group (Config::testFailForming,
// Config::testNextProtocol):
//   fail_forming    a group created while it is set fails on this rank
//                   before its lifelines exist (what the neighbours see of a
//                   member whose creation failed)
//   next_protocol   a group created while it is set forms as a roce_pg whose
//                   formation protocol is one version newer would (what the
//                   others see of a rank running another roce_pg build)
const std::string& testFault();


}  // namespace roce
