"""The ROCE_PG_* settings the extension accepts, and their validation as the
extension does it (csrc/common/env_reader.cpp), without loading it.

SETTINGS is a copy of roce_pg._C.settings(), which the extension builds from
its parser itself (Config::settings() in csrc/common/config.cpp: the same
calls that read the variables). The doctor keeps a copy because on one
machine it must run where the extension does not load, and in seconds in an
emulated VM (no torch import); tests/test_doctor.py fails when the copy and
the extension differ, and where the extension is loaded (--import, torchrun)
the doctor validates with the extension's own table (`table()`).

Forms: ("int", lo, hi, zero_ok): strtoll base 0 with an optional K/M/G
suffix, in [lo, hi], or 0 when zero_ok; ("number", lo, hi): strtod;
("choice", names); ("flag",): 1/true/yes/on or 0/false/no/off; ("text",): any;
("token", n): up to n letters, digits, '-' or '_'.
"""
import re
import sys
from typing import Mapping, Optional, Tuple

_SIZE = 1 << 40
_ALLREDUCE = ("auto", "rd", "rabenseifner", "ring", "tree", "hier")
SETTINGS = {
    "ROCE_PG_FORCE_NETWORK": ("flag",),
    "ROCE_PG_SIM_RANKS_PER_NODE": ("int", 0, 1 << 20, False),
    "ROCE_PG_SIM_NODE": ("token", 64),
    "ROCE_PG_ALGO": ("choice", _ALLREDUCE),
    "ROCE_PG_ALGO_ALLREDUCE": ("choice", _ALLREDUCE),
    "ROCE_PG_ALGO_ALLREDUCE_ACROSS": ("choice", ("auto", "rd", "rabenseifner", "ring", "tree")),
    "ROCE_PG_CONNECT": ("choice", ("lazy", "eager")),
    "ROCE_PG_SUBGROUPS": ("choice", ("join", "parent")),
    "ROCE_PG_ALGO_ALLGATHER": ("choice", ("auto", "shm", "ring", "bruck", "hier")),
    "ROCE_PG_ALGO_REDUCE_SCATTER": ("choice", ("auto", "shm", "ring", "hier")),
    "ROCE_PG_ALGO_BROADCAST": ("choice", ("auto", "shm", "binomial", "chain")),
    "ROCE_PG_ALGO_RD_MAX_BYTES": ("int", 0, _SIZE, False),
    "ROCE_PG_ALGO_RING_MIN_BYTES": ("int", 0, _SIZE, False),
    "ROCE_PG_ALGO_HIER_MIN_BYTES": ("int", 0, _SIZE, False),
    "ROCE_PG_ALGO_NET_ALPHA_US": ("number", 0, 1e6),
    "ROCE_PG_ALGO_NET_GBPS": ("number", 1e-6, 1e6),
    "ROCE_PG_ALGO_NIC_GBPS": ("number", 1e-6, 1e6),
    "ROCE_PG_ALGO_SHM_ALPHA_US": ("number", 0, 1e6),
    "ROCE_PG_ALGO_SHM_GBPS": ("number", 1e-6, 1e6),
    "ROCE_PG_ALGO_REDUCE_GBPS": ("number", 1e-6, 1e6),
    "ROCE_PG_ALGO_BRUCK_MAX_BYTES": ("int", 0, _SIZE, False),
    "ROCE_PG_NET_TRANSPORT": ("choice", ("auto", "verbs", "tcp")),
    "ROCE_PG_IB_HCA": ("text",),
    "ROCE_PG_IB_GID_INDEX": ("int", -1, 1 << 16, False),
    "ROCE_PG_IB_TC": ("int", 0, 255, False),
    "ROCE_PG_IB_SL": ("int", 0, 15, False),
    "ROCE_PG_IB_TIMEOUT": ("int", 1, 31, False),
    "ROCE_PG_IB_RETRY_CNT": ("int", 0, 7, False),
    "ROCE_PG_IB_QPS_PER_CONNECTION": ("int", 1, 16, False),
    "ROCE_PG_IB_SLOTS": ("int", 2, 256, False),
    "ROCE_PG_IB_POOL_BYTES": ("int", 64 << 10, 1 << 36, False),
    "ROCE_PG_IB_SLOT_BYTES": ("int", 256, 1 << 30, False),
    "ROCE_PG_IB_EAGER_MAX_BYTES": ("int", 0, 1 << 30, False),
    "ROCE_PG_IB_ZERO_COPY_MIN_BYTES": ("int", 0, _SIZE, False),
    "ROCE_PG_IB_REG_CACHE_BYTES": ("int", 0, 1 << 50, False),
    "ROCE_PG_IB_DEVICE_REG_BYTES": ("int", 0, 1 << 50, False),
    "ROCE_PG_SOCKET_IFNAME": ("text",),
    "ROCE_PG_CHUNK_BYTES": ("int", 4096, 1 << 30, False),
    "ROCE_PG_NCHANNELS": ("int", 0, 8, False),
    "ROCE_PG_WORKERS": ("int", 0, 64, False),
    "ROCE_PG_SHM_SLOT_BYTES": ("int", 4096, 1 << 30, False),
    "ROCE_PG_SHM_RING_BYTES": ("int", 4096, 1 << 30, False),
    "ROCE_PG_SHM_ONESHOT_MAX_BYTES": ("int", 0, 1 << 30, False),
    "ROCE_PG_INLINE_MAX_BYTES": ("int", 0, _SIZE, False),
    "ROCE_PG_SYNC_INLINE_MAX_BYTES": ("int", 0, _SIZE, False),
    "ROCE_PG_DEVICE_PIECE_BYTES": ("int", 4096, _SIZE, False),
    "ROCE_PG_DEVICE_REDUCE": ("choice", ("auto", "host", "device")),
    "ROCE_PG_GPUDIRECT": ("choice", ("auto", "off")),
    "ROCE_PG_DEVICE_STAGING_CACHE_BYTES": ("int", 0, 1 << 50, False),
    "ROCE_PG_SPIN_US": ("int", 0, 1000000, False),
    "ROCE_PG_SHM_CHUNK_BYTES": ("int", 4096, 1 << 30, True),
    "ROCE_PG_SHUTDOWN_GRACE_MS": ("int", 0, 3600000, False),
    "ROCE_PG_TRACE_ENTRIES": ("int", 0, 1 << 24, False),
    "ROCE_PG_TORCH_FR": ("choice", ("native", "hook")),
    "ROCE_PG_TRACE_DUMP": ("text",),
    "ROCE_PG_TRACE_SIGNAL": ("choice", ("off", "SIGUSR1", "SIGUSR2")),
    "ROCE_PG_HEARTBEAT_TIMEOUT_MS": ("int", 1000, 86400000, True),
    "ROCE_PG_TEST_FAULT": ("choice", ("garbage_frames", "no_doorbell", "shm_full", "fail_forming", "slow_teardown",
                                     "next_protocol")),
}

# The settings every rank of a group must set alike, or creating it fails or
# hangs: those joining a group compares (Config::algorithmSettings(), which
# tests/test_doctor.py checks this against), ROCE_PG_ALGO (read for
# ROCE_PG_ALGO_ALLREDUCE), the queue pairs per peer (the verbs handshake
# expects the same count) and the transport (each rank picks it itself).
SAME_EVERYWHERE = (
    "ROCE_PG_ALGO", "ROCE_PG_ALGO_ALLREDUCE", "ROCE_PG_ALGO_ALLREDUCE_ACROSS", "ROCE_PG_ALGO_ALLGATHER",
    "ROCE_PG_ALGO_REDUCE_SCATTER", "ROCE_PG_ALGO_BROADCAST", "ROCE_PG_ALGO_RD_MAX_BYTES", "ROCE_PG_ALGO_RING_MIN_BYTES",
    "ROCE_PG_ALGO_HIER_MIN_BYTES", "ROCE_PG_ALGO_BRUCK_MAX_BYTES", "ROCE_PG_ALGO_NET_ALPHA_US",
    "ROCE_PG_ALGO_NET_GBPS", "ROCE_PG_ALGO_NIC_GBPS", "ROCE_PG_ALGO_SHM_ALPHA_US", "ROCE_PG_ALGO_SHM_GBPS",
    "ROCE_PG_ALGO_REDUCE_GBPS", "ROCE_PG_CHUNK_BYTES", "ROCE_PG_NCHANNELS", "ROCE_PG_FORCE_NETWORK",
    "ROCE_PG_DEVICE_PIECE_BYTES", "ROCE_PG_DEVICE_REDUCE", "ROCE_PG_GPUDIRECT", "ROCE_PG_IB_DEVICE_REG_BYTES",
    "ROCE_PG_IB_QPS_PER_CONNECTION", "ROCE_PG_NET_TRANSPORT", "ROCE_PG_SUBGROUPS", "ROCE_PG_IB_SLOTS",
    "ROCE_PG_HEARTBEAT_TIMEOUT_MS",
)


def table() -> dict:
    """The extension's own table where this process has loaded it, else the copy."""
    ext = sys.modules.get("roce_pg._C")
    return ext.settings() if ext is not None and hasattr(ext, "settings") else SETTINGS


# strtoll(base 0) as the extension calls it: leading C white space, a sign,
# then hexadecimal, octal or decimal digits; nothing may follow but one K/M/G.
_INTEGER = re.compile(r"[ \t\n\v\f\r]*([+-]?)(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)([kKmMgG]?)")
_SHIFT = {"": 0, "k": 10, "m": 20, "g": 30}
_LLONG = 1 << 63


def parse_env_int(value: str, lo: int, hi: int) -> int:
    """The integer the extension reads from `value`; ValueError if the text is
    not an integer in [lo, hi] (the extension rejects it then)."""
    m = _INTEGER.fullmatch(value)
    if not m:
        raise ValueError(f"{value!r} is not an integer")
    sign, digits, suffix = m.groups()
    x = int(digits, 16 if digits[:2].lower() == "0x" else 8 if digits.startswith("0") else 10)
    x = min(-x if sign == "-" else x, _LLONG - 1)   # strtoll saturates
    x = max(x, -_LLONG)
    shift = _SHIFT[suffix.lower()]
    if not (-_LLONG >> shift) <= x <= ((_LLONG - 1) >> shift) or not lo <= x << shift <= hi:
        raise ValueError(f"{value!r} is not in [{lo}, {hi}]")
    return x << shift


def parse_size(text: str) -> int:
    """'1M' -> 1048576; plain integers are bytes."""
    return parse_env_int(text, 0, 1 << 62)


# strtod: decimal or hexadecimal floating point, inf, nan (out of every range).
_NUMBER = re.compile(r"[ \t\n\v\f\r]*[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|"
                     r"\.[0-9a-fA-F]+)(?:[pP][+-]?\d+)?|inf(?:inity)?|nan(?:\([0-9A-Za-z_]*\))?)", re.IGNORECASE)


def _parse_number(value: str) -> float:
    if not _NUMBER.fullmatch(value):
        raise ValueError
    s = value.lstrip(" \t\n\v\f\r")
    if "x" in s.lower():
        return float.fromhex(s)
    return float("nan") if "nan" in s.lower() else float(s)


_FLAGS = ("1", "true", "yes", "on", "0", "false", "no", "off")


def problem(name: str, value: str, form: Tuple) -> Optional[str]:
    """Why the extension rejects `value` for `name` (None: it accepts it)."""
    kind = form[0]
    if kind == "int":
        _, lo, hi, zero_ok = form
        try:
            x = parse_env_int(value, 0 if zero_ok else lo, hi)
        except ValueError as e:
            return f"{name}={e}"
        return f"{name}={value!r} is not 0 or in [{lo}, {hi}]" if zero_ok and x and x < lo else None
    if kind == "number":
        try:
            x = _parse_number(value)
        except ValueError:
            x = float("nan")
        return None if form[1] <= x <= form[2] else f"{name}={value!r} is not a number in [{form[1]:g}, {form[2]:g}]"
    if kind == "choice":
        return None if value in form[1] else f"{name}={value!r} (expected {', '.join(form[1])})"
    if kind == "flag":
        return None if value in _FLAGS else f"{name}={value!r} (use 1 or 0)"
    if kind == "token":
        ok = len(value) <= form[1] and re.fullmatch(r"[A-Za-z0-9_-]*", value)
        return None if ok else f"{name}={value!r} (up to {form[1]} letters, digits, '-' or '_')"
    return None


def check(env: Mapping[str, str], forms: Optional[dict] = None, skip=()):
    """(shown, bad) for the ROCE_PG_* variables set in `env` (an empty value is
    unset, as for the extension): "NAME=value" texts, and the problems."""
    shown, bad = [], []
    for name, form in (forms or SETTINGS).items():
        value = env.get(name) or ""
        if not value or name in skip:
            continue
        shown.append(f"{name}={value}")
        why = problem(name, value, form)
        if why:
            bad.append(why)
    return shown, bad
