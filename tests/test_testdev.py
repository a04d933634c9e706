"""Self-tests of the testdev device: its streams must really be asynchronous,
so that a missing event wait or recordStream in the backend fails a test.

Timings use sleeps of 300 ms; "waited" bounds leave 50 ms of slack. That a
call did not wait is checked by state where one shows it (the stream still
busy after the call returned), else with 200 ms or more of slack."""
import os
import subprocess
import sys
import threading
import time

import pytest
import torch

from tests import testdev

SLOW_MS = 300
SLOW_S = SLOW_MS / 1000
N = 3000


@pytest.fixture(scope="module", autouse=True)
def device():
    testdev.load()
    return torch.device("testdev", 0)


@pytest.fixture(autouse=True)
def drained():
    yield
    testdev.set_copy_delay_ms(0)
    for index in range(testdev.device_count()):
        torch.accelerator.synchronize(index)


def elapsed(fn):
    start = time.monotonic()
    result = fn()
    return time.monotonic() - start, result


def test_registration_and_accelerator_api(device):
    assert torch.accelerator.current_accelerator().type == "testdev"
    expected = int(os.environ.get("TESTDEV_DEVICES", "2"))
    assert torch.accelerator.device_count() == expected == torch.testdev.device_count()
    assert torch.testdev.is_available()
    assert torch.ones(2, device="testdev").is_testdev

    last = expected - 1
    torch.testdev.set_device(last)
    assert torch.accelerator.current_device_index() == last == torch.testdev.current_device()
    assert torch.empty(1, device="testdev").device == torch.device("testdev", last)
    torch.accelerator.set_device_index(0)

    side = torch.Stream(device=device)
    default = torch.accelerator.current_stream(device)
    assert side != default
    torch.accelerator.set_stream(side)
    assert torch.testdev.current_stream() == side
    torch.accelerator.set_stream(default)
    with side:
        assert torch.accelerator.current_stream() == side
    assert torch.accelerator.current_stream() == default


def test_current_stream_is_per_thread(device):
    side = torch.Stream(device=device)
    seen = []
    with side:
        worker = threading.Thread(target=lambda: seen.append(torch.accelerator.current_stream(device)))
        worker.start()
        worker.join()
    assert seen == [torch.accelerator.current_stream(device)] and seen[0] != side


def test_streams_run_concurrently(device):
    first, second = torch.Stream(device=device), torch.Stream(device=device)
    testdev.sleep_on_stream(SLOW_MS, first)
    testdev.sleep_on_stream(SLOW_MS, second)
    assert not first.query() and not second.query()
    took, _ = elapsed(lambda: (first.synchronize(), second.synchronize()))
    assert took < SLOW_S + 0.2


def test_one_stream_runs_in_order(device):
    x = torch.zeros(N, device=device)
    half = SLOW_MS / 2
    testdev.slow_fill_(x, 1.0, half), testdev.sleep_on_stream(half), x.mul_(3), x.add_(1)
    assert not torch.accelerator.current_stream().query()  # queued, not run
    took, _ = elapsed(torch.accelerator.synchronize)
    assert took >= SLOW_S - 0.05  # the two halves ran one after the other
    assert torch.equal(x.cpu(), torch.full((N,), 4.0))


def test_device_synchronize_waits_for_every_stream(device):
    side = torch.Stream(device=device)
    testdev.sleep_on_stream(SLOW_MS, side)
    took, _ = elapsed(torch.accelerator.synchronize)
    assert took >= SLOW_S - 0.05 and side.query()


def test_a_thread_that_selected_no_device_works_on_device_0(device):
    last = torch.device("testdev", testdev.device_count() - 1)
    side = torch.Stream(device=last)
    testdev.reset_device_touches()

    def unguarded():  # a new thread's current device is 0, as on CUDA
        side.record_event().query()

    def guarded():
        torch.accelerator.set_device_index(last.index)
        side.record_event().query()

    for target in (unguarded, guarded):
        worker = threading.Thread(target=target)
        worker.start()
        worker.join()
    touches = testdev.device_touches()
    assert touches[0] > 0 and touches[last.index] > 0, touches


def test_capture_records_instead_of_running(device):
    origin, joiner = torch.Stream(device=device), torch.Stream(device=device)
    x = torch.zeros(N, device=device)
    torch.accelerator.synchronize()
    with origin, testdev.capture(origin) as captured:
        assert testdev.is_capturing(origin) and not testdev.is_capturing(joiner)
        x.add_(1)
        forked = origin.record_event()
        joiner.wait_event(forked)  # the joiner joins the capture
        assert testdev.is_capturing(joiner)
        with joiner:
            x.add_(1)
        origin.wait_event(joiner.record_event())  # and is joined back
    assert captured["tasks"] == 2 and not testdev.is_capturing(joiner)
    assert torch.equal(x.cpu(), torch.zeros(N))  # nothing ran
    if hasattr(torch.Stream, "is_capturing") and tuple(map(int, torch.__version__.split(".")[:2])) >= (2, 15):
        with origin, testdev.capture(origin):
            assert origin.is_capturing()  # c10's isStreamCapturing


def test_capture_fails_on_queries_and_unjoined_streams(device):
    origin, joiner = torch.Stream(device=device), torch.Stream(device=device)
    with pytest.raises(RuntimeError, match="invalidated"):
        with testdev.capture(origin):
            with pytest.raises(RuntimeError, match="not permitted when stream is capturing"):
                origin.record_event().query()
    with pytest.raises(RuntimeError, match="not joined back"):
        with testdev.capture(origin):
            joiner.wait_event(origin.record_event())
    assert not testdev.is_capturing(origin) and not testdev.is_capturing(joiner)
    with pytest.raises(RuntimeError, match="default stream"):
        with testdev.capture(torch.accelerator.current_stream(device)):
            pass


def test_released_memory_comes_back_at_its_address_with_a_new_id(device):
    t = torch.ones(1 << 16, device=device)  # 256 KiB: a mapped block
    small = torch.ones(16, device=device)
    torch.accelerator.synchronize()
    storage, address, first = t.untyped_storage(), t.data_ptr(), testdev.buffer_id(t)
    nbytes = storage.nbytes()
    assert first != 0 and testdev.buffer_id(small) not in (0, first)
    storage.resize_(0)
    testdev.empty_cache()
    storage.resize_(nbytes)
    assert t.data_ptr() == address and testdev.buffer_id(t) not in (0, first)


def test_empty_cache_waits_for_the_poisoning_of_what_it_unmaps(device):
    # A block some other stream was recorded on becomes reusable only inside
    # empty_cache(); its poisoning is queued on its owner then, and unmapping
    # before that memset ran crashed the owner's worker (SIGSEGV). A large
    # block makes the memset long enough to lose that race every time.
    n = 4 << 20  # 16 MiB of float32
    for _ in range(3):
        t = torch.full((n,), 1.0, device=device)
        t.record_stream(torch.Stream(device=device))
        torch.accelerator.synchronize()
        storage = t.untyped_storage()
        nbytes = storage.nbytes()
        storage.resize_(0)
        testdev.empty_cache()
        storage.resize_(nbytes)
        t.fill_(2.0)
        assert torch.equal(t.cpu(), torch.full((n,), 2.0))


def copy_on(stream, dst, src, wait_for=None):
    with stream:
        if wait_for is not None:
            stream.wait_event(wait_for)
        dst.copy_(src)


def test_event_makes_a_stream_wait(device):
    producer, consumer = torch.Stream(device=device), torch.Stream(device=device)
    x = torch.zeros(N, device=device)
    waited, raced = torch.zeros_like(x), torch.zeros_like(x)
    with producer:
        testdev.slow_fill_(x, 7.0, SLOW_MS)
    done = producer.record_event()
    assert not done.query()
    copy_on(consumer, raced, x)  # the bug an event wait prevents
    copy_on(consumer, waited, x, wait_for=done)
    consumer.synchronize()
    assert done.query()
    assert torch.equal(waited.cpu(), torch.full((N,), 7.0))
    assert torch.equal(raced.cpu(), torch.zeros(N))


def test_event_rules(device):
    event = torch.Event(device="testdev")
    assert event.query()  # never recorded: complete
    busy, idle = torch.Stream(device=device), torch.Stream(device=device)
    testdev.sleep_on_stream(SLOW_MS, busy)
    event.record(busy)
    assert not event.query()
    event.record(idle)  # supersedes the busy point
    assert event.query()
    event.record(busy)
    took, _ = elapsed(event.synchronize)
    assert took >= SLOW_S / 2 and event.query()


def test_wait_stream(device):
    producer, consumer = torch.Stream(device=device), torch.Stream(device=device)
    x = torch.zeros(N, device=device)
    y = torch.zeros_like(x)
    with producer:
        testdev.slow_fill_(x, 2.0, SLOW_MS)
    consumer.wait_stream(producer)
    copy_on(consumer, y, x)
    assert torch.equal(y.cpu(), torch.zeros(N))  # y.cpu() ran on the default stream
    consumer.synchronize()
    assert torch.equal(y.cpu(), torch.full((N,), 2.0))


def test_non_blocking_d2h_returns_before_the_producer_finished(device):
    x = torch.zeros(N, device=device)
    host = torch.empty(N, pin_memory=True)
    testdev.slow_fill_(x, 5.0, SLOW_MS)
    host.copy_(x, non_blocking=True)
    assert not torch.accelerator.current_stream().query()  # returned with the producer still running
    torch.accelerator.synchronize()
    assert torch.equal(host, torch.full((N,), 5.0))


def test_blocking_copies_wait(device):
    x = torch.zeros(N, device=device)
    testdev.slow_fill_(x, 5.0, SLOW_MS)
    took, host = elapsed(x.cpu)
    assert took >= SLOW_S - 0.05
    assert torch.equal(host, torch.full((N,), 5.0))
    testdev.sleep_on_stream(SLOW_MS)
    took, _ = elapsed(lambda: x.copy_(torch.ones(N)))
    assert took >= SLOW_S - 0.05


def test_copy_delay_applies_to_host_copies_only(device):
    x = torch.ones(N, device=device)
    y = torch.empty_like(x)
    testdev.set_copy_delay_ms(SLOW_MS)
    x.copy_(torch.full((N,), 2.0), non_blocking=True)
    assert not torch.accelerator.current_stream().query()  # returned while the delayed copy runs
    x.add_(1)
    took, _ = elapsed(torch.accelerator.synchronize)
    assert took >= SLOW_S - 0.05
    took, _ = elapsed(lambda: (y.copy_(x), torch.accelerator.synchronize()))
    assert took < SLOW_S  # device to device: no delay (with one, at least SLOW_S)
    testdev.set_copy_delay_ms(0)
    assert torch.equal(y.cpu(), torch.full((N,), 3.0))


def test_copy_concurrency_counts_copies_running_at_once(device):
    first, second = torch.Stream(device=device), torch.Stream(device=device)
    host = [torch.ones(N) for _ in range(4)]
    dev = [torch.empty(N, device=device) for _ in range(4)]
    testdev.set_copy_delay_ms(SLOW_MS)  # two copies overlap unless queued 300 ms apart
    testdev.reset_copy_concurrency()
    with first:  # one stream: its copies run one after the other
        dev[0].copy_(host[0], non_blocking=True)
        dev[1].copy_(host[1], non_blocking=True)
    first.synchronize()
    assert testdev.copy_concurrency() == {"running": 0, "peak": 1}
    testdev.sleep_on_stream(SLOW_MS, first)  # both copies queue behind this
    testdev.sleep_on_stream(SLOW_MS, second)
    with first:
        dev[2].copy_(host[2], non_blocking=True)
    with second:
        dev[3].copy_(host[3], non_blocking=True)
    torch.accelerator.synchronize()
    assert testdev.copy_concurrency() == {"running": 0, "peak": 2}
    testdev.set_copy_delay_ms(0)
    assert all(torch.equal(d.cpu(), torch.ones(N)) for d in dev)


def test_kernels_are_queued_and_fallback_ops_wait(device):
    x = torch.zeros(N, device=device)
    y = (testdev.slow_fill_(x, 1.0, SLOW_MS), x + 1, x * x)[1:]
    assert not torch.accelerator.current_stream().query()  # all three queued
    took, total = elapsed(lambda: (y[0] + y[1]).sum().item())  # sum: fallback
    assert took >= SLOW_S - 0.05 and total == 3.0 * N


def test_kernel_errors_surface_at_synchronize(device):
    x = torch.zeros(4, device=device)
    x.add_(torch.ones(3, device=device))  # queued: no shape check on the host
    with pytest.raises(RuntimeError, match="must match"):
        torch.accelerator.synchronize()
    torch.accelerator.synchronize()  # reported once


M = 5000  # floats: a block size (20 KB) only the allocator tests use


def run_while_side_stream_reads(device, record):
    """x (default stream) is read by a slow copy on a side stream, and freed
    meanwhile. Returns whether x's block was handed out again at once, the
    block, and the copy's destination (valid once the side stream is done)."""
    testdev.empty_cache()
    side = torch.Stream(device=device)
    x = torch.full((M,), 1.0, device=device)
    y = torch.zeros_like(x)
    side.wait_stream(torch.accelerator.current_stream())
    with side:
        testdev.sleep_on_stream(SLOW_MS)
        y.copy_(x)
    if record:
        x.record_stream(side)
    block = x.data_ptr()
    del x
    reused = torch.empty(M, device=device).data_ptr() == block
    side.synchronize()
    return reused, block, y


def test_freed_block_without_record_stream_is_reused_and_poisoned(device):
    testdev.reset_counters()
    reused, _, read = run_while_side_stream_reads(device, record=False)
    assert reused and testdev.counters()["device"]["reused_blocks"] >= 1
    poison = torch.full((M * 4,), 0xA5, dtype=torch.uint8)
    assert torch.equal(read.cpu().view(torch.uint8), poison)


def test_record_stream_delays_reuse_until_the_stream_finished(device):
    reused, block, read = run_while_side_stream_reads(device, record=True)
    assert not reused
    assert torch.equal(read.cpu(), torch.ones(M))
    assert testdev.counters()["device"]["pending_blocks"] == 0
    assert torch.empty(M, device=device).data_ptr() == block


def test_other_streams_do_not_reuse_a_freed_block(device):
    testdev.empty_cache()
    x = torch.empty(M, device=device)
    block = x.data_ptr()
    del x
    with torch.Stream(device=device):
        assert torch.empty(M, device=device).data_ptr() != block
    assert torch.empty(M, device=device).data_ptr() == block


@pytest.mark.skipif(torch.cuda.is_available(), reason="pin_memory=True pins for CUDA then")
def test_host_allocator_counters(device):
    testdev.empty_cache()
    testdev.reset_counters()
    pinned = torch.empty(1000, pin_memory=True)  # 4000 B, rounded to 4096
    assert pinned.is_pinned() and not torch.empty(1000).is_pinned()
    host = testdev.counters()["host"]
    assert (host["allocations"], host["fresh_blocks"], host["bytes_in_use"]) == (1, 1, 4096)
    del pinned
    again = torch.ones(1000).pin_memory()
    host = testdev.counters()["host"]
    assert (host["allocations"], host["reused_blocks"], host["peak_bytes_in_use"]) == (2, 1, 4096)
    del again
    assert testdev.counters()["host"]["bytes_in_use"] == 0


DTYPES = [
    torch.float32, torch.float64, torch.float16, torch.bfloat16,
    torch.complex64, torch.complex128, torch.bool,
    torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64,
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_copies_round_trip_with_strides(device, dtype):
    source = (torch.arange(48).reshape(6, 8) % 7).to(dtype).t()[::2]  # 4x6, strided
    on_device = torch.empty(6, 4, dtype=dtype, device=device).t()
    on_device.copy_(source, non_blocking=True)
    other = torch.empty_like(on_device, device=f"testdev:{testdev.device_count() - 1}")
    other.copy_(on_device)  # device to device, across devices when there are two
    back = torch.empty(6, 8, dtype=dtype)[:, ::2].t()
    back.copy_(other)
    assert torch.equal(back, source)
    wide = torch.complex128 if dtype.is_complex else torch.float64
    assert torch.equal(on_device.to(wide).cpu(), source.to(wide))  # converting copy


def test_ops_used_on_ddp_buckets(device):
    grads = [torch.arange(6.0).reshape(2, 3), torch.arange(4.0)]
    bucket = torch.zeros(10, device=device)
    views = [bucket.narrow(0, 0, 6).view(2, 3), bucket.narrow(0, 6, 4)]
    for view, grad in zip(views, grads):
        view.copy_(grad.to(device, non_blocking=True))
    bucket.div_(2).mul_(4).add_(torch.ones(10, device=device))
    expected = torch.cat([g.flatten() for g in grads]) * 2 + 1
    assert torch.equal(bucket.cpu(), expected)
    assert torch.equal(torch.cat(views[1:] + [views[0].flatten()]).cpu(), torch.cat([expected[6:], expected[:6]]))
    bucket.zero_()
    assert not bucket.any().item()
    out = torch.empty(0, device=device)
    torch.abs(torch.full((3,), -2.0, device=device), out=out)  # out= resized by the CPU kernel
    assert torch.equal(out.cpu(), torch.full((3,), 2.0))


_AUTOGRAD = """
import torch
from tests import testdev
testdev.load()
w = torch.ones(3, device="testdev:0", requires_grad=True)
(w * torch.arange(3.0, device="testdev:0")).sum().backward()
assert torch.equal(w.grad.cpu(), torch.arange(3.0)), w.grad
print("ok")
"""


def test_autograd():
    # In a fresh process: autograd sizes its per-device queues at the first
    # backward of a process, so in pytest's process a backward run by an
    # earlier test, before the device existed, makes this one fail inside
    # torch (an INTERNAL ASSERT), whatever the device does. Programs load
    # their device before training, as this one does.
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", _AUTOGRAD], cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stdout[-2000:] + proc.stderr[-4000:]
