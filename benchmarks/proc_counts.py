"""What a process holds, read from /proc/self: listening TCP ports and
threads by name; and the machine's /dev/shm in use. Shared by benchmarks/groups_per_process.py and
tests/group_workers.py (importable as benchmarks.proc_counts from the
repository root, or as proc_counts with benchmarks/ on the path)."""
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
    """TCP ports this process listens on (LISTEN state 0A, inode it holds)."""
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


def threads_named(name):
    n = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                n += f.read().strip() == name
        except OSError:
            pass
    return n


def devshm_kib():
    """/dev/shm in use on the machine: every rank's shared-memory segments,
    which stay counted while mapped though their names are gone."""
    st = os.statvfs("/dev/shm")
    return (st.f_blocks - st.f_bfree) * st.f_frsize // 1024
