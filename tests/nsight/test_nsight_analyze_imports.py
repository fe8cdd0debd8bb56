"""`opscope analyze` of Nsight files imports neither pandas nor numpy (as `opscope analyze TRACE`,
tests/analysis/test_analyze_imports.py): the nsys export is read with sqlite3 and the ncu CSV with the csv
module into opscope.table column lists, and the measurements are attached to the op rows with plain Python."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from nsight_fixtures import BERT, RAW, build_nsys_sqlite

HEAVY = "print(sorted(m for m in ('pandas', 'numpy', 'torch') if m in sys.modules))"


def _analyze_imports(args: list[str], out: Path) -> tuple[list[str], str]:
    """The heavy modules `opscope analyze ARGS --out OUT` imported, and what it printed."""
    code = ("import contextlib, io, sys\nfrom opscope.cli.app import main\n"
            f"sys.argv = ['opscope', 'analyze', *{args!r}, '--out', {str(out)!r}]\n"
            "out = io.StringIO()\n"
            "with contextlib.redirect_stdout(out):\n"
            "    try:\n        main()\n    except SystemExit as exc:\n        assert not exc.code, exc.code\n"
            "print(repr(out.getvalue()))\n" + HEAVY)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    *_, printed, imported = proc.stdout.strip().splitlines()
    return eval(imported), eval(printed)


@pytest.mark.parametrize("kind", ["nsys-export", "ncu-csv", "trace-with-both"])
def test_analyzing_nsight_files_imports_no_pandas_or_numpy(kind: str, tmp_path: Path) -> None:
    export = build_nsys_sqlite(tmp_path / "report.sqlite")
    args = {"nsys-export": [str(export)], "ncu-csv": [str(RAW)],
            "trace-with-both": [str(BERT), "--nsys", str(export), "--ncu", str(RAW)]}[kind]
    out = tmp_path / "run"
    imported, printed = _analyze_imports(args, out)
    assert imported == []
    # the Nsight files were read and their tables written: the paths that matter here did run
    if kind != "ncu-csv":
        assert (out / "nsys_kernels.csv").is_file() and "Nsight Systems" in printed
    if kind != "nsys-export":
        assert (out / "ncu_kernels.csv").read_text().count("\n") == 27  # the header and the 26 kernels
