"""Cost model: matmul, convolution and attention against hand-computed numbers. Every OpCall is laid out
exactly as torch.profiler records the call (argument order, "Input type" strings, strides, concrete
values), copied from real CPU traces (torch 2.13) or, for GPU-only ops, from the H100 traces in
tests/fixtures/traces and the ops' schemas."""

from __future__ import annotations

import pytest

from opscope.costmodel import Cost, OpCall, estimate, floating_dtype
from opscope.costmodel.attention import BOTTOM_RIGHT, CAUSAL_NOTE, TOP_LEFT, WINDOW_NOTE, causal_pairs

F32, BF16 = "float", "c10::BFloat16"


def cost(name, dims, dtypes, strides, concrete) -> Cost:
    c = estimate(OpCall(name, tuple(dims), tuple(dtypes), tuple(strides), tuple(concrete)))
    assert c is not None, name
    return c


# --- matmul ---------------------------------------------------------------------------------------------


def test_mm():
    c = cost("aten::mm", [[16, 16], [16, 32]], [F32, F32], [[16, 1], [1, 16]], ["", ""])
    assert c.flops == 2 * 16 * 32 * 16
    assert c.bytes == (16 * 16 + 16 * 32) * 4 + 16 * 32 * 4
    assert c.family == "matmul" and c.uses_tensor_cores


def test_addmm_bias_adds_bytes_not_flops():
    # F.linear(x [8,16], w [32,16], b [32]) -> aten::addmm(b, x, w.t())
    c = cost("aten::addmm", [[32], [8, 16], [16, 32], [], []], [F32, F32, F32, "Scalar", "Scalar"],
             [[1], [16, 1], [1, 16], [], []], ["", "", "", "1", "1"])
    assert c.flops == 2 * 8 * 32 * 16
    assert c.bytes == 32 * 4 + 8 * 16 * 4 + 16 * 32 * 4 + 8 * 32 * 4


def test_addmm_bf16_from_gpu_trace():
    c = cost("aten::addmm", [[512], [141, 512], [512, 512], [], []], [BF16, BF16, BF16, "Scalar", "Scalar"],
             [[1], [512, 1], [1, 512], [], []], ["", "", "", "1", "1"])
    assert c.flops == 2 * 141 * 512 * 512
    assert c.bytes == (512 + 141 * 512 + 512 * 512 + 141 * 512) * 2


def test_bmm_baddbmm_addbmm():
    c = cost("aten::bmm", [[6, 8, 16], [6, 16, 4]], [F32, F32], [[128, 16, 1], [64, 4, 1]], ["", ""])
    assert c.flops == 2 * 6 * 8 * 4 * 16
    assert c.bytes == (6 * 8 * 16 + 6 * 16 * 4 + 6 * 8 * 4) * 4
    c = cost("aten::baddbmm", [[3, 8, 4], [3, 8, 16], [3, 16, 4], [], []], [F32, F32, F32, "Scalar", "Scalar"],
             [[32, 4, 1], [128, 16, 1], [64, 4, 1], [], []], ["", "", "", "0.5", "2"])
    assert c.flops == 2 * 3 * 8 * 4 * 16
    assert c.bytes == (3 * 8 * 4 + 3 * 8 * 16 + 3 * 16 * 4 + 3 * 8 * 4) * 4
    c = cost("aten::addbmm", [[8, 4], [3, 8, 16], [3, 16, 4], [], []], [F32, F32, F32, "Scalar", "Scalar"],
             [[4, 1], [128, 16, 1], [64, 4, 1], [], []], ["", "", "", "1", "1"])
    assert c.flops == 2 * 3 * 8 * 4 * 16
    assert c.bytes == (8 * 4 + 3 * 8 * 16 + 3 * 16 * 4 + 8 * 4) * 4


def test_mv_addmv_dot():
    c = cost("aten::mv", [[8, 16], [16]], [F32, F32], [[16, 1], [1]], ["", ""])
    assert c.flops == 2 * 8 * 16 and c.bytes == (8 * 16 + 16 + 8) * 4
    # mv's CPU child: addmv_(out, mat, vec, beta=0, alpha=1): beta == 0, so self is not read
    c = cost("aten::addmv_", [[8], [8, 16], [16], [], []], [F32, F32, F32, "Scalar", "Scalar"],
             [[1], [16, 1], [1], [], []], ["", "", "", "0", "1"])
    assert c.flops == 2 * 8 * 16 and c.bytes == (8 * 16 + 16 + 8) * 4
    c = cost("aten::addmv", [[8], [8, 16], [16], [], []], [F32, F32, F32, "Scalar", "Scalar"],
             [[1], [16, 1], [1], [], []], ["", "", "", "1", "1"])
    assert c.flops == 2 * 8 * 16 and c.bytes == (8 + 8 * 16 + 16 + 8) * 4
    c = cost("aten::dot", [[16], [16]], [F32, F32], [[1], [1]], ["", ""])
    assert c.flops == 2 * 16 and c.bytes == (16 + 16 + 1) * 4


@pytest.mark.parametrize("name", ["aten::linear", "aten::matmul", "aten::einsum"])
def test_matmul_composites(name):
    c = cost(name, [[8, 16], [32, 16], [32]], [F32, F32, F32], [[16, 1], [16, 1], [1]], ["", "", ""])
    assert (c.flops, c.bytes, c.family) == (0, 0, "composite")


# --- convolution -----------------------------------------------------------------------------------------


def test_mkldnn_conv_basic_with_bias():
    # F.conv2d(x [2,4,10,10], w [8,4,3,3], b [8]) on CPU: mkldnn_convolution(x, w, b, padding, stride, dilation, groups)
    c = cost("aten::mkldnn_convolution", [[2, 4, 10, 10], [8, 4, 3, 3], [8], [], [], [], []],
             [F32, F32, F32, "ScalarList", "ScalarList", "ScalarList", "Scalar"],
             [[400, 100, 10, 1], [36, 9, 3, 1], [1], [], [], [], []], ["", "", "", "[0, 0]", "[1, 1]", "[1, 1]", "1"])
    out = 2 * 8 * 8 * 8  # [2, 8, 8, 8]
    assert c.flops == 2 * 2 * (8 * 8) * (3 * 3) * 8 * 4
    assert c.bytes == (2 * 4 * 10 * 10 + 8 * 4 * 3 * 3 + 8 + out) * 4
    assert c.family == "conv"


def test_conv_stride_padding_dilation_groups():
    # F.conv2d(x [2,4,10,10], w [8,2,3,3], stride=2, padding=1, dilation=2, groups=2) -> out [2, 8, 4, 4]
    # (mkldnn puts padding before stride)
    c = cost("aten::mkldnn_convolution", [[2, 4, 10, 10], [8, 2, 3, 3], [], [], [], [], []],
             [F32, F32, "", "ScalarList", "ScalarList", "ScalarList", "Scalar"],
             [[400, 100, 10, 1], [18, 9, 3, 1], [], [], [], [], []], ["", "", "", "[1, 1]", "[2, 2]", "[2, 2]", "2"])
    # out spatial: (10 + 2*1 - 2*(3-1) - 1) // 2 + 1 = 4
    assert c.flops == 2 * 2 * (4 * 4) * (3 * 3) * 8 * 2
    assert c.bytes == (2 * 4 * 10 * 10 + 8 * 2 * 3 * 3 + 2 * 8 * 4 * 4) * 4
    # the same call through the generic _convolution signature (stride before padding) agrees
    g = cost("aten::_convolution", [[2, 4, 10, 10], [8, 2, 3, 3], [], [], [], [], [], [], [], [], [], [], []],
             [F32, F32, "", "ScalarList", "ScalarList", "ScalarList", "Scalar", "ScalarList", "Scalar", "Scalar",
              "Scalar", "Scalar", "Scalar"],
             [[400, 100, 10, 1], [18, 9, 3, 1], [], [], [], [], [], [], [], [], [], [], []],
             ["", "", "", "[2, 2]", "[1, 1]", "[2, 2]", "False", "[0, 0]", "2", "False", "False", "True", "True"])
    assert (g.flops, g.bytes) == (c.flops, c.bytes)


def test_depthwise_conv():
    c = cost("aten::mkldnn_convolution", [[2, 4, 10, 10], [4, 1, 3, 3], [], [], [], [], []],
             [F32, F32, "", "ScalarList", "ScalarList", "ScalarList", "Scalar"],
             [[400, 100, 10, 1], [9, 9, 3, 1], [], [], [], [], []], ["", "", "", "[0, 0]", "[1, 1]", "[1, 1]", "4"])
    assert c.flops == 2 * 2 * (8 * 8) * (3 * 3) * 4 * 1
    assert c.bytes == (2 * 4 * 10 * 10 + 4 * 9 + 2 * 4 * 8 * 8) * 4


def test_conv_transpose_with_output_padding():
    # F.conv_transpose2d(x [2,4,10,10], w [4,3,3,3], stride=2, padding=1, output_padding=1): on CPU
    # _convolution does the work itself (no backend child op). out: (10-1)*2 - 2 + 2 + 1 + 1 = 20
    c = cost("aten::_convolution", [[2, 4, 10, 10], [4, 3, 3, 3], [], [], [], [], [], [], [], [], [], [], []],
             [F32, F32, "", "ScalarList", "ScalarList", "ScalarList", "Scalar", "ScalarList", "Scalar", "Scalar",
              "Scalar", "Scalar", "Scalar"],
             [[400, 100, 10, 1], [27, 9, 3, 1], [], [], [], [], [], [], [], [], [], [], []],
             ["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "True", "[1, 1]", "1", "False", "False", "True", "True"])
    # transposed: FLOPs over the *input* spatial positions
    assert c.flops == 2 * 2 * (10 * 10) * (3 * 3) * 4 * 3
    assert c.bytes == (2 * 4 * 10 * 10 + 4 * 3 * 3 * 3 + 2 * 3 * 20 * 20) * 4


def test_grouped_conv_transpose():
    # conv_transpose2d(x [2,4,10,10], w [4,3,3,3], stride=2, groups=2): C_out = 3 * 2, out 21x21
    c = cost("aten::_convolution", [[2, 4, 10, 10], [4, 3, 3, 3], [], [], [], [], [], [], [], [], [], [], []],
             [F32, F32, "", "ScalarList", "ScalarList", "ScalarList", "Scalar", "ScalarList", "Scalar", "Scalar",
              "Scalar", "Scalar", "Scalar"],
             [[400, 100, 10, 1], [27, 9, 3, 1], [], [], [], [], [], [], [], [], [], [], []],
             ["", "", "", "[2, 2]", "[0, 0]", "[1, 1]", "True", "[0, 0]", "2", "False", "False", "True", "True"])
    assert c.flops == 2 * 2 * (10 * 10) * (3 * 3) * 4 * 3
    assert c.bytes == (2 * 4 * 10 * 10 + 4 * 3 * 3 * 3 + 2 * 6 * 21 * 21) * 4


def test_cudnn_convolution_from_gpu_trace():
    # ViT patch embedding: cudnn_convolution(x, w, padding, stride, dilation, groups, benchmark, deterministic, tf32)
    c = cost("aten::cudnn_convolution", [[4, 3, 224, 224], [768, 3, 16, 16], [], [], [], [], [], [], []],
             [BF16, BF16, "ScalarList", "ScalarList", "ScalarList", "Scalar", "Scalar", "Scalar", "Scalar"],
             [[150528, 50176, 224, 1], [768, 256, 16, 1], [], [], [], [], [], [], []],
             ["", "", "[0, 0]", "[16, 16]", "[1, 1]", "1", "False", "False", "True"])
    assert c.flops == 2 * 4 * (14 * 14) * (16 * 16) * 768 * 3
    assert c.bytes == (4 * 3 * 224 * 224 + 768 * 3 * 16 * 16 + 4 * 768 * 14 * 14) * 2


def test_conv1d_and_slow_conv3d():
    # conv1d reaches mkldnn as a 2-D conv with a unit spatial dim
    c = cost("aten::mkldnn_convolution", [[2, 4, 1, 20], [8, 4, 1, 3], [], [], [], [], []],
             [F32, F32, "", "ScalarList", "ScalarList", "ScalarList", "Scalar"],
             [[80, 20, 20, 1], [12, 3, 3, 1], [], [], [], [], []], ["", "", "", "[0, 1]", "[1, 1]", "[1, 1]", "1"])
    assert c.flops == 2 * 2 * (1 * 20) * (1 * 3) * 8 * 4
    c = cost("aten::slow_conv3d_forward", [[1, 2, 6, 6, 6], [4, 2, 3, 3, 3], [], [], [], []],
             [F32, F32, "ScalarList", "", "ScalarList", "ScalarList"],
             [[432, 216, 36, 6, 1], [54, 27, 9, 3, 1], [], [], [], []], ["", "", "[3, 3, 3]", "", "[1, 1, 1]", "[0, 0, 0]"])
    assert c.flops == 2 * 1 * (4 * 4 * 4) * 27 * 4 * 2
    assert c.bytes == (2 * 216 + 4 * 2 * 27 + 4 * 64) * 4


# convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
# output_padding, groups, output_mask)
CONV_BWD_TYPES = [F32, F32, F32, "ScalarList", "ScalarList", "ScalarList", "ScalarList", "Scalar", "ScalarList", "Scalar",
                  "ScalarList"]


def test_convolution_backward_output_mask():
    # conv2d(x [2,4,10,10], w [8,2,3,3], b, stride=2, padding=1, groups=2) backward, grad_out [2,8,5,5]
    dims = [[2, 8, 5, 5], [2, 4, 10, 10], [8, 2, 3, 3], [], [], [], [], [], [], [], []]
    strides = [[0, 0, 0, 0], [400, 100, 10, 1], [18, 9, 3, 1], [], [], [], [], [], [], [], []]
    conc = ["", "", "", "[8]", "[2, 2]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "2", "[True, True, True]"]
    c = cost("aten::convolution_backward", dims, CONV_BWD_TYPES, strides, conc)
    # grad_input: a transposed conv over grad_out's positions: 2 * N * 5*5 * 3*3 * w[0] * w[1]
    grad_input = 2 * 2 * (5 * 5) * (3 * 3) * 8 * 2
    # grad_weight: each of the 8 x 2 x 3x3 weights sums over N * 5*5 positions: 2 * 8*2*9 * 2*25,
    # = FlopCounterMode's 2 * C_in(4) * 3*3 * 5*5 * C_out(8) * N divided by groups (2)
    grad_weight = 2 * (8 * 2 * 3 * 3) * (2 * 5 * 5)
    assert grad_weight == 2 * 4 * (3 * 3) * (5 * 5) * 8 * 2 // 2
    assert c.flops == grad_input + grad_weight
    # grad_out is an expanded scalar (stride 0): 1 element of storage
    assert c.bytes == 4 + (8 * 2 * 9) * 4 + (2 * 4 * 100) * 4 + (2 * 4 * 100) * 4 + (8 * 2 * 9) * 4 + 8 * 4
    only_weight = cost("aten::convolution_backward", dims, CONV_BWD_TYPES, strides, conc[:-1] + ["[False, True, False]"])
    assert only_weight.flops == grad_weight
    assert only_weight.bytes == 4 + (2 * 4 * 100) * 4 + (8 * 2 * 9) * 4


def test_depthwise_convolution_backward_counts_the_real_work():
    # issue 8: depthwise 3x3, 128 channels, on [8,128,56,56] (padding 1), train mode. grad_input and
    # grad_weight each do one multiply-add per (weight tap, output position): 8*56*56 * 9 * 128.
    dims = [[8, 128, 56, 56], [8, 128, 56, 56], [128, 1, 3, 3], [], [], [], [], [], [], [], []]
    strides = [[401408, 3136, 56, 1], [401408, 3136, 56, 1], [9, 9, 3, 1], [], [], [], [], [], [], [], []]
    conc = ["", "", "", "[128]", "[1, 1]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "128", "[True, True, True]"]
    c = cost("aten::convolution_backward", dims, CONV_BWD_TYPES, strides, conc)
    per_grad = 2 * 8 * 56 * 56 * 9 * 128
    assert per_grad == 57_802_752
    assert c.flops == 2 * per_grad == 115_605_504  # 1.156e8; FlopCounterMode says 7.457e9
    act = 8 * 128 * 56 * 56 * 4
    assert c.bytes == 3 * act + 2 * 128 * 9 * 4 + 128 * 4  # grad_out, x read; grad_input written; w, grad_w; grad_b
    # arithmetic intensity ~3 FLOP/B: memory-bound under a ridge point of 5
    assert 2.9 < c.flops / c.bytes < 3.1


def test_conv_composites():
    c = cost("aten::conv2d", [[4, 3, 224, 224], [768, 3, 16, 16], [768], [], [], [], []],
             [BF16, BF16, BF16, "ScalarList", "ScalarList", "ScalarList", "Scalar"],
             [[150528, 50176, 224, 1], [768, 256, 16, 1], [1], [], [], [], []], ["", "", "", "[16, 16]", "[0, 0]",
                                                                             "[1, 1]", "1"])
    assert (c.flops, c.bytes, c.family) == (0, 0, "composite")


# --- attention --------------------------------------------------------------------------------------------

B, H, TQ, TK, D = 2, 3, 8, 10, 16
Q, KV = [B, H, TQ, D], [B, H, TK, D]
QS, KS = [H * TQ * D, TQ * D, D, 1], [H * TK * D, TK * D, D, 1]


def test_sdpa_cpu_forward():
    c = cost("aten::_scaled_dot_product_flash_attention_for_cpu", [Q, KV, KV, [], [], [], []],
             [F32, F32, F32, "Scalar", "Scalar", "", ""], [QS, KS, KS, [], [], [], []], ["", "", "", "0.", "False", "", ""])
    assert c.flops == 4 * B * H * TQ * TK * D
    assert c.bytes == (B * H * TQ * D + 2 * B * H * TK * D) * 4 + B * H * TQ * D * 4 + B * H * TQ * 4
    assert c.family == "attention" and c.note == ""


def test_sdpa_cpu_causal_note_and_mask_bytes():
    c = cost("aten::_scaled_dot_product_flash_attention_for_cpu", [Q, Q, Q, [], [], [], []],
             [F32, F32, F32, "Scalar", "Scalar", "", ""], [QS, QS, QS, [], [], [], []], ["", "", "", "0.", "True", "", ""])
    # top-left causal, Tq == Tk == 8: query i sees keys 0..i, 1 + 2 + ... + 8 = 36 of the 64 pairs
    assert c.flops == 2 * B * H * 36 * (D + D)
    assert c.note == CAUSAL_NOTE
    m = cost("aten::_scaled_dot_product_flash_attention_for_cpu", [Q, KV, KV, [], [], [TQ, TK], []],
             [F32, F32, F32, "Scalar", "Scalar", F32, ""], [QS, KS, KS, [], [], [TK, 1], []],
             ["", "", "", "0.", "False", "", ""])
    assert m.bytes == (B * H * TQ * D + 2 * B * H * TK * D + TQ * TK) * 4 + B * H * TQ * D * 4 + B * H * TQ * 4


def test_sdpa_cpu_backward():
    c = cost("aten::_scaled_dot_product_flash_attention_for_cpu_backward",
             [[B, H, TQ, D], Q, KV, KV, Q, [B, H, TQ], [], [], [], []],
             [F32, F32, F32, F32, F32, F32, "Scalar", "Scalar", "", ""],
             [[0, 0, 0, 0], QS, KS, KS, QS, [H * TQ, 1, H], [], [], [], []], ["", "", "", "", "", "", "0.", "False", "", ""])
    assert c.flops == 10 * B * H * TQ * TK * D
    read = 4 + (B * H * TQ * D + 2 * B * H * TK * D + B * H * TQ * D + B * H * TQ) * 4
    assert c.bytes == read + (B * H * TQ * D + 2 * B * H * TK * D) * 4


def test_flash_attention_gpu_ops_from_trace():
    # BERT-small on H100: SDPA wrapper [B, H, T, D] over the raw kernel [B, T, H, D]; both count the same
    wrapper = cost("aten::_scaled_dot_product_flash_attention", [[1, 8, 141, 64]] * 3 + [[], [], [], []],
                   [BF16] * 3 + ["Scalar"] * 4, [[72192, 64, 512, 1]] * 3 + [[], [], [], []],
                   ["", "", "", "0.", "False", "False", "0.125"])
    raw = cost("aten::_flash_attention_forward", [[1, 141, 8, 64]] * 3 + [[]] * 12,
               [BF16] * 3 + ["", "", "Scalar", "Scalar", "Scalar", "Scalar", "Scalar", "Scalar", "", "", "", ""],
               [[72192, 512, 64, 1]] * 3 + [[]] * 12,
               ["", "", "", "", "", "141", "141", "0.", "False", "False", "0.125", "", "", "", ""])
    assert wrapper.flops == raw.flops == 4 * 1 * 8 * 141 * 141 * 64
    assert wrapper.bytes == raw.bytes == 4 * 141 * 8 * 64 * 2 + 8 * 141 * 4


def test_efficient_attention_and_causal_mask_type():
    c = cost("aten::_scaled_dot_product_efficient_attention", [Q, KV, KV, [], [], [], [], []],
             [BF16, BF16, BF16, "", "Scalar", "Scalar", "Scalar", ""], [QS, KS, KS, [], [], [], [], []],
             ["", "", "", "", "True", "0.", "True", ""])
    # SDPA's is_causal is top-left: Tq 8, Tk 10, query i sees keys 0..i: 1 + 2 + ... + 8 = 36 pairs
    assert c.flops == 2 * B * H * 36 * (D + D) and c.note == CAUSAL_NOTE
    assert c.bytes == (B * H * TQ * D + 2 * B * H * TK * D) * 2 + B * H * TQ * D * 2 + B * H * TQ * 4

    def raw(mask_type: str) -> Cost:  # raw kernel [B, T, H, D]
        return cost("aten::_efficient_attention_forward", [[B, TQ, H, D], [B, TK, H, D], [B, TK, H, D]] + [[]] * 11,
                    [BF16] * 3 + ["", "", "", "", "", "Scalar", "Scalar", "Scalar", "", "", ""],
                    [[]] * 14, ["", "", "", "", "", "", "", "", "0.", mask_type, "False", "", "", ""])

    assert raw("0").flops == 4 * B * H * TQ * TK * D and raw("0").note == ""
    # custom_mask_type 1 = CausalFromTopLeft: the same 36 pairs
    assert raw("1").flops == 2 * B * H * 36 * (D + D) and raw("1").note == CAUSAL_NOTE
    # 2 = CausalFromBottomRight: query i sees keys 0..i+2: 3 + 4 + ... + 10 = 52 pairs
    assert raw("2").flops == 2 * B * H * 52 * (D + D) and raw("2").note == CAUSAL_NOTE
    assert raw("1").bytes == raw("2").bytes == (B * H * TQ * D + 2 * B * H * TK * D) * 2 + B * H * TQ * D * 2


def test_gqa_counts_query_heads_and_backward_gpu():
    hq, hkv = 8, 2
    c = cost("aten::_scaled_dot_product_flash_attention_backward",
             [[B, hq, TQ, D], [B, hq, TQ, D], [B, hkv, TK, D], [B, hkv, TK, D], [B, hq, TQ, D], [B, hq, TQ]] + [[]] * 9,
             [BF16] * 5 + [F32, "", "", "Scalar", "Scalar", "Scalar", "Scalar", BF16, BF16, ""], [[]] * 15,
             [""] * 8 + ["8", "10", "0.", "True", "", "", ""])
    # the flash kernels' is_causal is bottom-right (FlashAttention-2): Tq 8, Tk 10 -> 52 pairs (see above)
    assert c.flops == 2 * B * hq * 52 * (3 * D + 2 * D) and c.note == CAUSAL_NOTE


def test_causal_pairs_against_the_mask():
    for tq in range(1, 9):
        for tk in range(1, 9):
            top_left = sum(1 for i in range(tq) for j in range(tk) if j <= i)
            bottom_right = sum(1 for i in range(tq) for j in range(tk) if j <= i + tk - tq)
            assert causal_pairs(tq, tk, TOP_LEFT) == top_left, (tq, tk)
            assert causal_pairs(tq, tk, BOTTOM_RIGHT) == bottom_right, (tq, tk)
    assert causal_pairs(4096, 4096) == 4096 * 4097 // 2  # about half the square
    assert causal_pairs(1, 4096, BOTTOM_RIGHT) == 4096  # decoding one token sees every key
    assert causal_pairs(1, 4096, TOP_LEFT) == 1


def test_flash_sliding_window_is_noted():
    args = [[1, 128, 8, 64]] * 3 + [[]] * 14
    types = [BF16] * 3 + ["", "", "Scalar", "Scalar", "Scalar", "Scalar", "Scalar", "Scalar", "Scalar", "Scalar", "",
                          "", "", ""]
    conc = ["", "", "", "", "", "128", "128", "0.", "True", "False", "0.125", "32", "0", "", "", "", ""]
    c = cost("aten::_flash_attention_forward", args, types, [[]] * 17, conc)
    assert c.flops == 2 * 1 * 8 * (128 * 129 // 2) * (64 + 64)
    assert c.note == CAUSAL_NOTE + "; " + WINDOW_NOTE


def test_sdpa_wrapper_is_composite():
    c = cost("aten::scaled_dot_product_attention", [[1, 8, 141, 64]] * 3 + [[], [], [], [], []],
             [BF16] * 3 + ["", "Scalar", "Scalar", "", "Scalar"], [[72192, 64, 512, 1]] * 3 + [[]] * 5,
             ["", "", "", "", "0.", "False", "", "False"])
    assert (c.flops, c.bytes, c.family) == (0, 0, "composite")


def test_scaled_and_int_mm_dtypes():
    # _scaled_mm(self, mat2, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum)
    args = [[64, 128], [128, 32], [], [], [], [], [], []]
    strides = [[128, 1], [1, 128], [], [], [], [], [], []]
    conc = ["", "", "", "", "", "", "15", "False"]
    fp8 = OpCall("aten::_scaled_mm", tuple(args), ("c10::Float8_e4m3fn", "c10::Float8_e4m3fn", F32, F32, "", "", "Scalar",
                                                   "Scalar"), tuple(strides), tuple(conc))
    int8 = OpCall("aten::_scaled_mm", tuple(args), ("signed char", "signed char", F32, F32, "", "", "Scalar", "Scalar"),
                  tuple(strides), tuple(conc))
    assert (floating_dtype(fp8), floating_dtype(int8)) == ("float8", "int8")  # not the float32 scales'
    c = estimate(int8)
    assert c.flops == 2 * 64 * 32 * 128 and c.bytes == (64 * 128 + 128 * 32) + 2 * 4 + 64 * 32 * 2  # bf16 out
    im = OpCall("aten::_int_mm", ([64, 128], [128, 32]), ("signed char", "signed char"), ([128, 1], [32, 1]), ("", ""))
    assert floating_dtype(im) == "int8"
    assert estimate(im).bytes == 64 * 128 + 128 * 32 + 64 * 32 * 4  # int32 out


def test_matmul_overloads_sharing_a_name():
    # addmm.dtype(self, mat1, mat2, out_dtype, beta, alpha): bf16 in, float32 out
    c = cost("aten::addmm", [[32], [8, 16], [16, 32], [], [], []], [BF16, BF16, BF16, "Scalar", "Scalar", "Scalar"],
             [[1], [16, 1], [1, 16], [], [], []], ["", "", "", "6", "1", "1"])
    assert c.bytes == (32 + 8 * 16 + 16 * 32) * 2 + 8 * 32 * 4
    # addmm.out(self, mat1, mat2, beta=0, alpha, out): beta 0, so the bias is not read
    c = cost("aten::addmm", [[32], [8, 16], [16, 32], [], [], [8, 32]], [F32, F32, F32, "Scalar", "Scalar", F32],
             [[1], [16, 1], [1, 16], [], [], [32, 1]], ["", "", "", "0", "1", ""])
    assert c.bytes == (8 * 16 + 16 * 32 + 8 * 32) * 4
    # mm.dtype(self, mat2, out_dtype=float32)
    c = cost("aten::mm", [[8, 16], [16, 32], []], [BF16, BF16, "Scalar"], [[16, 1], [32, 1], []], ["", "", "6"])
    assert (c.flops, c.bytes) == (2 * 8 * 32 * 16, (8 * 16 + 16 * 32) * 2 + 8 * 32 * 4)
    # _addmm_activation(self, mat1, mat2, beta, alpha, use_gelu=True): + 8 per output element
    c = cost("aten::_addmm_activation", [[32], [8, 16], [16, 32], [], [], []], [F32, F32, F32, "Scalar", "Scalar", "Scalar"],
             [[1], [16, 1], [1, 16], [], [], []], ["", "", "", "1", "1", "True"])
    assert (c.flops, c.bytes) == (2 * 8 * 32 * 16 + 8 * 8 * 32, (32 + 8 * 16 + 16 * 32 + 8 * 32) * 4)
