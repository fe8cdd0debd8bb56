"""GPU kernels by name: which family of work a kernel does, a short name to show, and which GPU
architecture a trace's kernel names point at.

A CUDA/HIP graph replay, a GPU-only trace or a custom op gives opscope kernels without the aten op (and
shapes) behind them. Their names still say what they do: `Cijk_...` is a hipBLASLt/Tensile GEMM,
`paged_attention_...` attention, `ncclDevKernel_AllReduce...` communication. FAMILIES is that
vocabulary, one entry per family, tried in order (the first match wins); each pattern is tested on
real kernel names (tests/trace/test_kernel_families.py). Names are matched case-insensitively.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache

OTHER = "other"

# (family, what it covers, pattern). Order matters where names overlap: flash attention kernels
# mention cutlass types (attention before gemm), KV-cache writes say "flash" or "mla" but are copies
# (the attention patterns are specific), at::native element-wise kernels name their functor
# (`elementwise_kernel<..., direct_copy_kernel_cuda>` is a copy: copy before elementwise), torch.topk's
# `gatherTopK` is a selection, not a gather (reduction before copy), and
# `paged_attention_..._reduce_kernel` is attention, not a reduction.
FAMILIES: tuple[tuple[str, str, str], ...] = (
    ("communication", "NCCL/RCCL collectives, custom and symmetric-memory all-reduce",
     r"nccl|rccl|msccl|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|cross_device_reduce|"
     r"multimem|quick_?reduce|symm_?mem|sendrecv"),
    ("moe", "mixture-of-experts: fused expert GEMMs, routing top-k, token sorting",
     r"(?<![a-z])moe|expert|topk_?(softmax|sigmoid|gating)|grouped_?topk"),
    ("attention", "fused attention: flash, fmha, paged and unified attention, FlashInfer, Triton attn_fwd",
     r"flash_?(fwd|bwd|attn|decoding|mla)|fmha|paged_?attention|unified_?attention|attn_(fwd|bwd)|"
     r"batch(decode|prefill)with|single(decode|prefill)with|decode_?attention|prefill_?attention|"
     r"mla_(decode|prefill|fwd)|(?<![a-z])attention"),
    ("conv", "convolution (cuDNN/MIOpen fprop, dgrad, wgrad)",
     r"fprop|dgrad|wgrad|convolve|convolution|conv[123]d|winograd|igemm_(fwd|bwd|wrw)"),
    ("gemm", "matrix multiply: cuBLAS/cuBLASLt (sm90_xmma, nvjet), CUTLASS, hipBLASLt/Tensile (Cijk_), "
     "skinny GEMMs, Triton mm templates",
     r"gemm|gemv|cijk_|cutlass|xmma|nvjet|cublas|hipblaslt|wvsplitk|splitk|matmul|triton_tem_\w*mm"),
    ("norm", "normalization: RMSNorm, LayerNorm, group/batch norm (fused add + norm included)",
     r"rms_?norm|layer_?norm|group_?norm|batch_?norm|instance_?norm|l2_?norm|bn_(fw|bw)|"
     r"triton_(red|per)_\w*rsqrt"),
    ("reduction", "reductions, softmax, scans, sorting and sampling (argmax, top-p/top-k sampling)",
     r"reduce|argmax|argmin|softmax|(?<!up)sampl|scan|cumsum|cumprod|sort|radix|bitonic|topk|logsumexp|"
     r"multinomial|triton_(red|per)_"),
    ("copy", "memcpy/memset and copy kernels: dtype casts, KV-cache writes, gathers, cat, fills, layout "
     "transposes",
     r"^memcpy|^memset|copy|fill|store_?kv|reshape_and_cache|concat_and_cache|kv_?cache_?(write|store)|"
     r"cat_?array|gather|scatter|index_?select|indexselect|nchw_?to_?nhwc|nhwc_?to_?nchw|transpose"),
    ("elementwise", "activations and element-wise math: SiLU/GELU (act_and_mul), rotary embedding, "
     "add/mul, quantization, Triton pointwise",
     r"elementwise|pointwise|triton_poi_|act_and_mul|silu|gelu|relu|swiglu|geglu|sigmoid|tanh|rotary|"
     r"rope|quant|clamp|functor|_kernel_cuda|arange|where"),
)

FAMILY_NAMES: tuple[str, ...] = tuple(f for f, _, _ in FAMILIES) + (OTHER,)
_COMPILED = tuple((family, re.compile(pattern, re.IGNORECASE)) for family, _, pattern in FAMILIES)
_DEVICE_CATS = {"gpu_memcpy": "copy", "gpu_memset": "copy"}


@lru_cache(maxsize=65536)
def kernel_family(name: str, cat: str = "kernel") -> str:
    """The family of one kernel (FAMILY_NAMES), from its trace category and name; OTHER when nothing
    in the vocabulary matches."""
    if cat in _DEVICE_CATS:
        return _DEVICE_CATS[cat]
    text = demangle(name)
    for family, pattern in _COMPILED:
        if pattern.search(text):
            return family
    return OTHER


_MANGLED_PART = re.compile(r"(\d+)")


def demangle(name: str) -> str:
    """The qualified function name of an Itanium-mangled symbol (`_ZN5aiter24add_rmsnorm_quant_kernelI...`
    -> `aiter::add_rmsnorm_quant_kernel`), template and parameter types dropped; other names unchanged.
    Enough to read and classify a kernel, not a full demangler."""
    if not name.startswith("_Z"):
        return name
    rest = name[3:] if name.startswith("_ZN") else name[2:]
    parts = []
    pos = 0
    while pos < len(rest) and rest[pos].isdigit():
        m = _MANGLED_PART.match(rest, pos)
        if m is None:  # cannot happen: rest[pos] is a digit
            break
        n = int(m.group(1))
        start = m.end()
        if n <= 0 or start + n > len(rest):
            break
        parts.append(rest[start:start + n])
        pos = start + n
        if not name.startswith("_ZN"):
            break
    return "::".join(parts) if parts else name


_ANON = "(anonymous namespace)::"
_HELPER_FUNCTOR = re.compile(r"\b(\w+_kernel_cuda|\w*Functor_\w+|\w+Ops|\w+KernelImpl|\w+_cuda_out)\b")
_CIJK_MT = re.compile(r"_(MT\d+x\d+x\d+)")
_WRAPPERS = frozenset({"Kernel", "Kernel2", "device_kernel"})


def short_kernel_name(name: str) -> str:
    """A kernel name short enough for a table cell: demangled, without `void`, namespaces, template
    arguments and parameters; at::native's generic kernels keep the functor that says what they do
    (`vectorized_elementwise_kernel[CUDAFunctor_add]`); hipBLASLt's `Cijk_...` keeps its layout, types
    and macro tile (`Cijk_Alik_Bljk_BBS MT256x32x64`)."""
    text = demangle(name).strip()
    if text.startswith("Cijk_"):
        parts = text.split("_")
        tile = _CIJK_MT.search(text)
        return "_".join(parts[:4]) + (f" {tile.group(1)}" if tile else "")
    if text.startswith("void "):
        text = text[5:]
    text = text.replace(_ANON, "")
    cut = len(text)
    for sep in ("<", "("):
        i = text.find(sep)
        if 0 < i < cut:
            cut = i
    head = text[:cut].rsplit("::", 1)[-1].strip() or text[:cut].strip() or text
    if head in _WRAPPERS and cut < len(text) and text[cut] == "<":
        # cutlass::Kernel2<cutlass_80_tensorop_..._gemm_...>: the template argument names the kernel
        inner = re.split(r"[<,>(]", text[cut + 1:], maxsplit=1)[0].rsplit("::", 1)[-1].strip()
        return inner or head
    if cut < len(text) and text[cut] == "<":
        helper = _HELPER_FUNCTOR.search(text[cut:])
        if helper and helper.group(1) != head:
            return f"{head}[{helper.group(1)}]"
    return head


# Kernel names that say which GPU architecture ran them: (pattern, architecture name). hipBLASLt and
# Tensile name their target ISA (`_ISA942_`); cuBLAS/CUTLASS their SM generation.
ARCHITECTURES: tuple[tuple[str, str], ...] = (
    (r"_ISA950_|gfx950", "AMD Instinct (gfx950: MI350 series)"),
    (r"_ISA942_|gfx942", "AMD Instinct (gfx942: MI300 series)"),
    (r"_ISA90a_|gfx90a", "AMD Instinct (gfx90a: MI200 series)"),
    (r"^Cijk_", "AMD Instinct (hipBLASLt/Tensile kernels)"),
    (r"sm100|sm_100|nvjet_sm100", "NVIDIA Blackwell (sm100)"),
    (r"sm90|sm_90", "NVIDIA Hopper (sm90)"),
    (r"sm89|sm_89", "NVIDIA Ada (sm89)"),
    (r"sm80|sm_80|cutlass_80|ampere_", "NVIDIA Ampere (sm80)"),
)
_ARCH_COMPILED = tuple((re.compile(p), arch) for p, arch in ARCHITECTURES)


def architecture_from_kernels(names: Iterable[str]) -> tuple[str, str] | None:
    """(architecture, the kernel name that shows it) for the first vocabulary entry any kernel name
    matches (entries in ARCHITECTURES order, most specific first), or None."""
    distinct = list(dict.fromkeys(names))
    for pattern, arch in _ARCH_COMPILED:
        for name in distinct:
            if pattern.search(name):
                return arch, name
    return None
