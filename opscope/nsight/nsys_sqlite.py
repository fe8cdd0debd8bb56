"""Reads Nsight Systems' SQLite export (`nsys export --type sqlite`) into column tables, and attributes
the GPU work in it to steps, modules and ops through NVTX ranges.

Tables read (NVIDIA's "SQLite Schema Reference"; names resolved through `StringIds`):
- CUPTI_ACTIVITY_KIND_KERNEL (start, end, demangledName / shortName / mangledName, correlationId,
  deviceId, streamId, globalPid), CUPTI_ACTIVITY_KIND_MEMCPY (+ bytes, copyKind, srcKind, dstKind),
  CUPTI_ACTIVITY_KIND_MEMSET (+ bytes, memKind): the device work, times in ns;
- CUPTI_ACTIVITY_KIND_RUNTIME (start, end, globalTid, correlationId, nameId): the launches, joined to the
  device work on (process, correlationId);
- NVTX_EVENTS (start, end, eventType, text / textId, globalTid, domainId): push/pop ranges (eventType
  NvtxPushPopRange, 59, looked up in ENUM_NSYS_EVENT_TYPE when the export has it); registered strings
  (the `nvtx` package's) have textId, plain ones text;
- TARGET_INFO_GPU (id, name): the device's name.

The schema changes across nsys versions and tables are created lazily, so every table and column is
looked up first (`PRAGMA table_info`): a missing optional column reads as unknown, a missing table as
nothing recorded, each with a warning; only a file that is not SQLite, or has none of these tables, is
an error.
"""

from __future__ import annotations

import bisect
import math
import numbers
import re
import sqlite3
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opscope.analysis.events import innermost
from opscope.capture.options import MODULE_RANGE_PREFIX, STEP_RANGE
from opscope.errors import NsightError
from opscope.nsight.commands import kernel_base_name
from opscope.table import NAN, Table, empty, nrows, take
from opscope.trace.reader import TraceData

KERNEL_TABLE = "CUPTI_ACTIVITY_KIND_KERNEL"
MEMCPY_TABLE = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET_TABLE = "CUPTI_ACTIVITY_KIND_MEMSET"
RUNTIME_TABLE = "CUPTI_ACTIVITY_KIND_RUNTIME"
NVTX_TABLE = "NVTX_EVENTS"
PUSH_POP = 59  # ENUM_NSYS_EVENT_TYPE NvtxPushPopRange, when the export has no enum table
DOMAIN_CREATE = 75  # NvtxDomainCreate
# CUpti_ActivityMemcpyKind and CUpti_ActivityMemoryKind, spelled as torch.profiler names memcpy events.
COPY_KINDS = {1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA", 8: "DtoD", 9: "HtoH",
              10: "PtoP"}
MEMORY_KINDS = {1: "Pageable", 2: "Pinned", 3: "Device", 4: "Array", 5: "Managed", 6: "Device Static",
                7: "Managed Static"}
SQLITE_MAGIC = b"SQLite format 3\x00"
# Every query runs under a budget of SQLite VM instructions (checked every _PROGRESS_STEP): reading an
# export costs a few dozen per row, about one per byte of the file (0.04 per byte on the test exports),
# so this budget bounds the work without ever interrupting a real export, however large.
_PROGRESS_STEP = 1_000
_INSTRUCTIONS_PER_BYTE = 2_000
_MIN_INSTRUCTIONS = 10 ** 9
# An emit_nvtx range: "aten::addmm, seq = 12, op_id = 40, sizes = [[4, 5], [5, 6]], input_op_ids = [...]"
# (torch/csrc/profiler/util.cpp getNvtxStr); plain "ns::op" ranges are ops too.
_OP_RANGE = re.compile(r"^(?P<name>[A-Za-z_]\w*::[A-Za-z_][\w.]*)(?:, seq = (?P<seq>-?\d+))?(?:, op_id = \d+)?"
                       r"(?:, sizes = (?P<sizes>\[.*\]))?$")
# Times (start, end) are nanoseconds as nsys writes them, ints; ids are ints, -1 where unknown.
ACTIVITY_COLUMNS = ["kind", "name", "start", "end", "device", "stream", "correlation", "pid", "bytes"]
LAUNCH_COLUMNS = ["name", "start", "end", "gtid", "correlation", "pid"]
RANGE_COLUMNS = ["text", "start", "end", "gtid", "domain"]
# What attribute() adds to the activities (see there).
ATTRIBUTION_COLUMNS = ["gtid", "launch", "step", "module", "op_range"]

NameOf = Callable[[object], str]


@dataclass
class NsysData:
    """One export as tables (opscope.table); times are nanoseconds as nsys writes them."""

    path: str
    # kind (kernel|memcpy|memset), name, start, end, device, stream, correlation, pid, bytes (NaN: unknown);
    # by start, then end
    activities: Table
    launches: Table  # runtime API calls: name, start, end, gtid, correlation, pid
    ranges: Table  # NVTX push/pop ranges: text, start, end, gtid, domain
    gpu_name: str | None = None
    warnings: list[str] = field(default_factory=list)


def is_sqlite(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC
    except OSError:
        return False


def read_nsys_sqlite(path: Path) -> NsysData:
    """The kernels, memcpy/memset, launches and NVTX ranges of an nsys SQLite export."""
    path = Path(path)
    if not path.is_file():
        raise NsightError(f"no such file: {path}")
    if not is_sqlite(path):
        raise NsightError(f"{path} is not an SQLite database (an Nsight Systems export is made with "
                          "`nsys export --type=sqlite REPORT.nsys-rep`)")
    try:
        con = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise NsightError(f"cannot open {path}: {exc}") from exc
    budget = [max(_MIN_INSTRUCTIONS, _INSTRUCTIONS_PER_BYTE * path.stat().st_size) // _PROGRESS_STEP]

    def spend() -> int:  # nonzero interrupts the query
        budget[0] -= 1
        return budget[0] < 0

    con.set_progress_handler(spend, _PROGRESS_STEP)
    try:
        return _read(con, path)
    except sqlite3.DatabaseError as exc:
        if budget[0] < 0:
            raise NsightError(f"{path}: reading it took far more work than an Nsight Systems export of its size "
                              "needs; it is not one") from exc
        raise NsightError(f"{path} is a damaged SQLite database ({exc})") from exc
    finally:
        con.close()


class _Schema:
    def __init__(self, con: sqlite3.Connection) -> None:
        self.con = con
        # Tables only: nsys writes no views, and a view (a recursive one never ends) runs the file's own SQL.
        self.tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        self._columns: dict[str, list[str]] = {}

    def columns(self, table: str) -> list[str]:
        if table not in self._columns:
            rows = self.con.execute(f'PRAGMA table_info("{table}")').fetchall() if table in self.tables else []
            self._columns[table] = [r[1] for r in rows]
        return self._columns[table]

    def select(self, table: str, wanted: list[str], where: str = "") -> list[tuple[Any, ...]]:
        """Rows of `wanted` columns; a column the table lacks reads as NULL."""
        have = set(self.columns(table))
        expr = ", ".join(f'"{c}"' if c in have else f'NULL AS "{c}"' for c in wanted)
        return self.con.execute(f'SELECT {expr} FROM "{table}" {where}').fetchall()


def _read(con: sqlite3.Connection, path: Path) -> NsysData:
    schema = _Schema(con)
    warnings: list[str] = []
    known = {KERNEL_TABLE, MEMCPY_TABLE, MEMSET_TABLE, RUNTIME_TABLE, NVTX_TABLE, "StringIds"}
    if not schema.tables & known:
        raise NsightError(f"{path} is an SQLite database but not an Nsight Systems export (none of its tables: "
                          f"{', '.join(sorted(known))})")
    strings: dict[int, str] = {}
    if {"id", "value"} <= set(schema.columns("StringIds")):
        bad_ids = 0
        for i, v in con.execute('SELECT id, value FROM "StringIds"'):
            key = _whole(i)
            if key is None:
                bad_ids += i is not None
                continue
            strings[key] = str(v)
        if bad_ids:
            warnings.append(f"{path}: left out {bad_ids} StringIds rows whose id is not a whole number")
    elif KERNEL_TABLE in schema.tables or NVTX_TABLE in schema.tables:
        warnings.append(f"{path}: no StringIds table: kernel and range names that refer to it are unknown")

    def name_of(value: object) -> str:
        if value is None:
            return ""
        if isinstance(value, numbers.Integral):
            return strings.get(int(value), f"<string {int(value)}>")
        return str(value)

    activities = _activities(schema, name_of, warnings, path)
    launches = _launches(schema, name_of, warnings, path)
    ranges = _ranges(schema, name_of, warnings, path)
    return NsysData(path=str(path), activities=activities, launches=launches, ranges=ranges,
                    gpu_name=_gpu_name(schema, activities), warnings=warnings)


def _has_times(schema: _Schema, table: str, warnings: list[str], path: Path) -> bool:
    if table not in schema.tables:
        return False
    missing = [c for c in ("start", "end") if c not in schema.columns(table)]
    if missing:
        warnings.append(f"{path}: {table} has no {'/'.join(missing)} column; its rows are left out")
        return False
    return True


def _pid(global_id: Any) -> int:
    """The process id inside an nsys serialized GlobalId (globalPid / globalTid); -1 where unknown."""
    number = _whole(global_id)
    if number is None:
        return -1
    return (number >> 24) & 0xFFFFFF


def _number(value: Any) -> float | int | None:
    """A value of a numeric column as a number, None where it is none (NULL, NaN, text that is not a
    number): what pandas.to_numeric(errors="coerce") reads, NaN being None."""
    if value is None or isinstance(value, int):
        return value
    if isinstance(value, float):
        return None if value != value else value
    try:
        text = value.decode() if isinstance(value, bytes) else str(value)
        return int(text)
    except ValueError:
        try:
            number = float(text)
        except ValueError:
            return None
        return None if number != number else number


def _id(value: Any) -> int:
    """An id column's value as an int, -1 where unknown."""
    number = _whole(value)
    return -1 if number is None else number


def _whole(value: Any) -> int | None:
    """A column's value as an int, None where it is not a finite whole number (text, NaN, inf, 1.5)."""
    number = _number(value)
    if number is None or isinstance(number, int):
        return number
    return int(number) if math.isfinite(number) and number.is_integer() else None


def _activities(schema: _Schema, name_of: NameOf, warnings: list[str], path: Path) -> Table:
    out: list[tuple[Any, ...]] = []
    if _has_times(schema, KERNEL_TABLE, warnings, path):
        cols = schema.columns(KERNEL_TABLE)
        name_col = next((c for c in ("demangledName", "shortName", "mangledName", "name") if c in cols), None)
        if name_col is None:
            warnings.append(f"{path}: {KERNEL_TABLE} has no kernel name column; kernels are unnamed")
        for start, end, name, dev, stream, corr, gpid in schema.select(
                KERNEL_TABLE, ["start", "end", name_col or "demangledName", "deviceId", "streamId",
                               "correlationId", "globalPid"]):
            out.append(("kernel", name_of(name) or "<unnamed kernel>", start, end, dev, stream, corr, _pid(gpid),
                        math.nan))
    elif KERNEL_TABLE not in schema.tables:
        warnings.append(f"{path}: no {KERNEL_TABLE} table: the report holds no CUDA kernels (traced without "
                        "-t cuda, or the capture range never started)")
    if _has_times(schema, MEMCPY_TABLE, warnings, path):
        for start, end, nbytes, kind, src, dst, dev, stream, corr, gpid in schema.select(
                MEMCPY_TABLE, ["start", "end", "bytes", "copyKind", "srcKind", "dstKind", "deviceId", "streamId",
                               "correlationId", "globalPid"]):
            name = f"Memcpy {COPY_KINDS.get(kind, '?') if kind is not None else '?'}"
            if src in MEMORY_KINDS and dst in MEMORY_KINDS:
                name += f" ({MEMORY_KINDS[src]} -> {MEMORY_KINDS[dst]})"
            out.append(("memcpy", name, start, end, dev, stream, corr, _pid(gpid),
                        float(nbytes) if nbytes is not None else math.nan))
    if _has_times(schema, MEMSET_TABLE, warnings, path):
        for start, end, nbytes, kind, dev, stream, corr, gpid in schema.select(
                MEMSET_TABLE, ["start", "end", "bytes", "memKind", "deviceId", "streamId", "correlationId",
                               "globalPid"]):
            name = f"Memset ({MEMORY_KINDS[kind]})" if kind in MEMORY_KINDS else "Memset"
            out.append(("memset", name, start, end, dev, stream, corr, _pid(gpid),
                        float(nbytes) if nbytes is not None else math.nan))
    rows: list[tuple[Any, ...]] = []
    bad = 0
    for kind, name, start, end, dev, stream, corr, pid, nbytes in out:
        begin, finish = _number(start), _number(end)
        if begin is None or finish is None or not math.isfinite(begin) or not math.isfinite(finish) \
                or finish < begin:
            bad += 1
            continue
        rows.append((kind, name, int(begin), int(finish), _id(dev), _id(stream), _id(corr), _id(pid), nbytes))
    if bad:
        warnings.append(f"{path}: left out {bad} GPU activities without a valid start/end")
    rows.sort(key=lambda r: (r[2], r[3]))  # stable: equal times keep the tables' order
    return {c: [r[k] for r in rows] for k, c in enumerate(ACTIVITY_COLUMNS)}


def _launches(schema: _Schema, name_of: NameOf, warnings: list[str], path: Path) -> Table:
    rows: list[tuple[str, int, int, int, int, int]] = []
    if _has_times(schema, RUNTIME_TABLE, warnings, path):
        cols = schema.columns(RUNTIME_TABLE)
        if "correlationId" not in cols:
            warnings.append(f"{path}: {RUNTIME_TABLE} has no correlationId: kernels cannot be joined to their "
                            "launches (no op, module or thread for them)")
        else:
            bad = 0
            for start, end, gtid, corr, name in schema.select(
                    RUNTIME_TABLE, ["start", "end", "globalTid", "correlationId", "nameId"],
                    'WHERE "correlationId" IS NOT NULL AND "correlationId" > 0'):
                begin, finish, correlation = _whole(start), _whole(end), _whole(corr)
                if begin is None or finish is None or correlation is None:
                    bad += 1
                    continue
                rows.append((name_of(name), begin, finish, _id(gtid), correlation, _pid(gtid)))
            if bad:
                warnings.append(f"{path}: left out {bad} runtime calls without a valid start/end/correlationId")
    elif RUNTIME_TABLE not in schema.tables:
        warnings.append(f"{path}: no {RUNTIME_TABLE} table: kernels cannot be joined to the threads that launched "
                        "them")
    return {c: [r[k] for r in rows] for k, c in enumerate(LAUNCH_COLUMNS)}


def _ranges(schema: _Schema, name_of: NameOf, warnings: list[str], path: Path) -> Table:
    if not _has_times(schema, NVTX_TABLE, warnings, path):
        return empty(RANGE_COLUMNS)
    cols = set(schema.columns(NVTX_TABLE))
    push_pop, domain_create = PUSH_POP, DOMAIN_CREATE
    if {"id", "name"} <= set(schema.columns("ENUM_NSYS_EVENT_TYPE")):
        enum = dict(schema.con.execute('SELECT name, id FROM "ENUM_NSYS_EVENT_TYPE"').fetchall())
        push_pop = _whole(enum.get("NvtxPushPopRange")) or PUSH_POP
        domain_create = _whole(enum.get("NvtxDomainCreate")) or DOMAIN_CREATE
    domains: dict[int, str] = {}
    if "eventType" in cols and "domainId" in cols:
        for dom, text, tid in schema.select(NVTX_TABLE, ["domainId", "text", "textId"],
                                            f'WHERE "eventType" = {domain_create}'):
            if _whole(dom) is not None:
                domains[_id(dom)] = str(text) if text is not None else name_of(tid)
    where = f'WHERE "eventType" = {push_pop} AND "end" IS NOT NULL' if "eventType" in cols else \
        'WHERE "end" IS NOT NULL AND "end" >= "start"'
    if "eventType" not in cols:
        warnings.append(f"{path}: {NVTX_TABLE} has no eventType column: every closed range is taken as a push/pop "
                        "range")
    rows: list[tuple[str, int, int, int, str]] = []
    bad = 0
    for text, text_id, start, end, gtid, dom in schema.select(
            NVTX_TABLE, ["text", "textId", "start", "end", "globalTid", "domainId"], where):
        begin, finish = _whole(start), _whole(end)
        if begin is None or finish is None:
            bad += 1
            continue
        label = str(text) if text is not None else name_of(text_id)
        rows.append((label, begin, finish, _id(gtid), domains.get(_id(dom), "") if dom is not None else ""))
    if bad:
        warnings.append(f"{path}: left out {bad} NVTX ranges without a valid start/end")
    return {c: [r[k] for r in rows] for k, c in enumerate(RANGE_COLUMNS)}


def _gpu_name(schema: _Schema, activities: Table) -> str | None:
    if "name" not in schema.columns("TARGET_INFO_GPU"):
        return None
    rows = schema.select("TARGET_INFO_GPU", ["id", "name"])
    names = {r[0]: r[1] for r in rows if r[1]}
    if not names:
        return None
    if nrows(activities):
        counts = Counter(activities["device"])
        most = max(counts.values())
        device = min(d for d, n in counts.items() if n == most)  # the most frequent; the lowest of a tie
        if device in names:
            return str(names[device])
    return str(next(iter(names.values())))


# --- attribution ---------------------------------------------------------------------------------


def parse_op_range(text: str) -> tuple[str, str, int] | None:
    """(op name, sizes as JSON text or '', autograd sequence number or -1) of an op's NVTX range, None
    for any other range."""
    head = text.split(", input_op_ids = ", 1)[0]
    m = _OP_RANGE.match(head)
    if m is None:
        return None
    return m.group("name"), m.group("sizes") or "", int(m.group("seq")) if m.group("seq") else -1


def module_of_range(text: str) -> str | None:
    """The module path of one of opscope's module ranges ('opscope_module:encoder (Encoder)' -> 'encoder')."""
    if not text.startswith(MODULE_RANGE_PREFIX):
        return None
    return text[len(MODULE_RANGE_PREFIX):].split(" (", 1)[0]


def step_ranges(ranges: Table) -> list[int]:
    """The rows of opscope's step ranges, by start (equal starts in the export's order)."""
    starts = ranges["start"]
    return sorted((i for i, t in enumerate(ranges["text"]) if t == STEP_RANGE), key=starts.__getitem__)


def attribute(data: NsysData) -> Table:
    """The activities with what they belong to: the launching thread (gtid, -1: unknown) and time (launch,
    float ns; the activity's own start without a launch) from the runtime call with the same correlation id
    in the same process, the step (opscope's step range around the launch, on any thread: backward kernels
    launch from autograd's thread; -1: none; 0 for all without step ranges), and the innermost module range
    (module path) and op range (its text) around the launch on the launching thread ("": none)."""
    act = {c: list(v) for c, v in data.activities.items()}
    launches = data.launches
    gtids = [-1] * nrows(act)
    launch = [float(s) for s in act["start"]]
    if nrows(launches) and nrows(act):
        for i, j in enumerate(_launch_of(act, launches)):
            if j >= 0:
                gtids[i] = launches["gtid"][j]
                launch[i] = float(launches["start"][j])
    act["gtid"] = gtids
    act["launch"] = launch
    ranges = data.ranges
    steps = step_ranges(ranges)
    act["step"] = _step_of(launch, [ranges["start"][i] for i in steps], [ranges["end"][i] for i in steps])
    texts = ranges["text"]
    modules = [i for i, t in enumerate(texts) if t.startswith(MODULE_RANGE_PREFIX)]
    op_ranges = [i for i, t in enumerate(texts) if parse_op_range(t) is not None]
    act["module"] = _innermost_text(ranges, modules, act, lambda t: module_of_range(t) or "")
    act["op_range"] = _innermost_text(ranges, op_ranges, act, lambda t: t)
    return act


def _launch_of(act: Table, launches: Table) -> list[int]:
    """Per activity, the row of the runtime call that launched it (-1 if none): same process and
    correlation id; the correlation id alone where either side does not know its process."""
    index = {(p, c): i for i, (p, c) in enumerate(zip(launches["pid"], launches["correlation"], strict=True))}
    by_corr = {c: i for i, c in enumerate(launches["correlation"])}
    pids_known = any(p >= 0 for p in launches["pid"])
    out = []
    for p, c in zip(act["pid"], act["correlation"], strict=True):
        hit = index.get((p, c))
        if hit is None and (p < 0 or not pids_known):
            hit = by_corr.get(c)
        out.append(-1 if hit is None or c < 0 else hit)
    return out


def _step_of(times: Sequence[float], starts: Sequence[int], ends: Sequence[int]) -> list[int]:
    """The step whose range (starts sorted) holds each time: the last one starting at or before it, if it
    has not ended before it; -1 for none; 0 for every time when there are no steps."""
    if not starts:
        return [0] * len(times)
    out = []
    for t in times:
        k = bisect.bisect_right(starts, t) - 1
        out.append(k if k >= 0 and t <= ends[k] else -1)
    return out


def _innermost_text(ranges: Table, chosen: list[int], act: Table, label: Callable[[str], str]) -> list[str]:
    if not chosen or not nrows(act):
        return [""] * nrows(act)
    j = innermost([ranges["gtid"][i] for i in chosen], [float(ranges["start"][i]) for i in chosen],
                  [float(ranges["end"][i]) for i in chosen], act["gtid"], act["launch"])
    texts = [ranges["text"][i] for i in chosen]
    return [label(texts[k]) if k >= 0 else "" for k in j]


# --- as a trace ------------------------------------------------------------------------------------

_CATEGORY = {"kernel": "kernel", "memcpy": "gpu_memcpy", "memset": "gpu_memset"}


def _split_gtid(gtid: int) -> tuple[int, int]:
    """(pid, tid) of an nsys serialized GlobalId."""
    return (gtid >> 24) & 0xFFFFFF, gtid & 0xFFFFFF


def _synthetic_op(kind: str, name: str) -> str:
    """The row name of a launch when the report has no op ranges: `kernel::<function name>`,
    `cuda::memcpy_HtoD`, `cuda::memset`."""
    if kind == "kernel":
        return "kernel::" + (re.sub(r"\W", "_", kernel_base_name(name)) or "unnamed")
    if kind == "memcpy":
        return "cuda::memcpy_" + re.sub(r"\W", "_", kernel_base_name(name).removeprefix("Memcpy ").strip())
    return "cuda::memset"


def _op_table(names: list[str], gtids: list[int], dims: list[str], seqs: list[int], starts: list[int],
              ends: list[int], us: Callable[[int], float]) -> Table:
    """Op rows as a torch trace's ops table (opscope.trace.reader): what nsys cannot know is "", -1 or NaN."""
    n = len(names)
    pid_tid = [_split_gtid(g) for g in gtids]
    return {
        "name": names, "pid": [p for p, _ in pid_tid], "tid": [t for _, t in pid_tid], "input_dims": dims,
        "input_dtypes": [""] * n, "input_strides": [""] * n, "concrete_inputs": [""] * n, "call_stack": [""] * n,
        "ts": [us(s) for s in starts], "dur": [(e - s) / 1e3 for s, e in zip(starts, ends, strict=True)],
        "ext_id": [-1] * n, "seq": seqs, "fwd_tid": [-1] * n,
        "kernel_backend": [""] * n, "kernel_flop": [NAN] * n, "kernel_num_gb": [NAN] * n, "kernel_file": [""] * n}


def to_trace_data(data: NsysData) -> TraceData:
    """The export as the tables a torch.profiler trace gives (opscope.trace.reader.TraceData), so that `opscope
    analyze` runs its whole analysis on it: ops are the NVTX op ranges (emit_nvtx(record_shapes=True):
    name, sizes; no dtypes, strides or values), kernels are joined to them through their launches, steps
    are opscope's step ranges. A report without op ranges gets one op per launch, named after its kernel."""
    act = data.activities
    launches = data.launches
    ranges = data.ranges
    t0 = min((min(t["start"]) for t in (act, launches, ranges) if nrows(t)), default=0)

    def us(ns: int) -> float:
        return (ns - t0) / 1e3

    warnings = list(data.warnings)
    op_rows: list[tuple[int, tuple[str, str, int]]] = []
    for i, text in enumerate(ranges["text"]):
        parsed = parse_op_range(text)
        if parsed is not None:
            op_rows.append((i, parsed))
    if op_rows:
        rows = [i for i, _ in op_rows]
        ops = _op_table([p[0] for _, p in op_rows], [ranges["gtid"][i] for i in rows], [p[1] for _, p in op_rows],
                        [p[2] for _, p in op_rows], [ranges["start"][i] for i in rows],
                        [ranges["end"][i] for i in rows], us)
    else:
        ops = _launch_ops(act, launches, us)
        if nrows(ops):
            warnings.append(f"{data.path}: no NVTX op ranges (record with `opscope profile --nsys --nvtx-ops`, or run "
                            "the model under torch.autograd.profiler.emit_nvtx(record_shapes=True)): each launch is "
                            "a row named after its kernel")
    if not nrows(ops):
        raise NsightError(f"{data.path} holds no CUDA kernels, launches or NVTX op ranges to analyze")
    n_act, n_launch = nrows(act), nrows(launches)
    kernels = {
        "cat": [_CATEGORY[k] for k in act["kind"]], "name": list(act["name"]), "ts": [us(s) for s in act["start"]],
        "dur": [(e - s) / 1e3 for s, e in zip(act["start"], act["end"], strict=True)],
        "correlation": list(act["correlation"]), "ext_id": [-1] * n_act, "stream": list(act["stream"]),
        "device": list(act["device"])}
    launch_ids = [_split_gtid(g) for g in launches["gtid"]]
    launch_table = {
        "name": list(launches["name"]), "pid": [p for p, _ in launch_ids], "tid": [t for _, t in launch_ids],
        "ts": [us(s) for s in launches["start"]],
        "dur": [(e - s) / 1e3 for s, e in zip(launches["start"], launches["end"], strict=True)],
        "correlation": list(launches["correlation"]), "ext_id": [-1] * n_launch}
    steps = take(ranges, step_ranges(ranges))
    step_ids = [_split_gtid(g) for g in steps["gtid"]]
    step_table: Table = {"step": list(range(nrows(steps))), "pid": [p for p, _ in step_ids], "tid": [t for _, t in step_ids],
                  "ts": [us(s) for s in steps["start"]],
                  "dur": [(e - s) / 1e3 for s, e in zip(steps["start"], steps["end"], strict=True)]}
    python = empty(["name", "pid", "tid", "ts", "dur"])
    return TraceData(path=data.path, ops=ops, kernels=kernels, launches=launch_table, steps=step_table,
                     python=python, device_properties=[{"name": data.gpu_name}] if data.gpu_name else [],
                     torch_version=None, gpu_runtime="cuda" if n_act else None,
                     n_events=n_act + n_launch + nrows(ranges), warnings=warnings)


def _launch_ops(act: Table, launches: Table, us: Callable[[int], float]) -> Table:
    """One op row per launch that started device work, named after that work (_synthetic_op), in the
    launches' order; no rows when nothing was launched."""
    if not nrows(launches) or not nrows(act):
        return {}
    launched: dict[int, str] = {}
    for j, kind, name in zip(_launch_of(act, launches), act["kind"], act["name"], strict=True):
        if j >= 0 and j not in launched:
            launched[j] = _synthetic_op(kind, name)
    keep = sorted(launched)
    n = len(keep)
    return _op_table([launched[j] for j in keep], [launches["gtid"][j] for j in keep], [""] * n, [-1] * n,
                     [launches["start"][j] for j in keep], [launches["end"][j] for j in keep], us)
