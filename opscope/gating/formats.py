"""The gate's result as text CI systems read: console lines, a Markdown table ($GITHUB_STEP_SUMMARY, PR
comments), JUnit XML (one testcase per gated item: CI test tabs show each regression as a failure) and JSON.
Names come from traces and models, so they are hostile input: control characters are replaced, Markdown's
table and HTML characters escaped, and the XML built by a real XML writer."""

from __future__ import annotations

import json
import math
import re
import xml.etree.ElementTree as ET

from opscope.gating.verdict import NEW, REGRESSION, UNTESTED, VANISHED, GateResult, Item
from opscope.limits import bounded

FORMATS = ("console", "markdown", "junit", "json")
NAME_CHARS = 160  # the most of one name or line shown in a row
# C0/C1 controls, DEL, and the characters XML 1.0 cannot carry at all
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ufffe\uffff\ud800-\udfff]")
_BREAKS = re.compile(r"[\r\n\t\u2028\u2029\x85]")


def plain(text: object, limit: int = NAME_CHARS) -> str:
    """One printable line of at most `limit` characters."""
    s = bounded("" if text is None else str(text), limit)
    return _CONTROL.sub("\ufffd", _BREAKS.sub(" ", s))


def _md(text: object, limit: int = NAME_CHARS) -> str:
    """A Markdown table cell: pipes, HTML and Markdown's own characters escaped."""
    s = plain(text, limit)
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return re.sub(r"([\\|`*_\[\]#])", r"\\\1", s)


def _time(us: float | None) -> str:
    if us is None or not math.isfinite(us):
        return "—"
    if us >= 1e6:
        return f"{us / 1e6:.3g} s"
    if us >= 1e3:
        return f"{us / 1e3:.3g} ms"
    return f"{us:.3g} µs"


def change(item: Item) -> str:
    """'1.19x [1.12x, 1.25x]', a new row's share, or '—'."""
    if item.share is not None:
        return f"new, {item.share * 100:.0f}% of the step"
    if item.ratio is None:
        return "—"
    text = _ratio(item.ratio)
    if item.low is not None and item.high is not None:
        text += f" [{_ratio(item.low)}, {_ratio(item.high)}]"
    return text


def _ratio(x: float) -> str:
    return f"{x:.2f}x" if math.isfinite(x) else "∞"


def headline(result: GateResult) -> str:
    n = len(result.regressions)
    what = f"{n} regression{'s' if n != 1 else ''}" if n else "no regression"
    return (f"opscope gate: {what} against baseline {plain(result.baseline, 100)!s} ({result.runs} run(s) vs "
            f"{result.baseline_runs}; threshold +{result.threshold * 100:g}%, confidence {result.confidence * 100:g}%"
            f"{', times normalized for load' if result.normalized else ''})")


def where(item: Item) -> str:
    parts = [p for p in (item.line, f"module {item.module}" if item.module else "") if p]
    return " ".join(parts)


def console(result: GateResult, limit: int = 30) -> str:
    """Plain lines: the headline, the notes, each regression with its line and interval, then the rest."""
    lines = [headline(result)]
    lines += [f"  note: {plain(n, 2000)}" for n in result.notes]
    shown = [i for i in result.items if i.verdict == REGRESSION] + [i for i in result.items if i.verdict != REGRESSION]
    for item in shown[:limit]:
        lines.append(f"  {item.verdict:<10} {item.kind:<7} {plain(item.name)}  {plain(where(item))}  "
                     f"{_time(item.before_us)} → {_time(item.after_us)}  {change(item)}  — {plain(item.reason, 600)}")
    if len(shown) > limit:
        lines.append(f"  … {len(shown) - limit} more item(s) (--format json lists them all)")
    return "\n".join(lines) + "\n"


def markdown(result: GateResult, limit: int = 50) -> str:
    """A heading line, the notes as a list, and one table row per item (regressions first)."""
    n = len(result.regressions)
    icon = "❌" if n else "✅"
    out = [f"### {icon} {_md(headline(result), 400)}", ""]
    out += [f"- {_md(note, 2000)}" for note in result.notes]
    if result.notes:
        out.append("")
    out += ["| verdict | item | op / module | line | before | after | change [interval] | p |",
            "|---|---|---|---|---|---|---|---|"]
    shown = [i for i in result.items if i.verdict == REGRESSION] + [i for i in result.items if i.verdict != REGRESSION]
    for item in shown[:limit]:
        mark = {REGRESSION: "❌ regression", NEW: "🆕 new", VANISHED: "vanished", UNTESTED: "untested"}.get(
            item.verdict, "✅ ok")
        p = "—" if item.p is None else f"{item.p:.2g}"
        out.append(f"| {mark} | {_md(item.kind)} | {_md(item.name)}{'<br>' + _md(item.module) if item.module else ''} "
                   f"| {_md(item.line) or '—'} | {_time(item.before_us)} | {_time(item.after_us)} | {_md(change(item))} "
                   f"| {p} |")
    if len(shown) > limit:
        out += ["", f"… {len(shown) - limit} more item(s) (`--format json` lists them all)"]
    return "\n".join(out) + "\n"


def _xml_text(text: object, limit: int = 2000) -> str:
    return _CONTROL.sub("\ufffd", bounded("" if text is None else str(text), limit))


def junit(result: GateResult) -> str:
    """JUnit XML: one testsuite, one testcase per item; a regression is a <failure>, an untested item
    <skipped>."""
    suite = ET.Element("testsuite", name=f"opscope gate {_xml_text(result.baseline, 100)}",
                       tests=str(len(result.items)), failures=str(len(result.regressions)),
                       skipped=str(sum(i.verdict == UNTESTED for i in result.items)), errors="0")
    props = ET.SubElement(suite, "properties")
    for i, note in enumerate(result.notes):
        ET.SubElement(props, "property", name=f"note{i + 1}", value=_xml_text(note))
    for item in result.items:
        name = f"{item.kind}: {item.name}" + (f" at {item.line}" if item.line else "")
        case = ET.SubElement(suite, "testcase", classname=f"opscope.gate.{item.kind.replace(' ', '_')}",
                             name=_xml_text(name, 400))
        detail = (f"{item.name} {where(item)}: {_time(item.before_us)} -> {_time(item.after_us)} {change(item)}; "
                  f"{item.reason}")
        if item.verdict == REGRESSION:
            failure = ET.SubElement(case, "failure", message=_xml_text(item.reason, 400), type="regression")
            failure.text = _xml_text(detail)
        elif item.verdict == UNTESTED:
            ET.SubElement(case, "skipped", message=_xml_text(item.reason, 400))
        else:
            out = ET.SubElement(case, "system-out")
            out.text = _xml_text(detail)
    ET.indent(suite)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"


def _finite(value: object) -> object:
    """JSON has no infinity or NaN: null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def as_json(result: GateResult) -> str:
    """The result as one JSON document (non-ASCII escaped: safe in any log)."""
    return json.dumps(_finite(result.to_json()), indent=1, allow_nan=False) + "\n"


def render(result: GateResult, fmt: str) -> str:
    if fmt == "markdown":
        return markdown(result)
    if fmt == "junit":
        return junit(result)
    if fmt == "json":
        return as_json(result)
    return console(result)
