"""What the torch-free parent asks a supervised child to do (opscope.target.supervise), as typed
msgspec Structs: the parent builds one Job, run_worker writes it as JSON, the child decodes it into the
same type. One module for every kind of job, below every stage that runs one (capture, swap, nsight).

- ProfileOptions: what a profile is asked to do (the options of `opscope profile` and `opscope swap`);
- ProfileJob: `opscope profile` (opscope.capture.worker), with the script-mode part (ScriptSpec) and the
  several-processes part (LaunchSpec);
- SwapJob: `opscope swap` and `profile --try-swaps` (opscope.swap.worker), with its SwapSpec;
- NsightPass: one pass of `profile --nsys/--ncu` (opscope.nsight.worker): HoldRun or MeasureSteps;
- RankJob: one rank of a multi-process job, written by the launcher for torchrun's ranks
  (opscope.capture.distributed).

Every Struct refuses fields it does not know: a parent and a child that disagree are a bug to report,
not a key to drop silently. Torch-free (the parent imports it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, TypeVar

import msgspec


class ProfileOptions(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What a profile is asked to do: the options every job shares."""

    target: Path
    entry: str | None = None
    device: str = "auto"
    dtype: str | None = None
    mode: str = "inference"
    warmup: int = 2
    steps: int = 5
    threads: int | None = None
    peak_bw: float | None = None
    peak_flops: list[str] = msgspec.field(default_factory=list)
    out: Path | None = None
    debug: bool = False  # tracebacks for errors (--debug)
    nvtx: bool = False  # NVTX ranges around the timed steps and top-level module forwards (for Nsight)
    compile: str | None = None  # torch.compile the model with this mode (--compile: default, reduce-overhead, max-autotune)


class ScriptSpec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Script mode: the script runs as __main__ with `args` as sys.argv[1:]; a step ends at each
    optimizer step (the first optimizer that steps) or at each return of `step_fn`."""

    args: list[str] = msgspec.field(default_factory=list)
    step_fn: str | None = None  # "module:func" or "module:Class.method"
    stop_after: bool = False  # stop the script once the window (and the line step) are done
    auto: bool = False  # a script because the file has no model-file shape (nothing asked for script mode)


class LaunchSpec(msgspec.Struct, forbid_unknown_fields=True):
    """torchrun's topology options."""

    nproc_per_node: int
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None


class SwapSpec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The swaps to verify and benchmark: None for every bundled kernel that matches an op of the profile.
    Each request is a SwapRequest.to_json() document: opscope.kernels.catalog owns that type, and it sits
    above this layer."""

    requests: list[dict[str, Any]] | None = None
    repeats: int = 15  # most interleaved A/B rounds per timing


class Job(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What every supervised child gets: the profile's options (and, in them, --debug)."""

    options: ProfileOptions


class ProfileJob(Job, kw_only=True):
    """`opscope profile`: a model file or (with `script`) a script, in this process or (with `launch`)
    in several through torchrun."""

    script: ScriptSpec | None = None
    launch: LaunchSpec | None = None


class SwapJob(Job, kw_only=True):
    """`opscope swap` and `opscope profile --try-swaps`: the profile, then the swaps on the same model."""

    swap: SwapSpec


class HoldRun(msgspec.Struct, tag="profile", forbid_unknown_fields=True):
    """The profile pass of `profile --nsys/--ncu`: instead of writing the run directory, it leaves the
    analyzed run, its kernel plan and its trace in `folder` for the parent."""

    folder: Path


class MeasureSteps(msgspec.Struct, tag="measure", forbid_unknown_fields=True):
    """A measured pass of `profile --nsys/--ncu`: the process that `tool` (nsys or ncu) launches."""

    tool: str  # names the tool in the progress phases
    nvtx_ops: bool = False  # every aten op an NVTX range (--nvtx-ops, the nsys pass)


class NsightPass(Job, kw_only=True):
    """One pass of `profile --nsys/--ncu`."""

    task: HoldRun | MeasureSteps


class RankJob(Job, kw_only=True):
    """One rank of a multi-process job (torchrun starts each with it). Its options' `out` is where the
    rank writes its run (ranks_dir/<rank>)."""

    ranks_dir: Path  # where each rank leaves its run and its status file
    device: Literal["cpu", "cuda"]  # the launcher's resolved device type
    threads: int  # torch threads per rank
    script: ScriptSpec | None = None
    peaks: dict[str, Any] | None = None  # Peaks.to_json() the launcher measured once for all (CPU)


JobT = TypeVar("JobT", bound=Job)


def _encode_path(obj: Any) -> Any:
    if isinstance(obj, Path):
        return str(obj)
    raise NotImplementedError(f"a job cannot hold a {type(obj).__name__}")


def _decode_path(kind: type, obj: Any) -> Any:
    if kind is Path and isinstance(obj, str):
        return Path(obj)
    raise NotImplementedError(f"a job cannot hold a {kind.__name__}")


_ENCODER = msgspec.json.Encoder(enc_hook=_encode_path)


def encode_job(job: Job) -> bytes:
    """The job as the JSON its child decodes (paths as strings)."""
    return _ENCODER.encode(job)


def decode_job(data: bytes, job_type: type[JobT]) -> JobT:
    """`data` (encode_job's JSON) as `job_type`; raises msgspec.DecodeError (ValidationError included) when
    it is not one."""
    return msgspec.json.decode(data, type=job_type, dec_hook=_decode_path)
