"""`opscope whatif`'s console output, from the what-if's JSON (opscope.api.WhatIf.to_json)."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from opscope import units
from opscope.render.text import clean


def render_whatif(w: dict[str, Any], console: Console, top: int = 10, no_fix: str | None = None) -> None:
    """`no_fix`: what to say when nothing was applied (the default asks for fixes)."""
    recorded, predicted = w.get("recorded_step_time_us"), w.get("predicted_step_time_us")
    replayed = w.get("replayed_step_time_us")
    head = Text()
    head.append(f"step    {units.duration(recorded)} recorded", style="bold")
    head.append(f" (replayed unchanged: {units.duration(replayed)})\n")
    head.append(f"        {units.duration(predicted)} predicted", style="bold green")
    # against the unchanged replay, the same model of the step (a merged run records the ranks' mean, and
    # replays one rank's trace): no fix applied is 0% whatever the two differ by
    base = replayed if isinstance(replayed, (int, float)) and replayed > 0 else recorded
    if isinstance(base, (int, float)) and base > 0 and isinstance(predicted, (int, float)):
        head.append(f"  ({(1 - predicted / base) * 100:.1f}% faster)")
    console.print(head, soft_wrap=True)
    applied = w.get("applied") or []
    if applied:
        t = Table(title="fixes, in the order to apply them", box=box.SIMPLE, title_justify="left")
        t.add_column("#", justify="right")
        t.add_column("fix")
        t.add_column("saves / step", justify="right")
        t.add_column("step after", justify="right")
        for k, a in enumerate(applied, 1):
            t.add_row(str(k), clean(str(a.get("fix"))), units.duration(a.get("saving_us_per_step")),
                      units.duration(a.get("predicted_step_time_us")))
        console.print(t)
    else:
        console.print(no_fix or "no fix applied: give --finding ID, --all, --op-speedup OP=Nx or --remove-gaps")
    path = sorted(w.get("critical_path") or [], key=lambda s: -float(s.get("dur", 0.0)))[:top]
    if path:
        t = Table(title="critical path over the profiled steps, longest segments (at: from the first step's start)", box=box.SIMPLE, title_justify="left")
        t.add_column("lane")
        t.add_column("at", justify="right")
        t.add_column("time", justify="right")
        t.add_column("what")
        for s in path:
            t.add_row(clean(str(s["lane"])), units.duration(s["ts"]), units.duration(s["dur"]), clean(str(s["name"]))[:80])
        console.print(t)
