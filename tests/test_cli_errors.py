"""Bad input: one clear line on stderr, exit 2, no traceback, nothing half-written."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from conftest import PEAKS, TRACES, run_cli, write_model


def assert_clean_error(proc, *needles: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    err = proc.stderr.strip()
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert proc.stdout.strip() == ""
    return lines[0]


def no_runs_written(folder: Path) -> bool:
    reports = folder / "reports"
    return not reports.exists() or not any(reports.iterdir())


def test_missing_file(tmp_path):
    proc = run_cli("profile", "nope.py", *PEAKS, cwd=tmp_path)
    assert_clean_error(proc, "no such file", "nope.py")
    assert no_runs_written(tmp_path)


def test_syntax_error_names_file_and_line(tmp_path):
    write_model(tmp_path, """
        import torch
        def get_model(:
            pass
    """)
    proc = run_cli("profile", "model.py", *PEAKS, cwd=tmp_path)
    assert_clean_error(proc, "syntax error", "model.py", "line 2")
    assert no_runs_written(tmp_path)


def test_no_accepted_shape_names_what_was_looked_for(tmp_path):
    write_model(tmp_path, """
        import torch
        def build():
            return torch.nn.Linear(2, 2)
    """)
    proc = run_cli("profile", "model.py", *PEAKS, cwd=tmp_path)
    assert_clean_error(proc, "get_model()", "get_inputs()", "class Model", "--entry")


def test_get_inputs_returning_neither_a_list_nor_a_dict(tmp_path):
    write_model(tmp_path, """
        import torch
        def get_model():
            return torch.nn.Linear(4, 4)
        def get_inputs():
            return 3
    """)
    proc = run_cli("profile", "model.py", *PEAKS, cwd=tmp_path)
    assert_clean_error(proc, "get_inputs()", "list/tuple", "dict", "got int")


def test_exception_in_forward_shows_message_and_line(tmp_path):
    path = write_model(tmp_path, """
        import torch

        class Broken(torch.nn.Module):
            def forward(self, x):
                y = x * 2
                raise ValueError("shapes are wrong in my block")

        def get_model():
            return Broken()

        def get_inputs():
            return [torch.randn(2, 4)]
    """)
    proc = run_cli("profile", str(path), *PEAKS, cwd=tmp_path)
    assert_clean_error(proc, "shapes are wrong in my block", "ValueError", "model.py:6")


def test_cuda_without_gpu(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    proc = run_cli("profile", "--device", "cuda", str(Path(__file__).parent.parent / "examples" / "mlp.py"),
                   *PEAKS, cwd=tmp_path)
    assert_clean_error(proc, "--device cuda", "no CUDA GPU")


def test_existing_non_empty_out_is_never_overwritten(tmp_path):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    proc = run_cli("profile", str(Path(__file__).parent.parent / "examples" / "mlp.py"), "--out", str(out), *PEAKS,
                   cwd=tmp_path)
    assert_clean_error(proc, "--out", "not empty")
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_bad_option_is_a_usage_error(tmp_path):
    proc = run_cli("profile", "x.py", "--mode", "sideways", cwd=tmp_path)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr


def test_debug_shows_the_traceback(tmp_path):
    proc = run_cli("profile", "nope.py", "--debug", *PEAKS, cwd=tmp_path)
    assert proc.returncode == 2
    assert "Traceback" in proc.stderr


@pytest.mark.parametrize("command", ["swap"])
def test_later_commands_say_not_available(tmp_path, command):
    proc = run_cli(command, "whatever", cwd=tmp_path)
    assert_clean_error(proc, "not available yet")


def test_help_lists_every_command(tmp_path):
    proc = run_cli("--help", cwd=tmp_path)
    assert proc.returncode == 0
    for command in ("profile", "analyze", "report", "calibrate", "swap", "kernels", "compare"):
        assert command in proc.stdout


# --- analyze: bad traces ---------------------------------------------------------------------

def _bad_trace_cases(tmp: Path) -> dict[str, tuple[Path, str]]:
    not_json = tmp / "not_json.json"
    not_json.write_text("this is not JSON")
    raw = gzip.decompress((TRACES / "h100_bert-small_bf16.json.gz").read_bytes())
    truncated = tmp / "truncated.json.gz"
    truncated.write_bytes(gzip.compress(raw)[:5000])
    no_events = tmp / "no_events.json"
    no_events.write_text(json.dumps({"schemaVersion": 1, "deviceProperties": []}))
    no_ops = tmp / "no_ops.json"
    doc = json.loads(raw)
    # neither CPU ops nor GPU kernels (a GPU-only trace is analyzed: tests/test_gpu_only.py)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") not in ("cpu_op", "kernel", "gpu_memcpy",
                                                                             "gpu_memset")]
    no_ops.write_text(json.dumps(doc))
    empty = tmp / "empty.json"
    empty.write_text("")
    return {
        "not-json": (not_json, "not a readable trace"),
        "truncated-gzip": (truncated, "damaged gzip"),
        "no-traceEvents": (no_events, "traceEvents"),
        "no-ops": (no_ops, "no operator"),
        "empty": (empty, "empty"),
        "missing": (tmp / "missing.json", "no such trace file"),
    }


@pytest.mark.parametrize("case", ["not-json", "truncated-gzip", "no-traceEvents", "no-ops", "empty", "missing"])
def test_bad_traces(tmp_path, case):
    path, needle = _bad_trace_cases(tmp_path)[case]
    proc = run_cli("analyze", str(path), cwd=tmp_path)
    assert_clean_error(proc, needle)
    assert no_runs_written(tmp_path)


def test_report_on_a_missing_run(tmp_path):
    proc = run_cli("report", str(tmp_path / "nothing"), cwd=tmp_path)
    assert_clean_error(proc, "no such run directory")
