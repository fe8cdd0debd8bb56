"""The console renderer on real runs (the shared GPU traces, analyzed without torch): it fits the
terminal, keeps the essential columns on narrow ones, never breaks an op name across lines, and
prints the numbers the run directory holds."""

from __future__ import annotations

import io
import json
import re

import pytest
from rich.console import Console

from conftest import TRACES
from opscope.analysis.pipeline import compile_summary
from opscope.analysis.trace_file import analyze_trace_file
from opscope.render.console import _COLUMNS, ceiling_warnings, measured_notes, render_run
from opscope.render.report_data import fit_op, op_name, op_shapes
from opscope.run.model import Run
from opscope.run.read import read_run
from opscope.trace.torch_trace import read_torch_trace
from opscope.units import time_cell as fmt_us


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Run]:
    folder = tmp_path_factory.mktemp("console")
    return {name: analyze_trace_file(TRACES / f"{name}.json.gz", out=folder / name)
            for name in ("mi300x_bert-small_bf16", "h100_vit-image-classifier_bf16")}


def render(run: Run, width: int) -> str:
    out = io.StringIO()
    render_run(run, Console(file=out, width=width, color_system=None, legacy_windows=False))
    return out.getvalue()


def table_lines(text: str) -> list[str]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Top "))
    end = next(i for i, line in enumerate(lines) if line.startswith("Findings"))
    return lines[start:end]


@pytest.mark.parametrize("name", ["mi300x_bert-small_bf16", "h100_vit-image-classifier_bf16"])
@pytest.mark.parametrize("width", [80, 100, 120, 160, 200])
def test_table_fits_and_keeps_op_names_whole(runs, name, width):
    run = runs[name]
    text = render(run, width)
    assert max(len(line) for line in text.splitlines()) <= width
    header = next(line for line in table_lines(text) if line.lstrip().startswith("#"))
    both = " module " in header and " source " in header
    for column, _, min_width in _COLUMNS:
        if column == "source":  # these traces have module paths: module and source, or one `where` column
            assert both != (" where " in header), header
            continue
        shown = f" {column} " in f" {header} "
        if both and min_width:  # optional columns make room for a row's module and file:line
            assert not shown or width >= min_width, (column, header)
        else:
            assert shown == (width >= min_width), (column, header)
    body = "\n".join(table_lines(text))
    for row in run.to_pandas().head(15).to_dict("records"):
        name_only = op_name(row)
        assert name_only in body, name_only  # on one line: not folded, not cut
        assert fmt_us(row["time_us_total"]) in body


def test_summary_and_findings_are_printed(runs):
    run = runs["mi300x_bert-small_bf16"]
    text = render(run, 120)
    assert "AMD Instinct MI300X" in text and "GPU busy" in text
    assert f"{run.summary['device_busy_share']:.1%}" in text
    top = run.findings[0]
    assert top["rule"] in text and top["source_location"] in text
    assert f"run directory: {run.path}" in text


@pytest.mark.parametrize(("width", "expected"), [
    (100, "addmm [768] [788,768] [768,768]"),
    (31, "addmm [768] [788,768] [768,768]"),
    (30, "addmm [768] [788,768] …"),
    (24, "addmm [768] [788,768] …"),
    (23, "addmm [768] [788,768] …"),
    (22, "addmm [768] …"),
    (13, "addmm [768] …"),
    (12, "addmm"),
])
def test_fit_op_keeps_whole_shapes(width, expected):
    assert fit_op("addmm", ["[768]", "[788,768]", "[768,768]"], width) == expected


def test_op_names_are_abbreviated_for_display():
    assert op_name({"op": "aten::_scaled_dot_product_flash_attention_for_cpu"}) == "sdpa_flash_attn_cpu"
    assert op_name({"op": "aten::_efficient_attention_forward"}) == "_eff_attn_forward"
    assert op_name({"op": "(unattributed kernels)"}) == "(unattributed kernels)"
    # a compiled graph's range (76 characters with its cache key) no longer crowds out the table's columns
    key = "fq2yrsh3e3w44yli2zh3kqcfpqhyunwwaicje7pojrgfdphi3ruw"
    assert op_name({"op": f"## Call CompiledFxGraph {key} ##"}) == "CompiledFxGraph fq2yrsh3"
    assert op_name({"op": "## Call CompiledFxGraph ##"}) == "## Call CompiledFxGraph ##"  # no key: as it is
    assert op_shapes({"input_dims": "[[4, 197, 768], [], [[2, 3], [2, 3]], [768]]"}) == ["[4,197,768]", "[768]"]


@pytest.mark.parametrize("width", [100, 200])
def test_a_run_read_back_prints_as_the_analyzed_one(runs, width):
    """The console right after the analysis renders the run's Tables; `opscope report` renders the same
    run read back from its directory (DataFrames): the same text."""
    run = runs["h100_vit-image-classifier_bf16"]
    assert render(read_run(run.path), width) == render(run, width)


def _measured_run() -> Run:
    ops = {"op": ["aten::mm", "aten::add", "aten::mul"], "calls": [2, 4, 1],
           "pct_peak_flops": [150.0, 40.0, float("nan")], "pct_peak_bandwidth": [90.0, 120.0, 130.0],
           "measured_dram_bytes_per_call": [1.0e6, 2.0e6, float("nan")],
           "measured_bytes_ratio": [1.5, 2.5, float("nan")]}
    return Run(meta={"peaks": {"origin": {"flops": "measured"}}}, ops=ops,
               findings=[], summary={"nsys": {"steps": 3, "step_time_us": 2500.0, "device_busy_share": 0.42}})


def test_ceiling_and_measurement_notes():
    """The notes under the ops table: the row above its FLOP/s
    ceiling (the first at the maximum), how many rows beat the bandwidth ceiling (any over 100%, each marked),
    and Nsight's measured rows with the median measured/modeled DRAM bytes (1.5 and 2.5: 2.00x)."""
    run = _measured_run()
    assert ceiling_warnings(run) == [
        "*aten::mm ran at 150% of its FLOP/s ceiling: the ceilings are too low for this run (measured while the "
        "machine was busy?); rerun `opscope calibrate` on an idle machine",
        "*2 op row(s) moved data faster than the memory-bandwidth ceiling (up to 130%, aten::mul): their data was "
        "most likely in cache"]
    assert measured_notes(run) == [
        "Nsight Compute: 2 op row(s) measured; DRAM bytes measured / modeled: median 2.00x, 1 row(s) over 2x "
        "(ops.csv measured_* columns)",
        "Nsight Systems: 3 step(s) of 2.5 ms, GPU busy 42% of the step (ops.csv nsys_time_us_total, nsys_kernels.csv)"]


@pytest.mark.parametrize("width", [100, 120, 140, 160])
def test_long_module_paths_are_shortened_not_the_source_line(runs, width):
    """At 100-160 columns the table showed one `where` column for BERT's long module paths: the module
    cut from the left (its layer lost, every layer's row alike) and no file:line."""
    lines = table_lines(render(runs["mi300x_bert-small_bf16"], width))
    header = next(line for line in lines if line.lstrip().startswith("#"))
    assert " module " in header and " source " in header, header
    attention = [line for line in lines if "flash_attn" in line or "BertSdpaSelfAttention" in line]
    layers = {m.group(0) for line in attention if (m := re.search(r"BertLayer_\d+", line))}
    assert len(layers) >= 2, attention  # each row says which layer it is
    assert all(re.search(r"modeling_bert\.py:\d+", line) for line in attention), attention


def test_a_percent_of_peak_just_above_100_is_marked_and_explained():
    """101-105% used to print with no word (the notes began above 105%)."""
    from opscope.render.console import _cells

    ops = {"op": ["aten::add"], "calls": [1], "pct_peak_flops": [1.0], "pct_peak_bandwidth": [102.0]}
    run = Run(meta={"peaks": {"origin": {"flops": "measured"}}}, ops=ops, findings=[], summary={})
    assert ceiling_warnings(run) == ["*1 op row(s) moved data faster than the memory-bandwidth ceiling (up to 102%, "
                                     "aten::add): their data was most likely in cache"]
    row = {"bound": "memory", "pct_peak_bandwidth": 102.0, "pct_peak_flops": 1.0, "calls": 1, "time_us_total": 1.0,
           "time_share": 1.0}
    assert _cells(row)["% peak"].endswith("%*")


def test_compile_times_are_one_line_apart_from_step_time(tmp_path):
    # a run whose summary.json has "compile" (a compiled model with its TORCH_TRACE log), read back from disk
    fixtures = TRACES.parent / "compile"
    run = analyze_trace_file(fixtures / "copy.json.gz", out=tmp_path / "run")
    assert "compile " not in render(run, 120)
    entries = compile_summary(read_torch_trace(fixtures / "recompile.torch_trace.log.gz"))
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    summary["compile"] = entries
    (tmp_path / "run" / "summary.json").write_text(json.dumps(summary))
    text = render(read_run(tmp_path / "run"), 120)
    seconds = sum(e["compile_time_s"] for e in entries)
    line = next(ln for ln in text.splitlines() if "compile " in ln)
    assert f"compile 5 graphs, {seconds:.3g} s (not in step time); 3 recompilations, 1 failed" in line
    assert "graph break" not in line  # none in this log


@pytest.mark.parametrize("width", [60, 80, 120])
def test_gap_times_stay_whole_on_narrow_terminals(runs, width):
    """Rich would cut every column of a too-wide table, the idle time first: the gaps table gives the
    names' room instead, and a source cut keeps its line number."""
    gaps = runs["mi300x_bert-small_bf16"].summary["idle_gaps"]
    assert len(gaps) >= 3
    text = render(runs["mi300x_bert-small_bf16"], width)
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("GPU idle gaps"))
    rows = lines[start + 4:start + 4 + len(gaps)]
    for line, gap in zip(rows, gaps, strict=True):
        assert len(line.rstrip()) <= width
        cells = line.split()
        assert " ".join(cells[:2]) == fmt_us(gap["duration_us"])
        assert line.split(fmt_us(gap["duration_us"]), 1)[1].split()[0] == "+" + fmt_us(gap["start_us"]).split()[0]
        if gap["cpu_op"]:
            where = gap["cpu_source_location"]
            assert gap["cpu_op"].removeprefix("aten::")[:6] in line
        else:  # Python ran between ops: the op it started next, at its line
            where = gap["cpu_next_source_location"]
            assert "before " + (gap["cpu_next_op"].removeprefix("aten::")[:3] if width >= 80 else "") in line
        if where and width < 120:
            line_no = where.rsplit(":", 1)[1]
            assert re.search(rf"\S*:{line_no}\b", line), line


@pytest.mark.parametrize("width", [60, 100, 140, 220])
def test_the_module_tree_never_cuts_a_time(runs, width):
    """Rich cut the tree's last column mid-number ("57.6 µs / 58.4 µs / 5"): the spread drops its median,
    then the class column, then module names give room, then the spread goes; a time is whole or absent."""
    from opscope.render.console_report import tree_table

    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(tree_table(runs["mi300x_bert-small_bf16"], width=width))
    lines = out.getvalue().splitlines()
    header = next(ln for ln in lines if ln.lstrip().startswith("module"))
    rows = lines[lines.index(header) + 2:]
    assert all(len(ln.rstrip()) <= width for ln in lines)
    spread = "min / median / max" if "min / median / max" in header else "min – max" if "min – max" in header else None
    assert (spread == "min / median / max") == (width >= 220) and (spread is None) == (width <= 60)
    assert any("×4" in ln or "…" in ln for ln in rows)  # the folded layers, whole or cut with a mark
    if spread:
        for ln in rows:
            cell = ln[header.index(spread.split()[0]):].strip()
            assert not cell or re.fullmatch(r"[\d.]+ (µs|ms|s)( [/–] [\d.]+ (µs|ms|s))+", cell), ln


def test_unknown_ceilings_are_said_once():
    """A CPU trace with no ceilings printed "peaks   - (unknown); unknown (unknown)"; the console and the
    HTML header share one line."""
    from opscope.render.report_data import ceilings_line
    from opscope.table import empty

    def run(peaks: dict) -> Run:
        return Run(meta={"target": "t.json", "device": {"type": "cpu"}, "peaks": peaks}, ops=empty(["op", "time_us_total"]),
                   findings=[], summary={"steps": 1})

    unknown = run({"memory_bandwidth_gbps": None, "flops_gflops": {}, "origin": {"memory_bandwidth": "unknown",
                                                                                  "flops": "unknown"}})
    assert ceilings_line(unknown) == "unknown (give --peak-bw and --peak-flops for % of peak and bound)"
    assert "peaks   unknown (give --peak-bw" in render(unknown, 120)
    half = run({"memory_bandwidth_gbps": None, "flops_gflops": {"float32": 100.0},
                "origin": {"memory_bandwidth": "unknown", "flops": "user"}})
    assert ceilings_line(half) == "bandwidth unknown (unknown); float32 100 GFLOP/s (user)"
