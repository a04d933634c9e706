"""roce doctor: checks what roce needs from a machine, and from the network
between machines, and says how to fix what is wrong.

    python -m roce_pg.doctor                  # this machine
    python -m roce_pg.doctor --json out.json  # also as JSON ('-' for stdout)
    python -m roce_pg.doctor trace DIR        # a job's flight-recorder dumps: first
                                              # divergence, stragglers, slowest ops
    torchrun --nnodes N --nproc_per_node 1 ... -m roce_pg.doctor
                                              # every machine, plus reachability,
                                              # latency and bandwidth between every
                                              # pair of machines over roce's verbs
                                              # transport, roce's TCP and Gloo

Prints one row per check: CHECK, STATUS (OK / WARN / FAIL), DETAIL, FIX.
Exits 1 if any check FAILs (2 for usage errors), else 0 (--strict: WARN too).

On one machine it imports neither torch nor the extension (so it runs even when
the extension does not load, and in seconds in an emulated VM): it reads sysfs
and /proc, and asks libibverbs through ctypes. --import also loads the
extension (and validates ROCE_PG_* with the extension's own table). --root DIR
examines a copy of a machine's /sys, /proc, /dev, /etc under DIR (tests;
libibverbs is not asked then).

This module is the command line. The checks of one machine are in
_doctor_checks.py (reading the machine through _doctor_sysfs.py and
_doctor_verbs.py, the settings through _doctor_settings.py), the rows and
their table in _doctor_rows.py, the torchrun mode in _doctor_cluster.py.
"""
import argparse
import os
import sys
from typing import Mapping

from ._doctor_checks import Machine, chosen_port_facts, local_checks  # noqa: F401 - the doctor's API
from ._doctor_rows import FAIL, OK, WARN, Row, fmt_bytes, format_table, report, summary, worst  # noqa: F401


def under_torchrun(env: Mapping[str, str]) -> bool:
    return bool(env.get("TORCHELASTIC_RUN_ID") or (env.get("RANK") and env.get("WORLD_SIZE")
                                                   and env.get("MASTER_ADDR")))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python -m roce_pg.doctor", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Under torchrun (several machines) it also measures every pair of "
                                        "machines over roce verbs, roce TCP and Gloo.")
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON to FILE ('-' = stdout)")
    ap.add_argument("--strict", action="store_true", help="exit 1 on WARN too")
    ap.add_argument("--import", dest="import_extension", action="store_true",
                    help="also import torch and roce_pg._C (done anyway under torchrun)")
    ap.add_argument("--root", default="/", help="examine the /sys, /proc, /dev, /etc tree under this directory "
                                                "(a copy of another machine's; tests)")
    ap.add_argument("--no-verbs", action="store_true", help="do not ask libibverbs (sysfs only)")
    ap.add_argument("--local", action="store_true", help="only this machine, even under torchrun")
    g = ap.add_argument_group("between machines (torchrun)")
    g.add_argument("--size", default="8M", help="bandwidth message size (default 8M)")
    g.add_argument("--iters", type=int, default=10, help="bandwidth messages per pair and transport (10)")
    g.add_argument("--lat-iters", type=int, default=100, help="ping-pong round trips for latency (100)")
    g.add_argument("--pair-timeout", type=float, default=60.0, help="seconds per pair test (60)")
    g.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for all ranks (300)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["trace"]:
        from . import _doctor_trace

        return _doctor_trace.main(argv[1:])
    args = parse_args(argv)
    if args.root != "/" and not os.path.isdir(args.root):
        print(f"--root {args.root}: not a directory", file=sys.stderr)
        return 2
    if under_torchrun(os.environ) and not args.local:
        from . import _doctor_cluster

        return _doctor_cluster.run(args)
    rows = local_checks(args.root, None, not args.no_verbs, args.import_extension)
    return report(rows, args.json, args.strict)


if __name__ == "__main__":
    sys.exit(main())
