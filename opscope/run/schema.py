"""The run directory's format, as types: meta.json, summary.json, findings.json and swap.json as msgspec
Structs, the CSV files' columns, and the format version. This module is the record of the format (the
docs' JSON Schema and column tables are generated from it: `python -m opscope.run.schema DIR`), and
opscope.run.read validates every file it reads against it.

Compatibility: a reader accepts keys it does not know (a newer opscope of the same format version may add
some) and rejects a file of a newer format version. Keys are optional unless a renderer cannot do
without them; a number is finite (NaN and infinity are written as null).
"""

import re
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

FORMAT_VERSION = 1

_MAX = 1.7976931348623157e308
# A finite number (an int is accepted where a float is expected; true/false are not numbers).
Number = Annotated[float, Meta(ge=-_MAX, le=_MAX)]
Share = Annotated[float, Meta(ge=0.0, le=1.0)]
Count = Annotated[int, Meta(ge=0)]
Positive = Annotated[float, Meta(gt=0.0, le=_MAX)]
# Times in µs: not negative, up to about 31 years (a step of 0, one instantaneous event, compares as unknown).
Duration = Annotated[float, Meta(ge=0.0, le=1e15)]
Steps = Annotated[int, Meta(ge=0, le=1_000_000_000)]
Seconds = Annotated[float, Meta(ge=0.0, le=1e9)]  # compile times: not negative, up to about 31 years


def _doc(text: str) -> Meta:
    return Meta(description=text)


# --- fixed texts the rows of ops.csv carry --------------------------------------------------------

UNATTRIBUTED = "(unattributed kernels)"
GRAPH_KERNEL_NOTE = ("replayed from a CUDA/HIP graph: the trace records no shapes for it (analyze with --capture "
                     "to map it to the op that launched it during capture)")
LOOSE_KERNEL_NOTE = "launched outside any op: the trace records no shapes for it"
GPU_ONLY_NOTE = "GPU-only trace: no op or shapes recorded"
BACKLOG = "(kernels launched before the trace)"
BACKLOG_NOTE = ("launched before the trace started (the GPU ran behind the CPU; no op of the trace launched "
                "them): only their time inside the profiled steps counts")


# --- meta.json ------------------------------------------------------------------------------------


class Device(Struct, kw_only=True):
    """The device the run measured."""

    type: Annotated[str, _doc("cpu, cuda or rocm")] = ""
    name: Annotated[str, _doc("the CPU model or GPU name")] = ""
    name_source: Annotated[str | None, _doc(
        "analyze of a GPU trace: where the name came from (deviceProperties, kernel names, none)")] = None


class Peaks(Struct, kw_only=True):
    """The ceilings the roofline compares against."""

    memory_bandwidth_gbps: Annotated[Positive | None, _doc("GB/s (1e9 bytes/s); null when unknown")] = None
    flops_gflops: Annotated[dict[str, Positive], _doc(
        "GFLOP/s per opscope dtype name (float32, tfloat32, bfloat16, float16, float8, float64, "
        "float64_vector, int8 in GOPS)")] = {}
    origin: Annotated[dict[str, str], _doc(
        "memory_bandwidth and flops: measured, spec-table, user or unknown")] = {}


class Capture(Struct, kw_only=True):
    """analyze --capture: how the capture trace's launches were matched to the replayed graphs."""

    trace: str | None = None
    graph_launches: Count | None = None
    merged_launches: Count | None = None
    kernels: Count | None = None
    captured_graphs: Count | None = None
    matched_by: Annotated[str | None, _doc("kernel name and order, or order")] = None


class Script(Struct, kw_only=True):
    """Script mode (`opscope profile train.py -- ARGS`)."""

    args: list[str] = []
    steps_from: Annotated[str | None, _doc("optimizer step, or the --step-fn")] = None
    skip_steps: Count | None = None
    stopped_after_window: bool | None = None
    source_lines: Annotated[str | None, _doc("next step or none")] = None


class JobMeta(Struct, kw_only=True):
    """A merged run of a multi-process job."""

    world_size: Count | None = None
    ranks: list[int] = []
    backend: str | None = None
    trace_rank: Annotated[int | None, _doc("the rank whose trace is the run's trace.json.gz")] = None


class ThreadsChosen(Struct, kw_only=True):
    """A CPU profile's torch thread count and why (opscope.machine.threads)."""

    threads: Count | None = None
    default: Annotated[Count | None, _doc("torch's own default")] = None
    cores: Count | None = None
    set: Annotated[str | None, _doc("default, --threads, or 'fewer, for other processes'")] = None
    other_cores: Annotated[Number | None, _doc("cores other processes used before the timed steps")] = None
    calibration_threads: Annotated[Count | None, _doc(
        "set when the ceilings are the cached calibration of this thread count, scaled (a busy machine)")] = None


class CompileMeta(Struct, kw_only=True):
    """A profile of a torch.compile'd model (opscope.capture.compiled)."""

    mode: Annotated[str | None, _doc(
        "torch.compile's mode (default, reduce-overhead, max-autotune) with --compile; null when the model "
        "compiled itself")] = None
    by: Annotated[str | None, _doc(
        "opscope (--compile), or model (get_model() returned a compiled model, or its code compiles)")] = None
    first_step_s: Annotated[Number | None, _doc(
        "the first warm-up step's wall time in seconds, compilation included (never step time)")] = None


class RunMeta(Struct, kw_only=True):
    """meta.json: what was measured, where, and against which ceilings."""

    format_version: Annotated[int, _doc("the run directory format's version")] = FORMAT_VERSION
    opscope_version: str | None = None
    created: Annotated[str | None, _doc("local time, %Y-%m-%dT%H:%M:%S%z")] = None
    source: Annotated[str, _doc("profile or trace")] = ""
    target: Annotated[str, _doc("the model file, script or trace")] = ""
    torch_version: Annotated[str | None, _doc("for traces: as recorded in the trace, else null")] = None
    device: Device = msgspec.field(default_factory=Device)
    dtype: Annotated[str | None, _doc("the model's dtype; for traces the most common floating dtype")] = None
    mode: Annotated[str | None, _doc("inference, train or unknown")] = None
    steps: Count | None = None
    threads: Count | None = None
    peaks: Peaks = msgspec.field(default_factory=Peaks)
    calibration: Annotated[dict[str, bool] | None, _doc(
        "CPU runs with measured ceilings: stable, cached, quick, and scaled (from another thread count)")] = None
    threads_chosen: ThreadsChosen | None = None
    capture: Capture | None = None
    script: Script | None = None
    compile: CompileMeta | None = None
    rank: Annotated[int | None, _doc("a rank's own run: its rank")] = None
    world_size: Count | None = None
    distributed: JobMeta | None = None
    api: Annotated[str | None, _doc(
        "runs made in the caller's process by the Python API: profile (a model object) or profiling (a block "
        "of code); null otherwise")] = None


# --- summary.json -----------------------------------------------------------------------------------


class Noise(Struct, kw_only=True):
    """How busy the machine was with other work while the steps were timed (opscope.machine.noise)."""

    other_cpu_share: Annotated[Share | None, _doc(
        "share of the cores (0-1) other processes used; null where unknown")] = None
    verdict: Annotated[str | None, _doc("quiet, noisy or unknown")] = None
    reason: str | None = None
    cores: Number | None = None
    threads: Number | None = None
    oversubscribed: bool | None = None
    window_s: Number | None = None


class OpRow(Struct, kw_only=True):
    """One row of ops.csv as an object (summary.json top_ops): numbers as numbers, empty as null."""

    op: str | None = None
    input_dims: str | None = None
    input_dtypes: str | None = None
    input_strides: str | None = None
    concrete_inputs: str | None = None
    source_location: str | None = None
    calls: Number | None = None
    time_us_total: Number | None = None
    time_share: Number | None = None
    flops_per_call: Number | None = None
    bytes_per_call: Number | None = None
    arithmetic_intensity: Number | None = None
    achieved_gflops: Number | None = None
    achieved_gbps: Number | None = None
    pct_peak_flops: Number | None = None
    pct_peak_bandwidth: Number | None = None
    bound: str | None = None
    cpu_time_us_total: Number | None = None
    kernels: str | None = None
    family: str | None = None
    dtype: str | None = None
    ceiling: str | None = None
    time_us_per_call: Number | None = None
    note: str | None = None
    compiled_graph: str | None = None
    kernel_family: str | None = None
    launcher: str | None = None
    module: str | None = None
    module_class: str | None = None
    alloc_bytes_per_call: Number | None = None
    freed_bytes_per_call: Number | None = None


class Stream(Struct, kw_only=True):
    """One GPU stream's work inside the profiled steps."""

    device: int | None = None
    stream: Number | None = None
    kernels: Number | None = None
    kernel_time_us: Number | None = None
    busy_us: Annotated[Number | None, _doc("the union of its kernels inside the profiled steps")] = None
    busy_share: Annotated[Number | None, _doc("of the profiled steps' wall time")] = None


class IdleGap(Struct, kw_only=True):
    """A stretch with no kernel on any stream inside the steps."""

    start_us: Annotated[Number | None, _doc("from the first step, or the first kernel")] = None
    duration_us: Number | None = None
    kernel_before: str | None = None
    kernel_after: str | None = None
    cpu_op: str | None = None
    cpu_source_location: str | None = None
    cpu_next_op: Annotated[str | None, _doc(
        "when no op held the CPU at the gap's middle (Python ran between ops): the op it started next")] = None
    cpu_next_source_location: str | None = None


class GraphReplay(Struct, kw_only=True):
    """Kernels replayed from CUDA/HIP graphs."""

    launches: Number | None = None
    kernels: Number | None = None
    kernel_time_share: Number | None = None
    launchers: list[str] | None = None
    captured_kernels: Number | None = None
    captured_time_share: Number | None = None


class Alive(Struct, kw_only=True):
    """Tensors alive at a memory peak, grouped by the op row that allocated them."""

    op: str | None = None
    source_location: str | None = None
    module: str | None = None
    bytes: Number | None = None
    tensors: Number | None = None


class MemoryStep(Struct, kw_only=True):
    """One step's memory peak."""

    step: int | None = None
    peak_allocated_bytes: Number | None = None
    end_allocated_bytes: Number | None = None
    peak_op: str | None = None
    peak_source_location: str | None = None
    peak_module: str | None = None
    alive_at_peak: list[Alive] = []
    cuda_max_memory_allocated_bytes: Number | None = None


class Memory(Struct, kw_only=True):
    """Memory from the allocator's events: the peak, what was alive then, and the growth per step."""

    source: Annotated[str | None, _doc("memory pass or trace")] = None
    device: str | None = None
    steps: Count | None = None
    peak_allocated_bytes: Annotated[Number | None, _doc("the highest of the steps' peaks")] = None
    peak_step: int | None = None
    peak_op: Annotated[str | None, _doc("the op row during which the peak was reached")] = None
    peak_source_location: str | None = None
    peak_module: str | None = None
    alive_at_peak: list[Alive] = []
    alive_at_peak_other_bytes: Number | None = None
    growth_bytes_per_step: Annotated[Number | None, _doc(
        "median change of the allocated memory at step ends (2+ steps)")] = None
    per_step: list[MemoryStep] = []
    note: str | None = None
    cuda_max_memory_allocated_bytes: Number | None = None


class Replaces(Struct, kw_only=True):
    """What a bundled kernel replaces (its manifest's `replaces`)."""

    kind: str
    target: str


class SwapCandidate(Struct, kw_only=True):
    """A bundled kernel that could replace op rows of the run."""

    kernel: str
    replaces: list[Replaces] = []
    rows: Annotated[list[Count], _doc("indices into ops.csv")] = []
    time_us: Annotated[Number | None, _doc("those rows' total time")] = None
    measured_speedup: Annotated[Number | None, _doc(
        "profile's in-context timing: the rows' time over their time with the kernel, timed on the run's own "
        "shapes and dtypes against the op it replaces (> 1: faster here); null when not measured here")] = None
    original_us: Annotated[Duration | None, _doc("the replaced ops' measured time per step")] = None
    measured_us: Annotated[Duration | None, _doc("the kernel's measured time per step in their place")] = None
    verdict: Annotated[str | None, _doc(
        "faster (a suggestion), slower here (never suggested) or not measured here (claims nothing)")] = None
    why: Annotated[str | None, _doc("why a candidate is slower here or not measured here")] = None
    measure_s: Annotated[Number | None, _doc("seconds the in-context timing took")] = None


class Collective(Struct, kw_only=True):
    """A collective: its calls and time (a rank's over all steps; in a merged run summed over ranks)."""

    name: str | None = None
    kind: Annotated[str | None, _doc("op, annotation or kernel")] = None
    calls: Number | None = None
    time_us: Number | None = None
    ranks: Number | None = None
    time_us_per_step: Annotated[Number | None, _doc("the mean rank's")] = None
    share: Annotated[Number | None, _doc("of the mean step")] = None


class RankSummary(Struct, kw_only=True):
    """A rank's own run of a multi-process job (per profiled step)."""

    rank: int | None = None
    world_size: Count | None = None
    backend: str | None = None
    steps: Count | None = None
    step_time_us: Number | None = None
    op_time_us: Number | None = None
    collective_time_us: Number | None = None
    compute_time_us: Number | None = None
    idle_time_us: Number | None = None
    comm_compute_overlap_share: Number | None = None
    collectives: list[Collective] = []


class FailedRank(Struct, kw_only=True):
    """A rank left out of a merged run: its analysis failed on every try (`opscope analyze --engine ray`)."""

    rank: Annotated[int | None, _doc("its number in its file name, else its place in the folder")] = None
    source: Annotated[str | None, _doc("its trace's or run directory's name in the folder")] = None
    error: Annotated[str | None, _doc("why the last try failed")] = None


class Distributed(Struct, kw_only=True):
    """A merged run of a multi-process job: the ranks side by side and the straggler."""

    world_size: Count | None = None
    ranks: Annotated[Count | None, _doc("how many ranks were merged")] = None
    steps_per_rank: Count | None = None
    backend: str | None = None
    straggler_rank: int | None = None
    straggler_compute_time_us: Number | None = None
    compute_time_us_median: Number | None = None
    straggler_excess_share: Number | None = None
    straggler_beyond_noise: Annotated[bool | None, _doc("the excess is 10% or more")] = None
    compute_spread_share: Annotated[Number | None, _doc("(max - min) / median")] = None
    step_time_us_min: Number | None = None
    step_time_us_max: Number | None = None
    step_time_spread_share: Number | None = None
    collective_time_us: Number | None = None
    collective_time_share: Number | None = None
    idle_time_us: Number | None = None
    comm_compute_overlap_share: Number | None = None
    collectives: list[Collective] = []
    failed_ranks: Annotated[list[FailedRank] | None, _doc(
        "ranks whose analysis failed and that the merge lacks (--engine ray); absent when none did")] = None


class Nsys(Struct, kw_only=True):
    """Nsight Systems: the device work inside the steps."""

    report: str | None = None
    steps: Count | None = None
    gpu: str | None = None
    step_time_us: Number | None = None
    device_busy_share: Number | None = None
    kernels: Number | None = None
    kernel_time_us: Number | None = None
    memcpys: Number | None = None
    memcpy_time_us: Number | None = None
    memcpy_bytes: Number | None = None
    memsets: Number | None = None
    memset_time_us: Number | None = None
    memset_bytes: Number | None = None
    matched_time_share: Annotated[Number | None, _doc("the share of its time lined up with op rows")] = None


class Ncu(Struct, kw_only=True):
    """Nsight Compute: what was measured and matched to op rows."""

    csv: str | None = None
    kernels_profiled: Number | None = None
    kernels_matched: Number | None = None
    rows_measured: Number | None = None
    rows_selected: Number | None = None
    kernels_requested: Number | None = None


class BacklogKernels(Struct, kw_only=True):
    """Kernels launched before the trace started that ran in it (no launch event recorded)."""

    kernels: Count = 0
    kernel_time_us: Annotated[Duration | None, _doc("their summed time")] = None
    in_steps_us: Annotated[Duration | None, _doc(
        "their time inside the profiled steps: what their ops.csv row and the busy shares count")] = None
    kernel_time_share: Annotated[Share | None, _doc("kernel_time_us over all kernel time")] = None


class CompileEntry(Struct, kw_only=True):
    """One frame compilation of a compiled model (its TORCH_TRACE log): compile time, not step time."""

    compile_id: Annotated[str | None, _doc("dynamo's frame/attempt: 0/0; 0/1 is frame 0's first recompilation")] = None
    co_name: Annotated[str | None, _doc("the compiled function")] = None
    co_filename: str | None = None
    line: Annotated[Count | None, _doc("where the function starts")] = None
    compile_time_s: Annotated[Seconds | None, _doc(
        "the frame's compile time, its backward graph's (compiled at the first backward) included")] = None
    inductor_time_s: Annotated[Seconds | None, _doc("inductor's part of it")] = None
    graph_breaks: Annotated[Count | None, _doc("graph breaks in the frame")] = None
    recompile: Annotated[str | None, _doc("the guard that failed (a recompilation); null for a first compilation")] = None
    failed: Annotated[str | None, _doc("why the compilation failed (e.g. the recompile limit); null when it did not")] = None


class WhatIfTop(Struct, kw_only=True):
    ids: Annotated[list[str], _doc("the first N findings' ids in the recommended order")]
    predicted_step_time_us: Annotated[Duration, _doc("the step replayed with those N fixes")]


class WhatIf(Struct, kw_only=True):
    """The step replayed from its dependency graph (opscope whatif)."""

    recorded_step_time_us: Duration
    replayed_step_time_us: Annotated[Duration, _doc("the graph replayed unchanged")]
    predicted_step_time_us: Annotated[Duration, _doc("the graph replayed with every finding's fix")]
    fixes: Annotated[Count, _doc("findings whose fix shortens the step")] = 0
    top: list[WhatIfTop] = []


class Segment(Struct, kw_only=True):
    lane: Annotated[str, _doc("cpu:<tid> or gpu:<device>:<stream>, as in the trace")]
    ts: Annotated[Number, _doc("µs from the first profiled step's start")]
    dur: Duration
    name: str


class WhatIfFile(Struct, kw_only=True):
    """whatif.json: the critical paths of the replayed step (at most 2000 segments each)."""

    critical_path: Annotated[list[Segment], _doc("the step replayed unchanged")] = []
    critical_path_fixed: Annotated[list[Segment], _doc("the step replayed with every finding's fix")] = []


class RowSteps(Struct, kw_only=True):
    """An ops.csv row's time in each profiled step."""

    row: Annotated[Count, _doc("index into ops.csv")]
    times_us: list[Duration] = []


class Summary(Struct, kw_only=True):
    """summary.json: the run in numbers."""

    format_version: int = FORMAT_VERSION
    total_time_us: Annotated[Duration | None, _doc("op time over all profiled steps")] = None
    steps: Steps = 1
    step_time_us: Annotated[Duration | None, _doc("wall time per step")] = None
    step_time_us_p50: Duration | None = None
    step_time_us_max: Duration | None = None
    step_time_cv: Annotated[Annotated[float, Meta(ge=0.0, le=1000.0)] | None, _doc(
        "sample standard deviation / mean of the steps' wall times; null for a single step")] = None
    step_times_us: Annotated[list[Duration] | None, _doc(
        "each profiled step's wall time, in order (profile runs; the first 1000 steps): the samples opscope gate "
        "tests; null or absent for traces analyzed")] = None
    op_step_times_us: Annotated[list[RowSteps] | None, _doc(
        "profile runs: the first 40 rows of ops.csv, each with its time in each profiled step (the first 200): "
        "the op samples opscope gate tests")] = None
    step_source: Annotated[str | None, _doc("annotations (ProfilerStep#N ranges) or whole trace")] = None
    noise: Noise | None = None
    ops_covered_time_share: Annotated[Number | None, _doc(
        "fraction of op time whose op has a cost model")] = None
    bound_time_share: Annotated[dict[str, Number | None], _doc(
        "memory, compute, overhead, unknown: their shares of op time")] = {}
    findings: Annotated[Count | None, _doc("how many findings")] = None
    top_ops: Annotated[list[OpRow], _doc("the first 10 rows of ops.csv")] = []
    swap_candidates: list[SwapCandidate] = []
    device_busy_share: Number | None = None
    kernel_family_time_share: dict[str, Number | None] | None = None
    kernel_families_cover_share: Number | None = None
    unattributed_time_share: Number | None = None
    backlog_kernels: BacklogKernels | None = None
    comm_compute_overlap_share: Number | None = None
    streams: list[Stream] | None = None
    idle_gaps: list[IdleGap] | None = None
    graph_replay: GraphReplay | None = None
    gpu_only: bool | None = None
    memory: Memory | None = None
    rank: RankSummary | None = None
    distributed: Distributed | None = None
    nsys: Nsys | None = None
    ncu: Ncu | None = None
    compile: Annotated[list[CompileEntry] | None, _doc(
        "compiled models with a TORCH_TRACE log: the frame compilations, apart from step time")] = None
    whatif: Annotated[WhatIf | None, _doc("what fixing the findings does to the step (a replay)")] = None


# --- findings.json ------------------------------------------------------------------------------------


class Finding(Struct, kw_only=True):
    """One finding: a rule that fired, where, what it saves and what to do."""

    rule: str
    severity: Annotated[str, _doc("high, medium or low")]
    message: str
    suggestion: str
    op: str | None = None
    source_location: str | None = None
    est_savings_us: Annotated[Number | None, _doc("estimated saving over all profiled steps")] = None
    module: Annotated[str | None, _doc(
        "the innermost module around the finding's rows; \"\" the model itself; null outside it")] = None
    lines: Annotated[list[str] | None, _doc(
        "every source line of a finding whose ops span several (fusion's chain), in order; absent for one")] = None
    id: Annotated[str | None, _doc("<rule>-<hash of rule, op, source line, module>: the same across runs")] = None
    critical_path_saving_us: Annotated[Number | None, _doc(
        "what the step gains from this fix alone, overlaps accounted, over all profiled steps")] = None


# --- timeline.json ------------------------------------------------------------------------------------

Time = Annotated[float, Meta(ge=-1e15, le=1e15)]  # µs from the timeline's origin


class TimelineLane(Struct, kw_only=True):
    """One lane: a CPU thread's outermost op rows or a GPU stream's kernels, copies and fills, as columns
    (one entry per segment, in start order). A segment of n > 1 stands for n shorter ones merged (below
    the lane's bin): it spans them, `busy` is their summed time and it is named after the longest."""

    id: Annotated[str, _doc("cpu:<tid> or gpu:<device>:<stream>")]
    kind: Literal["cpu", "gpu"]
    events: Annotated[Count, _doc("segments before merging")]
    busy_us: Annotated[Duration, _doc("their summed time")]
    bin_us: Annotated[Duration, _doc("segments shorter than this were merged")]
    ts: Annotated[list[Time], _doc("start, µs from the origin")]
    dur: list[Duration]
    busy: list[Duration]
    n: list[Count]
    name: Annotated[list[Count], _doc("index into names")]
    row: Annotated[list[int], _doc("ops.csv row (0-based, file order) of the op or of the op that launched "
                                   "the kernel, else the kernel's own row; -1: none")]
    finding: Annotated[list[int], _doc("index into findings of the finding about this op; -1: none")]


class MemoryCurve(Struct, kw_only=True):
    """Allocated bytes on the run's device: the highest level in each of up to 1,000 bins."""

    device: str | None = None
    source: Annotated[str | None, _doc("trace, or memory pass (its steps mapped onto the timed ones)")] = None
    ts: list[Time]
    bytes: list[Number]


class Timeline(Struct, kw_only=True):
    """timeline.json: the step timeline of the HTML report, bounded in size whatever the trace's."""

    format_version: int
    origin_us: Annotated[Number, _doc("the origin on the trace's clock (µs)")]
    origin: Annotated[str, _doc("first step (its ProfilerStep annotation's start) or first event")]
    span_us: Duration
    steps: Annotated[list[list[Time]], _doc("[start, duration] of each profiled step (the first 200)")]
    names: list[str]
    findings: Annotated[list[str], _doc("the findings' ids (their index from 1 where they have none)")]
    lanes: list[TimelineLane]
    lanes_dropped: Annotated[Count, _doc("lanes left out (the least busy, beyond 32)")] = 0
    memory: MemoryCurve | None = None


# --- swap.json ----------------------------------------------------------------------------------------

SwapStatus = Literal["passed", "failed", "not-applicable", "error"]


class Timing(Struct, kw_only=True):
    """Milliseconds: the median with the 20th and 80th percentiles."""

    median_ms: Number | None = None
    p20_ms: Number | None = None
    p80_ms: Number | None = None


class SwapCheck(Struct, kw_only=True):
    """One verification check."""

    check: str | None = None
    passed: bool | None = None
    seed: Annotated[int | None, _doc("null for checks not tied to a seed")] = None
    tensors: Number | None = None
    max_abs_err: Number | None = None
    max_rel_err: Number | None = None
    out_of_tolerance: Annotated[Number | None, _doc("share of elements")] = None
    worst: str | None = None
    detail: str | None = None


class Verification(Struct, kw_only=True):
    passed: bool | None = None
    tolerance: Annotated[dict[str, dict[str, Number]], _doc("per dtype: rtol, atol")] = {}
    checks: list[SwapCheck] = []


class SwapMechanism(Struct, kw_only=True):
    kind: Annotated[str | None, _doc("module, functional, method, aten, pattern or compile")] = None
    description: str | None = None
    sites: list[str] = []


class SwapSite(Struct, kw_only=True):
    kind: str | None = None
    target: str | None = None
    where: str | None = None
    kernel: str | None = None
    swapped: Number | None = None
    fallback: Number | None = None


class OpLevel(Struct, kw_only=True):
    """The original op against the kernel on the model's own calls."""

    site: str | None = None
    kernel: str | None = None
    call: Annotated[str | None, _doc("its arguments' shapes and dtypes")] = None
    calls_per_step: Number | None = None
    original: Timing | None = None
    swapped: Timing | None = None
    speedup: Annotated[Number | None, _doc("original / swapped")] = None
    suspicious: bool | None = None
    within_noise: bool | None = None
    flops: Number | None = None
    bytes: Number | None = None
    bound: str | None = None
    pct_peak_before: Number | None = None
    pct_peak_after: Number | None = None


class EndToEnd(Struct, kw_only=True):
    """The whole step, original against swapped."""

    original: Timing | None = None
    swapped: Timing | None = None
    speedup: Number | None = None
    suspicious: bool | None = None
    within_noise: bool | None = None
    repeats: Number | None = None
    compile_s: Annotated[Number | None, _doc("--kernel compile's first step, else null")] = None


class SwapResult(Struct, kw_only=True):
    """One swap: what was swapped in, whether the model stayed right, and what it saved."""

    label: str
    status: SwapStatus
    message: str = ""
    source: Annotated[str | None, _doc("bundled, user or compile")] = None
    kernels: list[str] = []
    notes: list[str] = []
    mechanisms: list[SwapMechanism] = []
    calls: dict[str, Number] | None = None
    sites: list[SwapSite] = []
    verification: Verification | None = None
    max_abs_err: Number | None = None
    max_rel_err: Number | None = None
    out_of_tolerance: Number | None = None
    op_level: list[OpLevel] = []
    end_to_end: EndToEnd | None = None


class SwapMethod(Struct, kw_only=True):
    seeds: Number | None = None
    repeats: Number | None = None
    warmup: Number | None = None
    suspicious_speedup: Number | None = None
    steady_allocator: bool | None = None
    note: str | None = None


class SwapFile(Struct, kw_only=True):
    """swap.json (opscope swap, profile --try-swaps)."""

    format_version: int = FORMAT_VERSION
    opscope_version: str | None = None
    created: str | None = None
    target: str | None = None
    device: Device | None = None
    dtype: str | None = None
    mode: str | None = None
    threads: Count | None = None
    method: SwapMethod | None = None
    results: list[Any] = []


# --- the CSV files ---------------------------------------------------------------------------------------

ColumnKind = Literal["text", "number", "value"]


class Column(Struct, frozen=True):
    """A CSV column: text ("" for none), number (empty for none), or value (typed by its cells)."""

    name: str
    kind: ColumnKind
    description: str


def _columns(*rows: tuple[str, ColumnKind, str]) -> tuple[Column, ...]:
    return tuple(Column(name, kind, text) for name, kind, text in rows)


OPS_COLUMNS = _columns(
    ("op", "text", "the operator as the profiler records it (aten::addmm, c10d::allreduce_, a kernel row's kernel)"),
    ("input_dims", "text", "JSON text exactly as the trace's Input Dims"),
    ("input_dtypes", "text", "JSON text exactly as the trace's Input type"),
    ("input_strides", "text", "JSON text exactly as the trace's Input Strides"),
    ("concrete_inputs", "text", "JSON text exactly as the trace's Concrete Inputs"),
    ("source_location", "text", "the user's file:line that issued the calls"),
    ("calls", "number", "calls over all profiled steps"),
    ("time_us_total", "number", "time over all profiled steps (CPU runs: self time; GPU runs: kernel time)"),
    ("time_share", "number", "the row's fraction of the sum over rows"),
    ("flops_per_call", "number", "FLOPs of one call; empty where the cost model does not know the op"),
    ("bytes_per_call", "number", "bytes moved by one call; empty where unknown"),
    ("arithmetic_intensity", "number", "FLOPs per byte"),
    ("achieved_gflops", "number", "GFLOP/s achieved"),
    ("achieved_gbps", "number", "GB/s achieved"),
    ("pct_peak_flops", "number", "% of the FLOP/s ceiling of the row's dtype"),
    ("pct_peak_bandwidth", "number", "% of the bandwidth ceiling"),
    ("bound", "text", "memory, compute, overhead or unknown"),
    ("cpu_time_us_total", "number", "GPU runs: the ops' CPU time"),
    ("kernels", "text", "GPU runs: ;-separated kernel names"),
    ("family", "text", "the cost model's op family"),
    ("dtype", "text", "the dtype whose ceiling applies"),
    ("ceiling", "text", "the ceiling key the roofline used"),
    ("time_us_per_call", "number", "time_us_total / calls"),
    ("note", "text", "why a row has no shapes or cost (kernel rows, custom ops)"),
    ("compiled_graph", "value", "the torch.compile range the calls ran in; empty for eager ops"),
    ("kernel_family", "text", "GPU runs: the family of most of the row's kernel time"),
    ("launcher", "text", "GPU runs, kernel rows: what launched the kernels"),
    ("module", "text", "the innermost nn.Module's qualified name; \"\" the model itself"),
    ("module_class", "text", "that module's class; empty outside the model"),
    ("alloc_bytes_per_call", "number", "bytes allocated during one call (runs with memory events)"),
    ("freed_bytes_per_call", "number", "bytes freed during one call"),
    ("ranks", "value", "merged runs: how many ranks ran the row"),
    ("slowest_rank", "value", "merged runs: the rank with the most time on the row"),
    ("time_us_max_rank", "value", "merged runs: the row's time on that rank"),
    ("nsys_time_us_total", "value", "Nsight Systems: the row's measured kernel time"),
    ("measured_time_us_per_call", "value", "Nsight Compute: measured time per call"),
    ("measured_dram_bytes_per_call", "value", "Nsight Compute: DRAM bytes per call"),
    ("measured_flops_per_call", "value", "Nsight Compute: FLOPs per call"),
    ("measured_tensor_inst_per_call", "value", "Nsight Compute: tensor-core instructions per call"),
    ("measured_dram_pct_peak", "value", "Nsight Compute: DRAM % of speed of light"),
    ("measured_sm_pct_peak", "value", "Nsight Compute: SM % of speed of light"),
    ("measured_bytes_ratio", "value", "measured / modeled bytes"),
    ("measured_flops_ratio", "value", "measured / modeled FLOPs"),
    ("measured_kernels", "text", "Nsight Compute: the measured kernels, most traffic first"),
)
OPS_REQUIRED = ("op", "calls", "time_us_total", "time_share")

MODULES_COLUMNS = _columns(
    ("module", "text", "qualified name; \"\" the model; (outside the model) for ops outside its forward"),
    ("module_class", "text", "its class"),
    ("depth", "number", "0 for the model and (outside the model); the number of dotted parts otherwise"),
    ("time_us_total", "number", "inclusive: the module's rows and all its submodules', over all steps"),
    ("time_share", "number", "of the run's op time"),
    ("self_time_us", "number", "rows whose module is this one"),
    ("flops_total", "number", "inclusive FLOPs over all steps; empty when none is known"),
    ("bytes_total", "number", "inclusive bytes over all steps; empty when none is known"),
    ("bound", "text", "the bound class with the most inclusive time"),
    ("findings", "number", "findings whose module is this one or inside it"),
)

RANKS_COLUMNS = _columns(
    ("rank", "number", "the rank"),
    ("steps", "number", "its profiled steps"),
    ("step_time_us", "number", "per step"),
    ("op_time_us", "number", "per step"),
    ("collective_time_us", "number", "per step"),
    ("compute_time_us", "number", "per step"),
    ("idle_time_us", "number", "per step"),
    ("comm_compute_overlap_share", "number", "empty without communication kernels"),
    ("straggler", "number", "1 for the rank with the most compute per step, else 0"),
    ("device", "text", "the device's name"),
    ("run", "text", "its run directory inside the merged run (ranks/<rank>)"),
)

NSYS_KERNELS_COLUMNS = _columns(
    ("kind", "text", "kernel, memcpy or memset"), ("name", "text", "as Nsight Systems names it"),
    ("module", "text", "the NVTX module range"), ("nvtx_op", "text", "the NVTX op range"),
    ("ops_row", "number", "the ops.csv row it lined up with; -1 where none"), ("op", "text", "that row's op"),
    ("source_location", "text", "that row's line"), ("calls", "number", "inside the steps"),
    ("time_us_total", "number", "inside the steps"), ("bytes_total", "number", "memcpy/memset bytes"),
)

NCU_KERNELS_COLUMNS = _columns(
    ("id", "number", "Nsight Compute's kernel id"), ("kernel", "text", "its name"),
    ("ops_row", "number", "the ops.csv row it was matched to; -1 where none"), ("op", "text", "that row's op"),
    ("source_location", "text", "that row's line"), ("time_us", "number", "measured"),
    ("dram_bytes", "number", "DRAM bytes read and written"), ("flops", "number", "from the SASS counters"),
    ("tensor_inst", "number", "tensor-core instructions"), ("dram_pct_peak", "number", "DRAM % of speed of light"),
    ("sm_pct_peak", "number", "SM % of speed of light"),
)


def names(columns: tuple[Column, ...], kind: ColumnKind) -> tuple[str, ...]:
    return tuple(c.name for c in columns if c.kind == kind)


# --- validation ----------------------------------------------------------------------------------------------

FILE_TYPES: dict[str, Any] = {"meta.json": RunMeta, "summary.json": Summary, "findings.json": list[Finding],
                              "swap.json": SwapFile, "timeline.json": Timeline, "whatif.json": WhatIfFile}


_FINITE = re.compile(r"Expected `float` [<>]= -?1\.7976931348623157e\+308")


class FormatError(ValueError):
    """A file that does not follow the format: the message names what is wrong and where."""


def check(name: str, doc: Any) -> None:
    """Raises FormatError when `doc` (a file's decoded JSON) does not follow the format of the run file
    `name` (a key of FILE_TYPES), or was written by a newer format version."""
    version = doc.get("format_version") if isinstance(doc, dict) else None
    if isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION:
        raise FormatError(f"written in run format {version} by a newer opscope; this one reads format "
                          f"{FORMAT_VERSION} (upgrade opscope)")
    try:
        where = _non_finite(doc, "$")
    except RecursionError:
        raise FormatError("nested too deep") from None
    if where is not None:  # before the types: NaN fails whichever bound comes first, a misleading message
        raise FormatError(f"Expected a finite number - at `{where}`")
    try:
        msgspec.convert(doc, FILE_TYPES[name], strict=True)
    except msgspec.ValidationError as exc:
        raise FormatError(_FINITE.sub("Expected a finite number", str(exc))) from None


def _non_finite(value: Any, path: str) -> str | None:
    """The path (msgspec's notation) of the first NaN or infinity in a decoded JSON value, else None."""
    if isinstance(value, float):
        return None if value - value == 0.0 else path
    if isinstance(value, dict):
        for key, item in value.items():
            found = _non_finite(item, f"{path}.{key}")
            if found is not None:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = _non_finite(item, f"{path}[{i}]")
            if found is not None:
                return found
    return None


def valid_swap_result(result: Any) -> bool:
    """Whether one entry of swap.json's results follows the format (the renderers skip those that do not)."""
    try:
        msgspec.convert(result, SwapResult, strict=True)
    except msgspec.ValidationError:
        return False
    return True


def kernels_for_rows(swap_candidates: Any, rows: range, verdict: str | None = "faster") -> dict[int, list[str]]:
    """{row index: candidate kernel names} for the given rows of a run's summary `swap_candidates`, those of
    one `verdict` (default: the suggestions, measured faster here; None: every candidate)."""
    out: dict[int, list[str]] = {}
    if not isinstance(swap_candidates, list):
        return out
    for c in swap_candidates:
        if not isinstance(c, dict) or not isinstance(c.get("kernel"), str) or not isinstance(c.get("rows"), list):
            continue
        if verdict is not None and candidate_verdict(c) != verdict:
            continue
        for r in c["rows"]:
            if isinstance(r, int) and r in rows:
                out.setdefault(r, []).append(c["kernel"])
    return out


def candidate_verdict(candidate: dict[str, Any]) -> str:
    """faster, slower here or not measured here: a candidate of a run written before the in-context timing
    (no verdict) was not measured, and only a measured speedup above 1 is faster."""
    speedup = candidate.get("measured_speedup")
    if not isinstance(speedup, (int, float)) or isinstance(speedup, bool) or speedup != speedup:
        return "not measured here"
    return "faster" if speedup > 1.0 else "slower here"


# --- the published record -------------------------------------------------------------------------------------


def json_schema() -> dict[str, Any]:
    """The JSON Schema of the run directory's JSON files: one definition per file under "properties"
    (meta.json, summary.json, findings.json, swap.json, timeline.json; swap.json's results items are SwapResult)."""
    types = list(FILE_TYPES.values()) + [SwapResult]
    schemas, components = msgspec.json.schema_components(types, ref_template="#/$defs/{name}")
    files = dict(zip(FILE_TYPES, schemas[:-1], strict=True))
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": f"opscope run directory, format {FORMAT_VERSION}",
            "description": "The JSON files of an opscope run directory (generated from opscope.run.schema).",
            "type": "object", "properties": files, "$defs": components}


def columns_markdown() -> str:
    """The CSV files' columns as Markdown tables, in file order."""
    parts = []
    for file, columns in (("ops.csv", OPS_COLUMNS), ("modules.csv", MODULES_COLUMNS), ("ranks.csv", RANKS_COLUMNS),
                          ("nsys_kernels.csv", NSYS_KERNELS_COLUMNS), ("ncu_kernels.csv", NCU_KERNELS_COLUMNS)):
        lines = [f"### `{file}`", "", "| column | kind | meaning |", "|---|---|---|"]
        lines += [f"| `{c.name}` | {c.kind} | {c.description.replace('|', '/')} |" for c in columns]
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def write_docs(folder: str) -> list[str]:
    """Writes run-format.schema.json and run-format-columns.md into `folder`; returns their paths."""
    import json
    from pathlib import Path

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    schema = out / "run-format.schema.json"
    schema.write_text(json.dumps(json_schema(), indent=2, sort_keys=False) + "\n", encoding="utf-8")
    columns = out / "run-format-columns.md"
    columns.write_text(columns_markdown(), encoding="utf-8")
    return [str(schema), str(columns)]


if __name__ == "__main__":
    import sys

    for path in write_docs(sys.argv[1] if len(sys.argv) > 1 else "docs/reference"):
        print(path)
