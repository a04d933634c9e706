"""`python -m roce_pg.doctor` inside the Soft-RoCE VM of tests/test_softroce.py
(real rdma_rxe sysfs and libibverbs; see scripts/softroce/README.md), five ways:
default (every check OK for rxe0, and rxe's answer to dma-buf registration),
ROCE_PG_IB_GID_INDEX set to an empty and to a link-local index, and
`ulimit -l 64` with and without CAP_IPC_LOCK. The doctor imports no torch on
one machine, so it needs no boot of its own: tests/softroce/guest_one_vm.py
runs its cases beside the verbs suite's `import torch` in the one-VM boot,
which is shared with tests/test_softroce.py (the boot runs once per session,
whichever module asks first), and bounds them to 5 minutes.

Fails (never skips) when the VM tooling is missing, unless ROCE_PG_SKIP_SOFTROCE=1.
"""
import json

from tests.test_softroce import _tail, one_vm  # noqa: F401  (the shared one-VM boot)


def _rows(out, case):
    doc = json.loads((out / f"{case}.json").read_text())
    return {r["check"]: r for r in doc["rows"]}, doc


def test_doctor_in_a_softroce_vm(one_vm):
    out = one_vm.out / "doctor"
    log = (out / "log").read_text(errors="replace")[-3000:] if (out / "log").exists() else "(no doctor log)"
    assert (out / "summary.json").exists(), f"no summary; doctor log:\n{log}\nVM {_tail(one_vm.p)}"
    summary = json.loads((out / "summary.json").read_text())
    assert (out / "process.json").exists(), f"the guest never reaped the doctor; doctor log:\n{log}"
    process = json.loads((out / "process.json").read_text())
    seconds = ", ".join(f"{case} {v['seconds']} s" for case, v in summary.items())
    print(f"doctor in the one VM: {seconds}; {process}")

    # Default: everything about rxe0 is OK, exit 0. (The build row may WARN when the
    # extension predates recorded build info; nothing FAILs.)
    rows, doc = _rows(out, "default")
    assert summary["default"]["exit_code"] == 0, doc
    for name in ("rdma-core", "kernel modules", "RDMA devices", "libibverbs devices", "/dev/infiniband",
                 "port rxe0:1", "GIDs rxe0:1", "MTU rxe0:1", "roce will use", "GID index", "ROCE_PG_IB_HCA",
                 "ROCE_PG_* settings", "memlock", "rp_filter"):
        assert rows[name]["status"] == "OK", rows[name]
    assert all(r["status"] == "OK" for c, r in rows.items() if c != "roce_pg build"), doc["rows"]
    assert "rdma_rxe" in rows["kernel modules"]["detail"]
    assert "index 1" in rows["GID index"]["detail"] and "10.99.0.1" in rows["GID index"]["detail"]
    assert "active_mtu 1024" in rows["MTU rxe0:1"]["detail"] and "dummy0 MTU 1500" in rows["MTU rxe0:1"]["detail"]
    assert "unlimited" in rows["memlock"]["detail"]
    # GPUDirect: no GPU here, but the provider's answer to dma-buf registration is asked for real.
    gd = rows["GPUDirect RDMA"]["detail"]
    assert gd.startswith("no NVIDIA GPU") and "rxe0 refuses ibv_reg_dmabuf_mr" in gd and "rdma-core" in gd, gd

    # A GID index that is empty on rxe0: FAIL, with the index to use instead.
    rows, doc = _rows(out, "gid_index_empty")
    assert summary["gid_index_empty"]["exit_code"] == 1
    gid = rows["GID index"]
    assert gid["status"] == "FAIL" and "ROCE_PG_IB_GID_INDEX=3" in gid["detail"] and "empty" in gid["detail"], gid
    assert "unset ROCE_PG_IB_GID_INDEX" in gid["fix"] and "set it to 1" in gid["fix"], gid

    # The link-local RoCE v2 GID: a WARN with the same fix.
    rows, _ = _rows(out, "gid_index_link_local")
    gid = rows["GID index"]
    assert gid["status"] == "WARN" and "link-local" in gid["detail"] and "set it to 1" in gid["fix"], gid

    # ulimit -l 64: root with CAP_IPC_LOCK gets a WARN; without the capability it FAILs.
    rows, _ = _rows(out, "memlock_64k")
    mem = rows["memlock"]
    assert mem["status"] == "WARN" and "ulimit -l 64" in mem["detail"] and "CAP_IPC_LOCK" in mem["detail"], mem
    assert "memlock" in mem["fix"] and "LimitMEMLOCK=infinity" in mem["fix"], mem
    rows, _ = _rows(out, "memlock_64k_no_cap_ipc_lock")
    mem = rows["memlock"]
    assert summary["memlock_64k_no_cap_ipc_lock"]["exit_code"] == 1
    assert mem["status"] == "FAIL" and "ENOMEM" in mem["detail"] and "memlock=-1" in mem["fix"], mem
    assert process["exit_code"] == 0, (process, log)
