"""The five custom-operator traps, checked on every bundled CPU kernel:
1. device and dtype checked at the entry (TORCH_CHECK), mixed precision converted explicitly;
2. tensor lifetimes held across the kernel (no pointer into a freed temporary);
3. autograd wired (gradcheck: tests/kernels/test_kernels_ops.py::test_gradcheck_float64);
4. no memory growth over thousands of calls (RSS flat);
5. no data races: results identical for 1 and N threads."""

from __future__ import annotations

import gc

import pytest
import torch

from kernels_helpers import NAMES, keep_layout_grad, module, op, tensors
from reference_kernels import _build


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def _first_tensor_index(args: tuple) -> int:
    return next(i for i, a in enumerate(args) if isinstance(a, torch.Tensor))


@pytest.mark.parametrize("name", NAMES)
def test_dtype_checked_at_entry(name: str) -> None:
    args = list(module(name).samples(torch.float32, 0)[0])
    i = _first_tensor_index(tuple(args))
    args[i] = (args[i] * 10).to(torch.int32)
    with pytest.raises(RuntimeError, match="must be float32, float64, bfloat16 or float16"):
        op(name)(*args)
    with pytest.raises(RuntimeError, match="must be float32, float64, bfloat16 or float16"):
        getattr(torch.ops.opscope_cpu, f"{name}_forward")(*args, 0)


@pytest.mark.parametrize("name", NAMES)
def test_device_checked_at_entry(name: str) -> None:
    """A tensor on another device than the first raises before any pointer is read (the C++ entry and
    the fake implementation both check)."""
    args = list(module(name).samples(torch.float32, 0)[0])
    tensor_positions = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    args[tensor_positions[-1]] = args[tensor_positions[-1]].to("meta")
    if len(tensor_positions) > 1:
        with pytest.raises(RuntimeError, match="meta"):
            getattr(torch.ops.opscope_cpu, f"{name}_forward")(*args, 0)
    else:  # one tensor argument: hand the CPU kernel a meta tensor directly
        with pytest.raises(RuntimeError, match="on meta"):
            getattr(torch.ops.opscope_cpu, f"{name}_forward")(*args, 0)


@pytest.mark.parametrize("name", NAMES)
def test_lifetimes_non_contiguous_inputs_then_memory_reused(name: str) -> None:
    """Non-contiguous inputs make the kernel create contiguous temporaries; the result must equal the one
    from contiguous copies, and must not change once the inputs are freed and their memory reused."""
    sample = module(name).large_sample(torch.float32)
    strided = tuple(torch.stack([a, a], dim=-1)[..., 0] if isinstance(a, torch.Tensor) and a.dim() else a
                    for a in sample)
    assert any(isinstance(a, torch.Tensor) and not a.is_contiguous() for a in strided)
    out = op(name)(*strided)
    want = op(name)(*sample)
    assert torch.equal(out, want)
    snapshot = out.clone()
    del strided, sample
    gc.collect()
    junk = [torch.full((256, 1024), float(i)) for i in range(16)]
    assert torch.equal(out, snapshot)
    del junk


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_memory_flat_over_thousands_of_calls(name: str) -> None:
    args = keep_layout_grad(module(name).samples(torch.float32, 0)[1])

    def step() -> None:
        out = op(name)(*args)
        torch.autograd.grad(out, tensors(args), torch.ones_like(out))

    for _ in range(300):
        step()
    gc.collect()
    before = _rss_bytes()
    for _ in range(2000):
        step()
    gc.collect()
    grown = _rss_bytes() - before
    assert grown < 8 * 2**20, f"RSS grew {grown / 2**20:.1f} MiB over 2000 forward+backward calls"


@pytest.mark.parametrize("name", NAMES)
def test_one_and_two_threads_give_identical_results(name: str) -> None:
    """Work is split into fixed chunks whose partial results are combined in a fixed order, so the thread
    count changes who computes a chunk, never the summation order: results are bitwise identical."""
    sample = module(name).large_sample(torch.float32)
    before = torch.get_num_threads()
    results = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            args = keep_layout_grad(sample)
            out = op(name)(*args)
            grads = torch.autograd.grad(out, tensors(args), torch.ones_like(out))
            results.append((out, grads))
    finally:
        torch.set_num_threads(before)
    (o1, g1), (o2, g2) = results
    assert torch.equal(o1, o2)
    for a, b in zip(g1, g2, strict=True):
        assert torch.equal(a, b)


def test_extension_runs_on_torchs_thread_pool() -> None:
    """at::parallel_for in the extension uses torch's intra-op pool: set_num_threads governs it."""
    _build.load_cpu_extension()
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.ops.opscope_cpu.threads_used(64) == 1
        torch.set_num_threads(2)
        assert torch.ops.opscope_cpu.threads_used(64) == 2
    finally:
        torch.set_num_threads(before)
