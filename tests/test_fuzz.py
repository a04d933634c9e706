"""The parsers of what the network and the store hand a rank, fuzzed
(scripts/fuzz.py, tests/fuzz/): each target replays its corpus, then runs
mutated inputs for a few seconds under AddressSanitizer and
UndefinedBehaviorSanitizer (the g++ driver; the longer libFuzzer run is in
README, "Tests")."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_parser_survives_its_fuzz_run():
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "fuzz.py"), "--seconds", "3"],
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = [line for line in p.stdout.splitlines() if line.strip()]
    assert len(lines) == 8 and all(" ok " in line for line in lines), p.stdout
