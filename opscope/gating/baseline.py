"""The baseline file: the samples of a few runs (opscope.gating.samples), the machine they ran on and its
ceilings, the torch version; one small, versioned JSON file per name (DIR/NAME.json), meant to be committed.
Written atomically; read with a size cap, and a file of another format or a newer version is refused in one
line."""

from __future__ import annotations

import datetime as dt
import os
import re
import tempfile
from pathlib import Path
from typing import Literal

import msgspec
from msgspec import Struct

from opscope.errors import OpscopeError, OutputError
from opscope.gating.samples import Samples
from opscope.limits import bounded
from opscope.run.model import shown_path
from opscope.version import __version__

FORMAT: Literal["opscope-baseline"] = "opscope-baseline"
FORMAT_VERSION = 1
DEFAULT_DIR = Path(".opscope/baselines")
# A baseline of MAX_OP_ROWS rows x a few runs is tens of KiB; anything near this cap is not one of ours.
MAX_BASELINE_BYTES = 8 * 1024 * 1024
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


class Baseline(Struct, kw_only=True):
    format: Literal["opscope-baseline"] = FORMAT
    format_version: int = FORMAT_VERSION
    name: str
    created: str = ""
    opscope_version: str = __version__
    samples: Samples


class _Header(Struct):
    format: str = ""
    format_version: int = 0


def baseline_path(name: str, folder: Path = DEFAULT_DIR) -> Path:
    if not NAME.fullmatch(name):
        raise OpscopeError(f"baseline name {bounded(name, 60)!r}: use 1-100 letters, digits, '.', '_' or '-' "
                           "(it names the file NAME.json)")
    return folder / f"{name}.json"


def _rounded(samples: Samples) -> Samples:
    """The samples with times kept to 0.01 µs: a smaller file, far below any timing's noise."""
    samples = msgspec.structs.replace(samples, step_times_us=[[round(t, 2) for t in run] for run in samples.step_times_us],
                                      op_time_us=[round(t, 2) for t in samples.op_time_us])
    for row in samples.ops:
        row.times_us = [round(t, 2) for t in row.times_us]
    for mod in samples.modules:
        mod.times_us = [round(t, 2) for t in mod.times_us]
    return samples


def save_baseline(samples: Samples, name: str, folder: Path = DEFAULT_DIR) -> Path:
    """Writes DIR/NAME.json (replacing an older baseline of that name) atomically: a reader sees the old file
    or the new one, never half of one."""
    path = baseline_path(name, folder)
    baseline = Baseline(name=name, created=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                        samples=_rounded(samples))
    data = msgspec.json.format(msgspec.json.encode(baseline), indent=1) + b"\n"
    write_atomically(path, data)
    return path


def write_atomically(path: Path, data: bytes) -> None:
    """`data` in `path`, via a temporary file in the same folder renamed over it."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.chmod(tmp, 0o644)  # mkstemp makes it 0600: a file to commit and share is readable
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as exc:
        raise OutputError(f"cannot write {shown_path(path)}: {exc.strerror or exc}") from exc


def load_baseline(name: str, folder: Path = DEFAULT_DIR) -> Baseline:
    """DIR/NAME.json read back and checked; missing, oversized, damaged, of another format or of a newer
    version is one OpscopeError."""
    path = baseline_path(name, folder)
    where = shown_path(path)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BASELINE_BYTES + 1)
    except FileNotFoundError:
        raise OpscopeError(f"no baseline {name!r} in {shown_path(folder)}/ (save one with `opscope baseline save RUN... "
                           f"--name {name}`)") from None
    except OSError as exc:
        raise OpscopeError(f"cannot read {where}: {exc.strerror or exc}") from exc
    if len(data) > MAX_BASELINE_BYTES:
        raise OpscopeError(f"{where} is over {MAX_BASELINE_BYTES // (1024 * 1024)} MiB: not an opscope baseline")
    try:
        header = msgspec.json.decode(data, type=_Header)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise OpscopeError(f"{where} is damaged: {bounded(str(exc), 200)}") from None
    if header.format != FORMAT:
        raise OpscopeError(f"{where} is not an opscope baseline (its format is {bounded(header.format, 60)!r})")
    if header.format_version > FORMAT_VERSION:
        raise OpscopeError(f"{where} is baseline format {header.format_version}, newer than this opscope reads "
                           f"({FORMAT_VERSION}): upgrade opscope")
    try:
        return msgspec.json.decode(data, type=Baseline)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise OpscopeError(f"{where} is damaged: {bounded(str(exc), 200)}") from None
