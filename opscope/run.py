"""The run directory (CONTRACT.md): meta.json, ops.csv, findings.json, summary.json, trace.json.gz.

Written atomically: everything goes into a hidden temporary sibling which is renamed into place at the
end, so an interrupted run never leaves a directory that looks complete, and an existing run is never
overwritten.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd

from opscope.errors import OpscopeError, OutputError

FORMAT_VERSION = 1
RUN_FILES = ("meta.json", "ops.csv", "findings.json", "summary.json", "trace.json.gz")
DEFAULT_REPORTS_DIR = Path("reports")


@dataclass
class Run:
    meta: dict[str, Any]
    ops: pd.DataFrame
    findings: list[dict[str, Any]]
    summary: dict[str, Any]
    path: Path | None = None
    events: pd.DataFrame | None = field(default=None, repr=False)  # in-memory only; not written


def check_out_dir(out: Path | None) -> None:
    """Fails early (before any profiling) if `out` can't receive a new run."""
    if out is None:
        return
    if out.exists():
        if not out.is_dir():
            raise OutputError(f"--out {out} exists and is not a directory")
        if any(out.iterdir()):
            raise OutputError(f"--out {out} already exists and is not empty; opscope never overwrites a run")
    parent = out.absolute().parent
    if parent.exists() and not os.access(parent, os.W_OK):
        raise OutputError(f"cannot write to {parent}")


def default_run_dir(stem: str, base: Path = DEFAULT_REPORTS_DIR, now: datetime | None = None) -> Path:
    """reports/<YYYYmmdd-HHMMSS>-<stem>/, with -2, -3, ... appended if taken."""
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in stem) or "run"
    candidate = base / f"{stamp}-{safe}"
    k = 2
    while candidate.exists():
        candidate = base / f"{stamp}-{safe}-{k}"
        k += 1
    return candidate


def _clean(value: Any) -> Any:
    """JSON-safe: NaN/inf -> null, numpy scalars -> Python."""
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def dumps(obj: Any) -> str:
    return json.dumps(_clean(obj), indent=2)


class TraceCompressor:
    """Gzips an uncompressed trace into `folder` on a background thread while analysis runs (zlib
    releases the GIL, so on a multi-core machine this costs no wall time). A gzipped regular file is
    copied as it is by write_run. A trace that is not a regular file (a pipe, /dev/stdin) can be read
    only once: pass its bytes as `data` and they are gzipped from memory."""

    def __init__(self, src: Path, folder: Path, data: bytes | bytearray | None = None) -> None:
        self.src = src
        self.data = data
        self.path: Path | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        if data is None:
            with open(src, "rb") as f:
                if f.read(2) == b"\x1f\x8b":
                    return
        folder.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=".trace-", suffix=".json.gz", dir=folder)
        os.close(fd)
        self.path = Path(name)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            if self.data is not None:
                _gzip_bytes(self.data, self.path)
            else:
                _gzip_file(self.src, self.path)
        except BaseException as exc:  # re-raised in result()
            self._error = exc

    def result(self) -> tuple[Path, bool]:
        """(file to put in the run directory, whether it may be moved rather than copied)."""
        if self._thread is None:
            return self.src, False
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self.path, True

    def discard(self) -> None:
        if self._thread is not None:
            self._thread.join()
        if self.path is not None and self.path.exists():
            self.path.unlink()


def _gzip_file(src: Path, dst: Path) -> None:
    import gzip

    level = 1 if src.stat().st_size > (64 << 20) else 6  # big traces: speed over a few % of size
    with open(src, "rb") as fi, gzip.open(dst, "wb", compresslevel=level) as fo:
        shutil.copyfileobj(fi, fo, 8 << 20)


def _gzip_bytes(data: bytes | bytearray, dst: Path) -> None:
    import gzip

    level = 1 if len(data) > (64 << 20) else 6
    with gzip.open(dst, "wb", compresslevel=level) as fo:
        view = memoryview(data)
        for i in range(0, len(view), 8 << 20):
            fo.write(view[i:i + (8 << 20)])


def write_run(run: Run, out: Path | None, stem: str, trace_file: Path | None,
              compressor: TraceCompressor | None = None) -> Path:
    """Writes the run directory atomically and returns its path. `trace_file` is copied (gzipped if it
    is not already) as trace.json.gz; a `compressor` already gzipping it takes its place."""
    target = out if out is not None else default_run_dir(stem)
    check_out_dir(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        (tmp / "meta.json").write_text(dumps(run.meta) + "\n")
        run.ops.to_csv(tmp / "ops.csv", index=False)
        (tmp / "findings.json").write_text(dumps(run.findings) + "\n")
        (tmp / "summary.json").write_text(dumps(run.summary) + "\n")
        if compressor is not None:
            src, movable = compressor.result()
            if movable:
                os.replace(src, tmp / "trace.json.gz")
            else:
                _copy_trace(src, tmp / "trace.json.gz")
        elif trace_file is not None:
            _copy_trace(trace_file, tmp / "trace.json.gz")
        if target.exists():  # an empty directory: rename(2) replaces it atomically
            target.rmdir()
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    run.path = target
    return target


def _copy_trace(src: Path, dst: Path) -> None:
    with open(src, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    if gz:
        shutil.copyfile(src, dst)
    else:
        _gzip_file(src, dst)


def find_latest_run(base: Path = DEFAULT_REPORTS_DIR) -> Path:
    runs = [p for p in base.glob("*") if p.is_dir() and not p.name.startswith(".") and (p / "summary.json").exists()]
    if not runs:
        raise OpscopeError(f"no runs under {base}/; run `opscope profile` or `opscope analyze` first")
    return max(runs, key=lambda p: (p / "summary.json").stat().st_mtime)


def read_run(path: Path) -> Run:
    if not path.exists():
        raise OpscopeError(f"no such run directory: {path}")
    missing = [f for f in RUN_FILES[:4] if not (path / f).exists()]
    if missing:
        raise OpscopeError(f"{path} is not an opscope run directory (missing {', '.join(missing)})")
    try:
        meta = json.loads((path / "meta.json").read_text())
        summary = json.loads((path / "summary.json").read_text())
        findings = json.loads((path / "findings.json").read_text())
    except json.JSONDecodeError as exc:
        raise OpscopeError(f"{path} has a damaged JSON file ({exc})") from exc
    ops = read_ops_csv(path / "ops.csv")
    return Run(meta=meta, ops=ops, findings=findings, summary=summary, path=path)


TEXT_COLUMNS = ("op", "input_dims", "input_dtypes", "input_strides", "concrete_inputs", "source_location",
                "bound", "kernels", "family", "dtype", "ceiling", "note")


def read_ops_csv(path: Path) -> pd.DataFrame:
    head = pd.read_csv(path, nrows=0).columns
    dtypes = {c: str for c in TEXT_COLUMNS if c in head}
    df = pd.read_csv(path, dtype=dtypes, keep_default_na=False, na_values={c: [""] for c in head if c not in dtypes})
    return df
