"""Run-to-run comparison (`opscope compare A B`, `opscope report B --baseline A`). Torch-free: it reads
two run directories (opscope.run.Run) and nothing else.

Matching. Op rows are grouped by (op, input dims, input dtypes, input strides, module): the same work,
wherever the code that issues it moved (a fix that adds or removes lines shifts every line number below
it). Rows left unmatched are grouped again by (op, source line), which pairs an op whose inputs changed
at the same line (the fix made a strided input contiguous). What is still unmatched appeared or vanished.
Times are per step, so runs with different `--steps` compare.

Noise. A change is real only when it is larger than the runs' own step-to-step spread: the noise band
is 2 x the larger `step_time_cv` of the two runs (about 95 % of one step's spread), the documented
DEFAULT_BAND when neither run measured it, at least NOISY_BAND when either run's `noise.verdict` is
"noisy", and never under MIN_BAND. A time B is "within noise" of A when B / A lies in
[1 / (1 + band), 1 + band].
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import PurePath
from typing import Any

from opscope import units
from opscope.run.model import Run
from opscope.table import pairwise_sum, records
from opscope.units import number

# Step-time spread assumed when neither run measured it: timings of the same run on a shared machine
# move by about +-10 % (docs/benchmarks.md).
DEFAULT_BAND = 0.10
NOISY_BAND = 0.25  # a run whose own noise verdict is "noisy": other processes took CPU time during it
MIN_BAND = 0.02  # even on a quiet machine, per-op times move by a percent or two run to run

FASTER, SLOWER, SAME, APPEARED, VANISHED = "faster", "slower", "within noise", "appeared", "vanished"


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


@dataclass
class OpChange:
    """One matched (or unmatched) group of op rows. Times and calls are per step."""

    op: str
    input_dims: str
    input_dtypes: str
    input_strides: str
    module: str
    source_a: str
    source_b: str
    matched_by: str  # "inputs" (op, dims, dtypes, strides, module), "line" (op, source line) or ""
    calls_a: float
    calls_b: float
    time_a_us: float
    time_b_us: float
    verdict: str

    @property
    def delta_us(self) -> float:
        return self.time_b_us - self.time_a_us

    @property
    def ratio(self) -> float | None:
        return self.time_b_us / self.time_a_us if self.time_a_us > 0 else None

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "delta_us": self.delta_us, "ratio": self.ratio}


@dataclass
class ModuleChange:
    """One module's time per step in A and B (modules.csv: its own ops and its submodules'), and how many
    op rows it issued itself: eager vs compiled shows here what compile did per module (faster, slower,
    its ops fused into fewer kernels, or fused away into another module's kernel)."""

    module: str
    module_class: str
    depth: int
    time_a_us: float
    time_b_us: float
    rows_a: int
    rows_b: int
    verdict: str

    @property
    def ratio(self) -> float | None:
        return self.time_b_us / self.time_a_us if self.time_a_us > 0 else None

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ratio": self.ratio}


@dataclass
class FindingChange:
    rule: str
    op: str
    source_location: str
    severity: str
    message: str
    est_savings_us: float | None


@dataclass
class Comparison:
    """B against A (A is the baseline)."""

    run_a: str
    run_b: str
    target_a: str
    target_b: str
    steps_a: int
    steps_b: int
    step_time_a_us: float | None
    step_time_b_us: float | None
    step_time_key: str  # which summary key the step times come from
    op_time_a_us: float  # per step, summed over op rows
    op_time_b_us: float
    band: float
    band_reason: str
    ops: list[OpChange] = field(default_factory=list)
    findings_fixed: list[FindingChange] = field(default_factory=list)
    findings_introduced: list[FindingChange] = field(default_factory=list)
    findings_kept: int = 0
    notes: list[str] = field(default_factory=list)
    modules: list[ModuleChange] = field(default_factory=list)

    @property
    def step_ratio(self) -> float | None:
        a, b = self.step_time_a_us, self.step_time_b_us
        return b / a if a and b is not None and a > 0 else None

    @property
    def op_time_ratio(self) -> float | None:
        return self.op_time_b_us / self.op_time_a_us if self.op_time_a_us > 0 else None

    @property
    def step_verdict(self) -> str | None:
        if self.step_time_a_us is None or self.step_time_b_us is None:
            return None
        return verdict(self.step_time_a_us, self.step_time_b_us, self.band)

    @property
    def op_time_verdict(self) -> str:
        return verdict(self.op_time_a_us, self.op_time_b_us, self.band)

    def by_verdict(self, *verdicts: str) -> list[OpChange]:
        return [c for c in self.ops if c.verdict in verdicts]

    def __repr__(self) -> str:
        # a notebook prints this: a line, not every op row (a comparison's dataclass repr runs to 200 KB)
        ratio = self.step_ratio
        step = (f"step {units.duration(self.step_time_a_us)} → {units.duration(self.step_time_b_us)} "
                f"({ratio:.2f}x, {self.step_verdict})" if ratio is not None else "step time unknown")
        counts = ", ".join(f"{n} {v}" for v in (SLOWER, FASTER, VANISHED, APPEARED) if (n := len(self.by_verdict(v))))
        a, b = (PurePath(x).name or x for x in (self.run_a, self.run_b))  # the run directories' names
        return (f"<opscope.Comparison {b} against {a}: {step}; op rows: {counts or 'none changed'}; "
                f"findings {len(self.findings_fixed)} fixed, {len(self.findings_introduced)} introduced>")

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["ops"] = [c.to_json() for c in self.ops]
        doc["modules"] = [m.to_json() for m in self.modules]
        doc.update(step_ratio=self.step_ratio, step_verdict=self.step_verdict,
                   op_time_ratio=self.op_time_ratio, op_time_verdict=self.op_time_verdict)
        return doc


def verdict(a: float, b: float, band: float) -> str:
    """SLOWER, FASTER or SAME ("within noise") for a time b against a baseline a."""
    if a <= 0:
        return SAME if b <= 0 else SLOWER
    ratio = b / a
    if ratio > 1 + band:
        return SLOWER
    if ratio < 1 / (1 + band):
        return FASTER
    return SAME


def noise_band(a: Run, b: Run) -> tuple[float, str]:
    """(band, the reason in words): see the module docstring."""
    cvs = [cv for cv in (number(r.summary.get("step_time_cv")) for r in (a, b)) if cv is not None and cv >= 0]
    if cvs:
        band, reason = 2 * max(cvs), f"2 x the larger step-time CV ({max(cvs):.1%})"
    else:
        band, reason = DEFAULT_BAND, "default: the runs did not measure their step-time spread"
    noisy = [name for name, r in (("A", a), ("B", b))
             if isinstance(r.summary.get("noise"), dict) and r.summary["noise"].get("verdict") == "noisy"]
    if noisy and band < NOISY_BAND:
        band, reason = NOISY_BAND, f"run {' and '.join(noisy)} noisy (other processes used the CPU)"
    if band < MIN_BAND:
        band, reason = MIN_BAND, f"{reason}, raised to the {MIN_BAND:.0%} floor"
    return band, reason


def step_times(a: Run, b: Run) -> tuple[float | None, float | None, str]:
    """Both runs' step times from the same summary key: the median (`step_time_us_p50`) when both runs
    have it, else the mean (`step_time_us`)."""
    for key in ("step_time_us_p50", "step_time_us"):
        ta, tb = number(a.summary.get(key)), number(b.summary.get(key))
        if ta is not None and tb is not None:
            return ta, tb, key
    return number(a.summary.get("step_time_us")), number(b.summary.get("step_time_us")), "step_time_us"


def _steps(run: Run) -> int:
    steps = run.summary.get("steps")
    return steps if isinstance(steps, int) and not isinstance(steps, bool) and steps > 0 else 1


@dataclass
class _Group:
    rows: list[dict[str, Any]]

    def time(self, steps: int) -> float:
        return sum(number(r.get("time_us_total")) or 0.0 for r in self.rows) / steps

    def calls(self, steps: int) -> float:
        return sum(number(r.get("calls")) or 0.0 for r in self.rows) / steps

    def source(self) -> str:
        """The source line of the group's heaviest row (rows arrive sorted by time)."""
        return next((_text(r.get("source_location")) for r in self.rows if _text(r.get("source_location"))), "")


def _input_key(row: dict[str, Any]) -> tuple[str, ...]:
    return tuple(_text(row.get(c)) for c in ("op", "input_dims", "input_dtypes", "input_strides", "module"))


def _line_key(row: dict[str, Any]) -> tuple[str, ...]:
    return _text(row.get("op")), _text(row.get("source_location"))


def _group(rows: list[dict[str, Any]], key: Callable[[dict[str, Any]], tuple[str, ...]]) -> dict[tuple[str, ...], _Group]:
    groups: dict[tuple[str, ...], _Group] = {}
    for row in rows:
        groups.setdefault(key(row), _Group([])).rows.append(row)
    return groups


def match_ops(a: Run, b: Run, band: float) -> list[OpChange]:
    """Per-op changes, largest absolute change per step first."""
    sa, sb = _steps(a), _steps(b)
    rows_a, rows_b = records(a.ops), records(b.ops)
    changes: list[OpChange] = []

    def change(ga: _Group | None, gb: _Group | None, matched_by: str) -> OpChange:
        group = gb or ga
        assert group is not None  # a change has a group in A, in B or in both
        row = group.rows[0]
        ta, tb = (ga.time(sa) if ga else 0.0), (gb.time(sb) if gb else 0.0)
        v = verdict(ta, tb, band) if ga and gb else (APPEARED if gb else VANISHED)
        return OpChange(op=_text(row.get("op")), input_dims=_text(row.get("input_dims")),
                        input_dtypes=_text(row.get("input_dtypes")), input_strides=_text(row.get("input_strides")),
                        module=_text(row.get("module")), source_a=ga.source() if ga else "",
                        source_b=gb.source() if gb else "", matched_by=matched_by,
                        calls_a=ga.calls(sa) if ga else 0.0, calls_b=gb.calls(sb) if gb else 0.0,
                        time_a_us=ta, time_b_us=tb, verdict=v)

    by_inputs_a, by_inputs_b = _group(rows_a, _input_key), _group(rows_b, _input_key)
    for key in by_inputs_a.keys() & by_inputs_b.keys():
        changes.append(change(by_inputs_a[key], by_inputs_b[key], "inputs"))
    left_a = [r for k, g in by_inputs_a.items() if k not in by_inputs_b for r in g.rows]
    left_b = [r for k, g in by_inputs_b.items() if k not in by_inputs_a for r in g.rows]
    by_line_a, by_line_b = _group(left_a, _line_key), _group(left_b, _line_key)
    for key in by_line_a.keys() & by_line_b.keys():
        changes.append(change(by_line_a[key], by_line_b[key], "line"))
    for key, g in by_line_a.items():
        if key not in by_line_b:
            changes.extend(change(ga, None, "") for ga in _group(g.rows, _input_key).values())
    for key, g in by_line_b.items():
        if key not in by_line_a:
            changes.extend(change(None, gb, "") for gb in _group(g.rows, _input_key).values())
    changes.sort(key=lambda c: (-abs(c.delta_us), c.op, c.input_dims))
    return changes


def _finding(f: dict[str, Any]) -> FindingChange:
    return FindingChange(rule=_text(f.get("rule")), op=_text(f.get("op")),
                         source_location=_text(f.get("source_location")), severity=_text(f.get("severity")),
                         message=_text(f.get("message")), est_savings_us=number(f.get("est_savings_us")))


def match_findings(a: Run, b: Run) -> tuple[list[FindingChange], list[FindingChange], int]:
    """(fixed: in A only, introduced: in B only, kept). A finding is the same when its rule, op and source
    line agree; leftovers are paired by rule, op and file (the line moved with an edit)."""
    fa, fb = [_finding(f) for f in a.findings], [_finding(f) for f in b.findings]

    def pair(left_a: list[FindingChange], left_b: list[FindingChange], key: Callable[[FindingChange], tuple[str, ...]]
             ) -> tuple[list[FindingChange], list[FindingChange], int]:
        pool: dict[tuple[str, ...], list[FindingChange]] = {}
        for f in left_b:
            pool.setdefault(key(f), []).append(f)
        kept = 0
        rest_a: list[FindingChange] = []
        for f in left_a:
            same = pool.get(key(f))
            if same:
                same.pop(0)
                kept += 1
            else:
                rest_a.append(f)
        return rest_a, [f for fs in pool.values() for f in fs], kept

    rest_a, rest_b, kept = pair(fa, fb, lambda f: (f.rule, f.op, f.source_location))
    rest_a, rest_b, moved = pair(rest_a, rest_b, lambda f: (f.rule, f.op, f.source_location.rpartition(":")[0]))
    order = {id(f): i for i, f in enumerate(fb)}
    rest_b.sort(key=lambda f: order[id(f)])  # B's order: by estimated saving
    return rest_a, rest_b, kept + moved


def compare_runs(a: Run, b: Run) -> Comparison:
    """B against the baseline A."""
    band, reason = noise_band(a, b)
    ta, tb, key = step_times(a, b)
    sa, sb = _steps(a), _steps(b)
    fixed, introduced, kept = match_findings(a, b)
    return Comparison(
        run_a=str(a.path or ""), run_b=str(b.path or ""), target_a=_text(a.meta.get("target")),
        target_b=_text(b.meta.get("target")), steps_a=sa, steps_b=sb, step_time_a_us=ta, step_time_b_us=tb,
        step_time_key=key, op_time_a_us=_op_time(a) / sa, op_time_b_us=_op_time(b) / sb, band=band,
        band_reason=reason, ops=match_ops(a, b, band), findings_fixed=fixed, findings_introduced=introduced,
        findings_kept=kept, notes=_notes(a, b), modules=match_modules(a, b, band))


# torch.compile's wrapper: an OptimizedModule holds the user's module as `_orig_mod`
COMPILE_WRAPPER = "_orig_mod"


def module_key(path: str) -> str:
    """A module's path with torch.compile's wrapper level taken out, so that an eager and a compiled run of
    the same model name their modules alike."""
    return ".".join(p for p in path.split(".") if p and p != COMPILE_WRAPPER)


def match_modules(a: Run, b: Run, band: float) -> list[ModuleChange]:
    """Per module (by path, torch.compile's wrapper level ignored), time per step in A and B; modules in
    one run only appear or vanish. Depth-first order as modules.csv lists them, B's new modules last."""
    sa, sb = _steps(a), _steps(b)

    def table(run: Run, steps: int) -> dict[str, tuple[str, int, float]]:
        out: dict[str, tuple[str, int, float]] = {}
        mods = run.modules
        if mods is None or "module" not in mods:
            return out
        for r in records(mods):
            key = module_key(_text(r.get("module")))
            cls = _text(r.get("module_class"))
            if key == "" and cls == "OptimizedModule":
                continue  # the wrapper itself: its time is its module's
            t = float(r.get("time_us_total") or 0.0) / steps
            prev = out.get(key)
            out[key] = (cls or (prev[0] if prev else ""), key.count(".") + (1 if key else 0), max(t, prev[2] if prev else 0.0))
        return out

    def rows(run: Run) -> dict[str, int]:
        counts: dict[str, int] = {}
        if "module" in run.ops:
            for m in run.ops["module"]:
                k = module_key(_text(m))
                counts[k] = counts.get(k, 0) + 1
        return counts

    ta, tb = table(a, sa), table(b, sb)
    ra, rb = rows(a), rows(b)
    out = []
    for key in list(ta) + [k for k in tb if k not in ta]:
        in_a, in_b = key in ta, key in tb
        time_a = ta[key][2] if in_a else 0.0
        time_b = tb[key][2] if in_b else 0.0
        v = verdict(time_a, time_b, band) if in_a and in_b else (VANISHED if in_a else APPEARED)
        cls, depth = (ta.get(key) or tb[key])[:2]
        out.append(ModuleChange(key, cls, depth, time_a, time_b, ra.get(key, 0), rb.get(key, 0), v))
    return out


def _op_time(run: Run) -> float:
    if "time_us_total" not in run.ops:
        return 0.0
    return pairwise_sum(run.ops["time_us_total"])


def _notes(a: Run, b: Run) -> list[str]:
    """Differences that make the comparison less like-for-like."""
    notes = []
    da, db = a.meta.get("device") or {}, b.meta.get("device") or {}
    if (da.get("type"), da.get("name")) != (db.get("type"), db.get("name")):
        notes.append(f"different devices: A ran on {da.get('type')}: {da.get('name')}, "
                     f"B on {db.get('type')}: {db.get('name')}")
    for key in ("dtype", "mode"):
        if a.meta.get(key) != b.meta.get(key):
            notes.append(f"different {key}: A {a.meta.get(key)}, B {b.meta.get(key)}")
    if a.meta.get("threads") != b.meta.get("threads") and a.meta.get("threads") and b.meta.get("threads"):
        notes.append(f"different thread counts: A {a.meta.get('threads')}, B {b.meta.get('threads')}")
    return notes


def regressed(comparison: Comparison, fail_above: float) -> bool:
    """The CI gate: B's step time is more than `fail_above` x A's."""
    ratio = comparison.step_ratio
    return ratio is not None and ratio > fail_above
