"""Cost model: the argument positions the cost functions read, checked against torch's op schemas.

torch.profiler records one entry per schema argument, positional and keyword-only, in schema order, so
a position is right when the schema's argument there has the expected name. This covers the GPU-only
ops (flash/efficient/cudnn attention, cudnn/miopen convolutions and batch norm, fused optimizers) that
no CPU trace can exercise."""

from __future__ import annotations

import pytest

from opscope.costmodel.attention import ATTENTION_OPS
from opscope.costmodel.conv import CONV_OPS

torch = pytest.importorskip("torch")


def arg_names(op: str, overload: str = "default") -> list[str]:
    packet = getattr(torch.ops.aten, op)
    return [a.name for a in getattr(packet, overload)._schema.arguments]


@pytest.mark.parametrize("op", sorted(ATTENTION_OPS))
def test_attention_positions(op):
    spec = ATTENTION_OPS[op]
    names = arg_names(op)
    assert names[spec.q] in ("query", "query_")
    assert names[spec.q + 1] == "key" and names[spec.q + 2] == "value"
    if spec.causal is not None:
        assert names[spec.causal] == "is_causal"
    if spec.mask_type is not None:
        assert names[spec.mask_type] == "custom_mask_type"
    for i in spec.window:
        assert names[i] in ("window_size", "window_size_left", "window_size_right")
    for i in spec.masks:
        assert names[i] in ("attn_mask", "attn_bias", "bias")
    if not isinstance(spec.lse, bool):
        assert names[spec.lse] == "compute_log_sumexp"
    if spec.backward:
        assert names[spec.grad] in ("grad_out", "grad_out_")
        assert names[spec.out] == "out"
        assert names[spec.logsumexp] == "logsumexp"
    if spec.varlen is not None:
        cu, max_q, max_k = (names[i] for i in spec.varlen)
        assert cu in ("cum_seq_q", "cu_seqlens_q")
        assert max_q in ("max_q", "max_seqlen_q") and max_k in ("max_k", "max_seqlen_k")


CONV_NAMES = {
    "bias": ("bias",),
    "stride": ("stride",),
    "padding": ("padding", "pad"),
    "dilation": ("dilation",),
    "transposed": ("transposed",),
    "output_padding": ("output_padding",),
    "groups": ("groups",),
}


@pytest.mark.parametrize("op", sorted(CONV_OPS))
def test_conv_positions(op):
    spec = CONV_OPS[op]
    names = arg_names(op)
    assert names[0] in ("self", "input") and names[1] == "weight"
    for field, expected in CONV_NAMES.items():
        pos = getattr(spec, field)
        if isinstance(pos, bool) or pos is None:
            continue
        assert names[pos] in expected, (field, pos, names)
    for i in spec.extra_inputs:
        assert names[i] == "z"


# Positions read by hand-written cost functions: (op, overload) -> {position: schema argument name}.
POSITIONS = {
    ("native_layer_norm", "default"): {1: "normalized_shape", 2: "weight", 3: "bias"},
    ("native_layer_norm_backward", "default"): {3: "mean", 4: "rstd", 5: "weight", 7: "output_mask"},
    ("native_group_norm", "default"): {1: "weight", 2: "bias", 3: "N", 6: "group"},
    ("native_group_norm_backward", "default"): {2: "mean", 3: "rstd", 4: "weight", 9: "output_mask"},
    ("native_batch_norm", "default"): {3: "running_mean", 4: "running_var", 5: "training"},
    ("native_batch_norm_backward", "default"): {2: "weight", 5: "save_mean", 6: "save_invstd", 7: "train",
                                                9: "output_mask"},
    ("batch_norm_backward", "default"): {2: "weight", 5: "save_mean", 6: "save_var", 7: "update", 9: "output_mask"},
    ("_native_batch_norm_legit", "default"): {3: "running_mean", 5: "training"},
    ("_native_batch_norm_legit", "no_stats"): {3: "training"},
    ("_native_batch_norm_legit_no_training", "default"): {3: "running_mean", 4: "running_var"},
    ("cudnn_batch_norm", "default"): {3: "running_mean", 5: "training"},
    ("miopen_batch_norm", "default"): {3: "running_mean", 5: "training"},
    ("cudnn_batch_norm_backward", "default"): {0: "input", 1: "grad_output", 2: "weight", 5: "save_mean",
                                               6: "save_var"},
    ("miopen_batch_norm_backward", "default"): {0: "input", 1: "grad_output", 2: "weight", 5: "save_mean"},
    ("_fused_rms_norm", "default"): {1: "normalized_shape", 2: "weight"},
    ("_fused_rms_norm_backward", "default"): {3: "rstd", 4: "weight", 5: "output_mask"},
    ("convolution_backward", "default"): {7: "transposed", 9: "groups", 10: "output_mask"},
    ("convolution_backward_overrideable", "default"): {6: "transposed", 8: "groups", 9: "output_mask"},
    ("_slow_conv2d_backward", "output_mask"): {6: "output_mask"},
    ("_softmax", "default"): {1: "dim", 2: "half_to_float"},
    ("_softmax_backward_data", "default"): {3: "input_dtype"},
    ("max_pool2d_with_indices", "default"): {1: "kernel_size", 2: "stride", 3: "padding", 4: "dilation",
                                             5: "ceil_mode"},
    ("max_pool1d", "default"): {1: "kernel_size", 2: "stride", 3: "padding", 4: "dilation", 5: "ceil_mode"},
    ("avg_pool2d", "default"): {1: "kernel_size", 2: "stride", 3: "padding", 4: "ceil_mode"},
    ("max_pool2d_with_indices_backward", "default"): {7: "indices"},
    ("avg_pool2d_backward", "default"): {2: "kernel_size"},
    ("adaptive_max_pool2d_backward", "default"): {2: "indices"},
    ("index_select", "default"): {1: "dim", 2: "index"},
    ("gather", "default"): {1: "dim", 2: "index"},
    ("scatter", "src"): {2: "index", 3: "src"},
    ("scatter_add", "default"): {2: "index", 3: "src"},
    ("index_add", "default"): {2: "index", 3: "source"},
    ("_index_put_impl_", "default"): {1: "indices", 2: "values", 3: "accumulate"},
    ("embedding_dense_backward", "default"): {1: "indices", 2: "num_weights"},
    ("_embedding_bag", "default"): {2: "offsets", 6: "per_sample_weights", 7: "include_last_offset"},
    ("nll_loss_forward", "default"): {2: "weight", 3: "reduction"},
    ("nll_loss_backward", "default"): {2: "target", 3: "weight"},
    ("mse_loss", "default"): {2: "reduction"},
    ("smooth_l1_loss", "default"): {2: "reduction", 3: "beta"},
    ("binary_cross_entropy", "default"): {2: "weight", 3: "reduction"},
    ("addmm", "default"): {3: "beta"},
    ("baddbmm", "default"): {3: "beta"},
    ("addmv", "default"): {3: "beta"},
    ("_addmm_activation", "default"): {5: "use_gelu"},
    ("_scaled_mm", "default"): {2: "scale_a", 4: "bias", 6: "out_dtype"},
    ("sum", "dim_IntList"): {1: "dim", 2: "keepdim", 3: "dtype"},
    ("sum", "default"): {1: "dtype"},
    ("prod", "dim_int"): {1: "dim", 2: "keepdim", 3: "dtype"},
    ("var", "correction"): {1: "dim", 3: "keepdim"},
    ("var", "dim"): {1: "dim", 3: "keepdim"},
    ("linalg_vector_norm", "default"): {1: "ord", 2: "dim", 3: "keepdim", 4: "dtype"},
    ("norm", "ScalarOpt_dim_dtype"): {1: "p", 2: "dim", 3: "keepdim", 4: "dtype"},
    ("cumsum", "default"): {2: "dtype"},
    ("add", "Tensor"): {2: "alpha"},
    ("elu_backward", "default"): {5: "self_or_result"},
    ("log_sigmoid_backward", "default"): {2: "buffer"},
    ("_fused_adam_", "default"): {4: "max_exp_avg_sqs", 13: "grad_scale"},
    ("_fused_sgd_", "default"): {2: "momentum_buffer_list", 3: "weight_decay"},
    ("upsample_nearest2d", "vec"): {1: "output_size", 2: "scale_factors"},
    ("upsample_nearest2d_backward", "default"): {2: "input_size"},
    ("arange", "start_step"): {2: "step", 3: "dtype"},
    ("zeros", "default"): {1: "dtype"},
    ("full", "default"): {2: "dtype"},
    ("new_zeros", "default"): {2: "dtype"},
    ("linspace", "default"): {2: "steps", 3: "dtype"},
    ("logspace", "default"): {4: "dtype"},
}


@pytest.mark.parametrize(("op", "overload"), sorted(POSITIONS))
def test_hand_written_positions(op, overload):
    names = arg_names(op, overload)
    for pos, name in POSITIONS[(op, overload)].items():
        assert names[pos] == name, (op, overload, pos, names)
