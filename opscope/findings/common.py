"""Helpers shared by the findings rules: which events count, the op call tree, tensor layouts from the
recorded dims/strides, severity and formatting. No rule lives here.

Everything derived from the event table is computed once per run and kept in `Context.cache`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from opscope.costmodel.base import DTYPE_NAMES, TensorArg
from opscope.findings.base import Context
from opscope.sources import HARNESS
from opscope.table import Table
from opscope.table import records as table_records
from opscope.units import UNKNOWN

if TYPE_CHECKING:
    import pandas as pd

T = TypeVar("T")

# Severity from the estimated saving's share of the run's total op time (ops.csv time_us_total summed):
# >= 10 % high, >= 2 % medium, else low. A finding without an estimate is low unless a rule says more.
HIGH_SHARE = 0.10
MEDIUM_SHARE = 0.02

# Views and wrappers that never move data (skipped when looking for "the next op").
VIEW_FAMILIES = frozenset({"view", "composite"})
NON_TENSOR = frozenset({"Scalar", "ScalarList", "TensorList", "GenericList", "Device", "Layout", "None",
                        "String", ""})


def cached(ctx: Context, key: str, build: Callable[[], T]) -> T:
    if key not in ctx.cache:
        ctx.cache[key] = build()
    return ctx.cache[key]


# --- which events ---------------------------------------------------------------------------------

def user_mask(ctx: Context) -> list[bool]:
    """Events inside a profiled step that the user's code issued: not opscope's harness (loss,
    backward seed, optimizer), not outside the ProfilerStep annotations."""
    def build() -> list[bool]:
        return [step >= 0 and loc != HARNESS
                for step, loc in zip(col(ctx, "step"), col(ctx, "source_location"), strict=True)]
    return cached(ctx, "user_mask", build)


def names(ctx: Context) -> list[str]:
    return ctx.events["name"]


def col(ctx: Context, column: str) -> list[Any]:
    """A column of the event table (a list: the table's own, not a copy)."""
    return ctx.events[column]


def ops_rows(ctx: Context) -> list[dict[str, Any]]:
    """ops.csv rows as dicts, built once: rules read rows one by one."""
    return cached(ctx, "ops_rows", lambda: records(ctx.ops))


def records(table: Table | pd.DataFrame) -> list[dict[str, Any]]:
    """One dict per row of a table (opscope.table.records); a DataFrame (the commands that read runs
    back) is read one `tolist()` per column, native Python values, at a fraction of to_dict's cost."""
    return table_records(table if isinstance(table, dict) else _columns(table))


def _columns(table: Table | pd.DataFrame) -> Table:
    """A table's columns as lists; a DataFrame's converted without copying a table."""
    if isinstance(table, dict):
        return table
    return {str(c): table[c].tolist() for c in table.columns}


def subtree_sum(ctx: Context, column: str) -> list[float]:
    """Per event: `column` summed over the event and everything nested in it (NaN counts as 0)."""
    def build() -> list[float]:
        acc = [0.0 if v != v else float(v) for v in col(ctx, column)]
        parent, depth = col(ctx, "parent"), col(ctx, "depth")
        by_depth: dict[int, list[int]] = {}
        for i, d in enumerate(depth):
            if d > 0:
                by_depth.setdefault(d, []).append(i)
        # Deepest level first, each level in event order: every event's total is final before its parent
        # adds it, and the additions come in the order np.add.at made them (same floats).
        for d in sorted(by_depth, reverse=True):
            for i in by_depth[d]:
                acc[parent[i]] += acc[i]
        return acc
    return cached(ctx, f"subtree:{column}", build)


def children(ctx: Context) -> list[list[int]]:
    """Direct children of each event (any event type), in trace order."""
    def build() -> list[list[int]]:
        parent = col(ctx, "parent")
        kids: list[list[int]] = [[] for _ in range(len(parent))]
        for i, p in enumerate(parent):
            if p >= 0:
                kids[p].append(i)
        return kids
    return cached(ctx, "children", build)


def descendants(ctx: Context, i: int) -> list[int]:
    kids = children(ctx)
    out: list[int] = []
    stack = list(reversed(kids[i]))
    while stack:
        j = stack.pop()
        out.append(j)
        stack.extend(reversed(kids[j]))
    return out


def is_worker(ctx: Context) -> list[bool]:
    """Per event: a row op that does work of its own, i.e. neither a view, a composite wrapper, nor an
    op the cost model does not know that has row ops beneath it (an unknown wrapper)."""
    def build() -> list[bool]:
        fam = col(ctx, "family")
        is_row = col(ctx, "is_row")
        has_row_child = [False] * len(fam)
        for p in col(ctx, "row_parent"):
            if p >= 0:
                has_row_child[p] = True
        out = []
        for f, row, kids in zip(fam, is_row, has_row_child, strict=True):
            f = f if isinstance(f, str) else ""
            out.append(bool(row) and f not in VIEW_FAMILIES and not (f == "" and kids))
        return out
    return cached(ctx, "is_worker", build)


def inside_worker(ctx: Context, i: int) -> bool:
    """Event i runs inside another row op that does work (e.g. fill_ initializing sum's output, copy_
    writing addmm's bias): part of that op's implementation."""
    return inside_worker_flags(ctx)[i]


def inside_worker_flags(ctx: Context) -> list[bool]:
    """inside_worker() for every event."""
    return cached(ctx, "inside_worker", lambda: _inside_worker_all(ctx))


def _inside_worker_all(ctx: Context) -> list[bool]:
    work = is_worker(ctx)
    rp = col(ctx, "row_parent")
    memo: list[bool | None] = [None] * len(rp)

    def resolve(i: int) -> bool:
        chain = []
        while memo[i] is None:
            a = rp[i]
            if a < 0:
                memo[i] = False
                break
            if work[a]:
                memo[i] = True
                break
            chain.append(i)
            i = a
        value = memo[i]
        for k in chain:
            memo[k] = value
        return value

    return [resolve(i) for i in range(len(rp))]


def row_ancestors(ctx: Context, i: int) -> list[int]:
    """Row (ns::op) ancestors of event i, innermost first (not including i)."""
    rp = col(ctx, "row_parent")
    out = []
    a = rp[i]
    while a >= 0:
        out.append(a)
        a = rp[a]
    return out


def ops_row_of_events(ctx: Context) -> list[int]:
    """Per event: index of its ops.csv row in ctx.ops (-1 for non-row events)."""
    return cached(ctx, "ops_row", lambda: ops_rows_for_events(ctx.ops, ctx.events))


ROW_KEY = ("op", "input_dims", "input_dtypes", "input_strides", "concrete_inputs", "source_location", "module")


def ops_rows_for_events(ops: Table | pd.DataFrame, ev: Table | pd.DataFrame) -> list[int]:
    """Per event of the event table `ev`: index of its row in the ops table `ops` (-1 for non-row events).
    Tables or DataFrames (the Nsight commands read runs back as DataFrames)."""
    ops, ev = _columns(ops), _columns(ev)
    lookup = {key: k for k, key in enumerate(zip(*(ops[c] for c in ROW_KEY), strict=True))}
    keys = zip(ev["name"], *(ev[c] for c in ROW_KEY[1:]), strict=True)
    get = lookup.get
    return [get(key, -1) if is_row else -1 for key, is_row in zip(keys, ev["is_row"], strict=True)]


def event_bound(ctx: Context) -> list[str]:
    """Per event: the `bound` of its ops.csv row ('' for non-row events)."""
    def build() -> list[str]:
        bounds = ctx.ops["bound"]
        return [bounds[r] if r >= 0 else "" for r in ops_row_of_events(ctx)]
    return cached(ctx, "event_bound", build)


# --- tensors as recorded --------------------------------------------------------------------------

@dataclass(frozen=True)
class Tensor(TensorArg):
    """A tensor input as the trace records it (the cost model's TensorArg), with layout predicates."""

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def known_strides(self) -> bool:
        return len(self.stride) == len(self.shape)

    @property
    def contiguous(self) -> bool:
        return self.is_contiguous

    @property
    def broadcast(self) -> bool:
        """Some dimension of size > 1 has stride 0 (an expanded view)."""
        return self.known_strides and any(st == 0 and n > 1 for n, st in zip(self.shape, self.stride, strict=True))

    @property
    def dtype_name(self) -> str:
        return DTYPE_NAMES.get(self.dtype, self.dtype)


def is_nchw(t: Tensor | None) -> bool:
    """A 4-D tensor with the contiguous (NCHW) strides that is not also channels_last (C == 1 or
    H*W == 1 make both layouts the same)."""
    return (t is not None and t.ndim == 4 and t.known_strides and t.contiguous
            and not _layout_ambiguous(t))


def is_channels_last(t: Tensor | None) -> bool:
    """A 4-D tensor with channels_last strides [H*W*C, 1, W*C, C] (size-1 dims' strides ignored), not
    also NCHW-contiguous."""
    if t is None or t.ndim != 4 or not t.known_strides or _layout_ambiguous(t):
        return False
    n, c, h, w = t.shape
    expected = (h * w * c, 1, w * c, c)
    return all(size == 1 or st == e for size, st, e in zip(t.shape, t.stride, expected, strict=True))


def _layout_ambiguous(t: Tensor) -> bool:
    _, c, h, w = t.shape
    return c == 1 or h * w == 1


def _loads(text: str) -> list:
    if not text:
        return []
    try:
        v = json.loads(text)
    except ValueError:
        return []
    return v if isinstance(v, list) else []


def _tensor_at(dims: list, types: list, strides: list, k: int) -> Tensor | None:
    if k >= len(dims):
        return None
    shape = dims[k]
    dtype = types[k] if k < len(types) else ""
    if not isinstance(shape, list) or not isinstance(dtype, str) or dtype in NON_TENSOR:
        return None
    if shape and isinstance(shape[0], list):
        return None  # a TensorList
    if not all(isinstance(s, int) for s in shape):
        return None
    stride = strides[k] if k < len(strides) and isinstance(strides[k], list) else []
    if not all(isinstance(s, int) for s in stride):
        stride = []
    return Tensor(tuple(shape), dtype, tuple(stride))


def tensors(ctx: Context, i: int) -> list[Tensor | None]:
    """Event i's inputs by position: a Tensor for each plain tensor argument, None otherwise."""
    # Keyed by the recorded text, not the event: a million events hold a few thousand distinct inputs.
    memo = ctx.cache.setdefault("tensors", {})
    key = (col(ctx, "input_dims")[i], col(ctx, "input_dtypes")[i], col(ctx, "input_strides")[i])
    hit = memo.get(key)
    if hit is None:
        dims, types, strides = _loads(key[0]), _loads(key[1]), _loads(key[2])
        hit = [_tensor_at(dims, types, strides, k) for k in range(len(dims))]
        memo[key] = hit
    return hit


def tensor(ctx: Context, i: int, k: int) -> Tensor | None:
    ts = tensors(ctx, i)
    return ts[k] if k < len(ts) else None


def concrete(ctx: Context, i: int, k: int, default: Any = None) -> Any:
    """Concrete input k of event i as a Python value ("[1]" -> [1], "2" -> 2, "" -> default)."""
    memo = ctx.cache.setdefault("concrete", {})
    vals = memo.get(i)
    if vals is None:
        vals = _loads(col(ctx, "concrete_inputs")[i])
        memo[i] = vals
    if k >= len(vals) or vals[k] in ("", None):
        return default
    text = vals[k]
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        low = text.strip().lower()
        if low in ("true", "false"):
            return low == "true"
        return text


def memory_order(t: Tensor) -> tuple[int, ...]:
    """Dims of size > 1 from outermost to innermost in memory (by stride; ties keep logical order)."""
    dims = [k for k in range(t.ndim) if t.shape[k] > 1]
    return tuple(sorted(dims, key=lambda k: (-abs(t.stride[k]), -k)))


def is_dense(t: Tensor) -> bool:
    """Non-overlapping and dense: some permutation of the dims is contiguous (a transposed or
    channels_last tensor is dense; a slice with gaps or an expanded tensor is not)."""
    if not t.known_strides:
        return True
    expected = 1
    for k in reversed(memory_order(t)):
        if abs(t.stride[k]) != expected:
            return False
        expected *= t.shape[k]
    return True


def layout_cause(ts: Sequence[Tensor | None], *, allow_broadcast: bool = True) -> str | None:
    """Why a memory-bound op reading these inputs may miss peak bandwidth, judged from strides alone:
    - 'strided': an input with gaps whose innermost stride is not 1 (e.g. every other element), or
      same-shaped dense inputs in different memory orders (one transposed/permuted, the other not), so
      one of them is read against its layout. (A transposed or channels_last tensor alone is fine:
      kernels iterate in memory order.)
    - 'small-inner': an input with gaps whose contiguous runs are under SMALL_INNER_BYTES (a narrow
      slice of a wider tensor).
    - 'broadcast': an expanded input (stride 0) along the innermost memory dim of the op's largest
      dense input (not used when allow_broadcast is False).
    None when nothing in the strides explains it."""
    real = [t for t in ts if t is not None and t.known_strides and t.numel > 1]
    if not real:
        return None
    for t in real:
        if t.broadcast or is_dense(t):
            continue
        order = memory_order(t)
        if not order:
            continue
        if abs(t.stride[order[-1]]) != 1:
            return "strided"
        run, expected = 1, 1
        for k in reversed(order):
            if abs(t.stride[k]) != expected:
                break
            run *= t.shape[k]
            expected *= t.shape[k]
        if run * t.itemsize < SMALL_INNER_BYTES:
            return "small-inner"
    dense = [t for t in real if not t.broadcast and is_dense(t)]
    if not dense:
        return None
    ref = max(dense, key=lambda t: t.numel)
    same = [t for t in dense if t.shape == ref.shape]
    if len({memory_order(t) for t in same}) > 1:
        return "strided"
    order = memory_order(ref)
    if allow_broadcast and order:
        inner = order[-1]
        for t in real:
            k = inner - (ref.ndim - t.ndim)
            if t.broadcast and 0 <= k < t.ndim and t.shape[k] > 1 and t.stride[k] == 0:
                return "broadcast"
    return None


SMALL_INNER_BYTES = 64  # a cache line / two 32-byte GPU sectors
CAUSE_TEXT = {
    "broadcast": "an input is expanded (stride 0) along the innermost dim in memory, so the kernel re-reads "
                 "it instead of streaming",
    "strided": "an input is read against its memory layout (a strided slice, or a transposed/permuted tensor "
               "combined with one in another order), so reads are not contiguous",
    "small-inner": f"an input's contiguous inner runs are under {SMALL_INNER_BYTES} bytes (a small innermost "
                   "dim), so each memory transaction carries little useful data",
}


# --- numbers --------------------------------------------------------------------------------------

def severity(saving_us: float | None, ctx: Context) -> str:
    total = ctx.total_time_us
    if saving_us is None or not total or total <= 0 or not math.isfinite(saving_us):
        return "low"
    share = saving_us / total
    if share >= HIGH_SHARE:
        return "high"
    if share >= MEDIUM_SHARE:
        return "medium"
    return "low"


def share(us: float, ctx: Context) -> float:
    total = ctx.total_time_us
    return us / total if total > 0 else 0.0


def fmt_bytes(n: float | None) -> str:
    if n is None or not math.isfinite(n):
        return UNKNOWN
    for unit, scale in (("GiB", 1024 ** 3), ("MiB", 1024 ** 2), ("KiB", 1024)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def fmt_us(us: float | None) -> str:
    if us is None or not math.isfinite(us):
        return UNKNOWN
    if abs(us) >= 1e6:
        return f"{us / 1e6:.3g} s"
    if abs(us) >= 1e3:
        return f"{us / 1e3:.3g} ms"
    return f"{us:.3g} µs"


def fmt_shape(t: Tensor | None) -> str:
    if t is None:
        return "?"
    text = "[" + ", ".join(map(str, t.shape)) + "]"
    if t.known_strides and not t.contiguous:
        text += " strides [" + ", ".join(map(str, t.stride)) + "]"
    return text


def short(op: str) -> str:
    return op.split("::", 1)[1] if op.startswith("aten::") else op


def base_name(op: str) -> str:
    """'aten::add_' -> 'add'; 'aten::_softmax' -> '_softmax'."""
    name = short(op)
    return name[:-1] if name.endswith("_") and not name.endswith("__") else name


def first_match(table: Iterable[tuple[Any, T]], pred: Callable[[Any], bool], default: T) -> T:
    for key, value in table:
        if pred(key):
            return value
    return default


def per_step(x: float, ctx: Context) -> float:
    return x / max(ctx.steps, 1)


def events_by_ops_row(ctx: Context) -> dict[int, list[int]]:
    """ops.csv row index -> the user events (see user_mask) grouped into it, in trace order."""
    def build() -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for i, (r, user) in enumerate(zip(ops_row_of_events(ctx), user_mask(ctx), strict=True)):
            if r >= 0 and user:
                out.setdefault(r, []).append(i)
        return out
    return cached(ctx, "events_by_row", build)


def ideal_memory_us(nbytes: float, ctx: Context, fraction: float = 1.0) -> float | None:
    """Time to move nbytes at `fraction` of the peak memory bandwidth (µs), None if the peak is unknown."""
    bw = ctx.peaks.memory_bandwidth_gbps
    if not bw or bw <= 0 or not math.isfinite(nbytes):
        return None
    return nbytes / (bw * fraction * 1e3)


def ideal_row_us(row: Any, ctx: Context, fraction: float = 1.0) -> float | None:
    """Per-call roofline time of an ops.csv row at `fraction` of the peaks that apply to it: the larger of
    bytes / bandwidth and FLOPs / the row's ceiling. None when bytes or the bandwidth are unknown."""
    nbytes = float(row["bytes_per_call"]) if _known(row["bytes_per_call"]) else math.nan
    mem = ideal_memory_us(nbytes, ctx, fraction)
    if mem is None:
        return None
    flops = float(row["flops_per_call"]) if _known(row["flops_per_call"]) else 0.0
    peak = ctx.peaks.flops_for(row["ceiling"]) if row.get("ceiling") else None
    comp = flops / (peak * fraction * 1e3) if peak and flops > 0 else 0.0
    return max(mem, comp)


def _known(x: Any) -> bool:
    """Not missing (None or NaN), as pandas.notna for a scalar."""
    return x is not None and x == x
