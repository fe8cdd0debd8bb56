"""Everything printed is text, never markup: strings from a trace (frame paths, the device name, op
names), from file names and from --out reach the terminal with control characters replaced and rich
markup shown literally."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from conftest import TRACES, run_cli
from opscope.render.text import clean

BERT = TRACES / "h100_bert-small_bf16.json.gz"
LINK = "[link=https://evil.example]modeling_bert.py[/link]"


def test_clean_replaces_control_characters():
    assert clean("a\x1b[2Jb\x07c\x9bd\u202ee") == "a\ufffd[2Jb\ufffdc\ufffdd\ufffde"
    assert clean("x\ny\tz") == "x y z"
    assert clean("x\ny", keep_newlines=True) == "x\ny"
    assert clean(None) == ""


def _hostile_trace(tmp_path: Path, name: str = "t.json") -> Path:
    doc = json.loads(gzip.decompress(BERT.read_bytes()))
    for e in doc["traceEvents"]:
        if e.get("cat") == "python_function" and "modeling_bert.py(364)" in e["name"]:
            e["name"] = e["name"].replace("modeling_bert.py", f"\x1b[2J\x1b]8;;http://x\x07{LINK}[/]")
        if e.get("cat") == "cpu_op" and e["name"] == "aten::addmm":
            e["name"] = "aten::addmm"  # op names must stay ns::op to be rows; shapes carry the rest
    doc["deviceProperties"][0]["name"] = "NVIDIA H100 80GB HBM3 \x1b[31m[bold red]PWNED[/]"
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def test_hostile_trace_strings_print_as_text(tmp_path):
    trace = _hostile_trace(tmp_path)
    proc = run_cli("analyze", str(trace), "--out", str(tmp_path / "run"), "--top", "30", "--peak-bw", "3350",
                   "--peak-flops", "989000")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout + proc.stderr
    assert "\x1b" not in out and "\x07" not in out and "\x9b" not in out
    assert "[bold red]PWNED[/]" in out  # markup shown literally, not applied
    assert "[link=https://evil.example]" in out.replace("\n", "")  # the hostile path as text
    report = run_cli("report", str(tmp_path / "run"), "--top", "30")
    assert report.returncode == 0, report.stderr
    assert "\x1b" not in report.stdout and "[bold red]PWNED[/]" in report.stdout


def test_file_names_and_out_paths_with_markup_or_escapes(tmp_path):
    raw = gzip.decompress(BERT.read_bytes())
    trace = tmp_path / "[bold]x[red]\x1b[2J.json"
    trace.write_bytes(raw)
    out = tmp_path / "run [red]y[/] \x1b]0;title\x07"
    proc = run_cli("analyze", str(trace), "--out", str(out), "--peak-bw", "3350", "--peak-flops", "989000")
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout + proc.stderr
    flat = proc.stdout.replace("\n", "")  # rich wraps long paths
    assert "[red]y[/]" in flat
    missing = run_cli("analyze", str(tmp_path / "[/]\x1b[2Jnope.json"))
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert "\x1b" not in missing.stderr and "[/]" in missing.stderr
