#include "test_hooks.hpp"

#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <pybind11/stl.h>

#include "../common/config.hpp"
#include "../liveness/verdict.hpp"
#include "../transport/verbs/dmabuf.hpp"
#include "../transport/verbs/port_choice.hpp"
#include "../transport/verbs/verbs_transport.hpp"
#include "device_memory.hpp"

namespace py = pybind11;

namespace roce::adapter {
using namespace roce::liveness;
using namespace roce::transport::verbs;

void defineTestHooks(py::module_& parent) {
  py::module_ m = parent.def_submodule("testing", "Hooks for roce's tests: pure functions on made-up inputs");
  // The cross-rank verdict from rank -> OpProgress snapshot texts
  // (csrc/liveness/verdict.hpp), for tests of its wording; no group needed.
  m.def("format_verdict", [](const std::map<int, std::string>& states, int size) {
    return roce::liveness::formatVerdict(states, size);
  }, py::arg("states"), py::arg("size"));
  // The provider's answer to ibv_reg_dmabuf_mr on the first RDMA device.
  m.def("probe_dmabuf", [] {
    const roce::transport::verbs::DmabufAnswer a = roce::transport::verbs::probeDmabufFirstDevice();
    return py::make_tuple(a.supported, a.why);
  });
  m.def("choose_gpudirect", [](const std::string& mode, bool dmabuf, bool pointer, bool nicDmabuf,
                                const std::vector<std::string>& peers, bool sharedMachine, size_t allocationBytes,
                                size_t limitBytes, bool flush) {
    roce::adapter::DeviceMemoryAnswer a{dmabuf, "device dma-buf " + std::to_string(dmabuf), pointer,
                               "device pointer " + std::to_string(pointer), nullptr};
    // `flush`: a device whose NIC writes need flushing (a hook that does nothing).
    if (flush) {
      a.flushNicWrites = [](int) { return true; };
      a.flushWhy = "device flush 1";
    }
    // `peers`: a transport name per rank, "" for ranks the call does not talk to.
    std::vector<roce::adapter::CallPeer> talks;
    for (size_t p = 0; p < peers.size(); ++p)
      if (!peers[p].empty()) talks.emplace_back(static_cast<int>(p), peers[p].c_str());
    roce::GpudirectMode gpudirect = roce::GpudirectMode::Auto;
    if (!roce::settingValue(mode, gpudirect)) throw std::invalid_argument("choose_gpudirect: mode auto or off, not " + mode);
    const roce::adapter::GpudirectChoice c = roce::adapter::chooseGpudirect(gpudirect, a, nicDmabuf, "nic dma-buf " + std::to_string(nicDmabuf),
                                                          talks, sharedMachine, allocationBytes, limitBytes);
    return py::make_tuple(roce::adapter::pathName(c.path), c.why, c.flushNicWrites != nullptr);
  });
  m.def("peer_memory_module_loaded", &roce::adapter::peerMemoryModuleLoaded, py::arg("modules_text"));
  m.def("verbs_reserved_bytes",
      [](int routed, int rails) { return roce::transport::verbs::verbsReservedBytes(roce::Config::fromEnv(), rails, routed); },
      py::arg("routed"), py::arg("rails") = 1);
  // The default selection rule alone (tests): indices of the ports used.
  m.def("nearest_ports", [](const std::vector<int>& portNodes, const std::set<int>& rankNodes, int rank) {
    return roce::transport::verbs::capRails(roce::transport::verbs::nearestPorts(portNodes, rankNodes), rank);
  });
  m.def("parse_cpu_list", &roce::transport::verbs::parseCpuList);
  m.def("pci_distance", &roce::transport::verbs::pciDistance);
  m.def("nearest_to_device", &roce::transport::verbs::nearestToDevice);
  m.def("process_numa_nodes", &roce::transport::verbs::processNumaNodes);
  // The settings every rank of a group must share ("NAME=value ..."): what
  // joining a group compares (Config::algorithmSettings()); for the doctor's test.
  m.def("algorithm_settings", [] { return roce::Config::fromEnv().algorithmSettings(); });
}

}  // namespace roce::adapter
