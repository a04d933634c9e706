#!/usr/bin/env python3
"""Builds and runs the C++ unit tests of the torch-free core (tests/unit/cpp/).

Each tests/unit/cpp/test_<component>.cpp is one binary, linked with only the
csrc/ sources it needs (TESTS below; a test not listed there gets the .cpp
siblings of the csrc/ headers it includes). No torch, no Python extension, no
spawned ranks: g++ and the standard library (libibverbs where a test links
verbs code), so CI runs them before anything else could fail.

    python3 scripts/unit_tests.py                    # build all, run all
    python3 scripts/unit_tests.py reduce roster      # only these tests
    python3 scripts/unit_tests.py --filter wrap      # only TEST cases whose name contains "wrap"
    python3 scripts/unit_tests.py -D UNIT_PLANT_FAILURE harness   # a define for the test files

Objects are cached in .unit-build/ by modification time (of the source and
every header it included, from g++'s dependency files) and by the flags they
were built with; compiles run in parallel on os.cpu_count() jobs. Prints one
line per test binary and a summary; exits 1 on a compile or link error, a
failed check, a crash or a timeout. Python's standard library only.
"""
import argparse
import concurrent.futures
import os
import re
import shlex
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CSRC = os.path.join(ROOT, "csrc")
TEST_DIR = os.path.join(ROOT, "tests", "unit", "cpp")
DEFAULT_BUILD = os.path.join(ROOT, ".unit-build")

CXX = os.environ.get("CXX", "g++")
# -O0: the tests run in seconds at any level, and it compiles a fifth faster than -O1.
CXXFLAGS = ["-std=c++20", "-O0", "-g0", "-Wall", "-Werror=return-type", "-I", CSRC]
# The product's .cpp files keep code that needs a live Communicator or a
# device beside code that does not (algoName beside the selection that reads
# a Communicator; MemoryRegion beside VerbsDevice). Every function in a
# section of its own, and the linker dropping the unreferenced ones, lets a
# test link the objects it calls into without what they never reach.
SECTION_FLAGS = ["-ffunction-sections", "-fdata-sections"]
LDFLAGS = ["-Wl,--gc-sections"]

# With the allreduce registry's names, which are the algorithm settings' values:
# allreduce_settings.cpp adds them while the binary starts, and nothing refers
# to it, so it must be listed wherever config.cpp is (else only "auto" is valid).
CONFIG = ["common/config.cpp", "common/env_reader.cpp", "common/setting_choices.cpp",
          "algorithms/allreduce_settings.cpp"]
# Per test (the file's name without test_ and .cpp): the csrc/ sources it
# links, and the libraries. Small on purpose: a fresh build compiles each
# source once for all tests.
TESTS = {
    "harness": {"sources": []},
    "parse": {"sources": []},
    "reduce": {"sources": ["reduce/reduce.cpp", "common/dtype.cpp"]},
    "config": {"sources": CONFIG},
    "topology": {"sources": ["membership/topology.cpp"]},
    "roster": {"sources": ["membership/roster.cpp", "membership/rank_info.cpp", "membership/topology.cpp"] + CONFIG},
    # select.cpp for algoName() only (the rest of it needs a Communicator:
    # dropped at link time, see SECTION_FLAGS).
    "cost_model": {"sources": ["algorithms/cost_model.cpp", "algorithms/select.cpp"] + CONFIG},
    "collective_cost": {"sources": ["algorithms/collective_cost.cpp", "algorithms/cost_model.cpp",
                                    "algorithms/select.cpp"] + CONFIG},
    "stream_transport": {"sources": ["transport/stream_transport.cpp"] + CONFIG},
    "shm_ring": {"sources": [], "libs": ["-lpthread"]},
    "shm_leftovers": {"sources": ["transport/shm/shm_segment.cpp", "common/log.cpp"] + CONFIG,
                      "libs": ["-lpthread"]},
    # Pools on no rails register nothing, but memory_region.cpp names
    # VerbsDevice, whose file needs the CQ set and the logger.
    "verbs_pools": {
        "sources": ["transport/verbs/landing_pool.cpp", "transport/verbs/staging_pool.cpp",
                    "transport/verbs/pool_regions.cpp", "transport/verbs/slot_pool.cpp",
                    "transport/verbs/memory_region.cpp", "transport/verbs/verbs_device.cpp",
                    "transport/verbs/cq_set.cpp", "common/log.cpp"] + CONFIG,
        "libs": ["-libverbs", "-lpthread"],
    },
    "worker_pool": {"sources": ["common/worker_pool.cpp", "common/log.cpp"], "libs": ["-lpthread"]},
    "window_order": {"sources": ["window/window_order.cpp"]},
    "link_identity": {"sources": ["runtime/link_identity.cpp"]},
    "mux_flow": {"sources": ["transport/tcp/mux_link.cpp", "transport/tcp/tcp_mux.cpp", "transport/tcp/mux_chunk.cpp",
                             "common/log.cpp"] + CONFIG, "libs": ["-lpthread"]},
}
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)
SUMMARY = re.compile(r"^(\d+) test\(s\), (\d+) failed$", re.M)


def rel(path):
    return os.path.relpath(path, ROOT)


def discover_sources(test_file):
    """For a test not in TESTS: the .cpp sibling of every csrc/ header it
    includes (one level; the linker names anything further)."""
    found = []
    for inc in INCLUDE.findall(open(test_file, encoding="utf-8").read()):
        header = os.path.join(CSRC, inc)
        cpp = os.path.splitext(header)[0] + ".cpp"
        if os.path.isfile(header) and os.path.isfile(cpp):
            found.append(os.path.relpath(cpp, CSRC))
    return found


def all_tests():
    names = sorted(f[len("test_"):-len(".cpp")] for f in os.listdir(TEST_DIR)
                   if f.startswith("test_") and f.endswith(".cpp"))
    return names


def spec_of(name, test_file):
    """The test's file, the csrc/ sources it links, and its libraries."""
    spec = TESTS.get(name)
    if spec:
        sources, libs = spec["sources"], spec.get("libs", [])
    else:
        sources = discover_sources(test_file)
        verbs = any(s.startswith("transport/verbs/") for s in sources)
        libs = (["-libverbs", "-lpthread"] if verbs else ["-lpthread"]) + ["-ldl"]  # -ldl: libcrypto, loaded at run time
    return test_file, [os.path.join(CSRC, s) for s in sources], libs


class Obj:
    """One object file: a source compiled with a set of flags."""

    def __init__(self, build, source, extra):
        self.source = source
        self.flags = CXXFLAGS + SECTION_FLAGS + extra
        tag = "".join("+" + e[2:] for e in extra if e.startswith("-D"))
        stem = rel(source).replace(os.sep, "__")[: -len(".cpp")] + tag
        self.path = os.path.join(build, "obj", stem + ".o")
        self.dep = self.path[:-2] + ".d"
        self.stamp = self.path[:-2] + ".flags"

    def command(self, out):
        return [CXX] + self.flags + ["-MMD", "-MF", self.dep, "-c", self.source, "-o", out]

    def up_to_date(self):
        """Built with these flags after every file it read was last changed."""
        try:
            built = os.path.getmtime(self.path)
            if open(self.stamp, encoding="utf-8").read() != shlex.join(self.flags):
                return False
            deps = open(self.dep, encoding="utf-8").read().replace("\\\n", " ").split(":", 1)[1].split()
        except (OSError, IndexError):
            return False
        try:
            return all(os.path.getmtime(d) <= built for d in deps)
        except OSError:  # a header gone: its includer changed too
            return False

    def build(self):
        """Compiles into a temporary name, then renames: a run killed half way,
        or another run building the same object, never leaves a torn file."""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        tmp = f"{self.path}.{os.getpid()}.tmp"
        t0 = time.monotonic()
        p = subprocess.run(self.command(tmp), capture_output=True, text=True, cwd=ROOT)
        if p.returncode == 0:
            os.replace(tmp, self.path)
            with open(self.stamp, "w", encoding="utf-8") as f:
                f.write(shlex.join(self.flags))
        elif os.path.exists(tmp):
            os.remove(tmp)
        return p, time.monotonic() - t0


def link(binary, objs, libs):
    cmd = [CXX] + LDFLAGS + [o.path for o in objs] + ["-o", binary] + libs
    stamp = binary + ".cmd"
    try:
        fresh = (open(stamp, encoding="utf-8").read() == shlex.join(cmd) and
                 all(os.path.getmtime(o.path) <= os.path.getmtime(binary) for o in objs))
    except OSError:
        fresh = False
    if fresh:
        return None
    os.makedirs(os.path.dirname(binary), exist_ok=True)
    tmp = f"{binary}.{os.getpid()}.tmp"
    p = subprocess.run(cmd[:cmd.index("-o") + 1] + [tmp] + libs, capture_output=True, text=True, cwd=ROOT)
    if p.returncode == 0:
        os.replace(tmp, binary)
        with open(stamp, "w", encoding="utf-8") as f:
            f.write(shlex.join(cmd))
    return p


def undefined_symbols(stderr):
    return sorted(set(re.findall(r"undefined reference to `([^']+)'", stderr)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tests", nargs="*",
                    help="test names (reduce, test_reduce, test_reduce.cpp) or paths of test files elsewhere; "
                         "default: every tests/unit/cpp/test_*.cpp")
    ap.add_argument("--filter", action="append", default=[],
                    help="run only TEST cases whose name contains this (repeatable)")
    ap.add_argument("-D", dest="defines", action="append", default=[],
                    help="a macro defined for the test files (not for csrc/)")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--build-dir", default=DEFAULT_BUILD)
    ap.add_argument("--timeout", type=float, default=300, help="seconds per test binary")
    ap.add_argument("--no-run", action="store_true", help="build only")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every binary's output, also when it passes")
    args = ap.parse_args()

    known = all_tests()
    files = {}  # test name -> its file
    for t in args.tests or known:
        n = os.path.basename(t)
        n = n[len("test_"):] if n.startswith("test_") else n
        n = n[:-len(".cpp")] if n.endswith(".cpp") else n
        if t.endswith(".cpp") and os.path.isfile(t):
            files[n] = os.path.abspath(t)
        elif n in known:
            files[n] = os.path.join(TEST_DIR, f"test_{n}.cpp")
        else:
            ap.error(f"no test {t!r} in {rel(TEST_DIR)} (there are: {', '.join(known)})")
    names = list(files)
    stale = sorted(set(TESTS) - set(known))
    if stale:
        ap.error(f"TESTS in {rel(__file__)} lists tests that have no file: {', '.join(stale)}")

    build = os.path.abspath(args.build_dir)
    # Test files include check.hpp from there also when they live elsewhere.
    test_extra = ["-I", TEST_DIR] + [f"-D{d}" for d in args.defines]
    suffix = "".join(f"+{d}" for d in args.defines)
    plans, objects = {}, {}
    for n in names:
        test_file, sources, libs = spec_of(n, files[n])
        objs = [Obj(build, test_file, test_extra)] + [Obj(build, s, []) for s in sources]
        for o in objs:
            objects.setdefault(o.path, o)
        plans[n] = (objs, libs, os.path.join(build, "bin", f"test_{n}{suffix}"))

    # Compile: the missing and stale objects, the slowest (largest) first.
    t0 = time.monotonic()
    todo = sorted((o for o in objects.values() if not o.up_to_date()),
                  key=lambda o: os.path.getsize(o.source), reverse=True)
    failed_objs = set()
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for o, (p, secs) in zip(todo, pool.map(lambda o: o.build(), todo)):
            if p.stderr.strip():
                print(p.stderr.rstrip(), file=sys.stderr)
            if p.returncode != 0:
                failed_objs.add(o.path)
                print(f"COMPILE ERROR {rel(o.source)}:\n  {shlex.join(o.command(o.path))}", file=sys.stderr)
    compile_s = time.monotonic() - t0
    print(f"compiled {len(todo)} of {len(objects)} objects in {compile_s:.1f} s "
          f"({len(objects) - len(todo)} up to date, {args.jobs} jobs)")

    # Link.
    t1 = time.monotonic()
    ok_bins, failures = {}, []
    linkable = {n: plan for n, plan in plans.items() if not any(o.path in failed_objs for o in plan[0])}
    failures += [f"test_{n}: not built (compile error)" for n in plans if n not in linkable]
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = pool.map(lambda item: (item[0], link(item[1][2], item[1][0], item[1][1])), linkable.items())
        for n, p in results:
            if p is not None and p.returncode != 0:
                missing = undefined_symbols(p.stderr)
                print(p.stderr.rstrip(), file=sys.stderr)
                if missing:
                    print(f"LINK ERROR test_{n}: undefined {', '.join(missing[:8])}"
                          f"{' ...' if len(missing) > 8 else ''}\n  add the csrc/*.cpp that defines them to "
                          f"TESTS[{n!r}] in {rel(__file__)}", file=sys.stderr)
                failures.append(f"test_{n}: link error")
            else:
                ok_bins[n] = linkable[n][2]
    print(f"linked {len(ok_bins)} binaries in {time.monotonic() - t1:.1f} s")
    if args.no_run:
        return 1 if failures else 0

    # Run, one binary at a time (some measure CPU time or keep every core busy).
    t2 = time.monotonic()
    cases = bad_cases = 0
    for n, binary in ok_bins.items():
        start = time.monotonic()
        try:
            p = subprocess.run([binary] + args.filter, capture_output=True, text=True, timeout=args.timeout,
                               cwd=ROOT)
            out, rc = p.stdout + p.stderr, p.returncode
        except subprocess.TimeoutExpired as e:
            out = (e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(errors="replace")
            rc = None
        secs = time.monotonic() - start
        m = SUMMARY.search(out)
        ran, bad = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
        cases += ran
        bad_cases += bad
        if rc == 0:
            status = f"ok   {ran} cases"
        elif rc is None:
            status = f"TIMEOUT after {args.timeout:.0f} s"
        elif rc == 1 and m:
            status = f"FAIL {bad} of {ran} cases"
        elif rc == 2:
            status = "FAIL no case matches --filter"
        else:
            status = f"FAIL exit status {rc}" + (" (killed by a signal)" if rc < 0 else "")
        print(f"  test_{n:<18} {status} ({secs:.2f} s)")
        if rc != 0 or args.verbose:
            print("\n".join("    | " + line for line in out.rstrip().splitlines()))
        if rc != 0:
            failures.append(f"test_{n}: {status}")
    print(f"ran {len(ok_bins)} binaries, {cases} cases, {bad_cases} failed, in {time.monotonic() - t2:.1f} s")
    if failures:
        print("FAILED: " + "; ".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
