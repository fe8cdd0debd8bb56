"""A replay of the step's dependency graph (opscope.analysis.replay_graph) with changed durations.

A change scales the CPU self time of row events and the time of kernels (a factor per event or kernel;
0 removes the work), and can remove the host work that CUDA graphs would replay (`remove_gaps`). Every
node then starts at the latest of its predecessors (plus the edge's recorded lag) and lasts its new
duration, in one pass over the graph's topological order: linear in the trace's events. The step's
time is where the replay puts the ProfilerStep ranges' ends (the whole trace's span without them);
the critical path is the chain of binding predecessors back from the last step's end.
"""

from __future__ import annotations

import math
import tempfile
from array import array
from bisect import bisect_right
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import accumulate
from typing import IO, Any

from opscope.analysis.replay_graph import KERNEL, WAIT_END, StepGraph
from opscope.limits import bounded as bounded_text
from opscope.table import INDEX

MAX_SEGMENTS = 2000  # critical path segments kept (whatif.json; the HTML timeline draws them)
NAME_CHARS = 200  # a segment's name at most (ROCm's GEMM kernel names run to 600 characters)


@dataclass
class Change:
    """Factors on durations: `cpu` row event -> factor on its self time (its pieces and the runtime calls
    in them), `kernels` trace.kernels row -> factor. Two changes combine by the smaller factor per item,
    so that two fixes of the same op do not count its time twice. `unblocked`: row events whose host
    waits no longer wait for the GPU (the value stays on the device)."""

    cpu: dict[int, float] = field(default_factory=dict)
    kernels: dict[int, float] = field(default_factory=dict)
    remove_gaps: bool = False
    unblocked: frozenset[int] = frozenset()

    def combined(self, other: Change) -> Change:
        cpu = dict(self.cpu)
        for k, f in other.cpu.items():
            cpu[k] = min(f, cpu.get(k, f))
        kernels = dict(self.kernels)
        for k, f in other.kernels.items():
            kernels[k] = min(f, kernels.get(k, f))
        return Change(cpu, kernels, self.remove_gaps or other.remove_gaps, self.unblocked | other.unblocked)

    @property
    def signature(self) -> tuple[Any, ...]:
        """Equal for two changes that change the same durations the same way."""
        return (self.remove_gaps, tuple(sorted((k, f) for k, f in self.cpu.items() if f != 1.0)),
                tuple(sorted((k, f) for k, f in self.kernels.items() if f != 1.0)), tuple(sorted(self.unblocked)))

    @property
    def empty(self) -> bool:
        return not self.remove_gaps and not self.unblocked and all(f == 1.0 for f in self.cpu.values()) and all(
            f == 1.0 for f in self.kernels.values())


@dataclass
class Steps:
    """A replay's step times, all a saving needs: what-if keeps a dozen replays at once, and their node
    arrays (28 bytes a node) would hold more memory than the graph."""

    step_us: list[float]  # each profiled step's replayed time

    @property
    def total_us(self) -> float:
        return math.fsum(self.step_us)

    @property
    def mean_step_us(self) -> float:
        return self.total_us / len(self.step_us) if self.step_us else 0.0


@dataclass
class Replay(Steps):
    """A replay with every node's times (the critical path needs them)."""

    start: array[float]
    dur: array[float]
    # the recorded durations of the pieces holding the steps' ends where `dur` is the graph's own, changed
    # in place (changed_in_place): g.dur then holds the changed ones
    recorded: dict[int, float] = field(default_factory=dict)
    # the host waits that no longer wait for the GPU (Change.unblocked): only their first edge counts
    free: set[int] = field(default_factory=set)

    @property
    def finish(self) -> Finish:
        return Finish(self.start, self.dur)


class Finish:
    """A replay's finish times: each node's start plus its duration, the very sum the replay made (8 bytes a
    node not held)."""

    __slots__ = ("dur", "start")

    def __init__(self, start: array[float], dur: array[float]) -> None:
        self.start, self.dur = start, dur

    def __getitem__(self, node: int) -> float:
        return self.start[node] + self.dur[node]

    def __len__(self) -> int:
        return len(self.start)


def durations(g: StepGraph, change: Change | None) -> array[float]:
    """The durations with `change`: a copy of the recorded ones (they are shared where nothing changes)."""
    if change is None:
        return g.dur  # the recorded ones, shared: nothing writes to a replay's durations
    dur = array("d", g.dur)
    for node, f in _changed(g, change):
        dur[node] = g.dur[node] * f if f is not None else 0.0
    return dur


def _changed(g: StepGraph, change: Change) -> Iterator[tuple[int, float | None]]:
    """(node, the factor on its recorded duration; None: 0) for each node the change touches. A node comes
    once, except where `remove_gaps` sets it to 0 after its factor."""
    for key, f in change.cpu.items():
        # its waits too, whose recorded duration is 0 (their wait is an edge): scaled, still 0. The owners'
        # nodes do not overlap (StepGraph.nodes_of), nor do the kernels'.
        for node in g.nodes_of(key):
            yield node, f
    for k, f in change.kernels.items():
        node = g.node_of_kernel(k)
        if node >= 0:
            yield node, f
    if change.remove_gaps:
        for node, launching in enumerate(g.launching):
            if launching:
                yield node, None


@contextmanager
def changed_in_place(g: StepGraph, change: Change) -> Iterator[tuple[array[float], dict[int, float]]]:
    """The durations with `change`, written into the graph's own (`g.dur`) and put back on exit, and the
    recorded durations of the pieces holding the steps' ends (Replay.recorded: where a step ends is
    placed by them): a replay whose node times are not kept then holds no copy of the durations (8 bytes a
    node), only a byte a node and the old durations of the nodes it touches, which go to a temporary file
    a block at a time when they are many (`remove_gaps` touches most of a trace's CPU pieces). Put back in
    the order they were written, found again by _changed()."""
    dur = g.dur
    recorded = {node: dur[node] for node in _step_holders(g)}
    touched = bytearray(len(dur))
    old = _Spilled()
    try:
        for node, f in _changed(g, change):
            if touched[node]:  # only `remove_gaps` comes back to a node: 0, as in durations()
                dur[node] = 0.0
                continue
            touched[node] = 1
            was = dur[node]
            old.append(was)
            dur[node] = was * f if f is not None else 0.0
        yield dur, recorded
    finally:
        with old:
            values = old.replayed()
            for node, _ in _changed(g, change):
                if touched[node]:
                    back = next(values, None)
                    if back is None:  # all put back (or written: a failure half-way)
                        break
                    touched[node] = 0
                    dur[node] = back


class _Spilled:
    """Floats appended, then read back in order once: a block of them in memory, the rest in a temporary
    file (removed on exit)."""

    BLOCK = 1 << 16  # values (512 KiB)

    def __init__(self) -> None:
        self.block = array("d")
        self.file: IO[bytes] | None = None
        self.in_memory = False  # no temporary file could be made: all of them in `block`

    def append(self, value: float) -> None:
        self.block.append(value)
        if len(self.block) >= self.BLOCK and not self.in_memory:
            if self.file is None:
                try:
                    self.file = tempfile.TemporaryFile(prefix="opscope-replay-")  # noqa: SIM115  # closed on exit
                except OSError:  # no writable temporary directory: the memory it would have saved is used
                    self.in_memory = True
                    return
            self.block.tofile(self.file)
            self.block = array("d")

    def replayed(self) -> Iterator[float]:
        """The values in the order appended."""
        if self.file is not None:
            self.file.seek(0)
            while chunk := self.file.read(8 * self.BLOCK):
                yield from array("d", chunk)
        yield from self.block

    def __enter__(self) -> _Spilled:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


def replay(g: StepGraph, change: Change | None = None) -> Replay:
    return _replay(g, durations(g, change), change)


def _replay(g: StepGraph, dur: array[float], change: Change | None,
            recorded: dict[int, float] | None = None) -> Replay:
    """`recorded`: where `dur` is g.dur changed in place, the recorded durations changed_in_place gives."""
    n = g.n
    # each node's binding predecessor is not kept (4 bytes a node): the critical path finds it again, for
    # the nodes on it only (binding())
    start = array("d", [0.0]) * n  # not array("d", bytes(8 * n)): that holds the bytes beside their copy
    ptr, pred, lag, from_start, rec, chained = g.ptr, g.pred, g.lag, g.from_start, g.start, g.chained
    # a wait that no longer blocks keeps only its edge from its own start (the first)
    free = ({i for i in g.waits if g.wait_owner.get(i, -1) in change.unblocked} if change is not None and change.unblocked
            else set())
    for i, end in zip(g.heads, g.ends, strict=True):
        a, b = ptr[i], ptr[i + 1]
        if b - a == 1 and not chained[i]:  # one predecessor
            p = pred[a]
            s = (start[p] if from_start[a] else start[p] + dur[p]) + lag[a]  # its finish, as summed below
            if s == -math.inf:
                s = rec[i]
        elif a == b and not chained[i]:
            s = rec[i]
        else:
            s = -math.inf
            w = -1
            if chained[i]:  # its first predecessor: the node before, at its finish, no lag
                s, w = start[i - 1] + dur[i - 1] + 0.0, i - 1
            for e in range(a, a + 1 if i in free else b):
                p = pred[e]
                v = (start[p] if from_start[e] else start[p] + dur[p]) + lag[e]
                if v > s:
                    s, w = v, p
            if w < 0:  # every edge dropped (a cycle in the timestamps)
                s = rec[i]
        start[i] = s
        f = s + dur[i]
        if end > i + 1:  # the run after it: each node starts at the finish before it plus its lag
            m = end - i - 1
            steps = [0.0] * (2 * m)  # the lags: 0.0 where chained (StepGraph.chained)
            a, b = ptr[i + 1], ptr[end]
            if b - a == m:  # each node's one edge explicit
                steps[0::2] = lag[a:b]
            elif b > a:  # some chained, some not
                steps[0::2] = [lag[ptr[k]] if ptr[k + 1] > ptr[k] else 0.0 for k in range(i + 1, end)]
            steps[1::2] = dur[i + 1:end]
            # the same additions in the same order as node by node: f + lag, then + dur
            sums = list(accumulate(steps, initial=f))
            start[i + 1:end] = array("d", sums[1::2])  # each finish, sums[2::2], is its start plus its duration
    out = Replay(step_us=[], start=start, dur=dur, recorded=recorded or {}, free=free)
    out.step_us = [b - a for a, b in step_bounds(g, out)]
    return out


def replay_steps(g: StepGraph, change: Change | None = None) -> Steps:
    """replay()'s step times only; its node arrays are freed on return, and its durations are never copied."""
    with _replayed(g, change) as r:
        return Steps(r.step_us)


def replay_path(g: StepGraph, change: Change | None = None) -> tuple[Steps, list[dict[str, Any]]]:
    """replay()'s step times and critical path; its node arrays are freed on return, and its durations are
    never copied."""
    with _replayed(g, change) as r:
        return Steps(r.step_us), critical_path(g, r)


@contextmanager
def _replayed(g: StepGraph, change: Change | None) -> Iterator[Replay]:
    """The replay with `change`, its durations the graph's own changed in place while it is used."""
    if change is None:
        yield replay(g)
        return
    with changed_in_place(g, change) as (dur, recorded):
        yield _replay(g, dur, change, recorded)


def binding(g: StepGraph, r: Replay, i: int) -> int:
    """Node `i`'s binding predecessor in the replay (-1: none, it started at its recorded time): the
    predecessor whose edge _replay() took its start from, found by the same comparisons on the same sums.
    A node of a run after its head gets the node before it, as _replay() gives it."""
    ptr, pred, lag, from_start, chained = g.ptr, g.pred, g.lag, g.from_start, g.chained
    start, dur = r.start, r.dur
    a, b = ptr[i], ptr[i + 1]
    if b - a == 1 and not chained[i]:
        p = pred[a]
        s = (start[p] if from_start[a] else start[p] + dur[p]) + lag[a]
        return -1 if s == -math.inf else p
    if a == b and not chained[i]:
        return -1
    s = -math.inf
    w = -1
    if chained[i]:
        s, w = start[i - 1] + dur[i - 1] + 0.0, i - 1
    for e in range(a, a + 1 if i in r.free else b):
        p = pred[e]
        v = (start[p] if from_start[e] else start[p] + dur[p]) + lag[e]
        if v > s:
            s, w = v, p
    return w


def step_bounds(g: StepGraph, r: Replay) -> list[tuple[float, float]]:
    """Each profiled step's (start, end) in the replay; the whole trace's span without steps."""
    if not g.steps:
        owned = bytearray(g.n)  # the nodes some row event owns (StepGraph.by_owner)
        for node in g.by_owner:
            owned[node] = 1
        work = [i for i in range(g.n) if owned[i] or g.kind[i] == KERNEL] or list(range(g.n))
        if not work:
            return [(0.0, 0.0)]
        start, dur = r.start, r.dur
        return [(min(start[i] for i in work), max(start[i] + dur[i] for i in work))]
    out = []
    start, dur = r.start, r.dur
    for k, (lane, a, b) in enumerate(g.steps):
        end = _at(g, r, lane, b)
        kernels = g.step_kernels[k] if k < len(g.step_kernels) else []
        if kernels:  # each finish summed as Finish sums it, without a call per kernel
            end = max(end, max(start[x] + dur[x] for x in kernels) - g.step_tail[k])
        out.append((_at(g, r, lane, a), end))
    return out


def _at(g: StepGraph, r: Replay, lane: str, t: float) -> float:
    """Where the replay puts recorded time `t` of a thread: the same offset into the piece holding it
    (scaled with the piece), or past the thread's last piece by the same distance."""
    nodes = g.thread_nodes.get(lane)
    if not nodes:
        return t
    at = _piece_at(g, nodes, t)
    if at < 0:
        node = nodes[0]
        return r.start[node] - (g.start[node] - t)
    node = nodes[at]
    offset, dur = t - g.start[node], r.recorded.get(node, g.dur[node])
    if offset <= dur:
        return r.start[node] + (offset * r.dur[node] / dur if dur > 0 else 0.0)
    return r.finish[node] + offset - dur


def _piece_at(g: StepGraph, nodes: range, t: float) -> int:
    """The position in a thread's pieces (`nodes`, by recorded start) of the last one starting at or
    before recorded time `t` (-1: none)."""
    return bisect_right(nodes, t, key=g.start.__getitem__) - 1


def _step_holders(g: StepGraph) -> Iterator[int]:
    """The pieces _at() reads the recorded durations of: those holding a step's start or end."""
    for lane, a, b in g.steps:
        nodes = g.thread_nodes.get(lane)
        if nodes:
            for t in (a, b):
                at = _piece_at(g, nodes, t)
                if at >= 0:
                    yield nodes[at]


def _end_node(g: StepGraph, r: Replay) -> int:
    if g.steps:
        lane, _, end = g.steps[-1]
        nodes = g.thread_nodes.get(lane, range(0))
        at = _piece_at(g, nodes, end)
        if at >= 0:
            node = nodes[at]
            # a host wait's end sits at the recorded end of its wait: take it when the step ends there
            return node
    return max(range(g.n), key=r.finish.__getitem__) if g.n else -1


def origin(g: StepGraph, r: Replay) -> float:
    """The replay's time origin: the first profiled step's start, else the trace's first event."""
    if g.steps:
        return step_bounds(g, r)[0][0]
    return min(r.start) if g.n else 0.0


def critical_path(g: StepGraph, r: Replay, limit: int = MAX_SEGMENTS) -> list[dict[str, Any]]:
    """The chain of nodes that decides the last step's end, back to the first step's start, as segments
    {"lane", "ts" (µs from the first step's start), "dur", "name"} in time order; consecutive segments on
    one lane merge first when there are more than `limit`."""
    node = _end_node(g, r)
    t0 = origin(g, r)
    start, node_dur = r.start, r.dur
    chain = array(INDEX)
    seen = bytearray(g.n)
    # a finish is its start plus its duration, summed here as Finish sums it (no call per node)
    while node >= 0 and not seen[node] and start[node] + node_dur[node] > t0:
        seen[node] = 1
        chain.append(node)
        node = binding(g, r, node)
    del seen
    kind, node_lane = g.kind, g.lane

    def kept() -> Iterator[tuple[int, float, float]]:
        """(node, start, end) of the path's segments in time order, clipped at the origin."""
        for node in reversed(chain):
            a = start[node]
            b = a + node_dur[node]
            if a < t0:
                a = t0
            if not (b - a <= 0 or kind[node] == WAIT_END):
                yield node, a, b

    count = sum(1 for _ in kept())
    lanes: dict[int, int] = {}  # the graph's lane number -> the path's
    lane_id = lanes.setdefault
    # the path of a long trace runs through most of its nodes: when it has more segments than kept, they
    # merge as they come (the first of _bounded's merges), never all held at once
    rows = ((lane_id(node_lane[node], len(lanes)), a - t0, b - a, node) for node, a, b in kept())
    # its own sum() over the same values as bounded()'s (a running total differs from sum() since 3.12)
    span = sum(b - a for _, a, b in kept()) if count > limit else 0.0
    segments = _bounded(rows, count, span, limit)
    names = [g.lanes[x] for x in lanes]
    return [{"lane": names[lane], "ts": ts, "dur": dur, "name": bounded_text(g.name_of(node), NAME_CHARS)}
            for lane, ts, dur, node in segments.rows()]


class _Segments:
    """Segments as parallel typed arrays (24 bytes each): a long trace's critical path has a segment per
    node on it, and as dicts they held more memory than the graph. `lane` and `label` are indices (into
    the caller's lanes, and its nodes or names)."""

    def __init__(self) -> None:
        self.lane, self.ts, self.dur, self.label = array(INDEX), array("d"), array("d"), array(INDEX)

    def append(self, lane: int, ts: float, dur: float, label: int) -> None:
        self.lane.append(lane)
        self.ts.append(ts)
        self.dur.append(dur)
        self.label.append(label)

    def __len__(self) -> int:
        return len(self.ts)

    def rows(self) -> zip[tuple[int, float, float, int]]:
        return zip(self.lane, self.ts, self.dur, self.label, strict=True)


def bounded(segments: list[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    """At most `limit` segments: while there are more, consecutive segments on one lane merge (named after
    the longest part) up to a length that doubles each round; when that is not enough (the path switches
    lanes too often), neighbours on any lane merge the same way, laned after the longest part."""
    lanes: dict[str, int] = {}
    rows = ((lanes.setdefault(seg["lane"], len(lanes)), seg["ts"], seg["dur"], k) for k, seg in enumerate(segments))
    span = sum(seg["dur"] for seg in segments) if len(segments) > limit else 0.0
    packed = _bounded(rows, len(segments), span, limit)
    names = list(lanes)
    return [{"lane": names[lane], "ts": ts, "dur": dur, "name": segments[k]["name"]}
            for lane, ts, dur, k in packed.rows()]


Row = tuple[int, float, float, int]  # lane, ts, dur, label


def _bounded(rows: Iterable[Row], count: int, span: float, limit: int) -> _Segments:
    """`rows` (`count` of them, their durations summing to `span`) bounded as bounded() says."""
    if count <= limit:
        out = _Segments()
        for row in rows:
            out.append(*row)
        return out
    merged: _Segments | None = None
    for any_lane in (False, True):
        quantum = span / limit
        while quantum <= 2 * span:
            merged = _merge(rows if merged is None else merged.rows(), quantum, any_lane)
            if len(merged) <= limit:
                return merged
            quantum *= 2
    if merged is None:  # a span that is not a number: nothing merged
        merged = _Segments()
        for row in rows:
            merged.append(*row)
    return merged


def _merge(rows: Iterable[Row], quantum: float, any_lane: bool) -> _Segments:
    out = _Segments()
    longest = array("d")
    o_lane, o_ts, o_dur, o_label = out.lane, out.ts, out.dur, out.label
    for lane, ts, dur, label in rows:
        if o_ts and (any_lane or o_lane[-1] == lane) and o_dur[-1] + dur <= quantum:
            if dur > longest[-1]:
                longest[-1] = dur
                o_label[-1], o_lane[-1] = label, lane
            o_dur[-1] = max(o_ts[-1] + o_dur[-1], ts + dur) - o_ts[-1]
            continue
        out.append(lane, ts, dur, label)
        longest.append(dur)
    return out
