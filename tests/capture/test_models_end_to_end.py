"""Whole models through `opscope profile`: FLOP totals against torch's FlopCounterMode, cost-model
coverage, and bound classes. GPT-2 and BERT are built from `transformers` configs (random weights,
no downloads)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode, conv_backward_flop

from conftest import EXAMPLES, GPT2, write_model
from opscope.capture.harness import Harness
from opscope.capture.torch_profiler import profile_target
from opscope.target.model_file import load_target
from opscope.target.specs import ProfileOptions

STEPS = 2
TENSOR_FAMILIES = ("matmul", "conv", "attention")
CPU_SDPA = "aten::_scaled_dot_product_flash_attention_for_cpu"


BERT = """
    import torch
    from transformers import BertConfig, BertModel

    def get_model():
        torch.manual_seed(0)
        cfg = BertConfig(num_hidden_layers=2, hidden_size=128, num_attention_heads=4, intermediate_size=512,
                         vocab_size=1000, max_position_embeddings=128)
        return BertModel(cfg)

    def get_inputs():
        return {"input_ids": torch.randint(0, 1000, (2, 64)), "attention_mask": torch.ones(2, 64, dtype=torch.long)}
"""


# MobileNet-style: grouped and depthwise convs, whose backward FlopCounterMode over-counts (its grad_weight
# term ignores `groups`).
DEPTHWISE = """
    import torch
    import torch.nn as nn

    def get_model():
        torch.manual_seed(0)
        return nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(),
            nn.Conv2d(32, 32, 3, padding=1, groups=32), nn.ReLU(),      # depthwise
            nn.Conv2d(32, 64, 1),                                       # pointwise
            nn.Conv2d(64, 64, 3, stride=2, padding=1, groups=4),        # grouped
            nn.ConvTranspose2d(64, 32, 2, stride=2, groups=8),          # grouped transposed
        )

    def get_inputs():
        return [torch.randn(2, 3, 32, 32)]
"""
INLINE = {"gpt2": GPT2, "bert": BERT, "depthwise": DEPTHWISE}


def model_file(tmp_path_factory, name: str) -> Path:
    if name in ("gpt2", "bert"):
        pytest.importorskip("transformers")
    if name in INLINE:
        return write_model(tmp_path_factory.mktemp(name), INLINE[name], f"{name}.py")
    return EXAMPLES / f"{name}.py"


def flopcounter_per_step(path: Path, mode: str) -> tuple[float, int]:
    """(FlopCounterMode FLOPs per step with its known over-count of grouped conv backward taken out, the
    FLOPs of each CPU SDPA call it could not count: 4*B*H*pairs*D, pairs = the (query, key) pairs the
    kernel computes, counted on the mask)."""
    target = load_target(path)
    harness = Harness(target, mode=mode, device=torch.device("cpu"), dtype=None)
    harness.step()
    sdpa_calls = []
    grouped_excess = []

    class _Spy(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            # under inference_mode the mode sees the composite; in training, the CPU kernel op
            if func._schema.name in (CPU_SDPA, "aten::scaled_dot_product_attention"):
                q, k = args[0], args[1]
                causal = _arg(func, args, kwargs, "is_causal", False)
                keep = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool)
                pairs = int((keep.tril() if causal else keep).sum())  # SDPA's is_causal: top-left
                sdpa_calls.append(4 * q.shape[0] * q.shape[1] * pairs * q.shape[3])
            out = func(*args, **(kwargs or {}))
            if func._schema.name == "aten::convolution_backward" and args[9] > 1 and args[10][1]:
                # FlopCounterMode's own grad_weight term for this call, of which 1/groups is real work
                gw = conv_backward_flop(*args[:10], [False, True, False], out_val=out)
                grouped_excess.append(gw - gw // args[9])
            return out

    counter = FlopCounterMode(display=False)
    with counter, _Spy():
        harness.step()
    return counter.get_total_flops() - sum(grouped_excess), sdpa_calls


def _arg(func, args: tuple, kwargs: dict | None, name: str, default):
    for i, a in enumerate(func._schema.arguments):
        if a.name == name:
            return args[i] if i < len(args) else (kwargs or {}).get(name, default)
    return default


CASES = [("mlp", "inference"), ("convnet", "inference"), ("convnet", "train"), ("depthwise", "train"),
         ("transformer_block", "inference"), ("gpt2", "inference"), ("bert", "inference"), ("gpt2", "train")]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    cache = {}

    def get(name: str, mode: str):
        if (name, mode) not in cache:
            path = model_file(tmp_path_factory, name)
            out = tmp_path_factory.mktemp(f"{name}-{mode}") / "run"
            run, _ = profile_target(ProfileOptions(target=path, out=out, mode=mode, steps=STEPS, warmup=1,
                                                   peak_bw=20.0, peak_flops=["100"], threads=1))
            cache[(name, mode)] = (path, run)
        return cache[(name, mode)]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("name,mode", CASES)
def test_tensor_core_flops_match_flopcounter(runs, name, mode):
    path, run = runs(name, mode)
    ops = run.to_pandas()
    mask = ops["family"].isin(TENSOR_FAMILIES)
    ours = float((ops.loc[mask, "flops_per_call"] * ops.loc[mask, "calls"]).sum()) / STEPS
    theirs, sdpa = flopcounter_per_step(path, mode)
    if mode == "inference":
        theirs += sum(sdpa)  # FlopCounterMode has no formula for the CPU flash-attention op
    else:
        # train: FlopCounterMode also misses the CPU SDPA backward (2.5x the forward, its own formula)
        theirs += sum(sdpa) * 3.5
    assert ours == pytest.approx(theirs, rel=1e-9), (ours, theirs)
    assert ours > 0


@pytest.mark.slow
@pytest.mark.parametrize("name,mode", CASES)
def test_cost_model_covers_the_time(runs, name, mode):
    _, run = runs(name, mode)
    assert run.summary["ops_covered_time_share"] >= 0.98, run.to_pandas().loc[
        run.to_pandas()["flops_per_call"].isna(), ["op", "time_share"]].head().to_dict("records")


def test_bound_classes_are_what_a_person_expects(tmp_path):
    path = write_model(tmp_path, """
        import torch

        class Model(torch.nn.Module):
            def forward(self, a, b, x):
                c = a @ b                                  # large GEMM
                y = torch.relu(x) + 1.0                    # element-wise on 16 MiB
                z = torch.nn.functional.layer_norm(x, x.shape[-1:])  # a norm
                v = x.view(-1)                             # a view
                t = a[:2, :2] * 2                          # a tiny op
                return c, y, z, v, t

        def get_inputs():
            return [torch.randn(1024, 1024), torch.randn(1024, 1024), torch.randn(2048, 2048)]
    """)
    # realistic ceilings for a 2-core VM: 30 GB/s, 400 GFLOP/s (ridge ~13 FLOP/B)
    run, _ = profile_target(ProfileOptions(target=path, out=tmp_path / "run", steps=2, warmup=1, peak_bw=30.0,
                                           peak_flops=["400"]))
    def bounds(op: str) -> set[str]:
        found = set(run.to_pandas().loc[run.to_pandas()["op"] == op, "bound"])
        assert found, op
        return found

    assert bounds("aten::mm") == {"compute"}
    assert bounds("aten::clamp_min") == {"memory"}  # relu runs as clamp_min on CPU...
    assert bounds("aten::relu") == {"overhead"}  # ...so relu itself only dispatches
    assert bounds("aten::add") == {"memory"}
    assert bounds("aten::native_layer_norm") == {"memory"}
    assert bounds("aten::view") == {"overhead"}
    assert bounds("aten::mul") == {"overhead"}  # 4 elements
    ops = run.to_pandas().set_index("op")
    assert math.isclose(float(ops.loc["aten::mm", "flops_per_call"]), 2 * 1024**3)


def test_depthwise_backward_is_memory_bound(tmp_path):
    # issue 8: depthwise 3x3, 128 channels, on [8,128,56,56] in train mode (a pointwise conv first, so the
    # depthwise conv's backward computes grad_input too; a ReLU after it, so its grad_output is a real
    # tensor, not the loss's expanded scalar)
    path = write_model(tmp_path, """
        import torch
        import torch.nn as nn

        def get_model():
            return nn.Sequential(nn.Conv2d(128, 128, 1), nn.Conv2d(128, 128, 3, padding=1, groups=128),
                                 nn.ReLU())

        def get_inputs():
            return [torch.randn(8, 128, 56, 56)]
    """)
    # ridge point 500 GFLOP/s / 100 GB/s = 5 FLOP/B
    run, _ = profile_target(ProfileOptions(target=path, out=tmp_path / "run", mode="train", steps=1, warmup=1,
                                           peak_bw=100.0, peak_flops=["500"]))
    ops = run.to_pandas()
    row = ops[(ops["op"] == "aten::convolution_backward") & ops["input_dims"].str.contains("[128, 1, 3, 3]",
                                                                                          regex=False)]
    assert len(row) == 1
    row = row.iloc[0]
    # grad_input and grad_weight: 2 * 8*56*56 * 9 * 128 each (FlopCounterMode: 7.457e9 in all)
    assert row["flops_per_call"] == 2 * (2 * 8 * 56 * 56 * 9 * 128) == 115_605_504
    act = 8 * 128 * 56 * 56 * 4
    assert row["bytes_per_call"] == 3 * act + 2 * 128 * 9 * 4 + 128 * 4
    assert row["bound"] == "memory"
