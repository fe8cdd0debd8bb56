"""Multi-process jobs: `opscope profile TARGET --nproc-per-node N [--nnodes M --node-rank R --master-addr A
--master-port P]`.

The supervised child of `opscope profile` (opscope/capture/worker.py) becomes the launcher: it measures
the CPU's ceilings once for all ranks, then runs torch.distributed.run (torchrun) in process, which
starts N ranks, each `main()` below in a fresh interpreter (opscope.target.supervise.boot_command). Each rank
profiles its own process exactly as a one-process profile does and writes a whole run directory
`ranks/<rank>/` (plus a status file) into a hidden staging folder beside the final run; the launcher then
merges them (opscope.analysis.ranks, torch-free) into one run whose ranks/ they become.

- Model files: each rank initializes the default process group from torchrun's environment (gloo on
  CPU, NCCL on GPUs, device cuda:LOCAL_RANK), loads the file with its random seeds offset by its rank
  (so random inputs differ per rank), and with `--mode train` wraps the model in DistributedDataParallel
  (which copies rank 0's weights to every rank): the profile shows the real gradient all-reduces.
- Scripts (script mode): each rank runs the script as torchrun would; the script initializes its own
  process group and DDP.

Failures: a rank that raises or crashes makes torchrun stop the others; the launcher names the rank
that failed first (a rank that only lost its peers is not it), and nothing is written. Signals: the
supervisor stops the launcher, torchrun's handler stops the ranks, and each rank dies with the launcher
(PR_SET_PDEATHSIG) if it is killed outright; the staging folder goes with the launcher's other leftovers.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from opscope.analysis.ranks import RankRun, merge_ranks, rank_stats, staging_folder, valid_stats, write_merged
from opscope.capture.options import Progress
from opscope.errors import OpscopeError
from opscope.run.model import DEFAULT_REPORTS_DIR, Run
from opscope.run.read import read_run
from opscope.run.write import check_out_dir
from opscope.target.model_file import check_target_file
from opscope.target.specs import LaunchSpec, ProfileOptions, RankJob, ScriptSpec, encode_job
from opscope.target.supervise import (
    Stopped,
    boot_command,
    child_setup,
    death_by_signal,
    read_job,
    target_error_message,
)

SEED_STRIDE = 1_000_003  # rank r's torch.manual_seed(s) becomes s + r * SEED_STRIDE while the file loads
STATUS = ".status-{rank}.json"
# What a rank raises when another rank died under it (gloo, NCCL, the store): not the first failure.
PEER_LOST = re.compile(r"closed by peer|reset by peer|broken pipe|connection refused|timed? ?out|"
                       r"communicator was aborted|NCCL error|Socket Timeout", re.IGNORECASE)


class RankFailed(OpscopeError):
    """A rank of the job failed or crashed; nothing was written."""


# --- the launcher (in opscope profile's supervised child) -------------------------------------------------


def launch_ranks(opts: ProfileOptions, script: ScriptSpec | None, launch: LaunchSpec, progress: Progress) -> Run:
    """Runs the job's ranks through torchrun and merges their runs into one run directory."""
    import torch

    from opscope.capture.harness import resolve_device
    from opscope.capture.torch_profiler import machine_peaks

    check_target_file(opts.target)
    reports = DEFAULT_REPORTS_DIR.absolute()
    out = opts.out.absolute() if opts.out is not None else None
    check_out_dir(out, reports)
    n = launch.nproc_per_node
    device = resolve_device(opts.device)
    threads = opts.threads or max(1, (os.cpu_count() or 1) // n)
    peaks = None
    if device.type == "cuda":
        if script is None and torch.cuda.device_count() < n:
            raise OpscopeError(f"--nproc-per-node {n} on GPUs needs {n} GPUs on this node (one per rank); "
                               f"it has {torch.cuda.device_count()}")
    else:
        torch.set_num_threads(threads)  # the ceilings of one rank's thread count, measured once for all
        peaks = machine_peaks(opts, device, progress)[0].to_json()
    with staging_folder(out.parent if out is not None else reports) as staging:
        ranks_dir = staging / "ranks"
        ranks_dir.mkdir()
        job = RankJob(options=opts, script=script, device="cuda" if device.type == "cuda" else "cpu",
                      threads=threads, peaks=peaks, ranks_dir=ranks_dir)
        spec_path = staging / "rank-spec.json"
        spec_path.write_bytes(encode_job(job))
        where = f" on node {launch.node_rank} of {launch.nnodes}" if launch.nnodes > 1 else ""
        progress.phase(f"running {n} ranks{where} ({'gloo' if device.type == 'cpu' else 'NCCL'})")
        _torchrun(launch, spec_path, threads, ranks_dir, opts.debug)
        progress.phase("merging the ranks")
        rank_runs = _collect(ranks_dir, n)
        merged = merge_ranks(rank_runs, target=str(opts.target), warn=progress.warn)
        if launch.nnodes > 1:
            progress.warn(f"this run merges node {launch.node_rank}'s {n} ranks; for the whole job, collect every "
                          "node's RUN/ranks/* into one folder and run `opscope analyze FOLDER`")
        write_merged(merged, ranks_dir, out=out, stem=opts.target.stem, base=reports)
    return merged


def torchrun_args(launch: LaunchSpec, spec_path: Path) -> list[str]:
    """torch.distributed.run's command line: opscope's rank entry point, no restarts; one node without
    an address: a standalone rendezvous on a free local port."""
    args = ["--nproc-per-node", str(launch.nproc_per_node), "--nnodes", str(launch.nnodes),
            "--max-restarts", "0", "--monitor-interval", "0.1", "--no-python"]
    if launch.nnodes > 1 or launch.master_addr is not None or launch.master_port is not None:
        args += ["--node-rank", str(launch.node_rank), "--master-addr", launch.master_addr or "127.0.0.1"]
        if launch.master_port is not None:
            args += ["--master-port", str(launch.master_port)]
    else:
        args.append("--standalone")
    return [*args, *boot_command("opscope.capture.distributed"), str(spec_path)]


def _torchrun(launch: LaunchSpec, spec_path: Path, threads: int, ranks_dir: Path, debug: bool) -> None:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    os.environ["OMP_NUM_THREADS"] = str(threads)  # torchrun would set 1 (with a warning)
    if not debug:  # opscope says which rank failed, in one line; torchrun's own reports are for --debug
        _quiet_torchrun()
    try:
        run(parse_args(torchrun_args(launch, spec_path)))  # type: ignore[no-untyped-call, unused-ignore]  # unannotated in torch
    except ChildFailedError as exc:
        raise RankFailed(failure_message({r: f.exitcode for r, f in exc.failures.items()}, ranks_dir)) from None
    except SignalException:  # torchrun has stopped the ranks; opscope's parent reports the signal
        raise Stopped from None


def _quiet_torchrun() -> None:
    """torchrun's modules each set their own logger's level when imported: import those it uses, then
    raise the level of every one of them."""
    import importlib

    for module in ("torch.distributed.elastic.agent.server.local_elastic_agent",
                   "torch.distributed.elastic.rendezvous.dynamic_rendezvous",
                   "torch.distributed.elastic.rendezvous.c10d_rendezvous_backend",
                   "torch.distributed.elastic.rendezvous.static_tcp_rendezvous"):
        with contextlib.suppress(ImportError):
            importlib.import_module(module)
    for name in list(logging.Logger.manager.loggerDict):
        if name.startswith(("torch.distributed.elastic", "torch.distributed.run", "torch.distributed.launcher")):
            logging.getLogger(name).setLevel(logging.CRITICAL)


def _status(ranks_dir: Path, rank: int) -> dict[str, Any] | None:
    try:
        status = json.loads((ranks_dir / STATUS.format(rank=rank)).read_text())
    except (OSError, ValueError):
        return None
    return status if isinstance(status, dict) else None


def failure_message(exit_codes: dict[int, int], ranks_dir: Path) -> str:
    """One line naming the rank that failed first: a rank's own error (its status file) before a rank
    that only lost its peers, a crash before an exit code; ties go to the lowest rank."""
    found = []
    for rank, code in exit_codes.items():
        status = _status(ranks_dir, rank) or {}
        if status.get("error"):
            found.append((bool(status.get("peer")), 0, rank, f"rank {rank}: {status['error']}"))
        elif code is not None and code < 0:
            found.append((False, 1, rank, f"rank {rank} {death_by_signal(code)}"))
        else:
            found.append((False, 2, rank, f"rank {rank} ended with exit code {code} before writing its run "
                                          "(os._exit(), or a C library calling exit())"))
    found.sort()
    text = found[0][3].removesuffix("; opscope stopped and wrote nothing")
    return f"{text}; the job's other ranks were stopped and opscope wrote nothing"


def _collect(ranks_dir: Path, n: int) -> list[RankRun]:
    ranks = sorted(int(m.group(1)) for p in ranks_dir.iterdir() if (m := re.fullmatch(r"\.status-(\d+)\.json", p.name)))
    out = []
    for rank in ranks:
        folder = ranks_dir / str(rank)
        if not (_status(ranks_dir, rank) or {}).get("ok") or not folder.is_dir():
            raise RankFailed(f"rank {rank} ended without writing its run; opscope wrote nothing")
        run = read_run(folder)
        stats = run.summary.get("rank")
        if not isinstance(stats, dict) or not valid_stats(stats):
            raise RankFailed(f"rank {rank}'s run has no rank numbers (summary.json \"rank\"); opscope wrote nothing")
        out.append(RankRun(rank, run, stats, f"ranks/{rank}"))
        (ranks_dir / STATUS.format(rank=rank)).unlink()
    if len(out) != n:
        raise RankFailed(f"{len(out)} of this node's {n} ranks wrote a run; opscope wrote nothing")
    return out


# --- one rank (a process torchrun started) ------------------------------------------------------------------


class _RankProgress(Progress):
    """A rank has no control pipe: no phases, warnings to stderr, prefixed with the rank."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def warn(self, message: str) -> None:
        sys.stderr.write(f"opscope: rank {self.rank}: {message.removeprefix('opscope: ')}\n")
        sys.stderr.flush()


@contextlib.contextmanager
def rank_seeds(rank: int) -> Iterator[None]:
    """While the model file loads: torch's default generator seeded per rank, and torch.manual_seed(s)
    as s + rank * SEED_STRIDE, so that each rank draws its own random inputs (DDP copies rank 0's weights
    to all ranks, so the model stays the same)."""
    import torch

    original = torch.manual_seed

    def manual_seed(seed: int) -> Any:
        return original(int(seed) + rank * SEED_STRIDE)

    original(rank * SEED_STRIDE)
    torch.manual_seed = manual_seed
    try:
        yield
    finally:
        torch.manual_seed = original


def join_job(harness: Any, device: Any, progress: Any) -> None:
    """Run before warmup: `--mode train` wraps the model in DistributedDataParallel; every rank then
    waits for the others, so that their profiled steps line up."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    if harness.mode == "train":
        if any(p.requires_grad for p in harness.model.parameters()):
            harness.model = DistributedDataParallel(
                harness.model, device_ids=[device.index] if device.type == "cuda" else None)
        else:
            progress.warn("--mode train: the model has no trainable parameters, so DistributedDataParallel has "
                          "nothing to all-reduce; each rank trains on its own")
    dist.barrier()


def _profile_rank(job: RankJob, rank: int, local_rank: int, world: int) -> None:
    import torch
    import torch.distributed as dist

    from opscope.machine.peaks import Peaks

    opts = msgspec.structs.replace(job.options, out=job.ranks_dir / str(rank))
    cuda = job.device == "cuda"
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.set_num_threads(job.threads)
    peaks = Peaks.from_json(job.peaks) if job.peaks else None
    progress = _RankProgress(rank)
    backend = None if job.script is not None else ("nccl" if cuda else "gloo")

    def finish(run: Run, trace: Any) -> None:
        run.summary["rank"] = rank_stats(trace, run.summary, rank=rank, world_size=world, backend=backend)
        run.meta["rank"] = rank
        run.meta["world_size"] = world

    if job.script is not None:
        from opscope.capture.script import profile_script

        profile_script(opts, job.script, progress, peaks=peaks, finish=finish)
        return
    from opscope.capture.torch_profiler import profile_target

    dist.init_process_group(backend)  # torchrun's environment: MASTER_ADDR/PORT, RANK, WORLD_SIZE
    try:
        with rank_seeds(rank):
            profile_target(opts, progress, device=device, prepare=lambda h: join_job(h, device, progress),
                           peaks=peaks, finish=finish)
    finally:
        dist.destroy_process_group()


def _lost_peer(exc: BaseException) -> bool:
    """Whether the failure is another rank's: a distributed error, or gloo/NCCL losing a peer."""
    seen = 0
    cause: BaseException | None = exc
    while cause is not None and seen < 10:
        if type(cause).__name__ in ("DistBackendError", "DistNetworkError", "DistStoreError") or PEER_LOST.search(str(cause)):
            return True
        cause = cause.__cause__ or cause.__context__
        seen += 1
    return False


def main() -> None:
    """A rank's entry point (torchrun runs it): profile, write ranks/<rank>/ and a status file, exit."""
    child_setup()
    job = read_job(RankJob)
    rank = int(os.environ.get("RANK", "0"))
    status_path = job.ranks_dir / STATUS.format(rank=rank)
    status: dict[str, Any]
    try:
        _profile_rank(job, rank, int(os.environ.get("LOCAL_RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")))
        status = {"ok": True}
    except OpscopeError as exc:
        if job.options.debug:
            traceback.print_exc()
        status = {"error": str(exc), "peer": _lost_peer(exc)}
    except BaseException as exc:  # noqa: BLE001 (the user's code may raise anything, exit included)
        message = target_error_message(exc)
        if message is None:
            traceback.print_exc()
            message = f"internal error in opscope's rank process ({type(exc).__name__}: {str(exc)[:200]})"
        status = {"error": message, "peer": _lost_peer(exc)}
    with contextlib.suppress(OSError):
        status_path.write_text(json.dumps(status))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if status.get("ok") else 1)  # no interpreter teardown: a process group may still be up
