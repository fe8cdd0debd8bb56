"""Nsight Systems' SQLite export (opscope.nsight.nsys_sqlite) on databases built here with the documented
tables and columns (tests/nsight_fixtures.py), whole and with tables and columns missing as in other nsys
versions; and `opscope analyze` of such a file."""

from __future__ import annotations

import json
import math
import sqlite3
import subprocess
import sys

import pandas as pd
import pytest

from conftest import TRACES, run_cli
from nsight_fixtures import (
    ADD,
    AUTOGRAD,
    GEMM,
    GPU,
    MAIN,
    ORPHAN,
    PID,
    WARMUP,
    build_nsys_sqlite,
    gtid,
    scenario,
)
from opscope.errors import NsightError
from opscope.nsight.nsys_sqlite import attribute, parse_op_range, read_nsys_sqlite, to_trace_data
from opscope.table import nrows
from opscope.trace.reader import load_trace


@pytest.fixture
def export(tmp_path):
    return build_nsys_sqlite(tmp_path / "report.sqlite")


def test_reads_kernels_memcpy_memset_launches_and_ranges(export):
    data = read_nsys_sqlite(export)
    assert data.warnings == [] and data.gpu_name == GPU
    act = data.activities  # a Table: column -> list of Python values, by start time
    assert list(act) == ["kind", "name", "start", "end", "device", "stream", "correlation", "pid", "bytes"]
    assert act["kind"] == ["kernel", "kernel", "kernel", "memcpy", "memset", "kernel",
                           "kernel", "kernel", "memcpy", "memset"]
    assert act["name"][:6] == [WARMUP, GEMM, ADD, "Memcpy DtoH (Device -> Pinned)", "Memset (Device)", ORPHAN]
    assert act["bytes"][3:5] == [4.0, 65536.0] and math.isnan(act["bytes"][1])
    assert set(act["pid"]) == {PID} and set(act["stream"]) == {7} and type(act["start"][0]) is int
    assert [e - s for s, e in zip(act["start"], act["end"], strict=True)][:3] == [100, 100_000, 10_000]
    launches = data.launches
    assert nrows(launches) == 9 and launches["correlation"][:3] == [1, 101, 102]
    assert launches["gtid"][4] == gtid(AUTOGRAD) and launches["name"][3] == "cudaMemcpyAsync_v3020"
    ranges = data.ranges  # push/pop only: the domain creation and the mark are not ranges
    texts = ranges["text"]
    assert texts.count("opscope_step") == 2 and "opscope_module:fc (Linear)" in texts  # registered strings
    assert "a mark" not in texts and "user" not in texts
    assert [d for t, d in zip(texts, ranges["domain"], strict=True) if t == "a user range"] == ["user"]


def test_work_is_attributed_to_steps_modules_and_op_ranges(export):
    act = attribute(read_nsys_sqlite(export))
    got = list(zip(act["name"], act["step"], act["module"], [(parse_op_range(t) or ("",))[0] for t in act["op_range"]],
                   strict=True))
    assert got[:6] == [
        (WARMUP, -1, "", ""),  # before the first step
        (GEMM, 0, "fc", "aten::addmm"),  # the innermost op range (inside aten::linear)
        (ADD, 0, "fc", "aten::add"),
        ("Memcpy DtoH (Device -> Pinned)", 0, "", "aten::_local_scalar_dense"),
        ("Memset (Device)", 0, "", "aten::zero_"),  # launched from autograd's thread: step by time, op by thread
        (ORPHAN, 0, "", ""),  # its launch is not in the runtime table
    ]
    assert got[6:8] == [(GEMM, 1, "fc", "aten::addmm"), (ADD, 1, "fc", "aten::add")]
    assert act["gtid"][4] == gtid(AUTOGRAD) and act["gtid"][5] == -1
    assert act["launch"][1] == 1_040_000.0  # the GEMM's launch, not its start (1_050_000)


def test_op_ranges():
    assert parse_op_range("aten::addmm, seq = 3, op_id = 2, sizes = [[256], [64, 128], [128, 256], [], []], "
                          "input_op_ids = [(1,0), (2,0)]") == ("aten::addmm", "[[256], [64, 128], [128, 256], [], []]", 3)
    assert parse_op_range("aten::relu") == ("aten::relu", "", -1)
    assert parse_op_range("opscope_step") is None and parse_op_range("MmBackward0, seq = 4") is None


def test_as_a_trace(export):
    trace = to_trace_data(read_nsys_sqlite(export))
    ops = trace.ops  # a Table, as load_trace gives: the columns of a torch trace's ops, as Python lists
    assert list(ops) == list(load_trace(TRACES / "h100_bert-small_bf16.json.gz").ops)
    assert ops["name"][:5] == ["aten::linear", "aten::addmm", "aten::add", "aten::_local_scalar_dense", "aten::zero_"]
    assert ops["input_dims"][1] == "[[256], [64, 128], [128, 256], [], []]" and set(ops["input_dtypes"]) == {""}
    assert ops["dur"][1] == pytest.approx(160.0) and ops["tid"][4] == AUTOGRAD and ops["pid"][0] == PID
    assert type(ops["pid"][0]) is int and type(ops["ts"][0]) is float and math.isnan(ops["kernel_flop"][0])
    assert trace.kernels["cat"][3:5] == ["gpu_memcpy", "gpu_memset"]
    assert trace.kernels["dur"][1] == pytest.approx(100.0)
    assert trace.steps["step"] == [0, 1] and trace.steps["dur"] == [900.0, 900.0]
    assert trace.device_properties == [{"name": GPU}] and trace.gpu_runtime == "cuda"


def test_without_op_ranges_each_launch_is_a_row(tmp_path):
    data = scenario()
    data["NVTX_EVENTS"] = [r for r in data["NVTX_EVENTS"] if "aten::" not in str(r.get("text", ""))]
    trace = to_trace_data(read_nsys_sqlite(build_nsys_sqlite(tmp_path / "r.sqlite", data)))
    assert trace.ops["name"][:5] == ["kernel::warmup_kernel", "kernel::Kernel2", "kernel::vectorized_elementwise_kernel",
                                     "cuda::memcpy_DtoH", "cuda::memset"]
    assert "each launch is a row named after its kernel" in trace.warnings[-1]


@pytest.mark.parametrize("drop, warning", [
    ("CUPTI_ACTIVITY_KIND_RUNTIME", "cannot be joined to the threads"),
    ("StringIds", "no StringIds table"),
    ("CUPTI_ACTIVITY_KIND_KERNEL", "holds no CUDA kernels"),
])
def test_missing_tables_degrade_with_a_warning(tmp_path, drop, warning):
    data = read_nsys_sqlite(build_nsys_sqlite(tmp_path / "r.sqlite", drop_tables=(drop,)))
    assert any(warning in w for w in data.warnings), data.warnings
    act = attribute(data)
    if drop == "CUPTI_ACTIVITY_KIND_RUNTIME":
        assert set(act["gtid"]) == {-1} and set(act["op_range"]) == {""} and nrows(act) == 10
    if drop == "StringIds":
        assert all(n.startswith("<string ") for n, k in zip(act["name"], act["kind"], strict=True) if k == "kernel")
        assert set(act["module"]) == {""}  # range names are registered strings, unknown now
    if drop == "CUPTI_ACTIVITY_KIND_KERNEL":
        assert act["kind"] == ["memcpy", "memset"] * 2


def test_missing_memcpy_memset_and_enum_tables(tmp_path):
    path = build_nsys_sqlite(tmp_path / "r.sqlite", drop_tables=("CUPTI_ACTIVITY_KIND_MEMCPY",
                                                                 "CUPTI_ACTIVITY_KIND_MEMSET", "ENUM_NSYS_EVENT_TYPE",
                                                                 "TARGET_INFO_GPU"))
    data = read_nsys_sqlite(path)
    assert data.warnings == [] and data.gpu_name is None
    assert data.activities["kind"] == ["kernel"] * 6
    assert data.ranges["text"].count("opscope_step") == 2  # push/pop is eventType 59 without the enum


@pytest.mark.parametrize("dropped, name", [(("demangledName",), "Kernel2"), (("demangledName", "shortName"), "_ZKernel2"),
                                            (("demangledName", "shortName", "mangledName"), "<unnamed kernel>")])
def test_kernel_names_fall_back(tmp_path, dropped, name):
    data = read_nsys_sqlite(build_nsys_sqlite(tmp_path / "r.sqlite",
                                              drop_columns={"CUPTI_ACTIVITY_KIND_KERNEL": dropped}))
    assert data.activities["name"][1] == name
    assert bool(data.warnings) == (name == "<unnamed kernel>")


def test_missing_columns(tmp_path):
    path = build_nsys_sqlite(tmp_path / "r.sqlite", drop_columns={
        "CUPTI_ACTIVITY_KIND_KERNEL": ("globalPid", "streamId"),  # older exports: join on correlation alone
        "NVTX_EVENTS": ("eventType", "domainId", "endGlobalTid"),
        "CUPTI_ACTIVITY_KIND_MEMSET": ("start",),
    })
    data = read_nsys_sqlite(path)
    assert any("NVTX_EVENTS has no eventType" in w for w in data.warnings)
    assert any("CUPTI_ACTIVITY_KIND_MEMSET has no start" in w for w in data.warnings)
    assert "memset" not in set(data.activities["kind"])
    act = attribute(data)
    gemm = [i for i, n in enumerate(act["name"]) if n == GEMM]
    assert [act["gtid"][i] for i in gemm] == [gtid(MAIN)] * 2 and [act["module"][i] for i in gemm] == ["fc", "fc"]
    kernels = [i for i, k in enumerate(data.activities["kind"]) if k == "kernel"]
    assert {data.activities["stream"][i] for i in kernels} == {data.activities["pid"][i] for i in kernels} == {-1}
    # without eventType every closed range is taken: the domain creation and the mark have no end
    assert "a mark" not in data.ranges["text"]


def test_missing_runtime_correlation(tmp_path):
    data = read_nsys_sqlite(build_nsys_sqlite(tmp_path / "r.sqlite",
                                              drop_columns={"CUPTI_ACTIVITY_KIND_RUNTIME": ("correlationId",)}))
    assert any("no correlationId" in w for w in data.warnings) and nrows(data.launches) == 0


def test_not_an_nsys_export(tmp_path):
    text = tmp_path / "x.sqlite"
    text.write_text("hello")
    with pytest.raises(NsightError, match="not an SQLite database"):
        read_nsys_sqlite(text)
    other = tmp_path / "other.sqlite"
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE t (a INTEGER)")
    con.commit()
    con.close()
    with pytest.raises(NsightError, match="not an Nsight Systems export"):
        read_nsys_sqlite(other)
    empty = build_nsys_sqlite(tmp_path / "empty.sqlite", {"StringIds": []})
    with pytest.raises(NsightError, match="holds no CUDA kernels, launches or NVTX op ranges"):
        to_trace_data(read_nsys_sqlite(empty))


def test_analyze_an_export(tmp_path, export):
    out = tmp_path / "run"
    proc = run_cli("analyze", str(export), "--out", str(out), "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["steps"] == 2 and summary["step_time_us"] == 900.0
    nsys = summary["nsys"]
    assert nsys["report"] == "report.sqlite" and nsys["gpu"] == GPU and nsys["kernels"] == 5
    assert nsys["kernel_time_us"] == pytest.approx(225.0) and nsys["memset_bytes"] == 131072.0
    assert nsys["device_busy_share"] == pytest.approx(231 / 1800)
    ops = pd.read_csv(out / "ops.csv", keep_default_na=False, na_values={"nsys_time_us_total": [""]})
    addmm = ops[ops["op"] == "aten::addmm"].iloc[0]
    assert addmm["calls"] == 2 and addmm["time_us_total"] == pytest.approx(200.0)
    assert addmm["input_dims"] == "[[256], [64, 128], [128, 256], [], []]"
    assert addmm["nsys_time_us_total"] == pytest.approx(200.0)
    assert "bytes assume 4-byte elements" in addmm["note"]
    lost = ops[ops["op"] == "(unattributed kernels)"].iloc[0]
    assert lost["kernels"] == f"{WARMUP};{ORPHAN}"
    kernels = pd.read_csv(out / "nsys_kernels.csv", keep_default_na=False)
    gemm = kernels[kernels["name"] == GEMM].iloc[0]
    assert (gemm["module"], gemm["nvtx_op"], gemm["op"], gemm["calls"]) == ("fc", "aten::addmm", "aten::addmm", 2)
    assert not (out / "trace.json.gz").exists()
    assert "bytes assume 4-byte elements" in proc.stderr


# --- hostile exports: bad ids, views, unbounded queries --------------------------------------------------


def test_ids_and_times_that_are_not_whole_numbers_are_left_out_with_a_warning(tmp_path):
    """A StringIds id of 'x' (and a runtime call whose start is text) raised ValueError; now the row is
    left out and counted, and everything else reads as before."""
    data = scenario()
    path = build_nsys_sqlite(tmp_path / "r.sqlite", data, drop_tables=("StringIds",))
    con = sqlite3.connect(path)
    con.execute('CREATE TABLE "StringIds" (id, value)')  # no INTEGER PRIMARY KEY: any value fits
    con.executemany('INSERT INTO "StringIds" VALUES (?, ?)',
                    [(r["id"], r["value"]) for r in data["StringIds"]] + [("x", "junk"), (1.5, "half")])
    con.execute('UPDATE "CUPTI_ACTIVITY_KIND_RUNTIME" SET start = \'x\' WHERE correlationId = 1')
    con.commit()
    con.close()
    got = read_nsys_sqlite(path)
    assert got.warnings == [f"{path}: left out 2 StringIds rows whose id is not a whole number",
                            f"{path}: left out 1 runtime calls without a valid start/end/correlationId"]
    whole = read_nsys_sqlite(build_nsys_sqlite(tmp_path / "whole.sqlite"))
    assert got.activities == whole.activities and got.ranges == whole.ranges
    assert nrows(got.launches) == nrows(whole.launches) - 1


# Reads an export in a child process (a hang before the fix must not hang the test run) and prints the
# error line, if any.
_READ = """
import sys
from opscope.errors import NsightError
from opscope.nsight.nsys_sqlite import read_nsys_sqlite
try:
    data = read_nsys_sqlite(sys.argv[1])
except NsightError as exc:
    print("error:", exc)
else:
    print(len(data.activities["kind"]), "|".join(data.warnings))
"""


def test_a_recursive_view_is_not_run(tmp_path):
    """A view named like a kernel table that recurses forever hung the reader: an export's tables are
    tables, so views are not read at all."""
    path = build_nsys_sqlite(tmp_path / "r.sqlite", drop_tables=("CUPTI_ACTIVITY_KIND_KERNEL",))
    con = sqlite3.connect(path)
    con.execute('CREATE VIEW "CUPTI_ACTIVITY_KIND_KERNEL" AS WITH RECURSIVE n(start) AS (SELECT 1 UNION ALL '
                'SELECT start + 1 FROM n) SELECT start, start AS "end", 1 AS demangledName FROM n')
    con.commit()
    con.close()
    proc = subprocess.run([sys.executable, "-c", _READ, str(path)], capture_output=True, text=True,
                          timeout=300)  # a safety net only: before the fix this never returned
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("4 ") and "no CUPTI_ACTIVITY_KIND_KERNEL table" in proc.stdout  # memcpy/memset


def test_every_query_is_bounded(tmp_path, monkeypatch):
    """Whatever a file makes SQLite do, the reader stops after a budget of VM instructions (in proportion
    to the file's size) with one line; a real export is far under it."""
    from opscope.nsight import nsys_sqlite

    export = build_nsys_sqlite(tmp_path / "r.sqlite")
    monkeypatch.setattr(nsys_sqlite, "_MIN_INSTRUCTIONS", 0)
    monkeypatch.setattr(nsys_sqlite, "_PROGRESS_STEP", 1)
    monkeypatch.setattr(nsys_sqlite, "_INSTRUCTIONS_PER_BYTE", 0)
    with pytest.raises(NsightError, match="took far more work than an Nsight Systems export of its size needs"):
        read_nsys_sqlite(export)
    # reading this 36 KiB export takes about 1,500 instructions: one per byte (2,000 times less than the
    # real budget) is plenty
    monkeypatch.setattr(nsys_sqlite, "_INSTRUCTIONS_PER_BYTE", 1)
    assert read_nsys_sqlite(export).warnings == []
