"""Byte sizes as the benchmarks' command lines take them: "8", "64K", "1M",
"1.5G", "32MB", "4KiB".

K, M and G are binary (1 << 10, 1 << 20, 1 << 30), in either case, with or
without a trailing B or iB; a fraction is allowed with a unit (rounded down
to whole bytes). Blanks around the text are ignored, and an empty size is 0.
"""
UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text):
    """Bytes in `text` ("64K" -> 65536); ValueError when it is not a size."""
    s = text.strip().upper().removesuffix("B")
    if s[-2:] in ("KI", "MI", "GI"):
        s = s[:-1]
    if s[-1:] not in UNITS:
        return int(s or "0")
    number, unit = s[:-1], UNITS[s[-1]]
    try:
        return int(number) * unit
    except ValueError:
        return int(float(number) * unit)
