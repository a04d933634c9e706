"""Training worker for the elastic-restart tests (tests/test_elastic.py).

Run by torchrun (`torchrun ... tests/elastic_workers.py`), or with
ELASTIC_MODE=reinit by the test's own launcher (app-level re-init). Every
allreduce has an exact expected result computed here from the ranks and the
world size alone, and each incarnation of each rank leaves a JSON record under
ELASTIC_OUT, so the test judges the run from files, whatever the launcher says.

Environment (all optional but ELASTIC_OUT):
  ELASTIC_OUT          directory for the records
  ELASTIC_BACKEND      process-group backend (default roce; gloo validates the harness)
  ELASTIC_STEPS        allreduce steps per incarnation (per round in reinit mode)
  ELASTIC_KILL_RANK, ELASTIC_KILL_STEP
                       that rank SIGKILLs itself at that step, in the first attempt
                       (TORCHELASTIC_RESTART_COUNT 0) or, in reinit mode, in round
                       ELASTIC_KILL_ROUND; it first writes kill.json (wall time)
  ELASTIC_SLOW_EXIT_S  survivors take this long to exit after SIGTERM, and in the
                       first attempt a survivor whose collective failed waits for
                       that SIGTERM instead of exiting (workers slow to go away)
  ELASTIC_LEAVE_STEP   local rank 0 SIGTERMs its own torchrun agent at this step
                       (the agent's machine leaves the job); writes leave.json
  ELASTIC_UNTIL_WORLD  an incarnation with a smaller world keeps training until
                       its agent stops it (a machine is expected to join)
  ELASTIC_PG_TIMEOUT_S group timeout (default 60), so a stuck init fails in bounded time
  ELASTIC_ROUNDS, ELASTIC_ROUND_START, ELASTIC_KILL_ROUND
                       reinit mode: rounds of init/allreduce/destroy; a replacement
                       process starts at ELASTIC_ROUND_START
  ELASTIC_ROUND_PREFIX reinit mode: 1 = each round on its own store prefix
The roce layout comes from the usual ROCE_PG_* variables (FORCE_NETWORK,
NET_TRANSPORT, SIM_NODE, SIM_RANKS_PER_NODE), inherited from the launcher.
"""
import json
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

T_START = time.time()  # before `import torch`: when this process began

# Elements of the float64 tensor: 320 KB, large enough for the pipelined and
# multi-machine allreduce algorithms, not only the small-message path.
FLOAT_ELEMS = 40_000
INT_ELEMS = 8


def env_int(name, default=None):
    value = os.environ.get(name)
    return default if value in (None, "") else int(value)


def expected_values(world, salt):
    """Exact allreduce(SUM) results of one step: rank r contributes (r+1)*(salt+1)
    (plus i/4 at float element i), so the sum is (salt+1)*W(W+1)/2 (+ W*i/4).
    Every value is a multiple of 1/4 far below 2**50: float64 sums are exact in
    any order, so any correct algorithm gives these bits."""
    base = (salt + 1) * world * (world + 1) // 2
    return base, 0.25 * world  # int elements = base; float element i = base + i * slope


def expected_checksum(world, salts):
    """Sum of every element of every result over the given salts (steps)."""
    total = 0.0
    for salt in salts:
        base, slope = expected_values(world, salt)
        total += (INT_ELEMS + FLOAT_ELEMS) * base + slope * FLOAT_ELEMS * (FLOAT_ELEMS - 1) / 2
    return total


class Record:
    """One JSON file per (incarnation, rank), rewritten as training goes on
    (atomically, so the test never reads half a file)."""

    def __init__(self, out, name, **fields):
        self.path = Path(out) / f"{name}.json"
        self.data = {"pid": os.getpid(), "t_start": T_START, "status": "starting", "steps_done": 0,
                     "checksum": 0.0, **fields}

    def save(self, **fields):
        self.data.update(fields)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data))
        os.replace(tmp, self.path)


def mark(out, name, **fields):
    """A one-off event file (kill.json, leave.json) with its wall-clock time."""
    Path(out, f"{name}.json").write_text(json.dumps({"t": time.time(), "pid": os.getpid(), **fields}))


def allreduce_step(dist, torch, rank, world, salt):
    """One int64 and one float64 allreduce, each checked exactly; returns their element sum."""
    t_int = torch.full((INT_ELEMS,), (rank + 1) * (salt + 1), dtype=torch.int64)
    t_flt = torch.arange(FLOAT_ELEMS, dtype=torch.float64) * 0.25 + (rank + 1) * (salt + 1)
    dist.all_reduce(t_int)
    dist.all_reduce(t_flt)
    base, slope = expected_values(world, salt)
    want_flt = torch.arange(FLOAT_ELEMS, dtype=torch.float64) * slope + base
    if not (torch.equal(t_int, torch.full_like(t_int, base)) and torch.equal(t_flt, want_flt)):
        bad = (t_flt != want_flt).nonzero()
        raise AssertionError(f"wrong allreduce at salt {salt} (world {world}): int {t_int[:2].tolist()} "
                             f"want {base}; float wrong at {bad.numel()} elements, first {bad[:1].tolist()}")
    return float(t_int.sum()) + float(t_flt.sum())


def install_sigterm(rec):
    """The agent stops workers with SIGTERM. Record how far this one got; with
    ELASTIC_SLOW_EXIT_S, linger that long first (a worker slow to exit)."""
    linger = float(os.environ.get("ELASTIC_SLOW_EXIT_S", "0"))

    def on_term(signum, frame):
        time.sleep(linger)
        rec.save(status="terminated", t_exit=time.time())
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    return linger


def train():
    """One incarnation under torchrun: init, ELASTIC_STEPS exact allreduces, destroy."""
    out = os.environ["ELASTIC_OUT"]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    attempt = env_int("TORCHELASTIC_RESTART_COUNT", 0)
    steps = env_int("ELASTIC_STEPS", 50)
    victim = env_int("ELASTIC_KILL_RANK") == rank and attempt == 0
    kill_step = env_int("ELASTIC_KILL_STEP", 20)
    leave_step = env_int("ELASTIC_LEAVE_STEP") if env_int("LOCAL_RANK") == 0 else None
    until_world = env_int("ELASTIC_UNTIL_WORLD", 0)
    rec = Record(out, f"a{attempt}_w{world}_r{rank}_p{os.getpid()}", mode="torchrun", attempt=attempt,
                 world=world, rank=rank, group_rank=env_int("GROUP_RANK"), steps=steps,
                 master_port=env_int("MASTER_PORT"), run_id=os.environ.get("TORCHELASTIC_RUN_ID"),
                 sim_node=os.environ.get("ROCE_PG_SIM_NODE"))
    linger = install_sigterm(rec)
    rec.save()
    import torch
    import torch.distributed as dist

    try:
        dist.init_process_group(os.environ.get("ELASTIC_BACKEND", "roce"),
                                timeout=timedelta(seconds=env_int("ELASTIC_PG_TIMEOUT_S", 60)))
        rec.save(status="running", t_init=time.time())
        step, checksum, deadline = 0, 0.0, time.monotonic() + 120
        # A smaller world than ELASTIC_UNTIL_WORLD trains until its agent replaces it.
        while step < steps or (world < until_world and time.monotonic() < deadline):
            if victim and step == kill_step:
                mark(out, "kill", rank=rank, step=step, attempt=attempt)
                os.kill(os.getpid(), signal.SIGKILL)
            if step == leave_step:
                mark(out, "leave", rank=rank, step=step, agent=os.getppid())
                os.kill(os.getppid(), signal.SIGTERM)
            checksum += allreduce_step(dist, torch, rank, world, step)
            step += 1
            rec.data.update(checksum=checksum, steps_done=step)  # one call: on_term sees both or neither
            if step == 1:
                rec.save(t_first=time.time())
            if until_world and world < until_world:
                time.sleep(0.1)
        if world < until_world:
            raise AssertionError(f"world {world} never grew to {until_world}")
        dist.destroy_process_group()
        rec.save(status="done", t_end=time.time(), expected_checksum=expected_checksum(world, range(steps)))
    except Exception as e:
        rec.save(status="error", error=f"{type(e).__name__}: {e}"[:2000], t_error=time.time())
        if linger and attempt == 0:
            # A survivor of the kill, slow to exit: wait for the agent's SIGTERM
            # (on_term exits). A later attempt's failure exits at once, or
            # nobody would ever exit and the agent would never notice it.
            time.sleep(300)
        raise


def reinit():
    """App-level recovery on one store: ELASTIC_ROUNDS rounds of init_process_group,
    a few exact allreduces and destroy_process_group, like a trainer that rebuilds
    its group after a failure without being restarted. The store is the launcher's
    (env:// with TORCHELASTIC_USE_AGENT_STORE=True: a client, like torchrun's
    workers). A rank whose round fails (a peer died) records the error, destroys
    the group and goes on with the next round; the launcher starts a replacement
    for the dead rank (same RANK, ELASTIC_ROUND_START = the next round)."""
    out = os.environ["ELASTIC_OUT"]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    steps = env_int("ELASTIC_STEPS", 3)
    first = env_int("ELASTIC_ROUND_START", 0)
    kill_round = env_int("ELASTIC_KILL_ROUND") if env_int("ELASTIC_KILL_RANK") == rank and first == 0 else None
    kill_step = env_int("ELASTIC_KILL_STEP", 1)
    import torch
    import torch.distributed as dist

    for rnd in range(first, env_int("ELASTIC_ROUNDS", 10)):
        rec = Record(out, f"round{rnd}_r{rank}_p{os.getpid()}", mode="reinit", round=rnd, world=world,
                     rank=rank, steps=steps, replacement=first > 0)
        try:
            timeout = timedelta(seconds=env_int("ELASTIC_PG_TIMEOUT_S", 60))
            if os.environ.get("ELASTIC_ROUND_PREFIX") == "1":
                # The application scopes each round's keys itself (harness check:
                # what any backend passes); by default every round shares torch's prefix.
                store = dist.PrefixStore(f"round{rnd}", dist.TCPStore(
                    os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout))
                dist.init_process_group(os.environ.get("ELASTIC_BACKEND", "roce"), store=store, rank=rank,
                                        world_size=world, timeout=timeout)
            else:
                dist.init_process_group(os.environ.get("ELASTIC_BACKEND", "roce"), timeout=timeout)
            rec.save(status="running", t_init=time.time())
            for step in range(steps):
                if rnd == kill_round and step == kill_step:
                    mark(out, "kill", rank=rank, step=step, round=rnd)
                    os.kill(os.getpid(), signal.SIGKILL)
                rec.data["checksum"] += allreduce_step(dist, torch, rank, world, rnd * 100 + step)
                rec.data["steps_done"] = step + 1
                if step == 0:
                    rec.data["t_first"] = time.time()
            rec.save(status="done", t_end=time.time(),
                     expected_checksum=expected_checksum(world, [rnd * 100 + s for s in range(steps)]))
        except Exception as e:
            rec.save(status="error", error=f"{type(e).__name__}: {e}"[:2000], t_error=time.time())
            if rnd != env_int("ELASTIC_KILL_ROUND"):
                raise  # only the round of the kill may fail; anything else ends this rank at once
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit((reinit if os.environ.get("ELASTIC_MODE") == "reinit" else train)())
