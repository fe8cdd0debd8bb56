"""The supervised child of `opscope profile` (see opscope/target/supervise.py): loads the model, profiles
it, analyzes and writes the run directory, and reports progress and the outcome on the control pipe."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

from opscope.capture.options import Progress
from opscope.errors import OpscopeError
from opscope.target.specs import JobT, ProfileJob
from opscope.target.supervise import Control, Stopped, child_setup, finish, read_job, target_error_message


class _PipeProgress(Progress):
    def __init__(self, control: Control) -> None:
        self.control = control

    def phase(self, name: str, total: int | None = None) -> None:
        self.control.send(type="phase", name=name, total=total)

    def advance(self, n: int = 1) -> None:
        self.control.send(type="advance", n=n)

    def warn(self, message: str) -> None:
        self.control.send(type="warn", message=message)


def serve(job_type: type[JobT], task: Callable[[JobT, Progress], dict[str, Any]], what: str = "profiling") -> None:
    """The body of every supervised child: read the job (a `job_type`), run `task(job, progress)`, report
    its result (or the error, as one line) on the control pipe."""
    child_setup()
    control = Control()
    debug = False  # until the job says otherwise (--debug)
    try:
        job = read_job(job_type)
        debug = job.options.debug
        result = task(job, _PipeProgress(control))
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
    finish()


def _profile(job: ProfileJob, progress: Progress) -> dict[str, Any]:
    from opscope.capture.compiled import inductor_profiling

    inductor_profiling()  # before the model's code runs (and compiles): a profiler event per inductor kernel
    if job.launch is not None:  # several processes via torchrun
        from opscope.capture.distributed import launch_ranks

        run = launch_ranks(job.options, job.script, job.launch, progress)
        return {"run_dir": str(run.path)}
    if job.script is not None:  # script mode
        from opscope.capture.script import profile_script

        run = profile_script(job.options, job.script, progress)
        return {"run_dir": str(run.path)}
    from opscope.capture.torch_profiler import profile_target

    run, _ = profile_target(job.options, progress)
    return {"run_dir": str(run.path)}


def main() -> None:
    serve(ProfileJob, _profile)


if __name__ == "__main__":
    main()
