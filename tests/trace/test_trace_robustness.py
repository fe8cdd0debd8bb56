"""Traces are validated as data (issue: robust against everything a trace can throw): a malformed or
wrong-typed event is skipped and counted, absurd durations and shapes are excluded with a warning, a
file that is not a trace is one clean error (exit 2, one line), decompression is bounded, pipes are
read once. The fuzz test corrupts the shared traces at random and accepts only exit 0 or a one-line
exit 2."""

from __future__ import annotations

import copy
import gzip
import json
import math
import random
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import pytest

from conftest import TRACES, run_cli
from opscope.analysis.trace_file import analyze_trace_file
from opscope.errors import OpscopeError, TraceError
from opscope.table import Packed, nrows
from opscope.trace.reader import load_trace, read_bytes

BERT = TRACES / "h100_bert-small_bf16.json.gz"
BERT_ROCM = TRACES / "mi300x_bert-small_bf16.json.gz"


def _doc(path: Path = BERT) -> dict:
    return json.loads(gzip.decompress(path.read_bytes()))


def _write(tmp_path: Path, doc: dict | bytes | str, name: str = "t.json") -> Path:
    path = tmp_path / name
    data = doc if isinstance(doc, bytes) else (doc if isinstance(doc, str) else json.dumps(doc)).encode()
    path.write_bytes(gzip.compress(data, 1) if name.endswith(".gz") else data)
    return path


def _first(doc: dict, cat: str) -> dict:
    return next(e for e in doc["traceEvents"] if isinstance(e, dict) and e.get("cat") == cat)


def _assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("opscope: error:"), proc.stderr
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


# --- one wrong-typed field anywhere: the event is skipped and counted, the run completes ----------

def _set(path: tuple, value):
    def edit(doc: dict) -> None:
        target = _first(doc, path[0])
        for key in path[1:-1]:
            target = target[key]
        target[path[-1]] = value
    return edit


def _insert_bare_number(doc: dict) -> None:
    doc["traceEvents"].insert(3, 7)


def _args_list(doc: dict) -> None:
    _first(doc, "kernel")["args"] = [1, 2]


MALFORMED = {
    "name null": _set(("cpu_op", "name"), None),
    "ts as a string": _set(("cpu_op", "ts"), "12.5"),
    "pid 1.5": _set(("kernel", "pid"), 1.5),
    "args a list": _args_list,
    "a bare number as an event": _insert_bare_number,
    "ts 1e400": _set(("cpu_op", "ts"), "__HUGE__"),
    "Input Dims 7": _set(("cpu_op", "args", "Input Dims"), 7),
    "External id 2**70": _set(("kernel", "args", "External id"), 2**70),
    "correlation 2**64 - 1": _set(("cuda_runtime", "args", "correlation"), 2**64 - 1),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_one_wrong_typed_field_is_skipped_and_counted(tmp_path, case):
    doc = _doc()
    MALFORMED[case](doc)
    text = json.dumps(doc).replace('"__HUGE__"', "1e400")
    path = _write(tmp_path, text)
    proc = run_cli("analyze", str(path), "--out", str(tmp_path / "run"), "--json", "--peak-bw", "3350",
                   "--peak-flops", "989000")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["total_time_us"] > 0
    assert (tmp_path / "run" / "ops.csv").exists()
    expected = {"Input Dims 7": 'unusable "Input Dims"', "External id 2**70": "id out of the 64-bit range",
                "correlation 2**64 - 1": "id out of the 64-bit range"}.get(case, "skipped 1 malformed events")
    assert expected in proc.stderr, proc.stderr


def test_negative_and_absurd_durations_are_excluded_with_a_count(tmp_path):
    doc = _doc()
    ops = [e for e in doc["traceEvents"] if isinstance(e, dict) and e.get("cat") == "cpu_op"]
    ops[5]["dur"] = -3.0
    ops[6]["dur"] = 1e18
    ops[7]["dur"] = -0.5
    trace = load_trace(_write(tmp_path, doc))
    assert nrows(trace.ops) == len(ops) - 3
    (line,) = [w for w in trace.warnings if "duration" in w]
    assert "skipped 3 events with a negative or absurd duration" in line


def test_absurd_shapes_are_ignored_with_a_count(tmp_path):
    doc = _doc()
    ops = [e for e in doc["traceEvents"] if isinstance(e, dict) and e.get("cat") == "cpu_op"
           and e["args"].get("Input Dims")]
    ops[0]["args"]["Input Dims"] = [[-4, 8]]
    ops[1]["args"]["Input Dims"] = [[2**40, 2**40]]
    trace = load_trace(_write(tmp_path, doc))
    assert trace.ops["input_dims"].count("") >= 2
    assert any('2 events with an unusable "Input Dims"' in w for w in trace.warnings), trace.warnings


def test_wrong_typed_metadata_does_not_sink_the_trace(tmp_path):
    doc = _doc()
    doc["deviceProperties"] = [{"name": 12}, "x"]
    doc["distributedInfo"] = 5
    doc["torch_version"] = ["2.6"]
    trace = load_trace(_write(tmp_path, doc))
    assert trace.device_properties == [{}]
    assert trace.torch_version is None and trace.distributed is None
    assert any("deviceProperties" in w for w in trace.warnings)


def test_json_array_format_is_read(tmp_path):
    events = _doc()["traceEvents"]
    trace = load_trace(_write(tmp_path, json.dumps(events)))
    assert nrows(trace.ops) == sum(1 for e in events if e.get("cat") == "cpu_op" and e.get("ph") == "X")


def test_tables_hold_python_values_of_one_type_per_column(tmp_path):
    """TraceData's tables are lists of Python values: pids/tids always ints (a string, or an int past 64
    bits, becomes its hash), times floats (a JSON int too), missing inductor numbers NaN; a step recorded
    both as an annotation and as a cpu_op is one step, steps in time order."""
    big = 2**70

    def x(name: str, ts: int, dur: int, cat: str = "cpu_op", pid: int | str = 1, tid: int | str = 1, **args) -> dict:
        return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}

    events = [x("ProfilerStep#1", 100, 50, "user_annotation"), x("ProfilerStep#1", 100, 50),
              x("ProfilerStep#0", 0, 50, "user_annotation", pid="Spans", tid=big),
              x("aten::mm", 10, 5, pid="Spans", tid=big, **{"External id": 3}),
              x("aten::add", 110, 5, tid=2, **{"Sequence number": 7}),
              x("my_range", 20, 5, "user_annotation", pid="Spans")]
    trace = load_trace(_write(tmp_path, json.dumps({"traceEvents": events})))
    ops = trace.ops
    assert list(ops) == ["name", "pid", "tid", "input_dims", "input_dtypes", "input_strides", "concrete_inputs",
                         "call_stack", "ts", "dur", "ext_id", "seq", "fwd_tid", "kernel_backend", "kernel_flop",
                         "kernel_num_gb", "kernel_file"]
    assert ops["name"] == ["aten::mm", "aten::add"]
    assert ops["pid"] == [hash("Spans"), 1] and ops["tid"] == [hash(big), 2]
    assert ops["ts"] == [10.0, 110.0] and all(type(v) is float for v in ops["ts"] + ops["dur"])
    assert (ops["ext_id"], ops["seq"], ops["fwd_tid"]) == ([3, -1], [-1, 7], [-1, -1])
    assert ops["kernel_backend"] == ["", ""] and all(math.isnan(v) for v in ops["kernel_flop"] + ops["kernel_num_gb"])
    assert trace.steps == {"step": [0, 1], "pid": [hash("Spans"), 1], "tid": [hash(big), 1], "ts": [0.0, 100.0],
                           "dur": [50.0, 50.0]}
    assert trace.annotations == {"name": ["my_range"], "pid": [hash("Spans")], "tid": [1], "ts": [20.0], "dur": [5.0]}
    assert trace.kernels["name"] == [] and not trace.has_gpu and not trace.gpu_only
    assert list(trace.memory) == ["pid", "tid", "ts", "bytes", "addr", "total_allocated", "device_type", "device_id"]


def test_equal_durations_and_memory_numbers_are_one_object(tmp_path):
    """A trace repeats a few thousand durations and memory sizes over millions of events: the tables hold no
    object per row (a Coded column one per distinct value; a Packed one, as here where -0.0 and 0.0 are both
    durations, none), with each value's type and sign kept (-0.0 stays -0.0; an int duration is a float)."""
    def x(name: str, ts: float, dur: float) -> dict:
        return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur}

    def mem(ts: float, size: float, addr: int, total: float) -> dict:
        return {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": ts,
                "args": {"Bytes": size, "Addr": addr, "Total Allocated": total, "Device Type": 0, "Device Id": -1}}

    events = [x("aten::a", 0, 2.5), x("aten::b", 10, 2.5), x("aten::c", 20, -0.0), x("aten::d", 30, 0),
              x("aten::e", 40, 2.5), x("aten::f", 50, 3),
              mem(1, 4096, 140000000000, 8192), mem(2, 4096, 140000000000, 8192), mem(3, -4096, 140000000000, 4096)]
    trace = load_trace(_write(tmp_path, json.dumps({"traceEvents": events})))  # -0.0 is written "-0.0"
    dur = trace.ops["dur"]
    assert dur == [2.5, 2.5, 0.0, 0.0, 2.5, 3.0] and all(type(d) is float for d in dur)
    assert isinstance(dur, Packed)
    assert math.copysign(1.0, dur[2]) == -1.0 and math.copysign(1.0, dur[3]) == 1.0
    m = trace.memory
    assert m["bytes"] == [4096.0, 4096.0, -4096.0] and m["bytes"][0] is m["bytes"][1]
    assert m["addr"][0] is m["addr"][1] is m["addr"][2] and m["addr"][0] == 140000000000
    assert m["total_allocated"][0] is m["total_allocated"][1]


# --- whole files that are not traces: one clean line ---------------------------------------------

@pytest.mark.parametrize("content,needle", [
    (b"\x00" * 100_000, "not JSON"),
    (b"PK\x03\x04 a zip file", "not JSON"),
    (b"\xff\xfe{\x00", "not JSON"),
    (b"", "empty"),
    (b"   \n", "empty"),
    (b'{"traceEvents": [', "truncated or invalid JSON"),
    (b'{"traceEvents": 5}', "not a torch.profiler trace"),
    (b'{"other": 1}', "no 'traceEvents'"),
    (b"[1, 2, 3]", "no operator"),
    (b"\x1f\x8b\x08\x00garbage", "damaged gzip"),
])
def test_files_that_are_not_traces_give_one_line(tmp_path, content, needle):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    proc = run_cli("analyze", str(path), "--out", str(tmp_path / "run"))
    _assert_one_line_error(proc, needle)
    assert not (tmp_path / "run").exists()


def test_a_huge_file_of_zeros_is_rejected_from_its_first_bytes(tmp_path):
    path = tmp_path / "zeros.json"
    with open(path, "wb") as f:  # 2 GB, sparse: nothing is written to disk
        f.truncate(2 << 30)
    probe = textwrap.dedent(f"""
        import resource, subprocess, sys, time
        t = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "opscope", "analyze", {str(path)!r}, "--out", {str(tmp_path / "r")!r}],
                           capture_output=True, text=True)
        print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, p.stderr.strip())
    """)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    code, rss_kb, message = out.split(" ", 2)
    assert code == "2" and "not JSON" in message
    assert int(rss_kb) < 1_000_000  # read the first bytes only, never the 2 GB


def _bomb(tmp_path: Path, decompressed_mb: int) -> Path:
    """A gzip stream of `decompressed_mb` MB of JSON whitespace after a valid start, built from
    concatenated gzip members (a few KB each on disk)."""
    mb = gzip.compress(b" " * (1 << 20), 9)
    path = tmp_path / "bomb.json.gz"
    with open(path, "wb") as f:
        f.write(gzip.compress(b'{"traceEvents": ['))
        for _ in range(decompressed_mb):
            f.write(mb)
        f.write(gzip.compress(b"]}"))
    return path


def test_decompression_is_bounded_by_max_trace_gb(tmp_path):
    path = _bomb(tmp_path, 300)
    assert path.stat().st_size < 1_000_000
    # a limit below the size at which the bomb checks start (32 MB), so the limit is what refuses it
    with pytest.raises(TraceError, match="max-trace-gb"):
        read_bytes(path, max_bytes=20_000_000)
    proc = run_cli("analyze", str(path), "--max-trace-gb", "0.02", "--out", str(tmp_path / "run"))
    _assert_one_line_error(proc, "--max-trace-gb")


def test_a_gzip_bomb_is_refused_by_its_expansion_ratio(tmp_path):
    path = _bomb(tmp_path, 300)  # 300 MB from < 1 MB: > 500x; the default limit alone would allow it
    with pytest.raises(TraceError, match="expands more than 500x"):
        read_bytes(path)


def test_max_trace_gb_must_be_positive(tmp_path):
    proc = run_cli("analyze", str(BERT), "--max-trace-gb", "-1", "--out", str(tmp_path / "run"))
    _assert_one_line_error(proc, "--max-trace-gb")


def test_a_piped_trace_is_read_once(tmp_path):
    raw = gzip.decompress(BERT.read_bytes())
    proc = subprocess.run([sys.executable, "-m", "opscope", "analyze", "/dev/stdin", "--out", str(tmp_path / "run"),
                           "--json", "--peak-bw", "3350", "--peak-flops", "989000"],
                          input=raw, capture_output=True)
    assert proc.returncode == 0, proc.stderr.decode()
    assert json.loads(proc.stdout)["total_time_us"] > 0
    assert gzip.decompress((tmp_path / "run" / "trace.json.gz").read_bytes()) == raw
    gz = subprocess.run([sys.executable, "-m", "opscope", "analyze", "/dev/stdin", "--out", str(tmp_path / "run2"),
                         "--peak-bw", "3350", "--peak-flops", "989000"],
                        input=BERT.read_bytes(), capture_output=True)
    assert gz.returncode == 0, gz.stderr.decode()
    assert gzip.decompress((tmp_path / "run2" / "trace.json.gz").read_bytes()) == raw


# --- the fuzz test -------------------------------------------------------------------------------

_BAD_VALUES = [None, "x", 1.5, [], {}, 7, -5, "__HUGE__", 2**70, True, "[[1,2]", [[-1, 3]], [[2**40, 2**40]]]


def _mutate(doc: dict, rng: random.Random) -> bytes:
    doc = copy.deepcopy(doc)
    events = doc["traceEvents"]
    for _ in range(rng.randint(1, 6)):
        kind = rng.choice(["type", "drop", "dup", "args", "bare", "meta"])
        e = rng.choice(events)
        if kind == "type" and isinstance(e, dict) and e:
            e[rng.choice(list(e))] = rng.choice(_BAD_VALUES)
        elif kind == "drop" and isinstance(e, dict) and e:
            e.pop(rng.choice(list(e)))
        elif kind == "dup":
            events.insert(rng.randrange(len(events)), copy.deepcopy(e))
        elif kind == "args" and isinstance(e, dict) and isinstance(e.get("args"), dict) and e["args"]:
            e["args"][rng.choice(list(e["args"]))] = rng.choice(_BAD_VALUES)
        elif kind == "bare":
            events.insert(rng.randrange(len(events)), rng.choice(_BAD_VALUES))
        elif kind == "meta":
            doc[rng.choice(["deviceProperties", "distributedInfo", "torch_version"])] = rng.choice(_BAD_VALUES)
    return json.dumps(doc).replace('"__HUGE__"', "1e400").encode()


def _corrupt(data: bytes, rng: random.Random) -> bytes:
    if rng.random() < 0.5:
        return data[: rng.randrange(len(data))]
    buf = bytearray(data)
    for _ in range(rng.randint(1, 20)):
        buf[rng.randrange(len(buf))] = rng.randrange(256)
    return bytes(buf)


def _fuzzed(seed: int, docs: list[dict]) -> bytes:
    rng = random.Random(seed)
    doc = docs[seed % len(docs)]
    data = _mutate(doc, rng) if seed % 3 else _corrupt(json.dumps(doc).encode(), rng)
    if rng.random() < 0.3:  # damage the compressed stream too
        return _corrupt(gzip.compress(data, 1), rng)
    return gzip.compress(data, 1) if rng.random() < 0.5 else data


FUZZ_SEEDS = 300


@pytest.mark.slow
def test_fuzzed_traces_never_give_a_traceback(tmp_path):
    """In process, for speed: every outcome is a run or an OpscopeError (the CLI's one-line exit 2)."""
    docs = [_doc(BERT), _doc(BERT_ROCM)]
    outcomes = {"ok": 0, "error": 0}
    for seed in range(FUZZ_SEEDS):
        path = tmp_path / f"t{seed}.json"
        path.write_bytes(_fuzzed(seed, docs))
        try:
            analyze_trace_file(path, out=tmp_path / f"run{seed}", peak_bw=3350.0, peak_flops=["989000"])
            outcomes["ok"] += 1
        except OpscopeError as exc:
            assert "\n" not in str(exc)
            outcomes["error"] += 1
        except Exception as exc:  # noqa: BLE001
            pytest.fail(f"seed {seed}: {type(exc).__name__}: {exc}")
    assert outcomes["ok"] > 50 and outcomes["error"] > 20, outcomes  # both kinds of outcome are exercised


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 5, 6, 9, 12])
def test_fuzzed_traces_through_the_cli(tmp_path, seed):
    """The same corruption through a real subprocess: exit 0, or exit 2 with one line and no traceback."""
    path = tmp_path / "t.json"
    path.write_bytes(_fuzzed(seed, [_doc(BERT), _doc(BERT_ROCM)]))
    proc = run_cli("analyze", str(path), "--out", str(tmp_path / "run"), "--peak-bw", "3350", "--peak-flops", "989000")
    assert "Traceback" not in proc.stderr
    if proc.returncode == 0:
        assert (tmp_path / "run" / "summary.json").exists()
    else:
        _assert_one_line_error(proc)
        assert not (tmp_path / "run").exists()


def test_zlib_errors_are_clean(tmp_path):
    path = tmp_path / "t.json.gz"
    good = gzip.compress(gzip.decompress(BERT.read_bytes()))
    path.write_bytes(good[:20] + zlib.compress(b"x")[2:] + good[40:])
    with pytest.raises(TraceError):
        read_bytes(path)
