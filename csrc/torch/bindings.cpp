// Python module roce_pg._C: the backend class and its creator, plus a probe of
// the RDMA devices libibverbs sees.
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/utils/pybind.h>

#include "../transport/verbs/device_probe.hpp"
#include "backend.hpp"
#include "process_group.hpp"

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "roce: a torch.distributed backend over RDMA verbs, shared memory and TCP";
  py::object backendBase = py::module_::import("torch.distributed").attr("Backend");
  (void)backendBase;
  py::class_<roce::RoceBackend, c10d::Backend, c10::intrusive_ptr<roce::RoceBackend>>(m, "RoceBackend")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout, int globalRank) {
             return c10::make_intrusive<roce::RoceBackend>(store, rank, size, timeout, globalRank);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"), py::arg("global_rank"),
           py::call_guard<py::gil_scoped_release>())
      .def("_counters",
           [](roce::RoceBackend& b) {
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
             d["registrations"] = get(c.registrations);
             d["eager_sends"] = get(c.eagerSends);
             d["cached_mrs"] = get(c.cachedMrs);
             return d;
           })
      .def("_reset_counters", [](roce::RoceBackend& b) { b.counters().reset(); })
      .def("_device_staging_stats", [](const roce::RoceBackend& b) {
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
  py::class_<roce::RoceProcessGroup, c10d::ProcessGroup, c10::intrusive_ptr<roce::RoceProcessGroup>>(
      m, "RoceProcessGroup")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size) {
             return c10::make_intrusive<roce::RoceProcessGroup>(store, rank, size);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"));
  m.def("rdma_ports", [] {
    py::list out;
    for (const auto& p : roce::probeRdmaPorts()) {
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
