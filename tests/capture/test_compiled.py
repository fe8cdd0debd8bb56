"""Compiled models in `opscope profile` (opscope/capture/compiled.py): one ops.csv row per inductor kernel,
torch's structured compile log kept as torch_trace.log.gz, meta.json's "compile", `--compile MODE`, and a
model that fails to compile as one line.

Inductor's C++ compiler makes the tests that compile with it slow (tens of seconds on a cold cache); the
others compile with backend="eager" (dynamo only) or fail before any backend runs.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from conftest import EXAMPLES, PEAKS, run_cli, write_model

QUICK = ["--steps", "2", "--warmup", "1", "--threads", "1", *PEAKS]
KERNEL_EVENT_PREFIX = "graph_"  # inductor's C++ kernel events: graph_<N>_cpp_fused_<ops>_<k>

EAGER = """
    import torch
    import torch.nn.functional as F


    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(32, 32)

        def forward(self, x):
            return F.gelu(self.proj(x)) * x


    def get_model():
        torch.manual_seed(0)
        return Model()


    def get_inputs():
        return [torch.randn(8, 32)]
"""


def trace_events(run: Path) -> list[dict]:
    return json.loads(gzip.decompress((run / "trace.json.gz").read_bytes()))["traceEvents"]


def log_records(run: Path) -> list[dict]:
    """The structured log's records (the JSON after each line's glog-style prefix), payload lines skipped."""
    records = []
    for line in gzip.decompress((run / "torch_trace.log.gz").read_bytes()).decode().splitlines():
        head, sep, body = line.partition("] ")
        if sep and head[:1] in "VIWE" and body.startswith("{"):
            records.append(json.loads(body))
    return records


def artifacts(run: Path) -> set[str]:
    return {r["artifact"]["name"] for r in log_records(run) if "artifact" in r}


def ops_rows(run: Path) -> list[dict]:
    import csv

    with open(run / "ops.csv", newline="") as f:
        return list(csv.DictReader(f))


def error_lines(proc) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def compiled_block(tmp_path_factory):
    """One profile of examples/compiled_block.py (get_model() returns torch.compile(Block()))."""
    folder = tmp_path_factory.mktemp("compiled_block")
    out = folder / "run"
    proc = run_cli("profile", str(EXAMPLES / "compiled_block.py"), *QUICK, "--out", str(out), "--json", cwd=folder,
                   timeout=600)
    assert proc.returncode == 0, proc.stderr
    return proc, out


@pytest.mark.slow
def test_each_inductor_kernel_is_a_row_of_its_own(compiled_block):
    _, run = compiled_block
    # the kernels as the trace records them (an independent reading): one event per kernel call
    calls: dict[str, int] = {}
    for e in trace_events(run):
        if e.get("ph") == "X" and "cpp_fused_" in e.get("name", "") and e["name"].startswith(KERNEL_EVENT_PREFIX):
            calls[e["name"]] = calls.get(e["name"], 0) + 1
    assert len(calls) >= 2, calls  # the block fuses at least GELU and the residual adds with the norms
    rows = [r for r in ops_rows(run) if "cpp_fused_" in r["op"]]
    assert sorted(r["op"] for r in rows) == sorted(calls)  # one row per kernel
    for r in rows:
        assert int(r["calls"]) == calls[r["op"]] == 2  # once per profiled step
        assert float(r["time_us_total"]) > 0
    # ... and each is a kernel of the compiled graph's code in the compile log
    log = gzip.decompress((run / "torch_trace.log.gz").read_bytes()).decode()
    assert all(f"def {name.split('_', 2)[2]}(" in log or f"{name.split('_', 2)[2]} = " in log for name in calls)


@pytest.mark.slow
def test_the_compile_log_is_kept_with_inductors_provenance(compiled_block):
    _, run = compiled_block
    assert (run / "torch_trace.log.gz").read_bytes()[:2] == b"\x1f\x8b"
    names = artifacts(run)
    assert "inductor_provenance_tracking_node_mappings" in names
    assert any("inductor_post_grad_graph" in r or r.get("artifact", {}).get("name") == "inductor_post_grad_graph"
               for r in log_records(run))
    assert any("dynamo_start" in r for r in log_records(run))


@pytest.mark.slow
def test_meta_records_that_the_model_compiled_itself(compiled_block):
    from opscope.run.read import read_run

    _, run = compiled_block
    meta = read_run(run).meta  # read_run checks meta.json against the run format's schema
    assert meta["compile"]["mode"] is None and meta["compile"]["by"] == "model"
    assert meta["compile"]["first_step_s"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["default", "reduce-overhead", "max-autotune"])
def test_compile_flag_compiles_an_eager_model(tmp_path, mode):
    model = write_model(tmp_path, EAGER)
    out = tmp_path / "run"
    proc = run_cli("profile", str(model), "--compile", mode, *QUICK, "--out", str(out), "--json", cwd=tmp_path,
                   timeout=600)
    assert proc.returncode == 0, proc.stderr
    meta = json.loads((out / "meta.json").read_text())
    assert meta["compile"]["mode"] == mode and meta["compile"]["by"] == "opscope"
    assert meta["compile"]["first_step_s"] > 0
    kernels = [r for r in ops_rows(out) if "cpp_fused_" in r["op"]]
    assert kernels and all(int(r["calls"]) == 2 for r in kernels)  # compiled in the warm-up step, not again
    assert "inductor_provenance_tracking_node_mappings" in artifacts(out)
    note = [line for line in proc.stderr.splitlines() if "CUDA graphs need a GPU" in line]
    assert len(note) == (1 if mode == "reduce-overhead" else 0), proc.stderr


def test_compile_flag_on_a_compiled_model_is_one_note_and_one_compile(tmp_path, monkeypatch):
    """get_model() returns a compiled model (dynamo only: backend="eager"); --compile adds a note, not a second
    compile. --warmup 0 is raised to one step, so that the compile is not timed. A TORCH_TRACE of the user's
    own is where torch writes, and the run keeps the log."""
    model = write_model(tmp_path, EAGER.replace("return Model()", "return torch.compile(Model(), backend='eager')"))
    out, mine = tmp_path / "run", tmp_path / "my-trace"
    monkeypatch.setenv("TORCH_TRACE", str(mine))
    proc = run_cli("profile", str(model), "--compile", "default", "--steps", "2", "--warmup", "0", *PEAKS,
                   "--out", str(out), "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert len([line for line in proc.stderr.splitlines() if "already compiled" in line]) == 1, proc.stderr
    assert len([line for line in proc.stderr.splitlines() if "--warmup 0" in line]) == 1, proc.stderr
    meta = json.loads((out / "meta.json").read_text())
    assert meta["compile"]["by"] == "model" and meta["compile"]["mode"] is None
    assert meta["compile"]["first_step_s"] > 0
    starts = [r for r in log_records(out) if "dynamo_start" in r]
    assert len(starts) == 1  # one frame compiled once: no second torch.compile around the first
    logs = list(mine.glob("dedicated_log_torch_trace_*.log"))
    assert len(logs) == 1 and gzip.decompress((out / "torch_trace.log.gz").read_bytes()) == logs[0].read_bytes()
    # the profiled steps ran the compiled frame: no op outside it but the step annotation's
    regions = [e for e in trace_events(out) if e.get("name", "").startswith("Torch-Compiled Region")]
    assert len(regions) >= 2


def test_an_eager_model_writes_no_compile_log(tmp_path):
    """The child gets a private TORCH_TRACE folder (torch reads it at import); an eager model compiles nothing,
    so torch writes nothing there and the run has no torch_trace.log.gz and no "compile"."""
    model = write_model(tmp_path, EAGER.replace("def get_inputs():", f"""def get_inputs():
        import os
        folder = os.environ.get("TORCH_TRACE")
        with open({str(tmp_path / "seen.json")!r}, "w") as f:
            f.write(repr((folder, os.path.isdir(folder) if folder else None, os.environ.get("TMPDIR"))))"""))
    out = tmp_path / "run"
    proc = run_cli("profile", str(model), *QUICK, "--out", str(out), "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    folder, existed, private = eval((tmp_path / "seen.json").read_text())  # noqa: S307 (the test's own file)
    assert folder is not None and Path(folder).parent == Path(private).parent  # inside opscope's private folder
    assert not existed  # torch creates it at the first thing it logs: an eager model logs nothing
    assert not Path(folder).exists()  # removed with the private folder
    assert not (out / "torch_trace.log.gz").exists()
    assert "compile" not in json.loads((out / "meta.json").read_text())


def test_a_compile_during_the_profiled_steps_is_said(tmp_path):
    """A model whose code compiles late (a function compiled at its second call, the first profiled step):
    opscope cannot know before, and says that the step time includes compiling; meta.json records that the
    model compiled."""
    model = write_model(tmp_path, """
        import torch
        import torch.nn.functional as F


        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.proj = torch.nn.Linear(32, 32)
                self.calls = 0

            def forward(self, x):
                self.calls += 1
                y = self.proj(x)
                if self.calls == 2:
                    return torch.compile(lambda t: F.gelu(t) * 2, backend="eager")(y)
                return F.gelu(y) * 2


        def get_model():
            return Model()


        def get_inputs():
            return [torch.randn(8, 32)]
    """)
    out = tmp_path / "run"
    proc = run_cli("profile", str(model), *QUICK, "--out", str(out), "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    said = [line for line in proc.stderr.splitlines() if "compiled during the profiled steps" in line]
    assert len(said) == 1, proc.stderr
    meta = json.loads((out / "meta.json").read_text())
    assert meta["compile"]["by"] == "model" and meta["compile"]["mode"] is None
    assert (out / "torch_trace.log.gz").exists()


FAILS_TO_COMPILE = {
    "graph break under fullgraph": ("""
        import torch


        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.proj = torch.nn.Linear(16, 16)

            def forward(self, x):
                y = self.proj(x)
                if y.sum().item() > 0:
                    return y * 2
                return y


        def get_model():
            return torch.compile(Model(), fullgraph=True)


        def get_inputs():
            return [torch.randn(4, 16)]
    """, "if y.sum().item() > 0:", "data-dependent"),
    "backend error": ("""
        import torch


        def broken(gm, example_inputs):
            raise ValueError("this backend refuses every graph")


        def get_model():
            return torch.compile(torch.nn.Linear(16, 16), backend=broken)


        def get_inputs():
            return [torch.randn(4, 16)]
    """, 'raise ValueError("this backend', "backend='broken' raised: ValueError: this backend refuses every graph"),
}


@pytest.mark.parametrize("case", sorted(FAILS_TO_COMPILE))
def test_a_model_that_fails_to_compile_is_one_line_and_writes_nothing(tmp_path, case):
    from conftest import line_of

    source, line, reason = FAILS_TO_COMPILE[case]  # the line of the model's code the message names
    model = write_model(tmp_path, source)
    out = tmp_path / "run"
    proc = run_cli("profile", str(model), *QUICK, "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = error_lines(proc)
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("opscope: error: torch.compile could not compile the model")
    assert reason in lines[0]
    assert f" at model.py:{line_of(model, line)} " in lines[0]
    assert proc.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "__pycache__") == ["model.py"]  # nothing written


def test_the_log_of_this_run_is_found_among_others_in_a_shared_folder(tmp_path, monkeypatch):
    from opscope.capture.compiled import TorchTraceLog

    monkeypatch.setenv("TORCH_TRACE", str(tmp_path))
    (tmp_path / "dedicated_log_torch_trace_old.log").write_text("x" * 100)  # an earlier run's, larger
    log = TorchTraceLog()
    assert log.path() is None  # nothing compiled yet
    (tmp_path / "dedicated_log_torch_trace_new.log").write_text("x")
    (tmp_path / "other.log").write_text("x" * 1000)
    assert log.path() == tmp_path / "dedicated_log_torch_trace_new.log"
    monkeypatch.delenv("TORCH_TRACE")
    assert TorchTraceLog().path() is None


def test_a_compile_log_over_the_cap_is_neither_kept_nor_read(tmp_path, monkeypatch):
    import opscope.capture.compiled as compiled

    log = tmp_path / "dedicated_log_torch_trace_x.log"
    log.write_bytes(b"x" * 2048)
    monkeypatch.setattr(compiled, "MAX_TORCH_TRACE_BYTES", 4096)
    assert compiled.kept_log(log) == (log, None)
    monkeypatch.setattr(compiled, "MAX_TORCH_TRACE_BYTES", 1024)
    kept, warning = compiled.kept_log(log)
    assert kept is None and "over opscope's" in warning and "\n" not in warning
    assert compiled.kept_log(None) == (None, None)


def test_inductor_builds_no_precompiled_header_in_the_childs_private_tmpdir(tmp_path):
    """Inductor puts its precompiled header (~150 MiB) under $TMPDIR whatever TORCHINDUCTOR_CACHE_DIR says; the
    child's private $TMPDIR made every compiled profile build it again (5-10 s), so the child compiles without."""
    model = write_model(tmp_path, EAGER.replace("def get_inputs():", f"""def get_inputs():
        import torch._inductor.config as config
        with open({str(tmp_path / "seen.txt")!r}, "w") as f:
            f.write(repr(config.cpp_cache_precompile_headers))"""))
    proc = run_cli("profile", str(model), *QUICK, "--out", str(tmp_path / "run"), "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "seen.txt").read_text() == "False"


def test_code_compiled_earlier_in_the_process_does_not_mark_an_eager_profile(tmp_path):
    """A notebook (or a test session) that compiled other code before profiles an eager model in-process:
    the run is not a compiled model's (meta.compile), and the findings do not talk to a compiled model.
    Only what dynamo compiles while the model runs counts."""
    import torch

    from conftest import EXAMPLES
    from opscope.capture.compiled import dynamo_ok_frames
    from opscope.capture.torch_profiler import profile_target
    from opscope.target.specs import ProfileOptions

    torch.compile(lambda x: x + 1, backend="eager")(torch.ones(2))
    assert dynamo_ok_frames() > 0
    opts = ProfileOptions(target=EXAMPLES / "mlp.py", out=tmp_path / "run", steps=1, warmup=1, peak_bw=20.0,
                          peak_flops=["100"])
    run, _ = profile_target(opts)
    assert "compile" not in run.meta
    assert not any("already runs compiled" in f["suggestion"] for f in run.findings)
