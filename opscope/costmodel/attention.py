"""Fused scaled-dot-product attention, counted as torch.utils.flop_counter.FlopCounterMode counts it.

Forward: 2*B*Hq*Tq*Tk*Dqk (Q @ K^T) + 2*B*Hq*Tq*Tk*Dv (P @ V) = 4*B*H*Tq*Tk*D when Dqk == Dv.
Backward: 2*B*Hq*Tq*Tk*(Dqk + Dv + Dv + Dqk + Dqk) = 10*B*H*Tq*Tk*D (score recompute, dP, dV, dQ, dK).
No causal discount: a causal call gets Cost.note = CAUSAL_NOTE. GQA counts the query heads.
Bytes: forward reads Q, K, V (+ mask/bias) and writes the output (+ the float32 logsumexp where the op
returns one); backward reads grad_out, Q, K, V, out, logsumexp (+ mask) and writes dQ, dK, dV.

The SDPA wrappers take [B, H, T, D]; the raw kernels (_flash_attention_*, _efficient_attention_*) take
[B, T, H, D], or [total_tokens, H, D] (flash) / [1, total_tokens, H, D] (efficient) for variable-length
batches, whose per-sequence lengths are not recorded: those are counted at batch x max_seqlen (an
upper bound, noted).
"""

from __future__ import annotations

from dataclasses import dataclass

from opscope.costmodel.base import Cost, OpCall, TensorArg, composite, register

CAUSAL_NOTE = "causal: about half of these FLOPs do useful work"
VARLEN_NOTE = "variable-length batch: counted at max sequence length (upper bound)"


@dataclass(frozen=True)
class AttnArgs:
    """Argument positions of one attention op."""

    q: int
    layout: str = "bhtd"  # "bhtd" (SDPA wrappers) or "bthd" (raw flash/efficient kernels)
    causal: int | None = None  # position of is_causal (bool)
    mask_type: int | None = None  # position of custom_mask_type (int, efficient kernels; != 0 is causal)
    masks: tuple[int, ...] = ()  # positions of attn_mask / attn_bias tensors
    lse: bool | int = True  # writes a float32 logsumexp (True/False or position of compute_log_sumexp)
    backward: bool = False
    grad: int = 0  # backward: position of grad_out
    out: int | None = None  # backward: position of out
    logsumexp: int | None = None  # backward: position of logsumexp
    varlen: tuple[int, int, int] | None = None  # positions of cu_seqlens_q, max_q, max_k


def _bhtd(t: TensorArg, layout: str) -> tuple[int, int, int, int]:
    if layout == "bthd":
        b, s, h, d = t.shape
        return b, h, s, d
    b, h, s, d = t.shape
    return b, h, s, d


def attention_cost(call: OpCall, spec: AttnArgs) -> Cost:
    q, k, v = call.tensor(spec.q), call.tensor(spec.q + 1), call.tensor(spec.q + 2)
    note = ""
    if spec.varlen is not None and call.tensor(spec.varlen[0]) is not None and len(q.shape) == 3:
        # [total, H, D] with cumulative sequence offsets: B = len(offsets) - 1, T = max_seqlen
        batch = call.tensor(spec.varlen[0]).numel - 1
        tq, tk = int(call.arg(spec.varlen[1])), int(call.arg(spec.varlen[2]))
        hq, dq = q.shape[1], q.shape[2]
        dv = v.shape[2]
        note = VARLEN_NOTE
    elif spec.varlen is not None and call.tensor(spec.varlen[0]) is not None:
        batch = call.tensor(spec.varlen[0]).numel - 1
        tq, tk = int(call.arg(spec.varlen[1])), int(call.arg(spec.varlen[2]))
        _, hq, _, dq = _bhtd(q, spec.layout)
        dv = _bhtd(v, spec.layout)[3]
        note = VARLEN_NOTE
    else:
        batch, hq, tq, dq = _bhtd(q, spec.layout)
        tk = _bhtd(k, spec.layout)[2]
        dv = _bhtd(v, spec.layout)[3]
    fwd_qk = 2 * batch * hq * tq * tk * dq
    fwd_pv = 2 * batch * hq * tq * tk * dv
    flops = (3 * fwd_qk + 2 * fwd_pv) if spec.backward else (fwd_qk + fwd_pv)

    causal = spec.causal is not None and call.arg(spec.causal, False) is True
    if spec.mask_type is not None:
        mt = call.arg(spec.mask_type, 0)
        causal = causal or (isinstance(mt, int) and not isinstance(mt, bool) and mt != 0)
    if causal:
        note = CAUSAL_NOTE + (f"; {note}" if note else "")

    read = q.storage_bytes + k.storage_bytes + v.storage_bytes
    for i in spec.masks:
        m = call.tensor(i)
        read += m.storage_bytes if m is not None else 0
    out_bytes = batch * hq * tq * dv * q.itemsize
    lse_bytes = batch * hq * tq * 4
    if spec.backward:
        for i in (spec.grad, spec.out, spec.logsumexp):
            t = call.tensor(i) if i is not None else None
            read += t.storage_bytes if t is not None else 0
        written = q.nbytes + k.nbytes + v.nbytes
    else:
        with_lse = spec.lse if isinstance(spec.lse, bool) else call.arg(spec.lse, False) is True
        written = out_bytes + (lse_bytes if with_lse else 0)
    return Cost(flops, read + written, "attention", note)


ATTENTION_OPS: dict[str, AttnArgs] = {
    # (query, key, value, dropout_p, is_causal, *, attn_mask, scale) -> (output, logsumexp)
    "_scaled_dot_product_flash_attention_for_cpu": AttnArgs(0, causal=4, masks=(5,)),
    # (grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, *, attn_mask, scale)
    "_scaled_dot_product_flash_attention_for_cpu_backward": AttnArgs(
        1, causal=7, masks=(8,), backward=True, grad=0, out=4, logsumexp=5),
    # (query, key, value, dropout_p, is_causal, return_debug_mask, *, scale); CUDA: calls _flash_attention_forward
    "_scaled_dot_product_flash_attention": AttnArgs(0, causal=4),
    # (grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, ...)
    "_scaled_dot_product_flash_attention_backward": AttnArgs(
        1, causal=11, backward=True, grad=0, out=4, logsumexp=5),
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
    "_flash_attention_forward": AttnArgs(0, layout="bthd", causal=8, varlen=(3, 5, 6)),
    # (grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
    #  is_causal, rng_state, unused, *, scale, window_size_left, window_size_right)
    "_flash_attention_backward": AttnArgs(
        1, layout="bthd", causal=11, backward=True, grad=0, out=4, logsumexp=5, varlen=(6, 8, 9)),
    # [B, T, H, D]: (query, key, value, bias, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
    #  dropout_p, custom_mask_type, compute_log_sumexp, *, scale, seqlen_k, window_size)
    "_efficient_attention_forward": AttnArgs(
        0, layout="bthd", mask_type=9, masks=(3,), lse=10, varlen=(4, 6, 7)),
    # (grad_out_, query, key, value, bias, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
    #  logsumexp, dropout_p, philox_seed, philox_offset, custom_mask_type, bias_requires_grad, ...)
    "_efficient_attention_backward": AttnArgs(
        1, layout="bthd", mask_type=14, masks=(4,), backward=True, grad=0, out=5, logsumexp=10,
        varlen=(6, 8, 9)),
}

for _name, _spec in ATTENTION_OPS.items():
    register(f"aten::{_name}")(lambda call, spec=_spec: attention_cost(call, spec))

# Always delegate: scaled_dot_product_attention picks one of the fused ops above (or the math path,
# itself a composite of bmm/softmax/... children).
for _name in ("scaled_dot_product_attention", "_scaled_dot_product_attention_math",
              "_scaled_dot_product_attention_math_for_mps"):
    register(f"aten::{_name}")(composite)


def sdpa_flops(b: int, h: int, tq: int, tk: int, d: int, dv: int | None = None, backward: bool = False) -> int:
    """The formula, for tests and documentation."""
    dv = d if dv is None else dv
    return (2 * b * h * tq * tk * (3 * d + 2 * dv)) if backward else (2 * b * h * tq * tk * (d + dv))

