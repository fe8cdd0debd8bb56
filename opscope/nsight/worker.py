"""The supervised children of `profile --nsys/--ncu` (opscope.nsight.session): the profile pass, which
leaves the analyzed run, its kernel plan and its trace for the parent instead of writing the run
directory, and the measured passes that nsys and ncu launch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from opscope.capture.options import Progress
from opscope.capture.worker import serve
from opscope.target.specs import MeasureSteps, NsightPass


def hold_run(folder: Path) -> Any:
    """A profile_target sink for `profile --nsys/--ncu`: instead of writing the run directory, leaves the
    analyzed run (without its event tables), its kernel plan and its trace in `folder` for the parent,
    which adds the Nsight measurements and writes the run (opscope.nsight.session)."""
    def sink(run: Any, trace_path: Path) -> None:
        import dataclasses
        import pickle
        import shutil

        from opscope.nsight.measured import kernel_plan

        plan = kernel_plan(run)
        with open(folder / "held.pkl", "wb") as f:  # read back by opscope.nsight.session.profile_with_nsight
            pickle.dump({"run": dataclasses.replace(run, events=None, kernels=None), "plan": plan}, f,
                        protocol=pickle.HIGHEST_PROTOCOL)
        shutil.copyfile(trace_path, folder / "trace.json")
    return sink


def _pass(job: NsightPass, progress: Progress) -> dict[str, Any]:
    if isinstance(job.task, MeasureSteps):  # the process nsys / ncu launch
        from opscope.capture.nvtx_ranges import measured_pass

        return measured_pass(job.options, job.task.nvtx_ops, progress, job.task.tool)
    from opscope.capture.torch_profiler import profile_target

    profile_target(job.options, progress, sink=hold_run(job.task.folder))
    return {"held": str(job.task.folder)}


def main() -> None:
    serve(NsightPass, _pass)


if __name__ == "__main__":
    main()
