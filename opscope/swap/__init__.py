"""`opscope swap`: put a kernel in place of part of the user's model, prove the model is still right,
then measure what it changes.

    catalog    torch-free: the bundled kernels' manifests, `--kernel` parsing, swap candidates of a run
    apply      the ways to swap (module, functional, method, aten, pattern, compile, user kernels), each a
               reversible context manager, and the model snapshot that proves the revert
    patterns   the torch.fx matchers of the fused kernels' patterns
    verify     original vs swapped on the same inputs (outputs, gradients, guards) and the five traps
    benchmark  op level (captured calls) and end to end (one model step), interleaved A/B
    result     swap.json: what it holds, written and read back
    worker     the supervised child: profile, then each swap, then the run directory with swap.json
"""
