"""Fused scaled-dot-product attention: the work the kernel does on the (query, key) pairs it computes.

Forward: 2*B*Hq*P*Dqk (Q @ K^T) + 2*B*Hq*P*Dv (P @ V), P = the (query, key) pairs per head: Tq*Tk, or for
a causal call the unmasked pairs only (a fused kernel skips the masked blocks; TraceLens and
FlashAttention's own benchmarks count causal attention as half the square). Without a mask this is
torch.utils.flop_counter's 4*B*H*Tq*Tk*D when Dqk == Dv; FlopCounterMode counts the full square for causal
calls too. Backward: 2*B*Hq*P*(Dqk + Dv + Dv + Dqk + Dqk) = 10*B*H*P*D (score recompute, dP, dV, dQ, dK).
GQA counts the query heads.

Causal pairs follow each op's alignment of the mask when Tq != Tk (causal_pairs): top-left (query i sees
keys j <= i) for torch's SDPA `is_causal` -- the math path (tril), the CPU flash kernel (checked against
an explicit tril mask), cuDNN (the graph's set_causal_mask) and the efficient kernels (SDPA passes
custom_mask_type 1 = CausalFromTopLeft; 2 = CausalFromBottomRight); bottom-right (query i sees keys j <=
i + Tk - Tq) for the CUDA flash kernels' `is_causal`, FlashAttention-2's convention (torch's SDPA
never routes a non-square causal call to them: sdp_utils' check_flash_causal_non_square_seqlens).

Bytes (unchanged by causality): forward reads Q, K, V (+ mask/bias) and writes the output (+ the float32
logsumexp where the op returns one); backward reads grad_out, Q, K, V, out, logsumexp (+ mask) and writes
dQ, dK, dV.

The SDPA wrappers take [B, H, T, D]; the raw kernels (_flash_attention_*, _efficient_attention_*) take
[B, T, H, D], or [total_tokens, H, D] (flash) / [1, total_tokens, H, D] (efficient) for variable-length
batches, whose per-sequence lengths are not recorded: those are counted at batch x max_seqlen (an
upper bound, noted). A sliding window (the raw kernels' window_size arguments) is not modelled (noted).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from opscope.costmodel.base import Cost, OpCall, TensorArg, UnreadableCall, composite, register

CAUSAL_NOTE = "causal: unmasked (query, key) pairs only (FlopCounterMode counts all Tq*Tk)"
VARLEN_NOTE = "variable-length batch: counted at max sequence length (upper bound)"
WINDOW_NOTE = "sliding window not modelled: counted without it (upper bound)"
TOP_LEFT, BOTTOM_RIGHT = "top-left", "bottom-right"
# The efficient kernels' custom_mask_type: 0 none, 1 CausalFromTopLeft, 2 CausalFromBottomRight.
MASK_TYPE_ALIGN: dict[float, str] = {1: TOP_LEFT, 2: BOTTOM_RIGHT}


def causal_pairs(tq: int, tk: int, align: str = TOP_LEFT) -> int:
    """The (query i, key j) pairs a causal mask keeps: j <= i (top-left) or j <= i + tk - tq
    (bottom-right), 0 <= i < tq, 0 <= j < tk. Row i keeps clamp(i + first, 0, tk) keys."""
    first = 1 + (tk - tq if align == BOTTOM_RIGHT else 0)  # keys row 0 keeps, before clamping
    i0 = min(tq, max(0, 1 - first))  # first row keeping any key
    i1 = min(tq, max(i0, tk - first))  # first row keeping every key
    partial = (i1 - i0) * first + (i0 + i1 - 1) * (i1 - i0) // 2  # rows i0..i1-1 keep i + first keys
    return partial + (tq - i1) * tk


@dataclass(frozen=True)
class AttnArgs:
    """Argument positions of one attention op."""

    q: int
    layout: str = "bhtd"  # "bhtd" (SDPA wrappers) or "bthd" (raw flash/efficient kernels)
    causal: int | None = None  # position of is_causal (bool)
    align: str = TOP_LEFT  # how is_causal aligns the mask when Tq != Tk
    mask_type: int | None = None  # position of custom_mask_type (efficient kernels: 1 top-left, 2 bottom-right)
    window: tuple[int, ...] = ()  # positions of window_size(_left/_right) (raw flash/efficient kernels)
    masks: tuple[int, ...] = ()  # positions of attn_mask / attn_bias tensors
    lse: bool | int = True  # writes a float32 logsumexp (True/False or position of compute_log_sumexp)
    backward: bool = False
    grad: int = 0  # backward: position of grad_out
    out: int | None = None  # backward: position of out
    logsumexp: int | None = None  # backward: position of logsumexp
    varlen: tuple[int, int, int] | None = None  # positions of cu_seqlens_q, max_q, max_k


def _bhtd(t: TensorArg, layout: str) -> tuple[int, int, int, int]:
    if len(t.shape) != 4:
        raise UnreadableCall(f"attention input of shape {list(t.shape)}, not 4 dims")
    if layout == "bthd":
        b, s, h, d = t.shape
        return b, h, s, d
    b, h, s, d = t.shape
    return b, h, s, d


def attention_cost(call: OpCall, spec: AttnArgs) -> Cost:
    q, k, v = call.required_tensor(spec.q), call.required_tensor(spec.q + 1), call.required_tensor(spec.q + 2)
    note = ""
    offsets = call.tensor(spec.varlen[0]) if spec.varlen is not None else None
    if spec.varlen is not None and offsets is not None:
        # cumulative sequence offsets: B = len(offsets) - 1, T = max_seqlen
        batch = offsets.numel - 1
        tq, tk = call.int_arg(spec.varlen[1]), call.int_arg(spec.varlen[2])
        if len(q.shape) == 3:  # [total, H, D]
            if len(v.shape) < 3:
                raise UnreadableCall(f"{call.name}: value of shape {list(v.shape)}")
            hq, dq = q.shape[1], q.shape[2]
            dv = v.shape[2]
        else:
            _, hq, _, dq = _bhtd(q, spec.layout)
            dv = _bhtd(v, spec.layout)[3]
        note = VARLEN_NOTE
    else:
        batch, hq, tq, dq = _bhtd(q, spec.layout)
        tk = _bhtd(k, spec.layout)[2]
        dv = _bhtd(v, spec.layout)[3]
    align = spec.align if spec.causal is not None and call.arg(spec.causal, False) is True else None
    if spec.mask_type is not None:
        mask_type = call.arg(spec.mask_type, 0)
        if isinstance(mask_type, (int, float)):
            align = MASK_TYPE_ALIGN.get(mask_type, align)
        elif mask_type is not None:
            raise UnreadableCall(f"{call.name}: custom_mask_type is {mask_type!r}")
    pairs = causal_pairs(tq, tk, align) if align else tq * tk
    notes = [CAUSAL_NOTE] if align else []
    if note:
        notes.append(note)
    if any(_is_window(call.arg(i)) for i in spec.window):
        notes.append(WINDOW_NOTE)
    note = "; ".join(notes)
    fwd_qk = 2 * batch * hq * pairs * dq
    fwd_pv = 2 * batch * hq * pairs * dv
    flops = (3 * fwd_qk + 2 * fwd_pv) if spec.backward else (fwd_qk + fwd_pv)

    read = q.storage_bytes + k.storage_bytes + v.storage_bytes
    for mask_index in spec.masks:
        mask = call.tensor(mask_index)
        read += mask.storage_bytes if mask is not None else 0
    out_bytes = batch * hq * tq * dv * q.itemsize
    lse_bytes = batch * hq * tq * 4
    if spec.backward:
        for position in (spec.grad, spec.out, spec.logsumexp):
            t = call.tensor(position) if position is not None else None
            read += t.storage_bytes if t is not None else 0
        written = q.nbytes + k.nbytes + v.nbytes
    else:
        with_lse = spec.lse if isinstance(spec.lse, bool) else call.arg(spec.lse, False) is True
        written = out_bytes + (lse_bytes if with_lse else 0)
    return Cost(flops, read + written, "attention", note)


def _is_window(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


ATTENTION_OPS: dict[str, AttnArgs] = {
    # (query, key, value, dropout_p, is_causal, *, attn_mask, scale) -> (output, logsumexp)
    "_scaled_dot_product_flash_attention_for_cpu": AttnArgs(0, causal=4, masks=(5,)),
    # (grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, *, attn_mask, scale)
    "_scaled_dot_product_flash_attention_for_cpu_backward": AttnArgs(
        1, causal=7, masks=(8,), backward=True, grad=0, out=4, logsumexp=5),
    # (query, key, value, dropout_p, is_causal, return_debug_mask, *, scale); CUDA: calls _flash_attention_forward
    "_scaled_dot_product_flash_attention": AttnArgs(0, causal=4, align=BOTTOM_RIGHT),
    # (grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, ...)
    "_scaled_dot_product_flash_attention_backward": AttnArgs(
        1, causal=11, align=BOTTOM_RIGHT, backward=True, grad=0, out=4, logsumexp=5),
    # (query, key, value, attn_bias, compute_log_sumexp, dropout_p, is_causal, *, scale)
    "_scaled_dot_product_efficient_attention": AttnArgs(0, causal=6, masks=(3,), lse=4),
    # (grad_out_, query, key, value, attn_bias, out, logsumexp, philox_seed, philox_offset, dropout_p,
    #  grad_input_mask, is_causal, *, scale)
    "_scaled_dot_product_efficient_attention_backward": AttnArgs(
        1, causal=11, masks=(4,), backward=True, grad=0, out=5, logsumexp=6),
    # (query, key, value, attn_bias, compute_log_sumexp, dropout_p, is_causal, return_debug_mask, *, scale)
    "_scaled_dot_product_cudnn_attention": AttnArgs(0, causal=6, masks=(3,), lse=4),
    # (grad_out, query, key, value, out, logsumexp, philox_seed, philox_offset, attn_bias, cum_seq_q,
    #  cum_seq_k, max_q, max_k, dropout_p, is_causal, *, scale)
    "_scaled_dot_product_cudnn_attention_backward": AttnArgs(
        1, causal=14, masks=(8,), backward=True, grad=0, out=4, logsumexp=5),
    # (query, key, value, attn_bias, dropout_p, is_causal, return_debug_mask, *, scale)
    "_scaled_dot_product_fused_attention_overrideable": AttnArgs(0, causal=5, masks=(3,)),
    # (grad_out, query, key, value, attn_bias, grad_input_mask, out, logsumexp, cum_seq_q, cum_seq_k,
    #  max_q, max_k, dropout_p, is_causal, ...)
    "_scaled_dot_product_fused_attention_overrideable_backward": AttnArgs(
        1, causal=13, masks=(4,), backward=True, grad=0, out=6, logsumexp=7),
    # [B, T, H, D]: (query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
    #  return_debug_mask, *, scale, window_size_left, window_size_right, seqused_k, alibi_slopes, ...)
    "_flash_attention_forward": AttnArgs(0, layout="bthd", causal=8, align=BOTTOM_RIGHT, varlen=(3, 5, 6),
                                         window=(11, 12)),
    # (grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
    #  is_causal, rng_state, unused, *, scale, window_size_left, window_size_right)
    "_flash_attention_backward": AttnArgs(
        1, layout="bthd", causal=11, align=BOTTOM_RIGHT, backward=True, grad=0, out=4, logsumexp=5,
        varlen=(6, 8, 9), window=(15, 16)),
    # [B, T, H, D]: (query, key, value, bias, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
    #  dropout_p, custom_mask_type, compute_log_sumexp, *, scale, seqlen_k, window_size)
    "_efficient_attention_forward": AttnArgs(
        0, layout="bthd", mask_type=9, masks=(3,), lse=10, varlen=(4, 6, 7), window=(13,)),
    # (grad_out_, query, key, value, bias, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
    #  logsumexp, dropout_p, philox_seed, philox_offset, custom_mask_type, bias_requires_grad, ...)
    "_efficient_attention_backward": AttnArgs(
        1, layout="bthd", mask_type=14, masks=(4,), backward=True, grad=0, out=5, logsumexp=10,
        varlen=(6, 8, 9), window=(18,)),
}

for _name, _spec in ATTENTION_OPS.items():
    register(f"aten::{_name}")(partial(attention_cost, spec=_spec))

# Always delegate: scaled_dot_product_attention picks one of the fused ops above (or the math path,
# itself a composite of bmm/softmax/... children).
for _name in ("scaled_dot_product_attention", "_scaled_dot_product_attention_math",
              "_scaled_dot_product_attention_math_for_mps"):
    register(f"aten::{_name}")(composite)


def sdpa_flops(b: int, h: int, tq: int, tk: int, d: int, dv: int | None = None, backward: bool = False,
               causal: str | None = None) -> int:
    """The formula, for tests and documentation (`causal`: None, TOP_LEFT or BOTTOM_RIGHT)."""
    dv = d if dv is None else dv
    pairs = causal_pairs(tq, tk, causal) if causal else tq * tk
    return (2 * b * h * pairs * (3 * d + 2 * dv)) if backward else (2 * b * h * pairs * (d + dv))

