"""torch's structured compile log (`TORCH_TRACE=DIR`, what tlparse reads), read for what a compiled
model's runtime rows need: per compiled graph, inductor's post-grad graph (every node with its dtype,
shape and inputs), which nodes each generated kernel fused and the user's stack traces behind them
(inductor's provenance tracking), the kernels' signatures (which buffers a Triton kernel writes in
place), and per compiled frame dynamo's metrics (compile times, graph breaks, recompilations, failures,
the recompile limit, inductor's reason for skipping CUDA graphs), its graph-break records (where and why)
and the compile metrics of backward graphs compiled at the first backward().

The log is a glog-style line per record (`V1204 15:21:26.728000 972 torch/_dynamo/utils.py:2126] {json}`),
followed, when the record has a payload, by payload lines that start with a tab. Only the records named
below are kept; everything else streams past, so memory stays bounded by what is kept, whatever the size
of the log. The format is torch's, not a stable API: a record this reader does not understand is skipped,
and what it could not read shows as missing provenance (the rows say so), never as a wrong number.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import stat
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from opscope.errors import TraceError
from opscope.limits import bounded

# The most of a log read (decompressed) and of one payload kept: far above a real model's log (a
# 2-layer block's is 0.75 MB; a 70B model's tens of MB), far below what would exhaust memory.
MAX_LOG_BYTES = 4 << 30
MAX_PAYLOAD_BYTES = 256 << 20

_HEADER_RE = re.compile(r"^[VIWEC]\d{4} [\d:.]+ +\d+ [^\]]*\] (\{.*\})\s*$")
# A post-grad graph node: `name: "bf16[4, 1024, 2048][2097152, 2048, 1]cuda:0" = torch.ops.aten.mm.default(a, b)`
_NODE_RE = re.compile(r'^\s+(?P<name>\w+)(?:: "(?P<type>[^"]*)")? = (?P<expr>.+?)(?:;\s+[\w\s,=]+= None)?$')
_CALL_RE = re.compile(r"^torch\.ops\.(?P<ns>\w+)\.(?P<op>\w+)(?:\.(?P<overload>\w+))?\((?P<args>.*)\)$")
_GETITEM_RE = re.compile(r"^(?P<src>\w+)\[(?P<index>\d+)\]$")
_TYPE_RE = re.compile(r"^(?P<dtype>[a-z]+\d*)\[(?P<shape>[^\]]*)\]\[(?P<stride>[^\]]*)\](?P<device>\S*)$")
_PLACEHOLDER_RE = re.compile(r'(\w+): "([^"]*)"')
_FILE_COMMENT_RE = re.compile(r"^\s+# File: (?P<path>.+?):(?P<line>\d+) in (?P<func>[^,]+), code: ")
_TRITON_DEF_RE = re.compile(r"^\s*def (?P<name>triton_\w+)\((?P<args>[^)]*)\)")
_CPP_BINDING_RE = re.compile(r"^(?P<name>cpp_\w+) = async_compile\.cpp_pybinding\(")
_RECORD_NAME_RE = re.compile(r'RAIIAtenRecordFunctionHandle \w+\("(?P<name>graph_\d+_cpp_\w+)"')
_FRAME_RE = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')
_PARAM_RE = re.compile(r"^l_(?P<path>.+?)_(?:parameters|buffers)_(?P<attr>\w+?)_$")

# The log's short dtype names -> torch.profiler's "Input type" strings, which the cost model reads.
PROFILER_DTYPES = {
    "f32": "float", "f64": "double", "f16": "c10::Half", "bf16": "c10::BFloat16", "i64": "long int",
    "i32": "int", "i16": "short int", "i8": "signed char", "u8": "unsigned char", "b8": "bool",
    "f8e4m3fn": "c10::Float8_e4m3fn", "f8e5m2": "c10::Float8_e5m2", "c64": "c10::complex<float>",
}


@dataclass(frozen=True)
class Frame:
    path: str
    line: int
    func: str


@dataclass(frozen=True)
class GraphNode:
    """One post-grad graph node. `op`: 'aten::mm' (the profiler's name), 'getitem', or '' for a
    placeholder; `args`: each input as a node name or as the literal text; `dtype`: the profiler's type
    string ('' when the log gives none: a multi-output node); `shape`/`stride`: None when symbolic."""

    name: str
    op: str
    args: tuple[str, ...]
    dtype: str
    shape: tuple[int, ...] | None
    stride: tuple[int, ...] | None
    # the innermost user frame the graph printer gave the node (`# File: path:line in fn`), if any
    frame: Frame | None = None

    @property
    def numel(self) -> int | None:
        if self.shape is None:
            return None
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass
class CompiledKernel:
    """One launch site inductor generated (a Triton or C++ kernel, an extern kernel such as
    `extern_kernels.mm`, or an op it left to ATen: `torch.ops.aten.x.default`), as its provenance
    tracking names it: `handle` = 'name:N', N its place in the graph's call order."""

    handle: str
    name: str
    nodes: tuple[str, ...] = ()
    stacks: tuple[tuple[Frame, ...], ...] = ()  # the user's stack traces (outermost frame first)
    # Triton kernels: how many leading pointer arguments are in_out_ptr (read and written), from the
    # generated code; None when the log has no code for it
    in_out_args: int | None = None
    pointer_args: int | None = None
    record_name: str = ""  # C++ kernels: the profiler row's name (graph_0_cpp_fused_..._0)

    @property
    def kind(self) -> str:
        """'triton', 'cpp', 'extern' (an extern kernel inductor calls), 'fallback' (an ATen op it did not
        lower) or ''."""
        if self.name.startswith("triton_"):
            return "triton"
        if self.name.startswith("cpp_"):
            return "cpp"
        if self.name.startswith("extern_kernels."):
            return "extern"
        if self.name.startswith("torch.ops."):
            return "fallback"
        return ""


@dataclass
class CompiledGraph:
    """One graph inductor compiled (a frame's forward, or its backward when training)."""

    compile_id: str
    nodes: dict[str, GraphNode] = field(default_factory=dict)
    outputs: tuple[str, ...] = ()
    kernels: dict[str, CompiledKernel] = field(default_factory=dict)  # by handle, in call order
    post_to_pre: dict[str, tuple[str, ...]] = field(default_factory=dict)
    cache_key: str = ""  # the FX graph cache key: `## Call CompiledFxGraph <key> ##` in a trace
    # graph input (placeholder) -> the module attribute it is, when dynamo's graph names it
    # ('primals_2' -> ('n1', 'w'))
    params: dict[str, tuple[str, str]] = field(default_factory=dict)
    # from the output code, which the log writes before the provenance that names the kernels:
    # Triton kernel -> (pointer arguments, of them in_out_ptr); C++ kernel -> its profiler row name
    triton_signatures: dict[str, tuple[int, int]] = field(default_factory=dict)
    cpp_record_names: dict[str, str] = field(default_factory=dict)

    def users(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {n: [] for n in self.nodes}
        for node in self.nodes.values():
            for a in node.args:
                if a in out:
                    out[a].append(node.name)
        return out


@dataclass(frozen=True)
class CompileMetrics:
    """dynamo's `compilation_metrics` record for one compiled frame (compile id 'F/N': frame F's Nth
    compilation; N > 0 is a recompilation)."""

    compile_id: str
    co_name: str
    co_filename: str
    co_firstlineno: int
    entire_frame_compile_time_s: float | None
    backend_compile_time_s: float | None
    inductor_compile_time_s: float | None
    graph_op_count: int | None
    restart_reasons: tuple[str, ...]
    recompile_reason: str
    fail_type: str
    fail_reason: str
    fail_user_frame: Frame | None
    num_graph_breaks: int | None  # torch's process-wide count of graph breaks so far, not this frame's
    # inductor's reason for not using CUDA graphs (mode="reduce-overhead") when it decided while compiling
    cudagraph_skip_reason: str = ""
    recompile_limit: int | None = None  # torch._dynamo.config.recompile_limit when this frame compiled
    duration_s: float | None = None  # the whole record's compile time (a backward graph has no frame time)

    @property
    def frame_index(self) -> str:
        return self.compile_id.split("/")[0]

    @property
    def attempt(self) -> int:
        try:
            return int(self.compile_id.split("/")[1])
        except (IndexError, ValueError):
            return 0


@dataclass(frozen=True)
class GraphBreak:
    """dynamo's `dynamo_graph_break_reason` record: where the frame `compile_id` broke (`Graph break in
    user code at path:line`), why (the reason's text, bounded), and the user code traceback (outermost
    frame first, torch's frames included)."""

    compile_id: str
    frame: Frame | None
    reason: str
    stack: tuple[Frame, ...]


@dataclass
class TorchTraceLog:
    path: str
    graphs: list[CompiledGraph] = field(default_factory=list)
    metrics: list[CompileMetrics] = field(default_factory=list)
    # `bwd_compilation_metrics`: a training graph's backward, compiled when it first runs (compile id of
    # the frame whose forward it differentiates)
    backward_metrics: list[CompileMetrics] = field(default_factory=list)
    graph_breaks: list[GraphBreak] = field(default_factory=list)
    # frame compile id -> dynamo's parameter names of the graph inputs, in order
    dynamo_inputs: dict[str, list[str]] = field(default_factory=dict)
    # cudagraph skips the compile metrics record ('skipping cudagraphs due to ...'), in log order
    cudagraph_skips: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def has_provenance(self) -> bool:
        return any(g.kernels for g in self.graphs)

    def kernels(self) -> Iterator[tuple[CompiledGraph, CompiledKernel]]:
        for g in self.graphs:
            for k in g.kernels.values():
                yield g, k


def read_torch_trace(path: str | Path) -> TorchTraceLog:
    """The kept records of a TORCH_TRACE log file (plain or gzip). TraceError (one line) when the file
    cannot be read or is not such a log."""
    p = Path(path)
    try:
        st = os.stat(p)
    except OSError as exc:
        raise TraceError(f"cannot read the TORCH_TRACE log {p}: {exc.strerror or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        logs = sorted(q for q in p.iterdir() if q.name.endswith((".log", ".log.gz")))
        if len(logs) != 1:
            raise TraceError(f"{p} is a directory with {len(logs)} TORCH_TRACE logs (*.log); name one file")
        p = logs[0]
    log = TorchTraceLog(path=str(p))
    seen_header = False
    try:
        with _open(p) as f:
            for header, payload in _records(f, p):
                seen_header = True
                _keep(log, header, payload)
    except (OSError, EOFError, zlib.error) as exc:
        raise TraceError(f"cannot read the TORCH_TRACE log {p}: {exc}") from None
    if not seen_header:
        raise TraceError(f"{p} is not a TORCH_TRACE log (no structured-log record in it; it is what "
                         "torch writes under TORCH_TRACE=DIR)")
    for g in log.graphs:
        g.params = _graph_params(g, log.dynamo_inputs.get(g.compile_id, []))
        for k in g.kernels.values():
            if k.name in g.triton_signatures:
                k.pointer_args, k.in_out_args = g.triton_signatures[k.name]
            k.record_name = g.cpp_record_names.get(k.name, "")
    return log


def _open(p: Path) -> IO[str]:
    with open(p, "rb") as raw:
        magic = raw.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(p, "rt", encoding="utf-8", errors="replace")
    return open(p, encoding="utf-8", errors="replace")


def _records(f: IO[str], p: Path) -> Iterator[tuple[dict[str, Any], str]]:
    """(header record, payload text) per record; the payload is '' when there is none or it is not kept."""
    total = 0
    header: dict[str, Any] | None = None
    payload: list[str] = []
    size = 0
    keep = False
    while True:
        line = f.readline(MAX_PAYLOAD_BYTES)
        if not line:
            break
        total += len(line)
        if total > MAX_LOG_BYTES:
            raise TraceError(f"{p} holds more than {MAX_LOG_BYTES >> 30} GiB of log: refused")
        if line.startswith("\t"):
            if header is not None and keep:
                size += len(line)
                if size > MAX_PAYLOAD_BYTES:
                    keep = False
                    payload = []
                else:
                    payload.append(line[1:])
            continue
        if header is not None:
            yield header, "".join(payload)
        header, payload, size = None, [], 0
        m = _HEADER_RE.match(line)
        if m is None:
            continue
        try:
            parsed = json.loads(m.group(1))
        except ValueError:
            continue
        if isinstance(parsed, dict):
            header = parsed
            keep = _wanted(parsed)
    if header is not None:
        yield header, "".join(payload)


_KEPT_ARTIFACTS = frozenset({
    "inductor_post_grad_graph", "inductor_provenance_tracking_node_mappings",
    "inductor_provenance_tracking_kernel_stack_traces", "fx_graph_cache_miss", "fx_graph_cache_hit",
    "dynamo_graph_break_reason",
})


def _wanted(header: dict[str, Any]) -> bool:
    art = header.get("artifact")
    if isinstance(art, dict):
        return art.get("name") in _KEPT_ARTIFACTS
    return any(k in header for k in ("inductor_output_code", "dynamo_output_graph", "inductor_post_grad_graph"))


def _compile_id(header: dict[str, Any]) -> str:
    frame, n = header.get("frame_id"), header.get("frame_compile_id")
    return f"{frame}/{n}" if frame is not None and n is not None else "?"


def _keep(log: TorchTraceLog, header: dict[str, Any], payload: str) -> None:
    cid = _compile_id(header)
    for key, kept in (("compilation_metrics", log.metrics), ("bwd_compilation_metrics", log.backward_metrics)):
        if isinstance(header.get(key), dict):
            m = _metrics(header[key])
            kept.append(m)
            if m.cudagraph_skip_reason:
                log.cudagraph_skips.append(m.cudagraph_skip_reason)
            return
    if "dynamo_output_graph" in header:
        log.dynamo_inputs[cid] = [name for name, _ in _PLACEHOLDER_RE.findall(_forward_signature(payload))]
        return
    art = header.get("artifact")
    if "inductor_post_grad_graph" in header:  # a graph served from inductor's cache logs it this way
        _add_graph(log, _read_graph(cid, payload))
        return
    if "inductor_output_code" in header:
        graph = _current(log, cid)
        if graph is not None:
            _read_output_code(graph, payload)
        return
    if not isinstance(art, dict):
        return
    name = art.get("name")
    if name == "inductor_post_grad_graph":
        _add_graph(log, _read_graph(cid, payload))
        return
    if name == "dynamo_graph_break_reason":
        log.graph_breaks.append(_graph_break(cid, payload))
        return
    graph = _current(log, cid)
    if graph is None:
        return
    if name in ("fx_graph_cache_miss", "fx_graph_cache_hit"):
        try:
            key = json.loads(payload).get("key", "")
        except (ValueError, AttributeError):
            key = ""
        if isinstance(key, str) and key and not graph.cache_key:
            graph.cache_key = key
    elif name == "inductor_provenance_tracking_node_mappings":
        try:
            maps = json.loads(payload)
        except ValueError:
            log.notes.append(f"{log.path}: a provenance node mapping that is not JSON was skipped")
            return
        if isinstance(maps, dict):
            _read_mappings(graph, maps)
    elif name == "inductor_provenance_tracking_kernel_stack_traces":
        try:
            stacks = json.loads(payload)
        except ValueError:
            return
        if isinstance(stacks, dict):
            for handle, traces in stacks.items():
                kernel = _kernel(graph, str(handle))
                if isinstance(traces, list):
                    kernel.stacks = tuple(_frames(str(t)) for t in traces)


def _add_graph(log: TorchTraceLog, graph: CompiledGraph) -> None:
    """A new graph, unless it is the one just logged under its other record name (the same graph twice)."""
    last = _current(log, graph.compile_id)
    if last is not None and not last.kernels and list(last.nodes) == list(graph.nodes):
        return
    log.graphs.append(graph)


def _current(log: TorchTraceLog, cid: str) -> CompiledGraph | None:
    for g in reversed(log.graphs):
        if g.compile_id == cid:
            return g
    return None


def _kernel(graph: CompiledGraph, handle: str) -> CompiledKernel:
    k = graph.kernels.get(handle)
    if k is None:
        name = handle.rsplit(":", 1)[0] if ":" in handle else handle
        k = graph.kernels[handle] = CompiledKernel(handle=handle, name=name)
    return k


def _read_mappings(graph: CompiledGraph, maps: dict[str, Any]) -> None:
    code_to_post = maps.get("cppCodeToPost")
    if isinstance(code_to_post, dict):
        for handle, nodes in sorted(code_to_post.items(), key=lambda kv: _handle_order(str(kv[0]))):
            if isinstance(nodes, list):
                _kernel(graph, str(handle)).nodes = tuple(str(n) for n in nodes)
    post_to_pre = maps.get("postToPre")
    if isinstance(post_to_pre, dict):
        graph.post_to_pre = {str(k): tuple(str(x) for x in v) for k, v in post_to_pre.items()
                             if isinstance(v, list)}


def _handle_order(handle: str) -> tuple[int, str]:
    tail = handle.rsplit(":", 1)[-1]
    return (int(tail), handle) if tail.isdigit() else (1 << 30, handle)


def _frames(trace: str) -> tuple[Frame, ...]:
    out = []
    for line in trace.splitlines():
        m = _FRAME_RE.match(line)
        if m:
            out.append(Frame(m.group("path"), int(m.group("line")), m.group("func")))
    return tuple(out)


def _forward_signature(code: str) -> str:
    for line in code.splitlines():
        if line.lstrip().startswith("def forward("):
            return line
    return ""


def _parse_type(text: str) -> tuple[str, tuple[int, ...] | None, tuple[int, ...] | None]:
    m = _TYPE_RE.match(text.strip())
    if m is None:
        return "", None, None
    return (PROFILER_DTYPES.get(m.group("dtype"), m.group("dtype")), _ints(m.group("shape")),
            _ints(m.group("stride")))


def _ints(text: str) -> tuple[int, ...] | None:
    parts = [t.strip() for t in text.split(",") if t.strip()]
    try:
        return tuple(int(t) for t in parts)
    except ValueError:
        return None  # symbolic (dynamic shapes: s0, 2*s1)


def split_args(text: str) -> list[str]:
    """Top-level comma-separated arguments of a call's text ('a, [1, 2], b' -> ['a', '[1, 2]', 'b'])."""
    out: list[str] = []
    depth = 0
    start = 0
    quote = ""
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = ""
            continue
        if ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(text[start:i].strip())
            start = i + 1
    tail = text[start:].strip()
    if tail:
        out.append(tail)
    return out


def _read_graph(cid: str, code: str) -> CompiledGraph:
    graph = CompiledGraph(compile_id=cid)
    frame: Frame | None = None
    for line in code.splitlines():
        stripped = line.strip()
        if stripped.startswith("def forward("):
            for name, typ in _PLACEHOLDER_RE.findall(stripped):
                dtype, shape, stride = _parse_type(typ)
                graph.nodes[name] = GraphNode(name, "", (), dtype, shape, stride)
            continue
        if stripped.startswith("# File:"):
            m = _FILE_COMMENT_RE.match(line)
            frame = Frame(m.group("path"), int(m.group("line")), m.group("func")) if m else None
            continue
        if stripped.startswith("return "):
            body = stripped[len("return "):].strip()
            if body.startswith("(") and body.endswith(")"):
                body = body[1:-1]
            graph.outputs = tuple(a for a in split_args(body) if a in graph.nodes)
            continue
        m = _NODE_RE.match(line)
        if m is None:
            continue
        name, typ, expr = m.group("name"), m.group("type") or "", m.group("expr").strip()
        dtype, shape, stride = _parse_type(typ) if typ else ("", None, None)
        call = _CALL_RE.match(expr)
        if call is not None:
            op = f"{call.group('ns')}::{call.group('op')}"
            args = tuple(split_args(call.group("args")))
        else:
            item = _GETITEM_RE.match(expr)
            if item is None:
                continue
            op, args = "getitem", (item.group("src"), item.group("index"))
        graph.nodes[name] = GraphNode(name, op, args, dtype, shape, stride, frame)
    return graph


def _read_output_code(graph: CompiledGraph, code: str) -> None:
    """Triton kernels' pointer arguments (in_out_ptr first) and C++ kernels' profiler row names."""
    cpp_name = ""
    for line in code.splitlines():
        m = _TRITON_DEF_RE.match(line)
        if m is not None:
            args = [a.split(":")[0].strip() for a in m.group("args").split(",")]
            ptrs = [a for a in args if "ptr" in a]
            graph.triton_signatures[m.group("name")] = (len(ptrs), sum(1 for a in ptrs if a.startswith("in_out_ptr")))
            continue
        m2 = _CPP_BINDING_RE.match(line)
        if m2 is not None:
            cpp_name = m2.group("name")
            continue
        m3 = _RECORD_NAME_RE.search(line)
        if m3 is not None and cpp_name:
            graph.cpp_record_names[cpp_name] = m3.group("name")
            cpp_name = ""


def _graph_params(graph: CompiledGraph, dynamo_inputs: list[str]) -> dict[str, tuple[str, str]]:
    """Post-grad placeholders (primals_N / arg N_1, in graph-input order) -> (module path, attribute)
    for those dynamo named after a module's parameter or buffer (`L_self_modules_n1_parameters_w_`)."""
    placeholders = [n for n in graph.nodes.values() if n.op == ""]
    out: dict[str, tuple[str, str]] = {}
    if len(placeholders) != len(dynamo_inputs):
        return out  # lifted or frozen parameters: the positions do not line up
    for node, dyn in zip(placeholders, dynamo_inputs, strict=True):
        m = _PARAM_RE.match(dyn.lower())
        if m is None:
            continue
        path = m.group("path")
        if path == "self":
            path = ""
        elif path.startswith("self_modules_"):
            path = path[len("self_modules_"):]
        else:
            continue  # a global's or a closure's tensor, not a module attribute
        module = ".".join(p for p in path.split("_modules_") if p)
        out[node.name] = (module, m.group("attr"))
    return out


_BREAK_AT_RE = re.compile(r"^Graph break in user code at (?P<path>.+):(?P<line>\d+)\s*$")


def _graph_break(cid: str, text: str) -> GraphBreak:
    """`Graph break in user code at PATH:LINE`, `Graph Break Reason: ...` up to `User code traceback:`,
    then the traceback's `File "...", line N, in f` lines."""
    frame = None
    reason: list[str] = []
    stack: list[Frame] = []
    part = "head"
    for line in text.splitlines():
        m = _BREAK_AT_RE.match(line.strip())
        if part == "head" and m is not None:
            frame = Frame(m.group("path"), int(m.group("line")), "")
            continue
        if line.startswith("Graph Break Reason:"):
            part = "reason"
            line = line[len("Graph Break Reason:"):]
        elif line.startswith("User code traceback:"):
            part = "stack"
            continue
        if part == "reason":
            reason.append(line)
        elif part == "stack":
            f = _FRAME_RE.match(line)
            if f is not None:
                stack.append(Frame(f.group("path"), int(f.group("line")), f.group("func")))
    return GraphBreak(compile_id=cid, frame=frame, reason=bounded("\n".join(reason).strip()), stack=tuple(stack))


def _config_int(text: Any, key: str) -> int | None:
    """An int setting of a config dump (compilation metrics' dynamo_config: a JSON object as a string)."""
    if not isinstance(text, str):
        return None
    try:
        value = json.loads(text).get(key)
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _metrics(d: dict[str, Any]) -> CompileMetrics:
    def num(key: str) -> float | None:
        v = d.get(key)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    def text(key: str) -> str:
        v = d.get(key)
        return bounded(str(v)) if v not in (None, "") else ""

    reasons = d.get("restart_reasons")
    restarts = tuple(bounded(str(r)) for r in reasons) if isinstance(reasons, (list, tuple)) else ()
    fail_frame = None
    fname, fline = d.get("fail_user_frame_filename"), d.get("fail_user_frame_lineno")
    if isinstance(fname, str) and isinstance(fline, int):
        fail_frame = Frame(fname, fline, "")
    ops = num("graph_op_count")
    breaks = num("num_graph_breaks")
    first = d.get("co_firstlineno")
    duration = num("duration_us")
    return CompileMetrics(
        compile_id=text("compile_id") or "?", co_name=text("co_name"), co_filename=text("co_filename"),
        co_firstlineno=first if isinstance(first, int) else 0,
        entire_frame_compile_time_s=num("entire_frame_compile_time_s"),
        backend_compile_time_s=num("backend_compile_time_s"),
        inductor_compile_time_s=num("inductor_compile_time_s"),
        graph_op_count=int(ops) if ops is not None else None, restart_reasons=restarts,
        recompile_reason=text("recompile_reason"), fail_type=text("fail_type"), fail_reason=text("fail_reason"),
        fail_user_frame=fail_frame, num_graph_breaks=int(breaks) if breaks is not None else None,
        cudagraph_skip_reason=text("cudagraph_skip_reason"),
        recompile_limit=_config_int(d.get("dynamo_config"), "recompile_limit"),
        duration_s=duration / 1e6 if duration is not None else None)
