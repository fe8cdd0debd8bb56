"""From raw trace tables to the per-event table every later stage reads.

Adds to each cpu_op event: its parent in the op call tree (ops nest by time on a thread), self time,
whether it is a row of ops.csv, the profiler step it ran in, the kernels it launched (GPU traces), its
source location, its module (qualified name and class of the innermost nn.Module running it) and
(profile) the TensorList element dtypes the dispatch pass saw.

Rows are registered operators (`ns::op`) and torch.compile's compiled code: the ranges around a
compiled region (`Torch-Compiled Region: 0/0`, autograd's `CompiledFunction[Backward]`, inductor's
`## Call CompiledFxGraph <key> ##`) and inductor's kernel launches that the profiler records
(`triton_poi_fused_add_0`, `graph_0_cpp_fused_relu_0`). A row's self time is the time inside it that no
row below it accounts for, so a compiled graph's C++ kernels, which have no events of their own, are
its graph's time.
"""

from __future__ import annotations

import re
from array import array
from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, cast

from opscope.sources import location_from_call_stack
from opscope.table import (
    INDEX,
    Coded,
    Packed,
    Table,
    Zeros,
    compacted,
    group_codes,
    indexable,
    nrows,
    sort_order,
)
from opscope.trace.kernel_names import kernel_family
from opscope.trace.reader import COMPILED_GRAPH_RE, TraceData

ROW_RE = re.compile(r"^[A-Za-z_]\w*::[A-Za-z_][\w.]*$")
NON_ROW_PREFIXES = ("autograd::", "profiler::", "ProfilerStep")
BACKWARD_WRAPPER = "autograd::engine::evaluate_function: "
_EPS = 1e-3  # µs; trace timestamps are float µs with about 1 ns resolution
Label = TypeVar("Label")  # a per-event label that _inherit fills in: a source line, a (module, class)
ModulePath = tuple[tuple[str, int], ...]  # (class, index among its siblings of that class) from the root

# torch.compile's ranges: dynamo's frame, AOTAutograd's autograd.Function (training) and inductor's
# graph call (with config.profiler_mark_wrapper_call / cpp_wrapper: its wrapper_call range).
COMPILED_REGION_RE = re.compile(
    r"^(Torch-Compiled Region: \S+|CompiledFunction|CompiledFunctionBackward|(graph_\d+_)?inductor_wrapper_call)$")
# Kernel launches inductor records: Triton kernels (also flagged by the kernel_backend arg) and, with
# config.cpp.enable_kernel_profile, its C++ kernels.
INDUCTOR_KERNEL_RE = re.compile(r"^(triton_[a-z]+_\w+|(graph_\d+_)?cpp_\w+)$")
# torch.optim.Optimizer.step's record_function range: `Optimizer.step#AdamW.step` (the class name).
OPTIMIZER_STEP_RE = re.compile(r"^Optimizer\.step#(?P<cls>[\w.]+)\.step$")


def is_row_name(name: str) -> bool:
    """Rows of ops.csv are registered operators (`ns::op`); wrappers such as autograd's
    evaluate_function, ProfilerStep#N and record_function labels are not."""
    return bool(ROW_RE.match(name)) and not name.startswith(NON_ROW_PREFIXES)


def compiled_kind(name: str) -> str:
    """'graph' (a compiled region or graph call), 'kernel' (an inductor kernel launch) or ''."""
    if COMPILED_GRAPH_RE.match(name) or COMPILED_REGION_RE.match(name):
        return "graph"
    if INDUCTOR_KERNEL_RE.match(name):
        return "kernel"
    return ""


def _values(column: Sequence[Any]) -> list[Any]:
    """A column as a list of Python objects (a numpy array from a caller still on pandas, too)."""
    tolist = getattr(column, "tolist", None)
    return tolist() if tolist is not None else list(column)


def thread_keys(pid: Sequence[Any], tid: Sequence[Any]) -> list[int]:
    """A code per (pid, tid) pair, numbered in order of first appearance (as pandas' factorize)."""
    return group_codes([_values(pid), _values(tid)])


def _start_order(keys: Sequence[Any], starts: Sequence[float], ends: Sequence[float]) -> Sequence[int]:
    """Interval indices by key, then start, then longest first (then index): a parent before its
    children, siblings in time order."""
    return sort_order(len(starts), ((keys, False), (starts, False), (ends, True)))


def nest(keys: Sequence[Any], starts: Sequence[float], ends: Sequence[float]) -> list[int]:
    """Parent (innermost enclosing interval on the same key) of each interval, -1 for roots."""
    keys, starts, ends = _values(keys), _values(starts), _values(ends)
    return _nest(keys, starts, ends, _start_order(keys, starts, ends)).tolist()


def _nest(keys: Sequence[Any], starts: Sequence[float], ends: Sequence[float], order: Sequence[int]) -> array[int]:
    parent = array(INDEX, [-1]) * len(starts)  # an int object an event, as a list, held far more
    # One sequential pass in start order with a stack of open intervals per thread.
    stack_end: list[float] = []
    stack_idx: list[int] = []
    push_end, push_idx, pop_end, pop_idx = stack_end.append, stack_idx.append, stack_end.pop, stack_idx.pop
    cur_key = None
    for i in order:
        k = keys[i]
        if k != cur_key:
            stack_end.clear()
            stack_idx.clear()
            cur_key = k
        limit = starts[i] + _EPS
        while stack_end and stack_end[-1] <= limit:
            pop_end()
            pop_idx()
        if stack_idx:
            parent[i] = stack_idx[-1]
        push_end(ends[i])
        push_idx(i)
    return parent


def innermost(c_keys: Sequence[Any], c_starts: Sequence[float], c_ends: Sequence[float],
              p_keys: Sequence[Any], p_times: Sequence[float]) -> array[int]:
    """For each point, the innermost container interval on the same key containing it (-1 if none), in a
    typed array (an int object a point, as a list)."""
    n_c, n_p = len(c_starts), len(p_times)
    result = array(INDEX, [-1]) * n_p
    if n_c == 0 or n_p == 0:
        return result
    # One pass through containers and points together by key, then time, containers before points on a
    # tie (longest container first, then index). Each side is sorted on its own and the two merged: one
    # sort of both would hold a concatenated copy of every key and time column.
    containers = _start_order(c_keys, c_starts, c_ends)
    points = sort_order(n_p, ((p_keys, False), (p_times, False)))
    c_starts, c_ends, p_times = indexable(c_starts), indexable(c_ends), indexable(p_times)
    stack_end: list[float] = []  # the containers open at the time reached, innermost last
    stack_idx: list[int] = []
    cur_key: list[Any] = [None]

    def reach(key: Any, t: float) -> None:
        """Moves to time `t` of `key`: closes the containers ended by then (all of them on a new key)."""
        if key != cur_key[0]:
            stack_end.clear()
            stack_idx.clear()
            cur_key[0] = key
        while stack_end and stack_end[-1] <= t:
            stack_end.pop()
            stack_idx.pop()

    ci = 0
    c = containers[0]
    ck, cs = c_keys[c], c_starts[c]
    for j in points:
        k, t = p_keys[j], p_times[j]
        # the containers that come before this point: a lower key, or the same key and a start <= t
        while ci < n_c and (ck < k or (ck == k and cs <= t)):
            reach(ck, cs)
            stack_end.append(c_ends[c])
            stack_idx.append(c)
            ci += 1
            if ci < n_c:
                c = containers[ci]
                ck, cs = c_keys[c], c_starts[c]
        reach(k, t)
        if stack_idx:
            result[j] = stack_idx[-1]
    return result


SourceOverride = Mapping[int, str] | Callable[[Table], Mapping[int, str]]


def build_events(trace: TraceData, source_override: SourceOverride | None = None) -> Table:
    """The per-event table. `source_override` maps event index -> exact source location (from
    `opscope profile`'s untimed line pass), or is a function computing that map from the event table
    (tree, steps and kernels already filled in); without it, locations come from the trace's Python
    stacks or "Call stack" args."""
    # The trace's own columns are the table's, not copies (a pointer per event and column): nothing
    # changes them in place (tests/analysis/test_trace_columns_shared.py holds every analysis to that)
    ev: Table = dict(trace.ops)
    n = nrows(ev)
    ts = ev["ts"]
    dur = ev["dur"]
    # Per-event numbers in typed arrays until compacted: a list's int and float objects, one an event, were
    # most of this function's peak (about 60 MiB of the 20x scaling trace's)
    end = array("d", (t + d for t, d in zip(ts, dur, strict=True)))
    keys = thread_keys(ev["pid"], ev["tid"])
    # Walk the tree in start-time order so a parent is always resolved before its children.
    order = _start_order(keys, ts, end)
    if isinstance(order, list):
        order = array(INDEX, order)  # 4 bytes an event, not a pointer and an int object
    par = _nest(keys, ts, end, order)
    # Each column is compacted (opscope.table.compact) once this function has no loop left over it: a list
    # per column held at once was most of the analysis' peak (200 MiB of a 2.6M-event trace's).
    ev["end"] = compacted(end)
    ev["thread"] = compacted(keys)
    ev["parent"] = cast(list[Any], par)  # compacted below, in its place among the columns
    del end, keys

    names = ev["name"]
    kinds = {x: "op" if is_row_name(x) else compiled_kind(x) for x in set(names)}
    kind = [kinds[x] for x in names]
    if "kernel_backend" in ev:  # a Triton kernel launch under any name (user-written kernels too)
        for i, backend in enumerate(ev["kernel_backend"]):
            if backend != "" and kind[i] != "op":
                kind[i] = "kernel"
    is_row = [k != "" for k in kind]

    inputs = [ev[c] for c in ("input_dims", "input_dtypes", "input_strides", "concrete_inputs")]
    row_anc = array(INDEX, [-1]) * n
    bwd_root = array(INDEX, [-1]) * n
    depth = array(INDEX, [0]) * n
    folded = [False] * n
    graph = [""] * n
    for i in order:
        p = par[i]
        if p >= 0:
            depth[i] = depth[p] + 1
            bwd_root[i] = bwd_root[p]
            row_anc[i] = row_anc[p]
            graph[i] = graph[p]
        if names[i].startswith(BACKWARD_WRAPPER):
            bwd_root[i] = i
        if kind[i] == "graph":
            graph[i] = names[i]
        if is_row[i]:
            a = row_anc[i]
            # An op whose row parent has the same name and inputs is that same call, one dispatch
            # level down (aten::upsample_nearest1d.vec calling aten::upsample_nearest1d): one call.
            if a >= 0 and names[a] == names[i] and kind[i] == "op" and all(x[a] == x[i] for x in inputs):
                is_row[i] = False
                folded[i] = True
            else:
                row_anc[i] = i
    ev["is_row"] = is_row  # compacted below, likewise
    ev["folded"] = compacted(folded)
    ev["row_kind"] = compacted([k if r else "" for k, r in zip(kind, is_row, strict=True)])
    ev["compiled_graph"] = compacted(graph)
    ev["depth"] = compacted(depth)
    del kind, folded, graph, depth
    # Row ancestor strictly above an event (used to find composite parents and copy sources).
    row_parent = array(INDEX, (row_anc[p] if p >= 0 else -1 for p in par))
    ev["row_anc"] = compacted(row_anc)
    ev["bwd_root"] = compacted(bwd_root)
    del row_anc, bwd_root
    self_us = _self_times(dur, par, row_parent, is_row)
    ev["parent"] = compacted(par)
    ev["row_parent"] = compacted(row_parent)
    ev["is_row"] = compacted(is_row)
    del par, row_parent, is_row

    step = assign_steps(trace, ts)
    if "captured" in ev:  # a graph capture's ops copied into a replay (opscope.analysis.capture_merge)
        copies = [i for i, c in enumerate(ev["captured"]) if c]
        replay_ts = ev["replay_ts"]
        for i, s in zip(copies, assign_steps(trace, [replay_ts[i] for i in copies]), strict=True):
            self_us[i] = 0.0  # they ran during capture, not in the replay
            step[i] = s
    ev["self_us"] = compacted(self_us)
    ev["step"] = compacted(step)
    del self_us, step
    _attribute_kernels(trace, ev)
    if callable(source_override):
        source_override = source_override(ev)
    ev["dispatch_input_types"] = compacted(_dispatch_input_types(source_override, n))
    ev["source_location"] = compacted(_sources(trace, ev, order, source_override))
    modules = _modules(trace, ev, order, source_override)
    ev["module"] = compacted([m for m, _ in modules])
    ev["module_class"] = compacted([c for _, c in modules])
    del modules
    ev["optimizer"] = compacted(_optimizer_steps(trace, ev))
    if nrows(trace.kernels):
        trace.kernels["launcher_loc"] = compacted(launcher_locations(trace, ev))
    return ev


def _self_times(dur: Sequence[float], parent: Sequence[int], row_parent: Sequence[int],
                is_row: Sequence[bool]) -> list[float]:
    """A row's self time is its time minus that of the rows directly below it: what runs inside it in no
    row of its own (a compiled graph's C++ kernels, a folded inner call) is its work. An event inside a
    row that is not a row itself has 0 (its time is that row's); other events keep their time minus
    their children's."""
    below = array("d", [0.0]) * len(dur)  # a float object a parent, as a list
    for i, d in enumerate(dur):  # in event order, as the sums were always made
        into = (row_parent[i] if is_row[i] else -1) if row_parent[i] >= 0 else parent[i]
        if into >= 0:
            below[into] += d
    out = []
    for d, b, r, rp in zip(dur, below, is_row, row_parent, strict=True):
        if not r and rp >= 0:
            out.append(0.0)
        elif b == 0.0 and type(d) is float:
            out.append(d)  # d - 0.0 is d itself: its float, not a new one per event
        else:
            x = d - b
            out.append(0.0 if x < 0.0 else x)
    return out


def _dispatch_input_types(source_override: Mapping[int, str] | None, n: int) -> list[str]:
    """Per event, "Input type" as `profile`'s untimed dispatch pass saw it (TensorList element dtypes
    filled in: capture.lines.LineJoin.input_types), or "" where it gave none (always for traces)."""
    out = [""] * n
    for i, text in getattr(source_override, "input_types", {}).items():
        if 0 <= i < n:
            out[i] = text
    return out


def assign_steps(trace: TraceData, ts: Sequence[float]) -> array[int]:
    """Index of the ProfilerStep range each time falls in (-1: none; 0 for all when there are none), in a
    typed array (an int object an event, as a list)."""
    steps = trace.steps
    if not nrows(steps):
        return array(INDEX, [0]) * len(ts)
    starts = steps["ts"]
    ends = [s + d for s, d in zip(starts, steps["dur"], strict=True)]
    out = array(INDEX)
    for t in ts.numbers if isinstance(ts, Packed) else _values(ts):
        i = bisect_right(starts, t) - 1
        out.append(i if i >= 0 and t < ends[i] else -1)
    return out


GRAPH_LAUNCH_RE = re.compile(r"GraphLaunch", re.IGNORECASE)  # cudaGraphLaunch, hipGraphLaunch, cuGraphLaunch


def _attribute_kernels(trace: TraceData, ev: Table) -> None:
    """Links each kernel/memcpy/memset to the op that launched it: the kernel's correlation id names a
    runtime launch event; the innermost op enclosing that launch on its thread is the launcher (falling
    back to the shared "External id"). Work is credited to the nearest ancestor that is a row.

    Kernels no op row launched one by one become kernel rows (`kernel_row`), named by their launcher:
    every kernel of a CUDA/HIP graph replay (one graph launch starts hundreds of kernels, none of them
    the enclosing op's own work), credited to the row op enclosing the launch, else the innermost
    annotation (record_function range) around it, else the enclosing non-row event, else the launch
    call itself; a kernel launched outside any op row, to the innermost annotation or non-row event
    around its launch; and in a GPU-only trace every kernel (no launcher). What is left is
    unattributed, except the backlog: kernels without a launch event whose correlation id precedes every
    launch the trace recorded were launched before the trace started (the GPU ran behind the CPU, e.g.
    the profiler's warmup steps' work), and get a row of their own. Adds to trace.kernels: op (row event
    index or -1), kernel_row, launcher_op / launcher_ann (event / annotation index naming the launcher,
    or -1), launcher (its name), graph_launch (index of the graph launch that ran it, or -1), backlog
    and family (opscope.trace.kernel_names)."""
    n = nrows(ev)
    kern = trace.kernels
    # their places among the columns, filled below (a column of one value: no byte an event)
    ev["device_us"] = cast(list[Any], Coded(Zeros(n), [0.0]))
    ev["kernels"] = cast(list[Any], Coded(Zeros(n), [""]))
    ev["n_kernels"] = cast(list[Any], Coded(Zeros(n), [0]))
    nk = nrows(kern)
    kern_op = [-1] * nk
    kernel_row = [False] * nk
    launcher_op = [-1] * nk
    launcher_ann = [-1] * nk
    graph_launch = [-1] * nk
    launcher = [""] * nk
    backlog = [False] * nk
    if nk == 0:
        trace.kernels = {**kern, "op": kern_op, "kernel_row": kernel_row, "launcher_op": launcher_op,
                         "launcher_ann": launcher_ann, "launcher": launcher, "graph_launch": graph_launch,
                         "backlog": backlog, "family": []}
        return
    launches = trace.launches
    names = ev["name"]
    row_anc = ev["row_anc"]
    ann = trace.annotations
    ann_names = ann["name"]
    corr_to_launch: dict[int, int] = {}
    enclosing_op: Sequence[int] = []
    enclosing_ann: Sequence[int] = []
    is_graph: list[bool] = []
    launch_names: list[str] = []
    if nrows(launches):
        l_pid, l_tid, l_ts = launches["pid"], launches["tid"], launches["ts"]
        enclosing_op = _enclosing(ev["pid"], ev["tid"], ev["ts"], ev["end"], l_pid, l_tid, l_ts)
        a_ts = ann["ts"]
        a_end = [t + d for t, d in zip(a_ts, ann["dur"], strict=True)]
        enclosing_ann = _enclosing(ann["pid"], ann["tid"], a_ts, a_end, l_pid, l_tid, l_ts)
        launch_names = launches["name"]
        is_graph = [bool(GRAPH_LAUNCH_RE.search(x)) for x in launch_names]
        # the kernels' launches only, and each kernel's op by its External id: a dict entry per launch and
        # per event held more memory than the event table (70 MiB of a 2.6M-event trace's)
        wanted = set(kern["correlation"])
        corr_to_launch = {c: j for j, c in enumerate(launches["correlation"]) if c in wanted}
    # correlation ids grow with each launch
    first_corr = min(launches["correlation"]) if nrows(launches) else -1
    wanted_ext = {x for x in kern["ext_id"] if x >= 0}
    ext_to_op: dict[int, int] = {}
    for i, x in enumerate(ev["ext_id"]):
        if x in wanted_ext and x not in ext_to_op:
            ext_to_op[x] = i
    gpu_only = n == 0
    # typed arrays, and each attributed kernel's (op, name) as two numbers: lists of float and int objects
    # and a dict of names per op held more memory than the event table
    dev_us = array("d", [0.0]) * n
    counts = array(INDEX, [0]) * n
    pair_op, pair_name = array(INDEX), array(INDEX)
    kernel_names: dict[str, int] = {}
    for j, (corr, ext, kname, kdur) in enumerate(zip(kern["correlation"], kern["ext_id"], kern["name"], kern["dur"],
                                                      strict=True)):
        li = corr_to_launch.get(corr, -1)
        op = enclosing_op[li] if li >= 0 else -1
        row = row_anc[op] if op >= 0 else -1
        if li >= 0 and is_graph[li]:
            graph_launch[j] = li
            kernel_row[j] = True
            if row >= 0:
                launcher_op[j], launcher[j] = row, names[row]
            elif enclosing_ann[li] >= 0:
                launcher_ann[j], launcher[j] = enclosing_ann[li], ann_names[enclosing_ann[li]]
            elif op >= 0:
                launcher_op[j], launcher[j] = op, names[op]
            else:
                launcher[j] = launch_names[li]
            continue
        if row < 0 and ext >= 0:
            op = ext_to_op.get(ext, -1)
            row = row_anc[op] if op >= 0 else -1
        if row >= 0:
            kern_op[j] = row
            dev_us[row] += kdur
            counts[row] += 1
            pair_op.append(row)
            pair_name.append(kernel_names.setdefault(kname, len(kernel_names)))
        elif li >= 0 and enclosing_ann[li] >= 0:
            kernel_row[j] = True
            launcher_ann[j], launcher[j] = enclosing_ann[li], ann_names[enclosing_ann[li]]
        elif op >= 0:
            kernel_row[j] = True
            launcher_op[j], launcher[j] = op, names[op]
        elif gpu_only:
            kernel_row[j] = True
        elif li < 0 and 0 <= corr < first_corr:
            backlog[j] = True
    if "replay_launch" in kern:  # captured kernels: attributed to their ops, still replayed by a graph launch
        graph_launch = [r if r >= 0 else g for r, g in zip(kern["replay_launch"], graph_launch, strict=True)]
    ev["device_us"] = compacted(dev_us)
    ev["n_kernels"] = compacted(counts)
    del dev_us, counts
    ev["kernels"] = compacted(_kernel_names(n, pair_op, pair_name, list(kernel_names)))
    family = [kernel_family(k, c) for k, c in zip(kern["name"], kern["cat"], strict=True)]
    trace.kernels = {**kern, **{name: compacted(values) for name, values in (
        ("op", kern_op), ("kernel_row", kernel_row), ("launcher_op", launcher_op), ("launcher_ann", launcher_ann),
        ("launcher", launcher), ("graph_launch", graph_launch), ("backlog", backlog), ("family", family))}}


def _kernel_names(n: int, pair_op: array[int], pair_name: array[int], names: list[str]) -> list[str]:
    """Per event, the names of the kernels credited to it, each once in the order first credited, joined by
    ";" ("" for none): `pair_op[k]`, `pair_name[k]` the k-th credit's event and name (a number into
    `names`). One string object per distinct text, not per event."""
    out = [""] * n
    texts: dict[str, str] = {}
    order = sort_order(len(pair_op), ((pair_op, False),))  # stable: an event's credits in the order they came
    k, m = 0, len(order)
    while k < m:
        op = pair_op[order[k]]
        end = k + 1
        while end < m and pair_op[order[end]] == op:
            end += 1
        text = ";".join(names[x] for x in dict.fromkeys(pair_name[order[y]] for y in range(k, end)))
        out[op] = texts.setdefault(text, text)
        k = end
    return out


def _enclosing(c_pid: Sequence[Any], c_tid: Sequence[Any], c_start: Sequence[float], c_end: Sequence[float],
               p_pid: Sequence[Any], p_tid: Sequence[Any], p_time: Sequence[float]) -> array[int]:
    """For each point (pid, tid, time), the innermost container interval on the same thread holding it
    (-1 if none)."""
    if not len(c_start) or not len(p_time):
        return array(INDEX, [-1]) * len(p_time)
    c_threads, p_threads = _thread_codes((c_pid, c_tid), (p_pid, p_tid))
    return innermost(c_threads, c_start, c_end, p_threads, p_time)


def _thread_codes(first: tuple[Sequence[Any], Sequence[Any]],
                  then: tuple[Sequence[Any], Sequence[Any]]) -> tuple[array[int], array[int]]:
    """thread_keys of two tables' (pid, tid) columns, the first table's rows then the second's, as two typed
    arrays (the columns' concatenations held a pointer a row and column, and the codes' list one more)."""
    codes: dict[tuple[Any, Any], int] = {}
    code = codes.setdefault
    first_codes = array(INDEX, (code(k, len(codes)) for k in zip(*first, strict=True)))
    return first_codes, array(INDEX, (code(k, len(codes)) for k in zip(*then, strict=True)))


def _optimizer_steps(trace: TraceData, ev: Table) -> list[str]:
    """Per event, the optimizer class whose step() ran it (its `Optimizer.step#Class.step` range on the
    same thread), else ""."""
    ann = trace.annotations
    steps = [(j, m.group("cls")) for j, m in enumerate(map(OPTIMIZER_STEP_RE.match, ann["name"])) if m]
    if not steps:
        return [""] * nrows(ev)
    rows = [j for j, _ in steps]
    inside = _enclosing([ann["pid"][j] for j in rows], [ann["tid"][j] for j in rows],
                        [ann["ts"][j] for j in rows], [ann["ts"][j] + ann["dur"][j] for j in rows],
                        ev["pid"], ev["tid"], ev["ts"])
    return [steps[k][1] if k >= 0 else "" for k in inside]


def _intervals_end(table: Table) -> list[float]:
    return [t + d for t, d in zip(table["ts"], table["dur"], strict=True)]


def launcher_locations(trace: TraceData, ev: Table) -> list[str]:
    """Source location of each kernel row's launcher: the launching event's, or for an annotation the
    innermost user frame around its start (from the trace's Python events; "" without them)."""
    kern = trace.kernels
    nk = nrows(kern)
    if not nk or "launcher_op" not in kern:
        return [""] * nk
    ops_loc = ev["source_location"]
    ann = trace.annotations
    ann_loc: list[str] = [""] * nrows(ann)
    py = trace.python
    if nrows(ann) and nrows(py):
        frames = _enclosing(py["pid"], py["tid"], py["ts"], _intervals_end(py), ann["pid"], ann["tid"], ann["ts"])
        where = py["name"]
        ann_loc = [where[f] if f >= 0 else "" for f in frames]
    return [ops_loc[o] if o >= 0 else ann_loc[a] if a >= 0 else ""
            for o, a in zip(kern["launcher_op"], kern["launcher_ann"], strict=True)]


def _sources(trace: TraceData, ev: Table, order: Sequence[int], source_override: SourceOverride | None) -> list[str]:
    n = nrows(ev)
    loc = [""] * n
    if callable(source_override):
        source_override = source_override(ev)
    if source_override:
        for i, where in source_override.items():
            if 0 <= i < n:
                loc[i] = where
    elif nrows(trace.python):
        loc = _python_locations(trace, ev)
    else:
        loc = [location_from_call_stack(s) if s else "" for s in ev["call_stack"]]

    return _inherit(loc, ev, order, bool)


def _inherit(values: list[Label], ev: Table, order: Sequence[int], known: Callable[[Label], bool]) -> list[Label]:
    """Fills in per-event labels (source lines, modules) the capture did not give: an op without one
    takes its parent's (it ran inside it); a composite parent without one its first labelled child's
    (the same statement issued both), and what is still missing then its parent's again. Backward ops
    take the label of the forward op they differentiate (autograd sequence number)."""
    par = indexable(ev["parent"])
    for i in order:
        if not known(values[i]) and par[i] >= 0:
            values[i] = values[par[i]]
    first_child: dict[int, int] = {}
    for i in reversed(order):
        if not known(values[i]) and i in first_child:
            values[i] = values[first_child[i]]
        p = par[i]
        if p >= 0 and known(values[i]):
            first_child[p] = i  # reversed order: the last one written is the first child
    for i in order:
        if not known(values[i]) and par[i] >= 0:
            values[i] = values[par[i]]

    seqs = ev["seq"]
    bwd_root = ev["bwd_root"]
    fwd: dict[int, Label] = {}
    for i in order:
        if bwd_root[i] < 0 and seqs[i] >= 0 and seqs[i] not in fwd and known(values[i]):
            fwd[seqs[i]] = values[i]
    for i in order:
        r = bwd_root[i]
        if r >= 0 and seqs[r] >= 0:
            value = fwd.get(seqs[r])
            if value is not None:
                values[i] = value
    return values


NO_MODULE = ("", "")


def _modules(trace: TraceData, ev: Table, order: Sequence[int],
             source_override: SourceOverride | None) -> list[tuple[str, str]]:
    """(qualified module name, class) per event: from `profile`'s dispatch pass (LineJoin.modules) when
    given, else from the trace's `nn.Module: ...` events (with_modules); NO_MODULE outside the model."""
    n = nrows(ev)
    captured = getattr(source_override, "modules", None)
    if captured is not None:
        values = [NO_MODULE] * n
        for i, m in captured.items():
            if 0 <= i < n:
                values[i] = m
    elif nrows(trace.modules):
        values = _trace_modules(trace, ev)
    else:
        return [NO_MODULE] * n
    return _inherit(values, ev, order, lambda m: bool(m[1]))


_INSTANCE_RE = re.compile(r"^(?P<cls>.+)_(?P<n>\d+)$")


def _module_class(name: str) -> str:
    """`<Class>_<N>` -> `<Class>`."""
    m = _INSTANCE_RE.match(name)
    return m.group("cls") if m else name


def _trace_modules(trace: TraceData, ev: Table) -> list[tuple[str, str]]:
    """Module paths from with_modules traces. torch.profiler names each module call `<Class>_<N>`, N
    counting instances of that class across the model; the path names each module `<Class>_<k>`, k its
    instance's index among the modules of its class called directly inside its parent (in order of
    first call), or plain `<Class>` when its parent calls only one of that class. Repeated blocks thus
    have the same relative paths (`BertModel.BertEncoder.BertLayer_2.BertAttention.BertSdpaSelfAttention
    .Linear_1` is every layer's second Linear). When one module encloses all the others (the model), it
    is the root: its path is "" and the others' paths start below it."""
    mods = trace.modules
    n_mods = nrows(mods)
    m_ts = mods["ts"]
    m_end = _intervals_end(mods)
    m_keys, o_keys = _thread_codes((mods["pid"], mods["tid"]), (ev["pid"], ev["tid"]))
    parents_first = _start_order(m_keys, m_ts, m_end)
    parent = _nest(m_keys, m_ts, m_end, parents_first)
    names = mods["name"]
    # one string object per distinct class and path, not one per module call (the events share them)
    same: dict[str, str] = {}
    classes = [same.setdefault(c, c) for c in map(_module_class, names)]
    # (parent's path, class) -> {trace name: local index}; paths are tuples of (class, local index)
    index: dict[tuple[ModulePath, str], dict[str, int]] = {}
    raw: list[ModulePath] = [()] * n_mods
    one_path: dict[ModulePath, ModulePath] = {}  # a tuple per distinct path, not per module call
    for j in parents_first:
        up = raw[parent[j]] if parent[j] >= 0 else ()
        instances = index.setdefault((up, classes[j]), {})
        path = (*up, (classes[j], instances.setdefault(names[j], len(instances))))
        raw[j] = one_path.setdefault(path, path)
    shown: dict[ModulePath, str] = {}
    for path in set(raw):
        shown[path] = ".".join(c if len(index[(path[:d], c)]) == 1 else f"{c}_{k}"
                               for d, (c, k) in enumerate(path))
    paths = [shown[p] for p in raw]
    roots = {paths[j] for j in range(n_mods) if parent[j] < 0}
    if len(roots) == 1:
        (root,) = roots
        cut = len(root) + 1
        paths = [same.setdefault(q, q) for q in (p[cut:] if p != root else "" for p in paths)]
    trace.module_classes = dict(zip(paths, classes, strict=True))
    enclosing = innermost(m_keys, m_ts, m_end, o_keys, ev["ts"])
    # one (path, class) tuple per distinct pair, shared by the events (a tuple an event, as made here before)
    pairs: dict[tuple[str, str], tuple[str, str]] = {NO_MODULE: NO_MODULE}
    pair = pairs.setdefault
    of_module = [pair((p, c), (p, c)) for p, c in zip(paths, classes, strict=True)]
    return [of_module[j] if j >= 0 else NO_MODULE for j in enclosing]


def _python_locations(trace: TraceData, ev: Table) -> list[str]:
    """Innermost user frame around each op, from python_function events (function-level lines). The
    reader keeps only user (and harness) frames, each already as 'file:line'."""
    py = trace.python
    enclosing = _enclosing(py["pid"], py["tid"], py["ts"], _intervals_end(py), ev["pid"], ev["tid"], ev["ts"])
    locations = py["name"]
    return [locations[j] if j >= 0 else "" for j in enclosing]
