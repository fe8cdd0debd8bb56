"""channels-last: layout-sensitive ops fed NCHW where channels_last is faster on this device (2-D
convolutions, pooling, batch norm, upsampling), and layout ping-pong (copies converting activations
between NCHW and channels_last, again and again).

Layout ops (LAYOUT_OPS): every forward aten::convolution (not transposed), max/avg/adaptive 2-D pooling,
batch norm and nearest/bilinear/bicubic 2-D upsampling whose input has the contiguous NCHW strides (not
also channels_last, i.e. C > 1 and H*W > 1); where one calls another (max_pool2d ->
max_pool2d_with_indices) the outermost counts. Grouped by (line, op, shapes, arguments): one finding each.
- `opscope profile` (Context.layout_probe set): the probe times this exact call (its recorded shapes,
  dtype and arguments) in NCHW and in channels_last on the profiled device. Fires when channels_last is
  faster by more than MIN_GAIN (10 %) and by at least MIN_US_PER_STEP (5 µs) per step. Saving = the
  measured fraction (1 - t_cl / t_nchw) of the op's profiled time, capped at (t_nchw - t_cl) x calls
  (forward only; backward ops usually gain too and are not counted). The op and what runs beneath it
  (CPU upsampling's own NCHW <-> channels_last copies) are then this finding's: low-bandwidth and the
  copy rules leave them alone.
- `opscope analyze` (no probe): fires only for float16/bfloat16 convolutions on a GPU, where tensor-core
  convolution kernels are written for NHWC and an NCHW input costs layout transposes around the kernel
  (often visible as nchwToNhwc / nhwcToNchw kernels). Saving = RULE_OF_THUMB_FRACTION (20 %) of the
  convolution's time, stated as estimated (not measured). CPU traces and fp32 GPU traces: no finding
  (low-bandwidth names NCHW as the possible cause of a slow pooling / batch norm / upsampling op).

Ping-pong: copies classified "format" (see copies.py): a copy whose source is channels_last and
destination NCHW or the reverse, outside convolution internals, when there are at least
PINGPONG_MIN_PER_STEP (2) per step. One finding per (line, direction); saving = those copies' time.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, TypedDict

from opscope import units
from opscope.findings.base import Context, Finding, cached, rule
from opscope.findings.common import count_per_step, fmt_shape, per_step, severity
from opscope.findings.copies import PINGPONG_MIN_PER_STEP, copies_of_kind, group
from opscope.findings.layout import LAYOUT_OPS, UPSAMPLE_MODES, Tensor, concrete, is_nchw, tensor, tensors
from opscope.findings.tree import col, descendants, names, row_ancestors, subtree_sum, user_mask

MIN_GAIN = 0.10
MIN_US_PER_STEP = 5.0
RULE_OF_THUMB_FRACTION = 0.20
HALF_DTYPES = ("float16", "bfloat16")
CONV_OP = "aten::convolution"
MAX_ARG = 1 << 20  # a recorded kernel size, stride or output size beyond this is not a real one
TRANSPOSE_KERNELS = ("nchwToNhwc", "nhwcToNchw")

CONV_SUGGESTION = ("Use channels_last end to end: model = model.to(memory_format=torch.channels_last) and feed "
                   "inputs converted once with x.to(memory_format=torch.channels_last) (in the data pipeline, "
                   "not per layer). Element-wise ops, batch norm and pooling keep the layout.")
LAYOUT_SUGGESTION = ("Feed this op channels_last activations: convert the input once (x.to(memory_format="
                     "torch.channels_last), in the data pipeline, not per layer) and the model "
                     "(model.to(memory_format=torch.channels_last)) so its convolutions keep the layout; "
                     "pooling, batch norm, upsampling and element-wise ops pass it on. Flatten only after "
                     "pooling to 1x1, or the .view()/.flatten() copies back to NCHW.")
PINGPONG_SUGGESTION = ("Keep one memory format through the network: convert the model and the input once "
                       "(model.to(memory_format=torch.channels_last)) and remove what forces NCHW in between "
                       "(.contiguous() / .view() / .flatten() on 4-D activations, ops without channels_last "
                       "kernels); flatten only after pooling to 1x1.")


def _ints(value: Any, n: int) -> list[int] | None:
    """A recorded int or int list as a list of n ints (a single int repeated), or None if it is not one
    (a trace is data: bounded, no guessing)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        value = [value]
    if not isinstance(value, list) or not 1 <= len(value) <= n or not all(
            isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_ARG for v in value):
        return None
    return value * n if len(value) == 1 else value


def _scales(value: Any) -> list[float] | None:
    """Upsampling scale factors as recorded ("[2., 2.]", "2.", [2.0, 2.0]): two positive floats, or None."""
    if isinstance(value, str):
        parts = [p for p in value.strip("[] ").split(",") if p.strip()]
        try:
            value = [float(p) for p in parts]
        except ValueError:
            return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list) or len(value) not in (1, 2):
        return None
    out = [float(v) for v in value if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if len(out) != len(value) or not all(0 < v <= MAX_ARG for v in out):
        return None
    return out * 2 if len(out) == 1 else out


def _conv_spec(ctx: Context, i: int) -> dict[str, Any] | None:
    x, w = tensor(ctx, i, 0), tensor(ctx, i, 1)
    if x is None or w is None or x.ndim != 4 or w.ndim != 4:
        return None
    if concrete(ctx, i, 6, False) is True:  # transposed convolution
        return None
    stride, padding = _ints(concrete(ctx, i, 3, [1, 1]), 2), _ints(concrete(ctx, i, 4, [0, 0]), 2)
    dilation, groups = _ints(concrete(ctx, i, 5, [1, 1]), 2), _ints(concrete(ctx, i, 8, 1), 1)
    if stride is None or padding is None or dilation is None or groups is None:
        return None
    return {"op": "conv2d", "input": list(x.shape), "weight": list(w.shape), "dtype": x.dtype_name,
            "stride": stride, "padding": padding, "dilation": dilation, "groups": groups[0]}


def _pool_spec(ctx: Context, i: int, kind: str) -> dict[str, Any] | None:
    if kind in ("adaptive_avg_pool2d", "adaptive_max_pool2d"):
        size = _ints(concrete(ctx, i, 1), 2)
        return {"output_size": size} if size else None
    kernel = _ints(concrete(ctx, i, 1), 2)
    stride = concrete(ctx, i, 2, [])
    stride = [] if stride == [] else _ints(stride, 2)  # [] = the kernel size
    padding = _ints(concrete(ctx, i, 3, [0]), 2)
    if not kernel or stride is None or padding is None:
        return None
    if kind == "max_pool2d":
        dilation = _ints(concrete(ctx, i, 4, [1]), 2)
        ceil = concrete(ctx, i, 5, False)
        return None if dilation is None or not isinstance(ceil, bool) else {
            "kernel": kernel, "stride": stride, "padding": padding, "dilation": dilation, "ceil_mode": ceil}
    ceil, include_pad = concrete(ctx, i, 4, False), concrete(ctx, i, 5, True)
    if not isinstance(ceil, bool) or not isinstance(include_pad, bool) or concrete(ctx, i, 6) is not None:
        return None  # (a divisor_override is rare: not probed)
    return {"kernel": kernel, "stride": stride, "padding": padding, "ceil_mode": ceil,
            "count_include_pad": include_pad}


def _batch_norm_spec(ctx: Context, i: int) -> dict[str, Any] | None:
    if names(ctx)[i] == "aten::_native_batch_norm_legit_no_training":
        training, eps = False, concrete(ctx, i, 6)
    else:
        training, eps = concrete(ctx, i, 5), concrete(ctx, i, 7)
    if isinstance(eps, str):
        try:
            eps = float(eps)
        except ValueError:
            return None
    if not isinstance(training, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
        return None
    params = next((t for t in tensors(ctx, i)[1:5] if t is not None), None)
    spec: dict[str, Any] = {"training": training, "eps": float(eps)}
    if params is not None:
        spec["params_dtype"] = params.dtype_name
    return spec


def _upsample_spec(ctx: Context, i: int, x: Tensor) -> dict[str, Any] | None:
    mode = UPSAMPLE_MODES[names(ctx)[i]]
    size = _ints(concrete(ctx, i, 1), 2)
    if size is None:  # the .vec overload (input, None, [align_corners,] scale_factors)
        scales = _scales(concrete(ctx, i, 2 if mode.startswith("nearest") else 3))
        if scales is None:
            return None
        size = [int(x.shape[2] * scales[0]), int(x.shape[3] * scales[1])]
        if not all(1 <= v <= MAX_ARG for v in size):
            return None
    spec: dict[str, Any] = {"mode": mode, "output_size": size}
    if mode in ("bilinear", "bicubic"):
        align = concrete(ctx, i, 2, False)
        if not isinstance(align, bool):
            return None
        spec["align_corners"] = align
    return spec


def layout_spec(ctx: Context, i: int) -> dict[str, Any] | None:
    """What the layout probe times for event i (a LAYOUT_OPS op): its kind (spec["op"]), input shape and
    dtype, and the arguments it was called with; None when they are not all recorded."""
    kind = LAYOUT_OPS[names(ctx)[i]]
    if kind == "conv2d":
        return _conv_spec(ctx, i)
    x = tensor(ctx, i, 0)
    if x is None or x.ndim != 4:
        return None
    if kind == "batch_norm":
        args = _batch_norm_spec(ctx, i)
    elif kind == "upsample":
        args = _upsample_spec(ctx, i, x)
    else:
        args = _pool_spec(ctx, i, kind)
    if args is None:
        return None
    return {"op": kind, "input": list(x.shape), "dtype": x.dtype_name, **args}


def _describe(spec: dict[str, Any]) -> str:
    """'max_pool2d (input [16, 32, 64, 64], float32, kernel [2, 2], stride [2, 2])'."""
    kind = spec["op"]
    what = {"conv2d": f"conv2d (input {spec['input']}, weight {spec.get('weight')}, {spec['dtype']})",
            "batch_norm": f"batch_norm (input {spec['input']}, {spec['dtype']}, "
                          f"{'training' if spec.get('training') else 'eval'})",
            "upsample": f"{spec.get('mode')} upsampling (input {spec['input']} to {spec.get('output_size')}, "
                        f"{spec['dtype']})"}
    if kind in what:
        return what[kind]
    if kind.startswith("adaptive"):
        return f"{kind} (input {spec['input']} to {spec.get('output_size')}, {spec['dtype']})"
    stride = spec.get("stride") or spec.get("kernel")
    return f"{kind} (input {spec['input']}, {spec['dtype']}, kernel {spec.get('kernel')}, stride {stride})"


class _LayoutGroup(TypedDict):
    """The NCHW calls of one layout-sensitive op at one line with one spec."""

    spec: dict[str, Any]  # layout_spec(): what the layout probe times
    op: str
    loc: str
    calls: int
    time: float  # µs, with what runs beneath
    kernels: set[str]
    events: list[int]


def _layout_groups(ctx: Context) -> list[_LayoutGroup]:
    nm = names(ctx)
    mask = user_mask(ctx)
    bwd = col(ctx, "bwd_root")
    locs = col(ctx, "source_location")
    times = subtree_sum(ctx, "time_us")
    kern = col(ctx, "kernels")
    groups: dict[tuple[str, str], _LayoutGroup] = {}  # (line, spec) -> its calls
    for i, name in enumerate(nm):
        if name not in LAYOUT_OPS or not mask[i] or bwd[i] >= 0 or not is_nchw(tensor(ctx, i, 0)):
            continue
        if any(nm[a] in LAYOUT_OPS for a in row_ancestors(ctx, i)):
            continue  # one dispatch level down of an op already counted (max_pool2d -> _with_indices)
        spec = layout_spec(ctx, i)
        if spec is None:
            continue
        key = (locs[i], repr(sorted(spec.items())))
        g = groups.setdefault(key, {"spec": spec, "op": name, "loc": locs[i], "calls": 0, "time": 0.0,
                                    "kernels": set(), "events": []})
        g["calls"] += 1
        g["time"] += float(times[i])
        g["events"].append(i)
        for j in [i, *descendants(ctx, i)]:
            if kern[j]:
                g["kernels"].update(kern[j].split(";"))
    return list(groups.values())


def _layout_finding(ctx: Context, g: _LayoutGroup) -> Finding | None:
    spec, calls, time = g["spec"], g["calls"], g["time"]
    conv = spec["op"] == "conv2d"
    if ctx.layout_probe is not None:
        measured = ctx.layout_probe(spec)
        if not measured:
            return None
        t_nchw, t_cl = measured
        if not (t_nchw > 0 and t_cl < (1 - MIN_GAIN) * t_nchw):
            return None
        if (t_nchw - t_cl) * per_step(calls, ctx) < MIN_US_PER_STEP:
            return None
        gain = 1 - t_cl / t_nchw
        saving = min(time * gain, (t_nchw - t_cl) * calls)
        message = (f"{_describe(spec)} runs in NCHW; measured on this device, channels_last takes "
                   f"{units.duration(t_cl)} instead of {units.duration(t_nchw)} per call ({gain:.0%} faster), "
                   f"{count_per_step(calls, ctx, 'call')} per step.")
    else:
        if not conv or not ctx.gpu or spec["dtype"] not in HALF_DTYPES:
            return None
        saving = RULE_OF_THUMB_FRACTION * time
        transposes = sorted(k for k in g["kernels"] if any(t in k for t in TRANSPOSE_KERNELS))
        extra = (" cuDNN converts the layout around the kernel on every call (nchwToNhwc/nhwcToNchw "
                 "kernels)." if transposes else "")
        shape = f"input {spec['input']}, weight {spec['weight']}, {spec['dtype']}"
        message = (f"{spec['dtype']} conv2d ({shape}) runs in NCHW on a tensor-core GPU, where convolution "
                   f"kernels are written for channels_last (NHWC).{extra} It took {units.duration(time)} "
                   f"({count_per_step(calls, ctx, 'call')} per step); saving estimated at "
                   f"{RULE_OF_THUMB_FRACTION:.0%} of that (rule of thumb, not measured).")
    return Finding(rule="channels-last", severity=severity(saving, ctx), op=g["op"], source_location=g["loc"],
                   message=message, suggestion=CONV_SUGGESTION if conv else LAYOUT_SUGGESTION,
                   est_savings_us=saving)


def _found(ctx: Context) -> list[tuple[Finding, list[int]]]:
    def build() -> list[tuple[Finding, list[int]]]:
        out = []
        for g in _layout_groups(ctx):
            f = _layout_finding(ctx, g)
            if f is not None:
                out.append((f, g["events"]))
        return out
    return cached(ctx, "channels_last_ops", build)


def layout_claimed_events(ctx: Context) -> set[int]:
    """Events of the ops a channels-last finding reports (with what runs beneath them): low-bandwidth
    leaves them to it."""
    def build() -> set[int]:
        return {j for _, evs in _found(ctx) for i in evs for j in (i, *descendants(ctx, i))}
    return cached(ctx, "channels_last_claimed", build)


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
                   f"{count_per_step(len(items), ctx, 'time')} per step: {units.nbytes(nbytes)} and {units.duration(time)} in all.")
        yield Finding(rule="channels-last", severity=severity(time, ctx), op=nm[biggest.root],
                      source_location=loc, message=message, suggestion=PINGPONG_SUGGESTION, est_savings_us=time)


@rule("channels-last")
def channels_last(ctx: Context) -> Iterator[Finding]:
    yield from (f for f, _ in _found(ctx))
    yield from _pingpong_findings(ctx)
