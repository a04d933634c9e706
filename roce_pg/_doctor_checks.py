"""The checks of one machine: what roce needs from it (rdma-core, kernel
modules, RDMA devices and ports, GIDs, MTU, ROCE_PG_* settings, memlock,
rp_filter), each a Row with the fix. No torch and no extension unless asked
(--import): sysfs and /proc through _doctor_sysfs, libibverbs through
_doctor_verbs."""
import os
import platform
import socket
from typing import Dict, List, Mapping, Optional

from . import _doctor_settings as settings
from . import _doctor_sysfs as sysfs
from ._doctor_gpudirect import check_gpudirect
from ._doctor_rows import FAIL, OK, WARN, Row, fmt_bytes

DEFAULT_SLOTS, DEFAULT_POOL, DEFAULT_SLOT = 8, 16 << 20, 64 << 10
MAX_AUTO_CHANNELS = 4  # Config::channelsAuto's upper bound
SHOW_GIDS = "`show_gids` (Mellanox OFED) or scripts/softroce/show_gids.sh, or `ibv_devinfo -v`"


class Machine:
    """The facts about one machine that the checks look at."""

    def __init__(self, root: str = "/", env: Optional[Mapping[str, str]] = None, verbs: bool = True):
        self.root = sysfs.Root(root)
        self.env = dict(os.environ if env is None else env)
        self.release = sysfs.kernel_release(self.root)
        self.ports = sysfs.read_ports(self.root)
        self.verbs, self.verbs_error = None, "not asked"
        if verbs and self.root.is_real:
            from . import _doctor_verbs

            numbers: Dict[str, List[int]] = {}
            for p in self.ports:
                numbers.setdefault(p.device, []).append(p.port)
            self.verbs, self.verbs_error = _doctor_verbs.probe(numbers)
            for p in self.ports:
                v = (self.verbs or {}).get("ports", {}).get((p.device, p.port))
                if v:
                    p.active_mtu, p.max_mtu, p.max_msg_sz = v["active_mtu"], v["max_mtu"], v["max_msg_sz"]

    def get(self, name: str) -> str:
        return (self.env.get(name) or "").strip()

    def netdev(self, port: sysfs.Port) -> Optional[str]:
        nd = port.netdevs()
        if nd:
            return nd[0]
        parent = self.root.read(f"/sys/class/infiniband/{port.device}/parent")
        if parent:
            return parent
        net = self.root.listdir(f"/sys/class/infiniband/{port.device}/device/net")
        return net[0] if net else None

    def gid_index_setting(self):
        """(index, error): -1 = auto."""
        v = self.get("ROCE_PG_IB_GID_INDEX")
        if not v:
            return -1, None
        _, lo, hi, _ = settings.SETTINGS["ROCE_PG_IB_GID_INDEX"]
        try:
            return settings.parse_env_int(v, lo, hi), None
        except ValueError as e:
            return -1, f"ROCE_PG_IB_GID_INDEX={e}"

    def rails(self) -> List[sysfs.Choice]:
        """Every port this process would drive (a one-element list with port None if none)."""
        idx, _ = self.gid_index_setting()
        return sysfs.choose_ports(self.ports, self.get("ROCE_PG_IB_HCA"), idx, (self.verbs or {}).get("order"),
                                  sysfs.process_numa_nodes(self.root))

    def choice(self) -> sysfs.Choice:
        idx, _ = self.gid_index_setting()
        return sysfs.choose_port(self.ports, self.get("ROCE_PG_IB_HCA"), idx,
                                 (self.verbs or {}).get("order"))

    def _setting(self, name, default):
        """An integer setting's value, `default` where unset or invalid (the
        settings row reports those)."""
        value = self.env.get(name)
        _, lo, hi, _ = settings.SETTINGS[name]
        try:
            return settings.parse_env_int(value, lo, hi) if value else default
        except ValueError:
            return default

    def registered_bytes(self, peers: int, rails: int = 1, routed: Optional[int] = None) -> int:
        """Bytes the verbs transport registers per rank once connected to `peers`
        peers in a group reaching `routed` peers over verbs (default `peers`):
        the landing pool (a peer holds at most ROCE_PG_IB_SLOTS slots, so at
        most 2 x slots x (routed + 1) of them, ROCE_PG_IB_POOL_BYTES at most,
        of which one per peer, 1 to 64, is reserved for the group: at least
        that plus 2),
        the staging pool (slots x routed, a quarter of the pool at most) and
        each connected peer's control rings. Mirrors verbsRegisteredBytes in
        csrc/transport/verbs/verbs_connect.cpp (tests/test_doctor.py checks that
        they agree); with ROCE_PG_NCHANNELS unset it assumes the most channels
        (4 queue pairs per peer), since auto depends on the job's layout. With
        `rails` ports everything is registered once per port."""
        pool = self._setting("ROCE_PG_IB_POOL_BYTES", DEFAULT_POOL)
        slot = self._setting("ROCE_PG_IB_SLOT_BYTES", DEFAULT_SLOT)
        cap = self._setting("ROCE_PG_IB_SLOTS", DEFAULT_SLOTS)
        qps = max(self._setting("ROCE_PG_IB_QPS_PER_CONNECTION", 1),
                  self._setting("ROCE_PG_NCHANNELS", 0) or MAX_AUTO_CHANNELS, rails)  # 0: auto
        routed = peers if routed is None or routed < 0 else routed  # as the extension: -1 means `peers`
        stride = (64 + slot + 63) & ~63
        page = lambda n: (n + 4095) & ~4095  # noqa: E731
        reserved = min(max(routed, 1), 64)
        landing = page(max(min(pool // stride, 2 * cap * (routed + 1)), reserved + 2) * stride)
        staging = page(min(max(pool // 4, 2 * stride) // stride, max(2, routed * cap)) * stride)
        per_peer = qps * ((cap + 32 + 4) + max(128, 2 * cap + 64)) * 64
        return rails * (landing + staging + peers * per_peer)


def check_host(m: Machine) -> Row:
    torch_v = _installed_version("torch")
    host = m.root.read("/proc/sys/kernel/hostname") or socket.gethostname()
    return Row("host", OK, f"{host}; {sysfs.os_name(m.root)}; kernel {m.release}; {platform.machine()}; "
                           f"Python {platform.python_version()}; torch {torch_v or 'not installed'}")


def _installed_version(dist: str) -> Optional[str]:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:  # noqa: BLE001 - not installed, or broken metadata
        return None


def check_build(torch_version: Optional[str] = None) -> Row:
    """Which torch the extension was built for, against the installed one (read
    from the .so and from package metadata: nothing is imported)."""
    import roce_pg

    fix_rebuild = ("rebuild against the installed torch: `pip install --no-build-isolation .` in the roce "
                   "source tree (`bash scripts/setup.sh` in a checkout)")
    path = roce_pg._extension_path()
    if path is None:
        return Row("roce_pg build", FAIL, f"roce_pg._C is not built ({os.path.dirname(roce_pg.__file__)})",
                   fix_rebuild.replace("rebuild against", "build against"))
    info = roce_pg.build_info(path)
    torch_version = torch_version or _installed_version("torch")
    if not torch_version:
        return Row("roce_pg build", FAIL, f"torch is not installed (roce_pg was built for "
                                          f"torch {info.get('torch', '?')})",
                   f"pip install 'torch=={info.get('torch', '').split('+')[0] or '<version>'}'")
    if not info:
        return Row("roce_pg build", WARN, f"{os.path.basename(path)} was built before builds recorded their "
                                          f"torch version; installed torch {torch_version}",
                   fix_rebuild + " (then this check can tell)")
    extra = f"; sanitizers: {info['sanitize']}" if info.get("sanitize") else ""
    problem = roce_pg._torch_mismatch(info.get("torch"), torch_version)
    if problem:
        return Row("roce_pg build", FAIL, f"built for torch {info.get('torch')}, installed torch {torch_version}"
                                          f": `import roce_pg` refuses to load it{extra}",
                   f"pip install 'torch=={info['torch'].split('+')[0]}', or " + fix_rebuild)
    return Row("roce_pg build", OK, f"roce_pg {roce_pg.__version__} built for torch {info.get('torch')} "
                                    f"(Python {info.get('python', '?')}); installed torch {torch_version}{extra}")


def check_import() -> Row:
    """Loads torch and the extension (seconds on real machines, minutes in an
    emulated VM), then compares what the extension's libibverbs sees."""
    import roce_pg

    try:
        roce_pg._load_extension()
        roce_pg.register()
    except Exception as e:  # noqa: BLE001 - reported, with the message's own fix
        return Row("roce_pg import", FAIL, f"{type(e).__name__}: {e}",
                   "see the message; `python -m roce_pg.doctor` without --import shows the build row")
    ports = roce_pg.rdma_ports()
    seen = ", ".join(f"{p['device']}:{p['port']} {p['state']} {p['link_layer']} MTU {p['active_mtu']}"
                     for p in ports) or "no RDMA ports"
    return Row("roce_pg import", OK, f"torch and roce_pg._C load; the extension sees: {seen}")


def check_rdma_core(m: Machine) -> Row:
    lib = sysfs.libibverbs(m.root)
    fix = ("install rdma-core's userspace: Debian/Ubuntu `apt install rdma-core ibverbs-providers libibverbs1` "
           "(`libibverbs-dev` to build roce); RHEL/Fedora `dnf install rdma-core libibverbs`")
    if lib is None:
        return Row("rdma-core", FAIL, "libibverbs.so.1 not found (roce_pg._C links it: it will not load)", fix)
    version = sysfs.rdma_core_version(lib)
    drivers = [n[:-len(".driver")] for n in m.root.listdir("/etc/libibverbs.d") if n.endswith(".driver")]
    detail = f"libibverbs {lib} (rdma-core {version or '?'}); {len(drivers)} provider(s) configured in " \
             f"/etc/libibverbs.d"
    try:
        major = int((version or "0").split(".")[0])
    except ValueError:
        major = 0
    if 0 < major < 32 and major < 1000:   # vendor builds (MLNX_OFED) carry big numbers
        return Row("rdma-core", WARN, detail + ": older than 32 (no ibv_query_gid_ex, which roce uses)",
                   "upgrade rdma-core to >= 32")
    return Row("rdma-core", OK, detail)


def check_kernel(m: Machine) -> Row:
    mods = sysfs.loaded_modules(m.root)
    listed = ", ".join(f"{k} ({v})" for k, v in mods.items()) or "none"
    detail = f"kernel {m.release}; RDMA modules loaded: {listed}"
    if m.ports and "ib_uverbs" not in mods and not m.root.exists("/sys/class/infiniband_verbs"):
        return Row("kernel modules", FAIL, detail + ": ib_uverbs is missing, so userspace cannot open the devices",
                   "modprobe ib_uverbs (make it permanent in /etc/modules-load.d/rdma.conf)")
    if not mods and not m.ports:
        has = sysfs.kernel_has_rdma(m.root, m.release)
        if has is False:
            detail += "; this kernel has no RDMA (InfiniBand) support"
        return Row("kernel modules", WARN, detail, "see 'RDMA devices'")
    return Row("kernel modules", OK, detail)


def check_devices(m: Machine) -> Row:
    if m.ports:
        devs = sorted({p.device for p in m.ports}, key=sysfs.natural_key)
        return Row("RDMA devices", OK, f"{len(devs)} in /sys/class/infiniband: {', '.join(devs)}")
    no_kernel = sysfs.kernel_has_rdma(m.root, m.release) is False
    detail = "no RDMA device (/sys/class/infiniband is empty or missing)"
    if no_kernel:
        detail += f"; kernel {m.release} has no RDMA support (no ib_core, no drivers/infiniband modules)"
    fix = ("load the RDMA driver of the NIC (mlx5_ib, bnxt_re, irdma, erdma, ...; "
           "`rdma link` / `ibv_devices` must list it"
           + ("; this needs a kernel built with CONFIG_INFINIBAND" if no_kernel else "") +
           "). To try roce's verbs path without RDMA hardware: Soft-RoCE, `modprobe rdma_rxe && "
           "rdma link add rxe0 type rxe netdev <eth>` (scripts/softroce/ does it in a VM). Without RDMA, "
           "roce still runs: shared memory on one machine, and ROCE_PG_NET_TRANSPORT=tcp between machines")
    return Row("RDMA devices", FAIL, detail, fix)


def check_verbs_devices(m: Machine) -> Optional[Row]:
    if not m.ports or not m.root.is_real:
        return None
    if m.verbs is None:
        return Row("libibverbs devices", FAIL, f"libibverbs not usable: {m.verbs_error}",
                   "apt install rdma-core ibverbs-providers libibverbs1")
    sys_devs = sorted({p.device for p in m.ports})
    missing = [d for d in sys_devs if d not in m.verbs["order"]]
    detail = f"libibverbs lists: {', '.join(m.verbs['order']) or 'nothing'}"
    if missing:
        return Row("libibverbs devices", FAIL, detail + f"; missing (no userspace provider): {', '.join(missing)}",
                   "install the provider for the NIC: `apt install ibverbs-providers` (rdma-core), or the "
                   "vendor's (e.g. MLNX_OFED, Broadcom/Alibaba packages); /etc/libibverbs.d lists providers")
    if m.verbs["open_errors"]:
        errs = "; ".join(f"{d}: {e}" for d, e in m.verbs["open_errors"].items())
        return Row("libibverbs devices", FAIL, detail + f"; cannot open: {errs}",
                   "give the user read/write access to /dev/infiniband/uverbs* (rdma group / udev rule); "
                   "in containers pass --device=/dev/infiniband")
    return Row("libibverbs devices", OK, detail)


def check_uverbs(m: Machine) -> Optional[Row]:
    if not m.ports:
        return None
    wanted = sysfs.uverbs_devices(m.root)
    nodes = sysfs.uverbs_nodes(m.root)
    missing = [f"{dev} ({u})" for dev, u in wanted.items() if u not in nodes]
    if not nodes or missing:
        return Row("/dev/infiniband", FAIL,
                   f"character devices missing: {', '.join(missing) or 'no /dev/infiniband/uverbs*'}",
                   "modprobe ib_uverbs; in containers pass --device=/dev/infiniband (or run --privileged)")
    if m.root.is_real:
        denied = [n for n in nodes if not os.access(m.root.path(f"/dev/infiniband/{n}"), os.R_OK | os.W_OK)]
        if denied:
            return Row("/dev/infiniband", FAIL, f"no read/write access to {', '.join(denied)} for uid {os.getuid()}",
                       "add the user to the group owning /dev/infiniband/uverbs* (often 'rdma') or add a "
                       "udev rule (MODE=\"0666\")")
    return Row("/dev/infiniband", OK, ", ".join(nodes))


def check_port(m: Machine, p: sysfs.Port) -> Row:
    in_use = len(p.gids)
    detail = (f"{p.state}, {p.phys_state}, {p.link_layer}" + (f", {p.rate}" if p.rate else "") +
              (f", GID table {p.gid_tbl_len} entries ({in_use} in use)" if p.ethernet else "") +
              (f", max_msg_sz {fmt_bytes(p.max_msg_sz)}" if p.max_msg_sz else ""))
    if p.active:
        return Row(f"port {p.name}", OK, detail)
    nd = m.netdev(p)
    return Row(f"port {p.name}", WARN, detail + " (roce skips ports that are not ACTIVE)",
               f"bring the link up: cable/switch port, `ip link set {nd or '<netdev>'} up` for RoCE "
               f"(`ibv_devinfo` must show PORT_ACTIVE); or leave it out with ROCE_PG_IB_HCA")


def check_gids(m: Machine, p: sysfs.Port) -> Optional[Row]:
    if not p.ethernet:
        return None
    shown = [f"{g.index}: {g.kind()}" for g in p.gids[:16]]
    if len(p.gids) > 16:
        shown.append(f"... {len(p.gids) - 16} more")
    detail = "; ".join(shown) or "none (all entries are zero)"
    if not any(g.v2 and g.ipv4 for g in p.gids):
        nd = m.netdev(p) or "<netdev>"
        return Row(f"GIDs {p.name}", WARN if p.gids else FAIL,
                   detail + "; no RoCE v2 GID with an IPv4 address",
                   f"give {nd} an IPv4 address (`ip addr add <addr>/<prefix> dev {nd}`): that creates the "
                   f"RoCE v2 GID peers reach; if only RoCE v1 GIDs appear, enable RoCE v2 on the NIC")
    return Row(f"GIDs {p.name}", OK, detail)


def check_mtu(m: Machine, p: sysfs.Port) -> Optional[Row]:
    if not p.active:
        return None
    if not p.ethernet:
        if p.active_mtu and p.max_mtu and p.active_mtu < p.max_mtu:
            return Row(f"MTU {p.name}", WARN, f"active_mtu {p.active_mtu} < max_mtu {p.max_mtu} (InfiniBand)",
                       "raise the subnet manager's MTU for the partition (opensm: mtu in partitions.conf)")
        return Row(f"MTU {p.name}", OK, f"active_mtu {p.active_mtu or '?'} (InfiniBand)")
    nd = m.netdev(p)
    nmtu = sysfs.netdev_mtu(m.root, nd) if nd else None
    allowed = sysfs.roce_mtu_for_netdev(nmtu) if nmtu else None
    active = f"active_mtu {p.active_mtu}" if p.active_mtu else "active_mtu unknown (libibverbs not asked)"
    detail = f"{active}; netdev {nd or '?'} MTU {nmtu or '?'}" + (f" allows {allowed}" if allowed else "")
    jumbo = "" if (allowed or 0) >= 4096 else "; jumbo frames (MTU >= 4200 on the NIC and every switch port) " \
                                              "give 4096-byte RoCE packets"
    if p.active_mtu and allowed and p.active_mtu < allowed:
        return Row(f"MTU {p.name}", WARN, detail + ": the port runs a smaller MTU than its netdev allows",
                   "check the NIC's RoCE MTU setting (firmware / driver configuration); roce uses the smaller "
                   "active_mtu of the two ends")
    if allowed == 0:
        return Row(f"MTU {p.name}", FAIL, detail + ": too small for RoCE",
                   f"ip link set {nd} mtu 1500 (or larger)")
    return Row(f"MTU {p.name}", OK, detail + jumbo)


def check_choice(m: Machine) -> Optional[Row]:
    if not m.ports:
        return None
    c = m.choice()
    if c.port is None:
        hca = m.get("ROCE_PG_IB_HCA")
        active = [p for p in m.ports if p.active]
        idx, _ = m.gid_index_setting()
        if not active:
            fix = "bring a port up (see the port rows)"
        elif hca and not any(sysfs.HcaFilter(hca).accepts(p.device, p.port) for p in active):
            fix = f"ROCE_PG_IB_HCA={hca} matches none of the ACTIVE ports ({', '.join(p.name for p in active)}): " \
                  f"correct or unset it"
        elif idx >= 0:
            fix = f"ROCE_PG_IB_GID_INDEX={idx} is outside the GID tables " \
                  f"({', '.join(f'{p.name}: {p.gid_tbl_len}' for p in active)} entries): unset it"
        else:
            fix = "give the RoCE netdev an IPv4 address (see the GID rows)"
        return Row("roce will use", FAIL, f"{c.why}; ports seen: {c.seen}", fix)
    rails = m.rails()
    names = ", ".join(r.port.name + (f" (NUMA {r.port.numa_node})" if r.port.numa_node >= 0 else "") for r in rails)
    how = ("every ACTIVE port matching ROCE_PG_IB_HCA" if m.get("ROCE_PG_IB_HCA") else
           "every ACTIVE port near this process's CPUs (NUMA nodes "
           f"{sorted(sysfs.process_numa_nodes(m.root)) or 'unknown'})")
    if not c.port.ethernet:
        return Row("roce will use", OK, f"{names} ({how}; {c.why})")
    return Row("roce will use", OK, f"{names} ({how}, at most {sysfs.MAX_RAILS}; ports seen: {c.seen})")


def check_gid_index(m: Machine) -> Optional[Row]:
    """The GID index roce would pick and why; ROCE_PG_IB_GID_INDEX validity."""
    if not m.ports:
        return None
    idx, err = m.gid_index_setting()
    if err:
        return Row("GID index", FAIL, f"{err}: creating a process group fails",
                   "unset ROCE_PG_IB_GID_INDEX (auto) or set it to an index from the GID rows")
    c = m.choice()
    if c.port is None:
        return None
    if not c.port.ethernet:
        return Row("GID index", OK, "InfiniBand: LID addressing, the GID index is not used")
    p = c.port
    auto, auto_why = sysfs.auto_gid(p)
    auto_text = f"index {auto.index}: {auto.kind()}" if auto else "none"
    unset_fix = (f"unset ROCE_PG_IB_GID_INDEX (auto picks {auto_text}), or set it to {auto.index}; "
                 f"list the table with {SHOW_GIDS}" if auto else
                 f"unset ROCE_PG_IB_GID_INDEX; list the table with {SHOW_GIDS}")
    if idx < 0:
        if auto is None:
            return Row("GID index", FAIL, f"{p.name}: no non-zero GID", "see the GID rows")
        status = OK if auto.v2 and auto.ipv4 else WARN
        return Row("GID index", status, f"{p.name} index {auto.index}: {auto.kind()}; auto: {auto_why}",
                   "" if status == OK else "give the netdev an IPv4 address so a RoCE v2 IPv4 GID exists, or set "
                                           "ROCE_PG_IB_GID_INDEX on every rank to the same kind of GID")
    g = c.gid
    where = f"ROCE_PG_IB_GID_INDEX={idx} on {p.name}"
    if g is None:
        used = ", ".join(str(x.index) for x in p.gids) or "none"
        return Row("GID index", FAIL, f"{where} is an empty entry of the GID table (entries in use: {used}): "
                                      f"queue pairs cannot connect (RTR fails or transport retry counter exceeded)",
                   unset_fix)
    if g.v1:
        return Row("GID index", FAIL, f"{where}: {g.kind()}: RoCE v1 is not routable and does not talk to "
                                      f"the RoCE v2 GIDs other ranks pick (transport retry counter exceeded)",
                   unset_fix)
    if not g.v2:
        return Row("GID index", WARN, f"{where}: {g.kind()}: not a RoCE v2 GID", unset_fix)
    if not g.ipv4 and auto is not None and auto.ipv4:
        return Row("GID index", WARN, f"{where}: {g.kind()}, not IPv4-mapped while auto would pick {auto_text}: "
                                      f"every rank must use the same kind of GID"
                                      + ("; link-local GIDs reach only the same L2 segment" if g.link_local else ""),
                   unset_fix + " (or set the same kind on every rank)")
    same = auto is not None and auto.index == g.index
    return Row("GID index", OK, f"{where}: {g.kind()}" + (" (= the auto choice)" if same else
                                                            f" (auto would pick {auto_text})"))


def check_hca(m: Machine) -> Optional[Row]:
    hca = m.get("ROCE_PG_IB_HCA")
    if not hca:
        return Row("ROCE_PG_IB_HCA", OK, "unset: every device is considered")
    f = sysfs.HcaFilter(hca)
    matching = [p.name for p in m.ports if f.accepts(p.device, p.port)]
    active = [p.name for p in m.ports if f.accepts(p.device, p.port) and p.active]
    names = ", ".join(p.name for p in m.ports) or "none"
    if f.problems:
        return Row("ROCE_PG_IB_HCA", WARN, f"{hca}: {'; '.join(f.problems)}; matches {matching or 'nothing'}",
                   "use NCCL syntax: dev[:port][,dev[:port]], '=' for exact names, '^' to exclude")
    if not active:
        return Row("ROCE_PG_IB_HCA", FAIL, f"{hca} matches no ACTIVE port (matches: {', '.join(matching) or 'none'}; "
                                           f"ports here: {names})",
                   f"set it to an ACTIVE device here ({', '.join(p.name for p in m.ports if p.active) or 'none'}),"
                   f" or unset it")
    return Row("ROCE_PG_IB_HCA", OK, f"{hca} matches {', '.join(matching)} (ACTIVE: {', '.join(active)})")


def check_settings(m: Machine, forms: Optional[dict] = None) -> Row:
    """Every ROCE_PG_* variable the extension reads, validated as it does
    (`forms`: the extension's table where it is loaded; _doctor_settings)."""
    shown, bad = settings.check(m.env, forms, skip=("ROCE_PG_IB_HCA",))  # ROCE_PG_IB_HCA has its own row
    if bad:
        return Row("ROCE_PG_* settings", FAIL, "invalid: " + "; ".join(bad) + ": creating a process group fails",
                   "fix or unset them (README, Configuration)")
    return Row("ROCE_PG_* settings", OK, ", ".join(shown) if shown else "defaults")


def check_memlock(m: Machine, remote_peers: Optional[int] = None) -> Row:
    limits = sysfs.memlock_limits(m.root)
    if limits is None:
        return Row("memlock", WARN, "cannot read the locked-memory limit", "")
    soft, hard = limits
    peers = max(1, remote_peers or 1)
    rails = len([c for c in m.rails() if c.port is not None]) or 1 if m.ports else 1
    transport = m.registered_bytes(peers, rails)
    how = (f"RDMA registers {fmt_bytes(transport)} per rank with {peers} connected peer{'s' if peers > 1 else ''} "
           f"(landing and staging pools that grow with the peers up to ROCE_PG_IB_POOL_BYTES + a quarter of it, "
           f"and {fmt_bytes(m.registered_bytes(1, routed=0) - m.registered_bytes(0, routed=0))} of control "
           f"rings per peer"
           f"{f', on each of {rails} ports' if rails > 1 else ''}), and zero-copy registrations take up to half "
           f"of the limit")
    if soft == sysfs.UNLIMITED:
        return Row("memlock", OK, f"ulimit -l unlimited; {how}")
    need = transport + min(1 << 30, soft // 2)  # the zero-copy cache sizes itself to half the limit
    detail = f"ulimit -l {soft >> 10} (soft {fmt_bytes(soft)}, hard {fmt_bytes(hard)}); {how}"
    if soft >= need:
        return Row("memlock", OK, detail)
    if hard == sysfs.UNLIMITED or hard >= 2 * transport:
        fix = (f"`ulimit -l unlimited` (the hard limit, {fmt_bytes(hard)}, allows it) in the shell or launcher "
               f"that starts the job; containers: docker run --ulimit memlock=-1; systemd: LimitMEMLOCK=infinity")
    else:
        fix = ("raise the hard limit: /etc/security/limits.d/rdma.conf with `* soft memlock unlimited` and "
               "`* hard memlock unlimited` (then log in again); containers: docker run --ulimit memlock=-1; "
               "systemd: LimitMEMLOCK=infinity; or lower ROCE_PG_IB_POOL_BYTES")
    short = (f"too small for {peers} connected peer{'s' if peers > 1 else ''} ({fmt_bytes(transport)} + the zero-copy "
             f"cache): ibv_reg_mr / ibv_create_cq fail with ENOMEM")
    if sysfs.has_cap_ipc_lock(m.root):
        return Row("memlock", WARN, detail + f": {short} for any user or container without CAP_IPC_LOCK "
                                             f"(this process has it, so the kernel does not enforce the limit here)",
                   fix)
    return Row("memlock", FAIL, detail + ": " + short, fix)


def check_rp_filter(m: Machine) -> Optional[Row]:
    ndevs = sysfs.netdev_ipv4(m.root, m.ports)
    if not ndevs:
        return None
    parts, strict = [], []
    for nd in ndevs:
        a, d = sysfs.rp_filter(m.root, nd)
        eff = max(x for x in (a, d, 0) if x is not None)
        parts.append(f"{nd}: {eff} ({ {0: 'off', 1: 'strict', 2: 'loose'}.get(eff, '?') }; all={a}, {nd}={d})")
        if eff == 1:
            strict.append(nd)
    detail = "; ".join(parts)
    if strict and len(ndevs) > 1:
        return Row("rp_filter", WARN, detail + ": strict reverse-path filtering with several RoCE interfaces "
                                               "drops traffic that arrives on the 'other' interface",
                   "sysctl -w net.ipv4.conf.all.rp_filter=2 " +
                   " ".join(f"net.ipv4.conf.{nd}.rp_filter=2" for nd in strict) +
                   " (loose; persist in /etc/sysctl.d)")
    return Row("rp_filter", OK, detail + ("; strict is fine with one RoCE interface" if strict else ""))


def local_checks(root: str = "/", env: Optional[Mapping[str, str]] = None, verbs: bool = True,
                 import_extension: bool = False, remote_peers: Optional[int] = None) -> List[Row]:
    """Every check of this machine, in display order."""
    m = Machine(root, env, verbs)
    rows: List[Optional[Row]] = [check_host(m), check_build()]
    if import_extension:
        rows.append(check_import())
    rows += [check_rdma_core(m), check_kernel(m), check_devices(m), check_verbs_devices(m), check_uverbs(m)]
    for p in m.ports:
        rows += [check_port(m, p), check_gids(m, p), check_mtu(m, p)]
    rows += [check_choice(m), check_gid_index(m), check_hca(m), check_settings(m, settings.table()),
             check_memlock(m, remote_peers), check_rp_filter(m)]
    choice = m.choice()
    rows.append(check_gpudirect(m, choice.port.device if choice.port else None))
    return [r for r in rows if r is not None]


def chosen_port_facts(root: str = "/", env: Optional[Mapping[str, str]] = None) -> dict:
    """What the multi-machine checks compare across machines."""
    m = Machine(root, env, verbs=True)
    c = m.choice()
    if c.port is None:
        return {}
    return {"port": c.port.name, "ethernet": c.port.ethernet, "active_mtu": c.port.active_mtu,
            "gid_index": c.gid_index, "gid": c.gid.raw if c.gid else None,
            "gid_kind": ("ipv4" if c.gid.ipv4 else "link-local" if c.gid.link_local else "ipv6")
            if c.gid else None, "gid_v2": bool(c.gid and c.gid.v2),
            "software": c.port.device.startswith(("rxe", "siw"))}
