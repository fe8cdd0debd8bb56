"""Concrete Inputs are a trace's text, so untrusted (issue 23, item 9b): they are read by a bounded
parser of the forms torch writes, never by ast.literal_eval, which a 100 KB "---...1" drove into a
MemoryError."""

from __future__ import annotations

import gzip
import json
import math

import pytest

from conftest import TRACES, run_cli
from opscope.costmodel import OpCall, estimate
from opscope.costmodel.base import parse_scalar


@pytest.mark.parametrize("text,value", [
    ("1", 1), ("-1", -1), ("15", 15), ("1.5", 1.5), ("1.", 1.0), ("-0.5", -0.5), ("1e-05", 1e-05),
    ("9.9999999999999998e-13", 9.9999999999999998e-13), ("True", True), ("False", False), ("None", None),
    ("true", True), ("[]", []), ("[1, 1]", [1, 1]), ("[0, 2, 1, 3]", [0, 2, 1, 3]), ("[1, -2, 3, -1]", [1, -2, 3, -1]),
    ("[True, False, True]", [True, False, True]), ("[None, 2]", [None, 2]), ("[[1, 2], [3]]", [[1, 2], [3]]),
    ("[1.5, 2]", [1.5, 2]), ("'tanh'", "tanh"), ('"tanh"', "tanh"), (" 2 ", 2), ("inf", math.inf), ("-inf", -math.inf),
])
def test_the_forms_torch_writes_are_read(text, value):
    assert parse_scalar(text) == value and type(parse_scalar(text)) is type(value)


def test_nan_and_absent():
    assert math.isnan(parse_scalar("nan"))  # type: ignore[arg-type]
    assert parse_scalar("", "default") == "default" and parse_scalar(None, 3) == 3


@pytest.mark.parametrize("text", [
    "-" * 100_000 + "1",  # the MemoryError of ast.literal_eval
    "[" * 100_000 + "]" * 100_000,
    "(" * 50_000 + ")" * 50_000,
    "1" * 5000,  # past int()'s digit limit, and no argument's value
    "[" + "1, " * 10_000 + "1]",
    "x", "{}", "1 2", "[1 2]", "[1, 2", "--1", "__import__('os')", "'a\\'b'",
])
def test_anything_else_is_the_raw_text(text):
    assert parse_scalar(text) == text


def test_a_hostile_concrete_input_costs_the_call_its_cost_only():
    hostile = "-" * 100_000 + "1"
    assert estimate(OpCall("aten::zeros", ([],), ("",), ([],), (hostile,))) is None
    assert estimate(OpCall("aten::zeros", ([],), ("",), ([],), ("[1048576]",))) is not None


def test_analyze_reads_a_trace_with_a_hostile_concrete_input(tmp_path):
    doc = json.loads(gzip.decompress((TRACES / "h100_bert-small_bf16.json.gz").read_bytes()))
    norms = [e for e in doc["traceEvents"] if e.get("name") in ("aten::layer_norm", "aten::native_layer_norm")]
    assert norms
    for e in norms:  # normalized_shape, which the cost function reads
        e["args"]["Concrete Inputs"][1] = "-" * 100_000 + "1"
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    proc = run_cli("analyze", str(path), "--out", str(tmp_path / "run"), "--peak-bw", "3350", "--peak-flops", "989000")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "MemoryError" not in proc.stderr
