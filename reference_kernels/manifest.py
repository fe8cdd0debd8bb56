"""Kernel manifests: what each bundled kernel is, what it replaces and how to check and benchmark it.

One `manifest.toml` per kernel folder. The loader validates every field and raises ManifestError with
the file and the field on anything malformed, so a bad manifest fails `opscope kernels` and the tests,
never a later swap. Importing this module does not import torch.

Schema (every key required unless marked optional):

    name       = "rms_norm"                       # == the folder name == the op name opscope::<name>
    summary    = "one line"
    signature  = "rms_norm(Tensor x, Tensor weight, float eps=1e-6) -> Tensor"   # the op's schema
    category   = "memory-bound"                   # or "compute-bound": what % of peak is measured against
    dtypes     = ["float32", "float64", "bfloat16", "float16"]
    backends   = ["cpu", "triton", "cuda"]        # implementations in this folder
    knobs      = ["grain_size", "num_warps", "num_stages"]  # optional: tunables (see reference_kernels.tuning)

    [tune.cpu]                                   # optional: per backend, each knob's search space
    grain_size = [1, 4, 16, 64]                  # (`opscope kernels --tune` measures every value per shape class)
    [tune.triton]                                # the Triton forward's launch (`--tune --device cuda`, on a GPU):
    num_warps = [1, 2, 4, 8, 16]                 # every combination of the values is timed; `block` only for
    num_stages = [1, 2, 3]                       # element-wise kernels (a row kernel's BLOCK fixes its result)

    [tolerance.float32]                          # one table per dtype in `dtypes`: allowed error against
    rtol = 1e-5                                  # a float64 reference of the same math
    atol = 1e-6

    [[replaces]]                                 # what the kernel can stand in for (read by `opscope swap`)
    kind   = "module"                            # module | functional | method | aten | pattern
    target = "torch.nn.RMSNorm"                  # class, function, aten overload, or pattern name
    call   = { x = "input", weight = "module.weight", eps = "module.eps" }  # kernel argument -> expression
    when   = ["module.elementwise_affine"]       # optional: conditions that must hold to swap
    ops    = ["aten::pow", "aten::mean"]         # optional: aten ops the target runs (profile matching)
    note   = "..."                               # optional

    [[bench]]                                     # shapes to benchmark
    name   = "4096x4096"
    inputs = [[4096, 4096], [4096]]               # one shape per tensor argument, in signature order
    dtype  = "float32"                            # optional, default float32
    kwargs = { eps = 1e-6 }                       # optional: non-tensor arguments
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

PACKAGE_DIR = Path(__file__).resolve().parent
DTYPES = ("float32", "float64", "bfloat16", "float16")
BACKENDS = ("cpu", "triton", "cuda")
CATEGORIES = ("memory-bound", "compute-bound")
REPLACE_KINDS = ("module", "functional", "method", "aten", "pattern")
# The files a backend needs in the kernel's folder (the CUDA backend: launchers and their torch binding).
BACKEND_FILES = {"cpu": ("cpu.cpp",), "triton": ("triton_kernels.py",), "cuda": ("cuda.cu", "cuda_binding.cpp")}


class ManifestError(ValueError):
    """A manifest.toml is missing, unreadable or has a malformed field."""


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float


@dataclass(frozen=True)
class Replacement:
    """One thing the kernel can replace. `call` maps each kernel argument to an expression over the
    replaced target's arguments (by their names in the target's signature) and, for modules, `module.`
    attributes; `when` lists conditions under which the swap is valid (else: fall back to the original)."""

    kind: str
    target: str
    call: dict[str, str]
    when: tuple[str, ...] = ()
    ops: tuple[str, ...] = ()
    note: str = ""


@dataclass(frozen=True)
class BenchCase:
    name: str
    inputs: tuple[tuple[int, ...], ...]
    dtype: str = "float32"
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class KernelManifest:
    name: str
    summary: str
    signature: str
    category: str
    dtypes: tuple[str, ...]
    backends: tuple[str, ...]
    tolerance: dict[str, Tolerance]
    replaces: tuple[Replacement, ...]
    bench: tuple[BenchCase, ...]
    knobs: tuple[str, ...] = ()
    # backend -> knob -> the values `opscope kernels --tune` tries (only backends whose kernels take them)
    tune: dict[str, dict[str, tuple[int, ...]]] = field(default_factory=dict)
    folder: Path = PACKAGE_DIR

    @property
    def op(self) -> str:
        return f"opscope::{self.name}"

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "op": self.op, "summary": self.summary, "signature": self.signature,
            "category": self.category, "dtypes": list(self.dtypes), "backends": list(self.backends),
            "knobs": list(self.knobs),
            "tune": {b: {k: list(v) for k, v in knobs.items()} for b, knobs in self.tune.items()},
            "tolerance": {k: {"rtol": v.rtol, "atol": v.atol} for k, v in self.tolerance.items()},
            "replaces": [{"kind": r.kind, "target": r.target, "call": dict(r.call), "when": list(r.when),
                          "ops": list(r.ops), "note": r.note} for r in self.replaces],
            "bench": [{"name": b.name, "inputs": [list(s) for s in b.inputs], "dtype": b.dtype,
                       "kwargs": dict(b.kwargs)} for b in self.bench],
        }


def _need(doc: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in doc:
        raise ManifestError(f"{where}: missing required key {key!r}")
    value = doc[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise ManifestError(f"{where}: {key!r} must be {getattr(kind, '__name__', kind)}, got {value!r}")
    return value


def _names(values: list[Any], allowed: tuple[str, ...], key: str, where: str) -> tuple[str, ...]:
    bad = [v for v in values if v not in allowed]
    if bad or not values:
        raise ManifestError(f"{where}: {key} must be a non-empty list from {list(allowed)}, got {values!r}")
    return tuple(values)


def _shape(value: Any, where: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                              for d in value):
        raise ManifestError(f"{where}: a shape must be a list of non-negative ints, got {value!r}")
    return tuple(value)


def parse_manifest(doc: dict[str, Any], where: str, folder: Path = PACKAGE_DIR) -> KernelManifest:
    """Validate one parsed manifest document (`where` names it in errors)."""
    name = _need(doc, "name", str, where)
    dtypes = _names(_need(doc, "dtypes", list, where), DTYPES, "dtypes", where)
    backends = _names(_need(doc, "backends", list, where), BACKENDS, "backends", where)
    category = _need(doc, "category", str, where)
    if category not in CATEGORIES:
        raise ManifestError(f"{where}: category must be one of {list(CATEGORIES)}, got {category!r}")
    tol_doc = _need(doc, "tolerance", dict, where)
    tolerance: dict[str, Tolerance] = {}
    for dtype in dtypes:
        entry = _need(tol_doc, dtype, dict, f"{where} [tolerance]")
        rtol = _need(entry, "rtol", (int, float), f"{where} [tolerance.{dtype}]")
        atol = _need(entry, "atol", (int, float), f"{where} [tolerance.{dtype}]")
        if rtol < 0 or atol < 0:
            raise ManifestError(f"{where} [tolerance.{dtype}]: rtol and atol must be >= 0")
        tolerance[dtype] = Tolerance(float(rtol), float(atol))
    replaces = []
    for i, entry in enumerate(_need(doc, "replaces", list, where)):
        at = f"{where} [[replaces]] #{i + 1}"
        if not isinstance(entry, dict):
            raise ManifestError(f"{at}: must be a table")
        kind = _need(entry, "kind", str, at)
        if kind not in REPLACE_KINDS:
            raise ManifestError(f"{at}: kind must be one of {list(REPLACE_KINDS)}, got {kind!r}")
        call = _need(entry, "call", dict, at)
        if not all(isinstance(v, str) for v in call.values()):
            raise ManifestError(f"{at}: call values must be expressions (strings)")
        replaces.append(Replacement(kind=kind, target=_need(entry, "target", str, at), call=dict(call),
                                    when=tuple(entry.get("when", ())), ops=tuple(entry.get("ops", ())),
                                    note=str(entry.get("note", ""))))
    if not replaces:
        raise ManifestError(f"{where}: replaces must list at least one target")
    bench = []
    for i, entry in enumerate(_need(doc, "bench", list, where)):
        at = f"{where} [[bench]] #{i + 1}"
        if not isinstance(entry, dict):
            raise ManifestError(f"{at}: must be a table")
        inputs = tuple(_shape(s, at) for s in _need(entry, "inputs", list, at))
        dtype = entry.get("dtype", "float32")
        if dtype not in dtypes:
            raise ManifestError(f"{at}: dtype {dtype!r} is not among the kernel's dtypes {list(dtypes)}")
        kwargs = entry.get("kwargs", {})
        if not isinstance(kwargs, dict):
            raise ManifestError(f"{at}: kwargs must be a table")
        bench.append(BenchCase(name=_need(entry, "name", str, at), inputs=inputs, dtype=dtype,
                               kwargs=dict(kwargs)))
    knobs = doc.get("knobs", [])
    if not isinstance(knobs, list) or not all(isinstance(k, str) for k in knobs):
        raise ManifestError(f"{where}: knobs must be a list of names")
    tune = _tune(doc.get("tune", {}), tuple(knobs), backends, where)
    return KernelManifest(name=name, summary=_need(doc, "summary", str, where),
                          signature=_need(doc, "signature", str, where), category=category, dtypes=dtypes,
                          backends=backends, tolerance=tolerance, replaces=tuple(replaces),
                          bench=tuple(bench), knobs=tuple(knobs), tune=tune, folder=folder)


def _tune(doc: Any, knobs: tuple[str, ...], backends: tuple[str, ...], where: str) -> dict[str, dict[str, tuple[int, ...]]]:
    """[tune.<backend>] tables: each a declared knob -> a non-empty list of distinct non-negative ints."""
    if not isinstance(doc, dict):
        raise ManifestError(f"{where}: [tune] must be a table of backends")
    out: dict[str, dict[str, tuple[int, ...]]] = {}
    for backend, table in doc.items():
        at = f"{where} [tune.{backend}]"
        if backend not in backends:
            raise ManifestError(f"{at}: {backend!r} is not among the kernel's backends {list(backends)}")
        if not isinstance(table, dict) or not table:
            raise ManifestError(f"{at}: must be a table of knob = [values]")
        out[backend] = {}
        for knob, values in table.items():
            if knob not in knobs:
                raise ManifestError(f"{at}: {knob!r} is not among the kernel's knobs {list(knobs)}")
            if not isinstance(values, list) or not values or len(set(values)) != len(values) or not all(
                    isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
                raise ManifestError(f"{at}: {knob} must be a non-empty list of distinct non-negative ints, got {values!r}")
            out[backend][knob] = tuple(values)
    return out


def load_manifest(folder: Path) -> KernelManifest:
    """Read and validate `folder/manifest.toml`; the name must match the folder and every listed
    backend's files (BACKEND_FILES) must exist."""
    path = folder / "manifest.toml"
    try:
        doc = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ManifestError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError(f"{path}: not valid TOML ({exc})") from exc
    manifest = parse_manifest(doc, str(path), folder)
    if manifest.name != folder.name:
        raise ManifestError(f"{path}: name {manifest.name!r} must match its folder {folder.name!r}")
    for backend in manifest.backends:
        for file in BACKEND_FILES[backend]:
            if not (folder / file).is_file():
                raise ManifestError(f"{path}: lists backend {backend!r} but {file} is missing")
    return manifest


def load_manifests(root: Path = PACKAGE_DIR) -> list[KernelManifest]:
    """Every kernel folder under `root` (a folder with a manifest.toml), sorted by name."""
    return [load_manifest(p.parent) for p in sorted(root.glob("*/manifest.toml"))]
