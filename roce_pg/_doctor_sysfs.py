"""What the doctor reads from the machine: /sys, /proc and /dev, under a
configurable root so that tests can hand it a fake tree. No torch, no verbs
calls (those are in _doctor_verbs.py), no subprocesses: every fork costs tens
of milliseconds in an emulated VM, and rxe has 1024 GID entries per port.

The port/GID choice below mirrors csrc/transport/verbs/port_choice.cpp
(chooseVerbsPorts, nearestPorts, autoGidIndex, HcaFilter): keep them in step.
"""
import ipaddress
import os
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
# RDMA-related kernel modules worth naming (drivers of the NICs roce is used on).
RDMA_MODULES = ("ib_core", "ib_uverbs", "rdma_ucm", "rdma_cm", "rdma_rxe", "siw", "mlx5_ib", "mlx5_core",
                "mlx4_ib", "bnxt_re", "irdma", "erdma", "efa", "mana_ib", "hns_roce_hw_v2", "qedr",
                "nvidia_peermem")
LIB_DIRS = ("usr/lib/x86_64-linux-gnu", "lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu",
            "lib/aarch64-linux-gnu", "usr/lib64", "lib64", "usr/lib", "lib", "usr/local/lib")


class Root:
    """Paths of the machine being examined ("/" normally; a fake tree in tests)."""

    def __init__(self, root: str = "/"):
        self.root = root

    def path(self, p: str) -> str:
        return os.path.join(self.root, p.lstrip("/"))

    @property
    def is_real(self) -> bool:
        return os.path.realpath(self.root) == "/"

    def read(self, p: str) -> Optional[str]:
        """File content stripped, or None when missing/unreadable (sysfs returns
        EINVAL for, e.g., the type of an empty GID entry)."""
        try:
            with open(self.path(p)) as f:
                return f.read().strip()
        except (OSError, UnicodeDecodeError):
            return None

    def listdir(self, p: str) -> List[str]:
        try:
            return sorted(os.listdir(self.path(p)), key=natural_key)
        except OSError:
            return []

    def exists(self, p: str) -> bool:
        return os.path.exists(self.path(p))


def natural_key(s: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


# ---- GIDs -----------------------------------------------------------------

@dataclass
class Gid:
    index: int
    raw: str                      # as sysfs prints it: 8 groups of 4 hex digits
    type: Optional[str] = None    # "RoCE v2", "IB/RoCE v1", None if unknown
    ndev: Optional[str] = None    # netdev the GID belongs to (RoCE)

    @property
    def address(self) -> Optional[ipaddress.IPv6Address]:
        try:
            return ipaddress.IPv6Address(self.raw)
        except ValueError:
            return None

    @property
    def ipv4(self) -> Optional[str]:
        a = self.address
        return str(a.ipv4_mapped) if a is not None and a.ipv4_mapped else None

    @property
    def v2(self) -> bool:
        return (self.type or "").strip().lower() == "roce v2"

    @property
    def v1(self) -> bool:
        return "v1" in (self.type or "").lower()

    @property
    def link_local(self) -> bool:
        a = self.address
        return bool(a is not None and a.is_link_local)

    def kind(self) -> str:
        """Short human description: '::ffff:10.99.0.1 = 10.99.0.1 on dummy0, RoCE v2'."""
        a = self.address
        text = str(a) if a is not None else self.raw
        if self.ipv4:
            text = f"::ffff:{self.ipv4} = IPv4 {self.ipv4}"
        elif self.link_local:
            text += " (IPv6 link-local)"
        parts = [p for p in (f"on {self.ndev}" if self.ndev else "", self.type or "type unknown") if p]
        return f"{text} ({', '.join(parts)})"


@dataclass
class Port:
    device: str
    port: int
    state: str = "?"              # ACTIVE, DOWN, INIT, ARMED
    phys_state: str = "?"         # LinkUp, Disabled, Polling, ...
    link_layer: str = "?"         # Ethernet (RoCE) or InfiniBand
    rate: str = ""
    gid_tbl_len: int = 0          # number of entries in the GID table
    gids: List[Gid] = field(default_factory=list)   # non-zero entries only
    # Filled from libibverbs when it can be queried (None: unknown).
    active_mtu: Optional[int] = None
    max_mtu: Optional[int] = None
    max_msg_sz: Optional[int] = None
    numa_node: int = -1           # the NIC's NUMA node (sysfs), -1 unknown

    @property
    def name(self) -> str:
        return f"{self.device}:{self.port}"

    @property
    def ethernet(self) -> bool:
        return self.link_layer.lower() == "ethernet"

    @property
    def active(self) -> bool:
        return self.state == "ACTIVE"

    def gid(self, index: int) -> Optional[Gid]:
        for g in self.gids:
            if g.index == index:
                return g
        return None

    def netdevs(self) -> List[str]:
        seen: List[str] = []
        for g in self.gids:
            if g.ndev and g.ndev not in seen:
                seen.append(g.ndev)
        return seen


def _after_colon(text: Optional[str]) -> str:
    """'4: ACTIVE' -> 'ACTIVE'; '5: LinkUp' -> 'LinkUp'."""
    if not text:
        return "?"
    return text.split(":", 1)[1].strip() if ":" in text else text.strip()


def read_ports(root: Root) -> List[Port]:
    """Every port of every device in /sys/class/infiniband, with its non-zero GIDs."""
    ports = []
    for dev in root.listdir("/sys/class/infiniband"):
        for p in root.listdir(f"/sys/class/infiniband/{dev}/ports"):
            if not p.isdigit():
                continue
            base = f"/sys/class/infiniband/{dev}/ports/{p}"
            port = Port(dev, int(p), state=_after_colon(root.read(f"{base}/state")),
                        phys_state=_after_colon(root.read(f"{base}/phys_state")),
                        link_layer=root.read(f"{base}/link_layer") or "?",
                        rate=root.read(f"{base}/rate") or "")
            node = root.read(f"/sys/class/infiniband/{dev}/device/numa_node")
            port.numa_node = int(node) if node and node.lstrip("-").isdigit() else -1
            entries = [e for e in root.listdir(f"{base}/gids") if e.isdigit()]
            port.gid_tbl_len = len(entries)
            for e in entries:
                raw = root.read(f"{base}/gids/{e}")
                if not raw or raw == ZERO_GID:
                    continue
                port.gids.append(Gid(int(e), raw, root.read(f"{base}/gid_attrs/types/{e}"),
                                     root.read(f"{base}/gid_attrs/ndevs/{e}")))
            ports.append(port)
    return ports


def auto_gid(port: Port) -> Tuple[Optional[Gid], str]:
    """The GID roce picks without ROCE_PG_IB_GID_INDEX, and why. Same scoring as
    autoGidIndex(): RoCE v2 counts 2, IPv4-mapped 1, the first best entry wins."""
    best, best_score = None, -1
    for g in port.gids:
        score = (2 if g.v2 else 0) + (1 if g.ipv4 else 0)
        if score > best_score:
            best, best_score = g, score
    why = {3: "the first RoCE v2 GID with an IPv4-mapped address",
           2: "the first RoCE v2 GID (none has an IPv4-mapped address)",
           1: "the first IPv4-mapped GID (none is RoCE v2)",
           0: "the first non-zero GID (none is RoCE v2 or IPv4-mapped)"}.get(best_score, "no non-zero GID")
    return best, why


# ---- ROCE_PG_IB_HCA, as csrc/transport/verbs/verbs_device.cpp reads it --------

class HcaFilter:
    """ROCE_PG_IB_HCA in NCCL syntax: 'mlx5_0:1,mlx5_1' (prefix match), '=rxe0'
    (exact), '^mlx5_2' (exclude)."""

    def __init__(self, spec: str = ""):
        self.spec = spec or ""
        s = self.spec
        self.exclude = s.startswith("^")
        if self.exclude:
            s = s[1:]
        self.exact = s.startswith("=")
        if self.exact:
            s = s[1:]
        self.items: List[Tuple[str, int]] = []
        self.problems: List[str] = []
        for tok in s.split(","):
            if not tok:
                continue
            name, _, port = tok.partition(":")
            if port and not port.isdigit():
                self.problems.append(f"port {port!r} in {tok!r} is not a number (read as 'any port')")
            self.items.append((name, int(port) if port.isdigit() else 0))

    def accepts(self, device: str, port: int) -> bool:
        if not self.items:
            return True
        listed = any((device == n if self.exact else device.startswith(n)) and (p == 0 or p == port)
                     for n, p in self.items)
        return not listed if self.exclude else listed


@dataclass
class Choice:
    port: Optional[Port]
    gid: Optional[Gid] = None
    gid_index: int = -1
    why: str = ""          # why this port/GID (or why none)
    seen: str = ""         # the ports looked at, like the extension's message


MAX_RAILS = 4  # kMaxRails: ports one rank drives


def usable_ports(ports: List[Port], hca: str = "", gid_index: int = -1,
                 order: Optional[List[str]] = None) -> List[Choice]:
    """Every port roce could drive: devices in libibverbs order (`order`, else by
    name), ports ascending; ACTIVE, passing the filter, of the first such port's
    link layer and, on Ethernet, with a GID index inside the table. An empty
    list holds one Choice with port None saying why."""
    filt = HcaFilter(hca)
    rank = {d: i for i, d in enumerate(order or [])}
    seen, out = [], []
    for port in sorted(ports, key=lambda p: (rank.get(p.device, len(rank)), natural_key(p.device), p.port)):
        seen.append(f"{port.name}({port.state}, {port.link_layer})")
        if not filt.accepts(port.device, port.port) or not port.active:
            continue
        if out and out[0].port.ethernet != port.ethernet:
            seen[-1] += "[other link layer than the first port: not used]"
            continue
        if not port.ethernet:
            out.append(Choice(port, None, 0, "InfiniBand link layer: LID addressing, no GID needed"))
            continue
        if gid_index >= 0:
            g, idx, why = port.gid(gid_index), gid_index, f"set by ROCE_PG_IB_GID_INDEX={gid_index}"
        else:
            g, why = auto_gid(port)
            idx = g.index if g else -1
        if idx < 0 or idx >= port.gid_tbl_len:
            seen[-1] += "[no usable GID]"
            continue
        out.append(Choice(port, g, idx, why))
    for c in out:
        c.seen = " ".join(seen)
    if out:
        return out
    where = f" matching ROCE_PG_IB_HCA={hca}" if hca else ""
    return [Choice(None, None, -1, f"no ACTIVE RDMA port{where}", " ".join(seen) or "none")]


def nearest_ports(port_nodes: List[int], rank_nodes: set) -> List[int]:
    """nearestPorts(): indices of the ports a rank on `rank_nodes` uses without
    ROCE_PG_IB_HCA: those on its NUMA nodes when it is pinned to a subset of the
    nodes that have ports (and some port is there), else all."""
    known = {n for n in port_nodes if n >= 0}
    near = [i for i, n in enumerate(port_nodes) if n >= 0 and n in rank_nodes]
    pinned = any(n not in rank_nodes for n in known)
    return near if pinned and near and rank_nodes else list(range(len(port_nodes)))


def cap_rails(indices: List[int], rank: int) -> List[int]:
    """capRails(): at most MAX_RAILS, starting at `rank` modulo their count."""
    if len(indices) <= MAX_RAILS:
        return indices
    start = max(rank, 0) % len(indices)
    return [indices[(start + i) % len(indices)] for i in range(MAX_RAILS)]


def parse_cpu_list(text: str) -> set:
    out = set()
    for part in (text or "").split(","):
        lo, _, hi = part.strip().partition("-")
        if lo.isdigit() and (not hi or hi.isdigit()) and int(hi or lo) >= int(lo):
            out.update(range(int(lo), int(hi or lo) + 1))
    return out


def process_numa_nodes(root: Root) -> set:
    """NUMA nodes of the CPUs this process may run on (processNumaNodes())."""
    try:
        cpus = os.sched_getaffinity(0)
    except (AttributeError, OSError):
        return set()
    nodes = set()
    for d in root.listdir("/sys/devices/system/node"):
        if d.startswith("node") and d[4:].isdigit():
            if parse_cpu_list(root.read(f"/sys/devices/system/node/{d}/cpulist") or "") & cpus:
                nodes.add(int(d[4:]))
    return nodes


def choose_ports(ports: List[Port], hca: str = "", gid_index: int = -1, order: Optional[List[str]] = None,
                 rank_nodes: Optional[set] = None, rank: int = 0) -> List[Choice]:
    """The ports (rails) roce would drive, in rail order (chooseVerbsPorts())."""
    usable = usable_ports(ports, hca, gid_index, order)
    if usable[0].port is None:
        return usable
    picked = (nearest_ports([c.port.numa_node for c in usable], rank_nodes or set()) if not hca
              else list(range(len(usable))))
    return [usable[i] for i in cap_rails(picked, rank)]


def choose_port(ports: List[Port], hca: str = "", gid_index: int = -1,
                order: Optional[List[str]] = None) -> Choice:
    """The first rail: the port whose GID the GID rows examine."""
    return usable_ports(ports, hca, gid_index, order)[0]


# ---- MTU --------------------------------------------------------------------

IB_MTUS = (4096, 2048, 1024, 512, 256)


def roce_mtu_for_netdev(netdev_mtu: int) -> int:
    """The RoCE MTU a netdev MTU allows: the largest IB MTU that fits with the
    RoCE v2 headers (GRH/IP, UDP, BTH, extended headers, ICRC ~ 96 bytes; the
    kernel's iboe_get_mtu; rxe reserves a little less)."""
    room = netdev_mtu - 96
    for m in IB_MTUS:
        if room >= m:
            return m
    return 0


# ---- other machine facts -------------------------------------------------------

def netdev_mtu(root: Root, ndev: str) -> Optional[int]:
    v = root.read(f"/sys/class/net/{ndev}/mtu")
    return int(v) if v and v.isdigit() else None


def netdev_ipv4(root: Root, ports: List[Port]) -> Dict[str, List[str]]:
    """netdev -> IPv4 addresses seen in the RoCE GID tables."""
    out: Dict[str, List[str]] = {}
    for p in ports:
        for g in p.gids:
            if g.ndev and g.ipv4 and g.ipv4 not in out.setdefault(g.ndev, []):
                out[g.ndev].append(g.ipv4)
    return out


def rp_filter(root: Root, ndev: str) -> Tuple[Optional[int], Optional[int]]:
    """(net.ipv4.conf.all.rp_filter, net.ipv4.conf.<ndev>.rp_filter); the kernel
    applies the larger of the two."""
    def val(name):
        v = root.read(f"/proc/sys/net/ipv4/conf/{name}/rp_filter")
        return int(v) if v and v.isdigit() else None
    return val("all"), val(ndev)


MEMLOCK_LINE = re.compile(r"^Max locked memory\s+(\S+)\s+(\S+)\s+(\S+)", re.M)
UNLIMITED = -1


def parse_limits(text: str) -> Optional[Tuple[int, int]]:
    """(soft, hard) locked-memory limit in bytes from /proc/<pid>/limits;
    UNLIMITED for 'unlimited'; None if the line is not there."""
    m = MEMLOCK_LINE.search(text or "")
    if not m:
        return None

    def one(v):
        if v == "unlimited":
            return UNLIMITED
        n = int(v)
        return n * 1024 if m.group(3) == "kbytes" else n
    return one(m.group(1)), one(m.group(2))


def memlock_limits(root: Root) -> Optional[Tuple[int, int]]:
    """This process's RLIMIT_MEMLOCK (soft, hard) in bytes, UNLIMITED = no limit."""
    parsed = parse_limits(root.read("/proc/self/limits") or "")
    if parsed is not None or not root.is_real:
        return parsed
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    inf = resource.RLIM_INFINITY
    return (UNLIMITED if soft == inf else soft, UNLIMITED if hard == inf else hard)


CAP_IPC_LOCK = 14


def has_cap_ipc_lock(root: Root) -> Optional[bool]:
    """Whether this process may lock memory beyond RLIMIT_MEMLOCK (the kernel
    does not enforce the limit on RDMA registrations then)."""
    status = root.read("/proc/self/status") or ""
    m = re.search(r"^CapEff:\s*([0-9a-fA-F]+)", status, re.M)
    return bool(int(m.group(1), 16) >> CAP_IPC_LOCK & 1) if m else None


def libibverbs(root: Root) -> Optional[str]:
    """Path of the real libibverbs.so.1.* file (its name carries the rdma-core
    version: libibverbs.so.1.14.44.0 is rdma-core 44.0), or None."""
    for d in LIB_DIRS:
        for name in root.listdir(d):
            if name.startswith("libibverbs.so.1.") and not name.endswith(".debug"):
                return os.path.join("/", d, name)
    return None


def rdma_core_version(lib_path: Optional[str]) -> Optional[str]:
    m = re.search(r"libibverbs\.so\.1\.\d+\.(\d+(?:\.\d+)?)", lib_path or "")
    return m.group(1) if m else None


def loaded_modules(root: Root) -> Dict[str, str]:
    """RDMA kernel modules that are loaded -> their version ('in-tree' without one)."""
    out = {}
    for m in RDMA_MODULES:
        if root.exists(f"/sys/module/{m}"):
            out[m] = root.read(f"/sys/module/{m}/version") or "in-tree"
    return out


def kernel_release(root: Root) -> str:
    return root.read("/proc/sys/kernel/osrelease") or "?"


def kernel_has_rdma(root: Root, release: str) -> Optional[bool]:
    """Whether this kernel can do RDMA at all: ib_core loaded or built in, or
    shipped as a module. None when it cannot be told."""
    if root.exists("/sys/module/ib_core") or root.exists("/sys/class/infiniband"):
        return True
    mod_dir = f"/lib/modules/{release}"
    if root.exists(mod_dir):
        return root.exists(f"{mod_dir}/kernel/drivers/infiniband")
    config = root.read(f"/boot/config-{release}")
    if config is not None:
        return bool(re.search(r"^CONFIG_INFINIBAND=[ym]", config, re.M))
    return False if not root.exists("/sys/module") else None


def os_name(root: Root) -> str:
    text = root.read("/etc/os-release") or ""
    m = re.search(r'^PRETTY_NAME="?([^"\n]*)"?', text, re.M)
    return m.group(1) if m else "?"


def uverbs_nodes(root: Root) -> List[str]:
    return [n for n in root.listdir("/dev/infiniband") if n.startswith("uverbs")]


def uverbs_devices(root: Root) -> Dict[str, str]:
    """RDMA device -> its uverbsN character device (from /sys/class/infiniband_verbs)."""
    out = {}
    for u in root.listdir("/sys/class/infiniband_verbs"):
        if u.startswith("uverbs"):
            dev = root.read(f"/sys/class/infiniband_verbs/{u}/ibdev")
            if dev:
                out[dev] = u
    return out
