"""The process layouts the suite runs a group in: {name: (world size,
environment)}, e.g. LAYOUTS["net3"] is three ranks that reach each other over
TCP, "mixed2x2" two simulated machines of two ranks each.

The network layouts name TCP explicitly: the test host has no RDMA device,
and without the variable a group spanning "machines" refuses to start.
"""

TCP = {"ROCE_PG_NET_TRANSPORT": "tcp"}
LAYOUTS = {
    "single": (1, {}),
    "shm2": (2, {}),
    "shm3": (3, {}),
    "shm4": (4, {}),
    "net2": (2, {"ROCE_PG_FORCE_NETWORK": "1", **TCP}),
    "net3": (3, {"ROCE_PG_FORCE_NETWORK": "1", **TCP}),
    "net4": (4, {"ROCE_PG_FORCE_NETWORK": "1", **TCP}),
    # Two simulated machines with two ranks each: shared memory inside a
    # "machine", the network between them.
    "mixed2x2": (4, {"ROCE_PG_SIM_RANKS_PER_NODE": "2", **TCP}),
    # Every peer over verbs (Soft-RoCE VM suite).
    "verbs2": (2, {"ROCE_PG_FORCE_NETWORK": "1", "ROCE_PG_NET_TRANSPORT": "verbs"}),
    "verbs3": (3, {"ROCE_PG_FORCE_NETWORK": "1", "ROCE_PG_NET_TRANSPORT": "verbs"}),
    "verbs4": (4, {"ROCE_PG_FORCE_NETWORK": "1", "ROCE_PG_NET_TRANSPORT": "verbs"}),
    "verbs8": (8, {"ROCE_PG_FORCE_NETWORK": "1", "ROCE_PG_NET_TRANSPORT": "verbs"}),
}
