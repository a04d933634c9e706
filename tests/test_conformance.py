"""PyTorch's own distributed test suite against roce: every test gloo passes on a
CPU machine (tests/conformance/gloo_passing_ws{2,3}.txt) must pass with roce;
nothing is excluded.

The ranks of each test are forked from the launcher (torch already imported),
which takes the two world sizes from about an hour to a few minutes on a
2-core machine; docs/CONFORMANCE.md has the commands, including the spawn
launch of test_distributed_spawn.py."""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CONF = os.path.join(HERE, "conformance")
RUNNER = os.path.join(CONF, "run_torch_distributed_test.py")
DEADLINE_S = 900
# Set to 1 to let this check skip where expecttest cannot be installed; a
# skipped conformance check is not a passed one, so it fails by default.
ALLOW_SKIP_ENV = "ROCE_PG_CONFORMANCE_ALLOW_SKIP"


def require_expecttest():
    try:
        import expecttest  # noqa: F401  (torch.testing._internal imports it)
    except ImportError:
        why = "torch.testing._internal needs expecttest; scripts/setup.sh installs it (or: pip install expecttest)"
        if os.environ.get(ALLOW_SKIP_ENV) == "1":
            pytest.skip(f"{why}; skipped because {ALLOW_SKIP_ENV}=1")
        pytest.fail(f"{why}. Set {ALLOW_SKIP_ENV}=1 to skip this check instead")


@pytest.mark.parametrize("world_size", [2, 3])
def test_torch_distributed_suite_passes_what_gloo_passes(world_size, tmp_path):
    require_expecttest()
    out = tmp_path / "results.json"
    log = tmp_path / "run.log"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    cmd = [sys.executable, RUNNER, "--backend", "roce", "--world-size", str(world_size), "--start-method", "fork",
           "--tests-file", os.path.join(CONF, f"gloo_passing_ws{world_size}.txt"),
           "--rerun-skipped-as", "gloo",
           "--json-out", str(out)]
    with open(log, "w") as f:
        try:
            proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT, timeout=DEADLINE_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the suite did not finish within {DEADLINE_S}s; log: {log}")
    assert out.exists(), f"the launcher wrote no results (exit {proc.returncode}); tail of its log:\n" + \
        log.read_text()[-4000:]
    report = json.loads(out.read_text())
    bad = {n: r for n, r in report["results"].items() if r["outcome"] != "passed"}
    missing = report.get("missing", [])
    lines = [f"{n}: {r['outcome']}: {(r['detail'].strip().splitlines() or [''])[-1][:300]}" for n, r in sorted(bad.items())]
    lines += [f"{n}: listed but not in this torch's suite" for n in missing]
    assert not lines and proc.returncode == 0, (
        f"{len(lines)} test(s) gloo passes did not pass with roce at world size {world_size} "
        f"(full log: {log}):\n" + "\n".join(lines))
