"""analyze's progress bar (opscope.cli.app._EventsProgress): its count and rate, and what it holds."""

from __future__ import annotations

import io

from rich.console import Console

from opscope.cli.app import _EventsProgress


def test_the_rate_is_the_phases_events_over_its_time_and_one_sample_is_kept():
    progress = _EventsProgress(Console(file=io.StringIO(), force_terminal=False))
    clock = iter(float(t) for t in range(100))
    progress.bar.get_time = lambda: next(clock)  # type: ignore[method-assign]
    progress.phase("decoding events")
    assert progress.task is not None
    for _ in range(40):
        progress.advance(1000)
    task = progress.bar.tasks[0]
    count, rate = (column.render(task).plain for column in progress.bar.columns[1:3])
    assert count == "40,000"
    # started at 0; each advance took a tick of the clock, and the rate reads it at 41
    assert rate == f"{40_000 / 41:,.0f} /s"
    # rich keeps a sample per advance for its own speed estimate (30 s of them by default): made while a
    # batch of events is decoded, they held that batch's memory; only the last is kept
    assert len(task._progress) <= 1
