"""Every data copy in the profiled steps, classified once so that each copy is reported by exactly one
rule (no double-counted savings):

- "conversion": a dtype change or a host<->device move (`dtype-conversion`);
- "format":     an NCHW <-> channels_last conversion between layers, not inside a convolution, pooling,
                batch norm or upsampling op (`channels-last`, layout ping-pong),
                when there are at least PINGPONG_MIN_PER_STEP of them per step; otherwise the copy falls
                back to the kind it would have without the format check;
- "contiguous": an explicit `.contiguous()` in the user's forward code (`contiguous-call`);
- "implicit":   a copy an op made of a non-contiguous (not broadcast) input to get a dense one
                (`implicit-copy`): aten::reshape/flatten over a transposed tensor, a kernel calling
                .contiguous() on its input, ...;
- "internal":   a copy a convolution, matmul or attention kernel makes on its own although what it was
                given is in a layout it accepts (see kernel_own_copy): torch's business, not the user's
                (`kernel-copy`, a note); e.g. oneDNN's AVX2 convolution_backward copying the weight
                gradient of a channels_last net between layouts;
- "":           anything else (a bias broadcast into addmm's output, cat/pad/repeat filling their
                output, explicit .clone(), scalar copies, a convolution's own weight-layout handling, CPU
                upsampling converting its NCHW input to channels_last and back).

A copy is identified by its *root*: the outermost op of a chain of copy ops (aten::to -> _to_copy ->
copy_, aten::contiguous -> clone -> copy_); its time is the root's subtree time, its bytes the cost
model's (source storage read + destination written), or that formula from the recorded shapes.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TypeVar

from opscope.findings.base import Context, cached
from opscope.findings.common import base_name
from opscope.findings.layout import LAYOUT_OPS, Tensor, is_channels_last, is_dense, is_nchw, tensor, tensors
from opscope.findings.tree import col, descendants, names, row_ancestors, subtree_sum, user_mask

COPY_OPS = frozenset({
    "aten::clone", "aten::contiguous", "aten::copy_", "aten::_to_copy", "aten::to", "aten::type_as",
    "aten::_copy_from", "aten::_copy_from_and_resize", "aten::lift_fresh_copy",
})
# Ops whose job is to move data into a new layout/shape: their inner copies are the op, not a layout fix.
DATA_MOVEMENT_PARENTS = frozenset({
    "aten::cat", "aten::_cat", "aten::stack", "aten::hstack", "aten::vstack", "aten::dstack",
    "aten::constant_pad_nd", "aten::pad", "aten::repeat", "aten::repeat_interleave", "aten::tile",
    "aten::expand_copy", "aten::index_put_", "aten::index_put", "aten::_index_put_impl_",
    "aten::slice_scatter", "aten::select_scatter", "aten::as_strided_scatter", "aten::diagonal_scatter",
    "aten::narrow_copy", "aten::roll", "aten::flip", "aten::masked_scatter", "aten::index_copy",
    "aten::index_copy_", "aten::fill_", "aten::zero_", "aten::new_zeros", "aten::zeros_like",
})
# Reshape-like ops (base names): whether they can return a view depends on the strides the user's code
# produced, so a copy they make is always the user's to avoid, whichever op they run inside.
RESHAPE_LIKE = frozenset({"reshape", "flatten", "reshape_as", "ravel", "_reshape_alias", "unflatten"})
# Ops that pick their own internal layouts (see preferred_layout).
_CONV = re.compile(r"(^|_)conv(?!ert)")
_MATMUL = frozenset({"mm", "bmm", "addmm", "addbmm", "baddbmm", "matmul", "linear", "addmv", "mv", "dot",
                     "_addmm_activation", "_int_mm", "_scaled_mm"})
PINGPONG_MIN_PER_STEP = 2  # format conversions per step before they count as ping-pong
BACKWARD_WRAPPER = "autograd::engine::evaluate_function: "
_DEVICE_MOVES = ("Memcpy HtoD", "Memcpy DtoH", "Memcpy HtoH", "Memcpy PtoP")


@dataclass
class Copy:
    root: int  # outermost copy op of the chain (event index)
    work: int  # the aten::copy_ that did the work (event index; may be root)
    parent: int  # nearest row ancestor of root, -1 if none
    parent_name: str  # that op's name, or the autograd function for a copy directly in backward
    top_name: str  # the outermost row op above the copy (what the user's line called), "" if none
    owner: int  # the conv/matmul/attention op the copy runs inside (see copy_owner), -1 if none
    kind: str
    fallback: str  # kind when format conversions are too few to be ping-pong
    src: Tensor | None
    dst: Tensor | None
    dtype_change: bool
    device_move: str  # "HtoD", "DtoH", ... or ""
    direction: str  # "to_channels_last", "to_nchw" or ""
    time_us: float
    bytes: float
    location: str
    step: int
    backward: bool  # issued by autograd in the backward pass (location: the forward line it differentiates)


def _copy_work(ctx: Context, root: int) -> int:
    nm = names(ctx)
    if nm[root] == "aten::copy_":
        return root
    for j in descendants(ctx, root):
        if nm[j] == "aten::copy_":
            return j
    return -1


def _device_move(ctx: Context, root: int) -> str:
    kern = col(ctx, "kernels")
    text = ";".join(kern[j] for j in [root, *descendants(ctx, root)] if kern[j])
    for tag in _DEVICE_MOVES:
        if tag in text:
            return tag.split()[1]
    return ""


def layout_family(op: str) -> str:
    """'conv', 'matmul' or 'attention' for ops that choose their own internal layouts, else ''."""
    base = base_name(op)
    if _CONV.search(base):
        return "conv"
    if base in _MATMUL:
        return "matmul"
    return "attention" if "attention" in base else ""


def _follows(t: Tensor, order: tuple[int, ...]) -> bool:
    """Dense with `order` (outermost dim first) as its memory order; size-1 dims' strides ignored."""
    expected = 1
    for k in reversed(order):
        if t.shape[k] != 1 and t.stride[k] != expected:
            return False
        expected *= t.shape[k]
    return True


def preferred_layout(t: Tensor, family: str) -> bool:
    """Whether a tensor handed to an op of `family` is in a layout that op takes as it is:
    conv: contiguous, or channels_last (4-D) / channels_last_3d (5-D);
    matmul: contiguous, or transposed in its last two dims (BLAS reads either);
    attention: dense with the last dim innermost ([b, h, t, d] views of [b, t, h, d] included).
    Unknown strides prove nothing: False."""
    if not t.known_strides:
        return False
    if t.contiguous:
        return True
    n = t.ndim
    if family == "conv":
        return n in (4, 5) and _follows(t, (0, *range(2, n), 1))
    if family == "matmul":
        return n >= 2 and _follows(t, (*range(n - 2), n - 1, n - 2))
    if family == "attention":
        return n >= 1 and is_dense(t) and (t.shape[-1] == 1 or t.stride[-1] == 1)
    return False


def copy_owner(ctx: Context, ancestors: list[int]) -> int:
    """The conv/matmul/attention op a copy runs inside: its innermost such row ancestor, unless a
    reshape-like op (whose copies follow from the user's strides) comes first. -1 if none."""
    nm = names(ctx)
    for a in ancestors:
        if base_name(nm[a]) in RESHAPE_LIKE:
            return -1
        if layout_family(nm[a]):
            return a
    return -1


def kernel_own_copy(ctx: Context, owner: int, src: Tensor) -> bool:
    """A copy inside `owner` is the kernel's own business when what it copies came to the op in a layout
    the op accepts: the copy's source is one of the op's inputs, in a preferred layout, or (an
    intermediate the kernel made, or a view of an input) every input is in a preferred layout.
    Broadcast inputs (e.g. a gradient expanded by a sum loss) are left out of that check: their own
    copies are never blamed on the layout, and they are not what an intermediate is made of."""
    family = layout_family(names(ctx)[owner])
    inputs = [t for t in tensors(ctx, owner) if t is not None and t.numel > 1]
    if not inputs:
        return False
    for t in inputs:
        if t.shape == src.shape and t.stride == src.stride:
            return preferred_layout(t, family)
    return all(preferred_layout(t, family) for t in inputs if not t.broadcast)


def all_copies(ctx: Context) -> list[Copy]:
    return cached(ctx, "copies", lambda: _classify(ctx))


def pingpong_active(ctx: Context) -> bool:
    def build() -> bool:
        n = sum(1 for c in all_copies(ctx) if c.kind == "format")
        return n / max(ctx.steps, 1) >= PINGPONG_MIN_PER_STEP
    return cached(ctx, "pingpong", build)


def copies_of_kind(ctx: Context, kind: str) -> list[Copy]:
    """Copies a rule should report: format conversions count as "format" only when ping-pong is on."""
    active = pingpong_active(ctx)
    out = []
    for c in all_copies(ctx):
        k = c.kind if (c.kind != "format" or active) else c.fallback
        if k == kind:
            out.append(c)
    return out


def _classify(ctx: Context) -> list[Copy]:
    nm = names(ctx)
    mask = user_mask(ctx)
    row_parent = col(ctx, "row_parent")
    bwd_root = col(ctx, "bwd_root")
    locs = col(ctx, "source_location")
    steps = col(ctx, "step")
    times = subtree_sum(ctx, "time_us")
    nbytes = subtree_sum(ctx, "bytes")
    out: list[Copy] = []
    for i, name in enumerate(nm):
        if name not in COPY_OPS or not mask[i]:
            continue
        p = row_parent[i]
        if p >= 0 and nm[p] in COPY_OPS:
            continue  # not the root of its chain
        work = _copy_work(ctx, i)
        if work < 0:
            continue  # e.g. aten::to that returned its input
        dst, src = tensor(ctx, work, 0), tensor(ctx, work, 1)
        if src is None or src.numel <= 1:
            continue
        anc = row_ancestors(ctx, i)
        # a convolution, pooling, batch norm or upsampling op converting its own input's layout (CPU
        # upsampling of NCHW runs in channels_last in between) is that op's business: channels-last
        # times it in both layouts
        in_layout_op = any(layout_family(nm[a]) == "conv" or nm[a] in LAYOUT_OPS for a in anc)
        owner = copy_owner(ctx, anc)
        kernel_own = owner >= 0 and src.known_strides and kernel_own_copy(ctx, owner, src)
        if p >= 0:
            parent_name = nm[p]
        elif bwd_root[i] >= 0:
            parent_name = nm[bwd_root[i]].removeprefix(BACKWARD_WRAPPER)
        else:
            parent_name = ""
        dtype_change = dst is not None and dst.dtype != src.dtype
        move = _device_move(ctx, i)
        direction = ""
        if dst is not None:
            if is_channels_last(src) and is_nchw(dst):
                direction = "to_nchw"
            elif is_nchw(src) and is_channels_last(dst):
                direction = "to_channels_last"
        explicit_contiguous = name == "aten::contiguous" and p < 0 and bwd_root[i] < 0
        implicit = (
            (p >= 0 or bwd_root[i] >= 0)
            and not explicit_contiguous
            and (p < 0 or nm[p] not in DATA_MOVEMENT_PARENTS)
            and src.known_strides and not src.contiguous and not src.broadcast
            and (dst is None or dst.contiguous)
            and (name != "aten::copy_" or (dst is not None and dst.shape == src.shape))
        )
        fallback = "contiguous" if explicit_contiguous else "implicit" if implicit else ""
        if fallback == "implicit" and kernel_own:
            fallback = "internal"
        if dtype_change or move:
            kind = "conversion"
        elif direction:
            # A convolution converting its own inputs/weights/grads is the conv's business (channels-last);
            # when it was handed layouts it accepts, the conversion is a kernel-copy note.
            if in_layout_op:
                kind = fallback = "internal" if kernel_own else ""
            else:
                kind = "format"
        else:
            kind = fallback
        b = float(nbytes[i])
        if b <= 0:
            b = float(src.storage_bytes + (dst.nbytes if dst is not None else src.nbytes))
        out.append(Copy(root=i, work=work, parent=p, parent_name=parent_name,
                        top_name=nm[anc[-1]] if anc else "", owner=owner, kind=kind, fallback=fallback,
                        src=src, dst=dst, dtype_change=dtype_change, device_move=move, direction=direction,
                        time_us=float(times[i]), bytes=b, location=locs[i], step=steps[i],
                        backward=bwd_root[i] >= 0))
    return out


K = TypeVar("K", bound=Hashable)


def group(copies: list[Copy], key: Callable[[Copy], K]) -> dict[K, list[Copy]]:
    """Copies grouped by key(copy) -> list, insertion-ordered."""
    groups: dict[K, list[Copy]] = defaultdict(list)
    for c in copies:
        groups[key(c)].append(c)
    return groups


def claimed_events(ctx: Context) -> set[int]:
    """Events inside copies that a copy rule reports (their roots and everything beneath)."""
    def build() -> set[int]:
        active = pingpong_active(ctx)
        out: set[int] = set()
        for c in all_copies(ctx):
            kind = c.kind if (c.kind != "format" or active) else c.fallback
            if kind:
                out.add(c.root)
                out.update(descendants(ctx, c.root))
        return out
    return cached(ctx, "claimed", build)
