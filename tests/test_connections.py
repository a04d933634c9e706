"""Connections on demand: a rank connects to a network peer when an
algorithm or a point-to-point call first needs it, both ends may dial at once,
ROCE_PG_CONNECT=eager keeps the full mesh, and a peer that is gone is named.

Six ranks, each its own simulated machine over TCP (every peer is a network
peer); the counters' `connections` gauge counts established data connections
(the lifelines to the two ring neighbours are separate and not counted)."""
from .support.layouts import TCP
from .support.ranks import run_group

SIX_MACHINES = {**TCP, "ROCE_PG_SIM_RANKS_PER_NODE": "1"}


def test_connections_follow_the_peers_a_rank_talks_to():
    results = run_group("tests.connection_workers.on_demand", 6, env=SIX_MACHINES)
    # No data connection before the first operation.
    assert [r["after_init"] for r in results] == [0] * 6
    # Recursive doubling on 6 ranks: ranks 0..3 fold pairwise (0->1, 2->3), the
    # survivors 1, 3, 4, 5 exchange with XOR partners (1<->3? see below). Each
    # rank talks to at most 1 + lg 4 = 3 peers, never all 5.
    small = [r["after_small_allreduce"] for r in results]
    assert all(1 <= c <= 3 for c in small), small
    # Rank 0 -> 3 adds exactly that pair (if it did not exist already).
    p2p = [r["after_p2p"] for r in results]
    assert p2p[0] - small[0] <= 1 and p2p[3] - small[3] <= 1 and p2p[0] >= 1
    assert all(p2p[r] == small[r] for r in (1, 2, 4, 5)), (small, p2p)
    # Every pair dialled at once: one connection per pair, no more.
    assert [r["after_all_pairs"] for r in results] == [5] * 6
    # A connection is one descriptor, and the TCP transport holds one socket
    # per peer process (lifelines and the listener were there before).
    for r in results:
        assert r["tcp_sockets"] == 5, r
        assert r["fds_after_all_pairs"] - r["fds_before_all_pairs"] <= r["after_all_pairs"] - r["after_p2p"] + 1, r


def test_eager_mode_connects_every_peer_at_init():
    results = run_group("tests.connection_workers.eager", 4, env={**SIX_MACHINES, "ROCE_PG_CONNECT": "eager"})
    assert [r["after_init"] for r in results] == [3] * 4


def test_a_peer_that_left_is_named():
    results = run_group("tests.connection_workers.peer_left", 3, env=SIX_MACHINES)
    assert "tcp" in results[0]["msg"] and "destroyed the process group" in results[0]["msg"]


def test_a_stream_holds_at_most_its_window_for_a_reader_that_waits():
    results = run_group("tests.connection_workers.eager_send_to_a_reader_that_waits", 2,
                        env={**TCP, "ROCE_PG_SIM_RANKS_PER_NODE": "1"})
    # 64 MiB sent to a rank that receives 3 s later: it held about one 4 MiB
    # window meanwhile (before flow control: all 64 MiB), and got it exact.
    assert results[0]["exact"], results
    assert results[0]["held_kib"] < 16 << 10, results
    assert not results[1]["done_early"], results
