"""Writing the run directory (CONTRACT.md): meta.json, ops.csv, findings.json, summary.json, trace.json.gz,
modules.csv when the run has module paths, timeline.json when it has a timeline, torch_trace.log.gz when the profiled model compiled (opscope.run.schema, docs/reference/run-format.md).

Written atomically: everything goes into a hidden temporary sibling which is renamed into place at the
end, so an interrupted run never leaves a directory that looks complete, and an existing run is never
overwritten.
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opscope.errors import OutputError
from opscope.limits import MAX_TEXT_CHARS, bounded
from opscope.run.cells import spreadsheet_safe
from opscope.run.model import (
    DEFAULT_REPORTS_DIR,
    RANKS_FILE,
    STAGING_PREFIX,
    TIMELINE_FILE,
    TORCH_TRACE_FILE,
    WHATIF_FILE,
    Run,
)
from opscope.table import Table

if TYPE_CHECKING:
    pass


def check_out_dir(out: Path | None, base: Path | None = None) -> None:
    """Fails early (before any profiling or analysis) if the run cannot be written: `out` (or, without
    it, the reports folder `base`) must be creatable and writable, not inside a file, not a symlink
    that points nowhere, and (for `out`) empty and not a mount point. One OutputError line each."""
    if out is None:
        _check_writable_folder(base if base is not None else DEFAULT_REPORTS_DIR, "the reports folder")
        return
    if out.is_symlink() and not out.exists():
        raise OutputError(f"--out {out} is a symlink to nothing ({os.readlink(out)})")
    if out.exists():
        if not out.is_dir():
            raise OutputError(f"--out {out} exists and is not a directory")
        try:
            entries = any(out.iterdir())
        except OSError as exc:
            raise OutputError(f"--out {out} cannot be read: {exc.strerror or exc}") from exc
        if entries:
            raise OutputError(f"--out {out} already exists and is not empty; opscope never overwrites a run")
        if os.path.ismount(out):
            raise OutputError(f"--out {out} is a mount point: opscope builds a run beside its final place and "
                              "renames it in, which a mount point cannot take; give a directory inside it")
    _check_writable_folder(out.absolute().parent, f"--out {out}: its parent folder")


def make_folders(folder: Path) -> None:
    """`mkdir -p folder`, without recursion: pathlib's and os.makedirs recurse once per missing folder, and
    an --out 2,000 folders deep ended in a RecursionError."""
    missing = []
    current = folder.absolute()
    while not current.is_dir():
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    for path in reversed(missing):
        with contextlib.suppress(FileExistsError):  # made meanwhile by another process
            path.mkdir()


def _check_writable_folder(folder: Path, what: str) -> None:
    """The nearest existing ancestor of `folder` must be a directory we can create entries in; checked by
    creating (and removing) a probe directory, which also catches read-only file systems."""
    folder = folder.absolute()
    existing = folder
    while not existing.exists():
        if existing.is_symlink():
            raise OutputError(f"{what} {folder} goes through a symlink to nothing ({existing})")
        if existing.parent == existing:
            break
        existing = existing.parent
    if not existing.is_dir():
        raise OutputError(f"{what} {folder} cannot be created: {existing} is a file, not a folder")
    try:
        probe = tempfile.mkdtemp(prefix=".opscope-probe-", dir=existing)
        os.rmdir(probe)
    except OSError as exc:
        raise OutputError(f"{what} {folder} is not writable: {exc.strerror or exc}") from exc


def default_run_dir(stem: str, base: Path = DEFAULT_REPORTS_DIR, now: datetime | None = None) -> Path:
    """reports/<YYYYmmdd-HHMMSS>-<stem>/, with -2, -3, ... appended if taken. Only a suggestion: a
    concurrent run may take it first; write_run reserves the final name atomically."""
    return next(_run_dir_candidates(stem, base, now))


def _run_dir_candidates(stem: str, base: Path, now: datetime | None = None) -> Iterator[Path]:
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in stem).lstrip(".") or "run"
    candidate = base / f"{stamp}-{safe}"
    k = 2
    while True:
        if not candidate.exists() and not candidate.is_symlink():
            yield candidate
        candidate = base / f"{stamp}-{safe}-{k}"
        k += 1


def _reserve(stem: str, base: Path) -> Path:
    """Creates the first free default run directory (empty) and returns it. mkdir is atomic, so two
    runs started in the same second get distinct names (-2, -3, ...)."""
    for candidate in _run_dir_candidates(stem, base):
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        return candidate
    raise AssertionError("unreachable")


def _clean(value: Any) -> Any:
    """JSON-safe: NaN/inf -> null, numpy scalars -> Python; a string over MAX_TEXT_CHARS cut to that."""
    if isinstance(value, str):
        return value if len(value) <= MAX_TEXT_CHARS else bounded(value)
    if isinstance(value, dict):
        return {_clean(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


json_safe = _clean  # for other writers of JSON


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
        self._made_folder: Path | None = None
        self._discarded = False
        if data is None:
            with open(src, "rb") as f:
                if f.read(2) == b"\x1f\x8b":
                    return
        if not folder.exists():
            self._made_folder = folder  # removed again by discard() if the run never lands there
        make_folders(folder)
        fd, name = tempfile.mkstemp(prefix=".trace-", suffix=".json.gz", dir=folder)
        self.path = path = Path(name)
        try:
            os.close(fd)
            self._thread = threading.Thread(target=self._run, args=(path,), daemon=True)
            self._thread.start()
        except BaseException:  # e.g. a signal right here: leave no temporary file
            self.discard()
            raise

    def _run(self, dst: Path) -> None:
        if self._discarded:  # discard() came while start() was still waiting for this thread
            return
        try:
            if self.data is not None:
                _gzip_bytes(self.data, dst)
            else:
                _gzip_file(self.src, dst)
        except BaseException as exc:  # re-raised in result()
            self._error = exc

    def result(self) -> tuple[Path, bool]:
        """(file to put in the run directory, whether it may be moved rather than copied)."""
        path = self.path
        if self._thread is None or path is None:  # no thread (the source is gzipped): path is None too
            return self.src, False
        self._thread.join()
        if self._error is not None:
            raise self._error
        return path, True

    def discard(self) -> None:
        """Removes the temporary file (and the folder this created, if still empty). Safe to interrupt:
        a signal during the join still removes the file (the thread may keep writing to the unlinked
        file until it ends)."""
        self._discarded = True
        try:
            if self._thread is not None:
                # RuntimeError: a signal interrupted start() before the thread ran; it is not running yet,
                # and when it does, _run sees _discarded and writes nothing
                with contextlib.suppress(RuntimeError):
                    self._thread.join()
        finally:
            if self.path is not None:
                with contextlib.suppress(OSError):
                    self.path.unlink()
            if self._made_folder is not None:
                with contextlib.suppress(OSError):
                    self._made_folder.rmdir()  # only if still empty: a failed run leaves no empty reports/


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


def write_csv(table: Table, path: Path) -> None:
    """The table as CSV, byte for byte what `DataFrame.to_csv(path, index=False)` wrote (opscope's format
    before tables), without pandas: floats by repr, NaN and None empty, bools True/False, minimal
    quoting; except text cells a spreadsheet would run as formulas, which get a quote in front
    (opscope.run.cells, undone on reading). A text over MAX_TEXT_CHARS is cut to that: every cell stays
    readable by csv's field limit."""
    columns = [[spreadsheet_safe(v if len(v) <= MAX_TEXT_CHARS else bounded(v)) if type(v) is str else _csv_cell(v)
                for v in values] for values in table.values()]
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow([str(c) for c in table])
        w.writerows(zip(*columns, strict=True))


def _csv_cell(v: Any) -> Any:
    if v is None:
        return ""
    if isinstance(v, float):  # np.float64 too; float.__repr__ keeps numpy's scalar repr out
        return "" if v != v else float.__repr__(v)
    return v  # int, bool: csv writes str(v), as pandas did


def write_run(run: Run, out: Path | None, stem: str, trace_file: Path | None,
              compressor: TraceCompressor | None = None, base: Path | None = None,
              extra_files: dict[str, Path] | None = None, extra: Callable[[Path], None] | None = None,
              extra_texts: dict[str, str] | None = None, torch_trace: Path | None = None) -> Path:
    """Writes the run directory atomically and returns its path. `trace_file` is copied (gzipped if it
    is not already) as trace.json.gz; a `compressor` already gzipping it takes its place. `torch_trace`
    (torch.compile's structured log) is copied the same way as torch_trace.log.gz. `extra_files`
    ({name in the run: source file}) are copied in too, `extra_texts` ({name: text}, e.g. swap.json)
    written, and `extra(folder)` adds files to the run while it is still hidden (a merged run's ranks/).
    Without `out` the run gets a fresh default name under `base` (default: ./reports). Any OSError (disk
    full, read-only file system, ...) is one OutputError line, with nothing left under the final name."""
    base = base if base is not None else DEFAULT_REPORTS_DIR
    if out is not None and out.is_symlink() and out.exists():
        out = out.resolve()  # a symlink to an empty directory: the run goes where it points
    folder = (out.absolute().parent if out is not None else base.absolute())
    tmp: Path | None = None
    reserved: Path | None = None
    try:
        if out is not None:
            check_out_dir(out)
        make_folders(folder)
        tmp = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}-", dir=folder))
        (tmp / "meta.json").write_text(dumps(run.meta) + "\n")
        write_csv(run.ops, tmp / "ops.csv")
        modules = run.modules
        if modules is not None:
            write_csv(modules, tmp / "modules.csv")
        (tmp / "findings.json").write_text(dumps(run.findings) + "\n")
        (tmp / "summary.json").write_text(dumps(run.summary) + "\n")
        if run.whatif is not None:
            (tmp / WHATIF_FILE).write_text(dumps(run.whatif) + "\n")
        ranks = run.ranks
        if ranks is not None:
            write_csv(ranks, tmp / RANKS_FILE)
        if run.timeline is not None:  # compact: its arrays run to thousands of numbers
            (tmp / TIMELINE_FILE).write_text(json.dumps(_clean(run.timeline), separators=(",", ":")) + "\n")
        for name, text in (extra_texts or {}).items():
            (tmp / name).write_text(text)
        if compressor is not None:
            src, movable = compressor.result()
            if movable:
                os.replace(src, tmp / "trace.json.gz")
            else:
                _copy_trace(src, tmp / "trace.json.gz")
        elif trace_file is not None:
            _copy_trace(trace_file, tmp / "trace.json.gz")
        if torch_trace is not None:
            _copy_trace(torch_trace, tmp / TORCH_TRACE_FILE)
        for name, src in (extra_files or {}).items():
            shutil.copyfile(src, tmp / name)
        if extra is not None:
            extra(tmp)
        if out is not None:
            target = out
        else:
            target = reserved = _reserve(stem, folder)
        # rename(2) over an empty directory replaces it atomically: the run appears whole or not at all.
        os.replace(tmp, target)
        tmp = None
    except OSError as exc:
        _discard(tmp, reserved)
        where = out if out is not None else folder
        raise OutputError(f"cannot write the run directory under {where}: {exc.strerror or exc}") from exc
    except BaseException:
        _discard(tmp, reserved)
        raise
    run.path = target
    return target


def discard_staging(folders: list[Path], pid: int) -> None:
    """Removes what a killed process `pid` left while writing a run: its hidden staging directories."""
    for folder in folders:
        with contextlib.suppress(OSError):
            for path in folder.glob(f"{STAGING_PREFIX}{pid}-*"):
                shutil.rmtree(path, ignore_errors=True)


def _discard(tmp: Path | None, reserved: Path | None) -> None:
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)
    if reserved is not None:
        with contextlib.suppress(OSError):
            reserved.rmdir()


def _copy_trace(src: Path, dst: Path) -> None:
    with open(src, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    if gz:
        shutil.copyfile(src, dst)
    else:
        _gzip_file(src, dst)

