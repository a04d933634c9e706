"""What the auto allreduce picks, and the cost model's estimates behind it,
for group shapes that need no machines to try: the worked examples of
docs/ALGORITHMS.md. A table printer, not a benchmark: nothing is measured.

    .venv/bin/python benchmarks/cost_model.py                # the doc's tables
    .venv/bin/python benchmarks/cost_model.py --shape 1000x1 --shape 125x8 --sizes 8,1M
    ROCE_PG_ALGO_NET_GBPS=25 .venv/bin/python benchmarks/cost_model.py   # other constants

--shape MxL: M machines with L ranks each. The ROCE_PG_ALGO_* variables of
the environment apply, as in a group (roce_pg._C._allreduce_plan). Columns:
the model's estimate per candidate in us (hier with the algorithm across
machines it would use), and for comparison what the fixed thresholds that
auto used before the model picked, with the model's estimate of that.
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from tests.support.sizes import parse_size  # noqa: E402

DOC_SHAPES = ["2x1", "6x1", "16x1", "128x1", "1024x1", "2x8", "16x8", "128x8"]
DOC_SIZES = "8,64K,1M,32M"
CANDIDATES = ["rd", "rabenseifner", "ring", "tree", "hier"]


def size_label(n):
    for unit, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if n >= unit and n % unit == 0:
            return f"{n // unit} {name}"
    return f"{n} B"


def fixed_thresholds(machines, per_machine, n):
    """What auto picked before the cost model (the fixed table: rd <= 64 KiB,
    hier from 64 KiB on even machines with the shard's rd / Rabenseifner /
    ring, Rabenseifner below 1 MiB, ring above): (algorithm, across)."""
    def flat(size):
        return "rd" if size <= 64 << 10 else "rabenseifner" if size < 1 << 20 else "ring"
    if n <= 64 << 10:
        return "rd", None
    if machines > 1 and per_machine > 1:
        return "hier", flat(n // per_machine)
    return flat(n), None


def estimate_of(_C, ranks, machines, per_machine, n, algo, across):
    """The model's estimate (us) for a given choice."""
    if across:
        os.environ["ROCE_PG_ALGO_ALLREDUCE_ACROSS"] = across
    try:
        return _C._allreduce_plan(ranks, machines, per_machine, n)["estimates_us"][algo]
    finally:
        os.environ.pop("ROCE_PG_ALGO_ALLREDUCE_ACROSS", None)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", action="append", help="MxL: M machines of L ranks (repeatable)")
    ap.add_argument("--sizes", default=DOC_SIZES, help="bytes per rank, comma-separated (K/M/G suffixes)")
    args = ap.parse_args(argv)
    from roce_pg import _C

    print("| ranks | machines x ranks | bytes | auto picks | " + " | ".join(CANDIDATES) +
          " | fixed thresholds picked | its estimate |")
    print("|---|---|---|---|" + "---|" * len(CANDIDATES) + "---|---|")
    for shape in args.shape or DOC_SHAPES:
        machines, per_machine = (int(x) for x in shape.split("x"))
        ranks = machines * per_machine
        for size in (parse_size(s) for s in args.sizes.split(",")):
            plan = _C._allreduce_plan(ranks, machines, per_machine, size)
            pick = plan["algo"] + (f" ({plan['across']} across)" if plan["across"] else "")
            if plan["decided_by"]:
                pick += f" [{plan['decided_by']}]"
            est = plan["estimates_us"]
            cells = [f"{est[c]:.0f}" if c in est else "-" for c in CANDIDATES]
            best = min(est, key=est.get) if est else None
            cells = [f"**{v}**" if c == best else v for c, v in zip(CANDIDATES, cells)]
            before, before_across = fixed_thresholds(machines, per_machine, size)
            before_us = estimate_of(_C, ranks, machines, per_machine, size, before, before_across)
            before = before + (f" ({before_across} across)" if before_across else "")
            print(f"| {ranks} | {machines} x {per_machine} | {size_label(size)} | {pick} | " + " | ".join(cells) +
                  f" | {before} | {before_us:.0f} |")


if __name__ == "__main__":
    main()
