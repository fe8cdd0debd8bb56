"""A kernel is one folder, and its ops register on first use: importing reference_kernels or any opscope
module registers no op, builds nothing and (for reference_kernels) imports no torch; `load(name)` and
`reference_kernels.<name>` register that kernel's ops and no other's; a new folder is a new kernel
without an edit anywhere else. Each check runs in a fresh interpreter (this one has loaded kernels)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import reference_kernels
from reference_kernels.manifest import PACKAGE_DIR

REPO = PACKAGE_DIR.parent

# What the dispatcher and torch.library know under opscope's namespaces (the ops and the extensions').
STATE = """
def state():
    import torch
    from torch._library import custom_ops
    spaces = ("opscope", "opscope_cpu", "opscope_cuda")
    return {"ops": sorted(n for n in torch._C._dispatch_get_all_op_names() if n.split("::")[0] in spaces),
            "custom_ops": sorted(n for n in custom_ops.OPDEFS if n.split("::")[0] in spaces),
            "built": sorted(p.name for p in Path(os.environ["OPSCOPE_KERNELS_BUILD_DIR"]).glob("*"))}
"""


def _run(code: str, tmp_path: Path, pythonpath: Path = REPO) -> dict:
    env = {**os.environ, "PYTHONPATH": str(pythonpath), "OPSCOPE_KERNELS_BUILD_DIR": str(tmp_path / "build")}
    script = "import json, os, sys\nfrom pathlib import Path\n" + STATE + textwrap.dedent(code)
    proc = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_importing_reference_kernels_and_opscope_registers_and_builds_nothing(tmp_path: Path) -> None:
    doc = _run("""
        import importlib, pkgutil
        import reference_kernels
        torch_after_package = "torch" in sys.modules
        import opscope
        modules = [m.name for m in pkgutil.walk_packages(opscope.__path__, "opscope.") if m.name != "opscope.__main__"]
        for name in modules:
            importlib.import_module(name)
        for m in reference_kernels.manifests():  # each folder's op module: declares its ops, registers none
            importlib.import_module(f"reference_kernels.{m.name}.op")
        before = state()
        reference_kernels.load("rms_norm")
        after_load = state()
        reference_kernels.swiglu  # the package attribute is a first use too
        after_attribute = state()
        print(json.dumps({"torch_after_package": torch_after_package, "modules": len(modules), "before": before,
                          "after_load": after_load, "after_attribute": after_attribute,
                          "loaded": reference_kernels.loaded()}))
    """, tmp_path)
    assert doc["torch_after_package"] is False
    assert doc["modules"] > 50  # the walk reached the whole package
    assert doc["before"] == {"ops": [], "custom_ops": [], "built": []}
    rms_norm = ["opscope::rms_norm", "opscope::rms_norm_backward"]
    assert doc["after_load"] == {"ops": rms_norm, "custom_ops": rms_norm, "built": []}  # registered, not built
    swiglu = ["opscope::swiglu", "opscope::swiglu_backward"]
    assert doc["after_attribute"]["ops"] == sorted(rms_norm + swiglu)
    assert doc["loaded"] == ["rms_norm", "swiglu"]


def test_package_attribute_is_the_kernels_function_even_after_its_folder_is_imported(tmp_path: Path) -> None:
    doc = _run("""
        import torch
        from reference_kernels.sum.op import strategy  # makes the import system set reference_kernels.sum
        import reference_kernels
        x = torch.empty(2, 3, device="meta", dtype=torch.float16)  # meta: the fake implementations, no build
        added = reference_kernels.broadcast_add(1.0, x)
        print(json.dumps({"sum": type(reference_kernels.sum).__name__,
                          "add": [list(added.shape), str(added.dtype)],
                          "folder": sys.modules["reference_kernels.sum"].__name__,
                          "ops": state()["custom_ops"]}))
    """, tmp_path)
    assert doc["sum"] == "OpOverloadPacket"
    assert doc["add"] == [[2, 3], "torch.float16"]  # broadcast_add's entry point takes a Python number
    assert doc["folder"] == "reference_kernels.sum"
    assert doc["ops"] == ["opscope::broadcast_add", "opscope::sum"]


def test_unknown_kernels_are_refused_with_the_list() -> None:
    with pytest.raises(ValueError, match="no bundled kernel named 'nope'; the kernels are: bias_gelu, "):
        reference_kernels.load("nope")
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        reference_kernels.nope  # noqa: B018
    with pytest.raises(AttributeError):
        reference_kernels.csrc  # noqa: B018 - a folder, not a kernel
    assert "rms_norm" in dir(reference_kernels)


NEW_KERNEL = {
    "manifest.toml": """
        name = "twice"
        summary = "2 * x"
        signature = "twice(Tensor x) -> Tensor"
        category = "memory-bound"
        dtypes = ["float32"]
        backends = ["triton", "cuda"]
        [tolerance.float32]
        rtol = 0.0
        atol = 0.0
        [[replaces]]
        kind = "pattern"
        target = "x * 2"
        call = { x = "x" }
        [[bench]]
        name = "8"
        inputs = [[8]]
    """,
    "op.py": """
        import torch

        from reference_kernels._registry import CustomOp


        def twice(x: torch.Tensor) -> torch.Tensor:
            return x * 2


        def _fake(x: torch.Tensor) -> torch.Tensor:
            return x.new_empty(x.shape)


        OPS = (CustomOp("opscope::twice", twice, fake=_fake),)
    """,
    "__init__.py": "",
    "triton_kernels.py": "",
    "cuda.cu": "",
    "cuda_binding.cpp": "",
}


def test_a_new_kernel_is_one_new_folder(tmp_path: Path) -> None:
    """A copy of the package plus one folder: its manifest is listed, its op registers through the
    package, and both builds collect its sources; no other file names it."""
    shutil.copytree(PACKAGE_DIR, tmp_path / "pkg" / "reference_kernels", ignore=shutil.ignore_patterns("__pycache__"))
    folder = tmp_path / "pkg" / "reference_kernels" / "twice"
    folder.mkdir()
    for name, text in NEW_KERNEL.items():
        (folder / name).write_text(textwrap.dedent(text).lstrip())
    doc = _run("""
        import torch
        import reference_kernels
        from reference_kernels import _build
        x = torch.arange(3.0)
        print(json.dumps({"names": [m.name for m in reference_kernels.manifests()],
                          "result": reference_kernels.twice(x).tolist(),
                          "meta": list(torch.ops.opscope.twice(torch.empty(4, device="meta")).shape),
                          "cuda_units": [Path(u).name for u in _build.write_cuda_units(Path("units"))],
                          "ops": state()["custom_ops"]}))
    """, tmp_path, pythonpath=tmp_path / "pkg")
    assert "twice" in doc["names"]
    assert doc["result"] == [0.0, 2.0, 4.0] and doc["meta"] == [4]
    assert {"twice.cu", "twice_binding.cpp"} <= set(doc["cuda_units"])
    assert doc["ops"] == ["opscope::twice"]
