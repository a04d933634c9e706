"""`python -m roce_pg.doctor` on the host (no RDMA device here), on fake
/sys + /proc trees (GID tables, wrong GID index, low memlock, HCA filter, MTU,
rp_filter), under torchrun with two simulated machines, and the import-time
check of the torch a build was made for. The Soft-RoCE VM run is
tests/test_softroce_doctor.py."""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from roce_pg import _doctor_settings as settings  # noqa: E402
from roce_pg import _doctor_sysfs as sysfs  # noqa: E402
from roce_pg import doctor  # noqa: E402
from roce_pg._doctor_checks import check_settings  # noqa: E402

PY = sys.executable

# GID tables as the kernel shows them (sysfs: 8 groups of 4 hex digits).
LL = "fe80:0000:0000:0000:0268:8aff:fe9b:1c2e"
V4 = "0000:0000:0000:0000:0000:ffff:0a00:0005"     # ::ffff:10.0.0.5
V4B = "0000:0000:0000:0000:0000:ffff:c0a8:0107"    # ::ffff:192.168.1.7
MLX5_TABLE = {0: (LL, "IB/RoCE v1", "eth0"), 1: (LL, "RoCE v2", "eth0"),
              2: (V4, "IB/RoCE v1", "eth0"), 3: (V4, "RoCE v2", "eth0")}
RXE_TABLE = {0: (LL, "RoCE v2", "eth0"), 1: (V4, "RoCE v2", "eth0")}


def _write(path: Path, text: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def make_tree(tmp: Path, devices=None, memlock=("unlimited", "unlimited"), cap_ipc_lock=False,
              netdev_mtu=1500, rp_filter=(0, 0), table_len=8, extra_netdevs=()):
    """A fake machine: /sys/class/infiniband/<dev>/ports/<n>/{state,...,gids,gid_attrs},
    /sys/class/net, /proc/self/{limits,status}, /proc/sys, /dev/infiniband, /etc."""
    devices = {"mlx5_0": {1: ("4: ACTIVE", MLX5_TABLE)}} if devices is None else devices
    for i, (dev, ports) in enumerate(devices.items()):
        for port, (state, table) in ports.items():
            base = tmp / f"sys/class/infiniband/{dev}/ports/{port}"
            _write(base / "state", state + "\n")
            _write(base / "phys_state", "5: LinkUp\n" if "ACTIVE" in state else "3: Disabled\n")
            _write(base / "link_layer", "Ethernet\n")
            _write(base / "rate", "100 Gb/sec (4X EDR)\n")
            for idx in range(table_len):
                raw, typ, ndev = table.get(idx, (sysfs.ZERO_GID, None, None))
                _write(base / f"gids/{idx}", raw + "\n")
                if typ:   # the kernel answers EINVAL for empty entries: no file here
                    _write(base / f"gid_attrs/types/{idx}", typ + "\n")
                    _write(base / f"gid_attrs/ndevs/{idx}", ndev + "\n")
        _write(tmp / f"sys/class/infiniband_verbs/uverbs{i}/ibdev", dev + "\n")
        _write(tmp / f"dev/infiniband/uverbs{i}", "")
    for nd in ("eth0",) + tuple(extra_netdevs):
        _write(tmp / f"sys/class/net/{nd}/mtu", f"{netdev_mtu}\n")
        _write(tmp / f"proc/sys/net/ipv4/conf/{nd}/rp_filter", f"{rp_filter[1]}\n")
    _write(tmp / "proc/sys/net/ipv4/conf/all/rp_filter", f"{rp_filter[0]}\n")
    for mod in ("ib_core", "ib_uverbs", "mlx5_ib"):
        (tmp / f"sys/module/{mod}").mkdir(parents=True, exist_ok=True)
    _write(tmp / "proc/sys/kernel/osrelease", "6.1.0-test-amd64\n")
    _write(tmp / "proc/sys/kernel/hostname", "fakehost\n")
    _write(tmp / "etc/os-release", 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\n')
    _write(tmp / "usr/lib/x86_64-linux-gnu/libibverbs.so.1.14.44.0", "")
    _write(tmp / "proc/self/limits",
           "Limit                     Soft Limit           Hard Limit           Units     \n"
           "Max open files            1024                 1048576              files     \n"
           f"Max locked memory         {memlock[0]:<20} {memlock[1]:<20} bytes     \n")
    cap = (1 << 14) if cap_ipc_lock else 0
    _write(tmp / "proc/self/status", f"Name:\tpython\nCapEff:\t{cap:016x}\n")
    return tmp


def rows_of(tmp, env=None, remote_peers=None):
    return {r.check: r for r in doctor.local_checks(str(tmp), env or {}, verbs=False, remote_peers=remote_peers)}


# ---- sysfs parsing ------------------------------------------------------------

def test_gid_table_parsing(tmp_path):
    make_tree(tmp_path)
    (port,) = sysfs.read_ports(sysfs.Root(str(tmp_path)))
    assert (port.device, port.port, port.state, port.phys_state, port.link_layer) == \
        ("mlx5_0", 1, "ACTIVE", "LinkUp", "Ethernet")
    assert port.gid_tbl_len == 8
    assert [g.index for g in port.gids] == [0, 1, 2, 3]       # zero entries are skipped
    g0, g1, g2, g3 = port.gids
    assert g0.v1 and not g0.v2 and g0.link_local and g0.ipv4 is None
    assert g1.v2 and g1.link_local
    assert g3.v2 and g3.ipv4 == "10.0.0.5" and g3.ndev == "eth0"
    assert "10.0.0.5" in g3.kind() and "RoCE v2" in g3.kind()


def test_auto_gid_matches_the_extensions_choice(tmp_path):
    # mlx5-style table: 3 (RoCE v2, IPv4); rxe-style: 1.
    make_tree(tmp_path / "a")
    (p,) = sysfs.read_ports(sysfs.Root(str(tmp_path / "a")))
    g, why = sysfs.auto_gid(p)
    assert g.index == 3 and "RoCE v2" in why and "IPv4" in why
    make_tree(tmp_path / "b", devices={"rxe0": {1: ("4: ACTIVE", RXE_TABLE)}})
    (p,) = sysfs.read_ports(sysfs.Root(str(tmp_path / "b")))
    assert sysfs.auto_gid(p)[0].index == 1
    # No IPv4 address on the netdev: the first RoCE v2 GID, with a WARN saying so.
    make_tree(tmp_path / "c", devices={"rxe0": {1: ("4: ACTIVE", {0: (LL, "RoCE v2", "eth0")})}})
    rows = rows_of(tmp_path / "c")
    assert rows["GID index"].status == doctor.WARN
    assert rows["GIDs rxe0:1"].status == doctor.WARN and "ip addr add" in rows["GIDs rxe0:1"].fix


def test_healthy_machine_is_all_ok(tmp_path):
    make_tree(tmp_path)
    rows = rows_of(tmp_path)
    for name in ("rdma-core", "kernel modules", "RDMA devices", "/dev/infiniband", "port mlx5_0:1",
                 "GIDs mlx5_0:1", "MTU mlx5_0:1", "roce will use", "GID index", "ROCE_PG_IB_HCA",
                 "ROCE_PG_* settings", "memlock", "rp_filter"):
        assert rows[name].status == doctor.OK, rows[name]
    assert "index 3" in rows["GID index"].detail and "10.0.0.5" in rows["GID index"].detail
    assert "rdma-core 44.0" in rows["rdma-core"].detail


def test_gpudirect_row_gives_each_gpus_path_and_why(tmp_path):
    make_tree(tmp_path)
    row = rows_of(tmp_path)["GPUDirect RDMA"]
    assert row.status == doctor.OK and row.detail.startswith("no NVIDIA GPU: CUDA tensors would be staged"), row
    assert "rdma-core 44.0" in row.detail and "no nvidia_peermem in /proc/modules" in row.detail, row
    for pci, cls in (("0000:17:00.0", "0x030200"), ("0000:65:00.0", "0x030000"), ("0000:18:00.0", "0x068000")):
        _write(tmp_path / f"sys/bus/pci/devices/{pci}/vendor", "0x10de\n")  # the last: an NVIDIA bridge, no GPU
        _write(tmp_path / f"sys/bus/pci/devices/{pci}/class", cls + "\n")
    # No peer-memory module (the driver is not asked in a copied tree): staged, with the fix.
    row = rows_of(tmp_path)["GPUDirect RDMA"]
    assert row.status == doctor.WARN and "modprobe nvidia-peermem" in row.fix, row
    assert "cuda:0 (0000:17:00.0): staged" in row.detail and "cuda:1 (0000:65:00.0): staged" in row.detail, row
    assert "0000:18:00.0" not in row.detail, row
    _write(tmp_path / "proc/modules", "nvidia 1 0 - Live 0x0\nnvidia_peermem 16384 0 - Live 0x0\n")
    row = rows_of(tmp_path)["GPUDirect RDMA"]
    assert row.status == doctor.OK and "cuda:1 (0000:65:00.0): peer memory" in row.detail, row
    assert "nvidia_peermem loaded" in row.detail, row
    assert "ROCE_PG_GPUDIRECT=off: device tensors are staged" in \
        rows_of(tmp_path, env={"ROCE_PG_GPUDIRECT": "off"})["GPUDirect RDMA"].detail
    make_tree(tmp_path / "no_nic", devices={})
    for pci in ("0000:17:00.0",):
        _write(tmp_path / f"no_nic/sys/bus/pci/devices/{pci}/vendor", "0x10de\n")
        _write(tmp_path / f"no_nic/sys/bus/pci/devices/{pci}/class", "0x030200\n")
    assert "1 NVIDIA GPU(s) but no RDMA port" in rows_of(tmp_path / "no_nic")["GPUDirect RDMA"].detail


def test_gpudirect_row_says_whether_nic_writes_are_flushed():
    from roce_pg._doctor_gpudirect import flush_note

    assert flush_note(None) == ""  # the driver was not asked
    assert "flushed after each receive" in flush_note(0)
    assert flush_note(100) == flush_note(200) == "; NIC writes ordered by the GPU"


def test_gpudirect_order_is_the_extensions():
    from roce_pg._doctor_gpudirect import gpu_path

    assert gpu_path(True, True, None) == "dma-buf"
    assert gpu_path(True, False, "nvidia_peermem") == "peer memory"  # the provider refuses dma-bufs (rxe)
    assert gpu_path(False, True, None) == "staged"
    assert gpu_path(None, None, None) == "staged"


@pytest.mark.parametrize("value, status, words", [
    ("2", doctor.FAIL, ["RoCE v1"]),                    # the classic: RoCE v1 index on mlx5
    ("5", doctor.FAIL, ["empty entry", "in use: 0, 1, 2, 3"]),
    ("1", doctor.WARN, ["link-local", "same kind"]),
    ("abc", doctor.FAIL, ["not an integer"]),
    ("3", doctor.OK, ["auto choice"]),
])
def test_wrong_gid_index_is_reported_with_the_fix(tmp_path, value, status, words):
    make_tree(tmp_path)
    row = rows_of(tmp_path, {"ROCE_PG_IB_GID_INDEX": value})["GID index"]
    assert row.status == status, row
    for w in words:
        assert w in row.detail, row
    if status != doctor.OK:
        assert "unset ROCE_PG_IB_GID_INDEX" in row.fix
        if value != "abc":
            assert "set it to 3" in row.fix, row.fix


def test_gid_index_outside_the_table(tmp_path):
    make_tree(tmp_path)
    rows = rows_of(tmp_path, {"ROCE_PG_IB_GID_INDEX": "5000"})
    assert rows["roce will use"].status == doctor.FAIL
    assert "ROCE_PG_IB_GID_INDEX=5000" in rows["roce will use"].fix


def test_hca_filter(tmp_path):
    make_tree(tmp_path, devices={"mlx5_0": {1: ("4: ACTIVE", MLX5_TABLE)},
                                 "mlx5_1": {1: ("1: DOWN", MLX5_TABLE)}})
    assert rows_of(tmp_path, {"ROCE_PG_IB_HCA": "=mlx5_0:1"})["ROCE_PG_IB_HCA"].status == doctor.OK
    rows = rows_of(tmp_path, {"ROCE_PG_IB_HCA": "mlx5_1"})
    assert rows["ROCE_PG_IB_HCA"].status == doctor.FAIL and "mlx5_0:1" in rows["ROCE_PG_IB_HCA"].fix
    assert rows["roce will use"].status == doctor.FAIL
    assert rows["port mlx5_1:1"].status == doctor.WARN
    rows = rows_of(tmp_path, {"ROCE_PG_IB_HCA": "^mlx5_1"})
    assert rows["roce will use"].status == doctor.OK and "mlx5_0:1" in rows["roce will use"].detail
    f = sysfs.HcaFilter("mlx5")           # prefix match, like NCCL
    assert f.accepts("mlx5_0", 1) and f.accepts("mlx5_12", 2) and not f.accepts("rxe0", 1)


# ---- memlock -------------------------------------------------------------------

def test_memlock_parsing():
    text = ("Limit                     Soft Limit           Hard Limit           Units     \n"
            "Max locked memory         8388608              unlimited            bytes     \n")
    assert sysfs.parse_limits(text) == (8 << 20, sysfs.UNLIMITED)
    assert sysfs.parse_limits("Max locked memory  unlimited unlimited bytes") == (sysfs.UNLIMITED,) * 2
    assert sysfs.parse_limits("Max locked memory  64 64 kbytes") == (64 << 10, 64 << 10)
    assert sysfs.parse_limits("nothing here") is None
    # This process, through the real /proc: the same numbers as getrlimit.
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    got = sysfs.memlock_limits(sysfs.Root("/"))
    assert got == (sysfs.UNLIMITED if soft == resource.RLIM_INFINITY else soft,
                   sysfs.UNLIMITED if hard == resource.RLIM_INFINITY else hard)
    assert doctor.fmt_bytes(64 << 10) == "64 KiB" and doctor.fmt_bytes(sysfs.UNLIMITED) == "unlimited"


@pytest.mark.parametrize("soft, hard, cap, status, fix_words", [
    (65536, 65536, False, doctor.FAIL, ["limits.d", "memlock=-1", "LimitMEMLOCK=infinity"]),  # ulimit -l 64
    (65536, "unlimited", False, doctor.FAIL, ["ulimit -l unlimited"]),
    (65536, 65536, True, doctor.WARN, ["limits.d"]),      # root with CAP_IPC_LOCK: not enforced here
    ("unlimited", "unlimited", False, doctor.OK, []),
    (1 << 30, 1 << 30, False, doctor.OK, []),
])
def test_low_memlock_is_reported_with_the_fix(tmp_path, soft, hard, cap, status, fix_words):
    make_tree(tmp_path, memlock=(soft, hard), cap_ipc_lock=cap)
    row = rows_of(tmp_path)["memlock"]
    assert row.status == status, row
    for w in fix_words:
        assert w in row.fix, row.fix
    if status == doctor.WARN:
        assert "CAP_IPC_LOCK" in row.detail


def test_memlock_need_follows_the_pools_and_the_peers(tmp_path):
    # Defaults: pools of 2 x 8 slots per peer up to 16 MiB landing + 4 MiB
    # staging, ~44 KiB of control rings per peer (4 queue pairs), and half
    # the limit for the zero-copy cache.
    make_tree(tmp_path, memlock=(48 << 20, 48 << 20))
    assert rows_of(tmp_path)["memlock"].status == doctor.OK
    assert rows_of(tmp_path, remote_peers=63)["memlock"].status == doctor.OK     # 8 machines x 8: full pools
    assert rows_of(tmp_path, remote_peers=1023)["memlock"].status == doctor.FAIL  # +43 MiB of control rings
    env = {"ROCE_PG_IB_POOL_BYTES": "64M"}
    assert rows_of(tmp_path, env, remote_peers=63)["memlock"].status == doctor.FAIL  # a 64 MiB landing pool
    assert rows_of(tmp_path, env, remote_peers=1)["memlock"].status == doctor.OK     # one peer fills 32 slots
    env = {"ROCE_PG_NCHANNELS": "1"}  # one queue pair per peer: 11 KiB each, 2.7 MiB for 255
    assert rows_of(tmp_path, env, remote_peers=255)["memlock"].status == doctor.OK


def test_memlock_formula_matches_the_transport():
    """The doctor's formula (Python, runs without the extension) and the
    transport's (C++) must not drift apart."""
    from unittest import mock

    import roce_pg

    for env in ({}, {"ROCE_PG_IB_POOL_BYTES": "1M", "ROCE_PG_IB_SLOT_BYTES": "16K", "ROCE_PG_IB_SLOTS": "3"},
                {"ROCE_PG_IB_SLOTS": "64", "ROCE_PG_IB_QPS_PER_CONNECTION": "4"}):
        env = {"ROCE_PG_NCHANNELS": "2", **env}
        machine = doctor.Machine("/", env, verbs=False)
        with mock.patch.dict(os.environ, env):  # the extension reads the process environment
            for peers in (0, 1, 7, 1023):
                assert machine.registered_bytes(peers) == roce_pg._C.verbs_registered_bytes(peers), (env, peers)
                for routed in (0, 3, 15, 1023):  # a group's peers over verbs size its pools
                    assert (machine.registered_bytes(peers, routed=routed)
                            == roce_pg._C.verbs_registered_bytes(peers, routed=routed)), (env, peers, routed)


# ---- other findings -------------------------------------------------------------------

def test_mtu_and_rp_filter(tmp_path):
    assert [sysfs.roce_mtu_for_netdev(m) for m in (1500, 4200, 9000, 1100, 200)] == [1024, 4096, 4096, 512, 0]
    make_tree(tmp_path / "a", netdev_mtu=9000)
    row = rows_of(tmp_path / "a")["MTU mlx5_0:1"]
    assert row.status == doctor.OK and "allows 4096" in row.detail
    # Two RoCE interfaces and strict reverse-path filtering.
    table = dict(MLX5_TABLE)
    table[4] = (V4B, "RoCE v2", "eth1")
    make_tree(tmp_path / "b", devices={"mlx5_0": {1: ("4: ACTIVE", table)}}, rp_filter=(1, 1),
              extra_netdevs=("eth1",))
    row = rows_of(tmp_path / "b")["rp_filter"]
    assert row.status == doctor.WARN and "rp_filter=2" in row.fix
    make_tree(tmp_path / "c", rp_filter=(1, 0))
    assert rows_of(tmp_path / "c")["rp_filter"].status == doctor.OK


def test_settings_are_validated_like_the_extension(tmp_path):
    assert settings.parse_env_int("0x10", 0, 100) == 16
    assert settings.parse_env_int("4M", 0, 1 << 30) == 4 << 20
    assert settings.parse_env_int("010", 0, 100) == 8           # strtoll base 0: octal
    assert settings.parse_env_int("-1", -1, 5) == -1
    for bad in ("9", "1_0", "7 ", "0b1", "08", "0x", "9999999999G"):
        with pytest.raises(ValueError):
            settings.parse_env_int(bad, 0, 7)
    make_tree(tmp_path)
    row = rows_of(tmp_path, {"ROCE_PG_IB_RETRY_CNT": "9", "ROCE_PG_NET_TRANSPORT": "rdma"})["ROCE_PG_* settings"]
    assert row.status == doctor.FAIL and "RETRY_CNT" in row.detail and "ROCE_PG_NET_TRANSPORT" in row.detail


def test_settings_table_is_the_extensions():
    """The doctor's table (it runs without the extension) is what the build
    wrote from the extension: a setting, a name, a range or a declaration
    changed in csrc/common/config.cpp reaches it with the next build."""
    import roce_pg

    ext = roce_pg._C.settings()
    assert list(ext) == list(settings.SETTINGS), "settings added, removed or reordered since the last build"
    for name, form in ext.items():
        assert settings.SETTINGS[name] == form, (name, form, settings.SETTINGS[name])
    assert roce_pg._C.setting_declarations() == settings.DECLARATIONS
    assert settings.table() == ext   # with the extension loaded the doctor uses its table


README_SCOPES = {"own": "rank", "same, compared": "group", "same": "advised", "same on a machine": "machine"}


def test_readme_configuration_table_is_the_declarations():
    """README's configuration table lists every setting the extension reads
    (and ROCE_PG_DEBUG, which the logger reads), each once, with what the
    ranks must agree on as Config::read declares it."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    table = readme[readme.index("## Configuration"):]
    rows = {}
    for line in table.splitlines():
        if not line.startswith("| `ROCE_PG_"):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        for name in re.findall(r"`(ROCE_PG_[A-Z0-9_]+)`", cells[0]):
            assert name not in rows, f"{name} has two rows"
            rows[name] = cells[2]
    # ROCE_PG_DEBUG is the logger's; ROCE_PG_JOB_SECRET is read apart so that its value is never shown.
    outside = {"ROCE_PG_DEBUG", "ROCE_PG_JOB_SECRET"}
    assert set(rows) == set(settings.SETTINGS) | outside, set(rows) ^ set(settings.SETTINGS)
    for name, (_, scope, _) in settings.DECLARATIONS.items():
        assert README_SCOPES.get(rows[name]) == scope, (name, rows[name], scope)
    assert rows["ROCE_PG_DEBUG"] == "own"


def _samples(form):
    """Values around the edges of what a setting accepts."""
    kind = form[0]
    if kind == "int":
        lo, hi = form[1], form[2]
        return [str(lo), str(lo - 1), str(hi), str(hi + 1), "0", "0x10", "010", "08", "4K", " 5", "5 ", "1_0",
                "abc", "99999999999999G"]
    if kind == "number":
        return [repr(form[1]), repr(form[2]), repr(form[2] * 2), "1", "0x1p-3", ".5", "1e", "nan", "inf", "-1", "x"]
    if kind == "choice":
        return list(form[1]) + ["bogus", form[1][0].upper(), form[1][0] + " "]
    if kind == "flag":
        return ["1", "0", "yes", "off", "2", "True"]
    if kind == "token":
        return ["node-1_a", "a b", "x" * form[1], "x" * (form[1] + 1)]
    return ["anything"]


def test_doctor_accepts_exactly_what_the_extension_accepts(tmp_path, monkeypatch):
    """Every setting, at the edges of its range and beyond: the doctor's verdict
    (with its own copy of the table) is the extension's parser's (which raises
    where creating a process group would)."""
    import roce_pg

    disagree = []
    for name, form in settings.SETTINGS.items():
        for value in _samples(form):
            monkeypatch.setenv(name, value)
            try:
                roce_pg._C.verbs_registered_bytes(0)   # parses every ROCE_PG_* variable
                accepted = True
            except RuntimeError:
                accepted = False
            if accepted != (settings.problem(name, value, form) is None):
                disagree.append((name, value, "extension accepts" if accepted else "extension rejects"))
        monkeypatch.delenv(name)
    assert not disagree


def test_every_algorithm_the_extension_accepts_is_ok(tmp_path):
    """The doctor's copy of the settings must not drift from the extension's:
    ROCE_PG_ALGO_ALLREDUCE=tree, which the extension accepts, must not be
    reported as FAIL."""
    make_tree(tmp_path)
    m = doctor.Machine(str(tmp_path), {"ROCE_PG_ALGO_ALLREDUCE": "tree"}, verbs=False)
    for forms in (settings.SETTINGS, settings.table()):   # the copy, and the extension's table
        row = check_settings(m, forms)
        assert row.status == doctor.OK and row.detail == "ROCE_PG_ALGO_ALLREDUCE=tree", row
    for name, form in settings.SETTINGS.items():
        for value in form[1] if form[0] == "choice" else ():
            row = rows_of(tmp_path, {name: value})["ROCE_PG_* settings"]
            assert row.status == doctor.OK, row
    row = rows_of(tmp_path, {"ROCE_PG_ALGO_ALLGATHER": "tree"})["ROCE_PG_* settings"]
    assert row.status == doctor.FAIL and "expected auto, shm, ring, bruck, hier" in row.detail, row


def test_same_everywhere_is_what_joining_a_group_compares():
    """The cluster mode FAILs when ranks differ in a setting that joining a group
    compares (ROCE_PG_NCHANNELS was only a WARN)."""
    import roce_pg
    from roce_pg._doctor_cluster import _agreement_rows

    compared = {kv.split("=")[0] for kv in roce_pg._C.testing.algorithm_settings().split()}
    advised = {name for name, (_, scope, _) in settings.DECLARATIONS.items() if scope == "advised"}
    assert advised == {"ROCE_PG_ALGO", "ROCE_PG_NET_TRANSPORT", "ROCE_PG_IB_SLOT_BYTES",
                       "ROCE_PG_IB_QPS_PER_CONNECTION"}
    assert set(settings.SAME_ON_MACHINE) == {"ROCE_PG_SHM_SLOT_BYTES", "ROCE_PG_SHM_RING_BYTES",
                                             "ROCE_PG_SHM_ONESHOT_MAX_BYTES", "ROCE_PG_SHM_CHUNK_BYTES"}
    assert set(settings.SAME_EVERYWHERE) - compared == advised
    assert compared <= set(settings.SAME_EVERYWHERE)
    for env, status in (({"ROCE_PG_NCHANNELS": "2"}, doctor.FAIL), ({"ROCE_PG_SPIN_US": "5"}, doctor.WARN)):
        infos = [{"rank": 0, "env": env}, {"rank": 1, "env": {}}]
        row = _agreement_rows(infos, {}, {}, [0])[0]
        assert row.status == status, row
    # A shared-memory layout must match on one machine only: machines may differ.
    infos = [{"rank": r, "env": {"ROCE_PG_SHM_CHUNK_BYTES": "64K"} if r < 2 else {}} for r in range(4)]
    for machine_of, status in (((0, 0, 1, 1), doctor.WARN), ((0, 1, 0, 1), doctor.FAIL)):
        by_rank = {r: {"machine": m} for r, m in enumerate(machine_of)}
        row = _agreement_rows(infos, {}, by_rank, [0])[0]
        named = "ROCE_PG_SHM_CHUNK_BYTES must match" in row.fix
        assert row.status == status and named == (status == doctor.FAIL), row


def test_cli_json_and_exit_codes(tmp_path):
    make_tree(tmp_path / "ok")
    out = tmp_path / "ok.json"
    assert doctor.main(["--root", str(tmp_path / "ok"), "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    statuses = {r["check"]: r["status"] for r in doc["rows"]}
    assert statuses["GID index"] == "OK" and set(doc["summary"]) == {"OK", "WARN", "FAIL"}
    assert all(set(r) >= {"check", "status", "detail", "fix"} for r in doc["rows"])
    make_tree(tmp_path / "bad", memlock=(65536, 65536))
    assert doctor.main(["--root", str(tmp_path / "bad"), "--json", str(tmp_path / "bad.json")]) == 1
    text = doctor.format_table([doctor.Row("memlock", "FAIL", "x " * 80, "y " * 80)], width=100)
    assert text.splitlines()[0].split() == ["CHECK", "STATUS", "DETAIL", "FIX"]
    assert all(len(line) <= 100 for line in text.splitlines())


# ---- this host: no RDMA device --------------------------------------------------

def test_host_without_rdma_device_fails_with_the_fix(tmp_path):
    if sysfs.read_ports(sysfs.Root("/")):
        pytest.skip("this host has RDMA devices")
    out = tmp_path / "host.json"
    # -X importtime: the doctor must not import torch on one machine.
    p = subprocess.run([PY, "-X", "importtime", "-m", "roce_pg.doctor", "--json", str(out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    print(p.stdout)
    assert p.returncode == 1, p.stdout + p.stderr
    assert not [line for line in p.stderr.splitlines() if line.rstrip().endswith("| torch")], "imported torch"
    assert "CHECK" in p.stdout and "RDMA devices" in p.stdout and "FAIL" in p.stdout
    rows = {r["check"]: r for r in json.loads(out.read_text())["rows"]}
    dev = rows["RDMA devices"]
    assert dev["status"] == "FAIL" and "no RDMA device" in dev["detail"]
    assert "rdma_rxe" in dev["fix"] and "ROCE_PG_NET_TRANSPORT=tcp" in dev["fix"]
    assert rows["rdma-core"]["status"] == "OK"


def test_doctor_under_torchrun_two_simulated_machines(tmp_path):
    """Two ranks, each its own "machine" (ROCE_PG_SIM_RANKS_PER_NODE=1): no RDMA
    here, so the verbs pair FAILs with the reason and the fix; TCP and Gloo work
    and are measured."""
    if sysfs.read_ports(sysfs.Root("/")):
        pytest.skip("this host has RDMA devices")
    out = tmp_path / "cluster.json"
    env = dict(os.environ, ROCE_PG_SIM_RANKS_PER_NODE="1", OMP_NUM_THREADS="1")
    torchrun = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    p = subprocess.run(torchrun + ["-m", "roce_pg.doctor", "--size", "1M", "--iters", "3", "--lat-iters", "20",
                                   "--pair-timeout", "60", "--json", str(out)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    print(p.stdout[-5000:])
    assert p.returncode != 0
    doc = json.loads(out.read_text())
    rows = {(r["host"], r["check"]): r for r in doc["rows"]}
    assert set(doc["machines"]) == {"node0", "node1"}
    assert rows[("node0", "RDMA devices")]["status"] == "FAIL"
    assert rows[("node1", "RDMA devices")]["status"] == "FAIL"
    verbs = rows[("", "node0 <-> node1 roce verbs")]
    assert verbs["status"] == "FAIL" and "RDMA" in verbs["detail"] and "ROCE_PG_NET_TRANSPORT=tcp" in verbs["fix"]
    for name in ("roce tcp", "gloo"):
        row = rows[("", f"node0 <-> node1 {name}")]
        assert row["status"] == "OK" and "MB/s" in row["detail"] and "latency" in row["detail"], row
    assert rows[("", "same ROCE_PG_* everywhere")]["status"] == "OK"


# ---- the import-time check of the torch a build was made for ----------------------------

def test_torch_mismatch_message():
    import roce_pg

    assert roce_pg._torch_mismatch("2.15.0+cu132", "2.15.0") is None      # local labels do not matter
    assert roce_pg._torch_mismatch(None, "2.15.0") is None
    msg = roce_pg._torch_mismatch("2.14.1+cpu", "2.15.0")
    assert "built for torch 2.14.1+cpu" in msg and "has torch 2.15.0" in msg
    assert "pip install 'torch==2.14.1'" in msg and "--no-build-isolation" in msg


def test_import_of_a_build_for_another_torch_names_the_torch_it_needs(tmp_path):
    """A copy of the package whose _C carries another torch's version: the import
    fails before loading the binary, with the version it needs and the fix."""
    pkg = tmp_path / "roce_pg"
    pkg.mkdir()
    for f in (ROOT / "roce_pg").glob("*.py"):
        shutil.copy(f, pkg)
    import importlib.machinery

    so = pkg / ("_C" + importlib.machinery.EXTENSION_SUFFIXES[0])
    so.write_bytes(b"\x7fELF junk\0ROCE_PG_BUILD_INFO|roce_pg=0.1.0;torch=2.3.1+cu121;python=3.11;sanitize=|\0")
    assert __import__("roce_pg").build_info(str(so))["torch"] == "2.3.1+cu121"
    p = subprocess.run([PY, "-c", "import roce_pg"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(tmp_path)))
    assert p.returncode != 0
    assert "ImportError" in p.stderr and "built for torch 2.3.1+cu121" in p.stderr, p.stderr[-2000:]
    assert "pip install 'torch==2.3.1'" in p.stderr and "--no-build-isolation" in p.stderr
    # The doctor still runs (it does not load the extension) and says the same.
    p = subprocess.run([PY, "-m", "roce_pg.doctor", "--json", "-"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, PYTHONPATH=str(tmp_path)))
    assert "roce_pg build" in p.stdout and "built for torch 2.3.1+cu121" in p.stdout, p.stdout + p.stderr
    assert p.returncode == 1


# --- python -m roce_pg.doctor trace DIR ------------------------------------------


def _entry(seq, op="all_reduce", n=8, created_ns=0, ms=0.1, state="completed", error=None):
    return {"collective_seq_id": seq, "is_p2p": False, "profiling_name": f"roce:{op}", "input_sizes": [[n]],
            "input_dtypes": ["Float"], "time_created_ns": created_ns, "duration_ms": ms, "state": state,
            "algorithm": "ring", "error": error}


def _write_dumps(tmp_path, entries_by_rank, members):
    for rank, entries in entries_by_rank.items():
        dump = {"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": str(members)}},
                "entries": entries}
        (tmp_path / f"roce_trace_{rank}_0.json").write_text(json.dumps(dump))


def _trace_report(tmp_path):
    import io

    from roce_pg import _doctor_trace

    out = io.StringIO()
    code = _doctor_trace.report(str(tmp_path), out=out)
    return code, out.getvalue()


def test_trace_reader_finds_the_first_divergent_collective(tmp_path):
    ok = [_entry(s, created_ns=s * 10**6) for s in (1, 2, 3, 4)]
    odd = ok[:2] + [_entry(3, op="broadcast", created_ns=3 * 10**6), ok[3]]
    _write_dumps(tmp_path, {0: ok, 1: odd, 2: ok}, [0, 1, 2])
    code, text = _trace_report(tmp_path)
    assert code == 1, text
    assert ("first divergence: collective #3 differs: ranks 0, 2 called all_reduce [[8]] Float; "
            "rank 1 called broadcast [[8]] Float") in text, text


def test_trace_reader_names_the_rank_that_stopped_and_the_straggler(tmp_path):
    # Ranks 0 and 1 entered #4 and failed in it; rank 2 stopped after #3, and
    # issued every earlier collective 5 ms after the others.
    def rank_entries(rank):
        lag = 5 * 10**6 if rank == 2 else 0
        es = [_entry(s, created_ns=s * 10**9 + lag) for s in (1, 2, 3)]
        if rank != 2:
            es.append(_entry(4, created_ns=4 * 10**9, ms=None, state="started", error="roce: timed out"))
        return es

    _write_dumps(tmp_path, {r: rank_entries(r) for r in range(3)}, [0, 1, 2, 3])
    code, text = _trace_report(tmp_path)
    assert code == 1, text
    assert "no dump from rank 3" in text, text
    assert ("collective #4 (all_reduce [[8]] Float) was entered by ranks 0, 1 but not by others: rank 2 last "
            "recorded #3 (all_reduce [[8]] Float, completed)") in text, text
    assert "rank 0: #4 failed (rank 1 alike): roce: timed out" in text, text
    assert "rank 2: last in 3 (100%), on average 5.000 ms after the first" in text, text


def test_trace_reader_agreeing_dumps_and_an_empty_directory(tmp_path):
    same = [_entry(s, created_ns=s) for s in (1, 2)]
    _write_dumps(tmp_path, {0: same, 1: same}, [0, 1])
    code, text = _trace_report(tmp_path)
    assert code == 0 and "first divergence: none" in text, text
    empty = tmp_path / "empty"
    empty.mkdir()
    p = subprocess.run([sys.executable, "-m", "roce_pg.doctor", "trace", str(empty)], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2 and "no dumps" in p.stdout, p.stdout + p.stderr
