"""The Triton kernels, run on the CPU under the Triton interpreter (TRITON_INTERPRET=1, which conftest.py
turns on where torch sees no GPU; on a GPU they run compiled, in test_kernels_cuda.py):
forward and backward through torch.ops.opscope.<name> with the Triton backend forced, against PyTorch
under the manifest tolerances, plus inputs that exercise the multi-block paths (rows longer than one
block, more rows than one backward chunk). The interpreter has no bfloat16 arithmetic: the kernels load,
convert to float32 and store, which it does support. Slow per program, so inputs are small."""

from __future__ import annotations

import os
from pathlib import Path

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


@pytest.mark.parametrize("name", TRITON)
def test_every_tuned_launch_gives_the_default_launchs_result(name: str) -> None:
    """Each configuration of the manifest's [tune.triton] space (forced, as the tuner times it) computes
    exactly what the default launch does: a BLOCK of an element-wise kernel, a warp or stage count change
    the schedule, never a value. (The interpreter ignores num_warps and num_stages: on a GPU
    test_kernels_cuda.py runs the compiled kernels.)"""
    from opscope.kernels import bench as kb
    from reference_kernels import _triton

    m = MANIFESTS[name]
    for case in m.bench:  # rows and columns, with and without a mask: 32x32 (1x8x8), a few programs
        args = kb.make_args(m, case, scale=1 / 128)
        with reference_kernels.use_backend("triton"):
            default = op(name)(*args)
            for config in kb.triton_configs(m):
                with _triton.forced(config):
                    assert torch.equal(op(name)(*args), default), (name, case.name, config)


def test_launch_options_forced_then_tuned_then_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from reference_kernels import _triton, tuning

    monkeypatch.setenv("OPSCOPE_CACHE_DIR", str(tmp_path))
    tuning.reset()
    try:
        args = (torch.randn(8, 64), torch.randn(8, 64))
        assert _triton.launch_options("swiglu", "swiglu_forward", args, 1024, block_is_knob=True) == {"BLOCK": 1024}
        tuning.store("swiglu", "triton:swiglu_forward", args, {"block": 256, "num_warps": 2})
        assert _triton.launch_options("swiglu", "swiglu_forward", args, 1024, block_is_knob=True) == {
            "BLOCK": 256, "num_warps": 2}
        # a row kernel's BLOCK stays what its caller computed, whatever an entry says
        assert _triton.launch_options("swiglu", "swiglu_forward", args, 64, block_is_knob=False) == {
            "BLOCK": 64, "num_warps": 2}
        with _triton.forced({"num_warps": 8, "num_stages": 3}):
            assert _triton.launch_options("swiglu", "swiglu_forward", args, 1024, block_is_knob=True) == {
                "BLOCK": 1024, "num_warps": 8, "num_stages": 3}
        # the CPU kernel's key is another one: its grain is not the Triton launch's
        assert tuning.knob("swiglu", "swiglu_forward", args, "grain_size") == 0
    finally:
        tuning.reset()


def test_tune_triton_caches_a_configuration_of_the_space(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tuner's plumbing, under the interpreter (its times say nothing of a GPU): every configuration
    timed, one of them cached under the Triton key, and the next launch on that class uses it."""
    from opscope.kernels import bench as kb
    from reference_kernels import _triton, tuning

    monkeypatch.setenv("OPSCOPE_CACHE_DIR", str(tmp_path))
    tuning.reset()
    try:
        m = MANIFESTS["rms_norm"]
        args = (torch.randn(4, 32), torch.randn(32), 1e-6)
        values = kb.tune_triton(m, args, repeats=3)
        labels = {" ".join(f"{k}={v}" for k, v in c.items()) for c in kb.triton_configs(m)}
        assert set(values["candidates_ms"]) == labels and len(labels) == 15
        chosen = {k: values[k] for k in m.tune["triton"]}
        assert chosen in kb.triton_configs(m)
        assert _triton.launch_options("rms_norm", "rms_norm_forward", args, 32, block_is_knob=False) == {
            "BLOCK": 32, **chosen}
    finally:
        tuning.reset()
