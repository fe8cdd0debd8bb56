"""The five classic custom-operator traps, checked on the kernel itself with the calls the model made
(the arguments recorded at each site during verification; the most frequent signatures, at most
CALLS_PER_SITE per site). Each trap calls the site's kernel path directly (a manifest's call mapping
included) on fresh copies of those arguments, and is one row of the verification table:

1. device / dtype: the first tensor argument on another device (the CPU for CUDA tensors, else CUDA when
   present, else the meta device) must raise, not compute (unless the original computes too: torch runs a
   meta input against CPU weights, giving a meta result); the first floating tensor in another dtype (float64,
   or float32 for float64) must raise or give what the original gives for those same arguments (dtype
   and values), or else match the original's math done in float64 within the tolerance or twice the
   original's own error there (an original that rounds to float32 inside is not the standard); where the
   original refuses the mix and the kernel converts explicitly, its result must be in that argument's
   dtype and equal its result on the unconverted arguments. A kernel that ignores its inputs' dtype
   (answers in float32, reads float64 memory as float32) fails.
2. memory reuse: a result must not change when its inputs are freed and their memory reused (the inputs
   dropped, the kernel run again on other data, buffers of the same sizes allocated and filled).
3. autograd (train mode, where the kernel is under autograd: not an aten route, which keeps the original
   op's derivative): the output must require grad, and its gradients with respect to the floating
   arguments (and a module's parameters) must match the original's; a forward-only kernel is "no autograd".
4. memory growth: resident memory (and CUDA allocated memory) flat over many calls (forward and, in train
   mode, backward): growth above GROWTH_LIMIT after enough calls to move 64 MiB of outputs fails.
5. determinism: identical results, up to the kernel's documented reduction-order tolerance (its manifest
   tolerance; the model tolerance for other kernels), across repeated calls, torch.set_num_threads(1) vs
   N, and THREADS concurrent Python threads calling it (each with inputs of its own, compared with the
   same calls made alone); bitwise identity is reported.
Also: the kernel must leave its arguments bitwise unchanged.
"""

from __future__ import annotations

import gc
import math
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from opscope.swap.mechanisms import RecordedCall, version_of
from opscope.swap.tolerance import Check, Tol, compare_tensor, same_bits
from opscope.target.model_file import describe_exception

CALLS_PER_SITE = 2
GROWTH_LIMIT = 16 << 20     # bytes of RSS / CUDA memory growth over the memory loop
GROWTH_BYTES = 64 << 20     # outputs the memory loop produces (calls = this / output bytes, bounded)
MIN_CALLS, MAX_CALLS = 20, 2000
MEMORY_BUDGET_S = 5.0
THREADS = 4
CALLS_PER_THREAD = 3
TRAPS = ("arguments unchanged", "device/dtype", "memory reuse", "autograd", "memory growth", "determinism")


class _Declined(Exception):
    """The kernel returned NotImplemented for this call (a user kernel declining it)."""


def tensors_of(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors_of(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors_of(v)]
    return []


def _map(value: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_map(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: _map(v, fn) for k, v in value.items()}
    return value


def fresh_args(call: RecordedCall, fn: Callable[[torch.Tensor], torch.Tensor] | None = None) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """New copies of the recorded arguments (through `fn`, else clones)."""
    f = fn or (lambda t: t.detach().clone())
    return _map(call.args, f), _map(call.kwargs, f)


def _run(call: RecordedCall, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    out = call.site.replacement(*args, **kwargs)
    if out is NotImplemented:
        raise _Declined
    return out


def _perturbed(call: RecordedCall, seed: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The recorded arguments with each floating tensor redrawn (same shape, dtype, scale), seeded."""
    gen = torch.Generator().manual_seed(seed)

    def redraw(t: torch.Tensor) -> torch.Tensor:
        if not t.is_floating_point():
            return t.detach().clone()
        return (torch.randn(t.shape, generator=gen) * (float(t.float().std()) if t.numel() > 1 else 1.0)
                ).to(device=t.device, dtype=t.dtype)

    return _map(call.args, redraw), _map(call.kwargs, redraw)


def _copies(a: tuple[tuple[Any, ...], dict[str, Any]]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    return _map(a[0], lambda t: t.clone()), _map(a[1], lambda t: t.clone())


def _rss() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _mib(n: float) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def _results_match(got: Any, want: Any, tol_of: Callable[[torch.dtype], Tol]) -> str:
    """'' when every tensor of `got` matches `want` within tolerance, else what differs."""
    g, w = tensors_of(got), tensors_of(want)
    if len(g) != len(w):
        return f"{len(g)} output tensor(s), expected {len(w)}"
    for i, (a, b) in enumerate(zip(g, w, strict=True)):
        d = compare_tensor(a, b, tol_of(b.dtype))
        if d.problem or d.out:
            what = d.problem or f"{d.out} of {d.n} elements differ beyond the tolerance (max abs {d.max_abs:.3g})"
            return f"output {i}: {what}" if len(g) > 1 else what
    return ""


def _bitwise(got: Any, want: Any) -> bool:
    g, w = tensors_of(got), tensors_of(want)
    return len(g) == len(w) and all(same_bits(a.detach(), b.detach()) for a, b in zip(g, w, strict=True))


# --- the traps -----------------------------------------------------------------------------------------


def trap_arguments_unchanged(call: RecordedCall, **_: Any) -> str:
    args, kwargs = fresh_args(call)
    keep = fresh_args(call)
    versions = [version_of(p) for p in call.site.params]
    _run(call, args, kwargs)
    changed = [i for i, (a, b) in enumerate(zip(tensors_of((args, kwargs)), tensors_of(keep), strict=True))
               if not same_bits(a.detach(), b)]
    if changed:
        return f"the kernel wrote to its argument(s) {', '.join(str(i) for i in changed)} in place"
    if [version_of(p) for p in call.site.params] != versions:
        return "the kernel wrote to the module's parameters"
    return ""


def _other_device(device: torch.device) -> torch.device:
    if device.type == "cuda":
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("meta")


def trap_device_dtype(call: RecordedCall, tol_of: Callable[[torch.dtype], Tol], **_: Any) -> str:
    problems = []
    tensors = tensors_of((call.args, call.kwargs))
    if tensors:
        first = tensors[0]
        other = _other_device(first.device)

        def moved() -> tuple[tuple[Any, ...], dict[str, Any]]:
            return fresh_args(call, lambda t: t.detach().to(other) if t is first else t.detach().clone())

        try:
            got = _run(call, *moved())
        except Exception:  # noqa: BLE001 (raising, or declining, is the expected behaviour)
            got = None
        if got is not None:
            try:  # computing is fine only where torch itself does (a meta input gives a meta result)
                want = call.site.original(*moved()[0], **moved()[1])
            except Exception:  # noqa: BLE001
                want = None
            same = want is not None and [(t.device, t.shape) for t in tensors_of(got)] == \
                [(t.device, t.shape) for t in tensors_of(want)]
            if not same:
                problems.append(f"computed with argument 0 on {other} and the rest on {first.device} where the "
                                "original raises (or gives another result): mismatched devices must raise")
    floating = [t for t in tensors if t.is_floating_point()]
    if floating:
        first = floating[0]
        to = torch.float32 if first.dtype == torch.float64 else torch.float64

        def convert(t: torch.Tensor) -> torch.Tensor:
            return t.detach().to(to) if t is first else t.detach().clone()

        args, kwargs = fresh_args(call, convert)
        try:
            got = _run(call, args, kwargs)
        except _Declined:
            return "; ".join(problems)
        except Exception:  # noqa: BLE001 (refusing mixed dtypes is fine)
            return "; ".join(problems)
        args, kwargs = fresh_args(call, convert)
        original_computes = True
        try:
            want = call.site.original(*args, **kwargs)
        except Exception:  # noqa: BLE001 (torch refuses the mix; the kernel converts explicitly)
            # Then the kernel must have read the converted argument as what it is: its result in that
            # argument's dtype, equal (at the original dtype's tolerance) to its result on the original
            # arguments. A kernel reading float64 memory as float32, or answering in float32, fails.
            base = _run(call, *fresh_args(call))
            want = _map(base, lambda t: t.to(to) if t.is_floating_point() else t)
            tol_of = _at_least(tol_of, first.dtype)
            original_computes = False
        differs = _results_match(got, want, tol_of)
        lower = max(first.dtype, to, key=lambda d: torch.finfo(d).eps)
        if differs and original_computes and (reference := _reference(call, convert, want, _at_least(tol_of, lower))):
            # The original has its own rounding (LlamaRMSNorm computes in float32 whatever it is given):
            # the kernel is judged against the same math done in float64, allowed twice the original's
            # own error there. Only a kernel less accurate than the original fails.
            ref, allowed = reference
            differs = _results_match(got, ref, lambda d: _widened(tol_of(d), allowed))
            if differs:
                differs += " against a float64 reference of the original's math"
        if differs:
            problems.append(f"with the first floating argument in {str(to).removeprefix('torch.')} (the rest "
                            f"{str(first.dtype).removeprefix('torch.')}): {differs} (ignores its inputs' dtype?)")
    return "; ".join(problems)


class _Float64Math(TorchDispatchMode):  # type: ignore[no-untyped-call, unused-ignore]  # unannotated in torch
    """Every op in float64: floating tensor arguments and requested floating dtypes (`.to(torch.float32)`,
    `dtype=` of factories) of lower precision are raised to float64, so a function's own math runs
    without its intermediate roundings."""

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        return func(*_raised(args), **_raised(kwargs or {}))


def _raised(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(torch.float64) if value.is_floating_point() and value.dtype != torch.float64 else value
    if isinstance(value, torch.dtype):
        return torch.float64 if value.is_floating_point and value != torch.float64 else value
    if isinstance(value, (list, tuple)):
        return type(value)(_raised(v) for v in value)
    if isinstance(value, dict):
        return {k: _raised(v) for k, v in value.items()}
    return value


def _reference(call: RecordedCall, convert: Callable[[torch.Tensor], torch.Tensor], want: Any,
               tol_of: Callable[[torch.dtype], Tol]) -> tuple[list[torch.Tensor], float] | None:
    """The original's math on the converted arguments done in float64 (each output in the dtype the
    original gives), and the original's own error against it (max abs over RMS, the worst output).
    None where that reference cannot be had or is not trustworthy: it must agree with the original
    within `tol_of` (the lower precision's tolerance; an in-place op on a raised copy would not)."""
    args, kwargs = fresh_args(call, convert)
    try:
        with torch.no_grad(), _Float64Math():
            raw = call.site.original(*args, **kwargs)
    except Exception:  # noqa: BLE001 (no reference: the comparison with the original stands)
        return None
    refs, wants = tensors_of(raw), tensors_of(want)
    if len(refs) != len(wants) or any(r.shape != w.shape or r.device != w.device for r, w in zip(refs, wants, strict=True)):
        return None
    if _results_match(want, refs_in := [r.to(w.dtype) for r, w in zip(refs, wants, strict=True)], tol_of):
        return None
    own = 0.0
    for r, w in zip(refs, wants, strict=True):
        if r.is_floating_point() and r.numel():
            r64, w64 = r.double(), w.detach().double()
            rms = float(torch.sqrt(torch.mean(r64 ** 2))) or 1.0
            own = max(own, float((w64 - r64).abs().max()) / rms)
    return refs_in, own


def _widened(tol: Tol, own: float) -> Tol:
    return Tol(tol.rtol, max(tol.atol, 2 * own))


def _at_least(tol_of: Callable[[torch.dtype], Tol], dtype: torch.dtype) -> Callable[[torch.dtype], Tol]:
    """Tolerances no tighter than `dtype`'s (a float32 computation checked in float64)."""
    def tol(d: torch.dtype) -> Tol:
        a, b = tol_of(d), tol_of(dtype)
        return Tol(max(a.rtol, b.rtol), max(a.atol, b.atol))

    return tol


def trap_memory_reuse(call: RecordedCall, **_: Any) -> str:
    args, kwargs = fresh_args(call)
    out = _run(call, args, kwargs)
    snap = [t.detach().clone() for t in tensors_of(out)]
    sizes = [(t.shape, t.dtype, t.device) for t in tensors_of((args, kwargs))]
    del args, kwargs
    gc.collect()
    junk: list[torch.Tensor] = []
    for k in range(2):
        other = fresh_args(call, lambda t: (torch.randn_like(t) * 3 + 1 if t.is_floating_point() else t.detach().clone()))
        _run(call, *other)
        junk.extend(torch.full(s, 7.0 + k, dtype=d, device=dev) for s, d, dev in sizes)
    changed = [i for i, (a, b) in enumerate(zip(tensors_of(out), snap, strict=True)) if not same_bits(a.detach(), b)]
    del junk
    if changed:
        return ("the result changed after its inputs were freed and the kernel ran again on other data: it points "
                "into memory the kernel does not own (a freed temporary or a shared buffer)")
    return ""


def trap_autograd(call: RecordedCall, tol_of: Callable[[torch.dtype], Tol], train: bool, **_: Any) -> str:
    if not train or not call.site.in_autograd:
        raise _NotApplicable("inference mode" if not train else
                             "aten route: the kernel runs below autograd, the original op's derivative is used")

    def leaves() -> tuple[tuple[Any, ...], dict[str, Any], list[torch.Tensor]]:
        args, kwargs = fresh_args(call, lambda t: t.detach().clone().requires_grad_(t.is_floating_point()))
        return args, kwargs, [t for t in tensors_of((args, kwargs)) if t.requires_grad]

    args, kwargs, xs = leaves()
    if not xs and not call.site.params:
        raise _NotApplicable("no floating arguments")
    out = _run(call, args, kwargs)
    outs = [t for t in tensors_of(out) if t.is_floating_point()]
    if not outs or not all(t.requires_grad for t in outs):
        return "no autograd: the kernel's output does not require grad (no grad_fn); the model cannot train through it"
    gen = torch.Generator().manual_seed(7)
    seeds = [torch.randn(t.shape, generator=gen).to(t) for t in outs]
    wrt = [*xs, *call.site.params]
    try:
        got = torch.autograd.grad(outs, wrt, seeds, allow_unused=True)
    except Exception as exc:  # noqa: BLE001
        return f"backward raised {describe_exception(exc)}"
    args, kwargs, xs2 = leaves()
    ref_out = [t for t in tensors_of(call.site.original(*args, **kwargs)) if t.is_floating_point()]
    want = torch.autograd.grad(ref_out, [*xs2, *call.site.params], seeds, allow_unused=True)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        what = f"argument {i}" if i < len(xs) else f"parameter {i - len(xs)}"
        if w is None:
            continue
        if g is None:
            return f"no gradient for {what} (the original has one)"
        d = compare_tensor(g, w, tol_of(w.dtype))
        if d.problem or d.out:
            return f"gradient of {what}: {d.problem or f'{d.out} of {d.n} elements out of tolerance (max abs {d.max_abs:.3g})'}"
    return ""


class _NotApplicable(Exception):
    pass


def trap_memory_growth(call: RecordedCall, train: bool, **_: Any) -> str:
    grad = train and call.site.in_autograd

    def once() -> None:
        args, kwargs = fresh_args(call, lambda t: t.detach().clone().requires_grad_(grad and t.is_floating_point()))
        out = _run(call, args, kwargs)
        outs = [t for t in tensors_of(out) if t.requires_grad]
        if outs:
            torch.autograd.backward(outs, [torch.ones_like(t) for t in outs])

    args, kwargs = fresh_args(call)
    out_bytes = sum(t.numel() * t.element_size() for t in tensors_of(_run(call, args, kwargs))) or 1
    del args, kwargs
    calls = max(MIN_CALLS, min(MAX_CALLS, math.ceil(GROWTH_BYTES / out_bytes)))
    cuda = torch.cuda.is_available()
    for _round in range(5):  # warm: one-time allocations (caches, workspaces) are not growth
        once()
    gc.collect()
    rss0 = _rss()
    cuda0 = torch.cuda.memory_allocated() if cuda else 0
    start = time.perf_counter()
    done = 0
    while done < calls and (done < MIN_CALLS or time.perf_counter() - start < MEMORY_BUDGET_S):
        once()
        done += 1
    gc.collect()
    rss1 = _rss()
    cuda1 = torch.cuda.memory_allocated() if cuda else 0
    if rss0 is None and not cuda:
        raise _NotApplicable("resident memory cannot be read on this system")
    problems = []
    if rss0 is not None and rss1 is not None and rss1 - rss0 > GROWTH_LIMIT:
        problems.append(f"resident memory grew by {_mib(rss1 - rss0)} over {done} calls "
                        f"({(rss1 - rss0) / done / 1024:.1f} KiB per call; outputs are {out_bytes / 1024:.1f} KiB)")
    if cuda and cuda1 - cuda0 > GROWTH_LIMIT:
        problems.append(f"CUDA allocated memory grew by {_mib(cuda1 - cuda0)} over {done} calls")
    return "; ".join(problems)


def trap_determinism(call: RecordedCall, tol_of: Callable[[torch.dtype], Tol], **_: Any) -> str:
    base = _run(call, *fresh_args(call))
    problems = []
    bitwise = True
    again = _run(call, *fresh_args(call))
    if d := _results_match(again, base, tol_of):
        problems.append(f"a repeated call differs: {d}")
    bitwise &= _bitwise(again, base)
    n = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _run(call, *fresh_args(call))
        torch.set_num_threads(max(2, n))
        many = _run(call, *fresh_args(call))
    finally:
        torch.set_num_threads(n)
    if d := _results_match(one, many, tol_of):
        problems.append(f"1 thread vs {max(2, n)} threads differ: {d}")
    bitwise &= _bitwise(one, many)
    # Concurrent calls: each thread has inputs of its own (a race shows as one thread's data in another's
    # result), each compared with the kernel's result on the same inputs computed alone beforehand.
    inputs = [[_perturbed(call, 100 * t + k) for k in range(CALLS_PER_THREAD)] for t in range(THREADS)]
    alone = [[_run(call, *_copies(a)) for a in mine] for mine in inputs]
    results: list[list[Any]] = [[] for _ in range(THREADS)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(THREADS)

    def worker(t: int) -> None:
        try:
            barrier.wait()
            for a in inputs[t]:
                results[t].append(_run(call, *_copies(a)))
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        problems.append(f"concurrent calls from {THREADS} threads raised {describe_exception(errors[0])}")
    else:
        pairs = [(r, a) for t in range(THREADS) for r, a in zip(results[t], alone[t], strict=True)]
        bad = [d for r, a in pairs if (d := _results_match(r, a, tol_of))]
        if bad:
            problems.append(f"{len(bad)} of {len(pairs)} concurrent calls from {THREADS} threads differ from the same "
                            f"call made alone: {bad[0]}")
        bitwise &= all(_bitwise(r, a) for r, a in pairs)
    if problems:
        return "; ".join(problems)
    return "" if bitwise else "=within tolerance, not bitwise identical"


_TRAP_FUNCTIONS: dict[str, Callable[..., str]] = {
    "arguments unchanged": trap_arguments_unchanged,
    "device/dtype": trap_device_dtype,
    "memory reuse": trap_memory_reuse,
    "autograd": trap_autograd,
    "memory growth": trap_memory_growth,
    "determinism": trap_determinism,
}


def select_calls(calls: list[RecordedCall]) -> list[RecordedCall]:
    """The most frequent signatures, at most CALLS_PER_SITE per site."""
    per_site: dict[int, int] = {}
    chosen = []
    for c in sorted(calls, key=lambda c: -c.calls):
        if per_site.get(id(c.site), 0) < CALLS_PER_SITE:
            per_site[id(c.site)] = per_site.get(id(c.site), 0) + 1
            chosen.append(c)
    return chosen


def run_traps(calls: list[RecordedCall], *, train: bool, tol_of: Callable[[torch.dtype], Tol],
              progress: Callable[[str], None] = lambda m: None) -> list[Check]:
    """One check per trap over the chosen calls (the first failure names its call)."""
    chosen = select_calls(calls)
    checks = []
    for name in TRAPS:
        progress(f"trap: {name}")
        check = Check(check=f"trap: {name}", passed=True, tensors=len(chosen))
        notes: list[str] = []
        applicable = 0
        for call in chosen:
            where = f"{call.site.where} ({call.signature})"
            try:
                problem = _TRAP_FUNCTIONS[name](call, tol_of=tol_of, train=train)
            except _NotApplicable as exc:
                notes.append(f"not applicable: {exc}")
                continue
            except _Declined:
                notes.append(f"{where}: the kernel declined the call")
                continue
            except Exception as exc:  # noqa: BLE001 (the kernel raised where it should compute)
                problem = f"the kernel raised {describe_exception(exc)}"
            applicable += 1
            if problem.startswith("="):
                notes.append(problem[1:])
            elif problem and check.passed:
                check.passed = False
                check.worst, check.detail = where, problem
        if check.passed:
            check.detail = "; ".join(dict.fromkeys(notes)) if notes else ""
            if not applicable and chosen:
                check.detail = check.detail or "not applicable"
        checks.append(check)
    return checks
