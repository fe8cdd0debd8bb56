"""What every findings rule receives and returns. A rule is one small function
`(ctx: Context) -> Iterable[Finding]`, registered with `@rule("name")` in its own module."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from opscope.machine.noise import noise_caveat
from opscope.machine.peaks import Peaks
from opscope.sources import HARNESS
from opscope.table import Table, pairwise_sum
from opscope.trace.torch_trace import TorchTraceLog


@dataclass
class Finding:
    rule: str
    severity: str
    op: str
    source_location: str
    message: str
    suggestion: str
    est_savings_us: float | None
    # every source line of a finding whose ops span several (fusion's chain), in order; None when it has one
    lines: list[str] | None = None

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        if d["lines"] is None:
            del d["lines"]
        if d["est_savings_us"] is not None:
            v = float(d["est_savings_us"])
            d["est_savings_us"] = round(v, 3) if math.isfinite(v) else None
        return d


# A measurement hook only `opscope profile` has (it can run torch): given a captured 2-D convolution
# (input dims, weight dims, dtype, stride, padding, dilation, groups), returns microseconds per call
# for (NCHW, channels_last), or None if it cannot measure.
LayoutProbe = Callable[[dict[str, Any]], "tuple[float, float] | None"]
# Another hook only `opscope profile` has: given a captured op call {"op": "aten::conv2d", "args": [...],
# "own": bool} (tensors as {"shape", "stride", "dtype"} with the trace's dtype names, other arguments as
# {"value"}), replays it warm on the profiled device with its floating-point tensors in float32 and, if
# "own", also as recorded; returns microseconds per call (as recorded or None, float32), or None if it
# cannot (see opscope.capture.dtype_probe).
DtypeProbe = Callable[[dict[str, Any]], "tuple[float | None, float] | None"]


@dataclass
class Context:
    # Tables (opscope.table). A DataFrame given here (the commands that merge runs or attach measurements
    # read them back as DataFrames) becomes a table: the rules read tables only.
    ops: Table  # ops.csv rows (contract columns + family, dtype, ceiling, time_us_per_call, note)
    events: Table  # one row per cpu_op event: call tree, times, costs, source_location, step
    peaks: Peaks
    gpu: bool
    source: str  # "profile" | "trace"
    steps: int
    step_time_us: float
    device_busy_share: float | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    layout_probe: LayoutProbe | None = None
    dtype_probe: DtypeProbe | None = None
    # GPU runs: opscope.analysis.gpu_timeline's summary keys (graph_replay, idle_gaps, streams, ...)
    gpu_timeline: dict[str, Any] | None = None
    # summary.json "noise": other processes' CPU use during the timed steps (opscope.machine.noise.assess);
    # verdict "unknown" for traces. run_rules() appends noise.noise_caveat(ctx.noise) to the findings of
    # every rule resting on achieved rates (all but NOT_RATE_BASED).
    noise: dict[str, Any] | None = None
    memory: Any = None  # analysis.memory.MemoryProfile when the run recorded memory events
    # A merged run of a multi-process job: ranks.csv (opscope.analysis.ranks); None for one process.
    ranks: Table | None = None
    # A compiled model's TORCH_TRACE log (opscope.trace.torch_trace): its graphs, kernels' provenance and
    # dynamo's compile metrics (graph breaks, recompilations); None when the run has none.
    compile_log: TorchTraceLog | None = None
    # summary.json swap_candidates' measured_speedup per bundled kernel (None: not measured here); a finding
    # names a bundled kernel as the fix only where it measured faster (opscope.kernels.incontext)
    kernel_speedups: dict[str, float | None] = field(default_factory=dict)
    # Derived tables shared between rules (call tree, subtree times, copy classification, ...), filled
    # lazily by opscope.findings.common; never written anywhere.
    cache: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def total_time_us(self) -> float:
        # Read by every rule's severity and share: summed once (the ops table does not change).
        return cached(self, "total_time_us", lambda: pairwise_sum(self.ops["time_us_total"]))


T = TypeVar("T")


def cached(ctx: Context, key: str, build: Callable[[], T]) -> T:
    """`build()`, computed once per Context (tables derived from the event table, shared between rules)."""
    if key not in ctx.cache:
        ctx.cache[key] = build()
    value: T = ctx.cache[key]  # what build() returned: each key has one builder
    return value


Rule = Callable[[Context], Iterable[Finding]]
RULES: dict[str, Rule] = {}


def rule(name: str) -> Callable[[Rule], Rule]:
    def deco(fn: Rule) -> Rule:
        if name in RULES:
            raise ValueError(f"rule {name} registered twice")
        RULES[name] = fn
        return fn

    return deco


# Rules whose saving does not rest on an achieved rate or a timed probe (an allocation count, a spread
# between ranks, a wait the trace records, what the compile log says): every other rule's message carries
# the noise note on a noisy run, as a slow or starved process makes achieved rates read low and savings high.
NOT_RATE_BASED = frozenset({"memory-growth", "straggler", "host-sync", "graph-break", "recompile",
                            "compile-fallback", "cudagraph-skipped"})


def run_rules(ctx: Context, only: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """All findings, harness ops excluded, sorted by estimated saving (unknown savings last)."""
    found: list[Finding] = []
    names = list(only) if only is not None else list(RULES)
    caveat = noise_caveat(ctx.noise)
    for name in names:
        for f in RULES[name](ctx):
            if f.source_location == HARNESS:
                continue
            if caveat and name not in NOT_RATE_BASED and caveat not in f.message:
                f.message += caveat
            found.append(f)
    found.sort(key=lambda f: (f.est_savings_us is None, -(f.est_savings_us or 0.0)))
    return [f.to_json() for f in found]
