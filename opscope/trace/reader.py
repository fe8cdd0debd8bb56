"""Reads torch.profiler Chrome traces (.json / .json.gz) into column tables.

Keyed on which fields are present, not on torch versions: traces from torch 2.x CPU runs, CUDA (CUPTI)
and ROCm (roctracer) runs all decode with the same code. No torch import: `opscope analyze` must start
fast. Decoding uses msgspec with typed structs, so only the fields opscope needs become Python objects
("Input Dims" & co. stay raw JSON text, exactly as the trace wrote them).
"""

from __future__ import annotations

import gc
import json
import math
import operator
import os
import random
import re
import stat
import zlib
from array import array
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import IO, Any, cast

import msgspec

from opscope.errors import OutputError, TraceError
from opscope.limits import MAX_TEXT_CHARS, bounded
from opscope.sources import trace_frame_location as frame_location_of
from opscope.table import Table, built, compact, compacted, empty, finished, flush, nrows, take
from opscope.trace.json_stream import NotStreamable, split_array
from opscope.trace.location import Url, open_url, url_info

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
    kernel_file: Any = None  # the generated kernel's file on the recording machine (--inductor-cache)
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
MAX_TRACE_GB = 10_000.0  # the most --max-trace-gb may say (10 TB: no machine decodes more)
_READ_CHUNK = 4 << 20  # bytes per read (decompressed bytes per inflate step); the most a bomb can overshoot by
# Compressed bytes handed to the inflater per step. The ratio check counts what the inflater has taken
# in, so this is the most it can over-count consumption by (a read-ahead of 4 MB let a 1000x stream
# reach 2 GB before the check saw it).
_INFLATE_INPUT = 64 << 10
_SNIFF = 4096
# torch's traces compress 10-30x with gzip (JSON with repeated keys); a file that expands far more is a
# decompression bomb, refused once its output passes _BOMB_CHECK_AFTER.
MAX_GZIP_RATIO = 500
# Whitespace is 9-22% of torch's traces (45-78% of one re-dumped by json with indent 2 to 8); a stream
# that is mostly whitespace is padding, refused once its output (compressed or not) passes
# _BOMB_CHECK_AFTER, whatever its compression ratio.
MAX_WHITESPACE_SHARE = 0.9
_BOMB_CHECK_AFTER = 32 << 20
_WHITESPACE_SAMPLE = 8 << 10  # bytes of each chunk read whose whitespace is counted (at a random offset)
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
               "ts", "dur", "ext_id", "seq", "fwd_tid")  # then kernel_backend, kernel_flop, kernel_num_gb, kernel_file


_MALFORMED = "malformed events"


class _Rejects:
    """Counts what the reader leaves out, with one example each, for the warnings."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.examples: dict[str, str] = {}

    def add(self, kind: str, example: str = "", n: int = 1) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + n
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
    if not (isinstance(gb, (int, float)) and math.isfinite(gb) and 0 < gb <= MAX_TRACE_GB):
        shown = f"{max_gb:g}" if isinstance(max_gb, (int, float)) else repr(max_gb)
        raise TraceError(f"--max-trace-gb must be a number of GB above 0 and at most {MAX_TRACE_GB:,.0f}, got {shown}")
    return int(gb * 1e9)


class TraceBytes(bytearray):
    """A trace's JSON text as read_bytes returns it, with one line each about what reading left out
    (bytes after the end of the gzip data); load_trace adds them to the trace's warnings."""

    def __init__(self, data: bytes = b"") -> None:
        super().__init__(data)
        self.notes: list[str] = []


def read_bytes(path: str | Path | Url, max_bytes: int | None = None, copy: IO[bytes] | None = None) -> TraceBytes:
    """The trace's JSON text, gunzipped when needed (by magic number, not by suffix). Reads the file
    once, in chunks (so pipes, /dev/stdin and URLs work: a URL is streamed, opscope.trace.location),
    rejects what is not JSON from its first bytes, and refuses a trace whose (decompressed) size passes
    `max_bytes`, a decompression bomb or a stream of padding before spending that memory."""
    buf = TraceBytes()
    with trace_text(path, max_bytes, copy) as (chunks, notes, _again):
        for chunk in chunks:
            buf += chunk
    buf.notes = notes
    return buf


@contextmanager
def trace_text(path: str | Path | Url, max_bytes: int | None = None, copy: IO[bytes] | None = None
               ) -> Iterator[tuple[Iterator[bytes], list[str], bool]]:
    """The trace's text as it is read, chunk by chunk, with the checks of read_bytes (a TraceError when
    one fails); the notes on what reading left out (filled in as it goes); and whether the source can
    be read again (a regular file, a URL; not a pipe). `copy`: a URL's bytes as read (gzipped or not)
    are written there too, from its start each time the URL is read, so that the run keeps the trace
    without fetching it twice."""
    limit = max_bytes if max_bytes is not None else max_trace_bytes(None)
    notes: list[str] = []
    if isinstance(path, Url):
        kind, size = url_info(path)
        if kind == "directory":
            raise TraceError(f"{path.shown} is a directory, not a trace file")
        with open_url(path) as f:
            source: Any = f
            if copy is not None:
                copy.seek(0)
                copy.truncate()
                source = _Tee(f, copy)
            yield _chunks(path.shown, source, limit, size, notes), notes, True
        return
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise TraceError(f"no such trace file: {p}") from None
    except OSError as exc:
        raise TraceError(f"cannot read {p}: {exc.strerror or exc}") from exc
    if stat.S_ISDIR(st.st_mode):
        raise TraceError(f"{p} is a directory, not a trace file")
    regular = stat.S_ISREG(st.st_mode)
    try:
        with open(p, "rb") as f:
            yield _chunks(str(p), f, limit, st.st_size if regular else None, notes), notes, regular
    except OSError as exc:
        raise TraceError(f"cannot read {p}: {exc.strerror or exc}") from exc


class _Tee:
    """A stream whose bytes, as read, are also written to `copy`."""

    def __init__(self, f: Any, copy: IO[bytes]) -> None:
        self.f = f
        self.copy = copy

    def read(self, n: int = -1) -> bytes:
        data: bytes = self.f.read(n)
        try:
            self.copy.write(data)
        except OSError as exc:
            raise OutputError(f"cannot keep a copy of the trace: {exc.strerror or exc}") from exc
        return data


def _chunks(shown: str, f: Any, limit: int, size: int | None, notes: list[str]) -> Iterator[bytes]:
    """`f`'s trace text; `size`: its size in bytes when known (a regular file's, a URL's)."""
    head = _read_at_least(f, 2)
    if head[:2] == b"\x1f\x8b":
        yield from _gzip_chunks(shown, head, f, limit, notes)
        return
    if size is not None and size > limit:
        raise TraceError(_too_big(shown, limit, size))
    yield from _plain_chunks(shown, head, f, limit)


def _read_at_least(f: Any, n: int) -> bytes:
    """Up to n bytes (fewer only at end of file): a pipe may return less per read."""
    out = b""
    while len(out) < n:
        chunk = f.read(n - len(out))
        if not chunk:
            break
        out += chunk
    return out


def _too_big(p: str, limit: int, size: int | None = None) -> str:
    what = f"is {size / 1e9:,.1f} GB" if size is not None else "decompresses to more than"
    return (f"{p} {what} the {limit / 1e9:g} GB limit for traces; pass --max-trace-gb to raise it"
            if size is None else f"{p} {what}, over the {limit / 1e9:g} GB limit for traces; "
            "pass --max-trace-gb to raise it")


def _sniff(p: str, first: bytes) -> None:
    """A Chrome trace is a JSON object (or array): reject anything else from its first bytes."""
    text = first.lstrip(b" \t\r\n")
    if text.startswith(b"\xef\xbb\xbf"):
        text = text[3:].lstrip(b" \t\r\n")
    if not text:
        return  # empty or all whitespace so far: the decoder gives the right message
    if text[:1] not in (b"{", b"["):
        raise TraceError(f"{p} is not a readable trace: not JSON (it starts with {_excerpt(text[:16], 24)!r})")


class _PaddingCheck:
    """Counts the whitespace of a window of each chunk read, at a random offset (counting all of it
    would cost as much as inflating it), and refuses the stream once it is mostly whitespace."""

    def __init__(self, p: str) -> None:
        self.p = p
        self.sampled = 0
        self.whitespace = 0
        self.rng = random.Random()  # seeded from the OS: a stream cannot place its content in the windows

    def add(self, chunk: bytes | bytearray, total: int) -> None:
        n = len(chunk)
        at = self.rng.randrange(n - _WHITESPACE_SAMPLE) if n > _WHITESPACE_SAMPLE else 0
        window = chunk[at:at + _WHITESPACE_SAMPLE]
        self.sampled += len(window)
        self.whitespace += window.count(b" ") + window.count(b"\n") + window.count(b"\t") + window.count(b"\r")
        if total > _BOMB_CHECK_AFTER and self.whitespace > MAX_WHITESPACE_SHARE * self.sampled:
            raise TraceError(f"{self.p} is mostly whitespace (over {MAX_WHITESPACE_SHARE:.0%} of its first "
                             f"{total >> 20:,} MB): padding, not a profiler trace; refused before it fills memory")


def _plain_chunks(p: str, head: bytes, f: Any, limit: int) -> Iterator[bytes]:
    """An uncompressed trace's text, chunk by chunk, refused once it passes `limit` or is padding."""
    first = head + _read_at_least(f, _SNIFF)
    _sniff(p, first[:_SNIFF])
    padding = _PaddingCheck(p)
    total = len(first)
    padding.add(first, total)
    yield first
    while True:
        chunk = f.read(_READ_CHUNK)
        if not chunk:
            return
        total += len(chunk)
        if total > limit:
            raise TraceError(_too_big(p, limit))
        padding.add(chunk, total)
        yield chunk


def _inflater() -> tuple[Callable[[], Any], tuple[type[Exception], ...]]:
    """A maker of gzip-member inflaters, and the exceptions that mean damaged data. ISA-L's inflate is
    ~3x faster than zlib's on large traces; optional."""
    try:
        from isal import isal_zlib
    except ImportError:
        return (lambda: zlib.decompressobj(wbits=31)), (zlib.error,)
    # isal_zlib.pyi declares `error: Exception` (an instance); at run time it is the class of inflate errors
    inflate_error = cast("type[Exception]", isal_zlib.error)
    return (lambda: isal_zlib.decompressobj(wbits=31)), (zlib.error, inflate_error)


def _gzip_chunks(p: str, head: bytes, f: Any, limit: int, notes: list[str]) -> Iterator[bytes]:
    """Inflates member after member (as gzip does), checking after each step the output against
    `limit`, against the compressed bytes the inflater has actually taken in (MAX_GZIP_RATIO) and for
    padding. Bytes after the last member that start no new member are left out, with a note."""
    new_inflater, damaged = _inflater()
    inflater = new_inflater()
    total = 0
    padding = _PaddingCheck(p)
    pending = head  # compressed bytes read but not yet taken in by the inflater
    consumed = 0
    try:
        while True:
            out = inflater.decompress(pending, _READ_CHUNK)  # at most this much output: bounded even for a bomb
            left = inflater.unused_data if inflater.eof else inflater.unconsumed_tail
            consumed += len(pending) - len(left)
            pending = left
            if out:
                if not total:
                    _sniff(p, out[:_SNIFF])
                total += len(out)
                if total > limit:
                    raise TraceError(_too_big(p, limit))
                if total > _BOMB_CHECK_AFTER and total > MAX_GZIP_RATIO * consumed:
                    raise TraceError(f"{p} expands more than {MAX_GZIP_RATIO}x when decompressed: not a profiler "
                                     "trace (torch's compress about 10-30x); refused before it fills memory")
                padding.add(out, total)
                yield out
            if inflater.eof:
                if len(pending) < 2:
                    pending += _read_at_least(f, 2 - len(pending))
                if not pending:
                    return
                if pending[:2] != b"\x1f\x8b":
                    notes.append(f"{p}: ignored the bytes after the end of its gzip data (they start with "
                                 f"{_excerpt(pending[:16], 24)!r}, not another gzip member)")
                    return
                inflater = new_inflater()
            elif not out and not pending:
                pending = f.read(_INFLATE_INPUT)
                if not pending:
                    raise TraceError(f"{p} is a damaged gzip file: it ends before its compressed data does "
                                     "(the file was cut short)")
    except damaged as exc:
        raise TraceError(f"{p} is a damaged gzip file ({exc or type(exc).__name__})") from exc


def load_trace(path: str | Path | Url, *, with_python: bool = True, data: bytes | bytearray | None = None,
               max_bytes: int | None = None, owned: bool = False,
               on_events: Callable[[int], None] | None = None, copy: IO[bytes] | None = None) -> TraceData:
    """Reads a torch.profiler Chrome trace (or decodes `data`, its bytes already read; `owned`: nothing
    else reads them, so a repair may edit them in place rather than in a copy). Raises TraceError (one
    clear line) on anything unusable; skips and counts malformed events.

    A trace read from its file or URL is decoded as its text streams in, window by window
    (opscope.trace.json_stream), so its text is never held whole; `on_events(n)` hears the events
    decoded so far. Text that cannot be split as it streams (invalid JSON that needs repairs, a
    truncated file) is read again, whole; a pipe is read whole. `copy`: see trace_text."""
    shown = path.shown if isinstance(path, Url) else str(path)
    if data is None:
        with trace_text(path, max_bytes, copy) as (chunks, notes, again):
            if again:
                try:
                    with no_gc():
                        rejects = _Rejects()
                        events = _StreamedEvents(shown, chunks, rejects, on_events)
                        return _finish(shown, events, rejects, with_python, notes, [])
                except NotStreamable:
                    pass  # read again, whole, below
            else:
                data = TraceBytes()
                for chunk in chunks:
                    data += chunk
                data.notes = notes
        if data is None:
            data = read_bytes(path, max_bytes, copy)
        owned = True
    notes = data.notes if isinstance(data, TraceBytes) else []
    with no_gc():
        return _load(shown, data, with_python, notes, owned)


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


def _load(path: str, data: bytes | bytearray, with_python: bool, notes: list[str], owned: bool) -> TraceData:
    try:
        doc, repaired = _decode_document(path, data, owned)
    except msgspec.ValidationError as exc:
        raise TraceError(f"{path} is not a torch.profiler trace ({exc})") from exc
    if doc.traceEvents is None:
        raise TraceError(f"{path} is JSON but has no 'traceEvents': not a Chrome trace")
    del data
    rejects = _Rejects()
    return _finish(path, _WholeEvents(doc, rejects), rejects, with_python, notes, repaired)


def _finish(path: str, events: _Events, rejects: _Rejects, with_python: bool, notes: list[str],
            repaired: list[str]) -> TraceData:
    trace = _columnize(path, events, with_python=with_python, rejects=rejects)
    trace.warnings = [*notes, *repaired, *(f"{path}: skipped {line}" for line in rejects.lines())]
    if nrows(trace.ops) == 0 and not trace.has_gpu:
        malformed = rejects.counts.get(_MALFORMED, 0)
        if malformed:  # what is wrong is the skipped events, not a missing profiler activity
            raise TraceError(f"{path} has no operator (cpu_op) events or GPU kernels it can use: {malformed:,} of its "
                             f"{trace.n_events:,} events are malformed and were skipped (first: "
                             f"{rejects.examples.get(_MALFORMED, '?')})")
        raise NothingRecorded(f"{path} has no operator (cpu_op) events and no GPU kernels: nothing to analyze "
                         "(record it with torch.profiler's CPU and/or CUDA activity)")
    return trace


class _Events:
    """A trace's events, batch by batch, and its other top-level keys (known once the batches are
    read: in a streamed trace they may come after the events)."""

    n_events = 0

    def batches(self) -> Iterator[list[_Event]]:
        raise NotImplementedError

    def top(self) -> _TraceFile:
        raise NotImplementedError


class _WholeEvents(_Events):
    """The events of a document decoded whole (each event still raw)."""

    def __init__(self, doc: _TraceFile, rejects: _Rejects) -> None:
        self.doc = doc
        self.rejects = rejects
        self.n_events = len(doc.traceEvents or [])

    def batches(self) -> Iterator[list[_Event]]:
        return _batches(self.doc.traceEvents or [], self.rejects)

    def top(self) -> _TraceFile:
        return self.doc


def _decode_window(text: bytes) -> list[_Event] | list[msgspec.Raw]:
    """A window of whole events: typed, or raw when one of them is malformed (decoded one by one after);
    msgspec.DecodeError when the window is not whole elements (json_stream moves the cut)."""
    try:
        return _BATCH_DECODER.decode(text)
    except msgspec.ValidationError:
        return _ARRAY_DECODER.decode(text)


class _StreamedEvents(_Events):
    """The events of a trace whose text streams in (opscope.trace.json_stream)."""

    def __init__(self, path: str, chunks: Iterator[bytes], rejects: _Rejects,
                 on_events: Callable[[int], None] | None) -> None:
        self.path = path
        self.chunks = chunks
        self.rejects = rejects
        self.on_events = on_events
        self.top_text: bytes | None = None

    def batches(self) -> Iterator[list[_Event]]:
        windows = split_array(self.chunks, b"traceEvents", _decode_window, _DECODER.decode)
        while True:
            try:
                window = next(windows)
            except StopIteration as stop:
                self.top_text = stop.value
                return
            self.n_events += len(window)
            if window and isinstance(window[0], msgspec.Raw):
                yield from _batches(window, self.rejects)
            else:
                yield cast("list[_Event]", window)
            del window
            if self.on_events is not None:
                self.on_events(self.n_events)

    def top(self) -> _TraceFile:
        assert self.top_text is not None  # batches() was read to its end
        if self.top_text == b"[]":  # the JSON Array Format: the document is the events
            return _TraceFile(traceEvents=[])
        try:
            doc = _DECODER.decode(self.top_text)
        except msgspec.ValidationError as exc:
            raise TraceError(f"{self.path} is not a torch.profiler trace ({exc})") from exc
        except msgspec.DecodeError:
            raise NotStreamable("the keys around the events are not valid JSON") from None
        return doc


_BOM = b"\xef\xbb\xbf"


def _decode_top(data: bytes | bytearray, start: int, end: int) -> _TraceFile:
    """The document's top level (events stay raw), from byte `start` (after a BOM) to `end`."""
    view = memoryview(data)[start:end] if start or end < len(data) else data
    if bytes(view[:_SNIFF]).lstrip(b" \t\r\n")[:1] == b"[":
        return _TraceFile(traceEvents=_ARRAY_DECODER.decode(view))
    return _DECODER.decode(view)


def _decode_document(path: str, data: bytes | bytearray, owned: bool) -> tuple[_TraceFile, list[str]]:
    """The decoded top level, and one line each about what was repaired to decode it. A UTF-8 byte
    order mark is skipped; faults msgspec refuses the whole document for, though they spoil one value
    at most, are repaired (_Repairs); anything else is one TraceError naming what and where."""
    start = len(_BOM) if data[:3] == _BOM else 0
    try:
        try:
            return _decode_top(data, start, len(data)), []
        except msgspec.ValidationError:
            raise  # the JSON is fine; its shape is not a trace's
        except msgspec.DecodeError as exc:
            return _Repairs(path, data, start, owned).run(exc)
    except RecursionError as exc:
        raise TraceError(f"{path} is not a readable trace: JSON nested too deeply") from exc


_ERROR_AT = re.compile(r"\(byte (\d+)\)")
_NON_JSON_NUMBERS = (b"Infinity", b"NaN")  # what Python's json writes for inf and nan (JSON has neither)
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_MAX_REPAIR_ROUNDS = 32
_JSON_WHITESPACE = b" \t\r\n"


class _Repairs:
    """Repairs, in the trace's bytes (a copy unless `owned`), the faults for which msgspec refuses a
    whole document though each spoils one value: a NaN or (-)Infinity token (read as null, so a field
    that may be absent is; an event that needs the number is skipped as malformed), a lone UTF-16
    surrogate escape in a string (read as U+FFFD) and bytes after the end of the JSON (ignored).
    Every edit keeps the length, so msgspec's error positions stay valid.

    msgspec names the first fault's position, so each decode would find one more: after the first
    NaN, every other NaN/Infinity that stands where a value does and outside strings (by the parity
    of the quotes before it) is written as a string of the same length ("N" for NaN) and the document
    decoded again. Should such an edit be inside a string after all, it closes the string with a
    letter after it, so msgspec fails one byte past it and it is undone; once the document decodes,
    every edit stood outside strings and is made null. At most _MAX_REPAIR_ROUNDS decodes."""

    def __init__(self, path: str, data: bytes | bytearray, start: int, owned: bool) -> None:
        self.path = path
        self.data = data
        self.buf: bytearray | None = data if owned and isinstance(data, bytearray) else None
        self.start = start
        self.end = len(data)
        self.tokens: dict[int, bytes] = {}  # position -> the non-JSON number written there as a string
        self.unsure: set[int] = set()  # those of them that may be inside a string
        self.inside: set[int] = set()  # positions known to be inside a string
        self.surrogates = 0
        self.guessed = False

    def run(self, error: msgspec.DecodeError) -> tuple[_TraceFile, list[str]]:
        for _ in range(_MAX_REPAIR_ROUNDS):
            if not self._repair(error):
                raise TraceError(self._unreadable(error)) from error
            try:
                doc = _decode_top(self._data(), self.start, self.end)
            except msgspec.ValidationError:
                raise
            except msgspec.DecodeError as exc:
                error = exc
                continue
            if self.tokens:
                self.unsure.clear()  # the document decodes: no edit is inside a string
                self._write_nulls()
                try:
                    doc = _decode_top(self._data(), self.start, self.end)
                except msgspec.DecodeError as exc:
                    error = exc
                    continue
            return doc, self._notes()
        raise TraceError(f"{self.path} is not a readable trace: more than {_MAX_REPAIR_ROUNDS} faults "
                         f"that are not JSON (last: {self._where(error)})")

    def _data(self) -> bytes | bytearray:
        return self.buf if self.buf is not None else self.data

    def _writable(self) -> bytearray:
        if self.buf is None:
            self.buf = bytearray(self.data)  # the caller still reads `data` (it may be gzipping it)
        return self.buf

    def _position(self, error: msgspec.DecodeError) -> int | None:
        m = _ERROR_AT.search(str(error))
        return self.start + int(m.group(1)) if m else None

    def _repair(self, error: msgspec.DecodeError) -> bool:
        pos = self._position(error)
        if pos is None:
            return False
        text = str(error)
        data = self._data()
        if pos - 1 in self.unsure:  # an edit inside a string: undo it
            self._write(pos - 1, self.tokens.pop(pos - 1))
            self.unsure.discard(pos - 1)
            self.inside.add(pos - 1)
            return True
        token = self._token_at(data, pos)
        if token is not None:
            at = pos - 1 if token.startswith(b"-") else pos
            self._write(at, _as_string(token))
            self.tokens[at] = token
            if not self.guessed:
                self.guessed = True
                self._guess_tokens(at)
            return True
        if "escape" in text or "surrogate" in text:
            return self._replace_lone_surrogates() > 0
        if "trailing characters" in text and pos - 1 > self.start:
            self.end = pos - 1  # msgspec names the byte after the first one past the document
            return True
        return False

    @staticmethod
    def _token_at(data: bytes | bytearray, pos: int) -> bytes | None:
        for token in _NON_JSON_NUMBERS:
            if data[pos:pos + len(token)] == token:
                return b"-" + token if pos > 0 and data[pos - 1:pos] == b"-" else token
        return None

    def _guess_tokens(self, after: int) -> None:
        """Every other NaN/Infinity after `after` (where msgspec found the first, outside any string;
        none stands before it) that stands where a value does, written as a string: outside strings
        when an even number of unescaped quotes lies between it and `after` (so in a document that is
        JSON but for these tokens, exactly those); an edit that is inside one after all is undone by
        the next decode."""
        data = self._data()
        found = []
        for token in _NON_JSON_NUMBERS:
            i = data.find(token, after, self.end)
            while i >= 0:
                found.append((i, len(token)))
                i = data.find(token, i + len(token), self.end)
        found.sort()
        quotes, last = 0, after
        for i, n in found:
            at = i - 1 if data[i - 1:i] == b"-" else i
            quotes += _unescaped_quotes(data, last, at)  # an edit below adds two: the parity stays
            last = at
            if quotes % 2 or at in self.tokens or not _stands_as_value(data, at, i + n - at):
                continue
            whole = bytes(data[at:i + n])
            self._write(at, _as_string(whole))
            self.tokens[at] = whole
            self.unsure.add(at)
            data = self._data()

    def _write_nulls(self) -> None:
        """Each non-JSON number, known to stand outside strings, as null where it has the room (a
        bare NaN needs one byte of whitespace beside it; without it, it stays a string)."""
        data = self._writable()
        for at, token in self.tokens.items():
            if len(token) >= 4:
                data[at:at + len(token)] = b"null" + b" " * (len(token) - 4)
            elif data[at - 1:at] in (b" ", b"\t", b"\r", b"\n"):
                data[at - 1:at + 3] = b"null"
            elif data[at + 3:at + 4] in (b" ", b"\t", b"\r", b"\n"):
                data[at:at + 4] = b"null"

    def _replace_lone_surrogates(self) -> int:
        """\\uD800-\\uDFFF escapes that are not half of a pair, as \\uFFFD (same length)."""
        data = self._data()
        lone = []
        for m in _SURROGATE_ESCAPE.finditer(data, self.start, self.end):
            i = m.start()
            if not _is_escape(data, i):
                continue
            if data[i + 2:i + 4].lower() in (b"d8", b"d9", b"da", b"db"):  # high: a low one must follow
                paired = bool(_SURROGATE_ESCAPE.match(data, i + 6)) and data[i + 8:i + 10].lower() in (
                    b"dc", b"dd", b"de", b"df")
            else:  # low: a high one must come before
                paired = (i >= 6 and bool(_SURROGATE_ESCAPE.match(data, i - 6)) and _is_escape(data, i - 6)
                          and data[i - 4:i - 2].lower() in (b"d8", b"d9", b"da", b"db"))
            if not paired:
                lone.append(i)
        for i in lone:
            self._write(i, rb"\ufffd")
        self.surrogates += len(lone)
        return len(lone)

    def _write(self, at: int, text: bytes) -> None:
        self._writable()[at:at + len(text)] = text

    def _where(self, error: msgspec.DecodeError) -> str:
        pos = self._position(error)
        reason = str(error).split(": ", 1)[-1]
        reason = _ERROR_AT.sub("", reason).strip()
        if pos is None:
            return reason
        data = self._data()
        line = data.count(b"\n", 0, pos) + 1
        column = pos - (data.rfind(b"\n", 0, pos) + 1) + 1
        return f"{reason} at line {line:,}, column {column:,}, near {_excerpt(bytes(data[max(0, pos - 20):pos + 20]), 44)!r}"

    def _unreadable(self, error: msgspec.DecodeError) -> str:
        kind = "truncated or invalid JSON" if bytes(self.data[:_SNIFF]).strip() else "empty"
        return f"{self.path} is not a readable trace: {kind} ({self._where(error)})"

    def _notes(self) -> list[str]:
        notes = []
        if self.tokens:
            notes.append(f"{self.path}: read {len(self.tokens):,} NaN/Infinity values as null (JSON has no such "
                         "numbers; an event that needs one is skipped)")
        if self.surrogates:
            notes.append(f"{self.path}: read {self.surrogates:,} lone UTF-16 surrogate escapes in strings as "
                         "U+FFFD (they encode no character)")
        if self.end < len(self.data):
            notes.append(f"{self.path}: ignored {len(self.data) - self.end:,} bytes after the end of its JSON")
        return notes


def _as_string(token: bytes) -> bytes:
    """A JSON string of the token's length: NaN -> "N", Infinity -> "Infini"."""
    return b'"' + token[:len(token) - 2] + b'"'


def _is_escape(data: bytes | bytearray, i: int) -> bool:
    """Whether the backslash at i starts an escape (an even number of backslashes before it)."""
    k = i
    while k > 0 and data[k - 1] == 0x5C:
        k -= 1
    return (i - k) % 2 == 0


def _unescaped_quotes(data: bytes | bytearray, start: int, end: int) -> int:
    n = data.count(b'"', start, end)
    j = data.find(b'\\"', start, end)
    while j >= 0:
        if _is_escape(data, j):
            n -= 1
        j = data.find(b'\\"', j + 2, end)
    return n


def _stands_as_value(data: bytes | bytearray, at: int, n: int) -> bool:
    before = data[max(0, at - 8):at].rstrip(_JSON_WHITESPACE)[-1:]
    after = data[at + n:at + n + 8].lstrip(_JSON_WHITESPACE)[:1]
    return before in (b":", b",", b"[") and after in (b",", b"}", b"]")


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
                    rejects.add(_MALFORMED, str(exc))
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


def _columnize(path: str, events: _Events, *, with_python: bool, rejects: _Rejects) -> TraceData:
    ops = empty(_OP_COLUMNS)
    kern = empty(("cat", "name", "ts", "dur", "correlation", "ext_id", "stream", "device"))
    launch = empty(("name", "pid", "tid", "ts", "dur", "correlation", "ext_id", "kernel"))
    ann = empty(_INTERVAL_COLUMNS)
    # numbers in typed arrays while the batches decode: a step's own int and floats, kept from every batch,
    # held on to the small-object arenas of each (about 13 MiB of the 20x scaling trace's 509 steps)
    step_columns: dict[str, Any] = {"step": array("q"), "pid": [], "tid": [], "ts": array("d"), "dur": array("d")}
    py = empty(_INTERVAL_COLUMNS)
    mods = empty(_INTERVAL_COLUMNS)
    mem = empty(_MEMORY_COLUMNS)
    # The big tables' rows go into their compact columns (opscope.table.ColumnBuilder) batch by batch:
    # their lists hold one batch at a time.
    builders = [(table, built(table)) for table in (ops, kern, launch, ann, py, mods, mem)]
    n_ops = 0  # op rows moved to their columns
    dims_text = _TextCache(rejects, "Input Dims", check_sizes=True).text
    types_text = _TextCache(rejects, "Input type").text
    strides_text = _TextCache(rejects, "Input Strides").text
    concrete_text = _TextCache(rejects, "Concrete Inputs").text
    names: dict[str, str] = {}
    inductor: dict[int, tuple[str, float, float, str]] = {}  # op index -> inductor launch args (rare)
    gpu_runtime = None
    # Bound methods, looked up once: this loop runs once per event of traces with millions of them.
    o_name, o_pid, o_tid, o_ts, o_dur = (ops[k].append for k in ("name", "pid", "tid", "ts", "dur"))
    o_ext, o_seq, o_fwd, o_stack = (ops[k].append for k in ("ext_id", "seq", "fwd_tid", "call_stack"))
    o_dims, o_types, o_strides, o_conc = (ops[k].append for k in (
        "input_dims", "input_dtypes", "input_strides", "concrete_inputs"))
    p_name, p_pid, p_tid, p_ts, p_dur = (py[k].append for k in ("name", "pid", "tid", "ts", "dur"))
    intern = names.setdefault
    # One object per process and thread id: each event decodes its own int, and the tables keep them all
    # (two columns of the op, launch, Python and memory tables: 9 MB of the 5x scaling trace's ops alone).
    ids: dict[int | str, int | str] = {}
    share = ids.setdefault
    # Likewise one object per distinct memory address (`share` too), and one float per distinct duration
    # and memory size (a trace repeats a few thousand values: 587 in 160k ops of the 5x scaling trace).
    # Never ±0.0: equal as keys, but written apart.
    floats: dict[float, float] = {}
    one_float = floats.setdefault
    no_args = _Args()
    lo, hi = _INT64
    for batch in events.batches():
        for e in batch:
            e.pid = share(e.pid, e.pid)
            e.tid = share(e.tid, e.tid)
            if e.ph != "X":
                if e.ph == "i" and e.name == MEMORY_EVENT and e.args is not None:
                    _memory_event(e, e.args, mem, rejects, one_float, share)
                continue
            if not 0.0 <= e.dur <= MAX_DURATION_US:
                rejects.add("events with a negative or absurd duration (excluded)", f"{e.name[:40]!r} dur {e.dur:g} µs")
                continue
            if e.dur:
                e.dur = one_float(e.dur, e.dur)
            if len(e.name) > MAX_TEXT_CHARS:  # every later use of the name is bounded from here on
                rejects.add(_LONG_NAME, e.name[:40] + "…")
                e.name = bounded(e.name)
            cat = e.cat
            a = e.args
            if cat == "user_annotation":
                m = STEP_RE.match(e.name)
                if m:
                    step_columns["step"].append(int(m.group(1)))
                    step_columns["pid"].append(e.pid)
                    step_columns["tid"].append(e.tid)
                    step_columns["ts"].append(e.ts)
                    step_columns["dur"].append(e.dur)
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
                    kfile = a.kernel_file if isinstance(a.kernel_file, str) else ""
                    inductor[n_ops + len(ops["name"]) - 1] = (
                        a.kernel_backend, _nan_if_none(a.kernel_flop), _nan_if_none(a.kernel_num_gb),
                        bounded(kfile, 4096))
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
        n_ops += len(ops["name"])
        for table, columns in builders:
            flush(columns, table)
    ops, kern, launch, ann, py, mods, mem = (finished(columns) for _, columns in builders)
    steps: Table = {k: list(v) for k, v in step_columns.items()}  # the numbers' objects made now
    doc = events.top()
    n_events = events.n_events
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
    # GPU activity is judged on its own: a trace whose device clock is offset as a whole keeps its kernels
    # (they are tied to their launches by correlation ids, not by time)
    ops, launch, ann, steps, mods, mem = _near_the_rest([ops, launch, ann, steps, mods, mem], rejects)
    (kern,) = _near_the_rest([kern], rejects)
    ops, kern, launch, ann, mods, mem = (_drop_duplicates(table, key, rejects, unique) for table, key, unique in (
        (ops, ("name", "pid", "tid", "ts", "dur", "ext_id", "seq"), "ext_id"),
        (kern, ("cat", "name", "ts", "dur", "correlation", "ext_id", "stream", "device"), "correlation"),
        (launch, ("name", "pid", "tid", "ts", "dur", "correlation"), "correlation"),
        (ann, _INTERVAL_COLUMNS, "ts"), (mods, _INTERVAL_COLUMNS, "ts"), (mem, _MEMORY_COLUMNS, "ts")))
    for table in (ops, kern, launch, ann, py, mods, mem):
        compact(table)  # what is still a list (a column of mixed types, or rows taken out)
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


_DUPLICATES = ("exact duplicates of other events (same name, thread, times and ids, as a trace merger that "
               "writes each event twice gives)")


def _drop_duplicates(table: Table, key: tuple[str, ...], rejects: _Rejects, unique: str) -> Table:
    """`table` without the rows whose `key` columns repeat an earlier row's (counted): an event recorded
    once is one row, however often a merged trace lists it. Python frames are left as they are (a
    repeated frame changes no number). `unique`: a key column whose values are distinct in most
    traces (an id, else the time): when they are, or the times are, there is nothing to do."""
    n = nrows(table)
    if n < 2 or _distinct(table[unique]) or (unique != "ts" and _distinct(table["ts"])):
        return table  # the common case, decided at C speed
    rows = list(zip(*(table[k] for k in key), strict=True))
    if len(set(rows)) == n:
        return table
    seen: set[tuple[Any, ...]] = set()
    keep = []
    for i, row in enumerate(rows):
        if row not in seen:
            seen.add(row)
            keep.append(i)
    rejects.add(_DUPLICATES, n=n - len(keep))
    return take(table, keep)


def _distinct(values: list[Any]) -> bool:
    """Whether no two values are equal: increasing, as a profiler writes its ids and times (checked pair by
    pair, at C speed, with nothing held), else by a set (a set of ints costs half one of floats; 48 MiB
    of a 2.6M-event trace's op ids)."""
    return all(map(operator.lt, values, islice(values, 1, None))) or len(set(values)) == len(values)


def _near_the_rest(tables: list[Table], rejects: _Rejects) -> list[Table]:
    """The tables without the events whose timestamp lies more than MAX_DURATION_US from the median of
    all of them (counted): a trace spans seconds, so such a time is corrupt, and kept it would stretch
    the trace's span (the whole-trace step) by as much. (Python frames are not passed: one far away
    holds no op, so it changes nothing.)"""
    starts = [t["ts"] for t in tables if t["ts"]]
    if not starts or max(map(max, starts)) - min(map(min, starts)) <= MAX_DURATION_US:
        return tables  # the common case, at C speed
    times = sorted(x for column in starts for x in column)
    middle = times[len(times) // 2]
    out = []
    for table in tables:
        keep = [i for i, t in enumerate(table["ts"]) if abs(t - middle) <= MAX_DURATION_US]
        if len(keep) < nrows(table):
            dropped = next(i for i, t in enumerate(table["ts"]) if abs(t - middle) > MAX_DURATION_US)
            name = table["name"][dropped] if "name" in table else MEMORY_EVENT
            rejects.add("events with a timestamp more than 30 days from the rest of the trace (excluded)",
                        f"{_excerpt(name, 40)!r} at {table['ts'][dropped]:g} µs", n=nrows(table) - len(keep))
            table = take(table, keep)
        out.append(table)
    return out


def _memory_event(e: _Event, a: _Args, mem: Table, rejects: _Rejects, one_float: Callable[[float, float], float],
                  share: Callable[[int | str, int | str], int | str]) -> None:
    """One `[memory]` instant event (its args `a`): an allocation (Bytes > 0) or a free (Bytes < 0) at Addr.
    `one_float`, `share`: the one object of each distinct float (neither ±0.0 nor NaN goes in) and id."""
    if a.mem_bytes is None or not math.isfinite(a.mem_bytes) or not math.isfinite(e.ts):
        rejects.add("malformed [memory] events", f"Bytes {a.mem_bytes!r}")
        return
    size = one_float(a.mem_bytes, a.mem_bytes) if a.mem_bytes else a.mem_bytes
    total = a.mem_total if a.mem_total is not None and math.isfinite(a.mem_total) else math.nan
    if total == total and total:
        total = one_float(total, total)
    addr = _int64(a.mem_addr, rejects)
    for k, v in (("pid", e.pid), ("tid", e.tid), ("ts", e.ts), ("bytes", size),
                 ("addr", share(addr, addr)), ("total_allocated", total),
                 ("device_type", _int64(a.mem_device_type, rejects, 0)),
                 ("device_id", _int64(a.mem_device_id, rejects))):
        mem[k].append(v)


def _nan_if_none(x: float | None) -> float:
    return float("nan") if x is None else float(x)


def _add_inductor_columns(ops: Table, inductor: dict[int, tuple[str, float, float, str]]) -> None:
    n = nrows(ops)
    for j, (name, fill) in enumerate((("kernel_backend", ""), ("kernel_flop", math.nan), ("kernel_num_gb", math.nan),
                                      ("kernel_file", ""))):
        values = [fill] * n
        for i, launch_args in inductor.items():
            values[i] = launch_args[j]
        ops[name] = compacted(values)  # one column's list at a time


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
