"""Memory from torch.profiler's `[memory]` events (profile_memory=True): per op row the bytes allocated
and freed, per step the peak allocated memory, the op during which it was reached and the tensors alive
at that moment (by the op, line and module that allocated them), and what each step leaves allocated
for the `memory-growth` rule. Torch-free: `profile` records the events in an untimed pass of its own
(never in the timed pass), `analyze` reads them from the trace when it has them.

Attribution. A `[memory]` event belongs to the innermost op row running on its thread at that moment:
an allocation to the op that made the tensor, a free to the op during which the last reference went
(frees between ops, when Python drops a tensor, belong to no row). An allocation-only op called inside
another op (`aten::empty` making a kernel's output) passes its events up to that op: it asked for the
memory. Each event counts once.

What the numbers cover. On CUDA, "Total Allocated" is the caching allocator's count of live tensor
bytes on the device. On the CPU, torch counts only memory allocated while the profiler records: tensors
alive from before (parameters, inputs, what an earlier step kept) are not in it, and their frees are not
recorded either; so CPU peaks are above the memory at the start of the recording.
"""

from __future__ import annotations

import math
import statistics
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

from opscope.analysis.events import assign_steps, innermost
from opscope.analysis.gpu_timeline import Windows, step_windows
from opscope.table import INDEX, Table, factorize, filled, nrows, sort_order, take_compact
from opscope.trace.reader import TraceData

CPU_DEVICE = 0  # c10::DeviceType
DEVICE_NAMES = {0: "cpu", 1: "cuda", 6: "rocm"}
TOP_ALIVE = 10  # groups of tensors listed as alive at the run's peak (per step: TOP_ALIVE_STEP)
TOP_ALIVE_STEP = 5
MEMORY_COLUMNS = ("alloc_bytes_per_call", "freed_bytes_per_call")  # ops.csv, after the module columns
KEY_COLUMNS = ("name", "input_dims", "input_dtypes", "input_strides", "concrete_inputs", "source_location", "module")
RowKey = tuple[str, ...]  # an ops.csv row's KEY_COLUMNS values
CPU_NOTE = ("CPU: torch counts only memory allocated while the profiler records; tensors alive from before "
            "(parameters, inputs, what an earlier step kept) are not in these numbers")


@dataclass
class MemoryProfile:
    """What the memory events say, ready for ops.csv, summary.json and the memory-growth rule."""

    # ops.csv row key (op, input dims, dtypes, strides, concrete inputs, source line, module) ->
    # (bytes allocated, bytes freed, calls) summed over the recorded calls of that row
    per_key: dict[RowKey, tuple[float, float, int]]
    summary: dict[str, Any]  # summary.json "memory"
    # allocations of each step still alive when the recording ended, grouped by the row that made them:
    # {"step", "op", "source_location", "module", "bytes", "tensors"}
    retained: list[dict[str, Any]] = field(default_factory=list)
    steps: int = 0
    # (times, allocated bytes after each event) on the recording's own clock, and its steps (ProfilerStep
    # windows, None without them): the memory curve of the report's timeline (opscope.analysis.timeline)
    # (typed arrays: two floats an event, where lists held a pointer and a float object each: 60 bytes)
    curve: tuple[Sequence[float], Sequence[float]] = field(default_factory=lambda: (array("d"), array("d")))
    windows: Windows | None = None


def memory_profile(trace: TraceData, ev: Table, source: str) -> MemoryProfile | None:
    """The memory profile of a trace with `[memory]` events (None without them). `ev` is the trace's
    event table (analysis.events.build_events); `source` says where the events came from ("memory pass"
    for profile's own untimed pass, "trace")."""
    mem = trace.memory
    if mem is None or not nrows(mem):
        return None
    device, device_id = _device(mem, trace.has_gpu)
    mine = [i for i, (t, d) in enumerate(zip(mem["device_type"], mem["device_id"], strict=True))
            if t == device and d == device_id]
    if not mine:
        return None
    mem_ts = mem["ts"]
    used = {c: mem[c] for c in ("ts", "bytes", "addr", "total_allocated", "pid", "tid")}
    if len(mine) == nrows(mem) and isinstance(sort_order(len(mine), ((mem_ts, False),)), range):
        mem = used  # every event of this device, in time order already (as a profiler writes them): no copy
    else:
        # stable: events at the same time keep their order
        mem = take_compact(used, array(INDEX, sorted(mine, key=mem_ts.__getitem__)))
    del mine
    ts = mem["ts"]
    nbytes = array("d", (float(b) for b in mem["bytes"]))
    addr = mem["addr"]
    level = array("d")  # allocated bytes after each event: the trace's count, else the running sum of the events
    running = 0.0
    for b, t in zip(nbytes, mem["total_allocated"], strict=True):
        running = b if not level else running + b
        level.append(float(t) if math.isfinite(t) else running)

    # the op row each event happened in
    n_ev = nrows(ev)
    # one thread numbering for events and memory events, without a concatenated copy of their columns
    threads = factorize(zip(chain(ev["pid"], mem["pid"]), chain(ev["tid"], mem["tid"]), strict=True))[0]
    op = innermost(threads[:n_ev], ev["ts"], ev["end"], threads[n_ev:], ts)
    del threads
    row = _charged_rows(ev, op)

    step = array(INDEX, (int(s) for s in assign_steps(trace, ts)))
    codes, distinct = _row_keys(ev)
    per_key = _per_key(ev, codes, distinct, row, nbytes)
    del codes, distinct

    names = ev["name"]
    locs = ev["source_location"]
    modules = ev["module"] if "module" in ev else [""] * n_ev
    classes = ev["module_class"] if "module_class" in ev else [""] * n_ev

    def who(r: int) -> dict[str, Any]:
        if r < 0:
            return {"op": None, "source_location": None, "module": None}
        return {"op": names[r], "source_location": locs[r] or None, "module": modules[r] if classes[r] else None}

    step_ids = sorted({s for s in step if s >= 0})
    peak_at: dict[int, int] = {}  # step -> index of the event at its peak (the first, on a tie)
    end_at: dict[int, int] = {}
    for i, s in enumerate(step):
        if s >= 0:
            if s not in peak_at or level[i] > level[peak_at[s]]:
                peak_at[s] = i
            end_at[s] = i
    snapshots: dict[int, dict[int, tuple[float, int]]] = {}  # event index -> alive bytes by allocating row
    snap_points = {i: s for s, i in peak_at.items()}
    alive: dict[int, tuple[float, int, int]] = {}  # addr -> (bytes, allocating row, step)
    for i, (b, a) in enumerate(zip(nbytes, addr, strict=True)):
        if b > 0:
            alive[a] = (b, row[i], step[i])
        elif b < 0:
            alive.pop(a, None)
        if i in snap_points:
            snapshots[i] = _by_row(alive.values())

    per_step = []
    for s in step_ids:
        i = peak_at[s]
        groups = _groups(snapshots[i], who)
        per_step.append({"step": s, "peak_allocated_bytes": level[i],
                         "end_allocated_bytes": level[end_at[s]],
                         **{f"peak_{k}": v for k, v in who(row[i]).items()},
                         "alive_at_peak": groups[:TOP_ALIVE_STEP]})
    summary: dict[str, Any] = {"source": source, "device": DEVICE_NAMES.get(device, str(device)),
                               "steps": len(step_ids)}
    if per_step:
        top = max(per_step, key=lambda p: p["peak_allocated_bytes"])
        i = peak_at[top["step"]]
        groups = _groups(snapshots[i], who)
        listed = sum(g["bytes"] for g in groups)
        summary.update({
            "peak_allocated_bytes": top["peak_allocated_bytes"],
            "peak_step": top["step"],
            "peak_op": top["peak_op"], "peak_source_location": top["peak_source_location"],
            "peak_module": top["peak_module"],
            "alive_at_peak": groups[:TOP_ALIVE],
            # alive at the peak but allocated before the recording, or not by any op row
            "alive_at_peak_other_bytes": max(level[i] - listed, 0.0),
        })
        ends = [p["end_allocated_bytes"] for p in per_step]
        if len(ends) >= 2:
            summary["growth_bytes_per_step"] = statistics.median(b - a for a, b in zip(ends, ends[1:], strict=False))
    summary["per_step"] = per_step
    if device == CPU_DEVICE:
        summary["note"] = CPU_NOTE

    retained: dict[tuple[int, int], tuple[float, int]] = {}
    for b, r, s in alive.values():
        if s >= 0:
            got = retained.get((s, r), (0.0, 0))
            retained[(s, r)] = (got[0] + b, got[1] + 1)
    retained_list = [{"step": s, **who(r), "bytes": b, "tensors": n}
                     for (s, r), (b, n) in sorted(retained.items(), key=lambda kv: (kv[0][0], -kv[1][0]))]
    return MemoryProfile(per_key=per_key, summary=summary, retained=retained_list, steps=len(step_ids),
                         curve=(array("d", (float(t) for t in ts)), level), windows=step_windows(trace))



# Ops that only allocate: inside another op they allocate for it (its output or workspace).
ALLOCATORS = frozenset({"aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty",
                        "aten::new_empty_strided", "aten::resize_"})


def _charged_rows(ev: Table, op: Sequence[int]) -> array[int]:
    """Per memory event, the op row it is charged to (-1: none): the innermost row around it, lifted out
    of allocation-only ops nested in another row."""
    row_anc = ev["row_anc"]
    row_parent = ev["row_parent"]
    names = ev["name"]
    lifted: dict[int, int] = {}

    def lift(r: int) -> int:
        if r not in lifted:
            x = r
            while x >= 0 and names[x] in ALLOCATORS and row_parent[x] >= 0:
                x = int(row_parent[x])
            lifted[r] = x
        return lifted[r]

    return array(INDEX, (lift(int(row_anc[o])) if o >= 0 and row_anc[o] >= 0 else -1 for o in op))


def _device(mem: Table, gpu: bool) -> tuple[int, int]:
    """(device type, device id) whose memory the run is about: the GPU's on GPU traces, else the CPU's;
    among several, the one with the most events (the lowest pair on a tie)."""
    counts: dict[tuple[int, int], int] = {}
    for t, d in zip(mem["device_type"], mem["device_id"], strict=True):
        pair = (int(t), int(d))
        counts[pair] = counts.get(pair, 0) + 1
    pairs = sorted(sorted(counts), key=lambda p: -counts[p])
    preferred = [p for p in pairs if (p[0] != CPU_DEVICE) == gpu]
    return (preferred or pairs)[0]


def _row_keys(ev: Table) -> tuple[array[int], list[RowKey]]:
    """Per event, the number of its ops.csv row's key (-1: not a row), and the keys: a tuple per event held
    more memory than the event table (70 MiB of a 2.6M-event trace's)."""
    cols = [ev[c] if c in ev else [""] * nrows(ev) for c in KEY_COLUMNS]
    seen: dict[RowKey, int] = {}
    number = seen.setdefault
    codes = array(INDEX, (number(k, len(seen)) if r else -1
                          for k, r in zip(zip(*cols, strict=True), ev["is_row"], strict=True)))
    return codes, list(seen)


def _per_key(ev: Table, codes: array[int], keys: list[RowKey], row: Sequence[int],
             nbytes: Sequence[float]) -> dict[RowKey, tuple[float, float, int]]:
    alloc: dict[int, float] = {}
    freed: dict[int, float] = {}
    for r, b in zip(row, nbytes, strict=True):
        k = codes[r] if r >= 0 else -1
        if k < 0:
            continue
        if b > 0:
            alloc[k] = alloc.get(k, 0.0) + b
        else:
            freed[k] = freed.get(k, 0.0) - b
    calls: dict[int, int] = {}
    steps = ev["step"] if "step" in ev else [0] * len(codes)
    for k, step in zip(codes, steps, strict=True):
        if k >= 0 and step >= 0:
            calls[k] = calls.get(k, 0) + 1
    return {keys[k]: (alloc.get(k, 0.0), freed.get(k, 0.0), n) for k, n in calls.items()}


def _by_row(alive: Iterable[tuple[float, int, int]]) -> dict[int, tuple[float, int]]:
    out: dict[int, tuple[float, int]] = {}
    for b, r, _ in alive:
        got = out.get(r, (0.0, 0))
        out[r] = (got[0] + b, got[1] + 1)
    return out


def _groups(by_row: dict[int, tuple[float, int]], who: Callable[[int], dict[str, Any]]) -> list[dict[str, Any]]:
    """Alive tensors grouped by (op, source line, module) of the row that allocated them, largest first;
    tensors allocated outside any row are left out (they are in the '_other_bytes' remainder)."""
    groups: dict[tuple[Any, Any, Any], dict[str, Any]] = {}  # (op, source line, module) -> alive tensors
    for r, (b, n) in by_row.items():
        if r < 0:
            continue
        w = who(r)
        g = groups.setdefault((w["op"], w["source_location"], w["module"]), {**w, "bytes": 0.0, "tensors": 0})
        g["bytes"] += b
        g["tensors"] += n
    return sorted(groups.values(), key=lambda g: -g["bytes"])


def add_memory_columns(ops: Table, memory: MemoryProfile | None) -> Table:
    """ops.csv's MEMORY_COLUMNS: bytes allocated and freed during one call of the row (mean over the calls
    the memory events cover); empty where they cover none of the row's calls, or the run has none."""
    out = dict(ops)
    n = nrows(ops)
    alloc, freed = [math.nan] * n, [math.nan] * n
    if memory is not None:
        cols = [filled(out[c]) if c in out else [""] * n for c in ("op", *KEY_COLUMNS[1:])]
        for i, key in enumerate(zip(*cols, strict=True)):
            hit = memory.per_key.get(key)
            if hit is not None and hit[2] > 0:
                alloc[i], freed[i] = hit[0] / hit[2], hit[1] / hit[2]
    out[MEMORY_COLUMNS[0]] = alloc
    out[MEMORY_COLUMNS[1]] = freed
    return out

