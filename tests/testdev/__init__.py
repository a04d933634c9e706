"""testdev: a test-only PrivateUse1 device with real asynchronous streams.

It lets CI check a backend's CUDA-style stream semantics without a GPU.
`load()` builds the C++ extension (once; later loads are a ninja no-op),
names PrivateUse1 "testdev" and registers this module as `torch.testdev`.
Loading it makes testdev the process's `torch.accelerator` (PrivateUse1
takes precedence over CUDA there).

What it models:
- devices (2; the environment variable TESTDEV_DEVICES sets 1 to 16)
  whose memory is host memory;
- streams that are FIFO queues, each run by a worker thread of its own: work
  on different streams overlaps, work on one stream runs in order, and a
  missing event wait shows up as a wrong value. Per device: a default stream,
  a pool of 8 (getStreamFromGlobalPool, round robin) and getNewStream;
  thread-local current device and streams;
- events (record, wait/block, query, synchronize; a never-recorded event is
  complete; recording again supersedes) through torch.Event / c10::Event;
- CUDA's caching-allocator rules: a freed block is reused only by its
  allocating stream, and only once the streams recorded on it
  (record_stream) finished the work they had queued at free time; freed
  bytes are poisoned (0xA5) in stream order, so reading freed memory fails a
  test. A "pinned" host allocator (at::getHostAllocator(PrivateUse1),
  pin_memory=True) follows the same rules without an owning stream;
- copies: host<->device on the device side's current stream (blocking ones
  then synchronize it), device<->device never blocking; fill_, zero_, add,
  mul, div_ are queued on the current stream; every other op waits for the
  current stream and runs synchronously on the CPU;
- slow kernels (sleep_on_stream, slow_fill_) and a copy delay
  (set_copy_delay_ms) to catch host-side waits that should not be there;
- a current device per thread, as on CUDA, and a count per device of the
  stream and event calls made from threads whose current device it was
  (device_touches()): a thread that never selected a device works on
  device 0, which on CUDA costs a context there;
- graph capture (capture(stream)): work queued on a capturing stream is
  recorded, not run; a stream waiting for an event recorded in the capture
  joins it; querying or synchronizing a capturing stream or a captured event
  fails and invalidates the capture; ending a capture fails if it was
  invalidated or a stream that joined was not joined back into the origin.
  c10's isStreamCapturing answers (torch >= 2.15);
- allocations with ids (buffer_id(), as CUDA's buffer id); blocks of 64 KiB
  or more are mapped and unmapped by empty_cache(), and a new one of a
  released size is mapped at the released address: new pages at an old
  address, as CUDA's allocator can give after empty_cache();
- host functions (host_funcs() declares them to roce): a task queued on a
  stream that calls back once the work before it has run, as
  cuLaunchHostFunc;
- a peer-memory mode (peer_memory(), or TESTDEV_PEER_MEMORY=1 at load()):
  its memory declared registrable by pointer, as a GPU's is with
  nvidia-peermem loaded, so roce hands testdev tensors of data-movement calls
  to the verbs transport itself (GPUDirect RDMA; ibv_reg_mr takes them, they
  are host memory). No dma-buf export: that path answers "unsupported".

What it does not model: pageable host memory (every non_blocking copy is
asynchronous, including to/from ordinary CPU tensors, where CUDA would copy
synchronously: stricter than CUDA); event timing (elapsed_time); stream
priorities; graph replay (a capture records and drops its work); IPC; device generators (random ops use the CPU
generator); memory limits; torch.accelerator.memory_* statistics (use
counters()). Where a CUDA GPU is present, pin_memory=True pins for CUDA. A kernel that fails on a stream reports at the next
synchronization of that stream, like a CUDA kernel error.
"""
import atexit
import contextlib
import fcntl
import os
import pathlib
import sys

import torch
import torch.utils.cpp_extension

NAME = "testdev"
_HERE = pathlib.Path(__file__).resolve().parent
_BUILD_DIR = _HERE.parents[1] / "build" / "testdev"
_SOURCES = [
    "queue.cpp",
    "device.cpp",
    "block_cache.cpp",
    "allocators.cpp",
    "hooks.cpp",
    "kernels.cpp",
    "boxed_kernels.cpp",
    "module.cpp",
]

_ext = None


def load():
    """Builds and registers the device (idempotent); returns this module."""
    global _ext
    if _ext is None:
        _ext = _build()
        torch.utils.rename_privateuse1_backend(NAME)
        torch.utils.generate_methods_for_privateuse1_backend()
        torch._register_device_module(NAME, sys.modules[__name__])
        # Queued tasks must not run while libtorch tears down at exit.
        atexit.register(_drain)
        if os.environ.get("TESTDEV_PEER_MEMORY") == "1":
            peer_memory()
    return sys.modules[__name__]


def peer_memory():
    """Declares testdev memory registrable by pointer with roce (see above),
    with its allocations' ids (buffer_id)."""
    import roce_pg

    roce_pg.declare_device_memory(NAME, "pointer", buffer_id=_ext.buffer_id_function())


def host_funcs():
    """Declares testdev's host functions to roce (launch_host_func: a task on
    the stream that calls back, as cuLaunchHostFunc), so that roce's waits for
    testdev work are woken, not polled, as on CUDA."""
    import roce_pg

    roce_pg.declare_device_host_func(NAME, _ext.host_func_function())


def _build():
    _BUILD_DIR.mkdir(parents=True, exist_ok=True)
    # Test processes started together build once; the others wait here and
    # then find the build up to date.
    with open(_BUILD_DIR / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        # torch's own lock file, left by a build that was killed, would make
        # load() wait forever; under our lock no other build is running.
        (_BUILD_DIR / "lock").unlink(missing_ok=True)
        return torch.utils.cpp_extension.load(
            name="roce_testdev",
            sources=[str(_HERE / source) for source in _SOURCES],
            build_directory=str(_BUILD_DIR),
            extra_cflags=["-O2", "-std=c++20"],
            # The shared C++ runtime, not a private static copy (see setup.py).
            extra_ldflags=["-l:libstdc++.so.6"],
        )


def _drain():
    for device in range(device_count()):
        with contextlib.suppress(RuntimeError):
            synchronize(device)


def _device(device):
    if device is None:
        return torch.device(NAME, current_device())
    if isinstance(device, int):
        return torch.device(NAME, device)
    return torch.device(device)


# --- the device module (torch.testdev), as torch code expects of a backend


def is_available():
    return True


def device_count():
    return _ext.device_count()


def current_device():
    return torch.accelerator.current_device_index()


def set_device(device):
    torch.accelerator.set_device_index(device)


def synchronize(device=None):
    torch.accelerator.synchronize(device)


def current_stream(device=None):
    return torch.accelerator.current_stream(device)


def Stream(device=None, priority=0):
    """A new stream; like torch.cuda.Stream, `device` may be an index."""
    return torch.Stream(_device(device), priority=priority)


def Event(enable_timing=False):
    return torch.Event(NAME, enable_timing=enable_timing)


def stream(s):
    """Context manager making `s` current (no-op for None), as torch.cuda.stream."""
    return contextlib.nullcontext() if s is None else s


def _lazy_init():
    """Nothing to initialize; torch (2.11) treats the device as uninitialized,
    and torch.accelerator.synchronize as a no-op, until it could call this."""


def _is_in_bad_fork():
    return False


def manual_seed_all(seed):
    """Nothing to seed: random ops run on the CPU generator, which
    torch.manual_seed seeds already."""


# --- test helpers


def sleep_on_stream(ms, stream=None):
    """Keeps `stream` (default: the current stream) busy for `ms` ms."""
    stream = stream if stream is not None else current_stream()
    _ext.sleep_on_stream(float(ms), stream.stream_id, stream.device_index)


def slow_fill_(tensor, value, ms):
    """fill_ that finishes `ms` ms later: a producer kernel still running."""
    sleep_on_stream(ms, current_stream(tensor.device))
    return tensor.fill_(value)


def device_touches():
    """Per device index: the stream and event calls made from threads whose
    current device it was (see above), since reset_device_touches()."""
    return _ext.device_touches()


def reset_device_touches():
    _ext.reset_device_touches()


@contextlib.contextmanager
def capture(stream):
    """Captures the work queued on `stream` (not a default stream) as CUDA's
    stream capture does (see above); yields a dict whose "tasks" is set to
    the number of tasks recorded when the capture ends without an error."""
    _ext.capture_begin(stream.stream_id, stream.device_index)
    result = {}
    try:
        yield result
    finally:
        result["tasks"] = _ext.capture_end(stream.stream_id, stream.device_index)


def is_capturing(stream=None):
    stream = stream if stream is not None else current_stream()
    return _ext.is_capturing(stream.stream_id, stream.device_index)


def buffer_id(tensor):
    """The id of the allocation holding `tensor`'s data (as CUDA's
    CU_POINTER_ATTRIBUTE_BUFFER_ID): unique to it for the process's life."""
    return _ext.buffer_id(tensor.data_ptr())


def set_copy_delay_ms(ms):
    """Every host<->device copy (process-wide) first sleeps `ms` on its stream."""
    _ext.set_copy_delay_ms(float(ms))


def copy_concurrency():
    """{"running": host<->device copies running now, "peak": the most that ran
    at once since reset_copy_concurrency()} (this process, every stream)."""
    return _ext.copy_concurrency()


def reset_copy_concurrency():
    _ext.reset_copy_concurrency()


def counters():
    """{"device": {...}, "host": {...}}: allocations, fresh_blocks,
    reused_blocks, bytes_in_use, peak_bytes_in_use, pending_blocks (freed,
    waiting for recorded streams), cached_blocks."""
    return {"device": _ext.device_counters(), "host": _ext.host_counters()}


def reset_counters():
    """Zeroes allocations/fresh/reused; the peak restarts from bytes in use."""
    _ext.reset_counters()


def empty_cache():
    """Synchronizes every device, then frees all cached blocks."""
    _ext.empty_cache()
