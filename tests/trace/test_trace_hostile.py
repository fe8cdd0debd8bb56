"""Hostile and damaged traces (issue 23): bombs are refused before they cost memory (item 2), a limit
too large to hold is one line (9b), duplicated events and absurd timestamps change no number (10), and
local damage (a BOM, bytes after the gzip data, NaN, a lone surrogate, string durations) costs only
what it damages, with the real problem named (13)."""

from __future__ import annotations

import gzip
import json
import random
import tracemalloc
import zlib
from pathlib import Path

import pytest

from conftest import TRACES, run_cli
from opscope.errors import TraceError
from opscope.table import nrows
from opscope.trace.reader import load_trace, read_bytes

BERT = TRACES / "h100_bert-small_bf16.json.gz"
PEAKS = ("--peak-bw", "3350", "--peak-flops", "989000")


def _raw() -> bytes:
    return gzip.decompress(BERT.read_bytes())


def _doc() -> dict:
    return json.loads(_raw())


def _assert_one_line_error(proc, *needles: str) -> str:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("opscope: error:"), proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _analyze(path: Path, out: Path):
    proc = run_cli("analyze", str(path), "--out", str(out), *PEAKS)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc


def _peak_traced(fn) -> int:
    """Peak bytes Python allocated while fn ran (the trace's buffer is a bytearray: it is counted)."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# --- item 2: bombs are refused before they cost memory --------------------------------------------

def _gzip_stream(path: Path, blocks, tail: bytes = b"]}") -> None:
    """One gzip member: a valid trace start, the blocks, `tail`."""
    deflate = zlib.compressobj(9, zlib.DEFLATED, 31)
    with open(path, "wb") as f:
        f.write(deflate.compress(b'{"traceEvents": ['))
        for block in blocks:
            f.write(deflate.compress(block))
        f.write(deflate.compress(tail) + deflate.flush())


def test_the_ratio_check_counts_what_the_inflater_consumed(tmp_path):
    """300 MB of spaces in one member (~300 KB), then 8 MB of incompressible data. A check against the
    bytes read (a 4 MB read-ahead) sees a ratio of 75x and lets the bomb fill memory; counted by what the
    inflater took in, it is 1000x and refused at the first check (32 MB)."""
    path = tmp_path / "bomb.json.gz"
    _gzip_stream(path, [b" " * (1 << 20)] * 300)
    with open(path, "ab") as f:
        f.write(gzip.compress(random.Random(0).randbytes(8 << 20), 1))
    errors = []

    def read() -> None:
        try:
            read_bytes(path)
        except TraceError as exc:
            errors.append(str(exc))
    peak = _peak_traced(read)
    assert errors and "expands more than 500x" in errors[0], errors
    assert peak < 100 << 20, f"{peak >> 20} MB held before the bomb was refused"
    _assert_one_line_error(run_cli("analyze", str(path), "--out", str(tmp_path / "run")), "expands more than 500x")
    assert not (tmp_path / "run").exists()


def test_padding_is_refused_whatever_its_ratio(tmp_path):
    """Spaces with a little random text in every 100 KB compress about 100x, well under the ratio limit:
    a stream that is mostly whitespace is refused as padding, compressed or not, early."""
    rng = random.Random(1)
    blocks = [b" " * 99_000 + bytes(rng.choice(b"abcdefghijklmnopqrstuvwxyz") for _ in range(1000))
              for _ in range(16)]
    path = tmp_path / "padding.json.gz"
    _gzip_stream(path, blocks * 40)  # 64 MB
    assert path.stat().st_size * MAX_RATIO_SEEN > 64_000_000
    with pytest.raises(TraceError, match="mostly whitespace"):
        read_bytes(path)
    plain = tmp_path / "padding.json"
    with open(plain, "wb") as f:
        f.write(b'{"traceEvents": [')
        for _ in range(48):
            f.write(b" " * (1 << 20))
        f.write(b"]}")
    errors = []

    def read() -> None:
        try:
            read_bytes(plain)
        except TraceError as exc:
            errors.append(str(exc))
    peak = _peak_traced(read)
    assert errors and "mostly whitespace" in errors[0], errors
    assert peak < 44 << 20  # refused once past 32 MB, before the 48 MB were read


MAX_RATIO_SEEN = 200  # the padding stream above compresses less than this (the limit is 500)


@pytest.mark.parametrize("value", ["1e308", "1e30", "inf", "nan", "0"])
def test_max_trace_gb_out_of_range_is_one_line(tmp_path, value):
    proc = run_cli("analyze", str(BERT), "--max-trace-gb", value, "--out", str(tmp_path / "run"))
    _assert_one_line_error(proc, "--max-trace-gb")
    assert "Traceback" not in proc.stderr


# --- item 10: duplicated events, absurd timestamps ---------------------------------------------------

def test_duplicated_events_are_counted_once(tmp_path):
    doc = _doc()
    once = tmp_path / "once.json"
    once.write_text(json.dumps(doc))
    doc["traceEvents"] = [e for e in doc["traceEvents"] for _ in (0, 1)]  # every event twice, as some mergers write
    twice = tmp_path / "twice.json"
    twice.write_text(json.dumps(doc))
    _analyze(once, tmp_path / "a")
    proc = _analyze(twice, tmp_path / "b")
    assert (tmp_path / "a" / "ops.csv").read_bytes() == (tmp_path / "b" / "ops.csv").read_bytes()
    a, b = (json.loads((tmp_path / x / "summary.json").read_text()) for x in "ab")
    assert a == b
    said = [line for line in proc.stderr.splitlines() if "duplicate" in line]
    assert len(said) == 1 and "exact duplicates of other events" in said[0], proc.stderr


def test_absurd_timestamps_are_skipped_and_counted(tmp_path):
    doc = _doc()
    events = doc["traceEvents"]
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    far = [ops[3], ops[40], kernels[5]]
    without = tmp_path / "without.json"
    without.write_text(json.dumps({**doc, "traceEvents": [e for e in events if all(e is not f for f in far)]}))
    ops[3]["ts"] += 1e300
    ops[40]["ts"] = -1e300
    kernels[5]["ts"] += 1e13  # 116 days late: not a profiler's clock either
    damaged = tmp_path / "damaged.json"
    damaged.write_text(json.dumps(doc))
    trace = load_trace(damaged)
    assert max(trace.ops["ts"]) < 1e300 and min(trace.ops["ts"]) > -1e300
    (line,) = [w for w in trace.warnings if "timestamp" in w]
    assert "skipped 3 events with a timestamp more than 30 days from the rest of the trace" in line
    _analyze(without, tmp_path / "a")
    _analyze(damaged, tmp_path / "b")
    a, b = (json.loads((tmp_path / x / "summary.json").read_text()) for x in "ab")
    assert a["step_time_us"] == b["step_time_us"] and a["total_time_us"] == b["total_time_us"]


# --- item 13: local damage costs only what it damages -----------------------------------------------

def test_a_utf8_bom_is_skipped(tmp_path):
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + _raw())
    trace = load_trace(path)
    assert nrows(trace.ops) == nrows(load_trace(BERT).ops) and not trace.warnings
    _analyze(path, tmp_path / "run")


def test_bytes_after_the_gzip_data_are_ignored_with_a_note(tmp_path):
    path = tmp_path / "t.json.gz"
    path.write_bytes(BERT.read_bytes() + b"trailing junk from a download")
    proc = _analyze(path, tmp_path / "run")
    assert "ignored the bytes after the end of its gzip data" in proc.stderr
    assert "damaged" not in proc.stderr
    # gzip members written one after another are one stream, as gzip reads them
    raw = _raw()
    path.write_bytes(gzip.compress(raw[:5000]) + gzip.compress(raw[5000:]))
    assert nrows(load_trace(path).ops) == nrows(load_trace(BERT).ops)
    path.write_bytes(BERT.read_bytes()[:-5000])
    _assert_one_line_error(run_cli("analyze", str(path), "--out", str(tmp_path / "cut")), "cut short")


def _first_op_dur(raw: bytes) -> tuple[int, int]:
    """Start and end of the first cpu_op's duration value in the trace's text."""
    i = raw.index(b'"dur": ', raw.index(b'"cat": "cpu_op"')) + len(b'"dur": ')
    return i, raw.index(b",", i)


def test_nan_and_infinity_cost_only_their_events(tmp_path):
    """Python's json writes float('nan') as NaN, which JSON has not: each such value is read as null (an
    event that needs the number is skipped and counted; a field that may be absent is absent), and text
    that spells NaN inside a string stays as it was."""
    raw = _raw()
    i, j = _first_op_dur(raw)
    doc_text = raw[:i] + b"NaN" + raw[j:]
    doc = json.loads(doc_text)  # Python reads NaN; opscope must read the rest as it would
    events = doc["traceEvents"]
    names = [e for e in events if e.get("cat") == "user_annotation"]
    names[0]["name"] = 'a: NaN, "b": Infinity]'  # NaN-like text inside strings
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    ops[7]["args"]["kernel_flop"] = float("nan")  # an optional field
    ops[8]["args"]["kernel_num_gb"] = float("-inf")
    path = tmp_path / "nan.json"
    path.write_text(json.dumps(doc))  # allow_nan: NaN, -Infinity
    data = bytearray(path.read_bytes())
    kept = bytes(data)
    trace = load_trace(path, data=data)  # not owned: repaired in a copy
    assert bytes(data) == kept
    assert nrows(trace.ops) == len(ops) - 1  # only the op whose duration was NaN
    assert 'a: NaN, "b": Infinity]' in trace.annotations["name"]
    assert any("read 3 NaN/Infinity values as null" in w for w in trace.warnings), trace.warnings
    assert any("skipped 1 malformed events" in w and "$.dur" in w for w in trace.warnings), trace.warnings
    _analyze(path, tmp_path / "run")


def test_a_lone_surrogate_costs_one_character(tmp_path):
    doc = _doc()
    ops = [e for e in doc["traceEvents"] if e.get("cat") == "cpu_op"]
    ops[2]["args"]["Call stack"] = "model.py(3): forward\ud800"  # json.dumps writes it as an escape
    ops[4]["name"] = "aten::\udc00odd"
    path = tmp_path / "surrogate.json"
    path.write_text(json.dumps(doc))
    trace = load_trace(path)
    assert nrows(trace.ops) == len(ops)
    assert "aten::\ufffdodd" in trace.ops["name"]
    assert any("read 2 lone UTF-16 surrogate escapes" in w for w in trace.warnings), trace.warnings
    _analyze(path, tmp_path / "run")


def test_string_durations_name_the_real_problem(tmp_path):
    doc = _doc()
    for e in doc["traceEvents"]:
        if "dur" in e:
            e["dur"] = str(e["dur"])
    path = tmp_path / "strings.json"
    path.write_text(json.dumps(doc))
    line = _assert_one_line_error(run_cli("analyze", str(path), "--out", str(tmp_path / "run")), "malformed")
    assert "got `str`" in line and "$.dur" in line


def test_json_damage_that_is_not_local_is_named_with_its_place(tmp_path):
    raw = _raw()
    i, _ = _first_op_dur(raw)
    path = tmp_path / "bad.json"
    path.write_bytes(raw[:i] + b"@" + raw[i:])
    line = _assert_one_line_error(run_cli("analyze", str(path), "--out", str(tmp_path / "run")), "invalid JSON")
    line_number = raw[:i].count(b"\n") + 1
    assert f"line {line_number:,}" in line
