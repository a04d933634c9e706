"""Every NIC: which RDMA ports a rank drives. The extension's rule
(csrc/transport/verbs/port_choice.cpp: nearestPorts, capRails, parseCpuList)
and the doctor's mirror (roce_pg/_doctor_sysfs.py) agree on a table of
layouts, and the doctor names every port a rank would drive, nearest first.
The ports themselves are exercised over two Soft-RoCE devices in
tests/test_softroce.py (multi_nic/verbs2)."""
import os

import pytest

import roce_pg
from roce_pg import _doctor_sysfs as sysfs
from tests.test_doctor import MLX5_TABLE, _write, make_tree, rows_of

roce_pg._load_extension()
_C = roce_pg._C

# (port NUMA nodes, the rank's NUMA nodes, global rank, expected port indices)
CASES = [
    ([-1], set(), 0, [0]),                     # one NIC, nothing known
    ([0, 1], {0, 1}, 0, [0, 1]),               # unpinned: every port
    ([0, 1], {0}, 0, [0]),                     # pinned to node 0: its NIC
    ([0, 1], {1}, 5, [1]),
    ([0, 0, 1, 1], {1}, 0, [2, 3]),            # two NICs per socket
    ([1, 1], {0}, 0, [0, 1]),                  # no NIC on the rank's node: all of them
    ([-1, -1], {0}, 0, [0, 1]),                # NUMA unknown (VMs, rxe): all
    ([0, -1], {0}, 0, [0, 1]),                 # on every node that has a known port: not pinned, all
    ([0, 1, -1], {0}, 0, [0]),                 # pinned: the near port, not the unknown one
    (list(range(8)), set(range(8)), 0, [0, 1, 2, 3]),   # eight NICs, unpinned: at most four ...
    (list(range(8)), set(range(8)), 6, [6, 7, 0, 1]),   # ... starting at each rank's own
    ([0] * 6, {0}, 3, [3, 4, 5, 0]),
]


@pytest.mark.parametrize("port_nodes,rank_nodes,rank,expected", CASES)
def test_extension_and_doctor_pick_the_same_ports(port_nodes, rank_nodes, rank, expected):
    assert list(_C.testing.nearest_ports(port_nodes, rank_nodes, rank)) == expected
    assert sysfs.cap_rails(sysfs.nearest_ports(port_nodes, rank_nodes), rank) == expected


@pytest.mark.parametrize("text,cpus", [("0-3,8,10-11", {0, 1, 2, 3, 8, 10, 11}), ("5", {5}), ("", set()),
                                       ("2-1,x,4", {4}), ("0-1\n", {0, 1})])
def test_cpu_lists_parse_alike(text, cpus):
    assert set(_C.testing.parse_cpu_list(text)) == cpus
    assert sysfs.parse_cpu_list(text) == cpus


def test_this_process_numa_nodes_are_those_of_its_cpus():
    nodes = set(_C.testing.process_numa_nodes())
    assert nodes == sysfs.process_numa_nodes(sysfs.Root("/"))
    if os.path.isdir("/sys/devices/system/node/node0"):
        assert nodes, "a machine with NUMA sysfs has at least one node under this process"


def _two_nics(tmp, nodes, cpus_per_node):
    make_tree(tmp, devices={"mlx5_0": {1: ("4: ACTIVE", MLX5_TABLE)}, "mlx5_1": {1: ("4: ACTIVE", MLX5_TABLE)}})
    for dev, node in zip(("mlx5_0", "mlx5_1"), nodes):
        _write(tmp / f"sys/class/infiniband/{dev}/device/numa_node", f"{node}\n")
    for node, cpus in cpus_per_node.items():
        _write(tmp / f"sys/devices/system/node/node{node}/cpulist", cpus + "\n")


def test_doctor_names_every_port_the_rank_drives(tmp_path):
    mine = max(os.sched_getaffinity(0))
    # This process's CPUs all on node 0, the other node elsewhere: only mlx5_0 is near.
    _two_nics(tmp_path, (0, 1), {0: f"0-{mine}", 1: f"{mine + 1}-{mine + 8}"})
    row = rows_of(tmp_path)["roce will use"]
    assert row.status == "OK" and "mlx5_0:1 (NUMA 0)" in row.detail and "mlx5_1" not in row.detail.split("(")[0], row
    # Both NICs on this process's node: both, in device order.
    _two_nics(tmp_path, (0, 0), {0: f"0-{mine}"})
    row = rows_of(tmp_path)["roce will use"]
    assert row.detail.startswith("mlx5_0:1 (NUMA 0), mlx5_1:1 (NUMA 0)"), row
    # ROCE_PG_IB_HCA overrides locality: every port it selects.
    _two_nics(tmp_path, (0, 1), {0: f"0-{mine}", 1: f"{mine + 1}-{mine + 8}"})
    row = rows_of(tmp_path, {"ROCE_PG_IB_HCA": "mlx5"})["roce will use"]
    assert row.detail.startswith("mlx5_0:1 (NUMA 0), mlx5_1:1 (NUMA 1)") and "ROCE_PG_IB_HCA" in row.detail, row
    # The memlock row counts the pools once per port.
    mem = rows_of(tmp_path, {"ROCE_PG_IB_HCA": "mlx5"})["memlock"]
    assert "on each of 2 ports" in mem.detail, mem


def test_registered_bytes_formula_counts_every_rail():
    one, two = _C.verbs_registered_bytes(3), _C.verbs_registered_bytes(3, 2)
    assert two >= 2 * one  # two rails: everything registered twice (and at least two queue pairs per peer)


GPU = "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:05:00.0"
PCI_CASES = [
    # (NIC paths, nearest indices): a NIC under the GPU's PCIe switch beats one
    # behind the same root port, which beats one on another root port of the
    # root complex; another root complex, or no device (rxe), never counts.
    (["/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:10.0/0000:06:00.0",   # same switch: 4 hops
      "/sys/devices/pci0000:00/0000:00:03.0/0000:07:00.0",                             # same root complex: 6
      "/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0", ""], [0]),
    (["/sys/devices/pci0000:00/0000:00:03.0/0000:07:00.0",
      "/sys/devices/pci0000:00/0000:00:03.0/0000:07:00.1"], [0, 1]),                    # a dual-port NIC: both
    (["/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0", "", "/sys/devices/virtual/net/x"], []),
]


@pytest.mark.parametrize("nics,nearest", PCI_CASES)
def test_nics_nearest_the_gpu_by_pci_hops(nics, nearest):
    assert list(_C.testing.nearest_to_device(nics, GPU)) == nearest


def test_pci_distance_counts_hops_to_the_common_bridge():
    assert _C.testing.pci_distance(GPU, GPU) == 0
    assert _C.testing.pci_distance(GPU, "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:10.0/0000:06:00.0") == 4
    far = _C.testing.pci_distance(GPU, "/sys/devices/pci0000:80/0000:80:01.0")
    assert far == _C.testing.pci_distance(GPU, "") and far > 1000


def test_a_cpu_rank_gets_no_gpu_hint():
    # No CUDA in use here (and never initialized just to look): no PCI hint.
    assert roce_pg._rank_gpu_pci() == ""
