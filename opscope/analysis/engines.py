"""Where the ranks of `opscope analyze FOLDER` are analyzed: in this process one after the other
(`InProcess`), in worker processes on this machine (`LocalPool`, --workers N), or as Ray tasks on a
cluster (`RayEngine`, --engine ray). One small interface: used as a context manager (leaving it, by an
error or a signal, stops whatever still runs), `run(fn, jobs, memory)` yields (job index, result) as
the jobs finish. A local job's exception comes back as its result, for the caller to raise in its own
order; a Ray task that failed on its retry too comes back as `Failed`. Ray is imported only by
RayEngine (the optional extra `opscope[ray]`)."""

from __future__ import annotations

import logging
import multiprocessing
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from multiprocessing.context import BaseContext
from types import TracebackType
from typing import Any, Protocol, TypeVar

from opscope.errors import OpscopeError
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


class LocalPool:
    """Worker processes on this machine. Forked from this process while it runs only one thread (a
    worker starts at once, with everything this process imported): a fork of a process with other
    threads (an API user's, a notebook's) can deadlock on a lock one of them held, so then they are
    started by forkserver, else spawn; `preload`: modules the fork server imports once, so that each
    worker starts with them. Leaving the block by an exception (Ctrl-C included) cancels the jobs not
    started and terminates the workers before it returns, so no worker writes after the caller removes
    its staging folder."""

    def __init__(self, workers: int, preload: Sequence[str] = ()) -> None:
        self.workers = workers
        methods = multiprocessing.get_all_start_methods()
        if "fork" in methods and threading.active_count() == 1:
            method = "fork"
        else:
            method = "forkserver" if "forkserver" in methods else "spawn"
        self.context: BaseContext = multiprocessing.get_context(method)
        if self.context.get_start_method() == "forkserver" and preload:
            self.context.set_forkserver_preload(list(preload))
        self.pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> LocalPool:
        self.pool = ProcessPoolExecutor(self.workers, mp_context=self.context, initializer=_worker_signals)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        pool, self.pool = self.pool, None
        if pool is None:
            return
        if kind is None:
            pool.shutdown(wait=True)
            return
        processes = list(pool._processes.values())  # no public way to stop running workers before 3.14
        pool.shutdown(wait=False, cancel_futures=True)
        for p in processes:
            p.terminate()
        for p in processes:
            p.join()

    def run(self, fn: Callable[[J], R], jobs: Sequence[J],
            memory: Sequence[int]) -> Iterator[tuple[int, R | BaseException | Failed]]:
        assert self.pool is not None, "run inside the with block"
        futures: dict[Future[R], int] = {self.pool.submit(fn, job): i for i, job in enumerate(jobs)}
        waiting = set(futures)
        while waiting:
            done, waiting = wait(waiting, return_when=FIRST_COMPLETED)
            for future in sorted(done, key=futures.__getitem__):
                error = future.exception()
                yield futures[future], error if error is not None else future.result()


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
            done, self.waiting = ray.wait(self.waiting, num_returns=1)
            for ref in done:
                i, attempt = refs.pop(ref)
                try:
                    result: R | Failed = ray.get(ref)
                except ray.exceptions.RayError as exc:
                    if attempt <= RAY_RETRIES:
                        self.waiting.append(submit(i, attempt + 1))
                        continue
                    result = Failed(_failure(exc), attempt)
                yield i, result


def _failure(exc: BaseException) -> str:
    """A failed task's reason in one line: its own exception's (an OpscopeError's message as it is)."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, OpscopeError):
        return bounded(str(cause), 300)
    if isinstance(cause, BaseException):
        return bounded(f"{type(cause).__name__}: {cause}", 300)
    first = str(exc).strip().splitlines()
    return bounded(f"{type(exc).__name__}: {first[0] if first else ''}", 300)
