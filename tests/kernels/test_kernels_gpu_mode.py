"""How the tests decide whether a GPU is present (torch.cuda.is_available(), never a device-node path)
and what follows for Triton: the interpreter without a GPU, compiled Triton with one. The GPU answer
is faked in a child process, so the decision is checked here, on a machine without a GPU."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import REPO, TESTS, set_triton_mode

# conftest and the Triton test module imported in a fresh process whose torch says a GPU is present;
# prints the TRITON_INTERPRET that the session would run with
_AS_ON_A_GPU = f"""
import sys, torch
torch.cuda.is_available = lambda: {{gpu}}
sys.path[:0] = [{str(TESTS)!r}, {str(TESTS / "kernels")!r}]
import conftest, test_kernels_triton
print("TRITON_INTERPRET=" + str(__import__("os").environ.get("TRITON_INTERPRET")))
"""


def _session_mode(gpu: bool) -> str:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", _AS_ON_A_GPU.format(gpu=gpu)], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1]


def test_a_gpu_that_torch_sees_runs_compiled_triton_without_any_device_node() -> None:
    """The H200 machine had no /dev/nvidia0 (nor has this one): the Triton tests still must not run in
    the interpreter there. Neither conftest nor importing test_kernels_triton may turn it on."""
    assert _session_mode(gpu=True) == "TRITON_INTERPRET=None"


def test_no_gpu_runs_the_interpreter() -> None:
    assert _session_mode(gpu=False) == "TRITON_INTERPRET=1"


def test_the_mode_decision() -> None:
    env: dict[str, str] = {}
    set_triton_mode(env, gpu=True)
    assert env == {}
    set_triton_mode(env, gpu=False)
    assert env == {"TRITON_INTERPRET": "1"}
    preset = {"TRITON_INTERPRET": "0"}
    set_triton_mode(preset, gpu=False)
    assert preset == {"TRITON_INTERPRET": "0"}  # what the caller set wins
