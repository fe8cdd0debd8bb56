"""Run files are byte-identical to the golden ones (tests/golden.py) on every real trace and Nsight file in
tests/fixtures: the shared H100/MI300X/SGLang GPU traces, CPU traces, torch.compile traces, DDP ranks and
their merge, H200 traces, `opscope profile` traces with their embedded lines, an ncu CSV alone and attached
to a trace, and an nsys export. The goldens were written by the code before the issue-22 reshaping
(commit 1c8556b): a refactor that changes any number, text or column fails here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from golden import GOLDEN, analyze, cases, digest

EXPECTED = json.loads(GOLDEN.read_text())


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("golden")


@pytest.fixture(scope="module")
def all_cases(work) -> dict[str, list[str]]:
    return cases(work)


def test_every_case_has_a_golden(all_cases):
    assert sorted(all_cases) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_run_files_are_the_golden_ones(name, all_cases, work):
    run = work / "runs" / name.replace("/", "_")
    proc = analyze(all_cases[name], run)
    assert proc.returncode == 0, proc.stderr
    got = digest(run)
    changed = sorted(f for f in set(got) | set(EXPECTED[name]) if got.get(f) != EXPECTED[name].get(f))
    assert not changed, f"{name}: {changed} differ from tests/fixtures/golden/run_files.json"
