"""fusion: runs of consecutive memory-bound element-wise / reduction / normalization ops over tensors of
the same size, which one fused kernel would do in a single pass (bias add then GELU, a hand-written
RMSNorm x * rsqrt(mean(x^2) + eps), a hand-written softmax exp / sum / div, ...).

"Consecutive": the ops that do work (views, composite wrappers, scalar bookkeeping and ops nested
inside another working op are skipped) on one thread in one step, in execution order; any other op
that does work (a matmul, a copy, an unknown op, the harness) ends the run. An op joins the run when
its family is element-wise, reduction, norm or softmax, its bound is memory or overhead, and its
largest input has the run's number of elements or broadcasts with the run's largest shape. Runs of at
least MIN_OPS (2) ops are reported, grouped by their op sequence and source lines, when they would save
at least MIN_SAVED_BYTES (64 KiB) per pass and MIN_SHARE (0.2 %) of the run's op time.

Saving, per occurrence: the intermediate tensors a fused kernel keeps in registers instead of memory,
2 x (bytes written by every op but the last) (written once, read once by the next op; assumes each
op's output feeds the next, as in a chain), capped at the run's bytes minus its largest op's bytes,
at the run's achieved bandwidth (its bytes / its time). Launch/dispatch overhead saved by fusing is
not counted. Runs under MIN_SHARE of the run's op time are dropped.

On a model that already runs compiled, no suggestion names torch.compile: it says whether the ops ran
outside the compiled graphs (bring them in) or inside one, unfused (ops inductor left to ATen).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypedDict

from opscope import units
from opscope.findings.base import Context, Finding, cached, rule
from opscope.findings.common import base_name, per_step, severity, share, short
from opscope.findings.compiled import INSIDE_COMPILED, OUTSIDE_COMPILED, compiled_run, in_compiled_graph
from opscope.findings.layout import Tensor, tensors
from opscope.findings.strided_reduction import reduced_dims
from opscope.findings.tree import col, event_bound, inside_worker_flags, is_worker, names, user_mask
from opscope.table import INDEX, sorted_rows

FUSABLE_FAMILIES = frozenset({"elementwise", "reduction", "norm", "softmax"})
FUSABLE_BOUNDS = frozenset({"memory", "overhead"})
MIN_OPS = 2
MIN_SHARE = 0.002
MIN_SAVED_BYTES = 64 * 1024  # per pass; below this a fused kernel mainly saves launches, not traffic

DEFAULT_SUGGESTION = ("Fuse the chain: torch.compile(model) (or torch.compile on this function) generates one "
                      "kernel for consecutive element-wise and normalization ops.")
def _tanh_gelu(chain: Sequence[str]) -> bool:
    """0.5 * x * (1 + tanh(c * (x + 0.044715 * x^3))) in execution order: before a tanh the cube (a pow, or
    the products of x * x * x) and a sum, after it a sum and a product (`tanh(x + b) * 2` is no GELU)."""
    for t, name in enumerate(chain):
        if name != "tanh":
            continue
        before, after = chain[:t], chain[t + 1:]
        if ("pow" in before or before.count("mul") >= 2) and "add" in before and {"add", "mul"} <= set(after):
            return True
    return False


# (name, op base names that must all appear in the run, a test of the run's ops in execution order or None,
# suggestion). Every matching entry is named; to point users at a bundled or library fused kernel, edit or
# add one entry.
PATTERNS: list[tuple[str, frozenset[str], Callable[[Sequence[str]], bool] | None, str]] = [
    ("hand-written softmax", frozenset({"exp", "sum", "div"}), None,
     "Use torch.softmax(x, dim) (one fused, numerically stable kernel) instead of exp / sum / div."),
    ("hand-written RMSNorm", frozenset({"rsqrt", "mean", "mul"}), None,
     "Use torch.nn.functional.rms_norm / nn.RMSNorm (torch >= 2.4), or torch.compile the block."),
    ("hand-written LayerNorm", frozenset({"mean", "sub", "sqrt"}), None,
     "Use torch.nn.functional.layer_norm / nn.LayerNorm (one fused kernel)."),
    ("hand-written GELU (tanh)", frozenset({"tanh", "mul", "add"}), _tanh_gelu,
     "Use torch.nn.functional.gelu(x, approximate='tanh') (one fused kernel)."),
    ("hand-written GELU (erf)", frozenset({"erf", "mul"}), None,
     "Use torch.nn.functional.gelu(x) (one fused kernel)."),
    ("hand-written SiLU", frozenset({"sigmoid", "mul"}), None,
     "Use torch.nn.functional.silu(x) (one fused kernel)."),
    ("SiLU gate (SwiGLU)", frozenset({"silu", "mul"}), None,
     "silu(gate) * up in one pass: torch.compile fuses it."),
    ("bias + GELU", frozenset({"add", "gelu"}), None,
     "Let the matmul add the bias (nn.Linear / F.linear with bias, fused into addmm), and torch.compile to fuse "
     "the activation into it."),
    ("residual add + norm", frozenset({"add", "native_layer_norm"}), None,
     "torch.compile fuses the residual add into the layer norm (one pass instead of two)."),
]


# What the patterns that name torch.compile say instead on a model that already runs compiled (the rule then
# adds compiled.INSIDE_COMPILED or OUTSIDE_COMPILED: why these ops were not fused, and what to do).
COMPILED_PATTERN_SUGGESTIONS = {
    "hand-written RMSNorm": "Use torch.nn.functional.rms_norm / nn.RMSNorm (torch >= 2.4).",
    "SiLU gate (SwiGLU)": "silu(gate) * up in one pass: one fused kernel for the gate.",
    "bias + GELU": "Let the matmul add the bias (nn.Linear / F.linear with bias, fused into addmm).",
    "residual add + norm": "The residual add and the layer norm in one pass (a fused add + norm kernel).",
}


# What the patterns say on a CPU run where torch's own "fused" op is not one kernel there. torch 2.13's CPU
# aten::_fused_rms_norm (F.rms_norm, nn.RMSNorm) runs pow, mean, add, rsqrt and mul as child ops: the trace of
# examples/findings/rms_norm_after.py holds them under it, as many and as slow as the hand-written ones.
CPU_PATTERN_SUGGESTIONS = {
    "hand-written RMSNorm": "torch.compile the block (it fuses the norm into one kernel). On CPU "
                            "torch.nn.functional.rms_norm / nn.RMSNorm runs these same element-wise ops one by one "
                            "(one fused kernel on GPUs only), so it saves nothing here.",
}


# Patterns one of opscope's bundled fused kernels (reference_kernels/) implements: the suggestion names it.
FUSED_KERNELS = {"hand-written RMSNorm": "rms_norm", "SiLU gate (SwiGLU)": "swiglu", "bias + GELU": "bias_gelu"}


def pattern_for(op_names: set[str], chain: Sequence[str] = (), compiled: bool = False,
                cpu: bool = False, speedups: Mapping[str, float | None] | None = None) -> tuple[str, str]:
    """(labels of every pattern the run contains, their suggestions), or ("", DEFAULT_SUGGESTION): `op_names`
    the base names of the run's ops, views and composites, `chain` the base names of its working ops in
    execution order. A pattern with a bundled fused kernel also names it: as the fix where it measured
    faster on the run's shapes (`speedups`, summary swap_candidates' measured_speedup), apart as slower
    here where it lost, and as not measured where nothing timed it. `compiled`: the model already runs
    compiled, so no suggestion names torch.compile (and without a pattern the suggestion is ''). `cpu`: a
    CPU run (CPU_PATTERN_SUGGESTIONS)."""
    hits = [(label, COMPILED_PATTERN_SUGGESTIONS.get(label, suggestion) if compiled else
             CPU_PATTERN_SUGGESTIONS.get(label, suggestion) if cpu else suggestion)
            for label, need, check, suggestion in PATTERNS if need <= op_names and (check is None or check(chain))]
    if not hits:
        return "", "" if compiled else DEFAULT_SUGGESTION
    kernels = [FUSED_KERNELS[label] for label, _ in hits if label in FUSED_KERNELS]
    return " + ".join(h[0] for h in hits), bundled_text(kernels, speedups or {}) + " ".join(h[1] for h in hits)


def bundled_text(kernels: list[str], speedups: Mapping[str, float | None]) -> str:
    """What a finding says of the bundled fused kernels for its pattern: only one measured faster here is
    suggested (with its speedup); one that lost is named as slower here; one not timed claims nothing."""
    out = []
    faster = [k for k in kernels if (speedups.get(k) or 0.0) > 1.0]
    slower = [k for k in kernels if speedups.get(k) is not None and k not in faster]
    unmeasured = [k for k in kernels if speedups.get(k) is None]
    if faster:
        timed = ", ".join(f"{k} ({speedups[k]:.2f}x the replaced ops' speed on this run's shapes)" for k in faster)
        out.append(f"The bundled fused kernel{'s' if len(faster) > 1 else ''} {timed} "
                   f"{'do' if len(faster) > 1 else 'does'} it in one pass: `opscope swap MODEL --kernel "
                   f"{'+'.join(faster)}` puts {'them' if len(faster) > 1 else 'it'} in the model, checks the results "
                   "and measures the speedup. ")
    if slower:
        out.append("Slower here, so not suggested: the bundled kernel " + ", ".join(
            f"{k} ({speedups[k]:.2f}x)" for k in slower) + " on this run's shapes. ")
    if unmeasured:
        out.append(f"The bundled fused kernel{'s' if len(unmeasured) > 1 else ''} {', '.join(unmeasured)} "
                   f"{'were' if len(unmeasured) > 1 else 'was'} not measured here: `opscope swap MODEL --kernel "
                   f"{'+'.join(unmeasured)}` checks and times {'them' if len(unmeasured) > 1 else 'it'} in the model. ")
    return "".join(out)


@dataclass
class _Run:
    ref: tuple[int, ...]
    ops: array[int] = field(default_factory=lambda: array(INDEX))  # typed: an int object an op held more
    names: set[str] = field(default_factory=set)


def _largest(ts: list[Tensor | None]) -> Tensor | None:
    real = [t for t in ts if t is not None]
    return max(real, key=lambda t: t.numel) if real else None


def _compatible(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    """The larger of two shapes when one broadcasts to the other or they hold as many elements."""
    if math.prod(a) == math.prod(b):
        return a if len(a) >= len(b) else b
    n = max(len(a), len(b))
    pa, pb = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
    if all(x == y or x == 1 for x, y in zip(pa, pb, strict=True)):
        return b
    if all(x == y or y == 1 for x, y in zip(pa, pb, strict=True)):
        return a
    return None


def _out_bytes(ctx: Context, i: int, family: str) -> float:
    ts = [t for t in tensors(ctx, i) if t is not None]
    if not ts:
        return 0.0
    big = max(ts, key=lambda t: t.numel)
    shape = big.shape
    for t in ts:
        shape = _compatible(shape, t.shape) or shape
    numel = math.prod(shape)
    if family == "reduction":
        dims = reduced_dims(ctx, i, names(ctx)[i], family, big.ndim)
        numel = math.prod(s for k, s in enumerate(big.shape) if k not in dims) if dims else 1
    return float(numel * big.itemsize)


def _runs(ctx: Context) -> list[tuple[array[int], set[str], tuple[int, ...]]]:
    mask = user_mask(ctx)
    is_row = col(ctx, "is_row")
    fam = col(ctx, "family")
    bound = event_bound(ctx)
    nm = names(ctx)
    step, thread, ts = col(ctx, "step"), col(ctx, "thread"), col(ctx, "ts")
    work = is_worker(ctx)
    # a typed array, and no tuple per event to sort them: a list held a pointer and an int object an event
    workers = sorted_rows(array(INDEX, (i for i, (row, s) in enumerate(zip(is_row, step, strict=True)) if row and s >= 0)),
                          ((step, False), (thread, False), (ts, False)))
    runs: list[tuple[array[int], set[str], tuple[int, ...]]] = []
    cur: _Run | None = None
    where = None
    pending: set[str] = set()  # names of views/composites seen since the last op that did work

    def close() -> None:
        if cur is not None and len(cur.ops) >= MIN_OPS:
            runs.append((cur.ops, cur.names, cur.ref))

    inside = inside_worker_flags(ctx)
    dims_col, types_col, strides_col = col(ctx, "input_dims"), col(ctx, "input_dtypes"), col(ctx, "input_strides")
    largest_by_key: dict[tuple[str, str, str], Tensor | None] = {}  # a million events share a few thousand input texts
    base_by_name: dict[str, str] = {}
    for i in workers:
        here = (step[i], thread[i])
        if here != where:
            close()
            cur, where, pending = None, here, set()
        if inside[i]:
            continue  # e.g. fill_ initializing sum's output: part of that op
        key = (dims_col[i], types_col[i], strides_col[i])
        if key in largest_by_key:
            big = largest_by_key[key]
        else:
            big = largest_by_key[key] = _largest(tensors(ctx, i))
        name = nm[i]
        base = base_by_name.get(name)
        if base is None:
            base = base_by_name[name] = base_name(name)
        if not work[i] or big is None or big.numel <= 1:
            # views, wrappers and scalar bookkeeping (e.g. a Python number converted inside div_) neither
            # join nor end a run
            pending.add(base)
            continue
        f = fam[i] if isinstance(fam[i], str) else ""
        if not mask[i] or f not in FUSABLE_FAMILIES or bound[i] not in FUSABLE_BOUNDS:
            close()
            cur = None
            pending = set()
            continue
        merged = _compatible(cur.ref, big.shape) if cur is not None else None
        if merged is None:
            close()
            cur = _Run(ref=big.shape)
        else:
            cur.ref = merged
        cur.ops.append(i)
        cur.names.add(base)
        cur.names.update(pending)
        pending = set()
    close()
    return runs


# a run's ops as (op, source line), in order
_Chain = tuple[tuple[str, str], ...]


class FusionGroup(TypedDict):
    """The runs of one op chain: how often, what fusing them would save, their events."""

    count: int
    saving: float  # µs
    saved_b: float  # intermediate bytes a fused kernel would not move
    time: float  # µs
    bytes: float
    names: set[str]  # base names of the ops, views and composites in the runs
    ref: tuple[int, ...]  # the shape the runs work on
    events: array[int]


def fusion_groups(ctx: Context) -> dict[_Chain, FusionGroup]:
    """Runs worth reporting, grouped by their (op, line) sequence; each group keeps its events."""
    return cached(ctx, "fusion_groups", lambda: _groups(ctx))


class EventFlags:
    """A set of events as a byte per event (`in` tells): a set of them held an entry and an int object each."""

    __slots__ = ("flags",)

    def __init__(self, n: int, events: Iterable[int]) -> None:
        self.flags = bytearray(n)
        for i in events:
            self.flags[i] = 1

    def __contains__(self, event: object) -> bool:
        return isinstance(event, int) and 0 <= event < len(self.flags) and bool(self.flags[event])


def fused_events(ctx: Context) -> EventFlags:
    """Events inside a reported fusion run (low-bandwidth leaves these to the fusion finding)."""
    return cached(ctx, "fused_events", lambda: EventFlags(len(names(ctx)), (i for g in fusion_groups(ctx).values()
                                                                             for i in g["events"])))


def _groups(ctx: Context) -> dict[_Chain, FusionGroup]:
    nm = names(ctx)
    fam = col(ctx, "family")
    locs = col(ctx, "source_location")
    times = col(ctx, "time_us")
    nbytes = [0.0 if b != b else float(b) for b in col(ctx, "bytes")]
    groups: dict[_Chain, FusionGroup] = {}
    in_step = col(ctx, "optimizer") if "optimizer" in ctx.events else []
    for ops, run_names, ref in _runs(ctx):
        if in_step and all(in_step[i] for i in ops):
            # an optimizer's step: torch.compile(model) does not reach it; fused=True / foreach=True do
            # (the optimizer-loop finding)
            continue
        total_b = float(sum(nbytes[i] for i in ops))
        total_t = float(sum(times[i] for i in ops))
        if total_b <= 0 or total_t <= 0:
            continue
        inter = 2.0 * sum(_out_bytes(ctx, i, fam[i]) for i in ops[:-1])
        saved_b = min(inter, total_b - max(nbytes[i] for i in ops))
        if saved_b <= 0:
            continue
        saving = total_t * saved_b / total_b
        key = tuple((nm[i], locs[i]) for i in ops)
        g = groups.setdefault(key, {"count": 0, "saving": 0.0, "saved_b": 0.0, "time": 0.0, "bytes": 0.0,
                                    "names": set(), "ref": ref, "events": array(INDEX)})
        g["count"] += 1
        g["saving"] += saving
        g["saved_b"] += saved_b
        g["time"] += total_t
        g["bytes"] += total_b
        g["names"].update(run_names)
        g["events"].extend(ops)
    return {key: g for key, g in groups.items()
            if share(g["saving"], ctx) >= MIN_SHARE and g["saved_b"] / g["count"] >= MIN_SAVED_BYTES}


def chain_text(key: _Chain) -> str:
    """'a x3 -> b (file:3) -> c (file:4)': each source line once, after the consecutive ops it issued,
    and an op repeated back to back once with its count."""
    parts: list[str] = []
    k = 0
    while k < len(key):
        op, loc = key[k]
        n = 1
        while k + n < len(key) and key[k + n] == key[k]:
            n += 1
        k += n
        text = short(op) + (f" x{n}" if n > 1 else "")
        last_of_line = k == len(key) or key[k][1] != loc
        parts.append(f"{text} ({loc})" if last_of_line and loc else text)
    return " -> ".join(parts)


@rule("fusion")
def fusion(ctx: Context) -> Iterator[Finding]:
    for key, g in fusion_groups(ctx).items():
        compiled = compiled_run(ctx)
        label, suggestion = pattern_for(g["names"], [base_name(n) for n, _ in key], compiled=compiled,
                                        cpu=not ctx.gpu, speedups=ctx.kernel_speedups)
        if compiled:  # torch.compile already ran: say why these ops were not fused
            note = INSIDE_COMPILED if in_compiled_graph(ctx, g["events"]) else OUTSIDE_COMPILED
            suggestion = f"{suggestion} {note}".strip()
        chain = chain_text(key)
        size = f" over {list(g['ref'])}-sized tensors"
        what = f"{label}: " if label else ""
        gbps = g["bytes"] / g["time"] / 1e3
        message = (f"{what}{len(key)} memory-bound ops in a row{size}: {chain}. A fused kernel would skip "
                   f"{units.nbytes(g['saved_b'] / g['count'])} of intermediate reads/writes per pass "
                   f"({per_step(g['count'], ctx):g} per step); at the achieved {units.gbps(gbps)} that is "
                   f"{units.duration(g['saving'])} in all.")
        # the run's first op with a source line names it (a mask add_ inside SDPA may have none of its own)
        where = next(((op, loc) for op, loc in key if loc), key[0])
        lines = list(dict.fromkeys(loc for _, loc in key if loc))
        yield Finding(rule="fusion", severity=severity(g["saving"], ctx), op=where[0], source_location=where[1],
                      message=message, suggestion=suggestion, est_savings_us=g["saving"],
                      lines=lines if len(lines) > 1 else None)
