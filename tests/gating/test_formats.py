"""The gate's output formats: the Markdown renders as one table, the JUnit XML parses with a failing
testcase per regression, JSON parses, and hostile op names inject nothing."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

import pytest
from gate_helpers import synthetic

from opscope.gating.formats import console, junit, markdown, render
from opscope.gating.verdict import gate

HOSTILE = "aten::evil|col\n## heading <script>alert(1)</script> `code` \x1b[31m\x00"


def _result(extra=("aten::copy_", "model.py:16", 15_000.0), runs=1):
    return gate(synthetic(3, seed=1), synthetic(runs, seed=2, slower={"model.py:15": 1.5}, extra=extra),
                baseline_name="base")


def _cells(row: str) -> list[str]:
    """A Markdown table row's cells, split on pipes that are not escaped."""
    assert row.startswith("|") and row.endswith("|")
    return re.split(r"(?<!\\)\|", row[1:-1])


def test_markdown_is_one_table_with_a_row_per_item():
    result = _result()
    lines = markdown(result).splitlines()
    table = [ln for ln in lines if ln.startswith("|")]
    header, rule, rows = table[0], table[1], table[2:]
    width = len(_cells(header))
    assert width == 8 and re.fullmatch(r"\|(---\|){8}", rule)
    assert all(len(_cells(r)) == width for r in rows)
    assert len(rows) == len(result.items)
    # the regressions come first, the table rows are contiguous (one table), the headline says how many
    assert rows[0].startswith("| ❌ regression")
    first = lines.index(header)
    assert lines[first:first + len(table)] == table
    assert lines[0].startswith("### ❌") and "2 regressions" in lines[0]


def test_hostile_names_are_escaped_in_markdown():
    result = _result(extra=(HOSTILE, "model.py:16|x", 15_000.0))
    text = markdown(result)
    rows = [ln for ln in text.splitlines() if ln.startswith("|")]
    assert all(len(_cells(r)) == 8 for r in rows)
    assert "<script>" not in text and "&lt;script&gt;" in text
    assert "\x1b" not in text and "\x00" not in text
    assert "\n## heading" not in text
    assert "\x1b" not in console(result) and "\x00" not in console(result)


def test_junit_parses_with_a_failing_testcase_per_regression():
    result = _result(extra=(HOSTILE, "model.py:16", 15_000.0))
    root = ET.fromstring(junit(result).encode())
    assert root.tag == "testsuite"
    cases = root.findall("testcase")
    assert len(cases) == len(result.items) == int(root.get("tests"))
    failures = [c for c in cases if c.find("failure") is not None]
    assert len(failures) == len(result.regressions) == int(root.get("failures")) == 2
    names = " ".join(c.get("name") for c in failures)
    assert "step time" in names and "model.py:16" in names and "aten::evil|col" in names
    assert all(c.find("failure").get("message") for c in failures)
    skipped = [c for c in cases if c.find("skipped") is not None]
    assert len(skipped) == int(root.get("skipped"))


def test_junit_of_a_pass_has_no_failure():
    result = gate(synthetic(3, seed=1), synthetic(1, seed=2), baseline_name="base")
    root = ET.fromstring(junit(result).encode())
    assert root.get("failures") == "0" and not root.findall("testcase/failure")


def test_json_parses_and_has_every_item():
    result = _result()
    doc = json.loads(render(result, "json"))
    assert doc["regressions"] == 2 and len(doc["items"]) == len(result.items)
    assert {"kind", "name", "line", "module", "before_us", "after_us", "ratio", "low", "high", "p", "verdict"} <= \
        set(doc["items"][0])


class _Tables(HTMLParser):
    """The tables of an HTML text (rows of cell texts) and every tag name seen."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self.tags: set[str] = set()
        self.in_cell = False

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self.tables[-1][-1].append("")
            self.in_cell = True

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self.in_cell = False

    def handle_data(self, data):
        if self.in_cell:
            self.tables[-1][-1][-1] += data


def test_markdown_renders_as_one_html_table():
    markdown_lib = pytest.importorskip("markdown")  # Python-Markdown (the docs extra; MkDocs renders with it)
    result = _result(extra=(HOSTILE, "model.py:16", 15_000.0))
    parsed = _Tables()
    parsed.feed(markdown_lib.markdown(markdown(result), extensions=["tables"]))
    assert len(parsed.tables) == 1
    header, *rows = parsed.tables[0]
    assert header[:3] == ["verdict", "item", "op / module"] and len(rows) == len(result.items)
    assert all(len(r) == 8 for r in rows)
    assert "script" not in parsed.tags and "h2" not in parsed.tags
    assert rows[0][0] == "❌ regression"
    assert any(r[2].startswith("aten::evil|col") for r in rows)


def test_a_gate_result_prints_as_a_line():
    """A notebook shows the repr: one line with the regressions named, not every item."""
    result = _result()
    text = repr(result)
    assert "\n" not in text and len(text) < 400
    assert text.startswith("<opscope.GateResult 1 run against baseline 'base' (3): ")
    n = len(result.regressions)
    assert n >= 1 and f"{n} regression" in text and f"exit code {result.exit_code}>" in text
    assert f"{result.regressions[0].kind} {result.regressions[0].name}" in text
