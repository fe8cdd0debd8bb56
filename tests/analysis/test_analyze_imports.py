"""`opscope analyze TRACE` imports neither pandas nor numpy: on a trace of a few thousand events their
import alone costs more than the whole analysis (issue 10's speed goal, benchmarks/analyze_vs_hta.py).
The analysis works on opscope.table column lists; pandas is for the commands that read runs back."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TESTS

FIXTURES = TESTS / "fixtures"
TRACES = sorted((FIXTURES / "traces").glob("*.json.gz")) + [
    FIXTURES / "cpu_traces" / "avx2_convnet_bf16_train.json.gz",
    FIXTURES / "compile" / "cpu_compiled_train_kernel_events.json.gz",
]
HEAVY = "print(sorted(m for m in ('pandas', 'numpy', 'torch') if m in sys.modules))"


def _imported(code: str) -> list[str]:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return eval(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.name.removesuffix(".json.gz"))
def test_analyzing_a_trace_imports_no_pandas_numpy_or_torch(trace: Path, tmp_path: Path) -> None:
    code = ("import sys\nfrom pathlib import Path\nfrom opscope.analysis.trace_file import analyze_trace_file\n"
            f"run = analyze_trace_file(Path({str(trace)!r}), out=Path({str(tmp_path / 'run')!r}))\n"
            "assert len(run.ops['op']) > 0\n" + HEAVY)
    assert _imported(code) == []
    assert (tmp_path / "run" / "ops.csv").is_file()


def test_the_analyze_command_imports_no_pandas_numpy_or_torch(tmp_path: Path) -> None:
    """The whole command, console report included."""
    trace = FIXTURES / "traces" / "h100_bert-small_bf16.json.gz"
    code = ("import contextlib, io, sys\nfrom opscope.cli.app import main\n"
            f"sys.argv = ['opscope', 'analyze', {str(trace)!r}, '--out', {str(tmp_path / 'run')!r}]\n"
            "out = io.StringIO()\n"
            "with contextlib.redirect_stdout(out):\n"
            "    try:\n        main()\n    except SystemExit as exc:\n        assert not exc.code, exc.code\n"
            "assert 'aten::' in out.getvalue()\n" + HEAVY)
    assert _imported(code) == []


def test_reading_the_run_back_as_dataframes_still_works(tmp_path: Path) -> None:
    """run.to_pandas() gives the ops table as a pandas DataFrame, the same data."""
    from opscope.analysis.trace_file import analyze_trace_file

    run = analyze_trace_file(FIXTURES / "traces" / "sglang_qwen3-8b_decode_cudagraph.json.gz", out=tmp_path / "r")
    table = run.ops
    frame = run.to_pandas()
    assert list(frame.columns) == list(table)
    assert frame["op"].tolist() == table["op"]
    assert frame["time_us_total"].tolist() == table["time_us_total"]


def test_merging_ranks_imports_no_pandas_numpy_or_torch(tmp_path: Path) -> None:
    """`opscope analyze FOLDER` of rank traces (tests/fixtures/distributed), console report included, then
    the same merge again from the merged run's ranks/ (run directories, as `profile --nproc-per-node`
    merges them)."""
    folder = FIXTURES / "distributed"
    code = ("import contextlib, io, sys\nfrom opscope.cli.app import main\n"
            "def analyze(*args):\n"
            "    sys.argv = ['opscope', 'analyze', *args]\n"
            "    out = io.StringIO()\n"
            "    with contextlib.redirect_stdout(out):\n"
            "        try:\n            main()\n        except SystemExit as exc:\n            assert not exc.code, exc.code\n"
            "    assert 'straggler: rank 1' in out.getvalue(), out.getvalue()\n"
            f"analyze({str(folder)!r}, '--out', {str(tmp_path / 'run')!r})\n"
            f"analyze({str(tmp_path / 'run' / 'ranks')!r}, '--out', {str(tmp_path / 'again')!r})\n" + HEAVY)
    assert _imported(code) == []
    assert (tmp_path / "again" / "ranks.csv").read_text() == (tmp_path / "run" / "ranks.csv").read_text()
