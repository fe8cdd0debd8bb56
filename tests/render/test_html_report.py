"""`opscope report --html`: one self-contained file (plotly.js embedded, nothing fetched), one roofline
point per op row with FLOPs and bytes, hostile names from a trace shown as text (in the page, in plot
labels and in the embedded JSON), optional sections when the run has them; and the console report."""

from __future__ import annotations

import base64
import csv
import hashlib
import html
import io
import json
import os
import re
import shutil
import stat
from pathlib import Path

import pytest
from rich.console import Console

from conftest import EXAMPLES, PEAKS, TRACES, assert_clean_error, run_cli
from opscope.analysis.trace_file import analyze_trace_file
from opscope.errors import OpscopeError
from opscope.render.console_report import render_report
from opscope.render.html import PAGE_ROWS, plotly_js, render_html, script_json
from opscope.render.report_data import op_shapes, verdict_line
from opscope.run.compare import compare_runs
from opscope.run.read import read_run
from report_helpers import (
    BERT,
    HOSTILE_DEVICE,
    HOSTILE_KERNEL,
    HOSTILE_MODULE,
    HOSTILE_PATH,
    big_run,
    hostile_run,
    plotted_rows,
)

SCRIPT = re.compile(r"<script([^>]*)>(.*?)</script>", re.S)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("html")
    analyze_trace_file(BERT, out=folder / "bert")
    analyze_trace_file(TRACES / "h100_vit-image-classifier_bf16.json.gz", out=folder / "vit")
    hostile_run(folder)
    proc = run_cli("profile", str(EXAMPLES / "mlp.py"), "--steps", "2", "--warmup", "1", "--out",
                   str(folder / "cpu"), *PEAKS, cwd=folder)
    assert proc.returncode == 0, proc.stderr
    return {name: folder / name for name in ("bert", "vit", "hostile", "cpu")}


def scripts(doc: str) -> list[tuple[str, str]]:
    """(attributes, content) of every <script> element."""
    return SCRIPT.findall(doc)


def embedded(doc: str) -> dict:
    attrs, content = next(s for s in scripts(doc) if 'id="opscope-data"' in s[0])
    return json.loads(content)


def assert_self_contained(doc: str) -> None:
    parts = scripts(doc)
    code = [content for attrs, content in parts if "application/json" not in attrs]
    assert len(parts) == 3 and len(code) == 2  # data, the report's own script, plotly.js
    assert code[1] == plotly_js()  # the installed plotly.js bundle, byte for byte
    from plotly.offline import get_plotlyjs

    assert plotly_js() == get_plotlyjs()  # read from its file: what plotly itself gives
    ours = SCRIPT.sub("", doc) + code[0]  # everything but plotly.js (and the JSON: checked as data)
    for needle in ('src="http', "src='http", 'href="http', "fetch(", "XMLHttpRequest", "@import", "url(", "import("):
        assert needle not in ours, needle
    # plotly.js itself contains map-tile code that could fetch: the page's CSP forbids any request,
    # and allows exactly the two inline scripts above by their hashes.
    csp = html.unescape(re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', doc).group(1))
    assert "default-src 'none'" in csp and "connect-src 'none'" in csp and "'unsafe-inline'" not in csp.split(
        "script-src")[1].split(";")[0]
    for content in code:
        digest = base64.b64encode(hashlib.sha256(content.encode()).digest()).decode()
        assert f"'sha256-{digest}'" in csp


@pytest.mark.parametrize("name", ["cpu", "bert", "vit"])
def test_report_is_self_contained_with_one_point_per_row(runs, name):
    run = read_run(runs[name])
    doc = render_html(run)
    assert_self_contained(doc)
    data = embedded(doc)
    traces = [t for t in data["roofline"]["data"] if "customdata" in t]
    indices = [i for t in traces for i in t["customdata"]]
    expected = plotted_rows(runs[name])
    assert expected and sorted(indices) == sorted(expected)  # one point per such row, each once
    rows = run.to_pandas().to_dict("records")
    for t in traces:
        for i, x, y in zip(t["customdata"], t["x"], t["y"], strict=True):
            assert x == pytest.approx(rows[i]["arithmetic_intensity"])
            assert y == pytest.approx(rows[i]["achieved_gflops"] * 1e9)
            assert t["name"] == rows[i]["bound"]
    assert len(data["rows"]) == len(run.to_pandas()) and data["page_rows"] == PAGE_ROWS
    assert html.escape(verdict_line(run)) in doc
    assert doc.count('class="finding ') == len(run.findings)


def test_ceilings_are_drawn_per_dtype(runs):
    run = read_run(runs["vit"])
    lines = [t for t in embedded(render_html(run))["roofline"]["data"] if t.get("mode", "").startswith("lines")]
    flops = run.meta["peaks"]["flops_gflops"]
    dtypes = [t for t in lines if t["uid"].startswith("ceiling-") and t["uid"] != "ceiling-memory"]
    assert sorted(t["y"][-1] for t in dtypes) == sorted(v * 1e9 for v in flops.values())
    bw = run.meta["peaks"]["memory_bandwidth_gbps"] * 1e9
    memory = next(t for t in lines if t["uid"] == "ceiling-memory")
    assert memory["y"][0] == pytest.approx(memory["x"][0] * bw)  # the slope is the bandwidth
    visible = {t["name"].split()[0] for t in dtypes if t["visible"] is True}
    used = {run.to_pandas()["ceiling"][i] for i in plotted_rows(runs["vit"])}
    assert visible == used == {"bfloat16", "float32"}  # the ceilings the plotted rows use; the rest start hidden


def test_cli_writes_the_report(runs, tmp_path):
    run_dir = tmp_path / "cpu"
    shutil.copytree(runs["cpu"], run_dir)
    proc = run_cli("report", str(run_dir), "--html")
    assert proc.returncode == 0, proc.stderr
    assert (run_dir / "report.html").stat().st_size > 1_000_000 and "report.html" in proc.stdout
    out = tmp_path / "elsewhere.html"
    assert run_cli("report", str(run_dir), "--html", "-o", str(out)).returncode == 0
    assert_self_contained(out.read_text())
    proc = run_cli("report", str(run_dir), "--html", "-o", str(tmp_path))
    assert proc.returncode == 2 and "is a directory" in proc.stderr
    proc = run_cli("report", str(run_dir), "-o", str(out))
    assert proc.returncode == 2 and "--html" in proc.stderr


@pytest.mark.parametrize("kind", ["text file", "model file", "run's ops.csv", "run's meta.json", "symlink",
                                  "fifo", "afile/x.html", "name too long", "without --html"])
def test_report_never_overwrites_what_the_user_has(runs, tmp_path, kind):
    """issue 23, items 6 and 7: -o never replaces an existing file without --force, never replaces a
    non-regular file or a run's own file even with it, and an impossible path is one line."""
    run_dir = tmp_path / "run"
    shutil.copytree(runs["cpu"], run_dir)
    user_file = tmp_path / "notes.txt"
    user_file.write_text("mine")
    model = tmp_path / "model.py"
    model.write_text("import torch\n")
    targets = {"text file": user_file, "model file": model, "run's ops.csv": run_dir / "ops.csv",
               "run's meta.json": run_dir / "meta.json", "symlink": tmp_path / "link.html",
               "fifo": tmp_path / "fifo.html", "afile/x.html": user_file / "x.html",
               "name too long": tmp_path / ("x" * 300 + ".html"), "without --html": user_file}
    target = targets[kind]
    if kind == "symlink":
        target.symlink_to(user_file)
    if kind == "fifo":
        os.mkfifo(target)
    before = {p: p.read_bytes() for p in (user_file, model, run_dir / "ops.csv", run_dir / "meta.json")}
    html_args = [] if kind == "without --html" else ["--html"]
    for force in ([], ["--force"]):
        proc = run_cli("report", str(run_dir), *html_args, "-o", str(target), *force, timeout=60)
        if kind in ("text file", "model file") and force:
            assert proc.returncode == 0, proc.stderr  # --force replaces a regular file the user names
            assert_self_contained(target.read_text())
            target.write_text("mine" if kind == "text file" else "import torch\n")
            continue
        assert_clean_error(proc)
    assert {p: p.read_bytes() for p in before} == before  # nothing the user had changed
    if kind == "symlink":
        assert target.is_symlink()
    if kind == "fifo":
        assert stat.S_ISFIFO(os.lstat(target).st_mode)
    assert not [p for p in tmp_path.rglob(".*.tmp")]  # no temporary file left


def test_the_runs_own_report_is_rewritten_and_force_needs_o(runs, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(runs["cpu"], run_dir)
    for _ in range(2):  # the default RUN/report.html is opscope's own: rewritten by each call
        assert run_cli("report", str(run_dir), "--html").returncode == 0
    assert_clean_error(run_cli("report", str(run_dir), "--html", "--force"), "--force")
    other = tmp_path / "r.html"
    assert run_cli("report", str(run_dir), "--html", "-o", str(other)).returncode == 0
    assert_clean_error(run_cli("report", str(run_dir), "--html", "-o", str(other)), "exists", "--force")


def test_hostile_names_are_text(runs):
    run = read_run(runs["hostile"])
    doc = render_html(run)
    assert_self_contained(doc)
    # Markup from the trace never reaches the page as markup (plotly.js itself, checked above, aside).
    page = doc.replace(plotly_js(), "")
    assert "<img" not in page and "<svg" not in page and "<b " not in page
    assert page.count("</script") == 3 and page.count("<script") == 3 and "<!--" not in page
    assert html.escape(HOSTILE_PATH) in doc and html.escape(HOSTILE_DEVICE) in doc
    # The embedded JSON has no <, >, & or U+2028 and gives the names back exactly.
    raw = next(c for a, c in scripts(doc) if 'id="opscope-data"' in a)
    assert not set(raw) & {"<", ">", "&", "\u2028", "\u2029"}
    assert "\\u003c/script\\u003e" in raw
    data = json.loads(raw)
    details = [r["d"] for r in data["rows"]]
    assert any(d["source_location"] == f"{HOSTILE_PATH}:364" for d in details)
    assert any(k.endswith(HOSTILE_KERNEL) for d in details for k in d["kernels"])
    assert details[0]["module"] == HOSTILE_MODULE
    # Plot labels are HTML-escaped, as plotly renders a subset of HTML in them.
    hover = " ".join(h for t in data["roofline"]["data"] for h in t.get("hovertext", []))
    assert html.escape(HOSTILE_PATH) in hover and HOSTILE_PATH not in hover
    labels = " ".join(data["modules"]["data"][0]["labels"] + data["modules"]["data"][0]["hovertext"])
    assert "&lt;/script&gt;" in labels and "</script" not in labels
    # The optional sections show the hostile text as text too.
    for section in ('id="swap"', 'id="memory"', 'id="module-plot"'):
        assert section in doc
    assert html.escape(HOSTILE_KERNEL) in doc.split('id="swap"')[1]


def test_script_json_escapes():
    text = script_json({"k": "</script><!-- & \u2028\u2029 \ud800"})
    assert not set(text) & {"<", ">", "&", "\u2028", "\u2029"}
    assert json.loads(text) == {"k": "</script><!-- & \u2028\u2029 \ud800"}


def test_sections_follow_the_run(runs):
    run = read_run(runs["bert"])
    doc = render_html(run)  # the trace was recorded with_modules and profile_memory
    assert 'id="module-plot"' in doc and 'id="memory"' in doc and "during addmm at" in doc
    run.modules = None
    run.ops = {k: v for k, v in run.ops.items() if k not in ("module", "module_class")}
    del run.summary["memory"]
    plain = render_html(run)
    for absent in ('id="swap"', 'id="memory"', 'id="module-plot"', 'id="comparison"'):
        assert absent not in plain
    assert 'id="kernels"' in plain and "This run has no module paths" in plain
    hostile = render_html(read_run(runs["hostile"]))
    assert "median 4.40 ms" in hostile and "CV 4.0%" in hostile and "noise: quiet" in hostile
    assert "3 MiB" in hostile  # peak memory, formatted
    assert 'id="kernels"' not in render_html(read_run(runs["cpu"]))  # CPU runs launch no kernels


def test_baseline_adds_the_comparison(runs, tmp_path):
    out = tmp_path / "r.html"
    proc = run_cli("report", str(runs["vit"]), "--html", "-o", str(out), "--baseline", str(runs["bert"]))
    assert proc.returncode == 0, proc.stderr
    doc = out.read_text()
    assert 'id="comparison"' in doc and 'id="compare-table"' in doc and "Findings fixed" in doc
    c = compare_runs(read_run(runs["bert"]), read_run(runs["vit"]))
    assert f"{c.step_ratio:.2f}x" in doc


def test_large_run_stays_small(runs, tmp_path):
    """~2,000 op rows: under 10 MB, one point per plotted row."""
    big = big_run(runs["vit"], tmp_path / "big")
    assert len(read_run(big).to_pandas()) >= 2000
    doc = render_html(read_run(big))
    assert len(doc.encode()) < 10_000_000
    data = embedded(doc)
    assert sum(len(t["customdata"]) for t in data["roofline"]["data"] if "customdata" in t) == len(plotted_rows(big))


# --- the console report -----------------------------------------------------------------------


def console_text(run_dir: Path, width: int = 140, baseline: Path | None = None) -> str:
    out = io.StringIO()
    run = read_run(run_dir)
    comparison = compare_runs(read_run(baseline), run) if baseline else None
    render_report(run, Console(file=out, width=width, color_system=None), comparison=comparison)
    return out.getvalue()


def test_console_report_has_the_same_content(runs):
    text = console_text(runs["bert"])
    run = read_run(runs["bert"])
    flat = " ".join(text.split())
    assert " ".join(verdict_line(run).split()) in flat
    for needle in ("Time by bound class", "Time by op family", "Kernels of the top", "cutlass", "→ Take the CPU",
                   "GPU idle gaps", "before linear"):
        assert needle in text, needle
    hostile = console_text(runs["hostile"])
    for needle in ("Time by module", "layer.1.attn", "Memory", "peak allocated", "3 MiB", "Swap results",
                   "noise: quiet", HOSTILE_PATH):
        assert needle in hostile.replace("\n", ""), needle
    assert "\x1b" not in hostile
    assert "Comparison with the baseline" in console_text(runs["vit"], baseline=runs["bert"])


def test_report_cli_prints_the_full_report(runs):
    proc = run_cli("report", str(runs["bert"]), "--top", "5")
    assert proc.returncode == 0, proc.stderr
    assert "verdict" in proc.stdout and "Time by op family" in proc.stdout
    proc = run_cli("report", str(runs["vit"]), "--baseline", str(runs["bert"]), "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["comparison"]["step_ratio"] > 1


_JUNK = [None, "x", -1, 1e308, [], {}, True, "NaN", {"verdict": 3}, [1, {"a": None}]]
CHECKED_KEYS = ("noise", "memory", "step_time_cv", "step_time_us_p50")  # typed by opscope.run.schema


def test_unexpected_optional_keys_never_break_rendering(runs, tmp_path):
    """Keys the run-directory format may gain (noise, memory, step-time spread) and the optional files,
    holding any JSON value: both reports render."""
    for k, value in enumerate(_JUNK):
        run_dir = tmp_path / f"r{k}"
        shutil.copytree(runs["hostile"], run_dir)
        summary = json.loads((run_dir / "summary.json").read_text())
        for key in ("noise", "memory", "step_time_cv", "step_time_us_p50", "peak_memory_bytes"):
            summary[key] = value
        (run_dir / "summary.json").write_text(json.dumps(summary))
        (run_dir / "swap.json").write_text(json.dumps(value))
        (run_dir / "modules.csv").write_text("module,time_us_total\nx,abc\n" if k % 2 else "garbage\x00\n")
        try:
            run = read_run(run_dir)
        except OpscopeError as exc:
            # keys the format types (noise, the step-time spread) are checked on reading: a wrong type is one
            # "damaged" line; the keys it leaves free still get the value
            assert "summary.json is damaged" in str(exc) and any(k in str(exc) for k in CHECKED_KEYS), exc
            for key in CHECKED_KEYS:
                summary.pop(key)
            (run_dir / "summary.json").write_text(json.dumps(summary))
            run = read_run(run_dir)
        render_html(run)
        render_report(run, Console(file=io.StringIO(), width=100))


@pytest.mark.parametrize("value", ["inf", "-inf", "nan"])
def test_a_non_finite_number_in_a_run_is_written_as_null(runs, tmp_path, value):
    """issue 23, item 3: an edited run (or an absurd trace value) with inf in ops.csv still gives a report."""
    run_dir = tmp_path / "run"
    shutil.copytree(runs["cpu"], run_dir)
    lines = (run_dir / "ops.csv").read_text().splitlines()
    header = lines[0].split(",")
    cells = next(csv.reader([lines[1]]))
    cells[header.index("achieved_gbps")] = value
    buf = io.StringIO()
    csv.writer(buf, lineterminator="").writerow(cells)
    (run_dir / "ops.csv").write_text("\n".join([lines[0], buf.getvalue(), *lines[2:]]) + "\n")
    proc = run_cli("report", str(run_dir), "--html", "-o", str(tmp_path / "r.html"))
    assert proc.returncode == 0, proc.stderr


def test_input_dims_of_any_depth_or_shape_render(runs, tmp_path):
    """issue 23, item 9d: an edited ops.csv whose input_dims cell is 100,000 '[' deep raised RecursionError
    in report --html; a cell that is JSON but not a list of shapes raised too. Shapes are parsed only
    from text nested a few levels at most; anything else shows no shapes."""
    run_dir = tmp_path / "run"
    shutil.copytree(runs["bert"], run_dir)
    with (run_dir / "ops.csv").open(newline="") as f:
        rows = list(csv.reader(f))
    col = rows[0].index("input_dims")
    odd = ["[" * 100_000, "[" * 60_000 + "]" * 60_000, '[{"a": 1}]', "5", '"text"', '[["x"], 7, null]', "{}"]
    for k, cell in enumerate(odd, start=1):
        rows[k][col] = cell
    with (run_dir / "ops.csv").open("w", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows(rows)
    for args in (["--html", "-o", str(tmp_path / "r.html")], []):
        proc = run_cli("report", str(run_dir), *args)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert op_shapes({"input_dims": "[[4, 5], [[1, 2]], [], 3]"}) == ["[4,5]"]
    assert [op_shapes({"input_dims": cell}) for cell in odd] == [[]] * len(odd)


def test_a_percent_of_peak_above_100_is_marked_and_explained_in_html(runs, tmp_path):
    """issue 23, item 24: the HTML table printed 102% of peak with no word about it."""
    run_dir = tmp_path / "run"
    shutil.copytree(runs["cpu"], run_dir)
    lines = (run_dir / "ops.csv").read_text().splitlines()
    header = lines[0].split(",")
    cells = next(csv.reader([lines[1]]))
    cells[header.index("bound")] = "memory"
    cells[header.index("pct_peak_bandwidth")] = "102.0"
    buf = io.StringIO()
    csv.writer(buf, lineterminator="").writerow(cells)
    (run_dir / "ops.csv").write_text("\n".join([lines[0], buf.getvalue(), *lines[2:]]) + "\n")
    doc = render_html(read_run(run_dir))
    assert "above peak" in doc and "faster than the memory-bandwidth ceiling" in doc
    assert re.search(r"102(\.0)?%\*", doc)


def test_an_edited_timeline_still_renders(tmp_path):
    """timeline.json edited within its format (lists of other lengths, indices out of range, an empty step,
    a critical path on no lane of it) renders what it can; the report's timeline is there."""
    run_dir = tmp_path / "run"
    analyze_trace_file(TRACES / "h100_bert-small_bf16.json.gz", out=run_dir)
    doc = json.loads((run_dir / "timeline.json").read_text())
    lane = doc["lanes"][0]
    lane["ts"] = lane["ts"][:-3]
    lane["name"][0], lane["row"][1], lane["finding"][2] = 10**6, 10**6, 10**6
    doc["steps"].append([])
    doc["memory"]["bytes"] = doc["memory"]["bytes"][:5]
    (run_dir / "timeline.json").write_text(json.dumps(doc))
    # whatif.json is checked against its schema on reading: a critical path within the format, on no lane of
    # this timeline
    (run_dir / "whatif.json").write_text(json.dumps({"critical_path": [{"lane": "gpu:9:9", "ts": 1, "dur": 2,
                                                                        "name": "elsewhere"}]}))
    page = render_html(read_run(run_dir))
    assert '<section id="timeline">' in page and "whatif.json has none on these lanes" in page


def test_header_says_what_fixing_the_findings_gives(tmp_path):
    """The report's header has the console's "fix these N → step X → Y" line, from summary.json whatif."""
    from opscope.render.console import whatif_line
    from opscope.run.read import read_run

    run_dir = tmp_path / "run"
    analyze_trace_file(TRACES / "h100_bert-small_bf16.json.gz", out=run_dir)
    run = read_run(run_dir)
    w = run.summary["whatif"]
    assert w["fixes"] > 0 and w["predicted_step_time_us"] < w["recorded_step_time_us"]
    line = whatif_line(run.summary)
    assert line is not None and line.startswith(f"fix these {w['fixes']} findings → step ")
    assert f'<span id="whatif">{html.escape(line)}</span>' in render_html(run)


def test_the_gpu_idle_gaps_are_a_section_with_what_the_cpu_ran(runs, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(runs["bert"], run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    gaps = summary["idle_gaps"]
    gaps[1]["cpu_next_op"] = "aten::linear<script>alert(1)</script>"  # names reach the page as text
    (run_dir / "summary.json").write_text(json.dumps(summary))
    page = render_html(read_run(run_dir))
    section = page[page.index('<section id="gaps">'):]
    section = section[:section.index("</section>")]
    assert '<a href="#gaps">GPU idle gaps</a>' in page
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in re.findall(r"<tr>(<td.*?)</tr>", section)]
    assert len(cells) == len(gaps) == 5
    first = cells[0]
    assert first[:2] == ["458.5 µs", "+0.0 µs"]  # the step starts with the GPU idle, the CPU in Python
    assert first[2:4] == ["before slice", gaps[0]["cpu_next_source_location"]]
    assert cells[1][2] == "before linear&lt;script&gt;alert(1)&lt;/script&gt;" and "<script>alert" not in section
    # kernels by their short names, whole on hover
    titles = re.findall(r'<td class="mono kern" title="([^"]*)">', section)
    assert html.unescape(titles[3]) == gaps[1]["kernel_after"] and len(cells[1][5]) < len(titles[3])
    no_gaps = render_html(read_run(runs["cpu"]))
    assert '<section id="gaps">' not in no_gaps and 'href="#gaps"' not in no_gaps


def test_swap_tables_are_whole_where_they_fit(runs):
    """A wide terminal shows a swap's row on one line; a narrow one wraps the timings at their space
    (the label never)."""
    from opscope.render.console_report import swap_group
    from opscope.render.text import cleaned_run

    run = cleaned_run(read_run(runs["hostile"]))

    def lines(width: int) -> list[str]:
        out = io.StringIO()
        Console(file=out, width=width, color_system=None).print(swap_group(run, width))
        text = out.getvalue().splitlines()
        start = next(i for i, ln in enumerate(text) if ln.startswith("Swap results"))
        rule = next(i for i in range(start, len(text)) if set(text[i].strip()) == {"─"})
        end = next(i for i in range(rule, len(text)) if not text[i].strip())
        return text[rule + 1:end]

    wide = lines(400)
    assert len(wide) == 2 and " passed " in wide[0] and " failed " in wide[1]  # two swaps, a line each
    narrow = lines(100)
    assert len(narrow) > 2 and all(len(ln) <= 100 for ln in narrow)
