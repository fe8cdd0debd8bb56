"""opscope.api.explain.explain_op on a real run (the H100 BERT-small trace), against numbers worked out by
hand from the row's shapes."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import TRACES
from opscope.analysis.trace_file import analyze_trace_file
from opscope.api.explain import explain_op
from opscope.errors import OpscopeError
from opscope.run.read import read_run


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("explain") / "bert"
    analyze_trace_file(TRACES / "h100_bert-small_bf16.json.gz", out=out)
    return out


def test_addmm_row_by_hand(bert: Path) -> None:
    e = explain_op(bert, 0)
    # the MLM head's projection: bias [N], mat1 [M, K], mat2 [K, N] in bfloat16
    m, k, n = 141, 512, 30522
    assert e["op"] == "aten::addmm" and e["input_dims"] == [[n], [m, k], [k, n], [], []]
    assert e["input_dtypes"][:3] == ["c10::BFloat16"] * 3
    flops = 2 * m * n * k  # 4 406 888 448
    nbytes = 2 * (n + m * k + k * n + m * n)  # bias, A, B read once, the output written once
    assert e["flops_per_call"] == flops == e["estimate"]["flops_per_call"]
    assert e["bytes_per_call"] == nbytes == e["estimate"]["bytes_per_call"]
    assert e["calls"] == 1 and e["flops_total"] == flops and e["bytes_total"] == nbytes
    assert e["arithmetic_intensity"] == pytest.approx(flops / nbytes)
    t_us = e["time_us_total"]
    assert t_us == pytest.approx(41.28)
    assert e["achieved_gflops"] == pytest.approx(flops / t_us / 1e3)
    assert e["achieved_gbps"] == pytest.approx(nbytes / t_us / 1e3)
    # H100's bf16 tensor-core and HBM3 peaks: the ridge at 295 FLOP/B, the row (110 FLOP/B) below it
    ceiling = e["ceiling"]
    assert ceiling["flops_key"] == "bfloat16" and ceiling["peak_gflops"] == 989400.0 and ceiling["peak_gbps"] == 3350.0
    assert ceiling["ridge_flops_per_byte"] == pytest.approx(989400 / 3350)
    assert ceiling["binding"] == "memory bandwidth" and e["bound"] == "memory"
    assert ceiling["attainable_gflops"] == pytest.approx(flops / nbytes * 3350)
    assert ceiling["pct_of_binding_peak"] == pytest.approx(nbytes / t_us / 1e3 / 3350 * 100)
    assert e["family"] == "matmul"
    assert e["cost_function"] == "opscope.costmodel.matmul.addmm"
    assert e["formula"].startswith("addmm(self=bias, mat1 [M,K], mat2 [K,N]") and "2*M*N*K" in e["formula"]
    assert e["counted_by"] == "the cost function, from the row's recorded inputs"
    assert e["module"] == "BertOnlyMLMHead.BertLMPredictionHead.Linear"


def test_row_by_op_name_and_by_run(bert: Path) -> None:
    run = read_run(bert)
    assert explain_op(run, "aten::addmm")["row"] == 0
    assert explain_op(run, "3")["row"] == 3
    row = run.ops["op"].index("aten::native_layer_norm")
    e = explain_op(run, "aten::native_layer_norm")
    assert e["row"] == row and e["cost_function"] == "opscope.costmodel.norm." + e["cost_function"].split(".")[-1]


def test_a_composite_row_says_who_counted_it(bert: Path) -> None:
    run = read_run(bert)
    row = run.ops["op"].index("aten::_scaled_dot_product_flash_attention")
    e = explain_op(run, row)
    assert e["family"] == "composite" and e["flops_per_call"] == 0
    assert e["estimate"]["flops_per_call"] > 0  # what its function would count: the children count it
    assert e["counted_by"].startswith("a composite here")


def test_rows_it_does_not_have(bert: Path) -> None:
    with pytest.raises(OpscopeError, match="row 100000 is not in ops.csv"):
        explain_op(bert, 100000)
    with pytest.raises(OpscopeError, match="no row of ops.csv has the op 'aten::nothing'"):
        explain_op(bert, "aten::nothing")
