"""CUDA/HIP graph replay on the shared SGLang Qwen3-8B decode trace (ROCm): one hipGraphLaunch inside
a `step[DECODE bs=32]` record_function range starts 544 kernels that no op launched one by one."""

from __future__ import annotations

import gzip
import json
from collections import defaultdict

import pytest

from conftest import TRACES, run_cli, union_us
from opscope.analysis.trace_file import analyze_trace_file
from opscope.run.schema import GRAPH_KERNEL_NOTE, UNATTRIBUTED
from opscope.trace.kernel_names import kernel_family

SGLANG = TRACES / "sglang_qwen3-8b_decode_cudagraph.json.gz"
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def raw_events() -> list[dict]:
    return json.loads(gzip.decompress(SGLANG.read_bytes()))["traceEvents"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return analyze_trace_file(SGLANG, out=tmp_path_factory.mktemp("sglang") / "run")


def test_graph_kernels_are_rows_of_their_launcher(run):
    events = raw_events()
    graph_corr = {e["args"]["correlation"] for e in events if e.get("name") == "hipGraphLaunch"}
    expected: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for e in events:
        if e.get("cat") in DEVICE_CATS and e["args"].get("correlation") in graph_corr:
            expected[e["name"]] += e["dur"]
            calls[e["name"]] += 1
    assert sum(calls.values()) == 544
    rows = run.to_pandas()[run.to_pandas()["note"] == GRAPH_KERNEL_NOTE]
    assert set(rows["launcher"]) == {"step[DECODE bs=32]"}  # the annotation around the launch
    assert set(rows["op"]) == set(expected)
    for row in rows.to_dict("records"):
        assert row["time_us_total"] == pytest.approx(expected[row["op"]])
        assert row["calls"] == calls[row["op"]]
        assert row["kernel_family"] == kernel_family(row["op"])
        assert row["bound"] == "unknown" and row["cpu_time_us_total"] == 0
        assert row["source_location"].endswith("model_runner.py:3123")  # where the annotation was opened


def test_done_criteria_unattributed_families_graph_mode(run):
    s = run.summary
    total = sum(e["dur"] for e in raw_events() if e.get("cat") in DEVICE_CATS)
    assert run.to_pandas()["time_us_total"].sum() == pytest.approx(total)
    assert UNATTRIBUTED not in set(run.to_pandas()["op"])
    assert s["unattributed_time_share"] < 0.02
    assert s["kernel_families_cover_share"] > 0.95
    assert sum(s["kernel_family_time_share"].values()) == pytest.approx(1.0)
    assert s["graph_replay"]["launches"] == 1 and s["graph_replay"]["kernels"] == 544
    assert s["graph_replay"]["launchers"] == ["step[DECODE bs=32]"]


def test_kernel_family_shares_match_an_independent_sum(run):
    by_family: dict[str, float] = defaultdict(float)
    events = [e for e in raw_events() if e.get("cat") in DEVICE_CATS]
    for e in events:
        by_family[kernel_family(e["name"], e["cat"])] += e["dur"]
    total = sum(by_family.values())
    for family, share in run.summary["kernel_family_time_share"].items():
        assert share == pytest.approx(by_family.get(family, 0.0) / total)
    assert run.summary["kernel_family_time_share"]["gemm"] > 0.5


def test_kernels_launched_outside_any_op_are_rows_of_their_annotation(run):
    # resolve_future_token_ids / clamp_position: hipLaunchKernel with no cpu_op around it, inside
    # SGLang's `execute_...` range
    rows = run.to_pandas()[run.to_pandas()["op"].str.contains("clamp_position_kernel|resolve_future_token_ids_kernel")]
    assert len(rows) == 2
    assert all(x.startswith("execute_32_context_0") for x in rows["launcher"])


def test_streams_and_gaps(run):
    events = [e for e in raw_events() if e.get("cat") in DEVICE_CATS]
    streams = {r["stream"]: r for r in run.summary["streams"]}
    assert set(streams) == {e["args"]["stream"] for e in events}
    for stream, r in streams.items():
        mine = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["args"]["stream"] == stream]
        assert r["busy_us"] == pytest.approx(union_us(mine))
        assert r["kernels"] == len(mine)
    assert run.summary["comm_compute_overlap_share"] is None  # one GPU: no communication kernels
    gap = run.summary["idle_gaps"][0]
    # the GPU waits 463 ms while the CPU blocks in a device-to-host copy_ (SGLang's overlap scheduler)
    assert gap["duration_us"] > 460_000 and gap["cpu_op"] == "aten::copy_"
    assert gap["cpu_source_location"].endswith("cuda_graph_runner.py:276")
    durations = [g["duration_us"] for g in run.summary["idle_gaps"]]
    assert durations == sorted(durations, reverse=True)


def test_launch_bound_does_not_suggest_cuda_graphs_in_graph_mode(run):
    finding = next(f for f in run.findings if f["rule"] == "launch-bound")
    assert "already replays a CUDA/HIP graph" in finding["message"]
    assert "capture the step in a CUDA graph" not in finding["suggestion"]


def test_the_runs_dtype_is_unknown_not_its_few_cpu_side_ops(run):
    """The replay's kernel rows record no dtype; the 5 CPU-side calls that do (float32 bookkeeping) do not
    name a bfloat16 model's dtype."""
    assert run.meta["dtype"] is None


def test_console_states_graph_mode(tmp_path):
    proc = run_cli("analyze", str(SGLANG), "--out", str(tmp_path / "run"), "--top", "5")
    assert proc.returncode == 0, proc.stderr
    out = " ".join(" ".join(line.strip(" │╭╮╰╯─") for line in proc.stdout.splitlines()).split())
    assert "(trace, inference, dtype unknown)" in out
    assert "CUDA/HIP graph replay: 544 kernels from 1 graph launch" in out
    assert "records no per-op shapes" in out and "--capture" in out
    assert "kernels gemm 59.1%" in out
    assert "gemm: Cijk_Alik" in out  # the family, then the short kernel name (cut on narrow terminals)
    assert "GPU idle gaps" in out


def test_hostile_names_in_graph_mode_print_as_text(tmp_path):
    """Kernel and annotation names reach the graph-mode lines, kernel rows and gap table as text."""
    doc = json.loads(gzip.decompress(SGLANG.read_bytes()))
    for e in doc["traceEvents"]:
        if e.get("cat") == "user_annotation" and e["name"] == "step[DECODE bs=32]":
            e["name"] = "step\x1b[2J[bold red]PWNED[/]"
        if e.get("cat") == "kernel" and e["name"].startswith("void paged_attention_ll4mi_QKV"):
            e["name"] = "paged_attention\x07[link=http://e]x[/link]"
    (tmp_path / "t.json").write_text(json.dumps(doc))
    proc = run_cli("analyze", str(tmp_path / "t.json"), "--out", str(tmp_path / "run"), "--top", "3")
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout and "\x07" not in proc.stdout
    out = " ".join(" ".join(line.strip(" │╭╮╰╯─") for line in proc.stdout.splitlines()).split())
    assert "[bold red]PWNED[/]" in out  # shown literally, not styled
    assert "paged_attention\ufffd[l" in out  # literal markup (the cell is cut to fit the terminal)


def test_damaged_graph_mode_summary_keys_give_one_line_not_a_traceback(run, tmp_path):
    """Every GPU timeline key of summary.json (and the entries inside them) retyped: `opscope report`
    renders it or names the damage, never a traceback."""
    import io
    import shutil

    from rich.console import Console

    from opscope.errors import OpscopeError
    from opscope.render.console import render_run
    from opscope.run.read import read_run

    values = [None, "x", -1, 1e308, [], {}, True, "NaN", 2**80, [1], [{"a": 1}]]
    good = json.loads((run.path / "summary.json").read_text())
    paths = [(k,) for k in ("kernel_family_time_share", "kernel_families_cover_share", "unattributed_time_share",
                            "graph_replay", "streams", "comm_compute_overlap_share", "idle_gaps", "gpu_only")]
    paths += [("graph_replay", k) for k in good["graph_replay"]] + [("kernel_family_time_share", "gemm")]
    paths += [("streams", 0, k) for k in good["streams"][0]] + [("idle_gaps", 0, k) for k in good["idle_gaps"][0]]
    for i, where in enumerate(paths):
        for value in values:
            doc = json.loads(json.dumps(good))
            target = doc
            for step in where[:-1]:
                target = target[step]
            target[where[-1]] = value
            folder = tmp_path / f"r{i}"
            shutil.rmtree(folder, ignore_errors=True)
            shutil.copytree(run.path, folder)
            (folder / "summary.json").write_text(json.dumps(doc))
            try:
                render_run(read_run(folder), Console(file=io.StringIO(), width=140))
            except OpscopeError as exc:
                assert "\n" not in str(exc)
