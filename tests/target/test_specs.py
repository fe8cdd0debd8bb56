"""The jobs the parent hands its supervised children (opscope.target.specs): typed both ways, paths
included, and a spec the child cannot decode is opscope's own error (exit 1), named, not a crash."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from opscope.target.specs import (
    HoldRun,
    Job,
    LaunchSpec,
    MeasureSteps,
    NsightPass,
    ProfileJob,
    ProfileOptions,
    RankJob,
    ScriptSpec,
    SwapJob,
    SwapSpec,
    decode_job,
    encode_job,
)
from opscope.target.supervise import InternalError, run_worker

OPTIONS = ProfileOptions(target=Path("/models/model.py"), entry="build", device="cpu", dtype="bfloat16",
                         mode="train", warmup=0, steps=3, threads=2, peak_bw=20.0, peak_flops=["bfloat16=100"],
                         out=Path("/runs/one"), debug=True, nvtx=True)

JOBS: list[Job] = [
    ProfileJob(options=ProfileOptions(target=Path("model.py"))),
    ProfileJob(options=OPTIONS, script=ScriptSpec(args=["--lr", "1"], step_fn="train:step", stop_after=True),
               launch=LaunchSpec(2, 2, 1, "node0", 29500)),
    SwapJob(options=OPTIONS, swap=SwapSpec()),
    SwapJob(options=OPTIONS, swap=SwapSpec(requests=[{"label": "rms_norm", "kernels": ["rms_norm"]}], repeats=7)),
    NsightPass(options=OPTIONS, task=HoldRun(folder=Path("/tmp/held"))),
    NsightPass(options=OPTIONS, task=MeasureSteps(tool="nsys", nvtx_ops=True)),
    RankJob(options=OPTIONS, ranks_dir=Path("/runs/.staging/ranks"), device="cuda", threads=4,
            script=ScriptSpec(auto=True), peaks={"memory_bandwidth_gbps": 20.0}),
]


@pytest.mark.parametrize("job", JOBS, ids=lambda job: type(job).__name__)
def test_a_job_decodes_as_the_job_it_was(job):
    decoded = decode_job(encode_job(job), type(job))
    assert decoded == job
    assert isinstance(decoded.options.target, Path)
    assert decoded.options.out is None or isinstance(decoded.options.out, Path)


def test_the_paths_travel_as_text():
    doc = msgspec.json.decode(encode_job(JOBS[-1]))
    assert doc["options"]["target"] == "/models/model.py" and doc["ranks_dir"] == "/runs/.staging/ranks"


@pytest.mark.parametrize("doc,needle", [
    ({"options": {"target": "m.py"}, "swap": {}}, "unknown field `swap`"),
    ({"options": {"target": "m.py", "steps": "5"}}, "Expected `int`, got `str` - at `$.options.steps`"),
    ({"options": {}}, "missing required field `target`"),
    ({"options": {"target": "m.py"}, "launch": {"nnodes": 2}}, "missing required field `nproc_per_node`"),
])
def test_a_spec_of_another_shape_does_not_decode(doc, needle):
    with pytest.raises(msgspec.ValidationError, match=needle.replace("(", r"\(").replace("$", r"\$")):
        decode_job(msgspec.json.encode(doc), ProfileJob)


def test_an_nsight_pass_is_one_of_its_two_kinds():
    with pytest.raises(msgspec.ValidationError, match="Invalid value 'trace'"):
        decode_job(msgspec.json.encode({"options": {"target": "m.py"}, "task": {"type": "trace"}}), NsightPass)


def test_a_child_given_a_job_it_cannot_decode_fails_as_an_internal_error(tmp_path):
    """The profile child decodes a ProfileJob: a SwapJob has a field it does not know."""
    job = SwapJob(options=ProfileOptions(target=tmp_path / "model.py"), swap=SwapSpec())
    with pytest.raises(InternalError, match=r"^internal error in opscope's worker process: its spec spec\.json does "
                                            r"not decode as ProfileJob \(Object contains unknown field `swap`\)$") as err:
        run_worker("opscope.capture.worker", job)
    assert err.value.exit_code == 1
