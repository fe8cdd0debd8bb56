"""`opscope mcp --root DIR` driven as an agent drives it: a real subprocess, the MCP SDK's own stdio client."""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from conftest import TRACES, run_cli, write_model

pytest.importorskip("mcp")

from mcp import ClientSession  # noqa: E402
from mcp.client.stdio import StdioServerParameters, stdio_client  # noqa: E402

TRACE = "h100_bert-small_bf16.json.gz"
TOOLS = {"profile", "analyze", "top_ops", "findings", "modules", "compare", "swap", "explain_op"}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "traces").mkdir(parents=True)
    shutil.copy(TRACES / TRACE, root / "traces" / TRACE)
    return root


def session(root: Path, tmp_path: Path, body: Callable[[ClientSession], Awaitable[None]]) -> None:
    """Starts `opscope mcp --root ROOT`, runs `body` on an initialized session, closes the client (the
    server exits on stdin's EOF) and checks that the server wrote nothing but protocol on stdout."""
    params = StdioServerParameters(command=sys.executable, args=["-m", "opscope", "mcp", "--root", str(root)],
                                   env={"KINETO_LOG_LEVEL": "6", "OPSCOPE_CACHE_DIR": os.environ["OPSCOPE_CACHE_DIR"]},
                                   cwd=str(tmp_path))

    async def main() -> None:
        with (tmp_path / "server.log").open("w") as errlog:
            async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as client:
                await client.initialize()
                with anyio.fail_after(120):
                    await body(client)

    anyio.run(main)


async def call(client: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result.structured_content


async def error(client: ClientSession, tool: str, **arguments: Any) -> str:
    result = await client.call_tool(tool, arguments)
    assert result.is_error
    text = " ".join(c.text for c in result.content if c.type == "text")
    assert "\n" not in text and "Traceback" not in text
    return text


def test_analyze_a_trace_then_read_the_run(root: Path, tmp_path: Path) -> None:
    async def body(client: ClientSession) -> None:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert set(tools) == TOOLS
        assert "trace" in tools["analyze"].input_schema["properties"]

        progress: list[tuple[float, str | None]] = []

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            progress.append((value, message))

        result = await client.call_tool("analyze", {"trace": f"traces/{TRACE}", "top": 5}, progress_callback=on_progress)
        assert not result.is_error, result.content
        run = result.structured_content
        assert run is not None
        assert run["run"].startswith("reports/") and (root / run["run"] / "ops.csv").is_file()
        assert progress and progress[0][1] == "analyzing"
        # the top ops: ops.csv's columns, slowest first, each with its row index for explain_op
        top = run["top_ops"]
        assert len(top) == 5 and [r["row"] for r in top] == list(range(5))
        assert top[0]["op"] == "aten::addmm" and top[0]["bound"] == "memory"
        assert top[0]["time_us_total"] >= top[1]["time_us_total"]
        # findings in findings.json's keys, and the summary in summary.json's
        rules = {f["rule"] for f in run["findings"]}
        assert {"low-bandwidth", "host-sync"} <= rules
        assert set(run["findings"][0]) >= {"rule", "severity", "message", "suggestion", "est_savings_us"}
        assert run["summary"]["findings"] == len(run["findings"])
        assert f"opscope://run/{run['run']}/summary.json" in run["resources"]
        # the unstructured content carries the same document, for clients that read text
        assert json.loads(result.content[0].text)["run"] == run["run"]

        ops = await call(client, "top_ops", run=run["run"], n=3, first=1)
        assert [r["row"] for r in ops["ops"]] == [1, 2, 3] and ops["rows"] > 100
        memory = await call(client, "top_ops", run=run["run"], bound="memory", n=1000)
        assert memory["ops"] and all(r["bound"] == "memory" for r in memory["ops"])
        high = await call(client, "findings", run=run["run"], rule="host-sync")
        assert high["findings"] and all(f["rule"] == "host-sync" for f in high["findings"])
        modules = await call(client, "modules", run=run["run"], n=5)
        assert modules["has_modules"] and len(modules["modules"]) == 5
        assert {"module", "module_class"} <= set(modules["modules"][0])

        explained = await call(client, "explain_op", run=run["run"], row=0)
        assert explained["cost_function"] == "opscope.costmodel.matmul.addmm"
        assert "2*M*N*K" in explained["formula"]
        assert explained["flops_per_call"] == 2 * 141 * 512 * 30522 == explained["estimate"]["flops_per_call"]
        by_name = await call(client, "explain_op", run=run["run"], row="aten::addmm")
        assert by_name["row"] == 0

        same = await call(client, "compare", run_a=run["run"], run_b=run["run"])
        assert same["comparison"]["step_ratio"] == pytest.approx(1.0)

        # the run is a resource: listed, and readable through the template
        listed = {str(r.uri) for r in (await client.list_resources()).resources}
        assert f"opscope://run/{run['run']}/findings.json" in listed
        read = await client.read_resource(f"opscope://run/{run['run']}/summary.json")
        assert json.loads(read.contents[0].text)["findings"] == len(run["findings"])

    session(root, tmp_path, body)


def test_paths_outside_the_root_are_refused(root: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.json.gz"
    shutil.copy(TRACES / TRACE, outside)
    (root / "escape.json.gz").symlink_to(outside)
    (root / "m.py").write_text("")

    async def body(client: ClientSession) -> None:
        for trace in ("../outside.json.gz", str(outside), "escape.json.gz", "traces/../../outside.json.gz"):
            message = await error(client, "analyze", trace=trace)
            assert "outside the root" in message, message
        message = await error(client, "analyze", trace=f"traces/{TRACE}", out=str(tmp_path / "run"))
        assert "out" in message and "outside the root" in message
        assert not (tmp_path / "run").exists()
        assert "outside the root" in await error(client, "top_ops", run="..")
        assert "outside the root" in await error(client, "profile", model=str(tmp_path / "model.py"))
        assert "outside the root" in await error(client, "swap", model="m.py", kernels=["../k.py:f"])
        # a missing file, and opscope's own refusals, are one line too (and the server goes on)
        assert "no such file" in await error(client, "analyze", trace="traces/missing.json.gz")
        assert "not an opscope run directory" in await error(client, "findings", run="traces")
        for uri in ("opscope://run/../summary.json", "opscope://run/traces/secret.txt"):
            with pytest.raises(Exception):  # noqa: B017 (the SDK's protocol error)
                await client.read_resource(uri)
        ok = await call(client, "analyze", trace=f"traces/{TRACE}", out="runs/bert", top=1)
        assert ok["run"] == "runs/bert"
        assert "row 100000" in await error(client, "explain_op", run="runs/bert", row=100000)
        bad = await client.call_tool("profile", {"model": "m.py", "steps": 0})  # the CLI's bounds (the SDK's message)
        assert bad.is_error and "steps" in bad.content[0].text

    session(root, tmp_path, body)
    assert not list(tmp_path.glob("reports"))  # nothing written outside the root (the server's cwd)


def test_without_the_sdk_one_line_exit_2(tmp_path: Path) -> None:
    # `mcp` made unimportable: the command says what to install
    code = ("import sys; sys.modules['mcp'] = None; sys.argv = ['opscope', 'mcp', '--root', '.']; "
            "from opscope.cli.app import main; main()")
    proc = run_cli_code(code, tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "opscope: error: opscope mcp needs the MCP SDK: pip install 'opscope[mcp]'"
    assert proc.stdout == ""


def test_no_other_command_imports_the_sdk(tmp_path: Path) -> None:
    code = ("import sys, opscope, opscope.cli.app, opscope.api.explain; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mcp', 'mcp_types')))")
    proc = run_cli_code(code, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_root_must_be_a_directory(tmp_path: Path) -> None:
    proc = run_cli("mcp", "--root", str(tmp_path / "nowhere"))
    assert proc.returncode == 2 and "not a directory" in proc.stderr and proc.stdout == ""


def run_cli_code(code: str, cwd: Path):
    import subprocess

    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_profile_a_model_file_under_the_root(root: Path, tmp_path: Path) -> None:
    write_model(root, """
        import torch

        def get_model():
            return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Softmax(dim=-1))

        def get_inputs():
            return (torch.randn(8, 64),)
    """)

    async def body(client: ClientSession) -> None:
        phases: list[str | None] = []

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            phases.append(message)

        result = await client.call_tool("profile", {"model": "model.py", "device": "cpu", "steps": 2, "warmup": 1,
                                                    "threads": 1, "out": "runs/mlp"}, progress_callback=on_progress)
        assert not result.is_error, result.content
        run = result.structured_content
        assert run is not None and run["run"] == "runs/mlp"
        assert {r["op"] for r in run["top_ops"]} & {"aten::addmm", "aten::_softmax"}
        assert run["summary"]["steps"] == 2
        assert len(set(phases)) >= 2  # the child's phases came through as progress
        explained = await call(client, "explain_op", run="runs/mlp", row="aten::addmm")
        assert explained["flops_per_call"] == 2 * 8 * 64 * 64

    session(root, tmp_path, body)
