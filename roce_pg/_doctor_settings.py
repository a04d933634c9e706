"""The ROCE_PG_* settings the extension accepts, and their validation as the
extension does it (csrc/common/env_reader.cpp), without loading it.

SETTINGS and DECLARATIONS come from roce_pg/_settings_table.py, which the
build writes from the extension it built (setup.py: roce_pg._C.settings() and
setting_declarations(), both listed by Config::read, where each setting is
declared once). The doctor reads that file because it must run where the
extension does not load, and in seconds in an emulated VM (no torch import);
where the extension is loaded (--import, torchrun) it validates with the
extension's own table (`table()`).

Forms: ("int", lo, hi, zero_ok): strtoll base 0 with an optional K/M/G
suffix, in [lo, hi], or 0 when zero_ok; ("number", lo, hi): strtod;
("choice", names); ("flag",): 1/true/yes/on or 0/false/no/off; ("text",): any;
("token", n): up to n letters, digits, '-' or '_'. Declarations: (layer,
scope, placement), scope "rank", "group" (formation compares it), "advised"
(must match everywhere, checked elsewhere) or "machine" (within a machine).
"""
import re
import sys
from typing import Mapping, Optional, Tuple

try:
    from ._settings_table import DECLARATIONS, SETTINGS
except ImportError as e:  # a checkout that was never built
    raise ImportError("roce_pg/_settings_table.py is missing: the build writes it beside the extension "
                      "(bash scripts/setup.sh, or pip install --no-build-isolation -e .)") from e

# The settings every rank of a group must set alike, or creating it fails:
# those formation compares (scope "group") and those whose difference fails
# with an error of its own ("advised": the transport, ROCE_PG_ALGO).
SAME_EVERYWHERE = tuple(name for name, (_, scope, _) in DECLARATIONS.items() if scope in ("group", "advised"))
# And those every rank of one machine must set alike (shared-memory layouts);
# machines may differ.
SAME_ON_MACHINE = tuple(name for name, (_, scope, _) in DECLARATIONS.items() if scope == "machine")


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
