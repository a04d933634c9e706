"""Collectives on accelerator tensors (docs/ACCELERATORS.md), on the test
device everywhere (tests/testdev: real asynchronous streams, a caching
allocator that poisons what it frees, slow kernels and slow copies) and on
CUDA where a GPU is present: the same tests, parametrized by device type.

On a GPU machine: `pytest tests/test_accelerator.py -k cuda` (the testdev
cases run there too). Each test runs its whole matrix inside one spawned group.
"""
import warnings

import pytest
import torch

from .device_use_workers import TORCH_VERSION
from .support.layouts import LAYOUTS
from .support.ranks import run_group

warnings.filterwarnings("ignore", category=FutureWarning)

KINDS = ["testdev", "cuda"]
# Pieces of 4096 bytes, so that the matrix's larger sizes run in several
# pieces with a partial last one (the default, 4 MiB, would be one piece).
SMALL_PIECES = {"ROCE_PG_DEVICE_PIECE_BYTES": "4096"}


def _group(kind, target, layout="shm2", env=None, **kwargs):
    if kind == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA GPU here; on a GPU machine run: pytest tests/test_accelerator.py -k cuda")
    world, layout_env = LAYOUTS[layout]
    prepare = "tests.accelerator_workers.load_testdev" if kind == "testdev" and kwargs.get("init", True) else None
    target = target if "." in target else f"tests.accelerator_workers.{target}"
    return run_group(target, world, env={**layout_env, **SMALL_PIECES, **(env or {})},
                     prepare=prepare, **kwargs)


def _no_failures(results):
    failures = [f for r in results for f in r["failures"]]
    assert not failures, "\n".join(failures[:40])


@pytest.mark.parametrize("layout", ["shm2", "shm3", "net2", "net3"])
@pytest.mark.parametrize("kind", KINDS)
def test_collective_matrix(kind, layout):
    results = _group(kind, "matrix", layout, kwargs={"kind": kind})
    _no_failures(results)
    assert all(r["checks"] > 1000 for r in results), [r["checks"] for r in results]


@pytest.mark.parametrize("kind", KINDS)
def test_stream_semantics(kind, tmp_path):
    results = _group(kind, "streams", kwargs={"kind": kind, "tmp": str(tmp_path)})
    _no_failures(results)
    for r in results:
        # Issuing a collective does not wait for the kernel producing its
        # input: that kernel is still running afterwards (states, not times:
        # the issue times are in the report for a reader). The second call of
        # its shape: the first one's are reported (the worker says why).
        assert r["producer_running_after_issue"], r
        if kind == "testdev":  # no lazy kernel loading there: the first call too
            assert r["producer"]["first"]["producer_running_after_issue"], r["producer"]
        # Nor for the kernel producing a PREMUL_SUM factor held on the device.
        assert all(r["premul_producer_running_after_issue"].values()), r
        assert r["side_producer_running_after_issue"], r
        # DDP on device parameters, plain and with a comm hook on the future,
        # trains like DDP on the host with Gloo.
        assert r["ddp"]["diff"] <= 1e-5 and r["ddp"]["diff_hook"] <= 1e-5, r["ddp"]
        if kind != "testdev":
            continue
        # wait() returned while the copy back was still running; a consumer
        # queued after it without any host synchronisation read the result.
        assert r["copy_back_running_after_wait"] and r["completed_after_sync"], r
        assert r["copy_back_running_after_consumer"], r  # queuing the consumer did not wait
        # Copies back ran beside copies out (pipelined pieces).
        assert r["pieces_ok"] and r["pieces_copies_at_once"] >= 2, r
        for op in ("all_gather_into_tensor", "reduce_scatter_tensor"):
            assert r[f"{op}_ok"] and r[f"{op}_copies_at_once"] >= 2, r
        # Waits for slow copies slept until a host function woke them (no
        # naps); with the host functions withdrawn they polled.
        assert r["device_waits_ok"], r
        assert r["notified_waits"][0] > 0 and r["notified_waits"][1] == 0, r
        assert r["polled_waits"][0] == 0 and r["polled_waits"][1] > 0, r
        # The lifetime check ran: the freed tensor's memory was released while
        # its copy back was queued (and the new tensor kept its values).
        assert r["freed_before_copy_back"], r


@pytest.mark.parametrize("kind", KINDS)
def test_device_use(kind):
    """Device tensors as training jobs use them (tests/device_use_workers.py):
    states observed when a Work completed, with host and device reductions."""
    results = _group(kind, "tests.device_use_workers.device_use", kwargs={"kind": kind})
    _no_failures(results)
    for r in results:
        for where in ("host", "device"):
            # A later call's issue point does not hold back an earlier call's
            # copies back or device reductions: the first allreduce completed
            # while the caller's slow work queued after it still ran.
            assert r[f"ordering_{where}"]["busy_when_first_done"], (where, r)
            # DDP overlap: the first bucket was reduced before the backward's
            # slow kernels finished.
            ddp = r[f"ddp_{where}"]
            assert ddp["buckets"] >= 4 and ddp["busy_when_first_done"], (where, ddp)
        if kind == "cuda" or TORCH_VERSION >= (2, 15):  # testdev's captures are seen through c10 from 2.15
            assert "capturing a graph" in r["capture"]["error"], r["capture"]
        # No stream or event call from a thread on another device than the
        # rank's; on CUDA, no context on another GPU (two GPUs or more).
        counts = r.get("touches") or r.get("active_contexts") or []
        others = [n for d, n in enumerate(counts) if d != r["device_index"]]
        assert not any(others), counts


@pytest.mark.parametrize("kind", KINDS)
def test_one_group_for_cpu_and_device(kind, tmp_path):
    results = _group(kind, "forms", init=False, kwargs={"kind": kind, "tmp": str(tmp_path)})
    _no_failures(results)
    for r in results:
        if kind == "testdev":
            before, after = r["registered"]
            assert "testdev" not in before and "testdev" in after, r["registered"]
        b = r["backends"]
        assert b[f"cpu:roce,{kind}:roce"] == ["RoceBackend", "RoceBackend"], b
        assert b[f"cpu:gloo,{kind}:roce"] == ["ProcessGroupGloo", "RoceBackend"], b
        if "cpu:roce,cuda:nccl" in b:
            assert b["cpu:roce,cuda:nccl"] == ["RoceBackend", "ProcessGroupNCCL"], b
        # 40 calls of different sizes with a 1 MiB cache: what stays cached is
        # bounded (the limit plus the last call's buffer), and repeated calls
        # of one size reuse buffers instead of allocating.
        loop, repeats = r["cache"]["after_loop"], r["cache"]["after_repeats"]
        assert loop["cached_bytes"] <= (1 << 20) + (1 << 20), r["cache"]
        assert repeats["allocations"] - loop["allocations"] <= 2, r["cache"]
        assert repeats["reuses"] - loop["reuses"] >= 8, r["cache"]
        assert loop["pinned"], r["cache"]


@pytest.mark.parametrize("layout", ["shm2", "shm3", "net3"])
@pytest.mark.parametrize("kind", KINDS)
def test_device_reductions(kind, layout):
    """ROCE_PG_DEVICE_REDUCE=device: every reduce op and dtype of the matrix
    with the arithmetic on the device (docs/ACCELERATORS.md), exact for
    integers, within the host path's tolerances for floats."""
    results = _group(kind, "device_reductions", layout, env={"ROCE_PG_DEVICE_REDUCE": "device"},
                     kwargs={"kind": kind})
    _no_failures(results)
    assert all(r["checks"] > 500 for r in results), [r["checks"] for r in results]
    assert all(r["bytes_reduced_on_device"] > 0 for r in results), results


def test_staged_reduce_plan():
    """The cost model behind ROCE_PG_DEVICE_REDUCE=auto, with the default
    constants: the host keeps small pieces (the device's round trip costs more
    than the reduction), and the device takes large pieces among many ranks
    of one machine, where the host's reduction work grows and the device's
    PCIe bytes do not."""
    import roce_pg._C as C

    small = C._staged_reduce_plan(2, 1, True, 4096)
    assert small["where"] == "host", small
    large = C._staged_reduce_plan(8, 1, True, 4 << 20)
    assert large["where"] == "device", large
    for ranks, machines, shm in ((2, 1, True), (8, 1, True), (4, 4, False), (16, 2, False)):
        for size in (4096, 1 << 20, 4 << 20, 64 << 20):
            plan = C._staged_reduce_plan(ranks, machines, shm, size)
            assert plan["host_us"] > 0 and plan["device_us"] > 0, plan
            assert plan["where"] == ("device" if plan["device_us"] < plan["host_us"] else "host"), plan
    with pytest.raises(ValueError):
        C._staged_reduce_plan(1, 1, True, 4096)
