"""Reads Nsight Compute's CSV output (`ncu --csv ...`, `ncu --import REPORT --csv`).

Both layouts NVIDIA documents for `--page`:
- raw: one row per profiled kernel, one column per metric, and (under the header) a row of units with
  empty identity columns;
- details: one row per (kernel, section, metric) with "Section Name", "Metric Name", "Metric Unit",
  "Metric Value" columns (sections' display names such as "Duration" are mapped to their metrics).

Whatever surrounds the table is tolerated: ncu's own `==PROF==` / `==WARNING==` / `==ERROR==` lines (kept
as messages for diagnoses) and the application's output before and after it. Values may carry thousands
separators ("1,234,567") or be "n/a" (a metric this GPU does not have: NaN, never 0), and units may be
scaled (`--print-units auto`: Kbyte, Mbyte, usecond, msecond, ...). Every metric comes out in ncu's base
units: bytes, nanoseconds, counts, percent.
"""

from __future__ import annotations

import csv
import io
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from opscope.errors import NsightError
from opscope.nsight.commands import diagnose, kernel_base_name
from opscope.table import NAN, Table

IDENTITY = {"ID": "id", "Process ID": "pid", "Process Name": "process", "Host Name": "host",
            "Kernel Name": "kernel", "Context": "context", "Stream": "stream", "Block Size": "block",
            "Grid Size": "grid", "Device": "device", "CC": "cc"}
METRIC_NAME = re.compile(r"^[a-z0-9_]+__[A-Za-z0-9_.]+$")
# Section display names on the details page, for reports collected with sections instead of --metrics.
DISPLAY_NAMES = {"Duration": "gpu__time_duration.sum",
                 "DRAM Throughput": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
                 "Compute (SM) Throughput": "sm__throughput.avg.pct_of_peak_sustained_elapsed"}
_MISSING = {"", "n/a", "na", "nan", "-", "--", "(n/a)"}
_PREFIX = {"": 1.0, "K": 1e3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
           "Ki": 2.0 ** 10, "Mi": 2.0 ** 20, "Gi": 2.0 ** 30, "Ti": 2.0 ** 40}
_TIME_NS = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "µs": 1e3, "msecond": 1e6, "ms": 1e6,
            "second": 1e9, "s": 1e9}
_SCALED = re.compile(r"^(?P<p>[KkMGTP]i?)?(?P<u>byte|B|inst|cycle|sector|request|warp|thread|op|block|cluster|register|SM)s?$")


@dataclass
class NcuTable:
    """One row per profiled kernel launch, in ncu's ID order (an opscope.table Table): id, kernel (as
    printed), base (its function name), pid, stream, device, grid, block (text as printed), then one float
    column per metric in base units (NaN: not measured). opscope.nsight.measured.attach_ncu adds flops and
    row (the op row each kernel lined up with)."""

    kernels: Table
    layout: str  # "raw" | "details"
    messages: list[str] = field(default_factory=list)  # ncu's own ==PROF==/==WARNING==/==ERROR== lines
    warnings: list[str] = field(default_factory=list)

    @property
    def metrics(self) -> list[str]:
        return [c for c in self.kernels if METRIC_NAME.match(c)]


def parse_number(text: str) -> float:
    """'1,234.5' -> 1234.5; 'n/a', '' -> NaN. ncu groups thousands with commas."""
    s = text.strip().replace("\u202f", "").replace("\xa0", "")
    if s.lower() in _MISSING:
        return math.nan
    try:
        return float(s.replace(",", "").replace(" ", ""))
    except ValueError:
        return math.nan


def unit_factor(unit: str) -> float | None:
    """Factor from `unit` to ncu's base unit (bytes, nanoseconds, plain counts, percent), None if unknown.
    Counts of launch resources (block, cluster, register, SM: launch__block_dim_x, launch__cluster_max_active
    on an H200) are plain counts too."""
    u = unit.strip()
    if u in ("", "%", "inst", "byte", "cycle"):
        return 1.0
    if u in _TIME_NS:
        return _TIME_NS[u]
    m = _SCALED.match(u)
    if m:
        return _PREFIX.get(m.group("p") or "")
    return None


def _rows(lines: list[str]) -> tuple[list[list[str]], int]:
    """The CSV rows of `lines` and how many lines could not be parsed (a cell over csv's field limit,
    128 KiB: no kernel name or value is that long); the reader goes on with the next line."""
    reader = csv.reader(io.StringIO("\n".join(lines)))
    rows: list[list[str]] = []
    bad = 0
    while True:
        try:
            rows.append(next(reader))
        except StopIteration:
            return rows, bad
        except csv.Error:
            bad += 1


def parse_ncu_csv(text: str, source: str = "the ncu output") -> NcuTable:
    """The kernels of an ncu CSV text. One NsightError line when it holds no table (with the diagnosis
    of ncu's own messages, e.g. ERR_NVGPUCTRPERM, when they explain why)."""
    lines = text.splitlines()
    messages = [ln.strip() for ln in lines if ln.startswith("==")]
    header_at = None
    for i, line in enumerate(lines):
        if line.startswith("==") or '"' not in line and "," not in line:
            continue
        try:
            fields = next(csv.reader([line]))
        except (csv.Error, StopIteration):
            continue
        if "Kernel Name" in fields and "ID" in fields:
            header_at = i
            break
    if header_at is None:
        why = diagnose("ncu", "\n".join(messages))
        raise NsightError(why or f"{source} holds no Nsight Compute table (no header row with \"ID\" and "
                                 "\"Kernel Name\"): was it written by `ncu --csv`?")
    header = next(csv.reader([lines[header_at]]))
    body = [ln for ln in lines[header_at + 1:] if ln.strip() and not ln.startswith("==")]
    warnings: list[str] = []
    rows = []
    parsed, skipped = _rows(body)
    for r in parsed:
        if len(r) == len(header):
            rows.append(r)
        else:
            skipped += 1
    if skipped:
        warnings.append(f"{source}: skipped {skipped} line(s) that are not rows of the table")
    if {"Metric Name", "Metric Value"} <= set(header):
        kernels = _details(header, rows, warnings, source)
        layout = "details"
    else:
        kernels = _raw(header, rows, warnings, source)
        layout = "raw"
    return NcuTable(kernels=kernels, layout=layout, messages=messages, warnings=warnings)


def read_ncu_csv(path: Path) -> NcuTable:
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise NsightError(f"cannot read {path}: {exc.strerror or exc}") from exc
    return parse_ncu_csv(text, str(path))


def _identity(record: dict[str, str]) -> dict[str, str | int | float]:
    """The identity columns of a row (as printed; the id as an int, -1 if none) and the kernel's base name;
    the metrics are added to it."""
    out: dict[str, str | int | float] = {key: record.get(col, "") for col, key in IDENTITY.items()}
    kid = parse_number(str(out["id"]))
    out["id"] = int(kid) if math.isfinite(kid) else -1
    out["base"] = kernel_base_name(str(out["kernel"]))
    return out


def _convert(value: str, unit: str, metric: str, odd_units: dict[str, str]) -> float:
    x = parse_number(value)
    factor = unit_factor(unit)
    if factor is None:
        odd_units.setdefault(metric, unit)
        return x
    return x * factor


def _raw(header: list[str], rows: list[list[str]], warnings: list[str], source: str) -> Table:
    units: dict[str, str] = {}
    id_col = header.index("ID")
    if rows and not rows[0][id_col].strip():  # the units row of the raw page
        units = dict(zip(header, rows[0], strict=True))
        rows = rows[1:]
    metrics = [h for h in header if METRIC_NAME.match(h)]
    odd: dict[str, str] = {}
    out = []
    for r in rows:
        record = dict(zip(header, r, strict=True))
        item = _identity(record)
        for m in metrics:
            item[m] = _convert(record[m], units.get(m, ""), m, odd)
        out.append(item)
    _odd_warning(odd, warnings, source)
    return _table(out, metrics)


def _details(header: list[str], rows: list[list[str]], warnings: list[str], source: str) -> Table:
    by_id: dict[tuple[int, str], dict[str, str | int | float]] = {}
    odd: dict[str, str] = {}
    shown: dict[tuple[int, str], dict[str, float]] = {}
    metrics: dict[str, None] = {}
    for r in rows:
        record = dict(zip(header, r, strict=True))
        item = _identity(record)
        key = (int(item["id"]), str(item["kernel"]))
        entry = by_id.setdefault(key, item)
        name = record.get("Metric Name", "").strip()
        value = _convert(record.get("Metric Value", ""), record.get("Metric Unit", ""), name, odd)
        if METRIC_NAME.match(name):
            metrics[name] = None
            if not _known(entry.get(name)):
                entry[name] = value
        elif name in DISPLAY_NAMES:
            shown.setdefault(key, {})[DISPLAY_NAMES[name]] = value
    for key, values in shown.items():  # display names fill in what the raw metrics did not give
        for m, v in values.items():
            if not _known(by_id[key].get(m)):
                by_id[key][m] = v
                metrics[m] = None
    _odd_warning(odd, warnings, source)
    return _table(list(by_id.values()), list(metrics))


def _known(value: object) -> bool:
    """Whether a kernel's metric already has a number (a later row of the details page does not replace it)."""
    return isinstance(value, float) and not math.isnan(value)


def _odd_warning(odd: dict[str, str], warnings: list[str], source: str) -> None:
    if odd:
        listed = ", ".join(f"{m} in {u!r}" for m, u in list(odd.items())[:4])
        warnings.append(f"{source}: unit(s) not understood, values kept as printed: {listed}")


def _table(items: list[dict[str, str | int | float]], metrics: list[str]) -> Table:
    """The kernels by id (equal ids in the order read): identity columns, base, then the metrics (NaN where
    a kernel has none)."""
    columns = list(dict.fromkeys(["id", *IDENTITY.values(), "base"]))
    metrics = [m for m in metrics if m not in columns]
    items = sorted(items, key=lambda item: int(item["id"]))
    table: Table = {c: [item.get(c, NAN) for item in items] for c in columns}
    for m in metrics:
        table[m] = [float(item.get(m, NAN)) for item in items]
    return table
