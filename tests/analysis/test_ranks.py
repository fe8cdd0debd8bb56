"""Merging the ranks of a multi-process job (opscope.analysis.ranks, torch-free): each rank's numbers from
its trace against hand-computed values, the merged ops table, ranks.csv and the straggler, on hand-built
traces, on real gloo DDP traces (tests/fixtures/distributed) and on copies of a shared GPU trace."""

from __future__ import annotations

import gzip
import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from conftest import PEAKS, REPO, TRACES, assert_clean_error, run_cli
from opscope.analysis.ranks import merge_ops, rank_hint, rank_list, rank_stats
from opscope.errors import OpscopeError
from opscope.machine.peaks import Peaks
from opscope.render.html import render_html
from opscope.run.read import read_run
from opscope.table import NAN, records
from opscope.trace.reader import load_trace

DDP_TRACES = REPO / "tests" / "fixtures" / "distributed"


def _load_benchmark():
    spec = importlib.util.spec_from_file_location("merge_ranks_bench", REPO / "benchmarks" / "merge_ranks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _x(name: str, ts: float, dur: float, cat: str = "cpu_op", tid: int = 1, **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _write(path: Path, events: list[dict], **top) -> Path:
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events, **top}, f)
    return path


def cpu_rank_events(scale: float = 1.0) -> list[dict]:
    """Two steps of 100 µs on thread 1; per step an aten::mm, a c10d::allreduce_ and, on gloo's thread
    2, the gloo:all_reduce range overlapping it. `scale` stretches the mm (a slower rank)."""
    ev = []
    for k, t0 in enumerate((0.0, 100.0)):
        ev.append(_x(f"ProfilerStep#{k}", t0, 100.0, cat="user_annotation"))
        ev.append(_x("aten::mm", t0 + 10, 30.0 * scale if k == 0 else 40.0 * scale,
                     **{"Input Dims": [[8, 8], [8, 8]], "Input type": ["float", "float"]}))
    ev += [_x("c10d::allreduce_", 50, 10), _x("gloo:all_reduce", 55, 35, cat="user_annotation", tid=2),
           _x("c10d::allreduce_", 160, 5), _x("gloo:all_reduce", 162, 33, cat="user_annotation", tid=2)]
    return ev


def test_rank_stats_cpu_hand_computed(tmp_path):
    trace = load_trace(_write(tmp_path / "r.json.gz", cpu_rank_events()))
    stats = rank_stats(trace, {"steps": 2, "step_time_us": 100.0, "total_time_us": 85.0}, rank=0)
    # collectives: step 1 [50,60] u [55,90] = 40 µs; step 2 [160,165] u [162,195] = 35 µs
    assert stats["collective_time_us"] == pytest.approx(75 / 2)
    # the step thread is in an op 30 + 10 + 40 + 5 = 85 µs, 15 of them in collective ops
    assert stats["compute_time_us"] == pytest.approx(70 / 2)
    assert stats["idle_time_us"] == pytest.approx((200 - 85) / 2)
    assert stats["op_time_us"] == pytest.approx(85 / 2)
    by_name = {c["name"]: c for c in stats["collectives"]}
    assert by_name["gloo:all_reduce"] == {"name": "gloo:all_reduce", "kind": "annotation", "calls": 2, "time_us": 68.0}
    assert by_name["c10d::allreduce_"]["time_us"] == 15.0 and by_name["c10d::allreduce_"]["kind"] == "op"


def test_rank_stats_gpu_hand_computed(tmp_path):
    """On a GPU trace collectives are the communication kernels; compute the other kernels."""
    ev = [_x("ProfilerStep#0", 0, 100, cat="user_annotation"),
          _x("ampere_sgemm_128x64_nn", 0, 50, cat="kernel", tid=7, stream=7, device=0),
          _x("vectorized_elementwise_kernel", 60, 20, cat="kernel", tid=7, stream=7, device=0),
          _x("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 40, 30, cat="kernel", tid=8, stream=8, device=0)]
    trace = load_trace(_write(tmp_path / "g.json.gz", ev))
    stats = rank_stats(trace, {"steps": 1, "step_time_us": 100.0, "total_time_us": 100.0}, rank=3, world_size=4)
    assert stats["collective_time_us"] == pytest.approx(30.0)
    assert stats["compute_time_us"] == pytest.approx(70.0)  # [0,50] u [60,80]
    assert stats["idle_time_us"] == pytest.approx(20.0)  # no kernel in [80,100]
    assert (stats["rank"], stats["world_size"]) == (3, 4)
    assert stats["collectives"][0]["kind"] == "kernel"


def test_merge_ops_sums_ranks_and_names_the_slowest():
    def table(time_mm: float, time_add: float) -> dict[str, list]:
        return {
            "op": ["aten::mm", "aten::add"], "input_dims": ["[[8, 8], [8, 8]]", "[[8], [8]]"],
            "input_dtypes": ['["float", "float"]'] * 2, "input_strides": ["", ""], "concrete_inputs": ["", ""],
            "source_location": ["m.py:3", "m.py:4"], "calls": [2.0, 2.0], "time_us_total": [time_mm, time_add],
            "time_share": [0.5, 0.5], "flops_per_call": [1024.0, 8.0], "bytes_per_call": [768.0, 96.0],
            "bound": ["compute", "memory"], "family": ["matmul", "elementwise"], "dtype": ["float32", "float32"]}

    peaks = Peaks(10.0, {"float32": 100.0}, {"memory_bandwidth": "user", "flops": "user"})
    merged = merge_ops([(0, table(10.0, 4.0)), (1, table(30.0, 2.0))], peaks, gpu=False)
    [mm] = [r for r in records(merged) if r["op"] == "aten::mm"]
    assert (mm["calls"], mm["time_us_total"], mm["ranks"], mm["slowest_rank"], mm["time_us_max_rank"]) == (4, 40, 2, 1, 30)
    assert mm["achieved_gflops"] == pytest.approx(1024 * 4 / 40.0 / 1e3)  # recomputed from the sums
    assert merged["op"] == ["aten::mm", "aten::add"]
    assert sum(merged["time_share"]) == pytest.approx(1.0)


def test_merge_ops_keeps_pandas_types_and_orders():
    """What the merge did with pandas, kept: a key column a rank lacks (module) is "" there, a number
    column one rank lacks holds floats, equal times keep the rows' order, and of a row's equal times on
    two ranks the later rank is the slowest."""
    a = {"op": ["x", "y"], "input_dims": ["", ""], "input_dtypes": ["", ""], "input_strides": ["", ""],
         "concrete_inputs": ["", ""], "source_location": ["", ""], "module": ["m", "m"], "calls": [1, 1],
         "time_us_total": [5.0, 5.0], "flops_per_call": [NAN, NAN], "bytes_per_call": [NAN, NAN],
         "family": ["", ""], "dtype": ["", ""], "extra": [7, 8]}
    b = {k: v for k, v in a.items() if k not in ("module", "extra")}
    merged = merge_ops([(0, a), (1, b)], Peaks(None), gpu=False)
    assert merged["op"] == ["x", "y", "x", "y"]  # four rows: a's have module "m", b's module ""
    assert merged["module"] == ["m", "m", "", ""]
    assert [type(v) for v in merged["extra"]] == [float] * 4 and merged["extra"][:2] == [7.0, 8.0]
    assert merged["calls"] == [1.0] * 4 and merged["ranks"] == [1] * 4
    same = merge_ops([(0, b), (1, b)], Peaks(None), gpu=False)
    assert same["slowest_rank"] == [1, 1] and same["time_us_total"] == [10.0, 10.0]
    assert same["time_share"] == [0.5, 0.5]


def test_rank_names_and_lists():
    assert [rank_hint(Path(n)) for n in ("rank3.json.gz", "trace_rank_12.pt.trace.json", "host_123.json")] == [3, 12, None]
    assert (rank_list([0, 1, 2]), rank_list([4]), rank_list([0, 2, 5])) == ("ranks 0-2", "rank 4", "ranks 0, 2, 5")


def test_analyze_folder_of_hand_built_ranks_finds_the_slow_one(tmp_path):
    folder = tmp_path / "job"
    folder.mkdir()
    for r in range(3):
        # no distributedInfo: the file names give the ranks; rank 2's matmuls take twice as long
        _write(folder / f"rank{r}.json.gz", cpu_rank_events(1.25 if r == 2 else 1.0))
    proc = run_cli("analyze", str(folder), "--out", str(tmp_path / "run"), *PEAKS, "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    d = summary["distributed"]
    assert d["straggler_rank"] == 2 and d["ranks"] == 3
    # compute per step: ranks 0, 1: 35 µs; rank 2: (37.5 + 50) / 2 = 43.75 µs
    assert d["straggler_compute_time_us"] == pytest.approx(43.75) and d["compute_time_us_median"] == pytest.approx(35.0)
    assert summary["steps"] == 6  # rank-steps
    run = read_run(tmp_path / "run")
    assert run.to_pandas("ranks")["rank"].tolist() == [0, 1, 2] and run.to_pandas("ranks")["straggler"].tolist() == [0, 0, 1]
    mm = run.to_pandas()[run.to_pandas()["op"] == "aten::mm"]
    assert mm["calls"].sum() == 6 and mm["time_us_total"].sum() == pytest.approx(70 * 2 + 87.5)
    (straggler,) = [f for f in run.findings if f["rule"] == "straggler"]
    assert "rank 2" in straggler["message"] and "the other 2 ranks wait for it every step" in straggler["message"]
    assert sorted(p.name for p in (tmp_path / "run" / "ranks").iterdir()) == ["0", "1", "2"]


def test_analyze_folder_of_real_ddp_traces(tmp_path):
    """Two ranks of a real gloo DDP job (rank 1 does extra matmuls each step): merged table, all-reduce
    time, the straggler, and the same merge again from the run's ranks/."""
    out = tmp_path / "run"
    proc = run_cli("analyze", str(DDP_TRACES), "--out", str(out), *PEAKS)
    assert proc.returncode == 0, proc.stderr
    assert "straggler: rank 1" in proc.stdout
    assert "gloo:all_reduce" in proc.stdout
    run = read_run(out)
    per_rank = [read_run(out / "ranks" / str(r)) for r in (0, 1)]
    for col in ("calls", "time_us_total"):
        assert run.to_pandas()[col].sum() == pytest.approx(sum(r.to_pandas()[col].sum() for r in per_rank))
    allreduce = run.to_pandas()[run.to_pandas()["op"] == "c10d::allreduce_"]
    assert len(allreduce) == 1 and allreduce["ranks"].iloc[0] == 2
    d = run.summary["distributed"]
    assert (d["backend"], d["world_size"], d["straggler_rank"]) == ("gloo", 2, 1)
    names = {c["name"] for c in d["collectives"]}
    assert {"gloo:all_reduce", "c10d::allreduce_"} <= names
    assert all(c["time_us"] > 0 for c in d["collectives"])
    assert run.meta["distributed"]["ranks"] == [0, 1]
    assert (out / "trace.json.gz").is_file()
    again = tmp_path / "again"
    proc = run_cli("analyze", str(out / "ranks"), "--out", str(again), *PEAKS, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["distributed"]["straggler_rank"] == 1
    assert read_run(again).to_pandas("ranks")["compute_time_us"].tolist() == pytest.approx(run.to_pandas("ranks")["compute_time_us"].tolist())
    page = render_html(run)
    assert '<section id="ranks">' in page and 'class="straggler bad"' in page and "straggler: rank 1" in page


def test_synthetic_gpu_ranks_find_the_slowed_rank(tmp_path):
    """The benchmark's folder: copies of a shared H100 trace, one rank stretched 1.25x."""
    bench = _load_benchmark()
    bench.synthetic_ranks(TRACES / "h100_bert-small_bf16.json.gz", tmp_path / "job", ranks=3, slowed=1, factor=1.25)
    proc = run_cli("analyze", str(tmp_path / "job"), "--out", str(tmp_path / "run"), "--json")
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)["distributed"]
    assert d["straggler_rank"] == 1
    assert d["straggler_excess_share"] == pytest.approx(0.25, abs=1e-4)  # every interval stretched exactly
    assert d["backend"] == "nccl" and d["collective_time_us"] == 0.0


def test_bad_rank_folders_are_one_line(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_clean_error(run_cli("analyze", str(empty), *PEAKS), "holds no per-rank traces")
    twice = tmp_path / "twice"
    twice.mkdir()
    for name in ("a.json.gz", "b.json.gz"):
        shutil.copy(DDP_TRACES / "ddp_gloo_rank0.json.gz", twice / name)
    assert_clean_error(run_cli("analyze", str(twice), "--out", str(tmp_path / "o"), *PEAKS), "are both rank 0")
    assert not (tmp_path / "o").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".opscope")]
    assert_clean_error(run_cli("analyze", str(twice), "--capture", str(twice / "a.json.gz"), *PEAKS),
                       "--capture applies to one trace")
    assert_clean_error(run_cli("analyze", str(twice), "--nsys", str(twice / "a.json.gz"), "--ncu", str(twice / "b.json.gz"),
                               *PEAKS), "--nsys/--ncu apply to one trace, not to a folder of ranks")
    one = tmp_path / "one"
    assert run_cli("analyze", str(twice / "a.json.gz"), "--out", str(one), *PEAKS).returncode == 0
    assert_clean_error(run_cli("analyze", str(one), *PEAKS), "is the run directory of one process")


def test_damaged_ranks_csv_is_one_error(tmp_path):
    out = tmp_path / "run"
    assert run_cli("analyze", str(DDP_TRACES), "--out", str(out), *PEAKS).returncode == 0
    (out / "ranks.csv").write_text("rank,step_time_us\n0,fast\n")
    with pytest.raises(OpscopeError, match="ranks.csv is damaged: column 'step_time_us' holds non-numbers"):
        read_run(out)
    assert_clean_error(run_cli("report", str(out)), "ranks.csv is damaged")


def test_straggler_rule_fires_from_ten_percent_and_the_line_says_so():
    from opscope.findings import Context, run_rules
    from opscope.render.ranks import straggler_line
    from opscope.run.model import Run

    def findings(compute: list[float]) -> list[dict]:
        ranks = {"rank": list(range(len(compute))), "compute_time_us": compute,
                 "collective_time_us": [5.0] * len(compute)}
        ops = {"op": ["aten::mm"], "time_us_total": [1000.0]}
        ctx = Context(ops=ops, events={}, peaks=Peaks(None), gpu=False, source="trace", steps=8,
                      step_time_us=100.0, ranks=ranks)
        return run_rules(ctx, only=["straggler"])

    assert findings([100.0, 100.0, 100.0, 109.0]) == []
    [f] = findings([100.0, 100.0, 100.0, 110.0])
    assert f["message"].startswith("rank 3 computes 110 µs per step, 10% more than the median rank (100 µs")
    assert f["est_savings_us"] == pytest.approx(10.0 * 8)  # the excess, in each of the 8 rank-steps
    quiet = Run(meta={}, ops={}, findings=[], summary={"distributed": {
        "straggler_rank": 1, "straggler_compute_time_us": 101.0, "compute_time_us_median": 100.5,
        "straggler_excess_share": 0.005, "straggler_beyond_noise": False}})
    assert straggler_line(quiet) == ("straggler: rank 1, compute 101.0 µs per step, +0% over the median rank "
                                     "(100.5 µs): the slowest, but within noise (no straggler finding)")


def test_ranks_of_different_jobs_are_refused_in_one_line(tmp_path):
    """Device types, world sizes and backends must agree, and no more ranks than the world size (issue 23,
    item 11); nothing is written when they do not."""
    cases = {}
    mixed = cases["cpu and cuda"] = tmp_path / "mixed"
    mixed.mkdir()
    for name in ("ddp_gloo_rank0.json.gz", "ddp_gloo_rank1.json.gz"):
        shutil.copy(DDP_TRACES / name, mixed / name)
    shutil.copy(TRACES / "h100_bert-small_bf16.json.gz", mixed / "h100.json.gz")
    vendors = cases["cuda and rocm"] = tmp_path / "vendors"
    vendors.mkdir()
    shutil.copy(TRACES / "h100_bert-small_bf16.json.gz", vendors / "rank0.json.gz")
    shutil.copy(TRACES / "mi300x_bert-small_bf16.json.gz", vendors / "rank1.json.gz")
    for key, worlds in (("world sizes", (2, 4)), ("beyond the world", (2, 2, 2))):
        folder = cases[key] = tmp_path / key.replace(" ", "_")
        folder.mkdir()
        for r, w in enumerate(worlds):
            _write(folder / f"rank{r}.json.gz", cpu_rank_events(),
                   distributedInfo={"backend": "gloo", "rank": r, "world_size": w})
    needles = {"cpu and cuda": ("different device types", "ranks 0-1 (ddp_gloo_rank0.json.gz", "on cpu",
                                "rank 2 (h100.json.gz) on cuda (NVIDIA H100"),
               "cuda and rocm": ("different device types", "on cuda", "on rocm (AMD Instinct MI300X"),
               "world sizes": ("different world sizes", "rank 0 (rank0.json.gz) world size 2", "world size 4"),
               "beyond the world": ("3 ranks, but the traces record a world size of 2", "rank 2 (rank2.json.gz) beyond")}
    for key, folder in cases.items():
        out = tmp_path / f"out-{folder.name}"
        proc = run_cli("analyze", str(folder), "--out", str(out), *PEAKS)
        assert_clean_error(proc, *needles[key], "one folder must hold the ranks of one job")
        assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".opscope")]


def test_ranks_with_different_step_counts_merge_with_a_warning(tmp_path):
    folder = tmp_path / "job"
    folder.mkdir()
    _write(folder / "rank0.json.gz", cpu_rank_events())
    _write(folder / "rank1.json.gz", [e for e in cpu_rank_events() if e["name"] != "ProfilerStep#1"])
    proc = run_cli("analyze", str(folder), "--out", str(tmp_path / "run"), *PEAKS, "--json")
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if "different numbers of steps" in ln]
    assert lines == ["opscope: ranks profiled different numbers of steps (rank 1 (rank1.json.gz) 1; rank 0 "
                     "(rank0.json.gz) 2): per-step numbers are each rank's own mean; check that the traces come "
                     "from the same profiling window"]


def test_rank_subfolders_holding_a_trace_are_ranks(tmp_path):
    """tensorboard_trace_handler's layout: `0/`, `1/` each holding one trace, beside a rank's run directory."""
    folder = tmp_path / "job"
    for r in (0, 1):
        (folder / str(r)).mkdir(parents=True)
        _write(folder / str(r) / "host_123.1700000000.pt.trace.json.gz", cpu_rank_events(1.25 if r == 1 else 1.0))
    _write(tmp_path / "rank2.json.gz", cpu_rank_events())
    assert run_cli("analyze", str(tmp_path / "rank2.json.gz"), "--out", str(folder / "rank2"), *PEAKS).returncode == 0
    (folder / "notes").mkdir()  # a folder without traces is not a rank
    proc = run_cli("analyze", str(folder), "--out", str(tmp_path / "run"), *PEAKS, "--json")
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)["distributed"]
    assert d["ranks"] == 3 and d["straggler_rank"] == 1
    _write(folder / "1" / "again.json.gz", cpu_rank_events())
    assert_clean_error(run_cli("analyze", str(folder), "--out", str(tmp_path / "run2"), *PEAKS),
                       f"{folder / '1'} holds 2 traces (again.json.gz, host_123", "must hold one trace")
