"""broadcast_add specifics: the broadcast matrix's shapes, Python scalars, gradients of stretched dims
by hand, the error messages, and the strided loop on layouts that do not coalesce."""

from __future__ import annotations

import pytest
import torch

import reference_kernels as rk
from reference_kernels._build import load_cpu_extension

ADD = rk.load("broadcast_add")  # torch.ops.opscope.broadcast_add


@pytest.fixture(autouse=True, scope="module")
def _cpu_extension() -> None:
    """Some tests call torch.ops.opscope_cpu directly: load the extension here, not through whichever
    test happened to run first in this worker (it failed when xdist sent these tests elsewhere first)."""
    load_cpu_extension()


@pytest.mark.parametrize(("sa", "sb", "want"), [
    ([2, 3], [2, 3], [2, 3]), ([2, 3], [3], [2, 3]), ([3], [2, 3], [2, 3]),
    ([4, 1, 6], [5, 1], [4, 5, 6]), ([5, 1], [4, 1, 6], [4, 5, 6]),
    ([], [2, 3], [2, 3]), ([2, 3], [], [2, 3]), ([], [], []), ([0, 3], [3], [0, 3]),
])
def test_broadcast_matrix_shapes_and_values(sa: list[int], sb: list[int], want: list[int]) -> None:
    a, b = torch.randn(sa), torch.randn(sb)
    out = ADD(a, b)
    assert list(out.shape) == want
    assert torch.equal(out, a + b)


def test_python_scalars_become_0d_tensors_of_the_other_dtype() -> None:
    x = torch.randn(2, 3, dtype=torch.float64)
    assert torch.equal(rk.broadcast_add(x, 2.5), x + 2.5)
    assert torch.equal(rk.broadcast_add(-1, x), x - 1)
    assert rk.broadcast_add(1.0, x).dtype == torch.float64


def test_gradient_of_stretched_dims_is_summed_by_hand() -> None:
    a = torch.randn(4, 1, 6, requires_grad=True)
    b = torch.randn(5, 1, requires_grad=True)
    ADD(a, b).sum().backward()
    assert torch.equal(a.grad, torch.full((4, 1, 6), 5.0))   # each a element used 5 times
    assert torch.equal(b.grad, torch.full((5, 1), 24.0))     # each b element used 4 * 6 times
    s = torch.tensor(1.0, requires_grad=True)
    ADD(s, torch.ones(2, 3)).sum().backward()
    assert s.grad.item() == 6.0 and s.grad.shape == ()


def test_incompatible_shapes_name_both_shapes_and_the_dim() -> None:
    with pytest.raises(ValueError, match=r"shapes \[4, 1, 6\] \(a\) and \[5, 2\] \(b\) are not broadcastable: "
                                         r"dim -1 .* sizes 6 and 2"):
        ADD(torch.randn(4, 1, 6), torch.randn(5, 2))
    with pytest.raises(ValueError, match=r"\[2, 3\] \(a\) and \[4, 3\] \(b\).*dim -2 .* sizes 2 and 4"):
        ADD(torch.randn(2, 3), torch.randn(4, 3))


def test_incompatible_shapes_raise_under_compile_too() -> None:
    torch._dynamo.reset()
    f = torch.compile(lambda a, b: ADD(a, b), fullgraph=True, backend="aot_eager")
    with pytest.raises(Exception, match=r"\[2, 3\] \(a\) and \[4, 3\] \(b\)"):
        f(torch.randn(2, 3), torch.randn(4, 3))


def test_dtype_mismatch_raises_instead_of_promoting() -> None:
    with pytest.raises(RuntimeError, match="a and b must have the same dtype, got Float and Double"):
        ADD(torch.randn(2), torch.randn(2, dtype=torch.float64))


def test_device_mismatch_raises() -> None:
    with pytest.raises(RuntimeError, match="b is on meta"):
        torch.ops.opscope_cpu.broadcast_add_forward(torch.randn(2), torch.randn(2, device="meta"), 0)
    with pytest.raises(RuntimeError, match="a is on cpu but b is on meta"):
        torch.library.opcheck  # noqa: B018 - the fake path checks too:
        from reference_kernels._checks import same_device
        same_device("opscope::broadcast_add", a=torch.randn(2), b=torch.randn(2, device="meta"))


@pytest.mark.parametrize("grain", [1, 7, 1000, 0])
def test_strided_loop_across_task_boundaries(grain: int) -> None:
    """Layouts that do not coalesce, split into tasks that start mid-run: every element exactly once."""
    a = torch.randn(3, 70, 5).permute(2, 0, 1)      # [5, 3, 70], strides (1, 350, 5)
    b = torch.randn(3, 1)[:, :1].expand(3, 70)      # stride-0 inner dim
    out = torch.ops.opscope_cpu.broadcast_add_forward(a, b, grain)
    assert torch.equal(out, a + b)
