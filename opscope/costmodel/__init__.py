"""opscope's cost model: FLOPs and minimum bytes of one aten op call, from what torch.profiler records
(Input Dims / Input type / Input Strides / Concrete Inputs). Torch-free; one small cost function per op,
registered with `@register("aten::...")` in a module per op family. Outputs are not recorded, so
output shapes are derived from input shapes, op semantics and concrete arguments.

How opscope counts
==================

General rules
-------------
* A multiply-add is 2 FLOPs. FLOPs and bytes are per call.
* Bytes are the minimum memory traffic: each input's distinct storage read once (a broadcast or
  expanded input, stride 0 along a dim, counts its real storage only), plus each output element
  written once (output numel = the broadcast shape; the dtype follows type promotion, comparisons
  write bool). `out=` and `copy_` destinations are written, not read. In-place ops (`add_`, `relu_`,
  ...) read and write self once each. A Python scalar operand is recorded either as "Scalar" (0 bytes)
  or as a 0-dim "double"/"long int" tensor (read once: 8 bytes).
* Gathers (index_select, embedding via index_select, gather, index, embedding_bag, nearest
  upsampling) read the indices and only the rows/elements they select, not the whole source. Scatters
  (scatter, scatter_add, index_add, index_put, embedding_dense_backward) read indices + source values
  and write (read-modify-write when accumulating) only the addressed elements. Where an op always
  zero-fills its output through a child aten::zero_ / zeros (nll_loss_backward,
  embedding_dense_backward), the fill is counted at that child.
* Factory ops write their output (0 FLOPs; random generation not counted); empty / empty_like /
  empty_strided / new_empty allocate only: 0 bytes.
* View/metadata ops (view, reshape, transpose, permute, expand, slice, select, squeeze, unsqueeze,
  flatten, split, chunk, unbind, detach, as_strided, t, resize_, item, _local_scalar_dense, ...) are
  0 FLOPs / 0 bytes, family "view".
* Composite ops that always delegate their work to a child aten op are 0 / 0, family "composite"
  (linear, matmul, einsum, conv1d/2d/3d, conv_transpose1d/2d/3d, convolution, layer_norm, group_norm,
  batch_norm, _batch_norm_impl_index, instance_norm, rms_norm, scaled_dot_product_attention, softmax,
  log_softmax, dropout, cross_entropy_loss, nll_loss(_nd), embedding, embedding_bag, clone, contiguous,
  to, _to_copy, stack, repeat, pad, constant_pad_nd, max_pool2d/3d, adaptive_avg_pool1d/2d/3d, ...;
  evidence per op in each module). An op that only *sometimes* delegates (mean -> sum + div_ on CPU
  but one kernel on CUDA; _convolution, which runs CPU transposed convs itself; _foreach_* ops, split
  into per-tensor ops on CPU) carries its real cost; the analysis layer drops any op whose descendant
  has the same family and non-zero cost.
* `Cost.family` is one of: matmul, conv, attention (these three may use tensor cores), elementwise,
  reduction, norm, softmax, pool, gather, scatter, copy, factory, loss, view, composite.

Matrix products, convolution, attention
---------------------------------------
| op | FLOPs |
|---|---|
| mm [M,K]x[K,N], addmm, _addmm_activation, _scaled_mm, _int_mm | 2*M*N*K (a fused bias adds bytes only; _addmm_activation + 1 or 8 per output) |
| bmm, baddbmm [B,M,K]x[B,K,N]; addbmm | 2*B*M*N*K |
| mv, addmv [M,N]x[N] | 2*M*N |
| dot, vdot [N] | 2*N |
| convolution (every backend op) | as torch.utils.flop_counter: 2*N*prod(out_spatial)*prod(kernel)*w[0]*w[1]; transposed: input spatial instead of output; bias adds bytes only |
| convolution_backward | per output_mask: grad_input = the forward count with `transposed` flipped; grad_weight = 2*N*prod(kernel)*prod(grad_out spatial)*C_in*C_out (transposed: input spatial) — like FlopCounterMode, not divided by groups |
| SDPA forward (flash, efficient, cudnn, for_cpu, raw _flash/_efficient_attention_forward) | 2*B*Hq*Tq*Tk*(Dqk + Dv) = 4*B*H*Tq*Tk*D; no causal discount, causal calls noted |
| SDPA backward | 2*B*Hq*Tq*Tk*(3*Dqk + 2*Dv) = 10*B*H*Tq*Tk*D |

Element-wise FLOPs per output element
-------------------------------------
Transcendentals with a hardware/special-function instruction (exp, exp2, log, log2, sqrt, rsqrt,
reciprocal, sin, cos, tan, tanh, ...) count 1; erf/erfc/erfinv have none and count 4.

| op | FLOPs/element |
|---|---|
| add, sub, rsub (alpha == 1), mul, div, neg, abs, relu, sign, sgn, floor, ceil, round, trunc, maximum, minimum, fmax, fmin, clamp_min, clamp_max, clamp (one bound), threshold, hardshrink, heaviside, copysign, comparisons (eq ne lt le gt ge), logical and/or/xor/not, bitwise ops, where, masked_fill, isnan, isinf, signbit | 1 |
| exp, exp2, expm1, log, log2, log10, log1p, sqrt, rsqrt, reciprocal, sin, cos, tan, asin, acos, atan, atan2, sinh, cosh, tanh, asinh, acosh, atanh | 1 |
| add/sub with alpha != 1 | 2 |
| clamp (both bounds), hardtanh, leaky_relu, frac, floor_divide, remainder, fmod, xlogy, softshrink, prelu, isfinite | 2 |
| pow: x**2, x**0.5, x**-1, x**-0.5 / x**3 / other or tensor exponent | 1 / 2 / 3 |
| addcmul, addcdiv, lerp, logit, nan_to_num | 3 |
| sigmoid (neg, exp, add, div), hardsigmoid, erf, erfc, erfinv, hypot, elu | 4 |
| silu (x * sigmoid), mish, hardswish, softplus, glu (per output) | 5 |
| log_sigmoid | 6 |
| gelu (erf form: 4 + erf 4; the tanh form is ~8 too and the trace does not record `approximate`) | 8 |
| dropout (native_dropout: compare + scale; RNG not counted) | 2 |
| threshold_backward (ReLU backward) | 1 |
| hardtanh_backward, leaky_relu_backward, hardsigmoid_backward, native_dropout_backward | 2 |
| sigmoid_backward g*y*(1-y), tanh_backward g*(1-y*y), elu_backward, _prelu_kernel_backward | 3 |
| hardswish_backward | 4 |
| log_sigmoid_backward | 5 |
| softplus_backward | 6 |
| silu_backward (sigmoid 4 + 5) | 9 |
| gelu_backward, mish_backward | 14 |
| _foreach_X | X's number |
| fused Adam/AdamW / SGD (per parameter) | 14 (+1 amsgrad, +1 grad scaling) / 2 (+2 weight decay, +3 momentum) |

Reductions, normalization, softmax, pooling, losses
---------------------------------------------------
| op | FLOPs |
|---|---|
| sum, prod, cumsum, cumprod, amax, amin, max, min, argmax, argmin, all, any | 1 per input element |
| mean | 1 per input + 1 per output |
| nansum, count_nonzero, aminmax | 2 per input |
| var / std / var_mean / std_mean | 4 per input + 1 / 2 / 2 / 3 per output |
| norm, linalg_vector_norm: p=2 / p in {1, 0, inf} / other p | 2 per input + 1 per output / 2 per input / 5 per input + 3 per output |
| logsumexp | 4 per input + 2 per output; logcumsumexp 4 per element |
| softmax, log_softmax (max, sub, exp, sum, div or sub) | 5 per element |
| softmax / log_softmax backward | 4 per element |
| layer_norm, group_norm, batch_norm (training) | 6 per element, + 1 with weight, + 1 with bias (8) |
| batch_norm (eval) | 2 per element, + 1 weight, + 1 bias (4) |
| rms_norm | 3 per element, + 1 with weight (4) |
| norm backward (per output_mask entry) | grad_input 10 (eval batch norm 2, rms norm 7), grad_weight 2, grad_bias 1 per element |
| max pooling | 1 per window element per output |
| avg pooling | 1 per window element + 1 per output; adaptive: exact window sizes |
| pooling backward | max: 1 per grad_output element; avg: (window + 1) per grad_output element |
| nll_loss | 2 per target element (backward 1) |
| mse_loss | 3 per element (2 unreduced; backward 3) |
| smooth_l1_loss, huber_loss | 5 per element (backward 4) |
| binary_cross_entropy | 8 per element (backward 6) |
| embedding_dense_backward, scatter_add, index_add, accumulating index_put | 1 add per scattered element |
| embedding_bag | 1 add per gathered element (2 with per-sample weights) |
| upsampling: nearest / linear / bilinear / trilinear / bicubic | 0 / 4 / 8 / 16 / 32 per output (2 per tap); backward: 1 add (nearest) or 2 per tap per grad_output element |
| copies, cat, gathers, plain scatters, factories, views | 0 |

Known limits
------------
* torch.profiler records a TensorList's type only as "TensorList": cat/_foreach_*/fused-optimizer
  element dtypes come from `OpCall.list_dtype` when the caller sets it, else from a plain tensor
  argument, else float32 (Cost.note says so).
* It records string arguments as nothing: gelu's `approximate` and div's `rounding_mode` cannot be
  told apart (one number each), and `Tensor?[]` arguments as nothing: aten::index (x[idx]) has an
  unknown cost (None) unless its indices are recorded as a TensorList; index_put_ with a scalar value
  counts one element (noted).
* Variable-length (nested) flash/efficient attention is counted at batch x max sequence length
  (upper bound, noted); nonzero / masked_select outputs are data-dependent and not counted (noted).
* On CPU, _fused_rms_norm runs as pow/mean/rsqrt/mul children of other families, so its work is
  counted there as well as at the parent (on CUDA it is one kernel).
* Not modelled (estimate returns None): sort, topk, median, kthvalue, multinomial, unique, and other
  ops outside these tables.
"""

from opscope.costmodel import (  # noqa: F401  (importing registers each family's ops)
    attention,
    conv,
    elementwise,
    factory,
    indexing,
    loss,
    matmul,
    memory,
    norm,
    optimizer,
    pooling,
    reduction,
    resample,
    softmax,
    views,
)
from opscope.costmodel.base import (
    REGISTRY,
    TENSOR_CORE_FAMILIES,
    Cost,
    OpCall,
    TensorArg,
    estimate,
    floating_dtype,
    register,
)

FAMILIES = frozenset({
    "matmul", "conv", "attention", "elementwise", "reduction", "norm", "softmax", "pool", "gather",
    "scatter", "copy", "factory", "loss", "view", "composite",
})

__all__ = [
    "FAMILIES",
    "REGISTRY",
    "TENSOR_CORE_FAMILIES",
    "Cost",
    "OpCall",
    "TensorArg",
    "estimate",
    "floating_dtype",
    "register",
]
