"""The block `opscope profile` embeds in its saved trace (opscope.analysis.annotations), on a hand-built
event table: which ops it keeps, its string table, and the round trip embed -> load_trace -> read_block ->
embedded_lines."""

from __future__ import annotations

import gzip
import json

from conftest import TRACES
from opscope.analysis.annotations import embed, embedded_lines, make_block, read_block
from opscope.analysis.memory import MemoryProfile
from opscope.trace.reader import load_trace

# ext_id 5 twice (not unique: left out), -1 (no id: left out), 9 with nothing to say (left out)
EVENTS = {
    "ext_id": [3, 5, 5, -1, 9, 4],
    "source_location": ["m.py:10", "m.py:11", "m.py:11", "m.py:12", "", "m.py:10"],
    "module": ["fc", "fc", "fc", "", "", ""],
    "module_class": ["Linear", "Linear", "Linear", "", "", ""],
    "dispatch_input_types": ["", "", "", "", "", "[TensorList(float)]"],
}


def test_the_block_keeps_ops_with_a_unique_id_and_something_to_say():
    block = make_block(EVENTS, {"fc": "Linear"}, None)
    assert block["strings"] == ["", "m.py:10", "fc", "Linear", "[TensorList(float)]"]
    assert block["ops"] == {"external_id": [3, 4], "source_location": [1, 1], "module": [2, 0],
                            "module_class": [3, 0], "input_types": [0, 4]}
    assert block["module_classes"] == {"fc": "Linear"} and "memory" not in block


def test_embedded_block_round_trip(tmp_path):
    """Embedded into a real trace, the block is read back by load_trace and maps its ops by External id."""
    doc = json.loads(gzip.decompress((TRACES / "h100_bert-small_bf16.json.gz").read_bytes()))
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(doc))
    trace = load_trace(path)
    ids = [x for x in trace.ops["ext_id"] if x >= 0][:3]
    n = len(trace.ops["ext_id"])
    ev = {"ext_id": trace.ops["ext_id"], "source_location": [""] * n, "module": [""] * n,
          "module_class": [""] * n, "dispatch_input_types": [""] * n}
    rows = [trace.ops["ext_id"].index(x) for x in ids]
    ev["source_location"][rows[0]] = "model.py:3"
    ev["module"][rows[1]], ev["module_class"][rows[1]] = "encoder.layer.0", "BertLayer"
    ev["dispatch_input_types"][rows[2]] = "[TensorList(c10::BFloat16)]"
    memory = MemoryProfile(per_key={("aten::mm", "[[2, 2]]", "", "", "", "model.py:3", ""): (16.0, 0.0, 1)},
                           summary={"per_step": [{"end_allocated_bytes": 16.0}]}, retained=[], steps=1)
    embed(path, make_block(ev, {"encoder.layer.0": "BertLayer"}, memory))

    again = load_trace(path)
    assert again.ops == trace.ops  # the trace's own events are untouched
    by_ext, classes, mem = read_block(again.opscope_block)
    assert classes == {"encoder.layer.0": "BertLayer"}
    assert mem.per_key == memory.per_key and mem.steps == 1
    lines = embedded_lines(by_ext, ev)
    assert dict(lines) == {rows[0]: "model.py:3"}
    assert lines.modules == {rows[1]: ("encoder.layer.0", "BertLayer")}
    assert lines.input_types == {rows[2]: "[TensorList(c10::BFloat16)]"}
