"""roce: a torch.distributed backend over RDMA verbs, shared memory and TCP.

Importing this package registers the backend name ``"roce"`` for CPU and CUDA
tensors (ROCm's are "cuda" too), and for the PrivateUse1 device once it has
been renamed (call ``roce_pg.register()`` again after renaming it)::

    import roce_pg  # optional on torch >= 2.15 (entry point)
    torch.distributed.init_process_group("roce")

Configuration is read from ``ROCE_PG_*`` environment variables (see README).
"""
import os as _os
import sys as _sys

__version__ = "0.1.0"


# ---- loading the extension, checked against the torch it was built for -----
# setup.py compiles "ROCE_PG_BUILD_INFO|torch=<version>;...|" into _C. It is read
# from the file before the module is loaded: a build made for another torch
# usually fails to load with an undefined symbol, or loads and misbehaves later.

def _extension_path():
    """Path of the built _C module, or None if it has not been built."""
    import importlib.machinery

    for d in __path__:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            p = _os.path.join(d, "_C" + suffix)
            if _os.path.exists(p):
                return p
    return None


def build_info(path=None):
    """What the extension was built with, as a dict (torch, python, sanitize, ...),
    read from the .so without loading it; {} for a build that predates this record
    or when it is not built."""
    import mmap

    path = path or _extension_path()
    if not path:
        return {}
    marker = b"ROCE_PG_BUILD_INFO|"
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            i = m.find(marker)
            if i < 0:
                return {}
            j = m.find(b"|", i + len(marker))
            text = m[i + len(marker):j].decode("utf-8", "replace")
    except (OSError, ValueError):  # unreadable or empty file
        return {}
    return dict(kv.split("=", 1) for kv in text.split(";") if "=" in kv)


def _rebuild_hint(torch_public):
    return (f"Install the torch it was built for (pip install 'torch=={torch_public}'), or rebuild "
            f"roce_pg against the torch you have: `pip install --no-build-isolation .` in the roce "
            f"source tree (`bash scripts/setup.sh` in a checkout).")


def _torch_mismatch(built, running):
    """The error message when the build's torch differs from the running one, else None.
    Local version labels (+cu132, +cpu) are ignored: they name the same C++ API."""
    if not built or built.split("+")[0] == running.split("+")[0]:
        return None
    return (f"roce_pg's C++ extension was built for torch {built}, but this Python has torch "
            f"{running}. A PyTorch C++ extension works only with the torch version it was compiled "
            f"against. " + _rebuild_hint(built.split("+")[0]) +
            " (ROCE_PG_SKIP_TORCH_CHECK=1 tries to load it anyway.)")


def _load_extension():
    """Imports torch and _C (checking the build against the torch), registers "roce"."""
    global torch, dist, _C
    import torch
    import torch.distributed as dist

    path = _extension_path()
    if path is None:
        raise ImportError("roce_pg._C is not built. In the roce source tree run "
                          "`pip install --no-build-isolation .` (or `bash scripts/setup.sh`).")
    info = build_info(path)
    problem = _torch_mismatch(info.get("torch"), torch.__version__)
    if problem and _os.environ.get("ROCE_PG_SKIP_TORCH_CHECK") != "1":
        raise ImportError(problem)
    # The extension's classes derive from torch's c10d bindings: torch comes first.
    try:
        from . import _C
    except ImportError as e:
        built = info.get("torch") or "an unknown torch (a build older than this check)"
        hint = ""
        if "libibverbs" in str(e):
            hint = " libibverbs is missing: install rdma-core (Debian/Ubuntu: apt install libibverbs1 ibverbs-providers)."
        elif info.get("sanitize"):
            hint = (f" This is a sanitizer build (ROCE_PG_SANITIZE={info['sanitize']}): "
                    f"run python with LD_PRELOAD=$(gcc -print-file-name=libasan.so).")
        raise ImportError(
            f"cannot load roce_pg's C++ extension {path}: {e}. It was built for torch {built}; "
            f"this Python has torch {torch.__version__}.{hint} If the versions differ: "
            + _rebuild_hint((info.get("torch") or torch.__version__).split("+")[0])) from e


def _running_doctor():
    """True under `python -m roce_pg.doctor`: the doctor must run even when the
    extension does not load (it is the tool that says why), and its local checks
    do not need torch, which takes minutes to import in emulated VMs. It loads
    the extension itself when it needs it."""
    argv = getattr(_sys, "orig_argv", [])
    return any(a == "-mroce_pg.doctor" or (a == "-m" and b == "roce_pg.doctor")
               for a, b in zip(argv, argv[1:] + [""]))


if not _running_doctor():
    _load_extension()

__all__ = ["register", "rdma_ports", "build_info", "counters", "reset_counters", "straggler_report",
           "device_staging_stats",
           "trace", "dump_trace", "BACKEND_NAME"]

BACKEND_NAME = "roce"


def _create_backend(dist_backend_opts, backend_options):
    """Creator torch calls for every process group that uses roce."""
    opts = dist_backend_opts
    ranks = list(opts.global_ranks_in_group or [])
    global_rank = ranks[opts.group_rank] if ranks else opts.group_rank
    # torch's enable_reconfigure=True: the group has no members until its
    # first reconfigure (dist._reconfigure), so it joins nobody now.
    await_reconfigure = bool(getattr(opts, "enable_reconfigure", False))
    parent = None if await_reconfigure else _world_backend_to_derive_from(ranks, opts)
    if parent is not None:
        backend = _C.RoceBackend._from_parent(parent, opts.store, opts.group_rank, ranks, str(opts.group_id),
                                              opts.timeout)
    else:
        backend = _C.RoceBackend(opts.store, opts.group_rank, opts.group_size, opts.timeout, global_rank,
                                 near_pci=_rank_gpu_pci(), await_reconfigure=await_reconfigure)
    backend._set_trace_ranks(ranks or list(range(opts.group_size)))  # named in trace dumps
    _tell_torch_who_records(backend)
    devices = _devices_of_group_being_created()
    template = getattr(opts, "process_group", None)
    if template is None or not devices or set(devices.values()) != {BACKEND_NAME}:
        return backend  # shares the group with other backends: torch registers it
    return _named_group(backend, opts, template, devices)


def _rank_gpu_pci():
    """sysfs path of the GPU this rank computes on, for choosing the NICs
    nearest it ("" when unknown). Only when this process already uses CUDA
    (torch.cuda.set_device before init_process_group, as DDP jobs do):
    initializing CUDA here would break a CPU job's forked DataLoader workers."""
    try:
        if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
            return ""
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        bus, dev = getattr(props, "pci_bus_id", None), getattr(props, "pci_device_id", None)
        if bus is None or dev is None:
            return ""
        address = f"{getattr(props, 'pci_domain_id', 0):04x}:{bus:02x}:{dev:02x}.0"
        path = _os.path.realpath(f"/sys/bus/pci/devices/{address}")
        return path if _os.path.exists(path) else ""
    except Exception:  # noqa: BLE001 - no locality hint is no error
        return ""


def _world_backend_to_derive_from(ranks, opts):
    """The world group's roce backend when the group being created can form
    from its roster with no join of its own, else None.

    Every member decides alike: the world group is the same on every rank,
    ROCE_PG_SUBGROUPS (parent|join) was checked equal on every rank when
    the world formed, and the placement settings must be set alike anyway. The group name torch passes (opts.group_id) is the same
    on every member and names the subgroup's keys."""
    if len(ranks) < 2 or not getattr(opts, "group_id", None):
        return None
    try:
        world = dist.distributed_c10d._get_default_group()
    except (RuntimeError, ValueError):
        return None  # the world group itself is being created
    if world is None or world.size() < 2:
        return None
    try:
        backend = world._get_backend(torch.device("cpu"))
    except RuntimeError:
        return None
    if not isinstance(backend, _C.RoceBackend) or not backend._forms_subgroups():
        return None
    if world.size() != dist.get_world_size() or max(ranks) >= world.size():
        return None
    # Placement or transport settings changed since the world formed (tests
    # simulate machines per group; a job may force TCP for one group): the
    # parent's roster would not reflect them, so this group joins instead.
    if _C._placement_settings() != backend._placement_settings():
        return None
    return backend


def _tell_torch_who_records(backend):
    """Right after this creator returns, torch decides whether to attach its
    generic flight-recorder hook to the new group, skipping backends in
    _FR_SELF_RECORDING_BACKENDS (Gloo, NCCL: they record themselves). roce
    records every operation natively, so by default it joins that set and
    saves each call the hook's ~2 us; with ROCE_PG_TORCH_FR=hook, or roce's
    recorder off (ROCE_PG_TRACE_ENTRIES=0), it leaves it and torch's hook
    records the group, fed roce's completions. Decided per group, as torch
    reads the set per group. The set is torch's registrars' (Gloo's, NCCL's)
    and not public API: where a torch lacks it, torch's hook stays."""
    recorders = getattr(dist.distributed_c10d, "_FR_SELF_RECORDING_BACKENDS", None)
    if not isinstance(recorders, set):
        return
    if backend._records_natively():
        recorders.add(BACKEND_NAME)
    else:
        recorders.discard(BACKEND_NAME)


def _devices_of_group_being_created():
    """{device: backend name} of the group torch is creating, or None.

    Creators are not told whether they serve the whole group, so this is read
    from torch's group-creation function up the stack; if torch renames it, the
    answer is None and roce falls back to a plain backend (named "custom")."""
    frame = _sys._getframe(1)
    while frame is not None:
        config = frame.f_locals.get("backend_config")
        if frame.f_code.co_name == "_new_process_group_helper" and hasattr(config, "get_device_backend_map"):
            return dict(config.get_device_backend_map())
        frame = frame.f_back
    return None


def _named_group(backend, opts, template, devices):
    """A ProcessGroup named "roce" that holds the backend for `devices`.

    torch names the group of any out-of-tree backend "custom", which is what
    DDP logs as backend_name; returning our own group (a path torch supports
    for creators) names it "roce". What torch would otherwise do for the
    backend is done here: the TORCH_DISTRIBUTED_DEBUG=DETAIL checking wrapper,
    the bound device, registration for each device."""
    if dist.get_debug_level() == dist.DebugLevel.DETAIL and dist.is_gloo_available():
        backend = dist.distributed_c10d._create_process_group_wrapper(
            backend, opts.group_id, opts.store, opts.group_rank, opts.group_size, opts.timeout)
    pg = _C.RoceProcessGroup(template.get_group_store(), opts.group_rank, opts.group_size)
    if template.bound_device_id is not None:
        pg.bound_device_id = template.bound_device_id
    backend_type = dist.ProcessGroup.BackendType.CUSTOM
    pg._set_default_backend(backend_type)
    for device in devices:
        pg._register_backend(torch.device(device), backend_type, backend)
    return pg


def _device_types():
    """The device types roce serves: CPU, CUDA, and the PrivateUse1 device (an
    out-of-tree accelerator) under the name it was given, if it was renamed.
    Device tensors are staged through host memory with the device-generic
    stream API (docs/ACCELERATORS.md), which any of them provides."""
    devices = ["cpu", "cuda"]
    name = torch._C._get_privateuse1_backend_name()
    if name != "privateuseone":
        devices.append(name)
    return devices


def register():
    """Registers "roce" with torch.distributed; calling it again is harmless,
    and adds the PrivateUse1 device if it was renamed since."""
    if "_C" not in globals():  # under `python -m roce_pg.doctor`: loaded on demand
        _load_extension()
    devices = _device_types()
    registered = BACKEND_NAME.upper() in getattr(dist.Backend, "_plugins", {})
    if registered and set(devices) <= set(dist.Backend.backend_capability.get(BACKEND_NAME, [])):
        return
    dist.Backend.register_backend(BACKEND_NAME, _create_backend, extended_api=True, devices=devices)


def _roce_backend(group, device="cpu", caller="roce_pg.counters"):
    group = dist.group.WORLD if group is None else group
    if group is None:
        raise RuntimeError(f"{caller}: no process group; call torch.distributed.init_process_group('roce') "
                           "first or pass group=")
    backend = group._get_backend(torch.device(device))
    if not isinstance(backend, _C.RoceBackend):
        raise ValueError(f"{caller}: this group's {device} backend is {type(backend).__name__}, not roce; "
                         f"pass a group created with backend='roce'")
    return backend


def counters(group=None):
    """This rank's traffic counters for `group` (default: the world group), a dict:
    bytes_sent_shm (payload posted to peers on this machine, incl. the slots of
    the shared-memory collectives), bytes_sent_net (payload posted to the network transport,
    TCP or verbs), bytes_copied (bytes the transports memcpy'd into or out of
    staging: shared-memory rings and slots, verbs staging, early-arrival buffers),
    ops (operations begun), sends (messages posted: an algorithm's rounds),
    blocked_waits (times a wait found nothing to do for ROCE_PG_SPIN_US and
    blocked in poll() on the sockets / wake-up eventfd / doorbell), inline_ops
    (collectives run on the calling thread instead of the progress thread),
    bytes_zero_copy (verbs: payload the NIC read from / wrote into the user's
    buffer directly, counted by the sender), bytes_written (one-sided window puts this rank
    wrote into peers' memory by RDMA WRITE, no receive on their side), bytes_read (window gets
    this rank read out of peers' memory by RDMA READ), window_puts_served (puts
    of peers on other machines that this rank's window services received as messages: TCP, or
    a window verbs could not expose), window_signals_served (likewise for signals: over verbs a
    signal is an RDMA WRITE of the sender's count into the owner's window), registrations (verbs: ibv_reg_mr
    calls of the registration cache), eager_sends (verbs: messages of at most
    ROCE_PG_IB_EAGER_MAX_BYTES sent without waiting for the receiver's RTR), staging_waits (verbs: times
    posting a copied chunk found the staging pool the process's groups share empty; counted per attempt),
    landing_waits (verbs: times a receive needed more landing slots for a peer than it held and found
    no open slot of the process's landing pool free - the peer goes on through the credits it holds,
    at least its reserved slot; counted per attempt),
    bytes_reduced_on_device (device
    tensors: staged rows reduced on their device, ROCE_PG_DEVICE_REDUCE), device_bytes_staged (device tensor
    bytes copied through pinned host buffers), device_bytes_direct (device tensor bytes handed to the verbs
    transport itself: GPUDirect RDMA, ROCE_PG_GPUDIRECT), device_bytes_local (GPUDirect: bytes of a rank's own
    block that allgather, gather, scatter and all-to-all copied within the rank, on the device),
    device_waits_notified (waits for device copies and reductions that slept until a host function queued
    behind them woke the progress thread: CUDA, or a device that declared one with declare_device_host_func),
    device_wait_naps (naps of such waits on devices without host functions, which poll), worker_slices (slices of local copies
    and reductions that worker-pool threads ran, not the calling thread; ROCE_PG_WORKERS). Monotonic until
    reset_counters(), except
    three gauges: cached_mrs (the memory registrations the verbs cache holds now), connections (network peers
    connected: TCP sockets, or verbs peers with queue pairs; peers are connected when first needed) and
    registered_bytes (what the verbs transport registered for this group's own buffers: its connections'
    control rings; not user tensors, and not the landing and staging pools, which the process's groups
    share: _C._runtime_stats()["verbs_landing_bytes"] and ["verbs_staging_bytes"]).
    Also what the process refused of what reached it over the network (the
    same in every group of the process, never reset): net_unauthenticated
    (connections whose head was not signed with the job secret), net_refused_busy
    (connections closed unread: too many heads pending from their address, or in
    all), net_links_refused (process links refused: no name in time, too many,
    records before the name, a name that does not fit the address it came from),
    net_records_dropped (lifeline records dropped over the parking budget),
    net_records_misrouted (lifeline records naming a rank of another process
    than the link's), net_records_forged (process-link records not signed with
    the job secret, each of which closed its link) and net_streams_refused (TCP connections ended because
    the peer broke the stream protocol: a corrupted chunk, a stream past its
    flow-control window, too much for groups not created here)."""
    return _roce_backend(group)._counters()


def straggler_report(group=None, reset=True):
    """Who keeps the others waiting, while nothing fails. Collective: every rank
    of `group` (default: the world group) calls it. Each rank counts the time
    it spends inside collectives (start to end, counters collective_ns and
    collectives_timed); a rank that arrives late spends little time inside,
    because the others are already there, and the ranks it keeps waiting spend
    much. Over the window since the last report or reset_counters(), returns a dict:
    "ranks" (per rank: inside_s, window_s, collectives, inside_share,
    wait_ms_per_collective), "straggler" (the rank whose share inside is less
    than half the others' median and who costs them at least 0.1 ms per
    collective, else None) and "text" (one line). reset=True starts a new
    window afterwards (on every rank), zeroing only collective_ns,
    collectives_timed and window_ns, not the traffic counters."""
    group = dist.group.WORLD if group is None else group
    backend = _roce_backend(group, caller="roce_pg.straggler_report")
    c = backend._counters()
    mine = torch.tensor([c["collective_ns"], c["window_ns"], c["collectives_timed"]], dtype=torch.int64)
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(every, mine, group=group)
    if reset:
        backend._reset_straggler_window()  # the traffic counters are left alone
    ranks = []
    for r, (inside, window, n) in enumerate(t.tolist() for t in every):
        ranks.append({"rank": r, "inside_s": inside / 1e9, "window_s": window / 1e9, "collectives": n,
                      "inside_share": inside / window if window else 0.0,
                      "wait_ms_per_collective": inside / n / 1e6 if n else 0.0})
    return {"ranks": ranks, **_judge_stragglers(ranks)}


def _judge_stragglers(ranks):
    if len(ranks) < 2 or not all(r["collectives"] for r in ranks):
        return {"straggler": None, "text": "no straggler: too few ranks or collectives in the window"}
    low = min(ranks, key=lambda r: r["inside_share"])
    others = sorted(r["inside_share"] for r in ranks if r is not low)
    median = others[len(others) // 2]
    others_wait = sorted(r["wait_ms_per_collective"] for r in ranks if r is not low)[len(others) // 2]
    cost_ms = others_wait - low["wait_ms_per_collective"]
    if low["inside_share"] < 0.5 * median and cost_ms >= 0.1:
        return {"straggler": low["rank"],
                "text": f"rank {low['rank']} keeps the others waiting: it spends {100 * low['inside_share']:.0f}% "
                        f"of the last {low['window_s']:.1f} s inside collectives, the others "
                        f"{100 * median:.0f}% (median), {cost_ms:.2f} ms more per collective"}
    return {"straggler": None,
            "text": f"no straggler: every rank spends a similar share of its time inside collectives "
                    f"({100 * low['inside_share']:.0f}% to {100 * max(r['inside_share'] for r in ranks):.0f}%)"}


def reset_counters(group=None):
    """Sets this rank's counters for `group` to zero (other ranks' are untouched)."""
    _roce_backend(group)._reset_counters()


def _wait_engine_parked(group=None, timeout=10.0):
    """Waits until `group`'s progress thread sleeps with nothing queued or in
    flight, the state in which a small synchronous collective runs inline on the
    caller's thread; returns False if that takes longer than `timeout` seconds.
    For tests and benchmarks that must observe the inline path: a call issued
    right after a queued one completed may find the thread not yet asleep."""
    from datetime import timedelta

    return _roce_backend(group)._wait_engine_parked(timedelta(seconds=timeout))


def window_get(window, out, src_rank, offset=0, async_op=False):
    """Reads ``out.numel()`` elements of ``src_rank``'s window, from element
    ``offset`` on, into ``out`` (a contiguous CPU tensor of the window's
    dtype): a copy from the mapping for a rank on this machine, a request the
    owner's progress thread answers for one on another. It sees every put
    this rank made to ``src_rank`` before it. torch's ``Window`` has put and
    no get; ``window`` is what ``dist._new_window`` returned on a roce group.
    Returns a Work (completed already when ``async_op`` is False)."""
    return _C._window_get(window, out, src_rank, offset, async_op)


def declare_device_memory(device, path="pointer", buffer_id=0):
    """Declares how the NIC reaches memory of `device` (a device type such as
    "cuda" or a renamed PrivateUse1 backend): "pointer" (ibv_reg_mr takes its
    addresses, as with a peer-memory kernel module) or "staged" (never hand it
    to the NIC). Overrides roce's detection; every rank must declare alike.
    Data-movement calls over verbs then use GPUDirect RDMA (docs/ACCELERATORS.md).
    `buffer_id`: the address of the device's C function
    `uint64_t f(const void* p, int device_index)` returning the id of the
    allocation holding p (0 if unknown), as CUDA's buffer id: a registration
    is reused only while the memory behind it is the same allocation."""
    from . import _C
    _C._declare_device_memory(device, path, int(buffer_id))


def declare_device_host_func(device, launch):
    """Declares how roce learns that work queued on a `device` stream has run
    (a device type such as a renamed PrivateUse1 backend; CUDA needs none):
    `launch` is the address of the device's C++ function
    `bool f(const c10::Stream& s, void (*fn)(void*), void* data)` that queues
    fn(data) to run on a host thread once the work queued on s before it has
    run (cuLaunchHostFunc's contract). roce's waits for device copies then
    sleep until woken instead of polling. 0 withdraws it."""
    from . import _C
    _C._declare_host_func(device, int(launch))


def device_memory_path(device):
    """What `device`'s side allows GPUDirect RDMA (docs/ACCELERATORS.md): a dict with dmabuf (its memory
    exports as dma-bufs) and pointer (ibv_reg_mr takes its pointers: a peer-memory module, or declared), each
    with a *_why, and flush (what the NIC wrote is flushed before the device reads it: CUDA GPUs that do not
    order NIC writes, before compute capability 9.0) with flush_why. A group uses dma-buf where its NIC's provider registers dma-bufs too, else peer memory, else
    stages; the path a group took is in its log (ROCE_PG_DEBUG=INFO) and `python -m roce_pg.doctor`."""
    from . import _C
    return _C._device_memory_path(device)


def device_staging_stats(group=None, device="cpu"):
    """The host buffers through which `group` (default: the world group) stages
    device tensors, a dict: allocations (buffers taken from the device's host
    allocator), reuses (calls served from the cache), cached_bytes and blocks
    (every buffer held now, in use or kept for reuse; bounded by
    ROCE_PG_DEVICE_STAGING_CACHE_BYTES plus what operations in flight use;
    the device's own host allocator may keep more pinned memory cached),
    pinned (False if a device type had no pinned host allocator and pageable
    memory was used). `device`: the device type whose backend to ask, for
    groups where roce serves the accelerator only ("cpu:gloo,cuda:roce")."""
    return _roce_backend(group, device)._device_staging_stats()


def trace(group=None, device="cpu"):
    """This rank's flight recorder for `group` (default: the world group): the
    last ROCE_PG_TRACE_ENTRIES operations (collectives and point-to-point),
    oldest first, as dicts: record_id (1, 2, ... over the group's life), seq
    (the operation's number, as in error messages "allreduce #12"),
    collective_seq / p2p_seq (collectives / point-to-point operations issued
    so far, this one included), op, op_type (c10d.OpType value), is_p2p,
    algorithm (the one chosen, e.g. "shm", "rd", "ring"; None where none is
    chosen), peer (p2p peer or root; None for recv from any source and
    unrooted collectives), tag, bytes (the per-rank payload the algorithms
    see), in_elems (bytes / element size) and out_elems (elements of the
    output tensors), in_dtype / out_dtype (c10 names: "Float", ...),
    enqueue_ns / start_ns / end_ns (time.monotonic_ns() clock; None until
    then), timeout_ms, state ("scheduled", "started", "completed" or
    "failed"), inline (ran on the calling thread) and error (the failure's
    message, else None). Empty when ROCE_PG_TRACE_ENTRIES=0."""
    return _roce_backend(group, device, "roce_pg.trace")._trace()


def dump_trace(path=None, group=None, device="cpu"):
    """This rank's flight recorder for `group` (default: the world group) in
    PyTorch's flight-recorder dump layout (what torch's
    `_dump_fr_trace_json` returns: version, pg_config, pg_status, entries), so
    torch's trace tools read it; returns it as a dict and, given `path`,
    writes it there: JSON if the name ends in .json, else a pickle (as
    torch's `_dump_fr_trace`). Entries carry no stack frames and sizes as
    element counts ([[n]]); a failed operation is retired without being
    completed, with roce's reason in "error"; "algorithm", "peer", "tag" and
    "bytes" are roce's additions. ROCE_PG_TRACE_DUMP=PREFIX also writes the
    JSON, as PREFIX<global rank>_<group name>.json, when an operation first
    breaks the group (timeout, dead peer, abort)."""
    import json

    dump = json.loads(_roce_backend(group, device, "roce_pg.dump_trace")._trace_dump_json())
    if path is not None:
        path = _os.fspath(path)
        if path.endswith(".json"):
            with open(path, "w") as f:
                json.dump(dump, f)
        else:
            import pickle

            with open(path, "wb") as f:
                pickle.dump(dump, f)
    return dump


def rdma_ports():
    """RDMA ports libibverbs sees on this machine (empty without rdma-core devices)."""
    return _C.rdma_ports()


if not _running_doctor():
    register()
