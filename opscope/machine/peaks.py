"""Hardware ceilings: the peak memory bandwidth and peak FLOP/s per dtype that the roofline compares against.

Where the numbers come from (recorded per run in meta.json "peaks"."origin"):
  - "spec-table": a GPU recognised by name in GPU_SPECS below (vendor datasheet numbers);
  - "measured":   this CPU, measured by opscope.machine.calibrate (cached);
  - "user":       --peak-bw / --peak-flops on the command line;
  - "unknown":    nothing applies (the value is null; percent-of-peak columns stay empty).

This module never imports torch: `opscope analyze` uses it on traces recorded elsewhere.

Units: bandwidth in GB/s (1e9 bytes/s), compute in GFLOP/s (1e9 FLOP/s; int8: 1e9 integer ops/s). Keys
of `flops_gflops` are opscope dtype names: float32, tfloat32, bfloat16, float16, float8, float64, int8, plus
float64_vector. On GPUs "float32" is the non-tensor (vector/CUDA-core) fp32 rate, "float64" the FP64
tensor-core (matrix) rate where the part has one, "float64_vector" the non-tensor FP64 rate (absent where
it equals "float64"); the other keys are dense (no 2:4 sparsity) tensor-core rates.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from opscope.costmodel.base import TENSOR_CORE_FAMILIES
from opscope.errors import OpscopeError
from opscope.units import number

DTYPE_KEYS: tuple[str, ...] = ("float32", "tfloat32", "bfloat16", "float16", "float8", "float64", "int8",
                               "float64_vector")
ORIGINS: tuple[str, ...] = ("measured", "spec-table", "user", "unknown")

# Spellings accepted on the command line for --peak-flops DTYPE=...
_DTYPE_ALIASES: dict[str, str] = {
    "float32": "float32", "fp32": "float32", "f32": "float32", "float": "float32",
    "tfloat32": "tfloat32", "tf32": "tfloat32",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float16": "float16", "fp16": "float16", "f16": "float16", "half": "float16",
    "float8": "float8", "fp8": "float8", "f8": "float8",
    "float64": "float64", "fp64": "float64", "f64": "float64", "double": "float64",
    "int8": "int8", "i8": "int8",
    "float64_vector": "float64_vector", "fp64_vector": "float64_vector",
}

# When a run needs a dtype's ceiling the peaks do not list, flops_for() tries these keys in order.
# - tfloat32 -> float32: without a TF32 figure the fp32 rate is the only honest ceiling we have.
# - float8 -> float16 -> bfloat16: hardware without an FP8 figure (A100, MI250X, most CPUs) runs fp8
#   matmuls by upcasting to 16 bits, so the 16-bit tensor rate bounds them.
# - float16 <-> bfloat16: the two 16-bit formats run at the same tensor-core rate on every GPU in the
#   table; on a CPU that was only measured in one of them, the other is the closest stand-in.
# - float64_vector -> float64: parts without FP64 tensor cores (and CPUs, where one FMA unit does both
#   DGEMM and vector work) have one FP64 rate, stored as float64.
# - int8 -> float16 -> bfloat16: where no INT8 figure exists (CPUs: `opscope calibrate` measures
#   floating-point GEMMs only; the A10G), the 16-bit tensor rate is the closest measured stand-in. INT8
#   runs at up to twice that (tensor cores, VNNI/AMX), so an int8 GEMM's % of peak may read up to 2x high.
# - everything ends at float32 (the vector peak), except float64, which falls back to float32 only when
#   no float64 figure exists (every GPU below has one; a CPU may not).
_FALLBACKS: dict[str, tuple[str, ...]] = {
    "float32": (),
    "tfloat32": ("float32",),
    "bfloat16": ("float16", "float32"),
    "float16": ("bfloat16", "float32"),
    "float8": ("float16", "bfloat16", "float32"),
    "float64": ("float32",),
    "float64_vector": ("float64", "float32"),
    "int8": ("float16", "bfloat16", "float32"),
}


@dataclass
class Peaks:
    """The ceilings of one device. `memory_bandwidth_gbps` / a dtype missing from `flops_gflops` mean
    "not known" (percent-of-peak stays empty for what needs them)."""

    memory_bandwidth_gbps: float | None
    flops_gflops: dict[str, float] = field(default_factory=dict)
    origin: dict[str, str] = field(default_factory=lambda: {"memory_bandwidth": "unknown", "flops": "unknown"})

    def to_json(self) -> dict[str, Any]:
        """The meta.json "peaks" object: {"memory_bandwidth_gbps": float|null, "flops_gflops": {dtype: float},
        "origin": {"memory_bandwidth": ..., "flops": ...}} with origins from ORIGINS."""
        return {
            "memory_bandwidth_gbps": _positive(self.memory_bandwidth_gbps),
            "flops_gflops": {k: float(v) for k, v in self.flops_gflops.items() if _positive(v) is not None},
            "origin": {
                "memory_bandwidth": self.origin.get("memory_bandwidth", "unknown"),
                "flops": self.origin.get("flops", "unknown"),
            },
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Peaks:
        """Inverse of to_json; tolerant of missing keys and nulls (older or hand-written files)."""
        d = d or {}
        flops = {str(k): float(v) for k, v in (d.get("flops_gflops") or {}).items() if _positive(v) is not None}
        origin = d.get("origin") or {}
        return cls(
            memory_bandwidth_gbps=_positive(d.get("memory_bandwidth_gbps")),
            flops_gflops=flops,
            origin={
                "memory_bandwidth": str(origin.get("memory_bandwidth", "unknown")),
                "flops": str(origin.get("flops", "unknown")),
            },
        )

    def flops_for(self, dtype_key: str) -> float | None:
        """Peak GFLOP/s for a ceiling key (see ceiling_key), falling back along _FALLBACKS when the key is
        absent (tfloat32 -> float32; float8 and int8 -> float16 -> bfloat16 -> float32; float16 <->
        bfloat16; float64_vector -> float64 -> float32). None when nothing applies."""
        for key in (dtype_key, *_FALLBACKS.get(dtype_key, ("float32",))):
            value = self.flops_gflops.get(key)
            if value is not None and value > 0:
                return float(value)
        return None


def _positive(v: Any) -> float | None:
    """A positive finite number as a float, else None."""
    f = number(v)
    return f if f is not None and f > 0 else None


# --- GPU spec table ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuSpec:
    """One row of the spec table. `match`: substrings of the device name (as torch.cuda.get_device_name()
    reports it) that identify this part; `exclude`: substrings that rule it out. Both are compared after
    normalisation (lower case, every run of non-alphanumerics -> one space, padded with spaces), so
    " l4 " matches "NVIDIA L4" but not "NVIDIA L40S". The longest matching substring wins."""

    name: str
    vendor: str
    match: tuple[str, ...]
    exclude: tuple[str, ...]
    memory_bandwidth_gbps: float
    flops_gflops: dict[str, float]
    source: str = ""


def _tf(**tflops: float) -> dict[str, float]:
    """TFLOP/s keyword arguments -> GFLOP/s dict (readability: datasheets quote TFLOP/s)."""
    return {k: round(v * 1000.0, 3) for k, v in tflops.items()}


# Every number is dense (datasheets mark the 2:4-sparsity figures with "*"; those are halved here).
# float64 is the FP64 tensor-core rate where the part has one (what DGEMM can reach), else the vector rate;
# float64_vector the vector (non-tensor) FP64 rate, given where it differs. int8 is the dense INT8 tensor
# rate in TOPS.
GPU_SPECS: list[GpuSpec] = [
    # --- NVIDIA Ampere ------------------------------------------------------------------------------
    # NVIDIA A100 Tensor Core GPU datasheet (a100-80gb-datasheet-update, nvidia.com/content/dam/en-zz/
    # Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf) and the NVIDIA
    # A100 Tensor Core GPU Architecture whitepaper: FP64 9.7, FP64 TC 19.5, FP32 19.5, TF32 156 (312*),
    # BF16 312 (624*), FP16 312 (624*), INT8 624 TOPS (1,248*); no FP8. Bandwidth: 40GB SXM 1,555 GB/s, 40GB PCIe 1,555 GB/s,
    # 80GB SXM 2,039 GB/s, 80GB PCIe 1,935 GB/s. The PCIe cards have the same datasheet peaks (lower TDP).
    GpuSpec("NVIDIA A100 SXM4 40GB", "nvidia",
            match=(" a100 ", " a100 sxm4 40gb ", " a100 sxm 40gb ", " a100 sxm4 ", " a100 sxm "),
            exclude=(" pcie ",),
            memory_bandwidth_gbps=1555.0,
            flops_gflops=_tf(float32=19.5, tfloat32=156.0, bfloat16=312.0, float16=312.0, float64=19.5,
                             float64_vector=9.7, int8=624.0),
            source="NVIDIA A100 datasheet / A100 architecture whitepaper"),
    GpuSpec("NVIDIA A100 PCIe 40GB", "nvidia",
            match=(" a100 pcie ", " a100 pcie 40gb ", " a100 40gb pcie "),
            exclude=(" 80gb ",),
            memory_bandwidth_gbps=1555.0,
            flops_gflops=_tf(float32=19.5, tfloat32=156.0, bfloat16=312.0, float16=312.0, float64=19.5,
                             float64_vector=9.7, int8=624.0),
            source="NVIDIA A100 datasheet"),
    GpuSpec("NVIDIA A100 SXM4 80GB", "nvidia",
            match=(" a100 sxm4 80gb ", " a100 sxm 80gb ", " a100 80gb sxm ", " a100 80gb sxm4 ", " a100 80gb "),
            exclude=(" pcie ",),
            memory_bandwidth_gbps=2039.0,
            flops_gflops=_tf(float32=19.5, tfloat32=156.0, bfloat16=312.0, float16=312.0, float64=19.5,
                             float64_vector=9.7, int8=624.0),
            source="NVIDIA A100 80GB datasheet"),
    GpuSpec("NVIDIA A100 PCIe 80GB", "nvidia",
            match=(" a100 80gb pcie ", " a100 pcie 80gb "),
            exclude=(),
            memory_bandwidth_gbps=1935.0,
            flops_gflops=_tf(float32=19.5, tfloat32=156.0, bfloat16=312.0, float16=312.0, float64=19.5,
                             float64_vector=9.7, int8=624.0),
            source="NVIDIA A100 80GB datasheet"),
    # NVIDIA A10 Tensor Core GPU datasheet (nvidia.com/content/dam/en-zz/Solutions/Data-Center/a10/pdf/
    # a10-datasheet.pdf): FP32 31.2, TF32 62.5 (125*), BF16 125 (250*), FP16 125 (250*), INT8 250 TOPS
    # (500*), 600 GB/s.
    # FP64 is not on the datasheet: 1/32 of FP32 (GA102) = 0.98, derived.
    GpuSpec("NVIDIA A10", "nvidia", match=(" a10 ",), exclude=(),
            memory_bandwidth_gbps=600.0,
            flops_gflops=_tf(float32=31.2, tfloat32=62.5, bfloat16=125.0, float16=125.0, float64=0.976, int8=250.0),
            source="NVIDIA A10 datasheet"),
    # NVIDIA A10G (AWS G5 only; no public NVIDIA datasheet). 600 GB/s (AWS EC2 G5 page). Compute derived
    # from 80 SMs at 1,710 MHz boost: FP32 80*128*2*1.71 GHz = 35.0; tensor cores at the GA102 GeForce rate
    # with FP32 accumulate (512 dense FP16 FLOP/clk/SM) = 70 BF16/FP16, 35 TF32. Matches the A10 vs A10G
    # table in baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference; NOT verified against a vendor
    # document. FP64 1/32 of FP32. No INT8 figure is published: int8 falls back to the 16-bit rate.
    GpuSpec("NVIDIA A10G", "nvidia", match=(" a10g ",), exclude=(),
            memory_bandwidth_gbps=600.0,
            flops_gflops=_tf(float32=35.0, tfloat32=35.0, bfloat16=70.0, float16=70.0, float64=1.09),
            source="derived from SM count/clock; baseten.co A10 vs A10G (unverified)"),
    # --- NVIDIA Hopper ------------------------------------------------------------------------------
    # NVIDIA H100 Tensor Core GPU datasheet (resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-
    # datasheet) and the H100 product brief PB-11133-001 (PCIe): SXM: FP64 34, FP64 TC 67, FP32 67,
    # TF32 989*, BF16 1,979*, FP16 1,979*, FP8 3,958*, INT8 3,958* TOPS, 3.35 TB/s. Dense = half of "*":
    # 494.7 / 989.4 / 1,978.9 (the H100 whitepaper's dense table lists exactly these; its FP64 vector
    # figure is 33.5, the datasheet's 34).
    GpuSpec("NVIDIA H100 SXM", "nvidia",
            match=(" h100 ", " h100 sxm ", " h100 sxm5 ", " h100 80gb hbm3 ", " h100 sxm5 80gb "),
            exclude=(" pcie ", " nvl "),
            memory_bandwidth_gbps=3350.0,
            flops_gflops=_tf(float32=66.9, tfloat32=494.7, bfloat16=989.4, float16=989.4, float8=1978.9,
                             float64=66.9, float64_vector=33.5, int8=1978.9),
            source="NVIDIA H100 datasheet / H100 whitepaper"),
    # H100 PCIe (same datasheet): FP64 26, FP64 TC 51, FP32 51, TF32 756*, BF16/FP16 1,513*, FP8 3,026*,
    # INT8 3,026* TOPS, 2,000 GB/s (product brief: "greater than 2,000 GBps").
    GpuSpec("NVIDIA H100 PCIe", "nvidia", match=(" h100 pcie ",), exclude=(),
            memory_bandwidth_gbps=2000.0,
            flops_gflops=_tf(float32=51.0, tfloat32=378.0, bfloat16=756.5, float16=756.5, float8=1513.0,
                             float64=51.0, float64_vector=26.0, int8=1513.0),
            source="NVIDIA H100 datasheet / H100 PCIe product brief PB-11133-001"),
    # H100 NVL (per GPU, current datasheet column): FP64 30, FP64 TC 60, FP32 60, TF32 835*, BF16/FP16
    # 1,671*, FP8 3,341*, INT8 3,341* TOPS, 94 GB HBM3 at 3.9 TB/s. Quoted from the datasheet as remembered; the NVL
    # numbers could not be re-checked against the PDF in this session.
    GpuSpec("NVIDIA H100 NVL", "nvidia", match=(" h100 nvl ",), exclude=(),
            memory_bandwidth_gbps=3900.0,
            flops_gflops=_tf(float32=60.0, tfloat32=417.5, bfloat16=835.5, float16=835.5, float8=1670.5,
                             float64=60.0, float64_vector=30.0, int8=1670.5),
            source="NVIDIA H100 datasheet, NVL column (not re-verified)"),
    # NVIDIA H200 datasheet / product page (nvidia.com/en-us/data-center/h200): H200 SXM has H100 SXM's
    # compute (FP64 34, FP64 TC 67, FP32 67, TF32 989*, BF16/FP16 1,979*, FP8 3,958*, INT8 3,958* TOPS) with
    # 141 GB HBM3e at 4.8 TB/s. FP64 vector as the H100 SXM's (whitepaper 33.5).
    GpuSpec("NVIDIA H200 SXM", "nvidia", match=(" h200 ", " h200 sxm "), exclude=(" nvl ",),
            memory_bandwidth_gbps=4800.0,
            flops_gflops=_tf(float32=66.9, tfloat32=494.7, bfloat16=989.4, float16=989.4, float8=1978.9,
                             float64=66.9, float64_vector=33.5, int8=1978.9),
            source="NVIDIA H200 datasheet"),
    # H200 NVL (same page): FP64 30, FP64 TC 60, FP32 60, TF32 835*, BF16/FP16 1,671*, FP8 3,341*,
    # INT8 3,341* TOPS, 4.8 TB/s. Compute figures as remembered from the datasheet; not re-verified in this session.
    GpuSpec("NVIDIA H200 NVL", "nvidia", match=(" h200 nvl ",), exclude=(),
            memory_bandwidth_gbps=4800.0,
            flops_gflops=_tf(float32=60.0, tfloat32=417.5, bfloat16=835.5, float16=835.5, float8=1670.5,
                             float64=60.0, float64_vector=30.0, int8=1670.5),
            source="NVIDIA H200 datasheet, NVL column (not re-verified)"),
    # --- NVIDIA Blackwell ---------------------------------------------------------------------------
    # NVIDIA HGX B200 spec table (nvidia.com/en-us/data-center/hgx, "Individual Blackwell GPU
    # Specifications", tensor figures with sparsity): FP8 9 PF*, INT8 9 POPS*, FP16/BF16 4.5 PF*,
    # TF32 2.2 PF*, FP32 75 TF, FP64/FP64 TC 37 TF (one FP64 rate), 180 GB HBM3E at 7.7 TB/s. Dense = half
    # of "*". The INT8 figure as remembered from that table; not re-verified in this session.
    GpuSpec("NVIDIA B200", "nvidia", match=(" b200 ",), exclude=(),
            memory_bandwidth_gbps=7700.0,
            flops_gflops=_tf(float32=75.0, tfloat32=1100.0, bfloat16=2250.0, float16=2250.0, float8=4500.0,
                             float64=37.0, int8=4500.0),
            source="NVIDIA HGX B200 specifications"),
    # --- NVIDIA Ada Lovelace ------------------------------------------------------------------------
    # NVIDIA L4 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/l4): FP32 30.3, TF32 120*,
    # BF16/FP16 242*, FP8 485*, INT8 485* TOPS, 300 GB/s. FP64 not listed: 1/64 of FP32 (Ada) = 0.47,
    # derived.
    GpuSpec("NVIDIA L4", "nvidia", match=(" l4 ",), exclude=(),
            memory_bandwidth_gbps=300.0,
            flops_gflops=_tf(float32=30.3, tfloat32=60.0, bfloat16=121.0, float16=121.0, float8=242.5,
                             float64=0.473, int8=242.5),
            source="NVIDIA L4 datasheet"),
    # NVIDIA L40S datasheet (nvidia.com/en-us/data-center/l40s): FP32 91.6, TF32 183 (366*),
    # BF16/FP16 362.05 (733*), FP8 733 (1,466*), INT8 733 (1,466*) TOPS, 864 GB/s. FP64 1/64 of FP32 = 1.43,
    # derived.
    GpuSpec("NVIDIA L40S", "nvidia", match=(" l40s ",), exclude=(),
            memory_bandwidth_gbps=864.0,
            flops_gflops=_tf(float32=91.6, tfloat32=183.0, bfloat16=362.05, float16=362.05, float8=733.0,
                             float64=1.431, int8=733.0),
            source="NVIDIA L40S datasheet"),
    # NVIDIA Ada GPU Architecture whitepaper (images.nvidia.com/aem-dam/Solutions/geforce/ada/
    # nvidia-ada-gpu-architecture.pdf), GeForce RTX 4090 column: FP32 82.6, tensor rates with FP32
    # accumulate (what PyTorch uses): TF32 82.6, BF16/FP16 165.2, FP8 330.3, INT8 660.6 TOPS (sparse
    # figures double);
    # FP64 1.29 (1/64); 1,008 GB/s. The China-market 4090 D and the laptop part differ: excluded.
    GpuSpec("NVIDIA GeForce RTX 4090", "nvidia", match=(" rtx 4090 ",), exclude=(" 4090 d ", " laptop "),
            memory_bandwidth_gbps=1008.0,
            flops_gflops=_tf(float32=82.6, tfloat32=82.6, bfloat16=165.2, float16=165.2, float8=330.3,
                             float64=1.29, int8=660.6),
            source="NVIDIA Ada GPU architecture whitepaper"),
    # --- AMD CDNA -----------------------------------------------------------------------------------
    # AMD Instinct MI250X datasheet (amd.com/en/products/accelerators/instinct/mi200/mi250x.html):
    # whole OAM module: FP64 vector 47.9, FP64 matrix 95.7, FP32 vector 47.9, packed FP32 95.7,
    # FP16/BF16 383, INT8 383 TOPS, 3.2768 TB/s; no TF32, no FP8. The module is two GCDs and PyTorch sees
    # each GCD as its own device, so these entries hold ONE GCD: half of every figure. "float32" uses the
    # packed-FP32 rate (what vectorised fp32 code and fp32 GEMM reach on CDNA2).
    # ROCm names both the MI250X and the MI250 "AMD Instinct MI250X/MI250". That string gets the MI250X's
    # figures: the MI250's compute is 5.4 % lower (208 vs 220 CUs) and its bandwidth the same, so on an
    # MI250 a % of peak reads at most 5.4 % low, while MI250 figures could put an MI250X above 100 %.
    GpuSpec("AMD Instinct MI250X (one GCD)", "amd", match=(" mi250x ", " mi250x mi250 "), exclude=(),
            memory_bandwidth_gbps=1638.4,
            flops_gflops=_tf(float32=47.85, bfloat16=191.5, float16=191.5, float64=47.85, float64_vector=23.95,
                             int8=191.5),
            source="AMD Instinct MI250X datasheet (per GCD = half the module)"),
    # AMD Instinct MI250 datasheet (amd.com/en/products/accelerators/instinct/mi200/mi250.html), whole
    # module: FP64 vector 45.3, FP64 matrix 90.5, FP32 vector 45.3, packed FP32 90.5, FP16/BF16 362.1,
    # INT8 362.1 TOPS, 3.2768 TB/s (ROCm's MI250 architecture page: 22.6 FP64 vector per GCD). One GCD.
    GpuSpec("AMD Instinct MI250 (one GCD)", "amd", match=(" mi250 ",), exclude=(" mi250x ",),
            memory_bandwidth_gbps=1638.4,
            flops_gflops=_tf(float32=45.25, bfloat16=181.05, float16=181.05, float64=45.25, float64_vector=22.65,
                             int8=181.05),
            source="AMD Instinct MI250 datasheet (per GCD = half the module)"),
    # AMD Instinct MI300X datasheet (amd.com/.../instinct/mi300/mi300x.html): FP64 vector 81.7,
    # FP64 matrix 163.4, FP32 vector 163.4, TF32 653.7 (1,307.4 sparse), FP16/BF16 1,307.4, FP8 2,614.9,
    # INT8 2,614.9 TOPS, 192 GB HBM3 at 5.3 TB/s. (Numbers for the whole device in SPX mode; CPX partitions
    # see 1/8.)
    GpuSpec("AMD Instinct MI300X", "amd", match=(" mi300x ",), exclude=(),
            memory_bandwidth_gbps=5300.0,
            flops_gflops=_tf(float32=163.4, tfloat32=653.7, bfloat16=1307.4, float16=1307.4, float8=2614.9,
                             float64=163.4, float64_vector=81.7, int8=2614.9),
            source="AMD Instinct MI300X datasheet"),
    # AMD Instinct MI325X datasheet (amd.com/.../instinct/mi300/mi325x.html): MI300X compute (same CDNA3
    # silicon: TF32 653.7, FP16/BF16 1,307.4, FP8 2,614.9, INT8 2,614.9 TOPS, FP32 163.4, FP64 matrix 163.4,
    # FP64 vector 81.7) with 256 GB HBM3E at 6 TB/s.
    GpuSpec("AMD Instinct MI325X", "amd", match=(" mi325x ",), exclude=(),
            memory_bandwidth_gbps=6000.0,
            flops_gflops=_tf(float32=163.4, tfloat32=653.7, bfloat16=1307.4, float16=1307.4, float8=2614.9,
                             float64=163.4, float64_vector=81.7, int8=2614.9),
            source="AMD Instinct MI325X datasheet"),
]


def _normalize(name: str) -> str:
    """Lower case, every run of non-alphanumerics -> one space, padded: " nvidia a100 sxm4 80gb "."""
    return " " + " ".join(re.sub(r"[^a-z0-9]+", " ", name.lower()).split()) + " "


def match_gpu(device_name: str) -> GpuSpec | None:
    """The spec-table entry for a device name, or None. Among entries with a matching substring and no
    excluded one, the longest matching substring wins (ties: the earlier entry)."""
    if not device_name:
        return None
    norm = _normalize(device_name)
    best: tuple[int, int] | None = None
    best_spec: GpuSpec | None = None
    for index, spec in enumerate(GPU_SPECS):
        if any(_normalize(x) in norm for x in spec.exclude):
            continue
        lengths = [len(m) for m in (_normalize(m) for m in spec.match) if m in norm]
        if not lengths:
            continue
        rank = (max(lengths), -index)
        if best is None or rank > best:
            best, best_spec = rank, spec
    return best_spec


# A GPU whose trace records no name is recognised by what deviceProperties still says: (runtime,
# compute capability / gfx major.minor, SMs or CUs, memory in GiB as totalGlobalMem reports it, name in
# the spec table). Memory matches within 12 % (the driver reserves some; the SKUs differ by far more).
GPU_BY_PROPERTIES: tuple[tuple[str, int, int, int, float, str], ...] = (
    ("cuda", 8, 0, 108, 39.4, "NVIDIA A100-SXM4-40GB"),
    ("cuda", 8, 0, 108, 79.2, "NVIDIA A100-SXM4-80GB"),
    ("cuda", 8, 6, 72, 22.1, "NVIDIA A10"),
    ("cuda", 8, 6, 80, 22.1, "NVIDIA A10G"),
    ("cuda", 8, 9, 58, 22.1, "NVIDIA L4"),
    ("cuda", 8, 9, 142, 44.4, "NVIDIA L40S"),
    ("cuda", 9, 0, 132, 79.1, "NVIDIA H100 80GB HBM3"),
    ("cuda", 9, 0, 114, 79.1, "NVIDIA H100 PCIe"),
    ("cuda", 9, 0, 132, 139.8, "NVIDIA H200"),
    ("cuda", 10, 0, 148, 178.4, "NVIDIA B200"),
    ("rocm", 9, 0, 110, 64.0, "AMD Instinct MI250X"),
    ("rocm", 9, 4, 304, 192.0, "AMD Instinct MI300X"),
    ("rocm", 9, 4, 304, 256.0, "AMD Instinct MI325X"),
)


def gpu_from_properties(props: dict[str, Any], runtime: str | None) -> tuple[str, str] | None:
    """(device name, what it was recognised by) from a deviceProperties entry without a name, or None.
    Needs the compute capability, the SM/CU count and the memory size."""
    try:
        major, minor = int(props["computeMajor"]), int(props["computeMinor"])
        sms = int(props["numSms"])
        gib = float(props["totalGlobalMem"]) / 2**30
    except (KeyError, TypeError, ValueError):
        return None
    for rt, ma, mi, n, mem, name in GPU_BY_PROPERTIES:
        if (runtime in (None, rt) and (ma, mi, n) == (major, minor, sms) and abs(gib - mem) <= 0.12 * mem):
            units = "CUs" if rt == "rocm" else "SMs"
            return name, f"compute capability {major}.{minor}, {sms} {units}, {gib:.0f} GiB"
    return None


def gpu_peaks(device_name: str) -> Peaks | None:
    """Peaks of a known GPU (origin "spec-table"), or None when the name is not in the table."""
    spec = match_gpu(device_name)
    if spec is None:
        return None
    return Peaks(
        memory_bandwidth_gbps=spec.memory_bandwidth_gbps,
        flops_gflops=dict(spec.flops_gflops),
        origin={"memory_bandwidth": "spec-table", "flops": "spec-table"},
    )


# cuBLAS/cuDNN/CUTLASS/hipBLASLt kernel names that run fp32 math on TF32 (xf32) tensor cores, e.g.
# "sm80_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize...", "cutlass_80_tensorop_s1688gemm_128x128_...",
# "cutlass3x_sm90_tensorop_s64x128x8tf32gemm_...", hipBLASLt "..._XF32_...".
_TF32_KERNEL = re.compile(r"tf32|xf32|tensorop_s1688|s1688gemm", re.IGNORECASE)


def ceiling_key(family: str, dtype: str | None, kernel_names: str = "") -> str:
    """Which flops_gflops key bounds an op.

    - matmul/conv/attention (TENSOR_CORE_FAMILIES) in bfloat16/float16/float8/int8 -> that dtype;
      in float32 (or tfloat32) -> "tfloat32" when a kernel name (`;`-separated) shows TF32 math, else
      "float32"; in float64 -> "float64" (the FP64 tensor-core rate where the part has one);
    - float64 element-wise, reduction, norm and every other op -> "float64_vector" (Peaks.flops_for falls
      back to float64, then float32, when absent);
    - everything else (element-wise, norms, reductions, copies, ...) -> "float32", the vector peak: such
      ops never run on tensor cores, whatever their dtype.
    """
    tensor_cores = family in TENSOR_CORE_FAMILIES
    if dtype == "float64":
        return "float64" if tensor_cores else "float64_vector"
    if not tensor_cores:
        return "float32"
    if dtype in ("bfloat16", "float16", "float8", "int8"):
        return dtype
    if dtype in ("float32", "tfloat32", None) and kernel_names and _TF32_KERNEL.search(kernel_names):
        return "tfloat32"
    return "float32"


# --- user overrides ---------------------------------------------------------------------------------

def dtype_names() -> str:
    """Every DTYPE --peak-flops accepts, each canonical name with its aliases: 'float32 (fp32, f32,
    float), tfloat32 (tf32), ...' (the CLI's help and error messages)."""
    parts = []
    for key in DTYPE_KEYS:
        aliases = [a for a, k in _DTYPE_ALIASES.items() if k == key and a != key]
        parts.append(f"{key} ({', '.join(aliases)})" if aliases else key)
    return ", ".join(parts)


# Ceilings a user may give (--peak-bw, --peak-flops): beyond any device, but far from the float limits, so
# that every rate and percentage derived from them stays finite (1e308 GB/s made inf columns and a report
# that could not be written; 5e-324 the same the other way).
USER_BANDWIDTH_GBPS = (0.001, 1e7)  # 1 MB/s to 10 PB/s
USER_GFLOPS = (0.001, 1e10)  # 1 MFLOP/s to 10 EFLOP/s
_PEAK_FLOPS_HELP = ("expected [DTYPE=]GFLOPS with DTYPE one of " + dtype_names()
                    + f" and GFLOPS a number between {USER_GFLOPS[0]:g} and {USER_GFLOPS[1]:g}, e.g. "
                    "--peak-flops bfloat16=989000 float32=67000")


def parse_peak_flops(values: list[str]) -> dict[str, float]:
    """--peak-flops items "[DTYPE=]GFLOPS" (items may also be comma-separated) -> {dtype: GFLOP/s}.
    A bare number applies to every dtype and is returned under the key "*". Aliases such as bf16, fp16,
    tf32, fp8, fp32, fp64 are accepted. Raises OpscopeError (one line) on a bad item."""
    out: dict[str, float] = {}
    for raw in values or []:
        for item in str(raw).split(","):
            item = item.strip()
            if not item:
                continue
            if "=" in item:
                name, _, text = item.partition("=")
                key = _DTYPE_ALIASES.get(name.strip().lower())
                if key is None:
                    raise OpscopeError(f"--peak-flops: unknown dtype {name.strip()!r} in {item!r}: {_PEAK_FLOPS_HELP}")
            else:
                key, text = "*", item
            value = _positive(text.strip())
            if value is None or not USER_GFLOPS[0] <= value <= USER_GFLOPS[1]:
                raise OpscopeError(f"--peak-flops: bad value in {item!r}: {_PEAK_FLOPS_HELP}")
            out[key] = value
    return out


def apply_overrides(peaks: Peaks | None, peak_bw: float | None, peak_flops: list[str] | None) -> Peaks:
    """`peaks` (or nothing known, if None) with --peak-bw / --peak-flops applied; returns a new Peaks.
    An overridden part gets origin "user" (for flops: when any dtype was given; the other dtypes keep
    their values). A bare --peak-flops number sets every dtype key; DTYPE=... items then win over it.
    Raises OpscopeError for a non-positive/non-finite --peak-bw or a bad --peak-flops item."""
    base = peaks if peaks is not None else Peaks(None, {}, {"memory_bandwidth": "unknown", "flops": "unknown"})
    bw = base.memory_bandwidth_gbps
    flops = dict(base.flops_gflops)
    origin = {"memory_bandwidth": base.origin.get("memory_bandwidth", "unknown"),
              "flops": base.origin.get("flops", "unknown")}
    if bw is None:
        origin["memory_bandwidth"] = "unknown"
    if not flops:
        origin["flops"] = "unknown"
    if peak_bw is not None:
        value = _positive(peak_bw)
        if value is None or not USER_BANDWIDTH_GBPS[0] <= value <= USER_BANDWIDTH_GBPS[1]:
            raise OpscopeError(f"--peak-bw: expected a number of GB/s between {USER_BANDWIDTH_GBPS[0]:g} and "
                               f"{USER_BANDWIDTH_GBPS[1]:g}, got {peak_bw!r}")
        bw = value
        origin["memory_bandwidth"] = "user"
    parsed = parse_peak_flops(peak_flops or [])
    if parsed:
        if "*" in parsed:
            for key in DTYPE_KEYS:
                flops[key] = parsed["*"]
        for key, value in parsed.items():
            if key != "*":
                flops[key] = value
        origin["flops"] = "user"
    return Peaks(memory_bandwidth_gbps=bw, flops_gflops=flops, origin=origin)


def unknown_gpu_warning(device_name: str) -> str:
    """One line for stderr when a GPU is not in the spec table."""
    return (f"opscope: GPU {device_name!r} is not in opscope's spec table, so its peak bandwidth and FLOP/s "
            "are unknown and percent-of-peak stays empty; pass --peak-bw GBPS and --peak-flops "
            "[DTYPE=]GFLOPS (e.g. --peak-bw 3350 --peak-flops bfloat16=989000 float32=67000) to set them.")
