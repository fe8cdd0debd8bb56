"""channels-last: 2-D convolutions fed NCHW where channels_last is faster on this device, and layout
ping-pong (copies converting activations between NCHW and channels_last, again and again).

Convolutions: every forward aten::convolution (not transposed) whose input has the contiguous NCHW
strides (not also channels_last, i.e. C > 1 and H*W > 1), grouped by (line, shapes, hyper-parameters).
- `opscope profile` (Context.layout_probe set): the probe times this exact convolution in NCHW and in
  channels_last on the profiled device. Fires when channels_last is faster by more than MIN_GAIN (10 %)
  and by at least MIN_US_PER_STEP (5 µs) per step. Saving = the measured fraction (1 - t_cl / t_nchw)
  of the convolution's profiled time, capped at (t_nchw - t_cl) x calls (forward only; backward
  convolutions usually gain too and are not counted).
- `opscope analyze` (no probe): fires only for float16/bfloat16 convolutions on a GPU, where tensor-core
  convolution kernels are written for NHWC and an NCHW input costs layout transposes around the kernel
  (often visible as nchwToNhwc / nhwcToNchw kernels). Saving = RULE_OF_THUMB_FRACTION (20 %) of the
  convolution's time, stated as estimated (not measured). CPU traces and fp32 GPU traces: no finding.

Ping-pong: copies classified "format" (see copies.py): a copy whose source is channels_last and
destination NCHW or the reverse, outside convolution internals, when there are at least
PINGPONG_MIN_PER_STEP (2) per step. One finding per (line, direction); saving = those copies' time.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, TypedDict

from opscope import units
from opscope.findings.base import Context, Finding, rule
from opscope.findings.common import fmt_shape, per_step, severity
from opscope.findings.copies import PINGPONG_MIN_PER_STEP, copies_of_kind, group
from opscope.findings.layout import concrete, is_nchw, tensor
from opscope.findings.tree import col, descendants, names, subtree_sum, user_mask

MIN_GAIN = 0.10
MIN_US_PER_STEP = 5.0
RULE_OF_THUMB_FRACTION = 0.20
HALF_DTYPES = ("float16", "bfloat16")
CONV_OP = "aten::convolution"
TRANSPOSE_KERNELS = ("nchwToNhwc", "nhwcToNchw")

CONV_SUGGESTION = ("Use channels_last end to end: model = model.to(memory_format=torch.channels_last) and feed "
                   "inputs converted once with x.to(memory_format=torch.channels_last) (in the data pipeline, "
                   "not per layer). Element-wise ops, batch norm and pooling keep the layout.")
PINGPONG_SUGGESTION = ("Keep one memory format through the network: convert the model and the input once "
                       "(model.to(memory_format=torch.channels_last)) and remove what forces NCHW in between "
                       "(.contiguous() / .view() / .flatten() on 4-D activations, ops without channels_last "
                       "kernels); flatten only after pooling to 1x1.")


def _conv_spec(ctx: Context, i: int) -> dict[str, Any] | None:
    x, w = tensor(ctx, i, 0), tensor(ctx, i, 1)
    if x is None or w is None or x.ndim != 4 or w.ndim != 4:
        return None
    if concrete(ctx, i, 6, False) is True:  # transposed convolution
        return None
    spec = {
        "input": list(x.shape), "weight": list(w.shape), "dtype": x.dtype_name,
        "stride": list(concrete(ctx, i, 3, [1, 1])), "padding": list(concrete(ctx, i, 4, [0, 0])),
        "dilation": list(concrete(ctx, i, 5, [1, 1])), "groups": int(concrete(ctx, i, 8, 1)),
    }
    return spec


class _ConvGroup(TypedDict):
    """The NCHW convolutions of one line and spec."""

    spec: dict[str, Any]  # _conv_spec(): what the layout probe times
    loc: str
    calls: int
    time: float  # µs, with what runs beneath
    kernels: set[str]


def _conv_findings(ctx: Context) -> Iterator[Finding]:
    nm = names(ctx)
    mask = user_mask(ctx)
    bwd = col(ctx, "bwd_root")
    locs = col(ctx, "source_location")
    times = subtree_sum(ctx, "time_us")
    kern = col(ctx, "kernels")
    groups: dict[tuple[str, str], _ConvGroup] = {}  # (line, spec) -> its convolutions
    for i, name in enumerate(nm):
        if name != CONV_OP or not mask[i] or bwd[i] >= 0 or not is_nchw(tensor(ctx, i, 0)):
            continue
        spec = _conv_spec(ctx, i)
        if spec is None:
            continue
        key = (locs[i], repr(sorted(spec.items())))
        g = groups.setdefault(key, {"spec": spec, "loc": locs[i], "calls": 0, "time": 0.0, "kernels": set()})
        g["calls"] += 1
        g["time"] += float(times[i])
        for j in [i, *descendants(ctx, i)]:
            if kern[j]:
                g["kernels"].update(kern[j].split(";"))
    for g in groups.values():
        spec, calls, time = g["spec"], g["calls"], g["time"]
        shape = f"input {spec['input']}, weight {spec['weight']}, {spec['dtype']}"
        if ctx.layout_probe is not None:
            measured = ctx.layout_probe(spec)
            if not measured:
                continue
            t_nchw, t_cl = measured
            if not (t_nchw > 0 and t_cl < (1 - MIN_GAIN) * t_nchw):
                continue
            if (t_nchw - t_cl) * per_step(calls, ctx) < MIN_US_PER_STEP:
                continue
            gain = 1 - t_cl / t_nchw
            saving = min(time * gain, (t_nchw - t_cl) * calls)
            message = (f"conv2d ({shape}) runs in NCHW; measured on this device, channels_last takes "
                       f"{units.duration(t_cl)} instead of {units.duration(t_nchw)} per call ({gain:.0%} faster), "
                       f"{per_step(calls, ctx):g} calls per step.")
        else:
            if not ctx.gpu or spec["dtype"] not in HALF_DTYPES:
                continue
            saving = RULE_OF_THUMB_FRACTION * time
            transposes = sorted(k for k in g["kernels"] if any(t in k for t in TRANSPOSE_KERNELS))
            extra = (" cuDNN converts the layout around the kernel on every call (nchwToNhwc/nhwcToNchw "
                     "kernels)." if transposes else "")
            message = (f"{spec['dtype']} conv2d ({shape}) runs in NCHW on a tensor-core GPU, where convolution "
                       f"kernels are written for channels_last (NHWC).{extra} It took {units.duration(time)} "
                       f"({per_step(calls, ctx):g} calls per step); saving estimated at "
                       f"{RULE_OF_THUMB_FRACTION:.0%} of that (rule of thumb, not measured).")
        yield Finding(rule="channels-last", severity=severity(saving, ctx), op=CONV_OP, source_location=g["loc"],
                      message=message, suggestion=CONV_SUGGESTION, est_savings_us=saving)


def _pingpong_findings(ctx: Context) -> Iterator[Finding]:
    conversions = copies_of_kind(ctx, "format")
    if not conversions:
        return
    total_per_step = per_step(len(conversions), ctx)
    nm = names(ctx)
    for (loc, direction), items in group(conversions, lambda c: (c.location, c.direction)).items():
        time = sum(c.time_us for c in items)
        nbytes = sum(c.bytes for c in items)
        biggest = max(items, key=lambda c: c.bytes)
        to = "channels_last" if direction == "to_channels_last" else "NCHW"
        message = (f"layout ping-pong: {total_per_step:g} NCHW <-> channels_last conversions per step "
                   f"(threshold {PINGPONG_MIN_PER_STEP}); this line converts {fmt_shape(biggest.src)} to {to} "
                   f"{per_step(len(items), ctx):g} times per step: {units.nbytes(nbytes)} and {units.duration(time)} in all.")
        yield Finding(rule="channels-last", severity=severity(time, ctx), op=nm[biggest.root],
                      source_location=loc, message=message, suggestion=PINGPONG_SUGGESTION, est_savings_us=time)


@rule("channels-last")
def channels_last(ctx: Context) -> Iterator[Finding]:
    yield from _conv_findings(ctx)
    yield from _pingpong_findings(ctx)
