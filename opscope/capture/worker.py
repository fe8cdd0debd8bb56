"""The supervised child of `opscope profile` (see opscope/supervise.py): loads the model, profiles it,
analyzes and writes the run directory, and reports progress and the outcome on the control pipe."""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from opscope.capture.options import options_from_spec
from opscope.errors import OpscopeError
from opscope.target.supervise import Control, Stopped, child_setup, target_error_message


class _PipeProgress:
    def __init__(self, control: Control) -> None:
        self.control = control

    def phase(self, name: str, total: int | None = None) -> None:
        self.control.send(type="phase", name=name, total=total)

    def advance(self, n: int = 1) -> None:
        self.control.send(type="advance", n=n)

    def warn(self, message: str) -> None:
        self.control.send(type="warn", message=message)



def serve(task: Callable[[dict[str, Any], _PipeProgress, bool], dict[str, Any]], what: str = "profiling") -> None:
    """The body of every supervised child: read the spec, run `task(spec, progress, debug)`, report its
    result (or the error, as one line) on the control pipe."""
    child_setup()
    control = Control()
    spec = json.loads(Path(sys.argv[1]).read_text())
    debug = bool(spec.pop("debug", False))
    try:
        result = task(spec, _PipeProgress(control), debug)
        control.send(type="done", result=result)
    except OpscopeError as exc:
        if debug:
            traceback.print_exc()
        control.send(type="error", message=str(exc), exit_code=exc.exit_code)
    except Stopped:
        pass
    except BaseException as exc:  # noqa: BLE001 (the user's code may raise anything, exit included)
        message = target_error_message(exc)
        if message is not None:
            if debug:
                traceback.print_exc()
            control.send(type="error", message=message, exit_code=2)
        else:
            traceback.print_exc()
            control.send(type="error", exit_code=1,
                         message=f"internal error in opscope's {what} process ({type(exc).__name__}: "
                                 f"{str(exc).splitlines()[0][:200] if str(exc) else ''}); the traceback is above")
    sys.stdout.flush()
    sys.stderr.flush()


def _profile(spec: dict[str, Any], progress: _PipeProgress, debug: bool = False) -> dict[str, Any]:
    script = spec.pop("script", None)  # opscope.target.jobs.ScriptSpec as JSON: script mode
    launch = spec.pop("launch", None)  # opscope.target.jobs.LaunchSpec as JSON: several processes via torchrun
    if launch is not None:
        from opscope.capture.distributed import launch_ranks
        from opscope.target.jobs import LaunchSpec, ScriptSpec

        run = launch_ranks(options_from_spec(spec), ScriptSpec(**script) if script else None,
                           LaunchSpec(**launch), progress, debug=debug)
        return {"run_dir": str(run.path)}
    if script is not None:
        from opscope.capture.script import profile_script
        from opscope.target.jobs import ScriptSpec

        run = profile_script(options_from_spec(spec), ScriptSpec(**script), progress)
        return {"run_dir": str(run.path)}
    from opscope.capture.torch_profiler import profile_target

    run, _ = profile_target(options_from_spec(spec), progress)
    return {"run_dir": str(run.path)}


def main() -> None:
    serve(_profile)


if __name__ == "__main__":
    main()
