"""Output a person can act on: findings printed in full, a source line for every finding whose ops have
one, profile's exact lines and modules surviving `opscope analyze RUN/trace.json.gz`, the step defined
out loud when a trace has no step annotations, input errors before torch is imported, one formatter for
rates, every --peak-flops dtype in the help, and time per call in the table."""

from __future__ import annotations

import gzip
import io
import json
import os
import re
from dataclasses import replace

import pytest
from rich.console import Console

from conftest import PEAKS, TRACES, line_of, run_cli, write_model
from opscope.analysis.trace_file import analyze_trace_file
from opscope.capture.torch_profiler import profile_target
from opscope.machine.peaks import _DTYPE_ALIASES, DTYPE_KEYS, parse_peak_flops
from opscope.render.console import render_run
from opscope.run.read import read_run
from opscope.target.specs import ProfileOptions
from opscope.units import UNKNOWN, gbps, si
from opscope.units import time_cell as fmt_us

FAST = dict(steps=2, warmup=1, peak_bw=20.0, peak_flops=["100"], threads=1)
EXPONENT = re.compile(r"\d[eE][+-]?\d")

SDPA_TRAIN = """
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(32, 96)

        def forward(self, x, mask):
            q, k, v = self.qkv(x).view(2, 16, 3, 4, 8).permute(2, 0, 3, 1, 4)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.1)  # the attention
            return out.sum(dim=1)

    def get_inputs():
        return [torch.randn(2, 16, 32), torch.zeros(16, 16)]
"""


def console_text(run, width: int) -> str:
    out = io.StringIO()
    render_run(run, Console(file=out, width=width, color_system=None))
    return out.getvalue()


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    return analyze_trace_file(TRACES / "h100_bert-small_bf16.json.gz", out=tmp_path_factory.mktemp("bert") / "run")


@pytest.mark.parametrize("width", [80, 120])
def test_findings_print_in_full(bert, width):
    text = console_text(bert, width)
    assert max(len(line) for line in text.splitlines()) <= width
    shown = flat(text)
    for f in bert.findings[:5]:
        assert flat(f["message"]) in shown, f["rule"]
        assert flat(f["suggestion"]) in shown, f["rule"]  # the whole suggestion, not its first sentence


@pytest.fixture(scope="module")
def sdpa_train(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sdpa")
    path = write_model(folder, SDPA_TRAIN)
    run, _ = profile_target(ProfileOptions(target=path, out=folder / "run", mode="train", **FAST))
    return path, run


def test_ops_inside_sdpas_math_path_get_its_line(sdpa_train):
    """In train mode SDPA with a mask runs its math path, whose in-place mask add_ the dispatch pass never
    sees (it sees an out-of-place add): the add_ takes the line of the op it ran in."""
    path, run = sdpa_train
    where = f"{path.name}:{line_of(path, '# the attention')}"
    ev = run.to_pandas("events")
    adds = ev[(ev["name"] == "aten::add_") & (ev["source_location"] != "opscope:harness")]
    assert len(adds) and all(loc.endswith(where) for loc in adds["source_location"]), adds["source_location"].tolist()
    user = run.to_pandas()[run.to_pandas()["source_location"] != "opscope:harness"]
    assert (user["source_location"] != "").all(), user.loc[user["source_location"] == "", "op"].tolist()
    assert all(f["source_location"] for f in run.findings)


def test_analyze_of_a_profiled_trace_reproduces_the_run(sdpa_train, tmp_path):
    _, run = sdpa_train
    with gzip.open(run.path / "trace.json.gz") as f:
        doc = json.load(f)  # still one JSON object, as trace viewers read it
    assert doc["opscope"]["format_version"] == 1 and any(e.get("cat") == "cpu_op" for e in doc["traceEvents"])
    proc = run_cli("analyze", str(run.path / "trace.json.gz"), "--out", str(tmp_path / "again"), *PEAKS)
    assert proc.returncode == 0, proc.stderr
    assert "using the exact source lines, modules and memory it embedded" in proc.stderr
    again = tmp_path / "again"
    assert (again / "ops.csv").read_text() == (run.path / "ops.csv").read_text()
    assert (again / "modules.csv").read_text() == (run.path / "modules.csv").read_text()
    summary = json.loads((again / "summary.json").read_text())
    assert summary["memory"] == json.loads((run.path / "summary.json").read_text())["memory"]


def test_a_damaged_embedded_block_is_ignored_with_a_warning(sdpa_train, tmp_path):
    _, run = sdpa_train
    with gzip.open(run.path / "trace.json.gz") as f:
        doc = json.load(f)
    doc["opscope"]["strings"] = 7
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps(doc))
    proc = run_cli("analyze", str(trace), "--out", str(tmp_path / "run"), *PEAKS)
    assert proc.returncode == 0, proc.stderr
    assert "ignored its 'opscope' block" in proc.stderr
    ops = read_run(tmp_path / "run").to_pandas()
    assert (ops["source_location"].fillna("") == "").all()  # no lines of its own: the trace has no stacks


def test_a_trace_without_step_annotations_says_how_it_defined_the_step(tmp_path):
    doc = json.loads(gzip.decompress((TRACES / "h100_bert-small_bf16.json.gz").read_bytes()))
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep")]
    trace = tmp_path / "nosteps.json"
    trace.write_text(json.dumps(doc))
    proc = run_cli("analyze", str(trace), "--out", str(tmp_path / "run"), "--json")
    assert proc.returncode == 0, proc.stderr
    assert "no ProfilerStep#N annotations" in proc.stderr and "as one step: from its first op" in proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["steps"] == 1 and summary["step_source"] == "whole trace"
    proc = run_cli("analyze", str(TRACES / "h100_bert-small_bf16.json.gz"), "--out", str(tmp_path / "r2"), "--json")
    assert "ProfilerStep#N" not in proc.stderr and json.loads(proc.stdout)["step_source"] == "annotations"


FAKE_TORCH = "raise SystemExit('opscope imported torch')\n"


@pytest.mark.parametrize(("args", "needle"), [
    (["missing.py"], "no such file"),
    (["model.txt"], "not a Python file (.py)"),
    (["trace.json.gz"], "use `opscope analyze`"),
    (["model.py", "--out", "a_file"], "is not a directory"),
    (["model.py", "--peak-flops", "float99=3"], "unknown dtype"),
])
def test_input_errors_are_reported_before_torch_is_imported(tmp_path, monkeypatch, args, needle):
    fake = tmp_path / "fake"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text(FAKE_TORCH)
    monkeypatch.setenv("PYTHONPATH", f"{fake}:{os.environ.get('PYTHONPATH', '')}")
    (tmp_path / "model.txt").write_text("x = 1\n")
    (tmp_path / "trace.json.gz").write_bytes(gzip.compress(b"{}"))
    (tmp_path / "model.py").write_text("x = 1\n")
    (tmp_path / "a_file").write_text("")
    proc = run_cli("profile", *args, cwd=tmp_path)
    assert proc.returncode == 2 and needle in proc.stderr, proc.stderr
    assert "opscope imported torch" not in proc.stderr + proc.stdout


def test_rates_use_one_formatter(bert, tmp_path):
    assert si(1.57e12, "B/s") == gbps(1570) == "1.57 TB/s"
    assert gbps(999.7) == "1 TB/s" and gbps(0.0387) == "38.7 MB/s" and gbps(None) == UNKNOWN
    vit = analyze_trace_file(TRACES / "h100_vit-image-classifier_bf16.json.gz", out=tmp_path / "vit")
    for run in (bert, vit):
        for f in run.findings:
            assert not EXPONENT.search(f["message"] + f["suggestion"]), f["message"]
            assert "? (" not in f["message"] and " ? " not in f["message"]
        text = console_text(run, 200)
        assert not EXPONENT.search(text.replace(str(run.path), "")), text
    ops = bert.to_pandas().copy()
    ops.iloc[0, ops.columns.get_loc("achieved_gflops")] = float("nan")
    text = console_text(replace(bert, ops=ops), 200)
    first = next(line for line in text.splitlines() if line.lstrip().startswith("1 "))
    assert f" {UNKNOWN} " in first  # an unknown rate is "-"


def test_peak_flops_help_lists_every_dtype_the_parser_accepts(tmp_path):
    proc = run_cli("profile", "--help", cwd=tmp_path)
    assert proc.returncode == 0
    help_text = flat(proc.stdout)
    for name, key in _DTYPE_ALIASES.items():
        assert re.search(rf"(?<![\w]){re.escape(name)}(?![\w])", help_text), name
        assert parse_peak_flops([f"{name}=5"]) == {key: 5.0}
    assert set(_DTYPE_ALIASES.values()) == set(DTYPE_KEYS)


def test_the_table_shows_time_per_call(bert):
    text = console_text(bert, 120)
    header = next(line for line in text.splitlines() if line.lstrip().startswith("#"))
    assert header.index(" time ") < header.index(" per call ") < header.index(" share ")
    rows = bert.to_pandas().head(15)
    multi = rows[rows["calls"] > 1]
    body = text.split("Findings")[0]
    for _, row in (multi if len(multi) else rows).iterrows():
        assert fmt_us(row["time_us_total"] / row["calls"]) in body
