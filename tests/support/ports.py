"""A free TCP port on the loopback interface, for a group's store or a
launcher's MASTER_PORT.

The port is free when asked: the socket that found it is closed before the
caller binds it, so another process could take it in between (the store's
bind then fails loudly rather than joining the wrong group). It is drawn
from below the kernel's ephemeral range, which every outgoing connection and
every listener bound to port 0 takes from: a test that dials hundreds of
times, or a rank's own listener, cannot take it in between.
"""
import random
import socket


def _ephemeral_range():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def free_port():
    low, _ = _ephemeral_range()
    candidates = range(max(1024, low - 12000), low) if low > 2048 else range(1024, 65536)
    for port in random.sample(candidates, min(200, len(candidates))):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # every candidate taken: any free port
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
