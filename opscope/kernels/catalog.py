"""The bundled kernels as `opscope swap` sees them, without importing torch: their manifests, what a
`--kernel` argument asks for, and which kernels could replace the ops of a run (its swap candidates).

`opscope analyze` and the CLI's argument checks must not import torch; `import reference_kernels` does
not (it registers no op and builds nothing until a kernel is used), and its manifest module reads only
the TOML files.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from opscope.errors import OpscopeError
from opscope.table import Table, nrows

COMPILE = "compile"  # --kernel compile: torch.compile of the whole model, the built-in baseline
HARNESS = "opscope:harness"


class SwapRequestError(OpscopeError):
    """A --kernel / --op / --module combination that cannot be swapped (exit 2)."""


def manifest_module() -> ModuleType:
    """reference_kernels.manifest (the schema and loader; importing it imports no torch)."""
    try:
        from reference_kernels import manifest
    except ImportError as exc:
        raise SwapRequestError("the reference_kernels package (bundled with opscope) is not installed") from exc
    return manifest


def manifests() -> list[Any]:
    """Every bundled kernel's KernelManifest, sorted by name. A malformed manifest is one error line."""
    mod = manifest_module()  # loaded from its file: untyped here
    try:
        found: list[Any] = mod.load_manifests()
    except mod.ManifestError as exc:
        raise SwapRequestError(str(exc)) from exc
    return found


def find(name: str) -> Any:
    for m in manifests():
        if m.name == name:
            return m
    names = ", ".join(m.name for m in manifests())
    raise SwapRequestError(f"no bundled kernel named {name!r}; the kernels are: {names} (or `compile`, or "
                           "FILE.py:FUNC with --op/--module)")


@dataclass
class SwapRequest:
    """One swap to verify and benchmark: bundled kernels applied together (`rms_norm+swiglu`), the
    compile baseline, or a user kernel (`FILE.py:FUNC` with `--op` or `--module`)."""

    label: str
    kernels: list[str] = field(default_factory=list)
    compile: bool = False
    user_file: str | None = None
    user_func: str | None = None
    op: str | None = None
    module: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dict(vars(self))

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> SwapRequest:
        return cls(**doc)

    @property
    def source(self) -> str:
        return "compile" if self.compile else "user" if self.user_file else "bundled"


def parse_requests(values: list[str], op: str | None = None, module: str | None = None) -> list[SwapRequest]:
    """`--kernel` values (repeatable; `a+b` applies bundled kernels together) into requests, checked
    without torch: bundled names exist, a user kernel is FILE.py:FUNC of a Python file that compiles and
    comes with exactly one of --op / --module, which only a user kernel takes."""
    from opscope.target.model_file import check_target_file

    if op is not None and module is not None:
        raise SwapRequestError("give --op or --module, not both: they say what the user kernel replaces")
    requests = []
    for value in values:
        if ":" in value and value.split(":", 1)[0].endswith(".py"):
            path, func = value.rsplit(":", 1)
            if not func.isidentifier():
                raise SwapRequestError(f"--kernel {value}: {func!r} is not a function name (FILE.py:FUNC)")
            check_target_file(Path(path))
            if op is None and module is None:
                raise SwapRequestError(f"--kernel {value} is a user kernel: say what it replaces with --op ATEN_OP "
                                       "(e.g. aten::add.Tensor) or --module CLASS_OR_NAME")
            if op is not None:
                check_op_name(op)
            requests.append(SwapRequest(label=f"{Path(path).name}:{func}", user_file=str(Path(path).absolute()),
                                        user_func=func, op=op, module=module))
            continue
        if value == COMPILE:
            requests.append(SwapRequest(label=COMPILE, compile=True))
            continue
        names = [n.strip() for n in value.split("+")]
        for name in names:
            find(name)
        if len(set(names)) != len(names):
            raise SwapRequestError(f"--kernel {value} names a kernel twice")
        requests.append(SwapRequest(label="+".join(names), kernels=names))
    if (op is not None or module is not None) and not any(r.user_file for r in requests):
        raise SwapRequestError("--op and --module say what a user kernel (--kernel FILE.py:FUNC) replaces; bundled "
                               "kernels know what they replace from their manifest")
    return requests


def check_op_name(op: str) -> None:
    """--op: an aten overload (`aten::add.Tensor`), an aten op (`aten::add`: every overload), or a
    torch.nn.functional function (`torch.nn.functional.gelu`)."""
    if op.startswith("aten::"):
        name = op.removeprefix("aten::")
        if all(part.isidentifier() for part in name.split(".")) and name.count(".") <= 1:
            return
    elif op.startswith("torch.nn.functional.") and op.removeprefix("torch.nn.functional.").isidentifier():
        return
    raise SwapRequestError(f"--op {op!r}: expected an aten op such as aten::add.Tensor (or aten::add for every "
                           "overload), or torch.nn.functional.NAME")


# --- swap candidates of a run ------------------------------------------------------------------------

MAX_DIMS_TEXT = 4096  # an input_dims cell longer than this is not read (real ones are a few hundred characters)
# ops whose result is not the broadcast of their inputs: the shape of their output, from their inputs'
_MATMUL_OUTPUT = {
    "aten::mm": lambda a: (a[0][0], a[1][1]),
    "aten::addmm": lambda a: (a[1][0], a[2][1]),
    "aten::bmm": lambda a: (a[0][0], a[0][1], a[1][2]),
    "aten::baddbmm": lambda a: (*a[1][:2], a[2][2]),
    "aten::matmul": lambda a: (*a[0][:-1], a[1][-1]),
    "aten::linear": lambda a: (*a[0][:-1], a[1][0]),
}


def _input_shapes(dims: Any) -> list[tuple[int, ...]] | None:
    """The shapes of a row's tensor inputs from its `input_dims` text (scalars and TensorLists left out),
    None when the row has no readable shapes."""
    if not isinstance(dims, str) or not dims or len(dims) > MAX_DIMS_TEXT:
        return None
    try:
        parsed = json.loads(dims)
    except (ValueError, RecursionError):
        return None
    if not isinstance(parsed, list):
        return None
    shapes = [tuple(d) for d in parsed if isinstance(d, list) and d
              and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in d)]
    return shapes or None


def _broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    n = max(len(a), len(b))
    out = []
    for x, y in zip((1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b, strict=True):
        if x != y and 1 not in (x, y):
            return None
        out.append(max(x, y) if 1 in (x, y) else x)
    return tuple(out)


def row_shape(op: str, dims: Any) -> tuple[int, ...] | None:
    """The shape an op works on: its output's for a matmul, else the broadcast of its tensor inputs (the
    largest input when they do not broadcast); None when the row records no shapes."""
    shapes = _input_shapes(dims)
    if shapes is None:
        return None
    if op in _MATMUL_OUTPUT:
        try:
            return tuple(_MATMUL_OUTPUT[op](shapes))
        except IndexError:
            return None
    out: tuple[int, ...] | None = shapes[0]
    for s in shapes[1:]:
        out = _broadcast(out, s) if out is not None else None
    return out if out is not None else max(shapes, key=math.prod)


def _fits(shape: tuple[int, ...] | None, pattern: tuple[int, ...]) -> bool:
    """Whether an op over `shape` can be a step of a pattern over `pattern`: it broadcasts to it (a
    reduced [.., 1] or a [N] weight), or it is the pattern's tensor with its leading dims flattened (a
    Linear's [B*T, N] matmul before a [B, T, N] GELU)."""
    if shape is None:
        return False
    if _broadcast(shape, pattern) == pattern:
        return True
    return bool(shape) and bool(pattern) and shape[-1] == pattern[-1] and math.prod(shape) == math.prod(pattern)


@dataclass
class _Place:
    """Rows that may hold one pattern, {op: rows}: those of one source line, or one module's own (its
    children's kept apart, see _entry_rows)."""

    rows: dict[str, list[int]] = field(default_factory=dict)
    children: dict[str, dict[str, list[int]]] = field(default_factory=dict)


def _places(ops: Table) -> list[_Place]:
    lines: dict[str, _Place] = {}
    modules: dict[str, _Place] = {}
    module_col = ops["module"] if "module" in ops else [None] * nrows(ops)
    for i, (op, loc, module) in enumerate(zip(ops["op"], ops["source_location"], module_col, strict=True)):
        if loc == HARNESS or not isinstance(op, str):
            continue
        if isinstance(loc, str) and loc:
            lines.setdefault(loc, _Place()).rows.setdefault(op, []).append(i)
        if isinstance(module, str) and module:
            modules.setdefault(module, _Place()).rows.setdefault(op, []).append(i)
            if "." in module:
                parent = modules.setdefault(module.rsplit(".", 1)[0], _Place())
                parent.children.setdefault(module, {}).setdefault(op, []).append(i)
    return [*lines.values(), *modules.values()]


def _entry_rows(need: set[str], place: _Place, shapes: list[tuple[int, ...] | None]) -> set[int]:
    """The rows of `place` where an entry needing the ops `need` matches. In a module, a child module that
    ran exactly one of those ops is one step of the module's pattern (the MLP's activation module, the
    Linear before a GELU) and its rows count; a child that ran several holds its own pattern (an RMSNorm
    inside a decoder layer) and is matched on its own. One op: its rows. Several: the rows of each op that
    fit one shape the pattern works on, when every op has one (rows without recorded shapes show no
    pattern)."""
    group = {op: list(rows) for op, rows in place.rows.items()}
    for child in place.children.values():
        steps = need & child.keys()
        if len(steps) == 1:
            (op,) = steps
            group.setdefault(op, []).extend(child[op])
    if not need <= group.keys():
        return set()
    if len(need) == 1:
        return {i for op in need for i in group[op]}
    rows: set[int] = set()
    for pattern in {shapes[i] for op in need for i in group[op] if shapes[i] is not None}:
        assert pattern is not None
        fitting = [[i for i in group[op] if _fits(shapes[i], pattern)] for op in need]
        if all(fitting):
            rows.update(i for f in fitting for i in f)
    return rows


def candidates(ops: Table, manifest_list: list[Any] | None = None) -> list[dict[str, Any]]:
    """The bundled kernels that could replace ops of a run (summary.json `swap_candidates`): `ops` is the
    run's ops table.

    A manifest `[[replaces]]` entry lists the ops it replaces (`ops`). It matches where every op it lists
    ran in one place: at one source location, or in one module (the `module` column; a child module
    that ran one of them, such as an activation module, counts as a step), the harness's own ops never. A line is not enough for an entry of several ops:
    torch.profiler's function-level lines put every op of a function on one line, so the ops must also
    work on one shape (each op's tensors broadcast to it, or are it with the leading dims flattened; a
    matmul's output counts), and only the rows of that shape are the entry's. One entry per kernel with any match:
    `{"kernel", "replaces": [{"kind", "target"}], "rows": [row indices into ops.csv], "time_us"}` (the
    matched rows' total time), largest time first."""
    if manifest_list is None:
        manifest_list = manifests()
    if "op" not in ops or "source_location" not in ops or not nrows(ops):
        return []
    places = _places(ops)
    dims = ops["input_dims"] if "input_dims" in ops else [None] * nrows(ops)
    shapes = [row_shape(op, d) if isinstance(op, str) else None for op, d in zip(ops["op"], dims, strict=True)]
    times = [float(t) if t == t else 0.0 for t in ops["time_us_total"]] if "time_us_total" in ops \
        else [0.0] * nrows(ops)
    out = []
    for m in manifest_list:
        rows: set[int] = set()
        entries = []
        for entry in m.replaces:
            need = set(entry.ops)
            if not need:
                continue
            hit = False
            for place in places:
                found = _entry_rows(need, place, shapes)
                if found:
                    hit = True
                    rows.update(found)
            if hit:
                entries.append({"kind": entry.kind, "target": entry.target})
        if rows:
            out.append({"kernel": m.name, "replaces": entries, "rows": sorted(rows),
                        "time_us": sum(times[i] for i in sorted(rows))})
    return sorted(out, key=lambda c: -c["time_us"])
