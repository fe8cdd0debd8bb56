"""`opscope profile` of compiled models on CPU (issue 25): each inductor C++ kernel a row with FLOPs, bytes,
a bound, the user's line and module; `--compile MODE`; eager vs compiled with `compare`."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from conftest import PEAKS, REPO, run_cli

COMPILED_BLOCK = REPO / "examples" / "compiled_block.py"
EAGER_BLOCK = REPO / "examples" / "transformer_block.py"
BLOCK_MODULES = {"ln1", "qkv", "proj", "ln2", "fc1", "fc2"}

pytestmark = pytest.mark.slow


def read_ops(run: Path) -> list[dict[str, str]]:
    with open(run / "ops.csv", newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def compiled_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("compiled") / "run"
    proc = run_cli("profile", str(COMPILED_BLOCK), "--steps", "3", "--warmup", "1", "--out", str(out), *PEAKS,
                   timeout=600)
    assert proc.returncode == 0, proc.stderr
    return out


def test_every_cpp_kernel_is_a_costed_row_at_the_users_line_and_module(compiled_run: Path) -> None:
    ops = read_ops(compiled_run)
    cpp = [r for r in ops if "cpp_fused_" in r["op"]]
    assert len(cpp) >= 3  # the two layer norms and the GELU, at least
    for r in cpp:
        assert float(r["flops_per_call"]) > 0 and float(r["bytes_per_call"]) > 0, r["op"]
        assert r["bound"] in ("memory", "compute", "overhead"), r["op"]
        assert "compiled_block.py:" in r["source_location"], r["op"]
        assert "_orig_mod" not in r["module"]
        assert "TORCH_TRACE log" in r["note"]
        assert r["module_class"], r["op"]  # inside the model, every one
    norms = {r["module"] for r in cpp if "layer_norm" in r["op"]}
    assert norms == {"ln1", "ln2"}
    # extern kernels too: the Linear layers' addmm at their modules, never the compile wrapper
    assert {r["module"] for r in ops if r["op"] == "aten::addmm"} == {"qkv", "proj", "fc1", "fc2"}
    summary = json.loads((compiled_run / "summary.json").read_text())
    assert summary["ops_covered_time_share"] >= 0.95
    with open(compiled_run / "modules.csv", newline="") as f:
        modules = {r["module"]: r["module_class"] for r in csv.DictReader(f)}
    assert set(modules) >= BLOCK_MODULES and modules[""] == "Block"
    assert not any("_orig_mod" in m for m in modules)
    meta = json.loads((compiled_run / "meta.json").read_text())
    assert meta["compile"]["mode"] is None and meta["compile"]["by"] == "model"
    assert (compiled_run / "torch_trace.log.gz").is_file()
    (entry,) = json.loads((compiled_run / "summary.json").read_text())["compile"]
    assert entry["graph_breaks"] == 0 and entry["compile_time_s"] > 0


def test_compile_modes_and_eager_vs_compiled_per_module(tmp_path: Path) -> None:
    eager = tmp_path / "eager"
    proc = run_cli("profile", str(EAGER_BLOCK), "--steps", "2", "--warmup", "1", "--out", str(eager), *PEAKS)
    assert proc.returncode == 0, proc.stderr
    runs = {}
    for mode in ("default", "reduce-overhead", "max-autotune"):
        out = tmp_path / mode
        proc = run_cli("profile", str(EAGER_BLOCK), "--compile", mode, "--steps", "2", "--warmup", "1",
                       "--out", str(out), *PEAKS, timeout=900)
        assert proc.returncode == 0, proc.stderr
        compile_meta = json.loads((out / "meta.json").read_text())["compile"]
        assert (compile_meta["mode"], compile_meta["by"]) == (mode, "opscope")
        cpp = [r for r in read_ops(out) if "cpp_fused_" in r["op"]]
        assert cpp, mode
        # a kernel of the block's own ops (the residual adds, no submodule) is the Block's, as in eager, not
        # outside the model: the profiler records no module around the forward opscope compiled
        assert all(r["module_class"] for r in cpp), mode
        assert any(r["module"] == "" and r["module_class"] == "Block" for r in cpp), mode
        if mode == "reduce-overhead":
            assert "CUDA graphs need a GPU" in proc.stderr
        runs[mode] = out
    proc = run_cli("compare", str(eager), str(runs["default"]), "--json")
    assert proc.returncode == 0, proc.stderr
    modules = {m["module"]: m for m in json.loads(proc.stdout)["modules"]}
    assert BLOCK_MODULES | {""} <= set(modules)
    for name in BLOCK_MODULES:
        m = modules[name]
        assert m["time_a_us"] > 0 and m["time_b_us"] > 0 and m["verdict"]
    text = run_cli("compare", str(eager), str(runs["default"]))
    assert text.returncode == 0 and "Modules" in text.stdout


def test_compile_mode_must_be_known(tmp_path: Path) -> None:
    proc = run_cli("profile", str(EAGER_BLOCK), "--compile", "fastest", "--out", str(tmp_path / "r"))
    assert proc.returncode == 2 and not (tmp_path / "r").exists()


def test_a_model_that_fails_to_compile_is_one_line_with_dynamos_reason(tmp_path: Path) -> None:
    model = tmp_path / "breaks.py"
    model.write_text(
        "import torch\n"
        "import torch.nn as nn\n\n\n"
        "class M(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.lin = nn.Linear(8, 8)\n\n"
        "    def forward(self, x):\n"
        "        y = self.lin(x)\n"
        "        if y.sum().item() > 0:  # a graph break, which fullgraph=True refuses\n"
        "            y = y * 2\n"
        "        return y\n\n\n"
        "def get_model():\n"
        "    return torch.compile(M(), fullgraph=True)\n\n\n"
        "def get_inputs():\n"
        "    return [torch.randn(2, 8)]\n")
    out = tmp_path / "run"
    proc = run_cli("profile", str(model), "--steps", "1", "--warmup", "1", "--out", str(out), *PEAKS)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "data-dependent" in errors[0]
    assert not out.exists()


@pytest.mark.parametrize(("model", "rule", "line", "says"), [
    # `if y.sum().item() > 0:` at line 12: dynamo's reason
    ("graph_break_model.py", "graph-break", 12, "Tensor.item()"),
    # `self.calls += 1` changes a Python attribute every call: the failed guard named
    ("recompile_model.py", "recompile", 12, "self.calls =="),
])
def test_graph_breaks_and_recompilations_are_findings_at_the_users_line(tmp_path: Path, model: str, rule: str,
                                                                         line: int, says: str) -> None:
    out = tmp_path / "run"
    proc = run_cli("profile", str(REPO / "tests" / "fixtures" / "compile" / model), "--steps", "2", "--warmup", "1",
                   "--out", str(out), *PEAKS)
    assert proc.returncode == 0, proc.stderr
    found = [f for f in json.loads((out / "findings.json").read_text()) if f["rule"] == rule]
    assert len(found) == 1
    assert found[0]["source_location"].endswith(f"{model}:{line}") and says in found[0]["message"]


def test_kernels_of_the_models_own_ops_are_the_models(tmp_path: Path) -> None:
    """examples/mlp.py compiled by opscope: the profiler recorded no module around the compiled forward, so
    the relu kernels (ops of MLP.forward itself, no submodule) were outside the model; they are the model's,
    as eager's clamp_min rows are."""
    out = tmp_path / "run"
    proc = run_cli("profile", str(REPO / "examples" / "mlp.py"), "--compile", "default", "--steps", "2",
                   "--warmup", "1", "--out", str(out), *PEAKS, timeout=600)
    assert proc.returncode == 0, proc.stderr
    relu = [r for r in read_ops(out) if "cpp_fused_relu" in r["op"]]
    assert relu and all((r["module"], r["module_class"]) == ("", "MLP") for r in relu), relu
    assert {r["module"] for r in read_ops(out) if r["op"] == "aten::addmm"} == {"fc1", "fc2", "fc3"}
