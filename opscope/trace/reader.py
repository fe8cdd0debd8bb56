"""Reads torch.profiler Chrome traces (.json / .json.gz) into column tables.

Keyed on which fields are present, not on torch versions: traces from torch 2.x CPU runs, CUDA (CUPTI)
and ROCm (roctracer) runs all decode with the same code. No torch import: `opscope analyze` must start
fast. Decoding uses msgspec with typed structs, so only the fields opscope needs become Python objects
("Input Dims" & co. stay raw JSON text, exactly as the trace wrote them).
"""

from __future__ import annotations

import gc
import io
import json
import math
import os
import re
import stat
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import msgspec

from opscope.errors import TraceError
from opscope.limits import MAX_TEXT_CHARS, bounded
from opscope.sources import trace_frame_location as frame_location_of
from opscope.table import Table, empty, nrows, take

DEVICE_ACTIVITY_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
STEP_RE = re.compile(r"^ProfilerStep#(\d{1,18})$")
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
    # ROCm's launch records name the kernel they launch (roctracer); checked by hand, not typed, so an
    # odd value costs only the name
    kernel: Any = None
    kernel_flop: float | None = None
    kernel_num_gb: float | None = None
    # `[memory]` instant events (profile_memory)
    mem_bytes: float | None = msgspec.field(default=None, name="Bytes")
    mem_addr: int | None = msgspec.field(default=None, name="Addr")
    mem_total: float | None = msgspec.field(default=None, name="Total Allocated")
    mem_device_type: int | None = msgspec.field(default=None, name="Device Type")
    mem_device_id: int | None = msgspec.field(default=None, name="Device Id")


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
    # The metadata fields are Any and checked by hand: a wrong-typed field opscope can do without must
    # not make the whole trace unreadable.
    traceEvents: list[msgspec.Raw] | None = None  # noqa: N815 (the trace's own key)
    deviceProperties: Any = None  # noqa: N815
    distributedInfo: Any = None  # noqa: N815
    torch_version: Any = None
    pytorch_version: Any = None
    hip_runtime_version: Any = None
    roctracer_version: Any = None
    opscope: Any = None  # what `opscope profile` embedded (analysis.annotations); checked where it is read


_DECODER = msgspec.json.Decoder(_TraceFile)
_ARRAY_DECODER = msgspec.json.Decoder(list[msgspec.Raw])  # the Chrome "JSON Array Format": just the events
_BATCH_DECODER = msgspec.json.Decoder(list[_Event])
_EVENT_DECODER = msgspec.json.Decoder(_Event)
BATCH = 20_000

DEFAULT_MAX_TRACE_GB = 4.0  # decompressed size a trace may reach before it is refused (--max-trace-gb)
_READ_CHUNK = 4 << 20  # bytes per read; also the most a gzip bomb can overshoot the limit by
_SNIFF = 4096
# torch's traces compress 10-30x with gzip (JSON with repeated keys); a file that expands far more is a
# decompression bomb, refused once its output passes _RATIO_CHECK_AFTER.
MAX_GZIP_RATIO = 500
_RATIO_CHECK_AFTER = 256 << 20
_INT64 = (-(1 << 63), (1 << 63) - 1)
# Event times beyond these are not a profiler's: a duration of more than 30 days, or a timestamp that
# is not a finite number.
MAX_DURATION_US = 30 * 86_400 * 1e6
_INTERVAL_COLUMNS = ("name", "pid", "tid", "ts", "dur")  # annotations, modules, python frames
_MEMORY_COLUMNS = ("pid", "tid", "ts", "bytes", "addr", "total_allocated", "device_type", "device_id")
# A tensor of more elements than this (2**50, a petabyte of bytes) is not a real recorded shape.
MAX_NUMEL = 1 << 50


class NothingRecorded(TraceError):
    """A trace with no operator and no kernel: readable, but nothing ran while it was recorded."""


@dataclass
class TraceData:
    """One trace as column tables (opscope.table: column -> list; pid/tid are ints, times floats).
    Times are microseconds, as the trace writes them."""

    path: str
    ops: Table
    kernels: Table
    launches: Table
    steps: Table
    python: Table  # user (and harness) frames only; "name" holds their 'file:line' location
    # record_function ranges (user_annotation) other than ProfilerStep#N and compiled graphs: name, pid,
    # tid, ts, dur. Not ops; they name the code that launched kernels no op encloses (a CUDA graph
    # replay inside an inference server's `step[DECODE bs=32]`).
    annotations: Table = field(default_factory=lambda: empty(_INTERVAL_COLUMNS))
    # ops: besides cpu_op events, torch.compile's `## Call CompiledFxGraph <key> ##` ranges; columns
    # kernel_backend / kernel_flop / kernel_num_gb carry inductor's launch args ("" / NaN elsewhere)
    device_properties: list[dict[str, Any]] = field(default_factory=list)
    torch_version: str | None = None
    gpu_runtime: str | None = None  # "cuda" | "rocm" | None
    distributed: dict[str, Any] | None = None
    n_events: int = 0
    # with_modules traces: one row per `nn.Module: <Class>_<N>` python_function event (name without the
    # prefix, pid, tid, ts, dur)
    modules: Table = field(default_factory=lambda: empty(_INTERVAL_COLUMNS))
    # profile_memory traces: one row per `[memory]` instant event (pid, tid, ts, bytes (negative: a
    # free), addr, total_allocated, device_type, device_id)
    memory: Table = field(default_factory=lambda: empty(_MEMORY_COLUMNS))
    # filled by analysis.events from `modules`: module path -> class, for every module the trace names
    module_classes: dict[str, str] = field(default_factory=dict)
    opscope_block: Any = None  # the trace's "opscope" key, as decoded JSON (analysis.annotations reads it)
    # One line each about what the reader skipped or excluded (malformed events, absurd durations or
    # shapes); the CLI prints them as warnings.
    warnings: list[str] = field(default_factory=list)

    @property
    def has_gpu(self) -> bool:
        return nrows(self.kernels) > 0

    @property
    def gpu_only(self) -> bool:
        """A trace of GPU activity only (no cpu_op events): its report is kernel-level."""
        return nrows(self.ops) == 0 and self.has_gpu


MODULE_PREFIX = "nn.Module: "
MEMORY_EVENT = "[memory]"
_OP_COLUMNS = ("name", "pid", "tid", "input_dims", "input_dtypes", "input_strides", "concrete_inputs", "call_stack",
               "ts", "dur", "ext_id", "seq", "fwd_tid")  # then kernel_backend, kernel_flop, kernel_num_gb


class _Rejects:
    """Counts what the reader leaves out, with one example each, for the warnings."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.examples: dict[str, str] = {}

    def add(self, kind: str, example: str = "") -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        if example and kind not in self.examples:
            self.examples[kind] = example

    def lines(self) -> list[str]:
        out = []
        for kind, n in self.counts.items():
            example = self.examples.get(kind)
            out.append(f"{n:,} {kind}" + (f" (first: {example})" if example else ""))
        return out


class _TextCache(dict[bytes, str]):
    """Raw JSON bytes -> one shared str. Shapes repeat across steps and layers, so a million ops hold a
    few thousand distinct strings. Each distinct text is checked once: anything that is not the JSON
    list the profiler writes becomes "" (unknown), counted in `rejects`."""

    def __init__(self, rejects: _Rejects, what: str, check_sizes: bool = False) -> None:
        super().__init__()
        self.rejects = rejects
        self.what = what
        self.check_sizes = check_sizes

    def text(self, raw: msgspec.Raw) -> str:
        key = bytes(raw)
        hit = self.get(key)
        if hit is None:
            hit = self[key] = self._checked(key)
        if hit is _BAD:
            self.rejects.add(f"events with an unusable \"{self.what}\" (ignored)", _excerpt(key))
            return ""
        return hit

    def _checked(self, key: bytes) -> str:
        if not key or key == b"null":
            return ""
        if len(key) > MAX_TEXT_CHARS:  # kept as text in ops.csv: cutting it would leave no JSON
            return _BAD
        try:
            value = json.loads(key)
        except (ValueError, RecursionError):
            return _BAD
        if not isinstance(value, list) or (self.check_sizes and not _plausible_dims(value)):
            return _BAD
        return _normalise(key.decode("utf-8", errors="replace"), value)


_BAD = "\0bad"  # sentinel: a text that failed its check


def _plausible_dims(dims: list[Any]) -> bool:
    """"Input Dims": one entry per input, a shape (list of ints >= 0), [] or a list of shapes."""
    for entry in dims:
        if not isinstance(entry, list):
            return False
        shapes = entry if entry and isinstance(entry[0], list) else [entry]
        for shape in shapes:
            if not isinstance(shape, list):
                return False
            numel = 1
            for d in shape:
                if not isinstance(d, int) or isinstance(d, bool) or d < 0:
                    return False
                numel *= d
            if numel > MAX_NUMEL:
                return False
    return True


def _excerpt(raw: bytes | str, limit: int = 60) -> str:
    text = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else str(raw)
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _normalise(text: str, value: Any) -> str:
    if "\n" in text or ("," in text and ", " not in text):
        # another writer's layout: re-dump in the one-line form torch writes ("[[8, 16], [16]]")
        text = json.dumps(value)
    return text


def max_trace_bytes(max_gb: float | None) -> int:
    """--max-trace-gb as bytes (None: the default)."""
    gb = DEFAULT_MAX_TRACE_GB if max_gb is None else max_gb
    if not (isinstance(gb, (int, float)) and math.isfinite(gb) and gb > 0):
        raise TraceError(f"--max-trace-gb must be a positive number of GB, got {max_gb!r}")
    return int(gb * 1e9)


def read_bytes(path: str | Path, max_bytes: int | None = None) -> bytes | bytearray:
    """The trace's JSON text, gunzipped when needed (by magic number, not by suffix). Reads the file
    once, in chunks (so pipes and /dev/stdin work), rejects what is not JSON from its first bytes, and
    refuses a trace whose (decompressed) size passes `max_bytes` before spending that memory."""
    p = Path(path)
    limit = max_bytes if max_bytes is not None else max_trace_bytes(None)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise TraceError(f"no such trace file: {p}") from None
    except OSError as exc:
        raise TraceError(f"cannot read {p}: {exc.strerror or exc}") from exc
    if stat.S_ISDIR(st.st_mode):
        raise TraceError(f"{p} is a directory, not a trace file")
    try:
        with open(p, "rb") as f:
            head = _read_at_least(f, 2)
            if head[:2] == b"\x1f\x8b":
                return _read_gzip(p, head, f, limit)
            regular = stat.S_ISREG(st.st_mode)
            if regular and st.st_size > limit:
                raise TraceError(_too_big(p, limit, st.st_size))
            return _read_plain(p, head, f, limit)
    except OSError as exc:
        raise TraceError(f"cannot read {p}: {exc.strerror or exc}") from exc


def _read_at_least(f: Any, n: int) -> bytes:
    """Up to n bytes (fewer only at end of file): a pipe may return less per read."""
    out = b""
    while len(out) < n:
        chunk = f.read(n - len(out))
        if not chunk:
            break
        out += chunk
    return out


def _too_big(p: Path, limit: int, size: int | None = None) -> str:
    what = f"is {size / 1e9:,.1f} GB" if size is not None else "decompresses to more than"
    return (f"{p} {what} the {limit / 1e9:g} GB limit for traces; pass --max-trace-gb to raise it"
            if size is None else f"{p} {what}, over the {limit / 1e9:g} GB limit for traces; "
            "pass --max-trace-gb to raise it")


def _sniff(p: Path, first: bytes) -> None:
    """A Chrome trace is a JSON object (or array): reject anything else from its first bytes."""
    text = first.lstrip(b" \t\r\n")
    if text.startswith(b"\xef\xbb\xbf"):
        text = text[3:].lstrip(b" \t\r\n")
    if not text:
        return  # empty or all whitespace so far: the decoder gives the right message
    if text[:1] not in (b"{", b"["):
        raise TraceError(f"{p} is not a readable trace: not JSON (it starts with {_excerpt(text[:16], 24)!r})")


def _read_plain(p: Path, head: bytes, f: Any, limit: int) -> bytearray:
    buf = bytearray(head)
    buf += _read_at_least(f, _SNIFF)
    _sniff(p, bytes(buf[:_SNIFF]))
    while True:
        chunk = f.read(_READ_CHUNK)
        if not chunk:
            return buf
        buf += chunk
        if len(buf) > limit:
            raise TraceError(_too_big(p, limit))


def _gzip_stream(fileobj: io.BufferedReader) -> tuple[io.BufferedIOBase, tuple[type[Exception], ...]]:
    """A gunzipping reader of `fileobj`, and the exceptions that mean a damaged file. ISA-L's inflate is
    ~3x faster than zlib's on large traces; optional."""
    import gzip
    damaged: tuple[type[Exception], ...] = (EOFError, gzip.BadGzipFile, zlib.error)
    try:
        from isal import igzip, isal_zlib
    except ImportError:
        return gzip.GzipFile(fileobj=fileobj, mode="rb"), damaged
    # isal_zlib.pyi declares `error: Exception` (an instance); at run time it is the class of inflate errors
    inflate_error = cast("type[Exception]", isal_zlib.error)
    opener: type[gzip.GzipFile] = igzip.IGzipFile  # a GzipFile, whose __init__ (unlike IGzipFile's) is typed
    return opener(fileobj=fileobj, mode="rb"), (*damaged, inflate_error)


def _read_gzip(p: Path, head: bytes, f: Any, limit: int) -> bytearray:
    raw = _Prepend(head, f)
    stream, damaged = _gzip_stream(io.BufferedReader(raw, _READ_CHUNK))
    buf = bytearray()
    try:
        while True:
            chunk = stream.read(_READ_CHUNK)  # at most this much output per read: bounded even for a bomb
            if not chunk:
                return buf
            if not buf:
                _sniff(p, chunk[:_SNIFF])
            buf += chunk
            if len(buf) > limit:
                raise TraceError(_too_big(p, limit))
            if len(buf) > _RATIO_CHECK_AFTER and len(buf) > MAX_GZIP_RATIO * raw.consumed:
                raise TraceError(f"{p} expands more than {MAX_GZIP_RATIO}x when decompressed: not a profiler "
                                 "trace (torch's compress about 10-30x); refused before it fills memory")
    except damaged as exc:
        raise TraceError(f"{p} is a damaged gzip file ({exc or type(exc).__name__})") from exc


class _Prepend(io.RawIOBase):
    """A read-only stream that first returns `head` (bytes already read while sniffing), then the rest
    of `f`: works for pipes, which cannot seek back."""

    def __init__(self, head: bytes, f: Any) -> None:
        super().__init__()
        self.head, self.f = head, f
        self.consumed = 0  # bytes handed out so far

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        if self.head:
            n = min(len(view), len(self.head))
            view[:n] = self.head[:n]
            self.head = self.head[n:]
            self.consumed += n
            return n
        data = self.f.read(len(view))
        view[: len(data)] = data
        self.consumed += len(data)
        return len(data)


def load_trace(path: str | Path, *, with_python: bool = True, data: bytes | bytearray | None = None,
               max_bytes: int | None = None) -> TraceData:
    """Reads a torch.profiler Chrome trace (or decodes `data`, its bytes already read). Raises
    TraceError (one clear line) on anything unusable; skips and counts malformed events."""
    if data is None:
        data = read_bytes(path, max_bytes)
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


def _load(path: str, data: bytes | bytearray, with_python: bool) -> TraceData:
    start = bytes(data[:_SNIFF]).lstrip(b" \t\r\n\xef\xbb\xbf")
    try:
        if start[:1] == b"[":
            doc = _TraceFile(traceEvents=_ARRAY_DECODER.decode(data))
        else:
            doc = _DECODER.decode(data)
    except msgspec.ValidationError as exc:
        raise TraceError(f"{path} is not a torch.profiler trace ({exc})") from exc
    except (msgspec.DecodeError, RecursionError) as exc:
        kind = "truncated or invalid JSON" if data.strip() else "empty"
        raise TraceError(f"{path} is not a readable trace: {kind} ({exc})") from exc
    if doc.traceEvents is None:
        raise TraceError(f"{path} is JSON but has no 'traceEvents': not a Chrome trace")
    rejects = _Rejects()
    trace = _columnize(path, doc, with_python=with_python, rejects=rejects)
    del doc, data
    trace.warnings = [f"{path}: skipped {line}" for line in rejects.lines()]
    if nrows(trace.ops) == 0 and not trace.has_gpu:
        raise NothingRecorded(f"{path} has no operator (cpu_op) events and no GPU kernels: nothing to analyze "
                         "(record it with torch.profiler's CPU and/or CUDA activity)")
    return trace


def _batches(raws: list[msgspec.Raw], rejects: _Rejects) -> Iterator[list[_Event]]:
    """Decoded events, BATCH at a time; a batch holding a malformed event is decoded event by event,
    the malformed ones skipped and counted."""
    for i in range(0, len(raws), BATCH):
        chunk = raws[i:i + BATCH]
        try:
            yield _BATCH_DECODER.decode(b"[" + b",".join(chunk) + b"]")
        except (msgspec.ValidationError, msgspec.DecodeError):
            good = []
            for raw in chunk:
                try:
                    good.append(_EVENT_DECODER.decode(raw))
                except (msgspec.ValidationError, msgspec.DecodeError) as exc:
                    rejects.add("malformed events", str(exc))
            yield good


_BIG_ID = "events with an id out of the 64-bit range (id ignored)"
_LONG_NAME = f"events with a name over {MAX_TEXT_CHARS:,} characters (name cut to that length)"


def _int64(value: int | None, rejects: _Rejects, default: int = -1) -> int:
    if value is None:
        return default
    if not _INT64[0] <= value <= _INT64[1]:
        rejects.add(_BIG_ID, str(value))
        return default
    return value


def _text_field(value: Any) -> str | None:
    return bounded(value) if isinstance(value, str) and value else None


def _device_properties(value: Any, rejects: _Rejects) -> list[dict[str, Any]]:
    """deviceProperties entries that are objects; a name that is not a string is dropped."""
    if value is None:
        return []
    items = value if isinstance(value, list) else []
    out = []
    for item in items:
        if isinstance(item, dict):
            if "name" in item and not isinstance(item["name"], str):
                item = {k: v for k, v in item.items() if k != "name"}
            elif isinstance(item.get("name"), str):
                item["name"] = bounded(item["name"])
            out.append(item)
    if len(out) != (len(value) if isinstance(value, list) else 1):
        rejects.add("malformed deviceProperties entries")
    return out


def _columnize(path: str, doc: _TraceFile, *, with_python: bool, rejects: _Rejects) -> TraceData:
    ops = empty(_OP_COLUMNS)
    kern = empty(("cat", "name", "ts", "dur", "correlation", "ext_id", "stream", "device"))
    launch = empty(("name", "pid", "tid", "ts", "dur", "correlation", "ext_id", "kernel"))
    ann = empty(_INTERVAL_COLUMNS)
    steps = empty(("step", "pid", "tid", "ts", "dur"))
    py = empty(_INTERVAL_COLUMNS)
    mods = empty(_INTERVAL_COLUMNS)
    mem = empty(_MEMORY_COLUMNS)
    dims_text = _TextCache(rejects, "Input Dims", check_sizes=True).text
    types_text = _TextCache(rejects, "Input type").text
    strides_text = _TextCache(rejects, "Input Strides").text
    concrete_text = _TextCache(rejects, "Concrete Inputs").text
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
    intern = names.setdefault
    no_args = _Args()
    lo, hi = _INT64
    for batch in _batches(raws, rejects):
        for e in batch:
            if e.ph != "X":
                if e.ph == "i" and e.name == MEMORY_EVENT and e.args is not None:
                    _memory_event(e, e.args, mem, rejects)
                continue
            if not 0.0 <= e.dur <= MAX_DURATION_US:
                rejects.add("events with a negative or absurd duration (excluded)", f"{e.name[:40]!r} dur {e.dur:g} µs")
                continue
            if len(e.name) > MAX_TEXT_CHARS:  # every later use of the name is bounded from here on
                rejects.add(_LONG_NAME, e.name[:40] + "…")
                e.name = bounded(e.name)
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
                    for k, v in (("name", intern(e.name, e.name)), ("pid", e.pid), ("tid", e.tid), ("ts", e.ts),
                                 ("dur", e.dur)):
                        ann[k].append(v)
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
                x, y, z = a.external_id, a.seq, a.fwd_tid
                if (x is None or lo <= x <= hi) and (y is None or lo <= y <= hi) and (z is None or lo <= z <= hi):
                    o_ext(-1 if x is None else x)
                    o_seq(-1 if y is None else y)
                    o_fwd(-1 if z is None else z)
                else:
                    o_ext(_int64(x, rejects))
                    o_seq(_int64(y, rejects))
                    o_fwd(_int64(z, rejects))
                o_dims(dims_text(a.input_dims))
                o_types(types_text(a.input_type))
                o_strides(strides_text(a.input_strides))
                o_conc(concrete_text(a.concrete))
                stack = a.call_stack
                if stack and len(stack) > MAX_TEXT_CHARS:
                    stack = bounded(stack)
                o_stack(intern(stack, stack) if stack else "")
                if a.kernel_backend is not None:
                    inductor[len(ops["name"]) - 1] = (
                        a.kernel_backend, _nan_if_none(a.kernel_flop), _nan_if_none(a.kernel_num_gb))
            elif cat == "python_function":
                if e.name.startswith(MODULE_PREFIX):
                    mods["name"].append(intern(e.name, e.name)[len(MODULE_PREFIX):])
                    mods["pid"].append(e.pid)
                    mods["tid"].append(e.tid)
                    mods["ts"].append(e.ts)
                    mods["dur"].append(e.dur)
                    continue
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
                kern["correlation"].append(_int64(a.correlation, rejects))
                kern["ext_id"].append(_int64(a.external_id, rejects))
                kern["stream"].append(_int64(a.stream, rejects))
                kern["device"].append(_int64(a.device, rejects, 0))
            elif cat in LAUNCH_CATS:
                if a is None or _int64(a.correlation, rejects) < 0:
                    continue
                if gpu_runtime is None:
                    gpu_runtime = "rocm" if e.name.startswith("hip") else "cuda"
                launch["name"].append(intern(e.name, e.name))
                launch["pid"].append(e.pid)
                launch["tid"].append(e.tid)
                launch["ts"].append(e.ts)
                launch["dur"].append(e.dur)
                launch["correlation"].append(a.correlation)
                launch["ext_id"].append(_int64(a.external_id, rejects))
                launch["kernel"].append(intern(k, k) if isinstance(k := a.kernel, str) and len(k) <= MAX_TEXT_CHARS
                                        else bounded(k) if isinstance(k, str) else "")
        del batch
    if doc.hip_runtime_version is not None or doc.roctracer_version is not None:
        gpu_runtime = "rocm"
    elif gpu_runtime is None and kern["name"]:
        gpu_runtime = "cuda"

    _add_inductor_columns(ops, inductor)
    # ProfilerStep#N is recorded as a cpu_op by some torch versions: it is a step annotation, not an op.
    is_step = [i for i, name in enumerate(ops["name"]) if name.startswith("ProfilerStep#")]
    if is_step:
        for i in is_step:
            m = STEP_RE.match(ops["name"][i])
            if m:
                for k, v in (("step", int(m.group(1))), ("pid", ops["pid"][i]), ("tid", ops["tid"][i]),
                             ("ts", ops["ts"][i]), ("dur", ops["dur"][i])):
                    steps[k].append(v)
        dropped = set(is_step)
        ops = take(ops, [i for i in range(nrows(ops)) if i not in dropped])
    for table in (ops, launch, ann, steps, py, mods, mem):
        table["pid"] = _ids(table["pid"])
        table["tid"] = _ids(table["tid"])
    return TraceData(
        path=path,
        ops=ops,
        kernels=kern,
        launches=launch,
        steps=_distinct_steps(steps),
        python=py,
        annotations=ann,
        device_properties=_device_properties(doc.deviceProperties, rejects),
        torch_version=_text_field(doc.torch_version) or _text_field(doc.pytorch_version),
        gpu_runtime=gpu_runtime,
        distributed=doc.distributedInfo if isinstance(doc.distributedInfo, dict) else None,
        n_events=n_events,
        modules=mods,
        opscope_block=doc.opscope,
        memory=mem,
    )


def _memory_event(e: _Event, a: _Args, mem: Table, rejects: _Rejects) -> None:
    """One `[memory]` instant event (its args `a`): an allocation (Bytes > 0) or a free (Bytes < 0) at Addr."""
    if a.mem_bytes is None or not math.isfinite(a.mem_bytes) or not math.isfinite(e.ts):
        rejects.add("malformed [memory] events", f"Bytes {a.mem_bytes!r}")
        return
    total = a.mem_total if a.mem_total is not None and math.isfinite(a.mem_total) else math.nan
    for k, v in (("pid", e.pid), ("tid", e.tid), ("ts", e.ts), ("bytes", a.mem_bytes),
                 ("addr", _int64(a.mem_addr, rejects)), ("total_allocated", total),
                 ("device_type", _int64(a.mem_device_type, rejects, 0)),
                 ("device_id", _int64(a.mem_device_id, rejects))):
        mem[k].append(v)


def _nan_if_none(x: float | None) -> float:
    return float("nan") if x is None else float(x)


def _add_inductor_columns(ops: Table, inductor: dict[int, tuple[str, float, float]]) -> None:
    n = nrows(ops)
    backend = [""] * n
    flop = [math.nan] * n
    num_gb = [math.nan] * n
    for i, (b, f, g) in inductor.items():
        backend[i], flop[i], num_gb[i] = b, f, g
    ops["kernel_backend"] = backend
    ops["kernel_flop"] = flop
    ops["kernel_num_gb"] = num_gb


def _ids(values: list[Any]) -> list[int]:
    """pids/tids are ints in torch traces but strings in some synthetic rows: one type, int (a string, or
    an int out of the 64-bit range, becomes its hash)."""
    lo, hi = _INT64
    try:
        if not values or (lo <= min(values) and max(values) <= hi):
            return values  # all ints in range (min() of strings makes the comparison raise TypeError)
    except TypeError:
        pass
    return [x if type(x) is int and lo <= x <= hi else hash(x) for x in values]


def _distinct_steps(steps: Table) -> Table:
    """Steps in time order, a step recorded twice (as an annotation and as a cpu_op) once."""
    order = sorted(range(nrows(steps)), key=steps["ts"].__getitem__)
    seen: set[tuple[int, float]] = set()
    keep = []
    for i in order:
        key = (steps["step"][i], steps["ts"][i])
        if key not in seen:
            seen.add(key)
            keep.append(i)
    return take(steps, keep)
