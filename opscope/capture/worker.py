"""The supervised child of `opscope profile` (see opscope/supervise.py): loads the model, profiles it,
analyzes and writes the run directory, and reports progress and the outcome on the control pipe."""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path
from typing import Any

from opscope.errors import OpscopeError
from opscope.supervise import Control, child_setup, target_error_message


class _PipeProgress:
    def __init__(self, control: Control) -> None:
        self.control = control

    def phase(self, name: str, total: int | None = None) -> None:
        self.control.send(type="phase", name=name, total=total)

    def advance(self, n: int = 1) -> None:
        self.control.send(type="advance", n=n)

    def warn(self, message: str) -> None:
        self.control.send(type="warn", message=message)


def options_from_spec(spec: dict[str, Any]) -> Any:
    from opscope.capture.torch_profiler import ProfileOptions

    spec = dict(spec)
    spec["target"] = Path(spec["target"])
    spec["out"] = Path(spec["out"]) if spec.get("out") else None
    return ProfileOptions(**spec)


def hold_run(folder: Path):  # noqa: ANN201
    """A profile_target sink for `profile --nsys/--ncu`: instead of writing the run directory, leaves the
    analyzed run (without its event tables), its kernel plan and its trace in `folder` for the parent,
    which adds the Nsight measurements and writes the run (opscope.nsight.session)."""
    def sink(run: Any, trace_path: Path) -> None:
        import dataclasses
        import shutil

        import pandas as pd

        from opscope.nsight.measured import kernel_plan

        plan = kernel_plan(run)
        pd.to_pickle({"run": dataclasses.replace(run, events=None, kernels=None), "plan": plan},
                     folder / "held.pkl")
        shutil.copyfile(trace_path, folder / "trace.json")
    return sink


def main() -> None:
    child_setup()
    control = Control()
    spec = json.loads(Path(sys.argv[1]).read_text())
    debug = bool(spec.pop("debug", False))
    kind = spec.pop("pass", "profile")
    hold = spec.pop("hold", None)
    nvtx_ops = bool(spec.pop("nvtx_ops", False))
    tool = str(spec.pop("tool", ""))
    try:
        if kind == "measure":  # the process nsys / ncu launch (opscope.nsight.session)
            from opscope.capture.nvtx_ranges import measured_pass

            result = measured_pass(options_from_spec(spec), nvtx_ops, _PipeProgress(control), tool)
            control.send(type="done", result=result)
        else:
            from opscope.capture.torch_profiler import profile_target

            sink = hold_run(Path(hold)) if hold else None
            run, _ = profile_target(options_from_spec(spec), _PipeProgress(control), sink=sink)
            control.send(type="done", result={"held": hold} if hold else {"run_dir": str(run.path)})
    except OpscopeError as exc:
        if debug:
            traceback.print_exc()
        control.send(type="error", message=str(exc), exit_code=exc.exit_code)
    except BaseException as exc:  # noqa: BLE001 (the user's code may raise anything, exit included)
        message = target_error_message(exc)
        if message is not None:
            if debug:
                traceback.print_exc()
            control.send(type="error", message=message, exit_code=2)
        else:
            traceback.print_exc()
            control.send(type="error", exit_code=1,
                         message=f"internal error in opscope's profiling process ({type(exc).__name__}: "
                                 f"{str(exc).splitlines()[0][:200] if str(exc) else ''}); the traceback is above")
    sys.stdout.flush()
    sys.stderr.flush()


if __name__ == "__main__":
    main()
