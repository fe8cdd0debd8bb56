"""CPU calibration: measure this machine's ceilings (streaming memory bandwidth, GEMM FLOP/s per dtype)
and cache them, so CPU runs get a roofline without a spec table.

What is measured (all with torch, on `threads` intra-op threads):
  - copy  `a.copy_(b)`                     counted as 2 arrays of traffic (read b, write a);
  - triad `torch.add(b, c, alpha=s, out=a)` counted as 3 arrays (read b, read c, write a);
    STREAM's convention: write-allocate traffic is not counted, so these are what a kernel "sees".
    Each array is at least 4x the last-level cache (summed over the LLC instances this process may run
    on) and at least 256 MiB, capped so the three arrays stay under half the available memory (and, in
    the quick calibration only, at max(512 MiB, 1x LLC); see _QUICK), and backed by transparent huge
    pages where the kernel allows (fewer page faults and TLB misses).
  - GEMM  `torch.mm(a, b, out=c)` on n x n matrices, 2*n^3 FLOPs, for float32, bfloat16, float16 and
    float64. n is set by work, never by elapsed time (a busy machine makes every GEMM slow, and sizing by
    time then stopped at too small a matrix): at least GEMM_MIN_N (2048), doubled until each thread gets
    GEMM_MIN_GFLOP_PER_THREAD of work, and at least 4096 for a dtype the CPU runs on a matrix engine (AMX
    bf16/fp16), whose tiles need bigger matrices to fill. bfloat16/float16 are first probed on a small
    GEMM: a path under a quarter of the float32 rate is emulated and not measured further (an emulated
    fp16 GEMM of 2048^3 can take seconds); a path under half the float32 rate at full size is not kept
    either. Both are reported in `notes`, and ops in that dtype are held against the float32 ceiling the
    machine could reach by switching dtype.

Every figure is the best of its timed repeats (after one untimed warm-up), as STREAM reports: a ceiling
is what the machine can do, and a competing process only ever makes a repeat slower; `samples` keeps
them all. The memory-bandwidth ceiling is max(copy, triad): the best streaming rate this machine sustains
is what a memory-bound op could at best reach, and which of the two patterns is faster varies by CPU.
The float32 GEMM rate doubles as the vector (non-GEMM) ceiling.

While it measures, other processes' CPU use is read from /proc/stat (opscope.machine.noise). Above
noise.NOISY_SHARE of the cores (or when our threads plus theirs oversubscribe the cores) the result is
marked `stable: false` with a note saying why, and it is not cached as this machine's ceilings: the next
run measures again. Concurrent opscope processes calibrate one at a time (a lock file in the cache
dir); one that waited reuses the result the other cached meanwhile.

torch is imported lazily inside functions; importing this module is cheap.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import math
import os
import platform
import re
import stat
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import MISSING, asdict, dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from opscope import units
from opscope.errors import OpscopeError
from opscope.machine.noise import CpuSampler, window_noise
from opscope.machine.peaks import Peaks

CACHE_FORMAT = 2  # 2: best-of figures, GEMMs sized by work, only stable results cached
LOCK_NAME = "calibration.lock"
# A cache file is a few KiB; anything bigger is not one of ours and is not read.
MAX_CACHE_BYTES = 1 << 20
# How long a process waits for another's calibration (a full `opscope calibrate` takes about a minute)
# before it measures without the lock: a process that holds the lock forever must not hang every run.
LOCK_TIMEOUT_S = 300.0
MIB = 1 << 20

# Bandwidth repeats, GEMM repeats, and (quick only) a cap on each stream array. First-touching three 4x-LLC arrays alone can take seconds
# (on this project's 2-vCPU VM, whose "LLC" is the host's 480 MiB L3, 3 x 1.9 GiB took 5-9 s cold), so
# the quick run's arrays are max(512 MiB, 1x LLC): the copy working set is still >= 2x and the triad's
# >= 3x the LLC. The note in the result says so; the full run (`opscope calibrate`) always uses >= 4x LLC
# per array. On the VM, 256 MiB and 1.9 GiB arrays measured the same bandwidth (within 3%).
class _Settings(TypedDict):
    bw_repeats: int
    gemm_repeats: int
    max_array_bytes: int | None


_QUICK: _Settings = {"bw_repeats": 3, "gemm_repeats": 3, "max_array_bytes": 512 * (1 << 20)}
_FULL: _Settings = {"bw_repeats": 7, "gemm_repeats": 7, "max_array_bytes": None}
_GEMM_DTYPES = ("float32", "bfloat16", "float16", "float64")
_REDUCED = ("bfloat16", "float16")
_REDUCED_MIN_RATIO = 0.5  # a reduced-precision GEMM slower than this x float32 is treated as emulated
_PROBE_N = 512  # the first, small GEMM of a reduced dtype: cheap even when emulated
_PROBE_MIN_RATIO = 0.25  # ... and below this x the float32 rate it is emulated: not measured at full size
_PROBE_REPEATS = 3
# GEMM sizes by work. 2048^3 is 17 GFLOP: on the project's 2-core VM a few hundred ms at fp32, and the
# audit saw 2048^3 run 1.28x faster than 1024^3 there. Per thread at least 2 GFLOP (2048 up to 8 threads,
# 4096 up to 68, 8192 beyond): each thread's share of the output must stay large next to packing.
GEMM_MIN_N = 2048
GEMM_MAX_N = 8192
GEMM_MIN_GFLOP_PER_THREAD = 2.0
GEMM_ENGINE_MIN_N = 4096
_MATRIX_ENGINE_FLAGS = {"bfloat16": "amx_bf16", "float16": "amx_fp16"}
_MIN_ARRAY_BYTES = 256 * MIB
_MEMORY_SHARE = 0.5  # the three stream arrays together use at most this share of available memory
_TRIAD_SCALAR = 3.0
_UNSTABLE_SPREAD = 1.3  # max/median of a series above this: the machine was probably busy


@dataclass
class CalibrationResult:
    """One calibration. Rates: copy_gbps/triad_gbps in GB/s (1e9 B/s), gemm_gflops {dtype: GFLOP/s} holding
    only the dtypes usable as ceilings (see notes for the rest); each is the best of its `samples` (every
    timed repeat, same units); gemm_sizes {dtype: n}; array_bytes: bytes per stream array; llc_bytes: the
    last-level cache that sized them; noise: opscope.machine.noise.assess() of other processes' CPU use while it
    measured; stable: quiet and repeats consistent (only stable results are cached). to_json() is what
    `opscope calibrate --json` prints and the cache stores; it adds "memory_bandwidth_gbps" and "peaks"
    (the meta.json "peaks" object)."""

    cpu_model: str
    threads: int
    torch_version: str
    copy_gbps: float
    triad_gbps: float
    gemm_gflops: dict[str, float]
    gemm_sizes: dict[str, int]
    samples: dict[str, list[float]]
    bandwidth_repeats: int
    gemm_repeats: int
    array_bytes: int
    llc_bytes: int | None
    quick: bool
    stable: bool = True
    cpu_capability: str = ""
    cpu_flags: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    noise: dict[str, Any] = field(default_factory=dict)
    created: str = ""
    wall_s: float = 0.0
    figure_rule: str = ("each figure is the best of its timed repeats, taken after one untimed warm-up; "
                        "memory bandwidth = max(copy, triad)")

    @property
    def memory_bandwidth_gbps(self) -> float:
        return max(self.copy_gbps, self.triad_gbps)

    def peaks(self) -> Peaks:
        return Peaks(
            memory_bandwidth_gbps=self.memory_bandwidth_gbps,
            flops_gflops=dict(self.gemm_gflops),
            origin={"memory_bandwidth": "measured", "flops": "measured"},
        )

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["memory_bandwidth_gbps"] = self.memory_bandwidth_gbps
        d["peaks"] = self.peaks().to_json()
        return d

    @classmethod
    def from_json(cls, d: Any) -> CalibrationResult:
        """The result in `d` (a to_json() document, as read: any JSON value), checked by check_result():
        raises CacheRejected (a ValueError) naming what is wrong."""
        check_result(d)
        names = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in names})


# --- validation of what is read back ----------------------------------------------------------------

# Plausible ceilings. A cache file is plain JSON anyone (or a broken disk) can change, and the roofline
# divides by these figures, so a cached figure outside these bounds is not this machine's ceiling.
# Memory bandwidth 0.1-50,000 GB/s: the slowest boards opscope could run on (one narrow DRAM channel)
# stream about 1 GB/s; the fastest memory of any single device today (HBM3e, about 8 TB/s; CPUs with HBM
# or 12 DDR5 channels per socket, 1-2 TB/s) is 6x under the top.
# GEMM 0.01-10,000,000 GFLOP/s: a float64 GEMM on a small in-order core does about 0.1-1 GFLOP/s (an
# emulated reduced dtype slower than half of float32 is never kept); a two-socket server with AMX does a
# few hundred TFLOP/s in bfloat16, 40x under 10 PFLOP/s.
BANDWIDTH_GBPS_RANGE = (0.1, 50_000.0)
GFLOPS_RANGE = (0.01, 10_000_000.0)


class CacheRejected(ValueError):
    """A cached calibration that is not used; the message says why in a few words (one line)."""


class OtherCpu(CacheRejected):
    """A cached calibration of another CPU model (a cache directory shared between machines)."""


def _shown(value: Any) -> str:
    """A value from a file, for a one-line message: numbers as %g, anything else repr()'d (control
    characters escaped) and cut to 40 characters."""
    if _is_number(value):
        return f"{value:g}"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _plausible(label: str, value: Any, bounds: tuple[float, float], unit: str) -> None:
    if not _is_number(value):
        raise CacheRejected(f"{label} {_shown(value)} is not a number")
    low, high = bounds
    if not (low <= value <= high):  # also NaN
        raise CacheRejected(f"{label} {_shown(value)} {unit} is implausible (plausible: {_bound(low)}-"
                            f"{_bound(high)} {unit})")


def _bound(x: float) -> str:
    return f"{x:,.0f}" if x >= 1 else f"{x:g}"


# Fields the cache must hold, by kind; the others have defaults.
_TEXT_FIELDS = ("cpu_model", "torch_version")
_COUNT_FIELDS = ("threads", "bandwidth_repeats", "gemm_repeats", "array_bytes")


def check_result(d: Any) -> None:
    """Raises CacheRejected unless `d` is a complete, well-typed calibration whose ceilings are finite
    and physically plausible (BANDWIDTH_GBPS_RANGE, GFLOPS_RANGE) and each the best of its samples."""
    if not isinstance(d, dict):
        raise CacheRejected(f"the result is {type(d).__name__}, not an object")
    required = [f.name for f in CalibrationResult.__dataclass_fields__.values()
                if f.default is MISSING and f.default_factory is MISSING]
    missing = [k for k in required if k not in d]
    if missing:
        raise CacheRejected(f"it lacks {', '.join(repr(k) for k in missing)}")
    for key in _TEXT_FIELDS + ("cpu_capability", "created", "figure_rule"):
        if key in d and not isinstance(d[key], str):
            raise CacheRejected(f"{key!r} is {_shown(d[key])}, not text")
    for key in _COUNT_FIELDS:
        if not _is_int(d[key]) or d[key] < 1:
            raise CacheRejected(f"{key!r} is {_shown(d[key])}, not a positive whole number")
    if d["llc_bytes"] is not None and not (_is_int(d["llc_bytes"]) and d["llc_bytes"] > 0):
        raise CacheRejected(f"'llc_bytes' is {_shown(d['llc_bytes'])}, not a positive whole number or null")
    for key in ("quick", "stable"):
        if key in d and not isinstance(d[key], bool):
            raise CacheRejected(f"{key!r} is {_shown(d[key])}, not true or false")
    for key in ("cpu_flags", "notes"):
        if key in d and not (isinstance(d[key], list) and all(isinstance(x, str) for x in d[key])):
            raise CacheRejected(f"{key!r} is not a list of text")
    if "noise" in d and not isinstance(d["noise"], dict):
        raise CacheRejected("'noise' is not an object")
    if "wall_s" in d and not (_is_number(d["wall_s"]) and math.isfinite(d["wall_s"])):
        raise CacheRejected(f"'wall_s' is {_shown(d['wall_s'])}, not a number")
    samples, gemm, sizes = d["samples"], d["gemm_gflops"], d["gemm_sizes"]
    if not (isinstance(sizes, dict) and all(isinstance(k, str) and _is_int(v) and v > 0 for k, v in sizes.items())):
        raise CacheRejected("'gemm_sizes' is not an object of positive whole numbers")
    if not isinstance(gemm, dict) or not all(isinstance(k, str) for k in gemm):
        raise CacheRejected("'gemm_gflops' is not an object of dtype names")
    if "float32" not in gemm:
        raise CacheRejected("it has no float32 GEMM figure")
    _plausible("copy bandwidth", d["copy_gbps"], BANDWIDTH_GBPS_RANGE, "GB/s")
    _plausible("triad bandwidth", d["triad_gbps"], BANDWIDTH_GBPS_RANGE, "GB/s")
    for name, rate in gemm.items():
        _plausible(f"{name} GEMM", rate, GFLOPS_RANGE, "GFLOP/s")
    if not (isinstance(samples, dict) and all(
            isinstance(k, str) and isinstance(v, list) and all(_is_number(x) and math.isfinite(x) and x >= 0
                                                               for x in v) for k, v in samples.items())):
        raise CacheRejected("'samples' is not an object of lists of finite, non-negative numbers")
    # Each ceiling is the best of its repeats: one edited apart from its samples is not a measurement.
    figures = {"copy_gbps": d["copy_gbps"], "triad_gbps": d["triad_gbps"],
               **{f"gemm_{name}_gflops": rate for name, rate in gemm.items()}}
    for key, figure in figures.items():
        if samples.get(key) and not math.isclose(figure, max(samples[key]), rel_tol=1e-9):
            raise CacheRejected(f"{key} {figure:g} is not the best of its samples ({max(samples[key]):g})")


def check_cached(doc: Any, cpu_model: str, threads: int | None, torch_version: str | None) -> CalibrationResult:
    """The calibration in a cache document if it can stand as this machine's ceilings: this cache format,
    check_result(), measured on this CPU model (and `threads`, `torch_version` when given), stable.
    Raises CacheRejected saying why not."""
    if not isinstance(doc, dict):
        raise CacheRejected(f"the file holds {type(doc).__name__}, not an object")
    if doc.get("format") != CACHE_FORMAT:
        raise CacheRejected(f"it is in cache format {_shown(doc.get('format'))} (this opscope reads "
                            f"{CACHE_FORMAT})")
    d = doc.get("result")
    if isinstance(d, dict) and isinstance(d.get("cpu_model"), str) and d["cpu_model"] != cpu_model:
        raise OtherCpu(f"it was measured on another CPU ({_shown(d['cpu_model'])}, this one is {_shown(cpu_model)})")
    result = CalibrationResult.from_json(d)
    if threads is not None and result.threads != threads:
        raise CacheRejected(f"it was measured on {units.count(result.threads, 'thread')}, not {threads}")
    if torch_version is not None and result.torch_version != torch_version:
        raise CacheRejected(f"it was measured with torch {_shown(result.torch_version)}, not {torch_version}")
    if not result.stable:
        raise CacheRejected("it is marked unstable (measured on a busy machine)")
    return result


def _read_small_regular_file(path: Path, limit: int) -> bytes:
    """The bytes of `path` if it is a regular file of at most `limit` bytes. The cache dir is not
    trusted: a FIFO there would block a plain open() forever and a link to /dev/zero would be read until
    memory runs out, so it is opened without blocking and checked with fstat before anything is read.
    Raises CacheRejected (not a regular file, too big) or OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise CacheRejected("it is not a regular file")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise CacheRejected(f"it is larger than {limit // 1024} KiB (a calibration is a few KiB)")
    return data


def read_cache_file(path: Path, cpu_model: str, threads: int | None = None,
                    torch_version: str | None = None) -> tuple[CalibrationResult | None, CacheRejected | None]:
    """(result, None) for a usable cache file; (None, None) when there is none; (None, why) otherwise."""
    try:
        text = _read_small_regular_file(path, MAX_CACHE_BYTES).decode()
    except FileNotFoundError:
        return None, None
    except CacheRejected as exc:
        return None, exc
    except (OSError, UnicodeDecodeError) as exc:
        return None, CacheRejected(f"it cannot be read ({getattr(exc, 'strerror', None) or type(exc).__name__})")
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        return None, CacheRejected("it is not valid JSON")
    try:
        return check_cached(doc, cpu_model, threads, torch_version), None
    except CacheRejected as exc:
        return None, exc


# --- machine facts ----------------------------------------------------------------------------------


def cpu_model_name() -> str:
    """The CPU's model string: /proc/cpuinfo "model name" (x86) or similar fields (Arm), else
    platform.processor(), else platform.machine()."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        text = ""
    for field_name in ("model name", "Model", "Hardware", "Processor", "cpu model"):
        m = re.search(rf"^{re.escape(field_name)}\s*:\s*(.+)$", text, re.MULTILINE)
        if m and m.group(1).strip():
            return " ".join(m.group(1).split())
    return platform.processor() or platform.machine() or "unknown CPU"


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return set()
    m = re.search(r"^(?:flags|Features)\s*:\s*(.+)$", text, re.MULTILINE)
    return set(m.group(1).split()) if m else set()


def _parse_size(text: str) -> int | None:
    """"491520K", "32M", "480 MiB", "2 MB" -> bytes."""
    m = re.match(r"^\s*([\d.]+)\s*([KMGT]?)(i?B)?\s*$", text.strip(), re.IGNORECASE)
    if not m:
        return None
    scale = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[m.group(2).upper()]
    return int(float(m.group(1)) * scale)


def llc_bytes() -> int | None:
    """Total last-level cache this process can use: the highest cache level's distinct instances over the
    CPUs in our affinity set, summed (from /sys/devices/system/cpu/cpu*/cache), else lscpu, else None."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = list(range(os.cpu_count() or 1))
    instances: dict[tuple[int, str], int] = {}
    for cpu in cpus:
        base = Path(f"/sys/devices/system/cpu/cpu{cpu}/cache")
        best: tuple[int, str, int] | None = None
        for idx in base.glob("index*"):
            try:
                ctype = (idx / "type").read_text().strip()
                if ctype not in ("Unified", "Data"):
                    continue
                level = int((idx / "level").read_text().strip())
                size = _parse_size((idx / "size").read_text())
                shared = (idx / "shared_cpu_list").read_text().strip()
            except (OSError, ValueError):
                continue
            if size and (best is None or level > best[0]):
                best = (level, shared, size)
        if best is not None:
            instances[(best[0], best[1])] = best[2]
    if instances:
        top = max(level for level, _ in instances)
        return sum(size for (level, _), size in instances.items() if level == top)
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for label in ("L3 cache", "L2 cache"):
        m = re.search(rf"^{label}:\s*([\d.]+\s*[KMGT]?i?B)", out, re.MULTILINE)
        if m:
            return _parse_size(m.group(1))
    return None


def _available_memory_bytes() -> int | None:
    avail = None
    try:
        m = re.search(r"^MemAvailable:\s*(\d+)\s*kB", Path("/proc/meminfo").read_text(), re.MULTILINE)
        if m:
            avail = int(m.group(1)) * 1024
    except OSError:
        pass
    try:  # cgroup v2 limit
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
            room = int(limit) - used
            avail = room if avail is None else min(avail, room)
    except (OSError, ValueError):
        pass
    return avail


# --- measurement ------------------------------------------------------------------------------------


def _stream_array_bytes(llc: int | None, available: int | None, notes: list[str],
                        max_bytes: int | None = None) -> int:
    want = max(4 * (llc or 0), _MIN_ARRAY_BYTES)
    size = want
    if max_bytes is not None and size > max(max_bytes, llc or 0):
        size = max(max_bytes, llc or 0, _MIN_ARRAY_BYTES)
        notes.append(f"quick calibration: stream arrays capped at {size / MIB:,.0f} MiB "
                     f"({size / (llc or size):.1f}x the {(llc or 0) / MIB:,.0f} MiB last-level cache instead of "
                     "4x); `opscope calibrate` measures with the full size")
    if available:
        cap = int(available * _MEMORY_SHARE / 3)
        if cap < size:
            size = max(cap, 64 * MIB)
            notes.append(f"stream arrays capped at {size / MIB:.0f} MiB by available memory "
                         f"(4x LLC would be {want / MIB:.0f} MiB); bandwidth may read high if caches help")
    return size // (2 * MIB) * (2 * MIB)  # whole huge pages


class _Buffer:
    """A float32 tensor over anonymous memory advised for transparent huge pages (falls back to a plain
    torch.empty where mmap/madvise are unavailable)."""

    def __init__(self, torch: Any, nbytes: int) -> None:
        self._map = None
        try:
            import mmap

            self._map = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            if hasattr(mmap, "MADV_HUGEPAGE"):
                with contextlib.suppress(OSError):
                    self._map.madvise(mmap.MADV_HUGEPAGE)
            self.tensor = torch.frombuffer(self._map, dtype=torch.float32)
        except (ImportError, AttributeError, OSError, ValueError, TypeError, RuntimeError):
            self._map = None
            self.tensor = torch.empty(nbytes // 4, dtype=torch.float32)

    def release(self) -> None:
        self.tensor = None
        if self._map is not None:
            with contextlib.suppress(BufferError, ValueError):
                self._map.close()
            self._map = None


def _measure_bandwidth(torch: Any, repeats: int, array_bytes: int) -> tuple[list[float], list[float]]:
    """(copy GB/s per repeat, triad GB/s per repeat)."""
    bufs = [_Buffer(torch, array_bytes) for _ in range(3)]
    try:
        a, b, c = (buf.tensor for buf in bufs)
        # Write every source page first: reading never-written anonymous memory maps the shared zero page
        # and would "stream" from cache.
        b.fill_(1.0)
        c.fill_(2.0)
        a.copy_(b)  # warm-up, also faults in `a`
        torch.add(b, c, alpha=_TRIAD_SCALAR, out=a)
        nbytes = a.numel() * a.element_size()
        copy, triad = [], []
        for _ in range(repeats):  # interleaved, so a noisy moment hurts both alike
            t0 = time.perf_counter()
            a.copy_(b)
            t1 = time.perf_counter()
            torch.add(b, c, alpha=_TRIAD_SCALAR, out=a)
            t2 = time.perf_counter()
            copy.append(2 * nbytes / (t1 - t0) / 1e9)
            triad.append(3 * nbytes / (t2 - t1) / 1e9)
        return copy, triad
    finally:
        for buf in bufs:
            buf.release()


def _gemm(torch: Any, dtype: Any, n: int) -> tuple[Any, Any, Any]:
    x = torch.empty(n, n, dtype=dtype).uniform_(-1.0, 1.0)
    y = torch.empty(n, n, dtype=dtype).uniform_(-1.0, 1.0)
    return x, y, torch.empty(n, n, dtype=dtype)


def gemm_size(dtype_name: str, threads: int, flags: set[str]) -> int:
    """The GEMM n for a dtype, from the work alone: >= GEMM_MIN_N, doubled (up to GEMM_MAX_N) until each
    of `threads` gets GEMM_MIN_GFLOP_PER_THREAD, and >= GEMM_ENGINE_MIN_N on a matrix engine."""
    n = GEMM_MIN_N
    while 2.0 * n**3 / max(threads, 1) < GEMM_MIN_GFLOP_PER_THREAD * 1e9 and n < GEMM_MAX_N:
        n *= 2
    if _MATRIX_ENGINE_FLAGS.get(dtype_name) in flags:
        n = max(n, GEMM_ENGINE_MIN_N)
    return n


def _time_gemm(torch: Any, x: Any, y: Any, out: Any) -> float:
    t0 = time.perf_counter()
    torch.mm(x, y, out=out)
    return time.perf_counter() - t0


def _measure_gemm(torch: Any, dtype_name: str, n: int, repeats: int,
                  fp32_rate: float | None) -> tuple[list[float], int, str | None]:
    """(GFLOP/s per repeat, n measured, reason it was abandoned or None). A reduced dtype is probed on a
    _PROBE_N GEMM first; an emulated path stops there."""
    dtype = getattr(torch, dtype_name)
    if dtype_name in _REDUCED and fp32_rate:
        x, y, out = _gemm(torch, dtype, _PROBE_N)
        torch.mm(x, y, out=out)  # warm-up
        # best of a few: one 512^3 GEMM on a fast path is under a millisecond, less than a time slice
        rate = max(2.0 * _PROBE_N**3 / _time_gemm(torch, x, y, out) / 1e9 for _ in range(_PROBE_REPEATS))
        if rate < _PROBE_MIN_RATIO * fp32_rate:
            return [rate], _PROBE_N, _emulated(dtype_name, rate, fp32_rate, _PROBE_N)
    x, y, out = _gemm(torch, dtype, n)
    torch.mm(x, y, out=out)  # warm-up (kernel selection, JIT, first touch)
    rates = [2.0 * n**3 / _time_gemm(torch, x, y, out) / 1e9 for _ in range(repeats)]
    best = max(rates)
    if dtype_name in _REDUCED and fp32_rate and best < _REDUCED_MIN_RATIO * fp32_rate:
        return rates, n, _emulated(dtype_name, best, fp32_rate, n)
    return rates, n, None


def _emulated(dtype_name: str, rate: float, fp32_rate: float, n: int) -> str:
    return (f"{dtype_name} GEMM runs at {rate:,.0f} GFLOP/s ({n}^3), {rate / fp32_rate:.2f}x float32 (no fast "
            f"native path): not used as a ceiling; {dtype_name} ops are held against the float32 ceiling")


def measure_cpu(threads: int | None = None, quick: bool = False,
                sampler: CpuSampler | None = None) -> CalibrationResult:
    """Measures this CPU's ceilings on `threads` intra-op threads (default: torch's current setting,
    restored afterwards) and other processes' CPU use meanwhile (`sampler`, default /proc/stat).
    quick=True: 3 bandwidth repeats on smaller arrays, 3 GEMM repeats (a few seconds); the full run: 7
    repeats on >= 4x LLC arrays (~10-20 s)."""
    import torch

    if threads is not None and threads < 1:
        raise OpscopeError(f"--threads must be at least 1, got {threads}")
    settings = _QUICK if quick else _FULL
    sampler = sampler or CpuSampler()
    start = time.perf_counter()
    previous = torch.get_num_threads()
    notes: list[str] = []
    flags = _cpu_flags()
    try:
        if threads is not None:
            torch.set_num_threads(threads)
        n_threads = torch.get_num_threads()
        before = sampler.sample()
        llc = llc_bytes()
        array_bytes = _stream_array_bytes(llc, _available_memory_bytes(), notes, settings["max_array_bytes"])
        copy, triad = _measure_bandwidth(torch, settings["bw_repeats"], array_bytes)

        samples: dict[str, list[float]] = {"copy_gbps": copy, "triad_gbps": triad}
        gemm: dict[str, float] = {}
        sizes: dict[str, int] = {}
        for name in _GEMM_DTYPES:
            try:
                rates, n, skipped = _measure_gemm(torch, name, gemm_size(name, n_threads, flags),
                                                  settings["gemm_repeats"], gemm.get("float32"))
            except (RuntimeError, TypeError, AttributeError) as exc:
                if name == "float32":
                    raise
                notes.append(f"{name} GEMM unavailable ({str(exc).splitlines()[0][:80]}): not measured")
                continue
            samples[f"gemm_{name}_gflops"] = rates
            sizes[name] = n
            if skipped:
                notes.append(skipped)
            else:
                gemm[name] = max(rates)
        after = sampler.sample()
    finally:
        torch.set_num_threads(previous)

    noise = window_noise(sampler, before, after, n_threads, during="while it measured")
    if noise["verdict"] == "noisy":
        notes.append(f"unstable: {noise['reason']}, so these ceilings may read low; they are not cached; rerun "
                     "`opscope calibrate` on an idle machine")
    spread = {key: max(vals) / statistics.median(vals) for key, vals in samples.items()
              if len(vals) >= 3 and max(vals) > _UNSTABLE_SPREAD * statistics.median(vals)}
    if spread:
        notes.append(f"unstable: {', '.join(sorted(spread))} varied up to {max(spread.values()):.1f}x between "
                     "repeats (the machine was probably busy), so these ceilings may read low; they are not "
                     "cached; rerun `opscope calibrate` on an idle machine")
    if noise["verdict"] == "unknown":
        notes.append(f"{noise['reason']}; stability judged from the repeats alone")
    return CalibrationResult(
        cpu_model=cpu_model_name(),
        threads=n_threads,
        torch_version=str(torch.__version__),
        copy_gbps=max(copy),
        triad_gbps=max(triad),
        gemm_gflops=gemm,
        gemm_sizes=sizes,
        samples=samples,
        bandwidth_repeats=settings["bw_repeats"],
        gemm_repeats=settings["gemm_repeats"],
        array_bytes=array_bytes,
        llc_bytes=llc,
        quick=quick,
        stable=noise["verdict"] != "noisy" and not spread,
        cpu_capability=_cpu_capability(torch),
        cpu_flags=sorted(f for f in flags if f in ("avx2", "avx512f", "avx512_bf16", "avx512_fp16",
                                                   "amx_bf16", "amx_fp16", "amx_tile", "bf16", "asimd",
                                                   "sve", "sve2", "fphp")),
        notes=notes,
        noise=noise,
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        wall_s=round(time.perf_counter() - start, 3),
    )


def _cpu_capability(torch: Any) -> str:
    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except (AttributeError, RuntimeError):
        return ""


# --- cache ------------------------------------------------------------------------------------------


def cache_dir() -> Path:
    """$OPSCOPE_CACHE_DIR if set, else the platform's user cache dir for "opscope"."""
    env = os.environ.get("OPSCOPE_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("opscope"))


def cache_key(cpu_model: str, threads: int, torch_version: str) -> str:
    blob = json.dumps([CACHE_FORMAT, cpu_model, int(threads), torch_version])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def cache_file(cpu_model: str, threads: int, torch_version: str) -> Path:
    """Where the calibration for (CPU model, threads, torch version) is cached."""
    return cache_dir() / f"cpu-calibration-{cache_key(cpu_model, threads, torch_version)}.json"


def _resolve_threads(threads: int | None) -> tuple[int, str]:
    import torch

    if threads is not None and threads < 1:
        raise OpscopeError(f"--threads must be at least 1, got {threads}")
    return (threads if threads is not None else torch.get_num_threads()), str(torch.__version__)


def load(threads: int | None = None) -> CalibrationResult | None:
    """The cached calibration for this CPU, thread count (default: torch's current) and torch version,
    or None when there is none or it cannot stand as this machine's ceilings (read_cache_file)."""
    return _load(threads)[0]


def _load(threads: int | None) -> tuple[CalibrationResult | None, str | None]:
    """load()'s result and, for a cache file that was rejected, why (one line naming the file)."""
    n, version = _resolve_threads(threads)
    model = cpu_model_name()
    path = cache_file(model, n, version)
    result, why = read_cache_file(path, model, n, version)
    return result, (f"{why}; re-measuring ({path})" if why else None)


def save(result: CalibrationResult) -> Path:
    """Writes `result` to its cache file (atomically) and returns the path. Raises OSError if the cache
    directory cannot be written."""
    path = cache_file(result.cpu_model, result.threads, result.torch_version)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"format": CACHE_FORMAT, "result": result.to_json()}
    fd, tmp = tempfile.mkstemp(prefix=".calibration-", suffix=".json", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


@dataclass
class Calibration:
    """A calibration obtained for a run: `how` is "cached" (read from the cache), "reused" (another
    opscope process measured it while this one waited) or "measured" (here, now); `path` is the cache
    file it came from or was saved to, None when it was not cached (unstable, or the cache unwritable)."""

    result: CalibrationResult
    how: str
    path: Path | None


@contextlib.contextmanager
def calibration_lock(on_wait: Callable[[], None] | None = None, *, timeout_s: float = LOCK_TIMEOUT_S,
                     note: Callable[[str], None] | None = None) -> Iterator[bool]:
    """Holds an exclusive flock on <cache dir>/calibration.lock and yields whether it had to wait for
    another process. Without fcntl, a writable cache dir or a regular lock file (a FIFO or device there
    is never opened for blocking I/O) it yields False without locking (the worst case is the old
    behaviour: two measurements at once). After `timeout_s` of waiting it gives up, tells `note`, and
    yields True without the lock."""
    try:
        import fcntl
    except ImportError:  # Windows
        yield False
        return
    try:
        directory = cache_dir()
        directory.mkdir(parents=True, exist_ok=True)
        # O_NONBLOCK: opening a FIFO for writing fails at once (ENXIO) instead of waiting for a reader.
        fd = os.open(directory / LOCK_NAME, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK
                     | getattr(os, "O_CLOEXEC", 0), 0o644)
    except OSError:
        yield False
        return
    with os.fdopen(fd, "ab") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            yield False
            return
        waited = False
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait:
                on_wait()
            waited = True
            if not _flock_within(fcntl, handle, timeout_s):
                if note:
                    note(f"opscope: gave up waiting for the other calibration after {timeout_s:g} s "
                         f"({directory / LOCK_NAME} is still locked); measuring without it")
                yield True
                return
        except OSError:  # a filesystem without locks
            yield False
            return
        try:
            yield waited
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _flock_within(fcntl: Any, handle: Any, timeout_s: float) -> bool:
    """Takes the exclusive flock, polling, within `timeout_s`; False if it could not."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)


def _mtime_ns(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


def obtain(threads: int | None = None, *, quick: bool = True, refresh: bool = False,
           progress: Callable[[str], None] | None = None) -> Calibration:
    """This CPU's calibration for `threads` (default: torch's current). Unless `refresh`, a cached one
    is used. Otherwise it measures (quick or full) under calibration_lock(); a process that waited for
    the lock first re-reads the cache and reuses a result written meanwhile (for a full calibration, only
    a full one). Only stable results are saved; an unstable one is returned for this run only (a quick
    one with its notes sent to `progress`; a full one's notes are in its report) and the next run
    measures again."""
    n, version = _resolve_threads(threads)
    path = cache_file(cpu_model_name(), n, version)
    say = progress or (lambda message: None)
    if not refresh:
        cached, why = _load(n)
        if cached is not None:
            return Calibration(cached, "cached", path)
        if why:
            say(f"opscope: calibration cache ignored: {why}")
    before = _mtime_ns(path)
    with calibration_lock(lambda: say("opscope: another opscope process is calibrating this CPU; waiting "
                                      "for its result"), note=say) as waited:
        if waited or not refresh:
            meanwhile = load(n)
            if meanwhile is not None and (not refresh or (_mtime_ns(path) != before and not
                                                          (meanwhile.quick and not quick))):
                return Calibration(meanwhile, "reused" if waited else "cached", path)
        if quick:
            say(f"opscope: measuring this CPU's memory bandwidth and GEMM FLOP/s ({units.count(n, 'thread')}, a few "
                f"seconds, once; cached in {path}; `opscope calibrate` runs a longer measurement)")
        result = measure_cpu(n, quick=quick)
        if not result.stable:
            if quick:  # inside `profile` nobody sees a report: say it here
                for note in result.notes:
                    if note.startswith("unstable"):
                        say("opscope: calibration " + note)
            return Calibration(result, "measured", None)
        try:
            return Calibration(result, "measured", save(result))
        except OSError as exc:
            say(f"opscope: could not cache the calibration ({exc}); it will be measured again next time")
            return Calibration(result, "measured", None)


def cpu_peaks(threads: int | None = None, *, refresh: bool = False,
              progress: Callable[[str], None] | None = None) -> tuple[Peaks, bool]:
    """This CPU's ceilings and whether they came from the cache (or another process's measurement).
    The first time for a (CPU model, threads, torch version) a quick calibration (a few seconds) runs
    and, when stable, is cached; `opscope calibrate` replaces it with a full one. `progress` receives
    one-line messages (e.g. print to stderr)."""
    calibration = obtain(threads, quick=True, refresh=refresh, progress=progress)
    return calibration.result.peaks(), calibration.how != "measured"


def cached_cpu_peaks(warn: Callable[[str], None] | None = None) -> Peaks | None:
    """Without importing torch (for `opscope analyze`): this CPU's cached calibration, preferring the
    one measured with the most threads; None when this CPU has never been calibrated. Files of other
    CPUs (a cache dir shared between machines) are passed over; a file of this CPU that cannot stand as
    its ceilings is passed over too, and `warn` is told why."""
    model = cpu_model_name()
    best: CalibrationResult | None = None
    for path in sorted(cache_dir().glob("cpu-calibration-*.json")):
        result, why = read_cache_file(path, model)
        if why and warn and not isinstance(why, OtherCpu):
            warn(f"opscope: calibration cache ignored: {why} ({path})")
        if result is not None and (best is None or result.threads > best.threads):
            best = result
    return best.peaks() if best is not None else None


# --- report -----------------------------------------------------------------------------------------


def format_report(result: CalibrationResult) -> str:
    """Plain-text report for `opscope calibrate` (no rich markup, safe for print or rich)."""
    def spread(key: str) -> str:
        vals = result.samples.get(key) or []
        return f"{min(vals):,.1f}-{max(vals):,.1f}" if vals else ""

    kind = "quick" if result.quick else "full"
    mib = f"{result.array_bytes / MIB:,.0f} MiB"

    def row(label: str, value: float, unit: str, key: str, how: str) -> str:
        return f"  {label:<20}{value:>10,.1f} {unit:<8}{spread(key):<22}{how}"

    lines = [
        f"CPU calibration ({kind}, {result.wall_s:.1f} s): {result.cpu_model}",
        f"  threads {result.threads}, torch {result.torch_version}"
        + (f", kernels {result.cpu_capability}" if result.cpu_capability else ""),
        "",
        f"  {'ceiling':<20}{'best':>10} {'':<8}{'range over repeats':<22}how",
        row("memory bandwidth", result.memory_bandwidth_gbps, "GB/s", "", "max(copy, triad)"),
        row("  copy", result.copy_gbps, "GB/s", "copy_gbps", f"dst.copy_(src), 2 x {mib} per pass"),
        row("  triad", result.triad_gbps, "GB/s", "triad_gbps", f"a = b + s*c, 3 x {mib} per pass"),
    ]
    for name in _GEMM_DTYPES:
        n = result.gemm_sizes.get(name)
        if name in result.gemm_gflops:
            lines.append(row(f"GEMM {name}", result.gemm_gflops[name], "GFLOP/s", f"gemm_{name}_gflops",
                             f"torch.mm {n}x{n}x{n}"))
    llc = f"{result.llc_bytes / MIB:,.0f} MiB" if result.llc_bytes else "unknown"
    lines += [
        "",
        f"  last-level cache {llc}; {result.bandwidth_repeats} bandwidth repeats, {result.gemm_repeats} GEMM "
        "repeats",
        f"  {result.figure_rule}",
    ]
    if result.noise.get("verdict") == "quiet":  # a noisy one has its "unstable" note below
        lines.append(f"  machine quiet: {result.noise['reason']}")
    lines += [f"  note: {note}" for note in result.notes]
    where = cache_file(result.cpu_model, result.threads, result.torch_version)
    lines.append(f"  cache: {where}" if result.stable else "  not cached (unstable): the next run measures again")
    return "\n".join(lines)
