"""Reads torch.profiler Chrome traces (.json / .json.gz) into column tables.

Keyed on which fields are present, not on torch versions: traces from torch 2.x CPU runs, CUDA (CUPTI)
and ROCm (roctracer) runs all decode with the same code. No torch import: `opscope analyze` must start
fast. Decoding uses msgspec with typed structs, so only the fields opscope needs become Python objects
("Input Dims" & co. stay raw JSON text, exactly as the trace wrote them).
"""

from __future__ import annotations

import gc
import gzip
import json
import re
import zlib
from array import array
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from opscope.errors import TraceError
from opscope.sources import trace_frame_location as frame_location_of

DEVICE_ACTIVITY_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
# torch.compile's call of one inductor graph: a record_function range (user_annotation) around the
# graph's kernels and extern ops; kept as an op event so the graph's own time can be a row.
COMPILED_GRAPH_RE = re.compile(r"^## Call CompiledFxGraph\b.*##$")


class _Args(msgspec.Struct):
    external_id: int | None = msgspec.field(default=None, name="External id")
    correlation: int | None = None
    seq: int | None = msgspec.field(default=None, name="Sequence number")
    fwd_tid: int | None = msgspec.field(default=None, name="Fwd thread id")
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input type")
    input_strides: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input Strides")
    concrete: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Concrete Inputs")
    call_stack: str | None = msgspec.field(default=None, name="Call stack")
    stream: int | None = None
    device: int | None = None
    # inductor's kernel launch records: "triton" for its Triton kernels; its own cost estimates when
    # compiled with config.benchmark_kernel / profile_bandwidth
    kernel_backend: str | None = None
    kernel_flop: float | None = None
    kernel_num_gb: float | None = None


class _Event(msgspec.Struct):
    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float = 0.0
    dur: float = 0.0
    args: _Args | None = None


class _TraceFile(msgspec.Struct):
    # Events stay raw here and are decoded in batches (see _columnize): decoding millions of events in
    # one go costs several times more time and memory than batches that are dropped once tabulated.
    traceEvents: list[msgspec.Raw] | None = None  # noqa: N815 (the trace's own key)
    deviceProperties: list[dict[str, Any]] | None = None  # noqa: N815
    distributedInfo: dict[str, Any] | None = None  # noqa: N815
    torch_version: str | None = None
    pytorch_version: str | None = None
    cuda_runtime_version: int | str | None = None
    hip_runtime_version: int | str | None = None
    roctracer_version: int | str | float | None = None
    cupti_version: int | str | None = None


_DECODER = msgspec.json.Decoder(_TraceFile)
_BATCH_DECODER = msgspec.json.Decoder(list[_Event])
BATCH = 20_000


@dataclass
class TraceData:
    """One trace as column tables. Times are microseconds, as the trace writes them."""

    path: str
    ops: pd.DataFrame
    kernels: pd.DataFrame
    launches: pd.DataFrame
    steps: pd.DataFrame
    python: pd.DataFrame  # user (and harness) frames only; "name" holds their 'file:line' location
    # ops: besides cpu_op events, torch.compile's `## Call CompiledFxGraph <key> ##` ranges; columns
    # kernel_backend / kernel_flop / kernel_num_gb carry inductor's launch args ("" / NaN elsewhere)
    device_properties: list[dict[str, Any]] = field(default_factory=list)
    torch_version: str | None = None
    gpu_runtime: str | None = None  # "cuda" | "rocm" | None
    distributed: dict[str, Any] | None = None
    n_events: int = 0

    @property
    def has_gpu(self) -> bool:
        return len(self.kernels) > 0


class _TextCache(dict):
    """Raw JSON bytes -> one shared str. Shapes repeat across steps and layers, so a million ops hold a
    few thousand distinct strings."""

    def text(self, raw: msgspec.Raw) -> str:
        key = bytes(raw)
        hit = self.get(key)
        if hit is None:
            hit = self[key] = _normalise(key.decode())
        return hit


def _normalise(text: str) -> str:
    if not text or text == "null":
        return ""
    if "\n" in text or ("," in text and ", " not in text):
        # another writer's layout: re-dump in the one-line form torch writes ("[[8, 16], [16]]")
        text = json.dumps(json.loads(text))
    return text


def read_bytes(path: str | Path) -> bytes:
    """File content, gunzipped when needed (by magic number, not by suffix)."""
    p = Path(path)
    if not p.exists():
        raise TraceError(f"no such trace file: {p}")
    if p.is_dir():
        raise TraceError(f"{p} is a directory, not a trace file")
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise TraceError(f"cannot read {p}: {exc.strerror}") from exc
    if data[:2] == b"\x1f\x8b":
        try:
            data = _gunzip(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceError(f"{p} is a damaged gzip file ({exc})") from exc
    return data


def _gunzip(data: bytes) -> bytes:
    try:  # ISA-L's inflate is ~3x faster than zlib's on large traces; optional
        from isal import igzip
    except ImportError:
        return gzip.decompress(data)
    return igzip.decompress(data)


def load_trace(path: str | Path, *, with_python: bool = True) -> TraceData:
    """Reads a torch.profiler Chrome trace. Raises TraceError (one clear line) on anything unusable."""
    data = read_bytes(path)
    with no_gc():
        return _load(str(path), data, with_python)


@contextmanager
def no_gc() -> Iterator[None]:
    """Analysis builds millions of short-lived, non-cyclic containers; the cyclic collector's passes
    over them are pure cost (they tripled decode time on a 1M-op trace)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _load(path: str, data: bytes, with_python: bool) -> TraceData:
    try:
        doc = _DECODER.decode(data)
    except msgspec.ValidationError as exc:
        raise TraceError(f"{path} is not a torch.profiler trace ({exc})") from exc
    except msgspec.DecodeError as exc:
        kind = "truncated or invalid JSON" if data.strip() else "empty"
        raise TraceError(f"{path} is not a readable trace: {kind} ({exc})") from exc
    if doc.traceEvents is None:
        raise TraceError(f"{path} is JSON but has no 'traceEvents': not a Chrome trace")
    trace = _columnize(path, doc, with_python=with_python)
    del doc, data
    if trace.ops.empty:
        raise TraceError(f"{path} has no operator (cpu_op) events: record it with torch.profiler's CPU activity")
    return trace


def _batches(raws: list[msgspec.Raw]):
    for i in range(0, len(raws), BATCH):
        yield _BATCH_DECODER.decode(b"[" + b",".join(raws[i:i + BATCH]) + b"]")


def _columnize(path: str, doc: _TraceFile, *, with_python: bool) -> TraceData:
    # Numbers go to typed arrays (8 bytes each instead of a Python object per value).
    ops: dict[str, Any] = {k: [] for k in (
        "name", "pid", "tid", "input_dims", "input_dtypes", "input_strides", "concrete_inputs", "call_stack")}
    ops.update(ts=array("d"), dur=array("d"), ext_id=array("q"), seq=array("q"), fwd_tid=array("q"))
    kern: dict[str, list] = {k: [] for k in ("cat", "name", "ts", "dur", "correlation", "ext_id", "stream", "device")}
    launch: dict[str, list] = {k: [] for k in ("name", "pid", "tid", "ts", "dur", "correlation", "ext_id")}
    steps: dict[str, list] = {k: [] for k in ("step", "pid", "tid", "ts", "dur")}
    py: dict[str, Any] = {"name": [], "pid": [], "tid": [], "ts": array("d"), "dur": array("d")}
    texts = _TextCache()
    names: dict[str, str] = {}
    inductor: dict[int, tuple[str, float, float]] = {}  # op index -> inductor launch args (rare)
    gpu_runtime = None
    raws = doc.traceEvents or []
    n_events = len(raws)
    # Bound methods, looked up once: this loop runs once per event of traces with millions of them.
    o_name, o_pid, o_tid, o_ts, o_dur = (ops[k].append for k in ("name", "pid", "tid", "ts", "dur"))
    o_ext, o_seq, o_fwd, o_stack = (ops[k].append for k in ("ext_id", "seq", "fwd_tid", "call_stack"))
    o_dims, o_types, o_strides, o_conc = (ops[k].append for k in (
        "input_dims", "input_dtypes", "input_strides", "concrete_inputs"))
    p_name, p_pid, p_tid, p_ts, p_dur = (py[k].append for k in ("name", "pid", "tid", "ts", "dur"))
    text = texts.text
    intern = names.setdefault
    no_args = _Args()
    for batch in _batches(raws):
        for e in batch:
            if e.ph != "X":
                continue
            cat = e.cat
            a = e.args
            if cat == "user_annotation":
                m = STEP_RE.match(e.name)
                if m:
                    steps["step"].append(int(m.group(1)))
                    steps["pid"].append(e.pid)
                    steps["tid"].append(e.tid)
                    steps["ts"].append(e.ts)
                    steps["dur"].append(e.dur)
                    continue
                if not COMPILED_GRAPH_RE.match(e.name):
                    continue
                cat = "cpu_op"  # a compiled graph's range: an op event
            if cat == "cpu_op":
                if a is None:
                    a = no_args
                o_name(intern(e.name, e.name))
                o_pid(e.pid)
                o_tid(e.tid)
                o_ts(e.ts)
                o_dur(e.dur)
                o_ext(a.external_id if a.external_id is not None else -1)
                o_seq(a.seq if a.seq is not None else -1)
                o_fwd(a.fwd_tid if a.fwd_tid is not None else -1)
                o_dims(text(a.input_dims))
                o_types(text(a.input_type))
                o_strides(text(a.input_strides))
                o_conc(text(a.concrete))
                o_stack(intern(a.call_stack, a.call_stack) if a.call_stack else "")
                if a.kernel_backend is not None:
                    inductor[len(ops["name"]) - 1] = (
                        a.kernel_backend, _nan_if_none(a.kernel_flop), _nan_if_none(a.kernel_num_gb))
            elif cat == "python_function":
                # Only frames that can be an op's source location are kept (user code, or opscope's
                # harness): the innermost kept frame around an op is then its location, without walking
                # torch's and the stdlib's frames (most of a trace's Python events).
                if with_python:
                    where = frame_location_of(e.name)
                    if where is None:
                        continue
                    p_name(where)
                    p_pid(e.pid)
                    p_tid(e.tid)
                    p_ts(e.ts)
                    p_dur(e.dur)
            elif cat in DEVICE_ACTIVITY_CATS:
                a = a or no_args
                kern["cat"].append(cat)
                kern["name"].append(intern(e.name, e.name))
                kern["ts"].append(e.ts)
                kern["dur"].append(e.dur)
                kern["correlation"].append(a.correlation if a.correlation is not None else -1)
                kern["ext_id"].append(a.external_id if a.external_id is not None else -1)
                kern["stream"].append(a.stream if a.stream is not None else -1)
                kern["device"].append(a.device if a.device is not None else 0)
            elif cat in LAUNCH_CATS:
                if a is None or a.correlation is None:
                    continue
                if gpu_runtime is None:
                    gpu_runtime = "rocm" if e.name.startswith("hip") else "cuda"
                launch["name"].append(intern(e.name, e.name))
                launch["pid"].append(e.pid)
                launch["tid"].append(e.tid)
                launch["ts"].append(e.ts)
                launch["dur"].append(e.dur)
                launch["correlation"].append(a.correlation)
                launch["ext_id"].append(a.external_id if a.external_id is not None else -1)
        del batch
    if doc.hip_runtime_version is not None or doc.roctracer_version is not None:
        gpu_runtime = "rocm"
    elif gpu_runtime is None and kern["name"]:
        gpu_runtime = "cuda"

    ops_df = _frame(ops, floats=("ts", "dur"), ints=("ext_id", "seq", "fwd_tid"))
    _add_inductor_columns(ops_df, inductor)
    # ProfilerStep#N is recorded as a cpu_op by some torch versions: it is a step annotation, not an op.
    if not ops_df.empty:
        is_step = ops_df["name"].str.startswith("ProfilerStep#")
        if is_step.any():
            for _, r in ops_df[is_step].iterrows():
                m = STEP_RE.match(r["name"])
                if m:
                    for k, v in (("step", int(m.group(1))), ("pid", r["pid"]), ("tid", r["tid"]), ("ts", r["ts"]), ("dur", r["dur"])):
                        steps[k].append(v)
            ops_df = ops_df[~is_step].reset_index(drop=True)
    steps_df = _frame(steps, floats=("ts", "dur"), ints=("step",))
    if not steps_df.empty:
        steps_df = steps_df.sort_values("ts").drop_duplicates(["step", "ts"]).reset_index(drop=True)
    return TraceData(
        path=path,
        ops=ops_df,
        kernels=_frame(kern, floats=("ts", "dur"), ints=("correlation", "ext_id", "stream", "device")),
        launches=_frame(launch, floats=("ts", "dur"), ints=("correlation", "ext_id")),
        steps=steps_df,
        python=_frame(py, floats=("ts", "dur")),
        device_properties=doc.deviceProperties or [],
        torch_version=doc.torch_version or doc.pytorch_version,
        gpu_runtime=gpu_runtime,
        distributed=doc.distributedInfo,
        n_events=n_events,
    )


def _nan_if_none(x: float | None) -> float:
    return float("nan") if x is None else float(x)


def _add_inductor_columns(ops: pd.DataFrame, inductor: dict[int, tuple[str, float, float]]) -> None:
    n = len(ops)
    backend = [""] * n
    flop = np.full(n, np.nan)
    num_gb = np.full(n, np.nan)
    for i, (b, f, g) in inductor.items():
        backend[i], flop[i], num_gb[i] = b, f, g
    ops["kernel_backend"] = pd.Series(backend, dtype=object)
    ops["kernel_flop"] = flop
    ops["kernel_num_gb"] = num_gb


def _frame(cols: dict[str, list], floats: tuple = (), ints: tuple = ()) -> pd.DataFrame:
    out = {}
    for k, v in cols.items():
        if isinstance(v, array):
            out[k] = np.frombuffer(v, dtype=np.float64 if v.typecode == "d" else np.int64)
        elif k in floats:
            out[k] = np.asarray(v, dtype=np.float64)
        elif k in ints:
            out[k] = np.asarray(v, dtype=np.int64)
        elif k in ("pid", "tid"):
            # pids/tids are ints in torch traces but strings in some synthetic rows; keep one type
            out[k] = np.asarray([x if isinstance(x, int) else hash(x) for x in v], dtype=np.int64)
        else:
            out[k] = pd.Series(v, dtype=object)
    return pd.DataFrame(out)
