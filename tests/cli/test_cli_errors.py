"""Bad input: one clear line on stderr, exit 2, no traceback, nothing half-written."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from conftest import EXAMPLES, PEAKS, TRACES, assert_clean_error, run_cli, write_model


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


def test_a_model_that_runs_no_operator_is_told_so_without_internal_paths(tmp_path):
    """An identity model records nothing: the error said the temporary memory.json had no operators."""
    path = write_model(tmp_path, """
        import torch

        class Model(torch.nn.Module):
            def forward(self, x):
                return x

        def get_inputs():
            return [torch.randn(4, 4)]
    """)
    proc = run_cli("profile", str(path), "--steps", "1", "--warmup", "0", *PEAKS, cwd=tmp_path)
    line = assert_clean_error(proc, "the model's steps ran no torch operator", "nothing to profile")
    assert "/tmp" not in line and ".json" not in line and "opscope-" not in line
    assert no_runs_written(tmp_path)


def test_cuda_without_gpu(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    proc = run_cli("profile", "--device", "cuda", str(EXAMPLES / "mlp.py"),
                   *PEAKS, cwd=tmp_path)
    assert_clean_error(proc, "--device cuda", "no CUDA GPU")


def test_existing_non_empty_out_is_never_overwritten(tmp_path):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    proc = run_cli("profile", str(EXAMPLES / "mlp.py"), "--out", str(out), *PEAKS,
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


@pytest.mark.parametrize(("args", "message"), [
    (["--kernel", "no_such_kernel"], "no bundled kernel named 'no_such_kernel'"),
    (["--kernel", "k.py:fn"], "say what it replaces with --op"),
    (["--kernel", "k.py:fn", "--op", "add"], "expected an aten op"),
    (["--kernel", "k.py:fn", "--op", "aten::add", "--module", "M"], "give --op or --module, not both"),
    (["--kernel", "rms_norm", "--op", "aten::add"], "bundled kernels know what they replace"),
    (["--kernel", "missing.py:fn", "--op", "aten::add"], "no such file"),
    (["--op", "aten::add"], "give it with --kernel FILE.py:FUNC"),
])
def test_swap_bad_requests_are_one_line(tmp_path, args, message):
    """Checked before any child starts: one line, exit 2, nothing written."""
    write_model(tmp_path, "def get_model(): pass\ndef get_inputs(): pass\n")
    (tmp_path / "k.py").write_text("def fn(a, b, alpha=1):\n    return a\n")
    proc = run_cli("swap", "model.py", *args, cwd=tmp_path)
    assert_clean_error(proc, message)
    assert not (tmp_path / "reports").exists()


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
    # neither CPU ops nor GPU kernels (a GPU-only trace is analyzed: tests/analysis/test_gpu_only.py)
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


@pytest.mark.parametrize("args", [["--peak-bw", "1e308"], ["--peak-bw", "5e-324"], ["--peak-flops", "1e308"],
                                  ["--peak-flops", "bfloat16=1e-300"]])
def test_absurd_ceilings_are_refused_in_one_line(tmp_path, args):
    """issue 23, item 3: a ceiling beyond any device made inf columns and an HTML report that could not be
    written; it is refused before anything runs."""
    trace = TRACES / "h100_bert-small_bf16.json.gz"
    assert_clean_error(run_cli("analyze", str(trace), "--out", str(tmp_path / "run"), *args), args[0])
    assert not (tmp_path / "run").exists()


LONG = "x" * 300  # one path component over the 255 bytes file systems allow
SMALL_TRACE = TRACES.parent / "cpu_traces" / "avx2_channels_last_after_train.json.gz"


@pytest.mark.parametrize("args", [
    ["analyze", f"{LONG}.json.gz"], ["analyze", f"{LONG}/t.json.gz"], ["analyze", str(SMALL_TRACE), "--out", LONG],
    ["analyze", str(SMALL_TRACE), "--out", f"{LONG}/run"], ["analyze", str(SMALL_TRACE), "--capture", LONG],
    ["report", LONG], ["report", str(SMALL_TRACE), "--html", "-o", f"{LONG}.html"], ["compare", LONG, "run"],
    ["profile", f"{LONG}.py"], ["profile", "model.py", "--out", LONG],
    ["swap", "model.py", "--kernel", f"{LONG}.py:f", "--op", "aten::add"],
])
def test_a_path_the_os_refuses_is_one_line(tmp_path, args):
    """A name over 255 bytes (ENAMETOOLONG) was a traceback from the first stat, open or mkdir of it."""
    write_model(tmp_path, "import torch\n")
    proc = run_cli(*args, *PEAKS if args[0] in ("profile", "swap") else [], cwd=tmp_path)
    assert_clean_error(proc, "bytes long, over the 255 bytes file systems allow")
    assert no_runs_written(tmp_path)


def test_an_out_folder_thousands_of_folders_deep(tmp_path):
    """--out 1,500 (or 2,000) folders deep ended in a RecursionError: pathlib's mkdir recurses once per
    folder."""
    out = Path(*["a"] * 1500)
    proc = run_cli("analyze", str(SMALL_TRACE), "--out", str(out), "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = tmp_path / out
    assert (run / "ops.csv").is_file()
    shutil.rmtree(run)  # then the folders one by one: shutil.rmtree (pytest's cleanup too) recurses per folder
    for folder in run.parents:
        if folder == tmp_path:
            break
        folder.rmdir()
    deeper = run_cli("analyze", str(SMALL_TRACE), "--out", str(Path(*["a"] * 2100)), cwd=tmp_path)
    assert_clean_error(deeper, "made absolute, over the 4,095 bytes the OS allows")


def test_a_huge_exception_message_from_the_model_is_one_bounded_line(tmp_path):
    """A model raising a 20 MB message was printed whole (issue 23, item 1); it is now cut in the child,
    before it travels to the parent, and again where it is printed."""
    path = write_model(tmp_path, """
        import torch

        class Model(torch.nn.Module):
            def forward(self, x):
                raise ValueError("too big " + "z" * 20_000_000)

        def get_inputs():
            return [torch.randn(2, 2)]
    """)
    proc = run_cli("profile", str(path), *PEAKS, cwd=tmp_path)
    line = assert_clean_error(proc, "ValueError: too big zzz", "characters]")
    assert len(line) < 3000
