"""Manifest schema and loader, and `opscope kernels [--json]`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_cli
from reference_kernels.manifest import (
    BACKENDS,
    REPLACE_KINDS,
    ManifestError,
    load_manifest,
    load_manifests,
)

GOOD = '''
name = "k"
summary = "s"
signature = "k(Tensor x) -> Tensor"
category = "memory-bound"
dtypes = ["float32"]
backends = ["cpu"]
[tolerance.float32]
rtol = 1e-5
atol = 1e-6
[[replaces]]
kind = "functional"
target = "torch.nn.functional.relu"
call = { x = "input" }
[[bench]]
name = "b"
inputs = [[8, 8]]
'''


def _folder(tmp_path: Path, text: str, name: str = "k", files: tuple[str, ...] = ("cpu.cpp",)) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "manifest.toml").write_text(text)
    for f in files:
        (folder / f).write_text("")
    return folder


def test_bundled_manifests_load_and_describe_their_swaps() -> None:
    manifests = load_manifests()
    names = [m.name for m in manifests]
    assert {"broadcast_add"} <= set(names)
    for m in manifests:
        assert m.backends and set(m.backends) <= set(BACKENDS)
        assert set(m.tolerance) == set(m.dtypes)
        assert m.bench, m.name
        for r in m.replaces:
            assert r.kind in REPLACE_KINDS and r.target and r.call
        # every CPU kernel declares its grain search space, the built-in default (0) among the candidates
        assert 0 in m.tune["cpu"]["grain_size"] and len(m.tune["cpu"]["grain_size"]) > 1, m.name
        # the Triton forward's launch: powers of two (Triton's BLOCK and warp counts); a row kernel's BLOCK
        # fixes its order of additions (its result), so only element-wise kernels tune it
        triton = m.tune.get("triton", {})
        assert triton and all(v > 0 and v & (v - 1) == 0 for k, vs in triton.items() if k != "num_stages" for v in vs)
        assert ("block" in triton) == (m.name in ("bias_gelu", "swiglu", "broadcast_add")), m.name


def test_valid_manifest_round_trips_to_json(tmp_path: Path) -> None:
    m = load_manifest(_folder(tmp_path, GOOD))
    doc = m.to_json()
    assert doc["op"] == "opscope::k"
    assert doc["replaces"][0] == {"kind": "functional", "target": "torch.nn.functional.relu",
                                  "call": {"x": "input"}, "when": [], "ops": [], "note": ""}
    assert doc["bench"][0]["inputs"] == [[8, 8]] and doc["bench"][0]["dtype"] == "float32"


@pytest.mark.parametrize(("edit", "message"), [
    (lambda s: s.replace('summary = "s"\n', ""), "missing required key 'summary'"),
    (lambda s: s.replace('kind = "functional"', 'kind = "monkeypatch"'), "kind must be one of"),
    (lambda s: s.replace('dtypes = ["float32"]', 'dtypes = ["float32", "int8"]'), "dtypes must be"),
    (lambda s: s.replace('dtypes = ["float32"]', 'dtypes = ["float32", "float16"]'), "missing required key 'float16'"),
    (lambda s: s.replace('name = "k"', 'name = "other"'), "must match its folder"),
    (lambda s: s.replace('backends = ["cpu"]', 'backends = ["cpu", "cuda"]'), "cuda.cu is missing"),
    (lambda s: s.replace("[[8, 8]]", "[[8, -1]]"), "non-negative ints"),
    (lambda s: s.replace('category = "memory-bound"', 'category = "fast"'), "category must be"),
    (lambda s: s + "= broken", "not valid TOML"),
    (lambda s: s.replace('backends = ["cpu"]', 'backends = ["cpu"]\nknobs = ["grain_size"]\n[tune.cpu]\nblock = [1, 2]'),
     "'block' is not among the kernel's knobs"),
    (lambda s: s.replace('backends = ["cpu"]', 'backends = ["cpu"]\nknobs = ["grain_size"]\n[tune.cpu]\ngrain_size = []'),
     "non-empty list of distinct"),
    (lambda s: s.replace('backends = ["cpu"]', 'backends = ["cpu"]\nknobs = ["grain_size"]\n[tune.triton]\ngrain_size = [1]'),
     "'triton' is not among the kernel's backends"),
])
def test_malformed_manifests_name_the_file_and_field(tmp_path: Path, edit, message: str) -> None:  # noqa: ANN001
    folder = _folder(tmp_path, edit(GOOD))
    with pytest.raises(ManifestError, match=message) as info:
        load_manifest(folder)
    assert "manifest.toml" in str(info.value)



def test_a_cuda_backend_needs_its_binding_in_the_folder(tmp_path: Path) -> None:
    folder = _folder(tmp_path, GOOD.replace('backends = ["cpu"]', 'backends = ["cpu", "cuda"]'),
                     files=("cpu.cpp", "cuda.cu"))
    with pytest.raises(ManifestError, match="lists backend 'cuda' but cuda_binding.cpp is missing"):
        load_manifest(folder)
    (folder / "cuda_binding.cpp").write_text("")
    assert load_manifest(folder).backends == ("cpu", "cuda")

def test_cli_lists_kernels_and_says_gpu_kernels_are_not_run_here() -> None:
    proc = run_cli("kernels", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    names = [k["name"] for k in doc["kernels"]]
    assert names == sorted(m.name for m in load_manifests())
    for k in doc["kernels"]:
        assert k["replaces"] and k["tolerance"] and k["signature"].startswith(k["name"] + "(")
        assert "cpu" in k["usable_here"]
    if doc["machine"]["gpu"] is None:
        assert "not run here (no GPU)" in doc["machine"]["backends"]["triton"]
        assert "not run here (no GPU)" in doc["machine"]["backends"]["cuda"]
        assert not any({"triton", "cuda"} & set(k["usable_here"]) for k in doc["kernels"])
        text = run_cli("kernels")
        assert text.returncode == 0
        assert "no GPU on this machine" in text.stdout and "broadcast_add" in text.stdout


def test_cli_unknown_kernel_is_a_one_line_error() -> None:
    proc = run_cli("kernels", "nosuch")
    assert proc.returncode == 2
    assert "no bundled kernel named 'nosuch'" in proc.stderr and "broadcast_add" in proc.stderr


def test_listing_shows_what_each_kernel_replaces_by_kind() -> None:
    """Modules, functions and methods by their last name; aten ops and code patterns whole (the rms_norm
    pattern was cut at its last dot: "mean(-1, keepdim=True) + eps) * weight"); brackets are text."""
    import io

    from rich.console import Console

    from opscope.render.kernels import listing

    pattern = {"kind": "pattern", "target": "x[..., :n] * torch.rsqrt(x.pow(2).mean(-1) + eps)"}
    doc = {"kernels": [{"name": "k", "dtypes": ["float32"], "backends": ["cpu"], "usable_here": ["cpu"],
                        "replaces": [{"kind": "module", "target": "torch.nn.RMSNorm"},
                                     {"kind": "method", "target": "torch.Tensor.__add__"},
                                     {"kind": "aten", "target": "aten::add.Tensor"}, pattern]}],
           "machine": {"backends": {}, "note": ""}}
    out = io.StringIO()
    listing(doc, Console(file=out, width=400, color_system=None))
    row = out.getvalue().splitlines()[1]
    assert f"RMSNorm, __add__, aten::add.Tensor, {pattern['target']}" in row
