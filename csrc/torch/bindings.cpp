// Python module roce_pg._C: the backend class and its creator, plus a probe of
// the RDMA devices libibverbs sees and the table of ROCE_PG_* settings.
#include <cmath>
#include <cstdint>
#include <stdexcept>

#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/utils/pybind.h>

#include "../liveness/verdict.hpp"
#include "../runtime/front_desk.hpp"
#include "../runtime/process_links.hpp"
#include "../runtime/process_runtime.hpp"
#include "../transport/shm/shm_doorbells.hpp"
#include "../transport/tcp/tcp_mux.hpp"
#include "../algorithms/cost_model.hpp"
#include "../common/config.hpp"
#include "../transport/verbs/device_probe.hpp"
#include "../transport/verbs/dmabuf.hpp"
#include "../transport/verbs/port_choice.hpp"
#include "../transport/verbs/reaper.hpp"
#include "../transport/verbs/verbs_transport.hpp"
#include "backend.hpp"
#include "device_memory.hpp"
#include "device_notify.hpp"
#include "network_refusals.hpp"
#include "process_group.hpp"
#include "test_hooks.hpp"
#include "window.hpp"

namespace py = pybind11;

namespace {

// The cost model's view of `ranks` over `machines`, `perMachine` each (0: uneven).
roce::algorithms::Shape shapeOf(const roce::Config& cfg, int ranks, int machines, int perMachine) {
  const bool even = perMachine > 0 && perMachine * machines == ranks;
  const int most = even ? perMachine : (ranks + machines - 1) / machines;
  return roce::algorithms::Shape::group(ranks, machines, most, even, cfg.placement.forceNetwork);
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "roce: a torch.distributed backend over RDMA verbs, shared memory and TCP";
  py::object backendBase = py::module_::import("torch.distributed").attr("Backend");
  (void)backendBase;
  py::class_<roce::adapter::RoceBackend, c10d::Backend, c10::intrusive_ptr<roce::adapter::RoceBackend>>(m, "RoceBackend")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout, int globalRank, const std::string& nearPci,
                       bool awaitReconfigure) {
             using roce::adapter::Formation;
             return c10::make_intrusive<roce::adapter::RoceBackend>(
                 store, rank, size, timeout, globalRank, nearPci,
                 awaitReconfigure ? Formation::AwaitReconfigure : Formation::Join);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"), py::arg("global_rank"),
           py::arg("near_pci") = std::string(), py::arg("await_reconfigure") = false,
           py::call_guard<py::gil_scoped_release>())
      .def_static(
          "_from_parent",
          [](const roce::adapter::RoceBackend& parent, const c10::intrusive_ptr<c10d::Store>& store, int rank,
             const std::vector<int>& parentRanks, const std::string& groupName, std::chrono::milliseconds timeout) {
            return c10::make_intrusive<roce::adapter::RoceBackend>(parent, store, rank, parentRanks, groupName, timeout);
          },
          py::arg("parent"), py::arg("store"), py::arg("rank"), py::arg("parent_ranks"), py::arg("group_name"),
          py::arg("timeout"), py::call_guard<py::gil_scoped_release>())
      .def("_forms_subgroups", &roce::adapter::RoceBackend::formsSubgroups)
      .def("_formation_store_ops", &roce::adapter::RoceBackend::formationStoreOps)
      // Tests of hostile peers: each rank's nonce for the group, and the process key of each.
      .def("_nonces", &roce::adapter::RoceBackend::groupNonces)
      .def("_process_keys", &roce::adapter::RoceBackend::processKeys)
      .def("_nics", &roce::adapter::RoceBackend::nics)
      .def("_placement_settings", &roce::adapter::RoceBackend::placementSettings)
      .def("_counters",
           [](roce::adapter::RoceBackend& b) {
             auto& c = b.counters();
             auto get = [](const std::atomic<uint64_t>& x) { return x.load(std::memory_order_relaxed); };
             py::dict d;
             d["bytes_sent_shm"] = get(c.bytesSentShm);
             d["bytes_sent_net"] = get(c.bytesSentNet);
             d["bytes_copied"] = get(c.bytesCopied);
             d["ops"] = get(c.ops);
             d["sends"] = get(c.sends);
             d["blocked_waits"] = get(c.blockedWaits);
             d["inline_ops"] = get(c.inlineOps);
             d["bytes_zero_copy"] = get(c.bytesZeroCopy);
             d["bytes_written"] = get(c.bytesWritten);
             d["bytes_read"] = get(c.bytesRead);
             d["window_puts_served"] = get(c.windowPutsServed);
             d["window_signals_served"] = get(c.windowSignalsServed);
             d["registrations"] = get(c.registrations);
             d["eager_sends"] = get(c.eagerSends);
             d["staging_waits"] = get(c.stagingWaits);
             d["landing_waits"] = get(c.landingWaits);
             d["bytes_reduced_on_device"] = get(c.bytesReducedOnDevice);
             d["device_bytes_staged"] = get(c.deviceBytesStaged);
             d["device_bytes_direct"] = get(c.deviceBytesDirect);
             d["device_bytes_local"] = get(c.deviceBytesLocal);
             d["device_waits_notified"] = get(c.deviceWaitsNotified);
             d["device_wait_naps"] = get(c.deviceWaitNaps);
             d["collective_ns"] = get(c.collectiveNs);
             d["collectives_timed"] = get(c.collectivesTimed);
             d["window_ns"] = roce::Counters::steadyNs() - c.resetAtNs.load(std::memory_order_relaxed);
             d["worker_slices"] = get(c.workerSlices);
             d["cached_mrs"] = get(c.cachedMrs);
             d["connections"] = get(c.connections);
             d["registered_bytes"] = get(c.registeredBytes);
             // What the process refused of what reached it over the network
             // (every group of the process shows the same; never reset).
             for (const auto& [name, count] : roce::adapter::networkRefusals()) d[name] = count;
             return d;
           })
      .def("_gpudirect_log", &roce::adapter::RoceBackend::gpudirectLog)
      .def("_reset_counters", [](roce::adapter::RoceBackend& b) { b.counters().reset(); })
      .def("_reset_straggler_window", [](roce::adapter::RoceBackend& b) { b.counters().resetWindow(); })
      .def("_wait_engine_parked", &roce::adapter::RoceBackend::waitEngineParked, py::arg("timeout"),
           py::call_guard<py::gil_scoped_release>())
      .def("_trace_capacity", [](const roce::adapter::RoceBackend& b) { return b.trace().capacity(); })
      .def("_records_natively", &roce::adapter::RoceBackend::recordsNatively)
      .def("_trace_dump_json", &roce::adapter::RoceBackend::traceDumpJson)
      .def("_set_trace_ranks", &roce::adapter::RoceBackend::setTraceRanks)
      .def("_trace",
           [](const roce::adapter::RoceBackend& b) {
             // The group's flight recorder, oldest entry first (roce_pg.trace()).
             std::vector<std::string> reasons;
             const auto entries = b.trace().snapshot(&reasons);
             auto dtype = [](int16_t code) -> py::object {
               if (code < 0) return py::none();
               return py::str(c10::toString(static_cast<c10::ScalarType>(code)));
             };
             auto ns = [](int64_t t) -> py::object { return t ? py::object(py::int_(t)) : py::none(); };
             py::list out;
             for (size_t i = 0; i < entries.size(); ++i) {
               const auto& e = entries[i];
               py::dict d;
               d["record_id"] = e.pos;
               d["seq"] = e.seq;
               d["collective_seq"] = e.collectiveSeq;
               d["p2p_seq"] = e.p2pSeq;
               d["op"] = e.op;
               d["op_type"] = e.opType;
               d["is_p2p"] = e.p2p;
               d["algorithm"] = e.algo ? py::object(py::str(e.algo)) : py::none();
               d["peer"] = e.peer >= 0 ? py::object(py::int_(e.peer)) : py::none();
               d["tag"] = e.tag;
               d["bytes"] = e.bytes;
               d["in_elems"] = e.inElems;
               d["out_elems"] = e.outElems;
               d["in_dtype"] = dtype(e.inDtype);
               d["out_dtype"] = dtype(e.outDtype);
               d["enqueue_ns"] = e.enqueueNs;
               d["start_ns"] = ns(e.startNs);
               d["end_ns"] = ns(e.endNs);
               d["timeout_ms"] = e.timeoutMs;
               d["state"] = roce::engine::traceStateName(e.state);
               d["inline"] = e.inlined;
               d["error"] = e.state == roce::engine::TraceState::Failed ? py::object(py::str(reasons[i])) : py::none();
               out.append(d);
             }
             return out;
           })
      .def("_device_staging_stats", [](const roce::adapter::RoceBackend& b) {
        // The pinned staging buffers of device collectives (docs/ACCELERATORS.md).
        const auto s = b.deviceStagingStats();
        py::dict d;
        d["allocations"] = s.allocations;
        d["reuses"] = s.reuses;
        d["cached_bytes"] = s.cachedBytes;
        d["blocks"] = s.blocks;
        d["pinned"] = s.pinned;
        return d;
      });
  py::class_<roce::adapter::RoceProcessGroup, c10d::ProcessGroup, c10::intrusive_ptr<roce::adapter::RoceProcessGroup>>(
      m, "RoceProcessGroup")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size) {
             return c10::make_intrusive<roce::adapter::RoceProcessGroup>(store, rank, size);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"));
  // What the auto allreduce would pick for `bytes` per rank on a group of
  // `ranks` spread over `machines` with `per_machine` ranks each (0: the
  // machines are uneven, at most ceil(ranks / machines) each), with the
  // ROCE_PG_ALGO_* settings of this process's environment. For the docs'
  // tables and the tests (docs/ALGORITHMS.md); no group needed.
  m.def("_allreduce_plan", [](int ranks, int machines, int perMachine, size_t bytes) {
    if (ranks < 1 || machines < 1 || machines > ranks || perMachine < 0 || perMachine * machines > ranks)
      throw std::invalid_argument("_allreduce_plan: need 1 <= machines <= ranks and per_machine * machines <= ranks");
    const roce::Config cfg = roce::Config::fromEnv();
    const roce::algorithms::Shape shape = shapeOf(cfg, ranks, machines, perMachine);
    const roce::algorithms::Choice ch = roce::algorithms::planAllreduce(cfg, shape, bytes);
    py::dict d, estimates;
    d["algo"] = roce::algorithms::algoName(ch.algo);
    d["across"] = ch.algo == roce::algorithms::Algo::Hier ? py::object(py::str(roce::algorithms::algoName(ch.across))) : py::none();
    d["decided_by"] = ch.decidedBy ? py::object(py::str(ch.decidedBy)) : py::none();
    for (int i = 0; i < roce::algorithms::candidateCount(); ++i)
      if (!std::isnan(ch.estimate[i])) estimates[roce::algorithms::candidateName(i)] = ch.estimate[i] * 1e6;
    d["estimates_us"] = estimates;
    d["tree_chunks"] = roce::algorithms::treeChunks(roce::algorithms::CostConstants(cfg), shape, bytes);
    return d;
  }, py::arg("ranks"), py::arg("machines"), py::arg("per_machine"), py::arg("bytes"));
  // Where ROCE_PG_DEVICE_REDUCE=auto reduces a staged piece of `bytes` per
  // rank, with both estimates (docs/ACCELERATORS.md); no group needed.
  m.def("_staged_reduce_plan", [](int ranks, int machines, bool sharedMemory, size_t bytes) {
    if (ranks < 2 || machines < 1 || machines > ranks || (sharedMemory && machines != 1))
      throw std::invalid_argument("_staged_reduce_plan: need 2 <= ranks, 1 <= machines <= ranks, and one machine "
                                  "for shared memory");
    const roce::Config cfg = roce::Config::fromEnv();
    const roce::algorithms::Shape shape = shapeOf(cfg, ranks, machines, ranks % machines == 0 ? ranks / machines : 0);
    py::dict d;
    d["host_us"] = roce::algorithms::costStagedHostReduce(cfg, shape, bytes, sharedMemory) * 1e6;
    d["device_us"] = roce::algorithms::costStagedDeviceReduce(cfg, shape, bytes, sharedMemory) * 1e6;
    d["where"] = roce::algorithms::stagedReducePrefersDevice(cfg, shape, bytes, sharedMemory) ? "device" : "host";
    return d;
  }, py::arg("ranks"), py::arg("machines"), py::arg("shared_memory"), py::arg("bytes"));
  // How memory of a device type reaches the NIC (device_memory.hpp): the
  // declaration roce_pg.declare_device_memory() makes, and the answer.
  // A device type's host functions: the address of its C++ function
  // `bool f(const c10::Stream&, void (*)(void*), void*)` (roce::adapter::LaunchHostFunc), 0 to withdraw.
  m.def("_declare_host_func", [](const std::string& device, uintptr_t launch) {
    roce::adapter::declareHostFunc(c10::Device(device).type(), reinterpret_cast<roce::adapter::LaunchHostFunc>(launch));
  }, py::arg("device"), py::arg("launch"));
  m.def("_declare_device_memory", [](const std::string& device, const std::string& path, uintptr_t bufferId) {
    if (path != "pointer" && path != "staged")
      throw std::invalid_argument("declare_device_memory: path must be \"pointer\" or \"staged\", not \"" + path + "\"");
    roce::adapter::declareDeviceMemory(c10::Device(device).type(), path == "pointer",
                              "declared " + path + " (roce_pg.declare_device_memory)",
                              reinterpret_cast<uint64_t (*)(const void*, int)>(bufferId));
  }, py::arg("device"), py::arg("path"), py::arg("buffer_id") = 0);
  m.def("_device_memory_path", [](const std::string& device) {
    const roce::adapter::DeviceMemoryAnswer a = roce::adapter::deviceMemoryPath(c10::Device(device));
    py::dict d;
    d["dmabuf"] = a.dmabuf;
    d["dmabuf_why"] = a.dmabufWhy;
    d["pointer"] = a.pointer;
    d["pointer_why"] = a.pointerWhy;
    d["flush"] = a.flushNicWrites != nullptr;
    d["flush_why"] = a.flushWhy;
    return d;
  }, py::arg("device"));
  // The verbs transport's registered bytes per rank for `peers` connected
  // peers, in a group reaching `routed` peers over verbs (-1: `peers`), with
  // the ROCE_PG_* settings of this process (the doctor mirrors it).
  m.def(
      "verbs_registered_bytes",
      [](int peers, int rails, int routed) {
        return roce::transport::verbs::verbsRegisteredBytes(roce::Config::fromEnv(), peers, rails, routed);
      },
      py::arg("peers"), py::arg("rails") = 1, py::arg("routed") = -1);
  // Of those, the staging pool's, which the process's groups share (so a
  // group's counters leave it out, as the landing pool's below;
  // _runtime_stats()["verbs_staging_bytes"]).
  m.def(
      "verbs_staging_bytes",
      [](int routed, int rails) { return roce::transport::verbs::verbsStagingBytes(roce::Config::fromEnv(), rails, routed); },
      py::arg("routed"), py::arg("rails") = 1);
  // And the landing pool's (also the process's): as the first group
  // registers it, and what a further group of the same shape adds (its
  // reserved slots); _runtime_stats()["verbs_landing_bytes"] has the total.
  m.def(
      "verbs_landing_bytes",
      [](int routed, int rails) { return roce::transport::verbs::verbsLandingBytes(roce::Config::fromEnv(), rails, routed); },
      py::arg("routed"), py::arg("rails") = 1);
  // The ports this process would drive with its ROCE_PG_* settings, as
  // [{"device", "port", "gid_index", "numa_node", "pci"}], and why none when empty
  // (the doctor's rank -> NIC row); `rank` spreads ranks over more than 4 ports.
  m.def("_chosen_ports", [](int rank, const std::string& nearPci) {
    std::string why;
    py::list out;
    roce::Config cfg = roce::Config::fromEnv();
    cfg.verbs.nearDevicePci = nearPci;
    for (const auto& c : roce::transport::verbs::chooseVerbsPorts(cfg, rank, why)) {
      py::dict d;
      d["device"] = c.device;
      d["port"] = c.port;
      d["gid_index"] = c.gidIndex;
      d["numa_node"] = c.numaNode;
      d["pci"] = c.pciPath;
      out.append(d);
    }
    return py::make_tuple(out, why);
  }, py::arg("rank"), py::arg("near_pci") = std::string());
  // Every ROCE_PG_* setting the extension reads, in reading order, with what
  // it accepts: {name: ("int", lo, hi, zero_ok) | ("number", lo, hi) |
  // ("choice", names) | ("flag",) | ("text",) | ("token", max_len)}. Built by
  // the parser itself (Config::settings()); the build writes it into the
  // doctor's copy (roce_pg/_settings_table.py, setup.py).
  m.def("settings", [] {
    using Kind = roce::Setting::Kind;
    py::dict out;
    for (const roce::Setting& s : roce::Config::settings()) {
      switch (s.kind) {
        case Kind::Integer: out[s.name.c_str()] = py::make_tuple("int", s.lo, s.hi, s.zeroOk); break;
        case Kind::Number: out[s.name.c_str()] = py::make_tuple("number", s.numberLo, s.numberHi); break;
        case Kind::Choice: out[s.name.c_str()] = py::make_tuple("choice", py::tuple(py::cast(s.choices))); break;
        case Kind::Flag: out[s.name.c_str()] = py::make_tuple("flag"); break;
        case Kind::Text: out[s.name.c_str()] = py::make_tuple("text"); break;
        case Kind::Token: out[s.name.c_str()] = py::make_tuple("token", s.hi); break;
      }
    }
    return out;
  });
  // The rest of each setting's declaration: {name: (layer, scope, placement)},
  // scope "rank", "group" (formation compares it) or "advised" (env_reader.hpp).
  m.def("setting_declarations", [] {
    py::dict out;
    for (const roce::Setting& s : roce::Config::settings())
      out[s.name.c_str()] = py::make_tuple(s.layer, roce::scopeName(s.scope), s.placement);
    return out;
  });
  // The per-process runtime, for tests and the doctor: what every
  // group of this process shares.
  m.def("_runtime_stats", [] {
    auto& rt = roce::runtime::ProcessRuntime::get();
    py::dict d;
    d["listen_port"] = rt.desk().port();
    d["mailboxes"] = rt.desk().openMailboxes();  // every group's, and the process links' own
    d["process_links"] = rt.links().openLinks();
    const auto parked = rt.links().parkedStats();  // lifeline records for groups not created here yet
    d["link_parked_groups"] = parked.groups;
    d["link_parked_bytes"] = parked.bytes;
    d["link_records_dropped"] = parked.dropped;
    d["link_records_parked"] = parked.parkedEver;  // ever kept for a group not created yet
    d["links_held"] = parked.links;  // open, and closed ones kept a minute
    d["links_refused"] = parked.linksRefused;
    d["link_records_misrouted"] = parked.recordsMisrouted;  // lifeline records naming a rank of another process
    d["link_records_forged"] = parked.recordsForged;  // records not signed with the job secret
    d["parked"] = rt.desk().parked();
    d["connections_unauthenticated"] = rt.desk().unauthenticated();  // heads whose MAC did not match the job secret
    d["connections_other_version"] = rt.desk().otherVersions();  // hellos of another protocol version, answered
    d["connections_refused_busy"] = rt.desk().refusedBusy();  // closed unread: too many heads pending (per source, or all)
    d["pending_heads"] = rt.desk().pendingHeads();  // accepted connections whose head has not arrived yet
    d["tcp_sockets"] = rt.service<roce::transport::tcp::TcpMux>().sockets();  // the TCP transport's, one per peer process for every group
    d["tcp_parked_streams"] = rt.service<roce::transport::tcp::TcpMux>().parkedStreams();  // streams for groups not created here yet
    d["shm_doorbell_groups"] = rt.service<roce::transport::shm::ShmDoorbells>().groups();  // local groups enrolled in the process's one doorbell
    d["services"] = rt.services();
    d["verbs_devices"] = roce::transport::verbs::VerbsDevice::openCount();
    d["verbs_staging_bytes"] = roce::transport::verbs::StagingPool::processBytes();  // shared by the process's groups
    d["verbs_landing_bytes"] = roce::transport::verbs::LandingPool::processBytes();  // likewise
    d["verbs_remains_pending"] = roce::transport::verbs::remainsPending();  // broken groups' objects the reaper has yet to release
    return d;
  });
  m.def("_placement_settings", [] { return roce::Config::fromEnv().placementSettings(); });
#ifdef C10D_BACKEND_HAS_WINDOW
  // roce_pg.window_get: torch's Window has no get yet. Without the GIL, as
  // torch's own window calls: a synchronous get waits for the progress
  // thread, which takes the GIL to drop the last C++ reference of a tensor
  // Python also holds.
  m.def("_window_get", [](const c10::intrusive_ptr<c10d::Window>& window, at::Tensor out, int64_t src, int64_t offset,
                          bool asyncOp) {
    auto* roce = dynamic_cast<roce::adapter::RoceWindow*>(window.get());
    TORCH_CHECK(roce, "roce_pg.window_get takes a window of a roce group (dist._new_window on it)");
    return roce->get(std::move(out), src, offset, asyncOp);
  }, py::call_guard<py::gil_scoped_release>());  // it may wait for the progress thread, which may need the GIL
#endif
  roce::adapter::defineTestHooks(m);
  m.def("rdma_ports", [] {
    py::list out;
    for (const auto& p : roce::transport::verbs::probeRdmaPorts()) {
      py::dict d;
      d["device"] = p.device;
      d["port"] = p.port;
      d["state"] = p.state;
      d["link_layer"] = p.linkLayer;
      d["active_mtu"] = p.activeMtu;
      out.append(d);
    }
    return out;
  });
}
