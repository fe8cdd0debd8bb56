"""Cost model: element-wise ops. Broadcasting, scalar operands, non-contiguous and expanded inputs, type
promotion, in-place and out= variants, activations and their backward ops, dropout. OpCalls are laid
out as torch.profiler records them (CPU traces, torch 2.13; the 2.6 GPU traces record some scalars
as "Scalar" where 2.13 records a 0-dim tensor)."""

from __future__ import annotations

import pytest

from opscope.costmodel import Cost, OpCall, estimate

F32, BF16, I64 = "float", "c10::BFloat16", "long int"


def cost(name, dims, dtypes, strides, concrete) -> Cost:
    c = estimate(OpCall(name, tuple(dims), tuple(dtypes), tuple(strides), tuple(concrete)))
    assert c is not None, name
    return c


def test_broadcast_2x3_plus_3():
    c = cost("aten::add", [[2, 3], [3], []], [F32, F32, "Scalar"], [[3, 1], [1], []], ["", "", "1"])
    assert c.flops == 2 * 3
    assert c.bytes == (2 * 3 + 3) * 4 + 2 * 3 * 4
    assert c.family == "elementwise" and not c.uses_tensor_cores


def test_broadcast_both_ways_and_reversed():
    # [4,1,6] + [5,1] -> [4,5,6]
    a = cost("aten::add", [[4, 1, 6], [5, 1], []], [F32, F32, "Scalar"], [[6, 6, 1], [1, 1], []], ["", "", "1"])
    assert a.flops == 4 * 5 * 6
    assert a.bytes == (4 * 1 * 6 + 5 * 1) * 4 + 4 * 5 * 6 * 4
    # [5,1] + [4,1,6]: same shape out, same cost
    b = cost("aten::add", [[5, 1], [4, 1, 6], []], [F32, F32, "Scalar"], [[1, 1], [6, 6, 1], []], ["", "", "1"])
    assert (b.flops, b.bytes) == (a.flops, a.bytes)


def test_alpha_costs_a_multiply():
    c = cost("aten::add", [[4, 6], [6], []], [F32, F32, "Scalar"], [[6, 1], [1], []], ["", "", "2"])
    assert c.flops == 2 * 4 * 6


def test_scalar_operand():
    # torch 2.6 (GPU trace): a Python scalar recorded as "Scalar": no bytes; eq writes bool
    c = cost("aten::eq", [[1, 141], []], [I64, "Scalar"], [[141, 1], []], ["", "1"])
    assert c.flops == 141
    assert c.bytes == 141 * 8 + 141 * 1
    # torch 2.13: `x + 2.0` records a 0-dim "double" tensor (8 bytes read); the result stays float32
    c = cost("aten::add", [[4, 6], [], []], [F32, "double", "Scalar"], [[6, 1], [], []], ["", "", "1"])
    assert c.flops == 4 * 6
    assert c.bytes == 4 * 6 * 4 + 8 + 4 * 6 * 4


def test_type_promotion():
    # int64 tensor * Python float -> float32 output
    c = cost("aten::mul", [[4, 6], []], [I64, "double"], [[6, 1], []], ["", ""])
    assert c.bytes == 4 * 6 * 8 + 8 + 4 * 6 * 4
    # float32 + bfloat16 -> float32
    c = cost("aten::add", [[4, 6], [4, 6], []], [F32, BF16, "Scalar"], [[6, 1], [6, 1], []], ["", "", "1"])
    assert c.bytes == 4 * 6 * 4 + 4 * 6 * 2 + 4 * 6 * 4
    # bfloat16 + float16 -> float32
    c = cost("aten::mul", [[8], [8]], [BF16, "c10::Half"], [[1], [1]], ["", ""])
    assert c.bytes == 8 * 2 + 8 * 2 + 8 * 4
    # true division of integers gives float32
    c = cost("aten::div", [[4, 6], []], [I64, I64], [[6, 1], []], ["", ""])
    assert c.bytes == 4 * 6 * 8 + 8 + 4 * 6 * 4


def test_transposed_input_reads_its_storage_once():
    # a.t() + b: [6,4] with strides [1,6]
    c = cost("aten::add", [[6, 4], [6, 4], []], [F32, F32, "Scalar"], [[1, 6], [4, 1], []], ["", "", "1"])
    assert c.flops == 6 * 4
    assert c.bytes == 6 * 4 * 4 * 3


def test_expanded_input_counts_real_storage():
    # b.expand(4, 6) * a: the expanded operand has stride 0 along dim 0
    c = cost("aten::mul", [[4, 6], [4, 6]], [F32, F32], [[0, 1], [6, 1]], ["", ""])
    assert c.flops == 4 * 6
    assert c.bytes == 6 * 4 + 4 * 6 * 4 + 4 * 6 * 4
    # a fully expanded scalar (the grad of .sum()): 1 element of storage
    c = cost("aten::mul", [[2, 4, 6], [2, 4, 6]], [F32, F32], [[0, 0, 0], [24, 6, 1]], ["", ""])
    assert c.bytes == 4 + 2 * 4 * 6 * 4 * 2


def test_in_place_reads_and_writes_self_once():
    c = cost("aten::add_", [[1, 141, 512], [1, 141, 512], []], [BF16, BF16, "Scalar"],
             [[72192, 512, 1], [72192, 512, 1], []], ["", "", "1"])
    assert c.flops == 141 * 512
    assert c.bytes == 141 * 512 * 2 * 3  # read self + other, write self
    c = cost("aten::relu_", [[4, 6]], [F32], [[6, 1]], [""])
    assert (c.flops, c.bytes) == (4 * 6, 4 * 6 * 4 * 2)
    # broadcast in-place (conv bias add on the GPU trace): self [4,768,14,14] += bias [1,768,1,1]
    c = cost("aten::add_", [[4, 768, 14, 14], [1, 768, 1, 1], []], [BF16, BF16, "Scalar"],
             [[150528, 196, 14, 1], [768, 1, 1, 1], []], ["", "", "1"])
    assert c.flops == 4 * 768 * 14 * 14
    assert c.bytes == 4 * 768 * 196 * 2 * 2 + 768 * 2


def test_out_variant_destination_is_written_not_read():
    # abs -> abs.out(self, out=[0]) on CPU; hardtanh.out(self, min, max, out) -> clamp.out(..., out)
    c = cost("aten::abs", [[4, 6], [0]], [F32, F32], [[6, 1], [1]], ["", ""])
    assert (c.flops, c.bytes) == (4 * 6, 4 * 6 * 4 * 2)
    c = cost("aten::clamp", [[4, 6], [], [], [4, 6]], [F32, "Scalar", "Scalar", F32], [[6, 1], [], [], [6, 1]],
             ["", "-1.", "1.", ""])
    assert (c.flops, c.bytes) == (2 * 4 * 6, 4 * 6 * 4 * 2)
    # mul_(Scalar) on CPU calls mul.out(0-dim double, self, out=self)
    c = cost("aten::mul", [[], [16, 8], [16, 8]], ["double", F32, F32], [[], [8, 1], [8, 1]], ["", "", ""])
    assert (c.flops, c.bytes) == (16 * 8, 8 + 16 * 8 * 4 * 2)


def test_comparisons_write_bool_and_logical_ops():
    c = cost("aten::lt", [[4, 6], []], [F32, "Scalar"], [[6, 1], []], ["", "0"])
    assert (c.flops, c.bytes) == (4 * 6, 4 * 6 * 4 + 4 * 6)
    c = cost("aten::logical_and", [[4, 6], [6]], ["bool", "bool"], [[6, 1], [1]], ["", ""])
    assert (c.flops, c.bytes) == (4 * 6, 4 * 6 + 6 + 4 * 6)


@pytest.mark.parametrize(("name", "per_elem"), [
    ("aten::relu", 1), ("aten::neg", 1), ("aten::exp", 1), ("aten::tanh", 1), ("aten::rsqrt", 1),
    ("aten::sigmoid", 4), ("aten::erf", 4), ("aten::silu", 5), ("aten::mish", 5), ("aten::hardswish", 5),
    ("aten::hardsigmoid", 4), ("aten::gelu", 8), ("aten::log_sigmoid_forward", 6),
])
def test_unary_flops_per_element(name, per_elem):
    c = cost(name, [[4, 6]], [F32], [[6, 1]], [""])
    assert (c.flops, c.bytes) == (per_elem * 4 * 6, 4 * 6 * 4 * 2)


def test_gelu_from_gpu_trace_and_integer_input_to_float():
    # gelu(x, approximate): the string argument is recorded as nothing, so both forms count 8
    c = cost("aten::gelu", [[1, 141, 2048], []], [BF16, ""], [[288768, 2048, 1], []], ["", ""])
    assert (c.flops, c.bytes) == (8 * 141 * 2048, 141 * 2048 * 2 * 2)
    c = cost("aten::sqrt", [[10]], [I64], [[1]], [""])
    assert c.bytes == 10 * 8 + 10 * 4


def test_activation_arguments():
    assert cost("aten::hardtanh", [[4, 6], [], []], [F32, "Scalar", "Scalar"], [[6, 1], [], []],
                ["", "-1.", "1."]).flops == 2 * 4 * 6
    assert cost("aten::leaky_relu", [[4, 6], []], [F32, "Scalar"], [[6, 1], []], ["", "0.1"]).flops == 2 * 4 * 6
    assert cost("aten::elu", [[4, 6], [], [], []], [F32, "Scalar", "Scalar", "Scalar"], [[6, 1], [], [], []],
                ["", "1.", "1", "1"]).flops == 4 * 4 * 6
    assert cost("aten::softplus", [[4, 6], [], []], [F32, "Scalar", "Scalar"], [[6, 1], [], []],
                ["", "1", "20"]).flops == 5 * 4 * 6
    assert cost("aten::threshold", [[4, 6], [], []], [F32, "Scalar", "Scalar"], [[6, 1], [], []],
                ["", "0.1", "2."]).flops == 4 * 6
    one_bound = cost("aten::clamp", [[4, 6], [], []], [F32, "Scalar", ""], [[6, 1], [], []], ["", "0", ""])
    assert one_bound.flops == 4 * 6


def test_pow_exponents():
    square = cost("aten::pow", [[4, 6], []], [F32, "Scalar"], [[6, 1], []], ["", "2"])
    assert square.flops == 4 * 6
    assert cost("aten::pow", [[4, 6], []], [F32, "Scalar"], [[6, 1], []], ["", "3"]).flops == 2 * 4 * 6
    assert cost("aten::pow", [[4, 6], []], [F32, "Scalar"], [[6, 1], []], ["", "1.7"]).flops == 3 * 4 * 6
    tensor_exp = cost("aten::pow", [[4, 6], [6]], [F32, F32], [[6, 1], [1]], ["", ""])
    assert (tensor_exp.flops, tensor_exp.bytes) == (3 * 4 * 6, (4 * 6 + 6 + 4 * 6) * 4)


def test_ternary_ops():
    c = cost("aten::where", [[4, 6], [4, 6], [6]], ["bool", F32, F32], [[6, 1], [6, 1], [1]], ["", "", ""])
    assert (c.flops, c.bytes) == (4 * 6, 4 * 6 + 4 * 6 * 4 + 6 * 4 + 4 * 6 * 4)
    c = cost("aten::masked_fill", [[4, 6], [4, 6], []], [F32, "bool", "Scalar"], [[6, 1], [6, 1], []], ["", "", "0."])
    assert (c.flops, c.bytes) == (4 * 6, 4 * 6 * 4 + 4 * 6 + 4 * 6 * 4)
    c = cost("aten::addcmul", [[4, 6], [4, 6], [6], []], [F32, F32, F32, "Scalar"], [[6, 1], [6, 1], [1], []],
             ["", "", "", "0.5"])
    assert (c.flops, c.bytes) == (3 * 4 * 6, (4 * 6 * 2 + 6 + 4 * 6) * 4)
    c = cost("aten::lerp", [[4, 6], [4, 6], []], [F32, F32, "Scalar"], [[6, 1], [6, 1], []], ["", "", "0.3"])
    assert (c.flops, c.bytes) == (3 * 4 * 6, 3 * 4 * 6 * 4)
    assert cost("aten::where", [[4, 6]], ["bool"], [[6, 1]], [""]).family == "composite"  # where(cond)


@pytest.mark.parametrize(("name", "per_elem"), [
    ("aten::threshold_backward", 1), ("aten::sigmoid_backward", 3), ("aten::tanh_backward", 3),
    ("aten::gelu_backward", 14), ("aten::silu_backward", 9), ("aten::mish_backward", 14),
    ("aten::hardswish_backward", 4), ("aten::hardsigmoid_backward", 2),
])
def test_backward_elementwise(name, per_elem):
    # (grad_output, self/output[, scalar]); grad_output of a .sum() is an expanded scalar
    c = cost(name, [[4, 6], [4, 6], []], [F32, F32, "Scalar"], [[0, 0], [6, 1], []], ["", "", "0"])
    assert c.flops == per_elem * 4 * 6
    assert c.bytes == 4 + 4 * 6 * 4 + 4 * 6 * 4


def test_backward_with_grad_input_out_and_odd_layouts():
    # threshold_backward.grad_input(grad_output, self, threshold, *, grad_input)
    c = cost("aten::threshold_backward", [[4, 6], [4, 6], [], [4, 6]], [F32, F32, "Scalar", F32],
             [[6, 1], [6, 1], [], [6, 1]], ["", "", "0", ""])
    assert (c.flops, c.bytes) == (4 * 6, 3 * 4 * 6 * 4)
    # elu_backward(grad_output, alpha, scale, input_scale, is_result, self_or_result)
    c = cost("aten::elu_backward", [[4, 6], [], [], [], [], [4, 6]], [F32, "Scalar", "Scalar", "Scalar", "Scalar", F32],
             [[6, 1], [], [], [], [], [6, 1]], ["", "1.", "1", "1", "False", ""])
    assert (c.flops, c.bytes) == (3 * 4 * 6, 3 * 4 * 6 * 4)
    # hardtanh_backward(grad_output, self, min, max)
    c = cost("aten::hardtanh_backward", [[4, 6], [4, 6], [], []], [BF16, BF16, "Scalar", "Scalar"],
             [[6, 1], [6, 1], [], []], ["", "", "-1.", "1."])
    assert (c.flops, c.bytes) == (2 * 4 * 6, 3 * 4 * 6 * 2)


def test_dropout():
    # native_dropout(input, p, train) -> (output, bool mask)
    c = cost("aten::native_dropout", [[4, 6], [], []], [F32, "Scalar", "Scalar"], [[6, 1], [], []], ["", "0.5", "True"])
    assert (c.flops, c.bytes) == (2 * 4 * 6, 4 * 6 * 4 + 4 * 6 * 4 + 4 * 6 * 1)
    c = cost("aten::native_dropout_backward", [[4, 6], [4, 6], []], [F32, "bool", "Scalar"], [[6, 1], [6, 1], []],
             ["", "", "2."])
    assert (c.flops, c.bytes) == (2 * 4 * 6, 4 * 6 * 4 + 4 * 6 + 4 * 6 * 4)
    # aten::dropout: eval is a no-op, train delegates to bernoulli_/div_/mul (CPU) or native_dropout
    for train in ("False", "True"):
        d = cost("aten::dropout", [[1, 141, 512], [], []], [BF16, "Scalar", "Scalar"],
                 [[72192, 512, 1], [], []], ["", "0.10000000000000001", train])
        assert (d.flops, d.bytes, d.family) == (0, 0, "composite")


def test_glu_halves_the_input():
    c = cost("aten::glu", [[4, 6], []], [F32, "Scalar"], [[6, 1], []], ["", "-1"])
    assert (c.flops, c.bytes) == (5 * 4 * 3, 4 * 6 * 4 + 4 * 3 * 4)


@pytest.mark.parametrize("name", ["aten::relu6", "aten::selu", "aten::square", "aten::__and__", "aten::prelu"])
def test_elementwise_composites(name):
    c = cost(name, [[4, 6]], [F32], [[6, 1]], [""])
    assert (c.flops, c.bytes, c.family) == (0, 0, "composite")
