"""The baseline file: a small versioned JSON file written atomically, read back checked and capped."""

from __future__ import annotations

import json

import pytest
from gate_helpers import synthetic

from opscope.errors import OpscopeError
from opscope.gating import baseline as bl


def test_a_baseline_round_trips(tmp_path):
    samples = synthetic(3, seed=1)
    path = bl.save_baseline(samples, "main", tmp_path / "baselines")
    assert path == tmp_path / "baselines" / "main.json"
    assert [p.name for p in path.parent.iterdir()] == ["main.json"]  # no temporary file left
    doc = json.loads(path.read_text())
    assert doc["format"] == "opscope-baseline" and doc["format_version"] == bl.FORMAT_VERSION
    back = bl.load_baseline("main", tmp_path / "baselines")
    assert back.name == "main" and len(back.samples.runs) == 3
    assert back.samples.step_times_us[0][0] == pytest.approx(samples.step_times_us[0][0], abs=0.01)
    assert path.stat().st_size < 20_000


def test_bad_baselines_are_one_line_errors(tmp_path):
    with pytest.raises(OpscopeError, match="no baseline 'main'"):
        bl.load_baseline("main", tmp_path)
    with pytest.raises(OpscopeError, match="baseline name"):
        bl.baseline_path("../etc/passwd", tmp_path)
    (tmp_path / "other.json").write_text('{"format": "something-else", "format_version": 1}')
    with pytest.raises(OpscopeError, match="not an opscope baseline"):
        bl.load_baseline("other", tmp_path)
    (tmp_path / "newer.json").write_text('{"format": "opscope-baseline", "format_version": 99}')
    with pytest.raises(OpscopeError, match="newer than this opscope"):
        bl.load_baseline("newer", tmp_path)
    (tmp_path / "cut.json").write_text('{"format": "opscope-baseline", "format_version": 1, "name": "cut", "samp')
    with pytest.raises(OpscopeError, match="damaged"):
        bl.load_baseline("cut", tmp_path)
    (tmp_path / "typed.json").write_text('{"format": "opscope-baseline", "name": "x", "samples": {"ops": 3}}')
    with pytest.raises(OpscopeError, match="damaged"):
        bl.load_baseline("typed", tmp_path)


def test_an_oversized_file_is_refused_without_reading_it_all(tmp_path, monkeypatch):
    monkeypatch.setattr(bl, "MAX_BASELINE_BYTES", 1000)
    (tmp_path / "big.json").write_text('{"format": "opscope-baseline", "pad": "' + "x" * 5000 + '"}')
    with pytest.raises(OpscopeError, match="over"):
        bl.load_baseline("big", tmp_path)
