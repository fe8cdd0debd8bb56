"""What `opscope profile` knows beyond its timed trace (each op's exact line, module and TensorList
dtypes from the dispatch pass; every module's class; the memory pass), embedded in the trace it saves so
that `opscope analyze RUN/trace.json.gz` reproduces the run's table.

The block is one top-level key of the trace's JSON object, ANNOTATION_KEY, beside torch's own
("traceEvents", "deviceProperties", ...): Perfetto and chrome://tracing read only the keys they know, so
they show the trace as before. Ops are identified by their "External id" (unique per cpu_op event).
Torch-free; the block is read like the rest of a trace: as untrusted data, and a block opscope cannot
use is ignored (with a warning), never an error.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from opscope import units
from opscope.analysis.memory import KEY_COLUMNS, MemoryProfile
from opscope.limits import bounded
from opscope.run.write import json_safe
from opscope.table import Table

ANNOTATION_KEY = "opscope"
BLOCK_VERSION = 1
# read_block's result: External id -> (source line, module, module class, input types), module classes
# (qualified name -> class), memory
Block = tuple[dict[int, tuple[str, str, str, str]], dict[str, str], MemoryProfile | None]


class EmbeddedLines(dict[int, str]):
    """The block's per-op data for one event table, shaped like capture.lines.LineJoin: event index ->
    source line; `modules` and `input_types` by event index."""

    def __init__(self) -> None:
        super().__init__()
        self.modules: dict[int, tuple[str, str]] = {}
        self.input_types: dict[int, str] = {}


def make_block(ev: Table, module_classes: dict[str, str], memory: MemoryProfile | None) -> dict[str, Any]:
    """The block for a profiled trace: per cpu_op with a unique External id its final source line, module
    and dispatch-pass input types (strings by index into one table), the model's module classes and
    the memory pass."""
    strings: dict[str, int] = {"": 0}

    def ref(text: str) -> int:
        return strings.setdefault(text, len(strings))

    ext = ev["ext_id"]
    count = Counter(ext)
    cols: dict[str, list[int]] = {"external_id": [], "source_location": [], "module": [], "module_class": [],
                                  "input_types": []}
    values = [ev[c] for c in ("source_location", "module", "module_class", "dispatch_input_types")]
    for i, x in enumerate(ext):
        if x < 0 or count[x] != 1:
            continue
        row = [ref(v[i]) for v in values]
        if any(row):
            cols["external_id"].append(x)
            for name, value in zip(("source_location", "module", "module_class", "input_types"), row, strict=True):
                cols[name].append(value)
    block: dict[str, Any] = {"format_version": BLOCK_VERSION, "strings": list(strings), "ops": cols,
                             "module_classes": dict(module_classes)}
    if memory is not None:
        block["memory"] = {"summary": memory.summary, "steps": memory.steps, "retained": memory.retained,
                           "per_key": [[*k, a, f, n] for k, (a, f, n) in memory.per_key.items()]}
    return block


def embed(path: Path, block: dict[str, Any]) -> None:
    """Adds the block to the JSON object in `path` (a torch.profiler Chrome trace) in place: the closing
    brace is replaced by `, "opscope": {...}}`, so the trace's own bytes are untouched."""
    data = json.dumps(json_safe(block), separators=(",", ":"), allow_nan=False).encode()
    with open(path, "r+b") as f:
        f.seek(0, 2)
        size = f.tell()
        f.seek(max(size - 4096, 0))
        tail = f.read()
        end = tail.rstrip().rfind(b"}")
        if end < 0:
            raise ValueError(f"{path} does not end with a JSON object")
        f.seek(size - len(tail) + end)
        f.write(b',\n"' + ANNOTATION_KEY.encode() + b'": ' + data + b"}\n")
        f.truncate()


class BlockError(ValueError):
    """A block opscope cannot use; its message is the warning's."""


def read_block(block: Any) -> Block:
    """(External id -> (source line, module, module class, input types), module classes, memory) from a
    trace's block; BlockError when it is not one opscope wrote."""
    if not isinstance(block, dict) or block.get("format_version") != BLOCK_VERSION:
        raise BlockError("its format_version is not one this opscope reads")
    strings = block.get("strings")
    ops = block.get("ops")
    if not isinstance(strings, list) or not all(isinstance(s, str) for s in strings) or not isinstance(ops, dict):
        raise BlockError("'strings' or 'ops' is malformed")
    names = ("external_id", "source_location", "module", "module_class", "input_types")
    columns: list[list[int]] = []
    for name in names:
        column = ops.get(name)
        if not isinstance(column, list) or not all(_is_int(x) for x in column):
            raise BlockError("'ops' columns are malformed")
        columns.append(column)
    if len({len(c) for c in columns}) != 1:
        raise BlockError("'ops' columns are malformed")
    strings = [bounded(s) for s in strings]  # names and lines from an untrusted file, as the reader's
    n = len(strings)
    if any(not 0 <= x < n for c in columns[1:] for x in c):
        raise BlockError("'ops' refers to strings it does not have")
    by_ext = {ext: (strings[a], strings[b], strings[c], strings[d]) for ext, a, b, c, d in zip(*columns, strict=True)}
    classes = block.get("module_classes", {})
    if not isinstance(classes, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in classes.items()):
        raise BlockError("'module_classes' is malformed")
    classes = {bounded(k): bounded(v) for k, v in classes.items()}
    return by_ext, classes, _memory(block.get("memory"))


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x: Any) -> bool:
    """A finite JSON number: not text, which units.number would read too (a block with numbers as text
    is malformed)."""
    return not isinstance(x, str) and units.number(x) is not None


def _memory(block: Any) -> MemoryProfile | None:
    if block is None:
        return None
    if not isinstance(block, dict) or not isinstance(block.get("summary"), dict) or \
            not _is_int(block.get("steps")) or not isinstance(block.get("retained"), list) or \
            not isinstance(block.get("per_key"), list):
        raise BlockError("'memory' is malformed")
    width = len(KEY_COLUMNS)
    per_key = {}
    for entry in block["per_key"]:
        if not (isinstance(entry, list) and len(entry) == width + 3 and all(isinstance(x, str) for x in entry[:width])
                and _is_num(entry[width]) and _is_num(entry[width + 1]) and _is_int(entry[width + 2])):
            raise BlockError("'memory.per_key' is malformed")
        per_key[tuple(entry[:width])] = (float(entry[width]), float(entry[width + 1]), int(entry[width + 2]))
    retained = []
    for r in block["retained"]:
        if not (isinstance(r, dict) and _is_int(r.get("step")) and _is_num(r.get("bytes"))
                and _is_int(r.get("tensors")) and all(r.get(k) is None or isinstance(r.get(k), str)
                                                      for k in ("op", "source_location", "module"))):
            raise BlockError("'memory.retained' is malformed")
        retained.append({k: r.get(k) for k in ("step", "op", "source_location", "module", "bytes", "tensors")})
    summary = block["summary"]
    per_step = summary.get("per_step", [])
    if not isinstance(per_step, list) or not all(isinstance(p, dict) and _is_num(p.get("end_allocated_bytes"))
                                                 for p in per_step):
        raise BlockError("'memory.summary.per_step' is malformed")
    growth = summary.get("growth_bytes_per_step")
    if growth is not None and not _is_num(growth):
        raise BlockError("'memory.summary.growth_bytes_per_step' is malformed")
    return MemoryProfile(per_key=per_key, summary=summary, retained=retained, steps=block["steps"])


def embedded_lines(by_ext: dict[int, tuple[str, str, str, str]], ev: Table) -> EmbeddedLines:
    """The block's per-op data on this trace's event table (matched by External id)."""
    out = EmbeddedLines()
    for i, ext in enumerate(ev["ext_id"]):
        hit = by_ext.get(ext) if ext >= 0 else None
        if hit is None:
            continue
        source, module, cls, types = hit
        if source:
            out[i] = source
        if cls:
            out.modules[i] = (module, cls)
        if types:
            out.input_types[i] = types
    return out
