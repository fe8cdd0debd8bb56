"""--nvtx ranges: one per profiled step and one per forward of each top-level module, also for a rank's
model wrapped in DistributedDataParallel (--nproc-per-node --nvtx)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from opscope.capture import nvtx_ranges
from opscope.capture.options import MODULE_RANGE_PREFIX, STEP_RANGE


class TwoLayers(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 8)
        self.fc2 = torch.nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


@pytest.fixture
def ranges(monkeypatch) -> list[str]:
    """The NVTX calls made, as 'push:<label>' and 'pop'."""
    calls: list[str] = []
    monkeypatch.setattr(nvtx_ranges.nvtx, "push_range", lambda label, **kw: calls.append(f"push:{label}"))
    monkeypatch.setattr(nvtx_ranges.nvtx, "pop_range", lambda: calls.append("pop"))
    return calls


def _marked_step(model: torch.nn.Module) -> None:
    with nvtx_ranges.module_ranges(model), nvtx_ranges.step_range():
        model(torch.ones(3, 4))


EXPECTED = [f"push:{STEP_RANGE}", f"push:{MODULE_RANGE_PREFIX}fc1 (Linear)", "pop",
            f"push:{MODULE_RANGE_PREFIX}fc2 (Linear)", "pop", "pop"]


def test_a_step_and_each_top_level_module_are_ranges(ranges):
    model = TwoLayers()
    _marked_step(model)
    assert ranges == EXPECTED
    ranges.clear()
    model(torch.ones(3, 4))  # the hooks are gone after the block
    with nvtx_ranges.module_ranges(model, enabled=False), nvtx_ranges.step_range(enabled=False):
        model(torch.ones(3, 4))
    assert ranges == []


def test_a_ddp_wrapped_model_is_marked_by_its_own_modules(ranges, tmp_path):
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        _marked_step(torch.nn.parallel.DistributedDataParallel(TwoLayers()))
    finally:
        dist.destroy_process_group()
    assert ranges == EXPECTED  # not one range around DDP's single child "module"
