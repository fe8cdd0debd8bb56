"""The event tree's building blocks on hand-made tables (opscope.analysis.events): thread numbering, nesting
and containment with their tie rules, step assignment at the boundaries, and one small trace through
build_events with every number worked out by hand."""

from __future__ import annotations

import random
from types import SimpleNamespace

from opscope.analysis.events import assign_steps, build_events, innermost, nest, thread_keys


def test_threads_are_numbered_in_order_of_first_appearance():
    # sorted, (1, 7) would come after (1, 3); first appearance puts it first
    assert thread_keys([1, 1, 1, 2, 1], [7, 3, 7, 3, 3]) == [0, 1, 0, 2, 1]
    assert thread_keys([], []) == []


def test_nest_tie_rules():
    keys = [0, 0, 0, 0, 1, 0]
    starts = [0.0, 0.0, 0.0, 9.9995, 1.0, 2.0]
    ends = [5.0, 10.0, 10.0, 12.0, 2.0, 3.0]
    # same start: the longer one encloses; the same interval twice: the first is the parent;
    # a start less than 1 ns before an end is after it (timestamps' resolution: 3 is no child of 1 or 2);
    # 4 is on another thread
    assert nest(keys, starts, ends) == [2, -1, 1, -1, -1, 0]
    assert nest([], [], []) == []


def test_innermost_tie_rules():
    c_keys, c_starts, c_ends = [0, 0, 0], [0.0, 0.0, 4.0], [10.0, 6.0, 6.0]
    # a point at a container's start is inside it (the shorter of two starting there); at its end it
    # is not; on another key nothing holds it
    points = [0.0, 4.0, 6.0, 10.0, 5.0]
    keys = [0, 0, 0, 0, 1]
    assert list(innermost(c_keys, c_starts, c_ends, keys, points)) == [1, 2, 0, -1, -1]
    assert list(innermost([], [], [], [0], [1.0])) == [-1]


def _innermost_one_sort(c_keys, c_starts, c_ends, p_keys, p_times):
    """innermost() as it was first written: containers and points in one sort, one stack."""
    n_c = len(c_starts)
    items = sorted([(k, s, 0, -e, i) for i, (k, s, e) in enumerate(zip(c_keys, c_starts, c_ends, strict=True))]
                   + [(k, t, 1, 0.0, n_c + j) for j, (k, t) in enumerate(zip(p_keys, p_times, strict=True))])
    result, stack, cur = [-1] * len(p_times), [], None
    for k, t, is_point, _, i in items:
        if k != cur:
            stack, cur = [], k
        while stack and c_ends[stack[-1]] <= t:
            stack.pop()
        if not is_point:
            stack.append(i)
        elif stack:
            result[i - n_c] = stack[-1]
    return result


def test_innermost_merge_equals_one_sort():
    # the two sides sorted apart and merged give what one sort of both gave, overlaps and ties included
    rng = random.Random(7)
    for _ in range(2000):
        n_c, n_p = rng.randint(0, 10), rng.randint(0, 10)
        c_keys = [rng.randint(0, 2) for _ in range(n_c)]
        c_starts = [float(rng.randint(0, 8)) for _ in range(n_c)]
        c_ends = [s + rng.randint(0, 5) for s in c_starts]
        p_keys = [rng.randint(0, 2) for _ in range(n_p)]
        p_times = [float(rng.randint(0, 12)) for _ in range(n_p)]
        args = (c_keys, c_starts, c_ends, p_keys, p_times)
        assert list(innermost(*args)) == _innermost_one_sort(*args), args


def test_steps_start_inclusive_end_exclusive():
    trace = SimpleNamespace(steps={"ts": [10.0, 20.0], "dur": [5.0, 5.0]})
    assert list(assign_steps(trace, [9.0, 10.0, 14.9, 15.0, 20.0, 26.0])) == [-1, 0, 0, -1, 1, -1]
    assert list(assign_steps(SimpleNamespace(steps={"ts": [], "dur": []}), [1.0, 2.0])) == [0, 0]


def _intervals(rows: list[tuple]) -> dict[str, list]:
    return {c: [r[k] for r in rows] for k, c in enumerate(("name", "pid", "tid", "ts", "dur"))}


def test_build_events_by_hand():
    # thread (1, 7): linear [0, 10) holding addmm [1, 7) and t [8, 9); thread (1, 3): autograd's
    # evaluate_function [2, 7) holding mm [3, 5). Listed interleaved.
    ops = _intervals([("aten::linear", 1, 7, 0.0, 10.0),
                      ("autograd::engine::evaluate_function: AddmmBackward0", 1, 3, 2.0, 5.0),
                      ("aten::addmm", 1, 7, 1.0, 6.0), ("aten::mm", 1, 3, 3.0, 2.0), ("aten::t", 1, 7, 8.0, 1.0)])
    n = 5
    ops.update({c: [""] * n for c in ("input_dims", "input_dtypes", "input_strides", "concrete_inputs", "call_stack")})
    ops.update(ext_id=[-1] * n, seq=[-1] * n)
    # kernels: one launched inside addmm, one inside mm, one by a graph launch at 9.5 (inside linear,
    # after t), one whose launch is not in the trace
    launches = _intervals([("cudaLaunchKernel", 1, 7, 2.0, 0.5), ("cudaLaunchKernel", 1, 3, 4.0, 0.5),
                           ("cudaGraphLaunch", 1, 7, 9.5, 0.2)])
    launches["correlation"] = [100, 101, 102]
    kernels = {"cat": ["kernel"] * 4, "name": ["gemm_a", "gemm_b", "graph_k", "lost_k"],
               "ts": [20.0, 21.0, 22.0, 23.0], "dur": [4.0, 2.5, 1.0, 0.5],
               "correlation": [100, 101, 102, 999], "ext_id": [-1] * 4}
    empty = _intervals([])
    # torch.optim's step range around t only: it names the optimizer whose step ran an op
    optimizer_step = _intervals([("Optimizer.step#AdamW.step", 1, 7, 7.5, 1.7)])
    trace = SimpleNamespace(ops=ops, kernels=kernels, launches=launches, python=empty, annotations=optimizer_step,
                            modules=empty, steps={"ts": [0.0], "dur": [8.0]}, module_classes={})
    ev = build_events(trace)

    assert list(ev) == [*ops, "end", "thread", "parent", "is_row", "folded", "row_kind", "compiled_graph", "depth",
                        "row_anc", "bwd_root", "row_parent", "self_us", "step", "device_us", "kernels", "n_kernels",
                        "dispatch_input_types", "source_location", "module", "module_class", "optimizer"]
    assert ev["optimizer"] == ["", "", "", "", "AdamW"]
    assert ev["thread"] == [0, 1, 0, 1, 0]
    assert ev["parent"] == [-1, -1, 0, 1, 0]
    assert ev["is_row"] == [True, False, True, True, True]
    assert ev["bwd_root"] == [-1, 1, -1, 1, -1]
    assert ev["row_parent"] == [-1, -1, 0, -1, 0]
    # linear: 10 - addmm 6 - t 1; evaluate_function: 5 - mm 2
    assert ev["self_us"] == [3.0, 3.0, 6.0, 2.0, 1.0]
    assert ev["step"] == [0, 0, 0, 0, -1]  # t starts at the step's end
    assert ev["device_us"] == [0.0, 0.0, 4.0, 2.5, 0.0]
    assert ev["n_kernels"] == [0, 0, 1, 1, 0]
    assert ev["kernels"] == ["", "", "gemm_a", "gemm_b", ""]
    k = trace.kernels
    assert k["op"] == [2, 3, -1, -1]
    assert k["kernel_row"] == [False, False, True, False]
    assert k["launcher_op"] == [-1, -1, 0, -1] and k["launcher"] == ["", "", "aten::linear", ""]
    assert k["graph_launch"] == [-1, -1, 2, -1]
    assert k["backlog"] == [False] * 4  # lost_k's correlation is newer than the trace's launches: not a backlog
    assert list(k)[-9:] == ["op", "kernel_row", "launcher_op", "launcher_ann", "launcher", "graph_launch", "backlog",
                            "family", "launcher_loc"]


def test_an_events_kernel_names_are_each_once_in_the_order_first_credited():
    from array import array

    from opscope.analysis.events import _kernel_names

    names = ["gemm", "relu", "copy"]
    # credits (event, name) as they came: event 3 gets relu, gemm, relu; event 0 copy; event 3 gemm again
    out = _kernel_names(5, array("i", [3, 3, 0, 3, 3]), array("i", [1, 0, 2, 1, 0]), names)
    assert out == ["copy", "", "", "relu;gemm", ""]
    same = _kernel_names(3, array("i", [0, 2]), array("i", [1, 1]), names)
    assert same == ["relu", "", "relu"] and same[0] is same[2]  # one string per distinct text
