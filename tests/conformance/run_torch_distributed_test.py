"""Runs PyTorch's own distributed test suite against a backend.

The suite is ``torch/testing/_internal/distributed/distributed_test.py`` from
the installed torch wheel. It is launched as PyTorch's
``test/distributed/test_distributed_spawn.py`` launches it: BACKEND and
WORLD_SIZE in the environment, one process per rank that joins the group with
``init_process_group(backend=BACKEND)`` through a file store. For an
out-of-tree backend the launcher also

* imports ``roce_pg`` here and in every rank (that registers ``"roce"``), and
* adds the backend to the suite's feature sets (``FEATURES`` below) before the
  test class is built, so the DDP, subgroup and generic tests run for it.

Usage (from the checkout whose roce_pg build is to be tested)::

    PYTHONPATH=$PWD python tests/conformance/run_torch_distributed_test.py \\
        --backend roce --world-size 2 [-k PATTERN ...] [--tests-file LIST] \\
        [--exclude-file LIST] [--rerun-skipped-as gloo] [--start-method fork] \\
        [--json-out FILE] [--write-passing FILE] [--list]

Prints one line per test and a summary. The exit status is 0 when no test
failed and, with ``--tests-file``, every listed test (less the excluded ones)
passed; skips of unlisted tests do not count.
"""
import os
import sys
import faulthandler
import shutil
import signal
import subprocess
import threading
import time

if __name__ == "__main__":
    import argparse

    _parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _parser.add_argument("--backend", default=os.environ.get("BACKEND", "roce"))
    _parser.add_argument("--world-size", type=int, default=int(os.environ.get("WORLD_SIZE", "2")))
    _parser.add_argument("-k", dest="patterns", action="append", default=[],
                         help="only tests whose name contains this (fnmatch wildcards allowed); repeatable")
    _parser.add_argument("--tests-file", help="only the tests named in this file (one per line, '#' comments); "
                                              "each must pass")
    _parser.add_argument("--exclude-file", help="leave out the tests named in this file (same format)")
    _parser.add_argument("--rerun-skipped-as", metavar="NAME",
                         help="with --tests-file: rerun the listed tests that skipped with --suite-backend NAME "
                              "(for tests the suite runs only for a backend of that name)")
    _parser.add_argument("--suite-backend", metavar="NAME",
                         help="backend name the suite's gates and checks see (default: --backend); the groups "
                              "are still created with --backend")
    _parser.add_argument("--start-method", choices=("spawn", "fork"), default="spawn",
                         help="how ranks start: spawn (as test_distributed_spawn.py: each rank imports torch) "
                              "or fork (from this process: about 10 s less per test on 2 cores)")
    _parser.add_argument("--json-out", help="write {results: {test: {outcome, seconds, detail}}} here")
    _parser.add_argument("--write-passing", help="write the names of the passing tests here, with a header")
    _parser.add_argument("--list", action="store_true", help="print the selected test names and exit")
    ARGS = _parser.parse_args()
    os.environ["BACKEND"] = ARGS.suite_backend or ARGS.backend
    os.environ["WORLD_SIZE"] = str(ARGS.world_size)
    os.environ["ROCE_CONFORMANCE_BACKEND"] = ARGS.backend
    os.environ["ROCE_CONFORMANCE_START_METHOD"] = ARGS.start_method
    # torch.testing parses sys.argv when imported: give it nothing of ours.
    _ARGV, sys.argv = sys.argv, sys.argv[:1]

# Everything below also runs in each spawned rank (as __mp_main__), with the
# environment set above.
os.environ.setdefault("TEMP_DIR", "/tmp")  # replaced per test by TestDistBackend.setUp
SUITE_BACKEND = os.environ["BACKEND"]  # the name the suite's gates see
BACKEND = os.environ.get("ROCE_CONFORMANCE_BACKEND", SUITE_BACKEND)  # the backend the groups use

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

if BACKEND == "roce":
    import roce_pg  # noqa: F401,E402  (registers "roce")

if SUITE_BACKEND != BACKEND:
    _init_process_group = dist.init_process_group

    def _init_with_tested_backend(*args, **kwargs):
        if args and args[0] == SUITE_BACKEND:
            args = (BACKEND,) + args[1:]
        if kwargs.get("backend") == SUITE_BACKEND:
            kwargs["backend"] = BACKEND
        return _init_process_group(*args, **kwargs)

    dist.init_process_group = _init_with_tested_backend

from torch.testing._internal.common_distributed import DistTestCases, get_timeout  # noqa: E402

# Feature sets the suite consults, by backend name, before running a test. An
# out-of-tree backend is in none of them; roce joins those whose tests it can
# run: "ddp" and "subgroup" (what test_distributed_spawn.py's backends have),
# "gpu" (roce serves CUDA tensors too; without GPUs the CUDA tests skip as they
# do for gloo, and the generic tests behind this gate, e.g. object collectives
# and DDP argument checks, run) and "plugin" (a registered out-of-tree backend
# counts as available).
FEATURES = ("ddp", "subgroup", "gpu", "plugin")
if SUITE_BACKEND not in ("gloo", "nccl", "ucc", "mpi"):
    for _feature in FEATURES:
        DistTestCases.backend_feature[_feature].add(SUITE_BACKEND)

from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)


# A rank that hangs is killed by the suite at its timeout with no word of
# where it was (its pipe to the launcher is closed once the test body ends, so
# the suite's own traceback request fails). Shortly before that, the launcher
# asks each rank still alive for its stacks: faulthandler prints every Python
# thread on SIGUSR1 (registered here, so forked ranks inherit it and spawned
# ones register it on import), and gdb, where installed, the native threads.
faulthandler.register(signal.SIGUSR1, all_threads=True)
HANG_REPORT_LEAD_S = 30


def _report_hung_ranks(processes):
    for rank, p in enumerate(processes):
        if p.exitcode is not None or p.pid is None:
            continue
        print(f"\n=== rank {rank} (pid {p.pid}) is still running near the test's timeout: its stacks follow",
              file=sys.stderr, flush=True)
        try:
            os.kill(p.pid, signal.SIGUSR1)
        except ProcessLookupError:
            continue
        time.sleep(1)  # let it print before gdb stops it
        gdb = shutil.which("gdb")
        if gdb:
            r = subprocess.run([gdb, "-p", str(p.pid), "-batch", "-ex", "thread apply all bt 30"],
                               capture_output=True, text=True, timeout=60)
            print("\n".join(line for line in r.stdout.splitlines() if line.startswith(("#", "Thread"))),
                  file=sys.stderr, flush=True)


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        if os.environ.get("ROCE_CONFORMANCE_START_METHOD") == "fork":
            self._start_processes(torch.multiprocessing.get_context("fork").Process)
        else:
            self._spawn_processes()
        lead = max(get_timeout(self.id()) - HANG_REPORT_LEAD_S, 1)
        self._hang_report = threading.Timer(lead, _report_hung_ranks, args=(self.processes,))
        self._hang_report.daemon = True
        self._hang_report.start()

    def tearDown(self):
        self._hang_report.cancel()
        super().tearDown()


def read_test_list(path):
    """Test names in a list file: one per line, '#' starts a comment."""
    names = []
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                names.append(line)
    return names


def _select(all_names, patterns, listed, excluded):
    import fnmatch

    def matches(n):
        return any(fnmatch.fnmatchcase(n, p if any(c in p for c in "*?[") else f"*{p}*") for p in patterns)

    return [n for n in all_names
            if (listed is None or n in listed) and n not in excluded and (not patterns or matches(n))]


def _run_suite(names):
    """Runs the tests in this process; returns {name: {outcome, seconds, detail}}."""
    import time
    import unittest

    results = {}

    class Recorder(unittest.TextTestResult):
        def startTest(self, test):
            self._t0 = time.monotonic()
            super().startTest(test)

        def _note(self, test, outcome, detail=""):
            name = test.id().split(".")[-1]
            secs = time.monotonic() - self._t0
            results[name] = {"outcome": outcome, "seconds": round(secs, 1), "detail": detail}
            why = f"  {detail.splitlines()[0]}" if detail and outcome == "skipped" else ""
            print(f"[{outcome.upper():7}] {name} ({secs:.1f}s){why}", flush=True)

        def addSuccess(self, test):
            super().addSuccess(test)
            self._note(test, "passed")

        def addFailure(self, test, err):
            super().addFailure(test, err)
            self._note(test, "failed", self._exc_info_to_string(err, test))

        def addError(self, test, err):
            super().addError(test, err)
            self._note(test, "error", self._exc_info_to_string(err, test))

        def addSkip(self, test, reason):
            super().addSkip(test, reason)
            self._note(test, "skipped", str(reason))

        def addExpectedFailure(self, test, err):
            super().addExpectedFailure(test, err)
            self._note(test, "xfail")

        def addUnexpectedSuccess(self, test):
            super().addUnexpectedSuccess(test)
            self._note(test, "xpass")

    with open(os.devnull, "w") as devnull:
        runner = unittest.TextTestRunner(stream=devnull, verbosity=0, resultclass=Recorder)
        runner.run(unittest.TestSuite(TestDistBackendWithSpawn(n) for n in names))
    return results


def _rerun_as(args, names, suite_backend):
    """Runs `names` again in a fresh launcher whose suite sees `suite_backend`."""
    import json
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        listing, out = os.path.join(tmp, "tests.txt"), os.path.join(tmp, "results.json")
        with open(listing, "w") as f:
            f.write("\n".join(names) + "\n")
        cmd = [sys.executable, os.path.abspath(__file__), "--backend", args.backend, "--world-size",
               str(args.world_size), "--start-method", args.start_method, "--suite-backend", suite_backend,
               "--tests-file", listing, "--json-out", out]
        subprocess.run(cmd, check=False)
        if not os.path.exists(out):
            return {n: {"outcome": "error", "seconds": 0, "detail": "the rerun launcher wrote no results"}
                    for n in names}
        with open(out) as f:
            return json.load(f)["results"]


def main(args):
    import json
    import time

    all_names = [n for n in dir(TestDistBackendWithSpawn) if n.startswith("test")]
    listed = read_test_list(args.tests_file) if args.tests_file else None
    excluded = set(read_test_list(args.exclude_file)) if args.exclude_file else set()
    names = _select(all_names, args.patterns, None if listed is None else set(listed), excluded)
    unknown = sorted(set(listed or []) - set(all_names))
    if args.list:
        print("\n".join(names))
        return 0

    where = f" (roce_pg from {os.path.dirname(roce_pg.__file__)})" if BACKEND == "roce" else ""
    seen_as = f" (the suite sees {SUITE_BACKEND})" if SUITE_BACKEND != BACKEND else ""
    print(f"torch {torch.__version__}, backend {BACKEND}{seen_as}, world size {args.world_size}, "
          f"{len(names)} of {len(all_names)} tests, ranks started by {args.start_method}{where}", flush=True)
    start = time.monotonic()
    results = _run_suite(names)
    if listed is not None and args.rerun_skipped_as:
        skipped = [n for n in names if results[n]["outcome"] == "skipped"]
        if skipped:
            print(f"\nRerunning {len(skipped)} listed tests that skipped, with the suite seeing "
                  f"{args.rerun_skipped_as}:", flush=True)
            for n, r in _rerun_as(args, skipped, args.rerun_skipped_as).items():
                results[n] = dict(r, suite_backend=args.rerun_skipped_as)
    total = time.monotonic() - start

    counts = {}
    for r in results.values():
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    bad = sorted(n for n, r in results.items() if r["outcome"] in ("failed", "error", "xpass"))
    not_passed = sorted(n for n in names if listed is not None and results[n]["outcome"] != "passed")
    rerun = sum(1 for r in results.values() if "suite_backend" in r and r["outcome"] == "passed")

    print("\n" + "=" * 70)
    for n in bad:
        print(f"--- {n}: {results[n]['outcome']}\n{results[n]['detail']}")
    print(f"backend {BACKEND}{seen_as}, world size {args.world_size}: "
          + ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
          + (f" ({rerun} of the passes with the suite seeing {args.rerun_skipped_as})" if rerun else "")
          + (f", {len(excluded & set(all_names if listed is None else listed))} excluded" if excluded else "")
          + f" in {total:.0f}s")
    if bad:
        print("not passing: " + " ".join(bad))
    if unknown:
        print("listed but not in this torch's suite: " + " ".join(unknown))
    if not_passed:
        print("listed but not passed: " + " ".join(not_passed))

    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"backend": BACKEND, "suite_backend": SUITE_BACKEND, "world_size": args.world_size,
                       "torch": torch.__version__, "start_method": args.start_method, "seconds": round(total, 1),
                       "results": results, "missing": unknown}, f, indent=1, sort_keys=True)
    if args.write_passing:
        passing = sorted(n for n, r in results.items() if r["outcome"] == "passed")
        with open(args.write_passing, "w") as f:
            f.write(f"# The tests of torch {torch.__version__}'s distributed_test.py that {BACKEND} passes at world "
                    f"size {args.world_size} on a CPU-only 2-core machine: {len(passing)} passed, "
                    f"{counts.get('skipped', 0)} skipped, {len(bad)} failed of {len(names)}, in "
                    f"{total / 60:.0f} min.\n"
                    f"# Generated by: python tests/conformance/run_torch_distributed_test.py "
                    + " ".join(_ARGV[1:]) + "\n")
            f.writelines(n + "\n" for n in passing)
    return 1 if bad or unknown or not_passed else 0


if __name__ == "__main__":
    sys.exit(main(ARGS))
