"""What kind of job `opscope profile` runs, decided and checked before any child process starts (no
torch here): a model file (get_model / Model + get_inputs / --entry), an unmodified script (script
mode), and either of them in one process or in several through torch.distributed.run (torchrun).

Everything here fails as one OpscopeError line, exit 2.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from opscope.errors import OpscopeError, TargetError
from opscope.target.specs import LaunchSpec, ScriptSpec

# Top-level names that make a file a model file (CONTRACT.md: the accepted shapes).
MODEL_SHAPES = (("get_model", "get_inputs"), ("Model", "get_inputs"))
STEP_FN_RE = re.compile(r"^(?P<module>[A-Za-z_][\w.]*):(?P<func>[A-Za-z_]\w*(\.[A-Za-z_]\w*)*)$")
MAX_PROCS = 1024  # per node; far above any real node, far below what the OS refuses
MAX_NODES = 100_000


def top_level_names(path: Path) -> set[str]:
    """Names a file defines at its top level (functions, classes, assignments, imports)."""
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return set()  # check_target_file reports those
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def is_model_file(path: Path) -> bool:
    names = top_level_names(path)
    return any(all(n in names for n in shape) for shape in MODEL_SHAPES)


def script_spec(target: Path, *, script: bool, entry: str | None, args: list[str], step_fn: str | None,
                stop_after: bool, dtype: str | None, mode: str) -> ScriptSpec | None:
    """The script-mode settings when TARGET is profiled as a script, else None. A file is a script when
    `--script` says so, when a script-only option is given (arguments after `--`, --step-fn,
    --stop-after), or when it defines none of the model-file shapes (and no --entry names one)."""
    wanted = script or bool(args) or step_fn is not None or stop_after
    if not wanted and (entry is not None or is_model_file(target)):
        return None
    if entry is not None:
        raise TargetError("--entry names a model function; a script (script mode) runs as it is, without it")
    if dtype is not None:
        raise TargetError("--dtype does not apply to a script: the script decides its own dtypes")
    if mode != "inference":
        raise TargetError("--mode does not apply to a script: the script decides what a step does")
    if step_fn is not None and not STEP_FN_RE.match(step_fn):
        raise TargetError(f"--step-fn must be MODULE:FUNC (e.g. train:train_step or mypkg.loop:Trainer.step), "
                          f"not {step_fn!r}")
    return ScriptSpec(args=list(args), step_fn=step_fn, stop_after=stop_after, auto=not wanted)


def launch_spec(nproc_per_node: int | None, nnodes: int, node_rank: int, master_addr: str | None,
                master_port: int | None) -> LaunchSpec | None:
    """torchrun's settings when the job runs in several processes (--nproc-per-node), else None."""
    if nproc_per_node is None:
        if nnodes != 1 or node_rank != 0 or master_addr is not None or master_port is not None:
            raise OpscopeError("--nnodes, --node-rank, --master-addr and --master-port need --nproc-per-node")
        return None
    if not 1 <= nproc_per_node <= MAX_PROCS:
        raise OpscopeError(f"--nproc-per-node must be between 1 and {MAX_PROCS}, not {nproc_per_node}")
    if not 1 <= nnodes <= MAX_NODES:
        raise OpscopeError(f"--nnodes must be between 1 and {MAX_NODES}, not {nnodes}")
    if not 0 <= node_rank < nnodes:
        raise OpscopeError(f"--node-rank must be between 0 and --nnodes - 1 ({nnodes - 1}), not {node_rank}")
    if master_port is not None and not 1 <= master_port <= 65535:
        raise OpscopeError(f"--master-port must be a TCP port (1-65535), not {master_port}")
    if master_addr is not None and (not master_addr.strip() or any(c.isspace() for c in master_addr)):
        raise OpscopeError(f"--master-addr must be a host name or address, not {master_addr!r}")
    if nnodes > 1 and master_addr is None:
        raise OpscopeError("--nnodes above 1 needs --master-addr (the host of node 0) so that the nodes meet")
    return LaunchSpec(nproc_per_node, nnodes, node_rank, master_addr, master_port)


def check_tool_options(script: ScriptSpec | None, launch: LaunchSpec | None, *, nsys: bool, ncu: bool,
                       nvtx: bool) -> None:
    """--nsys/--ncu run a model file's steps again under the tool, in one process, and --nvtx marks a
    model file's steps and modules: a script has neither to mark nor re-run, and the Nsight passes
    launch one process, not torchrun's ranks."""
    tools = [flag for flag, on in (("--nsys", nsys), ("--ncu", ncu)) if on]
    marked = [*tools, *(["--nvtx"] if nvtx else [])]
    if script is not None and marked:
        raise OpscopeError(f"{'/'.join(marked)} appl{'y' if len(marked) > 1 else 'ies'} to a model file "
                           "(get_model/Model + get_inputs), not to a script (script mode): opscope cannot re-run "
                           "or mark a script's steps")
    if launch is not None and tools:
        one = len(tools) == 1
        raise OpscopeError(f"{'/'.join(tools)} measure{'s' if one else ''} one process and do{'es' if one else ''} "
                           "not apply to --nproc-per-node; profile the model in one process with "
                           f"{'it' if one else 'them'} (--nvtx does apply to the ranks)")
