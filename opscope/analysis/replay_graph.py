"""The step's dependency graph, built from a trace and its event table (opscope.analysis.events).

Lanes: each CPU thread is a sequence of pieces (its time cut at every op and runtime-call boundary,
each piece owned by the innermost event holding it; the time between top-level events is a host gap:
Python, which stays unless a fix removes it); each GPU stream (device, stream) is its kernels (and
memcpy/memset) in time order. Edges:

- a piece follows the previous piece on its thread;
- a kernel starts after the previous kernel on its stream and after its launch (correlation id; every
  kernel of a CUDA/HIP graph replay after the graph launch);
- a host wait (cudaDeviceSynchronize, cudaStreamSynchronize, cudaEventSynchronize, a blocking
  memcpy, `.item()`'s copy) ends no earlier than the last kernel launched before it on each stream.

Each edge carries the lag it had in the trace after its binding constraint, so that replaying the graph
with the recorded durations gives back the recorded times (opscope.analysis.replay). A kernel's lag
behind the constraint that did not bind is capped at the trace's typical value (the median launch
latency, the median back-to-back gap), so that a change which moves the binding constraint gets the
delay the trace shows for it. Collectives are ordered per stream only; a stream waiting on another's
event (cudaStreamWaitEvent) is not an edge.
"""

from __future__ import annotations

import math
import re
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from statistics import median
from typing import Any

from opscope.table import INDEX, Table, grouped, indexable, nrows, sort_order
from opscope.trace.reader import TraceData

# Runtime calls after which the host waits for the device.
SYNC_RE = re.compile(r"(Device|Stream|Event|Ctx)Synchronize(_v2)?$|^(cuda|hip|cu)Memcpy(WithStream|2D|3D|DtoH|HtoD)?(_v2)?$")
# A synchronizing call's own cost when it waited: the rest of it was the wait.
SYNC_CALL_US = 5.0
DEFAULT_GAP_US = 1.0  # back-to-back kernels' gap on a stream when the trace shows none
DEFAULT_LAUNCH_US = 5.0  # launch-to-start latency when the trace shows none

# What build_graph reads of the event table and the trace's launches and kernels (besides the trace's
# steps): a run that does not keep its tables frees the rest before the graph is built
# (opscope.analysis.pipeline.release_tables; a test builds graphs from these columns alone).
READS: dict[str, tuple[str, ...]] = {
    "events": ("ts", "end", "pid", "tid", "captured", "row_anc", "name"),
    "launches": ("correlation", "name", "pid", "tid", "ts", "dur"),
    "kernels": ("correlation", "ts", "dur", "device", "stream", "name", "captured"),
}

GAP = -1  # owner of a host gap piece
CPU, KERNEL, WAIT_START, WAIT_END = 0, 1, 2, 3  # node kinds


@dataclass
class StepGraph:
    """Nodes in a topological order's numbering-free arrays. A node starts at the latest of its
    predecessors' start (`from_start`) or finish plus the edge's lag (its recorded start when it has
    none), and finishes its duration later."""

    # Columns of numbers are typed arrays: 1-8 bytes a value instead of a list's pointer and boxed
    # number (the graph of a trace has several nodes per event; lists tripled analyze's peak memory).
    kind: array[int] = field(default_factory=lambda: array("b"))
    # a node's lane ("cpu:<tid>" | "gpu:<device>:<stream>") and name, as numbers into `lanes` and `names`
    # (lane_of(), name_of()): 1 byte a node, 2 or 4 once there are more than 256 or 65,536 (_widened; a trace
    # has a few lanes and a few thousand names)
    lane: array[int] = field(default_factory=lambda: array("B"))
    name: array[int] = field(default_factory=lambda: array("B"))
    lanes: list[str] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    _lane_ids: dict[str, int] = field(default_factory=dict)  # while building
    _name_ids: dict[str, int] = field(default_factory=dict)
    start: array[float] = field(default_factory=lambda: array("d"))  # recorded
    dur: array[float] = field(default_factory=lambda: array("d"))  # recorded
    # while built: each node's row event, whose self time a CPU piece is (-1: none); emptied once grouped into
    # by_owner (4 bytes a node), the waits' kept in wait_owner
    owner: array[int] = field(default_factory=lambda: array(INDEX))
    launching: array[int] = field(default_factory=lambda: array("b"))  # host work that CUDA graphs would replay
    # predecessor edges, CSR by node: pred[ptr[i]:ptr[i+1]]
    ptr: array[int] = field(default_factory=lambda: array(INDEX, [0]))
    pred: array[int] = field(default_factory=lambda: array(INDEX))
    lag: array[float] = field(default_factory=lambda: array("d"))
    from_start: array[int] = field(default_factory=lambda: array("b"))
    # 1 where a node's first predecessor is the node before it, at its finish, with no lag (a thread's
    # piece after the piece before): such an edge is not in pred/lag/from_start (13 bytes a node, most
    # nodes); 0 once dropped (a cycle)
    chained: bytearray = field(default_factory=bytearray)
    # The replay's units, in a topological order: a node, or a run of consecutive nodes [head, end) each of
    # which after the head has one predecessor, the node before it, binding at its finish (a thread's
    # pieces): a run is replayed as one running sum (_runs).
    heads: array[int] = field(default_factory=lambda: array(INDEX))
    ends: array[int] = field(default_factory=lambda: array(INDEX))
    # per thread (lane name): its pieces' node ids in time order (so in order of their recorded starts): a
    # thread's nodes are added one after another, so a range (an array of them took 4 bytes a CPU node)
    thread_nodes: dict[str, range] = field(default_factory=dict)
    # trace.kernels row -> its KERNEL node (-1: none, a graph capture's copy), and the rows that have one in
    # node order (a dict of them took more memory than the graph's names)
    kernel_node: array[int] = field(default_factory=lambda: array(INDEX))
    kernel_rows: array[int] = field(default_factory=lambda: array(INDEX))
    waits: list[int] = field(default_factory=list)  # WAIT_END nodes
    wait_owner: dict[int, int] = field(default_factory=dict)  # a WAIT_END node -> the row event around the call
    # row event -> its nodes (its CPU pieces, the runtime calls in them), CSR by event (nodes_of()): the
    # owned nodes grouped by owner, and where each event's nodes start (a list per event held more memory than
    # the graph's own columns)
    by_owner: array[int] = field(default_factory=lambda: array(INDEX))
    owner_start: array[int] = field(default_factory=lambda: array(INDEX, [0]))
    # the profiled steps: (lane, recorded start, recorded end); empty: the whole trace is one step
    steps: list[tuple[str, float, float]] = field(default_factory=list)
    # per step: the kernels launched in it, and how far past the step's end the last of them ran in the
    # trace (0 when it ended inside the step): a step ends no earlier than its GPU work, less that tail
    step_kernels: list[list[int]] = field(default_factory=list)
    step_tail: list[float] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.kind)

    def nodes_of(self, event: int) -> array[int]:
        """The nodes whose time is row event `event`'s self time (its pieces, and runtime calls and
        waits inside them), in node order."""
        if not 0 <= event < len(self.owner_start) - 1:
            return array(INDEX)
        return self.by_owner[self.owner_start[event]:self.owner_start[event + 1]]

    def node_of_kernel(self, row: int) -> int:
        """trace.kernels row `row`'s KERNEL node (-1: none)."""
        return self.kernel_node[row] if 0 <= row < len(self.kernel_node) else -1

    def set_kernel_node(self, row: int, node: int) -> None:
        if row >= len(self.kernel_node):
            self.kernel_node.extend(array(INDEX, [-1]) * (row + 1 - len(self.kernel_node)))
        self.kernel_node[row] = node
        self.kernel_rows.append(row)

    def kernel_nodes(self) -> Iterator[tuple[int, int]]:
        """(trace.kernels row, its KERNEL node) in node order."""
        node_of = self.kernel_node
        return ((row, node_of[row]) for row in self.kernel_rows)

    def lane_of(self, node: int) -> str:
        return self.lanes[self.lane[node]]

    def name_of(self, node: int) -> str:
        return self.names[self.name[node]]

    def add(self, kind: int, lane: str, name: str, start: float, dur: float, *, owner: int = -1) -> int:
        lane_id = self._lane_ids.get(lane)
        if lane_id is None:
            lane_id = self._lane_ids[lane] = len(self.lanes)
            self.lanes.append(lane)
            self.lane = _widened(self.lane, lane_id)
        name_id = self._name_ids.get(name)
        if name_id is None:
            name_id = self._name_ids[name] = len(self.names)
            self.names.append(name)
            self.name = _widened(self.name, name_id)
        self.kind.append(kind)
        self.lane.append(lane_id)
        self.name.append(name_id)
        self.start.append(start)
        self.dur.append(dur)
        self.owner.append(owner)
        self.launching.append(False)
        return len(self.kind) - 1


class _Edges:
    """Predecessor edges as they are found, CSR by node (typed arrays: a list and a tuple per edge cost
    more memory than the whole graph): each node's edges come right after it is added, except a host
    wait's, found at the end (_waits) and merged in by into()."""

    def __init__(self) -> None:
        self.ptr = array(INDEX, [0])
        self.pred = array(INDEX)
        self.lag = array("d")
        self.from_start = array("b")
        self.chained = bytearray()
        self.later: dict[int, list[tuple[int, float, bool]]] = {}

    def node(self, edges: Iterable[tuple[int, float, bool]]) -> None:
        """The edges of the node just added."""
        for p, lag, from_start in edges:
            self.pred.append(p)
            self.lag.append(lag)
            self.from_start.append(from_start)
        self.ptr.append(len(self.pred))
        self.chained.append(0)

    def chain(self) -> None:
        """The node just added follows the node before it, at its finish, with no lag (StepGraph.chained)."""
        self.ptr.append(len(self.pred))
        self.chained.append(1)

    def node_waiting(self, node: int) -> None:
        """The node just added (`node`) gets its edges later, in later[node]."""
        self.node(())
        self.later[node] = []

    def into(self, g: StepGraph) -> None:
        """Moves the edges into `g`, each waiting node's after its own. Array by array, each copied in slices
        (its old one freed before the next is copied: one array's copy at a time, not the four's)."""
        g.chained = self.chained
        later = [(i, es) for i, es in sorted(self.later.items()) if es]
        if not later:
            g.ptr, g.pred, g.lag, g.from_start = self.ptr, self.pred, self.lag, self.from_start
            return
        ptr = self.ptr
        for field_at, name in enumerate(("pred", "lag", "from_start")):
            old: array[Any] = getattr(self, name)
            raw = memoryview(old).cast("B")  # slices of it copy nothing
            size = old.itemsize
            new: array[Any] = array(old.typecode)
            at = 0
            for i, es in later:
                end = ptr[i + 1]
                new.frombytes(raw[at * size:end * size])
                new.extend(e[field_at] for e in es)
                at = end
            new.frombytes(raw[at * size:])
            raw.release()
            setattr(self, name, None)
            del old
            setattr(g, name, new)
        shifted = array(INDEX)
        shift = at = 0
        for i, es in later:  # a node's edges start later by the waiting nodes' edges before it
            shifted.extend(x + shift for x in ptr[at:i + 1])
            shift += len(es)
            at = i + 1
        shifted.extend(x + shift for x in ptr[at:])
        g.ptr = shifted
        self.ptr = array(INDEX)


def cpu_lane(tid: object) -> str:
    return f"cpu:{tid}"


def gpu_lane(device: object, stream: object) -> str:
    return f"gpu:{device}:{stream}"


def build_graph(trace: TraceData, ev: Table) -> StepGraph:
    """The dependency graph of the whole trace (every profiled step and what ran around them). `ev` is
    build_events(trace)'s table; trace.kernels then carries its attribution columns."""
    g = StepGraph()
    edges = _Edges()
    launch_piece, sync_end = _cpu_lanes(trace, ev, g, edges)
    _gpu_lanes(trace, g, edges, launch_piece)
    _waits(trace, g, edges, sync_end)
    edges.into(g)
    g.heads, g.ends = _runs(g, _topological(g))
    g._lane_ids, g._name_ids = {}, {}
    g.owner_start, g.by_owner = grouped(g.owner, max(g.owner, default=-1) + 1)
    g.owner = array(INDEX)
    if nrows(trace.steps):
        for tid, ts, dur in zip(trace.steps["tid"], trace.steps["ts"], trace.steps["dur"], strict=True):
            g.steps.append((cpu_lane(tid), float(ts), float(ts) + float(dur)))
        _step_kernels(g)
    return g


def _widened(numbers: array[int], new: int) -> array[int]:
    """`numbers`, in a wider type when `new` does not fit theirs (1 byte, then 2, then INDEX's 4)."""
    for typecode in ("B", "H"):
        if numbers.typecode == typecode and new >= 1 << (8 * numbers.itemsize):
            return _widened(array("H" if typecode == "B" else INDEX, numbers), new)
    return numbers


def _cpu_lanes(trace: TraceData, ev: Table, g: StepGraph,
               edges: _Edges) -> tuple[array[int], dict[int, tuple[int, float, float]]]:
    """Cuts each thread's time into pieces. Returns each launch row's first piece's node (-1: none) and
    {sync launch row: (its wait-end node, piece start, piece end)}."""
    n_ev = nrows(ev)
    captured = ev.get("captured")  # copies of a graph capture's ops, which did not run here
    la = trace.launches
    launched = set(trace.kernels["correlation"]) if nrows(trace.kernels) else set()
    # intervals per thread: its events (their rows; their times are the event table's) and its launches'
    # (start, end, -(j + 2)) as columns; a tuple per interval, and another as its sort key, held more memory
    # than the graph
    per_thread: dict[tuple[object, object], tuple[_Rows, _Items]] = {}
    ev_ts, ev_end, ev_pid, ev_tid = indexable(ev["ts"]), indexable(ev["end"]), ev["pid"], ev["tid"]

    def thread(key: tuple[object, object]) -> tuple[_Rows, _Items]:
        mine = per_thread.get(key)  # not setdefault: its default would be made for every interval
        if mine is None:
            mine = per_thread[key] = (_Rows(ev_ts, ev_end), _Items())
        return mine

    for i in range(n_ev):
        if captured is None or not captured[i]:
            thread((ev_pid[i], ev_tid[i]))[0].id.append(i)
    for j in range(nrows(la)):
        ts = float(la["ts"][j])
        thread((la["pid"][j], la["tid"][j]))[1].add(ts, ts + float(la["dur"][j]), -(j + 2))
    cutter = _Cutter(g, edges, ev, la, launched)
    for (_pid, tid), (events, launches) in sorted(per_thread.items(), key=lambda kv: str(kv[0])):
        cutter.thread(cpu_lane(tid), _in_time_order(events, launches))
    return cutter.launch_piece, cutter.sync_end


class _Items:
    """Intervals of one thread as columns: start, end, id."""

    def __init__(self) -> None:
        # typed arrays: a list held a pointer and a float object per interval (56 of its 68 bytes)
        self.start = array("d")
        self.end = array("d")
        self.id = array(INDEX)

    def add(self, start: float, end: float, ident: int) -> None:
        self.start.append(start)
        self.end.append(end)
        self.id.append(ident)

    def order(self) -> Sequence[int]:
        """By start, the longer first, then as added (range(n) when added in that order, as a profiler
        writes its events)."""
        return sort_order(len(self.id), ((self.start, False), (self.end, True)))


class _Rows:
    """Events of one thread: their rows in the event table, whose start and end they read (a copy of
    both took 16 bytes an event while the graph was built)."""

    def __init__(self, start: Sequence[float], end: Sequence[float]) -> None:
        self.start_of, self.end_of = start, end
        self.id = array(INDEX)

    def order(self) -> Sequence[int]:
        """As _Items.order(): by start, the longer first, then as added (their starts and ends copied only
        while sorted)."""
        ids = self.id
        return sort_order(len(ids), ((array("d", map(self.start_of.__getitem__, ids)), False),
                                     (array("d", map(self.end_of.__getitem__, ids)), True)))


def _in_time_order(events: _Rows, launches: _Items) -> Iterator[tuple[float, float, int]]:
    """A thread's (start, end, id) by start, the longer first (parents before children), an event before a
    launch with the same start and end, else as added."""
    ev_order, la_order = events.order(), launches.order()
    es, ee, ei, ls, le, li = events.start_of, events.end_of, events.id, launches.start, launches.end, launches.id
    a, b, na, nb = 0, 0, len(ev_order), len(la_order)
    while a < na or b < nb:
        if a < na:
            x = ei[ev_order[a]]  # the event's row
            if b >= nb:
                a += 1
                yield es[x], ee[x], x
                continue
            y = la_order[b]
            if es[x] < ls[y] or es[x] == ls[y] and ee[x] >= le[y]:
                a += 1
                yield es[x], ee[x], x
                continue
        y = la_order[b]
        b += 1
        yield ls[y], le[y], li[y]


class _Cutter:
    """Cuts one thread at a time into pieces, each owned by the innermost event holding it."""

    def __init__(self, g: StepGraph, edges: _Edges, ev: Table, la: Table,
                 launched: set[int]) -> None:
        self.g, self.edges, self.la, self.launched = g, edges, la, launched
        self.row_anc, self.names = indexable(ev["row_anc"]), ev["name"]
        self.is_sync = [bool(SYNC_RE.search(x)) for x in la["name"]]
        self.launch_piece = array(INDEX, [-1]) * nrows(la)  # launch row -> its first piece's node
        self.sync_end: dict[int, tuple[int, float, float]] = {}

    def thread(self, lane: str, items: Iterator[tuple[float, float, int]]) -> None:
        """`items`: the thread's (start, end, id) in time order, parents first (_in_time_order)."""
        self.lane = lane
        first_node = self.g.n  # its nodes are those added from here on (thread_nodes)
        self.node_top = array(INDEX)  # per node of the thread: its top-level item (-1: none)
        self.stack: list[tuple[float, int, int]] = []  # (end, id, top-level item index)
        top_launches: list[bool] = []
        self.prev = -1
        stack = self.stack
        started = False
        for s, e, ident in items:
            if not started:
                self.cur = s
                started = True
            while stack and stack[-1][0] <= s:
                self._emit(stack[-1][0], stack[-1][1], stack[-1][2])
                stack.pop()
            if s > self.cur:
                self._emit(s, stack[-1][1] if stack else GAP, stack[-1][2] if stack else -1)
            self.cur = max(self.cur, s)
            if stack:
                e = min(e, stack[-1][0])
                top = stack[-1][2]
            else:
                top = len(top_launches)
                top_launches.append(False)
            if ident < -1 and int(self.la["correlation"][-ident - 2]) in self.launched:
                top_launches[top] = True
            stack.append((e, ident, top))
        while stack:
            self._emit(stack[-1][0], stack[-1][1], stack[-1][2])
            stack.pop()
        # CUDA graphs would replay the host work from the first top-level item that launches GPU work to
        # the last, everything between included (Python, view ops): a wait breaks the graph, so it stays
        # and the stretches between waits are taken one by one.
        g, node_top = self.g, self.node_top
        nodes = range(first_node, g.n)
        assert len(nodes) == len(node_top)  # every node added here is the thread's
        first = last = -1
        for k in range(len(nodes) + 1):
            node = nodes[k] if k < len(nodes) else -1
            if node < 0 or g.kind[node] != CPU:
                for x in nodes[first:last + 1] if first >= 0 else ():
                    g.launching[x] = g.kind[x] == CPU
                first = last = -1
                continue
            if node_top[k] >= 0 and top_launches[node_top[k]]:
                first = k if first < 0 else first
                last = k
        g.thread_nodes[lane] = nodes

    def _append(self, node: int, top: int) -> None:
        if self.prev >= 0 and self.prev == node - 1:
            self.edges.chain()
        else:
            self.edges.node(((self.prev, 0.0, False),) if self.prev >= 0 else ())
        self.node_top.append(top)
        self.prev = node

    def _emit(self, end: float, owner_id: int, top: int) -> None:
        g, cur, lane, row_anc = self.g, self.cur, self.lane, self.row_anc
        dur = end - cur
        j = -owner_id - 2
        if dur <= 0 and not (owner_id < -1 and self.is_sync[j]):
            return
        if owner_id == GAP:
            self._append(g.add(CPU, lane, "host gap", cur, dur), -1)
        elif owner_id >= 0:
            key = row_anc[owner_id] if row_anc[owner_id] >= 0 else owner_id
            self._append(g.add(CPU, lane, self.names[key], cur, dur, owner=key), top)
        else:
            encl = self.stack[-2][1] if len(self.stack) >= 2 else GAP
            key = (row_anc[encl] if row_anc[encl] >= 0 else encl) if encl >= 0 else -1
            lname = self.la["name"][j]
            if self.is_sync[j] and j not in self.sync_end:
                s = g.add(WAIT_START, lane, lname, cur, 0.0, owner=key)
                self._append(s, top)
                if self.launch_piece[j] < 0:
                    self.launch_piece[j] = s
                node = g.add(WAIT_END, lane, lname + " (wait)", end, 0.0, owner=key)
                self.sync_end[j] = (node, cur, end)
                g.waits.append(node)
                g.wait_owner[node] = key
                self.node_top.append(top)
                self.edges.node_waiting(node)  # its edges: _waits
                self.prev = node
            else:
                node = g.add(CPU, lane, lname, cur, dur, owner=key)
                if self.launch_piece[j] < 0:
                    self.launch_piece[j] = node
                self._append(node, top)
        self.cur = end


def _gpu_lanes(trace: TraceData, g: StepGraph, edges: _Edges,
               launch_piece: array[int]) -> None:
    k = trace.kernels
    nk = nrows(k)
    if not nk:
        return
    g.kernel_node = array(INDEX, [-1]) * nk
    launch_of = _by_correlation(trace.launches)
    captured = k.get("captured") or [False] * nk
    streams: dict[tuple[object, object], list[int]] = {}
    for i in range(nk):
        if not captured[i]:
            streams.setdefault((k["device"][i], k["stream"][i]), []).append(i)
    # typed arrays: lists of float objects, and a tuple per kernel, held more than the graph's own kernels
    ts = array("d", (float(x) for x in k["ts"]))
    end = array("d", (t + float(d) for t, d in zip(ts, k["dur"], strict=True)))
    # first pass: which constraint bound each kernel, for the typical lags: the kernel, the kernel before it
    # on its stream, its launch's node, and their times (A: that kernel's end, B: the launch's start)
    plan_kernel, plan_prev, plan_node, plan_a, plan_b = array(INDEX), array(INDEX), array(INDEX), array("d"), array("d")
    stream_lags: list[float] = []
    launch_lags: list[float] = []
    for members in streams.values():
        members.sort(key=lambda i: (ts[i], end[i]))
        prev = -1
        for i in members:
            j = launch_of(int(k["correlation"][i]))
            node = launch_piece[j] if j >= 0 else -1
            a = end[prev] if prev >= 0 else -math.inf
            b = g.start[node] if node >= 0 else -math.inf
            if prev >= 0 and a >= b:
                stream_lags.append(ts[i] - a)
            elif node >= 0:
                launch_lags.append(ts[i] - b)
            plan_kernel.append(i)
            plan_prev.append(prev)
            plan_node.append(node)
            plan_a.append(a)
            plan_b.append(b)
            prev = i
    gap_us = max(median(stream_lags), 0.0) if stream_lags else DEFAULT_GAP_US
    launch_us = max(median(launch_lags), 0.0) if launch_lags else DEFAULT_LAUNCH_US
    for i, prev, node, a, b in zip(plan_kernel, plan_prev, plan_node, plan_a, plan_b, strict=True):
        lane = gpu_lane(k["device"][i], k["stream"][i])
        me = g.add(KERNEL, lane, str(k["name"][i]), ts[i], end[i] - ts[i])
        g.set_kernel_node(i, me)
        es: list[tuple[int, float, bool]] = []
        stream_bound = prev >= 0 and a >= b
        if prev >= 0:
            es.append((g.kernel_node[prev], ts[i] - a if stream_bound else min(ts[i] - a, gap_us), False))
        if node >= 0:
            es.append((node, ts[i] - b if not stream_bound else min(ts[i] - b, launch_us), True))
        edges.node(es)


def _by_correlation(la: Table) -> Callable[[int], int]:
    """The launch row of a correlation id (-1: none; the last row where several have it), by bisection
    over the launches sorted by it: a dict of every launch took an entry and two int objects a launch."""
    corr = indexable(la["correlation"]) if nrows(la) else array("q")
    order = sort_order(len(corr), ((corr, False),))  # range(n): in order already, as a trace writes them
    keys = corr if isinstance(order, range) else array("q", (corr[j] for j in order))

    def launch_of(c: int) -> int:
        at = bisect_right(keys, c) - 1
        return order[at] if at >= 0 and keys[at] == c else -1

    return launch_of


def _waits(trace: TraceData, g: StepGraph, edges: _Edges,
           sync_end: dict[int, tuple[int, float, float]]) -> None:
    """A host wait ends after the last kernel launched at or before it on each stream (correlation ids
    grow with each launch)."""
    la = trace.launches
    per_stream: dict[str, tuple[list[int], list[int]]] = {}  # lane -> (running max correlation, nodes)
    for i, node in sorted(g.kernel_nodes(), key=lambda kv: (g.lane_of(kv[1]), g.start[kv[1]])):
        corr, nodes = per_stream.setdefault(g.lane_of(node), ([], []))
        c = int(trace.kernels["correlation"][i])
        corr.append(max(c, corr[-1]) if corr else c)
        nodes.append(node)
    for j, (node, start, end) in sync_end.items():
        c = int(la["correlation"][j])
        targets = []
        for corr, nodes in per_stream.values():
            at = bisect_right(corr, c) - 1
            if at >= 0:
                targets.append(nodes[at])
        waited = [t for t in targets if g.start[t] + g.dur[t] > start]
        me = edges.later[node]
        pred_start = node - 1  # its WAIT_START node, added just before it
        if waited:
            latest = max(g.start[t] + g.dur[t] for t in waited)
            me.append((pred_start, min(end - start, SYNC_CALL_US), False))
            me.extend((t, end - latest, False) for t in waited)
        else:
            me.append((pred_start, end - start, False))
            me.extend((t, 0.0, False) for t in targets)


def _step_kernels(g: StepGraph) -> None:
    """Each step's kernels: those launched inside it (by their launch's start; a kernel without a launch
    by its own)."""
    launched_at: dict[int, float] = {}
    for _, node in g.kernel_nodes():
        at = g.start[node]
        for e in range(g.ptr[node], g.ptr[node + 1]):
            if g.from_start[e]:
                at = g.start[g.pred[e]]
        launched_at[node] = at
    # the kernels by launch time, to find each step's by bisection (a scan of every kernel per step grew
    # with steps x kernels: 7 s of the 20x scaling trace's analysis)
    nodes = [k for k, at in launched_at.items() if at == at]  # as added; a NaN time is in no step
    times = [launched_at[k] for k in nodes]
    by_time = sorted(range(len(nodes)), key=times.__getitem__)
    sorted_times = [times[i] for i in by_time]
    for _, a, b in g.steps:
        lo, hi = bisect_left(sorted_times, a), bisect_left(sorted_times, b)
        mine = [nodes[i] for i in sorted(by_time[lo:hi])] if hi > lo else []  # as added, as before
        g.step_kernels.append(mine)
        last = max((g.start[k] + g.dur[k] for k in mine), default=b)
        g.step_tail.append(max(last - b, 0.0))


def _runs(g: StepGraph, order: array[int]) -> tuple[array[int], array[int]]:
    """The replay's units (StepGraph.heads/ends). A run's head is ordered where the topological order has
    it: its nodes after the head depend on nothing outside the run, and whatever depends on them comes
    later in that order than they, so later than the head."""
    ptr, pred, lag, from_start, chained = g.ptr, g.pred, g.lag, g.from_start, g.chained
    waits = set(g.waits)  # a wait's edges change when it no longer blocks (Change.unblocked)
    inside = bytearray(g.n)  # in a run, after its head
    for i in range(1, g.n):
        a, b = ptr[i], ptr[i + 1]
        if chained[i]:
            one = a == b  # the node before is its only predecessor
        else:
            one = b - a == 1 and pred[a] == i - 1 and not from_start[a] and lag[a] != -math.inf
        if one and i not in waits:
            inside[i] = 1
    heads, ends = array(INDEX), array(INDEX)
    for i in order:
        if not inside[i]:
            end = i + 1
            while end < g.n and inside[end]:
                end += 1
            heads.append(i)
            ends.append(end)
    return heads, ends


def _topological(g: StepGraph) -> array[int]:
    """Kahn's order over the edges; an edge that closes a cycle (timestamps that contradict each other)
    is dropped: its lag becomes -inf (a chained node is unchained)."""
    n = g.n
    ptr, pred, chained = g.ptr, g.pred, g.chained
    indeg = array(INDEX, (ptr[i + 1] - ptr[i] + chained[i] for i in range(n)))
    # successors, CSR (a list per node cost more memory than the graph's own columns)
    sptr = array(INDEX, [0]) * (n + 1)
    for p in pred:
        sptr[p + 1] += 1
    for i in range(n):
        sptr[i + 1] += sptr[i]
    fill = array(INDEX, sptr)
    succ = array(INDEX, [0]) * len(pred)
    for i in range(n):
        for e in range(ptr[i], ptr[i + 1]):
            p = pred[e]
            succ[fill[p]] = i
            fill[p] += 1
    del fill
    order = array(INDEX, (i for i in range(n) if indeg[i] == 0))
    pos = 0
    while True:
        while pos < len(order):
            i = order[pos]
            pos += 1
            # successors in node order, the implicit one (the node after, when chained) among them
            after = i + 1 if i + 1 < n and chained[i + 1] else -1
            for k in range(sptr[i], sptr[i + 1]):
                s = succ[k]
                if 0 <= after < s:
                    indeg[after] -= 1
                    if indeg[after] == 0:
                        order.append(after)
                    after = -1
                indeg[s] -= 1
                if indeg[s] == 0:
                    order.append(s)
            if after >= 0:
                indeg[after] -= 1
                if indeg[after] == 0:
                    order.append(after)
        if len(order) == n:
            return order
        # a cycle: release the earliest recorded node still waiting, dropping its unresolved edges
        done = set(order)
        stuck = min((i for i in range(n) if i not in done), key=lambda i: (g.start[i], i))
        if chained[stuck] and stuck - 1 not in done:
            chained[stuck] = 0
        for e in range(g.ptr[stuck], g.ptr[stuck + 1]):
            if g.pred[e] not in done:
                g.lag[e] = -math.inf
        indeg[stuck] = 0
        order.append(stuck)  # the dropped edges' sources, processed later, take its count below 0: no re-entry
