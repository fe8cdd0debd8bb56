"""Speed, measured only after verification passed; reported, never asserted.

Op level: for the calls the model made at each site (recorded during verification: the most frequent
signatures, at most CALLS_PER_SITE per site), the original computation against the kernel path, forward
only, under no_grad, on the same arguments. End to end: one full model step (opscope profile's step:
forward, or forward + loss + backward + SGD step) with the swap off and on.

End to end, the model's parameters and buffers are put back before every step (untimed), so both sides
train from the same values and the model is left as verification saw it.

Method (both levels): warm up (kernels_bench.WARMUP calls each; torch.compile's compilation happens in
an extra first call, timed on its own as compile_s), then interleaved A/B rounds (the order alternates
each round, so load on the machine hits both alike); op-level samples time enough back-to-back calls to
last about SAMPLE_S and divide. Median with p20/p80 per side; speedup = original median / swapped
median (> 1: faster); a speedup over SUSPICIOUS is flagged, and one whose paired ratios (original /
swapped of one round) have a p20–p80 range holding 1 is marked within noise. The number of rounds
fits a time budget (at least MIN_REPEATS, at most --repeats).

Op-level roofline: the FLOPs are the original's, counted by opscope's cost model on the aten ops it
runs (a dispatch mode records them); the bytes are the minimum traffic of the work (every tensor it
reads, once: the arguments and a module's parameters, plus the outputs written once), the same for
both sides. Each side's % of peak is against the ceiling that binds the work (bandwidth for
memory-bound work, the vector FLOP/s of its dtype otherwise), from the run's own ceilings.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from opscope.analysis.ops_table import classify_bound
from opscope.costmodel import OpCall, estimate
from opscope.kernels.bench import Timing, batched, interleaved, per_call
from opscope.machine.peaks import Peaks, ceiling_key
from opscope.swap.mechanisms import RecordedCall, Swap
from opscope.swap.traps import fresh_args, select_calls, tensors_of

SUSPICIOUS = 10.0
MIN_REPEATS = 5
SAMPLE_S = 2e-3
OP_BUDGET_S = 4.0       # per recorded call
E2E_BUDGET_S = 40.0
MAX_OP_CALLS = 6        # op-level rows per swap

_PROFILER_DTYPES = {torch.float32: "float", torch.float64: "double", torch.float16: "c10::Half",
                    torch.bfloat16: "c10::BFloat16", torch.int64: "long int", torch.int32: "int",
                    torch.int16: "short int", torch.int8: "signed char", torch.uint8: "unsigned char",
                    torch.bool: "bool"}
_DTYPE_NAMES = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16",
                torch.bfloat16: "bfloat16"}


def timing_json(t: Timing) -> dict[str, float]:
    return {"median_ms": t.median_ms, "p20_ms": t.p20_ms, "p80_ms": t.p80_ms}


def speedup(original: Timing, swapped: Timing) -> float | None:
    return original.median_ms / swapped.median_ms if swapped.median_ms > 0 else None


def within_noise(original: Timing, swapped: Timing) -> bool:
    """The speedup is inside the run-to-run spread: the p20–p80 range of the paired ratios (original /
    swapped of one interleaved round) holds 1. Load that drifts over the run widens each side's own
    range but hits both sides of a round alike, so the two sides' ranges can overlap while every round
    says the same. Without paired samples: the two sides' p20–p80 ranges overlap."""
    pairs = list(zip(original.samples_ms, swapped.samples_ms, strict=False))
    if len(original.samples_ms) == len(swapped.samples_ms) >= 2 and all(s > 0 for _, s in pairs):
        cuts = statistics.quantiles([o / s for o, s in pairs], n=5, method="inclusive")  # p20, p40, p60, p80
        return cuts[0] <= 1.0 <= cuts[-1]
    return not (original.p20_ms > swapped.p80_ms or swapped.p20_ms > original.p80_ms)


# --- counting the work --------------------------------------------------------------------------------


def _trace_arg(value: Any) -> tuple[Any, Any, Any, str]:
    """(dims, dtype, strides, concrete) as torch.profiler records one argument."""
    if isinstance(value, torch.Tensor):
        return list(value.shape), _PROFILER_DTYPES.get(value.dtype, str(value.dtype)), list(value.stride()), ""
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, torch.Tensor) for v in value):
        return ([list(v.shape) for v in value], [_PROFILER_DTYPES.get(v.dtype, "") for v in value],
                [list(v.stride()) for v in value], "")
    if isinstance(value, (bool, int, float)):
        return [], "Scalar", [], str(value)
    if isinstance(value, (list, tuple)) and all(isinstance(v, (int, float)) for v in value):
        return [], "ScalarList", [], str(list(value))
    return [], "", [], ""


class _CountWork(TorchDispatchMode):  # type: ignore[no-untyped-call, unused-ignore]  # unannotated in torch
    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call, unused-ignore]  # unannotated in torch
        self.flops = 0.0
        self.unknown: set[str] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        schema = func._schema
        values = [args[i] if i < len(args) else kwargs.get(a.name, a.default_value if a.has_default_value() else None)
                  for i, a in enumerate(schema.arguments)]
        dims, dtypes, strides, concrete = zip(*(_trace_arg(v) for v in values), strict=True) if values else ((),) * 4
        cost = estimate(OpCall(schema.name, tuple(dims), tuple(dtypes), tuple(strides), tuple(concrete)))
        if cost is None:
            self.unknown.add(schema.name)
        elif cost.family != "composite":
            self.flops += cost.flops
        return func(*args, **kwargs)


def count_flops(fn: Callable[[], Any]) -> tuple[float | None, set[str]]:
    """FLOPs of the aten ops `fn` runs (None when some op has no cost formula), and those ops."""
    mode = _CountWork()
    with torch.no_grad(), mode:
        fn()
    return (None if mode.unknown else mode.flops), mode.unknown


def min_bytes(call: RecordedCall, out: Any) -> int:
    """Every distinct tensor the work reads (arguments, a module's parameters) once, outputs written once."""
    seen: dict[tuple[int, int | torch.SymInt], int] = {}
    for t in [*tensors_of((call.args, call.kwargs)), *call.site.params, *tensors_of(out)]:
        key = (t.untyped_storage().data_ptr(), t.storage_offset()) if t.numel() else (id(t), 0)
        seen[key] = max(seen.get(key, 0), t.numel() * t.element_size())
    return sum(seen.values())


def _dtype_of(call: RecordedCall) -> torch.dtype | None:
    floating = [t for t in tensors_of((call.args, call.kwargs)) if t.is_floating_point()]
    return floating[0].dtype if floating else None


def roofline(flops: float | None, nbytes: int, dtype: torch.dtype | None, peaks: Peaks, ms: float) -> dict[str, Any]:
    """The bound and one side's % of the binding peak for work of `flops` and `nbytes` done in `ms`."""
    name = _DTYPE_NAMES.get(dtype) if dtype is not None else None
    peak_flops = peaks.flops_for(ceiling_key("elementwise", name))
    bound = classify_bound(flops if flops is not None else math.nan, float(nbytes), "elementwise", peak_flops,
                           peaks.memory_bandwidth_gbps)
    seconds = ms * 1e-3
    gbps = nbytes / seconds / 1e9 if seconds > 0 else None
    gflops = flops / seconds / 1e9 if flops is not None and seconds > 0 else None
    if bound == "compute" and gflops is not None and peak_flops:
        pct = 100 * gflops / peak_flops
    elif gbps is not None and peaks.memory_bandwidth_gbps:
        pct = 100 * gbps / peaks.memory_bandwidth_gbps
    else:
        pct = None
    return {"bound": bound, "gbps": gbps, "gflops": gflops, "pct_peak": pct}


# --- timing ---------------------------------------------------------------------------------------------


def _batched(fn: Callable[[], Any], sync: Callable[[], None]) -> tuple[Callable[[], Any], int]:
    return batched(fn, sync, SAMPLE_S)


def _repeats(one_round_s: float, budget_s: float, limit: int) -> int:
    return max(MIN_REPEATS, min(limit, int(budget_s / max(one_round_s, 1e-6))))


def _sync(device: torch.device) -> Callable[[], None]:
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


@dataclass
class OpRow:
    site: str
    kernel: str
    call: str
    calls_per_step: int
    original: Timing
    kernel_timing: Timing
    flops: float | None
    bytes: int
    before: dict[str, Any]
    after: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        ratio = speedup(self.original, self.kernel_timing)
        return {"site": self.site, "kernel": self.kernel, "call": self.call, "calls_per_step": self.calls_per_step,
                "original": timing_json(self.original), "swapped": timing_json(self.kernel_timing),
                "speedup": ratio, "suspicious": bool(ratio is not None and ratio > SUSPICIOUS),
                "within_noise": within_noise(self.original, self.kernel_timing), "flops": self.flops, "bytes": self.bytes, "bound": self.before["bound"],
                "pct_peak_before": self.before["pct_peak"], "pct_peak_after": self.after["pct_peak"]}


def op_level(calls: list[RecordedCall], peaks: Peaks, device: torch.device, repeats: int,
             progress: Callable[[str], None] = lambda m: None) -> list[OpRow]:
    rows = []
    sync = _sync(device)
    for call in select_calls([c for c in calls if c.used])[:MAX_OP_CALLS]:
        progress(f"op level: {call.site.where}")
        args, kwargs = fresh_args(call)
        with torch.no_grad():
            orig, k = _batched(functools.partial(call.site.original, *args, **kwargs), sync)
            new, k2 = _batched(functools.partial(call.site.replacement, *args, **kwargs), sync)
            one_round = SAMPLE_S * 2
            timings = interleaved({"original": orig, "kernel": new}, _repeats(one_round, OP_BUDGET_S, repeats), sync)
            out = call.site.replacement(*args, **kwargs)
        t_orig = _per_call(timings["original"], k)
        t_new = _per_call(timings["kernel"], k2)
        flops, _ = count_flops(functools.partial(call.site.original, *args, **kwargs))
        nbytes = min_bytes(call, out)
        dtype = _dtype_of(call)
        rows.append(OpRow(site=call.site.where, kernel=call.site.kernel, call=call.signature,
                          calls_per_step=call.calls, original=t_orig, kernel_timing=t_new, flops=flops, bytes=nbytes,
                          before=roofline(flops, nbytes, dtype, peaks, t_orig.median_ms),
                          after=roofline(flops, nbytes, dtype, peaks, t_new.median_ms)))
    return rows


def _per_call(t: Timing, k: int) -> Timing:
    return per_call(t, k)


@dataclass
class EndToEnd:
    original: Timing
    swapped: Timing
    repeats: int
    compile_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        ratio = speedup(self.original, self.swapped)
        return {"original": timing_json(self.original), "swapped": timing_json(self.swapped), "speedup": ratio,
                "suspicious": bool(ratio is not None and ratio > SUSPICIOUS),
                "within_noise": within_noise(self.original, self.swapped), "repeats": self.repeats,
                "compile_s": self.compile_s}


def end_to_end(swap: Swap, step: Callable[[], None], device: torch.device, repeats: int,
               restore: Callable[[], None] = lambda: None,
               progress: Callable[[str], None] = lambda m: None) -> EndToEnd:
    """`restore` runs before every step, untimed: training steps change the parameters, and each side
    must do the same work on the same values (a diverging model would end in NaNs)."""
    sync = _sync(device)

    def swapped() -> None:
        with swap.applied():
            step()

    compile_s = None
    if any(m.kind == "compile" for m in swap.mechanisms):
        progress("compiling")
        restore()
        sync()
        t0 = time.perf_counter()
        swapped()
        sync()
        compile_s = time.perf_counter() - t0
    progress("end to end")
    restore()
    sync()
    t0 = time.perf_counter()
    step()
    restore()
    swapped()
    sync()
    n = _repeats(time.perf_counter() - t0, E2E_BUDGET_S, repeats)
    timings = interleaved({"original": step, "swapped": swapped}, n, sync, setup=restore)
    restore()
    return EndToEnd(timings["original"], timings["swapped"], n, compile_s)
