"""The gate's verdicts: the gated runs' samples against a baseline's, item by item (step time, each op row,
each module, op rows the baseline never had), each with a test, not a ratio.

- A matched item regresses when a one-sided Mann-Whitney U test says its samples are larger than the
  baseline's scaled by (1 + threshold) at the confidence asked, and the ratio of medians is past
  1 + threshold. Step time has one sample per step; an op row or module one per run, so with too few runs
  for the confidence (the test's smallest p above 1 - confidence) it is listed by change, not gated.
- Steps of one run are not independent: they share the run's effects (a fresh large tensor page-faults in
  every step of some processes and in none of others). An item tested on per-step samples pooled over runs
  (step time, op rows whose steps the runs kept) therefore has its threshold widened by its baseline's
  between-run spread, the largest per-run median over the smallest (after the adjustments below): it
  regresses only past (1 + threshold) * spread - 1, in the test and in the ratio of medians; a spread past
  SPREAD_NOTE is stated in the item's reason. Items with one sample per run are tested on runs already.
- A new op row (no baseline run had it by op + line + shapes, op + shapes + module, or op + line)
  regresses when it is in every gated run and the time it adds, its share over the rest of the step, is
  past the threshold.
- Noise: when a run (gated or baseline) measured other processes busy on its machine (summary noise
  verdict "noisy"), every run's times are divided by its load factor: its time on reference op rows over the
  baseline's median time on them. Load slows op kinds unalike (a CPU hog on the SMT sibling or in the shared
  cache slows a memory-bound relu far more than a matmul), so the reference rows depend on the item: for
  step time, all the op rows shared with the baseline; for an op row, the *other* shared rows of its own
  kind (ops.csv bound: compute, memory, overhead, unknown; the baseline's, else the gated runs'; "" where
  neither knows, as in baselines saved before opscope kept it, is one more kind, so that such files gate as
  before), so that its own slowdown does not cancel; for a module, the rows outside it, kind by kind, weighted
  by the module's baseline time in each (the whole model: all rows). An op row whose kind has no other row
  holding PEER_MIN of the shared time (a module: a kind holding MIX_MIN of it with none outside it) is not
  gated on noisy runs: untested, with the reason. Load then cancels; so does a slowdown of the shared rows in
  step time, where new work (new op rows, time outside the ops) is what still shows.
- Machine: when the gated runs' ceilings (memory bandwidth, FLOP/s) differ from the baseline's by more
  than MACHINE_TOLERANCE, the baseline's times are scaled by the ratio.
Every such adjustment is a note in the result: the gate never passes or fails silently."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import PurePath
from typing import Any

from opscope.errors import OpscopeError
from opscope.gating.samples import OpSamples, Samples, op_key
from opscope.gating.stats import mann_whitney_greater, median, ratio_interval

DEFAULT_THRESHOLD = 0.10
DEFAULT_CONFIDENCE = 0.99
MACHINE_TOLERANCE = 0.05  # room for the drift between two calibrations of one machine
MIN_SHARE = 0.01  # op rows and modules under 1% of the op time on both sides are not gated (nor listed)
CULPRITS = 3  # the op rows a step regression names
LEAVE_OUT_MIN = 0.2  # an item is normalized by the load on the other rows while they hold 20% of the time
PEER_MIN = 0.05  # on noisy runs an op row is gated when the other rows of its kind hold 5% of the shared time
MIX_MIN = 0.05  # ... and a module when each kind holding 5% of its time has such rows outside it
SPREAD_NOTE = 1.03  # a baseline between-run spread past 3% is stated in the item's reason

REGRESSION, OK, UNTESTED, NEW, VANISHED = "regression", "ok", "untested", "new", "vanished"


@dataclass(frozen=True)
class Item:
    """One gated item: step time, an op row, a module, or a new op row."""

    kind: str  # step, op, module, new op
    name: str
    verdict: str
    reason: str
    line: str = ""
    module: str = ""
    shapes: str = ""
    before_us: float | None = None  # medians (times per step, after the adjustments in the notes)
    after_us: float | None = None
    ratio: float | None = None
    low: float | None = None  # the ratio's interval at the confidence
    high: float | None = None
    p: float | None = None
    share: float | None = None  # a new op row: its share of the step


@dataclass
class GateResult:
    baseline: str
    threshold: float
    confidence: float
    runs: int
    baseline_runs: int
    normalized: bool = False
    notes: list[str] = field(default_factory=list)
    items: list[Item] = field(default_factory=list)

    @property
    def regressions(self) -> list[Item]:
        return [i for i in self.items if i.verdict == REGRESSION]

    @property
    def exit_code(self) -> int:
        return 1 if self.regressions else 0

    def __repr__(self) -> str:
        bad = self.regressions
        named = ", ".join(f"{i.kind} {i.name}" for i in bad[:3]) + (f", +{len(bad) - 3} more" if len(bad) > 3 else "")
        return (f"<opscope.GateResult {self.runs} run{'s' if self.runs != 1 else ''} against baseline "
                f"{self.baseline!r} ({self.baseline_runs}): "
                + (f"{len(bad)} regression{'s' if len(bad) != 1 else ''} ({named})" if bad else "no regression")
                + f" in {len(self.items)} items, exit code {self.exit_code}>")

    def to_json(self) -> dict[str, Any]:
        return {"baseline": self.baseline, "threshold": self.threshold, "confidence": self.confidence,
                "runs": self.runs, "baseline_runs": self.baseline_runs, "normalized": self.normalized,
                "regressions": len(self.regressions), "notes": list(self.notes),
                "items": [asdict(i) for i in self.items]}


def check_options(threshold: float, confidence: float) -> None:
    if not (0 <= threshold < 100):
        raise OpscopeError(f"--threshold must be a share such as 10% (0 to 10000%), not {threshold * 100:g}%")
    if not (0.5 <= confidence < 1):
        raise OpscopeError(f"--confidence must be in [0.5, 1), such as 0.99; not {confidence:g}")


def _fmt_pct(x: float) -> str:
    return f"{x * 100:.0f}%"


def machine_speed(base: Samples, new: Samples) -> float | None:
    """The gated machine's ceilings over the baseline's (geometric mean of memory bandwidth and the FLOP/s of
    the dtypes both have); None when they share none."""
    ratios = []
    a, b = base.machine, new.machine
    if a.memory_bandwidth_gbps and b.memory_bandwidth_gbps:
        ratios.append(b.memory_bandwidth_gbps / a.memory_bandwidth_gbps)
    for dtype, value in a.flops_gflops.items():
        other = b.flops_gflops.get(dtype)
        if value > 0 and other:
            ratios.append(other / value)
    if not ratios:
        return None
    return math.exp(sum(math.log(r) for r in ratios) / len(ratios))


def _match(base: Samples, new: Samples) -> tuple[list[tuple[OpSamples, OpSamples]], list[OpSamples], list[OpSamples]]:
    """(matched (baseline row, gated row) pairs, new rows, vanished rows): by op + line + shapes, then what is
    left by op + shapes + module (the same work at a line that moved: code added above it), then by op + line
    (the same code with other shapes)."""
    by_key = {op_key(r): r for r in base.ops}
    pairs, left = [], []
    for row in new.ops:
        hit = by_key.pop(op_key(row), None)
        if hit is not None:
            pairs.append((hit, row))
        else:
            left.append(row)
    for key_of in (lambda r: (r.op, r.shapes, r.module), lambda r: (r.op, r.line)):
        groups: dict[tuple[str, str] | tuple[str, str, str], list[OpSamples]] = {}
        for r in by_key.values():
            groups.setdefault(key_of(r), []).append(r)
        still = []
        for row in left:
            candidates = groups.get(key_of(row))
            if candidates:
                hit = candidates.pop(0)
                del by_key[op_key(hit)]
                pairs.append((hit, row))
            else:
                still.append(row)
        left = still
    return pairs, left, list(by_key.values())


Key = tuple[str, str, str]


@dataclass
class _Load:
    """The load factors of a set of runs: per run, its time on the reference rows (op rows shared with the
    baseline) over the baseline's median time on them; with rows left out, the factor of the others (an op
    row or module is normalized by the load seen on the rest, so that its own slowdown does not cancel); with
    a kind, of the other rows of that kind only (load slows a memory-bound row unlike a compute-bound one)."""

    runs: int
    rows: dict[Key, list[float]] = field(default_factory=dict)  # reference row -> its time in each run
    medians: dict[Key, float] = field(default_factory=dict)  # reference row -> the baseline's median
    kinds: dict[Key, str] = field(default_factory=dict)  # reference row -> what bounds it ("" unknown)
    enabled: bool = False

    def _ratio(self, keep: Sequence[Key]) -> list[float]:
        want = sum(self.medians[k] for k in keep)
        out = []
        for i in range(self.runs):
            have = sum(self.rows[k][i] for k in keep)
            out.append(have / want if have > 0 and want > 0 else 1.0)
        return out

    def factors(self, leave_out: frozenset[Key] = frozenset()) -> list[float]:
        """Each run's factor on all the reference rows not left out (all of them when those hold too little)."""
        if not self.enabled:
            return [1.0] * self.runs
        keep = [k for k in self.rows if k not in leave_out]
        if sum(self.medians[k] for k in keep) < LEAVE_OUT_MIN * sum(self.medians.values()):
            keep = list(self.rows)  # too little left (the whole model): all rows
        return self._ratio(keep)

    def peers(self, kind: str, leave_out: frozenset[Key] = frozenset()) -> list[Key] | None:
        """The reference rows of `kind` not left out; None when they hold under PEER_MIN of the reference time
        (too little to measure the load that kind sees)."""
        keep = [k for k in self.rows if k not in leave_out and self.kinds.get(k, "") == kind]
        if sum(self.medians[k] for k in keep) < PEER_MIN * sum(self.medians.values()):
            return None
        return keep

    def kind_factors(self, kind: str, leave_out: frozenset[Key] = frozenset()) -> list[float] | None:
        """Each run's factor on the other rows of `kind`; None when they are too few (see peers)."""
        if not self.enabled:
            return [1.0] * self.runs
        keep = self.peers(kind, leave_out)
        return None if keep is None else self._ratio(keep)

    def mixed_factors(self, weights: dict[str, float], leave_out: frozenset[Key]) -> list[float] | None:
        """A module's factor: the factors of its kinds (measured outside it), weighted by its baseline time in
        each; None when a kind holding MIX_MIN of it has no rows outside it to measure."""
        if not self.enabled:
            return [1.0] * self.runs
        total = sum(weights.values())
        out = [0.0] * self.runs
        used = 0.0
        for kind, weight in weights.items():
            kf = self.kind_factors(kind, leave_out)
            if kf is None:
                if weight >= MIX_MIN * total:
                    return None
                continue
            used += weight
            out = [o + weight * f for o, f in zip(out, kf, strict=True)]
        return [o / used for o in out] if used > 0 else None


def _test(kind: str, name: str, before: Sequence[float], after: Sequence[float], threshold: float,
          confidence: float, spread: float = 1.0, **where: str) -> Item:
    """`after` against `before` past `threshold`; with a between-run `spread` of the baseline (its largest
    per-run median over its smallest, for per-step samples pooled over runs), past (1 + threshold) * spread."""
    b, a = median(before), median(after)
    ratio = a / b if b > 0 else math.inf
    lo, hi = ratio_interval(after, before, confidence)
    limit = (1 + threshold) * max(1.0, spread) - 1
    test = mann_whitney_greater(after, [x * (1 + limit) for x in before])
    alpha = 1 - confidence
    common: dict[str, Any] = dict(before_us=b, after_us=a, ratio=ratio, low=lo, high=hi, p=test.p, **where)
    widened = (f"; threshold widened to +{_fmt_pct(limit)}: the baseline's runs differ by {spread:.2f}x (their "
               "medians), and steps of one run share its effects" if spread > SPREAD_NOTE else "")
    if test.min_p > alpha:
        return Item(kind=kind, name=name, verdict=UNTESTED, reason=(
            f"{len(after)} vs {len(before)} samples cannot reach {_fmt_pct(confidence)} confidence (smallest p "
            f"{test.min_p:.2g})"), **common)
    if test.p <= alpha and ratio > 1 + limit:
        return Item(kind=kind, name=name, verdict=REGRESSION, reason=(
            f"{ratio:.2f}x, past +{_fmt_pct(limit)} (p = {test.p:.2g} at {_fmt_pct(confidence)} confidence)"
            + widened), **common)
    why = (f"p = {test.p:.2g} > {alpha:.2g}" if test.p > alpha else f"{ratio:.2f}x is within +{_fmt_pct(limit)}")
    return Item(kind=kind, name=name, verdict=OK, reason=f"no regression past +{_fmt_pct(limit)} ({why})" + widened,
                **common)


def _not_gated(kind: str, name: str, before: Sequence[float], after: Sequence[float], reason: str,
               **where: str) -> Item:
    """An item listed by its change, untested: its load cannot be measured on noisy runs."""
    b, a = median(before), median(after)
    common: dict[str, Any] = dict(before_us=b, after_us=a, ratio=a / b if b > 0 else math.inf, **where)
    return Item(kind=kind, name=name, verdict=UNTESTED, reason=reason, **common)


def run_spread(runs: Sequence[Sequence[float]]) -> float:
    """The between-run spread of per-step samples: the largest per-run median over the smallest (1.0 for one
    run). It holds the runs' own noise too: the widening it gives is conservative."""
    medians = [median(r) for r in runs if r]
    if len(medians) < 2 or min(medians) <= 0:
        return 1.0
    return max(medians) / min(medians)


def gate(base: Samples, new: Samples, *, baseline_name: str, threshold: float = DEFAULT_THRESHOLD,
         confidence: float = DEFAULT_CONFIDENCE) -> GateResult:
    """The gated runs `new` against the baseline `base`."""
    check_options(threshold, confidence)
    if base.machine.device_type != new.machine.device_type:
        raise OpscopeError(f"the baseline was measured on {base.machine.device_type or 'an unknown device'}, the runs "
                           f"on {new.machine.device_type or 'an unknown device'}: save a baseline on this device")
    result = GateResult(baseline=baseline_name, threshold=threshold, confidence=confidence, runs=len(new.runs),
                        baseline_runs=len(base.runs))
    notes = result.notes
    # by file name: the same repository is checked out at other paths on other machines
    if base.target and new.target and PurePath(base.target).name != PurePath(new.target).name:
        notes.append(f"the runs profiled {PurePath(new.target).name}, the baseline {PurePath(base.target).name}")
    if base.torch_version and new.torch_version and base.torch_version != new.torch_version:
        notes.append(f"torch {new.torch_version} here, {base.torch_version} in the baseline: op rows may differ")
    if base.machine.threads != new.machine.threads:
        notes.append(f"torch threads {new.machine.threads} here, {base.machine.threads} in the baseline: pin them "
                     "(--threads) for comparable runs")
    scale = 1.0
    # ceilings are measured per thread count: compared only between runs of the same threads
    speed = machine_speed(base, new) if base.machine.threads == new.machine.threads else None
    if speed is not None and abs(math.log(speed)) > math.log(1 + MACHINE_TOLERANCE):
        scale = 1 / speed
        notes.append(f"this machine's ceilings are {speed:.2f}x the baseline's: the baseline's times are scaled by "
                     f"{scale:.2f}x before comparing")
    elif speed is None:
        notes.append("machine speed not checked: the runs and the baseline have no ceilings measured at the same "
                     "thread count")

    pairs, fresh, vanished = _match(base, new)
    base_median = {op_key(r): median(r.times_us) for r in base.ops}
    base_total = median(base.op_time_us) if base.op_time_us else 0.0

    base_load, new_load = _Load(len(base.runs)), _Load(len(new.runs))
    # what bounds each shared row: the baseline's, else the gated runs' ("" when neither knows: one class)
    kinds = {op_key(b): b.bound or n.bound for b, n in pairs}
    noisy = [(f"run {i + 1}", r) for i, r in enumerate(new.runs) if r.noisy]
    noisy += [(f"baseline run {i + 1}", r) for i, r in enumerate(base.runs) if r.noisy]
    if noisy:
        result.normalized = True
        medians = {k: v for k, v in base_median.items() if v > 0}
        shared = {op_key(b): n for b, n in pairs if op_key(b) in medians}
        base_load = _Load(len(base.runs), {k: r.times_us for r in base.ops if (k := op_key(r)) in shared},
                          {k: medians[k] for k in shared}, kinds, enabled=True)
        new_load = _Load(len(new.runs), {k: n.times_us for k, n in shared.items()}, {k: medians[k] for k in shared},
                         kinds, enabled=True)
        label, first = noisy[0]
        more = f" and {len(noisy) - 1} more" if len(noisy) > 1 else ""
        notes.append(
            f"noisy: {label}{more} measured other processes on the machine ({first.noise_reason or 'noisy'}); times "
            "are normalized by each run's load factor (its time on the op rows shared with the baseline over the "
            "baseline's median; for an op row, on the other rows of its kind (compute-, memory-bound ...), which "
            "load slows alike; for a module, on the rows outside it, kind by kind), so a slowdown spread over all "
            "those rows is not seen: load factors " + ", ".join(f"{f:.2f}x" for f in new_load.factors())
            + " (baseline " + ", ".join(f"{f:.2f}x" for f in base_load.factors()) + ")")

    def before(times: Sequence[float], factors: Sequence[float]) -> list[float]:
        return [t / f * scale for t, f in zip(times, factors, strict=True)]

    def after(times: Sequence[float], factors: Sequence[float]) -> list[float]:
        return [t / f for t, f in zip(times, factors, strict=True)]

    def per_step(runs: Sequence[Sequence[float]], factors: Sequence[float], by: float = 1.0) -> list[list[float]]:
        return [[t / f * by for t in run] for f, run in zip(factors, runs, strict=True)]

    def pooled(runs: list[list[float]]) -> list[float]:
        return [t for run in runs for t in run]

    # step time: one sample per step, normalized by all shared rows; steps of a run share its effects, so the
    # threshold widens by the baseline's between-run spread
    b_step_runs = per_step(base.step_times_us, base_load.factors(), scale)
    a_steps = pooled(per_step(new.step_times_us, new_load.factors()))
    step_spread = run_spread(b_step_runs)
    widened = int(step_spread > SPREAD_NOTE)  # items whose threshold the baseline's between-run spread widened
    step = _test("step", "step time", pooled(b_step_runs), a_steps, threshold, confidence, spread=step_spread)

    # op rows seen on both sides
    floor = MIN_SHARE * base_total
    changes: list[tuple[float, str]] = []
    ops: list[Item] = []
    per_step_rows = 0  # op rows tested on per-step samples
    unpeered: list[Item] = []  # op rows and modules not gated on noisy runs: no rows of their kind to measure load
    for b_row, n_row in pairs:
        own = frozenset([op_key(b_row)])
        kind = kinds[op_key(b_row)]
        b_kind, a_kind = base_load.kind_factors(kind, own), new_load.kind_factors(kind, own)
        no_peer = b_kind is None or a_kind is None
        # without peers: shown normalized by all the other rows, not gated
        b_f = base_load.factors(own) if b_kind is None else b_kind
        a_f = new_load.factors(own) if a_kind is None else a_kind
        b_times, a_times = before(b_row.times_us, b_f), after(n_row.times_us, a_f)
        if max(median(b_times), median(a_times)) < floor:
            continue
        where = dict(line=n_row.line, module=n_row.module, shapes=n_row.shapes)
        changes.append((median(a_times) - median(b_times), f"{n_row.op} at {n_row.line or '?'}"))
        if no_peer:
            item = _not_gated("op", n_row.op, b_times, a_times, (
                f"noisy runs, and no other {kind or 'unknown'}-bound row to measure the load it sees (load slows "
                "op kinds unalike): not gated, its times normalized by the other rows"), **where)
            ops.append(item)
            unpeered.append(item)
            continue
        spread = 1.0
        if b_row.step_times_us is not None and n_row.step_times_us is not None:
            # each step a sample (profile runs keep their top rows' step times), normalized by its run's factor;
            # the threshold widens by the baseline's between-run spread
            b_runs = per_step(b_row.step_times_us, b_f, scale)
            b_test, a_test = pooled(b_runs), pooled(per_step(n_row.step_times_us, a_f))
            spread = run_spread(b_runs)
            widened += spread > SPREAD_NOTE
            per_step_rows += 1
        else:
            b_test, a_test = b_times, a_times
        ops.append(_test("op", n_row.op, b_test, a_test, threshold, confidence, spread=spread, **where))
    all_before = base_load.factors()
    all_after = new_load.factors()
    new_items: list[Item] = []
    for row in fresh:
        shares = [t / median(new.step_times_us[i]) for i, t in enumerate(row.times_us)]
        share = median(shares)
        if share < MIN_SHARE:
            continue
        added = share / (1 - share) if share < 1 else math.inf
        everywhere = all(t > 0 for t in row.times_us)
        after_us = median(after(row.times_us, all_after))
        changes.append((after_us, f"{row.op} at {row.line or '?'} (new)"))
        if added > threshold and everywhere:
            verdict, reason = REGRESSION, (f"not in the baseline; {_fmt_pct(share)} of the step, adds "
                                           f"+{_fmt_pct(added)} (past +{_fmt_pct(threshold)})")
        else:
            verdict, reason = NEW, (f"not in the baseline; {_fmt_pct(share)} of the step, adds +{_fmt_pct(added)}"
                                    + ("" if everywhere else f" (in {sum(t > 0 for t in row.times_us)} of "
                                       f"{len(row.times_us)} runs)"))
        new_items.append(Item(kind="new op", name=row.op, verdict=verdict, reason=reason, line=row.line,
                              module=row.module, shapes=row.shapes, after_us=after_us,
                              share=share))
    gone = [Item(kind="op", name=r.op, verdict=VANISHED, reason="in the baseline, not in these runs", line=r.line,
                 module=r.module, shapes=r.shapes, before_us=b)
            for r in vanished if (b := median(before(r.times_us, all_before))) >= floor]

    # modules: normalized by the load outside them, kind by kind (weighted by the module's baseline time in each)
    modules: list[Item] = []
    by_path = {m.module: m for m in base.modules}
    for mod in new.modules:
        b_mod = by_path.get(mod.module)
        if b_mod is None:
            continue
        inside = frozenset(op_key(r) for r in base.ops
                           if mod.module == "" or r.module == mod.module or r.module.startswith(mod.module + "."))
        weights: dict[str, float] = {}
        for k in inside:
            if k in base_load.medians:
                weights[kinds.get(k, "")] = weights.get(kinds.get(k, ""), 0.0) + base_load.medians[k]
        outside = sum(v for k, v in base_load.medians.items() if k not in inside)
        if not base_load.enabled or not weights or outside < LEAVE_OUT_MIN * sum(base_load.medians.values()):
            # quiet runs, or too little outside it (the whole model): as the step, by all rows
            b_f, a_f = base_load.factors(inside), new_load.factors(inside)
            mixed = True
        else:
            b_mix, a_mix = base_load.mixed_factors(weights, inside), new_load.mixed_factors(weights, inside)
            mixed = b_mix is not None and a_mix is not None
            b_f = b_mix if b_mix is not None else base_load.factors(inside)
            a_f = a_mix if a_mix is not None else new_load.factors(inside)
        b_times, a_times = before(b_mod.times_us, b_f), after(mod.times_us, a_f)
        if max(median(b_times), median(a_times)) < floor:
            continue
        name = mod.module or f"{mod.module_class or 'model'} (the model)"
        if not mixed:
            item = _not_gated("module", name, b_times, a_times, (
                "noisy runs, and a kind of its rows (compute-, memory-bound ...) has no rows outside it to measure "
                "the load that kind sees: not gated, its times normalized by the rows outside it"))
            unpeered.append(item)
            modules.append(item)
            continue
        modules.append(_test("module", name, b_times, a_times, threshold, confidence))

    if step.verdict == REGRESSION:
        changes.sort(key=lambda c: -c[0])
        named = [f"{what} +{_us(d)}" for d, what in changes[:CULPRITS] if d > 0]
        if named:
            step = Item(**{**asdict(step), "reason": step.reason + "; most of it: " + ", ".join(named)})
    if step.verdict == UNTESTED:
        notes.append("step time: " + step.reason)
    skipped = {id(i) for i in unpeered}
    untested = [i for i in ops + modules if i.verdict == UNTESTED and id(i) not in skipped]
    if untested:
        notes.append(f"{len(untested)} op row(s) or module(s) have one sample per run: {untested[0].reason}, so "
                     "they are listed by change, not gated; gate more runs (opscope profile --repeat N) or keep a "
                     "baseline of more runs to test them")
    if unpeered:
        names = ", ".join(f"{i.name} at {i.line}" if i.line else i.name for i in unpeered[:3])
        notes.append(f"{len(unpeered)} op row(s) or module(s) not gated on these noisy runs ({names}"
                     f"{' ...' if len(unpeered) > 3 else ''}): load slows compute- and memory-bound ops unalike, and "
                     "no other row of their kind measures the load they see; gate on a quiet runner to test them")
    if widened:
        notes.append(f"{widened} item(s) tested on each step's time with a wider threshold: their baseline's "
                     "runs differ more than their steps (run-level effects, such as an allocation that page-faults "
                     "in some processes only), so steps pooled over runs are not independent samples")
    if per_step_rows:
        notes.append(f"{per_step_rows} op row(s) tested on each step's time (the runs kept their steps)")
    result.items = [step, *sorted(new_items, key=lambda i: -(i.share or 0)),
                    *sorted(ops, key=_order), *sorted(modules, key=_order), *gone]
    return result


def _order(item: Item) -> tuple[int, float]:
    rank = {REGRESSION: 0, OK: 1, UNTESTED: 1}.get(item.verdict, 2)
    change = (item.after_us or 0) - (item.before_us or 0)
    return rank, -change


def _us(value: float) -> str:
    if value >= 1000:
        return f"{value / 1000:.2f} ms"
    return f"{value:.1f} µs"
