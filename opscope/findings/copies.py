"""Every data copy in the profiled steps, classified once so that each copy is reported by exactly one
rule (no double-counted savings):

- "conversion": a dtype change or a host<->device move (`dtype-conversion`);
- "format":     an NCHW <-> channels_last conversion between layers (`channels-last`, layout ping-pong),
                when there are at least PINGPONG_MIN_PER_STEP of them per step; otherwise the copy falls
                back to the kind it would have without the format check;
- "contiguous": an explicit `.contiguous()` in the user's forward code (`contiguous-call`);
- "implicit":   a copy an op made of a non-contiguous (not broadcast) input to get a dense one
                (`implicit-copy`): aten::reshape/flatten over a transposed tensor, a kernel calling
                .contiguous() on its input, ...;
- "":           anything else (a bias broadcast into addmm's output, cat/pad/repeat filling their
                output, explicit .clone(), scalar copies, a convolution's own weight-layout handling).

A copy is identified by its *root*: the outermost op of a chain of copy ops (aten::to -> _to_copy ->
copy_, aten::contiguous -> clone -> copy_); its time is the root's subtree time, its bytes the cost
model's (source storage read + destination written), or that formula from the recorded shapes.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from opscope.findings.base import Context
from opscope.findings.common import (
    Tensor,
    cached,
    col,
    descendants,
    is_channels_last,
    is_nchw,
    names,
    row_ancestors,
    subtree_sum,
    tensor,
    user_mask,
)

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
        in_conv = any("conv" in nm[a] for a in anc)
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
        if dtype_change or move:
            kind = "conversion"
        elif direction:
            # A convolution converting its own inputs/weights/grads is the conv's business (channels-last).
            kind = "" if in_conv else "format"
            if in_conv:
                fallback = ""
        else:
            kind = fallback
        b = float(nbytes[i])
        if b <= 0:
            b = float(src.storage_bytes + (dst.nbytes if dst is not None else src.nbytes))
        out.append(Copy(root=i, work=work, parent=p, parent_name=parent_name,
                        top_name=nm[anc[-1]] if anc else "", kind=kind, fallback=fallback,
                        src=src, dst=dst, dtype_change=dtype_change, device_move=move, direction=direction,
                        time_us=float(times[i]), bytes=b, location=locs[i], step=steps[i],
                        backward=bwd_root[i] >= 0))
    return out


def group(copies: list[Copy], key) -> dict:
    """Copies grouped by key(copy) -> list, insertion-ordered."""
    groups: dict = defaultdict(list)
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
