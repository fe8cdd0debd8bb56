"""In-context measurement: before `opscope profile` lists a bundled kernel as a swap candidate, time it
against what it would replace, on the shapes and dtypes the model's own op rows recorded, without
running the model again.

Per candidate (opscope.kernels.catalog.candidates): the distinct work of its rows (the shape the
replaced ops work on, the kernel's arguments built from the row by the kernel's `op.py`
`context_args`, its dtype; rows whose shape broadcasts into a larger one of the same candidate, a
norm's [B, T, 1] rsqrt, are part of that one's work), at most MAX_SHAPES of them, the most time first.
For each: seeded random inputs, the original (the kernel's `native` aten op where the model ran that
op, its eager `composite` where it ran a hand-written pattern) against the kernel, forward only,
under no_grad, interleaved rounds of batched calls (opscope.kernels.bench), medians, within BUDGET_S per
candidate, with the grain size tuned for the shape class (reference_kernels.tuning: cached, or tuned now
within TUNE_BUDGET_S on first use). A candidate's `measured_speedup` is its rows' time over that time with each shape's speedup
applied: > 1 it wins here, else it is "slower here" and never a suggestion.

Where nothing can be timed (no C++ compiler, the CPU kernels not built yet, a GPU run) the candidate is
"not measured here", with the reason, and claims nothing.
"""

from __future__ import annotations

import functools
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from opscope.kernels.bench import Timing, race
from opscope.kernels.catalog import row_shape
from opscope.table import Table, nrows

BUDGET_S = 0.3          # per candidate, all its shapes together
TUNE_BUDGET_S = 0.2     # per candidate, tuning the grain of the shape classes met for the first time
MAX_SHAPES = 3
SAMPLE_S = 2e-3         # one timed sample: enough back-to-back calls to last this long
MIN_ROUNDS, MAX_ROUNDS = 5, 60
FASTER, SLOWER, NOT_MEASURED = "faster", "slower here", "not measured here"
_DTYPES = {"float": "float32", "double": "float64", "c10::Half": "float16", "c10::BFloat16": "bfloat16"}

# (kernel name, original, kernel, seconds) -> their timings, per call: time_pair times them; tests inject one
Timer = Callable[[str, Callable[[], Any], Callable[[], Any], float], tuple[Timing, Timing]]


def time_pair(name: str, original: Callable[[], Any], kernel: Callable[[], Any],
              budget_s: float) -> tuple[Timing, Timing]:
    """Interleaved rounds of batched calls of both (load on the machine hits both alike), within budget_s."""
    original()  # a first call pays one-time costs (allocations, lazy init): not the batch size's measure
    kernel()
    rounds = max(MIN_ROUNDS, min(MAX_ROUNDS, int(budget_s / (2 * SAMPLE_S))))
    t = race({"original": original, "kernel": kernel}, rounds, sample_s=SAMPLE_S)
    return t["original"], t["kernel"]


@dataclass
class _Work:
    """One distinct call of a candidate's kernel: its arguments, the rows whose time it stands for."""

    args: tuple[Any, ...]
    shape: tuple[int, ...]
    dtype: str
    rows: list[int]
    calls: float  # kernel calls per step
    time_us: float  # the rows' time over all steps


def not_measured(candidates: list[dict[str, Any]], reason: str) -> list[dict[str, Any]]:
    """The candidates marked as not measured here, saying why."""
    return [{**c, "measured_speedup": None, "original_us": None, "measured_us": None,
             "verdict": NOT_MEASURED, "why": reason} for c in candidates]


def unavailable_reason() -> str | None:
    """Why the CPU kernels cannot be timed in this process without building them (None: they can)."""
    try:
        from reference_kernels import _build
    except ImportError:
        return "the reference_kernels package is not installed"
    if _build.compiler() is None:
        return "no C++ compiler here, so the CPU kernels cannot be built"
    if not (_build._loaded.get("cpu") or _build.cpu_library_path().exists()):
        return ("the CPU kernels are not built yet (`opscope kernels --bench` builds them once, about a "
                "minute); profile does not build them")
    return None


def measure(candidates: list[dict[str, Any]], ops: Table, *, steps: int = 1, device: str = "cpu",
            budget_s: float = BUDGET_S, timer: Timer | None = None) -> list[dict[str, Any]]:
    """The candidates with `measured_speedup`, `original_us` and `measured_us` (their rows' time per
    step, as they ran and with the kernel at the measured speedups), `verdict` (faster, slower here,
    not measured here) and `why` (for the last two), in the same order."""
    if not candidates:
        return []
    if device != "cpu":
        return not_measured(candidates, f"a {device} run: profile times the CPU kernels only (time the GPU "
                                        "backends with `opscope kernels --bench --device cuda`)")
    if timer is None:
        reason = unavailable_reason()
        if reason is not None:
            return not_measured(candidates, reason)
        try:
            from reference_kernels import _build

            _build.load_cpu_extension()  # loading the library is not the first candidate's time
        except Exception as exc:  # noqa: BLE001 - KernelBuildError or a broken cached build
            return not_measured(candidates, f"the CPU kernels did not load ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})")
    out = []
    for cand in candidates:
        t0 = time.perf_counter()
        try:
            out.append(_measure_one(cand, ops, max(steps, 1), budget_s, timer or time_pair))
        except Exception as exc:  # noqa: BLE001 - a kernel that cannot run here is not a suggestion
            out.extend(not_measured([cand], f"the kernel did not run on these shapes ({type(exc).__name__}: "
                                            f"{str(exc).splitlines()[0] if str(exc) else ''})"))
        out[-1]["measure_s"] = round(time.perf_counter() - t0, 3)
    return out


def _measure_one(cand: dict[str, Any], ops: Table, steps: int, budget_s: float, timer: Timer) -> dict[str, Any]:
    import reference_kernels
    from reference_kernels._registry import op_module

    mod = op_module(cand["kernel"])
    works = _works(cand, ops, steps, mod)
    if not works:
        return not_measured([cand], "its rows do not record the shapes and dtypes the kernel needs")[0]
    kernel = reference_kernels.load(cand["kernel"])
    original = _original(cand, mod)
    import torch

    from opscope.kernels.bench import ensure_tuned

    manifest = next(m for m in reference_kernels.manifests() if m.name == cand["kernel"])
    orig_us = new_us = orig_step = new_step = 0.0
    for w in works:
        with torch.no_grad():
            if timer is time_pair:  # an injected timer (tests) times nothing real
                ensure_tuned(manifest, w.args, TUNE_BUDGET_S / len(works))  # this shape class's grain, once
            t_orig, t_new = timer(cand["kernel"], functools.partial(original, *w.args),
                                  functools.partial(kernel, *w.args), budget_s / len(works))
        ratio = t_orig.median_ms / t_new.median_ms if t_new.median_ms > 0 else math.nan
        # the rows' own time stands for the original; the kernel takes it down by the measured ratio
        orig_us += w.time_us
        new_us += w.time_us / ratio if ratio > 0 else math.inf
        orig_step += t_orig.median_ms * 1e3 * w.calls
        new_step += t_new.median_ms * 1e3 * w.calls
    speedup = orig_us / new_us if new_us > 0 and math.isfinite(new_us) else None
    if speedup is None:
        return not_measured([cand], "the timings were not usable (zero or infinite)")[0]
    faster = speedup > 1.0
    shapes = ", ".join(f"{list(w.shape)} {w.dtype}" for w in works)
    return {**cand, "measured_speedup": speedup, "original_us": orig_step, "measured_us": new_step,
            "verdict": FASTER if faster else SLOWER,
            "why": None if faster else f"the kernel took {1 / speedup:.2f}x the time of the ops it replaces on "
                                       f"the model's shapes ({shapes})"}


def _original(cand: dict[str, Any], mod: Any) -> Callable[..., Any]:
    """The aten op where the model ran it (conservative: if any matched entry is the op itself, the
    kernel must beat the op), the eager composite where it ran only a hand-written pattern."""
    native = getattr(mod, "native", None)
    if native is None:
        return mod.composite
    patterns = [r for r in cand.get("replaces", []) if r.get("kind") == "pattern" or str(r.get("target", "")).startswith("*")]
    return mod.composite if patterns and len(patterns) == len(cand.get("replaces", [])) else native


def _works(cand: dict[str, Any], ops: Table, steps: int, mod: Any) -> list[_Work]:
    import torch

    rows = [r for r in cand.get("rows", []) if isinstance(r, int) and 0 <= r < nrows(ops)]

    def col(name: str) -> Any:
        return ops[name] if name in ops else [None] * nrows(ops)

    op_names, dims, dtypes, concrete = col("op"), col("input_dims"), col("input_dtypes"), col("concrete_inputs")
    times, calls = col("time_us_total"), col("calls")
    info = {}
    for r in rows:
        shape = row_shape(op_names[r], dims[r]) if isinstance(op_names[r], str) else None
        dtype = _dtype(dtypes[r])
        if shape is None or dtype is None:
            continue
        info[r] = (shape, dtype)
    # a row whose shape broadcasts into a larger one of the candidate is part of that work
    biggest = sorted({(s, d) for s, d in info.values()}, key=lambda sd: -math.prod(sd[0]))
    groups: dict[tuple[tuple[int, ...], str], list[int]] = {}
    for r, (shape, dtype) in info.items():
        home = next(((s, d) for s, d in biggest if d == dtype and _inside(shape, s)), (shape, dtype))
        groups.setdefault(home, []).append(r)
    works: dict[str, _Work] = {}
    for (shape, dtype), members in groups.items():
        # the row with the most time among those of the group's own shape gives the call's arguments
        own = [r for r in members if info[r][0] == shape] or members
        lead = max(own, key=lambda r: _num(times[r]))
        args = mod.context_args(shape, _tensor_shapes(dims[lead]), _texts(concrete[lead]), getattr(torch, dtype))
        if args is None:
            continue
        # calls per step: each op of the pattern runs once per kernel call, so the op with the fewest
        # calls over the group's own-shape rows (a norm's two muls are one kernel call, two norms two)
        per_op: dict[str, float] = {}
        for r in own:
            per_op[str(op_names[r])] = per_op.get(str(op_names[r]), 0.0) + _num(calls[r])
        n_calls = min(per_op.values()) / steps
        key = _work_key(args, dtype)
        w = works.get(key)
        group_time = sum(_num(times[r]) for r in members)
        if w is None:
            works[key] = _Work(args, shape, dtype, sorted(members), n_calls, group_time)
        else:  # the same work seen from another op of the pattern (a Linear's addmm, then its GELU)
            w.rows = sorted({*w.rows, *members})
            w.time_us += group_time
            w.calls = max(w.calls, n_calls)
    return sorted(works.values(), key=lambda w: -w.time_us)[:MAX_SHAPES]


def _inside(shape: tuple[int, ...], big: tuple[int, ...]) -> bool:
    n = max(len(shape), len(big))
    a, b = (1,) * (n - len(shape)) + shape, (1,) * (n - len(big)) + big
    return all(x == y or x == 1 for x, y in zip(a, b, strict=True)) or \
        (bool(shape) and bool(big) and shape[-1] == big[-1] and math.prod(shape) == math.prod(big))


def _work_key(args: tuple[Any, ...], dtype: str) -> str:
    """Calls doing the same work: tensors by (elements, last dim), so a Linear's [B*T, N] and the GELU's
    [B, T, N] after it are one; other arguments as they are."""
    import torch

    parts = [f"t{a.numel()}x{a.shape[-1] if a.dim() else 1}" if isinstance(a, torch.Tensor) else repr(a) for a in args]
    return dtype + "|" + "|".join(parts)


def _tensor_shapes(dims: Any) -> list[tuple[int, ...]]:
    """The row's tensor arguments' shapes, in order (scalars and tensor lists left out)."""
    try:
        parsed = json.loads(dims) if isinstance(dims, str) and dims else []
    except ValueError:
        return []
    return [tuple(d) for d in parsed if isinstance(d, list) and d and all(isinstance(n, int) for n in d)] \
        if isinstance(parsed, list) else []


def _texts(value: Any) -> list[str]:
    try:
        parsed = json.loads(value) if isinstance(value, str) and value else []
    except ValueError:
        return []
    return [str(v) for v in parsed] if isinstance(parsed, list) else []


def _dtype(value: Any) -> str | None:
    """The row's first floating dtype as torch names it."""
    for d in _texts(value):
        if d in _DTYPES:
            return _DTYPES[d]
    return None


def _num(x: Any) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return 0.0
    return v if v == v else 0.0
