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

import math
import numbers
import re
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from opscope.analysis.events import innermost
from opscope.capture.options import MODULE_RANGE_PREFIX, STEP_RANGE
from opscope.errors import NsightError
from opscope.nsight.commands import kernel_base_name
from opscope.table import from_frame
from opscope.trace.reader import TraceData

if TYPE_CHECKING:  # imported where used: `opscope analyze` of a torch trace imports this module, not pandas
    import numpy as np
    import pandas as pd

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
# An emit_nvtx range: "aten::addmm, seq = 12, op_id = 40, sizes = [[4, 5], [5, 6]], input_op_ids = [...]"
# (torch/csrc/profiler/util.cpp getNvtxStr); plain "ns::op" ranges are ops too.
_OP_RANGE = re.compile(r"^(?P<name>[A-Za-z_]\w*::[A-Za-z_][\w.]*)(?:, seq = (?P<seq>-?\d+))?(?:, op_id = \d+)?"
                       r"(?:, sizes = (?P<sizes>\[.*\]))?$")
_ACTIVITY_COLUMNS = ["kind", "name", "start", "end", "device", "stream", "correlation", "pid", "bytes"]


@dataclass
class NsysData:
    """One export as tables; times are nanoseconds as nsys writes them."""

    path: str
    activities: pd.DataFrame  # kind (kernel|memcpy|memset), name, start, end, device, stream, correlation, pid, bytes
    launches: pd.DataFrame  # runtime API calls: name, start, end, gtid, correlation, pid
    ranges: pd.DataFrame  # NVTX push/pop ranges: text, start, end, gtid, domain
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
    try:
        return _read(con, path)
    except sqlite3.DatabaseError as exc:
        raise NsightError(f"{path} is a damaged SQLite database ({exc})") from exc
    finally:
        con.close()


class _Schema:
    def __init__(self, con: sqlite3.Connection) -> None:
        self.con = con
        self.tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}
        self._columns: dict[str, list[str]] = {}

    def columns(self, table: str) -> list[str]:
        if table not in self._columns:
            rows = self.con.execute(f'PRAGMA table_info("{table}")').fetchall() if table in self.tables else []
            self._columns[table] = [r[1] for r in rows]
        return self._columns[table]

    def select(self, table: str, wanted: list[str], where: str = "") -> list[tuple]:
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
        strings = {int(i): str(v) for i, v in con.execute('SELECT id, value FROM "StringIds"') if i is not None}
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


def _pid(global_id: object) -> int:
    """The process id inside an nsys serialized GlobalId (globalPid / globalTid)."""
    if global_id is None:
        return -1
    return (int(global_id) >> 24) & 0xFFFFFF


def _activities(schema: _Schema, name_of, warnings: list[str], path: Path) -> pd.DataFrame:  # noqa: ANN001
    import numpy as np
    import pandas as pd

    out: list[tuple] = []
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
    df = pd.DataFrame(out, columns=_ACTIVITY_COLUMNS)
    for c in ("device", "stream", "correlation", "pid"):
        df[c] = pd.to_numeric(df[c], errors="coerce").fillna(-1).astype(np.int64)
    for c in ("start", "end"):
        df[c] = pd.to_numeric(df[c], errors="coerce")
    bad = df["start"].isna() | df["end"].isna() | (df["end"] < df["start"])
    if bad.any():
        warnings.append(f"{path}: left out {int(bad.sum())} GPU activities without a valid start/end")
        df = df[~bad]
    df = df.astype({"start": np.int64, "end": np.int64})
    return df.sort_values(["start", "end"], kind="stable").reset_index(drop=True)


def _launches(schema: _Schema, name_of, warnings: list[str], path: Path) -> pd.DataFrame:  # noqa: ANN001
    import numpy as np
    import pandas as pd

    rows: list[tuple] = []
    if _has_times(schema, RUNTIME_TABLE, warnings, path):
        cols = schema.columns(RUNTIME_TABLE)
        if "correlationId" not in cols:
            warnings.append(f"{path}: {RUNTIME_TABLE} has no correlationId: kernels cannot be joined to their "
                            "launches (no op, module or thread for them)")
        else:
            for start, end, gtid, corr, name in schema.select(
                    RUNTIME_TABLE, ["start", "end", "globalTid", "correlationId", "nameId"],
                    'WHERE "correlationId" IS NOT NULL AND "correlationId" > 0'):
                rows.append((name_of(name), start, end, -1 if gtid is None else int(gtid), int(corr), _pid(gtid)))
    elif RUNTIME_TABLE not in schema.tables:
        warnings.append(f"{path}: no {RUNTIME_TABLE} table: kernels cannot be joined to the threads that launched "
                        "them")
    df = pd.DataFrame(rows, columns=["name", "start", "end", "gtid", "correlation", "pid"])
    return df.astype({"start": np.int64, "end": np.int64, "gtid": np.int64, "correlation": np.int64,
                      "pid": np.int64}) if len(df) else df


def _ranges(schema: _Schema, name_of, warnings: list[str], path: Path) -> pd.DataFrame:  # noqa: ANN001
    import numpy as np
    import pandas as pd

    columns = ["text", "start", "end", "gtid", "domain"]
    if not _has_times(schema, NVTX_TABLE, warnings, path):
        return pd.DataFrame(columns=columns)
    cols = set(schema.columns(NVTX_TABLE))
    push_pop, domain_create = PUSH_POP, DOMAIN_CREATE
    if {"id", "name"} <= set(schema.columns("ENUM_NSYS_EVENT_TYPE")):
        enum = dict(schema.con.execute('SELECT name, id FROM "ENUM_NSYS_EVENT_TYPE"').fetchall())
        push_pop = int(enum.get("NvtxPushPopRange", PUSH_POP))
        domain_create = int(enum.get("NvtxDomainCreate", DOMAIN_CREATE))
    domains: dict[int, str] = {}
    if "eventType" in cols and "domainId" in cols:
        for dom, text, tid in schema.select(NVTX_TABLE, ["domainId", "text", "textId"],
                                            f'WHERE "eventType" = {domain_create}'):
            if dom is not None:
                domains[int(dom)] = str(text) if text is not None else name_of(tid)
    where = f'WHERE "eventType" = {push_pop} AND "end" IS NOT NULL' if "eventType" in cols else \
        'WHERE "end" IS NOT NULL AND "end" >= "start"'
    if "eventType" not in cols:
        warnings.append(f"{path}: {NVTX_TABLE} has no eventType column: every closed range is taken as a push/pop "
                        "range")
    rows = []
    for text, text_id, start, end, gtid, dom in schema.select(
            NVTX_TABLE, ["text", "textId", "start", "end", "globalTid", "domainId"], where):
        label = str(text) if text is not None else name_of(text_id)
        rows.append((label, start, end, -1 if gtid is None else int(gtid),
                     domains.get(int(dom), "") if dom is not None else ""))
    df = pd.DataFrame(rows, columns=columns)
    if len(df):
        df = df.astype({"start": np.int64, "end": np.int64, "gtid": np.int64})
    return df


def _gpu_name(schema: _Schema, activities: pd.DataFrame) -> str | None:
    if "name" not in schema.columns("TARGET_INFO_GPU"):
        return None
    rows = schema.select("TARGET_INFO_GPU", ["id", "name"])
    names = {r[0]: r[1] for r in rows if r[1]}
    if not names:
        return None
    if len(activities):
        device = int(activities["device"].mode().iloc[0])
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


def attribute(data: NsysData) -> pd.DataFrame:
    """The activities with what they belong to: the launching thread and time (from the runtime call with
    the same correlation id in the same process), the step (opscope's step range around the launch, on any
    thread: backward kernels launch from autograd's thread), and the innermost module range and op range
    around the launch on the launching thread."""
    import numpy as np

    act = data.activities.copy()
    n = len(act)
    act["gtid"] = np.int64(-1)
    act["launch"] = act["start"].astype(float)
    if len(data.launches) and n:
        found = _launch_of(act, data.launches)
        gtids = data.launches["gtid"].to_numpy()
        starts = data.launches["start"].to_numpy()
        found_arr = np.asarray(found, dtype=np.int64)
        ok = found_arr >= 0
        act.loc[ok, "gtid"] = gtids[found_arr[ok]]
        act.loc[ok, "launch"] = starts[found_arr[ok]].astype(float)
    ranges = data.ranges
    texts = ranges["text"].tolist()
    steps = ranges[ranges["text"] == STEP_RANGE].sort_values("start", kind="stable")
    act["step"] = _step_of(act["launch"].to_numpy(), steps["start"].to_numpy(), steps["end"].to_numpy())
    op_mask = np.asarray([parse_op_range(t) is not None for t in texts], dtype=bool)
    mod_mask = np.asarray([t.startswith(MODULE_RANGE_PREFIX) for t in texts], dtype=bool)
    act["module"] = _innermost_text(ranges, mod_mask, act, lambda t: module_of_range(t) or "")
    act["op_range"] = _innermost_text(ranges, op_mask, act, lambda t: t)
    return act


def _launch_of(act: pd.DataFrame, launches: pd.DataFrame) -> list[int]:
    """Per activity, the row of the runtime call that launched it (-1 if none): same process and
    correlation id; the correlation id alone where either side does not know its process."""
    index = {(p, c): i for i, (p, c) in enumerate(zip(launches["pid"].tolist(), launches["correlation"].tolist(),
                                                      strict=True))}
    by_corr = {c: i for i, c in enumerate(launches["correlation"].tolist())}
    pids_known = bool((launches["pid"] >= 0).any())
    out = []
    for p, c in zip(act["pid"].tolist(), act["correlation"].tolist(), strict=True):
        hit = index.get((p, c))
        if hit is None and (p < 0 or not pids_known):
            hit = by_corr.get(c)
        out.append(-1 if hit is None or c < 0 else hit)
    return out


def _step_of(times: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    import numpy as np

    if len(starts) == 0:
        return np.zeros(len(times), dtype=np.int64)
    idx = np.searchsorted(starts, times, side="right") - 1
    inside = (idx >= 0) & (times <= ends[np.clip(idx, 0, None)])
    return np.where(inside, idx, -1).astype(np.int64)


def _innermost_text(ranges: pd.DataFrame, mask: np.ndarray, act: pd.DataFrame, label) -> list[str]:  # noqa: ANN001
    chosen = ranges[mask] if len(ranges) else ranges
    if not len(chosen) or not len(act):
        return [""] * len(act)
    j = innermost(chosen["gtid"].to_numpy(), chosen["start"].to_numpy().astype(float),
                  chosen["end"].to_numpy().astype(float), act["gtid"].to_numpy(), act["launch"].to_numpy())
    texts = chosen["text"].tolist()
    return [label(texts[k]) if k >= 0 else "" for k in (int(x) for x in j)]


# --- as a trace ------------------------------------------------------------------------------------

_CATEGORY = {"kernel": "kernel", "memcpy": "gpu_memcpy", "memset": "gpu_memset"}


def _split_gtid(gtid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return (gtid >> 24) & 0xFFFFFF, gtid & 0xFFFFFF


def _synthetic_op(kind: str, name: str) -> str:
    """The row name of a launch when the report has no op ranges: `kernel::<function name>`,
    `cuda::memcpy_HtoD`, `cuda::memset`."""
    if kind == "kernel":
        return "kernel::" + (re.sub(r"\W", "_", kernel_base_name(name)) or "unnamed")
    if kind == "memcpy":
        return "cuda::memcpy_" + re.sub(r"\W", "_", kernel_base_name(name).removeprefix("Memcpy ").strip())
    return "cuda::memset"


def to_trace_data(data: NsysData) -> TraceData:
    """The export as the tables a torch.profiler trace gives (opscope.trace.reader.TraceData), so that `opscope
    analyze` runs its whole analysis on it: ops are the NVTX op ranges (emit_nvtx(record_shapes=True):
    name, sizes; no dtypes, strides or values), kernels are joined to them through their launches, steps
    are opscope's step ranges. A report without op ranges gets one op per launch, named after its kernel."""
    import numpy as np
    import pandas as pd

    act = data.activities
    launches = data.launches
    ranges = data.ranges
    starts = [int(x.min()) for x in (act["start"], launches["start"] if len(launches) else act["start"],
                                      ranges["start"] if len(ranges) else act["start"]) if len(x)]
    t0 = min(starts) if starts else 0

    def us(ns: pd.Series | np.ndarray) -> np.ndarray:
        return (np.asarray(ns, dtype=np.int64) - t0) / 1e3

    warnings = list(data.warnings)
    op_rows = [(i, parse_op_range(t)) for i, t in enumerate(ranges["text"].tolist())]
    op_rows = [(i, p) for i, p in op_rows if p is not None]
    if op_rows:
        idx = [i for i, _ in op_rows]
        sel = ranges.iloc[idx]
        pid, tid = _split_gtid(sel["gtid"].to_numpy())
        ops = pd.DataFrame({
            "name": [p[0] for _, p in op_rows], "pid": pid, "tid": tid,
            "input_dims": [p[1] for _, p in op_rows], "input_dtypes": "", "input_strides": "",
            "concrete_inputs": "", "call_stack": "",
            "ts": us(sel["start"]), "dur": (sel["end"].to_numpy() - sel["start"].to_numpy()) / 1e3,
            "ext_id": np.int64(-1), "seq": np.asarray([p[2] for _, p in op_rows], dtype=np.int64),
            "fwd_tid": np.int64(-1)})
    else:
        ops = _launch_ops(act, launches, us)
        if len(ops):
            warnings.append(f"{data.path}: no NVTX op ranges (record with `opscope profile --nsys --nvtx-ops`, or run "
                            "the model under torch.autograd.profiler.emit_nvtx(record_shapes=True)): each launch is "
                            "a row named after its kernel")
    if not len(ops):
        raise NsightError(f"{data.path} holds no CUDA kernels, launches or NVTX op ranges to analyze")
    ops["kernel_backend"] = pd.Series([""] * len(ops), dtype=object)
    ops["kernel_flop"] = np.nan
    ops["kernel_num_gb"] = np.nan
    kernels = pd.DataFrame({
        "cat": [_CATEGORY[k] for k in act["kind"].tolist()], "name": act["name"].tolist(),
        "ts": us(act["start"]), "dur": (act["end"].to_numpy() - act["start"].to_numpy()) / 1e3,
        "correlation": act["correlation"].to_numpy(), "ext_id": np.int64(-1),
        "stream": act["stream"].to_numpy(), "device": act["device"].to_numpy()})
    lpid, ltid = _split_gtid(launches["gtid"].to_numpy()) if len(launches) else (np.zeros(0, np.int64),) * 2
    launch_df = pd.DataFrame({
        "name": launches["name"].tolist() if len(launches) else [], "pid": lpid, "tid": ltid,
        "ts": us(launches["start"]) if len(launches) else np.zeros(0),
        "dur": (launches["end"].to_numpy() - launches["start"].to_numpy()) / 1e3 if len(launches) else np.zeros(0),
        "correlation": launches["correlation"].to_numpy() if len(launches) else np.zeros(0, np.int64),
        "ext_id": np.full(len(launches), -1, dtype=np.int64)})
    step_ranges = ranges[ranges["text"] == STEP_RANGE].sort_values("start", kind="stable")
    spid, stid = _split_gtid(step_ranges["gtid"].to_numpy())
    steps = pd.DataFrame({"step": np.arange(len(step_ranges), dtype=np.int64), "pid": spid, "tid": stid,
                          "ts": us(step_ranges["start"]),
                          "dur": (step_ranges["end"].to_numpy() - step_ranges["start"].to_numpy()) / 1e3})
    python = {c: [] for c in ("name", "pid", "tid", "ts", "dur")}
    return TraceData(path=data.path, ops=from_frame(ops), kernels=from_frame(kernels), launches=from_frame(launch_df),
                     steps=from_frame(steps), python=python,
                     device_properties=[{"name": data.gpu_name}] if data.gpu_name else [],
                     torch_version=None, gpu_runtime="cuda" if len(act) else None,
                     n_events=len(act) + len(launches) + len(ranges), warnings=warnings)


def _launch_ops(act: pd.DataFrame, launches: pd.DataFrame, us) -> pd.DataFrame:  # noqa: ANN001
    import numpy as np
    import pandas as pd

    if not len(launches) or not len(act):
        return pd.DataFrame()
    launched: dict[int, str] = {}
    for j, (kind, name) in zip(_launch_of(act, launches), zip(act["kind"].tolist(), act["name"].tolist(),
                                                                strict=True), strict=True):
        if j >= 0 and j not in launched:
            launched[j] = _synthetic_op(kind, name)
    keep = sorted(launched)
    names = [launched[j] for j in keep]
    sel = launches.iloc[keep]
    pid, tid = _split_gtid(sel["gtid"].to_numpy())
    return pd.DataFrame({
        "name": names, "pid": pid, "tid": tid, "input_dims": "", "input_dtypes": "", "input_strides": "",
        "concrete_inputs": "", "call_stack": "", "ts": us(sel["start"]),
        "dur": (sel["end"].to_numpy() - sel["start"].to_numpy()) / 1e3, "ext_id": np.int64(-1),
        "seq": np.int64(-1), "fwd_tid": np.int64(-1)})
