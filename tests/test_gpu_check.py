"""scripts/gpu_check.sh on a machine without a GPU: it runs up to the first
step that needs CUDA, says why it stopped, and still writes its report (the
part of the GPU check that CI can run)."""
import json
import os
import subprocess
import sys
import pathlib

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: run scripts/gpu_check.sh itself")
def test_without_a_gpu_it_stops_and_reports(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable,
           "GPU_CHECK_BUILD": "0",  # the suite's build is in place; a second one takes minutes on 2 cores
           "DEBS": str(tmp_path / "no-debs")}
    done = subprocess.run(["bash", "scripts/gpu_check.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["log.txt", "report.md", "results.json"]
    results = json.loads((out / "results.json").read_text())
    assert results["stopped"].startswith("no CUDA device"), results["stopped"]
    assert results["env"]["cuda_available"] is False
    steps = {s["step"]: s["status"] for s in results["steps"]}
    assert steps["env"] == "ok", steps
    for later in ("tests", "probes", "staging", "workers-2r", "workers-4r", "workers-8r"):
        assert steps[later].startswith("skipped: no CUDA device"), steps
    report = (out / "report.md").read_text()
    assert "stopped: no CUDA device" in report and "| env | ok |" in report, report
