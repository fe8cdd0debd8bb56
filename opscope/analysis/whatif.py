"""What-if: savings that add up. Builds the step's graph once (opscope.analysis.replay_graph), replays it
unchanged, with each finding's fix alone, and with all of them (opscope.analysis.replay); each replay is
one pass over the graph, so a run's findings cost a pass each, not an analysis each.

Gives every finding its `id` and `critical_path_saving_us` (the profiled steps' time the fix alone
saves, overlaps accounted), summary.json's `whatif` and whatif.json (the critical paths).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opscope.analysis.fixes import Fixer, OpSpeedup, assign_ids
from opscope.analysis.replay import Change, Replay, Steps, critical_path, replay, replay_path, replay_steps
from opscope.analysis.replay_graph import READS, StepGraph, build_graph
from opscope.errors import OpscopeError
from opscope.machine.peaks import Peaks
from opscope.table import Table
from opscope.trace.reader import TraceData

TOP = (1, 3, 5)  # summary.json whatif.top: the first N fixes in the recommended order (and all, when fewer)


@dataclass
class Engine:
    graph: StepGraph
    fixer: Fixer | None  # None where the fixes' changes were made before the graph (run_whatif)
    base: Steps  # the unchanged replay (a Replay until steps_only())
    base_path: list[dict[str, Any]] | None = None  # its critical path, once taken

    def path(self, change: Change) -> tuple[Steps, list[dict[str, Any]]]:
        """The step times and the critical path of the replay with `change` (its node times are not kept;
        the unchanged replay's path is taken once). The step times only: a caller holding the unchanged
        replay itself would keep its node times (12 bytes a node) past steps_only()."""
        if not change.empty:
            return replay_path(self.graph, change)
        if self.base_path is None:
            self.base_path = (critical_path(self.graph, self.base) if isinstance(self.base, Replay)
                              else replay_path(self.graph)[1])
        return Steps(self.base.step_us), self.base_path

    def steps_only(self) -> None:
        """Drops the unchanged replay's node times (28 bytes a node), its critical path taken first: the
        fixes' replays then need only its step times."""
        self.path(Change())
        self.base = Steps(self.base.step_us)

    def steps(self, change: Change | None) -> Steps:
        """The step times of the replay with `change` (without its node arrays)."""
        return self.base if change is None or change.empty else replay_steps(self.graph, change)

    def saving_us(self, change: Change) -> float:
        """Over all profiled steps, what the change saves on the unchanged replay (never below 0: a
        shorter duration cannot delay the step; what is left is rounding)."""
        return max(self.base.total_us - self.steps(change).total_us, 0.0)


def engine(trace: TraceData, ev: Table, peaks: Peaks, gpu: bool) -> Engine:
    g = build_graph(trace, ev)
    return Engine(graph=g, fixer=Fixer(ev, trace.kernels, peaks, gpu), base=replay(g))


@dataclass
class Step:
    """One fix of a recommendation: what it saves on top of those before it, and the step after it."""

    label: str
    marginal_us: float
    predicted_step_us: float


def recommend(e: Engine, fixes: Sequence[tuple[str, Change]], alone: Sequence[float] | None = None,
              limit: int | None = None, exact: bool = False) -> tuple[list[Step], Change]:
    """The fixes in the order to apply them, greedily: the largest saving on top of those already taken
    first. Lazy: each round only the leader by its last known saving (`alone`: each fix's saving on its
    own, when already known) is replayed on top of the fixes taken, until a leader's saving is current.
    The savings reported are exact; the order is greedy where a fix does not gain from another (a kernel
    off the critical path gains once the launch gaps are gone, and is then taken after it). Returns the
    steps and the change with all of them (Engine.path replays it); with `limit`, only the first `limit`
    steps (the change is still the one with every fix). `exact`: every round replays every fix left on top of those taken (n²/2
    replays: for `opscope whatif`, where the order is the answer), so a fix that gains only after another
    is ranked by what it gains then."""
    current = Change()
    now: Steps = e.base
    bound = {k: (alone[k] if alone is not None else e.saving_us(c)) for k, (_, c) in enumerate(fixes)}
    fresh = set(bound)  # savings computed on top of `current`
    tried: dict[int, Steps] = {}  # this round's replays of current + fix (step times only)
    out: list[Step] = []
    while bound:
        if limit is not None and len(out) >= limit:
            for k in bound:
                current = current.combined(fixes[k][1])
            break
        if exact:
            for x in bound:
                if x not in fresh:
                    tried[x] = e.steps(current.combined(fixes[x][1]))
                    bound[x] = max(now.total_us - tried[x].total_us, 0.0)
                    fresh.add(x)
        k = max(bound, key=lambda x: (bound[x], -x))
        if k not in fresh:
            tried[k] = e.steps(current.combined(fixes[k][1]))
            bound[k] = max(now.total_us - tried[k].total_us, 0.0)
            fresh.add(k)
            continue
        current = current.combined(fixes[k][1])
        prev = now
        now = tried[k] if k in tried else e.steps(current)
        out.append(Step(fixes[k][0], max(prev.total_us - now.total_us, 0.0), now.mean_step_us))
        del bound[k]
        fresh, tried = set(), {}
    return out, current


def annotate(e: Engine, findings: list[dict[str, Any]],
             changes: Sequence[Change] | None = None) -> list[tuple[str, Change, float]]:
    """Adds "id" and "critical_path_saving_us" to every finding; returns (id, change, saving) per finding
    (one replay per distinct change; `changes`: each finding's, when made already). When a finding changes
    anything, the unchanged replay keeps only its step times from here on (Engine.steps_only)."""
    assign_ids(findings)
    if changes is None:
        fixer = e.fixer
        assert fixer is not None, "an Engine without its Fixer is given the changes"
        changes = [fixer.finding(f) for f in findings]
    if any(not c.empty for c in changes):  # the fixes' replays then never sit beside its node times
        e.steps_only()
    fixes = []
    done: dict[tuple[Any, ...], float] = {}
    for f, change in zip(findings, changes, strict=True):
        key = change.signature
        if key not in done:
            done[key] = e.saving_us(change)
        f["critical_path_saving_us"] = round(done[key], 3)
        fixes.append((str(f["id"]), change, done[key]))
    return fixes


def run_whatif(trace: TraceData, ev: Table, findings: list[dict[str, Any]], *, peaks: Peaks, gpu: bool,
               step_time_us: float, release: Callable[[Mapping[str, Sequence[str]] | None], None] | None = None,
               ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Annotates the findings; returns (summary.json "whatif", whatif.json). The fixes' changes are made
    first (they name events and kernels, not nodes), then the graph. `release(keep)`, for a run that does
    not keep its tables (opscope.analysis.pipeline.release_tables): called with what the graph reads
    (replay_graph.READS) once the changes are made, then with None once the graph is built: the event
    table is not read after that."""
    fixer = Fixer(ev, trace.kernels, peaks, gpu)
    changes = [fixer.finding(f) for f in findings]  # ids: annotate() gives them
    del fixer
    if release is not None:
        release(READS)
    g = build_graph(trace, ev)
    if release is not None:
        release(None)
    e = Engine(graph=g, fixer=None, base=replay(g))
    path = e.path(Change())[1]
    fixes = [(k, c, saved) for k, c, saved in annotate(e, findings, changes) if not c.empty]
    steps, current = recommend(e, [(k, c) for k, c, _ in fixes], [saved for _, _, saved in fixes], limit=TOP[-1])
    fixed, fixed_path = e.path(current)  # replayed once more for its critical path
    order = [s.label for s in steps]
    sizes = sorted({n for n in TOP if n < len(order)} | ({min(len(order), TOP[-1])} if order else set()))
    top: list[dict[str, Any]] = [{"ids": order[:n], "predicted_step_time_us": round(steps[n - 1].predicted_step_us, 3)}
                                 for n in sizes]
    summary = {
        "recorded_step_time_us": round(step_time_us, 3),
        "replayed_step_time_us": round(e.base.mean_step_us, 3),
        "predicted_step_time_us": round(fixed.mean_step_us, 3),
        "fixes": len(fixes),
        "top": top,
    }
    file = {"critical_path": path, "critical_path_fixed": fixed_path}
    return summary, file


@dataclass
class Outcome:
    """A what-if: the fixes applied in the recommended order and the step after them."""

    recorded_step_us: float
    replayed_step_us: float
    predicted_step_us: float
    steps: int
    applied: list[Step]
    critical_path: list[dict[str, Any]]


def what_if(trace: TraceData, ev: Table, findings: list[dict[str, Any]], fixes: Sequence[str], *, peaks: Peaks,
            recorded_step_us: float, speedups: Sequence[OpSpeedup] = (), remove_gaps: bool = False,
            swaps: Sequence[tuple[str, list[tuple[str, ...]], float]] = ()) -> Outcome:
    """Replays the step with the given findings' fixes (by id; "all" for every finding), the op
    speedups, the launch gaps removed and the swaps (label, the ops.csv keys of the rows its kernel replaces,
    its measured saving over all profiled steps); an OpscopeError names an id the run does not have."""
    if any("id" not in f for f in findings):
        assign_ids(findings)
    by_id = {str(f["id"]): f for f in findings}
    wanted = list(by_id) if "all" in fixes else list(dict.fromkeys(fixes))
    unknown = [k for k in wanted if k not in by_id]
    if unknown:
        known = ", ".join(list(by_id)[:5]) + (", ..." if len(by_id) > 5 else "")
        raise OpscopeError(f"no finding {unknown[0]!r} in this run (its findings: {known or 'none'}; see "
                           "findings.json \"id\")")
    e = engine(trace, ev, peaks, trace.has_gpu)
    fixer = e.fixer
    assert fixer is not None  # engine() gives its Fixer
    changes = [(k, fixer.finding(by_id[k])) for k in wanted]
    changes += [(s.text, fixer.speedup(s)) for s in speedups]
    changes += [(f"swap:{label}", fixer.measured_swap(keys, saving)) for label, keys, saving in swaps]
    if remove_gaps:
        changes.append(("remove-gaps", Change(remove_gaps=True)))
    steps, current = recommend(e, changes, exact=True)
    fixed, path = e.path(current)
    return Outcome(recorded_step_us=recorded_step_us, replayed_step_us=e.base.mean_step_us,
                   predicted_step_us=fixed.mean_step_us, steps=len(e.base.step_us), applied=steps,
                   critical_path=path)
