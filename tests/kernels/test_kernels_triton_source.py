"""The Triton kernels are valid Triton in compiled and interpreted modes alike, across the Triton versions
torch's CUDA wheels pin (3.6, 3.7): a loop over a runtime size is `tl.range` (or has constexpr bounds), as
Triton's tutorials write it. Triton 3.6's interpreter fails on `for start in range(0, N, BLOCK)` with a
runtime N ("only 0-dimensional arrays can be converted to Python scalars", the H200 run's 40 failures),
while 3.7's accepts it, so running the kernels under this machine's interpreter alone would not catch one.
test_kernels_triton.py runs every kernel under the interpreter."""

from __future__ import annotations

import ast

from reference_kernels.manifest import PACKAGE_DIR

SOURCES = sorted([PACKAGE_DIR / "_triton.py", *PACKAGE_DIR.glob("*/triton_kernels.py")])


def _is_jit(fn: ast.FunctionDef) -> bool:
    return any("jit" in ast.unparse(d) for d in fn.decorator_list)


def _constexpr_params(fn: ast.FunctionDef) -> set[str]:
    return {a.arg for a in fn.args.args if a.annotation is not None and "constexpr" in ast.unparse(a.annotation)}


def runtime_range_loops(source: str) -> list[str]:
    """`for` loops of @triton.jit functions over Python's `range` with a bound that is not a literal or
    a constexpr parameter."""
    found = []
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, ast.FunctionDef) or not _is_jit(fn):
            continue
        constexpr = _constexpr_params(fn)
        for loop in ast.walk(fn):
            call = loop.iter if isinstance(loop, ast.For) else None
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "range"):
                continue
            names = {n.id for arg in call.args for n in ast.walk(arg) if isinstance(n, ast.Name)}
            if names - constexpr:
                found.append(f"{fn.name}: line {loop.lineno}: {ast.unparse(call)}")
    return found


def test_the_scan_finds_a_loop_over_a_runtime_size() -> None:
    bad = ("@triton.jit\ndef k(x_ptr, N, BLOCK: tl.constexpr, ROWS: tl.constexpr):\n"
           "    for start in range(0, N, BLOCK):\n        pass\n"
           "    for i in range(0, ROWS):\n        pass\n"
           "    for j in tl.range(0, N, BLOCK):\n        pass\n")
    assert runtime_range_loops(bad) == ["k: line 3: range(0, N, BLOCK)"]


def test_no_kernel_loops_over_a_runtime_size_with_range() -> None:
    assert len(SOURCES) >= 9
    found = [f"{p.relative_to(PACKAGE_DIR)}: {hit}" for p in SOURCES for hit in runtime_range_loops(p.read_text())]
    assert not found, found
