"""The benchmarks and examples, launched as users launch them (torchrun, 2
local ranks, short settings), judged by what they print: PyTorch's DDP
benchmark lines, nccl-tests columns with no wrong element, a falling loss,
parameters that match. Speed is never asserted here (see benchmarks/)."""
import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .support.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
TWO_LOCAL = ["--standalone", "--nproc_per_node", "2"]
TIMEOUT_S = 240  # each launch takes 10-40 s on a 2-core machine; this bounds a hang

# PyTorch's ddp benchmark line: "   2 CPUs --    1M/2G:  p50:  0.098s    1306/s  p75: ..."
DDP_LINE = re.compile(r"^\s*(\d+) (GPUs|CPUs) -- +(no ddp|\d+M/\d+G):"
                      + r"".join(rf"  p{q}:  (\d+\.\d{{3}})s +(\d+)/s" for q in (50, 75, 90, 95)) + "$")
# nccl-tests row: size count type redop root, then time algbw busbw #wrong twice.
PERF_ROW = re.compile(r"^ +(\d+) +(\d+) +(\w+) +(\w+) +(-?\d+)"
                      + r" +([\d.]+) +([\d.]+) +([\d.]+) +(\d+|N/A)" * 2 + "$")


def launch(cmd, env=None):
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S,
                          env={**os.environ, **(env or {})})
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}"
    return proc.stdout


def ddp_lines(out):
    return [m for m in map(DDP_LINE.match, out.splitlines()) if m]


def check_percentiles(m):
    times = [float(m.group(i)) for i in (4, 6, 8, 10)]
    assert times == sorted(times) and times[0] > 0, m.group(0)


# Builds each model of benchmarks/ddp_models.py, runs one step, prints the
# parameter counts. Run in a process of its own: tests do not import benchmarks/.
MODELS_BUILD = """
import json, sys
import torch
sys.path.insert(0, "benchmarks")
import ddp_models
counts = {}
for name in ("resnet50", "transformer", "mlp"):
    work = ddp_models.build(name, 2, image_size=32, seq_len=16)
    x, y = work.make_batch(torch.Generator().manual_seed(0))
    torch.nn.functional.cross_entropy(work.model(x), y).backward()
    counts[name] = sum(p.numel() for p in work.model.parameters())
print(json.dumps(counts))
"""


def test_models_build():
    counts = json.loads(launch([sys.executable, "-c", MODELS_BUILD]).splitlines()[-1])
    assert counts["resnet50"] == 25_557_032  # exactly torchvision's resnet50
    assert counts["transformer"] > 1e7 and counts["mlp"] > 1e7


def test_benchmark_two_backends(tmp_path):
    out = launch(TORCHRUN + TWO_LOCAL + [
        "benchmarks/benchmark.py", "--backend", "roce,gloo", "--model", "mlp", "--batch-size", "8",
        "--iters", "4", "--warmup", "1", "--sweep", "--json", str(tmp_path / "e2e.json")])
    lines = ddp_lines(out)
    # --sweep on 2 local ranks: no ddp, 1M/1G, 1M/2G, for each backend
    assert [(m.group(1), m.group(2), m.group(3)) for m in lines] == \
        [("1", "CPUs", "no ddp"), ("1", "CPUs", "1M/1G"), ("2", "CPUs", "1M/2G")] * 2, out
    for m in lines:
        check_percentiles(m)
    assert "16.74M parameters" in out and "Batch size: 8 per process" in out
    diff = float(re.search(r"max \|param\(roce\) - param\(gloo\)\| after training: (\S+)", out).group(1))
    assert diff <= 1e-5, out  # same seed and data: both backends train to the same parameters
    assert float(re.search(r"throughput roce/gloo \(p50\): ([\d.]+)x", out).group(1)) > 0
    report = json.loads((tmp_path / "e2e.json").read_text())
    full = [r for r in report["results"] if r["label"] == "1M/2G"]
    assert [r["backend"] for r in full] == ["roce", "gloo"]
    assert all(len(r["measurements"]) == 2 * 4 for r in full)  # pooled over both ranks
    assert report["comparison"]["max_param_diff"]["roce-gloo"] == diff


def test_benchmark_default_run():
    # Exactly the README's main job (scripts/main.sh without the setup step):
    # ResNet-50 layout, roce then gloo, 5 + 20 iterations on 2 local ranks.
    out = launch(TORCHRUN + TWO_LOCAL + ["benchmarks/benchmark.py"])
    lines = ddp_lines(out)
    assert [(m.group(1), m.group(2), m.group(3)) for m in lines] == [("2", "CPUs", "1M/2G")] * 2, out
    for m in lines:
        check_percentiles(m)
    assert "25.56M parameters" in out, out
    diff = float(re.search(r"max \|param\(roce\) - param\(gloo\)\| after training: (\S+)", out).group(1))
    assert diff <= 1e-5, out
    print(out)


def test_train_sh_one_node():
    out = launch(["bash", "examples/train.sh", "1", "0", "--backend", "roce", "--model", "resnet50",
                  "--image-size", "16", "--batch-size", "2", "--iters", "2", "--warmup", "1"],
                 env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
                      "TORCHRUN": str(Path(sys.executable).parent / "torchrun")})
    lines = ddp_lines(out)
    assert [(m.group(1), m.group(3)) for m in lines] == [("2", "1M/2G")], out
    check_percentiles(lines[0])
    assert "1 machine(s) x 2" in out and "25.56M parameters" in out


def test_fsdp2_loss_decreases():
    out = launch(TORCHRUN + TWO_LOCAL + ["examples/fsdp2_train.py", "--steps", "16"])
    first, last = map(float, re.search(r"loss ([\d.]+) -> ([\d.]+) \(decreased\)", out).groups())
    assert last < 0.5 * first, out
    full, local = map(int, re.search(r"parameters: (\d+) in the model, (\d+) held by rank 0", out).groups())
    assert local < 0.6 * full, out  # really sharded over the 2 ranks


def test_comm_hooks_match_plain_ddp():
    out = launch(TORCHRUN + TWO_LOCAL + ["examples/comm_hook.py", "--steps", "10"])
    calls = int(re.search(r"get_future hook: called (\d+) times", out).group(1))
    assert calls > 10, out  # several buckets per step went through the hook
    exact = float(re.search(r"get_future hook: max \|param - plain DDP param\| = (\S+)", out).group(1))
    fp16 = float(re.search(r"fp16_compress_hook: max \|param - plain DDP param\| = (\S+)", out).group(1))
    assert exact <= 1e-5, out
    assert 0 < fp16 <= 2e-3, out  # compressed (not bit-identical) yet close


def test_collectives_perf_tiny(tmp_path):
    pytest.importorskip("matplotlib")
    files = {k: tmp_path / f"perf.{k}" for k in ("csv", "json", "png")}
    out = launch(TORCHRUN + TWO_LOCAL + [
        "benchmarks/collectives_perf.py", "-b", "8", "-e", "4K", "-f", "8", "-n", "2", "-w", "1",
        "--coll", "all", "--backend", "roce,gloo",
        "--csv", str(files["csv"]), "--json", str(files["json"]), "--plot", str(files["png"])])
    rows = [m.groups() for m in map(PERF_ROW.match, out.splitlines()) if m]
    colls = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "alltoall", "sendrecv"]
    assert len(rows) == len(colls) * 2 * 4, out  # 8, 64, 512, 4096 B for each backend
    for row in rows:
        assert row[2] == "float" and float(row[5]) > 0 and float(row[9]) > 0, row
        assert row[8] == "0", row        # out of place: checked, nothing wrong
        assert row[12] in ("0", "N/A"), row  # in place: N/A only where undefined
    saved = json.loads(files["json"].read_text())["rows"]
    with open(files["csv"]) as f:
        assert len(list(csv.DictReader(f))) == len(saved) == len(rows)
    factors = {"all_reduce": 1.0, "all_gather": 0.5, "reduce_scatter": 0.5, "alltoall": 0.5,
               "broadcast": 1.0, "reduce": 1.0, "sendrecv": 1.0}  # nccl-tests' factors at 2 ranks
    for r in saved:
        assert r["oop_busbw"] == pytest.approx(r["oop_algbw"] * factors[r["collective"]])
        assert (r["ip_wrong"] is None) == (r["collective"] in ("alltoall", "sendrecv"))
    assert files["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "gloo time / roce time" in out


def _least_squares_reference(steps, lr, features=16, global_batch=48):
    """examples/ft_train.py's training in one process, in float64: the
    whole global batch of each step at once (the example's data recipe)."""
    import torch

    w, losses = torch.zeros(features, dtype=torch.float64), []
    for step in range(steps):
        g = torch.Generator().manual_seed(1000 + step)
        x = torch.randn(global_batch, features, generator=g, dtype=torch.float64)
        y = x @ torch.linspace(-1, 1, features, dtype=torch.float64) + 0.01 * torch.randn(
            global_batch, generator=g, dtype=torch.float64)
        err = x @ w - y
        losses.append(float((err * err).mean()))
        w = w - lr * 2 * x.T @ err / global_batch
    return w, losses


@pytest.mark.parametrize("recovery, size_after", [("spare", 3), ("shrink", 2)])
def test_ft_train_survives_a_killed_rank(recovery, size_after):
    """The last of 3 ranks SIGKILLs itself at step 10 of 30; the survivors
    reconfigure with the spare, or shrink it away, and training goes on from
    where it was: every step's loss and the final weights are those of one
    process training on the same global batches."""
    import torch.distributed as dist

    if not hasattr(dist, "_reconfigure"):
        pytest.skip("this torch has no reconfigure or shrink API (torch >= 2.15)")
    out = launch([sys.executable, "examples/ft_train.py", "--recovery", recovery, "--steps", "30", "--kill-at", "10",
                  "--port", str(free_port())])
    reports = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    ref_w, ref_losses = _least_squares_reference(30, 0.1)
    assert len(reports) == size_after, out
    assert sorted(r["rank"] for r in reports) == list(range(size_after)), out
    for r in reports:
        assert r["size"] == size_after, r
        losses = {int(k): v for k, v in r["losses"].items()}
        if r["stable_rank"] < 2:  # a survivor: every step, one recovery at the death
            assert sorted(losses) == list(range(30)), r
            assert [x["at_step"] for x in r["recovered"]] in ([10], [11]), r
            assert r["recovered"][0]["size"] == size_after, r
        else:  # the spare: from where the survivors were
            assert min(losses) in (10, 11) and max(losses) == 29, r
        _same_as_the_reference(r, losses, ref_w, ref_losses)
    assert losses[29] < ref_losses[0] / 1000  # trained on, not restarted


def _same_as_the_reference(report, losses, ref_w, ref_losses):
    for step, loss in losses.items():
        assert loss == pytest.approx(ref_losses[step], rel=1e-9), (step, report)
    assert report["w"] == pytest.approx(ref_w.tolist(), rel=1e-9, abs=1e-12), report


def test_ft_train_replaces_two_killed_ranks_with_two_spares():
    """Ranks 2 and 1 of 3 SIGKILL themselves at steps 10 and 20: each time a
    spare still waiting takes the dead rank's place (the second one waited
    through the first replacement, which did not name it). Rank 0 trains
    every step, recovering twice; every loss and the final weights are the
    one-process reference's."""
    import torch.distributed as dist

    if not hasattr(dist, "_reconfigure"):
        pytest.skip("this torch has no reconfigure API (torch >= 2.15)")
    out = launch([sys.executable, "examples/ft_train.py", "--recovery", "spare", "--spares", "2", "--steps", "30",
                  "--kill-at", "10", "20", "--port", str(free_port())])
    reports = {r["stable_rank"]: r for r in (json.loads(line) for line in out.splitlines() if line.startswith("{"))}
    ref_w, ref_losses = _least_squares_reference(30, 0.1)
    assert sorted(reports) == [0, 3, 4] and all(r["size"] == 3 for r in reports.values()), out
    first = {int(k): v for k, v in reports[0]["losses"].items()}
    assert sorted(first) == list(range(30)), reports[0]
    assert [x["at_step"] for x in reports[0]["recovered"]] in ([10, 20], [10, 21], [11, 20], [11, 21]), reports[0]
    for stable, joined in ((3, (10, 11)), (4, (20, 21))):
        losses = {int(k): v for k, v in reports[stable]["losses"].items()}
        assert min(losses) in joined and max(losses) == 29, reports[stable]
        _same_as_the_reference(reports[stable], losses, ref_w, ref_losses)
    _same_as_the_reference(reports[0], first, ref_w, ref_losses)
