"""Runs inside the one Soft-RoCE VM (started by guest_one_vm.py beside the
verbs suite): `python -m roce_pg.doctor` several ways in the same boot. The
doctor imports no torch on one machine, so each run costs a Python start-up
(seconds under emulation), not a torch import (minutes). This script imports
nothing from roce_pg either.

    python tests/softroce/guest_doctor.py OUTDIR

Writes OUTDIR/<case>.json (the doctor's --json), OUTDIR/<case>.txt (its table)
and OUTDIR/summary.json (exit code and seconds per case).
"""
import json
import os
import subprocess
import sys
import time

# (case, extra environment, shell prefix)
CASES = [
    ("default", {}, ""),
    # An index that exists on mlx5 (RoCE v2 + IPv4 there) but is empty on rxe.
    ("gid_index_empty", {"ROCE_PG_IB_GID_INDEX": "3"}, ""),
    # rxe's index 0: RoCE v2, but the IPv6 link-local GID.
    ("gid_index_link_local", {"ROCE_PG_IB_GID_INDEX": "0"}, ""),
    # `ulimit -l 64` as root: CAP_IPC_LOCK makes the kernel ignore it for root.
    ("memlock_64k", {}, "ulimit -l 64 && "),
    # ... and as a process without CAP_IPC_LOCK (a user, a default container).
    ("memlock_64k_no_cap_ipc_lock", {}, "ulimit -l 64 && exec setpriv --inh-caps=-ipc_lock --bounding-set=-ipc_lock -- "),
]


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    summary = {}
    for name, extra, prefix in CASES:
        # Only the case's own settings: the suite beside it runs with ROCE_PG_CHUNK_BYTES etc.
        env = {k: v for k, v in os.environ.items() if not k.startswith("ROCE_PG_")}
        env.update(extra)
        cmd = f'{prefix}"{sys.executable}" -m roce_pg.doctor --json "{out}/{name}.json"'
        t0 = time.time()
        p = subprocess.run(["bash", "-c", cmd], env=env, capture_output=True, text=True, timeout=300)
        seconds = round(time.time() - t0, 1)
        with open(f"{out}/{name}.txt", "w") as f:
            f.write(p.stdout + ("\n---- stderr ----\n" + p.stderr if p.stderr else ""))
        summary[name] = {"exit_code": p.returncode, "seconds": seconds}
        print(f"==== [guest] doctor case {name}: exit {p.returncode}, {seconds} s", flush=True)
        print(p.stdout, p.stderr[-3000:], flush=True)
    with open(f"{out}/summary.json", "w") as f:
        json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
