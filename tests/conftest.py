"""Shared test helpers: real subprocesses for the CLI, tiny model files in tmp dirs, and a private
calibration cache so only the calibration tests ever measure the machine."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"
EXAMPLES = REPO / "examples"
TRACES = REPO / "tests" / "fixtures" / "traces"  # copies of ../shared/traces (MIT, see README there)
PEAKS = ["--peak-bw", "20", "--peak-flops", "100"]
os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # as the CLI does: no kineto line per profiler start/stop
# torch.compile's on-disk cache, private to this test run (its xdist workers share it). Inductor's cache
# key leaves out the CPU code path torch was told to take (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA): an
# AVX-512 run's compiled graphs, reused by an AVX2 run on the same machine, computed wrong results.
_RUN_ID = os.environ.get("PYTEST_XDIST_TESTRUNUID") or str(os.getpid())
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR",
                      os.path.join(tempfile.gettempdir(), f"opscope-tests-inductor-{_RUN_ID}"))


def torch_sees_cuda() -> bool:
    """Whether this machine has a GPU the tests can use, decided as torch decides (never by a device-node
    path: an H200 machine ran CUDA without /dev/nvidia0). Importing torch here is safe: it does not import
    triton, and is_available() creates no CUDA context."""
    import torch

    return bool(torch.cuda.is_available())


def set_triton_mode(environ: dict[str, str] | os._Environ[str], gpu: bool) -> None:
    """Without a GPU, the Triton kernels are tested under Triton's interpreter (tests/kernels/
    test_kernels_triton.py); with one, they run compiled (tests/kernels/test_kernels_cuda.py), so the
    interpreter is left off. A TRITON_INTERPRET the caller set wins."""
    if not gpu:
        environ.setdefault("TRITON_INTERPRET", "1")


# TRITON_INTERPRET must be decided before triton is first imported (triton.language's own helpers are
# decorated then), and other test modules can import triton indirectly, so it is set here, once.
set_triton_mode(os.environ, torch_sees_cuda())


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    # Session-wide, so that module-scoped fixtures (set up before any function-scoped one) never read or
    # write the user's cache either: a calibration saved there changes later runs' CPU ceilings.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OPSCOPE_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "opscope-cache"))
        yield


def run_cli(*args: str, cwd: Path | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.setdefault("COLUMNS", "160")
    return subprocess.run([sys.executable, "-m", "opscope", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def load_fixture(path: Path) -> object:
    """A fixture module loaded from its file under a private name, without touching sys.path or
    sys.modules: tests/fixtures/swap/kernels.py on sys.path shadowed the PyPI package `kernels`, which
    transformers imports when it finds one (the GPT-2/BERT tests then failed in that xdist worker)."""
    spec = importlib.util.spec_from_file_location(f"opscope_test_fixture_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def union_us(spans: list[tuple[float, float]]) -> float:
    """Total length of the union of (start, end) intervals: an independent check of busy times."""
    spans = sorted(spans)
    busy, cur_s, cur_e = 0.0, *spans[0]
    for s, e in spans[1:]:
        if s > cur_e:
            busy, cur_s, cur_e = busy + cur_e - cur_s, s, e
        else:
            cur_e = max(cur_e, e)
    return busy + cur_e - cur_s


def write_model(folder: Path, source: str, name: str = "model.py") -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(source).lstrip())
    return path


def line_of(path: Path, needle: str) -> int:
    """1-based line number of the first line containing `needle`."""
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if needle in line:
            return i
    raise AssertionError(f"{needle!r} not in {path}")


# Rules that drop findings under a small share of the run's op time (MIN_SHARE). Shares of a 2-core
# run swing several-fold when another process competes for the cores, so tests about *where* a rule
# fires turn these gates off; test_findings_rules.test_share_gates_drop_small_findings tests the gates.
SHARE_GATED_RULES = ("implicit_copy", "contiguous_call", "dtype_conversion", "fusion", "low_bandwidth",
                     "strided_reduction")


@contextmanager
def share_gates_off() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        for name in SHARE_GATED_RULES:
            mp.setattr(importlib.import_module(f"opscope.findings.{name}"), "MIN_SHARE", 0.0)
        yield


def assert_clean_error(proc, *needles: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    err = proc.stderr.strip()
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert proc.stdout.strip() == ""
    return lines[0]


# A 2-layer GPT-2 from a config (no download), for the model tests.
GPT2 = """
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    def get_model():
        torch.manual_seed(0)
        cfg = GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=1000, n_positions=128)
        return GPT2LMHeadModel(cfg)

    def get_inputs():
        return {"input_ids": torch.randint(0, 1000, (2, 64))}
"""
