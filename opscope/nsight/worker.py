"""The supervised children of `profile --nsys/--ncu` (opscope.nsight.session): the profile pass, which
leaves the analyzed run, its kernel plan and its trace for the parent instead of writing the run
directory, and the measured passes that nsys and ncu launch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from opscope.capture.options import options_from_spec
from opscope.capture.worker import serve


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


def _pass(spec: dict[str, Any], progress: Any, debug: bool = False) -> dict[str, Any]:
    kind = spec.pop("pass", "profile")
    hold = spec.pop("hold", None)
    nvtx_ops = bool(spec.pop("nvtx_ops", False))
    tool = str(spec.pop("tool", ""))
    if kind == "measure":  # the process nsys / ncu launch
        from opscope.capture.nvtx_ranges import measured_pass

        return measured_pass(options_from_spec(spec), nvtx_ops, progress, tool)
    from opscope.capture.torch_profiler import profile_target

    profile_target(options_from_spec(spec), progress, sink=hold_run(Path(hold)))
    return {"held": hold}


def main() -> None:
    serve(_pass)


if __name__ == "__main__":
    main()
