"""opscope's cost model: FLOPs and minimum bytes of one aten op call, from what torch.profiler records
(Input Dims / Input type / Input Strides / Concrete Inputs). Torch-free; one small cost function per op,
registered with `@register("aten::...")` in a module per op family. Outputs are not recorded, so
output shapes are derived from input shapes, op semantics and concrete arguments.

The counting conventions and the per-op FLOP tables are in docs/reference/counting.md; each
family module documents the evidence for its composites and argument layouts.
"""

from opscope.costmodel import (  # noqa: F401  (importing registers each family's ops)
    attention,
    conv,
    custom,
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
    UnreadableCall,
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
    "UnreadableCall",
    "estimate",
    "floating_dtype",
    "register",
]
