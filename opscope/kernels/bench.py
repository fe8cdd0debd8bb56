"""`opscope kernels --bench [NAME]`: time each bundled kernel on its manifest's shapes against the native
aten op, the eager composite it replaces and torch.compile of that composite, in one process with
interleaved repeats; and `--tune`: pick each CPU kernel's grain size by measurement over the search space
its manifest declares, per shape class (reference_kernels.tuning); bench and profile tune a shape class
on first use within FIRST_USE_BUDGET_S.

Method, per (kernel, case):
  - inputs: seeded randn of the manifest's shapes and dtype; the same tensors for every candidate;
  - warmup: 3 untimed calls per candidate (torch.compile's compile happens here, timed separately);
  - repeats: `repeats` rounds; each round times one call of every candidate, the order rotated per round
    (interleaved, so load on the machine hits all candidates alike); time.perf_counter around the call;
  - statistics: median with p20/p80 per candidate; ratio = other's median / kernel's median (>1: the kernel
    is faster);
  - bytes: each input tensor read once plus the output written once (the minimum traffic of the op);
    GB/s = bytes / median; % of the calibrated CPU bandwidth (opscope.machine.calibrate; --peak-bw overrides).
  - bound (CPU): the kernel's own forward again on a band of the case's middle rows (IN_CACHE_BYTES of
    traffic, rows as long as at full size), one thread, times the threads: the bytes per second its
    arithmetic allows with the data in cache (in_cache_gbps). Above the memory's bandwidth, the memory limits it at full size ("memory"); below,
    its own instructions do ("compute"), and the bandwidth goal is read against that in-cache rate.
  - steady memory: by default glibc's malloc is told not to return big blocks to the OS (mallopt
    M_MMAP_MAX=0, M_TRIM_THRESHOLD=1 GiB), as jemalloc/tcmalloc setups do, so a 64 MiB output does not
    page-fault on every call: otherwise page faults, not the kernels, dominate every candidate's time.
Results: kernels-bench.json and kernels-bench.csv in the output folder, with the machine, torch and
opscope versions.
"""

from __future__ import annotations

import csv
import ctypes
import datetime as _dt
import functools
import importlib
import json
import math
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opscope.errors import OpscopeError
from opscope.run.cells import spreadsheet_safe
from opscope.run.write import make_folders
from opscope.version import __version__

WARMUP = 3
GOALS = {  # kernel -> [(ratio key, minimum)], from the issue that introduced the kernels
    "bias_gelu": [("vs_eager", 1.5), ("vs_compiled", 0.9)],
    "swiglu": [("vs_eager", 1.5), ("vs_compiled", 0.9)],
    "rms_norm": [("vs_eager", 1.5), ("vs_compiled", 0.9)],
    "broadcast_add": [("vs_native", 0.9)],
    "layer_norm": [("vs_native", 0.9)],
    "softmax": [("vs_native", 0.9)],
}
BANDWIDTH_GOAL_PCT = 70.0
IN_CACHE_BYTES = 768 << 10  # the bound probe's traffic: inside one core's L2 (1-2 MiB on this project's x86 CPUs)
PROBE_ROUNDS = 9
TIE = 0.95  # a memory-bound loser within 5 % of the winner at >= BANDWIDTH_GOAL_PCT: a tie at the memory's limit
# grain sizes: each kernel's manifest declares its search space ([tune.cpu] grain_size)
TUNE_SAMPLE_S = 2e-3        # one timed sample of a grain candidate: enough calls to last this long
FIRST_USE_BUDGET_S = 0.25   # tuning a shape class the first time bench or profile meets it


class BenchError(OpscopeError):
    """The benchmark cannot run as asked."""


def steady_allocator() -> bool:
    """Keep freed big blocks in the process (glibc): see the module docstring. False if not glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(-4, 0)) and bool(libc.mallopt(-1, 1 << 30))  # M_MMAP_MAX, M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        return False


@dataclass
class Timing:
    median_ms: float
    p20_ms: float
    p80_ms: float
    samples_ms: list[float] = field(default_factory=list)


@dataclass
class CaseResult:
    kernel: str
    case: str
    dtype: str
    shapes: list[list[int]]
    bytes: int
    timings: dict[str, Timing]
    gbps: float
    pct_bandwidth: float | None
    ratios: dict[str, float]
    grain: int
    compile_s: float | None = None
    in_cache_gbps: float | None = None
    bound: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "case": self.case, **verdict(self.ratios, self.pct_bandwidth),
                "dtype": self.dtype, "shapes": self.shapes,
                "bytes": self.bytes, "gbps": self.gbps, "pct_bandwidth": self.pct_bandwidth, "ratios": self.ratios,
                "in_cache_gbps": self.in_cache_gbps, "bound": self.bound,
                "grain": self.grain, "compile_s": self.compile_s,
                "timings": {k: vars(v) for k, v in self.timings.items()}}


def verdict(ratios: dict[str, float], pct_bandwidth: float | None) -> dict[str, Any]:
    """A case's summary: `vs_aten` (the native aten op, else the eager composite that aten runs),
    `vs_compile` (torch.compile of the composite; null when it was left out), `vs_best` (against the better
    of the two), and whether the kernel is `suggested` there: only when it beats both (vs_best >= 1.0);
    else `why` says which one wins and by how much (and, when the kernel already moves >= 70 % of the
    measured bandwidth and is within TIE of the winner, that the two are tied at the memory's limit). A
    ratio is other median / kernel median (> 1: kernel faster)."""
    aten = ratios.get("vs_native", ratios.get("vs_eager"))
    compile_ = ratios.get("vs_compiled")
    known = [r for r in (aten, compile_) if r is not None]
    best = min(known) if known else None
    out: dict[str, Any] = {"vs_aten": aten, "vs_compile": compile_, "vs_best": best, "pct_bandwidth": pct_bandwidth,
                           "suggested": best is not None and best >= 1.0, "why": None}
    if best is None:
        out["why"] = "nothing to compare with was timed"
    elif best < 1.0:
        winner = "torch.compile" if compile_ is not None and best == compile_ else "aten"
        out["why"] = (f"{winner} is faster: the kernel runs at {best:.2f}x its speed"
                      + (f" ({pct_bandwidth:.0f}% of the measured bandwidth)" if pct_bandwidth is not None else ""))
        if pct_bandwidth is not None and pct_bandwidth >= BANDWIDTH_GOAL_PCT and best >= TIE:
            out["why"] += "; both are at the memory's limit: a tie within the run-to-run noise, not a kernel to swap in"
    elif compile_ is None:
        out["why"] = "compared with aten only (torch.compile left out)"
    return out


def bound(in_cache_gbps: float | None, peak_gbps: float | None) -> str | None:
    """"memory" when the kernel, its data in cache, moves bytes faster than the memory supplies them (at
    full size the memory is its limit), "compute" when it does not even then; None when either is unknown."""
    if in_cache_gbps is None or not peak_gbps:
        return None
    return "memory" if in_cache_gbps >= peak_gbps else "compute"


def in_cache_args(args: tuple, fn: Callable[..., Any], limit: int = IN_CACHE_BYTES
                  ) -> tuple[tuple, tuple, int] | None:
    """The case's arguments cut so that inputs and output together move at most `limit` bytes, for the
    bound probe: a band of rows from the middle of the first tensor (rows of a causal mask near the top
    or bottom do less or more work than the average row), at its outermost dim where such a band of at
    least 2 rows fits (the dims before it cut to their middle index), each row as long as at full size.
    Other tensors are cut alike where a dim of theirs, aligned from the right as broadcasting aligns it,
    is that same dim (a bias, a weight, a broadcast operand's size-1 dims are kept whole). Returns
    (the cut, the same cut with half the rows, the rows), or None when no band of 2 rows fits."""
    import torch

    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if not tensors or tensors[0].dim() < 2:
        return None
    first = tensors[0]
    for d in range(first.dim() - 1):
        lead = first.shape[d]
        if lead < 2:
            continue
        one, two = cut_band(args, first, d, 1), cut_band(args, first, d, 2)
        t1, t2 = traffic_bytes(one, fn(*one)), traffic_bytes(two, fn(*two))
        per_row, fixed = t2 - t1, 2 * t1 - t2  # the traffic is linear in the rows: the whole tensors are fixed
        rows = min(lead, (limit - fixed) // per_row) if per_row > 0 else 0
        while rows >= 2:
            cut = cut_band(args, first, d, rows)
            if traffic_bytes(cut, fn(*cut)) <= limit:
                return cut, cut_band(args, first, d, rows // 2), rows
            rows //= 2
    return None


def cut_band(args: tuple, first: Any, d: int, rows: int) -> tuple:
    """`args` with `rows` middle indices of `first`'s dim d, the middle index of each of its dims before d,
    and the same cut in every tensor dim aligned (from the right) with one of those dims and as long."""
    import torch

    rank = first.dim()

    def cut(t: torch.Tensor) -> torch.Tensor:
        index: list[slice] = []
        for j in range(t.dim()):
            i = j + rank - t.dim()  # the first tensor's dim that broadcasting aligns with t's dim j
            if 0 <= i <= d and t.shape[j] == first.shape[i] and t.shape[j] > 1:
                n = rows if i == d else 1
                lo = (t.shape[j] - n) // 2
                index.append(slice(lo, lo + n))
            else:
                index.append(slice(None))
        return t[tuple(index)].contiguous()

    return tuple(cut(a) if isinstance(a, torch.Tensor) else a for a in args)


def in_cache_gbps(fn: Callable[..., Any], args: tuple, threads: int) -> float | None:
    """Bytes per second `fn` (the kernel's own forward, without the Python layer of its custom op) moves on
    `args` cut to fit in cache (in_cache_args), on one thread (a call of tens of µs would mostly time the
    threads' start), times `threads` (each core has its own cache): the rate its arithmetic allows
    whatever the memory. From the cut and half of it, interleaved: the difference in bytes over the
    difference in time, so that the per-call cost (dispatch, allocation) cancels. None when the case
    cannot be cut to a band of 2 rows."""
    import torch

    with torch.no_grad():
        found = in_cache_args(args, fn)
        if found is None:
            return None
        cut, half, _rows = found
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            t = {n: v.median_ms for n, v in race({"cut": functools.partial(fn, *cut),
                                                   "half": functools.partial(fn, *half)}, PROBE_ROUNDS).items()}
        finally:
            torch.set_num_threads(before)
        extra_bytes = traffic_bytes(cut, fn(*cut)) - traffic_bytes(half, fn(*half))
        extra_ms = t["cut"] - t["half"]
        if extra_bytes <= 0 or extra_ms <= 0:
            return None  # too close to tell apart (noise): no claim
        return extra_bytes / (extra_ms * 1e-3) / 1e9 * threads


def _quantile(values: list[float], q: float) -> float:
    s = sorted(values)
    pos = (len(s) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summarize(samples_s: list[float]) -> Timing:
    ms = [s * 1e3 for s in samples_s]
    return Timing(statistics.median(ms), _quantile(ms, 0.2), _quantile(ms, 0.8), ms)


def interleaved(candidates: dict[str, Callable[[], Any]], repeats: int,
                sync: Callable[[], None] = lambda: None, setup: Callable[[], None] = lambda: None) -> dict[str, Timing]:
    """Warm up every candidate, then `repeats` rounds timing each once, the order rotated per round.
    `sync` (torch.cuda.synchronize on a GPU) runs before and after each timed call; `setup` before each
    call, untimed (opscope swap puts the model's parameters back before every training step)."""
    names = list(candidates)
    for name in names:
        for _ in range(WARMUP):
            setup()
            candidates[name]()
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            setup()
            sync()
            t0 = time.perf_counter()
            out = candidates[name]()
            sync()
            samples[name].append(time.perf_counter() - t0)
            del out
    return {n: summarize(s) for n, s in samples.items()}


def batched(fn: Callable[[], Any], sync: Callable[[], None], sample_s: float) -> tuple[Callable[[], Any], int]:
    """`fn` repeated enough times back to back that one sample lasts about `sample_s`, and that count
    (a call of a few µs is below the timer's and the loop's own noise)."""
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    once = max(time.perf_counter() - t0, 1e-7)
    k = max(1, min(1000, round(sample_s / once)))

    def many() -> Any:
        for _ in range(k):
            out = fn()
        return out

    return many, k


def per_call(t: Timing, k: int) -> Timing:
    """A batched candidate's timing as one call's."""
    return summarize([s / 1e3 / k for s in t.samples_ms])


def race(calls: dict[str, Callable[[], Any]], rounds: int, sync: Callable[[], None] = lambda: None,
         sample_s: float = TUNE_SAMPLE_S) -> dict[str, Timing]:
    """Each call batched to last about `sample_s`, then `rounds` interleaved rounds of the batches: each
    one's timing per call, by name (the tuners', the bound probe's and the in-context timing's method)."""
    batches: dict[str, Callable[[], Any]] = {}
    counts: dict[str, int] = {}
    for name, fn in calls.items():
        batches[name], counts[name] = batched(fn, sync, sample_s)
    return {name: per_call(t, counts[name]) for name, t in interleaved(batches, rounds, sync).items()}


def _tuned(knobs: dict[str, int], timings: dict[str, Timing], rounds: int) -> dict[str, Any]:
    """A tuning cache entry: the chosen knob values and the evidence (every candidate's median, the rounds)."""
    return {**knobs, "candidates_ms": {k: round(v.median_ms, 5) for k, v in timings.items()}, "rounds": rounds,
            "measured": _dt.datetime.now().isoformat(timespec="seconds")}


def _module(name: str) -> Any:
    """The kernel's op module (its composite, native op and bench arguments); importing it registers
    nothing."""
    return importlib.import_module(f"reference_kernels.{name}.op")


def make_args(manifest: Any, case: Any, scale: float = 1.0, device: str = "cpu") -> tuple:
    import torch

    dtype = getattr(torch, case.dtype)
    g = torch.Generator().manual_seed(0)
    tensors = [torch.randn([max(1, math.ceil(d * scale)) for d in shape], generator=g).to(device=device, dtype=dtype)
               for shape in case.inputs]
    mod = _module(manifest.name)
    if hasattr(mod, "bench_args"):
        return mod.bench_args(tensors, dict(case.kwargs))
    return (*tensors, *case.kwargs.values())


def traffic_bytes(args: tuple, out: Any) -> int:
    import torch

    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in [*tensors, out])


def search_space(manifest: Any) -> tuple[int, ...]:
    """The grain sizes the manifest's `[tune.cpu]` declares (just the built-in default when none)."""
    return tuple(manifest.tune.get("cpu", {}).get("grain_size", (0,)))


def tune(manifest: Any, args: tuple, repeats: int = 7, budget_s: float | None = None) -> dict[str, Any]:
    """Measure the CPU kernel's forward at each grain size of its search space (interleaved, batched
    calls) and cache the fastest for these arguments' shape class. `budget_s` fits the rounds to that many
    seconds (at least 3, at most `repeats`)."""
    import torch

    from reference_kernels import _build, tuning

    _build.load_cpu_extension()
    fn = f"{manifest.name}_forward"
    raw = getattr(torch.ops.opscope_cpu, fn)
    grains = search_space(manifest)
    rounds = repeats if budget_s is None else max(3, min(repeats, int(budget_s / (len(grains) * TUNE_SAMPLE_S))))
    with torch.no_grad():
        timings = race({str(g): functools.partial(raw, *args, g) for g in grains}, rounds)
    best = min(grains, key=lambda g: timings[str(g)].median_ms)
    values = _tuned({"grain_size": best}, timings, rounds)
    tuning.store(manifest.name, fn, args, values)
    return values


def ensure_tuned(manifest: Any, args: tuple, budget_s: float = FIRST_USE_BUDGET_S) -> dict[str, Any] | None:
    """The cached tuning of these arguments' shape class; tuned now, within `budget_s`, on first use (a
    kernel with one candidate, or an unwritable cache, stays at its default: None)."""
    from reference_kernels import tuning

    entry = tuning.lookup(manifest.name, f"{manifest.name}_forward", args)
    if entry is not None or len(search_space(manifest)) < 2:
        return entry
    try:
        return tune(manifest, args, budget_s=budget_s)
    except OSError:
        return None


def triton_configs(manifest: Any) -> list[dict[str, int]]:
    """Every launch configuration of the manifest's `[tune.triton]` space (each knob's values crossed), in
    the knobs' declared order; empty when it declares none."""
    import itertools

    space = manifest.tune.get("triton", {})
    names = list(space)
    return [dict(zip(names, values, strict=True)) for values in itertools.product(*(space[n] for n in names))]


def tune_triton(manifest: Any, args: tuple, repeats: int = 7) -> dict[str, Any]:
    """Time the Triton forward at every configuration of its manifest's `[tune.triton]` space on `args`
    (on the GPU: each configuration compiled first, then batched calls, interleaved rounds with
    torch.cuda.synchronize around each) and cache the fastest for these arguments' class (key function
    "triton:<name>_forward", keyed by the GPU's model). Under the Triton interpreter it runs too, but
    its times say nothing about a GPU: the tests use it for the plumbing only."""
    import importlib

    import torch

    from reference_kernels import _triton, tuning

    configs = triton_configs(manifest)
    if not configs:
        raise BenchError(f"{manifest.name}: its manifest declares no [tune.triton] space")
    fwd = getattr(importlib.import_module(f"reference_kernels.{manifest.name}.triton_kernels"),
                  f"{manifest.name}_forward")
    on_gpu = any(isinstance(a, torch.Tensor) and a.device.type == "cuda" for a in args)
    sync: Callable[[], None] = torch.cuda.synchronize if on_gpu else (lambda: None)
    calls: dict[str, Callable[[], Any]] = {}
    for config in configs:

        def call(config: dict[str, int] = config) -> Any:
            with _triton.forced(config):
                return fwd(*args)

        calls[" ".join(f"{k}={v}" for k, v in config.items())] = call
    with torch.no_grad():
        for launch in calls.values():
            launch()  # compiles each configuration: not part of the batch size's measure
        timings = race(calls, repeats, sync)
    labels = list(calls)
    best = min(range(len(configs)), key=lambda i: timings[labels[i]].median_ms)
    values = _tuned(configs[best], timings, repeats)
    tuning.store(manifest.name, _triton.TUNED_PREFIX + f"{manifest.name}_forward", args, values)
    return values


class FirstUseTuning:
    """A reference_kernels.tuning.first_use tuner that defers: within the block it only keeps, per untuned key,
    the first arguments a bundled kernel's CPU forward ran on (copies); `tune()` then tunes each, outside
    anything timed or checked (`opscope swap` verifies first, tunes, then benchmarks on the tuned grain)."""

    def __init__(self) -> None:
        self.pending: dict[str, tuple[str, tuple[Any, ...]]] = {}

    def __call__(self, kernel: str, fn: str, args: tuple[Any, ...]) -> None:
        import torch

        from reference_kernels import tuning

        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        # forward only (the tuning's function), on real CPU tensors (not fake or meta ones under a tracer)
        if fn != f"{kernel}_forward" or not tensors or not all(
                type(t) in (torch.Tensor, torch.nn.Parameter) and t.device.type == "cpu" for t in tensors):
            return
        self.pending.setdefault(tuning.key(kernel, fn, args), (kernel, tuple(
            a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args)))

    def tune(self, budget_s: float = FIRST_USE_BUDGET_S) -> list[str]:
        """Tunes every kept class within `budget_s` each; one line per class tuned (for the run's notes)."""
        from opscope.kernels.catalog import find

        done = []
        pending, self.pending = self.pending, {}
        for kernel, args in pending.values():
            values = ensure_tuned(find(kernel), args, budget_s)
            if values is not None:
                done.append(f"{kernel}: grain size {values['grain_size'] or 'default'} tuned on first use for "
                            f"{_shapes(args)}")
        return done


def _shapes(args: tuple[Any, ...]) -> str:
    import torch

    return ", ".join("x".join(map(str, a.shape)) for a in args if isinstance(a, torch.Tensor))


def parse_shape(text: str) -> tuple[int, ...]:
    """--shape 4096x4096 (one tensor argument's shape; `x`-separated positive ints)."""
    try:
        dims = tuple(int(d) for d in text.lower().split("x"))
    except ValueError:
        dims = ()
    if not dims or any(d < 1 for d in dims):
        raise BenchError(f"--shape {text!r}: expected a shape such as 4096x4096 (one per tensor argument)")
    return dims


def tune_run(names: list[str], shapes: list[str], dtype: str = "float32", repeats: int = 15,
             progress: Callable[[str], None] | None = None, device: str = "cpu", scale: float = 1.0) -> dict[str, Any]:
    """`opscope kernels --tune [NAME] [--shape S ...]`: tune each CPU kernel on its manifest's cases, or the
    named kernel on the given tensor shapes (in signature order; other arguments from its first case),
    and cache the winners. `device` "cuda": the Triton forwards' launch configurations, on the GPU; `scale`
    multiplies every dim of the manifest's cases (as --bench --scale does, so a bench finds its classes tuned).
    Returns the document the CLI prints."""
    import torch

    import reference_kernels
    from reference_kernels import manifest as mf
    from reference_kernels import tuning

    if shapes and len(names) != 1:
        raise BenchError("--shape tunes one kernel: name it (opscope kernels NAME --tune --shape 4096x4096 ...)")
    if device == "cuda" and not torch.cuda.is_available():
        raise BenchError("--tune --device cuda: no GPU is available here (the Triton launches are tuned on the GPU "
                         "they will run on)")
    backend = "triton" if device == "cuda" else "cpu"
    note = tuning.note()  # before this run's stores replace an ignored file
    results = []
    for m in reference_kernels.manifests():
        if names and m.name not in names or backend not in m.tune:
            continue
        if dtype not in m.dtypes:
            raise BenchError(f"--dtype {dtype}: {m.name} takes {', '.join(m.dtypes)}")
        cases = [mf.BenchCase(name="--shape", inputs=tuple(parse_shape(s) for s in shapes), dtype=dtype,
                              kwargs=dict(m.bench[0].kwargs) if m.bench else {})] if shapes else list(m.bench)
        for case in cases:
            if progress:
                progress(f"opscope: tuning {m.name} {case.name}")
            try:
                args = make_args(m, case, 1.0 if shapes else scale, device)
            except (RuntimeError, ValueError, TypeError) as exc:
                raise BenchError(f"{m.name}: cannot build its arguments from {[list(i) for i in case.inputs]} "
                                 f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from exc
            if backend == "triton":
                from reference_kernels import _triton  # imports triton: only where it tunes Triton launches

                fn = _triton.TUNED_PREFIX + f"{m.name}_forward"
                values = tune_triton(m, args, repeats=repeats)
                chosen = " ".join(f"{k}={values[k]}" for k in m.tune["triton"])
            else:
                fn = f"{m.name}_forward"
                values = tune(m, args, repeats=repeats)
                chosen = f"grain_size={values['grain_size']}"
            results.append({"kernel": m.name, "case": case.name, "shapes": [list(a.shape) for a in args
                                                                           if isinstance(a, torch.Tensor)],
                            "dtype": case.dtype, "shape_class": tuning.shape_class(args), **values,
                            "chosen": chosen, "key": tuning.key(m.name, fn, args)})
    return {"machine": tuning.gpu_name(torch.cuda.current_device()) if backend == "triton" else tuning.machine(),
            "threads": torch.get_num_threads(), "cache": str(tuning.cache_path()), "note": note, "backend": backend,
            "results": results}


def bench_case(manifest: Any, case: Any, repeats: int, peak_gbps: float | None, compiled: bool = True,
               scale: float = 1.0, do_tune: bool = False, device: str = "cpu") -> CaseResult:
    import torch

    import reference_kernels
    from reference_kernels import tuning

    mod = _module(manifest.name)
    args = make_args(manifest, case, scale, device)
    if do_tune and device == "cpu":
        tune(manifest, args)
    elif do_tune and "triton" in manifest.tune:
        from reference_kernels import _dispatch

        if _dispatch.backend_for(torch.device(device)) == "triton":
            tune_triton(manifest, args)
    elif device == "cpu":
        ensure_tuned(manifest, args)
    kernel = reference_kernels.load(manifest.name)  # torch.ops.opscope.<name>, registered on first use
    candidates: dict[str, Callable[[], Any]] = {"kernel": lambda: kernel(*args)}
    if mod.native is not None and mod.native is not mod.composite:
        candidates["native"] = lambda: mod.native(*args)
    candidates["eager"] = lambda: mod.composite(*args)
    compile_s = None
    if compiled:
        torch._dynamo.reset()
        fn = torch.compile(mod.composite, dynamic=False)
        t0 = time.perf_counter()
        fn(*args)
        compile_s = time.perf_counter() - t0
        candidates["compiled"] = lambda: fn(*args)
    with torch.no_grad():
        out = kernel(*args)
        timings = interleaved(candidates, repeats, torch.cuda.synchronize if device == "cuda" else lambda: None)
    nbytes = traffic_bytes(args, out)
    k = timings["kernel"].median_ms
    ratios = {f"vs_{n}": timings[n].median_ms / k for n in timings if n != "kernel"}
    if "vs_native" not in ratios and mod.native is mod.composite:
        ratios["vs_native"] = ratios["vs_eager"]  # the composite is the native op (a + b, torch.sum, ...)
    gbps = nbytes / (k * 1e-3) / 1e9
    grain = tuning.knob(manifest.name, f"{manifest.name}_forward", args, "grain_size")
    cached = None
    if device == "cpu":
        raw = getattr(torch.ops.opscope_cpu, f"{manifest.name}_forward")
        cached = in_cache_gbps(lambda *a: raw(*a, grain), args, torch.get_num_threads())
    return CaseResult(kernel=manifest.name, case=case.name, dtype=case.dtype,
                      shapes=[list(a.shape) for a in args if isinstance(a, torch.Tensor)], bytes=nbytes,
                      timings=timings, gbps=gbps, pct_bandwidth=100 * gbps / peak_gbps if peak_gbps else None,
                      ratios=ratios, grain=grain, compile_s=compile_s, in_cache_gbps=cached, bound=bound(cached, peak_gbps))


def goal_checks(results: list[CaseResult]) -> list[dict[str, Any]]:
    """Each issue goal on each case: the measured value, the target and whether it is met."""
    checks = []
    for r in results:
        for key, target in GOALS.get(r.kernel, []):
            if key in r.ratios:
                checks.append({"kernel": r.kernel, "case": r.case, "goal": f"{key} >= {target}",
                               "value": round(r.ratios[key], 3), "met": r.ratios[key] >= target})
        if r.bound == "compute" and r.in_cache_gbps:
            # its own arithmetic, not the memory, is its ceiling here: the goal is read against that one
            pct = 100 * r.gbps / r.in_cache_gbps
            checks.append({"kernel": r.kernel, "case": r.case,
                           "goal": f"% of its in-cache rate >= {BANDWIDTH_GOAL_PCT:g} (compute-bound here)",
                           "value": round(pct, 1), "met": pct >= BANDWIDTH_GOAL_PCT})
        elif r.pct_bandwidth is not None:
            checks.append({"kernel": r.kernel, "case": r.case, "goal": f"% of bandwidth >= {BANDWIDTH_GOAL_PCT:g}",
                           "value": round(r.pct_bandwidth, 1), "met": r.pct_bandwidth >= BANDWIDTH_GOAL_PCT})
    return checks


def machine_info(threads: int, peak_gbps: float | None, peak_origin: str) -> dict[str, Any]:
    import torch

    from opscope.machine.calibrate import cpu_model_name
    from reference_kernels import _build

    _build.load_cpu_extension()
    return {"cpu": cpu_model_name(), "threads": threads, "isa": torch.ops.opscope_cpu.isa(),
            "torch": torch.__version__, "opscope": __version__, "python": platform.python_version(),
            "peak_bandwidth_gbps": peak_gbps, "peak_origin": peak_origin,
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "date": _dt.datetime.now().isoformat(timespec="seconds")}


def run(names: list[str], repeats: int = 15, peak_gbps: float | None = None, compiled: bool = True,
        scale: float = 1.0, do_tune: bool = False, steady: bool = True,
        progress: Callable[[str], None] | None = None, device: str = "cpu") -> dict[str, Any]:
    import torch

    import reference_kernels

    if repeats < 3:
        raise BenchError("--repeats must be at least 3 (median with p20/p80)")
    if device == "cuda" and not torch.cuda.is_available():
        raise BenchError("--device cuda: no GPU is available here (the GPU kernels are compiled and "
                         "interpreter-checked by the tests, not timed)")
    steady_ok = steady_allocator() if steady else False
    origin = "user"
    if peak_gbps is None and device == "cuda":
        from opscope.machine.peaks import gpu_peaks

        gp = gpu_peaks(torch.cuda.get_device_name(0))
        peak_gbps, origin = (gp.memory_bandwidth_gbps, "spec-table") if gp else (None, "unknown")
    elif peak_gbps is None:
        from opscope.machine.calibrate import cpu_peaks

        peaks, cached = cpu_peaks(progress=progress)
        peak_gbps, origin = peaks.memory_bandwidth_gbps, "measured (cached)" if cached else "measured"
    results = []
    for m in reference_kernels.manifests():
        if names and m.name not in names:
            continue
        for case in m.bench:
            if progress:
                progress(f"opscope: benchmarking {m.name} {case.name}")
            results.append(bench_case(m, case, repeats, peak_gbps, compiled, scale, do_tune, device))
    return {"machine": {**machine_info(torch.get_num_threads(), peak_gbps, origin), "device": device},
            "method": {"repeats": repeats, "warmup": WARMUP, "interleaved": True, "scale": scale,
                       "steady_allocator": steady_ok, "bytes": "inputs read once + output written once",
                       "ratio": "other median / kernel median (> 1: kernel faster)"},
            "results": [r.to_json() for r in results], "goals": goal_checks(results)}


def save(doc: dict[str, Any], out: Path) -> tuple[Path, Path]:
    make_folders(out)
    jpath, cpath = out / "kernels-bench.json", out / "kernels-bench.csv"
    jpath.write_text(json.dumps(doc, indent=1) + "\n")
    cols = ["kernel", "case", "dtype", "candidate", "median_ms", "p20_ms", "p80_ms", "gbps", "pct_bandwidth",
            "ratio_to_kernel", "grain", "torch", "opscope", "cpu", "threads"]
    with cpath.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        mach = doc["machine"]
        for r in doc["results"]:
            k = r["timings"]["kernel"]["median_ms"]
            for cand, t in r["timings"].items():
                gbps = r["bytes"] / (t["median_ms"] * 1e-3) / 1e9
                pct = 100 * gbps / mach["peak_bandwidth_gbps"] if mach["peak_bandwidth_gbps"] else ""
                row = [r["kernel"], r["case"], r["dtype"], cand, f"{t['median_ms']:.4f}", f"{t['p20_ms']:.4f}",
                       f"{t['p80_ms']:.4f}", f"{gbps:.2f}", f"{pct:.1f}" if pct != "" else "",
                       f"{t['median_ms'] / k:.3f}", r["grain"], mach["torch"], mach["opscope"], mach["cpu"],
                       mach["threads"]]
                text = (0, 1, 2, 3, 11, 12, 13)  # names and versions, never formulas (opscope.run.cells)
                w.writerow([spreadsheet_safe(str(v)) if i in text else v for i, v in enumerate(row)])
    return jpath, cpath


