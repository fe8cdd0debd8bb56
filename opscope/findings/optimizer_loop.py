"""optimizer-loop: an optimizer whose step() updates the parameters one tensor at a time (torch.optim's
per-parameter loop: foreach=False, and the default on CPU), where fused=True or foreach=True does the
same update in one or a few kernels per step.

Per (optimizer class, step line): the ops step() called itself, i.e. those inside torch.optim's
`Optimizer.step#<Class>.step` range with no op above them, other than the multi-tensor `_foreach_*` and
fused `_fused_*` ops (whose per-tensor work beneath them is theirs); only element-wise and reduction ops
over tensors of more than one element (not the step counters, nor a first step's state allocation).
Passes per parameter k = those ops / the count of the rarest of them (each op of the update runs at least
once per parameter: AdamW 9, SGD with momentum 3, plain SGD 1). Fires when there are at least
MIN_OPS_PER_STEP (8) per step, k >= MIN_PASSES (2), and the saving is at least MIN_SHARE (0.2 %) of the
run's op time. One finding per optimizer and step line, which is its location (said once).
Saving = (k - 1) / k of those ops' time: a fused step makes one pass over each parameter's tensors where
the loop makes k (each pass assumed to move as many bytes; launches on a GPU not counted). Measured on
CPU: a fused AdamW step took 0.2-0.37x the loop's time (12 x Linear(256), 12 x Linear(64), 4 x
Linear(1024)), the estimate says 0.11x. The fusion, low-bandwidth and overhead rules leave these ops to
this finding.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import TypedDict

from opscope import units
from opscope.findings.base import Context, Finding, cached, rule
from opscope.findings.common import per_step, severity, share, short
from opscope.findings.layout import tensors
from opscope.findings.tree import col, descendants, names, subtree_sum, user_mask

MIN_OPS_PER_STEP = 8
MIN_PASSES = 2.0
MIN_SHARE = 0.002
UPDATE_FAMILIES = frozenset({"elementwise", "reduction"})
MULTI_TENSOR_PREFIXES = ("aten::_foreach_", "aten::_fused_")
# torch.optim classes that take fused=True (CUDA, and CPU since torch 2.4); the others take foreach=True.
FUSED_OPTIMIZERS = frozenset({"Adam", "AdamW", "SGD", "Adagrad"})


class LoopGroup(TypedDict):
    """The per-tensor ops one optimizer's step() ran at one line."""

    optimizer: str
    loc: str
    events: list[int]
    time: float  # µs, with what runs beneath them
    ops: Counter[str]


def loop_groups(ctx: Context) -> list[LoopGroup]:
    """Optimizer steps worth reporting as per-parameter loops."""
    return cached(ctx, "optimizer_loops", lambda: _groups(ctx))


def loop_events(ctx: Context) -> set[int]:
    """Events of a reported per-parameter optimizer loop, with what runs beneath them (low-bandwidth and
    overhead leave them to this finding; fusion leaves every optimizer step alone). That is every event of
    that step() at that line, not only the update's arithmetic: the loop's per-parameter step-counter reads
    (`.item()`, slow under load) go with it, and fused=True removes them too."""
    def build() -> set[int]:
        reported = {(g["optimizer"], g["loc"]) for g in loop_groups(ctx)}
        if not reported:
            return set()
        optimizer = col(ctx, "optimizer")
        locs = col(ctx, "source_location")
        return {j for i, cls in enumerate(optimizer) if cls and (cls, locs[i]) in reported
                for j in (i, *descendants(ctx, i))}
    return cached(ctx, "optimizer_loop_events", build)


def _groups(ctx: Context) -> list[LoopGroup]:
    optimizer = ctx.events.get("optimizer")
    if not optimizer or not any(optimizer):
        return []  # no torch.optim step in the trace (or an event table from before this column)
    nm = names(ctx)
    mask = user_mask(ctx)
    row_parent = col(ctx, "row_parent")
    is_row = col(ctx, "is_row")
    family = col(ctx, "family")
    locs = col(ctx, "source_location")
    times = subtree_sum(ctx, "time_us")
    groups: dict[tuple[str, str], LoopGroup] = {}
    for i, cls in enumerate(optimizer):
        # the ops step() called itself (a multi-tensor op's per-tensor work beneath it is that op's)
        if not cls or not mask[i] or not is_row[i] or row_parent[i] >= 0 or nm[i].startswith(MULTI_TENSOR_PREFIXES):
            continue
        # the update's arithmetic on parameter-sized tensors; not the step counters, Python-number reads
        # (item) or a first step's state allocation (zeros_like)
        if family[i] not in UPDATE_FAMILIES or max((t.numel for t in tensors(ctx, i) if t is not None), default=0) <= 1:
            continue
        g = groups.setdefault((cls, locs[i]), {"optimizer": cls, "loc": locs[i], "events": [], "time": 0.0,
                                               "ops": Counter()})
        g["events"].append(i)
        g["time"] += float(times[i])
        g["ops"][nm[i]] += 1
    return [g for g in groups.values() if per_step(len(g["events"]), ctx) >= MIN_OPS_PER_STEP
            and passes(g) >= MIN_PASSES and share(saving(g), ctx) >= MIN_SHARE]


def passes(g: LoopGroup) -> float:
    """Ops per parameter: every op of the update runs at least once per parameter, so the rarest op's
    count is the number of parameters (AdamW: 9 ops per parameter; plain SGD: 1, p.add_(grad))."""
    return sum(g["ops"].values()) / min(g["ops"].values())


def saving(g: LoopGroup) -> float:
    """A fused step makes one pass over each parameter's tensors where the loop makes passes(g): saving
    (k - 1) / k of the loop's time, as if each pass moved as many bytes."""
    k = passes(g)
    return g["time"] * (k - 1) / k


def suggestion_for(optimizer: str) -> str:
    if optimizer in FUSED_OPTIMIZERS:
        return (f"Construct the optimizer with fused=True: torch.optim.{optimizer}(params, ..., fused=True) "
                "updates every parameter in one kernel per step (CUDA, and CPU since torch 2.4). Or "
                "foreach=True: a few multi-tensor ops per step instead of several per parameter.")
    return (f"Construct the optimizer with foreach=True: torch.optim.{optimizer}(params, ..., foreach=True) "
            "updates all parameters with a few multi-tensor ops per step instead of several per parameter.")


@rule("optimizer-loop")
def optimizer_loop(ctx: Context) -> Iterator[Finding]:
    for g in loop_groups(ctx):
        n = per_step(len(g["events"]), ctx)
        ops = ", ".join(short(op) for op, _ in g["ops"].most_common())
        k = passes(g)
        est = saving(g)
        message = (f"{g['optimizer']}.step() updates the parameters one tensor at a time (torch.optim's "
                   f"per-parameter loop: foreach=False, the default on CPU): {n:g} ops per step ({ops}), "
                   f"{k:.3g} per parameter, {units.duration(per_step(g['time'], ctx))} per step. A fused step "
                   f"makes one pass over each parameter's tensors instead of {k:.3g}: saving estimated at "
                   f"{(k - 1) / k:.0%} of that time (not measured).")
        yield Finding(rule="optimizer-loop", severity=severity(est, ctx), op=g["ops"].most_common(1)[0][0],
                      source_location=g["loc"], message=message, suggestion=suggestion_for(g["optimizer"]),
                      est_savings_us=est)
