"""The Nsight command lines opscope runs, the NVTX range names its passes emit, and one-line, actionable
messages for the tools' known failures. Torch-free: the CLI checks all of this before any model runs.

The commands are prefixes: the supervised worker's own `python -c BOOT SPEC` (opscope.target.supervise) is
appended, so nsys and ncu launch exactly the process opscope would have started itself, under the same
supervision (control channel, private TMPDIR, signals, nothing half-written).
"""

from __future__ import annotations

import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from opscope.capture.options import STEP_RANGE
from opscope.errors import NsightError
from opscope.trace.kernel_names import demangle

NSYS_TRACE = "cuda,nvtx,osrt,cublas,cudnn"
# What ncu measures per kernel: time, DRAM traffic, the SASS instruction counts the FLOPs come from (the
# counts Nsight Compute's own roofline uses: 2 per FMA, 1 per add or multiply, thread level, predicated
# on), tensor-pipe instructions and the speed-of-light percentages of DRAM and SM.
NCU_METRICS: tuple[str, ...] = (
    "gpu__time_duration.sum",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "sm__sass_thread_inst_executed_op_ffma_pred_on.sum",
    "sm__sass_thread_inst_executed_op_fadd_pred_on.sum",
    "sm__sass_thread_inst_executed_op_fmul_pred_on.sum",
    "sm__sass_thread_inst_executed_op_hfma_pred_on.sum",
    "sm__sass_thread_inst_executed_op_hadd_pred_on.sum",
    "sm__sass_thread_inst_executed_op_hmul_pred_on.sum",
    "sm__sass_thread_inst_executed_op_dfma_pred_on.sum",
    "sm__sass_thread_inst_executed_op_dadd_pred_on.sum",
    "sm__sass_thread_inst_executed_op_dmul_pred_on.sum",
    "sm__inst_executed_pipe_tensor.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
)

WHERE = {
    "nsys": "Nsight Systems ships with the CUDA Toolkit (its bin/ folder, e.g. /usr/local/cuda/bin) and as a "
            "download from https://developer.nvidia.com/nsight-systems",
    "ncu": "Nsight Compute ships with the CUDA Toolkit (its bin/ folder, e.g. /usr/local/cuda/bin) and as a "
           "download from https://developer.nvidia.com/nsight-compute",
}
# Where an installed tool often is when it is not on PATH (named in the message, never run from there).
_INSTALL_GLOBS = {
    "nsys": ("{cuda}/bin/nsys", "/usr/local/cuda*/bin/nsys", "/opt/nvidia/nsight-systems/*/bin/nsys"),
    "ncu": ("{cuda}/bin/ncu", "/usr/local/cuda*/bin/ncu", "/opt/nvidia/nsight-compute/*/ncu"),
}

# The registered-string rule of nsys' NVTX capture range (see docs/guide/nsight.md): with
# --capture-range=nvtx, nsys only matches registered NVTX strings unless this is 0.
NSYS_REGISTER_ONLY = "NSYS_NVTX_PROFILER_REGISTER_ONLY"


def installed_elsewhere(tool: str) -> str | None:
    """An installed copy of `tool` outside PATH (to name in the message), or None."""
    cuda = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    for pattern in _INSTALL_GLOBS[tool]:
        for path in sorted(glob.glob(pattern.format(cuda=cuda))):
            if os.access(path, os.X_OK):
                return path
    return None


# torch's own answer, asked in a child process: the CLI stays torch-free until a model runs, and the
# answer is the one the measured pass will get (a device-node path is not: an H200 machine ran CUDA
# without /dev/nvidia0).
_TORCH_SEES_CUDA = "import torch; print(int(torch.cuda.is_available() and torch.version.cuda is not None))"


def nvidia_gpu_missing() -> str | None:
    """Why this machine cannot run a CUDA kernel (None when torch sees a CUDA GPU). Decided as torch
    decides, `torch.cuda.is_available()` (of a CUDA build), in a child process of this Python."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1", "none", "NoDevFiles"):
        return f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU"
    try:
        proc = subprocess.run([sys.executable, "-c", _TORCH_SEES_CUDA], capture_output=True, text=True,
                              timeout=300)
    except (OSError, subprocess.TimeoutExpired):
        return None  # no answer: the measured pass finds out
    if proc.returncode != 0:
        return None
    if proc.stdout.strip().endswith("1"):
        return None
    return "this machine has no NVIDIA GPU that torch can use (torch.cuda.is_available() is False)"


def require_tools(nsys: bool, ncu: bool) -> dict[str, str]:
    """{tool: path} of the requested tools, or one NsightError line naming everything that is missing
    (the GPU, each tool and where it comes from)."""
    wanted = [t for t, on in (("nsys", nsys), ("ncu", ncu)) if on]
    problems = []
    gpu = nvidia_gpu_missing()
    if gpu:
        problems.append(gpu)
    paths = {}
    for tool in wanted:
        path = shutil.which(tool)
        if path:
            paths[tool] = path
            continue
        other = installed_elsewhere(tool)
        found = f"; there is one at {other}: add its folder to PATH" if other else ""
        problems.append(f"`{tool}` is not on PATH ({WHERE[tool]}{found})")
    if problems:
        flags = " and ".join(f"--{t}" for t in wanted)
        raise NsightError(f"{flags} need{'s' if len(wanted) == 1 else ''} an NVIDIA GPU and "
                          f"{' and '.join(f'`{t}`' for t in wanted)}: {'; '.join(problems)}. Nothing was run.")
    return paths


def tool_for_file(tool: str, path: Path, export_hint: str) -> str:
    """The path of `tool` to convert `path`, or one NsightError line saying how to convert it elsewhere."""
    found = shutil.which(tool)
    if found:
        return found
    other = installed_elsewhere(tool)
    hint = f"there is one at {other}: add its folder to PATH" if other else WHERE[tool]
    raise NsightError(f"{path} is an {'Nsight Systems' if tool == 'nsys' else 'Nsight Compute'} report; "
                      f"reading it needs `{tool}`, which is not on PATH ({hint}). Or convert it where {tool} "
                      f"is installed ({export_hint}) and pass the result.")


# --- nsys ---------------------------------------------------------------------------------------

# opscope owns the report's name and location; these options would move it.
_NSYS_OWNED = {"-o", "--output", "-f", "--force-overwrite"}
_NSYS_ALIASES = {"-t": "--trace", "-c": "--capture-range"}


@dataclass
class NsysCommand:
    prefix: list[str]  # nsys ... ; the worker's `python -c BOOT SPEC` follows
    env: dict[str, str] = field(default_factory=dict)  # set for the nsys process (and so the model's)
    notes: list[str] = field(default_factory=list)
    nvtx_capture: bool = False  # the user chose --capture-range=nvtx


def split_tool_args(text: str | None, flag: str) -> list[str]:
    """--nsys-args as a list of arguments (shell-like quoting), one NsightError line if it cannot be split."""
    if not text:
        return []
    try:
        return shlex.split(text)
    except ValueError as exc:
        raise NsightError(f"{flag} {text!r} cannot be split into arguments: {exc}") from exc


def _option_name(arg: str) -> str:
    name = arg.split("=", 1)[0]
    return _NSYS_ALIASES.get(name, name)


def nsys_profile_command(nsys: str, output_base: Path, extra: Sequence[str] = (),
                         environ: Mapping[str, str] | None = None) -> NsysCommand:
    """`nsys profile -t cuda,nvtx,osrt,cublas,cudnn --capture-range=cudaProfilerApi
    --capture-range-end=stop -o OUTPUT -f true [EXTRA]`. The measured pass calls
    torch.cuda.profiler.start()/stop() around its steps, so only they are captured. An EXTRA option that
    opscope also sets (-t/--trace, -c/--capture-range, --capture-range-end) replaces opscope's; -o and -f
    are opscope's own (it reads the report from there) and refused."""
    env: Mapping[str, str] = os.environ if environ is None else environ
    extra = list(extra)
    names = {_option_name(a) for a in extra if a.startswith("-")}
    owned = sorted(n for n in names if n in _NSYS_OWNED or _NSYS_ALIASES.get(n) in _NSYS_OWNED)
    if owned:
        raise NsightError(f"--nsys-args may not set {', '.join(owned)}: opscope writes the report into the run "
                          "directory itself (nsys.nsys-rep)")
    defaults = [("--trace", ["-t", NSYS_TRACE]), ("--capture-range", ["--capture-range=cudaProfilerApi"]),
                ("--capture-range-end", ["--capture-range-end=stop"])]
    prefix = [nsys, "profile"]
    for name, args in defaults:
        if name not in names:
            prefix += args
    prefix += ["-o", str(output_base), "-f", "true", *extra]
    cmd = NsysCommand(prefix=prefix)
    capture = [a.split("=", 1)[1] if "=" in a else (extra[i + 1] if i + 1 < len(extra) else "")
               for i, a in enumerate(extra) if _option_name(a) == "--capture-range"]
    if capture and capture[-1] == "nvtx":
        cmd.nvtx_capture = True
        if NSYS_REGISTER_ONLY not in env:
            cmd.env[NSYS_REGISTER_ONLY] = "0"
            cmd.notes.append(f"--capture-range=nvtx: set {NSYS_REGISTER_ONLY}=0 so that nsys also matches NVTX "
                             "ranges named with plain (non-registered) strings, such as torch.cuda.nvtx.range_push's")
    return cmd


def nsys_export_command(nsys: str, report: Path, sqlite: Path) -> list[str]:
    """`nsys export --type=sqlite --force-overwrite=true --output=SQLITE REPORT`."""
    return [nsys, "export", "--type=sqlite", "--force-overwrite=true", f"--output={sqlite}", str(report)]


# --- ncu ----------------------------------------------------------------------------------------


def ncu_profile_command(ncu: str, *, kernel_bases: Iterable[str], count: int, log_file: Path) -> list[str]:
    """`ncu --target-processes all --nvtx --nvtx-include opscope_step/ -k regex:KERNELS -c COUNT --metrics
    ... --csv --page raw`, plus `--print-units base` (values in bytes, nanoseconds, instructions: nothing
    to rescale) and `--log-file LOG` (the table and ncu's own messages go to a file, apart from the model's
    output). Only the kernels of the selected op rows are replayed (-k), only inside the steps (--nvtx), and
    only one step's worth of them (-c)."""
    if count < 1:
        raise NsightError("no kernels to measure with --ncu: the profile recorded no GPU kernels in its steps")
    return [ncu, "--target-processes", "all", "--nvtx", "--nvtx-include", f"{STEP_RANGE}/",
            "-k", f"regex:{kernel_regex(kernel_bases)}", "-c", str(count),
            "--metrics", ",".join(NCU_METRICS), "--csv", "--page", "raw",
            "--print-units", "base", "--log-file", str(log_file)]


def ncu_import_command(ncu: str, report: Path) -> list[str]:
    """`ncu --import REPORT --csv --page raw --print-units base`: an existing report as the same table."""
    return [ncu, "--import", str(report), "--csv", "--page", "raw", "--print-units", "base"]


_REGEX_SPECIAL = re.compile(r"([\\.^$|?*+()\[\]{}])")


def kernel_regex(bases: Iterable[str]) -> str:
    """An anchored regex matching any of the kernel function names, with or without a namespace (ncu's -k
    matches the function name by default: no parameters, no template arguments)."""
    names = sorted(set(bases))
    if not names:
        raise NsightError("no kernels to measure")
    alternatives = "|".join(_REGEX_SPECIAL.sub(r"\\\1", n) for n in names)
    return f"^(?:.*::)?(?:{alternatives})$"


_LITERAL_CAST = re.compile(r"\((?:unsigned|signed|int|long|short|char|bool|size_t|std::size_t)+\)(?=-?\d|true|false)")
_LAMBDA_ITANIUM = re.compile(r"\{lambda\(([^{}]*?)\)#(\d+)\}")
_LAMBDA_NVIDIA = re.compile(r"\[lambda\(([^\[\]]*?)\)\(instance(\d+)\)\]")
_INT_SUFFIX = re.compile(r"(?<=\d)(?:ull|ul|ll|u|l)(?=[,>])", re.IGNORECASE)


def _without_parameters(name: str) -> str:
    """The name up to its parameter list: the first '(' outside template brackets."""
    s = name.strip().replace("(anonymous namespace)", "anonymous_namespace")
    depth = 0
    for i, c in enumerate(s):
        if c == "<":
            depth += 1
        elif c == ">" and depth > 0 and (i == 0 or s[i - 1] != "-"):
            depth -= 1
        elif c == "(" and depth == 0:
            return s[:i]
    return s


def kernel_key(name: str) -> str:
    """A kernel's qualified name with its template arguments, without return type, parameters or spaces:
    'void at::native::f<4, G<float> >(int)' -> 'at::native::f<4,G<float>>'. Profilers agree on this part
    more often than on the rest (ncu prints 'char *' and '>>' where torch.profiler prints 'char*' and '> >');
    memcpy/memset activities keep their kind ('Memcpy HtoD')."""
    s = demangle(name.strip())  # a raw mangled name (nsys' mangledName): its qualified function name
    if s.startswith(("Memcpy", "Memset")):
        return s.split(" (", 1)[0]
    s = _without_parameters(s).strip()
    depth, start = 0, 0
    for i, c in enumerate(s):  # the return type ends at the last space outside template brackets
        if c == "<":
            depth += 1
        elif c == ">" and depth > 0:
            depth -= 1
        elif c == " " and depth == 0:
            start = i + 1
    key = re.sub(r"\s+", "", s[start:])
    key = _LAMBDA_ITANIUM.sub(r"lambda(\1)#\2", key)  # '{lambda(int)#1}' (c++filt, torch.profiler)
    key = _LAMBDA_NVIDIA.sub(r"lambda(\1)#\2", key)  # '[lambda(int) (instance 1)]' (NVIDIA's demangler)
    key = key.replace("operator()()", "operator()")
    key = _LITERAL_CAST.sub("", key)  # '<(int)4' (nsys, ncu) and '<4' (torch.profiler)
    key = _INT_SUFFIX.sub("", key)  # '3ul' and '3'
    return key or name.strip()


def kernel_base_name(name: str) -> str:
    """The function name of a kernel as a profiler prints it: 'void at::native::f<4, G<float> >(int, ...)'
    -> 'f'; 'ampere_sgemm_128x64_tn' stays; memcpy/memset activities keep their kind ('Memcpy HtoD').
    torch.profiler, nsys and ncu spell template arguments and parameters differently, never the base."""
    key = kernel_key(name)
    if key.startswith(("Memcpy", "Memset")):
        return key
    out, depth = [], 0
    for c in key:
        if c == "<":
            depth += 1
        elif c == ">":
            depth = max(depth - 1, 0)
        elif depth == 0:
            out.append(c)
    return "".join(out).rsplit("::", 1)[-1] or name.strip()


# --- diagnoses ----------------------------------------------------------------------------------

COUNTER_PERMISSION = (
    "ncu cannot read the GPU's performance counters (ERR_NVGPUCTRPERM): the NVIDIA driver lets only "
    "administrators use them. Run opscope as root or with the CAP_SYS_ADMIN capability (CAP_PERFMON from "
    "driver R565 on), or allow every user: put `options nvidia NVreg_RestrictProfilingToAdminUsers=0` in a "
    "file under /etc/modprobe.d/ and reload the driver (reboot); in a container, the host must allow it "
    "(docker --cap-add=SYS_ADMIN). See https://developer.nvidia.com/ERR_NVGPUCTRPERM")


def diagnose(tool: str, log_text: str, filters: str = "") -> str | None:
    """One actionable line for a failure the tool's output shows, or None when none is recognised."""
    if "ERR_NVGPUCTRPERM" in log_text:
        return COUNTER_PERMISSION if tool == "ncu" else COUNTER_PERMISSION.replace("ncu cannot", f"{tool} cannot")
    if re.search(r"no kernels were profiled", log_text, re.IGNORECASE):
        return no_kernels_message(filters)
    return None


def no_kernels_message(filters: str) -> str:
    return (f"ncu profiled no kernels: its filters matched nothing ({filters or 'see the command line'}). The "
            "steps must run inside the NVTX range opscope pushes, and the kernels must be named as in the first "
            "profile; an NVTX-disabled environment (NVTX_DISABLE) or a model whose kernels change between runs "
            "(autotuning, torch.compile recompiling) defeats both")


def last_error_line(log_text: str) -> str:
    """The tool's last line that reads like an error (else its last non-empty line), for a message."""
    lines = [ln.strip() for ln in log_text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.search(r"error|fail|fatal|invalid|not supported|unrecognized", ln, re.IGNORECASE):
            return ln[:300]
    return lines[-1][:300] if lines else "(no output)"
