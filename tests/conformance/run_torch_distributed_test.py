"""Runs PyTorch's own distributed test suite against a backend.

The suite is ``torch/testing/_internal/distributed/distributed_test.py`` from the
installed torch wheel; it is launched the way PyTorch's
``test/distributed/test_distributed_spawn.py`` launches it (one spawned process
per rank, ``init_process_group(backend=BACKEND)`` through a file store), with
two differences for an out-of-tree backend:

* ``roce_pg`` is imported in the launcher and in every rank (it registers
  ``"roce"``), and
* the backend is added to ``DistTestCases.backend_feature["ddp"]`` and
  ``["subgroup"]`` before the test class is built, so the DDP and subgroup
  tests run for it as they do for gloo.

Usage::

    python tests/conformance/run_torch_distributed_test.py --backend roce --world-size 2 \
        [-k PATTERN ...] [--tests-file FILE] [--json-out FILE] [--write-passing FILE] [--list]

Prints one line per test and a summary; the exit status is 0 when nothing
failed (skips do not count) and, with ``--tests-file``, every listed test
passed. Run it with ``PYTHONPATH`` pointing at the checkout whose ``roce_pg``
build should be tested; the launcher prints which one it imported.
"""
import os
import sys

if __name__ == "__main__":
    import argparse

    _parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _parser.add_argument("--backend", default=os.environ.get("BACKEND", "roce"))
    _parser.add_argument("--world-size", type=int, default=int(os.environ.get("WORLD_SIZE", "2")))
    _parser.add_argument("-k", dest="patterns", action="append", default=[],
                         help="run only tests whose name contains this (fnmatch wildcards allowed); repeatable")
    _parser.add_argument("--tests-file", help="run only the tests named in this file (one per line, # comments)")
    _parser.add_argument("--json-out", help="write {test: {outcome, seconds, detail}} here")
    _parser.add_argument("--write-passing", help="write the names of the passing tests here, with a header")
    _parser.add_argument("--list", action="store_true", help="print the selected test names and exit")
    ARGS = _parser.parse_args()
    os.environ["BACKEND"] = ARGS.backend
    os.environ["WORLD_SIZE"] = str(ARGS.world_size)
    # torch.testing parses sys.argv when imported: give it nothing of ours.
    sys.argv = sys.argv[:1]

# Everything below also runs in each spawned rank (as __mp_main__), where the
# environment set above is inherited.
os.environ.setdefault("TEMP_DIR", "/tmp")  # replaced per test by TestDistBackend.setUp
BACKEND = os.environ["BACKEND"]

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

if BACKEND == "roce":
    import roce_pg  # noqa: F401,E402  (registers "roce")

from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

if BACKEND not in ("gloo", "nccl", "ucc", "mpi"):
    DistTestCases.backend_feature["ddp"].add(BACKEND)
    DistTestCases.backend_feature["subgroup"].add(BACKEND)

from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()


def _wanted(names, patterns, listed):
    import fnmatch

    out = []
    for n in names:
        if listed is not None and n not in listed:
            continue
        if patterns and not any(fnmatch.fnmatchcase(n, p if any(c in p for c in "*?[") else f"*{p}*")
                                for p in patterns):
            continue
        out.append(n)
    return out


def read_test_list(path):
    """Test names in a list file: one per line, '#' starts a comment."""
    names = []
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                names.append(line)
    return names


def main(args):
    import json
    import time
    import unittest

    loader = unittest.TestLoader()
    all_names = loader.getTestCaseNames(TestDistBackendWithSpawn)
    listed = read_test_list(args.tests_file) if args.tests_file else None
    names = _wanted(all_names, args.patterns, set(listed) if listed is not None else None)
    unknown = sorted(set(listed or []) - set(all_names))
    if args.list:
        print("\n".join(names))
        return 0

    where = ""
    if args.backend == "roce":
        import roce_pg

        where = f" (roce_pg from {os.path.dirname(roce_pg.__file__)})"
    print(f"torch {torch.__version__}, backend {args.backend}, world size {args.world_size}, "
          f"{len(names)} of {len(all_names)} tests{where}", flush=True)

    results = {}

    class Recorder(unittest.TextTestResult):
        def startTest(self, test):
            self._t0 = time.monotonic()
            super().startTest(test)

        def _note(self, test, outcome, detail=""):
            name = test.id().split(".")[-1]
            secs = time.monotonic() - self._t0
            results[name] = {"outcome": outcome, "seconds": round(secs, 1), "detail": detail}
            print(f"[{outcome.upper():7}] {name} ({secs:.1f}s){'  ' + detail.splitlines()[0] if detail and outcome == 'skipped' else ''}",
                  flush=True)

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

    suite = unittest.TestSuite(TestDistBackendWithSpawn(n) for n in names)
    start = time.monotonic()
    runner = unittest.TextTestRunner(stream=open(os.devnull, "w"), verbosity=0, resultclass=Recorder)
    runner.run(suite)
    total = time.monotonic() - start

    counts = {}
    for r in results.values():
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    bad = sorted(n for n, r in results.items() if r["outcome"] in ("failed", "error", "xpass"))
    not_passed = sorted(n for n in (listed or []) if results.get(n, {}).get("outcome") != "passed")

    print("\n" + "=" * 70)
    for n in bad:
        print(f"--- {n}: {results[n]['outcome']}\n{results[n]['detail']}")
    print(f"backend {args.backend}, world size {args.world_size}: "
          + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())) + f" in {total:.0f}s")
    if bad:
        print("not passing: " + " ".join(bad))
    if listed is not None:
        if unknown:
            print("listed but not in this torch's suite: " + " ".join(unknown))
        if not_passed:
            print("listed but not passed: " + " ".join(not_passed))

    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"backend": args.backend, "world_size": args.world_size, "torch": torch.__version__,
                       "seconds": round(total, 1), "results": results}, f, indent=1, sort_keys=True)
    if args.write_passing:
        with open(args.write_passing, "w") as f:
            f.write(f"# Tests of torch {torch.__version__}'s distributed_test.py that {args.backend} passes at "
                    f"world size {args.world_size} on a CPU-only machine.\n"
                    f"# Generated by: python tests/conformance/run_torch_distributed_test.py "
                    f"--backend {args.backend} --world-size {args.world_size} --write-passing "
                    f"{os.path.basename(args.write_passing)}\n"
                    f"# ({counts.get('passed', 0)} passed, {counts.get('skipped', 0)} skipped, "
                    f"{len(bad)} failed of {len(names)}; {total / 60:.0f} min on a 2-core machine)\n")
            for n in sorted(n for n, r in results.items() if r["outcome"] == "passed"):
                f.write(n + "\n")
    return 1 if bad or unknown or not_passed else 0


if __name__ == "__main__":
    sys.exit(main(ARGS))
