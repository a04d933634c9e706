"""Rank functions for tests/test_accelerator.py: collectives on accelerator
tensors (the test device "testdev", or CUDA on a GPU machine), run inside
spawned groups. Values are checked against host references (tests/reference.py)
and collected, not asserted, so that a wrong value on one rank never leaves
the others waiting in a collective; timings come back to the test."""
import gc
import os
import time

import torch
import torch.distributed as dist

from .reference import Checker

SLOW_MS = 300  # a producer kernel that is still running when the collective is issued
QUICK_S = 0.1  # "did not wait for it": far below SLOW_MS


def load_testdev():
    """run_group(prepare=...): the device must exist before roce_pg registers."""
    import sys

    from tests import testdev

    testdev.load()
    if "roce_pg" in sys.modules:  # imported before the device existed (ranks forked in the VM): add it
        sys.modules["roce_pg"].register()
    # As CUDA offers cuLaunchHostFunc: roce's waits for the device sleep
    # until woken. TESTDEV_HOST_FUNCS=0 leaves them polling.
    if os.environ.get("TESTDEV_HOST_FUNCS", "1") == "1":
        testdev.host_funcs()


class Accel:
    """What the tests need of a device type, for testdev and CUDA alike."""

    def __init__(self, kind, rank):
        self.kind = kind
        count = torch.accelerator.device_count() if kind != "cuda" else torch.cuda.device_count()
        self.device = torch.device(kind, rank % count)
        torch.accelerator.set_device_index(self.device.index)
        self._cycles_per_ms = None
        if kind == "testdev":
            from tests import testdev

            self.testdev = testdev
        else:
            # CUDA loads a kernel's module at its first launch (lazy loading,
            # the default), which can wait for the device: a first fill_
            # queued behind a slow producer would return only once the
            # producer ended, and a test would see the producer already done.
            # Every kernel the tests time is launched once here.
            t = torch.zeros(16, device=self.device)
            t.fill_(1.0).add_(t).mul_(2.0).div_(2.0)
            self.busy(1)
            self.synchronize()

    def stream(self):
        return torch.Stream(device=self.device)

    def current_stream(self):
        return torch.accelerator.current_stream(self.device)

    def synchronize(self):
        torch.accelerator.synchronize(self.device)

    def busy(self, ms):
        """Keeps the current stream busy for about `ms` (a slow kernel)."""
        if self.kind == "testdev":
            self.testdev.sleep_on_stream(ms)
        else:
            # At least 2.5 GHz worth of cycles: no sleep shorter than `ms` on any
            # GPU clocked below that, whatever the calibration saw (a GPU that
            # two ranks share time-slices their kernels).
            torch.cuda._sleep(int(ms * max(self.cuda_cycles_per_ms(), 2.5e6)))

    def slow_fill_(self, t, value, ms=SLOW_MS):
        self.busy(ms)
        return t.fill_(value)

    def cuda_cycles_per_ms(self):
        if self._cycles_per_ms is None:
            # Once untimed first: the first launch loads the kernel (lazy module
            # loading), which would count as sleeping and shorten every later sleep.
            torch.cuda._sleep(1000)
            torch.cuda.synchronize(self.device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(10_000_000)
            end.record()
            end.synchronize()
            self._cycles_per_ms = 10_000_000 / start.elapsed_time(end)
        return self._cycles_per_ms

    def copy_delay(self, ms):
        """testdev only: every host<->device copy first sleeps `ms` on its stream."""
        self.testdev.set_copy_delay_ms(ms)


def _timed(fn):
    start = time.monotonic()
    result = fn()
    return time.monotonic() - start, result


# --- every collective, op and dtype ------------------------------------------


def matrix(rank, world, port, kind):
    """tests/matrix.py on device tensors, plus point-to-point."""
    from . import matrix as cpu_matrix

    acc = Accel(kind, rank)
    # ROCE_PG_DEVICE_PIECE_BYTES is 4096 in this group: the larger sizes run in
    # several pieces, with a partial last one.
    result = cpu_matrix.run(rank, world, port, device=str(acc.device), sizes=[0, 1, 7, 1000, 4099])
    ck = Checker(rank)
    ck.checks, ck.failures = result["checks"], result["failures"]
    _point_to_point(ck, acc, rank, world)
    return ck.result()


def _point_to_point(ck, acc, rank, world):
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    for n in (0, 5, 3000):
        mine = torch.arange(n, dtype=torch.float64, device=acc.device) + 1000 * rank
        got = torch.empty(n, dtype=torch.float64, device=acc.device)
        ops = [dist.P2POp(dist.isend, mine, nxt), dist.P2POp(dist.irecv, got, prev)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        ck.same(f"send/recv ring n={n}", got, torch.arange(n, dtype=torch.float64) + 1000 * prev)
    if world >= 2 and rank < 2:
        t = torch.full((17,), 5 + rank, dtype=torch.int32, device=acc.device)
        if rank == 0:
            dist.send(t, 1, tag=3)
        else:
            dist.recv(t, 0, tag=3)
        ck.same("send/recv with tag", t, torch.full((17,), 5, dtype=torch.int32))


# --- stream semantics ----------------------------------------------------------


def streams(rank, world, port, kind, tmp):
    """Ordering, completion, side streams, lifetimes, layouts, futures and DDP on
    one group; then CPU work (objects, barrier, DCP) in the same group."""
    acc = Accel(kind, rank)
    ck = Checker(rank)
    report = {}
    report.update(_producer_still_running(ck, acc, world))
    report.update(_premul_factor_on_the_device(ck, acc, rank, world))
    report.update(_side_streams(ck, acc, rank, world))
    _non_contiguous(ck, acc, rank, world)
    if kind == "cuda":  # torch has no sparse tensors on the test device
        _sparse_on_a_side_stream(ck, acc, rank, world)
    if kind == "testdev":
        report.update(_wait_does_not_wait_for_the_copy_back(ck, acc, world))
        report.update(_pieces_overlap(acc, world))
        report.update(_freed_right_after_issue(ck, acc, world))
    report["ddp"] = _ddp(acc, rank, world)
    _cpu_work_in_the_same_group(ck, rank, world, tmp)
    report.update(ck.result())
    return report


def _expected_sum(world, n, dtype=torch.float32):
    return torch.full((n,), float(world * (world + 1) // 2), dtype=dtype)


def _producer_still_running(ck, acc, world):
    """The collective follows the kernel that produces its input, which is still
    running when the collective is issued; issuing does not wait for it. The
    first call is reported, not asserted: under CUDA's lazy module loading a
    process's first launch of a kernel waits for the whole device, and the
    first device call of a process makes such launches (docs/ACCELERATORS.md,
    "Calls that wait for the whole device")."""
    report = {}
    for attempt in ("first", "second"):
        x = torch.empty(1 << 16, device=acc.device)
        fill_s, _ = _timed(lambda: acc.slow_fill_(x, float(dist.get_rank() + 1)))
        running_before = not acc.current_stream().query()  # tells a short producer from a waiting issue
        issue_s, work = _timed(lambda: dist.all_reduce(x, async_op=True))
        producer_running = not acc.current_stream().query()
        work.wait()
        ck.same(f"all_reduce after a slow producer ({attempt} call)", x, _expected_sum(world, 1 << 16))
        report[attempt] = {"issue_s": issue_s, "fill_s": fill_s, "producer_running_before_issue": running_before,
                           "producer_running_after_issue": producer_running}
    return {"producer_running_after_issue": report["second"]["producer_running_after_issue"],
            "producer": report, "cycles_per_ms": acc._cycles_per_ms}


def _premul_factor_on_the_device(ck, acc, rank, world):
    """PREMUL_SUM whose factor is a device tensor that a kernel still running
    at the issue produces (as a gradient-scaling factor computed on the GPU):
    issuing does not wait for that kernel, and each rank's reduction uses the
    factor's final value. allreduce, reduce_scatter_tensor and reduce."""
    n = 1000
    want = torch.full((n,), float(sum((r + 1) * 2.0 ** -r for r in range(world))), dtype=torch.float64)
    running = {}
    for call in ("all_reduce", "reduce_scatter_tensor", "reduce"):
        factor = torch.zeros((), dtype=torch.float64, device=acc.device)
        x = torch.full((n * world if call == "reduce_scatter_tensor" else n,), float(rank + 1),
                       dtype=torch.float64, device=acc.device)
        acc.slow_fill_(factor, 2.0 ** -rank)  # exact: a power of two
        op = dist._make_nccl_premul_sum(factor)
        out = torch.empty(n, dtype=torch.float64, device=acc.device)
        if call == "all_reduce":
            work = dist.all_reduce(x, op=op, async_op=True)
        elif call == "reduce_scatter_tensor":
            work = dist.reduce_scatter_tensor(out, x, op=op, async_op=True)
        else:
            work = dist.reduce(x, dst=world - 1, op=op, async_op=True)
        running[call] = not acc.current_stream().query()
        work.wait()
        got = out if call == "reduce_scatter_tensor" else x
        if call != "reduce" or rank == world - 1:
            ck.same(f"PREMUL_SUM with a device factor: {call}", got, want)
    return {"premul_producer_running_after_issue": running}


def _wait_does_not_wait_for_the_copy_back(ck, acc, world):
    """wait() returns once the host part is done; the copy back is still
    running (slow copies), and a consumer queued on the current stream after
    wait() still reads the result. The same through the future's then()."""
    acc.copy_delay(SLOW_MS)
    try:
        n = 4096
        x = torch.full((n,), float(dist.get_rank() + 1), device=acc.device)
        work = dist.all_reduce(x, async_op=True)
        work.wait()
        copy_back_running = not work.is_completed()
        enqueue_s, y = _timed(lambda: x * 2)  # a consumer on the current stream, no host synchronisation
        copy_back_running_after_consumer = not work.is_completed()  # queuing it did not wait for the copy
        work.synchronize()  # the same stream wait, again: harmless
        ck.same("consumer after wait()", y, _expected_sum(world, n) * 2)
        acc.synchronize()
        completed_after_sync = work.is_completed()

        x = torch.full((n,), float(dist.get_rank() + 1), device=acc.device)
        fut = dist.all_reduce(x, async_op=True).get_future().then(lambda f: f.value()[0] * 3)
        ck.same("future.then() after the copy back", fut.wait(), _expected_sum(world, n) * 3)
    finally:
        acc.copy_delay(0)
    return {"copy_back_running_after_wait": copy_back_running, "consumer_enqueue_s": enqueue_s,
            "copy_back_running_after_consumer": copy_back_running_after_consumer,
            "completed_after_sync": completed_after_sync}


def _pieces_overlap(acc, world):
    """Element-wise collectives move in pieces (4096 bytes here): with every
    copy taking 60 ms, the copies back of the first pieces run while later
    pieces are still being copied out (testdev counts the copies running at
    once: 2 means a copy back ran beside a copy out). Unpipelined, 6 pieces
    would take 12 x 60 ms; the time is reported, not asserted."""
    delay_ms, pieces = 60, 6
    x = torch.full((pieces * 1024,), float(dist.get_rank() + 1), device=acc.device)
    acc.synchronize()
    dist.barrier()
    acc.copy_delay(delay_ms)
    acc.testdev.reset_copy_concurrency()
    try:
        took, _ = _timed(lambda: (dist.all_reduce(x), acc.synchronize()))
    finally:
        acc.copy_delay(0)
    ok = bool(torch.equal(x.cpu(), _expected_sum(world, pieces * 1024)))
    report = {"pieces_s": took, "pieces_serial_s": 2 * pieces * delay_ms / 1000, "pieces_ok": ok,
              "pieces_copies_at_once": acc.testdev.copy_concurrency()["peak"]}
    report.update(_block_pieces_overlap(acc, world, delay_ms, pieces))
    report.update(_device_waits_sleep(acc, world, delay_ms))
    return report


def _device_waits_sleep(acc, world, delay_ms):
    """With host functions (testdev declares them, as CUDA has them) the
    progress thread sleeps until woken while the copies run: no naps. Without
    (declaration withdrawn), it polls the events with naps."""
    import roce_pg

    from tests import testdev

    report = {}
    x = torch.ones(4096, device=acc.device)
    for mode in ("notified", "polled"):
        if mode == "polled":
            roce_pg.declare_device_host_func(testdev.NAME, 0)
        acc.synchronize()
        dist.barrier()
        roce_pg.reset_counters()
        acc.copy_delay(delay_ms)
        try:
            dist.all_reduce(x)
            acc.synchronize()
        finally:
            acc.copy_delay(0)
            if mode == "polled":
                testdev.host_funcs()
        c = roce_pg.counters()
        report[f"{mode}_waits"] = (c["device_waits_notified"], c["device_wait_naps"])
    report["device_waits_ok"] = bool(torch.equal(x.cpu(), torch.full((4096,), float(world ** 2))))
    return report


def _block_pieces_overlap(acc, world, delay_ms, pieces):
    """FSDP's two collectives move in pieces too: each piece takes the same
    part of every rank's block (4096 bytes of each here), so one piece's
    results travel back while the next is still copied out. Values differ by
    rank, block and element, so that a block or piece put in the wrong place
    shows."""
    rank, m = dist.get_rank(), pieces * 1024
    mine = torch.arange(m, dtype=torch.float64) + 1000 * rank
    blocks = torch.arange(world * m, dtype=torch.float64) + 1000 * rank
    gathered_ref = torch.cat([torch.arange(m, dtype=torch.float64) + 1000 * r for r in range(world)])
    scattered_ref = world * torch.arange(rank * m, (rank + 1) * m, dtype=torch.float64) + 1000 * sum(range(world))
    report = {}
    for name, call, expected in (
            ("all_gather_into_tensor",
             lambda out, inp: dist.all_gather_into_tensor(out, inp), gathered_ref),
            ("reduce_scatter_tensor",
             lambda out, inp: dist.reduce_scatter_tensor(out, inp), scattered_ref)):
        gather = name == "all_gather_into_tensor"
        inp = (mine if gather else blocks).to(torch.float32).to(acc.device)
        out = torch.empty(world * m if gather else m, device=acc.device)
        acc.synchronize()
        dist.barrier()
        acc.copy_delay(delay_ms)
        acc.testdev.reset_copy_concurrency()
        try:
            call(out, inp)
            acc.synchronize()
        finally:
            acc.copy_delay(0)
        report[f"{name}_copies_at_once"] = acc.testdev.copy_concurrency()["peak"]
        report[f"{name}_ok"] = bool(torch.equal(out.cpu().double(), expected))
    return report


def _freed_right_after_issue(ck, acc, world):
    """The caller drops the tensor (and the Work) right after an asynchronous
    collective and allocates again on the same stream. The copy back into the
    freed memory is still queued (slow copies): without recordStream on the
    copy stream, the caching allocator would hand that memory to the new
    tensor and the late copy would overwrite it."""
    counters = acc.testdev.counters
    n = 1 << 14
    acc.synchronize()
    acc.copy_delay(SLOW_MS)
    try:
        x = torch.full((n,), float(dist.get_rank() + 1), device=acc.device)
        in_use = counters()["device"]["bytes_in_use"]
        dist.all_reduce(x, async_op=True)
        del x
        # The progress thread holds the tensor until its last copy is queued.
        deadline = time.monotonic() + 10
        while counters()["device"]["bytes_in_use"] >= in_use and time.monotonic() < deadline:
            time.sleep(0.001)
        freed = counters()["device"]["bytes_in_use"] < in_use
        fresh = torch.full((n,), 7.0, device=acc.device)
        acc.synchronize()  # every stream, the late copy included
        ck.same("tensor allocated after the collective's tensor was freed", fresh, torch.full((n,), 7.0))
    finally:
        acc.copy_delay(0)
    return {"freed_before_copy_back": freed}


def _side_streams(ck, acc, rank, world):
    """FSDP2's pattern: all-gather and reduce-scatter issued on a side stream
    (after a producer on that stream) with async_op=True; the main stream then
    waits through work.wait() and reads the result."""
    n = 1 << 12
    side = acc.stream()
    if acc.kind == "testdev":
        acc.copy_delay(50)  # a missing stream wait would read the outputs early
    try:
        with side:
            shard = torch.empty(n, device=acc.device)
            acc.slow_fill_(shard, float(rank + 1))
            gathered = torch.empty(world * n, device=acc.device)
            issue_s, ag = _timed(lambda: dist.all_gather_into_tensor(gathered, shard, async_op=True))
            side_producer_running = not side.query()  # issuing did not wait for it
            grads = torch.empty(world * n, device=acc.device)
            acc.slow_fill_(grads, float(rank + 1), ms=50)
            reduced = torch.empty(n, device=acc.device)
            rs = dist.reduce_scatter_tensor(reduced, grads, op=dist.ReduceOp.AVG, async_op=True)
        ag.wait()
        rs.wait()
        # Consumers on the main stream, which only the waits ordered after the collectives.
        ck.same("all_gather_into_tensor on a side stream",
                gathered + 0, torch.cat([torch.full((n,), float(r + 1)) for r in range(world)]))
        ck.same("reduce_scatter_tensor(AVG) on a side stream", reduced * 1,
                torch.full((n,), (world + 1) / 2, dtype=torch.float32))
    finally:
        if acc.kind == "testdev":
            acc.copy_delay(0)
    return {"side_issue_s": issue_s, "side_producer_running_after_issue": side_producer_running}


def _sparse_on_a_side_stream(ck, acc, rank, world):
    """all_reduce of a sparse tensor whose values a slow kernel on a side
    stream is still producing at the call: the sum follows that kernel, and
    a consumer on the same stream queued after wait() reads it."""
    side = acc.stream()
    with side:
        idx = torch.tensor([[rank, world], [0, 1]], device=acc.device)  # rows rank and world, columns 0 and 1
        vals = torch.empty(2, device=acc.device)
        acc.slow_fill_(vals, float(rank + 1))
        t = torch.sparse_coo_tensor(idx, vals, (world + 1, 2))
        work = dist.all_reduce(t, async_op=True)
        work.wait()
        got = t.to_dense() * 1  # a consumer on the side stream
    acc.synchronize()
    want = torch.zeros(world + 1, 2)
    for r in range(world):
        want[r, 0] += r + 1
        want[world, 1] += r + 1
    ck.same("sparse all_reduce after a slow producer on a side stream", got, want)


def _non_contiguous(ck, acc, rank, world):
    dev = acc.device
    # all_gather into the columns of a matrix
    n = 1000
    m = torch.zeros(n, world, device=dev)
    x = torch.arange(n, dtype=torch.float32, device=dev) + 10000 * rank
    dist.all_gather([m[:, r] for r in range(world)], x)
    ck.same("all_gather into column views", m,
            torch.stack([torch.arange(n, dtype=torch.float32) + 10000 * r for r in range(world)], dim=1))
    # reduce_scatter into one column; the other column keeps its values
    pair = torch.full((n, 2), -1.0, device=dev)
    ins = [torch.full((n,), float(rank + 1 + r), device=dev) for r in range(world)]
    dist.reduce_scatter(pair[:, 0], ins)
    expected = torch.full((n, 2), -1.0)
    expected[:, 0] = float(sum(k + 1 + rank for k in range(world)))
    ck.same("reduce_scatter into a column view", pair, expected)
    # broadcast into a transposed tensor
    t = (torch.arange(35, dtype=torch.int64, device=dev).view(5, 7) * (rank + 1)).t()
    dist.broadcast(t, src=0)
    ck.same("broadcast into a transposed tensor", t, torch.arange(35, dtype=torch.int64).view(5, 7).t())
    # coalesced allreduce mixing contiguous and strided tensors across piece
    # boundaries (4096-byte pieces = 1024 float32)
    a = torch.full((3000,), float(rank + 1), device=dev)
    base = torch.full((2000, 2), float(rank + 1), device=dev)
    b = base[:, 1]
    c = torch.arange(1500, dtype=torch.float32, device=dev) * (rank + 1)
    dist.all_reduce_coalesced([a, b, c])
    total = float(world * (world + 1) // 2)
    ck.same("all_reduce_coalesced contiguous", a, torch.full((3000,), total))
    ck.same("all_reduce_coalesced strided", base[:, 1], torch.full((2000,), total))
    ck.same("all_reduce_coalesced strided gaps", base[:, 0], torch.full((2000,), float(rank + 1)))
    ck.same("all_reduce_coalesced after a strided one", c, torch.arange(1500, dtype=torch.float32) * total)


def _ddp(acc, rank, world):
    """DDP on device parameters, with a comm hook chained on the Work's future
    (fut.then), against the same training on the host with Gloo."""
    from .ddp_workers import _batches, _model, _future_hook

    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    def train(model, group, device, hook=None):
        ddp = DDP(model.to(device), process_group=group, bucket_cap_mb=0.01)
        if hook is not None:
            ddp.register_comm_hook(None, hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
        for x, y in _batches(rank):
            opt.zero_grad()
            nn.functional.cross_entropy(ddp(x.to(device)), y.to(device)).backward()
            opt.step()
        return [p.detach().cpu() for p in ddp.module.parameters()]

    gloo = dist.new_group(backend="gloo")
    ref = train(_model(), gloo, torch.device("cpu"))
    plain = train(_model(), None, acc.device)
    hooked = train(_model(), None, acc.device, hook=_future_hook)
    diff = max((a - b).abs().max().item() for a, b in zip(plain, ref))
    diff_hook = max((a - b).abs().max().item() for a, b in zip(hooked, ref))
    dist.destroy_process_group(gloo)
    return {"diff": diff, "diff_hook": diff_hook}


def _cpu_work_in_the_same_group(ck, rank, world, tmp):
    """Object collectives, barrier and DCP run on CPU tensors in the group that
    ran the device collectives above."""
    import torch.distributed.checkpoint as dcp

    objs = [None] * world
    dist.all_gather_object(objs, {"rank": rank})
    ck.checks += 1
    if objs != [{"rank": r} for r in range(world)]:
        ck.failures.append(f"rank {rank}: all_gather_object: {objs}")
    lst = [f"from {rank}"]
    dist.broadcast_object_list(lst, src=0)
    ck.checks += 1
    if lst != ["from 0"]:
        ck.failures.append(f"rank {rank}: broadcast_object_list: {lst}")
    dist.barrier()
    # Replicated (the same on every rank): DCP saves one copy.
    state = {"w": torch.arange(10.0), "step": torch.tensor(7)}
    path = os.path.join(tmp, "dcp")
    dcp.save(state, checkpoint_id=path)
    loaded = {"w": torch.zeros(10), "step": torch.tensor(-1)}
    dcp.load(loaded, checkpoint_id=path)
    ck.same("DCP round trip", loaded["w"], state["w"])


# --- one group for CPU and device tensors --------------------------------------


def forms(rank, world, port, kind, tmp):
    """Backend strings and device_id, each in a process group of its own (file
    stores in `tmp`); registration of a device renamed after import."""
    import roce_pg

    report = {}
    if kind == "testdev":
        before = list(dist.Backend.backend_capability["roce"])
        load_testdev()
        roce_pg.register()  # the device was renamed after roce_pg registered
        report["registered"] = (before, list(dist.Backend.backend_capability["roce"]))
    acc = Accel(kind, rank)
    ck = Checker(rank)
    forms = [f"cpu:roce,{kind}:roce", f"cpu:gloo,{kind}:roce"]
    if kind == "cuda" and dist.is_nccl_available() and torch.cuda.device_count() >= world:
        forms.append("cpu:roce,cuda:nccl")  # NCCL wants a GPU of its own per rank
    backends = {}
    for i, backend in enumerate(forms):
        dist.init_process_group(backend, init_method=f"file://{tmp}/store{i}", rank=rank, world_size=world)
        pg = dist.group.WORLD
        backends[backend] = [type(pg._get_backend(torch.device(d))).__name__ for d in ("cpu", kind)]
        _both_devices(ck, acc, rank, world, backend)
        dist.destroy_process_group()
    report["backends"] = backends

    # device_id=: a bound device, and a subgroup of it; a small staging cache
    # that a loop of differently sized calls must not grow past its bound.
    os.environ["ROCE_PG_DEVICE_STAGING_CACHE_BYTES"] = str(1 << 20)
    dist.init_process_group("roce", init_method=f"file://{tmp}/store_bound", rank=rank, world_size=world,
                            device_id=acc.device)
    _both_devices(ck, acc, rank, world, "device_id")
    sub = dist.new_group(list(range(world)))
    t = torch.ones(3, device=acc.device)
    dist.all_reduce(t, group=sub)
    ck.same("subgroup of a group with device_id", t, torch.full((3,), float(world)))
    report["cache"] = _cache_stays_bounded(ck, acc, world, roce_pg)
    dist.destroy_process_group()
    report.update(ck.result())
    return report


def _both_devices(ck, acc, rank, world, what):
    c = torch.full((4,), float(rank + 1))
    d = torch.full((4,), float(rank + 1), device=acc.device)
    dist.all_reduce(c)
    dist.all_reduce(d)
    ck.same(f"{what}: CPU all_reduce", c, _expected_sum(world, 4))
    ck.same(f"{what}: device all_reduce", d, _expected_sum(world, 4))
    objs = [None] * world
    dist.all_gather_object(objs, rank)
    ck.checks += 1
    if objs != list(range(world)):
        ck.failures.append(f"rank {rank}: {what}: all_gather_object: {objs}")
    dist.barrier()


def _cache_stays_bounded(ck, acc, world, roce_pg):
    stats = lambda: roce_pg.device_staging_stats(device=acc.kind)  # noqa: E731
    sizes = [(k * 7919) % 300_000 + 1000 for k in range(40)]  # 4 KB to 1.2 MB, all different
    for k, n in enumerate(sizes):
        x = torch.full((n,), float(k), device=acc.device)
        dist.all_reduce(x)
        ck.same(f"all_reduce of {n} elements", x[:3], torch.full((3,), float(k * world)))
    acc.synchronize()
    dist.all_reduce(torch.ones(1, device=acc.device))  # releases trim what completed
    acc.synchronize()
    after_loop = stats()
    for _ in range(10):
        dist.all_reduce(torch.ones(4096, device=acc.device))
    return {"after_loop": after_loop, "after_repeats": stats()}


# --- reductions on the device (ROCE_PG_DEVICE_REDUCE=device) --------------------


def device_reductions(rank, world, port, kind):
    """Every reduction of tests/matrix.py with the arithmetic on the device; the
    counter proves the device path ran, and every rank holds the same bits."""
    import roce_pg

    from . import matrix as cpu_matrix

    acc = Accel(kind, rank)
    roce_pg.reset_counters()
    result = cpu_matrix.run(rank, world, port, parts=("reductions", "coalesced"), device=str(acc.device),
                            sizes=[0, 1, 7, 1000, 4099])
    ck = Checker(rank)
    ck.checks, ck.failures = result["checks"], result["failures"]
    reduced = roce_pg.counters()["bytes_reduced_on_device"]
    ck.true("bytes were reduced on the device", reduced > 0)
    # Each slice is reduced once, by its owner: float sums in a different order
    # on different ranks would differ in the last bits; these must not.
    g = torch.Generator().manual_seed(rank)
    t = torch.randn(100_003, generator=g).to(acc.device)
    dist.all_reduce(t)
    mine = t.cpu()
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)
    for r in range(world):
        ck.true(f"rank {r}'s allreduce result has the same bits as rank 0's", torch.equal(every[r], every[0]))
    report = ck.result()
    report["bytes_reduced_on_device"] = reduced
    return report


# --- GPUDirect RDMA (docs/ACCELERATORS.md): device memory to the NIC -----------


def _pattern(n, dtype, shift):
    # Positions differ (a misplaced byte shows) and every value is exact in bfloat16.
    return ((torch.arange(n) % 120) + shift).to(dtype)


def gpudirect(rank, world, port, kind, sizes=(1, 5000, 300_000)):
    """Broadcast and send/recv of device tensors, each produced by a slow
    kernel that is still running when the call is issued, and read by a kernel
    queued after wait(); the sent tensor is dropped right after isend and its
    size allocated again (the poisoning allocator would hand the memory out if
    nothing kept it). Run with testdev's peer-memory mode: over verbs the
    calls go to the NIC with no staging copy, over TCP or shared memory they
    are staged. Returns the counters of these calls alone."""
    import roce_pg

    acc = Accel(kind, rank)
    ck = Checker(rank)
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    roce_pg.reset_counters()
    for n in sizes:
        for dtype in (torch.float32, torch.int64, torch.bfloat16):
            for root in range(world):
                t = _pattern(n, dtype, 0).to(acc.device) if rank == root else torch.empty(n, dtype=dtype, device=acc.device)
                if rank == root:
                    acc.busy(SLOW_MS if n == sizes[-1] else 1)
                    t.add_(root + 1)  # queued after the slow kernel: only then is t the payload
                dist.broadcast(t, root)
                t.mul_(2)  # a consumer on the current stream, after wait()
                ck.same(f"broadcast n={n} {dtype} root={root}", t, _pattern(n, dtype, root + 1) * 2)
            x = _pattern(n, dtype, 0).to(acc.device)
            acc.busy(SLOW_MS if n == sizes[-1] else 1)
            x.add_(rank + 1)
            got = torch.empty(n, dtype=dtype, device=acc.device)
            works = [dist.isend(x, nxt), dist.irecv(got, prev)]
            del x  # only roce holds it now
            fresh = torch.full((n,), 3, dtype=dtype, device=acc.device)
            for w in works:
                w.wait()
            got.mul_(2)
            ck.same(f"send/recv n={n} {dtype}", got, _pattern(n, dtype, prev + 1) * 2)
            ck.same(f"tensor allocated after isend's was dropped n={n} {dtype}", fresh, torch.full((n,), 3, dtype=dtype))
    same_address = _new_memory_at_the_old_address(ck, acc, rank)
    dropped = _dropped_tensor_is_not_held(acc)
    acc.synchronize()
    counters = roce_pg.counters()
    return {**ck.result(), "counters": counters, "device_memory": roce_pg.device_memory_path(acc.kind),
            "log": roce_pg._roce_backend(None)._gpudirect_log(), "nic_dmabuf": roce_pg._C.testing.probe_dmabuf(),
            "new_memory_same_address": same_address, "dropped": dropped}


def _dropped_tensor_is_not_held(acc, n=1 << 17):
    """A device tensor registered for the NIC and then dropped by the user:
    its memory goes back to the allocator at once (a registration must not
    keep it allocated), and its registration goes at the group's next
    device transfer. Returns the test device's bytes in use and roce's
    registration count at each step (testdev only)."""
    import roce_pg

    if acc.kind != "testdev":
        return None
    keep = torch.ones(16, device=acc.device)  # registered now: the later transfer registers nothing new
    dist.broadcast(keep, 0)
    acc.synchronize()
    # Tensors of earlier calls that die late would have their registrations
    # dropped at the next one: let them go first, then one more transfer.
    gc.collect()
    time.sleep(0.5)
    dist.broadcast(keep, 0)
    acc.synchronize()

    def in_use():
        return acc.testdev.counters()["device"]["bytes_in_use"]

    base = {"bytes": in_use(), "mrs": roce_pg.counters()["cached_mrs"]}
    t = torch.full((n,), 1.0, device=acc.device)  # 512 KiB: a block of its own
    dist.broadcast(t, 0)
    acc.synchronize()
    registered = {"bytes": in_use(), "mrs": roce_pg.counters()["cached_mrs"]}
    del t
    deadline = time.monotonic() + 5  # the progress thread lets go of the finished call's task soon after
    while in_use() > base["bytes"] and time.monotonic() < deadline:
        time.sleep(0.01)
    dropped = {"bytes": in_use(), "mrs": roce_pg.counters()["cached_mrs"]}
    dist.broadcast(keep, 0)
    acc.synchronize()
    after_next = {"bytes": in_use(), "mrs": roce_pg.counters()["cached_mrs"]}
    return {"base": base, "registered": registered, "dropped": dropped, "after_next": after_next, "nbytes": 4 * n}


def _new_memory_at_the_old_address(ck, acc, rank, n=1 << 16):
    """FSDP's pattern: a parameter's memory freed (storage.resize_(0)) and
    allocated again (resize_(n)) while the tensor object lives on; after
    empty_cache() the new memory may come at the same address with new pages
    (the test device always does so). A registration of the old pages, kept
    for the same storage, address and length, must not be used: the NIC
    would read and write memory that is no longer the tensor's. Returns
    whether the address was the same (the case that matters happened)."""
    t = torch.full((n,), float(rank + 1), device=acc.device)
    dist.broadcast(t, 0)  # over verbs: registers t's memory on both ranks
    acc.synchronize()
    storage, address = t.untyped_storage(), t.data_ptr()
    nbytes = storage.nbytes()
    storage.resize_(0)
    (acc.testdev.empty_cache if acc.kind == "testdev" else torch.cuda.empty_cache)()
    storage.resize_(nbytes)
    t.fill_(float(10 + rank))
    dist.broadcast(t, 0)
    ck.same("broadcast into memory given back at its old address", t, torch.full((n,), 10.0))
    return t.data_ptr() == address


def gpudirect_movement(rank, world, port, kind, sizes=(1, 4099, 100_000)):
    """allgather (tensor, in-place, list with a strided output), gather,
    scatter and all-to-all (single with uneven splits and empty blocks, list)
    of device tensors, each input produced by a kernel still running at the
    call and each result read by a kernel queued after wait(); then the
    data-movement part of the collective matrix on the device. Run with
    testdev's peer-memory mode over verbs: every call goes to the NIC with no
    host copy, and a rank's own block is copied on the device. Returns the
    counters of these calls alone (three ranks: allgather would pick Bruck,
    which copies through host memory, at the small sizes)."""
    import roce_pg

    from . import matrix as cpu_matrix

    acc = Accel(kind, rank)
    ck = Checker(rank)
    roce_pg.reset_counters()
    for n in sizes:
        slow = SLOW_MS if n == sizes[-1] else 1
        for dtype in (torch.float32, torch.int64, torch.bfloat16):
            tag = f"n={n} {dtype}"

            def produced(shift, length=n):
                x = _pattern(length, dtype, 0).to(acc.device)
                acc.busy(slow)
                return x.add_(shift)  # queued after the slow kernel: only then is x the payload

            want = torch.cat([_pattern(n, dtype, r + 1) for r in range(world)])
            out = torch.empty(world * n, dtype=dtype, device=acc.device)
            dist.all_gather_into_tensor(out, produced(rank + 1))
            ck.same(f"all_gather_into_tensor {tag}", out.mul_(2), want * 2)
            # in place: the input is this rank's slot of the output (no copy of its own)
            out = torch.zeros(world * n, dtype=dtype, device=acc.device)
            out.narrow(0, rank * n, n).copy_(produced(rank + 1))
            dist.all_gather_into_tensor(out, out.narrow(0, rank * n, n))
            ck.same(f"all_gather_into_tensor in place {tag}", out.mul_(2), want * 2)
            # a list whose first tensor is every other element of a larger one
            strided = torch.zeros(2 * n, dtype=dtype, device=acc.device)
            outs = [strided[::2]] + [torch.empty(n, dtype=dtype, device=acc.device) for _ in range(world - 1)]
            dist.all_gather(outs, produced(rank + 1))
            ck.same(f"all_gather list {tag}", torch.cat([o.mul(2) for o in outs]), want * 2)
            ck.same(f"all_gather strided output leaves the gaps {tag}", strided[1::2], torch.zeros(n, dtype=dtype))
            for root in range(world):
                gl = [torch.empty(n, dtype=dtype, device=acc.device) for _ in range(world)] if rank == root else None
                dist.gather(produced(rank + 1), gather_list=gl, dst=root)
                if rank == root:
                    ck.same(f"gather root={root} {tag}", torch.cat([g.mul(2) for g in gl]), want * 2)
                sl = [produced(10 + r) for r in range(world)] if rank == root else None
                got = torch.empty(n, dtype=dtype, device=acc.device)
                dist.scatter(got, scatter_list=sl, src=root)
                ck.same(f"scatter root={root} {tag}", got.mul_(2), _pattern(n, dtype, 10 + rank) * 2)
            # rank k sends ((k + r) % world) * m rows to rank r: some blocks are empty, its own among them for rank 0
            m = max(1, n // world)
            rows = lambda k, r: (k + r) % world * m  # noqa: E731
            x = torch.cat([_pattern(rows(rank, r), dtype, 10 * rank + r) for r in range(world)]).to(acc.device)
            acc.busy(slow)
            x.add_(1)
            got = torch.empty(sum(rows(k, rank) for k in range(world)), dtype=dtype, device=acc.device)
            dist.all_to_all_single(got, x, output_split_sizes=[rows(k, rank) for k in range(world)],
                                   input_split_sizes=[rows(rank, r) for r in range(world)])
            exp = torch.cat([_pattern(rows(k, rank), dtype, 10 * k + rank + 1) for k in range(world)])
            ck.same(f"all_to_all_single uneven {tag}", got.mul_(2), exp * 2)
            ins = [produced(10 * rank + r) for r in range(world)]
            outs = [torch.empty(n, dtype=dtype, device=acc.device) for _ in range(world)]
            dist.all_to_all(outs, ins)
            ck.same(f"all_to_all list {tag}", torch.cat([o.mul(2) for o in outs]),
                    torch.cat([_pattern(n, dtype, 10 * k + rank) * 2 for k in range(world)]))
    # Layouts that cannot go as they are, still with no host copy (through a
    # device buffer of the call): a view of a storage larger than
    # ROCE_PG_IB_DEVICE_REG_BYTES (4 MiB in this group; the transport
    # registers whole storages), and a non-contiguous broadcast.
    n = 1000
    big = torch.zeros(1 << 20, dtype=torch.int64, device=acc.device)  # 8 MiB
    x = _pattern(n, torch.int64, 0).to(acc.device)
    acc.busy(SLOW_MS)
    dist.all_gather_into_tensor(big.narrow(0, 4096, world * n), x.add_(rank + 1))
    ck.same("all_gather_into_tensor into a view of a storage over the limit", big[:4096 + world * n].mul(2),
            torch.cat([torch.zeros(4096, dtype=torch.int64)] + [_pattern(n, torch.int64, r + 1) * 2 for r in range(world)]))
    for root in range(world):
        base = torch.zeros(2 * n, dtype=torch.float32, device=acc.device)
        if rank == root:
            acc.busy(SLOW_MS)
            base[::2].add_(_pattern(n, torch.float32, root).to(acc.device))
        dist.broadcast(base[::2], root)
        ck.same(f"broadcast of every other element root={root}", base.mul(2),
                torch.stack([_pattern(n, torch.float32, root) * 2, torch.zeros(n)], dim=1).reshape(-1))
    result = cpu_matrix.run(rank, world, port, parts=("data_movement",), device=str(acc.device),
                            sizes=[0, 1, 7, 1000, 4099])
    ck.checks += result["checks"]
    ck.failures += result["failures"]
    acc.synchronize()
    return {**ck.result(), "counters": roce_pg.counters(), "log": roce_pg._roce_backend(None)._gpudirect_log()}
