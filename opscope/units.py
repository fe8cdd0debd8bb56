"""How numbers are written, everywhere opscope shows them (console, HTML, finding messages): one
formatter per kind of quantity, so a rate reads "1.57 TB/s" in a table and in a sentence alike, never
"1.57e+03 GB/s". Torch-free and renderer-free: findings use it too.

A value that is not known (no cost formula, no ceiling, no time) is written UNKNOWN; docs/reference/reading.md says
why a value can be unknown.
"""

from __future__ import annotations

import math
from typing import Any

UNKNOWN = "-"
_DECIMAL = ("", "k", "M", "G", "T", "P", "E")
_BINARY = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")


def number(value: Any) -> float | None:
    """A finite float, or None (NaN, inf, None, text, bools)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def si(value: Any, unit: str = "", base: float = 1000.0) -> str:
    """`value` with an SI (or, base 1024, binary) prefix and 3 significant digits: '1.57 TFLOP/s',
    '258 KiB', '0'; UNKNOWN when not a finite number."""
    v = number(value)
    if v is None:
        return UNKNOWN
    prefixes = _DECIMAL if base == 1000.0 else _BINARY
    i = 0
    while abs(v) >= base and i < len(prefixes) - 1:
        v /= base
        i += 1
    if round(abs(v), 3 - len(str(int(abs(v))))) >= base and i < len(prefixes) - 1:
        v /= base  # 999.7 would round to "1e+03": write it as 1 of the next prefix
        i += 1
    text = f"{v:.0f}" if (i == 0 and float(v).is_integer()) else _g3(v)
    return f"{text} {prefixes[i]}{unit}".strip()


def _g3(v: float) -> str:
    """3 significant digits, never in exponent notation (|v| < 1000 here; below 0.0001 it reads 0)."""
    text = f"{v:.3g}"
    return text if "e" not in text else (f"{v:.4f}".rstrip("0").rstrip(".") or "0")


def rate(per_second: Any, unit: str) -> str:
    """A rate such as bytes or FLOPs per second: rate(1.57e12, "B/s") -> '1.57 TB/s'."""
    return si(per_second, unit)


def gbps(value: Any) -> str:
    """GB/s as opscope's tables store them -> '6.57 GB/s', '1.57 TB/s'."""
    v = number(value)
    return rate(v * 1e9 if v is not None else None, "B/s")


def gflops(value: Any) -> str:
    """GFLOP/s as stored -> '426 GFLOP/s', '1.98 PFLOP/s'."""
    v = number(value)
    return rate(v * 1e9 if v is not None else None, "FLOP/s")


def nbytes(value: Any) -> str:
    """Bytes in binary units: '4 MiB', '258 KiB', '12 B'."""
    return si(value, "B", 1024.0)


def duration(us: Any) -> str:
    """A time given in microseconds, in a sentence: 3 significant digits and the largest unit that keeps
    the number at or above 1: '4.12 ms', '754 µs', '1.2 s'."""
    v = number(us)
    if v is None:
        return UNKNOWN
    if abs(v) >= 1e6:
        return f"{v / 1e6:.3g} s"
    if abs(v) >= 1e3:
        return f"{v / 1e3:.3g} ms"
    return f"{v:.3g} µs"


def time_cell(us: Any) -> str:
    """A time given in microseconds, in a table column: fixed decimals, so that a column of times lines
    up ('10.74 ms', '41.3 µs', '2.80 s')."""
    v = number(us)
    if v is None:
        return UNKNOWN
    if v >= 1e6:
        return f"{v / 1e6:.2f} s"
    if v >= 1e3:
        return f"{v / 1e3:.2f} ms"
    return f"{v:.1f} µs"


def percent(value: Any, scale: float = 1.0) -> str:
    """A share as a percentage with one decimal: percent(0.123, 100) -> '12.3%'."""
    v = number(value)
    return UNKNOWN if v is None else f"{v * scale:.1f}%"


def count(n: Any, one: str, many: str | None = None) -> str:
    """A count with its noun: count(1, "thread") -> '1 thread', count(2.5, "call") -> '2.5 calls'
    (`many` defaults to `one` + "s"); what is not a number is shown as it is, with the plural."""
    v = number(n)
    plural = many or one + "s"
    return f"{n} {plural}" if v is None else f"{v:g} {one if v == 1 else plural}"
