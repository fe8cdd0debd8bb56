"""Findings: one small rule per module, registered in one place (this import list)."""

from opscope.findings.base import RULES, Context, Finding, rule, run_rules

__all__ = ["RULES", "Context", "Finding", "rule", "run_rules"]

from opscope.findings import (  # noqa: E402, F401  (importing a rule module registers its rule)
    channels_last,
    compile_copy,
    compile_fallback,
    contiguous_call,
    cudagraph_skipped,
    dtype_conversion,
    dtype_slow_path,
    excess_traffic,
    fp32_gemm,
    fusion,
    gemm_alignment,
    graph_break,
    host_sync,
    implicit_copy,
    kernel_copy,
    launch_bound,
    low_bandwidth,
    memory_growth,
    optimizer_loop,
    overhead,
    recompile,
    straggler,
    strided_reduction,
)
