"""The bundled kernels as `opscope swap` sees them, without importing torch: their manifests, what a
`--kernel` argument asks for, and which kernels could replace the ops of a run (its swap candidates).

`opscope analyze` and the CLI's argument checks must not import torch; `import reference_kernels` does
not (it registers no op and builds nothing until a kernel is used), and its manifest module reads only
the TOML files.
"""

from __future__ import annotations

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


def candidates(ops: Table, manifest_list: list[Any] | None = None) -> list[dict[str, Any]]:
    """The bundled kernels that could replace ops of a run (summary.json `swap_candidates`): `ops` is the
    run's ops table.

    A manifest `[[replaces]]` entry matches at a source location when every op it lists (`ops`) ran
    there (forward or backward rows with that `source_location`; the harness's own ops never match);
    its rows are then the rows at that location whose op it lists. One entry per kernel with any match:
    `{"kernel", "replaces": [{"kind", "target"}], "rows": [row indices into ops.csv], "time_us"}` (the
    matched rows' total time), largest time first."""
    if manifest_list is None:
        manifest_list = manifests()
    if "op" not in ops or "source_location" not in ops or not nrows(ops):
        return []
    by_location: dict[str, dict[str, list[int]]] = {}
    for i, (op, loc) in enumerate(zip(ops["op"], ops["source_location"], strict=True)):
        if not isinstance(loc, str) or not loc or loc == HARNESS or not isinstance(op, str):
            continue
        by_location.setdefault(loc, {}).setdefault(op, []).append(i)
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
            for ops_here in by_location.values():
                if need <= ops_here.keys():
                    hit = True
                    for op in need:
                        rows.update(ops_here[op])
            if hit:
                entries.append({"kind": entry.kind, "target": entry.target})
        if rows:
            out.append({"kernel": m.name, "replaces": entries, "rows": sorted(rows),
                        "time_us": sum(times[i] for i in sorted(rows))})
    return sorted(out, key=lambda c: -c["time_us"])


