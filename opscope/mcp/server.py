"""`opscope mcp --root DIR`: a Model Context Protocol server (the official `mcp` SDK, stdio transport) over
opscope's public API. Its tools profile a model file, analyze a trace, read a run (top ops, findings,
modules), compare two runs, try a kernel swap and explain one row's cost; their results are structured
content in the run format's keys and columns, and every run directory is a resource
(opscope://run/{run}/{file}).

Every path an agent gives is resolved (symlinks included) inside the root, and refused in one line when it
lands outside; runs are written under the root (ROOT/reports/ unless `out` names a folder there). The only
code the server runs is the model files (and user kernels) an agent names under the root, in opscope's
supervised child process. Bad input comes back as a tool error with opscope's one-line message."""

from __future__ import annotations

import contextlib
import functools
import math
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import anyio
import anyio.from_thread
import anyio.to_thread
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError
from mcp.server.mcpserver.resources import FunctionResource
from mcp.types import CallToolResult, TextContent
from pydantic import Field

from opscope import api
from opscope.capture.options import Progress
from opscope.errors import OpscopeError
from opscope.run.model import DEFAULT_REPORTS_DIR
from opscope.run.model import Run as TableRun
from opscope.table import Table, nrows
from opscope.version import __version__

T = TypeVar("T")
# What a run resource may name: the run directory's files (docs/reference/run-format.md).
RUN_FILES = {"meta.json": "application/json", "summary.json": "application/json",
             "findings.json": "application/json", "swap.json": "application/json",
             "timeline.json": "application/json", "ops.csv": "text/csv", "modules.csv": "text/csv",
             "ranks.csv": "text/csv"}
RUN_URI = "opscope://run/{run}/{file}"
MAX_ROWS = 1000  # rows one top_ops/modules call returns at most
INSTRUCTIONS = """opscope: per-operator roofline profiling of PyTorch models. Paths are relative to the server's
root. Start with `analyze` (a torch.profiler trace) or `profile` (a model file): both return the run's summary,
its top ops (ops.csv rows, slowest first) and findings (each with a suggestion and the time it saves). Then
`explain_op` on a row says how its FLOPs and bytes were counted and which ceiling binds it; `swap` tries a
bundled or user kernel in place of an op and verifies the model is still right; `compare` two runs."""

Device = Literal["auto", "cpu", "cuda"]
DType = Literal["float32", "bfloat16", "float16"]
Mode = Literal["inference", "train"]
CompileMode = Literal["default", "reduce-overhead", "max-autotune"]
# the CLI's bounds (opscope.cli.app: MAX_STEPS, MAX_THREADS)
Steps = Annotated[int, Field(ge=1, le=100_000)]
Warmup = Annotated[int, Field(ge=0, le=100_000)]
Threads = Annotated[int, Field(ge=1, le=4096)]
Repeats = Annotated[int, Field(ge=5, le=1000)]
Count = Annotated[int, Field(ge=0, le=MAX_ROWS)]
First = Annotated[int, Field(ge=0)]


class Root:
    """The folder the agent's paths are confined to."""

    def __init__(self, path: Path) -> None:
        resolved = path.expanduser().resolve()
        if not resolved.is_dir():
            raise OpscopeError(f"--root {path}: not a directory")
        self.path = resolved

    def inside(self, value: str | os.PathLike[str], what: str, *, exists: bool = True) -> Path:
        """`value` (relative to the root, or absolute) resolved, symlinks followed; an OpscopeError when it
        lands outside the root, or (with `exists`) names nothing."""
        text = os.fspath(value)
        if not text or "\0" in text:
            raise OpscopeError(f"{what}: give a path under the root")
        path = Path(text).expanduser()
        resolved = (path if path.is_absolute() else self.path / path).resolve()
        if not resolved.is_relative_to(self.path):
            raise OpscopeError(f"{what} {text}: outside the root {self.path} (opscope mcp reads and writes only "
                               "under its --root)")
        if exists and not resolved.exists():
            raise OpscopeError(f"{what} {text}: no such file or directory under the root")
        return resolved

    def relative(self, path: Path) -> str:
        return path.resolve().relative_to(self.path).as_posix() or "."


class ToolProgress(Progress):
    """opscope's phase progress (the API's Progress, called from the worker thread) as MCP progress
    notifications and log warnings on the tool call's request."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.step = 0.0
        self.phase_name = ""
        self.phase_total: int | None = None
        self.done = 0
        self.warnings: list[str] = []

    def _send(self) -> None:
        fraction = min(self.done / self.phase_total, 1.0) if self.phase_total else 0.0
        _from_thread(self.ctx.report_progress, self.step + fraction, None, self.phase_name)

    def phase(self, name: str, total: int | None = None) -> None:
        if self.phase_name:
            self.step += 1
        self.phase_name, self.phase_total, self.done = name, total, 0
        self._send()

    def advance(self, n: int = 1) -> None:
        self.done += n
        self._send()

    def warn(self, message: str) -> None:
        self.warnings.append(message)
        _from_thread(self.ctx.warning, message)


def _from_thread(fn: Callable[..., Any], *args: Any) -> None:
    """Calls the coroutine function `fn` on the event loop from a worker thread; a notification that
    cannot be sent (the client went away) does not stop the work."""
    with contextlib.suppress(Exception):  # progress is best effort
        anyio.from_thread.run(fn, *args)


def clean(value: Any) -> Any:
    """A JSON-able copy of `value`: NaN and infinities (empty cells) as null, tuples as lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value


def records(table: Table, first: int = 0, count: int | None = None, *, index: bool = True) -> list[dict[str, Any]]:
    """Rows `first`.. of a column table as records with the file's columns (and `row`: the row's index)."""
    n = nrows(table)
    stop = n if count is None else min(n, first + count)
    out = []
    for i in range(first, stop):
        rec = {col: clean(values[i]) for col, values in table.items()}
        out.append({"row": i, **rec} if index else rec)
    return out


def tool_errors(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """The tool `fn` with bad input (an OpscopeError: a path outside the root, a missing file, what the API
    refuses) answered as a tool error whose text is opscope's one-line message."""

    @functools.wraps(fn)
    async def tool(*args: Any, **kwargs: Any) -> Any:
        try:
            return await fn(*args, **kwargs)
        except OpscopeError as exc:
            return CallToolResult(content=[TextContent(type="text", text=str(exc))], is_error=True)

    return tool


class OpscopeServer:
    """The tools and resources over one root."""

    def __init__(self, root: Path, *, debug: bool = False) -> None:
        self.root = Root(root)
        self.mcp: MCPServer = MCPServer("opscope", version=__version__, instructions=INSTRUCTIONS, debug=debug,
                                        log_level="DEBUG" if debug else "WARNING")
        self.lock = anyio.Lock()  # one measurement or analysis at a time (they share the machine)
        self.listed: set[str] = set()
        for tool in (self.profile, self.analyze, self.top_ops, self.findings, self.modules, self.compare,
                     self.swap, self.explain_op):
            self.mcp.add_tool(tool_errors(tool), name=tool.__name__, structured_output=True)
        self.mcp.resource(RUN_URI, name="run", description="A file of a run directory under the root "
                          "(meta.json, summary.json, findings.json, ops.csv, modules.csv, swap.json).",
                          mime_type="application/json")(self.read_run_file)
        self._list_runs()

    # --- helpers ---------------------------------------------------------------------------------------

    def _out(self, out: str | None) -> Path | None:
        if out is None:
            return None
        return self.root.inside(out, "out", exists=False)

    def _load(self, run: str) -> api.Run:
        return api.load(self.root.inside(run, "run"))

    async def _call(self, fn: Callable[[], T]) -> T:
        """`fn` in a worker thread (the event loop goes on answering)."""
        return await anyio.to_thread.run_sync(fn)

    async def _measure(self, ctx: Context, fn: Callable[[ToolProgress], api.Run]) -> tuple[api.Run, list[str]]:
        progress = ToolProgress(ctx)
        async with self.lock:
            run = await self._call(lambda: fn(progress))
        return run, progress.warnings

    def _run_result(self, run: api.Run, warnings: list[str], top: int) -> dict[str, Any]:
        """What a tool that wrote a run returns: where it is, its summary, top ops and findings."""
        internal: TableRun = run.internal
        assert run.dir is not None  # a written run knows its directory
        rel = self.root.relative(run.dir)
        self._list_run(run.dir)
        summary = {k: v for k, v in internal.summary.items() if k != "top_ops"}
        return {
            "run": rel,
            "resources": self._uris(run.dir),
            "summary": clean(summary),
            "top_ops": records(internal.ops, 0, top),
            "findings": clean(internal.findings),
            "warnings": list(dict.fromkeys(warnings + list(getattr(run, "warnings", [])))),
        }

    def _uris(self, run_dir: Path) -> list[str]:
        rel = self.root.relative(run_dir)
        return [RUN_URI.format(run=rel, file=f) for f in RUN_FILES if (run_dir / f).is_file()]

    def _list_run(self, run_dir: Path) -> None:
        """Lists the run's files as resources (the template reads any run; the listing shows the known ones)."""
        rel = self.root.relative(run_dir)
        for name, mime in RUN_FILES.items():
            uri = RUN_URI.format(run=rel, file=name)
            if uri in self.listed or not (run_dir / name).is_file():
                continue
            self.listed.add(uri)
            self.mcp.add_resource(FunctionResource(uri=uri, name=f"{rel}/{name}", mime_type=mime,
                                                   fn=functools.partial(self.read_run_file, rel, name)))

    def _list_runs(self) -> None:
        """The runs already in ROOT/reports/ at start."""
        reports = self.root.path / DEFAULT_REPORTS_DIR
        try:
            runs = sorted(p for p in reports.iterdir() if p.is_dir() and (p / "summary.json").is_file())
        except OSError:
            return
        for run_dir in runs[-200:]:
            self._list_run(run_dir)

    # --- resources -------------------------------------------------------------------------------------

    def read_run_file(self, run: str, file: str) -> str:
        if file not in RUN_FILES:
            raise ResourceError(f"{file}: not a run file (one of {', '.join(RUN_FILES)})")
        try:
            run_dir = self.root.inside(run, "run")
            path = self.root.inside(run_dir / file, "run file")
            return path.read_text()
        except OpscopeError as exc:
            raise ResourceError(str(exc)) from exc
        except OSError as exc:
            raise ResourceError(f"{run}/{file}: {exc.strerror or exc}") from exc

    # --- tools -----------------------------------------------------------------------------------------

    async def profile(self, model: str, ctx: Context, mode: Mode = "inference", steps: Steps = 5, warmup: Warmup = 2,
                      device: Device = "auto", dtype: DType | None = None, entry: str | None = None,
                      compile: CompileMode | None = None, threads: Threads | None = None, out: str | None = None,
                      top: Count = 10) -> dict[str, Any]:
        """Profile a model file under the root (a Python file defining get_model()/Model and get_inputs(), or
        `entry`, a function returning (model, inputs)) in opscope's supervised child process: per-op FLOPs,
        bytes, roofline and findings. Writes a run directory (default ROOT/reports/...; `out`: a new folder
        under the root). Returns the run, its summary, the `top` slowest ops (ops.csv rows) and the findings."""
        target = self.root.inside(model, "model")
        out_path = self._out(out)
        run, warnings = await self._measure(ctx, lambda progress: api.profile(
            target, mode=mode, steps=steps, warmup=warmup, device=device, dtype=dtype, entry=entry, compile=compile,
            threads=threads, out=out_path, progress=progress))
        return self._run_result(run, warnings, top)

    async def analyze(self, trace: str, ctx: Context, out: str | None = None, peak_bw: float | None = None,
                      peak_flops: list[str] | None = None, torch_trace: str | None = None, top: Count = 10) -> dict[str, Any]:
        """Analyze a torch.profiler trace under the root (.json or .json.gz, CPU, CUDA or ROCm) into a run
        directory (default ROOT/reports/...; `out`: a new folder under the root). `peak_bw` (GB/s) and
        `peak_flops` ("[DTYPE=]GFLOPS" each) override the ceilings; `torch_trace`: the same run's
        TORCH_TRACE log for a compiled model. Returns the run, its summary, the `top` slowest ops (ops.csv
        rows, with `row` for explain_op) and the findings."""
        path = self.root.inside(trace, "trace")
        log = self.root.inside(torch_trace, "torch_trace") if torch_trace else None
        out_path = self._out(out)
        # the tools read run directories, never the event tables: freed as the analysis goes (a large trace's
        # peak memory, as `opscope analyze`)
        run, warnings = await self._measure(ctx, lambda progress: api.analyze(
            path, out=out_path, peak_bw=peak_bw, peak_flops=peak_flops, torch_trace=log, progress=progress,
            tables=False))
        return self._run_result(run, warnings, top)

    async def top_ops(self, run: str, n: Count = 10, first: First = 0, bound: str | None = None,
                      module: str | None = None) -> dict[str, Any]:
        """The rows of a run's ops.csv (slowest first), `n` of them from row `first`: op, inputs, source line,
        module, calls, time, FLOPs and bytes per call, intensity, achieved rates, % of peak, bound. `bound`
        (memory, compute, overhead, unknown) or `module` (a prefix of the module path) keeps only those rows."""
        loaded = await self._call(lambda: self._load(run))
        ops = loaded.internal.ops
        rows = records(ops)
        if bound is not None:
            rows = [r for r in rows if r.get("bound") == bound]
        if module is not None:
            rows = [r for r in rows if str(r.get("module") or "").startswith(module)]
        return {"run": self.root.relative(loaded.dir) if loaded.dir else run, "rows": nrows(ops),
                "matching": len(rows), "ops": rows[first:first + n]}

    async def findings(self, run: str, rule: str | None = None, severity: str | None = None) -> dict[str, Any]:
        """A run's findings (findings.json: rule, severity, message, suggestion, op, source_location,
        est_savings_us over all profiled steps, module), largest saving first as written; `rule` or
        `severity` (high, medium, low) keeps only those."""
        loaded = await self._call(lambda: self._load(run))
        found = [f for f in loaded.internal.findings
                 if (rule is None or f.get("rule") == rule) and (severity is None or f.get("severity") == severity)]
        return {"run": self.root.relative(loaded.dir) if loaded.dir else run, "findings": clean(found)}

    async def modules(self, run: str, n: Count = 30, prefix: str | None = None) -> dict[str, Any]:
        """A run's module tree (modules.csv: per module its inclusive time, own time, FLOPs, bytes and
        bound), `n` rows; `prefix` keeps the modules whose path starts with it."""
        loaded = await self._call(lambda: self._load(run))
        table = loaded.internal.modules
        rows = records(table, index=False) if table is not None else []
        if prefix is not None:
            rows = [r for r in rows if str(r.get("module") or "").startswith(prefix)]
        return {"run": self.root.relative(loaded.dir) if loaded.dir else run, "has_modules": table is not None,
                "modules": rows[:n]}

    async def compare(self, run_a: str, run_b: str) -> dict[str, Any]:
        """Compare two runs op by op (A the baseline): step times and their ratio, per-op and per-module
        changes beyond the runs' noise, ops that appeared or vanished, findings fixed and introduced."""
        a, b = self.root.inside(run_a, "run_a"), self.root.inside(run_b, "run_b")
        comparison = await self._call(lambda: api.compare(api.load(a), api.load(b)))
        return {"run_a": self.root.relative(a), "run_b": self.root.relative(b),
                "comparison": clean(comparison.to_json())}

    async def swap(self, model: str, ctx: Context, kernels: list[str] | None = None, op: str | None = None,
                   module: str | None = None, entry: str | None = None, device: Device = "auto",
                   dtype: DType | None = None, mode: Mode = "inference", warmup: Warmup = 2, steps: Steps = 5,
                   repeats: Repeats = 15, out: str | None = None) -> dict[str, Any]:
        """Put a kernel in place of part of a model file under the root, verify the model is still right
        (outputs, gradients in train mode), and measure the op-level and end-to-end speedup. `kernels`:
        bundled kernel names (see the run's summary.swap_candidates; `a+b` applies two together), `compile`,
        or a user kernel FILE.py:FUNC under the root with `op` (an aten op) or `module` (a module class or
        name). Without `kernels`: every bundled kernel matching an op of the model. Returns swap.json's
        results (status passed/failed, speedups) with the run."""
        target = self.root.inside(model, "model")
        requested = [self._kernel(k) for k in kernels] if kernels else None
        out_path = self._out(out)
        run, warnings = await self._measure(ctx, lambda progress: api.swap(
            target, kernels=requested, op=op, module=module, entry=entry, device=device, dtype=dtype, mode=mode,
            warmup=warmup, steps=steps, repeats=repeats, out=out_path, progress=progress))
        result = self._run_result(run, warnings, 5)
        return {**result, "swap": clean(run.swap or {"results": []})}

    def _kernel(self, kernel: str) -> str:
        """A kernel request with a user file (FILE.py:FUNC) resolved inside the root; a bundled name as is."""
        file, sep, func = kernel.rpartition(":")
        if sep and file.endswith(".py"):
            return f"{self.root.inside(file, 'kernel file')}:{func}"
        if kernel.endswith(".py") or "/" in kernel or os.sep in kernel:
            raise OpscopeError(f"kernel {kernel}: a user kernel is FILE.py:FUNC (a file under the root)")
        return kernel

    async def explain_op(self, run: str, row: int | str) -> dict[str, Any]:
        """How one row of a run's ops.csv was counted (`row`: its index, as top_ops gives it, or an op name
        for that op's slowest row): the inputs, FLOPs and bytes per call and in total, intensity, achieved
        FLOP/s and GB/s, the ceiling that binds and the % of it, the bound, the cost family, the cost function
        and its formula with its own estimate from the recorded inputs, and the row's note."""
        from opscope.api.explain import explain_op

        loaded = await self._call(lambda: self._load(run))
        explained = await self._call(lambda: explain_op(loaded, row))
        return {"run": self.root.relative(loaded.dir) if loaded.dir else run, **clean(explained)}


def serve(root: Path, *, debug: bool = False) -> None:
    """Serves the tools over stdio until the client closes stdin. The process's working directory becomes
    the root (the default reports/ folder is under it). The SDK points fd 1 at stderr while it serves:
    nothing but protocol messages reaches stdout. `debug`: the SDK's log (on stderr) in full."""
    server = OpscopeServer(root, debug=debug)
    os.chdir(server.root.path)
    server.mcp.run("stdio")
