"""The cost-model registry: op name -> small function computing FLOPs and bytes for one call.

Everything here works from what torch.profiler records per op call ("Input Dims", "Input type",
"Input Strides", "Concrete Inputs"); it never imports torch, because `opscope analyze` uses it on
traces recorded elsewhere.

Those traces may come from another torch version or writer, with another argument layout for an op.
The cost functions read their inputs through OpCall's checked accessors (required_tensor, int_arg,
ints_arg, ...) and the checking helpers here, which raise UnreadableCall for an input that does not
have the recorded form the function reads; estimate() gives such a call no cost. Any other exception
from a cost function is a bug in it and propagates.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeAlias, TypeGuard

# Families whose FLOPs may run on tensor cores (matmul-like work). Everything else uses the vector peak.
TENSOR_CORE_FAMILIES = frozenset({"matmul", "conv", "attention"})

# One input's entry in a trace's JSON columns, as recorded (untyped JSON from traces recorded elsewhere).
JsonValue: TypeAlias = "None | bool | int | float | str | list[JsonValue] | dict[str, JsonValue]"


class UnreadableCall(ValueError):
    """The call's recorded inputs do not have the layout its cost function reads: a missing or
    non-tensor input, a shape of another rank, a concrete argument of another type or out of range (a
    trace from another torch version or writer). estimate() gives such a call no cost."""


def is_int_list(value: object) -> TypeGuard[list[int]]:
    """A JSON list of ints (a shape or strides as recorded; bools count, as Python's ints)."""
    return isinstance(value, list) and all(isinstance(v, int) for v in value)


@dataclass(frozen=True)
class OpCall:
    """One op call as the trace records it. `dims`, `strides` hold one entry per input (a list of ints
    for a tensor, [] for a scalar/None, a list of lists for a TensorList); `dtypes`, `concrete` hold
    the profiler's strings ("float", "c10::BFloat16", "Scalar", ... and "1", "[1, 1]", "False", "")."""

    name: str
    dims: tuple[JsonValue, ...] = ()
    dtypes: tuple[JsonValue, ...] = ()
    strides: tuple[JsonValue, ...] = ()
    concrete: tuple[JsonValue, ...] = ()
    # torch.profiler records a TensorList's type as just "TensorList" (no element dtype); `dtypes` may
    # carry the element dtypes instead (a list per TensorList, e.g. from `profile`'s dispatch pass).
    # Where it does not, the cost functions assume this hint (e.g. the run's most common dtype), else the
    # call's first plain tensor dtype, else float32 -- and say so in Cost.note (list_dtype_note()).
    list_dtype: str = ""

    @classmethod
    def from_json_text(cls, name: str, dims: str, dtypes: str, strides: str, concrete: str,
                       list_dtype: str = "") -> OpCall:
        """Builds a call from the four JSON-text columns of ops.csv / the trace (UnreadableCall when one
        is not a JSON list)."""
        return cls(name, _parse(dims), _parse(dtypes), _parse(strides), _parse(concrete), list_dtype)

    @property
    def nargs(self) -> int:
        return len(self.dims)

    def arg(self, i: int, default: object = None) -> object:
        """Concrete input i parsed to a Python value ("1" -> 1, "[1, 1]" -> [1, 1], "False" -> False,
        "" or absent -> default)."""
        if not 0 <= i < len(self.concrete):
            return default
        return parse_scalar(self.concrete[i], default)

    def int_arg(self, i: int, default: int | None = None) -> int:
        """Concrete input i as int() reads it (a float truncates); UnreadableCall when it is absent and
        there is no default, or not a finite number."""
        value = self.arg(i, default)
        if isinstance(value, int) or (isinstance(value, float) and math.isfinite(value)):
            return int(value)
        raise UnreadableCall(f"{self.name}: argument {i} is {value!r}, not an integer")

    def ints_arg(self, i: int, default: list[int] | None = None) -> list[int]:
        """Concrete input i as a list of ints (a size, a shape); UnreadableCall when it is anything else
        (or absent without a default)."""
        return int_list(self.arg(i, default), f"{self.name}: argument {i}")

    def flags_arg(self, i: int, default: list[bool]) -> list[bool]:
        """Concrete input i as a list of flags (an output_mask); UnreadableCall when it is not a list."""
        value = self.arg(i, default)
        if not isinstance(value, (list, tuple)):
            raise UnreadableCall(f"{self.name}: argument {i} is {value!r}, not a list of flags")
        return [bool(v) for v in value]

    def tensor(self, i: int) -> TensorArg | None:
        """Input i as a tensor (None if it is not a tensor or absent). Strides that are not a list of ints
        count as unrecorded; a shape that is not one is UnreadableCall."""
        if not 0 <= i < len(self.dims):
            return None
        shape = self.dims[i]
        dtype = self.dtypes[i] if i < len(self.dtypes) else ""
        if not isinstance(shape, list) or not isinstance(dtype, str) or dtype in NON_TENSOR_TYPES:
            return None  # (a list of dtypes: a TensorList's elements)
        if shape and isinstance(shape[0], list):
            return None  # a TensorList; see tensor_list()
        if not shape and dtype not in ITEMSIZE:
            return None
        if not is_int_list(shape):
            raise UnreadableCall(f"{self.name}: input {i} has the shape {shape!r}")
        stride = self.strides[i] if i < len(self.strides) else []
        return TensorArg(tuple(shape), dtype, tuple(stride) if is_int_list(stride) else ())

    def required_tensor(self, i: int, *, ndim: int | None = None, min_ndim: int = 0) -> TensorArg:
        """Input i, which the cost function cannot do without: UnreadableCall when it is not a tensor, or
        has another number of dims than `ndim` / fewer than `min_ndim`."""
        t = self.tensor(i)
        if t is None:
            raise UnreadableCall(f"{self.name}: input {i} is not a tensor")
        if (ndim is not None and len(t.shape) != ndim) or len(t.shape) < min_ndim:
            expected = f"{ndim}" if ndim is not None else f"at least {min_ndim}"
            raise UnreadableCall(f"{self.name}: input {i} has the shape {list(t.shape)}, not {expected} dims")
        return t

    def tensor_list(self, i: int, unknown_dtype: str | None = None) -> list[TensorArg]:
        """Input i as a list of tensors (TensorList inputs such as cat's). Elements whose dtype the trace
        does not record get `unknown_dtype` if given (e.g. "long int" for index lists), else
        assumed_list_dtype()."""
        if not 0 <= i < len(self.dims):
            return []
        shapes = self.dims[i]
        if not isinstance(shapes, list) or not shapes or not isinstance(shapes[0], list):
            return []
        dtype_entry = self.dtypes[i] if i < len(self.dtypes) else ""
        strides = self.strides[i] if i < len(self.strides) else []
        out = []
        for k, shape in enumerate(shapes):
            if not is_int_list(shape):
                raise UnreadableCall(f"{self.name}: input {i} has the element shape {shape!r}")
            stride = strides[k] if isinstance(strides, list) and k < len(strides) else []
            if isinstance(dtype_entry, list):
                if k >= len(dtype_entry):
                    raise UnreadableCall(f"{self.name}: input {i} records fewer element dtypes than tensors")
                dtype = dtype_entry[k]
            else:
                dtype = dtype_entry
            if not isinstance(dtype, str) or dtype not in ITEMSIZE:
                dtype = unknown_dtype or self.assumed_list_dtype()
            out.append(TensorArg(tuple(shape), dtype, tuple(stride) if is_int_list(stride) else ()))
        return out

    def list_dtype_known(self) -> bool:
        """Whether the element dtypes of every (non-empty) TensorList argument are recorded in `dtypes`
        rather than assumed."""
        for i, shapes in enumerate(self.dims):
            if isinstance(shapes, list) and shapes and isinstance(shapes[0], list):
                entry = self.dtypes[i] if i < len(self.dtypes) else ""
                if not (isinstance(entry, list) and len(entry) == len(shapes)
                        and all(isinstance(d, str) and d in ITEMSIZE for d in entry)):
                    return False
        return True

    def list_dtype_note(self) -> str:
        """Empty when list_dtype_known(), else the note saying which dtype was assumed for TensorList
        elements, and why."""
        if self.list_dtype_known():
            return ""
        dtype, why = self._list_dtype_source()
        return f"TensorList dtype not recorded: assumed {DTYPE_NAMES.get(dtype) or OTHER_DTYPE_NAMES.get(dtype, dtype)} ({why})"

    def assumed_list_dtype(self) -> str:
        """The dtype used for TensorList elements whose dtype is not recorded: the caller's hint, else the
        first non-scalar plain tensor's, else a 0-dim tensor's (not a wrapped Python number's), else
        float32."""
        return self._list_dtype_source()[0]

    def _list_dtype_source(self) -> tuple[str, str]:
        if self.list_dtype in ITEMSIZE:
            return self.list_dtype, "the run's most common dtype"
        plain = [t for t in self.tensors() if t.dtype in ITEMSIZE]
        for t in plain:
            if t.shape:
                return t.dtype, "the op's tensor argument's"
        for t in plain:
            if t.dtype not in WRAPPED_NUMBER_DTYPES:
                return t.dtype, "the op's tensor argument's"
        return "float", "default"

    def tensors(self) -> list[TensorArg]:
        """All plain tensor inputs, in order."""
        return [t for t in (self.tensor(i) for i in range(len(self.dims))) if t is not None]


@dataclass(frozen=True)
class TensorArg:
    """A tensor input: its shape, profiler dtype string and strides (() when not recorded)."""

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


# Ops that do their work themselves on some backends but run it as child ops of *other* families on
# others (CPU _fused_rms_norm runs as pow/mean/rsqrt/mul). When such an op has a costed descendant, the
# analysis layer treats it as a composite, so the work is counted once.
DELEGATES_TO_ANY_CHILD = frozenset({"aten::_fused_rms_norm", "aten::_fused_rms_norm_backward"})

# A cost function: the call's cost, or None when the op does no countable work in this form (e.g.
# aten::index with unrecorded indices). It raises UnreadableCall for inputs it cannot read.
CostFn: TypeAlias = Callable[[OpCall], "Cost | None"]
REGISTRY: dict[str, CostFn] = {}

# Ops whose output some backends pre-fill with the bias through a child aten::copy_ (CPU addmm, baddbmm,
# _addmm_activation: copy_(out, bias.expand(...)), then out += A @ B). That child counts the bias read and
# the output write; given such a child, the analysis layer counts the op with the function registered
# here (what is left to it), so the pair adds up to one op's minimum traffic.
BIAS_COPIED_BY_CHILD: dict[str, CostFn] = {}


def register(*names: str) -> Callable[[CostFn], CostFn]:
    """Registers a cost function for one or more op names ("aten::mm", ...)."""

    def deco(fn: CostFn) -> CostFn:
        for name in names:
            if name in REGISTRY:
                raise ValueError(f"cost function for {name} registered twice")
            REGISTRY[name] = fn
        return fn

    return deco


def register_bias_copied_by_child(*names: str) -> Callable[[CostFn], CostFn]:
    """Registers the cost of an op whose bias a child aten::copy_ already wrote into its output."""

    def deco(fn: CostFn) -> CostFn:
        for name in names:
            BIAS_COPIED_BY_CHILD[name] = fn
        return fn

    return deco


def estimate(call: OpCall, *, bias_copied_by_child: bool = False) -> Cost | None:
    """FLOPs/bytes of one call, or None when the op is unknown or its inputs can't be interpreted
    (UnreadableCall: any other exception is a bug in the cost function, and propagates).
    `bias_copied_by_child`: the call has a child aten::copy_ that wrote its bias into the output (see
    BIAS_COPIED_BY_CHILD; ignored for other ops)."""
    fn = (BIAS_COPIED_BY_CHILD.get(call.name) if bias_copied_by_child else None) or REGISTRY.get(call.name)
    if fn is None:
        return None
    try:
        return fn(call)
    except UnreadableCall:
        return None


def composite(call: OpCall | None = None) -> Cost:
    """An op that always delegates its work to child aten ops: it carries nothing itself."""
    return Cost(0, 0, "composite")


def view(call: OpCall | None = None) -> Cost:
    """A metadata-only op (no data read or written)."""
    return Cost(0, 0, "view")


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
    "short unsigned int": 2,
    "unsigned int": 4,
    "long unsigned int": 8,
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

# ... and the other types' torch names (for messages).
OTHER_DTYPE_NAMES: dict[str, str] = {
    "long int": "int64", "int": "int32", "short int": "int16", "signed char": "int8", "unsigned char": "uint8",
    "bool": "bool", "short unsigned int": "uint16", "unsigned int": "uint32", "long unsigned int": "uint64",
    "c10::complex<float>": "complex64", "c10::complex<double>": "complex128", "c10::complex<c10::Half>": "complex32",
}


# ScalarType codes as the profiler records them in "Concrete Inputs" (dtype= arguments) -> "Input type" names.
SCALAR_TYPES: dict[int, str] = {
    0: "unsigned char",
    1: "signed char",
    2: "short int",
    3: "int",
    4: "long int",
    5: "c10::Half",
    6: "float",
    7: "double",
    8: "c10::complex<c10::Half>",
    9: "c10::complex<float>",
    10: "c10::complex<double>",
    11: "bool",
    15: "c10::BFloat16",
    23: "c10::Float8_e5m2",
    24: "c10::Float8_e4m3fn",
    25: "c10::Float8_e5m2fnuz",
    26: "c10::Float8_e4m3fnuz",
    27: "short unsigned int",
    28: "unsigned int",
    29: "long unsigned int",
}

# A Python number passed where a Tensor is expected is recorded as a 0-dim tensor of these dtypes.
WRAPPED_NUMBER_DTYPES = frozenset({"double", "long int", "bool"})
FLOAT_DTYPES = frozenset(
    {"c10::Float8_e4m3fn", "c10::Float8_e5m2", "c10::Float8_e4m3fnuz", "c10::Float8_e5m2fnuz",
     "c10::Half", "c10::BFloat16", "float", "double"}
)
COMPLEX_DTYPES = frozenset({"c10::complex<c10::Half>", "c10::complex<float>", "c10::complex<double>"})
_FLOAT_RANK = {
    "c10::Float8_e4m3fn": 0, "c10::Float8_e5m2": 0, "c10::Float8_e4m3fnuz": 0, "c10::Float8_e5m2fnuz": 0,
    "c10::Half": 1, "c10::BFloat16": 1, "float": 2, "double": 3,
}
_INT_RANK = {
    "unsigned char": 0, "signed char": 0, "short int": 1, "short unsigned int": 1, "int": 2,
    "unsigned int": 2, "long int": 3, "long unsigned int": 3,
}


def dtype_category(dtype: str) -> int:
    """0 bool, 1 integer, 2 floating point, 3 complex (type-promotion categories)."""
    if dtype == "bool":
        return 0
    if dtype in COMPLEX_DTYPES:
        return 3
    if dtype in FLOAT_DTYPES:
        return 2
    return 1


def scalar_type(code: object) -> str | None:
    """A dtype= argument's profiler string ("15" -> "c10::BFloat16"), or None when absent/unknown."""
    if isinstance(code, bool) or not isinstance(code, int):
        return None
    return SCALAR_TYPES.get(code)


def promote_types(a: str, b: str) -> str:
    """torch.promote_types over profiler dtype strings (float16 + bfloat16 -> float32, ...)."""
    if a == b:
        return a
    ca, cb = dtype_category(a), dtype_category(b)
    if ca != cb:
        return a if ca > cb else b
    if ca == 2:
        ra, rb = _FLOAT_RANK.get(a, 2), _FLOAT_RANK.get(b, 2)
        if ra == rb:
            return "float" if ra == 1 else a  # half + bfloat16 -> float32
        return a if ra > rb else b
    if ca == 1:
        return a if _INT_RANK.get(a, 3) >= _INT_RANK.get(b, 3) else b
    return a if ITEMSIZE.get(a, 8) >= ITEMSIZE.get(b, 8) else b


def result_dtype(tensors: Iterable[TensorArg]) -> str:
    """The dtype of an element-wise result (torch's type promotion): tensors with dims outrank 0-dim
    ones within a category; a 0-dim operand of a higher category wins, a 0-dim "double" (how a Python
    float is recorded) giving the default float32."""
    typed = [t for t in tensors if t.dtype in ITEMSIZE]
    if not typed:
        return "float"
    dimmed = [t.dtype for t in typed if t.shape]
    zero = [t.dtype for t in typed if not t.shape]
    if not dimmed:
        out = zero[0]
        for d in zero[1:]:
            out = promote_types(out, d)
        return out
    out = dimmed[0]
    for d in dimmed[1:]:
        out = promote_types(out, d)
    for d in zero:
        if dtype_category(d) > dtype_category(out):
            out = "float" if d == "double" else d
    return out


def float_result(dtype: str) -> str:
    """The dtype of a floating-point-valued op (exp, sqrt, true division) on `dtype` (ints -> float32)."""
    return dtype if dtype_category(dtype) >= 2 else "float"


def reduce_dims(dim: object, ndim: int) -> list[int]:
    """A reduction's dim argument (int, list, None, [] = all) -> sorted non-negative dims."""
    if dim is None or dim == [] or dim == "":
        return list(range(ndim))
    dims = [dim] if isinstance(dim, int) and not isinstance(dim, bool) else int_list(dim, "dim")
    if ndim == 0:
        return []
    return sorted({d % ndim for d in dims})


def reduced_shape(shape: Sequence[int], dim: object, keepdim: bool) -> tuple[int, ...]:
    dims = set(reduce_dims(dim, len(shape)))
    if keepdim:
        return tuple(1 if i in dims else s for i, s in enumerate(shape))
    return tuple(s for i, s in enumerate(shape) if i not in dims)


# GEMMs on int8 operands (float scales aside): their dtype is "int8", which selects the INT8 tensor ceiling.
INT8_GEMMS = frozenset({"aten::_int_mm", "aten::_scaled_mm"})


def floating_dtype(call: OpCall) -> str | None:
    """The op's dtype (CONTRACT: that of its first floating-point input), as an opscope dtype name; an int8
    GEMM's (INT8_GEMMS with an int8 first operand) is "int8"."""
    if call.name in INT8_GEMMS and call.dtypes and call.dtypes[0] == "signed char":
        return "int8"
    for entry in call.dtypes:
        dtype = (entry[0] if entry else "") if isinstance(entry, list) else entry
        if isinstance(dtype, str) and dtype in DTYPE_NAMES:
            return DTYPE_NAMES[dtype]
    return None if call.list_dtype_known() else DTYPE_NAMES.get(call.list_dtype)


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
    """NumPy/torch broadcasting of shapes (UnreadableCall when they do not broadcast)."""
    tuples = [tuple(s) for s in shapes]
    ndim = max((len(s) for s in tuples), default=0)
    out = []
    for i in range(ndim):
        size = 1
        for s in tuples:
            d = s[i - ndim + len(s)] if i - ndim + len(s) >= 0 else 1
            if d != 1:
                if size not in (1, d):
                    raise UnreadableCall(f"shapes {tuples} do not broadcast")
                size = d
        out.append(size)
    return tuple(out)


def _is_int_sequence(value: object) -> TypeGuard[list[int] | tuple[int, ...]]:
    return isinstance(value, (list, tuple)) and all(isinstance(v, int) for v in value)


def int_list(value: object, what: str) -> list[int]:
    """`value` (a concrete argument) as a list of ints: a list or tuple of ints, else UnreadableCall."""
    if _is_int_sequence(value):
        return list(value)
    raise UnreadableCall(f"{what} is {value!r}, not a list of integers")


def ints_per_dim(value: object, ndim: int, default: int | None, what: str) -> list[int]:
    """A per-spatial-dim argument (kernel_size, stride, padding, ...): an int or a one-element list
    applies to every dim; absent (None, "", []) is `default` for every dim, or UnreadableCall without
    one; a list shorter than `ndim` is UnreadableCall too."""
    if value is None or value == "" or value == []:
        if default is None:
            raise UnreadableCall(f"{what} missing")
        return [default] * ndim
    if isinstance(value, int):
        return [value] * ndim
    values = int_list(value, what)
    values = values * ndim if len(values) == 1 and ndim > 1 else values
    if len(values) < ndim:
        raise UnreadableCall(f"{what} {values} has fewer than {ndim} entries")
    return values


def parse_scalar(text: object, default: object = None) -> object:
    """Concrete Inputs entries are Python-literal-ish strings: "1", "0.5", "[1, 1]", "False", "".
    Returns `default` for "" and the raw text when it is not a literal (non-strings as they are).
    The text is a trace's, so untrusted: it is read by a bounded parser of the few forms torch writes
    (_literal), never by ast.literal_eval, which a 100 KB "---...1" drives into a MemoryError."""
    if text is None or text == "":
        return default
    if not isinstance(text, str):
        return text
    try:
        return _literal(text)
    except _NotALiteral:
        return text


# What a concrete input may be: numbers, True/False/None (any case), inf/-inf/nan, a quoted string
# without escapes, and lists of these. More than this is not an argument torch recorded.
MAX_LITERAL_CHARS = 4096
_MAX_LITERAL_DEPTH = 8
_ATOM = re.compile(r"[\w.+-]{1,48}")
_INT = re.compile(r"[+-]?\d+")
_FLOAT = re.compile(r"[+-]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?")
_WORDS: dict[str, object] = {"true": True, "false": False, "none": None, "inf": math.inf, "-inf": -math.inf,
                             "+inf": math.inf, "nan": math.nan}


class _NotALiteral(ValueError):
    pass


def _literal(text: str) -> object:
    """`text` as the literal it spells (see the grammar above); _NotALiteral otherwise. Linear in the
    text's length, which is bounded."""
    if len(text) > MAX_LITERAL_CHARS:
        raise _NotALiteral
    value, end = _literal_at(text, _skip_spaces(text, 0), 0)
    if _skip_spaces(text, end) != len(text):
        raise _NotALiteral
    return value


def _skip_spaces(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t":
        i += 1
    return i


def _literal_at(text: str, i: int, depth: int) -> tuple[object, int]:
    """The literal starting at text[i] and the index after it."""
    if i >= len(text):
        raise _NotALiteral
    c = text[i]
    if c == "[":
        if depth >= _MAX_LITERAL_DEPTH:
            raise _NotALiteral
        items: list[object] = []
        i = _skip_spaces(text, i + 1)
        while i < len(text) and text[i] != "]":
            item, i = _literal_at(text, i, depth + 1)
            items.append(item)
            i = _skip_spaces(text, i)
            if i < len(text) and text[i] == ",":
                i = _skip_spaces(text, i + 1)
            elif i < len(text) and text[i] != "]":
                raise _NotALiteral
        if i >= len(text):
            raise _NotALiteral
        return items, i + 1
    if c in "\"'":
        end = text.find(c, i + 1)
        if end < 0 or "\\" in text[i + 1:end]:
            raise _NotALiteral
        return text[i + 1:end], end + 1
    m = _ATOM.match(text, i)
    if m is None or (m.end() < len(text) and _ATOM.match(text, m.end())):
        raise _NotALiteral  # no atom, or one longer than any number torch writes
    atom = m.group()
    word = atom.lower()
    if word in _WORDS:
        return _WORDS[word], m.end()
    if _INT.fullmatch(atom):
        return int(atom), m.end()
    if _FLOAT.fullmatch(atom):
        return float(atom), m.end()
    raise _NotALiteral


def _parse(text: object) -> tuple[JsonValue, ...]:
    """One JSON-text column (or an already parsed list) -> one entry per input."""
    if isinstance(text, (list, tuple)):
        return tuple(text)
    if text is None or text == "":
        return ()
    if not isinstance(text, str):
        raise UnreadableCall(f"{text!r} is not JSON text")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UnreadableCall(f"{text[:60]!r} is not JSON") from exc
    if not isinstance(value, list):
        raise UnreadableCall(f"{text[:60]!r} is not a JSON list")
    return tuple(value)
