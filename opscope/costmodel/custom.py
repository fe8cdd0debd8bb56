"""Custom ops of inference engines whose work the recorded arguments determine.

vLLM's paged attention for decode (`_C::paged_attention_v1`, `_C::paged_attention_v2`; schemas in vLLM's
csrc/torch_bindings.cpp): one query token per sequence attends to that sequence's cached keys and
values. query [num_seqs, num_heads, head_size]; key_cache [num_blocks, num_kv_heads, head_size/x,
block_size, x]; value_cache [num_blocks, num_kv_heads, head_size, block_size]; block_tables
[num_seqs, max_blocks]; seq_lens [num_seqs] (the per-sequence KV lengths: a tensor, whose values the
trace does not record); max_seq_len, an int the trace records.

FLOPs: 4 * num_seqs * num_heads * kv_len * head_size (Q @ K^T and P @ V, the SDPA count with Tq = 1),
bytes: query read, output written, keys and values read once per sequence (2 * num_seqs * kv_len *
num_kv_heads * head_size in the cache's dtype), block tables and lengths read. kv_len is max_seq_len
for every sequence: an upper bound (Cost.note says so). v2's per-partition scratch (exp_sums,
max_logits, tmp_out) is not minimum traffic and is not counted.

Other custom ops (`vllm::unified_attention_with_output`, `vllm::moe_forward`, `_C_cache_ops::*`, ...)
have no cost function: their rows get the family of their kernels (ops_table) and bound unknown.
"""

from __future__ import annotations

from opscope.costmodel.base import Cost, OpCall, register

KV_LEN_NOTE = ("paged-attention decode: every sequence counted at max_seq_len (the trace records "
               "per-sequence KV lengths only as a tensor): an upper bound")


def paged_attention_cost(call: OpCall, q_index: int, max_len_index: int) -> Cost | None:
    q, k_cache, v_cache = call.tensor(q_index), call.tensor(q_index + 1), call.tensor(q_index + 2)
    tables, lens = call.tensor(q_index + 5), call.tensor(q_index + 6)
    kv_len = call.arg(max_len_index)
    if (q is None or k_cache is None or v_cache is None or len(q.shape) != 3 or len(v_cache.shape) != 4
            or not isinstance(kv_len, int) or isinstance(kv_len, bool) or kv_len <= 0):
        return None
    seqs, heads, head_size = q.shape
    kv_heads = v_cache.shape[1]
    flops = 4 * seqs * heads * kv_len * head_size
    kv_bytes = 2 * seqs * kv_len * kv_heads * head_size * k_cache.itemsize
    index_bytes = sum(t.storage_bytes for t in (tables, lens) if t is not None)
    return Cost(flops, 2 * q.nbytes + kv_bytes + index_bytes, "attention", KV_LEN_NOTE)


@register("_C::paged_attention_v1")
def paged_attention_v1(call: OpCall) -> Cost | None:
    """(out, query, key_cache, value_cache, num_kv_heads, scale, block_tables, seq_lens, block_size,
    max_seq_len, ...)."""
    return paged_attention_cost(call, 1, 9)


@register("_C::paged_attention_v2")
def paged_attention_v2(call: OpCall) -> Cost | None:
    """(out, exp_sums, max_logits, tmp_out, query, key_cache, value_cache, num_kv_heads, scale,
    block_tables, seq_lens, block_size, max_seq_len, ...)."""
    return paged_attention_cost(call, 4, 12)
