#!/usr/bin/env python3
"""Builds and runs the fuzz targets of roce's parsers (tests/fuzz/).

Each tests/fuzz/fuzz_<parser>.cpp defines LLVMFuzzerTestOneInput over one
parser of what the network or the store hands a rank, and is linked with only
the csrc/ sources it needs (TARGETS below), under AddressSanitizer and
UndefinedBehaviorSanitizer. Two engines:

  * g++ (the default, what CI runs): tests/fuzz/driver.cpp replays the
    target's corpus (tests/fuzz/corpus/<parser>/), then mutates it for the
    seconds given, from a fixed seed;
  * --libfuzzer: clang++ -fsanitize=fuzzer (Debian's clang package), libFuzzer's
    coverage-guided search from a copy of the corpus; new inputs it finds
    stay in .fuzz-build/corpus/<parser>/ (copy the interesting ones into
    the repository's corpus).

    python3 scripts/fuzz.py                       # every target, 2 s each
    python3 scripts/fuzz.py --seconds 600 --libfuzzer roster   # the longer run
Exits 1 if a build fails or a target crashes (the input is in
.fuzz-build/<parser>/crash-*). Python's standard library only.
"""
import argparse
import concurrent.futures
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CSRC = os.path.join(ROOT, "csrc")
FUZZ = os.path.join(ROOT, "tests", "fuzz")
BUILD = os.path.join(ROOT, ".fuzz-build")
CONFIG = ["common/config.cpp", "common/env_reader.cpp", "common/setting_choices.cpp",
          "algorithms/allreduce_settings.cpp"]
TARGETS = {
    "link_records": ["runtime/link_record.cpp", "common/job_secret.cpp", "common/hmac.cpp"],
    "rank_info": ["membership/rank_info.cpp"],
    "roster": ["membership/roster.cpp", "membership/rank_info.cpp", "membership/topology.cpp"] + CONFIG,
    "verdict": ["liveness/verdict.cpp"],
    "reconfigure_handles": ["torch/reconfigure_handles.cpp"],
    "endpoint": ["transport/verbs/verbs_endpoint.cpp"],
    "frames": ["transport/stream_transport.cpp"] + CONFIG,
    "mux_chunks": ["transport/tcp/mux_link.cpp", "transport/tcp/tcp_mux.cpp", "transport/tcp/mux_chunk.cpp",
                   "common/log.cpp"] + CONFIG,
}
# -O0 for the g++ driver (CI: its builds are most of its time, and a few
# seconds of mutations find what they find at either level); -O1 for the
# longer libFuzzer run, where inputs per second count.
FLAGS = ["-std=c++20", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
         "-fno-omit-frame-pointer", "-ffunction-sections", "-fdata-sections", "-Wl,--gc-sections", "-I", CSRC]


def build(name, libfuzzer):
    out = os.path.join(BUILD, name, name)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    sources = [os.path.join(FUZZ, f"fuzz_{name}.cpp")] + [os.path.join(CSRC, s) for s in TARGETS[name]]
    if libfuzzer:
        cmd = ["clang++", "-fsanitize=fuzzer", "-O1"] + FLAGS + sources + ["-o", out, "-lpthread"]
    else:
        cmd = ["g++", "-O0"] + FLAGS + sources + [os.path.join(FUZZ, "driver.cpp"), "-o", out, "-lpthread"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    return out, p.returncode, p.stderr


def run(name, binary, seconds, libfuzzer):
    corpus = os.path.join(FUZZ, "corpus", name)
    work = os.path.dirname(binary)
    for old in os.listdir(work):
        if old.startswith("crash-"):
            os.remove(os.path.join(work, old))
    env = {**os.environ, "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=1",
           "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1:abort_on_error=1"}
    if libfuzzer:
        grown = os.path.join(BUILD, "corpus", name)
        os.makedirs(grown, exist_ok=True)
        for f in os.listdir(corpus):
            shutil.copy(os.path.join(corpus, f), grown)
        cmd = [binary, grown, f"-max_total_time={seconds}", f"-artifact_prefix={work}/crash-"]
    else:
        cmd = [binary, corpus, f"-max_total_time={seconds}"]
    start = time.monotonic()
    try:
        p = subprocess.run(cmd, cwd=work, capture_output=True, text=True, env=env, timeout=seconds * 3 + 120)
    except subprocess.TimeoutExpired:
        return 1, time.monotonic() - start, f"hung: no end after {seconds * 3 + 120:.0f} s (an input that never returns)"
    if p.returncode == 0:
        last = ((p.stdout + p.stderr).strip().splitlines() or [""])[-1]  # libFuzzer reports on stderr
    else:
        crashes = [os.path.join(work, f) for f in os.listdir(work) if f.startswith("crash-")]
        last = f"input: {', '.join(crashes) or '(none written)'}\n{p.stderr[-3000:]}"
    return p.returncode, time.monotonic() - start, last


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("targets", nargs="*", help=f"of {', '.join(TARGETS)} (default: all)")
    ap.add_argument("--seconds", type=float, default=2.0, help="mutation time per target (default 2)")
    ap.add_argument("--libfuzzer", action="store_true", help="clang++ -fsanitize=fuzzer instead of the g++ driver")
    args = ap.parse_args()
    names = list(dict.fromkeys(args.targets)) or list(TARGETS)
    unknown = [n for n in names if n not in TARGETS]
    if unknown:
        sys.exit(f"fuzz.py: unknown target(s) {', '.join(unknown)}; known: {', '.join(TARGETS)}")
    if args.libfuzzer and not shutil.which("clang++"):
        sys.exit("fuzz.py: --libfuzzer needs clang++ (apt-get install clang)")
    def build_and_run(name):
        binary, rc, err = build(name, args.libfuzzer)
        if rc != 0:
            return False, f"  {name:14s} BUILD FAILED\n{err[-3000:]}"
        rc, took, last = run(name, binary, args.seconds, args.libfuzzer)
        return rc == 0, f"  {name:14s} {'ok' if rc == 0 else 'CRASHED'}   {took:.1f} s   {last}"

    # Each target is built and run on a core of its own (its mutations are
    # one thread).
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        results = [pool.submit(build_and_run, n) for n in names]
        failed = False
        for r in results:
            ok, line = r.result()
            print(line, flush=True)
            failed |= not ok
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
