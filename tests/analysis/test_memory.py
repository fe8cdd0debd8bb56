"""Memory: profile's untimed memory pass (never the timed pass) and traces recorded with profile_memory:
per-row bytes allocated and freed, per-step peak with the op at the peak and what was alive then, and the
memory-growth finding for a model that keeps a tensor from every step."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from conftest import TRACES, line_of, write_model
from opscope.analysis.trace_file import analyze_trace_file
from opscope.capture.torch_profiler import MEMORY_STEPS, profile_target
from opscope.findings import memory_growth
from opscope.target.specs import ProfileOptions

FAST = dict(steps=2, warmup=1, peak_bw=20.0, peak_flops=["100"], threads=1)

LEAKY = """
    import torch
    from torch import nn

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(64, 64)
            self.history = []

        def forward(self, x):
            y = torch.relu(self.fc(x))
            self.history.append(y * 2)  # the leak: 32 x 64 floats per step
            return y

    def get_inputs():
        return [torch.randn(32, 64)]
"""

CLEAN = """
    import torch
    from torch import nn

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(64, 64)

        def forward(self, x):
            y = torch.relu(self.fc(x))
            return y * 2  # a fresh [32, 64] float32 tensor every call: 8192 bytes

    def get_inputs():
        return [torch.randn(32, 64)]
"""


@pytest.fixture(scope="module")
def leaky(tmp_path_factory):
    folder = tmp_path_factory.mktemp("leaky")
    path = write_model(folder, LEAKY)
    run, _ = profile_target(ProfileOptions(target=path, out=folder / "run", mode="train", **FAST))
    return path, run


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    folder = tmp_path_factory.mktemp("clean")
    path = write_model(folder, CLEAN)
    run, _ = profile_target(ProfileOptions(target=path, out=folder / "run", mode="train", **FAST))
    return path, run


def test_a_tensor_kept_every_step_is_a_memory_growth_finding(leaky):
    path, run = leaky
    where = f"{path.name}:{line_of(path, '# the leak')}"
    found = [f for f in run.findings if f["rule"] == "memory-growth"]
    assert len(found) == 1, run.findings
    f = found[0]
    assert f["source_location"].endswith(where) and f["op"] == "aten::mul"
    assert "8 KiB per step" in f["message"] and "never freed" in f["message"]
    assert f["est_savings_us"] is None and f["severity"] in ("high", "medium")
    memory = json.loads((run.path / "summary.json").read_text())["memory"]
    assert memory["source"] == "memory pass" and memory["steps"] == MEMORY_STEPS
    assert memory["growth_bytes_per_step"] >= 32 * 64 * 4
    ends = [s["end_allocated_bytes"] for s in memory["per_step"]]
    assert [b - a for a, b in zip(ends, ends[1:], strict=False)] == [memory["growth_bytes_per_step"]] * 2


def test_a_clean_model_has_no_memory_growth(clean):
    path, run = clean
    assert not [f for f in run.findings if f["rule"] == "memory-growth"]
    memory = run.summary["memory"]
    assert memory["growth_bytes_per_step"] == 0
    ends = [s["end_allocated_bytes"] for s in memory["per_step"]]
    assert len(set(ends[1:])) == 1


def test_peak_memory_and_the_op_at_the_peak_are_in_the_summary(clean):
    path, run = clean
    memory = json.loads((run.path / "summary.json").read_text())["memory"]
    per_step = memory["per_step"]
    assert len(per_step) == MEMORY_STEPS
    assert memory["peak_allocated_bytes"] == max(s["peak_allocated_bytes"] for s in per_step) > 0
    assert memory["peak_op"].startswith("aten::") and memory["peak_source_location"]
    assert memory["device"] == "cpu" and "note" in memory
    alive = memory["alive_at_peak"]
    assert alive and all(a["bytes"] > 0 and a["tensors"] >= 1 for a in alive)
    assert sum(a["bytes"] for a in alive) + memory["alive_at_peak_other_bytes"] == pytest.approx(
        memory["peak_allocated_bytes"])
    # the model's output (y * 2) is alive while backward runs
    assert any(a["op"] == "aten::mul" and a["source_location"].endswith(f":{line_of(path, 'return y * 2')}")
               for a in alive)


def test_rows_carry_the_bytes_they_allocate(clean):
    path, run = clean
    ops = run.to_pandas()
    mul = ops[(ops["op"] == "aten::mul") & ops["source_location"].str.endswith(f":{line_of(path, 'return y * 2')}")
              & (ops["input_strides"] == "[[64, 1], []]")]  # the forward y * 2 (its backward has the line too)
    assert len(mul) == 1 and mul["alloc_bytes_per_call"].iloc[0] == 32 * 64 * 4
    assert mul["freed_bytes_per_call"].iloc[0] <= 8  # at most the wrapped Python scalar
    views = ops[ops["op"].isin(["aten::t", "aten::view", "aten::detach"])]
    assert (views["alloc_bytes_per_call"].fillna(0) == 0).all()  # views allocate nothing
    columns = list(ops.columns)
    assert columns[-4:] == ["module", "module_class", "alloc_bytes_per_call", "freed_bytes_per_call"]


def test_the_timed_pass_records_no_memory(clean):
    _, run = clean
    with gzip.open(run.path / "trace.json.gz") as f:
        doc = json.load(f)
    assert not any(e.get("name") == "[memory]" for e in doc["traceEvents"])
    assert not doc.get("profile_memory")


def test_analyze_reads_memory_and_modules_from_a_shared_trace(tmp_path):
    trace = TRACES / "h100_bert-small_bf16.json.gz"
    run = analyze_trace_file(trace, out=tmp_path / "run")
    memory = run.summary["memory"]
    doc = json.loads(gzip.decompress(trace.read_bytes()))
    cuda = [e for e in doc["traceEvents"] if e.get("name") == "[memory]" and e["args"]["Device Type"] == 1]
    assert memory["source"] == "trace" and memory["device"] == "cuda"
    assert memory["peak_allocated_bytes"] == max(e["args"]["Total Allocated"] for e in cuda)
    # the peak is reached while the vocabulary projection writes its [141, 30522] bf16 logits
    assert memory["peak_op"] == "aten::addmm"
    assert memory["peak_module"] == "BertOnlyMLMHead.BertLMPredictionHead.Linear"
    head = run.to_pandas()[run.to_pandas()["input_dims"].str.startswith("[[30522]")]
    assert head["alloc_bytes_per_call"].iloc[0] >= 141 * 30522 * 2
    assert memory["alive_at_peak"][0]["op"] == "aten::addmm"
    assert run.to_pandas()["module"].str.startswith("BertModel.BertEncoder.BertLayer_").any()
    assert not [f for f in run.findings if f["rule"] == "memory-growth"]  # one step: no step-over-step evidence


def synthetic_trace(path: Path, steps: int, leak: bool) -> Path:
    """A CPU trace with `steps` ProfilerStep annotations; in each, aten::mul (model.py:12)
    allocates 4096 bytes (module Linear under the root Net), kept when `leak`, and aten::add allocates and frees 1024 bytes."""
    events: list[dict] = []
    total = 0
    addr = 1000
    for s in range(steps):
        t0 = s * 1000.0
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s}", "pid": 1, "tid": 1,
                       "ts": t0, "dur": 900.0})
        events.append({"ph": "X", "cat": "python_function", "name": "nn.Module: Net_0", "pid": 1, "tid": 1,
                       "ts": t0 + 1, "dur": 800.0})
        events.append({"ph": "X", "cat": "python_function", "name": "nn.Module: Linear_0", "pid": 1, "tid": 1,
                       "ts": t0 + 2, "dur": 700.0})
        events.append({"ph": "X", "cat": "python_function", "name": "model.py(12): forward", "pid": 1, "tid": 1,
                       "ts": t0 + 3, "dur": 600.0})
        for k, (name, size, free) in enumerate([("aten::mul", 4096, not leak), ("aten::add", 1024, True)]):
            start = t0 + 10 + 100 * k
            events.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": start, "dur": 50.0,
                           "args": {"Input Dims": [[32, 32], []], "Input type": ["float", "Scalar"],
                                    "Input Strides": [[32, 1], []], "Concrete Inputs": ["", "2"]}})
            addr += 64
            total += size
            events.append({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1, "tid": 1,
                           "ts": start + 5, "args": {"Total Reserved": 0, "Total Allocated": total, "Bytes": size,
                                                      "Addr": addr, "Device Id": -1, "Device Type": 0}})
            if free:
                total -= size
                events.append({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1,
                               "tid": 1, "ts": start + 60,
                               "args": {"Total Reserved": 0, "Total Allocated": total, "Bytes": -size,
                                        "Addr": addr, "Device Id": -1, "Device Type": 0}})
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def test_memory_growth_from_a_trace(tmp_path):
    run = analyze_trace_file(synthetic_trace(tmp_path / "leak.json", 4, leak=True), out=tmp_path / "leak",
                             peak_bw=20.0, peak_flops=["100"])
    memory = run.summary["memory"]
    assert memory["growth_bytes_per_step"] == 4096
    assert [s["end_allocated_bytes"] for s in memory["per_step"]] == [4096, 8192, 12288, 16384]
    # each step's peak: its kept tensors plus the add's 1 KiB, reached during the add
    assert [s["peak_allocated_bytes"] for s in memory["per_step"]] == [5120, 9216, 13312, 17408]
    assert memory["peak_op"] == "aten::add" and memory["peak_step"] == 3
    assert memory["alive_at_peak"][0] == {"op": "aten::mul", "source_location": "model.py:12", "module": "Linear",
                                          "bytes": 16384.0, "tensors": 4}
    found = [f for f in run.findings if f["rule"] == "memory-growth"]
    assert len(found) == 1 and found[0]["source_location"] == "model.py:12" and found[0]["op"] == "aten::mul"
    mul = run.to_pandas()[run.to_pandas()["op"] == "aten::mul"]
    assert list(mul["alloc_bytes_per_call"]) == [4096] and list(mul["freed_bytes_per_call"]) == [0]
    add = run.to_pandas()[run.to_pandas()["op"] == "aten::add"]
    assert list(add["alloc_bytes_per_call"]) == [1024] and list(add["freed_bytes_per_call"]) == [0]

    run = analyze_trace_file(synthetic_trace(tmp_path / "ok.json", 4, leak=False), out=tmp_path / "ok",
                             peak_bw=20.0, peak_flops=["100"])
    assert run.summary["memory"]["growth_bytes_per_step"] == 0
    assert not [f for f in run.findings if f["rule"] == "memory-growth"]
    # too few steps to call it growth
    run = analyze_trace_file(synthetic_trace(tmp_path / "short.json", memory_growth.MIN_STEPS - 1, leak=True),
                             out=tmp_path / "short", peak_bw=20.0, peak_flops=["100"])
    assert not [f for f in run.findings if f["rule"] == "memory-growth"]
