"""Exact source lines: joined from the untimed dispatch-mode pass to the timed trace's ops."""

from __future__ import annotations

import pytest

from conftest import line_of, write_model
from opscope.capture.torch_profiler import profile_target
from opscope.sources import HARNESS
from opscope.target.specs import ProfileOptions

FAST = dict(steps=2, warmup=1, peak_bw=20.0, peak_flops=["100"], threads=1)

TRANSPOSE_RESHAPE = """
    import torch

    class Model(torch.nn.Module):
        def __init__(self, heads):
            super().__init__()
            self.heads = heads
            self.proj = torch.nn.Linear(64, 64)

        def forward(self, q):
            b, t, d = q.shape
            q = self.proj(q).view(b, t, self.heads, d // self.heads)
            x = q.transpose(1, 2).reshape(b * self.heads, t, -1)  # the copy
            return torch.relu(x)

    def get_init_inputs():
        return [4]

    def get_inputs():
        return [torch.randn(2, 32, 64)]
"""


@pytest.fixture(scope="module")
def transpose_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tr")
    path = write_model(folder, TRANSPOSE_RESHAPE)
    run, _ = profile_target(ProfileOptions(target=path, out=folder / "run", **FAST))
    return path, run


def rows_for(run, op):
    return run.to_pandas()[run.to_pandas()["op"] == op]


def test_kernelbench_file_with_init_inputs_profiles(transpose_run):
    path, run = transpose_run
    assert (run.path / "ops.csv").exists()
    assert not rows_for(run, "aten::addmm").empty


def test_transpose_reshape_copy_ops_carry_the_exact_line(transpose_run):
    path, run = transpose_run
    line = line_of(path, "# the copy")
    where = f"{path.name}:{line}"
    for op in ("aten::reshape", "aten::clone", "aten::_unsafe_view"):
        rows = rows_for(run, op)
        assert not rows.empty, op
        assert all(loc.endswith(where) for loc in rows["source_location"]), (op, rows["source_location"].tolist())
    # the copy_ that does the work sits under reshape -> clone; addmm's bias copy_ is on the Linear's line
    ev = run.to_pandas("events")
    reshapes = ev.index[ev["name"] == "aten::reshape"].tolist()
    copies = ev[(ev["name"] == "aten::copy_")]
    under = [i for i in copies.index if ev.at[ev.at[i, "parent"], "name"] == "aten::clone"
             and ev.at[ev.at[ev.at[i, "parent"], "parent"], "name"] == "aten::reshape"]
    assert len(under) == len(reshapes) == 2  # one per profiled step
    assert all(ev.at[i, "source_location"].endswith(where) for i in under)
    # the transpose itself (a view) is on the same line; the linear on its own line
    tr = rows_for(run, "aten::transpose")
    tr = tr[tr["input_dims"].str.startswith("[[2, 32, 4, 16]")]
    assert len(tr) == 1 and tr["source_location"].iloc[0].endswith(where)
    proj_line = line_of(path, "self.proj(q)")
    assert all(x.endswith(f":{proj_line}") for x in rows_for(run, "aten::addmm")["source_location"])
    relu_line = line_of(path, "torch.relu(x)")
    assert all(x.endswith(f":{relu_line}") for x in rows_for(run, "aten::relu")["source_location"])


def test_every_profiled_step_is_joined(transpose_run):
    _, run = transpose_run
    ev = run.to_pandas("events")
    rows = ev[ev["is_row"] & (ev["step"] >= 0)]
    assert (rows["source_location"] != "").all()
    assert sorted(rows["step"].unique()) == [0, 1]


CONV_TRAIN = """
    import torch
    import torch.nn as nn

    def get_model():
        torch.manual_seed(0)
        return nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(8 * 8 * 8, 10),
        )

    def get_inputs():
        return [torch.randn(2, 3, 8, 8)]
"""


@pytest.fixture(scope="module")
def train_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("train")
    path = write_model(folder, CONV_TRAIN)
    run, _ = profile_target(ProfileOptions(target=path, out=folder / "run", mode="train", **FAST))
    return path, run


def test_train_mode_shows_backward_ops(train_run):
    _, run = train_run
    ops = set(run.to_pandas()["op"])
    assert {"aten::convolution_backward", "aten::threshold_backward"} <= ops
    assert run.meta["mode"] == "train"


def test_backward_ops_point_at_their_forward_line(train_run):
    path, run = train_run
    # nn.Sequential runs its layers inside torch, so no user frame is on the stack when the conv runs:
    # its ops point at the line that created the Conv2d.
    fwd = rows_for(run, "aten::convolution")
    assert not fwd.empty
    fwd_loc = set(fwd["source_location"])
    assert fwd_loc == {f"{path.name}:{line_of(path, 'nn.Conv2d(')}"} or all(
        x.endswith(f"{path.name}:{line_of(path, 'nn.Conv2d(')}") for x in fwd_loc)
    relu_line = line_of(path, "nn.ReLU()")
    assert all(x.endswith(f":{relu_line}") for x in rows_for(run, "aten::relu")["source_location"])
    bwd = rows_for(run, "aten::convolution_backward")
    assert set(bwd["source_location"]) == fwd_loc
    relu_fwd = set(rows_for(run, "aten::threshold_backward")["source_location"])
    assert relu_fwd == set(rows_for(run, "aten::relu")["source_location"])


def test_harness_ops_are_labelled(train_run):
    _, run = train_run
    ev = run.to_pandas("events")
    # the SGD step's parameter updates and the loss are the harness's own
    harness_ops = set(ev.loc[ev["source_location"] == HARNESS, "name"])
    assert harness_ops, "expected the loss/optimizer ops to be labelled opscope:harness"
    assert "aten::sum" in harness_ops or "aten::ones_like" in harness_ops
    assert all(f["source_location"] != HARNESS for f in run.findings)


def test_backward_line_in_a_user_forward(tmp_path):
    path = write_model(tmp_path, """
        import torch

        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.w = torch.nn.Parameter(torch.randn(16, 16))

            def forward(self, x):
                h = torch.tanh(x @ self.w)  # forward line
                return h * 2.0

        def get_inputs():
            return [torch.randn(4, 16)]
    """)
    run, _ = profile_target(ProfileOptions(target=path, out=tmp_path / "run", mode="train", **FAST))
    line = line_of(path, "# forward line")
    tanh_bwd = rows_for(run, "aten::tanh_backward")
    assert not tanh_bwd.empty
    assert all(x.endswith(f"{path.name}:{line}") for x in tanh_bwd["source_location"])
    mm = rows_for(run, "aten::mm")
    assert not mm.empty and all(x.endswith(f"{path.name}:{line}") for x in mm["source_location"])


def test_a_compiled_model_gets_no_warning_about_opscopes_hooks():
    """torch.compile'd models warned on each call that global hooks (opscope's module tracking) fire an
    extra time for their wrapper; the warning reached the user in the middle of the progress bar."""
    import warnings

    import torch

    from opscope.capture.lines import module_stack

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    compiled = torch.compile(model, backend="eager")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with module_stack(compiled) as current:
            compiled(torch.randn(2, 4))
            assert current() == ("", "")
        warnings.warn("the user's own warning", UserWarning, stacklevel=1)
    messages = [str(w.message) for w in caught]
    assert not any("global hooks" in m for m in messages), messages
    assert "the user's own warning" in messages  # only that one warning is silenced, only while tracking
