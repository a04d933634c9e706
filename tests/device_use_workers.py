"""Rank functions for tests/test_accelerator.py's test_device_use: device
tensors used the way training jobs use them, each pattern checked by state
(which stream was still busy when a Work completed), not by duration.

- later calls do not hold back earlier ones: an asynchronous allreduce, then
  slow work on the caller's stream (a backward pass queueing kernels), then a
  second allreduce: the first completes while that work still runs, with
  host and with device reductions;
- DDP overlap: a step whose backward runs slow kernels; the first bucket's
  allreduce completes before the backward's kernels have finished;
- roce's threads select the rank's device: no stream or event call is made
  from a thread whose current device is another one (the test device counts
  them; on CUDA such a thread creates a context on GPU 0, which the driver
  shows where there are two GPUs or more);
- graph capture: a collective issued while the current stream captures fails
  at issue naming the capture, the capture ends cleanly, and the group still
  works.
"""
import os
import threading
import time

import torch
import torch.distributed as dist

from .accelerator_workers import Accel
from .reference import Checker

CALLER_WORK_MS = 1500  # the caller's slow work after the first call
BACKWARD_STEP_MS = 500  # each slow backward kernel of the DDP model
POLL_LIMIT_S = 30  # bounds a poll for a Work that never completes
TORCH_VERSION = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])


def device_use(rank, world, port, kind):
    acc = Accel(kind, rank)
    ck = Checker(rank)
    if kind == "testdev":
        acc.testdev.reset_device_touches()
    groups = {}
    for where in ("host", "device"):
        os.environ["ROCE_PG_DEVICE_REDUCE"] = where
        groups[where] = dist.new_group(backend="roce")
    report = {}
    for where, group in groups.items():
        report[f"ordering_{where}"] = _later_call_does_not_hold_back(ck, acc, world, group)
        report[f"ddp_{where}"] = _ddp_overlap(ck, acc, rank, world, group)
    if kind == "cuda" or TORCH_VERSION >= (2, 15):
        report["capture"] = _capture_refused(ck, acc, world)
    # else: c10 has no stream-capture query before torch 2.15, so roce can
    # tell only CUDA's captures (through the driver)
    acc.synchronize()
    report["device_index"] = acc.device.index
    if kind == "testdev":
        report["touches"] = acc.testdev.device_touches()
    elif torch.cuda.device_count() >= 2:
        report["active_contexts"] = _active_cuda_contexts()
    for group in groups.values():
        dist.destroy_process_group(group)
    report.update(ck.result())
    return report


def _completes_while_busy(work, still_busy):
    """Polls `work` until it completes; returns still_busy() as of then."""
    deadline = time.monotonic() + POLL_LIMIT_S
    while not work.is_completed():
        if time.monotonic() > deadline:
            raise TimeoutError(f"a Work did not complete in {POLL_LIMIT_S} s")
        time.sleep(0.002)
    return still_busy()


def _marker(acc):
    """An event at this point of the current stream."""
    event = torch.Event(acc.device)
    event.record(acc.current_stream())
    return event


def _later_call_does_not_hold_back(ck, acc, world, group):
    n = 5000  # several pieces of 4096 bytes
    acc.synchronize()
    first = torch.empty(n, device=acc.device)
    second = torch.full((n,), 2.0 * (dist.get_rank() + 1), device=acc.device)
    # Produced by a slow kernel: the first call's copies wait for it, so its
    # host part cannot end before the second call is issued.
    acc.slow_fill_(first, float(dist.get_rank() + 1))
    w1 = dist.all_reduce(first, group=group, async_op=True)
    acc.busy(CALLER_WORK_MS)  # a backward pass queueing kernels
    caller_work_done = _marker(acc)
    w2 = dist.all_reduce(second, group=group, async_op=True)
    busy_when_first_done = _completes_while_busy(w1, lambda: not caller_work_done.query())
    w2.wait()
    total = float(world * (world + 1) // 2)
    ck.same("first allreduce", first, torch.full((n,), total))
    ck.same("second allreduce", second, torch.full((n,), 2 * total))
    return {"busy_when_first_done": busy_when_first_done}


class _SlowBackward(torch.autograd.Function):
    """Identity forward; its backward first runs a slow kernel on the stream
    autograd runs it on (a costly layer's gradient)."""

    @staticmethod
    def forward(ctx, x, acc, done):
        ctx.acc, ctx.done = acc, done
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.acc.busy(BACKWARD_STEP_MS)
        ctx.done.append(_marker(ctx.acc))  # this slow kernel has finished once it completes
        return grad, None, None


def _ddp_overlap(ck, acc, rank, world, group):
    """Four element-wise layers (x * w: their backward is queued kernels only,
    so the host runs ahead of the device as it does with a GPU, and every
    bucket's allreduce is issued before the device ran the first slow
    kernel), each followed by a slow backward kernel, one bucket per layer.
    The last layer's bucket is reduced first, while the slow kernels of the
    layers before it still run."""
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    shape = (8, 64)
    torch.manual_seed(0)
    weights = [torch.randn(shape) for _ in range(4)]
    slow_done = []  # one marker per slow kernel, in the order the backward ran them

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.weights = nn.ParameterList(nn.Parameter(w.clone()) for w in weights)

        def forward(self, x):
            for w in self.weights:
                x = _SlowBackward.apply(x * w, acc, slow_done)
            return x

    ddp = DDP(Model().to(acc.device), process_group=group, bucket_cap_mb=8 * 64 * 4 / 2**20)
    works = []

    def hook(state, bucket):
        work = dist.all_reduce(bucket.buffer(), group=group, async_op=True)
        works.append(work)
        return work.get_future().then(lambda fut: fut.value()[0].div_(world))

    ddp.register_comm_hook(None, hook)
    slow_kernels = len(weights)
    busy_when_first_done = None
    for step in range(2):
        x = torch.full(shape, float(step + rank + 1), device=acc.device)
        works.clear()
        slow_done.clear()
        ddp.zero_grad()
        acc.synchronize()
        if step == 0:
            ddp(x).sum().backward()  # DDP rebuilds its buckets after the first step
            continue
        outcome = {}

        def watch():
            torch.accelerator.set_device_index(acc.device.index)  # this thread's stream calls
            deadline = time.monotonic() + POLL_LIMIT_S
            while not works and time.monotonic() < deadline:
                time.sleep(0.001)
            if works:
                outcome["busy"] = _completes_while_busy(
                    works[0], lambda: len(slow_done) < slow_kernels or not slow_done[-1].query())

        watcher = threading.Thread(target=watch)
        watcher.start()
        ddp(x).sum().backward()
        watcher.join()
        busy_when_first_done = outcome.get("busy")
        acc.synchronize()
        # Against the average of every rank's gradient, computed in float64
        # on the host.
        grads = [p.grad.detach().cpu() for p in ddp.module.parameters()]
        expected = _host_gradients(weights, [float(step + r + 1) for r in range(world)], shape)
        for i, (got, want) in enumerate(zip(grads, expected)):
            ck.close(f"ddp gradient {i}", got, want.float(), torch.float32)
    return {"busy_when_first_done": busy_when_first_done, "buckets": len(works)}


def _host_gradients(weights, fills, shape):
    """The gradients DDP averages: each rank's gradient of its output's sum,
    in float64 on the host, averaged over the ranks."""
    total = None
    for fill in fills:
        ws = [w.double().requires_grad_() for w in weights]
        x = torch.full(shape, fill, dtype=torch.float64)
        for w in ws:
            x = x * w
        grads = torch.autograd.grad(x.sum(), ws)
        total = list(grads) if total is None else [a + b for a, b in zip(total, grads)]
    return [g / len(fills) for g in total]


def _active_cuda_contexts():
    """Per GPU: whether this process has its primary context active (the
    driver's cuDevicePrimaryCtxGetState), i.e. used memory on it."""
    import ctypes

    cuda = ctypes.CDLL("libcuda.so.1")
    active = []
    for index in range(torch.cuda.device_count()):
        device, flags, state = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
        if cuda.cuDeviceGet(ctypes.byref(device), index) != 0 or \
                cuda.cuDevicePrimaryCtxGetState(device, ctypes.byref(flags), ctypes.byref(state)) != 0:
            raise RuntimeError(f"cuDevicePrimaryCtxGetState failed for GPU {index}")
        active.append(bool(state.value))
    return active


def _capture_refused(ck, acc, world):
    x = torch.full((100,), float(dist.get_rank() + 1), device=acc.device)
    acc.synchronize()
    side = acc.stream()
    error = ""
    if acc.kind == "testdev":
        with side, acc.testdev.capture(side) as captured:
            x.add_(1)  # captured: not run
            try:
                dist.all_reduce(x)
            except RuntimeError as e:
                error = str(e)
        tasks = captured["tasks"]
    else:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=torch.cuda.Stream()):
            x.add_(1)
            try:
                dist.all_reduce(x)
            except RuntimeError as e:
                error = str(e)
        tasks = None
    ck.true(f"the captured collective was refused at issue naming the capture: {error!r}",
            "capturing a graph" in error)
    # The group still works outside the capture, and the captured add never ran.
    dist.all_reduce(x)
    total = float(world * (world + 1) // 2)
    ck.same("allreduce after a refused capture", x, torch.full((100,), total))
    return {"error": error, "tasks_recorded": tasks}
