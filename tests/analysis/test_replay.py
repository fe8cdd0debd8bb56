"""The what-if replay (opscope.analysis.replay_graph, replay, fixes, whatif): a tiny synthetic trace whose
replays are computed by hand, and the shared real traces replayed unchanged and with launch gaps removed."""

from __future__ import annotations

import gzip
import json
import math
import random
import weakref
from array import array
from itertools import accumulate
from pathlib import Path

import pytest

from conftest import TESTS, TRACES
from opscope.analysis.events import build_events
from opscope.analysis.fixes import Fixer, OpSpeedup, assign_ids, finding_id, parse_op_speedup
from opscope.analysis.pipeline import device_busy_share, step_stats
from opscope.analysis.replay import (
    Change,
    _Spilled,
    binding,
    bounded,
    changed_in_place,
    critical_path,
    replay,
    replay_path,
    replay_steps,
    step_bounds,
)
from opscope.analysis.replay_graph import (
    CPU,
    KERNEL,
    StepGraph,
    _Edges,
    _runs,
    _step_kernels,
    _topological,
    build_graph,
)
from opscope.analysis.whatif import annotate, engine, recommend, run_whatif
from opscope.errors import OpscopeError
from opscope.machine.peaks import Peaks
from opscope.trace.reader import load_trace

T0 = 1000.0


def _x(cat: str, name: str, ts: float, dur: float, **args: object) -> dict[str, object]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": T0 + ts, "dur": dur, "args": args}


def _kernel(name: str, ts: float, dur: float, corr: int) -> dict[str, object]:
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": T0 + ts, "dur": dur,
            "args": {"correlation": corr, "stream": 7, "device": 0}}


# One step [0, 62): aten::copy_ [0, 10) launches `copy_kernel` (its launch call [2, 4)), 5 µs of Python,
# aten::relu [15, 20) launches `relu_kernel` ([16, 18)), 1 µs, then cudaDeviceSynchronize [21, 60)
# waits for the GPU: copy_kernel ran [5, 30), relu_kernel [30, 55) on stream 7.
EVENTS = [
    _x("cpu_op", "ProfilerStep#1", 0, 62),
    _x("cpu_op", "aten::copy_", 0, 10, **{"External id": 1}),
    _x("cuda_runtime", "cudaLaunchKernel", 2, 2, correlation=10),
    _x("cpu_op", "aten::relu", 15, 5, **{"External id": 2}),
    _x("cuda_runtime", "cudaLaunchKernel", 16, 2, correlation=11),
    _x("cuda_runtime", "cudaDeviceSynchronize", 21, 39, correlation=12),
    _kernel("copy_kernel", 5, 25, 10),
    _kernel("relu_kernel", 30, 25, 11),
]


@pytest.fixture
def tiny(tmp_path: Path):
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps({"traceEvents": EVENTS}))
    trace = load_trace(path)
    return trace, build_events(trace)


def test_an_unchanged_replay_gives_back_the_recorded_step(tiny):
    trace, ev = tiny
    g = build_graph(trace, ev)
    r = replay(g)
    assert r.step_us == [pytest.approx(62.0)]
    assert r.start == pytest.approx(g.start)


def test_the_critical_path_by_hand(tiny):
    """The wait ends 5 µs after relu_kernel, which followed copy_kernel, which waited for its launch, which
    followed the start of aten::copy_: the lag edges are no segments, the wait is its kernels."""
    trace, ev = tiny
    g = build_graph(trace, ev)
    path = critical_path(g, replay(g))
    assert [(s["lane"], s["ts"], s["dur"], s["name"]) for s in path] == [
        ("cpu:1", 0.0, 2.0, "aten::copy_"), ("cpu:1", 2.0, 2.0, "cudaLaunchKernel"),
        ("gpu:0:7", 5.0, 25.0, "copy_kernel"), ("gpu:0:7", 30.0, 25.0, "relu_kernel")]


def test_an_op_speedup_by_hand(tiny):
    """aten::copy_=2x: the op takes [0, 5) (its launch call [1, 2)); copy_kernel starts 3 µs after its launch
    as recorded (the trace's launch latency), at 4, and lasts 12.5; Python [5, 10), aten::relu [10, 15) with
    its launch at 11: relu_kernel waits for copy_kernel's end, 16.5, and ends at 41.5; the sync starts at
    16 and returns 5 µs after relu_kernel (as recorded), at 46.5; the step ends 2 µs later: 48.5."""
    trace, ev = tiny
    g = build_graph(trace, ev)
    fixer = Fixer(ev, trace.kernels, Peaks(None), gpu=True)
    r = replay(g, fixer.speedup(parse_op_speedup("aten::copy_=2x")))
    assert r.step_us == [pytest.approx(48.5)]


def test_removing_gaps_by_hand(tiny):
    """CUDA graphs replay the host work from aten::copy_ to aten::relu: both launches at 0; copy_kernel
    [3, 28), relu_kernel [28, 53); the Python after aten::relu stays (1 µs), the sync returns at 58, the
    step ends at 60: between the GPU's busy time (50) and the recorded step (62)."""
    trace, ev = tiny
    g = build_graph(trace, ev)
    assert replay(g, Change(remove_gaps=True)).step_us == [pytest.approx(60.0)]


def test_two_findings_on_one_op_count_once(tiny):
    """Both findings remove aten::copy_ (its self time and copy_kernel): alone, each saves 21 µs (the
    step ends at 41: relu_kernel [9, 34), the sync returns at 39); together, still 21."""
    trace, ev = tiny
    findings = [{"rule": "implicit-copy", "op": "aten::copy_", "source_location": "", "module": None},
                {"rule": "contiguous-call", "op": "aten::copy_", "source_location": "", "module": None}]
    summary, file = run_whatif(trace, ev, findings, peaks=Peaks(None), gpu=True, step_time_us=62.0)
    assert [f["critical_path_saving_us"] for f in findings] == [21.0, 21.0]
    assert summary["replayed_step_time_us"] == 62.0
    assert summary["predicted_step_time_us"] == 41.0
    assert summary["fixes"] == 2
    first, both = [findings[0]["id"]], [findings[0]["id"], findings[1]["id"]]
    assert summary["top"] == [{"ids": first, "predicted_step_time_us": 41.0},
                              {"ids": both, "predicted_step_time_us": 41.0}]
    assert file["critical_path"][0]["name"] == "aten::copy_"


def test_the_unchanged_replays_node_times_go_once_the_fixes_replay(tiny):
    """Engine.path gives the unchanged replay's step times, never the replay itself: a caller holding what it
    gave kept every node's times (12 bytes a node) through the fixes' replays, the what-if's peak."""
    trace, ev = tiny
    findings = [{"rule": "implicit-copy", "op": "aten::copy_", "source_location": "", "module": None}]
    e = engine(trace, ev, Peaks(None), gpu=True)
    unchanged = weakref.ref(e.base)
    steps, path = e.path(Change())
    assert steps.step_us == [pytest.approx(62.0)] and path
    annotate(e, findings)  # a finding that changes something: the fixes' replays need only step times
    assert unchanged() is None
    assert e.path(Change()) == (steps, path)


def test_a_host_sync_fix_by_hand(tmp_path: Path):
    """The sync inside aten::_local_scalar_dense no longer waits: it takes its own 5 µs, [21, 26); the
    step then ends with relu_kernel, at 55 (the time after the sync, 2 µs, runs meanwhile)."""
    path = tmp_path / "sync.json"
    path.write_text(json.dumps({"traceEvents": [*EVENTS, _x("cpu_op", "aten::_local_scalar_dense", 21, 39)]}))
    trace = load_trace(path)
    ev = build_events(trace)
    finding = {"rule": "host-sync", "op": "aten::_local_scalar_dense", "source_location": "", "module": None}
    summary, _ = run_whatif(trace, ev, [finding], peaks=Peaks(None), gpu=True, step_time_us=62.0)
    assert summary["replayed_step_time_us"] == 62.0
    assert finding["critical_path_saving_us"] == 7.0


def test_recommend_puts_the_largest_marginal_saving_first(tiny):
    trace, ev = tiny
    e = engine(trace, ev, Peaks(None), gpu=True)
    fixer = e.fixer
    small = fixer.speedup(OpSpeedup("aten::relu", 2.0))
    big = fixer.speedup(OpSpeedup("aten::copy_", 2.0))
    steps, after = recommend(e, [("small", small), ("big", big)])
    assert [s.label for s in steps] == ["big", "small"]
    assert steps[0].marginal_us == pytest.approx(62.0 - 48.5)
    assert sum(s.marginal_us for s in steps) == pytest.approx(62.0 - e.path(after)[0].mean_step_us)


def test_finding_ids_are_stable_and_distinct():
    f = {"rule": "fusion", "op": "aten::add", "source_location": "m.py:3", "module": "encoder"}
    assert finding_id(f) == finding_id(dict(f)) == "fusion-" + finding_id(f).split("-")[1]
    twins = [dict(f), dict(f), {**f, "module": "decoder"}]
    assign_ids(twins)
    assert twins[1]["id"] == twins[0]["id"] + "-2"
    assert len({t["id"] for t in twins}) == 3


@pytest.mark.parametrize("text", ["aten::gelu=0x", "=2x", "foo", "aten::gelu=-1x", "module:=2x", "aten::gelu=x"])
def test_malformed_speedups_are_refused(text):
    with pytest.raises(OpscopeError, match="--op-speedup"):
        parse_op_speedup(text)


def test_speedups_parse():
    assert parse_op_speedup("aten::gelu=2x") == OpSpeedup("aten::gelu", 2.0)
    assert parse_op_speedup("module:encoder.layer.3=1.5x") == OpSpeedup("module:encoder.layer.3", 1.5)


def test_a_long_critical_path_is_bounded():
    segments = [{"lane": f"cpu:{i % 3 // 2}", "ts": float(i), "dur": 1.0, "name": f"op{i}"} for i in range(5000)]
    out = bounded(segments, 100)
    assert len(out) <= 100
    assert sum(s["dur"] for s in out) == pytest.approx(5000.0)


def test_grouped_positions_are_a_stable_sort_by_key():
    from array import array

    from opscope.table import INDEX, grouped

    owner = array(INDEX, [3, -1, 0, 3, 2, -1, 0, 3, 7])
    start, members = grouped(owner, 8)
    expected = sorted((i for i, o in enumerate(owner) if o >= 0), key=owner.__getitem__)
    assert list(members) == expected == [2, 6, 4, 0, 3, 7, 8]
    assert [list(members[start[k]:start[k + 1]]) for k in range(8)] == [[2, 6], [], [4], [0, 3, 7], [], [], [], [8]]
    assert [len(x) for x in grouped([-1, -1], 0)] == [1, 0]


def test_an_events_nodes_are_its_pieces_in_node_order(tiny):
    trace, ev = tiny
    g = build_graph(trace, ev)
    # aten::copy_ [0, 10) holds its launch call [2, 4), aten::relu [15, 20) its [16, 18) (the trace at 1000 µs)
    pieces = [[(g.name_of(x), g.start[x], g.dur[x]) for x in g.nodes_of(event)] for event in range(len(ev["name"]))]
    assert pieces == [[("aten::copy_", 1000.0, 2.0), ("cudaLaunchKernel", 1002.0, 2.0), ("aten::copy_", 1004.0, 6.0)],
                      [("aten::relu", 1015.0, 1.0), ("cudaLaunchKernel", 1016.0, 2.0), ("aten::relu", 1018.0, 2.0)]]
    assert all(list(g.nodes_of(e)) == sorted(g.nodes_of(e)) for e in range(len(ev["name"])))
    assert len(g.nodes_of(-1)) == len(g.nodes_of(10**6)) == 0
    assert g.wait_owner == {g.waits[0]: -1}  # the sync is inside no op


def test_a_launch_is_found_by_its_correlation_id_as_a_dict_of_them_would():
    """_by_correlation: the launch row of a correlation id, the last of several, -1 for none; in order or not."""
    from opscope.analysis.replay_graph import _by_correlation

    rng = random.Random(7)
    for ordered in (True, False):
        corr = sorted(rng.randrange(50) for _ in range(200)) if ordered else [rng.randrange(50) for _ in range(200)]
        launch_of = _by_correlation({"correlation": corr})
        expected = {c: j for j, c in enumerate(corr)}
        assert [launch_of(c) for c in range(-3, 55)] == [expected.get(c, -1) for c in range(-3, 55)]
    assert _by_correlation({"correlation": []})(5) == -1


def test_lane_and_name_numbers_widen_as_they_grow():
    """A node's lane and name number take a byte while they fit, then 2, then 4, reading back the same."""
    g = StepGraph()
    sizes = {}
    for i in range(70_000):
        g.add(CPU, f"cpu:{i % 3}", f"op{i}", float(i), 1.0)
        sizes[i] = g.name.itemsize
    assert (sizes[255], sizes[256], sizes[65_535], sizes[65_536]) == (1, 2, 2, 4) and g.lane.itemsize == 1
    assert [g.name_of(i) for i in (0, 255, 256, 65_536, 69_999)] == ["op0", "op255", "op256", "op65536", "op69999"]
    assert {g.lane_of(i) for i in range(6)} == {"cpu:0", "cpu:1", "cpu:2"}


def test_a_threads_intervals_merge_in_time_order_parents_first():
    """_in_time_order: by start, the longer first, an event before a launch with the same start and end,
    else as added: the order of sorting (start, -end, is a launch) stably."""
    import random

    from opscope.analysis.replay_graph import _in_time_order, _Items, _Rows

    rng = random.Random(3)
    for _ in range(50):
        # the event table's start and end columns, with rows of other threads between this one's
        ev_start, ev_end = [float(rng.randrange(9)) for _ in range(60)], [0.0] * 60
        events, launches = _Rows(ev_start, ev_end), _Items()
        added = []
        for k in range(rng.randrange(0, 30)):
            s = float(rng.randrange(5))
            e = s + rng.choice([0.0, 1.0, 2.0])
            if rng.random() < 0.6:
                row = 2 * k + 1
                ev_start[row], ev_end[row] = s, e
                events.id.append(row)
                added.append((s, e, row))
            else:
                launches.add(s, e, -(k + 2))
                added.append((s, e, -(k + 2)))
        expected = sorted(added, key=lambda x: (x[0], -x[1], x[2] < 0))
        assert list(_in_time_order(events, launches)) == expected


@pytest.mark.parametrize("name", ["sglang_qwen3-8b_decode_cudagraph", "h100_bert-small_bf16"])
def test_a_bounded_critical_path_merges_what_the_whole_path_would(name: str):
    """critical_path() merges its segments as they come, never all held: the same segments as bounding
    the whole path afterwards."""
    trace = load_trace(TRACES / f"{name}.json.gz")
    ev = build_events(trace)
    g = build_graph(trace, ev)
    r = replay(g)
    whole = critical_path(g, r, limit=10**9)
    for limit in (1, 7, 50, len(whole) - 1, len(whole)):
        assert critical_path(g, r, limit=limit) == bounded(whole, limit), limit
    assert len(critical_path(g, r, limit=50)) <= 50 < len(whole)


GPU_TRACES = sorted(TRACES.glob("*.json.gz")) + sorted((TESTS / "fixtures" / "h200").glob("*_bf16.json.gz"))
CPU_TRACES = sorted((TESTS / "fixtures" / "cpu_traces").glob("*.json.gz")) + [
    TESTS / "fixtures" / "compile" / "cpu_compiled_inference.json.gz"]


@pytest.mark.parametrize("path", GPU_TRACES + CPU_TRACES, ids=lambda p: p.name.removesuffix(".json.gz"))
def test_real_traces_replay_to_their_recorded_step(path: Path):
    trace = load_trace(path)
    ev = build_events(trace)
    _, recorded = step_stats(trace, ev)
    r = replay(build_graph(trace, ev))
    assert r.mean_step_us == pytest.approx(recorded, rel=0.02)


@pytest.mark.parametrize("name", ["sglang_qwen3-8b_decode_cudagraph", "h100_bert-small_bf16", "mi300x_bert-small_bf16"])
def test_removing_gaps_lands_between_gpu_busy_and_the_recorded_step(name: str):
    trace = load_trace(TRACES / f"{name}.json.gz")
    ev = build_events(trace)
    steps, recorded = step_stats(trace, ev)
    busy = device_busy_share(trace, steps, recorded) * recorded
    predicted = replay(build_graph(trace, ev), Change(remove_gaps=True)).mean_step_us
    assert busy <= predicted < recorded


def test_spilled_values_come_back_in_order_and_the_file_goes():
    spilled = _Spilled()
    spilled.BLOCK = 5
    values = [i * 0.1 for i in range(23)] + [-0.0, math.inf]
    for v in values:
        spilled.append(v)
    with spilled:
        assert spilled.file is not None
        back = list(spilled.replayed())
    assert [repr(v) for v in back] == [repr(v) for v in values] and spilled.file is None
    with _Spilled() as few:  # under a block: no file
        few.append(1.5)
        assert list(few.replayed()) == [1.5] and few.file is None


def test_spilled_values_stay_in_memory_without_a_temporary_directory(monkeypatch: pytest.MonkeyPatch):
    def no_file(*args: object, **kwargs: object) -> None:
        raise OSError("read-only file system")

    monkeypatch.setattr("opscope.analysis.replay.tempfile.TemporaryFile", no_file)
    with _Spilled() as spilled:
        spilled.BLOCK = 3
        for v in range(10):
            spilled.append(float(v))
        assert spilled.file is None and list(spilled.replayed()) == [float(v) for v in range(10)]


@pytest.mark.parametrize("block", [_Spilled.BLOCK, 7])  # the old durations in memory, or most of them on disk
@pytest.mark.parametrize("name", ["h100_bert-small_bf16", "sglang_qwen3-8b_decode_cudagraph"])
def test_in_place_replays_match_the_copied_ones_and_put_the_durations_back(name: str, block: int,
                                                                           monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(_Spilled, "BLOCK", block)
    trace = load_trace(TRACES / f"{name}.json.gz")
    ev = build_events(trace)
    g = build_graph(trace, ev)
    recorded = array("d", g.dur)
    rows = [i for i, r in enumerate(ev["is_row"]) if r]
    changes = [Change(cpu={e: 0.5 for e in rows[::3]}),
               Change(cpu={e: 0.5 for e in rows}),  # the pieces holding the steps' ends too
               Change(kernels={k: 0.25 for k in range(0, len(g.kernel_node), 2)}),
               Change(cpu={rows[0]: 0.0}, kernels={0: 2.0}, remove_gaps=True)]
    for change in changes:
        copied = replay(g, change)
        assert replay_steps(g, change).step_us == copied.step_us
        steps, path = replay_path(g, change)
        assert steps.step_us == copied.step_us
        assert path == critical_path(g, copied)
        assert g.dur == recorded
    with pytest.raises(RuntimeError), changed_in_place(g, changes[0]) as (dur, _):
        assert dur is g.dur and dur != recorded
        raise RuntimeError
    assert g.dur == recorded


def test_a_step_starting_inside_a_changed_piece_is_placed_by_its_recorded_duration(tmp_path: Path):
    """The step starts 1 µs into aten::copy_'s first piece [0, 2): halved, the piece lasts 1 µs and the step
    starts halfway into it, at 0.5, whether the replay copies the durations or changes the graph's own."""
    path = tmp_path / "inside.json"
    path.write_text(json.dumps({"traceEvents": [_x("cpu_op", "ProfilerStep#1", 1, 61), *EVENTS[1:]]}))
    trace = load_trace(path)
    ev = build_events(trace)
    g = build_graph(trace, ev)
    copy_op = list(ev["name"]).index("aten::copy_")
    change = Change(cpu={copy_op: 0.5})
    copied = replay(g, change)
    assert step_bounds(g, copied)[0][0] == pytest.approx(0.5 + T0)
    assert replay_steps(g, change).step_us == copied.step_us
    assert replay_path(g, change)[0].step_us == copied.step_us


def test_gzip_round_trip_of_the_tiny_trace(tmp_path: Path):
    """The synthetic trace reads the same gzipped (as run directories hold it)."""
    path = tmp_path / "tiny.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": EVENTS}).encode()))
    trace = load_trace(path)
    assert replay(build_graph(trace, build_events(trace))).step_us == [pytest.approx(62.0)]


def test_each_steps_kernels_are_those_launched_inside_it():
    # kernels launched (their launch piece's start) at random times, some at a step's exact start or end
    rng = random.Random(3)
    g, edges = StepGraph(), _Edges()
    launch_at: dict[int, float] = {}
    for _ in range(300):
        t = float(rng.randint(0, 100))
        launch = g.add(CPU, "cpu:1", "cudaLaunchKernel", t, 1.0)
        edges.node(())
        if rng.random() < 0.8:  # launched: an edge from its launch's start; else timed by its own start
            k = g.add(KERNEL, "gpu:0:7", "k", t + 5.0, 2.0)
            edges.node(((launch, 5.0, True),))
            launch_at[k] = t
        else:
            k = g.add(KERNEL, "gpu:0:7", "k", t, 2.0)
            edges.node(())
            launch_at[k] = t
        g.set_kernel_node(len(g.kernel_rows), k)
    edges.into(g)
    g.steps = [("cpu:1", float(a), float(a + 10)) for a in range(0, 100, 10)] + [("cpu:1", 35.0, 35.0)]
    _step_kernels(g)
    for (_, a, b), mine in zip(g.steps, g.step_kernels, strict=True):
        assert mine == [k for k, at in launch_at.items() if a <= at < b]


def test_waiting_nodes_edges_are_merged_after_their_own():
    """_Edges.into puts each waiting node's later edges right after its own, in node order (random graphs
    against a node-by-node merge)."""
    rng = random.Random(5)
    for _ in range(30):
        edges, expected = _Edges(), []
        n = rng.randint(1, 60)
        for node in range(n):
            mine = [(rng.randrange(n), rng.random(), rng.random() < 0.3) for _ in range(rng.randint(0, 3))]
            if rng.random() < 0.2:
                edges.node(())
                edges.later[node] = mine  # a waiting node: its edges found at the end
            else:
                edges.node(mine)
            expected.append(mine)
        g = StepGraph()
        edges.into(g)
        assert list(g.ptr) == [0, *accumulate(len(es) for es in expected)]
        flat = [e for es in expected for e in es]
        assert list(g.pred) == [p for p, _, _ in flat] and list(g.lag) == [x for _, x, _ in flat]
        assert list(g.from_start) == [int(fs) for _, _, fs in flat]


def _random_graph(rng: random.Random, implicit: bool) -> StepGraph:
    """A random graph, cycles included: each node follows the one before it (a chain edge: implicit, or
    the same edge written out) or has random edges to any node; the same seed gives the same graph."""
    g, edges = StepGraph(), _Edges()
    n = rng.randint(2, 40)
    for i in range(n):
        g.add(CPU if rng.random() < 0.7 else KERNEL, f"cpu:{i % 3}", "op", rng.uniform(0, 100), rng.uniform(0, 5))
        if i and rng.random() < 0.6:
            if implicit:
                edges.chain()
            else:
                edges.node(((i - 1, 0.0, False),))
        else:
            edges.node([(rng.randrange(n), rng.uniform(-1, 3), rng.random() < 0.3)
                        for _ in range(rng.randint(0, 3))])
    edges.into(g)
    g.heads, g.ends = _runs(g, _topological(g))
    return g


def test_implicit_chain_edges_replay_as_the_written_out_ones():
    """StepGraph.chained (a thread's piece after the piece before, no edge stored) gives the same
    topological order, cycles dropped, runs and replayed times as the same edges written out."""
    cycles = 0
    for seed in range(200):
        a, b = _random_graph(random.Random(seed), True), _random_graph(random.Random(seed), False)
        cycles += -math.inf in b.lag
        assert len(a.pred) < len(b.pred) or not any(a.chained)
        assert (list(a.heads), list(a.ends)) == (list(b.heads), list(b.ends)), seed
        ra, rb = replay(a), replay(b)
        assert (list(ra.start), list(ra.finish)) == (list(rb.start), list(rb.finish)), seed
        assert [binding(a, ra, i) for i in range(a.n)] == [binding(b, rb, i) for i in range(b.n)], seed
    assert cycles > 20  # timestamps that contradict each other: edges dropped, chained ones too


def _node_by_node(g: StepGraph) -> tuple[list[float], list[int]]:
    """Each node's start and binding predecessor, one node at a time in the replay's order (a run's nodes
    after their head), every edge written out: the latest predecessor's finish (or start) plus its lag,
    the first of equals; the recorded start when none binds."""
    start, why = [0.0] * g.n, [-1] * g.n
    for head, end in zip(g.heads, g.ends, strict=True):
        for i in range(head, end):
            edges = [(i - 1, 0.0, False)] if g.chained[i] else []
            edges += [(g.pred[e], g.lag[e], g.from_start[e]) for e in range(g.ptr[i], g.ptr[i + 1])]
            best, w = -math.inf, -1
            for p, lag, from_start in edges:
                v = (start[p] if from_start else start[p] + g.dur[p]) + lag
                if v > best:
                    best, w = v, p
            start[i], why[i] = (best, w) if w >= 0 else (g.start[i], -1)
    return start, why


def test_the_binding_predecessors_are_the_node_by_node_replays():
    """binding() (the critical path's step back, found again for the nodes on it) names the predecessor a
    node-by-node replay takes each start from, on random graphs with cycles, chained edges implicit or
    written out."""
    for seed in range(200):
        for implicit in (True, False):
            g = _random_graph(random.Random(seed), implicit)
            r = replay(g)
            start, why = _node_by_node(g)
            assert list(r.start) == start, seed
            assert [binding(g, r, i) for i in range(g.n)] == why, seed
