"""Nsight Compute's CSV (opscope.nsight.ncu_csv) on text in its documented layouts: the raw page (a units
row under the header) and the details page, with ==PROF== lines, thousands separators, scaled units and
n/a."""

from __future__ import annotations

import math

import pytest

from conftest import TESTS
from nsight_fixtures import ncu_details_csv, ncu_raw_csv
from opscope.errors import NsightError
from opscope.nsight.ncu_csv import parse_ncu_csv, parse_number, read_ncu_csv, unit_factor
from opscope.table import nrows

FIXTURES = TESTS / "fixtures" / "nsight"
GEMM = "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_bf16_256x128_64x3_tn_align2>(T1)"
ADD = "void at::native::vectorized_elementwise_kernel<(int)4, at::native::CUDAFunctor_add<float>, std::array<char *, 3>>(int, T2, T3)"
UNITS = {"dram__bytes_read.sum": "Mbyte", "dram__bytes_write.sum": "Kbyte", "gpu__time_duration.sum": "usecond",
         "sm__sass_thread_inst_executed_op_ffma_pred_on.sum": "inst",
         "dram__throughput.avg.pct_of_peak_sustained_elapsed": "%"}
KERNELS = [
    {"name": GEMM, "dram__bytes_read.sum": "111.426", "dram__bytes_write.sum": "12,380.78",
     "gpu__time_duration.sum": "43.34", "sm__sass_thread_inst_executed_op_ffma_pred_on.sum": "1,155,072",
     "dram__throughput.avg.pct_of_peak_sustained_elapsed": "85.2"},
    {"name": ADD, "dram__bytes_read.sum": "0.289", "dram__bytes_write.sum": "144.38",
     "gpu__time_duration.sum": "1.60", "sm__sass_thread_inst_executed_op_ffma_pred_on.sum": "0",
     "dram__throughput.avg.pct_of_peak_sustained_elapsed": "n/a"},
]


def test_raw_page_values_in_base_units():
    table = parse_ncu_csv(ncu_raw_csv(KERNELS, UNITS))
    assert table.layout == "raw" and table.warnings == []
    assert [m[:9] for m in table.messages] == ["==PROF== "] * 4
    k = table.kernels  # a Table: column -> list
    assert k["id"] == [0, 1] and k["kernel"] == [GEMM, ADD]
    assert k["base"] == ["Kernel2", "vectorized_elementwise_kernel"]
    assert k["dram__bytes_read.sum"][0] == pytest.approx(111.426e6)
    assert k["dram__bytes_write.sum"][0] == pytest.approx(12_380.78e3)
    assert k["gpu__time_duration.sum"][0] == pytest.approx(43_340.0)  # ns
    assert k["sm__sass_thread_inst_executed_op_ffma_pred_on.sum"][0] == 1_155_072
    assert k["dram__throughput.avg.pct_of_peak_sustained_elapsed"][0] == 85.2
    assert math.isnan(k["dram__throughput.avg.pct_of_peak_sustained_elapsed"][1])  # n/a is unknown, not 0
    assert k["sm__sass_thread_inst_executed_op_ffma_pred_on.sum"][1] == 0
    assert type(k["sm__sass_thread_inst_executed_op_ffma_pred_on.sum"][1]) is float
    assert k["stream"] == ["7", "7"] and k["grid"] == ["(80, 1, 1)"] * 2
    assert set(table.metrics) == set(UNITS)


def test_details_page_gives_the_same_table():
    raw = parse_ncu_csv(ncu_raw_csv(KERNELS, UNITS)).kernels
    details = parse_ncu_csv(ncu_details_csv(KERNELS, UNITS))
    assert details.layout == "details"
    for m in UNITS:
        assert details.kernels[m] == pytest.approx(raw[m], nan_ok=True), m
    assert details.kernels["kernel"] == raw["kernel"]


def test_the_bert_fixtures_raw_and_details_agree():
    raw = read_ncu_csv(FIXTURES / "h100_bert-small_ncu_raw.csv")
    details = read_ncu_csv(FIXTURES / "h100_bert-small_ncu_details.csv")
    assert nrows(raw.kernels) == 26 and nrows(details.kernels) == 8
    for m in raw.metrics:
        assert details.kernels[m] == pytest.approx(raw.kernels[m][:8], nan_ok=True), m
    assert all(math.isnan(v) for v in raw.kernels["sm__sass_thread_inst_executed_op_dfma_pred_on.sum"])


def test_details_section_names_fill_in_missing_metrics():
    header = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Section Name",'
              '"Metric Name","Metric Unit","Metric Value"')
    rows = ['"0","1","python","h","k(float*)","1","7","GPU Speed Of Light Throughput","Duration","msecond","1.50"',
            '"0","1","python","h","k(float*)","1","7","GPU Speed Of Light Throughput","DRAM Throughput","%","7.5"',
            '"0","1","python","h","k(float*)","1","7","GPU Speed Of Light Throughput","Memory Throughput","%","9"']
    k = parse_ncu_csv("\n".join([header, *rows])).kernels
    assert k["gpu__time_duration.sum"][0] == pytest.approx(1.5e6)
    assert k["dram__throughput.avg.pct_of_peak_sustained_elapsed"][0] == 7.5
    assert "Memory Throughput" not in k  # a different quantity than DRAM: not mapped


def test_other_output_around_the_table_is_skipped():
    text = ("the model printed this\nand, this, too\n" + ncu_raw_csv(KERNELS, UNITS)
            + "more model output\n\"1\",\"too\",\"short\"\n")
    table = parse_ncu_csv(text, "ncu.csv")
    assert nrows(table.kernels) == 2
    assert table.warnings == ["ncu.csv: skipped 2 line(s) that are not rows of the table"]


def test_an_unknown_unit_keeps_the_value_and_says_so():
    text = ncu_raw_csv([{"name": "k", "dram__bytes_read.sum": "3"}], {"dram__bytes_read.sum": "furlong"})
    table = parse_ncu_csv(text, "x.csv")
    assert table.kernels["dram__bytes_read.sum"][0] == 3.0
    assert "dram__bytes_read.sum in 'furlong'" in table.warnings[0]


def test_launch_resource_units_of_an_h200_are_counts_without_a_note():
    """ncu on an H200 prints launch__block_dim_x in 'block' and launch__cluster_max_active in 'cluster'."""
    units = {"launch__block_dim_x": "block", "launch__cluster_max_active": "cluster",
             "launch__registers_per_thread": "register/thread"}
    text = ncu_raw_csv([{"name": "k", "launch__block_dim_x": "256", "launch__cluster_max_active": "2",
                         "launch__registers_per_thread": "32"}], units)
    table = parse_ncu_csv(text, "x.csv")
    assert table.kernels["launch__block_dim_x"][0] == 256.0
    assert table.kernels["launch__cluster_max_active"][0] == 2.0
    assert not any("block" in w or "cluster" in w for w in table.warnings), table.warnings


@pytest.mark.parametrize("text, value", [("1,234.5", 1234.5), ("1,155,072", 1155072.0), ("4.0e-05", 4e-05),
                                         (" 85.2 ", 85.2), ("0", 0.0)])
def test_numbers(text, value):
    assert parse_number(text) == value


@pytest.mark.parametrize("text", ["n/a", "N/A", "", "-", "nan", "(n/a)", "abc"])
def test_missing_numbers(text):
    assert math.isnan(parse_number(text))


@pytest.mark.parametrize("unit, factor", [("byte", 1), ("Kbyte", 1e3), ("Mbyte", 1e6), ("Gbyte", 1e9), ("KB", 1e3),
                                          ("MiB", 2 ** 20), ("Kibyte", 1024), ("nsecond", 1), ("usecond", 1e3),
                                          ("msecond", 1e6), ("second", 1e9), ("us", 1e3), ("ms", 1e6), ("%", 1),
                                          ("inst", 1), ("Minst", 1e6), ("", 1), ("Gbyte/second", None)])
def test_unit_factors(unit, factor):
    assert unit_factor(unit) == factor


def test_no_table_is_one_error_with_the_reason_when_ncu_gave_one():
    with pytest.raises(NsightError, match="no Nsight Compute table"):
        parse_ncu_csv("==PROF== Connected to process 1\nhello\n", "out.csv")
    perm = ("==PROF== Connected to process 1 (/usr/bin/python3)\n==ERROR== ERR_NVGPUCTRPERM - The user does not "
            "have permission to access NVIDIA GPU Performance Counters on the target device 0.\n")
    with pytest.raises(NsightError, match="NVreg_RestrictProfilingToAdminUsers=0"):
        parse_ncu_csv(perm)


def test_a_table_without_kernels():
    text = ncu_raw_csv([], UNITS) + "==WARNING== No kernels were profiled.\n"
    table = parse_ncu_csv(text)
    assert nrows(table.kernels) == 0 and "==WARNING== No kernels were profiled." in table.messages
    assert list(table.kernels)[:2] == ["id", "pid"] and table.metrics == list(UNITS)


def test_a_cell_over_the_csv_field_limit_skips_its_row(tmp_path):
    """A kernel name of 200 KB (over csv's 128 KiB field limit) raised _csv.Error; now that row is skipped
    and counted and the others are read."""
    huge = {"name": "k" + "x" * 200_000, "dram__bytes_read.sum": "5"}
    path = tmp_path / "ncu.csv"
    path.write_text(ncu_raw_csv([KERNELS[0], huge, KERNELS[1]], UNITS))
    table = read_ncu_csv(path)
    assert table.kernels["kernel"] == [KERNELS[0]["name"], KERNELS[1]["name"]]
    assert table.warnings == [f"{path}: skipped 1 line(s) that are not rows of the table"]
