"""The ranks of a folder analyzed in worker processes (--workers N) and as Ray tasks (--engine ray): the
same run files as one after the other, through the real CLI; Ctrl-C while workers run leaves nothing; a
Ray task that keeps failing is retried once, then its rank is named in the merged run."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from test_ranks import _load_benchmark

from conftest import PEAKS, TRACES, assert_clean_error, run_cli
from golden import digest
from opscope.analysis import engines
from opscope.errors import OpscopeError
from opscope.run.read import read_run

SHARED = TRACES / "h100_bert-small_bf16.json.gz"


@pytest.fixture(scope="module")
def job4(tmp_path_factory) -> Path:
    """4 ranks: copies of a shared trace, times shifted, rank 1 slowed."""
    folder = tmp_path_factory.mktemp("ranks") / "job"
    _load_benchmark().synthetic_ranks(SHARED, folder, ranks=4, slowed=1, factor=1.25)
    return folder


@pytest.fixture(scope="module")
def one_by_one(job4, tmp_path_factory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("serial") / "run"
    proc = run_cli("analyze", str(job4), "--out", str(out), "--workers", "1", *PEAKS)
    assert proc.returncode == 0, proc.stderr
    return digest(out)


def test_two_workers_write_the_run_files_of_one(job4, one_by_one, tmp_path):
    out = tmp_path / "run"
    proc = run_cli("analyze", str(job4), "--out", str(out), "--workers", "2", *PEAKS)
    assert proc.returncode == 0, proc.stderr
    assert digest(out) == one_by_one  # ranks/<r>/ included
    assert sorted(p.name for p in (out / "ranks").iterdir()) == ["0", "1", "2", "3"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".opscope")]
    # the run's ranks/ again: run directories, read (not analyzed) by the workers
    again = {}
    for n in ("1", "2"):
        proc = run_cli("analyze", str(out / "ranks"), "--out", str(tmp_path / f"again{n}"), "--workers", n, *PEAKS)
        assert proc.returncode == 0, proc.stderr
        again[n] = digest(tmp_path / f"again{n}")
    assert again["1"] == again["2"]


def test_workers_beside_other_threads_start_by_forkserver_and_write_the_same_files(job4, one_by_one, tmp_path):
    """An API user's process with threads of its own is not forked (a fork can deadlock there)."""
    from opscope.api import analyze

    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert engines.LocalPool(2).context.get_start_method() == "forkserver"
        analyze(job4, out=tmp_path / "run", workers=2, peak_bw=20, peak_flops="100")
    finally:
        stop.set()
        other.join()
    assert digest(tmp_path / "run") == one_by_one


def test_a_bad_rank_among_workers_is_the_same_one_line(job4, tmp_path):
    """The first bad rank in the folder's order is the error, whichever worker finishes first."""
    folder = tmp_path / "job"
    folder.mkdir()
    for p in sorted(job4.iterdir()):
        (folder / p.name).write_bytes(p.read_bytes())
    (folder / "rank2.json.gz").write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "X", "name": "oops"'))
    errors = [assert_clean_error(run_cli("analyze", str(folder), "--out", str(tmp_path / f"o{n}"), "--workers", n,
                                         *PEAKS)) for n in ("1", "2")]
    assert errors[0] == errors[1] and "rank2.json.gz" in errors[0]
    assert not [p for p in tmp_path.iterdir() if p.name != "job"]


def test_option_misuse_is_one_line(job4, tmp_path):
    assert_clean_error(run_cli("analyze", str(job4), "--workers", "0", *PEAKS), "--workers")
    assert_clean_error(run_cli("analyze", str(job4), "--address", "ray://x:10001", *PEAKS),
                       "--address", "--engine ray")
    assert_clean_error(run_cli("analyze", str(SHARED), "--engine", "ray", *PEAKS), "apply to a folder of ranks")
    assert not (tmp_path / "reports").exists()


def test_engine_ray_without_ray_is_one_line(job4, tmp_path, monkeypatch):
    from opscope.api import analyze

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    monkeypatch.chdir(tmp_path)
    with pytest.raises(OpscopeError, match=r"pip install 'opscope\[ray\]'"):
        analyze(job4, engine="ray", peak_bw=20, peak_flops="100")
    assert list(tmp_path.iterdir()) == []


def test_progress_counts_the_ranks_done(job4, tmp_path):
    from opscope.api import analyze
    from opscope.capture.options import Progress

    calls: list[tuple[str, object]] = []

    class Seen(Progress):
        def phase(self, name: str, total: int | None = None) -> None:
            calls.append(("phase", (name, total)))

        def advance(self, n: int = 1) -> None:
            calls.append(("advance", n))

    analyze(job4, out=tmp_path / "run", workers=2, peak_bw=20, peak_flops="100", progress=Seen())
    assert calls == [("phase", ("ranks", 4))] + [("advance", 1)] * 4


def _interrupted(tmp_path: Path, *options: str, started: str, after: float = 0.0) -> str:
    """`opscope analyze` of 12 ranks sent SIGINT once `started` (a glob in the run's parent folder) exists
    and `after` more seconds: exit 130, no run, no staging folder. Returns stderr."""
    folder = tmp_path / "job"
    _load_benchmark().synthetic_ranks(TRACES / "h100_vit-image-classifier_bf16.json.gz", folder, ranks=12)
    parent = tmp_path / "out"
    parent.mkdir()
    env = dict(os.environ, COLUMNS="120")
    proc = subprocess.Popen([sys.executable, "-m", "opscope", "analyze", str(folder), "--out", str(parent / "run"),
                             *options, *PEAKS], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + 120
        while not any(parent.glob(started)):
            assert proc.poll() is None and time.monotonic() < end, proc.communicate()
            time.sleep(0.02)
        time.sleep(after)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted by SIGINT; nothing was written" in err and "Traceback" not in err
    assert list(parent.iterdir()) == []
    return err


def test_ctrl_c_while_workers_run_leaves_nothing(tmp_path):
    """SIGINT while a worker writes its rank (the staging folder holds its .entry-<i>): the workers are
    stopped, no run and no staging folder."""
    _interrupted(tmp_path, "--workers", "2", started=".opscope-run-*/ranks/.entry-*")


@pytest.mark.slow
def test_ctrl_c_on_ray_leaves_nothing(tmp_path):
    """SIGINT while the local Ray starts or runs the tasks: exit 130 (not a crash in Ray's exit), nothing
    written, Ray shut down."""
    pytest.importorskip("ray")
    _interrupted(tmp_path, "--engine", "ray", "--workers", "2", started=".opscope-run-*/ranks", after=3.0)


def test_a_worker_that_dies_is_an_error_and_the_other_jobs_still_run():
    with engines.LocalPool(2) as pool:
        results = dict(pool.run(os._exit, [3, 3, 3], [0, 0, 0]))  # each job's worker exits at once
    assert sorted(results) == [0, 1, 2] and all(isinstance(r, engines.WorkerDied) for r in results.values())
    with engines.LocalPool(2) as pool:
        assert sorted(pool.run(abs, [-1, -2, -3], [0, 0, 0])) == [(0, 1), (1, 2), (2, 3)]


class _FakeRay:
    """Just enough of Ray's API for RayEngine, run in this process: what each task declared, and a job
    that raises failing its task."""

    class exceptions:  # noqa: N801 - ray.exceptions
        class RayError(Exception):
            pass

    def __init__(self, node_memory: float) -> None:
        self.node_memory = node_memory
        self.started: dict = {}
        self.submitted: list[tuple[object, dict]] = []
        self.shut = False

    def is_initialized(self) -> bool:
        return bool(self.started)

    def init(self, **options) -> None:
        self.started = options

    def shutdown(self) -> None:
        self.shut = True

    def nodes(self) -> list[dict]:
        return [{"Alive": True, "Resources": {"memory": self.node_memory}}, {"Alive": False, "Resources": {}}]

    def remote(self, fn):
        ray = self

        class Task:
            def options(self, **options):
                class Bound:
                    def remote(self, f, job):
                        ray.submitted.append((job, options))
                        try:
                            return ("ok", fn(f, job))
                        except Exception as exc:
                            return ("error", exc)
                return Bound()
        return Task()

    def wait(self, refs, num_returns):
        return refs[:num_returns], refs[num_returns:]

    def get(self, ref):
        kind, value = ref
        if kind == "error":
            error = self.exceptions.RayError("task failed")
            error.cause = value
            raise error
        return value

    def cancel(self, ref, force):
        pass


def _fails_on_odd(job: int) -> int:
    if job % 2:
        raise ValueError(f"job {job} is odd")
    return job * 10


def test_ray_tasks_declare_memory_run_twice_then_fail(monkeypatch):
    """RayEngine against a stand-in for Ray (no Ray needed): each task declares its memory, capped at
    the largest node's; a failing task is submitted once more, then comes back as Failed; a local Ray
    is started quietly and shut down."""
    fake = _FakeRay(node_memory=3e9)
    monkeypatch.setitem(sys.modules, "ray", fake)
    with engines.RayEngine(None, cpus=2) as engine:
        results = dict(engine.run(_fails_on_odd, [0, 1, 2], [10**9, 2 * 10**9, 8 * 10**9]))
    assert results == {0: 0, 1: engines.Failed("ValueError: job 1 is odd", 2), 2: 20}
    assert [(job, o["memory"]) for job, o in fake.submitted] == [(0, 10**9), (1, 2 * 10**9), (2, 3 * 10**9),
                                                                  (1, 2 * 10**9)]
    assert all(o["num_cpus"] == 1 and o["max_retries"] == 0 for _, o in fake.submitted)
    assert fake.started == {"num_cpus": 2, "log_to_driver": False, "include_dashboard": False,
                            "configure_logging": False} and fake.shut


def test_a_task_declares_memory_from_its_json_size(tmp_path):
    from opscope.analysis.ranks import JSON_EXPANSION, TASK_BASE_BYTES, RankJob, json_size, rank_memory

    doc = json.dumps({"traceEvents": [{"ph": "X", "name": "aten::mm", "ts": i, "dur": 1} for i in range(2000)]})
    gz = tmp_path / "rank0.json.gz"
    gz.write_bytes(gzip.compress(doc.encode()))
    plain = tmp_path / "rank1.json"
    plain.write_text(doc)
    assert json_size(gz) == json_size(plain) == len(doc.encode()) > gz.stat().st_size
    job = RankJob(0, str(gz), 0, None, (), None, None, json_size(gz))
    assert rank_memory(job) == TASK_BASE_BYTES + JSON_EXPANSION * len(doc.encode())


def _flaky(path: str) -> str:
    """A Ray task that fails on every try, counting them in `path`."""
    with open(path, "a") as f:
        f.write("try\n")
    raise OSError("disk went away")


@pytest.mark.slow
def test_ray_engine_gives_the_local_run_files_and_names_a_failed_rank(job4, one_by_one, tmp_path):
    """A local Ray (num_cpus=2): the run files of --workers 1; then a rank whose trace is corrupt is tried
    twice and left out, and the merged run names it."""
    ray = pytest.importorskip("ray")
    out = tmp_path / "run"
    proc = run_cli("analyze", str(job4), "--out", str(out), "--engine", "ray", "--workers", "2", *PEAKS)
    assert proc.returncode == 0, proc.stderr
    assert digest(out) == one_by_one
    assert "Traceback" not in proc.stderr and "Ray" not in proc.stderr  # Ray's start-up notices stay quiet

    folder = tmp_path / "job"
    folder.mkdir()
    for p in sorted(job4.iterdir()):
        (folder / p.name).write_bytes(p.read_bytes())
    (folder / "rank2.json.gz").write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "X", "name": "oops"'))
    proc = run_cli("analyze", str(folder), "--out", str(tmp_path / "partial"), "--engine", "ray", "--workers", "2",
                   *PEAKS, "--json")
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)["distributed"]
    assert d["ranks"] == 3 and [f["rank"] for f in d["failed_ranks"]] == [2]
    assert d["failed_ranks"][0]["source"] == "rank2.json.gz" and d["failed_ranks"][0]["error"]
    assert "rank2.json.gz (rank 2)" in proc.stderr and "failed 2 times" in proc.stderr
    assert sorted(p.name for p in (tmp_path / "partial" / "ranks").iterdir()) == ["0", "1", "3"]
    assert read_run(tmp_path / "partial").summary["distributed"]["failed_ranks"][0]["rank"] == 2  # the format's

    # the retry itself, counted: a task that always fails runs twice, then comes back as Failed
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this test file
    tries = tmp_path / "tries"
    with engines.RayEngine(None, cpus=2) as engine:
        results = list(engine.run(_flaky, [str(tries)], [2**20]))
    assert results == [(0, engines.Failed("OSError: disk went away", 2))]
    assert tries.read_text() == "try\n" * 2


def test_a_folder_by_url_gives_the_run_of_the_local_folder(job4, one_by_one, tmp_path):
    """fsspec's local file system (local://) stands in for an object store: two workers read their
    ranks by URL."""
    out = tmp_path / "run"
    proc = run_cli("analyze", f"local://{job4}", "--out", str(out), "--workers", "2", *PEAKS)
    assert proc.returncode == 0, proc.stderr
    assert digest(out) == one_by_one
    assert read_run(out).meta["target"] == f"local://{job4}"


def test_a_memory_folder_url(job4, one_by_one, tmp_path):
    import fsspec

    from opscope.api import analyze

    fs = fsspec.filesystem("memory")
    root = f"/opscope-ranks-{os.getpid()}"
    try:
        for trace in sorted(job4.iterdir()):
            fs.pipe(f"{root}/job/{trace.name}", trace.read_bytes())
        analyze(f"memory://{root}/job", out=tmp_path / "run", workers=1, peak_bw=20, peak_flops="100")
        assert digest(tmp_path / "run") == one_by_one
        with pytest.raises(OpscopeError, match="holds no per-rank traces"):
            fs.pipe(f"{root}/empty/notes.txt", b"x")
            analyze(f"memory://{root}/empty", out=tmp_path / "none")
    finally:
        fs.rm(root, recursive=True)
    assert not (tmp_path / "none").exists()
