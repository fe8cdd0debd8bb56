"""`opscope swap` and `opscope profile --try-swaps` through real subprocesses: a correct kernel passes and
reports a speedup; each deliberately wrong kernel fails verification (exit 1, the error table, no speed);
a kernel that takes only some calls falls back on the others, counted; a segfaulting kernel is a crash
with exit 1 that opscope survives; bundled kernels on a LLaMA-style block in train mode, next to
torch.compile; the results land in swap.json and in both reports. No timing is asserted."""

from __future__ import annotations

import csv
import json
import textwrap
from pathlib import Path

import pytest

from conftest import EXAMPLES, PEAKS, REPO, run_cli

FIXTURES = REPO / "tests" / "fixtures" / "swap"
MODEL = FIXTURES / "tiny_model.py"
KERNELS = FIXTURES / "kernels.py"
PROFILE_QUICK = ["--steps", "1", "--warmup", "0", "--threads", "1", *PEAKS]
QUICK = [*PROFILE_QUICK, "--repeats", "5"]

# defect -> the verification check that must fail for it
DEFECTS = {
    "off_by_small": "outputs",
    "zeros": "outputs",
    "nans": "outputs",
    "wrong_broadcast": "outputs",
    "mutates_input": "inputs unchanged",
    "ignores_dtype": "trap: device/dtype",
    "leaks_memory": "trap: memory growth",
    "racy": "trap: determinism",
}


def swap_doc(run_dir: Path) -> dict:
    return json.loads((run_dir / "swap.json").read_text())


def results(doc: dict) -> dict[str, dict]:
    return {r["label"].split(":")[-1]: r for r in doc["results"]}


@pytest.fixture(scope="module")
def add_kernels(tmp_path_factory):
    """One run of every aten::add.Tensor user kernel: the correct one, the partial one and each defect."""
    folder = tmp_path_factory.mktemp("swap-add")
    kernels = ["good_add", "add_vector_only", *DEFECTS]
    args = [a for k in kernels for a in ("--kernel", f"{KERNELS}:{k}")]
    proc = run_cli("swap", str(MODEL), "--op", "aten::add.Tensor", *args, *QUICK, "--out", str(folder / "run"),
                   cwd=folder)
    return proc, folder / "run"


@pytest.mark.slow
def test_correct_kernel_passes_and_reports_a_speedup(add_kernels, monkeypatch):
    proc, run = add_kernels
    good = results(swap_doc(run))["good_add"]
    assert good["status"] == "passed" and good["verification"]["passed"]
    assert good["calls"] == {"swapped": 2, "fallback": 0}  # x + bias and the residual add, per step
    assert good["max_abs_err"] == 0 and good["out_of_tolerance"] == 0
    checks = {c["check"] for c in good["verification"]["checks"]}
    assert {"outputs", "inputs unchanged", "parameters unchanged", "swap reverted cleanly", "trap: device/dtype",
            "trap: memory reuse", "trap: memory growth", "trap: determinism", "trap: arguments unchanged"} <= checks
    assert len(good["op_level"]) == 2
    for row in good["op_level"]:
        assert row["speedup"] > 0 and row["original"]["median_ms"] > 0 and row["swapped"]["median_ms"] > 0
        assert row["bytes"] > 0 and row["pct_peak_before"] is not None and row["pct_peak_after"] is not None
    e2e = good["end_to_end"]
    assert e2e["speedup"] > 0 and e2e["repeats"] >= 5 and e2e["original"]["p20_ms"] <= e2e["original"]["p80_ms"]
    assert "Swap results" in proc.stdout
    monkeypatch.setenv("COLUMNS", "200")  # the labels are whole on a wide terminal (a narrow one wraps them)
    assert "kernels.py:good_add " in run_cli("report", str(run)).stdout


@pytest.mark.slow
def test_kernel_taking_some_shapes_falls_back_on_the_others(add_kernels):
    _, run = add_kernels
    partial = results(swap_doc(run))["add_vector_only"]
    assert partial["status"] == "passed"
    assert partial["calls"] == {"swapped": 1, "fallback": 1}
    assert [(s["swapped"], s["fallback"]) for s in partial["sites"]] == [(1, 1)]
    assert [row["call"] for row in partial["op_level"]] == ["[4, 64, 64] float32, [64] float32"]


@pytest.mark.slow
@pytest.mark.parametrize("defect", sorted(DEFECTS))
def test_wrong_kernel_fails_verification_with_exit_1(add_kernels, defect):
    proc, run = add_kernels
    assert proc.returncode == 1, proc.stderr
    assert "verification failed for" in proc.stderr and defect in proc.stderr
    r = results(swap_doc(run))[defect]
    assert r["status"] == "failed" and not r["verification"]["passed"]
    failed = {c["check"] for c in r["verification"]["checks"] if not c["passed"]}
    assert DEFECTS[defect] in failed, failed
    assert r["op_level"] == [] and r["end_to_end"] is None  # no speed for a failed swap
    assert "Verification of the swaps that failed" in proc.stdout


@pytest.mark.slow
def test_kernel_without_backward_fails_in_train_mode(tmp_path):
    proc = run_cli("swap", str(MODEL), "--module", "Gated", "--mode", "train", "--kernel", f"{KERNELS}:good_gated",
                   "--kernel", f"{KERNELS}:gated_without_grad", *QUICK, "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    by = results(swap_doc(tmp_path / "run"))
    assert by["good_gated"]["status"] == "passed"
    assert {c["check"] for c in by["good_gated"]["verification"]["checks"]} >= {"parameter gradients", "input gradients",
                                                                                 "trap: autograd"}
    bad = by["gated_without_grad"]
    failed = {c["check"]: c for c in bad["verification"]["checks"] if not c["passed"]}
    assert "parameter gradients" in failed
    assert "no gradient" in failed["parameter gradients"]["detail"] or "missing" in failed["parameter gradients"]["detail"]


@pytest.mark.slow
def test_segfaulting_kernel_is_a_crash_with_exit_1(tmp_path):
    proc = run_cli("swap", str(MODEL), "--op", "aten::add.Tensor", "--kernel", f"{KERNELS}:segfaults", *QUICK,
                   cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("opscope: error:")]
    assert len(lines) == 1 and "segmentation fault (SIGSEGV)" in lines[0] and "segfaults" in lines[0]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "reports").exists() or not any((tmp_path / "reports").iterdir())


LLAMA = """
    import sys
    sys.path.insert(0, {examples!r})
    import torch
    from llama_block import Block

    def get_model():
        torch.manual_seed(0)
        return Block(dim=64, n_heads=2, hidden=160)

    def get_inputs():
        return [torch.randn(2, 32, 64)]
"""


@pytest.mark.slow
def test_bundled_kernels_on_a_llama_block_in_train_mode_next_to_compile(tmp_path, monkeypatch):
    monkeypatch.setenv("OPSCOPE_CACHE_DIR", str(tmp_path / "cache"))  # nothing tuned yet: swap tunes on first use
    model = tmp_path / "llama_small.py"
    model.write_text(textwrap.dedent(LLAMA.format(examples=str(EXAMPLES))))
    out = tmp_path / "run"
    proc = run_cli("swap", str(model), "--mode", "train", "--kernel", "rms_norm", "--kernel", "swiglu",
                   "--kernel", "rms_norm+swiglu", "--kernel", "compile", *QUICK, "--out", str(out), cwd=tmp_path,
                   timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    by = {r["label"]: r for r in swap_doc(out)["results"]}
    assert all(r["status"] == "passed" for r in by.values()), {k: r["message"] for k, r in by.items()}
    assert [m["description"] for m in by["rms_norm"]["mechanisms"]] == ["module *RMSNorm"]
    assert by["rms_norm"]["mechanisms"][0]["sites"] == ["attention_norm", "ffn_norm"]
    assert [m["description"] for m in by["swiglu"]["mechanisms"]] == ["pattern silu_mul"]
    assert by["rms_norm+swiglu"]["calls"] == {"swapped": 3, "fallback": 0}
    for label in ("rms_norm", "swiglu"):
        checks = {c["check"] for c in by[label]["verification"]["checks"]}
        assert {"parameter gradients", "input gradients", "trap: autograd"} <= checks
        assert by[label]["op_level"] and by[label]["end_to_end"]["speedup"] > 0
    # the benchmark timed tuned kernels: the profile's in-context timing tuned their shape classes (or else the
    # swap, on first use: tests/kernels/test_kernels_bench.py), and no class was tuned twice
    tuned = json.loads((tmp_path / "cache" / "kernels-tuning.json").read_text())["entries"]
    assert any("|rms_norm|rms_norm_forward|" in k for k in tuned) and any("|swiglu|swiglu_forward|" in k for k in tuned)
    lines = [n for r in by.values() for n in r["notes"] if "tuned on first use" in n]
    assert len(lines) == len(set(lines))
    assert by["compile"]["op_level"] == [] and by["compile"]["end_to_end"]["compile_s"] > 0
    report = run_cli("report", str(out), "--html", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    page = (out / "report.html").read_text()
    section = page.split('id="swap"')[1]
    assert all(label in section for label in by)


@pytest.mark.slow
def test_try_swaps_adds_every_candidates_results_to_the_run(tmp_path):
    out = tmp_path / "run"
    proc = run_cli("profile", str(EXAMPLES / "transformer_block.py"), "--try-swaps", *PROFILE_QUICK, "--out", str(out),
                   cwd=tmp_path, timeout=900)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    candidates = [c["kernel"] for c in summary["swap_candidates"]]
    assert {"layer_norm", "bias_gelu", "broadcast_add"} <= set(candidates)
    doc = swap_doc(out)
    assert [r["label"] for r in doc["results"]] == candidates
    assert results(doc)["layer_norm"]["status"] == "passed"
    assert "Swap results" in proc.stdout
    for c in summary["swap_candidates"]:  # each listed: a suggestion (faster here) or apart, slower or not measured
        assert {"faster": "Swap candidates", "slower here": "Slower here", "not measured here": "Not measured here"}[
            c["verdict"]] in proc.stdout
    report = run_cli("report", str(out), "--html", cwd=tmp_path)
    assert report.returncode == 0
    section = (out / "report.html").read_text().split('id="swap"')[1]
    assert "layer_norm" in section and "bias_gelu" in section


@pytest.mark.slow
def test_swap_without_kernel_tries_the_candidates_and_json_is_swap_json(tmp_path):
    out = tmp_path / "run"
    proc = run_cli("swap", str(MODEL), *QUICK, "--json", "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc == swap_doc(out)
    assert {r["label"] for r in doc["results"]} == {"swiglu", "broadcast_add"}
    assert doc["format_version"] == 1 and doc["mode"] == "inference" and doc["method"]["seeds"] == 3


@pytest.mark.slow
def test_profile_lists_the_swap_candidates_of_its_top_ops(tmp_path):
    proc = run_cli("profile", str(MODEL), *PROFILE_QUICK, "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert {c["kernel"] for c in summary["swap_candidates"]} == {"swiglu", "broadcast_add"}
    for c in summary["swap_candidates"]:  # a suggestion only where it measured faster on the model's shapes
        shown = f"{c['kernel']} {c['measured_speedup']:.2f}x" if c["measured_speedup"] is not None else c["kernel"]
        assert shown in proc.stdout and (c["verdict"] == "faster") == ((c["measured_speedup"] or 0) > 1.0)
    assert not (tmp_path / "run" / "swap.json").exists()  # candidates only; --try-swaps runs them


@pytest.mark.slow
def test_a_kernel_that_matches_nothing_is_bad_input(tmp_path):
    proc = run_cli("swap", str(MODEL), "--kernel", "layer_norm", *QUICK, cwd=tmp_path)
    assert proc.returncode == 2
    assert "nothing in the model matches layer_norm" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "reports").exists() or not any((tmp_path / "reports").iterdir())


def test_try_swaps_with_nsight_is_one_line(tmp_path):
    proc = run_cli("profile", str(MODEL), "--try-swaps", "--nsys", *PROFILE_QUICK, cwd=tmp_path)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "--try-swaps cannot be combined with --nsys/--ncu" in lines[0], proc.stderr
    assert not (tmp_path / "reports").exists()


@pytest.mark.parametrize("extra, needle", [(["--script"], "instead of the script"),
                                           (["--nproc-per-node", "2"], "without --nproc-per-node")])
def test_try_swaps_with_a_script_or_ranks_is_one_line(tmp_path, extra, needle):
    proc = run_cli("profile", str(MODEL), "--try-swaps", *extra, *PROFILE_QUICK, cwd=tmp_path)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "--try-swaps works on a model file in one process" in lines[0], proc.stderr
    assert needle in lines[0] and not (tmp_path / "reports").exists()


SPAWNING = '''
import subprocess
import torch

def spawning_add(a, b):
    """Correct, but starts a process in a session of its own on every call (issue 23, item 8)."""
    subprocess.Popen(["sleep", "3602", "{marker}"], start_new_session=True)
    return torch.add(a, b)
'''


@pytest.mark.slow
def test_processes_a_kernel_starts_are_ended_when_swap_is_done(tmp_path):
    marker = f"opscope-test-{tmp_path.name}"
    kernel = tmp_path / "spawning.py"
    kernel.write_text(SPAWNING.format(marker=marker))
    proc = run_cli("swap", str(MODEL), "--op", "aten::add.Tensor", "--kernel", f"{kernel}:spawning_add", *QUICK,
                   "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    left = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _cmdline_has(p, marker)]
    assert not left, f"{len(left)} processes the kernel started outlived opscope"


def _cmdline_has(proc_dir: Path, marker: str) -> bool:
    try:
        return marker.encode() in (proc_dir / "cmdline").read_bytes()
    except OSError:
        return False


HF_LLAMA = """\
import torch
from transformers import LlamaConfig, LlamaForCausalLM


def get_model():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, vocab_size=128))


def get_inputs():
    return [torch.randint(0, 128, (2, 16))]
"""


@pytest.mark.slow
def test_swiglu_finds_the_mlps_of_a_stock_hugging_face_llama(tmp_path):
    # LlamaMLP: down_proj(act_fn(gate_proj(x)) * up_proj(x)), act_fn a SiLUActivation module; built from a
    # config, nothing downloaded
    pytest.importorskip("transformers")
    model = tmp_path / "hf_llama.py"
    model.write_text(HF_LLAMA)
    out = tmp_path / "run"
    proc = run_cli("swap", str(model), "--kernel", "swiglu", *QUICK, "--out", str(out), cwd=tmp_path, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (result,) = swap_doc(out)["results"]
    assert result["status"] == "passed", result["message"]
    assert [m["description"] for m in result["mechanisms"]] == ["pattern silu_mul"]
    assert result["mechanisms"][0]["sites"] == ["model.layers.0.mlp: mul", "model.layers.1.mlp: mul"]
    assert result["calls"] == {"swapped": 2, "fallback": 0}
    # the profile that swap ran suggests it too: the act_fn's silu and the MLP's mul, each layer's
    summary = json.loads((out / "summary.json").read_text())
    swiglu = next(c for c in summary["swap_candidates"] if c["kernel"] == "swiglu")
    with (out / "ops.csv").open(newline="") as f:
        ops = [row["op"] for row in csv.DictReader(f)]
    assert sorted(ops[i] for i in swiglu["rows"]) == ["aten::mul"] * 2 + ["aten::silu"] * 2


ACT_MLP = """\
import torch
import torch.nn as nn


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down, self.act = nn.Linear(16, 64), nn.Linear(64, 16), nn.GELU()

    def forward(self, x):
        return self.down(self.act(self.up(x)))


def get_model():
    torch.manual_seed(0)
    return MLP()


def get_inputs():
    return [torch.randn(4, 8, 16)]
"""


@pytest.mark.slow
def test_the_bias_gelu_profile_suggests_is_the_one_swap_applies(tmp_path):
    # the forward names only self.act: profile lists bias_gelu, and swap must find it there too
    model = tmp_path / "act_mlp.py"
    model.write_text(ACT_MLP)
    out = tmp_path / "run"
    proc = run_cli("swap", str(model), "--kernel", "bias_gelu", *QUICK, "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert [(c["kernel"], c["replaces"]) for c in summary["swap_candidates"]] == [
        ("bias_gelu", [{"kind": "pattern", "target": "linear_bias_gelu"}])]
    (result,) = swap_doc(out)["results"]
    assert result["status"] == "passed", result["message"]
    assert result["mechanisms"] == [{"kind": "pattern", "description": "pattern linear_bias_gelu",
                                     "sites": ["(the model): act"]}]
    assert result["calls"] == {"swapped": 1, "fallback": 0}


@pytest.mark.slow
def test_rms_norm_passes_on_a_stock_hugging_face_llama(tmp_path, monkeypatch):
    """LlamaRMSNorm computes in float32 whatever it is given: the dtype trap must not hold its rounding
    against an exact kernel."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = tmp_path / "hf_llama.py"
    model.write_text(textwrap.dedent(HF_LLAMA))
    proc = run_cli("swap", str(model), "--kernel", "rms_norm", *QUICK, "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (result,) = swap_doc(tmp_path / "run")["results"]
    assert result["status"] == "passed", result["message"]
    assert result["calls"] == {"swapped": 5, "fallback": 0}  # 2 per layer and the final norm
    dtype_trap = next(c for c in result["verification"]["checks"] if c["check"] == "trap: device/dtype")
    assert dtype_trap["passed"]


@pytest.mark.slow
def test_kernels_that_exit_or_add_submodules_fail_verification_with_exit_1(tmp_path):
    proc = run_cli("swap", str(MODEL), "--module", "Gated", "--kernel", f"{KERNELS}:gated_calling_exit",
                   "--kernel", f"{KERNELS}:gated_adding_a_submodule", "--kernel", f"{KERNELS}:good_gated", *QUICK,
                   "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr
    by = results(swap_doc(tmp_path / "run"))
    assert "sys.exit(0)" in by["gated_calling_exit"]["message"]
    assert by["gated_adding_a_submodule"]["status"] == "failed"
    assert by["good_gated"]["status"] == "passed"  # the model was put back after the kernel before it
