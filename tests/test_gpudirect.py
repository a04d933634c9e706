"""GPUDirect RDMA's choice, on the host (docs/ACCELERATORS.md, "GPUDirect
RDMA"): which calls hand device memory to the transport and which are staged.
The direct path itself crosses real verbs only in the Soft-RoCE VM
(tests/test_softroce.py, gpudirect groups); here, testdev tensors in
peer-memory mode over shared memory and TCP must be staged, exactly."""
import pytest

from .support.layouts import LAYOUTS
from .support.ranks import run_group


def _C():
    import roce_pg._C as C

    return C


def _choose(mode="auto", dmabuf=False, pointer=True, nic_dmabuf=False, peers=("", "verbs"), nbytes=1 << 20,
            limit=2 << 30, shared_machine=False, flush=False, with_flush=False):
    path, why, flushes = _C().testing.choose_gpudirect(mode, dmabuf, pointer, nic_dmabuf, list(peers), shared_machine,
                                                nbytes, limit, flush)
    return (path, why, flushes) if with_flush else (path, why)


@pytest.mark.parametrize("peers, why", [
    (["", "verbs", "tcp"], "rank 2 is reached through tcp"),
    (["shm", ""], "rank 0 is reached through shm"),
])
def test_every_peer_must_be_served_by_verbs(peers, why):
    path, reason = _choose(dmabuf=True, nic_dmabuf=True, peers=peers)
    assert path == "staged" and why in reason, reason
    assert _choose(dmabuf=True, nic_dmabuf=True, peers=["", "verbs", "verbs"])[0] == "dma-buf"
    assert _choose(peers=["", "", "verbs"])[0] == "peer memory"  # ranks a call does not talk to do not count


def test_a_collective_stages_where_a_machine_holds_several_ranks():
    """A rank alone on its machine sees only verbs peers, but the group's
    ranks that share a machine stage (shared memory copies with the CPU), and a
    collective's ranks must choose alike: the topology decides for all."""
    path, why = _choose(dmabuf=True, nic_dmabuf=True, peers=["", "verbs", "verbs"], shared_machine=True)
    assert path == "staged" and "one rank per machine" in why, why
    assert _choose(peers=["", "verbs", "verbs"], shared_machine=False)[0] == "peer memory"


def test_dmabuf_first_peer_memory_second_staged_last():
    assert _choose(dmabuf=True, nic_dmabuf=True) == ("dma-buf", "device dma-buf 1; nic dma-buf 1")
    # The provider refuses dma-bufs (rxe): peer memory, saying why not dma-buf.
    assert _choose(dmabuf=True, nic_dmabuf=False) == (
        "peer memory", "no dma-buf: nic dma-buf 0; peer memory: device pointer 1")
    # The device exports none (testdev): the device's reason.
    assert _choose(nic_dmabuf=True) == ("peer memory", "no dma-buf: device dma-buf 0; peer memory: device pointer 1")
    assert _choose(pointer=False) == ("staged", "no dma-buf: device dma-buf 0; no peer memory: device pointer 0")


def test_the_mode_and_the_limit_stage():
    assert _choose(mode="off", dmabuf=True, nic_dmabuf=True) == ("staged", "ROCE_PG_GPUDIRECT=off")
    path, why = _choose(nbytes=(1 << 20) + 1, limit=1 << 20)
    assert path == "staged" and "exceeds ROCE_PG_IB_DEVICE_REG_BYTES=1048576" in why, why
    assert _choose(nbytes=1 << 20, limit=1 << 20)[0] == "peer memory"


def test_a_device_that_needs_its_nic_writes_flushed_gets_the_flush_on_both_direct_paths():
    """CUDA before compute capability 9.0 (GPU_DIRECT_RDMA_WRITES_ORDERING
    below OWNER): the call carries the device's flush, and the log says so."""
    for dmabuf, path in ((True, "dma-buf"), (False, "peer memory")):
        got = _choose(dmabuf=dmabuf, nic_dmabuf=True, flush=True, with_flush=True)
        assert got[0] == path and got[1].endswith("; device flush 1") and got[2] is True, got
        assert _choose(dmabuf=dmabuf, nic_dmabuf=True, with_flush=True)[2] is False
    # Staged: the CPU copies, nothing to flush.
    assert _choose(mode="off", flush=True, with_flush=True)[2] is False
    assert _choose(pointer=False, flush=True, with_flush=True)[2] is False


def test_peer_memory_module_detection():
    C = _C()
    lines = "nvidia 1 0 - Live 0x0\nib_core 4 2 - Live 0x0\n"
    assert not C.testing.peer_memory_module_loaded(lines)
    assert C.testing.peer_memory_module_loaded(lines + "nvidia_peermem 16384 0 - Live 0x0\n")
    assert C.testing.peer_memory_module_loaded("nv_peer_mem 1 0 - Live 0x0")
    assert not C.testing.peer_memory_module_loaded("nvidia_peermemx 1 0 - Live 0x0")


@pytest.mark.parametrize("layout", ["shm2", "net2"])
def test_testdev_peer_memory_without_verbs_is_staged_and_exact(layout):
    world, env = LAYOUTS[layout]
    results = run_group("tests.accelerator_workers.gpudirect", world,
                        env={**env, "TESTDEV_PEER_MEMORY": "1"}, prepare="tests.accelerator_workers.load_testdev",
                        kwargs={"kind": "testdev", "sizes": (1, 5000, 40_000)})
    for r in results:
        assert not r["failures"], "\n".join(r["failures"][:40])
        assert r["checks"] >= 3 * 3 * 4, r["checks"]
        assert r["device_memory"]["pointer"] and not r["device_memory"]["dmabuf"], r["device_memory"]
        # declared, yet staged: no peer is on verbs; the log line says why
        assert "through host staging (rank " in r["log"] and "which copies with the CPU" in r["log"], r["log"]
        c = r["counters"]
        assert c["device_bytes_direct"] == 0 and c["device_bytes_staged"] > 0, c
