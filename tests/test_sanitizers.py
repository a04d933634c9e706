"""The failure paths under AddressSanitizer + UndefinedBehaviorSanitizer.

scripts/sanitize.sh builds an instrumented copy of the extension into .asan/
and runs, against it, the host tests that exercise what breaks: timeouts, size
mismatches, bad input, abort, a peer killed mid-collective, corrupted frames,
group destroy/recreate, plus a short collective matrix on shared memory and
TCP. Any ASan or UBSan report fails the test (the script exits 66 and prints
the reports)."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SELECTION = [
    "tests/sanitized_workload.py",
    "tests/test_faults.py",
    "tests/test_api.py::test_bad_input_raises_clear_errors_and_group_stays_usable",
    "tests/test_api.py::test_size_mismatch_on_network_path_fails_every_rank_fast",
    "tests/test_api.py::test_rank_skipping_a_collective_times_out_within_twice_the_timeout",
    "tests/test_api.py::test_per_call_timeout_is_honoured",
    "tests/test_api.py::test_work_semantics",
    "tests/test_api.py::test_object_collectives_and_point_to_point",
]


def test_failure_paths_and_short_matrix_have_zero_sanitizer_reports():
    # The leak tests' RSS bounds mean nothing under ASan (its quarantine holds
    # freed memory): their scenarios still run, at a fifth of the cycles, but
    # only the fault assertions are checked here.
    env = dict(os.environ, ROCE_TEST_FAULTS_SCALE="0.2")
    p = subprocess.run(["bash", str(ROOT / "scripts" / "sanitize.sh"), "-q", "-x", *SELECTION,
                        "-k", "not leaks_nothing and not do_not_grow"],
                       cwd=ROOT, capture_output=True, text=True, timeout=1800, env=env)
    out = p.stdout[-8000:] + "\n---- stderr ----\n" + p.stderr[-8000:]
    sys.stdout.write(out)
    assert p.returncode != 66, "sanitizer reports:\n" + out
    assert p.returncode == 0, out
    assert "zero sanitizer reports" in p.stdout, out
    assert " passed" in p.stdout and " failed" not in p.stdout, out
