"""Runs inside one Soft-RoCE VM (scripts/softroce/run_vm.sh), every peer over the
verbs transport on rxe0. torch is imported once; every group's ranks are forked
from this process (tests/support/ranks.py, start_method="fork"), so no rank pays the
minutes `import torch` costs under emulation. This process never touches verbs
itself before the forks (no ibv_fork_init needed): the ports are listed last.

Phases (argv after the report path; default: all of them):
  matrix  the collective matrix on 2 and 3 ranks (3: the largest size in one
          dtype per element size and kind), then an 8 MiB allreduce whose
          packets are counted
  api     send/recv, batch_isend_irecv, any source, tags, object collectives,
          messages above the 1 MiB chunk (also with ROCE_PG_IB_QPS_PER_CONNECTION=4
          and non-default ROCE_PG_IB_SLOTS), subgroups, timeouts, abort, the
          size-mismatch NACK; subgroups formed from the world group's roster
          sharing the process's one device context
  faults  kill -9 of a rank during a large allreduce (300 s group timeout),
          a SIGKILLed rank replaced by reconfigure (survivors, then a spare),
          5,000 mixed small collectives and 25 group re-creations (2 ranks)
          without growth of RSS, fds, threads, MRs or QPs (`rdma res show`)
  zerocopy  RDMA straight between tensors (1 MiB chunks, 64 KiB threshold):
          every collective kind exact below and above the threshold; no byte
          copied and nothing registered in steady state; freed-and-reallocated
          tensors; eviction under a 3 MiB ROCE_PG_IB_REG_CACHE_BYTES; 4 QPs with
          3 slots; 3 channels (ROCE_PG_NCHANNELS) on 3 ranks; the size-mismatch NACK and kill -9 during a zero-copy allreduce
  gpudirect  testdev tensors in peer-memory mode (GPUDirect RDMA): broadcast and
          send/recv go to the NIC with no staging copy (device_bytes_staged 0),
          exact, stream-ordered with slow kernels and the poisoning allocator;
          the same under a 64 KiB ROCE_PG_IB_DEVICE_REG_BYTES, where the larger
          tensors are staged instead; allgather, gather, scatter and all-to-all
          (3 ranks, lists, strided, uneven, empty blocks) with no host copy
  multinic  two rxe devices (rxe1 on dummy1 made for the group): both ranks
          drive both; exact results, packets on both; dummy1 downed mid-run
          gives every rank an error naming the device, and reconfigures go on
          on rxe0, then on both once dummy1 is back; examples/ft_train.py
          trains on through dummy1 going down
  scale   8 ranks with a small pool: connections, queue pairs and
          registered bytes follow the peers an algorithm talks to

Every group's rxe sent-packet delta is recorded with the least the group must
have put on the wire, so a silent fall-back to TCP fails. The JSON report
(argv[1]) is rewritten after every group: a run stopped by its time limit
still tells how far it got.

    python -m tests.softroce.guest_suite OUT.json [matrix] [api] [multinic] [verdict] [faults] [scale] [zerocopy] [gpudirect]
"""
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback

import torch  # noqa: F401  (imported once; forked ranks inherit it)

import roce_pg

from tests.fault_workers import rdma_resources
from tests.softroce.rxe_counters import hw_counters, sent_packets
from tests.softroce.verbs_workers import MTU, proof_packets
from tests.support.layouts import LAYOUTS
from tests.support.ranks import run_group

PROOF = "tests.softroce.verbs_workers.with_proof"
DEFAULT_CHUNK = {"ROCE_PG_CHUNK_BYTES": str(1 << 20)}  # the suite runs with small chunks; these groups not


def _group(layout, target, kwargs=None, env=None, proof=True, min_packets=None, **opts):
    world, base = LAYOUTS[layout]
    world = opts.pop("world", world)  # a target that launches the ranks itself runs as one
    if proof:  # a known allreduce first, whose packets this group must show
        kwargs = {"target": target, "kwargs": kwargs or {}}
        target = PROOF
        min_packets = proof_packets(world) if min_packets is None else min_packets
    return dict(layout=layout, world=world, env={**base, **(env or {})}, target=target, kwargs=kwargs or {},
                min_packets=min_packets or 0, **opts)


def groups(phases):
    g = {}
    if "matrix" in phases:
        # Four ranks run in the two-VM suite and in subgroups/verbs4 below; a third
        # full matrix here would cost CI minutes without new code paths.
        # verbs2 checks every dtype at the largest size; verbs3 one per element size and kind.
        for layout, thin in (("verbs2", False), ("verbs3", True)):
            g[f"matrix/{layout}"] = _group(layout, "tests.softroce.verbs_workers.matrix_and_big", proof=False,
                                           kwargs={"thin_large": thin}, deadline_s=1500)
    if "api" in phases:
        # 60 s: a receive that never matches fails in a minute, not two
        g["p2p_objects/verbs3"] = _group("verbs3", "tests.api_workers.objects_and_p2p",
                                         env={**DEFAULT_CHUNK, "TEST_PG_TIMEOUT_S": "60"},
                                         min_packets=proof_packets(3) + (24 << 20) // MTU)
        big = "tests.softroce.verbs_workers.big_messages"
        # messages of 1-3 chunks of the default 1 MiB, 4 QPs per connection, 3 landing slots
        g["big_qps4_slots3/verbs3"] = _group("verbs3", big, env={**DEFAULT_CHUNK, "ROCE_PG_IB_QPS_PER_CONNECTION": "4",
                                                                 "ROCE_PG_IB_SLOTS": "3"})
        # the same messages in ~80 chunks of 16 KiB each, 64 landing slots, 2 QPs
        g["big_qps2_slots64/verbs2"] = _group("verbs2", big, env={"ROCE_PG_IB_QPS_PER_CONNECTION": "2",
                                                                  "ROCE_PG_IB_SLOTS": "64"})
        g["subgroups/verbs4"] = _group("verbs4", "tests.api_workers.groups")
        # subgroups from the world's roster, one device context per process
        g["shared_runtime/verbs4"] = _group("verbs4", "tests.group_workers.verbs_groups",
                                            env={"ROCE_PG_SUBGROUPS": "parent"})
        # one staging pool per process, 3 slots (1 MiB pool), zero
        # copy off: three groups from three threads compete for it
        g["staging_shared/verbs3"] = _group("verbs3", "tests.group_workers.staging_shared",
                                            env={"ROCE_PG_IB_POOL_BYTES": "1M", "ROCE_PG_IB_ZERO_COPY_MIN_BYTES": "0"})
        # verbs connections keep no socket; a departure is still told
        g["watched_peers/verbs4"] = _group("verbs4", "tests.group_workers.watched_peers")
        g["skipped_collective/verbs2"] = _group("verbs2", "tests.api_workers.skipped_collective",
                                                env={"TEST_PG_TIMEOUT_S": "3"})
        g["per_call_timeout/verbs2"] = _group("verbs2", "tests.api_workers.per_call_timeout",
                                              env={"TEST_PG_TIMEOUT_S": "60"})
        g["abort/verbs2"] = _group("verbs2", "tests.api_workers.abort_pending")
        g["size_mismatch_nack/verbs3"] = _group("verbs3", "tests.api_workers.network_mismatch")
        # One-sided windows with every peer on another machine: puts and
        # signals served by the owners' progress threads over verbs
        g["windows/verbs3"] = _group("verbs3", "tests.window_workers.window_matrix")
    if "multinic" in phases:
        # Every NIC: a second Soft-RoCE device on its own netdev for
        # this group only (made before, removed after); no ROCE_PG_IB_HCA.
        g["multi_nic/verbs2"] = _group("verbs2", "tests.softroce.verbs_workers.multi_nic", proof=False, init=False,
                                       scratch=True, env={"TEST_PG_TIMEOUT_S": "60"}, deadline_s=600,
                                       before=SECOND_NIC_UP, after=SECOND_NIC_GONE)
        # examples/ft_train.py's workers over both NICs; dummy1 goes down at
        # step 6 and training goes on, reconfigured onto rxe0 (the workers
        # are processes of their own: each imports torch, minutes here).
        g["ft_train_link_down/verbs2"] = _group("verbs2", "tests.softroce.verbs_workers.ft_train_link_down",
                                                proof=False, init=False, world=1, min_packets=16,
                                                deadline_s=540, before=SECOND_NIC_UP, after=SECOND_NIC_GONE)
    if "verdict" in phases:
        # Rank 2 of 8 stops calling collectives: every other rank's timeout
        # error carries the same verdict (tests/test_verdict.py on the host).
        g["verdict/verbs8"] = _group("verbs8", "tests.verdict_workers.hung_rank", kwargs={"hung": 2},
                                     env={"TEST_PG_TIMEOUT_S": "10"}, deadline_s=600)
    if "faults" in phases:
        g["kill_allreduce/verbs3"] = _group("verbs3", "tests.fault_workers.kill_during_allreduce",
                                            kwargs={"victim": 2, "nbytes": 8 << 20, "rounds": 2, "cap_s": 30.0},
                                            env={"TEST_PG_TIMEOUT_S": "300"}, proof=False, expect_dead={2},
                                            scratch=True, min_packets=2 * (3 - 1) * (8 << 20) // MTU)
        # Two ranks: under emulation a third one (and its progress thread) costs ~5x per operation.
        g["mixed/verbs2"] = _group("verbs2", "tests.fault_workers.mixed_collectives", proof=False,
                                   kwargs={"total": 5_000, "rdma": True, "progress": True}, min_packets=5_000,
                                   deadline_s=900)
        # A rank SIGKILLed; the survivors reconfigure to themselves, then to a
        # spare (torch's fault-tolerance API), every peer over verbs. Each
        # of the 4 exact allreduces of 4,000 B moves at least a packet per member.
        g["reconfigure/verbs4"] = _group("verbs4", "tests.reconfigure_workers.survive_a_death_then_take_a_spare",
                                         proof=False, init=False, expect_dead={2}, min_packets=4 * 2,
                                         deadline_s=600)
        g["recreate/verbs2"] = _group("verbs2", "tests.fault_workers.recreate_group", proof=False, init=False,
                                      kwargs={"cycles": 25, "rdma": True}, min_packets=25 * 4099 * 4 // MTU,
                                      deadline_s=600)
    if "scale" in phases:
        # 8 ranks on verbs with a small pool (256 KiB landing, 4 KiB slots): per-rank
        # resources follow the peers each rank talks to. Every rank sends the
        # 1 MiB rd allreduce 3 times (lg 8 exchanges), which the packets prove.
        g["scale/verbs8"] = _group("verbs8", "tests.softroce.verbs_workers.verbs_at_scale", proof=False,
                                   env={"ROCE_PG_ALGO_ALLREDUCE": "rd", "ROCE_PG_IB_POOL_BYTES": "256K",
                                        "ROCE_PG_IB_SLOT_BYTES": "4K", "ROCE_PG_NCHANNELS": "1"},
                                   min_packets=8 * 3 * (1 << 20) // MTU, deadline_s=900)
    if "zerocopy" in phases:
        zc = "tests.softroce.zero_copy_workers."
        g["zerocopy_exact/verbs2"] = _group("verbs2", zc + "exactness", env=DEFAULT_CHUNK)
        g["zerocopy_steady/verbs2"] = _group("verbs2", zc + "steady_state", env=DEFAULT_CHUNK,
                                             min_packets=proof_packets(2) + 10 * (2 << 20) // MTU)
        g["zerocopy_qps4_slots3/verbs2"] = _group("verbs2", zc + "steady_state", kwargs={"sizes": (1 << 20,), "transient": 8}, env={
            **DEFAULT_CHUNK, "ROCE_PG_IB_QPS_PER_CONNECTION": "4", "ROCE_PG_IB_SLOTS": "3"})
        # 3 channels (3 rings, each on its own queue pair; two reduce on helper
        # threads): 1, 2 and 4 MiB allreduces all split (256 KiB per channel at least)
        g["zerocopy_channels3/verbs3"] = _group("verbs3", zc + "steady_state", kwargs={"transient": 8}, env={
            **DEFAULT_CHUNK, "ROCE_PG_NCHANNELS": "3", "ROCE_PG_ALGO_RING_MIN_BYTES": str(256 << 10)})
        g["zerocopy_eviction/verbs2"] = _group("verbs2", zc + "eviction",
                                               env={**DEFAULT_CHUNK, "ROCE_PG_IB_REG_CACHE_BYTES": str(3 << 20)})
        g["zerocopy_nack/verbs3"] = _group("verbs3", zc + "mismatch", env=DEFAULT_CHUNK)
        g["zerocopy_kill/verbs3"] = _group("verbs3", "tests.fault_workers.kill_during_allreduce",
                                           kwargs={"victim": 2, "nbytes": 8 << 20, "rounds": 2, "cap_s": 30.0},
                                           env={**DEFAULT_CHUNK, "TEST_PG_TIMEOUT_S": "300"}, proof=False,
                                           expect_dead={2}, scratch=True, min_packets=2 * (3 - 1) * (8 << 20) // MTU)
    if "gpudirect" in phases:
        gd = dict(kwargs={"kind": "testdev"}, prepare="tests.accelerator_workers.load_testdev")
        peer = {**DEFAULT_CHUNK, "TESTDEV_PEER_MEMORY": "1"}
        # Each rank sends every size in three dtypes (bfloat16: half) per broadcast root and once in the ring.
        payload = (1 + 5000 + 300_000) * (4 + 8 + 2) * 3
        g["gpudirect/verbs2"] = _group("verbs2", "tests.accelerator_workers.gpudirect", env=peer,
                                       min_packets=proof_packets(2) + payload // MTU, **gd)
        g["gpudirect_limit/verbs2"] = _group("verbs2", "tests.accelerator_workers.gpudirect",
                                             env={**peer, "ROCE_PG_IB_DEVICE_REG_BYTES": str(64 << 10)}, **gd)
        # allgather, gather, scatter, all-to-all: every rank sends at least its
        # block of the largest size, in three dtypes, in four of its calls
        g["gpudirect_movement/verbs3"] = _group("verbs3", "tests.accelerator_workers.gpudirect_movement",
                                                env={**peer, "ROCE_PG_IB_DEVICE_REG_BYTES": str(4 << 20)},
                                                min_packets=proof_packets(3) + 4 * 100_000 * (4 + 8 + 2) // MTU, **gd)
    return g


# A second RDMA device for the multi-NIC group: rxe1 on dummy1 (10.99.1.1/24),
# waited for until its port is ACTIVE; and its removal.
SECOND_NIC_UP = ("ip link add dummy1 type dummy && ip addr add 10.99.1.1/24 dev dummy1 && ip link set dummy1 up && "
                 "rdma link add rxe1 type rxe netdev dummy1 && "
                 "for i in $(seq 120); do ibv_devinfo -d rxe1 | grep -q PORT_ACTIVE && exit 0; sleep 0.5; done; "
                 "echo 'rxe1 never became ACTIVE'; exit 1")
SECOND_NIC_GONE = "rdma link delete rxe1; ip link del dummy1; true"


def _shell(cmd):
    p = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise RuntimeError(f"{cmd!r} failed ({p.returncode}): {p.stdout[-500:]} {p.stderr[-500:]}")


def run_one(spec):
    entry = {"layout": spec["layout"], "target": spec["target"], "min_packets": spec["min_packets"]}
    kwargs = dict(spec["kwargs"])
    scratch = tempfile.mkdtemp(prefix="roce-guest.") if spec.get("scratch") else None
    if scratch:
        kwargs["scratch"] = scratch
    t0, pkts0, hw0 = time.time(), sent_packets(), hw_counters()
    try:
        if spec.get("before"):
            _shell(spec["before"])
        entry["results"] = run_group(spec["target"], spec["world"], env=spec["env"], kwargs=kwargs,
                                     init=spec.get("init", True), start_method="fork", prepare=spec.get("prepare"),
                                     deadline_s=spec.get("deadline_s", 600), expect_dead=spec.get("expect_dead", ()))
    except Exception:  # noqa: BLE001
        entry["error"] = traceback.format_exc()[-6000:]
    if spec.get("after"):
        try:
            _shell(spec["after"])
        except Exception:  # noqa: BLE001
            entry.setdefault("error", traceback.format_exc()[-2000:])
    entry["seconds"] = round(time.time() - t0, 1)
    entry["packets"] = sent_packets() - pkts0
    hw1 = hw_counters()
    entry["hw_delta"] = {k: hw1[k] - hw0.get(k, 0) for k in hw1 if hw1[k] != hw0.get(k, 0)}
    entry["rdma_after"] = rdma_resources()  # every rank of the group is gone: nothing may be left
    return entry


def main(argv):
    out = argv[0]
    phases = argv[1:] or ["matrix", "api", "multinic", "verdict", "faults", "scale", "zerocopy", "gpudirect"]
    report = {"phases": phases, "kernel": platform.release(), "rdma_before": rdma_resources(), "groups": {}}
    t_start = time.time()
    for name, spec in groups(phases).items():
        entry = run_one(spec)
        report["groups"][name] = entry
        ok = "error" not in entry and entry["packets"] >= entry["min_packets"]
        print(f"[guest] {name}: {'ok' if ok else 'FAIL'} {entry['seconds']} s, {entry['packets']} packets "
              f"(>= {entry['min_packets']}) {json.dumps(entry, default=str)[:800]}", flush=True)
        with open(out, "w") as f:
            json.dump(report, f, indent=1, default=str)
    report["seconds"] = round(time.time() - t_start, 1)
    report["ports"] = roce_pg.rdma_ports()  # after every fork
    with open(out, "w") as f:
        json.dump(report, f, indent=1, default=str)


if __name__ == "__main__":
    main(sys.argv[1:])

