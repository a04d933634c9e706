"""Packet counters of the Soft-RoCE device: rxe has no byte counters, but a
transfer of B payload bytes needs at least B / MTU packets, and a run that
silently fell back to TCP leaves them flat."""
import glob


def sent_packets(device="rxe0"):
    total = 0
    for path in glob.glob(f"/sys/class/infiniband/{device}/ports/*/hw_counters/sent_pkts"):
        with open(path) as f:
            total += int(f.read())
    return total


def hw_counters(device="rxe0"):
    """Every hw_counters file of the device's ports, summed over ports: sent_pkts,
    rcvd_pkts, and the retransmission evidence (duplicate_request,
    out_of_seq_request, rcvd_seq_err, completer_retry_err, ...)."""
    total = {}
    for path in glob.glob(f"/sys/class/infiniband/{device}/ports/*/hw_counters/*"):
        try:
            with open(path) as f:
                value = int(f.read())
        except (OSError, ValueError):
            continue
        name = path.rsplit("/", 1)[1]
        total[name] = total.get(name, 0) + value
    return total
