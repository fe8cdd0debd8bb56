"""Spec-table matching, ceiling selection and user overrides (opscope.machine.peaks; no torch needed)."""

from __future__ import annotations

import json
import sys

import pytest

from opscope.errors import OpscopeError
from opscope.machine.peaks import (
    DTYPE_KEYS,
    GPU_SPECS,
    Peaks,
    apply_overrides,
    ceiling_key,
    gpu_peaks,
    match_gpu,
    parse_peak_flops,
    unknown_gpu_warning,
)


@pytest.mark.parametrize(
    ("device_name", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM"),
        ("NVIDIA H100", "NVIDIA H100 SXM"),
        ("NVIDIA H100 PCIe", "NVIDIA H100 PCIe"),
        ("NVIDIA H100 NVL", "NVIDIA H100 NVL"),
        ("NVIDIA H200", "NVIDIA H200 SXM"),
        ("NVIDIA H200 NVL", "NVIDIA H200 NVL"),
        ("NVIDIA B200", "NVIDIA B200"),
        ("NVIDIA A100-SXM4-40GB", "NVIDIA A100 SXM4 40GB"),
        ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 SXM4 80GB"),
        ("NVIDIA A100-PCIE-40GB", "NVIDIA A100 PCIe 40GB"),
        ("NVIDIA A100 80GB PCIe", "NVIDIA A100 PCIe 80GB"),
        ("NVIDIA A10G", "NVIDIA A10G"),
        ("NVIDIA A10", "NVIDIA A10"),
        ("NVIDIA L4", "NVIDIA L4"),
        ("NVIDIA L40S", "NVIDIA L40S"),
        ("NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4090"),
        ("AMD Instinct MI300X VF", "AMD Instinct MI300X"),
        ("AMD Instinct MI300X", "AMD Instinct MI300X"),
        ("AMD Instinct MI325X", "AMD Instinct MI325X"),
        # ROCm's name for both parts; the MI250X's figures (see GPU_SPECS)
        ("AMD Instinct MI250X/MI250", "AMD Instinct MI250X (one GCD)"),
        ("AMD Instinct MI250X", "AMD Instinct MI250X (one GCD)"),
        ("AMD Instinct MI250", "AMD Instinct MI250 (one GCD)"),
    ],
)
def test_match_gpu(device_name: str, expected: str) -> None:
    spec = match_gpu(device_name)
    assert spec is not None, device_name
    assert spec.name == expected


@pytest.mark.parametrize(
    "device_name",
    ["", "NVIDIA GeForce GTX 1080", "NVIDIA L40", "NVIDIA H20", "NVIDIA GH200 480GB", "NVIDIA GB200",
     "NVIDIA GeForce RTX 4090 D", "AMD Instinct MI210", "Tesla T4", "cpu"],
)
def test_unknown_gpus_do_not_match(device_name: str) -> None:
    assert match_gpu(device_name) is None
    if device_name:
        assert gpu_peaks(device_name) is None


def test_h100_sxm_numbers() -> None:
    peaks = gpu_peaks("NVIDIA H100 80GB HBM3")
    assert peaks is not None
    assert peaks.memory_bandwidth_gbps == 3350.0
    assert peaks.flops_gflops["bfloat16"] == pytest.approx(989_400)
    assert peaks.flops_gflops["float8"] == pytest.approx(1_978_900)
    assert peaks.flops_gflops["tfloat32"] == pytest.approx(494_700)
    assert peaks.flops_gflops["float32"] == pytest.approx(66_900)
    assert peaks.origin == {"memory_bandwidth": "spec-table", "flops": "spec-table"}
    pcie = gpu_peaks("NVIDIA H100 PCIe")
    assert pcie is not None and pcie.memory_bandwidth_gbps == 2000.0
    assert pcie.flops_gflops["bfloat16"] < peaks.flops_gflops["bfloat16"]


def test_a100_memory_sizes_distinguished() -> None:
    bw = {name: gpu_peaks(name).memory_bandwidth_gbps for name in
          ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe", "NVIDIA A100-PCIE-40GB")}
    assert bw == {"NVIDIA A100-SXM4-40GB": 1555.0, "NVIDIA A100-SXM4-80GB": 2039.0,
                  "NVIDIA A100 80GB PCIe": 1935.0, "NVIDIA A100-PCIE-40GB": 1555.0}
    assert "float8" not in gpu_peaks("NVIDIA A100-SXM4-80GB").flops_gflops  # Ampere has no FP8


def test_l4_and_l40s_are_distinct() -> None:
    l4, l40s = match_gpu("NVIDIA L4"), match_gpu("NVIDIA L40S")
    assert l4 is not None and l40s is not None and l4 is not l40s
    assert l4.memory_bandwidth_gbps == 300.0 and l40s.memory_bandwidth_gbps == 864.0


def test_spec_table_is_consistent() -> None:
    names = [s.name for s in GPU_SPECS]
    assert len(names) == len(set(names))
    for spec in GPU_SPECS:
        assert spec.vendor in ("nvidia", "amd")
        assert spec.memory_bandwidth_gbps > 0
        assert set(spec.flops_gflops) <= set(DTYPE_KEYS)
        assert "float32" in spec.flops_gflops and "bfloat16" in spec.flops_gflops
        # dense tensor-core rates are never below the vector fp32 rate
        for key in ("tfloat32", "bfloat16", "float16", "float8"):
            if key in spec.flops_gflops:
                assert spec.flops_gflops[key] >= spec.flops_gflops["float32"], (spec.name, key)
        if "float8" in spec.flops_gflops:
            assert spec.flops_gflops["float8"] == pytest.approx(2 * spec.flops_gflops["bfloat16"], rel=0.03)
        # dense INT8 runs at least at the FP8 rate (GeForce: twice, FP8 with fp32 accumulate) and the 16-bit one
        if "int8" in spec.flops_gflops:
            assert spec.flops_gflops["int8"] >= spec.flops_gflops.get("float8", 0)
            assert spec.flops_gflops["int8"] >= spec.flops_gflops["bfloat16"]
        # the vector FP64 rate is given only where it is below the FP64 tensor-core one (B200: the same)
        if "float64_vector" in spec.flops_gflops:
            assert spec.flops_gflops["float64_vector"] <= spec.flops_gflops["float64"]
        # each entry matches its own canonical name
        assert match_gpu(spec.name) is spec, spec.name


@pytest.mark.parametrize(
    ("family", "dtype", "kernels", "expected"),
    [
        ("matmul", "bfloat16", "", "bfloat16"),
        ("matmul", "float16", "sm90_xmma_gemm_f16f16_f16f32_f32_tn_n", "float16"),
        ("attention", "float8", "", "float8"),
        ("conv", "bfloat16", "", "bfloat16"),
        ("matmul", "float32", "sm80_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x16", "tfloat32"),
        ("matmul", "float32", "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>", "tfloat32"),
        ("conv", "float32", "aten_a;sm80_xmma_fprop_implicit_gemm_TF32F32_tf32f32", "tfloat32"),
        ("matmul", "float32", "ampere_sgemm_128x64_tn", "float32"),
        ("matmul", "float32", "", "float32"),
        ("matmul", None, "", "float32"),
        ("elementwise", "bfloat16", "", "float32"),
        ("norm", "bfloat16", "", "float32"),
        ("reduction", "float16", "", "float32"),
        ("softmax", "float8", "", "float32"),
        ("elementwise", "float32", "some_tf32_named_kernel", "float32"),
        ("matmul", "float64", "", "float64"),
        ("conv", "float64", "", "float64"),
        ("elementwise", "float64", "", "float64_vector"),
        ("reduction", "float64", "", "float64_vector"),
        ("norm", "float64", "", "float64_vector"),
        ("matmul", "int8", "", "int8"),
        ("elementwise", "int8", "", "float32"),
    ],
)
def test_ceiling_key(family: str, dtype: str | None, kernels: str, expected: str) -> None:
    assert ceiling_key(family, dtype, kernels) == expected


def test_flops_for_fallbacks() -> None:
    cpu = Peaks(30.0, {"float32": 400.0, "bfloat16": 2700.0}, {"memory_bandwidth": "measured", "flops": "measured"})
    assert cpu.flops_for("float32") == 400.0
    assert cpu.flops_for("tfloat32") == 400.0
    assert cpu.flops_for("float16") == 2700.0
    assert cpu.flops_for("float8") == 2700.0
    assert cpu.flops_for("float64") == 400.0
    a100 = gpu_peaks("NVIDIA A100-SXM4-40GB")
    assert a100.flops_for("float8") == a100.flops_gflops["float16"]
    assert a100.flops_for("float64") == a100.flops_gflops["float64"]
    assert Peaks(None, {}, {}).flops_for("float32") is None
    assert Peaks(None, {"bfloat16": 1.0}, {}).flops_for("float32") is None  # never a tensor peak for fp32
    # float64_vector -> float64 (one FMA unit does both: CPUs, GPUs without FP64 tensor cores) -> float32
    assert Peaks(30.0, {"float32": 400.0, "float64": 200.0}, {}).flops_for("float64_vector") == 200.0
    assert cpu.flops_for("float64_vector") == 400.0
    # int8 without a figure (a CPU): the 16-bit tensor rate, then float32
    assert cpu.flops_for("int8") == 2700.0
    assert Peaks(30.0, {"float32": 400.0}, {}).flops_for("int8") == 400.0
    assert gpu_peaks("NVIDIA A10G").flops_for("int8") == gpu_peaks("NVIDIA A10G").flops_gflops["float16"]


@pytest.mark.parametrize(("device_name", "vector", "tensor", "int8"), [
    ("NVIDIA A100-SXM4-80GB", 9_700, 19_500, 624_000),
    ("NVIDIA H100 80GB HBM3", 33_500, 66_900, 1_978_900),
    ("NVIDIA H100 PCIe", 26_000, 51_000, 1_513_000),
    ("NVIDIA H100 NVL", 30_000, 60_000, 1_670_500),
    ("NVIDIA H200", 33_500, 66_900, 1_978_900),
    ("NVIDIA H200 NVL", 30_000, 60_000, 1_670_500),
    ("NVIDIA B200", 37_000, 37_000, 4_500_000),
    ("AMD Instinct MI250X/MI250", 23_950, 47_850, 191_500),
    ("AMD Instinct MI250", 22_650, 45_250, 181_050),
    ("AMD Instinct MI300X VF", 81_700, 163_400, 2_614_900),
    ("AMD Instinct MI325X", 81_700, 163_400, 2_614_900),
])
def test_float64_vector_and_int8_ceilings(device_name: str, vector: float, tensor: float, int8: float) -> None:
    peaks = gpu_peaks(device_name)
    # an fp64 element-wise op is held against the vector rate, an fp64 GEMM against the tensor-core one
    assert peaks.flops_for(ceiling_key("elementwise", "float64")) == pytest.approx(vector)
    assert peaks.flops_for(ceiling_key("matmul", "float64")) == pytest.approx(tensor)
    assert peaks.flops_for(ceiling_key("matmul", "int8")) == pytest.approx(int8)


def test_parse_peak_flops_good() -> None:
    assert parse_peak_flops(["1000"]) == {"*": 1000.0}
    assert parse_peak_flops(["bfloat16=989000", "float32=67000"]) == {"bfloat16": 989000.0, "float32": 67000.0}
    assert parse_peak_flops(["bf16=1e6,tf32=5e5", " fp8 = 2e6 "]) == {"bfloat16": 1e6, "tfloat32": 5e5, "float8": 2e6}
    assert parse_peak_flops([]) == {}
    assert parse_peak_flops(["int8=624000", "fp64_vector=9700"]) == {"int8": 624000.0, "float64_vector": 9700.0}


@pytest.mark.parametrize("bad", ["", "=100", "bfloat16=", "bfloat16=abc", "int4=100", "-5", "0", "bf16=nan",
                                 "float32=inf", "bfloat16:100"])
def test_parse_peak_flops_bad(bad: str) -> None:
    if bad == "":
        assert parse_peak_flops([bad]) == {}  # empty items are skipped, not an error
        return
    with pytest.raises(OpscopeError) as info:
        parse_peak_flops([bad])
    message = str(info.value)
    assert "\n" not in message and "--peak-flops" in message


def test_apply_overrides_origins() -> None:
    spec = gpu_peaks("NVIDIA H100 80GB HBM3")
    only_bw = apply_overrides(spec, 3000.0, None)
    assert only_bw.memory_bandwidth_gbps == 3000.0
    assert only_bw.origin == {"memory_bandwidth": "user", "flops": "spec-table"}
    assert spec.memory_bandwidth_gbps == 3350.0  # input not mutated

    some_flops = apply_overrides(spec, None, ["bfloat16=800000"])
    assert some_flops.origin == {"memory_bandwidth": "spec-table", "flops": "user"}
    assert some_flops.flops_gflops["bfloat16"] == 800000.0
    assert some_flops.flops_gflops["float8"] == spec.flops_gflops["float8"]

    bare = apply_overrides(None, None, ["1000", "bfloat16=5000"])
    assert bare.memory_bandwidth_gbps is None
    assert bare.origin == {"memory_bandwidth": "unknown", "flops": "user"}
    assert bare.flops_gflops == {**dict.fromkeys(DTYPE_KEYS, 1000.0), "bfloat16": 5000.0}

    nothing = apply_overrides(None, None, None)
    assert nothing.memory_bandwidth_gbps is None and nothing.flops_gflops == {}
    assert nothing.origin == {"memory_bandwidth": "unknown", "flops": "unknown"}

    for bad_bw in (0.0, -1.0, float("nan")):
        with pytest.raises(OpscopeError):
            apply_overrides(spec, bad_bw, None)
    with pytest.raises(OpscopeError):
        apply_overrides(spec, None, ["nonsense=1"])


def test_peaks_json_round_trip_matches_contract() -> None:
    peaks = apply_overrides(gpu_peaks("NVIDIA L40S"), 800.0, None)
    doc = json.loads(json.dumps(peaks.to_json()))
    assert set(doc) == {"memory_bandwidth_gbps", "flops_gflops", "origin"}
    assert set(doc["origin"]) == {"memory_bandwidth", "flops"}
    assert doc["origin"] == {"memory_bandwidth": "user", "flops": "spec-table"}
    assert isinstance(doc["memory_bandwidth_gbps"], float)
    assert all(isinstance(v, float) for v in doc["flops_gflops"].values())
    assert set(doc["flops_gflops"]) <= set(DTYPE_KEYS)
    back = Peaks.from_json(doc)
    assert back == peaks
    assert Peaks.from_json({}).to_json() == {
        "memory_bandwidth_gbps": None, "flops_gflops": {},
        "origin": {"memory_bandwidth": "unknown", "flops": "unknown"},
    }


def test_unknown_gpu_warning_is_one_line() -> None:
    line = unknown_gpu_warning("NVIDIA Mystery 9000")
    assert "\n" not in line
    assert "NVIDIA Mystery 9000" in line and "--peak-bw" in line and "--peak-flops" in line


def test_hardware_does_not_import_torch() -> None:
    import subprocess

    code = "import sys, opscope.machine.peaks; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
