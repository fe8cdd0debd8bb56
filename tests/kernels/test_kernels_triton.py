"""The Triton kernels, run on the CPU under the Triton interpreter (TRITON_INTERPRET=1, which conftest.py
turns on where torch sees no GPU; on a GPU they run compiled, in test_kernels_cuda.py):
forward and backward through torch.ops.opscope.<name> with the Triton backend forced, against PyTorch
under the manifest tolerances, plus inputs that exercise the multi-block paths (rows longer than one
block, more rows than one backward chunk). The interpreter has no bfloat16 arithmetic: the kernels load,
convert to float32 and store, which it does support. Slow per program, so inputs are small."""

from __future__ import annotations

import os

import pytest
import torch

import reference_kernels
from kernels_helpers import DTYPES, MANIFESTS, keep_layout_grad, module, op, reference, tensors
from reference_kernels.testing import assert_matches, gradient_tolerance, tolerance

triton = pytest.importorskip("triton")


def interpreter_loops_over_runtime_bounds() -> bool:
    """Whether this Triton's interpreter runs `for i in tl.range(0, n)` with a runtime n. Triton 3.6's
    does not with NumPy >= 2.4: it turns the scalar argument into a 1-element array and int()s it
    ("only 0-dimensional arrays can be converted to Python scalars"), for `range` and `tl.range` alike;
    3.7 squeezes it first. Compiled Triton 3.6 is not affected."""
    import triton.language as tl

    @triton.jit
    def count(out_ptr, n):
        acc = tl.zeros([1], dtype=tl.int32)
        for _ in tl.range(0, n):
            acc += 1
        tl.store(out_ptr + tl.arange(0, 1), acc)

    out = torch.zeros(1, dtype=torch.int32)
    try:
        count[(1,)](out, 3)
    except Exception as exc:  # noqa: BLE001 - the interpreter wraps the TypeError in its own error
        if "0-dimensional" in str(exc):
            return False
        raise
    return int(out[0]) == 3


INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"
pytestmark = [
    pytest.mark.skipif(not INTERPRETING, reason="the Triton interpreter is off (a GPU is present: "
                                                "test_kernels_cuda.py runs the compiled kernels)"),
    pytest.mark.skipif(INTERPRETING and not interpreter_loops_over_runtime_bounds(),
                       reason=f"Triton {triton.__version__}'s interpreter cannot loop over a runtime bound with "
                              "this NumPy (Triton 3.6 with NumPy >= 2.4; fixed in Triton 3.7)"),
]
TRITON = sorted(name for name, m in MANIFESTS.items() if "triton" in m.backends)


def _forward_backward(name: str, args: tuple, dtype: torch.dtype, seed: int, backward: bool) -> None:
    tol = tolerance(MANIFESTS[name], dtype)
    leaves = keep_layout_grad(args) if backward else args
    with reference_kernels.use_backend("triton"):
        out = op(name)(*leaves)
        ref_args, expected = reference(name, args, dtype, grad=backward)
        assert_matches(out, expected, tol, f"triton {name} forward ({dtype}, seed {seed})")
        if backward:
            g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)).to(dtype)
            grads = torch.autograd.grad(out, tensors(leaves), g)
            ref_grads = torch.autograd.grad(expected, tensors(ref_args), g.to(expected.dtype))
            for k, (a, b) in enumerate(zip(grads, ref_grads, strict=True)):
                assert_matches(a, b, gradient_tolerance(tol, b, dtype), f"triton {name} grad {k} ({dtype}, seed {seed})")


def test_every_kernel_has_a_triton_backend() -> None:
    assert sorted(MANIFESTS) == TRITON


@pytest.mark.slow
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("name", TRITON)
def test_triton_forward_and_backward(name: str, dtype: str) -> None:
    dt = DTYPES[dtype]
    for seed in (0, 1):
        for args in module(name).samples(dt, seed):
            _forward_backward(name, args, dt, seed, backward=dt in (torch.float32, torch.float64))


def _r(*shape: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(sum(shape)))


@pytest.mark.parametrize(("name", "args"), [
    ("softmax", (_r(3, 2500), 0.5, _r(2500))),                     # online max/sum across 3 blocks
    ("rms_norm", (_r(40, 1500), _r(1500), 1e-6)),                  # 2 row blocks, 2 backward chunks
    ("layer_norm", (_r(40, 1500) + 50, [1500], _r(1500), _r(1500), 1e-5)),
    ("bias_gelu", (_r(70, 24), _r(24), "tanh")),
    ("sum", (_r(3, 2100), 1, False)),
    ("mean", (_r(3, 40, 9), 1, True)),
    ("broadcast_add", (_r(2, 3, 1, 5, 1, 4)[:, :, :, ::2], _r(3, 7, 3, 1, 1))),  # > 4 dims after coalescing
])
def test_triton_multi_block_paths(name: str, args: tuple) -> None:
    _forward_backward(name, args, torch.float32, 0, backward=True)


@pytest.mark.parametrize("name", TRITON)
def test_triton_backend_passes_opcheck(name: str) -> None:
    with reference_kernels.use_backend("triton"):
        torch.library.opcheck(op(name), keep_layout_grad(module(name).samples(torch.float32, 0)[1]),
                              test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


def test_triton_checks_inputs_like_the_cpu_kernels() -> None:
    with reference_kernels.use_backend("triton"), pytest.raises(RuntimeError, match="same dtype"):
        op("broadcast_add")(torch.randn(2), torch.randn(2, dtype=torch.float64))
    with reference_kernels.use_backend("triton"), pytest.raises(ValueError, match="not broadcastable"):
        op("broadcast_add")(torch.randn(2, 3), torch.randn(4, 3))


@pytest.mark.parametrize("shape", [(37, 5), (3, 37, 6), (4, 3), (0, 4), (1, 300)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_column_sum_split_reduction(shape: tuple, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    """The column sum's split reduction, with splits of 4 rows so small inputs take every path: several
    splits, splits of splits (37 rows: 10, then 3, then 1), a part-filled last split, no rows, more
    columns than one block."""
    from reference_kernels import _triton

    monkeypatch.setattr(_triton, "SPLIT_ROWS", 4)
    monkeypatch.setattr(_triton, "COLUMN_BLOCK", 128)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(dtype)
    out_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    got = _triton.column_sum(x, out_dtype, scale=0.5)
    expected = 0.5 * x.double().sum(dim=-2)
    assert got.dtype == out_dtype and got.shape == expected.shape
    torch.testing.assert_close(got.double(), expected, rtol=1e-6, atol=1e-6)
