"""Where the ranks of `opscope analyze FOLDER` are analyzed: in this process one after the other
(`InProcess`), in worker processes on this machine (`LocalPool`, --workers N), or as Ray tasks on a
cluster (`RayEngine`, --engine ray). One small interface: used as a context manager (leaving it, by an
error or a signal, stops whatever still runs), `run(fn, jobs, memory)` yields (job index, result) as
the jobs finish. A local job's exception comes back as its result, for the caller to raise in its own
order; a Ray task that failed on its retry too comes back as `Failed`. Ray is imported only by
RayEngine (the optional extra `opscope[ray]`)."""

from __future__ import annotations

import contextlib
import importlib
import logging
import multiprocessing
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as connection_wait
from multiprocessing.context import ForkContext, ForkServerContext, SpawnContext
from multiprocessing.process import BaseProcess
from types import TracebackType
from typing import Any, Protocol, TypeVar, cast

from opscope.errors import OpscopeError
from opscope.heap import keep_large_blocks_apart
from opscope.limits import bounded

ENGINES = ("local", "ray")
RAY_RETRIES = 1  # a failed task runs once more (a lost node, an OOM kill, a flaky read) before its rank is given up
RAY_MISSING = "--engine ray needs Ray: pip install 'opscope[ray]'"

J = TypeVar("J")
R = TypeVar("R")


@dataclass(frozen=True)
class Failed:
    """A job that failed on every try (a Ray task): the merge goes on without it."""

    message: str
    tries: int


class WorkerDied(OpscopeError):
    """A local worker process ended without a result."""


class Engine(Protocol):
    def __enter__(self) -> Engine: ...

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None: ...

    def run(self, fn: Callable[[J], R], jobs: Sequence[J],
            memory: Sequence[int]) -> Iterator[tuple[int, R | BaseException | Failed]]: ...


class InProcess:
    """One job after the other in this process; an exception is raised where it happens."""

    def __enter__(self) -> InProcess:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        return None

    def run(self, fn: Callable[[J], R], jobs: Sequence[J],
            memory: Sequence[int]) -> Iterator[tuple[int, R | BaseException | Failed]]:
        for i, job in enumerate(jobs):
            yield i, fn(job)


def _worker_signals() -> None:
    # Ctrl-C reaches the terminal's whole process group: the parent stops the workers itself (terminate),
    # so that a worker does not die half-way through a file with a traceback of its own. SIGTERM (that
    # terminate) ends a worker at once: a forked one has the CLI's handlers, which raise instead.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if sig is not None:
            signal.signal(sig, signal.SIG_DFL)


def _worker(conn: Connection, fn: Callable[[Any], Any]) -> None:
    """A worker process: (index, job) in, (index, ok, result or exception) out, until None."""
    _worker_signals()
    keep_large_blocks_apart()  # as the CLI's own process (a forked worker has it already)
    while (item := conn.recv()) is not None:
        index, job = item
        try:
            out: tuple[int, bool, Any] = (index, True, fn(job))
        except Exception as exc:  # noqa: BLE001 - the parent raises it, in the folder's order
            out = (index, False, exc)
        try:
            conn.send(out)  # pickled whole before a byte is written
        except Exception as exc:  # an exception that does not pickle: its text
            conn.send((index, False, RuntimeError(f"{type(out[2]).__name__}: {out[2]} ({exc})")))


class LocalPool:
    """Worker processes on this machine, one pipe each and no helper threads, so that stopping them
    mid-write leaves nothing waiting (concurrent.futures' result thread hangs at exit on a half-sent
    result). Forked from this process while it runs only one thread (a worker starts at once, with
    everything this process imported): a fork of a process with other threads (an API user's, a
    notebook's) can deadlock on a lock one of them held, so then they are started by forkserver, else
    spawn. `preload`: modules every worker starts with (imported here before a fork, or once by the fork
    server), not once per worker.
    Leaving the block by an exception (Ctrl-C included) terminates the workers and waits for them before
    it returns, so no worker writes after the caller removes its staging folder."""

    def __init__(self, workers: int, preload: Sequence[str] = ()) -> None:
        self.workers = workers
        methods = multiprocessing.get_all_start_methods()
        if "fork" in methods and threading.active_count() == 1:
            method = "fork"
        else:
            method = "forkserver" if "forkserver" in methods else "spawn"
        self.context = cast("ForkContext | ForkServerContext | SpawnContext", multiprocessing.get_context(method))
        if method == "forkserver" and preload:
            self.context.set_forkserver_preload(list(preload))
        elif method == "fork":
            for module in preload:
                importlib.import_module(module)
        self.processes: list[tuple[BaseProcess, Connection]] = []

    def __enter__(self) -> LocalPool:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        processes, self.processes = self.processes, []
        for p, conn in processes:
            if kind is None:
                with contextlib.suppress(OSError):
                    conn.send(None)
            else:
                p.terminate()
        for p, conn in processes:
            p.join()
            conn.close()

    def _start(self, fn: Callable[[Any], Any]) -> Connection:
        ours, theirs = self.context.Pipe()
        p = self.context.Process(target=_worker, args=(theirs, fn), daemon=True)
        self.processes.append((p, ours))
        p.start()
        theirs.close()  # the worker's end is the worker's alone: its exit is our EOF
        return ours

    def run(self, fn: Callable[[J], R], jobs: Sequence[J],
            memory: Sequence[int]) -> Iterator[tuple[int, R | BaseException | Failed]]:
        queue = list(enumerate(jobs))[::-1]  # popped from the end: in order
        busy: dict[Connection, int] = {}
        for _ in range(min(self.workers, len(jobs))):
            conn = self._start(fn)
            i, job = queue.pop()
            conn.send((i, job))
            busy[conn] = i
        while busy:
            for ready in connection_wait(list(busy)):
                conn = cast(Connection, ready)
                try:
                    i, ok, value = conn.recv()
                except (EOFError, OSError):  # the worker died (killed, out of memory)
                    i = busy.pop(conn)
                    if queue:  # a new one takes the next job
                        conn = self._start(fn)
                        busy[conn] = queue[-1][0]
                        conn.send(queue.pop())
                    yield i, WorkerDied("its worker process died (killed, or out of memory: try fewer --workers)")
                    continue
                if queue:
                    busy[conn] = queue[-1][0]
                    conn.send(queue.pop())
                else:
                    del busy[conn]
                yield i, value if ok else cast(BaseException, value)


def _call(fn: Callable[[J], R], job: J) -> R:
    """A Ray task: `fn` and `job` arrive pickled (by reference: the workers import opscope)."""
    return fn(job)


class RayEngine:
    """Each job a Ray task declaring its memory (so that Ray does not overcommit a node), run once more
    when it fails (an exception, a lost worker or node). `address`: a running cluster's (ray.init(address=...)); without it a local Ray of
    `cpus` CPUs is started and shut down after. A process that has already called ray.init keeps its
    Ray."""

    def __init__(self, address: str | None, cpus: int) -> None:
        self.address = address
        self.cpus = cpus
        self.started = False
        self.waiting: list[Any] = []

    def __enter__(self) -> RayEngine:
        try:
            import ray
        except ImportError:
            raise OpscopeError(RAY_MISSING) from None
        self.ray = ray
        if not ray.is_initialized():
            # quiet: the tasks' logs stay out of the command's output, and no dashboard is started
            options: dict[str, Any] = {"log_to_driver": False, "include_dashboard": False,
                                       "configure_logging": False}
            # and its start-up notices (token authentication, ...) off stderr: Python's last-resort
            # handler prints a library's warnings when the application configured no logging
            quiet = logging.getLogger("ray")
            level = quiet.level
            quiet.setLevel(logging.ERROR)
            try:
                if self.address is not None:
                    ray.init(address=self.address, **options)
                else:
                    ray.init(num_cpus=self.cpus, **options)
            except (ConnectionError, ValueError, RuntimeError) as exc:
                raise OpscopeError(f"--engine ray: could not start or reach Ray"
                                   f"{' at ' + self.address if self.address else ''}: {bounded(str(exc), 200)}") from None
            except BaseException:  # a signal while it starts: stop what did start (a half-started Ray crashes at exit)
                ray.shutdown()
                raise
            finally:
                quiet.setLevel(level)
            self.started = True
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            for ref in self.waiting:  # an error or Ctrl-C: the tasks still queued or running
                self.ray.cancel(ref, force=True)
        finally:
            self.waiting = []
            if self.started:
                self.ray.shutdown()
                self.started = False

    def run(self, fn: Callable[[J], R], jobs: Sequence[J],
            memory: Sequence[int]) -> Iterator[tuple[int, R | BaseException | Failed]]:
        ray = self.ray
        # a task declaring more than the largest node has would never be scheduled
        largest = max((float(n.get("Resources", {}).get("memory", 0)) for n in ray.nodes() if n.get("Alive")),
                      default=0.0)
        task = ray.remote(_call)
        refs: dict[Any, tuple[int, int]] = {}  # ref -> (job index, its try)

        def submit(i: int, attempt: int) -> Any:
            declared = int(min(memory[i], largest)) if largest else int(memory[i])
            # retried here, not by Ray (max_retries): Ray announces each of its retries on the driver's
            # stdout, which --json keeps for the JSON
            ref = task.options(num_cpus=1, memory=declared, max_retries=0).remote(fn, jobs[i])
            refs[ref] = (i, attempt)
            return ref

        self.waiting = [submit(i, 1) for i in range(len(jobs))]
        while self.waiting:
            with _signals_as_raised():
                done, self.waiting = ray.wait(self.waiting, num_returns=1)
            for ref in done:
                i, attempt = refs.pop(ref)
                try:
                    with _signals_as_raised():
                        result: R | Failed = ray.get(ref)
                except ray.exceptions.RayError as exc:
                    if attempt <= RAY_RETRIES:
                        self.waiting.append(submit(i, attempt + 1))
                        continue
                    result = Failed(_failure(exc), attempt)
                yield i, result


@contextlib.contextmanager
def _signals_as_raised() -> Iterator[None]:
    """Ray runs the signal handlers while it waits, and turns the exception one raises (KeyboardInterrupt,
    the CLI's Terminated) into a SystemError: the exception itself again, for the cleanup that expects it."""
    try:
        yield
    except SystemError as exc:
        cause = exc.__cause__
        if isinstance(cause, BaseException) and not isinstance(cause, Exception):
            raise cause from None
        raise


def _failure(exc: BaseException) -> str:
    """A failed task's reason in one line: its own exception's (an OpscopeError's message as it is)."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, OpscopeError):
        return bounded(str(cause), 300)
    if isinstance(cause, BaseException):
        return bounded(f"{type(cause).__name__}: {cause}", 300)
    first = str(exc).strip().splitlines()
    return bounded(f"{type(exc).__name__}: {first[0] if first else ''}", 300)
