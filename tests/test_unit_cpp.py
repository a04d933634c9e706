"""The C++ unit tests of the torch-free core (tests/unit/cpp/, built and run by
scripts/unit_tests.py with g++ alone: no torch, no extension, no spawned
ranks) pass; and the harness can fail: a test file built with one planted
failing check makes the run fail and names the check's file and line."""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "unit_tests.py"
UNIT = ROOT / "tests" / "unit" / "cpp"
# A fresh build on 2 cores takes about a minute; a loaded CI machine more.
TIMEOUT_S = 900


def _run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=TIMEOUT_S,
                          cwd=ROOT)


def test_unit_tests_build_and_pass():
    p = _run()
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    # Every test file was built and run, and its cases counted.
    files = sorted(f.stem for f in UNIT.glob("test_*.cpp"))
    assert len(files) >= 10, files
    for name in files:
        assert re.search(rf"^  {name} +ok +\d+ cases", p.stdout, re.M), f"{name} missing from:\n{out}"
    m = re.search(r"ran (\d+) binaries, (\d+) cases, 0 failed", p.stdout)
    assert m and int(m.group(1)) == len(files) and int(m.group(2)) >= 90, out


def test_a_failing_check_fails_the_run_and_names_its_line():
    source = UNIT / "test_harness.cpp"
    lines = source.read_text().splitlines()
    planted = [i + 1 for i, line in enumerate(lines) if "planted failure:" in line]
    assert len(planted) == 1, "test_harness.cpp should hold exactly one planted failure"
    p = _run("-D", "UNIT_PLANT_FAILURE", "harness")
    out = p.stdout + p.stderr
    assert p.returncode != 0, out
    assert f"test_harness.cpp:{planted[0]}: FAILED CHECK(2 + 2 == 5): 2 + 2 = 4, 5 = 5" in out, out
    assert re.search(r"test_harness +FAIL 1 of 10 cases", out), out
    # The binary itself exits non-zero; without the define the test is not there.
    binary = ROOT / ".unit-build" / "bin" / "test_harness+UNIT_PLANT_FAILURE"
    direct = subprocess.run([str(binary), "planted"], capture_output=True, text=True, timeout=60)
    assert direct.returncode == 1 and "1 test(s), 1 failed" in direct.stdout, direct.stdout + direct.stderr
    plain = _run("harness", "--filter", "planted")
    assert plain.returncode != 0 and "no case matches --filter" in plain.stdout, plain.stdout + plain.stderr


def test_a_compile_error_fails_the_run(tmp_path):
    # A test file outside the tree, built in a directory of its own, so that
    # neither the tree nor its build cache sees it.
    broken = tmp_path / "test_broken.cpp"
    broken.write_text('#include "check.hpp"\nTEST(x) { CHECK(undeclared_name); }\n')
    p = _run(str(broken), "--build-dir", str(tmp_path / "build"))
    out = p.stdout + p.stderr
    assert p.returncode != 0, out
    assert "undeclared_name" in out and "COMPILE ERROR" in out and "test_broken.cpp" in out, out
    assert "test_broken: not built (compile error)" in out, out
