"""The doctor's rows (one per check: CHECK, STATUS, DETAIL, FIX) and how they
are shown: a table on stdout, optionally JSON, and the exit code."""
import json
import shutil
import textwrap
from dataclasses import asdict, dataclass
from typing import List, Optional

from . import _doctor_sysfs as sysfs

OK, WARN, FAIL = "OK", "WARN", "FAIL"
_SEVERITY = {OK: 0, WARN: 1, FAIL: 2}


@dataclass
class Row:
    check: str
    status: str
    detail: str
    fix: str = ""
    host: str = ""


def fmt_bytes(n: int) -> str:
    if n == sysfs.UNLIMITED:
        return "unlimited"
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << (shift - 4)) == 0:
            v = n / (1 << shift)
            return f"{v:g} {unit}"
    return f"{n} B"


def worst(rows: List[Row]) -> str:
    return max((r.status for r in rows), key=lambda s: _SEVERITY.get(s, 0), default=OK)


def _wrap(text: str, width: int) -> List[str]:
    return textwrap.wrap(text, width, break_on_hyphens=False) or [""]


def format_table(rows: List[Row], width: Optional[int] = None) -> str:
    width = width or max(100, shutil.get_terminal_size((120, 24)).columns)
    label = [(f"{r.host}: " if r.host else "") + r.check for r in rows]
    cw = min(max([len("CHECK")] + [len(x) for x in label]), 40)
    sw = 6
    rest = max(40, width - cw - sw - 6)
    dw = rest * 11 // 20
    fw = rest - dw
    out = [f"{'CHECK':<{cw}}  {'STATUS':<{sw}}  {'DETAIL':<{dw}}  FIX", "-" * min(width, cw + sw + dw + fw + 6)]
    for lab, r in zip(label, rows):
        cols = [_wrap(lab, cw), [r.status], _wrap(r.detail, dw), _wrap(r.fix, fw)]
        for i in range(max(len(c) for c in cols)):
            cells = [c[i] if i < len(c) else "" for c in cols]
            out.append(f"{cells[0]:<{cw}}  {cells[1]:<{sw}}  {cells[2]:<{dw}}  {cells[3]}".rstrip())
    return "\n".join(out)


def summary(rows: List[Row], strict: bool = False):
    counts = {s: sum(r.status == s for r in rows) for s in (OK, WARN, FAIL)}
    code = 1 if counts[FAIL] or (strict and counts[WARN]) else 0
    return counts, code


def report(rows: List[Row], json_path: Optional[str], strict: bool, extra: Optional[dict] = None) -> int:
    counts, code = summary(rows, strict)
    print(format_table(rows))
    print(f"\nroce doctor: {counts[OK]} OK, {counts[WARN]} WARN, {counts[FAIL]} FAIL -> exit {code}", flush=True)
    if json_path:
        doc = {"tool": "roce_pg.doctor", "rows": [asdict(r) for r in rows], "summary": counts, "exit_code": code}
        doc.update(extra or {})
        text = json.dumps(doc, indent=1)
        if json_path == "-":
            print(text)
        else:
            with open(json_path, "w") as f:
                f.write(text + "\n")
    return code
