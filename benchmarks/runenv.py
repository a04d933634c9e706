"""What both benchmarks need from their surroundings: the world layout torchrun
describes, the backends this torch build can run, the roce settings in force,
and a progress line for runs long enough to wonder about."""
import os
import sys
import time

import torch
import torch.distributed as dist


def world_layout():
    """(world size, machines, processes per machine) from torchrun's variables.

    GROUP_WORLD_SIZE is the number of torchrun agents (one per machine);
    without it (a plain launcher) the machines are inferred from the local
    world size, assuming every machine runs the same number of ranks.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    nodes = int(os.environ.get("GROUP_WORLD_SIZE", "0")) or max(1, world // per_node)
    return world, nodes, per_node


def layout_label(ranks, per_node):
    """PyTorch's ddp benchmark notation: `2M/8G` = 2 machines x 8 processes each."""
    return f"{-(-ranks // per_node)}M/{min(ranks, per_node)}G"


def roce_settings():
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("ROCE_PG_")}


def check_backends(names, device):
    """Fails early, on every rank, with the reason a backend cannot run here."""
    if len(set(names)) != len(names):
        raise SystemExit(f"name each backend once (results are kept per backend): {','.join(names)}")
    why = {}
    for name in names:
        if name == "roce":
            import roce_pg  # noqa: F401  (registers "roce"; torch >= 2.15 also finds it by name)
        elif name == "nccl" and (device != "cuda" or not dist.is_nccl_available()):
            why[name] = "needs --device cuda and a torch build with NCCL"
        elif name == "mpi" and not dist.is_mpi_available():
            why[name] = "this torch build has no MPI support (build torch with MPI and launch with mpirun)"
        elif name not in ("roce", "gloo", "nccl", "mpi"):
            why[name] = "unknown backend (roce, gloo, nccl, mpi)"
    if why:
        raise SystemExit("; ".join(f"backend {k}: {v}" for k, v in why.items()))


def init_coordination():
    """The default group, used only for metadata (timings, checks, barriers):
    Gloo, so the backend being measured never carries the bookkeeping."""
    dist.init_process_group("gloo")
    return dist.group.WORLD


def config_lines(backends, device):
    world, nodes, per_node = world_layout()
    lines = [f"* PyTorch version: {torch.__version__}",
             f"* Backends: {','.join(backends)}",
             f"* World: {world} processes = {nodes} machine(s) x {per_node} ({device})"]
    if device == "cuda":
        lines.append(f"* CUDA version: {torch.version.cuda}")
    settings = roce_settings()
    lines.append("* ROCE_PG_*: " + (" ".join(f"{k}={v}" for k, v in settings.items()) or "(defaults)"))
    return lines


class Progress:
    """One status line on rank 0's stderr: rewritten in place on a terminal,
    a new line every few seconds in a log (where \\r would pile up)."""

    def __init__(self, every_s=5.0):
        self.on = dist.get_rank() == 0
        self.tty = sys.stderr.isatty()
        self.every_s = every_s
        self.last = time.monotonic()  # in a log, say nothing for runs shorter than every_s

    def update(self, text):
        if not self.on:
            return
        now = time.monotonic()
        if self.tty:
            sys.stderr.write("\r\033[K" + text)
        elif now - self.last >= self.every_s:
            sys.stderr.write(text + "\n")
            self.last = now
        sys.stderr.flush()

    def clear(self):
        if self.on and self.tty:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
