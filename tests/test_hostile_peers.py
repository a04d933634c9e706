"""Someone on the network who is not a rank of the job: what reaching a
rank's listener with well-formed messages can cost it. Two ranks, each its own
simulated machine over TCP, as on a cluster."""
from .support.layouts import TCP
from .support.ranks import run_group

TWO_MACHINES = {**TCP, "ROCE_PG_SIM_RANKS_PER_NODE": "1"}
PARKED_BUDGET = 16 << 20  # process_links.cpp, kMaxParkedBytes


def test_a_flood_of_records_for_groups_that_do_not_exist_stays_within_the_budget():
    results = run_group("tests.hostile_workers.parked_record_flood", 2, env=TWO_MACHINES)
    r = results[0]
    stats = r["stats"]
    # 64 MB of BYE, FAIL and state records (4 KiB of text each) from ever new
    # senders for 64 groups: before the budget, all of it was kept.
    assert r["sent"] >= 64 << 20, r
    assert 0 < stats["link_parked_bytes"] <= PARKED_BUDGET, r
    assert stats["link_records_dropped"] > 0 and stats["link_parked_groups"] <= 64, r
    assert r["rss_growth_kib"] < 2 * PARKED_BUDGET // 1024, r
    assert all(x["exact"] for x in results), results
