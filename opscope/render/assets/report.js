/* opscope HTML report: the ops table (sortable, filterable, rendered a page at a time), the roofline,
   module and timeline plots, and the links between them. Every string from the run is set as text
   (textContent), never parsed as HTML; plot labels arrive HTML-escaped from opscope. */
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("opscope-data").textContent);
  var PAGE = data.page_rows;
  var rows = data.rows;
  var columns = data.columns;
  var tbody = document.querySelector("#ops-table tbody");
  var filterInput = document.getElementById("ops-filter");
  var boundSelect = document.getElementById("ops-bound");
  var countLabel = document.getElementById("ops-count");
  var moreButton = document.getElementById("ops-more");
  var detail = document.getElementById("ops-detail");
  var state = { sort: null, dir: 1, text: "", bound: "", order: [], shown: 0, selected: null };
  var rendered = {};  // row index -> <tr>, for the rows in the DOM

  function haystack(row) {
    if (row._h === undefined) {
      var d = row.d;
      row._h = [d.op, d.input_dims, d.input_dtypes, d.source_location, d.module, d.family,
                (d.kernels || []).join(" "), row.b].join("\u0001").toLowerCase();
    }
    return row._h;
  }

  function computeOrder() {
    var needle = state.text.trim().toLowerCase();
    var order = [];
    for (var i = 0; i < rows.length; i++) {
      if (state.bound && rows[i].b !== state.bound) continue;
      if (needle && haystack(rows[i]).indexOf(needle) < 0) continue;
      order.push(i);
    }
    if (state.sort !== null) {
      var c = state.sort, dir = state.dir;
      order.sort(function (a, b) {
        var x = rows[a].k[c], y = rows[b].k[c];
        if (x === y) return a - b;
        if (x === null) return 1;
        if (y === null) return -1;
        return (x < y ? -1 : 1) * dir;
      });
    }
    state.order = order;
  }

  function makeRow(i) {
    var row = rows[i];
    var tr = document.createElement("tr");
    tr.dataset.row = String(i);
    tr.tabIndex = 0;
    tr.setAttribute("aria-selected", "false");
    for (var c = 0; c < columns.length; c++) {
      var td = document.createElement("td");
      td.className = columns[c].cls;
      if (columns[c].key === "bound") td.className += " b-" + (data.bounds.indexOf(row.b) >= 0 ? row.b : "unknown");
      td.textContent = row.c[c];
      if (columns[c].title) td.title = row.d[columns[c].title] || "";
      tr.appendChild(td);
    }
    return tr;
  }

  function renderMore(upTo) {
    var end = Math.min(state.order.length, Math.max(upTo || 0, state.shown + PAGE));
    var frag = document.createDocumentFragment();
    for (var n = state.shown; n < end; n++) {
      var i = state.order[n];
      var tr = makeRow(i);
      if (i === state.selected) markSelected(tr);
      rendered[i] = tr;
      frag.appendChild(tr);
    }
    tbody.appendChild(frag);
    state.shown = end;
    countLabel.textContent = "showing " + state.shown + " of " + state.order.length +
      (state.order.length < rows.length ? " matching rows (" + rows.length + " in all)" : " rows");
    moreButton.hidden = state.shown >= state.order.length;
  }

  function redraw() {
    computeOrder();
    tbody.textContent = "";
    rendered = {};
    state.shown = 0;
    renderMore(PAGE);
  }

  function markSelected(tr) {
    tr.classList.add("selected");
    tr.setAttribute("aria-selected", "true");
  }

  function showDetail(i) {
    var d = rows[i].d;
    detail.textContent = "";
    var h = document.createElement("h3");
    h.textContent = "#" + (i + 1) + " " + d.op;
    var dl = document.createElement("dl");
    data.detail_fields.forEach(function (f) {
      var v = d[f[0]];
      if (v === undefined || v === null || v === "" || (Array.isArray(v) && !v.length)) return;
      var dt = document.createElement("dt");
      dt.textContent = f[1];
      var dd = document.createElement("dd");
      if (Array.isArray(v)) {
        var ul = document.createElement("ul");
        v.forEach(function (item) {
          var li = document.createElement("li");
          li.textContent = item;
          ul.appendChild(li);
        });
        dd.appendChild(ul);
      } else {
        dd.textContent = String(v);
      }
      dl.appendChild(dt);
      dl.appendChild(dd);
    });
    detail.appendChild(h);
    detail.appendChild(dl);
    detail.hidden = false;
  }

  /* Selects op row i: in the table (rendering up to it, clearing a filter that hides it), in the
     detail panel and on the roofline. */
  function selectRow(i, opts) {
    opts = opts || {};
    if (!(i >= 0 && i < rows.length)) return;
    var prev = state.selected !== null ? rendered[state.selected] : null;
    if (prev) { prev.classList.remove("selected"); prev.setAttribute("aria-selected", "false"); }
    state.selected = i;
    var pos = state.order.indexOf(i);
    if (pos < 0) {
      state.text = ""; state.bound = ""; filterInput.value = ""; boundSelect.value = "";
      redraw();
      pos = state.order.indexOf(i);
    }
    if (pos >= state.shown) renderMore(pos + 1);
    var tr = rendered[i];
    markSelected(tr);
    if (opts.scroll !== false) tr.scrollIntoView({ block: "nearest" });
    if (opts.focus) tr.focus({ preventScroll: true });
    showDetail(i);
    markPoint(i);
  }

  // --- sorting and filtering ---
  var headRow = document.querySelector("#ops-table thead tr");
  columns.forEach(function (col, c) {
    var th = document.createElement("th");
    th.className = col.cls;
    th.scope = "col";
    var b = document.createElement("button");
    b.type = "button";
    b.textContent = col.label;
    b.title = "sort by " + col.label;
    b.addEventListener("click", function () {
      if (state.sort === c) state.dir = -state.dir;
      else { state.sort = c; state.dir = col.num && col.key !== "rank" ? -1 : 1; }
      headRow.querySelectorAll("th").forEach(function (t) { t.removeAttribute("aria-sort"); });
      th.setAttribute("aria-sort", state.dir > 0 ? "ascending" : "descending");
      redraw();
    });
    th.appendChild(b);
    headRow.appendChild(th);
  });
  var filterTimer = null;
  filterInput.addEventListener("input", function () {
    clearTimeout(filterTimer);
    filterTimer = setTimeout(function () { state.text = filterInput.value; redraw(); }, 120);
  });
  boundSelect.addEventListener("change", function () { state.bound = boundSelect.value; redraw(); });
  moreButton.addEventListener("click", function () { renderMore(); });
  if ("IntersectionObserver" in window) {
    new IntersectionObserver(function (entries) {
      if (entries.some(function (e) { return e.isIntersecting; }) && state.shown < state.order.length) renderMore();
    }, { root: document.querySelector("#ops .table-wrap") }).observe(document.getElementById("ops-sentinel"));
  }
  tbody.addEventListener("click", function (ev) {
    var tr = ev.target.closest("tr");
    if (tr) selectRow(Number(tr.dataset.row), { scroll: false });
  });
  tbody.addEventListener("keydown", function (ev) {
    var tr = ev.target.closest("tr");
    if (!tr) return;
    if (ev.key === "Enter" || ev.key === " ") {
      ev.preventDefault();
      selectRow(Number(tr.dataset.row), { scroll: false });
    } else if (ev.key === "ArrowDown" || ev.key === "ArrowUp") {
      ev.preventDefault();
      if (ev.key === "ArrowDown" && !tr.nextElementSibling && state.shown < state.order.length) renderMore();
      var next = ev.key === "ArrowDown" ? tr.nextElementSibling : tr.previousElementSibling;
      if (next) next.focus();
    }
  });
  document.querySelectorAll("button[data-filter]").forEach(function (b) {
    b.addEventListener("click", function () {
      filterInput.value = b.dataset.filter;
      state.text = b.dataset.filter;
      state.bound = ""; boundSelect.value = "";
      redraw();
      document.getElementById("ops").scrollIntoView();
      filterInput.focus({ preventScroll: true });
    });
  });

  // --- plots ---
  var plotDiv = document.getElementById("roofline-plot");
  var moduleDiv = document.getElementById("module-plot");
  var timelineDiv = document.getElementById("timeline-plot");
  var plotted = false;

  function cssVar(name) {
    return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  }

  function themed(layout) {
    var fg = cssVar("--fg"), grid = cssVar("--grid");
    layout.font = Object.assign({}, layout.font, { color: fg });
    ["xaxis", "yaxis", "yaxis2"].forEach(function (ax) {
      if (layout[ax]) layout[ax] = Object.assign({}, layout[ax], { gridcolor: grid, linecolor: grid, zerolinecolor: grid });
    });
    layout.paper_bgcolor = "rgba(0,0,0,0)";
    layout.plot_bgcolor = "rgba(0,0,0,0)";
    layout.hoverlabel = { bgcolor: cssVar("--panel"), font: { color: fg }, bordercolor: grid, align: "left" };
    return layout;
  }

  var markIndex = null;  // index of the trace ringing the selected point
  function markPoint(i) {
    if (!plotted) return;
    var p = data.roofline_points[String(i)];
    var x = p ? [p[0]] : [], y = p ? [p[1]] : [];
    Plotly.restyle(plotDiv, { x: [x], y: [y] }, [markIndex]);
  }

  function drawPlots() {
    var ready = [];
    plotted = typeof Plotly !== "undefined" && data.roofline && plotDiv;
    if (plotted) {
      var fig = data.roofline;
      var traces = fig.data.concat([{
        type: "scatter", mode: "markers", x: [], y: [], name: "selected", uid: "selected", showlegend: false,
        hoverinfo: "skip", marker: { size: 26, color: "rgba(0,0,0,0)", line: { width: 3, color: cssVar("--accent") } }
      }]);
      markIndex = traces.length - 1;
      var config = { displaylogo: false, responsive: true, scrollZoom: false };
      ready.push(Plotly.newPlot(plotDiv, traces, themed(fig.layout), config).then(function () {
        plotDiv.on("plotly_click", function (ev) {
          var pt = ev && ev.points && ev.points[0];
          if (pt && typeof pt.customdata === "number") selectRow(pt.customdata, { focus: false });
        });
      }));
      if (data.modules && moduleDiv) {
        ready.push(Plotly.newPlot(moduleDiv, data.modules.data, themed(data.modules.layout), config));
      }
      if (data.timeline && timelineDiv) {
        // time zooms, lanes stay; a click on a bar selects its op row
        ready.push(Plotly.newPlot(timelineDiv, data.timeline.data, themed(data.timeline.layout), config).then(function () {
          timelineDiv.on("plotly_click", function (ev) {
            var pt = ev && ev.points && ev.points[0];
            if (pt && typeof pt.customdata === "number" && pt.customdata >= 0) selectRow(pt.customdata, { focus: false });
          });
        }));
      }
      if (window.matchMedia) {
        window.matchMedia("(prefers-color-scheme: dark)").addEventListener("change", function () {
          Plotly.relayout(plotDiv, themed(plotDiv.layout));
          if (data.modules && moduleDiv) Plotly.relayout(moduleDiv, themed(moduleDiv.layout));
          if (data.timeline && timelineDiv) Plotly.relayout(timelineDiv, themed(timelineDiv.layout));
        });
      }
    } else if (plotDiv && data.roofline) {
      plotDiv.textContent = "The roofline needs plotly.js, which this report embeds; it did not load.";
    }
    return Promise.all(ready);
  }

  // The table first: it needs no plotly.js, which the page runs after this script (it takes most of
  // the load time); the plots are drawn once it has run.
  redraw();
  // Test and automation hook: the report is drawn when `ready` is true (times: ms since navigation).
  window.opscopeReport = { ready: false, select: selectRow, state: state, tableMs: performance.now() };
  var loaded = new Promise(function (resolve) {
    if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", resolve);
    else resolve();
  });
  loaded.then(drawPlots).then(function () {
    window.opscopeReport.drawnMs = performance.now();  // since navigation start
    window.opscopeReport.ready = true;
    document.body.dataset.ready = "true";
  });
})();
