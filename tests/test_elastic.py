"""Elastic restarts on one store: a group formed again after a failure.

torchrun's agent keeps one TCPStore for the whole job (torch 2.15, c10d
rendezvous, --standalone included): every restart's workers get the same
MASTER_ADDR:MASTER_PORT, no per-attempt prefix, and the default group's keys
land under the same "default_pg/0//cpu//" prefix each time, next to the dead
attempt's keys. The same holds for an application that calls
destroy_process_group() and init_process_group() again on one store. These
tests launch the real thing and judge it from the records the workers
(tests/elastic_workers.py) leave: every incarnation's allreduces must have
exact results for the world size it had, and the incarnation after the
failure must complete. Each prints the time from the failure to the first
allreduce completed after it.

* test_restart_after_sigkill: 3 local ranks, rank 1 SIGKILLs itself at step
  20 of 50, --max-restarts 1; over shared memory, over forced TCP, and with
  survivors that take 5 s to exit after SIGTERM;
* test_reinit_on_one_store: 3 ranks on the test's own store rebuild their
  group 10 times; rank 1 dies mid-round and a fresh process replaces it;
* test_membership_change: two torchrun agents on this host, each a simulated
  machine of 2 ranks (--nnodes 1:2): one leaves (world 4, then 2), or joins
  late (world 2, then 4).

ELASTIC_TEST_BACKEND=gloo runs the same with Gloo, and
ELASTIC_TEST_FRESH_STORE=1 gives every incarnation fresh keys
(TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: each rendezvous round gets a new store
hosted by its rank 0; the re-init test prefixes each round's keys): Gloo
passes reliably only that way, which validates the harness. Every launch has a
wall limit (ELASTIC_TEST_WALL_S, 180 s; a pass takes 5-25 s): a hang is
killed, with every worker, and fails the test with the workers' last lines.
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .elastic_workers import expected_checksum
from .support.layouts import LAYOUTS, TCP
from .support.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
WORKER = str(ROOT / "tests" / "elastic_workers.py")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
BACKEND = os.environ.get("ELASTIC_TEST_BACKEND", "roce")
# Fresh keys for every incarnation: torchrun gives each rendezvous round a new
# store (hosted by its rank 0), and the re-init test puts each round under a
# prefix of its own.
FRESH_STORE = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "ELASTIC_ROUND_PREFIX": "1"}
WALL_S = float(os.environ.get("ELASTIC_TEST_WALL_S", "180"))
STEPS, KILL_STEP, VICTIM = 50, 20, 1
SLOW_EXIT_S = 5


def kill_marked(marker):
    """SIGKILLs every process whose environment holds `marker` (a test's
    ELASTIC_OUT=...): what the test launched and everything that started,
    orphans included. torchrun puts each worker in a session of its own, so
    killing the launcher's process group would not reach them."""
    needle = marker.encode() + b"\0"
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if needle in f.read():
                        os.kill(int(entry), signal.SIGKILL)
            except OSError:
                pass  # gone, or not ours to read


class Job:
    """The processes of one test (torchrun agents or bare ranks), their logs and
    their records directory; fails the test with all of it on any problem."""

    def __init__(self, tmp_path, env):
        self.out = tmp_path / "records"
        self.out.mkdir(exist_ok=True)
        self.logs = tmp_path
        # A group timeout of 60 s: a stuck init fails the test in bounded time
        # instead of torch's 30 minutes. A healthy one takes a second, but its
        # ranks start together and each imports torch first: 3-10 s on a busy
        # 2-core machine, over 30 s seen with a Soft-RoCE VM running beside.
        self.env = {**os.environ, "ELASTIC_OUT": str(self.out), "ELASTIC_BACKEND": BACKEND,
                    "ELASTIC_PG_TIMEOUT_S": "60", "PYTHONUNBUFFERED": "1", **env}
        if os.environ.get("ELASTIC_TEST_FRESH_STORE") == "1":
            self.env.update(FRESH_STORE)
        self.procs = {}
        self.deadline = time.monotonic() + WALL_S

    def start(self, name, cmd, **env):
        log = open(self.logs / f"{name}.log", "w")
        self.procs[name] = subprocess.Popen(cmd, cwd=ROOT, env={**self.env, **env}, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

    def wait(self, *names):
        """Exit codes of the named processes (all by default); past the wall limit, kills everything and fails."""
        names = names or tuple(self.procs)
        self.wait_for("the processes to exit", lambda: all(self.procs[n].poll() is not None for n in names))
        return {n: self.procs[n].returncode for n in names}

    def wait_for(self, what, predicate):
        while not predicate():
            if time.monotonic() > self.deadline:
                self.fail(f"waited {WALL_S:.0f} s for {what}: killed everything")
            time.sleep(0.2)

    def records(self):
        recs = []
        for path in sorted(self.out.glob("*.json")):
            try:
                rec = json.loads(path.read_text())
            except (OSError, ValueError):
                continue  # being replaced right now
            if "mode" in rec:  # not an event (kill.json, leave.json)
                recs.append({"file": path.stem, **rec})
        return recs

    def event(self, name):
        path = self.out / f"{name}.json"
        return json.loads(path.read_text()) if path.exists() else None

    def kill(self):
        kill_marked(f"ELASTIC_OUT={self.out}")

    def fail(self, msg):
        self.kill()
        lines = [f"[{BACKEND}] {msg}", "records:"]
        for r in self.records():
            lines.append(f"  {r['file']}: {r['status']} steps {r['steps_done']}"
                         + (f" error {r['error'][:300]}" if r.get("error") else ""))
        for name, p in self.procs.items():
            tail = (self.logs / f"{name}.log").read_text(errors="replace").splitlines()[-40:]
            lines += [f"--- {name} (exit {p.returncode}), last lines:"] + tail
        pytest.fail("\n".join(lines), pytrace=False)

    def expect(self, cond, msg):
        if not cond:
            self.fail(msg)


@pytest.fixture
def make_job(tmp_path):
    """make a Job; whatever it launched is killed when the test ends, however it ends."""
    jobs = []

    def make(env):
        jobs.append(Job(tmp_path, env))
        return jobs[-1]

    yield make
    for j in jobs:
        j.kill()


def exact(rec):
    """The record's checksum is the exact one for the steps it completed (each step
    was also checked element by element in the worker)."""
    salts = range(rec["steps_done"]) if rec["mode"] == "torchrun" else \
        [rec["round"] * 100 + s for s in range(rec["steps_done"])]
    return rec["checksum"] == expected_checksum(rec["world"], salts)


def check_incarnation(job, recs, world, what, complete=True):
    """Every rank of an incarnation left one record with exact results; complete:
    all steps done, else at least one."""
    ranks = sorted(r["rank"] for r in recs)
    job.expect(ranks == list(range(world)), f"{what}: records of ranks {ranks}, expected 0..{world - 1}")
    for r in recs:
        done = r["status"] == "done" and r["steps_done"] == r["steps"] if complete else r["steps_done"] > 0
        job.expect(done and exact(r), f"{what}: rank {r['rank']} {r['status']} after {r['steps_done']} steps, "
                   f"checksum {r['checksum']} (exact: {exact(r)}) {r.get('error', '')}")


def report(capsys, what, seconds):
    with capsys.disabled():
        print(f"\n[{BACKEND}] {what}: {seconds:.2f} s")


KILL_CASES = {
    "shm": {},
    "tcp": LAYOUTS["net3"][1],
    "slow_exit": {"ELASTIC_SLOW_EXIT_S": str(SLOW_EXIT_S)},
}


@pytest.mark.parametrize("case", KILL_CASES)
def test_restart_after_sigkill(case, make_job, capsys):
    job = make_job({"ELASTIC_STEPS": str(STEPS), "ELASTIC_KILL_RANK": str(VICTIM),
                    "ELASTIC_KILL_STEP": str(KILL_STEP), **KILL_CASES[case]})
    job.start("torchrun", TORCHRUN + ["--standalone", "--nproc-per-node", "3", "--max-restarts", "1", WORKER])
    rc = job.wait()["torchrun"]
    kill = job.event("kill")
    job.expect(kill is not None, "rank 1 never reached its kill step in attempt 0")
    job.expect(rc == 0, f"torchrun exited {rc}")
    recs = job.records()
    second = [r for r in recs if r["attempt"] == 1]
    check_incarnation(job, second, 3, "attempt 1")
    survivors = [r for r in recs if r["attempt"] == 0 and r["rank"] != VICTIM]
    job.expect(len(survivors) == 2, f"attempt 0: records of survivors {[r['rank'] for r in survivors]}")
    for r in survivors:
        job.expect(r["steps_done"] >= KILL_STEP and exact(r), f"attempt 0 rank {r['rank']}: {r}")
    if case == "slow_exit":
        # The survivors really lingered, and the agent waited for them: the next
        # attempt's processes started after they exited.
        exits = [r.get("t_exit", 0) for r in survivors]
        job.expect(min(exits) - kill["t"] >= SLOW_EXIT_S - 0.5, f"survivors exited too early: {exits}")
        job.expect(min(r["t_start"] for r in second) > max(exits), "attempt 1 started before attempt 0 exited")
    report(capsys, f"{case}: SIGKILL -> attempt 1's first allreduce", max(r["t_first"] for r in second) - kill["t"])


def test_reinit_on_one_store(make_job, capsys):
    """Ten rounds of init/allreduce/destroy on one store; rank 1 is SIGKILLed in
    round 4 (after its first step) and a fresh process takes its rank from round 5.

    The store is this test's (it outlives every rank, like torchrun's agent
    store); the ranks reach it through env:// with TORCHELASTIC_USE_AGENT_STORE,
    exactly as torchrun workers do. The replacement learns its rank and the
    store's address from its environment, as a launcher would give them, and the
    round to start at from the victim's kill record. The survivors learn of the
    death from their failing collective, destroy the group and go on."""
    import torch.distributed as dist

    rounds, kill_round, world = 10, 4, 3
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    job = make_job({"ELASTIC_MODE": "reinit", "ELASTIC_ROUNDS": str(rounds), "ELASTIC_STEPS": "3",
                    "ELASTIC_KILL_RANK": str(VICTIM), "ELASTIC_KILL_ROUND": str(kill_round),
                    "ELASTIC_KILL_STEP": "1", "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(store.port), "TORCHELASTIC_USE_AGENT_STORE": "True"})
    for r in range(world):
        job.start(f"rank{r}", [sys.executable, WORKER], RANK=str(r))
    rc = job.wait(f"rank{VICTIM}")[f"rank{VICTIM}"]
    kill = job.event("kill")
    job.expect(rc == -signal.SIGKILL and kill, f"rank {VICTIM} was to SIGKILL itself in round {kill_round}, exit {rc}")
    job.start(f"rank{VICTIM}-replacement", [sys.executable, WORKER], RANK=str(VICTIM),
              ELASTIC_ROUND_START=str(kill["round"] + 1))
    rcs = job.wait()
    job.expect(all(rc == 0 for n, rc in rcs.items() if n != f"rank{VICTIM}"), f"exit codes {rcs}")
    recs = job.records()
    for rnd in range(rounds):
        mine = [r for r in recs if r.get("round") == rnd]
        if rnd != kill_round:
            check_incarnation(job, mine, world, f"round {rnd}")
            continue
        # The survivors saw the failure after an exact first step; the victim died.
        survivors = [r for r in mine if r["rank"] != VICTIM]
        job.expect(len(survivors) == world - 1 and all(
            r["status"] == "error" and r["steps_done"] == 1 and exact(r) for r in survivors),
            f"round {rnd}: the survivors should have failed after step 1: {survivors}")
    after = [r for r in recs if r.get("round") == kill_round + 1]
    report(capsys, "reinit: SIGKILL -> next round's first allreduce", max(r["t_first"] for r in after) - kill["t"])


def _agents(port, change):
    """torchrun commands for machine a (hosts the rendezvous) and b: 2 ranks each,
    --nnodes 1:2. A machine that left is dropped from the next round once it
    misses keep_alive_max_attempt heartbeats of keep_alive_interval (torch's
    default 3 x 5 s); 1 s x 2 is too tight: a live agent's heartbeat can be 2 s
    old, and a joining agent then drops it and forms a group of its own."""
    def cmd(is_host):
        conf = f"is_host={is_host},last_call_timeout={1 if change == 'join' else 5},join_timeout=90," \
               "keep_alive_interval=1,keep_alive_max_attempt=4"
        return TORCHRUN + ["--nnodes", "1:2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
                           "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"elastic-{change}",
                           "--rdzv-conf", conf, "--max-restarts", "1", "--monitor-interval", "0.2", WORKER]
    return cmd(1), cmd(0)


@pytest.mark.parametrize("change", ["leave", "join"])
def test_membership_change(change, make_job, capsys):
    """leave: both machines train (world 4); at step 10 machine b's rank 2 SIGTERMs
    its agent, which stops b's ranks and exits (the rendezvous stays open); a's
    ranks fail, a restarts alone: world 2 must complete.
    join: a trains alone (world 2) until b joins; a's agent restarts its ranks for
    world 4 (a membership change, not counted as a restart), which must complete.
    torch 2.15's agent deadlocks when a machine joins a later round with the
    shared agent store (the joiner waits for MASTER_ADDR under the new round's
    prefix, which rank 0's agent publishes only in its first round), so join
    always runs with a fresh store per round."""
    env = {"ELASTIC_STEPS": str(STEPS), **TCP}
    env.update(FRESH_STORE if change == "join" else {})
    job = make_job(env)
    host, guest = _agents(free_port(), change)
    if change == "leave":
        job.start("agent_a", host, ROCE_PG_SIM_NODE="a")
        job.start("agent_b", guest, ROCE_PG_SIM_NODE="b", ELASTIC_LEAVE_STEP="10")
        rcs = job.wait()
        left = job.event("leave")
        job.expect(left is not None, "machine b never reached its leave step")
        job.expect(rcs["agent_a"] == 0, f"agent a exited {rcs['agent_a']}")
        recs = job.records()
        check_incarnation(job, [r for r in recs if r["world"] == 4], 4, "world 4 (before b left)", complete=False)
        final = [r for r in recs if r["world"] == 2]
        check_incarnation(job, final, 2, "world 2 (after b left)")
        report(capsys, "leave: b leaves -> world 2's first allreduce", max(r["t_first"] for r in final) - left["t"])
    else:
        job.start("agent_a", host, ROCE_PG_SIM_NODE="a", ELASTIC_UNTIL_WORLD="4")
        job.wait_for("world 2 training", lambda: any(r["world"] == 2 and r["steps_done"] for r in job.records()))
        t_join = time.time()
        job.start("agent_b", guest, ROCE_PG_SIM_NODE="b", ELASTIC_UNTIL_WORLD="4")
        rcs = job.wait()
        job.expect(rcs == {"agent_a": 0, "agent_b": 0}, f"exit codes {rcs}")
        recs = job.records()
        check_incarnation(job, [r for r in recs if r["world"] == 2], 2, "world 2 (before b joined)", complete=False)
        final = [r for r in recs if r["world"] == 4]
        check_incarnation(job, final, 4, "world 4 (after b joined)")
        report(capsys, "join: b starts -> world 4's first allreduce", max(r["t_first"] for r in final) - t_join)
