"""The HTML report in real headless Chromium (Debian's `chromium` package), driven over the DevTools
protocol (tests/chromium.py): it loads with no console error and no request beyond its own file, the
roofline renders (a non-blank screenshot with the markers' colours in it), clicking a point selects its
table row, the keyboard works, the DOM has the rows, the findings and the verdict, hostile names run
nothing, and a 2,000-row report renders its table a page at a time. The timeline (issue 27) renders for
a CPU run and the shared H100 ViT trace with a critical path drawn, and a ~132k-event trace's report
stays under 10 MB.

Skipped, with the reason, when Chromium is not installed (`apt-get install chromium`, or set
OPSCOPE_CHROMIUM); CI sets OPSCOPE_REQUIRE_BROWSER=1 so that there it fails instead.
`OPSCOPE_UPDATE_SCREENSHOT=1` also writes the report guide's screenshot (docs/report.png)."""

from __future__ import annotations

import base64
import json
import os
import time
from pathlib import Path

import pandas as pd
import pytest

from chromium import Chromium, Page, find_chromium
from conftest import EXAMPLES, PEAKS, REPO, TRACES, run_cli
from opscope.render.html import BOUND_COLORS, PAGE_ROWS, write_html
from opscope.render.report_data import verdict_line
from opscope.render.timeline import CRITICAL_COLOR
from opscope.run.read import read_run
from report_helpers import (
    HOSTILE_KERNEL,
    HOSTILE_PATH,
    big_run,
    hostile_run,
    plotted_rows,
    synthetic_trace,
)

if find_chromium() is None:
    if os.environ.get("OPSCOPE_REQUIRE_BROWSER") == "1":
        raise RuntimeError("OPSCOPE_REQUIRE_BROWSER=1 but chromium is not installed")
    pytest.skip("chromium is not installed (Debian: apt-get install chromium; or set OPSCOPE_CHROMIUM); "
                "the browser tests are skipped", allow_module_level=True)

pytestmark = pytest.mark.slow
SCREENSHOT = REPO / "docs" / "report.png"
READY = "window.opscopeReport && window.opscopeReport.ready"


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("browser")
    runs = {"hostile": hostile_run(folder)}
    runs["vit"] = folder / "vit"  # analyzed from the repository root: the report names the trace as in the docs
    proc = run_cli("analyze", str((TRACES / "h100_vit-image-classifier_bf16.json.gz").relative_to(REPO)), "--out",
                   str(runs["vit"]), cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    proc = run_cli("profile", str(EXAMPLES / "transformer_block.py"), "--steps", "2", "--warmup", "1", "--out",
                   str(folder / "cpu"), *PEAKS, cwd=folder)
    assert proc.returncode == 0, proc.stderr
    runs["cpu"] = folder / "cpu"
    runs["big"] = big_run(runs["vit"], folder / "big")
    # Each run's own what-if replay (whatif.json) gives the critical path the timeline draws; the longest
    # segment of its first lane is renamed with a hostile name, to check that the hover shows it as text.
    for name in ("cpu", "vit"):
        doc = json.loads((runs[name] / "whatif.json").read_text())
        assert doc["critical_path"], name
        first = doc["critical_path"][0]["lane"]
        max((s for s in doc["critical_path"] if s["lane"] == first), key=lambda s: s["dur"])["name"] = HOSTILE_KERNEL
        (runs[name] / "whatif.json").write_text(json.dumps(doc))
    pages = {}
    for name, run_dir in runs.items():
        pages[name] = write_html(read_run(run_dir), folder / f"{name}.html")
    pages["runs"] = runs  # type: ignore[assignment]
    return pages


@pytest.fixture(scope="module")
def browser():
    with Chromium.launch() as b:
        yield b


def open_report(browser: Chromium, path: Path, height: int = 1400):
    page = browser.open(path, height=height)
    page.wait_for(READY)
    return page


def assert_clean_load(page, path: Path) -> None:
    page.evaluate("1")  # collect the events so far
    assert page.errors() == []
    assert page.dialogs() == []
    assert page.requests() == [path.absolute().as_uri()]  # nothing but the file itself


# JS: the centre (viewport coordinates) and op row of every drawn roofline point, and the most isolated one.
POINTS_JS = """(() => {
  const gd = document.getElementById('roofline-plot');
  const pts = [];
  gd.querySelectorAll('.scatterlayer .trace').forEach(g => {
    const cls = Array.from(g.classList).find(c => c.startsWith('traceops-'));
    if (!cls) return;
    const trace = gd.data.find(t => 'trace' + t.uid === cls);
    g.querySelectorAll('path.point').forEach(p => {
      const r = p.getBoundingClientRect();
      pts.push({x: r.left + r.width / 2, y: r.top + r.height / 2, row: trace.customdata[p.__data__.i]});
    });
  });
  let best = null, bestGap = -1;
  for (const a of pts) {
    let gap = Infinity;
    for (const b of pts) if (b !== a) gap = Math.min(gap, Math.hypot(a.x - b.x, a.y - b.y));
    if (gap > bestGap) { bestGap = gap; best = a; }
  }
  return {points: pts, isolated: best, gap: bestGap};
})()"""

# JS: decodes a PNG (base64) with the browser's own decoder and counts its colours.
PIXELS_JS = """(async () => {
  const img = new Image();
  img.src = 'data:image/png;base64,%s';
  await img.decode();
  const c = document.createElement('canvas');
  c.width = img.width; c.height = img.height;
  const ctx = c.getContext('2d');
  ctx.drawImage(img, 0, 0);
  const d = ctx.getImageData(0, 0, c.width, c.height).data;
  const targets = %s;
  const counts = new Map();
  let marker = 0;
  for (let i = 0; i < d.length; i += 4) {
    const key = (d[i] << 16) | (d[i + 1] << 8) | d[i + 2];
    counts.set(key, (counts.get(key) || 0) + 1);
    if (targets.some(t => Math.abs(d[i] - t[0]) < 14 && Math.abs(d[i + 1] - t[1]) < 14 && Math.abs(d[i + 2] - t[2]) < 14)) marker++;
  }
  return {pixels: d.length / 4, colors: counts.size, background: Math.max(...counts.values()), marker: marker};
})()"""


def marker_colors(run_dir: Path) -> list[list[int]]:
    """The bound classes' marker colours of the plotted rows, as drawn: 80 % opaque over white."""
    ops = pd.read_csv(run_dir / "ops.csv")
    bounds = {ops["bound"][i] for i in plotted_rows(run_dir)}
    out = []
    for bound in bounds:
        rgb = [int(BOUND_COLORS[bound][k:k + 2], 16) for k in (1, 3, 5)]
        out.append([round(0.8 * c + 0.2 * 255) for c in rgb])
    return out


def test_cpu_report_loads_and_plots(browser, reports):
    page = open_report(browser, reports["cpu"])
    assert_clean_load(page, reports["cpu"])
    run_dir = reports["runs"]["cpu"]
    run = read_run(run_dir)
    points = page.evaluate(POINTS_JS)["points"]
    assert sorted(p["row"] for p in points) == sorted(plotted_rows(run_dir))  # one drawn point per row
    assert page.evaluate("document.querySelectorAll('#ops-table tbody tr').length") == min(len(run.to_pandas()), PAGE_ROWS)
    assert page.evaluate("document.getElementById('verdict').textContent") == verdict_line(run)
    assert page.evaluate("document.querySelectorAll('#findings article.finding').length") == len(run.findings)


def test_roofline_renders_and_click_selects_the_row(browser, reports):
    path, run_dir = reports["vit"], reports["runs"]["vit"]
    page = open_report(browser, path)
    assert_clean_load(page, path)
    rect = page.evaluate("(() => { window.scrollTo(0, 0); const r = document.getElementById('roofline-plot')"
                         ".getBoundingClientRect(); return {x: r.left, y: r.top, width: r.width, height: r.height}; })()")
    png = page.screenshot(rect)
    stats = page.evaluate(PIXELS_JS % (base64.b64encode(png).decode(), json.dumps(marker_colors(run_dir))))
    assert stats["pixels"] > 100_000 and stats["colors"] > 50, stats  # not blank
    assert stats["background"] < 0.97 * stats["pixels"], stats
    assert stats["marker"] > 200, stats  # the markers are drawn, in their bound class's colour
    if os.environ.get("OPSCOPE_UPDATE_SCREENSHOT") == "1":
        SCREENSHOT.parent.mkdir(exist_ok=True)
        page.send("Emulation.setDeviceMetricsOverride", {"width": 1280, "height": 1080, "deviceScaleFactor": 1,
                                                         "mobile": False})
        page.evaluate("window.scrollTo(0, 0)")
        time.sleep(0.5)
        SCREENSHOT.write_bytes(page.screenshot())
        page.send("Emulation.setDeviceMetricsOverride", {"width": 1280, "height": 1400, "deviceScaleFactor": 1,
                                                         "mobile": False})
    found = page.evaluate(POINTS_JS)
    assert found["gap"] > 12, found  # a point the click cannot mistake for a neighbour
    target = found["isolated"]
    page.click(target["x"], target["y"])
    page.wait_for("document.querySelector('#ops-table tbody tr.selected') !== null")
    selected = page.evaluate("Array.from(document.querySelectorAll('#ops-table tbody tr.selected'))"
                             ".map(tr => Number(tr.dataset.row))")
    assert selected == [target["row"]]
    op = read_run(run_dir).to_pandas()["op"][target["row"]]
    assert page.evaluate("document.querySelector('#ops-detail h3').textContent").endswith(op)
    assert page.evaluate("document.querySelector('#ops-table tbody tr.selected').getAttribute('aria-selected')") == "true"
    assert page.errors() == []


def test_keyboard_sort_and_filter(browser, reports):
    path = reports["vit"]
    page = open_report(browser, path)
    run = read_run(reports["runs"]["vit"])
    page.evaluate("document.querySelector('#ops-table tbody tr').focus()")
    page.key("ArrowDown", key_code=40)
    assert page.evaluate("document.activeElement.dataset.row") == "1"
    page.key("Enter", key_code=13)
    assert page.evaluate("document.querySelector('#ops-table tbody tr.selected').dataset.row") == "1"
    if 1 in plotted_rows(reports["runs"]["vit"]):  # the roofline rings the selected row's point
        ring = page.evaluate("document.getElementById('roofline-plot').data.find(t => t.uid === 'selected').x")
        assert ring == [pytest.approx(run.to_pandas()["arithmetic_intensity"][1])]
    page.evaluate("Array.from(document.querySelectorAll('#ops-table th button')).find(b => b.textContent === 'calls').click()")
    calls = page.evaluate("Array.from(document.querySelectorAll('#ops-table tbody tr')).slice(0, 3).map(tr => Number(tr.dataset.row))")
    assert [run.to_pandas()["calls"][i] for i in calls] == sorted(run.to_pandas()["calls"], reverse=True)[:3]
    page.evaluate("(() => { const f = document.getElementById('ops-filter'); f.value = 'layer_norm';"
                  " f.dispatchEvent(new Event('input')); })()")
    # the filter applies after a short debounce: wait for it rather than sleep (slow under load)
    page.wait_for("Array.from(document.querySelectorAll('#ops-table tbody tr td.op'))"
                  ".every(td => td.textContent.includes('layer_norm'))", timeout=20)
    shown = page.evaluate("Array.from(document.querySelectorAll('#ops-table tbody tr td.op')).map(td => td.textContent)")
    assert shown and all("layer_norm" in s for s in shown)
    assert len(shown) == sum("layer_norm" in op for op in run.to_pandas()["op"])
    page.send("Emulation.setEmulatedMedia", {"features": [{"name": "prefers-color-scheme", "value": "dark"}]})
    page.wait_for("getComputedStyle(document.body).backgroundColor === 'rgb(20, 23, 28)'", timeout=20)  # dark palette
    assert page.errors() == []


def test_hostile_names_run_nothing(browser, reports):
    path, run_dir = reports["hostile"], reports["runs"]["hostile"]
    page = open_report(browser, path)
    assert_clean_load(page, path)
    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert page.evaluate("document.querySelectorAll('img, [onerror], [onload], [onmouseover]').length") == 0
    assert page.evaluate("document.querySelectorAll('script').length") == 3
    body = page.evaluate("document.body.innerText")
    assert HOSTILE_PATH in body and HOSTILE_KERNEL in body  # shown, as text
    run = read_run(run_dir)
    row = next(i for i, s in enumerate(run.to_pandas()["source_location"])
               if HOSTILE_PATH in s and HOSTILE_KERNEL in run.to_pandas()["kernels"][i])
    page.evaluate(f"window.opscopeReport.select({row})")
    detail = page.evaluate("document.getElementById('ops-detail').textContent")
    assert HOSTILE_PATH in detail and HOSTILE_KERNEL in detail
    # The hover label of a point at the hostile line (drawn by plotly, asked for that point) shows the
    # path as text.
    points = [i for i in plotted_rows(run_dir) if HOSTILE_PATH in run.to_pandas()["source_location"][i]]
    page.evaluate(f"""(() => {{
      const gd = document.getElementById('roofline-plot');
      const curve = gd.data.findIndex(t => t.customdata && t.customdata.includes({points[0]}));
      Plotly.Fx.hover(gd, [{{curveNumber: curve, pointNumber: gd.data[curve].customdata.indexOf({points[0]})}}]);
    }})()""")
    label = page.evaluate("document.querySelector('#roofline-plot .hoverlayer').textContent")
    assert HOSTILE_PATH in label and "<img" not in page.evaluate(
        "document.querySelector('#roofline-plot .hoverlayer').innerHTML").replace("&lt;img", "")
    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert page.errors() == [] and page.dialogs() == []


def test_large_report_renders_progressively(browser, reports):
    path = reports["big"]
    rows = len(read_run(reports["runs"]["big"]).to_pandas())
    assert rows >= 2000 and path.stat().st_size < 10_000_000
    started = time.monotonic()
    page = open_report(browser, path)
    seconds = time.monotonic() - started  # reported, not asserted: the machine may be loaded
    assert_clean_load(page, path)
    assert page.evaluate("document.querySelectorAll('#ops-table tbody tr').length") == PAGE_ROWS
    page.evaluate("(() => { const w = document.querySelector('#ops .table-wrap'); w.scrollTop = w.scrollHeight; })()")
    page.wait_for(f"document.querySelectorAll('#ops-table tbody tr').length > {PAGE_ROWS}")
    page.evaluate("document.getElementById('ops-more').click()")
    assert page.evaluate("document.querySelectorAll('#ops-table tbody tr').length") >= 3 * PAGE_ROWS
    table_ms, drawn_ms = page.evaluate("[window.opscopeReport.tableMs, window.opscopeReport.drawnMs]")
    print(f"\n{rows} rows, {path.stat().st_size / 1e6:.1f} MB: table drawn {table_ms / 1e3:.2f} s, plots "
          f"{drawn_ms / 1e3:.2f} s after navigation; {seconds:.2f} s from opening a tab (load {os.getloadavg()[0]:.1f})")


TIMELINE_RECT_JS = """(() => {
  const el = document.getElementById('timeline-plot');
  el.scrollIntoView();
  const r = el.getBoundingClientRect();
  return {x: r.left + window.scrollX, y: r.top + window.scrollY, width: r.width, height: r.height};
})()"""


@pytest.mark.parametrize("name", ["cpu", "vit"])
def test_timeline_renders_with_the_critical_path(browser, reports, name):
    """The CPU run's and the shared H100 ViT trace's timelines: lanes for their threads (and streams), bars,
    the critical path drawn in its colour, hover labels as text, a click on a bar selecting its op row."""
    path, run_dir = reports[name], reports["runs"][name]
    page = open_report(browser, path)
    assert_clean_load(page, path)
    tl = read_run(run_dir).timeline
    assert tl is not None
    traces = page.evaluate("Object.fromEntries(document.getElementById('timeline-plot').data"
                           ".map(t => [t.uid, t.x.length]))")
    assert traces["timeline-cpu"] > 0 and traces["timeline-critical"] > 0
    if name == "vit":
        assert traces["timeline-gpu"] > 0
    labels = page.evaluate("Array.from(document.querySelectorAll('#timeline-plot .ytick text')).map(t => t.textContent)")
    assert any(x.startswith("CPU thread") for x in labels)
    assert any(x.startswith("GPU 0 stream") for x in labels) == (name == "vit")
    assert page.evaluate("document.querySelectorAll('#timeline-plot .barlayer path').length") > 20
    png = page.screenshot(page.evaluate(TIMELINE_RECT_JS))
    red = [int(CRITICAL_COLOR[k:k + 2], 16) for k in (1, 3, 5)]
    stats = page.evaluate(PIXELS_JS % (base64.b64encode(png).decode(), json.dumps([red])))
    assert stats["colors"] > 10 and stats["marker"] > 100, stats  # the critical path, drawn in red
    # its hover label shows the hostile name as text
    page.evaluate("""(() => {
      const gd = document.getElementById('timeline-plot');
      Plotly.Fx.hover(gd, [{curveNumber: gd.data.findIndex(t => t.uid === 'timeline-critical'), pointNumber: 0}]);
    })()""")
    label = page.evaluate("document.querySelector('#timeline-plot .hoverlayer').textContent")
    assert HOSTILE_KERNEL in label and "critical path" in label
    # a bar's op row, selected by a click on it (plotly's click event)
    row = page.evaluate("""(() => {
      const gd = document.getElementById('timeline-plot');
      const t = gd.data.find(t => t.uid === 'timeline-cpu');
      const row = t.customdata.find(r => r >= 0);
      gd.emit('plotly_click', {points: [{customdata: row}]});
      return row;
    })()""")
    assert page.evaluate("document.querySelector('#ops-table tbody tr.selected').dataset.row") == str(row)
    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert page.errors() == [] and page.dialogs() == []


def test_timeline_of_hostile_names_runs_nothing(browser, reports):
    path = reports["hostile"]
    page = open_report(browser, path)
    assert_clean_load(page, path)
    found = page.evaluate("""(() => {
      const gd = document.getElementById('timeline-plot');
      for (let c = 0; c < gd.data.length; c++) {
        const p = (gd.data[c].hovertext || []).findIndex(h => h.includes('window.__pwned=2'));
        if (p >= 0) { Plotly.Fx.hover(gd, [{curveNumber: c, pointNumber: p}]); return true; }
      }
      return false;
    })()""")
    assert found
    layer = "document.querySelector('#timeline-plot .hoverlayer')"
    assert HOSTILE_KERNEL in page.evaluate(f"{layer}.textContent")
    assert page.evaluate(f"{layer}.querySelectorAll('script, img').length") == 0
    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert page.errors() == [] and page.dialogs() == []


def test_132k_event_trace_report_stays_small(browser, tmp_path):
    """The ~132k-event synthetic trace: timeline.json bounded, the whole report under 10 MB, and it renders."""
    trace = synthetic_trace(tmp_path / "synthetic_132k.json.gz")
    proc = run_cli("analyze", str(trace), "--out", str(tmp_path / "run"), timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "run" / "timeline.json").stat().st_size < 2_000_000
    run = read_run(tmp_path / "run")
    path = write_html(run, tmp_path / "report.html")
    size = path.stat().st_size
    assert size < 10_000_000, size
    page = open_report(browser, path)
    assert_clean_load(page, path)
    bars = page.evaluate("document.querySelectorAll('#timeline-plot .barlayer path').length")
    assert bars > 100
    drawn_ms = page.evaluate("window.opscopeReport.drawnMs")
    print(f"\n132k events: timeline.json {(tmp_path / 'run' / 'timeline.json').stat().st_size / 1e3:.0f} kB, "
          f"report {size / 1e6:.1f} MB, {bars} bars, drawn {drawn_ms / 1e3:.2f} s after navigation")


def _frame_session(page) -> str:
    """The DevTools session of the page's one child frame (the notebook view's sandboxed report: Chromium
    runs a sandboxed frame as a target of its own)."""
    page.send("Target.setAutoAttach", {"autoAttach": True, "waitForDebuggerOnStart": False, "flatten": True})
    page.evaluate("1")  # collect the events so far
    frames = [e["params"] for e in page.browser.events
              if e.get("sessionId") == page.session and e.get("method") == "Target.attachedToTarget"]
    frames = [f["sessionId"] for f in frames if f.get("targetInfo", {}).get("type") == "iframe"]
    assert len(frames) == 1, page.browser.events[-5:]
    return frames[0]


def test_notebook_view_shows_the_report_in_a_sandboxed_frame(browser, reports, tmp_path):
    """Run._repr_html_ (what Jupyter shows for a Run) in a page standing in for the notebook: the report's
    scripts run inside the frame under its own CSP and plot the roofline; the page cannot reach into it."""
    import opscope

    run = opscope.load(reports["runs"]["cpu"])
    notebook = tmp_path / "notebook.html"
    notebook.write_text("<!DOCTYPE html><html><head><meta charset='utf-8'><title>notebook</title></head><body>"
                        f"<div class='cell'>In [1]: run</div>{run._repr_html_()}</body></html>", encoding="utf-8")
    page = browser.open(notebook, height=900)
    frame = Page(browser, _frame_session(page))
    frame.wait_for(READY)
    points = frame.evaluate(POINTS_JS)["points"]
    assert sorted(p["row"] for p in points) == sorted(plotted_rows(reports["runs"]["cpu"]))
    assert page.evaluate("document.querySelector('iframe').contentDocument") is None  # sandboxed: no way in
    assert page.evaluate("document.querySelector('iframe').getBoundingClientRect().height") < 600  # fits a cell
    assert page.errors() == [] and page.dialogs() == []
