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

While it measures, other processes' CPU use is read from /proc/stat (opscope.noise). Above
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
import os
import platform
import re
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from opscope.errors import OpscopeError
from opscope.hardware import Peaks
from opscope.noise import CpuSampler, window_noise

CACHE_FORMAT = 2  # 2: best-of figures, GEMMs sized by work, only stable results cached
LOCK_NAME = "calibration.lock"
MIB = 1 << 20

# Bandwidth repeats, GEMM repeats, and (quick only) a cap on each stream array. First-touching three 4x-LLC arrays alone can take seconds
# (on this project's 2-vCPU VM, whose "LLC" is the host's 480 MiB L3, 3 x 1.9 GiB took 5-9 s cold), so
# the quick run's arrays are max(512 MiB, 1x LLC): the copy working set is still >= 2x and the triad's
# >= 3x the LLC. The note in the result says so; the full run (`opscope calibrate`) always uses >= 4x LLC
# per array. On the VM, 256 MiB and 1.9 GiB arrays measured the same bandwidth (within 3%).
_QUICK = {"bw_repeats": 3, "gemm_repeats": 3, "max_array_bytes": 512 * (1 << 20)}
_FULL = {"bw_repeats": 7, "gemm_repeats": 7, "max_array_bytes": None}
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
    last-level cache that sized them; noise: opscope.noise.assess() of other processes' CPU use while it
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
    def from_json(cls, d: dict[str, Any]) -> CalibrationResult:
        names = {f for f in cls.__dataclass_fields__}
        kwargs = {k: v for k, v in d.items() if k in names}
        result = cls(**kwargs)
        # Validate what the roofline relies on: a corrupt file must not yield nonsense ceilings.
        if not (_positive(result.copy_gbps) and _positive(result.triad_gbps)):
            raise ValueError("bandwidth figures missing or not positive")
        if not isinstance(result.gemm_gflops, dict) or not _positive(result.gemm_gflops.get("float32")):
            raise ValueError("float32 GEMM figure missing or not positive")
        if not all(_positive(v) for v in result.gemm_gflops.values()):
            raise ValueError("a GEMM figure is not positive")
        if not isinstance(result.threads, int) or result.threads < 1:
            raise ValueError("bad thread count")
        return result


def _positive(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 and v == v and v != float("inf")


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
    or None when there is none or the file is unreadable/corrupt/for something else."""
    n, version = _resolve_threads(threads)
    model = cpu_model_name()
    path = cache_file(model, n, version)
    try:
        doc = json.loads(path.read_text())
        if doc.get("format") != CACHE_FORMAT:
            return None
        result = CalibrationResult.from_json(doc["result"])
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
    if (result.cpu_model, result.threads, result.torch_version) != (model, n, version) or not result.stable:
        return None
    return result


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
def calibration_lock(on_wait: Callable[[], None] | None = None) -> Iterator[bool]:
    """Holds an exclusive flock on <cache dir>/calibration.lock and yields whether it had to wait for
    another process. Without fcntl or a writable cache dir it yields False without locking (the worst
    case is the old behaviour: two measurements at once)."""
    try:
        import fcntl
    except ImportError:  # Windows
        yield False
        return
    try:
        directory = cache_dir()
        directory.mkdir(parents=True, exist_ok=True)
        handle = open(directory / LOCK_NAME, "a")  # noqa: SIM115  (closed below, after unlocking)
    except OSError:
        yield False
        return
    with handle:
        waited = False
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait:
                on_wait()
            fcntl.flock(handle, fcntl.LOCK_EX)
            waited = True
        except OSError:  # a filesystem without locks
            yield False
            return
        try:
            yield waited
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


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
    if not refresh:
        cached = load(n)
        if cached is not None:
            return Calibration(cached, "cached", path)
    say = progress or (lambda message: None)
    before = _mtime_ns(path)
    with calibration_lock(lambda: say("opscope: another opscope process is calibrating this CPU; waiting "
                                      "for its result")) as waited:
        if waited or not refresh:
            meanwhile = load(n)
            if meanwhile is not None and (not refresh or (_mtime_ns(path) != before and not
                                                          (meanwhile.quick and not quick))):
                return Calibration(meanwhile, "reused" if waited else "cached", path)
        if quick:
            say(f"opscope: measuring this CPU's memory bandwidth and GEMM FLOP/s ({n} threads, a few "
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


def cached_cpu_peaks() -> Peaks | None:
    """Without importing torch (for `opscope analyze`): this CPU's cached calibration, preferring the
    one measured with the most threads; None when this CPU has never been calibrated."""
    model = cpu_model_name()
    best: CalibrationResult | None = None
    for path in sorted(cache_dir().glob("cpu-calibration-*.json")):
        try:
            doc = json.loads(path.read_text())
            if doc.get("format") != CACHE_FORMAT:
                continue
            result = CalibrationResult.from_json(doc["result"])
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            continue
        if result.cpu_model == model and result.stable and (best is None or result.threads > best.threads):
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
