"""The kernel-name vocabulary (opscope.trace.kernel_names) on real kernel names: every name in the shared
traces, and names from public vLLM/SGLang/NCCL profiles for the families those traces lack (MoE,
communication)."""

from __future__ import annotations

import gzip
import json

import pytest

from conftest import TRACES
from opscope.trace.kernel_names import (
    FAMILIES,
    FAMILY_NAMES,
    architecture_from_kernels,
    demangle,
    kernel_family,
    short_kernel_name,
)

# (real kernel name, family). Names as the traces write them (shortened only where they run on for
# hundreds of characters of template arguments that change nothing).
REAL = [
    # GEMM: cuBLAS (sm90_xmma), CUTLASS, hipBLASLt/Tensile (Cijk_), cuBLASLt nvjet
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas", "gemm"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x6_tn_align8>(cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x6_tn_align8::Params)", "gemm"),
    ("Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x32x64_MI16x16x1_SN_LDSB1_AFC1_AFEM1_AFEM1_ASEM1_CLR1_CADS0_DTLA0_DTLB0_DTVA0_DTVB0_EPS0_FDSI0_GRPM1_GRVWA8_GRVWB8_GSUAMBSK_GLS0_ISA942_IU1_K1_LDSTI0_LBSPPA512", "gemm"),
    ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_TNT", "gemm"),
    # attention: flash (whose traits name cutlass types), Triton attn_fwd, paged attention, FlashInfer
    ("void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, cutlass::bfloat16_t, pytorch_flash::Flash_kernel_traits<64, 128, 128, 4, cutlass::bfloat16_t> >, false, false, false, false, true, true, false, false>(pytorch_flash::Flash_fwd_params)", "attention"),
    ("attn_fwd", "attention"),
    ("void paged_attention_ll4mi_QKV_mfma16_kernel<0, __hip_bfloat16, __hip_bfloat16, (vllm::Fp8KVCacheDataType)0, 1, 128, 256, false, 4, 1, ck_tile::ComposedAttention<0u, false> >(__hip_bfloat16 const*)", "attention"),
    ("void paged_attention_ll4mi_reduce_kernel<__hip_bfloat16, __hip_bfloat16, 128, 128, 256, 3, false>(__hip_bfloat16*, float const*, float const*)", "attention"),
    ("flashinfer::BatchPrefillWithPagedKVCacheKernel", "attention"),
    ("flash_fwd_splitkv_kernel", "attention"),
    # normalization, fused add + RMSNorm (mangled), inductor's RMSNorm reduction
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>(int, float, c10::BFloat16 const*)", "norm"),
    ("_ZN5aiter24add_rmsnorm_quant_kernelIDF16bDF16bLi256ELi16ELb1ELb0ELb1ELi1EEEvPT0_PT_PfS4_S4_S4_diiiiiiib", "norm"),
    ("triton_red_fused_add_mean_mul_pow_rsqrt_0", "norm"),
    # activation and element-wise
    ("_ZN7sgl_hip10activation18act_and_mul_kernelI14__hip_bfloat16TnPFT_RKS3_EXadL_Z4siluIS2_ES3_S5_EEEEvPS3_PS4_i", "elementwise"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul>)", "elementwise"),
    ("void rotary_embedding_kernel<c10::BFloat16, true>(long const*, c10::BFloat16*, c10::BFloat16*, c10::BFloat16 const*, int, long, long, long, int, int, int)", "elementwise"),
    ("triton_poi_fused__unsafe_view_mul_silu_2", "elementwise"),
    # MoE: Triton fused experts, routing top-k, token alignment
    ("fused_moe_kernel", "moe"),
    ("void vllm::moe::topkGatingSoftmax<__nv_bfloat16, 8, 128, 4, 16>(__nv_bfloat16 const*, bool const*, float*, int, int*)", "moe"),
    ("void vllm::moe::moe_align_block_size_kernel<int>(int const*, int*, int*, int*, int, int, int, int, unsigned long)", "moe"),
    # communication: NCCL, custom all-reduce
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "communication"),
    ("ncclDevKernel_AllGather_RING_LL", "communication"),
    ("void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(vllm::RankData*, vllm::RankSignals, vllm::Signal*, __nv_bfloat16*, int, int)", "communication"),
    # memcpy / memset and copy kernels (KV-cache writes, dtype casts, gathers)
    ("Memcpy DtoH (Device -> Pinned)", "copy"),
    ("void (anonymous namespace)::store_kvcache<2048l, 4, false, long>((anonymous namespace)::StoreKVCacheParams)", "copy"),
    ("void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16, __nv_bfloat16, (vllm::Fp8KVCacheDataType)0>(__nv_bfloat16 const*)", "copy"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::bfloat16tofloat32_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul> >(int)", "copy"),
    ("void at::native::vectorized_gather_kernel<16, long>(char*, char*, long*, int, long, long, long, long, bool)", "copy"),
    # sampling / reduction
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::ArgMaxOps<float>, unsigned int, long, 4, 4> >(at::native::ReduceOp<float, at::native::ArgMaxOps<float>, unsigned int, long, 4, 4>)", "reduction"),
    ("void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>(at::cuda::detail::TensorInfo<float const, unsigned int>)", "reduction"),
    # convolution (cuDNN fprop through CUTLASS)
    ("void cutlass__5x_cudnn::Kernel<cutlass_tensorop_bf16_s16816fprop_optimized_bf16_256x64_32x4_nhwc_align8>(cutlass_tensorop_bf16_s16816fprop_optimized_bf16_256x64_32x4_nhwc_align8::Params)", "conv"),
]


@pytest.mark.parametrize("name,family", REAL, ids=[f"{f}-{i}" for i, (_, f) in enumerate(REAL)])
def test_real_kernel_names_get_their_family(name, family):
    assert kernel_family(name) == family


def test_every_family_is_tested_on_real_names():
    assert {f for _, f in REAL} == {f for f, _, _ in FAMILIES}


def test_memcpy_and_memset_go_by_category():
    assert kernel_family("Memset (Device)", "gpu_memset") == "copy"
    assert kernel_family("anything at all", "gpu_memcpy") == "copy"
    assert kernel_family("some_kernel_nobody_knows") == "other"


def test_shared_traces_are_classified():
    """Every kernel name in the shared traces gets a family; the two left as `other` are SGLang's own
    bookkeeping kernels (a few µs each)."""
    others = set()
    for path in TRACES.glob("*.json.gz"):
        for e in json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]:
            if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
                family = kernel_family(e["name"], e["cat"])
                assert family in FAMILY_NAMES
                if family == "other":
                    others.add(short_kernel_name(e["name"]))
    assert others == {"resolve_future_token_ids_kernel", "create_flashinfer_kv_indices_triton"}


def test_demangle_and_short_names():
    assert demangle("_ZN5aiter24add_rmsnorm_quant_kernelIDF16bDF16bLi256EEEvPT0_") == "aiter::add_rmsnorm_quant_kernel"
    assert demangle("_Z14my_kernel_namePf") == "my_kernel_name"
    assert demangle("attn_fwd") == "attn_fwd"
    short = {name: short_kernel_name(name) for name, _ in REAL}
    assert short[REAL[1][0]] == "cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x6_tn_align8"
    assert short[REAL[2][0]] == "Cijk_Alik_Bljk_BBS MT256x32x64"
    assert short[REAL[14][0]] == "vectorized_elementwise_kernel[CUDAFunctor_add]"
    assert short[REAL[24][0]] == "store_kvcache"
    assert short[REAL[13][0]] == "act_and_mul_kernel"


def test_architecture_from_kernel_names():
    assert architecture_from_kernels([REAL[2][0]])[0] == "AMD Instinct (gfx942: MI300 series)"
    assert architecture_from_kernels(["attn_fwd", REAL[0][0]])[0] == "NVIDIA Hopper (sm90)"
    assert architecture_from_kernels([REAL[1][0]])[0] == "NVIDIA Ampere (sm80)"
    assert architecture_from_kernels(["attn_fwd", "fused_moe_kernel"]) is None
