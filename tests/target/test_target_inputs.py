"""Model inputs beside tensors: `get_inputs()` may return Python numbers, None, strings and nested
lists/dicts/tuples of tensors; they reach forward() unchanged, tensors inside them are moved to the
device, and `--dtype` converts floating-point tensors only. KernelBench level 1 problem 5
(matrix-scalar multiplication, `[A, s]` with a float `s`) runs through the real CLI in both modes."""

from __future__ import annotations

import json
from collections import namedtuple

import pytest
import torch

from conftest import PEAKS, line_of, run_cli, write_model
from opscope.capture.harness import Harness
from opscope.target.model_file import load_target

# KernelBench level1/5_Matrix_scalar_multiplication.py, smaller M and N
MATRIX_SCALAR = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    """Simple model that performs a matrix-scalar multiplication (C = A * s)"""

    def __init__(self):
        super(Model, self).__init__()

    def forward(self, A: torch.Tensor, s: float) -> torch.Tensor:
        return A * s  # MUL


M = 256
N = 128


def get_inputs():
    A = torch.randn(M, N)
    s = 3.14
    return [A, s]


def get_init_inputs():
    return []  # No special initialization inputs needed
'''

NESTED = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x, pair, opts, nothing, n, name):
        assert nothing is None and n == 3 and isinstance(n, int) and name == "relu"
        a, b = pair
        y = self.lin(x) * opts["scale"] + a[0] + b.float().mean()
        return y * opts["k"]


def get_inputs():
    return [torch.randn(4, 8), [(torch.randn(8),), torch.arange(8)], {"scale": 2.5, "k": torch.ones(8)}, None, 3,
            "relu"]
'''


@pytest.mark.parametrize("mode", ["inference", "train"])
@pytest.mark.parametrize("dtype", [None, "bfloat16"])
def test_kernelbench_matrix_scalar_multiplication(tmp_path, mode, dtype):
    path = write_model(tmp_path, MATRIX_SCALAR)
    out = tmp_path / "run"
    args = ["profile", str(path), "--mode", mode, "--steps", "1", "--warmup", "1", *PEAKS, "--out", str(out)]
    res = run_cli(*args, *(["--dtype", dtype] if dtype else []))
    assert res.returncode == 0, res.stderr
    ops = (out / "ops.csv").read_text()
    meta = json.loads((out / "meta.json").read_text())
    assert meta["dtype"] == (dtype or "float32") and meta["mode"] == mode
    mul_line = f"{path.name}:{line_of(path, '# MUL')}"
    rows = [r for r in ops.splitlines() if r.startswith("aten::mul,") and mul_line in r]
    # forward A * s; in train also its backward (grad * s), since A is the only thing to differentiate
    assert len(rows) == (2 if mode == "train" else 1), ops
    assert "[[256, 128], []]" in rows[0]  # the scalar is a Python number, recorded as an empty dim list


def test_nested_and_non_tensor_inputs_reach_forward_unchanged(tmp_path):
    path = write_model(tmp_path, NESTED)
    target = load_target(path)
    harness = Harness(target, mode="train", device=torch.device("cpu"), dtype="bfloat16")
    x, pair, opts, nothing, n, name = harness.args
    assert x.dtype == torch.bfloat16 and pair[0][0].dtype == torch.bfloat16
    assert isinstance(pair, list) and isinstance(pair[0], tuple)
    assert pair[1].dtype == torch.int64  # --dtype converts floating tensors only
    assert opts["scale"] == 2.5 and isinstance(opts["scale"], float) and opts["k"].dtype == torch.bfloat16
    assert (nothing, n, name) == (None, 3, "relu")
    assert not x.requires_grad  # the model has parameters: inputs are not differentiated
    harness.step()
    res = run_cli("profile", str(path), "--mode", "train", "--dtype", "bfloat16", "--steps", "1", "--warmup", "1",
                  *PEAKS, "--out", str(tmp_path / "run"))
    assert res.returncode == 0, res.stderr


def test_keyword_inputs_and_namedtuples(tmp_path):
    path = write_model(tmp_path, '''
        import collections
        import torch
        Pair = collections.namedtuple("Pair", "a b")

        class Model(torch.nn.Module):
            def forward(self, x, pair=None, eps=0.0):
                return x * pair.a + pair.b + eps

        def get_inputs():
            return {"x": torch.randn(4), "pair": Pair(torch.randn(4), 1.5), "eps": 1e-3}
    ''')
    harness = Harness(load_target(path), mode="train", device=torch.device("cpu"), dtype="float16")
    pair = harness.kwargs["pair"]
    assert type(pair).__name__ == "Pair" and pair.a.dtype == torch.float16 and pair.b == 1.5
    assert harness.kwargs["eps"] == 1e-3
    # no parameters: the backward pass differentiates the floating-point input tensors
    assert harness.kwargs["x"].requires_grad and pair.a.requires_grad
    harness.step()
    grad = harness.kwargs["x"].grad
    harness.step()
    assert torch.equal(harness.kwargs["x"].grad, grad)  # reset each step, not accumulated


def test_namedtuple_is_rebuilt_by_field():
    Point = namedtuple("Point", "x y")
    from opscope.capture.harness import _move

    moved = _move(Point(torch.ones(2), 2), torch.device("cpu"), torch.bfloat16)
    assert isinstance(moved, Point) and moved.x.dtype == torch.bfloat16 and moved.y == 2
