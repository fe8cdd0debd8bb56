"""Runs the user's code in a child process that opscope supervises.

Whatever the target's code does to its process — print to stdout from Python or C, call `sys.exit` or
`os._exit`, die of a signal or a segfault, change the working directory, `sys.path` or torch's global
settings, raise a BaseException — cannot change opscope's own contract: with `--json`, stdout holds
exactly one JSON document; an early end of the user's process is one error line naming it (and the
line when known), exit 2; nothing is left half-written. The parent never imports torch.

The protocol: the parent writes the job (a typed opscope.target.specs.Job, as JSON) to SPEC_FILE and
starts `python -c BOOT SPEC_FILE` in a new session with

- the child's stdout and stderr both going to the parent's stderr (so a model's prints never reach
  stdout, and the user still sees them);
- a pipe (fd number in $OPSCOPE_CONTROL_FD) on which the child writes one JSON message per line:
  {"type": "phase", "name", "total"}, {"type": "advance", "n"}, {"type": "warn", "message"},
  {"type": "error", "message", "exit_code"} or {"type": "done", "result": {...}};
- $TMPDIR pointing to a private folder the parent removes afterwards (the profiler's temporary files,
  whatever the child leaves when it is killed);
- for a profile (`torch_trace`), $TORCH_TRACE pointing to a folder inside it, where torch writes its
  structured compile log if the model compiles (torch reads the variable when it is imported; an eager
  model writes nothing there). A TORCH_TRACE of the user's own is kept: torch writes there as they asked;
- sys.path[0] set to opscope's own folder instead of the working directory (BOOT), so a file in the
  working directory named like a standard-library module shadows nothing.

Under Nsight (`opscope profile --nsys/--ncu`), nsys or ncu is the process the parent starts, and it
launches the same `python -c BOOT SPEC_FILE`: the control channel is then a file named in
$OPSCOPE_CONTROL_FILE (a tool need not hand open file descriptors on), which the parent follows while
the tool runs, and the tool's and the child's output go to a log file the caller reads for diagnoses.

Signals: SIGINT, SIGTERM and SIGHUP reach the parent (the child ignores SIGINT and has its own session,
so a terminal's Ctrl-C is the parent's to handle); the parent then ends the child's whole process group
(SIGTERM, then SIGKILL after a grace period) and removes its folders. The later `swap` command runs
user kernels through the same function.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

import opscope.errors
from opscope.errors import OpscopeError, TargetError
from opscope.target.specs import Job, JobT, decode_job, encode_job

CONTROL_FD_ENV = "OPSCOPE_CONTROL_FD"
CONTROL_FILE_ENV = "OPSCOPE_CONTROL_FILE"  # the channel when a tool (nsys, ncu) starts the child
TORCH_TRACE_ENV = "TORCH_TRACE"  # where torch writes its structured compile log (read when torch is imported)
_GRACE_S = 3.0  # how long an ended child may take to exit on SIGTERM before SIGKILL
_DONE_GRACE_S = 30.0  # how long a child that sent its result may take to exit
_OPSCOPE_ROOT = str(Path(opscope.errors.__file__).resolve().parent.parent)
_BOOT = ("import sys; sys.path[0] = {root!r}; "
         "from {module} import main; main()")


class WorkerCrashed(OpscopeError):
    """The child ended without a result: an exit, a signal or a crash in the user's code."""


class Stopped(BaseException):
    """The child was stopped by a signal it handles itself (torchrun's launcher does); the parent has
    already reported the signal, so the child ends quietly."""


class InternalError(OpscopeError):
    """A bug in opscope's own code in the child (its traceback is on stderr)."""

    exit_code = 1


@dataclass
class Listener:
    """What the parent does with the child's progress messages."""

    phase: Callable[[str, int | None], None] = lambda name, total: None
    advance: Callable[[int], None] = lambda n: None
    warn: Callable[[str], None] = lambda message: None
    # the child's result, as soon as it arrives: the run it names is complete even if the child's exit or
    # the parent's wait for it is still to come (a signal then must not say "nothing was written")
    done: Callable[[dict[str, Any]], None] = lambda result: None


def run_worker(module: str, job: Job, listener: Listener | None = None, *,
               what: str = "the model's code", on_abort: Callable[[int], None] | None = None,
               wrapper: Sequence[str] | None = None, wrapper_env: dict[str, str] | None = None,
               tool_log: Path | None = None, forward_stdin: bool = False, torch_trace: bool = False) -> dict[str, Any]:
    """Runs `module.main()` in a supervised child with `job` and returns the "done" message's
    result. Raises the child's own OpscopeError (with its message and exit code), WorkerCrashed when it
    ends early, InternalError on a bug in the child. `on_abort(pid)` runs whenever the child did not
    finish with a result (to remove what it may have left half-written).

    With `wrapper` (e.g. `nsys profile ...`, `ncu ...`), the child is started by that tool: the command
    is `wrapper + [python, -c, BOOT, SPEC]`, `wrapper_env` is added to its environment, the control
    channel is a file (a tool need not pass open file descriptors on to the process it launches), and
    the tool's and the child's output go to `tool_log` (the caller reads the tool's messages there).
    A tool that fails raises ToolFailed. With `forward_stdin` (a script), the child reads opscope's own
    stdin, as `python train.py < data` would; else it reads nothing (/dev/null). With `torch_trace`, the
    child's $TORCH_TRACE is a private folder (unless the user set one): torch.compile's log for the run.

    A child that sent its result and then ended with an error status (an exit handler or a thread of the
    user's code that crashed or called os._exit after the run was complete) still returns the result: the
    run is in place. The listener is warned what happened."""
    listener = listener or Listener()
    private = Path(tempfile.mkdtemp(prefix="opscope-"))
    spec_path = private / "spec.json"
    spec_path.write_bytes(encode_job(job))
    child_tmp = private / "tmp"
    child_tmp.mkdir()
    relay = _Relay(listener)
    read_fd = write_fd = -1
    if wrapper is None:
        read_fd, write_fd = os.pipe()
        env = dict(os.environ, TMPDIR=str(child_tmp), **{CONTROL_FD_ENV: str(write_fd)})
    else:
        control_file = private / "control.jsonl"
        control_file.touch()
        env = dict(os.environ, **(wrapper_env or {}), TMPDIR=str(child_tmp), **{CONTROL_FILE_ENV: str(control_file)})
        env.pop(CONTROL_FD_ENV, None)
    _keep_compile_caches(env)
    if not job.options.debug:  # libkineto's "USDT: profiler_start/stop" lines on every profile (6 silences them)
        env.setdefault("KINETO_LOG_LEVEL", "6")
    if torch_trace and not env.get(TORCH_TRACE_ENV):
        env[TORCH_TRACE_ENV] = str(private / "torch_trace")
    proc: subprocess.Popen[bytes] | None = None
    command = [*boot_command(module), str(spec_path)]
    try:
        if wrapper is None:
            proc = subprocess.Popen(command, stdin=None if forward_stdin else subprocess.DEVNULL, stdout=sys.stderr.fileno(),
                                    stderr=sys.stderr.fileno(), pass_fds=(write_fd,), env=env, start_new_session=True)
            os.close(write_fd)
            write_fd = -1
            _relay_pipe(read_fd, proc, relay)
            code = _ended(proc, relay)
        else:
            with open(tool_log or private / "tool.log", "wb") as log:
                proc = subprocess.Popen([*wrapper, *command], stdin=subprocess.DEVNULL, stdout=log,
                                        stderr=subprocess.STDOUT, env=env, start_new_session=True)
                code = _follow(proc, control_file, relay)
        if relay.error is not None:
            exit_code = int(relay.error.get("exit_code", 2))
            cls = InternalError if exit_code == 1 else OpscopeError
            exc = cls(str(relay.error.get("message", "failed")))
            exc.exit_code = exit_code
            raise exc
        if relay.result is not None and code == 0:
            return relay.result
        if relay.result is not None and wrapper is None:
            how = death_by_signal(code) if code < 0 else f"ended the process with exit code {code}"
            listener.warn(f"{what} {how} after the run was written (an exit handler, or a thread it left "
                          "running); the run is complete")
            return relay.result
        if wrapper is not None:
            tool = Path(wrapper[0]).name
            if relay.result is not None:
                raise ToolFailed(f"{tool} exited with code {code} after {what} had finished", code, started=True)
            if not relay.started:
                raise ToolFailed(f"{tool} exited with code {code} before {what} started", code, started=False)
            raise WorkerCrashed(_ended_early(code, relay.phase, what) + f" (under {tool})")
        raise WorkerCrashed(_ended_early(code, relay.phase, what))
    except BaseException:
        if proc is not None:
            if proc.poll() is None:
                _stop(proc)
            if on_abort is not None:
                on_abort(proc.pid)
        raise
    finally:
        if proc is not None and proc.poll() is None:
            _stop(proc)
        for fd in (read_fd, write_fd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        shutil.rmtree(private, ignore_errors=True)


class ToolFailed(OpscopeError):
    """A tool the child ran under (nsys, ncu) exited with an error status; its output is in the log."""

    def __init__(self, message: str, code: int, started: bool) -> None:
        super().__init__(message)
        self.code = code
        self.started = started


class _Relay:
    """The parent's side of the control messages: progress to the listener, the outcome kept."""

    def __init__(self, listener: Listener) -> None:
        self.listener = listener
        self.phase = "starting"
        self.started = False
        self.result: dict[str, Any] | None = None
        self.error: dict[str, Any] | None = None

    @property
    def ended(self) -> bool:
        """The child sent its last message (its result or its error)."""
        return self.result is not None or self.error is not None

    def handle(self, line: str) -> None:
        msg = _parse(line)
        kind = msg.get("type")
        if kind:
            self.started = True
        if kind == "phase":
            self.phase = str(msg.get("name", self.phase))
            self.listener.phase(self.phase, msg.get("total"))
        elif kind == "advance":
            self.listener.advance(int(msg.get("n", 1)))
        elif kind == "warn":
            self.listener.warn(str(msg.get("message", "")))
        elif kind == "error":
            self.error = msg
        elif kind == "done":
            self.result = msg.get("result") or {}
            self.listener.done(self.result)


def _follow(proc: subprocess.Popen[bytes], control_file: Path, relay: _Relay, interval: float = 0.05) -> int:
    """Relays the control file's complete lines while `proc` runs; returns its exit status."""
    with open(control_file, "rb") as control:
        pending = b""
        while True:
            done = proc.poll() is not None
            chunk = control.read()
            if chunk:
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    relay.handle(line.decode("utf-8", errors="replace"))
            if done:
                return proc.wait()
            time.sleep(interval)


def _relay_pipe(fd: int, proc: subprocess.Popen[bytes], relay: _Relay, interval: float = 0.2) -> None:
    """Relays the control pipe's lines until the child's last message, the pipe's end, or the child's
    exit with nothing left to read: not until EOF alone, since a process the user's code forked keeps the
    pipe's write end open as long as it lives."""
    pending = b""
    while not relay.ended:
        ready, _, _ = select.select([fd], [], [], interval)
        if not ready:
            if proc.poll() is not None:
                return
            continue
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            relay.handle(line.decode("utf-8", errors="replace"))
            if relay.ended:
                return


def _ended(proc: subprocess.Popen[bytes], relay: _Relay) -> int:
    """The child's exit status once it ended. After its last message the child ends what the user's code
    started and exits at once (finish()); should it not within _DONE_GRACE_S, the work is done anyway: its
    process group is ended and the result stands. Whatever of the group is left is ended too."""
    try:
        code = proc.wait(timeout=_DONE_GRACE_S if relay.ended else None)
    except subprocess.TimeoutExpired:
        _stop(proc)
        code = 0 if relay.result is not None else proc.wait()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # processes the user's code forked and left behind
    return code


def _parse(line: str) -> dict[str, Any]:
    try:
        msg = json.loads(line)
    except ValueError:
        return {}
    return msg if isinstance(msg, dict) else {}


def boot_command(module: str) -> list[str]:
    """The command line that runs `module.main()` the way run_worker's children start: sys.path[0] is
    opscope's own folder, not the working directory. torchrun starts each rank with it."""
    return [sys.executable, "-c", _BOOT.format(root=_OPSCOPE_ROOT, module=module)]


def death_by_signal(code: int) -> str:
    """'crashed with a segmentation fault (SIGSEGV)' or 'was killed by SIGTERM', for an exit code -N."""
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    crash = {"SIGSEGV": "a segmentation fault", "SIGBUS": "a bus error", "SIGABRT": "an abort",
             "SIGILL": "an illegal instruction", "SIGFPE": "a floating-point exception"}.get(name)
    return f"crashed with {crash} ({name})" if crash else f"was killed by {name}"


def _ended_early(code: int, phase: str, what: str) -> str:
    if code < 0:
        return f"{what} {death_by_signal(code)} during {phase}; opscope wrote nothing"
    return (f"{what} ended the process (exit code {code}) during {phase}, before opscope finished "
            "(os._exit(), or a C library calling exit()); opscope wrote nothing")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Ends the child's whole process group: SIGTERM, then SIGKILL after a grace period."""
    for sig, wait in ((signal.SIGTERM, _GRACE_S), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return
            time.sleep(0.02)


def _keep_compile_caches(env: dict[str, str]) -> None:
    """torch.compile keeps its caches under the temporary directory; the child's private $TMPDIR would
    make every run compile cold. Point inductor at the usual place explicitly.

    Inductor's precompiled C++ header (about 150 MiB, 5-10 s to build on 2 cores) goes under the temporary
    directory whatever TORCHINDUCTOR_CACHE_DIR says (torch/_inductor/codecache.py _HEADER_DIR), so each
    child rebuilt it at the first compile, even with every kernel cached: a warm profile of
    examples/compiled_block.py compiled for 7-10 s instead of 2.6 s. Without the header a cold compile
    took as long (19-22 s either way), so the children compile without it, unless the user says otherwise."""
    if "TORCHINDUCTOR_CACHE_DIR" not in env:
        try:
            user = os.getlogin()
        except OSError:
            user = str(os.getuid()) if hasattr(os, "getuid") else "user"
        env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tempfile.gettempdir(), f"torchinductor_{user}")
    env.setdefault("TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS", "0")


# --- the child's side -----------------------------------------------------------------------------


class Control:
    """The child's end of the control pipe."""

    def __init__(self) -> None:
        fd = os.environ.get(CONTROL_FD_ENV)
        if fd is not None:
            self._file = os.fdopen(int(fd), "w", encoding="utf-8", buffering=1)
        else:
            self._file = open(os.environ[CONTROL_FILE_ENV], "a", encoding="utf-8", buffering=1)  # noqa: SIM115

    def send(self, **msg: Any) -> None:
        try:
            self._file.write(json.dumps(msg, default=str) + "\n")
            self._file.flush()
        except BrokenPipeError:  # the parent is gone or stopping: nobody is left to tell
            pass


def read_job(job_type: type[JobT]) -> JobT:
    """The child's job, from the spec file its command line names. A spec that does not decode as
    `job_type` is opscope's own bug (the parent wrote it): an InternalError naming the mismatch."""
    path = Path(sys.argv[1])
    try:
        return decode_job(path.read_bytes(), job_type)
    except (OSError, msgspec.DecodeError) as exc:
        raise InternalError(f"internal error in opscope's worker process: its spec {path.name} does not decode as "
                            f"{job_type.__name__} ({exc})") from exc


def child_setup() -> None:
    """What every supervised child does first: leave SIGINT to the parent, die with the parent, and adopt
    the processes the user's code starts and abandons (so that finish() can end them)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    _adopt_orphans()


def finish() -> None:
    """What every supervised child does after its last message: end every process the user's code
    started (forked, or in a session of its own), then exit at once, without waiting for threads the
    user's code left running or running its atexit handlers: the work is done and reported. A child that
    a tool started (nsys, ncu: control through a file) returns instead, so that the tool's own exit
    handlers run."""
    end_descendants()
    sys.stdout.flush()
    sys.stderr.flush()
    if os.environ.get(CONTROL_FD_ENV) is not None:
        os._exit(0)


def end_descendants() -> list[int]:
    """SIGKILLs every descendant of this process (found through /proc; the orphans among them were
    adopted by _adopt_orphans) and reaps them; returns their pids. Linux only; elsewhere nothing."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()  # the name may hold spaces and parentheses
        if len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], list(children.get(os.getpid(), []))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    for pid in found:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    for pid in found:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, 0)  # ours or adopted: reap it (another parent's child raises ChildProcessError)
    return found


def _adopt_orphans() -> None:
    """Linux: become the 'child subreaper' of the processes started below this one, so that an orphan
    (a daemon that double-forked, a grandchild whose parent exited) is reparented here, not to init."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        pr_set_child_subreaper = 36
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_child_subreaper, 1, 0, 0, 0)
    except (OSError, AttributeError):
        return


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the parent dies (the parent may itself be SIGKILLed)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the parent is already gone
        os._exit(1)


def target_error_message(exc: BaseException) -> str | None:
    """One line for a BaseException that came from the user's code (sys.exit, KeyboardInterrupt raised
    by the model, a custom BaseException), or None when it did not."""
    from opscope.target.model_file import describe_exception, user_frame_of

    where = user_frame_of(exc)
    if isinstance(exc, SystemExit):
        if not where:
            return None
        return f"the model's code called sys.exit({exc.code!r}) at {where}; opscope stopped and wrote nothing"
    if not where:
        return None
    return f"the model's code raised {describe_exception(exc)} at {where}; opscope stopped and wrote nothing"


__all__ = ["Control", "InternalError", "Listener", "Stopped", "TargetError", "ToolFailed", "WorkerCrashed",
           "boot_command", "child_setup", "death_by_signal", "end_descendants", "finish", "read_job", "run_worker",
           "target_error_message"]
