"""torch.compile'd code: the cost and the place of each kernel inductor generated.

A fused kernel's FLOPs are the sum over the ATen ops it fused, each from the cost model; its bytes are
what it reads from and writes to memory: its external inputs and outputs, each buffer counted once
(intermediates stay in registers or cache). A buffer a kernel reads and overwrites in place (Triton's
in_out_ptr) is read once and written once. Sources, best first (the row's note names the one it used):

1. the TORCH_TRACE log (opscope.trace.torch_trace: `profile` records one for a compiled model, `analyze
   --torch-trace LOG` reads one): inductor's post-grad graph gives each fused node's op, dtype and shape;
   its provenance gives which nodes each kernel fused and the user's stack traces behind them, so the row
   also gets the user's line(s) and module instead of the compile wrapper's;
2. the trace alone (a Triton kernel's CPU-side launch event: its buffer arguments' dims and types, its
   element counts, and the op names in the kernel's name): bytes are the launch's buffers, each once (the
   trace does not say which buffer a kernel overwrites in place; with `--inductor-cache DIR` the kernel's
   generated code says, and such a buffer counts twice); FLOPs are the named ops' per-element FLOPs over
   all of the launch's elements, an upper bound (in a reduction kernel some of them run once per row).

Where the trace carries inductor's own estimates (`kernel_num_gb`, `kernel_flop`, recorded with
`torch._inductor.config.benchmark_kernel`), the note gives them and how far opscope's count is from them.
Extern kernels (mm, addmm, convolution, attention) keep the ATen cost of their own rows; they too get the
user's line and module from the provenance.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from opscope.costmodel import OpCall, estimate
from opscope.costmodel.base import DTYPE_NAMES, ITEMSIZE, TENSOR_CORE_FAMILIES, JsonValue, UnreadableCall
from opscope.costmodel.elementwise import BINARY, TERNARY, UNARY
from opscope.sources import frame_location
from opscope.table import Table, nrows
from opscope.trace.reader import COMPILED_GRAPH_RE
from opscope.trace.torch_trace import CompiledGraph, CompiledKernel, GraphNode, TorchTraceLog

NAN = float("nan")

# Post-grad ops that move no data of their own (a view, an index into a multi-output node).
VIEW_OPS = frozenset({
    "aten::reshape", "aten::view", "aten::_unsafe_view", "aten::permute", "aten::transpose", "aten::t",
    "aten::expand", "aten::squeeze", "aten::unsqueeze", "aten::select", "aten::slice", "aten::alias",
    "aten::as_strided", "aten::view_as_real", "aten::view_as_complex", "aten::unflatten", "aten::flatten",
    "aten::split", "aten::split_with_sizes", "aten::unbind", "aten::narrow", "aten::diagonal", "getitem",
})
# Views that keep every element: reading through one reads its source's whole buffer.
_WHOLE_VIEWS = frozenset({"aten::reshape", "aten::view", "aten::_unsafe_view", "aten::permute", "aten::transpose",
                          "aten::t", "aten::squeeze", "aten::unsqueeze", "aten::alias", "aten::unflatten",
                          "aten::flatten"})
# prims the cost model knows under an ATen name
_PRIM_AS_ATEN = {"prims::convert_element_type": "aten::_to_copy", "prims::fma": "aten::addcmul"}
_GRAPH_PREFIX_RE = re.compile(r"^graph_\d+_")
_NAME_OPS_RE = re.compile(r"^triton_(?:poi|red|per|tem|for|mix)_fused_(?P<ops>\w+?)_\d+$")
# FLOPs per element of reductions named in a kernel's name (one add or compare per element read)
_REDUCTION_FLOPS = {"sum": 1.0, "mean": 1.0, "amax": 1.0, "amin": 1.0, "max": 1.0, "min": 1.0, "prod": 1.0,
                    "var_mean": 3.0, "var": 3.0, "std": 3.0, "argmax": 1.0, "argmin": 1.0, "logsumexp": 4.0,
                    "native_layer_norm": 8.0, "native_group_norm": 8.0, "_softmax": 5.0, "_log_softmax": 5.0,
                    "native_batch_norm": 8.0, "_native_batch_norm_legit_no_training": 4.0}

LOG_SOURCE = "post-grad graph and provenance of the TORCH_TRACE log"
TRACE_SOURCE = "the trace's launch arguments"


@dataclass(frozen=True)
class KernelCost:
    flops: float
    nbytes: float
    family: str
    dtype: str
    note: str


@dataclass(frozen=True)
class Placement:
    location: str  # the primary user line ('' when the provenance has no user frame)
    lines: tuple[str, ...]  # every user line the kernel's ops came from
    module: str  # module path relative to the compiled module ('' = the compiled module itself)
    # the graph reads module attributes (dynamo named its inputs after them): it is a module's forward, so
    # a kernel with no module of its own ran in the compiled module itself, not outside the model
    of_module: bool = False


def base_kernel_name(name: str) -> str:
    """A profiler row's kernel name as inductor's provenance names it (`graph_0_cpp_fused_x_0` -> `cpp_fused_x_0`)."""
    return _GRAPH_PREFIX_RE.sub("", name)


# --- cost from the post-grad graph --------------------------------------------------------------------

def _literal_type(text: str) -> str:
    if text.startswith("["):
        return "ScalarList"
    try:
        float(text)
    except ValueError:
        return "Scalar" if text in ("True", "False") else ""
    return "Scalar"


def node_call(graph: CompiledGraph, node: GraphNode) -> OpCall | None:
    """The node as the profiler would have recorded its call (dims, types, strides, concrete inputs)."""
    dims: list[JsonValue] = []
    dtypes: list[JsonValue] = []
    strides: list[JsonValue] = []
    concrete: list[JsonValue] = []
    for a in node.args:
        src = graph.nodes.get(a)
        if src is not None:
            if src.shape is None or not src.dtype:
                return None  # a symbolic shape or a multi-output node: no count rather than a wrong one
            dims.append(list[JsonValue](src.shape))
            dtypes.append(src.dtype)
            strides.append(list[JsonValue](src.stride or ()))
            concrete.append("")
        else:
            dims.append([])
            dtypes.append(_literal_type(a))
            strides.append([])
            concrete.append(a)
    name = _PRIM_AS_ATEN.get(node.op, node.op)
    return OpCall(name, tuple(dims), tuple(dtypes), tuple(strides), tuple(concrete))


def _root(graph: CompiledGraph, name: str) -> str:
    """The buffer a node's value lives in: through whole-buffer views to their source."""
    seen = 0
    node = graph.nodes.get(name)
    while node is not None and node.op in _WHOLE_VIEWS and node.args and node.args[0] in graph.nodes and seen < 64:
        name = node.args[0]
        node = graph.nodes[name]
        seen += 1
    return name


def _nbytes(node: GraphNode) -> float | None:
    n, size = node.numel, ITEMSIZE.get(node.dtype)
    return None if n is None or size is None else float(n * size)


def kernels_of_nodes(graph: CompiledGraph) -> dict[str, set[str]]:
    """Post-grad node -> the handles of the kernels that compute it (several when inductor recomputes it)."""
    out: dict[str, set[str]] = {}
    for k in graph.kernels.values():
        for n in k.nodes:
            out.setdefault(n, set()).add(k.handle)
    return out


def graph_kernel_cost(graph: CompiledGraph, kernel: CompiledKernel,
                      users: dict[str, list[str]] | None = None,
                      computed_by: dict[str, set[str]] | None = None) -> KernelCost | None:
    """FLOPs (cost model, over the fused nodes) and bytes (external inputs and outputs) of a generated
    kernel from the post-grad graph; None when a node's shape is unknown (symbolic) or missing. A fused
    value is an output when a user outside the kernel needs it from memory: a user that the kernel computing
    it recomputes it itself (a value inductor rematerializes in two kernels) does not."""
    members = [graph.nodes[n] for n in kernel.nodes if n in graph.nodes]
    if not members or len(members) != len(kernel.nodes):
        return None
    inside = {n.name for n in members}
    users = users if users is not None else graph.users()
    computed_by = computed_by if computed_by is not None else kernels_of_nodes(graph)

    def stored(name: str) -> bool:
        if name in outputs:
            return True
        mine = computed_by.get(name, set())
        for u in users.get(name, ()):
            if u in inside:
                continue
            if not (computed_by.get(u, set()) & mine - {kernel.handle}):
                return True
        return False

    outputs = set(graph.outputs)
    flops = 0.0
    uncounted: list[str] = []
    top_family, top_flops = "", -1.0
    reads: dict[str, float] = {}
    writes: dict[str, float] = {}
    for node in members:
        for a in node.args:
            if a in graph.nodes and a not in inside:
                src = graph.nodes[a]
                key = _root(graph, a)
                size = _nbytes(graph.nodes[key]) if src.op in _WHOLE_VIEWS else _nbytes(src)
                if size is None:
                    return None
                reads[key] = max(reads.get(key, 0.0), size)
        if node.op not in VIEW_OPS:
            call = node_call(graph, node)
            if call is None:
                return None
            cost = estimate(call)
            if cost is None:
                uncounted.append(node.op)
            else:
                flops += float(cost.flops)
                if float(cost.flops) > top_flops:
                    top_family, top_flops = cost.family, float(cost.flops)
        if stored(node.name):
            if node.op == "getitem" or (node.op in VIEW_OPS and node.args and node.args[0] in inside):
                key = _root(graph, node.name)
                if key in inside and graph.nodes[key].op not in VIEW_OPS:
                    size = _nbytes(graph.nodes[key])
                else:
                    size = _nbytes(node)
            else:
                key, size = node.name, _nbytes(node)
            if size is None:
                if node.op == "getitem" or not node.dtype:
                    continue
                return None
            writes[key] = max(writes.get(key, 0.0), size)
    family = "matmul" if top_family in TENSOR_CORE_FAMILIES and kernel.name.startswith("triton_tem") else (
        top_family if top_family in TENSOR_CORE_FAMILIES else "compiled")
    dtype = _kernel_dtype(members, graph)
    note = f"inductor kernel: FLOPs of its {sum(1 for n in members if n.op not in VIEW_OPS)} fused ops (cost model), " \
           f"bytes of its external inputs and outputs ({LOG_SOURCE})"
    if uncounted:
        note += f"; no FLOP count for {', '.join(sorted(set(uncounted)))}"
    return KernelCost(flops, sum(reads.values()) + sum(writes.values()), family, dtype, note)


def _kernel_dtype(members: Sequence[GraphNode], graph: CompiledGraph) -> str:
    """The floating dtype of the kernel's largest fused value (its data's, not its math's)."""
    best, size = "", -1
    for node in members:
        if node.numel is not None and node.dtype in DTYPE_NAMES and node.numel > size and \
                DTYPE_NAMES[node.dtype] in ("float32", "bfloat16", "float16", "float64", "float8"):
            best, size = DTYPE_NAMES[node.dtype], node.numel
    return best


# --- cost from the trace alone -------------------------------------------------------------------------

def _per_element_flops(op: str) -> float | None:
    spec = UNARY.get(op) or BINARY.get(op) or TERNARY.get(op)
    if spec is not None:
        return float(spec.flops) if not callable(spec.flops) else 1.0
    return _REDUCTION_FLOPS.get(op)


def name_ops(name: str) -> list[str]:
    """The ATen ops a Triton kernel's name lists (`triton_red_fused_add_mean_mul_pow_rsqrt_0` -> add, mean,
    mul, pow, rsqrt), matched longest first against the ops the cost model knows."""
    m = _NAME_OPS_RE.match(name)
    if m is None:
        return []
    tokens = m.group("ops").split("_")
    out: list[str] = []
    i = 0
    while i < len(tokens):
        for j in range(len(tokens), i, -1):
            cand = "_".join(tokens[i:j])
            if _per_element_flops(cand) is not None or _per_element_flops("_" + cand) is not None:
                out.append(cand if _per_element_flops(cand) is not None else "_" + cand)
                i = j
                break
        else:
            i += 1  # a token of a view or copy op's name (_unsafe_view, _to_copy, clone): no FLOPs
    return out


def trace_kernel_cost(name: str, dims: Sequence[object], dtypes: Sequence[object], concrete: Sequence[object],
                      in_out: int | None) -> KernelCost | None:
    """A Triton kernel's cost from its CPU-side launch event: bytes = its buffer arguments (in the order of
    its signature: in_out_ptr first), FLOPs = the named ops over all of its elements."""
    sizes: list[float] = []
    dtype_counts: dict[str, float] = {}
    for d, t in zip(dims, dtypes, strict=False):
        if isinstance(d, list) and isinstance(t, str) and t in ITEMSIZE and all(isinstance(x, int) for x in d):
            n = math.prod(d) if d else 1
            sizes.append(float(n * ITEMSIZE[t]))
            dtype_counts[t] = dtype_counts.get(t, 0.0) + n
    if not sizes:
        return None
    numels = []
    for c in concrete:
        try:
            numels.append(int(str(c)))
        except ValueError:
            continue
    elements = float(math.prod(numels)) if numels else max(sizes)
    nbytes = sum(sizes) + (sum(sizes[:in_out]) if in_out else 0.0)
    ops = name_ops(name)
    flops = sum(_per_element_flops(op) or 0.0 for op in ops) * elements
    top = max(dtype_counts, key=dtype_counts.__getitem__)
    if in_out is None:
        how = "each buffer once (the trace does not say which one the kernel overwrites in place: " \
              "--inductor-cache DIR or --torch-trace LOG does)"
    else:
        how = f"each buffer once, its {in_out} in-place one(s) twice (the generated code's signature)"
    note = (f"inductor kernel, from {TRACE_SOURCE}: bytes of its {len(sizes)} buffers, {how}; FLOPs of the ops "
            f"its name lists ({', '.join(ops) or 'none'}) over all {elements:.0f} elements, an upper bound")
    return KernelCost(flops, nbytes, "compiled", DTYPE_NAMES.get(top, ""), note)


_TRITON_SIGNATURE_RE = re.compile(r"^\s*def (triton_\w+)\(([^)]*)\)", re.M)


def cached_in_out(kernel_file: str, cache_dir: Path) -> int | None:
    """How many in_out_ptr arguments the Triton kernel in `kernel_file` (a path on the recording machine,
    `.../<2 chars>/<hash>.py`) has, read from the same file under `cache_dir`; None when absent."""
    parts = kernel_file.replace("\\", "/").split("/")
    if len(parts) < 2:
        return None
    path = cache_dir / parts[-2] / parts[-1]
    try:
        if os.path.getsize(path) > 16 << 20:
            return None
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    m = _TRITON_SIGNATURE_RE.search(text)
    if m is None:
        return None
    return sum(1 for a in m.group(2).split(",") if a.strip().startswith("in_out_ptr"))


# --- placing kernels -------------------------------------------------------------------------------------

def kernel_placement(graph: CompiledGraph, kernel: CompiledKernel) -> Placement:
    lines: list[str] = []
    for stack in kernel.stacks:
        for frame in reversed(stack):  # innermost user frame of each stack trace
            loc = frame_location(frame.path, frame.line)
            if loc is not None:
                lines.append(loc)
                break
    if not lines:  # no provenance stack: the graph printer's frame of each fused node
        for n in kernel.nodes:
            node = graph.nodes.get(n)
            if node is not None and node.frame is not None:
                loc = frame_location(node.frame.path, node.frame.line)
                if loc is not None:
                    lines.append(loc)
    unique = tuple(dict.fromkeys(sorted(set(lines), key=_line_order)))
    return Placement(unique[0] if unique else "", unique, _kernel_module(graph, kernel), bool(graph.params))


def _line_order(loc: str) -> tuple[str, int]:
    path, _, line = loc.rpartition(":")
    return (path, int(line)) if line.isdigit() else (loc, 0)


def _kernel_module(graph: CompiledGraph, kernel: CompiledKernel) -> str:
    """The deepest module all of the kernel's module attributes (parameters, buffers) belong to; '' (the
    compiled module) when it uses none or several unrelated ones."""
    modules = {graph.params[a][0] for n in kernel.nodes if n in graph.nodes
               for a in graph.nodes[n].args if a in graph.params}
    if not modules:
        return ""
    parts = [m.split(".") if m else [] for m in modules]
    common: list[str] = []
    for level in zip(*parts, strict=False):
        if len(set(level)) != 1:
            break
        common.append(level[0])
    return ".".join(common)


def _expected_row(kernel: CompiledKernel) -> str:
    if kernel.kind in ("triton", "cpp"):
        return kernel.name
    if kernel.kind == "extern":  # extern_kernels.mm -> aten::mm
        return "aten::" + kernel.name.split(".", 1)[1]
    if kernel.kind == "fallback":  # torch.ops.aten.x.default -> aten::x
        parts = kernel.name.split(".")
        return f"{parts[2]}::{parts[3]}" if len(parts) >= 4 else ""
    return ""


WRAPPER_NOTE = ("compiled code's own overhead: the time inside it outside the rows below it (its Python wrapper, "
                "guards, allocations, launches); no FLOPs or bytes of its own")


def _wrapper_overhead(ev: Table, gpu: bool) -> None:
    """A compiled region or graph whose kernels are rows of their own (kernel rows or an inner graph below
    it, or on a GPU no kernel launched from the range itself) holds only its own overhead: 0 FLOPs, 0 bytes, bound overhead. Without such rows
    (a CPU trace recorded without inductor's kernel profiling) its time includes its kernels': no cost."""
    kinds, row_parent = ev["row_kind"], ev["row_parent"]
    holds_rows: set[int] = set()
    for i, kind in enumerate(kinds):
        if kind in ("kernel", "graph"):
            p = row_parent[i]
            steps = 0
            while p >= 0 and p not in holds_rows and steps < 4096:
                holds_rows.add(p)
                p = row_parent[p]
                steps += 1
    device = ev["device_us"] if "device_us" in ev else [0.0] * len(kinds)
    for i, kind in enumerate(kinds):
        # on a GPU, a range that launched kernels itself (inductor's launches not recorded) carries their time
        if kind == "graph" and (i in holds_rows or (gpu and not float(device[i]) > 0)):
            ev["flops"][i], ev["bytes"][i], ev["family"][i], ev["note"][i] = 0.0, 0.0, "compiled", WRAPPER_NOTE


def place_compiled(ev: Table, log: TorchTraceLog | None, *, inductor_cache: Path | None = None,
                   module_classes: dict[str, str] | None = None, gpu: bool = False) -> dict[str, int]:
    """Gives compiled kernel events their cost, and every event a compiled graph ran its user's line and
    module (in place, on the event table after event_costs). Returns counts for the run's summary."""
    n = nrows(ev)
    names, kinds, parents = ev["name"], ev["row_kind"], ev["parent"]
    flops, nbytes, family, note, dtype = ev["flops"], ev["bytes"], ev["family"], ev["note"], ev["dtype"]
    stats = {"kernels": 0, "costed_from_log": 0, "costed_from_trace": 0, "placed": 0}
    placed: dict[int, Placement] = {}

    if log is not None and log.graphs:
        by_key = {g.cache_key: g for g in log.graphs if g.cache_key}
        children: dict[int, list[int]] = {}
        for i in range(n):
            rp = ev["row_parent"][i]
            if rp >= 0 and ev["is_row"][i]:
                children.setdefault(rp, []).append(i)
        users_cache: dict[int, dict[str, list[str]]] = {}
        computed_cache: dict[int, dict[str, set[str]]] = {}
        for i in range(n):
            m = COMPILED_GRAPH_RE.match(names[i])
            if m is None or kinds[i] != "graph":
                continue
            rows = sorted(children.get(i, []), key=lambda j: ev["ts"][j])
            graph = _graph_for(names[i], by_key, log, rows, names)
            if graph is None:
                continue
            users = users_cache.setdefault(id(graph), graph.users())
            computed_by = computed_cache.setdefault(id(graph), kernels_of_nodes(graph))
            for j, kernel in _align(rows, names, list(graph.kernels.values())):
                placement = kernel_placement(graph, kernel)
                placed[j] = placement
                if kernel.kind in ("triton", "cpp"):
                    cost = graph_kernel_cost(graph, kernel, users, computed_by)
                    if cost is not None:
                        flops[j], nbytes[j], family[j], dtype[j] = cost.flops, cost.nbytes, cost.family, cost.dtype
                        note[j] = _with_estimates(ev, j, cost)
                        stats["costed_from_log"] += 1
                    else:
                        note[j] = ("inductor kernel: no cost: the TORCH_TRACE log names no graph nodes for it (a "
                                   "backward graph compiled at the first backward() logs none) or a shape is symbolic")
                    if placement.lines:
                        note[j] += f"; fuses the ops of {', '.join(placement.lines)}"

    for j in range(n):
        if kinds[j] != "kernel":
            continue
        stats["kernels"] += 1
        if j in placed and flops[j] == flops[j]:
            continue
        in_out = None
        if inductor_cache is not None and "kernel_file" in ev and ev["kernel_file"][j]:
            in_out = cached_in_out(str(ev["kernel_file"][j]), inductor_cache)
        cost = _trace_cost(ev, j, in_out)
        if cost is not None:
            flops[j], nbytes[j], family[j], dtype[j] = cost.flops, cost.nbytes, cost.family, cost.dtype
            note[j] = _with_estimates(ev, j, cost)
            if log is None:
                note[j] += "; no TORCH_TRACE log: no provenance (line, module) from inductor"
            stats["costed_from_trace"] += 1

    _wrapper_overhead(ev, gpu)

    # every event under a placed one (an extern kernel's own ATen children) shares its place
    if placed:
        # copies, changed here (build_events compacted its columns: read-only)
        location, module, module_class = (list(ev[c]) for c in ("source_location", "module", "module_class"))
        ev["source_location"], ev["module"], ev["module_class"] = location, module, module_class
        memo: dict[int, int] = {}

        def anchor(k: int) -> int:
            chain = []
            while k >= 0 and k not in placed and k not in memo:
                chain.append(k)
                k = parents[k]
            found = k if k in placed else (memo.get(k, -1) if k >= 0 else -1)
            for c in chain:
                memo[c] = found
            return found

        for j in range(n):
            a = j if j in placed else anchor(j)
            if a < 0:
                continue
            p = placed[a]
            if p.location:
                location[j] = p.location
            if p.module:
                base = module[j]
                full = f"{base}.{p.module}" if base else p.module
                module[j] = full
                module_class[j] = (module_classes or {}).get(full, "")
            elif p.of_module and not module_class[j]:
                # the compiled module itself ran it: the profiler recorded no module around a compiled
                # forward (dynamo skips its hooks); the model's own class when the run knows it
                module_class[j] = (module_classes or {}).get(module[j], "")
            stats["placed"] += 1 if j == a else 0
    return stats


def _graph_for(name: str, by_key: dict[str, CompiledGraph], log: TorchTraceLog, rows: list[int],
               names: Sequence[str]) -> CompiledGraph | None:
    """The graph a `## Call CompiledFxGraph <key> ##` range ran: by its FX-graph cache key, else (no key:
    the cache was off) the graph whose kernels line up best with the range's rows."""
    key = name.removeprefix("## Call CompiledFxGraph").removesuffix("##").strip()
    if key in by_key:
        return by_key[key]
    for k, g in by_key.items():  # a cut name
        if key and key != "None" and (k.startswith(key) or key.startswith(k)):
            return g
    best, score = None, 0
    for g in log.graphs:
        matched = _align(rows, names, list(g.kernels.values()))
        generated = [k for _, k in matched if k.kind in ("triton", "cpp")]
        if len(generated) > score:
            best, score = g, len(generated)
    return best


def _align(rows: list[int], names: Sequence[str], kernels: list[CompiledKernel]) -> list[tuple[int, CompiledKernel]]:
    """Pairs the graph call's row children (in time order) with its kernels (in call order), by name."""
    out = []
    pos = 0
    for kernel in kernels:
        want = _expected_row(kernel)
        if not want:
            continue
        for q in range(pos, len(rows)):
            got = names[rows[q]]
            if got == want or base_kernel_name(got) == want or (kernel.record_name and got == kernel.record_name):
                out.append((rows[q], kernel))
                pos = q + 1
                break
    return out


def _trace_cost(ev: Table, j: int, in_out: int | None) -> KernelCost | None:
    import json

    try:
        dims = json.loads(ev["input_dims"][j] or "[]")
        types = json.loads(ev["input_dtypes"][j] or "[]")
        conc = json.loads(ev["concrete_inputs"][j] or "[]")
    except (ValueError, TypeError):
        return None
    if not isinstance(dims, list) or not isinstance(types, list) or not isinstance(conc, list):
        return None
    try:
        return trace_kernel_cost(str(ev["name"][j]), dims, types, conc, in_out)
    except UnreadableCall:
        return None


def _with_estimates(ev: Table, j: int, cost: KernelCost) -> str:
    """The note, with inductor's own estimates where the trace records them (benchmark_kernel)."""
    if "kernel_num_gb" not in ev:
        return cost.note
    gb, flop = float(ev["kernel_num_gb"][j]), float(ev["kernel_flop"][j])
    parts = []
    if gb > 0:
        parts.append(f"inductor estimated {gb * 1e9:.4g} bytes ({(cost.nbytes / (gb * 1e9) - 1) * 100:+.1f}% here)")
    if flop > 0:
        parts.append(f"{flop:.4g} FLOPs ({(cost.flops / flop - 1) * 100:+.1f}% here)")
    elif gb > 0:
        parts.append("no FLOP estimate (inductor counts matmul-like nodes only)")
    return cost.note + ("; " + ", ".join(parts) if parts else "")
