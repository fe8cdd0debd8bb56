"""The cost-model registry: op name -> small function computing FLOPs and bytes for one call.

Everything here works from what torch.profiler records per op call ("Input Dims", "Input type",
"Input Strides", "Concrete Inputs"); it never imports torch, because `opscope analyze` uses it on
traces recorded elsewhere.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

# Families whose FLOPs may run on tensor cores (matmul-like work). Everything else uses the vector peak.
TENSOR_CORE_FAMILIES = frozenset({"matmul", "conv", "attention"})


@dataclass(frozen=True)
class OpCall:
    """One op call as the trace records it. `dims`, `strides` hold one entry per input (a list of ints
    for a tensor, [] for a scalar/None, a list of lists for a TensorList); `dtypes`, `concrete` hold
    the profiler's strings ("float", "c10::BFloat16", "Scalar", ... and "1", "[1, 1]", "False", "")."""

    name: str
    dims: tuple = ()
    dtypes: tuple = ()
    strides: tuple = ()
    concrete: tuple = ()

    @classmethod
    def from_json_text(cls, name: str, dims: str, dtypes: str, strides: str, concrete: str) -> OpCall:
        """Builds a call from the four JSON-text columns of ops.csv / the trace."""
        return cls(name, _parse(dims), _parse(dtypes), _parse(strides), _parse(concrete))

    def arg(self, i: int, default: Any = None) -> Any:
        """Concrete input i parsed to a Python value ("1" -> 1, "[1, 1]" -> [1, 1], "False" -> False,
        "" -> default)."""
        if i >= len(self.concrete):
            return default
        return parse_scalar(self.concrete[i], default)

    def tensor(self, i: int) -> TensorArg | None:
        """Input i as a tensor (None if it is not a tensor or absent)."""
        if i >= len(self.dims):
            return None
        shape = self.dims[i]
        dtype = self.dtypes[i] if i < len(self.dtypes) else ""
        if not isinstance(shape, list) or dtype in NON_TENSOR_TYPES:
            return None
        if shape and isinstance(shape[0], list):
            return None  # a TensorList; see tensor_list()
        if not shape and dtype not in ITEMSIZE:
            return None
        stride = self.strides[i] if i < len(self.strides) else []
        return TensorArg(tuple(shape), dtype, tuple(stride) if isinstance(stride, list) else ())

    def tensor_list(self, i: int) -> list[TensorArg]:
        """Input i as a list of tensors (TensorList inputs such as cat's)."""
        if i >= len(self.dims) or not isinstance(self.dims[i], list):
            return []
        shapes = self.dims[i]
        if not shapes or not isinstance(shapes[0], list):
            return []
        dtype_entry = self.dtypes[i] if i < len(self.dtypes) else ""
        strides = self.strides[i] if i < len(self.strides) else []
        out = []
        for k, shape in enumerate(shapes):
            stride = strides[k] if isinstance(strides, list) and k < len(strides) and isinstance(strides[k], list) else []
            dtype = dtype_entry[k] if isinstance(dtype_entry, list) and k < len(dtype_entry) else dtype_entry
            out.append(TensorArg(tuple(shape), dtype, tuple(stride)))
        return out

    def tensors(self) -> list[TensorArg]:
        """All plain tensor inputs, in order."""
        return [t for t in (self.tensor(i) for i in range(len(self.dims))) if t is not None]


@dataclass(frozen=True)
class TensorArg:
    shape: tuple[int, ...]
    dtype: str
    stride: tuple[int, ...] = ()

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return ITEMSIZE.get(self.dtype, 4)

    @property
    def nbytes(self) -> int:
        """Bytes of the logical tensor (every element once)."""
        return self.numel * self.itemsize

    @property
    def storage_bytes(self) -> int:
        """Bytes of the distinct storage this view touches: stride-0 (broadcast/expanded) dims add
        nothing; without strides, the logical size."""
        return storage_elements(self.shape, self.stride) * self.itemsize

    @property
    def is_contiguous(self) -> bool:
        return is_contiguous(self.shape, self.stride)


@dataclass(frozen=True)
class Cost:
    """FLOPs and bytes of one call. `family` drives ceiling selection and composite detection:
    "matmul", "conv", "attention" (tensor-core capable), "elementwise", "reduction", "norm",
    "softmax", "pool", "gather", "scatter", "copy", "factory", "loss", "view" (metadata only, 0/0),
    "composite" (its children do the work, 0/0)."""

    flops: float
    bytes: float
    family: str
    note: str = ""

    @property
    def uses_tensor_cores(self) -> bool:
        return self.family in TENSOR_CORE_FAMILIES


CostFn = Callable[[OpCall], "Cost | None"]
REGISTRY: dict[str, CostFn] = {}


def register(*names: str) -> Callable[[CostFn], CostFn]:
    """Registers a cost function for one or more op names ("aten::mm", ...)."""

    def deco(fn: CostFn) -> CostFn:
        for name in names:
            if name in REGISTRY:
                raise ValueError(f"cost function for {name} registered twice")
            REGISTRY[name] = fn
        return fn

    return deco


def estimate(call: OpCall) -> Cost | None:
    """FLOPs/bytes of one call, or None when the op is unknown or its inputs can't be interpreted."""
    fn = REGISTRY.get(call.name)
    if fn is None:
        return None
    try:
        return fn(call)
    except (IndexError, KeyError, TypeError, ValueError, ZeroDivisionError):
        return None


# --- dtype and layout helpers -------------------------------------------------------------------

# torch.profiler's "Input type" strings -> bytes per element.
ITEMSIZE: dict[str, int] = {
    "float": 4,
    "double": 8,
    "c10::Half": 2,
    "c10::BFloat16": 2,
    "c10::Float8_e4m3fn": 1,
    "c10::Float8_e5m2": 1,
    "c10::Float8_e4m3fnuz": 1,
    "c10::Float8_e5m2fnuz": 1,
    "long int": 8,
    "int": 4,
    "short int": 2,
    "signed char": 1,
    "unsigned char": 1,
    "bool": 1,
    "c10::complex<float>": 8,
    "c10::complex<double>": 16,
    "c10::complex<c10::Half>": 4,
}
NON_TENSOR_TYPES = frozenset({"Scalar", "ScalarList", "TensorList", "GenericList", "Device", "Layout", "None", "String"})

# torch.profiler's "Input type" strings -> opscope dtype names (CONTRACT: float32, bfloat16, ...).
DTYPE_NAMES: dict[str, str] = {
    "float": "float32",
    "double": "float64",
    "c10::Half": "float16",
    "c10::BFloat16": "bfloat16",
    "c10::Float8_e4m3fn": "float8",
    "c10::Float8_e5m2": "float8",
    "c10::Float8_e4m3fnuz": "float8",
    "c10::Float8_e5m2fnuz": "float8",
}


def floating_dtype(call: OpCall) -> str | None:
    """The op's dtype (CONTRACT: that of its first floating-point input), as an opscope dtype name."""
    for entry in call.dtypes:
        if isinstance(entry, list):
            entry = entry[0] if entry else ""
        if entry in DTYPE_NAMES:
            return DTYPE_NAMES[entry]
    return None


def storage_elements(shape: Sequence[int], stride: Sequence[int]) -> int:
    """Distinct elements a strided view touches: span of the non-broadcast dims. For a dense or
    transposed tensor this is numel; stride-0 dims count once."""
    if not shape:
        return 1
    if any(s == 0 for s in shape):
        return 0
    if not stride or len(stride) != len(shape):
        return math.prod(shape)
    distinct = 1
    for size, st in zip(shape, stride, strict=True):
        if st != 0:
            distinct *= size
    return distinct


def is_contiguous(shape: Sequence[int], stride: Sequence[int]) -> bool:
    if not stride or len(stride) != len(shape):
        return True
    expected = 1
    for size, st in zip(reversed(shape), reversed(stride), strict=True):
        if size != 1 and st != expected:
            return False
        expected *= size
    return True


def broadcast_shapes(*shapes: Iterable[int]) -> tuple[int, ...]:
    """NumPy/torch broadcasting of shapes."""
    shapes = [tuple(s) for s in shapes]
    ndim = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(ndim):
        size = 1
        for s in shapes:
            d = s[i - ndim + len(s)] if i - ndim + len(s) >= 0 else 1
            if d != 1:
                if size not in (1, d):
                    raise ValueError(f"shapes {shapes} do not broadcast")
                size = d
        out.append(size)
    return tuple(out)


def parse_scalar(text: str, default: Any = None) -> Any:
    """Concrete Inputs entries are Python-literal-ish strings: "1", "0.5", "[1, 1]", "False", "".
    Returns `default` for "" and the raw text when it is not a literal."""
    if text is None or text == "":
        return default
    if not isinstance(text, str):
        return text
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        low = text.strip().lower()
        if low in ("true", "false"):
            return low == "true"
        if low in ("inf", "-inf", "nan"):
            return float(low)
        return text


def _parse(text: Any) -> tuple:
    if isinstance(text, (list, tuple)):
        return tuple(text)
    if text is None or text == "":
        return ()
    import json

    return tuple(json.loads(text))
