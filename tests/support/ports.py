"""A free TCP port on the loopback interface, for a group's store or a
launcher's MASTER_PORT.

The port is free when asked: the socket that found it is closed before the
caller binds it, so another process could take it in between (the store's
bind then fails loudly rather than joining the wrong group).
"""
import socket


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
