"""Which Python frames are "the user's code": shared by the live capture (exact lines from real frames)
and by trace analysis (function-level frames as torch.profiler names them, e.g.
"transformers/models/bert/modeling_bert.py(250): forward").

A frame is skipped when it belongs to torch (and its sibling packages), to opscope, or to the Python
standard library; recognised by module path, not by absolute path, so traces from other machines work.
"""

from __future__ import annotations

import os
import re
import sys
import sysconfig
from functools import lru_cache

HARNESS = "opscope:harness"
INTERNAL_PACKAGES = frozenset({"torch", "functorch", "torchgen", "triton", "nvtx"})
OWN_PACKAGE = "opscope"
_STDLIB_NAMES = frozenset(sys.stdlib_module_names)
_FRAME_RE = re.compile(r"^(?P<path>.+?)\((?P<line>\d+)\): (?P<func>.*)$")
_SITE_MARKERS = ("site-packages/", "dist-packages/")


def _stdlib_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = {os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib") if k in paths}
    return tuple(sorted(d + os.sep for d in dirs))


_STDLIB_DIRS = _stdlib_dirs()


def module_path(path: str) -> str:
    """A frame's file as a module path: the part after site-packages/ for installed packages, else the
    path as given (made relative to the working directory by callers that know it)."""
    path = path.replace("\\", "/")
    for marker in _SITE_MARKERS:
        i = path.rfind(marker)
        if i >= 0:
            return path[i + len(marker):]
    return path


@lru_cache(maxsize=65536)
def classify_path(path: str) -> str:
    """'internal' (torch & co.), 'own' (opscope), 'stdlib', 'builtin' (no file) or 'user'."""
    if not path or path.startswith("<"):
        return "builtin"
    norm = path.replace("\\", "/")
    if os.path.isabs(path):
        real = os.path.realpath(path)
        if not any(m in norm for m in _SITE_MARKERS) and any(real.startswith(d) for d in _STDLIB_DIRS):
            return "stdlib"
    mod = module_path(norm)
    parts = [p for p in mod.split("/") if p and p != "."]
    if os.path.isabs(norm) and not any(m in norm for m in _SITE_MARKERS):
        # An absolute path outside site-packages: a package is recognised by a known folder name
        # (e.g. a source checkout of torch or opscope), otherwise it is the user's own file.
        for p in parts[:-1]:
            if p in INTERNAL_PACKAGES:
                return "internal"
        if _own_file(norm):
            return "own"
        return "user"
    top = parts[0] if parts else ""
    if top.endswith(".py"):
        top = top[:-3]
    if top in INTERNAL_PACKAGES:
        return "internal"
    if top == OWN_PACKAGE:
        return "own"
    if top in _STDLIB_NAMES and len(parts) <= 2:
        return "stdlib"
    return "user"


_OWN_DIR = os.path.dirname(os.path.realpath(__file__)) + os.sep


def _own_file(path: str) -> bool:
    return os.path.realpath(path).startswith(_OWN_DIR)


def display_path(path: str, cwd: str | None = None) -> str:
    """How a source file is shown: relative to the working directory when inside it, the module path
    for installed packages, else absolute."""
    norm = path.replace("\\", "/")
    if any(m in norm for m in _SITE_MARKERS):
        return module_path(norm)
    if os.path.isabs(path):
        cwd = cwd or os.getcwd()
        try:
            rel = os.path.relpath(path, cwd)
        except ValueError:
            return norm
        if not rel.startswith(".."):
            return rel.replace("\\", "/")
    return norm


def parse_trace_frame(name: str) -> tuple[str, int, str] | None:
    """'transformers/models/bert/modeling_bert.py(250): forward' -> (path, 250, 'forward');
    None for '<built-in ...>', 'nn.Module: X' and other non-frames."""
    if not name or name[0] == "<" or name.startswith("nn.Module:"):
        return None
    m = _FRAME_RE.match(name)
    if not m:
        return None
    return m.group("path"), int(m.group("line")), m.group("func")


@lru_cache(maxsize=65536)
def trace_frame_location(name: str) -> str | None:
    """For a trace frame name: 'path:line' when it is user code, HARNESS for opscope's own frames,
    None when it should be skipped (torch, stdlib, built-ins)."""
    parsed = parse_trace_frame(name)
    return None if parsed is None else frame_location(parsed[0], parsed[1])


@lru_cache(maxsize=65536)
def frame_location(path: str, line: int) -> str | None:
    """'path:line' for a user frame, HARNESS for opscope's own, None for frames to skip."""
    kind = classify_path(path)
    if kind == "user":
        return f"{display_path(path)}:{line}"
    if kind == "own":
        return HARNESS
    return None


def location_from_call_stack(stack: str) -> str:
    """The "Call stack" arg (innermost frame first, ';'-separated) -> first user frame, '' if none."""
    for frame in stack.split(";"):
        loc = trace_frame_location(frame.strip())
        if loc is not None:
            return loc
    return ""
