"""Repeats chosen tests, on a quiet machine and beside a CPU hog, and prints a
pass count per test: a test whose outcome changes between repetitions depends
on timing or scheduling and must be made deterministic (README, "Tests").

    bash scripts/flaky.sh -n 10 tests/test_small_ops.py tests/test_api.py
    bash scripts/flaky.sh -n 3 --modes loaded -- tests/test_faults.py -k abort

Each repetition is one pytest run of everything named (pytest's own
arguments pass through after `--`), so every test runs n times per mode.
`loaded` starts one busy process per core (os.cpu_count()) for the whole
mode, so ranks, progress threads and the test's own waits compete with it
as they do on a CI machine shared with other jobs. Exits 1 if any test did
not pass every repetition it ran in (a skip is reported, never counted as a
pass), 0 otherwise.
"""
import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict

HOG = "while True: pass"


def _outcomes(junit_path):
    """{test id: (outcome, first line of the failure)} from pytest's JUnit XML."""
    out = {}
    try:
        root = ET.parse(junit_path).getroot()
    except (OSError, ET.ParseError) as e:
        return {"<pytest run>": ("error", f"no report: {e}")}
    for case in root.iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        outcome, why = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome = "failed" if tag != "skipped" else "skipped"
                why = (el.get("message") or el.text or "").strip().splitlines()[:1]
                why = why[0][:200] if why else ""
                break
        out[name] = (outcome, why)
    return out


def _interrupted(signum, frame):
    raise KeyboardInterrupt


def _start_hogs():
    n = os.cpu_count() or 1
    return [subprocess.Popen([sys.executable, "-c", HOG], start_new_session=True) for _ in range(n)]


def _stop(procs):
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()


def _run_once(pytest_args, junit, timeout_s):
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", *pytest_args]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return {"<pytest run>": ("failed", f"still running after {timeout_s} s: killed")}, time.monotonic() - t0
    except KeyboardInterrupt:
        os.killpg(proc.pid, signal.SIGKILL)  # its ranks are in its session too
        proc.wait()
        raise
    return _outcomes(junit), time.monotonic() - t0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", "--repeat", type=int, default=10, help="pytest runs per mode (default 10)")
    ap.add_argument("--modes", default="quiet,loaded", help="comma-separated: quiet, loaded (default both)")
    ap.add_argument("--run-timeout", type=float, default=1800, help="seconds before one pytest run is killed")
    ap.add_argument("pytest_args", nargs="+", help="test files / node ids, then pytest options after --")
    args = ap.parse_args(argv)
    # Killed from outside: still stop the hogs and the running pytest (finally blocks).
    signal.signal(signal.SIGTERM, _interrupted)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in ("quiet", "loaded")]
    if bad or args.repeat < 1:
        ap.error(f"--modes takes quiet and/or loaded (got {bad}); -n must be >= 1")

    tally = defaultdict(lambda: defaultdict(lambda: defaultdict(int)))  # test -> mode -> outcome -> count
    reasons = defaultdict(list)
    with tempfile.TemporaryDirectory(prefix="flaky-") as tmp:
        for mode in modes:
            hogs = _start_hogs() if mode == "loaded" else []
            try:
                for i in range(args.repeat):
                    junit = os.path.join(tmp, f"{mode}-{i}.xml")
                    results, secs = _run_once(args.pytest_args, junit, args.run_timeout)
                    failed = [t for t, (o, _) in results.items() if o == "failed"]
                    print(f"[{mode} {i + 1}/{args.repeat}] {len(results)} tests, {len(failed)} failed, "
                          f"{secs:.0f} s", flush=True)
                    for test, (outcome, why) in results.items():
                        tally[test][mode][outcome] += 1
                        if outcome == "failed":
                            reasons[test].append(f"{mode} run {i + 1}: {why}")
            finally:
                _stop(hogs)

    width = max((len(t) for t in tally), default=10)
    print("\n" + "test".ljust(width) + "".join(f"  {m:>14}" for m in modes))
    unstable = 0
    for test in sorted(tally):
        cells = []
        for m in modes:
            c = tally[test][m]
            ran = sum(c.values())
            cell = f"{c['passed']}/{ran} passed" if ran else "-"
            if c["skipped"]:
                cell = f"{c['skipped']}/{ran} skipped"
            cells.append(cell)
            unstable += bool(c["failed"]) or (ran and ran < args.repeat)
        print(test.ljust(width) + "".join(f"  {cell:>14}" for cell in cells))
    for test, lines in sorted(reasons.items()):
        print(f"\n{test}:")
        for line in lines[:10]:
            print(f"  {line}")
    print(f"\n{unstable} unstable test/mode pairs" if unstable else "\nevery test passed every repetition it ran in")
    return 1 if unstable else 0


if __name__ == "__main__":
    sys.exit(main())
