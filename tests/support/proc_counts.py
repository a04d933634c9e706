"""What a process holds, read from /proc/self: listening TCP ports, threads
(by name) and their CPU time, resident memory; and the machine's /dev/shm
in use. Tests check with them
that groups cost a rank no more than they should; benchmarks report them.
"""
import os


def _socket_inodes():
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    return inodes


def listening_ports():
    """How many TCP ports this process listens on (LISTEN state 0A, an inode it holds)."""
    mine, ports = _socket_inodes(), set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    cols = line.split()
                    if cols[3] == "0A" and cols[9] in mine:
                        ports.add(int(cols[1].rsplit(":", 1)[1], 16))
        except OSError:
            pass
    return len(ports)


def listening_addresses(port):
    """The IPv4 addresses this process listens on at `port` ("0.0.0.0": every interface)."""
    import socket
    import struct

    mine, found = _socket_inodes(), set()
    with open("/proc/self/net/tcp") as f:
        next(f)
        for line in f:
            cols = line.split()
            address, at = cols[1].split(":")
            if cols[3] == "0A" and cols[9] in mine and int(at, 16) == port:
                found.add(socket.inet_ntoa(struct.pack("<I", int(address, 16))))
    return sorted(found)


def thread_names():
    """Names of this process's threads (roce's channel helpers are roce-reduce)."""
    names = set()
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                names.add(f.read().strip())
        except OSError:
            pass
    return names


def threads_named(name):
    """How many of this process's threads are called `name`."""
    n = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                n += f.read().strip() == name
        except OSError:
            pass
    return n


def rss_kib():
    """This process's resident memory (VmRSS), KiB."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def thread_cpu_seconds(prefix="roce-"):
    """CPU seconds (user + system) used so far by each of this process's
    threads whose name starts with `prefix`, a list: by default roce's own
    threads (runtime, progress, workers, channel helpers), not the caller's."""
    ticks, out = os.sysconf("SC_CLK_TCK"), []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                if not f.read().startswith(prefix):
                    continue
            with open(f"/proc/self/task/{task}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out.append((int(fields[11]) + int(fields[12])) / ticks)  # utime, stime
        except OSError:  # the thread ended meanwhile
            pass
    return out


def devshm_kib():
    """/dev/shm in use on the machine: every rank's shared-memory segments,
    which stay counted while mapped though their names are gone."""
    st = os.statvfs("/dev/shm")
    return (st.f_blocks - st.f_bfree) * st.f_frsize // 1024
