"""The kernel benchmark harness: statistics, interleaving, byte counts and goals on hand-computed
values; the tuning cache round trip; and a quick `opscope kernels --bench` run end to end (no timing
is asserted: only that the numbers are consistent with each other)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from conftest import run_cli
from opscope.kernels import bench as kb
from opscope.kernels.catalog import find
from reference_kernels import tuning


def test_summary_statistics_by_hand() -> None:
    t = kb.summarize([0.001, 0.002, 0.003, 0.004, 0.005])
    assert t.median_ms == pytest.approx(3.0)
    assert t.p20_ms == pytest.approx(1.8)   # (5 - 1) * 0.2 = 0.8 of the way from 1 to 2
    assert t.p80_ms == pytest.approx(4.2)


def test_interleaved_rounds_rotate_the_order() -> None:
    calls: list[str] = []
    cands = {n: (lambda n=n: calls.append(n)) for n in ("a", "b", "c")}
    timings = kb.interleaved(cands, repeats=3)
    warm = kb.WARMUP * 3
    assert calls[:warm] == ["a"] * kb.WARMUP + ["b"] * kb.WARMUP + ["c"] * kb.WARMUP
    assert calls[warm:] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert all(len(t.samples_ms) == 3 for t in timings.values())


def test_traffic_is_inputs_once_plus_output_once() -> None:
    x, w = torch.zeros(4, 8), torch.zeros(8)
    assert kb.traffic_bytes((x, w, 1e-6), torch.zeros(4, 8)) == 128 + 32 + 128
    assert kb.traffic_bytes((torch.zeros(2, dtype=torch.bfloat16),), torch.zeros(1)) == 4 + 4


def test_goal_checks_mark_met_and_missed() -> None:
    t = kb.Timing(1.0, 1.0, 1.0)
    r = kb.CaseResult("rms_norm", "c", "float32", [[2]], 8, {"kernel": t}, gbps=21.0, pct_bandwidth=75.0,
                      ratios={"vs_eager": 1.6, "vs_compiled": 0.8}, grain=0)
    got = {g["goal"]: g["met"] for g in kb.goal_checks([r])}
    assert got == {"vs_eager >= 1.5": True, "vs_compiled >= 0.9": False, "% of bandwidth >= 70": True}


def test_in_cache_cut_keeps_rows_whole_and_broadcast_operands_aligned() -> None:
    """The bound probe's cut: a band of middle rows of the first tensor, as many as keep the traffic under
    the limit, cut alike in every tensor dim broadcasting aligns with it; a bias (aligned with the row
    dim) stays whole; a 3-D case is cut at its second dim when one slice of the first is over the limit,
    and its 2-D mask along with it; a case with no band of 2 rows under the limit is not cut."""
    x, y, bias = torch.randn(4096, 64), torch.randn(4096, 64), torch.randn(64)
    add = lambda a, b, c, s: (a + b + c) * s  # noqa: E731
    cut, half, rows = kb.in_cache_args((x, y, bias, 0.5), add, limit=96 * 1024)
    # 3 tensors of rows x 64 floats (x, y, out) + the 256-byte bias <= 96 KiB: 127 rows, from the middle
    assert rows == 127 and cut[0].shape == (127, 64) and cut[1].shape == (127, 64) and half[0].shape == (63, 64)
    assert cut[2] is not None and torch.equal(cut[2], bias) and cut[3] == 0.5
    assert torch.equal(cut[0], x[1984:2111]) and torch.equal(cut[1], y[1984:2111])
    assert kb.traffic_bytes(cut, add(*cut)) <= 96 * 1024
    att, mask = torch.randn(4, 256, 256), torch.randn(256, 256)  # one head is 768 KiB with its mask and output
    cut, half, rows = kb.in_cache_args((att, 0.5, mask), lambda a, s, m: a * s + m, limit=96 * 1024)
    assert rows == 32 and cut[0].shape == (1, 32, 256) and cut[2].shape == (32, 256)
    assert torch.equal(cut[0], att[1:2, 112:144]) and torch.equal(cut[2], mask[112:144])
    wide = torch.randn(8, 1, 4096)  # broadcast to 8 x 8 x 4096 by the (8, 1) operand: one row is over 64 KiB
    assert kb.in_cache_args((wide, torch.randn(8, 1)), torch.add, limit=64 * 1024) is None
    assert kb.in_cache_args((torch.randn(4096),), torch.neg) is None  # 1-D: no rows to cut


def test_bound_is_the_lower_of_the_memory_and_the_in_cache_rate() -> None:
    assert kb.bound(120.0, 35.0) == "memory" and kb.bound(20.0, 35.0) == "compute"
    assert kb.bound(None, 35.0) is None and kb.bound(20.0, None) is None
    t = kb.Timing(1.0, 1.0, 1.0)
    slow = kb.CaseResult("bias_gelu", "c", "float32", [[2]], 8, {"kernel": t}, gbps=16.0, pct_bandwidth=16 / 35 * 100,
                         ratios={}, grain=0, in_cache_gbps=20.0, bound="compute")
    fast = kb.CaseResult("sum", "c", "float32", [[2]], 8, {"kernel": t}, gbps=28.0, pct_bandwidth=80.0,
                         ratios={}, grain=0, in_cache_gbps=120.0, bound="memory")
    got = {(g["kernel"], g["goal"]): (g["value"], g["met"]) for g in kb.goal_checks([slow, fast])}
    # compute-bound: the goal against what its arithmetic allows (16 of 20 GB/s), not the memory's 35
    assert got == {("bias_gelu", "% of its in-cache rate >= 70 (compute-bound here)"): (80.0, True),
                   ("sum", "% of bandwidth >= 70"): (80.0, True)}
    assert slow.to_json()["bound"] == "compute" and slow.to_json()["in_cache_gbps"] == 20.0


def test_in_cache_rate_of_a_real_kernel_is_a_rate() -> None:
    """The probe on a real op: a positive rate, or None when noise made the two cuts indistinguishable
    (never a negative or zero rate); the thread count is put back."""
    before = torch.get_num_threads()
    rate = kb.in_cache_gbps(torch.add, (torch.randn(1024, 256), torch.randn(1024, 256)), threads=2)
    assert rate is None or rate > 0
    assert torch.get_num_threads() == before


def test_bench_verdict_is_against_the_better_of_aten_and_compile() -> None:
    won = kb.verdict({"vs_native": 1.3, "vs_eager": 2.0, "vs_compiled": 1.1}, 75.0)
    assert won == {"vs_aten": 1.3, "vs_compile": 1.1, "vs_best": 1.1, "pct_bandwidth": 75.0, "suggested": True,
                   "why": None}
    lost = kb.verdict({"vs_eager": 1.6, "vs_compiled": 0.81}, 40.0)  # no native op: aten runs the composite
    assert lost["vs_aten"] == 1.6 and lost["vs_best"] == 0.81 and lost["suggested"] is False
    assert lost["why"] == "torch.compile is faster: the kernel runs at 0.81x its speed (40% of the measured bandwidth)"
    aten = kb.verdict({"vs_native": 0.69, "vs_eager": 0.9, "vs_compiled": 1.2}, None)
    assert aten["suggested"] is False and aten["why"].startswith("aten is faster: the kernel runs at 0.69x")
    tie = kb.verdict({"vs_native": 0.98, "vs_compiled": 2.0}, 85.0)  # both at the memory's limit: said so
    assert tie["suggested"] is False and "both are at the memory's limit" in tie["why"]
    assert "memory's limit" not in lost["why"]
    t = kb.Timing(1.0, 1.0, 1.0)
    r = kb.CaseResult("softmax", "c", "float32", [[2]], 8, {"kernel": t}, gbps=1.0, pct_bandwidth=None,
                      ratios={"vs_native": 0.5}, grain=0)
    doc = r.to_json()
    assert [k for k in doc][:8] == ["kernel", "case", "vs_aten", "vs_compile", "vs_best", "pct_bandwidth",
                                    "suggested", "why"]


def test_tuning_cache_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import reference_kernels

    monkeypatch.setenv("OPSCOPE_CACHE_DIR", str(tmp_path))
    tuning.reset()
    try:
        m = next(m for m in reference_kernels.manifests() if m.name == "swiglu")
        args = (torch.randn(64, 256), torch.randn(64, 256))
        chosen = kb.tune(m, args, repeats=3)
        space = m.tune["cpu"]["grain_size"]
        assert chosen["grain_size"] in space and set(chosen["candidates_ms"]) == {str(g) for g in space}
        tuning.reset()
        assert tuning.knob("swiglu", "swiglu_forward", args, "grain_size") == chosen["grain_size"]
        # one tuning serves the shape class (elements and last dim rounded up to powers of two)
        near = (torch.randn(60, 250), torch.randn(60, 250))
        assert tuning.key("swiglu", "swiglu_forward", near) == tuning.key("swiglu", "swiglu_forward", args)
        assert tuning.knob("swiglu", "swiglu_forward", (torch.randn(3, 3), torch.randn(3, 3)), "grain_size") == 0
        doc = json.loads((tmp_path / "kernels-tuning.json").read_text())
        assert doc["format"] == tuning.FORMAT and len(doc["entries"]) == 1
        assert kb.ensure_tuned(m, near) == doc["entries"][tuning.key("swiglu", "swiglu_forward", args)]  # no re-tune
        torch.testing.assert_close(reference_kernels.swiglu(*args), torch.nn.functional.silu(args[0]) * args[1])
    finally:
        tuning.reset()


def test_first_use_hands_each_untuned_key_to_the_tuner_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPSCOPE_CACHE_DIR", str(tmp_path))
    tuning.reset()
    met: list[str] = []

    def tuner(kernel: str, fn: str, args: tuple) -> None:
        met.append(tuning.key(kernel, fn, args))
        if args[0].shape[0] == 64:  # tunes one class only: the other stays untuned, and is not handed over again
            tuning.store(kernel, fn, args, {"grain_size": 16})

    try:
        big, small = (torch.randn(64, 256), torch.randn(64, 256)), (torch.randn(3, 3), torch.randn(3, 3))
        assert tuning.knob("swiglu", "swiglu_forward", big, "grain_size") == 0  # outside the block: no tuner
        with tuning.first_use(tuner):
            for _ in range(3):
                assert tuning.knob("swiglu", "swiglu_forward", big, "grain_size") == 16
                assert tuning.knob("swiglu", "swiglu_forward", small, "grain_size") == 0
        assert met == [tuning.key("swiglu", "swiglu_forward", big), tuning.key("swiglu", "swiglu_forward", small)]
        assert tuning.knob("swiglu", "swiglu_forward", (torch.randn(3, 3), torch.randn(3, 3)), "grain_size") == 0
    finally:
        tuning.reset()


def test_first_use_tuning_keeps_cpu_forwards_and_tunes_them_later(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPSCOPE_CACHE_DIR", str(tmp_path))
    tuning.reset()
    deferred = kb.FirstUseTuning()
    args = (torch.randn(256, 512), torch.randn(256, 512))
    try:
        with tuning.first_use(deferred):
            tuning.knob("swiglu", "swiglu_backward", (torch.randn(4, 4),) * 3, "grain_size")  # backward: not tuned
            tuning.knob("swiglu", "swiglu_forward", (torch.empty(4, 4, device="meta"),) * 2, "grain_size")  # meta
            assert tuning.knob("swiglu", "swiglu_forward", args, "grain_size") == 0  # deferred: default for now
        assert list(deferred.pending) == [tuning.key("swiglu", "swiglu_forward", args)]
        kept = deferred.pending[tuning.key("swiglu", "swiglu_forward", args)][1]
        assert kept[0] is not args[0] and torch.equal(kept[0], args[0])  # a copy: the model may free or change its own
        lines = deferred.tune(budget_s=0.05)
        entry = tuning.lookup("swiglu", "swiglu_forward", args)
        assert entry is not None and entry["grain_size"] in kb.search_space(find("swiglu"))
        assert lines == [f"swiglu: grain size {entry['grain_size'] or 'default'} tuned on first use for 256x512, 256x512"]
        assert deferred.pending == {} and deferred.tune() == []
    finally:
        tuning.reset()


def test_tuning_keys_hold_machine_shape_class_and_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    a = (torch.randn(64, 256), torch.randn(256))
    k = tuning.key("bias_gelu", "bias_gelu_forward", a)
    assert tuning.machine() in k and "|e14.l8;e8.l8|float32|cpu|" in k
    assert tuning.key("bias_gelu", "bias_gelu_forward", tuple(t.double() for t in a)) != k  # dtype
    assert tuning.key("bias_gelu", "bias_gelu_forward", (torch.randn(64, 512), torch.randn(512))) != k  # class
    assert tuning.shape_class((torch.randn(4, 128, 1024), torch.randn(1024), "none")) == "e19.l10;e10.l10;a=none"
    # the arguments that pick a code path are part of the class (rows and columns, erf and tanh apart); floats not
    x = torch.randn(256, 512)
    assert tuning.key("sum", "sum_forward", (x, -1, False)) != tuning.key("sum", "sum_forward", (x, 0, False))
    assert tuning.shape_class((x, 0, False)) == "e17.l9;a=0;a=False"
    assert tuning.key("bias_gelu", "bias_gelu_forward", (x, x[0], "none")) != tuning.key(
        "bias_gelu", "bias_gelu_forward", (x, x[0], "tanh"))
    assert tuning.shape_class((x, x[0], 1e-5)) == tuning.shape_class((x, x[0], 1e-6)) == "e17.l9;e9.l9"
    monkeypatch.setattr(tuning, "_machine", "another cpu x64 aarch64")
    assert tuning.key("bias_gelu", "bias_gelu_forward", a) != k  # a cache copied from another machine finds nothing


@pytest.mark.parametrize("content", ["{not json", '{"format": 2, "entries": [1, 2]}',
                                     '{"format": 2, "entries": {"k": {"grain_size": "big"}}}', '"just a string"',
                                     '{"format": 2, "entries": {"k": {"block": 1000}}}',
                                     '{"format": 2, "entries": {"k": {"num_warps": 0}}}',
                                     '{"format": 2, "entries": {"k": {"num_stages": true}}}'])
def test_a_corrupt_tuning_cache_is_ignored_with_a_note(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       content: str) -> None:
    monkeypatch.setenv("OPSCOPE_CACHE_DIR", str(tmp_path))
    (tmp_path / "kernels-tuning.json").write_text(content)
    tuning.reset()
    try:
        args = (torch.randn(8, 8), torch.randn(8, 8))
        assert tuning.knob("swiglu", "swiglu_forward", args, "grain_size") == 0
        note = tuning.note()
        assert note is not None and "corrupt" in note and "\n" not in note
        tuning.store("swiglu", "swiglu_forward", args, {"grain_size": 4})  # the next store writes a fresh file
        tuning.reset()
        assert tuning.note() is None and tuning.knob("swiglu", "swiglu_forward", args, "grain_size") == 4
    finally:
        tuning.reset()


def test_an_older_format_is_ignored_with_a_note(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPSCOPE_CACHE_DIR", str(tmp_path))
    (tmp_path / "kernels-tuning.json").write_text('{"format": 1, "entries": {}}')
    tuning.reset()
    try:
        assert "another format" in (tuning.note() or "")
    finally:
        tuning.reset()


@pytest.mark.slow
def test_cli_tune_a_shape_with_a_corrupt_cache(tmp_path: Path) -> None:
    import os

    (tmp_path / "kernels-tuning.json").write_text("\x00garbage")
    env = {**os.environ, "OPSCOPE_CACHE_DIR": str(tmp_path)}
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "opscope", "kernels", "swiglu", "--tune", "--shape", "64x256",
                           "--shape", "64x256", "--json"], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.count("corrupt") == 1
    doc = json.loads(proc.stdout)
    (r,) = doc["results"]
    assert r["kernel"] == "swiglu" and r["shapes"] == [[64, 256], [64, 256]] and r["shape_class"] == "e14.l8;e14.l8"
    assert r["key"] in json.loads((tmp_path / "kernels-tuning.json").read_text())["entries"]
    bad = subprocess.run([sys.executable, "-m", "opscope", "kernels", "--tune", "--shape", "64x256"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert bad.returncode == 2 and "name it" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: gpu_check.sh tunes on it")
def test_cli_tune_on_cuda_without_a_gpu_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Triton launches are tuned on the GPU they will run on: none here, one line, exit 2, no cache."""
    monkeypatch.setenv("OPSCOPE_CACHE_DIR", str(tmp_path))
    proc = run_cli("kernels", "softmax", "--tune", "--device", "cuda")
    assert proc.returncode == 2 and "no GPU is available here" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "kernels-tuning.json").exists()


def test_tune_scale_multiplies_the_cases_like_bench(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--tune --scale F tunes the classes `--bench --scale F` will look up (gpu_check.sh: --scale 2)."""
    monkeypatch.setenv("OPSCOPE_CACHE_DIR", str(tmp_path))
    tuning.reset()
    try:
        doc = kb.tune_run(["swiglu"], [], scale=1 / 64, repeats=3)
        (r,) = doc["results"]
        assert r["shapes"] == [[64, 64], [64, 64]] and r["chosen"] == f"grain_size={r['grain_size']}"
        args = kb.make_args(find("swiglu"), find("swiglu").bench[0], scale=1 / 64)
        assert r["key"] == tuning.key("swiglu", "swiglu_forward", args) and doc["backend"] == "cpu"
    finally:
        tuning.reset()


@pytest.mark.slow
def test_cli_bench_quick_writes_consistent_results(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    proc = run_cli("kernels", "rms_norm", "--bench", "--quick", "--repeats", "3", "--peak-bw", "20", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "rms_norm" in proc.stdout and "goals met" in proc.stdout
    doc = json.loads((out / "kernels-bench.json").read_text())
    assert doc["machine"]["peak_bandwidth_gbps"] == 20 and doc["machine"]["torch"] == torch.__version__
    (r,) = doc["results"]
    t = r["timings"]
    assert set(t) == {"kernel", "native", "eager"}
    assert r["ratios"]["vs_eager"] == pytest.approx(t["eager"]["median_ms"] / t["kernel"]["median_ms"])
    assert r["gbps"] == pytest.approx(r["bytes"] / (t["kernel"]["median_ms"] * 1e-3) / 1e9)
    assert r["pct_bandwidth"] == pytest.approx(100 * r["gbps"] / 20)
    assert r["bytes"] == (256 * 256 * 2 + 256) * 4  # x read + y written, weight read, scale 1/16
    # the bound probe: 256 rows fit in cache, so it ran (a rate, or None when noise hid the difference)
    assert r["bound"] == (kb.bound(r["in_cache_gbps"], 20) if r["in_cache_gbps"] is not None else None)
    for cand in t.values():
        assert cand["p20_ms"] <= cand["median_ms"] <= cand["p80_ms"]
    # the case's verdict: torch.compile left out (--quick), so vs_best is vs aten (the native F.rms_norm)
    assert r["vs_aten"] == r["ratios"]["vs_native"] and r["vs_compile"] is None and r["vs_best"] == r["vs_aten"]
    assert r["suggested"] is (r["vs_best"] >= 1.0) and (r["suggested"] or r["why"])
    assert "suggested:" in proc.stdout
    rows = list(csv.DictReader((out / "kernels-bench.csv").open()))
    assert {row["candidate"] for row in rows} == {"kernel", "native", "eager"}
    assert all(row["torch"] == torch.__version__ for row in rows)


def test_cli_bench_scale_multiplies_every_dim(tmp_path: Path) -> None:
    """--scale 2 is how benchmarks/gpu_check.sh times 8192x8192 from the manifests' 4096x4096."""
    out = tmp_path / "bench"
    proc = run_cli("kernels", "sum", "--bench", "--scale", "0.03125", "--no-compile", "--repeats", "3",
                   "--peak-bw", "20", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((out / "kernels-bench.json").read_text())
    assert [r["shapes"] for r in doc["results"]] == [[[128, 128]]] * len(doc["results"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_cli_bench_on_cuda_without_a_gpu_says_so() -> None:
    proc = run_cli("kernels", "swiglu", "--bench", "--device", "cuda", "--peak-bw", "20")
    assert proc.returncode == 2
    assert "no GPU is available here" in proc.stderr and "Traceback" not in proc.stderr


def test_every_bench_input_is_on_the_benchmarks_device() -> None:
    """Masks and other tensors a kernel's bench_args builds follow the device the benchmark was given:
    on the H200 the causal mask was built on the CPU and the softmax case stopped with a traceback.
    The meta device stands in for the GPU here (no data, so even 16x1024x1024 costs nothing)."""
    from reference_kernels.manifest import load_manifests

    for manifest in load_manifests():
        for case in manifest.bench:
            args = kb.make_args(manifest, case, device="meta")
            built = [a for a in args if isinstance(a, torch.Tensor)]
            assert built and all(t.device.type == "meta" for t in built), (manifest.name, case.name)


def test_every_bench_case_passes_the_whole_signature() -> None:
    """A case's arguments are the op's every parameter, in order: what the CPU forward gets before its grain
    (a sum case without keepdim gave the grain as keepdim), and what the tuning key is made of, so that a
    case tuned is the class the op's calls look up (reference_kernels._dispatch passes every parameter)."""
    import re

    from reference_kernels.manifest import load_manifests

    for manifest in load_manifests():
        params = re.search(r"\((.*)\)", manifest.signature)
        assert params is not None
        arity = len(params.group(1).split(", "))
        for case in manifest.bench:
            args = kb.make_args(manifest, case, device="meta")
            assert len(args) == arity, (manifest.name, case.name, arity, len(args))
