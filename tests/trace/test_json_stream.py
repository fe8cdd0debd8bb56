"""The streaming split of a trace's events (opscope.trace.json_stream): windows of whole events, cut
where the decoder proves the cut, the same events and keys as a decode of the whole text."""

from __future__ import annotations

import gzip
import json
import random

import msgspec
import pytest

from opscope.trace import json_stream
from opscope.trace.json_stream import NotStreamable, split_array
from opscope.trace.reader import load_trace, read_bytes
from tests.conftest import TRACES

_RAWS = msgspec.json.Decoder(list[msgspec.Raw])


def _split(text: bytes, chunk: int) -> tuple[list[bytes], bytes]:
    chunks = iter([text[i:i + chunk] for i in range(0, len(text), chunk)])
    gen = split_array(chunks, b"traceEvents", _RAWS.decode, msgspec.json.decode)
    events: list[bytes] = []
    while True:
        try:
            events.extend(bytes(raw) for raw in next(gen))
        except StopIteration as stop:
            return events, stop.value


HOSTILE_EVENTS = [
    {"ph": "X", "name": 'a "},{" in a name', "args": {"x": [{"y": 1}, {"z": "}, {"}]}, "ts": 1},
    {"ph": "X", "name": "\\}", "args": {"Input Dims": [[1, 2], []]}},
    {"ph": "i", "name": "[memory]", "args": {}},
    {"ph": "X", "name": "x" * 300, "args": {"nested": {"deeper": {"}": "{"}}}},
    {"ph": "X", "name": "é ☃ \u2028", "ts": 2.5},
]


@pytest.mark.parametrize("window", [16, 64, 1000, 1 << 20])
@pytest.mark.parametrize("chunk", [1, 7, 4096])
def test_hostile_events_split_as_a_whole_decode(monkeypatch, window, chunk):
    monkeypatch.setattr(json_stream, "WINDOW", window)
    doc = {"schemaVersion": 1, "deviceProperties": [{"name": '"traceEvents": ['}],
           "traceEvents": HOSTILE_EVENTS * 5, "traceName": "t", "after": {"list": [1, [2]]}}
    for indent in (None, 2):
        text = json.dumps(doc, indent=indent, ensure_ascii=False).encode()
        events, top = _split(text, chunk)
        assert [json.loads(e) for e in events] == doc["traceEvents"]
        assert json.loads(top) == {**doc, "traceEvents": []}


def test_the_array_format_and_an_empty_array(monkeypatch):
    monkeypatch.setattr(json_stream, "WINDOW", 32)
    events, top = _split(b"\xef\xbb\xbf [" + b",".join(json.dumps(e).encode() for e in HOSTILE_EVENTS) + b"]\n", 5)
    assert [json.loads(e) for e in events] == HOSTILE_EVENTS and top == b"[]"
    events, top = _split(b'{"traceEvents": [ ], "x": 1}', 3)
    assert events == [] and json.loads(top) == {"traceEvents": [], "x": 1}


@pytest.mark.parametrize("text", [
    b'{"traceEvents": [{"a": NaN}, {"b": 1}]}',   # not JSON: the whole-text reader repairs it
    b'{"traceEvents": [{"a": 1}, {"b": 1}',        # cut short
    b'{"traceEvents": [1, 2, 3]}',                 # no objects to cut after
    b'{"other": {"traceEvents": [{"a": 1}]}}',     # the key only in a nested object
    b'"a string"',
])
def test_what_cannot_be_split_says_so(text):
    with pytest.raises(NotStreamable):
        _split(text, 4)


def test_a_real_trace_streams_to_the_tables_of_a_whole_decode(monkeypatch):
    monkeypatch.setattr(json_stream, "WINDOW", 50_000)  # many windows, and cuts near every boundary
    path = TRACES / "h100_vit-image-classifier_bf16.json.gz"
    seen: list[int] = []
    streamed = load_trace(path, on_events=seen.append)
    whole = load_trace(path, data=read_bytes(path), owned=True)
    assert len(seen) > 10 and seen == sorted(seen) and seen[-1] == whole.n_events == streamed.n_events
    for table in ("ops", "kernels", "launches", "steps", "python", "annotations", "modules", "memory"):
        assert repr(getattr(streamed, table)) == repr(getattr(whole, table)), table
    assert streamed.device_properties == whole.device_properties
    assert streamed.warnings == whole.warnings


def test_a_trace_that_needs_repairs_is_read_whole(tmp_path):
    doc = json.loads(gzip.decompress((TRACES / "h100_bert-small_bf16.json.gz").read_bytes()))
    random.Random(0).shuffle(doc["traceEvents"])
    text = json.dumps(doc).replace('"dur": ', '"dur": NaN, "x": ', 1)  # Python's json writes NaN
    (tmp_path / "t.json").write_text(text)
    trace = load_trace(tmp_path / "t.json")
    assert any("NaN" in line for line in trace.warnings)
    assert trace.n_events == len(doc["traceEvents"])
