"""Which CUDA calls wait for device work already running?

roce issues a device collective on the caller's thread and runs its copies and
reductions from its progress thread; a driver call on either thread that waits
for the whole device (not only its own stream) makes a later call hold back an
earlier one, or makes issuing wait for the kernel producing the input. The
CUDA documentation names some such calls (page-locked allocation, and kernel
loading under lazy module loading); this measures them on the machine at hand.

For each call: a kernel that sleeps SLEEP_MS runs on the current stream; the
call is made on another stream; reported are the seconds the call took and
whether the sleeping kernel was still running when it returned (False: the
call waited for it). Each mode runs in a fresh process with the given
CUDA_MODULE_LOADING (LAZY is CUDA's default since 12.2; EAGER loads every
kernel at context creation), all cases of a mode in one process, in order.

    python benchmarks/cuda_waits.py [--json FILE]
"""
import argparse
import json
import os
import subprocess
import sys
import time

SLEEP_MS = 1000


def _record_and_query(event, stream):
    event.record(stream)
    return event.query()


def _cases(side):
    import ctypes

    import torch

    dev = side.device
    pinned = torch.empty(1 << 20, dtype=torch.uint8, pin_memory=True)
    on_device = torch.ones(1 << 20, dtype=torch.uint8, device=dev)
    x64 = torch.ones(3, 5, dtype=torch.float64, device=dev)
    rows = torch.ones(2, 4096, dtype=torch.bfloat16, device=dev)
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    # Each case is a callable made on the side stream; the name says what it is.
    return {
        # What a staged call queues at issue: a contiguous copy into pinned memory.
        "d2h_copy_into_pinned_1MiB": lambda: pinned.copy_(on_device, non_blocking=True),
        "pinned_alloc_32MiB": lambda: torch.empty(32 << 20, dtype=torch.uint8, pin_memory=True),
        "first_launch_amax_f64": lambda: torch.amax(x64, 0),
        "second_launch_amax_f64": lambda: torch.amax(x64, 0),
        "first_launch_sum_bf16_rows": lambda: rows.sum(0, dtype=torch.bfloat16),
        "device_alloc_1GiB_new_segment": lambda: torch.empty(1 << 30, dtype=torch.uint8, device=dev),
        "host_register_32MiB": lambda: torch.cuda.cudart().cudaHostRegister(libc.malloc(32 << 20), 32 << 20, 0),
        "event_record_query": lambda: _record_and_query(torch.cuda.Event(), side),
    }


def _all():
    """Every case in this process, in order, each with a sleeping kernel of its own."""
    import torch

    torch.cuda.init()
    torch.ones(1, device="cuda").sum()  # the context and the common kernels exist
    torch.cuda._sleep(1000)  # loads the sleep kernel itself
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    cycles_per_ms = 10_000_000 / start.elapsed_time(end)
    def while_sleeping(call):
        """Runs call() while a SLEEP_MS kernel runs on the current stream."""
        torch.cuda._sleep(int(SLEEP_MS * cycles_per_ms))
        sleeping = torch.cuda.current_stream()
        t0 = time.perf_counter()
        out = call()
        took = time.perf_counter() - t0
        row = {"seconds": round(took, 4), "sleep_still_running": not sleeping.query()}
        torch.cuda.synchronize()
        return row, out

    results = {}
    # First, on the current stream: the device's stream pool, made at its
    # first use (a process's first roce device call takes its streams there).
    results["stream_pool_first_use"], side = while_sleeping(
        lambda: torch.cuda.Stream(torch.device("cuda", torch.cuda.current_device())))

    def on_side(call):
        with torch.cuda.stream(side):
            call()

    for name, call in _cases(side).items():
        results[name], _ = while_sleeping(lambda: on_side(call))
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="also write the table as JSON here")
    ap.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.in_process:
        print(json.dumps(_all()))
        return
    import torch

    if not torch.cuda.is_available():
        sys.exit("cuda_waits: no CUDA device")
    table = {}
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; a {SLEEP_MS} ms kernel runs on the "
          "current stream, each call is made on another stream")
    print(f"{'call':34} {'loading':8} {'seconds':>8}  waited for the running kernel")
    for loading in ("LAZY", "EAGER"):
        env = {**os.environ, "CUDA_MODULE_LOADING": loading}
        p = subprocess.run([sys.executable, __file__, "--in-process"], env=env, capture_output=True, text=True,
                           timeout=120)
        try:
            rows = json.loads(p.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            print(f"{loading}: failed: {(p.stderr.strip().splitlines() or ['no output'])[-1]}")
            continue
        for name, r in rows.items():
            table[f"{name}/{loading}"] = r
            waited = "no" if r["sleep_still_running"] else "YES"
            print(f"{name:34} {loading:8} {r['seconds']:8.4f}  {waited}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(table, f, indent=1)


if __name__ == "__main__":
    main()
