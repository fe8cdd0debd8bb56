"""The supervised child of `opscope swap` and `opscope profile --try-swaps` (opscope/supervise.py):
profiles the model as `opscope profile` does, then, with the same loaded model, builds, verifies and
benchmarks each swap, and writes the run directory with swap.json in it.

User kernels run only here, so a kernel that crashes the process (a segfault, an abort) takes this
child down, not opscope: the parent reports the crash (its last phase names the swap) and exits 1.
Phase names of the swaps start with "swap " for that reason.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from opscope.capture.options import Progress
from opscope.capture.worker import serve
from opscope.errors import OpscopeError
from opscope.target.specs import SwapJob, SwapSpec

PHASE_PREFIX = "swap "


class NothingToSwap(OpscopeError):
    """Every explicitly requested swap found nothing in the model to replace (exit 2)."""


def _first_failure(verification: Any) -> str:
    bad = verification.failures()
    if not bad:
        return ""
    c = bad[0]
    seed = f" (seed {c.seed})" if c.seed is not None else ""
    more = f"; {len(bad) - 1} more failed check(s)" if len(bad) > 1 else ""
    return f"{c.check}{seed}: {c.detail or 'failed'}{more}"


class SwapSession:
    """Runs every requested swap on the profiled model (the `extra` hook of profile_target)."""

    def __init__(self, spec: SwapSpec, progress: Progress) -> None:
        from opscope.kernels.catalog import SwapRequest

        self.requests = [SwapRequest.from_json(r) for r in spec.requests] if spec.requests is not None else None
        self.repeats = spec.repeats
        self.progress = progress
        self.results: list[dict[str, Any]] = []
        self.steady: bool | None = None

    def __call__(self, harness: Any, run: Any) -> dict[str, str]:
        from opscope.kernels.catalog import SwapRequest
        from opscope.run import swap_results as result

        explicit = self.requests is not None
        requests = self.requests if self.requests is not None else [
            SwapRequest(label=c["kernel"], kernels=[c["kernel"]]) for c in run.summary.get("swap_candidates") or []]
        from opscope.capture.torch_profiler import restore_weights

        state = {k: v.detach().clone() for k, v in harness.model.state_dict().items()}

        def restore() -> None:
            restore_weights(harness.model, state)

        for request in requests:
            restore()  # every swap starts from the same weights (as loaded: profile_target undid train steps)
            self.results.append(self.one(request, harness, run, restore))
        if explicit and requests and all(r["status"] in ("not-applicable", "error") for r in self.results):
            raise NothingToSwap("; ".join(f"{r['label']}: {r['message']}" for r in self.results))
        from opscope.kernels.bench import WARMUP
        from opscope.swap.benchmark import SUSPICIOUS
        from opscope.swap.verify import SEEDS

        method = {"seeds": SEEDS, "repeats": self.repeats, "warmup": WARMUP, "suspicious_speedup": SUSPICIOUS,
                  "steady_allocator": bool(self.steady),
                  "note": "" if requests else "no bundled kernel matches an op of this model"}
        return {"swap.json": result.dumps(result.swap_doc(run.meta, self.results, method)) + "\n"}

    def phase(self, label: str, what: str) -> None:
        self.progress.phase(f"{PHASE_PREFIX}{label}: {what}")

    def one(self, request: Any, harness: Any, run: Any, restore: Any) -> dict[str, Any]:
        from opscope.kernels.bench import FirstUseTuning
        from opscope.kernels.catalog import SwapRequestError, find
        from opscope.machine.peaks import Peaks
        from opscope.run import swap_results as result
        from opscope.swap import benchmark
        from opscope.swap.apply import Builder, BundledKernel
        from opscope.swap.mechanisms import SwapError
        from opscope.swap.verify import Runner, verify
        from reference_kernels import tuning

        label = request.label
        base = {"label": label, "source": request.source, "kernels": list(request.kernels)}
        self.phase(label, "building")
        runner = Runner(harness)
        builder = Builder(harness.model, runner.probe_step)
        try:
            if request.compile:
                swap = builder.compiled()
            elif request.user_file:
                swap = builder.user(label, _user_function(request), request.op, request.module)
            else:
                swap = builder.bundled(label, [BundledKernel(find(n)) for n in request.kernels])
        except (SwapError, SwapRequestError) as exc:
            return result.result_doc(**base, status="not-applicable", message=str(exc))
        mechanisms = swap.describe()
        self.phase(label, "verifying")
        first_use = FirstUseTuning()  # the bundled kernels' shape classes met untuned, tuned before the timing
        verification = verify(swap, runner, traps=not request.compile,
                              progress=lambda m: self.phase(label, f"verifying, {m}"),
                              first_run=lambda: tuning.first_use(first_use))
        if not verification.passed:
            _reset_compile(request)
            return result.result_doc(**base, status="failed", message=_first_failure(verification),
                                     mechanisms=mechanisms, notes=swap.notes, verification=verification)
        if first_use.pending:
            self.phase(label, "tuning")
        tuned = first_use.tune()
        self.phase(label, "benchmarking")
        if self.steady is None:
            from opscope.kernels.bench import steady_allocator

            self.steady = steady_allocator()  # as `opscope kernels --bench`: page faults must not set the times
        peaks = Peaks.from_json(run.meta.get("peaks") or {})
        device = harness.device
        rows = benchmark.op_level(verification.recorded, peaks, device, self.repeats,
                                  progress=lambda m: self.phase(label, m))
        e2e = benchmark.end_to_end(swap, harness.step, device, self.repeats, restore=restore,
                                   progress=lambda m: self.phase(label, m))
        _reset_compile(request)
        notes = [*swap.notes, *tuned]
        suspicious = any(r.to_json()["suspicious"] for r in rows) or bool(e2e.to_json()["suspicious"])
        if suspicious:
            notes.append(f"speedup over {benchmark.SUSPICIOUS:g}x: suspicious; check that the kernel does all of the "
                         "original's work")
        return result.result_doc(**base, status="passed", mechanisms=mechanisms, notes=notes,
                                 verification=verification, op_level=[r.to_json() for r in rows],
                                 end_to_end=e2e.to_json())


def _reset_compile(request: Any) -> None:
    if request.compile:
        import torch

        torch._dynamo.reset()


def _user_function(request: Any) -> Any:
    from opscope.capture.harness import process_state_kept
    from opscope.kernels.catalog import SwapRequestError
    from opscope.target.model_file import load_module

    with process_state_kept(keep_additions=True):
        module = load_module(Path(request.user_file))
    fn = getattr(module, request.user_func, None)
    if not callable(fn):
        raise SwapRequestError(f"{Path(request.user_file).name} has no function {request.user_func}()")
    return fn


def _task(job: SwapJob, progress: Progress) -> dict[str, Any]:
    from opscope.capture.torch_profiler import profile_target

    session = SwapSession(job.swap, progress)
    t0 = time.perf_counter()
    run, _ = profile_target(job.options, progress, extra=session)
    return {"run_dir": str(run.path), "seconds": time.perf_counter() - t0}


def main() -> None:
    serve(SwapJob, _task, what="swap")


if __name__ == "__main__":
    main()
